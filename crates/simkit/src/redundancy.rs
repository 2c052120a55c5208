//! Whether redundancy agrees with the data, read straight from the member images with the
//! engine's own geometry and the `parity` crate (the independent check is `testkit::oracle`).

use crate::array::SimArray;
use device::SimDevice;
use layout::{Geometry, Level};
use std::sync::Arc;

/// Check, straight from the member images, that every stripe's parity matches its data (parity
/// levels) or that every copy agrees (mirrors).
pub fn check_redundancy(sa: &SimArray) {
    if let Some(e) = redundancy_error(sa) {
        panic!("{e}");
    }
}

/// The first place where redundancy disagrees with the data, read from the member images.
pub fn redundancy_error(sa: &SimArray) -> Option<String> {
    redundancy_error_in(&sa.sims, sa.array.geometry())
}

/// [`redundancy_error`] of members `sims` (`sims[i]` in role `i`) laid out as `g`, with no
/// array assembled over them (a cluster's nodes may be writing them).
pub fn redundancy_error_in(sims: &[Arc<SimDevice>], g: &Geometry) -> Option<String> {
    let images: Vec<Vec<u8>> = sims.iter().map(|s| s.contents()).collect();
    let offsets: Vec<usize> = sims
        .iter()
        .map(|s| engine::read_superblock(s.as_ref()).expect("sb").data_offset as usize * 512)
        .collect();
    match g.level() {
        Level::Raid4 | Level::Raid5 | Level::Raid6 => {
            let chunk = g.chunk_sectors() as usize * 512;
            let stripes = g.array_sectors() / g.chunk_sectors() / g.data_disks() as u64;
            for s in 0..stripes {
                let roles = g.stripe_roles(s);
                let at = |dev: usize| &images[dev][offsets[dev] + s as usize * chunk..][..chunk];
                let mut by_syndrome: Vec<&[u8]> = vec![&[]; g.data_disks()];
                for d in 0..g.data_disks() {
                    by_syndrome[roles.syndrome(d)] = at(roles.data_dev(d));
                }
                let mut p = vec![0u8; chunk];
                let mut q = vec![0u8; chunk];
                parity::pq_gen(&by_syndrome, &mut p, &mut q);
                if p != at(roles.p_dev()) {
                    return Some(format!("stripe {s}: P does not match data"));
                }
                if roles.q_dev().is_some_and(|qd| q != at(qd)) {
                    return Some(format!("stripe {s}: Q does not match data"));
                }
            }
        }
        Level::Raid1 | Level::Raid10 => {
            let mut sector = 0;
            while sector < g.array_sectors() {
                let c = g.map_copies(sector);
                let len = (c.run_sectors() as usize * 512).min(1 << 20);
                let first = c.get(0);
                let a = &images[first.dev][offsets[first.dev] + first.dev_sector as usize * 512..]
                    [..len];
                for copy in c.iter() {
                    let b = &images[copy.dev][offsets[copy.dev] + copy.dev_sector as usize * 512..]
                        [..len];
                    if a != b {
                        return Some(format!("array sector {sector}: copies differ"));
                    }
                }
                sector += len as u64 / 512;
            }
        }
        Level::Linear | Level::Raid0 => {}
    }
    None
}
