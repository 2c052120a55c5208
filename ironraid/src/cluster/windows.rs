//! Background windows locked on every node (the seed paper's protocol, md-cluster's
//! RESYNCING messages; reference: cluster-design.md §3.4):
//!
//! 1. the coordinator puts the `round` key (`"<node> <lo> <hi>"`, sync coordinates; a recovery
//!    window adds `"recovery <device number> <role>"`) before it works on a window; the key's
//!    revision names the round;
//! 2. every other node's watcher drops its hold of the previous window, takes the new one with
//!    the engine's range lock (which waits for its client writes in flight there and keeps new
//!    ones out) and acknowledges the round under `round-ack/<node>`. Of a recovery window, it
//!    first counts the member rebuilt below the window, before its hold of the window before
//!    lets writes in there (`added.rs`); when the recovery's rounds end, it reads from the
//!    member's superblock how far it got;
//! 3. the coordinator works on the window once every node whose lease lives has acknowledged;
//! 4. the next round's put releases the window; an empty round (`"<node>"`) ends the walk.
//!
//! A node that joins takes the current window before it serves. A window whose coordinator's
//! lease is gone is let go.

use super::etcd::KeyValue;
use super::node::Node;
use engine::cluster::SyncKind;
use engine::Array;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

const POLL: Duration = Duration::from_millis(10);

