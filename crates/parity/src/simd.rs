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
    __m256i, _mm256_add_epi8, _mm256_and_si256, _mm256_broadcastsi128_si256, _mm256_cmpgt_epi8,
    _mm256_loadu_si256, _mm256_set1_epi8, _mm256_setzero_si256, _mm256_shuffle_epi8,
    _mm256_srli_epi16, _mm256_storeu_si256, _mm256_stream_si256, _mm256_xor_si256, _mm_loadu_si128,
    _mm_sfence,
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
        // Streaming stores only for pure writes (with `acc` dst was just read).
        let nt = !acc && dst.len() >= nt_min() && (dst.as_ptr() as usize) & (W - 1) == 0;
        let mut off = 0;
        // SAFETY: `self` proves AVX2 is available; all sources have dst.len() bytes
        // (asserted above), which is what `xor_blocks` requires; with `nt`, dst is
        // 32-byte aligned (checked just above).
        unsafe {
            if nt {
                off = xor_blocks::<WIDE, true>(srcs, dst, acc, off);
                off = xor_blocks::<1, true>(srcs, dst, acc, off);
            } else {
                off = xor_blocks::<WIDE, false>(srcs, dst, acc, off);
                off = xor_blocks::<1, false>(srcs, dst, acc, off);
            }
        }
        if nt {
            // See `syndrome`: order the streaming stores.
            // SAFETY: SSE is part of the x86-64 baseline (and implied by AVX2).
            unsafe { _mm_sfence() };
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
        let aligned = |b: &[u8]| (b.as_ptr() as usize) & (W - 1) == 0;
        let nt = len >= nt_min()
            && match mode {
                Mode::Gen => aligned(p) && aligned(q),
                Mode::GenQ => aligned(q),
                Mode::DataP(_) => aligned(da) && aligned(p),
                Mode::DataQ(_) => aligned(da) && aligned(q),
                Mode::DataData(..) => aligned(da) && aligned(db),
            };
        let o = &mut Outs { p, q, da, db };
        // SAFETY: AVX2 proven by `self`; every buffer the chosen mode touches has
        // `len` bytes and every non-empty data block has `len` bytes (asserted above);
        // `top` indexes a non-empty block; with `nt` every written buffer is
        // 32-byte aligned (checked just above).
        let off = unsafe {
            match (mode, nt) {
                (Mode::Gen, false) => syndrome_all::<GEN, WIDE, false>(data, top, o, ca, cb, len),
                (Mode::Gen, true) => syndrome_all::<GEN, WIDE, true>(data, top, o, ca, cb, len),
                (Mode::GenQ, false) => syndrome_all::<GENQ, WIDE, false>(data, top, o, ca, cb, len),
                (Mode::GenQ, true) => syndrome_all::<GENQ, WIDE, true>(data, top, o, ca, cb, len),
                (Mode::DataP(_), false) => {
                    syndrome_all::<DATAP, 2, false>(data, top, o, ca, cb, len)
                }
                (Mode::DataP(_), true) => syndrome_all::<DATAP, 2, true>(data, top, o, ca, cb, len),
                (Mode::DataQ(_), false) => {
                    syndrome_all::<DATAQ, 2, false>(data, top, o, ca, cb, len)
                }
                (Mode::DataQ(_), true) => syndrome_all::<DATAQ, 2, true>(data, top, o, ca, cb, len),
                (Mode::DataData(..), false) => {
                    syndrome_all::<DATADATA, 2, false>(data, top, o, ca, cb, len)
                }
                (Mode::DataData(..), true) => {
                    syndrome_all::<DATADATA, 2, true>(data, top, o, ca, cb, len)
                }
            }
        };
        if nt {
            // Non-temporal stores are weakly ordered: fence them before anyone
            // (another thread, a DMA submission) can observe the buffers.
            // SAFETY: SSE is part of the x86-64 baseline (and implied by AVX2).
            unsafe { _mm_sfence() };
        }
        scalar::syndrome(data, top, mode, o.p, o.q, o.da, o.db, len, off);
    }
}

