//! Fuzz the md v1.2 superblock decoder: `cargo +nightly fuzz run superblock`.
//!
//! Invariants: decoding never panics; anything accepted re-encodes to a block that decodes
//! to the same value (when the name survived UTF-8 decoding unchanged); a checksum-fixed
//! variant of the input (magic/major forced) exercises the deeper validation paths.
#![no_main]

use format::{sb_csum, Superblock, MD_SB_MAGIC};
use libfuzzer_sys::fuzz_target;

fn check(buf: &[u8]) {
    if let Ok(sb) = Superblock::decode(buf) {
        assert!(sb.validate().is_ok());
        assert_eq!(sb.dev_roles.len(), sb.max_dev as usize);
        let _ = (sb.role(), sb.is_clean(), sb.ctime_secs(), sb.utime_secs());
        let again = Superblock::decode(&sb.encode()).expect("re-encoded superblock must decode");
        if !sb.set_name.contains('\u{fffd}') {
            assert_eq!(again, sb);
        }
    }
}

fuzz_target!(|data: &[u8]| {
    check(data);
    // Same bytes with magic, major and checksum made valid, to get past the first gates.
    if data.len() >= 256 {
        let mut b = data.to_vec();
        b[0..4].copy_from_slice(&MD_SB_MAGIC.to_le_bytes());
        b[4..8].copy_from_slice(&1u32.to_le_bytes());
        let c = sb_csum(&b);
        b[216..220].copy_from_slice(&c.to_le_bytes());
        check(&b);
    }
});
