//! Per-block CRC32C records kept apart from the data (`format::Zone`, design study layout b2).
//!
//! Every 4 KiB block of every role (data, P and Q alike) has a record: the raid5-cache page
//! checksum of what was last written there. The records of role X live in tables on X+1 and
//! X+2 (RAID6 also X+3), never on X, so a write X lost or sent elsewhere contradicts a record
//! that another device kept.
//!
//! In memory the records live in table-block pages ([`crate::integrity::record_cache`]), within a budget:
//! all of them, loaded at assembly, when they fit; otherwise each page is read from the newest
//! valid copy of its table block when first needed. They change in two places only:
//! * a member write ([`Integrity::begin_write`] before it goes out, [`Integrity::end_write`]
//!   after), whatever the write is for (client data, parity, rebuild, repair, resync);
//!   while it is in flight a read of the block may return the old or the new contents, and
//!   both verify;
//! * a write a missing member did not get ([`Integrity::set_block`]): its record follows what
//!   the role should hold, so that reconstruction of it can be verified.
//!
//! Tables go to disk at every member flush ([`Integrity::write_tables`], called by
//! `Parts::flush_members` before the flush): the records of everything a flush makes durable
//! are durable with it (design rule P6). Each write-out stamps a new epoch (larger than the
//! block's copies carry); at load the newer valid copy wins and the other is rewritten. Copies
//! go out one after the other, each flushed before the next, so a cut tears at most one of
//! them; a block with a valid copy on one member only (every block of a 2-way mirror, blocks
//! whose other holders are missing or rebuilding) is written with FUA, so a cut never leaves
//! it without a valid copy, which would lose the records of data flushed long before.
//!
//! Create writes no tables: it discards the members' data areas, the zone included, and a
//! table block all of whose copies read as zeroes was never written, so its records are the
//! zero block's (epoch 1, as if written at create). Creation costs nothing per byte of array.
//! A blank copy beside a valid one is a copy whose write was lost (counted bad, rewritten);
//! a blank copy beside a bad one is no evidence either way, and the records are rebuilt from
//! the data as for any block without a valid copy. Records rebuilt from a mirror member's
//! blocks go to its twins that are not complete too: their tables stand in for its own at the
//! next start, and must not contradict what this start served.

pub(crate) mod record_cache;

use crate::integrity::record_cache::{CacheStats, Page, RecordCache};
use crate::members::metadata::Metadata;
use crate::members::{Member, MemberSet, Slot};
use device::AlignedBuf;
use format::{FormatError, TableBlock, Zone, RECORDS_PER_TABLE, RECORD_BLOCK};
use parking_lot::Mutex;
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

const BLOCK: u64 = RECORD_BLOCK as u64;
const PER: u64 = RECORDS_PER_TABLE as u64;
/// Table blocks read or checked per member read at load and scrub.
const TABLE_RUN: u64 = 256;

/// Why a table block's copy is not a valid table.
#[derive(Debug)]
enum TableFault {
    /// All zeroes: never written (or zeroed behind the array's back).
    Blank,
    Bad(FormatError),
}

impl std::fmt::Display for TableFault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TableFault::Blank => f.write_str("blank (never written)"),
            TableFault::Bad(e) => e.fmt(f),
        }
    }
}

/// A member write in flight: its first block and the records of its blocks.
struct InFlight {
    first: u64,
    crcs: Vec<u32>,
}

/// What integrity found and did, for status, events and tests.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct IntegrityCounts {
    /// Data blocks that did not match their record.
    pub data_mismatches: u64,
    /// Parity (P) blocks that did not match their record.
    pub p_mismatches: u64,
    /// RAID6 Q blocks that did not match their record.
    pub q_mismatches: u64,
    /// Blocks rebuilt from redundancy and rewritten.
    pub repaired: u64,
    /// Rewritten blocks that still read back wrong.
    pub rewrite_failures: u64,
    /// Records found stale (the block agreed with the rest of its row): the record was fixed.
    pub records_fixed: u64,
    /// Blocks redundancy could not vouch for: the request failed (EIO), no data returned.
    pub unrecoverable: u64,
    /// Blocks a resync after an unclean stop settled as found (unflushed writes).
    pub resolved_after_crash: u64,
    /// Table block copies that were unreadable, corrupt or in the wrong place.
    pub table_copies_bad: u64,
    /// Table block copies older than their twin (a lost table write).
    pub table_copies_stale: u64,
    /// Table blocks with no valid copy, rebuilt from the member's contents.
    pub tables_rebuilt: u64,
    /// Table block copies written since assembly (4 KiB each): the records' write traffic.
    pub table_blocks_written: u64,
}

