//! Background work of an array: recovery onto spares, resync after an unclean stop, and
//! scrubbing (check/repair), one at a time, throttled, checkpointed.
//!
//! Priorities (md's): recovery of a missing role first (a spare is assigned the first role that
//! has no complete member), then a pending resync, then an administrator's request. `frozen`
//! stops everything and starts nothing; `idle` interrupts the running action (a pending resync
//! or recovery then starts again, as in md).
//!
//! Why windows cannot lose writes: every unit of work (a stripe for parity levels, a region for
//! mirrors) first takes the same exclusive claim client writes take (the stripe's `busy`, the
//! mirror region lock), reads, writes, advances the rebuilt-up-to point, and only then releases.
//!
//! Rate control mirrors md's `sync_speed_min`/`sync_speed_max`: never faster than max; above
//! min, pause while clients did I/O in the last few milliseconds.

pub(crate) mod rebuild;

use crate::clock::Clock;
use crate::personality::parts::Parts;
use crate::personality::parts::Walker;
use crate::policy::used;
use crate::policy::ConsistencyPolicy;
pub(crate) use crate::work::Stop;
pub use crate::work::SyncAction;
use parking_lot::{Condvar, Mutex};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

/// What a member failure sets off above the member set: the torn-row count for its event and
/// a wake-up of background work (a spare may take the role).
pub(crate) struct Exposure {
    pub geometry: layout::Geometry,
    pub slots: std::sync::Arc<Vec<crate::members::Slot>>,
    pub bitmap: Option<std::sync::Arc<crate::policy::bitmap::WriteIntentBitmap>>,
    pub sync: std::sync::Arc<SyncControl>,
}

impl crate::members::FailureWatch for Exposure {
    fn exposed_rows(&self) -> u64 {
        let owed = self.sync.resync_owed();
        let torn = self.bitmap.as_ref().map(|b| b.needed_bytes());
        crate::personality::raid456::exposed_rows(&self.geometry, &self.slots, torn, owed)
    }

    fn member_failed(&self) {
        self.sync.wake();
    }
}

/// Progress of the background work, for status.
#[derive(Clone, Debug)]
pub struct SyncStatus {
    pub action: SyncAction,
    pub done_bytes: u64,
    pub total_bytes: u64,
    /// Of `total - done`, what will really be read and written (unused regions are skipped):
    /// what an ETA divides by the rate, which counts only such work too.
    pub left_bytes: u64,
    pub rate_bytes_per_s: u64,
    /// Sectors found inconsistent by the last check/repair/resync (md's `mismatch_cnt`).
    pub mismatch_sectors: u64,
    pub frozen: bool,
    pub last_action: SyncAction,
    /// How long the last action that ended ran, from its start (or resumption) to its end,
    /// final flush included.
    pub last_duration_ms: u64,
    /// The same in microseconds (a bitmap resync can take a few ms).
    pub last_duration_us: u64,
    pub speed_min_bytes: u64,
    pub speed_max_bytes: u64,
}

/// md's defaults: 1000 KiB/s guaranteed, 200000 KiB/s at most.
pub const DEFAULT_SPEED_MIN: u64 = 1000 * 1024;
pub const DEFAULT_SPEED_MAX: u64 = 200_000 * 1024;
/// How long after a client request the array counts as busy.
const CLIENT_BUSY: Duration = Duration::from_millis(20);
/// The rate limits apply to the rate over about this much of the recent past.
const RATE_WINDOW: Duration = Duration::from_secs(3);
/// Checkpoints go to the superblocks at least this often during long work.
pub(crate) const CHECKPOINT_EVERY: Duration = Duration::from_secs(2);

pub(crate) struct SyncState {
    pub requested: Option<SyncAction>,
    pub frozen: bool,
    pub stop: bool,
    pub interrupt: bool,
    pub running: SyncAction,
    pub last: SyncAction,
    /// When the running action started, and how long the last one ran.
    pub started: Duration,
    pub last_duration: Duration,
    pub done: u64,
    pub total: u64,
    pub rate: u64,
    pub mismatches: u64,
    /// Resync needed from this per-device byte offset (array bytes for RAID10).
    pub resync_from: Option<u64>,
    /// A resync that failed (e.g. a full backing store) is tried again only after this time.
    pub retry_resync_at: Option<Duration>,
    /// While a resync runs: the earliest point reported inconsistent since it started.
    pub rewind_to: Option<u64>,
    pub speed_min: u64,
    pub speed_max: u64,
}

