//! [`NbdDevice`]: a member that is an NBD export (`nbd://`, `nbd+unix://`), reached by our own
//! client on the server crate's codec.
//!
//! Shape: a pool of connections, each carrying one request at a time (`wire`). Several
//! requests are in flight per member by using several connections, which is only sound when
//! the server offers `NBD_FLAG_CAN_MULTI_CONN` (a flush on one connection then covers writes
//! acknowledged on any, and every connection sees the same data); without it the pool holds
//! one connection. FUA and FLUSH map from the [`Device`] trait (FUA is a write plus a flush when
//! the server lacks it); `discard_zeroes` is `NBD_CMD_WRITE_ZEROES` where offered (writes of
//! zeroes otherwise: TRIM does not promise zeroes). Requests above the server's maximum block
//! size are split; a server whose minimum block size exceeds 512 bytes is refused.
//!
//! Faults, as md sees them: a request whose connection fails (dropped, reset, or no progress
//! for `timeout`) is retried on a fresh connection until `retry` has passed since its first
//! failure; then it fails with an I/O error and the device stays failed, so the engine fails
//! the member exactly as it does on a local I/O error. An error the server *answers* (EIO,
//! ENOSPC, …) is final at once, like a disk's. Before any request goes out on a fresh
//! connection, every write since the last flush that covered it is re-sent (`replay`): a
//! write in flight at the drop is unknown and an acknowledged one may have been lost by a
//! restarted server; a flush in flight is re-issued by its caller only after that.
//!
//! Locking: `gate` is held shared by every attempt and exclusively by a reconnect, so a
//! reconnect sees every connection idle and no request overtakes the replay. `epoch` counts
//! reconnects: of several requests that saw the same drop, only the first reconnects. Lock
//! order: `gate`, then `pool` or `log` (never both at once).
//!
//! Known hazard (not fenced): a request abandoned on timeout may still be executed by a live
//! server later; NBD has no way to cancel it. If the caller meanwhile overwrote the same range,
//! the stale write can land last. A member that times out under load is better failed than
//! trusted, which is what a short `retry` window does.

mod replay;
mod uri;
mod wire;

pub use uri::{is_nbd_uri, NbdUri, Transport, UriError, DEFAULT_PORT};

use crate::{check_range, Device, SECTOR_BYTES};
use nbd::proto::*;
use parking_lot::{Condvar, Mutex, RwLock};
use replay::{ReplayLog, Written};
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use wire::{Conn, ExportInfo, Failure, Payload};

/// Largest request sent, whatever the server allows (the NBD default maximum).
const MAX_REQUEST_BYTES: u32 = 32 << 20;
/// Largest WRITE_ZEROES sent (no payload, so only the server's own limits matter).
const MAX_ZEROES_BYTES: u32 = 1 << 30;
/// Longest pause between two reconnect attempts.
const MAX_BACKOFF: Duration = Duration::from_millis(500);

/// How a remote member behaves under faults.
#[derive(Clone, Copy, Debug)]
pub struct RemoteOptions {
    /// A request fails over when the server makes no progress on it for this long.
    pub timeout: Duration,
    /// How long a failing request is retried on fresh connections before the member fails.
    pub retry: Duration,
    /// Connections (requests in flight) per member when the server offers multi-conn.
    pub connections: usize,
    /// Never write (examine).
    pub read_only: bool,
}

impl Default for RemoteOptions {
    fn default() -> RemoteOptions {
        RemoteOptions {
            timeout: Duration::from_secs(5),
            retry: Duration::from_secs(10),
            connections: 8,
            read_only: false,
        }
    }
}

struct Pool {
    idle: Vec<Conn>,
    /// Connections that exist: idle plus checked out.
    open: usize,
}