impl IntegrityCounts {
    /// What moved since `earlier` (counters only grow).
    pub fn since(&self, earlier: &IntegrityCounts) -> IntegrityCounts {
        IntegrityCounts {
            data_mismatches: self.data_mismatches - earlier.data_mismatches,
            p_mismatches: self.p_mismatches - earlier.p_mismatches,
            q_mismatches: self.q_mismatches - earlier.q_mismatches,
            repaired: self.repaired - earlier.repaired,
            rewrite_failures: self.rewrite_failures - earlier.rewrite_failures,
            records_fixed: self.records_fixed - earlier.records_fixed,
            unrecoverable: self.unrecoverable - earlier.unrecoverable,
            resolved_after_crash: self.resolved_after_crash - earlier.resolved_after_crash,
            table_copies_bad: self.table_copies_bad - earlier.table_copies_bad,
            table_copies_stale: self.table_copies_stale - earlier.table_copies_stale,
            tables_rebuilt: self.tables_rebuilt - earlier.tables_rebuilt,
            table_blocks_written: self.table_blocks_written - earlier.table_blocks_written,
        }
    }
}

/// Integrity state, for status.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IntegrityStatus {
    pub checksum: &'static str,
    pub copies: usize,
    /// Bytes of table per member (all copies it holds).
    pub table_bytes: u64,
    pub epoch: u64,
    pub counts: IntegrityCounts,
    pub cache: CacheStats,
}

#[derive(Default)]
struct Counters {
    data: AtomicU64,
    p: AtomicU64,
    q: AtomicU64,
    repaired: AtomicU64,
    rewrite_failures: AtomicU64,
    records_fixed: AtomicU64,
    unrecoverable: AtomicU64,
    resolved: AtomicU64,
    bad: AtomicU64,
    stale: AtomicU64,
    rebuilt: AtomicU64,
    written: AtomicU64,
}

/// Which kind of block a mismatch hit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum BlockKind {
    Data,
    P,
    Q,
}

pub(crate) struct Integrity {
    uuid: [u8; 16],
    seed: u32,
    zone: Zone,
    /// The records, by table block.
    cache: RecordCache,
    /// The array's roles: a page missing from the cache is read from them.
    slots: Arc<Vec<Slot>>,
    /// Writes in flight, per role: a read may see either contents. Consulted only when a
    /// block fails its record, so a write registers once, not per block.
    pending: Vec<Mutex<Vec<InFlight>>>,
    /// Table blocks (subject, index) changed since they were last written.
    dirty: Mutex<BTreeSet<(usize, u64)>>,
    /// One table write-out at a time, so epochs reach each copy in order.
    writing: Mutex<()>,
    epoch: AtomicU64,
    counts: Counters,
    /// Re-reads that failed after a rewrite, per role (repeated ones fail the member).
    strikes: Vec<AtomicU32>,
    zero_record: u32,
    /// Per role, the roles holding the same blocks at the same offsets (mirrors): a table with
    /// no valid copy of its own is taken from a twin's.
    twins: Vec<Vec<usize>>,
}

/// A rewrite of the same role that reads back wrong this many times fails the member.
pub(crate) const STRIKES_TO_FAIL: u32 = 3;

impl Integrity {
    /// Records of the array in `slots`, keeping at most `cache_bytes` of them in memory (a
    /// page of 1008 records per 4 KiB); `twins[role]`: see [`Integrity::twins`] (empty per role
    /// for parity levels).
    pub fn new(
        uuid: [u8; 16],
        zone: Zone,
        twins: Vec<Vec<usize>>,
        slots: Arc<Vec<Slot>>,
        cache_bytes: usize,
    ) -> Integrity {
        assert_eq!(twins.len(), zone.raid_disks, "twins per role");
        assert_eq!(slots.len(), zone.raid_disks, "a slot per role");
        let seed = format::record_seed(&uuid);
        let zero_record = format::record_of(seed, &[0u8; RECORD_BLOCK]);
        Integrity {
            uuid,
            seed,
            zone,
            cache: RecordCache::new(cache_bytes / RECORD_BLOCK),
            slots,
            pending: (0..zone.raid_disks).map(|_| Mutex::default()).collect(),
            dirty: Mutex::default(),
            writing: Mutex::new(()),
            epoch: AtomicU64::new(0),
            counts: Counters::default(),
            strikes: (0..zone.raid_disks).map(|_| AtomicU32::new(0)).collect(),
            zero_record,
            twins,
        }
    }

    pub fn record_of(&self, block: &[u8]) -> u32 {
        format::record_of(self.seed, block)
    }

    fn block_index(&self, offset_bytes: u64) -> u64 {
        assert_eq!(
            offset_bytes % BLOCK,
            0,
            "integrity works on whole 4 KiB blocks (offset {offset_bytes})"
        );
        offset_bytes / BLOCK
    }

