//! Byte-granular writes: the sub-sector lock.
//!
//! The engine reads and writes whole 512-byte sectors. A client that did not negotiate block
//! sizes may send any byte range, so a WRITE or WRITE_ZEROES that starts or ends inside a sector
//! is widened: each partial ("edge") sector is read, patched with the client's bytes, and written
//! back whole (read-modify-write). Unaligned reads read the covering sectors and copy out.
//!
//! What must hold: *a byte that no write in flight covers keeps its last acknowledged value.* A
//! patch writes back bytes the client did not send, with the values it read. If another write
//! to that sector — unaligned, aligned or zeroing, from any connection — completes between the
//! patch's read and its write, those values are stale and that write's update is silently
//! undone, although the two requests share no byte. (Concurrent writes to the *same* bytes may
//! land in either order; that is all a client may not rely on.) Hence: *while an edge sector is
//! being patched, no other write to that sector may run.*
//!
//! How: [`SectorLocks`], a fixed table of `LOCK_STRIPES` reader-writer locks. A sector belongs to
//! the lock of its `LOCK_GRANULE_BYTES` granule, modulo `LOCK_STRIPES`. Every write takes, before
//! it touches the array and until the array has answered, the lock of each granule it covers:
//! exclusive where it patches an edge sector, shared elsewhere. So aligned writes never wait for
//! one another, only for a patch of a sector they touch, and a patch waits for every other
//! write of its granule. Locks are taken in increasing stripe order and each at most once per
//! write, so no two writes can wait on each other in a cycle. A write covering `LOCK_STRIPES`
//! granules or more takes every lock. Reads take none: a read that overlaps a concurrent write
//! may see old or new bytes, as NBD allows.
//!
//! The table is one per array. Writes from inside the engine (resync, rebuild) are whole
//! sectors and the engine orders them itself; this lock only orders the patches of
//! `array/bytes.rs` against client writes.

use std::sync::{PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

pub(crate) const SECTOR: u64 = 512;

/// Bytes of the array that share one lock of [`SectorLocks`]: a page, so that a typical 4 KiB
/// aligned write takes one or two locks.
const LOCK_GRANULE_BYTES: u64 = 4096;

/// Locks in the table; a set of them is a `u64` bit mask.
const LOCK_STRIPES: usize = 64;

const _: () = assert!(LOCK_STRIPES == u64::BITS as usize);
const _: () = assert!(LOCK_GRANULE_BYTES.is_multiple_of(SECTOR));

pub(crate) fn is_aligned(offset: u64, len: u64) -> bool {
    offset.is_multiple_of(SECTOR) && len.is_multiple_of(SECTOR)
}

/// `offset..offset+len` widened to whole sectors.
pub(crate) fn widen(offset: u64, len: u64) -> (u64, u64) {
    (
        offset / SECTOR * SECTOR,
        (offset + len).div_ceil(SECTOR) * SECTOR,
    )
}

/// The start of each sector that `offset..offset+len` (not empty) covers only in part: at most
/// two, the first and the last, ascending and distinct.
pub(crate) fn edge_sectors(offset: u64, len: u64) -> impl Iterator<Item = u64> {
    assert!(len > 0, "an empty write has no edges");
    let (start, end) = widen(offset, len);
    let head = (!offset.is_multiple_of(SECTOR)).then_some(start);
    let tail = (!(offset + len).is_multiple_of(SECTOR)).then_some(end - SECTOR);
    head.into_iter().chain(tail.filter(|&t| Some(t) != head))
}

/// One lock per cache line, so that writers on different stripes do not slow each other down.
#[repr(align(64))]
struct Stripe(RwLock<()>);

/// The lock table (see the module documentation).
pub(crate) struct SectorLocks {
    stripes: [Stripe; LOCK_STRIPES],
}

/// The stripes a write takes, as bit masks (bit `i` is stripe `i`); disjoint.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct LockSet {
    exclusive: u64,
    shared: u64,
}

fn stripe_bit(offset: u64) -> u64 {
    1 << (offset / LOCK_GRANULE_BYTES % LOCK_STRIPES as u64)
}

impl LockSet {
    /// What two writes take together, for one thread that runs both: exclusive wherever either
    /// needs it.
    pub fn union(&self, other: &LockSet) -> LockSet {
        let exclusive = self.exclusive | other.exclusive;
        LockSet {
            exclusive,
            shared: (self.shared | other.shared) & !exclusive,
        }
    }

