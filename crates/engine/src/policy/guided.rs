//! Guided resync (Denehy, Arpaci-Dusseau & Arpaci-Dusseau, FAST '05): after an unclean stop a
//! `guided` array does not start its resync. The layer above knows which blocks were being
//! written (a journaling file system's log says so) and names them; the array verifies those
//! stripes ([`Array::verify`]) and then counts redundancy as good everywhere.
//!
//! Until guidance ends, redundancy is not known to be good where the write-intent bitmap has
//! bits left from the crash, so every client read there is preceded by a verify of the
//! stripes it touches (each stripe once): nothing inconsistent is ever served.
//!
//! Guidance ends in one of two ways:
//! * a guide reports done ([`Array::end_guidance`]): its ranges are verified, the bitmap's
//!   crash bits are dropped, the array is in sync;
//! * no guide in time (`ArrayConfig::guide_timeout`), a guide that refuses
//!   ([`Array::fall_back`]), or a client write before any guide ran: the bitmap-guided resync
//!   runs, as for the `bitmap` policy. A write ends guidance because the layer above may be
//!   replaying its journal: once its log is cleared it no longer says what was in flight, so
//!   guides run before the array is served (`run --guide`). The fallback is recorded on the
//!   members (the used-region map's resync-owed flag) until its resync finishes, so a restart
//!   in between does not wait for a guide again.
//!
//! A guide can only name what the layer above follows: an ext4 journal knows nothing of an
//! ordered-mode data write, a zero-out or a discard. A *write watch* installed by the layer
//! above's guide ([`Array::set_write_watch`], study §3.6) judges every client write as it
//! begins; before a write no guide would find goes out, the members record that such writes
//! may be unsettled (the used-region map's `UNGUIDED` flag), and a crash with the flag set
//! falls back to the bitmap resync, which covers every write. The flag clears once those
//! writes are durable (a flush after their end) and quiet for a while.
//!
//! The array keeps the write-intent bitmap all along (md's kernel driver sees a bitmap array
//! and resyncs what it says; the guided flag lives in ironraid's used-region map header).

use crate::array::Array;
use crate::error::{EngineError, Result};
use crate::io::commit::WriteSet;
use crate::io::commit::{StripeImage, Ticket};
use crate::members::Meta;
use crate::policy::bitmap::WriteIntentBitmap;
use crate::policy::{BitmapPolicy, ConsistencyPolicy};
use crate::work::VerifyReport;
use parking_lot::{Mutex, RwLock};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// How long writes no guide would find must have been durable before the members stop saying
/// so (keeps a stream of such writes from rewriting the flag at every flush).
const UNGUIDED_QUIET: Duration = Duration::from_secs(5);

/// A conformance check of the layer above (a guided array's guide, study §3.6): judges each
/// client write as it begins, and follows what becomes durable.
pub trait WriteWatch: Send + Sync {
    /// A client write of `data` (None: a discard) at array bytes `offset..offset+len` is about
    /// to go out: whether a guide would find it after a crash until it is durable, and an id
    /// for [`WriteWatch::end`].
    fn begin(&self, offset: u64, len: u64, data: Option<&[u8]>) -> (bool, u64);
    /// Write `id` ended (`ok`: it succeeded; `durable`: with FUA).
    fn end(&self, id: u64, ok: bool, durable: bool);
    /// A flush begins; the token goes to [`WriteWatch::flush_end`].
    fn flush_begin(&self) -> u64;
    /// That flush succeeded: what ended before it began is durable.
    fn flush_end(&self, token: u64);
    /// Writes judged conforming that a guide would no longer find, not yet durable.
    fn orphans(&self) -> usize;
}

/// A write under a watch (see `ConsistencyPolicy::write_begins`).
pub(crate) struct Watched {
    watch: Arc<dyn WriteWatch>,
    id: u64,
    conforming: bool,
}

