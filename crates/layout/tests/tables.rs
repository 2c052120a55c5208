//! Worked examples of md-format.md and exhaustive small-geometry comparisons
//! between the crate and the independent grid model in `testkit::md_model`.

use layout::*;
use testkit::md_model::{self, parity_row, raid0_model, raid10_model, render, syndromes, Cell};

fn geo(level: Level, layout: u32, n: usize, chunk: u64, size: u64) -> Geometry {
    Geometry::new(GeometrySpec {
        level,
        layout,
        chunk_sectors: chunk,
        raid_disks: n,
        component_sectors: size,
        device_sectors: vec![],
    })
    .unwrap()
}

fn sized(level: Level, layout: u32, chunk: u64, devs: &[u64]) -> Result<Geometry, LayoutError> {
    Geometry::new(GeometrySpec {
        level,
        layout,
        chunk_sectors: chunk,
        raid_disks: devs.len(),
        component_sectors: 0,
        device_sectors: devs.to_vec(),
    })
}

/// Render a stripe using only the crate's API.
fn crate_row(g: &Geometry, stripe: u64) -> Vec<Cell> {
    let roles = g.stripe_roles(stripe);
    let k = g.data_disks() as u64;
    (0..g.raid_disks())
        .map(|dev| match roles.role_of(dev) {
            ChunkRole::Data(d) => Cell::D(stripe * k + d as u64),
            ChunkRole::P => Cell::P,
            ChunkRole::Q => Cell::Q,
        })
        .collect()
}

const RAID5_4DISK: [(u32, [&str; 4]); 6] = [
    (
        0,
        ["D0 D1 D2 P", "D3 D4 P D5", "D6 P D7 D8", "P D9 D10 D11"],
    ),
    (
        1,
        ["P D0 D1 D2", "D3 P D4 D5", "D6 D7 P D8", "D9 D10 D11 P"],
    ),
    (
        2,
        ["D0 D1 D2 P", "D4 D5 P D3", "D8 P D6 D7", "P D9 D10 D11"],
    ),
    (
        3,
        ["P D0 D1 D2", "D5 P D3 D4", "D7 D8 P D6", "D9 D10 D11 P"],
    ),
    (
        4,
        ["P D0 D1 D2", "P D3 D4 D5", "P D6 D7 D8", "P D9 D10 D11"],
    ),
    (
        5,
        ["D0 D1 D2 P", "D3 D4 D5 P", "D6 D7 D8 P", "D9 D10 D11 P"],
    ),
];

#[test]
fn raid5_four_disk_tables_of_section_2_3() {
    for (layout, rows) in RAID5_4DISK {
        let g = geo(Level::Raid5, layout, 4, 128, 128 * 10);
        for (s, want) in rows.iter().enumerate() {
            assert_eq!(render(&crate_row(&g, s as u64)), *want, "layout {layout}");
            assert_eq!(render(&parity_row(5, layout, 4, s as u64)), *want);
        }
    }
    // Extra rows printed in the document.
    let la = geo(Level::Raid5, 0, 4, 128, 1280);
    assert_eq!(render(&crate_row(&la, 4)), "D12 D13 D14 P");
    let ls = geo(Level::Raid5, 2, 4, 128, 1280);
    assert_eq!(render(&crate_row(&ls, 4)), "D12 D13 D14 P");
    let ra = geo(Level::Raid5, 1, 4, 128, 1280);
    assert_eq!(render(&crate_row(&ra, 4)), "P D12 D13 D14");
}

#[test]
fn raid4_is_parity_last_whatever_the_layout_field() {
    for layout in [0, 2, 5] {
        let g = geo(Level::Raid4, layout, 4, 128, 1280);
        for (s, want) in RAID5_4DISK[5].1.iter().enumerate() {
            assert_eq!(render(&crate_row(&g, s as u64)), *want);
        }
    }
}

