//! Bad sectors end to end (issue 21 item 7): member 0 of a RAID5 ×4 is a disk (nbdkit's `sh`
//! plugin, mounted as a file by nbdfuse) whose one 4 KiB sector fails reads until it is
//! written, as a drive remaps a sector on write.
//! * healthy: every block reads right, the member stays, the sector is rewritten, `detail`
//!   counts one corrected read error;
//! * degraded: EIO for just the block that cannot be rebuilt, the member stays, its bad-block
//!   log holds it (`mdadm --examine-badblocks` lists it);
//! * a rebuild onto a spare goes on past it, the spare becomes active, the block still reads
//!   EIO, and a full write of it makes it readable again.

mod common;

use common::{member, member_state, require_tools, sh, Env, FuseExport};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const MEMBER: u64 = 16 << 20;
const PAGE: u64 = 4096;
/// Blocks of row 0 checked one by one (three 64 KiB data chunks).
const ROW0_BLOCKS: u64 = 48;

/// The plugin: reads meeting the byte range in `$BAD` ("start end") fail with EIO; a write
/// covering it whole clears it.
const PLUGIN: &str = r#"#!/bin/bash
f="@BACK@"
bad="@BAD@"
case "$1" in
  get_size) stat -c %s "$f" ;;
  can_write|can_flush) exit 0 ;;
  can_fua) echo native ;;
  thread_model) echo serialize_all_requests ;;
  pread)
    count=$3; off=$4
    if [ -s "$bad" ]; then
      read a b < "$bad"
      if [ "$off" -lt "$b" ] && [ $((off + count)) -gt "$a" ]; then
        echo "EIO unreadable sector" >&2; exit 1
      fi
    fi
    dd if="$f" iflag=skip_bytes,count_bytes skip="$off" count="$count" status=none ;;
  pwrite)
    count=$3; off=$4
    dd of="$f" oflag=seek_bytes conv=notrunc iflag=count_bytes,fullblock seek="$off" \
      count="$count" status=none || exit 1
    if [ -s "$bad" ]; then
      read a b < "$bad"
      if [ "$off" -le "$a" ] && [ $((off + count)) -ge "$b" ]; then rm -f "$bad"; fi
    fi ;;
  flush) sync "$f" ;;
  *) exit 2 ;;
esac
"#;

/// A member disk with a sector that fails reads until written.
struct FlakyDisk {
    export: FuseExport,
    bad: PathBuf,
    backing: PathBuf,
}

impl FlakyDisk {
    fn new(env: &Env, backing: &Path) -> FlakyDisk {
        let dir = env.dir.path();
        let bad = dir.join("bad-range");
        let script = dir.join("flaky.sh");
        let text = PLUGIN
            .replace("@BACK@", &backing.display().to_string())
            .replace("@BAD@", &bad.display().to_string());
        std::fs::write(&script, text).unwrap();
        sh("chmod", &["+x", script.to_str().unwrap()]);
        let export = FuseExport::start(dir, "flaky", &["sh".into(), script.display().to_string()]);
        FlakyDisk {
            export,
            bad,
            backing: backing.to_path_buf(),
        }
    }

    /// The member as the array sees it.
    fn path(&self) -> PathBuf {
        self.export.path()
    }

    /// Bytes `at..at + len` of the disk fail reads until written whole.
    fn break_at(&self, at: u64, len: u64) {
        std::fs::write(&self.bad, format!("{at} {}\n", at + len)).unwrap();
        // The array's member I/O is buffered on a FUSE file (no O_DIRECT there): drop the
        // cached pages so that reads reach the disk.
        let file = format!("if={}", self.path().display());
        sh("dd", &[&file, "iflag=nocache", "count=0", "status=none"]);
    }

    fn still_bad(&self) -> bool {
        self.bad.exists()
    }
}

fn qemu_io(uri: &str, cmd: &str) -> Output {
    let mut c = Command::new("qemu-io");
    if cmd.starts_with("read") {
        c.arg("-r");
    }
    c.args(["-f", "raw", uri, "-c", cmd])
        .output()
        .expect("spawn qemu-io")
}

/// Block `i`'s pattern byte.
fn pattern(i: u64) -> u8 {
    (i * 7 % 251 + 1) as u8
}

/// Read block `i` and check its pattern: Ok(true) right, Ok(false) EIO; wrong data panics.
fn read_block(uri: &str, i: u64, pat: u8) -> bool {
    let out = qemu_io(uri, &format!("read -P {pat} {} 4k", i * PAGE));
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(
        !text.contains("Pattern verification failed"),
        "block {i} reads wrong data: {text}"
    );
    if text.contains("Input/output error") {
        return false;
    }
    assert!(text.contains("read 4096/4096"), "block {i}: {text}");
    true
}

