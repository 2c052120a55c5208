//! Portable implementations.
//!
//! * [`reference`]: the byte-at-a-time oracle. Written as directly from the
//!   formulas as possible (Horner for Q, bit-serial GF multiply), shared by
//!   the property tests and the benchmark. Never used on the hot path.
//! * The rest: the `scalar` backend (u64 SWAR lanes with a byte tail), used when
//!   no SIMD backend is available and for the tails of SIMD loops. Every
//!   function takes a `start` offset and processes `start..len`, so the SIMD
//!   code can hand over its unaligned tail without re-slicing.

use crate::gf::{self, mul2_u64, MUL};
use crate::Mode;

/// Byte-wise reference implementations (the test oracle). Slow (~0.1–1 GB/s).
pub mod reference {
    use crate::gf::{mul2, mul_bitwise};

    fn same_len(blocks: &[&[u8]], len: usize) {
        for b in blocks {
            assert_eq!(b.len(), len, "all blocks must have the same length");
        }
    }

    /// `dst = srcs[0] ^ srcs[1] ^ ...`.
    pub fn xor_gen(srcs: &[&[u8]], dst: &mut [u8]) {
        assert!(!srcs.is_empty(), "xor_gen needs at least one source");
        same_len(srcs, dst.len());
        for (k, d) in dst.iter_mut().enumerate() {
            *d = srcs.iter().fold(0, |acc, s| acc ^ s[k]);
        }
    }

    /// `P = ⊕ D_i`, `Q = ⊕ g^i·D_i`, Q evaluated by Horner from the highest syndrome down.
    pub fn pq_gen(data: &[&[u8]], p: &mut [u8], q: &mut [u8]) {
        assert!(!data.is_empty(), "pq_gen needs at least one data block");
        same_len(data, p.len());
        assert_eq!(q.len(), p.len());
        for k in 0..p.len() {
            let mut pp = 0u8;
            let mut qq = 0u8;
            for d in data.iter().rev() {
                pp ^= d[k];
                qq = mul2(qq) ^ d[k];
            }
            p[k] = pp;
            q[k] = qq;
        }
    }

    /// `dst ^= coef · src`.
    pub fn gf_mul_xor(coef: u8, src: &[u8], dst: &mut [u8]) {
        assert_eq!(src.len(), dst.len());
        for (d, s) in dst.iter_mut().zip(src) {
            *d ^= mul_bitwise(coef, *s);
        }
    }

    /// `p ^= delta; q ^= g^syndrome · delta`.
    pub fn pq_update(delta: &[u8], syndrome: usize, p: &mut [u8], q: &mut [u8]) {
        assert_eq!(delta.len(), p.len());
        assert_eq!(delta.len(), q.len());
        let mut c = 1u8;
        for _ in 0..syndrome % 255 {
            c = mul2(c);
        }
        for k in 0..delta.len() {
            p[k] ^= delta[k];
            q[k] ^= mul_bitwise(c, delta[k]);
        }
    }
}

/// A "lane" the generic portable kernels operate on: `u64` (8 bytes, SWAR) or `u8`.
trait Lane: Copy + core::ops::BitXor<Output = Self> + core::ops::BitXorAssign {
    const ZERO: Self;
    fn load(s: &[u8], off: usize) -> Self;
    fn store(self, d: &mut [u8], off: usize);
    fn mul2(self) -> Self;
    fn mulc(self, c: u8) -> Self;
}

impl Lane for u64 {
    const ZERO: Self = 0;
    #[inline(always)]
    fn load(s: &[u8], off: usize) -> Self {
        let b: [u8; 8] = s[off..off + 8].try_into().expect("8 bytes");
        u64::from_ne_bytes(b)
    }
    #[inline(always)]
    fn store(self, d: &mut [u8], off: usize) {
        d[off..off + 8].copy_from_slice(&self.to_ne_bytes());
    }
    #[inline(always)]
    fn mul2(self) -> Self {
        mul2_u64(self)
    }
    #[inline(always)]
    fn mulc(self, c: u8) -> Self {
        let row = &MUL[c as usize];
        u64::from_ne_bytes(self.to_ne_bytes().map(|b| row[b as usize]))
    }
}

