//! `/etc/ironraid/ironraid.conf`: mdadm.conf's syntax where it fits.
//!
//! ```text
//! DEVICE /srv/raid/*.img /dev/disk/by-id/ata-*     # globs members may come from
//! ARRAY UUID=1c0e…:…  name=r5  nbd=tcp:0.0.0.0:10809  metrics=tcp:127.0.0.1:9101
//! MAILADDR root@example.com
//! PROGRAM /usr/local/sbin/raid-event
//! ```
//! As in mdadm.conf, `#` starts a comment and a line starting with white space continues the
//! one before it. mdadm's informative ARRAY words (`metadata=`, `level=`, `num-devices=`,
//! `spares=`, `devices=`, and a leading device name such as `/dev/md/r5`) are accepted so
//! that an mdadm ARRAY line can be pasted as it is; the superblocks are the authority.

use anyhow::{anyhow, bail, Context};
use std::path::{Path, PathBuf};

pub const DEFAULT_PATH: &str = "/etc/ironraid/ironraid.conf";
/// Overrides [`DEFAULT_PATH`] (`--config` overrides both).
pub const ENV_VAR: &str = "IRONRAID_CONFIG";

#[derive(Debug, Default, PartialEq)]
pub struct Config {
    pub path: PathBuf,
    /// Glob patterns of files and devices that may be members.
    pub devices: Vec<String>,
    pub arrays: Vec<ArrayLine>,
    pub mailaddr: Option<String>,
    pub program: Option<PathBuf>,
}

#[derive(Debug, Default, PartialEq, Clone)]
pub struct ArrayLine {
    pub uuid: Option<[u8; 16]>,
    pub name: Option<String>,
    /// `--nbd` addresses (empty: the default socket).
    pub nbd: Vec<String>,
    /// `--metrics` address.
    pub metrics: Option<String>,
}

impl ArrayLine {
    /// How messages name it: its name, else its UUID.
    pub fn label(&self) -> String {
        match (&self.name, &self.uuid) {
            (Some(n), _) => n.clone(),
            (None, Some(u)) => format::format_uuid_mdadm(u),
            (None, None) => "?".into(),
        }
    }
}

/// The config file's path: `--config`, else `$IRONRAID_CONFIG`, else the default.
pub fn path(flag: Option<&Path>) -> PathBuf {
    if let Some(p) = flag {
        return p.to_path_buf();
    }
    match std::env::var_os(ENV_VAR).filter(|v| !v.is_empty()) {
        Some(p) => PathBuf::from(p),
        None => PathBuf::from(DEFAULT_PATH),
    }
}

pub fn load(flag: Option<&Path>) -> anyhow::Result<Config> {
    let path = path(flag);
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("cannot read config {}", path.display()))?;
    let mut c = parse(&text).with_context(|| format!("config {}", path.display()))?;
    c.path = path;
    Ok(c)
}

/// The config if there is one: a missing file at the default place is no error (a monitor
/// runs without one), an unreadable or malformed one is.
pub fn load_optional(flag: Option<&Path>) -> anyhow::Result<Option<Config>> {
    if flag.is_none() && !path(None).exists() {
        return Ok(None);
    }
    load(flag).map(Some)
}

/// Logical lines: comments dropped, continuation lines joined, with their 1-based number.
fn logical_lines(text: &str) -> Vec<(usize, String)> {
    let mut out: Vec<(usize, String)> = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let line = raw.split('#').next().unwrap_or("");
        if line.trim().is_empty() {
            continue;
        }
        let continues = line.starts_with([' ', '\t']);
        match out.last_mut() {
            Some((_, prev)) if continues => {
                prev.push(' ');
                prev.push_str(line.trim());
            }
            _ => out.push((i + 1, line.trim().to_string())),
        }
    }
    out
}

