//! Used-region tracking on simulated members: new arrays start unused (no initial sync), a
//! write marks its region used before it goes out, write-zeroes releases whole regions (zero
//! on every member), rebuild and check skip unused regions, and a map the superblocks have
//! moved past counts as all used.

use device::{Device, SimDevice};
use engine::{assemble, Array, ArrayConfig, AssembleOptions, CreateSpec};
use layout::Level;
use simkit::devs;
use simkit::settle;
use std::sync::Arc;

const MEMBER: u64 = 16 << 20;
const CHUNK: u64 = 64 << 10;
const REGION: u64 = 1 << 20;
/// Array bytes of one region of a RAID5 ×4: 16 rows of 3 data chunks.
const REGION_ARRAY: u64 = 3 * REGION;

fn sims(n: usize) -> Vec<Arc<SimDevice>> {
    (0..n)
        .map(|i| Arc::new(SimDevice::new(format!("sim{i}"), MEMBER, 40 + i as u64)))
        .collect()
}

fn boot(sims: &[Arc<SimDevice>]) -> Array {
    assemble(
        devs(sims),
        AssembleOptions {
            name: None,
            config: ArrayConfig {
                deterministic_seed: Some(3),
                sync_window_bytes: CHUNK,
                ..ArrayConfig::default()
            },
            force: false,
            ..Default::default()
        },
    )
    .expect("assemble")
}

/// A RAID5 ×4 created the way the CLI does on files: members discarded, needing initial sync.
fn fresh() -> (Vec<Arc<SimDevice>>, Array) {
    fresh_array(Level::Raid5, None, 4)
}

fn fresh_array(level: Level, layout: Option<u32>, n: usize) -> (Vec<Arc<SimDevice>>, Array) {
    let s = sims(n);
    for d in &s {
        d.scribble(8 << 20, &[0xee; 4096]); // garbage a discard must clear
    }
    engine::create(&CreateSpec {
        assume_clean: false,
        discard: true,
        ..simkit::clean_spec("used", level, layout, CHUNK, devs(&s), vec![])
    })
    .expect("create");
    let a = boot(&s);
    (s, a)
}

fn used(a: &Array) -> u64 {
    a.status().used_regions.expect("a used-region map").used
}

fn reads(s: &[Arc<SimDevice>]) -> u64 {
    s.iter().map(|d| d.stats().reads).sum()
}

#[test]
fn a_new_array_needs_no_initial_sync() {
    let (s, a) = fresh();
    let st = a.status();
    let map = st.used_regions.clone().unwrap();
    assert_eq!((map.region_bytes, map.used), (REGION, 0));
    assert!(
        a.was_dirty_at_assembly(),
        "create asked for an initial sync"
    );
    let before = reads(&s);
    settle(&a);
    assert!(
        reads(&s) - before < 10,
        "the initial sync read unused regions"
    );
    assert!(!a.status().dirty);
    let mut buf = vec![1u8; 4096];
    a.read(a.size_bytes() / 2, &mut buf).unwrap();
    assert!(buf.iter().all(|&b| b == 0), "unused regions read as zeroes");
}

#[test]
fn a_write_marks_its_region_used_before_it_goes_out() {
    let (s, a) = fresh();
    a.write(5 * REGION_ARRAY + 4096, &[7u8; 8192], false)
        .unwrap();
    assert_eq!(used(&a), 1);
    drop(a);
    for d in &s {
        d.power_cut(); // the data may be lost; the map entry may not
    }
    let a = boot(&s);
    assert_eq!(used(&a), 1);
}

#[test]
fn write_zeroes_releases_whole_regions_and_keeps_parity() {
    let (s, a) = fresh();
    settle(&a);
    let data: Vec<u8> = (0..6 * REGION_ARRAY).map(|i| (i % 251) as u8).collect();
    a.write(0, &data, false).unwrap();
    assert_eq!(used(&a), 6);
    // Regions 2 and 3 whole, plus part of region 1 and of region 4 (written as zeroes).
    let (from, to) = (REGION_ARRAY + 4096, 4 * REGION_ARRAY + 8192);
    a.write_zeroes(from, to - from, false, true).unwrap();
    assert_eq!(used(&a), 4);
    let mut back = vec![0u8; data.len()];
    a.read(0, &mut back).unwrap();
    for (i, (&got, &wrote)) in back.iter().zip(&data).enumerate() {
        let want = if (from..to).contains(&(i as u64)) {
            0
        } else {
            wrote
        };
        assert_eq!(got, want, "byte {i}");
    }
    for d in &s {
        let sb = engine::read_superblock(d.as_ref()).unwrap();
        let at = (sb.data_offset * 512 + 2 * REGION) as usize;
        assert!(
            d.contents()[at..at + 2 * REGION as usize]
                .iter()
                .all(|&b| b == 0),
            "{}: released regions are zero on the member",
            d.name()
        );
    }
    a.request_action("check").unwrap();
    settle(&a);
    assert_eq!(a.status().sync.mismatch_sectors, 0);
    // A trim of part of a region releases nothing and changes nothing.
    a.trim(0, REGION_ARRAY / 2).unwrap();
    assert_eq!(used(&a), 4);
    a.read(0, &mut back[..4096]).unwrap();
    assert_eq!(&back[..4096], &data[..4096]);
}