/// Minimum block length for non-temporal (cache-bypassing) parity stores.
#[inline]
fn nt_min() -> usize {
    crate::streaming_store_threshold()
}

/// Both block loops of the syndrome kernel (wide, then single vectors).
///
/// # Safety
/// As [`syndrome_blocks`].
#[target_feature(enable = "avx2")]
unsafe fn syndrome_all<const M: u8, const L: usize, const NT: bool>(
    data: &[&[u8]],
    top: Option<usize>,
    o: &mut Outs<'_, '_, '_, '_>,
    ca: u8,
    cb: u8,
    len: usize,
) -> usize {
    // SAFETY: forwarded contract.
    unsafe {
        let off = syndrome_blocks::<L, M, NT>(data, top, o, ca, cb, len, 0);
        syndrome_blocks::<1, M, NT>(data, top, o, ca, cb, len, off)
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

/// 32-byte store to `d[off..off + 32]`, non-temporal (bypassing the caches) if `NT`.
///
/// # Safety
/// `off + 32 <= d.len()`; if `NT`, `d.as_ptr() + off` is 32-byte aligned.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn stx<const NT: bool>(d: &mut [u8], off: usize, v: __m256i) {
    if NT {
        debug_assert!(off + W <= d.len());
        debug_assert_eq!((d.as_ptr() as usize + off) % W, 0);
        // SAFETY: in bounds and 32-byte aligned by the caller's contract.
        unsafe { _mm256_stream_si256(d.as_mut_ptr().add(off).cast(), v) }
    } else {
        // SAFETY: in bounds by the caller's contract.
        unsafe { st(d, off, v) }
    }
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
/// AVX2 available; `srcs` non-empty; every source has `dst.len()` bytes;
/// if `NT`, `dst` is 32-byte aligned.
#[target_feature(enable = "avx2")]
unsafe fn xor_blocks<const L: usize, const NT: bool>(
    srcs: &[&[u8]],
    dst: &mut [u8],
    acc: bool,
    mut off: usize,
) -> usize {
    let len = dst.len();
    let rest = if acc { srcs } else { &srcs[1..] };
    while off + L * W <= len {
        let mut v = [_mm256_setzero_si256(); L];
        // SAFETY: (all loads/stores in this iteration) off + L*W <= len and every
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
                stx::<NT>(dst, off + j * W, *x);
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
/// indexes a non-empty block; every buffer in `o` that mode `M` uses has `len` bytes;
/// if `NT`, every buffer that mode `M` writes is 32-byte aligned.
#[target_feature(enable = "avx2")]
#[allow(clippy::too_many_arguments)]
unsafe fn syndrome_blocks<const L: usize, const M: u8, const NT: bool>(
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
        // SAFETY: (all loads/stores in this iteration) off + L*W <= len, and every
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
                        stx::<NT>(o.p, x, pv[j]);
                        stx::<NT>(o.q, x, qv[j]);
                    }
                    GENQ => stx::<NT>(o.q, x, qv[j]),
                    DATAP => {
                        let d = mulc(_mm256_xor_si256(ld(o.q, x), qv[j]), ta, m0f);
                        stx::<NT>(o.da, x, d);
                        stx::<NT>(o.p, x, _mm256_xor_si256(pv[j], d));
                    }
                    DATAQ => {
                        let d = _mm256_xor_si256(ld(o.p, x), pv[j]);
                        stx::<NT>(o.da, x, d);
                        stx::<NT>(o.q, x, _mm256_xor_si256(qv[j], mulc(d, ta, m0f)));
                    }
                    _ => {
                        let pxy = _mm256_xor_si256(ld(o.p, x), pv[j]);
                        let qxy = _mm256_xor_si256(ld(o.q, x), qv[j]);
                        let b = _mm256_xor_si256(mulc(pxy, ta, m0f), mulc(qxy, tb, m0f));
                        stx::<NT>(o.db, x, b);
                        stx::<NT>(o.da, x, _mm256_xor_si256(b, pxy));
                    }
                }
            }
        }
        off += L * W;
    }
    off
}
