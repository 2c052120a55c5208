//! ironraid's used-region map: which regions of an array may hold data (pure, no I/O).
//!
//! md has no field for this, so it lives where md neither reads nor writes: in the reserved
//! space between the end of the bad-block log and `data_offset` on every member (mdadm keeps
//! that space as reshape headroom; ironraid does not reshape). Layout, in 4 KiB pages from
//! [`used_map_offset_sectors`]:
//!
//! | off | size | field |
//! |---|---|---|
//! | 0 | 8 | magic `"IRUSEDMP"` |
//! | 8 | 4 | version (2; 1 is still read) |
//! | 12 | 4 | flags: bit 0 = the `guided` consistency policy; bit 1 = a fallback resync is owed (see below) |
//! | 16 | 16 | array UUID (md's set_uuid) |
//! | 32 | 8 | events: the array's events when the map was last written |
//! | 40 | 8 | region_bytes: bytes of md's sync coordinates one bit covers (power of two) |
//! | 48 | 8 | regions |
//! | 56 | 8 | sb_utime: the `utime` of the superblocks written with these events (version 2) |
//! | 64 | 4 | CRC32C of bytes 0..64 (version 1: bytes 56..60, of bytes 0..56) |
//! | 68 | 4028 | zero |
//! | 4096 | ⌈regions/8⌉ | one bit per region (bit `j % 8` of byte `j / 8`): 1 = may hold data |
//!
//! The guided flag says that after an unclean stop the array waits for a guide (verify reads
//! from the layer above) before its bitmap resync; md ignores it (it resyncs what its bitmap
//! says, which is always safe). The resync-owed flag is set, durably, when guidance falls back
//! to the bitmap resync and cleared when that resync has finished: after a restart in
//! between, no guide may end what the fallback started (the layer above may have changed its
//! journal meanwhile). Unknown flags are refused.
//!
//! A clustered array (the superblock's CLUSTERED feature) keeps one map per node slot, back to
//! back: slot `k`'s map starts [`node_map_offset`] bytes past the first, each with the same
//! header fields and region size. A node sets bits in its own map only; a region may hold data
//! if any slot's map has its bit set (the seed's per-node "ever written" maps).
//!
//! A clear bit promises that the region is zero on every member in sync (data and parity), so
//! it reads as zeroes and is consistent without being read. The map is written before the
//! superblocks on every event change, and it is trusted only if the superblocks are exactly
//! the ones it was written with, written by ironraid: any difference of events (behind: someone
//! ran the array without the map; ahead: a cut came between the map and the superblocks, and md
//! may have run the array since) or of `sb_utime` makes it count as all used. md takes its event
//! count back down when an array goes clean again right after going dirty, so a run of the
//! kernel's md can end at the count the map recorded; every superblock write md makes (kernel
//! or mdadm) sets `utime` to whole seconds, while ironraid's `utime` always carries non-zero
//! microseconds (`ironraid_time`), so even an md run within the same second shows.

use crate::FormatError;

pub const USED_MAP_MAGIC: &[u8; 8] = b"IRUSEDMP";
pub const USED_MAP_VERSION: u32 = 2;
/// The header takes the first page; the bits start on the second.
pub const USED_MAP_HEADER_BYTES: usize = 4096;
/// Smallest region: the unit trims must cover whole to free space.
pub const MIN_REGION_BYTES: u64 = 1 << 20;
/// Header flag: the array uses the `guided` consistency policy.
pub const USED_MAP_FLAG_GUIDED: u32 = 1;
/// Header flag: guidance fell back; the bitmap resync must run before redundancy is good.
pub const USED_MAP_FLAG_RESYNC_OWED: u32 = 2;
/// Header flag: writes no guide would find after a crash may not be durable yet (the layer
/// above's conformance check said so): after a crash, guidance falls back to the bitmap.
pub const USED_MAP_FLAG_UNGUIDED: u32 = 4;
const KNOWN_FLAGS: u32 = USED_MAP_FLAG_GUIDED | USED_MAP_FLAG_RESYNC_OWED | USED_MAP_FLAG_UNGUIDED;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UsedMapHeader {
    pub uuid: [u8; 16],
    pub events: u64,
    pub region_bytes: u64,
    pub regions: u64,
    /// `USED_MAP_FLAG_*` bits.
    pub flags: u32,
    /// The superblocks' `utime` at `events` (0: unknown, a version 1 header).
    pub sb_utime: u64,
}

