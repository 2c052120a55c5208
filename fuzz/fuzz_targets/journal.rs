//! Fuzz the raid5-cache meta block decoder: `cargo +nightly fuzz run journal`.
//!
//! The input becomes a 4 KiB block with md's magic and version and a valid checksum (so the
//! descriptor parser is what gets exercised, not the checksum). Invariants: decoding never
//! panics; anything accepted re-encodes to a block that decodes to the same meta block, and its
//! unit size is computable.
#![no_main]

use format::{crc32c_raw, MetaBlock, JOURNAL_BLOCK, JOURNAL_MAGIC, JOURNAL_VERSION};
use libfuzzer_sys::fuzz_target;

const SEED: u32 = 0x2636_f714;

fuzz_target!(|data: &[u8]| {
    let mut block = [0u8; JOURNAL_BLOCK];
    let n = data.len().min(JOURNAL_BLOCK);
    block[..n].copy_from_slice(&data[..n]);
    block[0..4].copy_from_slice(&JOURNAL_MAGIC.to_le_bytes());
    block[8] = JOURNAL_VERSION;
    block[4..8].fill(0);
    let crc = crc32c_raw(SEED, &block);
    block[4..8].copy_from_slice(&crc.to_le_bytes());
    let position = u64::from_le_bytes(block[24..32].try_into().expect("8 bytes"));
    if let Ok(m) = MetaBlock::decode(&block, SEED, position) {
        assert!(m.meta_size() <= JOURNAL_BLOCK);
        let again = MetaBlock::decode(&m.encode(SEED), SEED, position).expect("re-encoded");
        assert_eq!(again, m);
        assert!(m.unit_sectors() >= 8);
    }
});
