//! `run --metrics tcp:HOST:PORT|unix:PATH`: Prometheus text at `/metrics`.
//!
//! Every scrape takes a fresh snapshot (the same one `detail --json` reports) and encodes it
//! with the `prometheus-client` crate, so a value never lags the array. The names start with
//! `ironraid_`; node_exporter's md collector series (`md_state`, `md_disks`,
//! `md_disks_required`, `md_blocks`, `md_blocks_synced`, label `device`) keep their meaning, so
//! its dashboards and alerts work with the prefix changed.

use crate::iostats;
use crate::status::Detail;
use anyhow::{anyhow, Context};
use engine::Array;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, UnixListener};

type Labels = Vec<(String, String)>;
type FloatGauge = Gauge<f64, AtomicU64>;

/// Largest request head read; a scrape's is a few hundred bytes.
const MAX_REQUEST_BYTES: usize = 8192;
/// A client that has not sent its request by then is dropped.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// Scrapes answered at once; connections past that are closed unanswered, so a flood of idle
/// connections costs a bounded number of tasks and snapshots.
const MAX_CONCURRENT: usize = 16;

/// What a scrape reads.
#[derive(Clone)]
pub struct Source {
    pub array: Arc<Array>,
    pub server: Arc<nbd::Server>,
    pub addrs: Vec<String>,
    /// This node's membership, if the array is clustered.
    pub cluster: Option<Arc<crate::cluster::node::Node>>,
}

pub enum Listener {
    Tcp(TcpListener),
    Unix(UnixListener, PathBuf),
}

/// Bind `tcp:HOST:PORT` or `unix:PATH` (a stale socket file is replaced).
pub async fn bind(addr: &str) -> anyhow::Result<Listener> {
    if let Some(hp) = addr.strip_prefix("tcp:") {
        let l = TcpListener::bind(hp)
            .await
            .with_context(|| format!("--metrics: cannot listen on {addr}"))?;
        tracing::info!(address = %l.local_addr()?, "serving metrics at /metrics");
        return Ok(Listener::Tcp(l));
    }
    if let Some(p) = addr.strip_prefix("unix:") {
        let path = PathBuf::from(p);
        if path.exists() && std::os::unix::net::UnixStream::connect(&path).is_err() {
            let _ = std::fs::remove_file(&path);
        }
        let l = UnixListener::bind(&path)
            .with_context(|| format!("--metrics: cannot listen on {addr}"))?;
        tracing::info!(socket = %path.display(), "serving metrics at /metrics");
        return Ok(Listener::Unix(l, path));
    }
    Err(anyhow!(
        "--metrics {addr}: expected tcp:HOST:PORT or unix:PATH"
    ))
}

/// Answer scrapes until the task is aborted.
pub async fn serve(listener: Listener, source: Source) {
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_CONCURRENT));
    loop {
        let accepted: std::io::Result<Box<dyn Conn>> = match &listener {
            Listener::Tcp(l) => l.accept().await.map(|(s, _)| Box::new(s) as Box<dyn Conn>),
            Listener::Unix(l, _) => l.accept().await.map(|(s, _)| Box::new(s) as Box<dyn Conn>),
        };
        let Ok(conn) = accepted else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            continue;
        };
        let source = source.clone();
        tokio::spawn(async move {
            let _ = tokio::time::timeout(REQUEST_TIMEOUT, answer(conn, &source)).await;
            drop(slot);
        });
    }
}

trait Conn: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Conn for T {}

/// One HTTP/1.x request, one response, then close.
async fn answer(mut conn: Box<dyn Conn>, source: &Source) -> std::io::Result<()> {
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < MAX_REQUEST_BYTES {
        let n = conn.read(&mut buf).await?;
        if n == 0 {
            break;
        }
        head.extend_from_slice(&buf[..n]);
    }
    let line = String::from_utf8_lossy(&head);
    let mut words = line.split_whitespace();
    let (method, target) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
    let path = target.split('?').next().unwrap_or("");
    let (status, ctype, body) = match (method, path) {
        ("GET", "/metrics") | ("HEAD", "/metrics") => {
            let a = source.array.clone();
            let s = source.clone();
            let body = tokio::task::spawn_blocking(move || render(&a, &s))
                .await
                .map_err(std::io::Error::other)?;
            (
                "200 OK",
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
                body,
            )
        }
        ("GET", _) | ("HEAD", _) => ("404 Not Found", "text/plain", "try /metrics\n".into()),
        _ => ("405 Method Not Allowed", "text/plain", "GET only\n".into()),
    };
    let mut out = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    if method != "HEAD" {
        out.push_str(&body);
    }
    conn.write_all(out.as_bytes()).await?;
    conn.shutdown().await
}

