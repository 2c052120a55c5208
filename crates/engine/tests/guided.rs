//! The `guided` consistency policy: after an unclean stop the array waits for a guide instead
//! of resyncing, reads verify first meanwhile, and it falls back to the bitmap resync when no
//! guide comes in time, when a client writes first, or when told to; a fallback survives a
//! restart until its resync has finished.

use device::{Device, SimDevice};
use engine::{Array, ArrayConfig, AssembleOptions, ManualClock, SyncAction};
use layout::Level;
use std::sync::Arc;
use std::time::Duration;

const CHUNK: u64 = 16 << 10;
/// RAID5 over 4 members: a row holds 3 data chunks.
const ROW: u64 = 3 * CHUNK;
const TIMEOUT: Duration = Duration::from_secs(30);

struct Rig {
    sims: Vec<Arc<SimDevice>>,
    clock: Arc<ManualClock>,
}

impl Rig {
    fn new(seed: u64) -> Rig {
        let sims: Vec<Arc<SimDevice>> = (0..4)
            .map(|i| Arc::new(SimDevice::new(format!("g{i}"), 4 << 20, seed + i)))
            .collect();
        engine::create(&spec(&sims, Level::Raid5, true, true)).expect("create");
        Rig {
            sims,
            clock: Arc::new(ManualClock::default()),
        }
    }

    fn boot(&self) -> Array {
        engine::assemble(
            simkit::devs(&self.sims),
            AssembleOptions {
                config: ArrayConfig {
                    clock: Some(self.clock.clone()),
                    guide_timeout: TIMEOUT,
                    ..simkit::config()
                },
                ..Default::default()
            },
        )
        .expect("assemble")
    }

    /// Write data, make it durable, write part of it again and stop without a clean stop;
    /// then damage the parity of row 2 behind the array's back (a torn write there).
    fn dirty_stop(&self) -> Vec<u8> {
        let array = self.boot();
        let mut data: Vec<u8> = (0..array.size_bytes())
            .map(|i| (i * 7 % 251) as u8)
            .collect();
        array.write(0, &data, false).expect("fill");
        array.flush().expect("flush");
        data[(2 * ROW) as usize..(3 * ROW) as usize].fill(0x5c);
        array
            .write(
                2 * ROW,
                &data[(2 * ROW) as usize..(3 * ROW) as usize],
                false,
            )
            .expect("rewrite row 2");
        drop(array);
        self.damage_parity(2);
        data
    }

    fn damage_parity(&self, row: u64) {
        let array_geometry = self.boot_read_only_array().geometry().clone();
        let p = array_geometry.stripe_roles(row).p_dev();
        let at = engine::read_superblock(self.sims[p].as_ref())
            .expect("sb")
            .data_offset
            * 512
            + row * CHUNK;
        self.sims[p].flip_bit(at + 100, 1);
    }

    fn consistent(&self) -> bool {
        let sa = simkit::SimArray {
            sims: self.sims.clone(),
            array: self.boot_read_only_array(),
            level: Level::Raid5,
            layout: None,
        };
        simkit::redundancy_error(&sa).is_none()
    }

    fn boot_read_only_array(&self) -> Array {
        engine::assemble(
            simkit::devs(&self.sims),
            AssembleOptions {
                config: ArrayConfig {
                    read_only: true,
                    ..simkit::config()
                },
                ..Default::default()
            },
        )
        .expect("assemble read-only")
    }
}

fn spec(sims: &[Arc<SimDevice>], level: Level, bitmap: bool, guided: bool) -> engine::CreateSpec {
    engine::CreateSpec {
        name: "guided".into(),
        level,
        layout: None,
        chunk_bytes: CHUNK,
        members: simkit::devs(sims),
        spares: vec![],
        size_bytes: None,
        assume_clean: true,
        force: false,
        bitmap: bitmap.then_some(engine::BitmapSpec {
            chunk_bytes: Some(64 << 10),
            cluster: None,
        }),
        discard: false,
        journal: None,
        journal_write_back: false,
        integrity: false,
        guided,
    }
}

