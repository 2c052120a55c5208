//! Bad sectors as md handles them (issue 21 item 7), on simulated members whose sectors fail
//! reads until they are written (as a drive remaps a sector on write):
//! * a healthy array corrects a read error from redundancy and keeps the member;
//! * a degraded array answers EIO for just the block it cannot rebuild, records it in the
//!   survivor's bad-block log and keeps the survivor; a full write of the block clears it;
//! * a rebuild goes on past a block it cannot rebuild, records it on the new member, and the
//!   spare becomes active; the records survive a restart and md's log format holds them.

use device::{Device, SimDevice};
use engine::{assemble, Array, AssembleOptions, ErrorKind};
use layout::Level;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use simkit::devs;
use std::sync::Arc;
use std::time::Duration;

const MEMBER_BYTES: u64 = 4 << 20;
const CHUNK: u64 = 64 << 10;
const PAGE: usize = 4096;
/// Member data-area byte of the bad sector: row 0 (RAID5 ×4 left-symmetric puts P of row 0 on
/// member 3, d0 on member 0, d1 on member 1).
const BAD_AT: u64 = 5 * PAGE as u64;

struct Rig {
    sims: Vec<Arc<SimDevice>>,
    array: Arc<Array>,
    data: Vec<u8>,
    data_offset: u64,
}

fn sims(n: usize, prefix: &str, seed: u64) -> Vec<Arc<SimDevice>> {
    (0..n)
        .map(|i| {
            Arc::new(SimDevice::new(
                format!("{prefix}{i}"),
                MEMBER_BYTES,
                seed + i as u64,
            ))
        })
        .collect()
}

fn open(all: &[Arc<SimDevice>]) -> Arc<Array> {
    let a = Arc::new(simkit::reassemble(all).expect("assemble"));
    a.set_sync_speed(None, Some(u64::MAX));
    a
}

fn rig(spares: usize) -> Rig {
    rig_with(Level::Raid5, 4, spares, false)
}

/// `n` members of `level` (md's default layout) and `spares` spares, with integrity records
/// when `integrity`, filled with seeded bytes.
fn rig_with(level: Level, n: usize, spares: usize, integrity: bool) -> Rig {
    let members = sims(n, "m", 11);
    let spare_sims = sims(spares, "s", 77);
    let created = engine::create(&engine::CreateSpec {
        integrity,
        ..simkit::clean_spec("bb", level, None, CHUNK, devs(&members), devs(&spare_sims))
    })
    .expect("create");
    let all: Vec<Arc<SimDevice>> = members.iter().chain(&spare_sims).cloned().collect();
    let array = open(&all);
    let mut data = vec![0u8; array.size_bytes() as usize];
    ChaCha8Rng::seed_from_u64(5).fill(&mut data[..]);
    array.write(0, &data, false).expect("fill");
    array.flush().expect("flush");
    Rig {
        sims: all,
        array,
        data,
        data_offset: created.data_offset_sectors * 512,
    }
}

impl Rig {
    /// Member `m`'s data-area page at `at` fails reads until written.
    fn bad_sector(&self, m: usize, at: u64) {
        self.sims[m].set_unreadable(self.data_offset + at, PAGE as u64);
    }

    /// Read the array page by page: the pages that fail with EIO (anything else is a test
    /// failure), after checking every page that reads against the model.
    fn eio_pages(&self) -> Vec<usize> {
        let mut eio = Vec::new();
        let mut buf = vec![0u8; PAGE];
        for (i, want) in self.data.chunks(PAGE).enumerate() {
            match self.array.read((i * PAGE) as u64, &mut buf) {
                Ok(()) => assert!(buf == want, "page {i} reads wrong data"),
                Err(e) if matches!(e.kind(), ErrorKind::Io | ErrorKind::Corruption) => eio.push(i),
                Err(e) => panic!("page {i}: unexpected error {e}"),
            }
        }
        eio
    }

    /// The array page held by member `m` at data-area byte `at` (found by its contents).
    fn page_of(&self, m: usize, at: u64) -> usize {
        let img = self.sims[m].contents();
        let start = (self.data_offset + at) as usize;
        let want = &img[start..start + PAGE];
        self.data
            .chunks(PAGE)
            .position(|p| p == want)
            .expect("member page holds array data")
    }

