//! Property tests: for random geometries of every level and layout the
//! mapping is a bijection between array sectors and (device, device sector)
//! locations, parity never collides with data, copies sit on distinct
//! devices, and the inverse functions recover the array sector.

use layout::*;
use proptest::prelude::*;
use std::collections::HashSet;

fn chunk_strategy() -> impl Strategy<Value = u64> {
    (3u32..=10).prop_map(|s| 1u64 << s)
}

fn parity_level() -> impl Strategy<Value = (Level, u32, usize)> {
    prop_oneof![
        (2usize..=16).prop_map(|n| (Level::Raid4, 0, n)),
        (0u32..=5, 2usize..=16).prop_map(|(l, n)| (Level::Raid5, l, n)),
        (
            prop::sample::select(vec![0u32, 1, 2, 3, 4, 5, 16, 17, 18, 19, 20]),
            4usize..=16
        )
            .prop_map(|(l, n)| (Level::Raid6, l, n)),
    ]
}

fn raid10_layout() -> impl Strategy<Value = (u32, usize)> {
    (2usize..=16, 1usize..=4, 1usize..=4, any::<bool>()).prop_filter_map(
        "valid copies",
        |(n, nc, fc, offset)| {
            let copies = nc * fc;
            if copies < 2 || copies > n || (offset && nc > 1 && fc > 1 && n % nc != 0) {
                return None;
            }
            let off = if offset { 0x1_0000 } else { 0 };
            Some((off | ((fc as u32) << 8) | nc as u32, n))
        },
    )
}

fn spec(
    level: Level,
    layout: u32,
    chunk: u64,
    n: usize,
    size: u64,
    devs: Vec<u64>,
) -> GeometrySpec {
    GeometrySpec {
        level,
        layout,
        chunk_sectors: chunk,
        raid_disks: n,
        component_sectors: size,
        device_sectors: devs,
    }
}

