//! Transmission phase on plain threads: after the handshake the socket leaves
//! the tokio reactor and is served with blocking I/O by a small, lazily grown
//! set of threads per connection (leader/follower, as nbdkit does).
//!
//! Each connection thread loops: take the read lock, read one request (header,
//! and payload for WRITE), validate it; then either hand the read side to
//! another thread and run the request, or — when nothing else is pending (no
//! request in flight, no bytes buffered) and the backend has been answering
//! fast — run it while keeping the read side;
//! the thread that ran a request writes its reply itself, whole, under the
//! write lock (replies never interleave), or, when another thread holds that
//! lock and the reply is small, leaves a copy of it to that thread (`combine`).
//! So a request costs no thread hand-off at queue depth 1, and a small reply
//! never waits for the lock.
//! For a backend that gathers writes, a WRITE is read together with the
//! sequential WRITEs right behind it that are buffered whole, and the run goes
//! to the backend in one call, its replies in one socket write (`gather`); a
//! run keeps the read side, whatever else is pending, so a stream's next
//! WRITEs make the next run. A thread handing the read side over after a WRITE first
//! announces the WRITE right behind it to the backend if its header is buffered already
//! (`announce_next`): the next reader, woken for it, may take a while, and a stripe cache
//! deciding meanwhile whether the stream fills its row should count that WRITE as coming.
//!
//! Invariants:
//! - at most `min(max_inflight_per_conn, max_threads_per_conn)` requests (and
//!   `max_inflight_bytes_per_conn` payload bytes, all connections together at
//!   most `max_inflight_bytes`) are between "header read" and "reply
//!   written": a thread holds one request, or a gathered run that stops
//!   growing at that limit and keeps the read side until it has been
//!   answered, and the payload grant (see
//!   `budget`) is taken by the thread holding the read side before the
//!   payload buffer exists, so when a limit is reached nobody reads the
//!   socket (back-pressure);
//! - a reply is written (or queued for the thread writing) only after the
//!   backend call returned, so a later FLUSH always covers every write whose
//!   reply was already sent; a queued reply is written by a thread that holds
//!   the connection, before that thread lets it go;
//! - on DISC, shutdown, a protocol violation or EOF the reading stops, every
//!   request already read still completes and its reply is written, then the
//!   connection is closed. Shutdown wakes a thread blocked in `recv` with
//!   `shutdown(SHUT_RD)`; if the connection future is dropped (grace period
//!   expired) the socket is shut down both ways and the threads exit as soon
//!   as their backend calls return;
//! - every thread holds a token of the server's thread tracker from before it
//!   is spawned until it exits, so the server's shutdown can wait for backend
//!   calls that outlive their connection (see `threads`).

use std::io::{self, BufRead, BufReader, Read};
use std::net::Shutdown;
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use tokio::sync::{mpsc, watch};
use tracing::{debug, warn};

use crate::backend::{errno_for, Backend, BlockSizes, WriteHint};
use crate::budget::{Budget, PayloadGrant};
use crate::buf::{AlignedBuf, BufPool};
use crate::codec::{self, Request};
use crate::combine::{write_all_vectored, Combining};
use crate::command::{validate, Command, ExportParams, Rejection};
use crate::handshake::Negotiated;
use crate::pipe;
use crate::proto::*;
use crate::shutdown::stopped;
use crate::stream::Stream;
use crate::threads::{ThreadToken, ThreadTracker};

mod gather;

/// Size of the per-connection receive buffer: one `recv` picks up many
/// pipelined request headers (and small write payloads).
const READ_BUF: usize = 64 * 1024;

/// Requests up to this many payload bytes may run on the reading thread.
const INLINE_MAX_LEN: u32 = 128 * 1024;

/// Replies up to this size (header and data) are queued rather than waited for when the write
/// lock is taken: copying 4 KiB costs far less than a sleep and a wake-up.
const QUEUED_REPLY_MAX: usize = 4096 + 64;

