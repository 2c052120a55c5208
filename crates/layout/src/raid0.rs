//! RAID0 striping with zones.
//!
//! Theory (md-format.md §4.3): each member contributes its `data_size`
//! rounded down to a chunk multiple. Zone 0 stripes across all devices up
//! to the smallest size; each further zone starts (on every device, at
//! `dev_start`) where the previous smallest size ended and stripes across the
//! devices still bigger than that, in role order. Inside a zone of `z`
//! devices, zone offset `o`: row `o / (C·z)`, device sector
//! `dev_start + row·C + o mod C`, and the device is chunk-number mod `z`:
//!
//! * layout 1 "original": the **absolute** array chunk number;
//! * layout 2 "alternate": the zone-relative chunk number.
//!
//! Traps: the two layouts agree on single-zone arrays (and when the later
//! zones have one device), so bugs hide until sizes differ; the example
//! sizes 3,5,5 chunks puts chunk 9 on device 2 (original) vs 1 (alternate).
//! Layout 0 ("unknown", old arrays without the RAID0_LAYOUT feature) is only
//! accepted for single-zone arrays, as the kernel does since 5.4.

use crate::copies::Copies;
use crate::error::LayoutError;
use crate::level::Level;

/// md `layout` value for RAID0 "original" (absolute chunk number).
pub const RAID0_ORIGINAL: u32 = 1;
/// md `layout` value for RAID0 "alternate" (zone-relative chunk number).
pub const RAID0_ALTERNATE: u32 = 2;

#[derive(Clone, Debug)]
struct Zone {
    /// First array sector of the zone.
    start: u64,
    /// One past the last array sector of the zone.
    end: u64,
    /// Sector on every member where the zone begins.
    dev_start: u64,
    /// Sectors per member in this zone.
    dev_len: u64,
    /// Member roles, in role order.
    devs: Vec<usize>,
}

/// Validated RAID0 geometry.
#[derive(Clone, Debug)]
pub(crate) struct Raid0 {
    chunk: u64,
    shift: u32,
    original: bool,
    zones: Vec<Zone>,
    /// Rounded per-device sizes.
    pub dev_sizes: Vec<u64>,
}

impl Raid0 {
    pub fn new(layout: u32, chunk: u64, device_sectors: &[u64]) -> Result<Raid0, LayoutError> {
        let dev_sizes: Vec<u64> = device_sectors.iter().map(|s| s / chunk * chunk).collect();
        if let Some(role) = dev_sizes.iter().position(|&s| s == 0) {
            return Err(LayoutError::DeviceTooSmall { role, sectors: 0 });
        }
        let zones = build_zones(&dev_sizes)?;
        let bad = |reason| LayoutError::BadLayout {
            level: Level::Raid0,
            layout,
            reason,
        };
        let original = match layout {
            RAID0_ORIGINAL => true,
            RAID0_ALTERNATE => false,
            0 if zones.len() == 1 => true,
            0 => {
                return Err(bad(
                    "multi-zone raid0 needs layout 1 (original) or 2 (alternate)",
                ))
            }
            _ => return Err(bad("raid0 layouts are 1 (original) and 2 (alternate)")),
        };
        Ok(Raid0 {
            chunk,
            shift: chunk.trailing_zeros(),
            original,
            zones,
            dev_sizes,
        })
    }

    pub fn array_sectors(&self) -> u64 {
        self.zones.last().map_or(0, |z| z.end)
    }

    pub fn map(&self, r: u64) -> Copies {
        let total = self.array_sectors();
        assert!(r < total, "array sector {r} beyond raid0 end {total}");
        let zone = &self.zones[self.zones.partition_point(|z| z.end <= r)];
        let z = zone.devs.len() as u64;
        let zone_off = r - zone.start;
        let zone_chunk = zone_off >> self.shift;
        let off = r & (self.chunk - 1);
        let numbered = if self.original {
            r >> self.shift
        } else {
            zone_chunk
        };
        let dev = zone.devs[(numbered % z) as usize];
        let row = zone_chunk / z;
        let dev_sector = zone.dev_start + (row << self.shift) + off;
        Copies::single(dev, dev_sector, self.chunk - off)
    }

    pub fn reverse(&self, dev: usize, s: u64) -> Option<u64> {
        let zone = self
            .zones
            .iter()
            .find(|z| s >= z.dev_start && s < z.dev_start + z.dev_len)?;
        let pos = zone.devs.iter().position(|&d| d == dev)? as u64;
        let z = zone.devs.len() as u64;
        let row = (s - zone.dev_start) >> self.shift;
        let off = s & (self.chunk - 1);
        let col = if self.original {
            let first_chunk = zone.start >> self.shift;
            (pos + z - first_chunk % z) % z
        } else {
            pos
        };
        Some(zone.start + ((row * z + col) << self.shift) + off)
    }
}

fn build_zones(sizes: &[u64]) -> Result<Vec<Zone>, LayoutError> {
    let mut distinct: Vec<u64> = sizes.to_vec();
    distinct.sort_unstable();
    distinct.dedup();
    let mut zones = Vec::with_capacity(distinct.len());
    let (mut prev, mut start) = (0u64, 0u64);
    for &size in &distinct {
        let devs: Vec<usize> = (0..sizes.len()).filter(|&d| sizes[d] > prev).collect();
        let dev_len = size - prev;
        let len = dev_len
            .checked_mul(devs.len() as u64)
            .ok_or(LayoutError::Overflow)?;
        let end = start.checked_add(len).ok_or(LayoutError::Overflow)?;
        zones.push(Zone {
            start,
            end,
            dev_start: prev,
            dev_len,
            devs,
        });
        prev = size;
        start = end;
    }
    Ok(zones)
}
