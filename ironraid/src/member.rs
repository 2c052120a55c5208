//! Members as the command line names them: a path (a regular file or a block device) or an
//! NBD URI (`nbd://HOST[:PORT]/EXPORT`, `nbd+unix:///EXPORT?socket=PATH`).
//!
//! A member's name (what `detail` shows and `fail`/`remove` match) is its canonical path, or
//! for a URI the URI as given: two spellings of one export are two names, as two symlinks to
//! one disk would be if they were not canonicalised; URIs are not.

use anyhow::{anyhow, Context};
use device::{Device, FileDevice, NbdDevice, OpenMode, RemoteOptions};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// Whether the argument names an NBD export rather than a path.
pub fn is_remote(arg: &Path) -> bool {
    arg.to_str().is_some_and(device::is_nbd_uri)
}

/// The name the daemon knows a member by: a URI as given; for a path its canonical form, or
/// (a pulled disk, a deleted file) the absolute form of what was given.
pub fn name(arg: &Path) -> String {
    if is_remote(arg) {
        return arg.display().to_string();
    }
    std::fs::canonicalize(arg)
        .or_else(|_| std::path::absolute(arg))
        .unwrap_or_else(|_| PathBuf::from(arg))
        .display()
        .to_string()
}

/// How members are opened: local ones by `mode`, remote ones with `remote`'s fault handling.
#[derive(Clone, Debug)]
pub struct Opener {
    pub mode: OpenMode,
    pub remote: RemoteOptions,
    /// Wrap each member in [`crate::iostats::Counted`] (a daemon's members, for metrics).
    pub counted: bool,
    /// Lock local members shared, not exclusive: a cluster's nodes drive them together.
    pub shared: bool,
}

impl Opener {
    pub fn new(mode: OpenMode) -> Opener {
        Opener {
            mode,
            remote: RemoteOptions::default(),
            counted: false,
            shared: false,
        }
    }

    /// Open one member, counted if the opener says so.
    pub fn open(&self, arg: &Path) -> anyhow::Result<Arc<dyn Device>> {
        let dev = self.open_device(arg)?;
        Ok(if self.counted {
            crate::iostats::Counted::wrap(dev)
        } else {
            dev
        })
    }

    /// Open one member; a local one is locked (flock) so that two daemons cannot drive it.
    fn open_device(&self, arg: &Path) -> anyhow::Result<Arc<dyn Device>> {
        if let Some(uri) = arg.to_str().filter(|s| device::is_nbd_uri(s)) {
            let opts = RemoteOptions {
                read_only: self.mode == OpenMode::ReadOnly,
                ..self.remote.clone()
            };
            let dev = NbdDevice::open(uri, opts).context("cannot open member")?;
            tracing::debug!(
                member = uri,
                connections = dev.max_connections(),
                "remote member opened"
            );
            return Ok(Arc::new(dev));
        }
        let path = std::fs::canonicalize(arg)
            .with_context(|| format!("{}: cannot open member", arg.display()))?;
        let dev = FileDevice::open(&path, self.mode)
            .with_context(|| format!("{}: cannot open member", arg.display()))?;
        if self.shared {
            dev.lock_shared().map_err(|e| {
                anyhow!("{e} (is an ironraid outside the cluster running this array?)")
            })?;
        } else if self.mode != OpenMode::ReadOnly {
            dev.lock_exclusive()
                .map_err(|e| anyhow!("{e} (is another ironraid running this array?)"))?;
        }
        tracing::debug!(member = %path.display(), direct = dev.uses_direct_io(), "member opened");
        Ok(Arc::new(dev))
    }

    pub fn open_all(&self, args: &[PathBuf]) -> anyhow::Result<Vec<Arc<dyn Device>>> {
        args.iter().map(|a| self.open(a)).collect()
    }
}

/// `5s`, `500ms`, `2m` or plain seconds.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let (num, unit) = match s.find(|c: char| !c.is_ascii_digit() && c != '.') {
        Some(i) => s.split_at(i),
        None => (s, "s"),
    };
    let n: f64 = num
        .parse()
        .map_err(|_| format!("'{s}': expected e.g. 5s, 500ms, 2m"))?;
    let secs = match unit {
        "ms" => n / 1000.0,
        "s" => n,
        "m" => n * 60.0,
        _ => return Err(format!("'{s}': unit must be ms, s or m")),
    };
    Duration::try_from_secs_f64(secs).map_err(|e| format!("'{s}': {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("5"), Ok(Duration::from_secs(5)));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert!(parse_duration("5h").is_err());
        assert!(parse_duration("x").is_err());
    }

    #[test]
    fn names() {
        let uri = "nbd+unix:///e?socket=/tmp/s";
        assert!(is_remote(Path::new(uri)));
        assert_eq!(name(Path::new(uri)), uri);
        assert!(!is_remote(Path::new("/dev/sda")));
    }
}
