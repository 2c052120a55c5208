//! The ext4 guide of a guided resync (pure, no I/O): from the bytes of a device holding an ext4
//! file system, find its internal journal (jbd2), scan the log with jbd2's recovery rules and
//! compute the *verify set*: the byte ranges that may have had writes in flight at a crash,
//! when ext4 runs with `data=journal` (study: `shared/reference/guided-resync.md` §1, §3).
//!
//! The set: fs block 0 (the primary superblock) and the jbd2 superblock; the MMP block; the
//! inode tables of groups lazy init has not zeroed yet; the home blocks of *every* committed
//! transaction still in the log (jbd2 writes later transactions home before earlier ones are
//! checkpointed); and the log window from the last good commit block through one maximal
//! transaction past it (or, with an empty log, one maximal transaction from `s_head` and from
//! `s_first`). ext4 is little-endian, jbd2 big-endian.

use crate::journal::crc32c_raw;

/// Why the journal cannot guide the resync (the gate).
#[derive(Debug, thiserror::Error, PartialEq, Eq, Clone)]
pub enum GuideRefusal {
    #[error("no ext4 file system at the start of the array")]
    NotExt4,
    #[error("the file system has no journal")]
    NoJournal,
    #[error("the file system's journal is on another device")]
    ExternalJournal,
    #[error("unsupported feature: {0}")]
    UnsupportedFeature(String),
    #[error(
        "the file system does not declare data=journal (tune2fs -o journal_data); only then \
         does its journal name every write in flight"
    )]
    NotDataJournal,
    #[error(
        "the file system was not mounted at the crash (needs_recovery clear): some other writer \
         was active"
    )]
    NotMounted,
    #[error("corrupt: {0}")]
    Corrupt(String),
    #[error("cannot read the device: {0}")]
    Io(String),
}

/// What the journal says may have been in flight.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VerifySet {
    /// Sorted, merged byte ranges `(offset, length)` of the device, in whole fs blocks.
    pub ranges: Vec<(u64, u64)>,
    pub block_size: u32,
    /// `s_maxlen`, in blocks.
    pub journal_blocks: u64,
    pub journal_bytes: u64,
    /// Committed transactions found in the log.
    pub transactions: usize,
    /// Distinct home blocks their tags name.
    pub home_blocks: u64,
    /// Log blocks in the head window.
    pub window_blocks: u64,
    pub needs_recovery: bool,
    pub sequence_first: u32,
    /// Tid of the last committed transaction found.
    pub sequence_last: Option<u32>,
    pub data_journal_declared: bool,
}

impl VerifySet {
    pub fn total_bytes(&self) -> u64 {
        self.ranges.iter().map(|r| r.1).sum()
    }
}

pub struct GuideOptions {
    /// Refuse unless the superblock declares data=journal.
    pub require_data_journal: bool,
}

/// Reads `buf.len()` bytes at a byte offset of the device.
pub type Read<'a> = dyn FnMut(u64, &mut [u8]) -> Result<(), String> + 'a;

const EXT4_MAGIC: u16 = 0xEF53;
const JBD2_MAGIC: u32 = 0xC03B_3998;
const COMPAT_HAS_JOURNAL: u32 = 0x4;
const INCOMPAT_RECOVER: u32 = 0x4;
const INCOMPAT_JOURNAL_DEV: u32 = 0x8;
const INCOMPAT_META_BG: u32 = 0x10;
const INCOMPAT_64BIT: u32 = 0x80;
const INCOMPAT_MMP: u32 = 0x100;
const INCOMPAT_ENCRYPT: u32 = 0x10000;
const RO_GDT_CSUM: u32 = 0x10;
const RO_METADATA_CSUM: u32 = 0x400;
const BG_INODE_ZEROED: u16 = 0x4;
const JBD2_REVOKE: u32 = 0x1;
const JBD2_64BIT: u32 = 0x2;
const JBD2_ASYNC_COMMIT: u32 = 0x4;
const JBD2_CSUM_V2: u32 = 0x8;
const JBD2_CSUM_V3: u32 = 0x10;
const JBD2_FAST_COMMIT: u32 = 0x20;
const JBD2_KNOWN_INCOMPAT: u32 =
    JBD2_REVOKE | JBD2_64BIT | JBD2_ASYNC_COMMIT | JBD2_CSUM_V2 | JBD2_CSUM_V3 | JBD2_FAST_COMMIT;
const TAG_SAME_UUID: u32 = 0x2;
const TAG_LAST: u32 = 0x8;

fn le16(b: &[u8], o: usize) -> u16 {
    u16::from_le_bytes([b[o], b[o + 1]])
}
fn le32(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes(b[o..o + 4].try_into().expect("4 bytes"))
}
fn be16(b: &[u8], o: usize) -> u16 {
    u16::from_be_bytes([b[o], b[o + 1]])
}
fn be32(b: &[u8], o: usize) -> u32 {
    u32::from_be_bytes(b[o..o + 4].try_into().expect("4 bytes"))
}

fn corrupt(s: impl Into<String>) -> GuideRefusal {
    GuideRefusal::Corrupt(s.into())
}

/// The file system as far as the guide needs it.
struct Fs<'r, 'a> {
    read: &'r mut Read<'a>,
    device_bytes: u64,
    bs: u64,
    blocks: u64,
}

