//! Backing space of member files: `create --preallocate`, and the warning when sparse members
//! could together outgrow the file system holding them.
//!
//! A sparse member file takes space only as the array writes to it. If the file system under
//! it fills up, a member write fails, the member is marked faulty, and a second one failing the
//! same way takes the array down: a full backing file system must not reach a running array.
//! So `create` either allocates every member file in full (`--preallocate`, fallocate over the
//! whole file, which never changes what the file reads back) or says how far the members could
//! outgrow their file system. Only regular files count; block devices have their own space.

use crate::size;
use anyhow::{bail, Context};
use std::collections::BTreeMap;
use std::os::linux::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// A regular member file and how much of it is not allocated yet.
struct MemberFile {
    path: PathBuf,
    size_bytes: u64,
    unallocated_bytes: u64,
}

/// Regular member files grouped by the file system (`st_dev`) holding them, in the order given.
fn by_file_system(paths: &[PathBuf]) -> anyhow::Result<BTreeMap<u64, Vec<MemberFile>>> {
    let mut groups: BTreeMap<u64, Vec<MemberFile>> = BTreeMap::new();
    for p in paths {
        if crate::member::is_remote(p) {
            continue;
        }
        let md =
            std::fs::metadata(p).with_context(|| format!("{}: cannot open member", p.display()))?;
        if !md.is_file() {
            continue;
        }
        let allocated = md.st_blocks().saturating_mul(512);
        groups.entry(md.st_dev()).or_default().push(MemberFile {
            path: p.clone(),
            size_bytes: md.len(),
            unallocated_bytes: md.len().saturating_sub(allocated),
        });
    }
    Ok(groups)
}

/// Bytes an unprivileged writer may still allocate on the file system holding `path`.
fn free_bytes(path: &Path) -> anyhow::Result<u64> {
    let st = rustix::fs::statvfs(path)
        .with_context(|| format!("{}: cannot read file system usage", path.display()))?;
    Ok(st.f_bavail.saturating_mul(st.f_frsize))
}

/// "tmpfs on /mnt/x": the mount holding `path` (device `dev`), from /proc/self/mountinfo; the
/// longest mount point containing the path wins (bind mounts share a device).
fn describe_fs(path: &Path, dev: u64) -> String {
    let want = format!("{}:{}", rustix::fs::major(dev), rustix::fs::minor(dev));
    let path = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    let mut best: Option<(PathBuf, String)> = None;
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    for line in info.lines() {
        let fields: Vec<&str> = line.split(' ').collect();
        let Some(sep) = fields.iter().position(|f| *f == "-") else {
            continue;
        };
        if fields.len() < 5 || fields[2] != want || sep + 1 >= fields.len() {
            continue;
        }
        let mount = PathBuf::from(unescape_mountinfo(fields[4]));
        let longer = best
            .as_ref()
            .is_none_or(|(b, _)| mount.as_os_str().len() > b.as_os_str().len());
        if path.starts_with(&mount) && longer {
            best = Some((mount, fields[sep + 1].to_string()));
        }
    }
    match best {
        Some((mount, fstype)) => format!("{fstype} on {}", mount.display()),
        None => format!(
            "holding {}",
            path.parent().unwrap_or(Path::new("/")).display()
        ),
    }
}

