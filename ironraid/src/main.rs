//! `ironraid`: user-space software RAID with Linux md's on-disk format, served over NBD.
//! The command contract is `shared/INTERFACE.md`.

mod action;
mod backend;
mod cluster;
mod config;
mod control;
mod daemon;
mod endpoint;
mod examine;
mod generate;
mod guide;
mod iostats;
mod manage;
mod member;
mod metrics;
mod monitor;
mod monitor_scan;
mod overview;
mod results;
mod rundir;
mod scan;
mod server;
mod size;
mod space;
mod status;
mod systemd;
mod verify;
mod watch;

use anyhow::{anyhow, bail, Context};
use clap::{ArgAction, Parser, Subcommand};
use control::{expect_ok, fetch_detail};
use device::{Device, OpenMode, RemoteOptions};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

#[derive(Parser)]
#[command(
    name = "ironraid",
    version,
    about = "Software RAID in user space: Linux md's on-disk format, served over NBD"
)]
struct Cli {
    /// More log output (-v debug, -vv trace).
    #[arg(short, long, action = ArgAction::Count, global = true)]
    verbose: u8,
    #[command(subcommand)]
    cmd: Cmd,
}

// One value per process, parsed once: the size of its largest variant costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
enum Cmd {
    /// Write md v1.2 superblocks onto members, making a new array; prints its UUID.
    Create(CreateArgs),
    /// Convert a stopped clustered array back to one host's: every node slot's dirty bits
    /// gathered into one internal bitmap (resynced at the next start), the superblocks'
    /// clustered feature off (as `mdadm --grow --bitmap=internal` after `--bitmap=none`).
    /// With --cluster, refused while any node's lease lives, and the array's etcd record is
    /// removed after.
    LeaveCluster {
        /// etcd client URLs, comma-separated.
        #[arg(long)]
        cluster: Option<String>,
        #[command(flatten)]
        etcd_tls: cluster::EtcdTlsArgs,
        #[arg(required = true)]
        members: Vec<PathBuf>,
    },
    /// Read and print members' superblocks, like `mdadm --examine`.
    Examine {
        /// Print the write-intent bitmap instead, like `mdadm --examine-bitmap`.
        #[arg(long)]
        bitmap: bool,
        #[arg(long)]
        json: bool,
        /// One ARRAY line per array found on MEMBERS (default: the config's DEVICE globs),
        /// from the superblocks alone, like `mdadm --examine --scan`.
        #[arg(long, conflicts_with_all = ["bitmap", "json"])]
        scan: bool,
        /// Config file of --scan (default $IRONRAID_CONFIG, else /etc/ironraid/ironraid.conf).
        #[arg(long, requires = "scan")]
        config: Option<PathBuf>,
        #[arg(required_unless_present = "scan")]
        members: Vec<PathBuf>,
    },
    /// Assemble an array from its members and serve it over NBD, in the foreground.
    Run {
        /// Name to serve under (default: the name in the superblocks).
        #[arg(long)]
        name: Option<String>,
        /// Also serve NBD here (repeatable): unix:PATH, tcp:HOST:PORT, nbd://HOST[:PORT]
        /// (port 10809 by default) or nbd+unix:///?socket=PATH. RUNDIR/NAME.nbd is always served.
        #[arg(long = "nbd")]
        nbd: Vec<String>,
        /// The NBD export name clients ask for (default: the array's name).
        #[arg(long)]
        export_name: Option<String>,
        /// Mode of the NBD Unix sockets, octal (0660 lets a group, such as qemu's, connect).
        #[arg(long, default_value = "0600")]
        socket_mode: String,
        /// Owner of the NBD Unix sockets: USER[:GROUP] or :GROUP, by name or number.
        #[arg(long, value_name = "USER[:GROUP]")]
        socket_owner: Option<String>,
        /// TLS certificate (PEM) for NBD over TCP (NBD_OPT_STARTTLS; Unix sockets stay plain).
        #[arg(long, value_name = "FILE", requires = "tls_key")]
        tls_cert: Option<PathBuf>,
        /// The certificate's private key (PEM).
        #[arg(long, value_name = "FILE", requires = "tls_cert")]
        tls_key: Option<PathBuf>,
        /// Require client certificates signed by this CA (PEM).
        #[arg(long, value_name = "FILE", requires = "tls_cert")]
        tls_ca: Option<PathBuf>,
        /// require (the default with a certificate: plain TCP clients are refused) or on
        /// (offered, plain clients served too).
        #[arg(long, value_parser = ["require", "on"], requires = "tls_cert")]
        tls: Option<String>,
        /// Refuse writes.
        #[arg(long)]
        read_only: bool,
        /// Do not use O_DIRECT on members.
        #[arg(long)]
        no_direct: bool,
        /// Upper bound, in microseconds, on how long a partial stripe waits for writers still
        /// placing pieces into it (no timer otherwise: it is written as soon as they have; 0:
        /// never waits).
        #[arg(long, default_value_t = 2000)]
        write_hold_us: u64,
        /// The same bound for a stripe that already holds a whole chunk (a sequential stream's
        /// writes: waiting for the rest spares reading it). 0: never waits.
        #[arg(long, default_value_t = 50_000)]
        stream_hold_us: u64,
        /// Client data held in stripes at most, waiting to be written with its parity (md's
        /// stripe_cache_size; a write-back journal keeps up to half of it cached, and free
        /// stripe buffers are kept up to as much again). At least 1M.
        #[arg(long, value_parser = size_arg, default_value = "64M")]
        stripe_cache: u64,
        /// Rebuild/resync/check rate kept even while clients do I/O, per second (default 1000K).
        #[arg(long, value_parser = size_arg)]
        speed_min: Option<u64>,
        /// Rebuild/resync/check rate never exceeded, per second (default 200000K).
        #[arg(long, value_parser = size_arg)]
        speed_max: Option<u64>,
        /// Bytes of each member one background window (rebuild, resync, check/repair) covers,
        /// on every level in whole stripes, RAID1 MiBs or RAID10 chunks (RAID10's resync and
        /// check: bytes of the array): the extent a cluster locks on every node at a time
        /// (default 2M).
        #[arg(long, value_parser = size_arg)]
        sync_window: Option<u64>,
        /// Start what md would refuse to start, saying what it risks: a dirty, degraded
        /// RAID4/5/6 (the write hole), or too few current members (stale or faulty-recorded
        /// members are taken back, freshest first, like `mdadm --assemble --force`).
        #[arg(long)]
        force: bool,
        /// Start degraded although members the superblocks record as working were not given
        /// (md's --run; without it such a start is refused and nothing is written).
        #[arg(long = "run")]
        run_degraded: bool,
        /// The array's journal device is lost: make DEV its new, empty journal (the whole
        /// array is resynced, since what the old log held is gone).
        #[arg(long, value_name = "DEV", conflicts_with = "drop_journal")]
        add_journal: Option<PathBuf>,
        /// The array's journal device is lost: run without a journal from now on
        /// (`--consistency-policy resync`; the whole array is resynced).
        #[arg(long)]
        drop_journal: bool,
        /// A `guided` array that stopped uncleanly: run this guide at start, before NBD is
        /// served (ext4: the file system's journal on the array says what was in flight).
        #[arg(long, value_parser = ["ext4"])]
        guide: Option<String>,
        /// ext4 guide: take your word that the file system runs with data=journal.
        #[arg(long, requires = "guide")]
        assume_data_journal: bool,
        /// Seconds a `guided` array waits for a guide after an unclean stop before it falls
        /// back to the bitmap resync.
        #[arg(long, default_value_t = 120)]
        guide_timeout: u64,
        /// Integrity records kept in memory at most (the rest is read from the tables when
        /// needed): 4 bytes per 4 KiB of each member; the default covers about 64 GiB of
        /// members.
        #[arg(long, value_parser = size_arg, default_value = "64M")]
        integrity_cache: u64,
        /// NBD members: a request on which the server makes no progress for this long is
        /// retried on a fresh connection (5s, 500ms, 1m).
        #[arg(long, value_parser = member::parse_duration, default_value = "5s")]
        member_timeout: Duration,
        /// NBD members: how long a failing request is retried on fresh connections (every
        /// unflushed write re-sent first) before the member is failed like a disk.
        #[arg(long, value_parser = member::parse_duration, default_value = "10s")]
        member_retry: Duration,
        /// NBD members over TLS (nbds://): the CA (PEM) their certificates must chain to, when
        /// the URI names no tls-certificates=DIR (default: the system's CA bundle).
        #[arg(long, value_name = "FILE")]
        member_tls_ca: Option<PathBuf>,
        /// Serve Prometheus metrics at /metrics: tcp:HOST:PORT or unix:PATH.
        #[arg(long, value_name = "ADDR")]
        metrics: Option<String>,
        /// Mirrors (RAID1, RAID10): `balanced` spreads reads over the copies; `primary` reads
        /// every block from its first usable copy, so that every node of a cluster reads the
        /// same copy (the Distributed MD paper's two modes).
        #[arg(long, default_value = "balanced", value_parser = ["balanced", "primary"])]
        read_policy: String,
        /// Join the array's cluster (etcd client URLs, comma-separated) as --node: the array
        /// must have been created for a cluster (`create --cluster ... --nodes N`).
        #[arg(
            long,
            value_name = "ENDPOINTS",
            requires = "node",
            conflicts_with = "scan"
        )]
        cluster: Option<String>,
        /// This node's name in the cluster (one daemon per name at a time).
        #[arg(long, requires = "cluster")]
        node: Option<String>,
        /// How long the others wait after this node's last lease renewal before counting it
        /// gone (it stops writing before then on its own if it cannot renew).
        #[arg(long, value_parser = member::parse_duration, default_value = "10s", requires = "cluster")]
        lease_ttl: Duration,
        #[command(flatten)]
        etcd_tls: cluster::EtcdTlsArgs,
        /// Assemble every ARRAY of the config from the devices its DEVICE globs allow, each as
        /// a daemon of its own, like `mdadm --assemble --scan`.
        #[arg(long, conflicts_with_all = ["members", "name"])]
        scan: bool,
        /// Config file of --scan (default $IRONRAID_CONFIG, else /etc/ironraid/ironraid.conf).
        #[arg(long, requires = "scan")]
        config: Option<PathBuf>,
        /// With --scan: only this ARRAY (name or UUID), served here in the foreground.
        #[arg(long, requires = "scan")]
        array: Option<String>,
        /// Files, block devices or NBD URIs (nbd://HOST[:PORT]/EXPORT,
        /// nbd+unix:///EXPORT?socket=PATH).
        #[arg(required_unless_present = "scan")]
        members: Vec<PathBuf>,
    },
    /// Every array, mdstat-like, running or with its daemon gone; exit 1 unless all are
    /// healthy (none degraded, failed, failing writes or gone).
    Status {
        #[arg(long)]
        json: bool,
    },
    /// One running array.
    Detail {
        #[arg(required_unless_present = "scan")]
        name: Option<String>,
        #[arg(long)]
        json: bool,
        /// One ARRAY line per running array, for the config file.
        #[arg(long, conflicts_with_all = ["name", "json"])]
        scan: bool,
    },
    /// Mark a member of a running array faulty (a spare, if any, starts rebuilding).
    Fail {
        name: String,
        member: PathBuf,
        /// Fail it even if the array does not survive that (clients then get I/O errors).
        #[arg(long)]
        force: bool,
    },
    /// Remove a faulty member or a spare from a running array.
    Remove { name: String, member: PathBuf },
    /// Add a member to a running array as a spare; it rebuilds at once if a role is missing.
    Add {
        name: String,
        member: PathBuf,
        /// Overwrite a superblock of another array on MEMBER.
        #[arg(long)]
        force: bool,
    },
    /// Background work, as md's sync_action: check, repair, resync, idle or frozen.
    Action {
        name: String,
        #[arg(value_parser = ["check", "repair", "resync", "idle", "frozen"])]
        action: String,
        /// Wait until the action has finished, showing progress on stderr.
        #[arg(long)]
        wait: bool,
    },
    /// Verify reads: read the 4 KiB page rows under a byte range of a running array, compare
    /// redundancy with the data, rewrite it from the data where it disagrees, report.
    Verify {
        name: String,
        /// Array byte offset (K, M, G suffixes; a multiple of 512).
        #[arg(value_parser = size_arg, requires = "length")]
        offset: Option<u64>,
        /// Bytes from OFFSET (a multiple of 512).
        #[arg(value_parser = size_arg)]
        length: Option<u64>,
        /// More ranges, one 'OFFSET LENGTH' per line ('-': standard input).
        #[arg(long, value_name = "FILE", required_unless_present = "offset")]
        ranges: Option<PathBuf>,
        #[arg(long)]
        json: bool,
    },
    /// Guide a `guided` array that stopped uncleanly: `ext4` reads the ext4 journal on the
    /// array and verifies what it says was in flight; `ranges` verifies the ranges given;
    /// `fallback` gives up guidance (the bitmap resync runs). Ends the wait for a guide.
    Guide {
        name: String,
        #[arg(value_parser = ["ext4", "ranges", "fallback"])]
        kind: String,
        /// The ranges of `ranges`, one 'OFFSET LENGTH' per line ('-': standard input).
        #[arg(long, value_name = "FILE", required_if_eq("kind", "ranges"))]
        ranges: Option<PathBuf>,
        /// ext4: take your word that the file system runs with data=journal even if its
        /// superblock does not declare it (guidance is only sound in that mode).
        #[arg(long)]
        assume_data_journal: bool,
        #[arg(long)]
        json: bool,
    },
    /// Print a running array's events as JSON lines until it stops; with --scan, every
    /// array's, arrays started later included.
    Monitor {
        #[arg(required_unless_present = "scan")]
        name: Option<String>,
        /// Run PROG EVENT ARRAY [MEMBER] per event, the event's JSON in $IRONRAID_EVENT.
        #[arg(long)]
        program: Option<PathBuf>,
        #[command(flatten)]
        scan: monitor_scan::ScanArgs,
    },
    /// Show or set the rebuild/resync/check rate limits (md's sync_speed_min/max).
    Speed {
        name: String,
        /// Rate kept even while clients do I/O, per second (K, M, G suffixes).
        #[arg(long, value_parser = size_arg)]
        min: Option<u64>,
        /// Rate never exceeded, per second (K, M, G suffixes).
        #[arg(long, value_parser = size_arg)]
        max: Option<u64>,
    },
    /// Show or switch the journal's mode of a running array (md's journal_mode); the mode is
    /// recorded on the journal device and kept across restarts.
    JournalMode {
        name: String,
        #[arg(value_parser = ["write-through", "write-back"])]
        mode: Option<String>,
    },
    /// Stop a running array cleanly: drain, flush, mark clean, exit (refused while NBD clients
    /// are connected).
    Stop {
        name: String,
        /// Stop although NBD clients are connected (the array is flushed first).
        #[arg(long)]
        force: bool,
    },
    /// Create a 4-member RAID5 over sparse files in DIR and serve it.
    Demo { dir: Option<PathBuf> },
    /// Write the man pages and shell completions into DIR (for packaging).
    #[command(hide = true)]
    Generate { dir: PathBuf },
}

