//! [`Parts`]: what the level works on, composed by the array facade (`array/`), which derefs
//! to them for its own operations. Nothing here, and nothing that takes `Parts`, knows the
//! facade: the personalities, the policies (through [`PolicyHost`]) and the commit point
//! (through [`CommitParts`]) all see the same parts.
//!
//! What lives above the parts reaches them through [`Walker`]: the background walker, which
//! schedules the level's windows, is told of resync requests and paces the policies' threads.
//! Its state stays its own (`background/`): the parts ask, they do not reach in.

use crate::clock::Clock;
use crate::error::{EngineError, Result};
use crate::integrity::Integrity;
use crate::io::bufpool::BufPool;
use crate::io::commit::{CommitParts, CommitPoint, StripeImage, Ticket, WriteSet};
use crate::io::{IoContext, IoPath, MemberIo};
use crate::lock::sectors::SectorLocks;
use crate::lock::{LocalLocks, RangeLock};
use crate::members::MemberSet;
use crate::personality::raid456_heal::Heal;
use crate::personality::stripe_cache::StripeCache;
use crate::personality::{Copies, Parity, Personality};
use crate::policy::host::PolicyHost;
use crate::policy::used::UsedRegions;
use crate::policy::ConsistencyPolicy;
use crate::work::VerifyReport;
use crate::ArrayConfig;
use layout::Geometry;
use std::os::fd::BorrowedFd;
use std::sync::Arc;
use std::time::Duration;

/// The read-only reason of an array assembled read-only because it was asked to be.
pub const ASSEMBLED_READ_ONLY: &str = "assembled read-only";

/// The background walker as the parts see it (implemented by `SyncControl`).
pub(crate) trait Walker: Send + Sync {
    /// Is a resync owed (redundancy may disagree with the data somewhere)?
    fn resync_owed(&self) -> bool;
    /// Redundancy from `offset_bytes` on may disagree with the data (`policy` is told first).
    fn request_resync_from(&self, policy: &dyn ConsistencyPolicy, offset_bytes: u64);
    /// Look at the work again.
    fn wake(&self);
    /// `tick` every `period` until background work stops (the policies' threads).
    fn until_stopped(&self, period: Duration, tick: &mut dyn FnMut());
}

/// The parts of an assembled array (see the module notes).
pub struct Parts {
    pub(crate) name: String,
    pub(crate) geometry: Geometry,
    /// Roles, spares, superblocks and member failure.
    pub(crate) members: MemberSet,
    pub(crate) config: ArrayConfig,
    /// Why the array was assembled read-only, when assembly decided it.
    pub(crate) read_only_reason: Option<String>,
    /// Where every member write goes out (`io/commit.rs`).
    pub(crate) commit: CommitPoint,
    pub(crate) io: IoPath,
    /// What the level does (md's personality): the data path and the background windows.
    pub(crate) personality: Box<dyn Personality>,
    pub(crate) policy: Box<dyn ConsistencyPolicy>,
    /// Which regions may hold data (None: every region counts as used).
    pub(crate) used: Option<Arc<UsedRegions>>,
    /// Per-block records kept apart from the data (parity levels created with integrity).
    pub(crate) integrity: Option<Arc<Integrity>>,
    pub(crate) stripes: Arc<StripeCache>,
    /// Stripe claims and mirror region locks.
    pub(crate) locks: LocalLocks,
    /// Partial-sector patches against every other write of their sector (`array/bytes.rs`).
    pub(crate) sector_locks: SectorLocks,
    pub(crate) bufs: Arc<BufPool>,
    /// The array's clock (the walker's too).
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) walker: Arc<dyn Walker>,
    /// Reads refused because the block had to be rebuilt from a row a crash may have torn.
    pub(crate) torn_reads_refused: std::sync::atomic::AtomicU64,
    /// Client reads answered by splicing from the members' page caches ([`crate::Array::read_to_pipe`]).
    pub(crate) spliced_reads: std::sync::atomic::AtomicU64,
}

impl CommitParts for Parts {
    fn name(&self) -> &str {
        &self.name
    }

    fn members(&self) -> &MemberSet {
        &self.members
    }

    fn clock(&self) -> &dyn Clock {
        self.clock.as_ref()
    }

    fn mark_active(&self) -> Result<()> {
        Parts::mark_active(self)
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
        Parts::run_io(self, ios)
    }

    fn journal_healthy(&self) -> bool {
        Parts::journal_healthy(self)
    }

    fn flush_members(&self) {
        Parts::flush_members(self)
    }

    fn note_inconsistent(&self, set: &WriteSet) {
        self.policy.note_inconsistent(self, set);
    }

    fn after_writes(&self, set: &WriteSet, ticket: Ticket) {
        self.policy.after_writes(self, set, ticket);
    }
}