pub(crate) struct SyncControl {
    /// Mirrors may differ somewhere (resync pending): reads take the first copy, as md does,
    /// so that reading a block twice gives the same answer.
    pub unsynced: std::sync::atomic::AtomicBool,
    pub st: Mutex<SyncState>,
    pub cv: Condvar,
    pub clock: Arc<dyn Clock>,
    pub last_client_io_ms: std::sync::atomic::AtomicU64,
    /// The walk driven by [`Array::sync_step`] (simulation); the background thread keeps its
    /// own. Never both: `sync_step` refuses while the thread runs.
    stepped: Mutex<Option<Walk>>,
    /// The background thread, while it runs.
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// The consistency policy's thread (bitmap clean-up, journal reclaim), while it runs.
    policy_thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl SyncControl {
    /// Stop background work (the walker and the policy's thread), checkpointing the walk.
    pub(crate) fn stop(&self, array: &Parts) {
        {
            let mut st = self.st.lock();
            st.stop = true;
            st.interrupt = true;
        }
        self.wake();
        if let Some(h) = self.thread.lock().take() {
            let _ = h.join();
        }
        if let Some(h) = self.policy_thread.lock().take() {
            let _ = h.join();
        }
        if let Some(walk) = self.stepped.lock().take() {
            self.finish_job(array, &walk, Err(Stop::Interrupted));
        }
    }

    /// Redundancy from `offset_bytes` (per member; array bytes for mirrors) on may disagree
    /// with the data: resync from there (or from wherever an earlier request said).
    pub(crate) fn request_resync_from(
        &self,
        policy: &dyn crate::policy::ConsistencyPolicy,
        offset_bytes: u64,
    ) {
        policy.taint();
        let mut st = self.st.lock();
        self.unsynced.store(true, Ordering::Release);
        if st.running == SyncAction::Resync {
            // The running resync may be past this point already: it stops and starts again
            // from here (its own progress is in its walk, not in `resync_from`).
            st.rewind_to = Some(st.rewind_to.map_or(offset_bytes, |r| r.min(offset_bytes)));
            st.interrupt = true;
        } else {
            st.resync_from = Some(st.resync_from.map_or(offset_bytes, |f| f.min(offset_bytes)));
        }
        drop(st);
        self.wake();
    }

    /// Run `tick` every `period` until background work stops (the policy threads: bitmap
    /// clean-up, journal write-out and reclaim).
    pub(crate) fn until_stopped(&self, period: Duration, mut tick: impl FnMut()) {
        while !self.st.lock().stop {
            self.clock.park(period);
            tick();
        }
    }

    /// Is a resync owed (redundancy may disagree with the data somewhere)?
    pub fn resync_owed(&self) -> bool {
        self.unsynced.load(std::sync::atomic::Ordering::Acquire)
    }

    pub fn new(resync_from: Option<u64>, clock: Arc<dyn Clock>) -> SyncControl {
        SyncControl {
            unsynced: std::sync::atomic::AtomicBool::new(resync_from.is_some()),
            st: Mutex::new(SyncState {
                requested: None,
                frozen: false,
                stop: false,
                interrupt: false,
                running: SyncAction::Idle,
                last: SyncAction::Idle,
                started: Duration::ZERO,
                last_duration: Duration::ZERO,
                done: 0,
                total: 0,
                rate: 0,
                mismatches: 0,
                resync_from,
                retry_resync_at: None,
                rewind_to: None,
                speed_min: DEFAULT_SPEED_MIN,
                speed_max: DEFAULT_SPEED_MAX,
            }),
            cv: Condvar::new(),
            clock,
            last_client_io_ms: std::sync::atomic::AtomicU64::new(0),
            stepped: Mutex::new(None),
            thread: Mutex::new(None),
            policy_thread: Mutex::new(None),
        }
    }

    pub fn note_client_io(&self) {
        // +1: 0 means "no client I/O yet".
        let now = self.clock.now().as_millis() as u64 + 1;
        self.last_client_io_ms.store(now, Ordering::Relaxed);
    }

    fn client_busy(&self) -> bool {
        let last = self.last_client_io_ms.load(Ordering::Relaxed);
        let now = self.clock.now().as_millis() as u64 + 1;
        last != 0 && now.saturating_sub(last) < CLIENT_BUSY.as_millis() as u64
    }

    pub fn wake(&self) {
        self.cv.notify_all();
    }

    /// The background thread runs (`Array::start_background`); a stop joins it.
    pub(crate) fn started(&self, handle: std::thread::JoinHandle<()>) {
        *self.thread.lock() = Some(handle);
    }

    /// The consistency policy's thread runs; a stop joins it.
    pub(crate) fn policy_started(&self, handle: std::thread::JoinHandle<()>) {
        *self.policy_thread.lock() = Some(handle);
    }
}

/// The walker as the parts see it: they ask and tell, its state stays here.
impl Walker for SyncControl {
    fn resync_owed(&self) -> bool {
        SyncControl::resync_owed(self)
    }

    fn request_resync_from(&self, policy: &dyn ConsistencyPolicy, offset_bytes: u64) {
        SyncControl::request_resync_from(self, policy, offset_bytes);
    }

    fn wake(&self) {
        SyncControl::wake(self);
    }

