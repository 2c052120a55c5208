//! The NBD export of an array: the engine's API behind the `nbd::Backend` trait.
//!
//! # Byte-granular writes
//! The engine reads and writes whole 512-byte sectors. A client that did not negotiate block
//! sizes may send any byte range, so a WRITE or WRITE_ZEROES that starts or ends inside a sector
//! is widened: each partial ("edge") sector is read, patched with the client's bytes, and written
//! back whole (read-modify-write). Unaligned reads read the covering sectors and copy out.
//!
//! What must hold: *a byte that no write in flight covers keeps its last acknowledged value.* A
//! patch writes back bytes the client did not send, with the values it read. If another write
//! to that sector — unaligned, aligned or zeroing, from any connection — completes between the
//! patch's read and its write, those values are stale and that write's update is silently
//! undone, although the two requests share no byte. (Concurrent writes to the *same* bytes may
//! land in either order; that is all a client may not rely on.) Hence: *while an edge sector is
//! being patched, no other write to that sector may run.*
//!
//! How: [`SectorLocks`], a fixed table of `LOCK_STRIPES` reader-writer locks. A sector belongs to
//! the lock of its `LOCK_GRANULE_BYTES` granule, modulo `LOCK_STRIPES`. Every write takes, before
//! it touches the array and until the array has answered, the lock of each granule it covers:
//! exclusive where it patches an edge sector, shared elsewhere. So aligned writes never wait for
//! one another, only for a patch of a sector they touch, and a patch waits for every other
//! write of its granule. Locks are taken in increasing stripe order and each at most once per
//! write, so no two writes can wait on each other in a cycle. A write covering `LOCK_STRIPES`
//! granules or more takes every lock. Reads take none: a read that overlaps a concurrent write
//! may see old or new bytes, as NBD allows.
//!
//! The table is one per process, not per array (`ArrayBackend` is built as a bare newtype by
//! the daemon): sharing a stripe between arrays only serialises more than needed, never less.
//! Writes from inside the engine (resync, rebuild) are whole sectors and the engine orders them
//! itself; this layer only has to order the patches it invents.

