//! What the array reports about itself (`detail`, `--json`, metrics): the snapshot types and
//! how the parts fill them in.

use crate::background::SyncStatus;
use crate::error::EngineError;
use crate::io::bufpool::PoolUsage;
use crate::personality::parts::Parts;
use layout::Level;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// What `status` reports about one member.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemberStatus {
    pub name: String,
    pub role: Option<usize>,
    pub state: MemberState,
    pub dev_number: u32,
    /// Blocks found unreadable this run, corrected or recorded (see `badblocks`).
    pub read_errors: u64,
    /// Read errors corrected by rebuilding the block and rewriting it.
    pub read_errors_corrected: u64,
    /// Sectors recorded in the member's bad-block log.
    pub bad_sectors: u64,
    /// Reads this run whose blocks failed their integrity records.
    pub checksum_errors: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemberState {
    InSync,
    Rebuilding,
    Faulty,
    Spare,
    /// The raid5-cache log device.
    Journal,
}

/// A snapshot of the array's state.
#[derive(Clone, Debug)]
pub struct ArrayStatus {
    pub name: String,
    pub uuid: [u8; 16],
    pub level: Level,
    pub layout: Option<String>,
    pub chunk_bytes: u64,
    pub size_bytes: u64,
    pub raid_disks: usize,
    pub events: u64,
    pub members: Vec<MemberStatus>,
    /// Roles without a complete member (faulty, missing or rebuilding).
    pub missing_roles: Vec<usize>,
    pub dirty: bool,
    pub consistency_policy: &'static str,
    pub failed: bool,
    pub read_only: bool,
    pub sync: crate::background::SyncStatus,
    pub bitmap: Option<BitmapStatus>,
    pub used_regions: Option<UsedStatus>,
    pub journal: Option<crate::policy::journal::JournalStatus>,
    pub integrity: Option<crate::integrity::IntegrityStatus>,
    /// Guided resync (arrays with the `guided` policy).
    pub guidance: Option<crate::policy::guided::GuidanceStatus>,
    /// Why writes are refused at the moment (read-only assembly, journal lost, …).
    pub read_only_reason: Option<String>,
    /// Parity rows a crash may have torn, not resynced yet, while degraded (bitmap policies).
    pub torn_rows_exposed: u64,
    /// Degraded reads refused because their block would be rebuilt from such a row.
    pub torn_reads_refused: u64,
    /// Client reads sent from the members' page caches without a copy (levels without parity or integrity).
    pub spliced_reads: u64,
    /// Writes failing because a member's backing store is full (None: they go through).
    pub no_space: Option<crate::io::no_space::NoSpaceStatus>,
    pub memory: MemoryStatus,
}

/// What the array's own memory holds, by named limit (the NBD server's are the daemon's).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemoryStatus {
    /// Client data placed in stripes and not yet written (`ArrayConfig::stripe_cache_bytes`).
    pub stripe_cache: PoolUsage,
    /// Free stripe buffers kept for reuse (as much as the stripe cache at most).
    pub buffer_pool: PoolUsage,
}

/// The used-region map, for status.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UsedStatus {
    /// Bytes of each member one region covers.
    pub region_bytes: u64,
    pub regions: u64,
    /// Regions that may hold data; the rest are zero and skipped by resync, check and rebuild.
    pub used: u64,
}

/// The write-intent bitmap, for status (mdstat's `bitmap:` line, `mdadm -X`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BitmapStatus {
    /// Bytes of each member (of the array for RAID10) one bit covers.
    pub chunk_bytes: u64,
    pub chunks: u64,
    /// Bits set: chunks written recently, or still to resync or recover.
    pub dirty_chunks: u64,
    /// Of those, chunks still owed a resync (a crash's, or a gone cluster node's taken over).
    pub needed_chunks: u64,
    pub events_cleared: u64,
}

