//! `create`: write fresh md v1.2 superblocks onto a set of members.
//!
//! What mdadm does and we mirror: one data offset for all members (mdadm's default for the
//! smallest member), a component size rounded down to the chunk (64 KiB for RAID1), roles in the
//! order members are given, spares after them, a random array UUID and per-device UUIDs, and
//! `resync_offset` 0 ("needs initial sync") unless the caller asserts the members are already
//! consistent. Nothing is written until every member has passed its checks.
//!
//! The superblocks themselves are built by `format` ([`Superblock::new_for_create`]), the one
//! owner of superblock construction; this module decides the array-wide parameters and does
//! the I/O.

use crate::clock::{new_uuid, Clock, SystemClock};
use crate::error::{EngineError, Result};
use crate::members::Member;
use crate::members::{read_superblock, write_superblock};
use device::{AlignedBuf, Device};
use format::{BitmapSuper, CreateParams, Superblock, ROLE_JOURNAL, ROLE_SPARE, SB_OFFSET_SECTORS};
use layout::{Geometry, GeometrySpec, Level};
use std::sync::Arc;

/// What to create.
pub struct CreateSpec {
    pub name: String,
    pub level: Level,
    /// md layout value; `None` for the level's default.
    pub layout: Option<u32>,
    pub chunk_bytes: u64,
    pub members: Vec<Arc<dyn Device>>,
    pub spares: Vec<Arc<dyn Device>>,
    /// Use at most this many bytes of each member for data.
    pub size_bytes: Option<u64>,
    /// Members are known to be consistent (e.g. all zero): skip the initial sync.
    pub assume_clean: bool,
    /// Overwrite members that already carry an md superblock.
    pub force: bool,
    /// Give the array md's internal write-intent bitmap.
    pub bitmap: Option<BitmapSpec>,
    /// Discard every member's data area first (cheap on files: it punches holes), so that the
    /// whole array starts as unused regions: nothing to sync, nothing to rebuild until written.
    /// Without it every region starts used (trims free them later).
    pub discard: bool,
    /// A raid5-cache journal device (RAID4/5/6 only): every stripe write is logged there
    /// first, which closes the write hole.
    pub journal: Option<Arc<dyn Device>>,
    /// Start the journal in write-back mode (recorded on the journal device).
    pub journal_write_back: bool,
    /// Keep a CRC32C record of every 4 KiB member block on other members (RAID4/5/6). The
    /// members' data areas are discarded, so the array starts all zeroes with known records.
    pub integrity: bool,
    /// The `guided` consistency policy: after an unclean stop, wait for a guide (verify reads
    /// from the layer above) before the bitmap resync. Needs `bitmap`, RAID1/4/5/6 and a
    /// power-of-two chunk (the flag lives in the used-region map).
    pub guided: bool,
}

/// The write-intent bitmap of a new array.
#[derive(Clone, Debug, Default)]
pub struct BitmapSpec {
    /// Bytes of the array (per member for parity levels and RAID1) one bit covers; `None`:
    /// mdadm's default (the smallest that fits the reserved space, at least 64 MiB).
    pub chunk_bytes: Option<u64>,
    /// md-cluster's format: one bitmap slot per node (bitmap version 5, the superblock's
    /// CLUSTERED feature).
    pub cluster: Option<ClusterFormat>,
}

/// The node slots of a clustered array (`mdadm --bitmap=clustered --nodes N`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterFormat {
    /// Node slots, each a whole bitmap; at least 1.
    pub nodes: u32,
    /// The cluster's name, at most 63 bytes.
    pub name: String,
}

/// What `create` wrote.
#[derive(Clone, Debug)]
pub struct Created {
    pub uuid: [u8; 16],
    pub array_bytes: u64,
    pub data_offset_sectors: u64,
    pub component_sectors: u64,
}

pub fn create(spec: &CreateSpec) -> Result<Created> {
    create_with_clock(spec, &SystemClock::default())
}

/// [`create`], with the UUIDs, the creation time and the journal's first sequence number drawn
/// from `clock` (a seeded [`crate::ManualClock`] creates the same bytes every time).
pub fn create_with_clock(spec: &CreateSpec, clock: &dyn Clock) -> Result<Created> {
    let all = checked_devices(spec)?;
    let identity = Identity {
        uuid: new_uuid(clock),
        device_uuids: (0..all.len()).map(|_| new_uuid(clock)).collect(),
        ctime_secs: clock.wall().as_secs(),
        journal_seq: crate::policy::journal::new_log_seq(clock),
    };
    let plan = plan_create(spec, &all, &identity)?;
    for (dev, sb) in all.iter().zip(&plan.superblocks) {
        write_new_member(spec, dev, sb, &plan, identity.journal_seq)?;
    }
    Ok(plan.created)
}

