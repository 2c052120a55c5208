//! Guided resync (Denehy, Arpaci-Dusseau & Arpaci-Dusseau, FAST '05): after an unclean stop a
//! `guided` array does not start its resync. The layer above knows which blocks were being written
//! (a journaling file system's log says so) and names them; the array verifies those stripes
//! ([`Array::verify`](crate::Array::verify)) and then counts redundancy as good everywhere.
//!
//! Until guidance ends, redundancy is not known to be good where the write-intent bitmap has bits
//! left from the crash, so every client read there is preceded by a verify of the stripes it
//! touches (each stripe once): nothing inconsistent is ever served.
//!
//! Guidance ends in one of two ways:
//! * a guide reports done ([`Array::end_guidance`](crate::Array::end_guidance)): its ranges are
//!   verified, the bitmap's crash bits are dropped, the array is in sync;
//! * no guide in time (`ArrayConfig::guide_timeout`), a guide that refuses
//!   ([`Array::fall_back`](crate::Array::fall_back)), or a client write before any guide ran: the
//!   bitmap-guided resync runs, as for the `bitmap` policy. A write ends guidance because the layer
//!   above may be replaying its journal: once its log is cleared it no longer says what was in
//!   flight, so guides run before the array is served (`run --guide`). The fallback is recorded on
//!   the members (the used-region map's resync-owed flag) until its resync finishes, so a restart
//!   in between does not wait for a guide again.
//!
//! A guide can only name what the layer above follows: an ext4 journal knows nothing of an
//! ordered-mode data write, a zero-out or a discard. A *write watch* installed by the layer above's
//! guide ([`Array::set_write_watch`](crate::Array::set_write_watch), study §3.6) judges every
//! client write as it begins; before a write no guide would find goes out, the members record that
//! such writes may be unsettled (the used-region map's `UNGUIDED` flag), and a crash with the flag
//! set falls back to the bitmap resync, which covers every write. The flag clears once those writes
//! are durable (a flush after their end) and quiet for a while.
//!
//! The array keeps the write-intent bitmap all along (md's kernel driver sees a bitmap array and
//! resyncs what it says; the guided flag lives in ironraid's used-region map header).

use crate::clock::Clock;
use crate::error::{EngineError, Result};
use crate::io::commit::WriteSet;
use crate::io::commit::{StripeImage, Ticket};
use crate::members::Meta;
use crate::policy::bitmap::WriteIntentBitmap;
use crate::policy::host::PolicyHost;
use crate::policy::{BitmapPolicy, ConsistencyPolicy};
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

impl Guidance {
    /// Install (or remove) the write watch.
    pub(crate) fn set_watch(&self, watch: Option<Arc<dyn WriteWatch>>) {
        *self.watch.write() = watch;
    }

    /// Whether writes failed while guidance was awaited: then no guide knows where.
    pub(crate) fn tainted(&self) -> bool {
        self.tainted.load(Ordering::Acquire)
    }

    /// Count bytes a guide's ranges had verified.
    pub(crate) fn note_guide_verified(&self, bytes: u64) {
        self.verified_bytes.fetch_add(bytes, Ordering::Relaxed);
    }

    /// Guide `guide` ended guidance, its ranges verified and durable (`name`: the array's).
    /// `in_sync` runs under the state lock: it counts redundancy as good in the bitmap and the
    /// walker, so no client I/O sees guidance ended before they do. The caller holds the
    /// walker's lock (the walker's state is not the guidance's to change).
    pub(crate) fn finish(
        &self,
        guide: &str,
        name: &str,
        clock: &dyn Clock,
        in_sync: impl FnOnce(),
    ) -> Result<()> {
        let mut state = self.state.lock();
        if *state != State::Awaiting || self.tainted.load(Ordering::Acquire) {
            return Err(EngineError::InvalidArgument(format!(
                "{name}: guidance ended meanwhile"
            )));
        }
        *state = State::Guided {
            guide: guide.to_string(),
        };
        *self.ended.lock() = Some(clock.now());
        in_sync();
        Ok(())
    }
}

