//! The md personalities: what a level does, asked through one trait ([`Personality`], after md's
//! `struct md_personality`) instead of "which level am I?" along the path.
//!
//! Three implementations: [`Striped`] (linear, RAID0: one copy, no redundancy), [`Copies`]
//! (RAID1, RAID10: plain copies) and [`Parity`] (RAID4/5/6). [`for_geometry`] picks one; it is
//! the one place outside `lifecycle/` that matches on the level.
//!
//! `raid456`: RAID4/5/6, stripe by stripe through the stripe cache (`stripe_cache`), with the
//! write plans (full stripe, read-modify-write, reconstruct-write) and degraded reads that
//! rebuild from parity; `intent` and `gathered` are md's plugging on that path. `copies`: the
//! levels whose sectors have one or more plain copies (linear, RAID0, RAID1, RAID10).
//! `raid456_heal` and `copies_heal`: data that failed its integrity records, rebuilt from what
//! redundancy vouches for, rewritten and read back (the records themselves are `integrity/`).
//! `raid456_sync` and `copies_sync`: the windows of recovery, resync, check/repair and verify
//! reads (the walker that schedules and paces them is `background/`).
//!
//! Sync coordinates (md's `sync_request` space): per-member bytes for RAID1 and the parity
//! levels (the same bytes of every member), array bytes for RAID10 resync and scrub. The
//! bitmap, the used-region map and the walker count in them; the personality converts.

pub(crate) mod copies;
pub(crate) mod copies_heal;
pub(crate) mod copies_sync;
pub(crate) mod gathered;
pub(crate) mod intent;
pub(crate) mod parts;
pub(crate) mod raid456;
pub(crate) mod raid456_heal;
pub(crate) mod raid456_sync;
pub(crate) mod raid456_writeback;
pub(crate) mod rebuilt;
pub(crate) mod stripe_cache;
pub(crate) mod verify;

use crate::error::Result;
use crate::personality::parts::Parts;
use crate::work::{Stop, SyncAction};
use layout::{Geometry, Level};
use std::os::fd::BorrowedFd;
use std::sync::atomic::AtomicUsize;

/// What the engine asks of a level. Pure questions take only the geometry the personality was
/// made for; I/O takes the array (as md's personalities take `mddev`).
pub(crate) trait Personality: Send + Sync {
    /// The geometry the personality was made for.
    fn geometry(&self) -> &Geometry;

    /// Members that may be missing with every byte still readable (md's `max_degraded`).
    fn redundancy(&self) -> usize;

    /// Whether writes go through the stripe cache (parity and its claims, md's raid5 conf).
    fn uses_stripe_cache(&self) -> bool {
        false
    }

    /// The parity personality, for what only parity levels have (plugged and gathered
    /// writes, the journal's write-back cache): None for the others.
    fn as_parity(&self) -> Option<&Parity> {
        None
    }

    /// The copies personality, for what only RAID10 needs outside it (mapping recovery chunks
    /// back to array bytes): None for the others.
    fn as_copies(&self) -> Option<&Copies> {
        None
    }

    /// Bytes of sync coordinates `action` walks (md's resync size; a RAID10 recovery walks the
    /// per-member bytes of the role it rebuilds).
    fn sync_total(&self, action: SyncAction) -> u64;

    /// Where the recovery of `role` ends (per-member bytes).
    fn recovery_end(&self, role: usize) -> u64 {
        self.geometry().used_device_sectors(role) * 512
    }

    /// Array bytes `offset..offset + len` as the sync coordinates of the whole stripes inside
    /// them (what a discard may release): `(start, len)`, empty if none is whole. Copies: the
    /// same bytes.
    fn sync_range_within(&self, offset: u64, len: u64) -> (u64, u64) {
        (offset, len)
    }

    /// The sync coordinates `start..end` of the stripes (4 KiB pages for copies) covering
    /// array bytes `offset..offset + len`.
    fn sync_range_covering(&self, offset: u64, len: u64) -> (u64, u64) {
        (offset / 4096 * 4096, (offset + len).div_ceil(4096) * 4096)
    }

