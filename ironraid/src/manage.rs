//! Member management and rate limits on a running array: `fail`, `remove`, `add`, `speed`.

use crate::control::{self, expect_ok, Request};
use crate::member::{self, name as member_name};
use crate::size;
use anyhow::anyhow;
use std::path::Path;

pub fn fail(name: &str, member: &Path, force: bool) -> anyhow::Result<()> {
    let member = member_name(member);
    expect_ok(control::call(name, &Request::Fail { member, force })?)
}

pub fn remove(name: &str, member: &Path) -> anyhow::Result<()> {
    let member = member_name(member);
    expect_ok(control::call(name, &Request::Remove { member })?)
}

pub fn add(name: &str, member: &Path, force: bool) -> anyhow::Result<()> {
    // The daemon opens it; a path must exist here (the daemon may run elsewhere in the tree).
    let member = if member::is_remote(member) {
        member.display().to_string()
    } else {
        std::fs::canonicalize(member)
            .map_err(|e| anyhow!("{}: cannot open member: {e}", member.display()))?
            .display()
            .to_string()
    };
    expect_ok(control::call(name, &Request::Add { member, force })?)
}

/// Set the limits given (none: only show them), then print both.
pub fn speed(name: &str, min: Option<u64>, max: Option<u64>) -> anyhow::Result<()> {
    let resp = control::call(name, &Request::Speed { min, max })?;
    if !resp.ok {
        anyhow::bail!("{}", resp.error.unwrap_or_default());
    }
    let d = resp
        .detail
        .ok_or_else(|| anyhow!("daemon sent no detail"))?;
    println!(
        "{}: speed_min {}K/sec ({}/s)  speed_max {}K/sec ({}/s)",
        d.name,
        d.sync.speed_min_bytes_per_s / 1024,
        size::human(d.sync.speed_min_bytes_per_s),
        d.sync.speed_max_bytes_per_s / 1024,
        size::human(d.sync.speed_max_bytes_per_s)
    );
    Ok(())
}

/// Switch the journal's mode (none given: only show it), then print it.
pub fn journal_mode(name: &str, mode: Option<&str>) -> anyhow::Result<()> {
    let resp = control::call(
        name,
        &Request::JournalMode {
            mode: mode.map(str::to_string),
        },
    )?;
    if !resp.ok {
        anyhow::bail!("{}", resp.error.unwrap_or_default());
    }
    let d = resp
        .detail
        .ok_or_else(|| anyhow!("daemon sent no detail"))?;
    let j = d.journal.ok_or_else(|| anyhow!("{name} has no journal"))?;
    println!("{}: journal {} ({})", d.name, j.mode, j.device);
    Ok(())
}
