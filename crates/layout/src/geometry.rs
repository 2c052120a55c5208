//! `Geometry`: validated array shape and per-request address mapping.
//!
//! Theory: `GeometrySpec` mirrors the superblock fields (level, layout,
//! chunksize, raid_disks, size, and each member's data_size).
//! `Geometry::new` validates it the way md would at assembly and computes
//! the array size exactly as md (md-format.md §2.4, §4.2, §4.3, §4.4):
//! * RAID4/5/6: `(n − parity) · (size rounded down to a chunk)`;
//! * RAID10: `((size / C) / fc) · n / nc` chunks;
//! * RAID1: `size`;
//! * RAID0: sum of data_size rounded down to a chunk; linear: sum of
//!   data_size rounded down to the rounding.
//!
//! Parity levels are mapped through `locate` / `stripe_roles`
//! (`raid5.rs`, `raid6.rs`); the others through `map_copies` (`copies.rs`).
//!
//! Traps: chunk sizes must be powers of two ≥ 4 KiB (8 sectors) for every
//! striped level (the per-request code uses shifts and masks); the
//! per-request functions never allocate and panic on out-of-range input.

use crate::copies::{Copies, Loc};
use crate::error::LayoutError;
use crate::level::Level;
use crate::linear::Linear;
use crate::raid0::Raid0;
use crate::raid10::Raid10;
use crate::raid5::ParityLayout;
use crate::stripe::{StripePos, StripeRoles};
use crate::MAX_RAID_DISKS;

/// Superblock-level description of an array.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GeometrySpec {
    /// RAID level.
    pub level: Level,
    /// md superblock `layout` field (RAID4 ignores it: parity always last).
    pub layout: u32,
    /// md `chunksize` (sectors). 0 for raid1. For linear the "rounding" (0 = none).
    pub chunk_sectors: u64,
    /// Number of active roles.
    pub raid_disks: usize,
    /// md `size` field: sectors used on each device (raid1/4/5/6/10).
    /// Ignored for raid0/linear.
    pub component_sectors: u64,
    /// Per role: usable data sectors (data_size). Used by raid0/linear
    /// (len == raid_disks); may be empty for others (and is ignored there).
    pub device_sectors: Vec<u64>,
}

#[derive(Clone, Debug)]
enum Kind {
    Linear(Linear),
    Raid0(Raid0),
    Raid1,
    Parity(ParityLayout),
    Raid10(Raid10),
}

/// A validated geometry; all mapping functions live here.
#[derive(Clone, Debug)]
pub struct Geometry {
    spec: GeometrySpec,
    kind: Kind,
    array_sectors: u64,
    /// log2(chunk) for striped levels, 0 otherwise.
    shift: u32,
    /// Stripes (device chunk rows) of a parity level.
    stripes: u64,
}

fn check_chunk(level: Level, chunk: u64) -> Result<(), LayoutError> {
    let bad = |reason| LayoutError::BadChunk {
        level,
        chunk_sectors: chunk,
        reason,
    };
    if !chunk.is_power_of_two() {
        return Err(bad("must be a power of two"));
    }
    if chunk < 8 {
        return Err(bad("must be at least 4 KiB (8 sectors)"));
    }
    if chunk > 1 << 31 {
        return Err(bad("does not fit the superblock chunksize field"));
    }
    Ok(())
}

fn check_disks(spec: &GeometrySpec) -> Result<(), LayoutError> {
    let (level, got) = (spec.level, spec.raid_disks);
    if got > MAX_RAID_DISKS {
        return Err(LayoutError::TooManyDisks {
            got,
            max: MAX_RAID_DISKS,
        });
    }
    if level == Level::Raid6 && got > crate::MAX_RAID6_DISKS {
        return Err(LayoutError::TooManyForRaid6 {
            got,
            max: crate::MAX_RAID6_DISKS,
        });
    }
    if got < level.min_disks() {
        return Err(LayoutError::TooFewDisks {
            level,
            min: level.min_disks(),
            got,
        });
    }
    let per_device = matches!(level, Level::Linear | Level::Raid0);
    if per_device && spec.device_sectors.len() != got {
        return Err(LayoutError::DeviceCount {
            level,
            expected: got,
            got: spec.device_sectors.len(),
        });
    }
    Ok(())
}

