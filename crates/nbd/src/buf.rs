//! Page-aligned byte buffers without `unsafe`: over-allocate a `Vec` and use
//! the aligned window inside it, so backends may hand the slice to O_DIRECT.
//!
//! Large payload buffers come from a [`BufPool`] and go back to it when
//! dropped: a stream of 1 MiB requests then reuses the same few buffers
//! instead of asking the allocator for fresh ones each time, which costs page
//! faults and, with many connection threads, leaves freed buffers held in the
//! allocator's per-thread arenas (a daemon's memory then grows with its
//! connections, not with its settings). What the pool keeps is bounded.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Alignment of every payload buffer.
pub const BUF_ALIGN: usize = 4096;

/// Buffers smaller than this are not pooled: the allocator serves them from
/// its small-object caches anyway.
const POOLED_FROM: usize = 64 << 10;

/// A buffer of `len` bytes whose start is 4 KiB aligned.
pub struct AlignedBuf {
    storage: Vec<u8>,
    start: usize,
    len: usize,
    /// Where the storage goes back to when the buffer is dropped.
    pool: Option<Arc<BufPool>>,
}

impl AlignedBuf {
    /// Allocates `len` zeroed bytes, 4 KiB aligned.
    pub fn new(len: usize) -> AlignedBuf {
        AlignedBuf::over(vec![0u8; len + BUF_ALIGN], len, None)
    }

    fn over(storage: Vec<u8>, len: usize, pool: Option<Arc<BufPool>>) -> AlignedBuf {
        assert!(storage.len() >= len + BUF_ALIGN, "storage too small");
        let start = storage.as_ptr().align_offset(BUF_ALIGN);
        // `align_offset` may, in theory, give up (usize::MAX); fall back to an
        // unaligned but correct window then.
        let start = if start < BUF_ALIGN { start } else { 0 };
        AlignedBuf {
            storage,
            start,
            len,
            pool,
        }
    }

    /// The payload bytes.
    pub fn as_slice(&self) -> &[u8] {
        &self.storage[self.start..self.start + self.len]
    }

    /// The payload bytes, mutable.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        &mut self.storage[self.start..self.start + self.len]
    }

    /// Payload length.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for a zero-length buffer.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        if let Some(pool) = self.pool.take() {
            pool.put(std::mem::take(&mut self.storage));
        }
    }
}

/// Free storage by size, and the bytes it holds.
type Free = (HashMap<usize, Vec<Vec<u8>>>, usize);

/// Payload buffers kept for reuse, by storage size, up to `limit` bytes.
pub(crate) struct BufPool {
    free: Mutex<Free>,
    limit: usize,
}

impl BufPool {
    pub(crate) fn new(limit: usize) -> Arc<BufPool> {
        Arc::new(BufPool {
            free: Mutex::new((HashMap::new(), 0)),
            limit,
        })
    }

    /// Storage of `len` bytes rounded up to whole 64 KiB plus the alignment slack: requests of
    /// nearby sizes share buffers.
    fn storage_len(len: usize) -> usize {
        len.div_ceil(POOLED_FROM) * POOLED_FROM + BUF_ALIGN
    }

    /// A buffer that the caller overwrites whole before anyone reads it (a WRITE's payload,
    /// read from the socket): a reused one keeps the bytes of its last use.
    pub(crate) fn for_overwrite(self: &Arc<Self>, len: usize) -> AlignedBuf {
        if len < POOLED_FROM {
            return AlignedBuf::new(len);
        }
        let size = Self::storage_len(len);
        let reused = {
            let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
            let buf = free.0.get_mut(&size).and_then(Vec::pop);
            if buf.is_some() {
                free.1 -= size;
            }
            buf
        };
        let storage = reused.unwrap_or_else(|| vec![0u8; size]);
        AlignedBuf::over(storage, len, Some(self.clone()))
    }

    /// A zeroed buffer (a READ's reply: nothing of an earlier request may reach a client, even
    /// from a backend that fills less than it should).
    pub(crate) fn zeroed(self: &Arc<Self>, len: usize) -> AlignedBuf {
        let mut buf = self.for_overwrite(len);
        if buf.pool.is_some() {
            buf.as_mut_slice().fill(0);
        }
        buf
    }

    fn put(&self, storage: Vec<u8>) {
        let size = storage.len();
        let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
        if free.1 + size <= self.limit {
            free.1 += size;
            free.0.entry(size).or_default().push(storage);
        }
    }

    /// Bytes held for reuse now (at most the limit).
    pub(crate) fn held(&self) -> usize {
        self.free.lock().unwrap_or_else(|e| e.into_inner()).1
    }

    pub(crate) fn limit(&self) -> usize {
        self.limit
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned() {
        for len in [0, 1, 511, 4096, 65537] {
            let mut b = AlignedBuf::new(len);
            assert_eq!(b.len(), len);
            assert_eq!(b.as_slice().as_ptr() as usize % BUF_ALIGN, 0);
            b.as_mut_slice().fill(7);
            assert!(b.as_slice().iter().all(|&x| x == 7));
        }
    }

    #[test]
    fn pooled_buffers_come_back_and_stay_bounded() {
        let pool = BufPool::new(3 << 20);
        let mut a = pool.for_overwrite(1 << 20);
        a.as_mut_slice().fill(0xee);
        let first = a.as_slice().as_ptr();
        drop(a);
        assert!(pool.held() > 1 << 20);
        // The same storage again; a zeroed one shows nothing of its last use.
        let b = pool.zeroed(1 << 20);
        assert_eq!(b.as_slice().as_ptr(), first);
        assert!(b.as_slice().iter().all(|&x| x == 0));
        assert_eq!(b.as_slice().as_ptr() as usize % BUF_ALIGN, 0);
        drop(b);
        // Past the limit, what comes back is freed.
        let many: Vec<AlignedBuf> = (0..5).map(|_| pool.for_overwrite(1 << 20)).collect();
        drop(many);
        assert!(pool.held() <= 3 << 20, "{}", pool.held());
        // Small ones are not pooled.
        drop(pool.for_overwrite(4096));
        assert!(pool.held() <= 3 << 20);
    }
}
