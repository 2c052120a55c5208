//! One seed's run: the cluster's nodes, the workload given to them step by step, the
//! maintenance between steps (takeover, re-add, rejoin), and the final checks.

use crate::model::Model;
use crate::node::{self, NodeSetup, Op, Outcome};
use crate::world::{Event, FenceRules, World};
use crate::{Report, Shape};
use device::{Device, SimDevice};
use engine::{BitmapSpec, ClusterFormat, CreateSpec, ManualClock};
use layout::{Geometry, GeometrySpec, Level};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

pub const CHUNK: u64 = 16 << 10;
const MEMBER: u64 = 2 << 20;
/// Stripes per extent: few, so that hand-offs are frequent.
const EXTENT_STRIPES: u64 = 2;
/// The stripes most operations aim at (so that nodes meet in them).
const HOT_STRIPES: u64 = 6;
const STEPS: usize = 24;
const SECTOR: u64 = 512;

/// What the driver knows of an operation it queued.
enum Known {
    Write(u64, Arc<Vec<u8>>),
    Read(u64, usize),
    Other,
}

/// The driver's side of the events: the model, and what went wrong.
#[derive(Default)]
struct Books {
    model: Model,
    known: HashMap<usize, (usize, Known)>,
    running: HashMap<usize, usize>,
    outcomes: HashMap<usize, Outcome>,
    /// Reads whose bytes the driver compares after the model did.
    keep: HashSet<usize>,
    deaths: Vec<usize>,
    expired: Vec<usize>,
    problems: Vec<String>,
    next_id: usize,
}

impl Books {
    fn on(&mut self, e: Event) {
        match e {
            Event::Started(n, id) => {
                self.running.insert(n, id);
                match &self.known[&id].1 {
                    Known::Write(at, data) => self.model.write_started(id, *at, data.clone()),
                    Known::Read(at, len) => self.model.read_started(id, *at, *len),
                    Known::Other => {}
                }
            }
            Event::Finished(n, id, out) => {
                self.running.remove(&n);
                match (&self.known[&id].1, out) {
                    (Known::Write(..), Outcome::Done) => self.model.write_ended(id),
                    (Known::Read(..), Outcome::Data(got)) => {
                        if let Some(why) = self.model.read_ended(id, &got) {
                            self.problems.push(format!("node {n}, op {id}: {why}"));
                        }
                        if self.keep.contains(&id) {
                            self.outcomes.insert(id, Outcome::Data(got));
                        }
                    }
                    (Known::Other, out) => {
                        self.outcomes.insert(id, out);
                    }
                    // A fenced node's write that failed may have landed in part, or not.
                    (Known::Write(..), Outcome::Refused) => self.model.write_died(id),
                    (Known::Read(..), Outcome::Refused) => self.model.read_dropped(id),
                    (_, Outcome::Error(e)) => {
                        self.problems.push(format!("node {n}, op {id} failed: {e}"))
                    }
                    (_, out) => self.problems.push(format!("node {n}, op {id}: {out:?}")),
                }
            }
            Event::Expired(n) => self.expired.push(n),
            Event::Violation(why) => self.problems.push(why),
            Event::Died(n) => {
                self.deaths.push(n);
                if let Some(id) = self.running.remove(&n) {
                    if matches!(self.known[&id].1, Known::Write(..)) {
                        self.model.write_died(id);
                    }
                }
            }
        }
    }
}

fn create(shape: Shape, seed: u64) -> (Vec<Arc<SimDevice>>, Geometry) {
    let sims: Vec<Arc<SimDevice>> = (0..shape.members)
        .map(|i| {
            Arc::new(SimDevice::new(
                format!("sim{i}"),
                MEMBER,
                seed ^ (i as u64) << 32,
            ))
        })
        .collect();
    let created = engine::create_with_clock(
        &CreateSpec {
            bitmap: Some(BitmapSpec {
                chunk_bytes: Some(4 * CHUNK),
                cluster: Some(ClusterFormat {
                    nodes: shape.nodes as u32,
                    name: "sim".into(),
                }),
            }),
            // Every region starts unused: walks skip what no node's used-region map has.
            discard: true,
            ..simkit::clean_spec(
                "clsim",
                shape.level,
                shape.layout,
                CHUNK,
                simkit::devs(&sims),
                vec![],
            )
        },
        &ManualClock::seeded(seed),
    )
    .expect("create");
    let geometry = Geometry::new(GeometrySpec {
        level: shape.level,
        layout: shape.layout.unwrap_or(layout::default_layout(shape.level)),
        chunk_sectors: if shape.level == Level::Raid1 {
            0
        } else {
            CHUNK / SECTOR
        },
        raid_disks: shape.members,
        component_sectors: created.component_sectors,
        device_sectors: Vec::new(),
    })
    .expect("geometry");
    assert_eq!(geometry.array_sectors() * SECTOR, created.array_bytes);
    (sims, geometry)
}

