//! Member I/O fan-out: the only place the engine calls into devices for data.
//!
//! Every operation is planned against one member ([`MemberIo::planned`]): the member that filled
//! the role, current over the range, when the operation was built. It runs against that member
//! and no other, and only while the role still holds it, not faulty ([`crate::members::Slot::holds`]).
//! A spare installed in a failed role between planning and running therefore never serves a read
//! planned against its predecessor, nor receives a write above its rebuilt point; such an
//! operation ends [`IoOutcome::Stale`] and its caller plans again.
//!
//! A request's operations run through the array's [`Executor`]: in parallel on the member-I/O
//! threads and the caller's (`pool.rs`, threads that sleep rather than spin when idle), inline
//! when there is one or they are small and the members fast, or, in deterministic simulation,
//! one after the other in an order drawn from the seed. A write (or discard) error marks its member faulty (via [`MemberSet::fail_role`],
//! which records it in the superblocks) before the caller sees the outcome, so the caller can
//! fall back to redundancy at once. A read error does not: the read ends
//! [`IoOutcome::ReadError`], the caller serves the range from redundancy and writes it back
//! (see `badblocks`, which counts the blocks and fails a member past its limit). A
//! read of a range recorded in the member's bad-block log ends `ReadError` without touching the
//! device, and a successful write clears what it covers from the log. A full backing file system (ENOSPC, EDQUOT) is not a failed disk: the
//! member stays, the operation ends [`IoOutcome::NoSpace`] and the caller fails the request. A
//! read whose data the [`ReadVerifier`] rejects ends [`IoOutcome::Corrupt`]: every caller then
//! serves the range from redundancy (another copy, or reconstruction as if the member were
//! missing there), or fails the request when none is left, never returning the data.

pub(crate) mod bufpool;
pub(crate) mod commit;
pub(crate) mod no_space;
pub(crate) mod pool;

use crate::members::{Member, MemberSet};
use std::io;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

pub(crate) enum IoKind<'a> {
    Read(&'a mut [u8]),
    Write(&'a [u8], bool),
    /// Discard this many bytes: the range reads as zeroes afterwards (not durable until a
    /// flush, like a plain write).
    Discard(u64),
}

/// How one member operation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum IoOutcome {
    /// Not run yet.
    Pending,
    Ok,
    /// The device failed it; the member has been marked faulty.
    IoError,
    /// A read the device failed, or one of a range recorded bad: the member stays (see
    /// `badblocks`); the caller rebuilds the range from redundancy and writes it back, or fails
    /// the request when none is left.
    ReadError,
    /// The device's backing store is full; the member stays in the array.
    NoSpace,
    /// The planned member is no longer the role's current, healthy member; nothing was done.
    Stale,
    /// The read succeeded but the [`ReadVerifier`] says the data is not what was written; the
    /// member stays (it answered), the caller rebuilds the range from redundancy.
    Corrupt,
}

/// Checks what a member read returned before the engine uses it. The integrity layer plugs in
/// here; without one every successful read is taken as good.
pub trait ReadVerifier: Send + Sync + std::fmt::Debug {
    /// Is `buf`, read from `member` (filling `role`) at byte `offset_bytes` of its data area,
    /// what was last written there?
    fn verify(&self, member: &str, role: usize, offset_bytes: u64, buf: &[u8]) -> bool;
}

/// One operation on the member planned for `role`, at `offset_bytes` into its data area.
pub(crate) struct MemberIo<'a> {
    pub role: usize,
    pub offset_bytes: u64,
    pub kind: IoKind<'a>,
    member: Option<Arc<Member>>,
    pub outcome: IoOutcome,
    /// Integrity records of a write's blocks, when the caller knows them already (parity, by
    /// CRC linearity); None: computed from the bytes. For a read made [`MemberIo::keeping`]:
    /// the records of what it read, once it read fine (else left short).
    pub records: Option<Vec<u32>>,
}

