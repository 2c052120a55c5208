//! Integrity records on mirrors (RAID1 2–4 way, RAID10 near, far and offset layouts): a silent
//! fault of any class on any copy of a block (bit rot, garbage, zeroes, a torn block, a lost
//! write, a write sent to another block) is caught by reads and scrubs and repaired from a good
//! copy; faults on every copy give the right data or an error, never wrong data; table blocks
//! are checked like data; a degraded 2-way mirror still verifies with its twin's records.
//! Canary: the same faults without records reach the client.
//!
//! Seeds: `IRONRAID_SEED` alone, else `IRONRAID_INTEGRITY_CASES` per test (default 300).

use device::{Device, SimDevice};
use engine::{assemble, AssembleOptions, ErrorKind};
use layout::{Level, Loc};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use simkit::records::{self, config, Fault, FAULTS, PAGE};
use std::sync::Arc;

const MEMBER: u64 = 2 << 20;

/// The rig of these tests: [`records::Rig`] over a RAID1/RAID10 array, seen page by page
/// through [`CopyAccess`].
type Rig = records::Rig;

/// A rig over a random RAID1/RAID10 geometry of `level`, with records when `integrity`.
fn new_rig(seed: u64, level: Level, integrity: bool) -> Rig {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let (layout, n) = match level {
        Level::Raid1 => (None, rng.gen_range(2..=4)),
        _ => {
            // near 2, near 3, far 2, offset 2
            let layouts = [0x102, 0x103, 0x201, 0x10201];
            let l = layouts[rng.gen_range(0..layouts.len())];
            let min = if l == 0x103 { 3 } else { 2 };
            (Some(l), rng.gen_range(min.max(3)..=6))
        }
    };
    let chunk = 4096u64 << rng.gen_range(0..4);
    // Sub-page writes too: the array reads, patches and writes whole pages.
    let parts = records::array(seed, level, layout, chunk, n, MEMBER, integrity);
    Rig::with_writes(seed, level, parts, &mut rng)
}

/// A 2-way RAID1 rig with records: the first of `seed`'s rigs, or of seeds drawn from `rng`,
/// with two members.
fn two_way_rig(seed: u64, rng: &mut ChaCha8Rng) -> Rig {
    let mut rig = new_rig(seed, Level::Raid1, true);
    while rig.sims.len() != 2 {
        rig = new_rig(rng.gen(), Level::Raid1, true);
    }
    rig
}

/// A mirror rig's blocks by array page and copy.
trait CopyAccess {
    fn pages(&self) -> u64;
    fn copies(&self, page: u64) -> Vec<Loc>;
    fn copy_block(&self, loc: Loc) -> Vec<u8>;
    fn put_copy(&self, loc: Loc, bytes: &[u8]);
    fn inject(&mut self, fault: Fault, page: u64, loc: Loc, rng: &mut ChaCha8Rng);
    fn read_page_from_each_copy(&self, page: u64) -> engine::Result<bool>;
    fn pick_page(&self, rng: &mut ChaCha8Rng) -> u64;
}

impl CopyAccess for Rig {
    fn pages(&self) -> u64 {
        self.model.len() as u64 / PAGE
    }

    fn copies(&self, page: u64) -> Vec<Loc> {
        self.array
            .geometry()
            .map_copies(page * PAGE / 512)
            .iter()
            .collect()
    }

    fn copy_block(&self, loc: Loc) -> Vec<u8> {
        self.block(loc.dev, loc.dev_sector * 512)
    }

    fn put_copy(&self, loc: Loc, bytes: &[u8]) {
        self.put(loc.dev, loc.dev_sector * 512, bytes);
    }

