//! md-cluster's per-node bitmap slots on simulated members: two nodes (two `Array`s over the
//! same SimDevices, slots 0 and 1) each write only their own slot; when node 0 dies without a
//! clean stop, node 1 takes its slot over and resyncs exactly the chunks node 0 had dirty,
//! and a power cut anywhere in the takeover still leaves nothing unsynced.

use device::{Device, PowerRail, SimDevice};
use engine::{
    Array, ArrayConfig, BitmapSpec, ClusterFormat, CreateSpec, EngineError, ManualClock, SyncAction,
};
use layout::Level;
use simkit::cluster::SlotNode as Node;
use simkit::settle;
use std::sync::Arc;
use std::time::Duration;

const MEMBER: u64 = 16 << 20;
const CHUNK: u64 = 64 << 10;
/// Chunks node 0 writes before it dies, and the one node 1 writes.
const NODE0_CHUNKS: [u64; 2] = [3, 50];
const NODE1_CHUNK: u64 = 100;
/// A chunk nobody writes: a difference planted there must survive the takeover's resync.
const QUIET_CHUNK: u64 = 200;

fn sims(seed: u64, rail: Option<&Arc<PowerRail>>) -> Vec<Arc<SimDevice>> {
    (0..2)
        .map(|i| {
            let d = SimDevice::new(format!("sim{i}"), MEMBER, seed + i);
            Arc::new(match rail {
                Some(r) => d.on_rail(r.clone()),
                None => d,
            })
        })
        .collect()
}

fn create(sims: &[Arc<SimDevice>], nodes: u32) {
    engine::create(&CreateSpec {
        bitmap: Some(BitmapSpec {
            chunk_bytes: Some(CHUNK),
            cluster: Some(ClusterFormat {
                nodes,
                name: "lab".into(),
            }),
        }),
        ..simkit::clean_spec(
            "cl",
            Level::Raid1,
            None,
            64 << 10,
            simkit::devs(sims),
            vec![],
        )
    })
    .expect("create");
}

fn node(sims: &[Arc<SimDevice>], slot: usize) -> engine::Result<Array> {
    node_with_clock(sims, slot, Arc::new(ManualClock::default()))
}

fn node_with_clock(
    sims: &[Arc<SimDevice>],
    slot: usize,
    clock: Arc<ManualClock>,
) -> engine::Result<Array> {
    simkit::reassemble_with(
        sims,
        ArrayConfig {
            deterministic_seed: Some(7),
            sync_window_bytes: CHUNK,
            coordinator: Some(Arc::new(Node(slot))),
            clock: Some(clock),
            ..ArrayConfig::default()
        },
    )
}

/// Set bits of slot `slot` on `dev`, by chunk.
fn slot_bits(dev: &SimDevice, slot: u32) -> Vec<u64> {
    let (sb, bits) = engine::read_bitmap_slot(dev, slot).expect("bitmap slot");
    (0..sb.chunks())
        .filter(|&c| format::bit_is_set(&bits, c))
        .collect()
}

fn data_offset(dev: &SimDevice) -> u64 {
    engine::read_superblock(dev).unwrap().data_offset * 512
}

/// A chunk's bytes on one mirror.
fn chunk_on(dev: &SimDevice, chunk: u64) -> Vec<u8> {
    let at = (data_offset(dev) + chunk * CHUNK) as usize;
    dev.contents()[at..at + CHUNK as usize].to_vec()
}

fn mirrors_agree(s: &[Arc<SimDevice>], chunk: u64) -> bool {
    chunk_on(&s[0], chunk) == chunk_on(&s[1], chunk)
}

/// Plant a difference on mirror 1 inside `chunk`.
fn scribble(s: &[Arc<SimDevice>], chunk: u64) {
    s[1].scribble(data_offset(&s[1]) + chunk * CHUNK + 4096, &[0x5a; 512]);
}

/// Both nodes up, node 0's initial all-ones slot cleared; node 1 wrote its chunk and node 0
/// its chunks; then node 0 is dropped without a clean stop (it "dies"), and node 1, idle, has
/// recorded the shared superblocks clean (md's safe mode): they say nothing about node 0's
/// slot, which is why the takeover must record "active" itself.
fn two_nodes_then_node0_dies(s: &[Arc<SimDevice>]) -> Array {
    create(s, 2);
    let n0 = node(s, 0).expect("node 0");
    n0.bitmap_pass();
    n0.bitmap_pass();
    assert!(slot_bits(&s[0], 0).is_empty(), "node 0's slot starts clear");
    let clock = Arc::new(ManualClock::default());
    let n1 = node_with_clock(s, 1, clock.clone()).expect("node 1");
    assert!(slot_bits(&s[0], 1).is_empty(), "slot 1 starts clear");
    n1.write(NODE1_CHUNK * CHUNK, &[1; 8192], false).unwrap();
    for c in NODE0_CHUNKS {
        n0.write(c * CHUNK, &[c as u8; 8192], false).unwrap();
    }
    for d in s {
        assert_eq!(
            slot_bits(d, 0),
            NODE0_CHUNKS,
            "{}: node 0 wrote slot 0",
            d.name()
        );
        assert_eq!(
            slot_bits(d, 1),
            [NODE1_CHUNK],
            "{}: node 1 wrote slot 1",
            d.name()
        );
    }
    drop(n0);
    clock.advance(Duration::from_secs(1));
    settle(&n1);
    assert!(
        engine::read_superblock(s[0].as_ref()).unwrap().is_clean(),
        "node 1's safe mode recorded the array clean"
    );
    n1
}