impl Parts {
    /// The snapshot `Array::status` reports; `sync` was taken before this (the sync state is
    /// never taken while `meta` is held), `unsynced`: a resync is owed.
    pub(crate) fn status(&self, uuid: [u8; 16], sync: SyncStatus, unsynced: bool) -> ArrayStatus {
        let meta = self.members.meta.lock();
        let members = meta
            .members
            .iter()
            .map(|m| self.member_status(&m.member))
            .collect();
        let g = &self.geometry;
        ArrayStatus {
            name: self.name.clone(),
            uuid,
            level: g.level(),
            layout: layout::layout_name(g.level(), g.spec().layout),
            chunk_bytes: g.chunk_sectors() * 512,
            size_bytes: self.size_bytes(),
            raid_disks: g.raid_disks(),
            events: meta.events,
            members,
            missing_roles: (0..self.members.slots.len())
                .filter(|&r| !self.members.slots[r].is_complete())
                .collect(),
            dirty: self.members.is_active() || unsynced,
            consistency_policy: self.policy.name(),
            failed: self.is_failed(),
            read_only: self.config.read_only || self.policy.failed().is_some(),
            read_only_reason: self.check_writable().err().map(|e| match e {
                EngineError::ReadOnly { reason, .. } => reason,
                e => e.to_string(),
            }),
            journal: self.policy.journal().map(|j| j.status()),
            integrity: self.integrity.as_ref().map(|i| i.status()),
            guidance: self.policy.guidance().map(|g| g.status(self.clock.now())),
            sync,
            bitmap: self.policy.bitmap().map(|b| BitmapStatus {
                chunk_bytes: b.chunk_bytes(),
                chunks: b.chunks(),
                dirty_chunks: b.dirty_chunks(),
                needed_chunks: b.needed_chunks(),
                events_cleared: b.events_cleared(),
            }),
            // Rows a crash may have left mid-write and that are not consistent yet, while the
            // parity array is degraded: a block rebuilt from one of them may mix old and new
            // writes (md's write hole). Only a policy that knows which rows those are (the
            // bitmap's dirty chunks, under `bitmap` and `guided`) can count them; the plain
            // policy cannot tell a torn row from a sound one and serves reconstructions as md
            // does.
            torn_rows_exposed: crate::personality::raid456::exposed_rows(
                &self.geometry,
                &self.members.slots,
                self.policy.torn_bytes(),
                self.walker.resync_owed(),
            ),
            torn_reads_refused: self.torn_reads_refused.load(Ordering::Relaxed),
            spliced_reads: self.spliced_reads.load(Ordering::Relaxed),
            no_space: self.commit.no_space.status(),
            memory: MemoryStatus {
                stripe_cache: self.stripes.usage(),
                buffer_pool: self.bufs.usage(),
            },
            used_regions: self.used.as_ref().map(|u| UsedStatus {
                region_bytes: u.region_bytes(),
                regions: u.regions(),
                used: u.used_regions(),
            }),
        }
    }

    fn member_status(&self, member: &Arc<crate::members::Member>) -> MemberStatus {
        let role = self.members.role_of_member(member.dev_number);
        let state = match role {
            Some(r) if self.members.slots[r].is_complete() => MemberState::InSync,
            Some(r) if !self.members.slots[r].is_faulty() => MemberState::Rebuilding,
            Some(_) => MemberState::Faulty,
            None if self
                .members
                .spares
                .lock()
                .iter()
                .any(|s| s.dev_number == member.dev_number) =>
            {
                MemberState::Spare
            }
            None if self
                .policy
                .journal()
                .is_some_and(|j| Arc::ptr_eq(j.member(), member)) =>
            {
                match self.policy.journal().and_then(|j| j.failed()) {
                    Some(_) => MemberState::Faulty,
                    None => MemberState::Journal,
                }
            }
            None => MemberState::Faulty,
        };
        MemberStatus {
            name: member.name().to_string(),
            role: role.filter(|&r| !self.members.slots[r].is_faulty()),
            state,
            dev_number: member.dev_number,
            read_errors: member.health.read_errors(),
            read_errors_corrected: member.health.corrected(),
            bad_sectors: member.health.bad_sectors(),
            checksum_errors: member.health.checksum_errors(),
        }
    }
}
