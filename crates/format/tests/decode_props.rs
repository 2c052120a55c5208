//! Property tests: round trip, single-bit corruption is always refused, garbage never panics
//! (superblocks and write-intent bitmap headers).

use format::{
    feature, sb_csum, BitmapSuper, Superblock, BITMAP_HEADER_BYTES, BITMAP_MAGIC, BITMAP_VERSION,
    BITMAP_VERSION_CLUSTERED, CLUSTER_NAME_BYTES, MAX_CLUSTER_NODES, MD_SB_MAGIC, SB_BYTES,
};
use proptest::prelude::*;

/// Feature bits that `validate` accepts in any combination (no reshape, no PPL, no RAID0).
const SAFE_FEATURES: u32 = feature::BITMAP_OFFSET
    | feature::RECOVERY_OFFSET
    | feature::BAD_BLOCKS
    | feature::REPLACEMENT
    | feature::RECOVERY_BITMAP
    | feature::CLUSTERED
    | feature::JOURNAL;

fn arb_superblock() -> impl Strategy<Value = Superblock> {
    let max_dev = prop_oneof![Just(128u32), 0u32..=1920];
    let roles = max_dev.prop_flat_map(|n| {
        (
            Just(n),
            proptest::collection::vec(any::<u16>(), n as usize..=n as usize),
        )
    });
    let ids = (
        any::<u32>(),
        any::<bool>(),
        any::<[u8; 16]>(),
        "[a-zA-Z0-9:_.-]{0,32}",
        any::<u64>(),
        prop_oneof![
            Just(0i32),
            Just(1),
            Just(5),
            Just(6),
            Just(10),
            Just(-1),
            any::<i32>()
        ],
        any::<u32>(),
        any::<u64>(),
        any::<u32>(),
        any::<u32>(),
        any::<i32>(),
    );
    let reshape = (
        any::<i32>(),
        any::<u64>(),
        any::<i32>(),
        any::<u32>(),
        any::<u32>(),
        any::<i32>(),
    );
    let dev = (
        16u64..u64::MAX / 2,
        10u64..u64::MAX / 2,
        any::<u64>(),
        any::<u32>(),
        any::<u32>(),
        any::<[u8; 16]>(),
        any::<u8>(),
        any::<u8>(),
        any::<u16>(),
        any::<i32>(),
    );
    let state = (any::<u64>(), any::<u64>(), any::<u64>());
    (ids, reshape, dev, state, roles).prop_map(|(i, r, d, s, (max_dev, dev_roles))| {
        let (feat, r0, set_uuid, set_name, ctime, level, layout, size, chunk, disks, bmo) = i;
        let mut feature_map = feat & SAFE_FEATURES;
        if level == 0 && r0 {
            feature_map |= feature::RAID0_LAYOUT;
        }
        Superblock {
            feature_map,
            set_uuid,
            set_name,
            ctime,
            level,
            layout,
            size,
            chunksize: chunk,
            raid_disks: disks,
            bitmap_offset: bmo,
            new_level: r.0,
            reshape_position: r.1,
            delta_disks: r.2,
            new_layout: r.3,
            new_chunk: r.4,
            new_offset: r.5,
            data_offset: d.0,
            data_size: d.1,
            super_offset: 8,
            recovery_offset: d.2,
            dev_number: d.3,
            cnt_corrected_read: d.4,
            device_uuid: d.5,
            devflags: d.6,
            bblog_shift: d.7,
            bblog_size: d.8,
            bblog_offset: d.9,
            utime: s.0,
            events: s.1,
            resync_offset: s.2,
            max_dev,
            dev_roles,
        }
    })
}

