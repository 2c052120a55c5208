//! `ironraid action NAME check|repair|resync|idle|frozen [--wait]`: md's `sync_action`.
//!
//! With `--wait`, the client subscribes to the array's events before asking (so it cannot miss
//! the end), then polls `detail` every 200 ms for progress: a bar on a terminal, a plain line
//! every 2 s otherwise. It returns when `<action>_finished` arrives after `<action>_started`,
//! and fails if the action is interrupted or fails.

use crate::control::{self, expect_ok, fetch_detail, EventLine, Request};
use crate::size;
use crate::status::Detail;
use anyhow::bail;
use indicatif::{ProgressBar, ProgressStyle};
use std::io::{BufRead, IsTerminal};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

const POLL: Duration = Duration::from_millis(200);
const PLAIN_EVERY: Duration = Duration::from_secs(2);

pub fn action(name: &str, action: &str, wait: bool) -> anyhow::Result<()> {
    let work = matches!(action, "check" | "repair" | "resync");
    let events = if wait && work {
        Some(subscribe(name)?)
    } else {
        None
    };
    expect_ok(control::call(
        name,
        &Request::Action {
            action: action.into(),
        },
    )?)?;
    match (wait, events) {
        (false, _) => Ok(()),
        (true, None) => wait_idle(name),
        (true, Some(rx)) => {
            wait_finished(name, action, &rx)?;
            let d = fetch_detail(name)?;
            println!(
                "{name}: {action} finished, mismatch_count {}",
                d.mismatch_count
            );
            Ok(())
        }
    }
}

/// Events of array `name` on a channel; `None` once the daemon has gone.
fn subscribe(name: &str) -> anyhow::Result<Receiver<Option<EventLine>>> {
    let reader = control::open_monitor(name)?;
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in reader.lines() {
            let Ok(line) = line else { break };
            if let Ok(ev) = serde_json::from_str::<EventLine>(&line) {
                if tx.send(Some(ev)).is_err() {
                    return;
                }
            }
        }
        let _ = tx.send(None);
    });
    Ok(rx)
}

/// `idle` and `frozen` stop what runs; wait until nothing does.
fn wait_idle(name: &str) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let d = fetch_detail(name)?;
        if d.sync.action == "idle" {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!(
                "array '{name}': {} still running after 120 s",
                d.sync.action
            );
        }
        std::thread::sleep(POLL);
    }
}

/// What one event means for the action we wait for.
fn judge(ev: &EventLine, action: &str, started: &mut bool) -> Option<Result<(), String>> {
    if ev.event == format!("{action}_started") {
        *started = true;
        return None;
    }
    if ev.event == "array_failed" {
        return Some(Err(ev.message.clone()));
    }
    if !*started {
        return None;
    }
    if ev.event == format!("{action}_finished") {
        return Some(Ok(()));
    }
    if matches!(ev.event.as_str(), "sync_interrupted" | "sync_failed")
        && ev.message.starts_with(action)
    {
        return Some(Err(ev.message.clone()));
    }
    None
}

fn wait_finished(name: &str, action: &str, rx: &Receiver<Option<EventLine>>) -> anyhow::Result<()> {
    let mut started = false;
    let mut progress = Progress::new(name, action);
    let mut next_poll = Instant::now();
    loop {
        if Instant::now() >= next_poll {
            progress.update(&fetch_detail(name)?);
            next_poll = Instant::now() + POLL;
        }
        let wait = next_poll.saturating_duration_since(Instant::now());
        let verdict = match rx.recv_timeout(wait) {
            Ok(Some(ev)) => judge(&ev, action, &mut started),
            Ok(None) | Err(RecvTimeoutError::Disconnected) => {
                Some(Err(format!("the daemon stopped before {action} finished")))
            }
            Err(RecvTimeoutError::Timeout) => None,
        };
        match verdict {
            None => {}
            Some(Ok(())) => {
                progress.finish();
                return Ok(());
            }
            Some(Err(why)) => {
                progress.abandon();
                bail!("array '{name}': {why}");
            }
        }
    }
}

/// Progress on stderr: an indicatif bar on a terminal, a line every 2 s otherwise.
struct Progress {
    name: String,
    action: String,
    bar: Option<ProgressBar>,
    last_line: Option<Instant>,
}

impl Progress {
    fn new(name: &str, action: &str) -> Progress {
        let bar = std::io::stderr().is_terminal().then(|| {
            let style =
                ProgressStyle::with_template("{prefix} [{bar:40.cyan/blue}] {percent:>3}% {msg}")
                    .unwrap_or_else(|_| ProgressStyle::default_bar())
                    .progress_chars("=> ");
            let b = ProgressBar::new(1).with_style(style);
            b.set_prefix(format!("{name} {action}"));
            b.set_message("waiting to start");
            b
        });
        Progress {
            name: name.into(),
            action: action.into(),
            bar,
            last_line: None,
        }
    }

    fn update(&mut self, d: &Detail) {
        let s = &d.sync;
        let text = if s.action == self.action && s.total_bytes > 0 {
            let left = s.total_bytes.saturating_sub(s.done_bytes);
            let eta = left.checked_div(s.rate_bytes_per_s).map_or_else(
                || "eta -".to_string(),
                |secs| format!("eta {}:{:02}", secs / 60, secs % 60),
            );
            format!("{}/s  {eta}", size::human(s.rate_bytes_per_s))
        } else if s.action != "idle" {
            format!("waiting ({} runs first)", s.action)
        } else {
            "waiting to start".to_string()
        };
        let running = s.action == self.action && s.total_bytes > 0;
        if let Some(bar) = &self.bar {
            if running {
                bar.set_length(s.total_bytes);
                bar.set_position(s.done_bytes);
            }
            bar.set_message(text);
            return;
        }
        if self.last_line.is_some_and(|t| t.elapsed() < PLAIN_EVERY) {
            return;
        }
        self.last_line = Some(Instant::now());
        if running {
            let pct = s.done_bytes as f64 * 100.0 / s.total_bytes as f64;
            eprintln!(
                "{}: {} {pct:.1}% ({} of {})  {text}",
                self.name,
                self.action,
                size::human(s.done_bytes),
                size::human(s.total_bytes)
            );
        } else {
            eprintln!("{}: {} {text}", self.name, self.action);
        }
    }

    fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }

    fn abandon(&self) {
        if let Some(bar) = &self.bar {
            bar.abandon();
            eprintln!();
        }
    }
}
