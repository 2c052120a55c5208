//! [`Array`]: an assembled array and its client-facing operations.
//!
//! Concurrency: every method takes `&self` and may be called from many threads. There is no
//! global lock around member I/O. Member roles, superblocks and failures are the member set's
//! (`members/`, which says who may change what). Here:
//! * `closing` + `inflight_writes`: a clean stop refuses new writes, waits for those in flight,
//!   and only then records "clean".
//! * the stripe cache (parity levels) and region locks (mirrors) serialise writers per stripe.

mod bytes;
pub use bytes::AnyBytes;
mod elsewhere;
mod guide;
mod manage;
mod plug;
mod policies;
mod sync;
mod used;

use crate::background::SyncControl;
use crate::clock::Clock;
use crate::error::{EngineError, Result};
use crate::events::{Event, EventBus};
use crate::io::commit::CommitPoint;
use crate::io::{Executor, IoPath};
use crate::lock::{LocalLocks, LockRange};
use crate::members::Meta;
use crate::members::{Member, MemberSet, Slot};
use crate::personality::parts::Parts;
use crate::personality::stripe_cache::StripeCache;
use crate::policy::{BitmapPolicy, ConsistencyPolicy, JournalPolicy, ResyncPolicy};
use crate::status::ArrayStatus;
use layout::Geometry;
use std::os::fd::BorrowedFd;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// How long a clean stop waits for writes in flight before giving up (the array stays dirty).
const CLOSE_DRAIN_TIMEOUT: Duration = Duration::from_secs(60);

/// Tunables of a running array.
#[derive(Clone, Debug)]
pub struct ArrayConfig {
    /// The longest a stripe's leader waits for writers that are still placing pieces into its
    /// stripe (there is no timer otherwise: it goes as soon as they have; see `stripe_cache`).
    /// Zero: it never waits. FUA, a full stripe and a flush cut the wait short.
    pub write_hold: Duration,
    /// The same bound for a stripe that already holds a whole chunk (a sequential stream's
    /// writes, typically): waiting for the rest then saves reading it, and the writers on their
    /// way may be slow to arrive on a loaded host (16 streams on 2 cores took longer than
    /// `write_hold`, and most of their stripes were written in pieces, each piece reading).
    /// Stripes of small pieces (random writes) keep the short bound: merging them saves little.
    pub stream_hold: Duration,
    /// Upper bound on client data held in the stripe cache at once.
    pub stripe_cache_bytes: usize,
    /// Threads that issue member I/O in parallel.
    pub io_threads: usize,
    /// Refuse writes.
    pub read_only: bool,
    /// Deterministic simulation: member operations of a request run one after the other in an
    /// order drawn from this seed, on the caller's thread.
    pub deterministic_seed: Option<u64>,
    /// The clock background work paces and checkpoints by (default: real time).
    pub clock: Option<Arc<dyn Clock>>,
    /// The other nodes of a clustered array (default: this host alone, [`crate::cluster::Local`]).
    pub coordinator: Option<Arc<dyn crate::cluster::Coordinator>>,
    /// Background work (rebuild, resync, check) claims about this much of each member at a
    /// time: one read per member per window.
    pub sync_window_bytes: u64,
    /// Checks every member read before use (integrity); None: reads are taken as good.
    pub read_verifier: Option<Arc<dyn crate::io::ReadVerifier>>,
    /// A `guided` array that stopped uncleanly waits this long for a guide before it falls
    /// back to the bitmap resync.
    pub guide_timeout: Duration,
    /// Integrity records kept in memory at most (4 bytes per 4 KiB member block; what does not
    /// fit is read from the tables when needed).
    pub integrity_cache_bytes: usize,
    /// Mirrors: read every block from its first usable copy (the Distributed MD paper's
    /// "primary copy": every node of a cluster reads the same copy, even of regions a crash
    /// left divergent) instead of spreading reads over the copies.
    pub read_primary: bool,
}

