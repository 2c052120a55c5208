//! The vocabulary of background work, shared by the walker that schedules it (`background/`),
//! the personalities whose windows do it and the policies that say where it is needed: which
//! action runs, why a window stopped, and what a verify request found.

use crate::error::EngineError;
use crate::integrity::IntegrityCounts;

/// What the background worker does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SyncAction {
    Idle,
    Resync,
    Recover,
    Check,
    Repair,
}

impl SyncAction {
    pub fn name(self) -> &'static str {
        match self {
            SyncAction::Idle => "idle",
            SyncAction::Resync => "resync",
            SyncAction::Recover => "recover",
            SyncAction::Check => "check",
            SyncAction::Repair => "repair",
        }
    }
}

/// Why a unit of work stopped early.
pub(crate) enum Stop {
    Interrupted,
    /// The action cannot go on: what failed (its kind says whether it was I/O, damage, …).
    Failed(EngineError),
}

/// What one verify request found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct VerifyReport {
    /// Ranges asked for.
    pub ranges: usize,
    /// Array bytes under the page rows read (each counted once, however many ranges touched
    /// it): the request's cost.
    pub bytes_verified: u64,
    /// Sectors whose redundancy disagreed with the data, per 4 KiB page as md counts them.
    pub mismatch_sectors: u64,
    /// Whether what disagreed was rewritten (false on a read-only array: only reported).
    pub repaired: bool,
    /// Integrity counters that moved during the request (None without integrity).
    pub integrity: Option<IntegrityCounts>,
}
