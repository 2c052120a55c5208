//! Bringing the copies of a mirrored range into agreement: scrub, resync and repair of RAID1 and
//! RAID10, and the repair of copies that fail their integrity records.
//!
//! Every current copy of the range is read; then, per 4 KiB page, one copy is chosen as the truth
//! and the others follow it:
//! * without records, the first copy that could be read and that a read verifier (if any)
//!   did not reject (md's rule);
//! * after an unclean stop, where the copies' records differ: the first copy (the page was
//!   being written when the power went, and a record proves nothing there);
//! * with records, a copy that matches its record. Copies that fail theirs are counted and, unless
//!   only checking, rewritten from that copy and read back (a member whose rewrites keep reading
//!   back wrong is failed);
//! * if no copy matches, nothing can vouch for the page: the request fails, no data is returned,
//!   even when the copies agree (two devices' copies against two devices' records: a tie, and
//!   an error is the answer that is never wrong); a check counts it and goes on. Only after an
//!   unclean stop ([`Heal::Settle`]), in a range a crash could have left mid-write and with
//!   every copy present ([`Parts::settle_scope`]), is the first copy kept instead: every copy
//!   then holds old or new bytes of writes that were never flushed, and the records may lag.
//!
//! The caller holds the range's region locks, so no client write can slip in between the reads
//! and the rewrites.

use crate::error::Result;
use crate::integrity::BlockKind;
use crate::io::bufpool::PoolBuf;
use crate::io::commit::WriteSet;
use crate::io::{IoOutcome, MemberIo};
use crate::personality::parts::Parts;
use crate::personality::raid456_heal::Heal;
use crate::personality::Copies;
use layout::Loc;

const PAGE: usize = format::RECORD_BLOCK;

/// What was decided for one copy of a run: pages to rewrite from the truth, and whether those
/// pages failed their records (and so must read back right afterwards).
struct CopyPlan {
    loc: Loc,
    bytes: PoolBuf,
    /// The read verifier rejected the read (levels without records judge by it alone).
    rejected: bool,
    rewrite: Vec<bool>,
    failed_record: Vec<bool>,
}

/// The copy a page's truth is taken from.
enum Chosen {
    /// This copy passes its record (or read verifier).
    Passing(usize),
    /// None passes and a check goes on: the first copy, as found.
    First,
    /// After an unclean stop the first copy stands, and its record is taken.
    SettledFirst,
}

impl Copies {
    /// Make the copies of array bytes `at..at + len` agree (see the module doc), under region
    /// locks the caller holds; `out` receives the agreed bytes. Returns the sectors of pages
    /// whose copies differed (md's `mismatch_cnt`).
    pub(crate) fn settle_copies(
        &self,
        array: &Parts,
        at: u64,
        len: u64,
        mode: Heal,
        mut out: Option<&mut [u8]>,
    ) -> Result<u64> {
        if array.integrity.is_some() {
            assert!(
                at.is_multiple_of(PAGE as u64) && len.is_multiple_of(PAGE as u64),
                "records cover whole pages: {at}+{len}"
            );
        }
        let mut done = 0u64;
        let mut mismatched = 0u64;
        while done < len {
            let copies = self.g.map_copies((at + done) / 512);
            let n = (copies.run_sectors() * 512).min(len - done);
            let out_run = out
                .as_deref_mut()
                .map(|o| &mut o[done as usize..(done + n) as usize]);
            mismatched += self.settle_run(array, at + done, &copies, n as usize, mode, out_run)?;
            done += n;
        }
        Ok(mismatched)
    }

