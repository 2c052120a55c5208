//! The simulated cluster's single source of truth and its scheduler.
//!
//! Every node runs on its own thread, but only one thread runs at a time: the one holding the
//! turn. A node thread gives the turn back whenever it blocks: at its member gate (every
//! device call), in the coordinator (waiting for extents, the metadata token or failure
//! acknowledgements), or idle between operations. The scheduler (the test's main thread) waits
//! until nobody holds the turn, lists every action that could run now (an I/O to grant, a wait
//! that is satisfied, an operation to start, a hand-off or failure to serve) and picks one with
//! the seed's generator. Waiting is counted in this state, never guessed with timeouts, and
//! engine locks of a node are only ever taken by that node's thread (hand-offs and remote
//! failures are served by the owner's own thread, at points where it holds none), so a run is
//! a function of its seed. (A dead node's thread finishes on its own, outside the turns: its
//! device calls fail without reaching a member and the cluster ignores it.)
//!
//! A partitioned node is cut off from the cluster, not from the members: at some grant of one
//! of its member writes its own clock passes its lease's deadline (it is *fenced*): from then
//! on it may not start member writes or serve reads, and its waits in the cluster end at once
//! (it cannot reach etcd). Once it is idle (its writes in flight have landed: the margin the
//! real node keeps before its lease ends) the lease *expires*: the others stop waiting for
//! it, its extents and its token are gone, and a survivor takes its slot over; its thread
//! goes on taking client operations until the partition heals and it exits. A member write
//! of an expired node reaching a member is a fencing failure, reported as a violation.
//!
//! The cluster's own rules (token, failures, extents) are in `cluster.rs`.

use crate::node::{Op, Outcome};
use parking_lot::{Condvar, Mutex, MutexGuard};
use rand::Rng;
use rand_chacha::ChaCha8Rng;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::ops::Range;

/// Where a node's thread is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Block {
    /// It holds the turn.
    Running,
    /// Between operations; no thread (or an exited one) when the node is not live.
    Idle,
    /// At its member gate: a device call on member `dev` waits to be granted.
    Gate { dev: usize, what: &'static str },
    /// In `own_stripes`, for these extents.
    Extents(Range<u64>),
    /// In `metadata_update_start`.
    Token,
    /// In `member_failed`, for every live node to acknowledge this device number.
    Acks(u32),
}

/// What the scheduler gives a thread with the turn.
#[derive(Debug)]
pub enum Instr {
    /// Its wait is over (I/O granted, extents free, token free, acknowledged).
    Go,
    Op(usize, Op),
    /// Hand the extent over to that node (it has no user here).
    Handoff(u64, usize),
    /// Another node recorded this device number faulty: apply and acknowledge it.
    Failure(u32),
    /// The node is dead: every wait ends at once, every device call fails.
    Die,
}

/// How far a node's fence reaches (off: the canaries).
#[derive(Clone, Copy, Debug)]
pub struct FenceRules {
    pub writes: bool,
    pub reads: bool,
}

#[derive(Debug)]
pub enum Event {
    Started(usize, usize),
    Finished(usize, usize, Outcome),
    Died(usize),
    /// The lease of this fenced node expired: the others may take its slot over.
    Expired(usize),
    /// Something a correct node never does (a fenced node's write after its lease ended).
    Violation(String),
}

#[derive(Debug, Clone, Copy)]
pub(crate) struct Owner {
    pub node: usize,
    pub users: usize,
    pub giving: bool,
}

#[derive(Debug)]
pub struct NodeState {
    /// Assembled (or assembling) and not stopped or dead: its acknowledgements count.
    pub live: bool,
    pub dead: bool,
    /// Its lease's deadline passed on its own clock (a partition): no writes, no reads.
    pub fenced: bool,
    /// ... and the lease is gone for the others too; its thread still runs.
    pub expired: bool,
    block: Block,
    queued: Option<(usize, Op)>,
    thread: Option<std::thread::ThreadId>,
}

#[derive(Debug, Default, Clone, Copy)]
pub struct Stats {
    pub grants: u64,
    pub handoffs: u64,
    pub claims: u64,
    pub served_failures: u64,
}

