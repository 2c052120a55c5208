//! The write watch is sound: whenever it has judged every write not yet durable as conforming
//! (and left no orphan), a crash at that moment, with any subset of those writes reaching the
//! disk, gives an image whose ext4 guide verify set covers every block they touch. Writes come
//! from a jbd2-like writer that also breaks jbd2's rules at random (home writes before the
//! commit is durable, tail moves over unflushed writes, raw writes anywhere), on the synthetic
//! file system of `format::ext4_guide::synthetic` (1 KiB blocks, a 64-block log at block 200).
//! A canary shows the check failing for a watch that calls everything conforming.
//! `IRONRAID_SEED=N` replays one run; `IRONRAID_WATCH_TRACE=1` prints its writes and verdicts.

use format::ext4_guide::{ext4_verify_set, synthetic, GuideOptions};
use format::jbd2_watch::Jbd2Watch;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

const BS: usize = 1024;
const J: usize = 200;
const FIRST: u64 = 1;
const LAST: u64 = 64;

struct Write {
    id: u64,
    at: usize,
    data: Vec<u8>,
    ended: Option<u64>,
    conforming: bool,
}

struct Sim {
    rng: ChaCha8Rng,
    watch: Jbd2Watch,
    /// What is on disk for sure.
    durable: Vec<u8>,
    writes: Vec<Write>,
    epoch: u64,
    /// jbd2-like writer state.
    head: u64,
    tid: u32,
    live: Vec<(u32, u64, Vec<u32>)>,
    empty: bool,
    trust_all: bool,
    careless: f64,
    /// Writes judged conforming, and not.
    verdicts: [u64; 2],
}

fn jsb_block(start: u32, seq: u32) -> Vec<u8> {
    let mut img = vec![0u8; BS];
    synthetic::jsb(&mut img, 0, start);
    img[0x18..0x1C].copy_from_slice(&seq.to_be_bytes());
    img
}

fn descriptor(tid: u32, homes: &[u32]) -> Vec<u8> {
    let mut img = vec![0u8; 70 * BS];
    synthetic::transaction(&mut img, 0, 0, tid, homes);
    img[..BS].to_vec()
}

fn commit(tid: u32) -> Vec<u8> {
    let mut b = vec![0u8; BS];
    synthetic::header(&mut b, 0, 2, tid);
    b
}

fn wrap(n: u64) -> u64 {
    FIRST + (n - FIRST) % (LAST - FIRST)
}

impl Sim {
    fn new(seed: u64, trust_all: bool, careless: f64) -> Sim {
        let img = synthetic::image(&|img, j| synthetic::jsb(img, j as usize, 0));
        let mut watch = Jbd2Watch::default();
        let mut read = |off: u64, buf: &mut [u8]| {
            buf.copy_from_slice(&img[off as usize..off as usize + buf.len()]);
            Ok(())
        };
        watch.arm(&mut read, img.len() as u64).expect("arm");
        Sim {
            rng: ChaCha8Rng::seed_from_u64(seed),
            watch,
            durable: img,
            writes: Vec::new(),
            epoch: 0,
            head: FIRST,
            tid: 5,
            live: Vec::new(),
            empty: true,
            trust_all,
            careless,
            verdicts: [0; 2],
        }
    }

    fn write(&mut self, block: u64, data: Vec<u8>) {
        let at = block as usize * BS;
        let (v, id) = self.watch.begin(at as u64, data.len() as u64, Some(&data));
        self.verdicts[usize::from(v.is_err())] += 1;
        if std::env::var("IRONRAID_WATCH_TRACE").is_ok() {
            let be = |o: usize| u32::from_be_bytes(data[o..o + 4].try_into().unwrap());
            let what = if be(0) == 0xC03B_3998 {
                format!(
                    "kind {} tid {} start {} seq {}",
                    be(4),
                    be(8),
                    be(0x1C),
                    be(0x18)
                )
            } else {
                String::new()
            };
            eprintln!(
                "begin #{id} block {} len {} -> {v:?} orphans {} {what}",
                block,
                data.len() / BS,
                self.watch.orphans()
            );
        }
        self.writes.push(Write {
            id,
            at,
            data,
            ended: None,
            conforming: v.is_ok() || self.trust_all,
        });
        // Most writes end at once; some stay in flight a while.
        if self.rng.gen_bool(0.7) {
            let fua = self.rng.gen_bool(0.4);
            self.end(self.writes.len() - 1, fua);
        }
    }

