//! md's write-intent bitmap, classic format version 4 (pure, no I/O; reference §5).
//!
//! # Where it lives
//!
//! An internal bitmap sits at `super_offset + bitmap_offset` sectors of every member; ironraid
//! (like mdadm for v1.2) puts it 8 sectors after the superblock, at byte 8192
//! ([`BITMAP_OFFSET_SECTORS`]), inside the space `create` reserves before the bad-block log.
//!
//! # Layout (little-endian)
//!
//! | off | size | field |
//! |---|---|---|
//! | 0 | 4 | magic [`BITMAP_MAGIC`] |
//! | 4 | 4 | version (3 legacy, 4 normal, 5 clustered) |
//! | 8 | 16 | uuid (the array's set_uuid) |
//! | 24 | 8 | events (array events when the header was last written) |
//! | 32 | 8 | events_cleared (events when bits were last cleared) |
//! | 40 | 8 | sync_size (sectors covered) |
//! | 48 | 4 | state ([`state`] bits) |
//! | 52 | 4 | chunksize (bytes per bit) |
//! | 56 | 4 | daemon_sleep (seconds) |
//! | 60 | 4 | write_behind |
//! | 64 | 4 | sectors_reserved |
//! | 68 | 4 | nodes (clustered only) |
//! | 72 | 64 | cluster_name |
//! | 136 | 120 | zero |
//!
//! The bits follow at byte 256: bit `j` is bit `j % 8` of byte `256 + j / 8`. The whole thing
//! (header and bits) is written in 4 KiB pages.
//!
//! # Clustered bitmaps (version 5, md-cluster)
//!
//! A clustered array keeps one bitmap per node slot, back to back: slot `s` starts
//! `s * bytes_on_disk()` bytes after slot 0, where `bytes_on_disk()` is one slot's header plus
//! bits rounded up to whole 4 KiB pages (the kernel's `md_bitmap_read_sb` and mdadm's
//! `locate_bitmap1` both step by that rounded size). Every slot carries a full header;
//! `nodes` (how many slots) and `cluster_name` (NUL-terminated, at most 63 bytes) are the same
//! in all of them.

use crate::FormatError;

/// `"bitm"` as a little-endian u32.
pub const BITMAP_MAGIC: u32 = 0x6d74_6962;
/// The version md uses for v1.x superblocks (bits in little-endian order).
pub const BITMAP_VERSION: u32 = 4;
/// md-cluster's version: version 4 plus `nodes` slots and a cluster name.
pub const BITMAP_VERSION_CLUSTERED: u32 = 5;
/// Bytes of `cluster_name`, its terminating NUL included.
pub const CLUSTER_NAME_BYTES: usize = 64;
/// Most node slots ironraid reads from a clustered bitmap (md has no limit but the space
/// before the data; this one keeps a corrupt header from sizing a huge read).
pub const MAX_CLUSTER_NODES: u32 = 256;
/// Size of the header before the bits.
pub const BITMAP_HEADER_BYTES: usize = 256;
/// Unit the bitmap is read and written in.
pub const BITMAP_PAGE_BYTES: usize = 4096;
/// Where ironraid puts the internal bitmap, relative to the v1.2 superblock (sectors).
pub const BITMAP_OFFSET_SECTORS: i32 = 8;
/// mdadm's default seconds between clean-up passes.
pub const DEFAULT_DAEMON_SLEEP: u32 = 5;
/// mdadm's floor for a default bitmap chunk.
pub const DEFAULT_MIN_CHUNK_BYTES: u64 = 64 << 20;
/// Largest `write_behind` md accepts.
pub const MAX_WRITE_BEHIND: u32 = 16383;

/// `state` bits.
pub mod state {
    /// The bitmap is out of date: every bit must be taken as set.
    pub const STALE: u32 = 1 << 1;
    /// Writing the bitmap failed.
    pub const WRITE_ERROR: u32 = 1 << 2;
}

/// The 256-byte bitmap header.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BitmapSuper {
    pub version: u32,
    pub uuid: [u8; 16],
    pub events: u64,
    pub events_cleared: u64,
    pub sync_size: u64,
    pub state: u32,
    pub chunksize: u32,
    pub daemon_sleep: u32,
    pub write_behind: u32,
    pub sectors_reserved: u32,
    /// Node slots of a clustered bitmap (0 otherwise).
    pub nodes: u32,
    /// The cluster's name, NUL-padded (all zero unless clustered).
    pub cluster_name: [u8; CLUSTER_NAME_BYTES],
}

