//! md's write-intent bitmap on simulated members: bits are durable before the writes they
//! cover, clear only after quiet passes and never while degraded, resync after a crash visits
//! only dirty chunks, and a re-added member recovers only what it missed.

use device::{Device, SimDevice};
use engine::{assemble, Array, ArrayConfig, AssembleOptions, BitmapSpec, CreateSpec, SyncAction};
use layout::Level;
use simkit::devs;
use simkit::settle;
use std::sync::Arc;

const MEMBER: u64 = 16 << 20;
const BITMAP_CHUNK: u64 = 64 << 10;
const WINDOW: u64 = 64 << 10;

fn sims(n: usize, seed: u64) -> Vec<Arc<SimDevice>> {
    (0..n)
        .map(|i| Arc::new(SimDevice::new(format!("sim{i}"), MEMBER, seed + i as u64)))
        .collect()
}

fn config() -> ArrayConfig {
    ArrayConfig {
        deterministic_seed: Some(7),
        sync_window_bytes: WINDOW,
        ..ArrayConfig::default()
    }
}

fn create(level: Level, sims: &[Arc<SimDevice>]) {
    create_with_layout(level, None, sims)
}

fn create_with_layout(level: Level, layout: Option<u32>, sims: &[Arc<SimDevice>]) {
    engine::create(&CreateSpec {
        bitmap: Some(BitmapSpec {
            chunk_bytes: Some(BITMAP_CHUNK),
            cluster: None,
        }),
        ..simkit::clean_spec("bm", level, layout, 64 << 10, devs(sims), vec![])
    })
    .expect("create");
}

fn boot(sims: &[Arc<SimDevice>]) -> Array {
    simkit::reassemble_with(sims, config()).expect("assemble")
}

/// Set bits on `dev`'s bitmap, by chunk index.
fn set_bits(dev: &SimDevice) -> Vec<u64> {
    let (sb, bits) = engine::read_bitmap(dev).expect("bitmap");
    (0..sb.chunks())
        .filter(|&c| format::bit_is_set(&bits, c))
        .collect()
}

/// Run background work to the end on the test's thread.
/// A fresh, clean array with every bit of mdadm's initial all-ones bitmap cleared.
fn quiet_array(level: Level, n: usize) -> (Vec<Arc<SimDevice>>, Array) {
    let s = sims(n, 11);
    create(level, &s);
    let a = boot(&s);
    assert_eq!(
        set_bits(&s[0]).len() as u64,
        a.status().bitmap.unwrap().chunks
    );
    a.bitmap_pass();
    a.bitmap_pass();
    assert!(
        set_bits(&s[0]).is_empty(),
        "idle bits clear after two passes"
    );
    (s, a)
}

#[test]
fn bits_are_durable_before_the_write_and_clear_after_quiet_passes() {
    let (s, a) = quiet_array(Level::Raid5, 4);
    // Member offset 5 * 64 KiB is in stripe row 5; array offset of its first data chunk:
    let row_bytes = 3 * (64 << 10);
    a.write(5 * row_bytes, &vec![0xab; 4096], false).unwrap();
    // Nothing flushed: a power cut now loses the data write's cache, not the bit.
    for d in &s {
        d.power_cut();
    }
    for d in &s {
        assert_eq!(
            set_bits(d),
            vec![5],
            "{}: bit for the written chunk",
            d.name()
        );
    }
    a.bitmap_pass();
    assert_eq!(set_bits(&s[0]), vec![5], "one quiet pass is not enough");
    a.write(5 * row_bytes, &vec![0xcd; 4096], false).unwrap();
    a.bitmap_pass();
    assert_eq!(
        set_bits(&s[0]),
        vec![5],
        "a new write restarts the quiet period"
    );
    a.bitmap_pass();
    assert!(set_bits(&s[0]).is_empty(), "cleared after two quiet passes");
    let st = a.status().bitmap.unwrap();
    assert_eq!(st.dirty_chunks, 0);
    assert_eq!(st.events_cleared, a.status().events);
}

