//! End-to-end harness: member files in a temp dir, the real `ironraid` binary, real clients.

#![allow(dead_code)]

pub mod raw_client;
pub mod writers;

use std::io::{BufRead, BufReader};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

pub const BIN: &str = env!("CARGO_BIN_EXE_ironraid");

pub struct Env {
    pub dir: tempfile::TempDir,
    pub members: Vec<PathBuf>,
    pub name: String,
}

/// The external-tool checks (`require_tools`, `tool_missing`, the
/// `IRONRAID_ALLOW_MISSING_TOOLS` switch) live in the `testkit` crate, shared by every test.
#[allow(unused_imports)] // each test binary uses some of these
pub use testkit::{require_tools, tool_missing, ALLOW_MISSING_TOOLS};

impl Env {
    /// `n` sparse member files of `member_bytes` each.
    pub fn new(name: &str, n: usize, member_bytes: u64) -> Env {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir_all(dir.path().join("run")).unwrap();
        let members = (0..n)
            .map(|i| {
                let p = dir.path().join(format!("m{i}.img"));
                std::fs::File::create(&p)
                    .unwrap()
                    .set_len(member_bytes)
                    .unwrap();
                p
            })
            .collect();
        Env {
            dir,
            members,
            name: name.into(),
        }
    }

    pub fn rundir(&self) -> PathBuf {
        self.dir.path().join("run")
    }

    pub fn cmd(&self) -> Command {
        let mut c = Command::new(BIN);
        c.env("IRONRAID_RUNDIR", self.rundir());
        c
    }

    /// Run `ironraid ARGS`; returns the output (not checked).
    pub fn ironraid(&self, args: &[&str]) -> Output {
        self.cmd().args(args).output().expect("spawn ironraid")
    }

