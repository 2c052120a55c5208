//! The facade's sync operations: md's `sync_action` and friends, and the threads that run
//! background work. The walker itself is `background/`; these hand it the parts.

use super::Array;
use crate::background::SyncStatus;
use crate::work::SyncAction;
use std::sync::Arc;
use std::time::Duration;

impl Array {
    /// Start the background worker (recovery, resync, scrub). Stopped by [`Array::close`].
    pub fn start_background(self: &Arc<Self>) {
        let me = self.clone();
        let handle = std::thread::Builder::new()
            .name(format!("sync-{}", self.name))
            .spawn(move || me.sync.run(&me.parts))
            .expect("spawn the background sync thread");
        self.sync.started(handle);
        if self.policy.bitmap().is_some() {
            let me = self.clone();
            let handle = std::thread::Builder::new()
                .name(format!("bitmap-{}", self.name))
                .spawn(move || {
                    if let Some(bm) = me.policy.bitmap() {
                        bm.daemon(&me.parts);
                    }
                })
                .expect("spawn the bitmap daemon");
            self.sync.policy_started(handle);
        }
        if self.policy.journal().is_some() {
            let me = self.clone();
            let handle = std::thread::Builder::new()
                .name(format!("journal-{}", self.name))
                .spawn(move || {
                    if let Some(j) = me.policy.journal() {
                        j.daemon(&me.parts);
                    }
                })
                .expect("spawn the journal reclaim thread");
            self.sync.policy_started(handle);
        }
    }

    /// Request `check`, `repair`, `resync`, `idle` or `frozen` (md's `sync_action`).
    pub fn request_action(&self, action: &str) -> crate::Result<()> {
        self.sync.request_action(&self.parts, action)
    }

    /// Set md's `sync_speed_min`/`sync_speed_max` (bytes per second).
    pub fn set_sync_speed(&self, min: Option<u64>, max: Option<u64>) {
        self.sync.set_speed(min, max);
    }

    pub fn sync_status(&self) -> SyncStatus {
        self.sync.status(&self.parts)
    }

    /// Block until no background action runs or is pending (tests, `action --wait`).
    pub fn wait_sync_idle(&self, timeout: Duration) -> bool {
        self.sync.wait_idle(&self.parts, timeout)
    }

    /// Run one window of background work on the calling thread: the deterministic simulation
    /// drives rebuild, resync and scrub with this instead of the background thread. Picks the
    /// next action as the thread would. Returns the action that ran, or `Idle` if none.
    pub fn sync_step(&self) -> SyncAction {
        self.sync.step(&self.parts)
    }
}
