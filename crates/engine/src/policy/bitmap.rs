//! md's internal write-intent bitmap: one bit per bitmap chunk, set on every member (durably)
//! before any write it covers goes out, cleared lazily once the chunk has been quiet.
//!
//! Coordinates are md's "sync" coordinates: bytes of each member's data area for RAID1/4/5/6,
//! array bytes for RAID10 (reference §5.1, `sync_size`). They are the coordinates the commit
//! point's [`WriteSet`](crate::io::commit::WriteSet)s and the resync walk already use.
//!
//! # In memory
//! One `AtomicU32` per chunk: the writes in flight on it, how many clean-up passes found it
//! idle, whether its bit is durable on the members (`ON_DISK`), and whether its redundancy must
//! be made consistent (`NEEDED`: a set bit found at an unclean assembly, or writes that hit a
//! full backing store).
//! A write to a chunk whose bit is durable touches only its counter: no lock on that path.
//!
//! # Setting (group commit)
//! A write to a chunk without a durable bit sets the bit in the page image, then waits until a
//! write-out that started after that has completed ([`PagedCopy`], shared with the used-region
//! map): whoever holds its writer lock writes every dirty page, so writes to many new chunks
//! that arrive together share one bitmap write.
//!
//! # Clearing (the daemon, every `daemon_sleep`)
//! 1. Idle chunks age by one pass (a write start resets the age).
//! 2. If any chunk has been idle for [`CLEAR_AFTER_PASSES`], flush every member: the writes it
//!    covered ended before this pass began, so they are durable after this flush.
//! 3. Unless the array is degraded (bits then stay set: they are what a re-added member needs
//!    recovered), record `events_cleared` in the header, then clear those chunks whose
//!    counter is still unchanged (a write that started meanwhile keeps its bit) and write the
//!    pages out.
//!
//! Lock order: the metadata lock, the copy's writer lock, the header lock, the copy's image
//! lock. Nothing holding the writer lock takes the metadata lock: member failures met while
//! writing the bitmap are reported to the caller, who fails the members after letting go.

use crate::error::Result;
use crate::members::paged::{PagedCopy, WriteFailures};
use crate::members::{Member, MemberSet};
use crate::policy::host::PolicyHost;
use device::{AlignedBuf, Device};
use format::{
    bit_is_set, BitmapSuper, BITMAP_HEADER_BYTES, BITMAP_OFFSET_SECTORS, BITMAP_PAGE_BYTES,
    SB_OFFSET_SECTORS,
};
use parking_lot::Mutex;
use std::io;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Byte offset of the bitmap on every member (superblock at 4096, bitmap 8 sectors after it).
pub(crate) const BITMAP_BYTE_OFFSET: u64 =
    (SB_OFFSET_SECTORS as i64 + BITMAP_OFFSET_SECTORS as i64) as u64 * 512;

const COUNT_MASK: u32 = 0xffff;
const AGE_SHIFT: u32 = 16;
const AGE_MASK: u32 = 0x3 << AGE_SHIFT;
const ON_DISK: u32 = 1 << 20;
const NEEDED: u32 = 1 << 21;
/// Clean-up passes a chunk must stay idle before its bit clears (md: 2–3 × daemon_sleep).
const CLEAR_AFTER_PASSES: u32 = 2;

/// Write a new array's bitmap: the header and every bit set, as mdadm's create does (a clean
/// array clears them lazily, a dirty one resyncs what they cover: everything). A clustered
/// bitmap gets every node slot, each with its header; as with mdadm, only slot 0 starts all
/// ones (one node's resync covers the array once; the others start with nothing to do).
/// A clustered array created clean starts with no bit set at all: each node resyncs what its
/// own slot holds at every start (`assemble.rs`), which must not be everything.
pub(crate) fn write_initial(dev: &dyn Device, sb: &BitmapSuper, clean: bool) -> io::Result<()> {
    let slot_bytes = sb.bytes_on_disk() as usize;
    let mut buf = AlignedBuf::zeroed(sb.all_slots_bytes() as usize);
    if !(clean && sb.is_clustered()) {
        buf[..slot_bytes].fill(0xff);
    }
    for slot in buf.chunks_mut(slot_bytes) {
        slot[..BITMAP_HEADER_BYTES].copy_from_slice(&sb.encode());
    }
    dev.write_at(&buf, BITMAP_BYTE_OFFSET, false)
}

