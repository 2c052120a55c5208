//! Recovery: a spare takes a missing role and is rebuilt online, window by window.
//!
//! Each window (about `ArrayConfig::sync_window_bytes` of every member) is claimed exactly as client writes claim
//! stripes (mirrors: region locks), read once per member, reconstructed, written to the new
//! member (parity levels in two halves, the second half's reads overlapping the first half's
//! write), and the role's in-sync point is advanced before the claim is released. Client I/O
//! uses the new member only below that point, so nothing the rebuild read earlier can overwrite
//! a newer write. Progress goes to the member's superblock (RECOVERY_OFFSET) every
//! `CHECKPOINT_EVERY` and when the work stops, so a restart resumes where it stopped. Every superblock commit flushes the members first
//! (md's PREFLUSH), so a checkpoint or "in sync" never covers rebuilt data that is not durable.

use crate::array::Array;
use crate::background::Stop;
use crate::io::bufpool::PoolBuf;
use crate::io::commit::WriteSet;
use crate::io::{IoKind, MemberIo};
use crate::lock::LockRange;
use crate::members::FULLY_IN_SYNC;
use crate::personality::raid456::Torn;
use crate::personality::raid456_heal::Heal;
use layout::Level;

/// Rebuilds record what they cannot recover in pages of this many bytes.
const PAGE: u64 = crate::members::badblocks::BAD_PAGE;
/// How often one window's sources are read again while members fail meanwhile.
const MAX_SOURCE_TRIES: usize = 4;

impl Array {
    /// Assign a spare to the first role without a complete member; returns the role to rebuild.
    pub(crate) fn pick_recovery(&self) -> Option<usize> {
        if let Some(role) = self
            .members
            .slots
            .iter()
            .position(|s| !s.is_faulty() && !s.is_complete())
        {
            return Some(role);
        }
        let role = self.members.slots.iter().position(|s| s.is_faulty())?;
        if self.geometry.max_degraded() == 0 {
            return None;
        }
        let spare = {
            let mut spares = self.members.spares.lock();
            if spares.is_empty() {
                return None;
            }
            spares.remove(0)
        };
        let mut meta = self.members.meta.lock();
        meta.activate_spare(spare.dev_number, role as u16);
        if let Some(old) = self.members.slots[role].member() {
            meta.retire(old.dev_number, format::ROLE_FAULTY);
        }
        self.members.slots[role].install(spare.clone(), 0);
        // The tables the new member holds are written at the next flush.
        if let Some(integ) = &self.integrity {
            integ.held_by_new_member(role);
        }
        self.members.commit(meta);
        self.members.events.emit(
            "spare_active",
            &self.name,
            Some(spare.name()),
            format!("spare takes role {role}; rebuilding"),
        );
        Some(role)
    }

    /// Where the rebuild of `role` ends (per-member bytes).
    pub(crate) fn recovery_end(&self, role: usize) -> u64 {
        let g = &self.geometry;
        if g.level().is_parity() {
            g.stripes() * g.chunk_sectors() * 512
        } else {
            g.used_device_sectors(role) * 512
        }
    }

    /// Rebuild one window of `role` starting at `pos`; returns where the next window starts.
    pub(crate) fn recover_window(&self, role: usize, pos: u64, end: u64) -> Result<u64, Stop> {
        if self.geometry.level().is_parity() {
            let chunk = self.geometry.chunk_sectors() * 512;
            let row = pos / chunk;
            let last = (row + self.window_rows()).min(self.geometry.stripes());
            let guard = self.range_lock().lock(LockRange::Stripes {
                first: row,
                end: last,
            });
            let res = self.rebuild_window(role, row, last);
            if res.is_ok() {
                // Under the lock: no write to these stripes can slip in between.
                self.members.slots[role].advance(last * chunk);
            }
            drop(guard);
            res?;
            return Ok(last * chunk);
        }
        let step = self.mirror_step();
        let off = pos / step * step;
        let len = step.min(end - off);
        if let Some(array_sector) = self.geometry.reverse_copy(role, off / 512) {
            let at = array_sector * 512;
            let _guard = self.range_lock().lock(LockRange::Array { at, len });
            let mut buf = self.bufs.get(len as usize);
            let lost = match self.read_other_copy(role, at, &mut buf) {
                Ok(()) => Vec::new(),
                Err(Stop::Failed(why)) if !self.is_failed() => {
                    tracing::warn!(array = %self.name, offset = at, "rebuild span not whole ({why}): page by page");
                    self.read_copies_by_page(role, at, off, &mut buf)
                }
                Err(stop) => return Err(stop),
            };
            self.write_rebuilt(role, off, &buf)?;
            self.record_unrebuilt(role, &lost);
            self.members.slots[role].advance(off + len);
        } else {
            self.members.slots[role].advance(off + len);
        }
        Ok(off + len)
    }

