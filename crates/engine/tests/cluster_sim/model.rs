//! What the array may hold, sector by sector, given which writes were acknowledged when.
//!
//! Writes of different nodes overlap in time. A sector written by two writes whose lifetimes
//! overlapped holds either's bytes afterwards; one written by a write that ended before
//! another began holds the later one's. A read may return, per sector, what the sector could
//! hold when the read began or the bytes of any write that ran during the read. A write whose
//! node died never ends: at the death each sector it covered may hold its bytes or what it
//! held before.

use std::collections::HashMap;
use std::sync::Arc;

const SECTOR: usize = 512;

struct Write {
    at: u64,
    data: Arc<Vec<u8>>,
    /// Writes that ended (or died) while this one ran.
    ended_during: Vec<usize>,
}

struct Read {
    at: u64,
    len: usize,
    /// What each sector could hold when the read began.
    before: Vec<Vec<Vec<u8>>>,
    /// Writes that ran during the read.
    during: Vec<usize>,
}

#[derive(Default)]
pub struct Model {
    /// The newest acknowledged bytes of every sector.
    bytes: Vec<u8>,
    /// Other bytes a sector may hold.
    alts: HashMap<u64, Vec<Vec<u8>>>,
    writes: HashMap<usize, Write>,
    running: Vec<usize>,
    reads: HashMap<usize, Read>,
}

impl Model {
    pub fn new(size: u64) -> Model {
        Model {
            bytes: vec![0; size as usize],
            ..Model::default()
        }
    }

    /// What sector `s` may hold now.
    fn candidates(&self, s: u64) -> Vec<Vec<u8>> {
        let at = s as usize * SECTOR;
        let mut v = vec![self.bytes[at..at + SECTOR].to_vec()];
        v.extend(self.alts.get(&s).into_iter().flatten().cloned());
        v
    }

    fn sector_of(w: &Write, s: u64) -> Option<&[u8]> {
        let first = w.at / SECTOR as u64;
        let n = (w.data.len() / SECTOR) as u64;
        (first..first + n)
            .contains(&s)
            .then(|| &w.data[(s - first) as usize * SECTOR..][..SECTOR])
    }

    pub fn write_started(&mut self, id: usize, at: u64, data: Arc<Vec<u8>>) {
        for r in self.reads.values_mut() {
            r.during.push(id);
        }
        self.writes.insert(
            id,
            Write {
                at,
                data,
                ended_during: Vec::new(),
            },
        );
        self.running.push(id);
    }

    /// The write was acknowledged.
    pub fn write_ended(&mut self, id: usize) {
        self.running.retain(|&w| w != id);
        let w = &self.writes[&id];
        let first = w.at / SECTOR as u64;
        for s in first..first + (w.data.len() / SECTOR) as u64 {
            let mine = Self::sector_of(w, s).expect("covered").to_vec();
            let mut alts: Vec<Vec<u8>> = w
                .ended_during
                .iter()
                .filter_map(|o| Self::sector_of(&self.writes[o], s))
                .filter(|b| *b != mine.as_slice())
                .map(|b| b.to_vec())
                .collect();
            alts.dedup();
            let at = s as usize * SECTOR;
            self.bytes[at..at + SECTOR].copy_from_slice(&mine);
            if alts.is_empty() {
                self.alts.remove(&s);
            } else {
                self.alts.insert(s, alts);
            }
        }
        self.ended(id);
    }

    fn ended(&mut self, id: usize) {
        for r in &self.running {
            self.writes
                .get_mut(r)
                .expect("running")
                .ended_during
                .push(id);
        }
    }

    /// The node running write `id` died: each sector it covered may hold its bytes or not.
    pub fn write_died(&mut self, id: usize) {
        self.running.retain(|&w| w != id);
        let w = &self.writes[&id];
        let first = w.at / SECTOR as u64;
        for s in first..first + (w.data.len() / SECTOR) as u64 {
            let b = Self::sector_of(w, s).expect("covered").to_vec();
            if !self.candidates(s).contains(&b) {
                self.alts.entry(s).or_default().push(b);
            }
        }
        self.ended(id);
    }

    pub fn read_started(&mut self, id: usize, at: u64, len: usize) {
        let first = at / SECTOR as u64;
        let before = (first..first + (len / SECTOR) as u64)
            .map(|s| self.candidates(s))
            .collect();
        self.reads.insert(
            id,
            Read {
                at,
                len,
                before,
                during: self.running.clone(),
            },
        );
    }

    /// Read `id` returned `got`: None if every sector is possible, else why not.
    pub fn read_ended(&mut self, id: usize, got: &[u8]) -> Option<String> {
        let r = self.reads.remove(&id).expect("read started");
        assert_eq!(got.len(), r.len);
        let first = r.at / SECTOR as u64;
        for (i, b) in got.chunks(SECTOR).enumerate() {
            let s = first + i as u64;
            let possible = r.before[i].iter().any(|c| c == b)
                || r.during
                    .iter()
                    .any(|w| Self::sector_of(&self.writes[w], s) == Some(b));
            if !possible {
                return Some(format!(
                    "sector {s} (array byte {}) read {:02x?}.., which no write put there (it may hold {} values, first {:02x?}..)",
                    s * SECTOR as u64,
                    &b[..8],
                    r.before[i].len(),
                    &r.before[i][0][..8]
                ));
            }
        }
        None
    }

    /// Read `id` returned no data (refused).
    pub fn read_dropped(&mut self, id: usize) {
        self.reads.remove(&id).expect("read started");
    }

    /// A read with no write running: `got` (the whole array from 0) must be possible.
    pub fn check_quiet(&self, got: &[u8]) -> Option<String> {
        assert!(self.running.is_empty());
        for (s, b) in got.chunks(SECTOR).enumerate() {
            if !self.candidates(s as u64).iter().any(|c| c == b) {
                return Some(format!(
                    "sector {s} (array byte {}) holds {:02x?}.., which no acknowledged write put there",
                    s * SECTOR,
                    &b[..8]
                ));
            }
        }
        None
    }
}
