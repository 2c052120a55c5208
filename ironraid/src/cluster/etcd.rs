//! A small blocking client of etcd's v3 API through the JSON gateway every etcd server serves
//! (`POST /v3/kv/range` and friends, keys and values in base64, 64-bit numbers as strings).
//!
//! Why not gRPC: the gateway speaks the same API (revisions, leases, transactions) without a
//! protobuf toolchain at build time or an async runtime in the engine's threads, and each call
//! here is one short HTTP/1.1 exchange. Every call goes to the first endpoint that answers;
//! etcd forwards what needs the leader. Reads are linearizable (etcd's default), which the
//! cluster's decisions need (reference: cluster-design.md §2.4).
//!
//! `https://` endpoints are spoken to over TLS (rustls), with etcdctl's choices: the CA given
//! (`--etcd-cacert`, else the system's bundle) and, for an etcd that requires client
//! certificates (`--client-cert-auth`), a certificate and key (`--etcd-cert`, `--etcd-key`).
//! Each call is its own connection, so each pays a handshake (about a millisecond of CPU).

use anyhow::{anyhow, bail, Context};
use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use rustls::pki_types::ServerName;
use rustls::{ClientConfig, ClientConnection, RootCertStore};
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// One key as etcd returns it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyValue {
    pub key: String,
    pub value: Vec<u8>,
    /// The revision that created the key (unique: a node's epoch is its key's).
    pub create_revision: i64,
    pub mod_revision: i64,
    /// The lease the key is bound to (0: none).
    pub lease: i64,
}

/// A condition of a transaction.
#[derive(Clone, Debug)]
pub enum Compare {
    /// The key does not exist.
    Absent(String),
    /// The key was last changed at this revision (it exists, unchanged since it was read).
    ModRevision(String, i64),
}

/// An operation of a transaction.
#[derive(Clone, Debug)]
pub enum Op {
    Put {
        key: String,
        value: Vec<u8>,
        lease: Option<i64>,
    },
}

/// What a transaction did: which branch ran, at which revision.
#[derive(Clone, Debug)]
pub struct TxnResult {
    pub succeeded: bool,
    pub revision: i64,
}

#[derive(Clone, Debug)]
struct Endpoint {
    /// `host:port` as given.
    authority: String,
    /// `https://`: the name its certificate must carry (the host).
    tls_name: Option<ServerName<'static>>,
}

/// Certificates for `https://` endpoints (etcdctl's `--cacert`, `--cert`, `--key`).
#[derive(Clone, Debug, Default)]
pub struct EtcdTls {
    /// The CA etcd's certificate must chain to (default: the system's bundle).
    pub cacert: Option<PathBuf>,
    /// This client's certificate and key, for an etcd that asks for one.
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
}

/// The CA bundle Debian keeps the system's trusted roots in.
const SYSTEM_CA_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";

impl EtcdTls {
    fn client_config(&self) -> anyhow::Result<Arc<ClientConfig>> {
        let ca = self
            .cacert
            .clone()
            .unwrap_or_else(|| PathBuf::from(SYSTEM_CA_BUNDLE));
        let mut roots = RootCertStore::empty();
        for c in nbd::read_certs(&ca)? {
            roots.add(c).with_context(|| format!("{}", ca.display()))?;
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .with_root_certificates(roots);
        let config = match (&self.cert, &self.key) {
            (Some(cert), Some(key)) => builder
                .with_client_auth_cert(nbd::read_certs(cert)?, nbd::read_key(key)?)
                .with_context(|| format!("{}", cert.display()))?,
            (None, None) => builder.with_no_client_auth(),
            _ => bail!("--etcd-cert and --etcd-key go together"),
        };
        Ok(Arc::new(config))
    }
}

/// A client of one etcd cluster.
#[derive(Clone, Debug)]
pub struct Etcd {
    endpoints: Vec<Endpoint>,
    timeout: Duration,
    /// For `https://` endpoints.
    tls: Option<Arc<ClientConfig>>,
}

impl Etcd {
    /// `endpoints`: etcd client URLs, comma-separated (`http://127.0.0.1:2379,...`); an
    /// `https://` one is checked against the system's CA bundle.
    #[cfg(test)]
    pub fn new(endpoints: &str, timeout: Duration) -> anyhow::Result<Etcd> {
        Etcd::with_tls(endpoints, &EtcdTls::default(), timeout)
    }

