//! The raid5-cache journal on simulated devices: its ring wraps and is reclaimed under
//! concurrent writers, a lost log device turns the array read-only without losing data, and
//! a missing one is replaced or dropped explicitly.

use device::{Device, SimDevice};
use engine::{assemble, Array, ArrayConfig, AssembleOptions, CreateSpec, EngineError};
use layout::Level;
use simkit::devs;
use std::sync::Arc;

const MEMBER_BYTES: u64 = 8 << 20;
const CHUNK: u64 = 64 << 10;

struct Rig {
    members: Vec<Arc<SimDevice>>,
    log: Arc<SimDevice>,
}

impl Rig {
    fn new(level: Level, n: usize, log_bytes: u64) -> Rig {
        let members: Vec<Arc<SimDevice>> = (0..n)
            .map(|i| Arc::new(SimDevice::new(format!("m{i}"), MEMBER_BYTES, i as u64)))
            .collect();
        let log = Arc::new(SimDevice::new("log", log_bytes, 99));
        engine::create(&CreateSpec {
            journal: Some(log.clone()),
            ..simkit::clean_spec("j", level, None, CHUNK, devs(&members), vec![])
        })
        .expect("create with a journal");
        Rig { members, log }
    }

    fn all(&self) -> Vec<Arc<dyn Device>> {
        let mut d = devs(&self.members);
        d.push(self.log.clone());
        d
    }

    /// Stop `array` without a clean stop and lose every unflushed write of every device, as
    /// a power cut would.
    fn power_cut(&self, array: Array) {
        drop(array);
        self.cut_devices();
    }

    /// Power off every device: what was not flushed is lost, kept or torn.
    fn cut_devices(&self) {
        for m in &self.members {
            m.power_cut();
        }
        self.log.power_cut();
    }

    fn boot(&self, devs: Vec<Arc<dyn Device>>, opts: AssembleOptions) -> engine::Result<Array> {
        assemble(
            devs,
            AssembleOptions {
                config: ArrayConfig {
                    io_threads: 4,
                    ..ArrayConfig::default()
                },
                ..opts
            },
        )
    }
}

fn pattern(seed: u64, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (seed.wrapping_mul(0x9e37_79b9) as usize ^ i.wrapping_mul(31)) as u8)
        .collect()
}

fn read(a: &Array, off: u64, len: usize) -> Vec<u8> {
    let mut b = vec![0u8; len];
    a.read(off, &mut b).expect("read");
    b
}

#[test]
fn ring_wraps_and_is_reclaimed_under_concurrent_writers() {
    // A 2 MiB ring (after the 1 MiB data offset) and 8 threads writing 24 MiB between them.
    let rig = Rig::new(Level::Raid6, 5, 3 << 20);
    let array = Arc::new(
        rig.boot(rig.all(), AssembleOptions::default())
            .expect("assemble"),
    );
    let size = array.size_bytes();
    // Each thread owns a region and keeps its own model of it.
    let region = size / 8 / 4096 * 4096;
    let threads: Vec<_> = (0..8u64)
        .map(|t| {
            let a = array.clone();
            std::thread::spawn(move || {
                let mut model = vec![0u8; region as usize];
                for i in 0..48u64 {
                    let len = 512 * (1 + (i * 7 + t) % 128) as usize;
                    let at = ((i * 65_537 + t * 4099) * 512) % (region - len as u64);
                    let data = pattern(t * 100 + i, len);
                    a.write(t * region + at, &data, i % 5 == 0).expect("write");
                    model[at as usize..at as usize + len].copy_from_slice(&data);
                }
                assert!(
                    read(&a, t * region, region as usize) == model,
                    "thread {t}: region differs from what it wrote"
                );
            })
        })
        .collect();
    for t in threads {
        t.join().expect("writer");
    }
    let j = array.status().journal.expect("journal status");
    assert!(j.reclaims > 0, "a 2 MiB ring took 24 MiB without a reclaim");
    assert!(j.used_bytes < j.log_bytes);
    assert!(j.flushes > 0);
    let image = read(&array, 0, size as usize);
    array.close().expect("clean stop");
    drop(array);
    let again = rig
        .boot(rig.all(), AssembleOptions::default())
        .expect("reassemble");
    let r = again.status().journal.expect("journal").replayed;
    assert!(
        r.units <= 1,
        "a clean stop leaves only the newest unit to replay, not {}",
        r.units
    );
    assert!(
        read(&again, 0, size as usize) == image,
        "data changed across a clean stop"
    );
    common_check_parity(&again);
}

