//! Superblock bookkeeping: every change of array state goes through here.
//!
//! md keeps one superblock per member, all carrying the same array-wide fields (events,
//! `resync_offset`, the `dev_roles` table) and each its own device fields (`dev_number`,
//! `data_offset`, `recovery_offset`, device UUID). [`Meta`] holds them, behind the array's
//! metadata mutex, and every change is: mutate the array-wide fields, bump `events`, then on every
//! member that is not faulty flush and write the superblock with FUA (md's PREFLUSH|FUA). The
//! flush is what makes recorded progress safe: a superblock that says "rebuilt up to X", "in
//! sync" or "clean" reaches the medium only after every member write that completed before the
//! commit did. FUA alone makes the superblock durable, not the writes before it. A member whose
//! flush or superblock write fails is faulty: the caller records that in a further update (md
//! does the same).
//!
//! Events only go up here (md may step back by one on clean transitions; we never do, which is
//! allowed: md accepts any member whose count is within one of the freshest).

use crate::members::metadata::{self, Metadata};
use crate::members::Member;
use device::AlignedBuf;
use format::{Superblock, SB_BYTES, SB_OFFSET_SECTORS};
use std::io;
use std::sync::Arc;

/// Byte offset of the v1.2 superblock on every member.
pub(crate) const SB_OFFSET_BYTES: u64 = SB_OFFSET_SECTORS * 512;

pub(crate) struct MemberSb {
    pub member: Arc<Member>,
    pub sb: Superblock,
    /// False once the member is faulty (md stops writing its superblock), and while another
    /// node of a cluster rebuilds it (that node records its progress there).
    pub writable: bool,
}

pub(crate) struct Meta {
    /// Stamps `utime` in every commit.
    pub clock: Arc<dyn crate::clock::Clock>,
    pub members: Vec<MemberSb>,
    pub events: u64,
    pub resync_offset: u64,
    pub roles: Vec<u16>,
    /// Replicated metadata whose headers record each new event count first (the
    /// write-intent bitmap, then the used-region map).
    pub recorders: Vec<Arc<dyn EventRecorder>>,
}

/// Metadata replicated on the members whose header carries the superblocks' event count, and
/// must carry the new one before any superblock does: md's rule for its bitmap (a bitmap whose
/// events are behind the superblocks' is stale and costs a full resync).
pub(crate) trait EventRecorder: Send + Sync {
    /// Record `events` (and the superblocks' `utime`) durably on `members`; returns the
    /// members the write failed on.
    fn record_events(
        &self,
        events: u64,
        utime: u64,
        members: &[Arc<Member>],
    ) -> crate::members::paged::WriteFailures;
}

impl Meta {
    /// Other nodes write these superblocks too: go on from the highest event count the
    /// members hold (what this node last wrote may be behind another node's commit).
    pub fn catch_up_events(&mut self) {
        let newest = self
            .members
            .iter()
            .filter(|m| m.writable)
            .filter_map(|m| read_superblock(m.member.dev.as_ref()).ok())
            .map(|sb| sb.events)
            .max();
        if let Some(events) = newest.filter(|&e| e > self.events) {
            self.events = events;
        }
    }

    /// Bump events and write every writable superblock. Returns the members whose write failed.
    pub fn commit(&mut self) -> Vec<(Arc<Member>, io::Error)> {
        let utime = format::ironraid_time(self.clock.wall());
        let mut failed = Vec::new();
        // Members whose superblock is behind (a power cut came in the middle of the last
        // commit) first catch up to the current count; only then does the count move on. A cut
        // anywhere in here leaves every member within one event of the freshest, which is what
        // assembly accepts: without this, two cuts in a row inside commits would leave a member
        // that never failed two events behind, and the array could not start.
        for m in self.members.iter_mut().filter(|m| m.writable) {
            if m.sb.events < self.events {
                if let Err(e) = write_member(m, self.events, self.resync_offset, &self.roles, utime)
                {
                    failed.push((m.member.clone(), e));
                }
            }
        }
        self.events += 1;
        let events = self.events;
        if !self.recorders.is_empty() {
            let targets: Vec<Arc<Member>> = self
                .members
                .iter()
                .filter(|m| m.writable && !failed.iter().any(|(f, _)| Arc::ptr_eq(f, &m.member)))
                .map(|m| m.member.clone())
                .collect();
            for r in &self.recorders {
                failed.extend(r.record_events(events, utime, &targets));
            }
        }
        for m in self.members.iter_mut().filter(|m| m.writable) {
            if failed.iter().any(|(f, _)| Arc::ptr_eq(f, &m.member)) {
                continue;
            }
            if let Err(e) = write_member(m, events, self.resync_offset, &self.roles, utime) {
                failed.push((m.member.clone(), e));
            }
        }
        failed
    }