/// Whether the members say unguided writes may be unsettled, and what would let them stop.
#[derive(Default)]
struct Unguided {
    on_disk: bool,
    inflight: u64,
    /// Flush epoch and time when the last unguided write ended.
    last_end_epoch: u64,
    last_end_at: Option<Duration>,
}

/// How long a guided array waits for a guide after an unclean stop by default.
pub const DEFAULT_GUIDE_TIMEOUT: Duration = Duration::from_secs(120);

#[derive(Clone, Debug, PartialEq, Eq)]
enum State {
    /// Stopped cleanly last time: nothing to guide.
    InSync,
    Awaiting,
    Guided {
        guide: String,
    },
    FellBack {
        reason: String,
    },
}

/// Guidance of an array with the `guided` policy, for status.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GuidanceStatus {
    /// "in_sync" (no unclean stop to guide), "awaiting", "guided" or "fallback".
    pub state: &'static str,
    /// The guide that ended guidance ("ext4", "ranges").
    pub guide: Option<String>,
    /// Why the array fell back to the bitmap resync.
    pub reason: Option<String>,
    /// Window of vulnerability: how long redundancy has not been known to be good since
    /// assembly (until guidance or the fallback resync ended; still growing while open).
    pub window_ms: u64,
    /// Over how many bytes (md sync coordinates: bytes of each member) redundancy was not known
    /// to be good at assembly: the chunks the crash left set in the bitmap.
    pub window_bytes: u64,
    /// Bytes verified since assembly: the guide's ranges and the client reads verified first.
    pub verified_bytes: u64,
    /// Milliseconds left before the array falls back, while awaiting.
    pub fallback_in_ms: Option<u64>,
    /// A write watch judges client writes.
    pub watched: bool,
    /// The members say writes no guide would find may be unsettled (a crash now falls back).
    pub unguided: bool,
    /// Client writes (and discards) the watch judged conforming, and not, since assembly.
    pub conforming_writes: u64,
    pub nonconforming_writes: u64,
}

pub(crate) struct Guidance {
    state: Mutex<State>,
    /// Sync-coordinate ranges verified since assembly (sorted, merged).
    verified: Mutex<Vec<(u64, u64)>>,
    started: Duration,
    deadline: Duration,
    ended: Mutex<Option<Duration>>,
    window_bytes: u64,
    verified_bytes: AtomicU64,
    /// Writes failed while awaiting (a full backing store): their redundancy may disagree
    /// where no guide knows; guidance then falls back.
    tainted: std::sync::atomic::AtomicBool,
    watch: RwLock<Option<Arc<dyn WriteWatch>>>,
    unguided: Mutex<Unguided>,
    flush_epoch: AtomicU64,
    /// Client writes the watch judged conforming, and not.
    conforming: AtomicU64,
    nonconforming: AtomicU64,
}

impl Guidance {
    /// `unsynced`: the array was not stopped cleanly (or a resync is still owed); `owed`: a
    /// fallback began before the last stop; `unguided`: writes no guide would find may not
    /// have been durable; `window_bytes`: what the bitmap says may be inconsistent.
    pub fn new(
        unsynced: bool,
        owed: bool,
        unguided: bool,
        now: Duration,
        timeout: Duration,
        window_bytes: u64,
    ) -> Guidance {
        let state = match (unsynced, owed, unguided) {
            (false, _, _) => State::InSync,
            (true, false, false) => State::Awaiting,
            (true, true, _) => State::FellBack {
                reason: "guidance had fallen back before the last stop; its resync goes on".into(),
            },
            (true, false, true) => State::FellBack {
                reason: "writes no guide would find (the write watch said so) were not known \
                         durable at the crash"
                    .into(),
            },
        };
        Guidance {
            state: Mutex::new(state),
            verified: Mutex::new(Vec::new()),
            started: now,
            deadline: now + timeout,
            ended: Mutex::new((!unsynced).then_some(now)),
            window_bytes: if unsynced { window_bytes } else { 0 },
            verified_bytes: AtomicU64::new(0),
            tainted: std::sync::atomic::AtomicBool::new(false),
            watch: RwLock::new(None),
            unguided: Mutex::new(Unguided {
                on_disk: unguided,
                ..Unguided::default()
            }),
            flush_epoch: AtomicU64::new(0),
            conforming: AtomicU64::new(0),
            nonconforming: AtomicU64::new(0),
        }
    }

