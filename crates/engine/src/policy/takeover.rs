//! md-cluster's recovery of a dead node's bitmap slot (`recover_slot` → `md_bitmap_copy_from_slot`
//! → `recovery_cp`), as one engine call: the chunks the dead node had dirty become this node's,
//! the dead slot is cleared, and a resync of exactly those chunks is requested. Also its
//! `gather_bitmaps` before a bitmap-guided re-add (the other slots copied, not cleared).
//!
//! # What is durable at each step (DESIGN.md's ordering rules)
//! 1. Read the dead slot: the union of its copies on the members in sync. Nothing written.
//! 2. Adopt: the chunks' bits are set in this node's slot on every member (written and
//!    flushed), then the superblocks record "active" (resync checkpoint 0). From here a crash
//!    loses nothing: an assembly after it finds the superblock dirty and treats every set bit
//!    of this slot as needing resync. A crash between the bits and the superblock finds the
//!    dead slot still intact, and the takeover run again adopts it again.
//! 3. Clear the dead slot on every member and flush. Its bits now live only in this node's
//!    slot, which step 2 made durable first; a crash part-way leaves some members' copies set,
//!    which a second takeover re-adopts (bits are idempotent).
//! 4. Request the resync from the lowest adopted chunk. The walker visits only chunks that need
//!    it, and their bits clear only after it passed them.

use crate::error::{EngineError, Result};
use crate::members::MemberSet;
use crate::policy::bitmap::WriteIntentBitmap;
use crate::policy::used::UsedRegions;
use device::AlignedBuf;
use format::{bit_is_set, BitmapSuper, BITMAP_HEADER_BYTES};
use std::sync::Arc;

/// What a takeover found and did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TakeoverReport {
    /// The slot taken over.
    pub slot: u32,
    /// Chunks that slot had dirty, now this node's to resync.
    pub adopted_chunks: u64,
    /// Where the requested resync starts (sync coordinates, bytes); `None`: nothing to do.
    pub resync_from_bytes: Option<u64>,
}

/// The gone node's used-region map becomes part of this node's, whose commits write it
/// whole onto every member added later (nobody writes the gone slot's any more). The gone
/// slot keeps its bits: until this is durable, walks read them there.
pub(crate) fn adopt_used_map(
    used: Option<&UsedRegions>,
    members: &MemberSet,
    name: &str,
    slot: u32,
) {
    let Some(used) = used else {
        return;
    };
    let Some(nodes) = used.nodes() else {
        return;
    };
    match nodes.read_slot(members, slot as usize, 0..used.regions()) {
        Some(bits) => match used.adopt(members, &bits) {
            Ok(n) => {
                tracing::info!(array = %name, slot, regions = n, "adopted a gone node's used regions")
            }
            Err(e) => {
                tracing::warn!(array = %name, slot, "cannot adopt a gone node's used regions: {e}")
            }
        },
        None => {
            tracing::warn!(array = %name, slot, "cannot read a gone node's used-region map")
        }
    }
}

/// md-cluster's `gather_bitmaps`, before a bitmap-guided re-add: every chunk another
/// node's slot has set is set in this node's slot too, durably (the other slots keep
/// theirs). The recovery skips chunks this slot has clear, and must not skip one another
/// node wrote while the member was out (a node that stopped while the array was degraded
/// left its bits set for exactly this). An array with one bitmap has nothing to gather.
pub(crate) fn gather_other_slots(
    bitmap: Option<&Arc<WriteIntentBitmap>>,
    members: &MemberSet,
    name: &str,
) -> Result<()> {
    let Some(bm) = bitmap.filter(|b| b.header().is_clustered()) else {
        return Ok(());
    };
    for slot in (0..bm.header().nodes).filter(|&s| s != bm.slot()) {
        let (header, bits) = read_slot_union(Some(&**bm), members, name, slot)?;
        let dirty: Vec<u64> = (0..header.chunks())
            .filter(|&c| bit_is_set(&bits, c))
            .collect();
        bm.adopt(members, &dirty, false)?;
    }
    Ok(())
}

/// Slot `slot`'s newest header and the union of its bits over the members in sync. A copy
/// marked stale counts as all ones. Events are not compared: a dead node's slot lags the
/// superblocks the survivors go on writing, and that makes it no less exact.
pub(crate) fn read_slot_union(
    bitmap: Option<&WriteIntentBitmap>,
    members: &MemberSet,
    name: &str,
    slot: u32,
) -> Result<(BitmapSuper, Vec<u8>)> {
    let own = bitmap
        .map(|b| b.header())
        .filter(BitmapSuper::is_clustered)
        .ok_or_else(|| {
            EngineError::Unsupported(format!(
                "array '{}' has no per-node bitmaps (create --nodes)",
                name
            ))
        })?;
    if slot >= own.nodes {
        return Err(EngineError::InvalidArgument(format!(
            "slot {slot}: the bitmap has {} node slots",
            own.nodes
        )));
    }
    let mut newest: Option<BitmapSuper> = None;
    let mut bits: Vec<u8> = Vec::new();
    let mut problems = Vec::new();
    for m in members.role_members() {
        match crate::policy::bitmap::read_bitmap_slot(m.dev.as_ref(), slot) {
            Ok((sb, _)) if sb.uuid != own.uuid || sb.chunksize != own.chunksize => {
                problems.push(format!("{}: slot {slot} belongs elsewhere", m.name()));
            }
            Ok((sb, b)) => {
                bits.resize(bits.len().max(b.len()), 0);
                let all = sb.is_stale();
                for (dst, src) in bits.iter_mut().zip(&b) {
                    *dst |= if all { 0xff } else { *src };
                }
                if newest.as_ref().is_none_or(|h| sb.events > h.events) {
                    newest = Some(sb);
                }
            }
            Err(e) => problems.push(format!("{}: {e}", m.name())),
        }
    }
    let header = newest.ok_or_else(|| EngineError::Assemble {
        member: format!("array '{}'", name),
        reason: format!(
            "no readable copy of bitmap slot {slot}: {}",
            problems.join("; ")
        ),
    })?;
    Ok((header, bits))
}

/// Zero slot `slot`'s bits on every member in a role (its header kept, state cleared).
pub(crate) fn clear_slot(members: &MemberSet, header: &BitmapSuper, slot: u32) -> Result<()> {
    let mut sb = header.clone();
    sb.state = 0;
    let mut buf = AlignedBuf::zeroed(sb.bytes_on_disk() as usize);
    buf[..BITMAP_HEADER_BYTES].copy_from_slice(&sb.encode());
    let at = crate::policy::bitmap::slot_byte_offset(&sb, slot);
    for m in members.role_members() {
        m.dev
            .write_at(&buf, at, false)
            .and_then(|()| m.dev.flush())
            .map_err(|e| EngineError::Assemble {
                member: m.name().into(),
                reason: format!("cannot clear bitmap slot {slot}: {e}"),
            })?;
    }
    Ok(())
}
