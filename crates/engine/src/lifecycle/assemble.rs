//! `assemble`: turn a set of member devices into a running [`Array`].
//!
//! Rules (md's, stated in `shared/reference/md-format.md` §1.7, §1.8 and §1.11):
//! * every member must carry a valid v1.2 superblock of the same array (same set UUID); a member
//!   with a bad checksum, unknown level or feature bit, or another array's UUID is refused with a
//!   message naming it — we never guess, and `force` does not change that;
//! * the member with the highest event count describes the array (geometry, role table);
//! * a member more than one event behind it is stale: it is left out (its role is missing) and
//!   never read as current;
//! * roles come from the freshest role table; faulty entries are left out, spares kept aside;
//! * the array must survive the missing roles, or assembly fails saying how many are missing.
//!
//! Forcing (`force`, like `mdadm --assemble --force`): when too few members are current, members
//! left out as stale or as recorded faulty are taken back, freshest first, each into the role
//! its *own* superblock records for it, until the array survives. A member whose role is already
//! filled, that was only partly rebuilt, or whose slot lies outside the role table is never taken.
//! Each one taken is logged with how many events it was behind; its data is as old as that.
//!
//! Dirty and degraded (md's `start_dirty_degraded`): a RAID4/5/6 array that was not stopped
//! cleanly (`resync_offset != MAX_SECTOR`) may hold stripes whose parity disagrees with their
//! data (the write hole: the crash came between the data and the parity write). An array with a
//! journal never records a crash there (the journal replays what was in flight), so for it
//! `resync_offset` only says that a resync is still owed (an initial sync not finished): then
//! the same refusal applies. With every
//! member present a resync repairs them; with a role missing, that role's chunks are
//! reconstructed from such a stripe and come back silently wrong. So such an array does not
//! start unless forced. Mirrors have no parity to disagree and start as usual.
//!
//! Durability: the role table the array runs with (missing roles recorded faulty, forced members
//! back in their roles) is committed to every present member before the array is returned, so
//! no write can happen under a table that still names an absent member as current (a read-only
//! assembly writes nothing).

use crate::array::{Array, ArrayConfig, ArrayParts};
use crate::clock::{new_uuid, SystemClock};
use crate::error::{EngineError, Result};
use crate::members::{read_superblock, MemberSb, Meta};
use crate::members::{Member, Slot};
use crate::policy::bitmap::WriteIntentBitmap;
use crate::policy::journal::{Journal, PendingReplay};
use crate::policy::used::UsedRegions;
use device::Device;
use format::{DevRole, Superblock, MAX_SECTOR};
use layout::{Geometry, GeometrySpec, Level};
use std::sync::Arc;

/// How to assemble.
#[derive(Clone, Default)]
pub struct AssembleOptions {
    /// Name to run under; defaults to the superblock's name.
    pub name: Option<String>,
    pub config: ArrayConfig,
    /// Start what md would refuse to start: take stale or faulty-recorded members back when too
    /// few are current (`mdadm --assemble --force`), and start a dirty, degraded RAID4/5/6
    /// (md's `start_dirty_degraded`). Never accepts another array's member.
    pub force: bool,
    /// Refuse to start degraded when a role is missing that the freshest role table still
    /// records as working (a member forgotten on the command line, not one that failed):
    /// starting without it would record it faulty and cost it a full rebuild. md refuses the
    /// same unless `--run`. `force` overrides it.
    pub refuse_unfailed_missing: bool,
    /// The array's journal is lost: run without one (`--consistency-policy resync`), with a
    /// full resync, since what the log held is gone.
    pub drop_journal: bool,
    /// The array's journal is lost: make this device its new, empty journal (with a full
    /// resync, since what the old log held is gone).
    pub add_journal: Option<Arc<dyn Device>>,
}

type Found = (Arc<dyn Device>, Superblock);

/// Why a member with a valid superblock of this array was not given a role.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum LeftOut {
    /// More than one event behind the freshest member.
    Stale,
    /// The freshest role table records it as faulty.
    Faulty,
}

/// Who fills which role, before the array is built.
struct Placement {
    by_role: Vec<Option<Found>>,
    spares: Vec<Found>,
    /// The raid5-cache log device.
    journal: Option<Found>,
    left_out: Vec<(Found, LeftOut)>,
    /// Members taken back by force: (role, events behind the freshest).
    forced: Vec<(usize, u64)>,
}

pub fn assemble(devs: Vec<Arc<dyn Device>>, opts: AssembleOptions) -> Result<Array> {
    let mut opts = opts;
    // One clock from here on: what recovery stamps (journal row ages) the array compares.
    opts.config
        .clock
        .get_or_insert_with(|| Arc::new(SystemClock::default()));
    let found = read_members(devs)?;
    let freshest = found
        .iter()
        .map(|(_, sb)| sb.events)
        .max()
        .expect("read_members returns at least one member");
    let best = found
        .iter()
        .find(|(_, sb)| sb.events == freshest)
        .expect("max exists")
        .1
        .clone();
    let array_name = opts.name.clone().unwrap_or_else(|| best.set_name.clone());
    let level = Level::from_md(best.level).ok_or_else(|| EngineError::Assemble {
        member: found[0].0.name().into(),
        reason: format!("unknown RAID level {}", best.level),
    })?;
    let mut placement = place(found, &best)?;
    let geometry = geometry_from(&best, level, &placement.by_role)?;
    ensure_survives(&mut placement, &geometry, &best, &array_name, opts.force)?;
    // RAID0/linear take each present member's own size: recompute after forcing.
    let geometry = geometry_from(&best, level, &placement.by_role)?;
    check_sizes(&placement, &best, level)?;
    // The write hole is the graver risk, so it is named first; `--run` does not lift it.
    check_dirty_degraded(&placement, &best, level, &array_name, opts.force)?;
    if opts.refuse_unfailed_missing && !opts.force {
        check_unfailed_missing(&placement, &best, &array_name)?;
    }
    build(opts, array_name, best, geometry, placement)
}

