//! The cluster seam: every superblock update is bracketed by the coordinator, member adds and
//! removes are put to its vote, background windows are announced to it, and client writes wait
//! while it says another node resyncs their range. A recording coordinator stands in for the
//! other nodes (the real one, over etcd, is the cluster issue's).

use device::{Device, SimDevice};
use engine::cluster::{Coordinator, SyncKind};
use engine::{
    assemble, Array, ArrayConfig, AssembleOptions, Clock, EngineError, ManualClock, SyncAction,
};
use layout::Level;
use parking_lot::Mutex;
use simkit::devs;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

#[derive(Debug, Default)]
struct Recording {
    slot: usize,
    starts: AtomicU64,
    finished_events: Mutex<Vec<u64>>,
    windows: Mutex<Vec<(SyncKind, Range<u64>)>>,
    walks_ended: AtomicU64,
    /// `area_resyncing` answers "yes" this many more times.
    busy_answers: AtomicU64,
    consulted: AtomicU64,
    veto: bool,
    removals: Mutex<Vec<u32>>,
    /// Member writes are refused while this is set (a fenced node).
    refusal: Mutex<Option<String>>,
    /// Other nodes write the superblocks too.
    shared: bool,
    /// Members reported failed, by device number.
    failed_members: Mutex<Vec<u32>>,
    /// Background windows are refused while this is set.
    sync_refused: Mutex<Option<String>>,
}

impl Coordinator for Recording {
    fn slot_number(&self) -> usize {
        self.slot
    }

    fn write_refusal(&self) -> Option<String> {
        self.refusal.lock().clone()
    }

    fn shares_metadata(&self) -> bool {
        self.shared
    }

    fn member_failed(&self, dev_number: u32) {
        self.failed_members.lock().push(dev_number);
    }

    fn sync_refusal(&self) -> Option<String> {
        self.sync_refused.lock().clone()
    }

    fn recovery_allowed(&self) -> bool {
        self.sync_refused.lock().is_none()
    }

    fn recovery_starts(&self) -> bool {
        self.recovery_allowed()
    }

    fn recovery_paused(&self) {}

    fn metadata_update_start(&self) {
        self.starts.fetch_add(1, Ordering::SeqCst);
    }

    fn metadata_update_finish(&self, events: u64) {
        self.finished_events.lock().push(events);
    }

    fn area_resyncing(&self, _range: Range<u64>) -> bool {
        self.consulted.fetch_add(1, Ordering::SeqCst);
        self.busy_answers
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
    }

    fn resync_info_update(&self, kind: SyncKind, range: Range<u64>) {
        self.windows.lock().push((kind, range));
    }

    fn resync_finish(&self) {
        self.walks_ended.fetch_add(1, Ordering::SeqCst);
    }

    fn add_new_disk(&self, _device_uuid: [u8; 16]) -> engine::Result<()> {
        if self.veto {
            return Err(EngineError::Busy("node b refuses the new member".into()));
        }
        Ok(())
    }

    fn remove_disk(&self, dev_number: u32) -> engine::Result<()> {
        self.removals.lock().push(dev_number);
        Ok(())
    }
}

const MEMBER: u64 = 8 << 20;

fn sims(n: usize, seed: u64) -> Vec<Arc<SimDevice>> {
    (0..n as u64)
        .map(|i| Arc::new(SimDevice::new(format!("sim{i}"), MEMBER, seed + i)))
        .collect()
}

fn boot(sims: &[Arc<SimDevice>], coord: &Arc<Recording>, clock: &Arc<ManualClock>) -> Array {
    assemble(
        devs(sims),
        AssembleOptions {
            config: ArrayConfig {
                deterministic_seed: Some(9),
                clock: Some(clock.clone()),
                coordinator: Some(coord.clone()),
                ..ArrayConfig::default()
            },
            ..Default::default()
        },
    )
    .expect("assemble")
}

fn run_background(a: &Array) {
    for _ in 0..100_000 {
        if a.sync_step() == SyncAction::Idle && a.sync_status().action == SyncAction::Idle {
            return;
        }
    }
    panic!("background work did not finish");
}

