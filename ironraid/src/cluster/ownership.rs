//! RAID4/5/6 with several writers (cluster-design.md §3.6): one writer per extent at a time.
//!
//! Two nodes writing different chunks of one stripe would each read-modify-write its parity
//! from what they read, and one would undo the other's; a degraded read reconstructs from
//! parity another node may be rewriting. So the stripes are cut into extents (a fixed number of
//! per-member bytes, the same on every node: it is in the array's etcd record) and each has at
//! most one owner, recorded under `own/<extent>` as "<node> <epoch>". Only the owner writes the
//! extent's stripes or reads them degraded; any node reads healthy data chunks directly (the
//! stripe cache keeps no stripe once its writers are done, so there is nothing stale to serve).
//!
//! * **Claim**: the first write to an extent puts `own/<extent>` if it is absent (one txn).
//!   From then on the node writes there with no etcd call at all, until asked to give it up.
//! * **Hand-off**: a node that wants an owned extent puts `want/<extent>/<node>` (bound to its
//!   lease). The owner, after holding the extent at least [`MIN_HOLD`] (so two busy nodes do
//!   not bounce it on every write), stops new writers there, waits for those in flight, flushes
//!   the members (what it acknowledged is durable and visible to every host before the other
//!   writes around it), and then puts `own/<extent>` = the requester, guarded by the record's
//!   mod revision.
//! * **A gone owner**: a record naming a node whose lease is gone (or an earlier epoch of a
//!   node) is replaced by a claimer [`GONE_GRACE`] after it first saw it so: the owner stopped
//!   its member writes a second before its lease could end (`node.rs`). What that node left torn
//!   is in its bitmap slot, which the coordinator takes over and resyncs; a read-modify-write
//!   meanwhile keeps the data right (the parity stays owed to that resync).
//! * The records are not lease-bound: the grace above must start from the claimer's sight of a
//!   dead owner, and a restarted node finds its old records by their epoch.
//!
//! Deadlock freedom: a caller owns all the extents of its range at once or none; it waits for
//! a missing one holding no other. The hand-off waits only for writers that own their whole
//! range already, and those wait for nothing the hand-off holds.

use super::etcd::{Compare, Op};
use super::node::Node;
use parking_lot::{Condvar, Mutex};
use std::collections::HashMap;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The least time a node keeps an extent it got before handing it on.
const MIN_HOLD: Duration = Duration::from_millis(50);
/// After a claimer first sees an extent's owner gone, how long it leaves the record alone.
const GONE_GRACE: Duration = Duration::from_secs(1);
/// How often the owner looks for hand-off requests, and the longest a claimer waits between
/// two looks at a record.
const POLL: Duration = Duration::from_millis(10);

/// Per-member bytes of an extent when the array's record names none.
pub const DEFAULT_EXTENT_BYTES: u64 = 16 << 20;

#[derive(Debug)]
enum Extent {
    /// A thread of this node is getting it from etcd.
    Claiming,
    /// This node owns it: `users` callers use it now; `giving` stops new ones.
    Owned {
        users: usize,
        since: Instant,
        /// `own/<extent>`'s mod revision when this node got it.
        revision: i64,
        giving: bool,
    },
}

/// This node's extents.
#[derive(Debug, Default)]
pub struct Ownership {
    extent_bytes: OnceLock<u64>,
    table: Mutex<HashMap<u64, Extent>>,
    changed: Condvar,
    /// Extents got from etcd, and handed to other nodes, since the node started.
    pub claims: AtomicU64,
    pub handoffs: AtomicU64,
}

impl Ownership {
    /// Set once, from the array's record, before the first claim.
    pub fn set_extent_bytes(&self, bytes: u64) {
        assert!(bytes > 0, "an extent of no bytes");
        let _ = self.extent_bytes.set(bytes);
    }

    fn extents(&self, range: &Range<u64>) -> Range<u64> {
        let e = *self
            .extent_bytes
            .get()
            .expect("the extent size is set when the node joins");
        assert!(range.start < range.end, "owning an empty range");
        range.start / e..(range.end - 1) / e + 1
    }

    /// How many extents this node owns (status and metrics).
    pub fn owned(&self) -> usize {
        self.table
            .lock()
            .values()
            .filter(|e| matches!(e, Extent::Owned { .. }))
            .count()
    }
}