/// What a run may do.
#[derive(Clone, Copy, Debug)]
pub struct Knobs {
    /// Extent ownership (off: the canary).
    pub ownership: bool,
    /// Members fail now and then (and come back).
    pub member_failures: bool,
    /// A node may die at a random step...
    pub deaths: bool,
    /// ... or dies at this one.
    pub kill_at: Option<usize>,
    /// A survivor takes a dead node's slot over (off: a canary; the dead node stays away).
    pub takeover: bool,
    /// A node may be cut off from the cluster (not from the members) at a random step ...
    pub partitions: bool,
    /// ... or is cut off at this one.
    pub partition_at: Option<usize>,
    /// What a fenced node refuses (less: the canaries).
    pub fence: FenceRules,
    /// A member is failed on a live node while another is cut off, and the partition lasts
    /// long enough for the others to write around it (the read fence's canary).
    pub fail_while_cut_off: bool,
}

pub struct Sim {
    shape: Shape,
    seed: u64,
    world: Arc<World>,
    sims: Vec<Arc<SimDevice>>,
    threads: Vec<Option<std::thread::JoinHandle<()>>>,
    /// Workload choices, and the scheduler's.
    rng: ChaCha8Rng,
    sched: ChaCha8Rng,
    books: Books,
    size: u64,
    geometry: Geometry,
    stripe_bytes: u64,
    failed_member: Option<usize>,
    failed_for: usize,
    /// A dead node whose slot no survivor has taken over yet.
    untaken: Option<usize>,
    died_once: bool,
    /// A dead node nobody took over (the canary without takeovers).
    stays_dead: Option<usize>,
    /// A node cut off from the cluster whose lease expired, and the steps until the partition
    /// heals (it then exits, and joins again later).
    partitioned: Option<(usize, usize)>,
    knobs: Knobs,
    report: Report,
}

impl Sim {
    pub fn new(shape: Shape, seed: u64, knobs: Knobs) -> Sim {
        let (sims, geometry) = create(shape, seed);
        let size = geometry.array_sectors() * SECTOR;
        let data_disks = match shape.level {
            Level::Raid1 => 1,
            _ => geometry.data_disks() as u64,
        };
        let world = Arc::new(World::new(
            shape.nodes,
            knobs.ownership,
            EXTENT_STRIPES * CHUNK,
            knobs.fence,
        ));
        let mut sim = Sim {
            shape,
            seed,
            world,
            sims,
            threads: (0..shape.nodes).map(|_| None).collect(),
            rng: ChaCha8Rng::seed_from_u64(seed),
            sched: ChaCha8Rng::seed_from_u64(seed ^ 0x5c4e_d01e),
            books: Books {
                model: Model::new(size),
                ..Books::default()
            },
            size,
            geometry,
            stripe_bytes: CHUNK * data_disks,
            failed_member: None,
            failed_for: 0,
            untaken: None,
            died_once: false,
            stays_dead: None,
            partitioned: None,
            knobs,
            report: Report::default(),
        };
        // One after the other: a joining node resyncs its slot while the others are idle.
        for n in 0..shape.nodes {
            sim.join(n);
            sim.run();
        }
        sim
    }

