//! A real file system on the array: nbdfuse → loop device → ext4, across a daemon restart.

mod common;

use common::{require_tools, sh, Env, Loop};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn wait_for(path: &std::path::Path) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !path.exists() {
        assert!(
            Instant::now() < deadline,
            "{} did not appear",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

struct Fuse {
    child: std::process::Child,
    mnt: std::path::PathBuf,
}

impl Fuse {
    fn start(uri: &str, mnt: &std::path::Path) -> Fuse {
        std::fs::create_dir_all(mnt).unwrap();
        let child = Command::new("nbdfuse")
            .arg(mnt)
            .arg(uri)
            .stdout(Stdio::null())
            .spawn()
            .expect("nbdfuse");
        wait_for(&mnt.join("nbd"));
        Fuse {
            child,
            mnt: mnt.to_path_buf(),
        }
    }
}

impl Drop for Fuse {
    fn drop(&mut self) {
        let _ = Command::new("fusermount3")
            .arg("-u")
            .arg(&self.mnt)
            .status();
        let _ = self.child.wait();
    }
}

fn checksums(dir: &std::path::Path) -> String {
    sh(
        "sh",
        &[
            "-c",
            &format!(
                "cd {} && find . -type f -print0 | sort -z | xargs -0 sha256sum",
                dir.display()
            ),
        ],
    )
}

#[test]
fn ext4_on_nbdfuse_survives_restart_and_fsck() {
    if !require_tools(&[
        "nbdfuse",
        "/dev/fuse",
        "fusermount3",
        "losetup",
        "mkfs.ext4",
        "e2fsck",
        "mount",
        "umount",
    ]) {
        return;
    }
    let env = Env::new("fs5", 4, 96 << 20);
    env.create("5", &["--chunk", "64K"]);
    let fuse_dir = env.dir.path().join("fuse");
    let mnt = env.dir.path().join("mnt");
    std::fs::create_dir_all(&mnt).unwrap();
    let d = env.run_all();
    let sums;
    {
        let fuse = Fuse::start(&env.uri(), &fuse_dir);
        let Some(lo) = Loop::attach(&fuse.mnt.join("nbd"), false) else {
            return;
        };
        sh("mkfs.ext4", &["-q", "-F", &lo.0]);
        sh("mount", &[&lo.0, mnt.to_str().unwrap()]);
        // A tree of files of assorted sizes.
        let script = format!(
            "set -e; cd {m}; for d in a b c; do mkdir -p $d/deep/er; for i in $(seq 1 12); do \
             head -c $((i * 37000 + 11)) /dev/urandom > $d/f$i; cp $d/f$i $d/deep/er/g$i; done; done; sync",
            m = mnt.display()
        );
        sh("sh", &["-c", &script]);
        sums = checksums(&mnt);
        sh("umount", &[mnt.to_str().unwrap()]);
        let fsck = Command::new("e2fsck")
            .args(["-fn", &lo.0])
            .output()
            .unwrap();
        assert!(
            fsck.status.success(),
            "e2fsck: {}",
            String::from_utf8_lossy(&fsck.stdout)
        );
    }
    env.stop(d);
    // Restart the daemon and mount again: the same files, byte for byte.
    let d = env.run_all();
    {
        let fuse = Fuse::start(&env.uri(), &fuse_dir);
        let Some(lo) = Loop::attach(&fuse.mnt.join("nbd"), false) else {
            return;
        };
        sh("mount", &[&lo.0, mnt.to_str().unwrap()]);
        let again = checksums(&mnt);
        sh("umount", &[mnt.to_str().unwrap()]);
        assert_eq!(sums, again, "file contents changed across a daemon restart");
        assert!(sums.lines().count() == 72, "expected 72 files:\n{sums}");
        let fsck = Command::new("e2fsck")
            .args(["-fn", &lo.0])
            .output()
            .unwrap();
        assert!(
            fsck.status.success(),
            "e2fsck after restart: {}",
            String::from_utf8_lossy(&fsck.stdout)
        );
    }
    env.stop(d);
}
