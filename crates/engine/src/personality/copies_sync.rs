//! The copies levels' background windows: recovery copies a role's bytes from another in-sync
//! copy, resync and check/repair compare the copies, verify reads do the same over the 4 KiB
//! pages under a client's ranges. Each window takes the region lock client writes take.

use crate::error::Result;
use crate::io::MemberIo;
use crate::lock::LockRange;
use crate::personality::parts::Parts;
use crate::personality::raid456_heal::Heal;
use crate::personality::Copies;
use crate::personality::Personality;
use crate::work::{in_pieces, Stop, SyncAction, PIECES_IN_FLIGHT};

/// Rebuilds record what they cannot recover in pages of this many bytes.
const PAGE: u64 = crate::members::badblocks::BAD_PAGE;
/// The smallest piece of a recovery step read and written on its own.
const MIN_PIECE: u64 = 64 << 10;

impl Copies {
    /// Bytes of one background window, in the walk's coordinates: `sync_window_bytes` in whole
    /// recovery units (at least one), as the parity levels size theirs in whole stripes.
    pub(crate) fn window_bytes(&self, array: &Parts) -> u64 {
        let unit = self.recovery_unit();
        (array.config.sync_window_bytes / unit).max(1) * unit
    }

    /// Copy one window of `role` from member byte `pos` (not past `end`) from the other copies
    /// under the locks of the array bytes it holds; returns where the next window starts.
    pub(crate) fn recover_copies(
        &self,
        array: &Parts,
        role: usize,
        pos: u64,
        end: u64,
    ) -> Result<u64, Stop> {
        let off = pos / self.recovery_unit() * self.recovery_unit();
        let len = self.window_bytes(array).min(end - off);
        let spans = self.array_spans_of(role, off, len);
        let ranges: Vec<(u64, u64)> = spans.iter().map(|&(_, at, n)| (at, n)).collect();
        let _guard = (!ranges.is_empty()).then(|| array.range_lock().lock_array_ranges(&ranges));
        // Pieces in flight: one piece's copy is read while another's is written.
        let piece = (len / (2 * PIECES_IN_FLIGHT as u64))
            .next_multiple_of(PAGE)
            .max(MIN_PIECE);
        let pieces: Vec<(u64, u64, u64)> = spans
            .iter()
            .flat_map(|&(m, at, n)| {
                (0..n)
                    .step_by(piece as usize)
                    .map(move |d| (m + d, at + d, piece.min(n - d)))
            })
            .collect();
        let lost = in_pieces(&pieces, PIECES_IN_FLIGHT, array.io.pool(), |&(m, at, n)| {
            self.recover_piece(array, role, at, m, n)
        })?;
        let lost: Vec<u64> = lost.into_iter().flatten().collect();
        array.record_unrebuilt(role, &lost);
        array.members.slots[role].advance(off + len);
        Ok(off + len)
    }

    /// Member bytes `off..off + len` of `role` as `(member byte, array byte, len)` spans, one per
    /// recovery unit at most: a RAID10 member's chunks are not adjacent in the array. Bytes
    /// that hold no array data (past the array's end) are left out.
    fn array_spans_of(&self, role: usize, off: u64, len: u64) -> Vec<(u64, u64, u64)> {
        let unit = self.recovery_unit();
        let mut spans = Vec::new();
        let mut m = off;
        while m < off + len {
            let n = ((m / unit + 1) * unit).min(off + len) - m;
            if let Some(s) = self.g.reverse_copy(role, m / 512) {
                spans.push((m, s * 512, n));
            }
            m += n;
        }
        spans
    }

    /// One window of a resync, check or repair from sync coordinate `pos` (not past `end`):
    /// the next position and the mismatched sectors.
    pub(crate) fn scrub_copies(
        &self,
        array: &Parts,
        action: SyncAction,
        pos: u64,
        end: u64,
    ) -> Result<(u64, u64), Stop> {
        // From `pos`, not from the start of its unit: what lies before it is done, and in a
        // cluster the other nodes keep their writes out of `pos..` only. Ending on a unit
        // boundary, the window leaves the next one starting on one.
        let unit = self.recovery_unit();
        let to = (pos / unit * unit + self.window_bytes(array)).min(end);
        let bad = self.scrub_mirror(array, pos, to - pos, Heal::of(action))?;
        Ok((to, bad))
    }