    fn member(&self, name: &str) -> engine::MemberStatus {
        self.array
            .status()
            .members
            .into_iter()
            .find(|m| m.name == name)
            .expect("member listed")
    }
}

fn kinds(rx: &std::sync::mpsc::Receiver<engine::Event>) -> Vec<&'static str> {
    rx.try_iter().map(|e| e.kind).collect()
}

#[test]
fn healthy_array_corrects_a_read_error_and_keeps_the_member() {
    let r = rig(0);
    let events = r.array.subscribe();
    r.bad_sector(0, BAD_AT);
    assert!(r.eio_pages().is_empty(), "redundancy covers one bad sector");
    let st = r.array.status();
    assert!(st.missing_roles.is_empty(), "no member failed: {st:?}");
    assert_eq!(
        r.sims[0].unreadable_sectors(),
        0,
        "the sector was rewritten"
    );
    let kinds = kinds(&events);
    assert!(kinds.contains(&"read_error_corrected"), "{kinds:?}");
    assert!(!kinds.contains(&"member_faulty"), "{kinds:?}");
    let m0 = r.member("m0");
    assert_eq!(m0.read_errors_corrected, 1);
    assert_eq!(m0.bad_sectors, 0);
}

#[test]
fn degraded_array_fails_just_the_lost_block_and_keeps_the_survivor() {
    let r = rig(0);
    r.array.fail_member("m3").expect("fail m3 (P of row 0)");
    let lost = r.page_of(0, BAD_AT);
    r.bad_sector(0, BAD_AT);
    assert_eq!(
        r.eio_pages(),
        vec![lost],
        "EIO for the unrecoverable page only"
    );
    let st = r.array.status();
    assert_eq!(st.missing_roles, vec![3], "the survivor stays: {st:?}");
    assert!(!st.failed);
    assert_eq!(
        r.member("m0").bad_sectors,
        8,
        "recorded in m0's bad-block log"
    );
    // Still EIO (from the log now, without asking the device) until written whole.
    assert_eq!(r.eio_pages(), vec![lost]);
    let fresh = vec![0x5au8; PAGE];
    r.array
        .write((lost * PAGE) as u64, &fresh, false)
        .expect("a full write of the lost block");
    let mut back = vec![0u8; PAGE];
    r.array
        .read((lost * PAGE) as u64, &mut back)
        .expect("reads again");
    assert_eq!(back, fresh);
    assert_eq!(
        r.member("m0").bad_sectors,
        0,
        "the write cleared the record"
    );
}

#[test]
fn rebuild_goes_on_past_an_unrecoverable_block() {
    let r = rig(1);
    // m1 holds d1 of row 0; its page at BAD_AT needs m0's page, which cannot be read.
    let lost_d0 = r.page_of(0, BAD_AT);
    let lost_d1 = r.page_of(1, BAD_AT);
    r.bad_sector(0, BAD_AT);
    r.array.fail_member("m1").expect("fail m1");
    r.array.start_background();
    assert!(
        r.array.wait_sync_idle(Duration::from_secs(60)),
        "rebuild finished"
    );
    let st = r.array.status();
    assert!(st.missing_roles.is_empty(), "spare active, m0 kept: {st:?}");
    let mut want = vec![lost_d0, lost_d1];
    want.sort_unstable();
    assert_eq!(
        r.eio_pages(),
        want,
        "EIO for what could not be rebuilt only"
    );
    assert_eq!(r.member("s0").bad_sectors, 8, "recorded on the new member");
    assert_eq!(
        r.member("m0").bad_sectors,
        8,
        "and on the unreadable survivor"
    );
    r.array.close().expect("clean stop");
    // md's log on the new member holds it, with the superblock's BAD_BLOCKS bit.
    let sb = engine::read_superblock(r.sims[4].as_ref()).expect("superblock");
    assert_ne!(sb.feature_map & format::feature::BAD_BLOCKS, 0);
    let log_at = (8 + i64::from(sb.bblog_offset)) as u64 * 512;
    let mut log = vec![0u8; usize::from(sb.bblog_size) * 512];
    r.sims[4].read_at(&mut log, log_at).expect("log");
    let ranges = format::decode_bad_blocks(&log, sb.bblog_shift);
    assert_eq!(
        ranges,
        vec![format::BadRange {
            start_sector: sb.data_offset + BAD_AT / 512,
            len_sectors: 8
        }]
    );
    // The records survive a restart.
    let again = open(&r.sims);
    let mut buf = vec![0u8; PAGE];
    assert!(again.read((lost_d1 * PAGE) as u64, &mut buf).is_err());
    assert!(again.read((lost_d0 * PAGE) as u64, &mut buf).is_err());
    assert!(again.status().missing_roles.is_empty());
}