impl Default for ArrayConfig {
    fn default() -> Self {
        ArrayConfig {
            write_hold: Duration::from_micros(2000),
            stream_hold: Duration::from_micros(50_000),
            stripe_cache_bytes: 64 << 20,
            // As many as cores: the caller runs operations too (`io/pool.rs`), and more threads
            // than cores only add switches for memory-speed members.
            io_threads: std::thread::available_parallelism()
                .map_or(2, |n| n.get())
                .clamp(2, 16),
            read_only: false,
            deterministic_seed: None,
            clock: None,
            coordinator: None,
            sync_window_bytes: 2 << 20,
            read_verifier: None,
            guide_timeout: crate::policy::guided::DEFAULT_GUIDE_TIMEOUT,
            // Covers about 64 GiB of raw capacity (design study §5.6).
            integrity_cache_bytes: 64 << 20,
            read_primary: false,
        }
    }
}

/// A window of the array another node works on: this node's client writes stay out of it
/// until this drops ([`Array::hold_sync_window`]).
pub struct SyncWindow<'a>(#[allow(dead_code)] crate::lock::RangeGuard<'a>);

/// An assembled array: the facade over its parts ([`Parts`]), to which it derefs for its own
/// operations. What only the facade holds: the stop protocol, the walker and identity.
pub struct Array {
    pub(crate) parts: Parts,
    pub(crate) uuid: [u8; 16],
    closing: AtomicBool,
    was_dirty: bool,
    never_run: bool,
    pub(crate) inflight_writes: AtomicUsize,
    pub(crate) sync: Arc<SyncControl>,
}

impl std::ops::Deref for Array {
    type Target = Parts;

    fn deref(&self) -> &Parts {
        &self.parts
    }
}

pub(crate) struct ArrayParts {
    pub spares: Vec<Arc<Member>>,
    /// Resync needed from this offset (None: in sync).
    pub resync_from: Option<u64>,
    /// md's internal write-intent bitmap, if the superblocks announce one.
    pub bitmap: Option<Arc<crate::policy::bitmap::WriteIntentBitmap>>,
    pub used: Option<Arc<crate::policy::used::UsedRegions>>,
    /// The raid5-cache journal, recovered.
    pub journal: Option<Arc<crate::policy::journal::Journal>>,
    pub integrity: Option<Arc<crate::integrity::Integrity>>,
    pub name: String,
    pub uuid: [u8; 16],
    pub geometry: Geometry,
    pub slots: Arc<Vec<Slot>>,
    pub meta: Meta,
    pub config: ArrayConfig,
    pub read_only_reason: Option<String>,
    pub was_dirty: bool,
    /// No run since create (event count 0): a dirty start is the initial sync.
    pub never_run: bool,
    /// The `guided` consistency policy (with `bitmap`).
    pub guided: bool,
    /// Guidance fell back before the last stop: the resync runs without waiting for a guide.
    pub resync_owed: bool,
    /// Writes no guide would find were not known durable at the last stop.
    pub unguided: bool,
}

/// The consistency policy the superblocks announce: a bitmap (plain or guided), a journal, or
/// md's plain resync.
fn new_policy(
    bitmap: Option<Arc<crate::policy::bitmap::WriteIntentBitmap>>,
    journal: Option<Arc<crate::policy::journal::Journal>>,
    guidance: Option<crate::policy::guided::Guidance>,
) -> Box<dyn ConsistencyPolicy> {
    match (bitmap, journal) {
        (Some(bitmap), _) => match guidance {
            Some(guidance) => Box::new(crate::policy::guided::GuidedPolicy {
                bitmap: BitmapPolicy { bitmap },
                guidance,
            }),
            None => Box::new(BitmapPolicy { bitmap }),
        },
        (None, Some(journal)) => Box::new(JournalPolicy { journal }),
        (None, None) => Box::new(ResyncPolicy),
    }
}

/// Member I/O on threads, or, in a seeded simulation, in an order the seed decides.
fn new_executor(config: &ArrayConfig) -> Result<Executor> {
    Ok(match config.deterministic_seed {
        Some(seed) => Executor::Deterministic(Box::new(parking_lot::Mutex::new(
            <rand_chacha::ChaCha8Rng as rand::SeedableRng>::seed_from_u64(seed),
        ))),
        None => Executor::Threads(
            crate::io::pool::IoPool::new(config.io_threads.max(2))
                .map_err(|e| EngineError::Unsupported(format!("cannot start I/O threads: {e}")))?,
        ),
    })
}

/// A `guided` array's guidance as assembly found it (`now`: on the array's clock).
fn guidance(p: &ArrayParts, now: Duration) -> Option<crate::policy::guided::Guidance> {
    p.guided.then(|| {
        crate::policy::guided::Guidance::new(
            p.resync_from.is_some(),
            p.resync_owed,
            p.unguided,
            now,
            p.config.guide_timeout,
            p.bitmap.as_ref().map_or(0, |b| b.needed_bytes()),
        )
    })
}

