//! Deterministic crash simulation: power cuts at any device call, during client writes, clean
//! stops, superblock commits, resync, check/repair, member failures and rebuilds; then recovery
//! and checks written without the engine's layout or parity code (`oracle`).
//!
//! One seed fixes everything: the geometry, the workload, where the power goes, which unflushed
//! writes survive, vanish or tear, and the order in which each request's member operations
//! complete (the engine's deterministic executor). Background work runs on the test's thread
//! through `Array::sync_step`, on a manual clock.
//!
//! After every cut and recovery:
//! * every write that was flushed (or written FUA) before the cut reads back, or a later write
//!   to the same sector does (a sector-granular model of what may survive);
//! * once resync and rebuild have finished, redundancy agrees with the data (parity, copies),
//!   the data did not change through the resync, and the data the engine reads is what the
//!   members hold where the oracle's layout model says it lives;
//! * at the end, with any one member left out (any two for RAID6), every byte still reads back.
//!
//! `IRONRAID_CRASH_CASES` sets cases per level (CI: 1000), `IRONRAID_SEED` replays one.

use device::{Device, Faults, PowerRail, SimDevice};
use engine::{assemble, Array, ArrayConfig, AssembleOptions, ManualClock, SyncAction};
use layout::Level;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use simkit::devs;
use std::sync::Arc;
use std::time::Duration;
use testkit::{oracle, CrashModel, Seeds};

const MEMBER_BYTES: u64 = 2 << 20;
/// The simulated log device: a ring of about 2 MiB, which the workload wraps several times.
const JOURNAL_BYTES: u64 = 3 << 20;
/// Bound on background windows run to finish one recovery (a window is ≥ one stripe).
const MAX_SYNC_STEPS: usize = 100_000;

/// Everything about one simulated machine: its devices, their power, its clock.
struct Rig {
    seed: u64,
    level: Level,
    rail: Arc<PowerRail>,
    clock: Arc<ManualClock>,
    /// Every device ever given to the array (members, spares, removed ones), in creation order.
    sims: Vec<Arc<SimDevice>>,
    /// Members taken out of the array (not given to assembly again).
    removed: Vec<String>,
    /// Members dead until the next power cycle (a restart without one leaves them out).
    dead: Vec<String>,
    /// A crash left redundancy to resync that may not be done yet. An array that loses a member
    /// now may lose what only that member held of the writes in flight at the crash: a parity
    /// array meets the write hole (md does too; the journal closes it), a mirror falls back to
    /// the other copy's older version of a sector it already served. So the workload fails no
    /// member meanwhile.
    resync_pending: bool,
    policy: Policy,
    shape: oracle::Shape,
    boots: u64,
    /// Canary only: after every cut, clear the write-intent bitmap's bits behind the array's
    /// back, so that resync skips chunks that were being written.
    wipe_bitmap: bool,
    /// Canary only: the guide of a guided array names nothing.
    blind_guide: bool,
    /// A member with a sector that fails reads until written (this round's fault: nothing is
    /// failed on top of it). Drawn from its own stream so the other draws stay as they were.
    bad_sector: Option<String>,
    bad_rng: ChaCha8Rng,
    /// Whether a flaky member is a disk (transient errors) or a remote member whose connection
    /// drops past its retry window (a write it catches may have landed, whole or in part); its
    /// own stream, so the other draws stay as they were.
    net_rng: ChaCha8Rng,
    /// Journal policies: workloads may fail the log (not in the write-hole runs, which lose
    /// members after the cut on purpose).
    log_failures: bool,
    /// The log failed in this round: the cache is written out from memory without a log, so
    /// a cut in that write-out leaves stripes torn that nothing replays, exactly md's write
    /// hole. Losing a member as well is beyond what the array can survive (md's too): the
    /// workload fails none until recovery is done.
    log_failed: bool,
}

/// Which consistency policy the simulated array uses.
#[derive(Clone, Copy, PartialEq)]
enum Policy {
    Resync,
    /// md's internal bitmap, with a small seeded chunk so a crash dirties few of many bits.
    Bitmap,
    /// md's raid5-cache journal on a separate simulated log device (the last of `sims`), with
    /// a ring small enough to wrap and reclaim often.
    Journal,
    /// The same journal in write-back mode (switched on at every start): acknowledged data
    /// waits in the log and the cache until its row is written out.
    JournalWriteBack,
    /// Resync, with integrity records.
    ResyncIntegrity,
    /// Bitmap, with integrity records.
    BitmapIntegrity,
    /// The journal (write-through), with integrity records.
    JournalIntegrity,
    /// The journal in write-back mode, with integrity records.
    JournalWriteBackIntegrity,
    /// The bitmap, and after a cut a guide that names exactly the writes in flight (the
    /// model's unsettled sectors) instead of a bitmap resync.
    Guided,
    /// Guided, with a write watch that calls every write into the array's second half one no
    /// guide would find; the guide names only what was in flight in the first half. The
    /// array must fall back whenever second-half writes were unsettled at the cut.
    GuidedWatched,
}

impl Policy {
    fn journal(self) -> bool {
        matches!(
            self,
            Policy::Journal
                | Policy::JournalWriteBack
                | Policy::JournalIntegrity
                | Policy::JournalWriteBackIntegrity
        )
    }

    fn bitmap(self) -> bool {
        matches!(
            self,
            Policy::Bitmap | Policy::BitmapIntegrity | Policy::Guided | Policy::GuidedWatched
        )
    }

    fn guided(self) -> bool {
        matches!(self, Policy::Guided | Policy::GuidedWatched)
    }

    fn write_back(self) -> bool {
        matches!(
            self,
            Policy::JournalWriteBack | Policy::JournalWriteBackIntegrity
        )
    }

    fn integrity(self) -> bool {
        matches!(
            self,
            Policy::ResyncIntegrity
                | Policy::BitmapIntegrity
                | Policy::JournalIntegrity
                | Policy::JournalWriteBackIntegrity
        )
    }
}

fn pick_geometry(level: Level, rng: &mut ChaCha8Rng) -> (Option<u32>, usize) {
    match level {
        Level::Raid1 => (None, rng.gen_range(2..=3)),
        Level::Raid4 => (None, rng.gen_range(3..=5)),
        Level::Raid5 => (Some(rng.gen_range(0..=5)), rng.gen_range(3..=5)),
        Level::Raid6 => {
            let layouts = [0, 1, 2, 3, 4, 5, 16, 17, 18, 19, 20];
            (
                Some(layouts[rng.gen_range(0..layouts.len())]),
                rng.gen_range(4..=6),
            )
        }
        Level::Raid10 => {
            let options = [(0x102, 4), (0x201, 4), (0x10201, 4), (0x103, 4), (0x102, 3)];
            let (l, n) = options[rng.gen_range(0..options.len())];
            (Some(l), n)
        }
        _ => unreachable!("no redundancy to simulate"),
    }
}

fn oracle_level(level: Level) -> oracle::Level {
    match level {
        Level::Raid1 => oracle::Level::Raid1,
        Level::Raid4 => oracle::Level::Raid4,
        Level::Raid5 => oracle::Level::Raid5,
        Level::Raid6 => oracle::Level::Raid6,
        Level::Raid10 => oracle::Level::Raid10,
        _ => unreachable!("no redundancy to simulate"),
    }
}

impl Rig {
    fn new(seed: u64, level: Level, rng: &mut ChaCha8Rng) -> Rig {
        Rig::with_policy(seed, level, Policy::Resync, rng)
    }

