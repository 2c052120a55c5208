//! Reusable page-aligned buffers for stripe work.
//!
//! Why: stripe operations need several chunk-sized buffers each; fresh large allocations are
//! mmap'd and zero-filled by the kernel page by page (page faults and memset were ~15% of a
//! RAID6 write profile). Buffers come back here when dropped and are handed out again without
//! clearing: every user overwrites a buffer completely (read from a member, reconstructed,
//! or computed) before looking at it. The pool keeps at most `limit` bytes.

use device::AlignedBuf;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::ops::{Deref, DerefMut};
use std::sync::Arc;

pub(crate) struct BufPool {
    free: Mutex<(HashMap<usize, Vec<AlignedBuf>>, usize)>,
    limit: usize,
}

impl BufPool {
    pub fn new(limit: usize) -> Arc<BufPool> {
        Arc::new(BufPool {
            free: Mutex::new((HashMap::new(), 0)),
            limit,
        })
    }

    /// Free buffers kept for reuse now, and the most it keeps.
    pub fn usage(&self) -> PoolUsage {
        PoolUsage {
            limit_bytes: self.limit as u64,
            held_bytes: self.free.lock().1 as u64,
        }
    }

    /// A buffer of `len` bytes with unspecified contents.
    pub fn get(self: &Arc<Self>, len: usize) -> PoolBuf {
        let reused = {
            let mut free = self.free.lock();
            let buf = free.0.get_mut(&len).and_then(Vec::pop);
            if buf.is_some() {
                free.1 -= len;
            }
            buf
        };
        PoolBuf {
            buf: Some(reused.unwrap_or_else(|| AlignedBuf::zeroed(len))),
            pool: self.clone(),
        }
    }

    fn put(&self, buf: AlignedBuf) {
        let mut free = self.free.lock();
        if free.1 + buf.len() <= self.limit {
            free.1 += buf.len();
            free.0.entry(buf.len()).or_default().push(buf);
        }
    }
}

/// A buffer on loan from a [`BufPool`].
pub(crate) struct PoolBuf {
    buf: Option<AlignedBuf>,
    pool: Arc<BufPool>,
}

impl PoolBuf {
    /// Another pool buffer holding a copy of this one.
    pub fn duplicate(&self) -> PoolBuf {
        let mut b = self.pool.get(self.len());
        b.copy_from_slice(self);
        b
    }
}

impl Deref for PoolBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.buf.as_ref().expect("present until drop")
    }
}

impl DerefMut for PoolBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        self.buf.as_mut().expect("present until drop")
    }
}

impl Drop for PoolBuf {
    fn drop(&mut self) {
        if let Some(b) = self.buf.take() {
            self.pool.put(b);
        }
    }
}

/// A bounded pool or cache: what it holds now and the most it may hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PoolUsage {
    pub limit_bytes: u64,
    pub held_bytes: u64,
}
