//! Bad sectors as md handles them: read errors corrected from redundancy, and what cannot be
//! recovered recorded in md's bad-block log on the member that lacks it.
//!
//! A member read that fails with an I/O error does not fail the member (see `io`): the read ends
//! `ReadError` (see `io`) and the caller treats the member as missing over the
//! range. Where the level's redundancy still covers the range, the block is rebuilt, served, and
//! written back to the member and read again ("read error corrected", md's `fix_read_error`):
//! a drive remaps a sector when it is written. The member is failed only when
//! * that rewrite fails (the write path fails it, as any write error does) or reads back wrong
//!   or unreadable, or
//! * its read errors pass [`MAX_READ_ERRORS`]: a simple count, over the member's time in this
//!   run, of the blocks found unreadable (each counted once where it is handled: corrected or
//!   recorded, not per device call that met it; md's `max_read_errors`, default 20; md's
//!   RAID1/10 also halve their count every hour, which we do not: a member that keeps throwing
//!   read errors over days is failed sooner here).
//!
//! What redundancy cannot cover (a survivor's unreadable sector on a degraded array, a rebuild
//! source unreadable or failing its records beyond redundancy) is recorded as bad blocks, in
//! 4 KiB pages, on the member that lacks the data: the survivor whose sector failed, the member
//! being rebuilt for what could not be rebuilt. Reads of a recorded range end `ReadError`
//! without touching the device; the rest of the stack then serves it from redundancy when there
//! is some, or answers EIO. A successful write over a recorded range clears it (the member holds
//! what was written). The list lives in md's v1.2 bad-block log (`format::encode_bad_blocks`);
//! the superblock's BAD_BLOCKS bit is set with it (`superblocks.rs`), so `mdadm --examine-badblocks` lists
//! it and md honours it. A member whose log is full, or cannot be written, is failed instead
//! (md does the same when `rdev_set_badblocks` fails).
//!
//! Locking: a member's list and its log page change under the member's own mutex, so log
//! writes never interleave; the array's metadata lock is taken after it, never before.

use crate::members::metadata::{self, Metadata};
use crate::members::Member;
use device::{AlignedBuf, Device};
use format::BadRange;
use parking_lot::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// md's default `max_read_errors`: a member is failed once more read errors than this were
/// seen on it (corrected or not).
pub const MAX_READ_ERRORS: u64 = 20;
/// Bad blocks are recorded in pages of this many bytes (md's STRIPE_SIZE).
pub const BAD_PAGE: u64 = 4096;

/// Where a member's bad-block log lives.
#[derive(Clone, Copy, Debug)]
pub(crate) struct BbLog {
    at_bytes: u64,
    len_bytes: usize,
    shift: u8,
    data_offset_sectors: u64,
}

impl BbLog {
    /// The log a superblock describes (None: the member has none).
    pub fn of(sb: &format::Superblock) -> Option<BbLog> {
        if sb.bblog_size == 0 || sb.bblog_offset == 0 {
            return None;
        }
        let at_sectors = format::SB_OFFSET_SECTORS as i64 + i64::from(sb.bblog_offset);
        Some(BbLog {
            at_bytes: u64::try_from(at_sectors).ok()? * 512,
            len_bytes: usize::from(sb.bblog_size) * 512,
            shift: sb.bblog_shift,
            data_offset_sectors: sb.data_offset,
        })
    }
}

/// A member's read errors and bad blocks.
#[derive(Default)]
pub struct Health {
    log: Option<BbLog>,
    /// Bad ranges, data-area bytes `[start, end)`, sorted and disjoint.
    bad: Mutex<Vec<(u64, u64)>>,
    /// Lock-free "the list is not empty", for the read path.
    has_bad: AtomicBool,
    /// Read errors seen on this member in this run (compared with [`MAX_READ_ERRORS`]).
    read_errors: AtomicU64,
    /// Read errors corrected by rewriting the block.
    corrected: AtomicU64,
    /// Reads whose blocks failed their integrity records (zpool's CKSUM column).
    checksum_errors: AtomicU64,
}

impl Health {
    pub(crate) fn new(log: Option<BbLog>) -> Health {
        Health {
            log,
            ..Health::default()
        }
    }

    /// Load the entries the member's log holds (written by us or by md).
    pub(crate) fn load(&self, dev: &dyn Device) -> std::io::Result<()> {
        let Some(log) = self.log else { return Ok(()) };
        let mut buf = AlignedBuf::zeroed(log.len_bytes);
        dev.read_at(&mut buf, log.at_bytes)?;
        let mut bad = self.bad.lock();
        for r in format::decode_bad_blocks(&buf, log.shift) {
            // An entry below the data area (md never writes one) marks nothing we read.
            let start = r.start_sector.saturating_sub(log.data_offset_sectors) * 512;
            let end =
                (r.start_sector + r.len_sectors).saturating_sub(log.data_offset_sectors) * 512;
            if start < end {
                add_range(&mut bad, start, end);
            }
        }
        self.has_bad.store(!bad.is_empty(), Ordering::Release);
        Ok(())
    }

