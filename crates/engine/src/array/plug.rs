//! The frontend's plugging (md's plug), as the facade offers it: a write announced before its
//! data arrives, and writes that arrived together. The stripe path's side is the parity
//! personality's (`personality/intent.rs`, `personality/gathered.rs`).

use super::Array;
use crate::error::{EngineError, Result};
use crate::personality::gathered::GatheredWrite;
use crate::personality::intent::WriteIntent;
use std::sync::Arc;

impl Array {
    /// Announce a write of `len_bytes` at `offset_bytes` whose data is still on its way.
    pub fn intend_write(self: &Arc<Self>, offset_bytes: u64, len_bytes: u64) -> WriteIntent {
        // Only the stripe path has rows to announce.
        let announcing = self.personality.as_parity().filter(|_| {
            len_bytes > 0
                && !self.is_read_only()
                && self.check_range(offset_bytes, len_bytes).is_ok()
        });
        let rows = match announcing {
            Some(parity) => parity.announce_rows(self, offset_bytes, len_bytes as usize),
            None => Vec::new(),
        };
        WriteIntent::new(self.stripes.clone(), offset_bytes, len_bytes, rows)
    }

    /// [`Array::write`] of the write `intent` announced (same offset and length).
    pub fn write_intended(&self, intent: WriteIntent, data: &[u8], fua: bool) -> Result<()> {
        assert!(
            Arc::ptr_eq(&intent.stripes, &self.stripes),
            "a write intent used on another array"
        );
        let offset_bytes = intent.offset_bytes();
        self.write_with(offset_bytes, data, fua, Some(intent))
    }

    /// Writes that arrived together: one result per write, in order. They must not overlap
    /// (a frontend gathers a sequential stream: each begins where the one before ends).
    pub fn write_gathered(&self, writes: Vec<GatheredWrite<'_>>) -> Vec<Result<()>> {
        let Some(parity) = self.personality.as_parity().filter(|_| writes.len() >= 2) else {
            return writes
                .into_iter()
                .map(|w| self.write_with(w.offset_bytes, w.data, w.fua, w.intent))
                .collect();
        };
        let n = writes.len();
        self.sync.note_client_io();
        match self.as_client_write(|| Ok(parity.write_gathered(self, writes))) {
            Ok(results) => results,
            Err(EngineError::ReadOnly { array, reason }) => (0..n)
                .map(|_| {
                    Err(EngineError::ReadOnly {
                        array: array.clone(),
                        reason: reason.clone(),
                    })
                })
                .collect(),
            Err(e) => unreachable!("a client write is refused only as read-only: {e}"),
        }
    }
}
