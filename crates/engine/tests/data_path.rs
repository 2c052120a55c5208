//! What the data path promises, observed through the simulated members' counters.

use device::{Device, SimDevice};
use layout::Level;
use simkit::{devs, sim_array};
use std::sync::Arc;

fn reads(sa: &simkit::SimArray) -> u64 {
    sa.sims.iter().map(|s| s.stats().reads).sum()
}

fn writes(sa: &simkit::SimArray) -> u64 {
    sa.sims.iter().map(|s| s.stats().writes).sum()
}

#[test]
fn full_stripe_write_issues_no_reads() {
    for (level, n) in [(Level::Raid5, 4), (Level::Raid6, 6), (Level::Raid4, 5)] {
        let sa = sim_array(level, None, n, 64 << 10, 8 << 20, 1);
        let stripe = sa.array.geometry().data_disks() as u64 * (64 << 10);
        let before = reads(&sa);
        let data = vec![0x5au8; (stripe * 3) as usize];
        sa.array.write(stripe, &data, false).unwrap();
        assert_eq!(
            reads(&sa),
            before,
            "{level:?}: full-stripe writes must not read"
        );
        let mut back = vec![0u8; data.len()];
        sa.array.read(stripe, &mut back).unwrap();
        assert!(back == data);
        simkit::check_redundancy(&sa);
    }
}

#[test]
fn small_write_takes_read_modify_write_large_partial_takes_reconstruct_write() {
    // 8 members RAID5: a 4 KiB write in one chunk reads old data + parity (2 reads) rather
    // than the 6 other data chunks.
    let sa = sim_array(Level::Raid5, None, 8, 64 << 10, 8 << 20, 2);
    let before = reads(&sa);
    sa.array.write(4096, &[1u8; 4096], false).unwrap();
    assert_eq!(reads(&sa) - before, 2, "RMW reads old data and P");
    // 6 of 7 data chunks fully written: RCW reads only the 7th.
    let before = reads(&sa);
    sa.array
        .write(0, &vec![2u8; 6 * (64 << 10)], false)
        .unwrap();
    assert_eq!(
        reads(&sa) - before,
        1,
        "RCW reads the one data chunk not overwritten"
    );
    simkit::check_redundancy(&sa);
    // RAID6 RMW reads old data, P and Q.
    let sa = sim_array(Level::Raid6, None, 8, 64 << 10, 8 << 20, 3);
    let before = reads(&sa);
    sa.array.write(8192, &[3u8; 4096], false).unwrap();
    assert_eq!(reads(&sa) - before, 3);
    simkit::check_redundancy(&sa);
}

/// A member that records where each write lands and can hold writes to one byte range until
/// released: the test's view of which member was written where, and its way to keep a stripe
/// busy (a batch in flight) for as long as it needs.
struct Probe {
    sim: Arc<SimDevice>,
    /// `(offset_bytes, len_bytes)` of every write, in order.
    writes: std::sync::Mutex<Vec<(u64, u64)>>,
    /// While `Some`, writes overlapping this range wait; `blocked` counts the waiting ones.
    gate: std::sync::Mutex<(Option<(u64, u64)>, usize)>,
    cv: std::sync::Condvar,
}

impl Probe {
    fn new(sim: Arc<SimDevice>) -> Arc<Probe> {
        Arc::new(Probe {
            sim,
            writes: Default::default(),
            gate: Default::default(),
            cv: Default::default(),
        })
    }

    fn writes_into(&self, start: u64, end: u64) -> usize {
        let w = self.writes.lock().unwrap();
        w.iter().filter(|(o, l)| *o < end && o + l > start).count()
    }

    fn close(&self, start: u64, end: u64) {
        *self.gate.lock().unwrap() = (Some((start, end)), 0);
    }

    fn open(&self) {
        self.gate.lock().unwrap().0 = None;
        self.cv.notify_all();
    }

