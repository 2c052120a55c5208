//! The server's resource limits: what the handshake, the transmission loop and the listeners
//! all bound themselves by, kept below them so each reads it without knowing the others.

use std::time::Duration;

use crate::budget::{DEFAULT_MAX_INFLIGHT_BYTES, DEFAULT_MAX_INFLIGHT_BYTES_PER_CONN};
use crate::threads::DEFAULT_SHUTDOWN_BACKEND_TIMEOUT;

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
    /// Whole handshake must finish within this (default 5 s: real clients
    /// take milliseconds).
    pub handshake_timeout: Duration,
    /// Connections still in the handshake (default 16). When a new one comes
    /// and this many are in it, the oldest is closed if it has been there for
    /// a second (a burst of real clients is let in past this), and when all
    /// `max_connections` are taken the oldest handshaking one is closed
    /// whatever its age: connections that never send a byte cannot lock real
    /// clients out.
    pub max_handshakes: usize,
    /// Connections served at once; when they are all past the handshake,
    /// further ones are closed at accept (default 128).
    pub max_connections: usize,
    /// READ/WRITE payload bytes in flight on all connections together
    /// (default [`DEFAULT_MAX_INFLIGHT_BYTES`], 64 MiB): the server's memory
    /// budget for request buffers. A connection whose next request does not
    /// fit stops reading its socket until it does; requests wait their turn
    /// in arrival order, and one larger than the whole budget runs alone.
    pub max_inflight_bytes: usize,
    /// READ/WRITE payload bytes in flight per connection (default
    /// [`DEFAULT_MAX_INFLIGHT_BYTES_PER_CONN`], 32 MiB), so that one
    /// connection cannot take the whole server budget. Taken before the
    /// server budget; capped at `max_inflight_bytes`.
    pub max_inflight_bytes_per_conn: usize,
    /// After `shutdown()`, how long a connection may take to drain before it
    /// is dropped (default 30 s).
    pub shutdown_grace: Duration,
    /// After every connection has drained or been dropped, how long
    /// `serve_*` still waits for request threads inside backend calls
    /// (default [`DEFAULT_SHUTDOWN_BACKEND_TIMEOUT`], 60 s). If some are
    /// still running then, `serve_*` returns a `TimedOut` error.
    pub shutdown_backend_timeout: Duration,
    /// Threads serving one connection's requests (started as needed; default
    /// 16). Requests in flight per connection are at most
    /// `min(max_inflight_per_conn, max_threads_per_conn)`.
    pub max_threads_per_conn: usize,
    /// Request threads of all connections together (default 64): past it a
    /// connection starts no more threads and its requests wait for the ones
    /// it has (every connection keeps at least one). Threads and their stacks
    /// and allocator caches are what a daemon's memory grows with per
    /// connection; the members, not more threads, bound throughput.
    pub max_threads: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_inflight_per_conn: 64,
            max_option_bytes: 4096,
            max_options: 64,
            handshake_timeout: Duration::from_secs(5),
            max_handshakes: 16,
            max_connections: 128,
            max_inflight_bytes: DEFAULT_MAX_INFLIGHT_BYTES,
            max_inflight_bytes_per_conn: DEFAULT_MAX_INFLIGHT_BYTES_PER_CONN,
            shutdown_grace: Duration::from_secs(30),
            shutdown_backend_timeout: DEFAULT_SHUTDOWN_BACKEND_TIMEOUT,
            max_threads_per_conn: 16,
            max_threads: 64,
        }
    }
}
