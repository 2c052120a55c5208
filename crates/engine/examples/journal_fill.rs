//! Fill the raid5-cache journal of an existing array and stop without a clean stop: what a
//! crash with a full log leaves for recovery to replay (`bench/run --journal`, recovery rows).
//!
//! A running `ironraid run` never lets its log get full: its reclaim thread frees the ring
//! once a quarter of it is home on the members (or after 5 s). This assembles the array in
//! process *without* the background threads (no reclaim), writes whole stripes from array
//! offset 0 on until the log holds FRACTION of the ring, and exits at once (no flush of the
//! members, no clean superblocks, no reclaim) — so the next `ironraid run` replays it all.
//!
//! `cargo run -p engine --release --example journal_fill -- FRACTION MEMBER... LOG`
//! (members and log in any order, as for `ironraid run`). Prints one JSON line.

use device::{AlignedBuf, Device, FileDevice, OpenMode};
use engine::{assemble, AssembleOptions};
use std::sync::Arc;
use std::time::Instant;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.len() < 3 {
        eprintln!("usage: journal_fill FRACTION MEMBER... LOG");
        std::process::exit(2);
    }
    let fraction: f64 = args[0].parse().expect("FRACTION: a number in (0, 1)");
    assert!(
        fraction > 0.0 && fraction < 1.0,
        "FRACTION must be in (0, 1)"
    );
    let devs: Vec<Arc<dyn Device>> = args[1..]
        .iter()
        .map(|p| {
            Arc::new(
                FileDevice::open(std::path::Path::new(p), OpenMode::ReadWrite)
                    .unwrap_or_else(|e| panic!("{p}: {e}")),
            ) as Arc<dyn Device>
        })
        .collect();
    let a = assemble(devs, AssembleOptions::default()).unwrap_or_else(|e| {
        eprintln!("assemble: {e}");
        std::process::exit(1)
    });
    let Some(j0) = a.status().journal else {
        eprintln!("the array has no journal");
        std::process::exit(1)
    };
    let g = a.geometry();
    let stripe = g.chunk_sectors() * 512 * g.data_disks() as u64;
    let stripes = a.size_bytes() / stripe;
    let buf = AlignedBuf::copy_from(&vec![0x6bu8; stripe as usize]);
    let want = (j0.log_bytes as f64 * fraction) as u64;
    let t = Instant::now();
    let mut written = 0u64;
    let mut i = 0u64;
    let mut used = j0.used_bytes;
    // Stop before the next stripe could make the ring reclaim in line (reserve() frees room
    // when the head would catch up with the tail).
    let step = stripe + stripe / (g.data_disks() as u64) * 2 + 16 * 4096;
    while used + step <= want && used + step < j0.log_bytes {
        a.write((i % stripes) * stripe, &buf, false)
            .unwrap_or_else(|e| panic!("write: {e}"));
        written += stripe;
        i += 1;
        used = a.status().journal.map_or(0, |j| j.used_bytes);
    }
    let secs = t.elapsed().as_secs_f64();
    let j = a.status().journal.expect("journal");
    println!(
        "{{\"log_bytes\":{},\"used_bytes\":{},\"logged_bytes\":{},\"written_bytes\":{},\
         \"stripe_bytes\":{},\"reclaims\":{},\"flushes\":{},\"seconds\":{:.3}}}",
        j.log_bytes, j.used_bytes, j.logged_bytes, written, stripe, j.reclaims, j.flushes, secs
    );
    // A crash: no close, no member flush, no reclaim, nothing dropped.
    std::process::exit(0);
}