/// Read a member's bitmap: its header and the bytes holding its bits (slot 0 of a clustered
/// one).
pub fn read_bitmap(dev: &dyn Device) -> std::result::Result<(BitmapSuper, Vec<u8>), String> {
    read_bitmap_slot(dev, 0)
}

/// Read node slot `slot` of a member's bitmap: its header and the bytes holding its bits.
/// Slot 0's header says where the others are (`nodes` of them, each `bytes_on_disk` long);
/// a slot whose header disagrees with slot 0's on the array or the coverage is refused.
pub fn read_bitmap_slot(
    dev: &dyn Device,
    slot: u32,
) -> std::result::Result<(BitmapSuper, Vec<u8>), String> {
    let (first, bits) = read_one(dev, BITMAP_BYTE_OFFSET)?;
    if slot == 0 {
        return Ok((first, bits));
    }
    if slot >= first.slots() {
        return Err(format!(
            "the bitmap has {} node slot(s); there is no slot {slot}",
            first.slots()
        ));
    }
    let (sb, bits) = read_one(dev, slot_byte_offset(&first, slot))?;
    if sb.uuid != first.uuid
        || sb.sync_size != first.sync_size
        || sb.chunksize != first.chunksize
        || sb.nodes != first.nodes
    {
        return Err(format!(
            "node slot {slot}'s header disagrees with slot 0's (array, size, chunk or nodes)"
        ));
    }
    Ok((sb, bits))
}

/// Where node slot `slot` of a bitmap shaped like `sb` starts on every member (bytes).
pub(crate) fn slot_byte_offset(sb: &BitmapSuper, slot: u32) -> u64 {
    BITMAP_BYTE_OFFSET + sb.slot_offset(slot)
}

fn read_one(dev: &dyn Device, at: u64) -> std::result::Result<(BitmapSuper, Vec<u8>), String> {
    let mut head = AlignedBuf::zeroed(BITMAP_PAGE_BYTES);
    dev.read_at(&mut head, at)
        .map_err(|e| format!("cannot read the bitmap: {e}"))?;
    let sb = BitmapSuper::decode(&head).map_err(|e| e.to_string())?;
    let total = sb.bytes_on_disk();
    if at + total > dev.len_bytes() {
        return Err(format!(
            "bitmap of {} chunks runs past the device end",
            sb.chunks()
        ));
    }
    let mut all = AlignedBuf::zeroed(total as usize);
    dev.read_at(&mut all, at)
        .map_err(|e| format!("cannot read the bitmap: {e}"))?;
    Ok((sb, all[BITMAP_HEADER_BYTES..].to_vec()))
}

pub(crate) struct WriteIntentBitmap {
    /// The node slot this bitmap is (0 unless clustered).
    slot: u32,
    chunk_bytes: u64,
    sync_bytes: u64,
    chunks: u64,
    counters: Box<[AtomicU32]>,
    /// The header as last put into the image (locked before the copy's locks).
    header: Mutex<BitmapSuper>,
    copy: PagedCopy,
    pub(crate) daemon_sleep: Duration,
}

impl WriteIntentBitmap {
    /// The bitmap daemon: a pass every `daemon_sleep` of the array's clock until the array
    /// stops its background work.
    pub(crate) fn daemon(&self, host: &dyn PolicyHost) {
        let clock = host.clock();
        let mut last = clock.now();
        host.until_stopped(Duration::from_millis(100), &mut || {
            if clock.now().saturating_sub(last) >= self.daemon_sleep {
                self.pass(host);
                last = clock.now();
            }
        });
    }

    /// One clean-up pass (the daemon runs one every `daemon_sleep`; the deterministic
    /// simulation calls this instead). A read-only or fenced node clears nothing: it may not
    /// write its slot.
    pub(crate) fn pass(&self, host: &dyn PolicyHost) {
        let fenced = host.members().coordinator().write_refusal().is_some();
        if !host.is_read_only() && !fenced {
            self.daemon_pass(host.members(), false, || host.flush_members());
        }
    }

