//! The journal's write-back mode on the stripe path (reference §6.4).
//!
//! A stripe write in write-back mode logs its data pages (whole 4 KiB pages: a page the batch
//! covers only partly is completed from the cache or the member first) without parity, waits
//! until they are durable in the log, keeps them in the journal's cache and is acknowledged:
//! no member write, no read-modify-write on the client's path. A row is written out (parity
//! computed from the cached pages and the members, logged, then data and parity written home,
//! and only then the units holding its data may be reclaimed) when it is full, when the cache or
//! the ring runs short, when its data has waited a while, when the array stops or leaves
//! write-back mode, and before any write-through write to it.
//!
//! Some writes go through even in write-back mode, because caching them costs more than it
//! saves: batches of whole columns (they read nothing either way, and cached they would log
//! their data and then their parity apart), and every write from the moment the cache or the
//! ring runs short until the cache has emptied (`Journal::caching_paused`).
//!
//! Deadlock freedom under a full ring: the ring always keeps free what writing out every cached
//! row needs (its parity); a write-back write that would eat into that writes its own row out
//! and goes write-through instead, so a writer waiting for room never holds a row with cached
//! data, and waiting writers write out unclaimed cached rows in the order their units block the
//! tail.
//!
//! Reads of a row with cached data take the row's claim and lay the cached pages over what the
//! members hold; so do reads of a row whose write-out is under way (taken out of the cache, not
//! yet on its members), which wait for it. Write-back needs every role present: a degraded
//! array writes through.
//!
//! The cache is the journal's (`policy/journal.rs`); writing it home is the stripe path's, so
//! these are the parity personality's methods, called by the journal through the array.

use crate::error::Result;
use crate::intervals::merge;
use crate::io::bufpool::PoolBuf;
use crate::io::commit::StripeImage;
use crate::io::commit::WriteSet;
use crate::io::MemberIo;
use crate::personality::parts::Parts;
use crate::personality::raid456::{Torn, WritePlan};
use crate::personality::stripe_cache::{covers_all, Piece};
use crate::personality::Parity;
use crate::policy::journal::CachedRow;
use device::AlignedBuf;
use layout::StripeRoles;
use std::collections::BTreeSet;

const PAGE: u64 = 4096;
/// Tries before a write-out gives up on members that keep failing under it.
const MAX_REPLANS: usize = 4;

impl Parity {
    /// Write-back: log and cache the batch's pages. False: write it through instead (degraded,
    /// cache full, no room in the ring, a member read failed).
    pub(crate) fn cache_batch(&self, array: &Parts, row: u64, batch: &[Piece]) -> Result<bool> {
        let Some(j) = array.policy.write_back_cache() else {
            return Ok(false);
        };
        if array.members.slots.iter().any(|s| !s.is_complete()) || j.caching_paused() {
            return Ok(false);
        }
        if covers_all(batch, array.geometry.data_disks()) {
            // Whole columns: written through, they are logged once with their parity and
            // read nothing; cached, they would be logged, then written out at once (a full
            // row) or later, logging their parity a second time.
            return Ok(false);
        }
        if j.cache_bytes() + batch.iter().map(|p| p.data.len()).sum::<usize>()
            > array.config.stripe_cache_bytes / 2
        {
            j.pause_caching();
            return Ok(false);
        }
        let chunk = array.geometry.chunk_sectors() * 512;
        let roles = array.geometry.stripe_roles(row);
        let mut keys = BTreeSet::new();
        for p in batch {
            let mut off = p.offset / PAGE * PAGE;
            while off < p.end() {
                keys.insert((off, p.data_index));
                off += PAGE;
            }
        }
        let mut pages = Vec::with_capacity(keys.len());
        for (off, d) in keys {
            let covered = merge(
                batch
                    .iter()
                    .filter(|p| p.data_index == d && p.offset < off + PAGE && p.end() > off)
                    .map(|p| (p.offset.max(off), p.end().min(off + PAGE)))
                    .collect(),
            ) == [(off, off + PAGE)];
            let mut page = match j.cached_page(row, d, off) {
                Some(p) => p,
                None if covered => AlignedBuf::zeroed(PAGE as usize),
                None => {
                    let mut p = AlignedBuf::zeroed(PAGE as usize);
                    let mut io = [MemberIo::read(
                        &array.members,
                        roles.data_dev(d),
                        row * chunk + off,
                        &mut p,
                    )];
                    if !array.run_io(&mut io) {
                        return Ok(false);
                    }
                    p
                }
            };
            for p in batch.iter().filter(|p| p.data_index == d) {
                let lo = p.offset.max(off);
                let hi = p.end().min(off + PAGE);
                if lo < hi {
                    page[(lo - off) as usize..(hi - off) as usize].copy_from_slice(
                        &p.data[(lo - p.offset) as usize..(hi - p.offset) as usize],
                    );
                }
            }
            pages.push((d, off, page));
        }
        if !j.cache_pages(array, row, pages)? {
            j.pause_caching();
            return Ok(false);
        }
        if j.row_full(row, array.geometry.data_disks(), chunk) {
            // A full stripe: its write-out reads nothing.
            self.write_out_row(array, row)?;
        }
        Ok(true)
    }

