use super::*;

fn sample() -> Superblock {
    let mut roles = vec![0u16, 1, 2, 3];
    roles.resize(128, ROLE_SPARE);
    Superblock {
        feature_map: feature::BITMAP_OFFSET,
        set_uuid: *b"0123456789abcdef",
        set_name: "host:ironraid".into(),
        ctime: md_time(1_700_000_000),
        level: 5,
        layout: 2,
        size: 126_976,
        chunksize: 1024,
        raid_disks: 4,
        bitmap_offset: 8,
        new_level: 0,
        reshape_position: 0,
        delta_disks: 0,
        new_layout: 0,
        new_chunk: 0,
        new_offset: 0,
        data_offset: 4096,
        data_size: 126_976,
        super_offset: 8,
        recovery_offset: 0,
        dev_number: 2,
        cnt_corrected_read: 0,
        device_uuid: [7; 16],
        devflags: 0,
        bblog_shift: 0,
        bblog_size: 8,
        bblog_offset: 16,
        utime: md_time(1_700_000_100),
        events: 7,
        resync_offset: MAX_SECTOR,
        max_dev: 128,
        dev_roles: roles,
    }
}

fn reencode(mut b: [u8; SB_BYTES]) -> [u8; SB_BYTES] {
    let c = sb_csum(&b);
    b[CSUM_OFFSET..CSUM_OFFSET + 4].copy_from_slice(&c.to_le_bytes());
    b
}

#[test]
fn checksum_known_answer() {
    let mut b = [0u8; SB_BYTES];
    b[0..4].copy_from_slice(&MD_SB_MAGIC.to_le_bytes());
    b[4..8].copy_from_slice(&1u32.to_le_bytes());
    b[8..16].fill(0xff); // two words of 0xffffffff force a carry into the high half
    b[216..220].copy_from_slice(&[0xde, 0xad, 0xbe, 0xef]); // csum field is ignored
    b[220..224].copy_from_slice(&1u32.to_le_bytes()); // max_dev = 1 → trailing u16
    b[256..258].copy_from_slice(&5u16.to_le_bytes());
    b[258] = 0x99; // beyond 256 + 2*max_dev: not covered
                   // sum = a92b4efc + 1 + ffffffff + ffffffff + 1 + 5 = 0x2_a92b4f01 → fold 0xa92b4f03
    assert_eq!(sb_csum(&b), 0xa92b_4f03);
    // Only the covered bytes count.
    assert_eq!(sb_csum(&b[..258]), 0xa92b_4f03);
}

#[test]
fn encode_byte_positions() {
    let sb = sample();
    let b = sb.encode();
    assert_eq!(&b[0..4], &[0xfc, 0x4e, 0x2b, 0xa9]);
    assert_eq!(&b[4..8], &[1, 0, 0, 0]);
    assert_eq!(&b[16..32], b"0123456789abcdef");
    assert_eq!(&b[32..45], b"host:ironraid");
    assert!(b[45..64].iter().all(|&x| x == 0));
    assert_eq!(&b[72..76], &5i32.to_le_bytes());
    assert_eq!(&b[128..136], &4096u64.to_le_bytes());
    assert_eq!(&b[144..152], &8u64.to_le_bytes());
    assert_eq!(&b[160..164], &2u32.to_le_bytes());
    assert_eq!(&b[208..216], &[0xff; 8]);
    assert_eq!(&b[220..224], &128u32.to_le_bytes());
    assert_eq!(&b[256..264], &[0, 0, 1, 0, 2, 0, 3, 0]);
    assert_eq!(&b[264..266], &[0xff, 0xff]);
    assert!(b[512..].iter().all(|&x| x == 0));
    assert_eq!(
        u32::from_le_bytes(b[216..220].try_into().unwrap()),
        sb_csum(&b)
    );
    assert_eq!(Superblock::decode(&b).unwrap(), sb);
}

