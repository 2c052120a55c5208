//! A cluster node as the engine's tests see one: it knows only its bitmap slot, shares the
//! metadata with other `Array`s over the same members, and agrees to everything (the other
//! nodes are the test itself, which drives each node's calls).

use engine::cluster::{Coordinator, SyncKind};
use std::ops::Range;

/// The node in bitmap slot `.0`.
#[derive(Debug)]
pub struct SlotNode(pub usize);

impl Coordinator for SlotNode {
    fn slot_number(&self) -> usize {
        self.0
    }
    fn write_refusal(&self) -> Option<String> {
        None
    }
    fn shares_metadata(&self) -> bool {
        true
    }
    fn member_failed(&self, _dev_number: u32) {}
    fn sync_refusal(&self) -> Option<String> {
        None
    }
    fn recovery_allowed(&self) -> bool {
        true
    }
    fn recovery_starts(&self) -> bool {
        true
    }
    fn recovery_paused(&self) {}
    fn metadata_update_start(&self) {}
    fn metadata_update_finish(&self, _events: u64) {}
    fn area_resyncing(&self, _range: Range<u64>) -> bool {
        false
    }
    fn resync_info_update(&self, _kind: SyncKind, _range: Range<u64>) {}
    fn resync_finish(&self) {}
    fn add_new_disk(&self, _device_uuid: [u8; 16]) -> engine::Result<()> {
        Ok(())
    }
    fn remove_disk(&self, _dev_number: u32) -> engine::Result<()> {
        Ok(())
    }
}