impl Fs<'_, '_> {
    fn block(&mut self, n: u64) -> Result<Vec<u8>, GuideRefusal> {
        if n >= self.blocks || (n + 1) * self.bs > self.device_bytes {
            return Err(corrupt(format!("block {n} lies past the end")));
        }
        let mut b = vec![0u8; self.bs as usize];
        (self.read)(n * self.bs, &mut b).map_err(GuideRefusal::Io)?;
        Ok(b)
    }
}

/// Contiguous runs of the journal: logical block, physical block, length.
type Runs = Vec<(u64, u64, u64)>;

/// An ext4 file system and its internal journal, as found on the device.
pub(crate) struct Located {
    pub bs: u64,
    /// Fs blocks that lie on the device.
    pub blocks: u64,
    /// The primary superblock (1024 bytes).
    pub sb: Vec<u8>,
    /// Fs block ranges `(first, count)` a guide always verifies: block 0 (and the superblock's
    /// block), the MMP block.
    pub fixed: Vec<(u64, u64)>,
    /// Inode tables lazy init has not zeroed yet (a guide verifies them too).
    pub lazy_tables: Vec<(u64, u64)>,
    /// The journal's logical-to-physical block runs.
    pub runs: Runs,
    /// Journal block 0.
    pub jsb: Vec<u8>,
    /// Journal blocks the journal inode maps.
    pub inode_blocks: u64,
    /// Bytes that fix where the journal is: `(fs block, offset in it, bytes)` for the journal
    /// inode's group descriptor entry, the journal inode, and its extent tree blocks.
    pub structure: Vec<(u64, usize, Vec<u8>)>,
    pub declared: bool,
    pub needs_recovery: bool,
}

impl Located {
    /// The physical block of journal block `n`.
    pub fn jmap(&self, n: u64) -> Result<u64, GuideRefusal> {
        self.runs
            .iter()
            .find(|r| r.0 <= n && n < r.0 + r.2)
            .map(|r| r.1 + (n - r.0))
            .ok_or_else(|| corrupt(format!("journal block {n} is not mapped")))
    }
}

