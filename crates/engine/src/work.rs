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
#[derive(Debug)]
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn pieces_in_flight_return_every_result_in_order() {
        let pieces: Vec<u64> = (0..37).collect();
        for (at_once, in_order) in [(1, false), (4, false), (4, true), (64, false)] {
            let out = in_pieces(&pieces, at_once, in_order, |&p| Ok(p * 3)).unwrap();
            assert_eq!(out, pieces.iter().map(|p| p * 3).collect::<Vec<_>>());
        }
    }

    #[test]
    fn pieces_run_side_by_side_up_to_the_limit() {
        let (now, most) = (AtomicUsize::new(0), AtomicUsize::new(0));
        let pieces: Vec<u64> = (0..16).collect();
        let started = std::time::Instant::now();
        in_pieces(&pieces, 3, false, |&p| {
            let n = now.fetch_add(1, Ordering::SeqCst) + 1;
            most.fetch_max(n, Ordering::SeqCst);
            // The first pieces wait for each other (a few seconds at most, on a busy machine),
            // so that three are surely in flight together once.
            while p < 3
                && now.load(Ordering::SeqCst) < 3
                && started.elapsed() < std::time::Duration::from_secs(5)
            {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            std::thread::sleep(std::time::Duration::from_millis(2));
            now.fetch_sub(1, Ordering::SeqCst);
            Ok(())
        })
        .unwrap();
        assert_eq!(most.load(Ordering::SeqCst), 3, "three at once, never more");
    }

    #[test]
    fn a_stopped_piece_stops_those_not_started_and_is_the_answer() {
        let ran = AtomicUsize::new(0);
        let pieces: Vec<u64> = (0..1000).collect();
        let res = in_pieces(&pieces, 4, false, |&p| {
            ran.fetch_add(1, Ordering::SeqCst);
            match p {
                10 => Err(Stop::Interrupted),
                _ => Ok(p),
            }
        });
        assert!(matches!(res, Err(Stop::Interrupted)));
        // Piece 10 stopped the walk: at most the pieces already claimed ran after it.
        assert!(ran.load(Ordering::SeqCst) < 10 + 1 + 2 * PIECES_IN_FLIGHT);
        let in_order = AtomicUsize::new(0);
        let res = in_pieces(&pieces, 4, true, |&p| {
            in_order.fetch_add(1, Ordering::SeqCst);
            if p == 10 {
                return Err(Stop::Interrupted);
            }
            Ok(p)
        });
        assert!(res.is_err());
        assert_eq!(in_order.load(Ordering::SeqCst), 11);
    }
}