#[test]
fn rebuild_reads_only_used_regions() {
    let (s, a) = fresh();
    settle(&a);
    a.write(
        2 * REGION_ARRAY,
        &vec![9u8; 2 * REGION_ARRAY as usize],
        false,
    )
    .unwrap();
    a.fail_member("sim1").unwrap();
    let spare = Arc::new(SimDevice::new("spare", MEMBER, 77));
    spare.scribble(10 << 20, &[0xaa; 4096]); // garbage in an unused region of the spare
    a.add_member(spare.clone() as Arc<dyn Device>, false)
        .unwrap();
    let before = reads(&s);
    settle(&a);
    assert!(a.status().missing_roles.is_empty());
    let rebuild_reads = reads(&s) - before;
    // Two 1 MiB regions in 64 KiB windows on three survivors: ~96 reads; all 16 MiB: ~768.
    assert!(rebuild_reads < 150, "rebuild read {rebuild_reads} times");
    a.close().unwrap();
    drop(a);
    // Without another member: everything (written and unused) reads right off the spare.
    let without = boot(&[s[0].clone(), spare.clone(), s[2].clone()]);
    let mut back = vec![1u8; without.size_bytes() as usize];
    without.read(0, &mut back).unwrap();
    for (i, b) in back.iter().enumerate() {
        let i = i as u64;
        let want = if (2 * REGION_ARRAY..4 * REGION_ARRAY).contains(&i) {
            9
        } else {
            0
        };
        assert_eq!(*b, want, "byte {i} after the rebuild");
    }
}

/// A spare added before a region was first written gets the map's bit commits only once it
/// takes a role. Rebuilt, then left as the only member after a crash, it must still know the
/// region is used: its copy of the map is made whole before it counts as in sync (seed
/// 12653980 of crash_raid1_bitmap_with_failures_and_rebuilds read zeroes here).
#[test]
fn a_spare_that_was_added_before_a_write_carries_the_whole_map_once_rebuilt() {
    let (s, a) = fresh_array(Level::Raid1, None, 2);
    settle(&a);
    let spare = Arc::new(SimDevice::new("spare", MEMBER, 78));
    a.add_member(spare.clone() as Arc<dyn Device>, false)
        .unwrap();
    a.write(3 * REGION, &vec![7u8; 8192], false).unwrap();
    a.flush().unwrap();
    a.fail_member("sim1").unwrap();
    settle(&a);
    assert!(
        a.status().missing_roles.is_empty(),
        "rebuilt onto the spare"
    );
    a.fail_member("sim0").unwrap();
    drop(a);
    for d in s.iter().chain([&spare]) {
        d.power_cut();
    }
    let alone = boot(std::slice::from_ref(&spare));
    let mut back = vec![0u8; 8192];
    alone.read(3 * REGION, &mut back).unwrap();
    assert!(
        back.iter().all(|&b| b == 7),
        "the write reads back off the spare"
    );
}

/// A fresh array with one page written, stopped cleanly: its members.
fn stopped_with_one_page() -> Vec<Arc<SimDevice>> {
    let (s, a) = fresh();
    a.write(0, &[1u8; 4096], false).unwrap();
    a.close().unwrap();
    drop(a);
    s
}

/// Starting the array again finds its map untrusted: every region counts as used.
fn map_counts_as_all_used(s: &[Arc<SimDevice>], why: &str) {
    let a = boot(s);
    let map = a.status().used_regions.unwrap();
    assert_eq!(map.used, map.regions, "{why}");
}