    fn settle_run(
        &self,
        array: &Parts,
        at: u64,
        copies: &layout::Copies,
        n: usize,
        mode: Heal,
        out: Option<&mut [u8]>,
    ) -> Result<u64> {
        let mut plans = self.read_copies(array, at, copies, n)?;
        let pages = n.div_ceil(PAGE);
        // Settling as found needs every copy of the run: with one missing, the copies left
        // cannot tell a torn write from damage.
        let mode = array.settle_scope(mode, at, n as u64, plans.len() == copies.len());
        let fix = mode != Heal::Count;
        let mut truth = array.bufs.get(n);
        let (mut mismatched, mut failing, mut settled) = (0u64, 0usize, 0usize);
        for pg in 0..pages {
            let r = pg * PAGE..((pg + 1) * PAGE).min(n);
            let differ = plans[1..]
                .iter()
                .any(|p| p.bytes[r.clone()] != plans[0].bytes[r.clone()]);
            if differ {
                mismatched += r.len() as u64 / 512;
            }
            // Records judge each page; without them, a read verifier's verdict on the read.
            let ok: Vec<bool> = plans
                .iter()
                .map(|p| match &array.integrity {
                    Some(i) => i.block_ok(p.loc.dev, self.page_at(p, pg), &p.bytes[r.clone()]),
                    None => !p.rejected,
                })
                .collect();
            let bad = ok.iter().filter(|o| !**o).count();
            failing += bad;
            if let Some(integ) = &array.integrity {
                (0..bad).for_each(|_| integ.count_mismatch(BlockKind::Data));
            }
            let chosen = match self.choose_copy(array, &mut plans, pg, &ok, mode, at)? {
                Chosen::Passing(i) => i,
                Chosen::First => 0,
                Chosen::SettledFirst => {
                    settled += 1;
                    0
                }
            };
            truth[r.clone()].copy_from_slice(&plans[chosen].bytes[r.clone()]);
            for p in plans.iter_mut() {
                p.rewrite[pg] = fix && p.bytes[r.clone()] != truth[r.clone()];
                p.rewrite[pg] |= fix && p.failed_record[pg];
            }
        }
        if failing > 0 && array.integrity.is_some() {
            self.report_copy_findings(array, at, failing, settled, mode, &plans);
        }
        for p in &plans {
            self.rewrite_copy(array, at, p, &truth)?;
        }
        if fix {
            self.follow_truth_in_missing_copies(array, copies, &plans, &truth);
        }
        if mode == Heal::Settle && (settled > 0 || plans.iter().any(|p| p.rewrite.contains(&true)))
        {
            // What an unclean stop left undecided is decided now, for good (as in `raid456_heal`).
            array.flush_members();
        }
        if let Some(out) = out {
            out.copy_from_slice(&truth);
        }
        Ok(mismatched)
    }

    /// Read every in-sync copy of the run; the copies that returned bytes.
    fn read_copies(
        &self,
        array: &Parts,
        at: u64,
        copies: &layout::Copies,
        n: usize,
    ) -> Result<Vec<CopyPlan>> {
        let current: Vec<Loc> = copies
            .iter()
            .filter(|c| {
                array
                    .members
                    .slot(c.dev)
                    .in_sync(c.dev_sector * 512, n as u64)
            })
            .collect();
        let mut bufs: Vec<PoolBuf> = current.iter().map(|_| array.bufs.get(n)).collect();
        let mut ios: Vec<_> = current
            .iter()
            .zip(bufs.iter_mut())
            .map(|(c, b)| MemberIo::read(&array.members, c.dev, c.dev_sector * 512, b))
            .collect();
        array.run_io(&mut ios);
        // Corrupt reads returned bytes (judged page by page below); failed ones failed the member.
        let outcomes: Vec<IoOutcome> = ios.iter().map(|op| op.outcome).collect();
        drop(ios);
        let pages = n.div_ceil(PAGE);
        let plans: Vec<CopyPlan> = current
            .into_iter()
            .zip(bufs)
            .zip(outcomes)
            .filter(|(_, o)| matches!(o, IoOutcome::Ok | IoOutcome::Corrupt))
            .map(|((loc, bytes), o)| CopyPlan {
                loc,
                bytes,
                rejected: o == IoOutcome::Corrupt,
                rewrite: vec![false; pages],
                failed_record: vec![false; pages],
            })
            .collect();
        if plans.is_empty() {
            return Err(array.members.unrecoverable(
                at,
                n as u64,
                "no copy of the range could be read",
            ));
        }
        Ok(plans)
    }

