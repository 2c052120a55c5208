//! The online conformance check of a guided array (study: `shared/reference/guided-resync.md`
//! §3.6), pure: it sees the writes to a device holding an ext4 file system as they begin and
//! end, follows the jbd2 log they build, and says of each write whether the ext4 guide would
//! find it after a crash at any moment until it is durable. Such a write is *conforming*; any
//! other one (ordered-mode data, zero-out of unwritten extents, lazy inode-table init, resize,
//! discard, a raw writer) is not, and the array must cover it some other way (the bitmap).
//!
//! A write is conforming when every fs block it touches is one the guide verifies whatever
//! happened to the writes still in flight or unflushed:
//! * a block of the fixed set (block 0 and the superblock's block; the MMP block);
//! * the jbd2 superblock;
//! * a log block outside the live log and inside the window the guide computes (one maximal
//!   transaction past the last commit, or past `s_head` and `s_first` for an empty log) for
//!   every superblock and every last commit that may be on disk after a crash: the durable
//!   ones and any whose write began since; with a live log, only while the features the
//!   block is parsed with are the ones the guide will use;
//! * a home block named by a transaction whose commit block is durable, whose blocks continue
//!   the log exactly where the guide's walk expects them (checked when the commit becomes
//!   durable), and that no superblock write has dropped since.
//!
//! Durable means: the write ended with FUA, or a flush that began after it ended has ended.
//! A write judged conforming stays covered until it is durable: a commit or superblock write
//! that would move the guide's window or drop a transaction away from such a write is itself
//! nonconforming (so the array covers it before it goes out), and the uncovered write is an
//! *orphan* until it is durable ([`Jbd2Watch::orphans`]).
//! Whatever the check cannot follow (a superblock rewritten with another geometry, a torn
//! journal block, a tid out of order) disarms it: every write is then nonconforming until the
//! watch is armed again from what is on disk.

use crate::ext4_guide::{jbd2_header, locate, scan, GuideRefusal, Log, LogTx, Read};
use std::collections::{BTreeMap, HashMap};

/// Why a write was not conforming (for counters and logs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Nonconforming {
    /// The watch is not armed (no file system found yet, or it lost track).
    Unarmed,
    /// A discard (TRIM, WRITE_ZEROES that releases).
    Discard,
    /// Part of a journal block, log blocks outside the window, or a commit or superblock
    /// write that would leave a write in flight uncovered.
    Log,
    /// A home block no durable committed transaction names (ordered data, zero-out, lazy
    /// init, resize, a raw writer).
    Home,
    /// Past the end of the file system.
    OutsideFs,
}

impl Nonconforming {
    pub fn name(self) -> &'static str {
        match self {
            Nonconforming::Unarmed => "unarmed",
            Nonconforming::Discard => "discard",
            Nonconforming::Log => "log",
            Nonconforming::Home => "home",
            Nonconforming::OutsideFs => "outside_fs",
        }
    }
}

/// Whether a write is conforming, and why not.
pub type Verdict = Result<(), Nonconforming>;

/// What becomes durable with a write.
#[derive(Clone, Debug)]
enum Item {
    /// A descriptor or revoke block: the guide's walk needs it on disk before the commit.
    Descriptor {
        tid: u32,
    },
    Commit {
        tid: u32,
        pos: u64,
    },
    Superblock(Box<Log>),
}

/// A block a conforming write relies on the guide to cover.
#[derive(Clone, Copy, Debug)]
enum Cover {
    Home(u64),
    Log(u64),
}

/// A write not yet durable that the watch still follows.
struct Unsettled {
    id: u64,
    covers: Vec<Cover>,
    items: Vec<Item>,
    /// Flush epoch when it ended (None: in flight).
    ended: Option<u64>,
    orphan: bool,
}

/// A transaction in the log: its descriptor and revoke blocks (position, blocks to the next
/// one; put in log order when its commit is checked), and the home blocks its tags name.
#[derive(Clone, Debug, Default)]
struct Tx {
    blocks: Vec<(u64, u64)>,
    homes: Vec<u64>,
    /// Log block it starts at (checked when its commit became durable).
    start: u64,
    /// Log block after its commit block.
    end: u64,
}