    /// Wait until some write is held at the gate.
    fn wait_blocked(&self) {
        let g = self.gate.lock().unwrap();
        let (g, timeout) = self
            .cv
            .wait_timeout_while(g, std::time::Duration::from_secs(10), |g| g.1 == 0)
            .unwrap();
        assert!(!timeout.timed_out(), "no write reached the gate: {:?}", g.0);
    }
}

impl Device for Probe {
    fn name(&self) -> &str {
        self.sim.name()
    }
    fn len_bytes(&self) -> u64 {
        self.sim.len_bytes()
    }
    fn read_at(&self, buf: &mut [u8], offset_bytes: u64) -> std::io::Result<()> {
        self.sim.read_at(buf, offset_bytes)
    }
    fn write_at(&self, buf: &[u8], offset_bytes: u64, fua: bool) -> std::io::Result<()> {
        let end = offset_bytes + buf.len() as u64;
        self.writes
            .lock()
            .unwrap()
            .push((offset_bytes, buf.len() as u64));
        let mut g = self.gate.lock().unwrap();
        if matches!(g.0, Some((a, b)) if offset_bytes < b && end > a) {
            g.1 += 1;
            self.cv.notify_all();
            g = self.cv.wait_while(g, |g| g.0.is_some()).unwrap();
            g.1 -= 1;
        }
        drop(g);
        self.sim.write_at(buf, offset_bytes, fua)
    }
    fn flush(&self) -> std::io::Result<()> {
        self.sim.flush()
    }
    fn discard_zeroes(&self, offset_bytes: u64, len_bytes: u64) -> std::io::Result<()> {
        self.sim.discard_zeroes(offset_bytes, len_bytes)
    }
}

/// A RAID5 of `n` probed members, each `member_bytes` (with CRC32C records when `integrity`),
/// and the members' data offset in bytes.
fn probed_raid5(
    n: usize,
    chunk_bytes: u64,
    member_bytes: u64,
    integrity: bool,
    config: engine::ArrayConfig,
) -> (Vec<Arc<SimDevice>>, Vec<Arc<Probe>>, engine::Array, u64) {
    let sims: Vec<Arc<SimDevice>> = (0..n)
        .map(|i| {
            Arc::new(SimDevice::new(
                format!("sim{i}"),
                member_bytes,
                40 + i as u64,
            ))
        })
        .collect();
    let probes: Vec<Arc<Probe>> = sims.iter().map(|s| Probe::new(s.clone())).collect();
    let members: Vec<Arc<dyn Device>> = probes
        .iter()
        .map(|p| p.clone() as Arc<dyn Device>)
        .collect();
    engine::create(&engine::CreateSpec {
        integrity,
        ..simkit::clean_spec(
            "probe",
            Level::Raid5,
            None,
            chunk_bytes,
            members.clone(),
            vec![],
        )
    })
    .expect("create");
    let data_offset_bytes = engine::read_superblock(sims[0].as_ref())
        .expect("superblock")
        .data_offset
        * 512;
    let array = engine::assemble(
        members,
        engine::AssembleOptions {
            name: None,
            config,
            ..Default::default()
        },
    )
    .expect("assemble");
    (sims, probes, array, data_offset_bytes)
}

