//! Verify reads (Denehy et al., FAST '05): a request beside read, write and flush that reads the
//! 4 KiB page rows under array byte ranges (the same pages of every member of a stripe, md's
//! unit of parity work), compares redundancy with the data and, where they disagree, rewrites
//! parity or the other mirror copies from the data (the data wins, as in a resync). With integrity records, every block is checked against its record first (`raid456_heal`).
//!
//! The layer above (a file system's journal, an administrator, `guide`) names the ranges that
//! may have had writes in flight; each page row is read once however many ranges touch it. The
//! stripes are claimed for the time of their pass, so client I/O stays correct around it.

use crate::array::Array;
use crate::background::Stop;
use crate::background::SyncControl;
use crate::error::{EngineError, Result};
use crate::integrity::IntegrityCounts;

/// What one verify request found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct VerifyReport {
    /// Ranges asked for.
    pub ranges: usize,
    /// Array bytes under the page rows read (each counted once, however many ranges touched
    /// it): the request's cost.
    pub bytes_verified: u64,
    /// Sectors whose redundancy disagreed with the data, per 4 KiB page as md counts them.
    pub mismatch_sectors: u64,
    /// Whether what disagreed was rewritten (false on a read-only array: only reported).
    pub repaired: bool,
    /// Integrity counters that moved during the request (None without integrity).
    pub integrity: Option<IntegrityCounts>,
}

/// Sorted, merged, non-empty `[start, end)` intervals.
pub(crate) fn merge(mut v: Vec<(u64, u64)>) -> Vec<(u64, u64)> {
    v.retain(|(a, b)| a < b);
    crate::personality::stripe_cache::merge(v)
}

impl Array {
    /// Verify reads over array byte ranges `(offset, length)`: every page row under them is
    /// read, checked and, unless the array refuses writes, repaired.
    pub fn verify(&self, ranges: &[(u64, u64)]) -> Result<VerifyReport> {
        for &(off, len) in ranges {
            self.check_range(off, len)?;
        }
        if self.personality.redundancy() == 0 {
            return Err(EngineError::Unsupported(format!(
                "{} ({}) has no redundancy to verify",
                self.name,
                self.geometry.level()
            )));
        }
        if self.members.slots.iter().any(|s| !s.is_complete()) {
            return Err(EngineError::InvalidArgument(format!(
                "{} is degraded: no redundancy left to compare",
                self.name
            )));
        }
        let fix = self.check_writable().is_ok();
        let counts = || self.integrity.as_ref().map(|i| i.counts());
        let before = counts();
        let mut report = VerifyReport {
            ranges: ranges.len(),
            repaired: fix,
            ..VerifyReport::default()
        };
        (report.mismatch_sectors, report.bytes_verified) =
            self.personality.verify(self, ranges, fix)?;
        report.integrity = counts()
            .zip(before)
            .map(|(after, before)| after.since(&before));
        if report.mismatch_sectors > 0 {
            let what = if fix {
                "rewritten from the data"
            } else {
                "left as found (read-only)"
            };
            self.members.events.emit(
                "verify_mismatch",
                &self.name,
                None,
                format!(
                    "verify: {} sectors of redundancy disagreed with the data: {what}",
                    report.mismatch_sectors
                ),
            );
        }
        Ok(report)
    }
}

impl SyncControl {
    /// A failed read keeps its own kind (damage stays `Corruption`); one that kept being
    /// interrupted by failing members is I/O.
    pub(crate) fn verify_failed(&self, array: &Array, at: u64, len: u64, e: Stop) -> EngineError {
        match e {
            Stop::Interrupted => array.unrecoverable(
                at,
                len,
                "verify: members kept failing while the stripes were read",
            ),
            Stop::Failed(e) => e,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::merge;

    #[test]
    fn ranges_merge_into_sorted_disjoint_intervals() {
        assert_eq!(
            merge(vec![(5, 9), (0, 2), (8, 12), (2, 3), (20, 20)]),
            vec![(0, 3), (5, 12)]
        );
        assert!(merge(vec![]).is_empty());
    }
}