/// Rewrite every member's map header with `edit`.
fn edit_map_headers(
    s: &[Arc<SimDevice>],
    edit: impl Fn(&mut format::UsedMapHeader, &format::Superblock),
) {
    for d in s {
        let sb = engine::read_superblock(d.as_ref()).unwrap();
        let base = format::used_map_offset_sectors(&sb) * 512;
        let mut page = device::AlignedBuf::zeroed(4096);
        d.read_at(&mut page, base).unwrap();
        let mut h = format::UsedMapHeader::decode(&page).unwrap();
        edit(&mut h, &sb);
        d.write_at(&device::AlignedBuf::copy_from(&h.encode()), base, true)
            .unwrap();
    }
}

/// Rewrite every member's superblock with `edit`, as another writer of md's format would.
fn edit_superblocks(s: &[Arc<SimDevice>], edit: impl Fn(&mut format::Superblock)) {
    for d in s {
        let mut sb = engine::read_superblock(d.as_ref()).unwrap();
        edit(&mut sb);
        d.write_at(
            &device::AlignedBuf::copy_from(&sb.encode()),
            format::SB_OFFSET_SECTORS * 512,
            true,
        )
        .unwrap();
    }
}

#[test]
fn a_map_behind_the_superblocks_counts_as_all_used() {
    let s = stopped_with_one_page();
    // Someone without the map (the kernel's md) ran the array: events moved on, map did not.
    edit_map_headers(&s, |h, sb| h.events = sb.events - 1);
    map_counts_as_all_used(&s, "a map behind the superblocks was trusted");
}

/// md takes its event count back down when an array goes clean right after going dirty, so
/// a run of the kernel's md can end at the count the map recorded; its superblock writes set a
/// new `utime`, which the map (recording the utime of ours) catches: it counts as all used.
#[test]
fn a_map_whose_superblocks_were_rewritten_at_its_count_counts_as_all_used() {
    let s = stopped_with_one_page();
    // Untouched, the map is trusted.
    let a = boot(&s);
    assert_eq!(a.status().used_regions.unwrap().used, 1);
    a.close().unwrap();
    drop(a);
    edit_superblocks(&s, |sb| sb.utime += 7);
    map_counts_as_all_used(&s, "a rewritten superblock set was trusted");
}

/// A cut between the map's header (written first, at the new count) and the superblocks leaves
/// the map ahead of them; the kernel's md may then have run the array and taken its count back
/// to where it was. Nothing says what md wrote meanwhile: the map counts as all used.
#[test]
fn a_map_ahead_of_the_superblocks_counts_as_all_used() {
    let s = stopped_with_one_page();
    edit_map_headers(&s, |h, sb| h.events = sb.events + 1);
    map_counts_as_all_used(&s, "a map ahead of the superblocks was trusted");
}

/// The kernel's md (or mdadm) writes `utime` in whole seconds. An md run within the same second
/// as ironraid's last superblock write, ending at the map's count, leaves the seconds as they
/// were: only the microseconds ironraid always sets tell it apart.
#[test]
fn superblocks_md_wrote_in_the_same_second_make_the_map_count_as_all_used() {
    let s = stopped_with_one_page();
    edit_superblocks(&s, |sb| {
        assert!(
            !format::written_by_md(sb.utime),
            "ironraid wrote utime {:#x} in whole seconds",
            sb.utime
        );
        sb.utime &= format::MD_TIME_SECS_MASK;
    });
    map_counts_as_all_used(
        &s,
        "superblocks md wrote within the same second were trusted",
    );
}

