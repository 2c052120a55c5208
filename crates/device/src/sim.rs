//! [`SimDevice`]: an adversarial in-memory member for deterministic fault simulation.
//!
//! Model: `data` is what reads return now; `durable` is what survives a power cut. Every write
//! lands in `data` at once and is appended to `pending` (writes since the last flush, in
//! order). `flush` applies `pending` to `durable`. `power_cut` decides, per pending write and in
//! order, whether it reached the medium whole, not at all, or torn (an arbitrary subset of its
//! sectors); FUA writes always reach it. Then `data` becomes `durable`.
//!
//! Injected faults (probabilities per call, drawn from a ChaCha RNG seeded per device):
//! I/O errors on reads and writes, lost writes (acknowledged but never stored), misdirected writes
//! (stored at another sector), and bit rot (one bit of a written range flips). A device can also be
//! killed outright. All draws happen under the device's lock in call order, so a run whose calls to
//! each device happen in a fixed order is reproduced exactly by its seed.
//!
//! Network faults model a remote member (`NbdDevice`) as the engine sees it. A connection that
//! drops or times out and comes back within the retry window is invisible (the client re-sends
//! what the server may have lost); what reaches the engine is a drop past the window: the call
//! fails and the device stays dead. A write caught by it may not have reached the server, may
//! have landed whole with its reply lost, or may have landed in part (a server that writes a
//! large request in pieces, reset between them) — drawn per drop, never reported as done.
//! Latency is `set_delay`; reordering is the caller's (the crash simulation's) to draw.

use crate::{check_range, Device, SECTOR_BYTES};
use parking_lot::Mutex;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::io;

/// Fault probabilities, each in `[0, 1]`, applied per call.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Faults {
    pub read_error: f64,
    pub write_error: f64,
    pub lost_write: f64,
    pub misdirected_write: f64,
    pub bit_rot: f64,
    /// A remote member's connection lost past the retry window (see the module notes).
    pub network_drop: f64,
}

/// Counters of what the device did and injected.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SimStats {
    pub reads: u64,
    pub writes: u64,
    pub flushes: u64,
    pub errors_injected: u64,
    pub writes_lost: u64,
    pub writes_misdirected: u64,
    pub bits_flipped: u64,
    pub network_drops: u64,
}

struct Pending {
    offset_bytes: u64,
    bytes: Vec<u8>,
    fua: bool,
}

struct State {
    data: Vec<u8>,
    durable: Vec<u8>,
    pending: Vec<Pending>,
    rng: ChaCha8Rng,
    faults: Faults,
    dead: bool,
    stats: SimStats,
    /// Sectors whose reads fail until they are written (a latent sector error; the drive
    /// remaps a sector when it is written).
    unreadable: std::collections::BTreeSet<u64>,
}

/// The power supply of several simulated devices. Armed with a count, it lets that many more
/// device calls (reads, writes, flushes of any attached device) through and then goes off: every
/// later call fails and changes nothing, as if the machine had lost power at that instant. The
/// call that finds the power gone is not performed at all (a write in flight at a cut is lost
/// whole; [`SimDevice::power_cut`] then decides the fate of the unflushed writes before it).
#[derive(Debug, Default)]
pub struct PowerRail {
    /// Calls still allowed; `u64::MAX` while unarmed.
    remaining: std::sync::atomic::AtomicU64,
    off: std::sync::atomic::AtomicBool,
}

