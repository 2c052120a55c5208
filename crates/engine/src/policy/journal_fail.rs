//! A failed log (issue 21, item 2): what happens between the moment the log fails and the
//! moment it is recorded faulty.
//!
//! While the log is healthy, every acknowledged write is durable in it: stripe member writes
//! go out without FUA, a client flush skips the members, and write-back data lives only in the
//! log and the cache. So the moment the log fails, the members may lack acknowledged data, and
//! the log is the only durable copy of it. The order from then on:
//! 1. `Journal::fail` (any thread, under any claim): new writes are refused; nothing else.
//! 2. [`Journal::settle`] (a thread that holds no row claim: a client flush, the
//!    administrator's `fail`, the journal daemon, a stop, assembly): first the member writes
//!    that were past the log when it failed (and pages on their way into the cache) are
//!    waited for, then every cached row is written out from memory (parity computed, not
//!    logged), and the members are flushed;
//! 3. only then is the log recorded faulty in the superblocks (events bump).
//!
//! Invariants: a log recorded faulty holds nothing the members lack durably, so it is never
//! replayed; a log not recorded faulty is replayed at the next start like any other, so a
//! crash anywhere in 1–3 loses nothing the log still returns when read. From step 1 on:
//! * a client flush returns only after 2 (and its own member flush), whether it saw the
//!   failure when it started or only when it was about to return;
//! * a write whose member writes lost their FUA to the log (write-through) and that finds the
//!   log failed once they are done flushes the members before it is acknowledged (see
//!   `commit.rs`).
//!
//! A flush or write that found the log healthy at its last check is acknowledged on the log's
//! durability; that log is still the array's journal on disk until step 3, so nothing it
//! acknowledged is lost. Commits that fail on a failing log leave its superblock's events
//! behind; assembly still replays a log the role table names (`assemble.rs`, `place`), and a
//! lost log's slot is never given to a new one.
//!
//! md's raid5-cache, for comparison (reference §6.6): a failing journal makes the array
//! refuse new writes, and the stripes still cached go to the RAID disks from memory; the
//! journal device is marked faulty meanwhile, and write-back data acknowledged but not yet on
//! the RAID disks is at risk if the host also crashes (a faulty journal is not replayed).
//! Here the log stays the array's journal on disk until it holds nothing the members lack,
//! so a crash before that replays it.

use crate::error::Result;
use crate::policy::host::PolicyHost;
use crate::policy::journal::Journal;
use crate::policy::write_back::WriteBackCache;
use std::sync::atomic::Ordering;

impl Journal {
    /// The log has failed (step 1 in the module notes): say so; the record waits.
    pub(super) fn failing(&self, host: &dyn PolicyHost, why: &str) {
        let member = self.member();
        tracing::error!(array = %host.name(), journal = %member.name(), "journal failed: {why}; writes are refused, what the log covered is being written out to the members");
        host.members().events.emit(
            "journal_failing",
            host.name(),
            Some(member.name()),
            format!("{why}; writes are refused; writing out what the log covered"),
        );
    }

    /// Cached rows go home unlogged once the log failed (here, or a row that fills up, or the
    /// journal daemon): a crash in that may tear them, and the log holds their data without
    /// parity, which a degraded start cannot rebuild a missing member's chunks from. Before
    /// the first of those writes, the superblocks say a resync is owed, as for an array
    /// without a journal: a degraded start after such a crash is refused unless forced (md's
    /// start_dirty_degraded), a whole one resyncs.
    pub(crate) fn owe_resync_for_unlogged_write_out(&self, host: &dyn PolicyHost) {
        if host.is_read_only() || self.unlogged_recorded.swap(true, Ordering::AcqRel) {
            return;
        }
        let members = host.members();
        let mut meta = members.meta.lock();
        meta.resync_offset = 0;
        members.commit(meta);
    }

    /// Steps 2 and 3 of the module notes, once; callers that come while another one runs
    /// wait for it. Must not be called under a row claim. Ok when the log has not failed.
    pub(crate) fn settle(&self, host: &dyn PolicyHost) -> Result<()> {
        let Some(why) = self.failed() else {
            return Ok(());
        };
        let _one = self.settling();
        if self.settled() {
            return Ok(());
        }
        // No ticket is given once the log has failed: when those out end, nothing more can
        // go into the cache or past the log.
        self.wait_tickets();
        if !self.pending_rows().is_empty() {
            self.owe_resync_for_unlogged_write_out(host);
        }
        host.write_out_pending()?;
        host.flush_members();
        if host.members().is_failed() {
            return Err(host.members().unrecoverable(
                0,
                host.geometry().array_sectors() * 512,
                "too many members failed while the failed journal's cache was written out",
            ));
        }
        assert_eq!(
            self.pending_rows(),
            Vec::<u64>::new(),
            "a failed log is recorded only once its cache is written out"
        );
        if !host.is_read_only() {
            host.members().journal_failed(self.member(), &why);
        }
        self.mark_settled();
        Ok(())
    }
}
