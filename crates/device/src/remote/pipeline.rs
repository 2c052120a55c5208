//! One connection in transmission phase with many requests in flight: callers send their
//! request under a send lock and wait for its reply. Replies are read by whichever waiting
//! caller holds the *reading* role: it reads replies, finds each one's caller by handle, lays
//! a READ's data straight into that caller's buffer and wakes it, until its own reply has
//! come; then it passes the role to another waiting caller.
//!
//! Why no reader thread: a hand-off to a reader thread and back costs two context switches
//! per request, which on a small machine cost more than the request itself (measured with
//! perf: most of the daemon's time went to switching). With the role, a caller whose reply
//! comes first reads it itself.
//!
//! Death: a connection dies when a send fails, the server closes it, a reply makes no sense,
//! or a request has waited `timeout` for its reply (the kernel NBD client's per-request timeout;
//! the reader checks at a quarter of it, also while the server keeps answering other requests,
//! so one the server never answers is not hidden by the rest). Then the socket is shut down
//! and every request still waiting fails as a transport failure, at once; the connection is
//! never used again (what the server holds of its requests is unknown: the device's replay log
//! deals with that). A server that closes an idle connection is noticed by the next request.
//!
//! A caller leaves only once its slot holds a result, and while the reader (the caller
//! holding the role) writes into a
//! caller's buffer the slot is marked `filling`, so that no one else sets that result before
//! the write ends: the borrow the caller lent outlives every use of it.

use super::transport::{RecvHalf, SendHalf, Sock, Split};
use super::wire::{Failure, Payload};
use nbd::codec::{self, Request};
use nbd::proto::*;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread::{self, Thread};
use std::time::{Duration, Instant};

/// Received bytes are read in pieces of this size at most; a READ's data beyond what one such
/// read brought goes straight into the caller's buffer. Small: what a reply header's read
/// brings of the data is copied once more (a few 4K replies still come in one read).
const RECV_BUFFER_BYTES: usize = 16 << 10;

/// Where a READ's data goes: the caller's buffer, lent for as long as the caller waits.
struct Dest {
    ptr: *mut u8,
    len: usize,
    /// The export byte its first byte reads (structured chunks say where their data goes).
    offset: u64,
}

// SAFETY: the pointer is written only by the caller holding the reading role, while the
// lending caller waits for its result (see the module comment); nothing else touches it.
unsafe impl Send for Dest {}

struct Slot {
    waiter: Thread,
    dest: Option<Dest>,
    /// The reader is writing into `dest` now: only the reader may set the result.
    filling: bool,
    /// What of `dest` structured chunks have filled so far.
    covered: Covered,
    /// An error chunk came (structured replies): the result once the last chunk has.
    error: Option<Failure>,
    /// Set once; the caller takes it and removes the slot.
    result: Option<Result<(), Failure>>,
    /// Milliseconds after the connection's birth when the request was registered.
    sent_ms: u64,
}

/// Ranges of a READ's buffer (from its start) that chunks filled; the first kept inline, as
/// most reads come in one chunk and this is on every reply's path.
#[derive(Default)]
struct Covered {
    first: Option<(u64, u64)>,
    rest: Vec<(u64, u64)>,
}

impl Covered {
    /// Add `start..end`; false if it overlaps a range added before.
    fn add(&mut self, start: u64, end: u64) -> bool {
        if self
            .first
            .iter()
            .chain(&self.rest)
            .any(|&(a, b)| start < b && a < end)
        {
            return false;
        }
        match self.first {
            None => self.first = Some((start, end)),
            Some(_) => self.rest.push((start, end)),
        }
        true
    }

    fn bytes(&self) -> u64 {
        self.first
            .iter()
            .chain(&self.rest)
            .map(|(a, b)| b - a)
            .sum()
    }
}

impl Slot {
    /// The result of a structured reply whose last chunk came: an error chunk's, or the READ
    /// whole (its chunks do not overlap, so their sum is what they cover). Err: the server
    /// broke the protocol.
    fn finish(&mut self) -> Result<Result<(), Failure>, String> {
        if let Some(e) = self.error.take() {
            return Ok(Err(e));
        }
        let want = self.dest.as_ref().map_or(0, |d| d.len as u64);
        let covered = self.covered.bytes();
        if covered != want {
            return Err(format!(
                "a read's chunks covered {covered} of its {want} bytes"
            ));
        }
        Ok(Ok(()))
    }
}

