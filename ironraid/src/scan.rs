//! Assembly by scan, as `mdadm --assemble --scan`, and the ARRAY lines of `detail --scan` and
//! `examine --scan`: members are found by the UUID in their superblocks, among whatever the
//! config's DEVICE globs allow, in any order; files without a superblock are passed over.

use crate::config::{self, ArrayLine, Config};
use crate::daemon::{self, RunArgs};
use crate::{control, rundir};
use anyhow::{anyhow, bail, Context};
use device::{FileDevice, OpenMode};
use format::Superblock;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// How long `run --scan` waits for one array's daemon to serve.
const START_TIMEOUT: Duration = Duration::from_secs(120);

/// A file that carries an md superblock.
struct Found {
    path: PathBuf,
    sb: Superblock,
}

fn read_superblocks(paths: &[PathBuf]) -> Vec<Found> {
    paths
        .iter()
        .filter_map(|p| {
            let d = FileDevice::open(p, OpenMode::ReadOnly).ok()?;
            match engine::read_superblock(&d) {
                Ok(sb) => Some(Found {
                    path: p.clone(),
                    sb,
                }),
                Err(e) => {
                    tracing::debug!(path = %p.display(), "not a member: {e}");
                    None
                }
            }
        })
        .collect()
}

fn array_line_of(sb: &Superblock) -> String {
    let level = format::level_name(sb.level).unwrap_or("unknown");
    format!(
        "ARRAY UUID={} name={} level={level} num-devices={}",
        format::format_uuid_mdadm(&sb.set_uuid),
        sb.set_name,
        sb.raid_disks
    )
}

/// `examine --scan`: one ARRAY line per array found on the members given, else on the
/// config's DEVICE globs.
pub fn examine_scan(members: &[PathBuf], config_flag: Option<&Path>) -> anyhow::Result<()> {
    let paths = if members.is_empty() {
        config::candidate_devices(&config::load(config_flag)?)?
    } else {
        members.to_vec()
    };
    let mut seen: Vec<[u8; 16]> = Vec::new();
    for f in read_superblocks(&paths) {
        if !seen.contains(&f.sb.set_uuid) {
            seen.push(f.sb.set_uuid);
            println!("{}", array_line_of(&f.sb));
        }
    }
    Ok(())
}

/// `detail --scan`: one ARRAY line per running array, ready for the config.
pub fn detail_scan() -> anyhow::Result<()> {
    for name in control::running_arrays() {
        let Ok(d) = control::fetch_detail(&name) else {
            continue;
        };
        // The default socket goes without saying: `run` always serves it (and it moves with
        // the run directory); nbd= lists the endpoints added to it.
        let default = format!("unix:{}", rundir::nbd_socket(&name).display());
        let extra: Vec<&str> = d
            .nbd
            .iter()
            .map(String::as_str)
            .filter(|a| *a != default)
            .collect();
        let mut line = format!("ARRAY UUID={} name={}", d.uuid, d.name);
        if !extra.is_empty() {
            line.push_str(&format!(" nbd={}", extra.join(",")));
        }
        println!("{line}");
    }
    Ok(())
}

fn matches(a: &ArrayLine, sb: &Superblock) -> bool {
    match (&a.uuid, &a.name) {
        (Some(u), _) => *u == sb.set_uuid,
        (None, Some(n)) => *n == sb.set_name,
        (None, None) => false,
    }
}

/// The members of ARRAY line `a` among `found`; refuses a name that means two arrays.
fn members_of(a: &ArrayLine, found: &[Found]) -> anyhow::Result<Vec<PathBuf>> {
    let mine: Vec<&Found> = found.iter().filter(|f| matches(a, &f.sb)).collect();
    let first = mine
        .first()
        .ok_or_else(|| anyhow!("ARRAY {}: no member found on the DEVICE globs", a.label()))?;
    if mine.iter().any(|f| f.sb.set_uuid != first.sb.set_uuid) {
        bail!(
            "ARRAY name={}: members of more than one array carry that name; give its UUID=",
            a.label()
        );
    }
    Ok(mine.iter().map(|f| f.path.clone()).collect())
}

/// The name the array will be served under: the ARRAY line's, else its superblocks'.
fn served_name(a: &ArrayLine, members: &[PathBuf], found: &[Found]) -> String {
    a.name.clone().unwrap_or_else(|| {
        found
            .iter()
            .find(|f| f.path == members[0])
            .map(|f| f.sb.set_name.clone())
            .unwrap_or_default()
    })
}