#[test]
fn address_example_of_section_2_3() {
    let g = geo(Level::Raid5, 2, 4, 128, 128 * 100);
    let sector = 1_000_000 / SECTOR_BYTES;
    assert_eq!((sector, 1_000_000 % SECTOR_BYTES), (1953, 64));
    let pos = g.locate(sector);
    assert_eq!(
        pos,
        StripePos {
            stripe: 5,
            data_index: 0,
            offset_sectors: 33
        }
    );
    let roles = g.stripe_roles(pos.stripe);
    assert_eq!(roles.data_dev(pos.data_index), 3);
    assert_eq!(roles.p_dev(), 2);
    assert_eq!(roles.q_dev(), None);
    assert_eq!(g.stripe_dev_sector(pos.stripe, pos.offset_sectors), 673);
    assert_eq!(g.array_sector_of(5, 0, 33), sector);
}

#[test]
fn raid6_five_disk_left_symmetric_table_of_section_3_2() {
    let want = [
        "Q D0 D1 D2 P",
        "D3 D4 D5 P Q",
        "D7 D8 P Q D6",
        "D11 P Q D9 D10",
        "P Q D12 D13 D14",
    ];
    let g = geo(Level::Raid6, 2, 5, 8, 8 * 10);
    for (s, w) in want.iter().enumerate() {
        assert_eq!(render(&crate_row(&g, s as u64)), *w);
        assert_eq!(render(&parity_row(6, 2, 5, s as u64)), *w);
    }
}

fn syndrome_of_chunk(g: &Geometry, stripe: u64, chunk: u64) -> usize {
    let k = g.data_disks() as u64;
    g.stripe_roles(stripe)
        .syndrome((chunk - stripe * k) as usize)
}

#[test]
fn raid6_syndrome_order_examples_of_section_3_3() {
    // left- and right-asymmetric, 5 disks, stripe 2: "D6 D7 P Q D8".
    for layout in [0, 1] {
        let g = geo(Level::Raid6, layout, 5, 8, 80);
        assert_eq!(render(&crate_row(&g, 2)), "D6 D7 P Q D8");
        assert_eq!(syndrome_of_chunk(&g, 2, 8), 0);
        assert_eq!(syndrome_of_chunk(&g, 2, 6), 1);
        assert_eq!(syndrome_of_chunk(&g, 2, 7), 2);
        let r = g.stripe_roles(2);
        assert_eq!(
            (r.syndrome_dev(0), r.syndrome_dev(1), r.syndrome_dev(2)),
            (4, 0, 1)
        );
    }
    // left-symmetric-6, stripe 1: "D4 D5 P D3 Q".
    let g = geo(Level::Raid6, 18, 5, 8, 80);
    assert_eq!(render(&crate_row(&g, 1)), "D4 D5 P D3 Q");
    assert_eq!(render(&parity_row(6, 18, 5, 1)), "D4 D5 P D3 Q");
    assert_eq!(syndrome_of_chunk(&g, 1, 4), 0);
    assert_eq!(syndrome_of_chunk(&g, 1, 5), 1);
    assert_eq!(syndrome_of_chunk(&g, 1, 3), 2);
    // symmetric layouts: syndrome = data index everywhere.
    let ls = geo(Level::Raid6, 2, 7, 8, 800);
    for s in 0..20 {
        let r = ls.stripe_roles(s);
        assert!((0..5).all(|d| r.syndrome(d) == d));
    }
}

/// Grid of array chunk numbers (`None` = unused) per device row, from the crate.
fn raid10_grid(g: &Geometry, rows: u64) -> Vec<Vec<Option<u64>>> {
    let c = g.chunk_sectors();
    (0..rows)
        .map(|row| {
            (0..g.raid_disks())
                .map(|d| g.reverse_copy(d, row * c).map(|s| s / c))
                .collect()
        })
        .collect()
}

fn grid(rows: &[&[u64]]) -> Vec<Vec<Option<u64>>> {
    rows.iter()
        .map(|r| r.iter().map(|&x| Some(x)).collect())
        .collect()
}

