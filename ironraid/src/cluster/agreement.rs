//! What the nodes of a cluster agree on before they act, through etcd (reference:
//! cluster-design.md §3.3, §3.4; md-cluster's token, METADATA_UPDATED and resync lock):
//!
//! * **Superblock updates** take the `token` key (bound to the node's lease) for their
//!   duration, so that two nodes never interleave superblock writes; the engine re-reads the
//!   event count under it.
//! * **A member failure** is recorded under `failed/<device number>`; every other node's
//!   watcher fails the member there too and acknowledges under `ack/<device number>/<node>`.
//!   The failing node returns only once every node whose lease lives has acknowledged: a write
//!   that skipped the member is acknowledged to its client after that (md-cluster's rule).
//! * **Background work** (resync, recovery, check) runs on the coordinator, and only while no
//!   other node is active: it holds the `sync` key (lease-bound) while it may run windows, and
//!   a node that joins waits until that key is gone before it serves. Windows locked on every
//!   node (the seed paper's extent-by-extent protocol) are not built yet; until they are,
//!   a second node's start pauses background work between two windows.

use super::etcd::{Compare, Op};
use super::node::Node;
use engine::Array;
use parking_lot::Mutex;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::{Duration, Instant};

/// How often a node looks for failures recorded by others, and waits between polls.
const POLL: Duration = Duration::from_millis(20);

#[derive(Default, Debug)]
pub struct State {
    /// The array this node serves (set once assembled): remote failures are applied to it.
    array: OnceLock<Weak<Array>>,
    /// Failures (device numbers) this node has applied and acknowledged.
    applied: Mutex<HashSet<u32>>,
    /// This node holds the `sync` key.
    sync_held: AtomicBool,
    /// Nodes seen gone (lease ended), since when; and those whose slot was taken over since.
    gone_since: Mutex<HashMap<String, Instant>>,
    taken_over: Mutex<HashSet<String>>,
}

/// After a node's lease is gone, how long its slot is left alone: the node stopped its member
/// writes one second before its lease could end (`node.rs`), and a write it issued before then
/// may still be landing.
const TAKEOVER_GRACE: Duration = Duration::from_secs(1);

impl Node {
    fn key(&self, rest: &str) -> String {
        format!("{}{rest}", self.prefix)
    }

    /// Serve `array` from now on: failures other nodes record reach it.
    pub fn attach(self: &Arc<Self>, array: &Arc<Array>) {
        let _ = self.agreement.array.set(Arc::downgrade(array));
        let node = self.clone();
        std::thread::Builder::new()
            .name("cluster-watch".into())
            .spawn(move || node.watch_failures())
            .expect("spawn the cluster watcher");
    }

    /// Take the cluster-wide right to write superblocks (blocks until free).
    pub fn lock_metadata(&self) {
        let key = self.key("token");
        let t0 = Instant::now();
        let mut warned = false;
        loop {
            let got = self.etcd.txn(
                &[Compare::Absent(key.clone())],
                &[Op::Put {
                    key: key.clone(),
                    value: self.name.as_bytes().to_vec(),
                    lease: Some(self.lease),
                }],
                &[],
            );
            if got.is_ok_and(|r| r.succeeded) {
                return;
            }
            if !warned && t0.elapsed() > Duration::from_secs(5) {
                tracing::warn!(node = %self.name, "waiting for the cluster's metadata token");
                warned = true;
            }
            std::thread::sleep(POLL);
        }
    }

    pub fn unlock_metadata(&self) {
        if let Err(e) = self.etcd.delete(&self.key("token")) {
            // The key goes with the lease at the latest.
            tracing::warn!(node = %self.name, "cannot release the metadata token: {e:#}");
        }
    }

    /// This node recorded member `dev` faulty: record it for the others and wait until every
    /// node whose lease lives has acknowledged it.
    pub fn publish_failure(&self, dev: u32) {
        let failed = self.key(&format!("failed/{dev}"));
        let _ = self.etcd.txn(
            &[Compare::Absent(failed.clone())],
            &[Op::Put {
                key: failed,
                value: self.name.as_bytes().to_vec(),
                lease: None,
            }],
            &[],
        );
        self.acknowledge(dev);
        let acks = self.key(&format!("ack/{dev}/"));
        let t0 = Instant::now();
        let mut warned = false;
        loop {
            let waiting = match (self.live_nodes(), self.etcd.get_prefix(&acks)) {
                (Ok(live), Ok((acked, _))) => live
                    .into_iter()
                    .filter(|n| !acked.iter().any(|kv| kv.key[acks.len()..] == *n))
                    .collect::<Vec<_>>(),
                _ => vec!["(etcd unreachable)".to_string()],
            };
            if waiting.is_empty() {
                return;
            }
            if !warned && t0.elapsed() > Duration::from_secs(5) {
                tracing::warn!(node = %self.name, dev, ?waiting, "member failure not yet acknowledged by every node; degraded writes wait");
                warned = true;
            }
            std::thread::sleep(POLL);
        }
    }

    fn acknowledge(&self, dev: u32) {
        let ack = self.key(&format!("ack/{dev}/{}", self.name));
        match self.etcd.put(&ack, b"", None) {
            Ok(_) => {
                self.agreement.applied.lock().insert(dev);
            }
            Err(e) => tracing::warn!(node = %self.name, dev, "cannot acknowledge a failure: {e:#}"),
        }
    }