/// What names a new array and its members: drawn before planning, so the plan is a function
/// of the spec, the members' sizes and these values alone.
struct Identity {
    uuid: [u8; 16],
    device_uuids: Vec<[u8; 16]>,
    ctime_secs: u64,
    /// The sequence number of a journal's empty log.
    journal_seq: u64,
}

/// Everything `create` writes, computed (and validated by `format`) before the first write.
struct CreatePlan {
    /// One per device of [`checked_devices`], in its order.
    superblocks: Vec<Superblock>,
    bitmap: Option<BitmapSuper>,
    /// Where the used-region map goes on every member, and its bytes.
    used_map: Option<(u64, Vec<u8>)>,
    zone: Option<format::Zone>,
    created: Created,
}

/// The member sizes every later decision derives from.
struct Sizes {
    chunk_sectors: u64,
    smallest_sectors: u64,
    data_offset: u64,
    /// Data sectors after `data_offset`, per device (members, spares, journal).
    data_sectors: Vec<u64>,
}

/// Members, then spares, then the journal; after every refusal that needs no sizes.
fn checked_devices(spec: &CreateSpec) -> Result<Vec<&Arc<dyn Device>>> {
    let mut all: Vec<&Arc<dyn Device>> = spec.members.iter().chain(&spec.spares).collect();
    if spec.members.is_empty() {
        return Err(EngineError::InvalidArgument("no members given".into()));
    }
    if spec.members.len() < spec.level.min_disks() {
        return Err(EngineError::InvalidArgument(format!(
            "{} needs at least {} members, got {}",
            spec.level.name(),
            spec.level.min_disks(),
            spec.members.len()
        )));
    }
    if spec.integrity {
        check_integrity_spec(spec)?;
    }
    if spec.guided {
        check_guided_spec(spec)?;
    }
    if let Some(j) = &spec.journal {
        check_journal_spec(spec)?;
        all.push(j);
    }
    check_members(&all, spec.force)?;
    Ok(all)
}

fn plan_create(
    spec: &CreateSpec,
    all: &[&Arc<dyn Device>],
    identity: &Identity,
) -> Result<CreatePlan> {
    let mut sizes = plan_sizes(spec, all)?;
    let (mut geometry, mut zone) = plan_geometry(spec, &sizes)?;
    let smallest = sizes.smallest_sectors;
    let new_bitmap_for = |geometry: &Geometry| {
        spec.bitmap
            .as_ref()
            .map(|b| new_bitmap(geometry, identity.uuid, smallest, b))
            .transpose()
    };
    let mut bitmap = new_bitmap_for(&geometry)?;
    if let Some(bm) = bitmap.as_ref().filter(|b| b.is_clustered()) {
        if make_room_for_slots(all, &mut sizes, bm)? {
            // Less data per member: a smaller (or equal) array, whose slots fit as well.
            (geometry, zone) = plan_geometry(spec, &sizes)?;
            bitmap = new_bitmap_for(&geometry)?;
        }
    }
    let superblocks = plan_superblocks(spec, all, &geometry, &sizes, identity, bitmap.as_ref())?;
    let used_map = plan_used_map(spec, &geometry, &superblocks)?;
    let created = Created {
        uuid: identity.uuid,
        array_bytes: geometry.array_sectors() * 512,
        data_offset_sectors: sizes.data_offset,
        component_sectors: geometry.spec().component_sectors,
    };
    Ok(CreatePlan {
        superblocks,
        bitmap,
        used_map,
        zone,
        created,
    })
}