/// Find the ext4 file system at the start of the device and its journal. `gate` sees whether
/// the superblock declares data=journal and whether the fs was mounted (needs_recovery) before
/// anything past the superblock is read.
pub(crate) fn locate(
    read: &mut Read<'_>,
    device_bytes: u64,
    gate: &dyn Fn(bool, bool) -> Result<(), GuideRefusal>,
) -> Result<Located, GuideRefusal> {
    if device_bytes < 2048 {
        return Err(GuideRefusal::NotExt4);
    }
    let mut sb = vec![0u8; 1024];
    read(1024, &mut sb).map_err(GuideRefusal::Io)?;
    if le16(&sb, 0x38) != EXT4_MAGIC {
        return Err(GuideRefusal::NotExt4);
    }
    let (compat, incompat, ro) = (le32(&sb, 0x5C), le32(&sb, 0x60), le32(&sb, 0x64));
    if ro & RO_METADATA_CSUM != 0 && crc32c_raw(!0, &sb[..0x3FC]) != le32(&sb, 0x3FC) {
        return Err(corrupt("ext4 superblock checksum mismatch"));
    }
    if incompat & INCOMPAT_JOURNAL_DEV != 0 {
        return Err(GuideRefusal::UnsupportedFeature(
            "this is an external journal device, not a file system".into(),
        ));
    }
    if compat & COMPAT_HAS_JOURNAL == 0 {
        return Err(GuideRefusal::NoJournal);
    }
    let journal_inum = le32(&sb, 0xE0);
    if journal_inum == 0 {
        return Err(GuideRefusal::ExternalJournal);
    }
    if incompat & INCOMPAT_ENCRYPT != 0 {
        return Err(GuideRefusal::UnsupportedFeature(
            "encrypt (encrypted files never journal their data)".into(),
        ));
    }
    if incompat & INCOMPAT_META_BG != 0 {
        return Err(GuideRefusal::UnsupportedFeature("meta_bg".into()));
    }
    let log_bs = le32(&sb, 0x18);
    if log_bs > 6 {
        return Err(corrupt(format!("block size 1024 << {log_bs}")));
    }
    let bs = 1024u64 << log_bs;
    let bit64 = incompat & INCOMPAT_64BIT != 0;
    let blocks = u64::from(le32(&sb, 0x04))
        | if bit64 {
            u64::from(le32(&sb, 0x150)) << 32
        } else {
            0
        };
    let declared = le32(&sb, 0x100) & 0x60 == 0x20
        || String::from_utf8_lossy(&sb[0x200..0x240]).contains("data=journal");
    let needs_recovery = incompat & INCOMPAT_RECOVER != 0;
    gate(declared, needs_recovery)?;
    let first_data = u64::from(le32(&sb, 0x14));
    let bpg = u64::from(le32(&sb, 0x20));
    let ipg = u64::from(le32(&sb, 0x28));
    let inode_size = if le32(&sb, 0x4C) >= 1 {
        u64::from(le16(&sb, 0x58))
    } else {
        128
    };
    let desc_size = if bit64 {
        u64::from(le16(&sb, 0xFE))
    } else {
        32
    };
    if bpg == 0
        || ipg == 0
        || inode_size < 128
        || inode_size > bs
        || !(32..=bs).contains(&desc_size)
    {
        return Err(corrupt("impossible group geometry"));
    }
    let mut fs = Fs {
        read,
        device_bytes,
        bs,
        blocks: blocks.min(device_bytes / bs),
    };
    let groups = fs.blocks.saturating_sub(first_data).div_ceil(bpg);
    if groups == 0 {
        return Err(corrupt("no block groups"));
    }
    let mut fixed: Vec<(u64, u64)> = Vec::new();
    let mut lazy_tables: Vec<(u64, u64)> = Vec::new();
    // Block 0 holds bytes 0..bs; with 1 KiB blocks the superblock is block 1.
    fixed.push((0, first_data + 1));
    if incompat & INCOMPAT_MMP != 0 {
        let mmp = u64::from(le32(&sb, 0x168)) | u64::from(le32(&sb, 0x16C)) << 32;
        fixed.push((mmp, 1));
    }

    // Group descriptors: the journal inode's group, and lazy-init inode tables.
    let descs_per_block = bs / desc_size;
    let gdt = first_data + 1;
    let parse = |blk: &[u8], g: u64| -> (u64, u16) {
        let o = ((g % descs_per_block) * desc_size) as usize;
        let mut table = u64::from(le32(blk, o + 0x08));
        if desc_size >= 64 {
            table |= u64::from(le32(blk, o + 0x28)) << 32;
        }
        (table, le16(blk, o + 0x12))
    };
    if ro & (RO_GDT_CSUM | RO_METADATA_CSUM) != 0 {
        let table_blocks = (ipg * inode_size).div_ceil(bs);
        if table_blocks > bpg {
            return Err(corrupt("inode tables larger than their groups"));
        }
        for first_g in (0..groups).step_by(descs_per_block as usize) {
            let blk = fs.block(gdt + first_g / descs_per_block)?;
            for g in first_g..(first_g + descs_per_block).min(groups) {
                let (table, flags) = parse(&blk, g);
                if flags & BG_INODE_ZEROED == 0 {
                    // ext4lazyinit zeroes these tables in place, outside the journal.
                    lazy_tables.push((table, table_blocks));
                }
            }
        }
    }
    let ino = u64::from(journal_inum);
    let g = (ino - 1) / ipg;
    let gd_block = gdt + g / descs_per_block;
    let gd = fs.block(gd_block)?;
    let (table, _) = parse(&gd, g);
    // Of the descriptor only where the inode table is (its counts and flags change).
    let gd_at = ((g % descs_per_block) * desc_size) as usize;
    let mut structure = vec![(
        gd_block,
        gd_at + 0x08,
        gd[gd_at + 0x08..gd_at + 0x0C].to_vec(),
    )];
    if desc_size >= 64 {
        structure.push((
            gd_block,
            gd_at + 0x28,
            gd[gd_at + 0x28..gd_at + 0x2C].to_vec(),
        ));
    }
    let at = table * bs + ((ino - 1) % ipg) * inode_size;
    let blk = fs.block(at / bs)?;
    let inode = &blk[(at % bs) as usize..(at % bs + inode_size.min(bs - at % bs)) as usize];
    if inode.len() < 0x70 {
        return Err(corrupt("journal inode crosses a block"));
    }
    // Size, flags and block map (not the times, which ext4 may touch).
    for (a, b) in [(0x04, 0x08), (0x20, 0x24), (0x28, 0x64), (0x6C, 0x70)] {
        structure.push((at / bs, (at % bs) as usize + a, inode[a..b].to_vec()));
    }
    let size = u64::from(le32(inode, 0x04)) | u64::from(le32(inode, 0x6C)) << 32;
    let mut tree = Vec::new();
    let runs = journal_runs(&mut fs, inode, &mut tree)?;
    structure.extend(tree.into_iter().map(|(b, bytes)| (b, 0, bytes)));
    let mut located = Located {
        bs,
        blocks: fs.blocks,
        sb,
        fixed,
        lazy_tables,
        runs,
        jsb: Vec::new(),
        inode_blocks: (size / bs).min(fs.blocks),
        structure,
        declared,
        needs_recovery,
    };
    located.jsb = fs.block(located.jmap(0)?)?;
    Ok(located)
}

/// Compute the verify set of the ext4 file system at the start of the device.
pub fn ext4_verify_set(
    read: &mut Read<'_>,
    device_bytes: u64,
    opts: &GuideOptions,
) -> Result<VerifySet, GuideRefusal> {
    let gate = |declared: bool, needs_recovery: bool| {
        if opts.require_data_journal && !declared {
            return Err(GuideRefusal::NotDataJournal);
        }
        if !needs_recovery {
            return Err(GuideRefusal::NotMounted);
        }
        Ok(())
    };
    let loc = locate(read, device_bytes, &gate)?;
    let mut set = [loc.fixed.as_slice(), &loc.lazy_tables].concat();
    set.push((loc.jmap(0)?, 1));
    let scan = scan(read, device_bytes, &loc)?;
    let blocks = loc.blocks;
    let mut home: Vec<u64> = scan
        .txs
        .iter()
        .flat_map(|t| t.homes.iter().copied())
        .collect();
    home.sort_unstable();
    home.dedup();
    for &b in &home {
        if b >= blocks {
            return Err(corrupt(format!("a tag names block {b}, past the end")));
        }
        set.push((b, 1));
    }
    for &n in &scan.window {
        set.push((loc.jmap(n)?, 1));
    }
    if set.iter().any(|&(b, n)| b.saturating_add(n) > blocks) {
        return Err(corrupt("a block of the set lies past the end"));
    }
    let ranges = merge_blocks(set, loc.bs);
    Ok(VerifySet {
        ranges,
        block_size: loc.bs as u32,
        journal_blocks: scan.log.maxlen,
        journal_bytes: scan.log.maxlen * loc.bs,
        transactions: scan.txs.len(),
        home_blocks: home.len() as u64,
        window_blocks: scan.window.len() as u64,
        needs_recovery: loc.needs_recovery,
        sequence_first: scan.log.sequence,
        sequence_last: scan.txs.last().map(|t| t.tid),
        data_journal_declared: loc.declared,
    })
}

