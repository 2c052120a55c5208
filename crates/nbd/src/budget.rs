//! Payload byte budgets with back-pressure: one budget shared by every
//! connection of a server, and one per connection.
//!
//! A request's payload buffer (the data of a WRITE, read from the socket, or
//! the reply buffer of a READ) is allocated only once the thread reading the
//! connection holds a [`PayloadGrant`] for its length: first from its
//! connection's budget, then from the server's. While a grant cannot be given
//! the thread waits, and as it is the only thread reading that connection's
//! socket, the connection stops reading (back-pressure). Nothing ever fails
//! for lack of budget.
//!
//! Invariants (asserted where they change):
//! - `in_use <= total`; `peak` is the largest `in_use` ever seen (what tests
//!   read to show the budget held);
//! - a grant is all or nothing: a waiting thread holds none of the amount it
//!   waits for;
//! - waiters are served in arrival order (a queue): a large request is not
//!   starved by a stream of small ones. A request larger than the whole budget
//!   is granted `total`, i.e. it runs once everything else has been released,
//!   alone;
//! - a grant is given back when it is dropped (after the reply is written, or
//!   when the request is abandoned).
//!
//! Why this cannot deadlock: a thread waits for one request's grant at a time
//! and holds no part of it while waiting. A thread gathering a run of
//! requests (see `transmission`) holds grants of the run's first ones: it
//! only *tries* to take the next (`try_acquire`), never waits. Every grant already given belongs to
//! a request that has been read in full (or whose payload is being read) and
//! that finishes — backend call, reply write — without asking for more budget.
//! The connection's budget is taken before the server's, so a connection at
//! its own cap waits outside the server's queue and never holds it up.
//! What a grant can wait on is the client: a reply write blocks while the
//! client does not read its replies, and a payload read while it does not send
//! the payload. Such a client pins at most its connection's cap, which is why
//! the per-connection cap is well below the server's total by default.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::Thread;

/// Payload bytes in flight across all connections of a server, by default: with the array's
/// stripe cache and buffer pool, what keeps a daemon under 256 MiB at 16 connections writing
/// 1 MiB requests 32 deep (measured: 234 MiB; 443 MiB with the former 256 MiB here). 64 MiB is
/// about 64 ms of writes at 1 GB/s: enough in flight to keep the members busy.
pub const DEFAULT_MAX_INFLIGHT_BYTES: usize = 64 << 20;

/// Payload bytes in flight on one connection, by default: half of the server's budget, so that
/// no single connection can take all of it; a 1 MiB request stream 32 deep fits. A request
/// larger than this (up to `MAX_PAYLOAD`) is granted the whole of it and runs alone.
pub const DEFAULT_MAX_INFLIGHT_BYTES_PER_CONN: usize = 32 << 20;

const _: () = assert!(DEFAULT_MAX_INFLIGHT_BYTES_PER_CONN < DEFAULT_MAX_INFLIGHT_BYTES);

/// A thread waiting for its grant. The releasing thread takes the bytes for it and then wakes
/// it alone: waking every waiter to let the one whose turn it is look (a condition variable's
/// `notify_all`) cost 16 futile wake-ups per released request with 16 connections waiting,
/// a quarter of the daemon's CPU time on 1 MiB reads.
struct Waiter {
    want: usize,
    granted: Arc<AtomicBool>,
    thread: Thread,
}

struct State {
    in_use: usize,
    peak: usize,
    /// Waiters in arrival order; only the head may be granted.
    queue: VecDeque<Waiter>,
}

impl State {
    fn take(&mut self, total: usize, want: usize) {
        self.in_use += want;
        assert!(self.in_use <= total, "budget overdrawn");
        self.peak = self.peak.max(self.in_use);
    }
}

/// A pool of payload bytes (see the module documentation).
pub(crate) struct Budget {
    total: usize,
    state: Mutex<State>,
}