    /// Which copy's page `pg` is the truth, given which pass (`ok`); EIO when none does, except
    /// for a check (which counts it) and after an unclean stop (the first copy stands).
    fn choose_copy(
        &self,
        array: &Parts,
        plans: &mut [CopyPlan],
        pg: usize,
        ok: &[bool],
        mode: Heal,
        at: u64,
    ) -> Result<Chosen> {
        let n = plans[0].bytes.len();
        let r = pg * PAGE..((pg + 1) * PAGE).min(n);
        Ok(match ok.iter().position(|o| *o) {
            // After an unclean stop, copies whose records differ were being written when
            // the power went (a table copy may be newer than the data it describes, or
            // older): a copy passing its record proves nothing there, and md's rule holds
            // (the first copy stands), so that what a read returned before the resync got
            // here is what it leaves.
            Some(_) if mode == Heal::Settle && !self.records_agree(array, plans, pg) => {
                // Copies holding the first copy's bytes take its record now; the others
                // are rewritten below.
                let integ = array.integrity.as_ref().expect("records");
                let first = &plans[0].bytes[r.clone()];
                for p in plans.iter().filter(|p| &p.bytes[r.clone()] == first) {
                    integ.set_block(p.loc.dev, self.page_at(p, pg), first);
                }
                integ.count_resolved();
                Chosen::SettledFirst
            }
            Some(good) => {
                for (p, ok) in plans.iter_mut().zip(ok) {
                    p.failed_record[pg] = !ok;
                }
                Chosen::Passing(good)
            }
            None if mode == Heal::Settle => {
                // After an unclean stop: writes that were never flushed left the copies old
                // or new, and their records may lag; the first copy stands and the others
                // follow it.
                if let Some(integ) = &array.integrity {
                    let first = &plans[0];
                    let off = self.page_at(first, pg);
                    integ.set_block(first.loc.dev, off, &first.bytes[r.clone()]);
                    integ.count_resolved();
                }
                Chosen::SettledFirst
            }
            None => {
                let err =
                    self.no_copy_passes(array, plans, pg, at + r.start as u64, r.len() as u64);
                if mode != Heal::Count {
                    return Err(err);
                }
                // A check counts it and goes on.
                Chosen::First
            }
        })
    }

    /// The records of copies that were not read (a missing or rebuilding member) follow what
    /// the others now hold: a degraded 2-way mirror's tables of the missing member are its
    /// survivor's only other record (see `Integrity::load`).
    fn follow_truth_in_missing_copies(
        &self,
        array: &Parts,
        copies: &layout::Copies,
        plans: &[CopyPlan],
        truth: &[u8],
    ) {
        let Some(integ) = &array.integrity else {
            return;
        };
        for c in copies.iter().filter(|c| !plans.iter().any(|p| p.loc == *c)) {
            for (pg, page) in truth.chunks(PAGE).enumerate() {
                let off = c.dev_sector * 512 + (pg * PAGE) as u64;
                if !integ.block_ok(c.dev, off, page) {
                    integ.set_block(c.dev, off, page);
                }
            }
        }
    }

    /// Page `pg` of every copy read (array byte `off`) fails verification.
    fn no_copy_passes(
        &self,
        array: &Parts,
        plans: &[CopyPlan],
        pg: usize,
        off: u64,
        len: u64,
    ) -> crate::error::EngineError {
        if let Some(integ) = &array.integrity {
            integ.count_unrecoverable();
            tracing::error!(array = %array.name, array_offset = off, "every copy fails its record");
            array.members.events.emit(
                "integrity_unrecoverable",
                &array.name,
                None,
                format!(
                    "every copy of array byte {off} fails its integrity record: reads there fail"
                ),
            );
        }
        let devs: Vec<usize> = plans.iter().map(|p| p.loc.dev).collect();
        array.members.corruption(
            &devs,
            self.page_at(&plans[0], pg),
            len,
            &format!("every copy of array byte {off} fails verification"),
        )
    }