/// Parity agrees with data everywhere (scrub finds nothing).
fn common_check_parity(a: &Array) {
    a.request_action("check").expect("check");
    while a.sync_step() != engine::SyncAction::Idle {}
    assert_eq!(a.status().sync.mismatch_sectors, 0, "parity disagrees");
}

#[test]
fn data_in_the_log_survives_a_crash_before_it_reached_the_members() {
    let rig = Rig::new(Level::Raid5, 4, 4 << 20);
    let array = rig
        .boot(rig.all(), AssembleOptions::default())
        .expect("assemble");
    let data = pattern(7, 192 << 10);
    array.write(3 << 20, &data, false).expect("write");
    array.flush().expect("flush");
    // The flush needed no member flush: the log holds the write. Lose every unflushed member
    // write, as a power cut would.
    rig.power_cut(array);
    let again = rig
        .boot(rig.all(), AssembleOptions::default())
        .expect("reassemble");
    let r = again.status().journal.expect("journal").replayed;
    assert!(r.pages > 0, "nothing replayed");
    assert!(
        read(&again, 3 << 20, data.len()) == data,
        "flushed write lost"
    );
    common_check_parity(&again);
}

/// A whole stripe logs its data only. Lost from the members in a crash, it comes back from
/// the log with the parity assembly computes (written home at once, not kept in the
/// write-back cache), and a later partial write of the same stripe, logged with its parity,
/// wins where it overlaps. RAID5 and RAID6.
#[test]
fn whole_stripes_logged_without_parity_come_home_with_computed_parity() {
    for (level, n, data_disks) in [(Level::Raid5, 4, 3), (Level::Raid6, 6, 4)] {
        let rig = Rig::new(level, n, 4 << 20);
        let array = rig
            .boot(rig.all(), AssembleOptions::default())
            .expect("assemble");
        let stripe = data_disks * CHUNK;
        let mut want = pattern(11, 2 * stripe as usize);
        array
            .write(3 * stripe, &want, false)
            .expect("whole stripes");
        let small = pattern(12, 4096);
        let at = CHUNK as usize + 8192;
        array
            .write(3 * stripe + at as u64, &small, false)
            .expect("a partial write into them");
        want[at..at + small.len()].copy_from_slice(&small);
        array.flush().expect("flush");
        let logged = array.status().journal.expect("journal").logged_bytes;
        assert!(
            logged < 2 * stripe + CHUNK,
            "{level:?}: {logged} bytes logged: parity of the whole stripes was logged"
        );
        rig.power_cut(array);
        let again = rig
            .boot(rig.all(), AssembleOptions::default())
            .expect("reassemble");
        let j = again.status().journal.expect("journal");
        assert_eq!(j.replayed.data_only_pages, 0, "{level:?}: {j:?}");
        assert_eq!(j.cache_bytes, 0, "{level:?}: nothing waits in the cache");
        assert!(
            read(&again, 3 * stripe, want.len()) == want,
            "{level:?}: flushed writes lost"
        );
        common_check_parity(&again);
    }
}

/// Replay writes the log home through the commit point: a member that cannot take them fails
/// the way any member write error fails it (recorded in the survivors' superblocks), and the
/// array starts degraded with everything the log held, instead of refusing to start.
#[test]
fn a_member_that_fails_under_the_replay_is_failed_and_the_array_starts() {
    let rig = Rig::new(Level::Raid5, 4, 4 << 20);
    let array = rig
        .boot(rig.all(), AssembleOptions::default())
        .expect("assemble");
    let data = pattern(11, 192 << 10);
    array.write(3 << 20, &data, false).expect("write");
    array.flush().expect("flush");
    rig.power_cut(array);
    rig.members[1].set_faults(device::Faults {
        write_error: 1.0,
        ..device::Faults::default()
    });
    let again = rig
        .boot(rig.all(), AssembleOptions::default())
        .expect("starts degraded: the member that cannot be written is failed");
    let st = again.status();
    assert!(
        st.journal.expect("journal").replayed.pages > 0,
        "nothing replayed"
    );
    assert!(
        st.members
            .iter()
            .any(|m| m.name == "m1" && m.state == engine::MemberState::Faulty),
        "{:?}",
        st.members
    );
    assert!(
        read(&again, 3 << 20, data.len()) == data,
        "flushed write lost"
    );
    drop(again);
    rig.members[1].set_faults(device::Faults::default());
    let sb = engine::read_superblock(rig.members[0].as_ref()).expect("sb");
    assert_eq!(
        sb.dev_roles[1],
        format::ROLE_FAULTY,
        "the failure is recorded in the survivors' superblocks"
    );
}

