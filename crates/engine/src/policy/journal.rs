//! md's raid5-cache write-ahead journal, write-through mode (reference §6).
//!
//! A separate log device holds a ring of io units: a meta block (`format::MetaBlock`) and the
//! pages it describes. Every stripe write of a RAID4/5/6 array is logged before any of its
//! member writes goes out:
//! 1. the interval's data pages and its parity pages (P, and Q on RAID6, computed by the
//!    stripe code before the commit point) become io units, cut at 4 KiB columns so that each
//!    column's data and parity sit in one unit; a whole stripe logs its data only (recovery
//!    computes the parity of a column it holds every data page of, see `plan_replay`);
//! 2. the units are written to the ring at the head (without FUA: their checksums, not their
//!    order, tell recovery what is whole);
//! 3. group commit: the writer waits until a flush of the log device has covered its units
//!    *and every unit before them* (md's strict order: a stripe goes to the members only when
//!    all earlier io units are durable, so recovery's consistent prefix never skips a unit
//!    whose stripe already reached the members);
//! 4. the member writes run (no FUA needed: the log holds them), and the units are "home".
//!
//! Reclaim moves the tail (`journal_tail`, in the log device's superblock) past units that are
//! home, only after a flush of every member has made them durable there; the tail always points
//! at a real meta block (the oldest unit not home, or the newest unit when all are home), as
//! md's does. Recovery at assembly reads the consistent chain from the tail; the array, once
//! built, writes every logged stripe home through its commit point, and then a new chain starts
//! with the sequence number advanced by 10000, so blocks of the old chain beyond its end can
//! never continue the new one.
//!
//! A client's acknowledged write is in the log durably, so a client flush needs no member
//! flush, and FUA needs none either. If the log device fails, new writes are refused (the array
//! turns read-only); writes already logged complete; nothing unlogged reaches a member except
//! the write-back cache, which is written out from memory; the journal is recorded faulty in
//! the superblocks only once that is durable on the members (`journal_fail.rs`).
//!
//! A read-only start replays nothing, so it starts only if the members hold everything the
//! chain would replay (compared page by page); otherwise it is refused with what to do.

use crate::clock::Clock;
use crate::error::{EngineError, Result};
use crate::io::commit::{StripeImage, WriteSet};
use crate::io::{IoKind, MemberIo};
use crate::members::metadata::Metadata;
use crate::members::superblock_block;
use crate::members::{Member, Slot};
use crate::policy::host::PolicyHost;
use crate::policy::write_back::WriteBackCache;
use device::{AlignedBuf, Device};
use format::{
    journal_seed, MetaBlock, PageChecksums, Payload, Superblock, JOURNAL_BLOCK, PAGE_SECTORS,
};
use layout::Geometry;
use parking_lot::{Condvar, Mutex};
use std::collections::{BTreeMap, VecDeque};
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

mod cache;

/// The smallest log `create` accepts (the array's geometry may need more, see
/// [`required_log_sectors`]).
pub(crate) const MIN_LOG_SECTORS: u64 = 2048;
/// md's jump of the sequence number when recovery starts a new chain.
pub(crate) const RECOVERY_SEQ_JUMP: u64 = 10_000;
const PAGE: usize = JOURNAL_BLOCK;
const PAGE_SECTORS_U64: u64 = PAGE_SECTORS as u64;

/// Sectors of the ring: the log device's data area, in whole pages.
pub(crate) fn log_sectors(sb: &Superblock) -> u64 {
    sb.data_size / PAGE_SECTORS_U64 * PAGE_SECTORS_U64
}

/// The ring must hold what writers in flight can log at once several times over: four
/// times the largest interval (a whole chunk on every member) with its meta blocks.
pub(crate) fn required_log_sectors(geometry: &Geometry) -> u64 {
    let pages = geometry.chunk_sectors() / PAGE_SECTORS_U64 * geometry.raid_disks() as u64;
    let metas = pages.div_ceil(100) + 1;
    4 * (pages + metas) * PAGE_SECTORS_U64
}

/// A random first sequence number for a new log (32 bits, as mdadm draws).
pub(crate) fn new_log_seq(clock: &dyn Clock) -> u64 {
    clock.random_u64() & u64::from(u32::MAX)
}

/// Write the empty log of a new journal (what mdadm writes): one empty meta block at position
/// 0 with sequence number `seq` (see [`new_log_seq`]); the superblock's `journal_tail` is 0.
pub(crate) fn write_empty_log(dev: &dyn Device, sb: &Superblock, seq: u64) -> std::io::Result<()> {
    let block = MetaBlock::empty(seq, 0).encode(journal_seed(&sb.set_uuid));
    dev.write_at(&AlignedBuf::copy_from(&block), sb.data_offset * 512, true)
}

/// One io unit in the ring.
#[derive(Clone, Copy, Debug)]
struct Unit {
    seq: u64,
    start: u64,
    sectors: u64,
    /// Its write to the log completed.
    logged: bool,
    /// Its member writes completed.
    home: bool,
}

struct LogState {
    /// Units from the tail on, in sequence order (`units[i].seq == units[0].seq + i`).
    units: VecDeque<Unit>,
    /// Where the next unit goes.
    head: u64,
    next_seq: u64,
    /// Every unit with a smaller sequence number is durable in the log.
    durable_seq: u64,
    flushing: bool,
    /// The log failed (why): no new writes from then on. See [`Journal::settle`].
    failed: Option<String>,
    /// After a failure: the cache is written out, the members flushed, and the log recorded
    /// faulty in the superblocks (only then: until this, a crash leaves the log to be
    /// replayed at the next start).
    settled: bool,
    /// Groups of member writes past the log (their units durable) whose member writes have not
    /// finished: a failed log is recorded faulty only when none is left.
    tickets: usize,
    /// Sectors kept free for writing out what the write-back cache holds (its parity).
    flush_reserve: u64,
}

impl LogState {
    /// The state a recovered log starts in: the new `chain` (see [`NewChain::into_units`]),
    /// every unit of it durable.
    fn of_chain(chain: NewChain, log: u64, failed: Option<String>, flush_reserve: u64) -> Self {
        let (units, head) = chain.into_units(log);
        let next = units.back().expect("a unit").seq + 1;
        LogState {
            units,
            head,
            next_seq: next,
            durable_seq: next,
            flushing: false,
            failed,
            settled: false,
            tickets: 0,
            flush_reserve,
        }
    }

    fn tail(&self) -> u64 {
        self.units.front().map_or(self.head, |u| u.start)
    }

    fn used(&self, log: u64) -> u64 {
        (self.head + log - self.tail()) % log
    }

    fn unit(&mut self, seq: u64) -> &mut Unit {
        let first = self.units.front().expect("unit in the ring").seq;
        &mut self.units[(seq - first) as usize]
    }

    /// Every unit below this sequence number has been written to the log. Units below
    /// `durable_seq` are logged (they were when it moved past them): only the ones in flight
    /// are looked at, not the whole ring (tens of thousands of units when the log is full).
    fn logged_prefix(&self) -> u64 {
        let first = self.units.front().map_or(self.next_seq, |u| u.seq);
        let from = self.durable_seq.clamp(first, self.next_seq);
        debug_assert!(
            self.units
                .range(..(from - first) as usize)
                .all(|u| u.logged),
            "a unit below the durable sequence is not logged"
        );
        self.units
            .range((from - first) as usize..)
            .find(|u| !u.logged)
            .map_or(self.next_seq, |u| u.seq)
    }
}

