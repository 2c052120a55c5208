//! Parity arithmetic for ironraid: RAID4/5 XOR, md-compatible RAID6 P+Q,
//! read-modify-write updates, reconstruction of any one or two lost blocks,
//! and CRC32C. Pure functions over byte slices; no I/O, no allocation beyond a
//! small pointer vector during recovery.
//!
//! # The math
//!
//! RAID6 works in GF(2^8) with md's reduction polynomial
//! x^8 + x^4 + x^3 + x^2 + 1 (0x11d) and generator g = {02} (H. P. Anvin,
//! "The mathematics of RAID-6"). Addition is XOR; `g^255 = 1`, `g^-1 = 0x8e`.
//! For data blocks `D_0 … D_{m-1}` in **syndrome-index order**:
//!
//! ```text
//! P = D_0 ⊕ D_1 ⊕ … ⊕ D_{m-1}
//! Q = g^0·D_0 ⊕ g^1·D_1 ⊕ … ⊕ g^{m-1}·D_{m-1}
//!   = ((…(D_{m-1}·2 ⊕ D_{m-2})·2 ⊕ …)·2 ⊕ D_0        (Horner, highest syndrome first)
//! ```
//!
//! md (lib/raid6) evaluates Q by exactly this Horner recurrence from the highest
//! syndrome down, so `D_0` gets coefficient 1. Test vector: `D = (0x11, 0x22, 0x33)`
//! gives `P = 0x00`, `Q = 0x99`. Note that OpenZFS RAID-Z weights the other way
//! round; this is *not* RAID-Z code.
//!
//! **RMW** ([`pq_update`]): replacing `D_s` by `D_s'` with `Δ = D_s ⊕ D_s'` gives
//! `P' = P ⊕ Δ`, `Q' = Q ⊕ g^s·Δ`.
//!
//! **Recovery** ([`raid6_recover`], syndromes `a < b`; `P'`, `Q'` are computed with the
//! lost data blocks taken as zero):
//! * `D_a` (P intact): `D_a = P ⊕ P'`.
//! * `D_a + P`: `D_a = g^-a·(Q ⊕ Q')`, then `P = P' ⊕ D_a`.
//! * `D_a + Q`: `D_a = P ⊕ P'`, then `Q = Q' ⊕ g^a·D_a`.
//! * `D_a + D_b`: with `Pxy = P ⊕ P'`, `Qxy = Q ⊕ Q'`:
//!   `D_b = (g^(b-a) ⊕ 1)^-1·Pxy ⊕ (g^a ⊕ g^b)^-1·Qxy`, `D_a = D_b ⊕ Pxy`.
//! * `P`, `Q`, `P + Q`: recompute.
//!
//! Each case is one fused pass: Horner over the surviving blocks at one offset,
//! then the finishing formula in registers, so every byte is read and written once.
//!
//! # md compatibility notes
//!
//! * **syndrome indices are not logical data indices nor device indices.** For md's
//!   non-DDF layouts the kernel walks devices starting right after Q (device 0 if
//!   Q is last), cyclically, skipping P and Q, and numbers data devices 0, 1, 2…
//!   in that order (`raid6_idx_to_slot`). For left/right-symmetric and
//!   parity-first/last that coincides with the logical order; for the asymmetric
//!   layouts and the `*-6` layouts (16–20) it does not. The layout crate must
//!   produce `data` in syndrome order; this crate only sees syndromes.
//! * **DDF caveat**: DDF layouts (8, 9, 10) compute Q over *all* n device
//!   positions in device order, with the P and Q positions contributing zero
//!   blocks. Call [`pq_gen`] with `data.len() == n` and zero-filled buffers at the
//!   P/Q positions; recovery works the same way (the zero blocks are simply
//!   surviving data). Slot `i` then equals device index `i`.
//! * Block counts: md allows at most 256 devices, i.e. ≤ 254 data syndromes, so every
//!   `g^i` is distinct; two-data recovery asserts that its two coefficients differ.
//! * CRC: md's raid5-cache/PPL use the raw CRC32C register form ([`crc32c_raw`]),
//!   the superblock checksum is not a CRC at all (handled by the format crate).
//!
//! # Backends
//!
//! The free functions dispatch to the backend chosen once at first use
//! ([`Backend::detect`], logged via [`backend_name`]): AVX2 if the CPU has it, else
//! the portable u64-SWAR `scalar` backend. The environment variable
//! `IRONRAID_PARITY_BACKEND=scalar` forces the portable one. [`Backend`] methods
//! run a specific backend (tests compare them). [`reference`](mod@reference) is the byte-wise
//! oracle. All lengths are allowed (SIMD handles the tail with scalar code) and
//! buffers may be arbitrarily aligned. There is no SSSE3/AVX-512 backend: x86 CPUs
//! without AVX2 use the SWAR code. Generated blocks of at least
//! [`streaming_store_threshold`] bytes (default 64 KiB) are written with
//! non-temporal stores when 32-byte aligned.
//!
//! Length mismatches and out-of-range syndromes are programming errors and panic.