    fn until_stopped(&self, period: Duration, tick: &mut dyn FnMut()) {
        SyncControl::until_stopped(self, period, tick);
    }
}

/// The walker's side of the facade's sync operations (`array/sync.rs`).
impl SyncControl {
    /// md's safe mode: an array with no member write for [`SAFE_MODE_DELAY`] is recorded clean
    /// (with the resync checkpoint, if one is pending), so that a crash while idle costs no
    /// resync. Every write completed is durable first (the superblock commit flushes). The next
    /// write records "active" again before it goes out.
    ///
    /// Why no write can slip through: a write counts itself inside the commit point and then
    /// reads `active`; this clears `active` and then reads the count (all SeqCst). Either it sees
    /// the write and backs off, or the write sees `active` false and waits on the metadata lock,
    /// held here, to record "active" again after this commit.
    pub(crate) fn mark_clean_if_idle(&self, parts: &Parts) {
        if !parts.members.is_active() || parts.config.read_only || parts.is_failed() {
            return;
        }
        let now = self.clock.now().as_millis() as u64 + 1;
        let last = parts.commit.last_write_ms();
        if now.saturating_sub(last) < SAFE_MODE_DELAY.as_millis() as u64 {
            return;
        }
        let resync_from = {
            let st = self.st.lock();
            if st.running != crate::work::SyncAction::Idle {
                return;
            }
            st.resync_from
        };
        let mut meta = parts.members.meta.lock();
        if !parts.members.is_active() {
            return;
        }
        parts.members.set_active(&meta, false);
        if parts.commit.writes_inside().load(Ordering::SeqCst) > 0
            || parts.members.failures_in_commit() > 0
        {
            parts.members.set_active(&meta, true);
            return;
        }
        if parts
            .integrity
            .as_ref()
            .is_some_and(|i| i.has_dirty_tables())
        {
            // Records of the last writes are not on disk yet: write them (the array stays
            // active; a later pass records clean).
            parts.members.set_active(&meta, true);
            drop(meta);
            parts.flush_members();
            return;
        }
        // Every member flushed before any superblock says clean: the commit's own flush is per
        // member, and a cut between two of them must not leave one saying clean while another
        // still holds the last writes in a volatile cache. A flush that fails leaves the array
        // active; the next write or flush meets the error and fails the member.
        let flushed = meta
            .members
            .iter()
            .filter(|m| m.writable)
            .all(|m| m.member.dev.flush().is_ok());
        if !flushed {
            parts.members.set_active(&meta, true);
            return;
        }
        parts.policy.on_clean(&mut meta, resync_from);
        parts.members.commit(meta);
    }

    /// Request `check`, `repair`, `resync`, `idle` or `frozen` (md's `sync_action`).
    pub(crate) fn request_action(&self, parts: &Parts, action: &str) -> crate::Result<()> {
        let mut st = self.st.lock();
        match action {
            "idle" => {
                st.interrupt = st.running != SyncAction::Idle;
                st.requested = None;
                st.frozen = false;
            }
            "frozen" => {
                st.frozen = true;
                st.interrupt = st.running != SyncAction::Idle;
            }
            "check" | "repair" | "resync" => {
                if parts.personality.redundancy() == 0 {
                    return Err(crate::EngineError::Unsupported(format!(
                        "{} has no redundancy to check",
                        parts.name
                    )));
                }
                if st.running != SyncAction::Idle || st.requested.is_some() {
                    return Err(crate::EngineError::InvalidArgument(busy_message(
                        &parts.name,
                        &st,
                    )));
                }
                if parts.members.slots.iter().any(|s| !s.is_complete()) {
                    return Err(crate::EngineError::InvalidArgument(format!(
                        "{} is degraded; nothing to compare",
                        parts.name
                    )));
                }
                st.frozen = false;
                st.requested = Some(match action {
                    "check" => SyncAction::Check,
                    "repair" => SyncAction::Repair,
                    _ => SyncAction::Resync,
                });
            }
            other => {
                return Err(crate::EngineError::InvalidArgument(format!(
                    "unknown action '{other}' (check, repair, resync, idle, frozen)"
                )))
            }
        }
        drop(st);
        self.wake();
        Ok(())
    }

    /// Set md's `sync_speed_min`/`sync_speed_max` (bytes per second).
    pub(crate) fn set_speed(&self, min: Option<u64>, max: Option<u64>) {
        let mut st = self.st.lock();
        if let Some(m) = min {
            st.speed_min = m;
        }
        if let Some(m) = max {
            st.speed_max = m.max(1);
        }
    }

    pub(crate) fn status(&self, parts: &Parts) -> SyncStatus {
        let st = self.st.lock();
        let (done, total) = (st.done, st.total);
        let mut s = SyncStatus {
            action: st.running,
            done_bytes: done,
            total_bytes: total,
            left_bytes: 0,
            rate_bytes_per_s: st.rate,
            mismatch_sectors: st.mismatches,
            frozen: st.frozen,
            last_action: st.last,
            last_duration_ms: st.last_duration.as_millis() as u64,
            last_duration_us: st.last_duration.as_micros() as u64,
            speed_min_bytes: st.speed_min,
            speed_max_bytes: st.speed_max,
        };
        drop(st);
        s.left_bytes = if s.action == SyncAction::Idle {
            0
        } else {
            used::work_within(parts.used.as_deref(), done..total)
        };
        s
    }

    /// Block until no background action runs or is pending (tests, `action --wait`).
    pub(crate) fn wait_idle(&self, parts: &Parts, timeout: Duration) -> bool {
        let deadline = parts.clock.deadline(timeout);
        let mut st = self.st.lock();
        loop {
            let pending = st.requested.is_some()
                || (st.resync_from.is_some() && !st.frozen && st.retry_resync_at.is_none());
            let recovering = !st.frozen
                && parts.members.slots.iter().any(|s| !s.is_complete())
                && self.has_spare_or_partial(parts);
            if st.running == SyncAction::Idle && !pending && !recovering {
                return true;
            }
            if self.cv.wait_until(&mut st, deadline).timed_out() {
                return false;
            }
        }
    }