/// Dropping a journal whose log still holds acknowledged writes replays it first (through the
/// array's commit point), and only then does the role table forget it.
#[test]
fn a_dropped_log_is_replayed_before_the_table_forgets_it() {
    let rig = Rig::new(Level::Raid6, 5, 4 << 20);
    let array = rig
        .boot(rig.all(), AssembleOptions::default())
        .expect("assemble");
    let data = pattern(13, 320 << 10);
    array.write(1 << 20, &data, false).expect("write");
    array.flush().expect("flush");
    rig.power_cut(array);
    let dropped = rig
        .boot(
            rig.all(),
            AssembleOptions {
                drop_journal: true,
                ..AssembleOptions::default()
            },
        )
        .expect("drop the journal");
    assert_eq!(dropped.status().consistency_policy, "resync");
    assert!(
        read(&dropped, 1 << 20, data.len()) == data,
        "the dropped log's writes are lost"
    );
    while dropped.sync_step() != engine::SyncAction::Idle {}
    assert!(read(&dropped, 1 << 20, data.len()) == data);
    common_check_parity(&dropped);
    dropped.close().expect("clean stop");
    drop(dropped);
    let sb = engine::read_superblock(rig.members[0].as_ref()).expect("sb");
    assert_eq!(sb.feature_map & format::feature::JOURNAL, 0);
    assert!(!sb.dev_roles.contains(&format::ROLE_JOURNAL));
}

#[test]
fn a_failed_log_device_turns_the_array_read_only_and_loses_nothing() {
    let rig = Rig::new(Level::Raid5, 4, 4 << 20);
    let array = rig
        .boot(rig.all(), AssembleOptions::default())
        .expect("assemble");
    let data = pattern(3, 256 << 10);
    array.write(0, &data, false).expect("write");
    rig.log.set_dead(true);
    match array.write(1 << 20, &pattern(4, 4096), false) {
        Err(EngineError::ReadOnly { reason, .. }) => assert!(reason.contains("journal")),
        other => panic!("write after the log died: {other:?}"),
    }
    assert!(read(&array, 0, data.len()) == data, "reads must go on");
    assert!(
        read(&array, 1 << 20, 4096).iter().all(|&b| b == 0),
        "the refused write must not have reached the members"
    );
    let st = array.status();
    assert!(st.read_only);
    assert!(st.journal.expect("journal").failed.is_some());
    assert!(st
        .members
        .iter()
        .any(|m| m.name == "log" && m.state == engine::MemberState::Faulty));
    array.close().expect("clean stop");
    drop(array);
    rig.log.set_dead(false);

    // The superblocks record the journal faulty: the array starts read-only, as md does.
    let ro = rig
        .boot(rig.all(), AssembleOptions::default())
        .expect("starts read-only");
    assert!(ro.is_read_only());
    let why = ro.status().read_only_reason.expect("a reason");
    assert!(why.contains("journal"), "{why}");
    assert!(read(&ro, 0, data.len()) == data);
    drop(ro);

    // Dropping the journal: writable again, with a full resync.
    let dropped = rig
        .boot(
            devs(&rig.members),
            AssembleOptions {
                drop_journal: true,
                ..AssembleOptions::default()
            },
        )
        .expect("drop the journal");
    assert!(!dropped.is_read_only());
    assert_eq!(dropped.status().consistency_policy, "resync");
    dropped
        .write(1 << 20, &pattern(5, 4096), false)
        .expect("write");
    while dropped.sync_step() != engine::SyncAction::Idle {}
    assert!(read(&dropped, 0, data.len()) == data);
    dropped.close().expect("clean stop");
    drop(dropped);
    let sb = engine::read_superblock(rig.members[0].as_ref()).expect("sb");
    assert_eq!(sb.feature_map & format::feature::JOURNAL, 0);
}