    /// [`Etcd::new`], `https://` endpoints with `tls`'s certificates.
    pub fn with_tls(endpoints: &str, tls: &EtcdTls, timeout: Duration) -> anyhow::Result<Etcd> {
        let endpoints = endpoints
            .split(',')
            .map(str::trim)
            .filter(|e| !e.is_empty())
            .map(parse_endpoint)
            .collect::<anyhow::Result<Vec<_>>>()?;
        if endpoints.is_empty() {
            bail!("no etcd endpoint given");
        }
        let secure = endpoints.iter().any(|e| e.tls_name.is_some());
        if !secure && (tls.cacert.is_some() || tls.cert.is_some()) {
            bail!("--etcd-cacert/--etcd-cert need https:// endpoints");
        }
        let tls = match secure {
            true => Some(tls.client_config().context("etcd TLS")?),
            false => None,
        };
        Ok(Etcd {
            endpoints,
            timeout,
            tls,
        })
    }

    /// POST `body` to `path` on the first endpoint that answers; the first JSON value of the
    /// reply (streaming calls answer with one per message; the first is all we ask for).
    fn call(&self, path: &str, body: &Value) -> anyhow::Result<Value> {
        let mut errors = Vec::new();
        for ep in &self.endpoints {
            match self.call_one(ep, path, body) {
                Ok(v) => return Ok(v),
                Err(e) => errors.push(format!("{}: {e:#}", ep.authority)),
            }
        }
        bail!("etcd unreachable ({})", errors.join("; "))
    }

    fn call_one(&self, ep: &Endpoint, path: &str, body: &Value) -> anyhow::Result<Value> {
        let addr = ep
            .authority
            .to_socket_addrs()
            .context("cannot resolve")?
            .next()
            .ok_or_else(|| anyhow!("no address"))?;
        let s = TcpStream::connect_timeout(&addr, self.timeout)?;
        s.set_read_timeout(Some(self.timeout))?;
        s.set_write_timeout(Some(self.timeout))?;
        s.set_nodelay(true)?;
        match (&ep.tls_name, &self.tls) {
            (Some(name), Some(config)) => {
                let conn = ClientConnection::new(config.clone(), name.clone())?;
                exchange(rustls::StreamOwned::new(conn, s), ep, path, body)
            }
            _ => exchange(s, ep, path, body),
        }
    }
    /// Every key under `prefix`, and the revision the read saw.
    pub fn get_prefix(&self, prefix: &str) -> anyhow::Result<(Vec<KeyValue>, i64)> {
        let v = self.call(
            "/v3/kv/range",
            &json!({ "key": B64.encode(prefix), "range_end": B64.encode(prefix_end(prefix)) }),
        )?;
        Ok((kvs(&v)?, header_revision(&v)))
    }

    /// The key itself, if it exists (not the keys it prefixes).
    pub fn get(&self, key: &str) -> anyhow::Result<Option<KeyValue>> {
        let v = self.call("/v3/kv/range", &json!({ "key": B64.encode(key) }))?;
        Ok(kvs(&v)?.into_iter().find(|kv| kv.key == key))
    }

    /// Put `value` at `key` (bound to `lease` if given); the new revision.
    pub fn put(&self, key: &str, value: &[u8], lease: Option<i64>) -> anyhow::Result<i64> {
        let v = self.call("/v3/kv/put", &put_body(key, value, lease))?;
        Ok(header_revision(&v))
    }

    pub fn delete(&self, key: &str) -> anyhow::Result<()> {
        self.call("/v3/kv/deleterange", &json!({ "key": B64.encode(key) }))?;
        Ok(())
    }

    /// Delete every key under `prefix`.
    pub fn delete_prefix(&self, prefix: &str) -> anyhow::Result<()> {
        self.call(
            "/v3/kv/deleterange",
            &json!({ "key": B64.encode(prefix), "range_end": B64.encode(prefix_end(prefix)) }),
        )?;
        Ok(())
    }

    /// If every compare holds, run `success`, else `failure`; atomically, at one revision.
    pub fn txn(
        &self,
        compares: &[Compare],
        success: &[Op],
        failure: &[Op],
    ) -> anyhow::Result<TxnResult> {
        let body = json!({
            "compare": compares.iter().map(compare_body).collect::<Vec<_>>(),
            "success": success.iter().map(op_body).collect::<Vec<_>>(),
            "failure": failure.iter().map(op_body).collect::<Vec<_>>(),
        });
        let v = self.call("/v3/kv/txn", &body)?;
        Ok(TxnResult {
            succeeded: v["succeeded"].as_bool().unwrap_or(false),
            revision: header_revision(&v),
        })
    }

