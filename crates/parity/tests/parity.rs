//! Integration tests: md test vectors, every backend against the byte-wise
//! reference, RMW, recovery of every `Lost` combination, an exhaustive
//! two-failure sweep (like md's lib/raid6/test/test.c) and an independent
//! `gf256` oracle.

use parity::{reference, Backend, Lost};
use proptest::prelude::*;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

/// `n` random blocks of `len` bytes, each living at byte offset `align` (0..32)
/// inside its own allocation so SIMD code sees unaligned pointers.
struct Blocks {
    bufs: Vec<Vec<u8>>,
    align: usize,
    len: usize,
}

impl Blocks {
    fn random(rng: &mut SmallRng, n: usize, len: usize, align: usize) -> Self {
        let bufs = (0..n)
            .map(|_| {
                let mut v = vec![0u8; len + align];
                rng.fill(&mut v[..]);
                v
            })
            .collect();
        Blocks { bufs, align, len }
    }
    fn get(&self) -> Vec<&[u8]> {
        self.bufs
            .iter()
            .map(|b| &b[self.align..self.align + self.len])
            .collect()
    }
    fn get_mut(&mut self) -> Vec<&mut [u8]> {
        let (a, l) = (self.align, self.len);
        self.bufs.iter_mut().map(|b| &mut b[a..a + l]).collect()
    }
    fn owned(&self) -> Vec<Vec<u8>> {
        self.get().iter().map(|b| b.to_vec()).collect()
    }
}

/// A zero-initialised buffer of `len` bytes at offset `align`.
fn out(len: usize, align: usize) -> (Vec<u8>, usize) {
    (vec![0u8; len + align], align)
}

fn backends() -> Vec<Backend> {
    let b = Backend::available();
    assert!(b.contains(&Backend::Scalar));
    b
}

fn xor_all(bufs: &[Vec<u8>]) -> Vec<u8> {
    let mut r = vec![0u8; bufs[0].len()];
    for b in bufs {
        for (x, y) in r.iter_mut().zip(b) {
            *x ^= y;
        }
    }
    r
}

// ---------------------------------------------------------------- vectors

#[test]
fn md_vector_pq() {
    for len in [1usize, 31, 32, 100, 4096] {
        let d: Vec<Vec<u8>> = [0x11u8, 0x22, 0x33].iter().map(|&b| vec![b; len]).collect();
        let refs: Vec<&[u8]> = d.iter().map(|v| &v[..]).collect();
        let (mut p, mut q) = (vec![0xaa; len], vec![0xaa; len]);
        reference::pq_gen(&refs, &mut p, &mut q);
        assert!(p.iter().all(|&x| x == 0x00) && q.iter().all(|&x| x == 0x99));
        for be in backends() {
            let (mut p, mut q) = (vec![0xaa; len], vec![0xaa; len]);
            be.pq_gen(&refs, &mut p, &mut q);
            assert!(p.iter().all(|&x| x == 0x00), "{be:?} P");
            assert!(q.iter().all(|&x| x == 0x99), "{be:?} Q");
        }
        let (mut p, mut q) = (vec![0; len], vec![0; len]);
        parity::pq_gen(&refs, &mut p, &mut q);
        assert_eq!((p[0], q[0]), (0x00, 0x99));
    }
}

#[test]
fn md_vector_recover_d0_d2() {
    for be in backends() {
        for len in [1usize, 33, 4096 + 5] {
            let mut d0 = vec![0xeeu8; len];
            let mut d1 = vec![0x22u8; len];
            let mut d2 = vec![0x55u8; len];
            let mut p = vec![0x00u8; len];
            let mut q = vec![0x99u8; len];
            let mut data: Vec<&mut [u8]> = vec![&mut d0, &mut d1, &mut d2];
            be.raid6_recover(&mut data, &mut p, &mut q, Lost::DataData(0, 2));
            assert!(d0.iter().all(|&x| x == 0x11), "{be:?}");
            assert!(d2.iter().all(|&x| x == 0x33), "{be:?}");
            assert!(d1.iter().all(|&x| x == 0x22));
        }
    }
}

