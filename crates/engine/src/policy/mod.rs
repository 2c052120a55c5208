//! Consistency policies: what an array records so that redundancy can be made consistent again
//! after an unclean stop, and how much it must check then.
//!
//! A policy is chosen per array when it is created and recorded in the superblock (md's own
//! fields where md has them: no bitmap or journal feature bit means `resync`). The engine calls
//! it at fixed points, always in this order for one group of member writes:
//! `on_active` (once per run, before the first write, under the metadata lock) →
//! `before_writes` → the member writes → `after_writes` (→ `note_inconsistent` when some did not
//! land), and `on_clean` at a clean stop once every write is durable. After an unclean stop,
//! `resync_from` says where resync starts.
//!
//! [`ResyncPolicy`] is md's plain behaviour: "active" means the whole array may be inconsistent,
//! so a crash costs a full resync (from the checkpoint a clean stop recorded, if any). The
//! write-intent bitmap, the journal and guided resync implement the same trait.

pub(crate) mod bitmap;
pub(crate) mod guided;
pub(crate) mod host;
pub(crate) mod journal;
pub(crate) mod journal_fail;
pub(crate) mod takeover;
pub(crate) mod used;
pub(crate) mod used_nodes;
pub(crate) mod write_back;

use crate::error::Result;
use crate::io::commit::{StripeImage, Ticket, WriteKind, WriteSet};
use crate::members::Meta;
use crate::policy::bitmap::WriteIntentBitmap;
use crate::policy::guided::{Guidance, Watched, WatchedFlush};
use crate::policy::host::PolicyHost;
use crate::policy::journal::Journal;
use format::MAX_SECTOR;
use std::sync::Arc;

pub(crate) trait ConsistencyPolicy: Send + Sync {
    /// The name `detail` shows (`--consistency-policy` of `create`).
    fn name(&self) -> &'static str;
    /// The array goes active: set what the superblocks must say before the first write.
    fn on_active(&self, meta: &mut Meta);
    /// Clean stop, every write durable: set what the superblocks record. `resync_from` is the
    /// per-member byte offset a resync still has to start from (None: redundancy is in sync).
    fn on_clean(&self, meta: &mut Meta, resync_from: Option<u64>);
    /// Before a group of member writes goes out; `image` is what a stripe write (kind
    /// `Stripe`) puts on the members. The ticket comes back to `after_writes`.
    fn before_writes(
        &self,
        host: &dyn PolicyHost,
        set: &WriteSet,
        image: Option<&StripeImage<'_>>,
    ) -> Result<Ticket>;
    /// After a group of member writes completed (whatever their outcome).
    fn after_writes(&self, host: &dyn PolicyHost, set: &WriteSet, ticket: Ticket);
    /// Some writes of `set` did not land: its redundancy may disagree with its data.
    fn note_inconsistent(&self, host: &dyn PolicyHost, set: &WriteSet);
    /// From the superblock of an array that was not stopped cleanly: where resync starts.
    fn resync_from(&self, sb_resync_offset_sectors: u64) -> Option<u64>;
    /// Where a resync walking `from..end` next has work, and where that work ends: all of
    /// `from..end` unless the policy knows parts of it are consistent.
    fn next_to_resync(&self, from: u64, end: u64) -> std::ops::Range<u64> {
        from..end
    }
    /// A resync made `from..to` consistent.
    fn resynced(&self, _from: u64, _to: u64) {}
    /// Does the policy log whole 4 KiB pages with full parity (the journal)? The stripe path
    /// then widens writes to pages and computes parity in full, even for a missing member.
    fn logs_pages(&self) -> bool {
        false
    }
    /// Does the policy cache acknowledged writes before they reach the members (the journal's
    /// write-back mode)?
    fn write_back(&self) -> bool {
        false
    }
    /// Does the cache hold newer bytes of stripe `row` than its members?
    fn is_cached(&self, _row: u64) -> bool {
        false
    }
    /// Lay what the cache holds of data chunk `d` of stripe `row`, from byte `off`, over `buf`.
    fn overlay(&self, _row: u64, _d: usize, _off: u64, _buf: &mut [u8]) {}
    /// Why the policy's own device failed (the journal's log), if it did: writes are refused.
    fn failed(&self) -> Option<String> {
        None
    }
    /// Bytes (sync coordinates) a crash may have left torn and not resynced yet, if the policy
    /// can tell (the bitmap's needed chunks); None: it cannot tell a torn row from a sound one.
    fn torn_bytes(&self) -> Option<u64> {
        None
    }
    /// Before client I/O over array bytes `offset..offset + len` (`write`: a write or a
    /// discard): the guided policy verifies what a read touches, or ends guidance on a write.
    fn before_client_io(
        &self,
        _host: &dyn PolicyHost,
        _offset: u64,
        _len: u64,
        _write: bool,
    ) -> Result<()> {
        Ok(())
    }
    /// A client write (data None: a discard) is about to go out; what comes back goes to
    /// `write_ended`.
    fn write_begins(
        &self,
        _host: &dyn PolicyHost,
        _offset: u64,
        _len: u64,
        _data: Option<&[u8]>,
    ) -> Option<Watched> {
        None
    }
    /// That client write ended (`durable`: with FUA).
    fn write_ended(&self, _host: &dyn PolicyHost, _w: Option<Watched>, _ok: bool, _durable: bool) {}
    /// A client flush begins; what comes back goes to `flush_ended` once it succeeded.
    fn flush_begins(&self) -> Option<WatchedFlush> {
        None
    }
    fn flush_ended(&self, _host: &dyn PolicyHost, _f: Option<WatchedFlush>) {}
    /// Whether the resync after an unclean stop must wait (for a guide) now.
    fn holds_resync(&self, _host: &dyn PolicyHost) -> bool {
        false
    }
    /// A resync starts (no metadata or sync lock held).
    fn resync_starts(&self, _host: &dyn PolicyHost) {}
    /// The resync after an unclean stop finished (no metadata or sync lock held).
    fn resync_finished(&self, _host: &dyn PolicyHost) {}
    /// Redundancy somewhere may disagree with the data for a reason no one above knows of.
    fn taint(&self) {}
    /// The write-intent bitmap, if the policy keeps one.
    fn bitmap(&self) -> Option<&Arc<WriteIntentBitmap>> {
        None
    }
    /// Guided resync's state, if the policy is `guided`.
    fn guidance(&self) -> Option<&Guidance> {
        None
    }
    /// The policy's own device failed: write out what it covered and record it faulty
    /// (`journal_fail.rs`). Ok when there is nothing to settle. Not under a row claim.
    fn settle(&self, _host: &dyn PolicyHost) -> Result<()> {
        Ok(())
    }
    /// The write-back cache in front of the members, if the policy keeps one (the journal in
    /// write-back mode keeps it; whether writes go to it is [`ConsistencyPolicy::write_back`]).
    fn write_back_cache(&self) -> Option<&dyn write_back::WriteBackCache> {
        None
    }
    /// The write-ahead journal, if the policy keeps one.
    fn journal(&self) -> Option<&Arc<Journal>> {
        None
    }
}

