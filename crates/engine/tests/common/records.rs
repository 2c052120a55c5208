//! Shared by the integrity fault tests (`integrity`, `integrity_mirror`): the fault classes,
//! the seeds, and arrays with or without records over simulated members.

use device::SimDevice;
use engine::{assemble, Array, ArrayConfig, AssembleOptions, CreateSpec, Created};
use layout::Level;
use std::sync::Arc;

/// A silent fault behind the array's back.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Fault {
    Rot,
    Garbage,
    Zeros,
    /// Some sectors of the block hold other bytes (a torn overwrite).
    Torn,
    /// The last write to the block never reached the medium.
    Lost,
    /// The last write to the block landed on another block of the same member.
    Misdirected,
}

pub const FAULTS: [Fault; 6] = [
    Fault::Rot,
    Fault::Garbage,
    Fault::Zeros,
    Fault::Torn,
    Fault::Lost,
    Fault::Misdirected,
];

pub fn config(seed: u64) -> ArrayConfig {
    ArrayConfig {
        deterministic_seed: Some(seed),
        io_threads: 2,
        sync_window_bytes: 64 << 10,
        // Half the cases hold one to three record pages: tables are read as needed and
        // evicted all the time.
        integrity_cache_bytes: if seed.is_multiple_of(2) {
            (1 + (seed / 2 % 3) as usize) * 4096
        } else {
            64 << 20
        },
        ..ArrayConfig::default()
    }
}

/// Create (with records when `integrity`) and assemble an array over `n` simulated members of
/// `member_bytes`.
pub fn array(
    seed: u64,
    level: Level,
    layout: Option<u32>,
    chunk: u64,
    n: usize,
    member_bytes: u64,
    integrity: bool,
) -> (Vec<Arc<SimDevice>>, Created, Array) {
    let sims: Vec<Arc<SimDevice>> = (0..n)
        .map(|i| {
            Arc::new(SimDevice::new(
                format!("sim{i}"),
                member_bytes,
                seed ^ (i as u64) << 40,
            ))
        })
        .collect();
    let created = engine::create(&CreateSpec {
        name: "integrity".into(),
        level,
        layout,
        chunk_bytes: chunk,
        members: super::devs(&sims),
        spares: vec![],
        size_bytes: None,
        assume_clean: true,
        force: false,
        bitmap: None,
        discard: true,
        journal: None,
        journal_write_back: false,
        integrity,
        guided: false,
    })
    .expect("create");
    let array = assemble(
        super::devs(&sims),
        AssembleOptions {
            config: config(seed),
            ..Default::default()
        },
    )
    .expect("assemble");
    (sims, created, array)
}

/// Seeds: `IRONRAID_SEED` alone, else `IRONRAID_INTEGRITY_CASES` (default 300) from `base`.
pub fn cases(base: u64) -> Vec<u64> {
    let env = |k: &str| std::env::var(k).ok().and_then(|v| v.parse::<u64>().ok());
    if let Some(seed) = env("IRONRAID_SEED") {
        return vec![seed];
    }
    (0..env("IRONRAID_INTEGRITY_CASES").unwrap_or(300))
        .map(|i| base + i)
        .collect()
}

/// Run `case` for every seed; a failure prints how to replay it.
pub fn for_each_case(
    binary: &str,
    base: u64,
    test: &str,
    case: impl Fn(u64) + std::panic::RefUnwindSafe,
) {
    for_each_seed(binary, cases(base), test, case)
}

/// [`for_each_case`] with at most `default` seeds unless `IRONRAID_INTEGRITY_CASES` says.
pub fn for_each_case_up_to(
    binary: &str,
    base: u64,
    default: usize,
    test: &str,
    case: impl Fn(u64) + std::panic::RefUnwindSafe,
) {
    let mut seeds = cases(base);
    if std::env::var("IRONRAID_INTEGRITY_CASES").is_err() {
        seeds.truncate(default);
    }
    for_each_seed(binary, seeds, test, case)
}

fn for_each_seed(
    binary: &str,
    seeds: Vec<u64>,
    test: &str,
    case: impl Fn(u64) + std::panic::RefUnwindSafe,
) {
    for seed in seeds {
        if let Err(e) = std::panic::catch_unwind(|| case(seed)) {
            eprintln!(
                "\n*** {test} failed with seed {seed}; replay with:\n    IRONRAID_SEED={seed} cargo test -p engine --release --test {binary} -- {test} --exact --nocapture\n"
            );
            std::panic::resume_unwind(e);
        }
    }
}

/// Run a sync action (`check`, `repair`, …) to its end.
pub fn run_action(array: &Array, action: &str) {
    array.request_action(action).expect("action");
    for _ in 0..100_000 {
        if array.sync_step() == engine::SyncAction::Idle {
            return;
        }
    }
    panic!("{action} did not finish");
}

pub fn counts(array: &Array) -> engine::IntegrityCounts {
    array.status().integrity.expect("integrity status").counts
}

/// Stop `array` cleanly and assemble its members again.
pub fn reassemble(array: &Array, sims: &[Arc<SimDevice>], seed: u64) -> Array {
    array.close().expect("clean stop");
    assemble(
        super::devs(sims),
        AssembleOptions {
            config: config(seed ^ 0x5a5a),
            ..Default::default()
        },
    )
    .expect("reassemble")
}
