//! The stripe cache of the parity levels: where writes to one stripe meet and wait their turn.
//!
//! A *row* is one stripe of the layout (the chunks at the same device offset on every member).
//! Writers split their request into pieces (one per data chunk touched) and append them to
//! their rows' `pending` lists. The writer that finds a row without a leader becomes its
//! leader: it claims the row (waits until no batch of it runs: `busy`), waits for the writers
//! that are placing pieces into it at that moment (`arriving`), takes every pending piece as one
//! batch, computes parity once for all of them and writes. Other writers just wait for their
//! pieces' completion.
//!
//! There is no timer, as in md: a stripe is held only while a submitter is still adding to it
//! (md's plugging; here from a writer entering the write path, or from a frontend announcing a
//! write whose payload it is still receiving (`WriteIntent`), until its pieces are placed), and
//! pieces that arrive while a batch of the row is being handled join the row's next batch (the
//! leader waits for the claim meanwhile). So a sequential stream with many writes in flight
//! merges by itself, and a writer with nothing to merge with goes at once. The wait uses real
//! time only as its bound; a single-threaded (deterministic) run never has a writer arriving.
//! Consequences the rest of the engine relies on:
//! * `pending` non-empty ⇒ `leader` is true (whoever set `leader` takes them), checked by assert.
//! * `arriving` counts writers between announcing a row and placing their pieces in it (or
//!   withdrawing); each announcement is settled exactly once (checked by assert), and
//!   `settled` counts the settlements.
//! * At most one batch or exclusive reader per row at a time (`busy`), so reads of parity and
//!   data inside a batch are consistent, and degraded reads see whole stripes.
//! * The wait for arriving writers is bounded by the write hold and ends early when the row is
//!   full, a piece is FUA, or a flush hurries every row. Placing pieces never blocks, so it is
//!   normally microseconds (or a payload's arrival, for a `WriteIntent`); the bound covers an
//!   announced writer that waits for something else first (the byte budget, a sector lock, a
//!   CPU), so no chain of waits can close on itself.
//! * Memory is bounded: client data in pending pieces is limited by a byte budget taken before
//!   enqueueing (all of a request's budget at once, so no hold-and-wait deadlock).
//! * A piece's bytes are not copied: they are [`Lent`] by its writer, which waits for the
//!   piece's completion before it lets go of them, and no one reads them after that completion.
//!
//! Rows exist in the map only while some thread uses them (`users`); idle stripes are not kept.

use crate::intervals::merge;
use parking_lot::{Condvar, Mutex, MutexGuard};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

/// One piece of a client write: bytes for data chunk `data_index` of a row.
pub(crate) struct Piece {
    pub data_index: usize,
    /// Byte offset inside the chunk.
    pub offset: u64,
    pub data: Lent,
    pub fua: bool,
    pub done: Arc<Completion>,
}

impl Piece {
    pub fn end(&self) -> u64 {
        self.offset + self.data.len() as u64
    }
}

/// A writer's bytes, read by whichever thread leads the piece's row. Why not a copy: copying
/// each client write into stripe buffers was a tenth of a RAID5 daemon's CPU on 1 MiB writes
/// (`bench/profile --chunk 64K --rw write`, 2026-11-28), and the writer waits for its pieces
/// anyway.
pub(crate) struct Lent {
    ptr: *const u8,
    len: usize,
}

// SAFETY: a `Lent` only hands out shared reads of bytes that stay alive and unchanged while
// any thread may use it (the contract of `Lent::new`); `&[u8]` is `Send` and `Sync` itself.
unsafe impl Send for Lent {}
// SAFETY: as above.
unsafe impl Sync for Lent {}

impl Lent {
    /// Lend `bytes` to a piece.
    ///
    /// # Safety
    /// `bytes` must stay alive and unmodified until the piece's [`Completion`] has counted it
    /// (`Completion::complete`) and been waited for; after that completion no one may read
    /// through the `Lent` (it may still be dropped).
    pub unsafe fn new(bytes: &[u8]) -> Lent {
        Lent {
            ptr: bytes.as_ptr(),
            len: bytes.len(),
        }
    }
}

impl std::ops::Deref for Lent {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: the lender keeps the bytes alive until the piece completes (`Lent::new`),
        // and pieces are read only by the leader of their batch, before it completes them.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

/// Why a batch failed, as its pieces' requests see it.
#[derive(Clone, Debug)]
pub(crate) enum BatchError {
    /// A member's backing store is full.
    NoSpace,
    /// Redundancy could not cover the failures met (the reason).
    Failed(String),
    /// Writes are refused now (the journal failed: the reason).
    ReadOnly(String),
}

/// Completion of a whole client request: counts its pieces down, keeps the first error.
pub(crate) struct Completion {
    st: Mutex<(usize, Option<BatchError>)>,
    cv: Condvar,
}

impl Completion {
    pub fn new(pieces: usize) -> Arc<Completion> {
        Arc::new(Completion {
            st: Mutex::new((pieces, None)),
            cv: Condvar::new(),
        })
    }

