//! Truthful status (issue 26 item 2): arrays whose daemon died are listed, `status` exits 1
//! while any array needs attention, rebuild ETAs count only what will be copied, and the
//! error messages name the real cause.

mod common;

use common::*;
use std::process::Output;

const MIB: u64 = 1 << 20;

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn status_lists_a_dead_daemon_and_exits_1_while_anything_needs_attention() {
    let env = Env::new("alive", 3, 32 * MIB);
    env.create("5", &[]);
    let d = env.run_all();
    let out = env.ironraid(&["status"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    // A degraded array: exit 1, one line naming it.
    env.ok(&["fail", "alive", env.members[2].to_str().unwrap()]);
    let out = env.ironraid(&["status"]);
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    assert!(stderr(&out).contains("alive degraded"), "{}", stderr(&out));
    d.kill9();
    // kill -9: the sockets stay, nobody answers; the array is listed, not forgotten.
    let out = env.ironraid(&["status"]);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        text.contains("alive : inactive (daemon gone)") && text.contains("alive.ctl"),
        "{text}"
    );
    assert!(stderr(&out).contains("alive inactive (daemon gone)"));
    let out = env.ironraid(&["status", "--json"]);
    let all: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(all[0]["name"], "alive", "{all:#}");
    assert_eq!(all[0]["state"], "inactive", "{all:#}");
    assert_eq!(all[0]["reason"], "daemon gone", "{all:#}");
    // The next run takes the stale sockets over; healthy again after the member is back.
    let d = env.run_with(&["--run"], &env.members[..2]);
    env.ok(&["add", "alive", env.members[2].to_str().unwrap()]);
    env.wait_detail("the rebuild", 60, |d| d["state"] == "clean");
    env.ok(&["status"]);
    env.stop(d);
}

#[test]
fn rebuild_eta_counts_only_used_regions() {
    if !require_tools(&["qemu-io"]) {
        return;
    }
    let env = Env::new("eta", 3, 128 * MIB);
    // Without --assume-clean: new sparse files start with every region unused.
    let mut args = vec!["create", "--level", "5", "--name", "eta"];
    let members = env.member_args();
    args.extend(members.iter().map(String::as_str));
    env.ok(&args);
    let d = env.run_with(&["--speed-min", "1M", "--speed-max", "1M"], &env.members);
    sh(
        "qemu-io",
        &["-f", "raw", &env.uri(), "-c", "write -P 0x3c 0 8M"],
    );
    env.ok(&["fail", "eta", env.members[0].to_str().unwrap()]);
    env.ok(&["remove", "eta", env.members[0].to_str().unwrap()]);
    let spare = env.file("spare.img", 128 * MIB);
    env.ok(&["add", "eta", spare.to_str().unwrap()]);
    // At 1 MiB/s the first 2 MiB window starts after 2 s, the second after 4 s: in between the
    // rebuild has a rate.
    let det = env.wait_detail("the rebuild to make progress", 20, |d| {
        d["sync"]["action"] == "recover" && d["sync"]["rate_bytes_per_s"].as_u64() > Some(0)
    });
    let sync = &det["sync"];
    let (done, total) = (
        sync["done_bytes"].as_u64().unwrap(),
        sync["total_bytes"].as_u64().unwrap(),
    );
    let left = sync["left_bytes"].as_u64().unwrap();
    // 8 MiB of array data is 4 MiB per member (plus the region rounding); the walk spans 128.
    assert!(total - done > 64 * MIB, "{det:#}");
    assert!(
        left <= 6 * MIB,
        "left {left} counts unused regions: {det:#}"
    );
    let out = env.ironraid(&["status"]);
    let text = stdout(&out);
    let finish: f64 = text
        .split("finish=")
        .nth(1)
        .and_then(|t| t.split("min").next())
        .and_then(|m| m.parse().ok())
        .unwrap_or_else(|| panic!("no finish= in: {text}"));
    // At ~1 MiB/s, at most 6 MiB left: a minute and a bit, not the 2 minutes the span gives.
    assert!(finish < 1.2, "finish={finish}min:\n{text}");
    env.ok(&["speed", "eta", "--max", "200M"]);
    env.wait_detail("the rebuild", 60, |d| d["state"] == "clean");
    env.stop(d);
}

#[test]
fn messages_name_the_real_cause() {
    let env = Env::new("msgs", 3, 64 * MIB);
    // Members of very different sizes: mdadm's 1 % warning.
    let small = env.file("small.img", 3 * MIB + 512 * 1024);
    let out = env.ironraid(&[
        "create",
        "--level",
        "1",
        "--name",
        "msgs",
        env.members[0].to_str().unwrap(),
        small.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("exceeds the smallest") && stderr(&out).contains("small.img"),
        "{}",
        stderr(&out)
    );
    let out = env.ironraid(&["create", "--help"]);
    assert!(stdout(&out).contains("RAID1/4/5/6/10"), "{}", stdout(&out));

    env.create("5", &["--force"]);
    let d = env.run_with(&["--speed-min", "1M", "--speed-max", "1M"], &env.members);
    // `add` of a member already in the array says so (not "in use by another process").
    let out = env.ironraid(&["add", "msgs", env.members[1].to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("already an active member of msgs"),
        "{}",
        stderr(&out)
    );
    // During a rebuild, `action check` does not send the user to `idle` (which restarts it).
    env.ok(&["fail", "msgs", env.members[1].to_str().unwrap()]);
    env.ok(&["remove", "msgs", env.members[1].to_str().unwrap()]);
    let spare = env.file("spare.img", 64 * MIB);
    env.ok(&["add", "msgs", spare.to_str().unwrap()]);
    env.wait_detail("the rebuild", 20, |d| d["sync"]["action"] == "recover");
    let out = env.ironraid(&["action", "msgs", "check"]);
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(
        err.contains("rebuilding") && !err.contains("request 'idle'"),
        "{err}"
    );
    drop(d);
}
