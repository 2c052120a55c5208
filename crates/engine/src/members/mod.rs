//! The member set: which member fills which role, the spares, the superblocks, and member
//! failure. It is the one place where a metadata change is made durable ([`MemberSet::commit`]),
//! and every commit is bracketed by the cluster [`Coordinator`]'s metadata update.
//!
//! State and who may change it:
//! * `slots[role].faulty`: set by [`MemberSet::fail_role`] under `meta`; read lock-free by the
//!   I/O path.
//! * `meta` (mutex): superblocks, events, dirty/clean. Held while superblocks are written, never
//!   while data I/O runs.
//! * `active` (atomic): fast check that the on-disk state says "active" before a member write
//!   goes out (md writes the dirty superblock and waits for it before the first data write).
//! * `failures_in_commit`: member failures set in memory whose superblock commit has not
//!   finished. Writes that may have skipped such a member wait for the commit (the metadata
//!   lock) before they are acknowledged ([`MemberSet::wait_failures_durable`]).

pub(crate) mod badblocks;
pub(crate) mod metadata;
pub(crate) mod paged;

mod member;
mod superblocks;

pub use member::{Member, Slot, FULLY_IN_SYNC};
pub use superblocks::read_superblock;
pub(crate) use superblocks::{
    superblock_block, write_superblock, EventRecorder, MemberSb, Meta, SB_OFFSET_BYTES,
};

use crate::cluster::Coordinator;
use crate::error::EngineError;
use crate::events::EventBus;
use badblocks::MAX_READ_ERRORS;
use format::ROLE_FAULTY;
use layout::Geometry;
use parking_lot::{Mutex, MutexGuard};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

/// Members whose superblock (or replicated metadata) write failed, with the error. They must
/// be failed in a further update once the metadata lock is released
/// ([`MemberSet::fail_after_sb_error`]).
#[must_use = "members whose superblock write failed must be failed"]
pub(crate) struct SbFailures(Vec<(Arc<Member>, std::io::Error)>);

impl SbFailures {
    /// The first member that failed, for a caller that refuses to go on instead (assembly).
    pub fn into_first(self) -> Option<(Arc<Member>, std::io::Error)> {
        self.0.into_iter().next()
    }
}

/// What the layers above do once a member has failed: count the rows the loss exposes (a crash
/// may have torn them) and wake background work (a spare may take the role).
pub(crate) trait FailureWatch: Send + Sync {
    fn exposed_rows(&self) -> u64;
    fn member_failed(&self);
}

pub(crate) struct MemberSet {
    /// The array's name, for messages and events.
    pub name: String,
    pub geometry: Geometry,
    /// Shared with the integrity records, which read their tables from the members.
    pub slots: Arc<Vec<Slot>>,
    pub meta: Mutex<Meta>,
    /// Spares not yet given a role.
    pub spares: Mutex<Vec<Arc<Member>>>,
    pub events: EventBus,
    active: AtomicBool,
    failures_in_commit: AtomicUsize,
    failed: AtomicBool,
    coordinator: Arc<dyn Coordinator>,
    watch: Box<dyn FailureWatch>,
}

