//! Sixteen clients writing into the same stripes at once, and what they must find after:
//! connections own disjoint ranges within a round and every round waits for all replies
//! (a barrier), so the model of what the array holds is exact, down to writes that failed or
//! that a dying server never answered.

use super::raw_client::{Client, UNANSWERED};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
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
/// them failed: the member under it may hold any mix of old and new bytes) and bytes a write
/// not kept covered (one the server never answered as it died, or one no acknowledged flush
/// covered before a power cut): such a byte holds the model's value or one of the `maybe`
/// layers' (one layer per round with such writes).
pub struct Written {
    pub model: Vec<u8>,
    pub unknown: Vec<bool>,
    pub maybe: Vec<Vec<Option<u8>>>,
    pub failed_writes: usize,
    pub unanswered_writes: usize,
    pub rounds: usize,
}

/// Every connection (to the servers in turn: socket and export name) runs rounds while
/// `more(round)` says so (asked once per round); all finish a round before any starts the
/// next. A round in which the server stopped answering is the last. An acknowledged write
/// counts as kept (what a killed process's writes are: in the page cache).
pub fn write_concurrently(
    servers: &[(&Path, &str)],
    before: &[u8],
    more: impl Fn(usize) -> bool + Sync,
) -> Written {
    let (answers, _) = run_rounds(servers, before.len(), &more, false);
    written(before, &answers, answers[0].len())
}

/// As [`write_concurrently`], with a FLUSH after every round (once all its writes are
/// acknowledged, before the next starts): only the rounds whose flush was acknowledged count as
/// kept, and every byte written after them may hold any value written to it since (what a
/// power cut leaves).
pub fn write_flushing_concurrently(
    servers: &[(&Path, &str)],
    before: &[u8],
    more: impl Fn(usize) -> bool + Sync,
) -> Written {
    let (answers, flushed) = run_rounds(servers, before.len(), &more, true);
    written(before, &answers, flushed)
}

/// The rounds: each connection's answers per round, and how many rounds were flushed.
fn run_rounds(
    servers: &[(&Path, &str)],
    hot: usize,
    more: &(impl Fn(usize) -> bool + Sync),
    flush: bool,
) -> (Vec<Vec<Vec<u32>>>, usize) {
    let barrier = Barrier::new(CONNS);
    let died = AtomicBool::new(false);
    let last = AtomicBool::new(!more(0));
    let flushed = AtomicUsize::new(0);
    let answers = std::thread::scope(|s| {
        let conns: Vec<_> = (0..CONNS)
            .map(|conn| {
                let (barrier, died, last, flushed) = (&barrier, &died, &last, &flushed);
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
                        // One thread flushes the round and decides whether a next one runs;
                        // everyone reads the decision before anyone's next round may change
                        // its inputs.
                        if barrier.wait().is_leader() {
                            if flush && !died.load(Ordering::SeqCst) {
                                if c.try_flush() {
                                    flushed.store(round + 1, Ordering::SeqCst);
                                } else {
                                    died.store(true, Ordering::SeqCst);
                                }
                            }
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
    (answers, flushed.into_inner())
}

/// What the hot area must hold after the rounds of `answers`, the first `kept` of which are
/// kept whole: `before`, then every acknowledged write of a kept round; any write after them,
/// or unanswered, adds a value its bytes may hold instead.
fn written(before: &[u8], answers: &[Vec<Vec<u32>>], kept: usize) -> Written {
    let hot = before.len();
    let rounds = answers[0].len();
    let mut w = Written {
        model: before.to_vec(),
        unknown: vec![false; hot],
        maybe: Vec::new(),
        failed_writes: 0,
        unanswered_writes: 0,
        rounds,
    };
    for round in 0..rounds {
        let mut layer: Option<Vec<Option<u8>>> = None;
        for (conn, answers) in answers.iter().enumerate() {
            for ((at, data), &err) in round_writes(conn, round, hot).iter().zip(&answers[round]) {
                let r = *at as usize..*at as usize + data.len();
                w.unanswered_writes += usize::from(err == UNANSWERED);
                if err == UNANSWERED || (err == 0 && round >= kept) {
                    let layer = layer.get_or_insert_with(|| vec![None; hot]);
                    for (slot, &v) in layer[r].iter_mut().zip(data) {
                        *slot = Some(v);
                    }
                    continue;
                }
                w.model[r.clone()].copy_from_slice(data);
                w.unknown[r].fill(err != 0);
                w.failed_writes += usize::from(err != 0);
            }
        }
        w.maybe.extend(layer);
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
/// model's value, nor one a write not kept may have left, nor under a failed write.
pub fn unexplained(got: &[u8], w: &Written) -> Option<usize> {
    (0..got.len()).find(|&i| {
        got[i] != w.model[i] && !w.unknown[i] && w.maybe.iter().all(|l| l[i] != Some(got[i]))
    })
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