    /// A new lease; its id and the TTL the server granted (it may raise a small one).
    pub fn lease_grant(&self, ttl: Duration) -> anyhow::Result<(i64, Duration)> {
        let v = self.call("/v3/lease/grant", &json!({ "TTL": ttl.as_secs().max(1) }))?;
        let id = num(&v["ID"]).ok_or_else(|| anyhow!("lease grant without an id"))?;
        Ok((id, Duration::from_secs(num(&v["TTL"]).unwrap_or(0) as u64)))
    }

    /// Renew the lease to its full TTL; None if it is gone (expired or revoked).
    pub fn lease_keep_alive(&self, id: i64) -> anyhow::Result<Option<Duration>> {
        let v = self.call("/v3/lease/keepalive", &json!({ "ID": id.to_string() }))?;
        Ok(num(&v["TTL"])
            .filter(|&t| t > 0)
            .map(|t| Duration::from_secs(t as u64)))
    }

    /// Give the lease up: its keys go at once.
    pub fn lease_revoke(&self, id: i64) -> anyhow::Result<()> {
        self.call("/v3/lease/revoke", &json!({ "ID": id.to_string() }))?;
        Ok(())
    }
}

/// One HTTP/1.1 exchange on `s`: POST `body` to `path`; the reply's first JSON value.
fn exchange<S: Read + Write>(
    mut s: S,
    ep: &Endpoint,
    path: &str,
    body: &Value,
) -> anyhow::Result<Value> {
    let payload = body.to_string();
    write!(
        s,
        "POST {path} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{payload}",
        ep.authority,
        payload.len()
    )?;
    s.flush()?;
    let mut r = BufReader::new(s);
    let (status, chunked) = read_head(&mut r)?;
    let value = if chunked {
        first_json_chunked(&mut r)?
    } else {
        let mut rest = Vec::new();
        r.read_to_end(&mut rest)?;
        first_json(&rest)?.ok_or_else(|| anyhow!("empty reply"))?
    };
    if let Some(err) = value.get("error").or_else(|| value.get("message")) {
        bail!("{}", err.as_str().unwrap_or("error"));
    }
    if status != 200 {
        bail!("HTTP status {status}");
    }
    Ok(value.get("result").cloned().unwrap_or(value))
}

/// `http://HOST:PORT` or `https://HOST:PORT`.
fn parse_endpoint(e: &str) -> anyhow::Result<Endpoint> {
    let (authority, tls) = match (e.strip_prefix("http://"), e.strip_prefix("https://")) {
        (Some(a), _) => (a, false),
        (_, Some(a)) => (a, true),
        _ => bail!("etcd endpoint '{e}': expected an http:// or https:// URL"),
    };
    let authority = authority.trim_end_matches('/');
    if authority.is_empty() || authority.contains('/') {
        bail!("etcd endpoint '{e}': expected http(s)://HOST:PORT");
    }
    let tls_name = match tls {
        false => None,
        true => {
            let host = match authority.rsplit_once(':') {
                Some((h, p)) if p.parse::<u16>().is_ok() => h,
                _ => authority,
            };
            let host = host.trim_start_matches('[').trim_end_matches(']');
            Some(
                ServerName::try_from(host.to_string())
                    .map_err(|err| anyhow!("etcd endpoint '{e}': {err}"))?,
            )
        }
    };
    Ok(Endpoint {
        authority: authority.to_string(),
        tls_name,
    })
}

/// The status code and whether the body is chunked.
fn read_head(r: &mut impl BufRead) -> anyhow::Result<(u32, bool)> {
    let mut line = String::new();
    r.read_line(&mut line)?;
    let status: u32 = line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| anyhow!("not an HTTP reply: {:?}", line.trim()))?;
    let mut chunked = false;
    loop {
        line.clear();
        if r.read_line(&mut line)? == 0 || line == "\r\n" || line == "\n" {
            break;
        }
        let lower = line.to_ascii_lowercase();
        chunked |= lower.starts_with("transfer-encoding:") && lower.contains("chunked");
    }
    Ok((status, chunked))
}

