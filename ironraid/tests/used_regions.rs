//! Used-region tracking end to end (issue 9, point 4): a new array over sparse files starts with
//! every region unused (no initial sync), writes mark the regions they touch, NBD TRIM and
//! WRITE_ZEROES release whole regions, the map survives clean stops and crashes, a rebuild
//! touches only the used regions of the new member, and md's tools still read the members.
//!
//! RAID5 × 4 with 512K chunks: a region is 1 MiB of each member's data area, two stripe rows,
//! 3 MiB of the array; region `r` holds array bytes `3r MiB .. 3(r+1) MiB`.

mod common;

use common::{member_state, require_tools, sh, Env};
use serde_json::Value;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;
const MEMBER: u64 = 256 * MIB;
/// Array bytes of one region (RAID5 × 4, 1 MiB regions).
const REGION: u64 = 3 * MIB;
const TOOLS: [&str; 3] = ["qemu-io", "qemu-img", "mdadm"];

/// `create --level 5 --name NAME MEMBERS` without `--assume-clean`: a new array as users make it.
fn create_fresh(env: &Env, extra: &[&str]) {
    create_fresh_level(env, "5", extra)
}

fn create_fresh_level(env: &Env, level: &str, extra: &[&str]) {
    let mut args = vec!["create", "--level", level, "--name", &env.name];
    args.extend_from_slice(extra);
    let members = env.member_args();
    args.extend(members.iter().map(String::as_str));
    env.ok(&args);
}

/// `detail --json`'s used-region map, checked for consistency with itself and the geometry.
fn used_map(d: &Value) -> (u64, u64) {
    let u = &d["used_regions"];
    assert!(u.is_object(), "no used_regions in {d:#}");
    let region = u["region_bytes"].as_u64().unwrap();
    let used = u["used"].as_u64().unwrap();
    assert_eq!(region, MIB, "{u}");
    assert_eq!(u["used_bytes"].as_u64().unwrap(), used * region, "{u}");
    (used, u["regions"].as_u64().unwrap())
}

fn used(env: &Env) -> u64 {
    used_map(&env.detail()).0
}

/// Regions (of `REGION` array bytes) that array bytes `off..off+len` touch.
fn regions_touched(off: u64, len: u64) -> u64 {
    (off + len).div_ceil(REGION) - off / REGION
}

/// `qemu-io -f raw URI -c CMD...`; fails on a pattern mismatch.
fn qemu_io(env: &Env, cmds: &[String]) -> String {
    let uri = env.uri();
    let mut args = vec!["-f", "raw", uri.as_str()];
    for c in cmds {
        args.extend(["-c", c.as_str()]);
    }
    let out = sh("qemu-io", &args);
    assert!(
        !out.contains("Pattern verification failed"),
        "{cmds:?}:\n{out}"
    );
    assert!(!out.contains("failed"), "{cmds:?}:\n{out}");
    out
}