#[test]
fn no_bit_clears_while_degraded() {
    let (s, a) = quiet_array(Level::Raid5, 4);
    a.fail_member("sim1").unwrap();
    a.write(0, &vec![1; 8192], false).unwrap();
    for _ in 0..4 {
        a.bitmap_pass();
    }
    assert_eq!(set_bits(&s[0]), vec![0]);
}

#[test]
fn clean_stop_clears_every_quiet_bit_and_records_events() {
    let (s, a) = quiet_array(Level::Raid6, 5);
    a.write(0, &vec![1; 1 << 20], false).unwrap();
    assert!(!set_bits(&s[2]).is_empty());
    a.close().unwrap();
    let (sb, _) = engine::read_bitmap(s[2].as_ref()).unwrap();
    let md = engine::read_superblock(s[2].as_ref()).unwrap();
    assert!(set_bits(&s[2]).is_empty());
    assert_eq!(
        sb.events, md.events,
        "bitmap header records the superblock's events"
    );
}

#[test]
fn resync_after_a_crash_visits_only_dirty_chunks() {
    let (s, a) = quiet_array(Level::Raid5, 4);
    let row_bytes = 3 * (64 << 10);
    for row in [3u64, 100, 200] {
        a.write(row * row_bytes, &vec![row as u8; 8192], false)
            .unwrap();
    }
    drop(a); // no clean stop: the array stays "active"
    for d in &s {
        d.power_cut();
    }
    let reads_before: u64 = s.iter().map(|d| d.stats().reads).sum();
    let a = boot(&s);
    assert!(a.was_dirty_at_assembly());
    settle(&a);
    let reads: u64 = s.iter().map(|d| d.stats().reads).sum::<u64>() - reads_before;
    // Three 64 KiB windows on four members (plus assembly's superblock and bitmap reads),
    // against 256 windows for a full resync.
    assert!(reads < 3 * 4 * 4 + 40, "resync read {reads} times");
    assert_eq!(a.status().sync.last_action, SyncAction::Resync);
    a.request_action("check").unwrap();
    settle(&a);
    assert_eq!(a.status().sync.mismatch_sectors, 0);
}

/// An administrator's full resync on a bitmap array, cut by a power failure part-way: the
/// bitmap-guided resync at the next start still covers what it had not reached. A row far
/// ahead of the cut, made inconsistent behind the array's back, is found and made consistent.
#[test]
fn an_interrupted_full_resync_resumes_over_what_it_had_not_reached() {
    let (s, a) = quiet_array(Level::Raid5, 4);
    let data_offset = engine::read_superblock(s[1].as_ref()).unwrap().data_offset * 512;
    s[1].scribble(data_offset + 200 * (64 << 10), &[0x77; 4096]);
    a.request_action("resync").unwrap();
    for _ in 0..10 {
        assert_eq!(a.sync_step(), SyncAction::Resync);
    }
    drop(a);
    for d in &s {
        d.power_cut();
    }
    let a = boot(&s);
    settle(&a);
    a.request_action("check").unwrap();
    settle(&a);
    assert_eq!(
        a.status().sync.mismatch_sectors,
        0,
        "the resumed resync skipped rows the full resync had not reached"
    );
}

#[test]
fn readd_recovers_only_what_the_member_missed() {
    let (s, a) = quiet_array(Level::Raid5, 4);
    let row_bytes = 3 * (64 << 10);
    a.fail_member("sim2").unwrap();
    a.remove_member("sim2").unwrap();
    let data = vec![0x5a; 16384];
    a.write(40 * row_bytes, &data, false).unwrap();
    let writes_before = s[2].stats().writes;
    a.add_member(s[2].clone() as Arc<dyn Device>, false)
        .unwrap();
    settle(&a);
    let st = a.status();
    assert!(st.missing_roles.is_empty(), "re-added member is in sync");
    let rebuilt = s[2].stats().writes - writes_before;
    // One window of stripes (plus superblock and bitmap writes), not 256.
    assert!(rebuilt < 20, "re-add wrote {rebuilt} times");
    // The member's content is right: check parity, then read with another member left out.
    a.request_action("check").unwrap();
    settle(&a);
    assert_eq!(a.status().sync.mismatch_sectors, 0);
    a.close().unwrap();
    drop(a);
    let without0 = boot(&s[1..]);
    let mut back = vec![0u8; data.len()];
    without0.read(40 * row_bytes, &mut back).unwrap();
    assert!(back == data, "data rebuilt onto the re-added member");
}

