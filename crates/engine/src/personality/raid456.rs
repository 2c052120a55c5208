//! RAID4/5/6 data path: direct reads, batched stripe writes, degraded reconstruction.
//!
//! Reads of a healthy member go straight from the member into the caller's buffer, without a
//! lock and without the cache. A read whose member is faulty (or fails) claims the row and
//! reconstructs the piece from the rest of the stripe.
//!
//! A write batch (see `stripe_cache`) is split into column intervals (byte ranges inside the
//! chunk where some piece lands); each interval is an independent parity domain and is written
//! by the cheapest of:
//! * reconstruct-write (RCW): read the data chunks not fully overwritten, compute parity from
//!   all data; a full stripe reads nothing;
//! * read-modify-write (RMW): read old data of the chunks being written and old parity, fold
//!   the difference into parity (`P ^= Δ`, `Q ^= g^syndrome·Δ`);
//! * degraded: read every usable member, reconstruct the missing chunks, apply the new data and
//!   recompute all parity; only when a member of the row is missing (faulty, or rebuilding and
//!   not yet past the interval) and neither RCW nor RMW can do without its old bytes.
//!
//! RMW is chosen only when it reads strictly fewer chunks, as md does with `rmw_level` 1. A
//! missing member counts as md's `handle_stripe_dirtying` counts it: a missing parity chunk is
//! neither read nor written, a missing data chunk rules out RMW if it is written and RCW if it is
//! not overwritten whole. A read
//! failure marks the member faulty and the interval is planned again (now degraded); a write
//! failure marks it faulty and the stripe stays recoverable through the remaining members.

use crate::cluster::OwnedStripes;
use crate::error::{EngineError, Result};
use crate::intervals::merge;
use crate::io::bufpool::PoolBuf;
use crate::io::commit::StripeImage;
use crate::io::commit::WriteSet;
use crate::io::{IoOutcome, MemberIo};
use crate::personality::intent::WriteIntent;
use crate::personality::parts::Parts;
use crate::personality::raid456_heal::Heal;
use crate::personality::stripe_cache::{covers_all, BatchError, Completion, Lent, Piece, Row};
use crate::personality::Parity;
use layout::{Level, StripeRoles};
use std::os::fd::BorrowedFd;
use std::sync::Arc;

/// Journal pages and integrity records cover this many bytes.
const PAGE: u64 = 4096;

/// How often one interval may be planned again after member failures before giving up.
const MAX_REPLANS: usize = 4;

/// A write whose pieces are in their rows: what [`Parity::parity_wait`] waits for. Its pieces
/// hold the writer's bytes lent ([`Lent`]), so it must not go before they are all written: it
/// borrows them (`'a`), and dropping it waits for the pieces (never `mem::forget` one).
pub(crate) struct Placed<'a> {
    offset_bytes: u64,
    len_bytes: u64,
    done: Arc<Completion>,
    /// The rows it touches, each with a reference taken on it.
    rows: Vec<(u64, Arc<Row>)>,
    waited: bool,
    lent: std::marker::PhantomData<&'a [u8]>,
}

impl Drop for Placed<'_> {
    fn drop(&mut self) {
        if self.waited {
            return;
        }
        if std::thread::panicking() {
            // Leaders of other rows may still read the bytes this unwinding frame owns, and
            // rows this thread was to lead would never complete: neither waiting nor going on
            // is safe.
            eprintln!("a writer panicked with its bytes lent to the stripe cache; aborting");
            std::process::abort();
        }
        let _ = self.done.wait();
    }
}

pub(crate) enum Outcome {
    Done,
    Replan,
    /// A chunk read back corrupt: plan again through the degraded path, which rebuilds it.
    Degrade,
}

/// How an interval of a stripe is written (see [`Parity::plan_write`]).
/// What a reconstruction from a row a crash may have torn is for (see [`Parity::torn_guess`]).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Torn {
    /// A client would be served it: refused, an unrecoverable read, counted and announced.
    Refuse,
    /// A rebuild, resync or verify would write it: an unrecoverable read the caller passes
    /// (a rebuild records it bad on the new member).
    Pass,
    /// A write carries it into the parity it recomputes; the row stays exposed.
    Carry,
}

pub(crate) enum WritePlan {
    Rmw,
    Rcw,
    /// Read every usable member, reconstruct the missing chunks, recompute all parity.
    Degraded,
    /// Write the data only: every parity chunk there is recorded bad, and so is a data chunk
    /// it would have to be recomputed from (see `record_unrebuilt`).
    DataOnly,
}

/// How to go on after some reads of a plan failed.
/// What read-modify-write's reads and arithmetic give: the new data (in the dirty chunks'
/// order), P and Q, and (with integrity) the records of the old bytes P was moved from, for
/// [`Parity::write_row`]'s `p_terms`.
pub(crate) struct Rmw {
    pub new_data: Vec<PoolBuf>,
    pub p: PoolBuf,
    pub q: Option<PoolBuf>,
    p_terms: Option<Vec<Vec<u32>>>,
}