/// Four writers fill the four data chunks of one stripe at once: their pieces are merged into
/// one batch and P is written once for all of them, not once per writer.
///
/// To make "at once" deterministic, a first small write to the stripe is held at its data
/// member (the probe's gate), so the stripe is busy while the four arrive: they queue on it,
/// their leader waits for the batch in flight (and up to the write hold, long here, for the
/// stripe to fill), then takes every queued piece. P of the stripe is thus written exactly
/// twice per round: once by the held write, once for all four writers (unmerged: 1 + 4).
#[test]
fn concurrent_writes_to_one_stripe_share_one_parity_update() {
    const CHUNK: u64 = 64 << 10;
    const WRITERS: u64 = 4;
    let config = engine::ArrayConfig {
        write_hold: std::time::Duration::from_secs(2),
        stream_hold: std::time::Duration::from_secs(2),
        ..simkit::config()
    };
    let (sims, probes, array, data_offset) = probed_raid5(5, CHUNK, 16 << 20, false, config);
    let array = Arc::new(array);
    let stripe_bytes = WRITERS * CHUNK;
    // The first write marks the array dirty (a superblock write per member); get it done first.
    array.write(40 * stripe_bytes, &[0u8; 4096], false).unwrap();
    for row in 1..=5u64 {
        let roles = array.geometry().stripe_roles(row);
        // The row's bytes on every member.
        let (start, end) = (data_offset + row * CHUNK, data_offset + (row + 1) * CHUNK);
        let p_before = probes[roles.p_dev()].writes_into(start, end);
        let held = &probes[roles.data_dev(0)];
        held.close(start, end);
        let barrier = std::sync::Barrier::new(WRITERS as usize);
        std::thread::scope(|s| {
            let a = array.clone();
            s.spawn(move || a.write(row * stripe_bytes, &[0x11; 4096], false).unwrap());
            held.wait_blocked();
            for d in 0..WRITERS {
                let (a, barrier) = (array.clone(), &barrier);
                s.spawn(move || {
                    barrier.wait();
                    let data = vec![row as u8 * 16 + d as u8; CHUNK as usize];
                    a.write(row * stripe_bytes + d * CHUNK, &data, false)
                        .unwrap()
                });
            }
            // Let the writers queue behind the held batch (the long hold covers stragglers).
            std::thread::sleep(std::time::Duration::from_millis(100));
            held.open();
        });
        let p_writes = probes[roles.p_dev()].writes_into(start, end) - p_before;
        assert_eq!(
            p_writes, 2,
            "row {row}: P written {p_writes} times for 1 held write + {WRITERS} concurrent \
             writers; expected 2 (the held write's, then one shared by all {WRITERS})"
        );
        let mut back = vec![0u8; stripe_bytes as usize];
        array.read(row * stripe_bytes, &mut back).unwrap();
        for (d, chunk) in back.chunks(CHUNK as usize).enumerate() {
            assert!(
                chunk.iter().all(|&b| b == row as u8 * 16 + d as u8),
                "row {row}: data chunk {d} is not its writer's"
            );
        }
    }
    let sa = simkit::SimArray {
        sims,
        array: Arc::try_unwrap(array).ok().unwrap(),
        level: Level::Raid5,
        layout: None,
    };
    simkit::check_redundancy(&sa);
}

/// Fifteen writers send consecutive pieces of one data chunk while a batch of its stripe is in
/// flight (a sequential stream at queue depth 16): they join the stripe's next batch, which is
/// one read-modify-write or reconstruct-write for all of them, so the data member and P are
/// written once each for the fifteen (unmerged: fifteen times). With integrity records, 1 KiB
/// pieces are widened to whole 4 KiB pages before planning: still one write per member.
#[test]
fn queued_sequential_small_writes_merge_into_one_stripe_write() {
    for (piece_bytes, integrity) in [(4096u64, false), (1024, false), (1024, true)] {
        merge_case(piece_bytes, integrity);
    }
}