/// Gauges and counters of one scrape, by name: each name is one family.
#[derive(Default)]
struct Sheet {
    gauges: BTreeMap<&'static str, (&'static str, Family<Labels, FloatGauge>)>,
    counters: BTreeMap<&'static str, (&'static str, Family<Labels, Counter<u64>>)>,
}

impl Sheet {
    fn gauge(&mut self, name: &'static str, help: &'static str, labels: Labels, v: f64) {
        let (_, fam) = self
            .gauges
            .entry(name)
            .or_insert_with(|| (help, Family::default()));
        fam.get_or_create(&labels).set(v);
    }

    fn counter(&mut self, name: &'static str, help: &'static str, labels: Labels, v: u64) {
        let (_, fam) = self
            .counters
            .entry(name)
            .or_insert_with(|| (help, Family::default()));
        fam.get_or_create(&labels).inc_by(v);
    }

    fn encode(self) -> String {
        let mut reg = Registry::with_prefix("ironraid");
        for (name, (help, fam)) in self.gauges {
            reg.register(name, help, fam);
        }
        for (name, (help, fam)) in self.counters {
            reg.register(name, help, fam);
        }
        let mut out = String::new();
        encode(&mut out, &reg).expect("writing to a String cannot fail");
        out
    }
}

fn labels(pairs: &[(&str, &str)]) -> Labels {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// The text of one scrape.
pub fn render(array: &Array, source: &Source) -> String {
    let status = array.status();
    let mut d = Detail::from_status(&status, source.addrs.clone());
    d.memory = Some(crate::status::MemoryDetail::from_parts(
        &status.memory,
        &source.server,
    ));
    let mut s = Sheet::default();
    md_series(&mut s, &d);
    sync_series(&mut s, &d);
    feature_series(&mut s, &d);
    member_series(&mut s, &d);
    memory_series(&mut s, &d);
    if let Some(node) = &source.cluster {
        cluster_series(&mut s, &d.name, node);
    }
    let dev = &d.name;
    s.gauge(
        "nbd_connections",
        "NBD client connections open now.",
        labels(&[("device", dev)]),
        source.server.active_connections() as f64,
    );
    s.encode()
}

/// A clustered array's nodes as this node last read them, and whether it may write.
fn cluster_series(s: &mut Sheet, dev: &str, node: &crate::cluster::node::Node) {
    let c = node.detail();
    for state in ["active", "recovering", "gone"] {
        s.gauge(
            "cluster_nodes",
            "Nodes holding a bitmap slot of the array, by the state of their lease.",
            labels(&[("device", dev), ("state", state)]),
            c.nodes.iter().filter(|n| n.state == state).count() as f64,
        );
    }
    s.gauge(
        "cluster_coordinator",
        "1 if this node coordinates the array's background work.",
        labels(&[("device", dev), ("node", &c.node)]),
        f64::from(u8::from(c.coordinator.as_deref() == Some(c.node.as_str()))),
    );
    s.gauge(
        "cluster_fenced",
        "1 if this node refuses client reads and member writes (its lease is not confirmed).",
        labels(&[("device", dev), ("node", &c.node)]),
        f64::from(u8::from(node.fence.refusal().is_some())),
    );
    s.gauge(
        "cluster_owned_extents",
        "Parity levels: extents this node writes alone now.",
        labels(&[("device", dev), ("node", &c.node)]),
        c.owned_extents as f64,
    );
    s.counter(
        "cluster_extent_handoffs_total",
        "Parity levels: extents this node handed to another node that asked.",
        labels(&[("device", dev), ("node", &c.node)]),
        c.extent_handoffs,
    );
}

/// What each bounded pool holds against its limit (`detail --json`'s `memory`).
fn memory_series(s: &mut Sheet, d: &Detail) {
    let Some(m) = &d.memory else { return };
    let dev = d.name.as_str();
    for (pool, h) in [
        ("stripe_cache", &m.stripe_cache),
        ("buffer_pool", &m.buffer_pool),
        ("nbd_payload", &m.nbd_payload),
        ("nbd_buffer_pool", &m.nbd_buffer_pool),
    ] {
        s.gauge(
            "pool_held_bytes",
            "Bytes a bounded pool of the daemon holds now.",
            labels(&[("device", dev), ("pool", pool)]),
            h.held_bytes as f64,
        );
        s.gauge(
            "pool_limit_bytes",
            "The most bytes a bounded pool of the daemon may hold.",
            labels(&[("device", dev), ("pool", pool)]),
            h.limit_bytes as f64,
        );
    }
    s.gauge(
        "resident_bytes",
        "The daemon's resident memory (VmRSS).",
        labels(&[("device", dev)]),
        m.rss_bytes as f64,
    );
}

/// node_exporter's md collector series.
fn md_series(s: &mut Sheet, d: &Detail) {
    let dev = d.name.as_str();
    let current = match d.sync.action.as_str() {
        "recover" => "recovering",
        "resync" => "resync",
        "check" | "repair" => "check",
        _ if d.state == "failed" => "inactive",
        _ => "active",
    };
    for st in ["active", "inactive", "recovering", "resync", "check"] {
        let v = f64::from(u8::from(st == current));
        s.gauge("md_state", "Array state, as node_exporter's md_state (one of active, inactive, recovering, resync, check is 1).", labels(&[("device", dev), ("state", st)]), v);
    }
    let count = |st: &str| d.members.iter().filter(|m| m.state == st).count();
    let in_sync = count("in_sync");
    let down = d.raid_devices.saturating_sub(in_sync);
    for (st, n) in [
        ("active", in_sync),
        ("failed", count("faulty")),
        ("spare", count("spare") + count("rebuilding")),
        ("down", down),
    ] {
        s.gauge("md_disks", "Members by state, as node_exporter's md_disks (down: roles without an in-sync member).", labels(&[("device", dev), ("state", st)]), n as f64);
    }
    s.gauge(
        "md_disks_required",
        "Members the array has roles for (md's raid_disks).",
        labels(&[("device", dev)]),
        d.raid_devices as f64,
    );
    let blocks = (d.size_bytes / 1024) as f64;
    s.gauge(
        "md_blocks",
        "Array size in KiB blocks.",
        labels(&[("device", dev)]),
        blocks,
    );
    let synced = if d.sync.action == "idle" {
        blocks
    } else {
        (d.sync.done_bytes / 1024) as f64
    };
    s.gauge(
        "md_blocks_synced",
        "KiB blocks the running resync, recovery or check has done (md_blocks when none runs).",
        labels(&[("device", dev)]),
        synced,
    );
    s.gauge(
        "array_state",
        "The state detail --json reports (the one labelled is 1).",
        labels(&[("device", dev), ("state", &d.state)]),
        1.0,
    );
    s.gauge(
        "size_bytes",
        "Array size in bytes.",
        labels(&[("device", dev)]),
        d.size_bytes as f64,
    );
    s.gauge(
        "degraded_members",
        "Roles without an in-sync member (faulty, missing or rebuilding).",
        labels(&[("device", dev)]),
        down as f64,
    );
}

fn sync_series(s: &mut Sheet, d: &Detail) {
    let dev = d.name.as_str();
    let y = &d.sync;
    s.gauge(
        "sync_action",
        "The background action running now (md's sync_action; the one labelled is 1).",
        labels(&[("device", dev), ("action", &y.action)]),
        1.0,
    );
    let running = y.action != "idle";
    let progress = if running && y.total_bytes > 0 {
        y.done_bytes as f64 / y.total_bytes as f64
    } else {
        1.0
    };
    s.gauge(
        "sync_progress_ratio",
        "Fraction of the running action done (1 when none runs).",
        labels(&[("device", dev)]),
        progress,
    );
    s.gauge(
        "sync_done_bytes",
        "Bytes the running action has done.",
        labels(&[("device", dev)]),
        y.done_bytes as f64,
    );
    s.gauge(
        "sync_total_bytes",
        "Bytes the running action will do in all.",
        labels(&[("device", dev)]),
        y.total_bytes as f64,
    );
    s.gauge(
        "sync_rate_bytes_per_second",
        "Speed of the running action.",
        labels(&[("device", dev)]),
        y.rate_bytes_per_s as f64,
    );
    let eta = if running && y.rate_bytes_per_s > 0 {
        y.total_bytes.saturating_sub(y.done_bytes) as f64 / y.rate_bytes_per_s as f64
    } else {
        0.0
    };
    s.gauge(
        "sync_eta_seconds",
        "Seconds the running action needs at its present speed (0 when none runs).",
        labels(&[("device", dev)]),
        eta,
    );
    s.gauge("mismatch_count", "md's mismatch_cnt: what the last check or repair found (bytes, in 512-byte sectors as md counts).", labels(&[("device", dev)]), d.mismatch_count as f64);
}

/// Journal, bitmap, used regions and integrity records, where the array has them.
fn feature_series(s: &mut Sheet, d: &Detail) {
    let dev = d.name.as_str();
    if let Some(j) = &d.journal {
        s.gauge(
            "journal_used_bytes",
            "Bytes of the write journal in use (what recovery would replay).",
            labels(&[("device", dev)]),
            j.used_bytes as f64,
        );
        s.gauge(
            "journal_log_bytes",
            "Bytes of the write journal's ring.",
            labels(&[("device", dev)]),
            j.log_bytes as f64,
        );
        let fill = j.used_bytes as f64 / j.log_bytes.max(1) as f64;
        s.gauge(
            "journal_fill_ratio",
            "Fraction of the journal ring in use.",
            labels(&[("device", dev)]),
            fill,
        );
    }
    if let Some(b) = &d.bitmap {
        s.gauge(
            "bitmap_dirty_chunks",
            "Write-intent bitmap chunks set.",
            labels(&[("device", dev)]),
            b.dirty_chunks as f64,
        );
        s.gauge(
            "bitmap_chunks",
            "Write-intent bitmap chunks in all.",
            labels(&[("device", dev)]),
            b.chunks as f64,
        );
    }
    if let Some(u) = &d.used_regions {
        s.gauge(
            "used_bytes",
            "Bytes of each member's data area that may hold data (the used-region map).",
            labels(&[("device", dev)]),
            u.used_bytes as f64,
        );
    }
    if let Some(i) = &d.integrity_detail {
        for (kind, n) in [
            ("data", i.data_mismatches),
            ("p", i.p_mismatches),
            ("q", i.q_mismatches),
        ] {
            s.counter(
                "integrity_errors_found",
                "Blocks whose checksum record disagreed, by what they hold.",
                labels(&[("device", dev), ("kind", kind)]),
                n,
            );
        }
        s.counter(
            "integrity_repaired",
            "Blocks rebuilt from redundancy and rewritten.",
            labels(&[("device", dev)]),
            i.repaired,
        );
        s.counter(
            "integrity_unrecoverable",
            "Blocks redundancy could not vouch for (reads of them failed).",
            labels(&[("device", dev)]),
            i.unrecoverable,
        );
    }
    s.counter(
        "spliced_reads",
        "Client reads sent from the members' page caches to the socket without a copy.",
        labels(&[("device", dev)]),
        d.spliced_reads,
    );
}

fn member_series(s: &mut Sheet, d: &Detail) {
    let dev = d.name.as_str();
    for m in &d.members {
        let l = labels(&[("device", dev), ("member", &m.path)]);
        s.gauge(
            "member_state",
            "A member's state (the one labelled is 1).",
            labels(&[("device", dev), ("member", &m.path), ("state", &m.state)]),
            1.0,
        );
        s.counter(
            "member_read_errors",
            "Blocks found unreadable on the member this run.",
            l.clone(),
            m.read_errors,
        );
        s.counter(
            "member_read_errors_corrected",
            "Of those, blocks rebuilt from redundancy and rewritten.",
            l.clone(),
            m.read_errors_corrected,
        );
        s.gauge(
            "member_bad_sectors",
            "Sectors in the member's bad-block log.",
            l.clone(),
            m.bad_sectors as f64,
        );
        s.counter(
            "member_checksum_errors",
            "Reads whose blocks failed their integrity records (zpool's CKSUM).",
            l.clone(),
            m.checksum_errors,
        );
        let Some(c) = iostats::of(&m.path) else {
            continue;
        };
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        for (op, ios, bytes, errors) in [
            ("read", &c.reads, &c.read_bytes, &c.read_errors),
            ("write", &c.writes, &c.write_bytes, &c.write_errors),
        ] {
            let lo = labels(&[("device", dev), ("member", &m.path), ("op", op)]);
            s.counter(
                "member_ios",
                "Requests sent to the member.",
                lo.clone(),
                get(ios),
            );
            s.counter(
                "member_bytes",
                "Bytes moved by the member's successful requests.",
                lo.clone(),
                get(bytes),
            );
            s.counter(
                "member_io_errors",
                "Requests the member failed.",
                lo,
                get(errors),
            );
        }
    }
}