    /// Run one window of background work on the calling thread: the deterministic simulation
    /// drives rebuild, resync and scrub with this instead of the background thread. Picks the
    /// next action as the thread would. Returns the action that ran, or `Idle` if none.
    pub(crate) fn step(&self, parts: &Parts) -> SyncAction {
        assert!(
            self.thread.lock().is_none(),
            "sync_step while the background thread runs"
        );
        let mut stepped = self.stepped.lock();
        if stepped.is_none() {
            let mut st = self.st.lock();
            if st.stop {
                return SyncAction::Idle;
            }
            *stepped = self.next_walk(parts, &mut st);
            drop(st);
            if let Some(w) = stepped.as_ref() {
                self.announce(parts, w);
            }
        }
        let Some(walk) = stepped.as_mut() else {
            drop(stepped);
            self.mark_clean_if_idle(parts);
            return SyncAction::Idle;
        };
        let action = walk.action;
        let stopped = {
            let st = self.st.lock();
            st.interrupt || st.frozen || parts.is_failed()
        };
        let res = if stopped {
            Err(Stop::Interrupted)
        } else {
            walk.step(parts, self).map(|done| !done)
        };
        {
            let mut st = self.st.lock();
            st.done = walk.pos;
        }
        match res {
            Ok(true) => {}
            Ok(false) => {
                let walk = stepped.take().expect("walk present");
                self.finish_job(parts, &walk, Ok(()));
            }
            Err(stop) => {
                let walk = stepped.take().expect("walk present");
                self.finish_job(parts, &walk, Err(stop));
            }
        }
        action
    }
}

/// md's `safe_mode_delay`: how long without member writes before the array is recorded clean.
pub(crate) const SAFE_MODE_DELAY: Duration = Duration::from_millis(200);

/// How long a failed resync waits before it is tried again.
const RESYNC_RETRY: Duration = Duration::from_secs(5);

#[derive(Clone, Copy, Debug)]
enum Job {
    Recover(usize),
    /// Resync from this offset; `full`: every byte (an administrator's request), not only
    /// what the consistency policy says may be inconsistent.
    Resync {
        from: u64,
        full: bool,
    },
    Scrub(SyncAction),
}

/// Tracks one action's progress and paces it.
pub(crate) struct Pace {
    start: Duration,
    worked_at_start: u64,
    last_checkpoint: Duration,
}

/// Why `check`, `repair` or `resync` cannot start now, and what would let it: an action
/// `idle` interrupts only to take it up again (recovery and resync come first, as in md)
/// must not be suggested as the way out.
fn busy_message(name: &str, st: &SyncState) -> String {
    match (st.running, st.requested) {
        (SyncAction::Recover, _) => format!(
            "{name} is rebuilding a member; check, repair and resync can start once the \
             rebuild has finished ('idle' would only pause it, and it resumes first)"
        ),
        (SyncAction::Resync, _) => format!(
            "{name} is resyncing (which rewrites redundancy that disagrees anyway); ask again \
             once it has finished ('idle' would only pause it, and it resumes first)"
        ),
        (SyncAction::Idle, Some(next)) => {
            format!(
                "{name} has {} requested already, about to start",
                next.name()
            )
        }
        (running, _) => format!(
            "{name} is busy with {}; request 'idle' to stop it first",
            running.name()
        ),
    }
}

/// One background action walking the array window by window: the one loop rebuild, resync and
/// check/repair share. Each window takes the same exclusive claim client writes take, does its
/// work and releases; `pos` only moves past a window once it is done.
pub(crate) struct Walk {
    job: Job,
    action: SyncAction,
    /// Per-member bytes (array bytes for mirror resync/scrub of RAID10) done so far.
    pos: u64,
    end: u64,
    /// Bytes of `pos` that were really read and written (not skipped as unused or clean):
    /// what the rate limits count, as md counts only sync I/O.
    worked: u64,
    pace: Pace,
    /// Windows wait for the rate limits (the background thread's walk; the simulation's
    /// `sync_step` runs each window when asked).
    paced: bool,
    member: Option<String>,
}

impl Walk {
    /// Other nodes of a cluster keep their writes out of the window `pos..hi` this one rewrites
    /// (a check only reads: nothing to announce).
    fn announce_window(&self, array: &Parts, hi: u64) -> Result<(), Stop> {
        if matches!(self.job, Job::Scrub(SyncAction::Check)) {
            return Ok(());
        }
        let kind = match self.job {
            Job::Recover(role) => match array.members.slots[role].member() {
                Some(m) => crate::cluster::SyncKind::Recovery {
                    dev_number: m.dev_number,
                    role,
                },
                None => return Err(Stop::Interrupted),
            },
            _ => crate::cluster::SyncKind::Resync,
        };
        array
            .members
            .coordinator()
            .resync_info_update(kind, self.pos..hi);
        Ok(())
    }

    /// Where the next window ends: one sync window on, or, in a cluster, over the whole run of
    /// regions no node's used-region map has set from `pos` on (skipped in one step).
    fn window_end(&self, array: &Parts) -> u64 {
        // The personality's window, whole units or stripes: the one its work covers.
        let normal = (self.pos + array.personality.sync_window(array)).min(self.end);
        if matches!(self.job, Job::Recover(_)) && array.personality.recovery_maps_chunks() {
            // RAID10 rebuilds in member bytes; the maps are in array bytes.
            return normal;
        }
        let unused_to =
            used::unused_run_elsewhere(array.used.as_deref(), &array.members, self.pos, self.end);
        normal.max(unused_to)
    }

    /// Wait until the rate limits let a window of up to `coming` bytes of real work start.
    fn charge(&mut self, array: &Parts, sync: &SyncControl, coming: u64) -> Result<(), Stop> {
        if !self.paced {
            return Ok(());
        }
        let coming = coming.min(array.personality.sync_window(array));
        sync.pace(array, &mut self.pace, self.pos, (self.worked, coming))
    }

