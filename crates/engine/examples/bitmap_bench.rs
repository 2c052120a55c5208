//! Resync after a crash with md's write-intent bitmap against the full scan md does without
//! one: a sparse RAID5 array of ARRAY GiB over 4 member files in DIR, `DIRTY` MiB written
//! (1 MiB writes at random places), no clean stop, then assembly and resync until idle, timed.
//! Both runs in one process, same files, same writes; the result is the ratio.
//!
//! `cargo run -p engine --release --example bitmap_bench -- [DIR] [ARRAY GiB] [DIRTY MiB] [BITMAP CHUNK KiB]`

use device::{Device, FileDevice, OpenMode};
use engine::{assemble, create, AssembleOptions, BitmapSpec, CreateSpec};
use layout::Level;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

fn open(paths: &[PathBuf]) -> Vec<Arc<dyn Device>> {
    paths
        .iter()
        .map(|p| Arc::new(FileDevice::open(p, OpenMode::ReadWrite).unwrap()) as Arc<dyn Device>)
        .collect()
}

/// Create, write `dirty_mib` at seeded places, drop without a clean stop, reassemble; returns
/// how long the resync took and the bytes per member it covered.
fn crash_and_resync(
    paths: &[PathBuf],
    member_bytes: u64,
    dirty_mib: u64,
    bitmap: Option<Option<u64>>,
) -> Duration {
    for p in paths {
        let f = std::fs::File::create(p).unwrap();
        f.set_len(member_bytes).unwrap();
    }
    create(&CreateSpec {
        name: "bb".into(),
        level: Level::Raid5,
        layout: None,
        chunk_bytes: 512 << 10,
        members: open(paths),
        spares: vec![],
        size_bytes: None,
        assume_clean: true,
        force: true,
        bitmap: bitmap.map(|chunk_bytes| BitmapSpec {
            chunk_bytes,
            cluster: None,
        }),
        // Every region counts as used (as on a block device): the full scan reads it all.
        discard: false,
        journal: None,
        journal_write_back: false,
        integrity: false,
        guided: false,
    })
    .unwrap();
    // A clean stop first: create leaves every bit set (as mdadm does) until the daemon's
    // first passes or a clean stop clear them; a long-running array has them clear.
    assemble(open(paths), AssembleOptions::default())
        .unwrap()
        .close()
        .unwrap();
    let a = assemble(open(paths), AssembleOptions::default()).unwrap();
    let chunk = a.status().bitmap.map(|b| b.chunk_bytes);
    let data = device::AlignedBuf::copy_from(&vec![0x5au8; 1 << 20]);
    let slots = a.size_bytes() >> 20;
    for i in 0..dirty_mib {
        let at = (i.wrapping_mul(2_654_435_761) % slots) << 20;
        a.write(at, &data, false).unwrap();
    }
    a.flush().unwrap();
    drop(a); // a crash: no clean stop, the superblocks say "active"
    let a = Arc::new(assemble(open(paths), AssembleOptions::default()).unwrap());
    assert!(a.was_dirty_at_assembly());
    a.set_sync_speed(None, Some(u64::MAX));
    let t = Instant::now();
    a.start_background();
    assert!(a.wait_sync_idle(Duration::from_secs(3600)));
    let took = t.elapsed();
    println!(
        "  {:>6}: resync {:>9.3} s  (bitmap chunk {:?} bytes)",
        if bitmap.is_some() { "bitmap" } else { "full" },
        took.as_secs_f64(),
        chunk
    );
    a.close().unwrap();
    took
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let dir = PathBuf::from(args.get(1).cloned().unwrap_or_else(|| "/var/tmp".into()));
    let array_gib: u64 = args.get(2).and_then(|m| m.parse().ok()).unwrap_or(16);
    let dirty_mib: u64 = args.get(3).and_then(|m| m.parse().ok()).unwrap_or(16);
    // Bitmap chunk in KiB; default mdadm's (at least 64 MiB).
    let chunk: Option<u64> = args
        .get(4)
        .and_then(|m| m.parse::<u64>().ok())
        .map(|k| k << 10);
    let paths: Vec<PathBuf> = (0..4)
        .map(|i| dir.join(format!("bitmap-bench-{i}.img")))
        .collect();
    // Three data members carry the array, plus the data offset.
    let member_bytes = (array_gib << 30) / 3 + (8 << 20);
    println!(
        "RAID5 x4, 512 KiB chunk, {array_gib} GiB array of sparse files in {}, {dirty_mib} MiB written before the crash",
        dir.display()
    );
    let bitmap = crash_and_resync(&paths, member_bytes, dirty_mib, Some(chunk));
    let full = crash_and_resync(&paths, member_bytes, dirty_mib, None);
    println!(
        "bitmap-guided resync is {:.0}x faster than the full scan",
        full.as_secs_f64() / bitmap.as_secs_f64()
    );
    for p in &paths {
        let _ = std::fs::remove_file(p);
    }
}
