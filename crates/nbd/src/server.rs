//! Listener loops, connection bookkeeping and graceful shutdown.

use std::io;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tracing::{debug, warn};

use crate::backend::Export;
use crate::handshake;
use crate::transmission::{self, ConnConfig, IntoBlocking};

/// Resource limits of the server.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Requests in flight per connection before the server stops reading
    /// the socket (default 64).
    pub max_inflight_per_conn: usize,
    /// Largest option data accepted during the handshake (default 4096);
    /// larger options get `NBD_REP_ERR_TOO_BIG`.
    pub max_option_bytes: u32,
    /// Options per handshake before the connection is closed (default 64).
    pub max_options: u32,
    /// Whole handshake must finish within this (default 10 s).
    pub handshake_timeout: Duration,
    /// Connections served at once; further ones are closed at accept
    /// (default 128).
    pub max_connections: usize,
    /// READ/WRITE payload bytes in flight per connection (default 256 MiB).
    pub max_inflight_bytes_per_conn: usize,
    /// After `shutdown()`, how long a connection may take to drain before it
    /// is dropped (default 30 s).
    pub shutdown_grace: Duration,
    /// Threads serving one connection's requests (started as needed; default
    /// 16). Requests in flight per connection are at most
    /// `min(max_inflight_per_conn, max_threads_per_conn)`.
    pub max_threads_per_conn: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_inflight_per_conn: 64,
            max_option_bytes: 4096,
            max_options: 64,
            handshake_timeout: Duration::from_secs(10),
            max_connections: 128,
            max_inflight_bytes_per_conn: 256 << 20,
            shutdown_grace: Duration::from_secs(30),
            max_threads_per_conn: 16,
        }
    }
}

/// An NBD server over a fixed list of exports.
pub struct Server {
    exports: Vec<Export>,
    limits: Limits,
    shutdown: watch::Sender<bool>,
    active: AtomicUsize,
}

/// Decrements the active connection count when a connection task ends.
struct ActiveGuard(Arc<Server>);

impl Drop for ActiveGuard {
    fn drop(&mut self) {
        self.0.active.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Server {
    /// Creates a server; nothing is served until `serve_*` is called.
    pub fn new(exports: Vec<Export>, limits: Limits) -> Arc<Server> {
        let (shutdown, _) = watch::channel(false);
        Arc::new(Server {
            exports,
            limits,
            shutdown,
            active: AtomicUsize::new(0),
        })
    }

    /// The configured limits.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// Accepts on a Unix socket until [`Server::shutdown`]; then stops
    /// accepting, lets every connection finish its in-flight requests, and
    /// returns.
    pub async fn serve_unix(self: Arc<Self>, listener: tokio::net::UnixListener) -> io::Result<()> {
        self.serve_loop(|| async { listener.accept().await.map(|(s, _)| s) })
            .await
    }

    /// Same as [`Server::serve_unix`] over TCP (with `TCP_NODELAY`).
    pub async fn serve_tcp(self: Arc<Self>, listener: tokio::net::TcpListener) -> io::Result<()> {
        self.serve_loop(|| async {
            let (s, _) = listener.accept().await?;
            s.set_nodelay(true)?;
            Ok(s)
        })
        .await
    }

    /// Asks every `serve_*` loop and connection to stop (idempotent).
    pub fn shutdown(&self) {
        self.shutdown.send_replace(true);
    }

    /// Connections currently open (handshaking or transmitting).
    pub fn active_connections(&self) -> usize {
        self.active.load(Ordering::SeqCst)
    }

    async fn serve_loop<S, F, Fut>(self: Arc<Self>, mut accept: F) -> io::Result<()>
    where
        S: AsyncRead + AsyncWrite + IntoBlocking + Send + Unpin + 'static,
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = io::Result<S>>,
    {
        let mut stop = self.shutdown.subscribe();
        let mut conns = JoinSet::new();
        loop {
            tokio::select! {
                _ = stopped(&mut stop) => break,
                Some(_) = conns.join_next(), if !conns.is_empty() => {}
                r = accept() => match r {
                    Ok(s) => self.clone().spawn_conn(&mut conns, s),
                    Err(e) => {
                        // EMFILE and friends: back off instead of spinning.
                        warn!("accept failed: {e}");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                },
            }
        }
        while conns.join_next().await.is_some() {}
        Ok(())
    }

    fn spawn_conn<S>(self: Arc<Self>, conns: &mut JoinSet<()>, stream: S)
    where
        S: AsyncRead + AsyncWrite + IntoBlocking + Send + Unpin + 'static,
    {
        if self.active.fetch_add(1, Ordering::SeqCst) >= self.limits.max_connections {
            self.active.fetch_sub(1, Ordering::SeqCst);
            warn!("connection limit reached; closing new connection");
            return;
        }
        let guard = ActiveGuard(self.clone());
        conns.spawn(async move {
            let _guard = guard;
            let mut stop = self.shutdown.subscribe();
            let grace = self.limits.shutdown_grace;
            tokio::select! {
                r = self.clone().run_conn(stream) => {
                    if let Err(e) = r {
                        debug!("connection ended: {e}");
                    }
                }
                _ = async { stopped(&mut stop).await; tokio::time::sleep(grace).await } => {
                    warn!("connection did not drain within {grace:?}; dropping it");
                }
            }
        });
    }

    async fn run_conn<S>(self: Arc<Self>, mut stream: S) -> io::Result<()>
    where
        S: AsyncRead + AsyncWrite + IntoBlocking + Send + Unpin + 'static,
    {
        let mut stop = self.shutdown.subscribe();
        let hs = handshake::handshake(&mut stream, &self.exports, &self.limits, &mut stop);
        let neg = match tokio::time::timeout(self.limits.handshake_timeout, hs).await {
            Ok(Ok(Some(n))) => n,
            Ok(Ok(None)) => return Ok(()),
            Ok(Err(e)) => return Err(e),
            Err(_) => {
                debug!("handshake timed out");
                return Ok(());
            }
        };
        let backend = self.exports[neg.export].backend.clone();
        let cfg = ConnConfig {
            max_inflight: self.limits.max_inflight_per_conn,
            max_inflight_bytes: self.limits.max_inflight_bytes_per_conn,
            max_threads: self.limits.max_threads_per_conn,
        };
        let stream = stream.into_blocking()?;
        transmission::serve(stream, backend, neg, cfg, stop).await
    }
}

/// Resolves once shutdown was requested. (Wraps `wait_for` so that no
/// non-`Send` watch guard is held across an await: every future of this
/// crate stays `Send`.)
pub(crate) async fn stopped(rx: &mut watch::Receiver<bool>) {
    let _ = rx.wait_for(|s| *s).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assert_send<T: Send>(_: &T) {}

    /// The serve futures must be spawnable on a multi-threaded runtime.
    #[allow(dead_code)]
    fn serve_futures_are_send(
        s: Arc<Server>,
        u: tokio::net::UnixListener,
        t: tokio::net::TcpListener,
    ) {
        assert_send(&s.clone().serve_unix(u));
        assert_send(&s.serve_tcp(t));
    }
}