/// The records the [`MemberIo::keeping`] reads of `ios` kept, taken out; None when one of them
/// kept fewer than `len` bytes' worth (it failed, the array has no integrity, or its blocks
/// run past md's size and have no records).
fn kept_records(ios: &mut [MemberIo<'_>], len: usize) -> Option<Vec<Vec<u32>>> {
    let blocks = len / format::RECORD_BLOCK;
    ios.iter_mut()
        .filter_map(|io| io.records.take())
        .map(|r| (r.len() == blocks).then_some(r))
        .collect()
}

fn replan_after(ios: &[MemberIo<'_>]) -> Outcome {
    // Corrupt or unreadable: the degraded path rebuilds the chunk (and writes it back).
    if ios
        .iter()
        .any(|io| matches!(io.outcome, IoOutcome::Corrupt | IoOutcome::ReadError))
    {
        Outcome::Degrade
    } else {
        Outcome::Replan
    }
}

/// What [`Parity::read_present`] read: every member's buffer, the members missing over the
/// range, and those of them whose read failed.
const TORN_REASON: &str =
    "the block must be rebuilt from a row a crash may have torn (resync pending while degraded)";

pub(crate) type Present = (Vec<PoolBuf>, Vec<usize>, Vec<usize>);

/// Every chunk of one column interval of a stripe, reconstructed where a member is missing.
pub(crate) struct RowBufs {
    pub data: Vec<PoolBuf>,
    pub p: PoolBuf,
    pub q: Option<PoolBuf>,
}

impl Parity {
    fn chunk_bytes(&self) -> u64 {
        self.g.chunk_sectors() * 512
    }

    /// The array byte at `off` in data chunk `d` of stripe `row` (md's parity layouts number
    /// a stripe's data chunks in array order).
    fn array_offset(&self, row: u64, d: usize, off: u64) -> u64 {
        (row * self.g.data_disks() as u64 + d as u64) * self.chunk_bytes() + off
    }

    /// Own the stripes that array bytes `offset_bytes..offset_bytes + len` touch, for as long
    /// as the guard lives (a cluster's nodes write a stripe one at a time).
    pub(crate) fn own_rows<'a>(
        &self,
        array: &'a Parts,
        offset_bytes: u64,
        len: u64,
    ) -> std::result::Result<OwnedStripes<'a>, String> {
        let first = self.g.locate(offset_bytes / 512).stripe;
        let last = self.g.locate((offset_bytes + len.max(1) - 1) / 512).stripe;
        OwnedStripes::take(
            array.members.coordinator(),
            first,
            last + 1,
            self.chunk_bytes(),
        )
    }

    /// Pieces of a byte range: (row, data_index, offset in chunk, length, offset in request).
    fn parity_pieces(&self, offset_bytes: u64, len: usize) -> Vec<(u64, usize, u64, usize, usize)> {
        let chunk = self.chunk_bytes();
        let mut out = Vec::new();
        let mut done = 0usize;
        while done < len {
            let at = offset_bytes + done as u64;
            let pos = self.g.locate(at / 512);
            let off = pos.offset_sectors * 512 + at % 512;
            let n = ((chunk - off) as usize).min(len - done);
            out.push((pos.stripe, pos.data_index, off, n, done));
            done += n;
        }
        out
    }

    pub(crate) fn parity_read(
        &self,
        array: &Parts,
        offset_bytes: u64,
        buf: &mut [u8],
    ) -> Result<()> {
        let pieces = self.parity_pieces(offset_bytes, buf.len());
        let mut direct = Vec::new();
        let mut slow = Vec::new();
        let mut rest: &mut [u8] = buf;
        for &(row, d, off, len, _) in &pieces {
            let (mine, tail) = std::mem::take(&mut rest).split_at_mut(len);
            rest = tail;
            let dev = self.g.stripe_roles(row).data_dev(d);
            let cached = array.policy.is_cached(row);
            // Records verify whole pages: a part of one is read through the row.
            let partial = array.integrity.is_some()
                && (!off.is_multiple_of(PAGE) || !(len as u64).is_multiple_of(PAGE));
            if cached
                || partial
                || !array
                    .members
                    .slot(dev)
                    .in_sync(row * self.chunk_bytes() + off, len as u64)
            {
                slow.push((row, d, off, mine));
            } else {
                direct.push((
                    MemberIo::read(&array.members, dev, row * self.chunk_bytes() + off, mine),
                    row,
                    d,
                    off,
                ));
            }
        }
        let mut ios: Vec<MemberIo<'_>> = Vec::with_capacity(direct.len());
        let mut meta = Vec::with_capacity(direct.len());
        for (io, row, d, off) in direct {
            ios.push(io);
            meta.push((row, d, off));
        }
        if !array.run_io(&mut ios) {
            for (io, (row, d, off)) in ios.into_iter().zip(meta) {
                if !io.ok() {
                    if let crate::io::IoKind::Read(b) = io.kind {
                        slow.push((row, d, off, b));
                    }
                }
            }
        }
        for (row, d, off, out) in slow {
            self.degraded_read(array, row, d, off, out)?;
        }
        Ok(())
    }

    /// The data chunks' pieces of array bytes `offset_bytes..+len` spliced into `pipe` in
    /// order, from the members that hold them, where [`Parity::parity_read`] would read them
    /// directly: no row held by the write-back cache, every piece's member in sync (checked
    /// for all pieces before any moves: a degraded read would only fill the pipe in vain).
    /// False: the caller reads the ordinary way.
    pub(crate) fn splice_data(
        &self,
        array: &Parts,
        offset_bytes: u64,
        len: usize,
        pipe: BorrowedFd<'_>,
    ) -> bool {
        let chunk = self.chunk_bytes();
        let mut pieces = Vec::new();
        for (row, d, off, n, _) in self.parity_pieces(offset_bytes, len) {
            let dev = self.g.stripe_roles(row).data_dev(d);
            let at = row * chunk + off;
            if array.policy.is_cached(row) || !array.members.slot(dev).in_sync(at, n as u64) {
                return false;
            }
            pieces.push((dev, at, n));
        }
        pieces
            .into_iter()
            .all(|(dev, at, n)| array.splice_member(dev, at, n, pipe))
    }

    /// Read `out` from `dev` at `skip` bytes into member bytes `at..` (whole pages when
    /// records check them); false if the member is not in sync there or the read failed.
    fn read_own_chunk(
        &self,
        array: &Parts,
        dev: usize,
        at: u64,
        skip: u64,
        out: &mut [u8],
    ) -> bool {
        let len = match array.integrity {
            Some(_) => (skip + out.len() as u64).div_ceil(PAGE) * PAGE,
            None => skip + out.len() as u64,
        };
        if !array.members.slot(dev).in_sync(at, len) {
            return false;
        }
        let mut buf = array.bufs.get(len as usize);
        let mut io = [MemberIo::read(&array.members, dev, at, &mut buf)];
        if !array.run_io(&mut io) {
            return false;
        }
        drop(io);
        out.copy_from_slice(&buf[skip as usize..skip as usize + out.len()]);
        true
    }

    fn degraded_read(
        &self,
        array: &Parts,
        row: u64,
        d: usize,
        off: u64,
        out: &mut [u8],
    ) -> Result<()> {
        // Reconstruction needs parity that no other node is rewriting.
        let _owned = OwnedStripes::take_or_refuse(
            array.members.coordinator(),
            &array.name,
            row,
            row + 1,
            self.chunk_bytes(),
        )?;
        let r = array.stripes.get(row);
        let st = r.claim(r.st.lock());
        drop(st);
        // Records cover whole pages: read those around the range.
        let (a, b) = match array.integrity {
            Some(_) => (
                off / PAGE * PAGE,
                (off + out.len() as u64).div_ceil(PAGE) * PAGE,
            ),
            None => (off, off + out.len() as u64),
        };
        let res = (|| {
            let roles = self.g.stripe_roles(row);
            let at = row * self.chunk_bytes() + a;
            // A block whose member is there is read from it: what else ails its row (a
            // damaged or missing member) is not this read's concern.
            if self.read_own_chunk(array, roles.data_dev(d), at, off - a, out) {
                array.policy.overlay(row, d, off, out);
                return Ok(());
            }
            for _ in 0..MAX_REPLANS {
                if let Some(bufs) =
                    self.read_row(array, &roles, at, (b - a) as usize, Torn::Refuse)?
                {
                    let skip = (off - a) as usize;
                    out.copy_from_slice(&bufs.data[d][skip..skip + out.len()]);
                    // Write-back: the newest bytes may still be in the journal's cache (the
                    // claim keeps a write-out from moving them meanwhile).
                    array.policy.overlay(row, d, off, out);
                    return Ok(());
                }
            }
            Err(array.members.unrecoverable(
                self.array_offset(row, d, off),
                out.len() as u64,
                "members kept failing during reconstruction",
            ))
        })();
        r.release();
        array.stripes.put(row);
        res
    }

    /// Announce a write of `len` bytes at `offset_bytes` to every row it touches (taking a
    /// reference to each): a leader of one of them that claims it meanwhile waits for these
    /// pieces instead of writing its batch without them. In the order the pieces come.
    pub(crate) fn announce_rows(
        &self,
        array: &Parts,
        offset_bytes: u64,
        len: usize,
    ) -> Vec<(u64, Arc<Row>)> {
        let mut rows: Vec<(u64, Arc<Row>)> = Vec::new();
        for (row, ..) in self.parity_pieces(offset_bytes, len) {
            if rows.last().is_none_or(|(last, _)| *last != row) {
                let r = array.stripes.get(row);
                r.announce();
                rows.push((row, r));
            }
        }
        rows
    }

    /// `intent`: the same write, announced before its data arrived (see [`WriteIntent`]).
    pub(crate) fn parity_write(
        &self,
        array: &Parts,
        offset_bytes: u64,
        data: &[u8],
        fua: bool,
        intent: Option<WriteIntent>,
    ) -> Result<()> {
        let _owned = self
            .own_rows(array, offset_bytes, data.len() as u64)
            .map_err(|reason| EngineError::Unavailable {
                array: array.name.clone(),
                reason,
            })?;
        let reserved = array.stripes.reserve(data.len());
        let mut led = Vec::new();
        let placed = self.parity_place(array, offset_bytes, data, fua, intent, &mut led);
        for (row, r) in &led {
            self.lead_batch(array, *row, r);
        }
        let res = self.parity_wait(array, placed);
        array.stripes.unreserve(reserved);
        res
    }

    /// Place a write's pieces into its rows (the caller has reserved their bytes); the rows it
    /// found without a leader are appended to `led`, which the caller must then lead.
    pub(crate) fn parity_place<'a>(
        &self,
        array: &Parts,
        offset_bytes: u64,
        data: &'a [u8],
        fua: bool,
        intent: Option<WriteIntent>,
        led: &mut Vec<(u64, Arc<Row>)>,
    ) -> Placed<'a> {
        let pieces = self.parity_pieces(offset_bytes, data.len());
        let done = Completion::new(pieces.len());
        let rows = match intent {
            Some(i) => i.take_rows(array, offset_bytes, data.len()),
            None => self.announce_rows(array, offset_bytes, data.len()),
        };
        for (row, r) in &rows {
            let mine = pieces.iter().filter(|p| p.0 == *row);
            if self.place(r, mine, data, fua, &done) {
                led.push((*row, r.clone()));
            }
        }
        Placed {
            offset_bytes,
            len_bytes: data.len() as u64,
            done,
            rows,
            waited: false,
            lent: std::marker::PhantomData,
        }
    }

    /// Wait for a placed write's pieces to be written and let go of its rows.
    pub(crate) fn parity_wait(&self, array: &Parts, mut placed: Placed<'_>) -> Result<()> {
        let res = placed.done.wait();
        placed.waited = true;
        for (row, _) in std::mem::take(&mut placed.rows) {
            array.stripes.put(row);
        }
        let (offset_bytes, len_bytes) = (placed.offset_bytes, placed.len_bytes);
        res.map_err(|e| match e {
            BatchError::NoSpace => EngineError::NoSpace {
                array: array.name.clone(),
                offset_bytes,
                len_bytes,
            },
            BatchError::ReadOnly(reason) => EngineError::ReadOnly {
                array: array.name.clone(),
                reason,
            },
            BatchError::Failed(reason) => {
                array
                    .members
                    .unrecoverable(offset_bytes, len_bytes, &reason)
            }
        })
    }

    /// Place a request's pieces of one announced row (`(row, data index, offset in chunk,
    /// length, offset in request)`, lent out of `data` until `done` is waited for). True: the
    /// row had no leader and the caller now leads it.
    fn place<'p>(
        &self,
        r: &Row,
        pieces: impl Iterator<Item = &'p (u64, usize, u64, usize, usize)>,
        data: &[u8],
        fua: bool,
        done: &Arc<Completion>,
    ) -> bool {
        let copies: Vec<Piece> = pieces
            .map(|&(_, d, off, len, at)| {
                // SAFETY: `done` counts this piece, and the `Placed` holding `done` is waited
                // for before `parity_place`'s caller lets go of `data` (its drop waits, or
                // aborts when unwinding); the leader reads the piece only before completing it.
                let bytes = unsafe { Lent::new(&data[at..at + len]) };
                Piece {
                    data_index: d,
                    offset: off,
                    data: bytes,
                    fua,
                    done: done.clone(),
                }
            })
            .collect();
        let mut st = r.st.lock();
        st.settle();
        st.pending.extend(copies);
        if st.leader {
            // Its leader may be waiting for us.
            r.cv.notify_all();
            return false;
        }
        st.leader = true;
        true
    }

    /// Claim the row, gather what writers are still placing into it (up to the write hold),
    /// take every pending piece as one batch and write it.
    pub(crate) fn lead_batch(&self, array: &Parts, row: u64, r: &Row) {
        let m = self.g.data_disks();
        let st = r.claim(r.st.lock());
        let chunk = self.chunk_bytes();
        // One clock read for both bounds: this runs for every batch.
        let now = array.clock.deadline(std::time::Duration::ZERO);
        let deadlines = (
            now + array.config.write_hold,
            now + array.config.stream_hold,
        );
        let mut st = r.gather(
            st,
            deadlines,
            |p| covers_all(p, m),
            |p| {
                p.iter()
                    .any(|p| p.offset == 0 && p.data.len() as u64 == chunk)
            },
        );
        assert!(
            st.leader,
            "row {row}: leader lost its role before taking the batch"
        );
        assert!(
            !st.pending.is_empty(),
            "row {row}: a leader without pieces (its own are pending until it takes them)"
        );
        let batch = std::mem::take(&mut st.pending);
        st.leader = false;
        st.hurry = false;
        drop(st);
        let res = self.write_batch(array, row, &batch).map_err(|e| match e {
            EngineError::NoSpace { .. } => BatchError::NoSpace,
            EngineError::ReadOnly { reason, .. } => BatchError::ReadOnly(reason),
            e => BatchError::Failed(e.to_string()),
        });
        r.release();
        for p in &batch {
            p.done.complete(&res);
        }
    }

    fn write_batch(&self, array: &Parts, row: u64, batch: &[Piece]) -> Result<()> {
        if array.policy.logs_pages() {
            if array.policy.write_back() && self.cache_batch(array, row, batch)? {
                return Ok(());
            }
            // Write-through from here: what the cache holds of this row goes first.
            self.write_out_row(array, row)?;
        }
        let roles = self.g.stripe_roles(row);
        let mut intervals = merge(batch.iter().map(|p| (p.offset, p.end())).collect());
        if array.policy.logs_pages() || array.integrity.is_some() {
            // The journal logs, and records cover, whole 4 KiB pages: widen each interval to
            // them (the rest of a page is read and written back unchanged).
            intervals = merge(
                intervals
                    .into_iter()
                    .map(|(a, b)| (a / PAGE * PAGE, b.div_ceil(PAGE) * PAGE))
                    .collect(),
            );
        }
        for (a, b) in intervals {
            self.write_interval(array, row, &roles, a, b, batch)?;
        }
        if array.is_failed() {
            return Err(array.members.unrecoverable(
                row * self.chunk_bytes(),
                0,
                "too many members failed",
            ));
        }
        Ok(())
    }

    fn write_interval(
        &self,
        array: &Parts,
        row: u64,
        roles: &StripeRoles,
        a: u64,
        b: u64,
        batch: &[Piece],
    ) -> Result<()> {
        let m = self.g.data_disks();
        let mut dirty = vec![false; m];
        let mut full = vec![false; m];
        for (d, (is_dirty, is_full)) in dirty.iter_mut().zip(full.iter_mut()).enumerate() {
            let cov = merge(
                batch
                    .iter()
                    .filter(|p| p.data_index == d && p.offset < b && p.end() > a)
                    .map(|p| (p.offset.max(a), p.end().min(b)))
                    .collect(),
            );
            *is_dirty = !cov.is_empty();
            *is_full = cov.first() == Some(&(a, b));
        }
        let fua = batch.iter().any(|p| p.fua);
        let ctx = Interval {
            row,
            roles,
            a,
            b,
            batch,
            dirty: &dirty,
            full: &full,
            fua,
        };
        let mut degrade = false;
        for _ in 0..MAX_REPLANS {
            let at = row * self.chunk_bytes() + a;
            let plan = if degrade {
                WritePlan::Degraded
            } else {
                self.plan_write(array, roles, at, b - a, &dirty, &full)
            };
            let outcome = match plan {
                WritePlan::Degraded => self.degraded_write(array, &ctx)?,
                WritePlan::Rmw => self.rmw_write(array, &ctx)?,
                WritePlan::Rcw => self.rcw_write(array, &ctx)?,
                WritePlan::DataOnly => self.data_only_write(array, &ctx)?,
            };
            match outcome {
                Outcome::Done => return Ok(()),
                Outcome::Degrade => degrade = true,
                Outcome::Replan => {}
            }
        }
        Err(array.members.unrecoverable(
            self.array_offset(row, 0, a),
            b - a,
            "members kept failing during a stripe write",
        ))
    }

    /// Pick the write that reads fewest chunks, as md's `handle_stripe_dirtying` does, with
    /// members missing over `at..at+len` (faulty, or rebuilding below it) counted: RMW needs the
    /// old bytes of every dirty data chunk, RCW those of every data chunk not fully overwritten;
    /// a missing parity chunk is neither read nor written (the rebuild recomputes it). Only when
    /// neither can run without a missing chunk does the write read every member and reconstruct.
    pub(crate) fn plan_write(
        &self,
        array: &Parts,
        roles: &StripeRoles,
        at: u64,
        len: u64,
        dirty: &[bool],
        full: &[bool],
    ) -> WritePlan {
        let present = |dev: usize| array.members.slot(dev).in_sync(at, len);
        let parity_present = std::iter::once(roles.p_dev())
            .chain(roles.q_dev())
            .filter(|&dev| present(dev))
            .count();
        let data = || (0..dirty.len()).map(|d| (d, present(roles.data_dev(d))));
        let parity_all = 1 + usize::from(roles.q_dev().is_some());
        if array.policy.logs_pages() && parity_present < parity_all {
            // The journal logs every parity page and replays it onto whichever member holds
            // the role by then (a rebuild may have passed this stripe): parity is computed
            // in full even for a member that is missing now.
            return if data().all(|(d, here)| here || full[d]) {
                WritePlan::Rcw
            } else {
                WritePlan::Degraded
            };
        }
        // A chunk recorded bad there is written but cannot be read: a plan that must read it
        // is out (a full write of the block is what clears the record).
        let bad = |dev: usize| {
            array
                .members
                .slot(dev)
                .member()
                .is_some_and(|m| m.health.overlaps(at, len))
        };

        let parity_bad = std::iter::once(roles.p_dev())
            .chain(roles.q_dev())
            .any(|dev| present(dev) && bad(dev));
        let rmw_ok =
            data().all(|(d, here)| !dirty[d] || (here && !bad(roles.data_dev(d)))) && !parity_bad;
        let rcw_ok = parity_present == 0
            || data().all(|(d, here)| (here && !bad(roles.data_dev(d))) || full[d]);
        let rmw_reads = dirty.iter().filter(|&&x| x).count() + parity_present;
        // With no parity left to write, RCW reads only what it writes back partly.
        let rcw_reads = (0..dirty.len())
            .filter(|&d| !full[d] && (parity_present > 0 || dirty[d]))
            .count();
        let parity_lost = || {
            std::iter::once(roles.p_dev())
                .chain(roles.q_dev())
                .all(|dev| present(dev) && self.recorded_bad(array, dev, at, len))
        };
        let data_writable =
            || data().all(|(d, here)| !dirty[d] || (here && (full[d] || !bad(roles.data_dev(d)))));
        match (rmw_ok, rcw_ok) {
            (true, true) if rmw_reads < rcw_reads => WritePlan::Rmw,
            (_, true) => WritePlan::Rcw,
            (true, false) => WritePlan::Rmw,
            (false, false) if parity_lost() && data_writable() => WritePlan::DataOnly,
            (false, false) => WritePlan::Degraded,
        }
    }

    /// Whether `dev`'s member has all of `at..at + len` recorded bad.
    fn recorded_bad(&self, array: &Parts, dev: usize, at: u64, len: u64) -> bool {
        array
            .members
            .slot(dev)
            .member()
            .is_some_and(|m| m.health.covers(at, len))
    }

    fn rcw_write(&self, array: &Parts, c: &Interval<'_>) -> Result<Outcome> {
        let len = (c.b - c.a) as usize;
        let at = c.row * self.chunk_bytes() + c.a;
        // A chunk written whole by one piece is used as it is: no copy into a stripe buffer.
        let sole: Vec<Option<&[u8]>> = (0..c.dirty.len()).map(|d| c.sole_piece(d)).collect();
        let mut owned: Vec<Option<PoolBuf>> = sole
            .iter()
            .map(|s| s.is_none().then(|| array.bufs.get(len)))
            .collect();
        let len64 = len as u64;
        let present = |dev: usize| array.members.slot(dev).in_sync(at, len64);
        // With a journal, parity is always computed in full (see `plan_write`).
        let parity_present = array.policy.logs_pages()
            || std::iter::once(c.roles.p_dev())
                .chain(c.roles.q_dev())
                .any(present);
        // Chunks not overwritten whole are read to compute parity, and a dirty one also to be
        // written back whole; with no parity left, only the dirty ones that are still there.
        let needs_read = |d: usize| {
            !c.full[d] && (parity_present || (c.dirty[d] && present(c.roles.data_dev(d))))
        };
        let mut ios: Vec<MemberIo<'_>> = owned
            .iter_mut()
            .enumerate()
            .filter(|(d, _)| needs_read(*d))
            .filter_map(|(d, buf)| {
                let io = |b| MemberIo::read(&array.members, c.roles.data_dev(d), at, b);
                buf.as_mut()
                    .map(|b| if c.dirty[d] { io(b) } else { io(b).keeping() })
            })
            .collect();
        if !ios.is_empty() && !array.run_io(&mut ios) {
            return Ok(replan_after(&ios));
        }
        // P is the XOR of the chunks written and the clean ones read.
        let clean = (0..c.dirty.len()).filter(|&d| !c.dirty[d]).count();
        let p_terms = kept_records(&mut ios, len).filter(|t| t.len() == clean);
        drop(ios);
        for (d, buf) in owned.iter_mut().enumerate() {
            if let Some(b) = buf {
                c.overlay(d, b);
            }
        }
        let refs: Vec<&[u8]> = sole
            .iter()
            .zip(&owned)
            .map(|(s, o)| s.unwrap_or_else(|| o.as_deref().expect("owned when not sole")))
            .collect();
        let (p, q) = self.compute_parity(array, c.roles, &refs);
        self.write_row(
            array,
            c,
            at,
            &c.dirty_of(&refs),
            (&p, p_terms),
            q.as_deref(),
        )?;
        Ok(Outcome::Done)
    }

    /// [`WritePlan::DataOnly`]: the dirty data chunks, their old bytes read where the batch
    /// does not cover them whole; the parity stays as it is, recorded bad.
    fn data_only_write(&self, array: &Parts, c: &Interval<'_>) -> Result<Outcome> {
        let len = (c.b - c.a) as usize;
        let at = c.row * self.chunk_bytes() + c.a;
        let dirty: Vec<usize> = (0..c.dirty.len()).filter(|&d| c.dirty[d]).collect();
        let mut bufs: Vec<PoolBuf> = dirty.iter().map(|_| array.bufs.get(len)).collect();
        let mut ios: Vec<MemberIo<'_>> = bufs
            .iter_mut()
            .zip(&dirty)
            .filter(|(_, &d)| !c.full[d])
            .map(|(b, &d)| MemberIo::read(&array.members, c.roles.data_dev(d), at, b))
            .collect();
        if !ios.is_empty() && !array.run_io(&mut ios) {
            return Ok(replan_after(&ios));
        }
        drop(ios);
        for (b, &d) in bufs.iter_mut().zip(&dirty) {
            c.overlay(d, b);
        }
        let mut ios: Vec<MemberIo<'_>> = bufs
            .iter()
            .zip(&dirty)
            .map(|(b, &d)| MemberIo::write(&array.members, c.roles.data_dev(d), at, b, c.fua))
            .collect();
        array
            .commit
            .stripe_writes(array, &WriteSet::stripe(at, len as u64), &mut ios, None)?;
        Ok(Outcome::Done)
    }

    fn rmw_write(&self, array: &Parts, c: &Interval<'_>) -> Result<Outcome> {
        let len = (c.b - c.a) as usize;
        let at = c.row * self.chunk_bytes() + c.a;
        let dirty: Vec<usize> = (0..c.dirty.len()).filter(|&d| c.dirty[d]).collect();
        let rmw = match self.rmw_compute(array, c.roles, at, len, &dirty, |d, b| c.overlay(d, b)) {
            Ok(done) => done,
            Err(outcome) => return Ok(outcome),
        };
        let written: Vec<(usize, &[u8])> = dirty
            .iter()
            .zip(&rmw.new_data)
            .map(|(&d, b)| (d, &b[..]))
            .collect();
        let p = (&rmw.p[..], rmw.p_terms);
        self.write_row(array, c, at, &written, p, rmw.q.as_deref())?;
        Ok(Outcome::Done)
    }

    /// Read-modify-write's reads and arithmetic over `at..at + len` of a row: the old bytes of
    /// data chunks `dirty` and of the parity, the new bytes of those chunks by `overlay`
    /// (given a data index and the old bytes), and the parity moved by the difference.
    /// `Err`: a member failed meanwhile.
    pub(crate) fn rmw_compute(
        &self,
        array: &Parts,
        roles: &StripeRoles,
        at: u64,
        len: usize,
        dirty: &[usize],
        overlay: impl Fn(usize, &mut [u8]),
    ) -> std::result::Result<Rmw, Outcome> {
        let mut old: Vec<PoolBuf> = dirty.iter().map(|_| array.bufs.get(len)).collect();
        let mut p = array.bufs.get(len);
        let mut q = roles.q_dev().map(|_| array.bufs.get(len));
        let p_terms;
        {
            let mut ios: Vec<MemberIo<'_>> = old
                .iter_mut()
                .zip(dirty)
                .map(|(buf, &d)| {
                    MemberIo::read(&array.members, roles.data_dev(d), at, buf).keeping()
                })
                .collect();
            // A missing parity chunk is neither read nor written; its buffer only takes the
            // arithmetic.
            if array.members.slot(roles.p_dev()).in_sync(at, len as u64) {
                ios.push(MemberIo::read(&array.members, roles.p_dev(), at, &mut p).keeping());
            }
            if let (Some(qd), Some(qb)) = (roles.q_dev(), q.as_mut()) {
                if array.members.slot(qd).in_sync(at, len as u64) {
                    ios.push(MemberIo::read(&array.members, qd, at, qb));
                }
            }
            if !array.run_io(&mut ios) {
                return Err(replan_after(&ios));
            }
            // New P = old P ^ old data ^ new data: records of the old bytes, both kinds.
            p_terms = kept_records(&mut ios, len).filter(|t| t.len() == dirty.len() + 1);
        }
        let mut new_data: Vec<PoolBuf> = Vec::with_capacity(dirty.len());
        for (delta, &d) in old.iter_mut().zip(dirty) {
            let mut new = delta.duplicate();
            overlay(d, &mut new);
            parity::xor_into(delta, &new);
            match q.as_mut() {
                Some(q) => parity::pq_update(delta, roles.syndrome(d), &mut p, q),
                None => parity::xor_into(&mut p, delta),
            }
            new_data.push(new);
        }
        Ok(Rmw {
            new_data,
            p,
            q,
            p_terms,
        })
    }

    fn degraded_write(&self, array: &Parts, c: &Interval<'_>) -> Result<Outcome> {
        let at = c.row * self.chunk_bytes() + c.a;
        // The write leaves the row exposed as it was (its bit stays set): what it rebuilds
        // here is not served, only carried into the parity.
        let len = (c.b - c.a) as usize;
        let Some(mut bufs) = self.read_row(array, c.roles, at, len, Torn::Carry)? else {
            return Ok(Outcome::Replan);
        };
        for (d, buf) in bufs.data.iter_mut().enumerate() {
            c.overlay(d, buf);
        }
        let refs: Vec<&[u8]> = bufs.data.iter().map(|b| &b[..]).collect();
        let (p, q) = self.compute_parity(array, c.roles, &refs);
        bufs.p = p;
        bufs.q = q;
        let refs: Vec<&[u8]> = bufs.data.iter().map(|b| &b[..]).collect();
        let p = (&bufs.p[..], None);
        self.write_row(array, c, at, &c.dirty_of(&refs), p, bufs.q.as_deref())?;
        Ok(Outcome::Done)
    }

    /// Write data chunks `(data index, bytes)` and the parity of an interval to every member
    /// in sync there (a missing or rebuilding one gets its bytes from the rebuild).
    /// `p_terms`: with integrity, the records of the other bytes whose XOR with `data` is P
    /// (the clean chunks read for a reconstruct-write; the old data and P of a
    /// read-modify-write), so that P's records come from CRC linearity, not a pass over P;
    /// None where they are not known (a full stripe needs none).
    fn write_row(
        &self,
        array: &Parts,
        c: &Interval<'_>,
        at: u64,
        data: &[(usize, &[u8])],
        (p, p_terms): (&[u8], Option<Vec<Vec<u32>>>),
        q: Option<&[u8]>,
    ) -> Result<()> {
        let len = p.len() as u64;
        // A data chunk a missing member does not get still changes what the role should hold:
        // reconstruction of it is verified against its record. Like a member write's, the new
        // record is accepted beside the old one while the row is written and replaces it only
        // once the parity holding it is out: a table written meanwhile (a flush, a journal
        // reclaim) must not make durable a record whose data may never land.
        let records: Option<Vec<Vec<u32>>> = array
            .integrity
            .as_ref()
            .map(|integ| data.iter().map(|(_, buf)| integ.records_of(buf)).collect());
        let unheld: Vec<(usize, Vec<u32>)> = array.integrity.as_ref().map_or(Vec::new(), |integ| {
            data.iter()
                .zip(records.iter().flatten())
                .map(|(&(d, buf), r)| (c.roles.data_dev(d), buf, r))
                .filter(|&(dev, _, _)| !array.members.slot(dev).in_sync(at, len))
                .map(|(dev, buf, r)| (dev, integ.begin_write(dev, at, buf, Some(r.clone()))))
                .collect()
        });
        let p_terms = p_terms.or_else(|| (data.len() == self.g.data_disks()).then(Vec::new));
        let mut ios: Vec<MemberIo<'_>> = data
            .iter()
            .enumerate()
            .filter(|(_, (d, _))| array.members.slot(c.roles.data_dev(*d)).in_sync(at, len))
            .map(|(i, &(d, buf))| {
                let mut io = MemberIo::write(&array.members, c.roles.data_dev(d), at, buf, c.fua);
                io.records = records.as_ref().map(|r| r[i].clone());
                io
            })
            .collect();
        if array.members.slot(c.roles.p_dev()).in_sync(at, len) {
            let mut io = MemberIo::write(&array.members, c.roles.p_dev(), at, p, c.fua);
            io.records = records.zip(p_terms).zip(array.integrity.as_ref()).map(
                |((mut r, terms), integ)| {
                    r.extend(terms);
                    integ.records_of_xor(&r)
                },
            );
            ios.push(io);
        }
        if let (Some(qd), Some(qb)) = (c.roles.q_dev(), q) {
            if array.members.slot(qd).in_sync(at, len) {
                ios.push(MemberIo::write(&array.members, qd, at, qb, c.fua));
            }
        }
        let image = StripeImage {
            row: c.row,
            at,
            data,
            p,
            q,
            parity_only: false,
        };
        let res =
            array
                .commit
                .stripe_writes(array, &WriteSet::stripe(at, len), &mut ios, Some(&image));
        // A row that failed may have reached some members: the missing role's block then
        // verifies as either contents, as a write in flight does.
        if let (Ok(()), Some(integ)) = (&res, &array.integrity) {
            for (dev, records) in unheld {
                integ.end_write(dev, at, &records);
            }
        }
        res
    }

    /// Whether `row` is one of [`exposed_rows`].
    pub(crate) fn row_exposed(&self, array: &Parts, row: u64) -> bool {
        let chunk = self.chunk_bytes();
        array.policy.torn_bytes().is_some()
            && array.walker.resync_owed()
            && !array
                .policy
                .next_to_resync(row * chunk, (row + 1) * chunk)
                .is_empty()
    }

    /// The first row of `bufs` (every member's bytes from `at`, the `missing` ones
    /// reconstructed) whose reconstruction of a data chunk nothing vouches for although a
    /// crash may have torn the row: integrity records check reconstructions themselves
    /// (`verify_rebuilt`); without them only a parity left over that agrees can. Returns the
    /// row and the data index of the guessed chunk.
    pub(crate) fn torn_guess(
        &self,
        array: &Parts,
        at: u64,
        bufs: &[PoolBuf],
        missing: &[usize],
    ) -> Option<(u64, usize)> {
        if array.integrity.is_some() || missing.is_empty() {
            return None;
        }
        let spare_parity = missing.len() < self.g.max_degraded();
        for (row, r) in row_pieces(at, bufs[0].len() as u64, self.chunk_bytes()) {
            if !self.row_exposed(array, row) {
                continue;
            }
            let roles = self.g.stripe_roles(row);
            let Some(d) = (0..self.g.data_disks()).find(|&d| missing.contains(&roles.data_dev(d)))
            else {
                continue;
            };
            let cut = |dev: usize| &bufs[dev][r.clone()];
            let data: Vec<&[u8]> = (0..self.g.data_disks())
                .map(|d| cut(roles.data_dev(d)))
                .collect();
            let agrees = spare_parity && {
                let (p, q) = self.compute_parity(array, &roles, &data);
                p[..] == *cut(roles.p_dev())
                    && roles.q_dev().is_none_or(|qd| q.as_deref() == Some(cut(qd)))
            };
            if !agrees {
                return Some((row, d));
            }
        }
        None
    }

    /// A degraded read of data chunk `d` of an exposed row, without records to check the
    /// reconstruction against: an unrecoverable read, not a guess.
    fn refuse_torn(&self, array: &Parts, row: u64, d: usize, off: u64, len: usize) -> EngineError {
        let at = self.array_offset(row, d, off);
        let n = array
            .torn_reads_refused
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        tracing::error!(array = %array.name, offset = at, len,
            "read refused: the block must be rebuilt from a row a crash may have torn");
        if n.is_power_of_two() || n == 0 {
            array.members.events.emit(
                "torn_read_refused",
                &array.name,
                None,
                format!(
                    "array bytes {at}+{len} must be rebuilt from a row a crash may have left \
                     mid-write, not resynced yet, on a degraded array: read refused ({} so far)",
                    n + 1
                ),
            );
        }
        array.members.unrecoverable(at, len as u64, TORN_REASON)
    }

    /// P (and Q) of a stripe's data chunks, given in data-index order.
    pub(crate) fn compute_parity(
        &self,
        array: &Parts,
        roles: &StripeRoles,
        data: &[&[u8]],
    ) -> (PoolBuf, Option<PoolBuf>) {
        let len = data[0].len();
        let mut p = array.bufs.get(len);
        let mut q = roles.q_dev().map(|_| array.bufs.get(len));
        crate::stripe_parity::fill(roles, data, &mut p, q.as_deref_mut());
        (p, q)
    }

    /// One row's chunks over `at..at + len` (member bytes), the missing ones reconstructed
    /// ([`Parity::read_rebuilt`]).
    pub(crate) fn read_row(
        &self,
        array: &Parts,
        roles: &StripeRoles,
        at: u64,
        len: usize,
        torn: Torn,
    ) -> Result<Option<RowBufs>> {
        let Some(dev_bufs) = self.read_rebuilt(array, at, len, array.heal_mode(), torn)? else {
            return Ok(None);
        };
        let mut by_dev: Vec<Option<PoolBuf>> = dev_bufs.into_iter().map(Some).collect();
        let data = (0..self.g.data_disks())
            .map(|d| by_dev[roles.data_dev(d)].take().expect("data chunk"))
            .collect();
        let p = by_dev[roles.p_dev()].take().expect("P chunk");
        let q = roles.q_dev().map(|qd| by_dev[qd].take().expect("Q chunk"));
        Ok(Some(RowBufs { data, p, q }))
    }

    /// Every member's bytes over `at..at + len` (member bytes; whole rows or parts of rows),
    /// the missing chunks of each row reconstructed from the same bytes of the others and
    /// checked (against integrity records; against a crash's torn rows as `torn` says), the
    /// unreadable ones written back (unless only counting). `Ok(None)`: a member failed
    /// meanwhile; plan again.
    pub(crate) fn read_rebuilt(
        &self,
        array: &Parts,
        at: u64,
        len: usize,
        heal: Heal,
        torn: Torn,
    ) -> Result<Option<Vec<PoolBuf>>> {
        let Some((mut bufs, missing, unread)) = self.read_present(array, at, len, heal)? else {
            return Ok(None);
        };
        for (row, r) in row_pieces(at, len as u64, self.chunk_bytes()) {
            let roles = self.g.stripe_roles(row);
            let slices = bufs.iter_mut().map(|b| &mut b[r.clone()]).collect();
            self.reconstruct(&roles, slices, &missing);
        }
        if torn != Torn::Carry {
            if let Some((row, d)) = self.torn_guess(array, at, &bufs, &missing) {
                let off = at.max(row * self.chunk_bytes()) % self.chunk_bytes();
                return Err(match torn {
                    Torn::Refuse => self.refuse_torn(array, row, d, off, len),
                    _ => array.members.unrecoverable(
                        self.array_offset(row, d, off),
                        len as u64,
                        TORN_REASON,
                    ),
                });
            }
        }
        self.verify_rebuilt(array, at, &bufs, &missing)?;
        if heal != Heal::Count {
            for dev in unread {
                array.correct_read_error(dev, at, &bufs[dev], WriteSet::repair(at, len as u64));
            }
        }
        Ok(Some(bufs))
    }

    /// Read every member that is in sync over `len` bytes at `at` (one I/O each). Returns the
    /// buffers (those of missing members left unfilled), the missing members, and those of
    /// them whose read failed (the caller writes their rebuilt bytes back, see `badblocks`);
    /// `Ok(None)` if a member failed meanwhile (it is faulty now: plan again). Unreadable
    /// chunks beyond the level's redundancy are found page by page and recorded as bad blocks
    /// on their members before the error returns.
    /// With integrity records, members that read back corrupt are healed page by page
    /// ([`Parity::heal`], as `heal` says); without, a corrupt member counts as missing over the
    /// whole range.
    pub(crate) fn read_present(
        &self,
        array: &Parts,
        at: u64,
        len: usize,
        heal: Heal,
    ) -> Result<Option<Present>> {
        let n = self.g.raid_disks();
        let mut missing: Vec<usize> = (0..n)
            .filter(|&dev| !array.members.slot(dev).in_sync(at, len as u64))
            .collect();
        if missing.len() > self.g.max_degraded() {
            return Err(array.members.unrecoverable(
                at,
                len as u64,
                "more members missing than the level tolerates",
            ));
        }
        let mut bufs: Vec<PoolBuf> = (0..n).map(|_| array.bufs.get(len)).collect();
        let mut ios: Vec<MemberIo<'_>> = bufs
            .iter_mut()
            .enumerate()
            .filter(|(dev, _)| !missing.contains(dev))
            .map(|(dev, buf)| MemberIo::read(&array.members, dev, at, buf))
            .collect();
        array.run_io(&mut ios);
        let mut replan = false;
        let mut corrupt = Vec::new();
        let mut unread = Vec::new();
        for io in &ios {
            match io.outcome {
                IoOutcome::Ok => {}
                IoOutcome::Corrupt => corrupt.push(io.role),
                IoOutcome::ReadError => unread.push(io.role),
                _ => replan = true,
            }
        }
        drop(ios);
        if replan {
            return Ok(None);
        }
        missing.extend(&unread);
        if !unread.is_empty() && missing.len() > self.g.max_degraded() {
            self.record_unreadable(array, at, len, &missing, &unread);
            return Err(array.members.unrecoverable(
                at,
                len as u64,
                "unreadable sectors beyond the level's redundancy",
            ));
        }
        if array.integrity.is_some() && !corrupt.is_empty() {
            self.heal(array, at, &mut bufs, &missing, &corrupt, heal)?;
        } else {
            // Read fine but wrong: rebuilt from the others like a missing chunk.
            missing.extend(corrupt);
        }
        if missing.len() > self.g.max_degraded() {
            return Err(array.members.unrecoverable(
                at,
                len as u64,
                "corrupt and missing chunks exceed the level's redundancy",
            ));
        }
        missing.sort_unstable();
        Ok(Some((bufs, missing, unread)))
    }

    /// Chunks of `unread` members over `at..at + len` could not be read and, with the other
    /// `missing` ones, exceed the redundancy: find the pages that really fail (reading them one
    /// by one) and record those the row cannot rebuild as bad blocks on their members.
    fn record_unreadable(
        &self,
        array: &Parts,
        at: u64,
        len: usize,
        missing: &[usize],
        unread: &[usize],
    ) {
        let pages = (len as u64).div_ceil(PAGE);
        let others = missing.len() - unread.len();
        let mut failing: Vec<Vec<usize>> = vec![Vec::new(); pages as usize];
        for &dev in unread {
            for (pg, failed) in failing.iter_mut().enumerate() {
                let off = at + pg as u64 * PAGE;
                let n = PAGE.min(at + len as u64 - off) as usize;
                let mut buf = array.bufs.get(n);
                let mut io = [MemberIo::read(&array.members, dev, off, &mut buf)];
                array.run_io(&mut io);
                if io[0].outcome == IoOutcome::ReadError {
                    failed.push(dev);
                }
            }
        }
        for (pg, failed) in failing.iter().enumerate() {
            if others + failed.len() <= self.g.max_degraded() {
                continue;
            }
            let off = at + pg as u64 * PAGE;
            for &dev in failed {
                if let Some(m) = array.members.slot(dev).in_sync_member(off, PAGE) {
                    // Recorded already: a known bad block, not a new read error.
                    if m.health.covers(off, PAGE) || array.members.note_read_error(dev, &m) {
                        continue;
                    }
                    array.members.record_bad_blocks(
                        dev,
                        &m,
                        off,
                        PAGE,
                        "unreadable, and the row cannot rebuild it",
                    );
                }
            }
        }
    }

    /// Rebuild the chunks of `missing` devices (at most the level's tolerance) in place;
    /// `dev_bufs[dev]` holds device `dev`'s chunk of the stripe.
    pub(crate) fn reconstruct(
        &self,
        roles: &StripeRoles,
        dev_bufs: Vec<&mut [u8]>,
        missing: &[usize],
    ) {
        if missing.is_empty() {
            return;
        }
        let mut dev_bufs = dev_bufs;
        if self.g.level() != Level::Raid6 {
            parity::raid5_recover(&mut dev_bufs, missing[0]);
            return;
        }
        let lost = lost_of(roles, missing);
        let m = self.g.data_disks();
        let (p_dev, q_dev) = (roles.p_dev(), roles.q_dev().expect("raid6 has Q"));
        let mut cells: Vec<Option<&mut [u8]>> = dev_bufs.into_iter().map(Some).collect();
        let p = cells[p_dev].take().expect("P");
        let q = cells[q_dev].take().expect("Q");
        let mut by_syndrome: Vec<Option<&mut [u8]>> = (0..m).map(|_| None).collect();
        for d in 0..m {
            by_syndrome[roles.syndrome(d)] = cells[roles.data_dev(d)].take();
        }
        let mut data: Vec<&mut [u8]> = by_syndrome
            .into_iter()
            .map(|s| s.expect("every syndrome index filled"))
            .collect();
        parity::raid6_recover(&mut data, p, q, lost);
    }
}

