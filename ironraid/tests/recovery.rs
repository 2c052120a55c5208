//! Recovery end to end (issue 4): fail/remove/add on a running array, rebuild onto spares while
//! clients write, resync after a crash, check/repair scrubs, rate limits, and the event monitor.

mod common;

use common::{canon, member, member_state, random_file, require_tools, sh, Env};
use serde_json::Value;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;

/// The fio job of these tests: 2 jobs, iodepth 16, random 8 KiB writes with crc32c headers.
fn fio_args(env: &Env, size_mib: u64, extra: &[&str]) -> Vec<String> {
    let mut a: Vec<String> = [
        "--name=rebuild",
        "--ioengine=nbd",
        "--rw=randwrite",
        "--bs=8k",
        "--iodepth=16",
        "--numjobs=2",
        "--offset_increment=128m",
        "--verify=crc32c",
        "--verify_fatal=1",
        "--verify_state_save=0",
        "--group_reporting",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    a.push(format!("--uri={}", env.uri()));
    a.push(format!("--size={size_mib}m"));
    a.extend(extra.iter().map(|s| s.to_string()));
    a
}

fn fio_ok(out: &std::process::Output, what: &str) {
    let text = format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "fio {what} failed:\n{text}");
    assert!(text.contains("err= 0"), "fio {what}:\n{text}");
    assert!(!text.contains("verify: bad"), "fio {what}:\n{text}");
}

fn data_offset_bytes(env: &Env, p: &Path) -> u64 {
    env.examine(p)["data_offset_sectors"].as_u64().unwrap() * 512
}

/// Overwrite `len` bytes of member `p` at data byte `at` behind the array's back.
fn scribble(env: &Env, p: &Path, at: u64, len: usize) {
    let off = data_offset_bytes(env, p) + at;
    let mut f = std::fs::OpenOptions::new().write(true).open(p).unwrap();
    f.seek(SeekFrom::Start(off)).unwrap();
    f.write_all(&vec![0x5a; len]).unwrap();
    f.sync_all().unwrap();
}

#[test]
fn spare_rebuilds_under_fio_and_check_is_clean() {
    if !require_tools(&["fio"]) {
        return;
    }
    let env = Env::new("rb5", 4, 128 * MIB);
    let spare = env.file("spare.img", 128 * MIB);
    env.create("5", &["--chunk", "64K", "--spare", spare.to_str().unwrap()]);
    let mut all = env.members.clone();
    all.push(spare.clone());
    // The rebuild keeps going while the client writes (speed_min), slowly enough to overlap.
    let d = env.run_with(&["--speed-min", "12M", "--speed-max", "16M"], &all);
    assert_eq!(member_state(&env.detail(), &spare), "spare");
    let t0 = Instant::now();
    let fio = Command::new("fio")
        .args(fio_args(&env, 64, &["--do_verify=1"]))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn fio");
    std::thread::sleep(Duration::from_millis(500));
    env.ok(&["fail", "rb5", env.members[1].to_str().unwrap()]);
    let during = env.wait_detail("recovery to start", 10, |d| {
        d["sync"]["action"] == "recover" || member_state(d, &spare) == "in_sync"
    });
    assert_eq!(
        member_state(&during, &env.members[1]),
        "faulty",
        "{during:#}"
    );
    let out = fio.wait_with_output().unwrap();
    fio_ok(&out, "writing and verifying while the spare rebuilds");
    let after_fio = env.detail();
    eprintln!(
        "fio done after {:?}: recovery {} of {}",
        t0.elapsed(),
        after_fio["sync"]["done_bytes"],
        after_fio["sync"]["total_bytes"]
    );
    let d1 = env.wait_detail("the rebuild to finish", 30, |d| {
        member_state(d, &spare) == "in_sync" && d["sync"]["action"] == "idle"
    });
    assert!(
        matches!(d1["state"].as_str(), Some("clean" | "active")),
        "{d1:#}"
    );
    assert_eq!(member(&d1, &spare).unwrap()["role"], 1, "{d1:#}");
    env.ok(&["speed", "rb5", "--max", "1G"]);
    assert_eq!(env.action_wait("check"), 0);
    // The superblocks agree: the spare holds role 1 and is active. The failed member is no
    // longer written (as in md, its own superblock still says what it was, with older events).
    let ex = env.examine(&spare);
    assert_eq!(ex["role"], 1, "{ex:#}");
    assert_eq!(ex["device_role"], "active", "{ex:#}");
    assert_eq!(ex["array_state"], "AAAA", "{ex:#}");
    let failed = env.examine(&env.members[1]);
    assert!(
        failed["events"].as_u64() < ex["events"].as_u64(),
        "{failed:#} {ex:#}"
    );
    // Read everything back with another member gone, so the rebuilt chunks are used.
    env.ok(&["fail", "rb5", env.members[0].to_str().unwrap()]);
    let out = Command::new("fio")
        .args(fio_args(&env, 64, &["--verify_only"]))
        .output()
        .unwrap();
    fio_ok(&out, "verifying after the rebuild with member 0 failed");
    env.stop(d);
}

