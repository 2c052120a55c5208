//! Converting a clustered array back to one host's (mdadm's `--grow --bitmap=internal` after
//! `--bitmap=none`, done here on stopped members in one step).
//!
//! Every node's write-intent bits must survive: a chunk a dead node left dirty is still owed a
//! resync. So slot 0 becomes the union of every slot's bits, under a version 4 header (no
//! slots, no cluster name) whose event count is the one the superblocks get next, and only then
//! do the superblocks lose the CLUSTERED feature (events + 1). A cut between the two steps
//! leaves a clustered superblock over a plain bitmap: running the conversion again finishes it
//! (a plain bitmap is read as its one slot). The superblocks record the resync owed from the
//! first dirty chunk on, so the next start resyncs the union's chunks (and only those). The
//! nodes' used-region maps become one the same way, written before the superblocks with the
//! events and utime they get, so that the plain array trusts it.

use crate::clock::Clock;
use crate::error::{EngineError, Result};
use crate::members::{read_superblock, superblock_block, SB_OFFSET_BYTES};
use crate::policy::bitmap::{read_bitmap_slot, BITMAP_BYTE_OFFSET};
use device::{AlignedBuf, Device};
use format::{feature, BitmapSuper, Superblock, BITMAP_HEADER_BYTES};
use std::sync::Arc;

/// What [`leave_cluster`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaveReport {
    /// Node slots whose bits were gathered into the one bitmap.
    pub slots: u32,
    /// Chunks dirty in any slot: the next start resyncs them.
    pub dirty_chunks: u64,
    /// The superblocks' event count now.
    pub events: u64,
}

/// Turn the clustered array on `devs` (every member it has, stopped everywhere) into a plain
/// one with an internal bitmap.
/// Why the members `devs` with superblocks `sbs` cannot be converted, if they cannot; else the
/// newest superblock.
fn convertible<'a>(devs: &[Arc<dyn Device>], sbs: &'a [Superblock]) -> Result<&'a Superblock> {
    let invalid = |dev: &dyn Device, why: String| {
        EngineError::InvalidArgument(format!("{}: {why}", dev.name()))
    };
    let first = sbs
        .first()
        .ok_or_else(|| EngineError::InvalidArgument("no members given".into()))?;
    for (d, sb) in devs.iter().zip(sbs) {
        if sb.set_uuid != first.set_uuid {
            return Err(invalid(d.as_ref(), "a member of another array".into()));
        }
        if sb.feature_map & feature::BITMAP_OFFSET == 0 {
            return Err(invalid(
                d.as_ref(),
                "no internal write-intent bitmap".into(),
            ));
        }
    }
    if sbs
        .iter()
        .all(|sb| sb.feature_map & feature::CLUSTERED == 0)
    {
        return Err(EngineError::InvalidArgument(format!(
            "array '{}' is not clustered",
            first.set_name
        )));
    }
    let newest = sbs
        .iter()
        .max_by_key(|sb| sb.events)
        .expect("at least one member");
    for (d, sb) in devs.iter().zip(sbs) {
        // Given the new event count, a member that failed or missed updates would look as
        // current as the others: it stays out (it can be added back after).
        let faulty = newest.dev_roles.get(sb.dev_number as usize) == Some(&format::ROLE_FAULTY);
        if faulty || sb.events + 1 < newest.events {
            return Err(invalid(
                d.as_ref(),
                format!(
                    "behind the other members (events {} of {}{}): leave it out, add it back after",
                    sb.events,
                    newest.events,
                    if faulty { ", recorded faulty" } else { "" }
                ),
            ));
        }
    }
    Ok(newest)
}

pub fn leave_cluster(devs: &[Arc<dyn Device>]) -> Result<LeaveReport> {
    let sbs = devs
        .iter()
        .map(|d| {
            read_superblock(d.as_ref())
                .map_err(|e| EngineError::InvalidArgument(format!("{}: {e}", d.name())))
        })
        .collect::<Result<Vec<Superblock>>>()?;
    let newest = convertible(devs, &sbs)?;
    let events = newest.events + 1;
    let (header, union, slots) = gather_slots(devs)?;
    let plain = BitmapSuper {
        version: format::BITMAP_VERSION,
        nodes: 0,
        cluster_name: [0; format::CLUSTER_NAME_BYTES],
        events,
        ..header
    };
    let mut image = AlignedBuf::zeroed(plain.bytes_on_disk() as usize);
    image[..BITMAP_HEADER_BYTES].copy_from_slice(&plain.encode());
    let n = union.len().min(image.len() - BITMAP_HEADER_BYTES);
    image[BITMAP_HEADER_BYTES..BITMAP_HEADER_BYTES + n].copy_from_slice(&union[..n]);
    for d in devs {
        d.write_at(&image, BITMAP_BYTE_OFFSET, false)
            .and_then(|()| d.flush())
            .map_err(|e| member_io(d.as_ref(), "write the bitmap", e))?;
    }
    // The plain array's one used-region map: every node's regions, written with the events
    // and utime the superblocks get next (so that it is trusted).
    let utime = format::ironraid_time(crate::clock::SystemClock::default().wall());
    if let Some((at, image)) = plain_used_map(devs, newest, slots as usize, events, utime) {
        for d in devs {
            d.write_at(&image, at, false)
                .and_then(|()| d.flush())
                .map_err(|e| member_io(d.as_ref(), "write the used-region map", e))?;
        }
    }
    // The superblocks say a resync is owed from the first dirty chunk on (a clean array's
    // start would leave the bits to be cleared, as md's does): it visits the dirty chunks only.
    let first_dirty = (0..plain.chunks()).find(|&c| format::bit_is_set(&union, c));
    for (d, sb) in devs.iter().zip(sbs) {
        let owed = first_dirty.map(|c| c * u64::from(plain.chunksize) / 512);
        let sb = Superblock {
            feature_map: sb.feature_map & !feature::CLUSTERED,
            events,
            utime,
            resync_offset: owed.map_or(sb.resync_offset, |o| o.min(sb.resync_offset)),
            ..sb
        };
        d.write_at(&superblock_block(&sb), SB_OFFSET_BYTES, true)
            .map_err(|e| member_io(d.as_ref(), "write the superblock", e))?;
    }
    Ok(LeaveReport {
        slots,
        dirty_chunks: format::count_dirty(&union, plain.chunks()),
        events,
    })
}

