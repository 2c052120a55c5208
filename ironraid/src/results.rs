//! What verify and guide requests answer, as the control socket carries them: the daemon fills
//! them in (`guide`, `server`), the client side adds them up and prints them (`verify`, `guide`).
//! They sit below `control` so its `Response` can carry them without importing the commands.

use serde::{Deserialize, Serialize};

/// What a verify request found, as the control socket and `--json` give it.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct VerifyResult {
    pub ranges: usize,
    /// Array bytes under the stripes read (each stripe once): the request's cost.
    pub bytes_verified: u64,
    /// Sectors whose redundancy disagreed with the data (per 4 KiB page, as md counts).
    pub mismatch_sectors: u64,
    /// Whether what disagreed was rewritten (false: the array is read-only; only reported).
    pub repaired: bool,
    /// Blocks that failed their integrity records, and what became of them (integrity only).
    pub integrity: Option<VerifyIntegrity>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct VerifyIntegrity {
    pub data_mismatches: u64,
    pub p_mismatches: u64,
    pub q_mismatches: u64,
    pub repaired: u64,
    pub records_fixed: u64,
    pub resolved_after_crash: u64,
}

impl VerifyResult {
    pub fn from_engine(r: &engine::VerifyReport) -> VerifyResult {
        VerifyResult {
            ranges: r.ranges,
            bytes_verified: r.bytes_verified,
            mismatch_sectors: r.mismatch_sectors,
            repaired: r.repaired,
            integrity: r.integrity.as_ref().map(|c| VerifyIntegrity {
                data_mismatches: c.data_mismatches,
                p_mismatches: c.p_mismatches,
                q_mismatches: c.q_mismatches,
                repaired: c.repaired,
                records_fixed: c.records_fixed,
                resolved_after_crash: c.resolved_after_crash,
            }),
        }
    }

    pub fn add(&mut self, o: &VerifyResult) {
        self.ranges += o.ranges;
        self.bytes_verified += o.bytes_verified;
        self.mismatch_sectors += o.mismatch_sectors;
        self.repaired = o.repaired;
        if let Some(oi) = &o.integrity {
            let i = self.integrity.get_or_insert_with(VerifyIntegrity::default);
            i.data_mismatches += oi.data_mismatches;
            i.p_mismatches += oi.p_mismatches;
            i.q_mismatches += oi.q_mismatches;
            i.repaired += oi.repaired;
            i.records_fixed += oi.records_fixed;
            i.resolved_after_crash += oi.resolved_after_crash;
        }
    }
}

/// What a guide did.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct GuideResult {
    pub guide: String,
    /// The verify of the guide's ranges (None: fell back).
    pub verify: Option<VerifyResult>,
    /// What the ext4 journal said (ext4 guide only).
    pub ext4: Option<Ext4Summary>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Ext4Summary {
    pub block_size: u32,
    pub journal_bytes: u64,
    /// Committed transactions still in the log.
    pub transactions: usize,
    /// Distinct home blocks they name.
    pub home_blocks: u64,
    /// Journal blocks past the last commit that may have been written.
    pub window_blocks: u64,
    /// Bytes in the verify set (before rounding to whole page rows).
    pub set_bytes: u64,
    pub ranges: usize,
}
