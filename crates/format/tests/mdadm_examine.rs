//! Cross-check our encoder against the real `mdadm --examine` on plain sparse files
//! (works without the md kernel module; reference §11). Without mdadm these tests fail
//! (`common::require_tool`; `IRONRAID_ALLOW_MISSING_TOOLS=1` makes them print a skip instead).

mod common;

use std::fs::OpenOptions;
use std::io::{Seek, SeekFrom, Write};
use std::path::Path;
use std::process::Command;

use format::{
    default_data_offset, format_uuid_mdadm, CreateParams, Superblock, CSUM_OFFSET, SB_BYTES,
    SB_OFFSET_SECTORS,
};

const DEV_SECTORS: u64 = 64 * 1024 * 2; // 64 MiB

fn write_image(path: &Path, block: &[u8; SB_BYTES]) {
    let mut f = OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .open(path)
        .unwrap();
    f.set_len(DEV_SECTORS * 512).unwrap();
    f.seek(SeekFrom::Start(SB_OFFSET_SECTORS * 512)).unwrap();
    f.write_all(block).unwrap();
    f.sync_all().unwrap();
}

fn examine(mdadm: &Path, img: &Path) -> (bool, String) {
    let out = Command::new(mdadm)
        .arg("--examine")
        .arg(img)
        .env("LC_ALL", "C")
        .output()
        .expect("run mdadm");
    let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.push_str(&String::from_utf8_lossy(&out.stderr));
    (out.status.success(), text)
}

/// Value of a `Key : value` line of `mdadm --examine`.
fn field<'a>(text: &'a str, key: &str) -> Option<&'a str> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(" : ")?;
        (k.trim() == key).then(|| v.trim())
    })
}

struct Case {
    level: i32,
    layout: u32,
    chunk_kib: u32,
    disks: u32,
    role: u16,
    // expectations
    level_name: &'static str,
    layout_name: Option<&'static str>,
    /// `None` where mdadm 4.2 prints no "Array Size" (raid0, linear).
    array_kib: Option<u64>,
}

fn build(c: &Case, events: u64) -> Superblock {
    let chunk = c.chunk_kib * 2;
    let data_offset = default_data_offset(DEV_SECTORS, u64::from(chunk));
    let data_size = DEV_SECTORS - data_offset;
    let round = if chunk == 0 { 128 } else { u64::from(chunk) };
    let size = data_size / round * round;
    let mut roles: Vec<u16> = (0..c.disks as u16).collect();
    roles.push(0xffff); // one spare slot
    let mut sb = Superblock::new_for_create(&CreateParams {
        set_uuid: [
            0x3a, 0x1b, 0x5c, 0x7d, 0x00, 0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88, 0x99,
            0xaa, 0xbb,
        ],
        name: format!("ironraid:{}", c.level_name),
        ctime_secs: 1_700_000_000,
        level: c.level,
        layout: c.layout,
        chunk_sectors: chunk,
        raid_disks: c.disks,
        size,
        data_offset,
        data_size,
        dev_number: u32::from(c.role),
        device_uuid: [0x42; 16],
        roles,
        assume_clean: true,
        // No bitmap: mdadm drops BITMAP_OFFSET in memory (and then reports the checksum
        // as wrong) unless a valid bitmap superblock sits at +8 sectors.
        internal_bitmap: false,
        journal: false,
        integrity: false,
        bm_space_device_sectors: None,
        cluster_bitmap_sectors: None,
    })
    .unwrap();
    sb.events = events;
    sb
}

fn check_case(mdadm: &Path, dir: &Path, c: &Case) {
    let sb = build(c, 7);
    let img = dir.join(format!("{}.img", c.level_name));
    write_image(&img, &sb.encode());
    let (ok, text) = examine(mdadm, &img);
    println!("---- mdadm --examine ({}) ----\n{text}", c.level_name);
    assert!(ok, "mdadm failed:\n{text}");
    let get = |k: &str| field(&text, k).unwrap_or_else(|| panic!("no '{k}' in:\n{text}"));

    assert_eq!(get("Magic"), "a92b4efc");
    assert_eq!(get("Version"), "1.2");
    assert_eq!(get("Array UUID"), format_uuid_mdadm(&sb.set_uuid));
    assert_eq!(get("Device UUID"), format_uuid_mdadm(&sb.device_uuid));
    assert!(get("Name").starts_with(&sb.set_name), "{text}");
    assert_eq!(get("Raid Level"), c.level_name);
    assert_eq!(get("Raid Devices"), c.disks.to_string());
    assert_eq!(get("Data Offset"), format!("{} sectors", sb.data_offset));
    assert_eq!(get("Super Offset"), "8 sectors");
    if let Some(kib) = c.array_kib {
        assert!(
            get("Array Size").starts_with(&format!("{kib} KiB")),
            "{text}"
        );
    }
    let csum = get("Checksum");
    assert_eq!(
        csum,
        format!(
            "{:x} - correct",
            u32::from_le_bytes(
                sb.encode()[CSUM_OFFSET..CSUM_OFFSET + 4]
                    .try_into()
                    .unwrap()
            )
        )
    );
    assert_eq!(get("Events"), "7");
    assert_eq!(get("Device Role"), format!("Active device {}", c.role));
    assert_eq!(get("State"), "clean");
    if let Some(l) = c.layout_name {
        assert_eq!(get("Layout"), l);
    }
    if c.chunk_kib > 0 && c.level != -1 {
        assert_eq!(get("Chunk Size"), format!("{}K", c.chunk_kib));
    }
    assert_eq!(
        get("Bad Block Log"),
        format!(
            "512 entries available at offset {} sectors",
            sb.bblog_offset
        )
    );
    let active = "A".repeat(c.disks as usize);
    assert!(get("Array State").starts_with(&active), "{text}");
}

