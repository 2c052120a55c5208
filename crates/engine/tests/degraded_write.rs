//! Degraded partial-stripe writes read no more than they must: with a member missing, a write
//! takes read-modify-write or reconstruct-write when the missing chunk is not one of the reads
//! it needs (md's `handle_stripe_dirtying`), and reads every member only when neither can run.
//! Member reads are counted on the simulated devices; the data must read back and, once a
//! spare is rebuilt, every stripe's parity must match its data.

use device::{Device, SimDevice};
use layout::Level;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use simkit::{sim_array, SimArray};
use std::sync::Arc;
use std::time::Duration;

const CHUNK: u64 = 64 << 10;

fn reads(sa: &SimArray) -> u64 {
    sa.sims.iter().map(|s| s.stats().reads).sum()
}

/// Where a chunk lives: data index `d` of stripe `row`, as an array byte offset.
fn array_at(sa: &SimArray, row: u64, d: usize, off: u64) -> u64 {
    let g = sa.array.geometry();
    (row * g.data_disks() as u64 + d as u64) * CHUNK + off
}

/// Write `len` bytes at `at` (keeping `model` in step) and return the member reads it took.
fn write_counting(
    sa: &SimArray,
    model: &mut [u8],
    rng: &mut ChaCha8Rng,
    at: u64,
    len: usize,
) -> u64 {
    let mut data = vec![0u8; len];
    rng.fill(&mut data[..]);
    let before = reads(sa);
    sa.array.write(at, &data, false).unwrap();
    let took = reads(sa) - before;
    model[at as usize..at as usize + len].copy_from_slice(&data);
    took
}

/// A row whose chunk on `dev` has `role` (`None`: parity P; `Some(d)`: data index d).
fn row_where(sa: &SimArray, dev: usize, want_p: bool) -> (u64, Option<usize>) {
    let g = sa.array.geometry();
    for row in 0..g.stripes() {
        let roles = g.stripe_roles(row);
        if want_p && roles.p_dev() == dev {
            return (row, None);
        }
        if !want_p && roles.q_dev() != Some(dev) && roles.p_dev() != dev {
            let d = (0..g.data_disks())
                .find(|&d| roles.data_dev(d) == dev)
                .expect("a data chunk");
            return (row, Some(d));
        }
    }
    panic!("no row with that role on dev {dev}");
}

/// One write covering all of a neighbour of data chunk `d` and all of `d` but its first (or
/// last) 4 KiB: one column interval in which `d` is dirty but not overwritten.
fn partly_missing(sa: &SimArray, row: u64, d: usize) -> (u64, usize) {
    let len = 2 * CHUNK as usize - 4096;
    if d + 1 < sa.array.geometry().data_disks() {
        (array_at(sa, row, d, 4096), len)
    } else {
        (array_at(sa, row, d - 1, 0), len)
    }
}

/// Rebuild onto a fresh spare, then the whole array must read back as `model` and `check` must
/// find every stripe consistent.
fn rebuild_and_verify(sa: &SimArray, failed: &str, model: &[u8]) {
    let mut back = vec![0u8; model.len()];
    sa.array.read(0, &mut back).unwrap();
    assert!(
        back == model,
        "degraded array does not read back what was written"
    );
    sa.array.remove_member(failed).unwrap();
    let spare: Arc<dyn Device> = Arc::new(SimDevice::new("spare", sa.sims[0].len_bytes(), 7));
    sa.array.add_member(spare, true).unwrap();
    while sa.array.sync_step() != engine::SyncAction::Idle {}
    assert!(
        sa.array.status().missing_roles.is_empty(),
        "rebuild did not finish"
    );
    sa.array.read(0, &mut back).unwrap();
    assert!(
        back == model,
        "rebuilt array does not read back what was written"
    );
    sa.array.request_action("check").unwrap();
    while sa.array.sync_step() != engine::SyncAction::Idle {}
    assert_eq!(
        sa.array.sync_status().mismatch_sectors,
        0,
        "parity disagrees with data"
    );
    assert!(sa.array.wait_sync_idle(Duration::from_secs(10)));
}

