//! The control socket (`RUNDIR/NAME.ctl`): one JSON request line, one JSON response line.
//!
//! The daemon serves it; `status`, `detail`, `stop`, `fail` … are clients. Requests are small
//! and bounded (`MAX_REQUEST_BYTES`); a malformed request gets an error response, never a crash.

use crate::results::{GuideResult, VerifyResult};
use crate::rundir;
use crate::status::Detail;
use anyhow::{anyhow, bail, Context};
use serde::{Deserialize, Serialize};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::time::Duration;

/// Largest request line the daemon reads.
pub const MAX_REQUEST_BYTES: usize = 64 * 1024;

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(tag = "cmd", rename_all = "snake_case")]
pub enum Request {
    Detail,
    /// Stop cleanly; refused while NBD clients are connected unless `force` (then the array
    /// is flushed before the clients are cut off).
    Stop {
        #[serde(default)]
        force: bool,
    },
    /// Mark a member faulty; refused when the array would not survive it unless `force`.
    Fail {
        member: String,
        #[serde(default)]
        force: bool,
    },
    /// Add a member as a spare (it rebuilds at once if a role is missing).
    Add {
        member: String,
        #[serde(default)]
        force: bool,
    },
    /// Remove a faulty member or a spare.
    Remove {
        member: String,
    },
    /// md's `sync_action`: check, repair, resync, idle, frozen.
    Action {
        action: String,
    },
    /// Set md's `sync_speed_min`/`sync_speed_max` (bytes per second); answers with the detail.
    Speed {
        #[serde(default)]
        min: Option<u64>,
        #[serde(default)]
        max: Option<u64>,
    },
    /// Switch the journal to `write-through` or `write-back` (None: only report); answers
    /// with the detail.
    JournalMode {
        #[serde(default)]
        mode: Option<String>,
    },
    /// Verify reads over array byte ranges `[offset, length]`; answers with the result.
    Verify {
        ranges: Vec<[u64; 2]>,
    },
    /// Run a guide on a `guided` array awaiting one: `ext4`, `ranges` or `fallback`.
    Guide {
        kind: String,
        #[serde(default)]
        ranges: Vec<[u64; 2]>,
        /// Take the administrator's word that ext4 runs with data=journal.
        #[serde(default)]
        assume_data_journal: bool,
    },
    /// Answer `{"ok":true}`, then one [`EventLine`] per event until the client goes away.
    Monitor,
}

/// One event as `monitor` streams it (one JSON object per line).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct EventLine {
    /// e.g. `member_faulty`, `spare_active`, `rebuild_started`, `check_finished`.
    pub event: String,
    pub array: String,
    pub member: Option<String>,
    pub message: String,
    pub unix_ms: u64,
}

impl From<&engine::Event> for EventLine {
    fn from(e: &engine::Event) -> EventLine {
        EventLine {
            event: e.kind.to_string(),
            array: e.array.clone(),
            member: e.member.clone(),
            message: e.message.clone(),
            unix_ms: e.unix_ms,
        }
    }
}

#[derive(Clone, Debug, Serialize, Deserialize, Default)]
pub struct Response {
    pub ok: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<Detail>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verify: Option<VerifyResult>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guide: Option<GuideResult>,
}

impl Response {
    pub fn ok() -> Response {
        Response {
            ok: true,
            ..Response::default()
        }
    }

    pub fn err(msg: impl Into<String>) -> Response {
        Response {
            ok: false,
            error: Some(msg.into()),
            ..Response::default()
        }
    }
}

/// Send one request to the daemon running array `name`.
pub fn call(name: &str, req: &Request) -> anyhow::Result<Response> {
    let (resp, _) = send(name, req, Some(Duration::from_secs(60)))?;
    Ok(resp)
}

/// As [`call`], for requests whose work takes as long as it takes (verify reads).
pub fn call_unhurried(name: &str, req: &Request) -> anyhow::Result<Response> {
    let (resp, _) = send(name, req, None)?;
    Ok(resp)
}

/// The daemon's answer as a result: its error message when it refused.
pub fn expect_ok(resp: Response) -> anyhow::Result<()> {
    if resp.ok {
        Ok(())
    } else {
        bail!(
            "{}",
            resp.error
                .unwrap_or_else(|| "daemon refused without a reason".into())
        )
    }
}

/// The detail of array `name`, from its daemon.
pub fn fetch_detail(name: &str) -> anyhow::Result<Detail> {
    let resp = call(name, &Request::Detail)?;
    if !resp.ok {
        bail!("{}", resp.error.unwrap_or_default());
    }
    resp.detail.ok_or_else(|| anyhow!("daemon sent no detail"))
}

/// Subscribe to the events of array `name`: the reader yields one [`EventLine`] per line and
/// ends when the daemon exits.
pub fn open_monitor(name: &str) -> anyhow::Result<BufReader<UnixStream>> {
    let (resp, reader) = send(name, &Request::Monitor, Some(Duration::from_secs(60)))?;
    if !resp.ok {
        bail!("{}", resp.error.unwrap_or_default());
    }
    reader.get_ref().set_read_timeout(None)?;
    Ok(reader)
}

fn send(
    name: &str,
    req: &Request,
    timeout: Option<Duration>,
) -> anyhow::Result<(Response, BufReader<UnixStream>)> {
    let path = rundir::control_socket(name);
    let mut stream = UnixStream::connect(&path).with_context(|| {
        format!(
            "no running array '{name}' (cannot connect to {})",
            path.display()
        )
    })?;
    stream.set_read_timeout(timeout)?;
    let mut line = serde_json::to_string(req)?;
    line.push('\n');
    stream.write_all(line.as_bytes())?;
    let mut reader = BufReader::new(stream);
    let mut answer = String::new();
    reader
        .read_line(&mut answer)
        .context("reading the daemon's answer")?;
    if answer.is_empty() {
        bail!("array '{name}': daemon closed the control connection without answering");
    }
    let resp: Response = serde_json::from_str(&answer).context("daemon sent a malformed answer")?;
    Ok((resp, reader))
}

/// Names of arrays whose control socket answers.
pub fn running_arrays() -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(rundir::rundir()) else {
        return Vec::new();
    };
    let mut names: Vec<String> = entries
        .flatten()
        .filter_map(|e| {
            e.file_name()
                .to_str()
                .and_then(|n| n.strip_suffix(".ctl"))
                .map(str::to_string)
        })
        .filter(|n| UnixStream::connect(rundir::control_socket(n)).is_ok())
        .collect();
    names.sort();
    names
}