/// A buffer that passes the magic/major/max_dev/checksum gates, with arbitrary contents.
fn forged(mut body: Vec<u8>, max_dev: u32) -> Vec<u8> {
    body.resize(SB_BYTES, 0);
    body[0..4].copy_from_slice(&MD_SB_MAGIC.to_le_bytes());
    body[4..8].copy_from_slice(&1u32.to_le_bytes());
    body[220..224].copy_from_slice(&max_dev.to_le_bytes());
    let c = sb_csum(&body);
    body[216..220].copy_from_slice(&c.to_le_bytes());
    body
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    #[test]
    fn round_trip(sb in arb_superblock()) {
        let b = sb.encode();
        prop_assert_eq!(Superblock::decode(&b), Ok(sb.clone()));
        prop_assert_eq!(Superblock::parse(&b), Ok(sb.clone()));
        // Encoding is a function of the value only.
        prop_assert_eq!(Superblock::decode(&b).unwrap().encode(), b);
    }

    #[test]
    fn every_single_bit_flip_is_refused(sb in arb_superblock()) {
        let good = sb.encode();
        let covered = sb.sb_len();
        for byte in 0..covered {
            for bit in 0..8 {
                let mut b = good;
                b[byte] ^= 1 << bit;
                prop_assert!(
                    Superblock::decode(&b).is_err(),
                    "flip of byte {} bit {} accepted", byte, bit
                );
            }
        }
    }

    #[test]
    fn random_garbage_never_panics(buf in proptest::collection::vec(any::<u8>(), 0..5000)) {
        let _ = Superblock::decode(&buf);
        let _ = Superblock::parse(&buf);
        let _ = sb_csum(&buf);
    }

    #[test]
    fn garbage_with_magic_never_panics(
        mut buf in proptest::collection::vec(any::<u8>(), 0..5000),
        cut in 0usize..5000,
    ) {
        if buf.len() >= 4 {
            buf[0..4].copy_from_slice(&MD_SB_MAGIC.to_le_bytes());
        }
        if buf.len() >= 8 {
            buf[4..8].copy_from_slice(&1u32.to_le_bytes());
        }
        let _ = Superblock::decode(&buf);
        let _ = Superblock::decode(&buf[..cut.min(buf.len())]);
    }

    #[test]
    fn forged_checksum_garbage_never_panics(
        body in proptest::collection::vec(any::<u8>(), 0..SB_BYTES),
        max_dev in prop_oneof![0u32..=1920, any::<u32>()],
        zero_pads in any::<bool>(),
    ) {
        let mut b = forged(body, max_dev);
        if zero_pads {
            b[12..16].fill(0);
            b[224..256].fill(0);
            b = forged(b, max_dev);
        }
        if let Ok(sb) = Superblock::decode(&b) {
            prop_assert!(sb.validate().is_ok());
            prop_assert_eq!(sb.dev_roles.len(), sb.max_dev as usize);
            let _ = sb.role();
        }
    }

    #[test]
    fn bit_flips_anywhere_never_panic(
        sb in arb_superblock(),
        flips in proptest::collection::vec((0usize..SB_BYTES, 0u8..8), 1..16),
    ) {
        let mut b = sb.encode();
        for (byte, bit) in flips {
            b[byte] ^= 1 << bit;
        }
        let _ = Superblock::decode(&b);
    }
}

/// Headers the kernel's loader accepts (classic and clustered versions, sane chunk, sleep and
/// write-behind; a clustered one with 1 to MAX_CLUSTER_NODES slots and a NUL-terminated name).
fn arb_bitmap_super() -> impl Strategy<Value = BitmapSuper> {
    let cluster = (
        any::<bool>(),
        1u32..=MAX_CLUSTER_NODES,
        proptest::collection::vec(1u8..=255, 0..CLUSTER_NAME_BYTES),
    );
    (arb_classic_bitmap_super(), cluster).prop_map(|(sb, (clustered, nodes, name))| {
        if !clustered {
            return sb;
        }
        // Every slot together must fit in 64 bits (decode refuses more): a sync size up to
        // 2^48 sectors keeps 256 slots of the smallest chunk inside.
        let mut sb = BitmapSuper {
            version: BITMAP_VERSION_CLUSTERED,
            nodes,
            sync_size: sb.sync_size % (1 << 48),
            ..sb
        };
        sb.cluster_name = [0; CLUSTER_NAME_BYTES];
        sb.cluster_name[..name.len()].copy_from_slice(&name);
        sb
    })
}

