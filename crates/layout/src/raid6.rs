//! RAID6 syndrome index order.
//!
//! Theory (md-format.md §3.3): Q = ⊕ g^i·D_i where `i` is the data chunk's
//! *syndrome index*, not its logical data index. md numbers the data devices
//! by walking device indices upward (cyclically) starting at the device
//! right after Q — device 0 when Q is the last device — skipping P and Q.
//!
//! * left/right-symmetric, parity-first/last: the walk meets data in logical
//!   order, so syndrome = data index.
//! * left/right-asymmetric: differs when data sits both before P and after Q
//!   (5 disks "D0 D1 P Q D2": D2→0, D0→1, D1→2).
//! * `-6` layouts (Q last): walk starts at device 0, so syndromes follow device
//!   index ("D4 D5 P D3 Q": D4→0, D5→1, D3→2).
//!
//! Trap: computing Q by data index silently produces a Q that md (and
//! raid6check) consider wrong for the asymmetric and `-6` layouts.

/// Fill `syndrome[data_index]` from the device role table (`role[dev]` is the
/// data index, or a value `>= 0xFFFE` for P/Q) by md's walk starting after Q.
pub(crate) fn assign_syndromes(disks: usize, q: usize, role: &[u16], syndrome: &mut [u16]) {
    let mut next = 0u16;
    for i in 1..=disks {
        let dev = (q + i) % disks;
        let r = role[dev];
        if r < 0xFFFE {
            syndrome[r as usize] = next;
            next += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn asymmetric_example() {
        // "D0 D1 P Q D2"
        let role = [0u16, 1, 0xFFFE, 0xFFFF, 2];
        let mut syndrome = [0u16; 3];
        assign_syndromes(5, 3, &role, &mut syndrome);
        assert_eq!(syndrome, [1, 2, 0]);
    }

    #[test]
    fn q_last_example() {
        // "D4 D5 P D3 Q" = data indices 1 2 P 0 Q
        let role = [1u16, 2, 0xFFFE, 0, 0xFFFF];
        let mut syndrome = [0u16; 3];
        assign_syndromes(5, 4, &role, &mut syndrome);
        // D3 (index 0) syndrome 2, D4 (index 1) syndrome 0, D5 (index 2) syndrome 1
        assert_eq!(syndrome, [2, 0, 1]);
    }
}