fn merge_case(piece_bytes: u64, integrity: bool) {
    const CHUNK: u64 = 64 << 10;
    // With the held 4 KiB, 64 KiB of 4 KiB pieces: all in data chunk 0.
    const WRITERS: u64 = 15;
    let (sims, probes, array, data_offset) =
        probed_raid5(4, CHUNK, 16 << 20, integrity, simkit::config());
    let array = Arc::new(array);
    let stripe_bytes = 3 * CHUNK;
    // The first write marks the array dirty (a superblock write per member); get it done first.
    array.write(40 * stripe_bytes, &[0u8; 4096], false).unwrap();
    let row = 2u64;
    let roles = array.geometry().stripe_roles(row);
    let (start, end) = (data_offset + row * CHUNK, data_offset + (row + 1) * CHUNK);
    let (p_before, d_before) = (
        probes[roles.p_dev()].writes_into(start, end),
        probes[roles.data_dev(0)].writes_into(start, end),
    );
    let held = &probes[roles.data_dev(0)];
    held.close(start, end);
    let base = row * stripe_bytes;
    std::thread::scope(|s| {
        let a = array.clone();
        s.spawn(move || a.write(base, &[0xee; 4096], false).unwrap());
        held.wait_blocked();
        for i in 0..WRITERS {
            let a = array.clone();
            s.spawn(move || {
                let at = base + 4096 + i * piece_bytes;
                a.write(at, &vec![i as u8 + 1; piece_bytes as usize], false)
                    .unwrap()
            });
        }
        // Let every writer queue behind the held batch.
        std::thread::sleep(std::time::Duration::from_millis(100));
        held.open();
    });
    let p_writes = probes[roles.p_dev()].writes_into(start, end) - p_before;
    let d_writes = probes[roles.data_dev(0)].writes_into(start, end) - d_before;
    let case = format!("{piece_bytes}-byte pieces, integrity {integrity}");
    assert_eq!(
        (p_writes, d_writes),
        (2, 2),
        "{case}: (P, data) written ({p_writes}, {d_writes}) times for 1 held write + \
         {WRITERS} queued writers; expected (2, 2): the held write's, then one merged batch"
    );
    let mut back = vec![0u8; (4096 + WRITERS * piece_bytes) as usize];
    array.read(base, &mut back).unwrap();
    assert!(
        back[..4096].iter().all(|&b| b == 0xee),
        "{case}: held write"
    );
    for (i, piece) in back[4096..].chunks(piece_bytes as usize).enumerate() {
        assert!(
            piece.iter().all(|&b| b == i as u8 + 1),
            "{case}: piece {i} is not its writer's"
        );
    }
    let sa = simkit::SimArray {
        sims,
        array: Arc::try_unwrap(array).ok().unwrap(),
        level: Level::Raid5,
        layout: None,
    };
    simkit::check_redundancy(&sa);
}

/// A frontend's gathered run (the WRITEs of a sequential stream that arrived together, see
/// `Array::write_gathered`) is placed whole before any stripe is written: sixteen 4 KiB writes
/// into one data chunk write that chunk and P once each (one after the other, sixteen times),
/// with no thread besides the caller's. A write of the run that is refused gets its own error
/// and the others still land; 1 KiB writes are a run too.
#[test]
fn a_gathered_run_is_one_stripe_write() {
    const CHUNK: u64 = 64 << 10;
    for piece_bytes in [4096u64, 1024] {
        let (sims, probes, array, data_offset) =
            probed_raid5(4, CHUNK, 16 << 20, false, simkit::config());
        let array = Arc::new(array);
        let stripe_bytes = 3 * CHUNK;
        array.write(40 * stripe_bytes, &[0u8; 4096], false).unwrap();
        let row = 2u64;
        let roles = array.geometry().stripe_roles(row);
        let (start, end) = (data_offset + row * CHUNK, data_offset + (row + 1) * CHUNK);
        let before = (
            probes[roles.p_dev()].writes_into(start, end),
            probes[roles.data_dev(0)].writes_into(start, end),
        );
        let base = row * stripe_bytes;
        let datas: Vec<Vec<u8>> = (0..16u8)
            .map(|i| vec![i + 1; piece_bytes as usize])
            .collect();
        let mut run: Vec<engine::GatheredWrite<'_>> = datas
            .iter()
            .enumerate()
            .map(|(i, d)| {
                let at = base + i as u64 * piece_bytes;
                engine::GatheredWrite {
                    offset_bytes: at,
                    data: d,
                    fua: false,
                    // Announced or not, as a frontend may do either.
                    intent: (i % 2 == 0).then(|| array.intend_write(at, piece_bytes)),
                }
            })
            .collect();
        // Refused: not whole sectors.
        let odd = [9u8; 100];
        run.insert(
            5,
            engine::GatheredWrite {
                offset_bytes: base + 16 * piece_bytes,
                data: &odd,
                fua: false,
                intent: Some(array.intend_write(base + 16 * piece_bytes, 100)),
            },
        );
        let results = array.write_gathered(run);
        let case = format!("{piece_bytes}-byte writes");
        assert_eq!(results.len(), 17, "{case}: one result per write");
        for (i, r) in results.iter().enumerate() {
            assert_eq!(r.is_err(), i == 5, "{case}: write {i}: {r:?}");
        }
        let written = (
            probes[roles.p_dev()].writes_into(start, end) - before.0,
            probes[roles.data_dev(0)].writes_into(start, end) - before.1,
        );
        assert_eq!(
            written,
            (1, 1),
            "{case}: (P, data) written {written:?} times for a run of 16; expected once each"
        );
        let mut back = vec![0u8; 16 * piece_bytes as usize];
        array.read(base, &mut back).unwrap();
        for (i, piece) in back.chunks(piece_bytes as usize).enumerate() {
            assert!(
                piece.iter().all(|&b| b == i as u8 + 1),
                "{case}: write {i} is not its own"
            );
        }
        let sa = simkit::SimArray {
            sims,
            array: Arc::try_unwrap(array).ok().unwrap(),
            level: Level::Raid5,
            layout: None,
        };
        simkit::check_redundancy(&sa);
    }
}

