//! Roles changing hands under load: clients keep writing and verifying while members fail, a
//! spare takes the failed role and is rebuilt online, the failed member is removed and added back
//! as the next spare, and another member fails (the re-added one then takes a different role).
//!
//! Every writer owns every `WRITERS`-th 4 KiB block, so each stripe carries blocks of several
//! writers, and reads back what it wrote (its own model) while the roles change. Any read of a
//! member above its rebuilt point, or of a member that left its role after the read was planned,
//! shows up as a block that differs from the model.

use device::{Device, SimDevice};
use engine::{assemble, Array, ArrayConfig, AssembleOptions};
use layout::Level;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use simkit::devs;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

const WRITERS: u64 = 4;
const BLOCK: u64 = 4096;
const MEMBER_BYTES: u64 = 4 << 20;
/// Blocks per verifying read.
const READ_BLOCKS: u64 = 64;

fn start(level: Level, n: usize, seed: u64) -> (Arc<Array>, Vec<Arc<SimDevice>>) {
    let sims: Vec<Arc<SimDevice>> = (0..=n)
        .map(|i| {
            Arc::new(SimDevice::new(
                format!("m{i}"),
                MEMBER_BYTES,
                seed + i as u64,
            ))
        })
        .collect();
    simkit::create_clean(
        "roles",
        level,
        None,
        16 << 10,
        devs(&sims[..n]),
        devs(&sims[n..]),
    );
    let array = Arc::new(
        assemble(
            devs(&sims),
            AssembleOptions {
                name: None,
                config: ArrayConfig {
                    io_threads: 4,
                    ..ArrayConfig::default()
                },
                ..AssembleOptions::default()
            },
        )
        .expect("assemble"),
    );
    array.set_sync_speed(None, Some(u64::MAX));
    array.start_background();
    for s in &sims {
        // Member calls take a while, as on real disks: requests planned before a role changes
        // are still running when it does.
        s.set_delay(Duration::from_micros(50));
    }
    (array, sims)
}

/// One writer: writes its blocks with fresh data and reads random ones of them back.
fn writer(array: &Array, t: u64, seed: u64, stop: &AtomicBool) -> Result<u64, String> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ (t << 40));
    let blocks = array.size_bytes() / BLOCK;
    let mine: Vec<u64> = (0..blocks).filter(|b| b % WRITERS == t).collect();
    assert!(mine
        .iter()
        .enumerate()
        .all(|(i, b)| *b == i as u64 * WRITERS + t));
    let mut model: Vec<Option<u8>> = vec![None; mine.len()];
    let mut checked = 0u64;
    while !stop.load(Ordering::Acquire) {
        let i = rng.gen_range(0..mine.len());
        let at = mine[i] * BLOCK;
        if rng.gen_bool(0.5) {
            let v: u8 = rng.gen_range(1..=255);
            array
                .write(at, &[v; BLOCK as usize], false)
                .map_err(|e| format!("writer {t}: write at {at}: {e}"))?;
            model[i] = Some(v);
        } else {
            // Long reads: their member operations queue behind each other, so some start well
            // after the read was planned.
            let first = rng.gen_range(0..blocks.saturating_sub(READ_BLOCKS));
            let mut buf = vec![0u8; (READ_BLOCKS * BLOCK) as usize];
            array
                .read(first * BLOCK, &mut buf)
                .map_err(|e| format!("writer {t}: read at {}: {e}", first * BLOCK))?;
            for b in (first..first + READ_BLOCKS).filter(|b| b % WRITERS == t) {
                let want = model[(b / WRITERS) as usize].unwrap_or(0);
                let got = &buf[((b - first) * BLOCK) as usize..][..BLOCK as usize];
                if let Some(bad) = got.iter().position(|&x| x != want) {
                    return Err(format!(
                        "writer {t}: block at {} byte {bad} reads {:#04x}, wrote {want:#04x}",
                        b * BLOCK,
                        got[bad]
                    ));
                }
                checked += 1;
            }
        }
    }
    Ok(checked)
}

/// Fail a member, wait for the spare to take over, remove the failed one and add it back.
fn change_roles(array: &Array, sims: &[Arc<SimDevice>], rounds: usize, rng: &mut ChaCha8Rng) {
    for _ in 0..rounds {
        let st = array.status();
        let active: Vec<String> = st
            .members
            .iter()
            .filter(|m| m.state == engine::MemberState::InSync)
            .map(|m| m.name.clone())
            .collect();
        let victim = active[rng.gen_range(0..active.len())].clone();
        array.fail_member(&victim).expect("fail");
        std::thread::sleep(Duration::from_millis(rng.gen_range(0..20)));
        assert!(
            array.wait_sync_idle(Duration::from_secs(120)),
            "rebuild did not finish"
        );
        array
            .remove_member(&victim)
            .expect("remove the failed member");
        let dev = sims
            .iter()
            .find(|s| s.name() == victim)
            .expect("one of ours")
            .clone();
        array
            .add_member(dev, true)
            .expect("add the failed member back as a spare");
    }
}

fn run(level: Level, n: usize, seed: u64) {
    let (array, sims) = start(level, n, seed);
    let stop = AtomicBool::new(false);
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let results: Vec<Result<u64, String>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..WRITERS)
            .map(|t| {
                let (array, stop) = (&array, &stop);
                s.spawn(move || {
                    let res = writer(array, t, seed, stop);
                    // A writer that found wrong data stops everyone.
                    stop.store(true, Ordering::Release);
                    res
                })
            })
            .collect();
        change_roles(&array, &sims, 3, &mut rng);
        stop.store(true, Ordering::Release);
        handles
            .into_iter()
            .map(|h| h.join().expect("writer thread"))
            .collect()
    });
    let mut total = 0;
    for r in results {
        total += r.unwrap_or_else(|e| panic!("{level:?} seed {seed}: {e}"));
    }
    assert!(total > 0, "no block was verified");
    array.close().expect("clean stop");
}

#[test]
fn raid5_roles_change_under_verified_load() {
    for seed in 0..3 {
        run(Level::Raid5, 4, seed);
    }
}

#[test]
fn raid6_roles_change_under_verified_load() {
    for seed in 0..3 {
        run(Level::Raid6, 5, seed);
    }
}
