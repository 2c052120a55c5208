//! Where `run` serves NBD: `--nbd` addresses (`unix:PATH`, `tcp:HOST:PORT`, or NBD URIs as
//! qemu and libnbd write them), the URIs a client connects with, and who may open the Unix
//! sockets.

use anyhow::{anyhow, bail, Context};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

/// NBD's registered TCP port, the default of `nbd://HOST`.
pub const NBD_PORT: u16 = 10809;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Listen {
    Unix(PathBuf),
    /// `HOST:PORT` as `TcpListener::bind` takes it (IPv6 hosts in brackets).
    Tcp(String),
}

/// One `--nbd` value: `unix:PATH`, `tcp:HOST:PORT`, `nbd://HOST[:PORT][/EXPORT]` or
/// `nbd+unix:///[EXPORT]?socket=PATH`. A URI's export name, if any, is returned too: it must
/// be the one served.
pub fn parse(addr: &str) -> anyhow::Result<(Listen, Option<String>)> {
    if let Some(p) = addr.strip_prefix("unix:") {
        return Ok((Listen::Unix(PathBuf::from(p)), None));
    }
    if let Some(hp) = addr.strip_prefix("tcp:") {
        return Ok((Listen::Tcp(hp.to_string()), None));
    }
    if let Some(rest) = addr.strip_prefix("nbd+unix://") {
        let (path, query) = rest
            .split_once('?')
            .ok_or_else(|| anyhow!("--nbd {addr}: nbd+unix:// needs ?socket=PATH"))?;
        let authority_and_export = path.strip_prefix('/').unwrap_or(path);
        let socket = query
            .split('&')
            .find_map(|kv| kv.strip_prefix("socket="))
            .filter(|s| !s.is_empty())
            .ok_or_else(|| anyhow!("--nbd {addr}: nbd+unix:// needs ?socket=PATH"))?;
        let export = (!authority_and_export.is_empty()).then(|| authority_and_export.to_string());
        return Ok((Listen::Unix(PathBuf::from(socket)), export));
    }
    if let Some(rest) = addr.strip_prefix("nbd://") {
        let (authority, export) = match rest.split_once('/') {
            Some((a, e)) => (a, (!e.is_empty()).then(|| e.to_string())),
            None => (rest, None),
        };
        if authority.is_empty() {
            bail!("--nbd {addr}: nbd:// needs a host");
        }
        // A port is what follows the last ':' outside IPv6 brackets.
        let has_port = match authority.rfind(']') {
            Some(close) => authority[close..].contains(':'),
            None => authority.contains(':'),
        };
        let hp = if has_port {
            authority.to_string()
        } else {
            format!("{authority}:{NBD_PORT}")
        };
        return Ok((Listen::Tcp(hp), export));
    }
    if addr.starts_with("nbds://") || addr.starts_with("nbds+unix://") {
        bail!("--nbd {addr}: give nbd://… with --tls-cert/--tls-key (TLS is negotiated with STARTTLS)");
    }
    bail!(
        "--nbd {addr}: expected unix:PATH, tcp:HOST:PORT, nbd://HOST[:PORT] or \
         nbd+unix:///?socket=PATH"
    )
}

/// The TLS configuration of `--tls-cert/--tls-key [--tls-ca] [--tls require|on]`.
pub fn tls_config(
    cert: Option<PathBuf>,
    key: Option<PathBuf>,
    ca: Option<PathBuf>,
    mode: Option<&str>,
) -> anyhow::Result<Option<nbd::TlsConfig>> {
    let (Some(cert), Some(key)) = (cert, key) else {
        return Ok(None);
    };
    let required = mode != Some("on");
    nbd::TlsConfig::from_pem_files(&cert, &key, ca.as_deref(), required)
        .map(Some)
        .map_err(|e| anyhow!("TLS: {e}"))
}

/// The URI a client connects with (nbdkit's `--print-uri`).
pub fn uri_unix(path: &Path, export: &str) -> String {
    format!("nbd+unix:///{export}?socket={}", path.display())
}

pub fn uri_tcp(addr: SocketAddr, export: &str, tls: bool) -> String {
    let scheme = if tls { "nbds" } else { "nbd" };
    format!("{scheme}://{addr}/{export}")
}

/// Plain TCP off the loopback: anyone who can reach the port can read and write the array.
pub fn warn_if_exposed(addr: SocketAddr, tls_required: bool) {
    if !addr.ip().is_loopback() && !tls_required {
        tracing::warn!(
            address = %addr,
            "serving NBD over plain TCP on a non-loopback address: anyone who can reach it \
             can read and write the array, and the traffic is not encrypted (use \
             --tls-cert/--tls-key, a firewall, or a Unix socket)"
        );
    }
}