    pub fn awaiting(&self) -> bool {
        *self.state.lock() == State::Awaiting
    }

    fn covered(&self, from: u64, to: u64) -> bool {
        self.verified
            .lock()
            .iter()
            .any(|&(a, b)| a <= from && to <= b)
    }

    fn note_verified(&self, from: u64, to: u64) {
        let mut v = self.verified.lock();
        let mut all = std::mem::take(&mut *v);
        all.push((from, to));
        *v = crate::intervals::merge(all);
    }

    pub fn status(&self, now: Duration) -> GuidanceStatus {
        let state = self.state.lock().clone();
        let ended = *self.ended.lock();
        let (name, guide, reason) = match state {
            State::InSync => ("in_sync", None, None),
            State::Awaiting => ("awaiting", None, None),
            State::Guided { guide } => ("guided", Some(guide), None),
            State::FellBack { reason } => ("fallback", None, Some(reason)),
        };
        GuidanceStatus {
            state: name,
            guide,
            reason,
            window_ms: ended
                .unwrap_or(now)
                .saturating_sub(self.started)
                .as_millis() as u64,
            window_bytes: self.window_bytes,
            verified_bytes: self.verified_bytes.load(Ordering::Relaxed),
            fallback_in_ms: (name == "awaiting")
                .then(|| self.deadline.saturating_sub(now).as_millis() as u64),
            watched: self.watch.read().is_some(),
            unguided: self.unguided.lock().on_disk,
            conforming_writes: self.conforming.load(Ordering::Relaxed),
            nonconforming_writes: self.nonconforming.load(Ordering::Relaxed),
        }
    }
}

impl Array {
    /// Install (or remove) the write watch of a guided array.
    pub fn set_write_watch(&self, watch: Option<Arc<dyn WriteWatch>>) -> Result<()> {
        let g = self.policy.guidance().ok_or_else(|| {
            EngineError::InvalidArgument(format!(
                "{} does not use the guided consistency policy",
                self.name
            ))
        })?;
        *g.watch.write() = watch;
        Ok(())
    }

    /// A guide names the array byte ranges that may have had writes in flight at the crash:
    /// verify them, then count redundancy as good everywhere else too. Only while awaiting.
    pub fn end_guidance(&self, guide: &str, ranges: &[(u64, u64)]) -> Result<VerifyReport> {
        let g = guidance_awaited(self.policy.as_ref(), &self.name)?;
        if g.tainted.load(Ordering::Acquire) {
            let why = "writes failed while awaiting guidance: no guide knows where";
            g.fall_back_with(self, why.into());
            self.sync.wake();
            return Err(EngineError::InvalidArgument(format!(
                "{}: {why}",
                self.name
            )));
        }
        let report = self.verify(ranges)?;
        g.verified_bytes
            .fetch_add(report.bytes_verified, Ordering::Relaxed);
        // What the verify rewrote is durable before redundancy counts as good (as at the end
        // of a resync).
        self.flush()?;
        {
            let mut st = self.sync.st.lock();
            let mut state = g.state.lock();
            if *state != State::Awaiting || g.tainted.load(Ordering::Acquire) {
                return Err(EngineError::InvalidArgument(format!(
                    "{}: guidance ended meanwhile",
                    self.name
                )));
            }
            *state = State::Guided {
                guide: guide.to_string(),
            };
            *g.ended.lock() = Some(self.sync.clock.now());
            let total = self.personality.sync_total(crate::work::SyncAction::Resync);
            self.policy.resynced(0, total);
            st.resync_from = None;
            self.sync.unsynced.store(false, Ordering::Release);
        }
        self.sync.wake();
        self.members.events.emit(
            "guidance_finished",
            &self.name,
            None,
            format!(
                "guide {guide}: {} ranges, {} bytes of stripes verified, {} sectors repaired; \
                 redundancy is in sync",
                report.ranges, report.bytes_verified, report.mismatch_sectors
            ),
        );
        Ok(report)
    }