#[test]
fn every_superblock_update_is_bracketed_and_a_rebuild_announces_its_windows() {
    let sims = sims(5, 40);
    simkit::create_clean(
        "coord",
        Level::Raid5,
        None,
        64 << 10,
        devs(&sims[..4]),
        vec![],
    );
    let coord = Arc::new(Recording::default());
    let clock = Arc::new(ManualClock::default());
    let a = boot(&sims[..4], &coord, &clock);
    a.write(0, &[3u8; 1 << 20], true).unwrap();
    let after_write = coord.finished_events.lock().clone();
    assert!(!after_write.is_empty(), "going active is a metadata update");
    a.fail_member("sim2").unwrap();
    a.add_member(sims[4].clone() as Arc<dyn Device>, false)
        .unwrap();
    run_background(&a);
    let finished = coord.finished_events.lock().clone();
    assert_eq!(
        coord.starts.load(Ordering::SeqCst),
        finished.len() as u64,
        "every update begun is finished"
    );
    assert!(finished.windows(2).all(|w| w[0] < w[1]), "{finished:?}");
    let on_disk = engine::read_superblock(sims[0].as_ref()).unwrap().events;
    assert_eq!(
        finished.last().copied(),
        Some(on_disk),
        "the last update finished is what the superblocks say"
    );
    let windows = coord.windows.lock().clone();
    let recovery: Vec<_> = windows
        .iter()
        .filter(|(k, _)| matches!(k, SyncKind::Recovery { .. }))
        .map(|(_, r)| r.clone())
        .collect();
    assert!(!recovery.is_empty(), "the rebuild announced no window");
    assert_eq!(recovery[0].start, 0);
    assert!(
        recovery.windows(2).all(|w| w[0].start < w[1].start),
        "windows go forward: {recovery:?}"
    );
    assert!(coord.walks_ended.load(Ordering::SeqCst) >= 1);
    let mut back = vec![0u8; 1 << 20];
    a.read(0, &mut back).unwrap();
    assert!(back.iter().all(|&b| b == 3));
}

#[test]
fn a_member_the_cluster_refuses_is_not_written_and_removals_are_put_to_the_vote() {
    let sims = sims(5, 50);
    simkit::create_clean(
        "coord",
        Level::Raid1,
        None,
        64 << 10,
        devs(&sims[..3]),
        vec![],
    );
    let coord = Arc::new(Recording {
        veto: true,
        ..Recording::default()
    });
    let clock = Arc::new(ManualClock::default());
    let a = boot(&sims[..3], &coord, &clock);
    let err = a
        .add_member(sims[4].clone() as Arc<dyn Device>, false)
        .unwrap_err();
    assert!(matches!(err, EngineError::Busy(_)), "{err}");
    assert!(
        engine::read_superblock(sims[4].as_ref()).is_err(),
        "a refused member gets no superblock"
    );
    assert_eq!(a.status().members.len(), 3);
    a.fail_member("sim1").unwrap();
    a.remove_member("sim1").unwrap();
    assert_eq!(*coord.removals.lock(), vec![1]);
}

#[test]
fn a_write_waits_while_another_node_resyncs_its_range() {
    let sims = sims(3, 60);
    simkit::create_clean("coord", Level::Raid1, None, 64 << 10, devs(&sims), vec![]);
    let coord = Arc::new(Recording::default());
    let clock = Arc::new(ManualClock::default());
    let a = boot(&sims, &coord, &clock);
    coord.busy_answers.store(3, Ordering::SeqCst);
    let before = clock.now();
    a.write(4096, &[9u8; 4096], false).unwrap();
    assert_eq!(
        coord.consulted.load(Ordering::SeqCst),
        4,
        "asked until free"
    );
    assert!(clock.now() > before, "it waited on the engine's clock");
    let mut back = vec![0u8; 4096];
    a.read(4096, &mut back).unwrap();
    assert!(back.iter().all(|&b| b == 9));
}

