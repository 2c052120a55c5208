//! `assemble`: turn a set of member devices into a running [`Array`].
//!
//! Rules (md's, stated in `shared/reference/md-format.md` §1.7 and §1.11):
//! * every member must carry a valid v1.2 superblock of the same array (same set UUID); a member
//!   with a bad checksum, unknown level or feature bit, or another array's UUID is refused with a
//!   message naming it — we never guess;
//! * the member with the highest event count describes the array (geometry, role table);
//! * a member more than one event behind it is stale: it is left out (its role is missing) and
//!   never read as current;
//! * roles come from the freshest role table; faulty entries are left out, spares kept aside;
//! * the array must survive the missing roles, or assembly fails saying how many are missing.

use crate::array::{Array, ArrayConfig, ArrayParts};
use crate::error::{EngineError, Result};
use crate::member::{Member, Slot};
use crate::meta::{read_superblock, MemberSb, Meta};
use device::Device;
use format::{DevRole, Superblock, MAX_SECTOR};
use layout::{Geometry, GeometrySpec, Level};
use std::sync::Arc;

/// How to assemble.
#[derive(Clone, Debug, Default)]
pub struct AssembleOptions {
    /// Name to run under; defaults to the superblock's name.
    pub name: Option<String>,
    pub config: ArrayConfig,
}

pub fn assemble(devs: Vec<Arc<dyn Device>>, opts: AssembleOptions) -> Result<Array> {
    if devs.is_empty() {
        return Err(EngineError::InvalidArgument("no members given".into()));
    }
    let mut found: Vec<(Arc<dyn Device>, Superblock)> = Vec::new();
    for dev in devs {
        let sb = read_superblock(dev.as_ref()).map_err(|reason| EngineError::Assemble {
            member: dev.name().into(),
            reason,
        })?;
        if let Some((first, fsb)) = found.first() {
            if sb.set_uuid != fsb.set_uuid {
                return Err(EngineError::Assemble {
                    member: dev.name().into(),
                    reason: format!(
                        "belongs to array {} ('{}'), not to array {} of {}",
                        format::format_uuid(&sb.set_uuid),
                        sb.set_name,
                        format::format_uuid(&fsb.set_uuid),
                        first.name()
                    ),
                });
            }
        }
        if found.iter().any(|(_, o)| o.dev_number == sb.dev_number) {
            return Err(EngineError::Assemble {
                member: dev.name().into(),
                reason: format!(
                    "device number {} appears twice (the same member given twice, or a copy)",
                    sb.dev_number
                ),
            });
        }
        found.push((dev, sb));
    }
    let freshest = found
        .iter()
        .map(|(_, sb)| sb.events)
        .max()
        .expect("non-empty");
    let best = found
        .iter()
        .find(|(_, sb)| sb.events == freshest)
        .expect("max exists")
        .1
        .clone();
    let level = Level::from_md(best.level).ok_or_else(|| EngineError::Assemble {
        member: found[0].0.name().into(),
        reason: format!("unknown RAID level {}", best.level),
    })?;
    let n = best.raid_disks as usize;
    let mut by_role: Vec<Option<(Arc<dyn Device>, Superblock)>> = (0..n).map(|_| None).collect();
    let mut spares = Vec::new();
    for (dev, sb) in found {
        if sb.events + 1 < freshest {
            tracing::warn!(member = %dev.name(), events = sb.events, freshest, "stale member left out (events behind)");
            continue;
        }
        match best.role_of(sb.dev_number) {
            DevRole::Active(r) if (r as usize) < n => by_role[r as usize] = Some((dev, sb)),
            DevRole::Active(r) => {
                return Err(EngineError::Assemble {
                    member: dev.name().into(),
                    reason: format!("role {r} outside the {n} raid devices"),
                })
            }
            DevRole::Spare => spares.push((dev, sb)),
            DevRole::Faulty => {
                tracing::warn!(member = %dev.name(), "member recorded as faulty; left out")
            }
            DevRole::Journal => {
                return Err(EngineError::Unsupported(format!(
                    "{}: journal devices are not supported yet",
                    dev.name()
                )))
            }
        }
    }
    let geometry = geometry_from(&best, level, &by_role)?;
    let failed: Vec<bool> = by_role.iter().map(Option::is_none).collect();
    if !geometry.survives(&failed) {
        let have = failed.iter().filter(|f| !**f).count();
        return Err(EngineError::Assemble {
            member: format!("array '{}'", best.set_name),
            reason: format!(
                "too few members to run: {have} of {n} present and current, {} tolerates {} missing",
                level.name(),
                geometry.max_degraded()
            ),
        });
    }
    for (dev, sb) in by_role.iter().flatten().chain(spares.iter()) {
        let needed = (sb.data_offset + best.size) * 512;
        if dev.len_bytes() < needed && level != Level::Raid0 && level != Level::Linear {
            return Err(EngineError::Assemble {
                member: dev.name().into(),
                reason: format!(
                    "device has {} bytes but the array needs {needed}",
                    dev.len_bytes()
                ),
            });
        }
    }
    build(opts, best, geometry, by_role, spares)
}