    fn with_policy(seed: u64, level: Level, policy: Policy, rng: &mut ChaCha8Rng) -> Rig {
        let (layout, n) = pick_geometry(level, rng);
        let chunk = 4096usize << rng.gen_range(0..3);
        let rail = PowerRail::new();
        let mut sims: Vec<Arc<SimDevice>> = (0..n)
            .map(|i| {
                Arc::new(
                    SimDevice::new(format!("sim{i}"), MEMBER_BYTES, seed ^ (i as u64) << 32)
                        .on_rail(rail.clone()),
                )
            })
            .collect();
        let created = match policy {
            Policy::Resync => {
                simkit::create_clean("crash", level, layout, chunk as u64, devs(&sims), vec![])
            }
            _ => {
                let log = policy.journal().then(|| {
                    Arc::new(
                        SimDevice::new("journal", JOURNAL_BYTES, seed ^ 0x10_6000)
                            .on_rail(rail.clone()),
                    )
                });
                let bitmap = policy.bitmap().then(|| engine::BitmapSpec {
                    chunk_bytes: Some(4096 << rng.gen_range(0..4)),
                    cluster: None,
                });
                // Half the bitmap cases start with every region unused (members discarded);
                // integrity always does.
                let discard = (bitmap.is_some() && rng.gen_bool(0.5)) || policy.integrity();
                let created = engine::create(&engine::CreateSpec {
                    bitmap,
                    discard,
                    journal: log.clone().map(|l| l as Arc<dyn Device>),
                    journal_write_back: policy.write_back(),
                    integrity: policy.integrity(),
                    guided: policy.guided(),
                    ..simkit::clean_spec("crash", level, layout, chunk as u64, devs(&sims), vec![])
                })
                .expect("create");
                sims.extend(log);
                created
            }
        };
        let shape = oracle::Shape {
            level: oracle_level(level),
            layout: layout.unwrap_or(match level {
                Level::Raid10 => 0x102,
                _ => 0,
            }),
            members: n,
            chunk_bytes: chunk,
            member_data_bytes: created.component_sectors as usize * 512,
        };
        Rig {
            seed,
            level,
            rail,
            clock: Arc::new(ManualClock::default()),
            sims,
            removed: Vec::new(),
            dead: Vec::new(),
            resync_pending: false,
            policy,
            shape,
            boots: 0,
            wipe_bitmap: false,
            blind_guide: false,
            bad_sector: None,
            bad_rng: ChaCha8Rng::seed_from_u64(seed ^ 0xbad_5ec7),
            net_rng: ChaCha8Rng::seed_from_u64(seed ^ 0x4e7_d40b),
            log_failures: false,
            log_failed: false,
        }
    }

    fn config(&mut self) -> ArrayConfig {
        self.boots += 1;
        ArrayConfig {
            deterministic_seed: Some(self.seed.wrapping_mul(1000).wrapping_add(self.boots)),
            clock: Some(self.clock.clone()),
            io_threads: 2,
            // Small windows: background work is cut, checkpointed and resumed mid-way.
            sync_window_bytes: 64 << 10,
            // Every other boot holds one or two record pages: tables are read as needed and
            // evicted all the time.
            integrity_cache_bytes: if self.boots.is_multiple_of(2) {
                (1 + (self.seed % 2) as usize) * 4096
            } else {
                64 << 20
            },
            ..ArrayConfig::default()
        }
    }

    /// Assemble from every device except `left_out` (indexes into `sims`).
    fn boot(&mut self, left_out: &[usize]) -> engine::Result<Array> {
        self.boot_with(left_out, false)
    }

    fn boot_with(&mut self, left_out: &[usize], force: bool) -> engine::Result<Array> {
        self.boot_opts(left_out, force, false, None)
    }

    /// The array's journal device (journal policies): the newest one.
    fn journal_sim(&self) -> Option<Arc<SimDevice>> {
        self.sims
            .iter()
            .rev()
            .find(|s| s.name().starts_with("journal"))
            .cloned()
    }

    fn boot_opts(
        &mut self,
        left_out: &[usize],
        force: bool,
        read_only: bool,
        add_journal: Option<Arc<SimDevice>>,
    ) -> engine::Result<Array> {
        let given: Vec<Arc<SimDevice>> = self
            .sims
            .iter()
            .enumerate()
            .filter(|(i, s)| {
                !left_out.contains(i)
                    && !self.removed.iter().any(|r| r == s.name())
                    && !self.dead.iter().any(|d| d == s.name())
            })
            .map(|(_, s)| s.clone())
            .collect();
        let config = ArrayConfig {
            read_only,
            ..self.config()
        };
        let array = assemble(
            devs(&given),
            AssembleOptions {
                name: None,
                config,
                force,
                add_journal: add_journal.map(|j| j as Arc<dyn Device>),
                ..Default::default()
            },
        )?;
        if self.policy.write_back() {
            // Refused while degraded (the array writes through then).
            let _ = array.set_journal_mode(true);
        }
        if self.policy == Policy::GuidedWatched && !self.blind_guide {
            // Refused only if the array came up as a plain bitmap array (no usable used-region
            // map to hold the guided flag): then there is no guidance to protect.
            let _ = array.set_write_watch(Some(Arc::new(HalfWatch {
                from: unguided_from(&array),
            })));
        }
        Ok(array)
    }

    /// Would failing a member now lose writes that were in flight at the last crash?
    fn hole_risk(&self) -> bool {
        // The journal replays what was in flight: nothing is left for a resync to repair.
        (self.resync_pending && !self.policy.journal()) || self.log_failed
    }

    /// Power off now: every device loses or tears what it had not flushed.
    fn crash(&mut self) {
        for s in &self.sims {
            s.power_cut();
            s.set_dead(false);
            s.set_faults(Faults::default());
            s.clear_unreadable();
        }
        self.dead.clear();
        self.bad_sector = None;
        self.rail.restore();
        if self.wipe_bitmap {
            for s in &self.sims {
                let Ok((sb, _)) = engine::read_bitmap(s.as_ref()) else {
                    continue;
                };
                let bits_end = sb.bytes_on_disk() as usize;
                let mut page = device::AlignedBuf::zeroed(bits_end);
                s.read_at(&mut page, 8192).expect("read bitmap");
                page[256..].fill(0);
                s.write_at(&page, 8192, true).expect("wipe bitmap");
            }
        }
    }

    /// The data areas of the members filling roles, by role (None: role not filled).
    fn images(&self, array: &Array) -> Vec<Option<Vec<u8>>> {
        let status = array.status();
        let mut out = vec![None; self.shape.members];
        for m in status.members {
            let (Some(role), engine::MemberState::InSync) = (m.role, m.state) else {
                continue;
            };
            let sim = self
                .sims
                .iter()
                .find(|s| s.name() == m.name)
                .expect("member is one of ours");
            let sb = engine::read_superblock(sim.as_ref()).expect("superblock");
            let at = sb.data_offset as usize * 512;
            out[role] = Some(sim.contents()[at..at + self.shape.member_data_bytes].to_vec());
        }
        out
    }

    /// Run background work until nothing is left (or the power goes).
    fn settle_sync(&self, array: &Array) {
        for _ in 0..MAX_SYNC_STEPS {
            self.clock.advance(Duration::from_millis(250));
            if array.sync_step() == SyncAction::Idle || self.rail.is_off() {
                return;
            }
        }
        let st = array.status();
        panic!(
            "background work did not finish in {MAX_SYNC_STEPS} windows: {:?} {:?} {:?}",
            st.sync, st.members, st.integrity
        );
    }
}

fn read_all(a: &Array) -> Vec<u8> {
    let mut buf = vec![0u8; a.size_bytes() as usize];
    if let Err(e) = a.read(0, &mut buf) {
        let st = a.status();
        panic!(
            "read the whole array: {e}\n{:?}\n{:?}\n{:?}\nlevel {:?}",
            st.members, st.sync, st.integrity, st.missing_roles
        );
    }
    buf
}