impl UsedMapHeader {
    pub fn encode(&self) -> [u8; USED_MAP_HEADER_BYTES] {
        let mut b = [0u8; USED_MAP_HEADER_BYTES];
        b[0..8].copy_from_slice(USED_MAP_MAGIC);
        b[8..12].copy_from_slice(&USED_MAP_VERSION.to_le_bytes());
        b[12..16].copy_from_slice(&self.flags.to_le_bytes());
        b[16..32].copy_from_slice(&self.uuid);
        b[32..40].copy_from_slice(&self.events.to_le_bytes());
        b[40..48].copy_from_slice(&self.region_bytes.to_le_bytes());
        b[48..56].copy_from_slice(&self.regions.to_le_bytes());
        b[56..64].copy_from_slice(&self.sb_utime.to_le_bytes());
        let crc = parity::crc32c(&b[..64]);
        b[64..68].copy_from_slice(&crc.to_le_bytes());
        b
    }

    pub fn decode(buf: &[u8]) -> Result<Self, FormatError> {
        if buf.len() < 64 {
            return Err(FormatError::Truncated);
        }
        if &buf[0..8] != USED_MAP_MAGIC {
            return Err(FormatError::UsedMap(
                "no used-region map (bad magic)".into(),
            ));
        }
        let u32_at = |o: usize| u32::from_le_bytes(buf[o..o + 4].try_into().expect("4 bytes"));
        let u64_at = |o: usize| u64::from_le_bytes(buf[o..o + 8].try_into().expect("8 bytes"));
        let version = u32_at(8);
        // Where the checksum sits: after the fields the version has.
        let fields = match version {
            1 => 56,
            2 => 64,
            _ => return Err(FormatError::UsedMap(format!("unknown version {version}"))),
        };
        if buf.len() < fields + 4 {
            return Err(FormatError::Truncated);
        }
        let stored = u32_at(fields);
        let computed = parity::crc32c(&buf[..fields]);
        if stored != computed {
            return Err(FormatError::UsedMap(format!(
                "header checksum mismatch: stored {stored:#010x}, computed {computed:#010x}"
            )));
        }
        let pad_end = buf.len().min(USED_MAP_HEADER_BYTES);
        if buf[fields + 4..pad_end].iter().any(|&b| b != 0) {
            return Err(FormatError::UsedMap("header padding is not zero".into()));
        }
        let h = UsedMapHeader {
            uuid: buf[16..32].try_into().expect("16 bytes"),
            events: u64_at(32),
            region_bytes: u64_at(40),
            regions: u64_at(48),
            flags: u32_at(12),
            sb_utime: if version == 1 { 0 } else { u64_at(56) },
        };
        if h.flags & !KNOWN_FLAGS != 0 {
            return Err(FormatError::UsedMap(format!(
                "unknown flags {:#x}",
                h.flags & !KNOWN_FLAGS
            )));
        }
        if h.region_bytes < 4096 || !h.region_bytes.is_power_of_two() {
            return Err(FormatError::UsedMap(format!(
                "region size {} is not a power of two of at least 4096",
                h.region_bytes
            )));
        }
        Ok(h)
    }

    /// Header and bits, in whole pages.
    pub fn bytes_on_disk(&self) -> u64 {
        used_map_bytes(self.regions)
    }
}

/// Header page plus `regions` bits, rounded up to whole pages.
pub fn used_map_bytes(regions: u64) -> u64 {
    USED_MAP_HEADER_BYTES as u64 + regions.div_ceil(8).div_ceil(4096) * 4096
}

