//! Damage found while a resync is owed is still damage. After an unclean stop, blocks that fail
//! their integrity records may be "settled as found" only in rows a crash could have left
//! mid-write and only while every member of the row is there. Here a row is damaged behind the
//! array's back (as many blocks as the level can rebuild), the array is started after a clean
//! or an unclean stop, and one more member of the row is failed: the damaged pages must read
//! EIO, the same pages after either stop, never wrong data, also once a spare has been added
//! and the rebuild has run. Parity levels (RAID5, RAID6) and mirrors (RAID1, RAID10).
//!
//! Canary: before `settle_scope`, the unclean runs served the damaged bytes (and pages rebuilt
//! from them) with no error, and the rebuild wrote them to the spare.
//!
//! Seeds: `IRONRAID_SEED` alone, else `IRONRAID_INTEGRITY_CASES` per test (default 60).

use device::{Device, SimDevice};
use engine::{assemble, Array, AssembleOptions};
use layout::Level;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use simkit::records;
use std::sync::Arc;

const MEMBER: u64 = 2 << 20;
const PAGE: u64 = 4096;

/// One member block: member index, byte offset in the data area.
type Block = (usize, u64);

struct Case {
    sims: Vec<Arc<SimDevice>>,
    array: Array,
    model: Vec<u8>,
    data_offset: u64,
}

impl Case {
    fn new(seed: u64, level: Level) -> Case {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let (layout, n) = match level {
            Level::Raid1 => (None, 2),
            Level::Raid10 => (Some(0x102), rng.gen_range(2..=3) * 2),
            Level::Raid5 => (Some(rng.gen_range(0..=3)), rng.gen_range(3..=5)),
            _ => (Some(rng.gen_range(0..=3)), rng.gen_range(4..=6)),
        };
        let chunk = 4096u64 << rng.gen_range(0..4);
        let (sims, created, array) = records::array(seed, level, layout, chunk, n, MEMBER, true);
        let mut model = vec![0u8; array.size_bytes() as usize];
        // Fill the whole array, so that every page has data a wrong answer would differ from.
        rng.fill(&mut model[..]);
        array.write(0, &model, false).expect("write");
        array.flush().expect("flush");
        Case {
            sims,
            array,
            model,
            data_offset: created.data_offset_sectors * 512,
        }
    }

    /// The blocks of array page `page` (member, data-area offset), the data block first.
    fn row_of(&self, page: u64) -> Vec<Block> {
        let g = self.array.geometry();
        let at = page * PAGE;
        if g.level().is_parity() {
            let chunk = g.chunk_sectors() * 512;
            let data_disks = g.data_disks() as u64;
            let (row, d, off) = (
                at / chunk / data_disks,
                (at / chunk % data_disks) as usize,
                at % chunk,
            );
            let roles = g.stripe_roles(row);
            let mut devs: Vec<usize> = vec![roles.data_dev(d)];
            devs.extend((0..g.raid_disks()).filter(|&m| m != roles.data_dev(d)));
            devs.into_iter().map(|m| (m, row * chunk + off)).collect()
        } else {
            g.map_copies(at / 512)
                .iter()
                .map(|c| (c.dev, c.dev_sector * 512))
                .collect()
        }
    }

    fn damage(&self, (dev, off): Block, rng: &mut ChaCha8Rng) {
        let mut g = vec![0u8; PAGE as usize];
        rng.fill(&mut g[..]);
        self.sims[dev].scribble(self.data_offset + off, &g);
    }

    /// Stop (cleanly or not) and start again over the same members.
    fn restart(&mut self, seed: u64, clean: bool) {
        if clean {
            self.array.close().expect("clean stop");
        } else {
            for s in &self.sims {
                s.power_cut();
            }
        }
        let array = assemble(
            simkit::devs(&self.sims),
            AssembleOptions {
                config: records::config(seed ^ 0x5a5a),
                ..Default::default()
            },
        )
        .expect("assemble");
        // The old array goes without a clean stop: what it leaves is what a kill -9 leaves.
        drop(std::mem::replace(&mut self.array, array));
    }

