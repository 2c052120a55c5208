//! Guides of a `guided` array after an unclean stop (`ironraid guide`, `run --guide`):
//! * `ext4`: read the ext4 journal (jbd2) off the array, verify what it says may have been in
//!   flight (`format::ext4_guide`), end guidance; if the file system does not pass the gate,
//!   fall back to the bitmap resync and say why;
//! * `ranges`: an outside guide names the byte ranges itself;
//! * `fallback`: no guidance; the bitmap resync runs now.

use crate::control::{self, Request};
use crate::results::{Ext4Summary, GuideResult, VerifyResult};
use crate::size;
use anyhow::{anyhow, bail};
use engine::Array;
use std::path::Path;

/// Run guide `kind` on `array` (in the daemon).
pub fn run(
    array: &Array,
    kind: &str,
    ranges: &[(u64, u64)],
    assume_data_journal: bool,
) -> anyhow::Result<GuideResult> {
    match kind {
        "fallback" => {
            array
                .fall_back("an administrator asked for the bitmap resync")
                .map_err(|e| anyhow!("{e}"))?;
            Ok(GuideResult {
                guide: kind.into(),
                ..GuideResult::default()
            })
        }
        "ranges" => {
            if ranges.is_empty() {
                bail!("guide ranges: no ranges given (use --ranges FILE)");
            }
            let r = array
                .end_guidance("ranges", ranges)
                .map_err(|e| anyhow!("{e}"))?;
            Ok(GuideResult {
                guide: kind.into(),
                verify: Some(VerifyResult::from_engine(&r)),
                ext4: None,
            })
        }
        "ext4" => ext4(array, assume_data_journal),
        other => bail!("unknown guide '{other}' (ext4, ranges or fallback)"),
    }
}

fn ext4(array: &Array, assume_data_journal: bool) -> anyhow::Result<GuideResult> {
    array.awaiting_guidance().map_err(|e| anyhow!("{e}"))?;
    let mut read =
        |off: u64, buf: &mut [u8]| array.read_as_guide(off, buf).map_err(|e| e.to_string());
    let opts = format::ext4_guide::GuideOptions {
        require_data_journal: !assume_data_journal,
    };
    let t0 = std::time::Instant::now();
    let set = match format::ext4_guide::ext4_verify_set(&mut read, array.size_bytes(), &opts) {
        Ok(set) => set,
        Err(refusal) => {
            let why = format!("the ext4 guide refused: {refusal}");
            array.fall_back(&why).map_err(|e| anyhow!("{e}"))?;
            bail!("{why}; the bitmap resync runs instead");
        }
    };
    let summary = Ext4Summary {
        block_size: set.block_size,
        journal_bytes: set.journal_bytes,
        transactions: set.transactions,
        home_blocks: set.home_blocks,
        window_blocks: set.window_blocks,
        set_bytes: set.total_bytes(),
        ranges: set.ranges.len(),
    };
    let scan_ms = t0.elapsed().as_millis() as u64;
    let r = array
        .end_guidance("ext4", &set.ranges)
        .map_err(|e| anyhow!("{e}"))?;
    tracing::info!(
        scan_ms,
        verify_ms = t0.elapsed().as_millis() as u64 - scan_ms,
        array = %array.name(),
        transactions = summary.transactions,
        home_blocks = summary.home_blocks,
        set_bytes = summary.set_bytes,
        verified_bytes = r.bytes_verified,
        mismatch_sectors = r.mismatch_sectors,
        "ext4 journal guided the resync"
    );
    Ok(GuideResult {
        guide: "ext4".into(),
        verify: Some(VerifyResult::from_engine(&r)),
        ext4: Some(summary),
    })
}

/// `ironraid guide NAME KIND`: ask the daemon to run a guide, print what it did.
pub fn guide(
    name: &str,
    kind: &str,
    ranges_file: Option<&Path>,
    assume_data_journal: bool,
    json: bool,
) -> anyhow::Result<()> {
    let ranges = match ranges_file {
        Some(f) => crate::verify::read_ranges(f)?,
        None => Vec::new(),
    };
    let resp = control::call_unhurried(
        name,
        &Request::Guide {
            kind: kind.to_string(),
            ranges: ranges.iter().map(|&(o, l)| [o, l]).collect(),
            assume_data_journal,
        },
    )?;
    if !resp.ok {
        bail!("{}", resp.error.unwrap_or_default());
    }
    let g = resp
        .guide
        .ok_or_else(|| anyhow!("daemon sent no guide result"))?;
    if json {
        println!("{}", serde_json::to_string_pretty(&g)?);
        return Ok(());
    }
    match (&g.verify, &g.ext4) {
        (None, _) => println!("{name}: no guidance; the bitmap resync runs"),
        (Some(v), e) => {
            if let Some(e) = e {
                println!(
                    "{name}: ext4 journal ({}): {} committed transactions, {} home blocks, \
                     {} journal blocks past the last commit",
                    size::human(e.journal_bytes),
                    e.transactions,
                    e.home_blocks,
                    e.window_blocks
                );
            }
            println!(
                "{name}: guided by {}: {} of stripes verified, {} sectors repaired; redundancy \
                 is in sync",
                g.guide,
                size::human(v.bytes_verified),
                v.mismatch_sectors
            );
        }
    }
    Ok(())
}
