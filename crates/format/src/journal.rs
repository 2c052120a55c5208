//! md's raid5-cache journal records (reference §6): the 4 KiB meta block that heads every
//! io unit in the log ring, its payload descriptors, and md's checksum flavour.
//!
//! # Meta block (all integers little-endian)
//!
//! | off | size | field |
//! |---|---|---|
//! | 0 | 4 | magic [`JOURNAL_MAGIC`] |
//! | 4 | 4 | checksum over the whole 4 KiB block, this field taken as zero |
//! | 8 | 1 | version [`JOURNAL_VERSION`] |
//! | 9 | 3 | zero |
//! | 12 | 4 | meta_size: bytes used (32 + descriptors) |
//! | 16 | 8 | seq: consecutive io units carry seq, seq + 1, … |
//! | 24 | 8 | position: the sector of this block in the log (relative to the data area) |
//! | 32 | … | descriptors, each starting with le16 type, le16 flags |
//!
//! Descriptors: DATA / PARITY `type, flags, le32 size (sectors of pages that follow, 8 per
//! page), le64 location, le32 checksum per page` (DATA: the array sector of the page; PARITY:
//! the per-member sector of the stripe, P then Q); FLUSH `type, flags, le32 size (bytes of
//! the list), le64 stripe sector per entry`. The pages follow the meta block in descriptor order.
//!
//! # Checksums
//! The kernel's `crc32c_le(seed, buf)`: reflected CRC-32C with neither initial nor final
//! inversion, seeded with `crc32c_le(!0, array uuid)`. See [`journal_seed`], [`crc32c_raw`].

use crate::FormatError;

pub const JOURNAL_MAGIC: u32 = 0x6433_c509;
pub const JOURNAL_VERSION: u8 = 1;
/// Bytes of a meta block and of every payload page.
pub const JOURNAL_BLOCK: usize = 4096;
/// Sectors per journal page.
pub const PAGE_SECTORS: u32 = 8;
const HEADER_BYTES: usize = 32;

pub const PAYLOAD_DATA: u16 = 0;
pub const PAYLOAD_PARITY: u16 = 1;
pub const PAYLOAD_FLUSH: u16 = 2;

/// The kernel's `crc32c_le`: raw CRC-32C, no inversion in or out.
pub fn crc32c_raw(seed: u32, data: &[u8]) -> u32 {
    parity::crc32c_raw(seed, data)
}

/// The seed of every journal checksum of the array with this UUID.
pub fn journal_seed(set_uuid: &[u8; 16]) -> u32 {
    crc32c_raw(!0, set_uuid)
}

/// The checksums of a payload's pages, one per page: one for a data page, P (and Q) for a
/// parity payload. Kept inline: the journal builds one per logged page, and a heap allocation
/// each was a measurable share of a logged write's CPU.
pub type PageChecksums = smallvec::SmallVec<[u32; 2]>;

/// One payload descriptor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Payload {
    /// Data pages at array sector `location` (consecutive pages at consecutive sectors), with
    /// one checksum per page.
    Data {
        location: u64,
        checksums: PageChecksums,
    },
    /// The parity pages of the stripe at per-member sector `location`: P, then Q on RAID6.
    Parity {
        location: u64,
        checksums: PageChecksums,
    },
    /// These stripes (per-member sectors) reached the members (write-back mode).
    Flush { stripes: Vec<u64> },
}

impl Payload {
    /// Pages of this payload that follow the meta block.
    pub fn pages(&self) -> usize {
        match self {
            Payload::Data { checksums, .. } | Payload::Parity { checksums, .. } => checksums.len(),
            Payload::Flush { .. } => 0,
        }
    }

    /// Bytes this descriptor takes in the meta block.
    pub fn encoded_len(&self) -> usize {
        match self {
            Payload::Data { checksums, .. } | Payload::Parity { checksums, .. } => {
                16 + 4 * checksums.len()
            }
            Payload::Flush { stripes } => 8 + 8 * stripes.len(),
        }
    }
}

/// A decoded meta block.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MetaBlock {
    pub seq: u64,
    /// Sector of this block in the log.
    pub position: u64,
    pub payloads: Vec<Payload>,
}

impl MetaBlock {
    /// An io unit with nothing in it (what mdadm writes at create and recovery writes after
    /// replay).
    pub fn empty(seq: u64, position: u64) -> MetaBlock {
        MetaBlock {
            seq,
            position,
            payloads: Vec::new(),
        }
    }

