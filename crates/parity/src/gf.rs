//! GF(2^8) arithmetic with md's RAID6 field: reduction polynomial
//! x^8 + x^4 + x^3 + x^2 + 1 (0x11d), generator g = 0x02.
//!
//! Every table is computed at compile time by `const fn`s from the bit-serial
//! ("Russian peasant") multiplication [`mul_bitwise`]; the unit tests below
//! check the tables against it exhaustively.

/// Low byte of the reduction polynomial (x^8 is implicit).
pub(crate) const POLY: u8 = 0x1d;

/// Bit-serial multiplication in GF(2^8)/0x11d. Slow but obviously correct;
/// the source of truth for every table in this module.
pub(crate) const fn mul_bitwise(mut a: u8, mut b: u8) -> u8 {
    let mut r = 0u8;
    while b != 0 {
        if b & 1 != 0 {
            r ^= a;
        }
        a = mul2(a);
        b >>= 1;
    }
    r
}

/// Multiply by the generator g = 2.
#[inline]
pub(crate) const fn mul2(a: u8) -> u8 {
    (a << 1) ^ if a & 0x80 != 0 { POLY } else { 0 }
}

/// `EXP[i] = g^i` for `0 <= i < 510` (doubled so `EXP[log a + log b]` needs no reduction).
pub(crate) static EXP: [u8; 512] = build_exp();
/// `LOG[a] = log_g a` for `a != 0`; `LOG[0]` is unused (0).
pub(crate) static LOG: [u8; 256] = build_log();
/// `INV[a] = a^-1` (= a^254); `INV[0] = 0` like md's `gfinv`.
pub(crate) static INV: [u8; 256] = build_inv();
/// Full multiplication table, `MUL[a][b] = a * b` (64 KiB, like md's `gfmul`).
pub(crate) static MUL: [[u8; 256]; 256] = build_mul();
/// Split-nibble tables for PSHUFB multiplication by a constant `c`:
/// `NIBBLE[c][0][x] = c * x` and `NIBBLE[c][1][x] = c * (x << 4)` for `x < 16`,
/// so `c * b = NIBBLE[c][0][b & 15] ^ NIBBLE[c][1][b >> 4]`.
pub(crate) static NIBBLE: [[[u8; 16]; 2]; 256] = build_nibble();

const fn build_exp() -> [u8; 512] {
    let mut t = [0u8; 512];
    let mut x = 1u8;
    let mut i = 0;
    while i < 255 {
        t[i] = x;
        t[i + 255] = x;
        x = mul2(x);
        i += 1;
    }
    // t[510], t[511] stay 0 and are never read (log a + log b <= 508).
    t
}

const fn build_log() -> [u8; 256] {
    let exp = build_exp();
    let mut t = [0u8; 256];
    let mut i = 0;
    while i < 255 {
        t[exp[i] as usize] = i as u8;
        i += 1;
    }
    t
}

const fn build_inv() -> [u8; 256] {
    let exp = build_exp();
    let log = build_log();
    let mut t = [0u8; 256];
    let mut a = 1;
    while a < 256 {
        t[a] = exp[(255 - log[a] as usize) % 255];
        a += 1;
    }
    t
}

const fn build_mul() -> [[u8; 256]; 256] {
    let exp = build_exp();
    let log = build_log();
    let mut t = [[0u8; 256]; 256];
    let mut a = 1;
    while a < 256 {
        let la = log[a] as usize;
        let mut b = 1;
        while b < 256 {
            t[a][b] = exp[la + log[b] as usize];
            b += 1;
        }
        a += 1;
    }
    t
}

const fn build_nibble() -> [[[u8; 16]; 2]; 256] {
    let mut t = [[[0u8; 16]; 2]; 256];
    let mut c = 0;
    while c < 256 {
        let mut x = 0;
        while x < 16 {
            t[c][0][x] = mul_bitwise(c as u8, x as u8);
            t[c][1][x] = mul_bitwise(c as u8, (x << 4) as u8);
            x += 1;
        }
        c += 1;
    }
    t
}

/// `a * b` in GF(2^8)/0x11d.
#[inline]
pub fn gf_mul(a: u8, b: u8) -> u8 {
    MUL[a as usize][b as usize]
}

/// `g^i` with g = 2, for any `i` (the exponent is reduced mod 255).
#[inline]
pub fn gf_exp(i: usize) -> u8 {
    EXP[i % 255]
}

/// Multiplicative inverse `a^-1` (= a^254). By convention (md's `gfinv`) `gf_inv(0) == 0`.
#[inline]
pub fn gf_inv(a: u8) -> u8 {
    INV[a as usize]
}

/// Discrete logarithm base g = 2: `Some(i)` with `gf_exp(i) == a`, `0 <= i < 255`;
/// `None` for `a == 0`. Used e.g. to locate a single bad block from P/Q
/// mismatches (`z = log(Qx) - log(Px) mod 255`).
#[inline]
pub fn gf_log(a: u8) -> Option<u8> {
    if a == 0 {
        None
    } else {
        Some(LOG[a as usize])
    }
}

/// Multiply every byte of a little-endian-agnostic u64 lane by 2 (SWAR).
#[inline(always)]
pub(crate) const fn mul2_u64(v: u64) -> u64 {
    const HI: u64 = 0x8080_8080_8080_8080;
    let hi = v & HI;
    // (hi >> 7) has 0x01 in each byte whose top bit was set; * 0x1d spreads
    // the polynomial into exactly those bytes (no carries: 0x1d < 0x100).
    ((v << 1) & !0x0101_0101_0101_0101) ^ ((hi >> 7) * POLY as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn powers_match_reference_doc() {
        let want = [
            0x01, 0x02, 0x04, 0x08, 0x10, 0x20, 0x40, 0x80, 0x1d, 0x3a, 0x74, 0xe8, 0xcd, 0x87,
            0x13, 0x26,
        ];
        for (i, &w) in want.iter().enumerate() {
            assert_eq!(gf_exp(i), w, "g^{i}");
        }
        assert_eq!(gf_exp(255), 1);
        assert_eq!(gf_inv(2), 0x8e);
        assert_eq!(gf_inv(0), 0);
    }

    #[test]
    fn tables_exhaustive() {
        for a in 0..=255u8 {
            for b in 0..=255u8 {
                assert_eq!(gf_mul(a, b), mul_bitwise(a, b), "{a}*{b}");
            }
            if a != 0 {
                assert_eq!(gf_mul(a, gf_inv(a)), 1, "inv {a}");
                let l = gf_log(a).unwrap();
                assert_eq!(gf_exp(l as usize), a);
            }
            assert_eq!(mul2(a), mul_bitwise(a, 2));
            for x in 0..16u8 {
                assert_eq!(NIBBLE[a as usize][0][x as usize], mul_bitwise(a, x));
                assert_eq!(NIBBLE[a as usize][1][x as usize], mul_bitwise(a, x << 4));
            }
        }
        assert_eq!(gf_log(0), None);
        // g generates the whole multiplicative group.
        let mut seen = [false; 256];
        for i in 0..255 {
            assert!(!seen[gf_exp(i) as usize]);
            seen[gf_exp(i) as usize] = true;
        }
    }

    #[test]
    fn swar_mul2() {
        for a in 0..=255u8 {
            let v = u64::from_ne_bytes([a, a ^ 0x80, 0xff, 0, a.wrapping_add(7), 0x80, 1, a]);
            let got = mul2_u64(v).to_ne_bytes();
            let want = v.to_ne_bytes().map(mul2);
            assert_eq!(got, want);
        }
    }
}