    /// Inject `fault` into copy `loc` of array page `page`.
    fn inject(&mut self, fault: Fault, page: u64, loc: Loc, rng: &mut ChaCha8Rng) {
        if !matches!(fault, Fault::Lost | Fault::Misdirected) {
            return self.damage(fault, loc.dev, loc.dev_sector * 512, rng);
        }
        // The write goes through the array; this copy keeps the old block.
        let before = self.copy_block(loc);
        self.write(page * PAGE, PAGE as usize, rng);
        self.array.flush().expect("flush");
        let new = self.copy_block(loc);
        self.put_copy(loc, &before);
        if fault == Fault::Misdirected {
            // Another page's copy on the same member takes the write.
            let victim = (0..self.pages())
                .map(|_| rng.gen_range(0..self.pages()))
                .filter(|&p| p != page)
                .find_map(|p| self.copies(p).into_iter().find(|c| c.dev == loc.dev))
                .expect("another page on the member");
            self.put_copy(victim, &new);
        }
    }

    /// Read `page` as many times as it has copies: reads rotate over the copies, so each is
    /// read once. Returns whether every read returned the model's bytes.
    fn read_page_from_each_copy(&self, page: u64) -> engine::Result<bool> {
        let want = &self.model[(page * PAGE) as usize..((page + 1) * PAGE) as usize];
        let mut right = true;
        for _ in 0..self.copies(page).len() {
            let mut buf = vec![0u8; PAGE as usize];
            self.array.read(page * PAGE, &mut buf)?;
            right &= buf == want;
        }
        Ok(right)
    }

    /// A page the rig wrote: a page never written lies in a region the used-region map calls
    /// unused, which `check` skips (its faults are found by reads only).
    fn pick_page(&self, rng: &mut ChaCha8Rng) -> u64 {
        let written = |p: u64| {
            self.model[(p * PAGE) as usize..((p + 1) * PAGE) as usize]
                .iter()
                .any(|&b| b != 0)
        };
        let from = rng.gen_range(0..self.pages());
        (from..self.pages())
            .chain(0..from)
            .find(|&p| written(p))
            .expect("the rig wrote something")
    }
}

fn for_each_case(test: &str, case: impl Fn(u64)) {
    testkit::for_each_seed!(test, testkit::Seeds::integrity(0x3a7e_0000), case)
}

