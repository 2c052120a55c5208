//! AVX2 kernels — the only module of this crate containing `unsafe`.
//!
//! Structure: every public(crate) entry point is a *safe* method on the
//! zero-sized token [`Avx2`], which can only be obtained after
//! `is_x86_feature_detected!("avx2")` returned true. The methods validate all
//! lengths once, then call `#[target_feature(enable = "avx2")]` kernels that
//! process the bulk in blocks of `L × 32` bytes with unaligned loads/stores,
//! and hand the remaining tail (< 32 bytes) to the portable `scalar` code.
//!
//! Techniques (re-derived from the math, not copied from any implementation):
//! * XOR: one pass over the destination per call; all sources are read at the
//!   same offset, so `dst` is loaded/stored once regardless of source count.
//! * Q by Horner: `q = 2·q ⊕ D_i`, where `2·x` per byte is
//!   `(x + x) ⊕ (0x1d & (x <s 0 ? 0xff : 0))` — a byte add plus a signed
//!   compare against zero producing the "top bit was set" mask.
//! * Multiplication by an arbitrary constant `c`: `c·x = c·(x & 15) ⊕ c·(x & 0xf0)`,
//!   both halves looked up with `vpshufb` in 16-entry tables (`gf::NIBBLE[c]`).

use core::arch::x86_64::{
    __m256i, _mm256_add_epi8, _mm256_and_si256, _mm256_broadcastsi128_si256,
    _mm256_cmpgt_epi8, _mm256_loadu_si256, _mm256_set1_epi8, _mm256_setzero_si256,
    _mm256_shuffle_epi8, _mm256_srli_epi16, _mm256_storeu_si256, _mm256_xor_si256,
    _mm_loadu_si128,
};

use std::sync::OnceLock;

use crate::gf::NIBBLE;
use crate::{scalar, Mode};

/// Width of one AVX2 vector in bytes.
const W: usize = 32;
/// Vectors per block in the main loops (128 bytes per iteration).
const WIDE: usize = 4;

/// Proof that the running CPU supports AVX2. Zero-sized; only constructible via [`Avx2::new`].
#[derive(Clone, Copy, Debug)]
pub(crate) struct Avx2 {
    _private: (),
}

impl Avx2 {
    /// `Some` iff the CPU supports AVX2 (probed once, then cached).
    #[inline]
    pub(crate) fn new() -> Option<Self> {
        static HAS_AVX2: OnceLock<bool> = OnceLock::new();
        if *HAS_AVX2.get_or_init(|| std::arch::is_x86_feature_detected!("avx2")) {
            Some(Avx2 { _private: () })
        } else {
            None
        }
    }

    /// `dst (^)= ⊕ srcs`. Caller guarantees: `srcs` non-empty, every source as long as `dst`.
    pub(crate) fn xor(self, srcs: &[&[u8]], dst: &mut [u8], acc: bool) {
        assert!(!srcs.is_empty());
        assert!(srcs.iter().all(|s| s.len() == dst.len()));
        let mut off = 0;
        // SAFETY: `self` proves AVX2 is available; all sources have dst.len() bytes
        // (asserted above), which is what `xor_blocks` requires.
        unsafe {
            off = xor_blocks::<WIDE>(srcs, dst, acc, off);
            off = xor_blocks::<1>(srcs, dst, acc, off);
        }
        scalar::xor(srcs, dst, acc, off);
    }

    /// `dst ^= c · src`.
    pub(crate) fn mul_xor(self, c: u8, src: &[u8], dst: &mut [u8]) {
        assert_eq!(src.len(), dst.len());
        let mut off = 0;
        // SAFETY: AVX2 proven by `self`; src and dst have equal length (asserted).
        unsafe {
            off = mul_xor_blocks::<WIDE>(c, src, dst, off);
            off = mul_xor_blocks::<1>(c, src, dst, off);
        }
        scalar::mul_xor(c, src, dst, off);
    }