/// One data offset for all (mdadm's default for the smallest member); refuses devices too
/// small for it, or for a journal's log.
fn plan_sizes(spec: &CreateSpec, all: &[&Arc<dyn Device>]) -> Result<Sizes> {
    let chunk_sectors = match spec.level {
        Level::Raid1 | Level::Linear => 0,
        _ => spec.chunk_bytes / 512,
    };
    let smallest_sectors = spec
        .members
        .iter()
        .map(|d| d.len_bytes() / 512)
        .min()
        .unwrap_or(0);
    let data_offset = format::default_data_offset(smallest_sectors, chunk_sectors.max(8));
    let mut data_sectors = Vec::new();
    for (i, d) in all.iter().enumerate() {
        let sectors = d.len_bytes() / 512;
        let journal = spec.journal.is_some() && i == all.len() - 1;
        if journal && sectors < data_offset + crate::policy::journal::MIN_LOG_SECTORS {
            return Err(EngineError::Create {
                member: d.name().into(),
                reason: format!(
                    "too small for a journal: {} bytes, the log needs at least {} bytes after \
                     the data offset of {} bytes",
                    d.len_bytes(),
                    crate::policy::journal::MIN_LOG_SECTORS * 512,
                    data_offset * 512
                ),
            });
        }
        if sectors <= data_offset + 8 {
            return Err(EngineError::Create {
                member: d.name().into(),
                reason: format!(
                    "too small: {} bytes, the data area starts at {} bytes",
                    d.len_bytes(),
                    data_offset * 512
                ),
            });
        }
        data_sectors.push(sectors - data_offset);
    }
    Ok(Sizes {
        chunk_sectors,
        smallest_sectors,
        data_offset,
        data_sectors,
    })
}

/// The component size (the smallest member, `--size`, the integrity zone) and the geometry.
fn plan_geometry(spec: &CreateSpec, sizes: &Sizes) -> Result<(Geometry, Option<format::Zone>)> {
    let chunk_sectors = sizes.chunk_sectors;
    let active_sizes = &sizes.data_sectors[..spec.members.len()];
    let min_data = *active_sizes.iter().min().expect("at least one member");
    let mut component = layout::component_sectors_for(spec.level, chunk_sectors, min_data);
    if let Some(limit) = spec.size_bytes {
        let limit = layout::component_sectors_for(spec.level, chunk_sectors, limit / 512);
        if limit > component {
            return Err(EngineError::InvalidArgument(format!(
                "--size {} exceeds the {} bytes available on the smallest member",
                limit * 512,
                component * 512
            )));
        }
        component = limit;
    }
    let copies = format::table_copies(spec.level.md_level(), spec.members.len());
    let zone = match copies.filter(|_| spec.integrity) {
        Some(copies) => {
            // RAID1 has no chunk: its size is kept to whole pages, which records cover.
            let unit = chunk_sectors.max(8);
            let fit =
                format::Zone::fit(spec.members.len(), copies, min_data, unit).ok_or_else(|| {
                    EngineError::InvalidArgument(
                        "members too small for one chunk and the integrity zone".into(),
                    )
                })?;
            component = component.min(fit);
            Some(format::Zone::new(spec.members.len(), copies, component))
        }
        None => None,
    };
    let device_sectors = match spec.level {
        Level::Raid0 | Level::Linear if spec.size_bytes.is_none() => active_sizes.to_vec(),
        Level::Raid0 | Level::Linear => vec![component; spec.members.len()],
        _ => Vec::new(),
    };
    let geometry = Geometry::new(GeometrySpec {
        level: spec.level,
        layout: spec
            .layout
            .unwrap_or_else(|| layout::default_layout(spec.level)),
        chunk_sectors,
        raid_disks: spec.members.len(),
        component_sectors: component,
        device_sectors,
    })
    .map_err(|e| EngineError::InvalidArgument(e.to_string()))?;
    if geometry.array_sectors() == 0 {
        return Err(EngineError::InvalidArgument(
            "members too small for one chunk per member".into(),
        ));
    }
    Ok((geometry, zone))
}

