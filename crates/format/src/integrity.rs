//! ironraid's integrity zone: CRC32C records of every 4 KiB member block, kept on *other*
//! members (design study `integrity-design.md`, layout b2).
//!
//! md's data area is untouched. Past md's `size` on every member (rounded up to a page inside
//! `data_size`, which md ignores beyond `size` for parity levels) lies the zone: for each copy
//! `c` in `0..copies`, the table of subject role `(holder - 1 - c) mod raid_disks`, i.e. the
//! records about member X live on X+1 and X+2 (RAID6 also X+3). A table is
//! [`RECORDS_PER_TABLE`] records per 4 KiB table block.
//!
//! # Table block (all integers little-endian)
//!
//! | off | size | field |
//! |---|---|---|
//! | 0 | 4 | magic [`TABLE_MAGIC`] |
//! | 4 | 2 | version [`TABLE_VERSION`] |
//! | 6 | 1 | checksum type (1: CRC32C) |
//! | 7 | 1 | copy number |
//! | 8 | 4 | subject role (whose blocks the records describe) |
//! | 12 | 4 | holder role (the member the block sits on) |
//! | 16 | 8 | table index (covers subject blocks `1008·index ..`) |
//! | 24 | 8 | epoch: every write-out of tables takes a new, larger one |
//! | 32 | 16 | array UUID |
//! | 48 | 4 | CRC32C of the block with this field zero, seeded by the block's place |
//! | 52 | 12 | zero |
//! | 64 | 4032 | 1008 records |
//!
//! A record is md raid5-cache's page checksum: [`crate::crc32c_raw`] of the 4 KiB block,
//! seeded with [`crate::journal_seed`] of the array UUID. The block checksum is seeded by the
//! block's place (holder, subject, copy, index), so a table block written to, or read from,
//! the wrong place fails like a corrupt one.
//!
//! The array carries feature bit [`FEATURE_INTEGRITY`] (bit 31, outside md's allocation), so
//! the kernel refuses to assemble it while `mdadm --examine` still decodes everything.

use crate::{crc32c_raw, journal_seed, FormatError};

pub const TABLE_MAGIC: u32 = 0x4254_5249; // "IRTB"
pub const TABLE_VERSION: u16 = 1;
pub const CSUM_CRC32C: u8 = 1;
/// Bytes per record block (md's page) and per table block.
pub const RECORD_BLOCK: usize = 4096;
pub const TABLE_HEADER_BYTES: usize = 64;
pub const RECORDS_PER_TABLE: usize = (RECORD_BLOCK - TABLE_HEADER_BYTES) / 4;
/// `feature_map` bit of an array with an integrity zone: unknown to md, which then refuses it.
pub const FEATURE_INTEGRITY: u32 = 0x8000_0000;
/// The zone starts on this boundary (sectors, one page) past md's `size`.
const ZONE_ALIGN_SECTORS: u64 = 8;

/// Where the tables of one array sit on its members.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Zone {
    pub raid_disks: usize,
    pub copies: usize,
    /// Member blocks (4 KiB) each role has below md's `size`.
    pub blocks: u64,
    /// Table blocks per subject and copy.
    pub tables: u64,
    /// Start of the zone, in sectors from the data offset.
    pub start_sectors: u64,
}

impl Zone {
    /// The zone of an array whose members use `size_sectors` of their data area.
    pub fn new(raid_disks: usize, copies: usize, size_sectors: u64) -> Zone {
        assert!(
            copies >= 1 && copies < raid_disks,
            "{copies} table copies need more than {raid_disks} members"
        );
        let blocks = size_sectors / 8;
        Zone {
            raid_disks,
            copies,
            blocks,
            tables: blocks.div_ceil(RECORDS_PER_TABLE as u64),
            start_sectors: size_sectors.div_ceil(ZONE_ALIGN_SECTORS) * ZONE_ALIGN_SECTORS,
        }
    }