#[test]
fn raid10_tables_of_section_4_2() {
    let n2_4 = geo(Level::Raid10, 0x102, 4, 8, 8 * 3);
    assert_eq!(
        raid10_grid(&n2_4, 3),
        grid(&[&[0, 0, 1, 1], &[2, 2, 3, 3], &[4, 4, 5, 5]])
    );
    let n2_3 = geo(Level::Raid10, 0x102, 3, 8, 8 * 4);
    assert_eq!(
        raid10_grid(&n2_3, 4),
        grid(&[&[0, 0, 1], &[1, 2, 2], &[3, 3, 4], &[4, 5, 5]])
    );
    let f2_4 = geo(Level::Raid10, 0x201, 4, 8, 8 * 8);
    assert_eq!(
        raid10_grid(&f2_4, 8),
        grid(&[
            &[0, 1, 2, 3],
            &[4, 5, 6, 7],
            &[8, 9, 10, 11],
            &[12, 13, 14, 15],
            &[3, 0, 1, 2],
            &[7, 4, 5, 6],
            &[11, 8, 9, 10],
            &[15, 12, 13, 14],
        ])
    );
    let o2_4 = geo(Level::Raid10, 0x10201, 4, 8, 8 * 4);
    assert_eq!(
        raid10_grid(&o2_4, 4),
        grid(&[&[0, 1, 2, 3], &[3, 0, 1, 2], &[4, 5, 6, 7], &[7, 4, 5, 6]])
    );
    // Copy order: copy 0 is md's first copy.
    let c = n2_3.map_copies(8 + 3);
    let got: Vec<Loc> = c.iter().collect();
    assert_eq!(
        got,
        [
            Loc {
                dev: 2,
                dev_sector: 3
            },
            Loc {
                dev: 0,
                dev_sector: 8 + 3
            }
        ]
    );
}

#[test]
fn raid10_survives_checks_copy_sets() {
    let g = geo(Level::Raid10, 0x102, 4, 8, 800);
    assert!(g.survives(&[true, false, true, false]));
    assert!(!g.survives(&[true, true, false, false]));
    let g3 = geo(Level::Raid10, 0x102, 3, 8, 800);
    assert!(!g3.survives(&[true, false, true]));
    let f2 = geo(Level::Raid10, 0x201, 4, 8, 800);
    assert!(f2.survives(&[true, false, true, false]));
    assert!(!f2.survives(&[true, true, false, false]));
    assert_eq!(f2.max_degraded(), 1);
}

#[test]
fn raid0_example_of_section_4_3() {
    let c = 8;
    let sizes = [3 * c, 5 * c + 7, 5 * c];
    let orig = sized(Level::Raid0, 1, c, &sizes).unwrap();
    let alt = sized(Level::Raid0, 2, c, &sizes).unwrap();
    assert_eq!(orig.array_sectors(), 13 * c);
    assert_eq!(orig.map_first(9 * c).dev, 2);
    assert_eq!(alt.map_first(9 * c).dev, 1);
    assert_eq!(orig.map_first(9 * c).dev_sector, 3 * c);
    assert_eq!(raid0_model(&[3, 5, 5], true)[9], (2, 3));
    assert_eq!(raid0_model(&[3, 5, 5], false)[9], (1, 3));
    // Multi-zone arrays need an explicit layout; single-zone accept 0.
    assert!(matches!(
        sized(Level::Raid0, 0, c, &sizes),
        Err(LayoutError::BadLayout { .. })
    ));
    assert!(sized(Level::Raid0, 0, c, &[16, 16]).is_ok());
}

