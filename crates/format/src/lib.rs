//! Linux md **v1.2** superblock: encode, decode and validate (pure, no I/O).
//!
//! Facts come from `shared/reference/md-format.md` §1 (written from the kernel and mdadm
//! sources in our own words); nothing here is copied from GPL code.
//!
//! # Where it lives
//!
//! v1.2 puts the superblock at sector 8 (byte 4096) of every member ([`SB_OFFSET_SECTORS`]).
//! The minor version is not stored; it is implied by the position and by `super_offset`.
//! Readers read [`SB_BYTES`] = 4096 bytes there; the meaningful length is `256 + 2*max_dev`.
//!
//! # Layout (all integers little-endian, offsets in bytes)
//!
//! | off | size | field | notes |
//! |---|---|---|---|
//! | 0 | 4 | magic | [`MD_SB_MAGIC`] = 0xa92b4efc (bytes `fc 4e 2b a9`) |
//! | 4 | 4 | major_version | 1 |
//! | 8 | 4 | feature_map | [`feature`] bits; anything outside [`feature::KNOWN`] is rejected |
//! | 12 | 4 | pad0 | must be zero |
//! | 16 | 16 | set_uuid | array UUID, raw bytes |
//! | 32 | 32 | set_name | NUL padded (mdadm: `homehost:name`) |
//! | 64 | 8 | ctime | low 40 bits seconds, high 24 bits µs (written 0) |
//! | 72 | 4 | level | signed: -1 linear, 0, 1, 4, 5, 6, 10 |
//! | 76 | 4 | layout | per-level algorithm |
//! | 80 | 8 | size | component sectors used per device |
//! | 88 | 4 | chunksize | sectors |
//! | 92 | 4 | raid_disks | |
//! | 96 | 4 | bitmap_offset | signed sectors from the superblock (union with PPL offset/size) |
//! | 100 | 4 | new_level | reshape only |
//! | 104 | 8 | reshape_position | reshape only |
//! | 112 | 4 | delta_disks | signed, reshape only |
//! | 116 | 4 | new_layout | reshape only |
//! | 120 | 4 | new_chunk | reshape only |
//! | 124 | 4 | new_offset | signed, with NEW_OFFSET |
//! | 128 | 8 | data_offset | sectors from device start |
//! | 136 | 8 | data_size | sectors usable for data (≥ 10) |
//! | 144 | 8 | super_offset | sector of this superblock (8 for v1.2) |
//! | 152 | 8 | recovery_offset | or journal_tail on a journal device |
//! | 160 | 4 | dev_number | index of this device in `dev_roles` |
//! | 164 | 4 | cnt_corrected_read | |
//! | 168 | 16 | device_uuid | |
//! | 184 | 1 | devflags | 1 WriteMostly, 2 FailFast |
//! | 185 | 1 | bblog_shift | |
//! | 186 | 2 | bblog_size | sectors (mdadm: 8) |
//! | 188 | 4 | bblog_offset | signed sectors from the superblock |
//! | 192 | 8 | utime | like ctime |
//! | 200 | 8 | events | update counter |
//! | 208 | 8 | resync_offset | [`MAX_SECTOR`] = clean, 0 = dirty |
//! | 216 | 4 | sb_csum | see [`sb_csum`] |
//! | 220 | 4 | max_dev | entries in `dev_roles` (≤ [`MAX_DEV_LIMIT`] = 1920) |
//! | 224 | 32 | pad3 | must be zero (newer kernels put logical_block_size at 224) |
//! | 256 | 2·max_dev | dev_roles | le16 per dev_number: role, or [`ROLE_SPARE`], [`ROLE_FAULTY`], [`ROLE_JOURNAL`] |
//!
//! Everything after `256 + 2*max_dev` up to 4096 is written as zero.
//!
//! # Checksum
//!
//! [`sb_csum`]: over the first `256 + 2*max_dev` bytes with the csum field taken as zero, add
//! every LE u32 into a u64 (a trailing LE u16 when `max_dev` is odd), then fold once:
//! `(low32 + high32) mod 2^32`.
//!
//! # Acceptance (like the kernel's loader)
//!
//! [`Superblock::decode`] = [`Superblock::parse`] (magic, major, max_dev, length, checksum,
//! pads) followed by [`Superblock::validate`] (super_offset, feature bits, data_size,
//! data_offset, RAID0_LAYOUT only with level 0, PPL combinations, reshape → unsupported).
#![forbid(unsafe_code)]