/// What recovery found and did at assembly.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Replayed {
    /// Io units of the consistent chain (the tail's own unit included).
    pub units: u64,
    /// Units whose meta block was whole but a page was not: skipped.
    pub torn_units: u64,
    /// Pages written home.
    pub pages: u64,
    /// Data pages logged without parity (write-back mode), written through the array.
    pub data_only_pages: u64,
    pub millis: u64,
}

/// The journal, for status.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JournalStatus {
    pub device: String,
    pub mode: &'static str,
    /// Bytes of acknowledged data held in memory (write-back) until its row is written out.
    pub cache_bytes: u64,
    pub log_bytes: u64,
    /// Bytes between the tail and the head.
    pub used_bytes: u64,
    pub tail_sector: u64,
    pub next_seq: u64,
    /// Bytes of pages and meta blocks written to the log since assembly.
    pub logged_bytes: u64,
    pub flushes: u64,
    pub reclaims: u64,
    pub failed: Option<String>,
    /// `active`; `failing`: the log failed, writes are refused, and what it covered is being
    /// written out to the members; `failed`: that is done and the log is recorded faulty.
    pub state: &'static str,
    pub replayed: Replayed,
}

pub(crate) struct Journal {
    member: Arc<Member>,
    log: u64,
    seed: u32,
    st: Mutex<LogState>,
    cv: Condvar,
    /// One reclaim at a time.
    reclaim: Mutex<()>,
    /// One settling of a failed log at a time (others wait for it: a flush must not return
    /// before the write-out it needs).
    settling: Mutex<()>,
    logged_bytes: AtomicU64,
    flushes: AtomicU64,
    reclaims: AtomicU64,
    /// Set when recovery's replay has gone home ([`PendingReplay::write_home`]).
    replayed: Mutex<Replayed>,
    write_back: std::sync::atomic::AtomicBool,
    /// The write-back cache or the ring ran short: writes go through until the cache has
    /// drained (see [`Journal::caching_paused`]).
    paused: std::sync::atomic::AtomicBool,
    cache: Mutex<WbCache>,
    /// Rows in the cache or being written out of it (read lock-free by the read path).
    cached_rows: std::sync::atomic::AtomicUsize,
    /// The superblocks say a resync is owed because rows went home unlogged after the log
    /// failed (`Journal::owe_resync_for_unlogged_write_out`).
    pub(crate) unlogged_recorded: std::sync::atomic::AtomicBool,
}

/// Write-back mode: data acknowledged once in the log, held here until its row is written out.
#[derive(Default)]
struct WbCache {
    rows: BTreeMap<u64, CachedRow>,
    /// Rows taken out of `rows` by a write-out that has not completed yet: their members may
    /// still hold older bytes than the ones acknowledged, so reads must still go through the
    /// row's claim (which the write-out holds) rather than straight to a member.
    writing: std::collections::BTreeSet<u64>,
    bytes: usize,
    /// `rows` by the oldest unit each holds, then row: the order write-outs go in, kept as
    /// rows come and go (a full cache holds thousands; sorting them for every write-out was
    /// where a write-back array's time went).
    by_age: std::collections::BTreeSet<(u64, u64)>,
}

/// One row's cached pages (by page offset in the chunk and data index), the write-back units
/// that logged them (home once the row is written out), and the reserve its write-out needs.
pub(crate) struct CachedRow {
    pub pages: BTreeMap<(u64, usize), AlignedBuf>,
    seqs: Vec<u64>,
    need: u64,
    /// When the row was first cached, on the array's clock.
    since: Duration,
    /// Found by recovery (data the log held without parity). Its stripe may be torn on the
    /// members: a log that failed has its cache written out without logging parity, and a
    /// cut in that write-out leaves data and parity disagreeing with nothing to replay. So
    /// its write-out computes parity from the whole row (reconstruct-write), never by
    /// read-modify-write from the parity on the members.
    pub recovered: bool,
}

impl CachedRow {
    /// The oldest unit holding its pages (recovered rows, logged by none yet, come last).
    fn oldest_seq(&self) -> u64 {
        self.seqs.iter().copied().min().unwrap_or(u64::MAX)
    }

    /// Copy the cached bytes of data chunk `d` over `buf`, which holds its bytes from `off`
    /// (in the chunk) on.
    pub fn overlay(&self, d: usize, off: u64, buf: &mut [u8]) {
        let end = off + buf.len() as u64;
        for (&(p, pd), page) in self.pages.range((off / PAGE as u64 * PAGE as u64, 0)..) {
            if p >= end {
                break;
            }
            if pd != d {
                continue;
            }
            let lo = p.max(off);
            let hi = (p + PAGE as u64).min(end);
            buf[(lo - off) as usize..(hi - off) as usize]
                .copy_from_slice(&page[(lo - p) as usize..(hi - p) as usize]);
        }
    }

    /// Distinct page offsets (columns) with cached data.
    fn columns(&self) -> u64 {
        let mut offs: Vec<u64> = self.pages.keys().map(|&(off, _)| off).collect();
        offs.dedup();
        offs.len() as u64
    }

    /// Runs of consecutive cached page offsets, as byte ranges of the chunk.
    pub fn intervals(&self) -> Vec<(u64, u64)> {
        crate::intervals::merge(
            self.pages
                .keys()
                .map(|&(off, _)| (off, off + PAGE as u64))
                .collect(),
        )
    }

    /// Is every page of data chunk `d` over `a..b` cached?
    pub fn covers_chunk(&self, d: usize, a: u64, b: u64) -> bool {
        (a..b)
            .step_by(PAGE)
            .all(|off| self.pages.contains_key(&(off, d)))
    }

    /// Data indices with a cached page in `a..b`.
    pub fn dirty(&self, data_disks: usize, a: u64, b: u64) -> Vec<usize> {
        (0..data_disks)
            .filter(|&d| {
                self.pages
                    .range((a, 0)..(b, 0))
                    .any(|(&(_, pd), _)| pd == d)
            })
            .collect()
    }
}

/// Ends a ticket (see [`Journal::take_ticket`]) when dropped.
struct TicketGuard<'a>(&'a Journal);

impl Drop for TicketGuard<'_> {
    fn drop(&mut self) {
        self.0.end_ticket();
    }
}

/// How a reservation in the ring may be served.
#[derive(Clone, Copy)]
enum Space {
    /// Leaves the write-out reserve free; waits for room.
    Normal,
    /// Write-back caching: grows the reserve by `grow`; never waits (None when no room).
    Cache { grow: u64 },
    /// A write-out's parity: may use the reserve, and gives back `release` of it.
    WriteOut { release: u64 },
}

/// Data pages recovery found without parity (array byte offset, page).
type DataOnly = Vec<(u64, AlignedBuf)>;

