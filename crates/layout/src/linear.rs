//! Linear (concatenation).
//!
//! Theory (md-format.md §4.4): members are concatenated in role order; each
//! contributes its `data_size` rounded down to the "rounding" stored in the
//! superblock chunksize field (0 = no rounding). Array sector `r` lies on the
//! member whose cumulative range contains it, at `r − start`.
//!
//! Traps: the rounding need not be a power of two; a member rounded down to
//! nothing is refused rather than silently skipped.

use crate::copies::Copies;
use crate::error::LayoutError;

/// Validated linear geometry.
#[derive(Clone, Debug)]
pub(crate) struct Linear {
    /// Rounded per-device sizes.
    pub dev_sizes: Vec<u64>,
    /// Cumulative end (exclusive) of each member in array sectors.
    ends: Vec<u64>,
}

impl Linear {
    pub fn new(rounding: u64, device_sectors: &[u64]) -> Result<Linear, LayoutError> {
        let dev_sizes: Vec<u64> = device_sectors
            .iter()
            .map(|&s| s - s.checked_rem(rounding).unwrap_or(0))
            .collect();
        if let Some(role) = dev_sizes.iter().position(|&s| s == 0) {
            return Err(LayoutError::DeviceTooSmall { role, sectors: 0 });
        }
        let mut ends = Vec::with_capacity(dev_sizes.len());
        let mut end = 0u64;
        for &s in &dev_sizes {
            end = end.checked_add(s).ok_or(LayoutError::Overflow)?;
            ends.push(end);
        }
        Ok(Linear { dev_sizes, ends })
    }

    pub fn array_sectors(&self) -> u64 {
        self.ends.last().copied().unwrap_or(0)
    }

    pub fn map(&self, r: u64) -> Copies {
        let total = self.array_sectors();
        assert!(r < total, "array sector {r} beyond linear end {total}");
        let dev = self.ends.partition_point(|&e| e <= r);
        let start = self.ends[dev] - self.dev_sizes[dev];
        Copies::single(dev, r - start, self.ends[dev] - r)
    }

    pub fn reverse(&self, dev: usize, s: u64) -> Option<u64> {
        let size = *self.dev_sizes.get(dev)?;
        (s < size).then(|| self.ends[dev] - size + s)
    }
}
