//! One node's membership of a clustered array: its lease, its key, its bitmap slot, and the
//! deadline after which it must not write to the members any more.
//!
//! Keys (under `/ironraid/<array uuid>/`, reference: cluster-design.md §3.1):
//! * `nodes/<name>`: bound to the node's lease, so it goes when the node stops renewing; its
//!   create revision is the node's epoch (unique, monotonic: a fencing token);
//! * `slots/<k>`: the node name holding write-intent bitmap slot k; not lease-bound, so a dead
//!   node's slot stays its own until its dirty bits are taken over;
//! * `coord`: the coordinator's name, bound to its lease (first come; re-campaigned when gone).
//!
//! Self-fencing (§2.7): each keep-alive's *send* time `t` bounds the lease: etcd renewed it no
//! earlier than `t`, and a leader change only moves expiry later, so it lives at least until
//! `t + TTL·(1 − ρ)` on this node's clock. Member writes stop `MAX_IO` before that deadline;
//! past it, the node counts as fenced and refuses writes until it rejoins.

use super::etcd::{Compare, Etcd, Op};
use crate::status::{ClusterDetail, ClusterNode};
use anyhow::{anyhow, bail};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The most this node's clock may run fast against the etcd leader's, relatively.
const CLOCK_RATE_ERROR: f64 = 0.01;
/// The longest a member write may stay in flight: writes stop this long before the deadline.
const MAX_IO: Duration = Duration::from_secs(1);

/// What `nodes/<name>` holds.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct NodeRecord {
    slot: usize,
    pid: u32,
}

/// The cluster as this node last read it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct ClusterView {
    coordinator: Option<String>,
    nodes: Vec<ClusterNode>,
}

/// When this node may write to the members.
#[derive(Debug)]
pub struct Fence {
    deadline: Mutex<Instant>,
    fenced: AtomicBool,
}

impl Fence {
    fn new(deadline: Instant) -> Fence {
        Fence {
            deadline: Mutex::new(deadline),
            fenced: AtomicBool::new(false),
        }
    }

    /// A keep-alive sent at `sent` was answered with `ttl`.
    fn renewed(&self, sent: Instant, ttl: Duration) {
        let until = sent + ttl.mul_f64(1.0 - CLOCK_RATE_ERROR);
        let mut d = self.deadline.lock();
        *d = (*d).max(until);
    }

    fn lost(&self) {
        self.fenced.store(true, Ordering::Release);
    }

    /// None if member writes may start now; else why not.
    pub fn refusal(&self) -> Option<String> {
        if self.fenced.load(Ordering::Acquire) {
            return Some("this node lost its cluster lease (fenced): it must rejoin".into());
        }
        let deadline = *self.deadline.lock();
        if Instant::now() + MAX_IO >= deadline {
            return Some(
                "this node's cluster lease is not confirmed (etcd unreachable): no member I/O until it is"
                    .into(),
            );
        }
        None
    }
}

/// A joined node.
#[derive(Debug)]
pub struct Node {
    pub(super) etcd: Etcd,
    pub(super) prefix: String,
    pub name: String,
    pub slot: usize,
    pub epoch: i64,
    pub(super) lease: i64,
    ttl: Duration,
    pub fence: Arc<Fence>,
    view: Mutex<ClusterView>,
    pub(super) stop: AtomicBool,
    /// What the agreement with the other nodes needs (see `agreement.rs`).
    pub(super) agreement: super::agreement::State,
    /// The extents this node writes alone (parity levels; see `ownership.rs`).
    pub(super) ownership: super::ownership::Ownership,
    /// What the daemon does once the lease is gone for good (after the fence is up).
    on_lease_lost: std::sync::OnceLock<LeaseLostHook>,
}

struct LeaseLostHook(Box<dyn Fn() + Send + Sync>);

impl std::fmt::Debug for LeaseLostHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LeaseLostHook")
    }
}