#[derive(clap::Args)]
struct CreateArgs {
    /// linear, 0, 1, 4, 5, 6, 10 (raid0 … raid10 also accepted).
    #[arg(long)]
    level: String,
    /// Chunk size (K, M, G suffixes).
    #[arg(long, default_value = "512K")]
    chunk: String,
    /// RAID5/6 and RAID10 layout (default left-symmetric / n2).
    #[arg(long)]
    layout: Option<String>,
    /// Array name stored in the superblocks (default: "ironraid").
    #[arg(long)]
    name: Option<String>,
    /// resync, bitmap, journal (needs --journal) or guided (the bitmap, and after an unclean
    /// stop the resync waits for a guide such as `guide NAME ext4`; RAID1/4/5/6/10). With
    /// --nodes the default is bitmap (as mdadm's --bitmap=clustered).
    #[arg(
        long,
        default_value = "resync",
        default_value_if("nodes", clap::builder::ArgPredicate::IsPresent, Some("bitmap")),
        value_parser = ["resync", "bitmap", "journal", "guided"]
    )]
    consistency_policy: String,
    /// Bytes each write-intent bit covers (with --consistency-policy bitmap or guided; default:
    /// md's, at least 64M).
    #[arg(long)]
    bitmap_chunk: Option<String>,
    /// md-cluster's format: N node slots in the write-intent bitmap (bitmap version 5, the
    /// superblock's clustered feature), one per node that may run the array. Needs
    /// --consistency-policy bitmap or guided. md's kernel runs clustered RAID1/10 only.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=format::MAX_CLUSTER_NODES as i64))]
    nodes: Option<u32>,
    /// The cluster name stored in the bitmap (with --nodes; at most 63 bytes; default
    /// "ironraid").
    #[arg(long, value_name = "NAME", requires = "nodes")]
    cluster_name: Option<String>,
    /// Register the clustered array in etcd (client URLs, comma-separated) for its nodes'
    /// `run --cluster`; needs --nodes.
    #[arg(long, value_name = "ENDPOINTS", requires = "nodes")]
    cluster: Option<String>,
    #[command(flatten)]
    etcd_tls: cluster::EtcdTlsArgs,
    /// The log device of --consistency-policy journal (md's raid5-cache write journal).
    #[arg(long, value_name = "DEV")]
    journal: Option<PathBuf>,
    /// write-through (the default) or write-back: acknowledge writes once their data is in the
    /// log, write stripes home later (switchable at run time with `journal-mode`).
    #[arg(long, value_parser = ["write-through", "write-back"])]
    journal_mode: Option<String>,
    /// Keep a CRC32C record of every 4 KiB member block on two other members (RAID6: three;
    /// a 2-way mirror: the other one), verify every read and repair from redundancy
    /// (RAID1/4/5/6/10; not linear or RAID0; md refuses such an array).
    /// The members' data areas are discarded first.
    #[arg(long, value_parser = ["crc32c"], value_name = "crc32c")]
    integrity: Option<String>,
    /// Hot spare (repeatable).
    #[arg(long = "spare")]
    spares: Vec<PathBuf>,
    /// Bytes of each member to use (default: all of the smallest).
    #[arg(long)]
    size: Option<String>,
    /// Skip the initial sync (members known to be consistent, e.g. all zero).
    #[arg(long)]
    assume_clean: bool,
    /// Overwrite members that already carry an md superblock.
    #[arg(long)]
    force: bool,
    /// Allocate member files in full now, so a full file system cannot fail a running array.
    #[arg(long)]
    preallocate: bool,
    #[arg(required = true)]
    members: Vec<PathBuf>,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging(cli.verbose);
    raise_open_file_limit();
    limit_malloc_arenas();
    match dispatch(cli.cmd) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ironraid: {e:#}");
            ExitCode::from(1)
        }
    }
}

