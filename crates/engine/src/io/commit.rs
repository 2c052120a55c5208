//! The commit point: every member write of the engine goes out through [`Array::commit_writes`].
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

use crate::array::Array;
use crate::error::{EngineError, Result};
use crate::io::{IoKind, IoOutcome, MemberIo};
use crate::policy::journal::StripeImage;
use std::sync::atomic::Ordering;

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

impl Array {
    /// Run `ios` (writes only) as the member writes of `set`; see the module doc for the order.
    /// Member I/O errors are not errors here (the members are faulty now and redundancy covers
    /// them; callers check what reached which member); a full backing store is.
    pub(crate) fn commit_writes(&self, set: &WriteSet, ios: &mut [MemberIo<'_>]) -> Result<()> {
        self.commit_stripe_writes(set, ios, None)
    }

    /// [`Array::commit_writes`] for a stripe write, with what it puts on the members (the
    /// journal logs it).
    pub(crate) fn commit_stripe_writes(
        &self,
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
        if matches!(set.kind, WriteKind::Stripe | WriteKind::Mirror) {
            self.wait_for_other_nodes(set);
        }
        if let Some(reason) = self.members.coordinator().write_refusal() {
            // Not the array's read-only state (EPERM): a node whose lease is unconfirmed may
            // write again once it is, so the client sees an I/O error.
            return Err(EngineError::Unavailable {
                array: self.name.clone(),
                reason,
            });
        }
        let _counted = InCommit::enter(self);
        if set.kind != WriteKind::Rebuild {
            self.mark_active()?;
        }
        if let Some(used) = &self.used {
            // Data goes into these regions: the map says so first. (A rebuild fills what is
            // used already; a release is what makes regions unused.)
            if !matches!(set.kind, WriteKind::Rebuild | WriteKind::Release) {
                used.ensure_used(&self.members, set.offset_bytes, set.len_bytes)?;
            }
        }
        let ticket = self.policy.before_writes(self, set, image)?;
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
        self.run_io(ios);
        if fua_to_log && !self.journal_healthy() {
            // The log their FUA was left to failed while they ran: they are durable on the
            // members before anything acknowledges them (the log may never be read again).
            self.flush_members();
        }
        self.members.wait_failures_durable();
        let no_space = ios.iter().any(|io| io.outcome == IoOutcome::NoSpace);
        match ios.iter().find(|io| io.outcome == IoOutcome::NoSpace) {
            Some(io) => self.no_space.write_failed(
                &self.members.slots[io.role]
                    .member()
                    .map_or_else(|| format!("role {}", io.role), |m| m.name().to_string()),
                self.sync.clock.as_ref(),
            ),
            None if ios.iter().all(|io| io.outcome == IoOutcome::Ok) => {
                self.no_space.write_succeeded(self.sync.clock.now())
            }
            None => {}
        }
        if no_space {
            // Before `after_writes`: the bitmap must not let the range's bits clear first.
            self.policy.note_inconsistent(self, set);
        }
        self.policy.after_writes(self, set, ticket);
        if self.is_failed() {
            // The failures these writes met could not all be recorded, or redundancy is gone:
            // nothing may be acknowledged.
            return Err(self.unrecoverable(
                set.offset_bytes,
                set.len_bytes,
                "too many members failed",
            ));
        }
        if no_space {
            return Err(EngineError::NoSpace {
                array: self.name.clone(),
                offset_bytes: set.offset_bytes,
                len_bytes: set.len_bytes,
            });
        }
        Ok(())
    }
}

impl Array {
    /// A client write waits while another node of a cluster resyncs or recovers its range
    /// (md-cluster's `area_resyncing`; alone, nobody ever does).
    fn wait_for_other_nodes(&self, set: &WriteSet) {
        let range = set.offset_bytes..set.offset_bytes + set.len_bytes;
        while self.members.coordinator().area_resyncing(range.clone()) {
            self.sync.clock.sleep(std::time::Duration::from_millis(1));
        }
    }
}

/// Counts a group of member writes in `writes_in_commit` while it passes the commit point (safe
/// mode waits for none), and notes when the last one ended.
pub(crate) struct InCommit<'a>(&'a Array);

impl<'a> InCommit<'a> {
    pub(crate) fn enter(array: &'a Array) -> InCommit<'a> {
        array.writes_in_commit.fetch_add(1, Ordering::SeqCst);
        InCommit(array)
    }
}

impl Drop for InCommit<'_> {
    fn drop(&mut self) {
        let now = self.0.sync.clock.now().as_millis() as u64 + 1;
        self.0.last_write_ms.store(now, Ordering::Release);
        self.0.writes_in_commit.fetch_sub(1, Ordering::SeqCst);
    }
}