/// Every device's superblock, each validated by `format`.
fn plan_superblocks(
    spec: &CreateSpec,
    all: &[&Arc<dyn Device>],
    geometry: &Geometry,
    sizes: &Sizes,
    identity: &Identity,
    bitmap: Option<&BitmapSuper>,
) -> Result<Vec<Superblock>> {
    // Roles in the order members are given, spares after them (format widens the table to
    // mdadm's `max_dev` with spare entries).
    let roles: Vec<u16> = (0..all.len())
        .map(|i| {
            if i < spec.members.len() {
                i as u16
            } else if spec.journal.is_some() && i == all.len() - 1 {
                ROLE_JOURNAL
            } else {
                ROLE_SPARE
            }
        })
        .collect();
    let array_params = CreateParams {
        set_uuid: identity.uuid,
        name: spec.name.clone(),
        ctime_secs: identity.ctime_secs,
        level: spec.level.md_level(),
        layout: geometry.spec().layout,
        chunk_sectors: geometry.chunk_sectors() as u32,
        raid_disks: spec.members.len() as u32,
        size: geometry.spec().component_sectors,
        data_offset: sizes.data_offset,
        data_size: 0,
        dev_number: 0,
        device_uuid: [0; 16],
        roles,
        // Levels without redundancy have nothing to resync (a one-member RAID1 included).
        // An integrity array starts discarded: all zeroes, parity included.
        assume_clean: spec.assume_clean || geometry.max_degraded() == 0 || spec.integrity,
        internal_bitmap: bitmap.is_some(),
        journal: spec.journal.is_some(),
        integrity: spec.integrity,
        bm_space_device_sectors: Some(sizes.smallest_sectors),
        cluster_bitmap_sectors: bitmap
            .filter(|b| b.is_clustered())
            .map(|b| b.all_slots_bytes() / 512),
    };
    assert_eq!(
        identity.device_uuids.len(),
        all.len(),
        "one UUID per device"
    );
    all.iter()
        .enumerate()
        .map(|(i, dev)| {
            let params = CreateParams {
                data_size: sizes.data_sectors[i],
                dev_number: i as u32,
                device_uuid: identity.device_uuids[i],
                ..array_params.clone()
            };
            Superblock::new_for_create(&params).map_err(|e| EngineError::Create {
                member: dev.name().into(),
                reason: e.to_string(),
            })
        })
        .collect()
}

/// The used-region map every member carries. The journal replays whatever was in flight, so
/// a journal array (whose releases it does not log) goes without.
fn plan_used_map(
    spec: &CreateSpec,
    geometry: &Geometry,
    superblocks: &[Superblock],
) -> Result<Option<(u64, Vec<u8>)>> {
    let used_map = superblocks
        .first()
        .filter(|_| spec.journal.is_none())
        .and_then(|sb| {
            let base = format::used_map_offset_sectors(sb) * 512;
            // A clustered array keeps one map per node slot in the same room.
            let maps = spec
                .bitmap
                .as_ref()
                .and_then(|b| b.cluster.as_ref())
                .map_or(1, |c| u64::from(c.nodes.max(1)));
            let room = (sb.data_offset * 512).checked_sub(base)? / maps;
            let flags = if spec.guided {
                format::USED_MAP_FLAG_GUIDED
            } else {
                0
            };
            let personality = crate::personality::for_geometry(geometry);
            if !personality.keeps_used_map() {
                return None;
            }
            crate::policy::used::initial_map(
                personality.sync_total(crate::work::SyncAction::Resync),
                geometry.chunk_sectors().max(1) * 512,
                sb,
                room,
                !spec.discard,
                flags,
            )
            .map(|(_, bytes)| (base, bytes.repeat(maps as usize)))
        });
    if spec.guided && used_map.is_none() {
        return Err(EngineError::InvalidArgument(
            "no room for the used-region map, which records the guided policy".into(),
        ));
    }
    Ok(used_map)
}

/// Write one device as the plan says: a journal gets an empty log; a member its discarded data
/// area (blank integrity tables included) and used-region map; both then their superblock
/// (and bitmap).
fn write_new_member(
    spec: &CreateSpec,
    dev: &Arc<dyn Device>,
    sb: &Superblock,
    plan: &CreatePlan,
    journal_seq: u64,
) -> Result<()> {
    let failed = |reason: String| EngineError::Create {
        member: dev.name().into(),
        reason,
    };
    if sb.role() == format::DevRole::Journal {
        let mut sb = sb.clone();
        if spec.journal_write_back {
            sb.devflags |= format::DEVFLAG_JOURNAL_WRITE_BACK;
        }
        crate::policy::journal::write_empty_log(dev.as_ref(), &sb, journal_seq)
            .map_err(|e| failed(format!("cannot start the journal: {e}")))?;
        return write_member(dev, &sb, None).map_err(|e| failed(e.to_string()));
    }
    if spec.discard || spec.integrity {
        dev.discard_zeroes(sb.data_offset * 512, sb.data_size * 512)
            .map_err(|e| failed(format!("cannot discard the data area: {e}")))?;
    }
    if let Some((base, bytes)) = &plan.used_map {
        let buf = AlignedBuf::copy_from(bytes);
        dev.write_at(&buf, *base, false)
            .map_err(|e| failed(e.to_string()))?;
    }
    if let Some(zone) = &plan.zone {
        // The discard above blanked the tables: blank tables are the initial ones (`integrity`).
        assert!(
            zone.end_sectors() <= sb.data_size,
            "the integrity zone ends past the data area the discard covered"
        );
    }
    write_member(dev, sb, plan.bitmap.as_ref()).map_err(|e| failed(e.to_string()))
}