    /// The whole run: the steps, then the final checks. Err: what went wrong.
    pub fn run_all(mut self) -> Result<Report, String> {
        // After a problem the run goes on: the end's checks say what else it broke.
        for step in 0..STEPS {
            self.step(step);
        }
        self.finish();
        self.shutdown();
        let s = self.world.lock();
        self.report.stats = (
            s.stats.grants,
            s.stats.handoffs,
            s.stats.claims,
            s.stats.served_failures,
        );
        self.report.trace = s.trace;
        drop(s);
        self.report.images = self
            .sims
            .iter()
            .map(|d| {
                d.contents()
                    .chunks(8)
                    .fold(0xcbf2_9ce4_8422_2325u64, |h, c| {
                        (h ^ u64::from_le_bytes(c.try_into().unwrap()))
                            .wrapping_mul(0x100_0000_01b3)
                    })
            })
            .collect();
        let p = &self.books.problems;
        if p.is_empty() {
            return Ok(self.report);
        }
        let kinds = [
            "which no",
            "differently",
            "check on node",
            "member images",
            "final",
        ];
        let firsts: Vec<&String> = kinds
            .iter()
            .filter_map(|k| p.iter().find(|p| p.contains(k)))
            .collect();
        let count = |k: &str| p.iter().filter(|p| p.contains(k)).count();
        Err(format!(
            "{} [{} problems: {} wrong reads, {} failed checks, {} bad images; firsts of each: {firsts:?}; {:?}]",
            p[0],
            p.len(),
            count(kinds[0]),
            count(kinds[2]),
            count(kinds[3]),
            self.report
        ))
    }

    fn run(&mut self) {
        let books = &mut self.books;
        self.world.run(&mut self.sched, |e| books.on(e));
        for n in std::mem::take(&mut self.books.deaths) {
            self.untaken = Some(n);
            self.report.deaths += 1;
        }
        for n in std::mem::take(&mut self.books.expired) {
            self.untaken = Some(n);
            let steps = match self.knobs.fail_while_cut_off {
                true => 5,
                false => self.rng.gen_range(1..=3),
            };
            self.partitioned = Some((n, steps));
            self.report.partitions += 1;
        }
    }

    fn devs(&self, node: usize) -> Vec<Arc<dyn Device>> {
        self.sims
            .iter()
            .enumerate()
            .map(|(i, s)| {
                Arc::new(crate::gate::Gated {
                    inner: s.clone(),
                    world: self.world.clone(),
                    node,
                    dev: i,
                }) as Arc<dyn Device>
            })
            .collect()
    }

    fn live(&self) -> Vec<usize> {
        let st = self.world.lock();
        (0..self.shape.nodes)
            .filter(|&n| st.nodes[n].live)
            .collect()
    }

    /// Nodes not running: stopped, or dead with their slot taken over.
    fn away(&self) -> Vec<usize> {
        let st = self.world.lock();
        (0..self.shape.nodes)
            .filter(|&n| {
                !st.nodes[n].live
                    && Some(n) != self.untaken
                    && Some(n) != self.stays_dead
                    && Some(n) != self.partitioned.map(|p| p.0)
            })
            .collect()
    }

    /// Start node `n`'s thread (again) and queue its join.
    fn join(&mut self, n: usize) {
        if let Some(t) = self.threads[n].take() {
            t.join().expect("a node thread panicked");
        }
        if self.world.lock().nodes[n].dead {
            self.world.revive(n);
        }
        self.threads[n] = Some(node::spawn(NodeSetup {
            world: self.world.clone(),
            me: n,
            devs: self.devs(n),
            seed: self.seed,
            chunk: CHUNK,
        }));
        self.queue(n, Op::Join);
    }

    fn queue(&mut self, n: usize, op: Op) -> usize {
        let b = &mut self.books;
        let id = b.next_id;
        b.next_id += 1;
        let kind = match &op {
            Op::Write { at, data, .. } => Known::Write(*at, data.clone()),
            Op::Read { at, len } => Known::Read(*at, *len),
            _ => Known::Other,
        };
        b.known.insert(id, (n, kind));
        self.world.queue(n, id, op);
        id
    }

    /// Run `op` on node `n` alone; its outcome.
    fn alone(&mut self, n: usize, op: Op) -> Outcome {
        let id = self.queue(n, op);
        self.run();
        self.books
            .outcomes
            .remove(&id)
            .unwrap_or_else(|| Outcome::Error("no outcome".into()))
    }

    fn expect_done(&mut self, n: usize, op: Op) {
        let what = format!("{op:?}");
        match self.alone(n, op) {
            Outcome::Done => {}
            other => self
                .books
                .problems
                .push(format!("node {n}: {what}: {other:?}")),
        }
    }

