//! Transmission phase: one reader loop that validates requests and dispatches
//! them concurrently to the blocking pool, one writer task that sends replies
//! in completion order.
//!
//! Invariants:
//! - at most `max_inflight_per_conn` requests (and `max_inflight_bytes_per_conn`
//!   payload bytes) are between "header read" and "reply written"; when the
//!   limit is reached the reader stops reading the socket (back-pressure);
//! - a reply is queued only after the backend call returned, so a later FLUSH
//!   always covers every write whose reply was already sent;
//! - on DISC, shutdown, a protocol violation or EOF the reader stops, every
//!   dispatched request still completes and its reply is written, then the
//!   connection is closed.

use std::io;
use std::sync::Arc;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufWriter};
use tokio::sync::{mpsc, watch, OwnedSemaphorePermit, Semaphore};
use tracing::debug;

use crate::backend::{errno_for, Backend, BlockSizes};
use crate::buf::AlignedBuf;
use crate::codec::{self, Request};
use crate::command::{validate, Command, ExportParams, Rejection};
use crate::proto::*;

/// One queued reply: header bytes, optional payload, and the permits that
/// are released once it has been written.
pub(crate) struct Reply {
    head: Vec<u8>,
    data: Option<AlignedBuf>,
    _slot: OwnedSemaphorePermit,
    _bytes: Option<OwnedSemaphorePermit>,
}

/// Per-connection state shared with the request tasks.
struct Ctx {
    backend: Arc<dyn Backend>,
    params: ExportParams,
    bs: BlockSizes,
}

/// Connection-wide settings.
pub(crate) struct ConnConfig {
    pub max_inflight: usize,
    pub max_inflight_bytes: usize,
}

enum Flow {
    Continue,
    Stop,
}

/// Serves the transmission phase until the client leaves or shutdown.
pub(crate) async fn serve<S>(
    stream: S,
    backend: Arc<dyn Backend>,
    neg: crate::handshake::Negotiated,
    cfg: ConnConfig,
    mut shutdown: watch::Receiver<bool>,
) -> io::Result<()>
where
    S: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
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
    let ctx = Arc::new(Ctx {
        backend,
        params,
        bs,
    });
    let (rd, wr) = tokio::io::split(stream);
    let (tx, rx) = mpsc::unbounded_channel();
    let mut writer = AbortOnDrop(tokio::spawn(writer_loop(wr, rx)));
    let res = reader_loop(rd, &ctx, &cfg, tx, &mut shutdown).await;
    let wres = (&mut writer.0)
        .await
        .unwrap_or_else(|e| Err(io::Error::other(e)));
    res.and(wres)
}

/// Aborts the writer if the connection future is dropped (shutdown grace
/// period expired).
struct AbortOnDrop(tokio::task::JoinHandle<io::Result<()>>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

async fn writer_loop<W: AsyncWrite + Unpin>(
    wr: W,
    mut rx: mpsc::UnboundedReceiver<Reply>,
) -> io::Result<()> {
    let mut w = BufWriter::with_capacity(256 * 1024, wr);
    while let Some(r) = rx.recv().await {
        write_reply(&mut w, r).await?;
        while let Ok(r) = rx.try_recv() {
            write_reply(&mut w, r).await?;
        }
        w.flush().await?;
    }
    w.shutdown().await
}

async fn write_reply<W: AsyncWrite + Unpin>(w: &mut W, r: Reply) -> io::Result<()> {
    w.write_all(&r.head).await?;
    if let Some(d) = &r.data {
        w.write_all(d.as_slice()).await?;
    }
    Ok(())
}

async fn reader_loop<R: AsyncRead + Unpin>(
    mut rd: R,
    ctx: &Arc<Ctx>,
    cfg: &ConnConfig,
    tx: mpsc::UnboundedSender<Reply>,
    shutdown: &mut watch::Receiver<bool>,
) -> io::Result<()> {
    let slots = Arc::new(Semaphore::new(cfg.max_inflight.max(1)));
    let total = cfg.max_inflight_bytes.clamp(1, Semaphore::MAX_PERMITS);
    let bytes = Budget {
        sem: Arc::new(Semaphore::new(total)),
        total,
    };
    loop {
        let slot = tokio::select! {
            p = slots.clone().acquire_owned() => p.map_err(io::Error::other)?,
            _ = crate::server::stopped(shutdown) => return Ok(()),
            _ = tx.closed() => return Ok(()),
        };
        let mut hdr = [0u8; REQUEST_LEN];
        let read = tokio::select! {
            r = rd.read_exact(&mut hdr) => r,
            _ = crate::server::stopped(shutdown) => return Ok(()),
            _ = tx.closed() => return Ok(()),
        };
        if let Err(e) = read {
            return eof_is_ok(e);
        }
        let req = match codec::parse_request(&hdr) {
            Ok(r) => r,
            Err(e) => {
                debug!("closing connection: {e}");
                return Ok(());
            }
        };
        let pending = Pending {
            req,
            slot,
            bytes: &bytes,
            shutdown,
        };
        match handle(&mut rd, ctx, pending, &tx).await? {
            Flow::Continue => {}
            Flow::Stop => return Ok(()),
        }
    }
}

fn eof_is_ok(e: io::Error) -> io::Result<()> {
    match e.kind() {
        io::ErrorKind::UnexpectedEof | io::ErrorKind::ConnectionReset => Ok(()),
        _ => Err(e),
    }
}

struct Pending<'a> {
    req: Request,
    slot: OwnedSemaphorePermit,
    bytes: &'a Budget,
    shutdown: &'a mut watch::Receiver<bool>,
}