    /// Does the 4 KiB `block` read from `role` at `offset_bytes` match what was written there
    /// (or what a write in flight is writing)? Blocks past md's `size` have no record.
    pub fn block_ok(&self, role: usize, offset_bytes: u64, block: &[u8]) -> bool {
        self.verify(role, offset_bytes, block)
    }

    /// Is `crc` what a write in flight is writing to `role`'s block `b`?
    fn in_flight(&self, role: usize, b: u64, crc: u32) -> bool {
        self.pending[role].lock().iter().any(|w| {
            b >= w.first
                && b - w.first < w.crcs.len() as u64
                && w.crcs[(b - w.first) as usize] == crc
        })
    }

    /// The record of `role`'s block at `offset_bytes` is about to be compared or set, after a
    /// member I/O: start loading it into the CPU's cache now, so that the I/O hides the miss.
    /// (Records of random blocks are rarely cached, and those misses were most of what
    /// integrity cost a 4 KiB write.)
    pub fn prefetch(&self, role: usize, offset_bytes: u64) {
        let b = offset_bytes / BLOCK;
        if b < self.zone.blocks {
            self.cache.prefetch((role, b / PER), (b % PER) as usize);
        }
    }

    /// The record of `role`'s block at `offset_bytes` (None past md's `size`).
    pub fn record(&self, role: usize, offset_bytes: u64) -> Option<u32> {
        let b = self.block_index(offset_bytes);
        (b < self.zone.blocks).then(|| self.page(role, b / PER, |p| p.recs[(b % PER) as usize]))
    }

    /// Run `f` on the records of table block `index` of `subject`, read from the members if
    /// they are not in memory.
    fn page<R>(&self, subject: usize, index: u64, f: impl FnOnce(&mut Page) -> R) -> R {
        self.cache
            .with((subject, index), || self.fetch(subject, index), f)
    }

    /// Set the records of `role`'s blocks `first..` (those below md's `size`) and queue their
    /// tables for the next write-out.
    fn store(&self, role: usize, first: u64, recs: &[u32]) {
        let end = (first + recs.len() as u64).min(self.zone.blocks);
        let mut b = first;
        while b < end {
            let index = b / PER;
            let stop = ((index + 1) * PER).min(end);
            let newly_queued = self.page(role, index, |p| {
                for x in b..stop {
                    p.recs[(x % PER) as usize] = recs[(x - first) as usize];
                }
                p.changed();
                !std::mem::replace(&mut p.queued, true)
            });
            // After the change: a write-out that takes the set sees it. A page already queued
            // is in the set, or in a write-out's that has not read it yet (it clears the flag
            // as it reads the page, this change included).
            if newly_queued {
                self.dirty.lock().insert((role, index));
            }
            b = stop;
        }
    }

    /// Every block of `buf` (read from `role` at `offset_bytes`) matches its record (or what
    /// a write in flight is writing there). Blocks past md's `size` have no record.
    pub fn verify(&self, role: usize, offset_bytes: u64, buf: &[u8]) -> bool {
        self.verify_keeping(role, offset_bytes, buf, None)
    }

    /// [`Integrity::verify`], also appending to `keep` the records of `buf`'s blocks as they
    /// were read (for a caller that folds the bytes into parity: the parity's records then
    /// need no pass over it). Stops at the first block that fails.
    pub fn verify_keeping(
        &self,
        role: usize,
        offset_bytes: u64,
        buf: &[u8],
        mut keep: Option<&mut Vec<u32>>,
    ) -> bool {
        assert_eq!(buf.len() as u64 % BLOCK, 0, "reads are whole 4 KiB blocks");
        let first = self.block_index(offset_bytes);
        let end = (first + buf.len() as u64 / BLOCK).min(self.zone.blocks);
        // Runs of at most 64 blocks within one table block: their records are computed on
        // the stack before the page's shard is locked, and compared under one lookup (this
        // runs for every member read; it allocates nothing).
        let mut crcs = [0u32; 64];
        let mut b = first;
        while b < end {
            let stop = ((b / PER + 1) * PER).min(end).min(b + 64);
            let n = (stop - b) as usize;
            let at = ((b - first) * BLOCK) as usize;
            for (crc, block) in crcs.iter_mut().zip(buf[at..].chunks(RECORD_BLOCK).take(n)) {
                *crc = self.record_of(block);
            }
            let wrong: u64 = self.page(role, b / PER, |p| {
                let recs = &p.recs[(b % PER) as usize..][..n];
                (0..n)
                    .filter(|&i| recs[i] != crcs[i])
                    .fold(0, |m, i| m | 1 << i)
            });
            if wrong != 0
                && !(0..n)
                    .filter(|&i| wrong & 1 << i != 0)
                    .all(|i| self.in_flight(role, b + i as u64, crcs[i]))
            {
                return false;
            }
            if let Some(keep) = keep.as_deref_mut() {
                keep.extend_from_slice(&crcs[..n]);
            }
            b = stop;
        }
        true
    }

