//! `ironraid run`: assemble an array and serve it over NBD until told to stop.
//!
//! Life cycle: open and lock every member (flock, so a second daemon on the same members is
//! refused), assemble, bind the control socket and the NBD listeners, serve. SIGINT, SIGTERM or
//! a `stop` request start the clean stop: the NBD server stops accepting and drains in-flight
//! requests, the array is flushed and marked clean in every superblock, sockets are removed, and
//! the process exits 0. A daemon killed any other way leaves the superblocks saying "active",
//! which the next `run` reports.

use crate::backend::ArrayBackend;
use crate::cluster::ClusterArgs;
use crate::endpoint::{self, Listen, SocketAccess};
use crate::member::Opener;
use crate::rundir;
use crate::server::{control_loop, Ctx};
use anyhow::{anyhow, bail, Context};
use device::{OpenMode, RemoteOptions};
use engine::{Array, ArrayConfig, AssembleOptions};
use std::os::unix::net::UnixStream as StdUnixStream;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::{TcpListener, UnixListener};
use tokio::sync::watch;

/// The smallest `--stripe-cache`: the engine raises a smaller budget to this anyway, and a
/// silent change of what was asked for is worse than a refusal.
const MIN_STRIPE_CACHE: usize = 1 << 20;

pub struct RunArgs {
    pub name: Option<String>,
    /// Endpoints served besides RUNDIR/NAME.nbd.
    pub nbd: Vec<String>,
    /// The NBD export name (default: the array's name).
    pub export_name: Option<String>,
    /// Who may open the NBD Unix sockets.
    pub socket_access: SocketAccess,
    /// STARTTLS on the TCP endpoints.
    pub tls: Option<nbd::TlsConfig>,
    pub members: Vec<PathBuf>,
    pub read_only: bool,
    pub buffered: bool,
    pub write_hold: Duration,
    pub stream_hold: Duration,
    /// md's `sync_speed_min`/`sync_speed_max` in bytes per second (None: md's defaults).
    pub speed_min: Option<u64>,
    pub speed_max: Option<u64>,
    /// Per-member bytes of a background window (None: the engine's default).
    pub sync_window: Option<u64>,
    /// Start what md would refuse to start (see `engine::AssembleOptions::force`).
    pub force: bool,
    /// Start degraded when members the superblocks record as working were not given (md's
    /// `--run`).
    pub run_degraded: bool,
    /// A new journal for an array whose journal is lost.
    pub add_journal: Option<PathBuf>,
    /// Run without the lost journal from now on.
    pub drop_journal: bool,
    /// The guide to run at start when a `guided` array awaits one.
    pub guide: Option<String>,
    pub assume_data_journal: bool,
    pub guide_timeout: Duration,
    /// Integrity records kept in memory at most.
    pub integrity_cache_bytes: usize,
    /// Client data held in the stripe cache at most.
    pub stripe_cache_bytes: usize,
    /// Timeouts and retries of NBD members (`read_only` is taken from `read_only` above).
    pub remote: RemoteOptions,
    /// Where to serve Prometheus metrics (`tcp:HOST:PORT` or `unix:PATH`).
    pub metrics: Option<String>,
    /// Mirrors read every block from its first usable copy (`--read-policy primary`).
    pub read_primary: bool,
    /// Join the array's cluster as a node.
    pub cluster: Option<ClusterArgs>,
}

impl RunArgs {
    fn opener(&self) -> Opener {
        let mode = if self.read_only {
            OpenMode::ReadOnly
        } else if self.buffered {
            OpenMode::Buffered
        } else {
            OpenMode::ReadWrite
        };
        Opener {
            mode,
            remote: self.remote.clone(),
            counted: true,
            shared: self.cluster.is_some(),
        }
    }
}

/// Exit status of a cluster node whose lease is gone (EX_TEMPFAIL): run it again to rejoin
/// (`ironraid@.service` restarts it).
pub const EXIT_FENCED: i32 = 75;

