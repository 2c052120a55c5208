//! Shared by the integrity fault tests (`integrity`, `integrity_mirror`, `integrity_unclean`):
//! the fault classes, and arrays with or without records over simulated members. Their seeds
//! are `testkit::Seeds::integrity`.

use crate::array::{clean_spec, devs};
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

/// The integrity tests' array config for `seed`: deterministic, small sync windows, and for
/// half the seeds a record cache of a few pages.
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
        discard: true,
        integrity,
        ..clean_spec("integrity", level, layout, chunk, devs(&sims), vec![])
    })
    .expect("create");
    let array = assemble(
        devs(&sims),
        AssembleOptions {
            config: config(seed),
            ..Default::default()
        },
    )
    .expect("assemble");
    (sims, created, array)
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

/// The integrity counters of `array`'s status.
pub fn counts(array: &Array) -> engine::IntegrityCounts {
    array.status().integrity.expect("integrity status").counts
}

/// Stop `array` cleanly and assemble its members again.
pub fn reassemble(array: &Array, sims: &[Arc<SimDevice>], seed: u64) -> Array {
    array.close().expect("clean stop");
    assemble(
        devs(sims),
        AssembleOptions {
            config: config(seed ^ 0x5a5a),
            ..Default::default()
        },
    )
    .expect("reassemble")
}