impl Node {
    /// Join the array `uuid` (a UUID string) as `name`, taking one of `slots` bitmap slots.
    pub fn join(
        etcd: Etcd,
        uuid: &str,
        name: &str,
        slots: usize,
        ttl: Duration,
    ) -> anyhow::Result<Arc<Node>> {
        if name.is_empty() || name.contains('/') {
            bail!("node name '{name}' must be non-empty, without '/'");
        }
        let prefix = format!("/ironraid/{uuid}/");
        let sent = Instant::now();
        let (lease, granted) = etcd.lease_grant(ttl)?;
        let node_key = format!("{prefix}nodes/{name}");
        let joined = etcd.txn(
            &[Compare::Absent(node_key.clone())],
            &[Op::Put {
                key: node_key.clone(),
                value: Vec::new(),
                lease: Some(lease),
            }],
            &[],
        )?;
        if !joined.succeeded {
            let _ = etcd.lease_revoke(lease);
            bail!("node '{name}' is already active in this cluster (its lease is alive)");
        }
        let epoch = joined.revision;
        let slot = match claim_slot(&etcd, &prefix, name, slots) {
            Ok(s) => s,
            Err(e) => {
                let _ = etcd.lease_revoke(lease);
                return Err(e);
            }
        };
        let record = NodeRecord {
            slot,
            pid: std::process::id(),
        };
        etcd.put(&node_key, &serde_json::to_vec(&record)?, Some(lease))?;
        let node = Arc::new(Node {
            etcd,
            prefix,
            name: name.to_string(),
            slot,
            epoch,
            lease,
            ttl: granted,
            fence: Arc::new(Fence::new(sent + granted.mul_f64(1.0 - CLOCK_RATE_ERROR))),
            view: Mutex::new(ClusterView::default()),
            stop: AtomicBool::new(false),
            agreement: Default::default(),
            ownership: Default::default(),
            on_lease_lost: Default::default(),
        });
        node.campaign();
        node.refresh_view()?;
        tracing::info!(
            node = name,
            slot,
            epoch,
            ttl_s = granted.as_secs(),
            "joined the cluster"
        );
        Ok(node)
    }

    /// Run `hook` if the lease is ever found gone (the others may be taking this node's slot
    /// and extents over; it must come back as a new member of the cluster, a new epoch).
    pub fn on_lease_lost(&self, hook: impl Fn() + Send + Sync + 'static) {
        let _ = self.on_lease_lost.set(LeaseLostHook(Box::new(hook)));
    }

    /// The lease's keep-alive, coordinator campaign and view refresh, every third of the TTL,
    /// until `leave`.
    pub fn spawn_keeper(self: &Arc<Self>) -> std::thread::JoinHandle<()> {
        let node = self.clone();
        std::thread::Builder::new()
            .name("cluster".into())
            .spawn(move || node.keep())
            .expect("spawn the cluster thread")
    }

    fn keep(&self) {
        let period = (self.ttl / 3).max(Duration::from_millis(200));
        while !self.stop.load(Ordering::Acquire) {
            let sent = Instant::now();
            match self.etcd.lease_keep_alive(self.lease) {
                Ok(Some(ttl)) => self.fence.renewed(sent, ttl),
                Ok(None) => {
                    tracing::error!(node = %self.name, "cluster lease expired: fenced, writes refused");
                    self.fence.lost();
                    if let Some(hook) = self.on_lease_lost.get() {
                        (hook.0)();
                    }
                    return;
                }
                Err(e) => tracing::warn!(node = %self.name, "cluster keep-alive failed: {e:#}"),
            }
            self.campaign();
            match self.refresh_view() {
                Ok(()) => {
                    self.take_over_gone_slots();
                    self.end_finished_takeovers();
                }
                Err(e) => {
                    tracing::warn!(node = %self.name, "cannot read the cluster's state: {e:#}")
                }
            }
            std::thread::sleep(period.saturating_sub(sent.elapsed()));
        }
    }

    /// Become coordinator if there is none (the key goes with its holder's lease).
    fn campaign(&self) {
        let key = format!("{}coord", self.prefix);
        let _ = self.etcd.txn(
            &[Compare::Absent(key.clone())],
            &[Op::Put {
                key,
                value: self.name.as_bytes().to_vec(),
                lease: Some(self.lease),
            }],
            &[],
        );
    }