use engine::{Array, WriteIntent};
use nbd::proto::{STATE_HOLE, STATE_ZERO};
use nbd::{Backend, BlockSizes, GatheredWrite, WriteHint};
use std::io;
use std::sync::{Arc, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

pub struct ArrayBackend(pub Arc<Array>);

const SECTOR: u64 = 512;

/// Bytes of the array that share one lock of [`SectorLocks`]: a page, so that a typical 4 KiB
/// aligned write takes one or two locks.
const LOCK_GRANULE_BYTES: u64 = 4096;

/// Locks in the table; a set of them is a `u64` bit mask.
const LOCK_STRIPES: usize = 64;

const _: () = assert!(LOCK_STRIPES == u64::BITS as usize);
const _: () = assert!(LOCK_GRANULE_BYTES.is_multiple_of(SECTOR));

/// Locks of every write through any `ArrayBackend` of this process.
static SECTOR_LOCKS: SectorLocks = SectorLocks::new();

fn is_aligned(offset: u64, len: u64) -> bool {
    offset.is_multiple_of(SECTOR) && len.is_multiple_of(SECTOR)
}

/// `offset..offset+len` widened to whole sectors.
fn widen(offset: u64, len: u64) -> (u64, u64) {
    (
        offset / SECTOR * SECTOR,
        (offset + len).div_ceil(SECTOR) * SECTOR,
    )
}

/// The start of each sector that `offset..offset+len` (not empty) covers only in part: at most
/// two, the first and the last, ascending and distinct.
fn edge_sectors(offset: u64, len: u64) -> impl Iterator<Item = u64> {
    assert!(len > 0, "an empty write has no edges");
    let (start, end) = widen(offset, len);
    let head = (!offset.is_multiple_of(SECTOR)).then_some(start);
    let tail = (!(offset + len).is_multiple_of(SECTOR)).then_some(end - SECTOR);
    head.into_iter().chain(tail.filter(|&t| Some(t) != head))
}

/// One lock per cache line, so that writers on different stripes do not slow each other down.
#[repr(align(64))]
struct Stripe(RwLock<()>);

/// The lock table (see the module documentation).
struct SectorLocks {
    stripes: [Stripe; LOCK_STRIPES],
}

/// The stripes a write takes, as bit masks (bit `i` is stripe `i`); disjoint.
#[derive(Debug, Default, PartialEq, Eq)]
struct LockSet {
    exclusive: u64,
    shared: u64,
}

fn stripe_bit(offset: u64) -> u64 {
    1 << (offset / LOCK_GRANULE_BYTES % LOCK_STRIPES as u64)
}

impl LockSet {
    /// What two writes take together, for one thread that runs both: exclusive wherever either
    /// needs it.
    fn union(&self, other: &LockSet) -> LockSet {
        let exclusive = self.exclusive | other.exclusive;
        LockSet {
            exclusive,
            shared: (self.shared | other.shared) & !exclusive,
        }
    }

    /// For a write of `offset..offset+len` (not empty): exclusive on the granule of each edge
    /// sector, shared on every other granule of the widened range.
    fn for_write(offset: u64, len: u64) -> LockSet {
        let (start, end) = widen(offset, len);
        let first = start / LOCK_GRANULE_BYTES;
        let last = (end - 1) / LOCK_GRANULE_BYTES;
        let covered = if last - first >= LOCK_STRIPES as u64 - 1 {
            u64::MAX
        } else {
            (first..=last).fold(0, |m, g| m | stripe_bit(g * LOCK_GRANULE_BYTES))
        };
        let exclusive = edge_sectors(offset, len).fold(0, |m, s| m | stripe_bit(s));
        LockSet {
            exclusive,
            shared: covered & !exclusive,
        }
    }
}

/// Guards of one write; the locks are released when it is dropped.
struct Held<'a> {
    _shared: Vec<RwLockReadGuard<'a, ()>>,
    _exclusive: Vec<RwLockWriteGuard<'a, ()>>,
}

impl SectorLocks {
    const fn new() -> SectorLocks {
        SectorLocks {
            stripes: [const { Stripe(RwLock::new(())) }; LOCK_STRIPES],
        }
    }

    /// Takes `set`, in increasing stripe order (the order is what rules out deadlock).
    fn lock(&self, set: &LockSet) -> Held<'_> {
        assert_eq!(set.exclusive & set.shared, 0, "a stripe is taken once");
        let mut shared = Vec::with_capacity(set.shared.count_ones() as usize);
        let mut exclusive = Vec::with_capacity(set.exclusive.count_ones() as usize);
        let mut todo = set.exclusive | set.shared;
        while todo != 0 {
            let i = todo.trailing_zeros();
            todo &= todo - 1;
            // Poisoning only means another write panicked while holding the lock; the lock
            // protects no data of its own.
            let lock = &self.stripes[i as usize].0;
            if set.exclusive & (1 << i) != 0 {
                exclusive.push(lock.write().unwrap_or_else(PoisonError::into_inner));
            } else {
                shared.push(lock.read().unwrap_or_else(PoisonError::into_inner));
            }
        }
        Held {
            _shared: shared,
            _exclusive: exclusive,
        }
    }
}

/// The sector-granular I/O a patch needs (the array; a model in the unit tests).
trait Sectors {
    fn read_sectors(&self, offset: u64, buf: &mut [u8]) -> io::Result<()>;
    fn write_sectors(&self, offset: u64, data: &[u8], fua: bool) -> io::Result<()>;
}

impl Sectors for Array {
    fn read_sectors(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        self.read(offset, buf).map_err(io::Error::from)
    }

    fn write_sectors(&self, offset: u64, data: &[u8], fua: bool) -> io::Result<()> {
        self.write(offset, data, fua).map_err(io::Error::from)
    }
}