impl Journal {
    /// The reclaim thread: settles a failed log, writes out cached rows that are due and
    /// reclaims the log, until the array stops its background work.
    pub(crate) fn daemon(&self, host: &dyn PolicyHost) {
        let clock = host.clock();
        let mut last = clock.now();
        let mut warned = false;
        host.until_stopped(Duration::from_millis(50), &mut || {
            if self.failed().is_some() && !self.settled() {
                // Nobody flushed since the log failed: write its cache out now (and again at
                // every tick while that fails, saying so once).
                match self.settle(host) {
                    Err(e) if !warned => {
                        warned = true;
                        tracing::warn!(array = %host.name(), "the failed journal's cache is not written out yet: {e}");
                    }
                    _ => {}
                }
            }
            // Write-back: rows go home when the cache fills, when their data has waited a
            // while, and all of them once the array writes through (mode switched, degraded).
            let degraded = host.members().slots.iter().any(|s| !s.is_complete());
            let oldest = self.cached_rows_by_age(clock.now(), 64);
            for (written, (_, age)) in oldest.into_iter().enumerate() {
                let pressed = self.cache_bytes() > host.stripe_cache_bytes() / 8;
                if written >= 64
                    || !(pressed
                        || !self.write_back()
                        || degraded
                        || age >= WRITE_OUT_AGE
                        || self.failed().is_some())
                    || !host.write_out_oldest()
                {
                    break;
                }
            }
            let free = self.reclaimable();
            let due = clock.now().saturating_sub(last) >= RECLAIM_AGE;
            if free * 4 > self.log || (free > 0 && due) {
                self.reclaim_now(host);
                last = clock.now();
            }
        });
    }
    pub fn member(&self) -> &Arc<Member> {
        &self.member
    }

    pub fn failed(&self) -> Option<String> {
        self.st.lock().failed.clone()
    }

    /// Log a stripe interval and wait until it, and everything logged before it, is durable.
    /// Returns the sequence numbers of its units, for [`Journal::written_home`].
    pub fn log(&self, host: &dyn PolicyHost, img: &StripeImage<'_>) -> Result<Range<u64>> {
        let units = self.build_units(host, img);
        let space = if img.parity_only {
            Space::WriteOut {
                release: write_out_need(img.p.len() as u64 / PAGE as u64, host.geometry()),
            }
        } else {
            Space::Normal
        };
        let seqs = self
            .write_units(host, units, space)?
            .expect("normal and write-out reservations wait for room");
        // Its member writes may go out (the ticket ends in `written_home`).
        self.take_ticket(host)?;
        Ok(seqs)
    }

    /// Reserve sectors for the units, write them, wait until they are durable. None: a
    /// `Space::Cache` reservation found no room.
    fn write_units(
        &self,
        host: &dyn PolicyHost,
        mut units: Vec<(MetaBlock, Vec<&[u8]>)>,
        space: Space,
    ) -> Result<Option<Range<u64>>> {
        let sizes: Vec<u64> = units.iter().map(|(m, _)| m.unit_sectors()).collect();
        let Some((first_seq, start)) = self.reserve(host, &sizes, space)? else {
            return Ok(None);
        };
        let seqs = first_seq..first_seq + units.len() as u64;
        let total: u64 = sizes.iter().sum();
        // The meta blocks go into one pool buffer; the pages are written from where they are
        // (one vectored write, no copy of the data into a log buffer).
        let mut metas = host.bufs().get(units.len() * PAGE);
        let mut pos = start;
        for (((meta, _), seq), block) in units
            .iter_mut()
            .zip(seqs.clone())
            .zip(metas.chunks_mut(PAGE))
        {
            meta.seq = seq;
            meta.position = pos;
            block.copy_from_slice(&meta.encode(self.seed));
            pos = (pos + meta.unit_sectors()) % self.log;
        }
        let mut pieces: Vec<&[u8]> = Vec::with_capacity((total / PAGE_SECTORS_U64) as usize);
        for ((_, pages), block) in units.iter().zip(metas.chunks(PAGE)) {
            pieces.push(block);
            pieces.extend(pages.iter().copied());
        }
        let res = write_ring_at(&self.member, self.log, start, &pieces);
        self.logged_bytes.fetch_add(total * 512, Ordering::Relaxed);
        if let Err(e) = &res {
            // Failed before the units count as logged: a group flush must never count a
            // unit that is not in the log as durable (units after it would be acknowledged
            // and then not replayed, the chain ending at the missing one).
            self.fail(host, &format!("log write failed: {e}"));
        }
        {
            let mut st = self.st.lock();
            for seq in seqs.clone() {
                st.unit(seq).logged = true;
            }
            self.cv.notify_all();
        }
        self.wait_durable(host, seqs.end)?;
        Ok(Some(seqs))
    }

