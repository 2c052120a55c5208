//! Integrity records (`--integrity crc32c`): silent faults injected behind the array's back on
//! data, P, Q and table blocks (bit rot, garbage, zeroes, a torn block, a lost write, a write
//! sent to another block) are caught and repaired; two faults in one row give the right data or
//! an error, never wrong data. Canary: the same faults without records reach the client.
//!
//! Seeds: `IRONRAID_SEED` alone, else `IRONRAID_INTEGRITY_CASES` per test (default 300).

use device::Device;
use engine::{assemble, AssembleOptions, EngineError, IntegrityCounts};
use layout::{ChunkRole, Level};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use simkit::records::{self, config, Fault, FAULTS, PAGE};

const MEMBER: u64 = 2 << 20;

/// The rig of these tests: [`records::Rig`] over a RAID4/5/6 array, seen row by row through
/// [`RowAccess`].
type Rig = records::Rig;

#[derive(Clone, Copy, Debug, PartialEq)]
enum Kind {
    Data,
    P,
    Q,
}

/// A rig over a random RAID4/5/6 geometry of `level`, with records when `integrity`.
fn new_rig(seed: u64, level: Level, integrity: bool) -> Rig {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let (layout, n) = match level {
        Level::Raid4 => (None, rng.gen_range(3..=5)),
        Level::Raid5 => (Some(rng.gen_range(0..=5)), rng.gen_range(3..=6)),
        _ => {
            let layouts = [0, 1, 2, 3, 5, 16, 17, 18, 19, 20];
            (
                Some(layouts[rng.gen_range(0..layouts.len())]),
                rng.gen_range(4..=7),
            )
        }
    };
    let chunk = 4096u64 << rng.gen_range(0..4);
    let parts = records::array(seed, level, layout, chunk, n, MEMBER, integrity);
    Rig::with_writes(seed, level, parts, &mut rng)
}

/// A parity rig's blocks by row: (row, page offset in the chunk), and which member holds a
/// row's data, P or Q.
trait RowAccess {
    fn chunk(&self) -> u64;
    fn geometry(&self) -> &layout::Geometry;
    fn pick_page(&self, rng: &mut ChaCha8Rng) -> (u64, u64);
    fn dev_of(&self, row: u64, kind: Kind, rng: &mut ChaCha8Rng) -> usize;
    fn rewrite_row_page(&mut self, row: u64, d: usize, pg: u64, rng: &mut ChaCha8Rng);
    fn inject(
        &mut self,
        fault: Fault,
        kind: Kind,
        row: u64,
        pg: u64,
        rng: &mut ChaCha8Rng,
    ) -> usize;
    fn inject_at(&mut self, fault: Fault, dev: usize, row: u64, pg: u64, rng: &mut ChaCha8Rng);
}

/// `e` reports damage on the members of `devs` at member byte `offset_bytes`.
fn assert_damage_named(rig: &Rig, e: &EngineError, devs: &[usize], offset_bytes: u64, ctx: &str) {
    let EngineError::Corruption {
        member,
        offset_bytes: at,
        ..
    } = e
    else {
        panic!("{ctx}: damage beyond redundancy is reported as corruption, not: {e:?}");
    };
    assert_eq!(*at, offset_bytes, "{ctx}: {e}");
    for &d in devs {
        let name = rig.sims[d].name();
        assert!(
            member.split(", ").any(|m| m == name),
            "{ctx}: {name} not named: {e}"
        );
    }
}

impl RowAccess for Rig {
    fn chunk(&self) -> u64 {
        self.geometry().chunk_sectors() * 512
    }

    fn geometry(&self) -> &layout::Geometry {
        self.array.geometry()
    }

    /// A random page of a random row: (row, page offset in the chunk).
    fn pick_page(&self, rng: &mut ChaCha8Rng) -> (u64, u64) {
        let rows = self.geometry().stripes();
        (
            rng.gen_range(0..rows),
            rng.gen_range(0..self.chunk() / PAGE) * PAGE,
        )
    }

    fn dev_of(&self, row: u64, kind: Kind, rng: &mut ChaCha8Rng) -> usize {
        let roles = self.geometry().stripe_roles(row);
        match kind {
            Kind::Data => roles.data_dev(rng.gen_range(0..self.geometry().data_disks())),
            Kind::P => roles.p_dev(),
            Kind::Q => roles.q_dev().expect("Q"),
        }
    }

