//! An independent reader of md's raid5-cache log, written from reference §6
//! (`shared/reference/md-format.md`) and nothing else: it shares no code with the `format`
//! crate's encoder and decoder, so the two can check each other. Also the model of what the
//! array holds that the log is compared with.

use std::collections::BTreeMap;

pub const PAGE: usize = 4096;
/// The arrays of the journal tests: RAID5, 4 members, left-symmetric, 64 KiB chunks.
pub const CHUNK_SECTORS: u64 = 128;
pub const DATA_DISKS: u64 = 3;

/// The kernel's `crc32c_le`: reflected CRC-32C without inversion in or out (§6.3).
pub fn crc_raw(seed: u32, data: &[u8]) -> u32 {
    !crc32c::crc32c_append(!seed, data)
}

fn le16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes(b[at..at + 2].try_into().unwrap())
}
fn le32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
}
fn le64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
}

/// What the log device's v1.2 superblock (at 4 KiB) says about the log.
pub struct LogSuper {
    pub set_uuid: [u8; 16],
    pub data_offset: u64,
    pub data_size: u64,
    pub journal_tail: u64,
}

pub fn log_super(img: &[u8]) -> LogSuper {
    let sb = &img[4096..8192];
    assert_eq!(
        le32(sb, 0),
        0xa92b_4efc,
        "no md superblock at 4 KiB of the log"
    );
    LogSuper {
        set_uuid: sb[16..32].try_into().unwrap(),
        data_offset: le64(sb, 128),
        data_size: le64(sb, 136),
        journal_tail: le64(sb, 152),
    }
}

/// One payload of an io unit: its type (0 DATA, 1 PARITY), location, and its pages with the
/// log sector each was read from.
pub struct Payload {
    pub kind: u16,
    pub location: u64,
    pub pages: Vec<(u64, Vec<u8>)>,
}

pub struct Unit {
    pub seq: u64,
    pub payloads: Vec<Payload>,
}

pub struct Decoded {
    pub units: Vec<Unit>,
    /// Checksum mismatches of pages, malformed descriptors, a tail that is not a meta block.
    pub problems: Vec<String>,
    /// Why the chain ended.
    pub end: String,
}

/// Is the 4 KiB block read at log sector `pos` the meta block the chain expects next?
fn check_meta(b: &[u8], seed: u32, pos: u64, want_seq: Option<u64>) -> Result<(), String> {
    if le32(b, 0) != 0x6433_c509 {
        return Err(format!("magic {:#010x}", le32(b, 0)));
    }
    if b[8] != 1 {
        return Err(format!("version {}", b[8]));
    }
    let mut copy = b.to_vec();
    copy[4..8].fill(0);
    let (stored, computed) = (le32(b, 4), crc_raw(seed, &copy));
    if stored != computed {
        return Err(format!(
            "meta checksum mismatch: stored {stored:#010x}, computed {computed:#010x}"
        ));
    }
    if le64(b, 24) != pos {
        return Err(format!("position {} read at sector {pos}", le64(b, 24)));
    }
    if !(32..=4096).contains(&(le32(b, 12) as usize)) {
        return Err(format!("meta_size {}", le32(b, 12)));
    }
    match want_seq {
        Some(want) if le64(b, 16) != want => Err(format!("seq {} after {}", le64(b, 16), want - 1)),
        _ => Ok(()),
    }
}