#[test]
fn a_node_slot_the_bitmap_does_not_have_is_refused_at_assembly() {
    let sims = sims(3, 70);
    let spec = engine::CreateSpec {
        bitmap: Some(engine::BitmapSpec::default()),
        ..simkit::clean_spec("coord", Level::Raid1, None, 64 << 10, devs(&sims), vec![])
    };
    engine::create(&spec).expect("create");
    let clock = Arc::new(ManualClock::default());
    let second = Arc::new(Recording {
        slot: 1,
        ..Recording::default()
    });
    let err = assemble(
        devs(&sims),
        AssembleOptions {
            config: ArrayConfig {
                clock: Some(clock.clone()),
                coordinator: Some(second),
                ..ArrayConfig::default()
            },
            ..Default::default()
        },
    )
    .err()
    .expect("slot 1 of a one-bitmap array");
    assert!(matches!(err, EngineError::Unsupported(_)), "{err}");
    assert!(err.to_string().contains("slot 1"), "{err}");
    // Slot 0 (the node alone) assembles the same array.
    let first = Arc::new(Recording::default());
    boot(&sims, &first, &clock);
}

#[test]
fn assembly_records_a_changed_role_table_inside_the_brackets() {
    let sims = sims(4, 80);
    simkit::create_clean("coord", Level::Raid5, None, 64 << 10, devs(&sims), vec![]);
    let clock = Arc::new(ManualClock::default());
    // Without one member: assembly records the role table before anything else happens.
    let coord = Arc::new(Recording::default());
    let a = boot(&sims[..3], &coord, &clock);
    let finished = coord.finished_events.lock().clone();
    assert_eq!(coord.starts.load(Ordering::SeqCst), finished.len() as u64);
    let on_disk = engine::read_superblock(sims[0].as_ref()).unwrap().events;
    assert_eq!(finished.first().copied(), Some(on_disk), "{finished:?}");
    drop(a);
}

#[test]
fn a_node_the_coordinator_fences_writes_nothing_to_the_members() {
    let sims = sims(3, 70);
    simkit::create_clean("fence", Level::Raid1, None, 0, devs(&sims[..2]), vec![]);
    let coord = Arc::new(Recording::default());
    let clock = Arc::new(ManualClock::default());
    let a = boot(&sims[..2], &coord, &clock);
    a.write(0, &[1u8; 4096], true).unwrap();
    *coord.refusal.lock() = Some("lease lost".into());
    let writes: u64 = sims.iter().map(|s| s.stats().writes).sum();
    let err = a.write(0, &[2u8; 4096], true).unwrap_err();
    assert!(err.to_string().contains("lease lost"), "{err}");
    // Nor a superblock: a failure stays in memory.
    a.fail_member("sim1").unwrap();
    a.bitmap_pass();
    assert_eq!(
        sims.iter().map(|s| s.stats().writes).sum::<u64>(),
        writes,
        "no member write after the fence"
    );
    let mut back = [0u8; 4096];
    a.read(0, &mut back).unwrap();
    assert_eq!(back, [1u8; 4096], "reads still serve what was written");
    *coord.refusal.lock() = None;
    a.write(0, &[3u8; 4096], true).unwrap();
    assert!(
        sims.iter().map(|s| s.stats().writes).sum::<u64>() > writes,
        "the canary: writes go out again"
    );
}

/// Three superblock commits or more: fail, remove and add back the member on `sim`.
fn churn(a: &Array, sim: &Arc<SimDevice>) {
    a.fail_member(sim.name()).unwrap();
    a.remove_member(sim.name()).unwrap();
    a.add_member(sim.clone() as Arc<dyn Device>, true).unwrap();
}

fn events_on(sims: &[Arc<SimDevice>]) -> Vec<u64> {
    sims.iter()
        .map(|s| engine::read_superblock(s.as_ref()).unwrap().events)
        .collect()
}

