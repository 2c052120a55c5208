//! Errors returned while validating a geometry or parsing layout names.
//!
//! Every error is a configuration problem detected up front by `Geometry::new`
//! or the name parsers; the per-request mapping functions never fail (they
//! `assert!` on out-of-range arguments, which are programming errors).

use crate::level::Level;

/// Why a geometry, level or layout name was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum LayoutError {
    /// Fewer member devices than the level needs.
    #[error("{level} needs at least {min} devices, got {got}")]
    TooFewDisks {
        /// Level being configured.
        level: Level,
        /// Minimum number of devices for that level.
        min: usize,
        /// Number of devices supplied.
        got: usize,
    },
    /// More member devices than ironraid supports.
    #[error("at most {max} raid devices are supported, got {got}")]
    TooManyDisks {
        /// Number of devices supplied.
        got: usize,
        /// `MAX_RAID_DISKS`.
        max: usize,
    },
    /// More members than RAID6's Q can tell apart.
    #[error("RAID6 has at most {max} devices (255 data disks: Q's GF(2^8) weights repeat after 255), got {got}")]
    TooManyForRaid6 {
        /// Number of devices supplied.
        got: usize,
        /// `MAX_RAID6_DISKS`.
        max: usize,
    },
    /// Chunk size not usable for this level.
    #[error("invalid chunk size {chunk_sectors} sectors for {level}: {reason}")]
    BadChunk {
        /// Level being configured.
        level: Level,
        /// Offending chunk size in sectors.
        chunk_sectors: u64,
        /// Human readable explanation.
        reason: &'static str,
    },
    /// Numeric layout value that md would reject for this level.
    #[error("invalid layout {layout:#x} for {level}: {reason}")]
    BadLayout {
        /// Level being configured.
        level: Level,
        /// Offending md `layout` field.
        layout: u32,
        /// Human readable explanation.
        reason: &'static str,
    },
    /// A layout name that mdadm would not accept for this level.
    #[error("unknown layout name {name:?} for {level}")]
    UnknownLayoutName {
        /// Level the name was parsed for.
        level: Level,
        /// The name as given.
        name: String,
    },
    /// The level has no layout variants (linear, raid1, raid4).
    #[error("{0} has no layout variants")]
    NoLayouts(Level),
    /// `device_sectors` does not have one entry per raid disk.
    #[error("{level} needs one device size per raid disk ({expected}), got {got}")]
    DeviceCount {
        /// Level being configured.
        level: Level,
        /// `raid_disks`.
        expected: usize,
        /// `device_sectors.len()`.
        got: usize,
    },
    /// A member contributes no usable sectors after rounding.
    #[error("device in role {role} is too small ({sectors} sectors after rounding)")]
    DeviceTooSmall {
        /// Role (index) of the device.
        role: usize,
        /// Its usable size after rounding.
        sectors: u64,
    },
    /// The geometry describes an array with no sectors at all.
    #[error("array would be empty (component size {component_sectors} sectors)")]
    EmptyArray {
        /// Component size after rounding.
        component_sectors: u64,
    },
    /// Sizes so large that sector arithmetic would overflow 64 bits.
    #[error("geometry too large: sector arithmetic overflows")]
    Overflow,
    /// Valid md configuration that ironraid does not implement.
    #[error("unsupported: {0}")]
    Unsupported(String),
}
