//! Sixteen clients writing into the same parity stripes at once (issue 24): each on its own
//! connection with dozens of writes in flight, partial blocks, whole blocks and whole chunks,
//! RAID5 and RAID6, integrity on and off. A lost update shows in one of three places, and each
//! is looked at:
//! - the data read back (every byte against the model of what was written);
//! - the parity (`check` must find no mismatch, records included when integrity is on);
//! - reads rebuilt from parity with members failed (as many as the level survives).
//!
//! Connections own disjoint ranges within a round and every round waits for all replies
//! (a barrier), so the model is exact: no byte is written twice with its order left open.

mod common;

use std::path::Path;
use std::sync::Barrier;

use common::raw_client::Client;
use common::Env;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Connections writing at once.
const CONNS: usize = 16;
const BLOCK: usize = 4096;
const CHUNK: usize = 64 << 10;
const SECTOR: usize = 512;
/// Rows of stripes all connections write into.
const ROWS: usize = 16;
/// Rounds per connection: even ones write pieces of 4 KiB blocks, odd ones whole chunks.
const ROUNDS: usize = 6;
const MEMBER: u64 = 16 << 20;

/// One round's writes of connection `conn`: disjoint from every other connection's (the owner
/// of a unit is its index modulo `CONNS`) and from each other.
fn round_writes(conn: usize, round: usize, hot: usize) -> Vec<(u64, Vec<u8>)> {
    let mut rng = StdRng::seed_from_u64((round * CONNS + conn) as u64);
    let unit = if round.is_multiple_of(2) { BLOCK } else { CHUNK };
    (conn..hot / unit)
        .step_by(CONNS)
        .map(|u| {
            // Block rounds: a sector run inside the block (whole blocks included); chunk
            // rounds: the whole chunk, so that a row's chunks may merge into a full stripe.
            let (start, len) = if unit == BLOCK {
                let start = rng.gen_range(0..BLOCK / SECTOR) * SECTOR;
                (start, rng.gen_range(1..=(BLOCK - start) / SECTOR) * SECTOR)
            } else {
                (0, CHUNK)
            };
            let data: Vec<u8> = (0..len).map(|_| rng.gen()).collect();
            ((u * unit + start) as u64, data)
        })
        .collect()
}

/// Every connection runs its rounds; all finish a round before any starts the next.
/// Returns what the hot area must hold afterwards.
fn write_concurrently(sock: &Path, name: &str, hot: usize) -> Vec<u8> {
    let barrier = Barrier::new(CONNS);
    std::thread::scope(|s| {
        for conn in 0..CONNS {
            let barrier = &barrier;
            s.spawn(move || {
                let mut c = Client::connect(sock, name);
                for round in 0..ROUNDS {
                    c.write_all(&round_writes(conn, round, hot));
                    barrier.wait();
                }
            });
        }
    });
    let mut model = vec![0u8; hot];
    for round in 0..ROUNDS {
        for conn in 0..CONNS {
            for (at, data) in round_writes(conn, round, hot) {
                model[at as usize..][..data.len()].copy_from_slice(&data);
            }
        }
    }
    model
}

/// The hot area read back equals `model`, and the rest of the array's start is still zero.
fn compare(sock: &Path, name: &str, model: &[u8]) -> Result<(), String> {
    let mut c = Client::connect(sock, name);
    let got = c
        .try_read(0, model.len() + CHUNK)
        .map_err(|e| format!("read failed with NBD error {e}"))?;
    let bad: Vec<usize> = (0..got.len())
        .filter(|&i| got[i] != model.get(i).copied().unwrap_or(0))
        .collect();
    match bad.first() {
        None => Ok(()),
        Some(first) => Err(format!(
            "{} bytes differ from what was written, the first at {first} (block {})",
            bad.len(),
            first / BLOCK
        )),
    }
}