    /// Bytes used: header and descriptors.
    pub fn meta_size(&self) -> usize {
        HEADER_BYTES
            + self
                .payloads
                .iter()
                .map(Payload::encoded_len)
                .sum::<usize>()
    }

    /// Does one more payload of `len` descriptor bytes fit?
    pub fn has_room(&self, len: usize) -> bool {
        self.meta_size() + len <= JOURNAL_BLOCK
    }

    /// Pages following this block.
    pub fn pages(&self) -> usize {
        self.payloads.iter().map(Payload::pages).sum()
    }

    /// Sectors the io unit takes in the ring: the meta block and its pages.
    pub fn unit_sectors(&self) -> u64 {
        (1 + self.pages() as u64) * u64::from(PAGE_SECTORS)
    }

    /// The 4 KiB block with its checksum. Panics if the descriptors overflow the block
    /// (callers check [`MetaBlock::has_room`]).
    pub fn encode(&self, seed: u32) -> [u8; JOURNAL_BLOCK] {
        let size = self.meta_size();
        assert!(size <= JOURNAL_BLOCK, "meta block overflows: {size} bytes");
        let mut b = [0u8; JOURNAL_BLOCK];
        b[0..4].copy_from_slice(&JOURNAL_MAGIC.to_le_bytes());
        b[8] = JOURNAL_VERSION;
        b[12..16].copy_from_slice(&(size as u32).to_le_bytes());
        b[16..24].copy_from_slice(&self.seq.to_le_bytes());
        b[24..32].copy_from_slice(&self.position.to_le_bytes());
        let mut at = HEADER_BYTES;
        for p in &self.payloads {
            match p {
                Payload::Data {
                    location,
                    checksums,
                }
                | Payload::Parity {
                    location,
                    checksums,
                } => {
                    let kind = if matches!(p, Payload::Data { .. }) {
                        PAYLOAD_DATA
                    } else {
                        PAYLOAD_PARITY
                    };
                    b[at..at + 2].copy_from_slice(&kind.to_le_bytes());
                    let sectors = checksums.len() as u32 * PAGE_SECTORS;
                    b[at + 4..at + 8].copy_from_slice(&sectors.to_le_bytes());
                    b[at + 8..at + 16].copy_from_slice(&location.to_le_bytes());
                    at += 16;
                    for c in checksums {
                        b[at..at + 4].copy_from_slice(&c.to_le_bytes());
                        at += 4;
                    }
                }
                Payload::Flush { stripes } => {
                    b[at..at + 2].copy_from_slice(&PAYLOAD_FLUSH.to_le_bytes());
                    let bytes = stripes.len() as u32 * 8;
                    b[at + 4..at + 8].copy_from_slice(&bytes.to_le_bytes());
                    at += 8;
                    for s in stripes {
                        b[at..at + 8].copy_from_slice(&s.to_le_bytes());
                        at += 8;
                    }
                }
            }
        }
        let crc = crc32c_raw(seed, &b);
        b[4..8].copy_from_slice(&crc.to_le_bytes());
        b
    }

