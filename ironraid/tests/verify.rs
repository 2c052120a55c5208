//! `ironraid verify` end to end: parity damaged inside a member file behind the running daemon's
//! back is found and rewritten exactly when a verified range covers it, the data clients read
//! never changes, many ranges go in one call, and bad requests get one-line errors.

mod common;

use common::{random_file, require_tools, sh, Env};
use serde_json::Value;
use std::os::unix::fs::FileExt;

const MIB: u64 = 1 << 20;
const CHUNK: u64 = 64 << 10;
/// RAID5 over 4 members: a row holds 3 data chunks.
const ROW: u64 = 3 * CHUNK;

fn verify_json(env: &Env, args: &[&str]) -> Value {
    let mut all = vec!["verify", env.name.as_str()];
    all.extend(args);
    all.push("--json");
    serde_json::from_str(&env.ok(&all)).expect("verify --json prints JSON")
}

/// Flip bytes of row `row`'s parity chunk (left-symmetric RAID5, 4 members: P of row r is on
/// member 3 - r % 4), behind the daemon's back.
fn damage_parity(env: &Env, row: u64) {
    let base = env.examine(&env.members[0])["data_offset_sectors"]
        .as_u64()
        .unwrap()
        * 512;
    let path = &env.members[(3 - row % 4) as usize];
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    let at = base + row * CHUNK + 8192 + 17;
    let mut b = [0u8; 16];
    f.read_exact_at(&mut b, at).unwrap();
    for x in &mut b {
        *x ^= 0xa5;
    }
    f.write_all_at(&b, at).unwrap();
    f.sync_all().unwrap();
}

#[test]
fn verify_rewrites_the_parity_its_ranges_cover_and_only_that() {
    assert!(require_tools(&["nbdcopy"]));
    let env = Env::new("verify5", 4, 32 * MIB);
    env.create("5", &["--chunk", "64K"]);
    let d = env.run_all();
    let uri = env.uri();
    let src = env.dir.path().join("src.bin");
    random_file(&src, (8 * MIB) as usize, 5);
    sh("nbdcopy", &[src.to_str().unwrap(), &uri]);

    damage_parity(&env, 5);
    damage_parity(&env, 9);
    // Rows 20 and 30 hold no damage: nothing found, nothing rewritten.
    let r = verify_json(&env, &[&(20 * ROW).to_string(), "4K"]);
    assert_eq!(r["mismatch_sectors"], 0, "{r:#}");
    assert_eq!(
        r["bytes_verified"],
        3 * 4096,
        "one 4 KiB page row read: {r:#}"
    );
    assert_eq!(r["repaired"], true, "{r:#}");

    // Row 5 by a range over its damaged page (the third of each chunk), row 9 (and 30) from a
    // ranges file: one call.
    let ranges = env.dir.path().join("ranges");
    std::fs::write(
        &ranges,
        format!("# ranges\n{} 512\n{} 1K\n", 9 * ROW + 8192, 30 * ROW),
    )
    .unwrap();
    let r = verify_json(
        &env,
        &[
            &(5 * ROW + CHUNK + 8192).to_string(),
            "8K",
            "--ranges",
            ranges.to_str().unwrap(),
        ],
    );
    assert_eq!(r["ranges"], 3, "{r:#}");
    // Page rows: two in row 5, one in row 9 and one in row 30, of 3 data pages each.
    assert_eq!(r["bytes_verified"], 4 * 3 * 4096, "{r:#}");
    // 16 flipped bytes in one 4 KiB page of each damaged row: 8 sectors each, as md counts.
    assert_eq!(r["mismatch_sectors"], 16, "{r:#}");
    assert_eq!(r["integrity"], Value::Null);

    // Rewritten from the data: a full check finds nothing, and clients read what they wrote.
    assert_eq!(env.action_wait("check"), 0);
    let out = env.dir.path().join("out.bin");
    sh("nbdcopy", &[&uri, out.to_str().unwrap()]);
    let got = std::fs::read(&out).unwrap();
    assert!(got[..(8 * MIB) as usize] == std::fs::read(&src).unwrap()[..]);

    // The text form says what it did.
    damage_parity(&env, 7);
    let text = env.ok(&["verify", &env.name, &(7 * ROW + 8192).to_string(), "512"]);
    assert!(
        text.contains("8 sectors of redundancy disagreed: rewritten from the data"),
        "{text}"
    );
    env.stop(d);
}