impl Geometry {
    /// Validate `spec` and precompute everything the mapping needs.
    pub fn new(spec: GeometrySpec) -> Result<Geometry, LayoutError> {
        check_disks(&spec)?;
        let (level, chunk, n) = (spec.level, spec.chunk_sectors, spec.raid_disks);
        let striped = !matches!(level, Level::Linear | Level::Raid1);
        if striped {
            check_chunk(level, chunk)?;
        }
        let mut stripes = 0;
        let (kind, array_sectors) = match level {
            Level::Linear => {
                let l = Linear::new(chunk, &spec.device_sectors)?;
                let size = l.array_sectors();
                (Kind::Linear(l), size)
            }
            Level::Raid0 => {
                let r = Raid0::new(spec.layout, chunk, &spec.device_sectors)?;
                let size = r.array_sectors();
                (Kind::Raid0(r), size)
            }
            Level::Raid1 => (Kind::Raid1, spec.component_sectors),
            Level::Raid4 | Level::Raid5 | Level::Raid6 => {
                let pl = ParityLayout::new(level, spec.layout)?;
                stripes = spec.component_sectors / chunk;
                let data = (n - pl.parity) as u64;
                let size = stripes
                    .checked_mul(data * chunk)
                    .ok_or(LayoutError::Overflow)?;
                (Kind::Parity(pl), size)
            }
            Level::Raid10 => {
                let r = Raid10::new(n, spec.layout, chunk, spec.component_sectors)?;
                let size = r.array_sectors();
                (Kind::Raid10(r), size)
            }
        };
        if array_sectors == 0 {
            return Err(LayoutError::EmptyArray {
                component_sectors: spec.component_sectors,
            });
        }
        let shift = if striped { chunk.trailing_zeros() } else { 0 };
        Ok(Geometry {
            spec,
            kind,
            array_sectors,
            shift,
            stripes,
        })
    }

    /// The spec this geometry was built from.
    pub fn spec(&self) -> &GeometrySpec {
        &self.spec
    }

    /// RAID level.
    pub fn level(&self) -> Level {
        self.spec.level
    }

    /// Number of roles.
    pub fn raid_disks(&self) -> usize {
        self.spec.raid_disks
    }

    /// Chunk size in sectors (rounding for linear, as given for raid1).
    pub fn chunk_sectors(&self) -> u64 {
        self.spec.chunk_sectors
    }

    /// Size of the array in sectors.
    pub fn array_sectors(&self) -> u64 {
        self.array_sectors
    }

    /// Roles that hold the same bytes as `role` at the same device offsets: every other role of
    /// RAID1, the near set of a RAID10 near layout whose copies divide the members evenly;
    /// none otherwise (far and offset copies sit elsewhere, parity levels have no copies).
    pub fn device_twins(&self, role: usize) -> Vec<usize> {
        assert!(role < self.raid_disks(), "role {role} out of range");
        match &self.kind {
            Kind::Raid1 => (0..self.raid_disks()).filter(|&r| r != role).collect(),
            Kind::Raid10(r) if r.fc == 1 && r.n.is_multiple_of(r.nc) => {
                let first = role / r.nc * r.nc;
                (first..first + r.nc).filter(|&t| t != role).collect()
            }
            _ => Vec::new(),
        }
    }

    /// Number of copies of each array sector: 1 for linear/raid0/raid4/5/6,
    /// n for raid1, nc·fc for raid10.
    pub fn copies(&self) -> usize {
        match &self.kind {
            Kind::Raid1 => self.raid_disks(),
            Kind::Raid10(r) => r.copies(),
            _ => 1,
        }
    }

    /// Sectors (from data_offset) the array uses on device `dev`: the
    /// rounded data size for linear/raid0, `size` rounded to a chunk for
    /// raid4/5/6, `size` for raid1, and md's "used chunks per device" for
    /// raid10 (what a resync or scrub of that device must cover).
    pub fn used_device_sectors(&self, dev: usize) -> u64 {
        assert!(dev < self.raid_disks(), "device {dev} out of range");
        match &self.kind {
            Kind::Linear(l) => l.dev_sizes[dev],
            Kind::Raid0(r) => r.dev_sizes[dev],
            Kind::Raid1 => self.spec.component_sectors,
            Kind::Parity(_) => self.stripes << self.shift,
            Kind::Raid10(r) => r.used_dev_sectors,
        }
    }