/// Redundancy agrees with data, and the engine's view of the data is where the oracle says.
/// (Write-back data is written home first: until then it lives in the journal's cache.)
fn check_redundancy(rig: &Rig, array: &Array, data: &[u8]) {
    if rig.policy.write_back() {
        array.set_journal_mode(false).expect("write everything out");
        // Refused while degraded: the array writes through until it is whole again.
        let _ = array.set_journal_mode(true);
    }
    let images = rig.images(array);
    let present: Vec<bool> = images.iter().map(Option::is_some).collect();
    let empty = Vec::new();
    let refs: Vec<&[u8]> = images
        .iter()
        .map(|i| i.as_deref().unwrap_or(&empty[..]))
        .collect();
    if let Some(bad) = rig.shape.first_inconsistency(&refs, &present) {
        panic!("redundancy inconsistent after recovery: {bad}");
    }
    if present.iter().all(|p| *p) {
        assert!(
            rig.shape.array_image(&refs) == data,
            "the engine's data is not where md's layout puts it"
        );
    }
}

/// What one round of workload may do besides client I/O.
#[derive(Clone, Copy, PartialEq)]
enum Mode {
    /// No member fails: every level must keep every flushed write through any cut.
    Healthy,
    /// Members fail, spares are added and rebuilt (mirror levels: a dirty degraded start is
    /// safe there, so the data checks still hold after any cut).
    Failures,
}

/// One round: workload until the power goes at a seeded device call (or at the end).
fn workload(
    rig: &mut Rig,
    array: &mut Array,
    model: &mut CrashModel,
    rng: &mut ChaCha8Rng,
    mode: Mode,
) {
    rig.rail.cut_after(rng.gen_range(0..800));
    let size = model.current.len();
    let steps = rng.gen_range(10..50);
    // Journal policies: now and then the log fails at a drawn step, by the administrator's
    // `fail` or by I/O errors at whichever log write or flush comes next (a client write, a
    // write-back caching, a write-out's parity, a group flush, a tail record).
    // Not with write-back and integrity: a cut in a failed log's unlogged write-out leaves
    // blocks whose records disagree, and the next start serves them as unrecoverable (EIO,
    // never wrong data) although the log still holds their data: a known gap (README; seed
    // 12648776 of crash_raid6_journal_write_back_integrity shows it).
    let log_fails = (rig.log_failures
        && rig.policy.journal()
        && rig.policy != Policy::JournalWriteBackIntegrity
        && rng.gen_bool(0.3))
    .then(|| (rng.gen_range(0..steps), rng.gen_range(0..3)))
    // Not on top of a member failing already (see `Rig::log_failed`).
    .filter(|_| rig.dead.is_empty() && array.status().missing_roles.is_empty());
    for step in 0..steps {
        if rig.rail.is_off() {
            return;
        }
        if let Some((_, how)) = log_fails.filter(|&(at, _)| at == step) {
            fail_log(rig, array, how);
            if rig.rail.is_off() {
                return;
            }
        }
        match rng.gen_range(0..100) {
            0..=44 => {
                let len = rng.gen_range(1..=96usize) * 512;
                let off = rng.gen_range(0..=(size - len) / 512) * 512;
                let data: Vec<u8> = (0..len).map(|_| rng.gen()).collect();
                let fua = rng.gen_bool(0.1);
                model.issue(off, &data);
                for (at, piece, res) in client_write(array, off, &data, fua) {
                    // An acknowledgement after the power went never reached anyone.
                    match res {
                        _ if rig.rail.is_off() => return,
                        Ok(()) => model.complete(at, piece, fua),
                        Err(engine::EngineError::ReadOnly { .. }) if journal_down(array) => {
                            if !refused(rig, array, model, at, piece.len()) {
                                return;
                            }
                        }
                        Err(e) => panic!("write {at}+{} failed with power on: {e}", piece.len()),
                    }
                }
            }
            45..=54 => {
                let len = rng.gen_range(1..=64usize) * 512;
                let off = rng.gen_range(0..=(size - len) / 512) * 512;
                let mut buf = vec![0u8; len];
                match array.read(off as u64, &mut buf) {
                    _ if rig.rail.is_off() => return,
                    Ok(()) => assert!(
                        buf == model.current[off..off + len],
                        "read {off}+{len} differs from what was written"
                    ),
                    Err(e) => panic!("read {off}+{len} failed with power on: {e}"),
                }
            }
            55..=56 => {
                // Zeroes over a large range: whole used-map regions are released (discarded on
                // every member), the edges written.
                let len = rng.gen_range(1..=(size / 512)) * 512;
                let off = rng.gen_range(0..=(size - len) / 512) * 512;
                let fua = rng.gen_bool(0.3);
                let zeroes = vec![0u8; len];
                model.issue(off, &zeroes);
                match array.write_zeroes(off as u64, len as u64, fua, true) {
                    _ if rig.rail.is_off() => return,
                    Ok(()) => model.complete(off, &zeroes, fua),
                    Err(engine::EngineError::ReadOnly { .. }) if journal_down(array) => {
                        if !refused(rig, array, model, off, len) {
                            return;
                        }
                    }
                    Err(e) => panic!("write_zeroes {off}+{len} failed with power on: {e}"),
                }
            }
            57..=64 => match array.flush() {
                Ok(()) if !rig.rail.is_off() => model.flushed(),
                Err(e) if !rig.rail.is_off() && journal_down(array) => {
                    panic!("a flush after the log failed, with power on: {e}")
                }
                _ => return,
            },
            65..=79 => {
                for _ in 0..rng.gen_range(1..6) {
                    rig.clock.advance(Duration::from_millis(500));
                    array.sync_step();
                    // The bitmap daemon's clean-up pass and the journal's reclaim (nothing
                    // without them).
                    array.bitmap_pass();
                    array.journal_pass();
                }
            }
            80..=84 => {
                let action = ["check", "repair", "resync"][rng.gen_range(0..3)];
                let _ = array.request_action(action);
            }
            85..=89 => {
                // Clean stop and start again (a resync in progress keeps its checkpoint).
                if array.close().is_err() || rig.rail.is_off() {
                    return;
                }
                model.flushed();
                match rig.boot(&[]) {
                    Ok(a) => *array = a,
                    Err(_) if rig.rail.is_off() => return,
                    // Stopped cleanly with a resync still to do and now degraded: md refuses
                    // too (those stripes' parity was never checked). Forced, the stripes that
                    // needed the resync may read differently: the model starts over.
                    Err(e) if e.to_string().contains("write hole") => {
                        *array = match rig.boot_with(&[], true) {
                            Ok(a) => a,
                            Err(_) if rig.rail.is_off() => return,
                            Err(e) => panic!("forced start: {e}"),
                        };
                        if array.status().torn_rows_exposed > 0 {
                            // As in `recover`: the blocks of rows the bitmap says may be torn
                            // stay unreadable through a rebuild and the resync after it, until
                            // written again.
                            give_spare(rig, array);
                            rig.settle_sync(array);
                            if rig.rail.is_off() {
                                return;
                            }
                            restore_lost_pages(rig, array, model, true);
                        }
                        match array.read(0, &mut model.current) {
                            Ok(()) => model.settle(model.current.clone()),
                            Err(_) if rig.rail.is_off() => return,
                            Err(e) => panic!("read after a forced start: {e}"),
                        }
                    }
                    Err(e) => panic!("restart after a clean stop failed: {e}"),
                }
            }
            _ if mode == Mode::Failures => fail_or_add(rig, array, rng),
            _ => {}
        }
    }
}

