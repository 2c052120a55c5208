//! Members as the engine sees them: a device plus where its data area starts.

use device::Device;
use parking_lot::RwLock;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

/// One opened member device of an array.
pub struct Member {
    pub dev: Arc<dyn Device>,
    /// Byte offset of the data area (md's `data_offset` × 512).
    pub data_offset_bytes: u64,
    /// md's permanent slot index into `dev_roles`.
    pub dev_number: u32,
    /// Read errors seen and bad blocks recorded (see `badblocks`).
    pub health: crate::members::badblocks::Health,
}

impl Member {
    /// A member whose superblock is `sb`, with the bad blocks its log holds loaded.
    pub(crate) fn from_sb(
        dev: Arc<dyn Device>,
        sb: &format::Superblock,
    ) -> std::io::Result<Member> {
        let member = Member::fresh(dev, sb);
        member.health.load(member.dev.as_ref())?;
        Ok(member)
    }

    /// A member whose superblock is `sb` and whose bad-block log is empty (just written so).
    pub(crate) fn fresh(dev: Arc<dyn Device>, sb: &format::Superblock) -> Member {
        Member {
            dev,
            data_offset_bytes: sb.data_offset * 512,
            dev_number: sb.dev_number,
            health: crate::members::badblocks::Health::new(crate::members::badblocks::BbLog::of(
                sb,
            )),
        }
    }

    pub fn name(&self) -> &str {
        self.dev.name()
    }
}

/// "Every byte of this role's data area is current."
pub const FULLY_IN_SYNC: u64 = u64::MAX;

/// A RAID role (position in the geometry) and the member currently filling it.
///
/// State and transitions (all under the array's metadata lock; the I/O path reads lock-free):
/// * in sync: a member, `faulty` false, `in_sync_bytes` = [`FULLY_IN_SYNC`];
/// * faulty or missing: `faulty` true (a role without a member is faulty);
/// * rebuilding: a member, `faulty` false, `in_sync_bytes` = how far the rebuild got (bytes of
///   the data area). The I/O path reads and writes it only below that point; the rebuild claims
///   each window of stripes before it advances the point, so a write either lands before the
///   window is rebuilt (and the rebuild reads it back from the other members) or after (and goes
///   to the new member as well). Nothing older than a write can overwrite it.
pub struct Slot {
    member: RwLock<Option<Arc<Member>>>,
    faulty: AtomicBool,
    in_sync_bytes: AtomicU64,
    /// The member was re-added with a write-intent bitmap: above `in_sync_bytes` it is
    /// current wherever the bitmap has no bit set, so its rebuild visits only set chunks.
    bitmap_guided: AtomicBool,
}

impl Slot {
    pub fn new(member: Option<Arc<Member>>) -> Slot {
        let faulty = AtomicBool::new(member.is_none());
        Slot {
            member: RwLock::new(member),
            faulty,
            in_sync_bytes: AtomicU64::new(FULLY_IN_SYNC),
            bitmap_guided: AtomicBool::new(false),
        }
    }

    /// Whether this role's rebuild may skip chunks the write-intent bitmap has clear.
    pub fn is_bitmap_guided(&self) -> bool {
        self.bitmap_guided.load(Ordering::Acquire)
    }

    /// Set with the member's install or at assembly (metadata lock held or not yet shared).
    pub(crate) fn set_bitmap_guided(&self, guided: bool) {
        self.bitmap_guided.store(guided, Ordering::Release);
    }

    /// The member if it may be used for I/O at all.
    pub fn usable(&self) -> Option<Arc<Member>> {
        if self.faulty.load(Ordering::Acquire) {
            None
        } else {
            self.member.read().clone()
        }
    }

    /// The member to plan I/O on `offset..offset+len` against: the one filling the role if
    /// that range of it is current. The I/O later runs against this member, never against
    /// whatever fills the role by then ([`Slot::holds`]).
    pub fn in_sync_member(&self, offset_bytes: u64, len_bytes: u64) -> Option<Arc<Member>> {
        let member = self.member.read().clone()?;
        self.in_sync(offset_bytes, len_bytes).then_some(member)
    }

    /// Does the role still hold `member`, not faulty? An I/O planned against a member that has
    /// failed or left its role since must not run against its successor.
    pub fn holds(&self, member: &Arc<Member>) -> bool {
        !self.is_faulty()
            && self
                .member
                .read()
                .as_ref()
                .is_some_and(|m| Arc::ptr_eq(m, member))
    }

    /// The member filling the role, faulty or not.
    pub fn member(&self) -> Option<Arc<Member>> {
        self.member.read().clone()
    }

    pub fn is_faulty(&self) -> bool {
        self.faulty.load(Ordering::Acquire)
    }

    /// May bytes `offset..offset+len` of this role's data area be read or written?
    pub fn in_sync(&self, offset_bytes: u64, len_bytes: u64) -> bool {
        !self.is_faulty() && offset_bytes + len_bytes <= self.in_sync_bytes.load(Ordering::Acquire)
    }

    /// Fully in sync (counts as present for the level's tolerance).
    pub fn is_complete(&self) -> bool {
        !self.is_faulty() && self.in_sync_bytes.load(Ordering::Acquire) == FULLY_IN_SYNC
    }

    pub fn in_sync_bytes(&self) -> u64 {
        self.in_sync_bytes.load(Ordering::Acquire)
    }

    /// Only the metadata code calls this, with the metadata lock held.
    pub(crate) fn set_faulty(&self) {
        self.faulty.store(true, Ordering::Release);
    }

    /// A new member takes the role, current up to `in_sync_bytes` (metadata lock held).
    pub(crate) fn install(&self, member: Arc<Member>, in_sync_bytes: u64) {
        self.bitmap_guided.store(false, Ordering::Release);
        *self.member.write() = Some(member);
        self.in_sync_bytes.store(in_sync_bytes, Ordering::Release);
        self.faulty.store(false, Ordering::Release);
    }

    /// Drop a faulty member from the role (metadata lock held).
    pub(crate) fn clear(&self) -> Option<Arc<Member>> {
        assert!(self.is_faulty(), "only a faulty member may leave its role");
        self.member.write().take()
    }

    /// The rebuild reached `bytes` (it holds the claim on everything below).
    pub(crate) fn advance(&self, bytes: u64) {
        self.in_sync_bytes.store(bytes, Ordering::Release);
    }
}