    /// The io units of an interval: meta blocks (sequence and position filled in later) with
    /// their pages, one 4 KiB column's data and parity always in the same unit.
    fn build_units<'a>(
        &self,
        host: &dyn PolicyHost,
        img: &StripeImage<'a>,
    ) -> Vec<(MetaBlock, Vec<&'a [u8]>)> {
        let g = host.geometry();
        let chunk = g.chunk_sectors() * 512;
        let in_chunk = img.at % chunk;
        let cols = img.p.len() / PAGE;
        assert_eq!(
            img.p.len() % PAGE,
            0,
            "journalled intervals are whole pages"
        );
        // A whole stripe's data fixes its parity, so only the data is logged: recovery
        // computes P (and Q) of a column whose every data page it holds (`plan_replay`), as
        // md's recovery does for data-only stripes. Parity was a quarter of the log's bytes
        // on RAID5 x4 (a third on RAID6 x6).
        let log_parity = img.parity_only || img.data.len() < g.data_disks();
        let mut units = UnitsBuilder::default();
        let (mut payloads, mut pages) = (Vec::new(), Vec::new());
        for col in 0..cols {
            let r = col * PAGE..(col + 1) * PAGE;
            for &(d, buf) in img.data.iter().filter(|_| !img.parity_only) {
                let page = &buf[r.clone()];
                let array_byte = (img.row * g.data_disks() as u64 + d as u64) * chunk
                    + in_chunk
                    + r.start as u64;
                payloads.push(Payload::Data {
                    location: array_byte / 512,
                    checksums: PageChecksums::from_slice(&[format::crc32c_raw(self.seed, page)]),
                });
                pages.push(page);
            }
            if log_parity {
                let p = &img.p[r.clone()];
                let mut checksums = PageChecksums::from_slice(&[format::crc32c_raw(self.seed, p)]);
                pages.push(p);
                if let Some(q) = img.q {
                    checksums.push(format::crc32c_raw(self.seed, &q[r.clone()]));
                    pages.push(&q[r.clone()]);
                }
                payloads.push(Payload::Parity {
                    location: (img.at + r.start as u64) / 512,
                    checksums,
                });
            }
            units.add(payloads.drain(..), pages.drain(..));
        }
        units.units
    }

    /// Take room for units of these sizes (sectors) at the head, reclaiming (or waiting for
    /// writers in flight) when the ring is too full. Returns the first sequence number and the
    /// start sector.
    fn reserve(
        &self,
        host: &dyn PolicyHost,
        sizes: &[u64],
        space: Space,
    ) -> Result<Option<(u64, u64)>> {
        let sectors: u64 = sizes.iter().sum();
        assert!(
            sectors + PAGE_SECTORS_U64 < self.log,
            "an interval of {sectors} sectors cannot fit a ring of {}",
            self.log
        );
        loop {
            {
                let mut st = self.st.lock();
                if let Some(why) = &st.failed {
                    return Err(self.read_only(host, why));
                }
                // Strictly less: head never catches up with the tail's meta block.
                let keep = match space {
                    Space::Normal => st.flush_reserve,
                    Space::Cache { grow } => st.flush_reserve + grow,
                    Space::WriteOut { .. } => 0,
                };
                if st.used(self.log) + sectors + keep < self.log {
                    match space {
                        Space::Normal => {}
                        Space::Cache { grow } => st.flush_reserve += grow,
                        Space::WriteOut { release } => {
                            st.flush_reserve = st.flush_reserve.saturating_sub(release)
                        }
                    }
                    let first = st.next_seq;
                    let start = st.head;
                    let mut pos = start;
                    for &size in sizes {
                        let seq = st.next_seq;
                        st.units.push_back(Unit {
                            seq,
                            start: pos,
                            sectors: size,
                            logged: false,
                            home: false,
                        });
                        st.next_seq += 1;
                        pos = (pos + size) % self.log;
                    }
                    st.head = (start + sectors) % self.log;
                    return Ok(Some((first, start)));
                }
                if matches!(space, Space::Cache { .. }) {
                    return Ok(None);
                }
            }
            // A reclaim costs a flush of every member and a superblock write, whatever it
            // frees; while cached rows pin the tail it frees only the units before the next
            // one. So a writer short of room writes out the oldest cached row (writers do
            // that side by side) until a reclaim would free a worthwhile share of the ring,
            // and reclaims then, or when no cached row is left to write out.
            let worth = self.reclaimable_at_least(self.log / RECLAIM_SHARE);
            let freed = (worth && self.reclaim_or_join(host))
                || (matches!(space, Space::Normal) && host.write_out_oldest())
                || self.reclaim_or_join(host);
            if !freed && host.members().is_failed() {
                // Nothing can go home any more: what waits for room never gets it.
                return Err(host
                    .members()
                    .unrecoverable(0, 0, "too many members failed"));
            }
            if !freed {
                // Nothing could be reclaimed: wait for a writer in flight to get its stripe
                // home.
                let mut st = self.st.lock();
                if st.failed.is_none() {
                    self.cv
                        .wait_for(&mut st, std::time::Duration::from_millis(10));
                }
            }
        }
    }

    /// Group commit: wait until every unit below `upto` is durable, flushing the log device
    /// when nobody else is.
    fn wait_durable(&self, host: &dyn PolicyHost, upto: u64) -> Result<()> {
        let mut st = self.st.lock();
        loop {
            if let Some(why) = &st.failed {
                return Err(self.read_only(host, why));
            }
            if st.durable_seq >= upto {
                return Ok(());
            }
            let target = st.logged_prefix();
            if !st.flushing && target >= upto {
                st.flushing = true;
                drop(st);
                let res = self.member.dev.flush();
                self.flushes.fetch_add(1, Ordering::Relaxed);
                if let Err(e) = &res {
                    self.fail(host, &format!("log flush failed: {e}"));
                }
                st = self.st.lock();
                st.flushing = false;
                if res.is_ok() {
                    st.durable_seq = st.durable_seq.max(target);
                }
                self.cv.notify_all();
                continue;
            }
            self.cv.wait(&mut st);
        }
    }

    pub fn write_back(&self) -> bool {
        self.write_back.load(Ordering::Acquire)
    }

    pub fn set_write_back(&self, on: bool) {
        self.write_back.store(on, Ordering::Release);
    }

    /// Does the write-back cache hold pages of this row, or is a write-out of them still
    /// under way? Either way the members may not hold the row's newest bytes yet: a read takes
    /// the row's claim. (Lock-free when the cache holds nothing.)
    pub fn is_cached(&self, row: u64) -> bool {
        self.cached_rows.load(Ordering::Acquire) > 0 && {
            let c = self.cache.lock();
            c.rows.contains_key(&row) || c.writing.contains(&row)
        }
    }

    /// Copy the cached bytes of data chunk `d` of `row` over `buf`, which holds its bytes from
    /// `off` (in the chunk) on.
    pub fn overlay(&self, row: u64, d: usize, off: u64, buf: &mut [u8]) {
        if let Some(r) = self.cache.lock().rows.get(&row) {
            r.overlay(d, off, buf);
        }
    }

    /// The member writes of these units completed (their ticket from [`Journal::log`] ends).
    pub fn written_home(&self, seqs: Range<u64>) {
        let mut st = self.st.lock();
        for seq in seqs {
            st.unit(seq).home = true;
        }
        drop(st);
        self.end_ticket();
    }

    /// A ticket: work that relies on the log (member writes of logged units, pages going into
    /// the cache) may go on. Taken under the lock the failure is set under, so a settling of a
    /// failed log either waits for it or this sees the failure.
    fn take_ticket(&self, host: &dyn PolicyHost) -> Result<()> {
        let mut st = self.st.lock();
        if let Some(why) = &st.failed {
            return Err(self.read_only(host, why));
        }
        st.tickets += 1;
        Ok(())
    }

    fn end_ticket(&self) {
        let mut st = self.st.lock();
        assert!(st.tickets > 0, "a ticket ended twice");
        st.tickets -= 1;
        self.cv.notify_all();
    }

    /// Wait until no member writes past the log are running.
    pub(crate) fn wait_tickets(&self) {
        let mut st = self.st.lock();
        while st.tickets > 0 {
            self.cv.wait(&mut st);
        }
    }

    pub(crate) fn settling(&self) -> parking_lot::MutexGuard<'_, ()> {
        self.settling.lock()
    }

    pub(crate) fn settled(&self) -> bool {
        self.st.lock().settled
    }

    pub(crate) fn mark_settled(&self) {
        let mut st = self.st.lock();
        assert!(st.failed.is_some(), "only a failed log settles");
        st.settled = true;
    }

    /// Would a reclaim free at least `sectors` now? (Stops counting there: the ring may hold
    /// tens of thousands of units home.)
    fn reclaimable_at_least(&self, sectors: u64) -> bool {
        let st = self.st.lock();
        let keep = st.units.len().saturating_sub(1);
        let mut free = 0;
        st.failed.is_none()
            && st.units.iter().take(keep).take_while(|u| u.home).any(|u| {
                free += u.sectors;
                free >= sectors
            })
    }

    /// Sectors a reclaim would free now (units home from the tail on, the newest kept).
    fn reclaimable(&self) -> u64 {
        let st = self.st.lock();
        if st.failed.is_some() {
            return 0;
        }
        let keep = st.units.len().saturating_sub(1);
        st.units
            .iter()
            .take(keep)
            .take_while(|u| u.home)
            .map(|u| u.sectors)
            .sum()
    }

    /// Move the tail past every unit that is home: flush the members (what those units wrote
    /// is durable there first), then record the new tail in the log device's superblock.
    /// Returns whether the tail moved.
    pub fn reclaim_now(&self, host: &dyn PolicyHost) -> bool {
        let one = self.reclaim.lock();
        self.reclaim_held(host, one)
    }

    /// A writer short of room: reclaim, or, when a reclaim is under way, wait for it and say
    /// it may have freed room (true). Writers that queued for the lock each ran a reclaim of
    /// their own, a member flush and a superblock write apiece, mostly freeing what the one
    /// before had just freed: with 32 writers waiting for room that queue was where their
    /// time went.
    fn reclaim_or_join(&self, host: &dyn PolicyHost) -> bool {
        match self.reclaim.try_lock() {
            Some(one) => self.reclaim_held(host, one),
            None => {
                drop(self.reclaim.lock());
                true
            }
        }
    }

    /// [`Journal::reclaim_now`], its lock taken.
    fn reclaim_held(&self, host: &dyn PolicyHost, _one: parking_lot::MutexGuard<'_, ()>) -> bool {
        let (pop, new_tail) = {
            let st = self.st.lock();
            if st.failed.is_some() {
                return false;
            }
            let home = st.units.iter().take_while(|u| u.home).count();
            // The tail stays on a real meta block: the first unit not home, or the last one.
            let pop = home.min(st.units.len().saturating_sub(1));
            if pop == 0 {
                return false;
            }
            (pop, st.units[pop].start)
        };
        host.flush_members();
        if let Err(e) = self.record_tail(host, new_tail) {
            self.fail(host, &format!("cannot record the journal tail: {e}"));
            return false;
        }
        let mut st = self.st.lock();
        for _ in 0..pop {
            st.units.pop_front();
        }
        debug_assert_eq!(st.tail(), new_tail);
        self.reclaims.fetch_add(1, Ordering::Relaxed);
        self.cv.notify_all();
        true
    }

    /// Write `journal_tail` into the log device's superblock, durably.
    fn record_tail(&self, host: &dyn PolicyHost, tail: u64) -> std::io::Result<()> {
        let mut meta = host.members().meta.lock();
        let Some(m) = meta
            .members
            .iter_mut()
            .find(|m| Arc::ptr_eq(&m.member, &self.member))
        else {
            return Err(std::io::Error::other("journal device left the array"));
        };
        m.sb.recovery_offset = tail;
        // The superblock write is FUA; the units it lets go are durable on the members already.
        let block = superblock_block(&m.sb);
        host.members()
            .write_metadata(&m.member, Metadata::Superblock, &block, true)
    }

    /// The log device failed: no new writes from now on. Nothing is recorded yet: until
    /// [`Journal::settle`] has written out what the log covered, the log stays the
    /// array's journal on disk, so a crash meanwhile replays it at the next start.
    pub fn fail(&self, host: &dyn PolicyHost, why: &str) {
        {
            let mut st = self.st.lock();
            if st.failed.is_some() {
                return;
            }
            st.failed = Some(format!("journal {} failed: {why}", self.member.name()));
            self.cv.notify_all();
        }
        self.failing(host, why);
    }

    fn read_only(&self, host: &dyn PolicyHost, why: &str) -> EngineError {
        EngineError::ReadOnly {
            array: host.name().to_string(),
            reason: why.to_string(),
        }
    }

    pub fn status(&self) -> JournalStatus {
        let st = self.st.lock();
        JournalStatus {
            device: self.member.name().to_string(),
            mode: if self.write_back() {
                "write-back"
            } else {
                "write-through"
            },
            cache_bytes: self.cache_bytes() as u64,
            log_bytes: self.log * 512,
            used_bytes: st.used(self.log) * 512,
            tail_sector: st.tail(),
            next_seq: st.next_seq,
            logged_bytes: self.logged_bytes.load(Ordering::Relaxed),
            flushes: self.flushes.load(Ordering::Relaxed),
            reclaims: self.reclaims.load(Ordering::Relaxed),
            failed: st.failed.clone(),
            state: match (&st.failed, st.settled) {
                (None, _) => "active",
                (Some(_), false) => "failing",
                (Some(_), true) => "failed",
            },
            replayed: self.replayed.lock().clone(),
        }
    }
}