impl PowerRail {
    pub fn new() -> std::sync::Arc<PowerRail> {
        std::sync::Arc::new(PowerRail {
            remaining: std::sync::atomic::AtomicU64::new(u64::MAX),
            off: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// Cut the power after `calls` more device calls.
    pub fn cut_after(&self, calls: u64) {
        self.remaining
            .store(calls, std::sync::atomic::Ordering::SeqCst);
    }

    /// Power on again, unarmed.
    pub fn restore(&self) {
        self.remaining
            .store(u64::MAX, std::sync::atomic::Ordering::SeqCst);
        self.off.store(false, std::sync::atomic::Ordering::SeqCst);
    }

    pub fn is_off(&self) -> bool {
        self.off.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Take one call's worth of power; false once it is gone.
    fn draw(&self) -> bool {
        use std::sync::atomic::Ordering::SeqCst;
        if self.off.load(SeqCst) {
            return false;
        }
        let left = self.remaining.fetch_update(SeqCst, SeqCst, |r| match r {
            u64::MAX => Some(u64::MAX),
            0 => None,
            r => Some(r - 1),
        });
        if left.is_err() {
            self.off.store(true, SeqCst);
            return false;
        }
        true
    }
}

/// In-memory member with seeded fault injection.
pub struct SimDevice {
    name: String,
    len_bytes: u64,
    state: Mutex<State>,
    rail: Option<std::sync::Arc<PowerRail>>,
    /// Every call sleeps this long first (µs), so that concurrent callers really overlap.
    delay_us: std::sync::atomic::AtomicU64,
}

fn injected(what: &str, name: &str) -> io::Error {
    io::Error::other(format!("{name}: injected {what} error"))
}

impl SimDevice {
    /// A zero-filled device of `len_bytes` (rounded down to a sector) with its own RNG seed.
    pub fn new(name: impl Into<String>, len_bytes: u64, seed: u64) -> SimDevice {
        let len_bytes = len_bytes / SECTOR_BYTES * SECTOR_BYTES;
        let image = vec![0u8; len_bytes as usize];
        SimDevice {
            name: name.into(),
            len_bytes,
            state: Mutex::new(State {
                data: image.clone(),
                durable: image,
                pending: Vec::new(),
                rng: ChaCha8Rng::seed_from_u64(seed),
                faults: Faults::default(),
                dead: false,
                stats: SimStats::default(),
                unreadable: std::collections::BTreeSet::new(),
            }),
            rail: None,
            delay_us: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// Make every call take at least `d` (outside the device lock): widens the windows in
    /// which concurrent requests, rebuilds and role changes overlap.
    pub fn set_delay(&self, d: std::time::Duration) {
        let us = u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
        self.delay_us
            .store(us, std::sync::atomic::Ordering::Relaxed);
    }

    /// The same device, powered by `rail`.
    pub fn on_rail(mut self, rail: std::sync::Arc<PowerRail>) -> SimDevice {
        self.rail = Some(rail);
        self
    }

    /// False (and the call must fail without effect) when the rail's power is gone.
    fn powered(&self) -> bool {
        let us = self.delay_us.load(std::sync::atomic::Ordering::Relaxed);
        if us > 0 {
            std::thread::sleep(std::time::Duration::from_micros(us));
        }
        self.rail.as_ref().is_none_or(|r| r.draw())
    }

    /// Replace the fault probabilities from now on.
    pub fn set_faults(&self, faults: Faults) {
        self.state.lock().faults = faults;
    }

    /// Kill (or revive) the device: while dead every call fails.
    pub fn set_dead(&self, dead: bool) {
        self.state.lock().dead = dead;
    }

    /// Make `len_bytes` at `offset_bytes` unreadable (whole sectors around it) until written:
    /// a latent sector error, which a drive remaps when the sector is written again.
    pub fn set_unreadable(&self, offset_bytes: u64, len_bytes: u64) {
        let first = offset_bytes / SECTOR_BYTES;
        let end = (offset_bytes + len_bytes).div_ceil(SECTOR_BYTES);
        self.state.lock().unreadable.extend(first..end);
    }

    /// Every sector reads again (the latent errors left are forgotten, as after a scrub by
    /// the drive itself).
    pub fn clear_unreadable(&self) {
        self.state.lock().unreadable.clear();
    }

    /// How many sectors still fail reads.
    pub fn unreadable_sectors(&self) -> usize {
        self.state.lock().unreadable.len()
    }

    /// Power cut: unflushed writes survive whole, not at all, or torn; reads then see the medium.
    pub fn power_cut(&self) {
        let mut st = self.state.lock();
        let st = &mut *st;
        for w in std::mem::take(&mut st.pending) {
            let fate = if w.fua { 0 } else { st.rng.gen_range(0..3) };
            let start = w.offset_bytes as usize;
            match fate {
                0 => st.durable[start..start + w.bytes.len()].copy_from_slice(&w.bytes),
                1 => {}
                _ => {
                    for (i, sector) in w.bytes.chunks(SECTOR_BYTES as usize).enumerate() {
                        if st.rng.gen_bool(0.5) {
                            let at = start + i * SECTOR_BYTES as usize;
                            st.durable[at..at + sector.len()].copy_from_slice(sector);
                        }
                    }
                }
            }
        }
        st.data.clone_from(&st.durable);
    }

    /// Flip one bit behind the array's back (bit rot on the medium).
    pub fn flip_bit(&self, byte_offset: u64, bit: u8) {
        let mut st = self.state.lock();
        let at = byte_offset as usize;
        st.data[at] ^= 1 << (bit % 8);
        st.durable[at] ^= 1 << (bit % 8);
    }

    /// Overwrite bytes behind the array's back, on the medium (as a stray writer would).
    pub fn scribble(&self, offset_bytes: u64, bytes: &[u8]) {
        let mut st = self.state.lock();
        let at = offset_bytes as usize;
        st.data[at..at + bytes.len()].copy_from_slice(bytes);
        st.durable[at..at + bytes.len()].copy_from_slice(bytes);
    }

    /// Copy of what reads return now.
    pub fn contents(&self) -> Vec<u8> {
        self.state.lock().data.clone()
    }

    pub fn stats(&self) -> SimStats {
        self.state.lock().stats
    }

    /// Draw a network drop past the retry window: the device is dead from now on.
    fn network_drop(st: &mut State) -> bool {
        if st.dead || st.faults.network_drop <= 0.0 || !st.rng.gen_bool(st.faults.network_drop) {
            return false;
        }
        st.dead = true;
        st.stats.errors_injected += 1;
        st.stats.network_drops += 1;
        true
    }

    /// What a write caught by a drop left on the server: nothing, all of it (the reply was
    /// lost), or its first sectors. Never durable by itself (a flush never covered it).
    fn land_unacknowledged(st: &mut State, buf: &[u8], offset_bytes: u64) {
        let sectors = buf.len() / SECTOR_BYTES as usize;
        let landed_sectors = match st.rng.gen_range(0..3) {
            0 => 0,
            1 => sectors,
            _ => st.rng.gen_range(0..=sectors),
        };
        let len = landed_sectors * SECTOR_BYTES as usize;
        if len == 0 {
            return;
        }
        let at = offset_bytes as usize;
        st.data[at..at + len].copy_from_slice(&buf[..len]);
        st.pending.push(Pending {
            offset_bytes,
            bytes: buf[..len].to_vec(),
            fua: false,
        });
    }

    fn maybe_rot(st: &mut State, at: usize, len: usize) {
        if len > 0 && st.faults.bit_rot > 0.0 && st.rng.gen_bool(st.faults.bit_rot) {
            let byte = at + st.rng.gen_range(0..len);
            let bit = st.rng.gen_range(0..8);
            st.data[byte] ^= 1 << bit;
            st.stats.bits_flipped += 1;
        }
    }
}

impl Device for SimDevice {
    fn name(&self) -> &str {
        &self.name
    }

    fn len_bytes(&self) -> u64 {
        self.len_bytes
    }

    fn read_at(&self, buf: &mut [u8], offset_bytes: u64) -> io::Result<()> {
        check_range(self, offset_bytes, buf.len() as u64);
        if !self.powered() {
            return Err(injected("power-off read", &self.name));
        }
        let mut st = self.state.lock();
        let st = &mut *st;
        st.stats.reads += 1;
        if Self::network_drop(st) {
            return Err(injected("network drop on read", &self.name));
        }
        if st.dead || (st.faults.read_error > 0.0 && st.rng.gen_bool(st.faults.read_error)) {
            st.stats.errors_injected += 1;
            return Err(injected("read", &self.name));
        }
        let sectors =
            offset_bytes / SECTOR_BYTES..(offset_bytes + buf.len() as u64).div_ceil(SECTOR_BYTES);
        if st.unreadable.range(sectors).next().is_some() {
            st.stats.errors_injected += 1;
            return Err(injected("unreadable sector", &self.name));
        }
        let at = offset_bytes as usize;
        buf.copy_from_slice(&st.data[at..at + buf.len()]);
        Ok(())
    }

    fn write_at(&self, buf: &[u8], offset_bytes: u64, fua: bool) -> io::Result<()> {
        check_range(self, offset_bytes, buf.len() as u64);
        if !self.powered() {
            return Err(injected("power-off write", &self.name));
        }
        let mut st = self.state.lock();
        let st = &mut *st;
        st.stats.writes += 1;
        if Self::network_drop(st) {
            Self::land_unacknowledged(st, buf, offset_bytes);
            return Err(injected("network drop on write", &self.name));
        }
        if st.dead || (st.faults.write_error > 0.0 && st.rng.gen_bool(st.faults.write_error)) {
            st.stats.errors_injected += 1;
            return Err(injected("write", &self.name));
        }
        if st.faults.lost_write > 0.0 && st.rng.gen_bool(st.faults.lost_write) {
            st.stats.writes_lost += 1;
            return Ok(());
        }
        let mut at = offset_bytes;
        if st.faults.misdirected_write > 0.0 && st.rng.gen_bool(st.faults.misdirected_write) {
            let sectors = (self.len_bytes - buf.len() as u64) / SECTOR_BYTES;
            at = st.rng.gen_range(0..=sectors) * SECTOR_BYTES;
            st.stats.writes_misdirected += 1;
        }
        let start = at as usize;
        let written = at / SECTOR_BYTES..(at + buf.len() as u64).div_ceil(SECTOR_BYTES);
        let remapped: Vec<u64> = st.unreadable.range(written).copied().collect();
        for s in remapped {
            st.unreadable.remove(&s);
        }
        st.data[start..start + buf.len()].copy_from_slice(buf);
        Self::maybe_rot(st, start, buf.len());
        let stored = st.data[start..start + buf.len()].to_vec();
        if fua {
            st.durable[start..start + buf.len()].copy_from_slice(&stored);
        }
        st.pending.push(Pending {
            offset_bytes: at,
            bytes: stored,
            fua,
        });
        Ok(())
    }

    fn flush(&self) -> io::Result<()> {
        if !self.powered() {
            return Err(injected("power-off flush", &self.name));
        }
        let mut st = self.state.lock();
        let st = &mut *st;
        st.stats.flushes += 1;
        if Self::network_drop(st) {
            // The server may still have flushed; what is durable stays as it was either way.
            return Err(injected("network drop on flush", &self.name));
        }
        if st.dead {
            st.stats.errors_injected += 1;
            return Err(injected("flush", &self.name));
        }
        for w in std::mem::take(&mut st.pending) {
            let at = w.offset_bytes as usize;
            st.durable[at..at + w.bytes.len()].copy_from_slice(&w.bytes);
        }
        Ok(())
    }

    fn discard_zeroes(&self, offset_bytes: u64, len_bytes: u64) -> io::Result<()> {
        crate::file::write_zeroes(self, offset_bytes, len_bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flushed_writes_survive_power_cut_unflushed_may_not() {
        let dev = SimDevice::new("sim0", 64 * 1024, 7);
        dev.write_at(&[1u8; 4096], 0, false).unwrap();
        dev.flush().unwrap();
        dev.write_at(&[2u8; 4096], 8192, true).unwrap();
        for i in 0..16u64 {
            dev.write_at(&[3u8; 1024], 16384 + i * 1024, false).unwrap();
        }
        dev.power_cut();
        let img = dev.contents();
        assert!(img[..4096].iter().all(|&b| b == 1));
        assert!(img[8192..12288].iter().all(|&b| b == 2));
        let survived = img[16384..32768].iter().filter(|&&b| b == 3).count();
        assert!(
            survived > 0 && survived < 16384,
            "seed 7 should keep some, lose some: {survived}"
        );
    }

    #[test]
    fn same_seed_same_faults() {
        let run = |seed| {
            let dev = SimDevice::new("sim", 1 << 20, seed);
            dev.set_faults(Faults {
                write_error: 0.1,
                lost_write: 0.1,
                misdirected_write: 0.1,
                bit_rot: 0.1,
                ..Faults::default()
            });
            let results: Vec<bool> = (0..200u64)
                .map(|i| dev.write_at(&[i as u8; 512], (i % 64) * 512, false).is_ok())
                .collect();
            (results, dev.contents(), dev.stats())
        };
        assert_eq!(run(42).0, run(42).0);
        assert_eq!(run(42).1, run(42).1);
        assert_eq!(run(42).2, run(42).2);
        assert_ne!(run(42).1, run(43).1);
        let stats = run(42).2;
        assert!(
            stats.errors_injected > 0
                && stats.writes_lost > 0
                && stats.writes_misdirected > 0
                && stats.bits_flipped > 0
        );
    }

    #[test]
    fn rail_cuts_power_after_the_armed_count_and_loses_unflushed_writes() {
        let rail = PowerRail::new();
        let dev = SimDevice::new("sim", 64 * 1024, 3).on_rail(rail.clone());
        dev.write_at(&[1u8; 4096], 0, false).unwrap();
        dev.flush().unwrap();
        rail.cut_after(1);
        dev.write_at(&[2u8; 4096], 4096, false).unwrap();
        assert!(!rail.is_off());
        assert!(dev.write_at(&[3u8; 4096], 8192, true).is_err());
        assert!(rail.is_off());
        assert!(dev.read_at(&mut [0u8; 512], 0).is_err());
        dev.power_cut();
        rail.restore();
        let img = dev.contents();
        assert!(img[..4096].iter().all(|&b| b == 1), "flushed write kept");
        assert!(
            img[8192..12288].iter().all(|&b| b == 0),
            "call after the cut never happened"
        );
    }

    #[test]
    fn fua_does_not_make_earlier_unflushed_writes_durable() {
        let mut lost = 0;
        for seed in 0..20 {
            let dev = SimDevice::new("sim", 64 * 1024, seed);
            dev.write_at(&[5u8; 4096], 0, false).unwrap();
            dev.write_at(&[6u8; 512], 8192, true).unwrap();
            dev.power_cut();
            let img = dev.contents();
            assert!(img[8192..8704].iter().all(|&b| b == 6), "FUA write kept");
            lost += usize::from(img[..4096].iter().any(|&b| b != 5));
        }
        assert!(
            lost > 0,
            "an unflushed write before a FUA must be able to vanish"
        );
    }

    #[test]
    fn unreadable_sector_fails_reads_until_written() {
        let dev = SimDevice::new("sim", 64 * 1024, 1);
        dev.set_unreadable(8192, 4096);
        assert!(dev.read_at(&mut [0u8; 4096], 4096).is_ok());
        assert!(dev.read_at(&mut [0u8; 512], 8192 + 3584).is_err());
        dev.write_at(&[7u8; 4096], 8192, false).unwrap();
        assert_eq!(dev.unreadable_sectors(), 0);
        assert!(dev.read_at(&mut [0u8; 4096], 8192).is_ok());
    }

    /// Past the first drop every call fails; the write it caught is one of: absent, whole, a
    /// prefix; all three show up across seeds.
    #[test]
    fn a_network_drop_kills_the_device_and_leaves_the_write_unknown() {
        let mut seen = [false; 3];
        for seed in 0..64 {
            let dev = SimDevice::new("net", 1 << 16, seed);
            dev.set_faults(Faults {
                network_drop: 1.0,
                ..Faults::default()
            });
            assert!(dev.write_at(&[7u8; 4096], 0, false).is_err());
            let got = dev.contents()[..4096]
                .iter()
                .take_while(|&&b| b == 7)
                .count();
            assert!(got % 512 == 0, "landed {got} bytes: not whole sectors");
            seen[match got {
                0 => 0,
                4096 => 1,
                _ => 2,
            }] = true;
            dev.set_faults(Faults::default());
            assert!(
                dev.read_at(&mut [0u8; 512], 0).is_err(),
                "dead after the drop"
            );
            assert!(dev.flush().is_err());
            assert_eq!(dev.stats().network_drops, 1);
        }
        assert_eq!(seen, [true; 3], "absent, whole and partial outcomes");
    }

    #[test]
    fn dead_device_fails_everything() {
        let dev = SimDevice::new("sim", 8192, 1);
        dev.set_dead(true);
        assert!(dev.read_at(&mut [0u8; 512], 0).is_err());
        assert!(dev.write_at(&[0u8; 512], 0, false).is_err());
        assert!(dev.flush().is_err());
    }
}
