//! The guide's operations on a `guided` array (`policy/guided.rs` has the theory).
//!
//! Ending guidance touches two owners' state: the guidance's own (awaiting → guided, in
//! `Guidance`) and the walker's (the resync it no longer owes, in `SyncControl`). Neither
//! reaches into the other: the facade, which composes both, verifies the guide's ranges,
//! makes them durable, and then flips both under the walker's lock.

use super::Array;
use crate::error::{EngineError, Result};
use crate::policy::guided::{guidance_awaited, WriteWatch};
use crate::work::VerifyReport;
use std::sync::atomic::Ordering;
use std::sync::Arc;

impl Array {
    /// Install (or remove) the write watch of a guided array.
    pub fn set_write_watch(&self, watch: Option<Arc<dyn WriteWatch>>) -> Result<()> {
        let g = self.policy.guidance().ok_or_else(|| {
            EngineError::InvalidArgument(format!(
                "{} does not use the guided consistency policy",
                self.name
            ))
        })?;
        g.set_watch(watch);
        Ok(())
    }

    /// A guide names the array byte ranges that may have had writes in flight at the crash:
    /// verify them, then count redundancy as good everywhere else too. Only while awaiting.
    pub fn end_guidance(&self, guide: &str, ranges: &[(u64, u64)]) -> Result<VerifyReport> {
        let g = guidance_awaited(self.policy.as_ref(), &self.name)?;
        if g.tainted() {
            let why = "writes failed while awaiting guidance: no guide knows where";
            g.fall_back_with(&self.parts, why.into());
            self.sync.wake();
            return Err(EngineError::InvalidArgument(format!(
                "{}: {why}",
                self.name
            )));
        }
        let report = self.verify(ranges)?;
        g.note_guide_verified(report.bytes_verified);
        // What the verify rewrote is durable before redundancy counts as good (as at the end
        // of a resync).
        self.flush()?;
        {
            let mut st = self.sync.st.lock();
            g.finish(guide, &self.name, self.sync.clock.as_ref(), || {
                let total = self.personality.sync_total(crate::work::SyncAction::Resync);
                self.policy.resynced(0, total);
                st.resync_from = None;
                self.sync.unsynced.store(false, Ordering::Release);
            })?;
        }
        self.sync.wake();
        self.members.events.emit(
            "guidance_finished",
            &self.name,
            None,
            format!(
                "guide {guide}: {} ranges, {} bytes of stripes verified, {} sectors repaired; \
                 redundancy is in sync",
                report.ranges, report.bytes_verified, report.mismatch_sectors
            ),
        );
        Ok(report)
    }

    /// No guidance after all (a guide refused, or an administrator said so): run the bitmap
    /// resync now.
    pub fn fall_back(&self, reason: &str) -> Result<()> {
        let g = guidance_awaited(self.policy.as_ref(), &self.name)?;
        g.fall_back_with(&self.parts, reason.to_string());
        g.persist_fallback(&self.parts);
        self.sync.wake();
        Ok(())
    }

    /// A guide's own reads (of the file system's journal, say): served without verifying
    /// first. Data members answer reads of an array that is not degraded, so parity that
    /// disagrees does not change what they return; the guide verifies what it finds after.
    pub fn read_as_guide(&self, offset_bytes: u64, buf: &mut [u8]) -> Result<()> {
        guidance_awaited(self.policy.as_ref(), &self.name)?;
        if self.members.slots.iter().any(|s| !s.is_complete()) {
            return Err(EngineError::InvalidArgument(format!(
                "{} is degraded: a guide would read reconstructed blocks whose parity may be \
                 stale",
                self.name
            )));
        }
        self.read_unverified(offset_bytes, buf)
    }

    /// Ok while the array waits for a guide; otherwise why not.
    pub fn awaiting_guidance(&self) -> Result<()> {
        guidance_awaited(self.policy.as_ref(), &self.name).map(|_| ())
    }
}