/// Block ranges to sorted, merged byte ranges.
fn merge_blocks(mut set: Vec<(u64, u64)>, bs: u64) -> Vec<(u64, u64)> {
    set.retain(|r| r.1 > 0);
    set.sort_unstable();
    let mut out: Vec<(u64, u64)> = Vec::new();
    for (b, n) in set {
        let (at, end) = (b * bs, (b + n) * bs);
        match out.last_mut() {
            Some((off, len)) if at <= *off + *len => *len = (*off + *len).max(end) - *off,
            _ => out.push((at, end - at)),
        }
    }
    out
}

/// Block numbers and contents of the map's own blocks.
type MapBlocks = Vec<(u64, Vec<u8>)>;

/// The journal inode's block map: extents, or the old direct/indirect map; `tree` gets the
/// blocks that hold the map.
fn journal_runs(fs: &mut Fs, inode: &[u8], tree: &mut MapBlocks) -> Result<Runs, GuideRefusal> {
    let iblock = &inode[0x28..0x28 + 60];
    let mut runs = Runs::new();
    if le32(inode, 0x20) & 0x80000 != 0 {
        extent_node(fs, iblock, 5, &mut runs, tree)?;
    } else {
        let per = fs.bs / 4;
        for i in 0..12 {
            let p = u64::from(le32(iblock, i * 4));
            if p != 0 {
                runs.push((i as u64, p, 1));
            }
        }
        let single = u64::from(le32(iblock, 48));
        if single != 0 {
            let b = fs.block(single)?;
            tree.push((single, b.clone()));
            for i in 0..per {
                let p = u64::from(le32(&b, (i * 4) as usize));
                if p != 0 {
                    runs.push((12 + i, p, 1));
                }
            }
        }
        let double = u64::from(le32(iblock, 52));
        if double != 0 {
            let d = fs.block(double)?;
            tree.push((double, d.clone()));
            for j in 0..per {
                let ind = u64::from(le32(&d, (j * 4) as usize));
                if ind == 0 {
                    continue;
                }
                let b = fs.block(ind)?;
                tree.push((ind, b.clone()));
                for i in 0..per {
                    let p = u64::from(le32(&b, (i * 4) as usize));
                    if p != 0 {
                        runs.push((12 + per + j * per + i, p, 1));
                    }
                }
            }
        }
        if le32(iblock, 56) != 0 {
            return Err(GuideRefusal::UnsupportedFeature(
                "a journal mapped through triple-indirect blocks".into(),
            ));
        }
    }
    if runs.is_empty() {
        return Err(corrupt("the journal inode maps no blocks"));
    }
    runs.sort_unstable();
    Ok(runs)
}

fn extent_node(
    fs: &mut Fs,
    node: &[u8],
    depth_left: u32,
    runs: &mut Runs,
    tree: &mut MapBlocks,
) -> Result<(), GuideRefusal> {
    if le16(node, 0) != 0xF30A {
        return Err(corrupt("bad extent header magic"));
    }
    let entries = le16(node, 2) as usize;
    let depth = le16(node, 6);
    if u32::from(depth) > depth_left || 12 + entries * 12 > node.len() {
        return Err(corrupt("bad extent header"));
    }
    for e in 0..entries {
        let o = 12 + e * 12;
        if depth == 0 {
            let logical = u64::from(le32(node, o));
            let mut len = u64::from(le16(node, o + 4));
            if len > 32768 {
                len -= 32768;
            }
            let start = u64::from(le16(node, o + 6)) << 32 | u64::from(le32(node, o + 8));
            runs.push((logical, start, len));
            if runs.len() > 1 << 20 {
                return Err(corrupt("too many journal extents"));
            }
        } else {
            let leaf = u64::from(le32(node, o + 4)) | u64::from(le16(node, o + 8)) << 32;
            let child = fs.block(leaf)?;
            extent_node(fs, &child, u32::from(depth) - 1, runs, tree)?;
            tree.push((leaf, child));
        }
    }
    Ok(())
}

/// The log's geometry and format, from the jbd2 superblock.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Log {
    pub maxlen: u64,
    pub first: u64,
    /// End of the log proper (the fast-commit area follows up to `maxlen`).
    pub last: u64,
    /// `s_sequence`: the tid of the oldest transaction in the log.
    pub sequence: u32,
    /// `s_start`: where the log starts (0: empty).
    pub start: u64,
    /// `s_head` (v2): where the next transaction goes after an empty log (0: unknown).
    pub head: u64,
    pub incompat: u32,
    pub v2: bool,
    pub csum: bool,
    pub seed: u32,
    pub bit64: bool,
    pub tag_bytes: usize,
    /// One maximal transaction, in blocks.
    pub max_trans: u64,
}