    /// The bitmap as assembly found it: `bits` is the union of the members' copies (all ones if
    /// none was fresh). Set bits are durable already; those covering bytes at or past
    /// `resync_from` need resync (an unclean stop). `slot`: the node slot this array writes
    /// (0 unless clustered); no other slot is ever written through it.
    pub(crate) fn load(sb: BitmapSuper, slot: u32, bits: &[u8], resync_from: Option<u64>) -> Self {
        let chunks = sb.chunks();
        let chunk_bytes = u64::from(sb.chunksize);
        let pages = sb.bytes_on_disk() as usize / BITMAP_PAGE_BYTES;
        let mut bytes = vec![0u8; pages * BITMAP_PAGE_BYTES];
        let n = bits.len().min(bytes.len() - BITMAP_HEADER_BYTES);
        bytes[BITMAP_HEADER_BYTES..BITMAP_HEADER_BYTES + n].copy_from_slice(&bits[..n]);
        let counters: Box<[AtomicU32]> = (0..chunks)
            .map(|c| {
                let mut w = 0;
                if bit_is_set(bits, c) {
                    w |= ON_DISK;
                    if resync_from.is_some_and(|from| (c + 1) * chunk_bytes > from) {
                        w |= NEEDED;
                    }
                }
                AtomicU32::new(w)
            })
            .collect();
        let daemon_sleep = Duration::from_secs(u64::from(sb.daemon_sleep.max(1)));
        bytes[..BITMAP_HEADER_BYTES].copy_from_slice(&sb.encode());
        let base = slot_byte_offset(&sb, slot);
        WriteIntentBitmap {
            slot,
            chunk_bytes,
            sync_bytes: sb.sync_size * 512,
            chunks,
            counters,
            header: Mutex::new(sb),
            copy: PagedCopy::new(base, bytes),
            daemon_sleep,
        }
    }

    pub(crate) fn chunk_bytes(&self) -> u64 {
        self.chunk_bytes
    }

    pub(crate) fn events_cleared(&self) -> u64 {
        self.header.lock().events_cleared
    }

    /// Chunks covering `offset..offset+len` (sync coordinates).
    fn span(&self, offset: u64, len: u64) -> std::ops::Range<u64> {
        let first = offset / self.chunk_bytes;
        let end = (offset + len.max(1)).div_ceil(self.chunk_bytes);
        first.min(self.chunks)..end.min(self.chunks)
    }