/// Translate missing devices of a RAID6 stripe into what the recovery math needs.
fn lost_of(roles: &StripeRoles, missing: &[usize]) -> parity::Lost {
    use layout::ChunkRole;
    let mut syndromes = Vec::new();
    let (mut p, mut q) = (false, false);
    for &dev in missing {
        match roles.role_of(dev) {
            ChunkRole::Data(d) => syndromes.push(roles.syndrome(d)),
            ChunkRole::P => p = true,
            ChunkRole::Q => q = true,
        }
    }
    syndromes.sort_unstable();
    match (syndromes.as_slice(), p, q) {
        ([], false, false) => parity::Lost::Nothing,
        ([], true, false) => parity::Lost::P,
        ([], false, true) => parity::Lost::Q,
        ([], true, true) => parity::Lost::PQ,
        ([a], false, false) => parity::Lost::Data(*a),
        ([a], true, false) => parity::Lost::DataP(*a),
        ([a], false, true) => parity::Lost::DataQ(*a),
        ([a, b], false, false) => parity::Lost::DataData(*a, *b),
        _ => unreachable!("read_row checked that at most two chunks are missing"),
    }
}

/// One column interval of a batch being written.
struct Interval<'a> {
    row: u64,
    roles: &'a StripeRoles,
    a: u64,
    b: u64,
    batch: &'a [Piece],
    dirty: &'a [bool],
    full: &'a [bool],
    fua: bool,
}

