//! An independent oracle for member images: where md puts data, parity and copies, and whether
//! redundancy agrees, computed without the engine's `layout` or `parity` crates. Placement comes
//! from the grid-filling reference model of the layout tests (written from md-format.md's prose,
//! in a different style from the crate); parity is computed byte by byte here, Q with a
//! shift-and-add GF(2⁸) multiply over md's polynomial 0x11d.

use crate::md_model::{self, Cell};

/// md's RAID levels as the superblock numbers them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Level {
    Raid1,
    Raid4,
    Raid5,
    Raid6,
    Raid10,
}

/// What the oracle needs to know of an array: level, layout, members, chunk and per-member
/// data size (md's `size`, in bytes).
#[derive(Clone, Copy, Debug)]
pub struct Shape {
    pub level: Level,
    pub layout: u32,
    pub members: usize,
    pub chunk_bytes: usize,
    pub member_data_bytes: usize,
}

fn gf_mul(mut a: u8, mut b: u8) -> u8 {
    let mut out = 0u8;
    while b != 0 {
        if b & 1 != 0 {
            out ^= a;
        }
        let carry = a & 0x80 != 0;
        a <<= 1;
        if carry {
            a ^= 0x1d;
        }
        b >>= 1;
    }
    out
}

fn gf_pow2(n: usize) -> u8 {
    (0..n).fold(1u8, |acc, _| gf_mul(acc, 2))
}

impl Shape {
    fn md_level(&self) -> u32 {
        match self.level {
            Level::Raid4 => 4,
            Level::Raid5 => 5,
            Level::Raid6 => 6,
            _ => unreachable!("not a parity level"),
        }
    }

    fn data_disks(&self) -> usize {
        match self.level {
            Level::Raid4 | Level::Raid5 => self.members - 1,
            Level::Raid6 => self.members - 2,
            _ => unreachable!("not a parity level"),
        }
    }

    fn stripes(&self) -> usize {
        self.member_data_bytes / self.chunk_bytes
    }

    /// Array size in bytes.
    pub fn array_bytes(&self) -> usize {
        match self.level {
            Level::Raid1 => self.member_data_bytes,
            Level::Raid10 => self.raid10().array_chunks as usize * self.chunk_bytes,
            _ => self.stripes() * self.data_disks() * self.chunk_bytes,
        }
    }

    fn raid10(&self) -> md_model::Raid10Model {
        let near = (self.layout & 0xff) as usize;
        let far = ((self.layout >> 8) & 0xff) as usize;
        let offset = self.layout & 0x10000 != 0;
        md_model::raid10_model(
            self.members,
            near,
            far,
            offset,
            (self.member_data_bytes / self.chunk_bytes) as u64,
        )
    }

    /// The array's content as the members' data areas (`images[role]`) hold it: for parity
    /// levels the data chunks, for mirrors the first copy.
    pub fn array_image(&self, images: &[&[u8]]) -> Vec<u8> {
        let c = self.chunk_bytes;
        let mut out = vec![0u8; self.array_bytes()];
        match self.level {
            Level::Raid1 => out.copy_from_slice(&images[0][..self.member_data_bytes]),
            Level::Raid10 => {
                for (chunk, copies) in self.raid10().copies.iter().enumerate() {
                    let (dev, row) = copies[0];
                    let at = row as usize * c;
                    out[chunk * c..(chunk + 1) * c].copy_from_slice(&images[dev][at..at + c]);
                }
            }
            _ => {
                for s in 0..self.stripes() {
                    let row =
                        md_model::parity_row(self.md_level(), self.layout, self.members, s as u64);
                    for (dev, cell) in row.iter().enumerate() {
                        if let Cell::D(x) = cell {
                            let x = *x as usize;
                            out[x * c..(x + 1) * c]
                                .copy_from_slice(&images[dev][s * c..(s + 1) * c]);
                        }
                    }
                }
            }
        }
        out
    }

    /// Where redundancy disagrees with the data: a description of the first place, or None.
    /// `present[role]` false: that member is missing and not compared.
    pub fn first_inconsistency(&self, images: &[&[u8]], present: &[bool]) -> Option<String> {
        let c = self.chunk_bytes;
        match self.level {
            Level::Raid1 => {
                let live: Vec<usize> = (0..self.members).filter(|&d| present[d]).collect();
                let first = live.first()?;
                let len = self.member_data_bytes;
                live.iter()
                    .find(|&&d| images[d][..len] != images[*first][..len])
                    .map(|d| format!("RAID1 member {d} differs from member {first}"))
            }
            Level::Raid10 => {
                for (chunk, copies) in self.raid10().copies.iter().enumerate() {
                    let live: Vec<&(usize, u64)> =
                        copies.iter().filter(|(dev, _)| present[*dev]).collect();
                    let Some(&&(d0, r0)) = live.first() else {
                        continue;
                    };
                    let a = &images[d0][r0 as usize * c..][..c];
                    for &&(d, r) in &live[1..] {
                        if images[d][r as usize * c..][..c] != *a {
                            return Some(format!(
                                "RAID10 chunk {chunk}: copy on member {d} differs from member {d0}"
                            ));
                        }
                    }
                }
                None
            }
            _ => {
                if present.iter().any(|p| !p) {
                    return None;
                }
                for s in 0..self.stripes() {
                    let row =
                        md_model::parity_row(self.md_level(), self.layout, self.members, s as u64);
                    let syndromes = (self.level == Level::Raid6).then(|| md_model::syndromes(&row));
                    let mut p = vec![0u8; c];
                    let mut q = vec![0u8; c];
                    for (dev, cell) in row.iter().enumerate() {
                        if let Cell::D(_) = cell {
                            let chunk = &images[dev][s * c..(s + 1) * c];
                            let g = syndromes
                                .as_ref()
                                .map(|sl| gf_pow2(sl[dev].expect("data syndrome index")));
                            for i in 0..c {
                                p[i] ^= chunk[i];
                                if let Some(g) = g {
                                    q[i] ^= gf_mul(g, chunk[i]);
                                }
                            }
                        }
                    }
                    for (dev, cell) in row.iter().enumerate() {
                        let (want, name) = match cell {
                            Cell::P => (&p, "P"),
                            Cell::Q => (&q, "Q"),
                            _ => continue,
                        };
                        if images[dev][s * c..(s + 1) * c] != want[..] {
                            return Some(format!("stripe {s}: {name} on member {dev} disagrees"));
                        }
                    }
                }
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{gf_mul, gf_pow2};

    #[test]
    fn oracle_gf_matches_known_products() {
        // 2^8 reduces by 0x11d: 0x80 * 2 = 0x1d.
        assert_eq!(gf_mul(0x80, 2), 0x1d);
        assert_eq!(gf_pow2(8), 0x1d);
        assert_eq!(gf_mul(0x53, 0xca), gf_mul(0xca, 0x53));
        assert_eq!(gf_mul(7, 1), 7);
    }
}