    /// `p ^= delta; q ^= c · delta`.
    pub(crate) fn pq_update(self, delta: &[u8], c: u8, p: &mut [u8], q: &mut [u8]) {
        assert_eq!(delta.len(), p.len());
        assert_eq!(delta.len(), q.len());
        let mut off = 0;
        // SAFETY: AVX2 proven by `self`; delta, p and q have equal length (asserted).
        unsafe {
            off = pq_update_blocks::<WIDE>(delta, c, p, q, off);
            off = pq_update_blocks::<1>(delta, c, p, q, off);
        }
        scalar::pq_update(delta, c, p, q, off);
    }

    /// Fused syndrome + finish (see [`Mode`]). Caller guarantees: every non-empty
    /// `data[i]` has `len` bytes, `top` is the highest non-empty index, and every
    /// output buffer that `mode` reads or writes has `len` bytes.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn syndrome(
        self,
        data: &[&[u8]],
        top: Option<usize>,
        mode: Mode,
        p: &mut [u8],
        q: &mut [u8],
        da: &mut [u8],
        db: &mut [u8],
        len: usize,
    ) {
        // Re-check the contract here: the kernels rely on it for memory safety.
        assert!(data.iter().all(|d| d.is_empty() || d.len() == len));
        if let Some(t) = top {
            assert!(t < data.len() && data[t].len() == len);
        }
        let need = |b: &[u8]| assert_eq!(b.len(), len, "syndrome output length");
        match mode {
            Mode::Gen => {
                need(p);
                need(q);
            }
            Mode::GenQ => need(q),
            Mode::DataP(_) | Mode::DataQ(_) => {
                need(p);
                need(q);
                need(da);
            }
            Mode::DataData(..) => {
                need(p);
                need(q);
                need(da);
                need(db);
            }
        }
        let (ca, cb) = match mode {
            Mode::Gen | Mode::GenQ => (0, 0),
            Mode::DataP(a) | Mode::DataQ(a) => (a, 0),
            Mode::DataData(a, b) => (a, b),
        };
        let o = &mut Outs { p, q, da, db };
        let mut off = 0;
        // SAFETY: AVX2 proven by `self`; every buffer the chosen mode touches has
        // `len` bytes and every non-empty data block has `len` bytes (asserted above);
        // `top` indexes a non-empty block.
        unsafe {
            off = match mode {
                Mode::Gen => syndrome_blocks::<WIDE, GEN>(data, top, o, ca, cb, len, off),
                Mode::GenQ => syndrome_blocks::<WIDE, GENQ>(data, top, o, ca, cb, len, off),
                Mode::DataP(_) => syndrome_blocks::<2, DATAP>(data, top, o, ca, cb, len, off),
                Mode::DataQ(_) => syndrome_blocks::<2, DATAQ>(data, top, o, ca, cb, len, off),
                Mode::DataData(..) => syndrome_blocks::<2, DATADATA>(data, top, o, ca, cb, len, off),
            };
            off = match mode {
                Mode::Gen => syndrome_blocks::<1, GEN>(data, top, o, ca, cb, len, off),
                Mode::GenQ => syndrome_blocks::<1, GENQ>(data, top, o, ca, cb, len, off),
                Mode::DataP(_) => syndrome_blocks::<1, DATAP>(data, top, o, ca, cb, len, off),
                Mode::DataQ(_) => syndrome_blocks::<1, DATAQ>(data, top, o, ca, cb, len, off),
                Mode::DataData(..) => syndrome_blocks::<1, DATADATA>(data, top, o, ca, cb, len, off),
            };
        }
        scalar::syndrome(data, top, mode, o.p, o.q, o.da, o.db, len, off);
    }
}

/// Output buffers of the syndrome kernel (unused ones may be empty).
struct Outs<'a, 'b, 'c, 'd> {
    p: &'a mut [u8],
    q: &'b mut [u8],
    da: &'c mut [u8],
    db: &'d mut [u8],
}

const GEN: u8 = 0;
const GENQ: u8 = 1;
const DATAP: u8 = 2;
const DATAQ: u8 = 3;
const DATADATA: u8 = 4;

/// Unaligned 32-byte load of `s[off..off + 32]`.
///
/// # Safety
/// `off + 32 <= s.len()`.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn ld(s: &[u8], off: usize) -> __m256i {
    debug_assert!(off + W <= s.len());
    // SAFETY: in bounds by the caller's contract; `loadu` has no alignment requirement.
    unsafe { _mm256_loadu_si256(s.as_ptr().add(off).cast()) }
}