#[test]
fn integrity_rebuild_goes_on_past_a_block_that_fails_its_record() {
    // Issue 21 item 7(b): one page of d0 overwritten behind the array's back, the member
    // holding d1 failed, a spare added: the rebuild used to stop for good at that row.
    let r = rig_with(Level::Raid5, 4, 1, true);
    let lost_d0 = r.page_of(0, BAD_AT);
    let lost_d1 = r.page_of(1, BAD_AT);
    r.sims[0].scribble(r.data_offset + BAD_AT, &[0x5a; PAGE]);
    r.array.fail_member("m1").expect("fail m1");
    r.array.start_background();
    assert!(
        r.array.wait_sync_idle(Duration::from_secs(60)),
        "rebuild finished"
    );
    let st = r.array.status();
    assert!(st.missing_roles.is_empty(), "spare active: {st:?}");
    let mut want = vec![lost_d0, lost_d1];
    want.sort_unstable();
    assert_eq!(
        r.eio_pages(),
        want,
        "EIO for the two pages the damage costs, no more"
    );
    assert_eq!(r.member("s0").bad_sectors, 8, "recorded on the new member");
    assert_eq!(
        r.member("m0").bad_sectors,
        0,
        "m0 answered: nothing to record there"
    );
}

#[test]
fn mirrors_correct_read_errors_and_rebuild_past_what_no_copy_holds() {
    for level in [Level::Raid1, Level::Raid10] {
        let n = if level == Level::Raid1 { 2 } else { 4 };
        let r = rig_with(level, n, 1, false);
        let events = r.array.subscribe();
        r.bad_sector(0, BAD_AT);
        // Reads spread over the copies: enough of them that m0's is among them.
        let page = r.page_of(0, BAD_AT);
        let mut buf = vec![0u8; PAGE];
        for _ in 0..n {
            r.array.read((page * PAGE) as u64, &mut buf).expect("read");
            assert_eq!(buf, r.data[page * PAGE..(page + 1) * PAGE], "{level:?}");
        }
        assert!(
            r.eio_pages().is_empty(),
            "{level:?}: the other copy serves it"
        );
        assert!(r.array.status().missing_roles.is_empty(), "{level:?}");
        assert_eq!(r.sims[0].unreadable_sectors(), 0, "{level:?}: rewritten");
        assert!(
            kinds(&events).contains(&"read_error_corrected"),
            "{level:?}"
        );
        assert_eq!(r.member("m0").read_errors_corrected, 1, "{level:?}");
        // m0's partner fails; m0's sector goes bad: the rebuild goes on past it.
        let lost = r.page_of(0, BAD_AT);
        r.array.fail_member("m1").expect("fail m1");
        r.bad_sector(0, BAD_AT);
        r.array.start_background();
        assert!(
            r.array.wait_sync_idle(Duration::from_secs(60)),
            "{level:?}: rebuild finished"
        );
        let st = r.array.status();
        assert!(st.missing_roles.is_empty(), "{level:?}: {st:?}");
        assert_eq!(r.eio_pages(), vec![lost], "{level:?}");
        assert_eq!(
            r.member("m0").bad_sectors,
            8,
            "{level:?}: recorded on the survivor that cannot read it"
        );
        assert_eq!(
            r.member("s0").bad_sectors,
            8,
            "{level:?}: recorded on the new member"
        );
        r.array.close().expect("close");
    }
}