/// Where the resync starts, as the policy reads the superblocks' checkpoint
/// (`sb_resync_offset_sectors`); `assembled`: what assembly decided.
fn resync_from(
    personality: &dyn crate::personality::Personality,
    policy: &dyn ConsistencyPolicy,
    assembled: Option<u64>,
    sb_resync_offset_sectors: u64,
) -> Option<u64> {
    // A clustered node resyncs its own slot's bits at every start, which the shared
    // superblocks' checkpoint cannot say (assembly's `resync_at_start`).
    let clustered = policy.bitmap().is_some_and(|b| b.header().is_clustered());
    if personality.redundancy() == 0 {
        None
    } else if clustered {
        assembled
    } else {
        policy.resync_from(sb_resync_offset_sectors)
    }
}

impl Array {
    pub(crate) fn from_parts(p: ArrayParts) -> Result<Array> {
        let executor = new_executor(&p.config)?;
        // Assembly put one clock in the metadata and the configuration.
        let clock = p.meta.clock.clone();
        let events = EventBus::new(clock.clone());
        let was_dirty = p.was_dirty;
        let never_run = p.never_run;
        let guidance = guidance(&p, clock.now());
        let policy = new_policy(p.bitmap, p.journal, guidance);
        let personality = crate::personality::for_geometry(&p.geometry);
        let resync_from = resync_from(
            personality.as_ref(),
            policy.as_ref(),
            p.resync_from,
            p.meta.resync_offset,
        );
        debug_assert_eq!(resync_from, p.resync_from, "assembly and policy disagree");
        let stripes = Arc::new(StripeCache::new(p.config.stripe_cache_bytes));
        let parity = personality.uses_stripe_cache();
        let chunk_bytes = p.geometry.chunk_sectors() * 512;
        let pool_bytes = p.config.stripe_cache_bytes;
        let locks = LocalLocks::new(parity, chunk_bytes, stripes.clone());
        let sync = Arc::new(SyncControl::new(resync_from, clock));
        let exposure = crate::background::Exposure {
            geometry: p.geometry.clone(),
            slots: p.slots.clone(),
            bitmap: policy.bitmap().cloned(),
            sync: sync.clone(),
        };
        let coordinator = p
            .config
            .coordinator
            .clone()
            .unwrap_or_else(|| Arc::new(crate::cluster::Local));
        let members = MemberSet::new(
            p.name.clone(),
            p.geometry.clone(),
            p.slots,
            p.meta,
            p.spares,
            events,
            coordinator,
            Box::new(exposure),
        );
        let parts = Parts {
            name: p.name,
            geometry: p.geometry,
            members,
            config: p.config,
            read_only_reason: p.read_only_reason,
            commit: CommitPoint::default(),
            io: IoPath::new(executor),
            personality,
            policy,
            used: p.used,
            integrity: p.integrity,
            stripes,
            locks,
            sector_locks: crate::lock::sectors::SectorLocks::new(),
            bufs: crate::io::bufpool::BufPool::new(pool_bytes),
            clock: sync.clock.clone(),
            walker: sync.clone(),
            torn_reads_refused: std::sync::atomic::AtomicU64::new(0),
            spliced_reads: std::sync::atomic::AtomicU64::new(0),
        };
        let array = Array {
            parts,
            uuid: p.uuid,
            closing: AtomicBool::new(false),
            was_dirty,
            never_run,
            inflight_writes: AtomicUsize::new(0),
            sync,
        };
        Ok(array)
    }

    pub fn uuid(&self) -> [u8; 16] {
        self.uuid
    }

    /// Whether the superblocks said "not cleanly stopped" when the array was assembled.
    pub fn was_dirty_at_assembly(&self) -> bool {
        self.was_dirty
    }

    /// Whether the array had never run since `create` when it was assembled (its first
    /// resync is then the initial sync, not a recovery from a crash).
    pub fn never_run_before(&self) -> bool {
        self.never_run
    }

    /// Read `buf.len()` bytes at `offset_bytes` (both multiples of 512).
    pub fn read(&self, offset_bytes: u64, buf: &mut [u8]) -> Result<()> {
        self.admit_read(offset_bytes, buf.len() as u64, true)?;
        self.read_admitted(offset_bytes, buf)
    }

