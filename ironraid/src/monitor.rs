//! `ironraid monitor NAME [--program PROG]`: a running array's events as JSON lines, and a hook
//! run per event the way `mdadm --monitor --program` runs one.

use crate::control::{self, EventLine};
use anyhow::Context;
use std::io::{BufRead, Write};
use std::os::fd::AsFd;
use std::path::Path;
use std::process::{Command, Stdio};

pub fn monitor(name: &str, program: Option<&Path>) -> anyhow::Result<()> {
    let reader = control::open_monitor(name)?;
    eprintln!("ironraid: monitoring array '{name}'");
    let mut stdout = std::io::stdout();
    for line in reader.lines() {
        let line = line.context("reading events from the daemon")?;
        let ev: EventLine = match serde_json::from_str(&line) {
            Ok(ev) => ev,
            Err(e) => {
                eprintln!("ironraid: ignoring a malformed event ({e}): {line}");
                continue;
            }
        };
        let json = serde_json::to_string(&ev)?;
        // A closed stdout (e.g. `| head`) ends the monitor.
        if writeln!(stdout, "{json}")
            .and_then(|()| stdout.flush())
            .is_err()
        {
            return Ok(());
        }
        if let Some(prog) = program {
            run_hook(prog, &ev, &json);
        }
    }
    eprintln!("ironraid: array '{name}' stopped; monitor ends");
    Ok(())
}

/// Run `PROG EVENT ARRAY [MEMBER]` with the event's JSON in `IRONRAID_EVENT` and wait for it.
/// Its output goes to stderr, so stdout stays one JSON object per line. A failing hook is
/// reported and the monitor goes on.
pub fn run_hook(prog: &Path, ev: &EventLine, json: &str) {
    let mut cmd = Command::new(prog);
    cmd.arg(&ev.event)
        .arg(&ev.array)
        .args(ev.member.as_deref())
        .env("IRONRAID_EVENT", json)
        .stdin(Stdio::null());
    if let Ok(fd) = std::io::stderr().as_fd().try_clone_to_owned() {
        cmd.stdout(Stdio::from(fd));
    }
    match cmd.status() {
        Ok(st) if st.success() => {}
        Ok(st) => eprintln!(
            "ironraid: {} {} {}: {st}",
            prog.display(),
            ev.event,
            ev.array
        ),
        Err(e) => eprintln!("ironraid: cannot run {}: {e}", prog.display()),
    }
}