/// The armed state.
struct Armed {
    bs: u64,
    fs_blocks: u64,
    /// The superblock fields the watch depends on.
    sb_key: Vec<u8>,
    fixed: Vec<(u64, u64)>,
    /// Bytes that fix where the journal is (see `Located::structure`).
    structure: Vec<(u64, usize, Vec<u8>)>,
    /// Physical block of journal block 0.
    jsb_block: u64,
    /// Journal runs `(logical, physical, len)` sorted by physical block.
    by_phys: Vec<(u64, u64, u64)>,
    /// The log as its durable superblock says.
    log: Log,
    /// Log block of the last durable commit of the chain (tid `next_tid - 1`).
    last_commit: Option<u64>,
    /// Tid the next durable commit must carry to extend the chain.
    next_tid: u32,
    /// Durable committed transactions still in the log.
    committed: BTreeMap<u32, Tx>,
    /// How many committed transactions name each home block.
    home: HashMap<u64, u32>,
    /// Transactions whose blocks were seen, not yet durably committed.
    open: HashMap<u32, Tx>,
    writes: Vec<Unsettled>,
}

/// The conformance check of one device.
pub struct Jbd2Watch {
    armed: Option<Armed>,
    /// Why the watch is not armed.
    disarmed: String,
    epoch: u64,
    next_id: u64,
    /// Writes followed when the watch lost track, not yet durable: nothing covers them now.
    /// `(id, flush epoch when it ended)`.
    lost: Vec<(u64, Option<u64>)>,
}

impl Default for Jbd2Watch {
    fn default() -> Self {
        Jbd2Watch {
            armed: None,
            disarmed: "not armed yet".into(),
            epoch: 0,
            next_id: 0,
            lost: Vec::new(),
        }
    }
}

/// Superblock bytes that fix where the file system and its journal are: block count, first
/// data block, block size, group geometry, inode size, features, journal inode and its backup
/// block map, MMP block.
const SB_KEY: &[(usize, usize)] = &[
    (0x04, 0x08),
    (0x14, 0x1C),
    (0x20, 0x24),
    (0x28, 0x2C),
    (0x4C, 0x50),
    (0x58, 0x5A),
    (0x5C, 0x68),
    (0xE0, 0xE4),
    (0xFE, 0x100),
    (0x10C, 0x154),
    (0x168, 0x170),
];

fn sb_key(sb: &[u8]) -> Vec<u8> {
    SB_KEY
        .iter()
        .flat_map(|&(a, b)| sb[a..b].to_vec())
        .collect()
}

impl Jbd2Watch {
    /// Arm from the device as it is now. The caller makes sure no write began since the
    /// reads and that what they returned is durable (a flush after them, before any write).
    pub fn arm(&mut self, read: &mut Read<'_>, device_bytes: u64) -> Result<(), GuideRefusal> {
        self.disarm("armed again");
        let res = self.arm_from(read, device_bytes);
        if let Err(e) = &res {
            self.disarmed = format!("no ext4 journal to follow: {e}");
        }
        res
    }