#[test]
fn gf_scalars() {
    assert_eq!(parity::gf_exp(8), 0x1d);
    assert_eq!(parity::gf_inv(2), 0x8e);
    assert_eq!(parity::gf_mul(0x8e, 2), 1);
    assert_eq!(
        parity::gf_mul(parity::gf_exp(200), parity::gf_exp(100)),
        parity::gf_exp(45)
    );
    assert_eq!(parity::gf_log(0x1d), Some(8));
}

#[test]
fn crc_vectors() {
    assert_eq!(parity::crc32c(b"123456789"), 0xe306_9283);
    let uuid: Vec<u8> = (0u8..16).collect();
    let seed = parity::crc32c_raw(0xFFFF_FFFF, &uuid);
    assert_eq!(seed, 0x2636_f714);
    assert_eq!(parity::crc32c_raw(seed, &[0u8; 4096]), 0xb330_4a14);
}

#[test]
fn backend_selection() {
    let name = parity::backend_name();
    assert!(["avx2", "scalar"].contains(&name), "{name}");
    assert_eq!(Backend::detect().name(), name);
    assert!(Backend::detect().is_available());
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") && std::env::var(parity::BACKEND_ENV).is_err() {
        assert_eq!(name, "avx2");
    }
}

// ---------------------------------------------------------------- gf256 oracle

// The gf256 macro expansion trips clippy lints that are not ours to fix.
#[allow(non_camel_case_types, clippy::all)]
mod oracle {
    use gf256::gf::gf;
    #[gf(polynomial = 0x11d, generator = 0x2)]
    pub type gf_md;
}

#[test]
fn pq_gen_matches_gf256_oracle() {
    use oracle::gf_md;
    let mut rng = SmallRng::seed_from_u64(0x5eed);
    for &(n, len) in &[(1usize, 7usize), (2, 64), (4, 1000), (13, 333), (32, 257)] {
        let b = Blocks::random(&mut rng, n, len, 3);
        let data = b.get();
        let (mut p, mut q) = (vec![0u8; len], vec![0u8; len]);
        parity::pq_gen(&data, &mut p, &mut q);
        for k in 0..len {
            let mut pp = gf_md::new(0);
            let mut qq = gf_md::new(0);
            for (i, d) in data.iter().enumerate() {
                pp += gf_md::new(d[k]);
                qq += gf_md::GENERATOR.pow(i as u8) * gf_md::new(d[k]);
            }
            assert_eq!(p[k], u8::from(pp), "P n={n} k={k}");
            assert_eq!(q[k], u8::from(qq), "Q n={n} k={k}");
        }
    }
    // Scalar helpers agree with gf256 on every pair.
    for a in 0..=255u8 {
        for b in 0..=255u8 {
            assert_eq!(
                parity::gf_mul(a, b),
                u8::from(gf_md::new(a) * gf_md::new(b))
            );
        }
    }
}

// ---------------------------------------------------------------- exhaustive

