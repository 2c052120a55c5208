//! The parity levels' background windows: recovery rebuilds a role's chunks of a run of stripes
//! from the others, resync and check/repair compare parity with the data, verify reads do the
//! same over the page rows under a client's ranges. Each window takes the stripes' claims as
//! client writes do (the walker that schedules and paces windows is `background/`).

use crate::error::Result;
use crate::io::bufpool::PoolBuf;
use crate::io::commit::WriteSet;
use crate::io::MemberIo;
use crate::lock::LockRange;
use crate::personality::parts::Parts;
use crate::personality::raid456::row_pieces;
use crate::personality::raid456::Torn;
use crate::personality::raid456_heal::Heal;
use crate::personality::Parity;
use crate::work::{in_pieces, Stop, SyncAction, PIECES_IN_FLIGHT};

/// Rebuilds record what they cannot recover in pages of this many bytes.
const PAGE: u64 = crate::members::badblocks::BAD_PAGE;
/// How often one window's sources are read again while members fail meanwhile.
const MAX_SOURCE_TRIES: usize = 4;
/// Member buffers the pieces of one window in flight hold at most together (a wide array's
/// window runs fewer pieces at once).
const PIECE_BUFFER_BYTES: u64 = 32 << 20;
/// Member bytes a rebuild piece reads of each member (64 KiB to 512 KiB measured the same on
/// tmpfs members; several in flight hide a remote member's round trip).
const REBUILD_PIECE_BYTES: u64 = 256 << 10;

impl Parity {
    /// Rebuild `role`'s chunks of the stripes from member byte `pos` on (not past `end`), one
    /// window under the stripes' claims; returns where the next window starts.
    pub(crate) fn recover_rows(
        &self,
        array: &Parts,
        role: usize,
        pos: u64,
        end: u64,
    ) -> Result<u64, Stop> {
        let chunk = self.g.chunk_sectors() * 512;
        let row = pos / chunk;
        let last = (row + self.window_rows(array))
            .min(self.g.stripes())
            .min(end.div_ceil(chunk))
            .max(row + 1);
        let guard = array.range_lock().lock(LockRange::Stripes {
            first: row,
            end: last,
        });
        let res = self.rebuild_window(array, role, row, last);
        if res.is_ok() {
            // Under the lock: no write to these stripes can slip in between.
            array.members.slots[role].advance(last * chunk);
        }
        drop(guard);
        res?;
        Ok(last * chunk)
    }

    /// One window of a resync, check or repair from member byte `pos` (not past `end`): the
    /// next position and the mismatched sectors.
    pub(crate) fn scrub_rows(
        &self,
        array: &Parts,
        action: SyncAction,
        pos: u64,
        end: u64,
    ) -> Result<(u64, u64), Stop> {
        let fix = action != SyncAction::Check;
        let heal = Heal::of(action);
        let chunk = self.g.chunk_sectors() * 512;
        let row = pos / chunk;
        // Not past `end`: a bitmap-guided resync stops where the dirty chunks do.
        let last = (row + self.window_rows(array))
            .min(self.g.stripes())
            .min(end.div_ceil(chunk));
        let guard = array.range_lock().lock(LockRange::Stripes {
            first: row,
            end: last,
        });
        let res = self.scrub_window(array, row, last, fix, heal);
        drop(guard);
        Ok((last * chunk, res?))
    }

    /// Verify reads of the page rows under array byte `ranges`: mismatched sectors and bytes
    /// verified.
    pub(crate) fn verify_rows(
        &self,
        array: &Parts,
        ranges: &[(u64, u64)],
        fix: bool,
    ) -> Result<(u64, u64)> {
        let spans = crate::intervals::merge_nonempty(
            ranges
                .iter()
                .flat_map(|&(off, len)| self.page_rows(array, off, len))
                .collect(),
        );
        let data_disks = self.g.data_disks() as u64;
        let (mut bad, mut bytes) = (0, 0);
        for (a, b) in spans {
            bad += self.verify_span(array, a, b, fix)?;
            bytes += (b - a) * data_disks;
        }
        Ok((bad, bytes))
    }
}

impl Parity {
    /// Stripes per unit of background work: about `sync_window_bytes` of each member.
    pub(crate) fn window_rows(&self, array: &Parts) -> u64 {
        (array.config.sync_window_bytes / (self.g.chunk_sectors() * 512)).max(1)
    }

    /// Read every usable member over stripes `r0..r1` (one I/O per member) and reconstruct
    /// each stripe's missing chunks. `Ok(None)`: a member failed meanwhile; try again.
    pub(crate) fn read_window(
        &self,
        array: &Parts,
        r0: u64,
        r1: u64,
        heal: Heal,
    ) -> Result<Option<Vec<PoolBuf>>, Stop> {
        let chunk = self.g.chunk_sectors() * 512;
        self.read_span(array, r0 * chunk, (r1 - r0) * chunk, heal)
    }