/// A spare for the array, unless it has one.
fn give_spare(rig: &mut Rig, array: &Array) {
    if array
        .status()
        .members
        .iter()
        .any(|m| m.state == engine::MemberState::Spare)
    {
        return;
    }
    let name = format!("spare{}", rig.sims.len());
    let sim = Arc::new(
        SimDevice::new(&name, MEMBER_BYTES, rig.seed ^ rig.sims.len() as u64)
            .on_rail(rig.rail.clone()),
    );
    if array.add_member(sim.clone(), false).is_ok() {
        rig.sims.push(sim);
    }
}

/// A write refused once the log failed may have landed in part: the rows whose batches were
/// logged (or cached) before the failure are acknowledged to nobody, yet they go home. What
/// reads back now is what a flush makes durable (a cut before it may leave the older bytes).
/// False when the power went meanwhile.
/// A client write of `data` at `off`: one time in three (picked from what was drawn already,
/// so that every seed draws what it drew before) as a gathered run of two to four sequential
/// pieces, as the NBD frontend hands over a stream's WRITEs that arrived together. Returns
/// each piece's offset, bytes and result.
fn client_write<'d>(
    array: &Array,
    off: usize,
    data: &'d [u8],
    fua: bool,
) -> Vec<(usize, &'d [u8], engine::Result<()>)> {
    let sectors = data.len() / 512;
    let pieces = 2 + sectors % 3;
    if !(off / 512).is_multiple_of(3) || sectors < pieces {
        return vec![(off, data, array.write(off as u64, data, fua))];
    }
    let per = sectors / pieces * 512;
    let cuts: Vec<(usize, &[u8])> = (0..pieces)
        .map(|i| {
            let end = if i + 1 == pieces {
                data.len()
            } else {
                (i + 1) * per
            };
            (off + i * per, &data[i * per..end])
        })
        .collect();
    let run = cuts
        .iter()
        .map(|&(at, piece)| engine::GatheredWrite {
            offset_bytes: at as u64,
            data: piece,
            fua,
            intent: None,
        })
        .collect();
    let results = array.write_gathered(run);
    assert_eq!(results.len(), pieces, "one result per write of a run");
    cuts.into_iter()
        .zip(results)
        .map(|((at, piece), res)| (at, piece, res))
        .collect()
}

fn refused(rig: &Rig, array: &Array, model: &mut CrashModel, off: usize, len: usize) -> bool {
    let mut back = vec![0u8; len];
    match array.read(off as u64, &mut back) {
        _ if rig.rail.is_off() => false,
        Ok(()) => {
            model.complete(off, &back, false);
            true
        }
        Err(e) => panic!("read {off}+{len} after a refused write, with power on: {e}"),
    }
}

/// Writes are refused because the journal failed (or the array started without it).
fn journal_down(array: &Array) -> bool {
    array
        .status()
        .read_only_reason
        .is_some_and(|r| r.contains("journal"))
}

/// The log fails: 0, the administrator's `fail` (returns once its cache is written out and
/// the members flushed); 1, the device dies (the next log I/O fails); 2, its writes fail half
/// the time from now on.
fn fail_log(rig: &mut Rig, array: &Array, how: u32) {
    let Some(log) = rig.journal_sim() else {
        return;
    };
    rig.log_failed = true;
    match how {
        0 => {
            let res = array.fail_member(log.name());
            if let (Err(e), false) = (res, rig.rail.is_off()) {
                if !array.is_read_only() {
                    panic!("failing the log with power on: {e}");
                }
            }
            if !rig.rail.is_off() && !array.is_read_only() {
                let j = array.status().journal.expect("journal");
                assert_eq!(j.state, "failed", "after `fail` returned: {j:?}");
                assert_eq!(j.cache_bytes, 0, "after `fail` returned: {j:?}");
            }
        }
        1 => log.set_dead(true),
        _ => log.set_faults(Faults {
            write_error: 0.5,
            ..Faults::default()
        }),
    }
    if how > 0 {
        // Broken until the next power cycle: a restart before that leaves it out.
        rig.dead.push(log.name().to_string());
    }
}

/// Fail a member, or give the array a new spare, or take out a faulty member.
fn fail_or_add(rig: &mut Rig, array: &Array, rng: &mut ChaCha8Rng) {
    let st = array.status();
    let in_sync: Vec<&engine::MemberStatus> = st
        .members
        .iter()
        .filter(|m| m.state == engine::MemberState::InSync)
        .collect();
    match rng.gen_range(0..3) {
        0 if st.missing_roles.is_empty()
            && rig.dead.is_empty()
            && rig.bad_sector.is_none()
            && !rig.hole_risk()
            && in_sync.len() > 1 =>
        {
            let victim = in_sync[rng.gen_range(0..in_sync.len())].name.clone();
            if rng.gen_bool(0.5) {
                let _ = array.fail_member(&victim);
            } else if let Some(s) = rig.sims.iter().find(|s| s.name() == victim) {
                // Dies for real: the next I/O to it fails (it comes back after a power cycle).
                s.set_dead(true);
                rig.dead.push(victim);
            }
        }
        1 if st
            .members
            .iter()
            .all(|m| m.state != engine::MemberState::Spare) =>
        {
            // A removed member comes back now and then: with a bitmap it takes its old role
            // and recovers only what it missed (md's re-add), else it is a new spare.
            if !rig.removed.is_empty() && rng.gen_bool(0.5) {
                let name = rig.removed[rng.gen_range(0..rig.removed.len())].clone();
                let sim = rig.sims.iter().find(|s| s.name() == name).cloned();
                if let Some(sim) = sim {
                    if array.add_member(sim, false).is_ok() {
                        rig.removed.retain(|r| *r != name);
                    }
                }
                return;
            }
            give_spare(rig, array);
        }
        _ => {
            if let Some(f) = st
                .members
                .iter()
                .find(|m| m.state == engine::MemberState::Faulty)
            {
                if array.remove_member(&f.name).is_ok() {
                    rig.removed.push(f.name.clone());
                }
            }
        }
    }
}