/// Unaligned 32-byte store to `d[off..off + 32]`.
///
/// # Safety
/// `off + 32 <= d.len()`.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn st(d: &mut [u8], off: usize, v: __m256i) {
    debug_assert!(off + W <= d.len());
    // SAFETY: in bounds by the caller's contract; `storeu` has no alignment requirement;
    // `d` is a unique borrow so nothing else observes the write.
    unsafe { _mm256_storeu_si256(d.as_mut_ptr().add(off).cast(), v) }
}

/// Per-byte multiply by 2 in GF(2^8)/0x11d.
#[target_feature(enable = "avx2")]
#[inline]
fn mul2(v: __m256i, poly: __m256i) -> __m256i {
    let top = _mm256_cmpgt_epi8(_mm256_setzero_si256(), v); // 0xff where bit 7 set
    _mm256_xor_si256(_mm256_add_epi8(v, v), _mm256_and_si256(top, poly))
}

/// Broadcast nibble tables for multiplying by `c`: (low-nibble table, high-nibble table).
#[target_feature(enable = "avx2")]
#[inline]
fn tables(c: u8) -> (__m256i, __m256i) {
    let t = &NIBBLE[c as usize];
    // SAFETY: each table row is exactly 16 bytes; `loadu` needs no alignment.
    let (lo, hi) = unsafe {
        (
            _mm_loadu_si128(t[0].as_ptr().cast()),
            _mm_loadu_si128(t[1].as_ptr().cast()),
        )
    };
    (
        _mm256_broadcastsi128_si256(lo),
        _mm256_broadcastsi128_si256(hi),
    )
}

/// `c · v` per byte via two `vpshufb` nibble lookups (`t` from [`tables`]).
#[target_feature(enable = "avx2")]
#[inline]
fn mulc(v: __m256i, t: (__m256i, __m256i), m0f: __m256i) -> __m256i {
    let lo = _mm256_and_si256(v, m0f);
    let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(v), m0f);
    _mm256_xor_si256(_mm256_shuffle_epi8(t.0, lo), _mm256_shuffle_epi8(t.1, hi))
}

/// XOR kernel over whole blocks of `L × 32` bytes starting at `off`; returns the
/// offset of the first unprocessed byte.
///
/// # Safety
/// AVX2 available; `srcs` non-empty; every source has `dst.len()` bytes.
#[target_feature(enable = "avx2")]
unsafe fn xor_blocks<const L: usize>(
    srcs: &[&[u8]],
    dst: &mut [u8],
    acc: bool,
    mut off: usize,
) -> usize {
    let len = dst.len();
    let rest = if acc { srcs } else { &srcs[1..] };
    while off + L * W <= len {
        let mut v = [_mm256_setzero_si256(); L];
        // SAFETY (all loads/stores in this iteration): off + L*W <= len and every
        // source and dst have `len` bytes.
        unsafe {
            for (j, x) in v.iter_mut().enumerate() {
                *x = if acc {
                    ld(dst, off + j * W)
                } else {
                    ld(srcs[0], off + j * W)
                };
            }
            for s in rest {
                for (j, x) in v.iter_mut().enumerate() {
                    *x = _mm256_xor_si256(*x, ld(s, off + j * W));
                }
            }
            for (j, x) in v.iter().enumerate() {
                st(dst, off + j * W, *x);
            }
        }
        off += L * W;
    }
    off
}

/// `dst ^= c·src` over whole `L × 32`-byte blocks from `off`.
///
/// # Safety
/// AVX2 available; `src.len() == dst.len()`.
#[target_feature(enable = "avx2")]
unsafe fn mul_xor_blocks<const L: usize>(
    c: u8,
    src: &[u8],
    dst: &mut [u8],
    mut off: usize,
) -> usize {
    let len = dst.len();
    let t = tables(c);
    let m0f = _mm256_set1_epi8(0x0f);
    while off + L * W <= len {
        // SAFETY: off + L*W <= len == src.len() == dst.len().
        unsafe {
            for j in 0..L {
                let o = off + j * W;
                let v = _mm256_xor_si256(ld(dst, o), mulc(ld(src, o), t, m0f));
                st(dst, o, v);
            }
        }
        off += L * W;
    }
    off
}