struct State {
    slots: HashMap<u64, Slot>,
    next_handle: u64,
    /// Why the connection died (nothing more is sent or received on it).
    dead: Option<String>,
    /// A caller holds the reading role (it alone locks `Shared::recv`).
    reading: bool,
}

impl State {
    /// The slot of `handle` while its caller waits for a result (a chunk for anything else
    /// breaks the protocol).
    fn waiting(&mut self, handle: u64) -> Result<&mut Slot, String> {
        self.slots
            .get_mut(&handle)
            .filter(|s| s.result.is_none())
            .ok_or_else(|| format!("reply for handle {handle} nobody waits for"))
    }
}

struct Shared {
    send: Mutex<Box<dyn SendHalf>>,
    recv: Mutex<Receiver>,
    state: Mutex<State>,
    closer: Sock,
    timeout: Duration,
    /// Replies may come as structured chunks.
    structured: bool,
    born: Instant,
    /// Milliseconds after `born` when the reader last looked for an overdue request.
    checked_ms: AtomicU64,
}

/// One request: what `NBD_CMD_*` carries besides the handle.
pub struct Req<'a> {
    pub command: u16,
    pub flags: u16,
    pub offset: u64,
    pub length: u32,
    pub payload: Payload<'a>,
}

/// A connection.
pub struct Pipeline {
    shared: Shared,
}

/// How often the reader wakes to check for a stall, given the request timeout.
pub fn stall_tick(timeout: Duration) -> Duration {
    (timeout / 4).clamp(Duration::from_millis(5), Duration::from_secs(1))
}

impl Pipeline {
    /// Start transmission on `split` (already negotiated, receive timeout [`stall_tick`]).
    pub fn start(split: Split, timeout: Duration, structured: bool) -> Pipeline {
        Pipeline {
            shared: Shared {
                send: Mutex::new(split.send),
                recv: Mutex::new(Receiver {
                    half: split.recv,
                    buf: vec![0u8; RECV_BUFFER_BYTES],
                    start: 0,
                    end: 0,
                }),
                state: Mutex::new(State {
                    slots: HashMap::new(),
                    next_handle: 1,
                    dead: None,
                    reading: false,
                }),
                closer: split.closer,
                timeout,
                structured,
                born: Instant::now(),
                checked_ms: AtomicU64::new(0),
            },
        }
    }

    /// Requests sent and not yet collected by their callers.
    pub fn in_flight(&self) -> usize {
        self.shared.state.lock().slots.len()
    }

    pub fn is_dead(&self) -> bool {
        self.shared.state.lock().dead.is_some()
    }

    /// Send one request and wait for its reply (requests of other threads go out meanwhile).
    pub fn request(&self, req: Req<'_>) -> Result<(), Failure> {
        self.requests(vec![req]).remove(0)
    }

    /// Send every request of `reqs` back to back, then wait for all their replies; one result
    /// per request, in order. The server may execute them in any order.
    pub fn requests(&self, reqs: Vec<Req<'_>>) -> Vec<Result<(), Failure>> {
        let mut handles = Vec::with_capacity(reqs.len());
        for req in reqs {
            handles.push(self.submit(req));
        }
        // Every registered request is waited for before the buffers lent to it are given back.
        handles
            .into_iter()
            .map(|h| h.and_then(|h| self.shared.wait(h)))
            .collect()
    }

    fn submit(&self, req: Req<'_>) -> Result<u64, Failure> {
        let (dest, data): (Option<Dest>, &[u8]) = match req.payload {
            Payload::None => (None, &[]),
            Payload::Write(d) => {
                assert_eq!(
                    d.len(),
                    req.length as usize,
                    "write payload is the request length"
                );
                (None, d)
            }
            Payload::Read(b) => {
                assert_eq!(
                    b.len(),
                    req.length as usize,
                    "read buffer is the request length"
                );
                let dest = Dest {
                    ptr: b.as_mut_ptr(),
                    len: b.len(),
                    offset: req.offset,
                };
                (Some(dest), &[])
            }
        };
        let handle = self.shared.register(dest)?;
        let header = codec::encode_request(&Request {
            flags: req.flags,
            command: req.command,
            handle,
            offset: req.offset,
            length: req.length,
        });
        let sent = self.shared.send.lock().send(&[&header, data]);
        if let Err(e) = sent {
            // Our slot fails with the rest; `wait` collects that.
            self.shared.die(format!("send: {e}"));
        }
        Ok(handle)
    }