    fn end(&mut self, i: usize, fua: bool) {
        let id = self.writes[i].id;
        if std::env::var("IRONRAID_WATCH_TRACE").is_ok() {
            eprintln!("end #{id} fua {fua}");
        }
        self.watch.end(id, true, fua);
        if fua {
            let w = self.writes.remove(i);
            self.durable[w.at..w.at + w.data.len()].copy_from_slice(&w.data);
        } else {
            self.writes[i].ended = Some(self.epoch);
        }
    }

    fn flush(&mut self) {
        let token = self.watch.flush_begin();
        if std::env::var("IRONRAID_WATCH_TRACE").is_ok() {
            eprintln!("flush {token}");
        }
        let e = self.epoch;
        self.epoch += 1;
        // Writes may end while the flush runs; they are not covered by it.
        if !self.writes.is_empty() && self.rng.gen_bool(0.3) {
            let i = self.rng.gen_range(0..self.writes.len());
            if self.writes[i].ended.is_none() {
                self.end(i, false);
            }
        }
        self.watch.flush_end(token);
        let (done, rest): (Vec<Write>, Vec<Write>) = std::mem::take(&mut self.writes)
            .into_iter()
            .partition(|w| w.ended.is_some_and(|x| x <= e));
        self.writes = rest;
        for w in done {
            self.durable[w.at..w.at + w.data.len()].copy_from_slice(&w.data);
        }
    }

    fn log_write(&mut self, data: Vec<u8>) {
        let n = self.head;
        self.head = wrap(n + 1);
        self.write(J as u64 + n, data);
    }

    fn step(&mut self) {
        let careless = self.rng.gen_bool(self.careless);
        match self.rng.gen_range(0..100) {
            0..=29 => {
                // A transaction: make the log non-empty first, as jbd2 does.
                if self.empty {
                    if !careless {
                        self.settle_all();
                    }
                    let start = self.head as u32;
                    self.write(J as u64, jsb_block(start, self.tid));
                    if !careless {
                        self.settle_all();
                    }
                    self.empty = false;
                }
                let k = self.rng.gen_range(1..=3);
                // jbd2 never writes over the live log (careless: this writer may).
                if let Some(&(_, tail, _)) = self.live.first() {
                    let len = LAST - FIRST;
                    let free = (tail + len - self.head) % len;
                    if !careless && free < k + 3 {
                        return;
                    }
                }
                let homes: Vec<u32> = (0..k).map(|_| self.rng.gen_range(300..330)).collect();
                let at = self.head;
                let tid = self.tid;
                self.log_write(descriptor(tid, &homes));
                for _ in 0..k {
                    let mut d: Vec<u8> = (0..BS).map(|_| self.rng.gen()).collect();
                    d[0] = 0;
                    self.log_write(d);
                }
                if !careless {
                    self.settle_all();
                }
                self.log_write(commit(tid));
                if !careless {
                    self.settle_all();
                }
                self.live.push((tid, at, homes));
                self.tid += 1;
            }
            30..=54 => {
                // Checkpoint: a home block of a live transaction (or, careless, any block).
                let b = match (careless, self.live.is_empty()) {
                    (false, false) => {
                        let t = self.rng.gen_range(0..self.live.len());
                        let h = &self.live[t].2;
                        u64::from(h[self.rng.gen_range(0..h.len())])
                    }
                    _ => self.rng.gen_range(0..1024),
                };
                if b < 2 || (J as u64..J as u64 + 64).contains(&b) || b == 10 {
                    return;
                }
                let d: Vec<u8> = (0..BS).map(|_| self.rng.gen()).collect();
                self.write(b, d);
            }
            55..=64 => {
                // Tail moves past checkpointed transactions (careless: without the flush).
                if self.live.is_empty() {
                    return;
                }
                if !careless {
                    self.settle_all();
                }
                let drop = self.rng.gen_range(1..=self.live.len());
                self.live.drain(..drop);
                let jsb = match self.live.first() {
                    Some(&(tid, at, _)) => jsb_block(at as u32, tid),
                    None => {
                        self.empty = true;
                        jsb_block(0, self.tid)
                    }
                };
                self.write(J as u64, jsb);
                if !careless {
                    self.settle_all();
                }
            }
            65..=79 => self.flush(),
            _ => {
                if !self.writes.is_empty() {
                    let i = self.rng.gen_range(0..self.writes.len());
                    if self.writes[i].ended.is_none() {
                        let fua = self.rng.gen_bool(0.3);
                        self.end(i, fua);
                    }
                }
            }
        }
    }