    /// Does any recorded bad range meet data-area bytes `off..off + len`?
    pub fn overlaps(&self, off: u64, len: u64) -> bool {
        if !self.has_bad.load(Ordering::Acquire) {
            return false;
        }
        let end = off + len;
        self.bad.lock().iter().any(|&(a, b)| a < end && off < b)
    }

    /// Is all of data-area bytes `off..off + len` recorded bad?
    pub fn covers(&self, off: u64, len: u64) -> bool {
        self.has_bad.load(Ordering::Acquire)
            && self
                .bad
                .lock()
                .iter()
                .any(|&(a, b)| a <= off && off + len <= b)
    }

    pub fn has_bad_blocks(&self) -> bool {
        self.has_bad.load(Ordering::Acquire)
    }

    /// Sectors recorded bad.
    pub fn bad_sectors(&self) -> u64 {
        self.bad
            .lock()
            .iter()
            .map(|&(a, b)| (b - a).div_ceil(512))
            .sum()
    }

    pub fn corrected(&self) -> u64 {
        self.corrected.load(Ordering::Relaxed)
    }

    pub fn read_errors(&self) -> u64 {
        self.read_errors.load(Ordering::Relaxed)
    }

    pub fn checksum_errors(&self) -> u64 {
        self.checksum_errors.load(Ordering::Relaxed)
    }

    pub(crate) fn note_checksum_error(&self) {
        self.checksum_errors.fetch_add(1, Ordering::Relaxed);
    }

    /// Count one unreadable block; true once the member has had more than the limit.
    pub(crate) fn note_read_error(&self) -> bool {
        self.read_errors.fetch_add(1, Ordering::Relaxed) + 1 > MAX_READ_ERRORS
    }

    pub(crate) fn note_corrected(&self) {
        self.corrected.fetch_add(1, Ordering::Relaxed);
    }

    /// Record `off..off + len` (widened to whole pages) bad and write the log durably.
    /// `Ok(false)`: already recorded. Errors: no log, log full, or its write failed.
    pub(crate) fn record(&self, member: &Member, off: u64, len: u64) -> std::io::Result<bool> {
        let log = self
            .log
            .ok_or_else(|| std::io::Error::other("no bad-block log"))?;
        let (a, b) = (
            off / BAD_PAGE * BAD_PAGE,
            (off + len).div_ceil(BAD_PAGE) * BAD_PAGE,
        );
        let mut bad = self.bad.lock();
        if bad.iter().any(|&(s, e)| s <= a && b <= e) {
            return Ok(false);
        }
        let mut next = bad.clone();
        add_range(&mut next, a, b);
        write_log(member, &log, &next, true)?;
        *bad = next;
        self.has_bad.store(true, Ordering::Release);
        Ok(true)
    }

    /// A write of data-area bytes `off..off + len` succeeded: what it covered is good again.
    /// The log is rewritten (durable with the next flush); a failure to write it leaves the
    /// range recorded on disk, which errs on the side of EIO, never of old data.
    pub(crate) fn clear(&self, member: &Member, off: u64, len: u64) {
        if !self.overlaps(off, len) {
            return;
        }
        let Some(log) = self.log else { return };
        let mut bad = self.bad.lock();
        let end = off + len;
        let mut next = Vec::with_capacity(bad.len() + 1);
        for &(a, b) in bad.iter() {
            if b <= off || end <= a {
                next.push((a, b));
                continue;
            }
            if a < off {
                next.push((a, off));
            }
            if end < b {
                next.push((end, b));
            }
        }
        // Sub-page leftovers are kept whole-sector; the log counts sectors.
        if let Err(e) = write_log(member, &log, &next, false) {
            tracing::warn!(member = %member.name(), "bad-block log not rewritten after a clearing write: {e}");
        }
        *bad = next;
        self.has_bad.store(!bad.is_empty(), Ordering::Release);
    }
}

/// Insert `[a, b)` into a sorted disjoint list, merging neighbours.
fn add_range(list: &mut Vec<(u64, u64)>, a: u64, b: u64) {
    assert!(a < b, "empty bad range {a}..{b}");
    let (mut lo, mut hi) = (a, b);
    list.retain(|&(s, e)| {
        let meets = s <= hi && lo <= e;
        if meets {
            lo = lo.min(s);
            hi = hi.max(e);
        }
        !meets
    });
    let at = list.partition_point(|&(s, _)| s < lo);
    list.insert(at, (lo, hi));
}

fn write_log(
    member: &Member,
    log: &BbLog,
    ranges: &[(u64, u64)],
    fua: bool,
) -> std::io::Result<()> {
    let unit_bytes = 512u64 << log.shift;
    let abs: Vec<BadRange> = ranges
        .iter()
        .map(|&(a, b)| {
            let (a, b) = (
                a / unit_bytes * unit_bytes,
                b.div_ceil(unit_bytes) * unit_bytes,
            );
            BadRange {
                start_sector: log.data_offset_sectors + a / 512,
                len_sectors: (b - a) / 512,
            }
        })
        .collect();
    let bytes = format::encode_bad_blocks(&abs, log.shift, log.len_bytes)
        .ok_or_else(|| std::io::Error::other("bad-block log full"))?;
    let at = log.at_bytes;
    metadata::write(
        member,
        Metadata::BadBlockLog { at },
        &AlignedBuf::copy_from(&bytes),
        fua,
    )
}