#[test]
fn decode_errors() {
    let good = sample().encode();
    assert_eq!(
        Superblock::decode(&[0u8; SB_BYTES]),
        Err(FormatError::NoSuperblock)
    );
    assert_eq!(Superblock::decode(&good[..3]), Err(FormatError::Truncated));
    assert_eq!(
        Superblock::decode(&good[..300]),
        Err(FormatError::Truncated)
    );
    assert_eq!(Superblock::decode(&good[..512]).unwrap(), sample());

    let mut b = good;
    b[4] = 2;
    assert_eq!(Superblock::decode(&b), Err(FormatError::BadMajor(2)));

    let mut b = good;
    b[220..224].copy_from_slice(&1921u32.to_le_bytes());
    assert_eq!(Superblock::decode(&b), Err(FormatError::BadMaxDev(1921)));

    let mut b = good;
    b[100] ^= 1;
    assert!(matches!(
        Superblock::decode(&b),
        Err(FormatError::BadChecksum { .. })
    ));

    let mut b = good;
    b[12] = 1;
    assert_eq!(
        Superblock::decode(&reencode(b)),
        Err(FormatError::NonZeroPad)
    );
    let mut b = good;
    b[255] = 1;
    assert_eq!(
        Superblock::decode(&reencode(b)),
        Err(FormatError::NonZeroPad)
    );

    let check = |f: &dyn Fn(&mut Superblock), e: FormatError| {
        let mut sb = sample();
        f(&mut sb);
        assert_eq!(Superblock::decode(&sb.encode()), Err(e.clone()));
        assert_eq!(sb.validate(), Err(e));
    };
    check(&|s| s.super_offset = 0, FormatError::BadSuperOffset(0));
    check(
        &|s| s.feature_map |= 0x4000,
        FormatError::UnknownFeatures(0x4000),
    );
    check(&|s| s.data_size = 9, FormatError::BadDataSize(9));
    check(&|s| s.data_offset = 15, FormatError::BadDataOffset(15));
    check(
        &|s| s.feature_map |= feature::RAID0_LAYOUT,
        FormatError::BadFeatureCombination("RAID0_LAYOUT with level 5".into()),
    );
    check(
        &|s| s.feature_map = feature::PPL | feature::MULTIPLE_PPLS,
        FormatError::BadFeatureCombination("PPL and MULTIPLE_PPLS both set".into()),
    );
    check(
        &|s| s.feature_map = feature::PPL | feature::BITMAP_OFFSET,
        FormatError::BadFeatureCombination("PPL together with bitmap or journal".into()),
    );
    let mut sb = sample();
    sb.feature_map |= feature::RESHAPE_ACTIVE;
    let b = sb.encode();
    assert!(matches!(
        Superblock::decode(&b),
        Err(FormatError::Unsupported(_))
    ));
    // parse() still shows it.
    assert_eq!(Superblock::parse(&b).unwrap(), sb);

    let mut sb = sample();
    sb.level = 0;
    sb.feature_map = feature::RAID0_LAYOUT;
    assert_eq!(Superblock::decode(&sb.encode()).unwrap(), sb);
}

#[test]
fn error_messages_name_reason() {
    let e = FormatError::BadChecksum {
        stored: 1,
        computed: 2,
    };
    assert_eq!(
        e.to_string(),
        "md superblock checksum mismatch: stored 0x00000001, computed 0x00000002"
    );
    assert!(FormatError::NoSuperblock
        .to_string()
        .contains("no md superblock"));
}

#[test]
fn roles() {
    let sb = sample();
    assert_eq!(sb.role(), DevRole::Active(2));
    assert_eq!(sb.role_of(4), DevRole::Spare);
    assert_eq!(sb.role_of(5000), DevRole::Spare);
    for (raw, r) in [
        (0, DevRole::Active(0)),
        (0xfeff, DevRole::Active(0xfeff)),
        (0xffff, DevRole::Spare),
        (0xfffe, DevRole::Faulty),
        (0xfffd, DevRole::Journal),
    ] {
        assert_eq!(DevRole::from_raw(raw), r);
        assert_eq!(r.to_raw(), raw);
    }
    assert_eq!(DevRole::from_raw(0xff00), DevRole::Spare);
    let mut sb = sample();
    sb.set_role(200, DevRole::Faulty);
    assert_eq!(sb.max_dev, 201);
    assert_eq!(sb.dev_roles.len(), 201);
    assert_eq!(sb.role_of(200), DevRole::Faulty);
    assert_eq!(sb.role_of(199), DevRole::Spare);
    assert_eq!(Superblock::decode(&sb.encode()).unwrap(), sb);
}