#[test]
fn a_missing_log_device_is_replaced_by_a_new_journal() {
    let rig = Rig::new(Level::Raid6, 5, 4 << 20);
    let array = rig
        .boot(rig.all(), AssembleOptions::default())
        .expect("assemble");
    let data = pattern(9, 512 << 10);
    array.write(64 << 10, &data, true).expect("write");
    array.close().expect("clean stop");
    drop(array);

    let ro = rig
        .boot(devs(&rig.members), AssembleOptions::default())
        .expect("starts read-only without its journal");
    assert!(ro.is_read_only());
    assert!(matches!(
        ro.write(0, &[0u8; 4096], false),
        Err(EngineError::ReadOnly { .. })
    ));
    drop(ro);

    let new_log = Arc::new(SimDevice::new("log2", 4 << 20, 5));
    let array = rig
        .boot(
            devs(&rig.members),
            AssembleOptions {
                add_journal: Some(new_log.clone()),
                ..AssembleOptions::default()
            },
        )
        .expect("add a journal");
    assert_eq!(array.status().consistency_policy, "journal");
    let more = pattern(10, 64 << 10);
    array
        .write(0, &more, false)
        .expect("write with the new journal");
    while array.sync_step() != engine::SyncAction::Idle {}
    array.close().expect("clean stop");
    drop(array);
    let sb = engine::read_superblock(new_log.as_ref()).expect("new journal sb");
    assert_eq!(sb.role(), format::DevRole::Journal);
    let mut with_new = devs(&rig.members);
    with_new.push(new_log);
    let again = rig
        .boot(with_new, AssembleOptions::default())
        .expect("assemble with the new journal");
    assert!(!again.is_read_only());
    assert!(read(&again, 0, more.len()) == more);
    assert!(read(&again, 64 << 10, data.len()) == data);
    common_check_parity(&again);
}

/// A log md's write-back mode could leave: a data page without parity after the chain's last
/// unit. Assembly logs it again at the start of the new chain and keeps it cached (reads see
/// it at once), and a stop writes it home with its parity.
#[test]
fn data_logged_without_parity_is_kept_and_written_home() {
    let rig = Rig::new(Level::Raid5, 4, 4 << 20);
    let array = rig
        .boot(rig.all(), AssembleOptions::default())
        .expect("assemble");
    array.write(0, &pattern(1, 64 << 10), false).expect("write");
    let uuid = array.uuid();
    array.close().expect("clean stop");
    drop(array);

    let sb = engine::read_superblock(rig.log.as_ref()).expect("journal sb");
    let base = sb.data_offset * 512;
    let seed = format::journal_seed(&uuid);
    let mut block = device::AlignedBuf::zeroed(4096);
    rig.log
        .read_at(&mut block, base + sb.recovery_offset * 512)
        .expect("read the tail");
    let tail = format::MetaBlock::decode(&block, seed, sb.recovery_offset).expect("tail block");
    let page = pattern(2, 4096);
    let at_sector = 5 * 8; // array byte 20480
    let unit = format::MetaBlock {
        seq: tail.seq + 1,
        position: tail.position + tail.unit_sectors(),
        payloads: vec![format::Payload::Data {
            location: at_sector,
            checksums: format::PageChecksums::from_slice(&[format::crc32c_raw(seed, &page)]),
        }],
    };
    let mut bytes = unit.encode(seed).to_vec();
    bytes.extend_from_slice(&page);
    rig.log
        .write_at(
            &device::AlignedBuf::copy_from(&bytes),
            base + unit.position * 512,
            true,
        )
        .expect("write the unit");

    let again = rig
        .boot(rig.all(), AssembleOptions::default())
        .expect("reassemble");
    let j = again.status().journal.expect("journal");
    assert_eq!(j.replayed.data_only_pages, 1);
    assert_eq!(j.cache_bytes, 4096, "the page waits in the cache");
    assert!(
        read(&again, at_sector * 512, 4096) == page,
        "reads see the cached page"
    );
    let sb = engine::read_superblock(rig.log.as_ref()).expect("journal sb");
    assert!(
        sb.recovery_offset != tail.position,
        "once logged again, the old chain is let go"
    );
    again.close().expect("clean stop");
    drop(again);
    let last = rig
        .boot(rig.all(), AssembleOptions::default())
        .expect("reassemble");
    assert_eq!(last.status().journal.expect("journal").cache_bytes, 0);
    assert!(
        read(&last, at_sector * 512, 4096) == page,
        "page not written home"
    );
    common_check_parity(&last);
}