pub struct State {
    pub nodes: Vec<NodeState>,
    turn: Option<usize>,
    instr: Option<Instr>,
    pub(crate) token: Option<usize>,
    pub(crate) owners: BTreeMap<u64, Owner>,
    /// Device numbers recorded faulty, and the nodes that applied each.
    pub(crate) failures: BTreeMap<u32, BTreeSet<usize>>,
    pub ownership: bool,
    pub extent_bytes: u64,
    events: Vec<Event>,
    pub stats: Stats,
    /// The node to kill, and how many of its gated member writes to grant first.
    kill: Option<(usize, u32)>,
    /// The node to cut off from the cluster, and how many of its member writes to grant first.
    partition: Option<(usize, u32)>,
    pub fence: FenceRules,
    /// Every action taken, folded (a determinism witness).
    pub trace: u64,
    /// A node thread panicked (the scheduler panics with it instead of waiting forever).
    panicked: Option<String>,
}

#[derive(Debug, Clone, Copy)]
enum Action {
    Go(usize),
    Start(usize),
    Handoff(usize, u64, usize),
    Failure(usize, u32),
    Expire(usize),
}

pub struct World {
    pub(crate) st: Mutex<State>,
    /// The scheduler waits on `sched`, node `n`'s thread on `turns[n]` (only the one given
    /// the turn wakes).
    sched: Condvar,
    turns: Vec<Condvar>,
}

impl World {
    pub fn new(nodes: usize, ownership: bool, extent_bytes: u64, fence: FenceRules) -> World {
        World {
            st: Mutex::new(State {
                nodes: (0..nodes)
                    .map(|_| NodeState {
                        live: false,
                        dead: false,
                        fenced: false,
                        expired: false,
                        block: Block::Idle,
                        queued: None,
                        thread: None,
                    })
                    .collect(),
                turn: None,
                instr: None,
                token: None,
                owners: BTreeMap::new(),
                failures: BTreeMap::new(),
                ownership,
                extent_bytes,
                events: Vec::new(),
                stats: Stats::default(),
                kill: None,
                partition: None,
                fence,
                trace: 0xcbf2_9ce4_8422_2325,
                panicked: None,
            }),
            sched: Condvar::new(),
            turns: (0..nodes).map(|_| Condvar::new()).collect(),
        }
    }

