//! Helpers: mdadm defaults (data_offset, bitmap space, max_dev), UUID text forms, md times.

use crate::{MAX_DEV_LIMIT, SB_FIXED_BYTES};

/// Seconds part of an md time (low 40 bits; the high 24 bits are microseconds).
pub const MD_TIME_SECS_MASK: u64 = (1 << 40) - 1;

/// Encode a time as md does: seconds in the low 40 bits, microseconds (high 24) zero.
pub fn md_time(secs: u64) -> u64 {
    secs & MD_TIME_SECS_MASK
}

/// The `utime` ironraid writes: md's encoding with the microseconds filled in and never zero.
/// The kernel's md and mdadm write whole seconds (microseconds zero) every time they write a
/// superblock, and neither keeps what was there: a `utime` whose microseconds are zero was
/// written last by md, even within the same second as ironraid's last write.
pub fn ironraid_time(since_epoch: std::time::Duration) -> u64 {
    let micros = u64::from(since_epoch.subsec_micros()).max(1);
    md_time(since_epoch.as_secs()) | micros << 40
}

/// Whether md (the kernel or mdadm), not ironraid, wrote the superblock with this `utime` last
/// (see [`ironraid_time`]).
pub fn written_by_md(utime: u64) -> bool {
    utime >> 40 == 0
}

const GIB_SECTORS: u64 = 2 * 1024 * 1024;

/// Space (sectors) mdadm reserves after the v1.1/1.2 superblock for an internal bitmap,
/// by device size in sectors: 0 below 64 KiB, 8 up to ~8 GiB, 128 up to ~200 GiB,
/// 256 beyond (reference §1.6).
pub fn bm_space(device_sectors: u64) -> u64 {
    if device_sectors < 128 {
        0
    } else if device_sectors - 128 >= 200 * GIB_SECTORS {
        256
    } else if device_sectors - 8 > 8 * GIB_SECTORS {
        128
    } else {
        8
    }
}

/// mdadm's default v1.2 `data_offset` in sectors for a device of `device_sectors` and a
/// chunk of `chunk_sectors` (0 for RAID1/linear).
///
/// Reshape headroom starts at 128 MiB and is halved while it exceeds ~0.1% of the device
/// (`headroom * 1024 > device`) and, for chunked levels, while half of it is still at least
/// two chunks. Then `round_up(24 + bm_space + headroom, 2048)`.
/// Examples (512 KiB chunk): 64 MiB..1 GiB → 4096, 10 GiB → 18432, 100 GiB → 133120,
/// ≥ 128 GiB → 264192.
pub fn default_data_offset(device_sectors: u64, chunk_sectors: u64) -> u64 {
    let mut headroom: u64 = 128 * 1024 * 2;
    while (headroom << 10) > device_sectors
        && (chunk_sectors == 0 || headroom / 2 >= chunk_sectors.saturating_mul(2))
    {
        headroom >>= 1;
    }
    let raw = 24 + bm_space(device_sectors) + headroom;
    raw.div_ceil(2048) * 2048
}

/// mdadm's `max_dev` for a new array of `devices` members (active + spare):
/// `(round_up(256 + 2*devices, 512) - 256) / 2`, i.e. 128 up to 128 devices, 384 up to
/// 384, …; capped at 1920.
pub fn max_dev_for(devices: usize) -> u32 {
    let bytes = SB_FIXED_BYTES.saturating_add(devices.saturating_mul(2));
    let rounded = bytes.div_ceil(512).saturating_mul(512);
    let n = (rounded - SB_FIXED_BYTES) / 2;
    (n.min(MAX_DEV_LIMIT as usize)) as u32
}

/// Name mdadm uses for a level (`raid5`, `linear`, …), if known.
pub fn level_name(level: i32) -> Option<&'static str> {
    Some(match level {
        -5 => "faulty",
        -4 => "multipath",
        -1 => "linear",
        0 => "raid0",
        1 => "raid1",
        4 => "raid4",
        5 => "raid5",
        6 => "raid6",
        10 => "raid10",
        _ => return None,
    })
}

fn hex(bytes: &[u8], out: &mut String) {
    const H: &[u8; 16] = b"0123456789abcdef";
    for &b in bytes {
        out.push(H[(b >> 4) as usize] as char);
        out.push(H[(b & 15) as usize] as char);
    }
}

/// mdadm form: four groups of 8 hex digits in byte order, `xxxxxxxx:xxxxxxxx:xxxxxxxx:xxxxxxxx`.
pub fn format_uuid_mdadm(uuid: &[u8; 16]) -> String {
    let mut s = String::with_capacity(35);
    for (i, g) in uuid.chunks(4).enumerate() {
        if i > 0 {
            s.push(':');
        }
        hex(g, &mut s);
    }
    s
}

/// Standard form `xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx` (byte order).
pub fn format_uuid(uuid: &[u8; 16]) -> String {
    let mut s = String::with_capacity(36);
    for (i, r) in [0..4, 4..6, 6..8, 8..10, 10..16].into_iter().enumerate() {
        if i > 0 {
            s.push('-');
        }
        hex(&uuid[r], &mut s);
    }
    s
}

/// Parse a UUID in either the standard or the mdadm form (any case). Accepts exactly 32
/// hex digits, separated only by `-`, `:`, `.` or spaces (mdadm is similarly lenient).
pub fn parse_uuid(s: &str) -> Option<[u8; 16]> {
    let mut out = [0u8; 16];
    let mut n = 0usize;
    for c in s.trim().chars() {
        if matches!(c, '-' | ':' | '.' | ' ') {
            continue;
        }
        let d = c.to_digit(16)? as u8;
        if n >= 32 {
            return None;
        }
        out[n / 2] |= if n & 1 == 0 { d << 4 } else { d };
        n += 1;
    }
    (n == 32).then_some(out)
}