    /// [`Parity::read_window`] over member bytes `at..at + len`: whole rows or parts of rows
    /// (whole pages), each row's missing blocks reconstructed from the same bytes of the others.
    pub(crate) fn read_span(
        &self,
        array: &Parts,
        at: u64,
        len: u64,
        heal: Heal,
    ) -> Result<Option<Vec<PoolBuf>>, Stop> {
        self.read_rebuilt(array, at, len as usize, heal, Torn::Pass)
            .map_err(Stop::Failed)
    }

    /// Rows `r0..r1` cut into pieces of whole rows for [`in_pieces`], and how many of them
    /// may be in flight at once within [`PIECE_BUFFER_BYTES`].
    fn window_pieces(&self, r0: u64, r1: u64) -> (Vec<(u64, u64)>, usize) {
        let chunk = self.g.chunk_sectors() * 512;
        let step = (r1 - r0).div_ceil(2 * PIECES_IN_FLIGHT as u64).max(1);
        let pieces = (r0..r1)
            .step_by(step as usize)
            .map(|a| (a, (a + step).min(r1)));
        (pieces.collect(), self.pieces_at_once(step * chunk))
    }

    /// Pieces of `bytes` per member in flight at once within [`PIECE_BUFFER_BYTES`].
    fn pieces_at_once(&self, bytes: u64) -> usize {
        let held = bytes * self.g.raid_disks() as u64;
        (PIECE_BUFFER_BYTES / held).max(1) as usize
    }

    /// Rebuild `role`'s chunks of stripes `r0..r1` (claimed by the caller), piece by piece with
    /// several pieces in flight ([`in_pieces`]): one piece's reads of the other members run
    /// while another's parity is computed and a third's rebuilt chunks are written to the new
    /// member. Every write has ended when this returns; the caller moves the in-sync point.
    pub(crate) fn rebuild_window(
        &self,
        array: &Parts,
        role: usize,
        r0: u64,
        r1: u64,
    ) -> Result<(), Stop> {
        let chunk = self.g.chunk_sectors() * 512;
        // Pieces of bytes, not of rows: a window of one large chunk's row has several too.
        let piece = REBUILD_PIECE_BYTES;
        let pieces: Vec<u64> = (r0 * chunk..r1 * chunk).step_by(piece as usize).collect();
        let at_once = self.pieces_at_once(piece);
        let lost = in_pieces(&pieces, at_once, array.io.pool(), |&at| {
            let end = (at + piece).min(r1 * chunk);
            let (bufs, gone) = self.read_rebuild_sources(array, at, end)?;
            array.write_rebuilt(role, at, &bufs[role])?;
            Ok(gone)
        })?;
        // After the writes (a write clears what it covers), before the in-sync point passes
        // them: what could not be rebuilt reads as EIO, never as what was written. Where the
        // page was data a crash may have torn, the row's parity is recorded bad too: it was
        // computed with the lost bytes as they were before or after the crash, nobody knows
        // which, so a reconstruction from it is a guess as well (writes of the row's other
        // data then leave it as it is; a write of the lost data makes it whole). Integrity
        // records tell the two apart instead.
        let lost: Vec<u64> = lost.into_iter().flatten().collect();
        for (at, len) in array.record_unrebuilt(role, &lost) {
            if array.integrity.is_none() {
                self.record_torn_parity(array, role, at, len);
            }
        }
        Ok(())
    }

    /// The parity of the rows of member bytes `at..at + len` a crash may have torn where
    /// `role` holds data, recorded bad.
    fn record_torn_parity(&self, array: &Parts, role: usize, at: u64, len: u64) {
        let chunk = self.g.chunk_sectors() * 512;
        for (row, r) in row_pieces(at, len, chunk) {
            let roles = self.g.stripe_roles(row);
            let holds_data = (0..self.g.data_disks()).any(|d| roles.data_dev(d) == role);
            if !holds_data || !self.row_exposed(array, row) {
                continue;
            }
            for dev in std::iter::once(roles.p_dev()).chain(roles.q_dev()) {
                if let Some(member) = array.members.slots[dev].usable() {
                    array.members.record_bad_blocks(
                        dev,
                        &member,
                        at + r.start as u64,
                        r.len() as u64,
                        "parity of a row a crash may have torn whose lost data it covers",
                    );
                }
            }
        }
    }