    /// Stop writing this member's superblock and record `role` for it in the table.
    pub fn retire(&mut self, dev_number: u32, role: u16) {
        if let Some(idx) = self.roles.get_mut(dev_number as usize) {
            *idx = role;
        }
        for m in self
            .members
            .iter_mut()
            .filter(|m| m.member.dev_number == dev_number)
        {
            m.writable = false;
        }
    }
}

impl Meta {
    /// Write member `dev_number`'s superblock in commits, or not (another node rebuilds it).
    pub fn set_writable(&mut self, dev_number: u32, writable: bool) {
        for m in self
            .members
            .iter_mut()
            .filter(|m| m.member.dev_number == dev_number)
        {
            m.writable = writable;
        }
    }

    /// A spare takes `role` and starts rebuilding from the beginning.
    pub fn activate_spare(&mut self, dev_number: u32, role: u16) {
        if let Some(r) = self.roles.get_mut(dev_number as usize) {
            *r = role;
        }
        self.set_recovery(dev_number, Some(0));
        for m in self
            .members
            .iter_mut()
            .filter(|m| m.member.dev_number == dev_number)
        {
            m.sb.feature_map &= !format::feature::RECOVERY_BITMAP;
        }
    }

    /// A member comes back into `role` with a bitmap-guided recovery from the beginning
    /// (md's RECOVERY_BITMAP: only chunks whose bit is set are rebuilt, also after a restart).
    pub fn readd(&mut self, dev_number: u32, role: u16) {
        self.activate_spare(dev_number, role);
        for m in self
            .members
            .iter_mut()
            .filter(|m| m.member.dev_number == dev_number)
        {
            m.sb.feature_map |= format::feature::RECOVERY_BITMAP;
        }
    }

    /// Record a member's rebuild progress (sectors), or that it is complete (`None`).
    pub fn set_recovery(&mut self, dev_number: u32, sectors: Option<u64>) {
        for m in self
            .members
            .iter_mut()
            .filter(|m| m.member.dev_number == dev_number)
        {
            match sectors {
                Some(s) => {
                    m.sb.feature_map |= format::feature::RECOVERY_OFFSET;
                    m.sb.recovery_offset = s;
                }
                None => {
                    m.sb.feature_map &=
                        !(format::feature::RECOVERY_OFFSET | format::feature::RECOVERY_BITMAP);
                    m.sb.recovery_offset = 0;
                }
            }
        }
    }
}

/// Flush `m` (everything written to it before is durable first), then write its superblock
/// with the array-wide fields given, FUA.
fn write_member(
    m: &mut MemberSb,
    events: u64,
    resync_offset: u64,
    roles: &[u16],
    utime: u64,
) -> io::Result<()> {
    m.sb.events = events;
    m.sb.resync_offset = resync_offset;
    m.sb.dev_roles = roles.to_vec();
    m.sb.utime = utime;
    // md sets BAD_BLOCKS while the member's log holds entries (mdadm lists none without it).
    if m.member.health.has_bad_blocks() {
        m.sb.feature_map |= format::feature::BAD_BLOCKS;
    } else {
        m.sb.feature_map &= !format::feature::BAD_BLOCKS;
    }
    m.member
        .dev
        .flush()
        .and_then(|()| write_superblock(&m.member, &m.sb))
}

/// Write one member's superblock durably (FUA): in a commit, and before a member set exists
/// (create, assembly). Other writers go through [`crate::members::MemberSet::write_metadata`].
pub(crate) fn write_superblock(member: &Member, sb: &Superblock) -> io::Result<()> {
    metadata::write(member, Metadata::Superblock, &superblock_block(sb), true)
}

/// What a member's superblock write puts on the device.
pub(crate) fn superblock_block(sb: &Superblock) -> AlignedBuf {
    AlignedBuf::copy_from(&sb.encode()[..SB_BYTES])
}

/// Read and decode a member's superblock; errors name the reason, the caller adds the member.
pub fn read_superblock(dev: &dyn device::Device) -> Result<Superblock, String> {
    if dev.len_bytes() < SB_OFFSET_BYTES + SB_BYTES as u64 {
        return Err(format!(
            "too small ({} bytes) to hold an md superblock",
            dev.len_bytes()
        ));
    }
    let mut buf = AlignedBuf::zeroed(SB_BYTES);
    dev.read_at(&mut buf, SB_OFFSET_BYTES)
        .map_err(|e| format!("cannot read superblock: {e}"))?;
    Superblock::decode(&buf).map_err(|e| e.to_string())
}
