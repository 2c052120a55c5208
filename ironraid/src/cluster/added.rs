//! Members added and removed while several nodes run the array (md-cluster's NEWDISK and
//! REMOVE), and the rebuild that follows an add while they all serve.
//!
//! * A node that removes a member (a spare, or a faulty one) records `removed/<device
//!   number>` after its superblocks say so; every other node takes it out of its view too,
//!   so that none of its superblock writes names the member or reaches its device again.
//!
//! * The node that adds a member writes its superblock and the array's (the engine's `add`),
//!   then records `added/<device number>` = the path it opened (members are shared devices:
//!   the same path on every node, as md-cluster expects the same device on every host). A
//!   failure recorded earlier under that device number is forgotten first: it was another
//!   member's.
//! * Every other node's watcher opens that path and takes the member as a spare
//!   (`Array::member_added_elsewhere`).
//! * The coordinator rebuilds it window by window; each window's round names the member and
//!   its role, and a node holding it first counts everything below the window rebuilt
//!   (`windows.rs`). A node that has not seen the member yet opens it then, before it
//!   acknowledges.
//!
//! RAID10's recovery walks per-member bytes; a node holding one of its windows holds the
//! array bytes the window's chunks hold (`Array::hold_recovery_window`).

use super::node::Node;
use crate::member::Opener;
use engine::Array;
use std::path::Path;
use std::sync::Arc;

impl Node {
    fn added_key(&self, dev: u32) -> String {
        self.key(&format!("added/{dev}"))
    }

    /// This node added `path` as device number `dev`: let the others open it.
    pub fn publish_added(&self, dev: u32, path: &str) -> anyhow::Result<()> {
        self.forget_device_number(dev)?;
        self.etcd.put(&self.added_key(dev), path.as_bytes(), None)?;
        self.agreement.seen_added.lock().insert(dev);
        Ok(())
    }

    /// This node removed member `dev`: the others drop it too.
    pub fn publish_removed(&self, dev: u32) -> anyhow::Result<()> {
        self.forget_device_number(dev)?;
        self.etcd
            .put(&self.key(&format!("removed/{dev}")), b"", None)?;
        self.agreement.seen_removed.lock().insert(dev);
        Ok(())
    }

    /// What was recorded of an earlier member with device number `dev` (md reuses them): its
    /// failure, add and removal.
    fn forget_device_number(&self, dev: u32) -> anyhow::Result<()> {
        self.etcd.delete(&self.key(&format!("failed/{dev}")))?;
        self.etcd.delete_prefix(&self.key(&format!("ack/{dev}/")))?;
        self.etcd.delete(&self.added_key(dev))?;
        self.etcd.delete(&self.key(&format!("removed/{dev}")))?;
        self.agreement.applied.lock().remove(&dev);
        self.agreement.seen_added.lock().remove(&dev);
        self.agreement.seen_removed.lock().remove(&dev);
        Ok(())
    }

    /// The `<what>/<device number>` records in etcd, with their values.
    fn device_records(&self, what: &str) -> Vec<(u32, Vec<u8>)> {
        let prefix = self.key(&format!("{what}/"));
        let Ok((kvs, _)) = self.etcd.get_prefix(&prefix) else {
            return Vec::new();
        };
        kvs.into_iter()
            .filter_map(|kv| Some((kv.key[prefix.len()..].parse().ok()?, kv.value)))
            .collect()
    }

    /// Drop the members other nodes removed since the last look.
    pub(super) fn apply_removed(&self, array: &Arc<Array>) {
        for (dev, _) in self.device_records("removed") {
            if self.agreement.seen_removed.lock().insert(dev) {
                array.member_removed_elsewhere(dev);
                self.agreement.seen_added.lock().remove(&dev);
            }
        }
    }

    /// Open and take as spares the members other nodes added since the last look.
    pub(super) fn apply_added(&self, array: &Arc<Array>) {
        for (dev, path) in self.device_records("added") {
            if self.agreement.seen_added.lock().contains(&dev) {
                continue;
            }
            // Tried once: a path this node cannot open is said once, not every poll; the
            // first recovery round over the member tries again (`know_member`).
            self.take_added(array, dev, &String::from_utf8_lossy(&path));
            self.agreement.seen_added.lock().insert(dev);
        }
    }

    /// Member `dev` is rebuilt by another node: make sure this node has it (opened from its
    /// `added/` record if not). False if it cannot.
    pub(super) fn know_member(&self, array: &Arc<Array>, dev: u32) -> bool {
        if array.status().members.iter().any(|m| m.dev_number == dev) {
            return true;
        }
        match self.etcd.get(&self.added_key(dev)) {
            Ok(Some(kv)) => self.take_added(array, dev, &String::from_utf8_lossy(&kv.value)),
            Ok(None) => {
                tracing::error!(node = %self.name, dev, "a member rebuilt elsewhere was never recorded as added");
                false
            }
            Err(e) => {
                tracing::warn!(node = %self.name, dev, "cannot read a member added elsewhere: {e:#}");
                false
            }
        }
    }

    fn take_added(&self, array: &Arc<Array>, dev: u32, path: &str) -> bool {
        self.agreement.applied.lock().remove(&dev);
        self.agreement.seen_removed.lock().remove(&dev);
        let Some(opener) = self.agreement.opener.get() else {
            return false;
        };
        let opened = opener.open(Path::new(path));
        match opened.map(|d| array.member_added_elsewhere(d).map_err(anyhow::Error::from)) {
            Ok(Ok(())) => true,
            Ok(Err(e)) | Err(e) => {
                tracing::error!(node = %self.name, dev, path, "cannot use a member another node added: {e:#}");
                false
            }
        }
    }

    /// How this node opens members other nodes add (set once, when it attaches).
    pub fn set_opener(&self, opener: Opener) {
        let _ = self.agreement.opener.set(opener);
    }
}
