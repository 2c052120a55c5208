//! Used-region tracking: which regions of the array may hold data. A region never written
//! since create, or trimmed whole since, is zero on every member in sync (data and parity
//! alike), so it is consistent without being read: resync, check and rebuild skip it (a
//! rebuild discards it on the new member instead of reading the others).
//!
//! On disk: `format`'s used-region map, replicated on every member in the space md leaves
//! between the bad-block log and the data (see `format::used_map`, and `docs/on-disk.md`).
//! Coordinates are md's sync coordinates: bytes of each member's data area, array bytes for
//! RAID10 (whose regions cover whole chunks, each on its copies). Not for linear and RAID0.
//!
//! Ordering:
//! * a region's bit is durable on every member in a role before the first write into it goes
//!   out (the commit point calls [`UsedRegions::ensure_used`], under the range lock the write
//!   holds), so after any crash a region that may hold data is marked used;
//! * a trim releases only whole regions, under the range lock: it discards them on every
//!   member (through the commit point, so the write-intent bitmap covers the discards), flushes,
//!   and only then clears their bits. A crash in between leaves them marked used (harmless).
//! * the map's header records the array's events before every superblock update; a map behind
//!   the superblocks (someone else ran the array) counts as all used.

use crate::error::Result;
use crate::members::paged::{PagedCopy, WriteFailures};
use crate::members::{Member, MemberSet};
use crate::policy::used_nodes::NodeMaps;
use format::{UsedMapHeader, USED_MAP_HEADER_BYTES};
use parking_lot::Mutex;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

pub(crate) struct UsedRegions {
    region_bytes: u64,
    regions: u64,
    /// One bit per region, as durable on the members: set = may hold data.
    used: Box<[AtomicU64]>,
    header: Mutex<UsedMapHeader>,
    copy: PagedCopy,
    /// A clustered array's other node slots' maps (None: one map, this array's own).
    nodes: Option<NodeMaps>,
}

/// The map a new array over `sync_bytes` of sync coordinates starts with: `used` says whether
/// every region counts as used (members not known to be zero) or none does; `flags` go into
/// the header. Regions are whole chunks (`chunk_bytes`). Returns the header and the bytes to
/// write.
pub(crate) fn initial_map(
    sync_bytes: u64,
    chunk_bytes: u64,
    sb: &format::Superblock,
    room_bytes: u64,
    used: bool,
    flags: u32,
) -> Option<(UsedMapHeader, Vec<u8>)> {
    let region_bytes = format::choose_region_bytes(sync_bytes, room_bytes, chunk_bytes)?;
    let header = UsedMapHeader {
        uuid: sb.set_uuid,
        events: sb.events,
        region_bytes,
        regions: sync_bytes.div_ceil(region_bytes),
        flags,
        sb_utime: sb.utime,
    };
    let mut bytes = vec![if used { 0xff } else { 0 }; header.bytes_on_disk() as usize];
    bytes[..USED_MAP_HEADER_BYTES].copy_from_slice(&header.encode());
    Some((header, bytes))
}

/// Why a member's used-region map could not be read.
pub(crate) enum MapError {
    /// The device did not answer.
    Io(String),
    /// What it holds there is no map (of this shape).
    Format(String),
}

/// Read a member's used-region map at `base`: header and bit bytes.
pub(crate) fn read_map(
    dev: &dyn device::Device,
    base: u64,
) -> std::result::Result<(UsedMapHeader, Vec<u8>), MapError> {
    let io = |e: std::io::Error| MapError::Io(format!("cannot read the used-region map: {e}"));
    let mut head = device::AlignedBuf::zeroed(USED_MAP_HEADER_BYTES);
    dev.read_at(&mut head, base).map_err(io)?;
    let h = UsedMapHeader::decode(&head).map_err(|e| MapError::Format(e.to_string()))?;
    let total = h.bytes_on_disk();
    if base + total > dev.len_bytes() {
        return Err(MapError::Format(
            "used-region map runs past the device end".into(),
        ));
    }
    let mut all = device::AlignedBuf::zeroed(total as usize);
    dev.read_at(&mut all, base).map_err(io)?;
    Ok((h, all[USED_MAP_HEADER_BYTES..].to_vec()))
}

impl UsedRegions {
    /// The map as assembly found it at byte `base` of every member: `bits` is the union of the
    /// members' copies.
    pub(crate) fn load(base: u64, header: UsedMapHeader, bits: &[u8]) -> UsedRegions {
        Self::build(base, header, bits, None)
    }

    /// A clustered array's node: its own slot's map, with `bits` as assembly found them.
    pub(crate) fn load_for_node(
        nodes: NodeMaps,
        header: UsedMapHeader,
        bits: &[u8],
    ) -> UsedRegions {
        Self::build(nodes.own_base(), header, bits, Some(nodes))
    }