/// A request runs on the reading thread (no hand-off) only when nothing else
/// is pending and the previous request took less than this long in the
/// backend: a slow backend must not hold up a request that arrives meanwhile.
const INLINE_MAX_NS: u64 = 200_000;

/// Per-connection state shared by the connection's threads.
struct Ctx {
    backend: Arc<dyn Backend>,
    /// Payload buffers for reuse (the server's, shared by its connections).
    bufs: Arc<BufPool>,
    /// [`Backend::gathers_writes`], asked once.
    gathers: bool,
    /// [`Backend::read_fills_buffer`], asked once.
    reads_fill: bool,
    /// [`Backend::splices_reads`], asked once.
    splices: bool,
    params: ExportParams,
    bs: BlockSizes,
}

/// Connection-wide settings.
pub(crate) struct ConnConfig {
    pub max_inflight: usize,
    /// This connection's payload budget (at most the server's).
    pub max_inflight_bytes: usize,
    pub max_threads: usize,
    /// Request threads of all connections together, at most.
    pub max_server_threads: usize,
    /// Payload buffers for reuse, shared by the server's connections.
    pub bufs: Arc<BufPool>,
    /// The payload budget shared by every connection of the server.
    pub server_budget: Arc<Budget>,
    /// Counts this connection's threads for the server's shutdown.
    pub threads: Arc<ThreadTracker>,
}

/// The read side; whoever holds its lock is the one thread reading requests.
struct ReadSide {
    r: BufReader<Stream>,
    /// Reading has ended for good (EOF, DISC, protocol error, shutdown).
    closed: bool,
    /// Where the last WRITE read ended (see `gather`).
    write_end: u64,
    /// The requests just read continue a sequential stream of WRITEs.
    in_stream: bool,
    /// A WRITE whose header was taken off the buffer and announced to the backend
    /// (`announce_next`), with the backend's hint: the next request, its payload still to read.
    announced: Option<(Request, Option<WriteHint>)>,
}

struct Conn {
    ctx: Ctx,
    rd: Mutex<ReadSide>,
    wr: Combining<Stream>,
    /// A handle for `shutdown(2)` from outside the threads.
    ctl: Stream,
    /// Shutdown requested or the socket failed: read nothing more.
    stop: AtomicBool,
    /// Requests read and not yet answered.
    inflight: AtomicUsize,
    /// Threads waiting for the read side.
    idle: AtomicUsize,
    /// Threads started (changed only under the read lock).
    threads: AtomicUsize,
    max_threads: usize,
    max_server_threads: usize,
    /// Payload bytes of this connection (taken before `server_budget`).
    budget: Arc<Budget>,
    server_budget: Arc<Budget>,
    /// The server's count of request threads (see `threads`).
    tracker: Arc<ThreadTracker>,
    /// Backend time of the most recent request, nanoseconds.
    last_exec_ns: AtomicU64,
}

/// One validated request, ready to run.
struct Job {
    req: Request,
    cmd: Command,
    payload: Option<AlignedBuf>,
    /// Payload bytes held until the reply is written.
    grant: Option<PayloadGrant>,
    /// The backend's hint for a WRITE, taken before its payload was read.
    hint: Option<WriteHint>,
}

enum Next {
    Run(Job),
    Answered,
    Stop,
}