impl PolicyHost for Parts {
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
        self.clock.as_ref()
    }

    fn bufs(&self) -> &Arc<BufPool> {
        &self.bufs
    }

    fn used(&self) -> Option<&UsedRegions> {
        self.used.as_deref()
    }

    fn is_read_only(&self) -> bool {
        Parts::is_read_only(self)
    }

    fn stripe_cache_bytes(&self) -> usize {
        self.config.stripe_cache_bytes
    }

    fn flush_members(&self) {
        Parts::flush_members(self)
    }

    fn commit_writes(&self, set: &WriteSet, ios: &mut [MemberIo<'_>]) -> Result<()> {
        self.commit.writes(self, set, ios)
    }

    fn request_resync_from(&self, offset_bytes: u64) {
        self.walker
            .request_resync_from(self.policy.as_ref(), offset_bytes);
    }

    fn wake_sync(&self) {
        self.walker.wake();
    }

    fn resync_owed(&self) -> bool {
        self.walker.resync_owed()
    }

    fn until_stopped(&self, period: Duration, tick: &mut dyn FnMut()) {
        self.walker.until_stopped(period, tick);
    }

    fn sync_range_covering(&self, offset: u64, len: u64) -> (u64, u64) {
        self.personality.sync_range_covering(offset, len)
    }

    fn verify(&self, ranges: &[(u64, u64)]) -> Result<VerifyReport> {
        Parts::verify(self, ranges)
    }

    fn write_out_oldest(&self) -> bool {
        self.parity().write_out_oldest(self)
    }

    fn write_out_pending(&self) -> Result<()> {
        self.parity().write_out_pending(self)
    }
}

/// What every part may ask of the array as a whole; the facade serves them through `Deref`.
impl Parts {
    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn geometry(&self) -> &Geometry {
        &self.geometry
    }

    pub fn size_bytes(&self) -> u64 {
        self.geometry.array_sectors() * 512
    }

    /// Whether the array was run read-only (`run --read-only`, or assembly decided it).
    pub fn is_read_only(&self) -> bool {
        self.config.read_only
    }

    /// Whether too many members failed for the array to serve I/O.
    pub fn is_failed(&self) -> bool {
        self.members.is_failed()
    }

    /// After client writes, before they are answered: `fua_done` (a FUA write succeeded)
    /// makes their integrity records durable too.
    pub(crate) fn records_after_write(&self, fua_done: bool) {
        // FUA makes the data durable; its records must be as well (a journal's log holds
        // them already).
        if fua_done && self.integrity.is_some() && !self.policy.logs_pages() {
            self.flush_members();
        } else if self.integrity.as_ref().is_some_and(|i| i.wants_write_out()) {
            // Changed record pages cannot leave the cache until written: a client that
            // never flushes gets its tables written anyway.
            self.write_integrity_tables();
        }
    }

    /// A client flush: what every write acknowledged before it is durable on the members (or,
    /// with a healthy journal, in the log, where every acknowledged write already is). A
    /// failed journal covers nothing: its cache is written out and the members flushed first
    /// (see `journal_fail.rs`).
    pub fn flush(&self) -> Result<()> {
        let watched = self.policy.flush_begins();
        self.stripes.hurry_all();
        let logged = self.journal_healthy();
        if !logged {
            self.settle_journal()?;
            self.flush_members();
        }
        // A member that failed meanwhile was skipped: its failure must be on disk first.
        self.members.wait_failures_durable();
        if self.is_failed() {
            return Err(self.members.unrecoverable(
                0,
                self.size_bytes(),
                "too many members failed",
            ));
        }
        if logged && !self.journal_healthy() {
            // The log failed while this flush relied on it: no acknowledgement before what it
            // covered is on the members.
            self.settle_journal()?;
            self.flush_members();
        }
        self.policy.flush_ended(self, watched);
        Ok(())
    }

    /// Write out what a failed journal covered and record it faulty (`policy/journal_fail.rs`).
    /// Ok when there is no journal or it has not failed. Must not be called under a row claim.
    pub(crate) fn settle_journal(&self) -> Result<()> {
        self.policy.settle(self)
    }