    /// One recovery window of `role`, skipping (unused regions up to `limit`, clean chunks)
    /// where it can: where the next starts, and whether it copied.
    fn recover_step(
        &mut self,
        array: &Parts,
        sync: &SyncControl,
        role: usize,
        limit: u64,
    ) -> Result<(u64, bool), Stop> {
        if let Some(res) = rebuild::skip_unused_for_recovery(array, role, self.pos, limit) {
            return Ok((res?, false));
        }
        if let Some(next) = rebuild::skip_clean_for_recovery(array, role, self.pos, self.end) {
            return Ok((next, false));
        }
        // Up to the end of the used run: what follows is skipped, not copied. (RAID10
        // rebuilds in member bytes, its map is in array bytes: chunk by chunk.)
        let stop = match array.personality.recovery_maps_chunks() {
            true => rebuild::raid10_copy_end(array, role, self.pos, limit),
            false => used::used_within(array.used.as_deref(), self.pos..self.end).end,
        };
        self.charge(array, sync, stop - self.pos)?;
        let next = array
            .personality
            .recover_window(array, role, self.pos, stop)?;
        Ok((next, true))
    }

    /// Announce the next window to the cluster's other nodes: the bound of this step's work
    /// and skipping (the walk's end outside a cluster); None if the step was only a move to
    /// the next chunk a resync needs.
    fn open_window(&mut self, array: &Parts, sync: &SyncControl) -> Result<Option<u64>, Stop> {
        // Other nodes hold only the announced window: all of a step's work and skipping stays
        // inside it. Clean chunks need no window to be passed over, so a resync moves to the
        // next one first (a window announced at `pos` would not cover it).
        let shared = array.members.coordinator().shares_metadata();
        if let Job::Resync { full: false, .. } = self.job {
            let todo = array.policy.next_to_resync(self.pos, self.end);
            if shared && todo.start > self.pos {
                self.pos = todo.start;
                return Ok(None);
            }
        }
        let hi = self.window_end(array);
        if shared {
            // Other nodes keep their writes out of an announced window: the rate limits'
            // wait comes before it (counting the whole window; the wait for the work found
            // in it then passes at once).
            self.charge(array, sync, hi - self.pos)?;
        }
        self.announce_window(array, hi)?;
        if !shared {
            return Ok(Some(self.end));
        }
        match self.job {
            // RAID10 rebuilds in member bytes; its maps are in array bytes: read them whole.
            Job::Recover(_) if array.personality.recovery_maps_chunks() => used::read_other_maps(
                array.used.as_deref(),
                &array.members,
                0,
                array.personality.sync_total(SyncAction::Resync),
            ),
            _ => used::read_other_maps(array.used.as_deref(), &array.members, self.pos, hi),
        }
        Ok(Some(hi))
    }

    /// One window; `Ok(true)` once the walk reached its end.
    fn step(&mut self, array: &Parts, sync: &SyncControl) -> Result<bool, Stop> {
        let from = self.pos;
        let res = self.window(array, sync);
        // A step that went on from where it started would come back to the same window for
        // ever (and writers re-dirtying it would keep it busy): every step moves the walk on.
        assert!(
            !matches!(res, Ok(false)) || self.pos > from,
            "{:?} walk stayed at byte {from} of {}",
            self.action,
            self.end
        );
        res
    }

    /// The work of one step: a window done, or skipped over.
    fn window(&mut self, array: &Parts, sync: &SyncControl) -> Result<bool, Stop> {
        if self.pos >= self.end {
            return Ok(true);
        }
        let coordinator = array.members.coordinator();
        let rebuilding = matches!(self.job, Job::Recover(_));
        if coordinator.sync_refusal().is_some() || (rebuilding && !coordinator.recovery_allowed()) {
            // Another node took the work over, or came while a member is rebuilt (it does not
            // know of the rebuilding member): the walk stops here, its progress recorded, and
            // resumes from there when it may.
            return Err(Stop::Interrupted);
        }
        if !matches!(self.job, Job::Recover(_)) && sync.parity_degraded(array) {
            // A member went missing meanwhile: with it, the parity a resync would check is
            // what reconstructs the missing chunks, so "checking" it proves nothing and calling
            // the array in sync would hide the write hole. Stop; the resync stays pending and
            // resumes after the rebuild.
            return Err(Stop::Interrupted);
        }
        let Some(limit) = self.open_window(array, sync)? else {
            return Ok(self.pos >= self.end);
        };
        // Where the real work of this step starts (None: the step only skips).
        let work_from;
        let next = match self.job {
            Job::Recover(role) => {
                let (next, worked) = self.recover_step(array, sync, role, limit)?;
                work_from = worked.then_some(self.pos);
                next
            }
            Job::Resync { full, .. } => {
                // The policy may know that parts are consistent (the bitmap: chunks without a
                // set bit), and unused regions are (zero everywhere).
                let todo = if full {
                    self.pos..limit
                } else {
                    array.policy.next_to_resync(self.pos, limit)
                };
                let work = used::used_within(array.used.as_deref(), todo.clone());
                if work.start >= todo.end {
                    array.policy.resynced(todo.start, todo.end);
                    self.pos = todo.end;
                    return Ok(self.pos >= self.end);
                }
                work_from = Some(work.start);
                self.charge(array, sync, work.end - work.start)?;
                let next = sync.scrub_step(array, SyncAction::Resync, work.start, work.end)?;
                array.policy.resynced(todo.start, next.min(self.end));
                next
            }
            Job::Scrub(a) => {
                let work = used::used_within(array.used.as_deref(), self.pos..limit);
                if work.start >= limit {
                    self.pos = limit;
                    return Ok(self.pos >= self.end);
                }
                work_from = Some(work.start);
                self.charge(array, sync, work.end - work.start)?;
                sync.scrub_step(array, a, work.start, work.end)?
            }
        };
        assert!(next > self.pos, "a window must make progress");
        self.pos = next.min(self.end);
        if let Some(from) = work_from {
            self.worked += self.pos.saturating_sub(from);
        }
        if let Job::Recover(role) = self.job {
            let now = sync.clock.now();
            if now.saturating_sub(self.pace.last_checkpoint) > CHECKPOINT_EVERY {
                sync.checkpoint_recovery(array, role);
                self.pace.last_checkpoint = now;
            }
        }
        Ok(self.pos >= self.end)
    }
}

impl SyncControl {
    /// A parity level with a role not complete.
    pub(crate) fn parity_degraded(&self, array: &Parts) -> bool {
        array.personality.uses_stripe_cache()
            && array.members.slots.iter().any(|s| !s.is_complete())
    }