/// Check a copy-based geometry chunk by chunk (at one offset per chunk).
fn check_copies(g: &Geometry, step: u64, probe: u64) -> Result<(), TestCaseError> {
    let mut seen = HashSet::new();
    let mut r = probe % step;
    while r < g.array_sectors() {
        let c = g.map_copies(r);
        prop_assert_eq!(c.len(), g.copies());
        prop_assert!(c.run_sectors() >= 1 && r + c.run_sectors() <= g.array_sectors());
        let devs: HashSet<usize> = c.iter().map(|l| l.dev).collect();
        prop_assert_eq!(devs.len(), c.len(), "copies share a device at {}", r);
        let last = r + c.run_sectors() - 1;
        let end = g.map_copies(last);
        for (i, l) in c.iter().enumerate() {
            prop_assert!(l.dev_sector < g.used_device_sectors(l.dev));
            prop_assert!(seen.insert(l), "location {:?} used twice", l);
            prop_assert_eq!(g.reverse_copy(l.dev, l.dev_sector), Some(r));
            let e = end.get(i);
            prop_assert_eq!((e.dev, e.dev_sector), (l.dev, l.dev_sector + (last - r)));
        }
        r += step;
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 256,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn parity_levels_are_bijective(
        (level, layout, n) in parity_level(),
        chunk in chunk_strategy(),
        stripes in 1u64..=40,
        extra in 0u64..1024,
        probe in any::<u64>(),
    ) {
        let size = stripes * chunk + extra % chunk;
        let g = Geometry::new(spec(level, layout, chunk, n, size, vec![])).unwrap();
        let k = g.data_disks();
        prop_assert_eq!(k, n - level.parity_disks());
        prop_assert_eq!(g.array_sectors(), stripes * chunk * k as u64);
        prop_assert_eq!(g.max_degraded(), level.parity_disks());
        for s in 0..stripes {
            let r = g.stripe_roles(s);
            let mut devs = HashSet::new();
            let mut syndromes = HashSet::new();
            for d in 0..k {
                prop_assert!(devs.insert(r.data_dev(d)));
                prop_assert_eq!(r.role_of(r.data_dev(d)), ChunkRole::Data(d));
                prop_assert!(syndromes.insert(r.syndrome(d)));
                prop_assert_eq!(r.data_index_of_syndrome(r.syndrome(d)), d);
                if level != Level::Raid6 {
                    prop_assert_eq!(r.syndrome(d), d);
                }
                let off = probe % chunk;
                let a = g.array_sector_of(s, d, off);
                prop_assert_eq!(g.locate(a), StripePos { stripe: s, data_index: d, offset_sectors: off });
            }
            prop_assert!(devs.insert(r.p_dev()), "P collides with data");
            prop_assert_eq!(r.role_of(r.p_dev()), ChunkRole::P);
            if let Some(q) = r.q_dev() {
                prop_assert!(devs.insert(q), "Q collides");
                prop_assert_eq!(r.role_of(q), ChunkRole::Q);
            }
            prop_assert_eq!(r.q_dev().is_some(), level == Level::Raid6);
            prop_assert_eq!(devs.len(), n);
            prop_assert!(syndromes.iter().all(|&x| x < k));
        }
        let a = probe % g.array_sectors();
        let p = g.locate(a);
        prop_assert_eq!(g.array_sector_of(p.stripe, p.data_index, p.offset_sectors), a);
    }

    #[test]
    fn raid10_is_bijective(
        (layout, n) in raid10_layout(),
        chunk in chunk_strategy(),
        size_chunks in 1u64..=48,
        extra in 0u64..1024,
        probe in any::<u64>(),
    ) {
        let size = size_chunks * chunk + extra % chunk;
        let Ok(g) = Geometry::new(spec(Level::Raid10, layout, chunk, n, size, vec![])) else {
            let fc = (layout >> 8 & 0xFF) as u64;
            prop_assert!(size_chunks / fc * n as u64 / (layout & 0xFF) as u64 == 0);
            return Ok(());
        };
        check_copies(&g, chunk, probe)?;
        prop_assert_eq!(g.max_degraded(), g.copies() - 1);
        // Random device locations either hold nothing or map back.
        let dev = (probe % n as u64) as usize;
        let s = (probe >> 8) % (g.used_device_sectors(dev) + chunk);
        if let Some(a) = g.reverse_copy(dev, s) {
            let want = Loc { dev, dev_sector: s };
            let hit = g.map_copies(a).iter().any(|l| l == want);
            prop_assert!(hit);
        }
        // Any single failure is survivable; failing a whole copy set is not.
        let mut failed = vec![false; n];
        failed[dev] = true;
        prop_assert!(g.survives(&failed));
        let c = g.map_copies(probe % g.array_sectors());
        // Device twins hold every copy's bytes at the copy's own device offset.
        for l in c.iter() {
            for t in g.device_twins(l.dev) {
                let twin = Loc { dev: t, dev_sector: l.dev_sector };
                prop_assert!(c.iter().any(|m| m == twin), "twin {} of {:?}", t, l);
            }
        }
        let near_only = layout >> 8 & 0xFF == 1 && n % (layout & 0xFF) as usize == 0;
        prop_assert_eq!(g.device_twins(dev).is_empty(), !near_only);
        let mut all = vec![false; n];
        c.iter().for_each(|l| all[l.dev] = true);
        prop_assert!(!g.survives(&all));
    }

    #[test]
    fn raid1_is_mirrored(n in 1usize..=16, size in 1u64..100_000, probe in any::<u64>()) {
        let g = Geometry::new(spec(Level::Raid1, 0, 0, n, size, vec![])).unwrap();
        prop_assert_eq!(g.array_sectors(), size);
        let r = probe % size;
        let c = g.map_copies(r);
        prop_assert_eq!(c.len(), n);
        prop_assert_eq!(c.run_sectors(), size - r);
        for (i, l) in c.iter().enumerate() {
            prop_assert_eq!(l, Loc { dev: i, dev_sector: r });
            prop_assert_eq!(g.reverse_copy(i, r), Some(r));
        }
        prop_assert_eq!(g.reverse_copy(0, size), None);
        prop_assert_eq!(g.device_twins(0).len(), n - 1);
    }

    #[test]
    fn raid0_is_bijective(
        chunk in chunk_strategy(),
        sizes in prop::collection::vec((1u64..=24, 0u64..1024), 1..=16),
        alternate in any::<bool>(),
        probe in any::<u64>(),
    ) {
        let devs: Vec<u64> = sizes.iter().map(|&(c, x)| c * chunk + x % chunk).collect();
        let layout = if alternate { RAID0_ALTERNATE } else { RAID0_ORIGINAL };
        let g = Geometry::new(spec(Level::Raid0, layout, chunk, devs.len(), 0, devs)).unwrap();
        let total: u64 = sizes.iter().map(|&(c, _)| c * chunk).sum();
        prop_assert_eq!(g.array_sectors(), total);
        check_copies(&g, chunk, probe)?;
        prop_assert_eq!(g.reverse_copy(0, sizes[0].0 * chunk), None);
    }

    #[test]
    fn linear_is_bijective(
        rounding in prop_oneof![Just(0u64), chunk_strategy()],
        sizes in prop::collection::vec(2048u64..=100_000, 1..=16),
        probe in any::<u64>(),
    ) {
        let n = sizes.len();
        let g = Geometry::new(spec(Level::Linear, 0, rounding, n, 0, sizes)).unwrap();
        check_copies(&g, 997, probe)?;
        prop_assert!(!g.survives(&vec![true; n]));
    }

    #[test]
    fn layout_names_round_trip(layout in any::<u32>()) {
        for level in Level::ALL {
            if let Some(name) = layout_name(level, layout) {
                prop_assert_eq!(parse_layout(level, &name), Ok(layout));
            }
        }
    }
}