    /// Rewrite data chunk `d`'s page of `row` through the array (it, P and Q change).
    fn rewrite_row_page(&mut self, row: u64, d: usize, pg: u64, rng: &mut ChaCha8Rng) {
        let at = (row * self.geometry().data_disks() as u64 + d as u64) * self.chunk() + pg;
        self.write(at, PAGE as usize, rng);
    }

    /// Inject `fault` into the `kind` block of (row, pg). Returns the member hit.
    fn inject(
        &mut self,
        fault: Fault,
        kind: Kind,
        row: u64,
        pg: u64,
        rng: &mut ChaCha8Rng,
    ) -> usize {
        let dev = self.dev_of(row, kind, rng);
        self.inject_at(fault, dev, row, pg, rng);
        dev
    }

    /// Inject `fault` into member `dev`'s block of (row, pg).
    fn inject_at(&mut self, fault: Fault, dev: usize, row: u64, pg: u64, rng: &mut ChaCha8Rng) {
        let off = row * self.chunk() + pg;
        if !matches!(fault, Fault::Lost | Fault::Misdirected) {
            return self.damage(fault, dev, off, rng);
        }
        // The write happens through the array; the member then keeps the old block.
        let roles = self.geometry().stripe_roles(row);
        let d = match roles.role_of(dev) {
            ChunkRole::Data(d) => d,
            _ => rng.gen_range(0..self.geometry().data_disks()),
        };
        let before = self.block(dev, off);
        self.rewrite_row_page(row, d, pg, rng);
        self.array.flush().expect("flush");
        let new = self.block(dev, off);
        self.put(dev, off, &before);
        if fault == Fault::Misdirected {
            // Another block of the same member, in another row, takes the write.
            let rows = self.geometry().stripes();
            let other = (row + 1 + rng.gen_range(0..rows - 1)) % rows;
            let victim = other * self.chunk() + pg;
            self.put(dev, victim, &new);
        }
    }
}

fn kinds(level: Level) -> Vec<Kind> {
    match level {
        Level::Raid6 => vec![Kind::Data, Kind::P, Kind::Q],
        _ => vec![Kind::Data, Kind::P],
    }
}

fn for_each_case(test: &str, case: impl Fn(u64)) {
    testkit::for_each_seed!(test, testkit::Seeds::integrity(0x1a7e_0000), case)
}

/// One fault of every class on every kind of block: the client reads the right data with no
/// error; `check` counts the fault (parity blocks are only read by check, RMW and
/// reconstruction), `repair` fixes it, and a second check finds nothing.
fn single_fault(seed: u64, level: Level) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut rig = new_rig(seed, level, true);
    let fault = FAULTS[rng.gen_range(0..FAULTS.len())];
    let ks = kinds(level);
    let kind = ks[rng.gen_range(0..ks.len())];
    let (row, pg) = rig.pick_page(&mut rng);
    let dev = rig.inject(fault, kind, row, pg, &mut rng);
    let ctx =
        format!("seed {seed} {level:?} {fault:?} on {kind:?} (member {dev}, row {row}, page {pg})");
    if rng.gen_bool(0.3) {
        // Records come back from the tables on disk.
        rig.reassemble();
    }
    let got = rig
        .read_all()
        .unwrap_or_else(|e| panic!("{ctx}: read failed: {e}"));
    assert!(got == rig.model, "{ctx}: wrong data");
    let after_read = rig.counts();
    if kind == Kind::Data {
        assert!(
            after_read.data_mismatches >= 1 && after_read.repaired >= 1,
            "{ctx}: read did not catch it: {after_read:?}"
        );
    }
    rig.run_action("check");
    let checked = rig.counts();
    let found = |c: &IntegrityCounts| c.data_mismatches + c.p_mismatches + c.q_mismatches;
    assert!(found(&checked) >= 1, "{ctx}: nothing detected: {checked:?}");
    rig.run_action("repair");
    let repaired = rig.counts();
    rig.run_action("check");
    let again = rig.counts();
    assert_eq!(
        found(&again),
        found(&repaired),
        "{ctx}: second check found more: {again:?}"
    );
    assert_eq!(again.unrecoverable, 0, "{ctx}: {again:?}");
    assert_eq!(
        rig.array.status().sync.mismatch_sectors,
        0,
        "{ctx}: parity mismatch left"
    );
    assert!(
        rig.read_all().expect("read") == rig.model,
        "{ctx}: wrong data after repair"
    );
    // Redundancy is whole again: any member may go and every byte still reads back.
    let lose = rng.gen_range(0..rig.sims.len());
    rig.array.close().expect("stop");
    let degraded = rig.assemble_without(&[lose], seed ^ 7);
    let mut buf = vec![0u8; rig.model.len()];
    degraded
        .read(0, &mut buf)
        .unwrap_or_else(|e| panic!("{ctx}: degraded read without member {lose} failed: {e}"));
    assert!(
        buf == rig.model,
        "{ctx}: degraded read without member {lose}: wrong data"
    );
}

