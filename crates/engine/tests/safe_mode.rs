//! md's safe mode: an array idle for 200 ms is recorded clean, so a crash while idle costs no
//! resync; the next write records "active" again before it goes out.

use device::SimDevice;
use engine::{assemble, Array, ArrayConfig, AssembleOptions, ManualClock};
use layout::Level;
use simkit::devs;
use std::sync::Arc;
use std::time::Duration;

fn boot(sims: &[Arc<SimDevice>], clock: &Arc<ManualClock>) -> Array {
    assemble(
        devs(sims),
        AssembleOptions {
            name: None,
            config: ArrayConfig {
                deterministic_seed: Some(5),
                clock: Some(clock.clone()),
                ..ArrayConfig::default()
            },
            force: false,
            ..Default::default()
        },
    )
    .expect("assemble")
}

fn sb_clean(s: &SimDevice) -> bool {
    engine::read_superblock(s).unwrap().is_clean()
}

#[test]
fn an_idle_array_is_recorded_clean_and_a_crash_then_needs_no_resync() {
    let sims: Vec<Arc<SimDevice>> = (0..4)
        .map(|i| Arc::new(SimDevice::new(format!("sim{i}"), 8 << 20, 60 + i)))
        .collect();
    simkit::create_clean("safe", Level::Raid5, None, 64 << 10, devs(&sims), vec![]);
    let clock = Arc::new(ManualClock::default());
    let a = boot(&sims, &clock);
    a.write(0, &[7u8; 65536], false).unwrap();
    assert!(!sb_clean(&sims[0]), "active while written");
    clock.advance(Duration::from_millis(100));
    a.sync_step();
    assert!(!sb_clean(&sims[0]), "not clean before 200 ms of quiet");
    clock.advance(Duration::from_millis(150));
    a.sync_step();
    assert!(sb_clean(&sims[0]), "clean after 200 ms of quiet");
    assert!(!a.status().dirty);
    // The next write records "active" before its data goes out.
    a.write(65536 * 3, &[8u8; 4096], false).unwrap();
    assert!(!sb_clean(&sims[1]));
    clock.advance(Duration::from_millis(300));
    a.sync_step();
    drop(a);
    for s in &sims {
        s.power_cut();
    }
    let a = boot(&sims, &clock);
    assert!(
        !a.was_dirty_at_assembly(),
        "idle at the crash: nothing to resync"
    );
    let mut back = vec![0u8; 4096];
    a.read(65536 * 3, &mut back).unwrap();
    assert!(
        back.iter().all(|&b| b == 8),
        "flushed before it was recorded clean"
    );
}
