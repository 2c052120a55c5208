//! Assembly by config and scan (issue 26 item 3): `detail --scan` lines pasted into a config
//! with a DEVICE line are enough for `run --scan` to find the members by superblock UUID, in
//! any order, among foreign files and among the members of another array of the same name.

mod common;
use common::*;
use rand::seq::SliceRandom;
use rand::Rng;
use rand::SeedableRng;
use std::path::{Path, PathBuf};

const MIB: u64 = 1 << 20;

/// Stops arrays started by `run --scan` (detached daemons) even when an assertion fails.
struct StopOnDrop<'a>(&'a Env, Vec<&'static str>);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        for name in &self.1 {
            let _ = self.0.ironraid(&["stop", name]);
        }
    }
}

/// Wait until array `name`'s control socket answers.
fn wait_serving(env: &Env, name: &str) {
    let ctl = env.rundir().join(format!("{name}.ctl"));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while std::os::unix::net::UnixStream::connect(&ctl).is_err() {
        assert!(std::time::Instant::now() < deadline, "{name} did not start");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// `ironraid create` over `members` (plain, fresh) naming the array `name`; its UUID.
fn create(env: &Env, level: &str, name: &str, members: &[PathBuf]) -> String {
    let mut args = vec!["create", "--level", level, "--name", name, "--assume-clean"];
    let paths: Vec<String> = members.iter().map(|m| m.display().to_string()).collect();
    args.extend(paths.iter().map(String::as_str));
    env.ok(&args).trim().to_string()
}

fn qemu_io(env: &Env, name: &str, cmd: &str) {
    let uri = format!(
        "nbd+unix:///{name}?socket={}",
        env.rundir().join(format!("{name}.nbd")).display()
    );
    let out = sh("qemu-io", &["-f", "raw", &uri, "-c", cmd]);
    assert!(!out.contains("Pattern verification failed"), "{out}");
}

/// Move `files` into `pool` under names that hide their order.
fn scatter(files: &[PathBuf], pool: &Path, rng: &mut rand::rngs::StdRng) -> Vec<PathBuf> {
    let mut names: Vec<usize> = (0..files.len()).collect();
    names.shuffle(rng);
    files
        .iter()
        .zip(names)
        .map(|(f, n)| {
            let to = pool.join(format!("disk-{}-{n}.img", rng.gen_range(0..1_000_000)));
            std::fs::rename(f, &to).unwrap();
            to
        })
        .collect()
}

#[test]
fn run_scan_assembles_pasted_detail_scan_lines_from_scattered_members() {
    if !require_tools(&["qemu-io"]) {
        return;
    }
    let env = Env::new("r5", 4, 32 * MIB);
    let r1: Vec<PathBuf> = (0..2)
        .map(|i| env.file(&format!("r1-{i}.img"), 32 * MIB))
        .collect();
    // An old array that also calls itself r5, not in the config: its members must be left alone.
    let old: Vec<PathBuf> = (0..2)
        .map(|i| env.file(&format!("old-{i}.img"), 32 * MIB))
        .collect();
    let uuid5 = create(&env, "5", "r5", &env.members);
    let uuid1 = create(&env, "1", "r1", &r1);
    let uuid_old = create(&env, "1", "r5", &old);
    assert_ne!(uuid5, uuid_old);

    // Serve both the usual way, write data, take their ARRAY lines, stop them.
    let tcp = "tcp:127.0.0.1:0";
    let d5 = env.run(&env.members);
    let d1 = env.run_with(
        &[
            "--nbd",
            tcp,
            "--nbd",
            &format!("unix:{}", env.rundir().join("r1.nbd").display()),
        ],
        &r1,
    );
    wait_serving(&env, "r1");
    qemu_io(&env, "r5", "write -P 0x5a 0 3M");
    qemu_io(&env, "r1", "write -P 0x1e 1M 2M");
    let lines = env.ok(&["detail", "--scan"]);
    assert_eq!(lines.lines().count(), 2, "{lines}");
    let l5 = lines.lines().find(|l| l.contains("name=r5")).unwrap();
    assert!(
        l5.starts_with(&format!("ARRAY UUID={uuid5} name=r5")),
        "{lines}"
    );
    assert!(
        !l5.contains("nbd="),
        "the default socket needs no nbd=: {l5}"
    );
    let l1 = lines.lines().find(|l| l.contains("name=r1")).unwrap();
    assert!(
        l1.contains(&format!("UUID={uuid1}")) && l1.contains("nbd=tcp:127.0.0.1:"),
        "{l1}"
    );
    env.stop(d5);
    // Same name, same port: a fixed port makes the pasted line serve where it served.
    let mut d1 = d1;
    env.ok(&["stop", "r1"]);
    d1.child.wait().unwrap();

    // Scatter every member under random names among foreign files.
    let pool = env.dir.path().join("pool");
    std::fs::create_dir(&pool).unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(26);
    let all: Vec<PathBuf> = env.members.iter().chain(&r1).chain(&old).cloned().collect();
    let moved = scatter(&all, &pool, &mut rng);
    random_file(&pool.join("foreign-random.img"), 2 * MIB as usize, 7);
    std::fs::File::create(pool.join("foreign-sparse.img"))
        .unwrap()
        .set_len(32 * MIB)
        .unwrap();
    std::fs::write(pool.join("notes.txt"), "not a member\n").unwrap();
    std::fs::create_dir(pool.join("subdir.img")).unwrap();

    let cfg = env.dir.path().join("ironraid.conf");
    std::fs::write(
        &cfg,
        format!(
            "# pasted from detail --scan\nDEVICE {}/*\n{lines}MAILADDR root\n",
            pool.display()
        ),
    )
    .unwrap();
    let cfg_s = cfg.to_str().unwrap();

    // examine --scan finds all three arrays from the superblocks alone.
    let ex = env.ok(&["examine", "--scan", "--config", cfg_s]);
    for u in [&uuid5, &uuid1, &uuid_old] {
        assert!(
            ex.contains(&format!("ARRAY UUID={u} ")),
            "{u} missing:\n{ex}"
        );
    }
    assert!(ex.contains("level=raid5 num-devices=4"), "{ex}");

    let out = env.ok(&["run", "--scan", "--config", cfg_s]);
    let _guard = StopOnDrop(&env, vec!["r5", "r1"]);
    assert!(out.contains("array 'r5' started from 4 members"), "{out}");
    assert!(out.contains("array 'r1' started from 2 members"), "{out}");
    let d = env.detail();
    assert_eq!(d["uuid"], uuid5.as_str());
    assert_eq!(d["state"], "clean", "{d:#}");
    let mut want: Vec<String> = moved[..4].iter().map(|p| canon(p)).collect();
    let mut got: Vec<String> = d["members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["path"].as_str().unwrap().to_string())
        .collect();
    want.sort();
    got.sort();
    assert_eq!(got, want);
    qemu_io(&env, "r5", "read -P 0x5a 0 3M");
    qemu_io(&env, "r1", "read -P 0x1e 1M 2M");
    // One address for every array is refused before anything starts.
    let same = env.ironraid(&[
        "run",
        "--scan",
        "--config",
        cfg_s,
        "--metrics",
        "tcp:127.0.0.1:0",
    ]);
    assert_eq!(same.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&same.stderr).contains("put nbd= and metrics= on each ARRAY line")
    );
    // A second scan leaves running arrays alone and succeeds.
    let again = env.ok(&["run", "--scan", "--config", cfg_s]);
    assert!(again.is_empty(), "{again}");
    // The config may come from the environment too.
    let via_env = env
        .cmd()
        .env("IRONRAID_CONFIG", &cfg)
        .args(["examine", "--scan"])
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&via_env.stdout), ex);
}