/// One fault of any class on one copy: every read returns the right data and the read that
/// met the bad copy repaired it; `check` then finds nothing left, copies agree, and any member
/// may go with every byte still readable.
fn single_fault(seed: u64, level: Level) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut rig = new_rig(seed, level, true);
    let fault = FAULTS[rng.gen_range(0..FAULTS.len())];
    let page = rig.pick_page(&mut rng);
    let copies = rig.copies(page);
    let loc = copies[rng.gen_range(0..copies.len())];
    rig.inject(fault, page, loc, &mut rng);
    let ctx = format!("seed {seed} {level:?} {fault:?} on page {page} copy {loc:?}");
    let scrub_first = rng.gen_bool(0.3);
    if rng.gen_bool(0.3) {
        // Records come back from the tables on disk.
        rig.reassemble();
    }
    if scrub_first {
        rig.run_action("check");
        let c = rig.counts();
        assert!(c.data_mismatches >= 1, "{ctx}: check found nothing: {c:?}");
        rig.run_action("repair");
    } else {
        let right = rig
            .read_page_from_each_copy(page)
            .unwrap_or_else(|e| panic!("{ctx}: read failed: {e}"));
        assert!(right, "{ctx}: wrong data");
        let c = rig.counts();
        assert!(
            c.data_mismatches >= 1 && c.repaired >= 1,
            "{ctx}: reads did not catch and repair it: {c:?}"
        );
    }
    let got = rig
        .read_all()
        .unwrap_or_else(|e| panic!("{ctx}: read failed: {e}"));
    assert!(got == rig.model, "{ctx}: wrong data");
    // A misdirected write damaged a second block, which a read may not have met: repair.
    rig.run_action("repair");
    let before = rig.counts();
    rig.run_action("check");
    let after = rig.counts();
    assert_eq!(
        after.data_mismatches, before.data_mismatches,
        "{ctx}: a check after the repair still found bad copies: {after:?}"
    );
    assert_eq!(after.unrecoverable, 0, "{ctx}: {after:?}");
    assert_eq!(
        rig.array.status().sync.mismatch_sectors,
        0,
        "{ctx}: copies still differ"
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
fn single_faults_raid1() {
    for_each_case("single_faults_raid1", |s| single_fault(s, Level::Raid1));
}

#[test]
fn single_faults_raid10() {
    for_each_case("single_faults_raid10", |s| single_fault(s, Level::Raid10));
}

/// Faults on two or more copies of one page: the right data or an error, never wrong data; a
/// copy left good repairs the others.
fn multi_fault(seed: u64, level: Level) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut rig = new_rig(seed, level, true);
    let page = rig.pick_page(&mut rng);
    let copies = rig.copies(page);
    let hit = rng.gen_range(2..=copies.len());
    for loc in &copies[..hit] {
        let fault = [Fault::Rot, Fault::Garbage, Fault::Zeros, Fault::Torn][rng.gen_range(0..4)];
        rig.inject(fault, page, *loc, &mut rng);
    }
    let ctx = format!(
        "seed {seed} {level:?} page {page}: {hit} of {} copies hit",
        copies.len()
    );
    match rig.read_page_from_each_copy(page) {
        Ok(right) => assert!(right, "{ctx}: wrong data"),
        Err(e) => {
            assert_eq!(hit, copies.len(), "{ctx}: a good copy was left: {e}");
            assert_eq!(e.kind(), ErrorKind::Corruption, "{ctx}: {e:?}");
            let before = rig.counts().unrecoverable;
            assert!(before >= 1, "{ctx}");
            // A check counts the page and goes on to the end.
            rig.run_action("check");
            assert!(rig.counts().unrecoverable > before, "{ctx}");
            let first = rig.copy_block(copies[0]);
            if copies[1..].iter().any(|c| rig.copy_block(*c) != first) {
                assert!(
                    rig.array.status().sync.mismatch_sectors >= 8,
                    "{ctx}: the check stopped at the page"
                );
            }
        }
    }
}

#[test]
fn multi_faults_raid1_never_wrong_data() {
    for_each_case("multi_faults_raid1_never_wrong_data", |s| {
        multi_fault(s, Level::Raid1)
    });
}

#[test]
fn multi_faults_raid10_never_wrong_data() {
    for_each_case("multi_faults_raid10_never_wrong_data", |s| {
        multi_fault(s, Level::Raid10)
    });
}

/// A table block copy damaged behind the array's back: found at assembly or by a scrub, and
/// rewritten; reads stay right meanwhile.
fn table_fault(seed: u64, level: Level) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut rig = new_rig(seed, level, true);
    let zone = rig.zone();
    let subject = rng.gen_range(0..zone.raid_disks);
    let copy = rng.gen_range(0..zone.copies);
    let holder = zone.holder(subject, copy);
    let index = rng.gen_range(0..zone.tables);
    let at = rig.data_offset + zone.table_sector(copy, index) * 512;
    let bit = rng.gen_range(0..PAGE * 8);
    rig.sims[holder].flip_bit(at + bit / 8, (bit % 8) as u8);
    let ctx = format!("seed {seed} {level:?} table {index} of subject {subject} copy {copy}");
    if rng.gen_bool(0.5) {
        // Found at assembly, or (a small record cache) when the table is first needed.
        rig.reassemble();
        assert!(rig.read_all().expect("read") == rig.model, "{ctx}");
    }
    rig.run_action("check");
    let found = rig.counts().table_copies_bad;
    assert!(found >= 1, "{ctx}: {:?}", rig.counts());
    assert!(rig.read_all().expect("read") == rig.model, "{ctx}");
    rig.run_action("repair");
    rig.array.flush().expect("flush");
    let before = rig.counts().table_copies_bad;
    rig.run_action("check");
    assert_eq!(
        rig.counts().table_copies_bad,
        before,
        "{ctx}: the copy was not rewritten"
    );
}