impl<'a> MemberIo<'a> {
    /// A read of `role` over `buf.len()` bytes at `offset_bytes`, planned against the member
    /// of `members` that is current there now (none: the operation ends `Stale`).
    pub fn read(
        members: &MemberSet,
        role: usize,
        offset_bytes: u64,
        buf: &'a mut [u8],
    ) -> MemberIo<'a> {
        let member = members
            .slot(role)
            .in_sync_member(offset_bytes, buf.len() as u64);
        MemberIo::planned(role, member, offset_bytes, IoKind::Read(buf))
    }

    /// A write of `role`, planned against the member current there now.
    pub fn write(
        members: &MemberSet,
        role: usize,
        offset_bytes: u64,
        buf: &'a [u8],
        fua: bool,
    ) -> MemberIo<'a> {
        let member = members
            .slot(role)
            .in_sync_member(offset_bytes, buf.len() as u64);
        MemberIo::planned(role, member, offset_bytes, IoKind::Write(buf, fua))
    }

    /// An operation against `member` (None: the role had no usable member when planned; the
    /// operation ends `Stale` without touching any device).
    pub fn planned(
        role: usize,
        member: Option<Arc<Member>>,
        offset_bytes: u64,
        kind: IoKind<'a>,
    ) -> MemberIo<'a> {
        MemberIo {
            role,
            offset_bytes,
            kind,
            member,
            outcome: IoOutcome::Pending,
            records: None,
        }
    }

    /// This read keeps the integrity records of what it reads in `records` (when the array
    /// has integrity), for a caller that folds the bytes into parity.
    pub fn keeping(mut self) -> Self {
        self.records = Some(Vec::new());
        self
    }

    pub fn ok(&self) -> bool {
        self.outcome == IoOutcome::Ok
    }

    fn run(&mut self, cx: &IoContext<'_>) -> Option<io::Error> {
        // Integrity: a write's records are accepted beside the old ones while it is in flight
        // and replace them once it has ended (see `integrity`). A write that is not run because
        // its member left the role still sets them: the role gets these bytes from the caller's
        // next plan or from the rebuild.
        let integrity = cx.integrity;
        let records = integrity.and_then(|i| match &self.kind {
            IoKind::Read(_) => None,
            IoKind::Write(buf, _) => {
                Some(i.begin_write(self.role, self.offset_bytes, buf, self.records.take()))
            }
            IoKind::Discard(len) => Some(i.begin_zero(self.role, self.offset_bytes, *len)),
        });
        let end = |role: usize, offset: u64| {
            if let (Some(i), Some(records)) = (integrity, records.as_ref()) {
                i.end_write(role, offset, records);
            }
        };
        let member = match self.member.as_ref() {
            Some(m) if cx.members.slot(self.role).holds(m) => m,
            _ => {
                end(self.role, self.offset_bytes);
                self.outcome = IoOutcome::Stale;
                return None;
            }
        };
        let at = member.data_offset_bytes + self.offset_bytes;
        if let IoKind::Read(buf) = &self.kind {
            if member.health.overlaps(self.offset_bytes, buf.len() as u64) {
                // Recorded bad: what the device holds there is not the data.
                self.outcome = IoOutcome::ReadError;
                return None;
            }
        }
        if let Some(i) = integrity {
            i.prefetch(self.role, self.offset_bytes);
        }
        let res = match &mut self.kind {
            IoKind::Read(buf) => member.dev.read_at(buf, at),
            IoKind::Write(buf, fua) => member.dev.write_at(buf, at, *fua),
            IoKind::Discard(len) => member.dev.discard_zeroes(at, *len),
        };
        end(self.role, self.offset_bytes);
        match res {
            Ok(()) if !matches!(self.kind, IoKind::Read(_)) => {
                let len = self.len() as u64;
                member.health.clear(member, self.offset_bytes, len);
                self.outcome = IoOutcome::Ok;
                None
            }
            Ok(()) => {
                // Lent out and back, not cloned: a shared count both cores would write.
                let m = self.member.take().expect("the read ran against it");
                self.outcome = self.check_read(cx, &m);
                self.member = Some(m);
                None
            }
            Err(e) if is_no_space(&e) => {
                self.outcome = IoOutcome::NoSpace;
                tracing::warn!(member = %member.name(), offset = at, "backing store full: {e}");
                None
            }
            Err(e) if matches!(self.kind, IoKind::Read(_)) => {
                tracing::warn!(member = %member.name(), offset = at, "read error: {e}");
                self.outcome = IoOutcome::ReadError;
                None
            }
            Err(e) => {
                self.outcome = IoOutcome::IoError;
                Some(e)
            }
        }
    }

    /// What a read that `member` answered holds: good, or not what was written there.
    fn check_read(&mut self, cx: &IoContext<'_>, member: &Member) -> IoOutcome {
        let IoKind::Read(buf) = &self.kind else {
            unreachable!("only reads are checked");
        };
        let verified = cx
            .verifier
            .is_none_or(|v| v.verify(member.name(), self.role, self.offset_bytes, buf));
        let recorded = cx.integrity.is_none_or(|i| {
            let keep = self.records.as_mut();
            i.verify_keeping(self.role, self.offset_bytes, buf, keep)
        });
        if !recorded {
            member.health.note_checksum_error();
        }
        if verified && recorded {
            IoOutcome::Ok
        } else {
            IoOutcome::Corrupt
        }
    }

    fn len(&self) -> usize {
        match &self.kind {
            IoKind::Read(b) => b.len(),
            IoKind::Write(b, _) => b.len(),
            IoKind::Discard(len) => *len as usize,
        }
    }

    fn op_name(&self) -> &'static str {
        match self.kind {
            IoKind::Read(_) => "read",
            IoKind::Write(..) => "write",
            IoKind::Discard(_) => "discard",
        }
    }
}