    pub fn complete(&self, res: &Result<(), BatchError>) {
        let mut st = self.st.lock();
        assert!(st.0 > 0, "completion counted down past zero");
        st.0 -= 1;
        if let Err(e) = res {
            st.1.get_or_insert_with(|| e.clone());
        }
        if st.0 == 0 {
            self.cv.notify_all();
        }
    }

    pub fn wait(&self) -> Result<(), BatchError> {
        let mut st = self.st.lock();
        while st.0 > 0 {
            self.cv.wait(&mut st);
        }
        st.1.take().map_or(Ok(()), Err)
    }
}

#[derive(Default)]
pub(crate) struct RowState {
    pub pending: Vec<Piece>,
    pub leader: bool,
    pub busy: bool,
    pub hurry: bool,
    /// Writers that announced pieces for this row and have not placed them yet.
    pub arriving: usize,
}

pub(crate) struct Row {
    pub st: Mutex<RowState>,
    pub cv: Condvar,
}

struct Budget {
    avail: Mutex<usize>,
    cv: Condvar,
    total: usize,
}

pub(crate) struct StripeCache {
    rows: Mutex<HashMap<u64, (Arc<Row>, usize)>>,
    budget: Budget,
}

impl StripeCache {
    pub fn new(budget_bytes: usize) -> StripeCache {
        let total = budget_bytes.max(1 << 20);
        StripeCache {
            rows: Mutex::new(HashMap::new()),
            budget: Budget {
                avail: Mutex::new(total),
                cv: Condvar::new(),
                total,
            },
        }
    }

    /// Client data held now, and the most it may hold.
    pub fn usage(&self) -> crate::io::bufpool::PoolUsage {
        let avail = *self.budget.avail.lock();
        crate::io::bufpool::PoolUsage {
            limit_bytes: self.budget.total as u64,
            held_bytes: (self.budget.total - avail) as u64,
        }
    }

    /// Reserve room for `bytes` of client data (capped at the whole budget); returns the amount.
    pub fn reserve(&self, bytes: usize) -> usize {
        let want = bytes.min(self.budget.total);
        let mut avail = self.budget.avail.lock();
        while *avail < want {
            self.budget.cv.wait(&mut avail);
        }
        *avail -= want;
        want
    }

    pub fn unreserve(&self, bytes: usize) {
        let mut avail = self.budget.avail.lock();
        *avail += bytes;
        assert!(
            *avail <= self.budget.total,
            "stripe budget returned more than taken"
        );
        self.budget.cv.notify_all();
    }

    /// Take a reference to a row, creating it if needed.
    pub fn get(&self, row: u64) -> Arc<Row> {
        let mut rows = self.rows.lock();
        let entry = rows.entry(row).or_insert_with(|| {
            (
                Arc::new(Row {
                    st: Mutex::new(RowState::default()),
                    cv: Condvar::new(),
                }),
                0,
            )
        });
        entry.1 += 1;
        entry.0.clone()
    }

    /// Drop a reference taken by `get`; the row leaves the map with its last user.
    pub fn put(&self, row: u64) {
        let mut rows = self.rows.lock();
        let entry = rows
            .get_mut(&row)
            .expect("put of a row that was never taken");
        entry.1 -= 1;
        if entry.1 == 0 {
            let (r, _) = rows.remove(&row).expect("row present");
            let st = r.st.lock();
            assert!(
                st.pending.is_empty() && !st.leader && !st.busy,
                "row {row} left the cache with work in it"
            );
            assert_eq!(
                st.arriving, 0,
                "row {row} left the cache with a writer still placing pieces"
            );
        }
    }

    /// End every row's hold now (a flush arrived).
    pub fn hurry_all(&self) {
        let rows: Vec<Arc<Row>> = self.rows.lock().values().map(|(r, _)| r.clone()).collect();
        for r in rows {
            let mut st = r.st.lock();
            if st.leader {
                st.hurry = true;
                r.cv.notify_all();
            }
        }
    }
}

impl RowState {
    /// One announced writer has placed its pieces, or will not.
    pub fn settle(&mut self) {
        assert!(self.arriving > 0, "a row settled more often than announced");
        self.arriving -= 1;
    }
}

impl Row {
    /// Wait until no batch or exclusive reader runs, then claim the row.
    pub fn claim<'a>(&'a self, mut st: MutexGuard<'a, RowState>) -> MutexGuard<'a, RowState> {
        while st.busy {
            self.cv.wait(&mut st);
        }
        st.busy = true;
        st
    }