/// The guided policy's guidance while it waits for a guide; otherwise why not (`name`: the
/// array's).
pub(crate) fn guidance_awaited<'a>(
    policy: &'a dyn ConsistencyPolicy,
    name: &str,
) -> Result<&'a Guidance> {
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
        host: &dyn PolicyHost,
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
                set_used_flag(host, format::USED_MAP_FLAG_UNGUIDED, true);
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
    fn watch_flush_end(&self, host: &dyn PolicyHost, (watch, token, epoch): WatchedFlush) {
        watch.flush_end(token);
        let mut u = self.unguided.lock();
        let quiet = u
            .last_end_at
            .is_none_or(|t| host.clock().now().saturating_sub(t) >= UNGUIDED_QUIET);
        if u.on_disk
            && u.inflight == 0
            && u.last_end_epoch <= epoch
            && quiet
            && watch.orphans() == 0
            && !host.is_read_only()
            // A fallback resync still owed keeps it (its flag may not be on disk yet).
            && !host.resync_owed()
        {
            set_used_flag(host, format::USED_MAP_FLAG_UNGUIDED, false);
            u.on_disk = false;
        }
    }

    /// Before client I/O over array bytes `offset..offset+len` while guidance is awaited: a
    /// read first verifies the stripes it touches that the crash may have left inconsistent
    /// (once each: `bitmap` says where the crash may have); a write ends guidance (see the
    /// module comment).
    fn verify_before_use(
        &self,
        host: &dyn PolicyHost,
        bitmap: &BitmapPolicy,
        offset: u64,
        len: u64,
        write: bool,
    ) -> Result<()> {
        if !self.awaiting() {
            return Ok(());
        }
        if write {
            self.fall_back_with(
                host,
                "a client wrote before any guide ran (the layer above may have replayed and \
                 cleared its journal)"
                    .into(),
            );
            // Durable before the write goes out: after a crash now, no guide may read the
            // journal this write may be changing.
            self.persist_fallback(host);
            host.wake_sync();
            return Ok(());
        }
        if host.members().slots.iter().any(|s| !s.is_complete()) {
            // Nothing left to compare (md's degraded, dirty array: the write hole).
            return Ok(());
        }
        let (from, to) = host.sync_range_covering(offset, len);
        if bitmap.next_to_resync(from, to).is_empty() || self.covered(from, to) {
            return Ok(());
        }
        let report = host.verify(&[(offset, len)])?;
        self.note_verified(from, to);
        self.verified_bytes
            .fetch_add(report.bytes_verified, Ordering::Relaxed);
        Ok(())
    }

    /// Whether the resync after an unclean stop must wait for a guide now. Past the deadline
    /// the array falls back (called by the background worker under the sync lock).
    fn holds_resync(&self, host: &dyn PolicyHost) -> bool {
        if !self.awaiting() {
            return false;
        }
        if host.clock().now() < self.deadline {
            return true;
        }
        self.fall_back_with(host, "no guide reported within the guide timeout".into());
        false
    }

    /// Record on the members that the fallback resync is owed (no metadata or sync lock may
    /// be held: a failed write fails the member). Also called when a resync starts.
    pub(crate) fn persist_fallback(&self, host: &dyn PolicyHost) {
        if matches!(*self.state.lock(), State::FellBack { .. }) {
            set_used_flag(host, format::USED_MAP_FLAG_RESYNC_OWED, true);
        }
    }

    /// Under the sync lock: no I/O here (see `persist_fallback`).
    pub(crate) fn fall_back_with(&self, host: &dyn PolicyHost, reason: String) {
        {
            let mut state = self.state.lock();
            if *state != State::Awaiting {
                return;
            }
            *state = State::FellBack {
                reason: reason.clone(),
            };
        }
        tracing::warn!(array = %host.name(), "guided resync falls back to the bitmap: {reason}");
        host.members().events.emit(
            "guidance_fallback",
            host.name(),
            None,
            format!("no guidance ({reason}): the bitmap-guided resync runs"),
        );
    }

    /// The resync after an unclean stop finished: the window of vulnerability closes (no
    /// metadata or sync lock held).
    fn resync_finished(&self, host: &dyn PolicyHost) {
        {
            let mut ended = self.ended.lock();
            if ended.is_none() && !self.awaiting() {
                *ended = Some(host.clock().now());
            }
        }
        set_used_flag(host, format::USED_MAP_FLAG_RESYNC_OWED, false);
    }
}

/// Set or clear a flag of the used-region map's header (durably), unless read-only. Guided
/// arrays keep their flags there (md has no field for them).
fn set_used_flag(host: &dyn PolicyHost, flag: u32, on: bool) {
    if let Some(used) = host.used().filter(|_| !host.is_read_only()) {
        used.set_flag(host.members(), flag, on);
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
        host: &dyn PolicyHost,
        set: &WriteSet,
        image: Option<&StripeImage<'_>>,
    ) -> Result<Ticket> {
        self.bitmap.before_writes(host, set, image)
    }

    fn after_writes(&self, host: &dyn PolicyHost, set: &WriteSet, ticket: Ticket) {
        self.bitmap.after_writes(host, set, ticket);
    }

    fn note_inconsistent(&self, host: &dyn PolicyHost, set: &WriteSet) {
        self.bitmap.note_inconsistent(host, set);
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

    fn before_client_io(
        &self,
        host: &dyn PolicyHost,
        offset: u64,
        len: u64,
        write: bool,
    ) -> Result<()> {
        self.guidance
            .verify_before_use(host, &self.bitmap, offset, len, write)
    }

    fn write_begins(
        &self,
        host: &dyn PolicyHost,
        offset: u64,
        len: u64,
        data: Option<&[u8]>,
    ) -> Option<Watched> {
        self.guidance.watch_begin(host, offset, len, data)
    }

    fn write_ended(&self, host: &dyn PolicyHost, w: Option<Watched>, ok: bool, durable: bool) {
        if let Some(w) = w {
            self.guidance.watch_end(host.clock().now(), w, ok, durable);
        }
    }

    fn flush_begins(&self) -> Option<WatchedFlush> {
        self.guidance.watch_flush_begin()
    }

    fn flush_ended(&self, host: &dyn PolicyHost, f: Option<WatchedFlush>) {
        if let Some(f) = f {
            self.guidance.watch_flush_end(host, f);
        }
    }

    fn holds_resync(&self, host: &dyn PolicyHost) -> bool {
        self.guidance.holds_resync(host)
    }

    fn resync_starts(&self, host: &dyn PolicyHost) {
        self.guidance.persist_fallback(host);
    }

    fn resync_finished(&self, host: &dyn PolicyHost) {
        self.guidance.resync_finished(host);
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