/// The union of every node slot's used-region map on `devs` as one plain map (where on the
/// members, and its bytes), its header at `events` and `utime`. Untrusted maps (no slot's
/// header matches the newest superblock) give every region used. None if the members carry no
/// map per slot: the plain array then finds its map behind the superblocks, all used.
fn plain_used_map(
    devs: &[Arc<dyn Device>],
    newest: &Superblock,
    slots: usize,
    events: u64,
    utime: u64,
) -> Option<(u64, AlignedBuf)> {
    let base = format::used_map_offset_sectors(newest) * 512;
    let mut header: Option<format::UsedMapHeader> = None;
    let mut fresh = false;
    let mut union: Vec<u8> = Vec::new();
    for slot in 0..slots {
        for d in devs {
            let map_bytes = header
                .as_ref()
                .map_or(0, format::UsedMapHeader::bytes_on_disk);
            let at = base + format::node_map_offset(map_bytes, slot);
            let (h, bits) = crate::policy::used::read_map(d.as_ref(), at).ok()?;
            let known = header.as_ref().map_or(h.region_bytes, |k| k.region_bytes);
            if h.uuid != newest.set_uuid || h.region_bytes != known {
                return None;
            }
            fresh |= h.events == newest.events
                && h.sb_utime == newest.utime
                && !format::written_by_md(newest.utime);
            union.resize(union.len().max(bits.len()), 0);
            for (u, b) in union.iter_mut().zip(&bits) {
                *u |= b;
            }
            header.get_or_insert(h);
        }
    }
    let h = format::UsedMapHeader {
        events,
        sb_utime: utime,
        ..header?
    };
    if !fresh {
        union.fill(0xff);
    }
    let mut image = AlignedBuf::zeroed(h.bytes_on_disk() as usize);
    image[..format::USED_MAP_HEADER_BYTES].copy_from_slice(&h.encode());
    let n = union.len().min(image.len() - format::USED_MAP_HEADER_BYTES);
    image[format::USED_MAP_HEADER_BYTES..format::USED_MAP_HEADER_BYTES + n]
        .copy_from_slice(&union[..n]);
    Some((base, image))
}

/// Slot 0's header and the union of every slot's bits over every member (a chunk dirty in any
/// copy of any slot is dirty), and how many slots there were.
fn gather_slots(devs: &[Arc<dyn Device>]) -> Result<(BitmapSuper, Vec<u8>, u32)> {
    let mut header: Option<BitmapSuper> = None;
    let mut union: Vec<u8> = Vec::new();
    for d in devs {
        let read = |slot| {
            read_bitmap_slot(d.as_ref(), slot)
                .map_err(|e| EngineError::InvalidArgument(format!("{}: {e}", d.name())))
        };
        let (first, _) = read(0)?;
        for slot in 0..first.slots() {
            let (_, bits) = read(slot)?;
            if union.len() < bits.len() {
                union.resize(bits.len(), 0);
            }
            for (u, b) in union.iter_mut().zip(bits) {
                *u |= b;
            }
        }
        if let Some(h) = &header {
            if (h.uuid, h.sync_size, h.chunksize) != (first.uuid, first.sync_size, first.chunksize)
            {
                return Err(EngineError::InvalidArgument(format!(
                    "{}: its bitmap disagrees with the other members' (array, size or chunk)",
                    d.name()
                )));
            }
        }
        header.get_or_insert(first);
    }
    let header = header.ok_or_else(|| EngineError::InvalidArgument("no members given".into()))?;
    let slots = header.slots();
    Ok((header, union, slots))
}

fn member_io(dev: &dyn Device, op: &'static str, e: std::io::Error) -> EngineError {
    EngineError::MemberIo {
        member: dev.name().into(),
        op,
        offset_bytes: 0,
        source: e,
    }
}