/// A member whose writes can be held at a gate (to stop a write-out between its log write and
/// its member writes).
struct Gated {
    inner: Arc<SimDevice>,
    gate: Arc<Gate>,
}

#[derive(Default)]
struct Gate {
    /// (closed, writes waiting at it)
    st: parking_lot::Mutex<(bool, usize)>,
    cv: parking_lot::Condvar,
}

impl Gate {
    fn set(&self, closed: bool) {
        self.st.lock().0 = closed;
        self.cv.notify_all();
    }

    fn pass(&self) {
        let mut st = self.st.lock();
        st.1 += 1;
        self.cv.notify_all();
        while st.0 {
            self.cv.wait(&mut st);
        }
        st.1 -= 1;
    }

    /// Wait until a write is held at the gate.
    fn await_held(&self) {
        let mut st = self.st.lock();
        while st.1 == 0 {
            self.cv.wait(&mut st);
        }
    }
}

impl Device for Gated {
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn len_bytes(&self) -> u64 {
        self.inner.len_bytes()
    }
    fn read_at(&self, buf: &mut [u8], offset_bytes: u64) -> std::io::Result<()> {
        self.inner.read_at(buf, offset_bytes)
    }
    fn write_at(&self, buf: &[u8], offset_bytes: u64, fua: bool) -> std::io::Result<()> {
        self.gate.pass();
        self.inner.write_at(buf, offset_bytes, fua)
    }
    fn flush(&self) -> std::io::Result<()> {
        self.inner.flush()
    }
    fn discard_zeroes(&self, offset_bytes: u64, len_bytes: u64) -> std::io::Result<()> {
        self.inner.discard_zeroes(offset_bytes, len_bytes)
    }
}

/// The rig's members behind `gate`, and its log (not gated).
fn gated_members(rig: &Rig, gate: &Arc<Gate>) -> Vec<Arc<dyn Device>> {
    let mut all: Vec<Arc<dyn Device>> = rig
        .members
        .iter()
        .map(|m| {
            Arc::new(Gated {
                inner: m.clone(),
                gate: gate.clone(),
            }) as Arc<dyn Device>
        })
        .collect();
    all.push(rig.log.clone());
    all
}

/// Write-back: a row taken out of the cache for its write-out is not on its members until the
/// write-out's member writes complete. A read meanwhile must still see the acknowledged bytes
/// (it once went straight to the member, found the row no longer cached, and read the old
/// bytes: zeros after a restart whose write-outs ran under a client's reads).
#[test]
fn reads_during_a_write_out_see_the_cached_data() {
    let rig = Rig::new(Level::Raid5, 4, 4 << 20);
    let gate = Arc::new(Gate::default());
    let all = gated_members(&rig, &gate);
    let array = Arc::new(rig.boot(all, AssembleOptions::default()).expect("assemble"));
    array.set_journal_mode(true).expect("write-back");
    // Pages of two data chunks of row 0, short of a full row: they stay cached.
    let data = pattern(7, 8192);
    array.write(0, &data, false).expect("write");
    array.write(CHUNK, &data, false).expect("write");
    assert_eq!(array.status().journal.expect("journal").cache_bytes, 16384);
    assert!(read(&array, 0, 8192) == data, "a read from the cache");

    gate.set(true);
    let writer = {
        let a = array.clone();
        std::thread::spawn(move || a.set_journal_mode(false).expect("write everything out"))
    };
    // The write-out logged the row's parity and holds its member writes.
    gate.await_held();
    let (tx, rx) = std::sync::mpsc::channel();
    let reader = {
        let a = array.clone();
        std::thread::spawn(move || {
            tx.send((read(&a, 0, 8192), read(&a, CHUNK, 8192)))
                .expect("send");
        })
    };
    let early = rx.recv_timeout(std::time::Duration::from_millis(500)).ok();
    gate.set(false);
    let (first, second) = early.unwrap_or_else(|| rx.recv().expect("the reads"));
    assert!(
        first == data && second == data,
        "a read during the write-out missed acknowledged data"
    );
    reader.join().expect("reader");
    writer.join().expect("writer");
    assert_eq!(array.status().journal.expect("journal").cache_bytes, 0);
    assert!(read(&array, 0, 8192) == data && read(&array, CHUNK, 8192) == data);
    common_check_parity(&array);
}