impl Log {
    pub fn parse(jsb: &[u8], fs_bs: u64, inode_blocks: u64) -> Result<Log, GuideRefusal> {
        if jsb.len() < 1024 || be32(jsb, 0) != JBD2_MAGIC || !matches!(be32(jsb, 4), 3 | 4) {
            return Err(corrupt("no jbd2 superblock at journal block 0"));
        }
        let v2 = be32(jsb, 4) == 4;
        let bs = u64::from(be32(jsb, 0x0C));
        if bs != fs_bs {
            return Err(corrupt(format!(
                "journal block size {bs} is not the fs block size"
            )));
        }
        let maxlen = u64::from(be32(jsb, 0x10));
        let first = u64::from(be32(jsb, 0x14));
        let incompat = if v2 { be32(jsb, 0x28) } else { 0 };
        if incompat & !JBD2_KNOWN_INCOMPAT != 0 {
            return Err(GuideRefusal::UnsupportedFeature(format!(
                "jbd2 incompat features {:#x}",
                incompat & !JBD2_KNOWN_INCOMPAT
            )));
        }
        if maxlen < 4 || maxlen > inode_blocks || first == 0 || first >= maxlen {
            return Err(corrupt(format!(
                "journal geometry: first {first}, maxlen {maxlen}, inode {inode_blocks} blocks"
            )));
        }
        if v2 && be32(jsb, 0x40) > 1 {
            return Err(GuideRefusal::UnsupportedFeature(
                "a journal shared by several file systems".into(),
            ));
        }
        let csum = incompat & (JBD2_CSUM_V2 | JBD2_CSUM_V3) != 0;
        if csum {
            let mut copy = jsb[..1024].to_vec();
            copy[0xFC..0x100].fill(0);
            if crc32c_raw(!0, &copy) != be32(jsb, 0xFC) {
                return Err(corrupt("jbd2 superblock checksum mismatch"));
            }
        }
        let fc = if incompat & JBD2_FAST_COMMIT != 0 {
            match be32(jsb, 0x54) {
                0 => 256,
                n => u64::from(n),
            }
        } else {
            0
        };
        let last = maxlen
            .checked_sub(fc)
            .filter(|&l| l > first)
            .ok_or_else(|| corrupt("no room for the log"))?;
        let bit64 = incompat & JBD2_64BIT != 0;
        let tag_bytes: usize = if incompat & JBD2_CSUM_V3 != 0 {
            16
        } else {
            let base = if bit64 { 12 } else { 8 };
            if incompat & JBD2_CSUM_V2 != 0 {
                base + 2
            } else {
                base
            }
        };
        let start = u64::from(be32(jsb, 0x1C));
        if start != 0 && !(first..last).contains(&start) {
            return Err(corrupt(format!("s_start {start} outside the log")));
        }
        Ok(Log {
            maxlen,
            first,
            last,
            sequence: be32(jsb, 0x18),
            start,
            head: if v2 { u64::from(be32(jsb, 0x58)) } else { 0 },
            incompat,
            v2,
            csum,
            seed: crc32c_raw(!0, &jsb[0x30..0x40]),
            bit64,
            tag_bytes,
            // One maximal transaction (the kernel's limit: a third of the log since 6.11, a
            // quarter before; the larger is taken).
            max_trans: (maxlen - fc) / 3,
        })
    }

    fn len(&self) -> u64 {
        self.last - self.first
    }

    pub fn wrap_add(&self, n: u64, k: u64) -> u64 {
        self.first + (n - self.first + k) % self.len()
    }

    /// Log blocks a guide verifies after a crash: one maximal transaction from the last
    /// commit block (or, with an empty log, from `s_head` and from `s_first`), and the
    /// fast-commit area.
    pub fn window(&self, last_commit: Option<u64>) -> Vec<u64> {
        let mut w = Vec::new();
        let mut from = |at: u64| {
            for k in 0..=self.max_trans.min(self.len() - 1) {
                w.push(self.wrap_add(at, k));
            }
        };
        if self.start == 0 {
            // Empty log: the next transaction starts at s_head (kernels ≥ 6.4) or s_first.
            if (self.first..self.last).contains(&self.head) {
                from(self.head);
            }
            from(self.first);
        } else {
            // The last good commit block itself may have been in flight; the transaction
            // after it ends within one maximal transaction.
            from(last_commit.unwrap_or(self.start));
        }
        w.extend(self.last..self.maxlen);
        w
    }

    /// Whether log block `n` is in [`Log::window`].
    pub fn in_window(&self, n: u64, last_commit: Option<u64>) -> bool {
        if (self.last..self.maxlen).contains(&n) {
            return true;
        }
        if !(self.first..self.last).contains(&n) {
            return false;
        }
        let span = self.max_trans.min(self.len() - 1);
        let from = |at: u64| (n + self.len() - at) % self.len() <= span;
        if self.start == 0 {
            ((self.first..self.last).contains(&self.head) && from(self.head)) || from(self.first)
        } else {
            from(last_commit.unwrap_or(self.start))
        }
    }

