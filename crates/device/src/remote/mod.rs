//! [`NbdDevice`]: a member that is an NBD export (`nbd://`, `nbd+unix://`), reached by our own
//! client on the server crate's codec.
//!
//! Shape: each connection carries many requests at once (`pipeline`: callers send, and one
//! waiting caller at a time reads replies and hands them back by handle). When the server offers `NBD_FLAG_CAN_MULTI_CONN` (a
//! flush on one connection then covers writes acknowledged on any, and every connection sees
//! the same data) a member opens more connections as load grows, up to
//! [`RemoteOptions::connections`], each request going to the least busy; without it one
//! connection carries everything. FUA and FLUSH map from the [`Device`] trait (FUA is a write
//! plus a flush when the server lacks it); `discard_zeroes` is `NBD_CMD_WRITE_ZEROES` where
//! offered (writes of zeroes otherwise: TRIM does not promise zeroes). Requests above the
//! server's maximum block size are split and the pieces sent back to back; a server whose
//! minimum block size exceeds 512 bytes is refused.
//!
//! Faults, as md sees them: a request whose connection fails (dropped, reset, or a request on
//! it unanswered for `timeout`) is retried on a fresh connection until `retry` has passed
//! since its first failure; then it fails with an I/O error and the device stays failed, so the
//! engine fails the member exactly as it does on a local I/O error. An error the server
//! *answers* (EIO, ENOSPC, …) is final at once, like a disk's. Before any request goes out on a
//! fresh connection, every write since the last flush that covered it is re-sent (`replay`): a
//! write in flight at the drop is unknown and an acknowledged one may have been lost by a
//! restarted server; a flush in flight is re-issued by its caller only after that.
//!
//! Locking: `gate` is held shared by every attempt and exclusively by a reconnect, so a
//! reconnect sees no request in flight and no request overtakes the replay; while a dead
//! connection is in the pool no attempt starts on another (it joins the reconnect instead).
//! `epoch` counts reconnects: of several requests that saw the same drop, only the first
//! reconnects, the others wait on `reconnecting`. Lock order: `reconnecting`, `gate`, then
//! `pool` or `log` (never both at once).
//!
//! Known hazard (not fenced): a request abandoned on timeout may still be executed by a live
//! server later; NBD has no way to cancel it. If the caller meanwhile overwrote the same range,
//! the stale write can land last. A member that times out under load is better failed than
//! trusted, which is what a short `retry` window does.

mod pipeline;
mod replay;
mod tls;
mod transport;
mod uri;
mod wire;

pub use uri::{is_nbd_uri, NbdUri, TlsParams, Transport, UriError, DEFAULT_PORT};

use crate::{check_range, Device, SECTOR_BYTES};
use nbd::proto::*;
use parking_lot::{Mutex, RwLock};
use pipeline::{Pipeline, Req};
use replay::{ReplayLog, Written};
use std::io;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tls::TlsSetup;
use wire::{ExportInfo, Failure, Payload};

/// Largest request sent, whatever the server allows. Larger reads and writes go out as pieces
/// back to back, so that the server works on the first while the next ones are on their way
/// (one 1 MiB request is received whole before the server starts writing it).
const MAX_REQUEST_BYTES: u32 = 256 << 10;
/// Largest WRITE_ZEROES sent (no payload, so only the server's own limits matter).
const MAX_ZEROES_BYTES: u32 = 1 << 30;
/// Longest pause between two reconnect attempts.
const MAX_BACKOFF: Duration = Duration::from_millis(500);

/// How a remote member behaves under faults, and what it trusts.
#[derive(Clone, Debug)]
pub struct RemoteOptions {
    /// A request fails over (with every other on its connection) when it has waited this long
    /// for its reply.
    pub timeout: Duration,
    /// How long a failing request is retried on fresh connections before the member fails.
    pub retry: Duration,
    /// Connections per member at most, when the server offers multi-conn (each carries many
    /// requests at once).
    pub connections: usize,
    /// Never write (examine).
    pub read_only: bool,
    /// The CA an `nbds` member's certificate must chain to when its URI names no
    /// `tls-certificates` directory (default: the system's bundle).
    pub tls_ca: Option<PathBuf>,
}

