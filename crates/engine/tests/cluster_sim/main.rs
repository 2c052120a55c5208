//! Deterministic simulation of a clustered array (issue 23): two or three nodes, each an
//! `Array` on its own thread over the same simulated members, with an in-memory cluster that
//! has etcd's semantics as `ironraid/src/cluster` uses them (bitmap slots, shared metadata
//! under one token, failure agreement, and extent ownership as `ownership.rs` gives it: one
//! owner per extent, claimed on first use, handed over once its owner has no user there and
//! has flushed). Member I/O interleaves across nodes one device call at a time, in an order
//! drawn from the seed (`world.rs`), so the read-modify-writes of two nodes really meet.
//!
//! Every seed runs a workload (`driver.rs`) of writes (often different chunks of the same
//! stripes as another node, sometimes the same blocks; plain, FUA and gathered), reads,
//! flushes and verifies of a range; members fail (an injected device death, or `fail` on one
//! node) and come back (re-added on one node while the others left); a node may die in the
//! middle of its member writes, and a survivor takes its slot over; or a node is cut off from
//! the cluster but not from the members (a partition, `world.rs`): it fences itself, its lease
//! expires once its writes in flight have landed, a survivor takes its slot over while it
//! still runs (refusing its clients' writes and reads), and it exits and joins again when the
//! partition heals. Every read, on any node,
//! must return what the acknowledged writes allow (`model.rs`); after every takeover and
//! rebuild, parity read straight from the member images agrees; at the end every node reads
//! the same whole array, a check on one node alone counts no mismatch, and the images agree.
//!
//! Not simulated: background check, repair and resync while other nodes write (they rely on
//! windows every node holds, whose range lock is an engine lock another node's thread would
//! wait on where the scheduler cannot see it): they run while the other nodes are idle.
//! Lease timing itself (the margin between a node's own deadline and the lease's end at
//! etcd, and clock drift) is assumed, not simulated: the lease expires only once the cut-off
//! node is idle (`ironraid/src/cluster/node.rs` keeps that margin, `MAX_IO`).
//!
//! `IRONRAID_CLUSTER_CASES` sets the number of seeds per test, `IRONRAID_SEED_BASE` where they
//! start, `IRONRAID_SEED` replays one (see `testkit::seeds`).

mod cluster;
mod driver;
mod gate;
mod model;
mod node;
mod world;

use layout::Level;

#[derive(Clone, Copy, Debug)]
pub struct Shape {
    pub level: Level,
    pub layout: Option<u32>,
    pub members: usize,
    pub nodes: usize,
}

const RAID5: Shape = Shape {
    level: Level::Raid5,
    layout: Some(2),
    members: 4,
    nodes: 3,
};
const RAID6: Shape = Shape {
    level: Level::Raid6,
    layout: Some(2),
    members: 5,
    nodes: 2,
};
const RAID1: Shape = Shape {
    level: Level::Raid1,
    layout: None,
    members: 2,
    nodes: 2,
};

/// What a seed's run did: scheduler counts (grants, hand-offs, claims, failures served),
/// events, a fold of every scheduling decision and of every member image.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Report {
    pub stats: (u64, u64, u64, u64),
    pub deaths: u32,
    pub partitions: u32,
    pub failures: u32,
    pub readds: u32,
    pub verifies: u32,
    pub trace: u64,
    pub images: Vec<u64>,
}

fn seeds(count: u64, base: u64) -> testkit::Seeds {
    testkit::Seeds {
        count_var: "IRONRAID_CLUSTER_CASES",
        count,
        base,
    }
}

const ALL: driver::Knobs = driver::Knobs {
    ownership: true,
    member_failures: true,
    deaths: true,
    kill_at: None,
    takeover: true,
    partitions: true,
    partition_at: None,
    fence: world::FenceRules {
        writes: true,
        reads: true,
    },
    fail_while_cut_off: false,
};

fn run(shape: Shape, seed: u64, knobs: driver::Knobs) -> Result<Report, String> {
    driver::Sim::new(shape, seed, knobs).run_all()
}

