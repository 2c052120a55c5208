//! Rebuild onto spares, resync after power cuts, scrubbing — on simulated members.

use device::{Device, SimDevice};
use engine::{assemble, Array, AssembleOptions, MemberState};
use layout::Level;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use simkit::devs;
use std::sync::Arc;
use std::time::Duration;
use testkit::CrashModel;

fn sims(n: usize, bytes: u64, seed: u64) -> Vec<Arc<SimDevice>> {
    named("sim", n, bytes, seed)
}

fn named(prefix: &str, n: usize, bytes: u64, seed: u64) -> Vec<Arc<SimDevice>> {
    (0..n)
        .map(|i| {
            Arc::new(SimDevice::new(
                format!("{prefix}{i}"),
                bytes,
                seed * 97 + i as u64,
            ))
        })
        .collect()
}

fn make(
    level: Level,
    layout: Option<u32>,
    members: &[Arc<SimDevice>],
    spares: &[Arc<SimDevice>],
    chunk: u64,
) {
    simkit::create_clean("rec", level, layout, chunk, devs(members), devs(spares));
}

fn open(all: &[Arc<SimDevice>]) -> Arc<Array> {
    let a = Arc::new(simkit::reassemble(all).expect("assemble"));
    a.set_sync_speed(None, Some(u64::MAX));
    a.start_background();
    a
}

fn fill(a: &Array, seed: u64) -> Vec<u8> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut data = vec![0u8; a.size_bytes() as usize];
    rng.fill(&mut data[..]);
    a.write(0, &data, false).unwrap();
    data
}

fn read_all(a: &Array) -> Vec<u8> {
    let mut buf = vec![0u8; a.size_bytes() as usize];
    a.read(0, &mut buf).unwrap();
    buf
}

/// After the background work settles: every role in sync and `check` finds nothing.
fn assert_consistent(a: &Array) {
    assert!(
        a.wait_sync_idle(Duration::from_secs(60)),
        "background work did not finish"
    );
    let st = a.status();
    assert!(
        st.missing_roles.is_empty(),
        "roles still missing: {:?}",
        st.missing_roles
    );
    a.request_action("check").unwrap();
    assert!(a.wait_sync_idle(Duration::from_secs(60)));
    assert_eq!(
        a.sync_status().mismatch_sectors,
        0,
        "check found inconsistent stripes"
    );
}

#[test]
fn spare_rebuilds_while_clients_write() {
    for (level, layout, n) in [
        (Level::Raid5, None, 4),
        (Level::Raid6, None, 5),
        (Level::Raid1, None, 2),
        (Level::Raid10, Some(0x102), 4),
        (Level::Raid10, Some(0x201), 4),
        (Level::Raid4, None, 3),
    ] {
        let m = sims(n, 6 << 20, 1);
        let spare = named("spare", 1, 6 << 20, 2);
        make(level, layout, &m, &spare, 64 << 10);
        let all: Vec<_> = m.iter().chain(&spare).cloned().collect();
        let a = open(&all);
        let mut model = fill(&a, 3);
        a.set_sync_speed(None, Some(8 << 20)); // slow enough for writes to race the rebuild
        a.fail_member("sim1").unwrap();
        // Writers during the rebuild: random blocks, remembered in the model.
        let mut rng = ChaCha8Rng::seed_from_u64(4);
        let size = a.size_bytes();
        for _ in 0..200 {
            let len = rng.gen_range(1..64u64) * 512;
            let off = rng.gen_range(0..(size - len) / 512) * 512;
            let data: Vec<u8> = (0..len).map(|_| rng.gen()).collect();
            a.write(off, &data, false).unwrap();
            model[off as usize..(off + len) as usize].copy_from_slice(&data);
            std::thread::sleep(Duration::from_micros(300));
        }
        a.set_sync_speed(None, Some(u64::MAX));
        assert_consistent(&a);
        assert!(
            read_all(&a) == model,
            "{level:?}: data differs after rebuild"
        );
        let st = a.status();
        let spare_state = st
            .members
            .iter()
            .find(|m| m.name == "spare0")
            .map(|m| m.state);
        assert_eq!(
            spare_state,
            Some(MemberState::InSync),
            "{level:?}: spare not in sync: {:?}",
            st.members
        );
        // The superblocks agree: a new assembly has every role and no resync or rebuild to do.
        a.close().unwrap();
        drop(a);
        let survivors: Vec<_> = all
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != 1)
            .map(|(_, s)| s.clone())
            .collect();
        let b = assemble(devs(&survivors), AssembleOptions::default()).unwrap();
        assert!(
            b.status().missing_roles.is_empty(),
            "{level:?}: reassembled array degraded"
        );
        assert!(!b.was_dirty_at_assembly());
    }
}