mod badblocks;
mod bitmap;
mod create;
pub mod ext4_guide;
mod integrity;
pub mod jbd2_watch;
mod journal;
mod used_map;
mod util;

pub use badblocks::{
    decode_bad_blocks, encode_bad_blocks, BadRange, BBLOG_MAX_ENTRIES, BBLOG_MAX_LEN,
};
pub use bitmap::{
    bit_is_set, bitmap_bytes_on_disk, bitmap_chunks, count_dirty, default_bitmap_chunk,
    min_bitmap_chunk, state as bitmap_state, BitmapSuper, BITMAP_HEADER_BYTES, BITMAP_MAGIC,
    BITMAP_OFFSET_SECTORS, BITMAP_PAGE_BYTES, BITMAP_VERSION, BITMAP_VERSION_CLUSTERED,
    CLUSTER_NAME_BYTES, DEFAULT_DAEMON_SLEEP, MAX_CLUSTER_NODES,
};
pub use create::{CreateParams, BBLOG_SECTORS};
pub use integrity::{
    record_of, record_seed, table_copies, TableBlock, Zone, FEATURE_INTEGRITY, RECORDS_PER_TABLE,
    RECORD_BLOCK, TABLE_MAGIC,
};
pub use journal::{
    crc32c_raw, journal_seed, MetaBlock, PageChecksums, Payload, JOURNAL_BLOCK, JOURNAL_MAGIC,
    JOURNAL_VERSION, PAGE_SECTORS, PAYLOAD_DATA, PAYLOAD_FLUSH, PAYLOAD_PARITY,
};
pub use used_map::{
    choose_region_bytes, node_map_offset, used_map_bytes, used_map_offset_sectors, UsedMapHeader,
    USED_MAP_FLAG_GUIDED, USED_MAP_FLAG_RESYNC_OWED, USED_MAP_FLAG_UNGUIDED, USED_MAP_HEADER_BYTES,
};
pub use util::{
    bm_space, default_data_offset, format_uuid, format_uuid_mdadm, ironraid_time, level_name,
    max_dev_for, md_time, parse_uuid, written_by_md, MD_TIME_SECS_MASK,
};

/// v1.2 superblock position in sectors (byte 4096).
pub const SB_OFFSET_SECTORS: u64 = 8;
/// Read/write unit for the superblock.
pub const SB_BYTES: usize = 4096;
/// Size of the fixed part before `dev_roles`.
pub const SB_FIXED_BYTES: usize = 256;
/// `md` superblock magic.
pub const MD_SB_MAGIC: u32 = 0xa92b_4efc;
/// Largest `max_dev` that fits in 4 KiB: (4096 - 256) / 2.
pub const MAX_DEV_LIMIT: u32 = 1920;
/// `resync_offset` value meaning "clean / fully in sync" (kernel `MaxSector`).
pub const MAX_SECTOR: u64 = u64::MAX;
/// Sectors reserved for the superblock itself (v1.2 requires `data_offset >= super_offset + 8`).
pub const SB_RESERVED_SECTORS: u64 = 8;

/// Role value: spare.
pub const ROLE_SPARE: u16 = 0xffff;
/// Role value: faulty.
pub const ROLE_FAULTY: u16 = 0xfffe;
/// Role value: raid5-cache journal device.
pub const ROLE_JOURNAL: u16 = 0xfffd;
/// Any role `>=` this is not a data role.
pub const ROLE_MAX: u16 = 0xff00;

/// `devflags` bit: write-mostly.
pub const DEVFLAG_WRITE_MOSTLY: u8 = 1;
/// `devflags` bit: fail-fast.
pub const DEVFLAG_FAILFAST: u8 = 2;
/// `devflags` bit on a journal device (ironraid's, md ignores it): the array starts its
/// journal in write-back mode.
pub const DEVFLAG_JOURNAL_WRITE_BACK: u8 = 0x80;