    /// A member write of `buf` at `offset_bytes` is about to go out: its records (`known`, or
    /// computed from the bytes), which reads accept from now on beside the old ones.
    pub fn begin_write(
        &self,
        role: usize,
        offset_bytes: u64,
        buf: &[u8],
        known: Option<Vec<u32>>,
    ) -> Vec<u32> {
        assert_eq!(buf.len() as u64 % BLOCK, 0, "writes are whole 4 KiB blocks");
        let first = self.block_index(offset_bytes);
        let crcs: Vec<u32> = known.unwrap_or_else(|| self.records_of(buf));
        debug_assert!(
            crcs == self.records_of(buf),
            "records given for a write do not match its bytes"
        );
        self.accept_pending(role, first, &crcs);
        crcs
    }

    /// Reads of blocks `first..` of `role` accept these records too until the write ends.
    fn accept_pending(&self, role: usize, first: u64, crcs: &[u32]) {
        if first < self.zone.blocks {
            self.pending[role].lock().push(InFlight {
                first,
                crcs: crcs.to_vec(),
            });
        }
    }

    /// Per-block records of `buf`.
    pub fn records_of(&self, buf: &[u8]) -> Vec<u32> {
        buf.chunks(RECORD_BLOCK)
            .map(|b| self.record_of(b))
            .collect()
    }

    /// The records of the XOR of blocks with records `each` (CRC-32C is affine over XOR: the
    /// zero block's record enters once for an even count), so that parity needs no CRC pass.
    pub fn records_of_xor<R: AsRef<[u32]>>(&self, each: &[R]) -> Vec<u32> {
        let fold = if each.len().is_multiple_of(2) {
            self.zero_record
        } else {
            0
        };
        (0..each[0].as_ref().len())
            .map(|i| each.iter().fold(fold, |acc, r| acc ^ r.as_ref()[i]))
            .collect()
    }

    /// Records of a discard of `len` bytes: zero blocks.
    pub fn begin_zero(&self, role: usize, offset_bytes: u64, len: u64) -> Vec<u32> {
        assert_eq!(len % BLOCK, 0, "discards are whole 4 KiB blocks");
        let crcs = vec![self.zero_record; (len / BLOCK) as usize];
        let first = self.block_index(offset_bytes);
        self.accept_pending(role, first, &crcs);
        crcs
    }

    /// The write begun with these records ended (in any way: a failed member is rebuilt to
    /// what it was given).
    pub fn end_write(&self, role: usize, offset_bytes: u64, crcs: &[u32]) {
        let first = self.block_index(offset_bytes);
        self.store(role, first, crcs);
        if first < self.zone.blocks {
            let mut pending = self.pending[role].lock();
            if let Some(at) = pending
                .iter()
                .position(|w| w.first == first && w.crcs == crcs)
            {
                pending.swap_remove(at);
            }
        }
    }

    /// `role` should hold `buf` at `offset_bytes` (it missed the write, or its record was the
    /// stale party).
    pub fn set_block(&self, role: usize, offset_bytes: u64, buf: &[u8]) {
        self.set_records(role, offset_bytes, &self.records_of(buf));
    }

    /// As [`Integrity::set_block`], with the blocks' records already known.
    pub fn set_records(&self, role: usize, offset_bytes: u64, records: &[u32]) {
        self.store(role, self.block_index(offset_bytes), records);
    }

    /// So many tables wait for a write-out that their changed pages crowd the cache (a client
    /// that writes on and never flushes): the caller should write them out.
    pub fn wants_write_out(&self) -> bool {
        self.dirty.lock().len() > self.cache.capacity() / 2
    }

    /// A new member fills `holder`: every table copy it holds is written at the next flush.
    pub fn held_by_new_member(&self, holder: usize) {
        let mut d = self.dirty.lock();
        for c in 0..self.zone.copies {
            let s = self.zone.subject(holder, c);
            for t in 0..self.zone.tables {
                d.insert((s, t));
            }
        }
    }

    pub fn has_dirty_tables(&self) -> bool {
        !self.dirty.lock().is_empty()
    }

    fn table_of(
        &self,
        subject: usize,
        index: u64,
        copy: usize,
        epoch: u64,
        recs: &[u32],
    ) -> TableBlock {
        TableBlock {
            copy: copy as u8,
            subject: subject as u32,
            holder: self.zone.holder(subject, copy) as u32,
            index,
            epoch,
            uuid: self.uuid,
            records: recs.to_vec(),
        }
    }

    /// Does table block (`subject`, any index) have a valid copy at load on more than one
    /// member? Only copies on usable, complete holders count: [`Integrity::read_tables`] skips
    /// the others.
    fn held_twice(&self, subject: usize) -> bool {
        (0..self.zone.copies)
            .filter(|&c| {
                let slot = &self.slots[self.zone.holder(subject, c)];
                slot.usable().is_some() && slot.is_complete()
            })
            .count()
            > 1
    }