/// A pass whose windows are larger than the guaranteed minimum lets through in the rate's
/// window of time still goes on while clients keep the array busy: RAID1 works in whole 1 MiB
/// units whatever `sync_window_bytes` says (here 64 KiB), and at 256 KiB/s such a window is
/// more than the minimum gives the three seconds the rate is taken over. Counting the coming
/// window whole, the rate with it stayed above the minimum however long the walk waited, so
/// the walk never went on while the writer wrote (a repair under sixteen writers that never
/// ended). Each action here must end within a bound while the writer writes throughout.
#[test]
fn a_pass_with_windows_larger_than_the_minimum_allows_goes_on_under_writes() {
    const BOUND: Duration = Duration::from_secs(40);
    let m = sims(2, 3 << 20, 41);
    make(Level::Raid1, None, &m, &[], 64 << 10);
    let config = engine::ArrayConfig {
        sync_window_bytes: 64 << 10,
        ..simkit::config()
    };
    let a = Arc::new(simkit::reassemble_with(&m, config).expect("assemble"));
    a.start_background();
    let model = std::sync::Mutex::new(fill(&a, 42));
    a.set_sync_speed(Some(256 << 10), Some(512 << 10));
    for action in ["repair", "check"] {
        let stop = std::sync::atomic::AtomicBool::new(false);
        let took = std::thread::scope(|s| {
            s.spawn(|| {
                let mut rng = ChaCha8Rng::seed_from_u64(43);
                let size = a.size_bytes();
                // A write every millisecond: the array is busy (client I/O in the last 20 ms)
                // for the whole pass, so only the minimum lets it go on.
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let off = rng.gen_range(0..size / 4096) * 4096;
                    let data: Vec<u8> = (0..4096).map(|_| rng.gen()).collect();
                    let mut model = model.lock().unwrap();
                    a.write(off, &data, false).unwrap();
                    model[off as usize..off as usize + 4096].copy_from_slice(&data);
                    drop(model);
                    std::thread::sleep(Duration::from_millis(1));
                }
            });
            let started = std::time::Instant::now();
            a.request_action(action).unwrap();
            let ended = a.wait_sync_idle(BOUND);
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
            ended.then(|| started.elapsed())
        });
        let st = a.sync_status();
        assert!(
            took.is_some(),
            "{action} under writes still at {} of {} bytes after {BOUND:?}",
            st.done_bytes,
            st.total_bytes
        );
        eprintln!(
            "{action} of {} bytes under writes: {took:?}",
            st.total_bytes
        );
    }
    assert_consistent(&a);
    assert!(read_all(&a) == *model.lock().unwrap(), "data differs");
    a.close().unwrap();
}

