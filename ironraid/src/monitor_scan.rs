//! `ironraid monitor --scan`: one monitor for every array in the run directory, as
//! `mdadm --monitor --scan`: it follows arrays started later, notices a daemon that died
//! (its control socket left behind), runs `--program` and mails `--mail` (the local
//! `sendmail -t`, as mdadm does) per event. `--oneshot` reports what is wrong now and exits;
//! `--test` makes one `test_message` event per array first.

use crate::control::{self, EventLine};
use crate::{config, rundir};
use anyhow::Context;
use std::collections::BTreeSet;
use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError, Sender};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// How often the run directory is looked at for arrays started (or gone) since.
const RESCAN: Duration = Duration::from_secs(1);

#[derive(clap::Args)]
pub struct ScanArgs {
    /// Follow every array in the run directory, arrays started later included.
    #[arg(long)]
    pub scan: bool,
    /// Mail events that need attention to ADDR through `sendmail -t` (default: the config's
    /// MAILADDR).
    #[arg(long, value_name = "ADDR", requires = "scan")]
    pub mail: Option<String>,
    /// Report what is wrong now (degraded, failed, daemon gone) and exit.
    #[arg(long, requires = "scan")]
    pub oneshot: bool,
    /// One test_message event per array at start.
    #[arg(long, requires = "scan")]
    pub test: bool,
    /// Config file for MAILADDR and PROGRAM (default $IRONRAID_CONFIG, else
    /// /etc/ironraid/ironraid.conf, if it exists).
    #[arg(long, requires = "scan")]
    pub config: Option<PathBuf>,
}

/// Where events go: stdout as JSON lines, the hook, the mail.
struct Sinks {
    program: Option<PathBuf>,
    mail: Option<String>,
}

enum Note {
    Event(EventLine),
    /// A follower ended: the array is no longer followed.
    Ended(String),
}

pub fn monitor_scan(program: Option<PathBuf>, args: ScanArgs) -> anyhow::Result<()> {
    let cfg = config::load_optional(args.config.as_deref())?;
    let sinks = Sinks {
        program: program.or_else(|| cfg.as_ref().and_then(|c| c.program.clone())),
        mail: args.mail.or_else(|| cfg.and_then(|c| c.mailaddr)),
    };
    let (tx, rx) = channel();
    let mut followed = BTreeSet::new();
    for name in control::running_arrays() {
        if args.test {
            sinks.deliver(&event(
                "test_message",
                &name,
                "test event from ironraid monitor",
            ))?;
        }
        if args.oneshot {
            for ev in trouble(&name) {
                sinks.deliver(&ev)?;
            }
        } else {
            follow(&name, tx.clone())?;
            followed.insert(name);
        }
    }
    for name in dead_daemons() {
        sinks.deliver(&gone(&name))?;
    }
    if args.oneshot {
        return Ok(());
    }
    eprintln!(
        "ironraid: monitoring every array in {}",
        rundir::rundir().display()
    );
    watch(&sinks, tx, &rx, followed)
}

fn watch(
    sinks: &Sinks,
    tx: Sender<Note>,
    rx: &Receiver<Note>,
    mut followed: BTreeSet<String>,
) -> anyhow::Result<()> {
    loop {
        match rx.recv_timeout(RESCAN) {
            Ok(Note::Event(ev)) => sinks.deliver(&ev)?,
            Ok(Note::Ended(name)) => {
                followed.remove(&name);
            }
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => unreachable!("this function holds a sender"),
        }
        for name in control::running_arrays() {
            if !followed.contains(&name) {
                sinks.deliver(&event("new_array", &name, "array started"))?;
                follow(&name, tx.clone())?;
                followed.insert(name);
            }
        }
    }
}

/// Stream `name`'s events into `tx` on a thread of its own; when the stream ends, say whether
/// the array stopped or its daemon died.
fn follow(name: &str, tx: Sender<Note>) -> anyhow::Result<()> {
    let Ok(reader) = control::open_monitor(name) else {
        // Stopped between the listing and now: the next rescan settles it.
        return Ok(());
    };
    let name = name.to_string();
    std::thread::Builder::new()
        .name(format!("monitor-{name}"))
        .spawn(move || {
            for line in reader.lines() {
                let Ok(line) = line else { break };
                match serde_json::from_str::<EventLine>(&line) {
                    Ok(ev) => {
                        if tx.send(Note::Event(ev)).is_err() {
                            return;
                        }
                    }
                    Err(e) => eprintln!("ironraid: ignoring a malformed event ({e}): {line}"),
                }
            }
            let end = if rundir::control_socket(&name).exists() {
                gone(&name)
            } else {
                event("array_stopped", &name, "array stopped")
            };
            let _ = tx.send(Note::Event(end));
            let _ = tx.send(Note::Ended(name));
        })
        .context("cannot start a monitor thread")?;
    Ok(())
}