    fn arm_from(&mut self, read: &mut Read<'_>, device_bytes: u64) -> Result<(), GuideRefusal> {
        let loc = locate(read, device_bytes, &|_, _| Ok(()))?;
        let mut by_phys: Vec<(u64, u64, u64)> = loc.runs.clone();
        by_phys.sort_unstable_by_key(|r| r.1);
        // The committed transactions on disk now, as the guide would find them.
        let scan = scan(read, device_bytes, &loc)?;
        let log = scan.log;
        let tx = |t: LogTx| {
            let commit = t.commit.unwrap_or_default();
            Tx {
                start: t.blocks.first().map_or(commit, |b| b.0),
                end: log.wrap_add(commit, 1),
                blocks: t.blocks,
                homes: t.homes,
            }
        };
        let next_tid = scan.open.tid;
        let committed: BTreeMap<u32, Tx> = scan.txs.into_iter().map(|t| (t.tid, tx(t))).collect();
        // Blocks of the transaction being written, past the last commit: durable already
        // (the caller flushed), so its commit may follow them.
        let mut open = HashMap::new();
        if !scan.open.blocks.is_empty() {
            open.insert(next_tid, tx(scan.open));
        }
        let last_commit = scan.last_commit;
        let mut home = HashMap::new();
        for b in committed.values().flat_map(|t: &Tx| &t.homes) {
            *home.entry(*b).or_insert(0) += 1;
        }
        self.armed = Some(Armed {
            bs: loc.bs,
            fs_blocks: loc.blocks,
            sb_key: sb_key(&loc.sb),
            // Lazy-init inode tables are left out: their zeroing does not conform.
            fixed: loc.fixed.clone(),
            structure: loc.structure.clone(),
            jsb_block: loc.jmap(0)?,
            by_phys,
            log,
            last_commit,
            next_tid,
            committed,
            home,
            open,
            writes: Vec::new(),
        });
        Ok(())
    }

    pub fn is_armed(&self) -> bool {
        self.armed.is_some()
    }

    /// Why the watch is not armed (None when it is).
    pub fn disarmed_reason(&self) -> Option<&str> {
        self.armed.is_none().then_some(self.disarmed.as_str())
    }

    /// Stop following the log (every write is nonconforming until armed again).
    pub fn disarm(&mut self, why: impl Into<String>) {
        if let Some(a) = self.armed.take() {
            self.disarmed = why.into();
            self.lost
                .extend(a.writes.into_iter().map(|w| (w.id, w.ended)));
        }
    }

    /// Conforming writes not yet durable that the guide would no longer find (a later commit
    /// or tail move, or the watch losing track, left them uncovered): the array must cover
    /// them until they are.
    pub fn orphans(&self) -> usize {
        self.lost.len()
            + self
                .armed
                .as_ref()
                .map_or(0, |a| a.writes.iter().filter(|w| w.orphan).count())
    }

    /// A write of `data` (None: a discard) at byte `offset` begins; the id goes to
    /// [`Jbd2Watch::end`].
    pub fn begin(&mut self, offset: u64, len: u64, data: Option<&[u8]>) -> (Verdict, u64) {
        let id = self.next_id;
        self.next_id += 1;
        let Some(a) = self.armed.as_mut() else {
            return (Err(Nonconforming::Unarmed), id);
        };
        match a.begin(id, offset, len, data) {
            Ok(v) => (v, id),
            Err(why) => {
                self.disarm(why);
                (Err(Nonconforming::Unarmed), id)
            }
        }
    }

    /// Write `id` ended: durable now if `durable` (FUA); `ok` false if it failed (then it
    /// never counts as durable).
    pub fn end(&mut self, id: u64, ok: bool, durable: bool) {
        let epoch = self.epoch;
        if let Some(i) = self.lost.iter().position(|l| l.0 == id) {
            if ok && durable {
                self.lost.remove(i);
            } else {
                self.lost[i].1 = Some(epoch);
            }
            return;
        }
        let Some(a) = self.armed.as_mut() else {
            return;
        };
        let Some(i) = a.writes.iter().position(|w| w.id == id) else {
            return;
        };
        if !ok {
            // Whatever it carried may or may not be on disk: the log cannot be followed.
            if !a.writes[i].items.is_empty() {
                self.disarm("a journal write failed");
            } else {
                a.writes[i].ended = Some(epoch);
            }
            return;
        }
        if durable {
            let w = a.writes.remove(i);
            if let Err(why) = a.settle(w) {
                self.disarm(why);
            }
        } else {
            a.writes[i].ended = Some(epoch);
        }
    }

    /// A flush begins: returns its token for [`Jbd2Watch::flush_end`].
    pub fn flush_begin(&mut self) -> u64 {
        let e = self.epoch;
        self.epoch += 1;
        e
    }

