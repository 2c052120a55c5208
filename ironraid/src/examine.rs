//! `ironraid examine`: what each member's superblock says, as text or JSON.

use anyhow::{anyhow, Context};
use device::{FileDevice, OpenMode};
use format::{DevRole, Superblock};
use layout::{Geometry, GeometrySpec, Level};
use serde::Serialize;
use std::path::PathBuf;

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
    array_state: String,
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

fn describe(path: &str, sb: &Superblock) -> Examined {
    let (role, device_role) = match sb.role() {
        DevRole::Active(r) => (Some(r), "active"),
        DevRole::Spare => (None, "spare"),
        DevRole::Faulty => (None, "faulty"),
        DevRole::Journal => (None, "journal"),
    };
    let level = Level::from_md(sb.level);
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
        array_state: state.into_iter().collect(),
    }
}

pub fn examine(members: &[PathBuf], json: bool) -> anyhow::Result<()> {
    let mut out = Vec::new();
    let mut failures = Vec::new();
    for p in members {
        let res = FileDevice::open(p, OpenMode::ReadOnly)
            .with_context(|| format!("{}: cannot open", p.display()))
            .and_then(|d| engine::read_superblock(&d).map_err(|e| anyhow!("{}: {e}", p.display())));
        match res {
            Ok(sb) => out.push(describe(&p.display().to_string(), &sb)),
            Err(e) => failures.push(e),
        }
    }
    if json {
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        for e in &out {
            print_text(e);
        }
    }
    match failures.into_iter().next() {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

fn print_text(e: &Examined) {
    println!("{}:", e.path);
    println!("     Array UUID : {}", e.uuid);
    println!("           Name : {}", e.name);
    println!("     Raid Level : {}", e.level);
    println!("   Raid Devices : {}", e.raid_disks);
    if let Some(a) = e.array_size_bytes {
        println!("     Array Size : {} KiB", a / 1024);
    }
    println!("    Data Offset : {} sectors", e.data_offset_sectors);
    println!(" Avail Dev Size : {} sectors", e.data_size_sectors);
    println!("          State : {}", e.state);
    println!("         Events : {}", e.events);
    if let Some(l) = &e.layout {
        println!("         Layout : {l}");
    }
    if e.chunk_bytes > 0 {
        println!("     Chunk Size : {}K", e.chunk_bytes / 1024);
    }
    match e.role {
        Some(r) => println!("    Device Role : Active device {r}"),
        None => println!("    Device Role : {}", e.device_role),
    }
    println!("    Array State : {}", e.array_state);
    println!();
}
