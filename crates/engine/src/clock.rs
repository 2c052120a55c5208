//! Time and randomness, injected: the engine asks a [`Clock`] how long it has run, what the
//! wall clock says, to pause, and for random numbers, never the system directly. A simulated
//! run ([`ManualClock`], with `ArrayConfig::deterministic_seed` ordering member I/O) then paces,
//! checkpoints, stamps superblocks and events, and draws UUIDs and journal sequence numbers the
//! same way from the same seed: its member images replay bit for bit.
//!
//! What stays on real time: condition variables that wait with a deadline where the deadline
//! only bounds a wait for another thread, never decides an outcome a single-threaded simulated
//! run sees — the stripe cache's write hold (a leader waiting for other writers),
//! `Array::wait_sync_idle` (a caller giving up), the background worker's re-poll and the
//! journal's wait for log room (both re-check their state on waking).

use parking_lot::{Condvar, Mutex};
use rand::{RngCore, SeedableRng};
use std::fmt::Debug;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

pub trait Clock: Send + Sync + Debug {
    /// Monotonic time since the clock started.
    fn now(&self) -> Duration;
    /// Wall-clock time since the Unix epoch: what superblocks, events and status record.
    fn wall(&self) -> Duration;
    /// Pause the calling thread for `d` (pacing of background work).
    fn sleep(&self, d: Duration);
    /// Wait up to `d` for the next tick of a periodic background thread. Unlike `sleep`, a
    /// simulated clock does not move for it: the thread waits for whoever drives time.
    fn park(&self, d: Duration);
    /// A uniformly random number: array and device UUIDs, journal sequence numbers.
    fn random_u64(&self) -> u64;
    /// The real instant, `d` from now, at which a wait for other threads gives up (a stripe's
    /// leader gathering writers, `wait_idle`). Those threads run in real time whatever this
    /// clock is, so a simulated clock bounds such waits in real time too.
    fn deadline(&self, d: Duration) -> Instant {
        Instant::now() + d
    }
}

/// A version-4 UUID drawn from `clock`.
pub(crate) fn new_uuid(clock: &dyn Clock) -> [u8; 16] {
    let mut bytes = [0u8; 16];
    bytes[..8].copy_from_slice(&clock.random_u64().to_le_bytes());
    bytes[8..].copy_from_slice(&clock.random_u64().to_le_bytes());
    *uuid::Builder::from_random_bytes(bytes).as_uuid().as_bytes()
}

/// The wall clock in milliseconds since the Unix epoch.
pub(crate) fn unix_ms(clock: &dyn Clock) -> u64 {
    u64::try_from(clock.wall().as_millis()).unwrap_or(u64::MAX)
}

/// Real time, and the operating system's randomness.
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

    fn wall(&self) -> Duration {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
    }

    fn sleep(&self, d: Duration) {
        std::thread::sleep(d);
    }

    fn park(&self, d: Duration) {
        std::thread::sleep(d);
    }

    fn random_u64(&self) -> u64 {
        rand::random()
    }
}

/// Where a simulated wall clock starts: 2026-01-01T00:00:00Z.
const MANUAL_WALL_START: Duration = Duration::from_secs(1_767_225_600);

/// Simulated time: stands still until advanced; `sleep` advances it instead of waiting. Its
/// random numbers come from its seed (0 for `default`).
#[derive(Debug)]
pub struct ManualClock {
    nanos: AtomicU64,
    rng: Mutex<rand_chacha::ChaCha8Rng>,
    /// Woken at every advance, for parked background threads.
    moved: Condvar,
    moved_lock: Mutex<()>,
}

impl Default for ManualClock {
    fn default() -> Self {
        ManualClock::seeded(0)
    }
}

impl ManualClock {
    pub fn seeded(seed: u64) -> ManualClock {
        ManualClock {
            nanos: AtomicU64::new(0),
            rng: Mutex::new(rand_chacha::ChaCha8Rng::seed_from_u64(seed)),
            moved: Condvar::new(),
            moved_lock: Mutex::new(()),
        }
    }

    pub fn advance(&self, d: Duration) {
        let n = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        self.nanos.fetch_add(n, Ordering::AcqRel);
        let _moving = self.moved_lock.lock();
        self.moved.notify_all();
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Duration {
        Duration::from_nanos(self.nanos.load(Ordering::Acquire))
    }

    fn wall(&self) -> Duration {
        MANUAL_WALL_START + self.now()
    }

    fn sleep(&self, d: Duration) {
        self.advance(d);
    }

    /// Until simulated time has moved `d` on. The wait is also bounded by `d` of real time, so
    /// that a thread parked while nobody drives time still notices its array stopping.
    fn park(&self, d: Duration) {
        let until = self.now() + d;
        let real_deadline = Instant::now() + d;
        let mut moving = self.moved_lock.lock();
        while self.now() < until {
            if self
                .moved
                .wait_until(&mut moving, real_deadline)
                .timed_out()
            {
                return;
            }
        }
    }

    fn random_u64(&self) -> u64 {
        self.rng.lock().next_u64()
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
        assert_eq!(c.wall(), MANUAL_WALL_START + Duration::from_millis(1003));
    }

    #[test]
    fn a_manual_clock_draws_what_its_seed_says() {
        let draws = |seed| {
            let c = ManualClock::seeded(seed);
            (new_uuid(&c), c.random_u64())
        };
        assert_eq!(draws(7), draws(7));
        assert_ne!(draws(7), draws(8));
        let uuid = uuid::Uuid::from_bytes(draws(7).0);
        assert_eq!(uuid.get_version_num(), 4, "a random UUID says so");
    }

    #[test]
    fn a_parked_thread_wakes_when_simulated_time_passes() {
        let c = std::sync::Arc::new(ManualClock::default());
        let parked = {
            let c = c.clone();
            std::thread::spawn(move || {
                let t = Instant::now();
                c.park(Duration::from_secs(60));
                t.elapsed()
            })
        };
        while !parked.is_finished() {
            std::thread::sleep(Duration::from_millis(5));
            c.advance(Duration::from_secs(30));
        }
        let waited = parked.join().expect("parked thread");
        assert!(waited < Duration::from_secs(30), "waited {waited:?}");
    }
}