    /// The array byte where sync coordinate `at` (a stripe boundary) starts.
    fn array_bytes_of(&self, at: u64) -> u64 {
        at
    }

    /// Where sync coordinates `at..at + len` (whole regions) lie on the members, as
    /// `(role, offset, len)`, runs merged: the same bytes of every member, unless the
    /// personality says otherwise.
    fn member_spans(&self, at: u64, len: u64) -> Vec<(usize, u64, u64)> {
        (0..self.geometry().raid_disks())
            .map(|role| (role, at, len))
            .collect()
    }

    /// Whether a used-region map can follow this layout (regions covering whole stripes).
    fn keeps_used_map(&self) -> bool;

    /// Whether a recovery's per-member bytes are not the bitmap's and the used map's sync
    /// coordinates (RAID10): skipping clean or unused chunks maps each chunk back first.
    fn recovery_maps_chunks(&self) -> bool {
        false
    }

    /// How many per-member bytes one recovery step of a copies level covers (and the unit a
    /// bitmap skip rounds to).
    fn recovery_unit(&self) -> u64;

    /// The most sync-coordinate bytes one background window covers: about
    /// `ArrayConfig::sync_window_bytes` of each member (RAID10's resync and check: of the
    /// array), what the walker charges against the rate limit before the window starts.
    fn sync_window(&self, a: &Parts) -> u64 {
        a.config.sync_window_bytes
    }

    /// Where a recovery window over member bytes `at..at + len` of `role` is not in sync
    /// coordinates (RAID10): the array byte ranges `(at, len)` its chunks hold, in order.
    fn recovery_array_ranges(&self, role: usize, at: u64, len: u64) -> Option<Vec<(u64, u64)>> {
        let _ = (role, at, len);
        None
    }

    fn read(&self, a: &Parts, offset_bytes: u64, buf: &mut [u8]) -> Result<()>;

    /// The array bytes `offset_bytes..+len` moved into `pipe` from the members' page caches,
    /// where each byte is read from the place an ordinary read takes it as it lies (see
    /// [`crate::Array::read_to_pipe`]). False means the caller reads instead (where a read
    /// would choose, verify or compute); the pipe may hold part of the range then.
    fn read_to_pipe(&self, a: &Parts, offset_bytes: u64, len: usize, pipe: BorrowedFd<'_>) -> bool;

    fn write(
        &self,
        a: &Parts,
        offset_bytes: u64,
        data: &[u8],
        fua: bool,
        intent: Option<intent::WriteIntent>,
    ) -> Result<()>;

    /// Rebuild one window of `role` at `pos`; returns where the next window starts.
    fn recover_window(&self, a: &Parts, role: usize, pos: u64, end: u64) -> Result<u64, Stop>;

    /// One window of a resync, check or repair at sync coordinate `pos`; returns where the next
    /// starts and the mismatched sectors found.
    fn scrub_window(
        &self,
        a: &Parts,
        action: SyncAction,
        pos: u64,
        end: u64,
    ) -> Result<(u64, u64), Stop>;

    /// Verify reads over array byte ranges (checked, in range): mismatched sectors and bytes
    /// verified.
    fn verify(&self, a: &Parts, ranges: &[(u64, u64)], fix: bool) -> Result<(u64, u64)>;
}

/// The personality of a geometry: the level match the rest of the engine does not make.
pub(crate) fn for_geometry(g: &Geometry) -> Box<dyn Personality> {
    match g.level() {
        Level::Raid4 | Level::Raid5 | Level::Raid6 => Box::new(Parity { g: g.clone() }),
        Level::Raid1 | Level::Raid10 => Box::new(Copies::new(g)),
        Level::Linear | Level::Raid0 => Box::new(Striped {
            g: g.clone(),
            one_copy: Copies::new(g),
        }),
    }
}

/// Linear and RAID0: one copy of every sector; nothing to sync, check or verify. Reads and
/// writes are those of the copies levels with a single copy.
pub(crate) struct Striped {
    pub(crate) g: Geometry,
    one_copy: Copies,
}

/// RAID1 and RAID10: every sector has plain copies.
pub(crate) struct Copies {
    pub(crate) g: Geometry,
    /// Which copy the next read starts with (reads spread over the copies).
    next_copy: AtomicUsize,
}

impl Copies {
    fn new(g: &Geometry) -> Copies {
        Copies {
            g: g.clone(),
            next_copy: AtomicUsize::new(0),
        }
    }
}

/// RAID4/5/6: data chunks and their parity, written through the stripe cache.
pub(crate) struct Parity {
    pub(crate) g: Geometry,
}

/// Bytes of each member the parity levels sync: whole stripes.
fn parity_sync_bytes(g: &Geometry) -> u64 {
    g.stripes() * g.chunk_sectors() * 512
}

impl Personality for Striped {
    fn geometry(&self) -> &Geometry {
        &self.g
    }

