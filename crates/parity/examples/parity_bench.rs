//! Single-thread throughput of the parity kernels.
//!
//! ```text
//! cargo run -p parity --release --example parity_bench [-- --quick] [--json]
//! cargo run -p parity --release --features isal --example parity_bench   # + ISA-L columns
//! ```
//!
//! For every array width `n` (members) and chunk size:
//! * `xor_gen`: n−1 data chunks → 1 parity chunk (RAID5 full-stripe write);
//! * `pq_gen`: n−2 data chunks → P + Q (RAID6 full-stripe write);
//! * `rec2`: RAID6 rebuild of 2 lost data chunks from n−4 data + P + Q;
//! * `crc32c`: CRC32C of each of the n−1 data chunks.
//!
//! GB/s = 10^9 × (source bytes: (n−1) or (n−2) chunks per stripe) / second, one
//! thread. `hot` reuses one stripe (cache resident); `cold` walks sequentially
//! through ≥ 256 MiB of stripes so data comes from DRAM. Best of 3 runs.
//! `--no-stream` disables non-temporal stores (see
//! `parity::set_streaming_store_threshold`; default: blocks ≥ 64 KiB stream).
//! `ours` = the runtime-selected backend, `scalar` = the portable u64 SWAR
//! backend, `isal` = Debian's libisal (feature `isal` only).

use std::hint::black_box;
use std::time::{Duration, Instant};

use parity::{Backend, Lost};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

const MAX_MEMBERS: usize = 16;
const COLD_BYTES: usize = 256 << 20;

#[cfg(feature = "isal")]
mod isal {
    use std::os::raw::{c_int, c_uchar, c_uint, c_void};