    /// Write every changed table block to each copy's holder that is usable, copy by copy.
    /// The last copy is not flushed here (the caller flushes). A block with a valid copy on
    /// one member only (a 2-way mirror, a degraded array) is written with FUA: a cut may tear
    /// unflushed writes, and a torn only copy would take the records of data flushed long
    /// before with it. Returns the holders whose write or flush failed (to be failed by the
    /// caller), with the error.
    pub fn write_tables(&self, members: &MemberSet) -> Vec<(usize, Arc<Member>, std::io::Error)> {
        let slots = &self.slots[..];
        let _one = self.writing.lock();
        let dirty = std::mem::take(&mut *self.dirty.lock());
        if dirty.is_empty() {
            return Vec::new();
        }
        let base = self.epoch.load(Ordering::Acquire) + 1;
        let mut failed: Vec<(usize, Arc<Member>, std::io::Error)> = Vec::new();
        // Per holder and copy, runs of consecutive table blocks go out as one write (FUA where
        // the block has no second copy to fall back on).
        let mut runs: Vec<(usize, usize, u64, Vec<u8>, bool)> = Vec::new();
        let mut taken = Vec::with_capacity(dirty.len());
        for &(subject, index) in &dirty {
            // A block's epoch grows past what its copies carry, whatever the other blocks do.
            let (recs, gen, epoch) = self.page(subject, index, |p| {
                p.queued = false;
                (p.recs.clone(), p.gen, base.max(p.epoch + 1))
            });
            self.epoch.fetch_max(epoch, Ordering::AcqRel);
            taken.push(((subject, index), gen, epoch));
            let fua = !self.held_twice(subject);
            for copy in 0..self.zone.copies {
                let holder = self.zone.holder(subject, copy);
                let bytes = self.table_of(subject, index, copy, epoch, &recs).encode();
                match runs.last_mut() {
                    Some((h, c, first, buf, f))
                        if *h == holder
                            && *c == copy
                            && *f == fua
                            && *first + (buf.len() / RECORD_BLOCK) as u64 == index =>
                    {
                        buf.extend_from_slice(&bytes)
                    }
                    _ => runs.push((holder, copy, index, bytes, fua)),
                }
            }
        }
        // One copy after the other, each made durable before the next is written: a cut can
        // tear the copies of one write-out, never all of them.
        runs.sort_by_key(|r| (r.1, r.0, r.2));
        let mut written: Vec<Arc<Member>> = Vec::new();
        let mut current_copy = 0;
        for (holder, copy, first, bytes, fua) in runs {
            if copy != current_copy {
                for m in written.drain(..) {
                    if let Err(e) = m.dev.flush() {
                        let role = (0..slots.len()).find(|&r| slots[r].holds(&m));
                        if let Some(role) = role {
                            failed.push((role, m, e));
                        }
                    }
                }
                current_copy = copy;
            }
            let Some(m) = slots[holder].usable() else {
                continue;
            };
            if failed.iter().any(|f| f.0 == holder) {
                continue;
            }
            let at = m.data_offset_bytes + self.zone.table_sector(copy, first) * 512;
            let table = Metadata::IntegrityTable { at };
            match members.write_metadata(&m, table, &AlignedBuf::copy_from(&bytes), fua) {
                Ok(()) => {
                    self.counts
                        .written
                        .fetch_add((bytes.len() / RECORD_BLOCK) as u64, Ordering::Relaxed);
                    if !written.iter().any(|w| Arc::ptr_eq(w, &m)) {
                        written.push(m);
                    }
                }
                Err(e) => failed.push((holder, m, e)),
            }
        }
        for (key, gen, epoch) in taken {
            self.cache.written(key, gen, epoch);
        }
        failed
    }

    /// Load the tables from the members, newest valid copy first, when they fit in the cache
    /// (else each is read when first needed). Stale or bad copies are left dirty (rewritten at
    /// the first flush). A table with no valid copy is taken from a twin's, or rebuilt from its
    /// subject's blocks as they are, when the subject is there.
    pub fn load(&self) {
        let total = self.zone.raid_disks as u64 * self.zone.tables;
        if total > self.cache.capacity() as u64 {
            tracing::info!(
                tables = total,
                cache = self.cache.capacity(),
                "integrity tables are read as needed (more than the record cache holds)"
            );
            return;
        }
        let mut orphans: Vec<(usize, u64)> = Vec::new();
        for subject in 0..self.zone.raid_disks {
            let mut index = 0;
            while index < self.zone.tables {
                let n = TABLE_RUN.min(self.zone.tables - index);
                let areas: Vec<Option<AlignedBuf>> = (0..self.zone.copies)
                    .map(|c| self.read_tables(subject, c, index, n))
                    .collect();
                for i in index..index + n {
                    let at = ((i - index) * BLOCK) as usize;
                    let copies = areas
                        .iter()
                        .enumerate()
                        .map(|(c, a)| {
                            a.as_ref()
                                .map(|a| self.decode(subject, c, i, &a[at..at + RECORD_BLOCK]))
                        })
                        .collect();
                    match self.choose(subject, i, copies) {
                        Some((t, epoch)) => {
                            self.cache
                                .insert((subject, i), Page::loaded(t.records, epoch), |_| ());
                        }
                        None => orphans.push((subject, i)),
                    }
                }
                index += n;
            }
        }
        for (subject, index) in orphans {
            let recs = self.orphan_records(subject, index);
            self.cache
                .insert((subject, index), Page::loaded(recs, 0), |_| ());
        }
    }