// ---------------------------------------------------------------------------------------------
// Issue 21, items 2 and 5: a log that fails, and read-only starts after a cut.
// ---------------------------------------------------------------------------------------------

/// Power off every device of the rig, the log coming back alive if it was dead.
fn cut(rig: &Rig) {
    rig.cut_devices();
    rig.log.set_dead(false);
}

fn boot_read_only(rig: &Rig) -> engine::Result<Array> {
    assemble(
        rig.all(),
        AssembleOptions {
            config: ArrayConfig {
                io_threads: 4,
                read_only: true,
                ..ArrayConfig::default()
            },
            ..AssembleOptions::default()
        },
    )
}

/// Writes of 16 KiB into eight different rows, none filling its row: in write-back mode all of
/// them stay in the cache. Returns (offset, data) of each.
fn partial_rows(array: &Array, seed: u64) -> Vec<(u64, Vec<u8>)> {
    let row = 3 * CHUNK;
    (0..8u64)
        .map(|i| {
            let at = (i * 5 + 1) * row + (i % 3) * CHUNK + 8192;
            let data = pattern(seed + i, 16 << 10);
            array.write(at, &data, false).expect("write");
            (at, data)
        })
        .collect()
}

fn assert_reads(array: &Array, written: &[(u64, Vec<u8>)], what: &str) {
    for (at, data) in written {
        assert!(read(array, *at, data.len()) == *data, "{what}: {at} lost");
    }
}

/// Item 5: FUA writes are in the log (durable) but their member writes were not flushed when
/// the power went. A read-only start must not serve the members' older bytes: it refuses,
/// saying how to replay the log, and a normal start then replays it.
#[test]
fn a_read_only_start_never_serves_older_bytes_than_the_log_holds() {
    let rig = Rig::new(Level::Raid5, 4, 4 << 20);
    let array = rig
        .boot(rig.all(), AssembleOptions::default())
        .expect("assemble");
    let written: Vec<(u64, Vec<u8>)> = (0..24u64)
        .map(|i| {
            let at = (i * 7 % 24) * (64 << 10);
            let data = pattern(500 + i, 64 << 10);
            array.write(at, &data, true).expect("FUA write");
            (at, data)
        })
        .collect();
    drop(array);
    cut(&rig);
    match boot_read_only(&rig) {
        Ok(ro) => {
            // Acceptable only if it serves what was acknowledged.
            for (at, data) in &written {
                assert!(
                    read(&ro, *at, data.len()) == *data,
                    "a read-only start served older bytes at {at} than the log holds"
                );
            }
        }
        Err(e) => {
            let msg = e.to_string();
            assert!(
                msg.contains("read-only") && msg.contains("journal"),
                "the refusal must say why and what to do: {msg}"
            );
        }
    }
    // A normal start replays the log; a read-only start after a clean stop is fine.
    let again = rig
        .boot(rig.all(), AssembleOptions::default())
        .expect("reassemble");
    assert!(again.status().journal.expect("journal").replayed.pages > 0);
    assert_reads(&again, &written, "after replay");
    again.close().expect("clean stop");
    drop(again);
    let ro = boot_read_only(&rig).expect("read-only after a clean stop");
    assert_reads(&ro, &written, "read-only after a clean stop");
}

/// Item 2: an administrator's `fail` of the log returns only once the write-back cache is on
/// the members durably: a cut right after it loses nothing that was flushed.
#[test]
fn failing_the_log_writes_the_cache_out_before_it_returns() {
    let rig = Rig::new(Level::Raid5, 4, 4 << 20);
    let array = rig
        .boot(rig.all(), AssembleOptions::default())
        .expect("assemble");
    array.set_journal_mode(true).expect("write-back");
    let written = partial_rows(&array, 40);
    assert!(array.status().journal.expect("journal").cache_bytes > 0);
    array.flush().expect("flush");
    array.fail_member("log").expect("fail the log");
    let j = array.status().journal.expect("journal");
    assert_eq!(j.state, "failed", "{j:?}");
    assert_eq!(j.cache_bytes, 0, "{j:?}");
    drop(array);
    cut(&rig);
    let again = rig
        .boot(rig.all(), AssembleOptions::default())
        .expect("reassemble");
    assert_reads(&again, &written, "after fail and cut");
}

