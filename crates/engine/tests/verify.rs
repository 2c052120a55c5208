//! Verify reads: redundancy damaged behind the array's back is found and rewritten exactly when a
//! verified range covers it; the data always wins; client I/O running beside verification stays
//! correct.

use device::Device;
use engine::ArrayConfig;
use layout::Level;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use simkit::{sim_array, SimArray};
use std::sync::Arc;

const MEMBER: u64 = 2 << 20;

fn redundancy_ok(sa: &SimArray) -> bool {
    simkit::redundancy_error(sa).is_none()
}

fn data_offset(sa: &SimArray, dev: usize) -> u64 {
    engine::read_superblock(sa.sims[dev].as_ref())
        .expect("superblock")
        .data_offset
        * 512
}

/// Flip a byte of the redundancy behind array byte `off`: P (parity levels) or the second copy
/// (mirrors). Returns the member touched.
fn damage_redundancy(sa: &SimArray, off: u64) -> usize {
    let g = sa.array.geometry();
    let (dev, member_off) = if g.level().is_parity() {
        let pos = g.locate(off / 512);
        let roles = g.stripe_roles(pos.stripe);
        let chunk = g.chunk_sectors() * 512;
        (roles.p_dev(), pos.stripe * chunk + off % chunk)
    } else {
        let copy = g.map_copies(off / 512).get(1);
        (copy.dev, copy.dev_sector * 512)
    };
    let at = data_offset(sa, dev) + member_off;
    let mut b = device::AlignedBuf::zeroed(512);
    sa.sims[dev].read_at(&mut b, at / 512 * 512).expect("read");
    b[(at % 512) as usize] ^= 0x5a;
    sa.sims[dev]
        .write_at(&b, at / 512 * 512, true)
        .expect("write");
    dev
}

fn redundant_geometries() -> Vec<(Level, Option<u32>, usize)> {
    simkit::all_geometries()
        .into_iter()
        .filter(|(l, _, _)| !matches!(l, Level::Linear | Level::Raid0))
        .collect()
}

#[test]
fn verify_repairs_what_its_ranges_cover_and_nothing_else() {
    testkit::for_each_seed!(
        "verify_repairs_what_its_ranges_cover_and_nothing_else",
        testkit::Seeds::sim(3),
        |seed| {
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            for (level, layout, n) in redundant_geometries() {
                let sa = sim_array(level, layout, n, 16 << 10, MEMBER, seed);
                let size = sa.array.size_bytes();
                let data: Vec<u8> = (0..size).map(|_| rng.gen()).collect();
                sa.array.write(0, &data, false).expect("fill");
                sa.array.flush().expect("flush");
                assert!(
                    redundancy_ok(&sa),
                    "{level:?} {layout:?}: clean before damage"
                );

                let off = rng.gen_range(0..size / 512) * 512;
                damage_redundancy(&sa, off);
                assert!(!redundancy_ok(&sa), "canary: the damage shows");

                // A range in another stripe (half the array away) finds and repairs nothing.
                let g = sa.array.geometry();
                let row_bytes = if g.level().is_parity() {
                    g.chunk_sectors() * 512 * g.data_disks() as u64
                } else {
                    4096
                };
                let rows = size / row_bytes;
                assert!(rows >= 2, "{level:?}: the array holds two stripes");
                let far = (off / row_bytes + rows / 2) % rows * row_bytes;
                assert_ne!(far / row_bytes, off / row_bytes);
                let r = sa.array.verify(&[(far, 512)]).expect("verify elsewhere");
                assert_eq!(
                    r.mismatch_sectors, 0,
                    "{level:?}: found damage it did not cover"
                );
                assert!(
                    !redundancy_ok(&sa),
                    "{level:?}: repaired damage it did not cover"
                );

                let r = sa.array.verify(&[(off, 512)]).expect("verify");
                assert!(
                    r.mismatch_sectors > 0,
                    "{level:?} {layout:?}: damage not found"
                );
                assert!(r.repaired);
                assert!(redundancy_ok(&sa), "{level:?} {layout:?}: damage left");
                let page_row = if g.level().is_parity() {
                    4096 * g.data_disks() as u64
                } else {
                    4096
                };
                assert_eq!(r.bytes_verified, page_row, "one pass over the page row");

                // The data won: what clients read is what they wrote.
                let mut back = vec![0u8; size as usize];
                sa.array.read(0, &mut back).expect("read");
                assert!(back == data, "{level:?} {layout:?}: data changed");
                let r = sa.array.verify(&[(0, size)]).expect("verify all");
                assert_eq!(r.mismatch_sectors, 0);
            }
        },
    );
}

#[test]
fn overlapping_ranges_read_each_stripe_once() {
    let sa = sim_array(Level::Raid5, Some(2), 4, 16 << 10, MEMBER, 1);
    let row = 3 * (16 << 10);
    let r = sa
        .array
        .verify(&[(0, 512), (1024, 4096), (row - 512, 1024), (5 * row, row)])
        .expect("verify");
    assert_eq!(r.ranges, 4);
    // Page rows (member bytes, 16 KiB chunks): 0..8K (the first two ranges), 12K..16K and
    // 16K..20K (the third straddles rows 0 and 1), all of row 5 (80K..96K); each holds 3 data
    // pages per member page.
    assert_eq!(r.bytes_verified, 3 * (32 << 10));
}