fn lock(m: &Mutex<State>) -> MutexGuard<'_, State> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Budget {
    /// A budget of `total` bytes (at least one).
    pub(crate) fn new(total: usize) -> Arc<Budget> {
        Arc::new(Budget {
            total: total.max(1),
            state: Mutex::new(State {
                in_use: 0,
                peak: 0,
                queue: VecDeque::new(),
            }),
        })
    }

    fn grant(self: &Arc<Self>, bytes: usize) -> Grant {
        Grant {
            budget: self.clone(),
            bytes,
        }
    }

    /// Waits until `len` bytes (at most `total`) can be taken, in turn, and
    /// takes them.
    pub(crate) fn acquire(self: &Arc<Self>, len: usize) -> Grant {
        if len == 0 {
            return self.grant(0);
        }
        let want = len.min(self.total);
        let granted = {
            let mut s = lock(&self.state);
            if s.queue.is_empty() && self.total - s.in_use >= want {
                s.take(self.total, want);
                return self.grant(want);
            }
            let granted = Arc::new(AtomicBool::new(false));
            s.queue.push_back(Waiter {
                want,
                granted: granted.clone(),
                thread: std::thread::current(),
            });
            granted
        };
        // The bytes are ours once the flag is set; a park may also return early (a token
        // left by an earlier unpark, or spuriously).
        while !granted.load(Ordering::Acquire) {
            std::thread::park();
        }
        self.grant(want)
    }

    /// Takes `len` bytes (at least one, at most `total`) only if that needs no wait: nobody
    /// waits before us and they fit now. For a thread that already holds grants and must not
    /// wait while holding them (a gathered run of requests).
    pub(crate) fn try_acquire(self: &Arc<Self>, len: usize) -> Option<Grant> {
        assert!(len > 0, "an empty grant is never tried");
        let want = len.min(self.total);
        let mut s = lock(&self.state);
        if !s.queue.is_empty() || self.total - s.in_use < want {
            return None;
        }
        s.take(self.total, want);
        Some(self.grant(want))
    }

    fn release(&self, bytes: usize) {
        let mut woken = Vec::new();
        {
            let mut s = lock(&self.state);
            assert!(s.in_use >= bytes, "budget released twice");
            s.in_use -= bytes;
            while let Some(w) = s.queue.front() {
                if self.total - s.in_use < w.want {
                    break;
                }
                let w = s.queue.pop_front().expect("the head was just seen");
                s.take(self.total, w.want);
                w.granted.store(true, Ordering::Release);
                woken.push(w.thread);
            }
        }
        for t in woken {
            t.unpark();
        }
    }

    /// The budget's size in bytes.
    pub(crate) fn total(&self) -> usize {
        self.total
    }

    /// Bytes currently granted.
    pub(crate) fn in_use(&self) -> usize {
        lock(&self.state).in_use
    }

    /// The most bytes ever granted at once.
    pub(crate) fn peak(&self) -> usize {
        lock(&self.state).peak
    }

    /// Threads waiting for a grant.
    #[cfg(test)]
    fn waiters(&self) -> usize {
        lock(&self.state).queue.len()
    }
}

/// Bytes taken from one budget; given back on drop.
pub(crate) struct Grant {
    budget: Arc<Budget>,
    bytes: usize,
}

impl Drop for Grant {
    fn drop(&mut self) {
        if self.bytes > 0 {
            self.budget.release(self.bytes);
        }
    }
}

/// A request's payload bytes, granted by its connection and by the server.
pub(crate) struct PayloadGrant {
    _conn: Grant,
    _server: Grant,
}

impl PayloadGrant {
    /// Takes `len` bytes from the connection's budget, then from the
    /// server's (see the module documentation for why in this order).
    pub(crate) fn acquire(conn: &Arc<Budget>, server: &Arc<Budget>, len: usize) -> PayloadGrant {
        let conn = conn.acquire(len);
        let server = server.acquire(len);
        PayloadGrant {
            _conn: conn,
            _server: server,
        }
    }

