//! mdadm layout names ↔ md numeric `layout` values, and mdadm create defaults.
//!
//! Theory: mdadm's `--layout` names map onto the superblock `layout` field
//! (md-format.md §2.2, §3.2, §4.2, §4.3):
//! * RAID5/6: left-asymmetric 0, right-asymmetric 1, left-symmetric 2
//!   (default), right-symmetric 3, parity-first 4, parity-last 5; RAID5 also
//!   accepts the DDF names as aliases (ddf-zero-restart → 1, ddf-N-restart
//!   → 0, ddf-N-continue → 2); RAID6 maps them to the DDF layouts 8, 9, 10
//!   and adds the `-6` layouts 16..=20.
//! * RAID10: `nX` = 0x100 + X, `fX` = (X << 8) + 1, `oX` = 0x10000 + (X << 8) + 1.
//!   As an ironraid extension, combined `nXfY` / `nXoY` names describe
//!   layouts with both near and far copies (mdadm prints those as
//!   "near=X, far=Y"), so every valid layout has a round-tripping name.
//! * RAID0: original 1, alternate 2.
//!
//! Traps: RAID4 has no layout names even though its arrangement equals
//! parity-last; linear/RAID1 have none either.

use crate::error::LayoutError;
use crate::level::Level;

const R5_NAMES: [(&str, u32); 11] = [
    ("left-asymmetric", 0),
    ("la", 0),
    ("right-asymmetric", 1),
    ("ra", 1),
    ("left-symmetric", 2),
    ("ls", 2),
    ("right-symmetric", 3),
    ("rs", 3),
    ("parity-first", 4),
    ("parity-last", 5),
    ("default", 2),
];

const R5_DDF_ALIASES: [(&str, u32); 3] = [
    ("ddf-zero-restart", 1),
    ("ddf-N-restart", 0),
    ("ddf-N-continue", 2),
];

const R6_EXTRA: [(&str, u32); 8] = [
    ("ddf-zero-restart", 8),
    ("ddf-N-restart", 9),
    ("ddf-N-continue", 10),
    ("left-asymmetric-6", 16),
    ("right-asymmetric-6", 17),
    ("left-symmetric-6", 18),
    ("right-symmetric-6", 19),
    ("parity-first-6", 20),
];

const CANONICAL_R5: [&str; 6] = [
    "left-asymmetric",
    "right-asymmetric",
    "left-symmetric",
    "right-symmetric",
    "parity-first",
    "parity-last",
];

/// Parse an mdadm layout name for a level into md's numeric layout field.
pub fn parse_layout(level: Level, name: &str) -> Result<u32, LayoutError> {
    let unknown = || LayoutError::UnknownLayoutName {
        level,
        name: name.to_string(),
    };
    let lookup = |table: &[(&str, u32)]| {
        table
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|&(_, v)| v)
    };
    match level {
        Level::Raid5 => lookup(&R5_NAMES)
            .or_else(|| lookup(&R5_DDF_ALIASES))
            .ok_or_else(unknown),
        Level::Raid6 => lookup(&R5_NAMES)
            .or_else(|| lookup(&R6_EXTRA))
            .ok_or_else(unknown),
        Level::Raid10 => parse_raid10(name).ok_or_else(unknown),
        Level::Raid0 => match name.to_ascii_lowercase().as_str() {
            "original" | "1" => Ok(1),
            "alternate" | "2" => Ok(2),
            _ => Err(unknown()),
        },
        Level::Linear | Level::Raid1 | Level::Raid4 => Err(LayoutError::NoLayouts(level)),
    }
}

fn parse_copies(digits: &str) -> Option<u32> {
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let v: u32 = digits.parse().ok()?;
    (1..=255).contains(&v).then_some(v)
}

fn parse_raid10(name: &str) -> Option<u32> {
    let name = name.to_ascii_lowercase();
    let (kind, rest) = name.split_at_checked(1)?;
    // Combined forms "nXfY" / "nXoY".
    if kind == "n" {
        if let Some(i) = rest.find(['f', 'o']) {
            let nc = parse_copies(&rest[..i])?;
            let fc = parse_copies(&rest[i + 1..])?;
            let offset = if rest.as_bytes()[i] == b'o' {
                0x1_0000
            } else {
                0
            };
            return Some(offset | (fc << 8) | nc);
        }
    }
    let x = parse_copies(rest)?;
    match kind {
        "n" => Some(0x100 | x),
        "f" => Some((x << 8) | 1),
        "o" => Some(0x1_0000 | (x << 8) | 1),
        _ => None,
    }
}