/// Writes `data` at any byte `offset`, patching the edge sectors; the caller holds the locks
/// of `LockSet::for_write(offset, data.len())`.
fn patch_write(s: &impl Sectors, offset: u64, data: &[u8], fua: bool) -> io::Result<()> {
    let len = data.len() as u64;
    let (start, end) = widen(offset, len);
    let mut whole = vec![0u8; (end - start) as usize];
    for edge in edge_sectors(offset, len) {
        let at = (edge - start) as usize;
        s.read_sectors(edge, &mut whole[at..at + SECTOR as usize])?;
    }
    let at = (offset - start) as usize;
    whole[at..at + data.len()].copy_from_slice(data);
    s.write_sectors(start, &whole, fua)
}

/// Zeroes the bytes of `offset..offset+len` that lie in its edge sectors, by patching them;
/// returns the aligned middle still to be zeroed (possibly empty). The caller holds the locks.
fn zero_edges(s: &impl Sectors, offset: u64, len: u64, fua: bool) -> io::Result<(u64, u64)> {
    let end = offset + len;
    let mut sector = [0u8; SECTOR as usize];
    for edge in edge_sectors(offset, len) {
        s.read_sectors(edge, &mut sector)?;
        let from = offset.max(edge) - edge;
        let to = end.min(edge + SECTOR) - edge;
        sector[from as usize..to as usize].fill(0);
        s.write_sectors(edge, &sector, fua)?;
    }
    let mid_start = offset.div_ceil(SECTOR) * SECTOR;
    let mid_end = (end / SECTOR * SECTOR).max(mid_start);
    Ok((mid_start, mid_end - mid_start))
}

impl ArrayBackend {
    /// Read the whole sectors covering `offset..offset+len`; returns their start and bytes.
    fn read_covering(&self, offset: u64, len: usize) -> io::Result<(u64, Vec<u8>)> {
        let (start, end) = widen(offset, len as u64);
        let mut whole = vec![0u8; (end - start) as usize];
        self.0.read(start, &mut whole).map_err(io::Error::from)?;
        Ok((start, whole))
    }
}

impl Backend for ArrayBackend {
    fn size_bytes(&self) -> u64 {
        self.0.size_bytes()
    }

    fn read_only(&self) -> bool {
        self.0.is_read_only()
    }

    fn block_sizes(&self) -> BlockSizes {
        let chunk = (self.0.geometry().chunk_sectors() * 512) as u32;
        BlockSizes {
            min: 512,
            preferred: chunk.clamp(4096, 1 << 20),
            max: nbd::MAX_PAYLOAD,
        }
    }

    fn read(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        if is_aligned(offset, buf.len() as u64) {
            return self.0.read(offset, buf).map_err(io::Error::from);
        }
        let (start, whole) = self.read_covering(offset, buf.len())?;
        let at = (offset - start) as usize;
        buf.copy_from_slice(&whole[at..at + buf.len()]);
        Ok(())
    }

    fn write(&self, offset: u64, data: &[u8], fua: bool) -> io::Result<()> {
        if data.is_empty() {
            return Ok(());
        }
        let _held = SECTOR_LOCKS.lock(&LockSet::for_write(offset, data.len() as u64));
        if is_aligned(offset, data.len() as u64) {
            return self.0.write(offset, data, fua).map_err(io::Error::from);
        }
        patch_write(&*self.0, offset, data, fua)
    }

    /// Whole-sector writes are announced to the array's stripes while their payload arrives
    /// (md's plug: a stripe the next request of a stream will fill is not written half first).
    fn write_coming(&self, offset: u64, len: u64) -> Option<WriteHint> {
        is_aligned(offset, len).then(|| WriteHint(Box::new(self.0.intend_write(offset, len))))
    }

    fn write_hinted(&self, hint: WriteHint, offset: u64, data: &[u8], fua: bool) -> io::Result<()> {
        let Ok(intent) = hint.0.downcast::<WriteIntent>() else {
            unreachable!("ironraid's write hints are write intents");
        };
        if data.is_empty() || !is_aligned(offset, data.len() as u64) {
            drop(intent);
            return self.write(offset, data, fua);
        }
        let _held = SECTOR_LOCKS.lock(&LockSet::for_write(offset, data.len() as u64));
        self.0
            .write_intended(*intent, data, fua)
            .map_err(io::Error::from)
    }