    /// Whether log block `n` lies in the live log from `s_start` through `last_commit`.
    pub fn in_live_log(&self, n: u64, last_commit: Option<u64>) -> bool {
        match (self.start, last_commit) {
            (0, _) | (_, None) => false,
            (s, Some(c)) => {
                (self.first..self.last).contains(&n)
                    && (n + self.len() - s) % self.len() <= (c + self.len() - s) % self.len()
            }
        }
    }

    /// The home blocks a descriptor block names (None: not a valid descriptor of `tid`).
    pub fn descriptor(&self, b: &[u8], tid: u32) -> Option<Vec<u64>> {
        if be32(b, 0) != JBD2_MAGIC || be32(b, 4) != 1 || be32(b, 8) != tid {
            return None;
        }
        if self.csum && !tail_ok(b, self.seed) {
            return None;
        }
        let tail = if self.csum { 4 } else { 0 };
        let mut homes = Vec::new();
        let mut o = 12;
        while o + self.tag_bytes + tail <= b.len() {
            let lo = u64::from(be32(b, o));
            let (flags, hi) = if self.tag_bytes == 16 {
                (be32(b, o + 4), u64::from(be32(b, o + 8)))
            } else {
                (
                    u32::from(be16(b, o + 6)),
                    if self.bit64 {
                        u64::from(be32(b, o + 8))
                    } else {
                        0
                    },
                )
            };
            homes.push(if self.bit64 { hi << 32 | lo } else { lo });
            o += self.tag_bytes;
            if flags & TAG_SAME_UUID == 0 {
                o += 16;
            }
            if flags & TAG_LAST != 0 {
                break;
            }
        }
        Some(homes)
    }

    /// Whether `b` is a valid commit block of `tid`.
    pub fn commit(&self, b: &[u8], tid: u32) -> bool {
        be32(b, 0) == JBD2_MAGIC
            && be32(b, 4) == 2
            && be32(b, 8) == tid
            && (!self.csum || commit_ok(b, self.seed))
    }
}

/// The tid of a jbd2 block (descriptor, commit, revoke), if it is one: `(blocktype, tid)`.
pub(crate) fn jbd2_header(b: &[u8]) -> Option<(u32, u32)> {
    (b.len() >= 12 && be32(b, 0) == JBD2_MAGIC).then(|| (be32(b, 4), be32(b, 8)))
}

/// A transaction as the log walk finds it.
#[derive(Clone, Debug, Default)]
pub(crate) struct LogTx {
    pub tid: u32,
    /// Its descriptor and revoke blocks: position, and blocks to the next one.
    pub blocks: Vec<(u64, u64)>,
    /// The home blocks its tags name.
    pub homes: Vec<u64>,
    /// Log block of its commit block (None: not committed).
    pub commit: Option<u64>,
}

/// What the log holds.
pub(crate) struct Scan {
    pub log: Log,
    /// Committed transactions, oldest first.
    pub txs: Vec<LogTx>,
    /// Blocks of the next transaction found past the last commit (its commit not written yet).
    pub open: LogTx,
    /// Journal block numbers of the head window.
    pub window: Vec<u64>,
    /// Log block of the last good commit block.
    pub last_commit: Option<u64>,
}

/// jbd2's PASS_SCAN over the log of a located file system (the guide's walk; the write watch
/// arms from the same walk, so the two agree on what the log holds).
pub(crate) fn scan(
    read: &mut Read<'_>,
    device_bytes: u64,
    loc: &Located,
) -> Result<Scan, GuideRefusal> {
    let mut fs = Fs {
        read,
        device_bytes,
        bs: loc.bs,
        blocks: loc.blocks,
    };
    let log = Log::parse(&loc.jsb, fs.bs, loc.inode_blocks)?;
    let mut scan = Scan {
        txs: Vec::new(),
        open: LogTx {
            tid: log.sequence,
            ..LogTx::default()
        },
        window: Vec::new(),
        last_commit: None,
        log: log.clone(),
    };
    if log.start == 0 {
        scan.window = log.window(None);
        return Ok(scan);
    }
    let mut pos = log.start;
    let mut walked = 0u64;
    while walked < log.len() {
        let tid = scan.open.tid;
        let b = fs.block(loc.jmap(pos)?)?;
        if jbd2_header(&b).is_none_or(|(_, t)| t != tid) {
            break;
        }
        let step = match be32(&b, 4) {
            1 => {
                let Some(mut homes) = log.descriptor(&b, tid) else {
                    break;
                };
                let step = 1 + homes.len() as u64;
                scan.open.blocks.push((pos, step));
                scan.open.homes.append(&mut homes);
                step
            }
            2 => {
                if !log.commit(&b, tid) {
                    break;
                }
                let next = LogTx {
                    tid: tid.wrapping_add(1),
                    ..LogTx::default()
                };
                let mut tx = std::mem::replace(&mut scan.open, next);
                tx.commit = Some(pos);
                scan.txs.push(tx);
                scan.last_commit = Some(pos);
                1
            }
            5 => {
                if log.csum && !tail_ok(&b, log.seed) {
                    break;
                }
                scan.open.blocks.push((pos, 1));
                1
            }
            _ => break,
        };
        walked += step;
        pos = log.wrap_add(pos, step);
    }
    scan.window = log.window(scan.last_commit);
    Ok(scan)
}