impl Default for RemoteOptions {
    fn default() -> RemoteOptions {
        RemoteOptions {
            timeout: Duration::from_secs(5),
            retry: Duration::from_secs(10),
            connections: 4,
            read_only: false,
            tls_ca: None,
        }
    }
}

/// Requests in flight on the least busy connection before another is opened (multi-conn).
/// Measured against 1 with 8 connections (`ab` runs of fio on a RAID0 of 4 nbdkit exports,
/// load 9–10): 1 gave 8% more 4K random reads and ~5% more 1M reads, 4 gave 10–25% more 1M
/// writes, which the throughput targets are about.
const BUSY_CONNECTION: usize = 4;

/// The open connections; empty only while a reconnect runs or after the member failed.
struct Pool {
    conns: Vec<Arc<Pipeline>>,
}

/// The pieces of one caller's request, all sent on one connection.
type Batch<'a> = Vec<Req<'a>>;

/// A member on an NBD export.
pub struct NbdDevice {
    name: String,
    uri: NbdUri,
    tls: Option<TlsSetup>,
    opts: RemoteOptions,
    export: ExportInfo,
    len_bytes: u64,
    max_conns: usize,
    max_request: u32,
    pool: Mutex<Pool>,
    gate: RwLock<()>,
    reconnecting: Mutex<()>,
    epoch: AtomicU64,
    log: Mutex<ReplayLog>,
    failed: AtomicBool,
}

fn eio(msg: String) -> io::Error {
    io::Error::other(msg)
}