/// Per-connection payload byte budget.
struct Budget {
    sem: Arc<Semaphore>,
    total: usize,
}

impl Budget {
    /// Waits for `len` bytes of budget (a request larger than the whole
    /// budget waits for all of it).
    async fn acquire(&self, len: u32) -> io::Result<Option<OwnedSemaphorePermit>> {
        if len == 0 {
            return Ok(None);
        }
        let want = u32::try_from((len as usize).min(self.total)).unwrap_or(u32::MAX);
        self.sem
            .clone()
            .acquire_many_owned(want)
            .await
            .map(Some)
            .map_err(io::Error::other)
    }
}

/// Reads the payload (for WRITE), validates, and dispatches one request.
async fn handle<R: AsyncRead + Unpin>(
    rd: &mut R,
    ctx: &Arc<Ctx>,
    p: Pending<'_>,
    tx: &mpsc::UnboundedSender<Reply>,
) -> io::Result<Flow> {
    let req = p.req;
    let mut payload = None;
    let mut bytes = None;
    if req.command == CMD_WRITE {
        if req.length > ctx.params.max_payload {
            debug!("closing: write of {} bytes exceeds maximum", req.length);
            return Ok(Flow::Stop);
        }
        bytes = p.bytes.acquire(req.length).await?;
        let mut buf = AlignedBuf::new(req.length as usize);
        let read = tokio::select! {
            r = rd.read_exact(buf.as_mut_slice()) => r.map(|_| ()),
            _ = crate::server::stopped(p.shutdown) => Err(io::ErrorKind::Interrupted.into()),
        };
        if let Err(e) = read {
            debug!("closing: write payload not received: {e}");
            return Ok(Flow::Stop);
        }
        payload = Some(buf);
    }
    let cmd = match validate(&req, &ctx.params) {
        Ok(Command::Disconnect) => return Ok(Flow::Stop),
        Ok(c) => c,
        Err(rej) => {
            let head = error_reply(ctx, &req, rej);
            send(tx, head, None, p.slot, bytes);
            return Ok(Flow::Continue);
        }
    };
    if let Command::Read { len, .. } = cmd {
        bytes = p.bytes.acquire(len).await?;
    }
    let ctx = ctx.clone();
    let tx = tx.clone();
    let slot = p.slot;
    tokio::task::spawn_blocking(move || {
        let (head, data) = execute(&ctx, &req, cmd, payload);
        send(&tx, head, data, slot, bytes);
    });
    Ok(Flow::Continue)
}

fn send(
    tx: &mpsc::UnboundedSender<Reply>,
    head: Vec<u8>,
    data: Option<AlignedBuf>,
    slot: OwnedSemaphorePermit,
    bytes: Option<OwnedSemaphorePermit>,
) {
    // If the writer is gone the connection is closing; dropping the reply
    // releases its permits.
    let _ = tx.send(Reply {
        head,
        data,
        _slot: slot,
        _bytes: bytes,
    });
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
) -> (Vec<u8>, Option<AlignedBuf>) {
    let b = &*ctx.backend;
    let h = req.handle;
    let r = match cmd {
        Command::Read { offset, len, df } => return read(ctx, h, offset, len, df),
        Command::Write { offset, fua, .. } => match payload {
            Some(p) if !p.is_empty() => b.write(offset, p.as_slice(), fua),
            _ => Ok(()),
        },
        Command::Flush => b.flush(),
        Command::Trim { offset, len, fua } => split(ctx, offset, len, |o, l| b.trim(o, l, fua)),
        Command::WriteZeroes {
            offset,
            len,
            fua,
            may_trim,
        } => split(ctx, offset, len, |o, l| b.write_zeroes(o, l, fua, may_trim)),
        Command::Cache { offset, len } => split(ctx, offset, len, |o, l| b.cache(o, l)),
        Command::BlockStatus {
            offset: _,
            len,
            req_one: _,
        } => {
            // Everything is allocated data: one extent covers the request.
            let c =
                codec::chunk_block_status(h, REPLY_FLAG_DONE, META_BASE_ALLOCATION_ID, &[(len, 0)]);
            return (c, None);
        }
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
    let mut buf = AlignedBuf::new(len as usize);
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