fn record(name: &str, epoch: i64) -> Vec<u8> {
    format!("{name} {epoch}").into_bytes()
}

fn parse_record(value: &[u8]) -> Option<(String, i64)> {
    let s = std::str::from_utf8(value).ok()?;
    let (name, epoch) = s.rsplit_once(' ')?;
    Some((name.to_string(), epoch.parse().ok()?))
}

impl Node {
    fn own_key(&self, extent: u64) -> String {
        self.key(&format!("own/{extent}"))
    }

    fn want_prefix(&self) -> String {
        self.key("want/")
    }

    /// Return once this node owns every extent of per-member bytes `range`, each counting one
    /// more user until [`Node::release_stripes`]; Err if the node is fenced.
    pub fn own_stripes(&self, range: Range<u64>) -> Result<(), String> {
        let o = &self.ownership;
        let extents = o.extents(&range);
        let mut t = o.table.lock();
        loop {
            let missing = extents
                .clone()
                .find(|e| !matches!(t.get(e), Some(Extent::Owned { giving: false, .. })));
            let Some(e) = missing else {
                for e in extents {
                    if let Some(Extent::Owned { users, .. }) = t.get_mut(&e) {
                        *users += 1;
                    }
                }
                return Ok(());
            };
            if t.contains_key(&e) {
                // Being claimed by another thread here, or handed away: look again then.
                o.changed.wait_for(&mut t, POLL);
                continue;
            }
            t.insert(e, Extent::Claiming);
            let got = parking_lot::MutexGuard::unlocked(&mut t, || self.claim(e));
            match got {
                Ok(revision) => {
                    o.claims.fetch_add(1, Ordering::Relaxed);
                    t.insert(
                        e,
                        Extent::Owned {
                            users: 0,
                            since: Instant::now(),
                            revision,
                            giving: false,
                        },
                    );
                    o.changed.notify_all();
                }
                Err(why) => {
                    t.remove(&e);
                    o.changed.notify_all();
                    return Err(why);
                }
            }
        }
    }

    /// The callers of [`Node::own_stripes`] for `range` are done with it.
    pub fn release_stripes(&self, range: Range<u64>) {
        let o = &self.ownership;
        let mut t = o.table.lock();
        for e in o.extents(&range) {
            match t.get_mut(&e) {
                Some(Extent::Owned { users, .. }) if *users > 0 => *users -= 1,
                other => panic!("extent {e} released without a user: {other:?}"),
            }
        }
        o.changed.notify_all();
    }

