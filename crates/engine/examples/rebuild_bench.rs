//! Rebuild and resync speed, unthrottled, as a ratio of the members' raw sequential read
//! bandwidth; and client write throughput kept during a default-rate rebuild, as a ratio of the
//! same workload without one. Engine only (no NBD); member files in DIR.
//!
//! `cargo run -p engine --release --example rebuild_bench -- [DIR] [member MiB]`

use device::{Device, FileDevice, OpenMode};
use engine::{assemble, create, Array, AssembleOptions, CreateSpec};
use layout::Level;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn open(paths: &[PathBuf]) -> Vec<Arc<dyn Device>> {
    paths
        .iter()
        .map(|p| Arc::new(FileDevice::open(p, OpenMode::ReadWrite).unwrap()) as Arc<dyn Device>)
        .collect()
}

fn raw_read_gbs(path: &Path) -> f64 {
    let dev = FileDevice::open(path, OpenMode::ReadWrite).unwrap();
    let mut buf = device::AlignedBuf::zeroed(1 << 20);
    let t = Instant::now();
    let mut off = 0;
    while off + (1 << 20) <= dev.len_bytes() {
        dev.read_at(&mut buf, off).unwrap();
        off += 1 << 20;
    }
    off as f64 / t.elapsed().as_secs_f64() / 1e9
}

/// Client writes of 1 MiB at random places for `secs`; returns GB/s.
fn client_writes(a: &Array, secs: f64) -> f64 {
    let data = device::AlignedBuf::copy_from(&vec![0x77u8; 1 << 20]);
    let slots = a.size_bytes() / (1 << 20);
    let t = Instant::now();
    let mut n = 0u64;
    while t.elapsed().as_secs_f64() < secs {
        let at = (n.wrapping_mul(2654435761) % slots) << 20;
        a.write(at, &data, false).unwrap();
        n += 1;
    }
    (n << 20) as f64 / t.elapsed().as_secs_f64() / 1e9
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let dir = PathBuf::from(args.get(1).cloned().unwrap_or_else(|| "/dev/shm".into()));
    let mib: u64 = args.get(2).and_then(|m| m.parse().ok()).unwrap_or(256);
    let paths: Vec<PathBuf> = (0..5)
        .map(|i| dir.join(format!("rebuild-bench-{i}.img")))
        .collect();
    for p in &paths {
        let f = std::fs::File::create(p).unwrap();
        f.set_len(mib << 20).unwrap();
    }
    create(&CreateSpec {
        name: "rb".into(),
        level: Level::Raid5,
        layout: None,
        chunk_bytes: 512 << 10,
        members: open(&paths[..4]),
        spares: vec![],
        size_bytes: None,
        assume_clean: true,
        force: true,
        bitmap: None,
        discard: false,
        journal: None,
        journal_write_back: false,
        integrity: false,
        guided: false,
    })
    .unwrap();
    let a = Arc::new(assemble(open(&paths[..4]), AssembleOptions::default()).unwrap());
    a.write_zeroes(0, a.size_bytes(), false, false).unwrap(); // allocate every block of the members
    a.flush().unwrap();
    let raw = raw_read_gbs(&paths[0]);
    println!("RAID5 x4, 512 KiB chunk, {mib} MiB members in {}; raw sequential read of one member: {raw:.2} GB/s", dir.display());
    a.set_sync_speed(None, Some(u64::MAX));
    a.start_background();
    // Resync, unthrottled.
    let t = Instant::now();
    a.request_action("resync").unwrap();
    assert!(a.wait_sync_idle(Duration::from_secs(600)));
    let resync = a.sync_status().total_bytes as f64 / t.elapsed().as_secs_f64() / 1e9;
    println!(
        "resync  unthrottled: {resync:.2} GB/s per member  = {:.2} x raw member read",
        resync / raw
    );
    // Rebuild onto a spare, unthrottled.
    a.fail_member(&paths[3].display().to_string()).unwrap();
    let spare = open(&paths[4..]).pop().unwrap();
    let t = Instant::now();
    a.add_member(spare, true).unwrap();
    std::thread::sleep(Duration::from_millis(50));
    assert!(a.wait_sync_idle(Duration::from_secs(600)));
    let rebuild = a.sync_status().total_bytes as f64 / t.elapsed().as_secs_f64() / 1e9;
    println!(
        "rebuild unthrottled: {rebuild:.2} GB/s per member  = {:.2} x raw member read",
        rebuild / raw
    );
    // Foreground writes: alone, then during a rebuild at the default rate limits.
    let alone = client_writes(&a, 3.0);
    a.set_sync_speed(
        Some(engine::DEFAULT_SPEED_MIN),
        Some(engine::DEFAULT_SPEED_MAX),
    );
    a.fail_member(&paths[4].display().to_string()).unwrap();
    a.remove_member(&paths[4].display().to_string()).unwrap();
    a.add_member(open(&paths[4..]).pop().unwrap(), true)
        .unwrap();
    std::thread::sleep(Duration::from_millis(50));
    let during = client_writes(&a, 3.0);
    let st = a.sync_status();
    println!(
        "client 1 MiB writes: {alone:.2} GB/s alone, {during:.2} GB/s during a default-rate rebuild = {:.2}x; rebuild meanwhile at {:.0} MiB/s ({} of {} MiB)",
        during / alone,
        st.rate_bytes_per_s as f64 / 1048576.0,
        st.done_bytes >> 20,
        st.total_bytes >> 20
    );
    a.set_sync_speed(None, Some(u64::MAX));
    a.wait_sync_idle(Duration::from_secs(600));
    a.close().unwrap();
    for p in &paths {
        let _ = std::fs::remove_file(p);
    }
}