    /// No guidance after all (a guide refused, or an administrator said so): run the bitmap
    /// resync now.
    pub fn fall_back(&self, reason: &str) -> Result<()> {
        let g = guidance_awaited(self.policy.as_ref(), &self.name)?;
        g.fall_back_with(self, reason.to_string());
        g.persist_fallback(self);
        self.sync.wake();
        Ok(())
    }

    /// A guide's own reads (of the file system's journal, say): served without verifying
    /// first. Data members answer reads of an array that is not degraded, so parity that
    /// disagrees does not change what they return; the guide verifies what it finds after.
    pub fn read_as_guide(&self, offset_bytes: u64, buf: &mut [u8]) -> Result<()> {
        guidance_awaited(self.policy.as_ref(), &self.name)?;
        if self.members.slots.iter().any(|s| !s.is_complete()) {
            return Err(EngineError::InvalidArgument(format!(
                "{} is degraded: a guide would read reconstructed blocks whose parity may be \
                 stale",
                self.name
            )));
        }
        self.read_unverified(offset_bytes, buf)
    }

    /// Ok while the array waits for a guide; otherwise why not.
    pub fn awaiting_guidance(&self) -> Result<()> {
        guidance_awaited(self.policy.as_ref(), &self.name).map(|_| ())
    }
}

/// The guided policy's guidance while it waits for a guide; otherwise why not (`name`: the
/// array's).
fn guidance_awaited<'a>(policy: &'a dyn ConsistencyPolicy, name: &str) -> Result<&'a Guidance> {
    let g = policy.guidance().ok_or_else(|| {
        EngineError::InvalidArgument(format!(
            "{} does not use the guided consistency policy",
            name
        ))
    })?;
    match &*g.state.lock() {
        State::Awaiting => Ok(g),
        State::InSync => Err(EngineError::InvalidArgument(format!(
            "{} was stopped cleanly: there is nothing to guide",
            name
        ))),
        State::Guided { guide } => Err(EngineError::InvalidArgument(format!(
            "{}: guidance already ended (guide {guide})",
            name
        ))),
        State::FellBack { reason } => Err(EngineError::InvalidArgument(format!(
            "{}: guidance already ended: fell back to the bitmap resync ({reason})",
            name
        ))),
    }
}

/// The watch, its flush token and the flush epoch of a client flush under a watch.
pub(crate) type WatchedFlush = (Arc<dyn WriteWatch>, u64, u64);

impl Guidance {
    /// A client write (data None: a discard) is about to go out: ask the watch; a write no
    /// guide would find is recorded on the members first.
    fn watch_begin(
        &self,
        array: &Array,
        offset: u64,
        len: u64,
        data: Option<&[u8]>,
    ) -> Option<Watched> {
        let watch = self.watch.read().clone()?;
        let (conforming, id) = watch.begin(offset, len, data);
        if conforming {
            self.conforming.fetch_add(1, Ordering::Relaxed);
        } else {
            self.nonconforming.fetch_add(1, Ordering::Relaxed);
            let mut u = self.unguided.lock();
            u.inflight += 1;
            if !u.on_disk {
                // Durable before the write goes out (the lock keeps other unguided writes
                // waiting for it too).
                set_used_flag(array, format::USED_MAP_FLAG_UNGUIDED, true);
                u.on_disk = true;
            }
        }
        Some(Watched {
            watch,
            id,
            conforming,
        })
    }

    fn watch_end(&self, now: Duration, w: Watched, ok: bool, durable: bool) {
        w.watch.end(w.id, ok, durable);
        if !w.conforming {
            let mut u = self.unguided.lock();
            u.inflight -= 1;
            u.last_end_epoch = self.flush_epoch.load(Ordering::Acquire);
            u.last_end_at = Some(now);
        }
    }

