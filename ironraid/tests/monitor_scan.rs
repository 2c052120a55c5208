//! One monitor for every array (issue 26 item 5): `monitor --scan` with `--oneshot`, `--test`,
//! `--mail` (a fake `sendmail` first on PATH) and `--program`, following arrays started after
//! it, a daemon that dies, and integrity repairs.

mod common;
use common::*;
use std::os::unix::fs::{FileExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;

/// A `sendmail` that files each message it is given with `-t` as `mail.N` in `dir`.
fn fake_sendmail(dir: &Path) -> PathBuf {
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let script = bin.join("sendmail");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\n[ \"$1\" = -t ] || exit 64\nn=$(ls {d} | grep -c '^mail\\.')\ncat > {d}/mail.$n\n",
            d = dir.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    bin
}

fn mails(dir: &Path) -> Vec<String> {
    let mut m: Vec<(u32, String)> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .filter_map(|e| {
            let n = e
                .file_name()
                .to_str()?
                .strip_prefix("mail.")?
                .parse()
                .ok()?;
            Some((n, std::fs::read_to_string(e.path()).unwrap()))
        })
        .collect();
    m.sort();
    m.into_iter().map(|(_, t)| t).collect()
}

fn path_with(bin: &Path) -> String {
    format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    )
}

/// Start a second array `name` over `members` in `env`'s run directory; waits until it serves.
fn run_other(env: &Env, name: &str, members: &[PathBuf]) -> Reap {
    let mut c = env.cmd();
    c.arg("run")
        .args(members)
        .stdin(Stdio::null())
        .stdout(Stdio::null());
    c.stderr(std::fs::File::create(env.dir.path().join(format!("{name}.log"))).unwrap());
    let child = c.spawn().unwrap();
    let ctl = env.rundir().join(format!("{name}.ctl"));
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::os::unix::net::UnixStream::connect(&ctl).is_err() {
        assert!(Instant::now() < deadline, "{name} did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    Reap(child)
}

fn create_named(env: &Env, level: &str, name: &str, members: &[PathBuf], extra: &[&str]) {
    let mut args = vec!["create", "--level", level, "--name", name, "--assume-clean"];
    args.extend(extra);
    let paths: Vec<String> = members.iter().map(|m| m.display().to_string()).collect();
    args.extend(paths.iter().map(String::as_str));
    env.ok(&args);
}

fn events(stdout: &str) -> Vec<(String, String, Option<String>)> {
    stdout
        .lines()
        .map(|l| {
            let v: serde_json::Value =
                serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}"));
            (
                v["event"].as_str().unwrap().to_string(),
                v["array"].as_str().unwrap().to_string(),
                v["member"].as_str().map(str::to_string),
            )
        })
        .collect()
}

#[test]
fn oneshot_test_reports_every_array_and_mails_through_sendmail() {
    let env = Env::new("good", 2, 16 * MIB);
    let bad: Vec<PathBuf> = (0..3)
        .map(|i| env.file(&format!("bad{i}.img"), 16 * MIB))
        .collect();
    let dead: Vec<PathBuf> = (0..2)
        .map(|i| env.file(&format!("dead{i}.img"), 16 * MIB))
        .collect();
    env.create("1", &[]);
    create_named(&env, "5", "bad", &bad, &[]);
    create_named(&env, "1", "dead", &dead, &[]);
    let good = env.run_all();
    let mut bad_d = run_other(&env, "bad", &bad);
    let mut dead_d = run_other(&env, "dead", &dead);
    env.ok(&["fail", "bad", &canon(&bad[2])]);
    dead_d.0.kill().unwrap();
    dead_d.0.wait().unwrap();
    let bin = fake_sendmail(env.dir.path());
    let out = env
        .cmd()
        .env("PATH", path_with(&bin))
        .env("IRONRAID_CONFIG", env.dir.path().join("absent.conf"))
        .args([
            "monitor",
            "--scan",
            "--oneshot",
            "--test",
            "--mail",
            "root@example.org",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let got = events(&String::from_utf8_lossy(&out.stdout));
    let want = [
        ("test_message", "bad", None),
        ("array_degraded", "bad", None),
        ("member_faulty", "bad", Some(canon(&bad[2]))),
        ("test_message", "good", None),
        ("daemon_gone", "dead", None),
    ];
    let want: Vec<(String, String, Option<String>)> = want
        .into_iter()
        .map(|(e, a, m)| (e.into(), a.into(), m))
        .collect();
    assert_eq!(got, want);
    let m = mails(env.dir.path());
    assert_eq!(m.len(), 5, "one mail per event: {m:#?}");
    assert!(
        m[0].starts_with("To: root@example.org\nSubject: ironraid test_message event on bad"),
        "{}",
        m[0]
    );
    assert!(
        m[2].contains(&format!("member_faulty event on bad {}", canon(&bad[2]))),
        "{}",
        m[2]
    );
    env.stop(good);
    env.ok(&["stop", "bad"]);
    assert!(bad_d.0.wait().unwrap().success());
}

#[test]
fn scan_follows_new_arrays_dead_daemons_and_integrity_repairs() {
    if !require_tools(&["qemu-io"]) {
        return;
    }
    let env = Env::new("first", 2, 16 * MIB);
    let late: Vec<PathBuf> = (0..3)
        .map(|i| env.file(&format!("late{i}.img"), 16 * MIB))
        .collect();
    env.create("1", &[]);
    create_named(
        &env,
        "5",
        "late",
        &late,
        &["--integrity", "crc32c", "--chunk", "64K"],
    );
    let first = env.run_all();
    let bin = fake_sendmail(env.dir.path());
    let hook_log = env.dir.path().join("hook.log");
    let hook = env.dir.path().join("hook.sh");
    std::fs::write(
        &hook,
        format!("#!/bin/sh\necho \"$1 $2\" >> {}\n", hook_log.display()),
    )
    .unwrap();
    std::fs::set_permissions(&hook, std::fs::Permissions::from_mode(0o755)).unwrap();
    // MAILADDR and PROGRAM come from the config.
    let cfg = env.dir.path().join("ironraid.conf");
    std::fs::write(
        &cfg,
        format!("MAILADDR ops@example.org\nPROGRAM {}\n", hook.display()),
    )
    .unwrap();
    let out_path = env.dir.path().join("monitor.out");
    let err_path = env.dir.path().join("monitor.err");
    let mut mon = Reap(
        env.cmd()
            .env("PATH", path_with(&bin))
            .args(["monitor", "--scan", "--config", cfg.to_str().unwrap()])
            .stdout(std::fs::File::create(&out_path).unwrap())
            .stderr(std::fs::File::create(&err_path).unwrap())
            .spawn()
            .unwrap(),
    );
    let wait_out = |what: &str| {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let text = std::fs::read_to_string(&out_path).unwrap_or_default();
            if text.contains(what) {
                return text;
            }
            assert!(
                Instant::now() < deadline,
                "no {what} in:\n{text}\nstderr:\n{}",
                std::fs::read_to_string(&err_path).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while !std::fs::read_to_string(&err_path)
        .unwrap_or_default()
        .contains("monitoring every array")
    {
        assert!(Instant::now() < deadline);
        std::thread::sleep(Duration::from_millis(20));
    }
    // An array started after the monitor.
    let late_d = run_other(&env, "late", &late);
    wait_out("\"new_array\",\"array\":\"late\"");
    // Damage a data block behind the daemon's back; the read repairs it and says so.
    let uri = format!(
        "nbd+unix:///late?socket={}",
        env.rundir().join("late.nbd").display()
    );
    sh("qemu-io", &["-f", "raw", &uri, "-c", "write -P 0x77 0 1M"]);
    let base = serde_json::from_str::<serde_json::Value>(&env.ok(&[
        "examine",
        "--json",
        late[0].to_str().unwrap(),
    ]))
    .unwrap()[0]["data_offset_sectors"]
        .as_u64()
        .unwrap()
        * 512;
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&late[0])
        .unwrap();
    f.write_all_at(&[0u8; 4096], base).unwrap();
    f.sync_all().unwrap();
    let read = sh("qemu-io", &["-f", "raw", &uri, "-c", "read -P 0x77 0 1M"]);
    assert!(!read.contains("verification failed"), "{read}");
    wait_out("\"integrity_repaired\",\"array\":\"late\"");
    // The first array's daemon dies.
    first.kill9();
    wait_out("\"daemon_gone\",\"array\":\"first\"");
    // The late array stops cleanly.
    let mut late_d = late_d;
    env.ok(&["stop", "late"]);
    late_d.0.wait().unwrap();
    let text = wait_out("\"array_stopped\",\"array\":\"late\"");
    // The monitor prints an event, then runs its hook: let the hook of the last one finish
    // before the monitor is killed (bounded; a missing line then fails the comparison below).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while std::fs::read_to_string(&hook_log).map_or(0, |h| h.lines().count()) < events(&text).len()
        && std::time::Instant::now() < deadline
    {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    mon.0.kill().unwrap();
    mon.0.wait().unwrap();
    let kinds: Vec<String> = events(&text)
        .into_iter()
        .map(|(e, a, _)| format!("{e} {a}"))
        .collect();
    let hooks = std::fs::read_to_string(&hook_log).unwrap();
    assert_eq!(
        hooks.lines().collect::<Vec<_>>(),
        kinds,
        "the hook ran once per event"
    );
    let m = mails(env.dir.path());
    let subjects: Vec<&str> = m.iter().filter_map(|t| t.lines().nth(1)).collect();
    assert!(
        subjects
            .iter()
            .any(|s| s.contains("integrity_repaired event on late")),
        "{subjects:?}"
    );
    assert!(
        subjects
            .iter()
            .any(|s| s.contains("daemon_gone event on first")),
        "{subjects:?}"
    );
    assert!(
        !subjects
            .iter()
            .any(|s| s.contains("new_array") || s.contains("array_stopped")),
        "informative events are not mailed: {subjects:?}"
    );
    assert!(m.iter().all(|t| t.starts_with("To: ops@example.org\n")));
}