    /// A flush ended successfully: what ended before it began is durable.
    pub fn flush_end(&mut self, token: u64) {
        self.lost.retain(|l| l.1.is_none_or(|e| e > token));
        let Some(a) = self.armed.as_mut() else {
            return;
        };
        let (done, rest): (Vec<Unsettled>, Vec<Unsettled>) = std::mem::take(&mut a.writes)
            .into_iter()
            .partition(|w| w.ended.is_some_and(|e| e <= token));
        a.writes = rest;
        // In the order the writes began, which is the order of the log.
        if let Err(why) = done.into_iter().try_for_each(|w| a.settle(w)) {
            self.disarm(why);
        }
    }
}

impl Armed {
    /// Log block of physical block `b`, if it is in the journal.
    fn log_block(&self, b: u64) -> Option<u64> {
        let i = self.by_phys.partition_point(|r| r.1 + r.2 <= b);
        let r = self.by_phys.get(i)?;
        (r.1 <= b).then(|| r.0 + (b - r.1))
    }

    /// Superblocks the guide may find after a crash: the durable one, and any begun since.
    fn logs(&self) -> impl Iterator<Item = &Log> {
        std::iter::once(&self.log).chain(self.writes.iter().flat_map(|w| {
            w.items.iter().filter_map(|i| match i {
                Item::Superblock(l) => Some(l.as_ref()),
                _ => None,
            })
        }))
    }

    /// Last commits the guide may find: the durable one and any begun since (with tids).
    fn commits(&self) -> Vec<Option<(u32, u64)>> {
        let mut v = vec![self.last_commit.map(|c| (self.next_tid.wrapping_sub(1), c))];
        for w in &self.writes {
            for i in &w.items {
                if let Item::Commit { tid, pos } = i {
                    v.push(Some((*tid, *pos)));
                }
            }
        }
        v
    }

    /// Whether log block `n` is in the window the guide computes, whichever of the possible
    /// superblocks and last commits reach the disk, and outside the live log.
    fn log_covered(&self, n: u64) -> bool {
        let commits = self.commits();
        self.logs().all(|log| {
            !log.in_live_log(n, self.last_commit)
                && commits.iter().all(|c| {
                    // The guide starts its window at a commit only if its chain reaches it.
                    let lc = c.filter(|&(t, _)| log.start != 0 && !tid_before(t, log.sequence));
                    log.in_window(n, lc.map(|c| c.1))
                })
        })
    }

    fn covered(&self, c: Cover) -> bool {
        match c {
            Cover::Home(b) => self.home.contains_key(&b),
            Cover::Log(n) => self.log_covered(n),
        }
    }

    /// Mark writes no longer covered as orphans; whether any became one.
    fn find_orphans(&mut self) -> bool {
        let lost: Vec<usize> = (0..self.writes.len())
            .filter(|&i| {
                let w = &self.writes[i];
                !w.orphan && w.covers.iter().any(|&c| !self.covered(c))
            })
            .collect();
        for &i in &lost {
            self.writes[i].orphan = true;
        }
        !lost.is_empty()
    }

    /// Inner `begin`: Err disarms.
    fn begin(
        &mut self,
        id: u64,
        offset: u64,
        len: u64,
        data: Option<&[u8]>,
    ) -> Result<Verdict, String> {
        let bs = self.bs;
        if offset < 2048 && offset + len > 1024 {
            // The primary superblock: rewritten whole with the same geometry, or disarm.
            let sb = data
                .filter(|_| offset <= 1024 && offset + len >= 2048)
                .map(|d| &d[(1024 - offset) as usize..(2048 - offset) as usize]);
            match sb {
                Some(sb) if sb_key(sb) == self.sb_key => {}
                _ => return Err("the ext4 superblock changed".into()),
            }
        }
        let mut w = Unsettled {
            id,
            covers: Vec::new(),
            items: Vec::new(),
            ended: None,
            orphan: false,
        };
        let mut verdict = Ok(());
        let mut moves = false;
        for b in offset / bs..(offset + len).div_ceil(bs) {
            let whole = b * bs >= offset && (b + 1) * bs <= offset + len;
            let block = data
                .filter(|_| whole)
                .map(|d| &d[(b * bs - offset) as usize..((b + 1) * bs - offset) as usize]);
            let v = self.block_begins(b, block, &mut w, &mut moves)?;
            verdict = verdict.and(v);
        }
        if moves {
            // A superblock or commit that may reach the disk: the writes it would leave
            // uncovered are orphans, and this write must be covered before it goes out.
            self.writes.push(w);
            if self.find_orphans() {
                verdict = verdict.and(Err(Nonconforming::Log));
            }
            let w = self.writes.last_mut().expect("just pushed");
            if verdict.is_err() {
                w.covers.clear();
            }
            return Ok(verdict);
        }
        if verdict.is_err() {
            w.covers.clear();
        }
        if !w.covers.is_empty() || !w.items.is_empty() {
            self.writes.push(w);
        }
        Ok(verdict)
    }