/// Read every member's superblock; refuse foreign arrays and duplicated slots.
fn read_members(devs: Vec<Arc<dyn Device>>) -> Result<Vec<Found>> {
    if devs.is_empty() {
        return Err(EngineError::InvalidArgument("no members given".into()));
    }
    let mut found: Vec<Found> = Vec::new();
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
        match found
            .iter()
            .position(|(_, o)| o.dev_number == sb.dev_number)
        {
            None => found.push((dev, sb)),
            // Two spares that each took a free slot number, one of them never recorded by the
            // array (a cut between the spare's superblock and the members' commit): neither holds
            // data, so the first is kept and the other left out.
            Some(i)
                if found[i].1.events == sb.events
                    && found[i].1.device_uuid != sb.device_uuid
                    && found[i].1.role() == DevRole::Spare
                    && sb.role() == DevRole::Spare =>
            {
                tracing::warn!(member = %dev.name(), dev_number = sb.dev_number, kept = %found[i].0.name(), "a second spare claims this device number; left out");
            }
            Some(i) if found[i].1.events == sb.events => {
                return Err(EngineError::Assemble {
                    member: dev.name().into(),
                    reason: format!(
                        "device number {} appears twice (the same member given twice, or a copy)",
                        sb.dev_number
                    ),
                })
            }
            Some(i) => {
                // The slot was given to a new member after this one left (md reuses the slots
                // of absent members): the fresher claim is the current one (mdadm's rule).
                let newer = found[i].1.events > sb.events;
                let (old_name, new_name) = if newer {
                    (dev.name().to_string(), found[i].0.name().to_string())
                } else {
                    (found[i].0.name().to_string(), dev.name().to_string())
                };
                tracing::warn!(member = %old_name, dev_number = sb.dev_number, "device number now held by the fresher {new_name}; left out");
                if !newer {
                    found[i] = (dev, sb);
                }
            }
        }
    }
    Ok(found)
}

/// Give roles by the freshest role table; keep spares aside and note who is left out and why.
fn place(found: Vec<Found>, best: &Superblock) -> Result<Placement> {
    let n = best.raid_disks as usize;
    let mut p = Placement {
        by_role: (0..n).map(|_| None).collect(),
        spares: Vec::new(),
        journal: None,
        left_out: Vec::new(),
        forced: Vec::new(),
    };
    for (dev, sb) in found {
        // The journal's superblock falls behind when commits fail on a log that is failing;
        // its log is no less valid for that (its tail is recorded on it alone): a log the
        // role table still names is replayed whatever its events say.
        let named_journal =
            sb.role() == DevRole::Journal && best.role_of(sb.dev_number) == DevRole::Journal;
        if sb.events + 1 < best.events && !named_journal {
            tracing::warn!(member = %dev.name(), events = sb.events, freshest = best.events, "stale member left out (events behind)");
            p.left_out.push(((dev, sb), LeftOut::Stale));
            continue;
        }
        match best.role_of(sb.dev_number) {
            DevRole::Active(r) if (r as usize) < n => {
                p.by_role[r as usize] = Some((dev, own_progress(sb, r)));
            }
            DevRole::Active(r) => {
                return Err(EngineError::Assemble {
                    member: dev.name().into(),
                    reason: format!("role {r} outside the {n} raid devices"),
                })
            }
            DevRole::Spare => p.spares.push((dev, sb)),
            DevRole::Faulty => {
                tracing::warn!(member = %dev.name(), "member recorded as faulty; left out");
                p.left_out.push(((dev, sb), LeftOut::Faulty));
            }
            DevRole::Journal if best.feature_map & format::feature::JOURNAL == 0 => {
                return Err(EngineError::Assemble {
                    member: dev.name().into(),
                    reason: "a journal device, but the array has no journal".into(),
                })
            }
            DevRole::Journal => p.journal = Some((dev, sb)),
        }
    }
    Ok(p)
}

/// How far a member given role `r` by the freshest table is in sync, by its own superblock.
/// Its own record is the conservative one: a member whose own superblock does not give it role
/// `r` (a spare whose activation reached the others' superblocks but not its own) has rebuilt
/// nothing that can be trusted, so it rebuilds from the start (md takes each member's role from
/// its own superblock, which leaves it a spare: the same outcome).
fn own_progress(mut sb: Superblock, r: u16) -> Superblock {
    if sb.role() != DevRole::Active(r) {
        tracing::warn!(dev_number = sb.dev_number, role = r, "the role table gives this member a role its own superblock does not record; it rebuilds from the start");
        sb.feature_map |= format::feature::RECOVERY_OFFSET;
        sb.recovery_offset = 0;
    }
    sb
}

/// A member left out whose own superblock gives it a role it could take back by force.
struct Candidate {
    /// Index into `Placement::left_out`.
    idx: usize,
    role: usize,
    behind: u64,
}

/// Members that forcing would take back, freshest first, and whether the array then survives.
/// Also returns why other left-out members cannot be taken (for the error message).
fn force_plan(
    p: &Placement,
    geometry: &Geometry,
    best: &Superblock,
) -> (Vec<Candidate>, bool, Vec<String>) {
    let n = p.by_role.len();
    let mut failed: Vec<bool> = p.by_role.iter().map(Option::is_none).collect();
    let mut order: Vec<usize> = (0..p.left_out.len()).collect();
    // Freshest first; ties in the order the members were given.
    order.sort_by_key(|&i| std::cmp::Reverse(p.left_out[i].0 .1.events));
    let mut chosen = Vec::new();
    let mut refused = Vec::new();
    for idx in order {
        if geometry.survives(&failed) {
            break;
        }
        let ((dev, sb), _) = &p.left_out[idx];
        let role = match sb.role() {
            DevRole::Active(r) if (r as usize) < n => r as usize,
            _ => continue,
        };
        let why_not = if !failed[role] {
            Some(format!("its role {role} is taken"))
        } else if sb.feature_map & format::feature::RECOVERY_OFFSET != 0 {
            Some(format!("it was only partly rebuilt into role {role}"))
        } else if sb.dev_number as usize >= best.dev_roles.len() {
            Some(format!(
                "its slot {} is outside the role table",
                sb.dev_number
            ))
        } else {
            None
        };
        if let Some(why) = why_not {
            refused.push(format!("{} ({why})", dev.name()));
            continue;
        }
        failed[role] = false;
        chosen.push(Candidate {
            idx,
            role,
            behind: best.events.saturating_sub(sb.events),
        });
    }
    let survives = geometry.survives(&failed);
    (chosen, survives, refused)
}