impl BitmapSuper {
    /// A fresh header as mdadm's create writes it.
    pub fn new(uuid: [u8; 16], sync_sectors: u64, chunk_bytes: u32, reserved: u32) -> Self {
        BitmapSuper {
            version: BITMAP_VERSION,
            uuid,
            events: 0,
            events_cleared: 0,
            sync_size: sync_sectors,
            state: 0,
            chunksize: chunk_bytes,
            daemon_sleep: DEFAULT_DAEMON_SLEEP,
            write_behind: 0,
            sectors_reserved: reserved,
            nodes: 0,
            cluster_name: [0; CLUSTER_NAME_BYTES],
        }
    }

    /// Turn a fresh header into md-cluster's: version 5 with `nodes` slots named `name`.
    /// Refuses 0 slots, more than [`MAX_CLUSTER_NODES`], and a name that does not fit 63 bytes
    /// or holds a NUL.
    pub fn clustered(mut self, nodes: u32, name: &str) -> Result<Self, FormatError> {
        if nodes == 0 || nodes > MAX_CLUSTER_NODES {
            return Err(FormatError::Bitmap(format!(
                "{nodes} node slots: a clustered bitmap has 1 to {MAX_CLUSTER_NODES}"
            )));
        }
        if name.len() >= CLUSTER_NAME_BYTES || name.contains('\0') {
            return Err(FormatError::Bitmap(format!(
                "cluster name '{}' must be at most {} bytes without NUL",
                name.escape_debug(),
                CLUSTER_NAME_BYTES - 1
            )));
        }
        self.version = BITMAP_VERSION_CLUSTERED;
        self.nodes = nodes;
        self.cluster_name = [0; CLUSTER_NAME_BYTES];
        self.cluster_name[..name.len()].copy_from_slice(name.as_bytes());
        Ok(self)
    }

    /// md-cluster's bitmap (one slot per node).
    pub fn is_clustered(&self) -> bool {
        self.version == BITMAP_VERSION_CLUSTERED
    }

    /// Node slots on disk: `nodes` for a clustered bitmap, 1 otherwise.
    pub fn slots(&self) -> u32 {
        if self.is_clustered() {
            self.nodes
        } else {
            1
        }
    }

    /// The cluster name up to its NUL (lossy: md stores bytes).
    pub fn cluster_name(&self) -> String {
        let end = self
            .cluster_name
            .iter()
            .position(|&b| b == 0)
            .unwrap_or(CLUSTER_NAME_BYTES);
        String::from_utf8_lossy(&self.cluster_name[..end]).into_owned()
    }

    /// Where slot `slot`'s header starts, in bytes after slot 0's.
    pub fn slot_offset(&self, slot: u32) -> u64 {
        assert!(slot < self.slots(), "slot {slot} of {}", self.slots());
        u64::from(slot) * self.bytes_on_disk()
    }

    /// Bytes every slot takes together.
    pub fn all_slots_bytes(&self) -> u64 {
        u64::from(self.slots()) * self.bytes_on_disk()
    }

    pub fn encode(&self) -> [u8; BITMAP_HEADER_BYTES] {
        let mut b = [0u8; BITMAP_HEADER_BYTES];
        b[0..4].copy_from_slice(&BITMAP_MAGIC.to_le_bytes());
        b[4..8].copy_from_slice(&self.version.to_le_bytes());
        b[8..24].copy_from_slice(&self.uuid);
        b[24..32].copy_from_slice(&self.events.to_le_bytes());
        b[32..40].copy_from_slice(&self.events_cleared.to_le_bytes());
        b[40..48].copy_from_slice(&self.sync_size.to_le_bytes());
        b[48..52].copy_from_slice(&self.state.to_le_bytes());
        b[52..56].copy_from_slice(&self.chunksize.to_le_bytes());
        b[56..60].copy_from_slice(&self.daemon_sleep.to_le_bytes());
        b[60..64].copy_from_slice(&self.write_behind.to_le_bytes());
        b[64..68].copy_from_slice(&self.sectors_reserved.to_le_bytes());
        b[68..72].copy_from_slice(&self.nodes.to_le_bytes());
        b[72..72 + CLUSTER_NAME_BYTES].copy_from_slice(&self.cluster_name);
        b
    }

