//! md-cluster's on-disk format from `create --nodes` (issue 23): `mdadm --examine` reads the
//! superblock's clustered feature and cluster name, `mdadm -X` lists every node slot of the
//! version 5 bitmap with our chunk and sync size, and `ironraid examine` agrees with both.
//! (Running a clustered array takes `--cluster`: `cluster.rs`.)

mod common;

use common::{mdadm_field, require_tools, sh, Env, Loop};
use serde_json::Value;
use std::path::Path;
use std::process::Command;

const MIB: u64 = 1 << 20;

/// `mdadm -X` through a read-only loop device (on a plain file it reads an external bitmap).
fn mdadm_x(member: &Path) -> Option<String> {
    let lo = Loop::attach(member, true)?;
    let out = Command::new("mdadm")
        .args(["-X", &lo.0])
        .output()
        .expect("spawn mdadm");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "mdadm -X {} failed ({}):\n{text}{}",
        member.display(),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    Some(text)
}

/// Every "Node Slot" of mdadm -X with its "Bitmap : N bits (chunks), M dirty": (slot, N, M).
fn mdadm_slots(x: &str) -> Vec<(u32, u64, u64)> {
    let mut slots = Vec::new();
    let mut slot = None;
    for line in x.lines().map(str::trim) {
        if let Some(v) = line.strip_prefix("Node Slot :") {
            slot = Some(v.trim().parse().unwrap());
        } else if let Some(rest) = line.strip_prefix("Bitmap :") {
            let s = slot.take().expect("a Bitmap line after its Node Slot");
            let nums: Vec<u64> = rest
                .split(|c: char| !c.is_ascii_digit())
                .filter(|t| !t.is_empty())
                .take(2)
                .map(|t| t.parse().unwrap())
                .collect();
            slots.push((s, nums[0], nums[1]));
        }
    }
    slots
}

/// mdadm's chunk size rendering ("64 MB", "512 KB").
fn mdadm_chunksize(bytes: u64) -> String {
    if bytes >= MIB {
        format!("{} MB", bytes / MIB)
    } else {
        format!("{} KB", bytes / 1024)
    }
}

/// Create a clustered array (`clean`: with --assume-clean) and check every member with mdadm
/// and with `ironraid examine`.
fn check_clustered(
    level: &str,
    members: usize,
    member_bytes: u64,
    nodes: u32,
    chunk: &str,
    clean: bool,
) {
    let env = Env::new("cfmt", members, member_bytes);
    let n = nodes.to_string();
    let mut args = vec!["create", "--level", level, "--name", "cfmt"];
    if clean {
        args.push("--assume-clean");
    }
    args.extend([
        "--consistency-policy",
        "bitmap",
        "--bitmap-chunk",
        chunk,
        "--nodes",
        &n,
        "--cluster-name",
        "lab",
    ]);
    let member_args = env.member_args();
    args.extend(member_args.iter().map(String::as_str));
    env.ok(&args);
    for m in &env.members {
        let what = format!("level {level}, {nodes} nodes, {}", m.display());
        let e = sh("mdadm", &["--examine", m.to_str().unwrap()]);
        let features =
            u32::from_str_radix(mdadm_field(&e, "Feature Map").trim_start_matches("0x"), 16)
                .unwrap();
        assert_eq!(features & 0x101, 0x101, "{what}: bitmap and clustered\n{e}");
        assert_eq!(mdadm_field(&e, "Cluster Name"), "lab", "{what}\n{e}");
        let Some(x) = mdadm_x(m) else {
            return;
        };
        assert_eq!(mdadm_field(&x, "Version"), "5", "{what}\n{x}");
        assert_eq!(mdadm_field(&x, "Cluster nodes"), n, "{what}\n{x}");
        assert_eq!(mdadm_field(&x, "Cluster name"), "lab", "{what}\n{x}");
        let ours: Value =
            serde_json::from_str(&env.ok(&["examine", "--bitmap", "--json", m.to_str().unwrap()]))
                .unwrap();
        let ours = &ours[0];
        assert_eq!(
            mdadm_field(&x, "Chunksize"),
            mdadm_chunksize(ours["chunk_bytes"].as_u64().unwrap()),
            "{what}\n{x}"
        );
        let sync_kib: u64 = mdadm_field(&x, "Sync Size")
            .split_whitespace()
            .next()
            .unwrap()
            .parse()
            .unwrap();
        assert_eq!(ours["sync_size_sectors"].as_u64().unwrap(), sync_kib * 2);
        let chunks = ours["chunks"].as_u64().unwrap();
        let slots = mdadm_slots(&x);
        assert_eq!(
            slots.len(),
            nodes as usize,
            "{what}: one bitmap per node\n{x}"
        );
        let cluster = &env.examine(m)["cluster"];
        assert_eq!(cluster["name"], "lab");
        assert_eq!(cluster["nodes"], nodes);
        for (i, &(slot, bits, dirty)) in slots.iter().enumerate() {
            assert_eq!(slot, i as u32, "{x}");
            assert_eq!(bits, chunks, "{what}: slot {slot}\n{x}");
            // As mdadm's create, a new array's slot 0 is all set and the others clear; created
            // clean, no slot has a bit (each node resyncs its own slot's bits at every start).
            let want = if slot == 0 && !clean { chunks } else { 0 };
            assert_eq!(dirty, want, "{what}\n{x}");
            assert_eq!(cluster["slots"][i]["dirty_chunks"], dirty, "{cluster:#}");
        }
        let text = env.ok(&["examine", m.to_str().unwrap()]);
        assert!(text.contains("Cluster Name : lab"), "{text}");
        assert!(text.contains(&format!("Cluster Nodes : {nodes}")), "{text}");
    }
}