#[test]
fn exhaustive_parity_against_model() {
    let cases = (2..=8usize)
        .flat_map(|n| {
            [(4, 0u32, n)]
                .into_iter()
                .chain((0..=5).map(move |l| (5, l, n)))
        })
        .chain((4..=9usize).flat_map(|n| {
            [0u32, 1, 2, 3, 4, 5, 16, 17, 18, 19, 20]
                .into_iter()
                .map(move |l| (6, l, n))
        }));
    for (level, layout, n) in cases {
        let lvl = Level::from_md(level as i32).unwrap();
        let g = geo(lvl, layout, n, 8, 8 * (3 * n as u64 + 2));
        for s in 0..g.stripes() {
            let model = parity_row(level, layout, n, s);
            assert_eq!(crate_row(&g, s), model, "{lvl} layout {layout} n {n} s {s}");
            if level == 6 {
                let r = g.stripe_roles(s);
                for (dev, syndrome) in syndromes(&model).into_iter().enumerate() {
                    if let ChunkRole::Data(d) = r.role_of(dev) {
                        assert_eq!(
                            Some(r.syndrome(d)),
                            syndrome,
                            "{layout} n {n} s {s} dev {dev}"
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn exhaustive_raid10_against_model() {
    let c = 8u64;
    let mut checked = 0;
    for n in 2..=8usize {
        for nc in 1..=n {
            for fc in 1..=n / nc {
                for offset in [false, true] {
                    if nc * fc < 2 || (offset && fc == 1) {
                        continue;
                    }
                    if offset && nc > 1 && fc > 1 && n % nc != 0 {
                        continue; // refused as unsupported, checked below
                    }
                    let layout =
                        (if offset { 0x1_0000 } else { 0 }) | ((fc as u32) << 8) | nc as u32;
                    for size_chunks in 1..=12u64 {
                        check_raid10(n, nc, fc, offset, layout, size_chunks, c);
                        checked += 1;
                    }
                }
            }
        }
    }
    assert!(checked > 1000, "{checked}");
    let bad = Geometry::new(GeometrySpec {
        level: Level::Raid10,
        layout: 0x1_0202,
        chunk_sectors: 8,
        raid_disks: 5,
        component_sectors: 800,
        device_sectors: vec![],
    });
    assert!(matches!(bad, Err(LayoutError::Unsupported(_))));
}

fn check_raid10(
    n: usize,
    nc: usize,
    fc: usize,
    offset: bool,
    layout: u32,
    size_chunks: u64,
    c: u64,
) {
    let model = raid10_model(n, nc, fc, offset, size_chunks);
    let spec = GeometrySpec {
        level: Level::Raid10,
        layout,
        chunk_sectors: c,
        raid_disks: n,
        component_sectors: size_chunks * c + 3,
        device_sectors: vec![],
    };
    let Ok(g) = Geometry::new(spec) else {
        assert_eq!(
            model.array_chunks, 0,
            "n {n} layout {layout:#x} size {size_chunks}"
        );
        return;
    };
    assert_eq!(g.array_sectors(), model.array_chunks * c);
    for (chunk, want) in model.copies.iter().enumerate() {
        for off in [0, c - 1] {
            let got: Vec<(usize, u64)> = g
                .map_copies(chunk as u64 * c + off)
                .iter()
                .map(|l| (l.dev, l.dev_sector / c))
                .collect();
            assert_eq!(
                &got, want,
                "n {n} layout {layout:#x} size {size_chunks} chunk {chunk}"
            );
        }
    }
}

#[test]
fn exhaustive_raid0_against_model() {
    let c = 8u64;
    let mut sizes = vec![];
    for n in 1..=4usize {
        for code in 0..5u64.pow(n as u32) {
            sizes.clear();
            let mut x = code;
            for _ in 0..n {
                sizes.push(x % 5 + 1);
                x /= 5;
            }
            let secs: Vec<u64> = sizes.iter().map(|s| s * c + (s % 3)).collect();
            for (layout, original) in [(1, true), (2, false)] {
                let g = sized(Level::Raid0, layout, c, &secs).unwrap();
                let model = raid0_model(&sizes, original);
                assert_eq!(g.array_sectors(), model.len() as u64 * c);
                for (chunk, &(dev, row)) in model.iter().enumerate() {
                    let l = g.map_first(chunk as u64 * c + 5);
                    assert_eq!(
                        (l.dev, l.dev_sector),
                        (dev, row * c + 5),
                        "{sizes:?} {layout}"
                    );
                    assert_eq!(g.reverse_copy(dev, row * c + 5), Some(chunk as u64 * c + 5));
                }
            }
        }
    }
}

#[test]
fn linear_against_model() {
    let sizes = [37u64, 16, 9, 64];
    for rounding in [0u64, 8, 3] {
        let g = sized(Level::Linear, 0, rounding, &sizes).unwrap();
        let model = md_model::linear_model(&sizes, rounding);
        assert_eq!(g.array_sectors(), model.len() as u64);
        for (r, &(dev, s)) in model.iter().enumerate() {
            let c = g.map_copies(r as u64);
            assert_eq!((c.len(), c.get(0)), (1, Loc { dev, dev_sector: s }));
            assert_eq!(g.reverse_copy(dev, s), Some(r as u64));
        }
    }
    assert!(sized(Level::Linear, 0, 16, &[40, 8]).is_err());
}

#[test]
fn array_sizes_and_validation() {
    assert_eq!(geo(Level::Raid5, 2, 4, 128, 1000).array_sectors(), 3 * 896);
    assert_eq!(geo(Level::Raid6, 2, 6, 8, 100).array_sectors(), 4 * 96);
    assert_eq!(geo(Level::Raid1, 0, 3, 0, 1000).array_sectors(), 1000);
    // raid10 n2 on 3 disks, size 5 chunks: ((5/1)*3)/2 = 7 chunks.
    assert_eq!(geo(Level::Raid10, 0x102, 3, 8, 40).array_sectors(), 56);
    // f2 on 3 disks, size 5 chunks: ((5/2)*3)/1 = 6 chunks.
    assert_eq!(geo(Level::Raid10, 0x201, 3, 8, 40).array_sectors(), 48);
    let spec = |level, layout, n, chunk| GeometrySpec {
        level,
        layout,
        chunk_sectors: chunk,
        raid_disks: n,
        component_sectors: 4096,
        device_sectors: vec![],
    };
    let err = |s| Geometry::new(s).unwrap_err();
    assert!(matches!(
        err(spec(Level::Raid5, 2, 4, 12)),
        LayoutError::BadChunk { .. }
    ));
    assert!(matches!(
        err(spec(Level::Raid5, 2, 4, 4)),
        LayoutError::BadChunk { .. }
    ));
    assert!(matches!(
        err(spec(Level::Raid6, 2, 3, 8)),
        LayoutError::TooFewDisks { .. }
    ));
    // md's limit: the 1,920 role slots of a v1.2 superblock; RAID6 stops at 257 devices.
    assert!(matches!(
        err(spec(Level::Raid5, 2, 1921, 8)),
        LayoutError::TooManyDisks { .. }
    ));
    assert!(Geometry::new(spec(Level::Raid5, 2, 1920, 8)).is_ok());
    assert!(matches!(
        err(spec(Level::Raid6, 2, 258, 8)),
        LayoutError::TooManyForRaid6 { .. }
    ));
    assert!(Geometry::new(spec(Level::Raid6, 2, 257, 8)).is_ok());
    assert!(matches!(
        err(spec(Level::Raid5, 6, 4, 8)),
        LayoutError::BadLayout { .. }
    ));
    assert!(matches!(
        err(spec(Level::Raid6, 9, 4, 8)),
        LayoutError::Unsupported(_)
    ));
    assert!(matches!(
        err(spec(Level::Raid10, 0x103, 2, 8)),
        LayoutError::BadLayout { .. }
    ));
    assert!(matches!(
        err(spec(Level::Raid10, 0x8_0102, 4, 8)),
        LayoutError::BadLayout { .. }
    ));
    assert!(matches!(
        err(spec(Level::Raid10, 0x101, 4, 8)),
        LayoutError::BadLayout { .. }
    ));
    assert!(matches!(
        err(spec(Level::Raid10, 0x4_0102, 4, 8)),
        LayoutError::Unsupported(_)
    ));
    assert!(matches!(
        err(spec(Level::Raid0, 1, 2, 8)),
        LayoutError::DeviceCount { .. }
    ));
    assert_eq!(geo(Level::Raid6, 2, 4, 8, 80).max_degraded(), 2);
    assert!(geo(Level::Raid6, 2, 4, 8, 80).survives(&[true, false, true, false]));
    assert!(!geo(Level::Raid5, 2, 4, 8, 80).survives(&[true, false, true, false]));
    assert!(geo(Level::Raid1, 0, 3, 0, 80).survives(&[true, false, true]));
}