impl NbdDevice {
    /// Connect to `uri` (its text is the member's name) and check the export can be a member.
    pub fn open(uri_text: &str, opts: RemoteOptions) -> io::Result<NbdDevice> {
        let uri = NbdUri::parse(uri_text)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))?;
        let with_name = |e: io::Error| io::Error::new(e.kind(), format!("{uri_text}: {e}"));
        let tls = uri
            .tls
            .as_ref()
            .map(|params| TlsSetup::new(&uri, params, opts.tls_ca.as_deref()))
            .transpose()
            .map_err(with_name)?;
        let (conn, export) = wire::open(&uri, opts.timeout, tls.as_ref()).map_err(with_name)?;
        let refuse =
            |why: String| io::Error::new(io::ErrorKind::InvalidInput, format!("{uri_text}: {why}"));
        if export.min_block as u64 > SECTOR_BYTES {
            return Err(refuse(format!(
                "minimum block size {} is above md's 512-byte sector",
                export.min_block
            )));
        }
        if export.has(FLAG_READ_ONLY) && !opts.read_only {
            return Err(refuse("the export is read-only".into()));
        }
        let max_request =
            (export.max_block.min(MAX_REQUEST_BYTES) as u64 / SECTOR_BYTES * SECTOR_BYTES) as u32;
        if max_request == 0 {
            return Err(refuse(format!(
                "maximum block size {} is below 512",
                export.max_block
            )));
        }
        let max_conns = if export.has(FLAG_CAN_MULTI_CONN) {
            opts.connections.max(1)
        } else {
            1
        };
        Ok(NbdDevice {
            name: uri_text.to_string(),
            uri,
            tls,
            opts,
            export,
            len_bytes: export.size_bytes / SECTOR_BYTES * SECTOR_BYTES,
            max_conns,
            max_request,
            pool: Mutex::new(Pool {
                conns: vec![Arc::new(conn)],
            }),
            gate: RwLock::new(()),
            reconnecting: Mutex::new(()),
            epoch: AtomicU64::new(0),
            log: Mutex::new(ReplayLog::default()),
            failed: AtomicBool::new(false),
        })
    }

    /// The server answers in structured chunks (`NBD_OPT_STRUCTURED_REPLY` was accepted).
    pub fn structured_replies(&self) -> bool {
        self.export.structured
    }

    /// Connections the pool may hold (1 without multi-conn).
    pub fn max_connections(&self) -> usize {
        self.max_conns
    }

    /// Connections open now.
    pub fn open_connections(&self) -> usize {
        self.pool.lock().conns.len()
    }

    fn connect(&self) -> io::Result<Pipeline> {
        let (conn, export) = wire::open(&self.uri, self.opts.timeout, self.tls.as_ref())?;
        if export.size_bytes != self.export.size_bytes || export.flags != self.export.flags {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "export changed (size {} flags {:#x})",
                    export.size_bytes, export.flags
                ),
            ));
        }
        Ok(conn)
    }

    /// The least busy connection, a new one when all are busy and the server allows more.
    /// A dead connection in the pool means a reconnect is owed: nothing goes out before it.
    fn pick(&self) -> Result<Arc<Pipeline>, Failure> {
        let mut pool = self.pool.lock();
        let mut least: Option<(usize, &Arc<Pipeline>)> = None;
        for c in &pool.conns {
            if c.is_dead() {
                return Err(Failure::Transport(io::Error::new(
                    io::ErrorKind::ConnectionAborted,
                    "a connection to the member died",
                )));
            }
            let n = c.in_flight();
            if least.is_none_or(|(m, _)| n < m) {
                least = Some((n, c));
            }
        }
        match least {
            Some((n, c)) if n < BUSY_CONNECTION || pool.conns.len() >= self.max_conns => {
                Ok(c.clone())
            }
            _ => {
                let c = Arc::new(self.connect()?);
                pool.conns.push(c.clone());
                Ok(c)
            }
        }
    }

    /// Run the batch `make` builds on one connection, retrying (a fresh batch) on fresh
    /// connections within the retry window.
    fn execute(&self, mut make: impl FnMut(&Pipeline) -> Result<(), Failure>) -> io::Result<()> {
        let mut first_failure: Option<Instant> = None;
        loop {
            if self.failed.load(Ordering::Acquire) {
                return Err(eio(format!(
                    "{}: failed earlier (no answer within the retry window)",
                    self.name
                )));
            }
            let epoch = self.epoch.load(Ordering::Acquire);
            let result = {
                let _attempt = self.gate.read();
                self.pick().and_then(|conn| make(&conn))
            };
            match result {
                Ok(()) => return Ok(()),
                Err(Failure::Server(errno)) => {
                    let e = io::Error::from_raw_os_error(errno as i32);
                    return Err(io::Error::new(
                        e.kind(),
                        format!("{}: server says {e}", self.name),
                    ));
                }
                Err(Failure::Transport(cause)) => {
                    let since = *first_failure.get_or_insert_with(Instant::now);
                    self.recover(epoch, since, &cause)?;
                }
            }
        }
    }

    /// After a transport failure seen at `epoch`: a fresh connection with the log replayed,
    /// or, past the retry window, the member failed.
    fn recover(&self, seen_epoch: u64, since: Instant, cause: &io::Error) -> io::Result<()> {
        // A reconnect that ended after our attempt began waited for that attempt (the gate):
        // it came after our failure and replayed what we sent. The requests of one drop wait
        // for the first one's reconnect on `reconnecting`, not on the gate, where each would
        // wait for the retried requests of the ones before it.
        let reconnected = || {
            self.epoch.load(Ordering::Acquire) != seen_epoch && since.elapsed() < self.opts.retry
        };
        let _one = self.reconnecting.lock();
        if reconnected() {
            return Ok(());
        }
        let _all = self.gate.write();
        // No attempt runs (the gate): these are the pool's own references.
        let stale = std::mem::take(&mut self.pool.lock().conns);
        drop(stale);
        let mut backoff = Duration::from_millis(10);
        loop {
            if self.failed.load(Ordering::Acquire) {
                return Err(eio(format!("{}: failed earlier", self.name)));
            }
            let left = self.opts.retry.saturating_sub(since.elapsed());
            let err = match self.reconnect_and_replay() {
                Ok(conn) if !left.is_zero() => {
                    self.pool.lock().conns.push(Arc::new(conn));
                    self.epoch.fetch_add(1, Ordering::AcqRel);
                    tracing::warn!(member = %self.name, %cause, "reconnected; unflushed writes re-sent");
                    return Ok(());
                }
                Ok(_) => cause.to_string(),
                Err(Failure::Transport(e)) if !left.is_zero() => {
                    std::thread::sleep(backoff.min(left));
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                    tracing::debug!(member = %self.name, error = %e, "reconnect failed; retrying");
                    continue;
                }
                Err(Failure::Transport(e)) => e.to_string(),
                Err(Failure::Server(errno)) => {
                    format!(
                        "re-sending unflushed writes: {}",
                        io::Error::from_raw_os_error(errno as i32)
                    )
                }
            };
            self.failed.store(true, Ordering::Release);
            tracing::error!(member = %self.name, %cause, last = %err, "member unreachable past the retry window");
            return Err(eio(format!(
                "{}: failing after {:?} of retries ({cause}; last: {err})",
                self.name, self.opts.retry
            )));
        }
    }

    /// A fresh connection on which every logged write was re-sent. Writes go out back to back
    /// except that one overlapping a write still in flight waits for it: the server may
    /// execute requests in flight in any order, and overlapping ones must end as they did.
    fn reconnect_and_replay(&self) -> Result<Pipeline, Failure> {
        let conn = self.connect()?;
        let entries = self.log.lock().snapshot();
        let mut group: Vec<&replay::Entry> = Vec::new();
        for (_, e) in &entries {
            if group.iter().any(|g| g.overlaps(e)) {
                send_batch(&conn, group.drain(..).map(replay_req).collect())?;
            }
            group.push(e);
        }
        send_batch(&conn, group.into_iter().map(replay_req).collect())?;
        Ok(conn)
    }

    fn check_writable(&self) -> io::Result<()> {
        if self.opts.read_only {
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!("{}: opened read-only", self.name),
            ));
        }
        Ok(())
    }

    /// Logged requests that change the export (WRITE or WRITE_ZEROES pieces), sent together.
    fn logged_writes(&self, pieces: Vec<(u64, Written)>, fua: bool) -> io::Result<()> {
        let seqs: Vec<u64> = {
            let mut log = self.log.lock();
            pieces
                .iter()
                .map(|(at, w)| log.push(*at, w.clone()))
                .collect()
        };
        let flags = if fua { CMD_FLAG_FUA } else { 0 };
        let result = self.execute(|conn| {
            send_batch(
                conn,
                pieces
                    .iter()
                    .map(|(at, w)| write_req(*at, w, flags))
                    .collect(),
            )
        });
        let mut log = self.log.lock();
        for seq in seqs {
            match result {
                Ok(()) => log.complete(seq),
                Err(_) => log.drop_entry(seq),
            }
        }
        result
    }

    /// After a write: FUA the server could not do itself, or the log grown past its bound.
    fn after_write(&self, fua: bool) -> io::Result<()> {
        let emulate_fua = fua && !self.export.has(FLAG_SEND_FUA);
        if emulate_fua || self.log.lock().over_limit() {
            return self.flush();
        }
        Ok(())
    }

    /// The concatenation of `bufs` as requests of at most `max_request` bytes, each gathered
    /// once into the copy the replay log keeps and the socket is written from.
    fn write_gathered(&self, bufs: &[&[u8]], offset_bytes: u64, fua: bool) -> io::Result<()> {
        self.check_writable()?;
        let total: usize = bufs.iter().map(|b| b.len()).sum();
        check_range(self, offset_bytes, total as u64);
        let native_fua = fua && self.export.has(FLAG_SEND_FUA);
        let mut rest = bufs.iter().copied().filter(|b| !b.is_empty());
        let mut current: &[u8] = &[];
        let mut pieces = Vec::new();
        let mut done = 0usize;
        while done < total {
            let len = (total - done).min(self.max_request as usize);
            let mut piece = self.log.lock().buffer(len);
            while piece.len() < len {
                if current.is_empty() {
                    current = rest.next().expect("the pieces add up to total");
                }
                let n = current.len().min(len - piece.len());
                piece.extend_from_slice(&current[..n]);
                current = &current[n..];
            }
            pieces.push((offset_bytes + done as u64, Written::Data(Arc::new(piece))));
            done += len;
        }
        self.logged_writes(pieces, native_fua)?;
        self.after_write(fua)
    }
}