/// Serves the transmission phase until the client leaves or shutdown.
pub(crate) async fn serve(
    stream: Stream,
    backend: Arc<dyn Backend>,
    neg: Negotiated,
    cfg: ConnConfig,
    mut shutdown: watch::Receiver<bool>,
) -> io::Result<()> {
    let bs = backend.block_sizes().sanitized();
    let params = ExportParams {
        size: backend.size_bytes(),
        flags: neg.flags,
        structured: neg.structured,
        base_allocation: neg.base_allocation,
        align: neg.block_sizes.then_some(bs.min),
        max_payload: bs.max,
        fast_zero: backend.fast_zero(),
    };
    let ctl = stream.try_clone()?;
    let wr = stream.try_clone()?;
    let conn = Arc::new(Conn {
        ctx: Ctx {
            bufs: cfg.bufs.clone(),
            gathers: backend.gathers_writes(),
            reads_fill: backend.read_fills_buffer(),
            splices: backend.splices_reads(),
            backend,
            params,
            bs,
        },
        rd: Mutex::new(ReadSide {
            r: BufReader::with_capacity(READ_BUF, stream),
            closed: false,
            write_end: u64::MAX,
            in_stream: false,
            announced: None,
        }),
        wr: Combining::new(wr, QUEUED_REPLY_MAX),
        ctl,
        stop: AtomicBool::new(false),
        inflight: AtomicUsize::new(0),
        idle: AtomicUsize::new(0),
        threads: AtomicUsize::new(1),
        max_threads: cfg.max_inflight.min(cfg.max_threads).max(1),
        max_server_threads: cfg.max_server_threads,
        budget: Budget::new(cfg.max_inflight_bytes),
        server_budget: cfg.server_budget,
        tracker: cfg.threads,
        last_exec_ns: AtomicU64::new(0),
    });
    // Every thread holds a sender; `recv` yields `None` once all are gone.
    let (alive, mut gone) = mpsc::channel::<()>(1);
    let _close = CloseOnDrop(conn.clone());
    // The first thread of a connection is counted whatever the server's cap.
    let token = conn.tracker.enter();
    spawn_thread(conn.clone(), alive, token)?;
    tokio::select! {
        _ = gone.recv() => {}
        _ = stopped(&mut shutdown) => {
            conn.stop.store(true, Ordering::SeqCst);
            // Wakes the thread blocked in `recv` (it sees end-of-file).
            let _ = conn.ctl.shutdown(Shutdown::Read);
            gone.recv().await;
        }
    }
    Ok(())
}

/// Closes the socket when the connection ends or its future is dropped (the
/// shutdown grace period expired): threads still in a backend call then
/// fail to write their replies and exit.
struct CloseOnDrop(Arc<Conn>);

impl Drop for CloseOnDrop {
    fn drop(&mut self) {
        self.0.stop.store(true, Ordering::SeqCst);
        let _ = self.0.ctl.shutdown(Shutdown::Both);
    }
}

/// `token`: the thread counted before it exists, so a shutdown never misses it.
fn spawn_thread(conn: Arc<Conn>, alive: mpsc::Sender<()>, token: ThreadToken) -> io::Result<()> {
    std::thread::Builder::new()
        .name("nbd-conn".into())
        .spawn(move || run_thread(conn, alive, token))
        .map(|_| ())
}

