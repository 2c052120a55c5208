//! Arrays over simulated members: created clean and assembled with a small test config.

use device::{Device, SimDevice};
use engine::{assemble, create, Array, ArrayConfig, AssembleOptions, CreateSpec};
use layout::Level;
use std::sync::Arc;

/// An assembled array and the simulated members under it (`sims[i]` is role `i`).
pub struct SimArray {
    pub sims: Vec<Arc<SimDevice>>,
    pub array: Array,
    pub level: Level,
    pub layout: Option<u32>,
}

/// The members as the engine takes them.
pub fn devs(sims: &[Arc<SimDevice>]) -> Vec<Arc<dyn Device>> {
    sims.iter().map(|s| s.clone() as Arc<dyn Device>).collect()
}

/// The tests' array config: four I/O threads and short write holds.
pub fn config() -> ArrayConfig {
    ArrayConfig {
        io_threads: 4,
        write_hold: std::time::Duration::from_micros(200),
        stream_hold: std::time::Duration::from_millis(2),
        ..ArrayConfig::default()
    }
}

/// Create and assemble an array of `n` simulated members of `member_bytes` each.
pub fn sim_array(
    level: Level,
    layout: Option<u32>,
    n: usize,
    chunk_bytes: u64,
    member_bytes: u64,
    seed: u64,
) -> SimArray {
    sim_array_with(level, layout, n, chunk_bytes, member_bytes, seed, config())
}

/// [`sim_array`] with its own array config.
pub fn sim_array_with(
    level: Level,
    layout: Option<u32>,
    n: usize,
    chunk_bytes: u64,
    member_bytes: u64,
    seed: u64,
    config: ArrayConfig,
) -> SimArray {
    let sims: Vec<Arc<SimDevice>> = (0..n)
        .map(|i| {
            Arc::new(SimDevice::new(
                format!("sim{i}"),
                member_bytes,
                seed.wrapping_mul(31).wrapping_add(i as u64),
            ))
        })
        .collect();
    create_clean("test", level, layout, chunk_bytes, devs(&sims), vec![]);
    let array = reassemble_with(&sims, config).expect("assemble");
    SimArray {
        sims,
        array,
        level,
        layout,
    }
}

/// Assemble `sims` again (after a stop or a simulated crash) with [`config`].
pub fn reassemble(sims: &[Arc<SimDevice>]) -> engine::Result<Array> {
    reassemble_with(sims, config())
}

/// Assemble `sims` (not forced, the name from their superblocks) with `config`.
pub fn reassemble_with(sims: &[Arc<SimDevice>], config: ArrayConfig) -> engine::Result<Array> {
    assemble(
        devs(sims),
        AssembleOptions {
            config,
            ..Default::default()
        },
    )
}

/// What `create` takes for an array named `name` over `members` (and `spares`), known clean
/// from the start, with no bitmap, journal or records (tests change fields with `..`).
pub fn clean_spec(
    name: &str,
    level: Level,
    layout: Option<u32>,
    chunk_bytes: u64,
    members: Vec<Arc<dyn Device>>,
    spares: Vec<Arc<dyn Device>>,
) -> CreateSpec {
    CreateSpec {
        name: name.into(),
        level,
        layout,
        chunk_bytes,
        members,
        spares,
        size_bytes: None,
        assume_clean: true,
        force: false,
        bitmap: None,
        discard: false,
        journal: None,
        journal_write_back: false,
        integrity: false,
        guided: false,
    }
}

/// `create` an array named `name` over `members` (and `spares`), known clean from the start.
pub fn create_clean(
    name: &str,
    level: Level,
    layout: Option<u32>,
    chunk_bytes: u64,
    members: Vec<Arc<dyn Device>>,
    spares: Vec<Arc<dyn Device>>,
) -> engine::Created {
    create(&clean_spec(
        name,
        level,
        layout,
        chunk_bytes,
        members,
        spares,
    ))
    .expect("create")
}

/// Run `a`'s background work (rebuild, resync, scrub) step by step until it is idle; panics if
/// it has not finished after a million steps.
pub fn settle(a: &Array) {
    for _ in 0..1_000_000 {
        if a.sync_step() == engine::SyncAction::Idle {
            return;
        }
    }
    panic!("background work did not finish");
}
