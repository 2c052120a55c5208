//! Rows that failed their records: decide block by block what redundancy can vouch for, rebuild
//! it, rewrite it and read it back (design study §5.4–5.5).
//!
//! A member read that does not match its records ends `Corrupt` (see `io`). Callers reading a
//! whole row (`read_present`: degraded reads, RMW fallbacks, rebuild, scrub) hand the row here
//! with the members that read corrupt. Per 4 KiB page:
//! * the blocks that mismatch, with the members missing anyway, are treated as erasures; within
//!   the level's redundancy they are rebuilt from the blocks that matched (never from an
//!   unverified one: no parity pollution);
//! * a rebuilt block that matches its record is written back and read again;
//! * a rebuilt block equal to what the member returned means the row agrees and the record was
//!   the stale party: the record is fixed;
//! * anything else is beyond redundancy: the request fails, no data is returned. A check
//!   ([`Heal::Count`]) counts the page and goes on. Only after an unclean stop
//!   ([`Heal::Settle`]), in a row a crash could have left mid-write and with every member of it
//!   present ([`Parts::settle_scope`]), is such a page settled as found, as md's resync does:
//!   its writes were unflushed, and old or new contents are both allowed. In a degraded row, a
//!   rebuild, or a row the policy knows was consistent, it is damage: EIO.
//!
//! `action check` ([`Heal::Count`]) counts and rebuilds in memory only; `repair`, resync and
//! every client path write the rebuilt blocks back.

use crate::error::Result;
use crate::integrity::{BlockKind, Integrity};
use crate::io::bufpool::PoolBuf;
use crate::io::commit::WriteSet;
use crate::io::MemberIo;
use crate::personality::parts::Parts;
use crate::personality::Parity;
use layout::{ChunkRole, StripeRoles};

const PAGE: usize = format::RECORD_BLOCK;

/// What to do with blocks that fail their records.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Heal {
    /// Rebuild them and write them back (client I/O, rebuild, `repair`).
    Repair,
    /// Rebuild them in memory and count them; write nothing (`check`).
    Count,
    /// As `Repair`, and settle what redundancy cannot vouch for as found (the resync after an
    /// unclean stop).
    Settle,
}

impl Heal {
    /// How a resync, check or repair treats what disagrees.
    pub(crate) fn of(action: crate::work::SyncAction) -> Heal {
        use crate::work::SyncAction;
        match action {
            SyncAction::Check => Heal::Count,
            SyncAction::Resync => Heal::Settle,
            _ => Heal::Repair,
        }
    }
}

/// How a block that failed its record was resolved within the level's redundancy.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Settled {
    /// Rebuilt from the others, matching its record: rewrite it.
    Rebuilt,
    /// The row agrees with the block as found: its record was the stale party.
    StaleRecord,
    /// Parity recomputed from data that is all vouched for: rewrite it with a new record.
    Parity,
}

fn kind_of(roles: &StripeRoles, dev: usize) -> BlockKind {
    match roles.role_of(dev) {
        ChunkRole::Data(_) => BlockKind::Data,
        ChunkRole::P => BlockKind::P,
        ChunkRole::Q => BlockKind::Q,
    }
}

/// One page in which some corrupt members' blocks fail their records.
struct FailedPage {
    pg: usize,
    /// Member byte of the page.
    off: u64,
    roles: StripeRoles,
    /// The members whose block fails its record, and what each returned.
    bad: Vec<usize>,
    found: Vec<Vec<u8>>,
}

impl FailedPage {
    fn bytes(&self) -> std::ops::Range<usize> {
        self.pg * PAGE..(self.pg + 1) * PAGE
    }
}

/// What healing one request's pages did: the blocks to rewrite and the counts its event names.
#[derive(Default)]
struct HealTally {
    /// (member, member byte, page index) of each rebuilt block to write back.
    rewrites: Vec<(usize, u64, usize)>,
    /// Something was decided without a rewrite (a record fixed, a page settled as found).
    resolved: bool,
    failing: usize,
    fixed: usize,
    settled_blocks: usize,
}

