//! The shipped systemd units (issue 26 item 4), run as written: their `ExecStart=` lines with
//! systemd's own substitutions (`%i`, `$$`) and `/usr/bin/ironraid` pointing at the binary
//! under test; the run directory and config are the test's (the units' `Environment=` line and
//! the default config path are checked as text).

mod common;
use common::*;
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

const MIB: u64 = 1 << 20;

fn unit(name: &str) -> String {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../systemd")
        .join(name);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// The words of `unit`'s `ExecStart=`, as systemd splits them (single quotes group; `%i` is the
/// instance, `$$` a plain `$`), the binary replaced with the one under test.
fn exec_start(unit: &str, instance: &str) -> Vec<String> {
    let line = unit
        .lines()
        .find_map(|l| l.strip_prefix("ExecStart="))
        .expect("the unit has an ExecStart= line");
    let mut words = Vec::new();
    let mut rest = line.trim();
    while !rest.is_empty() {
        let (word, tail) = match rest.strip_prefix('\'') {
            Some(q) => q.split_once('\'').expect("closing quote"),
            None => rest.split_once(' ').unwrap_or((rest, "")),
        };
        words.push(
            word.replace("%i", instance)
                .replace("$$", "$")
                .replace("/usr/bin/ironraid", BIN),
        );
        rest = tail.trim_start();
    }
    words
}

fn command(words: &[String], env: &Env) -> Command {
    let mut c = Command::new(&words[0]);
    c.args(&words[1..]).env("IRONRAID_RUNDIR", env.rundir());
    c
}

fn recv(sock: &UnixDatagram) -> String {
    let mut buf = [0u8; 4096];
    let n = sock
        .recv(&mut buf)
        .expect("a notification within the timeout");
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

fn config(env: &Env, members: &[PathBuf], uuid: &str) -> PathBuf {
    let cfg = env.dir.path().join("ironraid.conf");
    let globs: Vec<String> = members.iter().map(|m| m.display().to_string()).collect();
    std::fs::write(
        &cfg,
        format!(
            "DEVICE {}\nARRAY UUID={uuid} name={}\n",
            globs.join(" "),
            env.name
        ),
    )
    .unwrap();
    cfg
}

#[test]
fn array_unit_notifies_ready_after_nbd_answers_and_stopping_on_sigterm() {
    if !require_tools(&["nbdinfo"]) {
        return;
    }
    let text = unit("ironraid@.service");
    for line in [
        "Type=notify",
        "Environment=IRONRAID_RUNDIR=/run/ironraid",
        "RuntimeDirectoryPreserve=yes",
    ] {
        assert!(
            text.lines().any(|l| l == line),
            "ironraid@.service lacks {line}"
        );
    }
    let env = Env::new("sd1", 2, 16 * MIB);
    let uuid = env.create("1", &[]);
    let cfg = config(&env, &env.members, &uuid);
    for notify in ["path", "abstract"] {
        let (sock, var) = match notify {
            "path" => {
                let p = env.dir.path().join("notify.sock");
                let _ = std::fs::remove_file(&p);
                (UnixDatagram::bind(&p).unwrap(), p.display().to_string())
            }
            _ => {
                use std::os::linux::net::SocketAddrExt;
                let name = format!("ironraid-test-{}", std::process::id());
                let addr = std::os::unix::net::SocketAddr::from_abstract_name(&name).unwrap();
                (UnixDatagram::bind_addr(&addr).unwrap(), format!("@{name}"))
            }
        };
        sock.set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        let log = env.dir.path().join(format!("unit-{notify}.log"));
        let mut daemon = Reap(
            command(&exec_start(&text, "sd1"), &env)
                .env("IRONRAID_CONFIG", &cfg)
                .env("NOTIFY_SOCKET", &var)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(std::fs::File::create(&log).unwrap())
                .spawn()
                .unwrap(),
        );
        let ready = recv(&sock);
        // No waiting: when READY=1 arrives, the export must already answer.
        let info = sh("nbdinfo", &[&env.uri()]);
        assert!(
            ready.starts_with("READY=1\nSTATUS=serving array sd1"),
            "{ready}"
        );
        assert!(info.contains("export-size"), "{info}");
        sh("kill", &["-TERM", &daemon.0.id().to_string()]);
        assert_eq!(recv(&sock), "STOPPING=1");
        let st = daemon.0.wait().unwrap();
        assert!(
            st.success(),
            "{st}: {}",
            std::fs::read_to_string(&log).unwrap()
        );
        assert!(!env.socket().exists(), "the NBD socket is removed at stop");
    }
}

#[test]
fn check_unit_checks_every_array_and_the_monitor_unit_sees_it() {
    let env = Env::new("sdc", 3, 16 * MIB);
    let other: Vec<PathBuf> = (0..2)
        .map(|i| env.file(&format!("o{i}.img"), 16 * MIB))
        .collect();
    env.create("5", &[]);
    env.ok(&[
        "create",
        "--level",
        "1",
        "--name",
        "sdo",
        "--assume-clean",
        other[0].to_str().unwrap(),
        other[1].to_str().unwrap(),
    ]);
    let d = env.run_all();
    let mut o = Reap(
        env.cmd()
            .arg("run")
            .args(&other)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !env.ok(&["status"]).contains("sdo") {
        assert!(std::time::Instant::now() < deadline, "sdo did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    let mon_out = env.dir.path().join("monitor.out");
    let _mon = Reap(
        command(&exec_start(&unit("ironraid-monitor.service"), ""), &env)
            .env("IRONRAID_CONFIG", env.dir.path().join("none.conf"))
            .stdout(std::fs::File::create(&mon_out).unwrap())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    std::thread::sleep(Duration::from_millis(500));
    let check = unit("ironraid-check.service");
    assert!(check.lines().any(|l| l == "Type=oneshot"));
    let out = command(&exec_start(&check, ""), &env).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for name in ["sdc", "sdo"] {
        let det: serde_json::Value =
            serde_json::from_str(&env.ok(&["detail", name, "--json"])).unwrap();
        assert_eq!(det["sync"]["last_action"], "check", "{name}: {det:#}");
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let mut seen = String::new();
    while !(seen.contains("\"check_finished\",\"array\":\"sdc\"")
        && seen.contains("\"check_finished\",\"array\":\"sdo\""))
    {
        assert!(std::time::Instant::now() < deadline, "monitor saw:\n{seen}");
        std::thread::sleep(Duration::from_millis(50));
        seen = std::fs::read_to_string(&mon_out).unwrap();
    }
    env.ok(&["stop", "sdo"]);
    assert!(o.0.wait().unwrap().success());
    env.stop(d);
    let timer = unit("ironraid-check.timer");
    assert!(
        timer
            .lines()
            .any(|l| l == "OnCalendar=Sun *-*-1..7 1:00:00"),
        "{timer}"
    );
}

#[test]
fn units_pass_systemd_analyze_verify() {
    if !require_tools(&["systemd-analyze"]) {
        return;
    }
    // verify checks that the binaries exist: point them at the one under test.
    let dir = tempfile::tempdir().unwrap();
    let mut paths = Vec::new();
    for name in [
        "ironraid@.service",
        "ironraid-monitor.service",
        "ironraid-check.service",
        "ironraid-check.timer",
    ] {
        let file = name.replace("@.", "@r5.");
        let p = dir.path().join(file);
        std::fs::write(&p, unit(name).replace("/usr/bin/ironraid", BIN)).unwrap();
        paths.push(p.display().to_string());
    }
    let mut args = vec!["verify".to_string(), "--man=no".into()];
    args.extend(paths);
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = Command::new("systemd-analyze")
        .args(&refs)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && err.trim().is_empty(),
        "{}\n{err}",
        out.status
    );
}
