//! `ironraid verify`: verify reads over byte ranges of a running array (the stripes under them
//! are read whole, redundancy compared and rewritten from the data where it disagrees).

use crate::control::{self, Request};
use crate::results::VerifyResult;
use crate::size;
use anyhow::{anyhow, bail, Context};
use std::path::Path;

/// Ranges per control request (a request line stays far below `MAX_REQUEST_BYTES`).
const RANGES_PER_REQUEST: usize = 1000;

/// Ranges from text: one `OFFSET LENGTH` per line (sizes as on the command line); blank lines
/// and `#` comments are skipped.
pub fn parse_ranges(text: &str) -> anyhow::Result<Vec<(u64, u64)>> {
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let mut words = line.split_whitespace();
        let (Some(off), Some(len), None) = (words.next(), words.next(), words.next()) else {
            bail!("line {}: expected 'OFFSET LENGTH', got '{line}'", n + 1);
        };
        let off = size::parse_size(off).map_err(|e| anyhow!("line {}: {e}", n + 1))?;
        let len = size::parse_size(len).map_err(|e| anyhow!("line {}: {e}", n + 1))?;
        out.push((off, len));
    }
    Ok(out)
}

/// The ranges listed in file `f` (`-`: standard input).
pub fn read_ranges(f: &Path) -> anyhow::Result<Vec<(u64, u64)>> {
    let text = if f == Path::new("-") {
        std::io::read_to_string(std::io::stdin()).context("reading ranges from stdin")?
    } else {
        std::fs::read_to_string(f).with_context(|| format!("{}: cannot read", f.display()))?
    };
    parse_ranges(&text).with_context(|| format!("{}", f.display()))
}

/// Verify `first` and the ranges listed in `file` (`-`: standard input) on array `name`.
pub fn verify(
    name: &str,
    first: Option<(u64, u64)>,
    file: Option<&Path>,
    json: bool,
) -> anyhow::Result<()> {
    let mut ranges: Vec<(u64, u64)> = first.into_iter().collect();
    if let Some(f) = file {
        ranges.extend(read_ranges(f)?);
    }
    if ranges.is_empty() {
        bail!("verify: no ranges given");
    }
    let mut total = VerifyResult::default();
    for batch in ranges.chunks(RANGES_PER_REQUEST) {
        let resp = control::call_unhurried(
            name,
            &Request::Verify {
                ranges: batch.iter().map(|&(o, l)| [o, l]).collect(),
            },
        )?;
        if !resp.ok {
            bail!("{}", resp.error.unwrap_or_default());
        }
        let r = resp
            .verify
            .ok_or_else(|| anyhow!("daemon sent no verify result"))?;
        total.add(&r);
    }
    if json {
        println!("{}", serde_json::to_string_pretty(&total)?);
        return Ok(());
    }
    let found = match (total.mismatch_sectors, total.repaired) {
        (0, _) => "redundancy agrees with the data".to_string(),
        (n, true) => format!("{n} sectors of redundancy disagreed: rewritten from the data"),
        (n, false) => format!("{n} sectors of redundancy disagreed: left as found (read-only)"),
    };
    println!(
        "{name}: {} range(s), {} of stripes verified; {found}",
        total.ranges,
        size::human(total.bytes_verified)
    );
    if let Some(i) = &total.integrity {
        let bad = i.data_mismatches + i.p_mismatches + i.q_mismatches;
        if bad > 0 {
            println!(
                "{name}: {bad} blocks failed their integrity records ({} data, {} P, {} Q): \
                 {} rebuilt, {} stale records fixed, {} settled after an unclean stop",
                i.data_mismatches,
                i.p_mismatches,
                i.q_mismatches,
                i.repaired,
                i.records_fixed,
                i.resolved_after_crash
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::parse_ranges;

    #[test]
    fn ranges_parse_with_suffixes_comments_and_clear_errors() {
        assert_eq!(
            parse_ranges("0 4K\n# home blocks\n\n1M 512 # sb\n").unwrap(),
            vec![(0, 4096), (1 << 20, 512)]
        );
        let e = parse_ranges("0 4K\n12\n").unwrap_err().to_string();
        assert!(e.contains("line 2"), "{e}");
        assert!(parse_ranges("0 4Q").is_err());
    }
}
