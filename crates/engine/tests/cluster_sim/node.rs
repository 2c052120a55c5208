//! A node of the simulated cluster: its coordinator (the in-memory cluster's semantics, as
//! `ironraid/src/cluster` gives them over etcd) and the thread that runs its array.

use crate::world::{Block, Event, Instr, World};
use device::Device;
use engine::cluster::{Coordinator, SyncKind};
use engine::{Array, ArrayConfig, AssembleOptions, EngineError, ManualClock, SyncAction};
use parking_lot::Mutex;
use std::ops::Range;
use std::sync::{Arc, Weak};

/// What the driver asks a node to do.
#[derive(Debug)]
pub enum Op {
    /// Assemble the array (the node joins the cluster) and resync what its slot holds.
    Join,
    /// `data` at `at`; with `pieces`, as a gathered run of writes of these lengths (each
    /// beginning where the one before ends), acknowledged together.
    Write {
        at: u64,
        data: Arc<Vec<u8>>,
        fua: bool,
        pieces: Vec<usize>,
    },
    Read {
        at: u64,
        len: usize,
    },
    Flush,
    /// Fail this member here (the agreement fails it everywhere).
    Fail(String),
    /// Stop cleanly (the node leaves).
    Close,
    /// The partition healed: the node finds its lease gone and exits at once, without a stop
    /// (the daemon's exit 75), to join again as a new epoch.
    Exit,
    /// Remove the failed member of this index and add it back, then rebuild it (alone).
    Readd(usize),
    /// Take a dead node's bitmap slot over and resync what it had dirty.
    TakeOver(u32),
    /// Run a check to its end: the mismatches it counted.
    Check,
    /// A client's verify (repairing) of array bytes `at..at + len` while other nodes write:
    /// the mismatches it found.
    Verify {
        at: u64,
        len: u64,
    },
}

#[derive(Debug)]
pub enum Outcome {
    Done,
    Data(Vec<u8>),
    Mismatches(u64),
    Error(String),
    /// An error a fenced node returned (what it refused, or what it could not finish).
    Refused,
}

/// The node's side of the cluster: every wait goes through the world, which the scheduler
/// drives; what the scheduler hands the node while it waits is served on its own thread.
pub struct SimNode {
    world: Arc<World>,
    me: usize,
    array: Mutex<Weak<Array>>,
}

impl std::fmt::Debug for SimNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SimNode({})", self.me)
    }
}

impl SimNode {
    fn array(&self) -> Option<Arc<Array>> {
        self.array.lock().upgrade()
    }

    fn serve(&self, instr: Instr) {
        match instr {
            // ownership.rs's hand-off: no user is left here (the scheduler offers it only
            // then); what this node acknowledged is made durable, then the extent moves.
            Instr::Handoff(e, to) => {
                self.world.start_handoff(self.me, e);
                if let Some(a) = self.array() {
                    let _ = a.flush();
                }
                self.world.finish_handoff(self.me, e, to);
            }
            Instr::Failure(dev) => {
                if let Some(a) = self.array() {
                    a.member_failed_elsewhere(dev, "failed on another node");
                }
                self.world.acknowledge(self.me, dev);
            }
            Instr::Die => {}
            other => unreachable!("{other:?} served while waiting"),
        }
    }

    fn alone(&self, what: &str) -> engine::Result<()> {
        if self.world.live_nodes() == 1 {
            Ok(())
        } else {
            Err(EngineError::Busy(format!("{what} needs this node alone")))
        }
    }

    fn ownership(&self) -> bool {
        self.world.lock().ownership
    }
}