/// RAID10's bitmap holds array bytes while its recovery walks member bytes: a re-added
/// member still recovers only the chunks written while it was away, for near (also wrapping
/// near copies), far and offset layouts.
#[test]
fn readd_recovers_only_what_the_member_missed_raid10() {
    for (layout, n) in [(0x102, 4), (0x102, 3), (0x201, 4), (0x10201, 3)] {
        let s = sims(n, 31);
        create_with_layout(Level::Raid10, Some(layout), &s);
        let a = boot(&s);
        a.bitmap_pass();
        a.bitmap_pass();
        assert!(set_bits(&s[0]).is_empty(), "layout {layout:#x}: quiet");
        a.fail_member("sim1").unwrap();
        a.remove_member("sim1").unwrap();
        // Spread writes: some chunks held by sim1, some not.
        let size = a.status().size_bytes;
        let writes: Vec<(u64, Vec<u8>)> = (0..6u64)
            .map(|i| ((size / 7 * i) / 4096 * 4096, vec![0x40 + i as u8; 12288]))
            .collect();
        for (at, data) in &writes {
            a.write(*at, data, false).unwrap();
        }
        let writes_before = s[1].stats().writes;
        a.add_member(s[1].clone() as Arc<dyn Device>, false)
            .unwrap();
        settle(&a);
        assert!(
            a.status().missing_roles.is_empty(),
            "layout {layout:#x}: in sync"
        );
        let rebuilt = s[1].stats().writes - writes_before;
        // At most the written chunks (two bitmap chunks each) plus metadata writes, not the
        // member's 256 chunks.
        assert!(
            rebuilt < 40,
            "layout {layout:#x}: re-add wrote {rebuilt} times"
        );
        a.request_action("check").unwrap();
        settle(&a);
        assert_eq!(
            a.status().sync.mismatch_sectors,
            0,
            "layout {layout:#x}: copies agree"
        );
        a.close().unwrap();
        drop(a);
        // Every other member left out in turn: what it held is read from its copies,
        // the re-added member among them.
        for gone in (0..n).filter(|&i| i != 1) {
            // Copies, so that each run finds the members as the re-add left them.
            let rest: Vec<_> = (0..n)
                .filter(|&i| i != gone)
                .map(|i| {
                    let copy = SimDevice::new(format!("sim{i}"), MEMBER, 0);
                    copy.scribble(0, &s[i].contents());
                    Arc::new(copy)
                })
                .collect();
            let without = boot(&rest);
            for (at, data) in &writes {
                let mut back = vec![0u8; data.len()];
                without.read(*at, &mut back).unwrap();
                assert!(
                    back == *data,
                    "layout {layout:#x}: sim{gone} left out, bytes at {at} wrong"
                );
            }
            without.close().unwrap();
        }
    }
}

#[test]
fn member_older_than_events_cleared_gets_a_full_rebuild() {
    let (s, a) = quiet_array(Level::Raid5, 4);
    let extra = Arc::new(SimDevice::new("spare", MEMBER, 99));
    a.fail_member("sim2").unwrap();
    a.remove_member("sim2").unwrap();
    a.add_member(extra.clone() as Arc<dyn Device>, false)
        .unwrap();
    settle(&a);
    a.write(0, &vec![3; 4096], false).unwrap();
    a.bitmap_pass();
    a.bitmap_pass();
    assert!(
        a.status().bitmap.unwrap().events_cleared
            > engine::read_superblock(s[2].as_ref()).unwrap().events
    );
    a.fail_member("spare").unwrap();
    a.remove_member("spare").unwrap();
    let writes_before = s[2].stats().writes;
    a.add_member(s[2].clone() as Arc<dyn Device>, false)
        .unwrap();
    settle(&a);
    assert!(a.status().missing_roles.is_empty());
    let rebuilt = s[2].stats().writes - writes_before;
    assert!(
        rebuilt > 200,
        "a stale member must be rebuilt in full ({rebuilt} writes)"
    );
    a.request_action("check").unwrap();
    settle(&a);
    assert_eq!(a.status().sync.mismatch_sectors, 0);
}

