//! Scrubbing and resync: compare redundancy with data, count mismatches (md's `mismatch_cnt`,
//! in sectors per inconsistent 4 KiB page) and, unless only checking, rewrite parity or copy the
//! first copy over the others. Works in the same claimed windows as recovery.

use crate::array::Array;
use crate::background::rebuild::row_pieces;
use crate::background::{Stop, SyncAction};
use crate::io::bufpool::PoolBuf;
use crate::io::commit::WriteSet;
use crate::lock::LockRange;
use crate::personality::raid456_heal::Heal;

impl Array {
    /// One window of a resync, check or repair at `pos` (per-member bytes; array bytes for
    /// mirrors); returns where the next window starts.
    pub(crate) fn scrub_step(&self, action: SyncAction, pos: u64, end: u64) -> Result<u64, Stop> {
        let fix = action != SyncAction::Check;
        let heal = match action {
            SyncAction::Check => Heal::Count,
            SyncAction::Resync => Heal::Settle,
            _ => Heal::Repair,
        };
        let bad;
        let next;
        if self.geometry.level().is_parity() {
            let chunk = self.geometry.chunk_sectors() * 512;
            let row = pos / chunk;
            // Not past `end`: a bitmap-guided resync stops where the dirty chunks do.
            let last = (row + self.window_rows())
                .min(self.geometry.stripes())
                .min(end.div_ceil(chunk));
            let guard = self.range_lock().lock(LockRange::Stripes {
                first: row,
                end: last,
            });
            let res = self.scrub_window(row, last, fix, heal);
            drop(guard);
            bad = res?;
            next = last * chunk;
        } else {
            let step = self.mirror_step();
            let off = pos / step * step;
            let len = step.min(end - off);
            bad = self.scrub_mirror(off, len, heal)?;
            next = off + len;
        }
        self.sync.st.lock().mismatches += bad;
        Ok(next)
    }

    /// Compare the parity of stripes `r0..r1` with their data; rewrite it where it differs if
    /// `fix`. Returns mismatched sectors, counted per 4 KiB page as md does. With integrity
    /// records every block is verified first, and what fails is handled as `raid456_heal` says.
    pub(crate) fn scrub_window(
        &self,
        r0: u64,
        r1: u64,
        fix: bool,
        heal: Heal,
    ) -> Result<u64, Stop> {
        let chunk = (self.geometry.chunk_sectors() * 512) as usize;
        // Pages nothing can rebuild (recorded bad blocks) are passed, as a rebuild passes them:
        // neither counted nor rewritten (a parity write there would clear a record).
        let (bufs, lost) = match self.read_window(r0, r1, heal) {
            Ok(Some(bufs)) => (bufs, Vec::new()),
            Ok(None) => return Err(Stop::Interrupted),
            Err(Stop::Failed(_)) if self.sources_left(r0, r1) => {
                self.read_sources_by_page(r0, r1)?
            }
            Err(stop) => return Err(stop),
        };
        self.compare_span(r0 * chunk as u64, &bufs, &lost, fix)
    }

    /// Compare parity with data over member bytes `at..at + len` (whole pages, parts of rows
    /// allowed: a verify read's 4 KiB page rows); rewrite it where it differs if `fix`. The
    /// caller holds the rows' claims.
    pub(crate) fn scrub_span(&self, at: u64, len: u64, fix: bool, heal: Heal) -> Result<u64, Stop> {
        let Some(bufs) = self.read_span(at, len, heal)? else {
            return Err(Stop::Interrupted);
        };
        self.compare_span(at, &bufs, &[], fix)
    }

    /// The parity comparison of [`Array::scrub_window`] over the member bytes `bufs` hold from
    /// `at`, row by row. `lost` pages (member bytes) are passed: neither counted nor rewritten,
    /// nor is the rest of their row's parity (a parity write there would clear a record).
    fn compare_span(
        &self,
        at: u64,
        bufs: &[PoolBuf],
        lost: &[u64],
        fix: bool,
    ) -> Result<u64, Stop> {
        let chunk = self.geometry.chunk_sectors() * 512;
        let mut bad = 0u64;
        for (row, r) in row_pieces(at, bufs[0].len() as u64, chunk) {
            let roles = self.geometry.stripe_roles(row);
            let cut = |dev: usize| &bufs[dev][r.clone()];
            let data: Vec<&[u8]> = (0..self.geometry.data_disks())
                .map(|d| cut(roles.data_dev(d)))
                .collect();
            let (p, q) = self.compute_parity(&roles, &data);
            let mut row_bad = 0;
            let piece_at = at + r.start as u64;
            let row_lost = lost.iter().any(|&l| l / chunk == row);
            for (page, want) in p.chunks(4096).enumerate() {
                if lost.contains(&(piece_at + page as u64 * 4096)) {
                    continue;
                }
                let range = page * 4096..page * 4096 + want.len();
                let q_bad = match (&q, roles.q_dev()) {
                    (Some(q), Some(qd)) => q[range.clone()] != cut(qd)[range.clone()],
                    _ => false,
                };
                if *want != cut(roles.p_dev())[range] || q_bad {
                    row_bad += want.len() as u64 / 512;
                }
            }
            if row_bad > 0 && fix && !row_lost {
                let mut ios = vec![self.write_io(roles.p_dev(), piece_at, &p, false)];
                if let (Some(qd), Some(qb)) = (roles.q_dev(), q.as_ref()) {
                    ios.push(self.write_io(qd, piece_at, qb, false));
                }
                self.commit_writes(&WriteSet::repair(piece_at, r.len() as u64), &mut ios)
                    .map_err(Stop::Failed)?;
            }
            bad += row_bad;
        }
        Ok(bad)
    }

    /// Bring the copies of array bytes `at..at+len` into agreement (`settle_copies`): check
    /// counts, repair and resync rewrite.
    pub(crate) fn scrub_mirror(&self, at: u64, len: u64, heal: Heal) -> Result<u64, Stop> {
        let _guard = self.range_lock().lock(LockRange::Array { at, len });
        match self.settle_copies(at, len, heal, None) {
            Ok(bad) => Ok(bad),
            Err(e) if self.is_failed() => Err(Stop::Failed(e)),
            Err(e) => {
                // Some pages no copy can give: pass them page by page, as a rebuild does.
                tracing::warn!(array = %self.name, offset = at, "scrub span not whole ({e}): page by page");
                let page = crate::members::badblocks::BAD_PAGE;
                let mut bad = 0;
                for off in (at..at + len).step_by(page as usize) {
                    bad += self
                        .settle_copies(off, page.min(at + len - off), heal, None)
                        .unwrap_or(0);
                }
                Ok(bad)
            }
        }
    }
}