impl Coordinator for SimNode {
    fn slot_number(&self) -> usize {
        self.me
    }
    fn write_refusal(&self) -> Option<String> {
        let st = self.world.lock();
        let node = &st.nodes[self.me];
        if node.dead {
            return Some("this node is dead".into());
        }
        (node.fenced && st.fence.writes).then(|| "this node's lease is not confirmed".into())
    }
    fn read_refusal(&self) -> Option<String> {
        let st = self.world.lock();
        (st.nodes[self.me].fenced && st.fence.reads)
            .then(|| "this node's lease is not confirmed".into())
    }
    fn metadata_update_start(&self) {
        self.world.take_token(self.me);
    }
    fn shares_metadata(&self) -> bool {
        true
    }
    fn member_failed(&self, dev_number: u32) {
        self.world
            .agree_failure(self.me, dev_number, |i| self.serve(i));
    }
    fn sync_refusal(&self) -> Option<String> {
        None
    }
    fn recovery_allowed(&self) -> bool {
        self.world.live_nodes() == 1
    }
    fn recovery_starts(&self) -> bool {
        self.world.live_nodes() == 1
    }
    fn recovery_paused(&self) {}
    fn metadata_update_finish(&self, _events: u64) {
        self.world.give_token(self.me);
    }
    /// Background work runs only while the other nodes are idle (see the driver).
    fn area_resyncing(&self, _range: Range<u64>) -> bool {
        false
    }
    fn resync_info_update(&self, _kind: SyncKind, _range: Range<u64>) {}
    fn resync_finish(&self) {}
    fn own_stripes(&self, range: Range<u64>) -> Result<(), String> {
        if !self.ownership() {
            return Ok(());
        }
        let ext = self.world.extents(&range);
        self.world.own(self.me, ext, |i| self.serve(i))
    }
    fn release_stripes(&self, range: Range<u64>) {
        if self.ownership() {
            self.world.release(self.me, self.world.extents(&range));
        }
    }
    fn add_new_disk(&self, _device_uuid: [u8; 16]) -> engine::Result<()> {
        self.alone("adding a member")
    }
    fn remove_disk(&self, _dev_number: u32) -> engine::Result<()> {
        self.alone("removing a member")
    }
}

/// What a node thread needs to assemble its array.
pub struct NodeSetup {
    pub world: Arc<World>,
    pub me: usize,
    /// Its gated views of the shared members.
    pub devs: Vec<Arc<dyn Device>>,
    pub seed: u64,
    pub chunk: u64,
}

/// Start a node's thread: it joins when the scheduler starts its queued `Join`, and ends
/// after a `Close`, a failed join, or its death (its array then dropped without a stop).
pub fn spawn(setup: NodeSetup) -> std::thread::JoinHandle<()> {
    std::thread::Builder::new()
        .name(format!("sim-node-{}", setup.me))
        .spawn(move || {
            let (world, me) = (setup.world.clone(), setup.me);
            let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| node_main(setup)));
            if let Err(e) = ran {
                let why = e
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default();
                world.crashed(me, why);
            }
        })
        .expect("spawn a node thread")
}

fn node_main(s: NodeSetup) {
    let world = s.world.clone();
    let me = s.me;
    let coord = Arc::new(SimNode {
        world: world.clone(),
        me,
        array: Mutex::new(Weak::new()),
    });
    let mut array: Option<Arc<Array>> = None;
    let mut instr = world.enter(me);
    loop {
        match instr {
            Instr::Op(id, op) => {
                world.event(Event::Started(me, id));
                let leaves = matches!(op, Op::Close | Op::Exit);
                let mut out = run_op(&s, &coord, &mut array, op);
                if world.lock().nodes[me].dead {
                    return;
                }
                if matches!(out, Outcome::Error(_)) && world.fenced(me) {
                    out = Outcome::Refused;
                }
                let joined = array.is_some();
                world.event(Event::Finished(me, id, out));
                if leaves || !joined {
                    drop(array);
                    world.drop_extents(me);
                    world.leave(me);
                    return;
                }
            }
            Instr::Die => return,
            other => coord.serve(other),
        }
        let mut st = world.lock();
        instr = world.wait_turn(&mut st, me, Block::Idle);
    }
}