    /// A read without the verify a `guided` array awaiting guidance does first.
    pub(crate) fn read_unverified(&self, offset_bytes: u64, buf: &mut [u8]) -> Result<()> {
        self.admit_read(offset_bytes, buf.len() as u64, false)?;
        self.read_admitted(offset_bytes, buf)
    }

    /// What every client read passes before it reaches the members: the range, the policy's
    /// verify owed first (with `verify`), the cluster's read refusal; then the read counts as
    /// client I/O (background work yields to it).
    fn admit_read(&self, offset_bytes: u64, len: u64, verify: bool) -> Result<()> {
        self.check_range(offset_bytes, len)?;
        if verify {
            self.policy
                .before_client_io(&self.parts, offset_bytes, len, false)?;
        }
        if let Some(reason) = self.members.coordinator().read_refusal() {
            return Err(EngineError::Unavailable {
                array: self.name.clone(),
                reason,
            });
        }
        self.sync.note_client_io();
        Ok(())
    }

    /// A read [`Array::admit_read`] let through: unused regions read as zeroes, the rest from
    /// the members.
    fn read_admitted(&self, offset_bytes: u64, buf: &mut [u8]) -> Result<()> {
        if self.used.is_none() {
            return self.read_members(offset_bytes, buf);
        }
        let mut at = offset_bytes;
        let mut rest: &mut [u8] = buf;
        for (len, zero) in self.zero_runs(offset_bytes, rest.len() as u64) {
            let (mine, tail) = std::mem::take(&mut rest).split_at_mut(len as usize);
            rest = tail;
            if zero {
                mine.fill(0);
            } else {
                self.read_members(at, mine)?;
            }
            at += len;
        }
        Ok(())
    }

    /// Whether [`Array::read_to_pipe`] can ever move a read: not where every read's bytes
    /// are checked in memory (integrity records, a read verifier).
    pub fn splices_reads(&self) -> bool {
        self.integrity.is_none() && self.config.read_verifier.is_none()
    }

    /// A client read moved into `pipe` without passing through user space, for a server that
    /// sends it on from there (`splice`): without integrity records, from where an ordinary
    /// read would take each byte as it lies (a mirror level's first copy, a parity level's
    /// data chunk outside the write-back cache), where that member is in sync, has no
    /// recorded bad block and can splice (a local file or block device), and nothing stands
    /// between client and members (a cluster's read refusal, a verify owed first, a region
    /// the used-region map says reads as zeroes). False: the caller reads the ordinary way,
    /// which handles whatever failed here (a degraded row's reconstruction among it); the
    /// pipe may hold part of the range then, for the caller to throw away.
    pub fn read_to_pipe(&self, offset_bytes: u64, len: usize, pipe: BorrowedFd<'_>) -> bool {
        let ok = len > 0
            && offset_bytes.is_multiple_of(512)
            && len.is_multiple_of(512)
            && self.admit_read(offset_bytes, len as u64, true).is_ok()
            && self
                .zero_runs(offset_bytes, len as u64)
                .iter()
                .all(|&(_, zero)| !zero);
        if !ok {
            return false;
        }
        let moved = self.personality.read_to_pipe(self, offset_bytes, len, pipe);
        if moved {
            self.spliced_reads.fetch_add(1, Ordering::Relaxed);
        }
        moved
    }

    fn read_members(&self, offset_bytes: u64, buf: &mut [u8]) -> Result<()> {
        self.personality.read(self, offset_bytes, buf)
    }

    /// Write `data` at `offset_bytes`; returns once it is on the members (durable with `fua`).
    pub fn write(&self, offset_bytes: u64, data: &[u8], fua: bool) -> Result<()> {
        self.write_with(offset_bytes, data, fua, None)
    }

    /// [`Array::write`], of a write announced earlier (`intent`, for the same range).
    pub(crate) fn write_with(
        &self,
        offset_bytes: u64,
        data: &[u8],
        fua: bool,
        intent: Option<crate::personality::intent::WriteIntent>,
    ) -> Result<()> {
        self.check_range(offset_bytes, data.len() as u64)?;
        self.sync.note_client_io();
        self.as_client_write(|| {
            self.policy
                .before_client_io(&self.parts, offset_bytes, data.len() as u64, true)?;
            let watched =
                self.policy
                    .write_begins(&self.parts, offset_bytes, data.len() as u64, Some(data));
            let res = self
                .personality
                .write(self, offset_bytes, data, fua, intent);
            self.records_after_write(res.is_ok() && fua);
            self.policy
                .write_ended(&self.parts, watched, res.is_ok(), fua);
            res
        })
    }