/// A verifier walking the whole array over and over while a client writes: every byte reads
/// back as written and a check afterwards finds redundancy in agreement.
#[test]
fn verify_beside_a_writing_client_changes_nothing_it_should_not() {
    assert!(require_tools(&["nbdcopy"]));
    let env = Env::new("verifyio", 4, 32 * MIB);
    env.create("5", &["--chunk", "64K"]);
    let d = env.run_all();
    let uri = env.uri();
    let size = env.detail()["size_bytes"].as_u64().unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let verifier = {
        let stop = stop.clone();
        let rundir = env.rundir();
        let name = env.name.clone();
        std::thread::spawn(move || {
            let mut passes = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let out = std::process::Command::new(common::BIN)
                    .env("IRONRAID_RUNDIR", &rundir)
                    .args(["verify", &name, "0", &size.to_string(), "--json"])
                    .output()
                    .unwrap();
                assert!(out.status.success(), "{out:?}");
                let r: Value = serde_json::from_slice(&out.stdout).unwrap();
                assert_eq!(
                    r["mismatch_sectors"], 0,
                    "clean writes never disagree: {r:#}"
                );
                passes += 1;
            }
            passes
        })
    };
    let src = env.dir.path().join("src.bin");
    for seed in 0..4 {
        random_file(&src, (16 * MIB) as usize, 40 + seed);
        sh("nbdcopy", &[src.to_str().unwrap(), &uri]);
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let passes = verifier.join().expect("verifier");
    assert!(passes >= 1, "the verifier ran");
    let out = env.dir.path().join("out.bin");
    sh("nbdcopy", &[&uri, out.to_str().unwrap()]);
    let got = std::fs::read(&out).unwrap();
    assert!(got[..(16 * MIB) as usize] == std::fs::read(&src).unwrap()[..]);
    assert_eq!(env.action_wait("check"), 0);
    env.stop(d);
}

fn fails(env: &Env, args: &[&str], code: i32, says: &str) {
    let out = env.ironraid(args);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(code), "{args:?}: {err}");
    assert!(err.contains(says), "{args:?}: {err}");
}

#[test]
fn bad_verify_requests_get_one_line_errors() {
    let env = Env::new("verifybad", 3, 16 * MIB);
    env.create("0", &["--chunk", "64K"]);
    let d = env.run_all();
    fails(
        &env,
        &["verify", "verifybad", "0", "4K"],
        1,
        "no redundancy",
    );
    fails(
        &env,
        &["verify", "nosuch", "0", "4K"],
        1,
        "no running array 'nosuch'",
    );
    fails(&env, &["verify", "verifybad", "0"], 2, "LENGTH");
    fails(&env, &["verify", "verifybad"], 2, "--ranges");
    env.stop(d);

    let env = Env::new("verifyrange", 4, 16 * MIB);
    env.create("5", &["--chunk", "64K"]);
    let d = env.run_all();
    let size = env.detail()["size_bytes"].as_u64().unwrap();
    fails(
        &env,
        &["verify", "verifyrange", "100", "512"],
        1,
        "multiple of 512",
    );
    fails(
        &env,
        &["verify", "verifyrange", &size.to_string(), "512"],
        1,
        "beyond the array end",
    );
    let ranges = env.dir.path().join("ranges");
    std::fs::write(&ranges, "0 4K\n4K\n").unwrap();
    fails(
        &env,
        &[
            "verify",
            "verifyrange",
            "--ranges",
            ranges.to_str().unwrap(),
        ],
        1,
        "line 2",
    );
    env.stop(d);
}