/// The body of a connection thread; the token is dropped last, after the
/// connection state (and with it any backend reference) is released.
fn run_thread(conn: Arc<Conn>, alive: mpsc::Sender<()>, token: ThreadToken) {
    conn_thread(&conn, &alive);
    drop(alive);
    drop(conn);
    drop(token);
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn conn_thread(conn: &Arc<Conn>, alive: &mpsc::Sender<()>) {
    loop {
        conn.idle.fetch_add(1, Ordering::SeqCst);
        let mut rd = lock(&conn.rd);
        conn.idle.fetch_sub(1, Ordering::SeqCst);
        // Keep the read side for as long as requests run inline: releasing
        // it would wake a waiting follower for nothing.
        loop {
            let job = match conn.next_request(&mut rd) {
                Next::Run(job) => job,
                Next::Answered => continue,
                Next::Stop => {
                    rd.closed = true;
                    return;
                }
            };
            let jobs = conn.gather(&mut rd, job);
            if conn.may_inline(&rd, &jobs) {
                conn.run_all(jobs);
                continue;
            }
            let token = (conn.idle.load(Ordering::SeqCst) == 0
                && conn.threads.load(Ordering::SeqCst) < conn.max_threads)
                .then(|| conn.tracker.try_enter(conn.max_server_threads))
                .flatten();
            if let Some(token) = token {
                conn.threads.fetch_add(1, Ordering::SeqCst);
                if let Err(e) = spawn_thread(conn.clone(), alive.clone(), token) {
                    conn.threads.fetch_sub(1, Ordering::SeqCst);
                    warn!("cannot start an NBD connection thread: {e}");
                }
            }
            conn.announce_next(&mut rd);
            drop(rd);
            conn.run_all(jobs);
            break;
        }
    }
}

impl Conn {
    /// Reads and validates the next request (the caller holds the read side).
    fn next_request(&self, rd: &mut ReadSide) -> Next {
        if rd.closed || self.stop.load(Ordering::SeqCst) {
            return Next::Stop;
        }
        if let Some((req, hint)) = rd.announced.take() {
            return self.request_body(rd, req, None, Some(hint));
        }
        let mut hdr = [0u8; REQUEST_LEN];
        if let Err(e) = rd.r.read_exact(&mut hdr) {
            if !matches!(
                e.kind(),
                io::ErrorKind::UnexpectedEof | io::ErrorKind::ConnectionReset
            ) {
                debug!("connection read failed: {e}");
            }
            return Next::Stop;
        }
        if self.stop.load(Ordering::SeqCst) {
            return Next::Stop;
        }
        let req = match codec::parse_request(&hdr) {
            Ok(r) => r,
            Err(e) => {
                debug!("closing connection: {e}");
                return Next::Stop;
            }
        };
        self.request_body(rd, req, None, None)
    }

    /// Announce the WRITE right behind the requests just read to the backend, if its header
    /// is buffered whole and it is a WRITE the backend will see (see the module doc); the next
    /// `next_request` reads its payload. Never reads the socket, never takes a request past
    /// the in-flight limit.
    fn announce_next(&self, rd: &mut ReadSide) {
        if !self.ctx.gathers
            || rd.closed
            || rd.announced.is_some()
            || self.stop.load(Ordering::SeqCst)
            || self.inflight.load(Ordering::SeqCst) + 1 >= self.max_threads
        {
            return;
        }
        // A large payload is read past the buffer: the next header is then still in the
        // socket, where a peek that never waits finds it.
        if rd.r.buffer().is_empty() && rd.r.get_ref().has_arrived(REQUEST_LEN) {
            let _ = rd.r.fill_buf();
        }
        let Some(req) =
            rd.r.buffer()
                .get(..REQUEST_LEN)
                .and_then(|h| codec::parse_request(h).ok())
        else {
            return;
        };
        if req.command != CMD_WRITE || req.length == 0 || req.length > self.ctx.params.max_payload {
            return;
        }
        rd.r.consume(REQUEST_LEN);
        let hint = self
            .ctx
            .backend
            .write_coming(req.offset, u64::from(req.length));
        rd.announced = Some((req, hint));
    }

    /// Reads the rest of the request `req` whose header was just taken off the socket (the
    /// payload of a WRITE, under `grant` if one is given, else one waited for) and validates it.
    /// `announced`: the WRITE was announced to the backend already, with this hint.
    fn request_body(
        &self,
        rd: &mut ReadSide,
        req: Request,
        grant: Option<PayloadGrant>,
        announced: Option<Option<WriteHint>>,
    ) -> Next {
        let mut payload = None;
        let mut grant = grant;
        let mut hint = None;
        if req.command == CMD_WRITE && req.length > self.ctx.params.max_payload {
            // Refused (EOVERFLOW, by `validate` below) without dropping the connection and
            // every request in flight on it: the payload is read past and thrown away.
            if let Err(e) = discard(&mut rd.r, req.length) {
                debug!("closing: oversized write payload not received: {e}");
                return Next::Stop;
            }
        } else if req.command == CMD_WRITE {
            if grant.is_none() {
                grant = Some(self.grant(req.length));
            }
            // The payload may take a while to arrive: let the backend get ready for it.
            hint = match announced {
                Some(hint) => hint,
                None => self
                    .ctx
                    .backend
                    .write_coming(req.offset, u64::from(req.length)),
            };
            let mut buf = self.ctx.bufs.for_overwrite(req.length as usize);
            if let Err(e) = rd.r.read_exact(buf.as_mut_slice()) {
                debug!("closing: write payload not received: {e}");
                return Next::Stop;
            }
            payload = Some(buf);
        }
        match validate(&req, &self.ctx.params) {
            Ok(Command::Disconnect) => Next::Stop,
            Err(rej) => {
                let head = error_reply(&self.ctx, &req, rej);
                if self.reply(&head, None) {
                    Next::Answered
                } else {
                    Next::Stop
                }
            }
            Ok(cmd) => {
                if let Command::Read { len, .. } = cmd {
                    grant = Some(self.grant(len));
                }
                self.inflight.fetch_add(1, Ordering::SeqCst);
                Next::Run(Job {
                    req,
                    cmd,
                    payload,
                    grant,
                    hint,
                })
            }
        }
    }

    /// Waits for `len` payload bytes from this connection's budget and the
    /// server's (the caller holds the read side: back-pressure).
    fn grant(&self, len: u32) -> PayloadGrant {
        PayloadGrant::acquire(&self.budget, &self.server_budget, len as usize)
    }

    /// Whether the reading thread should run `jobs` (one request, or a gathered run) itself.
    fn may_inline(&self, rd: &ReadSide, jobs: &[Job]) -> bool {
        if jobs.len() > 1 {
            // A gathered run (a sequential stream's) always keeps the read side. Its thread
            // holds several requests, so nobody may read more while it runs (the in-flight
            // limit: see the module doc); and the stream's next WRITEs, arriving meanwhile,
            // are better read as the next run than one by one by threads woken for each.
            return true;
        }
        if jobs[0].req.length > INLINE_MAX_LEN || self.stop.load(Ordering::Relaxed) {
            return false;
        }
        let fast = self.last_exec_ns.load(Ordering::Relaxed) < INLINE_MAX_NS;
        // A lone WRITE of a stream, for the same reason: handed off, every WRITE after it
        // would be read the moment it arrives by a thread of its own and never make a run.
        // Random requests still go to threads in parallel when others are pending.
        (rd.in_stream && fast)
            || (rd.r.buffer().is_empty() && self.inflight.load(Ordering::SeqCst) == 1 && fast)
    }

    fn run_all(&self, mut jobs: Vec<Job>) {
        if jobs.len() == 1 {
            self.run(jobs.pop().expect("one job"));
        } else {
            self.run_gathered(jobs);
        }
    }

    /// Runs `job` against the backend and writes its reply.
    fn run(&self, job: Job) {
        let start = Instant::now();
        let note_time = || {
            let ns = u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX);
            self.last_exec_ns.store(ns, Ordering::Relaxed);
        };
        if let Command::Read { offset, len, .. } = job.cmd {
            if self.ctx.splices
                && len as usize >= pipe::SPLICE_MIN_BYTES
                && self.read_spliced(job.req.handle, offset, len, &note_time)
            {
                self.inflight.fetch_sub(1, Ordering::SeqCst);
                drop(job.grant);
                return;
            }
        }
        let (head, data) = execute(&self.ctx, &job.req, job.cmd, job.payload, job.hint);
        note_time();
        self.reply(&head, data.as_ref().map(|d| d.as_slice()));
        self.inflight.fetch_sub(1, Ordering::SeqCst);
        // The reply buffer is gone: give its bytes back.
        drop(data);
        drop(job.grant);
    }

    /// A READ answered from this thread's pipe, which the backend filled (`pipe`); false
    /// when the backend would not (the caller reads through a buffer then).
    fn read_spliced(&self, h: u64, offset: u64, len: u32, note_time: &impl Fn()) -> bool {
        let len = len as usize;
        pipe::with_pipe(len, |p| {
            if !self.ctx.backend.read_to_pipe(offset, len, p.input()) {
                return (false, p.holds(0));
            }
            if !p.holds(len) {
                // A backend bug; sending would wait forever for bytes that never come.
                warn!("the backend's spliced read of {offset}+{len} put the wrong byte count in");
                return (false, false);
            }
            note_time();
            let head = if self.ctx.params.structured {
                // `len` <= 32 MiB: one chunk always fits.
                codec::chunk_offset_data_prefix(h, REPLY_FLAG_DONE, offset, len)
                    .map(|a| a.to_vec())
                    .unwrap_or_default()
            } else {
                codec::simple_reply(0, h).to_vec()
            };
            let sent = self
                .wr
                .send_then(&head, |w| p.send_to(w.as_fd(), len), write_all_vectored);
            // Sent or not, the reply is done with: a failed send tears the connection down.
            let ok = self.sent(sent);
            (true, ok)
        })
        .unwrap_or(false)
    }

    /// Writes one whole reply, or leaves it to the thread writing (`combine`); on failure the
    /// connection is torn down.
    fn reply(&self, head: &[u8], data: Option<&[u8]>) -> bool {
        let parts = [head, data.unwrap_or(&[])];
        self.sent(self.wr.send(&parts, write_all_vectored))
    }

    /// Whether a reply went out; a failure tears the connection down.
    fn sent(&self, r: io::Result<()>) -> bool {
        match r {
            Ok(()) => true,
            Err(e) => {
                debug!("reply not sent: {e}");
                self.stop.store(true, Ordering::SeqCst);
                let _ = self.ctl.shutdown(Shutdown::Both);
                false
            }
        }
    }
}

