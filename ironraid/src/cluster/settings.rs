//! What `action` and `speed` mean on a node of a cluster (the contract: they act for the
//! whole cluster).
//!
//! * Background work runs on the coordinator only, so `action` is taken there; on another
//!   node it is refused with the coordinator's name (forwarding it, with `--wait` following
//!   the coordinator's progress, is not built).
//! * The rate limits are every node's (whichever coordinates next uses them): `speed` on any
//!   node records them under `speed` ("MIN MAX", bytes per second, `-` for unchanged), and
//!   every running node's watcher applies a new record (a node that starts later keeps its
//!   own command line's, as md's limits are each host's).

use super::node::Node;
use engine::Array;
use std::sync::atomic::Ordering;

impl Node {
    /// Why this node does not take `action` requests (None: it coordinates).
    pub fn action_refusal(&self, array: &str) -> Option<String> {
        if self.is_coordinator() {
            return None;
        }
        let coordinator = self
            .detail()
            .coordinator
            .unwrap_or_else(|| "(none elected yet)".into());
        Some(format!(
            "array '{array}' is clustered: background work runs on its coordinator, node \
             {coordinator}; run `action` there"
        ))
    }

    /// `speed` on this node: for every node of the cluster.
    pub fn publish_speed(&self, min: Option<u64>, max: Option<u64>) -> anyhow::Result<()> {
        let show = |v: Option<u64>| v.map_or("-".to_string(), |v| v.to_string());
        let value = format!("{} {}", show(min), show(max));
        let revision = self.etcd.put(&self.key("speed"), value.as_bytes(), None)?;
        // Applied here already.
        self.agreement
            .speed_revision
            .fetch_max(revision, Ordering::AcqRel);
        Ok(())
    }

    /// Apply a `speed` another node recorded since the last look.
    pub(super) fn apply_speed(&self, array: &Array) {
        let Ok(Some(kv)) = self.etcd.get(&self.key("speed")) else {
            return;
        };
        let seen = &self.agreement.speed_revision;
        if kv.mod_revision <= seen.load(Ordering::Acquire) {
            return;
        }
        seen.store(kv.mod_revision, Ordering::Release);
        let text = String::from_utf8_lossy(&kv.value).into_owned();
        let parse = |s: Option<&str>| s.and_then(|v| v.parse::<u64>().ok());
        let mut parts = text.split(' ');
        let (min, max) = (parse(parts.next()), parse(parts.next()));
        array.set_sync_speed(min, max.filter(|&m| m > 0));
        tracing::info!(node = %self.name, ?min, ?max, "rate limits set by another node");
    }
}