/// The request that re-sends a logged write.
fn replay_req(e: &replay::Entry) -> Req<'_> {
    write_req(e.offset_bytes, &e.written, 0)
}

fn write_req(offset: u64, w: &Written, flags: u16) -> Req<'_> {
    match w {
        Written::Data(d) => Req {
            command: CMD_WRITE,
            flags,
            offset,
            length: d.len() as u32,
            payload: Payload::Write(d),
        },
        Written::Zeroes(n) => Req {
            command: CMD_WRITE_ZEROES,
            flags,
            offset,
            length: *n,
            payload: Payload::None,
        },
    }
}

/// The batch's requests back to back on `conn`; one outcome: a transport failure if any (the
/// batch is retried whole), else the first error the server answered.
fn send_batch(conn: &Pipeline, batch: Batch<'_>) -> Result<(), Failure> {
    let mut server = None;
    for r in conn.requests(batch) {
        match r {
            Ok(()) => {}
            Err(Failure::Transport(e)) => return Err(Failure::Transport(e)),
            Err(Failure::Server(errno)) => server = server.or(Some(errno)),
        }
    }
    server.map_or(Ok(()), |errno| Err(Failure::Server(errno)))
}

impl Device for NbdDevice {
    fn name(&self) -> &str {
        &self.name
    }

