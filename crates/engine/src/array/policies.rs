//! The facade's operations on its consistency policy: the passes the policies' threads run
//! (which the deterministic simulation calls instead), settling a failed journal, and
//! md-cluster's takeover of a dead node's bitmap slot (`policy/takeover.rs` has the order).

use super::Array;
use crate::error::{EngineError, Result};
use crate::policy::takeover::{adopt_used_map, clear_slot, read_slot_union, TakeoverReport};
use format::bit_is_set;

impl Array {
    /// One clean-up pass of the write-intent bitmap (the daemon runs one every
    /// `daemon_sleep`; the deterministic simulation calls this instead).
    pub fn bitmap_pass(&self) {
        if let Some(bm) = self.policy.bitmap() {
            bm.pass(&self.parts);
        }
    }

    /// Reclaim what the journal holds that is home on the members (the reclaim thread does
    /// this on its own; the deterministic simulation calls it instead).
    pub fn journal_pass(&self) {
        if let Some(j) = self.policy.journal() {
            if let Err(e) = j.settle(&self.parts) {
                tracing::warn!(array = %self.name, "the failed journal's cache is not written out yet: {e}");
            }
            self.parity().write_out_oldest(self);
            j.reclaim_now(&self.parts);
        }
    }

    /// Take over the bitmap slot of a node that died (see the module docs for the order).
    /// Refuses this node's own slot, a slot the bitmap does not have, and arrays without
    /// md-cluster's per-node bitmaps. Only a node that knows the other is gone (its lease
    /// expired and it is fenced) may call this: a live node would go on writing its slot.
    pub fn take_over_slot(&self, slot: u32) -> Result<TakeoverReport> {
        let bm = self.policy.bitmap().cloned().ok_or_else(|| {
            EngineError::Unsupported(format!("array '{}' has no write-intent bitmap", self.name))
        })?;
        if slot == bm.slot() {
            return Err(EngineError::InvalidArgument(format!(
                "slot {slot} is this node's own bitmap slot"
            )));
        }
        if self.is_read_only() {
            return Err(EngineError::ReadOnly {
                array: self.name.clone(),
                reason: "a takeover writes both bitmap slots".into(),
            });
        }
        let (header, bits) = read_slot_union(Some(&bm), &self.members, &self.name, slot)?;
        let dirty: Vec<u64> = (0..header.chunks())
            .filter(|&c| bit_is_set(&bits, c))
            .collect();
        {
            let _counted = self.commit.enter(self.sync.clock.as_ref());
            bm.adopt(&self.members, &dirty, true)?;
            self.mark_active()?;
        }
        adopt_used_map(self.used.as_deref(), &self.members, &self.name, slot);
        clear_slot(&self.members, &header, slot)?;
        let resync_from_bytes = dirty.first().map(|&c| c * bm.chunk_bytes());
        if let Some(from) = resync_from_bytes {
            self.sync.request_resync_from(self.policy.as_ref(), from);
        }
        tracing::info!(array = %self.name, slot, adopted = dirty.len(), "took over a node's bitmap slot");
        Ok(TakeoverReport {
            slot,
            adopted_chunks: dirty.len() as u64,
            resync_from_bytes,
        })
    }

    /// Dirty chunks in bitmap slot `slot` on the members (the union of their copies), for
    /// status; reads only.
    pub fn slot_dirty_chunks(&self, slot: u32) -> Result<u64> {
        let (header, bits) = read_slot_union(
            self.policy.bitmap().map(|b| &**b),
            &self.members,
            &self.name,
            slot,
        )?;
        Ok(format::count_dirty(&bits, header.chunks()))
    }
}