#[test]
fn device_fit() {
    let sb = sample();
    assert_eq!(sb.check_fits(131_072), Ok(()));
    assert_eq!(
        sb.check_fits(131_071),
        Err(FormatError::DeviceTooSmall {
            need: 131_072,
            have: 131_071
        })
    );
}

#[test]
fn times_and_state() {
    let mut sb = sample();
    assert!(sb.is_clean());
    sb.resync_offset = 0;
    assert!(!sb.is_clean());
    sb.ctime = (123 << 40) | 1_700_000_000;
    assert_eq!(sb.ctime_secs(), 1_700_000_000);
    assert_eq!(sb.utime_secs(), 1_700_000_100);
    assert_eq!(md_time(u64::MAX), (1 << 40) - 1);
}

#[test]
fn ironraid_time_is_never_what_md_writes() {
    use std::time::Duration;
    for (secs, nanos) in [(1_700_000_000, 0), (1_700_000_000, 999), (5, 123_456_789)] {
        let t = crate::ironraid_time(Duration::new(secs, nanos));
        assert_eq!(t & crate::MD_TIME_SECS_MASK, secs, "seconds kept");
        assert!(
            !crate::written_by_md(t),
            "{secs}.{nanos}: microseconds left zero"
        );
        assert!(crate::written_by_md(md_time(secs)), "md's whole seconds");
    }
    assert_eq!(
        crate::ironraid_time(Duration::new(7, 250_000_000)) >> 40,
        250_000
    );
}

#[test]
fn name_truncation_and_nul() {
    let mut sb = sample();
    sb.set_name = "x".repeat(31) + "é"; // 33 bytes: the 2-byte char must go whole
    let d = Superblock::decode(&sb.encode()).unwrap();
    assert_eq!(d.set_name, "x".repeat(31));
    sb.set_name = "y".repeat(32);
    assert_eq!(Superblock::decode(&sb.encode()).unwrap().set_name.len(), 32);
}

#[test]
fn data_offset_defaults() {
    let gib = 2 * 1024 * 1024u64;
    assert_eq!(default_data_offset(131_072, 1024), 4096); // 64 MiB
    assert_eq!(default_data_offset(gib, 1024), 4096);
    assert_eq!(default_data_offset(10 * gib, 1024), 18_432);
    assert_eq!(default_data_offset(100 * gib, 1024), 133_120);
    assert_eq!(default_data_offset(128 * gib, 1024), 264_192);
    assert_eq!(default_data_offset(1000 * gib, 1024), 264_192);
    assert_eq!(default_data_offset(131_072, 0), 2048); // RAID1, small
    assert_eq!(bm_space(64), 0);
    assert_eq!(bm_space(131_072), 8);
    assert_eq!(bm_space(10 * gib), 128);
    assert_eq!(bm_space(300 * gib), 256);
}

#[test]
fn max_dev_rule() {
    assert_eq!(max_dev_for(0), 128);
    assert_eq!(max_dev_for(4), 128);
    assert_eq!(max_dev_for(128), 128);
    assert_eq!(max_dev_for(129), 384);
    assert_eq!(max_dev_for(5000), 1920);
}

#[test]
fn uuids() {
    let u: [u8; 16] = [
        0x01, 0x23, 0x45, 0x67, 0x89, 0xab, 0xcd, 0xef, 0xfe, 0xdc, 0xba, 0x98, 0x76, 0x54, 0x32,
        0x10,
    ];
    let m = format_uuid_mdadm(&u);
    let s = format_uuid(&u);
    assert_eq!(m, "01234567:89abcdef:fedcba98:76543210");
    assert_eq!(s, "01234567-89ab-cdef-fedc-ba9876543210");
    assert_eq!(parse_uuid(&m), Some(u));
    assert_eq!(parse_uuid(&s), Some(u));
    assert_eq!(parse_uuid(&s.to_uppercase()), Some(u));
    assert_eq!(parse_uuid("0123"), None);
    assert_eq!(parse_uuid(&format!("{s}0")), None);
    assert_eq!(parse_uuid("g1234567:89abcdef:fedcba98:76543210"), None);
}