#[test]
fn killed_daemon_resyncs_in_background() {
    if !require_tools(&["fio", "qemu-io"]) {
        return;
    }
    let env = Env::new("crash5", 4, 256 * MIB);
    env.create("5", &["--chunk", "64K"]);
    let d = env.run_all();
    let uri = env.uri();
    let out = sh(
        "qemu-io",
        &["-f", "raw", &uri, "-c", "write -P 0xab 0 8M", "-c", "flush"],
    );
    assert!(out.contains("wrote"), "{out}");
    let mut fio = Command::new("fio")
        .args([
            "--name=crash",
            "--ioengine=nbd",
            &format!("--uri={uri}"),
            "--rw=randwrite",
            "--bs=64k",
            "--iodepth=16",
            "--offset=64m",
            "--size=256m",
            "--time_based",
            "--runtime=20",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    d.kill9();
    let _ = fio.kill();
    let _ = fio.wait();
    assert_eq!(env.examine(&env.members[0])["state"], "active");
    // A write torn by the crash: stripe 0's parity (member 3, left-symmetric) no longer
    // matches its data. The resync must rewrite it.
    scribble(&env, &env.members[3], 8192, 4096);
    let d = env.run_with(&["--speed-max", "4M"], &env.members);
    let first = env.detail();
    assert_eq!(first["state"], "resyncing", "{first:#}");
    assert_eq!(first["sync"]["action"], "resync", "{first:#}");
    let status = env.ok(&["status"]);
    assert!(status.contains("resync ="), "{status}");
    // A clean stop in the middle keeps the resync's checkpoint; the next run goes on from it.
    std::thread::sleep(Duration::from_millis(800));
    env.stop(d);
    assert_eq!(env.examine(&env.members[0])["state"], "active");
    let d = env.run_with(&["--speed-max", "4M"], &env.members);
    let resumed = env.detail();
    assert_eq!(resumed["sync"]["action"], "resync", "{resumed:#}");
    assert!(
        resumed["sync"]["done_bytes"].as_u64().unwrap() >= MIB,
        "the resync started over: {resumed:#}"
    );
    env.ok(&["speed", "crash5", "--max", "2G"]);
    let done = env.wait_detail("the resync to finish", 30, |d| {
        d["sync"]["action"] == "idle"
    });
    assert!(
        matches!(done["state"].as_str(), Some("clean" | "active")),
        "{done:#}"
    );
    assert_eq!(env.action_wait("check"), 0);
    let out = sh("qemu-io", &["-f", "raw", &uri, "-c", "read -P 0xab 0 8M"]);
    assert!(!out.contains("Pattern verification failed"), "{out}");
    env.stop(d);
    assert_eq!(env.examine(&env.members[0])["state"], "clean");
}

/// Write `len` random bytes at array byte 0 through NBD; returns them.
fn fill(env: &Env, len: usize, seed: u64) -> Vec<u8> {
    let src = env.dir.path().join(format!("src{seed}.bin"));
    random_file(&src, len, seed);
    sh("nbdcopy", &[src.to_str().unwrap(), &env.uri()]);
    std::fs::read(&src).unwrap()
}

fn read_back(env: &Env, len: usize) -> Vec<u8> {
    let back = env.dir.path().join("back.bin");
    let _ = std::fs::remove_file(&back);
    sh("nbdcopy", &[&env.uri(), back.to_str().unwrap()]);
    let mut v = Vec::new();
    std::fs::File::open(&back)
        .unwrap()
        .take(len as u64)
        .read_to_end(&mut v)
        .unwrap();
    v
}

/// Corrupt one 4 KiB page of `victim` (a parity chunk or a second copy), check, repair, check,
/// and read the data back with `gone` failed so the repaired page is used.
fn scrub_case(level: &str, n: usize, victim: usize, gone: usize, at: u64) {
    let env = Env::new(&format!("scrub{level}"), n, 64 * MIB);
    env.create(level, &["--chunk", "64K"]);
    let d = env.run_all();
    let want = fill(&env, 4 << 20, 11);
    env.stop(d);
    scribble(&env, &env.members[victim], at, 4096);
    let d = env.run_all();
    assert_eq!(env.action_wait("check"), 8, "one 4 KiB page = 8 sectors");
    assert_eq!(env.detail()["sync"]["last_action"], "check");
    assert_eq!(env.action_wait("repair"), 8);
    assert_eq!(env.action_wait("check"), 0);
    assert_eq!(env.action_wait("resync"), 0);
    assert!(read_back(&env, want.len()) == want, "{level}: data changed");
    env.ok(&["fail", &env.name, env.members[gone].to_str().unwrap()]);
    assert!(
        read_back(&env, want.len()) == want,
        "{level}: degraded read after repair differs"
    );
    env.stop(d);
}

#[test]
fn check_finds_and_repair_fixes_raid5_parity() {
    if !require_tools(&["nbdcopy"]) {
        return;
    }
    // Left-symmetric, 4 members: stripe 0 has data on members 0..2, parity on member 3.
    scrub_case("5", 4, 3, 0, 8192);
}

#[test]
fn check_finds_and_repair_fixes_raid1_copy() {
    if !require_tools(&["nbdcopy"]) {
        return;
    }
    // RAID1 repair copies the first copy over the others.
    scrub_case("1", 2, 1, 0, 12288);
}

/// Wait until `path` contains `needle`; returns the contents.
fn wait_file(path: &Path, needle: &str, secs: u64) -> String {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        if text.contains(needle) {
            return text;
        }
        assert!(
            Instant::now() < deadline,
            "{} never contained '{needle}':\n{text}",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn hook_script(env: &Env) -> (PathBuf, PathBuf) {
    use std::os::unix::fs::PermissionsExt;
    let log = env.dir.path().join("hook.log");
    let script = env.dir.path().join("hook.sh");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\necho \"$# $1 $2 $3\" >> {log}\necho \"$IRONRAID_EVENT\" >> {log}.json\n",
            log = log.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    (script, log)
}

#[test]
fn monitor_streams_events_and_runs_program() {
    let env = Env::new("mon5", 3, 64 * MIB);
    let spare = env.file("spare.img", 64 * MIB);
    env.create("5", &["--spare", spare.to_str().unwrap()]);
    let mut all = env.members.clone();
    all.push(spare.clone());
    let d = env.run(&all);
    let (script, log) = hook_script(&env);
    let out = env.dir.path().join("monitor.out");
    let err = env.dir.path().join("monitor.err");
    let mut mon = env
        .cmd()
        .args(["monitor", "mon5", "--program", script.to_str().unwrap()])
        .stdout(std::fs::File::create(&out).unwrap())
        .stderr(std::fs::File::create(&err).unwrap())
        .spawn()
        .unwrap();
    wait_file(&err, "monitoring array 'mon5'", 10);
    let m1 = canon(&env.members[1]);
    env.ok(&["fail", "mon5", &m1]);
    let hooks = wait_file(&log, "rebuild_finished", 30);
    let sp = canon(&spare);
    for line in [
        format!("3 member_faulty mon5 {m1}"),
        "2 array_degraded mon5 ".to_string(),
        format!("3 spare_active mon5 {sp}"),
        format!("3 rebuild_started mon5 {sp}"),
        format!("3 member_in_sync mon5 {sp}"),
        format!("3 rebuild_finished mon5 {sp}"),
    ] {
        assert!(hooks.lines().any(|l| l == line), "no '{line}' in:\n{hooks}");
    }
    let envs = std::fs::read_to_string(env.dir.path().join("hook.log.json")).unwrap();
    let first: Value = serde_json::from_str(envs.lines().next().unwrap()).unwrap();
    assert_eq!(first["event"], "member_faulty", "{envs}");
    assert_eq!(first["member"], m1.as_str(), "{envs}");
    // stdout: the same events, one JSON object per line, in order.
    let text = wait_file(&out, "rebuild_finished", 5);
    let kinds: Vec<String> = text
        .lines()
        .map(|l| {
            let v: Value = serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}"));
            assert_eq!(v["array"], "mon5");
            assert!(v["unix_ms"].as_u64().unwrap() > 0);
            v["event"].as_str().unwrap().to_string()
        })
        .collect();
    let pos = |k: &str| kinds.iter().position(|x| x == k).unwrap_or(usize::MAX);
    assert!(pos("member_faulty") < pos("rebuild_started"), "{kinds:?}");
    assert!(
        pos("rebuild_started") < pos("rebuild_finished"),
        "{kinds:?}"
    );
    assert!(pos("rebuild_finished") < usize::MAX, "{kinds:?}");
    // The monitor ends with the array.
    env.stop(d);
    let st = mon.wait().unwrap();
    assert!(st.success(), "monitor exit {st}");
}

#[test]
fn monitor_attaching_to_a_degraded_array_hears_so_first() {
    let env = Env::new("late5", 3, 64 * MIB);
    env.create("5", &[]);
    let d = env.run_all();
    env.ok(&["fail", "late5", env.members[2].to_str().unwrap()]);
    let late = env
        .cmd()
        .args(["monitor", "late5"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    env.stop(d);
    let late = late.wait_with_output().unwrap();
    assert!(late.status.success());
    let text = String::from_utf8_lossy(&late.stdout);
    let first: Value = serde_json::from_str(text.lines().next().unwrap_or("")).unwrap();
    assert_eq!(first["event"], "array_degraded", "{text}");
    assert_eq!(first["array"], "late5", "{text}");
    // Nothing but a usage error for a missing NAME; exit 1 for an array that is not running.
    assert_eq!(env.ironraid(&["monitor"]).status.code(), Some(2));
    assert_eq!(env.ironraid(&["monitor", "late5"]).status.code(), Some(1));
}

#[test]
fn add_and_remove_members() {
    if !require_tools(&["nbdcopy"]) {
        return;
    }
    let env = Env::new("mgmt5", 3, 64 * MIB);
    env.create("5", &["--chunk", "64K"]);
    let d = env.run_all();
    let want = fill(&env, 4 << 20, 5);
    let m = |i: usize| env.members[i].to_str().unwrap().to_string();
    env.ok(&["fail", "mgmt5", &m(1)]);
    assert_eq!(env.detail()["state"], "degraded");
    // Nothing to compare on a degraded array.
    let out = env.ironraid(&["action", "mgmt5", "check", "--wait"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("degraded"));
    // An active member cannot be removed; an unknown one neither.
    let out = env.ironraid(&["remove", "mgmt5", &m(0)]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("m0.img") && err.lines().count() == 1, "{err}");
    assert_eq!(
        env.ironraid(&["remove", "mgmt5", "/nonexistent/x.img"])
            .status
            .code(),
        Some(1)
    );
    env.ok(&["remove", "mgmt5", &m(1)]);
    assert_eq!(member_state(&env.detail(), &env.members[1]), "absent");
    // A new member becomes a spare, takes the missing role and rebuilds.
    let fresh = env.file("fresh.img", 64 * MIB);
    env.ok(&["add", "mgmt5", fresh.to_str().unwrap()]);
    let d1 = env.wait_detail("the new member to rebuild", 20, |d| {
        member_state(d, &fresh) == "in_sync"
    });
    assert_eq!(member(&d1, &fresh).unwrap()["role"], 1);
    let out = env.ironraid(&["add", "mgmt5", fresh.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1), "adding a member twice");
    // A disk of another array needs --force; then it is a spare.
    let other = Env::new("other", 2, 64 * MIB);
    other.create("1", &[]);
    let foreign = other.members[0].to_str().unwrap();
    let out = env.ironraid(&["add", "mgmt5", foreign]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--force"));
    env.ok(&["add", "mgmt5", foreign, "--force"]);
    assert_eq!(member_state(&env.detail(), &other.members[0]), "spare");
    env.ok(&["remove", "mgmt5", foreign]);
    // The rebuilt member serves its chunks: read with another member failed.
    env.ok(&["fail", "mgmt5", &m(2)]);
    assert!(read_back(&env, want.len()) == want, "rebuilt data differs");
    env.stop(d);
    assert_eq!(env.examine(&fresh)["role"], 1);
    // A level without redundancy takes no spares.
    let r0 = Env::new("r0", 2, 64 * MIB);
    r0.create("0", &[]);
    let d0 = r0.run_all();
    let spare = r0.file("s.img", 64 * MIB);
    assert_eq!(
        r0.ironraid(&["add", "r0", spare.to_str().unwrap()])
            .status
            .code(),
        Some(1)
    );
    r0.stop(d0);
}

#[test]
fn speed_limits_slow_a_rebuild_and_can_be_raised() {
    let env = Env::new("speed1", 2, 128 * MIB);
    let spare = env.file("spare.img", 128 * MIB);
    // Preallocated members keep every region in use: the rebuild has all of them to copy
    // (a fresh array of holes would have nothing to rebuild, nothing to pace).
    env.create("1", &["--spare", spare.to_str().unwrap(), "--preallocate"]);
    let mut all = env.members.clone();
    all.push(spare.clone());
    let d = env.run(&all);
    let shown = env.ok(&["speed", "speed1"]);
    assert!(
        shown.contains("speed_min 1000K/sec") && shown.contains("speed_max 200000K/sec"),
        "{shown}"
    );
    let shown = env.ok(&["speed", "speed1", "--max", "1M"]);
    assert!(shown.contains("speed_max 1024K/sec"), "{shown}");
    env.ok(&["fail", "speed1", env.members[0].to_str().unwrap()]);
    env.wait_detail("recovery to start", 10, |d| {
        d["sync"]["action"] == "recover"
    });
    std::thread::sleep(Duration::from_millis(2500));
    let slow = env.detail();
    assert_eq!(slow["state"], "recovering", "{slow:#}");
    assert_eq!(member_state(&slow, &spare), "rebuilding", "{slow:#}");
    let rate = slow["sync"]["rate_bytes_per_s"].as_u64().unwrap();
    let done = slow["sync"]["done_bytes"].as_u64().unwrap();
    assert!(rate > 0 && rate <= 3 * MIB / 2, "rate {rate}: {slow:#}");
    assert!(done <= 5 * MIB, "done {done} after ~2.5 s at 1M/s");
    // A rebuilding array is still degraded: `status` says so with its exit status.
    let out = env.ironraid(&["status"]);
    assert_eq!(out.status.code(), Some(1));
    let status = String::from_utf8_lossy(&out.stdout);
    assert!(
        status.contains("recovery =") && status.contains("(R)"),
        "{status}"
    );
    assert_eq!(
        env.ironraid(&["speed", "speed1", "--max", "fast"])
            .status
            .code(),
        Some(2)
    );
    env.ok(&["speed", "speed1", "--max", "2G", "--min", "2M"]);
    let d1 = env.wait_detail("the rebuild to finish", 20, |d| {
        member_state(d, &spare) == "in_sync"
    });
    assert_eq!(d1["sync"]["speed_max_bytes_per_s"], 2u64 << 30);
    assert_eq!(d1["sync"]["speed_min_bytes_per_s"], 2 * MIB);
    env.stop(d);
}