    /// Say goodbye (`NBD_CMD_DISC`), best effort, so the server closes its side cleanly.
    pub fn disconnect(&self) {
        if self.is_dead() {
            return;
        }
        let header = codec::encode_request(&Request {
            flags: 0,
            command: CMD_DISC,
            handle: 0,
            offset: 0,
            length: 0,
        });
        let _ = self.shared.send.lock().send(&[&header]);
    }
}

impl Drop for Pipeline {
    fn drop(&mut self) {
        self.shared.die("closed".into());
    }
}

fn transport(why: &str) -> Failure {
    Failure::Transport(io::Error::new(
        io::ErrorKind::ConnectionAborted,
        why.to_string(),
    ))
}

impl Shared {
    fn register(&self, dest: Option<Dest>) -> Result<u64, Failure> {
        let mut st = self.state.lock();
        if let Some(why) = &st.dead {
            return Err(transport(why));
        }
        let handle = st.next_handle;
        st.next_handle += 1;
        let slot = Slot {
            waiter: thread::current(),
            dest,
            filling: false,
            covered: Covered::default(),
            error: None,
            result: None,
            sent_ms: self.now_ms(),
        };
        st.slots.insert(handle, slot);
        Ok(handle)
    }

    fn wait(&self, handle: u64) -> Result<(), Failure> {
        loop {
            {
                let mut st = self.state.lock();
                let slot = st.slots.get_mut(&handle).expect("a waiter's slot stays");
                if let Some(result) = slot.result.take() {
                    st.slots.remove(&handle);
                    return result;
                }
                if !st.reading && st.dead.is_none() {
                    st.reading = true;
                    drop(st);
                    self.read_until(handle);
                    continue;
                }
            }
            thread::park();
        }
    }

    /// With the reading role: read replies until `handle`'s has come or the connection died,
    /// then pass the role on.
    fn read_until(&self, handle: u64) {
        let _role = Role(self);
        let mut rx = self.recv.lock();
        loop {
            match read_one_reply(self, &mut rx) {
                Ok(Some(done)) if done == handle => return,
                Ok(_) if self.overdue_now() => {
                    self.die(self.overdue_why());
                    return;
                }
                Ok(_) => {}
                Err(why) => {
                    self.die(why);
                    return;
                }
            }
        }
    }

    fn now_ms(&self) -> u64 {
        self.born.elapsed().as_millis() as u64
    }

    /// A request has waited `timeout` for its reply.
    fn overdue(&self) -> bool {
        let now = self.now_ms();
        self.checked_ms.store(now, Ordering::Relaxed);
        let limit = self.timeout.as_millis() as u64;
        self.state
            .lock()
            .slots
            .values()
            .any(|s| s.result.is_none() && now.saturating_sub(s.sent_ms) >= limit)
    }

    /// [`Shared::overdue`], asked at most once a stall tick: the reader asks after every
    /// reply, and replies may come by the hundred thousand a second.
    fn overdue_now(&self) -> bool {
        let tick = stall_tick(self.timeout).as_millis() as u64;
        self.now_ms() >= self.checked_ms.load(Ordering::Relaxed) + tick && self.overdue()
    }

    fn overdue_why(&self) -> String {
        format!("no answer for {:?}", self.timeout)
    }

    /// The connection is unusable: shut it down and fail every request without a result.
    fn die(&self, why: String) {
        let mut st = self.state.lock();
        if st.dead.is_none() {
            st.dead = Some(why);
            self.closer.shutdown();
        }
        let why = st.dead.clone().expect("set above");
        for slot in st.slots.values_mut() {
            if slot.result.is_none() && !slot.filling {
                slot.result = Some(Err(transport(&why)));
                slot.waiter.unpark();
            }
        }
    }

