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
//! callers computing Q must use `syndrome()`, never the data index. The table is
//! built from fixed arrays so that building it never allocates.

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

const ROLE_P: u8 = 0xFE;
const ROLE_Q: u8 = 0xFF;
const NO_Q: u8 = 0xFF;

/// Roles of the devices in one stripe of a parity level. Fixed arrays, no heap.
#[derive(Clone, Copy, Debug)]
pub struct StripeRoles {
    disks: u8,
    data_disks: u8,
    p: u8,
    q: u8,
    /// data index → device
    data_dev: [u8; MAX_RAID_DISKS],
    /// data index → syndrome index
    syndrome: [u8; MAX_RAID_DISKS],
    /// syndrome index → data index
    by_syndrome: [u8; MAX_RAID_DISKS],
    /// device → data index, `ROLE_P` or `ROLE_Q`
    role: [u8; MAX_RAID_DISKS],
}

impl StripeRoles {
    /// Resolve a stripe's rotation into a full role table.
    pub(crate) fn build(disks: usize, data_disks: usize, rot: &Rotation) -> StripeRoles {
        debug_assert!(disks <= MAX_RAID_DISKS && data_disks < disks);
        let mut r = StripeRoles {
            disks: disks as u8,
            data_disks: data_disks as u8,
            p: rot.p as u8,
            q: rot.q.map_or(NO_Q, |q| q as u8),
            data_dev: [0; MAX_RAID_DISKS],
            syndrome: [0; MAX_RAID_DISKS],
            by_syndrome: [0; MAX_RAID_DISKS],
            role: [0; MAX_RAID_DISKS],
        };
        r.role[rot.p] = ROLE_P;
        if let Some(q) = rot.q {
            r.role[q] = ROLE_Q;
        }
        for d in 0..data_disks {
            let dev = rot.data_dev(d);
            r.data_dev[d] = dev as u8;
            r.role[dev] = d as u8;
        }
        match rot.q {
            Some(q) => raid6::assign_syndromes(disks, q, &r.role, &mut r.syndrome),
            None => (0..data_disks).for_each(|d| r.syndrome[d] = d as u8),
        }
        for d in 0..data_disks {
            r.by_syndrome[r.syndrome[d] as usize] = d as u8;
        }
        r
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
        self.data_dev[data_index] as usize
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
        self.syndrome[data_index] as usize
    }

    /// Inverse of [`syndrome`](Self::syndrome): logical data index in syndrome index `syndrome`.
    pub fn data_index_of_syndrome(&self, syndrome: usize) -> usize {
        assert!(syndrome < self.data_disks(), "syndrome out of range");
        self.by_syndrome[syndrome] as usize
    }

    /// Device holding syndrome index `syndrome`.
    pub fn syndrome_dev(&self, syndrome: usize) -> usize {
        self.data_dev(self.data_index_of_syndrome(syndrome))
    }

    /// What device `dev` holds in this stripe.
    pub fn role_of(&self, dev: usize) -> ChunkRole {
        assert!(dev < self.disks(), "device out of range");
        match self.role[dev] {
            ROLE_P => ChunkRole::P,
            ROLE_Q => ChunkRole::Q,
            d => ChunkRole::Data(d as usize),
        }
    }
}