/// A panic anywhere in the daemon stops it at once (fail-stop, as md's BUG_ON stops the
/// kernel). A panic is a broken invariant: the thread that hit it unwinds, but the array's
/// shared state (a stripe mid-batch, a journal unit never marked logged, a row left claimed)
/// stays as it was left, and the other threads would go on serving from it, or wait forever
/// for what the dead thread was to do. What is durable is crash-consistent by design (bitmap,
/// journal, superblocks), so the next start recovers from it; the message and location are
/// printed first.
fn stop_on_panic() {
    let report = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        report(info);
        tracing::error!(
            "a daemon thread panicked (a broken invariant): stopping the daemon at once"
        );
        std::process::abort();
    }));
}

pub fn run(args: RunArgs) -> anyhow::Result<()> {
    stop_on_panic();
    let parsed: Vec<(Listen, Option<String>)> = args
        .nbd
        .iter()
        .map(|a| endpoint::parse(a))
        .collect::<anyhow::Result<_>>()?;
    if let Some(w) = args.sync_window.filter(|w| *w == 0 || w % 4096 != 0) {
        bail!("--sync-window {w}: must be a non-zero multiple of 4 KiB");
    }
    if args.stripe_cache_bytes < MIN_STRIPE_CACHE {
        bail!(
            "--stripe-cache {}: must be at least 1M",
            args.stripe_cache_bytes
        );
    }
    let opener = args.opener();
    let devs = opener.open_all(&args.members)?;
    let add_journal = opener.open_all(args.add_journal.as_slice())?.pop();
    let node = crate::cluster::join(&devs, args.cluster.as_ref())?;
    let config = ArrayConfig {
        read_only: args.read_only,
        write_hold: args.write_hold,
        stream_hold: args.stream_hold,
        guide_timeout: args.guide_timeout,
        integrity_cache_bytes: args.integrity_cache_bytes,
        stripe_cache_bytes: args.stripe_cache_bytes,
        coordinator: node.as_ref().map(|n| crate::cluster::coordinator(n)),
        read_primary: args.read_primary,
        sync_window_bytes: args
            .sync_window
            .unwrap_or(ArrayConfig::default().sync_window_bytes),
        ..ArrayConfig::default()
    };
    let array = engine::assemble(
        devs,
        AssembleOptions {
            name: args.name.clone(),
            config,
            force: args.force,
            refuse_unfailed_missing: !args.run_degraded,
            drop_journal: args.drop_journal,
            add_journal,
        },
    )
    .map_err(|e| anyhow!("{e}"))?;
    let array = Arc::new(array);
    if let Some(n) = &node {
        n.set_opener(opener.clone());
        let name = n.name.clone();
        n.on_lease_lost(move || {
            // Fenced for good: the other nodes take this node's slot and extents over. It
            // comes back as a new node (a new epoch) by starting again, which its unit does.
            tracing::error!(node = %name, "cluster lease lost: exiting to rejoin as a new epoch (exit {EXIT_FENCED})");
            std::process::exit(EXIT_FENCED);
        });
        n.attach(&array);
    }
    array.set_sync_speed(args.speed_min, args.speed_max);
    array.start_background();
    let name = array.name().to_string();
    if name.is_empty() || name.contains('/') {
        bail!("array name '{name}' cannot name a socket; pass --name");
    }
    if array.was_dirty_at_assembly() && array.never_run_before() {
        tracing::info!(array = %name, "new array: initial sync (regions never written are skipped)");
    } else if array.was_dirty_at_assembly() {
        tracing::warn!(array = %name, "array was not stopped cleanly (superblocks say active); its redundancy may be inconsistent where writes were in flight");
    }
    guide_at_start(&array, &args);
    if args.guide.as_deref() == Some("ext4") && array.status().guidance.is_some() {
        crate::watch::install(&array)?;
    }
    let g = array.geometry();
    tracing::info!(
        array = %name,
        level = g.level().name(),
        members = g.raid_disks(),
        size_bytes = array.size_bytes(),
        parity = parity::backend_name(),
        "assembled"
    );
    let dir = rundir::rundir();
    std::fs::create_dir_all(&dir)
        .with_context(|| format!("cannot create runtime directory {}", dir.display()))?;
    let ctl_path = rundir::control_socket(&name);
    claim_socket_path(&ctl_path, &name)?;
    let export = args.export_name.clone().unwrap_or_else(|| name.clone());
    // The default socket stays whatever else is served (scripts and `demo` rely on it).
    let mut listens = vec![Listen::Unix(rundir::nbd_socket(&name))];
    for (l, named) in parsed {
        if let Some(n) = named.filter(|n| *n != export) {
            bail!("--nbd: the URI names export '{n}', but the array is served as '{export}' (see --export-name)");
        }
        if !listens.contains(&l) {
            listens.push(l);
        }
    }
    if args.tls.is_some() && !listens.iter().any(|l| matches!(l, Listen::Tcp(_))) {
        tracing::warn!(
            "--tls-cert given but no TCP endpoint (--nbd nbd://HOST): TLS applies to TCP only"
        );
    }
    let rt = runtime()?;
    let res = rt.block_on(serve(
        array.clone(),
        Names {
            array: name.clone(),
            export,
        },
        ctl_path.clone(),
        listens,
        Serving {
            opener,
            metrics: args.metrics.clone(),
            access: &args.socket_access,
            tls: args.tls,
            cluster: node.clone(),
        },
    ));
    let closed = res.and_then(|()| {
        tracing::info!(array = %name, "flushing and marking clean");
        array.close().map_err(|e| anyhow!("{e}"))
    });
    let _ = std::fs::remove_file(&ctl_path);
    closed?;
    if let Some(n) = &node {
        n.leave();
    }
    tracing::info!(array = %name, "stopped cleanly");
    Ok(())
}

