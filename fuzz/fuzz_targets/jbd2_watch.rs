//! Fuzz the ext4 write watch (`format::jbd2_watch`): `cargo +nightly fuzz run jbd2_watch`. The
//! watch is armed on the synthetic file system of the ext4 guide; the input is a stream of
//! operations: a write (block, length, fill byte, and a jbd2 header with a tid to make it a
//! descriptor, commit or superblock), the end of a write in flight (with or without FUA), or
//! a flush.
//!
//! Invariants: it never panics; a disarmed watch calls every write nonconforming.
#![no_main]

use format::ext4_guide::synthetic::{header, image, jsb, transaction};
use format::jbd2_watch::Jbd2Watch;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let img = image(&|img, j| {
        let j = j as usize;
        jsb(img, j, 3);
        transaction(img, j, 3, 5, &[400, 401]);
    });
    let mut read = |off: u64, buf: &mut [u8]| {
        buf.copy_from_slice(&img[off as usize..off as usize + buf.len()]);
        Ok(())
    };
    let mut w = Jbd2Watch::default();
    w.arm(&mut read, img.len() as u64).expect("the synthetic fs arms");
    let mut inflight: Vec<u64> = Vec::new();
    for op in data.chunks_exact(6) {
        match op[0] % 4 {
            0 | 1 => {
                let block = u64::from(u16::from_le_bytes([op[1], op[2]])) % 1030;
                let blocks = u64::from(op[3] % 4) + 1;
                let mut buf = vec![op[4]; (blocks * 1024) as usize];
                match op[5] % 4 {
                    0 => header(&mut buf, 0, 1 + u32::from(op[5] >> 6), 5 + u32::from(op[4] % 4)),
                    1 => jsb(&mut buf, 0, u32::from(op[4] % 64)),
                    _ => {}
                }
                let armed = w.is_armed();
                let discard = op[0] % 4 == 1 && op[5] & 0x80 != 0;
                let (v, id) = w.begin(block * 1024, blocks * 1024, (!discard).then_some(&buf[..]));
                assert!(armed || v.is_err());
                inflight.push(id);
            }
            2 if !inflight.is_empty() => {
                let id = inflight.remove(usize::from(op[1]) % inflight.len());
                w.end(id, op[2] % 8 != 0, op[3] % 2 == 0);
            }
            _ => {
                let t = w.flush_begin();
                w.flush_end(t);
            }
        }
    }
});
