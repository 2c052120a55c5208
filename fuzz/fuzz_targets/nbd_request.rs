//! Fuzzes the transmission request parser and the pure request validator.
#![no_main]

use libfuzzer_sys::fuzz_target;
use nbd::codec;
use nbd::command::{validate, Command, ExportParams};

fuzz_target!(|data: &[u8]| {
    let (params_bytes, rest) = data.split_at(data.len().min(16));
    let mut p = [0u8; 16];
    p[..params_bytes.len()].copy_from_slice(params_bytes);
    let params = ExportParams {
        size: u64::from_be_bytes(p[0..8].try_into().unwrap()),
        flags: u16::from_be_bytes([p[8], p[9]]),
        structured: p[10] & 1 != 0,
        base_allocation: p[10] & 2 != 0,
        align: (p[10] & 4 != 0).then(|| 1u32 << (p[11] % 17)),
        max_payload: u32::from_be_bytes(p[12..16].try_into().unwrap()),
        fast_zero: p[10] & 8 != 0,
    };
    for chunk in rest.chunks(28) {
        if let Ok(req) = codec::parse_request(chunk) {
            assert_eq!(codec::encode_request(&req).as_slice(), chunk);
            if let Ok(Command::Read { offset, len, .. } | Command::Write { offset, len, .. }) =
                validate(&req, &params)
            {
                assert!(offset
                    .checked_add(u64::from(len))
                    .is_some_and(|e| e <= params.size));
            }
        }
        let _ = codec::parse_simple_reply(chunk);
        let _ = codec::parse_chunk_header(chunk);
    }
});
