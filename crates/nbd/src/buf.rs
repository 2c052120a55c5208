//! Page-aligned byte buffers without `unsafe`: over-allocate a `Vec` and use
//! the aligned window inside it, so backends may hand the slice to O_DIRECT.

/// Alignment of every payload buffer.
pub const BUF_ALIGN: usize = 4096;

/// A zero-initialised buffer of `len` bytes whose start is 4 KiB aligned.
pub struct AlignedBuf {
    storage: Vec<u8>,
    start: usize,
    len: usize,
}

impl AlignedBuf {
    /// Allocates `len` zeroed bytes, 4 KiB aligned.
    pub fn new(len: usize) -> AlignedBuf {
        let storage = vec![0u8; len + BUF_ALIGN];
        let start = storage.as_ptr().align_offset(BUF_ALIGN);
        // `align_offset` may, in theory, give up (usize::MAX); fall back to an
        // unaligned but correct window then.
        let start = if start < BUF_ALIGN { start } else { 0 };
        AlignedBuf {
            storage,
            start,
            len,
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
}