#[test]
fn a_read_only_array_reports_without_repairing() {
    let config = ArrayConfig {
        read_only: true,
        ..simkit::config()
    };
    let sa = sim_array(Level::Raid6, Some(2), 5, 16 << 10, MEMBER, 2);
    drop(sa.array);
    let sims = sa.sims.clone();
    let sa = SimArray {
        array: engine::assemble(
            simkit::devs(&sims),
            engine::AssembleOptions {
                config: config.clone(),
                ..Default::default()
            },
        )
        .expect("assemble read-only"),
        sims,
        level: Level::Raid6,
        layout: Some(2),
    };
    damage_redundancy(&sa, 8192);
    let r = sa.array.verify(&[(0, 16 << 10)]).expect("verify");
    assert!(r.mismatch_sectors > 0 && !r.repaired);
    assert!(!redundancy_ok(&sa), "a read-only array wrote");
}

#[test]
fn bad_requests_get_clear_errors() {
    let sa = sim_array(Level::Raid0, None, 3, 16 << 10, MEMBER, 3);
    let e = sa.array.verify(&[(0, 4096)]).unwrap_err().to_string();
    assert!(e.contains("no redundancy"), "{e}");
    let sa = sim_array(Level::Raid5, None, 3, 16 << 10, MEMBER, 3);
    let size = sa.array.size_bytes();
    for (off, len) in [(size, 512), (size - 512, 1024), (100, 512), (0, 100)] {
        let e = sa.array.verify(&[(0, 512), (off, len)]).unwrap_err();
        assert!(
            e.to_string().contains("invalid request"),
            "{off}+{len}: {e}"
        );
    }
    sa.array.fail_member("sim1").expect("fail");
    let e = sa.array.verify(&[(0, 512)]).unwrap_err().to_string();
    assert!(e.contains("degraded"), "{e}");
}

/// Writers and a verifier on the same stripes: every byte reads back as last written and
/// redundancy agrees at the end (the verifier's rewrite never carries stale data over a write).
#[test]
fn verify_beside_client_writes_keeps_data_and_redundancy() {
    testkit::for_each_seed!(
        "verify_beside_client_writes_keeps_data_and_redundancy",
        testkit::Seeds::sim(4),
        |seed| {
            for (level, layout, n) in [
                (Level::Raid5, Some(2), 4),
                (Level::Raid6, Some(2), 5),
                (Level::Raid1, None, 2),
                (Level::Raid10, Some(0x102), 4),
            ] {
                let sa = Arc::new(sim_array(level, layout, n, 16 << 10, MEMBER, seed));
                let size = sa.array.size_bytes();
                // Each writer owns interleaved 2 KiB pieces, so writers share every stripe.
                let writers: Vec<_> = (0..2u64)
                    .map(|w| {
                        let sa = sa.clone();
                        std::thread::spawn(move || {
                            let mut rng = ChaCha8Rng::seed_from_u64(seed ^ w << 40);
                            let mut model = vec![0u8; size as usize];
                            for _ in 0..300 {
                                let piece = rng.gen_range(0..size / 4096) * 4096 + w * 2048;
                                let buf: Vec<u8> = (0..2048).map(|_| rng.gen()).collect();
                                sa.array.write(piece, &buf, false).expect("write");
                                model[piece as usize..piece as usize + 2048].copy_from_slice(&buf);
                            }
                            model
                        })
                    })
                    .collect();
                let mut rng = ChaCha8Rng::seed_from_u64(seed);
                let mut found = 0;
                while writers.iter().any(|w| !w.is_finished()) {
                    let off = rng.gen_range(0..size / 512) * 512;
                    let len = rng.gen_range(1..=256u64).min((size - off) / 512) * 512;
                    found += sa
                        .array
                        .verify(&[(off, len)])
                        .expect("verify")
                        .mismatch_sectors;
                }
                let models: Vec<Vec<u8>> = writers
                    .into_iter()
                    .map(|w| w.join().expect("writer"))
                    .collect();
                assert_eq!(
                    found, 0,
                    "{level:?}: verify saw redundancy disagree under clean writes"
                );
                let mut back = vec![0u8; size as usize];
                sa.array.read(0, &mut back).expect("read");
                for (i, chunk) in back.chunks(2048).enumerate() {
                    let want = &models[i % 2][i * 2048..(i + 1) * 2048];
                    assert!(chunk == want, "{level:?}: bytes at {} differ", i * 2048);
                }
                sa.array.flush().expect("flush");
                assert!(redundancy_ok(&sa), "{level:?}: redundancy disagrees");
            }
        },
    );
}

#[test]
fn with_integrity_a_verify_checks_the_records_too() {
    let sims: Vec<Arc<device::SimDevice>> = (0..4)
        .map(|i| Arc::new(device::SimDevice::new(format!("m{i}"), 4 << 20, 9 + i)))
        .collect();
    engine::create(&engine::CreateSpec {
        integrity: true,
        ..simkit::clean_spec(
            "v",
            Level::Raid5,
            None,
            16 << 10,
            simkit::devs(&sims),
            vec![],
        )
    })
    .expect("create");
    let array = engine::assemble(simkit::devs(&sims), engine::AssembleOptions::default())
        .expect("assemble");
    let data = vec![0x33u8; 48 << 10];
    array.write(0, &data, false).expect("write");
    array.flush().expect("flush");
    // Rot a data block on whichever member holds array byte 0.
    let dev = array.geometry().stripe_roles(0).data_dev(0);
    let at = engine::read_superblock(sims[dev].as_ref())
        .expect("sb")
        .data_offset
        * 512;
    sims[dev]
        .write_at(&device::AlignedBuf::zeroed(4096), at, true)
        .expect("rot");
    let r = array.verify(&[(0, 512)]).expect("verify");
    let counts = r.integrity.expect("integrity counts");
    assert_eq!(counts.data_mismatches, 1, "{counts:?}");
    assert_eq!(counts.repaired, 1, "{counts:?}");
    let mut back = vec![0u8; data.len()];
    array.read(0, &mut back).expect("read");
    assert!(back == data);
}