/// Descriptor and revoke blocks: crc32c over the block with its 4-byte tail zeroed.
fn tail_ok(b: &[u8], seed: u32) -> bool {
    let n = b.len();
    let mut copy = b.to_vec();
    copy[n - 4..].fill(0);
    crc32c_raw(seed, &copy) == be32(b, n - 4)
}

/// Commit blocks: crc32c over the block with `h_chksum[0]` zeroed; a torn commit block whose
/// header alone checks out counts too (the kernel accepts it since 6.11).
fn commit_ok(b: &[u8], seed: u32) -> bool {
    let stored = be32(b, 0x10);
    let mut copy = b.to_vec();
    copy[0x10..0x14].fill(0);
    if crc32c_raw(seed, &copy) == stored {
        return true;
    }
    copy[0x3C..].fill(0);
    crc32c_raw(seed, &copy) == stored
}

/// A tiny synthetic ext4 with a jbd2 log, for tests and fuzzing (not a real file system: only
/// what the guide reads).
#[doc(hidden)]
pub mod synthetic {
    use super::*;

    /// A 1 MiB image with 1 KiB blocks: ext4 superblock, one group descriptor, journal inode
    /// 8 mapped by one extent at fs block 200 for 64 blocks, and a jbd2 v2 log without checksums
    /// built by `log`.
    pub fn image(log: &dyn Fn(&mut Vec<u8>, u64)) -> Vec<u8> {
        let bs = 1024usize;
        let mut img = vec![0u8; 1 << 20];
        let sb = &mut img[1024..2048];
        sb[0x04..0x08].copy_from_slice(&1024u32.to_le_bytes()); // blocks
        sb[0x14..0x18].copy_from_slice(&1u32.to_le_bytes()); // first data block
        sb[0x20..0x24].copy_from_slice(&8192u32.to_le_bytes());
        sb[0x28..0x2C].copy_from_slice(&128u32.to_le_bytes());
        sb[0x38..0x3A].copy_from_slice(&EXT4_MAGIC.to_le_bytes());
        sb[0x4C..0x50].copy_from_slice(&1u32.to_le_bytes());
        sb[0x58..0x5A].copy_from_slice(&256u16.to_le_bytes());
        sb[0x5C..0x60].copy_from_slice(&COMPAT_HAS_JOURNAL.to_le_bytes());
        sb[0x60..0x64].copy_from_slice(&INCOMPAT_RECOVER.to_le_bytes());
        sb[0xE0..0xE4].copy_from_slice(&8u32.to_le_bytes());
        sb[0x100..0x104].copy_from_slice(&0x20u32.to_le_bytes());
        // Group 0's descriptor (block 2): inode table at block 10.
        img[2 * bs + 8..2 * bs + 12].copy_from_slice(&10u32.to_le_bytes());
        // Inode 8: the 8th slot of 256 bytes.
        let ino = 10 * bs + 7 * 256;
        img[ino + 4..ino + 8].copy_from_slice(&(64u32 * 1024).to_le_bytes());
        img[ino + 0x20..ino + 0x24].copy_from_slice(&0x80000u32.to_le_bytes());
        let eh = ino + 0x28;
        img[eh..eh + 2].copy_from_slice(&0xF30Au16.to_le_bytes());
        img[eh + 2..eh + 4].copy_from_slice(&1u16.to_le_bytes());
        img[eh + 4..eh + 6].copy_from_slice(&4u16.to_le_bytes());
        img[eh + 16..eh + 18].copy_from_slice(&64u16.to_le_bytes());
        img[eh + 20..eh + 24].copy_from_slice(&200u32.to_le_bytes());
        log(&mut img, 200 * 1024);
        img
    }

    pub fn header(img: &mut [u8], at: usize, kind: u32, tid: u32) {
        img[at..at + 4].copy_from_slice(&JBD2_MAGIC.to_be_bytes());
        img[at + 4..at + 8].copy_from_slice(&kind.to_be_bytes());
        img[at + 8..at + 12].copy_from_slice(&tid.to_be_bytes());
    }

    /// Journal superblock: v2, 64 blocks, first 1, sequence 5, start `start`.
    pub fn jsb(img: &mut [u8], j: usize, start: u32) {
        header(img, j, 4, 0);
        img[j + 0x0C..j + 0x10].copy_from_slice(&1024u32.to_be_bytes());
        img[j + 0x10..j + 0x14].copy_from_slice(&64u32.to_be_bytes());
        img[j + 0x14..j + 0x18].copy_from_slice(&1u32.to_be_bytes());
        img[j + 0x18..j + 0x1C].copy_from_slice(&5u32.to_be_bytes());
        img[j + 0x1C..j + 0x20].copy_from_slice(&start.to_be_bytes());
        img[j + 0x40..j + 0x44].copy_from_slice(&1u32.to_be_bytes());
    }

    /// A transaction at log block `at`: descriptor naming `homes` (8-byte tags), data blocks,
    /// commit. Returns the block after it (no wrap handling: tests place it).
    pub fn transaction(img: &mut [u8], j: usize, at: usize, tid: u32, homes: &[u32]) -> usize {
        let d = j + at * 1024;
        header(img, d, 1, tid);
        for (i, h) in homes.iter().enumerate() {
            let o = d + 12 + i * 8 + if i > 0 { 16 } else { 0 };
            img[o..o + 4].copy_from_slice(&h.to_be_bytes());
            let mut flags = if i > 0 { TAG_SAME_UUID } else { 0 };
            if i + 1 == homes.len() {
                flags |= TAG_LAST;
            }
            img[o + 6..o + 8].copy_from_slice(&(flags as u16).to_be_bytes());
        }
        let c = at + 1 + homes.len();
        header(img, j + c * 1024, 2, tid);
        c + 1
    }
}