/// `feature_map` bits (reference §1.3).
pub mod feature {
    /// Internal write-intent bitmap at `bitmap_offset`.
    pub const BITMAP_OFFSET: u32 = 0x1;
    /// This device is partially rebuilt; honour `recovery_offset`.
    pub const RECOVERY_OFFSET: u32 = 0x2;
    /// Reshape fields are valid.
    pub const RESHAPE_ACTIVE: u32 = 0x4;
    /// Bad-block list is non-empty.
    pub const BAD_BLOCKS: u32 = 0x8;
    /// This device replaces the active device with the same role.
    pub const REPLACEMENT: u32 = 0x10;
    /// Reshape runs backwards.
    pub const RESHAPE_BACKWARDS: u32 = 0x20;
    /// `new_offset` must be honoured.
    pub const NEW_OFFSET: u32 = 0x40;
    /// Ongoing recovery is bitmap guided.
    pub const RECOVERY_BITMAP: u32 = 0x80;
    /// md-cluster array.
    pub const CLUSTERED: u32 = 0x100;
    /// Array has a raid5-cache journal.
    pub const JOURNAL: u32 = 0x200;
    /// Partial parity log.
    pub const PPL: u32 = 0x400;
    /// PPL area used as a ring of several PPLs.
    pub const MULTIPLE_PPLS: u32 = 0x800;
    /// `layout` meaningful for RAID0 (only with level 0).
    pub const RAID0_LAYOUT: u32 = 0x1000;
    /// All bits the kernel knows.
    pub const KNOWN: u32 = 0x1fff;
}

/// Why a superblock was refused. Messages are one line and name the reason; callers
/// prefix the member path.
#[derive(Debug, thiserror::Error, PartialEq, Eq, Clone)]
pub enum FormatError {
    #[error("no md superblock (bad magic)")]
    NoSuperblock,
    #[error("unsupported md superblock major version {0} (expected 1)")]
    BadMajor(u32),
    #[error("md superblock checksum mismatch: stored {stored:#010x}, computed {computed:#010x}")]
    BadChecksum { stored: u32, computed: u32 },
    #[error("md superblock padding (pad0/pad3) is not zero")]
    NonZeroPad,
    #[error("md superblock super_offset {0} does not match v1.2 position 8")]
    BadSuperOffset(u64),
    #[error("md superblock has unknown feature bits {0:#x}")]
    UnknownFeatures(u32),
    #[error("md superblock feature bits conflict: {0}")]
    BadFeatureCombination(String),
    #[error("md superblock max_dev {0} exceeds 1920")]
    BadMaxDev(u32),
    #[error("md superblock data_size {0} is too small (< 10 sectors)")]
    BadDataSize(u64),
    #[error("md superblock data_offset {0} overlaps the superblock")]
    BadDataOffset(u64),
    #[error("unsupported md array: {0}")]
    Unsupported(String),
    #[error("md write-intent bitmap: {0}")]
    Bitmap(String),
    #[error("md journal record: {0}")]
    Journal(String),
    #[error("integrity table: {0}")]
    Integrity(String),
    #[error("used-region map: {0}")]
    UsedMap(String),
    #[error("md superblock buffer truncated")]
    Truncated,
    #[error("device too small for md data area: need {need} sectors, have {have}")]
    DeviceTooSmall { need: u64, have: u64 },
}

/// Role of a device in the array (decoded `dev_roles` entry).
///
/// Values in `0xff00..=0xfffc` other than the named ones are not data roles; like the
/// kernel they are treated as [`DevRole::Spare`] (the raw table keeps them intact).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DevRole {
    /// Active data slot `0..raid_disks`.
    Active(u16),
    Spare,
    Faulty,
    Journal,
}

impl DevRole {
    /// On-disk value.
    pub fn to_raw(self) -> u16 {
        match self {
            DevRole::Active(r) => r,
            DevRole::Spare => ROLE_SPARE,
            DevRole::Faulty => ROLE_FAULTY,
            DevRole::Journal => ROLE_JOURNAL,
        }
    }