    fn len_bytes(&self) -> u64 {
        self.len_bytes
    }

    fn read_at(&self, buf: &mut [u8], offset_bytes: u64) -> io::Result<()> {
        check_range(self, offset_bytes, buf.len() as u64);
        let max = self.max_request as usize;
        self.execute(|conn| {
            let batch = buf
                .chunks_mut(max)
                .enumerate()
                .map(|(i, piece)| Req {
                    command: CMD_READ,
                    flags: 0,
                    offset: offset_bytes + (i * max) as u64,
                    length: piece.len() as u32,
                    payload: Payload::Read(piece),
                })
                .collect();
            send_batch(conn, batch)
        })
    }

    fn write_at(&self, buf: &[u8], offset_bytes: u64, fua: bool) -> io::Result<()> {
        self.write_gathered(&[buf], offset_bytes, fua)
    }

    fn write_vectored_at(&self, bufs: &[&[u8]], offset_bytes: u64, fua: bool) -> io::Result<()> {
        self.write_gathered(bufs, offset_bytes, fua)
    }

    fn flush(&self) -> io::Result<()> {
        let covered = self.log.lock().covered_by_flush();
        if self.export.has(FLAG_SEND_FLUSH) {
            self.execute(|conn| {
                conn.request(Req {
                    command: CMD_FLUSH,
                    flags: 0,
                    offset: 0,
                    length: 0,
                    payload: Payload::None,
                })
            })?;
        }
        // Without SEND_FLUSH the server has no cache to flush: acknowledged is durable.
        self.log.lock().flushed(&covered);
        Ok(())
    }

    fn discard_zeroes(&self, offset_bytes: u64, len_bytes: u64) -> io::Result<()> {
        self.check_writable()?;
        check_range(self, offset_bytes, len_bytes);
        if !self.export.has(FLAG_SEND_WRITE_ZEROES) {
            return crate::file::write_zeroes(self, offset_bytes, len_bytes);
        }
        let mut pieces = Vec::new();
        let mut done = 0u64;
        while done < len_bytes {
            let n = (len_bytes - done).min(u64::from(MAX_ZEROES_BYTES)) as u32;
            pieces.push((offset_bytes + done, Written::Zeroes(n)));
            done += u64::from(n);
        }
        self.logged_writes(pieces, false)?;
        self.after_write(false)
    }
}

impl Drop for NbdDevice {
    fn drop(&mut self) {
        for conn in self.pool.get_mut().conns.drain(..) {
            conn.disconnect();
        }
    }
}