    pub fn lock(&self) -> MutexGuard<'_, State> {
        self.st.lock()
    }

    /// Give the turn back as `block` and wait for it again; what the scheduler gave.
    pub fn wait_turn(&self, st: &mut MutexGuard<'_, State>, me: usize, block: Block) -> Instr {
        if st.nodes[me].dead {
            return Instr::Die;
        }
        assert_eq!(st.turn, Some(me), "node {me} blocks without the turn");
        assert_eq!(
            st.nodes[me].thread,
            Some(std::thread::current().id()),
            "node {me}'s engine ran on another thread"
        );
        st.nodes[me].block = block;
        st.turn = None;
        self.sched.notify_one();
        while st.turn != Some(me) && !st.nodes[me].dead {
            self.turns[me].wait(st);
        }
        if st.nodes[me].dead {
            return Instr::Die;
        }
        st.nodes[me].block = Block::Running;
        st.instr.take().expect("a turn comes with an instruction")
    }

    /// A node thread's first wait (it does not hold the turn yet).
    pub fn enter(&self, me: usize) -> Instr {
        let mut st = self.st.lock();
        st.nodes[me].thread = Some(std::thread::current().id());
        while st.turn != Some(me) && !st.nodes[me].dead {
            self.turns[me].wait(&mut st);
        }
        if st.nodes[me].dead {
            return Instr::Die;
        }
        st.nodes[me].block = Block::Running;
        st.instr.take().expect("a turn comes with an instruction")
    }

    /// The thread of `me` ends (its node stopped); gives the turn back.
    pub fn leave(&self, me: usize) {
        let mut st = self.st.lock();
        if st.nodes[me].dead {
            return;
        }
        if st.turn == Some(me) {
            st.turn = None;
        }
        let n = &mut st.nodes[me];
        n.live = false;
        n.fenced = false;
        n.expired = false;
        n.block = Block::Idle;
        n.thread = None;
        self.sched.notify_one();
    }

    /// Node `me`'s thread panicked with `why`.
    pub fn crashed(&self, me: usize, why: String) {
        let mut st = self.st.lock();
        st.panicked = Some(format!("node {me}'s thread panicked: {why}"));
        if st.turn == Some(me) {
            st.turn = None;
        }
        self.sched.notify_one();
    }

    pub fn event(&self, e: Event) {
        self.st.lock().events.push(e);
    }

    /// Queue an operation for an idle live node (or one about to join).
    pub fn queue(&self, node: usize, id: usize, op: Op) {
        let mut st = self.st.lock();
        assert!(st.nodes[node].queued.is_none());
        st.nodes[node].queued = Some((id, op));
    }

    /// Kill `node` at its gate when it next writes after `after` more granted member writes.
    pub fn arm_kill(&self, node: usize, after: u32) {
        self.st.lock().kill = Some((node, after));
    }

    /// Fence `node` (cut off from the cluster) when it next writes after `after` more
    /// granted member writes.
    pub fn arm_partition(&self, node: usize, after: u32) {
        self.st.lock().partition = Some((node, after));
    }

    /// A node is set to die or to be cut off.
    pub fn trouble_armed(&self) -> bool {
        let st = self.st.lock();
        st.kill.is_some() || st.partition.is_some()
    }

    pub fn disarm(&self) {
        let mut st = self.st.lock();
        st.kill = None;
        st.partition = None;
    }

    pub fn fenced(&self, node: usize) -> bool {
        self.st.lock().nodes[node].fenced
    }

    /// A member came back (re-added on a node alone): failures recorded before are history.
    pub fn forget_failures(&self) {
        self.st.lock().failures.clear();
    }

    /// Run until every node is idle with nothing queued; `on_event` sees what happened, in
    /// order. Panics on a deadlock (nothing can run, yet some node waits).
    pub fn run(&self, rng: &mut ChaCha8Rng, mut on_event: impl FnMut(Event)) {
        loop {
            let mut st = self.st.lock();
            while st.turn.is_some() && st.panicked.is_none() {
                self.sched.wait(&mut st);
            }
            if let Some(why) = st.panicked.take() {
                panic!("{why}");
            }
            let events = std::mem::take(&mut st.events);
            if !events.is_empty() {
                drop(st);
                events.into_iter().for_each(&mut on_event);
                continue;
            }
            let actions = st.runnable();
            if actions.is_empty() {
                let stuck = st
                    .nodes
                    .iter()
                    .any(|n| n.live && (n.block != Block::Idle || n.queued.is_some()));
                assert!(!stuck, "deadlock: nothing can run\n{}", st.dump());
                return;
            }
            let a = actions[rng.gen_range(0..actions.len())];
            self.apply(&mut st, a);
        }
    }

    fn apply(&self, st: &mut State, a: Action) {
        let (node, instr, tag) = match a {
            Action::Go(n) => (n, Instr::Go, 1),
            Action::Start(n) => {
                let (id, op) = st.nodes[n].queued.take().expect("queued");
                st.nodes[n].live = !st.nodes[n].expired;
                (n, Instr::Op(id, op), 2)
            }
            Action::Expire(n) => {
                st.trace = (st.trace ^ (5 << 8 | n as u64)).wrapping_mul(0x100_0000_01b3);
                return self.expire(st, n);
            }
            Action::Handoff(n, e, to) => (n, Instr::Handoff(e, to), 3 + e * 16 + to as u64),
            Action::Failure(n, dev) => (n, Instr::Failure(dev), 4 + dev as u64 * 16),
        };
        st.trace = (st.trace ^ (tag << 8 | node as u64)).wrapping_mul(0x100_0000_01b3);
        if let (Action::Go(n), &Block::Gate { what, dev }) = (a, &st.nodes[node].block) {
            st.stats.grants += 1;
            // Counted in member writes: it dies in the middle of writing.
            let write = what == "write";
            if write && st.nodes[n].expired {
                let why = format!("node {n} wrote to member {dev} after its lease ended");
                st.events.push(Event::Violation(why));
            }
            if let Some((_, left)) = st.partition.as_mut().filter(|(k, _)| *k == n && write) {
                // This write passed its fence check before the deadline: it lands.
                if *left == 0 {
                    st.partition = None;
                    st.nodes[n].fenced = true;
                } else {
                    *left -= 1;
                }
            }
            if let Some((_, left)) = st.kill.as_mut().filter(|(k, _)| *k == n && write) {
                if *left == 0 {
                    st.kill = None;
                    self.kill(st, n);
                    return;
                }
                *left -= 1;
            }
        }
        st.instr = Some(instr);
        st.turn = Some(node);
        self.turns[node].notify_one();
    }

    /// The node's host is gone: its device calls never reach the members again, the cluster
    /// forgets its token, its extents and its acknowledgements (its lease ended).
    fn kill(&self, st: &mut State, n: usize) {
        let node = &mut st.nodes[n];
        node.dead = true;
        node.live = false;
        // It may have died serving a hand-off before it started its operation.
        node.queued = None;
        node.thread = None;
        if st.token == Some(n) {
            st.token = None;
        }
        st.owners.retain(|_, o| o.node != n);
        st.events.push(Event::Died(n));
        self.turns[n].notify_one();
    }

    /// The fenced node's lease is gone for the others: they stop waiting for it (it can
    /// acknowledge nothing), its extents and token are free, its slot is to be taken over.
    fn expire(&self, st: &mut State, n: usize) {
        let node = &mut st.nodes[n];
        node.expired = true;
        node.live = false;
        if st.token == Some(n) {
            st.token = None;
        }
        st.owners.retain(|_, o| o.node != n);
        st.events.push(Event::Expired(n));
    }

    /// A dead node may join again (after its slot was taken over).
    pub fn revive(&self, n: usize) {
        let mut st = self.st.lock();
        assert!(st.nodes[n].dead && st.nodes[n].thread.is_none());
        st.nodes[n].dead = false;
        st.nodes[n].block = Block::Idle;
    }
}

