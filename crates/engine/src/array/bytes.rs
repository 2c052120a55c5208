//! Byte-granular requests: a client that did not negotiate block sizes may read or write any
//! byte range. The engine itself works in whole 512-byte sectors, so a write that starts or ends
//! inside a sector patches that edge sector (read, patch, write back) under the sub-sector lock
//! (`lock/sectors.rs`, which says why a patch must exclude every other write of its sector).
//! Reads of a partial sector read the covering sectors and copy out.

use crate::array::Array;
use crate::error::Result;
use crate::lock::sectors::{edge_sectors, is_aligned, widen, LockSet, SECTOR};
use crate::personality::gathered::GatheredWrite;
use crate::personality::intent::WriteIntent;

/// The sector-granular I/O a patch needs (the array; a model in the unit tests).
trait Sectors {
    fn read_sectors(&self, offset: u64, buf: &mut [u8]) -> Result<()>;
    fn write_sectors(&self, offset: u64, data: &[u8], fua: bool) -> Result<()>;
}

impl Sectors for Array {
    fn read_sectors(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.read(offset, buf)
    }

    fn write_sectors(&self, offset: u64, data: &[u8], fua: bool) -> Result<()> {
        self.write(offset, data, fua)
    }
}

/// Writes `data` at any byte `offset`, patching the edge sectors; the caller holds the locks
/// of `LockSet::for_write(offset, data.len())`.
fn patch_write(s: &impl Sectors, offset: u64, data: &[u8], fua: bool) -> Result<()> {
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
fn zero_edges(s: &impl Sectors, offset: u64, len: u64, fua: bool) -> Result<(u64, u64)> {
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

/// The array at byte granularity ([`Array::any_bytes`]): requests of any byte range, partial
/// sectors patched under the sub-sector lock. What an NBD client that did not negotiate block
/// sizes may send.
pub struct AnyBytes<'a>(&'a Array);

impl Array {
    pub fn any_bytes(&self) -> AnyBytes<'_> {
        AnyBytes(self)
    }
}

impl AnyBytes<'_> {
    /// Read any byte range inside the array.
    pub fn read(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        if is_aligned(offset, buf.len() as u64) {
            return self.0.read(offset, buf);
        }
        let (start, end) = widen(offset, buf.len() as u64);
        let mut whole = vec![0u8; (end - start) as usize];
        self.0.read(start, &mut whole)?;
        let at = (offset - start) as usize;
        buf.copy_from_slice(&whole[at..at + buf.len()]);
        Ok(())
    }

    /// Write any byte range inside the array, patching partial sectors.
    pub fn write(&self, offset: u64, data: &[u8], fua: bool) -> Result<()> {
        if data.is_empty() {
            return Ok(());
        }
        let _held = self
            .0
            .sector_locks
            .lock(&LockSet::for_write(offset, data.len() as u64));
        if is_aligned(offset, data.len() as u64) {
            return self.0.write(offset, data, fua);
        }
        patch_write(self.0, offset, data, fua)
    }

    /// [`Array::write_zeroes`] of any byte range: partial sectors are patched with zeroes.
    pub fn write_zeroes(&self, offset: u64, len: u64, fua: bool, may_trim: bool) -> Result<()> {
        if len == 0 {
            return Ok(());
        }
        let _held = self.0.sector_locks.lock(&LockSet::for_write(offset, len));
        let (mid, mid_len) = if is_aligned(offset, len) {
            (offset, len)
        } else {
            zero_edges(self.0, offset, len, fua)?
        };
        if mid_len == 0 {
            return Ok(());
        }
        self.0.write_zeroes(mid, mid_len, fua, may_trim)
    }

    /// [`Array::write_intended`] under the sub-sector lock (the range is whole sectors: only
    /// those are announced).
    pub fn write_intended(&self, intent: WriteIntent, data: &[u8], fua: bool) -> Result<()> {
        let at = intent.offset_bytes();
        let _held = self
            .0
            .sector_locks
            .lock(&LockSet::for_write(at, data.len() as u64));
        self.0.write_intended(intent, data, fua)
    }

    /// [`Array::write_gathered`] under the sub-sector locks of the whole run (whole-sector
    /// writes only: they take their granules shared).
    pub fn write_gathered(&self, writes: Vec<GatheredWrite<'_>>) -> Vec<Result<()>> {
        let locks = writes.iter().fold(LockSet::default(), |l, w| {
            l.union(&LockSet::for_write(w.offset_bytes, w.data.len() as u64))
        });
        let _held = self.0.sector_locks.lock(&locks);
        self.0.write_gathered(writes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lock::sectors::SectorLocks;
    use std::sync::Mutex;
    use std::time::Duration;

    /// An in-memory array that is slow between a read and the next write, which is where an
    /// unlocked patch loses its neighbour's update.
    struct Slow(Mutex<Vec<u8>>);

    impl Sectors for Slow {
        fn read_sectors(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
            assert!(is_aligned(offset, buf.len() as u64));
            let o = offset as usize;
            buf.copy_from_slice(&self.0.lock().unwrap()[o..o + buf.len()]);
            std::thread::sleep(Duration::from_micros(200));
            Ok(())
        }

        fn write_sectors(&self, offset: u64, data: &[u8], _fua: bool) -> Result<()> {
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
