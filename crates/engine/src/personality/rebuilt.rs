//! What a recovery window does with what it rebuilt: written to the member rebuilding the
//! role through the commit point, and what it could not rebuild recorded as bad blocks there.

use crate::io::commit::WriteSet;
use crate::io::{IoKind, MemberIo};
use crate::personality::parts::Parts;
use crate::work::Stop;

/// Rebuilds record what they cannot recover in pages of this many bytes.
const PAGE: u64 = crate::members::badblocks::BAD_PAGE;

impl Parts {
    /// Write rebuilt bytes to the rebuilding member of `role` (above its in-sync point, so
    /// planned against the role's member as long as it is not faulty).
    pub(crate) fn write_rebuilt(
        &self,
        role: usize,
        offset_bytes: u64,
        buf: &[u8],
    ) -> Result<(), Stop> {
        let member = self.members.slots[role].usable();
        let mut io = [MemberIo::planned(
            role,
            member,
            offset_bytes,
            IoKind::Write(buf, false),
        )];
        self.commit
            .writes(
                self,
                &WriteSet::rebuild(offset_bytes, buf.len() as u64),
                &mut io,
            )
            .map_err(Stop::Failed)?;
        if !io[0].ok() {
            return Err(Stop::Failed(self.members.unrecoverable(
                offset_bytes,
                buf.len() as u64,
                "write to the rebuilding member failed",
            )));
        }
        Ok(())
    }

    /// Record pages (member bytes) the rebuild of `role` could not rebuild as bad blocks on
    /// its new member; returns them as runs `(at, len)`.
    pub(crate) fn record_unrebuilt(&self, role: usize, lost: &[u64]) -> Vec<(u64, u64)> {
        let runs = page_runs(lost);
        for &(at, len) in &runs {
            if let Some(member) = self.members.slots[role].usable() {
                self.members.record_bad_blocks(
                    role,
                    &member,
                    at,
                    len,
                    "the rebuild could not recover it from the other members",
                );
            }
        }
        runs
    }
}

/// Sorted page offsets as runs of contiguous pages: (start, length).
fn page_runs(pages: &[u64]) -> Vec<(u64, u64)> {
    let mut runs: Vec<(u64, u64)> = Vec::new();
    for &at in pages {
        match runs.last_mut() {
            Some((start, len)) if *start + *len == at => *len += PAGE,
            _ => runs.push((at, PAGE)),
        }
    }
    runs
}
