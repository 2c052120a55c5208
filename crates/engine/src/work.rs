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

/// Pieces of one background window in flight at once. A piece's member reads, its parity
/// arithmetic and its write to a new member run on its own thread, so the reads of one piece
/// overlap the arithmetic and the writes of the others (md keeps every member's queue busy the
/// same way, with many stripes of one window in flight).
pub(crate) const PIECES_IN_FLIGHT: usize = 4;

/// Run `work` on every piece, up to `at_once` (at most [`PIECES_IN_FLIGHT`]) at a time, one
/// after the other when `in_order` (the simulation replays one interleaving per seed). The first piece that stops
/// stops those not yet started, and its `Stop` is returned; otherwise the results, in the
/// pieces' order. Every piece started has ended when this returns.
pub(crate) fn in_pieces<P: Sync, T: Send>(
    pieces: &[P],
    at_once: usize,
    in_order: bool,
    work: impl Fn(&P) -> Result<T, Stop> + Sync,
) -> Result<Vec<T>, Stop> {
    if in_order || pieces.len() < 2 || at_once < 2 {
        return pieces.iter().map(work).collect();
    }
    let next = std::sync::atomic::AtomicUsize::new(0);
    let done: parking_lot::Mutex<Vec<Option<Result<T, Stop>>>> =
        parking_lot::Mutex::new(pieces.iter().map(|_| None).collect());
    let stopped = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|scope| {
        for _ in 0..at_once.min(PIECES_IN_FLIGHT).min(pieces.len()) {
            scope.spawn(|| {
                use std::sync::atomic::Ordering::Relaxed;
                while !stopped.load(Relaxed) {
                    let i = next.fetch_add(1, Relaxed);
                    let Some(piece) = pieces.get(i) else { break };
                    let res = work(piece);
                    stopped.fetch_or(res.is_err(), Relaxed);
                    done.lock()[i] = Some(res);
                }
            });
        }
    });
    // Pieces are claimed in order, so those never started follow the first stop.
    let mut out = Vec::with_capacity(pieces.len());
    for res in done.into_inner() {
        match res {
            Some(Ok(t)) => out.push(t),
            Some(Err(stop)) => return Err(stop),
            None => unreachable!("a piece was left unstarted though none stopped"),
        }
    }
    Ok(out)
}