    /// Write `len` bytes at export byte `at` of `handle`'s READ buffer with `fill`, the slot
    /// marked `filling` meanwhile (see the module comment). The bytes must lie inside the
    /// request and overlap no earlier chunk's. With `done` (the reply's last chunk) the
    /// request is completed here, under the same lock; returns whether it was.
    fn fill_chunk(
        &self,
        handle: u64,
        at: u64,
        len: u64,
        done: bool,
        fill: impl FnOnce(&mut [u8]) -> Result<(), String>,
    ) -> Result<bool, String> {
        let (ptr, start) = {
            let mut st = self.state.lock();
            let slot = st.waiting(handle)?;
            let dest = slot
                .dest
                .as_ref()
                .ok_or_else(|| format!("a data chunk for handle {handle}, not a read"))?;
            let start = at
                .checked_sub(dest.offset)
                .filter(|s| s + len <= dest.len as u64)
                .ok_or_else(|| {
                    format!(
                        "a chunk at {at}+{len} outside its read at {}+{}",
                        dest.offset, dest.len
                    )
                })?;
            if !slot.covered.add(start, start + len) {
                return Err(format!("chunks overlap at {at}+{len}"));
            }
            slot.filling = true;
            (dest.ptr, start as usize)
        };
        // SAFETY: `dest` is the buffer of a READ whose caller stays in `wait` until its slot
        // holds a result. The slot is marked `filling`, so no one but this thread sets that
        // result (`die` skips it), and this thread sets it only after the fill; the range lies
        // inside the buffer: the memory is lent to us alone for the whole of this borrow.
        let buf = unsafe { std::slice::from_raw_parts_mut(ptr.add(start), len as usize) };
        let filled = fill(buf);
        let mut st = self.state.lock();
        let dead = st.dead.clone();
        let slot = st.slots.get_mut(&handle).expect("a filling slot stays");
        slot.filling = false;
        // `die` passed over this slot while it was filling: its result is ours to set (a reply
        // whose last chunk came whole is complete, dead connection or not).
        let result = match &filled {
            Err(why) => Err(transport(why)),
            Ok(()) if done => slot.finish()?,
            Ok(()) => match dead {
                Some(why) => Err(transport(&why)),
                None => return Ok(false),
            },
        };
        slot.result = Some(result);
        slot.waiter.unpark();
        filled.map(|()| done)
    }

    /// The reply for `handle` is complete.
    fn complete(&self, handle: u64, result: Result<(), Failure>) {
        let mut st = self.state.lock();
        let slot = st.slots.get_mut(&handle).expect("a waiter's slot stays");
        slot.result = Some(result);
        slot.waiter.unpark();
    }
}

/// Buffered receiving that survives the socket's receive timeouts.
struct Receiver {
    half: Box<dyn RecvHalf>,
    buf: Vec<u8>,
    start: usize,
    end: usize,
}

impl Receiver {
    /// Fill `dst` whole: from what is buffered, then from the socket (straight into `dst` for
    /// big pieces). Fails when the server closes, or when requests wait with no progress.
    fn fill(&mut self, shared: &Shared, dst: &mut [u8]) -> Result<(), String> {
        let mut got = (self.end - self.start).min(dst.len());
        dst[..got].copy_from_slice(&self.buf[self.start..self.start + got]);
        self.start += got;
        while got < dst.len() {
            let direct = dst.len() - got >= self.buf.len() / 2;
            let r = if direct {
                self.half.recv(&mut dst[got..])
            } else {
                self.half.recv(&mut self.buf)
            };
            match r {
                Ok(0) => return Err("the server closed the connection".into()),
                Ok(n) => {
                    if direct {
                        got += n;
                    } else {
                        let take = n.min(dst.len() - got);
                        dst[got..got + take].copy_from_slice(&self.buf[..take]);
                        got += take;
                        (self.start, self.end) = (take, n);
                    }
                }
                Err(e) if is_tick(&e) => {
                    if shared.overdue() {
                        return Err(shared.overdue_why());
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(format!("receive: {e}")),
            }
        }
        Ok(())
    }
}

fn is_tick(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
    )
}

/// The reading role, given back (to a caller still waiting) however its holder leaves.
struct Role<'a>(&'a Shared);

impl Drop for Role<'_> {
    fn drop(&mut self) {
        if thread::panicking() {
            self.0.die("the reading caller panicked".into());
        }
        let mut st = self.0.state.lock();
        st.reading = false;
        if let Some(next) = st.slots.values().find(|s| s.result.is_none()) {
            next.waiter.unpark();
        }
    }
}