/// Run every seed; fail with the first seed that fails (and the command replaying it).
fn every_seed(test: &str, shape: Shape, seeds: testkit::Seeds, knobs: driver::Knobs) {
    let t0 = std::time::Instant::now();
    let totals = std::sync::Mutex::new(Report::default());
    testkit::for_each_seed!(test, seeds, |seed| {
        let r = run(shape, seed, knobs).unwrap_or_else(|e| panic!("{shape:?}, seed {seed}: {e}"));
        let mut t = totals.lock().unwrap();
        t.stats.0 += r.stats.0;
        t.stats.1 += r.stats.1;
        t.stats.2 += r.stats.2;
        t.stats.3 += r.stats.3;
        t.deaths += r.deaths;
        t.partitions += r.partitions;
        t.failures += r.failures;
        t.readds += r.readds;
        t.verifies += r.verifies;
    });
    let t = totals.into_inner().unwrap();
    eprintln!(
        "{test}: {} seeds in {:.1?}: {} device calls granted, {} hand-offs, {} claims, \
         {} remote failures applied, {} member failures, {} re-adds, {} node deaths, {} partitions, \
         {} verifies beside writers",
        seeds.list().len(),
        t0.elapsed(),
        t.stats.0,
        t.stats.1,
        t.stats.2,
        t.stats.3,
        t.failures,
        t.readds,
        t.deaths,
        t.partitions,
        t.verifies
    );
}

#[test]
fn raid5_three_nodes_writing_shared_stripes_stay_consistent() {
    every_seed(
        "raid5_three_nodes_writing_shared_stripes_stay_consistent",
        RAID5,
        seeds(120, 0xc105_0000),
        ALL,
    );
}

#[test]
fn raid6_two_nodes_writing_shared_stripes_stay_consistent() {
    every_seed(
        "raid6_two_nodes_writing_shared_stripes_stay_consistent",
        RAID6,
        seeds(80, 0xc106_0000),
        ALL,
    );
}

#[test]
fn raid1_two_nodes_stay_consistent() {
    every_seed(
        "raid1_two_nodes_stay_consistent",
        RAID1,
        seeds(40, 0xc101_0000),
        ALL,
    );
}

/// Every seed kills a node in the middle of its I/O (at step 2): a survivor takes its slot
/// over; what it acknowledged reads back and parity agrees after the takeover's resync.
#[test]
fn a_node_dying_mid_write_leaves_acknowledged_data_and_parity_whole() {
    every_seed(
        "a_node_dying_mid_write_leaves_acknowledged_data_and_parity_whole",
        RAID5,
        seeds(60, 0xc1de_0000),
        driver::Knobs {
            deaths: false,
            partitions: false,
            kill_at: Some(2),
            ..ALL
        },
    );
}

/// Every seed cuts a node off from the cluster (not from the members) in the middle of its
/// I/O: it fences itself (its later writes and reads refused), its lease expires only once
/// its writes in flight have landed, a survivor takes its slot over while it is still
/// running, and it exits and joins again when the partition heals. No write of it reaches a
/// member after its lease ended, no read on any node returns what the writes do not allow,
/// and redundancy agrees after the takeover and at the end.
#[test]
fn a_node_cut_off_from_the_cluster_fences_itself_and_is_taken_over() {
    every_seed(
        "a_node_cut_off_from_the_cluster_fences_itself_and_is_taken_over",
        RAID5,
        seeds(60, 0xc1fe_0000),
        PARTITIONED,
    );
}

const PARTITIONED: driver::Knobs = driver::Knobs {
    deaths: false,
    partitions: false,
    partition_at: Some(2),
    ..ALL
};

/// The same seed twice: the same scheduling decisions and the same member images; another
/// seed: others.
#[test]
fn a_seed_replays_exactly() {
    let killing = driver::Knobs {
        kill_at: Some(2),
        ..ALL
    };
    for (shape, seed, knobs) in [(RAID5, 7, ALL), (RAID6, 8, ALL), (RAID5, 9, killing)] {
        let a = run(shape, seed, knobs).expect("first run");
        let b = run(shape, seed, knobs).expect("second run");
        assert_eq!(a, b, "{shape:?} seed {seed} ran differently twice");
        assert!(a.stats.0 > 1000, "a run grants device calls: {a:?}");
        let c = run(shape, seed + 100, knobs).expect("another seed");
        assert!(c.trace != a.trace && c.images != a.images, "{a:?}\n{c:?}");
    }
}

/// Runs `seeds` from `base` with ownership off; the errors of those that fail.
fn without_ownership(base: u64, seeds: u64, knobs: driver::Knobs) -> Vec<(u64, String)> {
    let knobs = driver::Knobs {
        ownership: false,
        ..knobs
    };
    let failed: Vec<(u64, String)> = (base..base + seeds)
        .filter_map(|seed| run(RAID5, seed, knobs).err().map(|e| (seed, e)))
        .collect();
    let with = |what: &str| failed.iter().filter(|(_, e)| e.contains(what)).count();
    eprintln!(
        "without ownership ({knobs:?}), {} of {seeds} seeds fail: {} with wrong reads, {} \
         with mismatches found by a verify beside writers, {} with check mismatches, {} with \
         parity wrong on the images; first: {:?}",
        failed.len(),
        with("which no write"),
        with("a verify while"),
        with("check on node"),
        with("member images: stripe"),
        failed.first()
    );
    failed
}