    /// Get `own/<extent>` in etcd; its mod revision then. Blocks while another node owns it.
    fn claim(&self, extent: u64) -> Result<i64, String> {
        let key = self.own_key(extent);
        let mine = record(&self.name, self.epoch);
        let want = format!("{}{extent}/{}", self.want_prefix(), self.name);
        let mut asked = false;
        let mut gone_since: Option<Instant> = None;
        let t0 = Instant::now();
        let mut warned = false;
        let mut pause = Duration::from_millis(1);
        let got = loop {
            if let Some(why) = self.fence.refusal() {
                break Err(why);
            }
            match self.try_claim(&key, &mine, &mut gone_since) {
                Ok(Some(revision)) => break Ok(revision),
                Ok(None) => {}
                Err(e) => tracing::warn!(node = %self.name, extent, "claiming an extent: {e:#}"),
            }
            if !asked {
                // The owner lives (or the record was unreadable): ask it to hand over.
                asked = self.etcd.put(&want, &mine, Some(self.lease)).is_ok();
            }
            if !warned && t0.elapsed() > Duration::from_secs(5) {
                tracing::warn!(node = %self.name, extent, "waiting for another node to hand an extent over");
                warned = true;
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(POLL);
        };
        if asked {
            // It goes with the lease at the latest.
            let _ = self.etcd.delete(&want);
        }
        got
    }

    /// One look at `own/<extent>`: Some(revision) if this node has it now.
    fn try_claim(
        &self,
        key: &str,
        mine: &[u8],
        gone_since: &mut Option<Instant>,
    ) -> anyhow::Result<Option<i64>> {
        let put = Op::Put {
            key: key.to_string(),
            value: mine.to_vec(),
            lease: None,
        };
        let created = self.etcd.txn(
            &[Compare::Absent(key.to_string())],
            std::slice::from_ref(&put),
            &[],
        )?;
        if created.succeeded {
            return Ok(Some(created.revision));
        }
        let Some(kv) = self.etcd.get(key)? else {
            return Ok(None);
        };
        if kv.value == mine {
            // Handed to this node.
            return Ok(Some(kv.mod_revision));
        }
        let owner_lives = match parse_record(&kv.value) {
            Some((name, epoch)) => self
                .etcd
                .get(&format!("{}nodes/{name}", self.prefix))?
                .is_some_and(|n| n.create_revision == epoch),
            None => false,
        };
        if owner_lives {
            *gone_since = None;
            return Ok(None);
        }
        if gone_since.get_or_insert_with(Instant::now).elapsed() < GONE_GRACE {
            return Ok(None);
        }
        let taken = self.etcd.txn(
            &[Compare::ModRevision(key.to_string(), kv.mod_revision)],
            &[put],
            &[],
        )?;
        if taken.succeeded {
            tracing::info!(node = %self.name, key, owner = %String::from_utf8_lossy(&kv.value),
                "took over the extent of a gone owner");
        }
        Ok(taken.succeeded.then_some(taken.revision))
    }

    /// Hand extents over to the nodes that ask, until the node leaves (its own thread: a
    /// hand-off waits for this node's writers there, which may wait for a window the
    /// cluster watcher holds).
    pub(super) fn spawn_handoffs(self: &std::sync::Arc<Self>) {
        let node = self.clone();
        std::thread::Builder::new()
            .name("cluster-owner".into())
            .spawn(move || {
                while !node.stop.load(Ordering::Acquire) {
                    node.serve_requests();
                    std::thread::sleep(POLL);
                }
            })
            .expect("spawn the extent hand-off thread");
    }

    fn serve_requests(&self) {
        let prefix = self.want_prefix();
        let Ok((wants, _)) = self.etcd.get_prefix(&prefix) else {
            return;
        };
        for kv in wants {
            let Some((extent, asker)) = kv.key[prefix.len()..].split_once('/') else {
                continue;
            };
            let Ok(extent) = extent.parse::<u64>() else {
                continue;
            };
            if asker != self.name {
                self.hand_over(extent, &kv.value);
            }
        }
    }

    /// Give `extent` to the node whose record is `to`, if this node owns it (long enough).
    fn hand_over(&self, extent: u64, to: &[u8]) {
        let o = &self.ownership;
        let mut t = o.table.lock();
        let revision = match t.get_mut(&extent) {
            Some(Extent::Owned {
                since,
                revision,
                giving,
                ..
            }) if !*giving && since.elapsed() >= MIN_HOLD => {
                *giving = true;
                *revision
            }
            _ => return,
        };
        while matches!(t.get(&extent), Some(Extent::Owned { users, .. }) if *users > 0) {
            o.changed.wait(&mut t);
        }
        drop(t);
        // What this node acknowledged there is on the members, durable, before another node
        // reads around it to compute parity.
        if let Some(array) = self.served_array() {
            if let Err(e) = array.flush() {
                tracing::warn!(node = %self.name, extent, "flush before a hand-off: {e}");
            }
        }
        let key = self.own_key(extent);
        let handed = self.etcd.txn(
            &[Compare::ModRevision(key.clone(), revision)],
            &[Op::Put {
                key,
                value: to.to_vec(),
                lease: None,
            }],
            &[],
        );
        if !handed.as_ref().is_ok_and(|r| r.succeeded) {
            // Taken from this node as a gone owner's, or etcd did not answer: either way this
            // node no longer writes there without claiming it again.
            tracing::warn!(node = %self.name, extent, ?handed, "extent hand-off not recorded");
        }
        o.handoffs.fetch_add(1, Ordering::Relaxed);
        o.table.lock().remove(&extent);
        o.changed.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_name_a_node_and_its_epoch() {
        assert_eq!(
            parse_record(&record("node a", 42)),
            Some(("node a".into(), 42))
        );
        assert_eq!(parse_record(b"a"), None);
        assert_eq!(parse_record(b"a x"), None);
    }
}