impl Parity {
    /// Repair, in `bufs` and on the members, the pages of `corrupt` members that fail their
    /// records; `bufs[dev]` holds member `dev`'s bytes at `at`, `missing` members hold nothing.
    pub(crate) fn heal(
        &self,
        array: &Parts,
        at: u64,
        bufs: &mut [PoolBuf],
        missing: &[usize],
        corrupt: &[usize],
        mode: Heal,
    ) -> Result<()> {
        let integ = array
            .integrity
            .as_ref()
            .expect("heal needs integrity records");
        let pages = bufs[corrupt[0]].len() / PAGE;
        let mode = array.settle_scope(mode, at, (pages * PAGE) as u64, missing.is_empty());
        let mut tally = HealTally::default();
        for pg in 0..pages {
            let Some(page) = self.failed_page(integ, at, pg, bufs, corrupt) else {
                continue;
            };
            tally.failing += page.bad.len();
            for &dev in &page.bad {
                integ.count_mismatch(kind_of(&page.roles, dev));
            }
            if let Some(settled) = self.rebuild_page(integ, &page, bufs, missing) {
                if mode != Heal::Count {
                    self.apply_settled(array, integ, &page, bufs, settled, &mut tally);
                }
                continue;
            }
            self.beyond_redundancy(array, integ, &page, bufs, mode, &mut tally)?;
        }
        if tally.failing > 0 {
            self.report_heal(array, at, mode, &tally);
        }
        let settled = mode == Heal::Settle && (!tally.rewrites.is_empty() || tally.resolved);
        for (dev, off, pg) in tally.rewrites {
            self.rewrite_block(array, dev, off, &bufs[dev][pg * PAGE..(pg + 1) * PAGE])?;
        }
        if settled {
            // What an unclean stop left undecided is decided now, for good: a cut before this
            // is durable could bring back the other outcome after the client saw this one.
            array.flush_members();
        }
        Ok(())
    }

    /// Page `pg` of `bufs`, if blocks of `corrupt` members there fail their records.
    fn failed_page(
        &self,
        integ: &Integrity,
        at: u64,
        pg: usize,
        bufs: &[PoolBuf],
        corrupt: &[usize],
    ) -> Option<FailedPage> {
        let off = at + (pg * PAGE) as u64;
        let r = pg * PAGE..(pg + 1) * PAGE;
        let bad: Vec<usize> = corrupt
            .iter()
            .copied()
            .filter(|&dev| !integ.block_ok(dev, off, &bufs[dev][r.clone()]))
            .collect();
        if bad.is_empty() {
            return None;
        }
        let chunk = self.g.chunk_sectors() * 512;
        let found = bad
            .iter()
            .map(|&dev| bufs[dev][r.clone()].to_vec())
            .collect();
        Some(FailedPage {
            pg,
            off,
            roles: self.g.stripe_roles(off / chunk),
            bad,
            found,
        })
    }

    /// Rebuild the page's failing blocks in `bufs` if the level's redundancy covers them with
    /// the missing members; how each was resolved, or `None` if one was not.
    fn rebuild_page(
        &self,
        integ: &Integrity,
        page: &FailedPage,
        bufs: &mut [PoolBuf],
        missing: &[usize],
    ) -> Option<Vec<(usize, Settled)>> {
        let (off, r, roles) = (page.off, page.bytes(), &page.roles);
        let mut erased: Vec<usize> = missing.iter().chain(&page.bad).copied().collect();
        erased.sort_unstable();
        if erased.len() > self.g.max_degraded() {
            return None;
        }
        self.reconstruct(
            roles,
            bufs.iter_mut().map(|b| &mut b[r.clone()]).collect(),
            &erased,
        );
        // Parity is only ever a function of the data: once every data block of the page
        // is vouched for (read or rebuilt, matching its record), parity that fails its
        // record is recomputed whatever its record says (a write torn between parity and
        // record, a rebuild of a row a cut left mid-write).
        let data_vouched = (0..self.g.raid_disks())
            .filter(|&dev| kind_of(roles, dev) == BlockKind::Data)
            .filter(|dev| erased.contains(dev))
            .all(|dev| integ.block_ok(dev, off, &bufs[dev][r.clone()]));
        let mut settled = Vec::new();
        for (i, &dev) in page.bad.iter().enumerate() {
            let block = &bufs[dev][r.clone()];
            if integ.block_ok(dev, off, block) {
                settled.push((dev, Settled::Rebuilt));
            } else if block == &page.found[i][..] {
                settled.push((dev, Settled::StaleRecord));
            } else if data_vouched && kind_of(roles, dev) != BlockKind::Data {
                settled.push((dev, Settled::Parity));
            } else {
                return None;
            }
        }
        Some(settled)
    }

    /// Records for what was resolved; rewrites queued for what was rebuilt.
    fn apply_settled(
        &self,
        array: &Parts,
        integ: &Integrity,
        page: &FailedPage,
        bufs: &[PoolBuf],
        settled: Vec<(usize, Settled)>,
        tally: &mut HealTally,
    ) {
        let off = page.off;
        for (dev, how) in settled {
            if how == Settled::Parity {
                tracing::warn!(array = %array.name, role = dev, offset = off,
                    "parity and its record disagree with verified data: recomputed");
                integ.set_block(dev, off, &bufs[dev][page.bytes()]);
                integ.count_record_fixed();
            }
            if how != Settled::StaleRecord {
                tally.rewrites.push((dev, off, page.pg));
            } else {
                tracing::warn!(array = %array.name, role = dev, offset = off,
                    "integrity record was stale (the row agrees with the block): fixed");
                let i = page.bad.iter().position(|&b| b == dev).expect("bad");
                integ.set_block(dev, off, &page.found[i]);
                integ.count_record_fixed();
                tally.resolved = true;
                tally.fixed += 1;
            }
        }
    }