    pub(super) fn refresh_view(&self) -> anyhow::Result<()> {
        let (kvs, _) = self.etcd.get_prefix(&self.prefix)?;
        let mut view = ClusterView::default();
        let live: Vec<&str> = kvs
            .iter()
            .filter_map(|kv| kv.key.strip_prefix(&format!("{}nodes/", self.prefix)))
            .collect();
        for kv in &kvs {
            let rest = &kv.key[self.prefix.len()..];
            if rest == "coord" {
                view.coordinator = Some(String::from_utf8_lossy(&kv.value).into_owned());
            } else if let Some(slot) = rest.strip_prefix("slots/") {
                let name = String::from_utf8_lossy(&kv.value).into_owned();
                let recovering = format!("{}recovering/{name}", self.prefix);
                let state = if live.contains(&name.as_str()) {
                    "active"
                } else if kvs.iter().any(|kv| kv.key == recovering) {
                    "recovering"
                } else {
                    "gone"
                };
                view.nodes.push(ClusterNode {
                    slot: slot.parse().unwrap_or(usize::MAX),
                    state: state.into(),
                    name,
                });
            }
        }
        view.nodes.sort_by_key(|n| n.slot);
        *self.view.lock() = view;
        Ok(())
    }

    /// The nodes holding slots, as last read.
    pub(super) fn nodes_in_view(&self) -> Vec<ClusterNode> {
        self.view.lock().nodes.clone()
    }

    /// Whether another node's lease lives, as last read.
    pub(super) fn others_active(&self) -> Vec<String> {
        self.view
            .lock()
            .nodes
            .iter()
            .filter(|n| n.state == "active" && n.name != self.name)
            .map(|n| n.name.clone())
            .collect()
    }

    pub(super) fn is_coordinator(&self) -> bool {
        self.view.lock().coordinator.as_deref() == Some(self.name.as_str())
    }

    /// The names of the nodes whose lease lives now (read from etcd, not the last view).
    pub(super) fn live_nodes(&self) -> anyhow::Result<Vec<String>> {
        let prefix = format!("{}nodes/", self.prefix);
        let (kvs, _) = self.etcd.get_prefix(&prefix)?;
        Ok(kvs
            .iter()
            .filter_map(|kv| kv.key.strip_prefix(&prefix).map(str::to_string))
            .collect())
    }

    /// The cluster as last read (every third of the lease's TTL).
    fn view(&self) -> ClusterView {
        self.view.lock().clone()
    }

    /// What `detail` shows.
    pub fn detail(&self) -> ClusterDetail {
        let view = self.view();
        ClusterDetail {
            node: self.name.clone(),
            slot: self.slot,
            epoch: self.epoch,
            coordinator: view.coordinator,
            nodes: view.nodes,
            owned_extents: self.ownership.owned(),
            extent_claims: self.ownership.claims.load(Ordering::Relaxed),
            extent_handoffs: self.ownership.handoffs.load(Ordering::Relaxed),
        }
    }

    /// Leave cleanly: stop renewing and revoke the lease (its keys go at once; the slot stays
    /// this node's for its next start).
    pub fn leave(&self) {
        self.stop.store(true, Ordering::Release);
        if let Err(e) = self.etcd.lease_revoke(self.lease) {
            tracing::warn!(node = %self.name, "cannot revoke the cluster lease: {e:#}");
        }
    }
}

