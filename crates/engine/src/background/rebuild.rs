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

use crate::background::SyncControl;
use crate::io::commit::WriteSet;
use crate::io::{IoKind, MemberIo};
use crate::lock::LockRange;
use crate::members::FULLY_IN_SYNC;
use crate::personality::parts::Parts;
use crate::policy::bitmap::SKIP_MAX_BYTES;

impl SyncControl {
    /// Assign a spare to the first role without a complete member; returns the role to rebuild.
    pub(crate) fn pick_recovery(&self, array: &Parts) -> Option<usize> {
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

    /// The rebuild of `role` reached the end: record it in sync. The superblock commit flushes
    /// every member first, so "in sync" is durable only after the rebuilt data is.
    pub(crate) fn finish_recovery(&self, array: &Parts, role: usize) {
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
    pub(crate) fn checkpoint_recovery(&self, array: &Parts, role: usize) {
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
}

/// Recovery of a member re-added with the bitmap, over chunks whose bit is clear: those
/// bytes are current on it already (every write it missed left its bit set, and no bit
/// clears while a role is rebuilding). Moves the in-sync point past them; `None` if there
/// is nothing to skip at `pos`.
pub(super) fn skip_clean_for_recovery(
    array: &Parts,
    role: usize,
    pos: u64,
    end: u64,
) -> Option<u64> {
    let slot = &array.members.slots[role];
    if !slot.is_bitmap_guided() {
        return None;
    }
    let bm = array.policy.bitmap()?;
    if array.personality.recovery_maps_chunks() {
        let clean = |at: u64, len: u64| bm.next_set(at, at + len) >= at + len;
        let skipped = array
            .copies()
            .skip_raid10_chunks(array, role, pos, end, clean, |_, _| Ok(()))?;
        return skipped.ok(); // the closure does no I/O: it cannot fail
    }
    let unit = array.personality.recovery_unit();
    let limit = end.min(pos + SKIP_MAX_BYTES);
    let found = bm.next_set(pos, limit);
    let target = if found == end {
        end
    } else {
        found / unit * unit
    };
    if target <= pos {
        return None;
    }
    // A write into the range either finished (its bit is set) or waits for this lock.
    let _guard = array.range_lock().lock(LockRange::Sync {
        at: pos,
        len: target - pos,
    });
    if bm.next_set(pos, target) < target {
        return None;
    }
    slot.advance(target);
    Some(target)
}

/// Rebuild over unused regions: they are zero on every member in sync, so the new member
/// gets them discarded (no reads). Moves its in-sync point past them; `None` if `pos` is
/// in a used region.
pub(super) fn skip_unused_for_recovery(
    array: &Parts,
    role: usize,
    pos: u64,
    end: u64,
) -> Option<std::result::Result<u64, crate::work::Stop>> {
    let used = array.used.as_ref()?;
    if array.personality.recovery_maps_chunks() {
        let unused = |at: u64, len: u64| used.next_used(at, at + len).start >= at + len;
        return array
            .copies()
            .skip_raid10_chunks(array, role, pos, end, unused, |from, to| {
                discard_on_rebuilding(array, role, from, to)
            });
    }
    let limit = end.min(pos + SKIP_MAX_BYTES);
    let next = used.next_used(pos, limit);
    let target = if next.start >= limit {
        limit
    } else {
        next.start
    };
    if target <= pos {
        return None;
    }
    let _guard = array.range_lock().lock(LockRange::Sync {
        at: pos,
        len: target - pos,
    });
    if used.next_used(pos, target).start < target {
        return None; // a write claimed part of it meanwhile: rebuild it the usual way
    }
    if let Err(stop) = discard_on_rebuilding(array, role, pos, target) {
        return Some(Err(stop));
    }
    array.members.slots[role].advance(target);
    Some(Ok(target))
}

/// Member bytes `from..to` of the member rebuilding `role` are unused: discard them (they
/// read as zeroes, as on the members in sync).
fn discard_on_rebuilding(
    array: &Parts,
    role: usize,
    from: u64,
    to: u64,
) -> std::result::Result<(), crate::work::Stop> {
    let member = array.members.slots[role].member();
    let mut ios = [MemberIo::planned(
        role,
        member,
        from,
        IoKind::Discard(to - from),
    )];
    if let Err(e) = array
        .commit
        .writes(array, &WriteSet::rebuild(from, to - from), &mut ios)
    {
        return Err(crate::work::Stop::Failed(e));
    }
    if !ios[0].ok() {
        return Err(crate::work::Stop::Interrupted);
    }
    Ok(())
}

/// Where a RAID10 recovery window from member byte `pos` ends (not past `limit`): before the
/// first later chunk the skips would pass over (unused, or clean on a member re-added with the
/// bitmap). A window is several chunks, each mapping elsewhere in the array; the skips look
/// only at the chunk a window starts at, so without this bound a window would copy chunks a
/// skip discards (unused regions have no records to pass a verified read) or leaves as they are.
pub(super) fn raid10_copy_end(array: &Parts, role: usize, pos: u64, limit: u64) -> u64 {
    let unit = array.personality.recovery_unit();
    let limit = limit.min(pos + array.personality.sync_window(array));
    let from = (pos / unit + 1) * unit;
    let bitmap = array
        .policy
        .bitmap()
        .filter(|_| array.members.slots[role].is_bitmap_guided());
    let idle = |at: u64, len: u64| {
        let unused = array
            .used
            .as_ref()
            .is_some_and(|u| u.next_used(at, at + len).start >= at + len);
        unused || bitmap.is_some_and(|b| b.next_set(at, at + len) >= at + len)
    };
    let g = array.personality.geometry();
    (from..limit)
        .step_by(unit as usize)
        .find(|&p| {
            g.reverse_copy(role, p / 512)
                .is_some_and(|at| idle(at * 512, unit.min(limit - p)))
        })
        .unwrap_or(limit)
}
