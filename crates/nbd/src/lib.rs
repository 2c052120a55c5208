//! `nbd`: the NBD (Network Block Device) server side of ironraid.
//!
//! Layers:
//! - [`proto`]: protocol constants (pure);
//! - [`codec`]: parsing/encoding of every message, big-endian, no I/O, never
//!   panics on arbitrary input (proptest + fuzz targets);
//! - [`command`]: pure validation of a request against the negotiation;
//! - [`Limits`], `shutdown`, `stream`, [`combine`]: what the phases below the server share
//!   (resource limits, the shutdown signal, the socket in blocking mode, a writer that
//!   combines small messages of several threads; the member client writes with its
//!   `write_all_vectored`);
//! - `handshake`: async protocol state machine over any
//!   `AsyncRead + AsyncWrite` stream;
//! - `transmission`: the request loop on blocking threads per connection,
//!   starting from what the handshake negotiated;
//! - [`Server`]: Unix/TCP listeners, connection limits, graceful shutdown,
//!   generic over the [`Backend`] trait.
//!
//! The list runs bottom-up: a module imports only modules listed before it
//! (and the helpers `backend`, `budget`, `buf`, `threads`); `scripts/module-cycles`
//! checks that no import circle comes back.
//!
//! # Supported
//! Fixed newstyle handshake (`FIXED_NEWSTYLE | NO_ZEROES`; unknown client
//! flags close the connection). Options: `EXPORT_NAME`, `ABORT`, `LIST`,
//! `INFO`, `GO` (replies `NBD_INFO_EXPORT`, `BLOCK_SIZE`, and `NAME` /
//! `DESCRIPTION` when asked; `""` selects the first export), `STRUCTURED_REPLY`,
//! `LIST_META_CONTEXT` / `SET_META_CONTEXT` (`base:allocation`, with the
//! extents [`Backend::block_status`] gives). `STARTTLS` on TCP listeners of a
//! server given a [`TlsConfig`] (rustls; when required, every other option but
//! `ABORT` gets `NBD_REP_ERR_TLS_REQD` and `EXPORT_NAME` closes); anything else
//! gets `NBD_REP_ERR_UNSUP`; malformed options `NBD_REP_ERR_INVALID`; option data
//! above `Limits::max_option_bytes` `NBD_REP_ERR_TOO_BIG` (discarded up to
//! 1 MiB, beyond that the connection is closed).
//!
//! Transmission flags: `HAS_FLAGS, SEND_FLUSH, SEND_FUA, SEND_TRIM,
//! SEND_WRITE_ZEROES, SEND_FAST_ZERO, SEND_CACHE, CAN_MULTI_CONN`, plus
//! `SEND_DF` with structured replies and `READ_ONLY` for read-only backends.
//! Commands: READ, WRITE, FLUSH, TRIM, WRITE_ZEROES (`NO_HOLE`, `FAST_ZERO` →
//! `ENOTSUP` unless [`Backend::fast_zero`]), CACHE, DISC, BLOCK_STATUS.
//! Reads under structured replies are one `OFFSET_DATA` chunk (so `DF` always
//! holds); a failed large read without `DF` is re-read piecewise and
//! answered with data chunks plus `ERROR_OFFSET` chunks.
//!
//! # Validation (per request)
//! Bad magic → connection closed. READ or WRITE longer than the advertised
//! maximum (64 MiB, as nbdkit) → `EOVERFLOW` (a WRITE's payload is read and
//! discarded first, so the connection and its other requests go on). Unknown
//! command, flag not allowed for the command, READ beyond the end,
//! misalignment (only if the client asked for `NBD_INFO_BLOCK_SIZE`),
//! FLUSH with non-zero offset/length, BLOCK_STATUS without a negotiated
//! context or with length 0 → `EINVAL`. WRITE / WRITE_ZEROES beyond the end →
//! `ENOSPC` (as the spec prefers). Write-type commands on a read-only export
//! → `EPERM`. A WRITE whose payload ends early closes the connection with
//! nothing written. Zero-length READ/WRITE/TRIM/ZERO/CACHE
//! succeed as no-ops. TRIM, WRITE_ZEROES and CACHE may be longer than the
//! maximum block size: they are split into `max`-sized backend calls.
//!
//! # Limits and invariants
//! See [`Limits`]: in-flight requests per connection, payload bytes in
//! flight on all connections together and per connection (back-pressure: a
//! connection's socket is not read while its next request does not fit; see
//! `budget`), option size and count, handshake timeout, connection count
//! (connections still in the handshake have their own small limit: when it is
//! reached the oldest of them is closed, so idle connections cannot lock real
//! clients out),
//! shutdown grace period, and how long a shutdown waits for backend calls
//! that outlive their connection (`serve_*` returns only once every request
//! thread has left the backend, or reports that some have not).
//! After the handshake a connection leaves the tokio reactor: a few plain
//! threads per connection (started as needed, at most
//! `Limits::max_threads_per_conn`) take turns reading requests from the
//! blocking socket; the thread that read a request calls the backend and
//! writes the reply itself, whole, under the connection's write lock, or
//! leaves a small one to the thread holding that lock ([`combine`])
//! (requests run concurrently and are answered out of order; a lone small
//! request runs without any thread hand-off). A backend that asks for it
//! ([`Backend::gathers_writes`]) gets a sequential stream's WRITEs that arrived
//! together as one run ([`Backend::write_gathered`]), answered in one write. A reply is written only after
//! the backend call returned, so a FLUSH (an engine-wide barrier by the
//! [`Backend`] contract) covers every write already acknowledged. Backend errors are
//! mapped by [`errno_for`] to `EPERM, EIO, EINVAL, ENOSPC, EOVERFLOW,
//! ENOTSUP` only. Payload buffers are 4 KiB aligned ([`buf::AlignedBuf`]).
//! No `unsafe` code.

#![forbid(unsafe_code)]

mod backend;
mod budget;
pub mod buf;
pub mod codec;
pub mod combine;
pub mod command;
mod handshake;
mod limits;
mod pipe;
pub mod proto;
mod server;
mod shutdown;
mod stream;
mod threads;
mod tls;
mod transmission;

pub use backend::{errno_for, Backend, BlockSizes, Export, GatheredWrite, WriteHint, MAX_PAYLOAD};
pub use budget::{DEFAULT_MAX_INFLIGHT_BYTES, DEFAULT_MAX_INFLIGHT_BYTES_PER_CONN};
pub use limits::Limits;
pub use server::Server;
pub use stream::widen_unix_send_buffer;
pub use threads::DEFAULT_SHUTDOWN_BACKEND_TIMEOUT;
pub use tls::{read_certs, read_key, TlsConfig};