    /// [`PayloadGrant::acquire`] without waiting: None when either budget would make us wait.
    pub(crate) fn try_acquire(
        conn: &Arc<Budget>,
        server: &Arc<Budget>,
        len: usize,
    ) -> Option<PayloadGrant> {
        let conn = conn.try_acquire(len)?;
        let server = server.try_acquire(len)?;
        Some(PayloadGrant {
            _conn: conn,
            _server: server,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn grants_are_returned_on_drop() {
        let b = Budget::new(100);
        let g1 = b.acquire(60);
        let g2 = b.acquire(40);
        assert_eq!(b.in_use(), 100);
        drop(g1);
        assert_eq!(b.in_use(), 40);
        drop(g2);
        assert_eq!(b.in_use(), 0);
        assert_eq!(b.peak(), 100);
        let zero = b.acquire(0);
        assert_eq!(b.in_use(), 0);
        drop(zero);
    }

    #[test]
    fn oversized_request_runs_alone() {
        let b = Budget::new(100);
        let small = b.acquire(10);
        let b2 = b.clone();
        let big = std::thread::spawn(move || {
            let g = b2.acquire(1000);
            let alone = b2.in_use();
            drop(g);
            alone
        });
        std::thread::sleep(Duration::from_millis(50));
        assert!(
            !big.is_finished(),
            "the big request waits for the small one"
        );
        drop(small);
        assert_eq!(big.join().unwrap(), 100);
        assert_eq!(b.in_use(), 0);
    }

    #[test]
    fn waiters_are_served_in_order() {
        let b = Budget::new(100);
        let first = b.acquire(50);
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut threads = Vec::new();
        // A big request queued before small ones gets its turn first, although
        // the small ones would fit beside the first grant.
        for (i, len) in [(0u64, 100usize), (1, 10), (2, 10), (3, 10)] {
            let (b2, order) = (b.clone(), order.clone());
            threads.push(std::thread::spawn(move || {
                let g = b2.acquire(len);
                order.lock().unwrap().push(i);
                std::thread::sleep(Duration::from_millis(5));
                drop(g);
            }));
            while b.waiters() <= i as usize {
                std::thread::yield_now();
            }
        }
        std::thread::sleep(Duration::from_millis(50));
        assert!(
            order.lock().unwrap().is_empty(),
            "nobody overtook the big one"
        );
        drop(first);
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(order.lock().unwrap()[0], 0);
        assert!(b.peak() <= 100);
    }

    /// The releasing thread takes the bytes for the head waiter: they are counted before the
    /// waiter has even run, and nobody else is woken to look.
    #[test]
    fn a_release_hands_the_bytes_to_the_head_waiter() {
        let b = Budget::new(100);
        let held = b.acquire(50);
        let (b2, b3) = (b.clone(), b.clone());
        let (go, hold) = std::sync::mpsc::channel::<()>();
        let head = std::thread::spawn(move || {
            let g = b2.acquire(60);
            hold.recv().unwrap();
            g.bytes
        });
        while b.waiters() < 1 {
            std::thread::yield_now();
        }
        let behind = std::thread::spawn(move || b3.acquire(60).bytes);
        while b.waiters() < 2 {
            std::thread::yield_now();
        }
        drop(held);
        assert_eq!(b.in_use(), 60, "the head's grant is taken at the release");
        assert_eq!(b.waiters(), 1, "the one behind still waits");
        go.send(()).unwrap();
        assert_eq!(head.join().unwrap(), 60);
        assert_eq!(behind.join().unwrap(), 60);
        assert_eq!(b.in_use(), 0);
    }

    #[test]
    fn many_threads_never_overdraw() {
        let b = Budget::new(1000);
        let threads: Vec<_> = (0..8)
            .map(|t| {
                let b = b.clone();
                std::thread::spawn(move || {
                    for i in 0..200 {
                        let g = b.acquire(1 + (t * 37 + i * 101) % 700);
                        std::thread::yield_now();
                        drop(g);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert!(b.peak() <= b.total());
        assert_eq!(b.in_use(), 0);
    }
}