    /// One step: maintenance alone, or an operation for every live node at once.
    fn step(&mut self, step: usize) {
        if self.failed_member.is_some() {
            self.failed_for += 1;
        }
        self.partition_heals(false);
        if self.maintenance() {
            return;
        }
        let live = self.live();
        let failing_node = self.trouble(step, &live);
        // A node cut off from the cluster still takes client operations (it refuses them).
        let clients: Vec<usize> = live
            .iter()
            .copied()
            .chain(self.partitioned.map(|p| p.0))
            .collect();
        let targets = self.targets();
        let mut writes: Vec<(u64, u64)> = Vec::new();
        // Parity levels: now and then a node verifies (and repairs) a range while the others
        // write: it owns the stripes it compares, so it must find nothing. Not when a node
        // may die in this step: what that one tears is the takeover's to resync. (The
        // background check and repair walks rely on windows every node holds instead, which
        // this simulation does not have: they run while the other nodes are idle.)
        let quiet = self.failed_member.is_none()
            && failing_node.is_none()
            && !self.world.trouble_armed()
            && self.partitioned.is_none();
        let verifying = (quiet && self.shape.level != Level::Raid1 && self.rng.gen_bool(0.1))
            .then(|| live[self.rng.gen_range(0..live.len())]);
        let mut verify = None;
        for n in clients {
            let op = match failing_node {
                Some(f) if f == n => Op::Fail(format!("sim{}", self.failed_member.unwrap())),
                _ if verifying == Some(n) => {
                    let hot = HOT_STRIPES * self.stripe_bytes / SECTOR;
                    let len = self.rng.gen_range(1..=2 * self.stripe_bytes / SECTOR);
                    let at = self.rng.gen_range(0..hot - len) * SECTOR;
                    Op::Verify {
                        at,
                        len: len * SECTOR,
                    }
                }
                _ => self.client_op(&targets, &mut writes),
            };
            let id = self.queue(n, op);
            if verifying == Some(n) {
                verify = Some((n, id));
            }
        }
        self.run();
        if let Some((n, id)) = verify {
            match self.books.outcomes.remove(&id) {
                Some(Outcome::Mismatches(0)) => self.report.verifies += 1,
                other => self.books.problems.push(format!(
                    "node {n}: a verify while other nodes wrote: {other:?}"
                )),
            }
        }
    }

    /// Count down a partition; when it heals (or `now`), the cut-off node finds its lease gone
    /// and exits (it joins again later, once its slot was taken over).
    fn partition_heals(&mut self, now: bool) {
        let Some((n, left)) = self.partitioned else {
            return;
        };
        if left > 0 && !now {
            self.partitioned = Some((n, left - 1));
            return;
        }
        if self.untaken == Some(n) {
            self.take_over(n);
            self.untaken = None;
        }
        self.partitioned = None;
        self.expect_done(n, Op::Exit);
    }

    /// Maintenance, while the other nodes are idle: a takeover after a death, a re-add after
    /// a failure, nodes away joining again. Whether it ran (the step is then over).
    fn maintenance(&mut self) -> bool {
        if let Some(dead) = self.untaken.take() {
            if self.knobs.takeover {
                self.take_over(dead);
            } else {
                // The canary: the dead node stays away, its slot untaken.
                self.redundancy_agrees("where a takeover would have resynced");
                self.stays_dead = Some(dead);
            }
            return true;
        }
        if self.failed_member.is_some() && self.failed_for > 3 && self.rng.gen_bool(0.3) {
            self.readd();
            return true;
        }
        if self.failed_member.is_none() && !self.away().is_empty() && self.rng.gen_bool(0.3) {
            for n in self.away() {
                self.join(n);
                self.run();
            }
            return true;
        }
        false
    }