fn state(a: &Array) -> engine::GuidanceStatus {
    a.status()
        .guidance
        .expect("a guided array reports guidance")
}

/// Run background work until idle; returns the actions that ran.
fn settle(a: &Array, clock: &ManualClock) -> Vec<SyncAction> {
    let mut ran = Vec::new();
    for _ in 0..10_000 {
        clock.advance(Duration::from_millis(250));
        match a.sync_step() {
            SyncAction::Idle => return ran,
            x if ran.last() != Some(&x) => ran.push(x),
            _ => {}
        }
    }
    panic!("background work did not end");
}

#[test]
fn a_dirty_guided_array_waits_for_its_guide_and_reads_verify_first() {
    let rig = Rig::new(1);
    let data = rig.dirty_stop();
    assert!(!rig.consistent(), "canary: the damage shows");
    let array = rig.boot();
    let g = state(&array);
    assert_eq!(g.state, "awaiting", "{g:?}");
    assert!(g.window_bytes > 0, "{g:?}");
    assert_eq!(g.fallback_in_ms, Some(TIMEOUT.as_millis() as u64), "{g:?}");
    assert_eq!(array.status().consistency_policy, "guided");
    // The resync waits for the guide.
    rig.clock.advance(Duration::from_secs(1));
    assert_eq!(array.sync_step(), SyncAction::Idle);

    // A read of the damaged row verifies it first: the parity is rewritten from the data.
    let mut back = vec![0u8; ROW as usize];
    array.read(2 * ROW, &mut back).expect("read");
    assert!(back[..] == data[(2 * ROW) as usize..(3 * ROW) as usize]);
    assert_eq!(state(&array).verified_bytes, ROW);
    drop(array);
    assert!(rig.consistent(), "the read did not verify its row");

    // A guide ends it: no resync runs afterwards, the window closes. (A fresh array: writing
    // to this one now, before a guide, would end its guidance.)
    let rig = Rig::new(11);
    rig.dirty_stop();
    let array = rig.boot();
    rig.clock.advance(Duration::from_secs(3));
    let r = array
        .end_guidance("test", &[(2 * ROW + 512, 1024)])
        .expect("guidance");
    // One 4 KiB page row (the page of each of the 3 data chunks and of P), not the whole row.
    assert_eq!(r.bytes_verified, 3 * 4096);
    assert!(r.mismatch_sectors > 0);
    let g = state(&array);
    assert_eq!((g.state, g.guide.as_deref()), ("guided", Some("test")));
    assert_eq!(g.window_ms, 3000, "{g:?}");
    rig.clock.advance(Duration::from_secs(100));
    assert!(
        settle(&array, &rig.clock).is_empty(),
        "a resync ran after guidance"
    );
    assert_eq!(state(&array).window_ms, 3000, "the window stays closed");
    let e = array.end_guidance("test", &[]).unwrap_err().to_string();
    assert!(e.contains("already ended"), "{e}");
    array.close().expect("clean stop");
    assert!(rig.consistent());
    let array = rig.boot();
    assert_eq!(
        state(&array).state,
        "in_sync",
        "a clean stop leaves nothing to guide"
    );
}

#[test]
fn without_a_guide_in_time_the_bitmap_resync_runs() {
    let rig = Rig::new(2);
    rig.dirty_stop();
    let array = rig.boot();
    rig.clock.advance(TIMEOUT + Duration::from_secs(1));
    let ran = settle(&array, &rig.clock);
    assert_eq!(ran, vec![SyncAction::Resync]);
    let g = state(&array);
    assert_eq!(g.state, "fallback", "{g:?}");
    assert!(g.reason.as_deref().unwrap().contains("timeout"), "{g:?}");
    assert!(g.window_ms > TIMEOUT.as_millis() as u64, "{g:?}");
    drop(array);
    assert!(
        rig.consistent(),
        "the fallback resync missed the damaged row"
    );
}