    /// Copy `len` bytes of `role` at member byte `off` (array byte `at`) from another copy
    /// (the caller holds the region's lock); returns the member bytes of the pages no copy
    /// could give.
    fn recover_piece(
        &self,
        array: &Parts,
        role: usize,
        at: u64,
        off: u64,
        len: u64,
    ) -> Result<Vec<u64>, Stop> {
        let mut buf = array.bufs.get(len as usize);
        let lost = match self.read_other_copy(array, role, at, &mut buf) {
            Ok(()) => Vec::new(),
            Err(Stop::Failed(why)) if !array.is_failed() => {
                tracing::warn!(array = %array.name, offset = at, "rebuild span not whole ({why}): page by page");
                self.read_copies_by_page(array, role, at, off, &mut buf)
            }
            Err(stop) => return Err(stop),
        };
        array.write_rebuilt(role, off, &buf)?;
        Ok(lost)
    }

    /// Verify reads of every copy of the 4 KiB pages under array byte `ranges`, `step` bytes at
    /// a time: mismatched sectors and bytes verified.
    pub(crate) fn verify_copies(
        &self,
        array: &Parts,
        step: u64,
        ranges: &[(u64, u64)],
        fix: bool,
    ) -> Result<(u64, u64)> {
        let heal = if fix { array.heal_mode() } else { Heal::Count };
        let pages = crate::intervals::merge_nonempty(
            ranges
                .iter()
                .map(|&(off, len)| array.personality.sync_range_covering(off, len))
                .collect(),
        );
        let size = array.size_bytes();
        let (mut bad, mut bytes) = (0, 0);
        for (a, b) in pages {
            let b = b.min(size);
            let mut at = a;
            while at < b {
                let len = (step - at % step).min(b - at);
                bad += self
                    .scrub_mirror(array, at, len, heal)
                    .map_err(|e| array.verify_failed(at, len, e))?;
                at += len;
            }
            bytes += b - a;
        }
        Ok((bad, bytes))
    }
}

impl Copies {
    /// Array bytes `at..` (member bytes `off..` of `role`) copied page by page from the other
    /// copies into `buf`; returns the member bytes of the pages no copy could give (left zero).
    fn read_copies_by_page(
        &self,
        array: &Parts,
        role: usize,
        at: u64,
        off: u64,
        buf: &mut [u8],
    ) -> Vec<u64> {
        let mut lost = Vec::new();
        for (k, page) in buf.chunks_mut(PAGE as usize).enumerate() {
            let delta = k as u64 * PAGE;
            if self.read_other_copy(array, role, at + delta, page).is_err() {
                tracing::error!(array = %array.name, offset = at + delta, "rebuild passes an unrecoverable page");
                page.fill(0);
                lost.push(off + delta);
            }
        }
        lost
    }

    /// Read array bytes at `at` from an in-sync copy on any member but `skip` (the caller holds
    /// the region locks). Copies met that fail their records are repaired from a good one, or
    /// the read fails.
    pub(crate) fn read_other_copy(
        &self,
        array: &Parts,
        skip: usize,
        at: u64,
        buf: &mut [u8],
    ) -> Result<(), Stop> {
        let copies = self.g.map_copies(at / 512);
        let mut corrupt = false;
        for c in copies.iter().filter(|c| c.dev != skip) {
            if !array
                .members
                .slot(c.dev)
                .in_sync(c.dev_sector * 512, buf.len() as u64)
            {
                continue;
            }
            let mut io = [MemberIo::read(
                &array.members,
                c.dev,
                c.dev_sector * 512,
                buf,
            )];
            if array.run_io(&mut io) && !corrupt {
                return Ok(());
            }
            corrupt |= io[0].outcome == crate::io::IoOutcome::Corrupt;
        }
        if corrupt {
            // Repair the bad copies on the way (or fail: no copy passed).
            return self
                .settle_copies(array, at, buf.len() as u64, Heal::Repair, Some(buf))
                .map(|_| ())
                .map_err(Stop::Failed);
        }
        Err(Stop::Failed(array.members.unrecoverable(
            at,
            buf.len() as u64,
            &format!("no in-sync copy of array byte {at} left"),
        )))
    }

