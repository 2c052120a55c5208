//! RAID levels ("personalities") as recorded in the md superblock.
//!
//! Theory: the v1.x superblock stores the level as a signed 32-bit integer
//! (md-format.md §1.2 "level"): -1 linear, 0, 1, 4, 5, 6, 10. The legacy
//! values -4 (multipath) and -5 (faulty) are not supported and map to `None`.
//!
//! Traps:
//! * RAID4 is its own level (4) even though its arrangement equals RAID5
//!   "parity-last"; the layout field of a RAID4 array is meaningless (§2.2).
//! * The minimum device counts follow md: RAID5 accepts 2 devices (parity is
//!   then a copy of the data), RAID6 needs 4, RAID10 needs 2 (two copies).

use std::fmt;

/// An md personality.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Level {
    /// Concatenation of the members (`-1`).
    Linear,
    /// Striping without redundancy (`0`).
    Raid0,
    /// Mirroring (`1`).
    Raid1,
    /// Striping with a dedicated parity device (`4`).
    Raid4,
    /// Striping with rotating parity (`5`).
    Raid5,
    /// Striping with P and Q syndromes (`6`).
    Raid6,
    /// Striped mirrors with near/far/offset copies (`10`).
    Raid10,
}

impl Level {
    /// All levels, in md numeric order.
    pub const ALL: [Level; 7] = [
        Level::Linear,
        Level::Raid0,
        Level::Raid1,
        Level::Raid4,
        Level::Raid5,
        Level::Raid6,
        Level::Raid10,
    ];

    /// The value of the superblock `level` field.
    pub fn md_level(self) -> i32 {
        match self {
            Level::Linear => -1,
            Level::Raid0 => 0,
            Level::Raid1 => 1,
            Level::Raid4 => 4,
            Level::Raid5 => 5,
            Level::Raid6 => 6,
            Level::Raid10 => 10,
        }
    }

    /// Decode the superblock `level` field.
    pub fn from_md(level: i32) -> Option<Level> {
        Level::ALL.into_iter().find(|l| l.md_level() == level)
    }

    /// Parse an mdadm `--level` argument ("5", "raid5", "linear", ...).
    pub fn parse(s: &str) -> Option<Level> {
        let s = s.trim().to_ascii_lowercase();
        let level = match s.as_str() {
            "linear" | "-1" => Level::Linear,
            "0" | "raid0" | "stripe" => Level::Raid0,
            "1" | "raid1" | "mirror" => Level::Raid1,
            "4" | "raid4" => Level::Raid4,
            "5" | "raid5" => Level::Raid5,
            "6" | "raid6" => Level::Raid6,
            "10" | "raid10" => Level::Raid10,
            _ => return None,
        };
        Some(level)
    }

    /// Canonical mdadm name ("raid5", "linear", ...).
    pub fn name(self) -> &'static str {
        match self {
            Level::Linear => "linear",
            Level::Raid0 => "raid0",
            Level::Raid1 => "raid1",
            Level::Raid4 => "raid4",
            Level::Raid5 => "raid5",
            Level::Raid6 => "raid6",
            Level::Raid10 => "raid10",
        }
    }

    /// Smallest number of raid devices md accepts for this level.
    pub fn min_disks(self) -> usize {
        match self {
            Level::Linear | Level::Raid0 | Level::Raid1 => 1,
            Level::Raid4 | Level::Raid5 | Level::Raid10 => 2,
            Level::Raid6 => 4,
        }
    }

    /// Number of parity devices per stripe (0 for non-parity levels).
    pub fn parity_disks(self) -> usize {
        match self {
            Level::Raid4 | Level::Raid5 => 1,
            Level::Raid6 => 2,
            _ => 0,
        }
    }

    /// Is this one of the striped-parity levels (4, 5, 6)?
    pub fn is_parity(self) -> bool {
        self.parity_disks() > 0
    }
}

impl fmt::Display for Level {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips() {
        for l in Level::ALL {
            assert_eq!(Level::from_md(l.md_level()), Some(l));
            assert_eq!(Level::parse(l.name()), Some(l));
            let num = l.md_level().to_string();
            assert_eq!(Level::parse(&num), Some(l));
        }
        assert_eq!(Level::from_md(-4), None);
        assert_eq!(Level::from_md(3), None);
        assert_eq!(Level::parse("raid3"), None);
        assert_eq!(Level::parse("RAID6"), Some(Level::Raid6));
    }

    #[test]
    fn minimums() {
        let mins: Vec<usize> = Level::ALL.iter().map(|l| l.min_disks()).collect();
        assert_eq!(mins, vec![1, 1, 1, 2, 2, 4, 2]);
    }
}