#[test]
fn create_nodes_writes_md_clusters_format_that_mdadm_reads() {
    if !require_tools(&["mdadm", "losetup"]) {
        return;
    }
    check_clustered("1", 2, 64 * MIB, 4, "64K", true);
    check_clustered("10", 4, 64 * MIB, 3, "64K", true);
    check_clustered("5", 3, 64 * MIB, 2, "64K", false);
    // Over 8 GiB a slot takes several pages (bits of 64 KiB over 10 GiB: 6 pages): mdadm finds
    // slots 1 and 2 only where the kernel puts them, a page-rounded slot size apart (slot 0
    // all set tells a misplaced slot 1 from a clear one).
    check_clustered("1", 2, 10 << 30, 3, "64K", false);
}

#[test]
fn nodes_need_a_bitmap_and_the_name_has_a_default() {
    let env = Env::new("cfmt", 2, 64 * MIB);
    let mut args = vec![
        "create",
        "--level",
        "1",
        "--consistency-policy",
        "resync",
        "--nodes",
        "2",
        "--assume-clean",
    ];
    let members = env.member_args();
    args.extend(members.iter().map(String::as_str));
    let out = env.ironraid(&args);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--nodes") && err.contains("--consistency-policy bitmap"),
        "{err}"
    );
    let examined = env.ironraid(&["examine", env.members[0].to_str().unwrap()]);
    assert!(
        !examined.status.success(),
        "a refused create writes nothing"
    );
    // Without a policy, --nodes implies the bitmap (mdadm's --bitmap=clustered).
    env.create("1", &["--nodes", "2"]);
    let cluster = &env.examine(&env.members[0])["cluster"];
    assert_eq!(cluster["name"], "ironraid", "{cluster:#}");
    assert_eq!(cluster["nodes"], 2);
}

#[test]
fn a_plain_bitmap_array_shows_no_cluster() {
    let env = Env::new("cfmt", 2, 64 * MIB);
    env.create("1", &["--consistency-policy", "bitmap"]);
    let e = env.examine(&env.members[0]);
    assert!(e["cluster"].is_null(), "{e:#}");
    assert_eq!(e["feature_map"].as_u64().unwrap() & 0x100, 0);
}