    fn redundancy(&self) -> usize {
        0
    }

    fn sync_total(&self, _action: SyncAction) -> u64 {
        self.g.spec().component_sectors * 512
    }

    fn keeps_used_map(&self) -> bool {
        false
    }

    fn recovery_unit(&self) -> u64 {
        self.g.chunk_sectors().max(8) * 512
    }

    fn read(&self, a: &Parts, offset_bytes: u64, buf: &mut [u8]) -> Result<()> {
        self.one_copy.mirror_read(a, offset_bytes, buf)
    }

    fn read_to_pipe(&self, a: &Parts, offset_bytes: u64, len: usize, pipe: BorrowedFd<'_>) -> bool {
        self.one_copy.splice_copies(a, offset_bytes, len, pipe)
    }

    fn write(
        &self,
        a: &Parts,
        offset_bytes: u64,
        data: &[u8],
        fua: bool,
        _intent: Option<intent::WriteIntent>,
    ) -> Result<()> {
        self.one_copy.mirror_write(a, offset_bytes, data, fua)
    }

    // The walker and `verify` refuse levels without redundancy before they get here; a
    // member's superblock claiming a partial rebuild on one (md never writes that) still gets
    // an error, not a crash.
    fn recover_window(&self, a: &Parts, _role: usize, _pos: u64, _end: u64) -> Result<u64, Stop> {
        Err(Stop::Failed(no_redundancy(a, "rebuild a member from")))
    }

    fn scrub_window(
        &self,
        a: &Parts,
        _action: SyncAction,
        _pos: u64,
        _end: u64,
    ) -> Result<(u64, u64), Stop> {
        Err(Stop::Failed(no_redundancy(a, "compare")))
    }

    fn verify(&self, a: &Parts, _ranges: &[(u64, u64)], _fix: bool) -> Result<(u64, u64)> {
        Err(no_redundancy(a, "verify"))
    }
}

/// What a background window on a level without redundancy fails with.
fn no_redundancy(a: &Parts, what: &str) -> crate::error::EngineError {
    crate::error::EngineError::Unsupported(format!(
        "{} ({}) has no redundancy to {what}",
        a.name,
        a.geometry.level()
    ))
}

impl Personality for Copies {
    fn geometry(&self) -> &Geometry {
        &self.g
    }

    fn as_copies(&self) -> Option<&Copies> {
        Some(self)
    }

    fn redundancy(&self) -> usize {
        self.g.max_degraded()
    }

    fn sync_total(&self, action: SyncAction) -> u64 {
        let g = &self.g;
        match g.level() {
            Level::Raid10 if action == SyncAction::Recover => {
                (0..g.raid_disks())
                    .map(|d| g.used_device_sectors(d))
                    .max()
                    .unwrap_or(0)
                    * 512
            }
            Level::Raid10 => g.array_sectors() * 512,
            _ => g.spec().component_sectors * 512,
        }
    }

