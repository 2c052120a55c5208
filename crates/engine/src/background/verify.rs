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
use crate::error::{EngineError, Result};
use crate::integrity::IntegrityCounts;
use crate::lock::LockRange;
use crate::personality::raid456_heal::Heal;

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
fn merge(mut v: Vec<(u64, u64)>) -> Vec<(u64, u64)> {
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
        if self.geometry.max_degraded() == 0 {
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
        if self.geometry.level().is_parity() {
            let spans = merge(
                ranges
                    .iter()
                    .flat_map(|&(off, len)| self.page_rows(off, len))
                    .collect(),
            );
            let data_disks = self.geometry.data_disks() as u64;
            for (a, b) in spans {
                report.mismatch_sectors += self.verify_span(a, b, fix)?;
                report.bytes_verified += (b - a) * data_disks;
            }
        } else {
            // Mirrors: every copy of the 4 KiB pages under the ranges.
            let heal = if fix { self.heal_mode() } else { Heal::Count };
            let pages = merge(
                ranges
                    .iter()
                    .map(|&(off, len)| (off / 4096 * 4096, (off + len).div_ceil(4096) * 4096))
                    .collect(),
            );
            let size = self.size_bytes();
            for (a, b) in pages {
                let b = b.min(size);
                let step = self.mirror_step();
                let mut at = a;
                while at < b {
                    let len = (step - at % step).min(b - at);
                    report.mismatch_sectors += self
                        .scrub_mirror(at, len, heal)
                        .map_err(|e| self.verify_failed(at, len, e))?;
                    at += len;
                }
                report.bytes_verified += b - a;
            }
        }
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

    /// The member bytes (whole 4 KiB pages, the same on every member) of the page rows under
    /// array bytes `off..off + len`: md checks a stripe 4 KiB at a time (`STRIPE_SIZE`), and so
    /// a verify read costs what was in flight, not whole chunk rows.
    fn page_rows(&self, off: u64, len: u64) -> Vec<(u64, u64)> {
        const PAGE: u64 = 4096;
        let chunk = self.geometry.chunk_sectors() * 512;
        let data_disks = self.geometry.data_disks() as u64;
        let end = ((off + len).div_ceil(PAGE) * PAGE).min(self.size_bytes());
        let mut at = off / PAGE * PAGE;
        let mut spans = Vec::new();
        while at < end {
            let c = at / chunk;
            let stop = ((c + 1) * chunk).min(end);
            let member = c / data_disks * chunk + at % chunk;
            spans.push((member, member + (stop - at)));
            at = stop;
        }
        spans
    }

    /// Page rows over member bytes `a..b`, a window at a time, the window's rows claimed while
    /// they are checked.
    fn verify_span(&self, a: u64, b: u64, fix: bool) -> Result<u64> {
        let chunk = self.geometry.chunk_sectors() * 512;
        let window = self.window_rows() * chunk;
        // After an unclean stop, blocks that fail their records in rows a crash may have torn
        // are unflushed writes: settled as found, as the resync would (see `raid456_heal`).
        let heal = if fix { self.heal_mode() } else { Heal::Count };
        let mut bad = 0;
        let mut at = a;
        while at < b {
            let end = ((at / window + 1) * window).min(b);
            let mut tries = 0;
            let found = loop {
                let guard = self.range_lock().lock(LockRange::Stripes {
                    first: at / chunk,
                    end: end.div_ceil(chunk),
                });
                let res = self.scrub_span(at, end - at, fix, heal);
                drop(guard);
                match res {
                    // A member failed while being read: plan again without it.
                    Err(Stop::Interrupted) if tries < 4 => tries += 1,
                    other => break other,
                }
            };
            let rows = at / chunk * chunk * self.geometry.data_disks() as u64;
            bad += found.map_err(|e| self.verify_failed(rows, end - at, e))?;
            at = end;
        }
        Ok(bad)
    }

    /// A failed read keeps its own kind (damage stays `Corruption`); one that kept being
    /// interrupted by failing members is I/O.
    fn verify_failed(&self, at: u64, len: u64, e: Stop) -> EngineError {
        match e {
            Stop::Interrupted => self.unrecoverable(
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