/// A window of another node's background walk held on this node: client writes stay out of
/// it until this drops. The range lock is taken and released on a thread of its own (its
/// guard may not leave the thread that took it).
pub struct Hold {
    round: i64,
    /// The member a recovery window is rebuilding (device number).
    recovering: Option<u32>,
    release: Option<mpsc::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Hold {
    /// Hold `at..at + len` of `array` (of the member rebuilding `role`, for a recovery).
    fn take(array: Arc<Array>, round: i64, at: u64, len: u64, role: Option<usize>) -> Hold {
        let (held_tx, held_rx) = mpsc::channel();
        let (release, release_rx) = mpsc::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("cluster-window".into())
            .spawn(move || {
                let _window = match role {
                    Some(role) => array.hold_recovery_window(role, at, len),
                    None => array.hold_sync_window(at, len),
                };
                let _ = held_tx.send(());
                let _ = release_rx.recv();
            })
            .expect("spawn a window holder");
        let _ = held_rx.recv();
        Hold {
            round,
            recovering: None,
            release: Some(release),
            thread: Some(thread),
        }
    }
}

impl Hold {
    /// Does it keep writes out of a window (not just remember a round)?
    pub(super) fn holds_window(&self) -> bool {
        self.release.is_some()
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        drop(self.release.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A window of a round: sync coordinates `lo..hi`, and for a recovery the member rebuilt and
/// its role.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Window {
    lo: u64,
    hi: u64,
    recovery: Option<(u32, usize)>,
}

fn round_value(node: &str, kind: SyncKind, lo: u64, hi: u64) -> String {
    match kind {
        SyncKind::Resync => format!("{node} {lo} {hi}"),
        SyncKind::Recovery { dev_number, role } => {
            format!("{node} {lo} {hi} recovery {dev_number} {role}")
        }
    }
}

/// What a `round` key says: who works, and on which window (None: the walk ended).
fn parse_round(kv: &KeyValue) -> Option<(String, Option<Window>)> {
    let text = String::from_utf8_lossy(&kv.value).into_owned();
    let parts: Vec<&str> = text.split(' ').collect();
    let node = parts.first()?.to_string();
    let window = match parts[1..] {
        [] => None,
        [lo, hi] => Some(Window {
            lo: lo.parse().ok()?,
            hi: hi.parse().ok()?,
            recovery: None,
        }),
        [lo, hi, "recovery", dev, role] => Some(Window {
            lo: lo.parse().ok()?,
            hi: hi.parse().ok()?,
            recovery: Some((dev.parse().ok()?, role.parse().ok()?)),
        }),
        _ => return None,
    };
    Some((node, window))
}

impl Node {
    /// Announce the window `lo..hi` this node's walk works on next, and return once every
    /// other node whose lease lives holds it.
    pub fn announce_window(&self, kind: SyncKind, lo: u64, hi: u64) {
        self.put_round(&round_value(&self.name, kind, lo, hi), true);
    }

    /// The walk ended: release the last window everywhere.
    pub fn end_windows(&self) {
        self.put_round(&self.name, false);
    }

    fn put_round(&self, value: &str, wait: bool) {
        let key = format!("{}round", self.prefix);
        let round = match self.etcd.put(&key, value.as_bytes(), None) {
            Ok(r) => r,
            Err(e) => {
                // Writes of the others are not kept out: fail the window rather than copy.
                tracing::error!(node = %self.name, "cannot announce a background window: {e:#}");
                return self.wait_for_etcd(&key, value);
            }
        };
        if wait {
            self.wait_for_acks(round);
        }
    }

    /// etcd did not take the round: try until it does (the walk waits meanwhile), or until
    /// this node is fenced (its writes are refused from then on).
    fn wait_for_etcd(&self, key: &str, value: &str) {
        while self.fence.refusal().is_none() {
            std::thread::sleep(POLL * 10);
            if let Ok(round) = self.etcd.put(key, value.as_bytes(), None) {
                return self.wait_for_acks(round);
            }
        }
    }

    fn wait_for_acks(&self, round: i64) {
        self.wait_for_every_node(
            &format!("{}round-ack/", self.prefix),
            round.to_string().as_bytes(),
            "background window held",
        );
    }

    /// Follow the coordinator's rounds once: hold its current window (dropping the previous
    /// one), or nothing, and acknowledge. Returns the hold to keep.
    pub(super) fn follow_round(&self, array: &Arc<Array>, hold: Option<Hold>) -> Option<Hold> {
        let key = format!("{}round", self.prefix);
        let Ok((kvs, _)) = self.etcd.get_prefix(&key) else {
            return hold;
        };
        let Some(kv) = kvs.iter().find(|kv| kv.key == key) else {
            return hold;
        };
        let round = kv.mod_revision;
        let Some((author, window)) = parse_round(kv) else {
            return hold;
        };
        let author_gone = author != self.name && !self.others_active().contains(&author);
        let current = hold.as_ref().map(|h| h.round);
        if author == self.name || current == Some(round) {
            // Ours, or held already: let a gone coordinator's window go.
            return if author_gone { None } else { hold };
        }
        let window = window.filter(|_| !author_gone);
        let recovering = window.and_then(|w| w.recovery);
        if let (Some(w), Some((dev, role))) = (window, recovering) {
            let counted = self.know_member(array, dev)
                && array
                    .recovery_window_elsewhere(dev, role, w.lo)
                    .map_err(|e| tracing::error!(node = %self.name, dev, "{e}"))
                    .is_ok();
            if !counted {
                // Not acknowledged: the window is not rebuilt while this node could write
                // below it without the member.
                return hold;
            }
        }
        if let Some(dev) = hold.as_ref().and_then(|h| h.recovering) {
            if recovering.map(|r| r.0) != Some(dev) {
                // The walk over it stopped (its progress is in its superblock by now).
                array.recovery_paused_elsewhere(dev);
            }
        }
        drop(hold);
        let hold = window.map(|w| {
            let role = recovering.map(|r| r.1);
            let mut h = Hold::take(array.clone(), round, w.lo, w.hi - w.lo, role);
            h.recovering = recovering.map(|r| r.0);
            h
        });
        let ack = format!("{}round-ack/{}", self.prefix, self.name);
        if let Err(e) = self.etcd.put(&ack, round.to_string().as_bytes(), None) {
            tracing::warn!(node = %self.name, "cannot acknowledge a background window: {e:#}");
        }
        hold.or(Some(Hold {
            round,
            recovering: None,
            release: None,
            thread: None,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::cluster::etcd::Etcd;
    use device::SimDevice;
    use testkit::etcd::EtcdServer;

    fn round(value: &str) -> KeyValue {
        KeyValue {
            key: "round".into(),
            value: value.into(),
            create_revision: 1,
            mod_revision: 1,
            lease: 0,
        }
    }

    #[test]
    fn rounds_name_the_window_and_the_member_a_recovery_rebuilds() {
        let recovery = SyncKind::Recovery {
            dev_number: 4,
            role: 3,
        };
        let window = |recovery| {
            Some(Window {
                lo: 0,
                hi: 8,
                recovery,
            })
        };
        assert_eq!(
            parse_round(&round(&round_value("a", recovery, 0, 8))),
            Some(("a".into(), window(Some((4, 3)))))
        );
        assert_eq!(
            parse_round(&round(&round_value("a", SyncKind::Resync, 0, 8))),
            Some(("a".into(), window(None)))
        );
        assert_eq!(parse_round(&round("a")), Some(("a".into(), None)));
        assert_eq!(parse_round(&round("a 0 8 resync")), None);
    }

    const UUID: &str = "0a1b2c3d-0000-4000-8000-0000000000aa";

    fn join(server: &EtcdServer, name: &str) -> Arc<Node> {
        let etcd = Etcd::new(&server.endpoint, Duration::from_secs(2)).unwrap();
        Node::join(etcd, UUID, name, 2, Duration::from_secs(5)).unwrap()
    }

    /// A write of `at` on `array` in a thread: its receiver gets a value once it returned.
    fn write_in_thread(array: &Arc<Array>, at: u64) -> mpsc::Receiver<()> {
        let (tx, rx) = mpsc::channel();
        let array = array.clone();
        std::thread::spawn(move || {
            array.write(at, &[7u8; 4096], false).unwrap();
            let _ = tx.send(());
        });
        rx
    }

    #[test]
    fn a_window_one_node_announces_keeps_the_others_writes_out_until_the_next_round() {
        let Some(etcd) = EtcdServer::start() else {
            return;
        };
        let coordinator = join(&etcd, "a");
        let follower = join(&etcd, "b");
        follower.refresh_view().unwrap();
        let sims: Vec<Arc<SimDevice>> = (0..2)
            .map(|i| Arc::new(SimDevice::new(format!("sim{i}"), 8 << 20, i)))
            .collect();
        let devs = simkit::devs(&sims);
        simkit::create_clean("w", layout::Level::Raid1, None, 0, devs.clone(), vec![]);
        let array = Arc::new(simkit::reassemble(&sims).unwrap());
        follower.attach(&array);
        // Returns only once b holds the window.
        coordinator.announce_window(SyncKind::Resync, 0, 1 << 20);
        let inside = write_in_thread(&array, 8192);
        let outside = write_in_thread(&array, 2 << 20);
        outside
            .recv_timeout(Duration::from_secs(2))
            .expect("a write outside the window goes on");
        assert!(
            inside.recv_timeout(Duration::from_millis(300)).is_err(),
            "a write inside the window went out while the window was held"
        );
        coordinator.end_windows();
        inside
            .recv_timeout(Duration::from_secs(2))
            .expect("the write goes out once the window is released");
        follower.leave();
        coordinator.leave();
    }
}