    /// For a write of `offset..offset+len` (not empty): exclusive on the granule of each edge
    /// sector, shared on every other granule of the widened range.
    pub fn for_write(offset: u64, len: u64) -> LockSet {
        let (start, end) = widen(offset, len);
        let first = start / LOCK_GRANULE_BYTES;
        let last = (end - 1) / LOCK_GRANULE_BYTES;
        let covered = if last - first >= LOCK_STRIPES as u64 - 1 {
            u64::MAX
        } else {
            (first..=last).fold(0, |m, g| m | stripe_bit(g * LOCK_GRANULE_BYTES))
        };
        let exclusive = edge_sectors(offset, len).fold(0, |m, s| m | stripe_bit(s));
        LockSet {
            exclusive,
            shared: covered & !exclusive,
        }
    }
}

/// Guards of one write; the locks are released when it is dropped.
pub(crate) struct Held<'a> {
    _shared: Vec<RwLockReadGuard<'a, ()>>,
    _exclusive: Vec<RwLockWriteGuard<'a, ()>>,
}

impl SectorLocks {
    pub const fn new() -> SectorLocks {
        SectorLocks {
            stripes: [const { Stripe(RwLock::new(())) }; LOCK_STRIPES],
        }
    }

    /// Takes `set`, in increasing stripe order (the order is what rules out deadlock).
    pub fn lock(&self, set: &LockSet) -> Held<'_> {
        assert_eq!(set.exclusive & set.shared, 0, "a stripe is taken once");
        let mut shared = Vec::with_capacity(set.shared.count_ones() as usize);
        let mut exclusive = Vec::with_capacity(set.exclusive.count_ones() as usize);
        let mut todo = set.exclusive | set.shared;
        while todo != 0 {
            let i = todo.trailing_zeros();
            todo &= todo - 1;
            // Poisoning only means another write panicked while holding the lock; the lock
            // protects no data of its own.
            let lock = &self.stripes[i as usize].0;
            if set.exclusive & (1 << i) != 0 {
                exclusive.push(lock.write().unwrap_or_else(PoisonError::into_inner));
            } else {
                shared.push(lock.read().unwrap_or_else(PoisonError::into_inner));
            }
        }
        Held {
            _shared: shared,
            _exclusive: exclusive,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn edges_of_a_range() {
        let e = |o, l| edge_sectors(o, l).collect::<Vec<_>>();
        assert_eq!(e(0, 512), Vec::<u64>::new());
        assert_eq!(e(1, 7), vec![0]);
        assert_eq!(e(510, 4), vec![0, 512]);
        assert_eq!(e(512, 100), vec![512]);
        assert_eq!(e(100, 412), vec![0]);
        assert_eq!(e(100, 2000), vec![0, 2048]);
    }

    #[test]
    fn lock_sets() {
        // Aligned: shared only.
        let s = LockSet::for_write(4096, 8192);
        assert_eq!(
            s,
            LockSet {
                exclusive: 0,
                shared: 0b110
            }
        );
        // Two writes run by one thread (a gathered run): each stripe once, exclusive wins.
        let both = s.union(&LockSet::for_write(8192 + 3, 7));
        assert_eq!(
            both,
            LockSet {
                exclusive: 0b100,
                shared: 0b10
            }
        );
        // Inside one sector: that granule exclusive, nothing else.
        let s = LockSet::for_write(4096 + 3, 7);
        assert_eq!(
            s,
            LockSet {
                exclusive: 0b10,
                shared: 0
            }
        );
        // Across a granule boundary: both edges exclusive.
        let s = LockSet::for_write(4096 - 10, 20);
        assert_eq!(
            s,
            LockSet {
                exclusive: 0b11,
                shared: 0
            }
        );
        // Long: every stripe, the edges' exclusive (granule 64 wraps onto stripe 0).
        let s = LockSet::for_write(1, LOCK_GRANULE_BYTES * 64);
        assert_eq!(s.exclusive, 0b1);
        assert_eq!(s.shared, !0b1);
        let s = LockSet::for_write(0, LOCK_GRANULE_BYTES * 63);
        assert_eq!(s.shared, u64::MAX >> 1);
    }
}