/// mountinfo writes space, tab, newline and backslash in paths as `\ooo` octal escapes.
fn unescape_mountinfo(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let octal = b
            .get(i + 1..i + 4)
            .filter(|d| b[i] == b'\\' && d.iter().all(|c| (b'0'..=b'7').contains(c)));
        match octal {
            Some(d) => {
                out.push((d[0] - b'0') * 64 + (d[1] - b'0') * 8 + (d[2] - b'0'));
                i += 4;
            }
            None => {
                out.push(b[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn names(files: &[MemberFile]) -> String {
    files
        .iter()
        .map(|f| f.path.display().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Allocate every regular member file in full. Checks the space first, so a file system that
/// cannot hold them all fails before anything is allocated, naming the first member that does
/// not fit.
pub fn preallocate(paths: &[PathBuf]) -> anyhow::Result<()> {
    let groups = by_file_system(paths)?;
    for (&dev, files) in &groups {
        let free = free_bytes(&files[0].path)?;
        let need: u64 = files.iter().map(|f| f.unallocated_bytes).sum();
        if need <= free {
            continue;
        }
        let mut sum = 0u64;
        let first_short = files
            .iter()
            .find(|f| {
                sum += f.unallocated_bytes;
                sum > free
            })
            .expect("the running sum reaches need > free");
        bail!(
            "{}: cannot preallocate {} bytes: file system {} has {} bytes ({}) free, {} bytes ({}) \
             short for all members on it",
            first_short.path.display(),
            first_short.size_bytes,
            describe_fs(&files[0].path, dev),
            free,
            size::human(free),
            need - free,
            size::human(need - free)
        );
    }
    for f in groups.values().flatten() {
        let file = std::fs::OpenOptions::new()
            .write(true)
            .open(&f.path)
            .with_context(|| format!("{}: cannot open member", f.path.display()))?;
        rustix::fs::fallocate(&file, rustix::fs::FallocateFlags::empty(), 0, f.size_bytes)
            .with_context(|| {
                format!(
                    "{}: cannot preallocate {} bytes",
                    f.path.display(),
                    f.size_bytes
                )
            })?;
        file.sync_all()
            .with_context(|| format!("{}: cannot sync after preallocating", f.path.display()))?;
        tracing::debug!(member = %f.path.display(), bytes = f.size_bytes, "preallocated");
    }
    Ok(())
}

/// Warn on stderr for every file system whose free space is less than its sparse members could
/// still grow by. Never fails: a member that cannot be examined is simply not counted.
pub fn warn_overcommit(paths: &[PathBuf]) {
    let Ok(groups) = by_file_system(paths) else {
        return;
    };
    for (&dev, files) in &groups {
        let need: u64 = files.iter().map(|f| f.unallocated_bytes).sum();
        let Ok(free) = free_bytes(&files[0].path) else {
            continue;
        };
        if free >= need {
            continue;
        }
        eprintln!(
            "ironraid: warning: sparse members {} can still grow by {} bytes ({}) but file system \
             {} has only {} bytes ({}) free, {} bytes ({}) short; a full file system fails member \
             writes of a running array (use `create --preallocate`, or free space)",
            names(files),
            need,
            size::human(need),
            describe_fs(&files[0].path, dev),
            free,
            size::human(free),
            need - free,
            size::human(need - free)
        );
    }
}

/// Whether `create` may zero the data area of member `path` without writing it: a regular file
/// (holes), or a block device that both discards and zeroes by its own means (the kernel then
/// zeroes a range without falling back to writing it, as for a loop device over a file or an
/// SSD). A disk without discard (where write-zeroes may mean the device writing every sector
/// for hours) counts as no.
pub fn zeroes_cheaply(path: &Path) -> bool {
    let Ok(md) = std::fs::metadata(path) else {
        return false;
    };
    if md.is_file() {
        return true;
    }
    if !std::os::unix::fs::FileTypeExt::is_block_device(&md.file_type()) {
        return false;
    }
    let dev = md.st_rdev();
    let (major, minor) = (libc_major(dev), libc_minor(dev));
    let sys = PathBuf::from(format!("/sys/dev/block/{major}:{minor}"));
    // A partition's queue limits are its disk's.
    let queue = [sys.join("queue"), sys.join("../queue")]
        .into_iter()
        .find(|q| q.is_dir());
    let limit = |name: &str| {
        queue
            .as_ref()
            .and_then(|q| std::fs::read_to_string(q.join(name)).ok())
            .and_then(|v| v.trim().parse::<u64>().ok())
            .unwrap_or(0)
    };
    limit("write_zeroes_max_bytes") > 0 && limit("discard_max_bytes") > 0
}

/// `major(3)` of a Linux `dev_t`.
fn libc_major(dev: u64) -> u64 {
    ((dev >> 32) & 0xffff_f000) | ((dev >> 8) & 0xfff)
}

/// `minor(3)` of a Linux `dev_t`.
fn libc_minor(dev: u64) -> u64 {
    ((dev >> 12) & 0xffff_ff00) | (dev & 0xff)
}

#[cfg(test)]
mod tests {
    use super::{libc_major, libc_minor, unescape_mountinfo, zeroes_cheaply};
    use std::os::linux::fs::MetadataExt;

    #[test]
    fn device_numbers_and_cheap_zeroes() {
        // /dev/null is character device 1:3 everywhere; /dev/zero 1:5.
        let null = std::fs::metadata("/dev/null").unwrap().st_rdev();
        assert_eq!((libc_major(null), libc_minor(null)), (1, 3));
        let zero = std::fs::metadata("/dev/zero").unwrap().st_rdev();
        assert_eq!((libc_major(zero), libc_minor(zero)), (1, 5));
        // A character device is neither a file nor a block device; a missing path is no.
        assert!(!zeroes_cheaply(std::path::Path::new("/dev/null")));
        assert!(!zeroes_cheaply(std::path::Path::new("/nonexistent/member")));
        let f = tempfile::NamedTempFile::new().unwrap();
        assert!(zeroes_cheaply(f.path()));
    }

    #[test]
    fn mountinfo_escapes() {
        assert_eq!(unescape_mountinfo(r"/mnt/a\040b"), "/mnt/a b");
        assert_eq!(unescape_mountinfo(r"/x\134y"), r"/x\y");
        assert_eq!(unescape_mountinfo(r"/trail\04"), r"/trail\04");
        assert_eq!(unescape_mountinfo("/plain"), "/plain");
    }
}
