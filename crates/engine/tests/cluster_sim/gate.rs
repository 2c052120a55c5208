//! A node's view of the shared members: every device call waits at the node's gate until
//! the scheduler grants it; once the node is dead, calls fail without reaching the member.

use crate::world::{Block, Instr, World};
use device::{Device, SimDevice};
use std::io;
use std::sync::Arc;

pub struct Gated {
    pub inner: Arc<SimDevice>,
    pub world: Arc<World>,
    pub node: usize,
    pub dev: usize,
}

impl Gated {
    fn pass(&self, what: &'static str) -> io::Result<()> {
        let mut st = self.world.lock();
        let block = Block::Gate {
            dev: self.dev,
            what,
        };
        match self.world.wait_turn(&mut st, self.node, block) {
            Instr::Go => Ok(()),
            Instr::Die => Err(io::Error::other("this node is dead")),
            other => unreachable!("{other:?} at a member gate"),
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

    fn read_at(&self, buf: &mut [u8], offset_bytes: u64) -> io::Result<()> {
        self.pass("read")?;
        self.inner.read_at(buf, offset_bytes)
    }

    fn write_at(&self, buf: &[u8], offset_bytes: u64, fua: bool) -> io::Result<()> {
        self.pass("write")?;
        self.inner.write_at(buf, offset_bytes, fua)
    }

    fn write_vectored_at(&self, bufs: &[&[u8]], offset_bytes: u64, fua: bool) -> io::Result<()> {
        self.pass("write")?;
        self.inner.write_vectored_at(bufs, offset_bytes, fua)
    }

    fn flush(&self) -> io::Result<()> {
        self.pass("flush")?;
        self.inner.flush()
    }

    fn discard_zeroes(&self, offset_bytes: u64, len_bytes: u64) -> io::Result<()> {
        self.pass("discard")?;
        self.inner.discard_zeroes(offset_bytes, len_bytes)
    }
}