    /// Apply the failures other nodes record, until the node leaves.
    fn watch_failures(&self) {
        let prefix = self.key("failed/");
        while !self.stop.load(Ordering::Acquire) {
            if let Ok((kvs, _)) = self.etcd.get_prefix(&prefix) {
                for kv in kvs {
                    let Ok(dev) = kv.key[prefix.len()..].parse::<u32>() else {
                        continue;
                    };
                    if self.agreement.applied.lock().contains(&dev) {
                        continue;
                    }
                    let by = String::from_utf8_lossy(&kv.value).into_owned();
                    if let Some(array) = self.agreement.array.get().and_then(Weak::upgrade) {
                        array.member_failed_elsewhere(dev, &format!("failed on node {by}"));
                    }
                    self.acknowledge(dev);
                }
            }
            std::thread::sleep(POLL);
        }
    }

    /// The coordinator takes over the bitmap slot of every node whose lease is gone (md-cluster's
    /// `recover_slot`): the chunks it had dirty become this node's, and are resynced when this
    /// node may run background work. Once per death: a node seen active again is forgotten.
    pub(super) fn take_over_gone_slots(&self) {
        let nodes = self.nodes_in_view();
        {
            let mut since = self.agreement.gone_since.lock();
            let mut taken = self.agreement.taken_over.lock();
            for n in nodes.iter().filter(|n| n.state == "active") {
                since.remove(&n.name);
                taken.remove(&n.name);
            }
        }
        if !self.is_coordinator() {
            return;
        }
        let Some(array) = self.agreement.array.get().and_then(Weak::upgrade) else {
            return;
        };
        for n in nodes.iter().filter(|n| n.state == "gone") {
            let seen = *self
                .agreement
                .gone_since
                .lock()
                .entry(n.name.clone())
                .or_insert_with(Instant::now);
            if seen.elapsed() < TAKEOVER_GRACE || self.agreement.taken_over.lock().contains(&n.name)
            {
                continue;
            }
            match array.take_over_slot(n.slot as u32) {
                Ok(r) => {
                    tracing::info!(node = %self.name, gone = %n.name, slot = n.slot, adopted_chunks = r.adopted_chunks, "took over a gone node's bitmap slot");
                    self.agreement.taken_over.lock().insert(n.name.clone());
                }
                Err(e) => {
                    tracing::warn!(node = %self.name, gone = %n.name, slot = n.slot, "cannot take over the slot of a gone node: {e}")
                }
            }
        }
    }

    /// Why this node may not run background windows now (None: it holds the `sync` key and
    /// no other node is active).
    pub fn sync_refusal(&self) -> Option<String> {
        let held = self.agreement.sync_held.load(Ordering::Acquire);
        if !held {
            let others = self.others_active();
            if !others.is_empty() {
                return Some(format!(
                    "other nodes are active ({}): background work waits for them to leave",
                    others.join(", ")
                ));
            }
            if !self.is_coordinator() {
                return Some("another node coordinates background work".into());
            }
            if let Err(why) = self.take_sync_key() {
                return Some(why);
            }
        }
        // Fresh, not the last view: a node that joined since must not see windows rewritten.
        match self.live_nodes() {
            Ok(live) if live.iter().all(|n| *n == self.name) => None,
            Ok(live) => {
                self.release_sync_key();
                Some(format!(
                    "other nodes are active ({}): background work waits for them to leave",
                    live.join(", ")
                ))
            }
            Err(e) => Some(format!("cannot read the cluster's nodes: {e:#}")),
        }
    }

    fn take_sync_key(&self) -> Result<(), String> {
        let key = self.key("sync");
        let got = self
            .etcd
            .txn(
                &[Compare::Absent(key.clone())],
                &[Op::Put {
                    key,
                    value: self.name.as_bytes().to_vec(),
                    lease: Some(self.lease),
                }],
                &[],
            )
            .map_err(|e| format!("{e:#}"))?;
        if !got.succeeded {
            return Err("another node runs background work".into());
        }
        self.agreement.sync_held.store(true, Ordering::Release);
        Ok(())
    }

    fn release_sync_key(&self) {
        self.agreement.sync_held.store(false, Ordering::Release);
        if let Err(e) = self.etcd.delete(&self.key("sync")) {
            tracing::warn!(node = %self.name, "cannot release the sync key: {e:#}");
        }
    }

    /// A joining node waits until no other node runs background work (it could rewrite a
    /// window this node writes into).
    pub(super) fn wait_for_background_work_elsewhere(&self) -> anyhow::Result<()> {
        let key = self.key("sync");
        let t0 = Instant::now();
        let mut warned = false;
        loop {
            let (kvs, _) = self.etcd.get_prefix(&key)?;
            match kvs.iter().find(|kv| kv.key == key) {
                Some(kv) if kv.value != self.name.as_bytes() => {}
                _ => return Ok(()),
            }
            if !warned && t0.elapsed() > Duration::from_secs(2) {
                tracing::info!(node = %self.name, "waiting for another node's background work to pause");
                warned = true;
            }
            std::thread::sleep(POLL);
        }
    }
}
