//! The third read outcome: a member answers, but with data a [`ReadVerifier`] rejects (what the
//! integrity layer will report). Every read path must then serve the bytes from redundancy, and
//! fail the request when redundancy cannot cover it, never return the rejected data.
//!
//! The verifier here knows which member ranges were scribbled over behind the array's back.

use device::{Device, SimDevice};
use engine::{assemble, Array, ArrayConfig, AssembleOptions, ReadVerifier};
use layout::Level;
use parking_lot::Mutex;
use std::sync::Arc;

const MEMBER_BYTES: u64 = 4 << 20;
const CHUNK: u64 = 64 << 10;

/// Rejects reads that overlap a scribbled range of a member (data-area bytes).
#[derive(Debug, Default)]
struct KnownBad {
    ranges: Mutex<Vec<(String, u64, u64)>>,
}

impl ReadVerifier for KnownBad {
    fn verify(&self, member: &str, _role: usize, offset_bytes: u64, buf: &[u8]) -> bool {
        let end = offset_bytes + buf.len() as u64;
        !self
            .ranges
            .lock()
            .iter()
            .any(|(m, a, b)| m == member && *a < end && offset_bytes < *b)
    }
}

struct Rig {
    sims: Vec<Arc<SimDevice>>,
    array: Array,
    bad: Arc<KnownBad>,
    data_offset: u64,
}

fn rig(level: Level, n: usize) -> Rig {
    let sims: Vec<Arc<SimDevice>> = (0..n)
        .map(|i| Arc::new(SimDevice::new(format!("m{i}"), MEMBER_BYTES, i as u64)))
        .collect();
    let devs =
        || -> Vec<Arc<dyn Device>> { sims.iter().map(|s| s.clone() as Arc<dyn Device>).collect() };
    let created = simkit::create_clean("verify", level, None, CHUNK, devs(), vec![]);
    let bad = Arc::new(KnownBad::default());
    let array = assemble(
        devs(),
        AssembleOptions {
            name: None,
            config: ArrayConfig {
                read_verifier: Some(bad.clone()),
                ..ArrayConfig::default()
            },
            ..AssembleOptions::default()
        },
    )
    .expect("assemble");
    Rig {
        sims,
        array,
        bad,
        data_offset: created.data_offset_sectors * 512,
    }
}

impl Rig {
    /// Overwrite `len` bytes of member `m`'s data area at `at` with garbage, and tell the
    /// verifier (as checksums would).
    fn rot(&self, m: usize, at: u64, len: u64) {
        self.sims[m].scribble(self.data_offset + at, &vec![0xa5; len as usize]);
        self.bad.ranges.lock().push((format!("m{m}"), at, at + len));
    }

    fn fill(&self) -> Vec<u8> {
        let data: Vec<u8> = (0..self.array.size_bytes())
            .map(|i| (i * 31 % 251) as u8)
            .collect();
        self.array.write(0, &data, false).expect("fill");
        data
    }

    fn read_all(&self) -> engine::Result<Vec<u8>> {
        let mut buf = vec![0u8; self.array.size_bytes() as usize];
        self.array.read(0, &mut buf).map(|()| buf)
    }
}

#[test]
fn corrupt_reads_are_served_from_redundancy_on_every_redundant_level() {
    for (level, n) in [
        (Level::Raid1, 2),
        (Level::Raid10, 4),
        (Level::Raid4, 4),
        (Level::Raid5, 4),
        (Level::Raid6, 5),
    ] {
        let r = rig(level, n);
        let data = r.fill();
        r.rot(1, 0, CHUNK);
        r.rot(0, 3 * CHUNK + 4096, 4096);
        assert!(
            r.read_all().expect("readable from redundancy") == data,
            "{level:?}: corrupt member data reached the client"
        );
    }
}

#[test]
fn raid6_rebuilds_two_corrupt_chunks_of_one_stripe() {
    let r = rig(Level::Raid6, 6);
    let data = r.fill();
    r.rot(0, 0, CHUNK);
    r.rot(3, 0, CHUNK);
    assert!(r.read_all().expect("two losses are within RAID6") == data);
}

#[test]
fn corruption_beyond_redundancy_is_an_error_not_data() {
    for (level, n, victims) in [
        (Level::Raid0, 2, vec![1]),
        (Level::Raid5, 4, vec![0, 2]),
        (Level::Raid6, 5, vec![0, 1, 2]),
        (Level::Raid1, 2, vec![0, 1]),
    ] {
        let r = rig(level, n);
        r.fill();
        for v in victims {
            r.rot(v, 0, 4096);
        }
        let mut buf = vec![0u8; CHUNK as usize * 4];
        assert!(
            r.array.read(0, &mut buf).is_err(),
            "{level:?}: a read the verifier rejected everywhere returned data"
        );
    }
}

#[test]
fn writes_into_a_stripe_with_a_corrupt_chunk_keep_its_data() {
    for (level, n) in [(Level::Raid5, 4), (Level::Raid6, 5), (Level::Raid4, 4)] {
        let r = rig(level, n);
        let mut data = r.fill();
        // Corrupt one chunk, then write a small piece elsewhere in the same stripe: the parity
        // update must be computed from the good data, not the rejected chunk.
        r.rot(1, 0, CHUNK);
        let piece = vec![0x5au8; 4096];
        r.array.write(8192, &piece, false).expect("write");
        data[8192..8192 + 4096].copy_from_slice(&piece);
        assert!(r.read_all().expect("readable") == data, "{level:?}");
    }
}