fn selected<'c>(c: &'c Config, which: &str) -> anyhow::Result<&'c ArrayLine> {
    let uuid = format::parse_uuid(which);
    c.arrays
        .iter()
        .find(|a| a.name.as_deref() == Some(which) || (uuid.is_some() && a.uuid == uuid))
        .ok_or_else(|| anyhow!("config {} has no ARRAY '{which}'", c.path.display()))
}

/// `run --scan`: with `--array`, assemble that ARRAY and serve it here, in the foreground;
/// without, start each ARRAY not running yet as its own daemon (this program again, with
/// `--array`) and return once each serves or has failed.
pub fn run_scan(
    config_flag: Option<&Path>,
    which: Option<&str>,
    mut args: RunArgs,
) -> anyhow::Result<()> {
    let c = config::load(config_flag)?;
    let found = read_superblocks(&config::candidate_devices(&c)?);
    let Some(which) = which else {
        // Every daemon gets this command line: one address cannot serve several arrays.
        if c.arrays.len() > 1 && (!args.nbd.is_empty() || args.metrics.is_some()) {
            bail!(
                "--nbd and --metrics would give every ARRAY of {} the same address: put nbd= and \
                 metrics= on each ARRAY line instead",
                c.path.display()
            );
        }
        return start_all(&c, &found);
    };
    let a = selected(&c, which)?;
    args.members = members_of(a, &found)?;
    args.name = Some(served_name(a, &args.members, &found));
    if args.nbd.is_empty() {
        args.nbd = a.nbd.clone();
    }
    if args.metrics.is_none() {
        args.metrics = a.metrics.clone();
    }
    tracing::info!(array = %a.label(), members = args.members.len(), "assembling from {}", c.path.display());
    daemon::run(args)
}

fn start_all(c: &Config, found: &[Found]) -> anyhow::Result<()> {
    if c.arrays.is_empty() {
        bail!("config {} has no ARRAY line", c.path.display());
    }
    let mut failed = 0;
    for a in &c.arrays {
        if let Err(e) = start_one(a, found) {
            eprintln!("ironraid: ARRAY {}: {e:#}", a.label());
            failed += 1;
        }
    }
    if failed > 0 {
        bail!("{failed} of {} arrays did not start", c.arrays.len());
    }
    Ok(())
}

/// Start one ARRAY as a daemon of its own (its log in RUNDIR/NAME.log) and wait until its
/// control socket answers.
fn start_one(a: &ArrayLine, found: &[Found]) -> anyhow::Result<()> {
    let members = members_of(a, found)?;
    let name = served_name(a, &members, found);
    let ctl = rundir::control_socket(&name);
    if std::os::unix::net::UnixStream::connect(&ctl).is_ok() {
        eprintln!("ironraid: array '{name}' is already running");
        return Ok(());
    }
    let dir = rundir::rundir();
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let log_path = dir.join(format!("{name}.log"));
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log_path)
        .with_context(|| format!("cannot open {}", log_path.display()))?;
    let exe = std::env::current_exe().context("cannot find this program to start daemons")?;
    let mut cmd = Command::new(exe);
    // The same command line, narrowed to this ARRAY: its options apply to every array.
    cmd.args(std::env::args_os().skip(1))
        .args(["--array", &a.label()])
        .env_remove("NOTIFY_SOCKET")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log);
    // Its own process group: a Ctrl-C meant for the terminal's foreground job spares it.
    std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
    let mut child = cmd.spawn().context("cannot start the daemon")?;
    let deadline = Instant::now() + START_TIMEOUT;
    loop {
        if std::os::unix::net::UnixStream::connect(&ctl).is_ok() {
            println!(
                "ironraid: array '{name}' started from {} members (pid {}, log {})",
                members.len(),
                child.id(),
                log_path.display()
            );
            return Ok(());
        }
        if let Some(st) = child.try_wait()? {
            let text = std::fs::read_to_string(&log_path).unwrap_or_default();
            let last = text.lines().last().unwrap_or("(no log)");
            bail!("daemon exited ({st}): {last}");
        }
        if Instant::now() > deadline {
            bail!(
                "daemon (pid {}) did not serve within {} s; see {}",
                child.id(),
                START_TIMEOUT.as_secs(),
                log_path.display()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}