#[test]
fn single_faults_raid4() {
    for_each_case("single_faults_raid4", |s| single_fault(s, Level::Raid4));
}

#[test]
fn single_faults_raid5() {
    for_each_case("single_faults_raid5", |s| single_fault(s, Level::Raid5));
}

#[test]
fn single_faults_raid6() {
    for_each_case("single_faults_raid6", |s| single_fault(s, Level::Raid6));
}

/// Two faults in one row on different members: RAID6 repairs them; RAID4/5 return the right
/// data or an error, never wrong data.
fn double_fault(seed: u64, level: Level) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut rig = new_rig(seed, level, true);
    let (row, pg) = rig.pick_page(&mut rng);
    let ks = kinds(level);
    let mut hit = Vec::new();
    while hit.len() < 2 {
        let fault = [Fault::Rot, Fault::Garbage, Fault::Zeros, Fault::Torn][rng.gen_range(0..4)];
        let kind = ks[rng.gen_range(0..ks.len())];
        let dev = rig.dev_of(row, kind, &mut rng);
        if !hit.contains(&dev) {
            rig.inject_at(fault, dev, row, pg, &mut rng);
            hit.push(dev);
        }
    }
    let ctx = format!("seed {seed} {level:?} members {hit:?} row {row} page {pg}");
    let roles = rig.geometry().stripe_roles(row);
    for d in 0..rig.geometry().data_disks() {
        let at = (row * rig.geometry().data_disks() as u64 + d as u64) * rig.chunk() + pg;
        let mut buf = vec![0u8; PAGE as usize];
        match rig.array.read(at, &mut buf) {
            Ok(()) => assert!(
                buf[..] == rig.model[at as usize..(at + PAGE) as usize],
                "{ctx}: wrong data for data chunk {d} (member {})",
                roles.data_dev(d)
            ),
            Err(e) => {
                assert!(
                    level != Level::Raid6,
                    "{ctx}: RAID6 must repair two faults: {e}"
                );
                assert_damage_named(&rig, &e, &hit, row * rig.chunk() + pg, &ctx);
            }
        }
    }
}

#[test]
fn double_faults_raid5_never_wrong_data() {
    for_each_case("double_faults_raid5_never_wrong_data", |s| {
        double_fault(s, Level::Raid5)
    });
}

#[test]
fn double_faults_raid6_repaired() {
    for_each_case("double_faults_raid6_repaired", |s| {
        double_fault(s, Level::Raid6)
    });
}