/// After a cut: boot, check what survived, finish background work, check redundancy.
/// `partial_sync`: run only this many background windows, leaving the resync (or rebuild)
/// unfinished for the next round to cut into; `None`: finish it and check redundancy.
/// `probe_read_only`: first start read-only, which must serve what the model allows or
/// refuse because the members lack what the log holds.
fn recover(
    rig: &mut Rig,
    model: &mut CrashModel,
    left_out: &[usize],
    partial_sync: Option<usize>,
    probe_read_only: bool,
) -> Array {
    // A log that failed wrote its cache out unlogged: a cut in that reopens the write hole.
    let log_failed = rig.log_failed;
    rig.crash();
    if rig.policy.journal() && rig.boots.is_multiple_of(3) {
        // Power goes again while the journal is replayed (or the new chain started): the
        // replay must be repeatable.
        rig.rail.cut_after(rig.boots % 40);
        let _ = rig.boot(left_out);
        rig.crash();
    }
    if probe_read_only {
        probe_read_only_start(rig, model, left_out);
    }
    let (array, forced) = match rig.boot(left_out) {
        Ok(a) => (a, false),
        // md's rule: a parity array that crashed while degraded may have stripes whose parity
        // disagrees with the data (the write hole); it only starts when forced, and then
        // nothing is promised about the stripes in flight.
        Err(e) if rig.level.is_parity() && e.to_string().contains("write hole") => {
            let forced = rig.boot_with(left_out, true).expect("forced start");
            (forced, true)
        }
        Err(e) => panic!("assembly after the cut failed: {e}"),
    };
    // A log that failed is replayed or replaced by now: the write hole is closed again.
    rig.log_failed = false;
    let replaced = rig.policy.journal() && array.is_read_only();
    let (array, forced) = if replaced {
        (replace_failed_journal(rig, model, array, left_out), true)
    } else {
        (array, forced)
    };
    // A new journal owes a full resync: finish it before anything else is checked.
    let partial_sync = partial_sync.filter(|_| !replaced);
    if rig.policy.guided() {
        guide(rig, &array, model);
    }
    // Forced past the write hole, a bitmap array without records refuses to rebuild blocks
    // from the rows its bitmap says may be torn, and a rebuild records them bad on the new
    // member (with their parity): they stay unreadable through it and the resync after it
    // until written again, so those run to the end first.
    let exposed = forced && !rig.policy.integrity() && array.status().torn_rows_exposed > 0;
    let partial_sync = if exposed {
        give_spare(rig, &array);
        rig.settle_sync(&array);
        None
    } else {
        partial_sync
    };
    restore_lost_pages(rig, &array, model, forced);
    let before = read_all(&array);
    if rig.policy.journal() && !replaced && !(forced && log_failed) {
        // The write hole is closed at assembly, before any resync: replaying the log left
        // every stripe's parity in agreement with its data. (Forcing is needed only when an
        // administrator's resync was still owed, which the journal does not replace.)
        check_redundancy(rig, &array, &before);
    }
    if forced && (!rig.policy.journal() || log_failed) {
        model.settle(before.clone());
    } else if let Err(e) = model.check(&before) {
        panic!(
            "after the cut, before resync: {e} {:?} dirty {}",
            array.status().integrity,
            array.was_dirty_at_assembly()
        );
    }
    rig.resync_pending = partial_sync.is_some();
    match partial_sync {
        None => rig.settle_sync(&array),
        Some(windows) => {
            for _ in 0..windows {
                rig.clock.advance(Duration::from_millis(250));
                array.sync_step();
            }
        }
    }
    let after = read_all(&array);
    assert!(before == after, "resync or rebuild changed the data");
    if partial_sync.is_none() {
        check_redundancy(rig, &array, &after);
        if rig.policy.integrity() && array.status().missing_roles.is_empty() {
            check_records(rig, &array);
        }
    }
    model.settle(after);
    array
}

/// After a cut, an integrity array that came up degraded has no redundancy left to tell a block
/// a torn write left failing its record from damage: such a page reads EIO, never wrong data.
/// That is allowed only where writes were in flight at the cut (anywhere in a stripe, when the
/// start was forced past the write hole: its other blocks are rebuilt from the torn one, and a
/// bitmap array without records refuses to rebuild blocks from the rows its bitmap says may be
/// torn, and records them bad when it rebuilds them). The rig then writes what was lost again, whole stripe
/// rows or pages (as an administrator restores from a backup), so that the rounds go on from a
/// known image.
fn restore_lost_pages(rig: &Rig, array: &Array, model: &mut CrashModel, forced: bool) {
    const PAGE: usize = 4096;
    let mut buf = vec![0u8; model.current.len()];
    let Err(e) = array.read(0, &mut buf) else {
        return;
    };
    // Called within a round, the power may go meanwhile: the next recovery takes over.
    if rig.rail.is_off() {
        return;
    }
    let st = array.status();
    assert!(
        forced || (rig.policy.integrity() && !st.missing_roles.is_empty()),
        "read the whole array after the cut: {e}\n{:?}\n{:?}",
        st.members,
        st.integrity
    );
    let lost: Vec<usize> = (0..buf.len() / PAGE)
        .filter(|p| array.read((p * PAGE) as u64, &mut buf[..PAGE]).is_err())
        .collect();
    if rig.rail.is_off() {
        return;
    }
    for &p in &lost {
        assert!(
            forced || model.in_flight(p * PAGE, PAGE),
            "page {p} reads EIO after the cut, but no write to it was in flight: {e}\n{:?}",
            st.members
        );
    }
    let g = array.geometry();
    let unit = if g.level().is_parity() {
        g.data_disks() * rig.shape.chunk_bytes
    } else {
        PAGE
    };
    let mut units: Vec<usize> = lost.iter().map(|p| p * PAGE / unit * unit).collect();
    units.dedup();
    let mut rng = ChaCha8Rng::seed_from_u64(rig.seed ^ rig.boots);
    // FUA: durable one by one, leaving what else was in flight at the cut undecided.
    for at in units {
        let data: Vec<u8> = (0..unit).map(|_| rng.gen()).collect();
        model.issue(at, &data);
        match array.write(at as u64, &data, true) {
            Ok(()) => model.complete(at, &data, true),
            Err(_) if rig.rail.is_off() => return,
            Err(e) => panic!("rewriting {at}+{unit}, lost at the cut: {e}"),
        }
    }
}

/// A read-only start after the cut: it serves only what the model allows (it replays nothing,
/// so it starts only when the members hold what the log does, or when the log is recorded
/// faulty, which happens only once its cache is on the members), or it refuses.
fn probe_read_only_start(rig: &mut Rig, model: &CrashModel, left_out: &[usize]) {
    match rig.boot_opts(left_out, false, true, None) {
        Ok(ro) => {
            if let Err(e) = model.check(&read_all(&ro)) {
                panic!("a read-only start after the cut served older data: {e}");
            }
        }
        Err(_) if rig.rail.is_off() => unreachable!("the power is on after a crash"),
        Err(e) => {
            let msg = e.to_string();
            assert!(
                msg.contains("without --read-only") || msg.contains("write hole"),
                "a read-only start refused for another reason: {msg}"
            );
        }
    }
}

/// The log was recorded faulty before the cut (so its cache was on the members first): the
/// array started read-only and serves every flushed write. A new journal (a full resync)
/// lets the case go on.
fn replace_failed_journal(
    rig: &mut Rig,
    model: &mut CrashModel,
    array: Array,
    left_out: &[usize],
) -> Array {
    let before = read_all(&array);
    if let Err(e) = model.check(&before) {
        panic!("the log was recorded faulty, and the read-only start lost flushed data: {e}");
    }
    model.settle(before);
    drop(array);
    let old = rig.journal_sim().expect("a journal device");
    if !rig.removed.iter().any(|r| r == old.name()) {
        rig.removed.push(old.name().to_string());
    }
    let name = format!("journal{}", rig.sims.len());
    let new = Arc::new(
        SimDevice::new(&name, JOURNAL_BYTES, rig.seed ^ rig.sims.len() as u64)
            .on_rail(rig.rail.clone()),
    );
    // Forced: a degraded array's journal is replaced only so (its stripes are whole here:
    // nothing was written after the log was settled but rebuilds and repairs).
    let array = rig
        .boot_opts(left_out, true, false, Some(new.clone()))
        .unwrap_or_else(|e| panic!("a new journal for the array: {e}"));
    rig.sims.push(new);
    array
}

/// A guided array after a cut: a guide that knows which writes were in flight (the model)
/// names them; the array verifies their stripes and counts redundancy as good everywhere (the
/// checks after recovery then prove it is). Degraded, nothing can be verified: fall back.
fn guide(rig: &Rig, array: &Array, model: &CrashModel) {
    let Some(g) = array.status().guidance else {
        panic!("a guided array reports no guidance");
    };
    if g.state != "awaiting" {
        assert!(
            !array.was_dirty_at_assembly() || g.state == "fallback",
            "dirty at assembly but guidance is {g:?}"
        );
        return;
    }
    if !array.status().missing_roles.is_empty() {
        array.fall_back("degraded").expect("fall back");
        return;
    }
    let ranges = if rig.policy == Policy::GuidedWatched {
        // The guide knows only the first half; the watch (unless the array runs blind to
        // it: the canary) made the second half's writes fall back.
        let from = unguided_from(array);
        model
            .in_flight_ranges()
            .into_iter()
            .filter(|&(off, _)| off < from)
            .map(|(off, len)| (off, len.min(from - off)))
            .collect()
    } else if rig.blind_guide {
        Vec::new()
    } else {
        model.in_flight_ranges()
    };
    match array.end_guidance("oracle", &ranges) {
        Ok(_) => {
            let g = array.status().guidance.expect("guidance");
            assert_eq!(g.state, "guided", "{g:?}");
        }
        // A member failed under the verify (the power stays on here, so only if faulty
        // already): the fallback resync takes over.
        Err(e) => panic!("guidance failed with power on: {e}"),
    }
}