    /// Read table block `index` of `subject` from its copies (a page the cache does not hold).
    fn fetch(&self, subject: usize, index: u64) -> Page {
        let copies = (0..self.zone.copies)
            .map(|c| {
                self.read_tables(subject, c, index, 1)
                    .map(|a| self.decode(subject, c, index, &a))
            })
            .collect();
        match self.choose(subject, index, copies) {
            Some((t, epoch)) => Page::loaded(t.records, epoch),
            None => Page::loaded(self.orphan_records(subject, index), 0),
        }
    }

    /// `n` table blocks from `index` of copy `copy` of `subject`, as its holder has them (None:
    /// the holder is missing, unreadable, or still being rebuilt).
    fn read_tables(&self, subject: usize, copy: usize, index: u64, n: u64) -> Option<AlignedBuf> {
        let holder = self.zone.holder(subject, copy);
        let slot = &self.slots[holder];
        let m = slot.usable()?;
        if !slot.is_complete() {
            // A member still being rebuilt holds nothing yet: write its copies.
            self.dirty
                .lock()
                .extend((index..index + n).map(|i| (subject, i)));
            return None;
        }
        let mut buf = AlignedBuf::zeroed((n * BLOCK) as usize);
        let at = m.data_offset_bytes + self.zone.table_sector(copy, index) * 512;
        m.dev.read_at(&mut buf, at).ok()?;
        Some(buf)
    }

    fn decode(
        &self,
        subject: usize,
        copy: usize,
        index: u64,
        raw: &[u8],
    ) -> Result<TableBlock, TableFault> {
        if raw.iter().all(|&b| b == 0) {
            return Err(TableFault::Blank);
        }
        let holder = self.zone.holder(subject, copy) as u32;
        TableBlock::decode(raw, &self.uuid, copy as u8, subject as u32, holder, index)
            .map_err(TableFault::Bad)
    }

    /// The newest valid copy of a table block, with the largest epoch its copies carry. Bad
    /// and stale copies are counted and marked for rewriting. Copies that were all never
    /// written are the table create would have written, at epoch 0: no copy on disk vouches
    /// for them, so a mirror's resident page of them stands in for no twin (a lost write of
    /// the table would look the same; `orphan_records`).
    fn choose(
        &self,
        subject: usize,
        index: u64,
        copies: Vec<Option<Result<TableBlock, TableFault>>>,
    ) -> Option<(TableBlock, u64)> {
        let mut read = copies.iter().flatten().peekable();
        if read.peek().is_some() && read.all(|c| matches!(c, Err(TableFault::Blank))) {
            let t = self.table_of(subject, index, 0, 0, &[self.zero_record; RECORDS_PER_TABLE]);
            return Some((t, 0));
        }
        let best = copies
            .iter()
            .flatten()
            .filter_map(|r| r.as_ref().ok())
            .max_by_key(|t| t.epoch)
            .cloned();
        let mut rewrite = best.is_none();
        for (c, copy) in copies.iter().enumerate() {
            match copy {
                None => {}
                Some(Err(e)) => {
                    rewrite = true;
                    self.counts.bad.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(subject, index, copy = c, "integrity table: {e}");
                }
                Some(Ok(t)) if best.as_ref().is_some_and(|b| b.epoch != t.epoch) => {
                    rewrite = true;
                    self.counts.stale.fetch_add(1, Ordering::Relaxed);
                }
                Some(Ok(_)) => {}
            }
        }
        if rewrite {
            self.dirty.lock().insert((subject, index));
        }
        if let Some(t) = &best {
            self.epoch.fetch_max(t.epoch, Ordering::AcqRel);
        }
        best.map(|t| {
            let epoch = t.epoch;
            (t, epoch)
        })
    }