#![deny(unsafe_code)]
#![warn(missing_docs)]

mod crc;
mod gf;
mod recover;
mod scalar;
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
mod simd;

pub use crc::{crc32c, crc32c_append, crc32c_raw};
pub use gf::{gf_exp, gf_inv, gf_log, gf_mul};
pub use scalar::reference;

use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};

/// Default for [`streaming_store_threshold`]: 64 KiB.
pub const DEFAULT_STREAMING_STORE_THRESHOLD: usize = 64 << 10;

static NT_THRESHOLD: AtomicUsize = AtomicUsize::new(DEFAULT_STREAMING_STORE_THRESHOLD);

/// Block length from which the SIMD backend writes *generated* blocks (xor_gen's
/// destination, P/Q of pq_gen, rebuilt blocks) with non-temporal stores that
/// bypass the caches, provided the output buffers are 32-byte aligned.
///
/// Streaming stores avoid the read-for-ownership and the cache pollution of
/// output that the CPU will not read again (parity headed for a disk): they give
/// 1.2–2× the throughput on cold (DRAM-resident) stripes, but cost up to 2× when
/// the same small buffers are reused over and over while cache resident.
/// Accumulating operations (`xor_into`, `pq_update`, `gf_mul_xor`) never stream.
pub fn streaming_store_threshold() -> usize {
    NT_THRESHOLD.load(Ordering::Relaxed)
}

/// Set [`streaming_store_threshold`] process-wide (`usize::MAX` disables
/// streaming stores, `0` uses them whenever the buffers are aligned).
pub fn set_streaming_store_threshold(bytes: usize) {
    NT_THRESHOLD.store(bytes, Ordering::Relaxed);
}

/// What a RAID6 stripe lost. Slots index `data` (syndrome order).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lost {
    /// Nothing to rebuild.
    Nothing,
    /// Rebuild P from the data.
    P,
    /// Rebuild Q from the data.
    Q,
    /// Rebuild both P and Q from the data.
    PQ,
    /// Rebuild one data block from P and the other data (Q is not touched).
    Data(usize),
    /// Rebuild one data block from Q, then P.
    DataP(usize),
    /// Rebuild one data block from P, then Q.
    DataQ(usize),
    /// Rebuild two distinct data blocks (either order) from P and Q.
    DataData(usize, usize),
}

/// How the fused syndrome kernel finishes after computing P', Q' over the present
/// data blocks (coefficients precomputed by the caller).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mode {
    /// `P = P'`, `Q = Q'`.
    Gen,
    /// `Q = Q'` (P untouched).
    GenQ,
    /// `D_a = c·(Q ⊕ Q')`, `P = P' ⊕ D_a`; `c = g^-a`.
    DataP(u8),
    /// `D_a = P ⊕ P'`, `Q = Q' ⊕ c·D_a`; `c = g^a`.
    DataQ(u8),
    /// `Pxy = P ⊕ P'`, `Qxy = Q ⊕ Q'`, `D_b = ca·Pxy ⊕ cb·Qxy`, `D_a = D_b ⊕ Pxy`.
    DataData(u8, u8),
}

/// An implementation of the parity kernels. Every method panics if the backend is
/// not [available](Backend::is_available) on the running CPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Backend {
    /// 256-bit AVX2 kernels (x86-64 only, runtime-detected).
    Avx2,
    /// Portable u64 SWAR kernels; always available.
    Scalar,
}

static DETECTED: AtomicU8 = AtomicU8::new(0);
const DET_SCALAR: u8 = 1;
const DET_AVX2: u8 = 2;

/// Environment variable that forces a backend (`scalar` or `avx2`) at first use.
pub const BACKEND_ENV: &str = "IRONRAID_PARITY_BACKEND";

impl Backend {
    /// Every backend, best first.
    pub const ALL: &'static [Backend] = &[Backend::Avx2, Backend::Scalar];