/// The blocks of row 0 that read EIO (every other one must read right).
fn eio_blocks(uri: &str) -> Vec<u64> {
    (0..ROW0_BLOCKS)
        .filter(|&i| !read_block(uri, i, pattern(i)))
        .collect()
}

fn count(d: &serde_json::Value, p: &Path, key: &str) -> u64 {
    member(d, p).expect("member listed")[key]
        .as_u64()
        .unwrap_or_else(|| panic!("{key} missing: {d:#}"))
}

#[test]
fn bad_sector_is_corrected_recorded_and_rebuilt_past() {
    let Some(mdadm) = testkit::require_tool("mdadm") else {
        return;
    };
    if !require_tools(&[
        "qemu-io",
        "nbdcopy",
        "nbdkit",
        "nbdfuse",
        "fusermount3",
        "/dev/fuse",
    ]) {
        return;
    }
    let mut env = Env::new("bbad", 4, MEMBER);
    let disk = FlakyDisk::new(&env, &env.members[0].clone());
    env.members[0] = disk.path();
    let spare = env.file("spare.img", MEMBER);
    env.create("5", &["--chunk", "64K"]);
    let data_offset = env.examine(&disk.path())["data_offset_sectors"]
        .as_u64()
        .unwrap()
        * 512;
    let d = env.run(&env.members);
    // Each 4 KiB block of the array holds its own pattern.
    let size = env.detail()["size_bytes"].as_u64().unwrap();
    let image = env.dir.path().join("image");
    let bytes: Vec<u8> = (0..size / PAGE)
        .flat_map(|i| std::iter::repeat_n(pattern(i), PAGE as usize))
        .collect();
    std::fs::write(&image, bytes).unwrap();
    sh("nbdcopy", &[image.to_str().unwrap(), &env.uri()]);

    // Healthy: member 0's block 5 (d0 of row 0) fails reads; everything reads right.
    disk.break_at(data_offset + 5 * PAGE, PAGE);
    let back = env.dir.path().join("back");
    sh("nbdcopy", &[&env.uri(), back.to_str().unwrap()]);
    assert!(
        std::fs::read(&back).unwrap() == std::fs::read(&image).unwrap(),
        "reads right with one bad sector"
    );
    let det = env.detail();
    assert_eq!(member_state(&det, &disk.path()), "in_sync", "{det:#}");
    assert!(
        matches!(det["state"].as_str(), Some("clean" | "active")),
        "not degraded: {det:#}"
    );
    assert_eq!(
        count(&det, &disk.path(), "read_errors_corrected"),
        1,
        "{det:#}"
    );
    assert!(!disk.still_bad(), "the sector was rewritten");

    // Degraded (member 3, P of row 0, failed): block 7 cannot be rebuilt: EIO for it alone.
    env.ok(&["fail", &env.name, env.members[3].to_str().unwrap()]);
    disk.break_at(data_offset + 7 * PAGE, PAGE);
    assert_eq!(eio_blocks(&env.uri()), vec![7]);
    let det = env.detail();
    assert_eq!(member_state(&det, &disk.path()), "in_sync", "{det:#}");
    assert_eq!(count(&det, &disk.path(), "bad_sectors"), 8, "{det:#}");
    let listed = sh(
        mdadm.to_str().unwrap(),
        &["--examine-badblocks", disk.backing.to_str().unwrap()],
    );
    let want = format!("{} for 8 sectors", data_offset / 512 + 7 * PAGE / 512);
    assert!(listed.contains(&want), "{want} not in:\n{listed}");

    // A rebuild onto a spare goes on past it; the spare becomes active.
    env.ok(&["remove", &env.name, env.members[3].to_str().unwrap()]);
    env.ok(&["add", &env.name, spare.to_str().unwrap()]);
    let det = env.wait_detail("the rebuild", 120, |d| {
        member_state(d, &spare) == "in_sync" && d["sync"]["action"] == "idle"
    });
    assert_eq!(member_state(&det, &disk.path()), "in_sync", "{det:#}");
    assert_eq!(count(&det, &spare, "bad_sectors"), 8, "{det:#}");
    assert_eq!(eio_blocks(&env.uri()), vec![7]);
    // A full write of the block makes it readable again, everywhere.
    let out = qemu_io(&env.uri(), "write -P 0x77 28k 4k");
    assert!(out.status.success(), "{out:?}");
    assert!(read_block(&env.uri(), 7, 0x77));
    let det = env.detail();
    assert_eq!(count(&det, &disk.path(), "bad_sectors"), 0, "{det:#}");
    assert_eq!(count(&det, &spare, "bad_sectors"), 0, "{det:#}");
    env.stop(d);
}