    pub fn ok(&self, args: &[&str]) -> String {
        let out = self.ironraid(args);
        assert!(
            out.status.success(),
            "ironraid {args:?} failed ({}):\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    pub fn member_args(&self) -> Vec<String> {
        self.members
            .iter()
            .map(|m| m.display().to_string())
            .collect()
    }

    pub fn create(&self, level: &str, extra: &[&str]) -> String {
        let mut args: Vec<String> = vec![
            "create".into(),
            "--level".into(),
            level.into(),
            "--name".into(),
            self.name.clone(),
            "--assume-clean".into(),
        ];
        args.extend(extra.iter().map(|s| s.to_string()));
        args.extend(self.member_args());
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        self.ok(&refs).trim().to_string()
    }

    /// `create` a RAID5 with 64K chunks over the env's members, its journal on `log` in `mode`.
    pub fn create_with_journal(&self, log: &Path, mode: &str) {
        self.create(
            "5",
            &[
                "--chunk",
                "64K",
                "--consistency-policy",
                "journal",
                "--journal",
                log.to_str().unwrap(),
                "--journal-mode",
                mode,
            ],
        );
    }

    pub fn socket(&self) -> PathBuf {
        self.rundir().join(format!("{}.nbd", self.name))
    }

    pub fn uri(&self) -> String {
        format!(
            "nbd+unix:///{}?socket={}",
            self.name,
            self.socket().display()
        )
    }

    /// Start `ironraid run` over `members` and wait for the socket.
    pub fn run(&self, members: &[PathBuf]) -> Daemon {
        self.run_with(&[], members)
    }

    /// `ironraid run EXTRA... MEMBERS...` and wait for the sockets.
    pub fn run_with(&self, extra: &[&str], members: &[PathBuf]) -> Daemon {
        self.try_run_with(extra, members)
            .unwrap_or_else(|log| panic!("ironraid run exited early:\n{log}"))
    }

    /// `ironraid run EXTRA... MEMBERS...` and wait for the sockets; `Err` with the daemon's log
    /// if it exits first (it refused to start).
    pub fn try_run_with(&self, extra: &[&str], members: &[PathBuf]) -> Result<Daemon, String> {
        let log = self.dir.path().join(format!(
            "daemon-{}.log",
            Instant::now().elapsed().as_nanos()
        ));
        let mut c = self.cmd();
        c.arg("run")
            .args(extra)
            .args(members)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap());
        let child = c.spawn().expect("spawn ironraid run");
        let mut d = Daemon { child, log };
        let deadline = Instant::now() + Duration::from_secs(20);
        // The control socket answering (not merely existing: a killed daemon leaves its files)
        // means the NBD listeners, bound before it, are up too.
        let ctl = self.rundir().join(format!("{}.ctl", self.name));
        while !self.socket().exists() || UnixStream::connect(&ctl).is_err() {
            if let Ok(Some(st)) = d.child.try_wait() {
                return Err(format!("({st}) {}", d.log_text()));
            }
            assert!(
                Instant::now() < deadline,
                "daemon did not create its sockets:\n{}",
                d.log_text()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(d)
    }

    /// `ironraid run ARGS... MEMBERS...` with its standard output read: the daemon and the first
    /// `lines` lines it printed (its endpoints), once its control socket answers.
    pub fn run_printing<S: AsRef<std::ffi::OsStr>>(
        &self,
        args: &[S],
        lines: usize,
    ) -> (Daemon, Vec<String>) {
        let log = self.dir.path().join(format!(
            "daemon-{}.log",
            Instant::now().elapsed().as_nanos()
        ));
        let mut child = self
            .cmd()
            .arg("run")
            .args(args)
            .args(&self.members)
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("spawn ironraid run");
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut printed = Vec::new();
        for _ in 0..lines {
            let mut l = String::new();
            out.read_line(&mut l).unwrap();
            assert!(
                !l.is_empty(),
                "daemon printed {printed:?} and ended:\n{}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
            printed.push(l.trim().to_string());
        }
        let ctl = self.rundir().join(format!("{}.ctl", self.name));
        let deadline = Instant::now() + Duration::from_secs(20);
        while UnixStream::connect(&ctl).is_err() {
            assert!(Instant::now() < deadline, "no control socket");
            std::thread::sleep(Duration::from_millis(20));
        }
        (Daemon { child, log }, printed)
    }

    /// A sparse file `name` of `bytes` in the test directory (a spare, a member to add).
    pub fn file(&self, name: &str, bytes: u64) -> PathBuf {
        let p = self.dir.path().join(name);
        std::fs::File::create(&p).unwrap().set_len(bytes).unwrap();
        p
    }

    /// `ironraid detail NAME --json`.
    pub fn detail(&self) -> serde_json::Value {
        serde_json::from_str(&self.ok(&["detail", &self.name, "--json"])).unwrap()
    }

    /// Poll `detail --json` every 50 ms until `done` holds; panics after `secs` seconds.
    pub fn wait_detail(
        &self,
        what: &str,
        secs: u64,
        mut done: impl FnMut(&serde_json::Value) -> bool,
    ) -> serde_json::Value {
        let deadline = Instant::now() + Duration::from_secs(secs);
        loop {
            let d = self.detail();
            if done(&d) {
                return d;
            }
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {what}: {d:#}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// `ironraid examine --json PATH`, the one entry.
    pub fn examine(&self, path: &Path) -> serde_json::Value {
        let out = self.ok(&["examine", "--json", path.to_str().unwrap()]);
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        v[0].clone()
    }

    /// `action NAME ACTION --wait`; the mismatch_count it printed (which `detail` agrees with).
    pub fn action_wait(&self, action: &str) -> u64 {
        let out = self.ok(&["action", &self.name, action, "--wait"]);
        self.mismatches_printed(action, &out)
    }

    /// `check` once the background work a restart owes is over: the walker picks a resync up
    /// on its own thread, so an array that looked idle right after starting may begin one
    /// just before `check` is asked for, which it then refuses as busy; asked again until it
    /// runs (2 minutes at most). Returns the mismatch count.
    pub fn check_when_settled(&self) -> u64 {
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let out = self.ironraid(&["action", &self.name, "check", "--wait"]);
            if out.status.success() {
                return self.mismatches_printed("check", &String::from_utf8_lossy(&out.stdout));
            }
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(
                ["is resyncing", "is rebuilding", "requested already"]
                    .iter()
                    .any(|busy| err.contains(busy))
                    && Instant::now() < deadline,
                "check refused: {err}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn mismatches_printed(&self, action: &str, out: &str) -> u64 {
        assert!(out.contains(&format!("{action} finished")), "{out}");
        let n = out
            .trim()
            .rsplit(' ')
            .next()
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("action {action} --wait printed no mismatch_count: {out}"));
        assert_eq!(self.detail()["mismatch_count"], n, "{out}");
        n
    }

    pub fn run_all(&self) -> Daemon {
        self.run(&self.members)
    }

    /// `ironraid stop NAME` and wait for the daemon to exit 0.
    pub fn stop(&self, mut d: Daemon) -> String {
        self.ok(&["stop", &self.name]);
        let st = d.child.wait().unwrap();
        let log = d.log_text();
        assert!(st.success(), "daemon exit {st}:\n{log}");
        log
    }
}

pub struct Daemon {
    pub child: Child,
    pub log: PathBuf,
}

impl Daemon {
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn kill9(mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Run a shell-free command, assert success, return stdout.
pub fn sh(prog: &str, args: &[&str]) -> String {
    let out = Command::new(prog)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("spawn {prog}: {e}"));
    assert!(
        out.status.success(),
        "{prog} {args:?} failed ({}):\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The export at `uri` reads exactly like the file `image`, every byte (qemu-img compare).
pub fn assert_same_image(image: &Path, uri: &str) {
    let cmp = sh(
        "qemu-img",
        &[
            "compare",
            "-f",
            "raw",
            "-F",
            "raw",
            image.to_str().unwrap(),
            uri,
        ],
    );
    assert!(cmp.contains("identical"), "{cmp}");
}

/// A file of `len` pseudo-random bytes (seeded).
pub fn random_file(path: &Path, len: usize, seed: u64) {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut data = vec![0u8; len];
    rng.fill(&mut data[..]);
    std::fs::write(path, data).unwrap();
}

pub fn same_files(a: &Path, b: &Path) -> bool {
    std::fs::read(a).unwrap() == std::fs::read(b).unwrap()
}

/// `path` as `detail` names members (canonical).
pub fn canon(p: &Path) -> String {
    std::fs::canonicalize(p).unwrap().display().to_string()
}

/// The `detail --json` entry of member `p`.
pub fn member<'a>(d: &'a serde_json::Value, p: &Path) -> Option<&'a serde_json::Value> {
    let want = canon(p);
    d["members"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["path"] == want.as_str())
}

/// The `detail --json` state of member `p`, or "absent".
pub fn member_state(d: &serde_json::Value, p: &Path) -> String {
    member(d, p).map_or_else(
        || "absent".to_string(),
        |m| m["state"].as_str().unwrap().to_string(),
    )
}

/// The value after `key :` in mdadm's output.
pub fn mdadm_field(out: &str, key: &str) -> String {
    out.lines()
        .find_map(|l| {
            l.trim()
                .strip_prefix(key)
                .and_then(|r| r.trim().strip_prefix(':'))
                .map(|v| v.trim().to_string())
        })
        .unwrap_or_else(|| panic!("mdadm output lacks '{key}':\n{out}"))
}

/// A loop device, detached on drop.
pub struct Loop(pub String);

impl Loop {
    /// A loop device over `file` (`read_only`: `losetup -r`); `None` only when loop devices are
    /// unusable here and missing tools are allowed (see `tool_missing`).
    pub fn attach(file: &Path, read_only: bool) -> Option<Loop> {
        let mut c = Command::new("losetup");
        c.args(["-f", "--show", "--direct-io=off"]);
        if read_only {
            c.arg("-r");
        }
        let out = c.arg(file).output().expect("spawn losetup");
        if !out.status.success() {
            let why = format!(
                "cannot attach a loop device: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
            tool_missing("losetup", &why);
            return None;
        }
        Some(Loop(
            String::from_utf8_lossy(&out.stdout).trim().to_string(),
        ))
    }
}

impl Drop for Loop {
    fn drop(&mut self) {
        let _ = Command::new("losetup").args(["-d", &self.0]).status();
    }
}

/// Kills a process it owns if the test ends early (a failed assertion), so no daemon outlives
/// the test holding its output pipe.
pub struct Reap(pub Child);

impl Drop for Reap {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// Wait (up to 20 s) for `path` to appear: a socket a server binds, a file a mount shows.
pub fn wait_for(path: &Path) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !path.exists() {
        assert!(
            Instant::now() < deadline,
            "{} did not appear",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A device that misbehaves on demand: an nbdkit export (a plugin with its filters) served on a
/// Unix socket and mounted as a file by nbdfuse, which the array takes as a member or a log.
pub struct FuseExport {
    nbdkit: Child,
    nbdfuse: Child,
    mnt: PathBuf,
}

impl FuseExport {
    /// `nbdkit -f -U DIR/NAME.sock ARGS...`, mounted at `DIR/NAME` (logs `DIR/NAME-*.log`).
    pub fn start(dir: &Path, name: &str, args: &[String]) -> FuseExport {
        let sock = dir.join(format!("{name}.sock"));
        let log =
            |what: &str| std::fs::File::create(dir.join(format!("{name}-{what}.log"))).unwrap();
        let nbdkit = Command::new("nbdkit")
            .args(["-f", "-U", sock.to_str().unwrap()])
            .args(args)
            .stdout(Stdio::null())
            .stderr(log("nbdkit"))
            .spawn()
            .expect("spawn nbdkit");
        wait_for(&sock);
        let mnt = dir.join(name);
        std::fs::create_dir_all(&mnt).unwrap();
        let nbdfuse = Command::new("nbdfuse")
            .arg(&mnt)
            .arg(format!("nbd+unix:///?socket={}", sock.display()))
            .stdout(Stdio::null())
            .stderr(log("nbdfuse"))
            .spawn()
            .expect("spawn nbdfuse");
        let export = FuseExport {
            nbdkit,
            nbdfuse,
            mnt,
        };
        wait_for(&export.path());
        export
    }

    /// The device, as a file.
    pub fn path(&self) -> PathBuf {
        self.mnt.join("nbd")
    }
}

impl Drop for FuseExport {
    fn drop(&mut self) {
        let _ = Command::new("fusermount3")
            .arg("-u")
            .arg(&self.mnt)
            .status();
        let _ = self.nbdfuse.wait();
        let _ = self.nbdkit.kill();
        let _ = self.nbdkit.wait();
    }
}

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("spawn openssl");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A CA, a server certificate for 127.0.0.1 and a client one, in `dir` (made with openssl); `dir/client` is the
/// `tls-certificates` directory libnbd and qemu read (ca-cert.pem, client-cert.pem,
/// client-key.pem).
pub fn make_certificates(dir: &Path) -> PathBuf {
    let ca = [
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "ca-key.pem",
        "-out",
        "ca-cert.pem",
        "-days",
        "2",
        "-subj",
        "/CN=ironraid test CA",
    ];
    openssl(dir, &ca);
    for (who, ext) in [
        (
            "server",
            // clientAuth too: etcd's JSON gateway connects to its own gRPC server with it.
            "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth,clientAuth\n",
        ),
        ("client", "extendedKeyUsage=clientAuth\n"),
    ] {
        let key = format!("{who}-key.pem");
        let csr = format!("{who}.csr");
        let cert = format!("{who}-cert.pem");
        let extfile = format!("{who}.ext");
        std::fs::write(
            dir.join(&extfile),
            format!("basicConstraints=CA:FALSE\n{ext}"),
        )
        .unwrap();
        openssl(
            dir,
            &[
                "req",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-keyout",
                &key,
                "-out",
                &csr,
                "-subj",
                &format!("/CN={who}"),
            ],
        );
        openssl(
            dir,
            &[
                "x509",
                "-req",
                "-in",
                &csr,
                "-CA",
                "ca-cert.pem",
                "-CAkey",
                "ca-key.pem",
                "-CAcreateserial",
                "-out",
                &cert,
                "-days",
                "2",
                "-extfile",
                &extfile,
            ],
        );
    }
    let client = dir.join("client");
    std::fs::create_dir_all(&client).unwrap();
    for f in ["ca-cert.pem", "client-cert.pem", "client-key.pem"] {
        std::fs::copy(dir.join(f), client.join(f)).unwrap();
    }
    client
}

/// A device that fails on demand with real I/O errors (a log device, a member): a file served
/// by nbdkit through its error filter (every request fails with EIO while `trigger` exists),
/// mounted as a file by nbdfuse. (device-mapper's `error` target would do too, where the
/// kernel has it.)
pub struct FailingFile {
    export: FuseExport,
    trigger: PathBuf,
}

impl FailingFile {
    /// `name` keeps several apart in one env.
    pub fn new(env: &Env, name: &str, bytes: u64) -> FailingFile {
        let img = env.file(&format!("{name}-backing.img"), bytes);
        let trigger = env.dir.path().join(format!("{name}-fails"));
        let args = [
            "--filter=error".to_string(),
            "file".into(),
            format!("file={}", img.display()),
            "error=EIO".into(),
            "error-rate=100%".into(),
            format!("error-file={}", trigger.display()),
        ];
        FailingFile {
            export: FuseExport::start(env.dir.path(), &format!("{name}fuse"), &args),
            trigger,
        }
    }

    /// The device, as the array sees it.
    pub fn path(&self) -> PathBuf {
        self.export.path()
    }

    pub fn fail(&self, on: bool) {
        if on {
            std::fs::write(&self.trigger, b"").unwrap();
        } else {
            std::fs::remove_file(&self.trigger).unwrap();
        }
    }
}
