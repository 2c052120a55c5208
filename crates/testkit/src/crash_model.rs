//! A sector-granular model of what an array may hold after a power cut: per sector, the data
//! known durable (flushed, or written FUA) and the hashes of the writes issued since, any of
//! which may have landed whole or not at all. Shared by the crash tests.

/// A sector-granular model of what the array may hold after a power cut: per sector, the data
/// known durable and the hashes of writes since (any of which may have landed).
pub struct CrashModel {
    pub current: Vec<u8>,
    durable: Vec<u8>,
    candidates: Vec<Vec<u64>>,
}

fn hash(s: &[u8]) -> u64 {
    s.iter().fold(0xcbf29ce484222325u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x100000001b3)
    })
}

impl CrashModel {
    pub fn new(image: Vec<u8>) -> CrashModel {
        let sectors = image.len() / 512;
        CrashModel {
            current: image.clone(),
            durable: image,
            candidates: vec![Vec::new(); sectors],
        }
    }

    /// A write is about to be issued: any of its sectors may land from now on.
    pub fn issue(&mut self, off: usize, data: &[u8]) {
        for (i, sector) in data.chunks(512).enumerate() {
            self.candidates[off / 512 + i].push(hash(sector));
        }
    }

    /// The write completed (durable if FUA).
    pub fn complete(&mut self, off: usize, data: &[u8], fua: bool) {
        self.current[off..off + data.len()].copy_from_slice(data);
        if fua {
            for (i, sector) in data.chunks(512).enumerate() {
                let s = off / 512 + i;
                self.durable[s * 512..(s + 1) * 512].copy_from_slice(sector);
                // Writes issued before this one can no longer win over it.
                self.candidates[s].clear();
            }
        }
    }

    pub fn flushed(&mut self) {
        for (s, c) in self.candidates.iter_mut().enumerate() {
            if !c.is_empty() {
                self.durable[s * 512..(s + 1) * 512]
                    .copy_from_slice(&self.current[s * 512..(s + 1) * 512]);
                c.clear();
            }
        }
    }

    /// What survived must be, per sector, the durable data or one of the later writes.
    pub fn check(&self, got: &[u8]) -> Result<(), String> {
        for (s, c) in self.candidates.iter().enumerate() {
            let sector = &got[s * 512..(s + 1) * 512];
            if sector != &self.durable[s * 512..(s + 1) * 512] && !c.contains(&hash(sector)) {
                return Err(format!(
                    "array sector {s}: neither the flushed data nor a later write ({} later writes; \
                     read {:02x?}…, flushed {:02x?}…)",
                    c.len(),
                    &sector[..8],
                    &self.durable[s * 512..s * 512 + 8]
                ));
            }
        }
        Ok(())
    }

    /// Array byte ranges (sorted, merged) of sectors written since they were last durable:
    /// where writes may have been in flight at a cut (what a perfect guide names).
    pub fn in_flight_ranges(&self) -> Vec<(u64, u64)> {
        let mut out: Vec<(u64, u64)> = Vec::new();
        for (s, c) in self.candidates.iter().enumerate() {
            if c.is_empty() {
                continue;
            }
            let at = s as u64 * 512;
            match out.last_mut() {
                Some((off, len)) if *off + *len == at => *len += 512,
                _ => out.push((at, 512)),
            }
        }
        out
    }

    /// Whether a write to any sector of `off..off + len` was in flight (issued since the data
    /// there was last durable).
    pub fn in_flight(&self, off: usize, len: usize) -> bool {
        self.candidates[off / 512..(off + len).div_ceil(512)]
            .iter()
            .any(|c| !c.is_empty())
    }

    /// After recovery the image is the new durable truth.
    pub fn settle(&mut self, image: Vec<u8>) {
        self.current.clone_from(&image);
        self.durable = image;
        self.candidates.iter_mut().for_each(Vec::clear);
    }
}

#[cfg(test)]
mod tests {
    use super::CrashModel;

    /// Canary: the crash model rejects a sector that is neither flushed nor a later write.
    #[test]
    fn crash_model_canary() {
        let mut model = CrashModel::new(vec![0u8; 4096]);
        model.issue(512, &[7u8; 512]);
        let mut disk = vec![0u8; 4096];
        assert!(model.check(&disk).is_ok());
        disk[512..1024].fill(7);
        assert!(model.check(&disk).is_ok());
        disk[2048] = 1;
        assert!(model.check(&disk).is_err(), "accepted a corrupted sector");
    }
}
