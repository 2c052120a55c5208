//! The array as the commit point's parts ([`CommitParts`]): the commit point sits below the
//! used-region map and the consistency policy it calls, so the array, which holds them all,
//! answers for them. Likewise the array as the policies' host ([`PolicyHost`]): they sit below
//! the walker and the level that call them. Also member I/O with the array's executor,
//! integrity records and clock.

use super::Array;
use crate::clock::Clock;
use crate::error::Result;
use crate::io::bufpool::BufPool;
use crate::io::commit::{CommitParts, StripeImage, Ticket, WriteSet};
use crate::io::{IoContext, MemberIo};
use crate::members::MemberSet;
use crate::policy::host::PolicyHost;
use crate::policy::used::UsedRegions;
use crate::work::VerifyReport;
use layout::Geometry;
use std::sync::Arc;
use std::time::Duration;

impl CommitParts for Array {
    fn name(&self) -> &str {
        &self.name
    }

    fn members(&self) -> &MemberSet {
        &self.members
    }

    fn clock(&self) -> &dyn Clock {
        self.sync.clock.as_ref()
    }

    fn mark_active(&self) -> Result<()> {
        Array::mark_active(self)
    }

    fn mark_used(&self, set: &WriteSet) -> Result<()> {
        match &self.used {
            Some(used) => used.ensure_used(&self.members, set.offset_bytes, set.len_bytes),
            None => Ok(()),
        }
    }

    fn before_writes(&self, set: &WriteSet, image: Option<&StripeImage<'_>>) -> Result<Ticket> {
        self.policy.before_writes(self, set, image)
    }

    fn run_io(&self, ios: &mut [MemberIo<'_>]) -> bool {
        Array::run_io(self, ios)
    }

    fn journal_healthy(&self) -> bool {
        Array::journal_healthy(self)
    }

    fn flush_members(&self) {
        Array::flush_members(self)
    }

    fn note_inconsistent(&self, set: &WriteSet) {
        self.policy.note_inconsistent(self, set);
    }

    fn after_writes(&self, set: &WriteSet, ticket: Ticket) {
        self.policy.after_writes(self, set, ticket);
    }
}

impl PolicyHost for Array {
    fn name(&self) -> &str {
        &self.name
    }

    fn members(&self) -> &MemberSet {
        &self.members
    }

    fn geometry(&self) -> &Geometry {
        &self.geometry
    }

    fn clock(&self) -> &dyn Clock {
        self.sync.clock.as_ref()
    }

    fn bufs(&self) -> &Arc<BufPool> {
        &self.bufs
    }

    fn used(&self) -> Option<&UsedRegions> {
        self.used.as_deref()
    }

    fn is_read_only(&self) -> bool {
        Array::is_read_only(self)
    }

    fn stripe_cache_bytes(&self) -> usize {
        self.config.stripe_cache_bytes
    }

    fn flush_members(&self) {
        Array::flush_members(self)
    }

    fn commit_writes(&self, set: &WriteSet, ios: &mut [MemberIo<'_>]) -> Result<()> {
        self.commit.writes(self, set, ios)
    }

    fn request_resync_from(&self, offset_bytes: u64) {
        self.sync
            .request_resync_from(self.policy.as_ref(), offset_bytes);
    }

    fn wake_sync(&self) {
        self.sync.wake();
    }

    fn resync_owed(&self) -> bool {
        self.sync.resync_owed()
    }

    fn until_stopped(&self, period: Duration, tick: &mut dyn FnMut()) {
        self.sync.until_stopped(period, tick);
    }

    fn sync_range_covering(&self, offset: u64, len: u64) -> (u64, u64) {
        self.personality.sync_range_covering(offset, len)
    }

    fn verify(&self, ranges: &[(u64, u64)]) -> Result<VerifyReport> {
        Array::verify(self, ranges)
    }

    fn write_out_oldest(&self) -> bool {
        self.parity().write_out_oldest(self)
    }

    fn write_out_pending(&self) -> Result<()> {
        self.parity().write_out_pending(self)
    }
}

impl Array {
    /// Run `ios` (see [`crate::io::IoPath::run`]).
    pub(crate) fn run_io(&self, ios: &mut [MemberIo<'_>]) -> bool {
        let cx = IoContext {
            members: &self.members,
            integrity: self.integrity.as_deref(),
            verifier: self.config.read_verifier.as_deref(),
            clock: self.sync.clock.as_ref(),
            writes_in_commit: self.commit.writes_inside(),
        };
        self.io.run(&cx, ios)
    }
}

impl Array {
    /// Write `bytes` (rebuilt from redundancy) back to `role` at `off` after its read failed
    /// there, and read them again: md's "read error corrected". A member whose rewrite fails
    /// is failed by the write path; one that reads back wrong or not at all is failed here.
    /// `set`: what the write covers, as the commit point counts it (member bytes for parity
    /// levels, array bytes for mirrors).
    pub(crate) fn correct_read_error(&self, role: usize, off: u64, bytes: &[u8], set: WriteSet) {
        let Some(member) = self
            .members
            .slot(role)
            .in_sync_member(off, bytes.len() as u64)
        else {
            return;
        };
        if self.members.note_read_error(role, &member) || self.config.read_only {
            return;
        }
        let mut io = [MemberIo::write(&self.members, role, off, bytes, false)];
        let wrote = self.commit.writes(self, &set, &mut io);
        if wrote.is_err() || !io[0].ok() {
            return;
        }
        drop(io);
        let mut back = self.bufs.get(bytes.len());
        let mut io = [MemberIo::read(&self.members, role, off, &mut back)];
        self.run_io(&mut io);
        let ok = io[0].ok();
        drop(io);
        if ok && back[..] == *bytes {
            member.health.note_corrected();
            tracing::warn!(array = %self.name, member = %member.name(), role, offset = off,
                "read error corrected");
            self.members.events.emit(
                "read_error_corrected",
                &self.name,
                Some(member.name()),
                format!(
                    "role {role}: data bytes {off}+{} rebuilt from redundancy and rewritten",
                    bytes.len()
                ),
            );
            return;
        }
        self.members.fail_role(
            role,
            Some(&member),
            &format!("data byte {off}: a rewritten block after a read error reads back wrong"),
        );
    }
}
