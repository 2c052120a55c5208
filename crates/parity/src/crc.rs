//! CRC32C (Castagnoli, reflected polynomial 0x82F63B78), thin wrappers over the
//! `crc-fast` crate (carry-less multiply folding, the widest the CPU offers, chosen at run
//! time; software otherwise).
//!
//! Two forms are in use around md:
//! * the *standard* form (initial value and final XOR 0xFFFF_FFFF):
//!   `crc32c(b"123456789") == 0xe3069283`;
//! * the kernel's `crc32c_le(seed, buf)` / raid5-cache / PPL *raw* register form,
//!   without any inversion: [`crc32c_raw`]. md seeds it with
//!   `crc32c_raw(0xFFFF_FFFF, set_uuid)` and checksums 4 KiB blocks with that seed.
//!
//! Relation: `crc32c_raw(s, d) == !crc32c_append(!s, d)`.

/// Standard CRC32C of `data`.
#[inline]
pub fn crc32c(data: &[u8]) -> u32 {
    crc_fast::crc32_iscsi(data)
}

/// Standard CRC32C continued over `data`: `crc32c_append(crc32c(a), b) == crc32c(a ++ b)`.
#[inline]
pub fn crc32c_append(crc: u32, data: &[u8]) -> u32 {
    !crc32c_raw(!crc, data)
}

/// Raw CRC32C register update with no initial/final inversion (the kernel's
/// `crc32c_le(seed, data)`, ISA-L's `crc32_iscsi(data, len, seed)`).
/// Chains: `crc32c_raw(crc32c_raw(s, a), b) == crc32c_raw(s, a ++ b)`.
#[inline]
pub fn crc32c_raw(seed: u32, data: &[u8]) -> u32 {
    let mut d =
        crc_fast::Digest::new_with_init_state(crc_fast::CrcAlgorithm::Crc32Iscsi, seed.into());
    d.update(data);
    d.get_state() as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Bit-serial reflected CRC32C register update: the independent oracle.
    fn raw_bitwise(mut crc: u32, data: &[u8]) -> u32 {
        for &b in data {
            crc ^= b as u32;
            for _ in 0..8 {
                crc = if crc & 1 != 0 {
                    (crc >> 1) ^ 0x82F6_3B78
                } else {
                    crc >> 1
                };
            }
        }
        crc
    }

    #[test]
    fn standard_check_value() {
        assert_eq!(crc32c(b"123456789"), 0xe306_9283);
        assert_eq!(crc32c(b""), 0);
        assert_eq!(crc32c_append(crc32c(b"1234"), b"56789"), 0xe306_9283);
    }

    #[test]
    fn md_raid5_cache_vectors() {
        // md-format.md 6.3: uuid bytes 00..0f.
        let uuid: Vec<u8> = (0u8..16).collect();
        let seed = crc32c_raw(0xFFFF_FFFF, &uuid);
        assert_eq!(seed, 0x2636_f714);
        assert_eq!(crc32c_raw(seed, &[0u8; 4096]), 0xb330_4a14);
    }

    #[test]
    fn raw_matches_bitwise_and_chains() {
        let data: Vec<u8> = (0..1000u32).map(|i| (i * 7 + 3) as u8).collect();
        for seed in [0, 0xFFFF_FFFF, 0x1234_5678, 0xdead_beef] {
            for cut in [0, 1, 7, 500, 999, 1000] {
                assert_eq!(
                    crc32c_raw(seed, &data[..cut]),
                    raw_bitwise(seed, &data[..cut])
                );
                let chained = crc32c_raw(crc32c_raw(seed, &data[..cut]), &data[cut..]);
                assert_eq!(chained, crc32c_raw(seed, &data));
            }
        }
        assert_eq!(!raw_bitwise(!0, b"123456789"), 0xe306_9283);
    }

    /// Blocks long enough for the folding paths (and their tails), from odd alignments.
    #[test]
    fn long_blocks_match_bitwise() {
        let data: Vec<u8> = (0..70_000u32).map(|i| (i * 131 + i / 251) as u8).collect();
        for seed in [0, 0xFFFF_FFFF, 0x2636_f714] {
            for (at, len) in [(0, 4096), (3, 4096), (1, 4095), (5, 65_536 + 13), (0, 255)] {
                let block = &data[at..at + len];
                assert_eq!(
                    crc32c_raw(seed, block),
                    raw_bitwise(seed, block),
                    "{at}+{len}"
                );
            }
        }
        assert_eq!(crc32c(&data[..4096]), !raw_bitwise(!0, &data[..4096]));
    }
}
