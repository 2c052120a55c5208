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
//! * **Background work** (resync, recovery, check) runs on the coordinator, which holds the
//!   `sync` key (lease-bound). Each window is locked on every node first (`windows.rs`).
//!   Rebuilding a member needs more: the other nodes would not know of it, so a rebuild runs
//!   only while no other node's lease lives; the key then says "recovery", a node that starts
//!   waits until it says otherwise, and one that started just before is seen by the rebuild,
//!   which stops between two windows with its progress recorded.

use super::etcd::{Compare, Op};
use super::node::Node;
use engine::Array;
use parking_lot::Mutex;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::{Duration, Instant};

/// What the `sync` key says its holder does (md-cluster's resync lock): background work.
const BACKGROUND: &str = "background";

fn sync_value(node: &str, mode: &str) -> Vec<u8> {
    format!("{node} {mode}").into_bytes()
}

/// How often a node looks for failures recorded by others, and waits between polls.
const POLL: Duration = Duration::from_millis(20);
/// How often a node holding another node's background window looks for the next round, and
/// the first pause of a node waiting for the others' acknowledgements (doubling up to `POLL`).
const ROUND_POLL: Duration = Duration::from_millis(2);

#[derive(Default, Debug)]
pub struct State {
    /// The array this node serves (set once assembled): remote failures are applied to it.
    array: OnceLock<Weak<Array>>,
    /// Failures (device numbers) this node has applied and acknowledged.
    pub(super) applied: Mutex<HashSet<u32>>,
    /// This node holds the `sync` key.
    sync_held: AtomicBool,
    /// Nodes seen gone (lease ended), since when; and those whose slot was taken over since.
    gone_since: Mutex<HashMap<String, Instant>>,
    taken_over: Mutex<HashSet<String>>,
    /// Gone nodes whose slot this node took over and whose chunks it still resyncs (each
    /// shown to every node by a `recovering/<node>` key bound to this node's lease).
    recovering: Mutex<HashSet<String>>,
    /// Members added by any node that this node has (`added.rs`), and how it opens them.
    pub(super) seen_added: Mutex<HashSet<u32>>,
    pub(super) seen_removed: Mutex<HashSet<u32>>,
    pub(super) opener: OnceLock<crate::member::Opener>,
    /// The level rebuilds while several nodes serve (RAID1, RAID4/5/6).
    /// The `speed` record this node applied last (its mod revision).
    pub(super) speed_revision: std::sync::atomic::AtomicI64,
    /// Forwarded `action` requests: the last one this node took as coordinator, the one it
    /// runs for another node, and the one it asked for (`settings.rs`).
    pub(super) action_revision: std::sync::atomic::AtomicI64,
    pub(super) serving: Mutex<Option<super::settings::Serving>>,
    pub(super) asked: Mutex<Option<super::settings::Asked>>,
}

/// After a node's lease is gone, how long its slot is left alone: the node stopped its member
/// writes one second before its lease could end (`node.rs`), and a write it issued before then
/// may still be landing.
const TAKEOVER_GRACE: Duration = Duration::from_secs(1);

impl Node {
    pub(super) fn key(&self, rest: &str) -> String {
        format!("{}{rest}", self.prefix)
    }

    /// Serve `array` from now on: failures other nodes record reach it.
    /// Before it returns, this node holds the window another node's background walk works on
    /// (so it serves nothing there).
    pub fn attach(self: &Arc<Self>, array: &Arc<Array>) {
        let _ = self.agreement.array.set(Arc::downgrade(array));
        // Rate limits recorded before this node started are not its: its own command line's
        // (or md's defaults) are, as md's sysfs limits are each host's. Requests from before
        // it started were answered by the coordinator then.
        self.newer_record("speed", &self.agreement.speed_revision);
        self.newer_record("action", &self.agreement.action_revision);
        if array.geometry().level().is_parity() {
            self.spawn_handoffs();
        }
        let hold = self.follow_round(array, None);
        let node = self.clone();
        let array = Arc::downgrade(array);
        std::thread::Builder::new()
            .name("cluster-watch".into())
            .spawn(move || node.watch(array, hold))
            .expect("spawn the cluster watcher");
    }

