//! md's bad-block log (v1.2), encode and decode (pure, no I/O).
//!
//! Facts (`shared/reference/md-format.md` §1.9): `bblog_size` sectors at `super_offset +
//! bblog_offset` (signed); an array of little-endian u64 entries, each `start << 10 | len`
//! with start and len in units of `1 << bblog_shift` sectors (len 1..=512, stored as is: mdadm
//! prints the low 10 bits as the sector count); an all-ones entry
//! ends the list and unused space is 0xFF. Starts are absolute device sectors (data_offset
//! included), which is what `mdadm --examine-badblocks` prints. The kernel reads at most one
//! 4 KiB page (512 entries). The superblock's `BAD_BLOCKS` feature bit says the list is not
//! empty (mdadm prints nothing from a log whose bit is clear).

/// Entries one 4 KiB log page holds (the kernel's limit).
pub const BBLOG_MAX_ENTRIES: usize = 512;
/// Longest run one entry can describe, in units.
pub const BBLOG_MAX_LEN: u64 = 512;
/// Bytes of a log entry.
const ENTRY_BYTES: usize = 8;
/// The terminator / unused-entry pattern.
const END: u64 = u64::MAX;

/// One bad range: absolute device sectors.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct BadRange {
    pub start_sector: u64,
    pub len_sectors: u64,
}

/// Encode `ranges` (sorted, non-overlapping, absolute sectors, multiples of `1 << shift`) into
/// a log of `log_bytes` (a whole number of entries). Runs longer than one entry allows are
/// split. Returns `None` when they do not fit in the log (or in one page).
pub fn encode_bad_blocks(ranges: &[BadRange], shift: u8, log_bytes: usize) -> Option<Vec<u8>> {
    assert!(
        log_bytes.is_multiple_of(ENTRY_BYTES),
        "a log holds whole entries"
    );
    let unit = 1u64 << shift;
    let cap = (log_bytes / ENTRY_BYTES).min(BBLOG_MAX_ENTRIES);
    let mut out = vec![0xffu8; log_bytes];
    let mut n = 0usize;
    for r in ranges {
        assert!(
            r.start_sector.is_multiple_of(unit) && r.len_sectors.is_multiple_of(unit),
            "bad range {r:?} not in whole units of {unit} sectors"
        );
        let (mut start, mut left) = (r.start_sector / unit, r.len_sectors / unit);
        while left > 0 {
            let len = left.min(BBLOG_MAX_LEN);
            if n == cap || start >= 1 << 54 {
                return None;
            }
            let entry = (start << 10) | len;
            out[n * ENTRY_BYTES..(n + 1) * ENTRY_BYTES].copy_from_slice(&entry.to_le_bytes());
            n += 1;
            start += len;
            left -= len;
        }
    }
    Some(out)
}

/// Decode a log: every entry up to the first all-ones one (at most one page's worth), as
/// absolute sectors. Entries a `shift` from a damaged or foreign superblock would put past the
/// sector space are left out rather than wrapped.
pub fn decode_bad_blocks(log: &[u8], shift: u8) -> Vec<BadRange> {
    let Some(unit) = 1u64.checked_shl(u32::from(shift)) else {
        return Vec::new();
    };
    log.chunks_exact(ENTRY_BYTES)
        .take(BBLOG_MAX_ENTRIES)
        .map(|e| u64::from_le_bytes(e.try_into().expect("8-byte chunk")))
        .take_while(|&e| e != END)
        .filter(|&e| e & 0x3ff != 0)
        .filter_map(|e| {
            let start_sector = (e >> 10).checked_mul(unit)?;
            let len_sectors = (e & 0x3ff).checked_mul(unit)?;
            start_sector.checked_add(len_sectors)?;
            Some(BadRange {
                start_sector,
                len_sectors,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_terminator() {
        let ranges = [
            BadRange {
                start_sector: 2048 + 8,
                len_sectors: 8,
            },
            BadRange {
                start_sector: 4096,
                len_sectors: 1024,
            },
        ];
        let log = encode_bad_blocks(&ranges, 0, 4096).expect("fits");
        assert_eq!(&log[..8], &(((2048u64 + 8) << 10) | 8).to_le_bytes());
        assert!(log[24..].iter().all(|&b| b == 0xff), "unused space is 0xff");
        let back = decode_bad_blocks(&log, 0);
        // The 1024-sector run takes two entries of 512.
        assert_eq!(back.len(), 3);
        assert_eq!(back[0], ranges[0]);
        assert_eq!(back[1].start_sector, 4096);
        assert_eq!(back[1].len_sectors + back[2].len_sectors, 1024);
    }

    #[test]
    fn empty_log_is_all_ones_and_overflow_is_refused() {
        assert!(decode_bad_blocks(&[0xff; 4096], 0).is_empty());
        let many: Vec<BadRange> = (0..600)
            .map(|i| BadRange {
                start_sector: i * 16,
                len_sectors: 8,
            })
            .collect();
        assert!(encode_bad_blocks(&many, 0, 4096).is_none());
        let shifted = encode_bad_blocks(&many[..2], 3, 4096).expect("fits");
        assert_eq!(decode_bad_blocks(&shifted, 3), many[..2].to_vec());
    }

    #[test]
    fn a_shift_past_the_sector_space_decodes_nothing_it_would_wrap() {
        let log = encode_bad_blocks(
            &[BadRange {
                start_sector: 1 << 40,
                len_sectors: 8,
            }],
            0,
            4096,
        )
        .expect("fits");
        assert!(decode_bad_blocks(&log, 64).is_empty());
        assert!(
            decode_bad_blocks(&log, 30).is_empty(),
            "start << 30 overflows"
        );
        assert_eq!(decode_bad_blocks(&log, 0).len(), 1);
    }
}
