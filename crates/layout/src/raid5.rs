//! Chunk placement for the parity levels (RAID4, RAID5 and RAID6).
//!
//! Theory (md-format.md §2.1, §2.2, §3.2): the array is cut into chunks of
//! `C` sectors; `k` consecutive chunks (k = data disks) form one *stripe*,
//! and every chunk of stripe `s` lives at device sector `s·C + offset`. The
//! layout only decides, per stripe, which device holds P (and Q) and which
//! device holds logical data index `d` (0..k):
//!
//! * "left" layouts move parity from the last device leftwards
//!   (`P = last − s mod w`), "right" layouts rightwards (`P = s mod w`).
//! * "asymmetric" layouts (and parity-first/last) restart data at device 0
//!   and skip the parity device(s): the *skip* rule below.
//! * "symmetric" layouts continue round-robin right after the parity
//!   device(s): `dev = (first_after_parity + d) mod w`.
//! * RAID6 native layouts (0..=5) put Q right after P (wrapping to device 0
//!   when P is last); the `-6` layouts (16..=20) are the RAID5 layout over
//!   the first `n − 1` devices (so `w = n − 1`, rotation modulo `n − 1`!)
//!   with Q fixed on the last device.
//!
//! Traps:
//! * RAID4 ignores the layout field: parity is always on the last device,
//!   even though mdadm writes layout 0 (which would be left-asymmetric for
//!   RAID5) — see §2.2 and pitfall 7 in §12.
//! * The `-6` layouts rotate modulo `n − 1`, not `n`.
//! * DDF RAID6 layouts (8, 9, 10) use a different Q order and are refused.

use crate::error::LayoutError;
use crate::level::Level;

/// The rotation rule of one md parity algorithm.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Algo {
    /// left-asymmetric (0; RAID6 0, and 16 over n−1 devices)
    LeftAsymmetric,
    /// right-asymmetric (1; RAID6 1, and 17)
    RightAsymmetric,
    /// left-symmetric (2; RAID6 2, and 18)
    LeftSymmetric,
    /// right-symmetric (3; RAID6 3, and 19)
    RightSymmetric,
    /// parity-first (4; RAID6 4, and 20)
    ParityFirst,
    /// parity-last (5; RAID6 5; RAID4 always)
    ParityLast,
}

/// A validated parity layout: rotation rule plus whether it is a RAID6
/// `-6` variant (RAID5 arrangement on `n − 1` devices, Q on the last).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ParityLayout {
    pub algo: Algo,
    /// Number of syndromes: 1 (RAID4/5) or 2 (RAID6).
    pub parity: usize,
    /// RAID6 layouts 16..=20.
    pub q_last: bool,
}

/// Where P, Q and the data chunks of one stripe go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Rotation {
    pub p: usize,
    pub q: Option<usize>,
    /// `Some((first, width))`: symmetric rule `dev = (first + d) mod width`.
    /// `None`: skip rule (devices in order, skipping P and Q).
    pub symmetric: Option<(usize, usize)>,
}

fn algo_from_low(low: u32) -> Option<Algo> {
    Some(match low {
        0 => Algo::LeftAsymmetric,
        1 => Algo::RightAsymmetric,
        2 => Algo::LeftSymmetric,
        3 => Algo::RightSymmetric,
        4 => Algo::ParityFirst,
        5 => Algo::ParityLast,
        _ => return None,
    })
}

impl ParityLayout {
    /// Validate an md `layout` value for a parity level.
    pub fn new(level: Level, layout: u32) -> Result<ParityLayout, LayoutError> {
        let bad = |reason| LayoutError::BadLayout {
            level,
            layout,
            reason,
        };
        match level {
            Level::Raid4 => Ok(ParityLayout {
                algo: Algo::ParityLast,
                parity: 1,
                q_last: false,
            }),
            Level::Raid5 => {
                let algo = algo_from_low(layout).ok_or_else(|| bad("raid5 layouts are 0..=5"))?;
                Ok(ParityLayout {
                    algo,
                    parity: 1,
                    q_last: false,
                })
            }
            Level::Raid6 => {
                if (8..=10).contains(&layout) {
                    return Err(LayoutError::Unsupported(format!(
                        "raid6 DDF layout {layout} (different Q order)"
                    )));
                }
                let (low, q_last) = match layout {
                    0..=5 => (layout, false),
                    16..=20 => (layout - 16, true),
                    _ => return Err(bad("raid6 layouts are 0..=5 and 16..=20")),
                };
                let algo = algo_from_low(low).ok_or_else(|| bad("raid6 layout"))?;
                Ok(ParityLayout {
                    algo,
                    parity: 2,
                    q_last,
                })
            }
            _ => Err(LayoutError::NoLayouts(level)),
        }
    }