    /// Run `ios` (see [`crate::io::IoPath::run`]).
    pub(crate) fn run_io(&self, ios: &mut [MemberIo<'_>]) -> bool {
        let cx = IoContext {
            members: &self.members,
            integrity: self.integrity.as_deref(),
            verifier: self.config.read_verifier.as_deref(),
            clock: self.clock.as_ref(),
            writes_in_commit: self.commit.writes_inside(),
        };
        self.io.run(&cx, ios)
    }

    /// Member bytes `at..at + len` of role `dev` moved into `pipe` from the member's page
    /// cache (`splice`), where an ordinary read would return them as they lie: the role's
    /// member in sync there, no bad block recorded there, and nothing to check them in
    /// memory (integrity records, a read verifier). False: nothing or part of it moved; the
    /// caller reads the ordinary way, which handles what failed here.
    pub(crate) fn splice_member(
        &self,
        dev: usize,
        at: u64,
        len: usize,
        pipe: BorrowedFd<'_>,
    ) -> bool {
        if self.integrity.is_some() || self.config.read_verifier.is_some() {
            return false;
        }
        let Some(member) = self.members.slot(dev).in_sync_member(at, len as u64) else {
            return false;
        };
        !member.health.overlaps(at, len as u64)
            && member
                .dev
                .splice_to_pipe(pipe, member.data_offset_bytes + at, len)
                .is_ok()
    }

    /// Is there a journal, and has it not failed?
    pub(crate) fn journal_healthy(&self) -> bool {
        self.policy.logs_pages() && self.policy.failed().is_none()
    }

    /// Flush every member in a role; a member whose flush fails is failed. Changed integrity
    /// tables go out first, so that their records are durable with the data they describe.
    pub(crate) fn flush_members(&self) {
        self.write_integrity_tables();
        self.io.for_each(self.members.slots.len(), |role| {
            if let Some(m) = self.members.slots[role].usable() {
                if let Err(e) = m.dev.flush() {
                    self.members
                        .fail_role(role, Some(&m), &format!("flush failed: {e}"));
                }
            }
        });
    }

    /// Write the integrity tables changed since the last write-out (not flushed: the caller's
    /// flush, or the superblock commit's, makes them durable).
    pub(crate) fn write_integrity_tables(&self) {
        if let Some(integ) = self.integrity.as_ref().filter(|i| i.has_dirty_tables()) {
            // Table writes are member writes: the superblocks say "active" first, so that a
            // cut tearing them is followed by a resync.
            let _counted = self.commit.enter(self.clock.as_ref());
            if self.mark_active().is_ok() {
                for (role, m, e) in integ.write_tables(&self.members) {
                    self.members.fail_role(
                        role,
                        Some(&m),
                        &format!("integrity table write failed: {e}"),
                    );
                }
            }
        }
    }

    /// Record that the array is active on every member (durably) before the first member
    /// write of this run.
    pub(crate) fn mark_active(&self) -> Result<()> {
        self.members.mark_active(|meta| self.policy.on_active(meta));
        Ok(())
    }

    pub(crate) fn check_range(&self, offset_bytes: u64, len_bytes: u64) -> Result<()> {
        if !offset_bytes.is_multiple_of(512) || !len_bytes.is_multiple_of(512) {
            return Err(EngineError::InvalidArgument(format!(
                "request {offset_bytes}+{len_bytes} is not a multiple of 512 bytes"
            )));
        }
        match offset_bytes.checked_add(len_bytes) {
            Some(end) if end <= self.size_bytes() => Ok(()),
            _ => Err(EngineError::InvalidArgument(format!(
                "request {offset_bytes}+{len_bytes} beyond the array end {}",
                self.size_bytes()
            ))),
        }
    }

    pub(crate) fn check_writable(&self) -> Result<()> {
        if self.config.read_only {
            return Err(EngineError::ReadOnly {
                array: self.name.clone(),
                reason: self
                    .read_only_reason
                    .clone()
                    .unwrap_or_else(|| ASSEMBLED_READ_ONLY.into()),
            });
        }
        if let Some(why) = self.policy.failed() {
            return Err(EngineError::ReadOnly {
                array: self.name.clone(),
                reason: why,
            });
        }
        // An I/O error, as md gives on a failed array: the data is gone, not protected.
        if self.is_failed() {
            return Err(self.members.unrecoverable(
                0,
                0,
                "too many members failed; redundancy exhausted",
            ));
        }
        Ok(())
    }

    /// The parity personality, where only a parity level gets (the journal, plugged and
    /// gathered writes exist only there).
    pub(crate) fn parity(&self) -> &Parity {
        self.personality
            .as_parity()
            .expect("only a parity level gets here")
    }

    /// The copies personality, where only a copies level gets.
    pub(crate) fn copies(&self) -> &Copies {
        self.personality
            .as_copies()
            .expect("only a copies level gets here")
    }

    /// The lock background windows take (through the trait: a cluster locks on every node).
    pub(crate) fn range_lock(&self) -> &dyn RangeLock {
        &self.locks
    }

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

    /// How client I/O treats blocks that fail their records: until the resync an unclean stop
    /// owes has run, unflushed writes may have left rows that no single fault explains, which
    /// may then be settled as found (as the resync itself would) where [`Parts::settle_scope`]
    /// allows it.
    pub(crate) fn heal_mode(&self) -> Heal {
        if self.walker.resync_owed() {
            Heal::Settle
        } else {
            Heal::Repair
        }
    }

    /// `mode` as it applies to `at..at + len` (resync coordinates: member bytes, array bytes
    /// for mirrors): settling as found is a crash's answer, so it holds only where a crash
    /// could have left a row mid-write (a resync is owed and the policy has not ruled the
    /// range consistent: the bitmap's dirty chunks, everything under the plain policy) and
    /// only while every member of the row is there (`complete`). Anywhere else a block that
    /// fails its record beyond redundancy is damage, and damage is an unrecoverable read: a
    /// clean and an unclean stop then give the same answer.
    pub(crate) fn settle_scope(&self, mode: Heal, at: u64, len: u64, complete: bool) -> Heal {
        if mode != Heal::Settle {
            return mode;
        }
        let owed = self.walker.resync_owed();
        if complete && owed && !self.policy.next_to_resync(at, at + len).is_empty() {
            Heal::Settle
        } else {
            Heal::Repair
        }
    }
}
