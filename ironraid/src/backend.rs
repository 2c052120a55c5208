//! The NBD export of an array: the engine's API behind the `nbd::Backend` trait.

use engine::Array;
use nbd::{Backend, BlockSizes};
use std::io;
use std::sync::Arc;

pub struct ArrayBackend(pub Arc<Array>);

const SECTOR: u64 = 512;

fn is_aligned(offset: u64, len: usize) -> bool {
    offset.is_multiple_of(SECTOR) && (len as u64).is_multiple_of(SECTOR)
}

impl ArrayBackend {
    /// Read the whole sectors covering `offset..offset+len`; returns their start and bytes.
    fn read_covering(&self, offset: u64, len: usize) -> io::Result<(u64, Vec<u8>)> {
        let start = offset / SECTOR * SECTOR;
        let end = (offset + len as u64).div_ceil(SECTOR) * SECTOR;
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
        if is_aligned(offset, buf.len()) {
            return self.0.read(offset, buf).map_err(io::Error::from);
        }
        let (start, mut whole) = self.read_covering(offset, buf.len())?;
        let at = (offset - start) as usize;
        buf.copy_from_slice(&whole[at..at + buf.len()]);
        whole.clear();
        Ok(())
    }

    fn write(&self, offset: u64, data: &[u8], fua: bool) -> io::Result<()> {
        if is_aligned(offset, data.len()) {
            return self.0.write(offset, data, fua).map_err(io::Error::from);
        }
        // A client that did not negotiate block sizes may send byte ranges: widen to whole
        // sectors (read, patch, write). Not atomic against a concurrent write to the same
        // edge sectors, which NBD leaves undefined anyway.
        let (start, mut whole) = self.read_covering(offset, data.len())?;
        let at = (offset - start) as usize;
        whole[at..at + data.len()].copy_from_slice(data);
        self.0.write(start, &whole, fua).map_err(io::Error::from)
    }

    fn flush(&self) -> io::Result<()> {
        self.0.flush().map_err(io::Error::from)
    }

    /// Trim is advisory in NBD; the array keeps the data (and its parity) as it is.
    fn trim(&self, _offset: u64, _len: u64, fua: bool) -> io::Result<()> {
        if fua {
            self.flush()?;
        }
        Ok(())
    }

    fn write_zeroes(&self, offset: u64, len: u64, fua: bool, _may_trim: bool) -> io::Result<()> {
        self.0
            .write_zeroes(offset, len, fua)
            .map_err(io::Error::from)
    }
}
