//! Counting the request threads of every connection, so that a graceful
//! shutdown can wait for backend calls that outlive their connection.
//!
//! A connection's threads normally end before its task does. But when a
//! connection is dropped — its shutdown grace period expired — the task ends
//! at once while its threads may still be inside a backend call (a write that
//! has not reached the array yet). A clean stop must not be reported while
//! such a call runs, so every thread holds a [`ThreadToken`] from before it
//! is spawned until it has returned from its last backend call, and the
//! server waits for the count to reach zero before `serve_*` returns.
//!
//! Invariant: `count` equals the number of tokens alive. A token is taken
//! before `spawn` (so a thread never runs uncounted) and dropped last in the
//! thread (also when it unwinds).

use std::time::Duration;

use tokio::sync::watch;

/// After the connections are gone, how long a shutdown waits by default for
/// request threads still inside backend calls.
pub const DEFAULT_SHUTDOWN_BACKEND_TIMEOUT: Duration = Duration::from_secs(60);

/// The live request threads of one server.
pub(crate) struct ThreadTracker {
    count: watch::Sender<usize>,
}

impl ThreadTracker {
    pub(crate) fn new() -> ThreadTracker {
        ThreadTracker {
            count: watch::channel(0).0,
        }
    }

    /// Counts one more thread until the token is dropped.
    pub(crate) fn enter(self: &std::sync::Arc<Self>) -> ThreadToken {
        self.count.send_modify(|n| *n += 1);
        ThreadToken(self.clone())
    }

    /// Counts one more thread if fewer than `max` are counted (atomically: threads of several
    /// connections asking at once never pass `max` together).
    pub(crate) fn try_enter(self: &std::sync::Arc<Self>, max: usize) -> Option<ThreadToken> {
        let mut counted = false;
        self.count.send_if_modified(|n| {
            counted = *n < max;
            if counted {
                *n += 1;
            }
            counted
        });
        counted.then(|| ThreadToken(self.clone()))
    }

    /// Threads currently counted.
    pub(crate) fn running(&self) -> usize {
        *self.count.borrow()
    }

    /// Waits up to `timeout` for every counted thread to end; returns how
    /// many are still running (0 on success).
    pub(crate) async fn wait_idle(&self, timeout: Duration) -> usize {
        let mut rx = self.count.subscribe();
        let idle = async {
            // The guard `wait_for` returns is not `Send`: drop it at once.
            let _ = rx.wait_for(|n| *n == 0).await;
        };
        let _ = tokio::time::timeout(timeout, idle).await;
        self.running()
    }
}

/// One counted thread.
pub(crate) struct ThreadToken(std::sync::Arc<ThreadTracker>);

impl Drop for ThreadToken {
    fn drop(&mut self) {
        self.0.count.send_modify(|n| {
            assert!(*n > 0, "thread count underflow");
            *n -= 1;
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[tokio::test]
    async fn waits_for_threads_and_times_out() {
        let t = Arc::new(ThreadTracker::new());
        assert_eq!(t.wait_idle(Duration::ZERO).await, 0);
        let token = t.enter();
        let h = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(100));
            drop(token);
        });
        assert_eq!(t.wait_idle(Duration::from_millis(1)).await, 1);
        assert_eq!(t.wait_idle(Duration::from_secs(10)).await, 0);
        h.join().unwrap();
    }
}