impl Interval<'_> {
    /// The bytes of data chunk `d` over [a, b) when exactly one piece of the batch covers all
    /// of it (and no other piece touches it).
    fn sole_piece(&self, d: usize) -> Option<&[u8]> {
        let mut touching = self
            .batch
            .iter()
            .filter(|p| p.data_index == d && p.offset < self.b && p.end() > self.a);
        let p = touching.next()?;
        if touching.next().is_some() || p.offset > self.a || p.end() < self.b {
            return None;
        }
        Some(&p.data[(self.a - p.offset) as usize..(self.b - p.offset) as usize])
    }

    /// The dirty ones of `data` (every data chunk, by data index), with their indices.
    fn dirty_of<'b>(&self, data: &[&'b [u8]]) -> Vec<(usize, &'b [u8])> {
        data.iter()
            .enumerate()
            .filter(|(d, _)| self.dirty[*d])
            .map(|(d, b)| (d, *b))
            .collect()
    }

    /// Apply the batch's bytes for data chunk `d` to `buf` (which holds [a, b)), in arrival
    /// order so that a later write wins over an earlier one.
    fn overlay(&self, d: usize, buf: &mut [u8]) {
        for p in self.batch.iter().filter(|p| p.data_index == d) {
            let lo = p.offset.max(self.a);
            let hi = p.end().min(self.b);
            if lo < hi {
                let src = &p.data[(lo - p.offset) as usize..(hi - p.offset) as usize];
                buf[(lo - self.a) as usize..(hi - self.a) as usize].copy_from_slice(src);
            }
        }
    }
}

/// [`exposed_rows`], from the parts it depends on.
pub(crate) fn exposed_rows(
    geometry: &layout::Geometry,
    slots: &[crate::members::Slot],
    torn_bytes: Option<u64>,
    resync_owed: bool,
) -> u64 {
    let degraded = geometry.level().is_parity() && slots.iter().any(|s| !s.is_complete());
    match torn_bytes {
        Some(bytes) if degraded && resync_owed => bytes.div_ceil(geometry.chunk_sectors() * 512),
        _ => 0,
    }
}

/// Member bytes `at..at + len` cut at row boundaries (`chunk` bytes of each member): each row
/// with its piece's range in a buffer that starts at `at`.
pub(crate) fn row_pieces(
    at: u64,
    len: u64,
    chunk: u64,
) -> impl Iterator<Item = (u64, std::ops::Range<usize>)> {
    let end = at + len;
    let mut pos = at;
    std::iter::from_fn(move || {
        (pos < end).then(|| {
            let row = pos / chunk;
            let stop = ((row + 1) * chunk).min(end);
            let piece = (pos - at) as usize..(stop - at) as usize;
            pos = stop;
            (row, piece)
        })
    })
}