#[test]
fn a_survivor_takes_over_a_dead_nodes_slot_and_resyncs_only_its_chunks() {
    let s = sims(500, None);
    let n1 = two_nodes_then_node0_dies(&s);
    scribble(&s, NODE0_CHUNKS[0]);
    scribble(&s, QUIET_CHUNK);
    assert_eq!(n1.slot_dirty_chunks(0).unwrap(), 2);
    let reads_before: u64 = s.iter().map(|d| d.stats().reads).sum();
    let report = n1.take_over_slot(0).unwrap();
    assert_eq!(report.adopted_chunks, 2);
    assert_eq!(report.resync_from_bytes, Some(NODE0_CHUNKS[0] * CHUNK));
    for d in s.iter() {
        assert!(
            slot_bits(d, 0).is_empty(),
            "{}: dead slot cleared",
            d.name()
        );
        let mut own = NODE0_CHUNKS.to_vec();
        own.push(NODE1_CHUNK);
        assert_eq!(
            slot_bits(d, 1),
            own,
            "{}: adopted next to its own",
            d.name()
        );
    }
    assert_eq!(n1.slot_dirty_chunks(0).unwrap(), 0);
    settle(&n1);
    let reads: u64 = s.iter().map(|d| d.stats().reads).sum::<u64>() - reads_before;
    // Two 64 KiB chunks on two mirrors, plus the slot reads, against 256 chunks in all.
    assert!(reads < 40, "the takeover's resync read {reads} times");
    assert_eq!(n1.status().sync.last_action, SyncAction::Resync);
    for c in NODE0_CHUNKS {
        assert!(mirrors_agree(&s, c), "chunk {c} resynced");
    }
    assert!(
        !mirrors_agree(&s, QUIET_CHUNK),
        "a chunk no node had dirty is not visited"
    );
    // Node 1's own chunk stays its own: the resync did not take its bit.
    assert!(slot_bits(&s[0], 1).contains(&NODE1_CHUNK));
}

#[test]
fn slots_are_checked_at_assembly_and_takeover() {
    let s = sims(600, None);
    create(&s, 2);
    let err = node(&s, 2).err().expect("slot 2 of two");
    assert!(err.to_string().contains("no slot 2"), "{err}");
    let n1 = node(&s, 1).unwrap();
    assert!(matches!(
        n1.take_over_slot(1),
        Err(EngineError::InvalidArgument(_))
    ));
    assert!(n1.take_over_slot(2).is_err());
    assert!(n1.slot_dirty_chunks(2).is_err());
}

/// A power cut after `cut` device calls of the takeover (or of the resync after it); then the
/// machine restarts, node 1 joins again and, as md-cluster's joiner does for a slot nobody
/// holds, takes slot 0 over. Whatever was cut, every chunk node 0 had dirty ends in sync.
fn takeover_cut_at(seed: u64, cut: u64) {
    let rail = PowerRail::new();
    let s = sims(seed, Some(&rail));
    let n1 = two_nodes_then_node0_dies(&s);
    for c in NODE0_CHUNKS {
        scribble(&s, c);
    }
    rail.cut_after(cut);
    let _ = n1.take_over_slot(0);
    settle(&n1);
    drop(n1);
    for d in &s {
        d.power_cut();
    }
    rail.restore();
    let n1 = node(&s, 1).expect("node 1 after the cut");
    n1.take_over_slot(0).expect("takeover after the cut");
    settle(&n1);
    for c in NODE0_CHUNKS {
        assert!(
            mirrors_agree(&s, c),
            "seed {seed}, cut after {cut} calls: chunk {c} left out of sync"
        );
    }
    assert_eq!(n1.slot_dirty_chunks(0).unwrap(), 0);
}