/// Reads and drops `len` payload bytes.
fn discard(r: &mut impl Read, len: u32) -> io::Result<()> {
    let copied = io::copy(&mut r.take(u64::from(len)), &mut io::sink())?;
    if copied < u64::from(len) {
        return Err(io::ErrorKind::UnexpectedEof.into());
    }
    Ok(())
}

fn error_reply(ctx: &Ctx, req: &Request, rej: Rejection) -> Vec<u8> {
    if ctx.params.structured {
        codec::chunk_error(req.handle, REPLY_FLAG_DONE, rej.errno, rej.msg)
    } else {
        codec::simple_reply(rej.errno, req.handle).to_vec()
    }
}

fn status_reply(ctx: &Ctx, handle: u64, r: io::Result<()>) -> Vec<u8> {
    match r {
        Ok(()) => codec::simple_reply(0, handle).to_vec(),
        Err(e) => {
            debug!("backend error: {e}");
            let errno = errno_for(&e);
            if ctx.params.structured {
                codec::chunk_error(handle, REPLY_FLAG_DONE, errno, &e.to_string())
            } else {
                codec::simple_reply(errno, handle).to_vec()
            }
        }
    }
}

/// Runs a validated command against the backend (blocking).
fn execute(
    ctx: &Ctx,
    req: &Request,
    cmd: Command,
    payload: Option<AlignedBuf>,
    hint: Option<WriteHint>,
) -> (Vec<u8>, Option<AlignedBuf>) {
    let b = &*ctx.backend;
    let h = req.handle;
    let r = match cmd {
        Command::Read { offset, len, df } => return read(ctx, h, offset, len, df),
        Command::Write { offset, fua, .. } => match (payload, hint) {
            (Some(p), Some(h)) if !p.is_empty() => b.write_hinted(h, offset, p.as_slice(), fua),
            (Some(p), None) if !p.is_empty() => b.write(offset, p.as_slice(), fua),
            _ => Ok(()),
        },
        Command::Flush => b.flush(),
        Command::Trim { offset, len, fua } => b.trim(offset, u64::from(len), fua),
        Command::WriteZeroes {
            offset,
            len,
            fua,
            may_trim,
        } => b.write_zeroes(offset, u64::from(len), fua, may_trim),
        Command::Cache { offset, len } => split(ctx, offset, len, |o, l| b.cache(o, l)),
        Command::BlockStatus {
            offset,
            len,
            req_one,
        } => match b.block_status(offset, len) {
            Ok(mut extents) => {
                let total: u64 = extents.iter().map(|&(n, _)| u64::from(n)).sum();
                if extents.is_empty()
                    || extents.iter().any(|&(n, _)| n == 0)
                    || total > u64::from(len)
                {
                    // A backend bug: the client gets an error, not a reply against the spec.
                    debug!("block status extents {extents:?} do not fit {offset}+{len}");
                    let e = io::Error::other("block status extents out of the request");
                    return (status_reply(ctx, h, Err(e)), None);
                }
                if req_one {
                    extents.truncate(1);
                }
                let c = codec::chunk_block_status(
                    h,
                    REPLY_FLAG_DONE,
                    META_BASE_ALLOCATION_ID,
                    &extents,
                );
                return (c, None);
            }
            Err(e) => Err(e),
        },
        Command::Disconnect => Ok(()),
    };
    (status_reply(ctx, h, r), None)
}

