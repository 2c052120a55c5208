//! A seeded random client workload (writes, reads, flushes, members dying within the level's
//! tolerance) and the plain model of the logical disk its reads are checked against.

use crate::array::SimArray;
use rand::Rng;
use rand_chacha::ChaCha8Rng;

/// The plain in-memory model of the logical disk and the one comparison the workload makes:
/// every read, and the final image, must equal it byte for byte.
pub struct DiskModel {
    bytes: Vec<u8>,
}

impl DiskModel {
    pub fn new(size_bytes: u64) -> DiskModel {
        DiskModel {
            bytes: vec![0u8; size_bytes as usize],
        }
    }

    /// The client wrote `data` at `offset_bytes`.
    pub fn write(&mut self, offset_bytes: u64, data: &[u8]) {
        let at = offset_bytes as usize;
        self.bytes[at..at + data.len()].copy_from_slice(data);
    }

    /// `got` was read at `offset_bytes`: it must be what the model holds there.
    pub fn check(&self, offset_bytes: u64, got: &[u8], what: &str) {
        let at = offset_bytes as usize;
        let want = &self.bytes[at..at + got.len()];
        if let Some(i) = got.iter().zip(want).position(|(g, w)| g != w) {
            panic!(
                "{what}: read {offset_bytes}+{} differs from model at byte {} ({:#04x}, model {:#04x})",
                got.len(),
                offset_bytes + i as u64,
                got[i],
                want[i]
            );
        }
    }

    /// Read the whole array and check it.
    pub fn check_array(&self, array: &engine::Array) {
        let mut all = vec![0u8; self.bytes.len()];
        array.read(0, &mut all).expect("final read");
        self.check(0, &all, "final image");
    }
}

/// `steps` random operations (60% writes, 30% reads checked against `model`, 10% flushes),
/// killing members (within the level's tolerance) at the chosen steps. Returns the killed ones.
pub fn run_workload(
    sa: &SimArray,
    model: &mut DiskModel,
    rng: &mut ChaCha8Rng,
    steps: usize,
    kill_at: &[usize],
) -> Vec<usize> {
    let size = sa.array.size_bytes();
    let n = sa.sims.len();
    let mut failed = Vec::new();
    for step in 0..steps {
        if kill_at.contains(&step) {
            let mut victims: Vec<usize> = (0..n).filter(|i| !failed.contains(i)).collect();
            victims.retain(|&v| {
                let mut f = vec![false; n];
                for &x in failed.iter().chain(std::iter::once(&v)) {
                    f[x] = true;
                }
                sa.array.geometry().survives(&f)
            });
            if let Some(&v) = victims.get(
                rng.gen_range(0..victims.len().max(1))
                    .min(victims.len().saturating_sub(1)),
            ) {
                sa.sims[v].set_dead(true);
                failed.push(v);
            }
        }
        let max_sectors = (size / 512).min(1024);
        let len = rng.gen_range(1..=max_sectors) * 512;
        let off = rng.gen_range(0..=(size - len) / 512) * 512;
        match rng.gen_range(0..10) {
            0..=4 => {
                let data: Vec<u8> = (0..len).map(|_| rng.gen()).collect();
                sa.array
                    .write(off, &data, rng.gen_bool(0.1))
                    .unwrap_or_else(|e| panic!("write {off}+{len}: {e}"));
                model.write(off, &data);
            }
            5..=8 => {
                let mut buf = vec![0u8; len as usize];
                sa.array
                    .read(off, &mut buf)
                    .unwrap_or_else(|e| panic!("read {off}+{len}: {e}"));
                model.check(off, &buf, &format!("step {step}"));
            }
            _ => sa.array.flush().expect("flush"),
        }
    }
    failed
}