/// glibc gives each thread that allocates under contention an arena of its own (up to 8 per
/// core) and keeps their freed memory: with a request thread per NBD connection that is what
/// grew the daemon's RSS with the client count (issue 24 item 5: 259 MiB peak at 128 writers
/// on RAID5, 222 MiB with 2 arenas; payload buffers are pooled, so few allocations remain on
/// the data path to contend). `MALLOC_ARENA_MAX` in the environment still decides.
fn limit_malloc_arenas() {
    #[cfg(target_env = "gnu")]
    if std::env::var_os("MALLOC_ARENA_MAX").is_none() {
        // SAFETY: mallopt only sets a tunable of the allocator; called before any thread
        // but this one exists.
        unsafe {
            libc::mallopt(libc::M_ARENA_MAX, 2);
        }
    }
}

/// Members, NBD connections and listeners are file descriptors: an array as wide as md allows
/// (1,920 members) needs more than the usual soft limit of 1,024. The soft limit goes up to the
/// hard one, as daemons do; a limit that cannot be raised is left as it is (opening a member
/// then fails with its own error).
fn raise_open_file_limit() {
    use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
    let lim = getrlimit(Resource::Nofile);
    if lim.current.is_some() && lim.current != lim.maximum {
        let raised = Rlimit {
            current: lim.maximum,
            maximum: lim.maximum,
        };
        if let Err(e) = setrlimit(Resource::Nofile, raised) {
            tracing::debug!("cannot raise the open-file limit: {e}");
        }
    }
}