/// Recovery at assembly (reference §6.5), first half: read the consistent chain from
/// `journal_tail` and plan what it writes home. Nothing is written here: the array, once built,
/// writes the chain home through its commit point and then starts the new chain
/// ([`PendingReplay::write_home`]); until then the journal holds an empty chain after the old
/// one, and the tail stays where `sb` (the log device's superblock) says. With `read_only`,
/// there is nothing to write home: the chain is measured, and the start is refused if the
/// members lack any of it.
pub(crate) fn recover(
    member: Arc<Member>,
    sb: &Superblock,
    geometry: &Geometry,
    slots: &[Slot],
    read_only: bool,
    integrity: Option<&crate::integrity::Integrity>,
    clock: &dyn Clock,
) -> Result<(Journal, Option<PendingReplay>)> {
    let started = clock.now();
    let seed = journal_seed(&sb.set_uuid);
    let log = log_sectors(sb);
    let fail = |reason: String| EngineError::Assemble {
        member: member.name().into(),
        reason,
    };
    if log < required_log_sectors(geometry) {
        return Err(fail(format!(
            "journal of {} bytes is too small for this array (needs {})",
            log * 512,
            required_log_sectors(geometry) * 512
        )));
    }
    let scan = Scan::run(&member, seed, log, sb.recovery_offset);
    let mut replayed = Replayed {
        units: scan.units.len() as u64,
        torn_units: scan.torn,
        ..Replayed::default()
    };
    let (next_start, next_seq) = next_chain_start(&scan, log, &member, clock);
    let plan = plan_replay(&scan, geometry);
    let pending = if read_only {
        // Nothing may be written, and nothing older than the log holds may be served: a start
        // that would need the replay is refused (md replays before it serves).
        refuse_read_only_replay(&plan, geometry, slots, integrity).map_err(fail)?;
        None
    } else {
        replayed.pages = plan.pages;
        replayed.data_only_pages = plan.data_only.len() as u64;
        Some(PendingReplay {
            member: member.clone(),
            sb: sb.clone(),
            log,
            seed,
            runs: plan
                .runs
                .into_iter()
                .map(|(role, at, bytes)| (role, at, AlignedBuf::copy_from(&bytes)))
                .collect(),
            data_only: plan.data_only,
            chain: NewChain::after(next_start, next_seq),
            started,
        })
    };
    replayed.millis = clock.now().saturating_sub(started).as_millis() as u64;
    let st = LogState::of_chain(NewChain::after(next_start, next_seq), log, None, 0);
    let journal = Journal {
        member,
        log,
        seed,
        st: Mutex::new(st),
        cv: Condvar::new(),
        reclaim: Mutex::new(()),
        settling: Mutex::new(()),
        logged_bytes: AtomicU64::new(0),
        flushes: AtomicU64::new(0),
        reclaims: AtomicU64::new(0),
        replayed: Mutex::new(replayed),
        write_back: std::sync::atomic::AtomicBool::new(false),
        paused: std::sync::atomic::AtomicBool::new(false),
        cache: Mutex::new(WbCache::default()),
        cached_rows: std::sync::atomic::AtomicUsize::new(0),
        unlogged_recorded: std::sync::atomic::AtomicBool::new(false),
    };
    Ok((journal, pending))
}

/// Recovery's second half: what the chain writes home, and the new chain that starts once
/// that is durable.
pub(crate) struct PendingReplay {
    member: Arc<Member>,
    /// The log device's superblock as assembly found it.
    sb: Superblock,
    log: u64,
    seed: u32,
    /// Runs of consecutive pages per member: role, per-member byte offset, bytes.
    runs: Vec<(usize, u64, AlignedBuf)>,
    data_only: DataOnly,
    chain: NewChain,
    /// When recovery began, on the array's clock.
    started: Duration,
}

impl PendingReplay {
    /// Did the log hold data without parity (write-back)? Only a journal can keep it.
    pub fn holds_data_only(&self) -> bool {
        !self.data_only.is_empty()
    }