/// The write hold is an upper bound, not a timer: sequential sub-stripe streams with other
/// writes in flight (which cannot fill their stripes) finish long before one hold would pass.
#[test]
fn small_writes_do_not_wait_for_the_hold() {
    const HOLD: std::time::Duration = std::time::Duration::from_secs(5);
    let config = engine::ArrayConfig {
        write_hold: HOLD,
        ..simkit::config()
    };
    let sa = simkit::sim_array_with(Level::Raid5, None, 4, 64 << 10, 16 << 20, 9, config);
    let started = std::time::Instant::now();
    std::thread::scope(|s| {
        for stream in 0..4u64 {
            let a = &sa.array;
            s.spawn(move || {
                for i in 0..8u64 {
                    let at = stream * (1 << 20) + i * 4096;
                    a.write(at, &[stream as u8 + 1; 4096], false).unwrap();
                }
            });
        }
    });
    let took = started.elapsed();
    assert!(
        took < HOLD / 2,
        "4 streams of 8 sequential 4 KiB writes took {took:?} with a {HOLD:?} hold"
    );
    simkit::check_redundancy(&sa);
}

/// The write hold of the announce tests: long enough that a leader waiting for it fails them.
const LONG_HOLD: std::time::Duration = std::time::Duration::from_secs(10);

/// A RAID5 ×4 of 64 KiB chunks with a `LONG_HOLD` write hold, and one of its rows: where it
/// begins in the array, and how often P has been written there since the rig was made.
struct HeldRow {
    _sims: Vec<Arc<SimDevice>>,
    probes: Vec<Arc<Probe>>,
    array: Arc<engine::Array>,
    base: u64,
    p_dev: usize,
    p_range: (u64, u64),
    p_before: usize,
}

impl HeldRow {
    fn new(row: u64) -> HeldRow {
        HeldRow::with(
            row,
            engine::ArrayConfig {
                write_hold: LONG_HOLD,
                stream_hold: LONG_HOLD,
                ..simkit::config()
            },
        )
    }