    /// A role to rebuild: one partly rebuilt, or a missing one and a spare to give it.
    fn recovery_pending(&self, array: &Parts) -> bool {
        let slots = &array.members.slots;
        slots.iter().any(|s| !s.is_faulty() && !s.is_complete())
            || (slots.iter().any(|s| s.is_faulty()) && !array.members.spares.lock().is_empty())
    }

    fn has_spare_or_partial(&self, array: &Parts) -> bool {
        !array.members.spares.lock().is_empty()
            || array
                .members
                .slots
                .iter()
                .any(|s| !s.is_faulty() && !s.is_complete())
    }

    /// Pick the next action, if any, and mark it running (under the sync lock, so waiters never
    /// see a gap between "requested" and "running").
    fn next_walk(&self, array: &Parts, st: &mut SyncState) -> Option<Walk> {
        st.interrupt = false;
        if array.members.coordinator().sync_refusal().is_some() {
            // Another node could write into a window this one rewrites: the work waits (the
            // loop asks again), and stays pending.
            return None;
        }
        let job = self.next_job(array, st)?;
        let (action, from) = match job {
            Job::Recover(role) => (
                SyncAction::Recover,
                array.members.slots[role].in_sync_bytes(),
            ),
            Job::Resync { from, .. } => (SyncAction::Resync, from),
            Job::Scrub(a) => (a, 0),
        };
        let end = match job {
            Job::Recover(role) => array.personality.recovery_end(role),
            _ => array.personality.sync_total(action),
        };
        st.running = action;
        st.started = self.clock.now();
        st.done = from.min(end);
        st.total = end;
        st.rate = 0;
        if action != SyncAction::Recover {
            st.mismatches = 0;
        }
        let now = self.clock.now();
        Some(Walk {
            job,
            action,
            pos: from.min(end),
            end,
            worked: 0,
            pace: Pace {
                start: now,
                worked_at_start: 0,
                last_checkpoint: now,
            },
            paced: false,
            member: match job {
                Job::Recover(role) => array.members.slots[role]
                    .member()
                    .map(|m| m.name().to_string()),
                _ => None,
            },
        })
    }

    fn run_walk(&self, array: &Parts, mut walk: Walk) {
        self.announce(array, &walk);
        walk.paced = true;
        let res = loop {
            if let Err(stop) = self.pace(array, &mut walk.pace, walk.pos, (walk.worked, 0)) {
                break Err(stop);
            }
            match walk.step(array, self) {
                Ok(true) => break Ok(()),
                Ok(false) => {}
                Err(stop) => break Err(stop),
            }
        };
        self.finish_job(array, &walk, res);
    }

    fn announce(&self, array: &Parts, walk: &Walk) {
        if walk.action == SyncAction::Resync {
            // A guided array that fell back (the guide timeout) records it before the resync
            // writes anything.
            array.policy.resync_starts(array);
        }
        if let (Job::Resync { full: true, .. }, Some(bm)) = (&walk.job, array.policy.bitmap()) {
            // An administrator's full resync on a bitmap array: every bit set, and the
            // superblocks "active", first, so that after a crash or a stop the bitmap-guided
            // resync that resumes it still covers what it had not reached.
            // On a guided array also the fallback flag: a guide after that crash would name
            // what a file system had in flight, not what this resync had not reached.
            if let (Some(_), Some(u)) = (array.policy.guidance(), &array.used) {
                if !array.is_read_only() {
                    u.set_flag(&array.members, format::USED_MAP_FLAG_RESYNC_OWED, true);
                }
            }
            let _counted = array.commit.enter(self.clock.as_ref());
            if let Err(e) = bm
                .need_everything(&array.members)
                .and_then(|()| array.mark_active())
            {
                tracing::warn!(array = %array.name, "cannot set the bitmap for a full resync: {e}");
            }
        }
        array.members.events.emit(
            started_event(walk.action),
            &array.name,
            walk.member.as_deref(),
            format!(
                "{} started at byte {} of {}",
                walk.action.name(),
                walk.pos,
                walk.end
            ),
        );
    }