/// A table block copy gone bad (garbage, rot, or an older version: a lost table write) is found
/// at assembly, the other copy is used, and the bad one is rewritten.
fn table_fault(seed: u64, level: Level, scrub: bool) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut rig = new_rig(seed, level, true);
    let zone = rig.zone();
    let subject = rng.gen_range(0..rig.sims.len());
    let copy = rng.gen_range(0..zone.copies);
    let holder = zone.holder(subject, copy);
    let index = rng.gen_range(0..zone.tables);
    let off = zone.table_sector(copy, index) * 512;
    let which = rng.gen_range(0..4);
    let mut injected = true;
    if which == 3 {
        // Zeroed: beside a written copy, a blank one is a lost write (both blank: never
        // written, and nothing changed).
        injected = rig.block(holder, off).iter().any(|&b| b != 0);
        rig.put(holder, off, &[0u8; PAGE as usize]);
    } else if which == 2 {
        // Lost table write: the holder keeps the old table block while the data changes.
        let old = rig.block(holder, off);
        let rows_per_table = format::RECORDS_PER_TABLE as u64 * PAGE / rig.chunk();
        let row = (index * rows_per_table + rng.gen_range(0..rows_per_table.max(1)))
            .min(rig.geometry().stripes() - 1);
        let (_, pg) = rig.pick_page(&mut rng);
        let d = rng.gen_range(0..rig.geometry().data_disks());
        rig.rewrite_row_page(row, d, pg, &mut rng);
        rig.array.flush().expect("flush");
        // The rewrite may not touch this subject: then the old block is the current one.
        injected = rig.block(holder, off) != old;
        rig.put(holder, off, &old);
    } else if which == 1 {
        let bit = rng.gen_range(0..PAGE * 8);
        rig.sims[holder].flip_bit(rig.data_offset + off + bit / 8, (bit % 8) as u8);
    } else {
        let mut g = vec![0u8; PAGE as usize];
        rng.fill(&mut g[..]);
        rig.put(holder, off, &g);
    }
    let ctx = format!(
        "seed {seed} {level:?} table fault {which} subject {subject} copy {copy} index {index}"
    );
    if scrub && injected {
        // A running array finds it with `check` and rewrites it with `repair` (an older copy
        // counts as stale when a small record cache reads the table again meanwhile).
        let found = |rig: &Rig| rig.counts().table_copies_bad + rig.counts().table_copies_stale;
        rig.run_action("check");
        assert!(
            found(&rig) >= 1,
            "{ctx}: check missed the table copy: {:?}",
            rig.counts()
        );
        rig.run_action("repair");
        let after_repair = found(&rig);
        rig.run_action("check");
        assert_eq!(
            found(&rig),
            after_repair,
            "{ctx}: repair left the table copy wrong"
        );
        let got = rig
            .read_all()
            .unwrap_or_else(|e| panic!("{ctx}: read failed: {e}"));
        assert!(got == rig.model, "{ctx}: wrong data");
        return;
    }
    // Assembly reads the tables (a small record cache: the first reads do); a clean stop
    // rewrites nothing that is not dirty.
    rig.array.close().expect("stop");
    let loaded = |rig: &Rig| {
        assemble(
            simkit::devs(&rig.sims),
            AssembleOptions {
                config: config(seed ^ 3),
                ..Default::default()
            },
        )
        .expect("assemble")
    };
    rig.array = loaded(&rig);
    let got = rig
        .read_all()
        .unwrap_or_else(|e| panic!("{ctx}: read failed: {e}"));
    assert!(got == rig.model, "{ctx}: wrong data");
    // With a small record cache tables are read when needed (a parity-only member's by a
    // check); with a large one, at assembly.
    rig.run_action("check");
    let c = rig.counts();
    let differs = c.table_copies_bad + c.table_copies_stale;
    assert!(
        differs >= 1 || !injected,
        "{ctx}: the bad copy went unnoticed: {c:?}"
    );
    assert_eq!(rig.counts().unrecoverable, 0, "{ctx}");
    // The bad copy was rewritten at the first flush: the next load finds both copies good.
    rig.array.flush().expect("flush");
    rig.array.close().expect("stop");
    rig.array = loaded(&rig);
    rig.read_all().expect("read");
    rig.run_action("check");
    let c = rig.counts();
    assert_eq!(
        c.table_copies_bad + c.table_copies_stale + c.tables_rebuilt,
        0,
        "{ctx}: the bad copy was not rewritten: {c:?}"
    );
}

#[test]
fn table_faults_raid5() {
    for_each_case("table_faults_raid5", |s| {
        table_fault(s, Level::Raid5, false)
    });
}

#[test]
fn table_faults_raid6() {
    for_each_case("table_faults_raid6", |s| {
        table_fault(s, Level::Raid6, false)
    });
}

#[test]
fn table_faults_found_and_fixed_by_scrub() {
    for_each_case("table_faults_found_and_fixed_by_scrub", |s| {
        let level = [Level::Raid4, Level::Raid5, Level::Raid6][s as usize % 3];
        table_fault(s, level, true)
    });
}

