//! Seeded random workloads on every level and layout, with members failing mid-run, compared
//! byte for byte with a plain in-memory model of the logical disk.

use layout::Level;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use simkit::{all_geometries, run_workload, sim_array, DiskModel};

const MEMBER_BYTES: u64 = 3 << 20;

fn run_case(seed: u64, level: Level, layout: Option<u32>, n: usize) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let chunk = 4096u64 << rng.gen_range(0..4);
    let sa = sim_array(level, layout, n, chunk, MEMBER_BYTES, seed);
    let size = sa.array.size_bytes();
    assert!(size > 0);
    let mut model = DiskModel::new(size);
    let tolerance = sa.array.geometry().max_degraded();
    let steps = 60;
    let kill_at: Vec<usize> = (0..tolerance.min(2))
        .map(|_| rng.gen_range(0..steps))
        .collect();
    let failed = run_workload(&sa, &mut model, &mut rng, steps, &kill_at);
    model.check_array(&sa.array);
    if failed.is_empty() {
        simkit::check_redundancy(&sa);
    }
}

#[test]
fn random_workload_every_level_with_failures() {
    for (level, layout, n) in all_geometries() {
        testkit::for_each_seed!(
            "random_workload_every_level_with_failures",
            testkit::Seeds::sim(6),
            |seed| { run_case(seed, level, layout, n) }
        );
    }
}

/// The panic message of `f`, if it panicked.
fn panic_message(f: impl FnOnce()) -> Option<String> {
    let err = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).err()?;
    Some(
        err.downcast_ref::<String>()
            .cloned()
            .or_else(|| err.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_default(),
    )
}

/// Canary: the workload's own checker (the model and its comparison) fails when the array
/// returns wrong data. The workload runs on a non-redundant array, its model agrees, then one
/// bit flips on a member behind the array's back and the same checker must report it.
#[test]
fn workload_harness_detects_corruption() {
    let sa = sim_array(Level::Raid0, None, 2, 4096, 4 << 20, 1);
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    let mut model = DiskModel::new(sa.array.size_bytes());
    run_workload(&sa, &mut model, &mut rng, 60, &[]);
    model.check_array(&sa.array);
    // Byte 100 of member 0's data area is logical byte 100 (RAID0, first chunk).
    let data_offset_bytes = engine::read_superblock(sa.sims[0].as_ref())
        .expect("superblock")
        .data_offset
        * 512;
    sa.sims[0].flip_bit(data_offset_bytes + 100, 2);
    let msg = panic_message(|| model.check_array(&sa.array))
        .expect("the workload's checker missed a flipped bit");
    assert!(
        msg.contains("final image") && msg.contains("differs from model at byte 100 "),
        "the checker failed for another reason: {msg}"
    );
    // And a read in the middle of a workload goes through the same check.
    let mut buf = vec![0u8; 512];
    sa.array.read(0, &mut buf).expect("read");
    let msg = panic_message(|| model.check(0, &buf, "mid-run read")).expect("missed");
    assert!(msg.contains("mid-run read"), "{msg}");
}

/// Client threads of the concurrent workload.
const THREADS: u64 = 4;
/// Unit of ownership: thread `t` owns 4 KiB blocks `t`, `t + THREADS`, `t + 2 THREADS`, … so
/// every chunk of 16 KiB and up holds a block of every thread, and every stripe several.
const BLOCK: u64 = 4096;
/// The threads work in the array's first `HOT_BYTES`, so they meet in the same stripes at the
/// same time, not only in the same stripes at some time.
const HOT_BYTES: u64 = 1 << 20;

/// Several client threads at once, their blocks interleaved in every stripe (see [`BLOCK`]):
/// each writes and reads sector runs inside a random span of its own blocks and checks reads
/// against its own model; a member dies half way. At the end the whole array must equal the
/// models put together.
fn concurrent_case(seed: u64, level: Level, layout: Option<u32>, n: usize) {
    let sa = sim_array(level, layout, n, 16 << 10, MEMBER_BYTES, seed);
    let array = std::sync::Arc::new(sa.array);
    let size = array.size_bytes();
    // Blocks per thread in the whole array, and in the hot area the operations pick from.
    let owned = size / BLOCK / THREADS;
    let hot = (HOT_BYTES / BLOCK / THREADS).min(owned);
    let models: Vec<Vec<u8>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..THREADS)
            .map(|t| {
                let array = array.clone();
                let sims = &sa.sims;
                s.spawn(move || {
                    let block_at = |k: u64| (k * THREADS + t) * BLOCK;
                    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ (t * 0x9e37));
                    // model[k * BLOCK..] is this thread's k-th block.
                    let mut model = vec![0u8; (owned * BLOCK) as usize];
                    for step in 0..80 {
                        if t == 0 && step == 40 && array.geometry().max_degraded() > 0 {
                            sims[1].set_dead(true);
                        }
                        let first = rng.gen_range(0..hot);
                        let count = rng.gen_range(1..=4u64).min(hot - first);
                        let write = rng.gen_bool(0.6);
                        for k in first..first + count {
                            // A sector run inside the block: whole blocks and pieces of them.
                            let start = rng.gen_range(0..BLOCK / 512) * 512;
                            let len = rng.gen_range(1..=(BLOCK - start) / 512) * 512;
                            let m =
                                (k * BLOCK + start) as usize..(k * BLOCK + start + len) as usize;
                            let at = block_at(k) + start;
                            if write {
                                let data: Vec<u8> = (0..len).map(|_| rng.gen()).collect();
                                array.write(at, &data, false).expect("write");
                                model[m].copy_from_slice(&data);
                            } else {
                                let mut buf = vec![0u8; len as usize];
                                array.read(at, &mut buf).expect("read");
                                assert!(
                                    buf == model[m],
                                    "thread {t}: read {at}+{len} differs (step {step})"
                                );
                            }
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
    let mut all = vec![0u8; (owned * THREADS * BLOCK) as usize];
    array.read(0, &mut all).expect("final read");
    for (b, got) in all.chunks(BLOCK as usize).enumerate() {
        let (t, k) = (b % THREADS as usize, b / THREADS as usize);
        let want = &models[t][k * BLOCK as usize..][..BLOCK as usize];
        assert!(got == want, "block {b} (thread {t}) differs at the end");
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
        testkit::for_each_seed!(
            "concurrent_clients_share_stripes_with_a_failure",
            testkit::Seeds::sim(4),
            |seed| concurrent_case(seed, level, layout, n),
        );
    }
}