#[test]
fn run_scan_names_what_it_cannot_find() {
    let env = Env::new("r1", 2, 16 * MIB);
    let cfg = env.dir.path().join("ironraid.conf");
    std::fs::write(
        &cfg,
        format!(
            "DEVICE {}/*.img\nARRAY UUID=01234567:89abcdef:01234567:89abcdef name=ghost\n",
            env.dir.path().display()
        ),
    )
    .unwrap();
    let out = env.ironraid(&["run", "--scan", "--config", cfg.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("ARRAY ghost: no member found on the DEVICE globs"),
        "{err}"
    );
    std::fs::write(&cfg, "ARRAY name=ghost\n").unwrap();
    let err = String::from_utf8_lossy(
        &env.ironraid(&["run", "--scan", "--config", cfg.to_str().unwrap()])
            .stderr,
    )
    .into_owned();
    assert!(err.contains("has no DEVICE line"), "{err}");
}

#[test]
fn an_mdadm_examine_scan_line_is_a_config_line_too() {
    if !require_tools(&["mdadm"]) {
        return;
    }
    let env = Env::new("vol", 2, 16 * MIB);
    let uuid = env.create("1", &[]);
    let mut args = vec!["--examine", "--scan"];
    let paths = env.member_args();
    args.extend(paths.iter().map(String::as_str));
    let md_line = sh("mdadm", &args);
    assert!(
        md_line.starts_with("ARRAY /dev/md/vol ") && md_line.contains(&uuid),
        "{md_line}"
    );
    let ours = env.ok(&["examine", "--scan", &paths[0], &paths[1]]);
    assert!(
        ours.starts_with(&format!("ARRAY UUID={uuid} name=vol ")),
        "{ours}"
    );
    let cfg = env.dir.path().join("ironraid.conf");
    std::fs::write(
        &cfg,
        format!("DEVICE {}/m*.img\n{md_line}", env.dir.path().display()),
    )
    .unwrap();
    let out = env.ok(&["run", "--scan", "--config", cfg.to_str().unwrap()]);
    let _guard = StopOnDrop(&env, vec!["vol"]);
    assert!(out.contains("array 'vol' started from 2 members"), "{out}");
    assert_eq!(env.detail()["state"], "clean");
}
