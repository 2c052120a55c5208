//! `ironraid status`: every array of the run directory, running or not, and whether all are
//! healthy. An array whose daemon died (kill -9, a crash) leaves its sockets behind; they
//! refuse connections, and the array is listed as `inactive (daemon gone)` rather than
//! vanishing from the list.

use crate::rundir;
use crate::status::Detail;
use anyhow::bail;
use serde::Serialize;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;

/// An array whose daemon is gone: what is left of it in the run directory.
#[derive(Serialize)]
pub struct Gone {
    pub name: String,
    /// Always "inactive".
    pub state: &'static str,
    pub reason: &'static str,
    /// The leftover sockets (the next `run` of the array removes them).
    pub sockets: Vec<String>,
}

pub enum Entry {
    Running(Box<Detail>),
    Gone(Gone),
    /// A daemon that answers, but not with its detail.
    Unanswered {
        name: String,
        why: String,
    },
}

/// Every array with a socket in the run directory, by name.
pub fn survey(fetch: impl Fn(&str) -> anyhow::Result<Detail>) -> Vec<Entry> {
    let dir = rundir::rundir();
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let n = e.file_name().to_str()?.to_string();
            let base = n.strip_suffix(".ctl").or_else(|| n.strip_suffix(".nbd"))?;
            Some(base.to_string())
        })
        .collect();
    names.sort();
    names.dedup();
    names
        .into_iter()
        .filter_map(|name| {
            let ctl = rundir::control_socket(&name);
            let nbd = rundir::nbd_socket(&name);
            let answers = |p: &PathBuf| p.exists() && UnixStream::connect(p).is_ok();
            if answers(&ctl) {
                return Some(match fetch(&name) {
                    Ok(d) => Entry::Running(Box::new(d)),
                    Err(e) => Entry::Unanswered {
                        name,
                        why: format!("{e:#}"),
                    },
                });
            }
            // A daemon still starting has bound its NBD socket but not yet its control one.
            if !ctl.exists() && answers(&nbd) {
                return None;
            }
            let sockets = [ctl, nbd]
                .into_iter()
                .filter(|p| p.exists())
                .map(|p| p.display().to_string())
                .collect();
            Some(Entry::Gone(Gone {
                name,
                state: "inactive",
                reason: "daemon gone",
                sockets,
            }))
        })
        .collect()
}

/// Print the survey (mdstat-like, or JSON: each running array's detail, and an object with
/// `state: "inactive"` per gone one); fails naming every array that needs attention.
pub fn status(json: bool, fetch: impl Fn(&str) -> anyhow::Result<Detail>) -> anyhow::Result<()> {
    let entries = survey(fetch);
    if json {
        let out: Vec<serde_json::Value> = entries
            .iter()
            .map(|e| match e {
                Entry::Running(d) => serde_json::to_value(d),
                Entry::Gone(g) => serde_json::to_value(g),
                Entry::Unanswered { name, why } => Ok(serde_json::json!({
                    "name": name, "state": "unknown", "reason": why
                })),
            })
            .collect::<Result<_, _>>()?;
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        print_mdstat(&entries);
    }
    let trouble: Vec<String> = entries
        .iter()
        .filter_map(|e| match e {
            Entry::Running(d) if d.healthy() => None,
            Entry::Running(d) => Some(format!("{} {}", d.name, d.state)),
            Entry::Gone(g) => Some(format!("{} inactive (daemon gone)", g.name)),
            Entry::Unanswered { name, .. } => Some(format!("{name} not answering")),
        })
        .collect();
    if !trouble.is_empty() {
        bail!("not every array is healthy: {}", trouble.join(", "));
    }
    Ok(())
}

fn print_mdstat(entries: &[Entry]) {
    println!("Personalities : [linear] [raid0] [raid1] [raid4] [raid5] [raid6] [raid10]");
    for e in entries {
        match e {
            Entry::Running(d) => print!("{}", d.mdstat()),
            Entry::Gone(g) => println!(
                "{} : inactive (daemon gone)\n      stale sockets: {}; `ironraid run` its \
                 members again (it was not stopped cleanly)",
                g.name,
                g.sockets.join(" ")
            ),
            Entry::Unanswered { name, why } => println!("{name} : unknown ({why})"),
        }
    }
    if entries.is_empty() {
        println!("(no arrays in {})", rundir::rundir().display());
    }
}