    /// Sectors of the zone on every member.
    pub fn len_sectors(&self) -> u64 {
        self.copies as u64 * self.tables * 8
    }

    /// Sectors of the data area the array needs per member: md's `size` plus the zone.
    pub fn end_sectors(&self) -> u64 {
        self.start_sectors + self.len_sectors()
    }

    /// The member holding copy `copy` of `subject`'s tables.
    pub fn holder(&self, subject: usize, copy: usize) -> usize {
        (subject + 1 + copy) % self.raid_disks
    }

    /// The subject whose copy `copy` `holder` keeps.
    pub fn subject(&self, holder: usize, copy: usize) -> usize {
        (holder + self.raid_disks - 1 - copy) % self.raid_disks
    }

    /// Sector (from the data offset, on the holder) of table block `index` of copy `copy`.
    pub fn table_sector(&self, copy: usize, index: u64) -> u64 {
        assert!(index < self.tables && copy < self.copies);
        self.start_sectors + (copy as u64 * self.tables + index) * 8
    }

    /// The largest md `size` (sectors, a multiple of `chunk_sectors`) whose zone still fits in
    /// `data_sectors`.
    pub fn fit(
        raid_disks: usize,
        copies: usize,
        data_sectors: u64,
        chunk_sectors: u64,
    ) -> Option<u64> {
        // Each copy needs 8 sectors of table per RECORDS_PER_TABLE·8 sectors of subject.
        let per = RECORDS_PER_TABLE as u64;
        let guess = data_sectors.saturating_sub(ZONE_ALIGN_SECTORS + 8 * copies as u64) * per
            / (per + copies as u64);
        let mut size = guess / chunk_sectors * chunk_sectors;
        while size > 0 && Zone::new(raid_disks, copies, size).end_sectors() > data_sectors {
            size -= chunk_sectors;
        }
        (size > 0).then_some(size)
    }
}

/// Table copies per subject for a level and member count: RAID4/5 two, RAID6 three (one more
/// than the redundancy, so that a device holding a block's redundancy never outvotes it alone).
/// Mirrors (RAID1, RAID10) keep two where they have three members or more, else one: a 2-way
/// mirror's records of each member sit on the other, and its twin's table, which records the
/// same blocks, stands in when that member is gone. Linear and RAID0 get none: with nothing to
/// repair from, a record could only turn wrong data into an error.
pub fn table_copies(md_level: i32, raid_disks: usize) -> Option<usize> {
    match md_level {
        4 | 5 => (raid_disks > 2).then_some(2),
        6 => (raid_disks > 3).then_some(3),
        1 | 10 => (raid_disks >= 2).then_some(2.min(raid_disks - 1)),
        _ => None,
    }
}

/// The record of one 4 KiB block.
pub fn record_of(seed: u32, block: &[u8]) -> u32 {
    debug_assert_eq!(block.len(), RECORD_BLOCK);
    crc32c_raw(seed, block)
}

/// The seed of every record of the array with this UUID (md raid5-cache's page checksum seed).
pub fn record_seed(set_uuid: &[u8; 16]) -> u32 {
    journal_seed(set_uuid)
}

/// One decoded table block.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TableBlock {
    pub copy: u8,
    pub subject: u32,
    pub holder: u32,
    pub index: u64,
    pub epoch: u64,
    pub uuid: [u8; 16],
    pub records: Vec<u32>,
}

/// The seed of a table block's own checksum: the array's, advanced over the block's place.
fn place_seed(uuid: &[u8; 16], copy: u8, subject: u32, holder: u32, index: u64) -> u32 {
    let mut place = [0u8; 17];
    place[0] = copy;
    place[1..5].copy_from_slice(&subject.to_le_bytes());
    place[5..9].copy_from_slice(&holder.to_le_bytes());
    place[9..17].copy_from_slice(&index.to_le_bytes());
    crc32c_raw(journal_seed(uuid), &place)
}

