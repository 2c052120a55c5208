//! The non-temporal-store paths (own process: the threshold is global state).

use parity::{reference, Backend, Lost};
use proptest::prelude::*;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

/// A buffer of `len` bytes starting at a 64-byte aligned address plus `skew`.
fn buf(len: usize, skew: usize) -> (Vec<u8>, usize) {
    let v = vec![0u8; len + 128];
    let start = v.as_ptr().align_offset(64) + skew;
    (v, start)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn streaming_matches_reference(
        len in prop_oneof![0usize..200, 200usize..20000],
        n in 1usize..=12,
        skew in prop_oneof![Just(0usize), Just(32), 0usize..64],
        seed in any::<u64>(),
    ) {
        parity::set_streaming_store_threshold(0);
        prop_assert_eq!(parity::streaming_store_threshold(), 0);
        let mut rng = SmallRng::seed_from_u64(seed);
        let data: Vec<Vec<u8>> = (0..n)
            .map(|_| {
                let mut v = vec![0u8; len];
                rng.fill(&mut v[..]);
                v
            })
            .collect();
        let srcs: Vec<&[u8]> = data.iter().map(|v| &v[..]).collect();
        let mut want_x = vec![0u8; len];
        reference::xor_gen(&srcs, &mut want_x);
        let (mut want_p, mut want_q) = (vec![0u8; len], vec![0u8; len]);
        reference::pq_gen(&srcs, &mut want_p, &mut want_q);

        for be in Backend::available() {
            let (mut x, o) = buf(len, skew);
            be.xor_gen(&srcs, &mut x[o..o + len]);
            prop_assert_eq!(&x[o..o + len], &want_x[..], "{:?}", be);
            prop_assert!(x[..o].iter().chain(&x[o + len..]).all(|&b| b == 0));

            let (mut p, po) = buf(len, skew);
            let (mut q, qo) = buf(len, skew);
            be.pq_gen(&srcs, &mut p[po..po + len], &mut q[qo..qo + len]);
            prop_assert_eq!(&p[po..po + len], &want_p[..], "{:?}", be);
            prop_assert_eq!(&q[qo..qo + len], &want_q[..], "{:?}", be);

            if n >= 2 {
                for lost in [Lost::DataData(0, n - 1), Lost::DataP(n - 1), Lost::DataQ(0), Lost::PQ] {
                    let mut owned: Vec<(Vec<u8>, usize)> = data
                        .iter()
                        .map(|d| {
                            let (mut b, o) = buf(len, skew);
                            b[o..o + len].copy_from_slice(d);
                            (b, o)
                        })
                        .collect();
                    let (mut p2, mut q2) = (p.clone(), q.clone());
                    let mut dm: Vec<&mut [u8]> =
                        owned.iter_mut().map(|(b, o)| &mut b[*o..*o + len]).collect();
                    match lost {
                        Lost::DataData(a, b) => { dm[a].fill(0); dm[b].fill(0); }
                        Lost::DataP(a) => { dm[a].fill(0); p2[po..po + len].fill(0); }
                        Lost::DataQ(a) => { dm[a].fill(0); q2[qo..qo + len].fill(0); }
                        _ => { p2[po..po + len].fill(0); q2[qo..qo + len].fill(0); }
                    }
                    be.raid6_recover(&mut dm, &mut p2[po..po + len], &mut q2[qo..qo + len], lost);
                    for (i, d) in dm.iter().enumerate() {
                        prop_assert_eq!(&d[..], &data[i][..], "{:?} {:?}", be, lost);
                    }
                    prop_assert_eq!(&p2, &p);
                    prop_assert_eq!(&q2, &q);
                }
            }
        }
    }
}
