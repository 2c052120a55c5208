//! Region locks of the levels without parity: why they exist is in `copies.rs` (two
//! overlapping writes in flight could land in different orders on two mirrors). A fixed table of
//! mutexes that regions hash onto, taken in index order, so no deadlock.

use parking_lot::{Mutex, MutexGuard};

/// Writers to redundant non-parity levels serialise per region of this many bytes.
pub(crate) const REGION_BYTES: u64 = 64 * 1024;
/// Size of the lock table (regions hash onto it).
const REGION_LOCKS: usize = 1024;

pub(crate) struct RegionLocks {
    locks: Vec<Mutex<()>>,
}

impl RegionLocks {
    pub fn new() -> RegionLocks {
        RegionLocks {
            locks: (0..REGION_LOCKS).map(|_| Mutex::new(())).collect(),
        }
    }

    /// Lock the regions array bytes `offset..offset + len` fall in.
    pub fn lock_range(&self, offset_bytes: u64, len_bytes: u64) -> Vec<MutexGuard<'_, ()>> {
        self.lock_ranges(&[(offset_bytes, len_bytes)])
    }

    /// Lock the regions any of the array byte ranges `(offset, len)` fall in, all at once (in
    /// index order, as every taker does).
    pub fn lock_ranges(&self, ranges: &[(u64, u64)]) -> Vec<MutexGuard<'_, ()>> {
        let mut idx: Vec<usize> = ranges
            .iter()
            .flat_map(|&(offset_bytes, len_bytes)| {
                let first = offset_bytes / REGION_BYTES;
                let last = (offset_bytes + len_bytes.max(1) - 1) / REGION_BYTES;
                first..=last.min(first + REGION_LOCKS as u64)
            })
            .map(|r| (r % REGION_LOCKS as u64) as usize)
            .collect();
        idx.sort_unstable();
        idx.dedup();
        idx.into_iter().map(|i| self.locks[i].lock()).collect()
    }
}
