//! `ironraid examine`: what each member's superblock says, as text or JSON.

use crate::member::Opener;
use crate::size;
use anyhow::{anyhow, bail, Context};
use device::{Device, OpenMode};
use format::{DevRole, Superblock};
use layout::{Geometry, GeometrySpec, Level};
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::sync::Arc;

#[derive(Serialize)]
struct Examined {
    path: String,
    uuid: String,
    name: String,
    level: String,
    layout: Option<String>,
    chunk_bytes: u64,
    raid_disks: u32,
    role: Option<u16>,
    device_role: &'static str,
    dev_number: u32,
    events: u64,
    state: &'static str,
    data_offset_sectors: u64,
    data_size_sectors: u64,
    component_sectors: u64,
    array_size_bytes: Option<u64>,
    device_uuid: String,
    feature_map: u32,
    /// Where the internal write-intent bitmap starts, relative to the superblock (null: none).
    bitmap_offset_sectors: Option<i32>,
    array_state: String,
    /// On the journal device: `journal_tail`, the meta block recovery starts from, in sectors
    /// from its data offset (the superblock's `recovery_offset` field; null elsewhere).
    journal_tail_sectors: Option<u64>,
    /// On the journal device: bytes of the log ring (its data area in whole 4 KiB pages).
    journal_log_bytes: Option<u64>,
    /// On the journal device: the block at the tail, as recovery will read it.
    journal_tail_block: Option<TailBlock>,
    /// The integrity records' checksum ("crc32c"; null: the array keeps none).
    integrity: Option<&'static str>,
    /// Where this member's integrity zone starts, sectors from the data offset (null: none).
    integrity_zone_sectors: Option<u64>,
    /// How many table copies of each member's records there are.
    integrity_copies: Option<usize>,
    /// md-cluster's per-node bitmaps (null: not a clustered array).
    cluster: Option<ExaminedCluster>,
}

/// A clustered member's bitmap: the cluster's name and every node slot.
#[derive(Serialize)]
struct ExaminedCluster {
    name: String,
    nodes: u32,
    slots: Vec<ExaminedSlot>,
}

/// One node slot of a clustered bitmap, as `mdadm -X` lists it.
#[derive(Serialize)]
struct ExaminedSlot {
    slot: u32,
    /// Null when the slot cannot be read (`problem` says why).
    events: Option<u64>,
    events_cleared: Option<u64>,
    chunks: Option<u64>,
    dirty_chunks: Option<u64>,
    problem: Option<String>,
}

/// Every node slot of a clustered member's bitmap; `None` unless the superblock says clustered
/// and slot 0 reads.
fn describe_cluster(d: &dyn Device, sb: &Superblock) -> Option<ExaminedCluster> {
    if sb.feature_map & format::feature::CLUSTERED == 0
        || !has_bitmap(sb)
        || sb.bitmap_offset != format::BITMAP_OFFSET_SECTORS
    {
        return None;
    }
    let (first, _) = engine::read_bitmap(d).ok()?;
    let slots = (0..first.slots())
        .map(|slot| match engine::read_bitmap_slot(d, slot) {
            Ok((bm, bits)) => ExaminedSlot {
                slot,
                events: Some(bm.events),
                events_cleared: Some(bm.events_cleared),
                chunks: Some(bm.chunks()),
                dirty_chunks: Some(format::count_dirty(&bits, bm.chunks())),
                problem: None,
            },
            Err(e) => ExaminedSlot {
                slot,
                events: None,
                events_cleared: None,
                chunks: None,
                dirty_chunks: None,
                problem: Some(e),
            },
        })
        .collect();
    Some(ExaminedCluster {
        name: first.cluster_name(),
        nodes: first.nodes,
        slots,
    })
}

fn print_cluster_text(c: &ExaminedCluster) {
    println!("   Cluster Name : {}", c.name);
    println!("  Cluster Nodes : {}", c.nodes);
    for s in &c.slots {
        match (s.dirty_chunks, s.chunks, &s.problem) {
            (Some(dirty), Some(chunks), _) => println!(
                "    Node Slot {} : {dirty} dirty of {chunks} chunks, events {}",
                s.slot,
                s.events.unwrap_or(0)
            ),
            (_, _, problem) => println!(
                "    Node Slot {} : unreadable ({})",
                s.slot,
                problem.as_deref().unwrap_or("?")
            ),
        }
    }
}

