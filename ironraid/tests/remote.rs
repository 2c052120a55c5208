//! Remote members: arrays whose members are nbdkit exports (file plugin, Unix sockets), driven
//! by real clients (fio's nbd engine, qemu-io), with nbdkit's `delay` and `error` filters and
//! killed servers standing in for a slow, failing or flapping network disk.

mod common;

use common::*;
use serde_json::Value;
use std::io::{Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;
const MEMBER: u64 = 64 * MIB;

/// nbdkit serving one member file on a Unix socket; restartable with the same arguments.
struct Export {
    sock: PathBuf,
    args: Vec<String>,
    log: PathBuf,
    child: Option<Child>,
}

impl Export {
    /// `nbdkit -f -U SOCK FILTERS... file FILE PARAMS...` for `file`.
    fn start(file: &Path, filters: &[&str], params: &[&str]) -> Export {
        let mut args: Vec<String> = filters.iter().map(|f| format!("--filter={f}")).collect();
        args.push("file".into());
        args.push(file.display().to_string());
        args.extend(params.iter().map(|p| p.to_string()));
        let mut e = Export {
            sock: file.with_extension("sock"),
            log: file.with_extension("nbdkit.log"),
            args,
            child: None,
        };
        e.restart();
        e
    }

    fn restart(&mut self) {
        assert!(self.child.is_none(), "nbdkit already running");
        let _ = std::fs::remove_file(&self.sock);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap();
        let child = Command::new("nbdkit")
            .arg("-f")
            .arg("-U")
            .arg(&self.sock)
            .args(&self.args)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn nbdkit");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::os::unix::net::UnixStream::connect(&self.sock).is_err() {
            let exited = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten());
            assert!(
                exited.is_none(),
                "nbdkit {:?} exited: {exited:?}",
                self.args
            );
            assert!(
                Instant::now() < deadline,
                "nbdkit {:?} did not listen",
                self.args
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// SIGKILL: the server is gone with whatever it held.
    fn kill(&mut self) {
        let mut c = self.child.take().expect("nbdkit running");
        c.kill().unwrap();
        c.wait().unwrap();
    }

    fn uri(&self) -> String {
        format!("nbd+unix:///?socket={}", self.sock.display())
    }
}

impl Drop for Export {
    fn drop(&mut self) {
        if self.child.is_some() {
            self.kill();
        }
    }
}

/// An Env whose members are nbdkit exports of its member files; member `special` (if any)
/// gets `filters` and `params`.
fn remote_env(
    name: &str,
    n: usize,
    special: Option<usize>,
    filters: &[&str],
    params: &[&str],
) -> (Env, Vec<Export>) {
    let mut env = Env::new(name, n, MEMBER);
    let exports: Vec<Export> = env
        .members
        .iter()
        .enumerate()
        .map(|(i, f)| {
            if Some(i) == special {
                Export::start(f, filters, params)
            } else {
                Export::start(f, &[], &[])
            }
        })
        .collect();
    env.members = exports.iter().map(|e| PathBuf::from(e.uri())).collect();
    (env, exports)
}

/// fio through the array's NBD export: `rw` over `size` bytes with crc32c verification.
fn fio(env: &Env, rw: &str, size: &str, seed: u32) -> Command {
    let mut c = Command::new("fio");
    c.args([
        "--name=remote",
        "--ioengine=nbd",
        &format!("--uri={}", env.uri()),
        &format!("--rw={rw}"),
        "--bs=64k",
        &format!("--size={size}"),
        "--iodepth=8",
        "--verify=crc32c",
        "--do_verify=1",
        "--verify_fatal=1",
        &format!("--randseed={seed}"),
    ])
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    c
}

fn fio_ok(child: Child) {
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "fio failed ({}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("err= 0"), "{text}");
}

fn member_states(d: &Value) -> Vec<(String, String)> {
    d["members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            (
                m["path"].as_str().unwrap().to_string(),
                m["state"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

fn state_of(d: &Value, uri: &str) -> String {
    member_states(d)
        .into_iter()
        .find(|(p, _)| p == uri)
        .map(|(_, s)| s)
        .unwrap_or_else(|| format!("absent from {d:#}"))
}

/// A RAID0 of two member files and one nbdkit export: reads within the files' chunks are
/// spliced from their page caches, reads that reach the export fall back to the buffered path
/// after the file pieces went into the pipe (which must then be thrown away, not sent or
/// kept). nbdcopy gets back what it wrote either way.
#[test]
fn a_raid0_of_files_and_a_remote_member_reads_back_right() {
    if !require_tools(&["nbdkit", "nbdcopy"]) {
        return;
    }
    let mut env = Env::new("mixed0", 3, MEMBER);
    let export = Export::start(&env.members[2], &[], &[]);
    env.members[2] = PathBuf::from(export.uri());
    env.create("0", &["--chunk", "64K"]);
    let d = env.run_all();
    let src = env.dir.path().join("src.bin");
    let back = env.dir.path().join("back.bin");
    random_file(&src, 24 << 20, 11);
    sh("nbdcopy", &[src.to_str().unwrap(), &env.uri()]);
    // 64 KiB requests: two of every three lie on a file member; 1 MiB ones span all three.
    for size in ["65536", "1048576"] {
        sh(
            "nbdcopy",
            &[
                &format!("--request-size={size}"),
                &env.uri(),
                back.to_str().unwrap(),
            ],
        );
        let got = std::fs::read(&back).unwrap();
        assert!(
            got[..24 << 20] == std::fs::read(&src).unwrap()[..],
            "requests of {size}"
        );
    }
    let spliced = env.detail()["spliced_reads"].as_u64().unwrap();
    assert!(spliced > 0, "no read lay on the file members alone");
    env.stop(d);
}

/// Create, examine, run, fio verify, check: a RAID5 whose every member is an nbdkit export.
#[test]
fn an_array_of_remote_members_serves_verified_data() {
    if !require_tools(&["nbdkit", "fio", "mdadm"]) {
        return;
    }
    let (env, _exports) = remote_env("remote5", 4, None, &[], &[]);
    let uuid = env.create("5", &[]);
    // examine over NBD agrees with mdadm --examine of the export's backing file.
    let over_nbd = env.examine(&env.members[1]);
    let backing = env.dir.path().join("m1.img");
    let md = sh("mdadm", &["--examine", backing.to_str().unwrap()]);
    assert_eq!(mdadm_field(&md, "Array UUID"), uuid);
    assert_eq!(over_nbd["uuid"], uuid);
    assert_eq!(
        over_nbd["events"].as_u64().unwrap().to_string(),
        mdadm_field(&md, "Events")
    );
    assert_eq!(mdadm_field(&md, "Device Role"), "Active device 1");
    assert_eq!(over_nbd["role"], 1);
    let text = env.ok(&["examine", env.members[1].to_str().unwrap()]);
    assert!(text.contains(&uuid), "{text}");

    let d = env.run_all();
    let detail = env.detail();
    let uris: Vec<String> = env
        .members
        .iter()
        .map(|m| m.display().to_string())
        .collect();
    let paths: Vec<String> = member_states(&detail).into_iter().map(|(p, _)| p).collect();
    assert_eq!(paths, uris, "members are named by their URIs");
    let status = env.ok(&["status"]);
    assert!(status.contains(&uris[0]), "{status}");
    fio_ok(fio(&env, "randwrite", "96M", 1).spawn().unwrap());
    assert_eq!(env.action_wait("check"), 0);
    assert!(member_states(&env.detail())
        .iter()
        .all(|(_, s)| s == "in_sync"));
    env.stop(d);
}

/// One member slow (nbdkit delay filter), then failing every request (error filter, switched on
/// by its trigger file) under fio's load: the array degrades, fio sees no error and verifies
/// every block; the member, healthy again, is added back, rebuilt, and a check agrees.
#[test]
fn a_slow_then_failing_member_degrades_the_array_under_load_without_client_errors() {
    if !require_tools(&["nbdkit", "fio"]) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let trigger = dir.path().join("fail-now");
    let error_file = format!("error-file={}", trigger.display());
    let (env, _exports) = remote_env(
        "remoteslow",
        4,
        Some(2),
        &["error", "delay"],
        &[
            "delay-read=5ms",
            "delay-write=5ms",
            "error-rate=100%",
            &error_file,
        ],
    );
    env.create("5", &[]);
    let d = env.run_all();
    let slow = env.members[2].display().to_string();
    let mut load = fio(&env, "randwrite", "128M", 2).spawn().unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    assert!(
        load.try_wait().unwrap().is_none(),
        "fio ended before the member failed"
    );
    std::fs::write(&trigger, b"").unwrap();
    fio_ok(load);
    let detail = env.wait_detail("the failing member to be failed", 30, |d| {
        state_of(d, &slow) == "faulty"
    });
    assert_eq!(detail["state"], "degraded", "{detail:#}");
    // Everything reads back right from the survivors.
    fio_ok(fio(&env, "read", "128M", 2).spawn().unwrap());
    std::fs::remove_file(&trigger).unwrap();
    env.ok(&["remove", &env.name, &slow]);
    env.ok(&["add", &env.name, &slow]);
    env.wait_detail("the rebuild onto the member", 120, |d| {
        d["sync"]["action"] == "idle" && member_states(d).iter().all(|(_, s)| s == "in_sync")
    });
    assert_eq!(env.action_wait("check"), 0);
    env.stop(d);
}

/// A member's nbdkit killed under load and started again within `--member-retry`: the client
/// reconnects, re-sends what was not flushed, and the member is never failed.
#[test]
fn a_member_server_restarted_within_the_retry_window_is_kept() {
    if !require_tools(&["nbdkit", "fio"]) {
        return;
    }
    let (env, mut exports) = remote_env("remoteflap", 4, None, &[], &[]);
    env.create("5", &[]);
    let d = env.run_with(&["--member-retry", "30s"], &env.members);
    let mut load = fio(&env, "randwrite", "128M", 3).spawn().unwrap();
    std::thread::sleep(Duration::from_millis(700));
    exports[1].kill();
    std::thread::sleep(Duration::from_secs(2));
    exports[1].restart();
    assert!(
        load.try_wait().unwrap().is_none(),
        "fio ended before the server came back"
    );
    fio_ok(load);
    let detail = env.detail();
    assert!(
        member_states(&detail).iter().all(|(_, s)| s == "in_sync"),
        "{detail:#}"
    );
    // "clean" once the array has been idle for the safe-mode delay, "active" before.
    assert!(
        matches!(detail["state"].as_str(), Some("clean" | "active")),
        "{detail:#}"
    );
    assert_eq!(env.action_wait("check"), 0);
    let log = env.stop(d);
    assert!(
        log.contains("reconnected"),
        "the kill went unnoticed:\n{log}"
    );
}

/// A member's nbdkit gone past `--member-retry`: the member is failed (the client's write
/// succeeds on the survivors), and once its server is back it is added back and recovers only
/// what the bitmap says it missed: a page changed behind the array's back in a chunk nobody
/// wrote meanwhile is not rewritten (a full rebuild would have), the chunk written while it
/// was out is.
#[test]
fn a_member_server_gone_past_the_retry_window_is_failed_then_readded_by_bitmap() {
    if !require_tools(&["nbdkit", "qemu-io"]) {
        return;
    }
    let (env, mut exports) = remote_env("remotegone", 4, None, &[], &[]);
    env.create(
        "5",
        &["--consistency-policy", "bitmap", "--bitmap-chunk", "1M"],
    );
    let retry = ["--member-retry", "1s", "--member-timeout", "1s"];
    let d = env.run_with(&retry, &env.members);
    let uri = env.uri();
    let io = |cmd: &str| sh("qemu-io", &["-f", "raw", &uri, "-c", cmd]);
    assert!(io("write -P 0x11 0 150M").contains("wrote"));
    env.stop(d); // a clean stop clears the bits
    let d = env.run_with(&retry, &env.members);
    let gone = env.members[2].display().to_string();
    exports[2].kill();
    assert!(io("write -P 0x22 60M 1M").contains("wrote"));
    let detail = env.wait_detail("the gone member to be failed", 30, |d| {
        state_of(d, &gone) == "faulty"
    });
    assert_eq!(detail["state"], "degraded", "{detail:#}");
    // Member byte 40M of m2 (array 120M, a bitmap chunk not written while it was out).
    scribble_member(&env, 2, 40 * MIB);
    exports[2].restart();
    env.ok(&["remove", &env.name, &gone]);
    env.ok(&["add", &env.name, &gone]);
    let done = env.wait_detail("the re-add's recovery", 60, |d| {
        d["sync"]["action"] == "idle" && member_states(d).iter().all(|(_, s)| s == "in_sync")
    });
    assert_eq!(done["sync"]["last_action"], "recover", "{done:#}");
    assert_eq!(
        env.action_wait("check"),
        8,
        "only the page changed behind the array's back (in a clean chunk) may disagree"
    );
    env.action_wait("repair");
    assert_eq!(env.action_wait("check"), 0);
    let out = io("read -P 0x22 60M 1M");
    assert!(!out.contains("Pattern verification failed"), "{out}");
    let out = io("read -P 0x11 0 60M");
    assert!(!out.contains("Pattern verification failed"), "{out}");
    env.stop(d);
}

/// Change a page of member `i`'s backing file at data byte `at`, behind the array's back.
fn scribble_member(env: &Env, i: usize, at: u64) {
    let file = env.dir.path().join(format!("m{i}.img"));
    let sectors = env.examine(&file)["data_offset_sectors"].as_u64().unwrap();
    let mut f = std::fs::OpenOptions::new().write(true).open(&file).unwrap();
    f.seek(SeekFrom::Start(sectors * 512 + at)).unwrap();
    f.write_all(&[0x5a; 4096]).unwrap();
    f.sync_all().unwrap();
}

/// Another ironraid's export as a member: our client against our own server (block sizes,
/// multi-conn, FUA and flush as the server advertises them), fio verify and a check through
/// the outer array.
#[test]
fn an_ironraid_export_serves_as_a_member_of_another_array() {
    if !require_tools(&["fio"]) {
        return;
    }
    let inner = Env::new("inner", 2, MEMBER);
    inner.create("1", &[]);
    let inner_daemon = inner.run_all();
    let mut outer = Env::new("outer", 2, MEMBER);
    outer.members[1] = PathBuf::from(inner.uri());
    outer.create("1", &[]);
    let d = outer.run_all();
    fio_ok(fio(&outer, "randwrite", "32M", 4).spawn().unwrap());
    assert_eq!(outer.action_wait("check"), 0);
    let detail = outer.detail();
    assert_eq!(state_of(&detail, &inner.uri()), "in_sync", "{detail:#}");
    outer.stop(d);
    assert_eq!(inner.action_wait("check"), 0);
    inner.stop(inner_daemon);
}

/// A CA and a certificate for `localhost` in `dir`, under nbdkit's and libnbd's file names.
fn make_tls_certs(dir: &Path) {
    let openssl = |args: &[&str]| {
        let out = Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .output()
            .expect("run openssl");
        assert!(
            out.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    openssl(&[
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "2",
        "-subj",
        "/CN=test CA",
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign,cRLSign",
        "-keyout",
        "ca-key.pem",
        "-out",
        "ca-cert.pem",
    ]);
    std::fs::write(dir.join("server.ext"), "subjectAltName=DNS:localhost\n").unwrap();
    openssl(&[
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-subj",
        "/CN=localhost",
        "-keyout",
        "server-key.pem",
        "-out",
        "server.csr",
    ]);
    openssl(&[
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca-cert.pem",
        "-CAkey",
        "ca-key.pem",
        "-CAcreateserial",
        "-days",
        "2",
        "-extfile",
        "server.ext",
        "-out",
        "server-cert.pem",
    ]);
}

/// Members that only speak TLS (`nbdkit --tls=require`): `create` and `examine` with the
/// certificates in the URI (`tls-certificates=DIR`), `run` with plain `nbds+unix` URIs and
/// the CA as `--member-tls-ca`; fio verifies through the array and a check agrees.
/// Canary: `run` without `--member-tls-ca` fails (the system's CAs do not know the test CA).
#[test]
fn members_over_tls_with_the_ca_in_the_uri_or_given_to_run() {
    if !require_tools(&["nbdkit", "fio", "openssl"]) {
        return;
    }
    let mut env = Env::new("remotetls", 2, MEMBER);
    let certs = env.dir.path().join("pki");
    std::fs::create_dir(&certs).unwrap();
    make_tls_certs(&certs);
    let exports: Vec<Export> = env
        .members
        .iter()
        .map(|f| {
            let mut e = Export {
                sock: f.with_extension("sock"),
                log: f.with_extension("nbdkit.log"),
                args: vec![
                    "--tls=require".into(),
                    format!("--tls-certificates={}", certs.display()),
                    "file".into(),
                    f.display().to_string(),
                ],
                child: None,
            };
            e.restart();
            e
        })
        .collect();
    let tls_uri = |e: &Export, dir: bool| {
        let mut u = format!("nbds+unix:///?socket={}", e.sock.display());
        if dir {
            u += &format!("&tls-certificates={}", certs.display());
        }
        PathBuf::from(u)
    };
    env.members = exports.iter().map(|e| tls_uri(e, true)).collect();
    let uuid = env.create("1", &[]);
    assert_eq!(env.examine(&env.members[0])["uuid"], uuid);
    let plain: Vec<PathBuf> = exports.iter().map(|e| tls_uri(e, false)).collect();
    let without_ca = env.try_run_with(&[], &plain);
    assert!(without_ca.is_err(), "run trusted a CA it was not given");
    let ca = certs.join("ca-cert.pem");
    let d = env.run_with(&["--member-tls-ca", ca.to_str().unwrap()], &plain);
    fio_ok(fio(&env, "randwrite", "32M", 5).spawn().unwrap());
    assert_eq!(env.action_wait("check"), 0);
    env.stop(d);
}

/// Members 0, 2, … keep their writes in a write-back cache until a flush (nbdkit's cache
/// filter, `cache=writeback`): killing their servers loses what they had not flushed, as a
/// power cut loses a disk's volatile cache. Members 1, 3, … write through, so a write in flight
/// at a cut lands on some members of its stripe and not on others: the cut tears rows.
fn cached_members_env(name: &str, n: usize) -> (Env, Vec<Export>) {
    let mut env = Env::new(name, n, 16 * MIB);
    let exports: Vec<Export> = env
        .members
        .iter()
        .enumerate()
        .map(|(i, f)| match i % 2 {
            0 => Export::start(f, &["cache"], &["cache=writeback"]),
            _ => Export::start(f, &[], &[]),
        })
        .collect();
    env.members = exports.iter().map(|e| PathBuf::from(e.uri())).collect();
    (env, exports)
}

/// One array's power cuts (see [`power_cuts`]).
#[derive(Clone, Copy, Default)]
struct Cuts<'a> {
    level: &'a str,
    members: usize,
    /// More `create` arguments.
    extra: &'a [&'a str],
    /// A journal of this mode, its log on a cached export too.
    journal: Option<&'a str>,
    /// The writers flush every round (otherwise acknowledged writes are not durable).
    flushing: bool,
    /// After the first cut, start without member 1 (`--run`, or `--force` where md refuses a
    /// dirty degraded start), then add it back. A forced start is the last cut: what it could
    /// not rebuild stays unknown (read errors, or garbage without a bitmap or journal).
    degraded_after: Option<&'a str>,
}

/// Power cuts from outside, three per array: the sixteen writers run with a flush after every
/// round, and the daemon and every member server are killed at once, the members' unflushed
/// writes lost with their caches. Started again, the array holds every write of every flushed
/// round, each byte written since holds one of the values written to it since, and once the
/// restart's resync is done the redundancy agrees. Returns the cuts after which a byte held
/// what no write explains (panics on one if the writers flushed, unless `--force` was needed).
fn power_cuts(c: Cuts<'_>) -> usize {
    let Cuts {
        level,
        members: n,
        extra,
        journal,
        flushing,
        degraded_after,
    } = c;
    let (mut env, mut exports) = cached_members_env(&format!("cut{level}{flushing}"), n);
    let data = n - if level == "6" { 2 } else { 1 };
    let hot = writers::ROWS * data * writers::CHUNK;
    let mut create: Vec<String> = [
        "create", "--level", level, "--name", &env.name, "--chunk", "64K",
    ]
    .iter()
    .chain(extra)
    .map(|a| a.to_string())
    .collect();
    // Integrity needs members it knows the contents of: no --assume-clean, create zeroes them.
    if !extra.contains(&"--integrity") {
        create.push("--assume-clean".into());
    }
    if let Some(mode) = journal {
        // The log on a cached export too: a cut loses what it had not flushed as well.
        let log = Export::start(
            &env.file("log.img", 64 * MIB),
            &["cache"],
            &["cache=writeback"],
        );
        create
            .extend(["--consistency-policy", "journal", "--journal", &log.uri()].map(String::from));
        create.extend(["--journal-mode", mode].map(String::from));
        exports.push(log);
    }
    create.extend(env.member_args());
    env.ok(&create.iter().map(String::as_str).collect::<Vec<_>>());
    if let Some(log) = exports.get(n) {
        env.members.push(PathBuf::from(log.uri()));
    }
    let mut before = vec![0u8; hot];
    let mut unexplained = 0;
    for cut in 0..3u64 {
        let d = env.run_all();
        let w = cut_under_writers(&env, d, &mut exports, &before, cut, flushing);
        eprintln!(
            "RAID{level} cut {cut}: {} rounds, {} of them not kept, {} writes unanswered",
            w.rounds,
            w.maybe.len(),
            w.unanswered_writes
        );
        exports.iter_mut().for_each(Export::restart);
        // The first cut is followed by a member loss: the array comes back without member 1
        // (md's --run), its reads rebuilt from what the cut left of parity, then gets it back.
        let lost = degraded_after
            .filter(|_| cut == 0)
            .map(|_| env.members[1].clone());
        let running: Vec<PathBuf> = env
            .members
            .iter()
            .filter(|m| Some(*m) != lost.as_ref())
            .cloned()
            .collect();
        let start: &[&str] = match degraded_after {
            Some(flag) if lost.is_some() => &[flag],
            _ => &[],
        };
        let d = env.run_with(start, &running);
        env.wait_detail("the restart's resync", 120, |d| {
            d["sync"]["action"] == "idle"
        });
        let forced = lost.is_some() && degraded_after == Some("--force");
        let (got, refused) = read_back(&env, &w);
        assert!(
            refused == 0 || forced,
            "cut {cut}: {refused} blocks refused"
        );
        if let Some(at) = writers::unexplained(&got, &w) {
            assert!(
                !flushing || forced,
                "cut {cut}: byte {at} holds what no write explains ({} rounds, member lost: {lost:?})",
                w.rounds
            );
            unexplained += 1;
        }
        eprintln!("RAID{level} cut {cut}: {refused} blocks refused");
        if let Some(m) = &lost {
            env.ok(&["add", &env.name, m.to_str().unwrap()]);
            env.wait_detail("the lost member's rebuild", 120, |d| {
                d["sync"]["action"] == "idle" && state_of(d, m.to_str().unwrap()) == "in_sync"
            });
        }
        assert_eq!(
            env.check_when_settled(),
            0,
            "cut {cut}: redundancy disagrees after the resync"
        );
        if forced {
            rewrite_clears_read_errors(&env, hot);
        }
        env.stop(d);
        if forced {
            // What the forced start could not rebuild stays unknown (read errors, or garbage
            // without a bitmap): no model for more cuts.
            break;
        }
        before = got;
    }
    unexplained
}

/// Every block of the hot area that reads as an error reads back what is written over it: a
/// rewrite clears what a forced start left unreadable.
fn rewrite_clears_read_errors(env: &Env, hot: usize) {
    let mut c = common::raw_client::Client::connect(&env.socket(), &env.name);
    let bad: Vec<u64> = (0..(hot / writers::BLOCK) as u64)
        .map(|b| b * writers::BLOCK as u64)
        .filter(|&at| c.try_read(at, writers::BLOCK).is_err())
        .collect();
    let fresh: Vec<(u64, Vec<u8>)> = bad
        .iter()
        .map(|&at| (at, vec![0x6d; writers::BLOCK]))
        .collect();
    c.write_all(&fresh);
    for (at, data) in &fresh {
        assert!(
            c.read(*at, writers::BLOCK) == *data,
            "block at {at} after its rewrite"
        );
    }
    eprintln!("{} unreadable blocks rewritten and read back", bad.len());
}

/// The hot area read back block by block: blocks that read fail with an error come back as
/// what the model says (an error is never wrong data); also how many did.
fn read_back(env: &Env, w: &writers::Written) -> (Vec<u8>, usize) {
    let mut c = common::raw_client::Client::connect(&env.socket(), &env.name);
    let mut refused = 0;
    let got = w
        .model
        .chunks(writers::BLOCK)
        .enumerate()
        .flat_map(|(b, want)| {
            c.try_read((b * writers::BLOCK) as u64, writers::BLOCK)
                .unwrap_or_else(|_| {
                    refused += 1;
                    want.to_vec()
                })
        })
        .collect();
    (got, refused)
}

/// The writers from `before` until a cut 25, 5 or 15 ms into round 2 + `cut`: the daemon `d`, serving,
/// killed with every member server at once. Returns what they wrote.
fn cut_under_writers(
    env: &Env,
    d: Daemon,
    exports: &mut [Export],
    before: &[u8],
    cut: u64,
    flushing: bool,
) -> writers::Written {
    let sock = env.socket();
    let servers = [(sock.as_path(), env.name.as_str())];
    let reached = std::sync::atomic::AtomicUsize::new(0);
    let more = |r: usize| {
        reached.store(r, std::sync::atomic::Ordering::SeqCst);
        r < 1000
    };
    let w = std::thread::scope(|s| {
        let writing = s.spawn(|| {
            if flushing {
                writers::write_flushing_concurrently(&servers, before, more)
            } else {
                writers::write_concurrently(&servers, before, more)
            }
        });
        while reached.load(std::sync::atomic::Ordering::SeqCst) < 2 + cut as usize {
            std::thread::sleep(Duration::from_millis(1));
        }
        std::thread::sleep(Duration::from_millis([25, 5, 15][cut as usize]));
        d.kill9();
        exports.iter_mut().for_each(Export::kill);
        writing.join().unwrap()
    });
    assert!(w.rounds < 1000, "the writers outran the cut");
    w
}

#[test]
fn power_cuts_under_sixteen_flushing_writers_keep_every_flushed_write_on_raid5() {
    if !require_tools(&["nbdkit"]) {
        return;
    }
    power_cuts(Cuts {
        level: "5",
        members: 4,
        flushing: true,
        ..Cuts::default()
    });
}

#[test]
fn power_cuts_under_sixteen_flushing_writers_keep_every_flushed_write_on_raid6_with_a_bitmap() {
    if !require_tools(&["nbdkit"]) {
        return;
    }
    power_cuts(Cuts {
        level: "6",
        members: 5,
        extra: &["--consistency-policy", "bitmap"],
        flushing: true,
        ..Cuts::default()
    });
}

#[test]
fn power_cuts_under_sixteen_flushing_writers_keep_every_flushed_write_with_a_write_back_log() {
    if !require_tools(&["nbdkit"]) {
        return;
    }
    power_cuts(Cuts {
        level: "5",
        members: 4,
        journal: Some("write-back"),
        flushing: true,
        degraded_after: Some("--run"),
        ..Cuts::default()
    });
}

/// A cut and then a member lost: the write hole, which the journal closes.
#[test]
fn a_power_cut_then_a_lost_member_keeps_every_flushed_write_with_a_write_through_log() {
    if !require_tools(&["nbdkit"]) {
        return;
    }
    power_cuts(Cuts {
        level: "5",
        members: 4,
        journal: Some("write-through"),
        flushing: true,
        degraded_after: Some("--run"),
        ..Cuts::default()
    });
}

#[test]
fn power_cuts_under_sixteen_flushing_writers_keep_every_flushed_write_with_integrity() {
    if !require_tools(&["nbdkit"]) {
        return;
    }
    power_cuts(Cuts {
        level: "5",
        members: 4,
        extra: &["--integrity", "crc32c"],
        flushing: true,
        ..Cuts::default()
    });
}

/// The canary: without the flushes, the same cuts lose acknowledged writes (the members'
/// caches are really dropped, and the check above sees it).
#[test]
fn power_cuts_without_flushes_lose_acknowledged_writes() {
    if !require_tools(&["nbdkit"]) {
        return;
    }
    let lost = power_cuts(Cuts {
        level: "5",
        members: 4,
        ..Cuts::default()
    });
    assert!(
        lost > 0,
        "no cut lost an acknowledged write: the members' caches kept them"
    );
}

/// The canary of the journal tests: without a journal, the same cut followed by a lost member
/// (a start md refuses; `--force` takes the risk) hits the write hole: blocks of the lost
/// member rebuilt from parity the cut tore read as what no write wrote.
#[test]
fn without_a_journal_a_power_cut_then_a_lost_member_opens_the_write_hole() {
    if !require_tools(&["nbdkit"]) {
        return;
    }
    let torn = power_cuts(Cuts {
        level: "5",
        members: 4,
        flushing: true,
        degraded_after: Some("--force"),
        ..Cuts::default()
    });
    assert!(
        torn > 0,
        "the cut tore no row the lost member's blocks are rebuilt from"
    );
}

/// With a bitmap instead of a journal, the same forced start knows which rows the cut may have
/// torn (the bitmap's dirty chunks): blocks rebuilt from them are refused, never wrong.
#[test]
fn with_a_bitmap_a_power_cut_then_a_lost_member_refuses_what_the_write_hole_tore() {
    if !require_tools(&["nbdkit"]) {
        return;
    }
    let wrong = power_cuts(Cuts {
        level: "5",
        members: 4,
        extra: &["--consistency-policy", "bitmap"],
        flushing: true,
        degraded_after: Some("--force"),
        ..Cuts::default()
    });
    assert_eq!(wrong, 0, "a forced start read what no write wrote");
}