/// md's `active` resync checkpoint as the plain policy records it, shared by policies that
/// keep md's superblock semantics.
fn mark_active(meta: &mut Meta) {
    // md writes 0 while active: whatever was written since the last clean state may be
    // anywhere, including below an older resync checkpoint.
    meta.resync_offset = 0;
}

fn mark_clean(meta: &mut Meta, resync_from: Option<u64>) {
    meta.resync_offset = resync_from.map_or(MAX_SECTOR, |b| b / 512);
}

fn sb_resync_from(sb_resync_offset_sectors: u64) -> Option<u64> {
    (sb_resync_offset_sectors != MAX_SECTOR).then(|| sb_resync_offset_sectors * 512)
}

/// md without bitmap or journal: a crash means a full resync.
pub(crate) struct ResyncPolicy;

impl ConsistencyPolicy for ResyncPolicy {
    fn name(&self) -> &'static str {
        "resync"
    }

    fn on_active(&self, meta: &mut Meta) {
        mark_active(meta);
    }

    fn on_clean(&self, meta: &mut Meta, resync_from: Option<u64>) {
        mark_clean(meta, resync_from);
    }

    fn before_writes(
        &self,
        _host: &dyn PolicyHost,
        _set: &WriteSet,
        _image: Option<&StripeImage<'_>>,
    ) -> Result<Ticket> {
        Ok(None)
    }

    fn after_writes(&self, _host: &dyn PolicyHost, _set: &WriteSet, _ticket: Ticket) {}

    fn note_inconsistent(&self, host: &dyn PolicyHost, set: &WriteSet) {
        host.request_resync_from(set.offset_bytes);
    }

    fn resync_from(&self, sb_resync_offset_sectors: u64) -> Option<u64> {
        sb_resync_from(sb_resync_offset_sectors)
    }
}

/// md's internal write-intent bitmap: the superblock still says active/clean as without it,
/// but every member write is covered by a durable bit first, so resync after a crash visits
/// only chunks whose bits are set (see `bitmap.rs`).
pub(crate) struct BitmapPolicy {
    pub bitmap: Arc<WriteIntentBitmap>,
}