#[test]
fn table_faults_raid1_and_raid10() {
    for_each_case("table_faults_raid1_and_raid10", |s| {
        table_fault(s, [Level::Raid1, Level::Raid10][s as usize % 2])
    });
}

/// A 2-way RAID1 that lost a member keeps only one copy of its survivor's records, on the lost
/// member; the survivor's own table of its twin stands in. Damage on the survivor before the
/// degraded restart is an error, never wrong data.
#[test]
fn degraded_two_way_mirror_verifies_with_its_twins_records() {
    for_each_case(
        "degraded_two_way_mirror_verifies_with_its_twins_records",
        |seed| {
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            let mut rig = two_way_rig(seed, &mut rng);
            let gone = rng.gen_range(0..2);
            let survivor = 1 - gone;
            // Writes while degraded must keep the lost member's records current too.
            rig.array
                .fail_member(rig.sims[gone].name())
                .expect("fail the member");
            for _ in 0..4 {
                let len = rng.gen_range(1..16usize) * 512;
                let at = rng.gen_range(0..(rig.model.len() - len) / 512) as u64 * 512;
                rig.write(at, len, &mut rng);
            }
            rig.array.close().expect("stop");
            let page = rig.pick_page(&mut rng);
            let loc = rig
                .copies(page)
                .into_iter()
                .find(|c| c.dev == survivor)
                .expect("copy");
            rig.inject(Fault::Garbage, page, loc, &mut rng);
            let degraded = rig.assemble_without(&[gone], seed ^ 3);
            assert_eq!(
                degraded
                    .status()
                    .integrity
                    .expect("on")
                    .counts
                    .tables_rebuilt,
                0
            );
            let mut buf = vec![0u8; PAGE as usize];
            let got = degraded.read(page * PAGE, &mut buf);
            assert!(
                got.is_err(),
                "seed {seed}: the damaged only copy was served as good data"
            );
            for p in (0..rig.pages()).filter(|&p| p != page) {
                degraded
                    .read(p * PAGE, &mut buf)
                    .unwrap_or_else(|e| panic!("seed {seed}: false corruption at page {p}: {e}"));
                assert!(buf[..] == rig.model[(p * PAGE) as usize..((p + 1) * PAGE) as usize]);
            }
        },
    );
}

/// A rebuild onto a new member copies verified blocks only: a bad copy on the source is
/// repaired from another copy first, and the new member ends up right.
#[test]
fn rebuild_reads_verified_copies() {
    for_each_case("rebuild_reads_verified_copies", |seed| {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut rig = new_rig(seed, Level::Raid1, true);
        while rig.sims.len() < 3 {
            rig = new_rig(rng.gen(), Level::Raid1, true);
        }
        let page = rig.pick_page(&mut rng);
        let copies = rig.copies(page);
        rig.inject(Fault::Garbage, page, copies[0], &mut rng);
        let victim = copies[copies.len() - 1].dev;
        let name = rig.sims[victim].name().to_string();
        rig.array.fail_member(&name).expect("fail");
        rig.array.remove_member(&name).expect("remove");
        let fresh = Arc::new(SimDevice::new("fresh", MEMBER, seed ^ 99));
        rig.array
            .add_member(fresh.clone() as Arc<dyn Device>, false)
            .expect("add");
        for _ in 0..100_000 {
            if rig.array.sync_step() == engine::SyncAction::Idle
                && rig.array.status().missing_roles.is_empty()
            {
                break;
            }
        }
        assert!(
            rig.array.status().missing_roles.is_empty(),
            "seed {seed}: rebuild did not end"
        );
        rig.sims[victim] = fresh;
        assert!(rig.read_all().expect("read") == rig.model, "seed {seed}");
        rig.run_action("check");
        assert_eq!(rig.array.status().sync.mismatch_sectors, 0, "seed {seed}");
        let c = rig.counts();
        assert_eq!(c.unrecoverable, 0, "seed {seed}: {c:?}");
    });
}

