//! ENOSPC episodes: a member's backing store filled up, so writes fail with ENOSPC while the
//! member stays in the array. Status reports the episode (which member, since when, how many
//! writes failed) until a write goes through again: "active" alone would hide that clients
//! are getting errors.

use parking_lot::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

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
    episode: Mutex<Option<NoSpaceStatus>>,
}

impl NoSpaceTracker {
    pub(crate) fn write_failed(&self, member: &str) {
        let mut e = self.episode.lock();
        let ep = e.get_or_insert_with(|| NoSpaceStatus {
            member: member.to_string(),
            since_unix_ms: now_ms(),
            writes_failed: 0,
        });
        ep.member = member.to_string();
        ep.writes_failed += 1;
        self.in_episode.store(true, Ordering::Release);
    }

    /// A write went through on every member: the episode, if any, is over.
    pub(crate) fn write_succeeded(&self) {
        if self.in_episode.load(Ordering::Acquire) {
            *self.episode.lock() = None;
            self.in_episode.store(false, Ordering::Release);
        }
    }

    pub(crate) fn status(&self) -> Option<NoSpaceStatus> {
        self.episode.lock().clone()
    }
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_episode_lasts_until_a_write_goes_through() {
        let t = NoSpaceTracker::default();
        t.write_succeeded();
        assert_eq!(t.status(), None);
        t.write_failed("m1");
        t.write_failed("m2");
        let s = t.status().expect("in an episode");
        assert_eq!((s.member.as_str(), s.writes_failed), ("m2", 2));
        t.write_succeeded();
        assert_eq!(t.status(), None);
    }
}