    /// Write out what the cache holds of `row` (its claim is held by the caller).
    pub(crate) fn write_out_row(&self, array: &Parts, row: u64) -> Result<()> {
        let Some(j) = array.policy.write_back_cache() else {
            return Ok(());
        };
        let Some(cached) = j.take_row(row) else {
            return Ok(());
        };
        match self.write_out(array, row, &cached) {
            Ok(()) => {
                j.written_out(row, &cached);
                Ok(())
            }
            Err(e) => {
                j.restore_row(row, cached);
                Err(e)
            }
        }
    }

    fn write_out(&self, array: &Parts, row: u64, cached: &CachedRow) -> Result<()> {
        let m = array.geometry.data_disks();
        let chunk = array.geometry.chunk_sectors() * 512;
        let roles = array.geometry.stripe_roles(row);
        for (a, b) in cached.intervals() {
            let len = (b - a) as usize;
            let n = len as u64;
            let at = row * chunk + a;
            let dirty_idx = cached.dirty(m, a, b);
            // Whichever write reads less, as for client writes: read-modify-write (the old
            // bytes of the cached chunks and the parity) or the rest of the row.
            let is_dirty: Vec<bool> = (0..m).map(|d| dirty_idx.contains(&d)).collect();
            let full: Vec<bool> = (0..m).map(|d| cached.covers_chunk(d, a, b)).collect();
            let plan = self.plan_write(array, &roles, at, n, &is_dirty, &full);
            let rmw = match plan {
                // A row recovery found may be torn on the members (see `CachedRow::recovered`).
                WritePlan::Rmw if !cached.recovered => self
                    .rmw_compute(array, &roles, at, len, &dirty_idx, |d, buf| {
                        cached.overlay(d, a, buf)
                    })
                    .ok(),
                _ => None,
            };
            let (chunks, p, q) = match rmw {
                Some(r) => (
                    dirty_idx.iter().copied().zip(r.new_data).collect(),
                    r.p,
                    r.q,
                ),
                None => {
                    let mut data = self.read_rest_of_row(array, &roles, at, len, &full)?;
                    for (d, buf) in data.iter_mut().enumerate() {
                        cached.overlay(d, a, buf);
                    }
                    let refs: Vec<&[u8]> = data.iter().map(|b| &b[..]).collect();
                    let (p, q) = self.compute_parity(array, &roles, &refs);
                    let chunks: Vec<(usize, PoolBuf)> = data
                        .into_iter()
                        .enumerate()
                        .filter(|(d, _)| is_dirty[*d])
                        .collect();
                    (chunks, p, q)
                }
            };
            let dirty: Vec<(usize, &[u8])> = chunks.iter().map(|(d, b)| (*d, &b[..])).collect();
            let mut ios: Vec<MemberIo<'_>> = dirty
                .iter()
                .filter(|(d, _)| array.members.slot(roles.data_dev(*d)).in_sync(at, n))
                .map(|&(d, buf)| MemberIo::write(&array.members, roles.data_dev(d), at, buf, false))
                .collect();
            if array.members.slot(roles.p_dev()).in_sync(at, n) {
                ios.push(MemberIo::write(
                    &array.members,
                    roles.p_dev(),
                    at,
                    &p,
                    false,
                ));
            }
            if let (Some(qd), Some(qb)) = (roles.q_dev(), q.as_deref()) {
                if array.members.slot(qd).in_sync(at, n) {
                    ios.push(MemberIo::write(&array.members, qd, at, qb, false));
                }
            }
            let image = StripeImage {
                row,
                at,
                data: &dirty,
                p: &p,
                q: q.as_deref(),
                parity_only: true,
            };
            array
                .commit
                .stripe_writes(array, &WriteSet::stripe(at, n), &mut ios, Some(&image))?;
        }
        Ok(())
    }