#[test]
fn raid6_rebuilds_a_bad_sector_with_one_member_missing() {
    // Row 0 of RAID6 ×5 (left-symmetric): P on m4, Q on m0, d0 on m1.
    let r = rig_with(Level::Raid6, 5, 0, false);
    r.array.fail_member("m4").expect("fail m4");
    r.bad_sector(1, BAD_AT);
    assert!(r.eio_pages().is_empty(), "Q covers the second erasure");
    assert_eq!(r.array.status().missing_roles, vec![4]);
    assert_eq!(r.member("m1").read_errors_corrected, 1);
    assert_eq!(r.sims[1].unreadable_sectors(), 0);
}

/// Read `array` page by page: the pages that fail with EIO; every other one must equal `data`.
fn read_pages(array: &Array, data: &[u8]) -> Vec<usize> {
    let mut eio = Vec::new();
    let mut buf = vec![0u8; PAGE];
    for (i, want) in data.chunks(PAGE).enumerate() {
        match array.read((i * PAGE) as u64, &mut buf) {
            Ok(()) => assert!(buf == want, "page {i} reads wrong data"),
            Err(e) if matches!(e.kind(), ErrorKind::Io | ErrorKind::Corruption) => eio.push(i),
            Err(e) => panic!("page {i}: {e}"),
        }
    }
    eio
}