    /// Array bytes `at..` (member bytes `off..` of `role`) copied page by page from the other
    /// copies into `buf`; returns the member bytes of the pages no copy could give (left zero).
    fn read_copies_by_page(&self, role: usize, at: u64, off: u64, buf: &mut [u8]) -> Vec<u64> {
        let mut lost = Vec::new();
        for (k, page) in buf.chunks_mut(PAGE as usize).enumerate() {
            let delta = k as u64 * PAGE;
            if self.read_other_copy(role, at + delta, page).is_err() {
                tracing::error!(array = %self.name, offset = at + delta, "rebuild passes an unrecoverable page");
                page.fill(0);
                lost.push(off + delta);
            }
        }
        lost
    }

    /// Mirror levels walk this many per-member (or array) bytes per window.
    pub(crate) fn mirror_step(&self) -> u64 {
        if self.geometry.level() == Level::Raid1 {
            1 << 20
        } else {
            self.geometry.chunk_sectors() * 512
        }
    }

    /// Write rebuilt bytes to the rebuilding member of `role` (above its in-sync point, so
    /// planned against the role's member as long as it is not faulty).
    fn write_rebuilt(&self, role: usize, offset_bytes: u64, buf: &[u8]) -> Result<(), Stop> {
        let member = self.members.slots[role].usable();
        let mut io = [MemberIo::planned(
            role,
            member,
            offset_bytes,
            IoKind::Write(buf, false),
        )];
        self.commit_writes(&WriteSet::rebuild(offset_bytes, buf.len() as u64), &mut io)
            .map_err(Stop::Failed)?;
        if !io[0].ok() {
            return Err(Stop::Failed(self.unrecoverable(
                offset_bytes,
                buf.len() as u64,
                "write to the rebuilding member failed",
            )));
        }
        Ok(())
    }

    /// The rebuild of `role` reached the end: record it in sync. The superblock commit flushes
    /// every member first, so "in sync" is durable only after the rebuilt data is.
    pub(crate) fn finish_recovery(&self, role: usize) {
        // The records of what the rebuild wrote are durable before the member counts as whole.
        self.write_integrity_tables();
        let mut meta = self.members.meta.lock();
        self.members.slots[role].advance(FULLY_IN_SYNC);
        if let Some(m) = self.members.slots[role].member() {
            meta.set_recovery(m.dev_number, None);
        }
        self.members.commit(meta);
        let name = self.members.slots[role]
            .member()
            .map(|m| m.name().to_string());
        self.members.events.emit(
            "member_in_sync",
            &self.name,
            name.as_deref(),
            format!("role {role} rebuilt"),
        );
    }

    /// Record how far a rebuild got in the rebuilding member's superblock. The commit flushes
    /// the members first: the checkpoint never covers rebuilt data still in a volatile cache.
    pub(crate) fn checkpoint_recovery(&self, role: usize) {
        let slot = &self.members.slots[role];
        let Some(m) = slot.member() else { return };
        if slot.is_faulty() || slot.is_complete() {
            return;
        }
        self.write_integrity_tables();
        let mut meta = self.members.meta.lock();
        meta.set_recovery(m.dev_number, Some(slot.in_sync_bytes() / 512));
        self.members.commit(meta);
    }

    /// Stripes per unit of background work: about `sync_window_bytes` of each member.
    pub(crate) fn window_rows(&self) -> u64 {
        (self.config.sync_window_bytes / (self.geometry.chunk_sectors() * 512)).max(1)
    }

