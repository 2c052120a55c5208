//! The member-I/O threads: a fixed set of threads that sleep until a request hands them work,
//! and a caller that works too.
//!
//! Why not rayon: its idle workers spin (`sched_yield` in a loop) before they sleep, which on a
//! small machine takes the CPU from the threads doing the work (profiled: 14 % of the daemon's
//! time in `sched_yield` serving a RAID0 of remote members, 33 % with 16 threads), and a caller
//! outside the pool only waits for the jobs it spawned. Here a worker blocks on a condition
//! variable when the queue is empty, and the caller of [`IoPool::run`] claims operations of its
//! own batch until none is left, so an operation no worker has picked up yet costs no hand-off.
//!
//! A batch is `n` calls `f(0)…f(n-1)`. Its state (`Batch`: the next index to claim, the calls
//! not yet finished, the caller to wake) is shared by reference count; `f` itself lives on the
//! caller's stack and is reached through a pointer. Invariants:
//! * an index is claimed exactly once (`next.fetch_add`), and `f` is only called for a
//!   claimed index below `n`;
//! * `run` returns only once `remaining` is 0, i.e. after every call of `f` returned;
//! * so `f` is never called after `run` returned: a worker that takes a batch late claims an
//!   index ≥ `n` and never touches `f` (the pointer may dangle by then; it is not used).

use parking_lot::{Condvar, Mutex};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::{self, JoinHandle, Thread};

/// The calls a batch makes, erased to `'static` (see the module's invariants).
type Calls = *const (dyn Fn(usize) + Sync);

struct Batch {
    f: Calls,
    n: usize,
    next: AtomicUsize,
    remaining: AtomicUsize,
    /// A call panicked (the caller re-raises it once all have ended).
    panicked: AtomicBool,
    caller: Thread,
}

// SAFETY: `f` points to a `Fn + Sync` that outlives every call made through it (module
// invariants); the rest is atomics and a thread handle.
unsafe impl Send for Batch {}
// SAFETY: as for `Send`: shared use only calls `f` (which is `Sync`) and touches atomics.
unsafe impl Sync for Batch {}

impl Batch {
    /// Claim and make calls until none is left to claim.
    fn work(&self) {
        loop {
            let i = self.next.fetch_add(1, Ordering::Relaxed);
            if i >= self.n {
                return;
            }
            // SAFETY: `i < n` was claimed by this thread alone, so `run` has not returned
            // (it waits for this call's `remaining` decrement) and `f` is alive.
            let f = unsafe { &*self.f };
            let ok = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(i))).is_ok();
            if !ok {
                self.panicked.store(true, Ordering::Relaxed);
            }
            if self.remaining.fetch_sub(1, Ordering::AcqRel) == 1 {
                self.caller.unpark();
            }
        }
    }
}

struct Shared {
    queue: Mutex<VecDeque<Arc<Batch>>>,
    wake: Condvar,
    stop: AtomicBool,
}

/// Threads that run member operations (see the module comment).
pub(crate) struct IoPool {
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
}

impl IoPool {
    pub(crate) fn new(threads: usize) -> std::io::Result<IoPool> {
        let shared = Arc::new(Shared {
            queue: Mutex::new(VecDeque::new()),
            wake: Condvar::new(),
            stop: AtomicBool::new(false),
        });
        let mut pool = IoPool {
            shared,
            threads: Vec::with_capacity(threads),
        };
        for i in 0..threads {
            let shared = pool.shared.clone();
            let t = thread::Builder::new()
                .name(format!("member-io-{i}"))
                .spawn(move || worker(&shared))?;
            pool.threads.push(t);
        }
        Ok(pool)
    }

    /// Call `f(i)` for every `i` in `0..n`, on the pool's threads and this one; returns once
    /// every call has returned (a panic in any is raised here).
    pub(crate) fn run(&self, n: usize, f: &(dyn Fn(usize) + Sync)) {
        if n == 0 {
            return;
        }
        let f: Calls =
            // SAFETY: only the lifetime is erased; `f` outlives this call, and no call is made
            // through the pointer after it returns (the module's invariants).
            unsafe { std::mem::transmute::<*const (dyn Fn(usize) + Sync + '_), Calls>(f) };
        let batch = Arc::new(Batch {
            f,
            n,
            next: AtomicUsize::new(0),
            remaining: AtomicUsize::new(n),
            panicked: AtomicBool::new(false),
            caller: thread::current(),
        });
        let helpers = (n - 1).min(self.threads.len());
        if helpers > 0 {
            let mut q = self.shared.queue.lock();
            for _ in 0..helpers {
                q.push_back(batch.clone());
            }
            drop(q);
            for _ in 0..helpers {
                self.shared.wake.notify_one();
            }
        }
        batch.work();
        while batch.remaining.load(Ordering::Acquire) > 0 {
            thread::park();
        }
        assert!(
            !batch.panicked.load(Ordering::Relaxed),
            "a member operation panicked"
        );
    }
}

fn worker(shared: &Shared) {
    loop {
        let batch = {
            let mut q = shared.queue.lock();
            loop {
                if let Some(b) = q.pop_front() {
                    break b;
                }
                if shared.stop.load(Ordering::Relaxed) {
                    return;
                }
                shared.wake.wait(&mut q);
            }
        };
        batch.work();
    }
}

impl Drop for IoPool {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        {
            let _q = self.shared.queue.lock();
            self.shared.wake.notify_all();
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn every_call_runs_once_and_run_waits_for_all() {
        let pool = IoPool::new(2).unwrap();
        for n in [1, 2, 3, 17] {
            let hits: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
            pool.run(n, &|i| {
                thread::sleep(Duration::from_micros(200));
                hits[i].fetch_add(1, Ordering::SeqCst);
            });
            assert!(hits.iter().all(|h| h.load(Ordering::SeqCst) == 1), "n {n}");
        }
    }

    /// Calls of one batch run side by side: each waits until all three have started, which
    /// one thread alone could never see. Nested batches (a call that runs a batch) finish
    /// even when every worker is inside a call: their caller claims what nobody took.
    #[test]
    fn calls_overlap_and_nested_batches_finish() {
        let pool = IoPool::new(2).unwrap();
        let started = AtomicUsize::new(0);
        pool.run(3, &|_| {
            started.fetch_add(1, Ordering::SeqCst);
            let t = std::time::Instant::now();
            while started.load(Ordering::SeqCst) < 3 {
                assert!(
                    t.elapsed() < Duration::from_secs(10),
                    "calls did not overlap"
                );
                thread::yield_now();
            }
            let inner = AtomicUsize::new(0);
            pool.run(4, &|_| {
                inner.fetch_add(1, Ordering::SeqCst);
            });
            assert_eq!(inner.load(Ordering::SeqCst), 4);
        });
    }

    #[test]
    #[should_panic(expected = "a member operation panicked")]
    fn a_panicking_call_is_raised_in_the_caller() {
        let pool = IoPool::new(2).unwrap();
        pool.run(4, &|i| assert_ne!(i, 2, "boom"));
    }
}