#[test]
fn create_builder() {
    let p = CreateParams {
        set_uuid: [1; 16],
        name: "h:r5".into(),
        ctime_secs: 1_700_000_000,
        level: 5,
        layout: 2,
        chunk_sectors: 1024,
        raid_disks: 4,
        size: 126_976,
        data_offset: 4096,
        data_size: 126_976,
        dev_number: 1,
        device_uuid: [2; 16],
        roles: vec![0, 1, 2, 3],
        assume_clean: false,
        internal_bitmap: false,
        journal: false,
        integrity: false,
        bm_space_device_sectors: None,
        cluster_bitmap_sectors: None,
    };
    let sb = Superblock::new_for_create(&p).unwrap();
    assert_eq!(sb.max_dev, 128);
    assert_eq!(sb.dev_roles[4..], [ROLE_SPARE; 124]);
    assert_eq!((sb.bblog_shift, sb.bblog_size, sb.bblog_offset), (0, 8, 16));
    assert_eq!(sb.resync_offset, 0);
    assert_eq!(sb.events, 0);
    assert_eq!(sb.feature_map, 0);
    assert_eq!(sb.role(), DevRole::Active(1));
    assert_eq!(Superblock::decode(&sb.encode()).unwrap(), sb);

    let r0 = Superblock::new_for_create(&CreateParams {
        level: 0,
        layout: 1,
        internal_bitmap: true,
        journal: false,
        integrity: false,
        ..p.clone()
    })
    .unwrap();
    assert_eq!(
        r0.feature_map,
        feature::RAID0_LAYOUT | feature::BITMAP_OFFSET
    );
    assert_eq!(r0.bitmap_offset, 8);
    assert!(r0.is_clean());

    // Tight metadata area: bad-block log goes just below data_offset.
    let tight = Superblock::new_for_create(&CreateParams {
        data_offset: 32,
        ..p.clone()
    })
    .unwrap();
    assert_eq!(tight.bblog_offset, 16);
    let tight = Superblock::new_for_create(&CreateParams {
        data_offset: 30,
        ..p.clone()
    })
    .unwrap();
    assert_eq!(tight.bblog_offset, 14);
    // The metadata area is laid out for the size given, not this device's: a member larger
    // than 8 GiB in an array laid out for a small one keeps the small array's bblog place.
    let big = CreateParams {
        data_size: 20 << 21,
        ..p.clone()
    };
    assert_eq!(
        Superblock::new_for_create(&big).unwrap().bblog_offset,
        8 + 128
    );
    let laid_out_small = CreateParams {
        bm_space_device_sectors: Some(131_072),
        ..big
    };
    assert_eq!(
        Superblock::new_for_create(&laid_out_small)
            .unwrap()
            .bblog_offset,
        16
    );
    assert!(Superblock::new_for_create(&CreateParams {
        dev_number: 4,
        ..p.clone()
    })
    .is_err());
    // md-cluster: four node slots of 8 sectors; the bad-block log moves past all of them.
    let clustered = Superblock::new_for_create(&CreateParams {
        internal_bitmap: true,
        cluster_bitmap_sectors: Some(32),
        ..p.clone()
    })
    .unwrap();
    assert_eq!(
        clustered.feature_map,
        feature::BITMAP_OFFSET | feature::CLUSTERED
    );
    assert_eq!(clustered.bblog_offset, 8 + 32);
    for refused in [
        CreateParams {
            cluster_bitmap_sectors: Some(32),
            ..p.clone()
        },
        CreateParams {
            internal_bitmap: true,
            cluster_bitmap_sectors: Some(4096),
            ..p.clone()
        },
    ] {
        assert!(Superblock::new_for_create(&refused).is_err());
    }
    assert_eq!(
        Superblock::new_for_create(&CreateParams {
            data_offset: 8,
            ..p
        }),
        Err(FormatError::BadDataOffset(8))
    );
}