/// Item 2: the log fails by I/O error (seen by a write, which is refused). A flush after that
/// returns only once the cache is written out and the members flushed.
#[test]
fn a_flush_after_the_log_failed_writes_the_cache_out() {
    let rig = Rig::new(Level::Raid5, 4, 4 << 20);
    let array = rig
        .boot(rig.all(), AssembleOptions::default())
        .expect("assemble");
    array.set_journal_mode(true).expect("write-back");
    let written = partial_rows(&array, 60);
    rig.log.set_dead(true);
    assert!(matches!(
        array.write(0, &pattern(1, 4096), false),
        Err(EngineError::ReadOnly { .. })
    ));
    let j = array.status().journal.expect("journal");
    assert_eq!(j.state, "failing", "{j:?}");
    array.flush().expect("flush after the log failed");
    assert_eq!(array.status().journal.expect("journal").state, "failed");
    drop(array);
    cut(&rig);
    let again = rig
        .boot(rig.all(), AssembleOptions::default())
        .expect("reassemble");
    assert!(again.is_read_only(), "the log was recorded faulty");
    assert_reads(&again, &written, "flushed after the log failed");
}

/// Item 2: the log failed by I/O error and the power went before anything was written out:
/// the log is still readable at the next start, so it is replayed, not dropped.
#[test]
fn a_failed_log_still_readable_at_the_next_start_is_replayed() {
    let rig = Rig::new(Level::Raid5, 4, 4 << 20);
    let array = rig
        .boot(rig.all(), AssembleOptions::default())
        .expect("assemble");
    array.set_journal_mode(true).expect("write-back");
    let written = partial_rows(&array, 80);
    array.flush().expect("flush");
    rig.log.set_dead(true);
    assert!(array.write(0, &pattern(1, 4096), false).is_err());
    drop(array);
    cut(&rig);
    let again = rig
        .boot(rig.all(), AssembleOptions::default())
        .expect("reassemble");
    assert_reads(&again, &written, "in the failed log");
    assert!(again.status().journal.expect("journal").replayed.units > 0);
}

/// Item 2, write-through: an FUA write whose units are durable in the log and whose member
/// writes are in flight when the log fails is acknowledged only once its member writes are
/// durable (they went out without FUA: the log held them).
#[test]
fn an_fua_write_in_flight_when_the_log_fails_is_durable_on_the_members() {
    let rig = Rig::new(Level::Raid5, 4, 4 << 20);
    let gate = Arc::new(Gate::default());
    let all = gated_members(&rig, &gate);
    let array = Arc::new(rig.boot(all, AssembleOptions::default()).expect("assemble"));
    // The run's first write records "active" (superblock writes pass the gate too).
    array.write(0, &pattern(1, 4096), false).expect("write");
    array.flush().expect("flush");
    gate.set(true);
    let data = pattern(90, 3 * CHUNK as usize);
    let writer = {
        let (a, d) = (array.clone(), data.clone());
        std::thread::spawn(move || a.write(6 * CHUNK, &d, true))
    };
    gate.await_held();
    let failer = {
        let a = array.clone();
        std::thread::spawn(move || a.fail_member("log"))
    };
    while array.status().journal.expect("journal").failed.is_none() {
        std::thread::yield_now();
    }
    gate.set(false);
    writer
        .join()
        .expect("writer")
        .expect("FUA write acknowledged");
    // Power goes the moment the acknowledgement is out.
    cut(&rig);
    failer.join().expect("failer").expect("fail the log");
    drop(array);
    let again = rig
        .boot(rig.all(), AssembleOptions::default())
        .expect("reassemble");
    assert!(
        read(&again, 6 * CHUNK, data.len()) == data,
        "an acknowledged FUA write was lost"
    );
}

