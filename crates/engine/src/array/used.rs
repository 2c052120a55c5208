//! The facade's use of the used-region map (`policy/used.rs`): reads of regions that hold no
//! data, and trim, which releases whole regions through the commit point.

use super::Array;
use crate::error::Result;
use crate::io::commit::WriteSet;
use crate::io::{IoKind, MemberIo};
use crate::lock::LockRange;
use crate::policy::used::UsedRegions;
use std::ops::Range;

impl Array {
    /// Array bytes `offset..offset+len` as runs `(len, zero)` in order: `zero` runs lie in
    /// regions that hold no data (never written since create, or trimmed since), so they read
    /// as zeroes without touching the members (whatever those hold there: garbage left behind
    /// the array's back included). Without a map, one run of data.
    pub fn zero_runs(&self, offset: u64, len: u64) -> Vec<(u64, bool)> {
        // In a cluster another node may have written a region this node's map has clear.
        let Some(used) = self.used.as_ref().filter(|u| u.nodes().is_none()) else {
            return vec![(len, false)];
        };
        // Regions cover whole stripes, so each is one contiguous span of array bytes.
        let step = self.personality.array_bytes_of(used.region_bytes());
        let end = offset + len;
        let mut runs: Vec<(u64, bool)> = Vec::new();
        let mut at = offset;
        while at < end {
            let r = at / step;
            let next = ((r + 1) * step).min(end);
            let zero = self.region_reads_as_zero(used, r);
            match runs.last_mut() {
                Some((n, z)) if *z == zero => *n += next - at,
                _ => runs.push((next - at, zero)),
            }
            at = next;
        }
        runs
    }

    fn region_reads_as_zero(&self, used: &UsedRegions, r: u64) -> bool {
        // A write-back journal acknowledges writes before they reach the members (and before
        // their regions are marked): that would need the cache asked first. Arrays with a
        // journal keep no map.
        debug_assert!(self.policy.journal().is_none(), "a journal and a used map");
        r < used.regions() && !used.is_set(r)
    }

    /// Trim: release the whole regions inside array bytes `offset..offset+len` (discarded on
    /// every member, marked unused). The rest is left as it is: a trim promises nothing about
    /// what reads of the range return.
    pub fn trim(&self, offset_bytes: u64, len_bytes: u64) -> Result<()> {
        self.check_range(offset_bytes, len_bytes)?;
        self.release_whole_regions(offset_bytes, len_bytes)
            .map(|_| ())
    }

    /// Release the whole regions inside array bytes `offset..offset+len`; returns the array
    /// bytes released (None: nothing, or no used-region map).
    pub(crate) fn release_whole_regions(
        &self,
        offset_bytes: u64,
        len_bytes: u64,
    ) -> Result<Option<Range<u64>>> {
        // A cluster's nodes never clear bits: a region one node released could be in use
        // by another, whose map it cannot clear.
        let Some(used) = self.used.as_ref().filter(|u| u.nodes().is_none()) else {
            return Ok(None);
        };
        let (at, len) = self.personality.sync_range_within(offset_bytes, len_bytes);
        let rs = used.whole_regions(at, len);
        if rs.is_empty() {
            return Ok(None);
        }
        self.as_client_write(|| {
            let watched = self
                .policy
                .write_begins(&self.parts, offset_bytes, len_bytes, None);
            let res = rs.clone().try_for_each(|r| self.release_region(used, r));
            self.policy
                .write_ended(&self.parts, watched, res.is_ok(), false);
            res
        })?;
        let rb = used.region_bytes();
        Ok(Some(
            self.personality.array_bytes_of(rs.start * rb)
                ..self.personality.array_bytes_of(rs.end * rb),
        ))
    }

    fn release_region(&self, used: &UsedRegions, r: u64) -> Result<()> {
        let rb = used.region_bytes();
        let at = r * rb;
        let _guard = self.range_lock().lock(LockRange::Sync { at, len: rb });
        if !used.is_set(r) {
            return Ok(());
        }
        let mut ios: Vec<MemberIo<'_>> = self
            .personality
            .member_spans(at, rb)
            .into_iter()
            .map(|(role, off, len)| {
                let m = self.members.slots[role].usable();
                MemberIo::planned(role, m, off, IoKind::Discard(len))
            })
            .collect();
        self.commit
            .writes(&self.parts, &WriteSet::release(at, rb), &mut ios)?;
        // The zeroes are durable before the map says so.
        self.flush_members();
        if self.is_failed() {
            return Err(self
                .members
                .unrecoverable(at, rb, "too many members failed"));
        }
        used.released(&self.members, r..r + 1);
        Ok(())
    }
}