    /// Parse and check a header the way the kernel's loader does. A clustered header (version
    /// 5) must name 1 to [`MAX_CLUSTER_NODES`] slots and a NUL-terminated cluster name.
    pub fn decode(buf: &[u8]) -> Result<Self, FormatError> {
        if buf.len() < BITMAP_HEADER_BYTES {
            return Err(FormatError::Truncated);
        }
        let u32_at = |o: usize| u32::from_le_bytes(buf[o..o + 4].try_into().expect("4 bytes"));
        let u64_at = |o: usize| u64::from_le_bytes(buf[o..o + 8].try_into().expect("8 bytes"));
        let magic = u32_at(0);
        if magic != BITMAP_MAGIC {
            return Err(FormatError::Bitmap(format!("bad magic {magic:#010x}")));
        }
        let sb = BitmapSuper {
            version: u32_at(4),
            uuid: buf[8..24].try_into().expect("16 bytes"),
            events: u64_at(24),
            events_cleared: u64_at(32),
            sync_size: u64_at(40),
            state: u32_at(48),
            chunksize: u32_at(52),
            daemon_sleep: u32_at(56),
            write_behind: u32_at(60),
            sectors_reserved: u32_at(64),
            nodes: u32_at(68),
            cluster_name: buf[72..72 + CLUSTER_NAME_BYTES]
                .try_into()
                .expect("64 bytes"),
        };
        match sb.version {
            3 | 4 => {}
            BITMAP_VERSION_CLUSTERED => check_cluster_fields(&sb)?,
            v => return Err(FormatError::Bitmap(format!("unknown version {v}"))),
        }
        if sb.chunksize < 512 || !sb.chunksize.is_power_of_two() {
            return Err(FormatError::Bitmap(format!(
                "chunk size {} is not a power of two of at least 512",
                sb.chunksize
            )));
        }
        if sb.daemon_sleep == 0 {
            return Err(FormatError::Bitmap("daemon sleep of 0 seconds".into()));
        }
        if sb.write_behind > MAX_WRITE_BEHIND {
            return Err(FormatError::Bitmap(format!(
                "write-behind {} exceeds {MAX_WRITE_BEHIND}",
                sb.write_behind
            )));
        }
        if sb.events_cleared > sb.events {
            return Err(FormatError::Bitmap(format!(
                "events_cleared {} is ahead of events {}",
                sb.events_cleared, sb.events
            )));
        }
        // Every slot's offset is computed from this: the whole must fit in 64 bits.
        if sb
            .bytes_on_disk()
            .checked_mul(u64::from(sb.slots()))
            .is_none()
        {
            return Err(FormatError::Bitmap(format!(
                "{} node slots of {} bytes each do not fit in 64 bits (sync size {} sectors)",
                sb.slots(),
                sb.bytes_on_disk(),
                sb.sync_size
            )));
        }
        Ok(sb)
    }

    /// Bits in the bitmap: one per chunk of `sync_size`, the last one possibly partial.
    pub fn chunks(&self) -> u64 {
        bitmap_chunks(self.sync_size, u64::from(self.chunksize))
    }

    /// Bytes the header and bits take on disk, in whole pages.
    pub fn bytes_on_disk(&self) -> u64 {
        bitmap_bytes_on_disk(self.chunks())
    }

    pub fn is_stale(&self) -> bool {
        self.state & state::STALE != 0
    }
}

fn check_cluster_fields(sb: &BitmapSuper) -> Result<(), FormatError> {
    if sb.nodes == 0 || sb.nodes > MAX_CLUSTER_NODES {
        return Err(FormatError::Bitmap(format!(
            "clustered bitmap with {} node slots (1 to {MAX_CLUSTER_NODES} supported)",
            sb.nodes
        )));
    }
    if !sb.cluster_name.contains(&0) {
        return Err(FormatError::Bitmap(
            "cluster name is not NUL-terminated".into(),
        ));
    }
    Ok(())
}

