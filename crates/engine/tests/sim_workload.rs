//! Seeded random workloads on every level and layout, with members failing mid-run, compared
//! byte for byte with a plain in-memory model of the logical disk.

mod common;

use common::{all_geometries, for_each_seed, sim_array};
use layout::Level;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

const MEMBER_BYTES: u64 = 3 << 20;

fn run_case(seed: u64, level: Level, layout: Option<u32>, n: usize) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let chunk = 4096u64 << rng.gen_range(0..4);
    let sa = sim_array(level, layout, n, chunk, MEMBER_BYTES, seed);
    let size = sa.array.size_bytes();
    assert!(size > 0);
    let mut model = vec![0u8; size as usize];
    let tolerance = sa.array.geometry().max_degraded();
    let mut failed = Vec::new();
    let steps = 60;
    let fail_at: Vec<usize> = (0..tolerance.min(2))
        .map(|_| rng.gen_range(0..steps))
        .collect();
    for step in 0..steps {
        if fail_at.contains(&step) {
            let mut victims: Vec<usize> = (0..n).filter(|i| !failed.contains(i)).collect();
            victims.retain(|&v| {
                let mut f = vec![false; n];
                for &x in failed.iter().chain(std::iter::once(&v)) {
                    f[x] = true;
                }
                sa.array.geometry().survives(&f)
            });
            if let Some(&v) = victims.get(
                rng.gen_range(0..victims.len().max(1))
                    .min(victims.len().saturating_sub(1)),
            ) {
                sa.sims[v].set_dead(true);
                failed.push(v);
            }
        }
        let max_sectors = (size / 512).min(1024);
        let len = rng.gen_range(1..=max_sectors) * 512;
        let off = rng.gen_range(0..=(size - len) / 512) * 512;
        match rng.gen_range(0..10) {
            0..=4 => {
                let data: Vec<u8> = (0..len).map(|_| rng.gen()).collect();
                sa.array
                    .write(off, &data, rng.gen_bool(0.1))
                    .unwrap_or_else(|e| panic!("write {off}+{len}: {e}"));
                model[off as usize..(off + len) as usize].copy_from_slice(&data);
            }
            5..=8 => {
                let mut buf = vec![0u8; len as usize];
                sa.array
                    .read(off, &mut buf)
                    .unwrap_or_else(|e| panic!("read {off}+{len}: {e}"));
                assert!(
                    buf == model[off as usize..(off + len) as usize],
                    "read {off}+{len} differs from model (step {step})"
                );
            }
            _ => sa.array.flush().expect("flush"),
        }
    }
    let mut all = vec![0u8; size as usize];
    sa.array.read(0, &mut all).expect("final read");
    assert!(all == model, "final image differs from model");
    if failed.is_empty() {
        common::check_redundancy(&sa);
    }
}

#[test]
fn random_workload_every_level_with_failures() {
    for (level, layout, n) in all_geometries() {
        for_each_seed("random_workload_every_level_with_failures", 6, |seed| {
            run_case(seed, level, layout, n)
        });
    }
}

/// Canary: the byte-for-byte comparison catches one flipped bit on a non-redundant array.
#[test]
fn workload_harness_detects_corruption() {
    let sa = common::sim_array(Level::Raid0, None, 2, 4096, 4 << 20, 1);
    let data = vec![0x33u8; 65536];
    sa.array.write(0, &data, false).unwrap();
    let off = engine::read_superblock(sa.sims[0].as_ref())
        .unwrap()
        .data_offset
        * 512;
    sa.sims[0].flip_bit(off + 100, 2);
    let mut back = vec![0u8; data.len()];
    sa.array.read(0, &mut back).unwrap();
    assert!(
        back != data,
        "a flipped bit on a RAID0 member must show in the data"
    );
}

/// Several client threads at once, each owning a region that does not line up with stripes, so
/// that writers from different threads meet in the same stripes; a member dies half way.
fn concurrent_case(seed: u64, level: Level, layout: Option<u32>, n: usize) {
    let sa = sim_array(level, layout, n, 16 << 10, MEMBER_BYTES, seed);
    let array = std::sync::Arc::new(sa.array);
    let size = array.size_bytes();
    const THREADS: u64 = 4;
    let region = size / THREADS / 512 * 512;
    let images: Vec<Vec<u8>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..THREADS)
            .map(|t| {
                let array = array.clone();
                let sims = &sa.sims;
                s.spawn(move || {
                    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ (t * 0x9e37));
                    let base = t * region;
                    let mut model = vec![0u8; region as usize];
                    for step in 0..80 {
                        if t == 0 && step == 40 && array.geometry().max_degraded() > 0 {
                            sims[1].set_dead(true);
                        }
                        let len = rng.gen_range(1..=64u64) * 512;
                        let off = rng.gen_range(0..=(region - len) / 512) * 512;
                        if rng.gen_bool(0.6) {
                            let data: Vec<u8> = (0..len).map(|_| rng.gen()).collect();
                            array.write(base + off, &data, false).expect("write");
                            model[off as usize..(off + len) as usize].copy_from_slice(&data);
                        } else {
                            let mut buf = vec![0u8; len as usize];
                            array.read(base + off, &mut buf).expect("read");
                            assert!(
                                buf == model[off as usize..(off + len) as usize],
                                "thread {t}: read differs"
                            );
                        }
                    }
                    model
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("client thread"))
            .collect()
    });
    for (t, model) in images.iter().enumerate() {
        let mut buf = vec![0u8; region as usize];
        array.read(t as u64 * region, &mut buf).unwrap();
        assert!(&buf == model, "region {t} differs at the end");
    }
}

#[test]
fn concurrent_clients_share_stripes_with_a_failure() {
    for (level, layout, n) in [
        (Level::Raid5, Some(2), 4),
        (Level::Raid6, Some(2), 5),
        (Level::Raid4, None, 4),
        (Level::Raid1, None, 2),
        (Level::Raid10, Some(0x102), 4),
        (Level::Raid0, None, 3),
    ] {
        for_each_seed(
            "concurrent_clients_share_stripes_with_a_failure",
            4,
            |seed| concurrent_case(seed, level, layout, n),
        );
    }
}