fn geometry_from(
    best: &Superblock,
    level: Level,
    by_role: &[Option<(Arc<dyn Device>, Superblock)>],
) -> Result<Geometry> {
    let device_sectors = match level {
        Level::Raid0 | Level::Linear => by_role
            .iter()
            .map(|m| m.as_ref().map(|(_, sb)| sb.data_size).unwrap_or(best.size))
            .collect(),
        _ => Vec::new(),
    };
    Geometry::new(GeometrySpec {
        level,
        layout: best.layout,
        chunk_sectors: u64::from(best.chunksize),
        raid_disks: best.raid_disks as usize,
        component_sectors: best.size,
        device_sectors,
    })
    .map_err(|e| EngineError::Assemble {
        member: format!("array '{}'", best.set_name),
        reason: e.to_string(),
    })
}

type Found = (Arc<dyn Device>, Superblock);

fn build(
    opts: AssembleOptions,
    best: Superblock,
    geometry: Geometry,
    by_role: Vec<Option<Found>>,
    spares: Vec<Found>,
) -> Result<Array> {
    let mut members = Vec::new();
    let mut slots = Vec::new();
    let mut roles = best.dev_roles.clone();
    let new_member = |dev: Arc<dyn Device>, sb: &Superblock| {
        Arc::new(Member {
            dev,
            data_offset_bytes: sb.data_offset * 512,
            dev_number: sb.dev_number,
        })
    };
    for entry in by_role {
        let slot = match entry {
            Some((dev, sb)) => {
                let m = new_member(dev, &sb);
                let slot = Slot::new(Some(m.clone()));
                if sb.feature_map & format::feature::RECOVERY_OFFSET != 0 {
                    // Rebuilt only up to here when the daemon stopped; the rebuild resumes.
                    slot.advance(sb.recovery_offset * 512);
                }
                members.push(MemberSb {
                    member: m,
                    sb,
                    writable: true,
                });
                slot
            }
            None => Slot::new(None),
        };
        slots.push(slot);
    }
    for (r, slot) in slots.iter().enumerate() {
        if slot.member().is_none() {
            // A role nobody fills: record it as faulty wherever the table still claims it.
            for raw in roles.iter_mut().filter(|raw| **raw == r as u16) {
                *raw = format::ROLE_FAULTY;
            }
        }
    }
    let mut spare_members = Vec::new();
    for (dev, sb) in spares {
        let m = new_member(dev, &sb);
        spare_members.push(m.clone());
        members.push(MemberSb {
            member: m,
            sb,
            writable: true,
        });
    }
    let was_dirty = best.resync_offset != MAX_SECTOR;
    let resync_from =
        (was_dirty && geometry.max_degraded() > 0).then_some(best.resync_offset * 512);
    let meta = Meta {
        members,
        events: best.events,
        resync_offset: best.resync_offset,
        roles,
    };
    let name = opts.name.clone().unwrap_or_else(|| best.set_name.clone());
    Array::from_parts(ArrayParts {
        name,
        uuid: best.set_uuid,
        geometry,
        slots,
        meta,
        config: opts.config,
        was_dirty,
        spares: spare_members,
        resync_from,
    })
}