/// RAID10 keeps its map in array bytes (md's sync coordinates for RAID10) while its rebuild
/// walks member bytes: no initial sync, write-zeroes releases the region on every copy, and a
/// rebuild reads only the copies of used regions, for near (also wrapping), far and offset
/// layouts.
#[test]
fn raid10_tracks_used_regions_and_rebuilds_only_them() {
    for (layout, n) in [(0x102, 4), (0x102, 3), (0x201, 4), (0x10201, 3)] {
        let (s, a) = fresh_array(Level::Raid10, Some(layout), n);
        let region = a
            .status()
            .used_regions
            .expect("a used-region map")
            .region_bytes;
        let before = reads(&s);
        settle(&a);
        assert!(
            reads(&s) - before < 10,
            "{layout:#x}: the initial sync read"
        );
        let data: Vec<u8> = (0..4 * region).map(|i| (i % 253) as u8 + 1).collect();
        a.write(2 * region, &data, false).unwrap();
        assert_eq!(used(&a), 4, "{layout:#x}");
        a.write_zeroes(3 * region, region, false, true).unwrap();
        assert_eq!(used(&a), 3, "{layout:#x}: the zeroed region is released");
        let want = |i: u64| {
            if (2 * region..6 * region).contains(&i) && !(3 * region..4 * region).contains(&i) {
                data[(i - 2 * region) as usize]
            } else {
                0
            }
        };
        a.request_action("check").unwrap();
        settle(&a);
        assert_eq!(
            a.status().sync.mismatch_sectors,
            0,
            "{layout:#x}: copies agree"
        );
        a.fail_member("sim1").unwrap();
        let spare = Arc::new(SimDevice::new("spare", MEMBER, 78));
        spare.scribble(10 << 20, &[0xaa; 4096]); // garbage the rebuild must not leave
        a.add_member(spare.clone() as Arc<dyn Device>, false)
            .unwrap();
        let before = reads(&s);
        settle(&a);
        assert!(a.status().missing_roles.is_empty(), "{layout:#x}");
        let rebuild_reads = reads(&s) - before;
        // Three used regions in 64 KiB windows, against 256 windows for the whole member.
        assert!(
            rebuild_reads < 120,
            "{layout:#x}: rebuild read {rebuild_reads} times"
        );
        a.close().unwrap();
        drop(a);
        let mut members: Vec<Arc<SimDevice>> = s.clone();
        members[1] = spare;
        // Every other member left out in turn (copies, so each boot finds the same state):
        // all of the array reads right, the spare serving its copies.
        for gone in (0..n).filter(|&i| i != 1) {
            let rest: Vec<Arc<SimDevice>> = (0..n)
                .filter(|&i| i != gone)
                .map(|i| {
                    let copy = SimDevice::new(members[i].name(), MEMBER, 0);
                    copy.scribble(0, &members[i].contents());
                    Arc::new(copy)
                })
                .collect();
            let without = boot(&rest);
            let mut back = vec![1u8; without.size_bytes() as usize];
            without.read(0, &mut back).unwrap();
            if let Some(i) = (0..back.len()).find(|&i| back[i] != want(i as u64)) {
                panic!(
                    "{layout:#x}: member {gone} left out: byte {i} is {}",
                    back[i]
                );
            }
            without.close().unwrap();
        }
    }
}

/// Garbage left in an unused region behind the array's back (a member that was not zero, a
/// stray write) is never returned: unused regions read as zeroes without a member read, whole
/// or degraded, and `zero_runs` reports them. RAID1, RAID5, RAID6 and RAID10.
#[test]
fn unused_regions_read_as_zeroes_without_touching_the_members() {
    for (level, layout, n) in [
        (Level::Raid1, None, 2),
        (Level::Raid5, None, 4),
        (Level::Raid6, None, 5),
        (Level::Raid10, Some(0x102), 3),
    ] {
        let (s, a) = fresh_array(level, layout, n);
        settle(&a);
        let data_disks = match level {
            Level::Raid5 => n as u64 - 1,
            Level::Raid6 => n as u64 - 2,
            _ => 1,
        };
        let step = a.status().used_regions.unwrap().region_bytes * data_disks;
        // Garbage under the first 8 MiB of every member's data area; then region 1 is written.
        for d in &s {
            let at = engine::read_superblock(d.as_ref()).unwrap().data_offset * 512;
            d.scribble(at, &vec![0xee; 8 << 20]);
        }
        let data: Vec<u8> = (0..step).map(|i| (i % 249) as u8 + 1).collect();
        a.write(step, &data, false).unwrap();
        assert_eq!(used(&a), 1, "{level:?}");
        let before = reads(&s);
        let mut back = vec![1u8; (2 * step) as usize];
        a.read(2 * step, &mut back).unwrap();
        assert!(
            back.iter().all(|&b| b == 0),
            "{level:?}: an unused region returned what its members hold"
        );
        assert_eq!(reads(&s), before, "{level:?}: unused regions read a member");
        // A read across a used region and unused ones: the data, then zeroes.
        let mut across = vec![1u8; (3 * step) as usize];
        a.read(step, &mut across).unwrap();
        assert_eq!(&across[..step as usize], &data[..], "{level:?}");
        assert!(across[step as usize..].iter().all(|&b| b == 0), "{level:?}");
        assert_eq!(
            a.zero_runs(0, 4 * step),
            vec![(step, true), (step, false), (2 * step, true)],
            "{level:?}"
        );
        // Degraded: still zeroes, and the used region still reads right.
        a.fail_member(s[0].name()).unwrap();
        a.read(step, &mut across).unwrap();
        assert_eq!(&across[..step as usize], &data[..], "{level:?} degraded");
        assert!(
            across[step as usize..].iter().all(|&b| b == 0),
            "{level:?} degraded"
        );
    }
}