    /// Write the chain home through `host`'s commit point, before it serves anything: the
    /// pages go out as one `Replay` write set (which the journal does not log again; member
    /// failures take the usual path), then the members are flushed with the integrity records
    /// of what was written. Only then does the new chain start (the data without parity logged
    /// again, kept in the journal's cache) and the tail move to it. A log that is the array's
    /// journal no more (dropped) only gets its new chain and tail. A log that cannot be
    /// written comes back failed (see `Journal::settle`). `journal`: the array's journal.
    pub(crate) fn write_home(
        self,
        host: &dyn PolicyHost,
        journal: Option<&Arc<Journal>>,
    ) -> Result<()> {
        let PendingReplay {
            member,
            mut sb,
            log,
            seed,
            runs,
            data_only,
            mut chain,
            started,
        } = self;
        write_runs_home(host, &runs).map_err(|e| EngineError::Assemble {
            member: member.name().into(),
            reason: e.to_string(),
        })?;
        drop(runs);
        let clock = host.clock();
        let journal = journal.filter(|j| Arc::ptr_eq(j.member(), &member));
        let mut rows = cached_rows_of(host.geometry(), data_only, clock.now());
        let started_chain = chain
            .start(&member, log, seed, host.geometry(), &mut rows)
            .and_then(|()| {
                let tail = chain.next_start;
                match journal {
                    Some(j) => j.record_tail(host, tail),
                    None => {
                        sb.recovery_offset = tail;
                        let block = superblock_block(&sb);
                        host.members()
                            .write_metadata(&member, Metadata::Superblock, &block, true)
                    }
                }
                .map_err(|e| format!("cannot record the journal tail: {e}"))
            });
        let failed = started_chain.err().map(|why| {
            // What the log held is on the members (and its data without parity in memory):
            // the log is failed, and the array writes that data out and records the log
            // faulty before it serves anything (see `Journal::settle`).
            tracing::error!(journal = %member.name(), "the log was replayed but cannot be written: {why}");
            format!("journal {} failed at assembly: {why}", member.name())
        });
        let Some(j) = journal else { return Ok(()) };
        let (cache, flush_reserve) = write_back_cache(rows, host.geometry());
        j.cached_rows.store(cache.rows.len(), Ordering::Release);
        *j.cache.lock() = cache;
        *j.st.lock() = LogState::of_chain(chain, log, failed, flush_reserve);
        j.replayed.lock().millis = clock.now().saturating_sub(started).as_millis() as u64;
        Ok(())
    }
}

/// The member writes of a replay, as one write set through the commit point; durable on the
/// members, with the integrity records they set, on return. Every page is planned against the
/// member filling its role, rebuilding or not (a missing member's records are set all the
/// same: the rebuild gives it these bytes).
fn write_runs_home(host: &dyn PolicyHost, runs: &[(usize, u64, AlignedBuf)]) -> Result<()> {
    let (Some(first), Some(end)) = (
        runs.iter().map(|r| r.1).min(),
        runs.iter().map(|r| r.1 + r.2.len() as u64).max(),
    ) else {
        return Ok(());
    };
    let mut ios: Vec<MemberIo<'_>> = runs
        .iter()
        .map(|(role, at, bytes)| {
            let member = host.members().slot(*role).usable();
            MemberIo::planned(*role, member, *at, IoKind::Write(bytes, false))
        })
        .collect();
    host.commit_writes(&WriteSet::replay(first, end - first), &mut ios)?;
    drop(ios);
    // The tail leaves the log only once what it wrote home, and the records of it, are
    // durable on every member written (a member that cannot flush is failed instead).
    host.flush_members();
    if host.members().is_failed() {
        return Err(host
            .members()
            .unrecoverable(first, end - first, "too many members failed"));
    }
    Ok(())
}

/// Where the new chain starts and its first sequence number: after the last unit found, or
/// anywhere with a fresh sequence number when the log holds none.
fn next_chain_start(scan: &Scan, log: u64, member: &Member, clock: &dyn Clock) -> (u64, u64) {
    match scan.units.last() {
        Some(u) => (
            (u.meta.position + u.meta.unit_sectors()) % log,
            u.meta.seq + RECOVERY_SEQ_JUMP,
        ),
        None => {
            tracing::warn!(journal = %member.name(), "no valid meta block at the journal tail: the log starts empty");
            (0, new_log_seq(clock))
        }
    }
}

/// A read-only start may write nothing, and may serve nothing older than the log holds: it is
/// refused when the members lack pages the replay would write (md replays before it serves).
fn refuse_read_only_replay(
    plan: &ReplayPlan,
    geometry: &Geometry,
    slots: &[Slot],
    integrity: Option<&crate::integrity::Integrity>,
) -> std::result::Result<(), String> {
    let lacking = lacking_pages(plan, geometry, slots, integrity).map_err(|e| e.to_string())?;
    if lacking > 0 {
        return Err(format!(
            "its journal holds {lacking} pages of acknowledged writes that the members do \
             not hold yet, and a read-only start cannot replay them (it would serve the \
             older data): start the array once without --read-only (the log is replayed \
             onto the members), stop it, then start it read-only"
        ));
    }
    Ok(())
}

/// The write-back cache of the rows recovery found without parity, and the log space their
/// write-outs need.
fn write_back_cache(rows: BTreeMap<u64, CachedRow>, geometry: &Geometry) -> (WbCache, u64) {
    let mut cache = WbCache::default();
    let mut flush_reserve = 0;
    let mut rows = rows;
    for r in rows.values_mut() {
        r.need = write_out_need(r.columns(), geometry);
        flush_reserve += r.need;
        cache.bytes += r.pages.len() * PAGE;
    }
    cache.by_age = rows.iter().map(|(&row, r)| (r.oldest_seq(), row)).collect();
    cache.rows = rows;
    (cache, flush_reserve)
}

/// The data pages recovery found without parity, as cached rows (not logged yet).
fn cached_rows_of(
    geometry: &Geometry,
    data_only: DataOnly,
    now: Duration,
) -> BTreeMap<u64, CachedRow> {
    let mut rows: BTreeMap<u64, CachedRow> = BTreeMap::new();
    for (byte, page) in data_only {
        let pos = geometry.locate(byte / 512);
        rows.entry(pos.stripe)
            .or_insert_with(|| CachedRow {
                pages: BTreeMap::new(),
                seqs: Vec::new(),
                need: 0,
                since: now,
                recovered: true,
            })
            .pages
            .insert((pos.offset_sectors * 512, pos.data_index), page);
    }
    rows
}

/// The chain recovery starts after the old one.
struct NewChain {
    units: VecDeque<Unit>,
    head: u64,
    next_seq: u64,
    next_start: u64,
}

impl NewChain {
    /// The chain that follows the old one: it starts at `next_start` with `next_seq`.
    fn after(next_start: u64, next_seq: u64) -> NewChain {
        NewChain {
            units: VecDeque::new(),
            head: next_start,
            next_seq,
            next_start,
        }
    }

    /// The new chain's units and head. A chain `start` did not write (read-only, or a failed
    /// log) still begins with its empty meta block.
    fn into_units(self, log: u64) -> (VecDeque<Unit>, u64) {
        let NewChain {
            mut units,
            mut head,
            next_seq,
            next_start,
        } = self;
        if units.is_empty() {
            units.push_back(Unit {
                seq: next_seq,
                start: next_start,
                sectors: PAGE_SECTORS_U64,
                logged: true,
                home: true,
            });
            head = (next_start + PAGE_SECTORS_U64) % log;
        }
        (units, head)
    }
}

impl NewChain {
    /// Start the new chain with the data that had no parity yet (write-back), logged again as
    /// it was and kept in the cache (md re-logs it the same way): only once that is durable
    /// may the tail leave the old chain (the caller moves it to `next_start`). The write-back
    /// reserve kept room for it.
    fn start(
        &mut self,
        member: &Member,
        log: u64,
        seed: u32,
        geometry: &Geometry,
        rows: &mut BTreeMap<u64, CachedRow>,
    ) -> std::result::Result<(), String> {
        let mut seq = self.next_seq;
        for (&row, r) in rows.iter_mut() {
            for (meta, pages) in data_units(geometry, seed, row, &r.pages) {
                let meta = MetaBlock {
                    seq,
                    position: self.head,
                    ..meta
                };
                let block = meta.encode(seed);
                let pieces: Vec<&[u8]> = std::iter::once(&block[..]).chain(pages).collect();
                write_ring_at(member, log, self.head, &pieces)
                    .map_err(|e| format!("cannot log write-back data again: {e}"))?;
                self.units.push_back(Unit {
                    seq,
                    start: self.head,
                    sectors: meta.unit_sectors(),
                    logged: true,
                    home: false,
                });
                r.seqs.push(seq);
                self.head = (self.head + meta.unit_sectors()) % log;
                seq += 1;
            }
        }
        if self.units.is_empty() {
            let block = MetaBlock::empty(self.next_seq, self.next_start).encode(seed);
            write_ring_at(
                member,
                log,
                self.next_start,
                &[&AlignedBuf::copy_from(&block)[..]],
            )
            .map_err(|e| format!("cannot start the new log: {e}"))?;
        }
        member
            .dev
            .flush()
            .map_err(|e| format!("cannot start the new log: {e}"))
    }
}