impl Lane for u8 {
    const ZERO: Self = 0;
    #[inline(always)]
    fn load(s: &[u8], off: usize) -> Self {
        s[off]
    }
    #[inline(always)]
    fn store(self, d: &mut [u8], off: usize) {
        d[off] = self;
    }
    #[inline(always)]
    fn mul2(self) -> Self {
        gf::mul2(self)
    }
    #[inline(always)]
    fn mulc(self, c: u8) -> Self {
        MUL[c as usize][self as usize]
    }
}

/// Run `$body` with `$ty = u64` for every whole 8-byte lane at `$off` in
/// `start..len`, then with `$ty = u8` for every byte of the tail.
macro_rules! lanes {
    ($start:expr, $len:expr, |$ty:ident, $off:ident| $body:block) => {{
        let len = $len;
        let mut $off = $start;
        {
            type $ty = u64;
            while $off + 8 <= len {
                $body
                $off += 8;
            }
        }
        {
            type $ty = u8;
            while $off < len {
                $body
                $off += 1;
            }
        }
    }};
}

/// `dst (^)= ⊕ srcs` over `start..dst.len()`; `acc` selects `^=` versus `=`.
/// `srcs` must be non-empty and equally long as `dst` (checked by the caller).
pub(crate) fn xor(srcs: &[&[u8]], dst: &mut [u8], acc: bool, start: usize) {
    lanes!(start, dst.len(), |T, off| {
        let mut v = if acc {
            T::load(dst, off)
        } else {
            T::load(srcs[0], off)
        };
        let rest = if acc { srcs } else { &srcs[1..] };
        for s in rest {
            v ^= T::load(s, off);
        }
        v.store(dst, off);
    });
}

/// `dst ^= c · src` over `start..len`.
pub(crate) fn mul_xor(c: u8, src: &[u8], dst: &mut [u8], start: usize) {
    lanes!(start, dst.len(), |T, off| {
        let v = T::load(dst, off) ^ T::load(src, off).mulc(c);
        v.store(dst, off);
    });
}

/// `p ^= delta; q ^= c · delta` over `start..len`.
pub(crate) fn pq_update(delta: &[u8], c: u8, p: &mut [u8], q: &mut [u8], start: usize) {
    lanes!(start, delta.len(), |T, off| {
        let d = T::load(delta, off);
        (T::load(p, off) ^ d).store(p, off);
        (T::load(q, off) ^ d.mulc(c)).store(q, off);
    });
}

/// The fused syndrome kernel (see [`Mode`]): Horner over `data` (empty slices are
/// zero blocks), then finish according to `mode`. `top` is the highest index of a
/// non-empty block (`None` if all are holes). Processes `start..len`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn syndrome(
    data: &[&[u8]],
    top: Option<usize>,
    mode: Mode,
    p: &mut [u8],
    q: &mut [u8],
    da: &mut [u8],
    db: &mut [u8],
    len: usize,
    start: usize,
) {
    lanes!(start, len, |T, off| {
        let (mut pv, mut qv) = (T::ZERO, T::ZERO);
        if let Some(top) = top {
            pv = T::load(data[top], off);
            qv = pv;
            for s in data[..top].iter().rev() {
                qv = qv.mul2();
                if !s.is_empty() {
                    let d = T::load(s, off);
                    pv ^= d;
                    qv ^= d;
                }
            }
        }
        match mode {
            Mode::Gen => {
                pv.store(p, off);
                qv.store(q, off);
            }
            Mode::GenQ => qv.store(q, off),
            Mode::DataP(ca) => {
                let d = (T::load(q, off) ^ qv).mulc(ca);
                d.store(da, off);
                (pv ^ d).store(p, off);
            }
            Mode::DataQ(ca) => {
                let d = T::load(p, off) ^ pv;
                d.store(da, off);
                (qv ^ d.mulc(ca)).store(q, off);
            }
            Mode::DataData(ca, cb) => {
                let pxy = T::load(p, off) ^ pv;
                let qxy = T::load(q, off) ^ qv;
                let b = pxy.mulc(ca) ^ qxy.mulc(cb);
                b.store(db, off);
                (b ^ pxy).store(da, off);
            }
        }
    });
}