    fn member_spans(&self, at: u64, len: u64) -> Vec<(usize, u64, u64)> {
        let g = &self.g;
        if g.level() != Level::Raid10 {
            return (0..g.raid_disks()).map(|role| (role, at, len)).collect();
        }
        // RAID10 sync coordinates are array bytes: every copy of every chunk.
        let chunk = g.chunk_sectors() * 512;
        assert!(
            at.is_multiple_of(chunk) && len.is_multiple_of(chunk),
            "regions cover whole chunks"
        );
        let mut spans: Vec<(usize, u64, u64)> = (at..at + len)
            .step_by(chunk as usize)
            .flat_map(|c| g.map_copies(c / 512).iter().collect::<Vec<_>>())
            .map(|loc| (loc.dev, loc.dev_sector * 512, chunk))
            .collect();
        spans.sort_unstable();
        let mut merged: Vec<(usize, u64, u64)> = Vec::with_capacity(spans.len());
        for (role, off, n) in spans {
            match merged.last_mut() {
                Some((r, o, l)) if *r == role && *o + *l == off => *l += n,
                _ => merged.push((role, off, n)),
            }
        }
        merged
    }

    fn keeps_used_map(&self) -> bool {
        self.g.level() == Level::Raid1 || (self.g.chunk_sectors() * 512).is_power_of_two()
    }

    fn recovery_maps_chunks(&self) -> bool {
        self.g.level() == Level::Raid10
    }

    fn recovery_array_ranges(&self, role: usize, at: u64, len: u64) -> Option<Vec<(u64, u64)>> {
        if !self.recovery_maps_chunks() {
            return None;
        }
        let step = self.recovery_unit();
        let chunks = (at / step * step..at + len)
            .step_by(step as usize)
            .filter_map(|p| {
                self.g
                    .reverse_copy(role, p / 512)
                    .map(|s| (s * 512, s * 512 + step))
            })
            .collect();
        Some(
            crate::intervals::merge(chunks)
                .into_iter()
                .map(|(a, b)| (a, b - a))
                .collect(),
        )
    }

    fn recovery_unit(&self) -> u64 {
        if self.g.level() == Level::Raid1 {
            1 << 20
        } else {
            self.g.chunk_sectors() * 512
        }
    }

    fn read(&self, a: &Parts, offset_bytes: u64, buf: &mut [u8]) -> Result<()> {
        self.mirror_read(a, offset_bytes, buf)
    }

    fn read_to_pipe(&self, a: &Parts, offset_bytes: u64, len: usize, pipe: BorrowedFd<'_>) -> bool {
        self.splice_copies(a, offset_bytes, len, pipe)
    }

    fn write(
        &self,
        a: &Parts,
        offset_bytes: u64,
        data: &[u8],
        fua: bool,
        _intent: Option<intent::WriteIntent>,
    ) -> Result<()> {
        self.mirror_write(a, offset_bytes, data, fua)
    }

    fn sync_window(&self, a: &Parts) -> u64 {
        self.window_bytes(a)
    }

    fn recover_window(&self, a: &Parts, role: usize, pos: u64, end: u64) -> Result<u64, Stop> {
        self.recover_copies(a, role, pos, end)
    }

    fn scrub_window(
        &self,
        a: &Parts,
        action: SyncAction,
        pos: u64,
        end: u64,
    ) -> Result<(u64, u64), Stop> {
        self.scrub_copies(a, action, pos, end)
    }

    fn verify(&self, a: &Parts, ranges: &[(u64, u64)], fix: bool) -> Result<(u64, u64)> {
        self.verify_copies(a, self.recovery_unit(), ranges, fix)
    }
}

impl Personality for Parity {
    fn geometry(&self) -> &Geometry {
        &self.g
    }

    fn redundancy(&self) -> usize {
        self.g.max_degraded()
    }

    fn uses_stripe_cache(&self) -> bool {
        true
    }

    fn as_parity(&self) -> Option<&Parity> {
        Some(self)
    }

    fn sync_total(&self, _action: SyncAction) -> u64 {
        parity_sync_bytes(&self.g)
    }