    fn block_begins(
        &mut self,
        b: u64,
        data: Option<&[u8]>,
        w: &mut Unsettled,
        moves: &mut bool,
    ) -> Result<Verdict, String> {
        if b >= self.fs_blocks {
            return Ok(Err(Nonconforming::OutsideFs));
        }
        for (sb, at, bytes) in self.structure.iter().filter(|s| s.0 == b) {
            if data.is_none_or(|d| d.get(*at..at + bytes.len()) != Some(bytes.as_slice())) {
                return Err(format!(
                    "fs block {sb}, which says where the journal is, changed"
                ));
            }
        }
        if b == self.jsb_block {
            let Some(d) = data else {
                return Err("the jbd2 superblock was discarded or written in part".into());
            };
            let log = Log::parse(d, self.bs, u64::MAX).map_err(|e| e.to_string())?;
            let l = &self.log;
            // Features may change (a mount turns checksums on) but not where the log is.
            if (log.maxlen, log.first, log.last, log.seed) != (l.maxlen, l.first, l.last, l.seed) {
                return Err("the jbd2 superblock changed the journal's geometry".into());
            }
            if log.start != 0 {
                // The guide walks from the new tail: it must be where that transaction
                // starts (or where the next one will).
                let at = match self.committed.get(&log.sequence) {
                    Some(tx) => Some(tx.start),
                    // A new log after an empty one starts wherever jbd2 puts it.
                    None if log.sequence == self.next_tid
                        || (self.committed.is_empty() && self.log.start == 0) =>
                    {
                        Some(log.start)
                    }
                    None => None,
                };
                if at != Some(log.start) || tid_before(log.sequence, self.log.sequence) {
                    return Err(format!(
                        "the log tail moved to block {} (transaction {}), which the log does \
                         not start there",
                        log.start, log.sequence
                    ));
                }
            }
            // Transactions the new tail drops no longer count from now on.
            self.drop_before(&log);
            w.items.push(Item::Superblock(Box::new(log)));
            *moves = true;
            return Ok(Ok(()));
        }
        if let Some(n) = self.log_block(b) {
            if n >= self.log.maxlen {
                return Ok(Err(Nonconforming::Log));
            }
            let Some(d) = data else {
                return Ok(Err(Nonconforming::Log));
            };
            if self.logs().any(|l| l.in_live_log(n, self.last_commit)) {
                return Err(format!("log block {n} of the live log was overwritten"));
            }
            // Blocks are parsed as the newest superblock says; while a live log with other
            // features may be what a guide finds, it might read them the old way: not covered.
            let fmt = self.logs().last().expect("the durable log").clone();
            let covered = self.log_covered(n)
                && self
                    .logs()
                    .all(|l| l.start == 0 || l.incompat == fmt.incompat);
            if let Some((kind, tid)) = jbd2_header(d) {
                match kind {
                    1 => {
                        if let Some(homes) = fmt.descriptor(d, tid) {
                            let tx = self.open.entry(tid).or_default();
                            tx.blocks.push((n, 1 + homes.len() as u64));
                            tx.homes.extend(homes);
                            w.items.push(Item::Descriptor { tid });
                        }
                    }
                    5 => {
                        self.open.entry(tid).or_default().blocks.push((n, 1));
                        w.items.push(Item::Descriptor { tid });
                    }
                    2 if fmt.commit(d, tid) => {
                        w.items.push(Item::Commit { tid, pos: n });
                        *moves = true;
                    }
                    _ => {}
                }
            }
            if !covered {
                return Ok(Err(Nonconforming::Log));
            }
            w.covers.push(Cover::Log(n));
            return Ok(Ok(()));
        }
        if data.is_none() {
            return Ok(Err(Nonconforming::Discard));
        }
        if self.fixed.iter().any(|&(f, c)| f <= b && b < f + c) {
            return Ok(Ok(()));
        }
        if self.home.contains_key(&b) {
            w.covers.push(Cover::Home(b));
            return Ok(Ok(()));
        }
        Ok(Err(Nonconforming::Home))
    }