/// Calls `f` on pieces of at most `max` bytes, cut at multiples of `max`.
fn split(
    ctx: &Ctx,
    offset: u64,
    len: u32,
    mut f: impl FnMut(u64, u64) -> io::Result<()>,
) -> io::Result<()> {
    let max = u64::from(ctx.bs.max.max(1));
    let end = offset + u64::from(len);
    let mut pos = offset;
    while pos < end {
        let next = ((pos / max) + 1) * max;
        let piece_end = next.min(end);
        f(pos, piece_end - pos)?;
        pos = piece_end;
    }
    Ok(())
}

fn read(ctx: &Ctx, h: u64, offset: u64, len: u32, df: bool) -> (Vec<u8>, Option<AlignedBuf>) {
    let structured = ctx.params.structured;
    if len == 0 {
        return if structured {
            (codec::chunk_none(h).to_vec(), None)
        } else {
            (codec::simple_reply(0, h).to_vec(), None)
        };
    }
    let mut buf = if ctx.reads_fill {
        ctx.bufs.for_overwrite(len as usize)
    } else {
        ctx.bufs.zeroed(len as usize)
    };
    match ctx.backend.read(offset, buf.as_mut_slice()) {
        Ok(()) if structured => {
            // `len` <= 32 MiB, so one chunk always fits: DF is always honoured.
            let head = codec::chunk_offset_data_prefix(h, REPLY_FLAG_DONE, offset, buf.len())
                .map(|a| a.to_vec())
                .unwrap_or_default();
            (head, Some(buf))
        }
        Ok(()) => (codec::simple_reply(0, h).to_vec(), Some(buf)),
        Err(e) if structured && !df && len > ctx.bs.preferred => {
            debug!("read error at {offset}+{len}: {e}; locating it");
            (locate_read_error(ctx, h, offset, buf.as_mut_slice()), None)
        }
        Err(e) => (status_reply(ctx, h, Err(e)), None),
    }
}