#[test]
fn mdadm_examine_accepts_our_superblocks() {
    let Some(mdadm) = common::require_tool("mdadm") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    // 64 MiB devices: data_offset 4096 (2048 for RAID1), data_size 126976 / 129024.
    let cases = [
        Case {
            level: 5,
            layout: 2,
            chunk_kib: 512,
            disks: 4,
            role: 2,
            level_name: "raid5",
            layout_name: Some("left-symmetric"),
            array_kib: Some(3 * 126_976 / 2),
        },
        Case {
            level: 1,
            layout: 0,
            chunk_kib: 0,
            disks: 2,
            role: 1,
            level_name: "raid1",
            layout_name: None,
            array_kib: Some(129_024 / 2),
        },
        Case {
            level: 6,
            layout: 2,
            chunk_kib: 512,
            disks: 5,
            role: 4,
            level_name: "raid6",
            layout_name: Some("left-symmetric"),
            array_kib: Some(3 * 126_976 / 2),
        },
        Case {
            level: 10,
            layout: 0x102,
            chunk_kib: 512,
            disks: 4,
            role: 3,
            level_name: "raid10",
            layout_name: Some("near=2"),
            array_kib: Some(2 * 126_976 / 2),
        },
        Case {
            level: 0,
            layout: 1,
            chunk_kib: 512,
            disks: 3,
            role: 0,
            level_name: "raid0",
            layout_name: Some("original"),
            array_kib: None,
        },
        Case {
            level: -1,
            layout: 0,
            chunk_kib: 0,
            disks: 2,
            role: 1,
            level_name: "linear",
            layout_name: None,
            array_kib: None,
        },
    ];
    for c in &cases {
        check_case(&mdadm, dir.path(), c);
    }
}

#[test]
fn mdadm_examine_reports_bad_checksum() {
    let Some(mdadm) = common::require_tool("mdadm") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let c = Case {
        level: 5,
        layout: 2,
        chunk_kib: 512,
        disks: 4,
        role: 2,
        level_name: "raid5",
        layout_name: None,
        array_kib: None,
    };
    let sb = build(&c, 7);
    let mut block = sb.encode();
    let good = u32::from_le_bytes(block[CSUM_OFFSET..CSUM_OFFSET + 4].try_into().unwrap());
    let bad = good ^ 0x0100_0001;
    block[CSUM_OFFSET..CSUM_OFFSET + 4].copy_from_slice(&bad.to_le_bytes());
    assert!(Superblock::decode(&block).is_err());
    let img = dir.path().join("bad.img");
    write_image(&img, &block);
    let (_, text) = examine(&mdadm, &img);
    println!("{text}");
    let csum = field(&text, "Checksum").unwrap_or_else(|| panic!("no Checksum in:\n{text}"));
    assert_eq!(csum, format!("{bad:x} - expected {good:x}"));

    // And an all-zero device has no superblock at all.
    let img = dir.path().join("zero.img");
    write_image(&img, &[0u8; SB_BYTES]);
    let (ok, text) = examine(&mdadm, &img);
    assert!(!ok);
    assert!(text.contains("No md superblock detected"), "{text}");
}

#[test]
fn mdadm_examine_spare_dirty_and_bitmap_quirk() {
    let Some(mdadm) = common::require_tool("mdadm") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let c = Case {
        level: 5,
        layout: 2,
        chunk_kib: 512,
        disks: 4,
        role: 2,
        level_name: "raid5",
        layout_name: None,
        array_kib: None,
    };
    // The spare slot (dev_number 4), array dirty (resync_offset 0).
    let mut sb = build(&c, 9);
    sb.dev_number = 4;
    sb.resync_offset = 0;
    let img = dir.path().join("spare.img");
    write_image(&img, &sb.encode());
    let (ok, text) = examine(&mdadm, &img);
    assert!(ok, "{text}");
    assert_eq!(field(&text, "Device Role"), Some("spare"), "{text}");
    assert_eq!(field(&text, "State"), Some("active"), "{text}");
    assert_eq!(field(&text, "Events"), Some("9"), "{text}");
    assert!(field(&text, "Checksum").unwrap().ends_with("- correct"));

    // Observed mdadm behaviour worth knowing: with BITMAP_OFFSET set but no valid bitmap
    // superblock at +8 sectors, mdadm clears the feature bit in memory before printing, so
    // it shows "Feature Map : 0x0" and a checksum "expected" one less than ours.
    let mut sb = build(&c, 7);
    sb.feature_map |= format::feature::BITMAP_OFFSET;
    sb.bitmap_offset = 8;
    let block = sb.encode();
    let ours = u32::from_le_bytes(block[CSUM_OFFSET..CSUM_OFFSET + 4].try_into().unwrap());
    let img = dir.path().join("nobitmap.img");
    write_image(&img, &block);
    let (_, text) = examine(&mdadm, &img);
    let csum = field(&text, "Checksum").unwrap_or_else(|| panic!("{text}"));
    assert!(csum.starts_with(&format!("{ours:x} - ")), "{text}");
}
