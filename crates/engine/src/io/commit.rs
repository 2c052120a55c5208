//! The commit point: every member write of the engine goes out through [`CommitPoint::writes`].
//!
//! Reconstruct-write, read-modify-write, degraded writes, mirror writes, rebuild, repair and
//! the journal's replay at assembly all build their member operations and hand them here, with
//! a [`WriteSet`] saying what they are for (the executor refuses a member write outside). In
//! order:
//! 1. unless the writes only fill a rebuilding member, the superblocks say "active" (durably)
//!    before the first member write of the run (DESIGN.md's first ordering rule);
//! 2. the used-region map marks the regions written as used (durably), then the consistency
//!    policy's `before_writes` hook runs (the bitmap sets and flushes its bits
//!    here, the journal logs and waits for the log);
//! 3. the writes run (without FUA when the journal logged them; if the log failed meanwhile,
//!    the members are flushed before those that asked for FUA return);
//! 4. a member failure that any of these writes (or writes planned past a member already failing)
//!    skipped is durable in the superblocks before this returns, so before any acknowledgement;
//! 5. writes that hit a full backing store leave the range inconsistent, which the policy
//!    remembers for resync (and the request fails NoSpace); then the policy's `after_writes`
//!    hook runs, whatever the outcome.

//!
//! The commit point sits below the parts it calls (the used-region map, the consistency
//! policy), which write through it themselves: it asks them through [`CommitParts`], which the
//! array implements by composing them.

use crate::clock::Clock;
use crate::error::{EngineError, Result};
use crate::io::no_space::NoSpaceTracker;
use crate::io::{IoKind, IoOutcome, MemberIo};
use crate::members::MemberSet;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// A column interval of a stripe as it will be written: what the journal logs.
pub(crate) struct StripeImage<'a> {
    pub row: u64,
    /// Per-member byte offset of the interval (inside the row's chunk).
    pub at: u64,
    /// Dirty data chunks by data index, whether or not their member is present.
    pub data: &'a [(usize, &'a [u8])],
    pub p: &'a [u8],
    pub q: Option<&'a [u8]>,
    /// A write-out of write-back data: the data pages are in the log already, only parity is
    /// logged (and it may use the space kept for write-outs).
    pub parity_only: bool,
}

/// What `before_writes` hands to `after_writes`: the journal's io units of the writes.
pub(crate) type Ticket = Option<std::ops::Range<u64>>;