    #[link(name = "isal")]
    extern "C" {
        pub fn xor_gen(vects: c_int, len: c_int, array: *mut *mut c_void) -> c_int;
        pub fn pq_gen(vects: c_int, len: c_int, array: *mut *mut c_void) -> c_int;
        pub fn crc32_iscsi(buf: *mut c_uchar, len: c_int, init: c_uint) -> c_uint;
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Op {
    Xor,
    Pq,
    Rec2,
    Crc,
}

impl Op {
    fn name(self) -> &'static str {
        match self {
            Op::Xor => "xor_gen",
            Op::Pq => "pq_gen",
            Op::Rec2 => "rec2",
            Op::Crc => "crc32c",
        }
    }
    /// Source chunks per stripe (the throughput numerator).
    fn sources(self, n: usize) -> usize {
        match self {
            Op::Xor | Op::Crc => n - 1,
            Op::Pq | Op::Rec2 => n - 2,
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Imp {
    Ours,
    Scalar,
    #[cfg_attr(not(feature = "isal"), allow(dead_code))]
    Isal,
}

impl Imp {
    fn name(self) -> &'static str {
        match self {
            Imp::Ours => "ours",
            Imp::Scalar => "scalar",
            Imp::Isal => "isal",
        }
    }
}

/// 64-byte aligned arena holding `stripes` stripes of `n` chunks each.
struct Arena {
    buf: Vec<u8>,
    base: usize,
}

impl Arena {
    fn new(bytes: usize) -> Self {
        let mut buf = vec![0u8; bytes + 64];
        SmallRng::seed_from_u64(42).fill(&mut buf[..]);
        let base = buf.as_ptr().align_offset(64);
        Arena { buf, base }
    }
    fn stripe(&mut self, n: usize, chunk: usize, s: usize) -> &mut [u8] {
        let off = self.base + s * n * chunk;
        &mut self.buf[off..off + n * chunk]
    }
}

/// Run one stripe operation.
fn run_op(op: Op, imp: Imp, stripe: &mut [u8], n: usize, chunk: usize) {
    let be = match imp {
        Imp::Ours => Backend::detect(),
        _ => Backend::Scalar,
    };
    match (op, imp) {
        #[cfg(feature = "isal")]
        (Op::Xor | Op::Pq, Imp::Isal) => {
            let mut ptrs = [std::ptr::null_mut::<std::os::raw::c_void>(); MAX_MEMBERS];
            for (j, c) in stripe.chunks_exact_mut(chunk).enumerate() {
                ptrs[j] = c.as_mut_ptr().cast();
            }
            let f = if op == Op::Xor {
                isal::xor_gen
            } else {
                isal::pq_gen
            };
            // SAFETY: n pointers to distinct, live, 64-byte aligned chunks of `chunk`
            // bytes (a multiple of 32); dest(s) last, as ISA-L requires; n >= 4.
            let rc = unsafe { f(n as i32, chunk as i32, ptrs.as_mut_ptr()) };
            assert_eq!(rc, 0);
        }
        #[cfg(feature = "isal")]
        (Op::Crc, Imp::Isal) => {
            for c in stripe.chunks_exact_mut(chunk).take(n - 1) {
                // SAFETY: valid buffer of `chunk` bytes; ISA-L only reads it.
                black_box(unsafe { isal::crc32_iscsi(c.as_mut_ptr(), chunk as i32, !0) });
            }
        }
        (Op::Xor, _) => {
            let (src, dst) = stripe.split_at_mut((n - 1) * chunk);
            let mut refs: [&[u8]; MAX_MEMBERS] = [&[]; MAX_MEMBERS];
            for (r, c) in refs.iter_mut().zip(src.chunks_exact(chunk)) {
                *r = c;
            }
            be.xor_gen(&refs[..n - 1], dst);
        }
        (Op::Pq, _) => {
            let (src, pq) = stripe.split_at_mut((n - 2) * chunk);
            let (p, q) = pq.split_at_mut(chunk);
            let mut refs: [&[u8]; MAX_MEMBERS] = [&[]; MAX_MEMBERS];
            for (r, c) in refs.iter_mut().zip(src.chunks_exact(chunk)) {
                *r = c;
            }
            be.pq_gen(&refs[..n - 2], p, q);
        }
        (Op::Rec2, _) => {
            let (src, pq) = stripe.split_at_mut((n - 2) * chunk);
            let (p, q) = pq.split_at_mut(chunk);
            let mut it = src.chunks_exact_mut(chunk);
            let mut data: [&mut [u8]; MAX_MEMBERS] =
                std::array::from_fn(|_| it.next().unwrap_or(&mut []));
            be.raid6_recover(&mut data[..n - 2], p, q, Lost::DataData(0, n - 3));
        }
        (Op::Crc, _) => {
            for c in stripe.chunks_exact(chunk).take(n - 1) {
                black_box(parity::crc32c(c));
            }
        }
        #[allow(unreachable_patterns)]
        _ => unreachable!(),
    }
}

/// Best-of-`reps` throughput in GB/s.
#[allow(clippy::too_many_arguments)]
fn measure(
    arena: &mut Arena,
    op: Op,
    imp: Imp,
    n: usize,
    chunk: usize,
    cold: bool,
    target: Duration,
    reps: usize,
) -> f64 {
    let stripes = if cold {
        COLD_BYTES.div_ceil(n * chunk)
    } else {
        1
    };
    let bytes_per_op = (op.sources(n) * chunk) as f64;
    let mut best = 0.0f64;
    let mut s = 0;
    for _ in 0..reps {
        let t0 = Instant::now();
        let mut ops = 0u64;
        loop {
            // Amortise the clock read over a few operations.
            for _ in 0..8 {
                run_op(op, imp, arena.stripe(n, chunk, s), n, chunk);
                s += 1;
                if s == stripes {
                    s = 0;
                }
                ops += 1;
            }
            if t0.elapsed() >= target {
                break;
            }
        }
        let gbps = bytes_per_op * ops as f64 / t0.elapsed().as_secs_f64() / 1e9;
        best = best.max(gbps);
    }
    best
}

/// Verify that our P/Q (and CRC) match ISA-L's on the same data.
#[cfg(feature = "isal")]
fn cross_check(arena: &mut Arena) {
    for &(n, chunk) in &[(4usize, 4096usize), (16, 65536)] {
        let st = arena.stripe(n, chunk, 7);
        run_op(Op::Pq, Imp::Isal, st, n, chunk);
        let theirs = st[(n - 2) * chunk..].to_vec();
        run_op(Op::Pq, Imp::Ours, st, n, chunk);
        assert_eq!(
            &st[(n - 2) * chunk..],
            &theirs[..],
            "pq_gen differs from ISA-L"
        );
        run_op(Op::Xor, Imp::Isal, st, n, chunk);
        let theirs = st[(n - 1) * chunk..].to_vec();
        run_op(Op::Xor, Imp::Ours, st, n, chunk);
        assert_eq!(
            &st[(n - 1) * chunk..],
            &theirs[..],
            "xor_gen differs from ISA-L"
        );
        let c = &mut st[..chunk];
        // SAFETY: valid buffer of `chunk` bytes; ISA-L only reads it.
        let theirs = unsafe { isal::crc32_iscsi(c.as_mut_ptr(), chunk as i32, 0x1234_5678) };
        assert_eq!(parity::crc32c_raw(0x1234_5678, c), theirs, "crc differs");
    }
    eprintln!("cross-check vs ISA-L: pq_gen, xor_gen, crc32c byte-identical");
}

struct Row {
    op: Op,
    n: usize,
    chunk: usize,
    cold: bool,
    imp: Imp,
    gbps: f64,
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let quick = args.iter().any(|a| a == "--quick");
    let json = args.iter().any(|a| a == "--json");
    let no_stream = args.iter().any(|a| a == "--no-stream");
    if let Some(bad) = args
        .iter()
        .find(|a| !["--quick", "--json", "--no-stream"].contains(&a.as_str()))
    {
        eprintln!("unknown argument {bad}; usage: parity_bench [--quick] [--json] [--no-stream]");
        std::process::exit(2);
    }
    if no_stream {
        parity::set_streaming_store_threshold(usize::MAX);
    }
    let (target, reps) = if quick {
        (Duration::from_millis(40), 1)
    } else {
        (Duration::from_millis(250), 3)
    };

    let mut arena = Arena::new(COLD_BYTES + MAX_MEMBERS * 65536);
    #[cfg(feature = "isal")]
    cross_check(&mut arena);

    let mut imps = vec![Imp::Ours, Imp::Scalar];
    if cfg!(feature = "isal") {
        imps.push(Imp::Isal);
    }
    let members: &[usize] = &[4, 8, 16];
    let chunks: &[usize] = &[4096, 65536];

    let mut rows = Vec::new();
    for &op in &[Op::Xor, Op::Pq, Op::Rec2, Op::Crc] {
        for &n in members {
            for &chunk in chunks {
                for &cold in &[false, true] {
                    for &imp in &imps {
                        // ISA-L has no two-failure RAID6 call; crc has no scalar variant.
                        if (op == Op::Rec2 && imp == Imp::Isal)
                            || (op == Op::Crc && imp == Imp::Scalar)
                        {
                            continue;
                        }
                        let gbps = measure(&mut arena, op, imp, n, chunk, cold, target, reps);
                        rows.push(Row {
                            op,
                            n,
                            chunk,
                            cold,
                            imp,
                            gbps,
                        });
                    }
                }
            }
        }
    }

    let get = |r: &Row, imp: Imp| {
        rows.iter()
            .find(|x| {
                x.op == r.op && x.n == r.n && x.chunk == r.chunk && x.cold == r.cold && x.imp == imp
            })
            .map(|x| x.gbps)
    };

    if json {
        let items: Vec<String> = rows
            .iter()
            .map(|r| {
                format!(
                    "{{\"op\":\"{}\",\"members\":{},\"chunk\":{},\"cache\":\"{}\",\"impl\":\"{}\",\"backend\":\"{}\",\"gbps\":{:.3}}}",
                    r.op.name(),
                    r.n,
                    r.chunk,
                    if r.cold { "cold" } else { "hot" },
                    r.imp.name(),
                    match r.imp {
                        Imp::Ours => parity::backend_name(),
                        Imp::Scalar => "scalar",
                        Imp::Isal => "isal",
                    },
                    r.gbps
                )
            })
            .collect();
        println!("[\n  {}\n]", items.join(",\n  "));
        return;
    }

    println!(
        "parity_bench: backend={} streaming-store threshold={} single thread, GB/s of source data, best of {reps} x {} ms{}",
        parity::backend_name(),
        match parity::streaming_store_threshold() {
            usize::MAX => "off".to_string(),
            t => format!("{} KiB", t >> 10),
        },
        target.as_millis(),
        if quick { " (quick)" } else { "" }
    );
    println!(
        "{:<8} {:>2} {:>6} {:>5} {:>8} {:>8} {:>8} {:>9} {:>9}",
        "op", "n", "chunk", "cache", "ours", "scalar", "isal", "ours/isal", "ours/scal"
    );
    for r in rows.iter().filter(|r| r.imp == Imp::Ours) {
        let fmt = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.2}"));
        let sc = get(r, Imp::Scalar);
        let is = get(r, Imp::Isal);
        println!(
            "{:<8} {:>2} {:>5}K {:>5} {:>8.2} {:>8} {:>8} {:>9} {:>9}",
            r.op.name(),
            r.n,
            r.chunk / 1024,
            if r.cold { "cold" } else { "hot" },
            r.gbps,
            fmt(sc),
            fmt(is),
            is.map_or("-".into(), |i| format!("{:.2}", r.gbps / i)),
            sc.map_or("-".into(), |s| format!("{:.1}x", r.gbps / s)),
        );
    }
}