    /// A parity array's stripe cache merges the writes of a stream that share a stripe.
    fn gathers_writes(&self) -> bool {
        self.0.geometry().level().is_parity()
    }

    /// The whole-sector writes of the run go to the array together (under the union of their
    /// sector locks, all shared), the others after them one by one; the run's writes do not
    /// overlap, so the order between the two groups does not matter.
    fn write_gathered(&self, writes: Vec<GatheredWrite<'_>>) -> Vec<io::Result<()>> {
        let mut results: Vec<Option<io::Result<()>>> = Vec::with_capacity(writes.len());
        let mut whole = Vec::new();
        let mut rest = Vec::new();
        let mut locks = LockSet::default();
        for w in writes {
            let slot = results.len();
            results.push(None);
            let (offset, data, fua) = (w.offset, w.data, w.fua);
            // Only whole-sector writes are announced (`write_coming`).
            let hinted = w.hint.filter(|_| is_aligned(offset, data.len() as u64));
            match hinted.map(|h| h.0.downcast::<WriteIntent>()) {
                Some(Ok(intent)) => {
                    locks = locks.union(&LockSet::for_write(offset, data.len() as u64));
                    whole.push((
                        slot,
                        engine::GatheredWrite {
                            offset_bytes: offset,
                            data,
                            fua,
                            intent: Some(*intent),
                        },
                    ));
                }
                Some(Err(_)) => unreachable!("ironraid's write hints are write intents"),
                None => rest.push((slot, offset, data, fua)),
            }
        }
        if !whole.is_empty() {
            let _held = SECTOR_LOCKS.lock(&locks);
            let (slots, run): (Vec<usize>, Vec<_>) = whole.into_iter().unzip();
            for (slot, r) in slots.into_iter().zip(self.0.write_gathered(run)) {
                results[slot] = Some(r.map_err(io::Error::from));
            }
        }
        for (slot, offset, data, fua) in rest {
            results[slot] = Some(self.write(offset, data, fua));
        }
        results
            .into_iter()
            .map(|r| r.expect("every write of the run has its result"))
            .collect()
    }

    fn flush(&self) -> io::Result<()> {
        self.0.flush().map_err(io::Error::from)
    }

    /// Trim is advisory in NBD: the array releases the whole used-map regions inside the
    /// range (discarded on the members, skipped by resync and rebuild from then on) and leaves
    /// the rest as it is.
    fn trim(&self, offset: u64, len: u64, fua: bool) -> io::Result<()> {
        let start = offset.div_ceil(SECTOR);
        let end = (offset + len) / SECTOR;
        if end > start {
            self.0
                .trim(start * SECTOR, (end - start) * SECTOR)
                .map_err(io::Error::from)?;
        }
        if fua {
            self.flush()?;
        }
        Ok(())
    }

    /// Unused regions (never written since create, or trimmed since) are holes that read as
    /// zeroes; everything else is reported as data (the array does not know which of its
    /// used bytes are zero).
    fn block_status(&self, offset: u64, len: u32) -> io::Result<Vec<(u32, u32)>> {
        // Replies stay short: a client asks again from where the extents end.
        const MAX_EXTENTS: usize = 1024;
        // Extents must be whole 512-byte blocks (the advertised minimum): an unaligned query
        // is answered as data, which is never wrong.
        if !is_aligned(offset, u64::from(len)) {
            return Ok(vec![(len, 0)]);
        }
        let runs = self.0.zero_runs(offset, u64::from(len));
        Ok(runs
            .into_iter()
            .take(MAX_EXTENTS)
            .map(|(n, zero)| {
                let n = u32::try_from(n).expect("runs lie inside one request");
                (n, if zero { STATE_HOLE | STATE_ZERO } else { 0 })
            })
            .collect())
    }

