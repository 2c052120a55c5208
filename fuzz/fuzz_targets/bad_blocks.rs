//! Fuzz md's bad-block log decoder: `cargo +nightly fuzz run bad_blocks`.
//!
//! Invariants: decoding never panics, whatever the log and the superblock's shift; every range
//! it returns is non-empty, ends inside the sector space, and is a whole number of units; a
//! list re-encoded with shift 0 decodes to itself.
#![no_main]

use format::{decode_bad_blocks, encode_bad_blocks};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&shift, log)) = data.split_first() else {
        return;
    };
    let ranges = decode_bad_blocks(log, shift);
    for r in &ranges {
        assert!(r.len_sectors > 0);
        assert!(r.start_sector.checked_add(r.len_sectors).is_some());
        assert_eq!(r.start_sector % (1u64 << shift), 0);
    }
    if shift == 0 {
        let mut sorted = ranges.clone();
        sorted.sort_unstable();
        sorted.dedup();
        if sorted
            .windows(2)
            .all(|w| w[0].start_sector + w[0].len_sectors <= w[1].start_sector)
        {
            if let Some(again) = encode_bad_blocks(&sorted, 0, 4096) {
                let mut back = decode_bad_blocks(&again, 0);
                back.sort_unstable();
                let total = |v: &[format::BadRange]| v.iter().map(|r| r.len_sectors).sum::<u64>();
                assert_eq!(total(&back), total(&sorted));
            }
        }
    }
});