/// What the commit point asks of the parts above it, step by step (see the module doc).
pub(crate) trait CommitParts {
    fn name(&self) -> &str;
    fn members(&self) -> &MemberSet;
    fn clock(&self) -> &dyn Clock;
    /// Step 1: the superblocks say "active", durably.
    fn mark_active(&self) -> Result<()>;
    /// Step 2: the used-region map (if any) records `set`'s regions as used, durably.
    fn mark_used(&self, set: &WriteSet) -> Result<()>;
    /// Step 2: the consistency policy's `before_writes`.
    fn before_writes(&self, set: &WriteSet, image: Option<&StripeImage<'_>>) -> Result<Ticket>;
    /// Step 3: the writes run on the executor.
    fn run_io(&self, ios: &mut [MemberIo<'_>]) -> bool;
    /// Is there a journal, and has it not failed?
    fn journal_healthy(&self) -> bool;
    /// Flush every member in a role (failing those whose flush fails).
    fn flush_members(&self);
    /// Step 5: the policy's `note_inconsistent`.
    fn note_inconsistent(&self, set: &WriteSet);
    /// Step 5: the policy's `after_writes`.
    fn after_writes(&self, set: &WriteSet, ticket: Ticket);
}

/// What a group of member writes is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum WriteKind {
    /// A stripe of a parity level (client data and parity).
    Stripe,
    /// Copies of a mirror level.
    Mirror,
    /// Rebuilding a member above its in-sync point.
    Rebuild,
    /// Resync or repair rewriting redundancy.
    Repair,
    /// Discarding whole unused regions on every member (a trim).
    Release,
    /// Journal recovery writing the logged stripes home at assembly (the journal does not log
    /// them again: they are in its log until the tail moves past them).
    Replay,
}

/// A group of member writes handed to the commit point, and the range it covers: per-member
/// data-area bytes for parity levels and rebuilds, array bytes for mirror writes and repairs of
/// mirrors.
#[derive(Clone, Copy, Debug)]
pub(crate) struct WriteSet {
    pub kind: WriteKind,
    pub offset_bytes: u64,
    pub len_bytes: u64,
}

impl WriteSet {
    pub fn stripe(offset_bytes: u64, len_bytes: u64) -> WriteSet {
        WriteSet {
            kind: WriteKind::Stripe,
            offset_bytes,
            len_bytes,
        }
    }

    pub fn mirror(array_offset_bytes: u64, len_bytes: u64) -> WriteSet {
        WriteSet {
            kind: WriteKind::Mirror,
            offset_bytes: array_offset_bytes,
            len_bytes,
        }
    }

    pub fn rebuild(offset_bytes: u64, len_bytes: u64) -> WriteSet {
        WriteSet {
            kind: WriteKind::Rebuild,
            offset_bytes,
            len_bytes,
        }
    }

    pub fn release(offset_bytes: u64, len_bytes: u64) -> WriteSet {
        WriteSet {
            kind: WriteKind::Release,
            offset_bytes,
            len_bytes,
        }
    }

    pub fn replay(offset_bytes: u64, len_bytes: u64) -> WriteSet {
        WriteSet {
            kind: WriteKind::Replay,
            offset_bytes,
            len_bytes,
        }
    }

    pub fn repair(offset_bytes: u64, len_bytes: u64) -> WriteSet {
        WriteSet {
            kind: WriteKind::Repair,
            offset_bytes,
            len_bytes,
        }
    }
}

/// The commit point's own state: the groups of member writes inside it (safe mode waits for
/// none, and the executor refuses a member write while there is none), when the last one ended,
/// and the episode of a full backing store its writes met.
#[derive(Default)]
pub(crate) struct CommitPoint {
    /// Groups of member writes between their commit point's start and end.
    writes_inside: AtomicUsize,
    /// When the last group of member writes ended (the sync clock's ms, +1; 0: none yet).
    last_write_ms: AtomicU64,
    /// A member's backing store is full: writes fail with ENOSPC (for status).
    pub(crate) no_space: NoSpaceTracker,
}

impl CommitPoint {
    /// Run `ios` (writes only) as the member writes of `set`; see the module doc for the order.
    /// Member I/O errors are not errors here (the members are faulty now and redundancy covers
    /// them; callers check what reached which member); a full backing store is.
    pub(crate) fn writes(
        &self,
        parts: &dyn CommitParts,
        set: &WriteSet,
        ios: &mut [MemberIo<'_>],
    ) -> Result<()> {
        self.stripe_writes(parts, set, ios, None)
    }

    /// [`CommitPoint::writes`] for a stripe write, with what it puts on the members (the
    /// journal logs it).
    pub(crate) fn stripe_writes(
        &self,
        parts: &dyn CommitParts,
        set: &WriteSet,
        ios: &mut [MemberIo<'_>],
        image: Option<&StripeImage<'_>>,
    ) -> Result<()> {
        for io in ios.iter() {
            assert!(
                matches!(io.kind, IoKind::Write(..) | IoKind::Discard(_)),
                "only member writes pass the commit point"
            );
        }
        if ios.is_empty() {
            return Ok(());
        }
        let members = parts.members();
        if matches!(set.kind, WriteKind::Stripe | WriteKind::Mirror) {
            wait_for_other_nodes(parts, set);
        }
        if let Some(reason) = members.coordinator().write_refusal() {
            // Not the array's read-only state (EPERM): a node whose lease is unconfirmed may
            // write again once it is, so the client sees an I/O error.
            return Err(EngineError::Unavailable {
                array: parts.name().to_string(),
                reason,
            });
        }
        let _counted = self.enter(parts.clock());
        if set.kind != WriteKind::Rebuild {
            parts.mark_active()?;
        }
        // Data goes into these regions: the map says so first. (A rebuild fills what is used
        // already; a release is what makes regions unused.)
        if !matches!(set.kind, WriteKind::Rebuild | WriteKind::Release) {
            parts.mark_used(set)?;
        }
        let ticket = parts.before_writes(set, image)?;
        let mut fua_to_log = false;
        if ticket.is_some() {
            // Logged durably: the member writes need no FUA of their own.
            for io in ios.iter_mut() {
                if let IoKind::Write(_, fua) = &mut io.kind {
                    fua_to_log |= *fua;
                    *fua = false;
                }
            }
        }
        parts.run_io(ios);
        if fua_to_log && !parts.journal_healthy() {
            // The log their FUA was left to failed while they ran: they are durable on the
            // members before anything acknowledges them (the log may never be read again).
            parts.flush_members();
        }
        members.wait_failures_durable();
        let no_space = self.note_no_space(parts, ios);
        if no_space {
            // Before `after_writes`: the bitmap must not let the range's bits clear first.
            parts.note_inconsistent(set);
        }
        parts.after_writes(set, ticket);
        if members.is_failed() {
            // The failures these writes met could not all be recorded, or redundancy is gone:
            // nothing may be acknowledged.
            return Err(members.unrecoverable(
                set.offset_bytes,
                set.len_bytes,
                "too many members failed",
            ));
        }
        if no_space {
            return Err(EngineError::NoSpace {
                array: parts.name().to_string(),
                offset_bytes: set.offset_bytes,
                len_bytes: set.len_bytes,
            });
        }
        Ok(())
    }

    /// Track the ENOSPC episode by how `ios` ended; true if one of them hit a full store.
    fn note_no_space(&self, parts: &dyn CommitParts, ios: &[MemberIo<'_>]) -> bool {
        let clock = parts.clock();
        match ios.iter().find(|io| io.outcome == IoOutcome::NoSpace) {
            Some(io) => {
                self.no_space.write_failed(
                    &parts.members().slots[io.role]
                        .member()
                        .map_or_else(|| format!("role {}", io.role), |m| m.name().to_string()),
                    clock,
                );
                true
            }
            None => {
                if ios.iter().all(|io| io.outcome == IoOutcome::Ok) {
                    self.no_space.write_succeeded(clock.now());
                }
                false
            }
        }
    }

    /// Count a group of member writes inside the commit point until the guard drops.
    pub(crate) fn enter<'a>(&'a self, clock: &'a dyn Clock) -> InCommit<'a> {
        self.writes_inside.fetch_add(1, Ordering::SeqCst);
        InCommit { point: self, clock }
    }

    /// The groups of member writes inside the commit point now.
    pub(crate) fn writes_inside(&self) -> &AtomicUsize {
        &self.writes_inside
    }

    /// When the last group of member writes ended (the clock's ms, +1; 0: none yet).
    pub(crate) fn last_write_ms(&self) -> u64 {
        self.last_write_ms.load(Ordering::Acquire)
    }
}

/// A client write waits while another node of a cluster resyncs or recovers its range
/// (md-cluster's `area_resyncing`; alone, nobody ever does).
fn wait_for_other_nodes(parts: &dyn CommitParts, set: &WriteSet) {
    let range = set.offset_bytes..set.offset_bytes + set.len_bytes;
    while parts.members().coordinator().area_resyncing(range.clone()) {
        parts.clock().sleep(std::time::Duration::from_millis(1));
    }
}

/// A group of member writes counted inside the commit point (see [`CommitPoint::enter`]);
/// dropping it notes when the last one ended.
pub(crate) struct InCommit<'a> {
    point: &'a CommitPoint,
    clock: &'a dyn Clock,
}

impl Drop for InCommit<'_> {
    fn drop(&mut self) {
        let now = self.clock.now().as_millis() as u64 + 1;
        self.point.last_write_ms.store(now, Ordering::Release);
        self.point.writes_inside.fetch_sub(1, Ordering::SeqCst);
    }
}