    /// Drop the transactions a superblock with tail `log` no longer holds.
    fn drop_before(&mut self, log: &Log) {
        let dropped: Vec<u32> = self
            .committed
            .keys()
            .copied()
            .filter(|&t| log.start == 0 || tid_before(t, log.sequence))
            .collect();
        for t in dropped {
            for b in self.committed.remove(&t).unwrap_or_default().homes {
                if let Some(c) = self.home.get_mut(&b) {
                    *c -= 1;
                    if *c == 0 {
                        self.home.remove(&b);
                    }
                }
            }
        }
    }

    /// Write `w` is durable. Err: the log did something the watch cannot follow.
    fn settle(&mut self, w: Unsettled) -> Result<(), String> {
        for item in w.items {
            match item {
                Item::Descriptor { .. } => {}
                Item::Superblock(log) => {
                    if log.start == 0 || (self.log.start == 0 && self.committed.is_empty()) {
                        // Empty, or the log restarts: its chain begins at the sequence.
                        self.last_commit = None;
                        self.next_tid = log.sequence;
                    }
                    self.log = *log;
                }
                Item::Commit { tid, pos } => {
                    let unsettled_descriptor = self.writes.iter().any(|o| {
                        o.items
                            .iter()
                            .any(|i| matches!(i, Item::Descriptor { tid: t } if *t == tid))
                    });
                    if self.log.start == 0 || tid != self.next_tid || unsettled_descriptor {
                        return Err(format!(
                            "transaction {tid} committed where the log expects {} (log {}, \
                             descriptor durable: {})",
                            self.next_tid,
                            if self.log.start == 0 { "empty" } else { "live" },
                            !unsettled_descriptor
                        ));
                    }
                    let mut tx = self.open.remove(&tid).unwrap_or_default();
                    // The guide's walk: from where the log says this transaction starts,
                    // block after block, to this commit.
                    let mut at = match self.committed.values().next_back() {
                        Some(prev) => prev.end,
                        None => self.log.start,
                    };
                    tx.start = at;
                    // In log order (writeback may have sent them in another).
                    let len = self.log.last - self.log.first;
                    tx.blocks.sort_by_key(|&(p, _)| (p + len - at) % len);
                    for &(p, step) in &tx.blocks {
                        if p != at {
                            return Err(format!(
                                "transaction {tid}: a block at {p} where the log continues at {at}"
                            ));
                        }
                        at = self.log.wrap_add(at, step);
                    }
                    if pos != at {
                        return Err(format!(
                            "transaction {tid}: commit at {pos} where the log continues at {at}"
                        ));
                    }
                    tx.end = self.log.wrap_add(pos, 1);
                    for &b in &tx.homes {
                        *self.home.entry(b).or_insert(0) += 1;
                    }
                    self.committed.insert(tid, tx);
                    self.last_commit = Some(pos);
                    self.next_tid = tid.wrapping_add(1);
                    // Descriptors of older transactions will never commit.
                    self.open.retain(|&t, _| !tid_before(t, tid));
                }
            }
        }
        Ok(())
    }
}

/// jbd2's tid order (wrapping).
fn tid_before(a: u32, b: u32) -> bool {
    (a.wrapping_sub(b) as i32) < 0
}
