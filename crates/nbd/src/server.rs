//! Listener loops, connection bookkeeping and graceful shutdown.

use std::collections::{BTreeMap, VecDeque};
use std::io;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::{watch, Notify};
use tokio::task::JoinSet;
use tracing::{debug, warn};

use crate::backend::Export;
use crate::budget::Budget;
use crate::buf::BufPool;
use crate::handshake::{self, Negotiated, Outcome, TlsState};
use crate::limits::Limits;
use crate::shutdown::stopped;
use crate::stream::{IntoBlocking, Stream};
use crate::threads::ThreadTracker;
use crate::tls::{self, TlsConfig};
use crate::transmission::{self, ConnConfig};

/// An NBD server over a fixed list of exports.
pub struct Server {
    exports: Vec<Export>,
    limits: Limits,
    shutdown: watch::Sender<bool>,
    active: AtomicUsize,
    /// Payload bytes of all connections ([`Limits::max_inflight_bytes`]).
    budget: Arc<Budget>,
    /// Payload buffers kept for reuse: at most half the payload budget.
    bufs: Arc<BufPool>,
    /// Request threads of all connections, live or dropped.
    threads: Arc<ThreadTracker>,
    /// Connections past the handshake, by connection number: who is at the other end.
    clients: Mutex<BTreeMap<u64, String>>,
    next_conn: AtomicU64,
    /// Connections in the handshake, oldest first: number, when it came, the bell that closes it.
    handshaking: Mutex<VecDeque<(u64, Instant, Arc<Notify>)>>,
    /// STARTTLS on TCP listeners.
    tls: Option<Arc<TlsConfig>>,
}

/// How long a connection may sit in its handshake before a newcomer may close it to make room
/// under [`Limits::max_handshakes`] (a local client takes milliseconds; a TLS handshake over a
/// slow link well under this).
const HANDSHAKE_GRACE: Duration = Duration::from_secs(1);

/// Takes a connection out of [`Server::handshaking`] when its handshake ends.
struct HandshakeGuard<'a>(&'a Server, u64);

impl Drop for HandshakeGuard<'_> {
    fn drop(&mut self) {
        let mut hs = self.0.handshaking.lock().expect("handshaking lock");
        hs.retain(|(id, _, _)| *id != self.1);
    }
}

/// Takes a connection out of [`Server::clients`] when it ends.
struct ClientGuard<'a>(&'a Server, u64);