    /// Run a client write (or trim): refused when read-only, failed or stopping; counted in
    /// flight so that a clean stop waits for it.
    pub(crate) fn as_client_write<R>(&self, f: impl FnOnce() -> Result<R>) -> Result<R> {
        self.check_writable()?;
        // Counted before `closing` is checked: a clean stop that set `closing` and then saw no
        // write in flight cannot miss this one.
        self.inflight_writes.fetch_add(1, Ordering::SeqCst);
        let res = if self.closing.load(Ordering::SeqCst) {
            Err(EngineError::ReadOnly {
                array: self.name.clone(),
                reason: "stopping".into(),
            })
        } else {
            f()
        };
        self.inflight_writes.fetch_sub(1, Ordering::SeqCst);
        res
    }

    /// Write zeroes over a range. With `release`, whole used-map regions inside it are
    /// discarded on the members and marked unused instead (NBD's WRITE_ZEROES without
    /// NO_HOLE); the rest is written with zeroes, in bounded pieces.
    pub fn write_zeroes(
        &self,
        offset_bytes: u64,
        len_bytes: u64,
        fua: bool,
        release: bool,
    ) -> Result<()> {
        self.check_range(offset_bytes, len_bytes)?;
        let released = if release {
            self.release_whole_regions(offset_bytes, len_bytes)?
        } else {
            None
        };
        let end = offset_bytes + len_bytes;
        let (a, b) = released.map_or((end, end), |r| (r.start, r.end));
        self.write_zero_bytes(offset_bytes, a - offset_bytes, fua)?;
        // Released regions are durable already: their release flushed before clearing bits.
        self.write_zero_bytes(b, end - b, fua)
    }

    fn write_zero_bytes(&self, offset_bytes: u64, len_bytes: u64, fua: bool) -> Result<()> {
        const PIECE: u64 = 1 << 20;
        if len_bytes == 0 {
            return Ok(());
        }
        let zeroes = device::AlignedBuf::zeroed(PIECE.min(len_bytes) as usize);
        let mut done = 0;
        while done < len_bytes {
            let n = PIECE.min(len_bytes - done);
            self.write(offset_bytes + done, &zeroes[..n as usize], fua)?;
            done += n;
        }
        Ok(())
    }

    /// Verify reads over array byte ranges `(offset, length)`: every page row under them is
    /// read, checked and, unless the array refuses writes, repaired (`personality/verify.rs`).
    pub fn verify(&self, ranges: &[(u64, u64)]) -> Result<crate::work::VerifyReport> {
        self.parts.verify(ranges)
    }

    /// Clean stop: stop background work (checkpointing it), refuse new writes, wait for those
    /// in flight, flush, then record "clean" (or the resync checkpoint) in every superblock. If
    /// writes are still running after [`CLOSE_DRAIN_TIMEOUT`], the array stays "active".
    pub fn close(&self) -> Result<()> {
        self.sync.stop(self);
        self.closing.store(true, Ordering::SeqCst);
        self.stripes.hurry_all();
        let clock = &self.sync.clock;
        let deadline = clock.now() + CLOSE_DRAIN_TIMEOUT;
        while self.inflight_writes.load(Ordering::SeqCst) > 0 {
            if clock.now() > deadline {
                return Err(EngineError::ReadOnly {
                    array: self.name.clone(),
                    reason: "writes still in flight at stop; left marked active".into(),
                });
            }
            clock.sleep(Duration::from_millis(1));
        }
        if !self.config.read_only {
            // Write-back data goes home before the array is recorded clean (only a parity
            // level keeps a journal).
            if let Some(parity) = self.personality.as_parity() {
                parity.write_out_all(self)?;
            }
        }
        self.flush()?;
        if self.config.read_only {
            return Ok(());
        }
        if let Some(j) = self.policy.journal() {
            // The log let the flush skip the members; a clean state needs them durable. Then
            // the tail moves to the newest unit: the next assembly replays nothing else.
            self.flush_members();
            j.reclaim_now(&self.parts);
        }
        // The log may have failed in the reclaim: it is recorded so before the stop is.
        self.settle_journal()?;
        if let Some(bm) = self.policy.bitmap() {
            // Everything written is durable: the bits of every quiet chunk may go now, as md
            // clears its bitmap at a clean stop (chunks still to resync keep theirs).
            bm.daemon_pass(&self.members, true, || {});
        }
        let resync_from = self.sync.st.lock().resync_from;
        let mut meta = self.members.meta.lock();
        self.policy.on_clean(&mut meta, resync_from);
        let failed = self.members.commit_held(&mut meta);
        self.members.set_active(&meta, false);
        drop(meta);
        self.members.fail_after_sb_error(failed);
        Ok(())
    }