    /// A page redundancy cannot vouch for: EIO, counted by a check, or settled as found after
    /// an unclean stop.
    fn beyond_redundancy(
        &self,
        array: &Parts,
        integ: &Integrity,
        page: &FailedPage,
        bufs: &mut [PoolBuf],
        mode: Heal,
        tally: &mut HealTally,
    ) -> Result<()> {
        let (off, r, bad) = (page.off, page.bytes(), &page.bad);
        if mode != Heal::Settle {
            integ.count_unrecoverable();
            tracing::error!(array = %array.name, offset = off, roles = ?bad,
                "blocks fail their records beyond what redundancy can rebuild");
            array.members.events.emit(
                "integrity_unrecoverable",
                &array.name,
                None,
                format!(
                    "roles {bad:?} at member byte {off} fail their records beyond the \
                     level's redundancy: reads there fail"
                ),
            );
            if mode == Heal::Count {
                // A check counts it and goes on; the page stays as found.
                for (i, &dev) in bad.iter().enumerate() {
                    bufs[dev][r.clone()].copy_from_slice(&page.found[i]);
                }
                return Ok(());
            }
            return Err(array.members.corruption(
                bad,
                off,
                PAGE as u64,
                "blocks fail their integrity records beyond the level's redundancy",
            ));
        }
        // After an unclean stop, unflushed writes may have left the row as found: keep it
        // (the resync recomputes parity from the data) and take its records.
        tally.resolved = true;
        tally.settled_blocks += bad.len();
        for (i, &dev) in bad.iter().enumerate() {
            bufs[dev][r.clone()].copy_from_slice(&page.found[i]);
            integ.set_block(dev, off, &page.found[i]);
            integ.count_resolved();
        }
        Ok(())
    }

    fn report_heal(&self, array: &Parts, at: u64, mode: Heal, tally: &HealTally) {
        let kind = if mode == Heal::Count {
            "integrity_mismatch"
        } else {
            "integrity_repaired"
        };
        let what = if mode == Heal::Count {
            "rebuilt in memory (check)".to_string()
        } else {
            format!(
                "{} rewritten, {} stale records fixed, {} settled as found after an unclean stop",
                tally.rewrites.len(),
                tally.fixed,
                tally.settled_blocks
            )
        };
        array.members.events.emit(
            kind,
            &array.name,
            None,
            format!(
                "{} blocks near member byte {at} failed their records: {what}",
                tally.failing
            ),
        );
    }

    /// Write a rebuilt block back to `dev` and read it again; a member that keeps returning
    /// wrong data after rewrites is failed.
    fn rewrite_block(&self, array: &Parts, dev: usize, off: u64, page: &[u8]) -> Result<()> {
        let integ = array.integrity.as_ref().expect("integrity");
        let mut io = [MemberIo::write(&array.members, dev, off, page, false)];
        array
            .commit
            .writes(array, &WriteSet::repair(off, PAGE as u64), &mut io)?;
        if !io[0].ok() {
            return Ok(());
        }
        let mut back = array.bufs.get(PAGE);
        let mut io = [MemberIo::read(&array.members, dev, off, &mut back)];
        array.run_io(&mut io);
        if io[0].ok() {
            integ.count_repaired();
            tracing::info!(array = %array.name, role = dev, offset = off, "block rebuilt from redundancy and rewritten");
            return Ok(());
        }
        drop(io);
        tracing::warn!(array = %array.name, role = dev, offset = off, "rewritten block reads back wrong");
        array
            .integrity
            .as_ref()
            .expect("integrity")
            .strike_rewrite(&array.members, dev);
        Ok(())
    }

    /// The data blocks of `missing` members, just reconstructed in `bufs`, match their records
    /// (a degraded read is verified end to end). Parity of a missing member is not checked: a
    /// degraded array does not keep it current. A mismatch is never settled, even after an
    /// unclean stop: with a member missing the row has no redundancy left to tell a torn
    /// write from damage, and a reconstruction nothing vouches for is not served.
    pub(crate) fn verify_rebuilt(
        &self,
        array: &Parts,
        at: u64,
        bufs: &[PoolBuf],
        missing: &[usize],
    ) -> Result<()> {
        let Some(integ) = &array.integrity else {
            return Ok(());
        };
        let chunk = self.g.chunk_sectors() * 512;
        for &dev in missing {
            for (pg, page) in bufs[dev].chunks(PAGE).enumerate() {
                let off = at + (pg * PAGE) as u64;
                let roles = self.g.stripe_roles(off / chunk);
                if kind_of(&roles, dev) == BlockKind::Data && !integ.block_ok(dev, off, page) {
                    integ.count_unrecoverable();
                    return Err(array.members.corruption(
                        &[dev],
                        off,
                        PAGE as u64,
                        "a reconstructed block fails its integrity record",
                    ));
                }
            }
        }
        Ok(())
    }
}