    /// What goes wrong in this step, on a healthy array: a member fails (its device dies, or
    /// `fail` on the node returned), or a node is set to die in the middle of its writes.
    fn trouble(&mut self, step: usize, live: &[usize]) -> Option<usize> {
        if self.failed_member.is_some() || self.world.trouble_armed() {
            return None;
        }
        if self.knobs.fail_while_cut_off && self.partitioned.is_some() {
            // `fail` on a live node: the member stays readable, and the others write around it.
            let m = self.rng.gen_range(0..self.sims.len());
            self.failed_member = Some(m);
            self.failed_for = 0;
            self.report.failures += 1;
            return Some(live[self.rng.gen_range(0..live.len())]);
        }
        if self.knobs.member_failures && self.rng.gen_bool(0.06) {
            let m = self.rng.gen_range(0..self.sims.len());
            self.failed_member = Some(m);
            self.failed_for = 0;
            self.report.failures += 1;
            if self.rng.gen_bool(0.5) {
                self.sims[m].set_dead(true);
                return None;
            }
            return Some(live[self.rng.gen_range(0..live.len())]);
        }
        if live.len() > 1 && !self.died_once {
            let forced = self.knobs.kill_at == Some(step);
            if forced || (self.knobs.deaths && self.rng.gen_bool(0.04)) {
                let victim = live[self.rng.gen_range(0..live.len())];
                self.world.arm_kill(victim, self.rng.gen_range(0..24));
                self.died_once = true;
            } else if self.knobs.partition_at == Some(step)
                || (self.knobs.partitions && self.rng.gen_bool(0.04))
            {
                let victim = live[self.rng.gen_range(0..live.len())];
                self.world.arm_partition(victim, self.rng.gen_range(0..24));
                self.died_once = true;
            }
        }
        None
    }

    /// This step's meeting points: a stripe every node aims at, and a block range.
    fn targets(&mut self) -> (u64, u64, u64) {
        let stripe = self.rng.gen_range(0..HOT_STRIPES);
        let sectors = self.rng.gen_range(1..=2 * CHUNK / SECTOR);
        let hot = HOT_STRIPES * self.stripe_bytes / SECTOR;
        let at = self.rng.gen_range(0..hot - sectors) * SECTOR;
        (stripe, at, sectors * SECTOR)
    }

    fn client_op(&mut self, targets: &(u64, u64, u64), writes: &mut Vec<(u64, u64)>) -> Op {
        let (stripe, shared_at, shared_len) = *targets;
        let r = &mut self.rng;
        let (at, len) = match r.gen_range(0..10) {
            // A chunk (or part of one) of the shared stripe: another node writes another.
            0..=4 => {
                let d = r.gen_range(0..self.stripe_bytes / CHUNK);
                let first = r.gen_range(0..CHUNK / SECTOR);
                let n = r.gen_range(1..=CHUNK / SECTOR - first);
                (
                    stripe * self.stripe_bytes + d * CHUNK + first * SECTOR,
                    n * SECTOR,
                )
            }
            5..=6 => (shared_at, shared_len),
            _ => {
                let hot = HOT_STRIPES * self.stripe_bytes / SECTOR;
                let n = r.gen_range(1..=2 * CHUNK / SECTOR);
                (r.gen_range(0..hot - n) * SECTOR, n * SECTOR)
            }
        };
        let at = at.min(self.size - len);
        match r.gen_range(0..100) {
            0..=54 => {
                // Mirrors have no stripe ownership: like md-cluster, they rely on the nodes'
                // users (a cluster file system) never writing one block from two at once.
                let mirror = self.shape.level == Level::Raid1;
                if mirror && writes.iter().any(|&(a, l)| at < a + l && a < at + len) {
                    return Op::Read {
                        at,
                        len: len as usize,
                    };
                }
                writes.push((at, len));
                let mut data = vec![0u8; len as usize];
                r.fill(&mut data[..]);
                // Now and then a gathered run (what the NBD frontend hands over at once).
                let mut pieces = Vec::new();
                if len > SECTOR && r.gen_bool(0.2) {
                    let cut = r.gen_range(1..len / SECTOR) * SECTOR;
                    pieces = vec![cut as usize, (len - cut) as usize];
                }
                Op::Write {
                    at,
                    data: Arc::new(data),
                    fua: r.gen_bool(0.1),
                    pieces,
                }
            }
            55..=84 => Op::Read {
                at,
                len: len as usize,
            },
            _ => Op::Flush,
        }
    }

    /// A survivor takes the dead node's slot over and resyncs what it had dirty.
    fn take_over(&mut self, dead: usize) {
        let live = self.live();
        let n = live[self.rng.gen_range(0..live.len())];
        self.expect_done(n, Op::TakeOver(dead as u32));
        self.redundancy_agrees("after the takeover's resync");
    }