    fn next_job(&self, array: &Parts, st: &mut SyncState) -> Option<Job> {
        if st.frozen || array.is_failed() || array.config.read_only {
            return None;
        }
        if self.recovery_pending(array) && array.members.coordinator().recovery_starts() {
            if let Some(role) = self.pick_recovery(array) {
                return Some(Job::Recover(role));
            }
            array.members.coordinator().recovery_paused();
        }
        let degraded = array.members.slots.iter().any(|s| !s.is_complete());
        // A degraded parity array has no redundancy left to make consistent (resync waits for
        // the rebuild); mirrors resync the copies they still have, as md does.
        if self.parity_degraded(array) {
            return None;
        }
        // A guided array waits for its guide (until the guide timeout) before resyncing.
        if let Some(from) = st.resync_from.filter(|_| !array.policy.holds_resync(array)) {
            match st.retry_resync_at {
                Some(at) if self.clock.now() < at => {}
                _ => {
                    st.retry_resync_at = None;
                    return Some(Job::Resync { from, full: false });
                }
            }
        }
        if degraded {
            return None;
        }
        match st.requested.take() {
            Some(SyncAction::Resync) => {
                st.resync_from = Some(0);
                self.unsynced.store(true, Ordering::Release);
                Some(Job::Resync {
                    from: 0,
                    full: true,
                })
            }
            Some(a) => Some(Job::Scrub(a)),
            None => None,
        }
    }

    fn finish_job(&self, array: &Parts, walk: &Walk, res: Result<(), Stop>) {
        let action = walk.action;
        let member = walk.member.as_deref();
        if let Job::Recover(role) = walk.job {
            // Recorded before the other nodes of a cluster let the last window go: they read
            // from the member's superblock how far it got (whole: they use all of it).
            match &res {
                Ok(()) => self.finish_recovery(array, role),
                Err(_) => self.checkpoint_recovery(array, role),
            }
            array.members.coordinator().resync_finish();
            array.members.coordinator().recovery_paused();
        } else {
            array.members.coordinator().resync_finish();
        }
        if let Some(integ) = array
            .integrity
            .as_ref()
            .filter(|_| res.is_ok() && matches!(action, SyncAction::Check | SyncAction::Repair))
        {
            // Scrub the tables too: every copy on disk against the records (the changed ones
            // written out first); `repair` rewrites the wrong ones.
            array.flush_members();
            // Tables cover member bytes; the used-region map's are RAID10's array bytes.
            let unused = |from: u64, to: u64| {
                !array.personality.recovery_maps_chunks()
                    && used::used_within(array.used.as_deref(), from..to).start >= to
            };
            if integ.verify_tables(action == SyncAction::Repair, unused) > 0
                && action == SyncAction::Repair
            {
                array.flush_members();
            }
        }
        if res.is_ok() && matches!(action, SyncAction::Resync | SyncAction::Repair) {
            // What the resync or repair rewrote is durable before redundancy counts as good
            // again (md writes its superblock with a preflush at the end of a sync): the copy
            // or parity it made may soon be all that is left of a block. A flush failure fails
            // the member, which the array then reports.
            let _ = array.flush();
        }
        let mismatches;
        let mut resynced = false;
        {
            let mut st = self.st.lock();
            st.running = SyncAction::Idle;
            st.last = action;
            st.last_duration = self.clock.now().saturating_sub(st.started);
            st.done = walk.pos;
            mismatches = st.mismatches;
            if action == SyncAction::Resync {
                // Where the next resync starts: where this one stopped, or earlier if a range
                // behind it was reported inconsistent meanwhile.
                let rewind = st.rewind_to.take();
                st.resync_from = match (&res, rewind) {
                    (Ok(()), None) => None,
                    (Ok(()), Some(r)) => Some(r),
                    (Err(_), r) => Some(r.map_or(walk.pos, |r| r.min(walk.pos))),
                };
                if st.resync_from.is_none() {
                    self.unsynced.store(false, Ordering::Release);
                    resynced = true;
                }
                if let Err(Stop::Failed(_)) = &res {
                    st.retry_resync_at = Some(self.clock.now() + RESYNC_RETRY);
                }
            }
        }
        if resynced {
            array.policy.resync_finished(array);
        }
        self.cv.notify_all();
        self.announce_finish(array, action, member, res, mismatches);
    }

    fn announce_finish(
        &self,
        array: &Parts,
        action: SyncAction,
        member: Option<&str>,
        res: Result<(), Stop>,
        mismatches: u64,
    ) {
        match res {
            Ok(()) => {
                array.members.events.emit(
                    finished_event(action),
                    &array.name,
                    member,
                    format!("{} finished", action.name()),
                );
                if matches!(
                    action,
                    SyncAction::Check | SyncAction::Repair | SyncAction::Resync
                ) && mismatches > 0
                {
                    array.members.events.emit(
                        "mismatches_found",
                        &array.name,
                        None,
                        format!("{mismatches} sectors inconsistent"),
                    );
                }
            }
            Err(Stop::Interrupted) => array.members.events.emit(
                "sync_interrupted",
                &array.name,
                member,
                format!("{} interrupted", action.name()),
            ),
            Err(Stop::Failed(why)) => array.members.events.emit(
                "sync_failed",
                &array.name,
                member,
                format!("{} failed: {why}", action.name()),
            ),
        }
    }

