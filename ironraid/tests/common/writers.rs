//! Sixteen clients writing into the same stripes at once, and what they must find after:
//! connections own disjoint ranges within a round and every round waits for all replies
//! (a barrier), so the model of what the array holds is exact, down to writes that failed or
//! that a dying server never answered.

use super::raw_client::{Client, UNANSWERED};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Barrier;

/// Connections writing at once.
pub const CONNS: usize = 16;
pub const BLOCK: usize = 4096;
pub const CHUNK: usize = 64 << 10;
pub const SECTOR: usize = 512;
/// Rows of stripes all connections write into.
pub const ROWS: usize = 16;
/// Rounds per connection: even ones write pieces of 4 KiB blocks, odd ones whole chunks.
pub const ROUNDS: usize = 6;

/// One round's writes of connection `conn`: disjoint from every other connection's (the owner
/// of a unit is its index modulo `CONNS`) and from each other.
pub fn round_writes(conn: usize, round: usize, hot: usize) -> Vec<(u64, Vec<u8>)> {
    let mut rng = StdRng::seed_from_u64((round * CONNS + conn) as u64);
    let unit = if round.is_multiple_of(2) {
        BLOCK
    } else {
        CHUNK
    };
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

/// What the hot area must hold after the rounds: `model`, except bytes `unknown` (a write to
/// them failed: the member under it may hold any mix of old and new bytes) and bytes
/// `in_flight` (a write the server never answered, as it died: the byte holds the model's value
/// or the one given).
pub struct Written {
    pub model: Vec<u8>,
    pub unknown: Vec<bool>,
    pub in_flight: Vec<Option<u8>>,
    pub failed_writes: usize,
    pub unanswered_writes: usize,
    pub rounds: usize,
}

/// Every connection (to the servers in turn: socket and export name) runs rounds while
/// `more(round)` says so (asked once per round); all
/// finish a round before any starts the next. A round in which the server stopped answering
/// is the last.
pub fn write_concurrently(
    servers: &[(&Path, &str)],
    before: &[u8],
    more: impl Fn(usize) -> bool + Sync,
) -> Written {
    let hot = before.len();
    let barrier = Barrier::new(CONNS);
    let died = AtomicBool::new(false);
    let last = AtomicBool::new(!more(0));
    let answers: Vec<Vec<Vec<u32>>> = std::thread::scope(|s| {
        let conns: Vec<_> = (0..CONNS)
            .map(|conn| {
                let (barrier, died, last, more) = (&barrier, &died, &last, &more);
                s.spawn(move || {
                    let (sock, name) = servers[conn % servers.len()];
                    let mut c = Client::connect(sock, name);
                    let mut all = Vec::new();
                    for round in 0.. {
                        if last.load(Ordering::SeqCst) {
                            break;
                        }
                        let answers = c.write_all_answers(&round_writes(conn, round, hot));
                        if answers.contains(&UNANSWERED) {
                            died.store(true, Ordering::SeqCst);
                        }
                        all.push(answers);
                        // One thread decides whether a next round runs, and everyone reads
                        // the decision before anyone's next round may change its inputs.
                        if barrier.wait().is_leader() {
                            let stop = died.load(Ordering::SeqCst) || !more(round + 1);
                            last.store(stop, Ordering::SeqCst);
                        }
                        barrier.wait();
                    }
                    all
                })
            })
            .collect();
        conns.into_iter().map(|c| c.join().unwrap()).collect()
    });
    let mut w = Written {
        model: before.to_vec(),
        unknown: vec![false; hot],
        in_flight: vec![None; hot],
        failed_writes: 0,
        unanswered_writes: 0,
        rounds: answers[0].len(),
    };
    for round in 0..w.rounds {
        for (conn, answers) in answers.iter().enumerate() {
            for ((at, data), &err) in round_writes(conn, round, hot).iter().zip(&answers[round]) {
                let r = *at as usize..*at as usize + data.len();
                if err == UNANSWERED {
                    w.unanswered_writes += 1;
                    for (slot, &v) in w.in_flight[r].iter_mut().zip(data) {
                        *slot = Some(v);
                    }
                    continue;
                }
                w.model[r.clone()].copy_from_slice(data);
                w.unknown[r].fill(err != 0);
                w.failed_writes += usize::from(err != 0);
            }
        }
    }
    w
}

/// The rounds on an array where every write must succeed: the hot area's bytes.
pub fn write_all_concurrently(sock: &Path, name: &str, hot: usize) -> Vec<u8> {
    let w = write_concurrently(&[(sock, name)], &vec![0; hot], |r| r < ROUNDS);
    assert_eq!(w.failed_writes + w.unanswered_writes, 0, "writes failed");
    w.model
}

/// The first byte of `got` (the hot area read back) that no write explains: neither the
/// model's value, nor an unanswered write's, nor under a failed write.
pub fn unexplained(got: &[u8], w: &Written) -> Option<usize> {
    (0..got.len())
        .find(|&i| got[i] != w.model[i] && w.in_flight[i] != Some(got[i]) && !w.unknown[i])
}

/// The hot area read back equals `model`, and the rest of the array's start is still zero.
pub fn compare(sock: &Path, name: &str, model: &[u8]) -> Result<(), String> {
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