    /// The backend the free functions use: chosen once (CPU feature detection,
    /// overridable by [`BACKEND_ENV`]) and cached.
    pub fn detect() -> Backend {
        match DETECTED.load(Ordering::Relaxed) {
            DET_SCALAR => Backend::Scalar,
            DET_AVX2 => Backend::Avx2,
            _ => {
                let forced = std::env::var(BACKEND_ENV).ok();
                let b = match forced.as_deref() {
                    Some("scalar") => Backend::Scalar,
                    Some("avx2") if Backend::Avx2.is_available() => Backend::Avx2,
                    _ => *Backend::ALL
                        .iter()
                        .find(|b| b.is_available())
                        .unwrap_or(&Backend::Scalar),
                };
                let code = match b {
                    Backend::Avx2 => DET_AVX2,
                    Backend::Scalar => DET_SCALAR,
                };
                DETECTED.store(code, Ordering::Relaxed);
                b
            }
        }
    }

    /// Backends usable on this CPU, best first (always ends with `Scalar`).
    pub fn available() -> Vec<Backend> {
        Backend::ALL
            .iter()
            .copied()
            .filter(|b| b.is_available())
            .collect()
    }

    /// Whether this CPU can run the backend.
    pub fn is_available(self) -> bool {
        match self {
            #[cfg(target_arch = "x86_64")]
            Backend::Avx2 => simd::Avx2::new().is_some(),
            #[cfg(not(target_arch = "x86_64"))]
            Backend::Avx2 => false,
            Backend::Scalar => true,
        }
    }

    /// Short name: `"avx2"` or `"scalar"`.
    pub fn name(self) -> &'static str {
        match self {
            Backend::Avx2 => "avx2",
            Backend::Scalar => "scalar",
        }
    }

    #[cfg(target_arch = "x86_64")]
    fn avx2() -> simd::Avx2 {
        simd::Avx2::new().expect("Backend::Avx2 used on a CPU without AVX2")
    }

    // ---- internal dispatch (lengths already validated by the public wrappers) ----

    pub(crate) fn xor_impl(self, srcs: &[&[u8]], dst: &mut [u8], acc: bool) {
        match self {
            #[cfg(target_arch = "x86_64")]
            Backend::Avx2 => Self::avx2().xor(srcs, dst, acc),
            #[cfg(not(target_arch = "x86_64"))]
            Backend::Avx2 => panic!("Backend::Avx2 is x86-64 only"),
            Backend::Scalar => scalar::xor(srcs, dst, acc, 0),
        }
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn syndrome_impl(
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
        match self {
            #[cfg(target_arch = "x86_64")]
            Backend::Avx2 => Self::avx2().syndrome(data, top, mode, p, q, da, db, len),
            #[cfg(not(target_arch = "x86_64"))]
            Backend::Avx2 => panic!("Backend::Avx2 is x86-64 only"),
            Backend::Scalar => scalar::syndrome(data, top, mode, p, q, da, db, len, 0),
        }
    }

    // ---- public per-backend API (same contracts as the free functions) ----

    /// `dst ^= src`. See [`xor_into`].
    pub fn xor_into(self, dst: &mut [u8], src: &[u8]) {
        assert_eq!(dst.len(), src.len(), "xor_into: length mismatch");
        self.xor_impl(&[src], dst, true);
    }

    /// `dst = ⊕ srcs`. See [`xor_gen`].
    pub fn xor_gen(self, srcs: &[&[u8]], dst: &mut [u8]) {
        assert!(!srcs.is_empty(), "xor_gen needs at least one source");
        for s in srcs {
            assert_eq!(s.len(), dst.len(), "xor_gen: length mismatch");
        }
        self.xor_impl(srcs, dst, false);
    }

    /// RAID6 P and Q. See [`pq_gen`].
    pub fn pq_gen(self, data: &[&[u8]], p: &mut [u8], q: &mut [u8]) {
        assert!(!data.is_empty(), "pq_gen needs at least one data block");
        let len = p.len();
        assert_eq!(q.len(), len, "pq_gen: P/Q length mismatch");
        for d in data {
            assert_eq!(d.len(), len, "pq_gen: data length mismatch");
        }
        // With len == 0 every block is "empty"; nothing to do either way.
        let top = if len == 0 { None } else { Some(data.len() - 1) };
        self.syndrome_impl(data, top, Mode::Gen, p, q, &mut [], &mut [], len);
    }

    /// RAID6 read-modify-write. See [`pq_update`].
    pub fn pq_update(self, delta: &[u8], syndrome: usize, p: &mut [u8], q: &mut [u8]) {
        assert_eq!(delta.len(), p.len(), "pq_update: length mismatch");
        assert_eq!(delta.len(), q.len(), "pq_update: length mismatch");
        let c = gf_exp(syndrome);
        match self {
            #[cfg(target_arch = "x86_64")]
            Backend::Avx2 => Self::avx2().pq_update(delta, c, p, q),
            #[cfg(not(target_arch = "x86_64"))]
            Backend::Avx2 => panic!("Backend::Avx2 is x86-64 only"),
            Backend::Scalar => scalar::pq_update(delta, c, p, q, 0),
        }
    }

    /// `dst ^= coef · src`. See [`gf_mul_xor`].
    pub fn gf_mul_xor(self, coef: u8, src: &[u8], dst: &mut [u8]) {
        assert_eq!(src.len(), dst.len(), "gf_mul_xor: length mismatch");
        match coef {
            0 => {}
            1 => self.xor_impl(&[src], dst, true),
            _ => match self {
                #[cfg(target_arch = "x86_64")]
                Backend::Avx2 => Self::avx2().mul_xor(coef, src, dst),
                #[cfg(not(target_arch = "x86_64"))]
                Backend::Avx2 => panic!("Backend::Avx2 is x86-64 only"),
                Backend::Scalar => scalar::mul_xor(coef, src, dst, 0),
            },
        }
    }

    /// RAID6 reconstruction. See [`raid6_recover`].
    pub fn raid6_recover(self, data: &mut [&mut [u8]], p: &mut [u8], q: &mut [u8], lost: Lost) {
        recover::raid6_recover(self, data, p, q, lost)
    }

    /// RAID4/5 reconstruction. See [`raid5_recover`].
    pub fn raid5_recover(self, blocks: &mut [&mut [u8]], lost: usize) {
        recover::raid5_recover(self, blocks, lost)
    }
}

