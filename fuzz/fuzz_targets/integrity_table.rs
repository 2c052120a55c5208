//! Fuzz the integrity table block decoder: `cargo +nightly fuzz run integrity_table`.
//!
//! Invariants: decoding arbitrary bytes never panics; a block built from the input decodes back
//! to itself at its own place; the same block with any one byte changed is refused.
#![no_main]

use format::{TableBlock, RECORDS_PER_TABLE, RECORD_BLOCK};
use libfuzzer_sys::fuzz_target;

const UUID: [u8; 16] = [0x42; 16];

fuzz_target!(|data: &[u8]| {
    let mut raw = [0u8; RECORD_BLOCK];
    let n = data.len().min(RECORD_BLOCK);
    raw[..n].copy_from_slice(&data[..n]);
    let _ = TableBlock::decode(&raw, &UUID, raw[7], 1, 2, 3);
    if data.len() < 32 {
        return;
    }
    let u32_at = |at: usize| u32::from_le_bytes(data[at..at + 4].try_into().expect("4"));
    let u64_at = |at: usize| u64::from_le_bytes(data[at..at + 8].try_into().expect("8"));
    let t = TableBlock {
        copy: data[0],
        subject: u32_at(1),
        holder: u32_at(5),
        index: u64_at(9),
        epoch: u64_at(17),
        uuid: UUID,
        records: (0..RECORDS_PER_TABLE)
            .map(|i| u32::from(data[i % data.len()]).wrapping_mul(0x9e37_79b9) ^ i as u32)
            .collect(),
    };
    let mut enc = t.encode();
    let back = TableBlock::decode(&enc, &UUID, t.copy, t.subject, t.holder, t.index)
        .expect("a block decodes at its own place");
    assert_eq!(back, t);
    let pos = usize::from(u16::from_le_bytes([data[25], data[26]])) % RECORD_BLOCK;
    enc[pos] ^= data[27] | 1;
    assert!(TableBlock::decode(&enc, &UUID, t.copy, t.subject, t.holder, t.index).is_err());
});