/// Canonical name of a layout value; `None` for levels without layouts
/// (linear, raid1, raid4), RAID0 layout 0 (unrecorded), and invalid values.
pub fn layout_name(level: Level, layout: u32) -> Option<String> {
    match level {
        Level::Raid5 => CANONICAL_R5.get(layout as usize).map(|s| s.to_string()),
        Level::Raid6 => match layout {
            0..=5 => Some(CANONICAL_R5[layout as usize].to_string()),
            _ => R6_EXTRA
                .iter()
                .find(|&&(_, v)| v == layout)
                .map(|(n, _)| n.to_string()),
        },
        Level::Raid10 => raid10_name(layout),
        Level::Raid0 => match layout {
            1 => Some("original".into()),
            2 => Some("alternate".into()),
            _ => None,
        },
        Level::Linear | Level::Raid1 | Level::Raid4 => None,
    }
}

fn raid10_name(layout: u32) -> Option<String> {
    if layout >> 17 != 0 {
        return None;
    }
    let nc = layout & 0xFF;
    let fc = (layout >> 8) & 0xFF;
    let offset = layout & 0x1_0000 != 0;
    if nc == 0 || fc == 0 {
        return None;
    }
    let far = if offset { 'o' } else { 'f' };
    Some(match (nc, fc) {
        (_, 1) if !offset => format!("n{nc}"),
        (1, _) => format!("{far}{fc}"),
        _ => format!("n{nc}{far}{fc}"),
    })
}

/// mdadm defaults for new arrays: raid5/raid6 2 (left-symmetric), raid10
/// 0x102 (n2), raid0 1 (original, written with feature bit RAID0_LAYOUT),
/// others 0.
pub fn default_layout(level: Level) -> u32 {
    match level {
        Level::Raid5 | Level::Raid6 => 2,
        Level::Raid10 => 0x102,
        Level::Raid0 => 1,
        Level::Linear | Level::Raid1 | Level::Raid4 => 0,
    }
}

/// Per-device size (`size` field) mdadm would use at create, given the
/// smallest member's usable data sectors: rounded down to a chunk multiple
/// for striped levels (raid0/4/5/6/10), to 64 KiB (128 sectors) for raid1,
/// to the rounding for linear (when non-zero).
pub fn component_sectors_for(
    level: Level,
    chunk_sectors: u64,
    smallest_device_data_sectors: u64,
) -> u64 {
    let s = smallest_device_data_sectors;
    match level {
        Level::Raid1 => s & !127,
        _ if chunk_sectors == 0 => s,
        _ => s / chunk_sectors * chunk_sectors,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_from_brief() {
        assert_eq!(parse_layout(Level::Raid5, "ls"), Ok(2));
        assert_eq!(parse_layout(Level::Raid5, "parity-last"), Ok(5));
        assert_eq!(parse_layout(Level::Raid6, "left-asymmetric-6"), Ok(16));
        assert_eq!(parse_layout(Level::Raid6, "parity-first-6"), Ok(20));
        assert_eq!(parse_layout(Level::Raid10, "n2"), Ok(0x102));
        assert_eq!(parse_layout(Level::Raid10, "f2"), Ok(0x201));
        assert_eq!(parse_layout(Level::Raid10, "o2"), Ok(0x10201));
        assert_eq!(parse_layout(Level::Raid10, "n3"), Ok(0x103));
        assert_eq!(parse_layout(Level::Raid0, "alternate"), Ok(2));
        assert!(parse_layout(Level::Raid5, "left-asymmetric-6").is_err());
        assert!(parse_layout(Level::Raid10, "x2").is_err());
        assert!(parse_layout(Level::Raid10, "n0").is_err());
        assert!(parse_layout(Level::Raid10, "n").is_err());
        assert_eq!(
            parse_layout(Level::Raid1, "n2"),
            Err(LayoutError::NoLayouts(Level::Raid1))
        );
        assert_eq!(
            layout_name(Level::Raid5, 2).as_deref(),
            Some("left-symmetric")
        );
        assert_eq!(layout_name(Level::Raid10, 0x102).as_deref(), Some("n2"));
        assert_eq!(layout_name(Level::Raid10, 0x10201).as_deref(), Some("o2"));
        assert_eq!(layout_name(Level::Raid4, 0), None);
        assert_eq!(layout_name(Level::Raid5, 6), None);
    }

    #[test]
    fn round_trip_numbers() {
        for level in [Level::Raid0, Level::Raid5, Level::Raid6, Level::Raid10] {
            for layout in 0..0x2_0000u32 {
                if let Some(name) = layout_name(level, layout) {
                    assert_eq!(parse_layout(level, &name), Ok(layout), "{level} {name}");
                }
            }
        }
    }

    #[test]
    fn component_rounding() {
        assert_eq!(component_sectors_for(Level::Raid1, 0, 1000), 896);
        assert_eq!(component_sectors_for(Level::Raid5, 1024, 5000), 4096);
        assert_eq!(component_sectors_for(Level::Linear, 0, 5000), 5000);
    }
}
