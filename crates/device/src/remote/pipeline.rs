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
}

// SAFETY: the pointer is written only by the caller holding the reading role, while the
// lending caller waits for its result (see the module comment); nothing else touches it.
unsafe impl Send for Dest {}

struct Slot {
    waiter: Thread,
    dest: Option<Dest>,
    /// The reader is writing into `dest` now: only the reader may set the result.
    filling: bool,
    /// Set once; the caller takes it and removes the slot.
    result: Option<Result<(), Failure>>,
    /// Milliseconds after the connection's birth when the request was registered.
    sent_ms: u64,
}

struct State {
    slots: HashMap<u64, Slot>,
    next_handle: u64,
    /// Why the connection died (nothing more is sent or received on it).
    dead: Option<String>,
    /// A caller holds the reading role (it alone locks `Shared::recv`).
    reading: bool,
}

struct Shared {
    send: Mutex<Box<dyn SendHalf>>,
    recv: Mutex<Receiver>,
    state: Mutex<State>,
    closer: Sock,
    timeout: Duration,
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
    pub fn start(split: Split, timeout: Duration) -> Pipeline {
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
                Ok(done) if done == handle => return,
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

/// One reply read and handed to its caller; returns its handle.
fn read_one_reply(shared: &Shared, rx: &mut Receiver) -> Result<u64, String> {
    let mut header = [0u8; SIMPLE_REPLY_LEN];
    rx.fill(shared, &mut header)?;
    let reply = codec::parse_simple_reply(&header).map_err(|e| format!("reply: {e}"))?;
    let dest = {
        let mut st = shared.state.lock();
        let slot = st
            .slots
            .get_mut(&reply.handle)
            .filter(|s| s.result.is_none())
            .ok_or_else(|| format!("reply for handle {} nobody waits for", reply.handle))?;
        if reply.error != 0 {
            slot.result = Some(Err(Failure::Server(reply.error)));
            slot.waiter.unpark();
            return Ok(reply.handle);
        }
        slot.filling = slot.dest.is_some();
        slot.dest.take()
    };
    if let Some(dest) = dest {
        // SAFETY: `dest` is the buffer of a READ whose caller stays in `wait` until its slot
        // holds a result. The slot is marked `filling`, so no one but this thread sets that
        // result (`die` skips it), and this thread sets it only after the fill: the memory is
        // lent to us alone for the whole of this borrow.
        let buf = unsafe { std::slice::from_raw_parts_mut(dest.ptr, dest.len) };
        if let Err(why) = rx.fill(shared, buf) {
            shared.complete(reply.handle, Err(transport(&why)));
            return Err(why);
        }
    }
    shared.complete(reply.handle, Ok(()));
    Ok(reply.handle)
}
