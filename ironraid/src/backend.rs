//! The NBD export of an array: the engine's API behind the `nbd::Backend` trait.

use engine::Array;
use nbd::{Backend, BlockSizes};
use std::io;
use std::sync::Arc;

pub struct ArrayBackend(pub Arc<Array>);

impl Backend for ArrayBackend {
    fn size_bytes(&self) -> u64 {
        self.0.size_bytes()
    }

    fn read_only(&self) -> bool {
        self.0.is_read_only()
    }

    fn block_sizes(&self) -> BlockSizes {
        let chunk = (self.0.geometry().chunk_sectors() * 512) as u32;
        BlockSizes { min: 512, preferred: chunk.clamp(4096, 1 << 20), max: nbd::MAX_PAYLOAD }
    }

    fn read(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        self.0.read(offset, buf).map_err(io::Error::from)
    }

    fn write(&self, offset: u64, data: &[u8], fua: bool) -> io::Result<()> {
        self.0.write(offset, data, fua).map_err(io::Error::from)
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
        self.0.write_zeroes(offset, len, fua).map_err(io::Error::from)
    }
}