/// After a failed large read: re-reads piecewise and answers with data chunks
/// for the good pieces and `ERROR_OFFSET` chunks for the bad ones.
fn locate_read_error(ctx: &Ctx, h: u64, offset: u64, buf: &mut [u8]) -> Vec<u8> {
    let len = buf.len();
    let piece = (ctx.bs.preferred as usize).max((len / 64).next_power_of_two());
    let mut out = Vec::new();
    let mut run: Option<usize> = None; // start of the current good run
    let mut pos = 0;
    let flush_run = |out: &mut Vec<u8>, buf: &[u8], start: usize, end: usize| {
        let at = offset + start as u64;
        if let Some(p) = codec::chunk_offset_data_prefix(h, 0, at, end - start) {
            out.extend_from_slice(&p);
            out.extend_from_slice(&buf[start..end]);
        }
    };
    while pos < len {
        let n = piece.min(len - pos);
        match ctx
            .backend
            .read(offset + pos as u64, &mut buf[pos..pos + n])
        {
            Ok(()) => {
                run.get_or_insert(pos);
            }
            Err(e) => {
                if let Some(s) = run.take() {
                    flush_run(&mut out, buf, s, pos);
                }
                let at = offset + pos as u64;
                out.extend(codec::chunk_error_offset(
                    h,
                    0,
                    errno_for(&e),
                    &e.to_string(),
                    at,
                ));
            }
        }
        pos += n;
    }
    if let Some(s) = run {
        flush_run(&mut out, buf, s, len);
    }
    out.extend_from_slice(&codec::chunk_none(h));
    out
}