    /// Records for a table block with no valid copy: a mirror's twin records the same blocks,
    /// so its table is as good as a copy (a 2-way mirror keeps one copy per member, so a lost
    /// member takes its twin's only copy); else the subject's blocks as they are. A twin's
    /// resident page that came from no valid copy either (epoch 0, never written out) is no
    /// copy: it may be a stand-in rebuilt without the member.
    fn orphan_records(&self, subject: usize, index: u64) -> Vec<u32> {
        for &twin in &self.twins[subject] {
            if let Some(recs) = self
                .cache
                .get((twin, index), |p| (p.epoch > 0).then(|| p.recs.clone()))
                .flatten()
            {
                return recs;
            }
            let copies = (0..self.zone.copies)
                .map(|c| {
                    self.read_tables(twin, c, index, 1)
                        .map(|a| self.decode(twin, c, index, &a))
                })
                .collect::<Vec<_>>();
            if let Some(t) = copies
                .into_iter()
                .flatten()
                .filter_map(Result::ok)
                .max_by_key(|t| t.epoch)
            {
                return t.records;
            }
        }
        let recs = self.rebuild_table(subject, index);
        self.share_with_twins(subject, index, &recs);
        recs
    }

    /// Records of table block `index` just rebuilt from `subject`'s own blocks: a twin that
    /// is not complete (missing, or still being rebuilt) takes them, queued for the next
    /// write-out. Its table is what stands in for the subject's at the next start
    /// ([`Integrity::orphan_records`]); with the records it had (the zero block's of a table
    /// never written, or older ones from before a cut), the subject's blocks that this start
    /// served, flushed or not, would fail them there: EIO on data flushed long before.
    /// A complete twin keeps its own records (its blocks are there to vouch for them).
    fn share_with_twins(&self, subject: usize, index: u64, recs: &[u32]) {
        let complete = |role: usize| {
            let slot = &self.slots[role];
            slot.usable().is_some() && slot.is_complete()
        };
        // Records rebuilt from a twin or from nothing say nothing new about the twins.
        if !complete(subject) {
            return;
        }
        for &twin in self.twins[subject].iter().filter(|&&t| !complete(t)) {
            self.store(twin, index * PER, recs);
        }
    }

    /// Read every table copy the usable, complete holders keep and compare it with the records
    /// (a scrub's pass over the tables; the caller wrote out and flushed the changed tables
    /// first). A copy that does not decode, or holds other records, is counted; with `fix` it
    /// is rewritten at the next write-out. Tables changed meanwhile are skipped, and so are
    /// runs of tables whose blocks (member bytes `from..to`) `unused` says hold no data: reads
    /// there never consult them, and a write there fetches them first. Returns the copies
    /// found wrong.
    pub fn verify_tables(&self, fix: bool, unused: impl Fn(u64, u64) -> bool) -> u64 {
        let mut wrong = 0;
        for subject in 0..self.zone.raid_disks {
            for copy in 0..self.zone.copies {
                let holder = self.zone.holder(subject, copy);
                if self.slots[holder].usable().is_none() || !self.slots[holder].is_complete() {
                    continue;
                }
                let mut index = 0;
                while index < self.zone.tables {
                    let n = TABLE_RUN.min(self.zone.tables - index);
                    if unused(index * PER * BLOCK, (index + n) * PER * BLOCK) {
                        index += n;
                        continue;
                    }
                    let area = self.read_tables(subject, copy, index, n);
                    for i in index..index + n {
                        let at = ((i - index) * BLOCK) as usize;
                        let ok = area.as_ref().is_some_and(|a| {
                            let recs =
                                match self.decode(subject, copy, i, &a[at..at + RECORD_BLOCK]) {
                                    Ok(t) => t.records,
                                    // Never written: the records create would have written.
                                    Err(TableFault::Blank) => {
                                        vec![self.zero_record; RECORDS_PER_TABLE]
                                    }
                                    Err(TableFault::Bad(_)) => return false,
                                };
                            // A page changed since its last write-out differs from its
                            // copies until the next one: not a fault.
                            self.page(subject, i, |p| p.queued || p.recs == recs)
                        });
                        if ok || self.dirty.lock().contains(&(subject, i)) {
                            continue;
                        }
                        wrong += 1;
                        self.counts.bad.fetch_add(1, Ordering::Relaxed);
                        tracing::warn!(
                            subject,
                            index = i,
                            copy,
                            holder,
                            "integrity table copy is wrong"
                        );
                        if fix {
                            self.dirty.lock().insert((subject, i));
                        }
                    }
                    index += n;
                }
            }
        }
        wrong
    }