/// Where [`HalfWatch`] starts calling writes unguided.
fn unguided_from(array: &Array) -> u64 {
    array.size_bytes() / 2 / 4096 * 4096
}

/// A write watch for [`Policy::GuidedWatched`]: writes (and discards) reaching past `from` are
/// ones no guide would find.
struct HalfWatch {
    from: u64,
}

impl engine::WriteWatch for HalfWatch {
    fn begin(&self, offset: u64, len: u64, _data: Option<&[u8]>) -> (bool, u64) {
        (offset + len <= self.from, 0)
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

/// After recovery every block matches its record: a check finds nothing (no false corruption
/// on data that was never damaged) and refuses nothing.
fn check_records(rig: &Rig, array: &Array) {
    let counts = |a: &Array| a.status().integrity.expect("integrity").counts;
    let before = counts(array);
    array.request_action("check").expect("check");
    rig.settle_sync(array);
    let after = counts(array);
    let found = |c: &engine::IntegrityCounts| c.data_mismatches + c.p_mismatches + c.q_mismatches;
    assert_eq!(
        found(&after),
        found(&before),
        "a check after recovery found blocks that fail their records: {after:?}"
    );
    // Refusals before it were pages a cut left with nothing to vouch for them (see
    // `restore_lost_pages`); the check itself meets none.
    assert_eq!(after.unrecoverable, before.unrecoverable, "{after:?}");
    assert_eq!(
        array.status().sync.mismatch_sectors,
        0,
        "parity mismatches after recovery"
    );
}

/// Leave out any one member (two for RAID6) of a cleanly stopped array: every byte reads back.
fn check_degraded_reads(rig: &mut Rig, array: Array, model: &CrashModel, rng: &mut ChaCha8Rng) {
    let st = array.status();
    if !st.missing_roles.is_empty() {
        array.close().expect("clean stop");
        return;
    }
    let mut members: Vec<String> = st
        .members
        .iter()
        .filter(|m| m.state == engine::MemberState::InSync)
        .map(|m| m.name.clone())
        .collect();
    array.close().expect("clean stop");
    drop(array);
    let tolerance = if rig.level == Level::Raid6 { 2 } else { 1 };
    let mut left_out = Vec::new();
    for _ in 0..tolerance {
        let name = members.remove(rng.gen_range(0..members.len()));
        left_out.push(
            rig.sims
                .iter()
                .position(|s| s.name() == name)
                .expect("ours"),
        );
    }
    let degraded = rig.boot(&left_out).expect("a clean array starts degraded");
    assert!(
        read_all(&degraded) == model.current,
        "data differs with members {left_out:?} left out"
    );
    degraded.close().expect("clean stop");
}

/// Failures mode: sometimes one member turns flaky for a round: a disk with transient read and
/// write errors, or a remote member whose connection drops for good (each error fails the
/// member; a write caught by a drop may have landed, whole or in part, and is never reported).
fn maybe_flaky(rig: &mut Rig, array: &Array, rng: &mut ChaCha8Rng, mode: Mode) {
    let healthy = array.status().missing_roles.is_empty() && rig.dead.is_empty();
    if mode == Mode::Failures && healthy && !rig.hole_risk() && rng.gen_bool(0.3) {
        let i = rng.gen_range(0..rig.shape.members);
        let name = rig.sims[i].name().to_string();
        let faults = if rig.net_rng.gen_bool(0.5) {
            Faults {
                network_drop: 0.05,
                ..Faults::default()
            }
        } else {
            Faults {
                read_error: 0.05,
                write_error: 0.05,
                ..Faults::default()
            }
        };
        rig.sims[i].set_faults(faults);
        // Counts as this round's failure: nothing else is failed on top of it.
        rig.dead.push(name);
        return;
    }
    // Or a latent sector error on a healthy array: read errors are corrected from redundancy
    // and the member stays (issue 21 item 7); every read must still return what was written.
    if mode == Mode::Failures && healthy && !rig.hole_risk() && rig.bad_rng.gen_bool(0.3) {
        let in_sync: Vec<String> = array
            .status()
            .members
            .into_iter()
            .filter(|m| m.state == engine::MemberState::InSync)
            .map(|m| m.name)
            .collect();
        let name = &in_sync[rig.bad_rng.gen_range(0..in_sync.len())];
        let Some(sim) = rig.sims.iter().find(|s| s.name() == name) else {
            return;
        };
        let Ok(sb) = engine::read_superblock(sim.as_ref()) else {
            return;
        };
        let pages = rig.shape.member_data_bytes as u64 / 4096;
        let at = sb.data_offset * 512 + rig.bad_rng.gen_range(0..pages) * 4096;
        sim.set_unreadable(at, 4096);
        rig.bad_sector = Some(sim.name().to_string());
    }
}

/// A member with one unreadable sector on a healthy array stays in the array (its read
/// errors are corrected), unless the power went (then every call failed).
fn assert_bad_sector_kept(rig: &Rig, array: &Array) {
    let Some(name) = &rig.bad_sector else { return };
    if rig.rail.is_off() {
        return;
    }
    let st = array.status();
    let m = st.members.iter().find(|m| &m.name == name);
    assert!(
        m.is_some_and(|m| m.state == engine::MemberState::InSync),
        "{name} (one bad sector) left the array: {:?}",
        st.members
    );
}

fn crash_case_with(seed: u64, level: Level, mode: Mode, policy: Policy, wipe_bitmap: bool) {
    crash_case_full(seed, level, mode, policy, wipe_bitmap, false)
}

fn crash_case_full(
    seed: u64,
    level: Level,
    mode: Mode,
    policy: Policy,
    wipe_bitmap: bool,
    blind_guide: bool,
) {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_env("IRONRAID_LOG"))
        .with_test_writer()
        .try_init();
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut rig = Rig::with_policy(seed, level, policy, &mut rng);
    rig.wipe_bitmap = wipe_bitmap;
    rig.blind_guide = blind_guide;
    rig.log_failures = true;
    let mut array = rig.boot(&[]).expect("first assembly");
    let mut model = CrashModel::new(vec![0u8; array.size_bytes() as usize]);
    let rounds = rng.gen_range(1..=4);
    for round in 0..rounds {
        maybe_flaky(&mut rig, &array, &mut rng, mode);
        workload(&mut rig, &mut array, &mut model, &mut rng, mode);
        assert_bad_sector_kept(&rig, &array);
        // Mirror levels may also come back without one member (when none is missing yet).
        let healthy = array.status().missing_roles.is_empty() && rig.dead.is_empty();
        drop(array);
        let mut left_out = Vec::new();
        if mode == Mode::Failures
            && healthy
            && !rig.hole_risk()
            && rng.gen_bool(0.2)
            && rig.shape.members > 2
        {
            left_out.push(rng.gen_range(0..rig.shape.members));
        }
        // Some rounds leave the resync half done: the next round writes below its checkpoint,
        // stops cleanly and is cut again.
        let partial = (round + 1 < rounds && rng.gen_bool(0.5)).then(|| rng.gen_range(0..24));
        let probe = policy.journal() && rng.gen_bool(0.3);
        array = recover(&mut rig, &mut model, &left_out, partial, probe);
    }
    check_degraded_reads(&mut rig, array, &model, &mut rng);
}

fn run_level(test: &str, level: Level, mode: Mode) {
    run_level_with(test, level, mode, Policy::Resync)
}

fn run_level_with(test: &str, level: Level, mode: Mode, policy: Policy) {
    testkit::for_each_seed!(test, Seeds::crash(), |seed| {
        crash_case_with(seed, level, mode, policy, false)
    });
}

#[test]
fn crash_raid1() {
    run_level("crash_raid1", Level::Raid1, Mode::Healthy);
}

#[test]
fn crash_raid10() {
    run_level("crash_raid10", Level::Raid10, Mode::Healthy);
}

#[test]
fn crash_raid4() {
    run_level("crash_raid4", Level::Raid4, Mode::Healthy);
}

#[test]
fn crash_raid5() {
    run_level("crash_raid5", Level::Raid5, Mode::Healthy);
}

#[test]
fn crash_raid6() {
    run_level("crash_raid6", Level::Raid6, Mode::Healthy);
}

#[test]
fn crash_raid4_with_failures_and_rebuilds() {
    run_level(
        "crash_raid4_with_failures_and_rebuilds",
        Level::Raid4,
        Mode::Failures,
    );
}

#[test]
fn crash_raid5_with_failures_and_rebuilds() {
    run_level(
        "crash_raid5_with_failures_and_rebuilds",
        Level::Raid5,
        Mode::Failures,
    );
}

#[test]
fn crash_raid6_with_failures_and_rebuilds() {
    run_level(
        "crash_raid6_with_failures_and_rebuilds",
        Level::Raid6,
        Mode::Failures,
    );
}

#[test]
fn crash_raid1_with_failures_and_rebuilds() {
    run_level(
        "crash_raid1_with_failures_and_rebuilds",
        Level::Raid1,
        Mode::Failures,
    );
}

#[test]
fn crash_raid10_with_failures_and_rebuilds() {
    run_level(
        "crash_raid10_with_failures_and_rebuilds",
        Level::Raid10,
        Mode::Failures,
    );
}

#[test]
fn crash_raid5_bitmap() {
    run_level_with(
        "crash_raid5_bitmap",
        Level::Raid5,
        Mode::Healthy,
        Policy::Bitmap,
    );
}

#[test]
fn crash_raid6_bitmap_with_failures_and_rebuilds() {
    run_level_with(
        "crash_raid6_bitmap_with_failures_and_rebuilds",
        Level::Raid6,
        Mode::Failures,
        Policy::Bitmap,
    );
}

#[test]
fn crash_raid1_bitmap_with_failures_and_rebuilds() {
    run_level_with(
        "crash_raid1_bitmap_with_failures_and_rebuilds",
        Level::Raid1,
        Mode::Failures,
        Policy::Bitmap,
    );
}

#[test]
fn crash_raid10_bitmap_with_failures_and_rebuilds() {
    run_level_with(
        "crash_raid10_bitmap_with_failures_and_rebuilds",
        Level::Raid10,
        Mode::Failures,
        Policy::Bitmap,
    );
}

#[test]
fn crash_raid10_bitmap() {
    run_level_with(
        "crash_raid10_bitmap",
        Level::Raid10,
        Mode::Healthy,
        Policy::Bitmap,
    );
}

/// Canary: a resync that skips chunks written at the crash (their bits wiped behind the
/// array's back) leaves inconsistent redundancy, and the checks above notice.
#[test]
fn bitmap_resync_canary() {
    let caught = (0..200u64).find(|&seed| {
        std::panic::catch_unwind(|| {
            crash_case_with(seed, Level::Raid5, Mode::Healthy, Policy::Bitmap, true)
        })
        .is_err()
    });
    assert!(
        caught.is_some(),
        "no case noticed a resync that skipped dirty chunks"
    );
}

#[test]
fn crash_raid5_guided() {
    run_level_with(
        "crash_raid5_guided",
        Level::Raid5,
        Mode::Healthy,
        Policy::Guided,
    );
}

#[test]
fn crash_raid6_guided_with_failures_and_rebuilds() {
    run_level_with(
        "crash_raid6_guided_with_failures_and_rebuilds",
        Level::Raid6,
        Mode::Failures,
        Policy::Guided,
    );
}

#[test]
fn crash_raid1_guided() {
    run_level_with(
        "crash_raid1_guided",
        Level::Raid1,
        Mode::Healthy,
        Policy::Guided,
    );
}

#[test]
fn crash_raid10_guided_with_failures_and_rebuilds() {
    run_level_with(
        "crash_raid10_guided_with_failures_and_rebuilds",
        Level::Raid10,
        Mode::Failures,
        Policy::Guided,
    );
}

#[test]
fn crash_raid5_guided_with_a_write_watch() {
    run_level_with(
        "crash_raid5_guided_with_a_write_watch",
        Level::Raid5,
        Mode::Healthy,
        Policy::GuidedWatched,
    );
}

#[test]
fn crash_raid6_guided_with_a_write_watch_failures_and_rebuilds() {
    run_level_with(
        "crash_raid6_guided_with_a_write_watch_failures_and_rebuilds",
        Level::Raid6,
        Mode::Failures,
        Policy::GuidedWatched,
    );
}

/// Canary: the same guide (first half only) on an array that does not run the watch leaves
/// second-half writes unsettled at the cut unverified, and the checks notice.
#[test]
fn guided_write_watch_canary() {
    let caught = (0..300u64).find(|&seed| {
        std::panic::catch_unwind(|| {
            crash_case_full(
                seed,
                Level::Raid5,
                Mode::Healthy,
                Policy::GuidedWatched,
                false,
                true,
            )
        })
        .is_err()
    });
    assert!(
        caught.is_some(),
        "no case noticed unguided writes the guide did not name"
    );
}

/// Canary: a guide that names nothing leaves the stripes written at the cut inconsistent, and
/// the checks after recovery notice.
#[test]
fn guided_resync_canary() {
    for level in [Level::Raid5, Level::Raid10] {
        let caught = (0..200u64).find(|&seed| {
            std::panic::catch_unwind(|| {
                crash_case_full(seed, level, Mode::Healthy, Policy::Guided, false, true)
            })
            .is_err()
        });
        assert!(
            caught.is_some(),
            "{level:?}: no case noticed a guide that named nothing"
        );
    }
}

/// Canary: the oracle notices one flipped parity bit behind the array's back, and the engine
/// placing data elsewhere than md would.
#[test]
fn oracle_canary() {
    let mut rng = ChaCha8Rng::seed_from_u64(9);
    for level in [Level::Raid5, Level::Raid6, Level::Raid1, Level::Raid10] {
        let mut rig = Rig::new(9, level, &mut rng);
        let array = rig.boot(&[]).expect("assemble");
        let data: Vec<u8> = (0..array.size_bytes()).map(|_| rng.gen()).collect();
        array.write(0, &data, false).expect("write");
        check_redundancy(&rig, &array, &data);
        let mut shifted = data.clone();
        shifted.rotate_left(512);
        let moved = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            check_redundancy(&rig, &array, &shifted)
        }));
        assert!(moved.is_err(), "{level:?}: oracle accepted misplaced data");
        let sb = engine::read_superblock(rig.sims[1].as_ref()).expect("sb");
        rig.sims[1].flip_bit(sb.data_offset * 512 + 100, 3);
        let flipped = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            check_redundancy(&rig, &array, &data)
        }));
        assert!(flipped.is_err(), "{level:?}: oracle accepted a flipped bit");
    }
}

