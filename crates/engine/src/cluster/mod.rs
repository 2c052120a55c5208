//! The cluster seam: what a node of a multi-host array must agree on with the others before it
//! acts, shaped after md's `struct md_cluster_operations`.
//!
//! The engine calls a [`Coordinator`] at the points where md-cluster talks to the DLM:
//! * every superblock update is bracketed by [`Coordinator::metadata_update_start`] and
//!   [`Coordinator::metadata_update_finish`] (md's token lock: one node changes the array's
//!   metadata at a time, and the others re-read it after);
//! * a client write waits while [`Coordinator::area_resyncing`] says another node is resyncing
//!   or recovering its range (md's raid1 `area_resyncing` wait);
//! * the background walker reports its windows ([`Coordinator::resync_info_update`]) and its end
//!   ([`Coordinator::resync_finish`]), so that other nodes know what to wait for;
//! * adding and removing a member is put to a vote first ([`Coordinator::add_new_disk`],
//!   [`Coordinator::remove_disk`]);
//! * [`Coordinator::slot_number`] names this node's write-intent bitmap slot;
//! * every group of member writes first asks [`Coordinator::write_refusal`] (a node that lost
//!   its membership must not write: the others may be taking its regions over), and every
//!   client read [`Coordinator::read_refusal`] (nor read: the others may have failed, replaced
//!   or rewritten members since, which it no longer hears of).
//!
//! [`Local`] is a single host: it always holds the token, nobody else resyncs, every vote
//! passes, and its bitmap slot is 0. That is exactly the engine's behaviour without a cluster.
//! Range locks that a cluster must take on every node go through `lock::RangeLock`.

use crate::error::Result;
use std::fmt::Debug;

use crate::error::EngineError;
use std::ops::Range;

/// What a background window does to its range, as other nodes must know it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SyncKind {
    /// Making redundancy consistent again (resync, repair).
    Resync,
    /// Filling member `dev_number`, which is rebuilding role `role`: the other nodes write it
    /// below the window from now on.
    Recovery { dev_number: u32, role: usize },
}

/// A node's agreement with the other nodes of its array. Every method may block while the
/// cluster answers; none is called with an engine lock held except the metadata brackets and
/// the member votes, which run under the metadata lock (md holds its reconfig mutex there).
/// Ranges are md's sync coordinates: per-member bytes for parity levels, array bytes for
/// mirrors.
pub trait Coordinator: Send + Sync + Debug {
    /// This node's write-intent bitmap slot (md-cluster: one bitmap per node).
    fn slot_number(&self) -> usize;
    /// Why this node may not start member writes now (None: it may): a node whose membership
    /// is not confirmed could be declared dead by the others, who then take its regions over.
    fn write_refusal(&self) -> Option<String>;
    /// Why this node may not serve a client read now (None: it may). A node the others may
    /// count gone no longer hears of their member failures, re-adds and rebuilds: a member
    /// it still counts in sync may hold older bytes than they acknowledged since.
    fn read_refusal(&self) -> Option<String> {
        None
    }
    /// Before a superblock update: take the cluster-wide right to change metadata.
    fn metadata_update_start(&self);
    /// Do other nodes write this array's superblocks too? Then each update first re-reads
    /// the event count on the members (md-cluster re-reads the superblock), so that counts
    /// never go back and no member falls behind another's.
    fn shares_metadata(&self) -> bool;
    /// A member was recorded faulty in the superblocks here: return once every other node
    /// has stopped using it too. Writes that skipped it are acknowledged only after this
    /// (md-cluster: no degraded write before every node acknowledged the failure).
    fn member_failed(&self, dev_number: u32);
    /// Why this node may not run background windows (resync, recovery, check) now (None:
    /// it may). A cluster runs them on one node, its coordinator.
    fn sync_refusal(&self) -> Option<String>;
    /// May this node rebuild members now? The other nodes do not know of a member being
    /// rebuilt (they would skip it where it is already rebuilt), so a cluster rebuilds only
    /// while one node runs the array. Asked before each recovery window.
    fn recovery_allowed(&self) -> bool;
    /// A recovery walk is about to start: false if it may not after all (another node came).
    fn recovery_starts(&self) -> bool;
    /// The recovery walk stopped and its progress is durable in the superblocks: nodes that
    /// waited for it may start.
    fn recovery_paused(&self);
    /// After a superblock update reached every member: let the other nodes re-read it.
    fn metadata_update_finish(&self, events: u64);
    /// Is another node resyncing or recovering part of `range` (per-member bytes, md's sync
    /// coordinates)? A client write there waits until it is not.
    fn area_resyncing(&self, range: Range<u64>) -> bool;
    /// This node's background walk is about to work on `range`: return once no other node
    /// can write into it until the next update or [`Coordinator::resync_finish`].
    fn resync_info_update(&self, kind: SyncKind, range: Range<u64>);
    /// This node's background walk ended (done, stopped or failed).
    fn resync_finish(&self);
    /// Parity levels with several writers (beyond md-cluster): return once this node alone may
    /// write the stripes holding per-member bytes `range`, and read them degraded, until
    /// [`Coordinator::release_stripes`] of the same range. Two nodes writing parts of one
    /// stripe would both rewrite its parity from what each read; a degraded read reconstructs
    /// from parity another node may be rewriting. Err: why this node may not (fenced). Alone,
    /// every stripe is this node's.
    fn own_stripes(&self, range: Range<u64>) -> std::result::Result<(), String> {
        let _ = range;
        Ok(())
    }
    /// The stripes [`Coordinator::own_stripes`] gave are not used by this caller any more
    /// (the node may hand them to another).
    fn release_stripes(&self, range: Range<u64>) {
        let _ = range;
    }
    /// Does no other node run the array, nor can one start to before this node's next
    /// question? Only then may a member come back with a bitmap-guided recovery (md's
    /// re-add): the chunks other nodes write meanwhile are dirty in their own bitmap slots,
    /// which this node's recovery does not read.
    fn alone(&self) -> bool {
        true
    }
    /// May a member with this device UUID join the array? An error says why not.
    fn add_new_disk(&self, device_uuid: [u8; 16]) -> Result<()>;
    /// May the member with this device number leave the array?
    fn remove_disk(&self, dev_number: u32) -> Result<()>;
}