/// A `guided` array awaiting a guide, with `--guide`: run it before anything is served (the
/// file system above replays its journal at mount, after which the journal no longer says
/// what was in flight). A refusal falls back to the bitmap resync; serving goes on.
fn guide_at_start(array: &Array, args: &RunArgs) {
    let awaiting = array
        .status()
        .guidance
        .is_some_and(|g| g.state == "awaiting");
    match (&args.guide, awaiting) {
        (Some(kind), true) => {
            if let Err(e) = crate::guide::run(array, kind, &[], args.assume_data_journal) {
                tracing::warn!(array = %array.name(), "guide {kind}: {e:#}");
            }
        }
        (None, true) => tracing::warn!(
            array = %array.name(),
            timeout_s = args.guide_timeout.as_secs(),
            "guided array awaits a guide (`ironraid guide NAME ext4|ranges|fallback`) before it \
             resyncs; reads verify their stripes first meanwhile"
        ),
        _ => {}
    }
}

fn runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .max_blocking_threads(512)
        .enable_all()
        .thread_name("ironraid")
        .build()
}

/// Refuse to start when a live daemon owns the socket path; remove a stale one.
fn claim_socket_path(path: &Path, name: &str) -> anyhow::Result<()> {
    if path.exists() {
        if StdUnixStream::connect(path).is_ok() {
            bail!(
                "array '{name}' is already running (control socket {} answers)",
                path.display()
            );
        }
        std::fs::remove_file(path)
            .with_context(|| format!("removing stale socket {}", path.display()))?;
    }
    Ok(())
}

/// What serving needs beside the array: how `add` opens members, where metrics go, the
/// sockets' owner and mode, TLS.
struct Serving<'a> {
    opener: Opener,
    metrics: Option<String>,
    access: &'a SocketAccess,
    tls: Option<nbd::TlsConfig>,
    /// This node's membership (for `detail`), if the array is clustered.
    cluster: Option<Arc<crate::cluster::node::Node>>,
}

/// The array's name (its sockets) and the NBD export name clients ask for.
struct Names {
    array: String,
    export: String,
}