/// Canary: without records, a bad copy reaches the client.
#[test]
fn canary_without_integrity_faults_reach_the_client() {
    let (mut wrong, mut cases) = (0, 0);
    for seed in 0..60u64 {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let level = [Level::Raid1, Level::Raid10][seed as usize % 2];
        let mut rig = new_rig(seed, level, false);
        let fault =
            [Fault::Rot, Fault::Garbage, Fault::Lost, Fault::Misdirected][seed as usize % 4];
        let page = rig.pick_page(&mut rng);
        let copies = rig.copies(page);
        rig.inject(
            fault,
            page,
            copies[rng.gen_range(0..copies.len())],
            &mut rng,
        );
        cases += 1;
        if rig.read_page_from_each_copy(page).is_ok_and(|right| !right) {
            wrong += 1;
        }
    }
    assert!(
        wrong * 10 >= cases * 9,
        "only {wrong} of {cases} faults reached the client without records: the injection is broken"
    );
}

/// A member that silently drops every write: each copy rewritten there reads back wrong, and
/// after a few such rewrites the member is failed; every read still returns the written data.
#[test]
fn a_mirror_member_that_keeps_losing_rewrites_is_failed() {
    let mut rng = ChaCha8Rng::seed_from_u64(78);
    let mut rig = new_rig(78, Level::Raid1, true);
    while rig.sims.len() < 3 {
        rig = new_rig(rng.gen(), Level::Raid1, true);
    }
    let victim = 1;
    rig.sims[victim].set_faults(device::Faults {
        lost_write: 1.0,
        ..device::Faults::default()
    });
    let pages: Vec<u64> = (0..6).map(|i| i * 7 % rig.pages()).collect();
    for &page in &pages {
        let loc = rig
            .copies(page)
            .into_iter()
            .find(|c| c.dev == victim)
            .expect("copy");
        let mut g = vec![0u8; PAGE as usize];
        rng.fill(&mut g[..]);
        rig.put_copy(loc, &g);
    }
    for &page in &pages {
        assert!(
            rig.read_page_from_each_copy(page)
                .expect("served from a good copy"),
            "wrong data at page {page}"
        );
    }
    let st = rig.array.status();
    let c = st.integrity.expect("integrity").counts;
    assert!(c.rewrite_failures >= 3, "{c:?}");
    assert_eq!(
        st.missing_roles,
        vec![victim],
        "the member that keeps losing rewrites is still in the array: {c:?}"
    );
    assert!(rig.read_all().expect("degraded read") == rig.model);
}