/// The workload on a fresh array of `members` at `level`, then the three looks. With
/// `journal` (a mode), the array has a raid5-cache log on its own device.
fn case(level: &str, members: usize, extra: &[&str], journal: Option<&str>) {
    let data_members = members - if level == "6" { 2 } else { 1 };
    let hot = ROWS * data_members * CHUNK;
    let env = Env::new(&format!("many{level}"), members, MEMBER);
    let mut args: Vec<String> = ["--chunk", "64K"]
        .iter()
        .chain(extra)
        .map(|a| a.to_string())
        .collect();
    let mut run = env.members.clone();
    if let Some(mode) = journal {
        let log = env.file("log.img", 64 << 20);
        let log_arg = log.display().to_string();
        args.extend(
            [
                "--consistency-policy",
                "journal",
                "--journal",
                &log_arg,
                "--journal-mode",
                mode,
            ]
            .map(String::from),
        );
        run.push(log);
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    env.create(level, &args);
    let d = env.run(&run);
    let model = write_concurrently(&env.socket(), &env.name, hot);
    let what = format!("RAID{level} ×{members} {extra:?} journal {journal:?}");
    compare(&env.socket(), &env.name, &model).unwrap_or_else(|e| panic!("{what}: {e}"));
    assert_eq!(env.action_wait("check"), 0, "{what}: parity mismatches");
    let detail = env.detail();
    for m in detail["members"].as_array().unwrap() {
        assert_eq!(m["checksum_errors"], 0, "{what}: {m:#}");
    }
    // Reads rebuilt from parity: with the first member failed, then (RAID6) the second too.
    for failed in &env.members[..members - data_members] {
        env.ok(&["fail", &env.name, failed.to_str().unwrap()]);
        compare(&env.socket(), &env.name, &model)
            .unwrap_or_else(|e| panic!("{what}, {} failed: {e}", failed.display()));
    }
    env.stop(d);
}

#[test]
fn sixteen_writers_in_shared_raid5_stripes_lose_nothing() {
    case("5", 4, &[], None);
}

#[test]
fn sixteen_writers_in_shared_raid5_stripes_with_integrity_lose_nothing() {
    case("5", 4, &["--integrity", "crc32c"], None);
}

#[test]
fn sixteen_writers_in_shared_raid6_stripes_lose_nothing() {
    case("6", 6, &[], None);
}

#[test]
fn sixteen_writers_in_shared_raid6_stripes_with_integrity_lose_nothing() {
    case("6", 6, &["--integrity", "crc32c"], None);
}

/// Writes acknowledged from the log and written out to the members later, in shared stripes.
#[test]
fn sixteen_writers_in_shared_raid5_stripes_with_a_write_back_journal_lose_nothing() {
    case("5", 4, &[], Some("write-back"));
}

#[test]
fn sixteen_writers_in_shared_raid6_stripes_with_a_write_through_journal_lose_nothing() {
    case("6", 6, &[], Some("write-through"));
}

/// The looks can fail: one byte of the first member changed behind the array's back (no
/// integrity records to repair it) is seen by the read-back and by `check`.
#[test]
fn the_many_writers_checks_see_a_byte_changed_behind_the_arrays_back() {
    let env = Env::new("manycanary", 4, MEMBER);
    env.create("5", &["--chunk", "64K"]);
    let d = env.run_all();
    let model = write_concurrently(&env.socket(), &env.name, ROWS * 3 * CHUNK);
    compare(&env.socket(), &env.name, &model).expect("the workload itself loses nothing");
    env.stop(d);
    // Row 0 of left-symmetric RAID5 keeps data chunk 0 on the first member.
    let offset = env.examine(&env.members[0])["data_offset_sectors"]
        .as_u64()
        .unwrap()
        * 512
        + 100;
    let mut img = std::fs::read(&env.members[0]).unwrap();
    img[offset as usize] ^= 0x5a;
    std::fs::write(&env.members[0], img).unwrap();
    let d = env.run_all();
    let err = compare(&env.socket(), &env.name, &model).expect_err("a changed byte is seen");
    assert!(err.contains("1 bytes differ"), "{err}");
    assert!(env.action_wait("check") > 0, "check sees the changed byte");
    env.stop(d);
}