fn filled(level: Level, n: usize, seed: u64) -> (SimArray, Vec<u8>, ChaCha8Rng) {
    let sa = sim_array(level, None, n, CHUNK, 2 << 20, seed);
    sa.array.set_sync_speed(None, Some(u64::MAX));
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut model = vec![0u8; sa.array.size_bytes() as usize];
    rng.fill(&mut model[..]);
    sa.array.write(0, &model, false).unwrap();
    (sa, model, rng)
}

#[test]
fn raid5_degraded_writes_read_only_what_they_need() {
    let (sa, mut model, mut rng) = filled(Level::Raid5, 4, 11);
    let failed = 3;
    sa.array.fail_member("sim3").unwrap();
    let g = sa.array.geometry().clone();
    let (row_p, _) = row_where(&sa, failed, true);
    let (row_d, missing_d) = row_where(&sa, failed, false);
    let missing_d = missing_d.unwrap();
    let other_d = (0..g.data_disks()).find(|&d| d != missing_d).unwrap();

    // P missing: nothing to keep consistent, so the data goes out without any read.
    let at = array_at(&sa, row_p, 0, 8192);
    assert_eq!(write_counting(&sa, &mut model, &mut rng, at, 4096), 0);
    // A data chunk missing, another one written: RMW reads old data and P (2, not all 3).
    let at = array_at(&sa, row_d, other_d, 4096);
    assert_eq!(write_counting(&sa, &mut model, &mut rng, at, 4096), 2);
    // The missing chunk overwritten whole: RCW reads the other two data chunks, not P.
    let at = array_at(&sa, row_d, missing_d, 0);
    assert_eq!(
        write_counting(&sa, &mut model, &mut rng, at, CHUNK as usize),
        2
    );
    // A column of the missing chunk written whole (a parity domain of its own): RCW again.
    let at = array_at(&sa, row_d, missing_d, 4096);
    assert_eq!(write_counting(&sa, &mut model, &mut rng, at, 4096), 2);
    // The missing chunk partly written in a column another chunk fills: its old bytes exist
    // only as parity, so every member is read and the chunk reconstructed.
    let (at, len) = partly_missing(&sa, row_d, missing_d);
    assert_eq!(write_counting(&sa, &mut model, &mut rng, at, len), 3);
    rebuild_and_verify(&sa, "sim3", &model);
}

#[test]
fn raid6_degraded_writes_read_only_what_they_need() {
    let (sa, mut model, mut rng) = filled(Level::Raid6, 5, 12);
    let failed = 4;
    sa.array.fail_member("sim4").unwrap();
    let g = sa.array.geometry().clone();
    let (row_p, _) = row_where(&sa, failed, true);
    let (row_d, missing_d) = row_where(&sa, failed, false);
    let missing_d = missing_d.unwrap();
    let other_d = (0..g.data_disks()).find(|&d| d != missing_d).unwrap();

    // P missing: RMW through Q alone reads the old data and Q (2 < 3 data chunks).
    let at = array_at(&sa, row_p, 1, 0);
    assert_eq!(write_counting(&sa, &mut model, &mut rng, at, 4096), 2);
    // A data chunk missing, another written: RMW reads old data, P and Q (3, not all 4).
    let at = array_at(&sa, row_d, other_d, 0);
    assert_eq!(write_counting(&sa, &mut model, &mut rng, at, 4096), 3);
    // The missing chunk partly written in a column another chunk fills: every present member
    // read (4).
    let (at, len) = partly_missing(&sa, row_d, missing_d);
    assert_eq!(write_counting(&sa, &mut model, &mut rng, at, len), 4);
    rebuild_and_verify(&sa, "sim4", &model);
}

#[test]
fn degraded_random_writes_stay_consistent() {
    for level in [Level::Raid5, Level::Raid6] {
        let n = if level == Level::Raid5 { 4 } else { 5 };
        let (sa, mut model, mut rng) = filled(level, n, 13);
        sa.array.fail_member("sim1").unwrap();
        for _ in 0..300 {
            let len = rng.gen_range(1..=(3 * CHUNK as usize / 512)) * 512;
            let at = rng.gen_range(0..(model.len() - len) / 512) as u64 * 512;
            write_counting(&sa, &mut model, &mut rng, at, len);
        }
        rebuild_and_verify(&sa, "sim1", &model);
    }
}