/// Walk the chain of io units from `journal_tail` (§6.2, §6.5 steps 1–3).
pub fn decode_log(img: &[u8]) -> Decoded {
    let sb = log_super(img);
    let seed = crc_raw(0xffff_ffff, &sb.set_uuid);
    let ring = sb.data_size / 8 * 8;
    let block = |sector: u64| {
        let at = ((sb.data_offset + sector) * 512) as usize;
        &img[at..at + PAGE]
    };
    let (mut units, mut problems) = (Vec::new(), Vec::new());
    let (mut pos, mut want_seq) = (sb.journal_tail, None);
    let end = loop {
        if units.len() as u64 > ring / 8 {
            break "the chain went round the ring".to_string();
        }
        let b = block(pos);
        if let Err(why) = check_meta(b, seed, pos, want_seq) {
            if units.is_empty() {
                problems.push(format!(
                    "the tail (sector {pos}) is not a meta block: {why}"
                ));
            }
            break format!("after {} units, at sector {pos}: {why}", units.len());
        }
        let seq = le64(b, 16);
        let size = le32(b, 12) as usize;
        let (mut at, mut page, mut payloads) = (32, 0u64, Vec::new());
        while at < size {
            let (kind, len) = (le16(b, at), u64::from(le32(b, at + 4)));
            if kind == 2 {
                at += 8 + len as usize; // FLUSH: `len` bytes of stripe sectors.
                continue;
            }
            if kind > 2 || len == 0 || len % 8 != 0 || at + 16 + 4 * (len as usize / 8) > size {
                problems.push(format!("unit seq {seq}: bad descriptor at byte {at}"));
                break;
            }
            let location = le64(b, at + 8);
            let mut pages = Vec::new();
            for i in 0..(len / 8) as usize {
                let sector = (pos + 8 * (1 + page)) % ring;
                let p = block(sector).to_vec();
                let (stored, computed) = (le32(b, at + 16 + 4 * i), crc_raw(seed, &p));
                if stored != computed {
                    problems.push(format!(
                        "unit seq {seq}: page at log sector {sector} (type {kind}, location \
                         {location}): checksum mismatch, stored {stored:#010x}, computed \
                         {computed:#010x}"
                    ));
                }
                pages.push((sector, p));
                page += 1;
            }
            payloads.push(Payload {
                kind,
                location,
                pages,
            });
            at += 16 + 4 * (len as usize / 8);
        }
        units.push(Unit { seq, payloads });
        want_seq = Some(seq + 1);
        pos = (pos + 8 * (1 + page)) % ring;
        if pos == sb.journal_tail {
            break "came back to the tail".to_string();
        }
    };
    Decoded {
        units,
        problems,
        end,
    }
}

/// The newest logged page of every DATA sector (array sectors) and PARITY stripe sector.
pub type Pages = BTreeMap<u64, Vec<u8>>;

pub fn newest_pages(d: &Decoded) -> (Pages, Pages) {
    let (mut data, mut parity) = (Pages::new(), Pages::new());
    for p in d.units.iter().flat_map(|u| &u.payloads) {
        let into = if p.kind == 0 { &mut data } else { &mut parity };
        for (i, (_, page)) in p.pages.iter().enumerate() {
            into.insert(p.location + 8 * i as u64, page.clone());
        }
    }
    (data, parity)
}

/// What the array holds: the bytes written, zero elsewhere; by 4 KiB page.
#[derive(Default)]
pub struct Model(pub BTreeMap<u64, Vec<u8>>);

impl Model {
    pub fn write(&mut self, offset: u64, data: &[u8]) {
        for (i, byte) in data.iter().enumerate() {
            let at = offset + i as u64;
            let page = self
                .0
                .entry(at / PAGE as u64)
                .or_insert_with(|| vec![0; PAGE]);
            page[(at % PAGE as u64) as usize] = *byte;
        }
    }

    /// The page at array sector `sector`.
    pub fn page(&self, sector: u64) -> Vec<u8> {
        assert_eq!(sector % 8, 0, "page location {sector} not 4 KiB aligned");
        self.0
            .get(&(sector / 8))
            .cloned()
            .unwrap_or_else(|| vec![0; PAGE])
    }
}

/// RAID5 parity of the stripe column at per-member sector `s`: XOR of its data pages (for
/// the stripe sector, which member holds which chunk does not matter).
pub fn model_parity(model: &Model, s: u64) -> Vec<u8> {
    let (stripe, off) = (s / CHUNK_SECTORS, s % CHUNK_SECTORS);
    let mut p = vec![0u8; PAGE];
    for d in 0..DATA_DISKS {
        let sector = (stripe * DATA_DISKS + d) * CHUNK_SECTORS + off;
        for (x, y) in p.iter_mut().zip(model.page(sector)) {
            *x ^= y;
        }
    }
    p
}

#[test]
fn decoder_checksums_match_the_reference_vectors() {
    let uuid: Vec<u8> = (0..16).collect();
    let seed = crc_raw(0xffff_ffff, &uuid);
    assert_eq!(seed, 0x2636_f714);
    assert_eq!(crc_raw(seed, &[0; PAGE]), 0xb330_4a14);
    assert_eq!(!crc_raw(!0, b"123456789"), 0xe306_9283);
}