    fn build(
        base: u64,
        header: UsedMapHeader,
        bits: &[u8],
        nodes: Option<NodeMaps>,
    ) -> UsedRegions {
        let words = header.regions.div_ceil(64) as usize;
        let used: Box<[AtomicU64]> = (0..words)
            .map(|w| {
                let mut v = [0u8; 8];
                for (i, b) in v.iter_mut().enumerate() {
                    *b = bits.get(w * 8 + i).copied().unwrap_or(0xff);
                }
                AtomicU64::new(u64::from_le_bytes(v))
            })
            .collect();
        let mut bytes = vec![0u8; header.bytes_on_disk() as usize];
        bytes[..USED_MAP_HEADER_BYTES].copy_from_slice(&header.encode());
        let n = bits.len().min(bytes.len() - USED_MAP_HEADER_BYTES);
        bytes[USED_MAP_HEADER_BYTES..USED_MAP_HEADER_BYTES + n].copy_from_slice(&bits[..n]);
        UsedRegions {
            region_bytes: header.region_bytes,
            regions: header.regions,
            used,
            header: Mutex::new(header),
            copy: PagedCopy::new(base, bytes),
            nodes,
        }
    }

    /// The other node slots' maps, if this is a clustered array's node.
    pub(crate) fn nodes(&self) -> Option<&NodeMaps> {
        self.nodes.as_ref()
    }

    pub(crate) fn region_bytes(&self) -> u64 {
        self.region_bytes
    }

    pub(crate) fn regions(&self) -> u64 {
        self.regions
    }

    /// Set in this node's map.
    pub(crate) fn is_set(&self, r: u64) -> bool {
        self.used[(r / 64) as usize].load(Ordering::Acquire) & (1 << (r % 64)) != 0
    }

    /// May hold data, as far as this node knows: set in its map, or (in a cluster) in another
    /// node's as last read.
    fn is_used(&self, r: u64) -> bool {
        self.is_set(r) || self.nodes.as_ref().is_some_and(|n| n.others_have(r))
    }

    fn span(&self, offset: u64, len: u64) -> Range<u64> {
        let first = offset / self.region_bytes;
        let end = (offset + len.max(1)).div_ceil(self.region_bytes);
        first.min(self.regions)..end.min(self.regions)
    }

    /// Regions marked used.
    pub(crate) fn used_regions(&self) -> u64 {
        (0..self.regions).filter(|&r| self.is_used(r)).count() as u64
    }

    /// In a cluster: read the other nodes' maps over sync coordinates `from..to`, unless every
    /// region there is known used already (bits never clear in a cluster).
    pub(crate) fn read_others(&self, members: &MemberSet, from: u64, to: u64) {
        let Some(nodes) = &self.nodes else {
            return;
        };
        let rs = self.span(from, to.saturating_sub(from));
        if rs.clone().all(|r| self.is_used(r)) {
            return;
        }
        nodes.read_others(members, rs);
    }

    /// Set the regions `bits` has set (bit `r` is region `r`) in this node's map, durably: a
    /// gone node's map, taken over. Returns how many regions `bits` has set.
    pub(crate) fn adopt(&self, members: &MemberSet, bits: &[u8]) -> Result<u64> {
        let new: Vec<u64> = (0..self.regions)
            .filter(|&r| {
                bits.get((r / 8) as usize)
                    .is_some_and(|b| b & (1 << (r % 8)) != 0)
            })
            .collect();
        let n = new.len() as u64;
        if !self
            .copy
            .commit_bits(members, USED_MAP_HEADER_BYTES, new.iter().copied(), true)
        {
            return Err(members.metadata_failed(0, 0, "cannot record the used-region map"));
        }
        for r in new {
            self.used[(r / 64) as usize].fetch_or(1 << (r % 64), Ordering::AcqRel);
        }
        Ok(n)
    }

    /// Write this node's map to every member in a role that lacks a whole copy (one that
    /// started filling a role on another node's word).
    pub(crate) fn copy_to_new_members(&self, members: &MemberSet) {
        let failed = {
            let mut w = self.copy.writer();
            self.copy.write_out(&members.role_members(), &mut w)
        };
        members.fail_metadata_writers(failed);
    }

    /// Before a write into `offset..offset+len` (sync coordinates) goes out: its regions are
    /// marked used, durably, on every member in a role.
    pub(crate) fn ensure_used(&self, members: &MemberSet, offset: u64, len: u64) -> Result<()> {
        let new: Vec<u64> = self
            .span(offset, len)
            .filter(|&r| !self.is_set(r))
            .collect();
        if new.is_empty() {
            return Ok(());
        }
        if !self
            .copy
            .commit_bits(members, USED_MAP_HEADER_BYTES, new.iter().copied(), true)
        {
            return Err(members.metadata_failed(offset, len, "cannot record the used-region map"));
        }
        for r in new {
            self.used[(r / 64) as usize].fetch_or(1 << (r % 64), Ordering::AcqRel);
        }
        Ok(())
    }