/// Version 3 and 4 headers (whose cluster fields md ignores and which round-trip as bytes).
fn arb_classic_bitmap_super() -> impl Strategy<Value = BitmapSuper> {
    (
        prop_oneof![Just(3u32), Just(4)],
        any::<[u8; 16]>(),
        any::<u64>(),
        any::<u64>(),
        prop_oneof![0u64..1 << 40, any::<u64>()],
        any::<u32>(),
        9u32..32,
        1u32..=u32::MAX,
        0u32..=16383,
        any::<u32>(),
    )
        .prop_map(
            |(version, uuid, e1, e2, sync, state, shift, sleep, behind, reserved)| BitmapSuper {
                version,
                uuid,
                events: e1.max(e2),
                events_cleared: e1.min(e2),
                sync_size: sync,
                state,
                chunksize: 1 << shift,
                daemon_sleep: sleep,
                write_behind: behind,
                sectors_reserved: reserved,
                nodes: 0,
                cluster_name: [0; CLUSTER_NAME_BYTES],
            },
        )
}

/// What holds for any header `decode` accepts: it re-encodes to itself and its sizes can be
/// computed (a reader sizes its buffer from them).
fn accepted_bitmap_is_sane(sb: &BitmapSuper) -> Result<(), TestCaseError> {
    prop_assert!(sb.chunksize >= 512 && sb.chunksize.is_power_of_two());
    prop_assert!(sb.events_cleared <= sb.events);
    prop_assert_eq!(BitmapSuper::decode(&sb.encode()), Ok(sb.clone()));
    let chunks = sb.chunks();
    prop_assert!(chunks <= sb.sync_size);
    prop_assert!(sb.bytes_on_disk() >= BITMAP_HEADER_BYTES as u64 + chunks.div_ceil(8));
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn bitmap_round_trip(sb in arb_bitmap_super()) {
        let b = sb.encode();
        prop_assert_eq!(BitmapSuper::decode(&b), Ok(sb.clone()));
        prop_assert_eq!(BitmapSuper::decode(&b).unwrap().encode(), b);
        accepted_bitmap_is_sane(&sb)?;
    }

    #[test]
    fn bitmap_garbage_never_panics(
        mut buf in proptest::collection::vec(any::<u8>(), 0..600),
        forge in any::<bool>(),
    ) {
        // Past the magic and version gates, the checks behind them get exercised too.
        if forge && buf.len() > 8 {
            let version = if buf[8] & 1 == 0 { BITMAP_VERSION } else { BITMAP_VERSION_CLUSTERED };
            buf[0..4].copy_from_slice(&BITMAP_MAGIC.to_le_bytes());
            buf[4..8].copy_from_slice(&version.to_le_bytes());
        }
        if let Ok(sb) = BitmapSuper::decode(&buf) {
            accepted_bitmap_is_sane(&sb)?;
        }
    }

    #[test]
    fn bitmap_bit_flips_never_panic(
        sb in arb_bitmap_super(),
        flips in proptest::collection::vec((0usize..BITMAP_HEADER_BYTES, 0u8..8), 1..8),
    ) {
        let mut b = sb.encode();
        for (byte, bit) in flips {
            b[byte] ^= 1 << bit;
        }
        if let Ok(sb) = BitmapSuper::decode(&b) {
            accepted_bitmap_is_sane(&sb)?;
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// The used-region map header: what encodes decodes back; garbage and bit flips are
    /// refused or decoded sanely, never a panic.
    #[test]
    fn used_map_round_trip_and_garbage(
        uuid in any::<[u8; 16]>(),
        events in any::<u64>(),
        shift in 12u32..40,
        regions in any::<u64>(),
        flip in 0usize..(64 * 8),
        garbage in proptest::collection::vec(any::<u8>(), 0..200),
    ) {
        let h = format::UsedMapHeader { uuid, events, region_bytes: 1 << shift, regions, flags: (events % 2) as u32, sb_utime: events.rotate_left(7) };
        let enc = h.encode();
        prop_assert_eq!(format::UsedMapHeader::decode(&enc).unwrap(), h.clone());
        let mut flipped = enc;
        flipped[flip / 8] ^= 1 << (flip % 8);
        prop_assert!(format::UsedMapHeader::decode(&flipped).is_err(), "a flipped bit in the checksummed header must be refused");
        if let Ok(g) = format::UsedMapHeader::decode(&garbage) {
            prop_assert!(g.region_bytes.is_power_of_two());
        }
        prop_assert!(h.bytes_on_disk() >= 4096 + regions.div_ceil(8));
    }
}
