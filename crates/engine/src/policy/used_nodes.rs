//! The used-region maps of a clustered array: one per node slot (the seed's "extents ever
//! written", kept per node). A node sets bits in its own slot's map only, so no two nodes ever
//! write one page of a map; a region may hold data if any slot's map has its bit set. No node
//! releases regions while the array is clustered (a trim leaves the maps as they are), so bits
//! only go from clear to set, and what a node once read of another slot's map stays true.
//!
//! Who reads what:
//! * a node's writes consult and extend its own map only (`UsedRegions::ensure_used`, under
//!   the range lock the write holds: the bit is durable before the write goes out);
//! * client reads never answer from the maps: another node may have written a region this
//!   node's map has clear (the members are zero wherever no node wrote anyway);
//! * the node running a background walk (the cluster's coordinator) reads the other slots'
//!   maps from every member in sync once every node holds the walk's window ([`NodeMaps::read_others`]):
//!   every write that went out before had its bit made durable first, and none goes out into
//!   the window until it is released;
//! * taking over a gone node's bitmap slot also adopts its map into this node's own
//!   ([`NodeMaps::read_slot`]), whose superblock commits write it whole onto members added
//!   later; a node that learns of a member rebuilt elsewhere writes its own map onto it.
//!
//! Trust at assembly ([`load`]): the maps count only if some slot's header carries exactly the
//! superblocks' events and utime (the node that wrote the superblocks last wrote its map's
//! header just before). Otherwise (md or a run without the maps wrote the superblocks since;
//! a cut inside a commit; another node's commit in flight) every slot's bits are set on every
//! member in sync before this node writes anything, so that no later header update can make a
//! stale map look current.

use crate::members::{Member, MemberSet, Slot};
use crate::policy::used::{read_map, MapError, UsedRegions};
use device::AlignedBuf;
use format::{UsedMapHeader, USED_MAP_HEADER_BYTES};
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

const PAGE: u64 = 4096;

/// Where each node slot's map lies, and what this node has read of the other slots' maps.
pub(crate) struct NodeMaps {
    /// Byte offset of slot 0's map on every member.
    first: u64,
    /// Bytes one map takes (header and bits).
    map_bytes: u64,
    slots: usize,
    own: usize,
    /// The union of the other slots' bits as last read: bits are never cleared in a cluster.
    others: Box<[AtomicU64]>,
}

impl NodeMaps {
    fn base(&self, slot: usize) -> u64 {
        self.first + format::node_map_offset(self.map_bytes, slot)
    }

    /// Byte offset of this node's own map.
    pub(crate) fn own_base(&self) -> u64 {
        self.base(self.own)
    }

    /// Whether another slot's map had region `r` set when last read.
    pub(crate) fn others_have(&self, r: u64) -> bool {
        self.others
            .get((r / 64) as usize)
            .is_some_and(|w| w.load(Ordering::Acquire) & (1 << (r % 64)) != 0)
    }

    fn mark(&self, r: u64) {
        if let Some(w) = self.others.get((r / 64) as usize) {
            w.fetch_or(1 << (r % 64), Ordering::AcqRel);
        }
    }

    /// Read the other slots' bits over regions `rs` from every member in sync (their union).
    /// Members that cannot be read are skipped; if none can, the regions count as used.
    pub(crate) fn read_others(&self, members: &MemberSet, rs: Range<u64>) {
        for slot in (0..self.slots).filter(|&s| s != self.own) {
            match self.read_slot(members, slot, rs.clone()) {
                Some(bits) => {
                    for r in rs.clone().filter(|&r| bit_of(&bits, rs.start, r)) {
                        self.mark(r);
                    }
                }
                None => rs.clone().for_each(|r| self.mark(r)),
            }
        }
    }

    /// Slot `slot`'s bits over regions `rs`, as the union of its copies on the members in sync
    /// (bit `r - rs.start` of the answer is region `r`'s); None if no copy could be read.
    pub(crate) fn read_slot(
        &self,
        members: &MemberSet,
        slot: usize,
        rs: Range<u64>,
    ) -> Option<Vec<u8>> {
        let first_page = rs.start / 8 / PAGE;
        let end_page = rs.end.div_ceil(8).div_ceil(PAGE).max(first_page + 1);
        let at = self.base(slot) + USED_MAP_HEADER_BYTES as u64 + first_page * PAGE;
        let mut buf = AlignedBuf::zeroed(((end_page - first_page) * PAGE) as usize);
        let mut union: Option<Vec<u8>> = None;
        for m in in_sync_members(&members.slots) {
            if let Err(e) = m.dev.read_at(&mut buf, at) {
                tracing::warn!(member = %m.name(), slot, "cannot read a node's used-region map: {e}");
                continue;
            }
            let u = union.get_or_insert_with(|| vec![0; buf.len()]);
            for (d, s) in u.iter_mut().zip(buf.iter()) {
                *d |= *s;
            }
        }
        // Re-base the bits so that bit 0 is region `rs.start`.
        let skip = rs.start - first_page * PAGE * 8;
        union.map(|u| {
            let mut out = vec![0u8; (rs.end - rs.start).div_ceil(8) as usize];
            for r in 0..rs.end - rs.start {
                if bit_of(&u, 0, skip + r) {
                    out[(r / 8) as usize] |= 1 << (r % 8);
                }
            }
            out
        })
    }
}

