//! The replay log: every write sent since the last flush that covered it.
//!
//! Why: when a connection drops, what the server holds is unknown. A write in flight may or may
//! not have landed; a write acknowledged but not yet flushed may be gone if the server
//! restarted (nbdkit's file plugin leaves it in the page cache, but a server with its own cache,
//! or a restarted host, loses it). The device promised the engine nothing more than "acknowledged
//! writes are readable, flushed ones durable", and a lost unflushed write breaks the first half.
//! So a reconnect re-sends, in their original order, every write the log holds before any new
//! request goes out: writes are idempotent, and the original order makes overlapping writes end
//! as they did.
//!
//! An entry leaves the log when a flush that was sent after the entry's write completed
//! succeeds (NBD only promises a flush covers writes completed before it was sent). The log is
//! bounded: past [`MAX_LOG_BYTES`] the device sends a flush of its own.

use std::collections::BTreeMap;
use std::sync::Arc;

/// Bytes of write data the log holds before the device flushes on its own.
pub const MAX_LOG_BYTES: u64 = 16 << 20;
/// Bytes of buffers of forgotten writes kept for the next writes' copies. Why: a large buffer
/// freed goes back to the kernel and a new one is faulted in page by page (measured: the page
/// faults cost as much as the copy itself).
const SPARE_BYTES: usize = 32 << 20;

/// What a logged write put on the export.
#[derive(Clone)]
pub enum Written {
    Data(Arc<Vec<u8>>),
    Zeroes(u32),
}

#[derive(Clone)]
pub struct Entry {
    pub offset_bytes: u64,
    pub written: Written,
    /// The server acknowledged it (a flush sent from now on covers it).
    done: bool,
}

impl Written {
    pub fn len_bytes(&self) -> u64 {
        match self {
            Written::Data(d) => d.len() as u64,
            Written::Zeroes(n) => u64::from(*n),
        }
    }
}

impl Entry {
    /// Whether the two writes touch a byte in common.
    pub fn overlaps(&self, other: &Entry) -> bool {
        self.offset_bytes < other.offset_bytes + other.written.len_bytes()
            && other.offset_bytes < self.offset_bytes + self.written.len_bytes()
    }
}

/// Log entries by sequence number (sending order).
#[derive(Default)]
pub struct ReplayLog {
    entries: BTreeMap<u64, Entry>,
    next_seq: u64,
    data_bytes: u64,
    spare: Vec<Vec<u8>>,
    spare_bytes: usize,
}

impl ReplayLog {
    /// Record a write about to be sent; returns its sequence number.
    pub fn push(&mut self, offset_bytes: u64, written: Written) -> u64 {
        let seq = self.next_seq;
        self.next_seq += 1;
        if let Written::Data(d) = &written {
            self.data_bytes += d.len() as u64;
        }
        let entry = Entry {
            offset_bytes,
            written,
            done: false,
        };
        self.entries.insert(seq, entry);
        seq
    }

    /// The server acknowledged write `seq`.
    pub fn complete(&mut self, seq: u64) {
        if let Some(e) = self.entries.get_mut(&seq) {
            e.done = true;
        }
    }

    /// Forget `seq` (a write the server refused: the member is failing, no replay can help).
    pub fn drop_entry(&mut self, seq: u64) {
        if let Some(e) = self.entries.remove(&seq) {
            self.forget_bytes(&e);
            self.recycle(e.written);
        }
    }

    /// An empty buffer for a write of `len` bytes: a spare one when one fits (not more than
    /// twice as large), else a new one.
    pub fn buffer(&mut self, len: usize) -> Vec<u8> {
        let fits = |b: &Vec<u8>| b.capacity() >= len && b.capacity() <= 2 * len.max(4096);
        match self.spare.iter().position(fits) {
            Some(i) => {
                let mut b = self.spare.swap_remove(i);
                self.spare_bytes -= b.capacity();
                b.clear();
                b
            }
            None => Vec::with_capacity(len),
        }
    }

    fn recycle(&mut self, written: Written) {
        let Written::Data(data) = written else { return };
        let Ok(buf) = Arc::try_unwrap(data) else {
            return;
        };
        if self.spare_bytes + buf.capacity() <= SPARE_BYTES {
            self.spare_bytes += buf.capacity();
            self.spare.push(buf);
        }
    }

    /// Writes a flush sent now covers: the acknowledged ones.
    pub fn covered_by_flush(&self) -> Vec<u64> {
        self.entries
            .iter()
            .filter(|(_, e)| e.done)
            .map(|(&seq, _)| seq)
            .collect()
    }

    /// A flush covering `seqs` succeeded: they are durable and need no replay.
    pub fn flushed(&mut self, seqs: &[u64]) {
        for seq in seqs {
            self.drop_entry(*seq);
        }
    }

    /// Every logged write, oldest first (what a reconnect re-sends).
    pub fn snapshot(&self) -> Vec<(u64, Entry)> {
        self.entries.iter().map(|(&s, e)| (s, e.clone())).collect()
    }

    pub fn over_limit(&self) -> bool {
        self.data_bytes > MAX_LOG_BYTES
    }

    fn forget_bytes(&mut self, e: &Entry) {
        if let Written::Data(d) = &e.written {
            assert!(
                self.data_bytes >= d.len() as u64,
                "log byte count underflow"
            );
            self.data_bytes -= d.len() as u64;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flush_covers_only_writes_acknowledged_before_it() {
        let mut log = ReplayLog::default();
        let a = log.push(0, Written::Data(Arc::new(vec![1u8; 512])));
        let b = log.push(512, Written::Zeroes(512));
        log.complete(a);
        let covered = log.covered_by_flush();
        assert_eq!(covered, vec![a]);
        // b completes while the flush is in flight: the flush does not cover it.
        log.complete(b);
        log.flushed(&covered);
        let left: Vec<u64> = log.snapshot().iter().map(|(s, _)| *s).collect();
        assert_eq!(left, vec![b]);
        assert_eq!(log.data_bytes, 0);
        // a's buffer is reused for the next write of its size.
        assert_eq!(log.buffer(512).capacity(), 512);
        assert_eq!(log.spare_bytes, 0);
    }
}
