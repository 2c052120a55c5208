//! Assembly and allocation through the real binary: `run` refusing a dirty, degraded RAID5 and
//! `run --force` serving it; `create --preallocate` and the warning about sparse members that
//! could outgrow a small file system.

mod common;

use common::{require_tools, sh, tool_missing, Env};
use std::os::linux::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;

const MEMBER: u64 = 64 << 20;

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn paths(p: &[PathBuf]) -> Vec<&str> {
    p.iter().map(|m| m.to_str().unwrap()).collect()
}

#[test]
fn run_refuses_a_dirty_degraded_raid5_and_force_serves_it() {
    if !require_tools(&["qemu-io"]) {
        return;
    }
    let env = Env::new("dd", 4, MEMBER);
    env.create("5", &["--chunk", "64K"]);
    let d = env.run_all();
    sh(
        "qemu-io",
        &["-f", "raw", &env.uri(), "-c", "write -P 0x42 0 1M"],
    );
    d.kill9();
    assert_eq!(env.examine(&env.members[0])["state"], "active");

    let present = vec![
        env.members[0].clone(),
        env.members[1].clone(),
        env.members[3].clone(),
    ];
    let mut args = vec!["run"];
    args.extend(paths(&present));
    let out = env.ironraid(&args);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 1, "one line: {err}");
    for want in [
        "ironraid: array 'dd'",
        "not stopped cleanly",
        "role 2 missing",
        "RAID5 write hole",
        "silently wrong",
        "run --force",
    ] {
        assert!(lines[0].contains(want), "missing '{want}' in: {err}");
    }
    assert_eq!(
        env.examine(&env.members[0])["events"],
        env.examine(&env.members[2])["events"],
        "a refused run writes nothing"
    );

    let d = env.run_with(&["--force"], &present);
    sh(
        "qemu-io",
        &["-f", "raw", &env.uri(), "-c", "read -P 0x42 0 1M"],
    );
    let log = d.log_text();
    assert!(
        log.contains("write hole") && log.contains("starting anyway"),
        "{log}"
    );
    let detail = env.detail();
    assert_eq!(detail["state"], "degraded", "{detail:#}");
    env.stop(d);
    // The missing member's role is recorded as not filled on the members that ran.
    assert_eq!(env.examine(&env.members[0])["array_state"], "AA.A");
}

#[test]
fn create_preallocate_allocates_member_files_in_full() {
    let env = Env::new("pa", 3, 24 << 20);
    let mut args = vec!["create", "--level", "5", "--preallocate"];
    args.extend(paths(&env.members));
    let out = env.ironraid(&args);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(!stderr(&out).contains("warning"), "{}", stderr(&out));
    for m in &env.members {
        let md = std::fs::metadata(m).unwrap();
        assert!(
            md.st_blocks() * 512 >= md.len(),
            "{}: {} of {} bytes allocated",
            m.display(),
            md.st_blocks() * 512,
            md.len()
        );
    }
}

/// A tmpfs of `size` mounted in a temp dir, unmounted on drop.
struct Tmpfs {
    mnt: PathBuf,
}

impl Tmpfs {
    fn mount(under: &Path, size: &str) -> Option<Tmpfs> {
        let mnt = under.join("small-fs");
        std::fs::create_dir_all(&mnt).unwrap();
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(&mnt)
            .output()
            .expect("spawn mount");
        if !out.status.success() {
            tool_missing(
                "mount -t tmpfs",
                &format!("cannot mount a tmpfs (needs root): {}", stderr(&out).trim()),
            );
            return None;
        }
        Some(Tmpfs { mnt })
    }

    fn files(&self, prefix: &str, n: usize, bytes: u64) -> Vec<PathBuf> {
        (0..n)
            .map(|i| {
                let p = self.mnt.join(format!("{prefix}{i}.img"));
                std::fs::File::create(&p).unwrap().set_len(bytes).unwrap();
                p
            })
            .collect()
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.mnt).status();
    }
}

#[test]
fn sparse_members_that_could_outgrow_their_file_system_are_warned_about() {
    let env = Env::new("oc", 0, 0);
    let Some(fs) = Tmpfs::mount(env.dir.path(), "64m") else {
        return;
    };
    // 4 x 32 MiB sparse on 64 MiB: created, with a warning naming the file system and shortfall.
    let sparse = fs.files("s", 4, 32 << 20);
    let mut args = vec!["create", "--level", "5", "--assume-clean"];
    args.extend(paths(&sparse));
    let out = env.ironraid(&args);
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    let mount = fs.mnt.display().to_string();
    for want in [
        "warning",
        &format!("tmpfs on {mount}"),
        "short",
        "--preallocate",
    ] {
        assert!(err.contains(want), "missing '{want}' in: {err}");
    }

    // --preallocate where the space is not there: exit 1 naming a member, nothing written.
    let big = fs.files("p", 3, 32 << 20);
    let mut args = vec!["create", "--level", "5", "--preallocate"];
    args.extend(paths(&big));
    let out = env.ironraid(&args);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("cannot preallocate"), "{err}");
    assert!(
        err.contains(&format!("{mount}/p")),
        "names the member: {err}"
    );
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    for m in &big {
        assert!(!env
            .ironraid(&["examine", m.to_str().unwrap()])
            .status
            .success());
        assert_eq!(
            std::fs::metadata(m).unwrap().st_blocks(),
            0,
            "nothing allocated"
        );
    }
    for m in &sparse {
        std::fs::remove_file(m).unwrap();
    }

    // --preallocate where it fits: no warning, every byte allocated.
    let fits = fs.files("f", 3, 16 << 20);
    let mut args = vec!["create", "--level", "5", "--preallocate"];
    args.extend(paths(&fits));
    let out = env.ironraid(&args);
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    assert!(!err.contains("warning"), "{err}");
    for m in &fits {
        let md = std::fs::metadata(m).unwrap();
        assert!(md.st_blocks() * 512 >= md.len(), "{}", m.display());
    }
}