    /// Decode an on-disk value.
    pub fn from_raw(v: u16) -> DevRole {
        match v {
            ROLE_FAULTY => DevRole::Faulty,
            ROLE_JOURNAL => DevRole::Journal,
            v if v < ROLE_MAX => DevRole::Active(v),
            _ => DevRole::Spare,
        }
    }
}

/// Decoded v1.2 superblock. Field names and units follow the on-disk table above.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Superblock {
    pub feature_map: u32,
    pub set_uuid: [u8; 16],
    /// Up to 32 bytes, NUL padded on disk. Decoded up to the first NUL (lossy UTF-8);
    /// encoding truncates to 32 bytes at a char boundary.
    pub set_name: String,
    /// Raw on-disk value (low 40 bits seconds).
    pub ctime: u64,
    pub level: i32,
    pub layout: u32,
    /// Component sectors.
    pub size: u64,
    /// Sectors.
    pub chunksize: u32,
    pub raid_disks: u32,
    pub bitmap_offset: i32,
    pub new_level: i32,
    pub reshape_position: u64,
    pub delta_disks: i32,
    pub new_layout: u32,
    pub new_chunk: u32,
    pub new_offset: i32,
    pub data_offset: u64,
    pub data_size: u64,
    pub super_offset: u64,
    pub recovery_offset: u64,
    pub dev_number: u32,
    pub cnt_corrected_read: u32,
    pub device_uuid: [u8; 16],
    pub devflags: u8,
    pub bblog_shift: u8,
    pub bblog_size: u16,
    pub bblog_offset: i32,
    /// Raw on-disk value (low 40 bits seconds).
    pub utime: u64,
    pub events: u64,
    pub resync_offset: u64,
    /// Number of `dev_roles` entries on disk (≤ 1920). `encode` writes exactly `max_dev`
    /// entries: ones missing from `dev_roles` as spare, extra ones dropped.
    pub max_dev: u32,
    /// Raw le16 role per dev_number; `len() == max_dev` after decode.
    pub dev_roles: Vec<u16>,
}

// Little-endian readers on a slice known to be long enough.
fn rd_u16(b: &[u8], off: usize) -> u16 {
    u16::from_le_bytes([b[off], b[off + 1]])
}
fn rd_u32(b: &[u8], off: usize) -> u32 {
    u32::from_le_bytes([b[off], b[off + 1], b[off + 2], b[off + 3]])
}
fn rd_i32(b: &[u8], off: usize) -> i32 {
    rd_u32(b, off) as i32
}
fn rd_u64(b: &[u8], off: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[off..off + 8]);
    u64::from_le_bytes(a)
}
fn rd_16(b: &[u8], off: usize) -> [u8; 16] {
    let mut a = [0u8; 16];
    a.copy_from_slice(&b[off..off + 16]);
    a
}
fn wr(b: &mut [u8], off: usize, bytes: &[u8]) {
    b[off..off + bytes.len()].copy_from_slice(bytes);
}

/// Byte offset of `sb_csum`.
pub const CSUM_OFFSET: usize = 216;
/// Byte offset of `max_dev`.
pub const MAX_DEV_OFFSET: usize = 220;

/// mdadm/kernel checksum of a superblock buffer.
///
/// Covers `256 + 2*max_dev` bytes (max_dev read from offset 220), with the 4 bytes at 216
/// taken as zero: the LE u32 words are summed into a u64, a trailing LE u16 (odd `max_dev`)
/// is added, and the sum is folded once (`low32 + high32`, truncated). Never panics: if the
/// buffer is shorter than the covered length (or max_dev is absurd) only the bytes present
/// are summed (a trailing odd byte as a u8) — callers validating a superblock check the
/// length first.
pub fn sb_csum(buf: &[u8]) -> u32 {
    let max_dev = if buf.len() >= MAX_DEV_OFFSET + 4 {
        rd_u32(buf, MAX_DEV_OFFSET) as usize
    } else {
        0
    };
    let want = SB_FIXED_BYTES.saturating_add(max_dev.saturating_mul(2));
    let len = want.min(buf.len());
    let data = &buf[..len];
    let mut sum: u64 = 0;
    let mut words = data.chunks_exact(4);
    for (i, w) in words.by_ref().enumerate() {
        if i * 4 == CSUM_OFFSET {
            continue;
        }
        sum += u64::from(u32::from_le_bytes([w[0], w[1], w[2], w[3]]));
    }
    let rest = words.remainder();
    match rest.len() {
        0 => {}
        1 => sum += u64::from(rest[0]),
        2 => sum += u64::from(u16::from_le_bytes([rest[0], rest[1]])),
        _ => sum += u64::from(u32::from_le_bytes([rest[0], rest[1], rest[2], 0])),
    }
    ((sum & 0xffff_ffff) + (sum >> 32)) as u32
}