impl State {
    fn runnable(&self) -> Vec<Action> {
        let mut out = Vec::new();
        for (i, n) in self.nodes.iter().enumerate() {
            if n.dead {
                continue;
            }
            if n.fenced && !n.expired && n.block == Block::Idle {
                out.push(Action::Expire(i));
            }
            match &n.block {
                Block::Idle if n.queued.is_some() => out.push(Action::Start(i)),
                Block::Gate { .. } => out.push(Action::Go(i)),
                Block::Extents(ext) if self.ownable(i, ext) => out.push(Action::Go(i)),
                Block::Token if self.token.is_none() => out.push(Action::Go(i)),
                Block::Acks(dev) if self.all_acked(*dev) => out.push(Action::Go(i)),
                _ => {}
            }
            if !n.live || n.fenced {
                continue;
            }
            // Where its thread holds no engine lock, a node applies other nodes' failures
            // (md-cluster's receive thread) ...
            if matches!(n.block, Block::Idle | Block::Extents(_) | Block::Acks(_)) {
                if let Some((&dev, _)) = self.failures.iter().find(|(_, a)| !a.contains(&i)) {
                    out.push(Action::Failure(i, dev));
                }
            }
            // ... and hands over extents it does not use that another node waits for (not
            // from a failure wait: its flush would wait for that failure's commit).
            if matches!(n.block, Block::Idle | Block::Extents(_)) {
                for (&e, o) in &self.owners {
                    if o.node != i || o.users > 0 || o.giving {
                        continue;
                    }
                    let wanted = self.nodes.iter().enumerate().find(|(j, m)| {
                        *j != i && matches!(&m.block, Block::Extents(x) if x.contains(&e))
                    });
                    if let Some((to, _)) = wanted {
                        out.push(Action::Handoff(i, e, to));
                    }
                }
            }
        }
        out
    }

    fn dump(&self) -> String {
        let mut s = String::new();
        for (i, n) in self.nodes.iter().enumerate() {
            let _ = writeln!(
                s,
                "node {i}: live {} dead {} fenced {} expired {} {:?} queued {:?}",
                n.live,
                n.dead,
                n.fenced,
                n.expired,
                n.block,
                n.queued.as_ref().map(|q| q.0)
            );
        }
        let _ = writeln!(
            s,
            "token {:?} owners {:?} failures {:?}",
            self.token, self.owners, self.failures
        );
        s
    }
}
