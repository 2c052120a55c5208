//! Levels without parity: linear, RAID0, RAID1, RAID10.
//!
//! Every array sector has one or more copies (`Geometry::map_copies`). Reads take one usable copy
//! per piece, all pieces in parallel, and retry a failed piece on the next copy (the failed
//! member has been marked faulty by then). Writes go to every usable copy in parallel and succeed
//! when each piece reached at least one copy.
//!
//! Why region locks: two overlapping writes in flight could land in different orders on two
//! mirrors and leave them different forever. Writers to redundant levels hold a lock per 64 KiB
//! region of the array (a fixed table of mutexes, taken in index order, so no deadlock); reads
//! take no lock.

use crate::error::Result;
use crate::io::commit::WriteSet;
use crate::io::{IoOutcome, MemberIo};
use crate::lock::REGION_BYTES;
use crate::personality::parts::Parts;
use crate::personality::Copies;
use layout::Level;
use std::os::fd::BorrowedFd;
use std::sync::atomic::Ordering;

/// One contiguous piece of a request that lives on the same copies.
struct Piece {
    array_offset: u64,
    buf_offset: usize,
    len: usize,
    copies: layout::Copies,
}

impl Copies {
    fn pieces(&self, offset_bytes: u64, len: usize) -> Vec<Piece> {
        let mut out = Vec::new();
        let mut done = 0usize;
        while done < len {
            let at = offset_bytes + done as u64;
            let copies = self.g.map_copies(at / 512);
            let mut n = (copies.run_sectors() * 512).min((len - done) as u64);
            if self.g.level() == Level::Raid1 {
                n = n.min(REGION_BYTES - at % REGION_BYTES);
            }
            assert!(n > 0, "layout returned an empty run at byte {at}");
            out.push(Piece {
                array_offset: at,
                buf_offset: done,
                len: n as usize,
                copies,
            });
            done += n as usize;
        }
        out
    }

    /// Each piece spliced into `pipe` in order, from the copy [`Copies::mirror_read`] would
    /// read first, while that one has no recorded bad block there and can splice; never with
    /// integrity records (they verify bytes in memory). False at the first piece that cannot:
    /// the caller reads the range the ordinary way, which tries the other copies and handles
    /// what failed here.
    pub(crate) fn splice_copies(
        &self,
        array: &Parts,
        offset_bytes: u64,
        len: usize,
        pipe: BorrowedFd<'_>,
    ) -> bool {
        let spread = self.first_copy(array);
        self.pieces(offset_bytes, len)
            .iter()
            .enumerate()
            .all(|(i, p)| {
                let start = if spread == 0 { 0 } else { spread + i };
                self.pick_copy(array, p, start, &mut 0).is_some_and(|copy| {
                    array.splice_member(copy.dev, copy.dev_sector * 512, p.len, pipe)
                })
            })
    }

    pub(crate) fn mirror_read(
        &self,
        array: &Parts,
        offset_bytes: u64,
        buf: &mut [u8],
    ) -> Result<()> {
        self.mirror_read_in(array, offset_bytes, buf, false)
    }

    /// The copy reads start with: spread over the copies, but always the first while they may
    /// differ (a resync pending), so that reading a block twice gives the same answer (md),
    /// and always with `read_primary`.
    fn first_copy(&self, array: &Parts) -> usize {
        if array.config.read_primary || array.walker.resync_owed() {
            0
        } else {
            self.next_copy.fetch_add(1, Ordering::Relaxed)
        }
    }