/// Device calls (reads, writes, flushes) an uncut takeover makes.
fn takeover_calls() -> u64 {
    let s = sims(900, None);
    let n1 = two_nodes_then_node0_dies(&s);
    let calls = |s: &[Arc<SimDevice>]| -> u64 {
        s.iter()
            .map(|d| {
                let st = d.stats();
                st.reads + st.writes + st.flushes
            })
            .sum()
    };
    let before = calls(&s);
    n1.take_over_slot(0).unwrap();
    calls(&s) - before
}

#[test]
fn a_power_cut_anywhere_in_the_takeover_leaves_nothing_unsynced() {
    let calls = takeover_calls();
    eprintln!("an uncut takeover makes {calls} device calls");
    assert!(
        calls >= 8,
        "a takeover reads, writes and flushes: {calls} calls"
    );
    // Every cut point inside the takeover, and a few in the resync after it.
    for seed in 0..300u64 {
        takeover_cut_at(1000 + seed, seed % (calls + 12));
    }
}

/// A node that died with chunks dirty in its slot, while the other node went on and stopped
/// cleanly (the shared superblocks say clean), resyncs its own slot's chunks when it starts
/// again: the superblocks say nothing about its slot.
#[test]
fn a_node_restarting_after_its_crash_resyncs_its_own_slot_whatever_the_superblocks_say() {
    let s = sims(700, None);
    let n1 = two_nodes_then_node0_dies(&s);
    n1.close().unwrap();
    drop(n1);
    assert!(engine::read_superblock(s[0].as_ref()).unwrap().is_clean());
    scribble(&s, NODE0_CHUNKS[0]);
    scribble(&s, QUIET_CHUNK);
    let n0 = node(&s, 0).expect("node 0 again");
    assert_eq!(
        n0.status().bitmap.unwrap().dirty_chunks,
        2,
        "its slot as it left it, though its events lag the superblocks"
    );
    settle(&n0);
    assert!(
        mirrors_agree(&s, NODE0_CHUNKS[0]),
        "node 0's dirty chunk resynced"
    );
    assert!(!mirrors_agree(&s, QUIET_CHUNK), "and nothing else");
}

/// md-cluster's `gather_bitmaps`: a member re-added on node 1 recovers the chunks node 0 wrote
/// while it was out (in node 0's slot, which a stop while degraded leaves set), not only what
/// node 1's own slot holds.
#[test]
fn a_readd_recovers_what_any_node_wrote_while_the_member_was_out() {
    let s = sims(800, None);
    create(&s, 2);
    let n0 = node(&s, 0).unwrap();
    let n1 = node(&s, 1).unwrap();
    // Both nodes stop using the member (the cluster agrees on a failure before going on).
    n0.fail_member("sim1").unwrap();
    n1.fail_member("sim1").unwrap();
    n1.remove_member("sim1").unwrap();
    n0.write(7 * CHUNK, &[7; 8192], false).unwrap();
    n0.close().unwrap();
    drop(n0);
    assert_eq!(
        slot_bits(&s[0], 0),
        [7],
        "a degraded stop keeps node 0's bit"
    );
    assert!(slot_bits(&s[0], 1).is_empty());
    assert!(!mirrors_agree(&s, 7), "the member missed node 0's write");
    let writes_before = s[1].stats().writes;
    n1.add_member(s[1].clone() as Arc<dyn Device>, false)
        .unwrap();
    settle(&n1);
    assert!(
        n1.status().missing_roles.is_empty(),
        "re-added member in sync"
    );
    assert!(
        mirrors_agree(&s, 7),
        "node 0's chunk recovered onto the member"
    );
    let rebuilt = s[1].stats().writes - writes_before;
    // One chunk (plus superblock and bitmap writes), not the 240 of a full recovery.
    assert!(rebuilt < 20, "re-add wrote {rebuilt} times");
    assert_eq!(slot_bits(&s[0], 0), [7], "node 0's slot keeps its bit");
}

#[test]
fn leaving_the_cluster_refuses_a_member_that_fell_behind_and_converts_the_current_ones() {
    let s = sims(900, None);
    create(&s, 2);
    let n0 = node(&s, 0).expect("node 0");
    n0.fail_member(s[1].name()).expect("fail mirror 1");
    drop(n0);
    let devs = simkit::devs(&s);
    let err = engine::leave_cluster(&devs).expect_err("a failed member converted");
    assert!(
        err.to_string().contains("behind the other members"),
        "{err}"
    );
    assert!(
        engine::read_superblock(s[0].as_ref()).unwrap().feature_map & format::feature::CLUSTERED
            != 0,
        "a refused conversion changed a superblock"
    );
    let report = engine::leave_cluster(&devs[..1]).expect("the current member");
    assert_eq!(report.slots, 2);
    let sb = engine::read_superblock(s[0].as_ref()).unwrap();
    assert_eq!(sb.feature_map & format::feature::CLUSTERED, 0);
    assert_eq!(sb.events, report.events);
}
