//! Metadata writes: where the engine's own structures reach a member's device.
//!
//! Client data and parity reach the members through the commit point and the executor (`io`);
//! everything else the engine writes to a member at run time (its superblock, its bad-block
//! log, the pages of the write-intent bitmap and the used-region map replicated on every
//! member, the integrity tables) is written here, by [`MemberSet::write_metadata`] or, inside
//! the member set where a failure must wait until a lock is let go, by [`write`]. One place
//! means one seam: a cluster can order metadata writes across nodes here, and no metadata write
//! can land on client data (asserted: every structure but the integrity tables ends before the
//! data area; the tables' zone lies inside it, past the array's data).
//!
//! `lifecycle/create.rs` writes a new member's structures before any member set exists and
//! does so itself.

use crate::members::{Member, MemberSet};
use std::io;

/// Which structure a metadata write holds, and at which byte of the member's device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Metadata {
    /// md's v1.2 superblock.
    Superblock,
    /// md's bad-block log.
    BadBlockLog { at: u64 },
    /// A page of a structure replicated on every member: the write-intent bitmap, the
    /// used-region map.
    Replicated { at: u64 },
    /// Integrity table blocks (in the zone past the array's data).
    IntegrityTable { at: u64 },
}

impl Metadata {
    fn at(self) -> u64 {
        match self {
            Metadata::Superblock => crate::members::superblocks::SB_OFFSET_BYTES,
            Metadata::BadBlockLog { at }
            | Metadata::Replicated { at }
            | Metadata::IntegrityTable { at } => at,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Metadata::Superblock => "superblock",
            Metadata::BadBlockLog { .. } => "bad-block log",
            Metadata::Replicated { .. } => "replicated metadata",
            Metadata::IntegrityTable { .. } => "integrity table",
        }
    }
}

/// Write metadata `what` (`buf`) to `member`'s device, with FUA if asked. The member set's
/// own device call for metadata; callers outside `members/` use [`MemberSet::write_metadata`].
pub(in crate::members) fn write(
    member: &Member,
    what: Metadata,
    buf: &[u8],
    fua: bool,
) -> io::Result<()> {
    let at = what.at();
    let end = at + buf.len() as u64;
    if matches!(what, Metadata::IntegrityTable { .. }) {
        assert!(
            at >= member.data_offset_bytes,
            "integrity tables at byte {at} of {} start before its data area",
            member.name()
        );
    } else {
        assert!(
            end <= member.data_offset_bytes,
            "{} write at bytes {at}..{end} of {} reaches its data area (byte {})",
            what.name(),
            member.name(),
            member.data_offset_bytes
        );
    }
    member.dev.write_at(buf, at, fua)
}

impl MemberSet {
    /// Write metadata `what` (`buf`, FUA if asked) to `member`: one filling a role, a spare,
    /// the journal's log device, or a device being added. A failure is the caller's to act on,
    /// where it acts today: a member whose metadata cannot be written is failed by the set
    /// once no lock forbids it ([`MemberSet::fail_after_sb_error`], `fail_role`), the
    /// journal fails its log, a device being added is refused.
    pub fn write_metadata(
        &self,
        member: &Member,
        what: Metadata,
        buf: &[u8],
        fua: bool,
    ) -> io::Result<()> {
        write(member, what, buf, fua)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::members::badblocks::Health;
    use std::sync::Arc;

    const DATA_OFFSET: u64 = 1 << 20;

    fn member() -> Member {
        Member {
            dev: Arc::new(device::SimDevice::new("m0", 4 << 20, 1)),
            data_offset_bytes: DATA_OFFSET,
            dev_number: 0,
            health: Health::new(None),
        }
    }

    #[test]
    fn metadata_lands_where_it_belongs() {
        let m = member();
        let page = device::AlignedBuf::zeroed(4096);
        write(&m, Metadata::Superblock, &page, true).expect("superblock");
        let last = DATA_OFFSET - 4096;
        write(&m, Metadata::Replicated { at: last }, &page, true).expect("last page");
        let table = Metadata::IntegrityTable { at: DATA_OFFSET };
        write(&m, table, &page, false).expect("first zone block");
    }

    #[test]
    #[should_panic(expected = "reaches its data area")]
    fn a_replicated_page_never_reaches_the_data_area() {
        let m = member();
        let at = DATA_OFFSET - 2048;
        let _ = write(&m, Metadata::Replicated { at }, &[0u8; 4096], true);
    }

    #[test]
    #[should_panic(expected = "reaches its data area")]
    fn a_bad_block_log_never_reaches_the_data_area() {
        let m = member();
        let _ = write(
            &m,
            Metadata::BadBlockLog { at: DATA_OFFSET },
            &[0u8; 512],
            true,
        );
    }

    #[test]
    #[should_panic(expected = "start before its data area")]
    fn integrity_tables_stay_in_the_data_area() {
        let m = member();
        let at = DATA_OFFSET - 4096;
        let _ = write(&m, Metadata::IntegrityTable { at }, &[0u8; 4096], false);
    }
}