#[test]
fn nodes_sharing_the_superblocks_never_write_an_event_count_behind_the_members() {
    let sims = sims(3, 90);
    simkit::create_clean("share", Level::Raid1, None, 0, devs(&sims), vec![]);
    let clock = Arc::new(ManualClock::default());
    let coord_a = Arc::new(Recording {
        shared: true,
        ..Recording::default()
    });
    let coord_b = Arc::new(Recording {
        shared: true,
        ..Recording::default()
    });
    let a = boot(&sims, &coord_a, &clock);
    let b = boot(&sims, &coord_b, &clock);
    // Node a commits several times (a failure, a removal, a re-add).
    a.write(0, &[1u8; 4096], true).unwrap();
    churn(&a, &sims[2]);
    let after_a = *events_on(&sims).iter().max().unwrap();
    // Node b's next commit goes on from there, not from what b itself last wrote.
    b.write(8192, &[7u8; 4096], true).unwrap();
    let after_b = events_on(&sims);
    assert!(
        after_b.iter().all(|&e| e > after_a),
        "{after_b:?} after {after_a}"
    );
    // A node alone (the canary) goes on from its own count and writes one behind the members.
    let alone = Arc::new(Recording::default());
    let sims2 = self::sims(3, 95);
    simkit::create_clean("alone", Level::Raid1, None, 0, devs(&sims2), vec![]);
    let c = boot(&sims2, &alone, &clock);
    let d = boot(&sims2, &Arc::new(Recording::default()), &clock);
    c.write(0, &[1u8; 4096], true).unwrap();
    churn(&c, &sims2[2]);
    let after_c = *events_on(&sims2).iter().max().unwrap();
    d.write(8192, &[7u8; 4096], true).unwrap();
    assert!(
        events_on(&sims2).iter().all(|&e| e < after_c),
        "without sharing, d writes a count behind c's"
    );
}

#[test]
fn a_failure_is_reported_to_the_coordinator_and_background_work_waits_for_its_leave() {
    let sims = sims(4, 100);
    simkit::create_clean("fail", Level::Raid1, None, 0, devs(&sims[..3]), vec![]);
    let coord = Arc::new(Recording {
        sync_refused: Mutex::new(Some("another node is active".into())),
        ..Recording::default()
    });
    let clock = Arc::new(ManualClock::default());
    let a = boot(&sims[..3], &coord, &clock);
    a.fail_member("sim1").unwrap();
    assert_eq!(*coord.failed_members.lock(), vec![1]);
    a.add_member(sims[3].clone() as Arc<dyn Device>, false)
        .unwrap();
    for _ in 0..10 {
        assert_eq!(a.sync_step(), SyncAction::Idle, "no rebuild while refused");
    }
    assert!(!a.status().missing_roles.is_empty());
    *coord.sync_refused.lock() = None;
    run_background(&a);
    assert!(a.status().missing_roles.is_empty(), "rebuilt once allowed");
}

/// Reads of a RAID1 ×3 with `read_primary` (the seed paper's primary copy) or spread.
fn reads_per_member(read_primary: bool) -> Vec<u64> {
    let sims = sims(3, 110);
    simkit::create_clean("primary", Level::Raid1, None, 0, devs(&sims), vec![]);
    let a = assemble(
        devs(&sims),
        AssembleOptions {
            config: ArrayConfig {
                read_primary,
                ..ArrayConfig::default()
            },
            ..Default::default()
        },
    )
    .expect("assemble");
    let before: Vec<u64> = sims.iter().map(|s| s.stats().reads).collect();
    let mut buf = vec![0u8; 4096];
    for i in 0..30 {
        a.read(i * 4096, &mut buf).unwrap();
    }
    sims.iter()
        .zip(before)
        .map(|(s, b)| s.stats().reads - b)
        .collect()
}

#[test]
fn a_primary_copy_array_reads_only_its_first_mirror() {
    let primary = reads_per_member(true);
    assert!(
        primary[0] >= 30 && primary[1] == 0 && primary[2] == 0,
        "{primary:?}"
    );
    // The canary: spread reads use every mirror.
    let spread = reads_per_member(false);
    assert!(spread.iter().all(|&r| r > 0), "{spread:?}");
}