    fn with(row: u64, config: engine::ArrayConfig) -> HeldRow {
        const CHUNK: u64 = 64 << 10;
        let (sims, probes, array, data_offset) = probed_raid5(4, CHUNK, 16 << 20, false, config);
        let array = Arc::new(array);
        let stripe_bytes = 3 * CHUNK;
        array.write(40 * stripe_bytes, &[0u8; 4096], false).unwrap();
        let p_dev = array.geometry().stripe_roles(row).p_dev();
        let p_range = (data_offset + row * CHUNK, data_offset + (row + 1) * CHUNK);
        let p_before = probes[p_dev].writes_into(p_range.0, p_range.1);
        HeldRow {
            _sims: sims,
            probes,
            array,
            base: row * stripe_bytes,
            p_dev,
            p_range,
            p_before,
        }
    }

    fn p_writes(&self) -> usize {
        self.probes[self.p_dev].writes_into(self.p_range.0, self.p_range.1) - self.p_before
    }
}

/// A write announced before its data has arrived (a frontend still receiving the payload, see
/// `WriteIntent`) holds a leader that claims its stripe meanwhile: the two writes go out as
/// one batch, P written once. An intent dropped unused lets the leader go at once.
#[test]
fn an_announced_write_joins_the_batch_it_was_announced_to() {
    let r = HeldRow::new(2);
    let (array, base) = (&r.array, r.base);
    let waits_for = |intent: engine::WriteIntent, use_it: bool| {
        let started = std::time::Instant::now();
        std::thread::scope(|s| {
            let a = array.clone();
            let leader = s.spawn(move || a.write(base, &[1; 4096], false).unwrap());
            std::thread::sleep(std::time::Duration::from_millis(100));
            assert!(
                !leader.is_finished(),
                "the stripe's leader went without the announced write"
            );
            if use_it {
                array.write_intended(intent, &[2; 4096], false).unwrap();
            } else {
                drop(intent);
            }
            leader.join().unwrap();
        });
        assert!(
            started.elapsed() < LONG_HOLD / 2,
            "the leader waited for the hold"
        );
    };
    waits_for(array.intend_write(base + 4096, 4096), true);
    let p_writes = r.p_writes();
    assert_eq!(
        p_writes, 1,
        "P written {p_writes} times for a write and an announced one"
    );
    let mut back = vec![0u8; 8192];
    array.read(base, &mut back).unwrap();
    assert!(back[..4096].iter().all(|&b| b == 1) && back[4096..].iter().all(|&b| b == 2));
    waits_for(array.intend_write(base + 4096, 4096), false);
}

/// A write announced while a leader already waits joins its batch too (a stream announces each
/// write while the one before is placed): the leader goes once no announced writer is left,
/// with all three writes in one batch, P written once.
#[test]
fn a_write_announced_while_the_leader_waits_joins_the_batch() {
    let r = HeldRow::new(3);
    let (array, base) = (&r.array, r.base);
    let pause = || std::thread::sleep(std::time::Duration::from_millis(100));
    let started = std::time::Instant::now();
    std::thread::scope(|s| {
        let first = array.intend_write(base + 4096, 4096);
        let a = array.clone();
        let leader = s.spawn(move || a.write(base, &[1; 4096], false).unwrap());
        pause();
        let second = array.intend_write(base + 8192, 4096);
        let a = array.clone();
        let placed = s.spawn(move || a.write_intended(first, &[2; 4096], false).unwrap());
        pause();
        assert!(
            !leader.is_finished(),
            "the leader went without the write announced while it waited"
        );
        array.write_intended(second, &[3; 4096], false).unwrap();
        leader.join().unwrap();
        placed.join().unwrap();
    });
    assert!(
        started.elapsed() < LONG_HOLD / 2,
        "the leader waited for the hold"
    );
    let p_writes = r.p_writes();
    assert_eq!(p_writes, 1, "P written {p_writes} times for one batch");
    let mut back = vec![0u8; 3 * 4096];
    array.read(base, &mut back).unwrap();
    for (i, piece) in back.chunks(4096).enumerate() {
        assert!(piece.iter().all(|&b| b == i as u8 + 1), "piece {i}");
    }
}

