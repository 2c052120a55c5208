//! NBD URIs (the NBD project's `doc/uri.md`, as libnbd and qemu write them):
//!
//! * `nbd://HOST[:PORT][/EXPORT]`: TCP, port 10809 by default, IPv6 hosts in brackets;
//! * `nbd+unix:///[EXPORT]?socket=PATH`: a Unix socket, the authority must be empty;
//! * `nbds://…`, `nbds+unix://…`: the same over TLS, with libnbd's query parameters
//!   `tls-certificates=DIR` and `tls-hostname=NAME`; `tls-psk-file` and
//!   `tls-verify-peer=false` are refused (not supported: a URI that asks for them must not
//!   get something else).
//!
//! The export name is the path after its first `/`, percent-decoded (`nbd://h/` and `nbd://h`
//! both name the default export `""`). Other query parameters are ignored, as the standard
//! allows for ones a client does not use (`tls-*` on a plain URI too).

use std::fmt;

/// Default NBD TCP port (IANA).
pub const DEFAULT_PORT: u16 = 10809;

/// Where an export is reached.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Transport {
    Tcp { host: String, port: u16 },
    Unix { socket: String },
}

/// What an `nbds` URI says about TLS.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TlsParams {
    /// `tls-certificates=DIR`: `ca-cert.pem`, and `client-cert.pem`/`client-key.pem`.
    pub certificates: Option<String>,
    /// `tls-hostname=NAME`: the name the server's certificate must carry.
    pub hostname: Option<String>,
}

/// A parsed NBD URI.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NbdUri {
    pub transport: Transport,
    pub export: String,
    /// `Some` for `nbds` and `nbds+unix`.
    pub tls: Option<TlsParams>,
}

/// Why a string is not a usable NBD URI.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UriError(String);

impl fmt::Display for UriError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for UriError {}

/// Whether `s` is meant as an NBD URI (its scheme says so), valid or not.
pub fn is_nbd_uri(s: &str) -> bool {
    ["nbd:", "nbds:", "nbd+unix:", "nbds+unix:"]
        .iter()
        .any(|scheme| s.starts_with(scheme))
}

impl NbdUri {
    pub fn parse(uri: &str) -> Result<NbdUri, UriError> {
        let bad = |why: &str| UriError(format!("{uri}: {why}"));
        let (scheme, rest) = uri
            .split_once("://")
            .ok_or_else(|| bad("expected SCHEME://"))?;
        let (unix, tls) = match scheme {
            "nbd" => (false, false),
            "nbd+unix" => (true, false),
            "nbds" | "nbds+unix" => (scheme.ends_with("unix"), true),
            _ => return Err(bad("scheme must be nbd, nbd+unix, nbds or nbds+unix")),
        };
        let (before_query, query) = rest.split_once('?').unwrap_or((rest, ""));
        let (before_fragment, _) = before_query.split_once('#').unwrap_or((before_query, ""));
        let (authority, path) = match before_fragment.find('/') {
            Some(i) => before_fragment.split_at(i),
            None => (before_fragment, ""),
        };
        let export = percent_decode(path.strip_prefix('/').unwrap_or(path))
            .ok_or_else(|| bad("bad percent-encoding in the export name"))?;
        let socket = query_param(query, "socket")
            .map(|s| percent_decode(s).ok_or_else(|| bad("bad percent-encoding in socket=")))
            .transpose()?;
        let transport = if unix {
            if !authority.is_empty() {
                return Err(bad(
                    "nbd+unix takes no host (write nbd+unix:///EXPORT?socket=PATH)",
                ));
            }
            let socket = socket.ok_or_else(|| bad("nbd+unix needs ?socket=PATH"))?;
            if socket.is_empty() {
                return Err(bad("socket= is empty"));
            }
            Transport::Unix { socket }
        } else {
            if socket.is_some() {
                return Err(bad("socket= is for nbd+unix URIs"));
            }
            let (host, port) = split_host_port(authority).ok_or_else(|| bad("bad HOST[:PORT]"))?;
            Transport::Tcp { host, port }
        };
        let tls = if tls {
            Some(tls_params(query).map_err(|why| bad(&why))?)
        } else {
            None
        };
        Ok(NbdUri {
            transport,
            export,
            tls,
        })
    }
}

