//! Which level/layout/member-count combinations a test that covers "every geometry" runs.

use layout::Level;

/// Every level/layout combination the engine supports, with a member count for it.
pub fn all_geometries() -> Vec<(Level, Option<u32>, usize)> {
    let mut v = vec![
        (Level::Linear, None, 3),
        (Level::Raid0, None, 3),
        (Level::Raid1, None, 3),
        (Level::Raid4, None, 4),
    ];
    for l in 0..=5 {
        v.push((Level::Raid5, Some(l), 4));
    }
    v.push((Level::Raid5, Some(2), 2));
    for l in [0, 1, 2, 3, 4, 5, 16, 17, 18, 19, 20] {
        v.push((Level::Raid6, Some(l), 5));
    }
    v.push((Level::Raid6, Some(2), 4));
    for l in [0x102, 0x201, 0x10201, 0x103] {
        v.push((Level::Raid10, Some(l), 4));
    }
    v.push((Level::Raid10, Some(0x102), 3));
    v
}
