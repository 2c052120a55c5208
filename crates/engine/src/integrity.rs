//! Per-block CRC32C records kept apart from the data (`format::Zone`, design study layout b2).
//!
//! Every 4 KiB block of every role (data, P and Q alike) has a record: the raid5-cache page
//! checksum of what was last written there. The records of role X live in tables on X+1 and
//! X+2 (RAID6 also X+3), never on X, so a write X lost or sent elsewhere contradicts a record
//! that another device kept.
//!
//! In memory the records are one flat array per role, loaded at assembly from the newest valid
//! copy of each table block. They change in two places only:
//! * a member write ([`Integrity::begin_write`] before it goes out, [`Integrity::end_write`]
//!   after), whatever the write is for (client data, parity, rebuild, repair, resync);
//!   while it is in flight a read of the block may return the old or the new contents, and
//!   both verify;
//! * a write a missing member did not get ([`Integrity::set_block`]): its record follows what
//!   the role should hold, so that reconstruction of it can be verified.
//!
//! Tables go to disk at every member flush ([`Integrity::write_tables`], called by
//! `Array::flush_members` before the flush): the records of everything a flush makes durable
//! are durable with it (design rule P6). Each write-out stamps a new epoch; at load the newer
//! valid copy wins and the other is rewritten.

use crate::member::{Member, Slot};
use device::AlignedBuf;
use format::{TableBlock, Zone, RECORDS_PER_TABLE, RECORD_BLOCK};
use parking_lot::Mutex;
use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

const BLOCK: u64 = RECORD_BLOCK as u64;