    /// End everything in flight and flush.
    fn settle_all(&mut self) {
        while let Some(i) = self.writes.iter().position(|w| w.ended.is_none()) {
            self.end(i, false);
        }
        self.flush();
    }

    /// Crash now, with a random subset of the writes not yet durable on disk. Err: a write
    /// the watch called conforming that the guide does not cover. Ok(true): something was
    /// checked (conforming writes were unsettled and the guide ran).
    fn crash_check(&mut self) -> Result<bool, String> {
        let flagged = self.writes.iter().any(|w| !w.conforming) || self.watch.orphans() > 0;
        if flagged && !self.trust_all {
            return Ok(false); // The array falls back to the bitmap: nothing to check.
        }
        let mut img = self.durable.clone();
        for w in &self.writes {
            if self.rng.gen_bool(0.5) {
                img[w.at..w.at + w.data.len()].copy_from_slice(&w.data);
            }
        }
        let mut read = |off: u64, buf: &mut [u8]| {
            let o = off as usize;
            buf.copy_from_slice(img.get(o..o + buf.len()).ok_or("past the end")?);
            Ok(())
        };
        let opts = GuideOptions {
            require_data_journal: false,
        };
        let Ok(set) = ext4_verify_set(&mut read, img.len() as u64, &opts) else {
            return Ok(false); // The guide refuses: the array falls back.
        };
        for w in &self.writes {
            let (a, b) = (w.at as u64, (w.at + w.data.len()) as u64);
            let covered = set.ranges.iter().any(|&(o, l)| o <= a && b <= o + l);
            if !covered {
                return Err(format!(
                    "write at block {} ({} blocks) not covered; set {:?}",
                    w.at / BS,
                    w.data.len() / BS,
                    set.ranges
                ));
            }
        }
        Ok(!self.writes.is_empty())
    }
}

/// One seeded run; returns how many crash checks had conforming writes to check.
fn run(seed: u64, trust_all: bool) -> Result<u64, String> {
    let mut sim = Sim::new(seed, trust_all, 0.15);
    let mut checked = 0;
    for step in 0..400 {
        sim.step();
        if sim.rng.gen_bool(0.2) {
            checked += u64::from(
                sim.crash_check()
                    .map_err(|e| format!("seed {seed} step {step}: {e}"))?,
            );
        }
    }
    Ok(checked)
}

fn cases() -> u64 {
    std::env::var("IRONRAID_WATCH_CASES")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(2000)
}

#[test]
fn every_conforming_write_is_in_the_guides_verify_set_after_any_crash() {
    if let Ok(seed) = std::env::var("IRONRAID_SEED") {
        run(seed.parse().expect("IRONRAID_SEED"), false).unwrap();
        return;
    }
    let mut checked = 0;
    let n = cases();
    for seed in 0..n {
        match run(seed, false) {
            Ok(c) => checked += c,
            Err(e) => panic!(
                "{e}\nreplay: IRONRAID_SEED={seed} cargo test -p format --release --test jbd2_watch"
            ),
        }
    }
    // Not vacuous: most runs crash with conforming writes in flight several times.
    assert!(
        checked >= n,
        "only {checked} crash checks in {n} runs had anything to check"
    );
}

#[test]
fn the_watch_calls_most_jbd2_writes_conforming() {
    // Without careless steps most writes conform: the check is not "everything falls back".
    let mut sim = Sim::new(7, false, 0.0);
    for _ in 0..2000 {
        sim.step();
    }
    let [yes, no] = sim.verdicts;
    assert!(sim.watch.is_armed(), "{:?}", sim.watch.disarmed_reason());
    assert!(yes > 4 * no, "{yes} writes conforming, {no} not");
}

#[test]
fn canary_trusting_every_write_is_caught() {
    let caught = (0..200).filter(|&s| run(s, true).is_err()).count();
    assert!(caught > 0, "a watch that trusts every write went unnoticed");
}
