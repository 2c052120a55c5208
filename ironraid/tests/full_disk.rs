//! A full backing file system is not a failed disk: four sparse 64 MiB members on a 64 MiB tmpfs,
//! RAID5, 150 MiB written through NBD. The writes that find no space fail with ENOSPC; every
//! member stays in the array; once the file system has room again the array runs, resyncs what
//! was left half-written, and takes the data.

mod common;

use common::{require_tools, sh, Env};
use std::path::PathBuf;
use std::process::Command;

/// A tmpfs mounted for the test, unmounted when dropped.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(at: PathBuf, size: &str) -> Tmpfs {
        std::fs::create_dir_all(&at).unwrap();
        let st = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(&at)
            .status()
            .expect("spawn mount");
        assert!(st.success(), "mount tmpfs at {}", at.display());
        Tmpfs(at)
    }

    fn grow(&self, size: &str) {
        let st = Command::new("mount")
            .args(["-o", &format!("remount,size={size}")])
            .arg(&self.0)
            .status()
            .expect("spawn mount");
        assert!(st.success(), "remount tmpfs");
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

#[test]
fn full_backing_file_system_fails_writes_with_enospc_and_loses_no_member() {
    if !require_tools(&["nbdcopy", "mount", "umount"]) {
        return;
    }
    let mut env = Env::new("full", 0, 0);
    let fs = Tmpfs::mount(env.dir.path().join("small-fs"), "64m");
    env.members = (0..4)
        .map(|i| {
            let p = fs.0.join(format!("m{i}.img"));
            std::fs::File::create(&p)
                .unwrap()
                .set_len(64 << 20)
                .unwrap();
            p
        })
        .collect();
    env.create("5", &["--chunk", "64K"]);
    let d = env.run_all();

    let src = env.dir.path().join("src.bin");
    common::random_file(&src, 150 << 20, 7);
    let out = Command::new("nbdcopy")
        .arg(&src)
        .arg(env.uri())
        .output()
        .expect("spawn nbdcopy");
    assert!(
        !out.status.success(),
        "150 MiB cannot fit in a 64 MiB file system, yet nbdcopy succeeded"
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("No space left on device") || err.contains("ENOSPC"),
        "the client should see ENOSPC: {err}"
    );
    let detail = env.detail();
    for m in detail["members"].as_array().unwrap() {
        assert_eq!(
            m["state"], "in_sync",
            "a full disk failed a member: {detail:#}"
        );
    }
    assert_ne!(detail["state"], "failed", "{detail:#}");
    // Status tells: which member's file system is full, and exit status 1.
    assert!(
        detail["no_space"]["writes_failed"].as_u64() > Some(0),
        "{detail:#}"
    );
    let out = env.ironraid(&["status"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        text.contains("no space (writes failing)") && text.contains("ENOSPC"),
        "{text}"
    );
    env.stop(d);
    for m in &env.members {
        assert_eq!(
            env.examine(m)["state"],
            "active",
            "inconsistent stripes await resync"
        );
    }

    // Room again: the same members run, resync, and take the whole write.
    fs.grow("512m");
    let d = env.run_all();
    env.wait_detail("the resync after ENOSPC", 120, |d| {
        d["sync"]["action"] == "idle"
    });
    sh("nbdcopy", &[src.to_str().unwrap(), &env.uri()]);
    let back = env.dir.path().join("back.bin");
    sh("nbdcopy", &[&env.uri(), back.to_str().unwrap()]);
    let back = std::fs::read(&back).unwrap();
    let src = std::fs::read(&src).unwrap();
    assert!(back[..src.len()] == src[..], "data read back differs");
    env.ok(&["action", "full", "check", "--wait"]);
    let checked = env.detail();
    assert_eq!(checked["mismatch_count"], 0, "{checked:#}");
    assert!(checked["no_space"].is_null(), "{checked:#}");
    env.ok(&["status"]);
    env.stop(d);
}