pub fn parse(text: &str) -> anyhow::Result<Config> {
    let mut c = Config::default();
    for (n, line) in logical_lines(text) {
        let mut words = line.split_whitespace();
        let keyword = words.next().unwrap_or_default();
        let rest: Vec<&str> = words.collect();
        // mdadm matches keywords case-insensitively by their first three letters or more.
        let k = keyword.to_ascii_uppercase();
        let is = |full: &str| k.len() >= 3 && full.starts_with(&k);
        if is("DEVICE") || is("DEVICES") {
            c.devices.extend(rest.iter().map(|s| s.to_string()));
        } else if is("ARRAY") {
            c.arrays
                .push(parse_array(&rest).with_context(|| format!("line {n}"))?);
        } else if is("MAILADDR") {
            c.mailaddr = Some(rest.join(" ")).filter(|s| !s.is_empty());
        } else if is("PROGRAM") {
            c.program = rest.first().map(PathBuf::from);
        } else if is("MAILFROM") || is("HOMEHOST") || is("AUTO") || is("CREATE") {
            tracing::debug!("config line {n}: {keyword} is mdadm's and means nothing here");
        } else {
            bail!("line {n}: unknown keyword '{keyword}'");
        }
    }
    Ok(c)
}

fn parse_array(words: &[&str]) -> anyhow::Result<ArrayLine> {
    let mut a = ArrayLine::default();
    for (i, w) in words.iter().enumerate() {
        let Some((key, value)) = w.split_once('=') else {
            // mdadm's leading device name (/dev/md/NAME, /dev/md0, <ignore>).
            if i == 0 {
                continue;
            }
            bail!("ARRAY: '{w}' is not KEY=VALUE");
        };
        match key.to_ascii_lowercase().as_str() {
            "uuid" => {
                let u = format::parse_uuid(value)
                    .ok_or_else(|| anyhow!("ARRAY: UUID={value} is not a UUID"))?;
                a.uuid = Some(u);
            }
            // mdadm writes `name=HOST:NAME`; the array's own name is after the colon.
            "name" => a.name = Some(value.rsplit(':').next().unwrap_or(value).to_string()),
            "nbd" => a.nbd.extend(value.split(',').map(str::to_string)),
            "metrics" => a.metrics = Some(value.to_string()),
            "metadata" | "level" | "num-devices" | "spares" | "devices" | "container"
            | "member" => {}
            other => bail!("ARRAY: unknown option '{other}='"),
        }
    }
    if a.uuid.is_none() && a.name.is_none() {
        bail!("ARRAY needs UUID= or name=");
    }
    Ok(a)
}

/// Every existing path the DEVICE globs allow, each once, in glob order.
pub fn candidate_devices(c: &Config) -> anyhow::Result<Vec<PathBuf>> {
    if c.devices.is_empty() {
        bail!(
            "config {} has no DEVICE line: name the files or devices members may be (globs)",
            c.path.display()
        );
    }
    let mut out: Vec<PathBuf> = Vec::new();
    for pattern in &c.devices {
        let paths = glob::glob(pattern).map_err(|e| anyhow!("DEVICE {pattern}: {e}"))?;
        for p in paths.flatten() {
            if !out.contains(&p) {
                out.push(p);
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mdadm_lines_parse_with_continuations_and_comments() {
        let c = parse(
            "# a comment\nDEVICE /a/*.img\n  /b/m?\nARRAY /dev/md/r5 metadata=1.2 \
             UUID=01234567:89abcdef:01234567:89abcdef name=host:r5 # tail\n   nbd=tcp:[::1]:1,unix:/x\n\
             MAILADDR root\nPROG /bin/true\n",
        )
        .unwrap();
        assert_eq!(c.devices, ["/a/*.img", "/b/m?"]);
        assert_eq!(c.arrays.len(), 1);
        let a = &c.arrays[0];
        assert_eq!(a.name.as_deref(), Some("r5"));
        assert_eq!(a.nbd, ["tcp:[::1]:1", "unix:/x"]);
        assert_eq!(
            format::format_uuid_mdadm(&a.uuid.unwrap()),
            "01234567:89abcdef:01234567:89abcdef"
        );
        assert_eq!(c.mailaddr.as_deref(), Some("root"));
        assert_eq!(c.program, Some(PathBuf::from("/bin/true")));
    }

    #[test]
    fn bad_lines_are_refused_with_their_number() {
        let e = parse("DEVICE /a\nARRAY level=5\n").unwrap_err();
        assert!(format!("{e:#}").contains("line 2"), "{e:#}");
        assert!(parse("ARRAY UUID=xyz\n").is_err());
        assert!(parse("ARRAY name=a bogus=1\n").is_err());
        assert!(parse("FROB x\n").is_err());
    }
}