    /// The next run of used regions at or after `from` and before `end` (empty, at `end`, if
    /// none): where background work has something to do.
    pub(crate) fn next_used(&self, from: u64, end: u64) -> Range<u64> {
        let first = from / self.region_bytes;
        // Regions starting at or past `end` cannot change the answer: stop scanning there.
        let last = end.div_ceil(self.region_bytes).min(self.regions);
        let Some(start_r) = (first..last).find(|&r| self.is_used(r)) else {
            return end..end;
        };
        let start = (start_r * self.region_bytes).max(from).min(end);
        let stop = (start_r..last)
            .find(|&r| !self.is_used(r))
            .map_or(end, |r| (r * self.region_bytes).min(end));
        start..stop.max(start)
    }

    /// Bytes of `range` (sync coordinates) in used regions: what background work over it
    /// will really read and write.
    pub(crate) fn used_bytes_within(&self, range: Range<u64>) -> u64 {
        let mut bytes = 0;
        let mut pos = range.start;
        while pos < range.end {
            let run = self.next_used(pos, range.end);
            if run.is_empty() {
                break;
            }
            bytes += run.end - run.start;
            pos = run.end;
        }
        bytes
    }

    /// Whole regions inside `offset..offset+len` (sync coordinates).
    pub(crate) fn whole_regions(&self, offset: u64, len: u64) -> Range<u64> {
        let first = offset.div_ceil(self.region_bytes);
        let end = ((offset + len) / self.region_bytes).min(self.regions);
        first.min(end)..end
    }

    /// Regions `rs` were discarded on every member and flushed: clear their bits.
    pub(crate) fn released(&self, members: &MemberSet, rs: Range<u64>) {
        for r in rs.clone() {
            self.used[(r / 64) as usize].fetch_and(!(1 << (r % 64)), Ordering::AcqRel);
        }
        // A member this write fails on is failed; one that keeps the bit set only counts the
        // region as used, which is always safe.
        self.copy
            .commit_bits(members, USED_MAP_HEADER_BYTES, rs, false);
    }

    /// Whether the header has `flag` (`format::USED_MAP_FLAG_*`). Never in a cluster:
    /// guidance does not run there (each node's map header is its own).
    pub(crate) fn has_flag(&self, flag: u32) -> bool {
        self.nodes.is_none() && self.header.lock().flags & flag != 0
    }

    /// Set or clear header flag `flag`, durably (FUA) on every member in a role (the caller
    /// checks the array is writable).
    pub(crate) fn set_flag(&self, members: &MemberSet, flag: u32, on: bool) {
        if self.has_flag(flag) == on {
            return;
        }
        let failed = {
            let mut w = self.copy.writer();
            let head = {
                let mut h = self.header.lock();
                if on {
                    h.flags |= flag;
                } else {
                    h.flags &= !flag;
                }
                h.encode()
            };
            self.copy.edit(|pages| pages.put(0, &head));
            self.copy.write_out(&members.role_members(), &mut w)
        };
        members.fail_metadata_writers(failed);
    }
}

impl crate::members::EventRecorder for UsedRegions {
    /// The map's header records both the events and the superblocks' utime.
    fn record_events(&self, events: u64, utime: u64, members: &[Arc<Member>]) -> WriteFailures {
        let mut w = self.copy.writer();
        let head = {
            let mut h = self.header.lock();
            h.events = events;
            h.sb_utime = utime;
            h.encode()
        };
        self.copy.edit(|pages| pages.put(0, &head));
        self.copy.write_out(members, &mut w)
    }
}

/// In a cluster: where the run of regions that no node's map has set, from `pos` on, ends
/// (at most [`crate::policy::bitmap::SKIP_MAX_BYTES`] on, and before `end`); `pos` if the
/// region at `pos` may hold data, or outside a cluster. The maps are read without a
/// window held: a write that races with it is seen by the read made under the window,
/// which only shortens the skip.
pub(crate) fn unused_run_elsewhere(
    used: Option<&UsedRegions>,
    members: &MemberSet,
    pos: u64,
    end: u64,
) -> u64 {
    let Some(used) = used.filter(|u| u.nodes().is_some()) else {
        return pos;
    };
    let far = end.min(pos + crate::policy::bitmap::SKIP_MAX_BYTES);
    used.read_others(members, pos, far);
    used.next_used(pos, far).start
}

/// In a cluster: read the other nodes' maps over sync coordinates `from..to`.
pub(crate) fn read_other_maps(used: Option<&UsedRegions>, members: &MemberSet, from: u64, to: u64) {
    if let Some(used) = used {
        used.read_others(members, from, to);
    }
}

/// Bytes of `range` (sync coordinates) that background work will not skip as unused.
pub(crate) fn work_within(used: Option<&UsedRegions>, range: Range<u64>) -> u64 {
    match used {
        Some(u) => u.used_bytes_within(range),
        None => range.end.saturating_sub(range.start),
    }
}

/// The part of `range` (sync coordinates) background work must visit: the first run of
/// used regions in it (all of it without a map).
pub(crate) fn used_within(used: Option<&UsedRegions>, range: Range<u64>) -> Range<u64> {
    match used {
        Some(u) => u.next_used(range.start, range.end),
        None => range,
    }
}