    /// Claim the row only if nobody holds it.
    pub fn try_claim(&self) -> bool {
        let mut st = self.st.lock();
        if st.busy {
            return false;
        }
        st.busy = true;
        true
    }

    /// Release a claim.
    pub fn release(&self) {
        let mut st = self.st.lock();
        assert!(st.busy, "release of an unclaimed row");
        st.busy = false;
        self.cv.notify_all();
    }

    /// A writer will place pieces here: a leader that has claimed the row waits for them.
    pub fn announce(&self) {
        self.st.lock().arriving += 1;
    }

    /// An announced writer will not place pieces after all (its request failed before).
    pub fn unannounce(&self) {
        let mut st = self.st.lock();
        st.settle();
        self.cv.notify_all();
    }

    /// Leader's wait, with the row claimed: for the writers that are placing pieces into it
    /// (the submitter is still adding, as under md's plug), until `deadline` at most; ends
    /// early when no writer is on its way here, or the row is full, hurried or has a FUA
    /// piece. Writers announced while it waits count too: a sequential stream of writes
    /// shorter than the row (1 MiB writes into a 3.5 MiB row) announces each write while the
    /// one before is placed (the NBD server reads its header ahead), and waiting only for the
    /// writers announced at the start wrote most rows in two batches, reading what the first
    /// left out. A stream that keeps coming holds a batch until the row is full or the
    /// deadline, no longer. `deadlines`: for a row of small pieces, and for one holding a whole
    /// chunk (`whole`: a stream's, whose rest is worth waiting longer for).
    pub fn gather<'a>(
        &'a self,
        mut st: MutexGuard<'a, RowState>,
        deadlines: (Instant, Instant),
        full: impl Fn(&[Piece]) -> bool,
        whole: impl Fn(&[Piece]) -> bool,
    ) -> MutexGuard<'a, RowState> {
        assert!(st.busy, "gathering into a row that is not claimed");
        while st.arriving > 0
            && !st.hurry
            && !st.pending.iter().any(|p| p.fua)
            && !full(&st.pending)
        {
            let deadline = if whole(&st.pending) {
                deadlines.1
            } else {
                deadlines.0
            };
            if self.cv.wait_until(&mut st, deadline).timed_out() {
                break;
            }
        }
        st
    }
}

/// True if every column some piece touches is covered by all `data_disks` data chunks: the
/// batch can then be written without reading anything.
pub(crate) fn covers_all(pending: &[Piece], data_disks: usize) -> bool {
    if pending.is_empty() {
        return false;
    }
    let union = merge(pending.iter().map(|p| (p.offset, p.end())).collect());
    (0..data_disks).all(|d| {
        let cov = merge(
            pending
                .iter()
                .filter(|p| p.data_index == d)
                .map(|p| (p.offset, p.end()))
                .collect(),
        );
        union
            .iter()
            .all(|u| cov.iter().any(|c| c.0 <= u.0 && u.1 <= c.1))
    })
}

impl crate::lock::StripeClaims for StripeCache {
    fn claim_rows(&self, first: u64, end: u64) -> crate::lock::RangeGuard<'_> {
        let rows = (first..end)
            .map(|row| {
                let r = self.get(row);
                drop(r.claim(r.st.lock()));
                r
            })
            .collect();
        Box::new(StripeGuard {
            stripes: self,
            first,
            rows,
        })
    }
}

/// Claimed stripes, released (and their cache entries put back) on drop.
struct StripeGuard<'a> {
    stripes: &'a StripeCache,
    first: u64,
    rows: Vec<Arc<Row>>,
}

impl Drop for StripeGuard<'_> {
    fn drop(&mut self) {
        for (i, r) in std::mem::take(&mut self.rows).into_iter().enumerate() {
            r.release();
            self.stripes.put(self.first + i as u64);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    static BYTES: [u8; 8192] = [0; 8192];

    fn piece(d: usize, off: u64, len: usize) -> Piece {
        Piece {
            data_index: d,
            offset: off,
            // SAFETY: static bytes outlive every piece.
            data: unsafe { Lent::new(&BYTES[..len]) },
            fua: false,
            done: Completion::new(1),
        }
    }

    #[test]
    fn pieces_cover_a_row_only_when_every_column_is_whole() {
        let p = vec![piece(0, 0, 4096), piece(1, 0, 4096)];
        assert!(!covers_all(&p, 3));
        let p = vec![
            piece(0, 0, 4096),
            piece(1, 0, 2048),
            piece(1, 2048, 2048),
            piece(2, 0, 4096),
        ];
        assert!(covers_all(&p, 3));
        let p = vec![piece(0, 0, 4096), piece(1, 512, 4096), piece(2, 0, 4096)];
        assert!(!covers_all(&p, 3));
    }
}