    /// A write to `offset..offset+len` starts: its bits are durable on the members when this
    /// returns. Every successful call is paired with one [`WriteIntentBitmap::end_write`].
    pub(crate) fn start_write(&self, members: &MemberSet, offset: u64, len: u64) -> Result<()> {
        let mut new = Vec::new();
        for c in self.span(offset, len) {
            let prev = self.counters[c as usize]
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |w| {
                    assert!(w & COUNT_MASK < COUNT_MASK, "bitmap counter overflow");
                    Some((w + 1) & !AGE_MASK)
                })
                .expect("the update always applies");
            if prev & ON_DISK == 0 {
                new.push(c);
            }
        }
        if new.is_empty() {
            return Ok(());
        }
        if !self
            .copy
            .commit_bits(members, BITMAP_HEADER_BYTES, new.iter().copied(), true)
        {
            self.end_write(offset, len);
            return Err(members.metadata_failed(
                offset,
                len,
                "cannot record the write-intent bitmap",
            ));
        }
        for c in new {
            self.counters[c as usize].fetch_or(ON_DISK, Ordering::AcqRel);
        }
        Ok(())
    }

    /// Chunks another node's slot has dirty become this slot's too: durably set on the
    /// members, and with `needed` also needing resync (then none clears before the resync
    /// passed it; NEEDED goes on first, so the clean-up pass can no longer clear a chunk whose
    /// bit this is about to rely on).
    pub(crate) fn adopt(&self, members: &MemberSet, chunks: &[u64], needed: bool) -> Result<()> {
        let mark = if needed { NEEDED } else { 0 };
        let mut new = Vec::new();
        for &c in chunks {
            assert!(c < self.chunks, "chunk {c} of {}", self.chunks);
            let prev = self.counters[c as usize].fetch_or(mark, Ordering::AcqRel);
            if prev & ON_DISK == 0 {
                new.push(c);
            }
        }
        if !new.is_empty()
            && !self
                .copy
                .commit_bits(members, BITMAP_HEADER_BYTES, new.iter().copied(), true)
        {
            return Err(members.metadata_failed(
                0,
                self.sync_bytes,
                "cannot record another node's dirty chunks in this node's bitmap slot",
            ));
        }
        for c in new {
            self.counters[c as usize].fetch_or(ON_DISK, Ordering::AcqRel);
        }
        Ok(())
    }

    /// The node slot this bitmap writes.
    pub(crate) fn slot(&self) -> u32 {
        self.slot
    }

    /// The header as last put into the image.
    pub(crate) fn header(&self) -> BitmapSuper {
        self.header.lock().clone()
    }

    /// Every chunk needs resync, durably: all bits set on the members, and none clears before
    /// the resync passed it.
    pub(crate) fn need_everything(&self, members: &MemberSet) -> Result<()> {
        self.start_write(members, 0, self.sync_bytes)?;
        self.mark_needed(0, self.sync_bytes);
        self.end_write(0, self.sync_bytes);
        Ok(())
    }

    /// A write started with [`WriteIntentBitmap::start_write`] is over.
    pub(crate) fn end_write(&self, offset: u64, len: u64) {
        for c in self.span(offset, len) {
            let prev = self.counters[c as usize].fetch_sub(1, Ordering::AcqRel);
            assert!(prev & COUNT_MASK > 0, "bitmap counter underflow");
        }
    }

    /// Change the header and put it into the image.
    fn put_header(&self, f: impl FnOnce(&mut BitmapSuper)) {
        let mut sb = self.header.lock();
        f(&mut sb);
        let head = sb.encode();
        self.copy.edit(|pages| pages.put(0, &head));
    }

    /// One clean-up pass: age idle chunks and clear the bits of those idle long enough.
    /// `now`: clear every idle chunk at once (a clean stop, after its flush). `flush` makes
    /// every write that ended durable (members and their integrity tables).
    pub(crate) fn daemon_pass(&self, members: &MemberSet, now: bool, flush: impl FnOnce()) {
        let mut ripe = false;
        for c in self.counters.iter() {
            let _ = c.fetch_update(Ordering::AcqRel, Ordering::Acquire, |w| {
                let idle = w & ON_DISK != 0 && w & NEEDED == 0 && w & COUNT_MASK == 0;
                let age = (w & AGE_MASK) >> AGE_SHIFT;
                if !idle || age >= CLEAR_AFTER_PASSES {
                    ripe |= idle;
                    return None;
                }
                ripe |= age + 1 >= CLEAR_AFTER_PASSES || now;
                Some((w & !AGE_MASK) | ((age + 1) << AGE_SHIFT))
            });
        }
        if !ripe {
            return;
        }
        if !now {
            // The writes of every ripe chunk ended before this pass began.
            flush();
        }
        let failed = {
            let mut w = self.copy.writer();
            if members.slots.iter().any(|s| !s.is_complete()) || members.is_failed() {
                return;
            }
            let targets = members.role_members();
            let mut failed = Vec::new();
            let behind = {
                let sb = self.header.lock();
                sb.events_cleared != sb.events
            };
            if behind {
                // The new events_cleared is durable before any bit it accounts for clears.
                self.put_header(|sb| sb.events_cleared = sb.events);
                failed.extend(self.copy.write_out(&targets, &mut w));
            }
            let cleared = self.copy.edit(|pages| {
                let mut cleared = 0u64;
                for (c, ctr) in self.counters.iter().enumerate() {
                    let done = ctr.fetch_update(Ordering::AcqRel, Ordering::Acquire, |w| {
                        let idle = w & ON_DISK != 0 && w & NEEDED == 0 && w & COUNT_MASK == 0;
                        let age = (w & AGE_MASK) >> AGE_SHIFT;
                        (idle && (age >= CLEAR_AFTER_PASSES || now)).then_some(0)
                    });
                    if done.is_ok() {
                        pages.set_bit(BITMAP_HEADER_BYTES, c as u64, false);
                        cleared += 1;
                    }
                }
                cleared
            });
            if cleared > 0 {
                failed.extend(self.copy.write_out(&targets, &mut w));
            }
            failed
        };
        members.fail_metadata_writers(failed);
    }

    /// Bits set in the image (what `mdadm -X` would count as dirty).
    pub(crate) fn dirty_chunks(&self) -> u64 {
        self.counters
            .iter()
            .filter(|c| c.load(Ordering::Acquire) & ON_DISK != 0)
            .count() as u64
    }

    /// Bytes (sync coordinates) of the chunks that need resync.
    pub(crate) fn needed_bytes(&self) -> u64 {
        (self.needed_chunks() * self.chunk_bytes).min(self.sync_bytes)
    }

    /// Chunks that need resync.
    pub(crate) fn needed_chunks(&self) -> u64 {
        self.counters
            .iter()
            .filter(|c| c.load(Ordering::Acquire) & NEEDED != 0)
            .count() as u64
    }

    /// Chunks counted in the bitmap.
    pub(crate) fn chunks(&self) -> u64 {
        self.chunks
    }

    /// The first byte at or after `from` (and before `end`) in a chunk whose bit is set:
    /// where a re-added member's recovery has work. `end` if none.
    /// Chunks that start before `end`: the scans stop there (what lies beyond cannot change
    /// their answers, which are capped at `end`).
    fn chunks_before(&self, end: u64) -> u64 {
        end.div_ceil(self.chunk_bytes).min(self.chunks)
    }

    pub(crate) fn next_set(&self, from: u64, end: u64) -> u64 {
        self.next_matching(from, end, ON_DISK)
    }

    /// The next run of chunks that need resync, at or after `from` and before `end` (empty,
    /// at `end`, if none).
    pub(crate) fn next_needed(&self, from: u64, end: u64) -> std::ops::Range<u64> {
        let start = self.next_matching(from, end, NEEDED);
        let first = start / self.chunk_bytes;
        let stop = (first..self.chunks_before(end))
            .find(|&c| self.counters[c as usize].load(Ordering::Acquire) & NEEDED == 0)
            .map_or(end, |c| (c * self.chunk_bytes).min(end));
        start..stop.max(start)
    }

    fn next_matching(&self, from: u64, end: u64, flag: u32) -> u64 {
        let first = from / self.chunk_bytes;
        (first..self.chunks_before(end))
            .find(|&c| self.counters[c as usize].load(Ordering::Acquire) & flag != 0)
            .map_or(end, |c| (c * self.chunk_bytes).max(from).min(end))
    }

    /// A resync walking upwards made `from..to` consistent: chunks that end inside it (their
    /// earlier part the walk covered before, or a resync before it) no longer need it.
    pub(crate) fn synced(&self, from: u64, to: u64) {
        let first = from / self.chunk_bytes;
        let last = if to >= self.sync_bytes {
            self.chunks
        } else {
            (to / self.chunk_bytes).min(self.chunks)
        };
        for c in first.min(last)..last {
            self.counters[c as usize].fetch_and(!NEEDED, Ordering::AcqRel);
        }
    }

    /// Redundancy over `offset..offset+len` may disagree with the data (writes that hit a full
    /// backing store): keep the bits and resync there.
    pub(crate) fn mark_needed(&self, offset: u64, len: u64) {
        for c in self.span(offset, len) {
            self.counters[c as usize].fetch_or(NEEDED, Ordering::AcqRel);
        }
    }
}

impl crate::members::EventRecorder for WriteIntentBitmap {
    /// Called by the superblock commit with the metadata lock held, for the members it
    /// writes (md has no utime in its bitmap header).
    fn record_events(&self, events: u64, _utime: u64, members: &[Arc<Member>]) -> WriteFailures {
        let mut w = self.copy.writer();
        self.put_header(|sb| sb.events = events);
        self.copy.write_out(members, &mut w)
    }
}

/// Most a recovery skips in one step (clean chunks, unused regions): it holds the range lock
/// over what it skips.
pub(crate) const SKIP_MAX_BYTES: u64 = 256 << 20;