#[test]
fn crash_raid4_journal() {
    run_level_with(
        "crash_raid4_journal",
        Level::Raid4,
        Mode::Healthy,
        Policy::Journal,
    );
}

#[test]
fn crash_raid5_journal_with_failures_and_rebuilds() {
    run_level_with(
        "crash_raid5_journal_with_failures_and_rebuilds",
        Level::Raid5,
        Mode::Failures,
        Policy::Journal,
    );
}

#[test]
fn crash_raid6_journal_with_failures_and_rebuilds() {
    run_level_with(
        "crash_raid6_journal_with_failures_and_rebuilds",
        Level::Raid6,
        Mode::Failures,
        Policy::Journal,
    );
}

/// The write hole itself: a cut anywhere in a workload, then a member lost (two for RAID6)
/// before the array comes back. Returns whether any flushed byte (or any byte nobody was
/// writing) read back wrong.
fn hole_case(seed: u64, level: Level, policy: Policy) -> bool {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut rig = Rig::with_policy(seed, level, policy, &mut rng);
    let mut array = rig.boot(&[]).expect("first assembly");
    let mut model = CrashModel::new(vec![0u8; array.size_bytes() as usize]);
    workload(&mut rig, &mut array, &mut model, &mut rng, Mode::Healthy);
    drop(array);
    rig.crash();
    let mut members: Vec<usize> = (0..rig.shape.members).collect();
    let lost: Vec<usize> = (0..level_tolerance(level))
        .map(|_| members.remove(rng.gen_range(0..members.len())))
        .collect();
    let array = match rig.boot(&lost) {
        // Dirty and degraded: a journal array starts because its journal replays what was in
        // flight (unless an administrator's resync was still owed).
        Ok(a) => a,
        Err(e) if policy.journal() && !e.to_string().contains("write hole") => {
            panic!("a journal array starts dirty and degraded: {e}")
        }
        Err(_) => rig.boot_with(&lost, true).expect("forced start"),
    };
    model.check(&read_all(&array)).is_err()
}