    /// Read every usable member over stripes `r0..r1` (one I/O per member) and reconstruct
    /// each stripe's missing chunks. `Ok(None)`: a member failed meanwhile; try again.
    pub(crate) fn read_window(
        &self,
        r0: u64,
        r1: u64,
        heal: Heal,
    ) -> Result<Option<Vec<PoolBuf>>, Stop> {
        let chunk = self.geometry.chunk_sectors() * 512;
        self.read_span(r0 * chunk, (r1 - r0) * chunk, heal)
    }

    /// [`Array::read_window`] over member bytes `at..at + len`: whole rows or parts of rows
    /// (whole pages), each row's missing blocks reconstructed from the same bytes of the others.
    pub(crate) fn read_span(
        &self,
        at: u64,
        len: u64,
        heal: Heal,
    ) -> Result<Option<Vec<PoolBuf>>, Stop> {
        self.read_rebuilt(at, len as usize, heal, Torn::Pass)
            .map_err(Stop::Failed)
    }

    /// Rebuild `role`'s chunks of stripes `r0..r1` (claimed by the caller), in two halves
    /// whose I/O overlaps: the reads of the second half (other members) run while the first
    /// half's write to the new member is on its way, as a reader and a writer would run side by
    /// side. Both writes have ended when this returns; the caller moves the in-sync point.
    pub(crate) fn rebuild_window(&self, role: usize, r0: u64, r1: u64) -> Result<(), Stop> {
        let chunk = self.geometry.chunk_sectors() * 512;
        let mid = r0 + (r1 - r0).div_ceil(2);
        std::thread::scope(|scope| {
            let mut writing: Option<std::thread::ScopedJoinHandle<'_, Result<(), Stop>>> = None;
            let mut lost: Vec<u64> = Vec::new();
            for (a, b) in [(r0, mid), (mid, r1)].into_iter().filter(|(a, b)| a < b) {
                let (bufs, gone) = self.read_rebuild_sources(a, b)?;
                lost.extend(gone);
                if let Some(w) = writing.take() {
                    w.join().expect("rebuild writer panicked")?;
                }
                let write = move || self.write_rebuilt(role, a * chunk, &bufs[role]);
                if self.is_deterministic() {
                    write()?;
                } else {
                    writing = Some(scope.spawn(write));
                }
            }
            writing.map_or(Ok(()), |w| w.join().expect("rebuild writer panicked"))?;
            // After the writes (a write clears what it covers), before the in-sync point
            // passes them: what could not be rebuilt reads as EIO, never as what was written.
            self.record_unrebuilt(role, &lost);
            Ok(())
        })
    }

    /// Record pages (member bytes) the rebuild of `role` could not rebuild as bad blocks on
    /// its new member. Where the page was data a crash may have torn, the row's parity is
    /// recorded bad too: it was computed with the lost bytes as they were before or after the
    /// crash, nobody knows which, so a reconstruction from it is a guess as well (writes of
    /// the row's other data then leave it as it is; a write of the lost data makes it whole).
    fn record_unrebuilt(&self, role: usize, lost: &[u64]) {
        for (at, len) in page_runs(lost) {
            if let Some(member) = self.members.slots[role].usable() {
                self.members.record_bad_blocks(
                    role,
                    &member,
                    at,
                    len,
                    "the rebuild could not recover it from the other members",
                );
            }
            if self.geometry.level().is_parity() && self.integrity.is_none() {
                self.record_torn_parity(role, at, len);
            }
        }
    }

