//! The ext4 guide on file systems made and written by the real tools and kernel: a journal with
//! committed transactions (copied while mounted `data=journal`) gives a verify set that covers
//! every home block `debugfs logdump` lists for a committed transaction, plus both superblocks;
//! the gate refuses what it must.

use format::ext4_guide::{ext4_verify_set, GuideOptions, GuideRefusal, VerifySet};
use std::path::Path;
use std::process::Command;
use testkit::require_tools;

fn sh(prog: &str, args: &[&str]) -> String {
    let out = Command::new(prog).args(args).output().expect(prog);
    assert!(
        out.status.success(),
        "{prog} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn guide(img: &Path, require_data_journal: bool) -> Result<VerifySet, GuideRefusal> {
    let f = std::fs::File::open(img).unwrap();
    let len = f.metadata().unwrap().len();
    let mut read = |off: u64, buf: &mut [u8]| {
        std::os::unix::fs::FileExt::read_exact_at(&f, buf, off).map_err(|e| e.to_string())
    };
    ext4_verify_set(
        &mut read,
        len,
        &GuideOptions {
            require_data_journal,
        },
    )
}

fn mkfs(img: &Path, extra: &[&str]) {
    let f = std::fs::File::create(img).unwrap();
    f.set_len(256 << 20).unwrap();
    let mut args = vec!["-q", "-F", "-b", "4096", "-J", "size=16"];
    args.extend(extra);
    args.push(img.to_str().unwrap());
    sh("mkfs.ext4", &args);
}

/// Unmounts and detaches on drop, whatever happened.
struct Mounted {
    dev: String,
    dir: std::path::PathBuf,
}

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.dir).status();
        let _ = Command::new("losetup").args(["-d", &self.dev]).status();
    }
}

/// Mount `img` with `opts`, write and fsync files, copy the image while still mounted.
fn crash_copy(img: &Path, copy: &Path, opts: &str) {
    let dev = sh("losetup", &["-f", "--show", img.to_str().unwrap()])
        .trim()
        .to_string();
    let dir = img.with_extension("mnt");
    std::fs::create_dir_all(&dir).unwrap();
    let m = Mounted { dev, dir };
    sh("mount", &["-o", opts, &m.dev, m.dir.to_str().unwrap()]);
    for i in 0..30 {
        let p = m.dir.join(format!("f{i}"));
        std::fs::write(&p, vec![i as u8; 50_000 + i * 777]).unwrap();
        std::fs::File::open(&p).unwrap().sync_all().unwrap();
    }
    sh(
        "cp",
        &[
            "--sparse=always",
            img.to_str().unwrap(),
            copy.to_str().unwrap(),
        ],
    );
    drop(m);
}

/// Home blocks of committed transactions, by `debugfs logdump -a`.
fn logdump_committed(img: &Path) -> Vec<u64> {
    let out = sh("debugfs", &["-R", "logdump -a", img.to_str().unwrap()]);
    let (mut current, mut out_blocks) = (Vec::new(), Vec::new());
    for line in out.lines() {
        let line = line.trim();
        if line.contains("(descriptor block)") {
            current.clear();
        } else if let Some(rest) = line.strip_prefix("FS block ") {
            current.push(rest.split(' ').next().unwrap().parse::<u64>().unwrap());
        } else if line.contains("(commit block)") {
            out_blocks.append(&mut current);
        }
    }
    out_blocks
}

fn covered(s: &VerifySet, byte: u64) -> bool {
    s.ranges.iter().any(|&(o, l)| o <= byte && byte < o + l)
}

#[test]
fn a_live_data_journal_names_every_committed_home_block() {
    assert!(require_tools(&[
        "mkfs.ext4",
        "tune2fs",
        "debugfs",
        "losetup",
        "mount",
        "umount",
        "cp"
    ]));
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("fs.img");
    let copy = dir.path().join("copy.img");
    mkfs(&img, &[]);
    sh("tune2fs", &["-o", "journal_data", img.to_str().unwrap()]);
    crash_copy(&img, &copy, "data=journal");
    let s = guide(&copy, true).expect("guided");
    let homes = logdump_committed(&copy);
    assert!(!homes.is_empty(), "canary: logdump found transactions");
    assert!(
        s.transactions > 0 && s.needs_recovery && s.data_journal_declared,
        "{s:?}"
    );
    for b in &homes {
        assert!(
            covered(&s, b * 4096),
            "home block {b} of a committed transaction missed"
        );
    }
    assert!(covered(&s, 1024), "the primary superblock");
    // Sorted, disjoint, whole blocks; about one journal's worth, not the whole fs.
    for w in s.ranges.windows(2) {
        assert!(w[0].0 + w[0].1 < w[1].0, "{:?}", w);
    }
    assert!(s
        .ranges
        .iter()
        .all(|&(o, l)| o % 4096 == 0 && l % 4096 == 0));
    assert!(
        s.total_bytes() < 2 * s.journal_bytes + (16 << 20),
        "set {} bytes for a {}-byte journal",
        s.total_bytes(),
        s.journal_bytes
    );
    eprintln!(
        "verify set {} bytes: {} transactions, {} home blocks, {} window blocks, journal {} bytes",
        s.total_bytes(),
        s.transactions,
        s.home_blocks,
        s.window_blocks,
        s.journal_bytes
    );
}

#[test]
fn the_gate_refuses_what_it_cannot_guide() {
    assert!(require_tools(&[
        "mkfs.ext4",
        "losetup",
        "mount",
        "umount",
        "cp"
    ]));
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("fs.img");
    std::fs::File::create(&img)
        .unwrap()
        .set_len(8 << 20)
        .unwrap();
    assert_eq!(guide(&img, true), Err(GuideRefusal::NotExt4));
    sh(
        "mkfs.ext4",
        &["-q", "-F", "-O", "^has_journal", img.to_str().unwrap()],
    );
    assert_eq!(guide(&img, true), Err(GuideRefusal::NoJournal));
    mkfs(&img, &[]);
    assert_eq!(
        guide(&img, false),
        Err(GuideRefusal::NotMounted),
        "never mounted"
    );
    // Mounted in the default (ordered) mode, not declared data=journal.
    let copy = dir.path().join("copy.img");
    crash_copy(&img, &copy, "data=ordered");
    assert_eq!(guide(&copy, true), Err(GuideRefusal::NotDataJournal));
    assert!(guide(&copy, false).is_ok(), "on the administrator's word");
}
