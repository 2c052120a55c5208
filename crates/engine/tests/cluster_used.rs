//! Per-node used-region maps of a clustered array on simulated members: two nodes (two
//! `Array`s over the same SimDevices, slots 0 and 1) each record the regions they write in
//! their own slot's map; a rebuild on one node copies every region either node wrote and
//! discards the rest; a gone node's regions live on in the map of the node that took its slot
//! over; maps the superblocks were not written with count as all used.

use device::{Device, SimDevice};
use engine::{Array, ArrayConfig, BitmapSpec, ClusterFormat, CreateSpec, ManualClock};
use layout::Level;
use simkit::cluster::SlotNode as Node;
use simkit::settle;
use std::sync::Arc;

const MEMBER: u64 = 16 << 20;
const CHUNK: u64 = 64 << 10;
/// Regions (1 MiB here) node 0 writes, node 1 writes, and nobody writes.
const NODE0_REGION: u64 = 2;
const NODE1_REGION: u64 = 5;
const QUIET_REGION: u64 = 9;

/// Two mirrors and a blank device to rebuild onto.
fn sims(seed: u64) -> Vec<Arc<SimDevice>> {
    (0..3)
        .map(|i| Arc::new(SimDevice::new(format!("sim{i}"), MEMBER, seed + i)))
        .collect()
}

fn create(s: &[Arc<SimDevice>]) {
    engine::create(&CreateSpec {
        bitmap: Some(BitmapSpec {
            chunk_bytes: Some(CHUNK),
            cluster: Some(ClusterFormat {
                nodes: 2,
                name: "lab".into(),
            }),
        }),
        discard: true,
        ..simkit::clean_spec(
            "cl",
            Level::Raid1,
            None,
            CHUNK,
            simkit::devs(&s[..2]),
            vec![],
        )
    })
    .expect("create");
}

fn node(s: &[Arc<SimDevice>], slot: usize) -> Array {
    simkit::reassemble_with(
        &s[..2],
        ArrayConfig {
            deterministic_seed: Some(7),
            coordinator: Some(Arc::new(Node(slot))),
            clock: Some(Arc::new(ManualClock::default())),
            ..ArrayConfig::default()
        },
    )
    .expect("node")
}

fn data_offset(dev: &SimDevice) -> u64 {
    engine::read_superblock(dev).unwrap().data_offset * 512
}

fn region_bytes(a: &Array) -> u64 {
    a.status()
        .used_regions
        .expect("a clustered array keeps used-region maps")
        .region_bytes
}

/// The first 8 KiB of `region` on `dev`'s data area.
fn region_on(dev: &SimDevice, region: u64, rb: u64) -> Vec<u8> {
    let at = (data_offset(dev) + region * rb) as usize;
    dev.contents()[at..at + 8192].to_vec()
}

/// Clear every bit of node slot `slot`'s map on `dev`, behind the array's back.
fn wipe_map(dev: &SimDevice, slot: usize) {
    let sb = engine::read_superblock(dev).unwrap();
    let base = format::used_map_offset_sectors(&sb) * 512;
    let all = dev.contents();
    let head = format::UsedMapHeader::decode(&all[base as usize..]).expect("slot 0's map");
    let bytes = head.bytes_on_disk();
    let at = base + format::node_map_offset(bytes, slot) + format::USED_MAP_HEADER_BYTES as u64;
    dev.scribble(
        at,
        &vec![0; (bytes - format::USED_MAP_HEADER_BYTES as u64) as usize],
    );
}

/// Both nodes write a region each; node 1 stops cleanly; a difference is planted in a region
/// nobody wrote, on the mirror that stays. Returns node 0 and the region size.
fn two_nodes_wrote(s: &[Arc<SimDevice>]) -> (Array, u64) {
    create(s);
    let n0 = node(s, 0);
    let n1 = node(s, 1);
    let rb = region_bytes(&n0);
    n1.write(NODE1_REGION * rb, &[0x11; 8192], false).unwrap();
    n0.write(NODE0_REGION * rb, &[0x22; 8192], false).unwrap();
    n1.close().unwrap();
    drop(n1);
    s[0].scribble(data_offset(&s[0]) + QUIET_REGION * rb, &[0x5a; 512]);
    (n0, rb)
}

/// Node 0 replaces mirror 1 with the blank device and rebuilds it.
fn rebuild_onto_blank(n0: &Array, s: &[Arc<SimDevice>]) {
    n0.fail_member("sim1").unwrap();
    n0.remove_member("sim1").unwrap();
    n0.add_member(s[2].clone() as Arc<dyn Device>, false)
        .unwrap();
    settle(n0);
    assert!(n0.status().missing_roles.is_empty(), "rebuilt");
}