    /// P/Q devices and data rule for stripe `stripe` of an `n`-device array.
    pub fn rotation(&self, n: usize, stripe: u64) -> Rotation {
        if self.parity == 2 && !self.q_last {
            return self.rotation_raid6(n, stripe);
        }
        // RAID5 rule over `w` devices; RAID6 `-6` layouts add Q on the last.
        let w = if self.parity == 2 { n - 1 } else { n };
        let q = (self.parity == 2).then_some(n - 1);
        let turn = (stripe % w as u64) as usize;
        let p = match self.algo {
            Algo::LeftAsymmetric | Algo::LeftSymmetric => w - 1 - turn,
            Algo::RightAsymmetric | Algo::RightSymmetric => turn,
            Algo::ParityFirst => 0,
            Algo::ParityLast => w - 1,
        };
        let symmetric = match self.algo {
            Algo::LeftSymmetric | Algo::RightSymmetric => Some(((p + 1) % w, w)),
            _ => None,
        };
        Rotation { p, q, symmetric }
    }

    fn rotation_raid6(&self, n: usize, stripe: u64) -> Rotation {
        let turn = (stripe % n as u64) as usize;
        let (p, q) = match self.algo {
            Algo::LeftAsymmetric | Algo::LeftSymmetric => (n - 1 - turn, (n - turn) % n),
            Algo::RightAsymmetric | Algo::RightSymmetric => (turn, (turn + 1) % n),
            Algo::ParityFirst => (0, 1),
            Algo::ParityLast => (n - 2, n - 1),
        };
        let symmetric = match self.algo {
            Algo::LeftSymmetric | Algo::RightSymmetric => Some(((q + 1) % n, n)),
            _ => None,
        };
        Rotation {
            p,
            q: Some(q),
            symmetric,
        }
    }
}

impl Rotation {
    /// Device holding logical data index `d` of this stripe.
    #[inline]
    pub fn data_dev(&self, d: usize) -> usize {
        if let Some((first, width)) = self.symmetric {
            return (first + d) % width;
        }
        // Skip rule: walk devices from 0, stepping over P and Q.
        let (lo, hi) = match self.q {
            Some(q) if q < self.p => (q, self.p),
            Some(q) => (self.p, q),
            None => (self.p, usize::MAX),
        };
        let mut dev = d;
        if dev >= lo {
            dev += 1;
        }
        if dev >= hi {
            dev += 1;
        }
        dev
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(level: Level, layout: u32, n: usize, stripe: u64) -> Vec<String> {
        let pl = ParityLayout::new(level, layout).unwrap();
        let r = pl.rotation(n, stripe);
        let k = n - pl.parity;
        let mut cells = vec![String::new(); n];
        cells[r.p] = "P".into();
        if let Some(q) = r.q {
            cells[q] = "Q".into();
        }
        for d in 0..k {
            let dev = r.data_dev(d);
            assert!(cells[dev].is_empty());
            cells[dev] = format!("D{}", stripe as usize * k + d);
        }
        cells
    }

    #[test]
    fn raid4_ignores_layout() {
        for layout in [0, 1, 2, 77] {
            assert_eq!(row(Level::Raid4, layout, 4, 1), ["D3", "D4", "D5", "P"]);
        }
    }

    #[test]
    fn raid6_asymmetric_p_last_puts_q_first() {
        assert_eq!(row(Level::Raid6, 0, 5, 0), ["Q", "D0", "D1", "D2", "P"]);
        assert_eq!(row(Level::Raid6, 0, 5, 2), ["D6", "D7", "P", "Q", "D8"]);
    }

    #[test]
    fn ddf_is_unsupported() {
        for l in 8..=10 {
            assert!(matches!(
                ParityLayout::new(Level::Raid6, l),
                Err(LayoutError::Unsupported(_))
            ));
        }
        assert!(ParityLayout::new(Level::Raid5, 6).is_err());
        assert!(ParityLayout::new(Level::Raid5, 16).is_err());
        assert!(ParityLayout::new(Level::Raid6, 21).is_err());
    }
}
