//! Shared by the integrity fault tests (`integrity`, `integrity_mirror`, `integrity_unclean`):
//! the fault classes, arrays with or without records over simulated members, and the [`Rig`]
//! that writes to one and damages its members' blocks behind its back. Their seeds are
//! `testkit::Seeds::integrity`.

use crate::array::{clean_spec, devs};
use device::{Device, SimDevice};
use engine::{assemble, Array, ArrayConfig, AssembleOptions, CreateSpec, Created};
use layout::Level;
use rand::Rng;
use rand_chacha::ChaCha8Rng;
use std::sync::Arc;

/// The unit the records cover, and the unit a fault damages.
pub const PAGE: u64 = 4096;

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

/// An array with or without records, what the rig wrote to it (`model`: the array's bytes),
/// and its members' blocks within reach behind its back.
pub struct Rig {
    pub sims: Vec<Arc<SimDevice>>,
    pub array: Array,
    pub model: Vec<u8>,
    /// Byte offset of the data area on every member.
    pub data_offset: u64,
    pub component_sectors: u64,
    pub level: Level,
    pub seed: u64,
}

impl Rig {
    /// A rig over `created` (from [`array`]) as created: all zeroes.
    pub fn new(
        seed: u64,
        level: Level,
        (sims, created, array): (Vec<Arc<SimDevice>>, Created, Array),
    ) -> Rig {
        Rig {
            model: vec![0u8; array.size_bytes() as usize],
            sims,
            array,
            data_offset: created.data_offset_sectors * 512,
            component_sectors: created.component_sectors,
            level,
            seed,
        }
    }

    /// A rig over `created` (from [`array`]) after a few random writes (4 to 11, of 1 to 63
    /// sectors, from `rng`) and a flush.
    pub fn with_writes(
        seed: u64,
        level: Level,
        parts: (Vec<Arc<SimDevice>>, Created, Array),
        rng: &mut ChaCha8Rng,
    ) -> Rig {
        let mut rig = Rig::new(seed, level, parts);
        for _ in 0..rng.gen_range(4..12) {
            let len = rng.gen_range(1..64usize) * 512;
            let at = rng.gen_range(0..(rig.model.len() - len) / 512) as u64 * 512;
            rig.write(at, len, rng);
        }
        rig.array.flush().expect("flush");
        rig
    }

    /// Write `len` random bytes at `at` through the array, and into the model.
    pub fn write(&mut self, at: u64, len: usize, rng: &mut ChaCha8Rng) {
        let mut buf = vec![0u8; len];
        rng.fill(&mut buf[..]);
        self.array.write(at, &buf, false).expect("write");
        self.model[at as usize..at as usize + len].copy_from_slice(&buf);
    }

    /// Member `dev`'s page at byte `off` of its data area, read behind the array's back.
    pub fn block(&self, dev: usize, off: u64) -> Vec<u8> {
        let mut b = device::AlignedBuf::zeroed(PAGE as usize);
        self.sims[dev]
            .read_at(&mut b, self.data_offset + off)
            .expect("raw read");
        b.to_vec()
    }

    /// Overwrite member `dev`'s bytes at byte `off` of its data area behind the array's back.
    pub fn put(&self, dev: usize, off: u64, bytes: &[u8]) {
        self.sims[dev].scribble(self.data_offset + off, bytes);
    }

    /// Damage member `dev`'s page at byte `off` of its data area in place: the faults that need
    /// no write through the array (`Rot`, `Garbage`, `Zeros`, `Torn`); each changes the page.
    pub fn damage(&self, fault: Fault, dev: usize, off: u64, rng: &mut ChaCha8Rng) {
        let b = match fault {
            Fault::Rot => {
                let bit = rng.gen_range(0..PAGE * 8);
                self.sims[dev].flip_bit(self.data_offset + off + bit / 8, (bit % 8) as u8);
                return;
            }
            Fault::Garbage => {
                let mut g = vec![0u8; PAGE as usize];
                rng.fill(&mut g[..]);
                // The rig's data comes from a stream seeded alike: make sure it is a change.
                if g == self.block(dev, off) {
                    g[0] ^= 0xff;
                }
                g
            }
            Fault::Zeros => {
                let mut b = self.block(dev, off);
                if b.iter().all(|&x| x == 0) {
                    b[rng.gen_range(0..PAGE as usize)] = 1;
                } else {
                    b.fill(0);
                }
                b
            }
            Fault::Torn => {
                let mut b = self.block(dev, off);
                let orig = b.clone();
                let first = rng.gen_range(0..7usize);
                let last = rng.gen_range(first + 1..8);
                for s in first..last {
                    rng.fill(&mut b[s * 512..(s + 1) * 512]);
                }
                if b == orig {
                    b[first * 512] ^= 0xff;
                }
                b
            }
            Fault::Lost | Fault::Misdirected => {
                panic!("{fault:?} is a write through the array: the test places it")
            }
        };
        self.put(dev, off, &b);
    }

    /// The whole array, read through it.
    pub fn read_all(&self) -> engine::Result<Vec<u8>> {
        let mut buf = vec![0u8; self.model.len()];
        self.array.read(0, &mut buf)?;
        Ok(buf)
    }

    /// Run a sync action to its end.
    pub fn run_action(&self, action: &str) {
        run_action(&self.array, action)
    }

    pub fn counts(&self) -> engine::IntegrityCounts {
        counts(&self.array)
    }

    /// Stop cleanly and assemble again.
    pub fn reassemble(&mut self) {
        self.array = reassemble(&self.array, &self.sims, self.seed);
    }

    /// Assemble the members but `left_out` (degraded), with the config of `seed`.
    pub fn assemble_without(&self, left_out: &[usize], seed: u64) -> Array {
        let others: Vec<Arc<dyn Device>> = self
            .sims
            .iter()
            .enumerate()
            .filter(|(i, _)| !left_out.contains(i))
            .map(|(_, s)| s.clone() as Arc<dyn Device>)
            .collect();
        assemble(
            others,
            AssembleOptions {
                config: config(seed),
                ..Default::default()
            },
        )
        .expect("degraded assembly")
    }

    /// Where the record tables sit on the members.
    pub fn zone(&self) -> format::Zone {
        let n = self.sims.len();
        let copies = format::table_copies(self.level.md_level(), n).expect("copies");
        format::Zone::new(n, copies, self.component_sectors)
    }
}
