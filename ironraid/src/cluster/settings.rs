//! What `action` and `speed` mean on a node of a cluster (the contract: they act for the
//! whole cluster).
//!
//! * Background work runs on the coordinator only. `action` on another node is forwarded: it
//!   records `action` = "<action> <node>" (its revision names the request) and waits for the
//!   coordinator to say whether it took it (`action-state/<revision>` = "accepted <node>" or
//!   "failed <why>"); then it relays "started" and "finished <mismatched sectors>" as its own
//!   events and status, so `action --wait` there works as on the coordinator. A request the
//!   coordinator does not answer within [`ACTION_ANSWER`] fails, and one whose node is gone
//!   before it finished ends as failed.
//! * The rate limits are every node's (whichever coordinates next uses them): `speed` on any
//!   node records them under `speed` ("MIN MAX", bytes per second, `-` for unchanged), and
//!   every running node's watcher applies a new record (a node that starts later keeps its
//!   own command line's, as md's limits are each host's).

use super::node::Node;
use engine::{Array, Event, SyncAction};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

/// How long a forwarded `action` waits for the coordinator to take it or refuse it.
const ACTION_ANSWER: Duration = Duration::from_secs(5);

/// A check, repair or resync this node forwarded, until it ended.
#[derive(Debug)]
pub struct Asked {
    revision: i64,
    action: SyncAction,
    /// The node that took it.
    runner: String,
    started: bool,
}

/// A forwarded request the coordinator runs, followed through its events.
#[derive(Debug)]
pub struct Serving {
    revision: i64,
    action: SyncAction,
    events: Receiver<Event>,
}

fn work_action(action: &str) -> Option<SyncAction> {
    match action {
        "check" => Some(SyncAction::Check),
        "repair" => Some(SyncAction::Repair),
        "resync" => Some(SyncAction::Resync),
        _ => None,
    }
}

impl Node {
    /// Does this node run `action` requests itself (it coordinates)?
    pub fn runs_actions(&self) -> bool {
        self.is_coordinator()
    }

    /// `action` on a node that does not coordinate: hand it to the coordinator; Ok once it
    /// took it.
    pub fn forward_action(&self, action: &str) -> anyhow::Result<()> {
        let value = format!("{action} {}", self.name);
        let revision = self.etcd.put(&self.key("action"), value.as_bytes(), None)?;
        let t0 = Instant::now();
        let runner = loop {
            match self.action_state(revision)? {
                Some((state, rest)) if state == "failed" => anyhow::bail!("{rest}"),
                Some((_, runner)) => break runner,
                None if t0.elapsed() > ACTION_ANSWER => anyhow::bail!(
                    "the coordinator did not take `{action}` within {ACTION_ANSWER:?}"
                ),
                None => std::thread::sleep(Duration::from_millis(10)),
            }
        };
        match work_action(action) {
            Some(action) => {
                *self.agreement.asked.lock() = Some(Asked {
                    revision,
                    action,
                    runner,
                    started: false,
                })
            }
            None => self.forget_action_state(revision),
        }
        Ok(())
    }

    fn action_state_key(&self, revision: i64) -> String {
        self.key(&format!("action-state/{revision}"))
    }

    /// What the coordinator said of request `revision` (its state word and the rest).
    fn action_state(&self, revision: i64) -> anyhow::Result<Option<(String, String)>> {
        let Some(kv) = self.etcd.get(&self.action_state_key(revision))? else {
            return Ok(None);
        };
        let text = String::from_utf8_lossy(&kv.value).into_owned();
        let (state, rest) = text.split_once(' ').unwrap_or((&text, ""));
        Ok(Some((state.to_string(), rest.to_string())))
    }

    fn put_action_state(&self, revision: i64, state: &str) {
        let key = self.action_state_key(revision);
        if let Err(e) = self.etcd.put(&key, state.as_bytes(), None) {
            tracing::warn!(node = %self.name, "cannot answer a forwarded action: {e:#}");
        }
    }

    /// The asking node is done with request `revision`.
    fn forget_action_state(&self, revision: i64) {
        let _ = self.etcd.delete(&self.action_state_key(revision));
    }

    /// Relay the coordinator's progress on the request this node forwarded.
    pub(super) fn follow_asked(&self, array: &Array) {
        let mut asked = self.agreement.asked.lock();
        let Some(a) = asked.as_mut() else {
            return;
        };
        let Ok(Some((state, rest))) = self.action_state(a.revision) else {
            return;
        };
        let by = a.runner.clone();
        let gone = !self.others_active().contains(&by);
        let ended = match state.as_str() {
            "finished" => Some(rest.trim().parse::<u64>().map_err(|_| rest.clone())),
            "failed" => Some(Err(rest.clone())),
            _ if gone => Some(Err(format!("node {by}, which ran it, is gone"))),
            _ => None,
        };
        if !a.started && (state == "started" || ended.is_some()) {
            array.sync_started_elsewhere(a.action, &by);
            a.started = true;
        }
        if let Some(outcome) = ended {
            array.sync_ended_elsewhere(a.action, &by, outcome);
            self.forget_action_state(a.revision);
            *asked = None;
        }
    }

    /// The coordinator: take the requests other nodes forward, and say how they go.
    pub(super) fn serve_actions(&self, array: &Array) {
        self.report_serving(array);
        if !self.is_coordinator() {
            return;
        }
        let Some((revision, text)) = self.newer_record("action", &self.agreement.action_revision)
        else {
            return;
        };
        let action = text.split(' ').next().unwrap_or("").to_string();
        let events = array.subscribe();
        match array.request_action(&action) {
            Ok(()) => {
                self.put_action_state(revision, &format!("accepted {}", self.name));
                if let Some(action) = work_action(&action) {
                    *self.agreement.serving.lock() = Some(Serving {
                        revision,
                        action,
                        events,
                    });
                }
            }
            Err(e) => self.put_action_state(revision, &format!("failed {e}")),
        }
    }

    fn report_serving(&self, array: &Array) {
        let mut serving = self.agreement.serving.lock();
        let Some(s) = serving.as_ref() else {
            return;
        };
        let name = s.action.name();
        while let Ok(ev) = s.events.try_recv() {
            let state = if ev.kind == format!("{name}_started") {
                "started".to_string()
            } else if ev.kind == format!("{name}_finished") {
                format!("finished {}", array.status().sync.mismatch_sectors)
            } else if matches!(ev.kind, "sync_interrupted" | "sync_failed")
                && ev.message.starts_with(name)
            {
                format!("failed {}", ev.message)
            } else {
                continue;
            };
            self.put_action_state(s.revision, &state);
            if state != "started" {
                *serving = None;
                return;
            }
        }
    }

    /// Key `name`'s revision and text if it changed since revision `seen`, which moves on to it.
    pub(super) fn newer_record(&self, name: &str, seen: &AtomicI64) -> Option<(i64, String)> {
        let kv = self.etcd.get(&self.key(name)).ok()??;
        if seen.fetch_max(kv.mod_revision, Ordering::AcqRel) >= kv.mod_revision {
            return None;
        }
        Some((
            kv.mod_revision,
            String::from_utf8_lossy(&kv.value).into_owned(),
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
        let Some((_, text)) = self.newer_record("speed", &self.agreement.speed_revision) else {
            return;
        };
        let parse = |s: Option<&str>| s.and_then(|v| v.parse::<u64>().ok());
        let mut parts = text.split(' ');
        let (min, max) = (parse(parts.next()), parse(parts.next()));
        array.set_sync_speed(min, max.filter(|&m| m > 0));
        tracing::info!(node = %self.name, ?min, ?max, "rate limits set by another node");
    }
}