/// Writes to many new chunks at once share bitmap writes: while one write-out is on its way,
/// the bits of the writes arriving meanwhile go out together in the next one.
#[test]
fn concurrent_writes_to_new_chunks_share_bitmap_writes() {
    let s = sims(2, 21);
    create(Level::Raid1, &s);
    let a = assemble(
        devs(&s),
        AssembleOptions {
            name: None,
            config: ArrayConfig {
                sync_window_bytes: WINDOW,
                ..ArrayConfig::default()
            },
            force: false,
            ..Default::default()
        },
    )
    .expect("assemble");
    a.bitmap_pass();
    a.bitmap_pass();
    assert!(set_bits(&s[0]).is_empty());
    for d in &s {
        d.set_delay(std::time::Duration::from_millis(5));
    }
    let before = s[0].stats().writes;
    const WRITERS: u64 = 32;
    std::thread::scope(|scope| {
        for i in 0..WRITERS {
            let a = &a;
            scope.spawn(move || a.write(i * BITMAP_CHUNK, &[i as u8; 4096], false).unwrap());
        }
    });
    assert_eq!(set_bits(&s[0]).len() as u64, WRITERS);
    let bitmap_writes = s[0].stats().writes - before - WRITERS;
    assert!(
        bitmap_writes < WRITERS / 2,
        "{bitmap_writes} bitmap writes for {WRITERS} writes to new chunks"
    );
}

const CHUNK: u64 = 64 << 10;
const ROW: u64 = 3 * CHUNK;

/// A RAID5 ×4 whose rows 2 and 5 hold 0x11, restarted after a cut caught a 4 KiB write into
/// row 5 in flight: row 5's bit is set, row 2's clear, nothing resynced yet.
/// Left-symmetric ×4: row r's parity is on member 3 - r % 4, data k on the members after it:
/// row 5 has d0 on sim3, d1 on sim0, d2 on sim1 and P on sim2; row 2 has d2 on sim0.
fn cut_through_row_5() -> (Vec<Arc<SimDevice>>, Array) {
    let (s, a) = quiet_array(Level::Raid5, 4);
    a.write(2 * ROW, &vec![0x11; ROW as usize], false).unwrap();
    a.write(5 * ROW, &vec![0x11; ROW as usize], false).unwrap();
    a.flush().unwrap();
    a.bitmap_pass();
    a.bitmap_pass();
    assert!(set_bits(&s[0]).is_empty());
    a.write(5 * ROW, &[0x22; 4096], false).unwrap();
    for d in &s {
        d.power_cut();
    }
    drop(a);
    let a = boot(&s);
    assert!(a.was_dirty_at_assembly());
    assert_eq!(
        a.status().torn_rows_exposed,
        0,
        "not degraded: nothing exposed"
    );
    (s, a)
}