    fn write_zeroes(&self, offset: u64, len: u64, fua: bool, may_trim: bool) -> io::Result<()> {
        if len == 0 {
            return Ok(());
        }
        let _held = SECTOR_LOCKS.lock(&LockSet::for_write(offset, len));
        let (mid, mid_len) = if is_aligned(offset, len) {
            (offset, len)
        } else {
            zero_edges(&*self.0, offset, len, fua)?
        };
        if mid_len == 0 {
            return Ok(());
        }
        self.0
            .write_zeroes(mid, mid_len, fua, may_trim)
            .map_err(io::Error::from)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;
    use std::time::Duration;

    /// A RAID5 ×4 over simulated members, created the way `create` does on new files.
    fn sparse_raid5() -> ArrayBackend {
        let sims: Vec<Arc<dyn device::Device>> = (0..4)
            .map(|i| {
                Arc::new(device::SimDevice::new(format!("s{i}"), 16 << 20, i))
                    as Arc<dyn device::Device>
            })
            .collect();
        engine::create(&engine::CreateSpec {
            name: "bs".into(),
            level: layout::Level::Raid5,
            layout: None,
            chunk_bytes: 64 << 10,
            members: sims.clone(),
            spares: vec![],
            size_bytes: None,
            assume_clean: false,
            force: false,
            bitmap: None,
            discard: true,
            journal: None,
            journal_write_back: false,
            integrity: false,
            guided: false,
        })
        .unwrap();
        ArrayBackend(Arc::new(
            engine::assemble(sims, engine::AssembleOptions::default()).unwrap(),
        ))
    }

    #[test]
    fn block_status_reports_unused_regions_as_holes_in_whole_blocks() {
        let b = sparse_raid5();
        // One region: 1 MiB of each member, 3 MiB of the array.
        let region = 3u32 << 20;
        b.write(u64::from(region), &[7u8; 4096], false).unwrap();
        let hole = STATE_HOLE | STATE_ZERO;
        assert_eq!(
            b.block_status(0, 3 * region).unwrap(),
            vec![(region, hole), (region, 0), (region, hole)]
        );
        assert_eq!(b.block_status(4096, 8192).unwrap(), vec![(8192, hole)]);
        // Not whole 512-byte blocks: one data extent, never a wrong hole.
        assert_eq!(b.block_status(100, 8192).unwrap(), vec![(8192, 0)]);
        assert_eq!(b.block_status(0, 1000).unwrap(), vec![(1000, 0)]);
    }

    #[test]
    fn edges_of_a_range() {
        let e = |o, l| edge_sectors(o, l).collect::<Vec<_>>();
        assert_eq!(e(0, 512), Vec::<u64>::new());
        assert_eq!(e(1, 7), vec![0]);
        assert_eq!(e(510, 4), vec![0, 512]);
        assert_eq!(e(512, 100), vec![512]);
        assert_eq!(e(100, 412), vec![0]);
        assert_eq!(e(100, 2000), vec![0, 2048]);
    }

    #[test]
    fn lock_sets() {
        // Aligned: shared only.
        let s = LockSet::for_write(4096, 8192);
        assert_eq!(
            s,
            LockSet {
                exclusive: 0,
                shared: 0b110
            }
        );
        // Two writes run by one thread (a gathered run): each stripe once, exclusive wins.
        let both = s.union(&LockSet::for_write(8192 + 3, 7));
        assert_eq!(
            both,
            LockSet {
                exclusive: 0b100,
                shared: 0b10
            }
        );
        // Inside one sector: that granule exclusive, nothing else.
        let s = LockSet::for_write(4096 + 3, 7);
        assert_eq!(
            s,
            LockSet {
                exclusive: 0b10,
                shared: 0
            }
        );
        // Across a granule boundary: both edges exclusive.
        let s = LockSet::for_write(4096 - 10, 20);
        assert_eq!(
            s,
            LockSet {
                exclusive: 0b11,
                shared: 0
            }
        );
        // Long: every stripe, the edges' exclusive (granule 64 wraps onto stripe 0).
        let s = LockSet::for_write(1, LOCK_GRANULE_BYTES * 64);
        assert_eq!(s.exclusive, 0b1);
        assert_eq!(s.shared, !0b1);
        let s = LockSet::for_write(0, LOCK_GRANULE_BYTES * 63);
        assert_eq!(s.shared, u64::MAX >> 1);
    }

    /// An in-memory array that is slow between a read and the next write, which is where an
    /// unlocked patch loses its neighbour's update.
    struct Slow(Mutex<Vec<u8>>);

    impl Sectors for Slow {
        fn read_sectors(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
            assert!(is_aligned(offset, buf.len() as u64));
            let o = offset as usize;
            buf.copy_from_slice(&self.0.lock().unwrap()[o..o + buf.len()]);
            std::thread::sleep(Duration::from_micros(200));
            Ok(())
        }

        fn write_sectors(&self, offset: u64, data: &[u8], _fua: bool) -> io::Result<()> {
            assert!(is_aligned(offset, data.len() as u64));
            std::thread::sleep(Duration::from_micros(100));
            let o = offset as usize;
            self.0.lock().unwrap()[o..o + data.len()].copy_from_slice(data);
            Ok(())
        }
    }

    /// Patched writes and aligned ones from many threads, all sharing sectors: every byte ends
    /// with the one value written to it. (The end-to-end version, through a daemon and the
    /// NBD protocol, is `ironraid/tests/frontend.rs`.)
    #[test]
    fn concurrent_patches_lose_nothing() {
        const THREADS: usize = 6;
        const SLOT: usize = 7;
        const SLOTS: usize = 580;
        const BOUNDARY_ROUNDS: usize = 40;
        let locks = SectorLocks::new();
        let mem = Slow(Mutex::new(vec![0; 8192]));
        // Slots fill sectors 0..8; sectors 8..16 are written whole by one thread while others
        // keep zeroing byte ranges across their inner boundaries.
        let aligned_at = 4096u64;
        std::thread::scope(|sc| {
            for t in 0..THREADS {
                let (locks, mem) = (&locks, &mem);
                sc.spawn(move || {
                    for i in (t..SLOTS).step_by(THREADS) {
                        let off = (i * SLOT) as u64;
                        let data = [i as u8 | 1; SLOT];
                        let _h = locks.lock(&LockSet::for_write(off, SLOT as u64));
                        patch_write(mem, off, &data, false).unwrap();
                    }
                });
            }
            sc.spawn(|| {
                for s in 0..8u64 {
                    std::thread::sleep(Duration::from_millis(1));
                    let off = aligned_at + s * SECTOR;
                    let _h = locks.lock(&LockSet::for_write(off, SECTOR));
                    mem.write_sectors(off, &[0xa5; SECTOR as usize], false)
                        .unwrap();
                }
            });
            // One thread per inner boundary keeps zeroing 6 bytes across it, so that every
            // aligned write lands while a patch of its sector is under way.
            for k in 1..8 {
                let (locks, mem) = (&locks, &mem);
                sc.spawn(move || {
                    let at = aligned_at + k * SECTOR - 3;
                    for _ in 0..BOUNDARY_ROUNDS {
                        let _h = locks.lock(&LockSet::for_write(at, 6));
                        zero_edges(mem, at, 6, false).unwrap();
                    }
                });
            }
        });
        let got = mem.0.lock().unwrap();
        for i in 0..SLOTS {
            let want = i as u8 | 1;
            assert!(
                got[i * SLOT..(i + 1) * SLOT].iter().all(|&x| x == want),
                "slot {i}"
            );
        }
        // Within 3 bytes of a sector boundary inside the aligned region: zeroed or 0xa5.
        let zeroed = |o: usize| {
            let r = (o + 3) % SECTOR as usize;
            o > aligned_at as usize + 3 && o < 8192 - 3 && r < 6
        };
        for o in aligned_at as usize..8192 {
            let x = got[o];
            assert!(x == 0xa5 || (zeroed(o) && x == 0), "byte {o} = {x:#x}");
        }
    }
}