/// A stripe that holds a whole chunk (a stream's) waits for its announced writers up to the
/// stream hold, one of small pieces only up to the write hold: a stream's rest is worth waiting
/// for (it spares reading it), a random neighbour's is not.
#[test]
fn a_stripe_holding_a_whole_chunk_waits_longer_for_its_announced_writers() {
    const SHORT: std::time::Duration = std::time::Duration::from_millis(20);
    let config = engine::ArrayConfig {
        write_hold: SHORT,
        stream_hold: LONG_HOLD,
        ..simkit::config()
    };
    for (row, first_len, waits) in [(2u64, 64usize << 10, true), (3, 4096, false)] {
        let r = HeldRow::with(row, config.clone());
        let (array, base) = (&r.array, r.base);
        let started = std::time::Instant::now();
        std::thread::scope(|s| {
            let intent = array.intend_write(base + (64 << 10), 4096);
            let a = array.clone();
            let leader = s.spawn(move || a.write(base, &vec![1; first_len], false).unwrap());
            std::thread::sleep(SHORT * 10);
            assert_eq!(
                !leader.is_finished(),
                waits,
                "a stripe holding {first_len} bytes: the leader {} past the write hold",
                if waits { "went" } else { "still waited" }
            );
            array.write_intended(intent, &[2; 4096], false).unwrap();
            leader.join().unwrap();
        });
        assert!(
            started.elapsed() < LONG_HOLD / 2,
            "the leader waited for the stream hold"
        );
        let p_writes = r.p_writes();
        assert_eq!(
            p_writes,
            if waits { 1 } else { 2 },
            "P written {p_writes} times (first write of {first_len} bytes)"
        );
    }
}

#[test]
fn healthy_reads_go_straight_to_one_member() {
    let sa = sim_array(Level::Raid6, None, 6, 64 << 10, 8 << 20, 5);
    let (reads_before, writes_before) = (reads(&sa), writes(&sa));
    let mut buf = vec![0u8; 8192];
    sa.array.read(4096, &mut buf).unwrap();
    assert_eq!(reads(&sa) - reads_before, 1, "one member read");
    assert_eq!(
        writes(&sa),
        writes_before,
        "a read writes nothing (not even a superblock)"
    );
}

#[test]
fn raid6_survives_any_two_failures_including_p_and_q() {
    let n = 6;
    for a in 0..n {
        for b in a + 1..n {
            let sa = sim_array(
                Level::Raid6,
                None,
                n,
                16 << 10,
                4 << 20,
                100 + (a * n + b) as u64,
            );
            let size = sa.array.size_bytes() as usize;
            let data: Vec<u8> = (0..size).map(|i| (i * 7 + i / 4096) as u8).collect();
            sa.array.write(0, &data, false).unwrap();
            sa.sims[a].set_dead(true);
            sa.sims[b].set_dead(true);
            let mut back = vec![0u8; size];
            sa.array
                .read(0, &mut back)
                .unwrap_or_else(|e| panic!("lost {a},{b}: {e}"));
            assert!(back == data, "lost {a},{b}: wrong data");
            // Degraded writes keep working and read back.
            sa.array.write(4096, &[9u8; 65536], false).unwrap();
            let mut small = vec![0u8; 65536];
            sa.array.read(4096, &mut small).unwrap();
            assert!(small.iter().all(|&x| x == 9));
            let st = sa.array.status();
            assert_eq!(st.missing_roles, vec![a, b]);
            // A third failure: the array refuses rather than return wrong data.
            let c = (0..n).find(|x| *x != a && *x != b).unwrap();
            sa.sims[c].set_dead(true);
            let mut buf = vec![0u8; size];
            assert!(
                sa.array.read(0, &mut buf).is_err(),
                "three lost members must give an error"
            );
        }
    }
}

