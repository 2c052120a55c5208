//! RAID10 near / far / offset mapping.
//!
//! Theory (md-format.md §4.2). Layout bits: 0–7 near copies `nc`, 8–15 far
//! copies `fc`, bit 16 "offset", bits 17–18 far-set mode, higher bits
//! invalid. For array sector `r` (chunk `C`):
//!
//! * `vchunk = (r / C)·nc`; first copy on device `vchunk mod n`, row
//!   `vchunk / n` (times `fc` for offset layouts), sector `row·C + r mod C`.
//!   Equivalently: the near section is a row-major fill of the device×row
//!   grid where every array chunk occupies `nc` consecutive cells.
//! * Near copies 1..nc go to the next devices; wrapping to device 0 moves one
//!   chunk down.
//! * Each far copy moves `nc` devices right (mod n) and `stride` sectors
//!   down: `stride = C` for offset layouts, else `(U / fc)·C` with
//!   `U = ceil(A·nc·fc / n)` used chunks per device and
//!   `A = ((size / C) / fc)·n / nc` array chunks (this is also the array
//!   size, integer divisions in exactly that order).
//!
//! Traps:
//! * The far stride derives from the superblock `size`, not the device size.
//! * Near copies wrap (n2 on 3 disks): copies are still on distinct devices
//!   but at different sectors.
//! * Far-set modes 1 and 2 (never written by mdadm) are refused as
//!   unsupported, and so are offset layouts combining `nc > 1`, `fc > 1` with
//!   `n mod nc != 0`: there md's near-wrap step (one chunk) lands in the
//!   rows reserved for far copies, so the mapping is not injective.

use crate::copies::{Copies, Loc};
use crate::error::LayoutError;
use crate::level::Level;

/// Validated RAID10 geometry.
#[derive(Clone, Debug)]
pub(crate) struct Raid10 {
    pub n: usize,
    pub nc: usize,
    pub fc: usize,
    pub offset: bool,
    pub chunk: u64,
    shift: u32,
    pub array_chunks: u64,
    pub stride: u64,
    /// Sectors used on every device (`U·C`).
    pub used_dev_sectors: u64,
}

/// Decode `layout` into `(nc, fc, offset)` after validating the bits.
pub(crate) fn decode(n: usize, layout: u32) -> Result<(usize, usize, bool), LayoutError> {
    let bad = |reason| LayoutError::BadLayout {
        level: Level::Raid10,
        layout,
        reason,
    };
    if layout >> 19 != 0 {
        return Err(bad("unknown bits set above bit 18"));
    }
    match layout >> 17 {
        0 => {}
        3 => return Err(bad("unknown far-set mode 3")),
        m => {
            return Err(LayoutError::Unsupported(format!(
                "raid10 far-set mode {m} (layout {layout:#x})"
            )))
        }
    }
    let nc = (layout & 0xFF) as usize;
    let fc = ((layout >> 8) & 0xFF) as usize;
    let offset = layout & 0x1_0000 != 0;
    if nc == 0 || fc == 0 {
        return Err(bad("near and far copies must be at least 1"));
    }
    if nc * fc < 2 {
        return Err(bad("raid10 needs at least 2 copies"));
    }
    if nc * fc > n {
        return Err(bad("more copies than raid disks"));
    }
    if offset && nc > 1 && fc > 1 && !n.is_multiple_of(nc) {
        return Err(LayoutError::Unsupported(format!(
            "raid10 offset layout {layout:#x} on {n} disks (near copies wrap into offset rows)"
        )));
    }
    Ok((nc, fc, offset))
}

impl Raid10 {
    pub fn new(n: usize, layout: u32, chunk: u64, size: u64) -> Result<Raid10, LayoutError> {
        let (nc, fc, offset) = decode(n, layout)?;
        let (n64, nc64, fc64) = (n as u64, nc as u64, fc as u64);
        let array_chunks = ((size / chunk) / fc64)
            .checked_mul(n64)
            .ok_or(LayoutError::Overflow)?
            / nc64;
        if array_chunks == 0 {
            return Err(LayoutError::EmptyArray {
                component_sectors: size,
            });
        }
        let copies_total = array_chunks
            .checked_mul(nc64 * fc64)
            .ok_or(LayoutError::Overflow)?;
        let used = copies_total.div_ceil(n64);
        let stride = if offset { chunk } else { (used / fc64) * chunk };
        let used_dev_sectors = used.checked_mul(chunk).ok_or(LayoutError::Overflow)?;
        array_chunks
            .checked_mul(chunk)
            .ok_or(LayoutError::Overflow)?;
        Ok(Raid10 {
            n,
            nc,
            fc,
            offset,
            chunk,
            shift: chunk.trailing_zeros(),
            array_chunks,
            stride,
            used_dev_sectors,
        })
    }

    pub fn array_sectors(&self) -> u64 {
        self.array_chunks << self.shift
    }

    pub fn copies(&self) -> usize {
        self.nc * self.fc
    }

    pub fn map(&self, r: u64) -> Copies {
        let total = self.array_sectors();
        assert!(r < total, "array sector {r} beyond raid10 end {total}");
        let off = r & (self.chunk - 1);
        let vchunk = (r >> self.shift) * self.nc as u64;
        let dev = (vchunk % self.n as u64) as usize;
        let mut row = vchunk / self.n as u64;
        if self.offset {
            row *= self.fc as u64;
        }
        let first = Loc {
            dev,
            dev_sector: (row << self.shift) + off,
        };
        let run = (self.chunk - off).min(total - r);
        Copies::raid10(
            self.n,
            self.nc,
            self.fc,
            first,
            self.chunk,
            self.stride,
            run,
        )
    }

    pub fn reverse(&self, dev: usize, s: u64) -> Option<u64> {
        if dev >= self.n || s >= self.used_dev_sectors {
            return None;
        }
        let off = s & (self.chunk - 1);
        let (f, row) = if self.offset {
            let raw = s >> self.shift;
            (raw % self.fc as u64, raw / self.fc as u64)
        } else {
            let f = s / self.stride;
            if f >= self.fc as u64 {
                return None;
            }
            (f, (s - f * self.stride) >> self.shift)
        };
        let shift_devs = (f as usize * self.nc) % self.n;
        let dev_near = (dev + self.n - shift_devs) % self.n;
        let vchunk = row.checked_mul(self.n as u64)? + dev_near as u64;
        let chunk = vchunk / self.nc as u64;
        if chunk >= self.array_chunks {
            return None;
        }
        let candidate = (chunk << self.shift) + off;
        let hit = self
            .map(candidate)
            .iter()
            .any(|l| l.dev == dev && l.dev_sector == s);
        hit.then_some(candidate)
    }

    /// Can every chunk still be read with these devices failed?
    pub fn survives(&self, failed: &[bool]) -> bool {
        // The device set of a chunk depends only on (chunk·nc) mod n, which
        // takes all its values within the first n chunks.
        let chunks = self.array_chunks.min(self.n as u64);
        (0..chunks).all(|c| self.map(c << self.shift).iter().any(|l| !failed[l.dev]))
    }
}