    /// Every data chunk of `at..at + len` of a row: read from the members (reconstructed
    /// where one is missing) unless `full` says the cache overwrites it whole.
    fn read_rest_of_row(
        &self,
        array: &Parts,
        roles: &StripeRoles,
        at: u64,
        len: usize,
        full: &[bool],
    ) -> Result<Vec<PoolBuf>> {
        if full.iter().all(|&f| f) {
            return Ok(full.iter().map(|_| array.bufs.get(len)).collect());
        }
        for _ in 0..MAX_REPLANS {
            if let Some(bufs) = self.read_row(array, roles, at, len, Torn::Carry)? {
                return Ok(bufs.data);
            }
        }
        Err(array
            .members
            .unrecoverable(at, len as u64, "members kept failing during a write-out"))
    }

    /// Write out the cached row whose units block the log's tail longest, if nobody holds it.
    /// Returns whether one was written out.
    pub(crate) fn write_out_oldest(&self, array: &Parts) -> bool {
        const FIRST: usize = 16;
        let Some(j) = array.policy.write_back_cache() else {
            return false;
        };
        // The oldest few; all of them only if those are all held.
        let now = array.clock.now();
        let first = j.cached_rows_by_age(now, FIRST);
        let tried = first.len();
        if let Some(done) = self.write_out_first_free(array, first) {
            return done;
        }
        tried == FIRST
            && self
                .write_out_first_free(
                    array,
                    j.cached_rows_by_age(now, usize::MAX)
                        .into_iter()
                        .skip(FIRST),
                )
                .unwrap_or(false)
    }

    /// Write out the first of `rows` nobody holds: whether that worked (None: all were held).
    fn write_out_first_free(
        &self,
        array: &Parts,
        rows: impl IntoIterator<Item = (u64, std::time::Duration)>,
    ) -> Option<bool> {
        for (row, _) in rows {
            let r = array.stripes.get(row);
            let claimed = r.try_claim();
            let res = claimed.then(|| self.write_out_row(array, row));
            if claimed {
                r.release();
            }
            array.stripes.put(row);
            if let Some(res) = res {
                return Some(res.is_ok());
            }
        }
        None
    }

    /// Write out every cached row (a stop, or leaving write-back mode).
    pub(crate) fn write_out_all(&self, array: &Parts) -> Result<()> {
        let Some(j) = array.policy.write_back_cache() else {
            return Ok(());
        };
        let rows = j.cached_rows_by_age(array.clock.now(), usize::MAX);
        self.write_out_claimed(array, rows.into_iter().map(|(row, _)| row))
    }

    /// Write out every cached row and wait for write-outs under way elsewhere (their row's
    /// claim is taken after them): when this returns, nothing is cached or being written out
    /// (unless a write-out failed: then its row is cached again and this fails).
    pub(crate) fn write_out_pending(&self, array: &Parts) -> Result<()> {
        let Some(j) = array.policy.write_back_cache() else {
            return Ok(());
        };
        self.write_out_claimed(array, j.pending_rows())
    }

    /// Write out `rows` one by one, each under its row's claim; stops at the first failure.
    fn write_out_claimed(&self, array: &Parts, rows: impl IntoIterator<Item = u64>) -> Result<()> {
        for row in rows {
            let r = array.stripes.get(row);
            drop(r.claim(r.st.lock()));
            let res = self.write_out_row(array, row);
            r.release();
            array.stripes.put(row);
            res?;
        }
        Ok(())
    }
}