    /// Devices that may fail without losing data.
    pub fn max_degraded(&self) -> usize {
        match &self.kind {
            Kind::Linear(_) | Kind::Raid0(_) => 0,
            Kind::Raid1 => self.raid_disks() - 1,
            Kind::Parity(p) => p.parity,
            Kind::Raid10(r) => r.copies() - 1,
        }
    }

    /// Can every array sector still be read with these roles failed?
    /// (`failed.len() == raid_disks`.) RAID10 checks the real copy sets.
    pub fn survives(&self, failed: &[bool]) -> bool {
        assert_eq!(failed.len(), self.raid_disks(), "one flag per role");
        let count = failed.iter().filter(|&&f| f).count();
        match &self.kind {
            Kind::Linear(_) | Kind::Raid0(_) => count == 0,
            Kind::Raid1 => count < failed.len(),
            Kind::Parity(p) => count <= p.parity,
            Kind::Raid10(r) => r.survives(failed),
        }
    }

    fn parity(&self) -> &ParityLayout {
        match &self.kind {
            Kind::Parity(p) => p,
            _ => panic!("{} is not a parity level", self.level()),
        }
    }

    /// Data chunks per stripe: n−1 (raid4/5) or n−2 (raid6).
    pub fn data_disks(&self) -> usize {
        self.raid_disks() - self.parity().parity
    }

    /// Number of stripes (each one chunk row on every device).
    pub fn stripes(&self) -> u64 {
        self.parity();
        self.stripes
    }

    /// Stripe, logical data index and chunk offset of an array sector.
    pub fn locate(&self, array_sector: u64) -> StripePos {
        let k = self.data_disks() as u64;
        assert!(array_sector < self.array_sectors, "array sector beyond end");
        let chunk = array_sector >> self.shift;
        StripePos {
            stripe: chunk / k,
            data_index: (chunk % k) as usize,
            offset_sectors: array_sector & ((1 << self.shift) - 1),
        }
    }

    /// Device roles of stripe `stripe` (no allocation).
    pub fn stripe_roles(&self, stripe: u64) -> StripeRoles {
        let p = self.parity();
        let n = self.raid_disks();
        let rot = p.rotation(n, stripe);
        StripeRoles::build(n, n - p.parity, &rot)
    }

    /// Inverse of `locate`.
    pub fn array_sector_of(&self, stripe: u64, data_index: usize, offset_sectors: u64) -> u64 {
        let k = self.data_disks();
        assert!(data_index < k, "data index out of range");
        assert!(stripe < self.stripes, "stripe beyond end");
        assert!(offset_sectors < 1 << self.shift, "offset beyond chunk");
        ((stripe * k as u64 + data_index as u64) << self.shift) + offset_sectors
    }

    /// Device sector (relative to data_offset) of the chunks of a stripe.
    pub fn stripe_dev_sector(&self, stripe: u64, offset_sectors: u64) -> u64 {
        self.parity();
        (stripe << self.shift) + offset_sectors
    }

    /// Every copy of `array_sector` in md's copy order, and the contiguous run.
    pub fn map_copies(&self, array_sector: u64) -> Copies {
        match &self.kind {
            Kind::Linear(l) => l.map(array_sector),
            Kind::Raid0(r) => r.map(array_sector),
            Kind::Raid10(r) => r.map(array_sector),
            Kind::Raid1 => {
                assert!(array_sector < self.array_sectors, "array sector beyond end");
                let run = self.array_sectors - array_sector;
                Copies::mirrored(self.raid_disks(), array_sector, run)
            }
            Kind::Parity(_) => panic!("map_copies on parity level {}", self.level()),
        }
    }

    /// Which array sector does `(dev, dev_sector)` hold, if any.
    pub fn reverse_copy(&self, dev: usize, dev_sector: u64) -> Option<u64> {
        if dev >= self.raid_disks() {
            return None;
        }
        match &self.kind {
            Kind::Linear(l) => l.reverse(dev, dev_sector),
            Kind::Raid0(r) => r.reverse(dev, dev_sector),
            Kind::Raid10(r) => r.reverse(dev, dev_sector),
            Kind::Raid1 => (dev_sector < self.array_sectors).then_some(dev_sector),
            Kind::Parity(_) => panic!("reverse_copy on parity level {}", self.level()),
        }
    }

    /// First copy of `array_sector` (convenience for single-copy levels).
    pub fn map_first(&self, array_sector: u64) -> Loc {
        self.map_copies(array_sector).get(0)
    }
}
