//! Fuzz the ext4 guide (ext4 superblock, group descriptors, journal inode and extents, jbd2 log
//! scan): `cargo +nightly fuzz run ext4_guide`. The input is a list of 4-byte edits (3-byte
//! offset, value) applied to a small synthetic file system with two committed transactions, so
//! the fuzzer reaches the log scan instead of stopping at the magic number.
//!
//! Invariants: it never panics or runs away; a set it returns is sorted, disjoint, inside the
//! device and in whole fs blocks.
#![no_main]

use format::ext4_guide::synthetic::{image, jsb, transaction};
use format::ext4_guide::{ext4_verify_set, GuideOptions};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut img = image(&|img, j| {
        let j = j as usize;
        jsb(img, j, 3);
        let n = transaction(img, j, 3, 5, &[400, 401]);
        transaction(img, j, n, 6, &[700]);
    });
    for e in data.chunks_exact(4) {
        let at = (usize::from(e[0]) << 16 | usize::from(e[1]) << 8 | usize::from(e[2])) % img.len();
        img[at] = e[3];
    }
    let mut read = |off: u64, buf: &mut [u8]| {
        let o = usize::try_from(off).map_err(|_| "offset")?;
        let src = img
            .get(o..o.checked_add(buf.len()).ok_or("overflow")?)
            .ok_or("past the end")?;
        buf.copy_from_slice(src);
        Ok(())
    };
    let opts = GuideOptions {
        require_data_journal: false,
    };
    let len = img.len() as u64;
    if let Ok(s) = ext4_verify_set(&mut read, len, &opts) {
        let bs = u64::from(s.block_size);
        for w in s.ranges.windows(2) {
            assert!(w[0].0 + w[0].1 < w[1].0);
        }
        for &(o, l) in &s.ranges {
            assert!(o % bs == 0 && l % bs == 0 && l > 0 && o + l <= len);
        }
    }
});