    /// Mark a member faulty, whatever the array's redundancy left (an administrator insisting:
    /// `fail --force`; see [`Array::fail_member_safely`]).
    pub fn fail_member(&self, name: &str) -> Result<()> {
        if let Some(j) = self.policy.journal().filter(|j| j.member().name() == name) {
            // md lets the journal be failed too: the array goes read-only. Returns once what
            // the log covered is durable on the members and the log is recorded faulty.
            j.fail(&self.parts, "failed by administrator");
            return self.settle_journal();
        }
        let role = self.members.role_named(name).ok_or_else(|| {
            EngineError::InvalidArgument(format!("{name} is not an active member of {}", self.name))
        })?;
        if self.personality.redundancy() == 0 {
            return Err(EngineError::Unsupported(format!(
                "{} has no redundancy; cannot fail {name}",
                self.name
            )));
        }
        self.members
            .fail_role(role, None, "failed by administrator");
        Ok(())
    }

    /// Keep this node's client writes out of sync coordinates `at..at + len` (md's: per-member
    /// bytes for parity levels, array bytes for mirrors) while another node of the cluster
    /// resyncs them, until the guard drops. Returns once the writes in flight there ended.
    pub fn hold_sync_window(&self, at: u64, len: u64) -> SyncWindow<'_> {
        SyncWindow(self.range_lock().lock(LockRange::Sync { at, len }))
    }

    /// [`Array::hold_sync_window`] for another node's recovery window over `at..at + len` of
    /// the member rebuilding `role`. RAID10 rebuilds in member bytes: the array bytes its
    /// chunks hold are held, and only those.
    pub fn hold_recovery_window(&self, role: usize, at: u64, len: u64) -> SyncWindow<'_> {
        match self.personality.recovery_array_ranges(role, at, len) {
            Some(ranges) => SyncWindow(self.range_lock().lock_array_ranges(&ranges)),
            None => self.hold_sync_window(at, len),
        }
    }

    /// As [`Array::fail_member`], but refused (`Busy`, md's EBUSY) when the array would not
    /// survive losing that member.
    pub fn fail_member_safely(&self, name: &str) -> Result<()> {
        let Some(role) = self
            .members
            .role_named(name)
            .filter(|_| self.personality.redundancy() > 0)
        else {
            // The journal, a stranger, or a level without redundancy: fail_member answers.
            return self.fail_member(name);
        };
        let mut failed: Vec<bool> = self
            .members
            .slots
            .iter()
            .map(|s| !s.is_complete())
            .collect();
        failed[role] = true;
        if !self.geometry.survives(&failed) {
            let others: Vec<String> = (0..failed.len())
                .filter(|&r| r != role && failed[r])
                .map(|r| r.to_string())
                .collect();
            let without = if others.is_empty() {
                String::new()
            } else {
                format!(" (already without roles {})", others.join(", "))
            };
            return Err(EngineError::Busy(format!(
                "refusing to fail {name}: {} ({}){without} would not survive losing role {role}; \
                 `fail --force` insists (clients then get I/O errors)",
                self.name,
                self.geometry.level().name()
            )));
        }
        self.fail_member(name)
    }

    /// Receive this array's events from now on.
    pub fn subscribe(&self) -> std::sync::mpsc::Receiver<Event> {
        self.members.events.subscribe()
    }

    pub fn status(&self) -> ArrayStatus {
        // Lock order: the sync state is never taken while `meta` is held (the background
        // worker holds the sync state while it activates a spare, which takes `meta`).
        let sync = self.sync_status();
        let unsynced = self.sync.unsynced.load(Ordering::Acquire);
        self.parts.status(self.uuid, sync, unsynced)
    }
}
