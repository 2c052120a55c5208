//! The NBD frontend of `ironraid run` with byte-granular clients: a client
//! that did not negotiate block sizes may write any byte range, which the
//! daemon widens to whole sectors (read, patch, write). Concurrent writes
//! that share a sector — unaligned ones, or an aligned one beside a patched
//! sector — must not lose each other's bytes.
//!
//! qemu and the kernel align to the advertised minimum, so these tests speak
//! the protocol themselves (`common::raw_client`).

mod common;

use std::path::Path;

use common::raw_client::Client;
use common::Env;

const MEMBER: u64 = 16 << 20;

/// Connections writing at once.
const CONNS: usize = 4;

/// One write of a test's plan: `len` bytes of `value` at `offset`.
#[derive(Clone, Copy)]
struct Piece {
    offset: u64,
    len: usize,
    value: u8,
}

/// Runs each connection's writes at once on its own connection.
fn run_concurrently(sock: &Path, name: &str, plans: Vec<Vec<Piece>>) {
    let threads: Vec<_> = plans
        .into_iter()
        .map(|plan| {
            let mut c = Client::connect(sock, name);
            let writes: Vec<(u64, Vec<u8>)> = plan
                .iter()
                .map(|p| (p.offset, vec![p.value; p.len]))
                .collect();
            std::thread::spawn(move || c.write_all(&writes))
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
}

/// Every byte of `got` (read back from `base`) must hold one of the values
/// written to it, or zero if none was; panics listing the first bad bytes.
fn check(got: &[u8], base: u64, plans: &[Vec<Piece>]) {
    let mut allowed: Vec<Vec<u8>> = vec![Vec::new(); got.len()];
    for p in plans.iter().flatten() {
        let start = usize::try_from(p.offset - base).unwrap();
        for a in &mut allowed[start..start + p.len] {
            a.push(p.value);
        }
    }
    let bad: Vec<String> = got
        .iter()
        .zip(&allowed)
        .enumerate()
        .filter(|(_, (v, a))| {
            if a.is_empty() {
                **v != 0
            } else {
                !a.contains(v)
            }
        })
        .map(|(i, (v, a))| format!("byte {} = {v:#04x}, want one of {a:02x?}", base + i as u64))
        .collect();
    assert!(
        bad.is_empty(),
        "{} of {} bytes lost their update; first ones:\n{}",
        bad.len(),
        got.len(),
        bad[..bad.len().min(10)].join("\n")
    );
}

/// A value for write `i` that is never zero (zero is what the array starts
/// with, and what a lost update usually leaves).
fn value(i: usize) -> u8 {
    (i % 251 + 1) as u8
}

/// `count` slots of `slot` bytes from `base`; connection `c` owns every
/// `CONNS`-th slot starting at `c`, so neighbours on different connections
/// share sectors and all connections move through the region side by side.
fn interleaved_slots(base: u64, slot: usize, count: usize) -> Vec<Vec<Piece>> {
    (0..CONNS)
        .map(|c| {
            (c..count)
                .step_by(CONNS)
                .map(|i| Piece {
                    offset: base + (i * slot) as u64,
                    len: slot,
                    value: value(i),
                })
                .collect()
        })
        .collect()
}

#[test]
fn unaligned_writes_sharing_sectors_keep_every_byte() {
    let env = Env::new("unal5", 3, MEMBER);
    env.create("5", &["--chunk", "64K"]);
    let d = env.run_all();
    for (base, slot, count) in [(0u64, 7usize, 6000usize), (1 << 20, 100, 1500)] {
        let plans = interleaved_slots(base, slot, count);
        run_concurrently(&env.socket(), &env.name, plans.clone());
        let mut c = Client::connect(&env.socket(), &env.name);
        let got = c.read(base, slot * count + 512);
        check(&got, base, &plans);
    }
    env.stop(d);
}

#[test]
fn aligned_writes_beside_sector_patches_are_kept() {
    const SECTOR: usize = 512;
    const SECTORS: usize = 1024;
    /// Bytes an unaligned write takes on each side of a sector boundary.
    const EDGE: usize = 24;
    let env = Env::new("mix1", 2, MEMBER);
    env.create("1", &[]);
    let d = env.run_all();
    let base = 2u64 << 20;
    // One connection writes every sector whole (aligned); the others write
    // across every sector boundary, which patches the two sectors around it.
    let aligned: Vec<Piece> = (0..SECTORS)
        .map(|s| Piece {
            offset: base + (s * SECTOR) as u64,
            len: SECTOR,
            value: value(s),
        })
        .collect();
    let mut plans = vec![aligned];
    for c in 0..CONNS - 1 {
        plans.push(
            (1 + c..SECTORS)
                .step_by(CONNS - 1)
                .map(|b| Piece {
                    offset: base + (b * SECTOR - EDGE) as u64,
                    len: 2 * EDGE,
                    value: value(b + 128),
                })
                .collect(),
        );
    }
    run_concurrently(&env.socket(), &env.name, plans.clone());
    let mut c = Client::connect(&env.socket(), &env.name);
    let got = c.read(base, SECTORS * SECTOR);
    check(&got, base, &plans);
    // A connected client would make `stop` refuse.
    drop(c);
    env.stop(d);
}

#[test]
fn unaligned_write_zeroes_and_reads() {
    let env = Env::new("zero1", 2, MEMBER);
    env.create("1", &[]);
    let d = env.run_all();
    let mut c = Client::connect(&env.socket(), &env.name);
    let base = 1u64 << 20;
    let len = 8192;
    c.write_all(&[(base, vec![0xff; len])]);
    // Across several sectors (both edges partial), and inside one sector.
    let zeroes = [(100usize, 1000usize), (3000, 5), (4095, 2)];
    for (at, n) in zeroes {
        c.write_zeroes(base + at as u64, n);
    }
    let mut want = vec![0xffu8; len];
    for (at, n) in zeroes {
        want[at..at + n].fill(0);
    }
    assert!(c.read(base, len) == want, "zeroed ranges");
    // Unaligned reads see the same bytes.
    for (at, n) in [(1usize, 7usize), (95, 20), (4090, 12), (511, 1027)] {
        assert!(
            c.read(base + at as u64, n) == want[at..at + n],
            "read +{at} len {n}"
        );
    }
    drop(c);
    env.stop(d);
}
