//! Announcing a write before its data has arrived: the frontend's half of md's plugging.
//!
//! A frontend that has read a write request's header and is still receiving its payload knows
//! more is coming for those stripes, as a submitter under md's plug does. With a
//! [`WriteIntent`] it says so: the rows the write will touch count it as arriving (see
//! `stripe_cache`), so a leader of one of them waits for its pieces (up to the write hold)
//! instead of writing a partial stripe that the next request of a stream would have filled.
//! The intent is consumed by [`Array::write_intended`], whose pieces then take its place; if
//! the request never gets that far (payload lost, request refused), dropping the intent
//! withdraws the announcement. Invariant: every row announced by an intent is either handed to
//! the write or unannounced and released on drop, exactly once.

use crate::personality::parts::Parts;
use crate::personality::stripe_cache::{Row, StripeCache};
use std::sync::Arc;

/// A write announced to the stripes it will touch (parity levels; empty for the others and
/// for ranges a write would refuse).
pub struct WriteIntent {
    /// The announcing array's stripe cache (where the rows go back on drop).
    pub(crate) stripes: Arc<StripeCache>,
    offset_bytes: u64,
    len_bytes: u64,
    /// Announced rows not yet handed over, each with a reference taken on it.
    rows: Vec<(u64, Arc<Row>)>,
}

impl WriteIntent {
    /// An intent for `len_bytes` at `offset_bytes` on the array whose stripes are `stripes`,
    /// with the rows announced for it.
    pub(crate) fn new(
        stripes: Arc<StripeCache>,
        offset_bytes: u64,
        len_bytes: u64,
        rows: Vec<(u64, Arc<Row>)>,
    ) -> Self {
        WriteIntent {
            stripes,
            offset_bytes,
            len_bytes,
            rows,
        }
    }

    /// Where the announced write starts (array bytes).
    pub(crate) fn offset_bytes(&self) -> u64 {
        self.offset_bytes
    }

    /// Hand the announced rows to the write of `len` bytes at `offset_bytes` on `array`.
    pub(crate) fn take_rows(
        mut self,
        array: &Parts,
        offset_bytes: u64,
        len: usize,
    ) -> Vec<(u64, Arc<Row>)> {
        assert_eq!(
            (self.offset_bytes, self.len_bytes),
            (offset_bytes, len as u64),
            "a write intent used for another range"
        );
        if self.rows.is_empty() {
            // Not announced when made (a level, range or state that did not call for it).
            return array.parity().announce_rows(array, offset_bytes, len);
        }
        std::mem::take(&mut self.rows)
    }
}

impl Drop for WriteIntent {
    fn drop(&mut self) {
        for (row, r) in self.rows.drain(..) {
            r.unannounce();
            self.stripes.put(row);
        }
    }
}