    fn watch_flush_begin(&self) -> Option<WatchedFlush> {
        let watch = self.watch.read().clone()?;
        let token = watch.flush_begin();
        let epoch = self.flush_epoch.fetch_add(1, Ordering::AcqRel);
        Some((watch, token, epoch))
    }

    /// A flush succeeded: tell the watch, and clear the members' unguided flag when every
    /// unguided write ended before it began, long enough ago, and no orphan is left.
    fn watch_flush_end(&self, array: &Array, (watch, token, epoch): WatchedFlush) {
        watch.flush_end(token);
        let mut u = self.unguided.lock();
        let quiet = u
            .last_end_at
            .is_none_or(|t| array.sync.clock.now().saturating_sub(t) >= UNGUIDED_QUIET);
        if u.on_disk
            && u.inflight == 0
            && u.last_end_epoch <= epoch
            && quiet
            && watch.orphans() == 0
            && !array.is_read_only()
            // A fallback resync still owed keeps it (its flag may not be on disk yet).
            && !array.sync.unsynced.load(Ordering::Acquire)
        {
            set_used_flag(array, format::USED_MAP_FLAG_UNGUIDED, false);
            u.on_disk = false;
        }
    }

    /// Before client I/O over array bytes `offset..offset+len` while guidance is awaited: a
    /// read first verifies the stripes it touches that the crash may have left inconsistent
    /// (once each); a write ends guidance (see the module comment).
    fn verify_before_use(&self, array: &Array, offset: u64, len: u64, write: bool) -> Result<()> {
        if !self.awaiting() {
            return Ok(());
        }
        if write {
            self.fall_back_with(
                array,
                "a client wrote before any guide ran (the layer above may have replayed and \
                 cleared its journal)"
                    .into(),
            );
            // Durable before the write goes out: after a crash now, no guide may read the
            // journal this write may be changing.
            self.persist_fallback(array);
            array.sync.wake();
            return Ok(());
        }
        if array.members.slots.iter().any(|s| !s.is_complete()) {
            // Nothing left to compare (md's degraded, dirty array: the write hole).
            return Ok(());
        }
        let (from, to) = array.personality.sync_range_covering(offset, len);
        if array.policy.next_to_resync(from, to).is_empty() || self.covered(from, to) {
            return Ok(());
        }
        let report = array.verify(&[(offset, len)])?;
        self.note_verified(from, to);
        self.verified_bytes
            .fetch_add(report.bytes_verified, Ordering::Relaxed);
        Ok(())
    }

    /// Whether the resync after an unclean stop must wait for a guide now. Past the deadline
    /// the array falls back (called by the background worker under the sync lock).
    fn holds_resync(&self, array: &Array) -> bool {
        if !self.awaiting() {
            return false;
        }
        if array.sync.clock.now() < self.deadline {
            return true;
        }
        self.fall_back_with(array, "no guide reported within the guide timeout".into());
        false
    }

    /// Record on the members that the fallback resync is owed (no metadata or sync lock may
    /// be held: a failed write fails the member). Also called when a resync starts.
    pub(crate) fn persist_fallback(&self, array: &Array) {
        if matches!(*self.state.lock(), State::FellBack { .. }) {
            set_used_flag(array, format::USED_MAP_FLAG_RESYNC_OWED, true);
        }
    }

    /// Under the sync lock: no I/O here (see `persist_fallback`).
    pub(crate) fn fall_back_with(&self, array: &Array, reason: String) {
        {
            let mut state = self.state.lock();
            if *state != State::Awaiting {
                return;
            }
            *state = State::FellBack {
                reason: reason.clone(),
            };
        }
        tracing::warn!(array = %array.name, "guided resync falls back to the bitmap: {reason}");
        array.members.events.emit(
            "guidance_fallback",
            &array.name,
            None,
            format!("no guidance ({reason}): the bitmap-guided resync runs"),
        );
    }