    /// RAID10 recovery walks member bytes while the bitmap and the used-region map hold array
    /// bytes (md's sync coordinates for RAID10). From `pos`, the member chunks whose array
    /// chunk `idle(at, len)` says needs nothing (up to `SKIP_MAX_BYTES`, and `end`) are
    /// checked again under the lock of the array span they map into; `under_lock(pos, to)`
    /// then runs, and the role's in-sync point moves to `to` before the lock is released, so
    /// a write into those chunks either came before the check or reaches the member after.
    /// `None`: the chunk at `pos` needs work.
    pub(crate) fn skip_raid10_chunks(
        &self,
        array: &Parts,
        role: usize,
        pos: u64,
        end: u64,
        idle: impl Fn(u64, u64) -> bool,
        under_lock: impl FnOnce(u64, u64) -> Result<(), Stop>,
    ) -> Option<Result<u64, Stop>> {
        assert!(array.personality.recovery_maps_chunks());
        let step = array.personality.recovery_unit();
        if !pos.is_multiple_of(step) {
            return None; // resumed mid-chunk (a checkpoint md wrote): the usual way first
        }
        let limit = end.min(pos + crate::policy::bitmap::SKIP_MAX_BYTES);
        let spans = |upto: u64| {
            (pos..upto).step_by(step as usize).map(move |p| {
                let len = step.min(end - p);
                let at = self.g.reverse_copy(role, p / 512).map(|s| s * 512);
                (p, at, len)
            })
        };
        let to = spans(limit)
            .find(|&(_, at, len)| at.is_some_and(|at| !idle(at, len)))
            .map_or(limit, |(p, _, _)| p);
        if to <= pos {
            return None;
        }
        let ranges: Vec<(u64, u64)> = spans(to)
            .filter_map(|(_, at, len)| at.map(|at| (at, len)))
            .collect();
        let _guard = (!ranges.is_empty()).then(|| array.range_lock().lock_array_ranges(&ranges));
        if spans(to).any(|(_, at, len)| at.is_some_and(|at| !idle(at, len))) {
            return None; // a write came in meanwhile: rebuild the usual way
        }
        if let Err(stop) = under_lock(pos, to) {
            return Some(Err(stop));
        }
        array.members.slots[role].advance(to);
        Some(Ok(to))
    }
}

impl Copies {
    /// Bring the copies of array bytes `at..at+len` into agreement (`settle_copies`): check
    /// counts, repair and resync rewrite.
    pub(crate) fn scrub_mirror(
        &self,
        array: &Parts,
        at: u64,
        len: u64,
        heal: Heal,
    ) -> Result<u64, Stop> {
        let _guard = array.range_lock().lock(LockRange::Array { at, len });
        match self.settle_copies(array, at, len, heal, None) {
            Ok(bad) => Ok(bad),
            Err(e) if array.is_failed() => Err(Stop::Failed(e)),
            Err(e) => {
                // Some pages no copy can give: pass them page by page, as a rebuild does.
                tracing::warn!(array = %array.name, offset = at, "scrub span not whole ({e}): page by page");
                let page = crate::members::badblocks::BAD_PAGE;
                let mut bad = 0;
                for off in (at..at + len).step_by(page as usize) {
                    bad += self
                        .settle_copies(array, off, page.min(at + len - off), heal, None)
                        .unwrap_or(0);
                }
                Ok(bad)
            }
        }
    }
}