fn describe(p: &Placement, c: &Candidate) -> String {
    let ((dev, _), why) = &p.left_out[c.idx];
    let recorded = if *why == LeftOut::Faulty {
        ", recorded faulty"
    } else {
        ""
    };
    let s = if c.behind == 1 { "" } else { "s" };
    format!(
        "{} (role {}, {} event{s} behind{recorded})",
        dev.name(),
        c.role,
        c.behind
    )
}

/// Fail unless the array survives its missing roles; with `force`, take left-out members back
/// (see the module notes) until it does.
fn ensure_survives(
    p: &mut Placement,
    geometry: &Geometry,
    best: &Superblock,
    array_name: &str,
    force: bool,
) -> Result<()> {
    let failed: Vec<bool> = p.by_role.iter().map(Option::is_none).collect();
    if geometry.survives(&failed) {
        return Ok(());
    }
    let n = failed.len();
    let have = failed.iter().filter(|f| !**f).count();
    let short = format!(
        "too few members to run: {have} of {n} present and current, {} tolerates {} missing",
        geometry.level().name(),
        geometry.max_degraded()
    );
    let (chosen, survives, refused) = force_plan(p, geometry, best);
    let listed: Vec<String> = chosen.iter().map(|c| describe(p, c)).collect();
    let not_taken = if refused.is_empty() {
        String::new()
    } else {
        format!("; cannot take back {}", refused.join(", "))
    };
    let fail = |reason: String| EngineError::Assemble {
        member: format!("array '{array_name}'"),
        reason,
    };
    if !survives {
        let tried = if listed.is_empty() {
            "no left-out member holds a missing role".to_string()
        } else {
            format!("even with {} it would not survive", listed.join(", "))
        };
        let with = if force { " even with --force" } else { "" };
        return Err(fail(format!("{short}{with}: {tried}{not_taken}")));
    }
    if !force {
        return Err(fail(format!(
            "{short}; `run --force` would take back {} (their data is as old as their events){not_taken}",
            listed.join(", ")
        )));
    }
    for c in &chosen {
        let ((dev, _), why) = &p.left_out[c.idx];
        tracing::warn!(
            array = %array_name,
            member = %dev.name(),
            role = c.role,
            events_behind = c.behind,
            recorded_faulty = *why == LeftOut::Faulty,
            "forced into the array (--force): {}; writes since it left are missing from it",
            describe(p, c)
        );
    }
    // Move the chosen members into their roles (highest index first so indices stay valid).
    let mut take: Vec<&Candidate> = chosen.iter().collect();
    take.sort_by_key(|c| std::cmp::Reverse(c.idx));
    for c in take {
        let (found, _) = p.left_out.remove(c.idx);
        p.by_role[c.role] = Some(found);
        p.forced.push((c.role, c.behind));
    }
    Ok(())
}

fn check_sizes(p: &Placement, best: &Superblock, level: Level) -> Result<()> {
    if level == Level::Raid0 || level == Level::Linear {
        return Ok(());
    }
    for (dev, sb) in p.by_role.iter().flatten().chain(p.spares.iter()) {
        let needed = (sb.data_offset + best.size) * 512;
        if dev.len_bytes() < needed {
            return Err(EngineError::Assemble {
                member: dev.name().into(),
                reason: format!(
                    "device has {} bytes but the array needs {needed}",
                    dev.len_bytes()
                ),
            });
        }
    }
    Ok(())
}

/// Roles with no member although the freshest role table records a working member in them:
/// the member was not given (md: "need N to start it (use --run to insist)").
fn check_unfailed_missing(p: &Placement, best: &Superblock, array_name: &str) -> Result<()> {
    let missing: Vec<String> = p
        .by_role
        .iter()
        .enumerate()
        .filter(|(_, m)| m.is_none())
        .filter_map(|(r, _)| {
            let slot = best
                .dev_roles
                .iter()
                .position(|&role| usize::from(role) == r)?;
            Some(format!("role {r} (device {slot})"))
        })
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    let n = p.by_role.len();
    let have = p.by_role.iter().flatten().count();
    Err(EngineError::Assemble {
        member: format!("array '{array_name}'"),
        reason: format!(
            "{have} of {n} members present and current, but the superblocks record {} as \
             working (never failed); give every member, or `run --run` to start degraded (the \
             missing ones are then recorded faulty and need a full rebuild)",
            missing.join(", ")
        ),
    })
}