/// The meta block at `journal_tail` (reference §6.2): where recovery starts.
#[derive(Serialize)]
struct TailBlock {
    /// A meta block of this array (magic, version, checksum and position all right).
    valid: bool,
    /// Its sequence number (null: not valid).
    seq: Option<u64>,
    /// Pages of its io unit (null: not valid).
    pages: Option<u64>,
    /// Why it is not (null: valid). Recovery then starts an empty log.
    problem: Option<String>,
}

fn array_size(sb: &Superblock) -> Option<u64> {
    let level = Level::from_md(sb.level)?;
    let n = sb.raid_disks as usize;
    let g = Geometry::new(GeometrySpec {
        level,
        layout: sb.layout,
        chunk_sectors: u64::from(sb.chunksize),
        raid_disks: n,
        component_sectors: sb.size,
        // One member cannot know the others' sizes; for linear/RAID0 assume equal members.
        device_sectors: vec![sb.data_size; n],
    })
    .ok()?;
    Some(g.array_sectors() * 512)
}

/// Sectors of the ring on a journal device: its data area, in whole 4 KiB pages.
fn journal_log_sectors(sb: &Superblock) -> u64 {
    let page = u64::from(format::PAGE_SECTORS);
    sb.data_size / page * page
}

/// Read and check the meta block at the journal tail of `d` (a journal device).
fn tail_block(d: &dyn Device, sb: &Superblock) -> TailBlock {
    let tail = sb.recovery_offset;
    let invalid = |problem: String| TailBlock {
        valid: false,
        seq: None,
        pages: None,
        problem: Some(problem),
    };
    if tail >= journal_log_sectors(sb) {
        return invalid(format!(
            "journal_tail {tail} lies beyond the log ({} sectors)",
            journal_log_sectors(sb)
        ));
    }
    let mut buf = device::AlignedBuf::zeroed(format::JOURNAL_BLOCK);
    if let Err(e) = d.read_at(&mut buf, (sb.data_offset + tail) * 512) {
        return invalid(format!("cannot read it: {e}"));
    }
    match format::MetaBlock::decode(&buf, format::journal_seed(&sb.set_uuid), tail) {
        Ok(m) => TailBlock {
            valid: true,
            seq: Some(m.seq),
            pages: Some(m.pages() as u64),
            problem: None,
        },
        Err(e) => invalid(e.to_string()),
    }
}

fn describe(path: &str, sb: &Superblock) -> Examined {
    let (role, device_role) = match sb.role() {
        DevRole::Active(r) => (Some(r), "active"),
        DevRole::Spare => (None, "spare"),
        DevRole::Faulty => (None, "faulty"),
        DevRole::Journal => (None, "journal"),
    };
    let level = Level::from_md(sb.level);
    let zone = (sb.feature_map & format::FEATURE_INTEGRITY != 0)
        .then(|| format::table_copies(sb.level, sb.raid_disks as usize))
        .flatten()
        .map(|copies| format::Zone::new(sb.raid_disks as usize, copies, sb.size));
    let mut state = vec!['.'; sb.raid_disks as usize];
    for raw in &sb.dev_roles {
        if let Some(c) = state.get_mut(*raw as usize) {
            *c = if *c == '.' { 'A' } else { 'R' };
        }
    }
    Examined {
        path: path.to_string(),
        uuid: format::format_uuid_mdadm(&sb.set_uuid),
        name: sb.set_name.clone(),
        level: level
            .map(|l| l.name().to_string())
            .unwrap_or_else(|| format!("unknown({})", sb.level)),
        layout: level.and_then(|l| layout::layout_name(l, sb.layout)),
        chunk_bytes: u64::from(sb.chunksize) * 512,
        raid_disks: sb.raid_disks,
        role,
        device_role,
        dev_number: sb.dev_number,
        events: sb.events,
        state: if sb.is_clean() { "clean" } else { "active" },
        data_offset_sectors: sb.data_offset,
        data_size_sectors: sb.data_size,
        component_sectors: sb.size,
        array_size_bytes: array_size(sb),
        device_uuid: format::format_uuid_mdadm(&sb.device_uuid),
        feature_map: sb.feature_map,
        bitmap_offset_sectors: has_bitmap(sb).then_some(sb.bitmap_offset),
        array_state: state.into_iter().collect(),
        journal_tail_sectors: (device_role == "journal").then_some(sb.recovery_offset),
        journal_log_bytes: (device_role == "journal").then(|| journal_log_sectors(sb) * 512),
        journal_tail_block: None,
        integrity: zone.map(|_| "crc32c"),
        integrity_zone_sectors: zone.map(|z| z.start_sectors),
        integrity_copies: zone.map(|z| z.copies),
        cluster: None,
    }
}

