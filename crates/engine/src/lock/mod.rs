//! The one range lock: whatever must keep client writes out of a range while it works there
//! takes a guard on it. Background windows (rebuild, resync, check/repair, verify reads, the
//! bitmap's and the used-region map's clean-up) go through the [`RangeLock`] trait, so that a
//! cluster can take the same extent on every node first; client writes take the local locks
//! directly (a cluster keeps them out of remote windows through the coordinator's
//! `area_resyncing`, as md-cluster does).
//!
//! Parity levels lock whole stripes with the stripe cache's exclusive claim, the same one a
//! write batch or a degraded read takes, so a locked stripe has no batch running and gets none
//! until the guard drops. Mirror levels lock the fixed-size regions (`regions.rs`) that every
//! mirror write takes. Both take their parts in ascending order and hold no other lock while
//! waiting, so guards cannot deadlock with each other or with client I/O. A guard releases on
//! drop.

mod regions;
pub(crate) mod sectors;

use parking_lot::MutexGuard;
use regions::RegionLocks;
pub(crate) use regions::REGION_BYTES;
use std::sync::Arc;

/// What a background window locks, in the coordinates its caller works in.
#[derive(Clone, Copy, Debug)]
pub(crate) enum LockRange {
    /// Stripes (parity rows) `first..end`.
    Stripes { first: u64, end: u64 },
    /// Array bytes `at..at + len` of a mirror level.
    Array { at: u64, len: u64 },
    /// md's sync coordinates `at..at + len` (what the bitmap, the used-region map and the
    /// background walks use): the stripes holding those per-member bytes for parity levels,
    /// the same array bytes for mirrors.
    Sync { at: u64, len: u64 },
}

/// Whatever a lock holds; released when dropped.
pub(crate) trait Held {}

impl<T> Held for T {}

/// Held until dropped.
pub(crate) type RangeGuard<'a> = Box<dyn Held + 'a>;

/// Keeps client writes out of a range for as long as its guard lives.
pub(crate) trait RangeLock: Send + Sync {
    fn lock(&self, range: LockRange) -> RangeGuard<'_>;
    /// Array byte ranges `(at, len)` of a mirror level, all at once.
    fn lock_array_ranges(&self, ranges: &[(u64, u64)]) -> RangeGuard<'_>;
}

/// Exclusive claims on parity stripes: the stripe cache's, the same a write batch or a
/// degraded read takes.
pub(crate) trait StripeClaims: Send + Sync {
    /// Claim stripes `first..end` in ascending order; released when the guard drops.
    fn claim_rows(&self, first: u64, end: u64) -> RangeGuard<'_>;
}

/// The locks of one host.
pub(crate) struct LocalLocks {
    parity: bool,
    chunk_bytes: u64,
    stripes: Arc<dyn StripeClaims>,
    regions: RegionLocks,
}

impl LocalLocks {
    pub fn new(parity: bool, chunk_bytes: u64, stripes: Arc<dyn StripeClaims>) -> LocalLocks {
        LocalLocks {
            parity,
            chunk_bytes,
            stripes,
            regions: RegionLocks::new(),
        }
    }

    /// Lock array bytes `at..at + len` of a mirror level.
    pub fn lock_array_range(&self, at: u64, len: u64) -> Vec<MutexGuard<'_, ()>> {
        assert!(!self.parity, "parity levels lock stripes");
        self.regions.lock_range(at, len)
    }
}

impl RangeLock for LocalLocks {
    fn lock_array_ranges(&self, ranges: &[(u64, u64)]) -> RangeGuard<'_> {
        assert!(!self.parity, "parity levels lock stripes");
        Box::new(self.regions.lock_ranges(ranges))
    }

    fn lock(&self, range: LockRange) -> RangeGuard<'_> {
        match range {
            LockRange::Stripes { first, end } => {
                assert!(self.parity, "stripes are parity rows");
                self.stripes.claim_rows(first, end)
            }
            LockRange::Array { at, len } => Box::new(self.lock_array_range(at, len)),
            LockRange::Sync { at, len } if self.parity => self
                .stripes
                .claim_rows(at / self.chunk_bytes, (at + len).div_ceil(self.chunk_bytes)),
            LockRange::Sync { at, len } => Box::new(self.lock_array_range(at, len)),
        }
    }
}