    /// `locked`: the caller holds the range's region locks (a repair then takes none).
    fn mirror_read_in(
        &self,
        array: &Parts,
        offset_bytes: u64,
        buf: &mut [u8],
        locked: bool,
    ) -> Result<()> {
        if let Some((a, b)) = self.whole_pages(array, offset_bytes, buf.len()) {
            // Records verify whole pages: read the pages around the range.
            let mut pages = array.bufs.get((b - a) as usize);
            self.mirror_read_in(array, a, &mut pages, locked)?;
            let skip = (offset_bytes - a) as usize;
            buf.copy_from_slice(&pages[skip..skip + buf.len()]);
            return Ok(());
        }
        let pieces = self.pieces(offset_bytes, buf.len());
        let spread = self.first_copy(array);
        // attempt[i]: how many copies of piece i have been tried
        let mut attempt = vec![0usize; pieces.len()];
        // corrupt[i]: a copy of piece i failed its records; the piece's copies are then settled
        // (repaired) and the client gets the settled bytes.
        let mut corrupt = vec![false; pieces.len()];
        let mut pending: Vec<usize> = (0..pieces.len()).collect();
        // (piece, role, member byte) of copies whose read failed: rewritten from a good copy.
        let mut unread: Vec<(usize, usize, u64)> = Vec::new();
        while !pending.is_empty() {
            let mut ios = Vec::new();
            let mut which = Vec::new();
            let mut rest: &mut [u8] = buf;
            let mut consumed = 0usize;
            for &i in &pending {
                let p = &pieces[i];
                let start = if spread == 0 { 0 } else { spread + i };
                let Some(copy) = self.pick_copy(array, p, start, &mut attempt[i]) else {
                    if corrupt[i] {
                        continue;
                    }
                    self.record_unreadable_copies(array, p, i, &unread);
                    return Err(array.members.unrecoverable(
                        p.array_offset,
                        p.len as u64,
                        "no usable copy left",
                    ));
                };
                let (_, tail) = std::mem::take(&mut rest).split_at_mut(p.buf_offset - consumed);
                let (mine, tail) = tail.split_at_mut(p.len);
                rest = tail;
                consumed = p.buf_offset + p.len;
                ios.push(MemberIo::read(
                    &array.members,
                    copy.dev,
                    copy.dev_sector * 512,
                    mine,
                ));
                which.push(i);
            }
            array.run_io(&mut ios);
            let failed: Vec<usize> = ios
                .iter()
                .zip(&which)
                .filter(|(op, _)| !op.ok())
                .map(|(_, &i)| i)
                .collect();
            for (op, &i) in ios.iter().zip(&which) {
                corrupt[i] |= op.outcome == IoOutcome::Corrupt;
                if op.outcome == IoOutcome::ReadError {
                    unread.push((i, op.role, op.offset_bytes));
                }
            }
            if !failed.is_empty() && self.g.max_degraded() == 0 {
                let p = &pieces[failed[0]];
                return Err(array.members.unrecoverable(
                    p.array_offset,
                    p.len as u64,
                    "member read failed on a level without redundancy",
                ));
            }
            pending = failed;
        }
        self.settle_read(array, &pieces, &corrupt, buf, locked)?;
        for (i, role, dev_off) in unread {
            self.correct_copy(array, &pieces[i], role, dev_off, locked);
        }
        Ok(())
    }

    /// The pieces of a read with a copy that failed its records, settled: the client gets
    /// what the copies were settled to, not the copy that happened to pass (after an unclean
    /// stop two copies may both pass and differ, and the next read must return the same bytes
    /// as this one).
    fn settle_read(
        &self,
        array: &Parts,
        pieces: &[Piece],
        corrupt: &[bool],
        buf: &mut [u8],
        locked: bool,
    ) -> Result<()> {
        for p in pieces
            .iter()
            .zip(corrupt)
            .filter(|(_, c)| **c)
            .map(|(p, _)| p)
        {
            let out = &mut buf[p.buf_offset..p.buf_offset + p.len];
            let _guard =
                (!locked).then(|| array.locks.lock_array_range(p.array_offset, p.len as u64));
            self.settle_copies(
                array,
                p.array_offset,
                p.len as u64,
                array.heal_mode(),
                Some(out),
            )?;
        }
        Ok(())
    }

    /// No copy of piece `i` (`p`) could be read: the pages of the copies whose reads failed
    /// (`unread`: piece, role, member byte) that fail again are recorded as bad blocks there
    /// (see `badblocks`), so they read EIO until written rather than being asked again.
    fn record_unreadable_copies(
        &self,
        array: &Parts,
        p: &Piece,
        i: usize,
        unread: &[(usize, usize, u64)],
    ) {
        let page = crate::members::badblocks::BAD_PAGE;
        for &(_, role, dev_off) in unread.iter().filter(|u| u.0 == i) {
            let (a, b) = (
                dev_off / page * page,
                (dev_off + p.len as u64).div_ceil(page) * page,
            );
            for off in (a..b).step_by(page as usize) {
                let Some(member) = array.members.slot(role).in_sync_member(off, page) else {
                    continue;
                };
                let mut buf = array.bufs.get(page as usize);
                let mut io = [MemberIo::read(&array.members, role, off, &mut buf)];
                array.run_io(&mut io);
                if io[0].outcome == IoOutcome::ReadError
                    && !array.members.note_read_error(role, &member)
                {
                    let why = "unreadable, and no other copy holds it";
                    array
                        .members
                        .record_bad_blocks(role, &member, off, page, why);
                }
            }
        }
    }

    /// A copy of piece `p` on `role` (at member byte `dev_off`) failed a read that another copy
    /// served: read a good copy again under the region lock (a write may have come in since)
    /// and write it back there (see `badblocks`).
    fn correct_copy(&self, array: &Parts, p: &Piece, role: usize, dev_off: u64, locked: bool) {
        let _guard = (!locked).then(|| array.locks.lock_array_range(p.array_offset, p.len as u64));
        let mut good = array.bufs.get(p.len);
        if self
            .read_other_copy(array, role, p.array_offset, &mut good)
            .is_ok()
        {
            let set = WriteSet::repair(p.array_offset, p.len as u64);
            array.correct_read_error(role, dev_off, &good, set);
        }
    }

