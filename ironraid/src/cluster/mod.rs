//! Cluster mode (issue 23): several `ironraid run` nodes on one array, coordinated through
//! etcd. This is the membership layer: a node joins with a lease and a bitmap slot, renews the
//! lease, fences itself when it cannot, and names its slot to the engine through
//! [`engine::cluster::Coordinator`]. What md-cluster does beyond membership (metadata updates
//! agreed by every node, resync rounds, takeover of a dead node's slot) is not built yet: the
//! coordinator's other calls keep a single node's behaviour (README, Status).

mod agreement;
pub mod etcd;
pub mod node;

use anyhow::{anyhow, bail, Context};
use device::Device;
use engine::cluster::{Coordinator, SyncKind};
use etcd::{Compare, Etcd, Op};
use node::Node;
use serde::{Deserialize, Serialize};
use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

/// How a node reaches its cluster (`run --cluster ENDPOINTS --node NAME`).
#[derive(Clone, Debug)]
pub struct ClusterArgs {
    /// etcd client URLs, comma-separated.
    pub endpoints: String,
    pub node: String,
    /// The node's lease: the others count it gone this long after its last renewal.
    pub lease_ttl: Duration,
}

/// How long one etcd call may take before the next endpoint is tried.
pub const ETCD_TIMEOUT: Duration = Duration::from_secs(2);

/// What `meta` records of the array when `create --cluster` registers it.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct ArrayRecord {
    name: String,
    level: String,
    /// Write-intent bitmap slots: the most nodes that may run the array at once.
    nodes: usize,
}

fn meta_key(uuid: &str) -> String {
    format!("/ironraid/{uuid}/meta")
}

/// Before `create --cluster` writes anything: etcd answers.
pub fn check_reachable(endpoints: &str) -> anyhow::Result<()> {
    Etcd::new(endpoints, ETCD_TIMEOUT)?
        .get_prefix("/ironraid/")
        .map(|_| ())
        .context("create --cluster")
}

/// Register a new clustered array in etcd (`create --cluster`): refused if its UUID is there.
pub fn register(
    endpoints: &str,
    uuid: &[u8; 16],
    name: &str,
    level: layout::Level,
    nodes: usize,
) -> anyhow::Result<()> {
    let etcd = Etcd::new(endpoints, ETCD_TIMEOUT)?;
    let uuid = format::format_uuid(uuid);
    let record = ArrayRecord {
        name: name.to_string(),
        level: level.name().to_string(),
        nodes,
    };
    let put = etcd.txn(
        &[Compare::Absent(meta_key(&uuid))],
        &[Op::Put {
            key: meta_key(&uuid),
            value: serde_json::to_vec(&record)?,
            lease: None,
        }],
        &[],
    )?;
    if !put.succeeded {
        bail!("array {uuid} is registered in this etcd cluster already");
    }
    Ok(())
}

/// The superblock of the first member that has one.
fn superblock_of(devs: &[Arc<dyn Device>]) -> anyhow::Result<format::Superblock> {
    devs.iter()
        .find_map(|d| engine::read_superblock(d.as_ref()).ok())
        .ok_or_else(|| anyhow!("no member carries an md superblock"))
}

/// Join the cluster of the array on `devs` as `args` says (None: the array must not be a
/// clustered one, which only its nodes may run). The node renews its lease from now on.
pub fn join(
    devs: &[Arc<dyn Device>],
    args: Option<&ClusterArgs>,
) -> anyhow::Result<Option<Arc<Node>>> {
    let sb = superblock_of(devs)?;
    let clustered = sb.feature_map & format::feature::CLUSTERED != 0;
    let Some(args) = args else {
        if clustered {
            bail!(
                "array '{}' is clustered: run it with --cluster ENDPOINTS --node NAME",
                sb.set_name
            );
        }
        return Ok(None);
    };
    if !clustered {
        bail!(
            "array '{}' was not created for a cluster (no per-node bitmaps): create it with              --cluster ENDPOINTS --nodes N",
            sb.set_name
        );
    }
    let uuid = format::format_uuid(&sb.set_uuid);
    let etcd = Etcd::new(&args.endpoints, ETCD_TIMEOUT)?;
    let (found, _) = etcd.get_prefix(&meta_key(&uuid))?;
    let meta = found
        .iter()
        .find(|kv| kv.key == meta_key(&uuid))
        .ok_or_else(|| {
            anyhow!(
                "array {uuid} is not registered in etcd at {}",
                args.endpoints
            )
        })?;
    let record: ArrayRecord =
        serde_json::from_slice(&meta.value).context("the array's record in etcd")?;
    let node = Node::join(etcd, &uuid, &args.node, record.nodes, args.lease_ttl)?;
    let parity = matches!(sb.level, 4..=6);
    if parity {
        // Two nodes writing parts of one stripe would both rewrite its parity: until extents
        // have one owner each, a parity array has one node at a time.
        let others: Vec<String> = node
            .live_nodes()?
            .into_iter()
            .filter(|n| *n != args.node)
            .collect();
        if !others.is_empty() {
            node.leave();
            bail!(
                "array '{}' is RAID{}: its nodes cannot write one stripe's parity together yet \
                 (extent ownership is not built), and node {} runs it now",
                sb.set_name,
                sb.level,
                others.join(", ")
            );
        }
    }
    node.spawn_keeper();
    Ok(Some(node))
}

/// The coordinator the engine asks, for `node`.
pub fn coordinator(node: &Arc<Node>) -> Arc<dyn Coordinator> {
    Arc::new(EtcdCoordinator { node: node.clone() })
}

/// The engine's view of this node's membership.
#[derive(Debug)]
pub struct EtcdCoordinator {
    pub node: Arc<Node>,
}

impl EtcdCoordinator {
    /// Member adds and removes are not put to the other nodes' vote yet: they are allowed
    /// while this node is the only one whose lease lives.
    fn alone(&self, what: &str) -> engine::Result<()> {
        let live = self
            .node
            .live_nodes()
            .map_err(|e| engine::EngineError::Busy(format!("{what}: {e:#}")))?;
        if live.iter().all(|n| *n == self.node.name) {
            return Ok(());
        }
        Err(engine::EngineError::Unsupported(format!(
            "{what} is not agreed across a cluster's nodes yet: stop the other nodes ({}) first",
            live.join(", ")
        )))
    }
}

impl Coordinator for EtcdCoordinator {
    fn slot_number(&self) -> usize {
        self.node.slot
    }

    fn write_refusal(&self) -> Option<String> {
        self.node.fence.refusal()
    }

    fn metadata_update_start(&self) {
        self.node.lock_metadata();
    }

    fn metadata_update_finish(&self, _events: u64) {
        self.node.unlock_metadata();
    }

    fn shares_metadata(&self) -> bool {
        true
    }

    fn member_failed(&self, dev_number: u32) {
        self.node.publish_failure(dev_number);
    }

    fn sync_refusal(&self) -> Option<String> {
        self.node.sync_refusal()
    }

    /// No node runs windows while another is active (see `agreement.rs`), so none waits.
    fn area_resyncing(&self, _range: Range<u64>) -> bool {
        false
    }

    fn resync_info_update(&self, _kind: SyncKind, _range: Range<u64>) {}

    fn resync_finish(&self) {}

    fn add_new_disk(&self, _device_uuid: [u8; 16]) -> engine::Result<()> {
        self.alone("adding a member")
    }

    fn remove_disk(&self, _dev_number: u32) -> engine::Result<()> {
        self.alone("removing a member")
    }
}
