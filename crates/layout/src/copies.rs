//! The set of copies of one array sector (linear, RAID0, RAID1, RAID10).
//!
//! Theory: every non-parity level places the copies of an array sector on a
//! small regular pattern that `Copies` stores in closed form instead of as a
//! list (a RAID1 may have 128 copies; storing them would cost kilobytes per
//! request):
//!
//! * copy `i` has near index `j = i / fc` and far index `f = i % fc`
//!   (md order: each near copy followed by its far copies — md-format.md
//!   §4.2 and md's RAID10 copy walk);
//! * near copy `j` sits on `dev0 + j`; when that passes the last device it
//!   wraps to device 0 *and one chunk further down* (`wrap_step` sectors);
//! * far copy `f` of it moves `f·nc` devices right (mod n) and `f·stride`
//!   sectors down.
//!
//! Linear/RAID0 are the degenerate case `nc = fc = 1`; RAID1 is `nc = n`,
//! `dev0 = 0` (no wrap, every device at the same sector).

/// One physical location: device role and sector relative to its data_offset.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Loc {
    /// Device role (0..raid_disks).
    pub dev: usize,
    /// Sector relative to the device's data_offset.
    pub dev_sector: u64,
}

/// Every copy of an array sector, in md's copy order, plus how far the run
/// stays contiguous on all of them.
#[derive(Clone, Copy, Debug)]
pub struct Copies {
    n: u32,
    nc: u32,
    fc: u32,
    dev0: u32,
    sector0: u64,
    wrap_step: u64,
    stride: u64,
    run: u64,
}

impl Copies {
    /// Single copy (linear, RAID0).
    pub(crate) fn single(dev: usize, dev_sector: u64, run: u64) -> Copies {
        Copies {
            n: dev as u32 + 1,
            nc: 1,
            fc: 1,
            dev0: dev as u32,
            sector0: dev_sector,
            wrap_step: 0,
            stride: 0,
            run,
        }
    }

    /// One copy per device at the same sector (RAID1).
    pub(crate) fn mirrored(disks: usize, dev_sector: u64, run: u64) -> Copies {
        Copies {
            n: disks as u32,
            nc: disks as u32,
            fc: 1,
            dev0: 0,
            sector0: dev_sector,
            wrap_step: 0,
            stride: 0,
            run,
        }
    }

    /// RAID10 pattern (see module docs).
    pub(crate) fn raid10(
        n: usize,
        nc: usize,
        fc: usize,
        first: Loc,
        chunk: u64,
        stride: u64,
        run: u64,
    ) -> Copies {
        Copies {
            n: n as u32,
            nc: nc as u32,
            fc: fc as u32,
            dev0: first.dev as u32,
            sector0: first.dev_sector,
            wrap_step: chunk,
            stride,
            run,
        }
    }

    /// Number of copies.
    pub fn len(&self) -> usize {
        (self.nc * self.fc) as usize
    }

    /// Always false (there is at least one copy); present for clippy's sake.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Copy `i` (0 is md's first copy).
    pub fn get(&self, i: usize) -> Loc {
        assert!(i < self.len(), "copy index {i} out of range");
        let (j, f) = (i as u32 / self.fc, i as u32 % self.fc);
        let mut dev = self.dev0 + j;
        let mut sector = self.sector0;
        if dev >= self.n {
            dev -= self.n;
            sector += self.wrap_step;
        }
        if f > 0 {
            dev = (dev + f * self.nc) % self.n;
            sector += u64::from(f) * self.stride;
        }
        Loc {
            dev: dev as usize,
            dev_sector: sector,
        }
    }

    /// All copies in md order.
    pub fn iter(&self) -> impl Iterator<Item = Loc> + '_ {
        (0..self.len()).map(move |i| self.get(i))
    }

    /// Sectors, starting at the mapped array sector, that stay contiguous on
    /// every copy (ends at a chunk, device or array boundary). Always >= 1.
    pub fn run_sectors(&self) -> u64 {
        self.run
    }

    /// Does copy set contain device `dev`? Returns its location if so.
    pub fn on_dev(&self, dev: usize) -> Option<Loc> {
        self.iter().find(|l| l.dev == dev)
    }
}