/// The speed limit holds from a walk's first window. With windows larger than the whole walk
/// (so that nothing but the wait before the first can pace it), a check and a rebuild each
/// take at least the time the limit gives the bytes they read and write; a walk that took its
/// first window at full speed finishes in milliseconds. Every level, copies ones included:
/// they size their windows from the same setting.
#[test]
fn the_speed_limit_holds_from_the_first_window() {
    const MAX: u64 = 4 << 20;
    for (level, n) in [(Level::Raid5, 3), (Level::Raid1, 2), (Level::Raid10, 4)] {
        let m = sims(n, 4 << 20, 21);
        let spare = named("spare", 1, 4 << 20, 22);
        make(level, None, &m, &spare, 64 << 10);
        let all: Vec<_> = m.iter().chain(&spare).cloned().collect();
        let config = engine::ArrayConfig {
            sync_window_bytes: 16 << 20,
            ..simkit::config()
        };
        let a = Arc::new(simkit::reassemble_with(&all, config).expect("assemble"));
        a.set_sync_speed(None, Some(MAX));
        a.start_background();
        fill(&a, 23);
        for action in ["check", "rebuild"] {
            match action {
                "check" => a.request_action("check").unwrap(),
                _ => a.fail_member("sim1").unwrap(),
            }
            assert!(
                a.wait_sync_idle(Duration::from_secs(60)),
                "{level:?} {action}"
            );
            let st = a.sync_status();
            let took = Duration::from_micros(st.last_duration_us);
            let limit = Duration::from_secs_f64(st.total_bytes as f64 / MAX as f64);
            assert!(
                took >= limit,
                "{level:?} {action}: {} bytes in {took:?}, the limit says at least {limit:?}",
                st.total_bytes
            );
        }
        assert!(a.status().missing_roles.is_empty());
        a.close().unwrap();
    }
}

/// `sync_window_bytes` sizes one window of background work on every level: a check and a
/// rebuild take as many windows as the setting divides their walk into (the copies levels
/// once went 1 MiB or one chunk at a time, whatever the setting).
#[test]
fn every_level_sizes_its_windows_from_the_setting() {
    const WINDOW: u64 = 2 << 20;
    for (level, n) in [(Level::Raid5, 3), (Level::Raid1, 2), (Level::Raid10, 4)] {
        let m = sims(n, 8 << 20, 31);
        let spare = named("spare", 1, 8 << 20, 32);
        make(level, None, &m, &spare, 64 << 10);
        let all: Vec<_> = m.iter().chain(&spare).cloned().collect();
        let config = engine::ArrayConfig {
            sync_window_bytes: WINDOW,
            ..simkit::config()
        };
        let a = simkit::reassemble_with(&all, config).expect("assemble");
        fill(&a, 33);
        for action in ["check", "rebuild"] {
            match action {
                "check" => a.request_action("check").unwrap(),
                _ => a.fail_member("sim1").unwrap(),
            }
            let mut windows = 0;
            while a.sync_step() != engine::SyncAction::Idle {
                windows += 1;
            }
            let total = a.sync_status().total_bytes;
            assert_eq!(
                windows,
                total.div_ceil(WINDOW),
                "{level:?} {action}: {total} bytes in {windows} windows of {WINDOW}"
            );
        }
        assert!(a.status().missing_roles.is_empty());
        a.close().unwrap();
    }
}

/// Byte at which the next `rebuild_started` event says the rebuild starts, and the total:
/// its message reads "recover started at byte N of T".
fn rebuild_start(events: &std::sync::mpsc::Receiver<engine::Event>) -> (u64, u64) {
    loop {
        let ev = events
            .recv_timeout(Duration::from_secs(20))
            .expect("no rebuild_started event");
        if ev.kind != "rebuild_started" {
            continue;
        }
        let nums: Vec<u64> = ev
            .message
            .split_once("started at byte ")
            .and_then(|(_, rest)| {
                let (n, t) = rest.split_once(" of ")?;
                Some(vec![n.trim().parse().ok()?, t.trim().parse().ok()?])
            })
            .unwrap_or_else(|| panic!("unexpected rebuild_started message: {ev:?}"));
        return (nums[0], nums[1]);
    }
}