impl Superblock {
    /// Encode into a 4096-byte block: fixed part, `max_dev` roles, zero padding, and
    /// `sb_csum` computed over `256 + 2*max_dev` bytes.
    ///
    /// `max_dev` is clamped to 1920; roles missing from `dev_roles` are written as spare.
    /// pad0/pad3 are always zero. No validation is done here: see [`Superblock::validate`].
    pub fn encode(&self) -> [u8; SB_BYTES] {
        let mut b = [0u8; SB_BYTES];
        let max_dev = self.max_dev.min(MAX_DEV_LIMIT);
        wr(&mut b, 0, &MD_SB_MAGIC.to_le_bytes());
        wr(&mut b, 4, &1u32.to_le_bytes());
        wr(&mut b, 8, &self.feature_map.to_le_bytes());
        wr(&mut b, 16, &self.set_uuid);
        let name = truncate_utf8(&self.set_name, 32);
        wr(&mut b, 32, name.as_bytes());
        wr(&mut b, 64, &self.ctime.to_le_bytes());
        wr(&mut b, 72, &self.level.to_le_bytes());
        wr(&mut b, 76, &self.layout.to_le_bytes());
        wr(&mut b, 80, &self.size.to_le_bytes());
        wr(&mut b, 88, &self.chunksize.to_le_bytes());
        wr(&mut b, 92, &self.raid_disks.to_le_bytes());
        wr(&mut b, 96, &self.bitmap_offset.to_le_bytes());
        wr(&mut b, 100, &self.new_level.to_le_bytes());
        wr(&mut b, 104, &self.reshape_position.to_le_bytes());
        wr(&mut b, 112, &self.delta_disks.to_le_bytes());
        wr(&mut b, 116, &self.new_layout.to_le_bytes());
        wr(&mut b, 120, &self.new_chunk.to_le_bytes());
        wr(&mut b, 124, &self.new_offset.to_le_bytes());
        wr(&mut b, 128, &self.data_offset.to_le_bytes());
        wr(&mut b, 136, &self.data_size.to_le_bytes());
        wr(&mut b, 144, &self.super_offset.to_le_bytes());
        wr(&mut b, 152, &self.recovery_offset.to_le_bytes());
        wr(&mut b, 160, &self.dev_number.to_le_bytes());
        wr(&mut b, 164, &self.cnt_corrected_read.to_le_bytes());
        wr(&mut b, 168, &self.device_uuid);
        b[184] = self.devflags;
        b[185] = self.bblog_shift;
        wr(&mut b, 186, &self.bblog_size.to_le_bytes());
        wr(&mut b, 188, &self.bblog_offset.to_le_bytes());
        wr(&mut b, 192, &self.utime.to_le_bytes());
        wr(&mut b, 200, &self.events.to_le_bytes());
        wr(&mut b, 208, &self.resync_offset.to_le_bytes());
        wr(&mut b, MAX_DEV_OFFSET, &max_dev.to_le_bytes());
        for i in 0..max_dev as usize {
            let role = self.dev_roles.get(i).copied().unwrap_or(ROLE_SPARE);
            wr(&mut b, SB_FIXED_BYTES + 2 * i, &role.to_le_bytes());
        }
        let csum = sb_csum(&b);
        wr(&mut b, CSUM_OFFSET, &csum.to_le_bytes());
        b
    }