    /// Decode and check a meta block read at sector `position` of the log: magic, version,
    /// checksum, its own position, and descriptors that fit. The caller checks `seq`.
    pub fn decode(buf: &[u8], seed: u32, position: u64) -> Result<MetaBlock, FormatError> {
        let bad = |why: String| Err(FormatError::Journal(why));
        if buf.len() < JOURNAL_BLOCK {
            return Err(FormatError::Truncated);
        }
        let le32 = |at: usize| u32::from_le_bytes(buf[at..at + 4].try_into().expect("4 bytes"));
        let le64 = |at: usize| u64::from_le_bytes(buf[at..at + 8].try_into().expect("8 bytes"));
        let le16 = |at: usize| u16::from_le_bytes(buf[at..at + 2].try_into().expect("2 bytes"));
        if le32(0) != JOURNAL_MAGIC {
            return bad(format!("bad magic {:#010x}", le32(0)));
        }
        if buf[8] != JOURNAL_VERSION {
            return bad(format!("unsupported version {}", buf[8]));
        }
        let stored = le32(4);
        let mut copy = [0u8; JOURNAL_BLOCK];
        copy.copy_from_slice(&buf[..JOURNAL_BLOCK]);
        copy[4..8].fill(0);
        let computed = crc32c_raw(seed, &copy);
        if stored != computed {
            return bad(format!(
                "checksum mismatch: stored {stored:#010x}, computed {computed:#010x}"
            ));
        }
        if le64(24) != position {
            return bad(format!(
                "block at sector {position} says it is at sector {}",
                le64(24)
            ));
        }
        let size = le32(12) as usize;
        if !(HEADER_BYTES..=JOURNAL_BLOCK).contains(&size) {
            return bad(format!("meta_size {size} out of range"));
        }
        let mut payloads = Vec::new();
        let mut at = HEADER_BYTES;
        while at < size {
            if at + 8 > size {
                return bad(format!("descriptor at byte {at} truncated"));
            }
            let kind = le16(at);
            let len = le32(at + 4) as usize;
            match kind {
                PAYLOAD_DATA | PAYLOAD_PARITY => {
                    if len == 0 || !len.is_multiple_of(PAGE_SECTORS as usize) {
                        return bad(format!("payload of {len} sectors is not whole pages"));
                    }
                    let pages = len / PAGE_SECTORS as usize;
                    let end = at + 16 + 4 * pages;
                    if end > size {
                        return bad(format!("descriptor at byte {at} runs past meta_size"));
                    }
                    let location = le64(at + 8);
                    let checksums = (0..pages).map(|i| le32(at + 16 + 4 * i)).collect();
                    payloads.push(if kind == PAYLOAD_DATA {
                        Payload::Data {
                            location,
                            checksums,
                        }
                    } else {
                        Payload::Parity {
                            location,
                            checksums,
                        }
                    });
                    at = end;
                }
                PAYLOAD_FLUSH => {
                    if !len.is_multiple_of(8) {
                        return bad(format!("flush list of {len} bytes"));
                    }
                    let end = at + 8 + len;
                    if end > size {
                        return bad(format!("descriptor at byte {at} runs past meta_size"));
                    }
                    let stripes = (0..len / 8).map(|i| le64(at + 8 + 8 * i)).collect();
                    payloads.push(Payload::Flush { stripes });
                    at = end;
                }
                t => return bad(format!("unknown payload type {t}")),
            }
        }
        Ok(MetaBlock {
            seq: le64(16),
            position,
            payloads,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checksum_matches_the_reference_vectors() {
        let uuid: [u8; 16] = std::array::from_fn(|i| i as u8);
        let seed = journal_seed(&uuid);
        assert_eq!(seed, 0x2636_f714);
        assert_eq!(crc32c_raw(seed, &[0u8; 4096]), 0xb330_4a14);
        assert_eq!(!crc32c_raw(!0, b"123456789"), 0xe306_9283);
    }

    #[test]
    fn meta_block_round_trips_and_is_checked() {
        let seed = 0x1234_5678;
        let m = MetaBlock {
            seq: 77,
            position: 4096,
            payloads: vec![
                Payload::Data {
                    location: 1024,
                    checksums: PageChecksums::from_slice(&[1]),
                },
                Payload::Parity {
                    location: 64,
                    checksums: PageChecksums::from_slice(&[2, 3]),
                },
                Payload::Flush {
                    stripes: vec![8, 16],
                },
            ],
        };
        assert_eq!(m.meta_size(), 32 + 20 + 24 + 24);
        assert_eq!(m.unit_sectors(), 4 * 8);
        let b = m.encode(seed);
        assert_eq!(MetaBlock::decode(&b, seed, 4096).unwrap(), m);
        assert!(MetaBlock::decode(&b, seed ^ 1, 4096).is_err(), "other seed");
        assert!(MetaBlock::decode(&b, seed, 4104).is_err(), "other position");
        let mut flipped = b;
        flipped[40] ^= 1;
        assert!(MetaBlock::decode(&flipped, seed, 4096).is_err(), "bit flip");
    }

    #[test]
    fn full_meta_block_holds_md_s_203_single_page_payloads() {
        let mut m = MetaBlock::empty(1, 0);
        let one = Payload::Data {
            location: 0,
            checksums: PageChecksums::from_slice(&[0]),
        };
        while m.has_room(one.encoded_len()) {
            m.payloads.push(one.clone());
        }
        assert_eq!(m.payloads.len(), 203);
        let b = m.encode(5);
        assert_eq!(MetaBlock::decode(&b, 5, 0).unwrap().payloads.len(), 203);
    }
}