#[cfg(test)]
mod tests {
    use super::synthetic::{header, image, jsb, transaction};
    use super::*;

    fn run(img: &[u8]) -> Result<VerifySet, GuideRefusal> {
        let mut read = |off: u64, buf: &mut [u8]| {
            let o = off as usize;
            buf.copy_from_slice(img.get(o..o + buf.len()).ok_or("past the end")?);
            Ok(())
        };
        ext4_verify_set(
            &mut read,
            img.len() as u64,
            &GuideOptions {
                require_data_journal: true,
            },
        )
    }

    fn covers(s: &VerifySet, block: u64) -> bool {
        s.ranges
            .iter()
            .any(|&(o, l)| o <= block * 1024 && block * 1024 < o + l)
    }

    #[test]
    fn every_committed_transaction_names_its_home_blocks() {
        let img = image(&|img, j| {
            let j = j as usize;
            jsb(img, j, 3);
            let n = transaction(img, j, 3, 5, &[400, 401]);
            let n = transaction(img, j, n, 6, &[700]);
            // An uncommitted transaction: its descriptor, no commit.
            header(img, j + n * 1024, 1, 7);
        });
        let s = run(&img).unwrap();
        assert_eq!(s.transactions, 2);
        assert_eq!(s.sequence_last, Some(6));
        for b in [0, 1, 200, 400, 401, 700] {
            assert!(covers(&s, b), "block {b} missing: {s:?}");
        }
        assert!(!covers(&s, 402) && !covers(&s, 699));
        // Window: the last commit (log block 9) and one maximal transaction (63 / 3) after it.
        assert_eq!(s.window_blocks, 22);
        assert!(covers(&s, 200 + 9) && covers(&s, 200 + 30) && !covers(&s, 200 + 31));
    }

    #[test]
    fn a_sequence_gap_ends_the_log_and_the_log_wraps() {
        let img = image(&|img, j| {
            let j = j as usize;
            jsb(img, j, 60);
            // tid 5 at 60..63 wraps: descriptor at 60, data 61, 62, commit at 63? The log ends
            // at 64, so the commit lands at 1 after data at 61..=63.
            header(img, j + 60 * 1024, 1, 5);
            for (i, h) in [500u32, 501, 502].iter().enumerate() {
                let o = j + 60 * 1024 + 12 + i * 8 + if i > 0 { 16 } else { 0 };
                img[o..o + 4].copy_from_slice(&h.to_be_bytes());
                let flags =
                    if i > 0 { TAG_SAME_UUID } else { 0 } | if i == 2 { TAG_LAST } else { 0 };
                img[o + 6..o + 8].copy_from_slice(&(flags as u16).to_be_bytes());
            }
            header(img, j + 1024, 2, 5);
            // A stale transaction with a wrong tid follows: not counted.
            transaction(img, j, 2, 9, &[800]);
        });
        let s = run(&img).unwrap();
        assert_eq!(s.transactions, 1, "{s:?}");
        assert!(covers(&s, 500) && covers(&s, 502) && !covers(&s, 800));
    }

    #[test]
    fn gates_refuse_with_reasons() {
        let ok = image(&|img, j| jsb(img, j as usize, 0));
        let s = run(&ok).unwrap();
        assert_eq!(s.transactions, 0);
        assert!(s.window_blocks > 0);
        let mut img = ok.clone();
        img[1024 + 0x38] = 0;
        assert_eq!(run(&img), Err(GuideRefusal::NotExt4));
        let mut img = ok.clone();
        img[1024 + 0x5C] = 0;
        assert_eq!(run(&img), Err(GuideRefusal::NoJournal));
        let mut img = ok.clone();
        img[1024 + 0x60] = 0;
        assert_eq!(run(&img), Err(GuideRefusal::NotMounted));
        let mut img = ok.clone();
        img[1024 + 0x100] = 0x40;
        assert_eq!(run(&img), Err(GuideRefusal::NotDataJournal));
        img[1024 + 0x200..1024 + 0x20C].copy_from_slice(b"data=journal");
        assert!(run(&img).is_ok(), "mount_opts declare it");
        let mut img = ok.clone();
        img[1024 + 0xE0] = 0;
        assert_eq!(run(&img), Err(GuideRefusal::ExternalJournal));
    }

    #[test]
    fn damage_never_panics() {
        let base = image(&|img, j| {
            let j = j as usize;
            jsb(img, j, 3);
            transaction(img, j, 3, 5, &[400, 401]);
        });
        let mut x = 0x9e37_79b9u64;
        for _ in 0..3000 {
            let mut img = base.clone();
            for _ in 0..8 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let at = match x % 4 {
                    0 => 1024 + (x >> 8) as usize % 1024,
                    1 => 10 * 1024 + 7 * 256 + (x >> 8) as usize % 256,
                    _ => 200 * 1024 + (x >> 8) as usize % (12 * 1024),
                };
                img[at] = (x >> 32) as u8;
            }
            let _ = run(&img);
        }
    }
}