/// A journal needs a parity level with a chunk of whole pages, and replaces the bitmap.
fn check_journal_spec(spec: &CreateSpec) -> Result<()> {
    if !spec.level.is_parity() {
        return Err(EngineError::InvalidArgument(format!(
            "a journal closes the write hole of RAID4/5/6; {} has none",
            spec.level.name()
        )));
    }
    if spec.bitmap.is_some() {
        return Err(EngineError::InvalidArgument(
            "an array has either a journal or a write-intent bitmap, not both (md refuses both)"
                .into(),
        ));
    }
    if !spec.chunk_bytes.is_multiple_of(4096) {
        return Err(EngineError::InvalidArgument(format!(
            "chunk {} bytes: a journal logs whole 4 KiB pages, so the chunk must be a multiple of 4096",
            spec.chunk_bytes
        )));
    }
    Ok(())
}

/// Integrity records cover the levels with redundancy to repair from (RAID1, 10, 4, 5, 6),
/// with a member more than the table copies, in whole pages.
fn check_integrity_spec(spec: &CreateSpec) -> Result<()> {
    if format::table_copies(spec.level.md_level(), spec.members.len()).is_none() {
        let why = match spec.level {
            Level::Linear | Level::Raid0 => {
                "it has no redundancy to repair a bad block from (records would only turn \
                 wrong data into read errors); use RAID1, 10, 4, 5 or 6"
            }
            _ => {
                "records are kept for RAID1 and RAID10 with at least 2 members, RAID4/5 with \
                 at least 3 and RAID6 with at least 4"
            }
        };
        return Err(EngineError::InvalidArgument(format!(
            "--integrity is not available for {} with {} members: {why}",
            spec.level.name(),
            spec.members.len()
        )));
    }
    if spec.level != Level::Raid1 && !spec.chunk_bytes.is_multiple_of(4096) {
        return Err(EngineError::InvalidArgument(format!(
            "chunk {} bytes: records cover whole 4 KiB blocks, so the chunk must be a multiple of 4096",
            spec.chunk_bytes
        )));
    }
    Ok(())
}

fn check_guided_spec(spec: &CreateSpec) -> Result<()> {
    let why = if spec.bitmap.is_none() {
        Some("it keeps the write-intent bitmap as its fallback: give one".to_string())
    } else if spec.journal.is_some() {
        Some("a journal closes the write hole by itself: choose one of the two".into())
    } else if !matches!(
        spec.level,
        Level::Raid1 | Level::Raid4 | Level::Raid5 | Level::Raid6 | Level::Raid10
    ) {
        Some(format!(
            "not for {} (RAID1/4/5/6/10 only)",
            spec.level.name()
        ))
    } else if spec.level != Level::Raid1 && !spec.chunk_bytes.is_power_of_two() {
        Some("the chunk must be a power of two".into())
    } else {
        None
    };
    match why {
        Some(why) => Err(EngineError::InvalidArgument(format!(
            "consistency policy guided: {why}"
        ))),
        None => Ok(()),
    }
}

/// Refuse members that already belong to an array (unless forced) or are listed twice.
fn check_members(all: &[&Arc<dyn Device>], force: bool) -> Result<()> {
    for (i, d) in all.iter().enumerate() {
        if all[..i].iter().any(|o| o.name() == d.name()) {
            return Err(EngineError::InvalidArgument(format!(
                "{} is listed twice",
                d.name()
            )));
        }
        if force {
            continue;
        }
        if let Ok(sb) = read_superblock(d.as_ref()) {
            return Err(EngineError::Create {
                member: d.name().into(),
                reason: format!(
                    "already holds an md superblock (array {}, name '{}'); use --force to overwrite",
                    format::format_uuid(&sb.set_uuid),
                    sb.set_name
                ),
            });
        }
    }
    Ok(())
}