fn init_logging(verbose: u8) {
    let default = match verbose {
        0 => "info",
        1 => "debug",
        _ => "trace",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_env("IRONRAID_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr)
        .with_target(false)
        .init();
}

fn size_arg(s: &str) -> Result<u64, String> {
    size::parse_size(s)
}

fn dispatch(cmd: Cmd) -> anyhow::Result<()> {
    match cmd {
        Cmd::Create(a) => create(a).map(|uuid| println!("{uuid}")),
        Cmd::LeaveCluster {
            cluster,
            etcd_tls,
            members,
        } => cluster::leave(cluster.as_deref(), &etcd_tls.into(), &members),
        Cmd::Examine {
            scan: true,
            config,
            members,
            ..
        } => scan::examine_scan(&members, config.as_deref()),
        Cmd::Examine {
            bitmap: false,
            json,
            members,
            ..
        } => examine::examine(&members, json),
        Cmd::Examine {
            bitmap: true,
            json,
            members,
            ..
        } => examine::examine_bitmap(&members, json),
        Cmd::Run {
            name,
            nbd,
            export_name,
            socket_mode,
            socket_owner,
            tls_cert,
            tls_key,
            tls_ca,
            tls,
            read_only,
            no_direct,
            write_hold_us,
            stream_hold_us,
            stripe_cache,
            speed_min,
            speed_max,
            sync_window,
            force,
            run_degraded,
            add_journal,
            drop_journal,
            guide,
            assume_data_journal,
            guide_timeout,
            integrity_cache,
            member_timeout,
            member_retry,
            member_tls_ca,
            metrics,
            read_policy,
            cluster,
            node,
            lease_ttl,
            etcd_tls,
            scan,
            config,
            array,
            members,
        } => {
            let args = daemon::RunArgs {
                read_primary: read_policy == "primary",
                cluster: cluster
                    .zip(node)
                    .map(|(endpoints, node)| cluster::ClusterArgs {
                        endpoints,
                        tls: etcd_tls.into(),
                        node,
                        lease_ttl,
                    }),
                remote: RemoteOptions {
                    timeout: member_timeout,
                    retry: member_retry,
                    tls_ca: member_tls_ca,
                    ..RemoteOptions::default()
                },
                integrity_cache_bytes: integrity_cache as usize,
                stripe_cache_bytes: stripe_cache as usize,
                guide,
                assume_data_journal,
                guide_timeout: Duration::from_secs(guide_timeout),
                add_journal,
                drop_journal,
                name,
                nbd,
                export_name,
                socket_access: endpoint::SocketAccess::parse(
                    &socket_mode,
                    socket_owner.as_deref(),
                )?,
                tls: endpoint::tls_config(tls_cert, tls_key, tls_ca, tls.as_deref())?,
                members,
                read_only,
                buffered: no_direct,
                write_hold: Duration::from_micros(write_hold_us),
                stream_hold: Duration::from_micros(stream_hold_us),
                speed_min,
                speed_max,
                sync_window,
                force,
                run_degraded,
                metrics,
            };
            if scan {
                scan::run_scan(config.as_deref(), array.as_deref(), args)
            } else {
                daemon::run(args)
            }
        }
        Cmd::Status { json } => overview::status(json, fetch_detail),
        Cmd::Detail { scan: true, .. } => scan::detail_scan(),
        Cmd::Detail { name, json, .. } => detail(&name.unwrap_or_default(), json),
        Cmd::Fail {
            name,
            member,
            force,
        } => manage::fail(&name, &member, force),
        Cmd::Remove { name, member } => manage::remove(&name, &member),
        Cmd::Add {
            name,
            member,
            force,
        } => manage::add(&name, &member, force),
        Cmd::Action { name, action, wait } => action::action(&name, &action, wait),
        Cmd::Verify {
            name,
            offset,
            length,
            ranges,
            json,
        } => verify::verify(&name, offset.zip(length), ranges.as_deref(), json),
        Cmd::Guide {
            name,
            kind,
            ranges,
            assume_data_journal,
            json,
        } => guide::guide(&name, &kind, ranges.as_deref(), assume_data_journal, json),
        Cmd::Monitor {
            name: Some(name),
            program,
            scan,
        } if !scan.scan => monitor::monitor(&name, program.as_deref()),
        Cmd::Monitor { program, scan, .. } => monitor_scan::monitor_scan(program, scan),
        Cmd::Speed { name, min, max } => manage::speed(&name, min, max),
        Cmd::JournalMode { name, mode } => manage::journal_mode(&name, mode.as_deref()),
        Cmd::Stop { name, force } => stop(&name, force),
        Cmd::Demo { dir } => demo(dir),
        Cmd::Generate { dir } => {
            use clap::CommandFactory;
            generate::generate(Cli::command(), &dir)
        }
    }
}

/// Whether `dev` has md's superblock magic where any version keeps it: 1.2 at 4 KiB, 1.1 at
/// the start, 1.0 8 KiB before the end (4 KiB aligned), 0.90 in the last 64 KiB-aligned 64 KiB.
fn carries_md_magic(dev: &dyn Device) -> bool {
    let len = dev.len_bytes();
    let mut places = vec![4096, 0];
    if len >= 3 * 4096 {
        places.push((len - 8192) & !4095);
    }
    if len >= 2 * 65536 {
        places.push((len & !65535) - 65536);
    }
    places.into_iter().any(|at| {
        let mut b = device::AlignedBuf::zeroed(4096);
        at + 4096 <= len
            && dev.read_at(&mut b, at).is_ok()
            && u32::from_le_bytes([b[0], b[1], b[2], b[3]]) == format::MD_SB_MAGIC
    })
}

fn create(a: CreateArgs) -> anyhow::Result<String> {
    let level =
        layout::Level::parse(&a.level).ok_or_else(|| anyhow!("unknown level '{}'", a.level))?;
    let bitmap = bitmap_spec(&a, level)?;
    match (a.consistency_policy.as_str(), &a.journal) {
        ("journal", None) => usage_error("--consistency-policy journal needs --journal DEV"),
        ("journal", Some(_)) => {}
        (_, Some(_)) => usage_error("--journal needs --consistency-policy journal"),
        (_, None) if a.journal_mode.is_some() => {
            usage_error("--journal-mode needs --consistency-policy journal")
        }
        _ => {}
    }
    let layout = a
        .layout
        .as_deref()
        .map(|l| layout::parse_layout(level, l).map_err(|e| anyhow!("--layout {l}: {e}")))
        .transpose()?;
    let chunk_bytes = size::parse_size(&a.chunk).map_err(|e| anyhow!("--chunk: {e}"))?;
    let size_bytes = a
        .size
        .as_deref()
        .map(size::parse_size)
        .transpose()
        .map_err(|e| anyhow!("--size: {e}"))?;
    let all_paths: Vec<PathBuf> = a
        .members
        .iter()
        .chain(&a.spares)
        .chain(&a.journal)
        .cloned()
        .collect();
    if a.preallocate {
        space::preallocate(&all_paths)?;
    }
    let opener = member::Opener::new(OpenMode::Buffered);
    let open = |paths: &[PathBuf]| opener.open_all(paths);
    let members = open(&a.members)?;
    let sizes: Vec<(String, u64)> = members
        .iter()
        .map(|d| (d.name().to_string(), d.len_bytes()))
        .collect();
    // Linear and RAID0 use every member whole; the others only the smallest's size.
    let capped = !matches!(level, layout::Level::Linear | layout::Level::Raid0);
    if let Some(w) = size::uneven_members(&sizes).filter(|_| capped && size_bytes.is_none()) {
        tracing::warn!("{w}");
    }
    // Members that carry an md superblock are an old array's (`create --force` over them is
    // md's way to re-create an array whose superblocks were lost): their data is kept, as it
    // is with `--assume-clean`. Discarding is for new members only.
    let reused = members.iter().any(|d| carries_md_magic(d.as_ref()));
    // A member file without a single allocated block holds nothing to keep.
    let unwritten = a.members.iter().chain(&a.spares).all(|p| {
        std::fs::metadata(p)
            .is_ok_and(|m| m.is_file() && std::os::unix::fs::MetadataExt::blocks(&m) == 0)
    });
    if a.integrity.is_some() && a.assume_clean && (reused || !unwritten) {
        bail!(
            "--integrity starts from zeroed members (the checksums need known contents), so it cannot keep the data --assume-clean would keep on these members"
        );
    }
    let spec = engine::CreateSpec {
        name: a.name.unwrap_or_else(|| "ironraid".into()),
        level,
        layout,
        chunk_bytes,
        members,
        spares: open(&a.spares)?,
        journal: open(a.journal.as_slice())?.pop(),
        journal_write_back: a.journal_mode.as_deref() == Some("write-back"),
        integrity: a.integrity.is_some(),
        size_bytes,
        assume_clean: a.assume_clean,
        force: a.force,
        bitmap,
        // Zeroes that cost no writing (holes in files, a block device's own zeroing) make
        // every region start unused (no initial sync, nothing to rebuild until written);
        // zeroing other block devices would write them whole, and a preallocated file would
        // lose its reservation. `--assume-clean` promises the members' data is kept (md's
        // meaning), which only matters where there is some.
        discard: !a.preallocate
            && (!a.assume_clean || unwritten)
            && !reused
            && all_paths.iter().all(|p| space::zeroes_cheaply(p)),
        guided: a.consistency_policy == "guided",
    };
    let etcd_tls = a.etcd_tls.clone().into();
    if let Some(ep) = &a.cluster {
        cluster::check_reachable(ep, &etcd_tls)?;
    }
    let created = engine::create(&spec).map_err(|e| anyhow!("{e}"))?;
    if let (Some(ep), Some(nodes)) = (&a.cluster, a.nodes) {
        cluster::register(
            ep,
            &etcd_tls,
            &created.uuid,
            &spec.name,
            level,
            nodes as usize,
        )
        .with_context(|| {
            format!(
                "the members carry the new array {}, but it is not registered in etcd \
                     (create it again with --force once etcd answers)",
                format::format_uuid(&created.uuid)
            )
        })?;
    }
    if !a.preallocate {
        space::warn_overcommit(&all_paths);
    }
    tracing::info!(
        level = level.name(),
        members = spec.members.len(),
        array_bytes = created.array_bytes,
        "created array '{}' ({})",
        spec.name,
        size::human(created.array_bytes)
    );
    Ok(format::format_uuid_mdadm(&created.uuid))
}

/// The write-intent bitmap `create` was asked for. Checked before anything touches a member
/// (`--preallocate` included); whether the chunk fits the reserved space is the engine's call.
fn bitmap_spec(a: &CreateArgs, level: layout::Level) -> anyhow::Result<Option<engine::BitmapSpec>> {
    if !matches!(a.consistency_policy.as_str(), "bitmap" | "guided") {
        if a.bitmap_chunk.is_some() {
            usage_error("--bitmap-chunk needs --consistency-policy bitmap or guided");
        }
        if a.nodes.is_some() {
            usage_error(
                "--nodes keeps one write-intent bitmap per node: it needs --consistency-policy \
                 bitmap or guided",
            );
        }
        return Ok(None);
    }
    if matches!(level, layout::Level::Raid0 | layout::Level::Linear) {
        bail!(
            "--consistency-policy {}: {} has no redundancy, so there is nothing to resync",
            a.consistency_policy,
            level.name()
        );
    }
    let chunk_bytes = a
        .bitmap_chunk
        .as_deref()
        .map(|s| {
            let c = size::parse_size(s).map_err(|e| anyhow!("--bitmap-chunk: {e}"))?;
            if !c.is_power_of_two() || c < 4096 {
                bail!("--bitmap-chunk {s}: must be a power of two of at least 4K");
            }
            Ok(c)
        })
        .transpose()?;
    let cluster = a.nodes.map(|nodes| engine::ClusterFormat {
        nodes,
        name: a
            .cluster_name
            .clone()
            .unwrap_or_else(|| DEFAULT_CLUSTER_NAME.into()),
    });
    Ok(Some(engine::BitmapSpec {
        chunk_bytes,
        cluster,
    }))
}

/// The cluster name `create --nodes` stores when none is given.
const DEFAULT_CLUSTER_NAME: &str = "ironraid";

/// Bad usage of `create` that clap cannot express: its usage message and exit status 2.
fn usage_error(msg: &str) -> ! {
    use clap::CommandFactory;
    let mut cli = Cli::command();
    // Building names the subcommand "ironraid create" in the usage line.
    cli.build();
    cli.find_subcommand_mut("create")
        .expect("the create subcommand is defined above")
        .error(clap::error::ErrorKind::ArgumentConflict, msg)
        .exit()
}

fn detail(name: &str, json: bool) -> anyhow::Result<()> {
    let d = fetch_detail(name)?;
    if json {
        println!("{}", serde_json::to_string_pretty(&d)?);
        return Ok(());
    }
    print!("{}", d.mdstat());
    println!(
        "  uuid {}  size {} ({} bytes)  events {}",
        d.uuid,
        size::human(d.size_bytes),
        d.size_bytes,
        d.events
    );
    for m in &d.members {
        println!(
            "  {:>5}  {:<9} {}",
            m.role.map(|r| r.to_string()).unwrap_or_else(|| "-".into()),
            m.state,
            m.path
        );
    }
    for a in &d.nbd {
        println!("  nbd   {a}");
    }
    for c in &d.nbd_clients {
        println!("  client {c}");
    }
    Ok(())
}

fn stop(name: &str, force: bool) -> anyhow::Result<()> {
    let pid = fetch_detail(name)?.pid;
    expect_ok(control::call(name, &control::Request::Stop { force })?)?;
    if !daemon::wait_exit(pid, Duration::from_secs(120)) {
        bail!("array '{name}': daemon (pid {pid}) did not exit within 120 s");
    }
    Ok(())
}

/// Demo: 4 sparse 256 MiB files, RAID5, served on the default socket.
fn demo(dir: Option<PathBuf>) -> anyhow::Result<()> {
    const MEMBER_BYTES: u64 = 256 << 20;
    let dir = dir.unwrap_or_else(|| std::env::temp_dir().join("ironraid-demo"));
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    if std::env::var_os("IRONRAID_RUNDIR").is_none()
        && std::fs::create_dir_all(rundir::rundir()).is_err()
    {
        std::env::set_var("IRONRAID_RUNDIR", dir.join("run"));
    }
    let members: Vec<PathBuf> = (0..4).map(|i| dir.join(format!("member{i}.img"))).collect();
    let fresh = members.iter().any(|m| !m.exists());
    if fresh {
        for m in &members {
            let f = std::fs::File::create(m)
                .with_context(|| format!("cannot create {}", m.display()))?;
            f.set_len(MEMBER_BYTES)?;
        }
        let uuid = create(CreateArgs {
            level: "5".into(),
            chunk: "512K".into(),
            layout: None,
            name: Some("demo".into()),
            consistency_policy: "resync".into(),
            bitmap_chunk: None,
            nodes: None,
            cluster_name: None,
            cluster: None,
            etcd_tls: Default::default(),
            journal: None,
            journal_mode: None,
            integrity: None,
            spares: vec![],
            size: None,
            // New sparse files: discarded, every region starts unused (no initial sync).
            assume_clean: false,
            force: false,
            preallocate: false,
            members: members.clone(),
        })?;
        println!(
            "created RAID5 'demo' ({uuid}) over 4 sparse files in {}",
            dir.display()
        );
    } else {
        println!("reusing the RAID5 'demo' members in {}", dir.display());
    }
    let sock = rundir::nbd_socket("demo");
    let uri = format!("nbd+unix:///demo?socket={}", sock.display());
    println!(
        "\nServing on {sock}. Connect with:\n  nbdinfo '{uri}'\n  qemu-img info '{uri}'\n  qemu-io -f raw '{uri}' -c 'write -P 0xab 0 1M' -c 'read -P 0xab 0 1M'\n  \
         nbdfuse /mnt/demo '{uri}' &   # then: losetup -f --show /mnt/demo/nbd; mkfs.ext4 …\n  \
         nbd-client -unix {sock} /dev/nbd0 -N demo   # with the kernel's nbd module\n\
         Watch it: ironraid status; ironraid detail demo --json\nStop it:  ironraid stop demo  (or Ctrl-C)\n",
        sock = sock.display()
    );
    daemon::run(daemon::RunArgs {
        name: Some("demo".into()),
        nbd: vec![],
        export_name: None,
        socket_access: endpoint::SocketAccess {
            mode: 0o600,
            owner: None,
        },
        tls: None,
        members,
        read_only: false,
        buffered: false,
        write_hold: Duration::from_micros(2000),
        stream_hold: engine::ArrayConfig::default().stream_hold,
        speed_min: None,
        speed_max: None,
        sync_window: None,
        force: false,
        run_degraded: false,
        add_journal: None,
        drop_journal: false,
        guide: None,
        assume_data_journal: false,
        guide_timeout: engine::DEFAULT_GUIDE_TIMEOUT,
        integrity_cache_bytes: engine::ArrayConfig::default().integrity_cache_bytes,
        stripe_cache_bytes: engine::ArrayConfig::default().stripe_cache_bytes,
        remote: RemoteOptions::default(),
        metrics: None,
        read_primary: false,
        cluster: None,
    })
}

#[cfg(test)]
mod tests {
    use super::carries_md_magic;
    use device::{Device, SimDevice};

    #[test]
    fn md_magic_is_found_where_each_superblock_version_keeps_it() {
        let len = 10 << 20;
        let fresh = || SimDevice::new("m", len, 1);
        assert!(!carries_md_magic(&fresh()));
        let magic = format::MD_SB_MAGIC.to_le_bytes();
        // 1.2, 1.1, 1.0 (8 KiB before the end), 0.90 (last 64 KiB-aligned 64 KiB).
        for at in [4096, 0, len - 8192, len - 65536] {
            let d = fresh();
            d.scribble(at, &magic);
            assert!(carries_md_magic(&d), "magic at {at}");
        }
        // Elsewhere it means nothing.
        let d = fresh();
        d.scribble(1 << 20, &magic);
        assert!(!carries_md_magic(&d));
        assert_eq!(d.len_bytes(), len);
    }
}