    /// [`Parity::read_span`] over member bytes `at..end`, again while members fail meanwhile.
    /// When the span cannot be rebuilt whole (unreadable or corrupt blocks beyond redundancy),
    /// it is read page by page: the pages that cannot be rebuilt are returned (member bytes)
    /// and the rebuild goes on past them, as md's recovery does.
    fn read_rebuild_sources(
        &self,
        array: &Parts,
        at: u64,
        end: u64,
    ) -> Result<(Vec<PoolBuf>, Vec<u64>), Stop> {
        for _ in 0..MAX_SOURCE_TRIES {
            match self.read_span(array, at, end - at, Heal::Repair) {
                Ok(Some(bufs)) => return Ok((bufs, Vec::new())),
                Ok(None) => {}
                Err(Stop::Failed(why)) if self.sources_left(array, at, end) => {
                    tracing::warn!(array = %array.name, offset = at, "rebuild span not whole ({why}): page by page");
                    return self.read_sources_by_page(array, at, end);
                }
                Err(stop) => return Err(stop),
            }
        }
        Err(Stop::Failed(array.members.unrecoverable(
            at,
            end - at,
            "members kept failing",
        )))
    }

    /// Enough members remain over member bytes `at..end` for the level to rebuild what is
    /// missing: what failed there is blocks, not members.
    pub(crate) fn sources_left(&self, array: &Parts, at: u64, end: u64) -> bool {
        let absent = (0..self.g.raid_disks())
            .filter(|&dev| !array.members.slot(dev).in_sync(at, end - at))
            .count();
        !array.is_failed() && absent <= array.personality.redundancy()
    }

    /// Member bytes `at..end` (whole pages) read and rebuilt one 4 KiB page row at a time;
    /// returns the buffers (as [`Parity::read_span`]) and the pages that could not be rebuilt
    /// (left zero).
    pub(crate) fn read_sources_by_page(
        &self,
        array: &Parts,
        at: u64,
        end: u64,
    ) -> Result<(Vec<PoolBuf>, Vec<u64>), Stop> {
        let len = (end - at) as usize;
        let mut bufs: Vec<PoolBuf> = (0..self.g.raid_disks())
            .map(|_| {
                let mut b = array.bufs.get(len);
                b.fill(0);
                b
            })
            .collect();
        let mut lost = Vec::new();
        for page_at in (at..end).step_by(PAGE as usize) {
            let i = (page_at - at) as usize;
            match self.read_source_page(array, page_at)? {
                Some(page) => {
                    for (dev, b) in page.iter().enumerate() {
                        bufs[dev][i..i + PAGE as usize].copy_from_slice(b);
                    }
                }
                None => lost.push(page_at),
            }
        }
        assert!(
            lost.len() <= len / PAGE as usize,
            "more lost pages than the span holds"
        );
        Ok((bufs, lost))
    }

    /// One page row at member byte `at`, rebuilt; `None`: it cannot be (the error is logged).
    fn read_source_page(&self, array: &Parts, at: u64) -> Result<Option<Vec<PoolBuf>>, Stop> {
        let chunk = self.g.chunk_sectors() * 512;
        let row = at / chunk * chunk;
        for _ in 0..MAX_SOURCE_TRIES {
            match self.read_rebuilt(array, at, PAGE as usize, array.heal_mode(), Torn::Pass) {
                Ok(Some(bufs)) => return Ok(Some(bufs)),
                Ok(None) => continue,
                Err(e) if self.sources_left(array, row, row + chunk) => {
                    tracing::error!(array = %array.name, offset = at, "rebuild passes an unrecoverable page: {e}");
                    return Ok(None);
                }
                Err(e) => return Err(Stop::Failed(e)),
            }
        }
        Err(Stop::Failed(array.members.unrecoverable(
            at,
            PAGE,
            "members kept failing",
        )))
    }
}

impl Parity {
    /// Compare the parity of stripes `r0..r1` with their data; rewrite it where it differs if
    /// `fix`. Returns mismatched sectors, counted per 4 KiB page as md does. With integrity
    /// records every block is verified first, and what fails is handled as `raid456_heal` says.
    pub(crate) fn scrub_window(
        &self,
        array: &Parts,
        r0: u64,
        r1: u64,
        fix: bool,
        heal: Heal,
    ) -> Result<u64, Stop> {
        let chunk = self.g.chunk_sectors() * 512;
        let (pieces, at_once) = self.window_pieces(r0, r1);
        let bad = in_pieces(&pieces, at_once, array.io.pool(), |&(a, b)| {
            // Pages nothing can rebuild (recorded bad blocks) are passed, as a rebuild passes
            // them: neither counted nor rewritten (a parity write there would clear a record).
            let (bufs, lost) = match self.read_window(array, a, b, heal) {
                Ok(Some(bufs)) => (bufs, Vec::new()),
                Ok(None) => return Err(Stop::Interrupted),
                Err(Stop::Failed(_)) if self.sources_left(array, a * chunk, b * chunk) => {
                    self.read_sources_by_page(array, a * chunk, b * chunk)?
                }
                Err(stop) => return Err(stop),
            };
            self.compare_span(array, a * chunk, &bufs, &lost, fix)
        })?;
        Ok(bad.iter().sum())
    }