/// Every pair (and every single) of lost blocks among data + P + Q for 4..=20
/// data blocks, every backend. Block length 77 exercises SIMD + scalar tail.
#[test]
fn exhaustive_two_failures() {
    let mut rng = SmallRng::seed_from_u64(20);
    let len = 64 + 13;
    for be in backends() {
        for n in 4..=20usize {
            let b = Blocks::random(&mut rng, n, len, 1);
            let orig = b.owned();
            let (mut p0, mut q0) = (vec![0; len], vec![0; len]);
            reference::pq_gen(&b.get(), &mut p0, &mut q0);
            // Index n is P, n + 1 is Q.
            for x in 0..n + 2 {
                for y in x..n + 2 {
                    let lost = match (x, y) {
                        _ if x == y && x < n => Lost::Data(x),
                        _ if x == y && x == n => Lost::P,
                        _ if x == y => Lost::Q,
                        _ if y < n => Lost::DataData(x, y),
                        _ if x < n && y == n => Lost::DataP(x),
                        _ if x < n => Lost::DataQ(x),
                        _ => Lost::PQ,
                    };
                    let mut d = orig.clone();
                    let (mut p, mut q) = (p0.clone(), q0.clone());
                    for i in [x, y] {
                        match i {
                            i if i < n => d[i].fill(0xa5),
                            i if i == n => p.fill(0xa5),
                            _ => q.fill(0xa5),
                        }
                    }
                    let mut dm: Vec<&mut [u8]> = d.iter_mut().map(|v| &mut v[..]).collect();
                    be.raid6_recover(&mut dm, &mut p, &mut q, lost);
                    assert_eq!(d, orig, "{be:?} n={n} {lost:?}");
                    assert_eq!(p, p0, "{be:?} n={n} {lost:?} P");
                    assert_eq!(q, q0, "{be:?} n={n} {lost:?} Q");
                }
            }
        }
    }
}

// ---------------------------------------------------------------- properties

fn arb_lost(n: usize) -> impl Strategy<Value = Lost> {
    let a = 0..n;
    prop_oneof![
        Just(Lost::Nothing),
        Just(Lost::P),
        Just(Lost::Q),
        Just(Lost::PQ),
        a.clone().prop_map(Lost::Data),
        a.clone().prop_map(Lost::DataP),
        a.clone().prop_map(Lost::DataQ),
        // A distinct second syndrome (for a single data block fall back to `Data`).
        (a, 1..n.max(2)).prop_map(move |(x, d)| if n < 2 {
            Lost::Data(x)
        } else {
            Lost::DataData(x, (x + d) % n)
        }),
    ]
}