impl MemberSet {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        name: String,
        geometry: Geometry,
        slots: Arc<Vec<Slot>>,
        meta: Meta,
        spares: Vec<Arc<Member>>,
        events: EventBus,
        coordinator: Arc<dyn Coordinator>,
        watch: Box<dyn FailureWatch>,
    ) -> MemberSet {
        let set = MemberSet {
            name,
            geometry,
            slots,
            meta: Mutex::new(meta),
            spares: Mutex::new(spares),
            events,
            // False at assembly whatever the superblocks said: a run that started dirty or
            // with a resync checkpoint still records "active, resync from 0" before its first
            // write, because what it writes may land below the old checkpoint.
            active: AtomicBool::new(false),
            failures_in_commit: AtomicUsize::new(0),
            failed: AtomicBool::new(false),
            coordinator,
            watch,
        };
        let survives = set.geometry.survives(&set.failed_roles());
        set.failed.store(!survives, Ordering::Release);
        set
    }

    pub fn coordinator(&self) -> &dyn Coordinator {
        self.coordinator.as_ref()
    }

    pub fn slot(&self, role: usize) -> &Slot {
        &self.slots[role]
    }

    /// Roles that do not count towards redundancy: faulty, missing or still rebuilding.
    pub fn failed_roles(&self) -> Vec<bool> {
        self.slots.iter().map(|s| !s.is_complete()).collect()
    }

    /// Too many members lost: nothing may be acknowledged any more.
    pub fn is_failed(&self) -> bool {
        self.failed.load(Ordering::Acquire)
    }

    /// The error of a request that redundancy can no longer serve.
    pub fn unrecoverable(&self, offset_bytes: u64, len_bytes: u64, reason: &str) -> EngineError {
        EngineError::Unrecoverable {
            array: self.name.clone(),
            offset_bytes,
            len_bytes,
            reason: reason.to_string(),
        }
    }

    /// The error of a write whose metadata record (bitmap bits, used-region map) could not be
    /// made durable.
    pub fn metadata_failed(&self, offset_bytes: u64, len_bytes: u64, reason: &str) -> EngineError {
        EngineError::Metadata {
            array: self.name.clone(),
            offset_bytes,
            len_bytes,
            reason: reason.to_string(),
        }
    }

    /// What the members of `roles` hold at member byte `offset_bytes` failed verification
    /// beyond redundancy.
    pub fn corruption(
        &self,
        roles: &[usize],
        offset_bytes: u64,
        len_bytes: u64,
        reason: &str,
    ) -> EngineError {
        let names: Vec<String> = roles
            .iter()
            .map(|&r| {
                self.slots[r]
                    .member()
                    .map_or_else(|| format!("role {r}"), |m| m.name().to_string())
            })
            .collect();
        EngineError::Corruption {
            array: self.name.clone(),
            member: names.join(", "),
            offset_bytes,
            len_bytes,
            reason: reason.to_string(),
        }
    }

    /// Do the superblocks say "active" (durably)?
    pub fn is_active(&self) -> bool {
        self.active.load(Ordering::SeqCst)
    }

    /// The members filling roles, not faulty (rebuilding ones included): where replicated
    /// metadata (bitmap, used-region map) goes.
    pub fn role_members(&self) -> Vec<Arc<Member>> {
        self.slots.iter().filter_map(|s| s.usable()).collect()
    }

    pub fn role_of_member(&self, dev_number: u32) -> Option<usize> {
        self.slots
            .iter()
            .position(|s| s.member().is_some_and(|m| m.dev_number == dev_number))
    }

    /// The role `name` fills, faulty or not.
    pub fn role_named(&self, name: &str) -> Option<usize> {
        self.slots
            .iter()
            .position(|s| s.member().is_some_and(|m| m.name() == name))
    }

    /// Make the change made to `meta` durable on every member (events bump), then fail the
    /// members whose superblock could not take it.
    pub fn commit(&self, mut meta: MutexGuard<'_, Meta>) {
        let failed = self.commit_held(&mut meta);
        drop(meta);
        self.fail_after_sb_error(failed);
    }

    /// [`MemberSet::commit`] for a caller that must change more under the metadata lock after
    /// the commit: it hands the failures to [`MemberSet::fail_after_sb_error`] once it has let
    /// the lock go.
    pub fn commit_held(&self, meta: &mut Meta) -> SbFailures {
        let refused = |when: &str| {
            let why = self.coordinator.write_refusal()?;
            // A node the cluster may count gone writes nothing, superblocks included: the
            // change stays in memory here (the writes it was for are refused too).
            tracing::error!(array = %self.name, "superblock update not written ({when}): {why}");
            Some(SbFailures(Vec::new()))
        };
        if let Some(none) = refused("before") {
            return none;
        }
        self.coordinator.metadata_update_start();
        if let Some(none) = refused("while waiting for the cluster's metadata token") {
            self.coordinator.metadata_update_finish(meta.events);
            return none;
        }
        if self.coordinator.shares_metadata() {
            meta.catch_up_events();
        }
        let failed = meta.commit();
        self.coordinator.metadata_update_finish(meta.events);
        SbFailures(failed)
    }

    /// Record that the array is active on every member (durably) before the first member
    /// write of this run; `on_active` sets what the consistency policy wants said.
    pub fn mark_active(&self, on_active: impl FnOnce(&mut Meta)) {
        // SeqCst: the caller counted itself among the writes in commit first, and safe mode
        // clears `active` before it reads that count (see `SyncControl::mark_clean_if_idle`).
        if self.active.load(Ordering::SeqCst) {
            return;
        }
        let mut meta = self.meta.lock();
        if self.active.load(Ordering::SeqCst) {
            return;
        }
        on_active(&mut meta);
        let failed = self.commit_held(&mut meta);
        self.active.store(true, Ordering::SeqCst);
        drop(meta);
        self.fail_after_sb_error(failed);
    }

    /// Safe mode's and a clean stop's half of `active`: only under the metadata lock, which
    /// `mark_active` takes before it sets the flag again.
    pub fn set_active(&self, _meta: &Meta, active: bool) {
        self.active.store(active, Ordering::SeqCst);
    }

    /// Member failures whose superblock commit has not finished.
    pub fn failures_in_commit(&self) -> usize {
        self.failures_in_commit.load(Ordering::SeqCst)
    }

    /// Wait until every member failure set so far is recorded in the superblocks.
    pub fn wait_failures_durable(&self) {
        while self.failures_in_commit.load(Ordering::SeqCst) > 0 {
            // fail_role holds the metadata lock while it commits; failures are rare, so waiting
            // on the lock and yielding is cheaper than keeping a condition variable hot.
            drop(self.meta.lock());
            std::thread::yield_now();
        }
    }

    pub fn fail_after_sb_error(&self, failed: SbFailures) {
        self.fail_writers(failed.0, "superblock write failed");
    }

    /// Fail the members a write of replicated metadata (bitmap, used-region map) failed on.
    pub fn fail_metadata_writers(&self, failed: crate::members::paged::WriteFailures) {
        self.fail_writers(failed, "write-intent bitmap write failed");
    }

    fn fail_writers(&self, failed: Vec<(Arc<Member>, std::io::Error)>, what: &str) {
        for (member, err) in failed {
            if let Some(role) = self.role_of_member(member.dev_number) {
                self.fail_role(role, Some(&member), &format!("{what}: {err}"));
            }
        }
    }

    /// Mark the member in `role` faulty: stop using it, record it in every surviving
    /// superblock (events bump), and note whether the array can still serve everything.
    /// `expected`: the member the failure was seen on; nothing happens if the role holds
    /// another one by now.
    pub fn fail_role(&self, role: usize, expected: Option<&Arc<Member>>, why: &str) {
        let slot = &self.slots[role];
        let name = slot
            .member()
            .map(|m| m.name().to_string())
            .unwrap_or_else(|| format!("role {role}"));
        if self.geometry.max_degraded() == 0 {
            tracing::error!(array = %self.name, member = %name, "I/O error on a level without redundancy: {why}");
            return;
        }
        let mut meta = self.meta.lock();
        if slot.is_faulty() {
            return;
        }
        if let Some(m) = expected {
            if !slot.member().is_some_and(|cur| Arc::ptr_eq(&cur, m)) {
                return;
            }
        }
        // Raised before the failure is visible and lowered after the commit: a writer that
        // sees the member faulty (and skips it) then waits for this commit before acking.
        self.failures_in_commit.fetch_add(1, Ordering::SeqCst);
        slot.set_faulty();
        tracing::error!(array = %self.name, member = %name, role, "member marked faulty: {why}");
        if let Some(m) = slot.member() {
            meta.retire(m.dev_number, ROLE_FAULTY);
        }
        let survives = self.geometry.survives(&self.failed_roles());
        if !survives {
            self.failed.store(true, Ordering::Release);
        }
        let failed = self.commit_held(&mut meta);
        drop(meta);
        if let Some(m) = slot.member() {
            self.coordinator.member_failed(m.dev_number);
        }
        self.announce_failure(role, &name, why, survives);
        self.watch.member_failed();
        // Survivors whose superblock could not record this fail too, before anyone waiting
        // for this failure to be durable goes on (if none could, the array has failed).
        self.fail_after_sb_error(failed);
        self.failures_in_commit.fetch_sub(1, Ordering::SeqCst);
    }

    fn announce_failure(&self, role: usize, name: &str, why: &str, survives: bool) {
        self.events.emit(
            "member_faulty",
            &self.name,
            Some(name),
            format!("role {role}: {why}"),
        );
        if !survives {
            self.events.emit(
                "array_failed",
                &self.name,
                None,
                "more members lost than the level tolerates; writes refused".into(),
            );
            return;
        }
        self.events.emit(
            "array_degraded",
            &self.name,
            None,
            format!("running without role {role}"),
        );
        let exposed = self.watch.exposed_rows();
        if exposed > 0 {
            tracing::error!(array = %self.name, rows = exposed,
                "degraded with rows a crash may have torn not yet resynced: their rebuilt blocks read as errors");
            self.events.emit(
                "torn_rows_exposed",
                &self.name,
                Some(name),
                format!(
                    "{exposed} rows a crash may have left mid-write were not resynced yet; \
                     without role {role} their blocks cannot be rebuilt with certainty: \
                     reads of them fail (the write hole)"
                ),
            );
        }
    }

    /// The journal device failed and what it covered is durable on the members (see
    /// `journal_fail.rs`): record it faulty in every superblock, so that the next assembly
    /// knows the log is gone.
    pub fn journal_failed(&self, member: &Arc<Member>, why: &str) {
        tracing::error!(array = %self.name, journal = %member.name(), "journal failed: {why}; its cache is written out and the members flushed; the array is read-only now");
        let mut meta = self.meta.lock();
        meta.retire(member.dev_number, ROLE_FAULTY);
        self.commit(meta);
        self.events.emit(
            "journal_failed",
            &self.name,
            Some(member.name()),
            format!("{why}; writes are refused, reads go on"),
        );
    }

    /// Count one unreadable block of `member` (filling `role`); past [`MAX_READ_ERRORS`] the
    /// member is failed (returns true), as md fails a member past `max_read_errors`.
    pub fn note_read_error(&self, role: usize, member: &Arc<Member>) -> bool {
        if !member.health.note_read_error() {
            return false;
        }
        self.fail_role(
            role,
            Some(member),
            &format!("more than {MAX_READ_ERRORS} read errors"),
        );
        true
    }

    /// Record data-area bytes `off..off + len` of `member` (filling `role`) as bad blocks: the
    /// member lacks what belongs there. Durable (log, then the superblock's BAD_BLOCKS bit)
    /// before this returns. A member that cannot record it is failed instead.
    pub fn record_bad_blocks(
        &self,
        role: usize,
        member: &Arc<Member>,
        off: u64,
        len: u64,
        why: &str,
    ) {
        match member.health.record(member, off, len) {
            Ok(false) => {}
            Ok(true) => {
                tracing::error!(array = %self.name, member = %member.name(), role, offset = off,
                    len, "recorded as bad blocks: {why}");
                self.commit(self.meta.lock());
                self.events.emit(
                    "bad_blocks_recorded",
                    &self.name,
                    Some(member.name()),
                    format!("role {role}: data bytes {off}+{len} recorded bad: {why}"),
                );
            }
            Err(e) => self.fail_role(
                role,
                Some(member),
                &format!("cannot record bad blocks at data byte {off} ({why}): {e}"),
            ),
        }
    }
}