    /// Compare parity with data over member bytes `at..at + len` (whole pages, parts of rows
    /// allowed: a verify read's 4 KiB page rows); rewrite it where it differs if `fix`. The
    /// caller holds the rows' claims.
    pub(crate) fn scrub_span(
        &self,
        array: &Parts,
        at: u64,
        len: u64,
        fix: bool,
        heal: Heal,
    ) -> Result<u64, Stop> {
        let Some(bufs) = self.read_span(array, at, len, heal)? else {
            return Err(Stop::Interrupted);
        };
        self.compare_span(array, at, &bufs, &[], fix)
    }

    /// The parity comparison of [`Personality::scrub_window`] over the member bytes `bufs` hold from
    /// `at`, row by row. `lost` pages (member bytes) are passed: neither counted nor rewritten,
    /// nor is the rest of their row's parity (a parity write there would clear a record).
    fn compare_span(
        &self,
        array: &Parts,
        at: u64,
        bufs: &[PoolBuf],
        lost: &[u64],
        fix: bool,
    ) -> Result<u64, Stop> {
        let chunk = self.g.chunk_sectors() * 512;
        let mut bad = 0u64;
        for (row, r) in row_pieces(at, bufs[0].len() as u64, chunk) {
            let roles = self.g.stripe_roles(row);
            let cut = |dev: usize| &bufs[dev][r.clone()];
            let data: Vec<&[u8]> = (0..self.g.data_disks())
                .map(|d| cut(roles.data_dev(d)))
                .collect();
            let (p, q) = self.compute_parity(array, &roles, &data);
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
                let mut ios = vec![MemberIo::write(
                    &array.members,
                    roles.p_dev(),
                    piece_at,
                    &p,
                    false,
                )];
                if let (Some(qd), Some(qb)) = (roles.q_dev(), q.as_ref()) {
                    ios.push(MemberIo::write(&array.members, qd, piece_at, qb, false));
                }
                array
                    .commit
                    .writes(array, &WriteSet::repair(piece_at, r.len() as u64), &mut ios)
                    .map_err(Stop::Failed)?;
            }
            bad += row_bad;
        }
        Ok(bad)
    }
}

impl Parity {
    /// The member bytes (whole 4 KiB pages, the same on every member) of the page rows under
    /// array bytes `off..off + len`: md checks a stripe 4 KiB at a time (`STRIPE_SIZE`), and so
    /// a verify read costs what was in flight, not whole chunk rows.
    fn page_rows(&self, array: &Parts, off: u64, len: u64) -> Vec<(u64, u64)> {
        const PAGE: u64 = 4096;
        let chunk = self.g.chunk_sectors() * 512;
        let data_disks = self.g.data_disks() as u64;
        let end = ((off + len).div_ceil(PAGE) * PAGE).min(array.size_bytes());
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
    fn verify_span(&self, array: &Parts, a: u64, b: u64, fix: bool) -> Result<u64> {
        let chunk = self.g.chunk_sectors() * 512;
        let window = self.window_rows(array) * chunk;
        // After an unclean stop, blocks that fail their records in rows a crash may have torn
        // are unflushed writes: settled as found, as the resync would (see `raid456_heal`).
        let heal = if fix { array.heal_mode() } else { Heal::Count };
        let mut bad = 0;
        let mut at = a;
        while at < b {
            let end = ((at / window + 1) * window).min(b);
            let mut tries = 0;
            let found = loop {
                // A repair rewrites parity: no other node may write these stripes meanwhile.
                let owned = crate::cluster::OwnedStripes::take_or_refuse(
                    array.members.coordinator(),
                    &array.name,
                    at / chunk,
                    end.div_ceil(chunk),
                    chunk,
                )?;
                let guard = array.range_lock().lock(LockRange::Stripes {
                    first: at / chunk,
                    end: end.div_ceil(chunk),
                });
                let res = self.scrub_span(array, at, end - at, fix, heal);
                drop(guard);
                drop(owned);
                match res {
                    // A member failed while being read: plan again without it.
                    Err(Stop::Interrupted) if tries < 4 => tries += 1,
                    other => break other,
                }
            };
            let rows = at / chunk * chunk * self.g.data_disks() as u64;
            bad += found.map_err(|e| array.verify_failed(rows, end - at, e))?;
            at = end;
        }
        Ok(bad)
    }
}