/// Write the concatenation of `pieces` at ring sector `start` of a log of `log` sectors,
/// wrapping at its end.
fn write_ring_at(member: &Member, log: u64, start: u64, pieces: &[&[u8]]) -> std::io::Result<()> {
    let base = member.data_offset_bytes;
    let mut room = ((log - start) * 512) as usize;
    let total: usize = pieces.iter().map(|p| p.len()).sum();
    if total <= room {
        return member
            .dev
            .write_vectored_at(pieces, base + start * 512, false);
    }
    let (mut head, mut tail) = (Vec::new(), Vec::new());
    for &p in pieces {
        let n = p.len().min(room);
        if n > 0 {
            head.push(&p[..n]);
        }
        if n < p.len() {
            tail.push(&p[n..]);
        }
        room -= n;
    }
    member
        .dev
        .write_vectored_at(&head, base + start * 512, false)?;
    member.dev.write_vectored_at(&tail, base, false)
}

/// Sectors writing out `columns` cached page columns may need in the ring: logging their data
/// again at recovery (a page per data chunk) and their parity at write-out, each with
/// (conservatively) a meta block per column.
fn write_out_need(columns: u64, geometry: &Geometry) -> u64 {
    let parity = geometry.max_degraded() as u64;
    columns * (geometry.data_disks() as u64 + parity + 2) * PAGE_SECTORS_U64
}

/// Data-only io units (sequence and position filled in by the caller) for cached pages of
/// one row: one DATA payload per page.
fn data_units<'a>(
    geometry: &Geometry,
    seed: u32,
    row: u64,
    pages: &'a BTreeMap<(u64, usize), AlignedBuf>,
) -> Vec<(MetaBlock, Vec<&'a [u8]>)> {
    let chunk = geometry.chunk_sectors() * 512;
    let mut units = UnitsBuilder::default();
    for (&(off, d), page) in pages {
        let payload = Payload::Data {
            location: ((row * geometry.data_disks() as u64 + d as u64) * chunk + off) / 512,
            checksums: PageChecksums::from_slice(&[format::crc32c_raw(seed, page)]),
        };
        units.add(vec![payload].into_iter(), [&page[..]]);
    }
    units.units
}

/// Io units being filled in order: a new meta block when the next payloads do not fit.
#[derive(Default)]
struct UnitsBuilder<'a> {
    units: Vec<(MetaBlock, Vec<&'a [u8]>)>,
    /// Meta block bytes the last unit uses (kept here: summing its descriptors at every
    /// addition would make building a unit quadratic).
    used: usize,
}

impl<'a> UnitsBuilder<'a> {
    /// Payloads that must share one unit, with their pages.
    fn add(
        &mut self,
        payloads: impl Iterator<Item = Payload> + AsRef<[Payload]>,
        pages: impl IntoIterator<Item = &'a [u8]>,
    ) {
        let need: usize = payloads.as_ref().iter().map(Payload::encoded_len).sum();
        if self.units.is_empty() || self.used + need > JOURNAL_BLOCK {
            self.units.push((MetaBlock::empty(0, 0), Vec::new()));
            self.used = MetaBlock::empty(0, 0).meta_size();
        }
        assert!(
            self.used + need <= JOURNAL_BLOCK,
            "payloads that share a unit must fit one meta block"
        );
        self.used += need;
        let (m, p) = self.units.last_mut().expect("a unit");
        m.payloads.extend(payloads);
        p.extend(pages);
        debug_assert_eq!(m.meta_size(), self.used);
    }
}

/// One io unit found whole in the log.
struct FoundUnit {
    meta: MetaBlock,
    /// Its pages, in descriptor order; None when one failed its checksum (skipped).
    pages: Option<Vec<AlignedBuf>>,
}

/// The consistent chain from the tail: consecutive sequence numbers, each meta block at the
/// position it names.
struct Scan {
    units: Vec<FoundUnit>,
    torn: u64,
}

impl Scan {
    fn run(member: &Member, seed: u32, log: u64, tail: u64) -> Scan {
        let mut scan = Scan {
            units: Vec::new(),
            torn: 0,
        };
        if tail >= log || !tail.is_multiple_of(PAGE_SECTORS_U64) {
            return scan;
        }
        let read = |pos: u64, buf: &mut [u8]| -> bool {
            // Reads may wrap at the end of the ring.
            let base = member.data_offset_bytes;
            let room = ((log - pos) * 512) as usize;
            if buf.len() <= room {
                member.dev.read_at(buf, base + pos * 512).is_ok()
            } else {
                let (a, b) = buf.split_at_mut(room);
                member.dev.read_at(a, base + pos * 512).is_ok()
                    && member.dev.read_at(b, base).is_ok()
            }
        };
        let mut pos = tail;
        let mut expect: Option<u64> = None;
        let mut scanned = 0u64;
        loop {
            let mut block = AlignedBuf::zeroed(PAGE);
            if !read(pos, &mut block) {
                break;
            }
            let Ok(meta) = MetaBlock::decode(&block, seed, pos) else {
                break;
            };
            if expect.is_some_and(|s| s != meta.seq) {
                break;
            }
            let sectors = meta.unit_sectors();
            if scanned + sectors > log {
                break;
            }
            let mut pages = Vec::with_capacity(meta.pages());
            let mut whole = true;
            let mut at = (pos + PAGE_SECTORS_U64) % log;
            for payload in &meta.payloads {
                let sums: &[u32] = match payload {
                    Payload::Data { checksums, .. } | Payload::Parity { checksums, .. } => {
                        checksums
                    }
                    Payload::Flush { .. } => &[],
                };
                for &sum in sums {
                    let mut page = AlignedBuf::zeroed(PAGE);
                    whole &= read(at, &mut page) && format::crc32c_raw(seed, &page) == sum;
                    pages.push(page);
                    at = (at + PAGE_SECTORS_U64) % log;
                }
            }
            if !whole {
                // md: a unit whose pages did not all reach the log is skipped, and the scan
                // goes on (units may complete out of order).
                scan.torn += 1;
            }
            expect = Some(meta.seq + 1);
            scanned += sectors;
            pos = (pos + sectors) % log;
            scan.units.push(FoundUnit {
                meta,
                pages: whole.then_some(pages),
            });
        }
        scan
    }
}

/// A member write recovery makes: role, per-member byte offset, page.
type HomeWrite<'a> = (usize, u64, &'a [u8]);

/// What replaying a chain writes: runs of consecutive pages per member (role, per-member byte
/// offset, bytes; later units win), the number of pages logged with parity, and the data
/// pages that had none (array byte offset, page).
struct ReplayPlan {
    runs: Vec<(usize, u64, Vec<u8>)>,
    pages: u64,
    data_only: DataOnly,
}

