//! md's safety refusals, end to end: `stop` with clients connected, `run` with a member
//! forgotten, `fail` past what the level survives; each with its escape hatch (`--force`,
//! `--run`) and each refusal one line on stderr with exit status 1.

mod common;

use common::*;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, ChildStdout, Command, Output, Stdio};

const MEMBER: u64 = 32 << 20;

/// The refusal contract: exit 1, one line on stderr containing every `words`.
fn assert_refused(out: &Output, words: &[&str]) -> String {
    let err = String::from_utf8_lossy(&out.stderr).trim().to_string();
    assert_eq!(out.status.code(), Some(1), "not refused: {err}");
    assert_eq!(err.lines().count(), 1, "refusal is not one line:\n{err}");
    for w in words {
        assert!(err.contains(w), "refusal does not say '{w}': {err}");
    }
    err
}

/// `qemu-io` reading commands from a pipe: an NBD client that stays connected until its stdin
/// closes.
struct HeldClient {
    child: Child,
    stdin: Option<ChildStdin>,
    stdout: BufReader<ChildStdout>,
    said: String,
}

impl HeldClient {
    fn connect(uri: &str) -> HeldClient {
        let mut child = Command::new("stdbuf")
            .args(["-oL", "qemu-io", "-f", "raw", uri])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn qemu-io");
        let stdin = child.stdin.take();
        let stdout = BufReader::new(child.stdout.take().expect("piped"));
        HeldClient {
            child,
            stdin,
            stdout,
            said: String::new(),
        }
    }

    /// Send one qemu-io command and wait until its answer line (containing `done`) is out.
    fn command(&mut self, line: &str, done: &str) {
        let stdin = self.stdin.as_mut().expect("client still open");
        writeln!(stdin, "{line}").unwrap();
        stdin.flush().unwrap();
        loop {
            let mut l = String::new();
            assert!(
                self.stdout.read_line(&mut l).unwrap() > 0,
                "qemu-io ended: {}",
                self.said
            );
            self.said.push_str(&l);
            if l.contains(done) {
                return;
            }
        }
    }

    /// Everything qemu-io printed, once it has ended.
    fn finish(mut self) -> String {
        self.stdin = None;
        let mut rest = String::new();
        self.stdout.read_to_string(&mut rest).unwrap();
        self.child.wait().unwrap();
        format!("{}{rest}", self.said)
    }
}

