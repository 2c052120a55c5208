//! ENOSPC episodes: a member's backing store filled up, so writes fail with ENOSPC while the
//! member stays in the array. Status reports the episode (which member, since when, how many
//! writes failed) until writes go through again for [`EPISODE_QUIET`] without a failure:
//! "active" alone would hide that clients are getting errors, and one write going through is
//! no sign of room (on a full file system a write into space already allocated goes through).

use crate::clock::Clock;
use parking_lot::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// How long writes must go through after the last ENOSPC before the episode is over.
pub(crate) const EPISODE_QUIET: Duration = Duration::from_secs(5);

/// An ENOSPC episode in progress, for status.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NoSpaceStatus {
    /// The member whose backing store was full at the latest failed write.
    pub member: String,
    pub since_unix_ms: u64,
    pub writes_failed: u64,
}

#[derive(Default)]
pub(crate) struct NoSpaceTracker {
    /// Mirrors `episode.is_some()`, so that the write path does not take the lock.
    in_episode: AtomicBool,
    /// The episode, and when its latest write failed (on the array's clock).
    episode: Mutex<Option<(NoSpaceStatus, Duration)>>,
}

impl NoSpaceTracker {
    pub(crate) fn write_failed(&self, member: &str, clock: &dyn Clock) {
        self.write_failed_at(member, clock.now(), crate::clock::unix_ms(clock));
    }

    fn write_failed_at(&self, member: &str, now: Duration, unix_ms: u64) {
        let mut e = self.episode.lock();
        let (ep, last) = e.get_or_insert_with(|| {
            let ep = NoSpaceStatus {
                member: member.to_string(),
                since_unix_ms: unix_ms,
                writes_failed: 0,
            };
            (ep, now)
        });
        ep.member = member.to_string();
        ep.writes_failed += 1;
        *last = now;
        self.in_episode.store(true, Ordering::Release);
    }

    /// A write went through on every member: the episode, if any, is over once none has
    /// failed for [`EPISODE_QUIET`].
    /// `now`: the array's clock.
    pub(crate) fn write_succeeded(&self, now: Duration) {
        if !self.in_episode.load(Ordering::Acquire) {
            return;
        }
        let mut e = self.episode.lock();
        if e.as_ref()
            .is_some_and(|(_, last)| now.saturating_sub(*last) >= EPISODE_QUIET)
        {
            *e = None;
            self.in_episode.store(false, Ordering::Release);
        }
    }

    pub(crate) fn status(&self) -> Option<NoSpaceStatus> {
        self.episode.lock().as_ref().map(|(ep, _)| ep.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_episode_lasts_until_writes_go_through_for_a_while() {
        let t = NoSpaceTracker::default();
        let t0 = Duration::from_secs(100);
        t.write_succeeded(t0);
        assert_eq!(t.status(), None);
        t.write_failed_at("m1", t0, 7);
        t.write_failed_at("m2", t0 + Duration::from_secs(1), 8);
        let s = t.status().expect("in an episode");
        assert_eq!((s.member.as_str(), s.writes_failed), ("m2", 2));
        assert_eq!(
            s.since_unix_ms, 7,
            "the episode started at the first failure"
        );
        t.write_succeeded(t0 + Duration::from_secs(2));
        assert!(t.status().is_some(), "one write through is no sign of room");
        t.write_succeeded(t0 + Duration::from_secs(1) + EPISODE_QUIET);
        assert_eq!(t.status(), None);
    }
}