    /// One window of a resync, check or repair at sync coordinate `pos`, its mismatches
    /// counted (md's `mismatch_cnt`); returns where the next window starts.
    pub(crate) fn scrub_step(
        &self,
        array: &Parts,
        action: SyncAction,
        pos: u64,
        end: u64,
    ) -> Result<u64, Stop> {
        let (next, bad) = array.personality.scrub_window(array, action, pos, end)?;
        self.st.lock().mismatches += bad;
        Ok(next)
    }

    /// Pause as md's speed limits ask; `Err` if told to stop.
    /// `done`: progress so far; `worked`: the bytes of it really read and written, which is
    /// what the limits count; `coming`: the most the next window reads and writes.
    ///
    /// The limits hold for the work as it will be once the coming window is done: a window
    /// starts only when the rate over the walk's time so far, that window counted, is within
    /// them. So the first window of a walk waits as long as the limit says its bytes take,
    /// instead of going out at once (a rate over no time yet would be zero) and only the
    /// second waiting.
    ///
    /// Every wait ends (unless told to stop): while it lasts no work is done, each reset of
    /// the rate's time halves the work it remembers, and a window counts for no more than
    /// fits within that time at the limit.
    pub(crate) fn pace(
        &self,
        array: &Parts,
        p: &mut Pace,
        done: u64,
        (worked, coming): (u64, u64),
    ) -> Result<(), Stop> {
        let clock = &self.clock;
        loop {
            let now = clock.now();
            let secs = now.saturating_sub(p.start).as_secs_f64().max(1e-3);
            let rate = (worked - p.worked_at_start) as f64 / secs;
            if now.saturating_sub(p.start) > RATE_WINDOW {
                // The rate is of the recent past (md's sync marks), not since the start: after
                // a long run at full speed, an average since the start would stay above `min`
                // for ages once clients come, and the work would stall instead of going on at
                // `min`.
                let kept = RATE_WINDOW / 2;
                p.start = now - kept;
                p.worked_at_start = worked - (rate * kept.as_secs_f64()) as u64;
            }
            let (min, max, interrupt, frozen) = {
                let mut st = self.st.lock();
                st.done = done;
                st.rate = rate as u64;
                (st.speed_min, st.speed_max, st.interrupt, st.frozen)
            };
            if interrupt || frozen || array.is_failed() {
                return Err(Stop::Interrupted);
            }
            // The coming window counts for at most what the limit lets through in the part of
            // the rate's time a reset keeps. A larger window (RAID1's 1 MiB units under a
            // 256 KiB/s minimum) never fits the few seconds the rate is taken over: however
            // long the walk waited, the rate with it counted stayed above the limit, and the
            // walk never went on. Counted so, it starts once the past work has aged out.
            let over = |limit: u64| {
                let fits = (limit as f64 * (RATE_WINDOW / 2).as_secs_f64()) as u64;
                rate + coming.min(fits) as f64 / secs > limit as f64
            };
            if over(max) || (over(min) && self.client_busy()) {
                clock.sleep(Duration::from_millis(2));
                continue;
            }
            return Ok(());
        }
    }
}

impl SyncControl {
    /// Another node of a cluster ran `action` at this node's request: its outcome (the
    /// mismatched sectors it found, or why it failed) becomes this node's last action, with
    /// the events a local one would have sent (`action --wait` here follows them).
    pub(crate) fn record_elsewhere(
        &self,
        array: &Parts,
        action: SyncAction,
        node: &str,
        outcome: std::result::Result<u64, String>,
    ) {
        if let Ok(mismatches) = outcome {
            let mut st = self.st.lock();
            st.last = action;
            st.mismatches = mismatches;
        }
        let res = outcome.map(|_| ()).map_err(|why| {
            Stop::Failed(crate::EngineError::Busy(format!("on node {node}: {why}")))
        });
        let mismatches = self.st.lock().mismatches;
        self.announce_finish(array, action, None, res, mismatches);
    }

    /// Another node of a cluster started `action` at this node's request.
    pub(crate) fn started_elsewhere(&self, array: &Parts, action: SyncAction, node: &str) {
        array.members.events.emit(
            started_event(action),
            &array.name,
            None,
            format!("{} started on node {node}", action.name()),
        );
    }
}

fn started_event(a: SyncAction) -> &'static str {
    match a {
        SyncAction::Recover => "rebuild_started",
        SyncAction::Resync => "resync_started",
        SyncAction::Check => "check_started",
        SyncAction::Repair => "repair_started",
        SyncAction::Idle => "idle",
    }
}

fn finished_event(a: SyncAction) -> &'static str {
    match a {
        SyncAction::Recover => "rebuild_finished",
        SyncAction::Resync => "resync_finished",
        SyncAction::Check => "check_finished",
        SyncAction::Repair => "repair_finished",
        SyncAction::Idle => "idle",
    }
}

/// The background thread: walks while there is work, records the array clean when idle.
impl SyncControl {
    pub(crate) fn run(&self, parts: &Parts) {
        loop {
            let walk = loop {
                {
                    let mut st = self.st.lock();
                    if st.stop {
                        return;
                    }
                    if let Some(walk) = self.next_walk(parts, &mut st) {
                        break walk;
                    }
                    self.cv.notify_all();
                    self.cv.wait_for(&mut st, SAFE_MODE_DELAY);
                }
                self.mark_clean_if_idle(parts);
            };
            self.run_walk(parts, walk);
        }
    }
}