/// Read chunks until they hold one whole JSON value (a stream's first message).
fn first_json_chunked(r: &mut impl BufRead) -> anyhow::Result<Value> {
    let mut body = Vec::new();
    loop {
        let mut size = String::new();
        if r.read_line(&mut size)? == 0 {
            break;
        }
        let n = usize::from_str_radix(size.trim().split(';').next().unwrap_or(""), 16)
            .map_err(|_| anyhow!("bad chunk size {:?}", size.trim()))?;
        if n == 0 {
            break;
        }
        let mut chunk = vec![0u8; n + 2];
        r.read_exact(&mut chunk)?;
        body.extend_from_slice(&chunk[..n]);
        if let Some(v) = first_json(&body)? {
            return Ok(v);
        }
    }
    first_json(&body)?.ok_or_else(|| anyhow!("empty reply"))
}

/// The first JSON value of `body`, or None if it is not complete yet.
fn first_json(body: &[u8]) -> anyhow::Result<Option<Value>> {
    match serde_json::Deserializer::from_slice(body)
        .into_iter::<Value>()
        .next()
    {
        None => Ok(None),
        Some(Ok(v)) => Ok(Some(v)),
        Some(Err(e)) if e.is_eof() => Ok(None),
        Some(Err(e)) => Err(e.into()),
    }
}

/// The end of the range of keys starting with `prefix` (etcd's `range_end`).
fn prefix_end(prefix: &str) -> Vec<u8> {
    let mut end = prefix.as_bytes().to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0] // every key
}

/// A 64-bit number, which the gateway writes as a string.
fn num(v: &Value) -> Option<i64> {
    v.as_str()
        .and_then(|s| s.parse().ok())
        .or_else(|| v.as_i64())
}

fn header_revision(v: &Value) -> i64 {
    num(&v["header"]["revision"]).unwrap_or(0)
}

fn kvs(v: &Value) -> anyhow::Result<Vec<KeyValue>> {
    v["kvs"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|kv| {
            let key = B64.decode(kv["key"].as_str().unwrap_or(""))?;
            Ok(KeyValue {
                key: String::from_utf8(key).context("key is not UTF-8")?,
                value: B64.decode(kv["value"].as_str().unwrap_or(""))?,
                create_revision: num(&kv["create_revision"]).unwrap_or(0),
                mod_revision: num(&kv["mod_revision"]).unwrap_or(0),
                lease: num(&kv["lease"]).unwrap_or(0),
            })
        })
        .collect()
}

fn put_body(key: &str, value: &[u8], lease: Option<i64>) -> Value {
    let mut b = json!({ "key": B64.encode(key), "value": B64.encode(value) });
    if let Some(l) = lease {
        b["lease"] = json!(l.to_string());
    }
    b
}

fn compare_body(c: &Compare) -> Value {
    match c {
        Compare::Absent(key) => json!({
            "target": "CREATE", "result": "EQUAL", "key": B64.encode(key), "create_revision": "0"
        }),
        Compare::ModRevision(key, rev) => json!({
            "target": "MOD", "result": "EQUAL", "key": B64.encode(key), "mod_revision": rev.to_string()
        }),
    }
}

fn op_body(op: &Op) -> Value {
    match op {
        Op::Put { key, value, lease } => json!({ "request_put": put_body(key, value, *lease) }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_ends() {
        assert_eq!(prefix_end("/a/"), b"/a0".to_vec());
        assert_eq!(prefix_end("a\u{7f}"), b"a\x80".to_vec());
    }

    #[test]
    fn endpoints_must_be_http_urls() {
        assert!(Etcd::new("http://127.0.0.1:2379", Duration::from_secs(1)).is_ok());
        assert!(Etcd::new("127.0.0.1:2379", Duration::from_secs(1)).is_err());
        let t = Duration::from_secs(1);
        let missing_ca = EtcdTls {
            cacert: Some("/nonexistent/ca.pem".into()),
            ..EtcdTls::default()
        };
        assert!(Etcd::with_tls("https://h:1", &missing_ca, t).is_err());
        assert!(Etcd::with_tls("http://h:1", &missing_ca, t).is_err());
        assert!(Etcd::new("ftp://h:1", t).is_err());
        assert!(Etcd::new(" , ", Duration::from_secs(1)).is_err());
    }

    #[test]
    fn first_json_waits_for_a_whole_value() {
        assert!(first_json(b"{\"a\":").unwrap().is_none());
        assert_eq!(
            first_json(b"{\"a\":1}{\"b\":2}").unwrap(),
            Some(json!({"a": 1}))
        );
        assert!(first_json(b"{]").is_err());
    }
}
