//! The write-back cache a consistency policy may keep in front of the members (the journal's
//! write-back mode, reference §6.4): what the stripe path asks of it to cache a batch and to
//! write a row home (`personality/raid456_writeback.rs`). The path reaches it through
//! [`crate::policy::ConsistencyPolicy::write_back_cache`], never through the journal's type.

use crate::error::Result;
use crate::policy::host::PolicyHost;
use crate::policy::journal::CachedRow;
use device::AlignedBuf;
use std::time::Duration;

pub(crate) trait WriteBackCache: Send + Sync {
    /// Should write-back writes go through instead, the cache or the ring having run short
    /// ([`WriteBackCache::pause_caching`]) and the cache not having emptied since? md's
    /// raid5-cache writes through too while its log space is critical. Writes that run the
    /// cache short do not fill rows before they go home (random writes over more than the
    /// cache holds): each one logged its data, and its row's write-out reads, logs parity and
    /// writes what writing through would have, so caching them costs more than writing
    /// through (64 KiB random writes: 122 against 89 us of CPU each); and writes that take
    /// turns at caching and writing through also write out older rows whose units pin the
    /// tail. So once short, writes go through until the rows cached have all gone home.
    fn caching_paused(&self) -> bool;

    /// The cache or the ring had no room for a write-back write.
    fn pause_caching(&self);

    /// Client data the cache holds, in bytes.
    fn cache_bytes(&self) -> usize;

    /// The cached page of data chunk `d` at `off` (a page offset in the chunk) of `row`.
    fn cached_page(&self, row: u64, d: usize, off: u64) -> Option<AlignedBuf>;

    /// Log whole data pages of `row` without parity (write-back) and keep them in the cache.
    /// False: the ring has no room beyond what write-outs need (nothing was logged).
    fn cache_pages(
        &self,
        host: &dyn PolicyHost,
        row: u64,
        pages: Vec<(usize, u64, AlignedBuf)>,
    ) -> Result<bool>;

    /// Does the cache hold every page of every data chunk of `row`? (A full stripe: its
    /// write-out reads nothing.)
    fn row_full(&self, row: u64, data_disks: usize, chunk_bytes: u64) -> bool;

    /// Take a row out of the cache for its write-out (its claim is held). Until
    /// [`Journal::written_out`] or [`Journal::restore_row`], the row still counts as cached
    /// for [`Journal::is_cached`]: its members are not up to date yet.
    fn take_row(&self, row: u64) -> Option<CachedRow>;

    /// A write-out failed: the pages stay the newest data of their row.
    fn restore_row(&self, row: u64, r: CachedRow);

    /// The row's pages reached the members: reads may go to them directly again, and the
    /// units that logged the pages may be reclaimed.
    fn written_out(&self, row: u64, r: &CachedRow);

    /// Up to `limit` cached rows, the one holding the oldest unit first, with how long each
    /// has waited by `now` (the array's clock).
    fn cached_rows_by_age(&self, now: Duration, limit: usize) -> Vec<(u64, Duration)>;

    /// Rows with cached pages or a write-out under way.
    fn pending_rows(&self) -> Vec<u64>;
}