/// Bits needed to cover `sync_sectors` with chunks of `chunk_bytes`.
///
/// Computed in u128: `sync_size` comes off disk, and a header claiming more than 2^55 sectors
/// must not wrap into a small bitmap (the kernel divides in sectors for the same reason).
pub fn bitmap_chunks(sync_sectors: u64, chunk_bytes: u64) -> u64 {
    assert!(chunk_bytes > 0, "bitmap chunk of 0 bytes");
    let chunks = (u128::from(sync_sectors) * 512).div_ceil(u128::from(chunk_bytes));
    u64::try_from(chunks).unwrap_or(u64::MAX)
}

/// Header plus `chunks` bits, rounded up to whole pages.
pub fn bitmap_bytes_on_disk(chunks: u64) -> u64 {
    (BITMAP_HEADER_BYTES as u64 + chunks.div_ceil(8)).div_ceil(BITMAP_PAGE_BYTES as u64)
        * BITMAP_PAGE_BYTES as u64
}

/// The smallest chunk (bytes, a power of two of at least 4 KiB) whose bitmap for
/// `sync_sectors` fits in `room_sectors` (mdadm's rule, which counts one bit more than needed).
pub fn min_bitmap_chunk(sync_sectors: u64, room_sectors: u64) -> Option<u64> {
    let room_bytes = room_sectors.checked_mul(512)?;
    let max_bits = room_bytes.checked_sub(BITMAP_HEADER_BYTES as u64)? * 8;
    if max_bits == 0 {
        return None;
    }
    let mut chunk: u64 = 4096;
    let mut bits = sync_sectors * 512 / chunk + 1;
    while bits > max_bits {
        chunk *= 2;
        bits = bits.div_ceil(2);
    }
    Some(chunk)
}

/// mdadm's default chunk for an internal bitmap created in `room_sectors`: the smallest that
/// fits (looking at no more than 128 KiB of room), but at least 64 MiB.
pub fn default_bitmap_chunk(sync_sectors: u64, room_sectors: u64) -> Option<u64> {
    min_bitmap_chunk(sync_sectors, room_sectors.min(256)).map(|c| c.max(DEFAULT_MIN_CHUNK_BYTES))
}

/// Whether bit `j` is set in `bits` (the bytes after the header).
pub fn bit_is_set(bits: &[u8], j: u64) -> bool {
    bits[(j / 8) as usize] & (1 << (j % 8)) != 0
}

