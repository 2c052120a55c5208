//! The one range lock: whatever must keep client writes out of a range while it works there
//! takes a [`RangeGuard`] on it. Background windows (rebuild, resync, check/repair) do, mirror
//! writes do, and verify reads and cluster extent locks will.
//!
//! Parity levels lock whole stripes with the stripe cache's exclusive claim, the same one a
//! write batch or a degraded read takes, so a locked stripe has no batch running and gets none
//! until the guard drops. Mirror levels lock the fixed-size regions (hashed onto a table of
//! mutexes) that every mirror write takes. Both take their parts in ascending order and hold no
//! other lock while waiting, so guards cannot deadlock with each other or with client I/O.
//! The guard releases on drop.

use crate::array::Array;
use crate::stripe_cache::Row;
use parking_lot::MutexGuard;
use std::sync::Arc;

pub(crate) struct RangeGuard<'a> {
    array: &'a Array,
    held: Held<'a>,
}

enum Held<'a> {
    Stripes {
        first: u64,
        rows: Vec<Arc<Row>>,
    },
    /// Held only to be dropped with the guard.
    Regions(#[allow(dead_code)] Vec<MutexGuard<'a, ()>>),
}

impl Array {
    /// Lock stripes `r0..r1` of a parity level.
    pub(crate) fn lock_stripes(&self, r0: u64, r1: u64) -> RangeGuard<'_> {
        assert!(self.geometry.level().is_parity(), "stripes are parity rows");
        let rows = (r0..r1)
            .map(|row| {
                let r = self.stripes.get(row);
                drop(r.claim(r.st.lock()));
                r
            })
            .collect();
        RangeGuard {
            array: self,
            held: Held::Stripes { first: r0, rows },
        }
    }

    /// Lock array bytes `at..at + len` of a mirror level.
    pub(crate) fn lock_array_range(&self, at: u64, len: u64) -> RangeGuard<'_> {
        assert!(
            !self.geometry.level().is_parity(),
            "parity levels lock stripes"
        );
        RangeGuard {
            array: self,
            held: Held::Regions(self.regions.lock_range(at, len)),
        }
    }
}

impl Array {
    /// Lock `at..at + len` of md's sync coordinates (what the bitmap, the used-region map and
    /// the background walks use): the stripes holding those per-member bytes for parity levels,
    /// the same array bytes for mirrors.
    pub(crate) fn lock_sync_range(&self, at: u64, len: u64) -> RangeGuard<'_> {
        if self.geometry.level().is_parity() {
            let chunk = self.geometry.chunk_sectors() * 512;
            self.lock_stripes(at / chunk, (at + len).div_ceil(chunk))
        } else {
            self.lock_array_range(at, len)
        }
    }
}

impl Drop for RangeGuard<'_> {
    fn drop(&mut self) {
        if let Held::Stripes { first, rows } = &mut self.held {
            for (i, r) in std::mem::take(rows).into_iter().enumerate() {
                r.release();
                self.array.stripes.put(*first + i as u64);
            }
        }
    }
}