/// One seeded case of the bad-sector simulation: bad sectors drawn on a healthy array, on a
/// degraded one and across its rebuild, for every redundant level and random geometry.
/// Checked: reads never return wrong data; a healthy array corrects everything and keeps every
/// member; a degraded one keeps its survivors and fails only pages the bad sectors cost (at
/// most 3 each); the rebuild finishes and the same pages read EIO after it and after a restart;
/// one full write of the array clears every record.
fn bad_sector_case(seed: u64) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let levels = [
        Level::Raid1,
        Level::Raid10,
        Level::Raid4,
        Level::Raid5,
        Level::Raid6,
    ];
    let level = levels[rng.gen_range(0..levels.len())];
    let (layout, n) = match level {
        Level::Raid1 => (None, rng.gen_range(2..=3)),
        Level::Raid4 => (None, rng.gen_range(3..=5)),
        Level::Raid5 => (Some(rng.gen_range(0..=5)), rng.gen_range(3..=5)),
        Level::Raid6 => (
            Some([0, 1, 2, 3, 5, 16, 17, 18, 19, 20][rng.gen_range(0..10)]),
            rng.gen_range(4..=6),
        ),
        _ => [
            (Some(0x102), 4),
            (Some(0x201), 4),
            (Some(0x10201), 4),
            (Some(0x102), 3),
        ][rng.gen_range(0..4)],
    };
    let chunk = 4096u64 << rng.gen_range(0..3);
    let members: Vec<Arc<SimDevice>> = (0..n)
        .map(|i| {
            Arc::new(SimDevice::new(
                format!("m{i}"),
                2 << 20,
                seed ^ (i as u64) << 32,
            ))
        })
        .collect();
    let spare = Arc::new(SimDevice::new("s0", 2 << 20, seed ^ 0x5bad));
    let created = simkit::create_clean(
        "bbsim",
        level,
        layout,
        chunk,
        devs(&members),
        devs(std::slice::from_ref(&spare)),
    );
    let all: Vec<Arc<SimDevice>> = members.iter().chain([&spare]).cloned().collect();
    let boot = |boots: u64| {
        assemble(
            devs(&all),
            AssembleOptions {
                config: engine::ArrayConfig {
                    deterministic_seed: Some(seed.wrapping_mul(100) + boots),
                    io_threads: 2,
                    sync_window_bytes: 64 << 10,
                    ..engine::ArrayConfig::default()
                },
                ..Default::default()
            },
        )
        .expect("assemble")
    };
    let array = boot(0);
    let mut data = vec![0u8; array.size_bytes() as usize];
    rng.fill(&mut data[..]);
    array.write(0, &data, false).expect("fill");
    let data_offset = created.data_offset_sectors * 512;
    let member_pages = created.component_sectors * 512 / PAGE as u64;
    let draw = |m: &SimDevice, rng: &mut ChaCha8Rng| {
        let pg = rng.gen_range(0..member_pages);
        m.set_unreadable(data_offset + pg * PAGE as u64, PAGE as u64);
    };
    let failed_members = |array: &Array| array.status().missing_roles;

    // Healthy: bad sectors on one member are all corrected.
    let victim = rng.gen_range(0..n);
    for _ in 0..rng.gen_range(1..=3) {
        draw(&members[victim], &mut rng);
    }
    // Mirrors spread reads over the copies: read twice to meet every copy.
    for _ in 0..2 {
        assert_eq!(
            read_pages(&array, &data),
            Vec::<usize>::new(),
            "healthy: no EIO"
        );
    }
    assert_eq!(
        failed_members(&array),
        Vec::<usize>::new(),
        "healthy: no member failed"
    );
    // Copies nobody read (parity, the far copy) may still be unreadable; nothing was lost.

    // Degraded: one member fails, bad sectors appear on the others.
    let gone = rng.gen_range(0..n);
    array.fail_member(&format!("m{gone}")).expect("fail");
    for s in &members {
        s.clear_unreadable();
    }
    let bad = rng.gen_range(1..=2);
    for _ in 0..bad {
        let m = (gone + rng.gen_range(1..n)) % n;
        draw(&members[m], &mut rng);
    }
    let degraded_eio = read_pages(&array, &data);
    assert!(
        degraded_eio.len() <= 3 * bad,
        "{degraded_eio:?} for {bad} bad sectors"
    );
    assert_eq!(failed_members(&array), vec![gone], "the survivors stay");
    if level == Level::Raid6 && bad == 1 {
        assert!(
            degraded_eio.is_empty(),
            "RAID6 rebuilds one bad sector with one member gone"
        );
    }

    // The rebuild onto the spare goes on past what it cannot rebuild.
    for _ in 0..100_000 {
        if array.sync_step() == engine::SyncAction::Idle && failed_members(&array).is_empty() {
            break;
        }
    }
    assert_eq!(
        failed_members(&array),
        Vec::<usize>::new(),
        "the spare is active"
    );
    let rebuilt_eio = read_pages(&array, &data);
    assert_eq!(rebuilt_eio, degraded_eio, "the rebuild loses nothing more");
    // A check passes the recorded pages too, and finds the rest consistent.
    let events = array.subscribe();
    array.request_action("check").expect("check");
    for _ in 0..100_000 {
        if array.sync_step() == engine::SyncAction::Idle {
            break;
        }
    }
    let seen: Vec<engine::Event> = events.try_iter().collect();
    assert!(
        seen.iter().any(|e| e.kind == "check_finished"),
        "{level:?}: {seen:?}"
    );
    assert_eq!(array.sync_status().mismatch_sectors, 0);
    array.close().expect("clean stop");
    let array = boot(1);
    assert_eq!(
        read_pages(&array, &data),
        degraded_eio,
        "the records survive a restart"
    );

    // One full write clears every record.
    rng.fill(&mut data[..]);
    array.write(0, &data, false).expect("full write");
    for _ in 0..2 {
        assert_eq!(
            read_pages(&array, &data),
            Vec::<usize>::new(),
            "after a full write"
        );
    }
    assert!(array.status().members.iter().all(|m| m.bad_sectors == 0));
    array.close().expect("clean stop");
}

#[test]
fn bad_sectors_simulated() {
    testkit::for_each_seed!(
        "bad_sectors_simulated",
        testkit::Seeds::sim(200),
        bad_sector_case
    );
}

#[test]
fn a_member_past_the_read_error_limit_is_failed() {
    // md's max_read_errors (20): the 21st read error fails the member; reads stay right.
    let r = rig(0);
    // Member 0 holds P in a quarter of the rows: 27 of these are data pages a read meets.
    let rows = 36u64;
    for row in 0..rows {
        // Member 0's chunk of every row (data or parity), one page each.
        r.bad_sector(0, row * CHUNK + 2 * PAGE as u64);
    }
    let events = r.array.subscribe();
    assert!(r.eio_pages().is_empty(), "redundancy covers every one");
    let st = r.array.status();
    assert_eq!(st.missing_roles, vec![0], "failed past the limit: {st:?}");
    let m0 = r.member("m0");
    assert_eq!(m0.read_errors, 21, "failed at the 21st");
    assert_eq!(m0.read_errors_corrected, 20);
    assert!(kinds(&events).contains(&"member_faulty"));
}