    /// Decode and validate like the kernel's v1 loader: [`Superblock::parse`] then
    /// [`Superblock::validate`]. `buf` is normally the 4096 bytes at sector 8; a shorter
    /// buffer is accepted if it covers `256 + 2*max_dev` bytes.
    pub fn decode(buf: &[u8]) -> Result<Superblock, FormatError> {
        let sb = Self::parse(buf)?;
        sb.validate()?;
        Ok(sb)
    }

    /// Structural decode only: magic (→ [`FormatError::NoSuperblock`]), major version,
    /// `max_dev <= 1920`, buffer length, checksum, pad0/pad3 zero. Does not check the
    /// semantic rules of [`Superblock::validate`], so tools can display e.g. a reshaping
    /// array.
    pub fn parse(buf: &[u8]) -> Result<Superblock, FormatError> {
        if buf.len() < 4 {
            return Err(FormatError::Truncated);
        }
        if rd_u32(buf, 0) != MD_SB_MAGIC {
            return Err(FormatError::NoSuperblock);
        }
        if buf.len() < SB_FIXED_BYTES {
            return Err(FormatError::Truncated);
        }
        let major = rd_u32(buf, 4);
        if major != 1 {
            return Err(FormatError::BadMajor(major));
        }
        let max_dev = rd_u32(buf, MAX_DEV_OFFSET);
        if max_dev > MAX_DEV_LIMIT {
            return Err(FormatError::BadMaxDev(max_dev));
        }
        let covered = SB_FIXED_BYTES + 2 * max_dev as usize;
        if buf.len() < covered {
            return Err(FormatError::Truncated);
        }
        let stored = rd_u32(buf, CSUM_OFFSET);
        let computed = sb_csum(buf);
        if stored != computed {
            return Err(FormatError::BadChecksum { stored, computed });
        }
        if rd_u32(buf, 12) != 0 || buf[224..256].iter().any(|&x| x != 0) {
            return Err(FormatError::NonZeroPad);
        }
        let name_raw = &buf[32..64];
        let name_len = name_raw.iter().position(|&c| c == 0).unwrap_or(32);
        let set_name = String::from_utf8_lossy(&name_raw[..name_len]).into_owned();
        let dev_roles = (0..max_dev as usize)
            .map(|i| rd_u16(buf, SB_FIXED_BYTES + 2 * i))
            .collect();
        Ok(Superblock {
            feature_map: rd_u32(buf, 8),
            set_uuid: rd_16(buf, 16),
            set_name,
            ctime: rd_u64(buf, 64),
            level: rd_i32(buf, 72),
            layout: rd_u32(buf, 76),
            size: rd_u64(buf, 80),
            chunksize: rd_u32(buf, 88),
            raid_disks: rd_u32(buf, 92),
            bitmap_offset: rd_i32(buf, 96),
            new_level: rd_i32(buf, 100),
            reshape_position: rd_u64(buf, 104),
            delta_disks: rd_i32(buf, 112),
            new_layout: rd_u32(buf, 116),
            new_chunk: rd_u32(buf, 120),
            new_offset: rd_i32(buf, 124),
            data_offset: rd_u64(buf, 128),
            data_size: rd_u64(buf, 136),
            super_offset: rd_u64(buf, 144),
            recovery_offset: rd_u64(buf, 152),
            dev_number: rd_u32(buf, 160),
            cnt_corrected_read: rd_u32(buf, 164),
            device_uuid: rd_16(buf, 168),
            devflags: buf[184],
            bblog_shift: buf[185],
            bblog_size: rd_u16(buf, 186),
            bblog_offset: rd_i32(buf, 188),
            utime: rd_u64(buf, 192),
            events: rd_u64(buf, 200),
            resync_offset: rd_u64(buf, 208),
            max_dev,
            dev_roles,
        })
    }