/// A member on an NBD export.
pub struct NbdDevice {
    name: String,
    uri: NbdUri,
    opts: RemoteOptions,
    export: ExportInfo,
    len_bytes: u64,
    max_conns: usize,
    max_request: u32,
    pool: Mutex<Pool>,
    conn_freed: Condvar,
    gate: RwLock<()>,
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
        let (conn, export) = Conn::open(&uri, opts.timeout)
            .map_err(|e| io::Error::new(e.kind(), format!("{uri_text}: {e}")))?;
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
            opts,
            export,
            len_bytes: export.size_bytes / SECTOR_BYTES * SECTOR_BYTES,
            max_conns,
            max_request,
            pool: Mutex::new(Pool {
                idle: vec![conn],
                open: 1,
            }),
            conn_freed: Condvar::new(),
            gate: RwLock::new(()),
            epoch: AtomicU64::new(0),
            log: Mutex::new(ReplayLog::default()),
            failed: AtomicBool::new(false),
        })
    }

    /// Connections the pool may hold (1 without multi-conn).
    pub fn max_connections(&self) -> usize {
        self.max_conns
    }

    fn connect(&self) -> io::Result<Conn> {
        let (conn, export) = Conn::open(&self.uri, self.opts.timeout)?;
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

    fn checkout(&self) -> Result<Conn, Failure> {
        let mut pool = self.pool.lock();
        loop {
            if let Some(c) = pool.idle.pop() {
                return Ok(c);
            }
            if pool.open < self.max_conns {
                pool.open += 1;
                drop(pool);
                return self.connect().map_err(|e| {
                    self.discard(None);
                    Failure::Transport(e)
                });
            }
            self.conn_freed.wait(&mut pool);
        }
    }

    fn checkin(&self, conn: Conn) {
        self.pool.lock().idle.push(conn);
        self.conn_freed.notify_one();
    }

    /// A connection is gone (closed here, or never opened).
    fn discard(&self, conn: Option<Conn>) {
        drop(conn);
        let mut pool = self.pool.lock();
        assert!(
            pool.open > 0,
            "discarding more connections than were opened"
        );
        pool.open -= 1;
        self.conn_freed.notify_one();
    }

    /// Run `op` on a connection, retrying on fresh ones within the retry window.
    fn execute(&self, mut op: impl FnMut(&mut Conn) -> Result<(), Failure>) -> io::Result<()> {
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
                self.checkout().and_then(|mut conn| match op(&mut conn) {
                    Ok(()) => {
                        self.checkin(conn);
                        Ok(())
                    }
                    Err(Failure::Server(e)) => {
                        self.checkin(conn);
                        Err(Failure::Server(e))
                    }
                    Err(e) => {
                        self.discard(Some(conn));
                        Err(e)
                    }
                })
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
        let _all = self.gate.write();
        if self.epoch.load(Ordering::Acquire) != seen_epoch && since.elapsed() < self.opts.retry {
            return Ok(());
        }
        let stale = {
            let mut pool = self.pool.lock();
            assert_eq!(
                pool.open,
                pool.idle.len(),
                "a reconnect runs with every connection idle"
            );
            pool.open = 0;
            std::mem::take(&mut pool.idle)
        };
        drop(stale);
        let mut backoff = Duration::from_millis(10);
        loop {
            if self.failed.load(Ordering::Acquire) {
                return Err(eio(format!("{}: failed earlier", self.name)));
            }
            let left = self.opts.retry.saturating_sub(since.elapsed());
            let err = match self.reconnect_and_replay() {
                Ok(conn) if !left.is_zero() => {
                    let mut pool = self.pool.lock();
                    pool.idle.push(conn);
                    pool.open = 1;
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

    /// A fresh connection on which every logged write was re-sent, in order.
    fn reconnect_and_replay(&self) -> Result<Conn, Failure> {
        let mut conn = self.connect()?;
        let entries = self.log.lock().snapshot();
        for (_, e) in &entries {
            match &e.written {
                Written::Data(d) => conn.request(
                    CMD_WRITE,
                    0,
                    e.offset_bytes,
                    d.len() as u32,
                    Payload::Write(d),
                )?,
                Written::Zeroes(n) => {
                    conn.request(CMD_WRITE_ZEROES, 0, e.offset_bytes, *n, Payload::None)?
                }
            }
        }
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

    /// One logged request that changes the export (WRITE or WRITE_ZEROES).
    fn logged_write(&self, offset_bytes: u64, written: Written, fua: bool) -> io::Result<()> {
        let seq = self.log.lock().push(offset_bytes, written.clone());
        let flags = if fua { CMD_FLAG_FUA } else { 0 };
        let result = self.execute(|conn| match &written {
            Written::Data(d) => conn.request(
                CMD_WRITE,
                flags,
                offset_bytes,
                d.len() as u32,
                Payload::Write(d),
            ),
            Written::Zeroes(n) => {
                conn.request(CMD_WRITE_ZEROES, flags, offset_bytes, *n, Payload::None)
            }
        });
        let mut log = self.log.lock();
        match result {
            Ok(()) => log.complete(seq),
            Err(_) => log.drop_entry(seq),
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
        let mut done = 0usize;
        while done < total {
            let len = (total - done).min(self.max_request as usize);
            let mut piece = Vec::with_capacity(len);
            while piece.len() < len {
                if current.is_empty() {
                    current = rest.next().expect("the pieces add up to total");
                }
                let n = current.len().min(len - piece.len());
                piece.extend_from_slice(&current[..n]);
                current = &current[n..];
            }
            let written = Written::Data(Arc::new(piece));
            self.logged_write(offset_bytes + done as u64, written, native_fua)?;
            done += len;
        }
        self.after_write(fua)
    }
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
        let mut at = offset_bytes;
        for piece in buf.chunks_mut(self.max_request as usize) {
            let len = piece.len() as u32;
            self.execute(|conn| conn.request(CMD_READ, 0, at, len, Payload::Read(piece)))?;
            at += u64::from(len);
        }
        Ok(())
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
            self.execute(|conn| conn.request(CMD_FLUSH, 0, 0, 0, Payload::None))?;
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
        let mut done = 0u64;
        while done < len_bytes {
            let n = (len_bytes - done).min(u64::from(MAX_ZEROES_BYTES)) as u32;
            self.logged_write(offset_bytes + done, Written::Zeroes(n), false)?;
            done += u64::from(n);
        }
        self.after_write(false)
    }
}

impl Drop for NbdDevice {
    fn drop(&mut self) {
        for conn in self.pool.get_mut().idle.drain(..) {
            conn.disconnect();
        }
    }
}
