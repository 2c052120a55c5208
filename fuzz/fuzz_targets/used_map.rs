//! Fuzz the used-region map header decoder: `cargo +nightly fuzz run used_map`.
//!
//! Invariants: decoding never panics; anything accepted has a power-of-two region of at least
//! 4 KiB, re-encodes to the same header, and has an on-disk size computable without overflow.
#![no_main]

use format::UsedMapHeader;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(h) = UsedMapHeader::decode(data) {
        assert!(h.region_bytes >= 4096 && h.region_bytes.is_power_of_two());
        assert_eq!(UsedMapHeader::decode(&h.encode()).expect("re-encoded"), h);
        assert!(h.bytes_on_disk() >= 4096 + h.regions.div_ceil(8));
    }
});