#[test]
fn member_failure_is_recorded_in_survivors_superblocks() {
    let sa = sim_array(Level::Raid5, None, 4, 64 << 10, 8 << 20, 6);
    sa.array.write(0, &[1u8; 4096], false).unwrap();
    let ev0 = engine::read_superblock(sa.sims[0].as_ref()).unwrap().events;
    sa.sims[2].set_dead(true);
    let mut buf = vec![0u8; 1 << 20];
    sa.array.read(0, &mut buf).unwrap();
    for (i, s) in sa.sims.iter().enumerate().filter(|(i, _)| *i != 2) {
        let sb = engine::read_superblock(s.as_ref()).unwrap();
        assert!(sb.events > ev0, "member {i}: events not bumped");
        assert_eq!(
            sb.role_of(2),
            format::DevRole::Faulty,
            "member {i} does not record the failure"
        );
    }
    // After a clean stop, reassembly leaves the faulty member out and runs degraded (a dirty,
    // degraded RAID5 would be refused: see the assembly tests).
    sa.sims[2].set_dead(false);
    sa.array.close().unwrap();
    drop(sa.array);
    let again = simkit::reassemble(&sa.sims).unwrap();
    assert_eq!(again.status().missing_roles, vec![2]);
}

#[test]
fn assembly_refuses_bad_members_with_their_name() {
    let sa = sim_array(Level::Raid5, None, 4, 64 << 10, 8 << 20, 7);
    drop(sa.array);
    // Another array's member.
    let other = sim_array(Level::Raid5, None, 4, 64 << 10, 8 << 20, 8);
    let mut mixed = devs(&sa.sims[..3]);
    let stranger: Arc<dyn Device> = other.sims[3].clone();
    mixed.push(stranger);
    let err = engine::assemble(mixed, Default::default())
        .err()
        .expect("mixed arrays must be refused")
        .to_string();
    assert!(
        err.contains("sim3") && err.contains("belongs to array"),
        "{err}"
    );
    // A flipped bit in a superblock.
    sa.sims[1].flip_bit(4096 + 100, 3);
    let err = engine::assemble(devs(&sa.sims), Default::default())
        .err()
        .expect("bad checksum refused")
        .to_string();
    assert!(err.contains("sim1"), "{err}");
    sa.sims[1].flip_bit(4096 + 100, 3);
    // Too few members.
    let err = engine::assemble(devs(&sa.sims[..2]), Default::default())
        .err()
        .expect("too few")
        .to_string();
    assert!(err.contains("too few"), "{err}");
    // An empty device.
    let blank: Arc<dyn Device> = Arc::new(SimDevice::new("blank", 8 << 20, 9));
    let err = engine::assemble(vec![blank], Default::default())
        .err()
        .expect("no sb")
        .to_string();
    assert!(err.contains("blank"), "{err}");
}

#[test]
fn stale_member_is_not_read_as_current() {
    let sa = sim_array(Level::Raid1, None, 2, 0, 4 << 20, 10);
    sa.array.write(0, &[1u8; 4096], false).unwrap();
    let snapshot = sa.sims[1].contents();
    // Fail member 1, write new data, close.
    sa.sims[1].set_dead(true);
    sa.array.write(0, &[2u8; 4096], false).unwrap();
    sa.array.close().unwrap();
    drop(sa.array);
    // Member 1 comes back with its old image (older events): it must be left out.
    sa.sims[1].set_dead(false);
    sa.sims[1].scribble(0, &snapshot);
    let again = simkit::reassemble(&sa.sims).unwrap();
    for _ in 0..8 {
        let mut buf = vec![0u8; 4096];
        again.read(0, &mut buf).unwrap();
        assert!(buf.iter().all(|&b| b == 2), "stale data served");
    }
}

#[test]
fn create_refuses_members_already_in_an_array() {
    let sa = sim_array(Level::Raid1, None, 2, 0, 4 << 20, 11);
    let err = engine::create(&simkit::clean_spec(
        "again",
        Level::Raid1,
        None,
        0,
        devs(&sa.sims),
        vec![],
    ))
    .expect_err("refused")
    .to_string();
    assert!(err.contains("sim0") && err.contains("--force"), "{err}");
}