/// md's `start_dirty_degraded`: see the module notes.
fn check_dirty_degraded(
    p: &Placement,
    best: &Superblock,
    level: Level,
    array_name: &str,
    force: bool,
) -> Result<()> {
    if best.resync_offset == MAX_SECTOR || !level.is_parity() {
        return Ok(());
    }
    let gaps: Vec<String> = p
        .by_role
        .iter()
        .enumerate()
        .filter_map(|(r, m)| match m {
            None => Some(format!("role {r} missing")),
            Some((dev, sb)) if sb.feature_map & format::feature::RECOVERY_OFFSET != 0 => {
                Some(format!("role {r} only partly rebuilt on {}", dev.name()))
            }
            Some(_) => None,
        })
        .collect();
    if gaps.is_empty() {
        return Ok(());
    }
    let lvl = level.name().to_uppercase();
    let risk = format!(
        "was not stopped cleanly and is degraded ({}), so the {lvl} write hole applies: stripes \
         being written at the crash may have parity that disagrees with their data, and with a \
         member missing the chunks reconstructed from them may be silently wrong",
        gaps.join(", ")
    );
    if force {
        tracing::warn!(array = %array_name, "{risk}; starting anyway (--force)");
        return Ok(());
    }
    Err(EngineError::Assemble {
        member: format!("array '{array_name}'"),
        reason: format!(
            "refusing to start: it {risk}; `run --force` starts it anyway (a write journal, \
             once implemented, removes this risk)"
        ),
    })
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

fn new_member(dev: Arc<dyn Device>, sb: &Superblock) -> Arc<Member> {
    match Member::from_sb(dev.clone(), sb) {
        Ok(m) => Arc::new(m),
        Err(e) => {
            // Unreadable log: run without its entries (reads there are tried on the device).
            tracing::warn!(member = %dev.name(), "bad-block log unreadable: {e}");
            Arc::new(Member::fresh(dev, sb))
        }
    }
}

/// The role table the array runs with: the freshest one, with forced members back in their
/// roles (and any other slot claiming such a role recorded faulty), and every role nobody fills
/// recorded faulty wherever the table still claims it.
fn running_roles(
    best: &Superblock,
    by_role: &[Option<Found>],
    forced: &[(usize, u64)],
) -> Vec<u16> {
    let mut roles = best.dev_roles.clone();
    for &(r, _) in forced {
        let Some((_, sb)) = &by_role[r] else {
            unreachable!("a forced role is filled")
        };
        for (slot, raw) in roles.iter_mut().enumerate() {
            if slot == sb.dev_number as usize {
                *raw = r as u16;
            } else if *raw == r as u16 {
                *raw = format::ROLE_FAULTY;
            }
        }
    }
    for (r, m) in by_role.iter().enumerate() {
        if m.is_none() {
            for raw in roles.iter_mut().filter(|raw| **raw == r as u16) {
                *raw = format::ROLE_FAULTY;
            }
        }
    }
    roles
}

/// Where a resync must start (sync coordinates, bytes), if one is owed. A clustered array's
/// superblocks say "clean" when the last node to stop did so cleanly, which says nothing of
/// another node that crashed before: a node's own slot keeps the bits of its writes in flight,
/// so each of them needs a resync whatever the superblocks say (a clean stop clears the slot,
/// so there is none after one).
fn resync_at_start(best: &Superblock, geometry: &Geometry) -> Option<u64> {
    let was_dirty = best.resync_offset != MAX_SECTOR;
    let clustered = best.feature_map & format::feature::CLUSTERED != 0;
    (was_dirty && geometry.max_degraded() > 0)
        .then(|| best.resync_offset * 512)
        .or_else(|| clustered.then_some(0))
}

fn build(
    opts: AssembleOptions,
    name: String,
    best: Superblock,
    geometry: Geometry,
    p: Placement,
) -> Result<Array> {
    let roles = running_roles(&best, &p.by_role, &p.forced);
    let table_changed = roles != best.dev_roles || !p.forced.is_empty();
    let (members, slots, spare_members) = fill_slots(p.by_role, p.spares);
    let was_dirty = best.resync_offset != MAX_SECTOR;
    let resync_from = resync_at_start(&best, &geometry);
    let node_slot = opts
        .config
        .coordinator
        .as_deref()
        .map_or(0, |c| c.slot_number());
    let bitmap = load_bitmap(&best, &geometry, &slots, node_slot, resync_from)?;
    let used = used_map_of(&best, &geometry, &slots, bitmap.as_ref(), &opts.config)?;
    let mut meta = Meta {
        clock: opts.config.clock.clone().expect("assemble sets the clock"),
        members,
        events: best.events,
        resync_offset: best.resync_offset,
        roles,
        recorders: recorders(bitmap.as_ref(), used.as_ref()),
    };
    let slots = Arc::new(slots);
    let integrity = load_integrity(&best, &geometry, &slots, opts.config.integrity_cache_bytes)?;
    let mut opts = opts;
    let disks = Disks {
        geometry: &geometry,
        slots: &slots,
        integrity: integrity.as_deref(),
    };
    let journal = open_journal(&mut opts, &best, disks, p.journal, &mut meta, &name)?;
    let table_changed = table_changed || journal.table_changed;
    let resync_from = journal.resync_from.or(resync_from);
    let commit_table = table_changed && !opts.config.read_only;
    // The guided flag needs the bitmap it falls back to; without a readable map the array
    // runs as a bitmap array (always safe).
    let flag = |f: u32| used.as_ref().is_some_and(|u| u.has_flag(f));
    let guided = bitmap.is_some() && flag(format::USED_MAP_FLAG_GUIDED);
    let resync_owed = flag(format::USED_MAP_FLAG_RESYNC_OWED);
    let unguided = flag(format::USED_MAP_FLAG_UNGUIDED);
    let array = Array::from_parts(ArrayParts {
        guided,
        resync_owed,
        unguided,
        name,
        uuid: best.set_uuid,
        geometry,
        slots,
        meta,
        config: opts.config,
        was_dirty,
        never_run: best.events == 0,
        spares: spare_members,
        resync_from,
        bitmap,
        used,
        journal: journal.journal,
        integrity,
        read_only_reason: journal.read_only_reason,
    })?;
    if let Some(replay) = journal.replay {
        replay.write_home(&array.parts, array.policy.journal())?;
    }
    log_recovered(&array);
    if journal.forget || commit_table {
        let mut meta = array.members.meta.lock();
        if journal.forget {
            forget_journal(&mut meta);
        }
        if commit_table {
            commit_at_assembly(&array, &mut meta)?;
        }
    }
    if !array.is_read_only() {
        // A log that was replayed but could not be written again: what it held goes out to
        // the members (data without parity from memory) before it is recorded faulty and
        // before anything is served.
        array.settle_journal()?;
    }
    if journal.write_back && !array.is_read_only() && array.journal_healthy() {
        if let Err(e) = array.set_journal_mode(true) {
            tracing::warn!(array = %array.name(), "journal starts in write-through instead of write-back: {e}");
        }
    }
    Ok(array)
}

/// The role slots as placed, and every member with its superblock (spares after the roles).
fn fill_slots(
    by_role: Vec<Option<Found>>,
    spares: Vec<Found>,
) -> (Vec<MemberSb>, Vec<Slot>, Vec<Arc<Member>>) {
    let mut members = Vec::new();
    let mut slots = Vec::new();
    for entry in by_role {
        let slot = match entry {
            Some((dev, sb)) => {
                let m = new_member(dev, &sb);
                let slot = Slot::new(Some(m.clone()));
                if sb.feature_map & format::feature::RECOVERY_OFFSET != 0 {
                    // Rebuilt only up to here when the daemon stopped; the rebuild resumes
                    // (still limited to the bitmap's set chunks if it was a re-add).
                    slot.advance(sb.recovery_offset * 512);
                    slot.set_bitmap_guided(sb.feature_map & format::feature::RECOVERY_BITMAP != 0);
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
    (members, slots, spare_members)
}

/// The integrity records of an array created with them, loaded from the members' zones.
fn load_integrity(
    best: &Superblock,
    geometry: &Geometry,
    slots: &Arc<Vec<Slot>>,
    cache_bytes: usize,
) -> Result<Option<Arc<crate::integrity::Integrity>>> {
    if best.feature_map & format::FEATURE_INTEGRITY == 0 {
        return Ok(None);
    }
    let Some(copies) = format::table_copies(best.level, geometry.raid_disks()) else {
        return Err(EngineError::Unsupported(format!(
            "integrity records on level {} with {} members",
            best.level,
            geometry.raid_disks()
        )));
    };
    let zone = format::Zone::new(geometry.raid_disks(), copies, best.size);
    if zone.end_sectors() > best.data_size {
        return Err(EngineError::Unsupported(format!(
            "integrity zone ends at sector {} of the data area, past its {} sectors",
            zone.end_sectors(),
            best.data_size
        )));
    }
    let twins = (0..geometry.raid_disks())
        .map(|r| geometry.device_twins(r))
        .collect();
    let integrity =
        crate::integrity::Integrity::new(best.set_uuid, zone, twins, slots.clone(), cache_bytes);
    integrity.load();
    Ok(Some(Arc::new(integrity)))
}

/// The array's members as assembly has placed them, with the records of an integrity array.
#[derive(Clone, Copy)]
struct Disks<'a> {
    geometry: &'a Geometry,
    slots: &'a [Slot],
    integrity: Option<&'a crate::integrity::Integrity>,
}

/// What assembly decided about the journal.
#[derive(Default)]
struct JournalSetup {
    journal: Option<Arc<Journal>>,
    /// The journal device asks for write-back mode.
    write_back: bool,
    /// The role table changed (journal dropped or added).
    table_changed: bool,
    /// A resync the journal decision requires (the old log is lost).
    resync_from: Option<u64>,
    read_only_reason: Option<String>,
    /// What the recovered log writes home once the array is built (through its commit point).
    replay: Option<PendingReplay>,
    /// The journal is dropped: the role table and feature bits forget it once its log is home.
    forget: bool,
}

/// What assembly does about the journal, decided from the options, the superblocks and the
/// devices found, before anything is written.
enum JournalPlan {
    /// The array has no journal.
    Absent,
    /// Run without one; a log still found is recovered first, so what it holds goes home.
    Drop(Option<Found>),
    /// The journal is lost: this device becomes a new, empty one.
    Start(Arc<dyn Device>),
    /// The journal was found: recover it.
    Recover(Found),
    /// The journal is lost and nothing was asked: start read-only (md's rule).
    Missing,
}

fn plan_journal(
    opts: &mut AssembleOptions,
    best: &Superblock,
    slots: &[Slot],
    found: Option<Found>,
    name: &str,
) -> Result<JournalPlan> {
    let fail = |reason: String| EngineError::Assemble {
        member: format!("array '{name}'"),
        reason,
    };
    let has = best.feature_map & format::feature::JOURNAL != 0;
    let replacing = opts.drop_journal || opts.add_journal.is_some();
    if !has {
        if replacing {
            return Err(fail("has no journal to drop or replace".into()));
        }
        return Ok(JournalPlan::Absent);
    }
    if opts.drop_journal && opts.add_journal.is_some() {
        return Err(fail("drop the journal or add one, not both".into()));
    }
    if let (Some((dev, _)), Some(_)) = (&found, &opts.add_journal) {
        return Err(fail(format!(
            "already has its journal {}; nothing to replace",
            dev.name()
        )));
    }
    if replacing && found.is_none() && slots.iter().any(|s| !s.is_complete()) && !opts.force {
        // Without the log nobody knows whether stripes were being written at a crash (the
        // superblocks of a journal array do not say), and with a role missing a resync cannot
        // repair them.
        return Err(fail(format!(
            "refusing to {} the journal of a degraded array: if it crashed, stripes being \
             written then may have parity that disagrees with their data (the RAID write hole), \
             and with a member missing the chunks reconstructed from them may be silently \
             wrong; give the journal device if it still exists, add the missing member back, or \
             use --force",
            if opts.drop_journal { "drop" } else { "replace" }
        )));
    }
    if opts.drop_journal {
        return Ok(JournalPlan::Drop(found));
    }
    Ok(match (found, opts.add_journal.take()) {
        (Some(found), _) => JournalPlan::Recover(found),
        (None, Some(dev)) => JournalPlan::Start(dev),
        (None, None) => JournalPlan::Missing,
    })
}

/// Recover the journal, or start read-only when it is missing (md's rule), unless told to
/// drop it or to start a new one.
fn open_journal(
    opts: &mut AssembleOptions,
    best: &Superblock,
    disks: Disks<'_>,
    found: Option<Found>,
    meta: &mut Meta,
    name: &str,
) -> Result<JournalSetup> {
    let read_only = opts.config.read_only;
    let (dev, sb, mut setup) = match plan_journal(opts, best, disks.slots, found, name)? {
        JournalPlan::Absent => return Ok(JournalSetup::default()),
        JournalPlan::Drop(found) => return drop_journal(disks, found, meta, name, read_only),
        JournalPlan::Missing => {
            let slot = best
                .dev_roles
                .iter()
                .position(|&r| r == format::ROLE_JOURNAL)
                .map_or("recorded faulty".to_string(), |s| format!("slot {s}"));
            let why = format!(
                "its journal device ({slot}) is missing: stripes being written at a crash \
                 cannot be repaired without it, so writes are refused; `run --add-journal DEV` \
                 starts a new journal and `run --drop-journal` runs without one (both resync \
                 the whole array)"
            );
            tracing::warn!(array = %name, "starting read-only: {why}");
            opts.config.read_only = true;
            return Ok(JournalSetup {
                read_only_reason: Some(why),
                ..JournalSetup::default()
            });
        }
        JournalPlan::Recover((dev, sb)) => (dev, sb, JournalSetup::default()),
        JournalPlan::Start(dev) => {
            let sb = start_journal(best, meta, &dev, name)?;
            let setup = JournalSetup {
                table_changed: true,
                resync_from: Some(0),
                ..JournalSetup::default()
            };
            (dev, sb, setup)
        }
    };
    let member = new_member(dev, &sb);
    let (journal, replay) = crate::policy::journal::recover(
        member.clone(),
        &sb,
        disks.geometry,
        disks.slots,
        read_only,
        disks.integrity,
        meta.clock.as_ref(),
    )?;
    setup.write_back = sb.devflags & format::DEVFLAG_JOURNAL_WRITE_BACK != 0;
    // Its superblock keeps the old tail until the replay is home (`PendingReplay::write_home`).
    meta.members.push(MemberSb {
        member,
        sb,
        writable: true,
    });
    setup.journal = Some(Arc::new(journal));
    setup.replay = replay;
    Ok(setup)
}

/// What journal recovery found and did (once its replay is home).
fn log_recovered(array: &Array) {
    if let Some(j) = array.status().journal {
        let r = j.replayed;
        tracing::info!(array = %array.name(), journal = %j.device, units = r.units, torn = r.torn_units, pages = r.pages, data_only = r.data_only_pages, ms = r.millis, "journal recovered");
    }
}

/// Run without the journal: a log still found is recovered first (refused if it holds
/// write-back data without parity; its replay goes home once the array is built), then the role
/// table and feature bits forget it ([`forget_journal`]) and a full resync is owed.
fn drop_journal(
    disks: Disks<'_>,
    found: Option<Found>,
    meta: &mut Meta,
    name: &str,
    read_only: bool,
) -> Result<JournalSetup> {
    let mut replay = None;
    if let Some((dev, sb)) = found {
        let (_, pending) = crate::policy::journal::recover(
            new_member(dev, &sb),
            &sb,
            disks.geometry,
            disks.slots,
            read_only,
            disks.integrity,
            meta.clock.as_ref(),
        )?;
        if pending.as_ref().is_some_and(PendingReplay::holds_data_only) {
            return Err(EngineError::Assemble {
                member: format!("array '{name}'"),
                reason: "its journal holds write-back data that has no parity yet; run the array \
                     with its journal and stop it cleanly (which writes that data home), then \
                     drop the journal"
                    .into(),
            });
        }
        replay = pending;
    }
    meta.resync_offset = 0;
    tracing::warn!(array = %name, "journal dropped: the array runs with the resync policy; a full resync makes parity agree with data again");
    Ok(JournalSetup {
        table_changed: true,
        resync_from: Some(0),
        replay,
        forget: true,
        ..JournalSetup::default()
    })
}

/// The role table and feature bits forget a dropped journal. Only after its replay is home:
/// a cut before this commits leaves the log named, so the next start replays it again.
fn forget_journal(meta: &mut Meta) {
    for raw in meta
        .roles
        .iter_mut()
        .filter(|r| **r == format::ROLE_JOURNAL)
    {
        *raw = format::ROLE_FAULTY;
    }
    for m in &mut meta.members {
        m.sb.feature_map &= !format::feature::JOURNAL;
    }
}

/// Make `dev` the lost journal's successor: an empty log and its superblock; a full resync is
/// owed for what the old log held.
fn start_journal(
    best: &Superblock,
    meta: &mut Meta,
    dev: &Arc<dyn Device>,
    name: &str,
) -> Result<Superblock> {
    let sb = new_journal_sb(best, meta, dev.as_ref())?;
    let seq = crate::policy::journal::new_log_seq(meta.clock.as_ref());
    crate::policy::journal::write_empty_log(dev.as_ref(), &sb, seq)
        .and_then(|()| crate::members::write_superblock(&new_member(dev.clone(), &sb), &sb))
        .map_err(|e| EngineError::Assemble {
            member: dev.name().into(),
            reason: format!("cannot write the new journal: {e}"),
        })?;
    meta.resync_offset = 0;
    tracing::warn!(array = %name, journal = %dev.name(), "new journal; a full resync repairs what the lost log held");
    Ok(sb)
}

/// The superblock of a new journal device for an array whose journal was lost: the array's
/// fields, the slot of the old journal (or a free one), an empty log.
fn new_journal_sb(best: &Superblock, meta: &mut Meta, dev: &dyn Device) -> Result<Superblock> {
    let sectors = dev.len_bytes() / 512;
    if sectors < best.data_offset + crate::policy::journal::MIN_LOG_SECTORS {
        return Err(EngineError::Assemble {
            member: dev.name().into(),
            reason: format!("too small for a journal: {} bytes", dev.len_bytes()),
        });
    }
    // The lost journal's slot is recorded faulty and never reused: a journal the role table
    // names is replayed even when its superblock is behind (see `place`), so the old device
    // coming back must not find its slot naming a journal again.
    let old: Vec<usize> = (0..meta.roles.len())
        .filter(|&i| meta.roles[i] == format::ROLE_JOURNAL)
        .collect();
    for &i in &old {
        meta.roles[i] = format::ROLE_FAULTY;
    }
    let used: Vec<u32> = meta.members.iter().map(|m| m.member.dev_number).collect();
    let free = (0..meta.roles.len()).find(|&i| {
        !used.contains(&(i as u32)) && meta.roles[i] >= format::ROLE_MAX && !old.contains(&i)
    });
    let slot = free.unwrap_or_else(|| {
        meta.roles.push(format::ROLE_FAULTY);
        meta.roles.len() - 1
    });
    let max_dev = meta.roles.len() as u32;
    for m in meta.members.iter_mut() {
        m.sb.max_dev = m.sb.max_dev.max(max_dev);
    }
    meta.roles[slot] = format::ROLE_JOURNAL;
    let mut sb = best.clone();
    sb.dev_number = slot as u32;
    sb.max_dev = sb.max_dev.max(max_dev);
    sb.device_uuid = new_uuid(meta.clock.as_ref());
    sb.data_size = sectors - best.data_offset;
    sb.recovery_offset = 0;
    sb.feature_map &= !(format::feature::RECOVERY_OFFSET | format::feature::RECOVERY_BITMAP);
    sb.dev_roles = meta.roles.clone();
    Ok(sb)
}

/// The used-region map the array runs with. A write-back journal acknowledges writes its map
/// would not know of yet: arrays with a journal keep none (create writes none; this holds it
/// for members that were reused). A clustered array's node keeps the map of its own bitmap
/// slot (`policy::used_nodes`).
fn used_map_of(
    best: &Superblock,
    geometry: &Geometry,
    slots: &[Slot],
    bitmap: Option<&Arc<WriteIntentBitmap>>,
    config: &ArrayConfig,
) -> Result<Option<Arc<UsedRegions>>> {
    let node = crate::policy::used_nodes::ThisNode {
        slots: bitmap.map_or(0, |b| b.header().nodes as usize),
        own: bitmap.map_or(0, |b| b.slot() as usize),
        writable: !config.read_only,
    };
    if best.feature_map & format::feature::JOURNAL != 0 {
        return Ok(None);
    }
    if best.feature_map & format::feature::CLUSTERED == 0 {
        return Ok(load_used(best, geometry, slots));
    }
    let personality = crate::personality::for_geometry(geometry);
    if !personality.keeps_used_map() || node.slots == 0 {
        return Ok(None);
    }
    crate::policy::used_nodes::load(
        best,
        format::used_map_offset_sectors(best) * 512,
        personality.sync_total(crate::work::SyncAction::Resync),
        geometry.chunk_sectors() * 512,
        slots,
        node,
    )
    .map_err(|why| EngineError::Assemble {
        member: format!("array '{}'", best.set_name),
        reason: why,
    })
}

/// The used-region map, if the members in sync carry one for this array: the union of their
/// copies; a copy behind the superblocks (the array ran without it) counts as all used.
fn load_used(best: &Superblock, geometry: &Geometry, slots: &[Slot]) -> Option<Arc<UsedRegions>> {
    let personality = crate::personality::for_geometry(geometry);
    if !personality.keeps_used_map() {
        return None;
    }
    let base = format::used_map_offset_sectors(best) * 512;
    let sync_bytes = personality.sync_total(crate::work::SyncAction::Resync);
    let mut header: Option<format::UsedMapHeader> = None;
    let mut bits: Vec<u8> = Vec::new();
    for m in slots
        .iter()
        .filter(|s| s.is_complete())
        .filter_map(|s| s.member())
    {
        let Ok((h, b)) = crate::policy::used::read_map(m.dev.as_ref(), base) else {
            continue;
        };
        // Regions cover whole stripes (reads of unused ones are answered per region).
        let chunk = geometry.chunk_sectors() * 512;
        let whole = h.region_bytes.is_power_of_two() && (chunk == 0 || h.region_bytes % chunk == 0);
        if h.uuid != best.set_uuid || !whole || h.regions != sync_bytes.div_ceil(h.region_bytes) {
            continue;
        }
        if header
            .as_ref()
            .is_some_and(|k| k.region_bytes != h.region_bytes)
        {
            return None;
        }
        if bits.len() < b.len() {
            bits.resize(b.len(), 0);
        }
        // Trusted only when written with these very superblocks, and they were written by us
        // last. Behind them: someone ran the array without the map. Ahead: a cut came between
        // the map's header and the superblocks, and md may have run the array since (it takes
        // its count back down after a dirty/clean cycle). At their count with another utime:
        // md's count came back to the map's. Written by md (utime without microseconds): an md
        // run within the same second as our last superblock write.
        let stale = h.events != best.events
            || h.sb_utime != best.utime
            || format::written_by_md(best.utime);
        if stale {
            tracing::warn!(member = %m.name(),
                "used-region map was not written with the superblocks (md may have run the array): every region counts as used");
        }
        for (dst, src) in bits.iter_mut().zip(&b) {
            *dst |= if stale { 0xff } else { *src };
        }
        header.get_or_insert(h);
    }
    let mut h = header?;
    h.events = best.events;
    h.sb_utime = best.utime;
    Some(Arc::new(UsedRegions::load(base, h, &bits)))
}

/// The write-intent bitmap of an array whose superblock announces one: the union of the
/// copies on the members in sync (a copy behind the superblocks counts as all ones, as in md).
/// Copies that do not decode or belong elsewhere are skipped; none usable refuses assembly.
/// The write-intent bitmap of an array whose superblock announces one: the union of the
/// copies on the members in sync (a copy behind the superblocks counts as all ones, as in md).
/// Copies that do not decode or belong elsewhere are skipped; none usable refuses assembly.
/// A clustered bitmap (md-cluster) is read at this node's slot only, the union taken per
/// slot; the slot must exist. Without a cluster there is one bitmap, slot 0.
fn load_bitmap(
    best: &Superblock,
    geometry: &Geometry,
    slots: &[Slot],
    node_slot: usize,
    resync_from: Option<u64>,
) -> Result<Option<Arc<WriteIntentBitmap>>> {
    if best.feature_map & format::feature::BITMAP_OFFSET == 0 {
        return Ok(None);
    }
    if best.bitmap_offset != format::BITMAP_OFFSET_SECTORS {
        return Err(EngineError::Assemble {
            member: format!("array '{}'", best.set_name),
            reason: format!(
                "internal bitmap at offset {} sectors is not supported (ironraid reads it at +{})",
                best.bitmap_offset,
                format::BITMAP_OFFSET_SECTORS
            ),
        });
    }
    let want_sync = crate::personality::for_geometry(geometry)
        .sync_total(crate::work::SyncAction::Resync)
        / 512;
    let clustered = best.feature_map & format::feature::CLUSTERED != 0;
    if node_slot != 0 && !clustered {
        return Err(EngineError::Unsupported(format!(
            "array '{}' keeps one write-intent bitmap (slot 0); this node was given slot \
             {node_slot}, which needs md-cluster's per-node bitmaps (create --nodes)",
            best.set_name
        )));
    }
    let slot = u32::try_from(node_slot).unwrap_or(u32::MAX);
    let (sb, bits) = union_of_slot(best, slots, slot, want_sync)?;
    Ok(Some(Arc::new(WriteIntentBitmap::load(
        sb,
        slot,
        &bits,
        resync_from,
    ))))
}

/// Node slot `slot`'s header (the newest) and the union of its bits over the members in sync.
pub(crate) fn union_of_slot(
    best: &Superblock,
    slots: &[Slot],
    slot: u32,
    want_sync: u64,
) -> Result<(format::BitmapSuper, Vec<u8>)> {
    let mut header: Option<format::BitmapSuper> = None;
    let mut bits: Vec<u8> = Vec::new();
    let mut problems = Vec::new();
    for m in slots
        .iter()
        .filter(|s| s.is_complete())
        .filter_map(|s| s.member())
    {
        let (sb, b) = match crate::policy::bitmap::read_bitmap_slot(m.dev.as_ref(), slot) {
            Ok(found) => found,
            Err(e) => {
                problems.push(format!("{}: {e}", m.name()));
                continue;
            }
        };
        if sb.uuid != best.set_uuid || sb.sync_size != want_sync {
            problems.push(format!(
                "{}: bitmap belongs to another array or size ({} sectors, expected {want_sync})",
                m.name(),
                sb.sync_size
            ));
            continue;
        }
        // A node's slot lags the superblocks the other nodes go on writing: md checks a
        // clustered slot's events against nothing (`md_bitmap_read_sb`), nor does this.
        let behind = !sb.is_clustered() && sb.events < best.events;
        let stale = behind || sb.is_stale();
        if stale {
            tracing::warn!(member = %m.name(), bitmap_events = sb.events, events = best.events, "write-intent bitmap is out of date: every chunk counts as dirty");
        }
        if bits.len() < b.len() {
            bits.resize(b.len(), 0);
        }
        for (dst, src) in bits.iter_mut().zip(&b) {
            *dst |= if stale { 0xff } else { *src };
        }
        if header.as_ref().is_none_or(|h| sb.events > h.events) {
            header = Some(sb);
        }
    }
    let Some(mut sb) = header else {
        return Err(EngineError::Assemble {
            member: format!("array '{}'", best.set_name),
            reason: format!("no usable write-intent bitmap: {}", problems.join("; ")),
        });
    };
    for p in &problems {
        tracing::warn!(array = %best.set_name, "bitmap copy skipped: {p}");
    }
    sb.state &= !format::bitmap_state::STALE;
    sb.events = sb.events.max(best.events);
    Ok((sb, bits))
}

/// Make the running role table durable on every present member before the array serves
/// (after a journal's replay: a dropped log is forgotten only once it is home), through the
/// member set like every later commit; a member that cannot record it stops the start.
fn commit_at_assembly(array: &Array, meta: &mut Meta) -> Result<()> {
    let name = array.name();
    if let Some((member, err)) = array.members.commit_held(meta).into_first() {
        return Err(EngineError::Assemble {
            member: member.name().into(),
            reason: format!(
                "cannot record the role table of array '{name}' in its superblock: {err}"
            ),
        });
    }
    tracing::info!(array = %name, events = meta.events, "role table recorded in every member's superblock");
    Ok(())
}

/// What records each new event count before the superblocks do, in md's order: the bitmap,
/// then the used-region map.
fn recorders(
    bitmap: Option<&Arc<crate::policy::bitmap::WriteIntentBitmap>>,
    used: Option<&Arc<crate::policy::used::UsedRegions>>,
) -> Vec<Arc<dyn crate::members::EventRecorder>> {
    let mut out: Vec<Arc<dyn crate::members::EventRecorder>> = Vec::new();
    if let Some(b) = bitmap {
        out.push(b.clone());
    }
    if let Some(u) = used {
        out.push(u.clone());
    }
    out
}