fn bit_of(bits: &[u8], start: u64, r: u64) -> bool {
    let j = r - start;
    bits.get((j / 8) as usize)
        .is_some_and(|b| b & (1 << (j % 8)) != 0)
}

fn in_sync_members(slots: &[Slot]) -> impl Iterator<Item = Arc<Member>> + '_ {
    slots
        .iter()
        .filter(|s| s.is_complete())
        .filter_map(|s| s.usable())
}

/// Which node loads the maps.
pub(crate) struct ThisNode {
    /// Node slots the array has.
    pub slots: usize,
    /// This node's.
    pub own: usize,
    /// False if it runs read-only (it writes nothing, its map included).
    pub writable: bool,
}

/// The maps of a clustered array, for `node`.
/// `Ok(None)`: the members in sync carry no map per slot for this array (a clustered array
/// created before the maps were per node; every node finds the same), which runs without one.
/// Err: a map there could not be read or marked on any member. A node must not run without
/// its map while the others keep theirs: a walk would skip what it wrote.
pub(crate) fn load(
    best: &format::Superblock,
    base: u64,
    sync_bytes: u64,
    chunk_bytes: u64,
    slots_on: &[Slot],
    node: ThisNode,
) -> Result<Option<Arc<UsedRegions>>, String> {
    let ThisNode {
        slots,
        own,
        writable,
    } = node;
    let members: Vec<Arc<Member>> = slots_on
        .iter()
        .filter(|s| s.is_complete())
        .filter_map(|s| s.member())
        .collect();
    let mut header: Option<UsedMapHeader> = None;
    let mut fresh = false;
    let mut own_bits: Vec<u8> = Vec::new();
    for slot in 0..slots {
        let mut read = 0;
        for m in &members {
            let map_bytes = header.as_ref().map_or(0, UsedMapHeader::bytes_on_disk);
            let at = base + format::node_map_offset(map_bytes, slot);
            let (h, b) = match read_map(m.dev.as_ref(), at) {
                Ok(map) => map,
                Err(MapError::Io(e)) => {
                    tracing::warn!(member = %m.name(), slot, "{e}");
                    continue;
                }
                Err(MapError::Format(why)) => {
                    tracing::info!(member = %m.name(), slot,
                        "no per-node used-region map ({why}): the cluster keeps none");
                    return Ok(None);
                }
            };
            let whole = h.region_bytes.is_power_of_two()
                && (chunk_bytes == 0 || h.region_bytes.is_multiple_of(chunk_bytes));
            let known = header.as_ref().map_or(h.region_bytes, |k| k.region_bytes);
            if h.uuid != best.set_uuid
                || !whole
                || h.regions != sync_bytes.div_ceil(h.region_bytes)
                || h.region_bytes != known
            {
                return Ok(None);
            }
            read += 1;
            fresh |= h.events == best.events
                && h.sb_utime == best.utime
                && !format::written_by_md(best.utime);
            if slot == own {
                own_bits.resize(own_bits.len().max(b.len()), 0);
                for (d, s) in own_bits.iter_mut().zip(&b) {
                    *d |= *s;
                }
            }
            header.get_or_insert(h);
        }
        if read == 0 {
            return Err(format!(
                "no member in sync could be read for node slot {slot}'s used-region map"
            ));
        }
    }
    let mut h = header.ok_or("no node slots")?;
    let map_bytes = h.bytes_on_disk();
    if !fresh {
        // A read-only node writes nothing, its map included.
        if writable {
            mark_all_used(&members, base, map_bytes, slots)?;
        }
        own_bits.fill(0xff);
    }
    h.events = best.events;
    h.sb_utime = best.utime;
    let words = h.regions.div_ceil(64) as usize;
    let maps = NodeMaps {
        first: base,
        map_bytes,
        slots,
        own,
        others: (0..words).map(|_| AtomicU64::new(0)).collect(),
    };
    Ok(Some(Arc::new(UsedRegions::load_for_node(
        maps, h, &own_bits,
    ))))
}

/// The maps could not be trusted: set every slot's bits on every member in sync, durably,
/// before this node's first superblock commit could make a header look current. A member
/// that cannot take it keeps older bits, which the union with the others' all-set copies
/// covers; Err if none could.
fn mark_all_used(
    members: &[Arc<Member>],
    base: u64,
    map_bytes: u64,
    slots: usize,
) -> Result<(), String> {
    tracing::warn!(
        "the per-node used-region maps were not written with the superblocks (md, or a cut \
         inside a commit): every region counts as used"
    );
    let bits = map_bytes - USED_MAP_HEADER_BYTES as u64;
    let mut ones = AlignedBuf::zeroed(bits as usize);
    ones.fill(0xff);
    let mut marked = 0;
    for m in members {
        let res = (0..slots).try_for_each(|slot| {
            let at = base + format::node_map_offset(map_bytes, slot) + USED_MAP_HEADER_BYTES as u64;
            m.dev.write_at(&ones, at, true)
        });
        match res {
            Ok(()) => marked += 1,
            Err(e) => {
                tracing::error!(member = %m.name(), "cannot mark the used-region maps all used: {e}")
            }
        }
    }
    if marked == 0 {
        return Err("no member in sync took the used-region maps marked all used".into());
    }
    Ok(())
}