/// An administrator's full resync that a crash interrupts resumes as a resync at the next
/// start instead of waiting for a guide: a guide names what a file system had in flight, not
/// the rows the resync had not reached yet (one of which is damaged here).
#[test]
fn an_interrupted_full_resync_does_not_wait_for_a_guide() {
    let rig = Rig::new(5);
    let array = rig.boot();
    let data: Vec<u8> = (0..array.size_bytes())
        .map(|i| (i * 3 % 253) as u8)
        .collect();
    array.write(0, &data, false).expect("fill");
    array.close().expect("clean stop");
    let last_row = array.geometry().stripes() - 1;
    drop(array);
    rig.damage_parity(last_row);
    let array = rig.boot();
    assert_eq!(state(&array).state, "in_sync");
    array.request_action("resync").unwrap();
    assert_eq!(array.sync_step(), SyncAction::Resync);
    assert!(
        array.status().sync.done_bytes < last_row * CHUNK,
        "the cut must come before the damaged row"
    );
    drop(array);
    for d in &rig.sims {
        d.power_cut();
    }
    let array = rig.boot();
    let g = state(&array);
    assert_eq!(g.state, "fallback", "waits for a guide: {g:?}");
    assert_eq!(settle(&array, &rig.clock), vec![SyncAction::Resync]);
    drop(array);
    assert!(
        rig.consistent(),
        "the resumed resync missed the damaged row"
    );
    // That resync finished: the next unclean stop waits for a guide again.
    rig.dirty_stop();
    assert_eq!(state(&rig.boot()).state, "awaiting");
}

#[test]
fn a_write_before_any_guide_falls_back_and_a_restart_keeps_it() {
    let rig = Rig::new(3);
    rig.dirty_stop();
    let array = rig.boot();
    array.write(0, &[1u8; 4096], false).expect("write");
    let g = state(&array);
    assert_eq!(g.state, "fallback", "{g:?}");
    assert!(g.reason.as_deref().unwrap().contains("wrote"), "{g:?}");
    let e = array.end_guidance("late", &[]).unwrap_err().to_string();
    assert!(e.contains("fell back"), "{e}");
    // Stopped before the resync ran: the next start resyncs without waiting for a guide.
    drop(array);
    let array = rig.boot();
    let g = state(&array);
    assert_eq!(g.state, "fallback", "the fallback was not recorded: {g:?}");
    assert_eq!(settle(&array, &rig.clock), vec![SyncAction::Resync]);
    drop(array);
    assert!(rig.consistent());
    // Once that resync finished, the next unclean stop waits for a guide again.
    rig.dirty_stop();
    let array = rig.boot();
    assert_eq!(state(&array).state, "awaiting");
    array.fall_back("told to").expect("fall back");
    assert_eq!(state(&array).reason.as_deref(), Some("told to"));
}

#[test]
fn guidance_is_refused_where_it_means_nothing() {
    let sims: Vec<Arc<SimDevice>> = (0..4)
        .map(|i| Arc::new(SimDevice::new(format!("r{i}"), 4 << 20, i)))
        .collect();
    for (level, bitmap, says) in [
        (Level::Raid5, false, "bitmap"),
        (Level::Raid0, true, "RAID1/4/5/6/10"),
    ] {
        let e = engine::create(&spec(&sims, level, bitmap, true))
            .unwrap_err()
            .to_string();
        assert!(e.contains(says), "{level:?}: {e}");
        let mut b = device::AlignedBuf::zeroed(4096);
        sims[0].read_at(&mut b, 4096).expect("read");
        assert!(b.iter().all(|&x| x == 0), "a refused create wrote");
    }
    engine::create(&spec(&sims, Level::Raid5, true, false)).expect("create bitmap");
    let array = engine::assemble(simkit::devs(&sims), AssembleOptions::default()).expect("a");
    assert!(array.status().guidance.is_none());
    let e = array.end_guidance("x", &[]).unwrap_err().to_string();
    assert!(e.contains("does not use the guided"), "{e}");
    drop(array);
    let sims: Vec<Arc<SimDevice>> = (0..3)
        .map(|i| Arc::new(SimDevice::new(format!("c{i}"), 4 << 20, i)))
        .collect();
    let mut s = spec(&sims, Level::Raid1, true, true);
    s.force = true;
    engine::create(&s).expect("create guided RAID1");
    let array = engine::assemble(simkit::devs(&sims), AssembleOptions::default()).expect("a");
    let e = array.end_guidance("x", &[]).unwrap_err().to_string();
    assert!(e.contains("nothing to guide"), "{e}");
}