/// Canary: with ownership off (every node read-modify-writes every stripe whenever it
/// likes), on a healthy array with no node dying, the simulation must catch the damage: the
/// check at the end (and parity read straight from the images) finds parity two writers
/// tore, and reads find blocks a node's stale read-modify-write put back.
#[test]
fn without_ownership_the_simulation_finds_parity_torn_by_two_writers() {
    let healthy = driver::Knobs {
        member_failures: false,
        deaths: false,
        ..ALL
    };
    let failed = without_ownership(0xc0de_0000, 30, healthy);
    let torn = failed
        .iter()
        .filter(|(_, e)| e.contains("check on node") && e.contains("member images: stripe"))
        .count();
    assert!(
        torn >= 5,
        "without ownership only {torn} of 30 seeds ended with parity torn: {failed:?}"
    );
}

/// Canary: with ownership off and members failing, degraded reads rebuild from parity
/// another node tore: the model must see bytes no write put there.
#[test]
fn without_ownership_degraded_reads_return_what_no_write_put_there() {
    let failed = without_ownership(0xc0de_1000, 30, ALL);
    let wrong_reads = failed
        .iter()
        .filter(|(_, e)| e.contains("which no write"))
        .count();
    assert!(
        wrong_reads >= 5,
        "without ownership only {wrong_reads} of 30 seeds read wrong data: {failed:?}"
    );
}

/// The seeds of `seeds` whose run of `shape` with `knobs` fails with an error containing
/// `text` (printed under `what`, with the count).
fn failing_with(
    what: &str,
    (shape, knobs): (Shape, driver::Knobs),
    seeds: std::ops::Range<u64>,
    text: &str,
) -> Vec<u64> {
    let total = seeds.end - seeds.start;
    let found: Vec<u64> = seeds
        .filter(|&seed| {
            run(shape, seed, knobs)
                .err()
                .is_some_and(|e| e.contains(text))
        })
        .collect();
    eprintln!("{what}: {} of {total}: {found:?}", found.len());
    found
}

/// Canary: a node that goes on writing once it is fenced (its fence stops nothing) is
/// caught writing members after its lease ended. On a mirror: on parity levels the extent
/// ownership it can no longer reach refuses its writes as well.
#[test]
fn without_the_write_fence_a_cut_off_node_is_caught_writing_after_its_lease() {
    let knobs = driver::Knobs {
        fence: world::FenceRules {
            writes: false,
            reads: true,
        },
        ..PARTITIONED
    };
    let caught = failing_with(
        "without the write fence, seeds catching the cut-off node writing",
        (RAID1, knobs),
        0xfe0c_0000..0xfe0c_0000 + 20,
        "after its lease ended",
    );
    assert!(
        caught.len() >= 5,
        "too few seeds caught the unfenced writer"
    );
}

/// Canary: a node that goes on serving reads once it is fenced reads members the others
/// changed without it (a member they failed and wrote around, then rebuilt): the model sees
/// bytes no write allows.
#[test]
fn without_the_read_fence_a_cut_off_node_reads_what_the_others_changed() {
    let knobs = driver::Knobs {
        fence: world::FenceRules {
            writes: true,
            reads: false,
        },
        fail_while_cut_off: true,
        ..PARTITIONED
    };
    let stale = failing_with(
        "without the read fence, seeds reading stale data on the cut-off node",
        (RAID5, knobs),
        0xfe0d_0000..0xfe0d_0000 + 40,
        "which no write",
    );
    assert!(
        !stale.is_empty(),
        "no seed read stale data without the read fence"
    );
    let fenced = driver::Knobs {
        fence: ALL.fence,
        ..knobs
    };
    for seed in stale {
        if let Err(e) = run(RAID5, seed, fenced) {
            panic!("seed {seed} fails with the read fence too: {e}");
        }
    }
}

/// Canary: when nobody takes a dead node's slot over (and it never comes back), the stripes
/// it left half written stay torn: where the takeover's resync would have run, parity read
/// from the images must disagree on some seeds.
#[test]
fn without_a_takeover_the_stripes_a_dead_node_tore_are_found() {
    let knobs = driver::Knobs {
        deaths: false,
        kill_at: Some(2),
        takeover: false,
        ..ALL
    };
    let torn = failing_with(
        "without a takeover, seeds leaving stripes torn",
        (RAID5, knobs),
        0xdead_0000..0xdead_0000 + 40,
        "where a takeover would have resynced",
    );
    assert!(torn.len() >= 4, "dead nodes left too few stripes torn");
}