impl Drop for HeldClient {
    fn drop(&mut self) {
        self.stdin = None;
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn stop_refuses_while_a_client_is_connected_and_force_flushes_first() {
    if !require_tools(&["qemu-io"]) {
        return;
    }
    let env = Env::new("busy", 3, MEMBER);
    env.create("5", &[]);
    let d = env.run_all();
    let mut client = HeldClient::connect(&env.uri());
    client.command("write -P 0xab 0 1M", "wrote");
    let out = env.ironraid(&["stop", "busy"]);
    assert_refused(&out, &["1 NBD client connected", "unix:pid", "--force"]);
    // Still serving: the client's next write is accepted.
    client.command("write -P 0xcd 1M 1M", "wrote");
    client.command("read -P 0xcd 1M 1M", "read");
    assert_eq!(
        env.detail()["nbd_clients"].as_array().map(Vec::len),
        Some(1)
    );
    env.ok(&["stop", "busy", "--force"]);
    let st = { d }.child.wait().unwrap();
    assert!(st.success());
    let said = client.finish();
    assert!(!said.contains("verification failed"), "{said}");
    // What the client wrote before the forced stop was flushed and is there after a restart.
    let d = env.run_all();
    let check = sh(
        "qemu-io",
        &[
            "-f",
            "raw",
            &env.uri(),
            "-c",
            "read -P 0xab 0 1M",
            "-c",
            "read -P 0xcd 1M 1M",
        ],
    );
    assert!(!check.contains("verification failed"), "{check}");
    // With nobody connected a plain stop works (the client that just left is not counted).
    env.stop(d);
}

/// `ironraid run MEMBERS...`, which must exit on its own (a refusal); one that starts serving
/// is killed and the test fails.
fn run_expecting_refusal(env: &Env, members: &[PathBuf]) -> Output {
    let child = env
        .cmd()
        .arg("run")
        .args(members)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn ironraid run");
    let pid = child.id();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let ctl = env.rundir().join(format!("{}.ctl", env.name));
    while std::time::Instant::now() < deadline {
        if std::os::unix::net::UnixStream::connect(&ctl).is_ok() {
            let _ = Command::new("kill").arg(pid.to_string()).status();
            let _ = child.wait_with_output();
            panic!("`run` without every member started the array instead of refusing");
        }
        if std::fs::metadata(format!("/proc/{pid}/stat")).is_err() || exited(pid) {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

/// Whether `pid` (our child) is a zombie, i.e. has exited.
fn exited(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| {
            s.rsplit(')')
                .next()
                .is_some_and(|r| r.trim_start().starts_with('Z'))
        })
        .unwrap_or(true)
}

fn superblocks(members: &[PathBuf]) -> Vec<Vec<u8>> {
    members
        .iter()
        .map(|m| {
            let all = std::fs::read(m).unwrap();
            all[..(1 << 20)].to_vec()
        })
        .collect()
}

#[test]
fn run_refuses_a_forgotten_member_and_writes_nothing_unless_run() {
    let env = Env::new("forgot", 4, MEMBER);
    env.create("5", &[]);
    let d = env.run_all();
    env.stop(d);
    let given = &env.members[..3];
    let before = superblocks(&env.members);
    let out = run_expecting_refusal(&env, given);
    assert_refused(&out, &["3 of 4", "role 3", "--run"]);
    assert!(before == superblocks(&env.members), "a refused run wrote");
    // All four members: clean, nothing left out.
    let d = env.run_all();
    assert_eq!(env.detail()["state"], "clean");
    env.stop(d);
    // --run (md's word) starts it degraded; after that, the missing member is recorded faulty
    // and the three start again without --run.
    let d = env.run_with(&["--run"], given);
    assert_eq!(env.detail()["state"], "degraded");
    env.stop(d);
    let d = env.run(given);
    assert_eq!(env.detail()["state"], "degraded");
    env.stop(d);
}

/// Each level's first loss it cannot survive: failing members in order, `fail` refuses at
/// `refused_at` (index into the members) and `--force` then insists.
fn fail_refused(name: &str, level: &str, n: usize, refused_at: usize, extra: &[&str]) {
    let env = Env::new(name, n, MEMBER);
    env.create(level, extra);
    let d = env.run_all();
    sh(
        "qemu-io",
        &["-f", "raw", &env.uri(), "-c", "write -P 0x5a 0 1M"],
    );
    for m in &env.members[..refused_at] {
        env.ok(&["fail", name, m.to_str().unwrap()]);
    }
    let last = env.members[refused_at].to_str().unwrap();
    let out = env.ironraid(&["fail", name, last]);
    assert_refused(&out, &["refusing to fail", "would not survive", "--force"]);
    // Nothing changed: the data still reads back.
    assert_ne!(env.detail()["state"], "failed");
    sh(
        "qemu-io",
        &["-f", "raw", &env.uri(), "-c", "read -P 0x5a 0 1M"],
    );
    env.ok(&["fail", name, last, "--force"]);
    assert_eq!(env.detail()["state"], "failed");
    // Clients get EIO on a failed array, not EPERM.
    let out = Command::new("qemu-io")
        .args(["-f", "raw", &env.uri(), "-c", "write -P 0x11 0 64k"])
        .output()
        .unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(said.contains("Input/output error"), "{level}: {said}");
    assert!(!said.contains("not permitted"), "{level}: {said}");
    drop(d);
}

#[test]
fn fail_refuses_the_loss_each_level_cannot_survive() {
    if !require_tools(&["qemu-io"]) {
        return;
    }
    fail_refused("f6", "6", 4, 2, &[]);
    fail_refused("f1", "1", 2, 1, &[]);
    fail_refused("f5", "5", 3, 1, &[]);
    // RAID10 n2 over 4: members 0 and 1 hold the same chunks (one mirror set).
    fail_refused("f10", "10", 4, 1, &[]);
}