    /// Read every page: which ones fail. A page that reads must hold the model's bytes.
    fn read_pages(&self, ctx: &str) -> Vec<u64> {
        const PIECE: u64 = 16 * PAGE;
        let mut failed = Vec::new();
        let mut buf = vec![0u8; PIECE as usize];
        for piece in (0..self.model.len() as u64).step_by(PIECE as usize) {
            if self.read_right(piece, &mut buf, ctx) {
                continue;
            }
            // Something in the piece failed: which pages.
            for page in piece / PAGE..(piece + PIECE) / PAGE {
                if !self.read_right(page * PAGE, &mut buf[..PAGE as usize], ctx) {
                    failed.push(page);
                }
            }
        }
        failed
    }

    /// Read `buf.len()` bytes at `at`: false if the read fails, a panic if it returns wrong data.
    fn read_right(&self, at: u64, buf: &mut [u8], ctx: &str) -> bool {
        if self.array.read(at, buf).is_err() {
            return false;
        }
        let want = &self.model[at as usize..at as usize + buf.len()];
        if let Some(i) = (0..buf.len()).find(|&i| buf[i] != want[i]) {
            panic!(
                "{ctx}: page {} read back WRONG with no error",
                (at + i as u64) / PAGE
            );
        }
        true
    }
}

/// Damage a page row, restart (clean or not), fail one more member of the row, read, add a
/// spare, rebuild, read. Returns the pages that read EIO before and after the rebuild.
fn run(seed: u64, level: Level, clean: bool) -> (Vec<u64>, Vec<u64>) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0xdead);
    let mut case = Case::new(seed, level);
    let pages = case.model.len() as u64 / PAGE;
    let page = rng.gen_range(0..pages);
    let row = case.row_of(page);
    let redundancy = case.array.geometry().max_degraded();
    let ctx = format!(
        "seed {seed} {level:?} page {page} {} stop, row {row:?}",
        if clean { "clean" } else { "unclean" }
    );
    // As many damaged blocks as the level rebuilds, then one member more lost: beyond it.
    let damaged = &row[..redundancy.min(row.len() - 1)];
    let lost = row[damaged.len()].0;
    for &b in damaged {
        case.damage(b, &mut rng);
    }
    case.restart(seed, clean);
    case.array
        .fail_member(&format!("sim{lost}"))
        .expect("fail a member of the row");
    let before = case.read_pages(&ctx);
    assert!(
        before.contains(&page),
        "{ctx}: the damaged page read back although nothing could vouch for it"
    );
    let spare = Arc::new(SimDevice::new("spare", MEMBER, seed ^ 0x77));
    case.array
        .add_member(spare as Arc<dyn Device>, false)
        .expect("add a spare");
    for _ in 0..1_000 {
        if case.array.sync_step() == engine::SyncAction::Idle {
            break;
        }
    }
    let after = case.read_pages(&format!("{ctx}, after the rebuild"));
    (before, after)
}

fn damage_beyond_redundancy(level: Level, base: u64) {
    let test = format!("{level:?}").to_lowercase();
    // Each case reads the whole array four times and rebuilds a spare twice: fewer seeds than
    // the other integrity tests by default.
    testkit::for_each_seed!(&test, testkit::Seeds::integrity(base).at_most(60), |seed| {
        let clean = run(seed, level, true);
        let unclean = run(seed, level, false);
        assert_eq!(
            clean, unclean,
            "seed {seed} {level:?}: a clean and an unclean stop answer the same damage differently"
        );
    });
}

#[test]
fn raid5() {
    damage_beyond_redundancy(Level::Raid5, 51_000);
}

#[test]
fn raid6() {
    damage_beyond_redundancy(Level::Raid6, 61_000);
}

#[test]
fn raid1() {
    damage_beyond_redundancy(Level::Raid1, 11_000);
}

#[test]
fn raid10() {
    damage_beyond_redundancy(Level::Raid10, 101_000);
}