/// Take the slot already recorded for `name`, else the first free one of `slots`.
fn claim_slot(etcd: &Etcd, prefix: &str, name: &str, slots: usize) -> anyhow::Result<usize> {
    let (held, _) = etcd.get_prefix(&format!("{prefix}slots/"))?;
    if let Some(kv) = held.iter().find(|kv| kv.value == name.as_bytes()) {
        return kv.key[prefix.len() + "slots/".len()..]
            .parse()
            .map_err(|_| anyhow!("malformed slot key {}", kv.key));
    }
    for k in 0..slots {
        let key = format!("{prefix}slots/{k}");
        let put = etcd.txn(
            &[Compare::Absent(key.clone())],
            &[Op::Put {
                key,
                value: name.as_bytes().to_vec(),
                lease: None,
            }],
            &[],
        )?;
        if put.succeeded {
            return Ok(k);
        }
    }
    let holders: Vec<String> = held
        .iter()
        .map(|kv| String::from_utf8_lossy(&kv.value).into_owned())
        .collect();
    bail!(
        "all {slots} bitmap slots of this array are taken (by {}); a node's slot is freed only \
         after its dirty regions were taken over",
        holders.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use testkit::etcd::EtcdServer;

    const UUID: &str = "0a1b2c3d-0000-4000-8000-00000000beef";

    fn client(server: &EtcdServer) -> Etcd {
        Etcd::new(&server.endpoint, Duration::from_secs(2)).unwrap()
    }

    fn join(server: &EtcdServer, name: &str, slots: usize) -> anyhow::Result<Arc<Node>> {
        Node::join(client(server), UUID, name, slots, Duration::from_secs(2))
    }

    #[test]
    fn nodes_take_distinct_slots_and_a_name_joins_once() {
        let Some(etcd) = EtcdServer::start() else {
            return;
        };
        let a = join(&etcd, "a", 2).unwrap();
        let b = join(&etcd, "b", 2).unwrap();
        assert_ne!(a.slot, b.slot);
        assert!(
            b.epoch > a.epoch,
            "epochs are revisions: {} {}",
            a.epoch,
            b.epoch
        );
        let err = join(&etcd, "a", 2).unwrap_err().to_string();
        assert!(err.contains("already active"), "{err}");
        let err = join(&etcd, "c", 2).unwrap_err().to_string();
        assert!(err.contains("all 2 bitmap slots"), "{err}");
        b.refresh_view().unwrap();
        let view = b.view();
        assert_eq!(view.coordinator.as_deref(), Some("a"));
        let states: Vec<(&str, usize, &str)> = view
            .nodes
            .iter()
            .map(|n| (n.name.as_str(), n.slot, n.state.as_str()))
            .collect();
        assert_eq!(
            states,
            vec![("a", a.slot, "active"), ("b", b.slot, "active")]
        );
        // A clean leave frees the name at once; the slot stays the node's for its next start.
        a.leave();
        let again = join(&etcd, "a", 2).unwrap();
        assert_eq!(again.slot, a.slot);
        assert!(again.epoch > b.epoch, "a new epoch on rejoin");
    }

    #[test]
    fn a_node_that_stops_renewing_is_gone_for_the_others_and_fenced_by_its_own_clock() {
        let Some(etcd) = EtcdServer::start() else {
            return;
        };
        let dead = join(&etcd, "dead", 2).unwrap(); // no keeper: as if killed
        let live = join(&etcd, "live", 2).unwrap();
        let _keeper = live.spawn_keeper();
        assert_eq!(dead.fence.refusal(), None, "just joined: may write");
        let t0 = Instant::now();
        loop {
            let view = live.view();
            if view
                .nodes
                .iter()
                .any(|n| n.name == "dead" && n.state == "gone")
            {
                assert_eq!(view.coordinator.as_deref(), Some("live"), "{view:?}");
                break;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "never gone: {view:?}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        // Its own deadline came before etcd's expiry (TTL·(1−ρ) from the grant, less MAX_IO).
        assert!(dead.fence.refusal().is_some());
        assert_eq!(live.fence.refusal(), None, "the renewing node still writes");
        live.leave();
    }

    #[test]
    fn a_node_that_cannot_reach_etcd_stops_writing_before_its_lease_can_expire() {
        let Some(etcd) = EtcdServer::start() else {
            return;
        };
        let node = join(&etcd, "n", 1).unwrap();
        let _keeper = node.spawn_keeper();
        std::thread::sleep(Duration::from_millis(300));
        assert_eq!(node.fence.refusal(), None);
        etcd.pause(true);
        let paused = Instant::now();
        while node.fence.refusal().is_none() {
            assert!(paused.elapsed() < Duration::from_secs(3), "still writing");
            std::thread::sleep(Duration::from_millis(20));
        }
        // Refused at least MAX_IO before the lease could end on etcd's side.
        assert!(paused.elapsed() + MAX_IO <= Duration::from_secs(2) + Duration::from_millis(100));
        etcd.pause(false);
    }
}
