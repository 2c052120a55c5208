//! A real file system on the array: nbdfuse → loop device → ext4, across a daemon restart.

mod common;

use common::{require_tools, sh, wait_for, Env, Loop};
use std::process::{Command, Stdio};
use std::time::Duration;

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

/// ext4 mounted `data=journal` on a `guided` array, writing and fsyncing files, when the daemon
/// is killed with -9. The next start reads the ext4 journal off the array (`run --guide ext4`),
/// verifies what it names and skips the resync; a full check then finds no stripe whose parity
/// disagrees, the file system mounts (replaying its journal) and checks clean, and every file
/// fsynced before the kill reads back the same, also with a member failed.
#[test]
fn ext4_data_journal_crash_is_guided_by_its_journal() {
    if !require_tools(&[
        "nbdfuse",
        "/dev/fuse",
        "fusermount3",
        "losetup",
        "mkfs.ext4",
        "tune2fs",
        "e2fsck",
        "mount",
        "umount",
    ]) {
        return;
    }
    let env = Env::new("fsguided", 4, 128 << 20);
    env.create(
        "5",
        &[
            "--chunk",
            "64K",
            "--consistency-policy",
            "guided",
            "--bitmap-chunk",
            "1M",
        ],
    );
    let fuse_dir = env.dir.path().join("fuse");
    let mnt = env.dir.path().join("mnt");
    std::fs::create_dir_all(&mnt).unwrap();
    let done_log = env.dir.path().join("fsynced.txt");
    // The ext4 write watch runs from the start: it follows the journal once there is one.
    let d = env.run_with(&["--guide", "ext4"], &env.members);
    let watch_before;
    {
        let fuse = Fuse::start(&env.uri(), &fuse_dir);
        let Some(lo) = Loop::attach(&fuse.mnt.join("nbd"), false) else {
            return;
        };
        // No lazy init (it zeroes inode tables outside the journal for minutes) and no
        // discard: the watch would rightly call those writes unguided.
        sh(
            "mkfs.ext4",
            &[
                "-q",
                "-F",
                "-b",
                "4096",
                "-J",
                "size=16",
                "-E",
                "lazy_itable_init=0,lazy_journal_init=0,nodiscard",
                &lo.0,
            ],
        );
        sh("tune2fs", &["-o", "journal_data", &lo.0]);
        sh(
            "mount",
            &["-o", "data=journal", &lo.0, mnt.to_str().unwrap()],
        );
        // mkfs's writes were unguided; once the mounted file system is quiet the watch arms
        // and, 5 s after the last unguided write, the members stop saying so.
        let det = env.wait_detail("the watch armed and the unguided flag cleared", 60, |d| {
            let _ = Command::new("sync").arg("-f").arg(&mnt).status();
            d["guidance"]["watch"]["armed"] == true && d["guidance"]["unguided"] == false
        });
        watch_before = det["guidance"]["watch"].clone();
        // Files written and fsynced one after the other; each name is logged (outside the
        // file system) once its fsync returned.
        let script = format!(
            "cd {m}; i=0; while true; do i=$((i+1)); \
             head -c $(( (i % 17) * 9000 + 4096 )) /dev/urandom > f$i.tmp && \
             dd if=f$i.tmp of=f$i bs=64k conv=fsync status=none && rm f$i.tmp && \
             sha256sum f$i >> {log} || exit 0; done",
            m = mnt.display(),
            log = done_log.display()
        );
        let mut writer = Command::new("sh").args(["-c", &script]).spawn().unwrap();
        std::thread::sleep(Duration::from_millis(2500));
        let det = env.detail();
        let w = &det["guidance"]["watch"];
        eprintln!("write watch before the workload: {watch_before}\nafter: {w}");
        assert_eq!(w["armed"], true, "{w:#}");
        let conforming = w["conforming_writes"].as_u64().unwrap();
        assert!(
            conforming > watch_before["conforming_writes"].as_u64().unwrap() + 20,
            "{w:#}"
        );
        d.kill9();
        let _ = writer.kill();
        let _ = writer.wait();
        let _ = Command::new("umount")
            .args(["-l", mnt.to_str().unwrap()])
            .status();
        drop(lo);
        drop(fuse);
    }
    let fsynced = std::fs::read_to_string(&done_log).unwrap_or_default();
    assert!(
        fsynced.lines().count() >= 5,
        "the workload fsynced too little before the kill:\n{fsynced}"
    );

    let d = env.run_with(&["--guide", "ext4"], &env.members);
    let det = env.detail();
    let g = &det["guidance"];
    assert_eq!(g["state"], "guided", "{det:#}\n{}", d.log_text());
    assert_eq!(g["guide"], "ext4", "{det:#}");
    let log = d.log_text();
    assert!(log.contains("ext4 journal guided the resync"), "{log}");
    // Far less than the array was verified.
    let verified = g["verified_bytes"].as_u64().unwrap();
    assert!(verified < det["size_bytes"].as_u64().unwrap() / 4, "{g:#}");
    assert_eq!(
        env.action_wait("check"),
        0,
        "parity disagrees after guidance"
    );

    let check_files = |what: &str| {
        // A fresh mount point: the one of the killed daemon may linger.
        let fuse = Fuse::start(
            &env.uri(),
            &env.dir.path().join(format!("fuse-{}", what.len())),
        );
        let lo = Loop::attach(&fuse.mnt.join("nbd"), false).expect("loop");
        sh(
            "mount",
            &["-o", "data=journal", &lo.0, mnt.to_str().unwrap()],
        );
        let out = Command::new("sha256sum")
            .arg("-c")
            .arg(&done_log)
            .current_dir(&mnt)
            .output()
            .unwrap();
        sh("umount", &[mnt.to_str().unwrap()]);
        assert!(
            out.status.success(),
            "{what}: fsynced files differ:\n{}",
            String::from_utf8_lossy(&out.stdout)
        );
        let fsck = Command::new("e2fsck")
            .args(["-fn", &lo.0])
            .output()
            .unwrap();
        assert!(
            fsck.status.success(),
            "{what}: e2fsck: {}",
            String::from_utf8_lossy(&fsck.stdout)
        );
    };
    check_files("after guidance");
    env.ok(&["fail", &env.name, env.members[2].to_str().unwrap()]);
    check_files("with a member failed");
    env.stop(d);
}