/// Set bits among the first `chunks` of `bits` (what `mdadm -X` reports as dirty).
pub fn count_dirty(bits: &[u8], chunks: u64) -> u64 {
    (0..chunks).filter(|&j| bit_is_set(bits, j)).count() as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trips_at_md_offsets() {
        let mut sb = BitmapSuper::new(*b"0123456789abcdef", 2 << 21, 64 << 20, 8);
        sb.events = 42;
        sb.events_cleared = 40;
        let b = sb.encode();
        assert_eq!(&b[0..4], b"bitm");
        assert_eq!(u32::from_le_bytes(b[52..56].try_into().unwrap()), 64 << 20);
        assert_eq!(u64::from_le_bytes(b[40..48].try_into().unwrap()), 2 << 21);
        assert_eq!(BitmapSuper::decode(&b).unwrap(), sb);
    }

    #[test]
    fn decode_refuses_what_the_kernel_refuses() {
        let good = BitmapSuper::new([7; 16], 1 << 20, 65536, 8);
        let mut bad_chunk = good.clone();
        bad_chunk.chunksize = 3000;
        let mut bad_version = good.clone();
        bad_version.version = 9;
        let mut clustered = good.clone();
        clustered.version = 5;
        let mut no_nul = good.clone().clustered(2, "c").unwrap();
        no_nul.cluster_name = [b'x'; CLUSTER_NAME_BYTES];
        let mut too_many = good.clone().clustered(2, "c").unwrap();
        too_many.nodes = MAX_CLUSTER_NODES + 1;
        let mut behind = good.clone();
        behind.write_behind = MAX_WRITE_BEHIND + 1;
        // Slots whose total size wraps 64 bits (found by the fuzz smoke).
        let mut huge = good.clone().clustered(MAX_CLUSTER_NODES, "c").unwrap();
        huge.sync_size = u64::MAX;
        huge.chunksize = 512;
        for bad in [
            bad_chunk,
            bad_version,
            clustered,
            no_nul,
            too_many,
            behind,
            huge,
        ] {
            assert!(BitmapSuper::decode(&bad.encode()).is_err(), "{bad:?}");
        }
        let mut raw = good.encode();
        raw[0] ^= 1;
        assert!(matches!(
            BitmapSuper::decode(&raw),
            Err(FormatError::Bitmap(_))
        ));
        assert_eq!(
            BitmapSuper::decode(&raw[..100]),
            Err(FormatError::Truncated)
        );
    }

    #[test]
    fn clustered_header_round_trips_at_md_offsets() {
        let sb = BitmapSuper::new([3; 16], 1 << 21, 1 << 20, 8)
            .clustered(4, "lab")
            .unwrap();
        let b = sb.encode();
        assert_eq!(u32::from_le_bytes(b[4..8].try_into().unwrap()), 5);
        assert_eq!(u32::from_le_bytes(b[68..72].try_into().unwrap()), 4);
        assert_eq!(&b[72..76], b"lab\0");
        assert!(b[76..].iter().all(|&x| x == 0));
        let back = BitmapSuper::decode(&b).unwrap();
        assert_eq!(back, sb);
        assert_eq!(back.cluster_name(), "lab");
        assert_eq!(back.slots(), 4);
        // A plain header stays version 4 with the cluster fields zero, one slot.
        let plain = BitmapSuper::new([3; 16], 1 << 21, 1 << 20, 8);
        assert_eq!(&plain.encode()[68..136], &[0u8; 68][..]);
        assert_eq!(plain.slots(), 1);
        assert!(BitmapSuper::new([3; 16], 8, 4096, 8)
            .clustered(0, "x")
            .is_err());
        assert!(BitmapSuper::new([3; 16], 8, 4096, 8)
            .clustered(2, &"n".repeat(64))
            .is_err());
    }

    #[test]
    fn slots_step_by_the_page_rounded_slot_size() {
        // 1 GiB at 64 KiB chunks: 16384 bits = 2048 bytes + 256 header: one page per slot.
        let small = BitmapSuper::new([1; 16], 2 << 20, 64 << 10, 8)
            .clustered(3, "c")
            .unwrap();
        assert_eq!(small.slot_offset(1), 4096);
        assert_eq!(small.slot_offset(2), 8192);
        assert_eq!(small.all_slots_bytes(), 3 * 4096);
        // 4 GiB at 4 KiB chunks: 2^20 bits = 131072 bytes + 256: 33 pages per slot.
        let big = BitmapSuper::new([1; 16], 8 << 20, 4096, 8)
            .clustered(2, "c")
            .unwrap();
        assert_eq!(big.slot_offset(1), 33 * 4096);
    }

    #[test]
    fn mdadm_default_chunk_sizing() {
        // ≤ 8 GiB members reserve 4 KiB: a 1 GiB component gets the 64 MiB floor.
        assert_eq!(default_bitmap_chunk(2 << 20, 8), Some(64 << 20));
        // A 4 TB component in 128 KiB of room: still 64 MiB (reference §5.4).
        let four_tb = 4_000_000_000_000u64 / 512;
        assert_eq!(default_bitmap_chunk(four_tb, 256), Some(64 << 20));
        // 100 TiB needs more than 1 M bits: the chunk doubles.
        let big = 100u64 << 31;
        assert_eq!(default_bitmap_chunk(big, 256), Some(128 << 20));
        // An explicit small chunk must still fit the room.
        assert_eq!(min_bitmap_chunk(2 << 20, 8), Some(64 << 10));
        assert_eq!(min_bitmap_chunk(2 << 20, 0), None);
    }

    #[test]
    fn sizes_and_bit_order() {
        assert_eq!(bitmap_chunks(1000, 4096), 125);
        assert_eq!(bitmap_chunks(1001, 4096), 126);
        assert_eq!(bitmap_bytes_on_disk(16), 4096);
        assert_eq!(bitmap_bytes_on_disk((4096 - 256) * 8 + 1), 8192);
        let bits = [0b0000_0101u8, 0x80];
        assert!(bit_is_set(&bits, 0) && !bit_is_set(&bits, 1) && bit_is_set(&bits, 2));
        assert!(bit_is_set(&bits, 15));
        assert_eq!(count_dirty(&bits, 16), 3);
        assert_eq!(count_dirty(&bits, 15), 2);
    }
}
