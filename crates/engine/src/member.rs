//! Members as the engine sees them: a device plus where its data area starts.

use device::Device;
use parking_lot::RwLock;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// One opened member device of an array.
pub struct Member {
    pub dev: Arc<dyn Device>,
    /// Byte offset of the data area (md's `data_offset` × 512).
    pub data_offset_bytes: u64,
    /// md's permanent slot index into `dev_roles`.
    pub dev_number: u32,
}

impl Member {
    pub fn name(&self) -> &str {
        self.dev.name()
    }
}

/// A RAID role (position in the geometry) and the member currently filling it.
///
/// `faulty` goes false → true under the metadata lock (which also records it in the
/// superblocks) and back to false only when a rebuilt member takes the role. A role without a
/// member is faulty. The I/O path reads both without taking the metadata lock.
pub struct Slot {
    member: RwLock<Option<Arc<Member>>>,
    faulty: AtomicBool,
}

impl Slot {
    pub fn new(member: Option<Arc<Member>>) -> Slot {
        let faulty = AtomicBool::new(member.is_none());
        Slot {
            member: RwLock::new(member),
            faulty,
        }
    }

    /// The member if it may be used for I/O.
    pub fn usable(&self) -> Option<Arc<Member>> {
        if self.faulty.load(Ordering::Acquire) {
            None
        } else {
            self.member.read().clone()
        }
    }

    /// The member filling the role, faulty or not.
    pub fn member(&self) -> Option<Arc<Member>> {
        self.member.read().clone()
    }

    pub fn is_faulty(&self) -> bool {
        self.faulty.load(Ordering::Acquire)
    }

    /// Only the metadata code calls this, with the metadata lock held.
    pub(crate) fn set_faulty(&self) {
        self.faulty.store(true, Ordering::Release);
    }
}
