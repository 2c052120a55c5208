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
use crate::bufpool::PoolBuf;
use crate::commit::WriteSet;
use crate::heal::Heal;
use crate::io::{IoKind, MemberIo};
use crate::member::FULLY_IN_SYNC;
use crate::sync::Stop;
use layout::Level;

impl Array {
    /// Assign a spare to the first role without a complete member; returns the role to rebuild.
    pub(crate) fn pick_recovery(&self) -> Option<usize> {
        if let Some(role) = self
            .slots
            .iter()
            .position(|s| !s.is_faulty() && !s.is_complete())
        {
            return Some(role);
        }
        let role = self.slots.iter().position(|s| s.is_faulty())?;
        if self.geometry.max_degraded() == 0 {
            return None;
        }
        let spare = {
            let mut spares = self.spares.lock();
            if spares.is_empty() {
                return None;
            }
            spares.remove(0)
        };
        let mut meta = self.meta.lock();
        meta.activate_spare(spare.dev_number, role as u16);
        if let Some(old) = self.slots[role].member() {
            meta.retire(old.dev_number, format::ROLE_FAULTY);
        }
        self.slots[role].install(spare.clone(), 0);
        // The tables the new member holds are written at the next flush.
        if let Some(integ) = &self.integrity {
            integ.held_by_new_member(role);
        }
        let failed = meta.commit();
        drop(meta);
        self.fail_members_after_sb_error(failed);
        self.events.emit(
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
            let guard = self.lock_stripes(row, last);
            let res = self.rebuild_window(role, row, last);
            if res.is_ok() {
                // Under the lock: no write to these stripes can slip in between.
                self.slots[role].advance(last * chunk);
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
            let _guard = self.lock_array_range(at, len);
            let mut buf = self.bufs.get(len as usize);
            self.read_other_copy(role, at, &mut buf)?;
            self.write_rebuilt(role, off, &buf)?;
            self.slots[role].advance(off + len);
        } else {
            self.slots[role].advance(off + len);
        }
        Ok(off + len)
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
        let member = self.slots[role].usable();
        let mut io = [MemberIo::planned(
            role,
            member,
            offset_bytes,
            IoKind::Write(buf, false),
        )];
        self.commit_writes(&WriteSet::rebuild(offset_bytes, buf.len() as u64), &mut io)
            .map_err(|e| Stop::Failed(e.to_string()))?;
        if !io[0].ok() {
            return Err(Stop::Failed("write to the rebuilding member failed".into()));
        }
        Ok(())
    }

    /// The rebuild of `role` reached the end: record it in sync. The superblock commit flushes
    /// every member first, so "in sync" is durable only after the rebuilt data is.
    pub(crate) fn finish_recovery(&self, role: usize) {
        // The records of what the rebuild wrote are durable before the member counts as whole.
        self.write_integrity_tables();
        let mut meta = self.meta.lock();
        self.slots[role].advance(FULLY_IN_SYNC);
        if let Some(m) = self.slots[role].member() {
            meta.set_recovery(m.dev_number, None);
        }
        let failed = meta.commit();
        drop(meta);
        self.fail_members_after_sb_error(failed);
        let name = self.slots[role].member().map(|m| m.name().to_string());
        self.events.emit(
            "member_in_sync",
            &self.name,
            name.as_deref(),
            format!("role {role} rebuilt"),
        );
    }

    /// Record how far a rebuild got in the rebuilding member's superblock. The commit flushes
    /// the members first: the checkpoint never covers rebuilt data still in a volatile cache.
    pub(crate) fn checkpoint_recovery(&self, role: usize) {
        let slot = &self.slots[role];
        let Some(m) = slot.member() else { return };
        if slot.is_faulty() || slot.is_complete() {
            return;
        }
        self.write_integrity_tables();
        let mut meta = self.meta.lock();
        meta.set_recovery(m.dev_number, Some(slot.in_sync_bytes() / 512));
        let failed = meta.commit();
        drop(meta);
        self.fail_members_after_sb_error(failed);
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
        let chunk = (self.geometry.chunk_sectors() * 512) as usize;
        let (at, len) = (r0 * chunk as u64, (r1 - r0) as usize * chunk);
        let found = self
            .read_present(at, len, heal)
            .map_err(|e| Stop::Failed(e.to_string()))?;
        let Some((mut bufs, missing)) = found else {
            return Ok(None);
        };
        for (i, row) in (r0..r1).enumerate() {
            let roles = self.geometry.stripe_roles(row);
            let slices = bufs
                .iter_mut()
                .map(|b| &mut b[i * chunk..(i + 1) * chunk])
                .collect();
            self.reconstruct(&roles, slices, &missing);
        }
        self.verify_rebuilt(at, &bufs, &missing)
            .map_err(|e| Stop::Failed(e.to_string()))?;
        Ok(Some(bufs))
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
            for (a, b) in [(r0, mid), (mid, r1)].into_iter().filter(|(a, b)| a < b) {
                let bufs = self.read_rebuild_sources(a, b)?;
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
            writing.map_or(Ok(()), |w| w.join().expect("rebuild writer panicked"))
        })
    }

    /// [`Array::read_window`] over stripes `r0..r1`, again while members fail meanwhile.
    fn read_rebuild_sources(&self, r0: u64, r1: u64) -> Result<Vec<PoolBuf>, Stop> {
        for _ in 0..4 {
            if let Some(bufs) = self.read_window(r0, r1, Heal::Repair)? {
                return Ok(bufs);
            }
        }
        Err(Stop::Failed("members kept failing".into()))
    }

    /// Read array bytes at `at` from an in-sync copy on any member but `skip` (the caller holds
    /// the region locks). Copies met that fail their records are repaired from a good one, or
    /// the read fails.
    pub(crate) fn read_other_copy(&self, skip: usize, at: u64, buf: &mut [u8]) -> Result<(), Stop> {
        let copies = self.geometry.map_copies(at / 512);
        let mut corrupt = false;
        for c in copies.iter().filter(|c| c.dev != skip) {
            if !self
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
                .map_err(|e| Stop::Failed(e.to_string()));
        }
        Err(Stop::Failed(format!(
            "no in-sync copy of array byte {at} left"
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
        let limit = end.min(pos + crate::bitmap::SKIP_MAX_BYTES);
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
        let _guard = (lo < hi).then(|| self.lock_array_range(lo, hi - lo));
        if spans(to).any(|(_, at, len)| at.is_some_and(|at| !idle(at, len))) {
            return None; // a write came in meanwhile: rebuild the usual way
        }
        if let Err(stop) = under_lock(pos, to) {
            return Some(Err(stop));
        }
        self.slots[role].advance(to);
        Some(Ok(to))
    }
}