    /// With integrity records, the whole pages around array bytes `offset..offset + len` when
    /// the range is not made of whole pages.
    fn whole_pages(&self, array: &Parts, offset_bytes: u64, len: usize) -> Option<(u64, u64)> {
        let page = format::RECORD_BLOCK as u64;
        let end = offset_bytes + len as u64;
        (array.integrity.is_some()
            && (!offset_bytes.is_multiple_of(page) || !end.is_multiple_of(page)))
        .then(|| (offset_bytes / page * page, end.div_ceil(page) * page))
    }

    /// The next usable copy of a piece to try, starting from a spread-out index so that
    /// concurrent reads use all mirrors.
    fn pick_copy(
        &self,
        array: &Parts,
        p: &Piece,
        spread: usize,
        attempt: &mut usize,
    ) -> Option<layout::Loc> {
        let n = p.copies.len();
        while *attempt < n {
            let copy = p.copies.get((spread + *attempt) % n);
            *attempt += 1;
            if array
                .members
                .slot(copy.dev)
                .in_sync(copy.dev_sector * 512, p.len as u64)
            {
                return Some(copy);
            }
        }
        None
    }

    pub(crate) fn mirror_write(
        &self,
        array: &Parts,
        offset_bytes: u64,
        data: &[u8],
        fua: bool,
    ) -> Result<()> {
        let (a, b) = self
            .whole_pages(array, offset_bytes, data.len())
            .unwrap_or((offset_bytes, offset_bytes + data.len() as u64));
        let _guards = (self.g.max_degraded() > 0).then(|| array.locks.lock_array_range(a, b - a));
        if (a, b) == (offset_bytes, offset_bytes + data.len() as u64) {
            return self.mirror_write_locked(array, offset_bytes, data, fua);
        }
        // Records cover whole pages: read the pages around the range (verified), patch, write.
        let mut pages = array.bufs.get((b - a) as usize);
        let page = format::RECORD_BLOCK;
        let (end, last) = (offset_bytes + data.len() as u64, b - page as u64);
        let mut edges = Vec::new();
        if offset_bytes != a {
            edges.push(a);
        }
        if end != b && edges.last() != Some(&last) {
            edges.push(last);
        }
        for at in edges {
            let skip = (at - a) as usize;
            self.mirror_read_in(array, at, &mut pages[skip..skip + page], true)?;
        }
        let skip = (offset_bytes - a) as usize;
        pages[skip..skip + data.len()].copy_from_slice(data);
        self.mirror_write_locked(array, a, &pages, fua)
    }

    /// A write whose region locks the caller holds (pages whole when records are kept).
    fn mirror_write_locked(
        &self,
        array: &Parts,
        offset_bytes: u64,
        data: &[u8],
        fua: bool,
    ) -> Result<()> {
        let pieces = self.pieces(offset_bytes, data.len());
        let mut ios = Vec::new();
        let mut owner = Vec::new();
        for (i, p) in pieces.iter().enumerate() {
            let bytes = &data[p.buf_offset..p.buf_offset + p.len];
            // Every copy holds the same bytes: their records are computed once.
            let records = array
                .integrity
                .as_ref()
                .map(|integ| integ.records_of(bytes));
            for copy in p.copies.iter() {
                if array
                    .members
                    .slot(copy.dev)
                    .in_sync(copy.dev_sector * 512, p.len as u64)
                {
                    let mut io = MemberIo::write(
                        &array.members,
                        copy.dev,
                        copy.dev_sector * 512,
                        bytes,
                        fua,
                    );
                    io.records = records.clone();
                    ios.push(io);
                    owner.push(i);
                } else if let (Some(integ), Some(records)) = (&array.integrity, &records) {
                    // The copy's records follow what it should hold: a degraded mirror's
                    // tables stand in for the missing member's (see `Integrity::load`).
                    integ.set_records(copy.dev, copy.dev_sector * 512, records);
                }
            }
        }
        array.commit.writes(
            array,
            &WriteSet::mirror(offset_bytes, data.len() as u64),
            &mut ios,
        )?;
        let mut written = vec![false; pieces.len()];
        for (op, &i) in ios.iter().zip(&owner) {
            written[i] |= op.ok();
        }
        if let Some(i) = written.iter().position(|w| !w) {
            let p = &pieces[i];
            return Err(array.members.unrecoverable(
                p.array_offset,
                p.len as u64,
                "write reached no copy",
            ));
        }
        Ok(())
    }
}