#[test]
fn rebuild_resumes_from_checkpoint_after_stop() {
    let m = sims(4, 16 << 20, 5);
    let spare = named("spare", 1, 16 << 20, 6);
    make(Level::Raid5, None, &m, &spare, 64 << 10);
    let all: Vec<_> = m.iter().chain(&spare).cloned().collect();
    let a = open(&all);
    let model = fill(&a, 7);
    a.set_sync_speed(None, Some(4 << 20));
    // Failed by hand, not by a read that hits the dead member: several reads in flight to it
    // would race the spare's activation (a late error of the old member must not fail the
    // spare that took its role; that race is not what this test is about).
    m[2].set_dead(true);
    a.fail_member("sim2").unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    let st = a.sync_status();
    assert!(st.done_bytes > 0, "rebuild made no progress: {st:?}");
    assert_eq!(
        st.action,
        engine::SyncAction::Recover,
        "rebuild should still be running: {st:?}"
    );
    a.close().unwrap();
    drop(a);
    let survivors: Vec<_> = all
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != 2)
        .map(|(_, s)| s.clone())
        .collect();
    let sb = engine::read_superblock(spare[0].as_ref()).unwrap();
    let checkpoint_bytes = sb.recovery_offset * 512;
    assert!(
        checkpoint_bytes > 0,
        "no recovery checkpoint recorded: {sb:?} after {st:?}"
    );
    // Reassemble, listening before the background work starts, so the rebuild's start is heard.
    let b = Arc::new(
        assemble(
            devs(&survivors),
            AssembleOptions {
                name: None,
                config: simkit::config(),
                ..Default::default()
            },
        )
        .expect("assemble"),
    );
    let events = b.subscribe();
    b.set_sync_speed(None, Some(u64::MAX));
    b.start_background();
    let (from, total) = rebuild_start(&events);
    assert!(
        checkpoint_bytes < total,
        "checkpoint {checkpoint_bytes} is not inside the rebuild (total {total})"
    );
    assert_eq!(
        from, checkpoint_bytes,
        "the rebuild after the restart must start at the checkpoint, not redo the start"
    );
    assert_consistent(&b);
    assert!(read_all(&b) == model);
}

#[test]
fn second_failure_during_raid5_rebuild_fails_cleanly_raid6_carries_on() {
    for (level, n) in [(Level::Raid5, 4), (Level::Raid6, 5)] {
        let m = sims(n, 16 << 20, 8);
        let spare = named("spare", 1, 16 << 20, 9);
        make(level, None, &m, &spare, 64 << 10);
        let all: Vec<_> = m.iter().chain(&spare).cloned().collect();
        let a = open(&all);
        let model = fill(&a, 10);
        a.set_sync_speed(None, Some(4 << 20));
        a.fail_member("sim0").unwrap();
        std::thread::sleep(Duration::from_millis(300));
        a.fail_member("sim1").unwrap();
        if level == Level::Raid5 {
            assert!(
                a.status().failed,
                "RAID5 must fail with two members lost mid-rebuild"
            );
            assert!(
                a.write(0, &[0u8; 4096], false).is_err(),
                "a failed array refuses writes"
            );
            let mut buf = vec![0u8; a.size_bytes() as usize];
            // Reads either fail or return the right bytes, never wrong data.
            if a.read(0, &mut buf).is_ok() {
                assert!(buf == model);
            }
        } else {
            assert!(!a.status().failed);
            a.set_sync_speed(None, Some(u64::MAX));
            assert!(a.wait_sync_idle(Duration::from_secs(60)));
            assert!(read_all(&a) == model);
        }
        a.close().ok();
    }
}

#[test]
fn check_counts_repair_fixes_corruption() {
    for (level, n) in [
        (Level::Raid5, 4),
        (Level::Raid6, 5),
        (Level::Raid1, 3),
        (Level::Raid10, 4),
    ] {
        let m = sims(n, 8 << 20, 11);
        make(level, None, &m, &[], 64 << 10);
        let a = open(&m);
        fill(&a, 12);
        a.request_action("check").unwrap();
        assert!(a.wait_sync_idle(Duration::from_secs(30)));
        assert_eq!(a.sync_status().mismatch_sectors, 0);
        // Corrupt 4 KiB of member 1's data area behind the array's back.
        let off = engine::read_superblock(m[1].as_ref()).unwrap().data_offset * 512 + 3 * 65536;
        m[1].scribble(off, &[0xee; 4096]);
        a.request_action("check").unwrap();
        assert!(a.wait_sync_idle(Duration::from_secs(30)));
        assert_eq!(
            a.sync_status().mismatch_sectors,
            8,
            "{level:?}: check should count one 4 KiB page"
        );
        a.request_action("repair").unwrap();
        assert!(a.wait_sync_idle(Duration::from_secs(30)));
        a.request_action("check").unwrap();
        assert!(a.wait_sync_idle(Duration::from_secs(30)));
        assert_eq!(
            a.sync_status().mismatch_sectors,
            0,
            "{level:?}: repair left mismatches"
        );
        a.close().unwrap();
    }
}