fn event(kind: &str, array: &str, message: &str) -> EventLine {
    EventLine {
        event: kind.into(),
        array: array.into(),
        member: None,
        message: message.into(),
        unix_ms: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64),
    }
}

fn gone(name: &str) -> EventLine {
    event(
        "daemon_gone",
        name,
        "the array's daemon died: its control socket is left and does not answer",
    )
}

/// Arrays whose control socket is left but does not answer.
fn dead_daemons() -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(rundir::rundir()) else {
        return Vec::new();
    };
    let running = control::running_arrays();
    let mut dead: Vec<String> = entries
        .flatten()
        .filter_map(|e| {
            e.file_name()
                .to_str()?
                .strip_suffix(".ctl")
                .map(String::from)
        })
        .filter(|n| !running.contains(n))
        .collect();
    dead.sort();
    dead
}

/// What `--oneshot` reports for a running array: md's DegradedArray and Fail.
fn trouble(name: &str) -> Vec<EventLine> {
    let Ok(d) = control::fetch_detail(name) else {
        return vec![gone(name)];
    };
    let in_sync = d.members.iter().filter(|m| m.state == "in_sync").count();
    let mut out = Vec::new();
    if d.state == "failed" {
        out.push(event("array_failed", name, "the array has failed"));
    } else if in_sync < d.raid_devices {
        let msg = format!("{in_sync} of {} members in sync", d.raid_devices);
        out.push(event("array_degraded", name, &msg));
    }
    for m in d.members.iter().filter(|m| m.state == "faulty") {
        let mut ev = event("member_faulty", name, "member is faulty");
        ev.member = Some(m.path.clone());
        out.push(ev);
    }
    out
}

/// Events that only inform are printed and given to the hook; the rest are mailed too.
fn informative(kind: &str) -> bool {
    kind.ends_with("_started")
        || kind.ends_with("_finished")
        || matches!(
            kind,
            "new_array"
                | "array_stopped"
                | "member_in_sync"
                | "spare_added"
                | "spare_active"
                | "member_readded"
                | "member_removed"
        )
}

impl Sinks {
    fn deliver(&self, ev: &EventLine) -> anyhow::Result<()> {
        let json = serde_json::to_string(ev)?;
        let mut out = std::io::stdout();
        if writeln!(out, "{json}").and_then(|()| out.flush()).is_err() {
            // A closed stdout (e.g. `| head`) ends the monitor.
            std::process::exit(0);
        }
        if let Some(prog) = &self.program {
            crate::monitor::run_hook(prog, ev, &json);
        }
        if let Some(addr) = self.mail.as_deref().filter(|_| !informative(&ev.event)) {
            if let Err(e) = mail(addr, ev) {
                eprintln!("ironraid: cannot mail {addr}: {e:#}");
            }
        }
        Ok(())
    }
}

/// `sendmail -t` from $PATH, else /usr/sbin/sendmail.
fn sendmail() -> PathBuf {
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|d| d.join("sendmail"))
        .find(|p| p.is_file())
        .unwrap_or_else(|| Path::new("/usr/sbin/sendmail").to_path_buf())
}

fn mail(addr: &str, ev: &EventLine) -> anyhow::Result<()> {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    let host = host.trim();
    let member = ev
        .member
        .as_deref()
        .map(|m| format!(" {m}"))
        .unwrap_or_default();
    let text = format!(
        "To: {addr}\nSubject: ironraid {} event on {}{member} ({host})\n\n\
         This is an automatically generated mail from ironraid monitor on {host}.\n\n\
         A {} event happened on array {}{member}:\n  {}\n\nCheck it with: ironraid detail {}\n",
        ev.event, ev.array, ev.event, ev.array, ev.message, ev.array
    );
    let prog = sendmail();
    let mut child = Command::new(&prog)
        .arg("-t")
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .with_context(|| format!("cannot run {}", prog.display()))?;
    child
        .stdin
        .take()
        .expect("stdin is piped")
        .write_all(text.as_bytes())?;
    let st = child.wait()?;
    anyhow::ensure!(st.success(), "{} -t: {st}", prog.display());
    Ok(())
}