    /// Do the copies' records of page `pg` agree (true without records)?
    fn records_agree(&self, array: &Parts, plans: &[CopyPlan], pg: usize) -> bool {
        let Some(integ) = &array.integrity else {
            return true;
        };
        let first = integ.record(plans[0].loc.dev, self.page_at(&plans[0], pg));
        plans[1..]
            .iter()
            .all(|p| integ.record(p.loc.dev, self.page_at(p, pg)) == first)
    }

    /// Member byte of page `pg` of a copy's run.
    fn page_at(&self, p: &CopyPlan, pg: usize) -> u64 {
        p.loc.dev_sector * 512 + (pg * PAGE) as u64
    }

    fn report_copy_findings(
        &self,
        array: &Parts,
        at: u64,
        failing: usize,
        settled: usize,
        mode: Heal,
        plans: &[CopyPlan],
    ) {
        let (kind, what) = if mode == Heal::Count {
            ("integrity_mismatch", "counted (check)".to_string())
        } else {
            let rewritten: usize = plans
                .iter()
                .map(|p| p.failed_record.iter().filter(|f| **f).count())
                .sum();
            (
                "integrity_repaired",
                format!(
                    "{rewritten} rewritten from a good copy, {settled} settled as found after \
                     an unclean stop"
                ),
            )
        };
        array.members.events.emit(
            kind,
            &array.name,
            None,
            format!("{failing} copies of pages near array byte {at} failed their records: {what}"),
        );
    }

    /// Write the pages of `p` marked for rewrite from `truth`, in runs; pages that failed their
    /// records are read back and must verify now.
    fn rewrite_copy(&self, array: &Parts, at: u64, p: &CopyPlan, truth: &[u8]) -> Result<()> {
        let n = truth.len();
        let mut pg = 0;
        while pg < p.rewrite.len() {
            if !p.rewrite[pg] {
                pg += 1;
                continue;
            }
            let first = pg;
            while pg < p.rewrite.len() && p.rewrite[pg] {
                pg += 1;
            }
            let r = first * PAGE..(pg * PAGE).min(n);
            let dev_off = p.loc.dev_sector * 512 + r.start as u64;
            let mut io = [MemberIo::write(
                &array.members,
                p.loc.dev,
                dev_off,
                &truth[r.clone()],
                false,
            )];
            array.commit.writes(
                array,
                &WriteSet::repair(at + r.start as u64, r.len() as u64),
                &mut io,
            )?;
            if !io[0].ok()
                || array.integrity.is_none()
                || !p.failed_record[first..pg].contains(&true)
            {
                continue;
            }
            self.read_back(
                array,
                p.loc.dev,
                dev_off,
                r.len(),
                &p.failed_record[first..pg],
            );
        }
        Ok(())
    }

    /// Read rewritten pages of `dev` again: each that verifies counts as repaired; a member whose
    /// rewrites keep reading back wrong is failed.
    fn read_back(&self, array: &Parts, dev: usize, dev_off: u64, len: usize, counted: &[bool]) {
        let integ = array.integrity.as_ref().expect("records");
        let mut back = array.bufs.get(len);
        let mut io = [MemberIo::read(&array.members, dev, dev_off, &mut back)];
        array.run_io(&mut io);
        let outcome = io[0].outcome;
        drop(io);
        if matches!(outcome, IoOutcome::IoError | IoOutcome::ReadError) {
            return;
        }
        for (i, page) in back.chunks(PAGE).enumerate() {
            if !counted[i] {
                continue;
            }
            let off = dev_off + (i * PAGE) as u64;
            if integ.block_ok(dev, off, page) {
                integ.count_repaired();
                tracing::info!(array = %array.name, role = dev, offset = off,
                    "copy rewritten from a good copy");
            } else {
                tracing::warn!(array = %array.name, role = dev, offset = off,
                    "rewritten copy reads back wrong");
                if array
                    .integrity
                    .as_ref()
                    .expect("integrity")
                    .strike_rewrite(&array.members, dev)
                {
                    return;
                }
            }
        }
    }
}
