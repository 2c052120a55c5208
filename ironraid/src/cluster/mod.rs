//! Cluster mode (issue 23): several `ironraid run` nodes on one array, coordinated through
//! etcd. This is the membership layer: a node joins with a lease and a bitmap slot, renews the
//! lease, fences itself when it cannot, and names its slot to the engine through
//! [`engine::cluster::Coordinator`]. What md-cluster does beyond membership (metadata updates
//! agreed by every node, resync rounds, takeover of a dead node's slot) is not built yet: the
//! coordinator's other calls keep a single node's behaviour (README, Status).

mod added;
mod agreement;
pub mod etcd;
pub mod node;
mod ownership;
mod settings;
mod windows;

use anyhow::{anyhow, bail, Context};
use device::Device;
use engine::cluster::{Coordinator, SyncKind};
pub use etcd::EtcdTls;
use etcd::{Compare, Etcd, Op};
use node::Node;
use serde::{Deserialize, Serialize};
use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

/// etcdctl's TLS options, for `https://` endpoints.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct EtcdTlsArgs {
    /// The CA etcd's certificate must chain to (https:// endpoints; default: the system's).
    #[arg(long, value_name = "FILE")]
    pub etcd_cacert: Option<std::path::PathBuf>,
    /// A client certificate for an etcd that requires one (with --etcd-key).
    #[arg(long, value_name = "FILE", requires = "etcd_key")]
    pub etcd_cert: Option<std::path::PathBuf>,
    #[arg(long, value_name = "FILE", requires = "etcd_cert")]
    pub etcd_key: Option<std::path::PathBuf>,
}

impl From<EtcdTlsArgs> for EtcdTls {
    fn from(a: EtcdTlsArgs) -> EtcdTls {
        EtcdTls {
            cacert: a.etcd_cacert,
            cert: a.etcd_cert,
            key: a.etcd_key,
        }
    }
}

/// How a node reaches its cluster (`run --cluster ENDPOINTS --node NAME`).
#[derive(Clone, Debug)]
pub struct ClusterArgs {
    /// etcd client URLs, comma-separated.
    pub endpoints: String,
    pub tls: EtcdTls,
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
    /// Parity levels: per-member bytes of the extents that have one writer at a time (the
    /// same on every node, so it is recorded here).
    #[serde(default = "default_extent_bytes")]
    extent_bytes: u64,
}

fn default_extent_bytes() -> u64 {
    ownership::DEFAULT_EXTENT_BYTES
}

fn meta_key(uuid: &str) -> String {
    format!("/ironraid/{uuid}/meta")
}

/// Before `create --cluster` writes anything: etcd answers.
pub fn check_reachable(endpoints: &str, tls: &EtcdTls) -> anyhow::Result<()> {
    Etcd::with_tls(endpoints, tls, ETCD_TIMEOUT)?
        .get_prefix("/ironraid/")
        .map(|_| ())
        .context("create --cluster")
}

/// Register a new clustered array in etcd (`create --cluster`): refused if its UUID is there.
pub fn register(
    endpoints: &str,
    tls: &EtcdTls,
    uuid: &[u8; 16],
    name: &str,
    level: layout::Level,
    nodes: usize,
) -> anyhow::Result<()> {
    let etcd = Etcd::with_tls(endpoints, tls, ETCD_TIMEOUT)?;
    let uuid = format::format_uuid(uuid);
    let record = ArrayRecord {
        name: name.to_string(),
        level: level.name().to_string(),
        nodes,
        extent_bytes: ownership::DEFAULT_EXTENT_BYTES,
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

/// `leave-cluster`: the array on `members` (stopped on every node) becomes one host's again.
pub fn leave(
    endpoints: Option<&str>,
    tls: &EtcdTls,
    members: &[std::path::PathBuf],
) -> anyhow::Result<()> {
    let devs = crate::member::Opener::new(device::OpenMode::ReadWrite).open_all(members)?;
    let sb = superblock_of(&devs)?;
    let uuid = format::format_uuid(&sb.set_uuid);
    let etcd = endpoints
        .map(|e| Etcd::with_tls(e, tls, ETCD_TIMEOUT))
        .transpose()?;
    if let Some(etcd) = &etcd {
        let (live, _) = etcd.get_prefix(&format!("/ironraid/{uuid}/nodes/"))?;
        if let Some(kv) = live.first() {
            bail!(
                "node {} of array '{}' is alive (its lease lives): stop every node first",
                kv.key.rsplit('/').next().unwrap_or("?"),
                sb.set_name
            );
        }
    }
    let report = engine::leave_cluster(&devs).map_err(|e| anyhow!("{e}"))?;
    if let Some(etcd) = &etcd {
        etcd.delete_prefix(&format!("/ironraid/{uuid}/"))
            .context("the array is converted; removing its etcd record failed")?;
    }
    println!(
        "{}: no longer clustered; {} node slot(s) gathered into one bitmap, {} dirty chunk(s)          to resync at the next start (events {})",
        sb.set_name, report.slots, report.dirty_chunks, report.events
    );
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
    let etcd = Etcd::with_tls(&args.endpoints, &args.tls, ETCD_TIMEOUT)?;
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
    if record.extent_bytes == 0 {
        node.leave();
        bail!("array {uuid}'s record in etcd has extents of 0 bytes");
    }
    node.ownership.set_extent_bytes(record.extent_bytes);
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

impl Coordinator for EtcdCoordinator {
    fn slot_number(&self) -> usize {
        self.node.slot
    }

    fn write_refusal(&self) -> Option<String> {
        self.node.fence.refusal()
    }

    /// Reads stop with writes: past the deadline the others may have taken this node's
    /// slot over and changed the member set without it.
    fn read_refusal(&self) -> Option<String> {
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

    /// Every node learns of the member rebuilt and of its progress from the rounds.
    fn recovery_allowed(&self) -> bool {
        true
    }

    fn recovery_starts(&self) -> bool {
        true
    }

    fn recovery_paused(&self) {}

    /// Other nodes keep their writes out of this node's windows with their range locks
    /// (`windows.rs`), which they take before their writes do: nothing waits here.
    fn area_resyncing(&self, _range: Range<u64>) -> bool {
        false
    }

    fn resync_info_update(&self, kind: SyncKind, range: Range<u64>) {
        self.node.announce_window(kind, range.start, range.end);
    }

    fn resync_finish(&self) {
        self.node.end_windows();
    }

    fn own_stripes(&self, range: Range<u64>) -> Result<(), String> {
        self.node.own_stripes(range)
    }

    fn release_stripes(&self, range: Range<u64>) {
        self.node.release_stripes(range);
    }

    /// Several nodes agree on a new member through its `added/` record (`added.rs`).
    fn add_new_disk(&self, _device_uuid: [u8; 16]) -> engine::Result<()> {
        Ok(())
    }

    /// A member re-added while other nodes run (or could start) is rebuilt whole: what they
    /// write meanwhile is dirty only in their own bitmap slots.
    fn alone(&self) -> bool {
        false
    }

    /// The others drop the member once this node's superblocks say it is gone (its
    /// `removed/` record, `added.rs`).
    fn remove_disk(&self, _dev_number: u32) -> engine::Result<()> {
        Ok(())
    }
}