/// Records of writes in flight, by (role, block).
type Pending = HashMap<(usize, u64), Vec<u32>>;
const PENDING_SHARDS: usize = 64;

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
    /// `records[role][block]`.
    records: Vec<Vec<AtomicU32>>,
    /// Records of writes in flight, by (role, block): a read may see either contents.
    pending: Vec<Mutex<Pending>>,
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
    /// `twins[role]`: see [`Integrity::twins`] (empty per role for parity levels).
    pub fn new(uuid: [u8; 16], zone: Zone, twins: Vec<Vec<usize>>) -> Integrity {
        assert_eq!(twins.len(), zone.raid_disks, "twins per role");
        let seed = format::record_seed(&uuid);
        let zero_record = format::record_of(seed, &[0u8; RECORD_BLOCK]);
        Integrity {
            uuid,
            seed,
            zone,
            records: (0..zone.raid_disks)
                .map(|_| {
                    (0..zone.blocks)
                        .map(|_| AtomicU32::new(zero_record))
                        .collect()
                })
                .collect(),
            pending: (0..PENDING_SHARDS).map(|_| Mutex::default()).collect(),
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

    fn shard(&self, role: usize, block: u64) -> &Mutex<Pending> {
        &self.pending[(block as usize ^ role.wrapping_mul(0x9e37)) % PENDING_SHARDS]
    }

    /// Does the 4 KiB `block` read from `role` at `offset_bytes` match what was written there
    /// (or what a write in flight is writing)? Blocks past md's `size` have no record.
    pub fn block_ok(&self, role: usize, offset_bytes: u64, block: &[u8]) -> bool {
        let b = self.block_index(offset_bytes);
        if b >= self.zone.blocks {
            return true;
        }
        let crc = self.record_of(block);
        if crc == self.records[role][b as usize].load(Ordering::Acquire) {
            return true;
        }
        self.shard(role, b)
            .lock()
            .get(&(role, b))
            .is_some_and(|p| p.contains(&crc))
    }

    /// The record of `role`'s block at `offset_bytes` (None past md's `size`).
    pub fn record(&self, role: usize, offset_bytes: u64) -> Option<u32> {
        let b = self.block_index(offset_bytes);
        (b < self.zone.blocks).then(|| self.records[role][b as usize].load(Ordering::Acquire))
    }

    /// Every block of `buf` (read from `role` at `offset_bytes`) matches its record.
    pub fn verify(&self, role: usize, offset_bytes: u64, buf: &[u8]) -> bool {
        assert_eq!(buf.len() as u64 % BLOCK, 0, "reads are whole 4 KiB blocks");
        buf.chunks(RECORD_BLOCK)
            .enumerate()
            .all(|(i, blk)| self.block_ok(role, offset_bytes + i as u64 * BLOCK, blk))
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
        for (i, &c) in crcs.iter().enumerate() {
            let b = first + i as u64;
            if b < self.zone.blocks {
                self.shard(role, b)
                    .lock()
                    .entry((role, b))
                    .or_default()
                    .push(c);
            }
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
    pub fn records_of_xor(&self, each: &[Vec<u32>]) -> Vec<u32> {
        let fold = if each.len().is_multiple_of(2) {
            self.zero_record
        } else {
            0
        };
        (0..each[0].len())
            .map(|i| each.iter().fold(fold, |acc, r| acc ^ r[i]))
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
        for (i, &c) in crcs.iter().enumerate() {
            let b = first + i as u64;
            if b >= self.zone.blocks {
                continue;
            }
            self.records[role][b as usize].store(c, Ordering::Release);
            let mut shard = self.shard(role, b).lock();
            if let Some(p) = shard.get_mut(&(role, b)) {
                if let Some(at) = p.iter().position(|&x| x == c) {
                    p.swap_remove(at);
                }
                if p.is_empty() {
                    shard.remove(&(role, b));
                }
            }
        }
        self.mark_dirty(role, first, crcs.len() as u64);
    }

    /// `role` should hold `buf` at `offset_bytes` (it missed the write, or its record was the
    /// stale party).
    pub fn set_block(&self, role: usize, offset_bytes: u64, buf: &[u8]) {
        let first = self.block_index(offset_bytes);
        let mut n = 0;
        for (i, blk) in buf.chunks(RECORD_BLOCK).enumerate() {
            let b = first + i as u64;
            if b < self.zone.blocks {
                self.records[role][b as usize].store(self.record_of(blk), Ordering::Release);
                n += 1;
            }
        }
        self.mark_dirty(role, first, n);
    }

    fn mark_dirty(&self, role: usize, first: u64, blocks: u64) {
        if blocks == 0 || first >= self.zone.blocks {
            return;
        }
        let per = RECORDS_PER_TABLE as u64;
        let last = (first + blocks - 1).min(self.zone.blocks - 1);
        let mut d = self.dirty.lock();
        for t in first / per..=last / per {
            d.insert((role, t));
        }
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

    fn table_of(&self, subject: usize, index: u64, copy: usize, epoch: u64) -> TableBlock {
        let per = RECORDS_PER_TABLE as u64;
        let recs = &self.records[subject];
        TableBlock {
            copy: copy as u8,
            subject: subject as u32,
            holder: self.zone.holder(subject, copy) as u32,
            index,
            epoch,
            uuid: self.uuid,
            records: (0..per)
                .map(|i| {
                    recs.get((index * per + i) as usize)
                        .map_or(self.zero_record, |r| r.load(Ordering::Acquire))
                })
                .collect(),
        }
    }

    /// Write every changed table block to each copy's holder that is usable, copy by copy.
    /// The last copy is not flushed here (the caller flushes). Returns the holders whose write
    /// or flush failed (to be failed by the caller), with the error.
    pub fn write_tables(&self, slots: &[Slot]) -> Vec<(usize, Arc<Member>, std::io::Error)> {
        let _one = self.writing.lock();
        let dirty = std::mem::take(&mut *self.dirty.lock());
        if dirty.is_empty() {
            return Vec::new();
        }
        let epoch = self.epoch.fetch_add(1, Ordering::AcqRel) + 1;
        let mut failed: Vec<(usize, Arc<Member>, std::io::Error)> = Vec::new();
        // Per holder and copy, runs of consecutive table blocks go out as one write.
        let mut runs: Vec<(usize, usize, u64, Vec<u8>)> = Vec::new();
        for &(subject, index) in &dirty {
            for copy in 0..self.zone.copies {
                let holder = self.zone.holder(subject, copy);
                let bytes = self.table_of(subject, index, copy, epoch).encode();
                match runs.last_mut() {
                    Some((h, c, first, buf))
                        if *h == holder
                            && *c == copy
                            && *first + (buf.len() / RECORD_BLOCK) as u64 == index =>
                    {
                        buf.extend_from_slice(&bytes)
                    }
                    _ => runs.push((holder, copy, index, bytes)),
                }
            }
        }
        // One copy after the other, each made durable before the next is written: a cut can
        // tear the copies of one write-out, never all of them.
        runs.sort_by_key(|r| (r.1, r.0, r.2));
        let mut written: Vec<Arc<Member>> = Vec::new();
        let mut current_copy = 0;
        for (holder, copy, first, bytes) in runs {
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
            match m.dev.write_at(&AlignedBuf::copy_from(&bytes), at, false) {
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
        failed
    }

    /// Load every table from the members (roles in `slots` order), newest valid copy first.
    /// Stale or bad copies are left dirty (rewritten at the first flush). A table with no valid
    /// copy is rebuilt from its subject's blocks as they are, when the subject is there.
    pub fn load(&self, slots: &[Slot]) {
        let per = RECORDS_PER_TABLE as u64;
        let mut max_epoch = 0u64;
        // (subject, index) of table blocks with no valid copy, and which were loaded.
        let mut orphans: Vec<(usize, u64)> = Vec::new();
        let mut loaded: BTreeSet<(usize, u64)> = BTreeSet::new();
        for subject in 0..self.zone.raid_disks {
            // copies[c] = the holder's table area for this subject, if readable.
            let areas: Vec<Option<Vec<u8>>> = (0..self.zone.copies)
                .map(|c| {
                    let holder = self.zone.holder(subject, c);
                    let m = slots[holder].usable()?;
                    if !slots[holder].is_complete() {
                        // A member still being rebuilt holds nothing yet: write its copies.
                        let mut d = self.dirty.lock();
                        for t in 0..self.zone.tables {
                            d.insert((subject, t));
                        }
                        return None;
                    }
                    let mut buf = AlignedBuf::zeroed((self.zone.tables * BLOCK) as usize);
                    let at = m.data_offset_bytes + self.zone.table_sector(c, 0) * 512;
                    m.dev.read_at(&mut buf, at).ok()?;
                    Some(buf.to_vec())
                })
                .collect();
            for index in 0..self.zone.tables {
                let range = (index * BLOCK) as usize..((index + 1) * BLOCK) as usize;
                let copies: Vec<Option<Result<TableBlock, format::FormatError>>> = areas
                    .iter()
                    .enumerate()
                    .map(|(c, area)| {
                        let holder = self.zone.holder(subject, c) as u32;
                        area.as_ref().map(|a| {
                            TableBlock::decode(
                                &a[range.clone()],
                                &self.uuid,
                                c as u8,
                                subject as u32,
                                holder,
                                index,
                            )
                        })
                    })
                    .collect();
                let best = copies
                    .iter()
                    .flatten()
                    .filter_map(|r| r.as_ref().ok())
                    .max_by_key(|t| t.epoch)
                    .cloned();
                let mut rewrite = false;
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
                match best {
                    Some(t) => {
                        max_epoch = max_epoch.max(t.epoch);
                        for (i, r) in t.records.iter().enumerate() {
                            let b = index * per + i as u64;
                            if b < self.zone.blocks {
                                self.records[subject][b as usize].store(*r, Ordering::Relaxed);
                            }
                        }
                        loaded.insert((subject, index));
                    }
                    None => orphans.push((subject, index)),
                }
            }
        }
        for (subject, index) in orphans {
            // A mirror's twin records the same blocks: its table is as good as a copy (a 2-way
            // mirror keeps one copy per member, so a lost member takes its twin's only copy).
            match self.twins[subject]
                .iter()
                .find(|&&t| loaded.contains(&(t, index)))
            {
                Some(&twin) => {
                    let first = (index * per) as usize;
                    let last = ((index + 1) * per).min(self.zone.blocks) as usize;
                    for b in first..last {
                        let r = self.records[twin][b].load(Ordering::Relaxed);
                        self.records[subject][b].store(r, Ordering::Relaxed);
                    }
                }
                None => self.rebuild_table(slots, subject, index),
            }
            self.dirty.lock().insert((subject, index));
        }
        self.epoch.store(max_epoch, Ordering::Release);
    }

    /// Read every table copy the usable, complete holders keep and compare it with the records
    /// (a scrub's pass over the tables; the caller wrote out and flushed the changed tables
    /// first). A copy that does not decode, or holds other records, is counted; with `fix` it
    /// is rewritten at the next write-out. Tables changed meanwhile are skipped. Returns the
    /// copies found wrong.
    pub fn verify_tables(&self, slots: &[Slot], fix: bool) -> u64 {
        let per = RECORDS_PER_TABLE as u64;
        let mut wrong = 0;
        for subject in 0..self.zone.raid_disks {
            for copy in 0..self.zone.copies {
                let holder = self.zone.holder(subject, copy);
                let Some(m) = slots[holder]
                    .usable()
                    .filter(|_| slots[holder].is_complete())
                else {
                    continue;
                };
                let mut area = AlignedBuf::zeroed((self.zone.tables * BLOCK) as usize);
                let at = m.data_offset_bytes + self.zone.table_sector(copy, 0) * 512;
                let readable = m.dev.read_at(&mut area, at).is_ok();
                for index in 0..self.zone.tables {
                    let raw = &area[(index * BLOCK) as usize..((index + 1) * BLOCK) as usize];
                    let ok = readable
                        && TableBlock::decode(
                            raw,
                            &self.uuid,
                            copy as u8,
                            subject as u32,
                            holder as u32,
                            index,
                        )
                        .is_ok_and(|t| {
                            t.records.iter().enumerate().all(|(i, r)| {
                                let b = index * per + i as u64;
                                b >= self.zone.blocks
                                    || *r
                                        == self.records[subject][b as usize].load(Ordering::Acquire)
                            })
                        });
                    if ok || self.dirty.lock().contains(&(subject, index)) {
                        continue;
                    }
                    wrong += 1;
                    self.counts.bad.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(
                        subject,
                        index,
                        copy,
                        holder,
                        "integrity table copy is wrong"
                    );
                    if fix {
                        self.dirty.lock().insert((subject, index));
                    }
                }
            }
        }
        wrong
    }

    /// No copy of a table block is valid: take its records from the subject's blocks as they
    /// are (a later check compares them with the rest of their rows).
    fn rebuild_table(&self, slots: &[Slot], subject: usize, index: u64) {
        self.counts.rebuilt.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(
            subject,
            index,
            "integrity table has no valid copy: records rebuilt from the member"
        );
        let per = RECORDS_PER_TABLE as u64;
        let first = index * per;
        let n = per.min(self.zone.blocks - first);
        let Some(m) = slots[subject].usable() else {
            return;
        };
        let mut buf = AlignedBuf::zeroed((n * BLOCK) as usize);
        if m.dev
            .read_at(&mut buf, m.data_offset_bytes + first * BLOCK)
            .is_err()
        {
            return;
        }
        for (i, blk) in buf.chunks(RECORD_BLOCK).enumerate() {
            self.records[subject][first as usize + i].store(self.record_of(blk), Ordering::Relaxed);
        }
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

    /// A rewritten block of `role` read back wrong; true when that has happened often enough
    /// to fail the member.
    pub fn strike(&self, role: usize) -> bool {
        self.counts.rewrite_failures.fetch_add(1, Ordering::Relaxed);
        self.strikes[role].fetch_add(1, Ordering::AcqRel) + 1 >= STRIKES_TO_FAIL
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
        }
    }
}

/// Write every table a new member `sb` holds: all records are the zero block's (the data area
/// was just discarded), epoch 1.
pub(crate) fn write_initial_tables(
    dev: &dyn device::Device,
    sb: &format::Superblock,
    zone: &Zone,
    uuid: [u8; 16],
) -> std::io::Result<()> {
    let format::DevRole::Active(holder) = sb.role() else {
        return Ok(());
    };
    let holder = holder as usize;
    let zero = format::record_of(format::record_seed(&uuid), &[0u8; RECORD_BLOCK]);
    const RUN: u64 = 256;
    for copy in 0..zone.copies {
        let subject = zone.subject(holder, copy);
        let mut index = 0;
        while index < zone.tables {
            let n = RUN.min(zone.tables - index);
            let mut buf = Vec::with_capacity((n * BLOCK) as usize);
            for i in index..index + n {
                let t = TableBlock {
                    copy: copy as u8,
                    subject: subject as u32,
                    holder: holder as u32,
                    index: i,
                    epoch: 1,
                    uuid,
                    records: vec![zero; RECORDS_PER_TABLE],
                };
                buf.extend_from_slice(&t.encode());
            }
            let at = (sb.data_offset + zone.table_sector(copy, index)) * 512;
            dev.write_at(&AlignedBuf::copy_from(&buf), at, false)?;
            index += n;
        }
    }
    dev.flush()
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    /// Parity's records by CRC linearity equal the records of the parity bytes, for odd and
    /// even numbers of data blocks.
    #[test]
    fn records_of_xor_match_the_parity_bytes() {
        let integ = Integrity::new([7; 16], Zone::new(7, 2, 1 << 12), vec![Vec::new(); 7]);
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