/// ENOSPC, EDQUOT (and a file grown past its limit): the store is full, the disk is not broken.
fn is_no_space(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc_errno::ENOSPC | libc_errno::EDQUOT)
    ) || e.kind() == io::ErrorKind::StorageFull
}

/// The two errno values, spelled out so the engine needs no libc dependency for them.
mod libc_errno {
    pub const ENOSPC: i32 = 28;
    pub const EDQUOT: i32 = 122;
}

/// Batches up to this many bytes may run inline on fast members: a stripe write of a gathered
/// run (up to 128 KiB of client data, whose column intervals may span every data chunk of a
/// 64 KiB-chunk row) stays inline, a full 1 MiB stripe does not.
const CHEAP_BATCH_BYTES: usize = 256 * 1024;
/// Small member operations faster than this (moving average) count as memory speed.
const CHEAP_OP_NANOS: u64 = 20_000;

/// How member operations run, and what the fast-path heuristic has learnt of the members.
pub(crate) struct IoPath {
    executor: Executor,
    /// Moving average of small member operations' duration (ns), starting pessimistic.
    small_io_nanos: AtomicU64,
}

impl IoPath {
    pub fn new(executor: Executor) -> IoPath {
        IoPath {
            executor,
            small_io_nanos: AtomicU64::new(1_000_000),
        }
    }

    /// The member-I/O threads, for background work to run its pieces on; None when member I/O
    /// runs one operation at a time in a seeded order (the simulation): background work then
    /// keeps to one thread as well, so that a seed replays one run.
    pub(crate) fn pool(&self) -> Option<&pool::IoPool> {
        match &self.executor {
            Executor::Threads(pool) => Some(pool),
            Executor::Deterministic(_) => None,
        }
    }

