//! Test harness: arrays over simulated members, a plain model of the logical disk, seeds.

#![allow(dead_code)]

use device::{Device, SimDevice};
use engine::{assemble, create, Array, ArrayConfig, AssembleOptions, CreateSpec};
use layout::Level;
use std::sync::Arc;

pub mod records;

pub struct SimArray {
    pub sims: Vec<Arc<SimDevice>>,
    pub array: Array,
    pub level: Level,
    pub layout: Option<u32>,
}

pub fn devs(sims: &[Arc<SimDevice>]) -> Vec<Arc<dyn Device>> {
    sims.iter().map(|s| s.clone() as Arc<dyn Device>).collect()
}

pub fn config() -> ArrayConfig {
    ArrayConfig {
        io_threads: 4,
        write_hold: std::time::Duration::from_micros(200),
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
    let array = assemble(
        devs(&sims),
        AssembleOptions {
            name: None,
            config,
            force: false,
            ..Default::default()
        },
    )
    .expect("assemble");
    SimArray {
        sims,
        array,
        level,
        layout,
    }
}

pub fn reassemble(sims: &[Arc<SimDevice>]) -> engine::Result<Array> {
    assemble(
        devs(sims),
        AssembleOptions {
            name: None,
            config: config(),
            force: false,
            ..Default::default()
        },
    )
}

/// Seeds to run: `IRONRAID_SEED` alone, or `count` seeds from a base.
pub fn seeds(count: u64) -> Vec<u64> {
    if let Ok(s) = std::env::var("IRONRAID_SEED") {
        return vec![s.parse().expect("IRONRAID_SEED must be a number")];
    }
    let count = std::env::var("IRONRAID_SIM_CASES")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(count);
    let base: u64 = std::env::var("IRONRAID_SEED_BASE")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(0x5eed);
    (0..count).map(|i| base.wrapping_add(i)).collect()
}

/// Run `case` for each seed; on a panic, say which seed and how to replay it.
pub fn for_each_seed(test: &str, count: u64, case: impl Fn(u64)) {
    for seed in seeds(count) {
        let res = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| case(seed)));
        if let Err(e) = res {
            eprintln!(
                "\n*** {test} failed with seed {seed}; replay with:\n    IRONRAID_SEED={seed} cargo test -p engine --release --test {} -- {test} --nocapture\n",
                env!("CARGO_CRATE_NAME")
            );
            std::panic::resume_unwind(e);
        }
    }
}

/// Every level/layout combination the engine supports, with a member count for it.
pub fn all_geometries() -> Vec<(Level, Option<u32>, usize)> {
    let mut v = vec![
        (Level::Linear, None, 3),
        (Level::Raid0, None, 3),
        (Level::Raid1, None, 3),
        (Level::Raid4, None, 4),
    ];
    for l in 0..=5 {
        v.push((Level::Raid5, Some(l), 4));
    }
    v.push((Level::Raid5, Some(2), 2));
    for l in [0, 1, 2, 3, 4, 5, 16, 17, 18, 19, 20] {
        v.push((Level::Raid6, Some(l), 5));
    }
    v.push((Level::Raid6, Some(2), 4));
    for l in [0x102, 0x201, 0x10201, 0x103] {
        v.push((Level::Raid10, Some(l), 4));
    }
    v.push((Level::Raid10, Some(0x102), 3));
    v
}

/// Check, straight from the member images, that every stripe's parity matches its data (parity
/// levels) or that every copy agrees (mirrors).
pub fn check_redundancy(sa: &SimArray) {
    if let Some(e) = redundancy_error(sa) {
        panic!("{e}");
    }
}

/// The first place where redundancy disagrees with the data, read from the member images.
pub fn redundancy_error(sa: &SimArray) -> Option<String> {
    let images: Vec<Vec<u8>> = sa.sims.iter().map(|s| s.contents()).collect();
    let offsets: Vec<usize> = sa
        .sims
        .iter()
        .map(|s| engine::read_superblock(s.as_ref()).expect("sb").data_offset as usize * 512)
        .collect();
    let g = sa.array.geometry();
    match g.level() {
        Level::Raid4 | Level::Raid5 | Level::Raid6 => {
            let chunk = g.chunk_sectors() as usize * 512;
            let stripes = g.array_sectors() / g.chunk_sectors() / g.data_disks() as u64;
            for s in 0..stripes {
                let roles = g.stripe_roles(s);
                let at = |dev: usize| &images[dev][offsets[dev] + s as usize * chunk..][..chunk];
                let mut by_syndrome: Vec<&[u8]> = vec![&[]; g.data_disks()];
                for d in 0..g.data_disks() {
                    by_syndrome[roles.syndrome(d)] = at(roles.data_dev(d));
                }
                let mut p = vec![0u8; chunk];
                let mut q = vec![0u8; chunk];
                parity::pq_gen(&by_syndrome, &mut p, &mut q);
                if p != at(roles.p_dev()) {
                    return Some(format!("stripe {s}: P does not match data"));
                }
                if roles.q_dev().is_some_and(|qd| q != at(qd)) {
                    return Some(format!("stripe {s}: Q does not match data"));
                }
            }
        }
        Level::Raid1 | Level::Raid10 => {
            let mut sector = 0;
            while sector < g.array_sectors() {
                let c = g.map_copies(sector);
                let len = (c.run_sectors() as usize * 512).min(1 << 20);
                let first = c.get(0);
                let a = &images[first.dev][offsets[first.dev] + first.dev_sector as usize * 512..]
                    [..len];
                for copy in c.iter() {
                    let b = &images[copy.dev][offsets[copy.dev] + copy.dev_sector as usize * 512..]
                        [..len];
                    if a != b {
                        return Some(format!("array sector {sector}: copies differ"));
                    }
                }
                sector += len as u64 / 512;
            }
        }
        Level::Linear | Level::Raid0 => {}
    }
    None
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
