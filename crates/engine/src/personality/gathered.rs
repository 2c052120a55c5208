//! Writes that arrived together from one submitter (a frontend's run of a sequential stream's
//! requests): md's plug. A plugged submitter queues its bios and releases them at once, so
//! raid5 sees every bio of a stripe before it handles the stripe; here every write of the run
//! places its pieces in their rows before any row is led, so writes that share a stripe go out
//! as one read-modify-write or reconstruct-write, with no thread hand-off between them.
//!
//! Why the rows are led only after every write is placed: a leader waits for the writers
//! announced to its row (`stripe_cache`); the run's later writes are announced (their intents)
//! but placed by this same thread, so leading before placing them would wait the hold out.
//! Each write keeps what [`Array::write`] gives it alone: its range checked, counted as a
//! client write in flight, watched by a guide, its own result. The run's bytes are reserved in
//! the stripe budget at once (all or nothing), so no part is held while another is waited for.
//! Levels without a stripe cache run the writes one after the other.

use crate::error::{EngineError, Result};
use crate::personality::intent::WriteIntent;
use crate::personality::parts::Parts;
use crate::personality::Parity;

/// One write of a gathered run.
pub struct GatheredWrite<'a> {
    pub offset_bytes: u64,
    pub data: &'a [u8],
    pub fua: bool,
    /// Its announcement, if the frontend made one ([`Array::intend_write`], same range).
    pub intent: Option<WriteIntent>,
}

impl Parity {
    /// [`Array::write_gathered`] on the stripe path: the run's pieces are placed into their
    /// stripes together, so that a stripe they fill is written once.
    pub(crate) fn write_gathered(
        &self,
        array: &Parts,
        writes: Vec<GatheredWrite<'_>>,
    ) -> Vec<Result<()>> {
        let mut results: Vec<Option<Result<()>>> = Vec::with_capacity(writes.len());
        let mut taken = Vec::new();
        for w in writes {
            let len = w.data.len() as u64;
            let at = w.offset_bytes;
            let checked = array
                .check_range(at, len)
                .and_then(|()| array.policy.before_client_io(array, at, len, true));
            match checked {
                Ok(()) => {
                    let watched = array.policy.write_begins(array, at, len, Some(w.data));
                    taken.push((results.len(), w, watched));
                    results.push(None);
                }
                // Dropping an intent withdraws its announcement.
                Err(e) => results.push(Some(Err(e))),
            }
        }
        // The run's stripes are owned at once, before any is announced or placed: a node
        // never holds some of them while it waits for others (see `cluster::OwnedStripes`).
        let hull = taken
            .iter()
            .map(|(_, w, _)| (w.offset_bytes, w.offset_bytes + w.data.len() as u64))
            .reduce(|(a, b), (c, d)| (a.min(c), b.max(d)));
        let _owned = match hull.map(|(a, b)| self.own_rows(array, a, b - a)) {
            Some(Err(reason)) => {
                for (i, w, watched) in taken {
                    array.policy.write_ended(array, watched, false, w.fua);
                    results[i] = Some(Err(EngineError::Unavailable {
                        array: array.name.clone(),
                        reason: reason.clone(),
                    }));
                }
                return results.into_iter().map(|r| r.expect("refused")).collect();
            }
            owned => owned,
        };
        let bytes = taken.iter().map(|(_, w, _)| w.data.len()).sum();
        let reserved = array.stripes.reserve(bytes);
        let mut led = Vec::new();
        let placed: Vec<_> = taken
            .into_iter()
            .map(|(i, w, watched)| {
                let p = self.parity_place(array, w.offset_bytes, w.data, w.fua, w.intent, &mut led);
                (i, w.fua, p, watched)
            })
            .collect();
        for (row, r) in &led {
            self.lead_batch(array, *row, r);
        }
        let done: Vec<_> = placed
            .into_iter()
            .map(|(i, fua, p, watched)| (i, fua, self.parity_wait(array, p), watched))
            .collect();
        array.stripes.unreserve(reserved);
        array.records_after_write(done.iter().any(|(_, fua, r, _)| *fua && r.is_ok()));
        for (i, fua, res, watched) in done {
            array.policy.write_ended(array, watched, res.is_ok(), fua);
            results[i] = Some(res);
        }
        results
            .into_iter()
            .map(|r| r.expect("every write of the run has its result"))
            .collect()
    }
}