    /// Between steps nothing is written: redundancy read from the images must agree.
    fn redundancy_agrees(&mut self, when: &str) {
        if let Some(e) = simkit::redundancy_error_in(&self.sims, &self.geometry) {
            self.books
                .problems
                .push(format!("member images {when}: {e}"));
        }
    }

    /// The failed member comes back: the other nodes leave, one re-adds and rebuilds it
    /// alone, and every node away joins again.
    fn readd(&mut self) {
        let m = self.failed_member.take().expect("a failed member");
        let live = self.live();
        let k = live[self.rng.gen_range(0..live.len())];
        for &n in live.iter().filter(|&&n| n != k) {
            self.expect_done(n, Op::Close);
        }
        self.sims[m].set_dead(false);
        self.world.forget_failures();
        self.expect_done(k, Op::Readd(m));
        self.report.readds += 1;
        self.redundancy_agrees("after the re-add's rebuild");
        for n in self.away() {
            self.join(n);
            self.run();
        }
    }

    /// Bring every node back with every member, read everything everywhere, then check
    /// redundancy on one node alone and straight from the member images.
    fn finish(&mut self) {
        self.world.disarm();
        self.partition_heals(true);
        if let Some(dead) = self.untaken.take() {
            self.take_over(dead);
        }
        if self.failed_member.is_some() {
            self.readd();
        }
        for n in self.away() {
            self.join(n);
            self.run();
        }
        let live = self.live();
        let reads: Vec<usize> = live
            .iter()
            .map(|&n| {
                let len = self.size as usize;
                let id = self.queue(n, Op::Read { at: 0, len });
                self.books.keep.insert(id);
                id
            })
            .collect();
        self.run();
        // Where concurrent writes left a choice, every node must still read the same.
        let images: Vec<Option<Outcome>> = reads
            .iter()
            .map(|id| self.books.outcomes.remove(id))
            .collect();
        if let [Some(Outcome::Data(first)), rest @ ..] = &images[..] {
            for (i, other) in rest.iter().enumerate() {
                if !matches!(other, Some(Outcome::Data(d)) if d == first) {
                    let node = live[i + 1];
                    self.books.problems.push(format!(
                        "node {node} reads the array differently from node {}",
                        live[0]
                    ));
                }
            }
        }
        let k = live[self.rng.gen_range(0..live.len())];
        for &n in live.iter().filter(|&&n| n != k) {
            self.expect_done(n, Op::Close);
        }
        match self.alone(k, Op::Check) {
            Outcome::Mismatches(0) => {}
            other => self.books.problems.push(format!(
                "check on node {k} after every other left: {other:?}"
            )),
        }
        self.expect_done(k, Op::Close);
        self.check_images();
    }

    /// One host assembles the members the cluster left: the array reads as the model says
    /// and its redundancy agrees, read straight from the images.
    fn check_images(&mut self) {
        let config = engine::ArrayConfig {
            deterministic_seed: Some(self.seed),
            clock: Some(Arc::new(ManualClock::default())),
            ..simkit::config()
        };
        let array = match simkit::reassemble_with(&self.sims, config) {
            Ok(a) => a,
            Err(e) => return self.books.problems.push(format!("final assembly: {e}")),
        };
        let mut all = vec![0u8; self.size as usize];
        if let Err(e) = array.read(0, &mut all) {
            self.books.problems.push(format!("final read: {e}"));
        } else if let Some(why) = self.books.model.check_quiet(&all) {
            self.books.problems.push(format!("final image: {why}"));
        }
        let sa = simkit::SimArray {
            sims: self.sims.clone(),
            array,
            level: self.shape.level,
            layout: self.shape.layout,
        };
        if let Some(e) = simkit::redundancy_error(&sa) {
            self.books.problems.push(format!("member images: {e}"));
        }
        let _ = sa.array.close();
    }

    /// Stop what still runs (after a problem, without checks): every thread ends.
    fn shutdown(&mut self) {
        self.world.disarm();
        if let Some((n, _)) = self.partitioned.take() {
            let _ = self.alone(n, Op::Exit);
        }
        for n in self.live() {
            let _ = self.alone(n, Op::Close);
        }
        for t in self.threads.iter_mut().filter_map(Option::take) {
            t.join().expect("a node thread panicked");
        }
    }
}
