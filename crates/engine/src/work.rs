//! The vocabulary of background work, shared by the walker that schedules it (`background/`),
//! the personalities whose windows do it and the policies that say where it is needed: which
//! action runs, why a window stopped, and what a verify request found.

use crate::error::EngineError;
use crate::integrity::IntegrityCounts;
use crate::io::pool::IoPool;

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
/// arithmetic and its write to a new member run on one thread, so the reads of one piece
/// overlap the arithmetic and the writes of the others (md keeps every member's queue busy the
/// same way, with many stripes of one window in flight).
pub(crate) const PIECES_IN_FLIGHT: usize = 4;

/// Run `work` on every piece, up to `at_once` (at most [`PIECES_IN_FLIGHT`]) at a time on the
/// member-I/O `pool` and the calling thread, or one after the other on the caller without a
/// pool (the simulation replays one interleaving per seed). The first piece that stops stops
/// those not yet started, and its `Stop` is returned; otherwise the results, in the pieces'
/// order. Every piece started has ended when this returns.
///
/// Why the pool cannot deadlock on itself: a piece's member I/O is a batch of its own on the
/// same pool, and the caller of a batch (the thread running the piece) claims every call no
/// idle worker took, so a batch finishes even with every worker inside a piece.
pub(crate) fn in_pieces<P: Sync, T: Send>(
    pieces: &[P],
    at_once: usize,
    pool: Option<&IoPool>,
    work: impl Fn(&P) -> Result<T, Stop> + Sync,
) -> Result<Vec<T>, Stop> {
    let lanes = at_once.min(PIECES_IN_FLIGHT).min(pieces.len());
    let Some(pool) = pool.filter(|_| lanes >= 2) else {
        return pieces.iter().map(work).collect();
    };
    let next = std::sync::atomic::AtomicUsize::new(0);
    let done: parking_lot::Mutex<Vec<Option<Result<T, Stop>>>> =
        parking_lot::Mutex::new(pieces.iter().map(|_| None).collect());
    let stopped = std::sync::atomic::AtomicBool::new(false);
    pool.run(lanes, &|_| {
        use std::sync::atomic::Ordering::Relaxed;
        while !stopped.load(Relaxed) {
            let i = next.fetch_add(1, Relaxed);
            let Some(piece) = pieces.get(i) else { break };
            let res = work(piece);
            stopped.fetch_or(res.is_err(), Relaxed);
            done.lock()[i] = Some(res);
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
        let pool = IoPool::new(4).unwrap();
        let pieces: Vec<u64> = (0..37).collect();
        for (at_once, pool) in [
            (1, Some(&pool)),
            (4, Some(&pool)),
            (4, None),
            (64, Some(&pool)),
        ] {
            let out = in_pieces(&pieces, at_once, pool, |&p| Ok(p * 3)).unwrap();
            assert_eq!(out, pieces.iter().map(|p| p * 3).collect::<Vec<_>>());
        }
    }

    #[test]
    fn pieces_run_side_by_side_up_to_the_limit() {
        let (now, most) = (AtomicUsize::new(0), AtomicUsize::new(0));
        let pool = IoPool::new(4).unwrap();
        let pieces: Vec<u64> = (0..16).collect();
        let started = std::time::Instant::now();
        in_pieces(&pieces, 3, Some(&pool), |&p| {
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
        let pool = IoPool::new(4).unwrap();
        let ran = AtomicUsize::new(0);
        let pieces: Vec<u64> = (0..1000).collect();
        let res = in_pieces(&pieces, 4, Some(&pool), |&p| {
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
        let res = in_pieces(&pieces, 4, None, |&p| {
            in_order.fetch_add(1, Ordering::SeqCst);
            if p == 10 {
                return Err(Stop::Interrupted);
            }
            Ok(p)
        });
        assert!(res.is_err());
        assert_eq!(in_order.load(Ordering::SeqCst), 11);
    }

    /// Pieces on the pool issue member I/O on the same pool (as rebuild pieces do): with every
    /// worker inside a piece, the nested batches still finish (their callers claim the calls).
    #[test]
    fn pieces_on_the_pool_may_run_batches_on_it() {
        let pool = IoPool::new(2).unwrap();
        let pieces: Vec<usize> = (0..24).collect();
        let out = in_pieces(&pieces, PIECES_IN_FLIGHT, Some(&pool), |&p| {
            let sum = AtomicUsize::new(0);
            pool.run(p % 5 + 1, &|i| {
                std::thread::sleep(std::time::Duration::from_micros(100));
                sum.fetch_add(i + 1, Ordering::SeqCst);
            });
            Ok(sum.load(Ordering::SeqCst))
        })
        .unwrap();
        let want: Vec<usize> = pieces.iter().map(|p| (1..=p % 5 + 1).sum()).collect();
        assert_eq!(out, want);
    }
}