/// `p ^= delta; q ^= c·delta` over whole `L × 32`-byte blocks from `off`.
///
/// # Safety
/// AVX2 available; `delta`, `p`, `q` all have the same length.
#[target_feature(enable = "avx2")]
unsafe fn pq_update_blocks<const L: usize>(
    delta: &[u8],
    c: u8,
    p: &mut [u8],
    q: &mut [u8],
    mut off: usize,
) -> usize {
    let len = delta.len();
    let t = tables(c);
    let m0f = _mm256_set1_epi8(0x0f);
    while off + L * W <= len {
        // SAFETY: off + L*W <= len and all three buffers have `len` bytes.
        unsafe {
            for j in 0..L {
                let o = off + j * W;
                let d = ld(delta, o);
                st(p, o, _mm256_xor_si256(ld(p, o), d));
                st(q, o, _mm256_xor_si256(ld(q, o), mulc(d, t, m0f)));
            }
        }
        off += L * W;
    }
    off
}

/// Fused Horner syndrome over `L × 32`-byte blocks from `off`, finished per `M`
/// (one of `GEN`, `GENQ`, `DATAP`, `DATAQ`, `DATADATA`; see [`Mode`]).
///
/// # Safety
/// AVX2 available; every non-empty `data[i]` has `len` bytes; `top` (if any)
/// indexes a non-empty block; every buffer in `o` that mode `M` uses has `len` bytes.
#[target_feature(enable = "avx2")]
#[allow(clippy::too_many_arguments)]
unsafe fn syndrome_blocks<const L: usize, const M: u8>(
    data: &[&[u8]],
    top: Option<usize>,
    o: &mut Outs<'_, '_, '_, '_>,
    ca: u8,
    cb: u8,
    len: usize,
    mut off: usize,
) -> usize {
    let poly = _mm256_set1_epi8(0x1d);
    let m0f = _mm256_set1_epi8(0x0f);
    let ta = tables(ca);
    let tb = tables(cb);
    while off + L * W <= len {
        let mut pv = [_mm256_setzero_si256(); L];
        let mut qv = [_mm256_setzero_si256(); L];
        // SAFETY (all loads/stores in this iteration): off + L*W <= len, and every
        // block read or written here has `len` bytes per the function contract.
        unsafe {
            if let Some(top) = top {
                let s = data[top];
                for j in 0..L {
                    pv[j] = ld(s, off + j * W);
                    qv[j] = pv[j];
                }
                for s in data[..top].iter().rev() {
                    if s.is_empty() {
                        for x in qv.iter_mut() {
                            *x = mul2(*x, poly);
                        }
                    } else {
                        for j in 0..L {
                            let d = ld(s, off + j * W);
                            pv[j] = _mm256_xor_si256(pv[j], d);
                            qv[j] = _mm256_xor_si256(mul2(qv[j], poly), d);
                        }
                    }
                }
            }
            for j in 0..L {
                let x = off + j * W;
                match M {
                    GEN => {
                        st(o.p, x, pv[j]);
                        st(o.q, x, qv[j]);
                    }
                    GENQ => st(o.q, x, qv[j]),
                    DATAP => {
                        let d = mulc(_mm256_xor_si256(ld(o.q, x), qv[j]), ta, m0f);
                        st(o.da, x, d);
                        st(o.p, x, _mm256_xor_si256(pv[j], d));
                    }
                    DATAQ => {
                        let d = _mm256_xor_si256(ld(o.p, x), pv[j]);
                        st(o.da, x, d);
                        st(o.q, x, _mm256_xor_si256(qv[j], mulc(d, ta, m0f)));
                    }
                    _ => {
                        let pxy = _mm256_xor_si256(ld(o.p, x), pv[j]);
                        let qxy = _mm256_xor_si256(ld(o.q, x), qv[j]);
                        let b = _mm256_xor_si256(mulc(pxy, ta, m0f), mulc(qxy, tb, m0f));
                        st(o.db, x, b);
                        st(o.da, x, _mm256_xor_si256(b, pxy));
                    }
                }
            }
        }
        off += L * W;
    }
    off
}
