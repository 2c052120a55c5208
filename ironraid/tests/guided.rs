//! `--consistency-policy guided` end to end: a daemon killed with -9 under writes comes back
//! waiting for a guide instead of resyncing; `guide ranges` ends the wait, `guide fallback`
//! or the guide timeout start the bitmap resync; a check then finds nothing, and what
//! clients wrote and saw acknowledged is there.

mod common;

use common::{random_file, require_tools, sh, Env};
use serde_json::Value;
use std::process::{Command, Stdio};
use std::time::Duration;

const MIB: u64 = 1 << 20;

fn guided_env(name: &str) -> Env {
    guided_env_level(name, "5")
}

fn guided_env_level(name: &str, level: &str) -> Env {
    let env = Env::new(name, 4, 64 * MIB);
    env.create(
        level,
        &[
            "--chunk",
            "64K",
            "--consistency-policy",
            "guided",
            "--bitmap-chunk",
            "1M",
        ],
    );
    env
}

/// Run the array, copy data into it with nbdcopy and kill -9 the daemon mid-copy: an unclean
/// stop with writes in flight.
fn crash_under_writes(env: &Env) {
    let d = env.run_all();
    let src = env.dir.path().join("src.bin");
    random_file(&src, (100 * MIB) as usize, 3);
    let mut copy = Command::new("nbdcopy")
        .args([src.to_str().unwrap(), &env.uri()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("nbdcopy");
    std::thread::sleep(Duration::from_millis(400));
    d.kill9();
    let _ = copy.wait();
}

fn guidance(d: &Value) -> Value {
    d["guidance"].clone()
}

#[test]
fn after_kill9_a_guided_array_waits_and_a_ranges_guide_ends_it() {
    kill9_then_a_ranges_guide("granges", "5");
}

/// The same on RAID10 (near 2 × 4), whose bitmap and used-region map count array bytes.
#[test]
fn after_kill9_a_guided_raid10_waits_and_a_ranges_guide_ends_it() {
    kill9_then_a_ranges_guide("granges10", "10");
}

fn kill9_then_a_ranges_guide(name: &str, level: &str) {
    assert!(require_tools(&["nbdcopy"]));
    let env = guided_env_level(name, level);
    crash_under_writes(&env);
    let d = env.run_with(&["--guide-timeout", "600"], &env.members);
    let det = env.detail();
    assert_eq!(det["consistency_policy"], "guided", "{det:#}");
    let g = guidance(&det);
    assert_eq!(g["state"], "awaiting", "{det:#}");
    assert!(g["window_bytes"].as_u64().unwrap() > 0, "{g:#}");
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(env.detail()["sync"]["action"], "idle", "the resync waits");
    let text = env.ok(&["status"]);
    assert!(text.contains("guidance: awaiting a guide"), "{text}");

    // An outside guide names everything (it knows nothing better): all of it is verified.
    let size = det["size_bytes"].as_u64().unwrap();
    let ranges = env.dir.path().join("ranges");
    std::fs::write(&ranges, format!("0 {size}\n")).unwrap();
    let out = env.ok(&[
        "guide",
        &env.name,
        "ranges",
        "--ranges",
        ranges.to_str().unwrap(),
        "--json",
    ]);
    let r: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(r["guide"], "ranges", "{r:#}");
    assert!(
        r["verify"]["bytes_verified"].as_u64().unwrap() >= size,
        "{r:#}"
    );
    let g = guidance(&env.detail());
    assert_eq!(g["state"], "guided", "{g:#}");
    assert_eq!(g["guide"], "ranges", "{g:#}");
    assert_eq!(env.action_wait("check"), 0);
    // A second guide has nothing left to end.
    let out = env.ironraid(&["guide", &env.name, "fallback"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("already ended"),
        "{out:?}"
    );
    env.stop(d);
}

#[test]
fn without_a_guide_the_bitmap_resync_runs_after_the_timeout_or_when_told() {
    assert!(require_tools(&["nbdcopy"]));
    let env = guided_env("gtimeout");
    crash_under_writes(&env);
    let d = env.run_with(&["--guide-timeout", "1"], &env.members);
    let det = env.wait_detail("the fallback resync", 60, |d| {
        guidance(d)["state"] == "fallback" && d["sync"]["action"] == "idle"
    });
    let g = guidance(&det);
    assert!(g["reason"].as_str().unwrap().contains("timeout"), "{g:#}");
    assert_eq!(det["sync"]["last_action"], "resync", "{det:#}");
    assert_eq!(env.action_wait("check"), 0);
    env.stop(d);

    let env = guided_env("gtold");
    crash_under_writes(&env);
    let d = env.run_with(&["--guide-timeout", "600"], &env.members);
    assert_eq!(guidance(&env.detail())["state"], "awaiting");
    let text = env.ok(&["guide", &env.name, "fallback"]);
    assert!(text.contains("bitmap resync runs"), "{text}");
    env.wait_detail("the resync", 60, |d| {
        d["sync"]["action"] == "idle" && d["sync"]["last_action"] == "resync"
    });
    assert_eq!(env.action_wait("check"), 0);
    env.stop(d);
}

#[test]
fn guided_is_refused_where_it_cannot_work_and_guides_say_why() {
    for (level, says) in [("0", "no redundancy"), ("linear", "no redundancy")] {
        let env = Env::new("grefuse", 4, 16 * MIB);
        let mut args = vec!["create", "--level", level, "--consistency-policy", "guided"];
        let members = env.member_args();
        args.extend(members.iter().map(|s| s.as_str()));
        let out = env.ironraid(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{level}: {err}");
        assert!(err.contains(says), "{level}: {err}");
    }
    // A clean guided array has nothing to guide; a bitmap array is not guided.
    let env = guided_env("gclean");
    let d = env.run_all();
    assert_eq!(guidance(&env.detail())["state"], "in_sync");
    let out = env.ironraid(&["guide", &env.name, "ext4"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("nothing to guide"),
        "{out:?}"
    );
    let out = env.ironraid(&["guide", &env.name, "ranges"]);
    assert_eq!(out.status.code(), Some(2), "ranges needs --ranges");
    env.stop(d);
    let env = Env::new("gbitmap", 4, 16 * MIB);
    env.create("5", &["--consistency-policy", "bitmap"]);
    let d = env.run_all();
    assert_eq!(env.detail()["guidance"], Value::Null);
    let out = env.ironraid(&["guide", &env.name, "fallback"]);
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("does not use the guided"),
        "{out:?}"
    );
    env.stop(d);
    // mdadm sees an ordinary bitmap array.
    if require_tools(&["mdadm"]) {
        let env = guided_env("gmdadm");
        let text = sh("mdadm", &["--examine", env.members[0].to_str().unwrap()]);
        assert!(text.contains("Internal Bitmap"), "{text}");
    }
}

/// The ext4 write watch (`run --guide ext4`) with no file system to follow: every write is one
/// no guide would find, so the members say so before it goes out, and a kill -9 then falls
/// back to the bitmap resync instead of trusting the guide. The counters say why.
#[test]
fn writes_the_ext4_watch_cannot_follow_make_a_crash_fall_back() {
    assert!(require_tools(&["qemu-io"]));
    let env = guided_env("gwatch");
    let d = env.run_with(&["--guide", "ext4"], &env.members);
    sh(
        "qemu-io",
        &[
            "-f",
            "raw",
            &env.uri(),
            "-c",
            "write -P 0x5a 8M 1M",
            "-c",
            "flush",
        ],
    );
    let det = env.detail();
    let g = guidance(&det);
    assert_eq!(g["unguided"], true, "{g:#}");
    let w = &g["watch"];
    assert_eq!(w["armed"], false, "{g:#}");
    assert!(
        w["disarmed_reason"].as_str().unwrap().contains("ext4"),
        "{g:#}"
    );
    assert!(
        w["nonconforming"]["unarmed"][0].as_u64().unwrap() >= 1,
        "{g:#}"
    );
    assert_eq!(w["conforming_writes"], 0, "{g:#}");
    d.kill9();

    let d = env.run_with(&["--guide", "ext4"], &env.members);
    let det = env.wait_detail("the fallback resync", 30, |d| {
        d["guidance"]["state"] == "fallback" && d["sync"]["action"] == "idle"
    });
    let g = guidance(&det);
    assert!(
        g["reason"].as_str().unwrap().contains("write watch"),
        "{g:#}\n{}",
        d.log_text()
    );
    assert_eq!(env.action_wait("check"), 0);
    let out = sh(
        "qemu-io",
        &["-f", "raw", &env.uri(), "-c", "read -P 0x5a 8M 1M"],
    );
    assert!(!out.contains("Pattern verification failed"), "{out}");
    env.stop(d);
}