fn config(s: &NodeSetup, coord: &Arc<SimNode>) -> ArrayConfig {
    ArrayConfig {
        deterministic_seed: Some(s.seed ^ (s.me as u64) << 48),
        write_hold: std::time::Duration::ZERO,
        stripe_cache_bytes: 4 << 20,
        sync_window_bytes: 4 * s.chunk,
        coordinator: Some(coord.clone() as Arc<dyn Coordinator>),
        clock: Some(Arc::new(ManualClock::default())),
        ..ArrayConfig::default()
    }
}

fn settle(a: &Array) {
    for _ in 0..100_000 {
        if a.sync_step() == SyncAction::Idle {
            return;
        }
    }
    panic!("background work did not finish");
}

fn run_op(s: &NodeSetup, coord: &Arc<SimNode>, array: &mut Option<Arc<Array>>, op: Op) -> Outcome {
    let done = |r: engine::Result<()>| match r {
        Ok(()) => Outcome::Done,
        Err(e) => Outcome::Error(e.to_string()),
    };
    if let Op::Join = op {
        return join(s, coord, array);
    }
    let a = array.as_ref().expect("an operation on a node that joined");
    match op {
        Op::Join => unreachable!(),
        Op::Write {
            at,
            data,
            fua,
            pieces,
        } if !pieces.is_empty() => {
            let mut writes = Vec::new();
            let mut off = 0;
            for len in pieces {
                writes.push(engine::GatheredWrite {
                    offset_bytes: at + off as u64,
                    data: &data[off..off + len],
                    fua,
                    intent: None,
                });
                off += len;
            }
            assert_eq!(off, data.len());
            done(a.write_gathered(writes).into_iter().collect())
        }
        Op::Write { at, data, fua, .. } => done(a.write(at, &data, fua)),
        Op::Read { at, len } => {
            let mut buf = vec![0u8; len];
            match a.read(at, &mut buf) {
                Ok(()) => Outcome::Data(buf),
                Err(e) => Outcome::Error(e.to_string()),
            }
        }
        Op::Flush => done(a.flush()),
        Op::Fail(name) => done(a.fail_member(&name)),
        Op::Close => {
            let r = a.close();
            *array = None;
            done(r)
        }
        Op::Exit => {
            *array = None;
            Outcome::Done
        }
        Op::Readd(i) => {
            let dev = s.devs[i].clone();
            // A member whose device died while no I/O of this node reached it is still in
            // its role here: failed first (refused if it is failed already).
            let _ = a.fail_member(dev.name());
            let _ = a.remove_member(dev.name());
            let r = a.add_member(dev, false);
            settle(a);
            done(r)
        }
        Op::TakeOver(slot) => {
            let r = a.take_over_slot(slot).map(|_| ());
            settle(a);
            done(r)
        }
        Op::Verify { at, len } => match a.verify(&[(at, len)]) {
            Ok(r) => Outcome::Mismatches(r.mismatch_sectors),
            Err(e) => Outcome::Error(e.to_string()),
        },
        Op::Check => {
            settle(a);
            if let Err(e) = a.request_action("check") {
                return Outcome::Error(e.to_string());
            }
            settle(a);
            Outcome::Mismatches(a.status().sync.mismatch_sectors)
        }
    }
}

/// Assemble the array on this node and resync what its slot says it left dirty (the other
/// nodes are idle meanwhile).
fn join(s: &NodeSetup, coord: &Arc<SimNode>, array: &mut Option<Arc<Array>>) -> Outcome {
    s.world.joined(s.me);
    let opts = AssembleOptions {
        config: config(s, coord),
        ..Default::default()
    };
    match engine::assemble(s.devs.clone(), opts) {
        Ok(a) => {
            let a = Arc::new(a);
            *coord.array.lock() = Arc::downgrade(&a);
            settle(&a);
            *array = Some(a);
            Outcome::Done
        }
        Err(e) => Outcome::Error(format!("join: {e}")),
    }
}
