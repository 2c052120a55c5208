//! Reconstruction of lost blocks (RAID4/5 by XOR, RAID6 by the formulas in
//! md-format.md 3.4), expressed as calls of the fused syndrome kernel.
//!
//! Lost data buffers are temporarily `mem::take`n out of the caller's slice, which
//! leaves an empty slice in their syndrome: the kernels treat an empty data block as a
//! zero block (a "hole" in the Horner evaluation). They are put back before return.

use crate::gf::{gf_exp, gf_inv};
use crate::{Backend, Lost, Mode};

fn check_lengths(blocks: &[&mut [u8]], len: usize) {
    for b in blocks {
        assert_eq!(
            b.len(),
            len,
            "all blocks of a stripe must have the same length"
        );
    }
}

/// Index of the highest non-empty block.
fn top(data: &[&[u8]]) -> Option<usize> {
    data.iter().rposition(|d| !d.is_empty())
}

pub(crate) fn raid5_recover(be: Backend, blocks: &mut [&mut [u8]], lost: usize) {
    assert!(
        blocks.len() >= 2,
        "raid5_recover needs at least 2 blocks (1 data + parity)"
    );
    assert!(lost < blocks.len(), "lost index {lost} out of range");
    let len = blocks[0].len();
    check_lengths(blocks, len);
    let dst = std::mem::take(&mut blocks[lost]);
    {
        let srcs: Vec<&[u8]> = blocks
            .iter()
            .enumerate()
            .filter(|&(i, _)| i != lost)
            .map(|(_, b)| &**b)
            .collect();
        be.xor_impl(&srcs, dst, false);
    }
    blocks[lost] = dst;
}

pub(crate) fn raid6_recover(
    be: Backend,
    data: &mut [&mut [u8]],
    p: &mut [u8],
    q: &mut [u8],
    lost: Lost,
) {
    let n = data.len();
    assert!(n >= 1, "raid6_recover needs at least one data block");
    let len = p.len();
    assert_eq!(q.len(), len, "P and Q must have the same length");
    check_lengths(data, len);
    let index_ok = |a: usize| assert!(a < n, "lost syndrome {a} out of range (data blocks: {n})");
    match lost {
        Lost::Nothing => {}
        Lost::P => {
            let srcs: Vec<&[u8]> = data.iter().map(|d| &**d).collect();
            be.xor_impl(&srcs, p, false);
        }
        Lost::Q => {
            let srcs: Vec<&[u8]> = data.iter().map(|d| &**d).collect();
            be.syndrome_impl(&srcs, top(&srcs), Mode::GenQ, p, q, &mut [], &mut [], len);
        }
        Lost::PQ => {
            let srcs: Vec<&[u8]> = data.iter().map(|d| &**d).collect();
            be.syndrome_impl(&srcs, top(&srcs), Mode::Gen, p, q, &mut [], &mut [], len);
        }
        Lost::Data(a) => {
            index_ok(a);
            let da = std::mem::take(&mut data[a]);
            {
                let mut srcs: Vec<&[u8]> = Vec::with_capacity(n);
                srcs.push(p);
                srcs.extend(
                    data.iter()
                        .enumerate()
                        .filter(|&(i, _)| i != a)
                        .map(|(_, d)| &**d),
                );
                be.xor_impl(&srcs, da, false);
            }
            data[a] = da;
        }
        Lost::DataP(a) => {
            index_ok(a);
            let da = std::mem::take(&mut data[a]);
            {
                let srcs: Vec<&[u8]> = data.iter().map(|d| &**d).collect();
                // D_a = g^-a · (Q ⊕ Q'), Q' computed with D_a = 0; then P = P' ⊕ D_a.
                let ca = gf_inv(gf_exp(a));
                be.syndrome_impl(&srcs, top(&srcs), Mode::DataP(ca), p, q, da, &mut [], len);
            }
            data[a] = da;
        }
        Lost::DataQ(a) => {
            index_ok(a);
            let da = std::mem::take(&mut data[a]);
            {
                let srcs: Vec<&[u8]> = data.iter().map(|d| &**d).collect();
                // D_a = P ⊕ P'; then Q = Q' ⊕ g^a · D_a.
                let ca = gf_exp(a);
                be.syndrome_impl(&srcs, top(&srcs), Mode::DataQ(ca), p, q, da, &mut [], len);
            }
            data[a] = da;
        }
        Lost::DataData(x, y) => {
            index_ok(x);
            index_ok(y);
            assert_ne!(x, y, "DataData needs two distinct syndromes");
            let (a, b) = if x < y { (x, y) } else { (y, x) };
            assert!(
                (b - a) % 255 != 0,
                "syndromes {a} and {b} share a Q coefficient (more than 255 data blocks)"
            );
            // Take the higher syndrome first so the lower index stays valid.
            let db = std::mem::take(&mut data[b]);
            let da = std::mem::take(&mut data[a]);
            {
                let srcs: Vec<&[u8]> = data.iter().map(|d| &**d).collect();
                // Pxy = P ⊕ P', Qxy = Q ⊕ Q' (D_a = D_b = 0 in P', Q');
                // D_b = (g^(b-a) ⊕ 1)^-1 · Pxy ⊕ (g^a ⊕ g^b)^-1 · Qxy; D_a = D_b ⊕ Pxy.
                let ca = gf_inv(gf_exp(b - a) ^ 1);
                let cb = gf_inv(gf_exp(a) ^ gf_exp(b));
                be.syndrome_impl(&srcs, top(&srcs), Mode::DataData(ca, cb), p, q, da, db, len);
            }
            data[a] = da;
            data[b] = db;
        }
    }
}