    /// Semantic checks of the kernel's loader that do not need the raw bytes, plus
    /// ironraid's own refusal of reshapes. Use before writing a superblock, too.
    pub fn validate(&self) -> Result<(), FormatError> {
        if self.max_dev > MAX_DEV_LIMIT {
            return Err(FormatError::BadMaxDev(self.max_dev));
        }
        if self.super_offset != SB_OFFSET_SECTORS {
            return Err(FormatError::BadSuperOffset(self.super_offset));
        }
        let unknown = self.feature_map & !(feature::KNOWN | FEATURE_INTEGRITY);
        if unknown != 0 {
            return Err(FormatError::UnknownFeatures(unknown));
        }
        if self.data_size < 10 {
            return Err(FormatError::BadDataSize(self.data_size));
        }
        if self.data_offset < self.super_offset + SB_RESERVED_SECTORS {
            return Err(FormatError::BadDataOffset(self.data_offset));
        }
        let f = self.feature_map;
        if f & feature::RAID0_LAYOUT != 0 && self.level != 0 {
            return Err(FormatError::BadFeatureCombination(format!(
                "RAID0_LAYOUT with level {}",
                self.level
            )));
        }
        let ppl = f & (feature::PPL | feature::MULTIPLE_PPLS);
        if ppl == feature::PPL | feature::MULTIPLE_PPLS {
            return Err(FormatError::BadFeatureCombination(
                "PPL and MULTIPLE_PPLS both set".into(),
            ));
        }
        if ppl != 0 && f & (feature::BITMAP_OFFSET | feature::JOURNAL) != 0 {
            return Err(FormatError::BadFeatureCombination(
                "PPL together with bitmap or journal".into(),
            ));
        }
        if f & feature::RESHAPE_ACTIVE != 0 {
            return Err(FormatError::Unsupported(format!(
                "reshape in progress (position {}, level {} -> {}, delta_disks {})",
                self.reshape_position, self.level, self.new_level, self.delta_disks
            )));
        }
        Ok(())
    }

    /// Role of this device: `dev_roles[dev_number]` (spare if out of range, like the kernel).
    pub fn role(&self) -> DevRole {
        self.role_of(self.dev_number)
    }

    /// Role recorded for `dev_number` (spare if out of range).
    pub fn role_of(&self, dev_number: u32) -> DevRole {
        if dev_number >= self.max_dev {
            return DevRole::Spare;
        }
        self.dev_roles
            .get(dev_number as usize)
            .map_or(DevRole::Spare, |&r| DevRole::from_raw(r))
    }

    /// Array marked clean (`resync_offset == MAX_SECTOR`).
    pub fn is_clean(&self) -> bool {
        self.resync_offset == MAX_SECTOR
    }

    /// Creation time, seconds since the epoch.
    pub fn ctime_secs(&self) -> u64 {
        self.ctime & MD_TIME_SECS_MASK
    }

    /// Last update time, seconds since the epoch.
    pub fn utime_secs(&self) -> u64 {
        self.utime & MD_TIME_SECS_MASK
    }

    /// Covered length `256 + 2*max_dev` (what the checksum spans).
    pub fn sb_len(&self) -> usize {
        SB_FIXED_BYTES + 2 * self.max_dev.min(MAX_DEV_LIMIT) as usize
    }

    /// Component size of this member as seen by the kernel: `data_offset + data_size`
    /// sectors are needed on the device.
    pub fn required_device_sectors(&self) -> u64 {
        self.data_offset.saturating_add(self.data_size)
    }

    /// The kernel's remaining load check, which needs the device size: the data area
    /// (`data_offset + data_size`) must fit in `device_sectors`.
    pub fn check_fits(&self, device_sectors: u64) -> Result<(), FormatError> {
        let need = self.required_device_sectors();
        if need > device_sectors {
            return Err(FormatError::DeviceTooSmall {
                need,
                have: device_sectors,
            });
        }
        Ok(())
    }

    /// Set the role of `dev_number`, growing `dev_roles`/`max_dev` (new entries spare)
    /// if needed, as the kernel does when a higher dev_number appears.
    pub fn set_role(&mut self, dev_number: u32, role: DevRole) {
        let idx = dev_number as usize;
        if idx >= self.dev_roles.len() {
            self.dev_roles.resize(idx + 1, ROLE_SPARE);
        }
        self.dev_roles[idx] = role.to_raw();
        if self.max_dev < dev_number + 1 {
            self.max_dev = dev_number + 1;
        }
    }
}

/// Longest prefix of `s` of at most `max` bytes ending at a char boundary.
fn truncate_utf8(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

#[cfg(test)]
mod tests;