/// Pages a replay of the chain would write that the members do not hold (a read-only start
/// must not serve without them). A page of a missing member is not counted when the stripe's
/// other pages are there: reads rebuild it from them. Data without parity counts unless its
/// member holds it already. With integrity, a page whose record does not match it counts too
/// (replay would set the record; a read-only start writes no table).
fn lacking_pages(
    plan: &ReplayPlan,
    geometry: &Geometry,
    slots: &[Slot],
    integrity: Option<&crate::integrity::Integrity>,
) -> std::io::Result<u64> {
    let mut lacking = 0u64;
    let differs = |role: usize, offset: u64, bytes: &[u8]| -> std::io::Result<u64> {
        let Some(m) = slots[role].usable() else {
            return Ok(0);
        };
        let mut held = AlignedBuf::zeroed(bytes.len());
        m.dev.read_at(&mut held, m.data_offset_bytes + offset)?;
        Ok(held
            .chunks(PAGE)
            .zip(bytes.chunks(PAGE))
            .filter(|(a, b)| a != b)
            .count() as u64)
    };
    for (role, offset, bytes) in &plan.runs {
        let unrecorded = integrity.map_or(0, |i| {
            (0..bytes.len())
                .step_by(PAGE)
                .filter(|&at| !i.verify(*role, offset + at as u64, &bytes[at..at + PAGE]))
                .count() as u64
        });
        lacking += differs(*role, *offset, bytes)?.max(unrecorded);
    }
    let chunk_sectors = geometry.chunk_sectors();
    for (byte, page) in &plan.data_only {
        let pos = geometry.locate(byte / 512);
        let role = geometry.stripe_roles(pos.stripe).data_dev(pos.data_index);
        let offset = (pos.stripe * chunk_sectors + pos.offset_sectors) * 512;
        lacking += match slots[role].usable() {
            Some(_) => differs(role, offset, page)?,
            None => 1,
        };
    }
    Ok(lacking)
}

/// The member writes a replay of the chain makes, in log order (see [`ReplayPlan`]).
fn plan_replay(scan: &Scan, geometry: &Geometry) -> ReplayPlan {
    let chunk_sectors = geometry.chunk_sectors();
    // Data pages waiting for their stripe's parity, by per-member sector of the column.
    let mut pending: BTreeMap<u64, Vec<(u64, &[u8])>> = BTreeMap::new();
    let mut writes: Vec<HomeWrite<'_>> = Vec::new();
    for unit in &scan.units {
        let Some(pages) = &unit.pages else { continue };
        let mut next = pages.iter();
        for payload in &unit.meta.payloads {
            match payload {
                Payload::Data {
                    location,
                    checksums,
                } => {
                    for i in 0..checksums.len() as u64 {
                        let sector = location + i * PAGE_SECTORS_U64;
                        let pos = geometry.locate(sector);
                        let column = pos.stripe * chunk_sectors + pos.offset_sectors;
                        let page = next.next().expect("page counted");
                        pending.entry(column).or_default().push((sector, &page[..]));
                    }
                }
                Payload::Parity {
                    location,
                    checksums,
                } => {
                    let row = location / chunk_sectors;
                    let roles = geometry.stripe_roles(row);
                    for (sector, page) in pending.remove(location).unwrap_or_default() {
                        let pos = geometry.locate(sector);
                        writes.push((roles.data_dev(pos.data_index), location * 512, page));
                    }
                    let p = next.next().expect("P page counted");
                    writes.push((roles.p_dev(), location * 512, &p[..]));
                    if checksums.len() > 1 {
                        let q = next.next().expect("Q page counted");
                        if let Some(qd) = roles.q_dev() {
                            writes.push((qd, location * 512, &q[..]));
                        }
                    }
                }
                Payload::Flush { stripes } => {
                    for s in stripes {
                        pending.remove(s);
                    }
                }
            }
        }
    }
    // A column whose every data page waits without parity (a whole stripe, logged data-only)
    // is written home with the parity its newest pages give, after everything logged before.
    let computed = complete_columns_parity(&mut pending, geometry);
    for (column, pages, p, q) in &computed {
        let roles = geometry.stripe_roles(column / chunk_sectors);
        for (d, page) in pages.iter().enumerate() {
            writes.push((roles.data_dev(d), column * 512, page));
        }
        writes.push((roles.p_dev(), column * 512, p));
        if let (Some(qd), Some(q)) = (roles.q_dev(), q) {
            writes.push((qd, column * 512, q));
        }
    }
    let pages = writes.len() as u64;
    let runs = runs_of(writes);
    let data_only = pending
        .into_values()
        .flatten()
        .map(|(sector, page)| (sector * 512, AlignedBuf::copy_from(page)))
        .collect();
    ReplayPlan {
        runs,
        pages,
        data_only,
    }
}

/// Later writes win over earlier ones at the same place; what is left, in runs of consecutive
/// pages per member.
fn runs_of(writes: Vec<HomeWrite<'_>>) -> Vec<(usize, u64, Vec<u8>)> {
    let mut last: BTreeMap<(usize, u64), &[u8]> = BTreeMap::new();
    for (role, offset, page) in writes {
        last.insert((role, offset), page);
    }
    let mut runs: Vec<(usize, u64, Vec<u8>)> = Vec::new();
    for ((role, offset), page) in last {
        match runs.last_mut() {
            Some((r, o, buf)) if *r == role && *o + buf.len() as u64 == offset => {
                buf.extend_from_slice(page)
            }
            _ => runs.push((role, offset, page.to_vec())),
        }
    }
    runs
}

/// A column's newest data pages (by data index) and the P and Q they give.
type ColumnParity<'a> = (u64, Vec<&'a [u8]>, AlignedBuf, Option<AlignedBuf>);

/// Take out of `pending` the columns that hold a page for every data index, with the parity
/// of each one's newest pages (the pages of a column come in log order).
fn complete_columns_parity<'a>(
    pending: &mut BTreeMap<u64, Vec<(u64, &'a [u8])>>,
    geometry: &Geometry,
) -> Vec<ColumnParity<'a>> {
    let m = geometry.data_disks();
    let chunk_sectors = geometry.chunk_sectors();
    let mut done = Vec::new();
    pending.retain(|&column, logged| {
        let mut newest: Vec<Option<&[u8]>> = vec![None; m];
        for &(sector, page) in logged.iter() {
            newest[geometry.locate(sector).data_index] = Some(page);
        }
        let Some(pages) = newest.into_iter().collect::<Option<Vec<&[u8]>>>() else {
            return true;
        };
        let roles = geometry.stripe_roles(column / chunk_sectors);
        let mut p = AlignedBuf::zeroed(PAGE);
        let mut q = roles.q_dev().map(|_| AlignedBuf::zeroed(PAGE));
        crate::stripe_parity::fill(&roles, &pages, &mut p, q.as_deref_mut());
        done.push((column, pages, p, q));
        false
    });
    done
}

/// The reclaim thread reclaims when a quarter of the ring could be freed (md's threshold, so
/// writers rarely wait for room), or when something has waited this long: recovery replays
/// what is between the tail and the head, so an idle array keeps that short.
const RECLAIM_AGE: std::time::Duration = std::time::Duration::from_secs(5);
/// A writer waiting for room reclaims once this share of the ring (1/n) is home, unless no
/// cached row is left to write out first (see `Journal::reserve`).
const RECLAIM_SHARE: u64 = 16;
/// How long write-back data may wait in the cache for its row to fill.
const WRITE_OUT_AGE: std::time::Duration = std::time::Duration::from_secs(1);
