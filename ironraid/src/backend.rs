//! The NBD export of an array: the engine's API behind the `nbd::Backend` trait.
//!
//! Byte ranges that are not whole sectors (a client that did not negotiate block sizes) are the
//! engine's ([`engine::AnyBytes`], with the sub-sector lock that
//! keeps a partial-sector patch from undoing a neighbour's write).

use engine::{Array, WriteIntent};
use nbd::proto::{STATE_HOLE, STATE_ZERO};
use nbd::{Backend, BlockSizes, GatheredWrite, WriteHint};
use std::io;
use std::os::fd::BorrowedFd;
use std::sync::Arc;

pub struct ArrayBackend(pub Arc<Array>);

const SECTOR: u64 = 512;

fn is_aligned(offset: u64, len: u64) -> bool {
    offset.is_multiple_of(SECTOR) && len.is_multiple_of(SECTOR)
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
        self.0
            .any_bytes()
            .read(offset, buf)
            .map_err(io::Error::from)
    }

    /// A read the array answers Ok has filled every byte: from a member, from redundancy, or
    /// with zeroes for a region never written.
    fn read_fills_buffer(&self) -> bool {
        true
    }

    /// Reads of arrays without integrity records may go from the members' page caches to the
    /// socket ([`Array::read_to_pipe`] says where and when).
    fn splices_reads(&self) -> bool {
        self.0.splices_reads()
    }

    fn read_to_pipe(&self, offset: u64, len: usize, pipe: BorrowedFd<'_>) -> bool {
        self.0.read_to_pipe(offset, len, pipe)
    }

    fn write(&self, offset: u64, data: &[u8], fua: bool) -> io::Result<()> {
        self.0
            .any_bytes()
            .write(offset, data, fua)
            .map_err(io::Error::from)
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
        self.0
            .any_bytes()
            .write_intended(*intent, data, fua)
            .map_err(io::Error::from)
    }

    /// A parity array's stripe cache merges the writes of a stream that share a stripe.
    fn gathers_writes(&self) -> bool {
        self.0.geometry().level().is_parity()
    }

    /// The whole-sector writes of the run go to the array together, the others after them one
    /// by one; the run's writes do not
    /// overlap, so the order between the two groups does not matter.
    fn write_gathered(&self, writes: Vec<GatheredWrite<'_>>) -> Vec<io::Result<()>> {
        let mut results: Vec<Option<io::Result<()>>> = Vec::with_capacity(writes.len());
        let mut whole = Vec::new();
        let mut rest = Vec::new();
        for w in writes {
            let slot = results.len();
            results.push(None);
            let (offset, data, fua) = (w.offset, w.data, w.fua);
            // Only whole-sector writes are announced (`write_coming`).
            let hinted = w.hint.filter(|_| is_aligned(offset, data.len() as u64));
            match hinted.map(|h| h.0.downcast::<WriteIntent>()) {
                Some(Ok(intent)) => {
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
            let (slots, run): (Vec<usize>, Vec<_>) = whole.into_iter().unzip();
            for (slot, r) in slots
                .into_iter()
                .zip(self.0.any_bytes().write_gathered(run))
            {
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
        self.0
            .any_bytes()
            .write_zeroes(offset, len, fua, may_trim)
            .map_err(io::Error::from)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