    /// The array this node serves, once attached and while it runs.
    pub(super) fn served_array(&self) -> Option<Arc<Array>> {
        self.agreement.array.get().and_then(Weak::upgrade)
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
            // A fenced node will not write the superblocks: stop waiting (the engine asks).
            if got.is_ok_and(|r| r.succeeded) || self.fence.refusal().is_some() {
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
        self.wait_for_every_node(
            &self.key(&format!("ack/{dev}/")),
            &[],
            "member failure acknowledged (degraded writes wait)",
        );
    }

    /// Wait until every other node whose lease lives has a key `<acks><node>` holding
    /// `value` (any value if empty), rereading both each poll.
    pub(super) fn wait_for_every_node(&self, acks: &str, value: &[u8], what: &str) {
        let t0 = Instant::now();
        let mut warned = false;
        let mut pause = ROUND_POLL;
        loop {
            let waiting: Vec<String> = match (self.live_nodes(), self.etcd.get_prefix(acks)) {
                (Ok(live), Ok((acked, _))) => live
                    .into_iter()
                    .filter(|n| *n != self.name)
                    .filter(|n| {
                        !acked.iter().any(|kv| {
                            kv.key[acks.len()..] == **n && (value.is_empty() || kv.value == value)
                        })
                    })
                    .collect(),
                _ => vec!["(etcd unreachable)".into()],
            };
            // A fenced node writes nothing more (the engine refuses its writes): what it waited
            // for no longer matters, and the walk or stop behind it must go on.
            if waiting.is_empty() || self.fence.refusal().is_some() {
                return;
            }
            if !warned && t0.elapsed() > Duration::from_secs(5) {
                tracing::warn!(node = %self.name, ?waiting, "waiting for every node: {what}");
                warned = true;
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(POLL);
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

    /// Apply the failures other nodes record and follow the coordinator's windows, until the
    /// node leaves.
    /// While it holds another node's window, it looks for the next round every
    /// [`ROUND_POLL`]: the coordinator waits for that, and client writes into the window wait
    /// for the coordinator.
    fn watch(&self, array: Weak<Array>, mut hold: Option<super::windows::Hold>) {
        let mut last_look = Instant::now() - POLL;
        while !self.stop.load(Ordering::Acquire) {
            let a = array.upgrade();
            if last_look.elapsed() >= POLL {
                last_look = Instant::now();
                self.apply_failures();
                if let Some(a) = &a {
                    self.apply_added(a);
                    self.apply_removed(a);
                    self.apply_speed(a);
                    self.serve_actions(a);
                    self.follow_asked(a);
                }
            }
            if let Some(a) = &a {
                hold = self.follow_round(a, hold);
            }
            drop(a);
            let in_window = hold.as_ref().is_some_and(|h| h.holds_window());
            std::thread::sleep(if in_window { ROUND_POLL } else { POLL });
        }
    }

    fn apply_failures(&self) {
        let prefix = self.key("failed/");
        {
            if let Ok((kvs, _)) = self.etcd.get_prefix(&prefix) {
                for kv in kvs {
                    let Ok(dev) = kv.key[prefix.len()..].parse::<u32>() else {
                        continue;
                    };
                    if self.agreement.applied.lock().contains(&dev) {
                        continue;
                    }
                    let by = String::from_utf8_lossy(&kv.value).into_owned();
                    if let Some(array) = self.served_array() {
                        array.member_failed_elsewhere(dev, &format!("failed on node {by}"));
                    }
                    self.acknowledge(dev);
                }
            }
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
        let Some(array) = self.served_array() else {
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
            let recovering = self.key(&format!("recovering/{}", n.name));
            if let Err(e) = self.etcd.put(&recovering, b"", Some(self.lease)) {
                tracing::warn!(node = %self.name, gone = %n.name, "cannot show the takeover: {e:#}");
            }
            self.agreement.recovering.lock().insert(n.name.clone());
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

    /// The gone nodes whose chunks this node resynced since it took their slots over are
    /// shown as gone again (their `recovering/` keys go) once nothing is owed any more.
    pub(super) fn end_finished_takeovers(&self) {
        let Some(array) = self.served_array() else {
            return;
        };
        let st = array.status();
        let owed = st.bitmap.as_ref().is_some_and(|b| b.needed_chunks > 0)
            || st.sync.action != engine::SyncAction::Idle;
        if owed {
            return;
        }
        let done: Vec<String> = self.agreement.recovering.lock().drain().collect();
        for name in done {
            if let Err(e) = self.etcd.delete(&self.key(&format!("recovering/{name}"))) {
                tracing::warn!(node = %self.name, gone = %name, "cannot end the takeover's state: {e:#}");
            }
        }
    }

    /// Why this node may not run background windows now (None: it is the coordinator and
    /// holds the `sync` key, which names who runs background work and whether it rebuilds).
    pub fn sync_refusal(&self) -> Option<String> {
        if !self.is_coordinator() {
            self.agreement.sync_held.store(false, Ordering::Release);
            return Some("another node coordinates background work".into());
        }
        if self.agreement.sync_held.load(Ordering::Acquire) {
            return None;
        }
        let key = self.key("sync");
        let got = self.etcd.txn(
            &[Compare::Absent(key.clone())],
            &[Op::Put {
                key,
                value: sync_value(&self.name, BACKGROUND),
                lease: Some(self.lease),
            }],
            &[],
        );
        match got {
            Ok(r) if r.succeeded => {
                self.agreement.sync_held.store(true, Ordering::Release);
                None
            }
            Ok(_) => Some("another node runs background work".into()),
            Err(e) => Some(format!("{e:#}")),
        }
    }
}