    /// The parity of the rows of member bytes `at..at + len` a crash may have torn where
    /// `role` holds data, recorded bad.
    fn record_torn_parity(&self, role: usize, at: u64, len: u64) {
        let chunk = self.geometry.chunk_sectors() * 512;
        for (row, r) in row_pieces(at, len, chunk) {
            let roles = self.geometry.stripe_roles(row);
            let holds_data = (0..self.geometry.data_disks()).any(|d| roles.data_dev(d) == role);
            if !holds_data || !self.row_exposed(row) {
                continue;
            }
            for dev in std::iter::once(roles.p_dev()).chain(roles.q_dev()) {
                if let Some(member) = self.members.slots[dev].usable() {
                    self.members.record_bad_blocks(
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

    /// [`Array::read_window`] over stripes `r0..r1`, again while members fail meanwhile. When
    /// the window cannot be rebuilt whole (unreadable or corrupt blocks beyond redundancy), it
    /// is read page by page: the pages that cannot be rebuilt are returned (member bytes) and
    /// the rebuild goes on past them, as md's recovery does.
    fn read_rebuild_sources(&self, r0: u64, r1: u64) -> Result<(Vec<PoolBuf>, Vec<u64>), Stop> {
        for _ in 0..MAX_SOURCE_TRIES {
            match self.read_window(r0, r1, Heal::Repair) {
                Ok(Some(bufs)) => return Ok((bufs, Vec::new())),
                Ok(None) => {}
                Err(Stop::Failed(why)) if self.sources_left(r0, r1) => {
                    tracing::warn!(array = %self.name, row = r0, "rebuild window not whole ({why}): page by page");
                    return self.read_sources_by_page(r0, r1);
                }
                Err(stop) => return Err(stop),
            }
        }
        let chunk = self.geometry.chunk_sectors() * 512;
        Err(Stop::Failed(self.unrecoverable(
            r0 * chunk,
            (r1 - r0) * chunk,
            "members kept failing",
        )))
    }

    /// Enough members remain over stripes `r0..r1` for the level to rebuild what is missing:
    /// what failed there is blocks, not members.
    pub(crate) fn sources_left(&self, r0: u64, r1: u64) -> bool {
        let chunk = self.geometry.chunk_sectors() * 512;
        let (at, len) = (r0 * chunk, (r1 - r0) * chunk);
        let absent = (0..self.geometry.raid_disks())
            .filter(|&dev| !self.members.slot(dev).in_sync(at, len))
            .count();
        !self.is_failed() && absent <= self.geometry.max_degraded()
    }

    /// Stripes `r0..r1` read and rebuilt one 4 KiB page row at a time; returns the buffers (as
    /// [`Array::read_window`]) and the pages that could not be rebuilt (left zero).
    pub(crate) fn read_sources_by_page(
        &self,
        r0: u64,
        r1: u64,
    ) -> Result<(Vec<PoolBuf>, Vec<u64>), Stop> {
        let chunk = self.geometry.chunk_sectors() * 512;
        let len = ((r1 - r0) * chunk) as usize;
        let mut bufs: Vec<PoolBuf> = (0..self.geometry.raid_disks())
            .map(|_| {
                let mut b = self.bufs.get(len);
                b.fill(0);
                b
            })
            .collect();
        let mut lost = Vec::new();
        for at in (r0 * chunk..r1 * chunk).step_by(PAGE as usize) {
            let i = (at - r0 * chunk) as usize;
            match self.read_source_page(at)? {
                Some(page) => {
                    for (dev, b) in page.iter().enumerate() {
                        bufs[dev][i..i + PAGE as usize].copy_from_slice(b);
                    }
                }
                None => lost.push(at),
            }
        }
        assert!(
            lost.len() <= len / PAGE as usize,
            "more lost pages than the window holds"
        );
        Ok((bufs, lost))
    }

    /// One page row at member byte `at`, rebuilt; `None`: it cannot be (the error is logged).
    fn read_source_page(&self, at: u64) -> Result<Option<Vec<PoolBuf>>, Stop> {
        let row = at / (self.geometry.chunk_sectors() * 512);
        for _ in 0..MAX_SOURCE_TRIES {
            match self.read_rebuilt(at, PAGE as usize, self.heal_mode(), Torn::Pass) {
                Ok(Some(bufs)) => return Ok(Some(bufs)),
                Ok(None) => continue,
                Err(e) if self.sources_left(row, row + 1) => {
                    tracing::error!(array = %self.name, offset = at, "rebuild passes an unrecoverable page: {e}");
                    return Ok(None);
                }
                Err(e) => return Err(Stop::Failed(e)),
            }
        }
        Err(Stop::Failed(self.unrecoverable(
            at,
            PAGE,
            "members kept failing",
        )))
    }

    /// Read array bytes at `at` from an in-sync copy on any member but `skip` (the caller holds
    /// the region locks). Copies met that fail their records are repaired from a good one, or
    /// the read fails.
    pub(crate) fn read_other_copy(&self, skip: usize, at: u64, buf: &mut [u8]) -> Result<(), Stop> {
        let copies = self.geometry.map_copies(at / 512);
        let mut corrupt = false;
        for c in copies.iter().filter(|c| c.dev != skip) {
            if !self
                .members
                .slot(c.dev)
                .in_sync(c.dev_sector * 512, buf.len() as u64)
            {
                continue;
            }
            let mut io = [self.read_io(c.dev, c.dev_sector * 512, buf)];
            if self.run_io(&mut io) && !corrupt {
                return Ok(());
            }
            corrupt |= io[0].outcome == crate::io::IoOutcome::Corrupt;
        }
        if corrupt {
            // Repair the bad copies on the way (or fail: no copy passed).
            return self
                .settle_copies(at, buf.len() as u64, Heal::Repair, Some(buf))
                .map(|_| ())
                .map_err(Stop::Failed);
        }
        Err(Stop::Failed(self.unrecoverable(
            at,
            buf.len() as u64,
            &format!("no in-sync copy of array byte {at} left"),
        )))
    }
}

impl Array {
    /// RAID10 recovery walks member bytes while the bitmap and the used-region map hold array
    /// bytes (md's sync coordinates for RAID10). From `pos`, the member chunks whose array
    /// chunk `idle(at, len)` says needs nothing (up to `SKIP_MAX_BYTES`, and `end`) are
    /// checked again under the lock of the array span they map into; `under_lock(pos, to)`
    /// then runs, and the role's in-sync point moves to `to` before the lock is released, so
    /// a write into those chunks either came before the check or reaches the member after.
    /// `None`: the chunk at `pos` needs work.
    pub(crate) fn skip_raid10_chunks(
        &self,
        role: usize,
        pos: u64,
        end: u64,
        idle: impl Fn(u64, u64) -> bool,
        under_lock: impl FnOnce(u64, u64) -> Result<(), Stop>,
    ) -> Option<Result<u64, Stop>> {
        assert_eq!(self.geometry.level(), Level::Raid10);
        let step = self.mirror_step();
        if !pos.is_multiple_of(step) {
            return None; // resumed mid-chunk (a checkpoint md wrote): the usual way first
        }
        let limit = end.min(pos + crate::policy::bitmap::SKIP_MAX_BYTES);
        let spans = |upto: u64| {
            (pos..upto).step_by(step as usize).map(move |p| {
                let len = step.min(end - p);
                let at = self.geometry.reverse_copy(role, p / 512).map(|s| s * 512);
                (p, at, len)
            })
        };
        let to = spans(limit)
            .find(|&(_, at, len)| at.is_some_and(|at| !idle(at, len)))
            .map_or(limit, |(p, _, _)| p);
        if to <= pos {
            return None;
        }
        let (lo, hi) = spans(to)
            .filter_map(|(_, at, len)| at.map(|at| (at, at + len)))
            .fold((u64::MAX, 0), |(lo, hi), (a, b)| (lo.min(a), hi.max(b)));
        let _guard = (lo < hi).then(|| {
            self.range_lock().lock(LockRange::Array {
                at: lo,
                len: hi - lo,
            })
        });
        if spans(to).any(|(_, at, len)| at.is_some_and(|at| !idle(at, len))) {
            return None; // a write came in meanwhile: rebuild the usual way
        }
        if let Err(stop) = under_lock(pos, to) {
            return Some(Err(stop));
        }
        self.members.slots[role].advance(to);
        Some(Ok(to))
    }
}

/// Member bytes `at..at + len` cut at row boundaries (`chunk` bytes of each member): each row
/// with its piece's range in a buffer that starts at `at`.
/// Sorted page offsets as runs of contiguous pages: (start, length).
fn page_runs(pages: &[u64]) -> Vec<(u64, u64)> {
    let mut runs: Vec<(u64, u64)> = Vec::new();
    for &at in pages {
        match runs.last_mut() {
            Some((start, len)) if *start + *len == at => *len += PAGE,
            _ => runs.push((at, PAGE)),
        }
    }
    runs
}

pub(crate) fn row_pieces(
    at: u64,
    len: u64,
    chunk: u64,
) -> impl Iterator<Item = (u64, std::ops::Range<usize>)> {
    let end = at + len;
    let mut pos = at;
    std::iter::from_fn(move || {
        (pos < end).then(|| {
            let row = pos / chunk;
            let stop = ((row + 1) * chunk).min(end);
            let piece = (pos - at) as usize..(stop - at) as usize;
            pos = stop;
            (row, piece)
        })
    })
}