#[test]
fn a_rebuild_copies_the_regions_any_node_wrote_and_skips_the_rest() {
    let s = sims(100);
    let (n0, rb) = two_nodes_wrote(&s);
    rebuild_onto_blank(&n0, &s);
    assert_eq!(
        region_on(&s[2], NODE1_REGION, rb),
        vec![0x11; 8192],
        "node 1's region was copied although node 0's map does not have it"
    );
    assert_eq!(region_on(&s[2], NODE0_REGION, rb), vec![0x22; 8192]);
    assert!(
        region_on(&s[2], QUIET_REGION, rb).iter().all(|&b| b == 0),
        "a region no node wrote is skipped (the difference planted there was not copied)"
    );
    assert_eq!(
        n0.status().used_regions.unwrap().used,
        2,
        "the union of both maps"
    );
}

/// The canary: with node 1's map wiped behind the array's back, the same rebuild loses node
/// 1's region (the check above would fail), so it is the map that carries it.
#[test]
fn canary_a_rebuild_without_node_1s_map_loses_its_region() {
    let s = sims(200);
    let (n0, rb) = two_nodes_wrote(&s);
    wipe_map(&s[0], 1);
    rebuild_onto_blank(&n0, &s);
    assert!(
        region_on(&s[2], NODE1_REGION, rb).iter().all(|&b| b == 0),
        "with its map gone, node 1's region is skipped"
    );
}

#[test]
fn a_gone_nodes_regions_live_on_in_the_map_of_the_node_that_took_its_slot_over() {
    let s = sims(300);
    let (n0, rb) = two_nodes_wrote(&s);
    n0.take_over_slot(1).expect("take over node 1's slot");
    // Nobody writes slot 1's map any more; whatever happens to it, node 0's map has the region.
    wipe_map(&s[0], 1);
    rebuild_onto_blank(&n0, &s);
    assert_eq!(region_on(&s[2], NODE1_REGION, rb), vec![0x11; 8192]);
}

#[test]
fn maps_the_superblocks_were_not_written_with_count_as_all_used() {
    let s = sims(400);
    let (n0, rb) = two_nodes_wrote(&s);
    n0.close().unwrap();
    drop(n0);
    // Someone without the maps (md) ran the array: the superblocks move on, the maps do not.
    for d in &s[..2] {
        let mut sb = engine::read_superblock(d.as_ref()).unwrap();
        sb.events += 1;
        sb.utime &= format::MD_TIME_SECS_MASK;
        d.write_at(
            &device::AlignedBuf::copy_from(&sb.encode()),
            format::SB_OFFSET_SECTORS * 512,
            true,
        )
        .unwrap();
    }
    let n0 = node(&s, 0);
    let st = n0.status().used_regions.unwrap();
    assert_eq!(st.used, st.regions, "every region counts as used");
    // And stays so for the other node, whatever headers node 0's commits write from now on.
    n0.write(0, &[1; 4096], false).unwrap();
    let n1 = node(&s, 1);
    let st = n1.status().used_regions.unwrap();
    assert_eq!(st.used, st.regions, "node 1 finds its map all used too");
    n1.close().unwrap();
    drop(n1);
    rebuild_onto_blank(&n0, &s);
    assert_eq!(
        region_on(&s[2], QUIET_REGION, rb)[..512],
        [0x5a; 512],
        "the region nobody wrote (as far as the maps knew) is copied too"
    );
}

#[test]
fn leaving_the_cluster_keeps_every_nodes_regions_in_the_plain_arrays_one_map() {
    let s = sims(500);
    let (n0, rb) = two_nodes_wrote(&s);
    n0.close().unwrap();
    drop(n0);
    engine::leave_cluster(&simkit::devs(&s[..2])).expect("leave the cluster");
    let plain = simkit::reassemble(&s[..2]).expect("the plain array");
    let st = plain.status().used_regions.expect("a used-region map");
    assert_eq!(st.used, 2, "both nodes' regions, and only those");
    let mut buf = vec![0u8; 8192];
    plain.read(NODE1_REGION * rb, &mut buf).unwrap();
    assert_eq!(buf, vec![0x11; 8192], "node 1's region reads as written");
    plain.read(QUIET_REGION * rb, &mut buf).unwrap();
    assert!(
        buf.iter().all(|&b| b == 0),
        "a region no node wrote reads as zeroes (the difference planted there is not data)"
    );
}