    fn recovery_end(&self, _role: usize) -> u64 {
        parity_sync_bytes(&self.g)
    }

    fn sync_range_within(&self, offset: u64, len: u64) -> (u64, u64) {
        let chunk = self.g.chunk_sectors() * 512;
        let row = chunk * self.g.data_disks() as u64;
        let first = offset.div_ceil(row);
        let end = (offset + len) / row;
        if end <= first {
            return (0, 0);
        }
        (first * chunk, (end - first) * chunk)
    }

    fn sync_range_covering(&self, offset: u64, len: u64) -> (u64, u64) {
        let chunk = self.g.chunk_sectors() * 512;
        let row = chunk * self.g.data_disks() as u64;
        (offset / row * chunk, (offset + len).div_ceil(row) * chunk)
    }

    fn array_bytes_of(&self, at: u64) -> u64 {
        at * self.g.data_disks() as u64
    }

    fn keeps_used_map(&self) -> bool {
        (self.g.chunk_sectors() * 512).is_power_of_two()
    }

    fn recovery_unit(&self) -> u64 {
        self.g.chunk_sectors() * 512
    }

    fn read(&self, a: &Parts, offset_bytes: u64, buf: &mut [u8]) -> Result<()> {
        self.parity_read(a, offset_bytes, buf)
    }

    fn read_to_pipe(&self, a: &Parts, offset_bytes: u64, len: usize, pipe: BorrowedFd<'_>) -> bool {
        self.splice_data(a, offset_bytes, len, pipe)
    }

    fn write(
        &self,
        a: &Parts,
        offset_bytes: u64,
        data: &[u8],
        fua: bool,
        intent: Option<intent::WriteIntent>,
    ) -> Result<()> {
        self.parity_write(a, offset_bytes, data, fua, intent)
    }

    fn sync_window(&self, a: &Parts) -> u64 {
        self.window_rows(a) * self.g.chunk_sectors() * 512
    }

    fn recover_window(&self, a: &Parts, role: usize, pos: u64, end: u64) -> Result<u64, Stop> {
        self.recover_rows(a, role, pos, end)
    }

    fn scrub_window(
        &self,
        a: &Parts,
        action: SyncAction,
        pos: u64,
        end: u64,
    ) -> Result<(u64, u64), Stop> {
        self.scrub_rows(a, action, pos, end)
    }

    fn verify(&self, a: &Parts, ranges: &[(u64, u64)], fix: bool) -> Result<(u64, u64)> {
        self.verify_rows(a, ranges, fix)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use layout::{GeometrySpec, Level};

    fn spec(level: Level, disks: usize, chunk_kib: u64) -> Geometry {
        Geometry::new(GeometrySpec {
            level,
            raid_disks: disks,
            chunk_sectors: chunk_kib * 2,
            layout: layout::default_layout(level),
            component_sectors: 64 << 11,
            device_sectors: Vec::new(),
        })
        .unwrap()
    }

    #[test]
    fn parity_sync_coordinates_round_trip_through_array_bytes() {
        let p = for_geometry(&spec(Level::Raid5, 4, 64));
        let row = 3 * 64 * 1024;
        // Whole rows inside an unaligned range, and the rows covering it.
        assert_eq!(p.sync_range_within(1, 2 * row), (64 * 1024, 64 * 1024));
        assert_eq!(p.sync_range_covering(1, row), (0, 2 * 64 * 1024));
        assert_eq!(p.array_bytes_of(64 * 1024), row);
        assert_eq!(p.redundancy(), 1);
    }

    #[test]
    fn raid10_member_spans_cover_every_copy_once() {
        let g = spec(Level::Raid10, 4, 64);
        let c = for_geometry(&g);
        let chunk = 64 * 1024;
        let spans = c.member_spans(0, 4 * chunk);
        let covered: u64 = spans.iter().map(|s| s.2).sum();
        // Two copies of four chunks.
        assert_eq!(covered, 8 * chunk);
        assert!(c.recovery_maps_chunks());
    }
}
