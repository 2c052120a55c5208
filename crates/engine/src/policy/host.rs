//! [`PolicyHost`]: what the consistency policies need from above them.
//!
//! The policies sit below the personalities and the background walker (both call them), so
//! they cannot name either, nor the array: what they need from above comes through this
//! trait, implemented by the parts the array composes (`personality/parts.rs`), as the commit
//! point asks them through `CommitParts`. Three groups, each small: the parts below the
//! policies (members, clock, buffers, the used-region map), the walker (resync requests and its
//! thread's pace), and the level (write-back cache write-out, verifying stripes for the guided
//! policy).

use crate::clock::Clock;
use crate::error::Result;
use crate::io::bufpool::BufPool;
use crate::io::commit::WriteSet;
use crate::io::MemberIo;
use crate::members::MemberSet;
use crate::policy::used::UsedRegions;
use crate::work::VerifyReport;
use layout::Geometry;
use std::sync::Arc;
use std::time::Duration;

pub(crate) trait PolicyHost {
    /// The array's name (events and errors name it).
    fn name(&self) -> &str;
    fn members(&self) -> &MemberSet;
    fn geometry(&self) -> &Geometry;
    fn clock(&self) -> &dyn Clock;
    fn bufs(&self) -> &Arc<BufPool>;
    /// Which regions may hold data (None: every region counts as used).
    fn used(&self) -> Option<&UsedRegions>;
    /// Writes are refused (assembled read-only): nothing is recorded on the members.
    fn is_read_only(&self) -> bool;
    /// The stripe cache's bound on client data (the journal's write-back cache presses
    /// against an eighth of it).
    fn stripe_cache_bytes(&self) -> usize;
    /// Flush every usable member (with the integrity records); a member that cannot is failed.
    fn flush_members(&self);
    /// Member writes of `set` through the array's commit point (a journal replay).
    fn commit_writes(&self, set: &WriteSet, ios: &mut [MemberIo<'_>]) -> Result<()>;

    /// The walker: redundancy from `offset_bytes` on may disagree with the data.
    fn request_resync_from(&self, offset_bytes: u64);
    /// The walker: look at the work again.
    fn wake_sync(&self);
    /// The walker: is a resync owed?
    fn resync_owed(&self) -> bool;
    /// The walker's pace for a policy's own thread: `tick` every `period` until background
    /// work stops.
    fn until_stopped(&self, period: Duration, tick: &mut dyn FnMut());

    /// The level: sync coordinates of the whole stripes covering array bytes
    /// `offset..offset + len`.
    fn sync_range_covering(&self, offset: u64, len: u64) -> (u64, u64);
    /// The level: verify (and repair) the stripes covering these array byte ranges.
    fn verify(&self, ranges: &[(u64, u64)]) -> Result<VerifyReport>;
    /// The level's write-back cache: write out its oldest row; false if there was none.
    fn write_out_oldest(&self) -> bool;
    /// The level's write-back cache: write out every row the journal still has pending.
    fn write_out_pending(&self) -> Result<()>;
}