fn crash_case(seed: u64, level: Level, n: usize) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let m = sims(n, 2 << 20, seed);
    make(level, None, &m, &[], 4096 << rng.gen_range(0..3));
    let a = open(&m);
    let size = a.size_bytes() as usize;
    let mut model = CrashModel::new(vec![0u8; size]);
    let steps = rng.gen_range(5..40);
    for _ in 0..steps {
        if rng.gen_bool(0.15) {
            a.flush().unwrap();
            model.flushed();
            continue;
        }
        let len = rng.gen_range(1..=128usize) * 512;
        let off = rng.gen_range(0..=(size - len) / 512) * 512;
        let data: Vec<u8> = (0..len).map(|_| rng.gen()).collect();
        let fua = rng.gen_bool(0.1);
        model.issue(off, &data);
        a.write(off as u64, &data, fua).unwrap();
        model.complete(off, &data, fua);
    }
    // Power cut: no clean stop; unflushed writes survive, vanish or tear.
    drop(a);
    for s in &m {
        s.power_cut();
    }
    let b = open(&m);
    assert!(
        b.was_dirty_at_assembly() || steps == 0,
        "a crashed array must come back dirty"
    );
    assert!(b.wait_sync_idle(Duration::from_secs(60)));
    model
        .check(&read_all(&b))
        .expect("flushed data after the cut");
    b.request_action("check").unwrap();
    assert!(b.wait_sync_idle(Duration::from_secs(60)));
    assert_eq!(
        b.sync_status().mismatch_sectors,
        0,
        "redundancy inconsistent after resync"
    );
    b.close().unwrap();
}

/// The production path (I/O threads, the background thread) after a power cut; the
/// deterministic simulation in `crash_sim.rs` covers far more cases.
#[test]
fn power_cut_then_resync_keeps_flushed_data_and_restores_redundancy() {
    for (level, n) in [
        (Level::Raid5, 4),
        (Level::Raid6, 5),
        (Level::Raid1, 2),
        (Level::Raid10, 4),
        (Level::Raid4, 3),
    ] {
        testkit::for_each_seed!(
            "power_cut_then_resync_keeps_flushed_data_and_restores_redundancy",
            testkit::Seeds::sim(25),
            |seed| crash_case(seed, level, n),
        );
    }
}

#[test]
fn add_and_remove_members() {
    let m = sims(3, 8 << 20, 13);
    make(Level::Raid5, None, &m, &[], 64 << 10);
    let a = open(&m);
    let model = fill(&a, 14);
    a.fail_member("sim2").unwrap();
    assert!(
        a.remove_member("sim0").is_err(),
        "an active member cannot be removed"
    );
    a.remove_member("sim2").unwrap();
    let fresh: Arc<dyn Device> = Arc::new(SimDevice::new("new0", 8 << 20, 15));
    let small: Arc<dyn Device> = Arc::new(SimDevice::new("tiny", 1 << 20, 16));
    assert!(
        a.add_member(small, false).is_err(),
        "too small a spare is refused"
    );
    a.add_member(fresh.clone(), false).unwrap();
    assert_consistent(&a);
    assert!(read_all(&a) == model);
    a.close().unwrap();
    drop(a);
    let mut all: Vec<Arc<dyn Device>> = devs(&m[..2]);
    all.push(fresh);
    let b = assemble(all, AssembleOptions::default()).unwrap();
    assert!(b.status().missing_roles.is_empty());
}