    /// The resync after an unclean stop finished: the window of vulnerability closes (no
    /// metadata or sync lock held).
    fn resync_finished(&self, array: &Array) {
        {
            let mut ended = self.ended.lock();
            if ended.is_none() && !self.awaiting() {
                *ended = Some(array.sync.clock.now());
            }
        }
        set_used_flag(array, format::USED_MAP_FLAG_RESYNC_OWED, false);
    }
}

/// Set or clear a flag of the used-region map's header (durably), unless read-only. Guided
/// arrays keep their flags there (md has no field for them).
fn set_used_flag(array: &Array, flag: u32, on: bool) {
    if let Some(used) = array.used.as_ref().filter(|_| !array.is_read_only()) {
        used.set_flag(&array.members, flag, on);
    }
}

/// The `guided` consistency policy: the write-intent bitmap's, and after an unclean stop the
/// resync waits for a guide first; client I/O meanwhile goes through the guidance.
pub(crate) struct GuidedPolicy {
    pub bitmap: BitmapPolicy,
    pub guidance: Guidance,
}

impl ConsistencyPolicy for GuidedPolicy {
    fn name(&self) -> &'static str {
        "guided"
    }

    fn on_active(&self, meta: &mut Meta) {
        self.bitmap.on_active(meta);
    }

    fn on_clean(&self, meta: &mut Meta, resync_from: Option<u64>) {
        self.bitmap.on_clean(meta, resync_from);
    }

    fn before_writes(
        &self,
        array: &Array,
        set: &WriteSet,
        image: Option<&StripeImage<'_>>,
    ) -> Result<Ticket> {
        self.bitmap.before_writes(array, set, image)
    }

    fn after_writes(&self, array: &Array, set: &WriteSet, ticket: Ticket) {
        self.bitmap.after_writes(array, set, ticket);
    }

    fn note_inconsistent(&self, array: &Array, set: &WriteSet) {
        self.bitmap.note_inconsistent(array, set);
    }

    fn resync_from(&self, sb_resync_offset_sectors: u64) -> Option<u64> {
        self.bitmap.resync_from(sb_resync_offset_sectors)
    }

    fn next_to_resync(&self, from: u64, end: u64) -> std::ops::Range<u64> {
        self.bitmap.next_to_resync(from, end)
    }

    fn resynced(&self, from: u64, to: u64) {
        self.bitmap.resynced(from, to);
    }

    fn torn_bytes(&self) -> Option<u64> {
        self.bitmap.torn_bytes()
    }

    fn before_client_io(&self, array: &Array, offset: u64, len: u64, write: bool) -> Result<()> {
        self.guidance.verify_before_use(array, offset, len, write)
    }

    fn write_begins(
        &self,
        array: &Array,
        offset: u64,
        len: u64,
        data: Option<&[u8]>,
    ) -> Option<Watched> {
        self.guidance.watch_begin(array, offset, len, data)
    }

    fn write_ended(&self, array: &Array, w: Option<Watched>, ok: bool, durable: bool) {
        if let Some(w) = w {
            self.guidance
                .watch_end(array.sync.clock.now(), w, ok, durable);
        }
    }

    fn flush_begins(&self) -> Option<WatchedFlush> {
        self.guidance.watch_flush_begin()
    }

    fn flush_ended(&self, array: &Array, f: Option<WatchedFlush>) {
        if let Some(f) = f {
            self.guidance.watch_flush_end(array, f);
        }
    }

    fn holds_resync(&self, array: &Array) -> bool {
        self.guidance.holds_resync(array)
    }

    fn resync_starts(&self, array: &Array) {
        self.guidance.persist_fallback(array);
    }

    fn resync_finished(&self, array: &Array) {
        self.guidance.resync_finished(array);
    }

    fn taint(&self) {
        if self.guidance.awaiting() {
            self.guidance.tainted.store(true, Ordering::Release);
        }
    }

    fn bitmap(&self) -> Option<&Arc<WriteIntentBitmap>> {
        Some(&self.bitmap.bitmap)
    }

    fn guidance(&self) -> Option<&Guidance> {
        Some(&self.guidance)
    }
}