/// `dst ^= src`. Panics unless the lengths are equal.
pub fn xor_into(dst: &mut [u8], src: &[u8]) {
    Backend::detect().xor_into(dst, src)
}

/// `dst = src[0] ^ src[1] ^ …`. Needs at least one source; all of `dst`'s length.
/// One pass: `dst` is written once, all sources are read at the same offset.
pub fn xor_gen(srcs: &[&[u8]], dst: &mut [u8]) {
    Backend::detect().xor_gen(srcs, dst)
}

/// RAID6: `data` in syndrome-index order (`data[i]` has coefficient `g^i`, g = 2 in
/// GF(2^8)/0x11d). `p = ⊕ data`, `q = ⊕ g^i·data[i]`. At least 1 data block
/// (md needs 2, 1 is allowed: then P = Q = D_0). All buffers of equal length.
pub fn pq_gen(data: &[&[u8]], p: &mut [u8], q: &mut [u8]) {
    Backend::detect().pq_gen(data, p, q)
}

/// RMW: `delta = old_data ^ new_data` of the block at syndrome index `syndrome`;
/// `p ^= delta; q ^= g^syndrome · delta`.
pub fn pq_update(delta: &[u8], syndrome: usize, p: &mut [u8], q: &mut [u8]) {
    Backend::detect().pq_update(delta, syndrome, p, q)
}

/// `dst ^= coef · src` in GF(2^8)/0x11d.
pub fn gf_mul_xor(coef: u8, src: &[u8], dst: &mut [u8]) {
    Backend::detect().gf_mul_xor(coef, src, dst)
}

/// Rebuild the lost blocks of a RAID6 stripe in place; contents of lost buffers on
/// entry are ignored. `data` is in syndrome-index order, everything equally long.
/// Panics on out-of-range or equal syndromes.
pub fn raid6_recover(data: &mut [&mut [u8]], p: &mut [u8], q: &mut [u8], lost: Lost) {
    Backend::detect().raid6_recover(data, p, q, lost)
}

/// RAID4/5: rebuild block `lost` (index into `blocks`, which holds all data blocks
/// AND parity) as the XOR of the others. Needs at least 2 blocks.
pub fn raid5_recover(blocks: &mut [&mut [u8]], lost: usize) {
    Backend::detect().raid5_recover(blocks, lost)
}

/// Which SIMD backend was chosen at run time (`"avx2"` or `"scalar"`).
pub fn backend_name() -> &'static str {
    Backend::detect().name()
}
