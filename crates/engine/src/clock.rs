//! Time, injected: the engine asks a [`Clock`] how long it has run and to pause, never the
//! system directly, so that a simulated run paces, checkpoints and counts client activity the
//! same way from the same seed.
//!
//! What stays on real time: the short waits of the stripe cache's write hold (condition
//! variables with deadlines). They only decide how long a leader waits for other writers; a
//! single-threaded simulated client never holds (it has no concurrent writes to wait for).

use std::fmt::Debug;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

pub trait Clock: Send + Sync + Debug {
    /// Time since the clock started.
    fn now(&self) -> Duration;
    /// Pause the calling thread for `d`.
    fn sleep(&self, d: Duration);
}

/// Real time.
#[derive(Debug)]
pub struct SystemClock {
    start: Instant,
}

impl Default for SystemClock {
    fn default() -> Self {
        SystemClock {
            start: Instant::now(),
        }
    }
}

impl Clock for SystemClock {
    fn now(&self) -> Duration {
        self.start.elapsed()
    }

    fn sleep(&self, d: Duration) {
        std::thread::sleep(d);
    }
}

/// Simulated time: stands still until advanced; `sleep` advances it instead of waiting.
#[derive(Debug, Default)]
pub struct ManualClock {
    nanos: AtomicU64,
}

impl ManualClock {
    pub fn advance(&self, d: Duration) {
        let n = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        self.nanos.fetch_add(n, Ordering::AcqRel);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Duration {
        Duration::from_nanos(self.nanos.load(Ordering::Acquire))
    }

    fn sleep(&self, d: Duration) {
        self.advance(d);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manual_clock_moves_only_when_told() {
        let c = ManualClock::default();
        assert_eq!(c.now(), Duration::ZERO);
        c.sleep(Duration::from_millis(3));
        c.advance(Duration::from_secs(1));
        assert_eq!(c.now(), Duration::from_millis(1003));
    }
}