/// The bitmap header of a new array: md's sync coordinates (array sectors for RAID10, component
/// sectors otherwise), in the space `create` reserves after the superblock.
fn new_bitmap(
    geometry: &Geometry,
    uuid: [u8; 16],
    smallest_member_sectors: u64,
    spec: &BitmapSpec,
) -> Result<BitmapSuper> {
    if geometry.max_degraded() == 0 {
        return Err(EngineError::InvalidArgument(format!(
            "{} has no redundancy: a write-intent bitmap has nothing to resync",
            geometry.level().name()
        )));
    }
    let sync_sectors = crate::personality::for_geometry(geometry)
        .sync_total(crate::work::SyncAction::Resync)
        / 512;
    let room = format::bm_space(smallest_member_sectors);
    let min = format::min_bitmap_chunk(sync_sectors, room).ok_or_else(|| {
        EngineError::InvalidArgument("members too small to hold a write-intent bitmap".into())
    })?;
    let chunk = match spec.chunk_bytes {
        None => format::default_bitmap_chunk(sync_sectors, room).expect("room checked above"),
        Some(c) if !c.is_power_of_two() || c < 4096 => {
            return Err(EngineError::InvalidArgument(format!(
                "--bitmap-chunk {c}: must be a power of two of at least 4096 bytes"
            )))
        }
        Some(c) if c < min => {
            return Err(EngineError::InvalidArgument(format!(
                "--bitmap-chunk {c}: too small; {} bytes of bitmap space need at least {min}",
                room * 512
            )))
        }
        Some(c) => c,
    };
    let chunk = u32::try_from(chunk).map_err(|_| {
        EngineError::InvalidArgument(format!("--bitmap-chunk {chunk}: larger than 2 GiB"))
    })?;
    let sb = BitmapSuper::new(uuid, sync_sectors, chunk, room as u32);
    match &spec.cluster {
        Some(c) => sb
            .clustered(c.nodes, &c.name)
            .map_err(|e| EngineError::InvalidArgument(e.to_string())),
        None => Ok(sb),
    }
}

/// Node slots go back to back from +8 sectors, then the bad-block log (8 sectors) and the
/// used-region map. mdadm's default data offset leaves room for many slots; where it does not
/// (many nodes, a small bitmap chunk), the data offset grows to the next MiB that does, on
/// every member alike (mdadm grows it too, within its reshape headroom).
fn make_room_for_slots(
    all: &[&Arc<dyn Device>],
    sizes: &mut Sizes,
    bm: &BitmapSuper,
) -> Result<bool> {
    // A header page and a page of bits for each node's used-region map.
    let used_map_reserve = u64::from(bm.nodes) * 2 * format::BITMAP_PAGE_BYTES as u64 / 512;
    let need = SB_OFFSET_SECTORS
        + format::SB_RESERVED_SECTORS
        + bm.all_slots_bytes() / 512
        + u64::from(format::BBLOG_SECTORS)
        + used_map_reserve;
    if need <= sizes.data_offset {
        return Ok(false);
    }
    let grown = need.next_multiple_of(2048);
    for (i, d) in all.iter().enumerate() {
        let sectors = d.len_bytes() / 512;
        if sectors <= grown + 8 {
            return Err(EngineError::Create {
                member: d.name().into(),
                reason: format!(
                    "too small for {} node bitmaps of {} bytes each: the data area would \
                     start at {} bytes",
                    bm.nodes,
                    bm.bytes_on_disk(),
                    grown * 512
                ),
            });
        }
        sizes.data_sectors[i] = sectors - grown;
    }
    sizes.data_offset = grown;
    Ok(true)
}

/// Write an empty bad-block log (all ones), the bitmap (if any) and the superblock, then flush.
fn write_member(
    dev: &Arc<dyn Device>,
    sb: &Superblock,
    bitmap: Option<&BitmapSuper>,
) -> std::io::Result<()> {
    if let Some(bm) = bitmap {
        let clean = sb.resync_offset == format::MAX_SECTOR;
        crate::policy::bitmap::write_initial(dev.as_ref(), bm, clean)?;
    }
    if sb.bblog_size > 0 {
        let bblog_at = (SB_OFFSET_SECTORS as i64 + i64::from(sb.bblog_offset)) as u64 * 512;
        let mut bblog = AlignedBuf::zeroed(usize::from(sb.bblog_size) * 512);
        bblog.fill(0xff);
        dev.write_at(&bblog, bblog_at, false)?;
    }
    let member = Member::fresh(dev.clone(), sb);
    write_superblock(&member, sb)?;
    dev.flush()
}