    /// No copy of a table block is valid: take its records from the subject's blocks as they
    /// are, or, with the subject gone, from a complete twin's (a mirror's twin holds the same
    /// blocks at the same offsets); a later check compares them with the rest of their rows.
    fn rebuild_table(&self, subject: usize, index: u64) -> Vec<u32> {
        self.counts.rebuilt.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(
            subject,
            index,
            "integrity table has no valid copy: records rebuilt from the member"
        );
        let mut recs = vec![self.zero_record; RECORDS_PER_TABLE];
        let first = index * PER;
        let n = PER.min(self.zone.blocks - first);
        let twin = || {
            self.twins[subject].iter().find_map(|&t| {
                let slot = &self.slots[t];
                slot.is_complete().then(|| slot.usable()).flatten()
            })
        };
        let Some(m) = self.slots[subject].usable().or_else(twin) else {
            return recs;
        };
        let mut buf = AlignedBuf::zeroed((n * BLOCK) as usize);
        if m.dev
            .read_at(&mut buf, m.data_offset_bytes + first * BLOCK)
            .is_err()
        {
            return recs;
        }
        for (i, blk) in buf.chunks(RECORD_BLOCK).enumerate() {
            recs[i] = self.record_of(blk);
        }
        recs
    }

    pub fn count_mismatch(&self, kind: BlockKind) {
        let c = match kind {
            BlockKind::Data => &self.counts.data,
            BlockKind::P => &self.counts.p,
            BlockKind::Q => &self.counts.q,
        };
        c.fetch_add(1, Ordering::Relaxed);
    }

    pub fn count_repaired(&self) {
        self.counts.repaired.fetch_add(1, Ordering::Relaxed);
    }

    pub fn count_record_fixed(&self) {
        self.counts.records_fixed.fetch_add(1, Ordering::Relaxed);
    }

    pub fn count_unrecoverable(&self) {
        self.counts.unrecoverable.fetch_add(1, Ordering::Relaxed);
    }

    pub fn count_resolved(&self) {
        self.counts.resolved.fetch_add(1, Ordering::Relaxed);
    }

    /// A block rewritten on `role` read back wrong: after a few of those the member is failed
    /// (it answers but does not keep what it is given). Returns whether it was.
    pub fn strike_rewrite(&self, members: &MemberSet, role: usize) -> bool {
        self.counts.rewrite_failures.fetch_add(1, Ordering::Relaxed);
        if self.strikes[role].fetch_add(1, Ordering::AcqRel) + 1 < STRIKES_TO_FAIL {
            return false;
        }
        let member = members.slot(role).usable();
        members.fail_role(
            role,
            member.as_ref(),
            "rewritten blocks keep reading back wrong (integrity)",
        );
        true
    }

    pub fn counts(&self) -> IntegrityCounts {
        let c = &self.counts;
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        IntegrityCounts {
            data_mismatches: g(&c.data),
            p_mismatches: g(&c.p),
            q_mismatches: g(&c.q),
            repaired: g(&c.repaired),
            rewrite_failures: g(&c.rewrite_failures),
            records_fixed: g(&c.records_fixed),
            unrecoverable: g(&c.unrecoverable),
            resolved_after_crash: g(&c.resolved),
            table_copies_bad: g(&c.bad),
            table_copies_stale: g(&c.stale),
            tables_rebuilt: g(&c.rebuilt),
            table_blocks_written: g(&c.written),
        }
    }

    pub fn status(&self) -> IntegrityStatus {
        IntegrityStatus {
            checksum: "crc32c",
            copies: self.zone.copies,
            table_bytes: self.zone.len_sectors() * 512,
            epoch: self.epoch.load(Ordering::Acquire),
            counts: self.counts(),
            cache: self.cache.stats(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    /// Parity's records by CRC linearity equal the records of the parity bytes, for odd and
    /// even numbers of data blocks.
    #[test]
    fn records_of_xor_match_the_parity_bytes() {
        let integ = Integrity::new(
            [7; 16],
            Zone::new(7, 2, 1 << 12),
            vec![Vec::new(); 7],
            Arc::new((0..7).map(|_| Slot::new(None)).collect()),
            1 << 20,
        );
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(5);
        for k in 1..=6 {
            for _ in 0..20 {
                let blocks: Vec<Vec<u8>> = (0..k)
                    .map(|_| (0..2 * RECORD_BLOCK).map(|_| rng.gen()).collect())
                    .collect();
                let mut p = vec![0u8; 2 * RECORD_BLOCK];
                for b in &blocks {
                    for (x, y) in p.iter_mut().zip(b) {
                        *x ^= y;
                    }
                }
                let each: Vec<Vec<u32>> = blocks.iter().map(|b| integ.records_of(b)).collect();
                assert_eq!(integ.records_of_xor(&each), integ.records_of(&p), "k = {k}");
            }
        }
        // Canary: without the zero block's term an even count comes out wrong.
        let a = vec![1u8; RECORD_BLOCK];
        let b = vec![2u8; RECORD_BLOCK];
        let x: Vec<u8> = a.iter().zip(&b).map(|(p, q)| p ^ q).collect();
        assert_ne!(
            integ.record_of(&a) ^ integ.record_of(&b),
            integ.record_of(&x)
        );
    }
}