/// (len, n, align, seed); lengths cover 0, odd sizes, one/more SIMD blocks + tails.
fn arb_geom(max_n: usize) -> impl Strategy<Value = (usize, usize, usize, u64)> {
    (
        prop_oneof![0usize..300, 300usize..5000],
        1..=max_n,
        0usize..32,
        any::<u64>(),
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn backends_match_reference((len, n, align, seed) in arb_geom(32), coef in any::<u8>()) {
        let mut rng = SmallRng::seed_from_u64(seed);
        let b = Blocks::random(&mut rng, n, len, align);
        let srcs = b.get();

        let mut want_x = vec![0u8; len];
        reference::xor_gen(&srcs, &mut want_x);
        let (mut want_p, mut want_q) = (vec![0u8; len], vec![0u8; len]);
        reference::pq_gen(&srcs, &mut want_p, &mut want_q);
        let mut want_m = srcs[n - 1].to_vec();
        reference::gf_mul_xor(coef, srcs[0], &mut want_m);
        prop_assert_eq!(&want_p, &want_x);

        let oa = (align * 7 + 5) % 32;
        for be in backends() {
            let (mut x, o) = out(len, oa);
            x[..o].fill(0x77);
            be.xor_gen(&srcs, &mut x[o..]);
            prop_assert_eq!(&x[o..], &want_x[..], "{:?} xor_gen", be);
            prop_assert!(x[..o].iter().all(|&v| v == 0x77), "{:?} wrote before dst", be);

            let (mut p, o) = out(len, oa);
            let (mut q, _) = out(len, oa);
            be.pq_gen(&srcs, &mut p[o..], &mut q[o..]);
            prop_assert_eq!(&p[o..], &want_p[..], "{:?} P", be);
            prop_assert_eq!(&q[o..], &want_q[..], "{:?} Q", be);

            let mut m = srcs[n - 1].to_vec();
            be.gf_mul_xor(coef, srcs[0], &mut m);
            prop_assert_eq!(&m, &want_m, "{:?} gf_mul_xor({})", be, coef);

            let mut acc = srcs[0].to_vec();
            for s in &srcs[1..] {
                be.xor_into(&mut acc, s);
            }
            prop_assert_eq!(&acc, &want_x, "{:?} xor_into", be);
        }
    }

    #[test]
    fn pq_update_equals_regen((len, n, align, seed) in arb_geom(24), pick in any::<usize>()) {
        let mut rng = SmallRng::seed_from_u64(seed);
        let mut b = Blocks::random(&mut rng, n, len, align);
        let syndrome = pick % n;
        let (mut p0, mut q0) = (vec![0u8; len], vec![0u8; len]);
        reference::pq_gen(&b.get(), &mut p0, &mut q0);
        let mut new = vec![0u8; len];
        rng.fill(&mut new[..]);
        let delta: Vec<u8> = b.get()[syndrome].iter().zip(&new).map(|(o, n)| o ^ n).collect();
        b.get_mut()[syndrome].copy_from_slice(&new);
        let (mut p1, mut q1) = (vec![0u8; len], vec![0u8; len]);
        reference::pq_gen(&b.get(), &mut p1, &mut q1);

        let (mut rp, mut rq) = (p0.clone(), q0.clone());
        reference::pq_update(&delta, syndrome, &mut rp, &mut rq);
        prop_assert_eq!(&rp, &p1);
        prop_assert_eq!(&rq, &q1);
        for be in backends() {
            let (mut p, mut q) = (p0.clone(), q0.clone());
            be.pq_update(&delta, syndrome, &mut p, &mut q);
            prop_assert_eq!(&p, &p1, "{:?} P syndrome {}", be, syndrome);
            prop_assert_eq!(&q, &q1, "{:?} Q syndrome {}", be, syndrome);
        }
        // Slot numbers wrap mod 255 like g^i.
        let (mut p, mut q) = (p0.clone(), q0.clone());
        parity::pq_update(&delta, syndrome + 255, &mut p, &mut q);
        prop_assert_eq!(&q, &q1);
    }

    #[test]
    fn raid6_recover_restores(
        (len, n, align, seed, lost) in arb_geom(24)
            .prop_flat_map(|(len, n, align, seed)| (Just(len), Just(n), Just(align), Just(seed), arb_lost(n)))
    ) {
        let mut rng = SmallRng::seed_from_u64(seed);
        let b = Blocks::random(&mut rng, n, len, align);
        let orig = b.owned();
        let (mut p0, mut q0) = (vec![0u8; len], vec![0u8; len]);
        reference::pq_gen(&b.get(), &mut p0, &mut q0);
        for be in backends() {
            let mut b2 = Blocks { bufs: b.bufs.clone(), align, len };
            let (mut p, mut q) = (p0.clone(), q0.clone());
            // Trash exactly what was lost.
            {
                let mut d = b2.get_mut();
                let mut trash = |x: &mut [u8]| rng.fill(x);
                match lost {
                    Lost::Nothing => {}
                    Lost::P => trash(&mut p),
                    Lost::Q => trash(&mut q),
                    Lost::PQ => { trash(&mut p); trash(&mut q) }
                    Lost::Data(a) => trash(d[a]),
                    Lost::DataP(a) => { trash(d[a]); trash(&mut p) }
                    Lost::DataQ(a) => { trash(d[a]); trash(&mut q) }
                    Lost::DataData(a, c) => { trash(d[a]); trash(d[c]) }
                }
                be.raid6_recover(&mut d, &mut p, &mut q, lost);
            }
            prop_assert_eq!(&b2.owned(), &orig, "{:?} {:?} data", be, lost);
            prop_assert_eq!(&p, &p0, "{:?} {:?} P", be, lost);
            prop_assert_eq!(&q, &q0, "{:?} {:?} Q", be, lost);
        }
    }

    #[test]
    fn raid5_recover_restores((len, n, align, seed) in arb_geom(24), pick in any::<usize>()) {
        let mut rng = SmallRng::seed_from_u64(seed);
        let mut b = Blocks::random(&mut rng, n + 1, len, align);
        // Make the last block the parity of the others.
        let par = xor_all(&b.owned()[..n]);
        b.get_mut()[n].copy_from_slice(&par);
        let orig = b.owned();
        let lost = pick % (n + 1);
        for be in backends() {
            let mut b2 = Blocks { bufs: b.bufs.clone(), align, len };
            let mut blocks = b2.get_mut();
            rng.fill(&mut *blocks[lost]);
            be.raid5_recover(&mut blocks, lost);
            prop_assert_eq!(&b2.owned(), &orig, "{:?} lost {}", be, lost);
        }
    }
}

// ---------------------------------------------------------------- contracts

#[test]
#[should_panic]
fn xor_gen_length_mismatch_panics() {
    let a = [0u8; 10];
    let b = [0u8; 11];
    let mut d = [0u8; 10];
    parity::xor_gen(&[&a, &b], &mut d);
}

#[test]
#[should_panic]
fn pq_gen_no_data_panics() {
    let (mut p, mut q) = ([0u8; 4], [0u8; 4]);
    parity::pq_gen(&[], &mut p, &mut q);
}

#[test]
#[should_panic]
fn recover_same_syndrome_panics() {
    let (mut a, mut b) = ([0u8; 4], [0u8; 4]);
    let (mut p, mut q) = ([0u8; 4], [0u8; 4]);
    parity::raid6_recover(&mut [&mut a, &mut b], &mut p, &mut q, Lost::DataData(1, 1));
}

#[test]
#[should_panic]
fn recover_slot_out_of_range_panics() {
    let (mut a, mut b) = ([0u8; 4], [0u8; 4]);
    let (mut p, mut q) = ([0u8; 4], [0u8; 4]);
    parity::raid6_recover(&mut [&mut a, &mut b], &mut p, &mut q, Lost::DataP(2));
}

#[test]
fn recover_reversed_pair_and_single_data_block() {
    let mut rng = SmallRng::seed_from_u64(1);
    // One data block: P = Q = D0, any single/double loss works.
    let b = Blocks::random(&mut rng, 1, 100, 0);
    let orig = b.owned();
    let (mut p0, mut q0) = (vec![0u8; 100], vec![0u8; 100]);
    parity::pq_gen(&b.get(), &mut p0, &mut q0);
    assert_eq!(p0, orig[0]);
    assert_eq!(q0, orig[0]);
    for lost in [Lost::DataP(0), Lost::DataQ(0), Lost::Data(0), Lost::PQ] {
        let mut d = if lost == Lost::PQ {
            orig[0].clone()
        } else {
            vec![0u8; 100]
        };
        let (mut p, mut q) = (p0.clone(), q0.clone());
        if matches!(lost, Lost::DataP(_) | Lost::PQ) {
            p.fill(1);
        }
        if matches!(lost, Lost::DataQ(_) | Lost::PQ) {
            q.fill(1);
        }
        parity::raid6_recover(&mut [&mut d], &mut p, &mut q, lost);
        assert_eq!(d, orig[0], "{lost:?}");
        assert_eq!((&p, &q), (&p0, &q0), "{lost:?}");
    }
    // DataData(b, a) with b > a is accepted.
    let b = Blocks::random(&mut rng, 6, 200, 0);
    let orig = b.owned();
    let (mut p, mut q) = (vec![0u8; 200], vec![0u8; 200]);
    parity::pq_gen(&b.get(), &mut p, &mut q);
    let mut d = orig.clone();
    d[4].fill(0);
    d[1].fill(0);
    let mut dm: Vec<&mut [u8]> = d.iter_mut().map(|v| &mut v[..]).collect();
    parity::raid6_recover(&mut dm, &mut p, &mut q, Lost::DataData(4, 1));
    assert_eq!(d, orig);
}
