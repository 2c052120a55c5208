//! Engine-only throughput (no NBD): sequential 1 MiB writes and reads from several threads over
//! member files, RAID0 next to RAID5/RAID6 in the same run, reported as ratios.
//!
//! `cargo run -p engine --release --example engine_bench -- [DIR] [MiB per level]`
//! (DIR defaults to /dev/shm; members are sparse files removed afterwards).

use device::{Device, FileDevice, OpenMode};
use engine::{assemble, create, AssembleOptions, CreateSpec};
use layout::Level;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

const THREADS: usize = 4;
const IO: usize = 1 << 20;

fn run(dir: &Path, level: Level, n: usize, mib: usize) -> (f64, f64) {
    let paths: Vec<PathBuf> = (0..n)
        .map(|i| dir.join(format!("engine-bench-{i}.img")))
        .collect();
    let member_bytes = (mib as u64 * 2 / (n as u64 - 1).max(1) + 64) << 20;
    let open = || -> Vec<Arc<dyn Device>> {
        paths
            .iter()
            .map(|p| Arc::new(FileDevice::open(p, OpenMode::ReadWrite).unwrap()) as Arc<dyn Device>)
            .collect()
    };
    for p in &paths {
        std::fs::File::create(p)
            .unwrap()
            .set_len(member_bytes)
            .unwrap();
    }
    create(&CreateSpec {
        name: "bench".into(),
        level,
        layout: None,
        chunk_bytes: 512 << 10,
        members: open(),
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
    let array = Arc::new(assemble(open(), AssembleOptions::default()).unwrap());
    let total = (mib << 20).min(array.size_bytes() as usize) / IO / THREADS * IO * THREADS;
    let per = total / THREADS;
    let data = device::AlignedBuf::copy_from(&vec![0x5au8; IO]);
    let write_pass = || {
        let t = Instant::now();
        std::thread::scope(|s| {
            for th in 0..THREADS {
                let (array, data) = (array.clone(), &data);
                s.spawn(move || {
                    for k in (0..per).step_by(IO) {
                        array.write((th * per + k) as u64, data, false).unwrap();
                    }
                });
            }
        });
        array.flush().unwrap();
        total as f64 / t.elapsed().as_secs_f64() / 1e9
    };
    // The first pass allocates the members' blocks (sparse files); time the second.
    write_pass();
    let w = write_pass();
    let t = Instant::now();
    std::thread::scope(|s| {
        for th in 0..THREADS {
            let array = array.clone();
            s.spawn(move || {
                let mut buf = device::AlignedBuf::zeroed(IO);
                for k in (0..per).step_by(IO) {
                    array.read((th * per + k) as u64, &mut buf).unwrap();
                }
            });
        }
    });
    let r = total as f64 / t.elapsed().as_secs_f64() / 1e9;
    array.close().unwrap();
    for p in &paths {
        let _ = std::fs::remove_file(p);
    }
    (w, r)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let dir = PathBuf::from(args.get(1).cloned().unwrap_or_else(|| "/dev/shm".into()));
    let mib: usize = args.get(2).and_then(|m| m.parse().ok()).unwrap_or(1024);
    println!("engine_bench: {THREADS} threads, 1 MiB sequential I/O, 512 KiB chunk, {mib} MiB per level, members in {}", dir.display());
    let (w0, r0) = run(&dir, Level::Raid0, 4, mib);
    println!("raid0 x4   write {w0:6.2} GB/s  read {r0:6.2} GB/s");
    for (level, n, parity) in [(Level::Raid5, 4, 1), (Level::Raid6, 6, 2)] {
        let (w, r) = run(&dir, level, n, mib);
        let share = (n - parity) as f64 / n as f64;
        println!(
            "{:<6} x{n}  write {w:6.2} GB/s  read {r:6.2} GB/s   write/((N-{parity})/N*raid0) {:.2}  read/raid0 {:.2}",
            level.name(),
            w / (share * w0),
            r / r0
        );
    }
}
