//! One connection in transmission phase with many requests in flight: callers send their
//! request under a send lock and sleep; one reader thread per connection reads replies, finds
//! each one's caller by handle, lays a READ's data straight into the caller's buffer and wakes
//! it.
//!
//! Death: a connection dies when a send fails, the server closes it, a reply makes no sense,
//! or requests are waiting and no byte has arrived for `timeout` (the reader checks at a
//! quarter of it). Then the socket is shut down and every request still waiting fails as a
//! transport failure, at once; the connection is never used again (what the server holds of
//! its requests is unknown: the device's replay log deals with that).
//!
//! Why a reader thread and not "whoever waits reads": a reply for another caller would then
//! have to be handed over mid-stream, and a caller leaving on its own timeout could not stop a
//! read into its buffer. Here a caller leaves only once its slot holds a result, and the reader
//! sets the result only after its last write into that buffer: the borrow the caller lent
//! outlives every use of it.

use super::transport::{RecvHalf, SendHalf, Sock, Split};
use super::wire::{Failure, Payload};
use nbd::codec::{self, Request};
use nbd::proto::*;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::{self, JoinHandle, Thread};
use std::time::{Duration, Instant};

/// Received bytes are read in pieces of this size at most; a READ's data beyond what one such
/// read brought goes straight into the caller's buffer.
const RECV_BUFFER_BYTES: usize = 64 << 10;

/// Where a READ's data goes: the caller's buffer, lent for as long as the caller waits.
struct Dest {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the pointer is written only by the reader thread, while the lending caller is
// parked waiting for the result (see the module comment); nothing else touches the memory.
unsafe impl Send for Dest {}

struct Slot {
    waiter: Thread,
    dest: Option<Dest>,
    /// The reader is writing into `dest` now: only the reader may set the result.
    filling: bool,
    /// Set once; the caller takes it and removes the slot.
    result: Option<Result<(), Failure>>,
}

struct State {
    slots: HashMap<u64, Slot>,
    next_handle: u64,
    /// Why the connection died (nothing more is sent or received on it).
    dead: Option<String>,
}

struct Shared {
    send: Mutex<Box<dyn SendHalf>>,
    state: Mutex<State>,
    closer: Sock,
    timeout: Duration,
    born: Instant,
    /// Milliseconds since `born` when bytes last arrived, or a request went out on an idle
    /// connection (time idle does not count as a stall).
    progress_ms: AtomicU64,
}

/// One request: what `NBD_CMD_*` carries besides the handle.
pub struct Req<'a> {
    pub command: u16,
    pub flags: u16,
    pub offset: u64,
    pub length: u32,
    pub payload: Payload<'a>,
}

/// A connection with its reader thread.
pub struct Pipeline {
    shared: Arc<Shared>,
    reader: Option<JoinHandle<()>>,
}

/// How often the reader wakes to check for a stall, given the request timeout.
pub fn stall_tick(timeout: Duration) -> Duration {
    (timeout / 4).clamp(Duration::from_millis(5), Duration::from_secs(1))
}

impl Pipeline {
    /// Start transmission on `split` (already negotiated, receive timeout [`stall_tick`]).
    pub fn start(split: Split, timeout: Duration, name: &str) -> io::Result<Pipeline> {
        let shared = Arc::new(Shared {
            send: Mutex::new(split.send),
            state: Mutex::new(State {
                slots: HashMap::new(),
                next_handle: 1,
                dead: None,
            }),
            closer: split.closer,
            timeout,
            born: Instant::now(),
            progress_ms: AtomicU64::new(0),
        });
        let for_reader = shared.clone();
        let recv = split.recv;
        let reader = thread::Builder::new()
            .name(format!("nbd-reply {name}"))
            .spawn(move || read_replies(for_reader, recv))?;
        Ok(Pipeline {
            shared,
            reader: Some(reader),
        })
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
        if let Some(r) = self.reader.take() {
            let _ = r.join();
        }
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
        if st.slots.is_empty() {
            self.mark_progress();
        }
        let slot = Slot {
            waiter: thread::current(),
            dest,
            filling: false,
            result: None,
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
            }
            thread::park();
        }
    }

    fn mark_progress(&self) {
        let ms = self.born.elapsed().as_millis() as u64;
        self.progress_ms.store(ms, Ordering::Relaxed);
    }

    /// Requests wait and nothing arrived for `timeout`.
    fn stalled(&self) -> bool {
        let waiting = self.state.lock().slots.values().any(|s| s.result.is_none());
        let idle_ms = (self.born.elapsed().as_millis() as u64)
            .saturating_sub(self.progress_ms.load(Ordering::Relaxed));
        waiting && Duration::from_millis(idle_ms) >= self.timeout
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
                    shared.mark_progress();
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
                    if shared.stalled() {
                        return Err(format!("no answer for {:?}", shared.timeout));
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

/// Fails every waiting request when the reader ends, even by a panic.
struct DieOnExit(Arc<Shared>, String);

impl Drop for DieOnExit {
    fn drop(&mut self) {
        self.0.die(std::mem::take(&mut self.1));
    }
}

fn read_replies(shared: Arc<Shared>, half: Box<dyn RecvHalf>) {
    let mut guard = DieOnExit(shared.clone(), "reader ended".into());
    let mut rx = Receiver {
        half,
        buf: vec![0u8; RECV_BUFFER_BYTES],
        start: 0,
        end: 0,
    };
    loop {
        if let Err(why) = read_one_reply(&shared, &mut rx) {
            guard.1 = why;
            return;
        }
    }
}

fn read_one_reply(shared: &Shared, rx: &mut Receiver) -> Result<(), String> {
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
            return Ok(());
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
    Ok(())
}