/// After a cut and before the resync, a member fails (issue 21, item 6). A block that must be
/// rebuilt from a row whose bit is set (a write in flight may have torn it) reads EIO instead
/// of a guess; a block read straight from its member, and a block rebuilt from a row whose bit
/// is clear, read right. Status counts the exposed rows and the refusals, and the failure
/// raises an event naming the risk. Canary: before the refusal the torn row's rebuilt block
/// read back with no error.
#[test]
fn degraded_reads_of_rows_a_cut_may_have_torn_are_refused() {
    let (_s, a) = cut_through_row_5();
    let events = a.subscribe();
    a.fail_member("sim0").unwrap();
    let st = a.status();
    assert!(st.torn_rows_exposed >= 1, "{st:?}");
    let ev: Vec<engine::Event> = events.try_iter().collect();
    assert!(
        ev.iter().any(|e| e.kind == "torn_rows_exposed"),
        "no event names the risk: {ev:?}"
    );
    let mut page = vec![0u8; 4096];
    let refused = a.read(5 * ROW + CHUNK, &mut page);
    assert!(
        refused.is_err(),
        "row 5's d1 was rebuilt from a row the cut may have torn and served"
    );
    assert_eq!(a.status().torn_reads_refused, 1);
    a.read(5 * ROW, &mut page).unwrap();
    assert!(
        page.chunks(512)
            .all(|s| s.iter().all(|&b| b == 0x11) || s.iter().all(|&b| b == 0x22)),
        "d0 of row 5 is read straight from its member: old or new, sector by sector"
    );
    a.read(2 * ROW + 2 * CHUNK, &mut page).unwrap();
    assert!(
        page.iter().all(|&b| b == 0x11),
        "row 2's bit is clear: its rebuilt block is served"
    );
}

/// The torn row of the test above rebuilt onto a spare (issue 21, item 6): the new member gets
/// the lost block recorded bad, not the guess, and so does the row's parity, so the block
/// reads EIO after the rebuild and the resync as before it, and after a restart; the row's
/// other data stays writable, a write of the lost block makes that page whole, and the rest
/// of the array is rebuilt. Canary: before, the rebuild wrote the reconstruction to the spare
/// and it read back with no error.
#[test]
fn a_rebuild_records_blocks_of_rows_a_cut_may_have_torn_as_bad() {
    let (s, a) = cut_through_row_5();
    a.fail_member("sim0").unwrap();
    let spare = Arc::new(SimDevice::new("spare", MEMBER, 99));
    a.add_member(spare.clone() as Arc<dyn Device>, false)
        .unwrap();
    settle(&a);
    let st = a.status();
    assert!(st.missing_roles.is_empty(), "{st:?}");
    let bad = |name: &str| {
        a.status()
            .members
            .iter()
            .find(|m| m.name == name)
            .map_or(0, |m| m.bad_sectors)
    };
    assert_eq!(
        bad("spare"),
        CHUNK / 512,
        "row 5's d1 recorded bad on the spare"
    );
    assert_eq!(bad("sim2"), CHUNK / 512, "row 5's parity recorded bad");
    let lost = 5 * ROW + CHUNK;
    let mut page = vec![0u8; 4096];
    assert!(
        a.read(lost, &mut page).is_err(),
        "row 5's d1 was rebuilt from a row the cut may have torn and served"
    );
    for _ in 0..25 {
        assert!(a.read(lost, &mut page).is_err());
    }
    assert!(
        a.status().missing_roles.is_empty(),
        "reads of recorded blocks are not new read errors: no member fails for them"
    );
    a.read(2 * ROW + 2 * CHUNK, &mut page).unwrap();
    assert!(page.iter().all(|&b| b == 0x11), "row 2's d2 rebuilt");
    let sibling = 5 * ROW + 2 * CHUNK;
    a.write(sibling, &[0x33; 4096], false).unwrap();
    a.read(sibling, &mut page).unwrap();
    assert!(page.iter().all(|&b| b == 0x33), "row 5's d2 stays writable");
    a.write(lost, &[0x44; 4096], false).unwrap();
    a.read(lost, &mut page).unwrap();
    assert!(
        page.iter().all(|&b| b == 0x44),
        "a written block reads back"
    );
    assert!(
        a.read(lost + 4096, &mut page).is_err(),
        "the rest of the lost block still reads EIO"
    );
    a.request_action("check").unwrap();
    settle(&a);
    assert_eq!(a.status().sync.mismatch_sectors, 0);
    a.close().unwrap();
    drop(a);
    let members = vec![s[3].clone(), spare, s[1].clone(), s[2].clone()];
    let a = boot(&members);
    assert!(
        a.read(lost + 4096, &mut page).is_err(),
        "the records outlive a restart"
    );
    a.read(lost, &mut page).unwrap();
    assert!(page.iter().all(|&b| b == 0x44));
}