/// One host on its own.
#[derive(Debug, Default)]
pub struct Local;

impl Coordinator for Local {
    fn slot_number(&self) -> usize {
        0
    }

    fn write_refusal(&self) -> Option<String> {
        None
    }

    fn metadata_update_start(&self) {}

    fn shares_metadata(&self) -> bool {
        false
    }

    fn member_failed(&self, _dev_number: u32) {}

    fn sync_refusal(&self) -> Option<String> {
        None
    }

    fn recovery_allowed(&self) -> bool {
        true
    }

    fn recovery_starts(&self) -> bool {
        true
    }

    fn recovery_paused(&self) {}

    fn metadata_update_finish(&self, _events: u64) {}

    fn area_resyncing(&self, _range: Range<u64>) -> bool {
        false
    }

    fn resync_info_update(&self, _kind: SyncKind, _range: Range<u64>) {}

    fn resync_finish(&self) {}

    fn add_new_disk(&self, _device_uuid: [u8; 16]) -> Result<()> {
        Ok(())
    }

    fn remove_disk(&self, _dev_number: u32) -> Result<()> {
        Ok(())
    }
}

/// Stripes this node may write (and read degraded) while the guard lives: see
/// [`Coordinator::own_stripes`]. Taken before any stripe claim or row announcement of the
/// range, never while another is held, so that a node handing stripes over never waits for a
/// writer that waits for it.
pub(crate) struct OwnedStripes<'a> {
    coordinator: &'a dyn Coordinator,
    range: Range<u64>,
}

impl<'a> OwnedStripes<'a> {
    /// Stripes (parity rows) `first..end`, each `chunk_bytes` of every member.
    pub(crate) fn take(
        coordinator: &'a dyn Coordinator,
        first: u64,
        end: u64,
        chunk_bytes: u64,
    ) -> std::result::Result<OwnedStripes<'a>, String> {
        assert!(first < end, "owning no stripes ({first}..{end})");
        let range = first * chunk_bytes..end * chunk_bytes;
        coordinator.own_stripes(range.clone())?;
        Ok(OwnedStripes { coordinator, range })
    }

    /// [`OwnedStripes::take`], its refusal as the engine's error for array `array`.
    pub(crate) fn take_or_refuse(
        coordinator: &'a dyn Coordinator,
        array: &str,
        first: u64,
        end: u64,
        chunk_bytes: u64,
    ) -> Result<OwnedStripes<'a>> {
        Self::take(coordinator, first, end, chunk_bytes).map_err(|reason| {
            EngineError::Unavailable {
                array: array.to_string(),
                reason,
            }
        })
    }
}

impl Drop for OwnedStripes<'_> {
    fn drop(&mut self) {
        self.coordinator.release_stripes(self.range.clone());
    }
}