/// Who may open the NBD Unix sockets (`--socket-mode`, `--socket-owner`).
#[derive(Clone, Debug)]
pub struct SocketAccess {
    pub mode: u32,
    /// uid and gid to give the sockets (None: leave as created).
    pub owner: Option<(Option<u32>, Option<u32>)>,
}

impl SocketAccess {
    pub fn parse(mode: &str, owner: Option<&str>) -> anyhow::Result<SocketAccess> {
        let mode = u32::from_str_radix(mode.trim_start_matches("0o"), 8)
            .ok()
            .filter(|m| *m <= 0o777)
            .ok_or_else(|| anyhow!("--socket-mode {mode}: expected an octal mode such as 0660"))?;
        let owner = owner.map(parse_owner).transpose()?;
        Ok(SocketAccess { mode, owner })
    }

    pub fn apply(&self, path: &Path) -> anyhow::Result<()> {
        use std::os::unix::fs::PermissionsExt;
        if let Some((uid, gid)) = self.owner {
            std::os::unix::fs::chown(path, uid, gid)
                .with_context(|| format!("chown {}", path.display()))?;
        }
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(self.mode))
            .with_context(|| format!("chmod {:o} {}", self.mode, path.display()))
    }
}

/// `USER[:GROUP]` or `:GROUP`, by name (from /etc/passwd, /etc/group) or number.
fn parse_owner(s: &str) -> anyhow::Result<(Option<u32>, Option<u32>)> {
    let (user, group) = match s.split_once(':') {
        Some((u, g)) => (u, Some(g)),
        None => (s, None),
    };
    let uid = (!user.is_empty())
        .then(|| lookup_id(user, "/etc/passwd"))
        .transpose()
        .with_context(|| format!("--socket-owner {s}"))?;
    let gid = group
        .filter(|g| !g.is_empty())
        .map(|g| lookup_id(g, "/etc/group"))
        .transpose()
        .with_context(|| format!("--socket-owner {s}"))?;
    Ok((uid, gid))
}

fn lookup_id(name: &str, db: &str) -> anyhow::Result<u32> {
    if let Ok(n) = name.parse() {
        return Ok(n);
    }
    let text = std::fs::read_to_string(db).with_context(|| format!("reading {db}"))?;
    text.lines()
        .map(|l| l.split(':').collect::<Vec<_>>())
        .find(|f| f.len() > 2 && f[0] == name)
        .and_then(|f| f[2].parse().ok())
        .ok_or_else(|| anyhow!("no '{name}' in {db}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_and_uris() {
        let tcp = |s: &str| Listen::Tcp(s.to_string());
        assert_eq!(parse("tcp:0.0.0.0:1").unwrap(), (tcp("0.0.0.0:1"), None));
        assert_eq!(
            parse("nbd://localhost").unwrap(),
            (tcp("localhost:10809"), None)
        );
        assert_eq!(
            parse("nbd://127.0.0.1:4000/vol").unwrap(),
            (tcp("127.0.0.1:4000"), Some("vol".into()))
        );
        assert_eq!(parse("nbd://[::1]").unwrap().0, tcp("[::1]:10809"));
        assert_eq!(parse("nbd://[::1]:7/").unwrap().0, tcp("[::1]:7"));
        assert_eq!(
            parse("nbd+unix:///?socket=/run/x.sock").unwrap(),
            (Listen::Unix("/run/x.sock".into()), None)
        );
        assert_eq!(
            parse("nbd+unix:///vol?socket=/s").unwrap().1.as_deref(),
            Some("vol")
        );
        assert!(parse("nbd+unix:///vol").is_err());
        assert!(parse("nbds://h").is_err());
        assert!(parse("http://h").is_err());
        let a: SocketAddr = "[::1]:10809".parse().unwrap();
        assert_eq!(uri_tcp(a, "vol", false), "nbd://[::1]:10809/vol");
        assert_eq!(uri_tcp(a, "vol", true), "nbds://[::1]:10809/vol");
        assert_eq!(
            uri_unix(Path::new("/r/v.nbd"), "v"),
            "nbd+unix:///v?socket=/r/v.nbd"
        );
    }

    #[test]
    fn socket_access() {
        assert_eq!(SocketAccess::parse("660", None).unwrap().mode, 0o660);
        assert_eq!(SocketAccess::parse("0o600", None).unwrap().mode, 0o600);
        assert!(SocketAccess::parse("999", None).is_err());
        let a = SocketAccess::parse("600", Some("0:0")).unwrap();
        assert_eq!(a.owner, Some((Some(0), Some(0))));
        let a = SocketAccess::parse("600", Some("root")).unwrap();
        assert_eq!(a.owner, Some((Some(0), None)));
        assert!(SocketAccess::parse("600", Some("no-such-user-here")).is_err());
    }
}
