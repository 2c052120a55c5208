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
use crate::background::SyncControl;
use crate::io::commit::WriteSet;
use crate::io::{IoKind, MemberIo};
use crate::members::FULLY_IN_SYNC;
use crate::work::Stop;

/// Rebuilds record what they cannot recover in pages of this many bytes.
const PAGE: u64 = crate::members::badblocks::BAD_PAGE;

impl SyncControl {
    /// Assign a spare to the first role without a complete member; returns the role to rebuild.
    pub(crate) fn pick_recovery(&self, array: &Array) -> Option<usize> {
        if array.personality.redundancy() == 0 {
            // Nothing to rebuild from (md never records a partial member on such a level).
            return None;
        }
        if let Some(role) = array
            .members
            .slots
            .iter()
            .position(|s| !s.is_faulty() && !s.is_complete())
        {
            // Resumed here, perhaps after another node of a cluster rebuilt it so far: this
            // node records the progress from now on.
            if let Some(m) = array.members.slots[role].member() {
                array.members.meta.lock().set_writable(m.dev_number, true);
            }
            return Some(role);
        }
        let role = array.members.slots.iter().position(|s| s.is_faulty())?;
        let spare = {
            let mut spares = array.members.spares.lock();
            if spares.is_empty() {
                return None;
            }
            spares.remove(0)
        };
        let mut meta = array.members.meta.lock();
        meta.activate_spare(spare.dev_number, role as u16);
        if let Some(old) = array.members.slots[role].member() {
            meta.retire(old.dev_number, format::ROLE_FAULTY);
        }
        array.members.slots[role].install(spare.clone(), 0);
        // The tables the new member holds are written at the next flush.
        if let Some(integ) = &array.integrity {
            integ.held_by_new_member(role);
        }
        array.members.commit(meta);
        array.members.events.emit(
            "spare_active",
            &array.name,
            Some(spare.name()),
            format!("spare takes role {role}; rebuilding"),
        );
        Some(role)
    }

    /// Write rebuilt bytes to the rebuilding member of `role` (above its in-sync point, so
    /// planned against the role's member as long as it is not faulty).
    pub(crate) fn write_rebuilt(
        &self,
        array: &Array,
        role: usize,
        offset_bytes: u64,
        buf: &[u8],
    ) -> Result<(), Stop> {
        let member = array.members.slots[role].usable();
        let mut io = [MemberIo::planned(
            role,
            member,
            offset_bytes,
            IoKind::Write(buf, false),
        )];
        array
            .commit
            .writes(
                array,
                &WriteSet::rebuild(offset_bytes, buf.len() as u64),
                &mut io,
            )
            .map_err(Stop::Failed)?;
        if !io[0].ok() {
            return Err(Stop::Failed(array.members.unrecoverable(
                offset_bytes,
                buf.len() as u64,
                "write to the rebuilding member failed",
            )));
        }
        Ok(())
    }

    /// The rebuild of `role` reached the end: record it in sync. The superblock commit flushes
    /// every member first, so "in sync" is durable only after the rebuilt data is.
    pub(crate) fn finish_recovery(&self, array: &Array, role: usize) {
        // The records of what the rebuild wrote are durable before the member counts as whole.
        array.write_integrity_tables();
        let mut meta = array.members.meta.lock();
        array.members.slots[role].advance(FULLY_IN_SYNC);
        if let Some(m) = array.members.slots[role].member() {
            meta.set_recovery(m.dev_number, None);
        }
        array.members.commit(meta);
        let name = array.members.slots[role]
            .member()
            .map(|m| m.name().to_string());
        array.members.events.emit(
            "member_in_sync",
            &array.name,
            name.as_deref(),
            format!("role {role} rebuilt"),
        );
    }

    /// Record how far a rebuild got in the rebuilding member's superblock. The commit flushes
    /// the members first: the checkpoint never covers rebuilt data still in a volatile cache.
    pub(crate) fn checkpoint_recovery(&self, array: &Array, role: usize) {
        let slot = &array.members.slots[role];
        let Some(m) = slot.member() else { return };
        if slot.is_faulty() || slot.is_complete() {
            return;
        }
        array.write_integrity_tables();
        let mut meta = array.members.meta.lock();
        meta.set_recovery(m.dev_number, Some(slot.in_sync_bytes() / 512));
        array.members.commit(meta);
    }

    /// Record pages (member bytes) the rebuild of `role` could not rebuild as bad blocks on
    /// its new member; returns them as runs `(at, len)`.
    pub(crate) fn record_unrebuilt(
        &self,
        array: &Array,
        role: usize,
        lost: &[u64],
    ) -> Vec<(u64, u64)> {
        let runs = page_runs(lost);
        for &(at, len) in &runs {
            if let Some(member) = array.members.slots[role].usable() {
                array.members.record_bad_blocks(
                    role,
                    &member,
                    at,
                    len,
                    "the rebuild could not recover it from the other members",
                );
            }
        }
        runs
    }
}

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