async fn serve(
    array: Arc<Array>,
    names: Names,
    ctl_path: PathBuf,
    listens: Vec<Listen>,
    serving: Serving<'_>,
) -> anyhow::Result<()> {
    let Names {
        array: name,
        export,
    } = names;
    let Serving {
        opener,
        metrics,
        access,
        tls,
        cluster,
    } = serving;
    let backend = Arc::new(ArrayBackend(array.clone()));
    let tls_required = tls.as_ref().is_some_and(|t| t.required());
    let tls_offered = tls.is_some();
    let server = nbd::Server::with_tls(
        vec![nbd::Export {
            name: export.clone(),
            description: format!("ironraid array {name}"),
            backend,
        }],
        nbd::Limits::default(),
        tls,
    );
    let mut tasks = tokio::task::JoinSet::new();
    let mut addrs = Vec::new();
    let mut unix_paths = Vec::new();
    let mut uris = Vec::new();
    for l in listens {
        match l {
            Listen::Unix(p) => {
                claim_socket_path(&p, &name)?;
                let listener = UnixListener::bind(&p)
                    .with_context(|| format!("cannot listen on {}", p.display()))?;
                access.apply(&p)?;
                addrs.push(format!("unix:{}", p.display()));
                tracing::info!(socket = %p.display(), "serving NBD");
                uris.push(endpoint::uri_unix(&p, &export));
                unix_paths.push(p);
                tasks.spawn(server.clone().serve_unix(listener));
            }
            Listen::Tcp(hp) => {
                let listener = TcpListener::bind(&hp)
                    .await
                    .with_context(|| format!("cannot listen on tcp:{hp}"))?;
                let local = listener.local_addr()?;
                addrs.push(format!("tcp:{local}"));
                tracing::info!(address = %local, "serving NBD over TCP");
                endpoint::warn_if_exposed(local, tls_required);
                uris.push(endpoint::uri_tcp(local, &export, tls_offered));
                tasks.spawn(server.clone().serve_tcp(listener));
            }
        }
    }
    // As nbdkit's --print-uri: what to give a client, one line per endpoint.
    for u in &uris {
        println!("{u}");
    }
    use std::io::Write;
    let _ = std::io::stdout().flush();
    let metrics_task = match metrics {
        Some(addr) => {
            let listener = crate::metrics::bind(&addr).await?;
            if let crate::metrics::Listener::Unix(_, p) = &listener {
                unix_paths.push(p.clone());
            }
            let source = crate::metrics::Source {
                array: array.clone(),
                server: server.clone(),
                addrs: addrs.clone(),
                cluster: cluster.clone(),
            };
            Some(tokio::spawn(crate::metrics::serve(listener, source)))
        }
        None => None,
    };
    let (ctl_task, mut stop_rx) = start_control(
        &ctl_path,
        array,
        addrs.clone(),
        opener,
        server.clone(),
        cluster,
    )?;
    // Everything is bound and answering: NBD, metrics, the control socket.
    crate::systemd::notify(&format!(
        "READY=1\nSTATUS=serving array {name} on {}",
        addrs.join(" ")
    ));
    let mut sigterm = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT: stopping"),
        _ = sigterm.recv() => tracing::info!("SIGTERM: stopping"),
        _ = stop_rx.changed() => tracing::info!("stop requested"),
    }
    crate::systemd::notify("STOPPING=1");
    server.shutdown();
    while let Some(r) = tasks.join_next().await {
        if let Ok(Err(e)) = r {
            tracing::warn!("NBD listener ended with: {e}");
        }
    }
    ctl_task.abort();
    if let Some(t) = metrics_task {
        t.abort();
    }
    for p in unix_paths {
        let _ = std::fs::remove_file(p);
    }
    Ok(())
}

/// Bind the control socket and serve it; the receiver changes when `stop` is requested.
fn start_control(
    ctl_path: &Path,
    array: Arc<Array>,
    addrs: Vec<String>,
    opener: Opener,
    nbd: Arc<nbd::Server>,
    cluster: Option<Arc<crate::cluster::node::Node>>,
) -> anyhow::Result<(tokio::task::JoinHandle<()>, watch::Receiver<bool>)> {
    let ctl = UnixListener::bind(ctl_path)
        .with_context(|| format!("cannot listen on {}", ctl_path.display()))?;
    set_mode_0600(ctl_path)?;
    let (stop, stop_rx) = watch::channel(false);
    let ctx = Arc::new(Ctx {
        array,
        addrs,
        stop,
        opener,
        nbd,
        cluster,
    });
    Ok((tokio::spawn(control_loop(ctl, ctx)), stop_rx))
}

fn set_mode_0600(path: &Path) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        .with_context(|| format!("chmod 0600 {}", path.display()))
}

/// Wait until process `pid` (a daemon told to stop) has exited.
pub fn wait_exit(pid: u32, timeout: Duration) -> bool {
    let deadline = std::time::Instant::now() + timeout;
    while std::time::Instant::now() < deadline {
        // Gone, or a zombie waiting for its parent to reap it.
        match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
            Err(_) => return true,
            Ok(stat)
                if stat
                    .rsplit(')')
                    .next()
                    .is_some_and(|rest| rest.trim_start().starts_with('Z')) =>
            {
                return true
            }
            Ok(_) => {}
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}
