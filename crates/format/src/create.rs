//! Building a fresh superblock the way `mdadm --create` lays one out (reference §1.4, §1.6).
//!
//! This is the one place superblocks are made from nothing: the engine's `create` computes the
//! array-wide choices (data offset, component size, roles) and asks for one superblock per
//! member here, so the on-disk layout rules live next to the encoder that writes them.

use crate::{
    bm_space, feature, ironraid_time, max_dev_for, md_time, FormatError, Superblock, MAX_SECTOR,
    ROLE_SPARE, SB_OFFSET_SECTORS, SB_RESERVED_SECTORS,
};

/// Sectors mdadm reserves for the bad-block log (4 KiB = 512 entries).
pub const BBLOG_SECTORS: u16 = 8;

/// Parameters of one member's superblock at array creation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CreateParams {
    /// Array UUID.
    pub set_uuid: [u8; 16],
    /// Array name (mdadm writes `homehost:name`); at most 32 bytes are stored.
    pub name: String,
    /// Creation time in seconds since the epoch (also used as utime).
    pub ctime_secs: u64,
    /// -1 linear, 0, 1, 4, 5, 6, 10.
    pub level: i32,
    /// Level-specific layout (RAID0: mdadm writes 1 = original; RAID10 n2 = 0x102).
    pub layout: u32,
    /// Chunk in sectors (0 for RAID1; "rounding" for linear).
    pub chunk_sectors: u32,
    /// Number of active slots.
    pub raid_disks: u32,
    /// Component sectors used per device (`size` field).
    pub size: u64,
    /// First data sector on this device (see [`crate::default_data_offset`]).
    pub data_offset: u64,
    /// Data sectors available on this device after `data_offset`.
    pub data_size: u64,
    /// This device's slot in `roles`.
    pub dev_number: u32,
    /// This device's UUID.
    pub device_uuid: [u8; 16],
    /// Raw role per dev_number for every member (active roles, spares as 0xffff).
    pub roles: Vec<u16>,
    /// Skip the initial sync (`resync_offset = MAX_SECTOR`); otherwise 0 = needs sync.
    /// Levels without redundancy (0, linear) are always written clean.
    pub assume_clean: bool,
    /// Reserve and announce an internal write-intent bitmap at +8 sectors.
    pub internal_bitmap: bool,
    /// The array has a raid5-cache journal device (feature bit on every member).
    pub journal: bool,
    /// Per-block CRC32C records in an integrity zone past `size` ([`crate::FEATURE_INTEGRITY`]).
    pub integrity: bool,
    /// Device size (sectors) the metadata area (bitmap space, then bad-block log) is laid out
    /// for. `create` lays it out once per array, for the smallest active member (as it does
    /// the data offset), and uses that layout on every member, spares included, so members of
    /// different sizes agree. `None`: this device's own size (`data_offset + data_size`).
    pub bm_space_device_sectors: Option<u64>,
    /// An md-cluster array ([`crate::feature::CLUSTERED`], with `internal_bitmap`): its node
    /// slots take this many sectors from +8; the bad-block log goes after them when that is
    /// more than the usual bitmap space.
    pub cluster_bitmap_sectors: Option<u64>,
}

impl Superblock {
    /// A new member superblock as mdadm would write it: events 0, `max_dev` by mdadm's rule
    /// ([`max_dev_for`], unused roles spare), bad-block log of 8 sectors right after the
    /// bitmap space (`bblog_offset = 8 + bm_space`, `bm_space` for
    /// [`CreateParams::bm_space_device_sectors`], or just below `data_offset` if that does
    /// not fit), RAID0_LAYOUT for level 0, BITMAP_OFFSET with `bitmap_offset = 8` when
    /// requested. The result is checked with [`Superblock::validate`].
    pub fn new_for_create(p: &CreateParams) -> Result<Superblock, FormatError> {
        let devices = p.roles.len().max(p.raid_disks as usize);
        let max_dev = max_dev_for(devices);
        if p.roles.len() > max_dev as usize {
            return Err(FormatError::BadMaxDev(p.roles.len() as u32));
        }
        if p.dev_number >= p.roles.len() as u32 {
            return Err(FormatError::Unsupported(format!(
                "dev_number {} has no entry in the role table ({} entries)",
                p.dev_number,
                p.roles.len()
            )));
        }
        let mut dev_roles = p.roles.clone();
        dev_roles.resize(max_dev as usize, ROLE_SPARE);

        let mut feature_map = 0;
        let mut bitmap_offset = 0;
        if p.level == 0 {
            feature_map |= feature::RAID0_LAYOUT;
        }
        if p.journal {
            feature_map |= feature::JOURNAL;
        }
        if p.integrity {
            feature_map |= crate::FEATURE_INTEGRITY;
        }
        if p.internal_bitmap {
            feature_map |= feature::BITMAP_OFFSET;
            bitmap_offset = 8;
        }
        if p.cluster_bitmap_sectors.is_some() {
            if !p.internal_bitmap {
                return Err(FormatError::Unsupported(
                    "a clustered array keeps its node slots in an internal bitmap".into(),
                ));
            }
            feature_map |= feature::CLUSTERED;
        }
        if let Some(slots) = p.cluster_bitmap_sectors {
            if SB_OFFSET_SECTORS + SB_RESERVED_SECTORS + slots > p.data_offset {
                return Err(FormatError::Unsupported(format!(
                    "node bitmaps of {slots} sectors do not fit before the data offset {}",
                    p.data_offset
                )));
            }
        }

        // Bad-block log placement, in sectors relative to the superblock.
        let device_sectors = p
            .bm_space_device_sectors
            .unwrap_or_else(|| p.data_offset.saturating_add(p.data_size));
        let bitmap_sectors = bm_space(device_sectors).max(p.cluster_bitmap_sectors.unwrap_or(0));
        let after_bitmap = SB_RESERVED_SECTORS + bitmap_sectors;
        let bbl = u64::from(BBLOG_SECTORS);
        let (bblog_offset, bblog_size) = if SB_OFFSET_SECTORS + after_bitmap + bbl <= p.data_offset
        {
            (after_bitmap as i32, BBLOG_SECTORS)
        } else if p.data_offset >= SB_OFFSET_SECTORS + SB_RESERVED_SECTORS + bbl {
            (
                (p.data_offset - bbl - SB_OFFSET_SECTORS) as i32,
                BBLOG_SECTORS,
            )
        } else {
            (0, 0)
        };

        let clean = p.assume_clean || p.level <= 0;
        let sb = Superblock {
            feature_map,
            set_uuid: p.set_uuid,
            set_name: p.name.clone(),
            ctime: md_time(p.ctime_secs),
            level: p.level,
            layout: p.layout,
            size: p.size,
            chunksize: p.chunk_sectors,
            raid_disks: p.raid_disks,
            bitmap_offset,
            new_level: 0,
            reshape_position: 0,
            delta_disks: 0,
            new_layout: 0,
            new_chunk: 0,
            new_offset: 0,
            data_offset: p.data_offset,
            data_size: p.data_size,
            super_offset: SB_OFFSET_SECTORS,
            recovery_offset: 0,
            dev_number: p.dev_number,
            cnt_corrected_read: 0,
            device_uuid: p.device_uuid,
            devflags: 0,
            bblog_shift: 0,
            bblog_size,
            bblog_offset,
            utime: ironraid_time(std::time::Duration::from_secs(p.ctime_secs)),
            events: 0,
            resync_offset: if clean { MAX_SECTOR } else { 0 },
            max_dev,
            dev_roles,
        };
        sb.validate()?;
        Ok(sb)
    }
}