fn tls_params(query: &str) -> Result<TlsParams, String> {
    let decoded = |key: &str| {
        query_param(query, key)
            .map(|v| percent_decode(v).ok_or(format!("bad percent-encoding in {key}=")))
            .transpose()
    };
    if query_param(query, "tls-psk-file").is_some() {
        return Err("tls-psk-file: TLS with pre-shared keys is not supported".into());
    }
    if matches!(
        query_param(query, "tls-verify-peer"),
        Some("false" | "0" | "no")
    ) {
        return Err(
            "tls-verify-peer=false is not supported (the server is always verified)".into(),
        );
    }
    Ok(TlsParams {
        certificates: decoded("tls-certificates")?,
        hostname: decoded("tls-hostname")?,
    })
}

/// `HOST[:PORT]`, `[V6ADDR][:PORT]`; a user part (`user@`) is dropped (NBD has no users).
fn split_host_port(authority: &str) -> Option<(String, u16)> {
    let hostport = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    let (host, port) = if let Some(v6) = hostport.strip_prefix('[') {
        let (host, after) = v6.split_once(']')?;
        (host, after.strip_prefix(':'))
    } else {
        match hostport.split_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (hostport, None),
        }
    };
    if host.is_empty() {
        return None;
    }
    let port = match port {
        None | Some("") => DEFAULT_PORT,
        Some(p) => p.parse().ok()?,
    };
    Some((host.to_string(), port))
}

fn query_param<'a>(query: &'a str, key: &str) -> Option<&'a str> {
    query
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .find(|(k, _)| *k == key)
        .map(|(_, v)| v)
}

/// `%XX` decoding; `None` on a malformed escape or a result that is not UTF-8.
fn percent_decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tcp(host: &str, port: u16, export: &str) -> NbdUri {
        NbdUri {
            transport: Transport::Tcp {
                host: host.into(),
                port,
            },
            export: export.into(),
            tls: None,
        }
    }

    #[test]
    fn tcp_forms() {
        assert_eq!(NbdUri::parse("nbd://h").unwrap(), tcp("h", 10809, ""));
        assert_eq!(NbdUri::parse("nbd://h/").unwrap(), tcp("h", 10809, ""));
        assert_eq!(
            NbdUri::parse("nbd://h:1234/e").unwrap(),
            tcp("h", 1234, "e")
        );
        assert_eq!(
            NbdUri::parse("nbd://[::1]:99/a%2Fb%20c").unwrap(),
            tcp("::1", 99, "a/b c")
        );
        // Only the first slash separates: the export may hold slashes.
        assert_eq!(
            NbdUri::parse("nbd://h//x/y").unwrap(),
            tcp("h", 10809, "/x/y")
        );
    }

    #[test]
    fn unix_forms() {
        let u =
            NbdUri::parse("nbd+unix:///disk?socket=/tmp/s%20x.sock&tls-verify-peer=false").unwrap();
        assert_eq!(
            u,
            NbdUri {
                transport: Transport::Unix {
                    socket: "/tmp/s x.sock".into()
                },
                export: "disk".into(),
                tls: None,
            }
        );
        let u = NbdUri::parse("nbd+unix://?socket=/s").unwrap();
        assert_eq!(u.export, "");
    }

    #[test]
    fn tls_forms() {
        let u = NbdUri::parse("nbds://h:99/e?tls-certificates=/etc/pki/a%20b&tls-hostname=srv")
            .unwrap();
        assert_eq!(
            u.tls,
            Some(TlsParams {
                certificates: Some("/etc/pki/a b".into()),
                hostname: Some("srv".into()),
            })
        );
        let u = NbdUri::parse("nbds+unix:///e?socket=/s").unwrap();
        assert_eq!(u.tls, Some(TlsParams::default()));
        assert_eq!(
            u.transport,
            Transport::Unix {
                socket: "/s".into()
            }
        );
        assert_eq!(
            NbdUri::parse("nbd://h/e?tls-certificates=/x").unwrap().tls,
            None
        );
    }

    #[test]
    fn refusals() {
        for bad in [
            "nbd+unix:///e",
            "nbd+unix://host/e?socket=/s",
            "nbd://:10/e",
            "nbd://h:x/e",
            "nbd://h/e?socket=/s",
            "nbds://h/e?tls-psk-file=/k",
            "nbds://h/e?tls-verify-peer=false",
            "nbd://h/%zz",
            "http://h/e",
            "nbd:/h",
        ] {
            assert!(NbdUri::parse(bad).is_err(), "{bad} accepted");
        }
        assert!(is_nbd_uri("nbds+unix:///e?socket=/s"));
        assert!(!is_nbd_uri("/dev/sda"));
        assert!(!is_nbd_uri("nbdfile.img"));
    }
}