/// A write watch that calls writes into one byte range nonconforming and counts flush tokens.
struct RangeWatch {
    bad: std::ops::Range<u64>,
    next: std::sync::atomic::AtomicU64,
}

impl engine::WriteWatch for RangeWatch {
    fn begin(&self, offset: u64, len: u64, _data: Option<&[u8]>) -> (bool, u64) {
        let id = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        (offset + len <= self.bad.start || offset >= self.bad.end, id)
    }
    fn end(&self, _id: u64, _ok: bool, _durable: bool) {}
    fn flush_begin(&self) -> u64 {
        0
    }
    fn flush_end(&self, _token: u64) {}
    fn orphans(&self) -> usize {
        0
    }
}

fn watched(a: &Array) {
    a.set_write_watch(Some(Arc::new(RangeWatch {
        bad: 4 * ROW..5 * ROW,
        next: Default::default(),
    })))
    .expect("a guided array takes a watch");
}

/// Before a write the watch calls nonconforming goes out, the members say so: a power cut
/// right after it makes the next assembly fall back to the bitmap resync instead of waiting
/// for a guide. Conforming writes alone leave the array awaiting its guide, and the flag
/// clears after a flush once such writes have been quiet for a while.
#[test]
fn writes_a_watch_calls_unguided_make_a_crash_fall_back() {
    let rig = Rig::new(21);
    let array = rig.boot();
    watched(&array);
    array
        .write(0, &vec![1u8; ROW as usize], false)
        .expect("conforming");
    assert!(!state(&array).unguided, "a conforming write set the flag");
    array
        .write(4 * ROW, &vec![2u8; 4096], false)
        .expect("unguided");
    let g = state(&array);
    assert!(g.unguided && g.watched, "{g:?}");
    assert_eq!((g.conforming_writes, g.nonconforming_writes), (1, 1));
    // The flag is on the members before the write went out: a cut loses nothing of it.
    drop(array);
    for s in &rig.sims {
        s.power_cut();
    }
    let array = rig.boot();
    let g = state(&array);
    assert_eq!(g.state, "fallback", "{g:?}");
    assert!(
        g.reason.as_deref().unwrap().contains("write watch"),
        "{g:?}"
    );
    settle(&array, &rig.clock);
    assert!(rig.consistent());

    // Quiet long enough and flushed: the flag clears, and a crash of conforming writes only
    // waits for the guide.
    watched(&array);
    array
        .write(4 * ROW, &vec![3u8; 4096], false)
        .expect("unguided");
    array.flush().expect("flush");
    assert!(state(&array).unguided, "cleared before the quiet period");
    rig.clock.advance(Duration::from_secs(6));
    array.flush().expect("flush");
    assert!(!state(&array).unguided, "not cleared after a quiet flush");
    array
        .write(0, &vec![4u8; ROW as usize], false)
        .expect("conforming");
    drop(array);
    for s in &rig.sims {
        s.power_cut();
    }
    let array = rig.boot();
    assert_eq!(state(&array).state, "awaiting");
}
