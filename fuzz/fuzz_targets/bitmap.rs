//! Fuzz the write-intent bitmap header decoder: `cargo +nightly fuzz run bitmap`.
//!
//! Invariants: decoding never panics; anything accepted passes the kernel loader's checks
//! (a power-of-two chunk of at least 512 bytes, a nonzero daemon sleep, events_cleared not
//! ahead of events), re-encodes to a header that decodes to the same value, and has sizes that
//! can be computed without overflow or wrapping; a clustered (version 5) header names 1 to
//! MAX_CLUSTER_NODES slots whose total size is computable too. Variants with the magic and
//! version (4 or 5) forced exercise the checks past the first gates.
#![no_main]

use format::{
    BitmapSuper, BITMAP_HEADER_BYTES, BITMAP_MAGIC, BITMAP_VERSION, BITMAP_VERSION_CLUSTERED,
    MAX_CLUSTER_NODES,
};
use libfuzzer_sys::fuzz_target;

fn check(buf: &[u8]) {
    if let Ok(sb) = BitmapSuper::decode(buf) {
        assert!(sb.chunksize >= 512 && sb.chunksize.is_power_of_two());
        assert!(sb.daemon_sleep > 0);
        assert!(sb.events_cleared <= sb.events);
        let again = BitmapSuper::decode(&sb.encode()).expect("re-encoded header must decode");
        assert_eq!(again, sb);
        // Reading a member's bitmap sizes its buffer from these: no overflow, no wrap.
        let chunks = sb.chunks();
        assert!(chunks <= sb.sync_size);
        assert!(sb.bytes_on_disk() >= BITMAP_HEADER_BYTES as u64 + chunks.div_ceil(8));
        if sb.is_clustered() {
            assert!((1..=MAX_CLUSTER_NODES).contains(&sb.nodes));
            assert!(sb.cluster_name.contains(&0));
            let last = sb.slot_offset(sb.slots() - 1);
            assert_eq!(last + sb.bytes_on_disk(), sb.all_slots_bytes());
        }
    }
}

fuzz_target!(|data: &[u8]| {
    check(data);
    if data.len() >= 8 {
        for version in [BITMAP_VERSION, BITMAP_VERSION_CLUSTERED] {
            let mut b = data.to_vec();
            b[0..4].copy_from_slice(&BITMAP_MAGIC.to_le_bytes());
            b[4..8].copy_from_slice(&version.to_le_bytes());
            check(&b);
        }
    }
});