/// Where node slot `slot`'s map starts, in bytes past the first map, when each takes
/// `map_bytes` ([`UsedMapHeader::bytes_on_disk`]).
pub fn node_map_offset(map_bytes: u64, slot: usize) -> u64 {
    map_bytes * slot as u64
}

/// Where the map starts on a member (sectors from the device start): the first 4 KiB
/// boundary after the bad-block log (after the bitmap space if there is no log).
pub fn used_map_offset_sectors(sb: &crate::Superblock) -> u64 {
    let after = if sb.bblog_size > 0 {
        crate::SB_OFFSET_SECTORS as i64 + i64::from(sb.bblog_offset) + i64::from(sb.bblog_size)
    } else {
        (crate::SB_OFFSET_SECTORS + crate::SB_RESERVED_SECTORS) as i64
            + crate::bm_space(sb.data_offset + sb.data_size) as i64
    };
    (after.max(0) as u64).div_ceil(8) * 8
}

/// The region size for `sync_bytes` of sync coordinates in `room_bytes`: the smallest power
/// of two of at least [`MIN_REGION_BYTES`] (and `align`) whose map fits; None if none does.
pub fn choose_region_bytes(sync_bytes: u64, room_bytes: u64, align: u64) -> Option<u64> {
    let mut region = MIN_REGION_BYTES.max(align.next_power_of_two());
    while used_map_bytes(sync_bytes.div_ceil(region)) > room_bytes {
        region = region.checked_mul(2)?;
    }
    Some(region)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trips_and_checks_its_crc() {
        let h = UsedMapHeader {
            uuid: [3; 16],
            events: 9,
            region_bytes: 1 << 20,
            regions: 1000,
            flags: USED_MAP_FLAG_GUIDED,
            sb_utime: 0x1234_5678,
        };
        let mut b = h.encode();
        assert_eq!(UsedMapHeader::decode(&b).unwrap(), h);
        b[33] ^= 1;
        assert!(UsedMapHeader::decode(&b).is_err());
        b[33] ^= 1;
        b[57] ^= 1;
        assert!(
            UsedMapHeader::decode(&b).is_err(),
            "sb_utime is checksummed"
        );
        // A version 2 header cut before its checksum (the fuzzer found this one).
        b[57] ^= 1;
        assert!(matches!(
            UsedMapHeader::decode(&b[..64]),
            Err(FormatError::Truncated)
        ));
        // A version 1 header (no sb_utime, checksum at 56) still decodes.
        let mut v1 = [0u8; 4096];
        v1[..56].copy_from_slice(&h.encode()[..56]);
        v1[8..12].copy_from_slice(&1u32.to_le_bytes());
        let crc = parity::crc32c(&v1[..56]);
        v1[56..60].copy_from_slice(&crc.to_le_bytes());
        assert_eq!(
            UsedMapHeader::decode(&v1).unwrap(),
            UsedMapHeader {
                sb_utime: 0,
                ..h.clone()
            }
        );
        assert!(UsedMapHeader::decode(&[0u8; 4096]).is_err());
        let unknown = UsedMapHeader { flags: 8, ..h };
        let e = UsedMapHeader::decode(&unknown.encode()).unwrap_err();
        assert!(e.to_string().contains("unknown flags"), "{e}");
    }

    #[test]
    fn region_size_fits_the_room() {
        // 1 GiB in 2 MiB of headroom: 1 MiB regions, one page of bits.
        assert_eq!(
            choose_region_bytes(1 << 30, 2 << 20, 512 << 10),
            Some(1 << 20)
        );
        // 4 TiB in 8 KiB (one header page, one bit page): 32768 bits → 128 MiB regions.
        assert_eq!(choose_region_bytes(4 << 40, 8192, 4096), Some(128 << 20));
        assert_eq!(choose_region_bytes(1 << 30, 4096, 4096), None);
        assert_eq!(used_map_bytes(1), 8192);
    }
}
