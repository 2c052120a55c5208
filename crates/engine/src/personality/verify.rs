//! Verify reads (Denehy et al., FAST '05): a request beside read, write and flush that reads the
//! 4 KiB page rows under array byte ranges (the same pages of every member of a stripe, md's
//! unit of parity work), compares redundancy with the data and, where they disagree, rewrites
//! parity or the other mirror copies from the data (the data wins, as in a resync). With integrity records, every block is checked against its record first (`raid456_heal`).
//!
//! The layer above (a file system's journal, an administrator, `guide`) names the ranges that
//! may have had writes in flight; each page row is read once however many ranges touch it. The
//! stripes are claimed for the time of their pass, so client I/O stays correct around it.

use crate::error::{EngineError, Result};
use crate::personality::parts::Parts;
use crate::work::Stop;
use crate::work::VerifyReport;

impl Parts {
    /// Verify reads over array byte ranges `(offset, length)`: every page row under them is
    /// read, checked and, unless the array refuses writes, repaired.
    pub(crate) fn verify(&self, ranges: &[(u64, u64)]) -> Result<VerifyReport> {
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

    /// A failed read keeps its own kind (damage stays `Corruption`); one that kept being
    /// interrupted by failing members is I/O.
    pub(crate) fn verify_failed(&self, at: u64, len: u64, e: Stop) -> EngineError {
        match e {
            Stop::Interrupted => self.members.unrecoverable(
                at,
                len,
                "verify: members kept failing while the stripes were read",
            ),
            Stop::Failed(e) => e,
        }
    }
}