    /// Small batch and members fast enough (recent small operations, averaged) that issuing
    /// them one after the other beats waking other threads.
    fn is_cheap(&self, ios: &[MemberIo<'_>]) -> bool {
        ios.iter().map(MemberIo::len).sum::<usize>() <= CHEAP_BATCH_BYTES
            && self.small_io_nanos.load(Ordering::Relaxed) < CHEAP_OP_NANOS
    }

    /// Fold the duration of a small operation into the moving average. A sample counts at most
    /// a few times the threshold: a thread preempted in the middle of a memory-speed operation
    /// (a busy machine) must not turn the members slow for the next dozens of batches, while
    /// members that are slow on every operation still average above it.
    fn note_latency(&self, len: usize, took: std::time::Duration) {
        if len <= 64 * 1024 {
            let ns = took.as_nanos().min(u128::from(4 * CHEAP_OP_NANOS)) as u64;
            let avg = self.small_io_nanos.load(Ordering::Relaxed);
            self.small_io_nanos
                .store(avg - avg / 16 + ns / 16, Ordering::Relaxed);
        }
    }

    /// Run `ios`. Each `outcome` tells how it ended; a member that failed has been marked
    /// faulty on return. Returns true if all succeeded.
    pub fn run(&self, cx: &IoContext<'_>, ios: &mut [MemberIo<'_>]) -> bool {
        if ios.is_empty() {
            return true;
        }
        // Every member write is inside the commit point (DESIGN.md's ordering rules hang on it):
        // the superblocks say "active", the bitmap or journal covers it, failures it meets are
        // recorded before it is acknowledged.
        assert!(
            ios.iter().all(|op| matches!(op.kind, IoKind::Read(_)))
                || cx.writes_in_commit.load(Ordering::Relaxed) > 0,
            "a member write outside the commit point"
        );
        // (index into `ios`, error) of every operation the device failed.
        let errors: Vec<(usize, io::Error)> = match &self.executor {
            Executor::Deterministic(rng) => {
                use rand::seq::SliceRandom;
                let mut order: Vec<usize> = (0..ios.len()).collect();
                order.shuffle(&mut *rng.lock());
                order
                    .into_iter()
                    .filter_map(|i| ios[i].run(cx).map(|e| (i, e)))
                    .collect()
            }
            Executor::Threads(_) if ios.len() == 1 || self.is_cheap(ios) => {
                // One operation, or small ones on members that answer at memory speed: a
                // hand-off to another thread would cost more than the I/O itself.
                let mut errors = Vec::new();
                for (i, op) in ios.iter_mut().enumerate() {
                    let started = cx.clock.now();
                    if let Some(e) = op.run(cx) {
                        errors.push((i, e));
                    }
                    let took = cx.clock.now().saturating_sub(started);
                    self.note_latency(op.len(), took);
                }
                errors
            }
            Executor::Threads(pool) => self.run_parallel(cx, pool, ios),
        };
        // Only the member the operation ran against is failed: the role may have changed
        // hands since (a spare filling it now is not to blame).
        for (i, e) in &errors {
            let op = &ios[*i];
            if let Some(m) = &op.member {
                let why = format!(
                    "{} at data byte {} failed: {e}",
                    op.op_name(),
                    op.offset_bytes
                );
                cx.members.fail_role(op.role, Some(m), &why);
            }
        }
        ios.iter().all(MemberIo::ok)
    }

    fn run_parallel(
        &self,
        cx: &IoContext<'_>,
        pool: &pool::IoPool,
        ios: &mut [MemberIo<'_>],
    ) -> Vec<(usize, io::Error)> {
        let found = parking_lot::Mutex::new(Vec::new());
        // Each index is claimed once (`IoPool::run`): the locks are never contended.
        let ops: Vec<parking_lot::Mutex<&mut MemberIo<'_>>> =
            ios.iter_mut().map(parking_lot::Mutex::new).collect();
        pool.run(ops.len(), &|i| {
            let mut op = ops[i].lock();
            let started = cx.clock.now();
            if let Some(e) = op.run(cx) {
                found.lock().push((i, e));
            }
            if i == 0 {
                self.note_latency(op.len(), cx.clock.now().saturating_sub(started));
            }
        });
        found.into_inner()
    }

    /// Run `f` once per index in `0..n`: in parallel on the pool, or in order when simulated.
    pub fn for_each(&self, n: usize, f: impl Fn(usize) + Sync) {
        match &self.executor {
            Executor::Threads(pool) => pool.run(n, &f),
            Executor::Deterministic(_) => (0..n).for_each(f),
        }
    }
}

/// What member I/O needs besides the operations: the member set (whose failures it records),
/// the integrity records and the read verifier it checks reads with, the clock it times small
/// operations by, and the count of write groups inside the commit point (every write must be).
pub(crate) struct IoContext<'a> {
    pub members: &'a MemberSet,
    pub integrity: Option<&'a crate::integrity::Integrity>,
    pub verifier: Option<&'a dyn ReadVerifier>,
    pub clock: &'a dyn crate::clock::Clock,
    pub writes_in_commit: &'a AtomicUsize,
}

/// How member operations of one request are run.
pub(crate) enum Executor {
    /// In parallel on the member-I/O threads and the caller's (inline when cheap).
    Threads(pool::IoPool),
    /// One after the other on the caller's thread, in an order drawn from a seeded RNG, so that
    /// one seed replays one interleaving of completions.
    Deterministic(Box<parking_lot::Mutex<rand_chacha::ChaCha8Rng>>),
}