impl ConsistencyPolicy for BitmapPolicy {
    fn name(&self) -> &'static str {
        "bitmap"
    }

    fn on_active(&self, meta: &mut Meta) {
        mark_active(meta);
    }

    fn on_clean(&self, meta: &mut Meta, resync_from: Option<u64>) {
        mark_clean(meta, resync_from);
    }

    fn before_writes(
        &self,
        host: &dyn PolicyHost,
        set: &WriteSet,
        _image: Option<&StripeImage<'_>>,
    ) -> Result<Ticket> {
        // Rebuild writes only fill a member above its in-sync point; its recovery checkpoint
        // covers them.
        if set.kind == WriteKind::Rebuild {
            return Ok(None);
        }
        self.bitmap
            .start_write(host.members(), set.offset_bytes, set.len_bytes)?;
        Ok(None)
    }

    fn after_writes(&self, _host: &dyn PolicyHost, set: &WriteSet, _ticket: Ticket) {
        // A member that failed under these writes missed them; its bits stay anyway (the
        // daemon clears nothing while the array is degraded). Writes that left redundancy
        // inconsistent were marked by `note_inconsistent` before this.
        if set.kind != WriteKind::Rebuild {
            self.bitmap.end_write(set.offset_bytes, set.len_bytes);
        }
    }

    fn note_inconsistent(&self, host: &dyn PolicyHost, set: &WriteSet) {
        self.bitmap.mark_needed(set.offset_bytes, set.len_bytes);
        host.request_resync_from(set.offset_bytes);
    }

    fn resync_from(&self, sb_resync_offset_sectors: u64) -> Option<u64> {
        sb_resync_from(sb_resync_offset_sectors)
    }

    fn next_to_resync(&self, from: u64, end: u64) -> std::ops::Range<u64> {
        self.bitmap.next_needed(from, end)
    }

    fn resynced(&self, from: u64, to: u64) {
        self.bitmap.synced(from, to);
    }

    fn torn_bytes(&self) -> Option<u64> {
        Some(self.bitmap.needed_bytes())
    }

    fn bitmap(&self) -> Option<&Arc<WriteIntentBitmap>> {
        Some(&self.bitmap)
    }
}

/// md's raid5-cache journal (write-through): every stripe write is logged, durably, before its
/// member writes, so a crash leaves nothing for a resync to find; recovery replays the log
/// at assembly (see `journal.rs`).
///
/// The superblock's `resync_offset` keeps only what a resync still owes (an initial sync not
/// finished): going active does not move it to 0, because what a crash interrupts is in the
/// log, not in need of a scan. (md's own superblock for a journal array says "active"; with
/// the journal lost, `run --drop-journal` resyncs everything, as that state would.)
pub(crate) struct JournalPolicy {
    pub journal: Arc<Journal>,
}

impl ConsistencyPolicy for JournalPolicy {
    fn name(&self) -> &'static str {
        "journal"
    }

    fn on_active(&self, _meta: &mut Meta) {}

    fn on_clean(&self, meta: &mut Meta, resync_from: Option<u64>) {
        mark_clean(meta, resync_from);
    }

    fn before_writes(
        &self,
        host: &dyn PolicyHost,
        set: &WriteSet,
        image: Option<&StripeImage<'_>>,
    ) -> Result<Ticket> {
        if set.kind != WriteKind::Stripe {
            // Rebuild and repair writes reproduce what redundancy already says; a crash
            // leaves them to the rebuild checkpoint or a later check. A replay's pages are in
            // the log already (the tail moves past them only once they are durable at home).
            return Ok(None);
        }
        let image = image.expect("stripe writes come with their image");
        if image.parity_only && self.journal.failed().is_some() {
            // The log is gone: cached write-back data still goes home from memory (md does
            // the same); only new writes are refused. Unlogged, it reopens the write hole.
            self.journal.owe_resync_for_unlogged_write_out(host);
            return Ok(None);
        }
        self.journal.log(host, image).map(Some)
    }

    fn after_writes(&self, _host: &dyn PolicyHost, _set: &WriteSet, ticket: Ticket) {
        if let Some(seqs) = ticket {
            self.journal.written_home(seqs);
        }
    }

    fn note_inconsistent(&self, host: &dyn PolicyHost, set: &WriteSet) {
        host.request_resync_from(set.offset_bytes);
    }

    fn resync_from(&self, sb_resync_offset_sectors: u64) -> Option<u64> {
        sb_resync_from(sb_resync_offset_sectors)
    }

    fn logs_pages(&self) -> bool {
        true
    }

    fn write_back(&self) -> bool {
        self.journal.write_back()
    }

    fn failed(&self) -> Option<String> {
        self.journal.failed()
    }

    fn is_cached(&self, row: u64) -> bool {
        self.journal.is_cached(row)
    }

    fn overlay(&self, row: u64, d: usize, off: u64, buf: &mut [u8]) {
        self.journal.overlay(row, d, off, buf);
    }

    fn settle(&self, host: &dyn PolicyHost) -> Result<()> {
        self.journal.settle(host)
    }

    fn write_back_cache(&self) -> Option<&dyn write_back::WriteBackCache> {
        Some(self.journal.as_ref())
    }

    fn journal(&self) -> Option<&Arc<Journal>> {
        Some(&self.journal)
    }
}
