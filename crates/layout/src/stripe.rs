//! Per-stripe role tables for the parity levels.
//!
//! Theory: for RAID4/5/6 every stripe has the same shape — `k` data chunks,
//! P, and (RAID6) Q, all at the same device sector `stripe·C + offset`
//! (md-format.md §2.1). `StripeRoles` is the fully resolved table for one
//! stripe: device of each logical data index, role of each device, and the
//! RAID6 syndrome index of each data chunk (§3.3, computed in `raid6.rs`).
//!
//! Traps: logical data index (order of array addresses) and syndrome index
//! (power of g in Q) differ for the asymmetric and `-6` RAID6 layouts, so
//! callers computing Q must use `syndrome()`, never the data index.

use crate::raid5::Rotation;
use crate::raid6;
use crate::MAX_RAID_DISKS;

/// Position of an array sector inside the stripe structure.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StripePos {
    /// Stripe number (= device chunk row).
    pub stripe: u64,
    /// Logical data index inside the stripe (0..data_disks).
    pub data_index: usize,
    /// Sector offset inside the chunk (0..chunk_sectors).
    pub offset_sectors: u64,
}

/// What a device holds in one stripe.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChunkRole {
    /// Data chunk with this logical data index.
    Data(usize),
    /// XOR parity.
    P,
    /// RAID6 Reed-Solomon syndrome.
    Q,
}

const ROLE_P: u16 = 0xFFFE;
const ROLE_Q: u16 = 0xFFFF;
const NO_Q: u16 = 0xFFFF;

/// Roles of the devices in one stripe of a parity level: one allocation of `3 * data_disks +
/// disks` entries, what the stripe itself has (md allows 1,920 members; a stripe of them is
/// as wide).
#[derive(Clone, Debug)]
pub struct StripeRoles {
    disks: u16,
    data_disks: u16,
    p: u16,
    q: u16,
    /// `data_dev` (data index → device), `syndrome` (data index → syndrome index),
    /// `by_syndrome` (syndrome index → data index), each `data_disks` long, then `role`
    /// (device → data index, `ROLE_P` or `ROLE_Q`), `disks` long.
    table: Box<[u16]>,
}

impl StripeRoles {
    /// Resolve a stripe's rotation into a full role table.
    pub(crate) fn build(disks: usize, data_disks: usize, rot: &Rotation) -> StripeRoles {
        assert!(
            disks <= MAX_RAID_DISKS && data_disks < disks,
            "{disks} devices, {data_disks} of them data"
        );
        let k = data_disks;
        let mut table = vec![0u16; 3 * k + disks].into_boxed_slice();
        let (data_dev, rest) = table.split_at_mut(k);
        let (syndrome, rest) = rest.split_at_mut(k);
        let (by_syndrome, role) = rest.split_at_mut(k);
        role[rot.p] = ROLE_P;
        if let Some(q) = rot.q {
            role[q] = ROLE_Q;
        }
        for (d, dev_of) in data_dev.iter_mut().enumerate() {
            let dev = rot.data_dev(d);
            *dev_of = dev as u16;
            role[dev] = d as u16;
        }
        match rot.q {
            Some(q) => raid6::assign_syndromes(disks, q, role, syndrome),
            None => syndrome
                .iter_mut()
                .enumerate()
                .for_each(|(d, s)| *s = d as u16),
        }
        for (d, &s) in syndrome.iter().enumerate() {
            by_syndrome[s as usize] = d as u16;
        }
        StripeRoles {
            disks: disks as u16,
            data_disks: k as u16,
            p: rot.p as u16,
            q: rot.q.map_or(NO_Q, |q| q as u16),
            table,
        }
    }

    /// Number of devices in the stripe (raid_disks).
    pub fn disks(&self) -> usize {
        self.disks as usize
    }

    /// Number of data chunks in the stripe.
    pub fn data_disks(&self) -> usize {
        self.data_disks as usize
    }

    /// Device holding logical data chunk `data_index`.
    pub fn data_dev(&self, data_index: usize) -> usize {
        assert!(data_index < self.data_disks(), "data index out of range");
        self.table[data_index] as usize
    }

    /// Device holding P.
    pub fn p_dev(&self) -> usize {
        self.p as usize
    }

    /// Device holding Q (RAID6 only).
    pub fn q_dev(&self) -> Option<usize> {
        (self.q != NO_Q).then_some(self.q as usize)
    }

    /// RAID6 syndrome index (Q coefficient g^syndrome) of a data chunk, in md's
    /// device walk order (md-format.md §3.3). Equals `data_index` for RAID4/5.
    pub fn syndrome(&self, data_index: usize) -> usize {
        assert!(data_index < self.data_disks(), "data index out of range");
        self.table[self.data_disks() + data_index] as usize
    }

    /// Inverse of [`syndrome`](Self::syndrome): logical data index in syndrome index `syndrome`.
    pub fn data_index_of_syndrome(&self, syndrome: usize) -> usize {
        assert!(syndrome < self.data_disks(), "syndrome out of range");
        self.table[2 * self.data_disks() + syndrome] as usize
    }

    /// Device holding syndrome index `syndrome`.
    pub fn syndrome_dev(&self, syndrome: usize) -> usize {
        self.data_dev(self.data_index_of_syndrome(syndrome))
    }

    /// What device `dev` holds in this stripe.
    pub fn role_of(&self, dev: usize) -> ChunkRole {
        assert!(dev < self.disks(), "device out of range");
        match self.table[3 * self.data_disks() + dev] {
            ROLE_P => ChunkRole::P,
            ROLE_Q => ChunkRole::Q,
            d => ChunkRole::Data(d as usize),
        }
    }
}