impl TableBlock {
    pub fn encode(&self) -> Vec<u8> {
        assert_eq!(self.records.len(), RECORDS_PER_TABLE);
        let mut b = vec![0u8; RECORD_BLOCK];
        b[0..4].copy_from_slice(&TABLE_MAGIC.to_le_bytes());
        b[4..6].copy_from_slice(&TABLE_VERSION.to_le_bytes());
        b[6] = CSUM_CRC32C;
        b[7] = self.copy;
        b[8..12].copy_from_slice(&self.subject.to_le_bytes());
        b[12..16].copy_from_slice(&self.holder.to_le_bytes());
        b[16..24].copy_from_slice(&self.index.to_le_bytes());
        b[24..32].copy_from_slice(&self.epoch.to_le_bytes());
        b[32..48].copy_from_slice(&self.uuid);
        for (i, r) in self.records.iter().enumerate() {
            let at = TABLE_HEADER_BYTES + 4 * i;
            b[at..at + 4].copy_from_slice(&r.to_le_bytes());
        }
        let seed = place_seed(&self.uuid, self.copy, self.subject, self.holder, self.index);
        let crc = crc32c_raw(seed, &b);
        b[48..52].copy_from_slice(&crc.to_le_bytes());
        b
    }

    /// Decode the block expected at (copy, subject, holder, index) of the array `uuid`.
    pub fn decode(
        buf: &[u8],
        uuid: &[u8; 16],
        copy: u8,
        subject: u32,
        holder: u32,
        index: u64,
    ) -> Result<TableBlock, FormatError> {
        let bad = |why: String| Err(FormatError::Integrity(why));
        if buf.len() != RECORD_BLOCK {
            return bad(format!("table block of {} bytes", buf.len()));
        }
        let u32_at = |at: usize| u32::from_le_bytes(buf[at..at + 4].try_into().expect("4"));
        let u64_at = |at: usize| u64::from_le_bytes(buf[at..at + 8].try_into().expect("8"));
        if u32_at(0) != TABLE_MAGIC {
            return bad(format!("bad table magic {:#x}", u32_at(0)));
        }
        let version = u16::from_le_bytes([buf[4], buf[5]]);
        if version != TABLE_VERSION || buf[6] != CSUM_CRC32C {
            return bad(format!(
                "table version {version} checksum type {} unknown",
                buf[6]
            ));
        }
        let mut zeroed = buf.to_vec();
        zeroed[48..52].fill(0);
        let crc = crc32c_raw(place_seed(uuid, copy, subject, holder, index), &zeroed);
        if crc != u32_at(48) {
            return bad(format!(
                "table checksum {:#010x}, computed {crc:#010x} for copy {copy} of role \
                 {subject}'s table {index} on role {holder}",
                u32_at(48)
            ));
        }
        let block = TableBlock {
            copy: buf[7],
            subject: u32_at(8),
            holder: u32_at(12),
            index: u64_at(16),
            epoch: u64_at(24),
            uuid: buf[32..48].try_into().expect("16"),
            records: (0..RECORDS_PER_TABLE)
                .map(|i| u32_at(TABLE_HEADER_BYTES + 4 * i))
                .collect(),
        };
        // The seed binds the place, so these only differ under a checksum collision.
        if (
            block.copy,
            block.subject,
            block.holder,
            block.index,
            &block.uuid,
        ) != (copy, subject, holder, index, uuid)
        {
            return bad("table block identity does not match its place".into());
        }
        if buf[52..64].iter().any(|&b| b != 0) {
            return bad("table header padding not zero".into());
        }
        Ok(block)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> TableBlock {
        TableBlock {
            copy: 1,
            subject: 2,
            holder: 4,
            index: 7,
            epoch: 99,
            uuid: [0xab; 16],
            records: (0..RECORDS_PER_TABLE as u32)
                .map(|i| i.wrapping_mul(2_654_435_761))
                .collect(),
        }
    }

    #[test]
    fn round_trip_and_place_binding() {
        let t = sample();
        let b = t.encode();
        assert_eq!(TableBlock::decode(&b, &t.uuid, 1, 2, 4, 7).unwrap(), t);
        // Any other place, or another array, refuses it: a misdirected table write is caught.
        assert!(TableBlock::decode(&b, &t.uuid, 0, 2, 4, 7).is_err());
        assert!(TableBlock::decode(&b, &t.uuid, 1, 3, 4, 7).is_err());
        assert!(TableBlock::decode(&b, &t.uuid, 1, 2, 0, 7).is_err());
        assert!(TableBlock::decode(&b, &t.uuid, 1, 2, 4, 8).is_err());
        assert!(TableBlock::decode(&b, &[0xac; 16], 1, 2, 4, 7).is_err());
    }

    #[test]
    fn every_flipped_bit_is_refused() {
        let t = sample();
        let b = t.encode();
        for bit in (0..RECORD_BLOCK * 8).step_by(97) {
            let mut c = b.clone();
            c[bit / 8] ^= 1 << (bit % 8);
            assert!(
                TableBlock::decode(&c, &t.uuid, 1, 2, 4, 7).is_err(),
                "bit {bit}"
            );
        }
        assert!(TableBlock::decode(&vec![0; RECORD_BLOCK], &t.uuid, 1, 2, 4, 7).is_err());
    }

    #[test]
    fn records_are_md_raid5_cache_page_checksums() {
        // The zero page under the reference seed (journal vectors, reference §6.3).
        let seed = 0x2636_f714;
        assert_eq!(record_of(seed, &[0u8; RECORD_BLOCK]), 0xb330_4a14);
    }

    #[test]
    fn zone_places_copies_on_other_members() {
        let z = Zone::new(5, 2, 1 << 21);
        for s in 0..5 {
            let holders: Vec<usize> = (0..2).map(|c| z.holder(s, c)).collect();
            assert!(!holders.contains(&s));
            assert_ne!(holders[0], holders[1]);
            for (c, &h) in holders.iter().enumerate() {
                assert_eq!(z.subject(h, c), s);
            }
        }
        assert_eq!(z.blocks, (1 << 21) / 8);
        assert!(z.start_sectors >= 1 << 21);
        assert_eq!(z.len_sectors(), 2 * z.tables * 8);
    }

    #[test]
    fn fit_leaves_room_for_the_zone_and_wastes_little() {
        for data in [4096u64, 100_000, 1 << 24, (1 << 31) + 12345] {
            for copies in [2, 3] {
                let size = Zone::fit(6, copies, data, 128).unwrap();
                assert_eq!(size % 128, 0);
                let z = Zone::new(6, copies, size);
                assert!(z.end_sectors() <= data, "data {data} copies {copies}");
                // Little is lost beyond the zone itself: alignment and one chunk.
                assert!(data - size <= z.len_sectors() + 8 + 128 + 8 * copies as u64);
            }
        }
        // One chunk and a table page per copy: not in 130 sectors, in 160.
        assert_eq!(Zone::fit(4, 2, 130, 128), None);
        assert_eq!(Zone::fit(4, 2, 160, 128), Some(128));
    }

    #[test]
    fn feature_bit_is_outside_what_md_knows() {
        assert_eq!(FEATURE_INTEGRITY & crate::feature::KNOWN, 0);
        // md has allocated its bits from 0 upward; ours is the highest.
        assert_eq!(FEATURE_INTEGRITY, 1 << 31);
    }

    #[test]
    fn copies_per_level() {
        assert_eq!(table_copies(5, 3), Some(2));
        assert_eq!(table_copies(5, 2), None);
        assert_eq!(table_copies(6, 4), Some(3));
        assert_eq!(table_copies(4, 4), Some(2));
        assert_eq!(table_copies(1, 2), Some(1));
        assert_eq!(table_copies(1, 3), Some(2));
        assert_eq!(table_copies(10, 4), Some(2));
        assert_eq!(table_copies(1, 1), None);
        assert_eq!(table_copies(0, 4), None);
    }
}