/// The array reads exactly like `expected` (a file of the array's size), every byte.
fn reads_like(env: &Env, expected: &Expected) {
    let expected = &expected.path;
    let out = Command::new("qemu-img")
        .args(["compare", "-f", "raw", "-F", "raw"])
        .arg(expected)
        .arg(env.uri())
        .output()
        .expect("spawn qemu-img");
    assert!(
        out.status.success(),
        "the array does not read like {}: {}{}",
        expected.display(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A sparse file standing for what the array should read: zero but for what `put` writes.
struct Expected {
    path: PathBuf,
    file: std::fs::File,
}

impl Expected {
    fn new(env: &Env, size_bytes: u64) -> Expected {
        let path = env.dir.path().join("expected.img");
        let file = std::fs::File::create(&path).unwrap();
        file.set_len(size_bytes).unwrap();
        Expected { path, file }
    }

    fn put(&self, off: u64, data: &[u8]) {
        self.file.write_all_at(data, off).unwrap();
    }

    fn zero(&self, off: u64, len: u64) {
        self.put(off, &vec![0; len as usize]);
    }
}

/// Random bytes written to the array at `off` through qemu-io (and into `expected`).
fn write_random(env: &Env, expected: &Expected, off: u64, len: u64, seed: u64) {
    let src = env.dir.path().join(format!("src-{seed}.bin"));
    common::random_file(&src, len as usize, seed);
    let cmd = format!("write -s {} {off} {len}", src.display());
    let out = qemu_io(env, &[cmd]);
    assert!(out.contains("wrote"), "{out}");
    expected.put(off, &std::fs::read(&src).unwrap());
}

fn allocated_bytes(p: &Path) -> u64 {
    std::fs::metadata(p).unwrap().blocks() * 512
}

/// `mdadm --examine` and `--examine-badblocks` read every member without a complaint: the map
/// in the headroom before the data disturbs neither the superblock nor the bad-block log.
fn mdadm_reads_members(members: &[PathBuf]) {
    mdadm_reads_members_of(members, "raid5")
}

fn mdadm_reads_members_of(members: &[PathBuf], level: &str) {
    for m in members {
        let p = m.to_str().unwrap();
        let out = Command::new("mdadm")
            .args(["--examine", p])
            .output()
            .expect("spawn mdadm");
        let text = String::from_utf8_lossy(&out.stdout);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "mdadm --examine {p}: {text}{err}");
        assert!(
            err.trim().is_empty(),
            "mdadm --examine {p} complains: {err}"
        );
        assert!(text.contains("Magic : a92b4efc"), "{text}");
        assert!(text.contains(&format!("Raid Level : {level}")), "{text}");
        let sum = text
            .lines()
            .find(|l| l.trim_start().starts_with("Checksum :"))
            .unwrap_or_else(|| panic!("no checksum line: {text}"));
        assert!(sum.ends_with("- correct"), "{p}: {sum}");
        assert!(text.contains("State : clean"), "{p} not clean:\n{text}");
        let bb = sh("mdadm", &["--examine-badblocks", p]);
        assert!(bb.contains("Bad-blocks list is empty"), "{p}: {bb}");
    }
}

#[test]
fn a_new_array_skips_its_initial_sync_and_counts_written_regions() {
    if !require_tools(&TOOLS) {
        return;
    }
    let env = Env::new("ufresh", 4, MEMBER);
    create_fresh(&env, &[]);
    // create punched the data areas: only metadata is allocated.
    for m in &env.members {
        assert!(allocated_bytes(m) < MIB, "{}", m.display());
    }
    let started = Instant::now();
    let d = env.run_all();
    // A full initial sync of 254 MiB per member at md's default 200 MB/s would take over a
    // second; with every region unused there is nothing to walk.
    let first = env.wait_detail("the skipped initial sync", 1, |d| {
        d["sync"]["action"] == "idle" && d["state"] == "clean"
    });
    eprintln!("clean {:?} after start", started.elapsed());
    assert_eq!(first["mismatch_count"], 0, "{first:#}");
    let (n, regions) = used_map(&first);
    assert_eq!(n, 0, "{first:#}");
    assert_eq!(regions, 254, "{first:#}");
    for m in &env.members {
        assert!(allocated_bytes(m) < MIB, "run wrote to {}", m.display());
    }

    // 8 MiB at 32 MiB: array bytes 30..42 MiB, regions 10 to 13.
    let (off, len) = (32 * MIB, 8 * MIB);
    qemu_io(&env, &[format!("write -P 0x5c {off} {len}")]);
    assert_eq!(regions_touched(off, len), 4);
    let d1 = env.detail();
    assert_eq!(used_map(&d1).0, 4, "{d1:#}");
    assert_eq!(d1["used_regions"]["used_bytes"], 4 * MIB, "{d1:#}");
    // Each member got at most its 4 regions (and its metadata).
    for m in &env.members {
        let a = allocated_bytes(m);
        assert!(a <= 5 * MIB, "{}: {a} bytes allocated", m.display());
    }
    // Writing the same regions again, or part of them, marks nothing new.
    qemu_io(
        &env,
        &[
            format!("write -P 0x5d {} 4096", 30 * MIB),
            format!("write -P 0x5e {} 4096", 42 * MIB - 4096),
        ],
    );
    assert_eq!(used(&env), 4);
    let line = "used: 4/254 regions (4 MiB of each member), 1 MiB region";
    let text = env.ok(&["detail", &env.name]);
    assert!(text.contains(line), "{text}");
    let status = env.ok(&["status"]);
    assert!(status.contains(line), "{status}");
    let all: Value = serde_json::from_str(&env.ok(&["status", "--json"])).unwrap();
    assert_eq!(all[0]["used_regions"], env.detail()["used_regions"]);
    qemu_io(
        &env,
        &[
            format!("read -P 0x5d {} 4096", 30 * MIB),
            format!("read -P 0 {} {}", 30 * MIB + 4096, 2 * MIB - 4096),
            format!("read -P 0x5c {off} {}", len - 4096),
            format!("read -P 0x5e {} 4096", 42 * MIB - 4096),
        ],
    );
    assert_eq!(env.action_wait("check"), 0);
    env.stop(d);
    mdadm_reads_members(&env.members);
}

/// Fail member 1, remove it, add `spare`; returns how long the rebuild took.
fn replace_member(env: &Env, spare: &Path) -> Duration {
    let old = env.members[1].to_str().unwrap();
    env.ok(&["fail", &env.name, old]);
    env.ok(&["remove", &env.name, old]);
    let t0 = Instant::now();
    env.ok(&["add", &env.name, spare.to_str().unwrap()]);
    let d = env.wait_detail("the rebuild to finish", 120, |d| {
        member_state(d, spare) == "in_sync" && d["sync"]["action"] == "idle"
    });
    let took = t0.elapsed();
    // "active": written since the run started (dirty), not degraded or recovering.
    assert!(
        matches!(d["state"].as_str(), Some("clean" | "active")),
        "{d:#}"
    );
    assert_eq!(d["sync"]["last_action"], "recover", "{d:#}");
    took
}

/// Bytes `from..` of `a` and `b` are equal (`from`: the data offset), read in pieces.
fn same_data_area(a: &Path, b: &Path, from: u64) -> bool {
    let (fa, fb) = (
        std::fs::File::open(a).unwrap(),
        std::fs::File::open(b).unwrap(),
    );
    let end = fa.metadata().unwrap().len();
    assert_eq!(end, fb.metadata().unwrap().len());
    let (mut ba, mut bb) = (vec![0u8; MIB as usize], vec![0u8; MIB as usize]);
    let mut at = from;
    while at < end {
        let n = (end - at).min(MIB) as usize;
        fa.read_exact_at(&mut ba[..n], at).unwrap();
        fb.read_exact_at(&mut bb[..n], at).unwrap();
        if ba[..n] != bb[..n] {
            eprintln!("{} and {} differ in {at}..+{n}", a.display(), b.display());
            return false;
        }
        at += n as u64;
    }
    true
}

#[test]
fn a_rebuild_skips_unwritten_regions() {
    if !require_tools(&TOOLS) {
        return;
    }
    let env = Env::new("urebuild", 4, MEMBER);
    create_fresh(&env, &[]);
    let d = env.run_all();
    let size = env.detail()["size_bytes"].as_u64().unwrap();
    let expected = Expected::new(&env, size);
    // About 10% of the 762 MiB array: three 24 MiB pieces, 8 regions each.
    let pieces = [0, 300 * MIB, 600 * MIB];
    for (i, &off) in pieces.iter().enumerate() {
        write_random(&env, &expected, off, 24 * MIB, 9100 + i as u64);
    }
    assert_eq!(used(&env), 24);
    reads_like(&env, &expected);

    let spare = env.file("spare.img", MEMBER);
    let took = replace_member(&env, &spare);
    let after = env.detail();
    assert_eq!(used_map(&after).0, 24, "{after:#}");
    reads_like(&env, &expected);
    assert_eq!(env.action_wait("check"), 0);
    // The new member holds what the old one held, holes for zeroes included.
    let data_off = env.examine(&spare)["data_offset_sectors"].as_u64().unwrap() * 512;
    assert_eq!(
        env.examine(&env.members[1])["data_offset_sectors"]
            .as_u64()
            .unwrap()
            * 512,
        data_off
    );
    assert!(same_data_area(&env.members[1], &spare, data_off));
    let alloc = allocated_bytes(&spare);
    eprintln!(
        "rebuild of 24 used regions of 254 took {took:?}; new member has {} KiB allocated",
        alloc / 1024
    );
    // 24 MiB of data and parity plus metadata; the whole member would be 256 MiB.
    assert!(
        alloc <= 24 * MIB + 2 * MIB,
        "the rebuild wrote {alloc} bytes to the new member (24 regions used)"
    );
    env.stop(d);
    let mut members = env.members.clone();
    members[1] = spare;
    mdadm_reads_members(&members);

    // The same with every region used: a preallocated array, synced in full.
    let full = Env::new("ufull", 4, MEMBER);
    create_fresh(&full, &["--preallocate"]);
    let fd = full.run_all();
    full.wait_detail("the initial sync", 120, |d| {
        d["sync"]["action"] == "idle" && d["state"] == "clean"
    });
    assert_eq!(used(&full), 254);
    let full_spare = full.file("spare.img", MEMBER);
    let full_took = replace_member(&full, &full_spare);
    let full_alloc = allocated_bytes(&full_spare);
    eprintln!(
        "rebuild of 254 used regions took {full_took:?}; new member has {} KiB allocated",
        full_alloc / 1024
    );
    assert!(full_alloc >= 254 * MIB, "{full_alloc}");
    assert!(
        took < full_took,
        "24 used regions rebuilt in {took:?}, all 254 in {full_took:?}"
    );
    full.stop(fd);
}

/// RAID10 (near 2 × 4, 512K chunks) keeps its map in array bytes, md's sync coordinates for
/// RAID10: no initial sync, a trim releases a region on both its copies, and a rebuild fills
/// only the new member's copies of used regions. Array chunk k lives on members 2k mod 4 and
/// the next, so member 1 holds half of the written data.
#[test]
fn a_raid10_rebuild_skips_unwritten_and_trimmed_regions() {
    if !require_tools(&TOOLS) {
        return;
    }
    let env = Env::new("urebuild10", 4, MEMBER);
    create_fresh_level(&env, "10", &[]);
    let d = env.run_all();
    let fresh = env.wait_detail("the initial sync", 30, |d| {
        d["sync"]["action"] == "idle" && d["state"] == "clean"
    });
    let region = fresh["used_regions"]["region_bytes"].as_u64().unwrap();
    assert_eq!(fresh["used_regions"]["used"], 0, "{fresh:#}");
    let size = fresh["size_bytes"].as_u64().unwrap();
    let expected = Expected::new(&env, size);
    let pieces = [
        0,
        size / 3 / region * region,
        2 * size / 3 / region * region,
    ];
    for (i, &off) in pieces.iter().enumerate() {
        write_random(&env, &expected, off, 8 * MIB, 9200 + i as u64);
    }
    let written_regions = 3 * (8 * MIB).div_ceil(region);
    let used_now = |env: &Env| env.detail()["used_regions"]["used"].as_u64().unwrap();
    assert_eq!(used_now(&env), written_regions);
    // A whole region inside the second piece, trimmed: released on both copies.
    let trimmed = pieces[1] + region;
    qemu_io(&env, &[format!("discard {trimmed} {region}")]);
    expected.zero(trimmed, region);
    assert_eq!(used_now(&env), written_regions - 1);
    reads_like(&env, &expected);

    let spare = env.file("spare.img", MEMBER);
    replace_member(&env, &spare);
    reads_like(&env, &expected);
    assert_eq!(env.action_wait("check"), 0);
    let data_off = env.examine(&spare)["data_offset_sectors"].as_u64().unwrap() * 512;
    assert!(same_data_area(&env.members[1], &spare, data_off));
    let alloc = allocated_bytes(&spare);
    let used_bytes = (written_regions - 1) * region;
    eprintln!(
        "RAID10 rebuild of {} used bytes: new member has {} KiB allocated",
        used_bytes,
        alloc / 1024
    );
    assert!(
        alloc <= used_bytes / 2 + 2 * MIB,
        "the rebuild wrote {alloc} bytes to the new member ({used_bytes} array bytes used)"
    );
    env.stop(d);
    let mut members = env.members.clone();
    members[1] = spare;
    mdadm_reads_members_of(&members, "raid10");
}

#[test]
fn trim_and_write_zeroes_release_whole_regions_and_the_map_persists() {
    if !require_tools(&TOOLS) {
        return;
    }
    let env = Env::new("utrim", 4, MEMBER);
    create_fresh(&env, &[]);
    let d = env.run_all();
    let size = env.detail()["size_bytes"].as_u64().unwrap();
    let expected = Expected::new(&env, size);
    // Regions 0 to 9.
    write_random(&env, &expected, 0, 30 * MIB, 9200);
    assert_eq!(used(&env), 10);

    // TRIM of regions 1 and 2 exactly: released, and they read as zeroes (zero on every
    // member: that is what lets check and rebuild skip them).
    qemu_io(&env, &[format!("discard {} {}", 3 * MIB, 6 * MIB)]);
    expected.zero(3 * MIB, 6 * MIB);
    assert_eq!(used(&env), 8);
    // A TRIM covering no whole region (10..14 MiB: parts of regions 3 and 4) releases
    // nothing and leaves the data as it was.
    qemu_io(&env, &[format!("discard {} {}", 10 * MIB, 4 * MIB)]);
    assert_eq!(used(&env), 8);
    // WRITE_ZEROES that may unmap (16..25 MiB): regions 6 and 7 released whole, the edges
    // written with zeroes.
    qemu_io(&env, &[format!("write -z -u {} {}", 16 * MIB, 9 * MIB)]);
    expected.zero(16 * MIB, 9 * MIB);
    assert_eq!(used(&env), 6);
    // WRITE_ZEROES with NO_HOLE (27..30 MiB, region 9 whole): zeroes written, nothing released.
    qemu_io(&env, &[format!("write -z {} {}", 27 * MIB, 3 * MIB)]);
    expected.zero(27 * MIB, 3 * MIB);
    assert_eq!(used(&env), 6);
    qemu_io(
        &env,
        &[
            format!("read -P 0 {} {}", 16 * MIB, 9 * MIB),
            format!("read -P 0 {} {}", 27 * MIB, 3 * MIB),
        ],
    );
    reads_like(&env, &expected);
    assert_eq!(env.action_wait("check"), 0);

    // A clean stop and a new run: the same map, the same data.
    env.stop(d);
    let d = env.run_all();
    let again = env.wait_detail("the array to settle", 10, |d| d["sync"]["action"] == "idle");
    assert_eq!(again["state"], "clean", "{again:#}");
    assert_eq!(used_map(&again).0, 6, "{again:#}");
    reads_like(&env, &expected);
    // A released region takes data again.
    write_random(&env, &expected, 4 * MIB, MIB, 9201);
    assert_eq!(used(&env), 7);
    assert_eq!(env.action_wait("check"), 0);

    // kill -9: the map on the members still covers everything written.
    qemu_io(&env, &[format!("write -P 0x77 {} {}", 100 * MIB, MIB)]);
    expected.put(100 * MIB, &vec![0x77; MIB as usize]);
    assert_eq!(used(&env), 8);
    d.kill9();
    let d = env.run_all();
    let resynced = env.wait_detail("the resync after the crash", 60, |d| {
        d["sync"]["action"] == "idle" && d["state"] == "clean"
    });
    assert_eq!(
        used_map(&resynced).0,
        8,
        "the map after kill -9: {resynced:#}"
    );
    reads_like(&env, &expected);
    assert_eq!(env.action_wait("check"), 0);
    env.stop(d);
    mdadm_reads_members(&env.members);
}

/// NBD TRIM and WRITE_ZEROES reach the array in one piece, whatever their length (up to the
/// 32 MiB request limit): a whole region inside the request is released even where the request
/// crosses a multiple of 32 MiB (array bytes 30..33 MiB, region 10).
#[test]
fn trim_across_a_32_mib_multiple_releases_every_whole_region() {
    if !require_tools(&TOOLS) {
        return;
    }
    let env = Env::new("ustraddle", 4, MEMBER);
    create_fresh(&env, &[]);
    let d = env.run_all();
    // Regions 9 to 12 (27..39 MiB), then 20 to 22 (60..69 MiB).
    qemu_io(
        &env,
        &[
            format!("write -P 0x31 {} {}", 27 * MIB, 12 * MIB),
            format!("write -P 0x32 {} {}", 60 * MIB, 9 * MIB),
        ],
    );
    assert_eq!(used(&env), 7);
    qemu_io(&env, &[format!("discard {} {}", 27 * MIB, 12 * MIB)]);
    let after_trim = used(&env);
    qemu_io(&env, &[format!("write -z -u {} {}", 60 * MIB, 9 * MIB)]);
    let after_zeroes = used(&env);
    qemu_io(&env, &[format!("read -P 0 {} {}", 60 * MIB, 9 * MIB)]);
    assert_eq!(env.action_wait("check"), 0);
    env.stop(d);
    assert_eq!(
        (after_trim, after_zeroes),
        (3, 0),
        "regions left used after TRIM 27..39 MiB, then WRITE_ZEROES 60..69 MiB"
    );
}

/// Rebuild and check are paced (md's `sync_speed_max`) by the bytes they move, as md counts
/// only sync I/O: unused regions they skip must not count, or an almost empty array with data
/// near its end takes as long as a full one.
#[test]
fn skipped_regions_do_not_count_against_the_speed_limit() {
    if !require_tools(&TOOLS) {
        return;
    }
    let env = Env::new("upace", 4, MEMBER);
    create_fresh(&env, &[]);
    let d = env.run_with(&["--speed-max", "32M"], &env.members);
    // 9 regions (9 MiB of each member) spread over the first 208 MiB of each member.
    let pieces = [0, 300 * MIB, 600 * MIB];
    let cmds: Vec<String> = pieces
        .iter()
        .map(|off| format!("write -P 0x42 {off} {}", 8 * MIB))
        .collect();
    qemu_io(&env, &cmds);
    assert_eq!(used(&env), 9);
    let t0 = Instant::now();
    assert_eq!(env.action_wait("check"), 0);
    let check = t0.elapsed();
    let spare = env.file("spare.img", MEMBER);
    let rebuild = replace_member(&env, &spare);
    env.stop(d);
    // 9 MiB at 32 MiB/s: under a second (three allowed); paced by position (208 MiB) it
    // would take six and a half.
    eprintln!("check took {check:?}, rebuild {rebuild:?}");
    assert!(
        check < Duration::from_secs(3) && rebuild < Duration::from_secs(3),
        "check took {check:?}, rebuild {rebuild:?} for 9 used regions at --speed-max 32M"
    );
}

/// `nbdinfo --map --json`: the `(offset, length, type)` extents of the export's base:allocation.
fn allocation_map(env: &Env) -> Vec<(u64, u64, u64)> {
    let out = sh("nbdinfo", &["--map", "--json", &env.uri()]);
    let v: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    v.as_array()
        .unwrap_or_else(|| panic!("not a list: {out}"))
        .iter()
        .map(|e| {
            let f = |k: &str| e[k].as_u64().unwrap_or_else(|| panic!("{k} in {e}"));
            (f("offset"), f("length"), f("type"))
        })
        .collect()
}

/// Unused regions read as zeroes whatever the members hold there (garbage written behind the
/// array's back included) and are reported to NBD clients as holes that read as zeroes
/// (`base:allocation`), so `nbdcopy` and `qemu-img` skip them; a trim makes its regions holes
/// again.
#[test]
fn unused_regions_read_as_zeroes_and_map_as_holes() {
    if !require_tools(&["qemu-io", "qemu-img", "nbdinfo", "nbdcopy"]) {
        return;
    }
    let env = Env::new("uholes", 4, MEMBER);
    create_fresh(&env, &[]);
    let d = env.run_all();
    let size = env.detail()["size_bytes"].as_u64().unwrap();
    let expected = Expected::new(&env, size);
    // 8 MiB at 32 MiB: regions 10 to 13, array bytes 30..42 MiB.
    write_random(&env, &expected, 32 * MIB, 8 * MIB, 9300);
    assert_eq!(
        allocation_map(&env),
        vec![
            (0, 30 * MIB, 3),
            (30 * MIB, 12 * MIB, 0),
            (42 * MIB, size - 42 * MIB, 3)
        ]
    );
    // Garbage behind the array's back in region 50 (array bytes 150..153 MiB) on every member.
    for m in &env.members {
        let off = env.examine(m)["data_offset_sectors"].as_u64().unwrap() * 512 + 50 * MIB;
        let f = std::fs::OpenOptions::new().write(true).open(m).unwrap();
        f.write_all_at(&vec![0xee; MIB as usize], off).unwrap();
    }
    qemu_io(&env, &[format!("read -P 0 {} {}", 150 * MIB, 3 * MIB)]);
    reads_like(&env, &expected);
    // A copy through nbdcopy skips the holes it is told of (`--sparse=0`: it does not look
    // for zeroes itself): the copy is sparse and reads like the array.
    let copy = env.dir.path().join("copy.img");
    sh(
        "nbdcopy",
        &["--sparse=0", &env.uri(), copy.to_str().unwrap()],
    );
    assert!(
        allocated_bytes(&copy) <= 12 * MIB,
        "the copy has {} bytes allocated for 12 MiB of data",
        allocated_bytes(&copy)
    );
    assert!(common::same_files(&copy, &expected.path));
    // TRIM of regions 10 and 11: holes again.
    qemu_io(&env, &[format!("discard {} {}", 30 * MIB, 6 * MIB)]);
    expected.zero(30 * MIB, 6 * MIB);
    assert_eq!(
        allocation_map(&env),
        vec![
            (0, 36 * MIB, 3),
            (36 * MIB, 6 * MIB, 0),
            (42 * MIB, size - 42 * MIB, 3)
        ]
    );
    reads_like(&env, &expected);
    assert_eq!(env.action_wait("check"), 0);
    env.stop(d);
}

/// md's way back from lost superblocks is to create the array again over its old members with
/// the same geometry: `--assume-clean` (or `--force` over members that still carry a
/// superblock) must keep their data, so neither discards members that hold some: every region
/// counts as used. Only
/// `--integrity`, which starts from zeroed members, refuses to re-create over old members with
/// `--assume-clean` (and changes nothing).
#[test]
fn creating_again_over_an_old_arrays_members_keeps_their_data() {
    if !require_tools(&TOOLS) {
        return;
    }
    let env = Env::new("urecreate", 4, MEMBER);
    // On new, empty files --assume-clean has nothing to keep: every region starts unused.
    env.create("5", &[]);
    let d = env.run_all();
    assert_eq!(used(&env), 0);
    let size = env.detail()["size_bytes"].as_u64().unwrap();
    let expected = Expected::new(&env, size);
    write_random(&env, &expected, 5 * MIB, 20 * MIB, 9400);
    env.stop(d);
    let uuid_of = |env: &Env| env.examine(&env.members[0])["uuid"].clone();
    let old = uuid_of(&env);

    let refused = env.ironraid(
        &[
            vec![
                "create",
                "--level",
                "5",
                "--name",
                &env.name,
                "--force",
                "--assume-clean",
                "--integrity",
                "crc32c",
            ],
            env.member_args().iter().map(String::as_str).collect(),
        ]
        .concat(),
    );
    assert_eq!(refused.status.code(), Some(1));
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(
        err.contains("--integrity starts from zeroed members"),
        "{err}"
    );
    assert_eq!(uuid_of(&env), old, "the refused create wrote superblocks");

    for extra in [&["--force", "--assume-clean"][..], &["--force"][..]] {
        create_fresh(&env, extra);
        assert_ne!(uuid_of(&env), old);
        let d = env.run_all();
        let settled = env.wait_detail("the array to settle", 60, |d| {
            d["sync"]["action"] == "idle" && d["state"] == "clean"
        });
        let (used, regions) = used_map(&settled);
        assert_eq!(used, regions, "{extra:?}: {settled:#}");
        reads_like(&env, &expected);
        assert_eq!(env.action_wait("check"), 0, "{extra:?}");
        env.stop(d);
    }
}

/// A loop device zeroes a range by punching holes in its file (the kernel's no-fallback
/// zeroing), so an array over loop devices starts with every region unused, as one over files
/// does: garbage the backing files held is gone, there is no initial sync, and a rebuild onto a
/// loop device reads only the used regions and leaves the rest as holes.
#[test]
fn an_array_over_loop_devices_starts_unused_and_rebuilds_only_what_is_used() {
    if !require_tools(&["qemu-io", "qemu-img", "mdadm", "losetup"]) {
        return;
    }
    let env = Env::new("uloop", 4, MEMBER);
    let spare_file = env.file("spare.img", MEMBER);
    let mut loops = Vec::new();
    for f in env.members.iter().chain([&spare_file]) {
        // Garbage an earlier user left behind.
        let file = std::fs::OpenOptions::new().write(true).open(f).unwrap();
        file.write_all_at(&vec![0xee; MIB as usize], 100 * MIB)
            .unwrap();
        let Some(lo) = common::Loop::attach(f, false) else {
            return;
        };
        loops.push(lo);
    }
    let devs: Vec<PathBuf> = loops.iter().map(|l| PathBuf::from(&l.0)).collect();
    let mut args = vec!["create", "--level", "5", "--name", &env.name];
    args.extend(devs[..4].iter().map(|p| p.to_str().unwrap()));
    env.ok(&args);
    for f in &env.members {
        assert!(
            allocated_bytes(f) < MIB,
            "{}: create left {} bytes allocated",
            f.display(),
            allocated_bytes(f)
        );
    }
    let d = env.run(&devs[..4]);
    let first = env.wait_detail("the skipped initial sync", 10, |d| {
        d["sync"]["action"] == "idle" && d["state"] == "clean"
    });
    assert_eq!(used_map(&first).0, 0, "{first:#}");
    let size = first["size_bytes"].as_u64().unwrap();
    let expected = Expected::new(&env, size);
    write_random(&env, &expected, 30 * MIB, 12 * MIB, 9500);
    assert_eq!(used(&env), 4);

    let (old, spare) = (devs[1].to_str().unwrap(), devs[4].to_str().unwrap());
    env.ok(&["fail", &env.name, old]);
    env.ok(&["remove", &env.name, old]);
    env.ok(&["add", &env.name, spare]);
    env.wait_detail("the rebuild to finish", 120, |d| {
        member_state(d, &devs[4]) == "in_sync" && d["sync"]["action"] == "idle"
    });
    // 4 regions of 1 MiB on the new member, and metadata; the 0xee MiB is a hole again.
    let alloc = allocated_bytes(&spare_file);
    assert!(
        alloc <= 6 * MIB,
        "the rebuild left {alloc} bytes allocated on the spare"
    );
    reads_like(&env, &expected);
    assert_eq!(env.action_wait("check"), 0);
    env.stop(d);
    let mut members = devs[..4].to_vec();
    members[1] = devs[4].clone();
    mdadm_reads_members(&members);
}