/// The records of data a flush made durable stay durable through later table write-outs. A
/// spare is rebuilt into a 2-way RAID1 (one table copy per subject), data is written and
/// flushed, the other member is failed, and more writes go out unflushed with a one-page record
/// cache, so the spare's only copy of the tables is rewritten at every write; then the power
/// goes. After reassembly the flushed data reads back and no table copy was lost.
///
/// Canary: with single-copy table blocks written without FUA, the first seeds' cut tears the
/// spare's only copy (table_copies_bad 1, tables_rebuilt 2). Before a twin's stand-in stopped
/// counting as a copy, the lost member's table came back as zero records, the survivor's took
/// them from its twin, and long-flushed data read EIO (crash sim seed 12648472).
#[test]
fn degraded_two_way_mirror_keeps_flushed_records_through_a_cut() {
    for_each_case(
        "degraded_two_way_mirror_keeps_flushed_records_through_a_cut",
        |seed| {
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            let rail = device::PowerRail::new();
            let sim = |name: &str, salt: u64| {
                Arc::new(SimDevice::new(name, MEMBER, seed ^ salt << 40).on_rail(rail.clone()))
            };
            let sims = [sim("sim0", 0), sim("sim1", 1), sim("spare2", 2)];
            engine::create(&engine::CreateSpec {
                discard: true,
                integrity: true,
                ..simkit::clean_spec(
                    "cut",
                    Level::Raid1,
                    None,
                    4096,
                    simkit::devs(&sims[..2]),
                    vec![],
                )
            })
            .expect("create");
            let boot = |devs: &[Arc<SimDevice>], salt: u64, cache_bytes: usize| {
                let mut config = config(seed ^ salt);
                config.integrity_cache_bytes = cache_bytes;
                assemble(
                    simkit::devs(devs),
                    AssembleOptions {
                        config,
                        ..Default::default()
                    },
                )
                .expect("assemble")
            };
            // One record page: every write writes the changed tables out (unflushed).
            let array = boot(&sims[..2], 1, PAGE as usize);
            // The spare takes role 1.
            array.fail_member("sim1").expect("fail sim1");
            array.remove_member("sim1").expect("remove sim1");
            array
                .add_member(sims[2].clone() as Arc<dyn Device>, false)
                .expect("add the spare");
            for _ in 0..100_000 {
                if array.sync_step() == engine::SyncAction::Idle
                    && array.status().missing_roles.is_empty()
                {
                    break;
                }
            }
            assert!(
                array.status().missing_roles.is_empty(),
                "rebuild did not end"
            );
            let mut model = vec![0u8; array.size_bytes() as usize];
            rng.fill(&mut model[..]);
            array.write(0, &model, false).expect("write");
            array.flush().expect("flush");
            // Role 0 goes; writes to a few pages go to the spare only, their tables unflushed.
            array.fail_member("sim0").expect("fail sim0");
            let pages = model.len() as u64 / PAGE;
            let mut unflushed = Vec::new();
            for _ in 0..rng.gen_range(1..8) {
                let page = rng.gen_range(0..pages);
                let mut buf = vec![0u8; PAGE as usize];
                rng.fill(&mut buf[..]);
                array
                    .write(page * PAGE, &buf, false)
                    .expect("degraded write");
                unflushed.push(page);
            }
            rail.cut_after(0);
            drop(array);
            for s in &sims {
                s.power_cut();
            }
            rail.restore();
            // Every table loaded at assembly, this time.
            let array = boot(&[sims[0].clone(), sims[2].clone()], 2, 64 << 20);
            let st = array.status();
            assert_eq!(st.missing_roles, vec![0], "seed {seed}: {:?}", st.members);
            let mut buf = vec![0u8; PAGE as usize];
            for p in (0..pages).filter(|p| !unflushed.contains(p)) {
                array
                    .read(p * PAGE, &mut buf)
                    .unwrap_or_else(|e| panic!("seed {seed}: flushed page {p}: {e}"));
                assert!(
                    buf[..] == model[(p * PAGE) as usize..((p + 1) * PAGE) as usize],
                    "seed {seed}: page {p} differs"
                );
            }
            let c = records::counts(&array);
            assert_eq!(
                (c.table_copies_bad, c.tables_rebuilt),
                (0, 0),
                "seed {seed}: a cut destroyed the only table copy: {c:?}"
            );
        },
    );
}