fn has_bitmap(sb: &Superblock) -> bool {
    sb.feature_map & format::feature::BITMAP_OFFSET != 0
}

fn open_member(p: &Path) -> anyhow::Result<(Arc<dyn Device>, Superblock)> {
    let d = Opener::new(OpenMode::ReadOnly)
        .open(p)
        .with_context(|| format!("{}: cannot open", p.display()))?;
    let sb = engine::read_superblock(d.as_ref()).map_err(|e| anyhow!("{}: {e}", p.display()))?;
    Ok((d, sb))
}

/// Describe every member that can be read, print them all, then fail with the first member
/// that could not be (so one bad member does not hide what the others say).
fn examine_each<T: Serialize>(
    members: &[PathBuf],
    json: bool,
    describe: impl Fn(&Path) -> anyhow::Result<T>,
    print_text: impl Fn(&T),
) -> anyhow::Result<()> {
    let mut out = Vec::new();
    let mut failures = Vec::new();
    for p in members {
        match describe(p) {
            Ok(e) => out.push(e),
            Err(e) => failures.push(e),
        }
    }
    if json {
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        out.iter().for_each(print_text);
    }
    match failures.into_iter().next() {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

pub fn examine(members: &[PathBuf], json: bool) -> anyhow::Result<()> {
    examine_each(
        members,
        json,
        |p| {
            open_member(p).map(|(d, sb)| {
                let mut e = describe(&p.display().to_string(), &sb);
                if e.journal_tail_sectors.is_some() {
                    e.journal_tail_block = Some(tail_block(d.as_ref(), &sb));
                }
                e.cluster = describe_cluster(d.as_ref(), &sb);
                e
            })
        },
        print_text,
    )
}

/// One member's write-intent bitmap, as `mdadm --examine-bitmap` reports it.
#[derive(Serialize)]
struct ExaminedBitmap {
    path: String,
    /// Hex, as mdadm prints it.
    magic: String,
    version: u32,
    uuid: String,
    events: u64,
    events_cleared: u64,
    /// "ok", or the state bits that are set: "stale", "write-error".
    state: String,
    chunk_bytes: u64,
    daemon_sleep_s: u32,
    write_behind: u32,
    sync_size_sectors: u64,
    sectors_reserved: u32,
    chunks: u64,
    /// Slot 0's dirty chunks on a clustered bitmap (`cluster` lists every slot).
    dirty_chunks: u64,
    /// md-cluster's per-node bitmaps (null: not clustered).
    cluster: Option<ExaminedCluster>,
}

fn describe_bitmap(p: &Path) -> anyhow::Result<ExaminedBitmap> {
    let (d, sb) = open_member(p)?;
    if !has_bitmap(&sb) {
        bail!(
            "{}: no write-intent bitmap (the superblock does not announce one)",
            p.display()
        );
    }
    // The engine reads the bitmap where ironraid and mdadm put it; one elsewhere would be
    // misread, so say so instead.
    if sb.bitmap_offset != format::BITMAP_OFFSET_SECTORS {
        bail!(
            "{}: bitmap at {} sectors from the superblock; ironraid reads it only at {}",
            p.display(),
            sb.bitmap_offset,
            format::BITMAP_OFFSET_SECTORS
        );
    }
    let (bm, bits) =
        engine::read_bitmap(d.as_ref()).map_err(|e| anyhow!("{}: {e}", p.display()))?;
    let mut state: Vec<&str> = Vec::new();
    if bm.is_stale() {
        state.push("stale");
    }
    if bm.state & format::bitmap_state::WRITE_ERROR != 0 {
        state.push("write-error");
    }
    Ok(ExaminedBitmap {
        path: p.display().to_string(),
        magic: format!("{:08x}", format::BITMAP_MAGIC),
        version: bm.version,
        uuid: format::format_uuid_mdadm(&bm.uuid),
        events: bm.events,
        events_cleared: bm.events_cleared,
        state: if state.is_empty() {
            "ok".into()
        } else {
            state.join(",")
        },
        chunk_bytes: u64::from(bm.chunksize),
        daemon_sleep_s: bm.daemon_sleep,
        write_behind: bm.write_behind,
        sync_size_sectors: bm.sync_size,
        sectors_reserved: bm.sectors_reserved,
        chunks: bm.chunks(),
        dirty_chunks: format::count_dirty(&bits, bm.chunks()),
        cluster: describe_cluster(d.as_ref(), &sb),
    })
}

pub fn examine_bitmap(members: &[PathBuf], json: bool) -> anyhow::Result<()> {
    examine_each(members, json, describe_bitmap, print_bitmap_text)
}

fn print_bitmap_text(b: &ExaminedBitmap) {
    println!("{}:", b.path);
    println!("           Magic : {}", b.magic);
    println!("         Version : {}", b.version);
    println!("            UUID : {}", b.uuid);
    println!("          Events : {}", b.events);
    println!("  Events Cleared : {}", b.events_cleared);
    println!("           State : {}", b.state);
    println!("       Chunksize : {}", size::human(b.chunk_bytes));
    println!(
        "          Daemon : {} s between clean-up passes",
        b.daemon_sleep_s
    );
    if b.write_behind == 0 {
        println!("      Write Mode : normal");
    } else {
        println!(
            "      Write Mode : write-behind, at most {}",
            b.write_behind
        );
    }
    println!(
        "       Sync Size : {} KiB ({})",
        b.sync_size_sectors / 2,
        size::human(b.sync_size_sectors * 512)
    );
    println!(
        "          Bitmap : {} bits (chunks), {} dirty ({:.1}%)",
        b.chunks,
        b.dirty_chunks,
        b.dirty_chunks as f64 * 100.0 / b.chunks.max(1) as f64
    );
    if let Some(c) = &b.cluster {
        print_cluster_text(c);
    }
    println!();
}

fn print_text(e: &Examined) {
    println!("{}:", e.path);
    println!("    Feature Map : {:#x}", e.feature_map);
    println!("     Array UUID : {}", e.uuid);
    println!("           Name : {}", e.name);
    println!("     Raid Level : {}", e.level);
    println!("   Raid Devices : {}", e.raid_disks);
    if let Some(a) = e.array_size_bytes {
        println!("     Array Size : {} KiB", a / 1024);
    }
    println!("    Data Offset : {} sectors", e.data_offset_sectors);
    println!(" Avail Dev Size : {} sectors", e.data_size_sectors);
    if let Some(off) = e.bitmap_offset_sectors {
        println!("Internal Bitmap : {off} sectors from superblock");
    }
    println!("          State : {}", e.state);
    println!("         Events : {}", e.events);
    if let Some(l) = &e.layout {
        println!("         Layout : {l}");
    }
    if e.chunk_bytes > 0 {
        println!("     Chunk Size : {}K", e.chunk_bytes / 1024);
    }
    match (e.role, e.device_role) {
        (Some(r), _) => println!("    Device Role : Active device {r}"),
        // mdadm's spelling.
        (None, "journal") => println!("    Device Role : Journal"),
        (None, other) => println!("    Device Role : {other}"),
    }
    if let (Some(zone), Some(copies)) = (e.integrity_zone_sectors, e.integrity_copies) {
        let plural = if copies == 1 { "copy" } else { "copies" };
        println!("      Integrity : crc32c records, {copies} {plural}, zone at {zone} sectors");
    }
    if let (Some(tail), Some(log)) = (e.journal_tail_sectors, e.journal_log_bytes) {
        println!(
            "   Journal Tail : {tail} sectors (log of {})",
            size::human(log)
        );
    }
    if let Some(b) = &e.journal_tail_block {
        match (b.seq, b.pages, &b.problem) {
            (Some(seq), Some(pages), _) => {
                println!("     Tail Block : seq {seq}, {pages} pages follow")
            }
            (_, _, problem) => println!(
                "     Tail Block : not a meta block ({}); recovery starts an empty log",
                problem.as_deref().unwrap_or("invalid")
            ),
        }
    }
    if let Some(c) = &e.cluster {
        print_cluster_text(c);
    }
    println!("    Array State : {}", e.array_state);
    println!();
}