impl Drop for ClientGuard<'_> {
    fn drop(&mut self) {
        self.0.clients.lock().expect("clients lock").remove(&self.1);
    }
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
        Server::with_tls(exports, limits, None)
    }

    /// As [`Server::new`], offering (or requiring) TLS on TCP listeners. Unix sockets stay
    /// plain: they are local, and their file mode says who may connect.
    pub fn with_tls(exports: Vec<Export>, limits: Limits, tls: Option<TlsConfig>) -> Arc<Server> {
        let (shutdown, _) = watch::channel(false);
        Arc::new(Server {
            exports,
            limits,
            shutdown,
            active: AtomicUsize::new(0),
            budget: Budget::new(limits.max_inflight_bytes),
            bufs: BufPool::new(limits.max_inflight_bytes / 2),
            threads: Arc::new(ThreadTracker::new()),
            clients: Mutex::new(BTreeMap::new()),
            next_conn: AtomicU64::new(0),
            handshaking: Mutex::new(VecDeque::new()),
            tls: tls.map(Arc::new),
        })
    }

    /// Clients that finished the handshake and are connected now (`tcp:ADDR` or
    /// `unix:pid N`), oldest first.
    pub fn clients(&self) -> Vec<String> {
        self.clients
            .lock()
            .expect("clients lock")
            .values()
            .cloned()
            .collect()
    }

    /// The configured limits.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// Accepts on a Unix socket until [`Server::shutdown`]; then stops
    /// accepting, lets every connection finish its in-flight requests, waits
    /// for every request thread (also those of connections dropped after
    /// the grace period) to leave the backend, and returns. Returns a
    /// `TimedOut` error if threads were still inside backend calls after
    /// [`Limits::shutdown_backend_timeout`].
    pub async fn serve_unix(self: Arc<Self>, listener: tokio::net::UnixListener) -> io::Result<()> {
        self.serve_loop(false, || async { listener.accept().await.map(|(s, _)| s) })
            .await
    }

    /// Same as [`Server::serve_unix`] over TCP (with `TCP_NODELAY`).
    pub async fn serve_tcp(self: Arc<Self>, listener: tokio::net::TcpListener) -> io::Result<()> {
        self.serve_loop(true, || async {
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

    /// Request threads alive, on open connections or on dropped ones still
    /// finishing a backend call.
    pub fn request_threads(&self) -> usize {
        self.threads.running()
    }

    /// READ/WRITE payload bytes granted right now, all connections together.
    pub fn inflight_bytes(&self) -> usize {
        self.budget.in_use()
    }

    /// Payload buffers kept for reuse now, and the most kept: `(held, limit)` bytes.
    pub fn payload_pool_bytes(&self) -> (usize, usize) {
        (self.bufs.held(), self.bufs.limit())
    }

    /// The most payload bytes ever granted at once (never above
    /// [`Limits::max_inflight_bytes`]).
    pub fn inflight_bytes_peak(&self) -> usize {
        self.budget.peak()
    }

    async fn serve_loop<S, F, Fut>(self: Arc<Self>, tcp: bool, mut accept: F) -> io::Result<()>
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
                    Ok(s) => self.clone().spawn_conn(&mut conns, s, tcp),
                    Err(e) => {
                        // EMFILE and friends: back off instead of spinning.
                        warn!("accept failed: {e}");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                },
            }
        }
        while conns.join_next().await.is_some() {}
        // Connections dropped after the grace period may have left threads
        // inside backend calls: a clean stop must not be reported before
        // they have returned.
        let timeout = self.limits.shutdown_backend_timeout;
        match self.threads.wait_idle(timeout).await {
            0 => Ok(()),
            n => {
                warn!("{n} NBD request threads still inside backend calls after {timeout:?}");
                Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("{n} NBD request threads still inside backend calls after {timeout:?}"),
                ))
            }
        }
    }

    fn spawn_conn<S>(self: Arc<Self>, conns: &mut JoinSet<()>, stream: S, tcp: bool)
    where
        S: AsyncRead + AsyncWrite + IntoBlocking + Send + Unpin + 'static,
    {
        let id = self.next_conn.fetch_add(1, Ordering::Relaxed);
        let Some(evict) = self.admit(id) else {
            warn!("connection limit reached; closing new connection");
            return;
        };
        let guard = ActiveGuard(self.clone());
        conns.spawn(async move {
            let _guard = guard;
            let mut stop = self.shutdown.subscribe();
            let grace = self.limits.shutdown_grace;
            tokio::select! {
                r = self.clone().run_conn(stream, id, evict, tcp) => {
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

    /// Counts a new connection in; `None`: refused, every connection is past
    /// its handshake and the connection limit is reached.
    ///
    /// Who makes room: at the connection limit, the oldest handshaking
    /// connection is closed. At the handshake limit it is closed only once it
    /// has been in the handshake for [`HANDSHAKE_GRACE`]: a burst of real
    /// clients (a fio job with 64 connections, VMs booting together) all
    /// finish theirs in milliseconds and are let in past the handshake limit,
    /// while connections that stall in it still make room for new ones.
    fn admit(&self, id: u64) -> Option<Arc<Notify>> {
        let mut hs = self.handshaking.lock().expect("handshaking lock");
        let full = self.active.load(Ordering::SeqCst) >= self.limits.max_connections;
        let stalled = hs
            .front()
            .is_some_and(|(_, since, _)| since.elapsed() >= HANDSHAKE_GRACE);
        if full || (hs.len() >= self.limits.max_handshakes && stalled) {
            match hs.pop_front() {
                // It leaves `active` as soon as its task sees the bell: the count may
                // pass the limit by the connections being closed that way.
                Some((_, _, bell)) => bell.notify_one(),
                None => return None,
            }
        }
        self.active.fetch_add(1, Ordering::SeqCst);
        let bell = Arc::new(Notify::new());
        hs.push_back((id, Instant::now(), bell.clone()));
        Some(bell)
    }

    async fn run_conn<S>(
        self: Arc<Self>,
        stream: S,
        id: u64,
        evict: Arc<Notify>,
        tcp: bool,
    ) -> io::Result<()>
    where
        S: AsyncRead + AsyncWrite + IntoBlocking + Send + Unpin + 'static,
    {
        let stop = self.shutdown.subscribe();
        let peer = stream.peer();
        let tls = self.tls.clone().filter(|_| tcp);
        let in_handshake = HandshakeGuard(&self, id);
        let hs = self.negotiate(stream, tls, stop.clone());
        let (neg, stream, secured) = tokio::select! {
            r = tokio::time::timeout(self.limits.handshake_timeout, hs) => match r {
                Ok(Ok(Some(n))) => n,
                Ok(Ok(None)) => return Ok(()),
                Ok(Err(e)) => return Err(e),
                Err(_) => {
                    debug!("handshake timed out");
                    return Ok(());
                }
            },
            _ = evict.notified() => {
                debug!("closing a connection still in its handshake to make room");
                return Ok(());
            }
        };
        drop(in_handshake);
        let peer = if secured {
            format!("{peer} (TLS)")
        } else {
            peer
        };
        self.clients.lock().expect("clients lock").insert(id, peer);
        let _client = ClientGuard(&self, id);
        let backend = self.exports[neg.export].backend.clone();
        let cfg = ConnConfig {
            max_inflight: self.limits.max_inflight_per_conn,
            max_inflight_bytes: self
                .limits
                .max_inflight_bytes_per_conn
                .min(self.budget.total()),
            max_threads: self.limits.max_threads_per_conn,
            max_server_threads: self.limits.max_threads,
            bufs: self.bufs.clone(),
            server_budget: self.budget.clone(),
            threads: self.threads.clone(),
        };
        transmission::serve(stream, backend, neg, cfg, stop).await
    }

    /// Greeting and options, with a STARTTLS upgrade when `tls` is offered: what was agreed,
    /// the blocking stream to transmit on, and whether it runs inside TLS (None: close).
    async fn negotiate<S>(
        &self,
        mut stream: S,
        tls: Option<Arc<TlsConfig>>,
        mut stop: watch::Receiver<bool>,
    ) -> io::Result<Option<(Negotiated, Stream, bool)>>
    where
        S: AsyncRead + AsyncWrite + IntoBlocking + Send + Unpin + 'static,
    {
        let Some(no_zeroes) = handshake::greet(&mut stream).await? else {
            return Ok(None);
        };
        let offer = match &tls {
            None => TlsState::Unavailable,
            Some(t) => TlsState::Offered {
                required: t.required(),
            },
        };
        let (ex, lim) = (&self.exports, &self.limits);
        match handshake::haggle(&mut stream, ex, lim, offer, no_zeroes, &mut stop).await? {
            Outcome::Close => Ok(None),
            Outcome::Transmit(n) => Ok(Some((n, stream.into_blocking()?, false))),
            Outcome::StartTls { no_zeroes } => {
                let t = tls.expect("STARTTLS is acknowledged only when offered");
                let mut s = t.accept(stream).await?;
                let active = TlsState::Active;
                match handshake::haggle(&mut s, ex, lim, active, no_zeroes, &mut stop).await? {
                    Outcome::Transmit(n) => Ok(Some((n, tls::proxied(s)?, true))),
                    _ => Ok(None),
                }
            }
        }
    }
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