/// A 2-way RAID1 whose lost member held the survivor's only table copy, and whose own table
/// (on the survivor) was never written, as when a cut lost its write-out: the survivor's
/// records are rebuilt from its data, and a rebuild onto a spare under a one-page record cache
/// (pages evicted and reloaded between its reads and writes) keeps them so: every page reads
/// back, nothing is recorded unrecoverable.
///
/// Canary: when a never-written table loaded at epoch 1, the new member's resident page of it
/// stood in for the survivor's lost table with initial records, and the rebuild read the
/// survivor's written pages as failing them (crash sim seed 12648970).
#[test]
fn a_never_written_twin_table_stands_in_for_nothing_during_a_rebuild() {
    for_each_case(
        "a_never_written_twin_table_stands_in_for_nothing_during_a_rebuild",
        |seed| {
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            let rig = two_way_rig(seed, &mut rng);
            rig.array.close().expect("stop");
            let zone = rig.zone();
            // Member 1 keeps member 0's tables: blank them, as if never written.
            for copy in 0..zone.copies {
                let holder = zone.holder(0, copy);
                assert_eq!(holder, 1, "a 2-way mirror keeps each table on the twin");
                for index in 0..zone.tables {
                    rig.put(
                        holder,
                        zone.table_sector(copy, index) * 512,
                        &[0; PAGE as usize],
                    );
                }
            }
            let mut config = config(seed);
            config.integrity_cache_bytes = PAGE as usize;
            let array = assemble(
                vec![rig.sims[1].clone() as Arc<dyn Device>],
                AssembleOptions {
                    config,
                    ..Default::default()
                },
            )
            .expect("degraded assembly");
            let spare = Arc::new(SimDevice::new("spare", MEMBER, seed ^ 77));
            array
                .add_member(spare as Arc<dyn Device>, false)
                .expect("add the spare");
            for _ in 0..100_000 {
                if array.sync_step() == engine::SyncAction::Idle
                    && array.status().missing_roles.is_empty()
                {
                    break;
                }
            }
            let st = array.status();
            assert!(
                st.missing_roles.is_empty(),
                "seed {seed}: rebuild did not end"
            );
            let mut all = vec![0u8; rig.model.len()];
            array
                .read(0, &mut all)
                .unwrap_or_else(|e| panic!("seed {seed}: {e}\n{:?}", st.members));
            assert!(all == rig.model, "seed {seed}: wrong data");
            assert_eq!(records::counts(&array).unrecoverable, 0, "seed {seed}");
        },
    );
}

/// A 2-way RAID1 whose lost member held the survivor's only table copy, and whose own table
/// (on the survivor) was never written, as when a cut lost its write-out: the survivor's
/// records are rebuilt from its data, and the lost member's, which stand in for them at the
/// next start, must take them too. After a write, a flush and a restart, every page reads back.
///
/// Canary: before the twin took the rebuilt records, the flush wrote its table with the zero
/// block's records for every page but the one written; the next start took them for the
/// survivor's and served its long-flushed pages as unrecoverable (EIO; crash sim seed 12648970
/// with a 64 KiB RAID1 recovery unit).
#[test]
fn records_rebuilt_from_the_survivor_reach_the_twin_that_stands_in_for_them() {
    for_each_case(
        "records_rebuilt_from_the_survivor_reach_the_twin_that_stands_in_for_them",
        |seed| {
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            let mut rig = two_way_rig(seed, &mut rng);
            rig.array.close().expect("stop");
            let zone = rig.zone();
            // Member 1 keeps member 0's tables: blank them, as if never written.
            for copy in 0..zone.copies {
                for index in 0..zone.tables {
                    rig.put(
                        zone.holder(0, copy),
                        zone.table_sector(copy, index) * 512,
                        &[0; PAGE as usize],
                    );
                }
            }
            let survivor = || {
                assemble(
                    vec![rig.sims[1].clone() as Arc<dyn Device>],
                    AssembleOptions {
                        config: config(seed),
                        ..Default::default()
                    },
                )
                .expect("degraded assembly")
            };
            let array = survivor();
            let page = rng.gen_range(0..rig.pages());
            let mut buf = vec![0u8; PAGE as usize];
            rng.fill(&mut buf[..]);
            array.write(page * PAGE, &buf, false).expect("write");
            array.flush().expect("flush");
            array.close().expect("stop");
            rig.model[(page * PAGE) as usize..((page + 1) * PAGE) as usize].copy_from_slice(&buf);
            let array = survivor();
            let mut all = vec![0u8; rig.model.len()];
            array
                .read(0, &mut all)
                .unwrap_or_else(|e| panic!("seed {seed}: {e}\n{:?}", array.status().integrity));
            assert!(all == rig.model, "seed {seed}: wrong data");
        },
    );
}
