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
}

/// In-memory member with seeded fault injection.
pub struct SimDevice {
    name: String,
    len_bytes: u64,
    state: Mutex<State>,
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
            }),
        }
    }

    /// Replace the fault probabilities from now on.
    pub fn set_faults(&self, faults: Faults) {
        self.state.lock().faults = faults;
    }

    /// Kill (or revive) the device: while dead every call fails.
    pub fn set_dead(&self, dead: bool) {
        self.state.lock().dead = dead;
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
        let mut st = self.state.lock();
        let st = &mut *st;
        st.stats.reads += 1;
        if st.dead || (st.faults.read_error > 0.0 && st.rng.gen_bool(st.faults.read_error)) {
            st.stats.errors_injected += 1;
            return Err(injected("read", &self.name));
        }
        let at = offset_bytes as usize;
        buf.copy_from_slice(&st.data[at..at + buf.len()]);
        Ok(())
    }

    fn write_at(&self, buf: &[u8], offset_bytes: u64, fua: bool) -> io::Result<()> {
        check_range(self, offset_bytes, buf.len() as u64);
        let mut st = self.state.lock();
        let st = &mut *st;
        st.stats.writes += 1;
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
        let mut st = self.state.lock();
        let st = &mut *st;
        st.stats.flushes += 1;
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
    fn dead_device_fails_everything() {
        let dev = SimDevice::new("sim", 8192, 1);
        dev.set_dead(true);
        assert!(dev.read_at(&mut [0u8; 512], 0).is_err());
        assert!(dev.write_at(&[0u8; 512], 0, false).is_err());
        assert!(dev.flush().is_err());
    }
}