/// One reply (or one chunk of a structured reply) read and handed to its caller; returns the
/// handle of a request whose reply is complete.
fn read_one_reply(shared: &Shared, rx: &mut Receiver) -> Result<Option<u64>, String> {
    let mut header = [0u8; STRUCTURED_HEADER_LEN];
    rx.fill(shared, &mut header[..4])?;
    let magic = u32::from_be_bytes(header[..4].try_into().expect("4 bytes"));
    if magic == STRUCTURED_REPLY_MAGIC && shared.structured {
        rx.fill(shared, &mut header[4..])?;
        let chunk = codec::parse_chunk_header(&header).map_err(|e| format!("reply: {e}"))?;
        return read_chunk(shared, rx, &chunk);
    }
    rx.fill(shared, &mut header[4..SIMPLE_REPLY_LEN])?;
    let reply = codec::parse_simple_reply(&header[..SIMPLE_REPLY_LEN])
        .map_err(|e| format!("reply: {e}"))?;
    let handle = reply.handle;
    let whole = {
        let mut st = shared.state.lock();
        let slot = st.waiting(handle)?;
        if reply.error != 0 {
            slot.result = Some(Err(Failure::Server(reply.error)));
            slot.waiter.unpark();
            return Ok(Some(handle));
        }
        slot.dest.as_ref().map(|d| (d.offset, d.len as u64))
    };
    match whole {
        // A READ's data follows: the whole buffer, as one last chunk would bring it.
        Some((at, len)) => {
            shared.fill_chunk(handle, at, len, true, |buf| rx.fill(shared, buf))?;
        }
        None => shared.complete(handle, Ok(())),
    }
    Ok(Some(handle))
}

/// Longest error chunk taken (its message is for people; NBD caps strings at 4 KiB).
const MAX_ERROR_CHUNK: u32 = 8 << 10;

/// One chunk of a structured reply. Data and holes go into the READ's buffer where their
/// offset says (each must lie inside the request; together they must cover it exactly once,
/// which is checked by count at the last chunk); an error chunk is kept as the result. The
/// request completes with the chunk flagged DONE.
fn read_chunk(
    shared: &Shared,
    rx: &mut Receiver,
    chunk: &codec::ChunkHeader,
) -> Result<Option<u64>, String> {
    let handle = chunk.handle;
    let done = chunk.flags & REPLY_FLAG_DONE != 0;
    match chunk.chunk_type {
        REPLY_TYPE_NONE if chunk.length == 0 && done => {}
        REPLY_TYPE_OFFSET_DATA if chunk.length >= 8 => {
            let mut at = [0u8; 8];
            rx.fill(shared, &mut at)?;
            let len = u64::from(chunk.length - 8);
            let at = u64::from_be_bytes(at);
            let finished = shared.fill_chunk(handle, at, len, done, |buf| rx.fill(shared, buf))?;
            return Ok(finished.then_some(handle));
        }
        REPLY_TYPE_OFFSET_HOLE if chunk.length == 12 => {
            let mut hole = [0u8; 12];
            rx.fill(shared, &mut hole)?;
            let at = u64::from_be_bytes(hole[..8].try_into().expect("8 bytes"));
            let len = u32::from_be_bytes(hole[8..].try_into().expect("4 bytes"));
            let finished = shared.fill_chunk(handle, at, u64::from(len), done, |buf| {
                buf.fill(0);
                Ok(())
            })?;
            return Ok(finished.then_some(handle));
        }
        t if t & (1 << 15) != 0 && (6..=MAX_ERROR_CHUNK).contains(&chunk.length) => {
            let mut body = vec![0u8; chunk.length as usize];
            rx.fill(shared, &mut body)?;
            let errno = u32::from_be_bytes(body[..4].try_into().expect("4 bytes"));
            let mut st = shared.state.lock();
            let slot = st.waiting(handle)?;
            // An error without a code is still an error (the protocol forbids zero).
            slot.error = Some(Failure::Server(if errno == 0 { EIO } else { errno }));
        }
        t => return Err(format!("reply chunk of type {t} ({} bytes)", chunk.length)),
    }
    if !done {
        return Ok(None);
    }
    let result = {
        let mut st = shared.state.lock();
        st.waiting(handle)?.finish()?
    };
    shared.complete(handle, result);
    Ok(Some(handle))
}