/// Create writes no tables (they read as zeroes, each block's records the zero block's); the
/// first write-out writes the tables its writes changed, and only those.
#[test]
fn create_writes_no_tables_and_blank_ones_hold_the_zero_blocks_records() {
    let parts = records::array(7, Level::Raid5, Some(2), 16384, 4, MEMBER, true);
    let mut rig = Rig::new(7, Level::Raid5, parts);
    let zone = rig.zone();
    let zone_bytes = |rig: &Rig, d: usize| -> Vec<u8> {
        (0..zone.len_sectors() / 8)
            .flat_map(|p| rig.block(d, (zone.start_sectors + p * 8) * 512))
            .collect()
    };
    for d in 0..rig.sims.len() {
        assert!(
            zone_bytes(&rig, d).iter().all(|&b| b == 0),
            "member {d}: create wrote tables"
        );
    }
    assert!(
        rig.read_all().unwrap() == rig.model,
        "a new array reads as zeroes"
    );
    rig.run_action("check");
    assert_eq!(
        rig.counts(),
        IntegrityCounts::default(),
        "blank tables are the initial ones"
    );
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    rig.write(0, 8192, &mut rng);
    rig.array.flush().expect("flush");
    let written: usize = (0..rig.sims.len())
        .map(|d| {
            zone_bytes(&rig, d)
                .chunks(PAGE as usize)
                .filter(|b| b.iter().any(|&x| x != 0))
                .count()
        })
        .sum();
    // Two data blocks and their parity, each recorded in table block 0 of its member, in two
    // copies: at most 3 members' tables times 2 copies.
    assert!(
        (1..=6).contains(&written),
        "{written} table blocks written for one stripe's write"
    );
    rig.reassemble();
    assert!(rig.read_all().unwrap() == rig.model);
    rig.run_action("check");
    let c = rig.counts();
    assert_eq!(
        c.table_copies_bad + c.table_copies_stale + c.tables_rebuilt,
        0,
        "{c:?}"
    );
}

/// Canary: without records the same data faults reach the client as good data.
#[test]
fn canary_without_integrity_faults_reach_the_client() {
    let mut wrong = 0;
    let mut cases = 0;
    for seed in 0..60u64 {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut rig = new_rig(seed, Level::Raid5, false);
        let fault =
            [Fault::Rot, Fault::Garbage, Fault::Lost, Fault::Misdirected][seed as usize % 4];
        let (row, pg) = rig.pick_page(&mut rng);
        rig.inject(fault, Kind::Data, row, pg, &mut rng);
        cases += 1;
        if rig.read_all().is_ok_and(|got| got != rig.model) {
            wrong += 1;
        }
    }
    assert!(
        wrong * 10 >= cases * 9,
        "only {wrong} of {cases} faults reached the client without records: the injection is broken"
    );
}

/// A member that silently drops every write (a dying drive that still answers): each block the
/// array rewrites there reads back wrong, and after a few such rewrites the member is failed;
/// every read still returns the written data.
#[test]
fn a_member_that_keeps_losing_rewrites_is_failed() {
    let seed = 77;
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let rig = new_rig(seed, Level::Raid5, true);
    let victim = 1;
    rig.sims[victim].set_faults(device::Faults {
        lost_write: 1.0,
        ..device::Faults::default()
    });
    // Damage blocks of the victim in several rows; reads rebuild them, rewrites vanish.
    let rows = rig.geometry().stripes();
    for i in 0..6u64 {
        let row = (i * 7) % rows;
        let pg = 0;
        let off = row * rig.chunk() + pg;
        let mut g = vec![0u8; PAGE as usize];
        rng.fill(&mut g[..]);
        rig.put(victim, off, &g);
    }
    let got = rig.read_all().expect("reads are served from redundancy");
    assert!(got == rig.model, "wrong data");
    let st = rig.array.status();
    let c = st.integrity.expect("integrity").counts;
    assert!(
        c.rewrite_failures >= 3,
        "rewrites that read back wrong were not noticed: {c:?}"
    );
    assert_eq!(
        st.missing_roles,
        vec![victim],
        "the member that keeps losing rewrites is still in the array: {c:?}"
    );
    // Degraded now, and still right.
    assert!(rig.read_all().expect("degraded read") == rig.model);
}