fn level_tolerance(level: Level) -> usize {
    if level == Level::Raid6 {
        2
    } else {
        1
    }
}

fn run_hole(test: &str, level: Level, policy: Policy) {
    testkit::for_each_seed!(test, Seeds::crash(), |seed| {
        assert!(
            !hole_case(seed, level, policy),
            "{test}: write-hole corruption: seed {seed} read back corrupted data after losing a member"
        )
    });
}

#[test]
fn write_hole_closed_raid4_journal() {
    run_hole(
        "write_hole_closed_raid4_journal",
        Level::Raid4,
        Policy::Journal,
    );
}

#[test]
fn write_hole_closed_raid5_journal() {
    run_hole(
        "write_hole_closed_raid5_journal",
        Level::Raid5,
        Policy::Journal,
    );
}

#[test]
fn write_hole_closed_raid6_journal() {
    run_hole(
        "write_hole_closed_raid6_journal",
        Level::Raid6,
        Policy::Journal,
    );
}

/// Canary: the same runs without a journal do meet the write hole, so the runs above could
/// see it.
#[test]
fn write_hole_canary_without_journal() {
    for level in [Level::Raid4, Level::Raid5, Level::Raid6] {
        let hits = (0..400u64)
            .filter(|&seed| {
                std::panic::catch_unwind(|| hole_case(seed, level, Policy::Resync))
                    .expect("the run itself works")
            })
            .count();
        eprintln!("{level:?} without a journal: {hits} of 400 cases corrupted");
        assert!(
            hits > 0,
            "{level:?}: no case met the write hole without a journal"
        );
    }
}

#[test]
fn write_hole_closed_raid5_journal_write_back() {
    run_hole(
        "write_hole_closed_raid5_journal_write_back",
        Level::Raid5,
        Policy::JournalWriteBack,
    );
}

#[test]
fn write_hole_closed_raid6_journal_write_back() {
    run_hole(
        "write_hole_closed_raid6_journal_write_back",
        Level::Raid6,
        Policy::JournalWriteBack,
    );
}

#[test]
fn crash_raid4_journal_write_back() {
    run_level_with(
        "crash_raid4_journal_write_back",
        Level::Raid4,
        Mode::Healthy,
        Policy::JournalWriteBack,
    );
}

#[test]
fn crash_raid5_journal_write_back_with_failures_and_rebuilds() {
    run_level_with(
        "crash_raid5_journal_write_back_with_failures_and_rebuilds",
        Level::Raid5,
        Mode::Failures,
        Policy::JournalWriteBack,
    );
}

#[test]
fn crash_raid6_journal_write_back_with_failures_and_rebuilds() {
    run_level_with(
        "crash_raid6_journal_write_back_with_failures_and_rebuilds",
        Level::Raid6,
        Mode::Failures,
        Policy::JournalWriteBack,
    );
}

#[test]
fn crash_raid4_integrity() {
    run_level_with(
        "crash_raid4_integrity",
        Level::Raid4,
        Mode::Healthy,
        Policy::ResyncIntegrity,
    );
}

#[test]
fn crash_raid5_integrity_with_failures_and_rebuilds() {
    run_level_with(
        "crash_raid5_integrity_with_failures_and_rebuilds",
        Level::Raid5,
        Mode::Failures,
        Policy::ResyncIntegrity,
    );
}

#[test]
fn crash_raid6_integrity_with_failures_and_rebuilds() {
    run_level_with(
        "crash_raid6_integrity_with_failures_and_rebuilds",
        Level::Raid6,
        Mode::Failures,
        Policy::ResyncIntegrity,
    );
}

#[test]
fn crash_raid5_bitmap_integrity() {
    run_level_with(
        "crash_raid5_bitmap_integrity",
        Level::Raid5,
        Mode::Healthy,
        Policy::BitmapIntegrity,
    );
}

#[test]
fn crash_raid6_bitmap_integrity_with_failures_and_rebuilds() {
    run_level_with(
        "crash_raid6_bitmap_integrity_with_failures_and_rebuilds",
        Level::Raid6,
        Mode::Failures,
        Policy::BitmapIntegrity,
    );
}

#[test]
fn crash_raid5_journal_integrity_with_failures_and_rebuilds() {
    run_level_with(
        "crash_raid5_journal_integrity_with_failures_and_rebuilds",
        Level::Raid5,
        Mode::Failures,
        Policy::JournalIntegrity,
    );
}

#[test]
fn crash_raid6_journal_write_back_integrity() {
    run_level_with(
        "crash_raid6_journal_write_back_integrity",
        Level::Raid6,
        Mode::Healthy,
        Policy::JournalWriteBackIntegrity,
    );
}

#[test]
fn crash_raid1_integrity_with_failures_and_rebuilds() {
    run_level_with(
        "crash_raid1_integrity_with_failures_and_rebuilds",
        Level::Raid1,
        Mode::Failures,
        Policy::ResyncIntegrity,
    );
}

#[test]
fn crash_raid10_integrity_with_failures_and_rebuilds() {
    run_level_with(
        "crash_raid10_integrity_with_failures_and_rebuilds",
        Level::Raid10,
        Mode::Failures,
        Policy::ResyncIntegrity,
    );
}

#[test]
fn crash_raid1_bitmap_integrity_with_failures_and_rebuilds() {
    run_level_with(
        "crash_raid1_bitmap_integrity_with_failures_and_rebuilds",
        Level::Raid1,
        Mode::Failures,
        Policy::BitmapIntegrity,
    );
}

#[test]
fn crash_raid10_bitmap_integrity() {
    run_level_with(
        "crash_raid10_bitmap_integrity",
        Level::Raid10,
        Mode::Healthy,
        Policy::BitmapIntegrity,
    );
}