/// Item 2: a log whose writes fail misses the superblock commits that follow (here two member
/// changes), so its superblock falls behind the members'. It is still the array's journal
/// (nothing recorded it faulty: its cache was never written out), so the next start replays
/// it rather than leaving it out as stale.
#[test]
fn a_failing_log_whose_superblock_fell_behind_is_still_replayed() {
    let rig = Rig::new(Level::Raid6, 5, 4 << 20);
    let array = rig
        .boot(rig.all(), AssembleOptions::default())
        .expect("assemble");
    array.set_journal_mode(true).expect("write-back");
    let written = partial_rows(&array, 120);
    rig.log.set_faults(device::Faults {
        write_error: 1.0,
        ..device::Faults::default()
    });
    assert!(array.write(0, &pattern(1, 4096), false).is_err());
    array.fail_member("m4").expect("fail a member");
    array.remove_member("m4").expect("remove it");
    drop(array);
    cut(&rig);
    rig.log.set_faults(device::Faults::default());
    let sb = engine::read_superblock(rig.log.as_ref()).expect("log sb");
    let m0 = engine::read_superblock(rig.members[0].as_ref()).expect("member sb");
    assert!(sb.events + 1 < m0.events, "{} vs {}", sb.events, m0.events);
    let again = rig
        .boot(rig.all(), AssembleOptions::default())
        .expect("reassemble");
    assert!(again.status().journal.expect("journal").replayed.units > 1);
    assert_reads(&again, &written, "in the log whose superblock fell behind");
}

/// A new journal takes a new slot: the lost log coming back later is not the array's journal
/// (its stale chain is never replayed over newer data).
#[test]
fn a_replaced_log_coming_back_is_not_replayed() {
    let rig = Rig::new(Level::Raid5, 4, 4 << 20);
    let array = rig
        .boot(rig.all(), AssembleOptions::default())
        .expect("assemble");
    let old = pattern(130, 64 << 10);
    array.write(0, &old, true).expect("write");
    drop(array);
    cut(&rig);
    // The log is lost; a new one replaces it and newer data is written.
    let new_log = Arc::new(SimDevice::new("log2", 4 << 20, 7));
    let array = rig
        .boot(
            devs(&rig.members),
            AssembleOptions {
                add_journal: Some(new_log.clone()),
                force: true,
                ..AssembleOptions::default()
            },
        )
        .expect("add a journal");
    let newer = pattern(131, 64 << 10);
    array.write(0, &newer, true).expect("write");
    while array.sync_step() != engine::SyncAction::Idle {}
    array.close().expect("clean stop");
    drop(array);
    // The old log device comes back alone.
    let again = rig
        .boot(rig.all(), AssembleOptions::default())
        .expect("assemble with the old log");
    assert!(
        again.is_read_only(),
        "the old log is not the array's journal"
    );
    assert!(
        read(&again, 0, newer.len()) == newer,
        "a stale log was replayed"
    );
}

/// Item 2: a log that can still be read at the next start but no longer written. Its chain is
/// replayed, the data it held without parity (write-back) goes out to the members from memory,
/// and only then is it recorded faulty: the array starts read-only with everything flushed.
#[test]
fn a_log_readable_but_not_writable_at_the_next_start_is_replayed_then_dropped() {
    let rig = Rig::new(Level::Raid5, 4, 4 << 20);
    let array = rig
        .boot(rig.all(), AssembleOptions::default())
        .expect("assemble");
    array.set_journal_mode(true).expect("write-back");
    let written = partial_rows(&array, 140);
    array.flush().expect("flush");
    drop(array);
    cut(&rig);
    rig.log.set_faults(device::Faults {
        write_error: 1.0,
        ..device::Faults::default()
    });
    let again = rig
        .boot(rig.all(), AssembleOptions::default())
        .expect("starts with the log replayed");
    let j = again.status().journal.expect("journal");
    assert_eq!(j.state, "failed", "{j:?}");
    assert!(j.replayed.data_only_pages > 0, "{j:?}");
    assert_eq!(j.cache_bytes, 0, "{j:?}");
    assert!(again.status().read_only);
    assert_reads(
        &again,
        &written,
        "replayed from a log that cannot be written",
    );
    drop(again);
    cut(&rig);
    rig.log.set_faults(device::Faults::default());
    let last = rig
        .boot(rig.all(), AssembleOptions::default())
        .expect("reassemble");
    assert!(last.is_read_only(), "the log was recorded faulty");
    assert_reads(&last, &written, "after the log was dropped");
}
