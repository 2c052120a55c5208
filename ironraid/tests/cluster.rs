//! Cluster mode end to end: a real etcd (Debian's), two `ironraid run --cluster` nodes on the
//! same member files (each with its own IRONRAID_RUNDIR, as two hosts would have), real NBD
//! clients on each node's socket.

mod common;

use common::{mdadm_field, require_tools, sh, writers, Daemon, Env, BIN};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};
use testkit::etcd::EtcdServer;

const MIB: u64 = 1 << 20;
const MEMBER: u64 = 64 * MIB;

/// One node: its name and run directory.
struct Node {
    name: String,
    rundir: PathBuf,
    array: String,
}

impl Node {
    fn new(env: &Env, name: &str) -> Node {
        Node::on_host(env, name, name)
    }

    /// Node `name` with the run directory of host `host` (two daemons of one name need two).
    fn on_host(env: &Env, name: &str, host: &str) -> Node {
        let rundir = env.dir.path().join(format!("run-{host}"));
        std::fs::create_dir_all(&rundir).unwrap();
        Node {
            name: name.into(),
            rundir,
            array: env.name.clone(),
        }
    }

    fn cmd(&self) -> Command {
        let mut c = Command::new(BIN);
        c.env("IRONRAID_RUNDIR", &self.rundir);
        c
    }

    fn ironraid(&self, args: &[&str]) -> Output {
        self.cmd().args(args).output().expect("spawn ironraid")
    }

    fn ok(&self, args: &[&str]) -> String {
        let out = self.ironraid(args);
        assert!(
            out.status.success(),
            "node {}: ironraid {args:?} failed:\n{}",
            self.name,
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn detail(&self) -> serde_json::Value {
        serde_json::from_str(&self.ok(&["detail", &self.array, "--json"])).unwrap()
    }

    fn socket(&self) -> PathBuf {
        self.rundir.join(format!("{}.nbd", self.array))
    }

    fn uri(&self) -> String {
        format!(
            "nbd+unix:///{}?socket={}",
            self.array,
            self.socket().display()
        )
    }

    /// `ironraid run --cluster EP --node NAME EXTRA... MEMBERS`, once it serves; Err with its
    /// log if it exits first.
    fn try_run(
        &self,
        etcd: &EtcdServer,
        extra: &[&str],
        members: &[PathBuf],
    ) -> Result<Daemon, String> {
        let log = self.rundir.join("daemon.log");
        let child = self
            .cmd()
            .args(["run", "--cluster", &etcd.endpoint, "--node", &self.name])
            .args(extra)
            .args(members)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("spawn ironraid run");
        let mut d = Daemon { child, log };
        let ctl = self.rundir.join(format!("{}.ctl", self.array));
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::os::unix::net::UnixStream::connect(&ctl).is_err() {
            if let Ok(Some(st)) = d.child.try_wait() {
                return Err(format!("({st}) {}", d.log_text()));
            }
            assert!(
                Instant::now() < deadline,
                "node {} did not start:\n{}",
                self.name,
                d.log_text()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(d)
    }

    fn run(&self, etcd: &EtcdServer, extra: &[&str], members: &[PathBuf]) -> Daemon {
        self.try_run(etcd, extra, members)
            .unwrap_or_else(|log| panic!("node {} exited early:\n{log}", self.name))
    }

    /// Poll `detail --json` until `done` holds (panics after `secs`).
    fn wait_detail(
        &self,
        what: &str,
        secs: u64,
        done: impl Fn(&serde_json::Value) -> bool,
    ) -> serde_json::Value {
        let deadline = Instant::now() + Duration::from_secs(secs);
        loop {
            let d = self.detail();
            if done(&d) {
                return d;
            }
            assert!(
                Instant::now() < deadline,
                "node {}: timed out waiting for {what}: {d:#}",
                self.name
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// Nodes a (run with `a_args`, the first to start: the coordinator) and b of `env`'s array,
/// both serving and each seeing the other; their daemons run as long as the guards live.
fn both_serving(env: &Env, etcd: &EtcdServer, a_args: &[&str]) -> (Node, Node, Daemon, Daemon) {
    let (a, b) = (Node::new(env, "a"), Node::new(env, "b"));
    let da = a.run(etcd, a_args, &env.members);
    let db = b.run(etcd, &[], &env.members);
    a.wait_detail("both nodes", 10, |d| states(d).len() == 2);
    (a, b, da, db)
}

fn qemu_io(uri: &str, cmd: &str) -> String {
    sh("qemu-io", &["-f", "raw", uri, "-c", cmd])
}

/// What qemu-io printed for `cmd` (both streams), whether it succeeded or not.
fn qemu_io_failing(uri: &str, cmd: &str) -> String {
    let out = Command::new("qemu-io")
        .args(["-f", "raw", uri, "-c", cmd])
        .output()
        .unwrap();
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// A clustered RAID1 over the env's members, registered in `etcd`.
fn clustered(env: &Env, etcd: &EtcdServer, nodes: &str) {
    // The contract's form: no policy given, --nodes implies the bitmap.
    env.create(
        "1",
        &[
            "--bitmap-chunk",
            "4M",
            "--cluster",
            &etcd.endpoint,
            "--nodes",
            nodes,
        ],
    );
}

fn states(d: &serde_json::Value) -> Vec<(String, u64, String)> {
    d["cluster"]["nodes"]
        .as_array()
        .unwrap_or(&Vec::new())
        .iter()
        .map(|n| {
            (
                n["name"].as_str().unwrap_or("").to_string(),
                n["slot"].as_u64().unwrap_or(99),
                n["state"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect()
}

fn member_state(d: &serde_json::Value, path: &Path) -> String {
    common::member_state(d, path)
}

#[test]
fn two_nodes_serve_one_raid1_and_read_each_others_writes() {
    if !require_tools(&["qemu-io", "curl"]) {
        return;
    }
    let Some(etcd) = EtcdServer::start() else {
        return;
    };
    let env = Env::new("shared", 2, MEMBER);
    clustered(&env, &etcd, "2");
    let (a, b) = (Node::new(&env, "a"), Node::new(&env, "b"));
    let metrics = a.rundir.join("metrics.sock");
    let metrics_arg = format!("unix:{}", metrics.display());
    let _da = a.run(&etcd, &["--metrics", &metrics_arg], &env.members);
    let _db = b.run(&etcd, &[], &env.members);
    let d = b.wait_detail("both nodes in the view", 10, |d| states(d).len() == 2);
    assert_eq!(
        states(&d),
        vec![
            ("a".into(), 0, "active".into()),
            ("b".into(), 1, "active".into())
        ],
        "{d:#}"
    );
    assert_eq!(d["cluster"]["node"], "b");
    assert_eq!(d["cluster"]["coordinator"], "a");
    // Each node's writes (flushed: qemu-io flushes at exit) read back on the other.
    assert!(qemu_io(&a.uri(), "write -P 0x5a 0 1M").contains("wrote"));
    assert!(qemu_io(&b.uri(), "read -P 0x5a 0 1M").contains("read"));
    assert!(qemu_io(&b.uri(), "write -P 0xa5 8M 1M").contains("wrote"));
    assert!(qemu_io(&a.uri(), "read -P 0xa5 8M 1M").contains("read"));
    // Background work is the coordinator's: `action` on b is run by a, and b reports it as
    // its own (`--wait` follows it); `speed` on b is every node's.
    assert_eq!(check_mismatches(&b), 0);
    assert_eq!(a.detail()["sync"]["last_action"], "check");
    b.ok(&["speed", &env.name, "--max", "5M"]);
    a.wait_detail("b's speed applied on a", 5, |d| {
        d["sync"]["speed_max_bytes_per_s"] == 5 << 20
    });
    // Each node's view refreshes every third of its lease's TTL.
    a.wait_detail("node b in a's view", 10, |d| states(d).len() == 2);
    let status = a.ok(&["status"]);
    assert!(
        status.contains("cluster: a slot 0 active (this node, coordinator); b slot 1 active"),
        "{status}"
    );
    let scrape = sh(
        "curl",
        &[
            "-s",
            "--unix-socket",
            metrics.to_str().unwrap(),
            "http://x/metrics",
        ],
    );
    for line in [
        "ironraid_cluster_nodes{device=\"shared\",state=\"active\"} 2",
        "ironraid_cluster_coordinator{device=\"shared\",node=\"a\"} 1",
        "ironraid_cluster_fenced{device=\"shared\",node=\"a\"} 0",
    ] {
        assert!(scrape.contains(line), "{line} not in:\n{scrape}");
    }
}

#[test]
fn a_member_failed_on_one_node_is_failed_on_the_other_then_removed_and_replaced_while_both_serve() {
    if !require_tools(&["qemu-io"]) {
        return;
    }
    let Some(etcd) = EtcdServer::start() else {
        return;
    };
    let env = Env::new("agree", 2, MEMBER);
    clustered(&env, &etcd, "2");
    let (a, b) = (Node::new(&env, "a"), Node::new(&env, "b"));
    let _da = a.run(&etcd, &[], &env.members);
    let db = b.run(&etcd, &[], &env.members);
    a.ok(&["fail", &env.name, env.members[1].to_str().unwrap()]);
    // `fail` returned after node b acknowledged: it has stopped using the member.
    assert_eq!(member_state(&b.detail(), &env.members[1]), "faulty");
    assert!(qemu_io(&b.uri(), "write -P 0x33 0 64k").contains("wrote"));
    assert!(qemu_io(&a.uri(), "read -P 0x33 0 64k").contains("read"));
    // The failed member out on a: b drops it too (its superblocks never name it again).
    let failed = env.members[1].to_str().unwrap();
    a.ok(&["remove", &env.name, failed]);
    b.wait_detail("the member removed on b", 5, |d| {
        d["members"]
            .as_array()
            .is_some_and(|ms| ms.iter().all(|m| m["path"] != failed))
    });
    // A new one in on b, rebuilt by a (the coordinator) while both serve; a node that starts
    // after that does not fail the new member from the old failure's record.
    let spare = env.file("spare.img", MEMBER);
    b.ok(&["add", &env.name, spare.to_str().unwrap()]);
    assert!(qemu_io(&b.uri(), "write -P 0x34 8M 64k").contains("wrote"));
    let d = a.wait_detail("the rebuild", 30, |d| member_state(d, &spare) == "in_sync");
    b.wait_detail("b sees the member in sync", 10, |d| {
        member_state(d, &spare) == "in_sync"
    });
    assert!(
        data_bytes(&env, &spare, 8 * MIB, 65536) == vec![0x34; 65536],
        "{d:#}"
    );
    b.ok(&["stop", &env.name]);
    drop(db);
    let _db = b.run(&etcd, &[], &[env.members[0].clone(), spare.clone()]);
    std::thread::sleep(Duration::from_millis(500));
    let d = b.detail();
    assert_eq!(member_state(&d, &spare), "in_sync", "{d:#}");
    assert_eq!(member_state(&a.detail(), &spare), "in_sync");
}

#[test]
fn clustered_and_plain_arrays_refuse_the_other_way_to_run() {
    let Some(etcd) = EtcdServer::start() else {
        return;
    };
    let env = Env::new("refuse", 2, MEMBER);
    clustered(&env, &etcd, "2");
    let plain = env.ironraid(&[
        "run",
        env.members[0].to_str().unwrap(),
        env.members[1].to_str().unwrap(),
    ]);
    assert!(!plain.status.success());
    let err = String::from_utf8_lossy(&plain.stderr);
    assert!(err.contains("is clustered: run it with --cluster"), "{err}");
    let a = Node::new(&env, "a");
    let _da = a.run(&etcd, &[], &env.members);
    let twin = Node::on_host(&env, "a", "other-host");
    let err = twin
        .try_run(&etcd, &[], &env.members)
        .err()
        .expect("a second node of the same name");
    assert!(err.contains("already active"), "{err}");
    // A plain array cannot be run as a cluster's.
    let other = Env::new("plain", 2, MEMBER);
    other.create("1", &["--consistency-policy", "bitmap"]);
    let b = Node::new(&other, "b");
    let err = b
        .try_run(&etcd, &[], &other.members)
        .err()
        .expect("a plain array under --cluster");
    assert!(err.contains("was not created for a cluster"), "{err}");
}

#[test]
fn a_node_that_cannot_reach_etcd_refuses_writes_and_reads_and_still_stops() {
    if !require_tools(&["qemu-io"]) {
        return;
    }
    let Some(etcd) = EtcdServer::start() else {
        return;
    };
    let env = Env::new("fence", 2, MEMBER);
    clustered(&env, &etcd, "2");
    let a = Node::new(&env, "a");
    let mut da = a.run(&etcd, &["--lease-ttl", "6s"], &env.members);
    assert!(qemu_io(&a.uri(), "write -P 0x11 0 64k").contains("wrote"));
    etcd.pause(true);
    // Within TTL·(1−ρ) − 1 s of the last renewal (at most a third of the TTL ago).
    std::thread::sleep(Duration::from_millis(5200));
    let text = qemu_io_failing(&a.uri(), "write -P 0x22 0 64k");
    assert!(
        !text.contains("wrote") && text.contains("Input/output error"),
        "a write went out with the lease unconfirmed, or failed other than with EIO: {text}"
    );
    // Nor a read: past its deadline the others may have taken the node's slot over and
    // changed the members without it (it would read a member they failed).
    let read = qemu_io_failing(&a.uri(), "read -P 0x11 0 64k");
    assert!(
        !read.contains("read 65536") && read.contains("Input/output error"),
        "a read was served with the lease unconfirmed, or failed other than with EIO: {read}"
    );
    // What was written before is intact on both members.
    for m in &env.members {
        assert_eq!(data_bytes(&env, m, 0, 64 << 10), vec![0x11; 64 << 10]);
    }
    // A stop does not hang on etcd: it ends without recording the array clean.
    a.ok(&["stop", &env.name]);
    let t0 = Instant::now();
    while da.child.try_wait().unwrap().is_none() {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "the stop hangs:\n{}",
            da.log_text()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    etcd.pause(false);
}

/// Bytes `at..at+len` of a member file's data area.
fn data_bytes(env: &Env, member: &Path, at: u64, len: usize) -> Vec<u8> {
    use std::os::unix::fs::FileExt;
    let offset = env.examine(member)["data_offset_sectors"].as_u64().unwrap() * 512;
    let mut buf = vec![0u8; len];
    std::fs::File::open(member)
        .unwrap()
        .read_exact_at(&mut buf, offset + at)
        .unwrap();
    buf
}

fn scribble(env: &Env, member: &Path, at: u64, bytes: &[u8]) {
    use std::os::unix::fs::FileExt;
    let offset = env.examine(member)["data_offset_sectors"].as_u64().unwrap() * 512;
    std::fs::OpenOptions::new()
        .write(true)
        .open(member)
        .unwrap()
        .write_all_at(bytes, offset + at)
        .unwrap();
}

#[test]
fn a_killed_node_is_gone_for_the_survivor_which_resyncs_only_what_it_had_dirty() {
    if !require_tools(&["qemu-io"]) {
        return;
    }
    let Some(etcd) = EtcdServer::start() else {
        return;
    };
    let env = Env::new("takeover", 2, MEMBER);
    clustered(&env, &etcd, "2");
    let (a, b) = (Node::new(&env, "a"), Node::new(&env, "b"));
    let da = a.run(&etcd, &["--lease-ttl", "2s"], &env.members);
    // b's resync is slow (4 s for the chunk): long enough to see a as "recovering".
    let db = b.run(
        &etcd,
        &["--lease-ttl", "2s", "--speed-max", "1M"],
        &env.members,
    );
    b.wait_detail("both nodes", 10, |d| states(d).len() == 2);
    // A new bitmap has every bit set; a's daemon clears its slot's within a few passes.
    a.wait_detail("a's slot clean", 30, |d| d["bitmap"]["dirty_chunks"] == 0);
    // Node a writes and flushes 1 MiB in the second 4 MiB chunk; its bit stays set a while.
    assert!(qemu_io(&a.uri(), "write -P 0x77 4M 1M").contains("wrote"));
    da.kill9();
    let t0 = Instant::now();
    // Behind everyone's back, the mirrors now differ inside a's dirty chunk and outside it.
    scribble(&env, &env.members[1], 4 * MIB + 8192, &[0xee; 4096]);
    scribble(&env, &env.members[1], 20 * MIB, &[0xdd; 4096]);
    let d = b.wait_detail("a taken over by b", 15, |d| {
        states(d).contains(&("a".into(), 0, "recovering".into()))
            && d["cluster"]["coordinator"] == "b"
    });
    let noticed = t0.elapsed();
    assert!(
        noticed < Duration::from_secs(8),
        "noticed after {noticed:?}: {d:#}"
    );
    // b takes a's slot over and resyncs its dirty chunk (b is alone now).
    let deadline = Instant::now() + Duration::from_secs(20);
    while data_bytes(&env, &env.members[1], 4 * MIB + 8192, 4096) != vec![0x77; 4096] {
        assert!(
            Instant::now() < deadline,
            "a's dirty chunk was not resynced:\n{}",
            db.log_text()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let log = db.log_text();
    assert!(log.contains("took over a gone node's bitmap slot"), "{log}");
    assert!(log.contains("adopted_chunks=1"), "{log}");
    b.wait_detail("a gone once its chunk is resynced", 10, |d| {
        states(d).contains(&("a".into(), 0, "gone".into()))
    });
    // Only what a had dirty: the difference outside its chunk is left as it is.
    assert!(
        data_bytes(&env, &env.members[1], 20 * MIB, 4096) == vec![0xdd; 4096],
        "a clean chunk was resynced:\n{log}"
    );
    // a's flushed data reads back on b.
    assert!(qemu_io(&b.uri(), "read -P 0x77 4M 1M").contains("read"));
}

#[test]
fn a_dead_nodes_chunk_is_resynced_while_another_node_writes_and_the_mirrors_agree() {
    if !require_tools(&["qemu-io"]) {
        return;
    }
    let Some(etcd) = EtcdServer::start() else {
        return;
    };
    let env = Env::new("rounds", 2, MEMBER);
    clustered(&env, &etcd, "3");
    let (a, b, c) = (
        Node::new(&env, "a"),
        Node::new(&env, "b"),
        Node::new(&env, "c"),
    );
    let ttl = ["--lease-ttl", "2s"];
    let da = a.run(&etcd, &ttl, &env.members);
    let db = b.run(&etcd, &ttl, &env.members);
    let _dc = c.run(&etcd, &ttl, &env.members);
    a.wait_detail("three nodes", 10, |d| states(d).len() == 3);
    assert!(qemu_io(&b.uri(), "write -P 0x44 4M 1M").contains("wrote"));
    db.kill9();
    // Behind everyone's back the mirrors differ inside b's dirty chunk.
    scribble(&env, &env.members[1], 4 * MIB + 8192, &[0xee; 4096]);
    // c writes on, in b's chunk (other blocks) and elsewhere, while a takes b's slot over and
    // resyncs it (each window held on c first: `cluster::windows`, whose own test shows a held
    // window keeping c's writes out; from outside, the race is too narrow to show).
    let writer = {
        let uri = c.uri();
        std::thread::spawn(move || {
            for i in 0..40u64 {
                let at = if i % 2 == 0 { 6 * MIB } else { 30 * MIB } + (i / 2) * 65536;
                let out = qemu_io(&uri, &format!("write -P 0x{:02x} {at} 64k", 0x10 + i));
                assert!(out.contains("wrote"), "{out}");
            }
        })
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while data_bytes(&env, &env.members[1], 4 * MIB + 8192, 4096) != vec![0x44; 4096] {
        assert!(
            Instant::now() < deadline,
            "b's chunk was not resynced:\n{}",
            da.log_text()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    writer.join().unwrap();
    let log = da.log_text();
    assert!(log.contains("took over a gone node's bitmap slot"), "{log}");
    // The mirrors agree everywhere, and c's writes read back on a.
    let len = (MEMBER - 8 * MIB) as usize;
    assert!(
        data_bytes(&env, &env.members[0], 0, len) == data_bytes(&env, &env.members[1], 0, len),
        "the mirrors differ after the resync"
    );
    for i in 0..40u64 {
        let at = if i % 2 == 0 { 6 * MIB } else { 30 * MIB } + (i / 2) * 65536;
        let out = qemu_io(&a.uri(), &format!("read -P 0x{:02x} {at} 64k", 0x10 + i));
        assert!(out.contains("read"), "{out}");
    }
}

/// fio through `uri`: 64 KiB writes at `offset`, one every 192 KiB (the same chunk of every
/// stripe of a RAID5 ×4 with 64 KiB chunks), `loops` times over `size`, verified after; with
/// `verify_only`, only the verification of what such a run wrote.
fn fio_one_chunk_per_stripe(uri: &str, offset: u64, size: u64, verify_only: bool) {
    let args = fio_stripe_args(uri, offset, size, verify_only);
    fio_verified(uri, offset, &args);
}

/// [`fio_one_chunk_per_stripe`] `loops` times over, verified after.
fn fio_stripe_loops(uri: &str, offset: u64, size: u64, loops: u32) {
    let mut args = fio_stripe_args(uri, offset, size, false);
    args.retain(|s| s != "--loops=3");
    args.push(format!("--loops={loops}"));
    fio_verified(uri, offset, &args);
}

/// Run fio with `args` (its job at `offset` through `uri`): no error, nothing failed to verify.
fn fio_verified(uri: &str, offset: u64, args: &[String]) {
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = sh("fio", &refs);
    assert!(
        out.contains("err= 0"),
        "fio at {offset} through {uri}: {out}"
    );
    assert!(
        !out.contains("verify: bad"),
        "fio at {offset} through {uri}: {out}"
    );
}

fn fio_stripe_args(uri: &str, offset: u64, size: u64, verify_only: bool) -> Vec<String> {
    let mut args = vec![
        "--name=stripes".to_string(),
        "--ioengine=nbd".into(),
        format!("--uri={uri}"),
        "--rw=write:128k".into(),
        "--bs=64k".into(),
        format!("--offset={offset}"),
        format!("--size={size}"),
        "--iodepth=8".into(),
        "--verify=crc32c".into(),
        "--verify_fatal=1".into(),
        "--verify_state_save=0".into(),
        "--do_verify=1".into(),
    ];
    args.push(
        if verify_only {
            "--verify_only"
        } else {
            "--loops=3"
        }
        .into(),
    );
    args
}

/// The coordinator's parity check: the mismatch count it printed.
fn check_mismatches(node: &Node) -> u64 {
    let out = node.ok(&["action", &node.array, "check", "--wait"]);
    assert!(out.contains("check finished"), "{out}");
    out.trim()
        .rsplit(' ')
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("check printed no mismatch count: {out}"))
}

#[test]
fn two_nodes_writing_different_chunks_of_the_same_raid5_stripes_leave_parity_consistent() {
    if !require_tools(&["fio"]) {
        return;
    }
    let Some(etcd) = EtcdServer::start() else {
        return;
    };
    // Five members: writing one chunk of a stripe reads less by read-modify-write (old data
    // and parity) than by reconstruct-write (the three other data chunks), and a lost update
    // of parity stays lost (a reconstruct-write would recompute it from the data).
    let env = Env::new("stripes", 5, MEMBER);
    clustered_raid5(&env, &etcd);
    let (a, b, _da, _db) = both_serving(&env, &etcd, &[]);
    // a writes chunk 0 and b chunk 1 of the same stripes at the same time, over 96 MiB of
    // the array (two ownership extents): both read-modify-write every stripe's parity.
    const SIZE: u64 = 96 * MIB;
    let writers: Vec<_> = [(a.uri(), 0u64), (b.uri(), 65536)]
        .into_iter()
        .map(|(uri, offset)| std::thread::spawn(move || fio_chunks(&uri, offset, SIZE, false)))
        .collect();
    for w in writers {
        w.join().unwrap();
    }
    // Each node reads back what the other wrote; the check runs on a (the coordinator),
    // asked for on b.
    fio_chunks(&b.uri(), 0, SIZE, true);
    fio_chunks(&a.uri(), 65536, SIZE, true);
    assert_eq!(check_mismatches(&b), 0, "parity disagrees with the data");
    let (da, db) = (a.detail(), b.detail());
    let handoffs = da["cluster"]["extent_handoffs"].as_u64().unwrap()
        + db["cluster"]["extent_handoffs"].as_u64().unwrap();
    assert!(
        handoffs > 0,
        "the nodes never handed an extent over:\n{da:#}\n{db:#}"
    );
}

/// fio through `uri` on a RAID5 ×5 with 64 KiB chunks: one chunk of every stripe (every 256
/// KiB from `offset`), three times over and verified, or (`verify_only`) only verified.
fn fio_chunks(uri: &str, offset: u64, size: u64, verify_only: bool) {
    let mut args = fio_stripe_args(uri, offset, size, verify_only);
    for a in args.iter_mut().filter(|a| *a == "--rw=write:128k") {
        *a = "--rw=write:192k".into();
    }
    fio_verified(uri, offset, &args);
}

#[test]
fn a_raid5_node_killed_mid_write_leaves_its_flushed_data_and_consistent_parity_to_the_survivor() {
    if !require_tools(&["fio", "qemu-io"]) {
        return;
    }
    let Some(etcd) = EtcdServer::start() else {
        return;
    };
    let env = Env::new("kill5", 4, MEMBER);
    clustered_raid5(&env, &etcd);
    let (a, b, da, db) = both_serving_with_short_leases(&env, &etcd);
    // a's flushed data, in stripes that both nodes write afterwards.
    assert!(qemu_io(&a.uri(), "write -P 0x3c 128k 64k").contains("wrote"));
    const SIZE: u64 = 96 * MIB;
    // a writes chunk 0 of every stripe without end; b writes chunk 1 of the same stripes.
    let mut args = fio_stripe_args(&a.uri(), 0, SIZE, false);
    args.retain(|s| s != "--loops=3");
    args.push("--loops=1000".into());
    let mut fio_a = Command::new("fio")
        .args(&args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn fio");
    let uri_b = b.uri();
    let writer_b = std::thread::spawn(move || fio_stripe_loops(&uri_b, 65536, SIZE, 12));
    std::thread::sleep(Duration::from_secs(2));
    // a, writing on alone for a second, takes back every extent b had: it dies owning them.
    writer_b.join().unwrap();
    std::thread::sleep(Duration::from_secs(1));
    da.kill9();
    let _ = fio_a.kill();
    let _ = fio_a.wait();
    // b writes through a's extents once a's lease and the grace are over, takes a's slot over
    // and resyncs what a had dirty.
    fio_stripe_loops(&b.uri(), 65536, SIZE, 1);
    wait_for_takeover(&db);
    b.wait_detail("a's dirty chunks resynced", 60, |d| {
        d["sync"]["action"] == "idle"
    });
    let log = db.log_text();
    // The extents a owned when it died went to b.
    assert!(
        log.contains("took over the extent of a gone owner"),
        "{log}"
    );
    assert!(qemu_io(&b.uri(), "read -P 0x3c 128k 64k").contains("read"));
    fio_one_chunk_per_stripe(&b.uri(), 65536, SIZE, true);
    assert_eq!(check_mismatches(&b), 0, "parity disagrees with the data");
}

/// A clustered RAID5 with 64 KiB chunks on `env`'s members.
/// Wait (30 s at most) until node b's daemon `db` says it took node a's bitmap slot over.
fn wait_for_takeover(db: &Daemon) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !db
        .log_text()
        .contains("took over a gone node's bitmap slot")
    {
        assert!(
            Instant::now() < deadline,
            "a's slot was not taken over:\n{}",
            db.log_text()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Nodes a and b serving the env's members with 2 s leases (a dead node is gone soon).
fn both_serving_with_short_leases(env: &Env, etcd: &EtcdServer) -> (Node, Node, Daemon, Daemon) {
    let (a, b) = (Node::new(env, "a"), Node::new(env, "b"));
    let ttl = ["--lease-ttl", "2s"];
    let da = a.run(etcd, &ttl, &env.members);
    let db = b.run(etcd, &ttl, &env.members);
    b.wait_detail("both nodes", 10, |d| states(d).len() == 2);
    (a, b, da, db)
}

fn clustered_raid5(env: &Env, etcd: &EtcdServer) {
    env.create(
        "5",
        &[
            "--chunk",
            "64K",
            "--bitmap-chunk",
            "4M",
            "--cluster",
            &etcd.endpoint,
            "--nodes",
            "2",
        ],
    );
}

/// Two nodes of a clustered array of level `level` (64 KiB chunks) on 4 members write
/// different chunks of the same rows with fio; b fails member `failed` (a agrees before b's
/// degraded writes return) and adds a new one, which a (coordinating, its rebuild slowed)
/// rebuilds while both write on. What each wrote then reads back through the other node, the
/// redundancy agrees with the data, and with member `then_fail` gone too, b's chunks come
/// from the rebuilt member.
fn rebuilt_while_both_write(level: &str, failed: usize, then_fail: usize) {
    if !require_tools(&["fio"]) {
        return;
    }
    let Some(etcd) = EtcdServer::start() else {
        return;
    };
    let env = Env::new(&format!("rebuild{level}"), 4, MEMBER);
    env.create(
        level,
        &[
            "--chunk",
            "64K",
            "--bitmap-chunk",
            "4M",
            "--cluster",
            &etcd.endpoint,
            "--nodes",
            "2",
        ],
    );
    let (a, b, _da, _db) = both_serving(&env, &etcd, &["--speed-max", "16M"]);
    const SIZE: u64 = 96 * MIB;
    let writer = |uri: String, offset: u64, loops: u32| {
        std::thread::spawn(move || fio_stripe_loops(&uri, offset, SIZE, loops))
    };
    let wa = writer(a.uri(), 0, 1);
    let wb = writer(b.uri(), 65536, 1);
    wa.join().unwrap();
    wb.join().unwrap();
    b.ok(&["fail", &env.name, env.members[failed].to_str().unwrap()]);
    assert_eq!(member_state(&a.detail(), &env.members[failed]), "faulty");
    let spare = env.file("spare.img", MEMBER);
    b.ok(&["add", &env.name, spare.to_str().unwrap()]);
    let wa = writer(a.uri(), 0, 6);
    let wb = writer(b.uri(), 65536, 6);
    let d = a.wait_detail("a rebuilding the new member", 20, |d| {
        member_state(d, &spare) == "rebuilding"
    });
    let rb = b.wait_detail("b writing to the member being rebuilt", 20, |d| {
        member_state(d, &spare) == "rebuilding"
    });
    wa.join().unwrap();
    wb.join().unwrap();
    let d_done = a.wait_detail("the rebuild done", 60, |d| {
        member_state(d, &spare) == "in_sync"
    });
    let db_done = b.wait_detail("b seeing the member in sync", 10, |d| {
        member_state(d, &spare) == "in_sync"
    });
    fio_one_chunk_per_stripe(&b.uri(), 0, SIZE, true);
    fio_one_chunk_per_stripe(&a.uri(), 65536, SIZE, true);
    assert_eq!(
        check_mismatches(&a),
        0,
        "redundancy disagrees after the rebuild:\n{d:#}\n{rb:#}\n{d_done:#}\n{db_done:#}"
    );
    a.ok(&["fail", &env.name, env.members[then_fail].to_str().unwrap()]);
    fio_one_chunk_per_stripe(&a.uri(), 65536, SIZE, true);
}

#[test]
fn a_member_failed_on_one_raid5_node_is_rebuilt_while_both_nodes_write() {
    rebuilt_while_both_write("5", 3, 0);
}

/// Near copies over 4 members: a writes the chunks on members 0 and 1, b those on members 2
/// and 3, of the same rows; member 3 is rebuilt, then its partner 2 fails.
#[test]
fn a_member_failed_on_one_raid10_node_is_rebuilt_while_both_nodes_write() {
    rebuilt_while_both_write("10", 3, 2);
}

/// Bytes `path` really occupies on disk (the members are sparse files: what was never
/// written, or was discarded, takes nothing).
fn allocated(path: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).unwrap().blocks() * 512
}

#[test]
fn a_rebuild_while_both_nodes_serve_copies_only_the_regions_either_node_wrote() {
    let Some(etcd) = EtcdServer::start() else {
        return;
    };
    let env = Env::new("usedmaps", 4, MEMBER);
    clustered_raid5(&env, &etcd);
    let (a, b, _da, _db) = both_serving(&env, &etcd, &[]);
    // Each node writes 8 MiB of the array: 8/3 MiB of every member, three 1 MiB regions each.
    qemu_io(&a.uri(), "write -P 0xa1 0 8M");
    qemu_io(&b.uri(), "write -P 0xb2 96M 8M");
    let region = a.detail()["used_regions"]["region_bytes"].as_u64().unwrap();
    assert_eq!(region, MIB, "{:#}", a.detail());
    let failed = env.members[3].to_str().unwrap();
    b.ok(&["fail", &env.name, failed]);
    let spare = env.file("spare.img", MEMBER);
    b.ok(&["add", &env.name, spare.to_str().unwrap()]);
    let done = a.wait_detail("the rebuild done", 60, |d| {
        member_state(d, &spare) == "in_sync"
    });
    b.wait_detail("b seeing the member in sync", 10, |d| {
        member_state(d, &spare) == "in_sync"
    });
    assert_eq!(
        done["used_regions"]["used"], 6,
        "a knows the regions both nodes wrote: {done:#}"
    );
    // The new member got the six used regions and nothing else (its superblock, bitmap and
    // maps take well under a MiB).
    let copied = allocated(&spare);
    assert!(
        (6 * MIB..8 * MIB).contains(&copied),
        "{copied} bytes allocated on the rebuilt member of {MEMBER}"
    );
    assert_eq!(
        check_mismatches(&a),
        0,
        "parity disagrees after the rebuild"
    );
    // With another member gone, the rebuilt one's chunks are what both nodes' data is made of.
    a.ok(&["fail", &env.name, env.members[0].to_str().unwrap()]);
    for n in [&a, &b] {
        assert!(qemu_io(&n.uri(), "read -P 0xa1 0 8M").contains("read 8388608"));
        assert!(qemu_io(&n.uri(), "read -P 0xb2 96M 8M").contains("read 8388608"));
        assert!(qemu_io(&n.uri(), "read -P 0 40M 8M").contains("read 8388608"));
    }
}

#[test]
fn a_clustered_array_whose_nodes_are_gone_converts_back_and_resyncs_every_nodes_dirty_chunks() {
    if !require_tools(&["qemu-io", "mdadm"]) {
        return;
    }
    let Some(etcd) = EtcdServer::start() else {
        return;
    };
    let env = Env::new("leave", 2, MEMBER);
    clustered(&env, &etcd, "2");
    let (a, b) = (Node::new(&env, "a"), Node::new(&env, "b"));
    let ttl = ["--lease-ttl", "2s"];
    let _da = a.run(&etcd, &ttl, &env.members);
    let db = b.run(&etcd, &ttl, &env.members);
    b.wait_detail("both nodes", 10, |d| states(d).len() == 2);
    // b writes and dies with its chunk dirty in its slot; a stops cleanly.
    assert!(qemu_io(&b.uri(), "write -P 0x5b 12M 1M").contains("wrote"));
    db.kill9();
    a.ok(&["stop", &env.name]);
    let members: Vec<&str> = env.members.iter().map(|m| m.to_str().unwrap()).collect();
    let leave = |extra: &[&str]| {
        let mut args = vec!["leave-cluster"];
        args.extend_from_slice(extra);
        args.extend(&members);
        a.ironraid(&args)
    };
    // b's lease still lives (2 s): refused, nothing changed.
    let out = leave(&["--cluster", &etcd.endpoint]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("node b") && err.contains("alive"), "{err}");
    assert!(env.examine(&env.members[0])["cluster"].is_object());
    // Behind everyone's back the mirrors differ inside b's dirty chunk.
    scribble(&env, &env.members[1], 12 * MIB + 8192, &[0xee; 4096]);
    let deadline = Instant::now() + Duration::from_secs(15);
    let out = loop {
        let out = leave(&["--cluster", &etcd.endpoint]);
        if out.status.success() || Instant::now() > deadline {
            break out;
        }
        std::thread::sleep(Duration::from_millis(250));
    };
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(said.contains("2 node slot(s) gathered"), "{said}");
    for m in &env.members {
        let e = sh("mdadm", &["--examine", m.to_str().unwrap()]);
        let features =
            u32::from_str_radix(mdadm_field(&e, "Feature Map").trim_start_matches("0x"), 16)
                .unwrap();
        assert_eq!(features & 0x101, 0x001, "bitmap, not clustered:\n{e}");
        assert!(env.examine(m)["cluster"].is_null());
    }
    // A second conversion is refused; the array's etcd record is gone, and the plain array
    // runs without --cluster (and refuses it).
    let out = leave(&[]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not clustered"));
    let refused = a.try_run(&etcd, &[], &env.members).err().expect("refused");
    assert!(refused.contains("not created for a cluster"), "{refused}");
    let _d = env.run(&env.members);
    // The chunk b had dirty was resynced from the first mirror at the start.
    let deadline = Instant::now() + Duration::from_secs(20);
    while data_bytes(&env, &env.members[1], 12 * MIB + 8192, 4096) != vec![0x5b; 4096] {
        assert!(
            Instant::now() < deadline,
            "b's dirty chunk was not resynced"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(qemu_io(&env.uri(), "read -P 0x5b 12M 1M").contains("read"));
}

#[test]
fn a_node_whose_lease_expired_exits_to_rejoin_and_comes_back_with_a_new_epoch() {
    if !require_tools(&["qemu-io"]) {
        return;
    }
    let Some(etcd) = EtcdServer::start() else {
        return;
    };
    let env = Env::new("rejoin", 2, MEMBER);
    clustered(&env, &etcd, "2");
    let a = Node::new(&env, "a");
    let mut da = a.run(&etcd, &["--lease-ttl", "2s"], &env.members);
    let epoch = a.detail()["cluster"]["epoch"].as_i64().unwrap();
    assert!(qemu_io(&a.uri(), "write -P 0x21 0 64k").contains("wrote"));
    // etcd stops answering for longer than the lease; once it answers again, the lease is gone.
    etcd.pause(true);
    std::thread::sleep(Duration::from_secs(5));
    etcd.pause(false);
    let t0 = Instant::now();
    let status = loop {
        if let Some(st) = da.child.try_wait().unwrap() {
            break st;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "a fenced node kept running:\n{}",
            da.log_text()
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(status.code(), Some(75), "{}", da.log_text());
    assert!(
        da.log_text().contains("cluster lease lost"),
        "{}",
        da.log_text()
    );
    // Started again (as its unit does), it is a new member of the cluster.
    let _da = a.run(&etcd, &["--lease-ttl", "2s"], &env.members);
    let d = a.detail();
    assert!(d["cluster"]["epoch"].as_i64().unwrap() > epoch, "{d:#}");
    assert_eq!(d["cluster"]["slot"], 0, "{d:#}");
    assert!(qemu_io(&a.uri(), "read -P 0x21 0 64k").contains("read"));
    assert!(qemu_io(&a.uri(), "write -P 0x22 0 64k").contains("wrote"));
}

#[test]
fn nodes_reach_an_etcd_that_requires_tls_and_client_certificates() {
    if !require_tools(&["qemu-io", "openssl"]) {
        return;
    }
    let certs = tempfile::tempdir().unwrap();
    common::make_certificates(certs.path());
    let Some(etcd) = EtcdServer::start_tls(certs.path()) else {
        return;
    };
    assert!(etcd.endpoint.starts_with("https://"), "{}", etcd.endpoint);
    let pem = |f: &str| certs.path().join(f).to_str().unwrap().to_string();
    let tls = [
        "--etcd-cacert".to_string(),
        pem("ca-cert.pem"),
        "--etcd-cert".to_string(),
        pem("client-cert.pem"),
        "--etcd-key".to_string(),
        pem("client-key.pem"),
    ];
    let tls: Vec<&str> = tls.iter().map(String::as_str).collect();
    let env = Env::new("secure", 2, MEMBER);
    let base = [
        "--bitmap-chunk",
        "4M",
        "--cluster",
        &etcd.endpoint,
        "--nodes",
        "2",
    ];
    // Without a client certificate etcd refuses the connection, and nothing is written.
    let mut args = vec![
        "create",
        "--level",
        "1",
        "--name",
        "secure",
        "--assume-clean",
    ];
    args.extend(base);
    args.extend(&tls[..2]);
    let members = env.member_args();
    args.extend(members.iter().map(String::as_str));
    let out = env.ironraid(&args);
    assert!(
        !out.status.success(),
        "created without a client certificate"
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("etcd unreachable"), "{err}");
    let examined = env.ironraid(&["examine", env.members[0].to_str().unwrap()]);
    assert!(
        !examined.status.success(),
        "a member was written before etcd answered"
    );
    let mut extra: Vec<&str> = base.to_vec();
    extra.extend(&tls);
    env.create("1", &extra);
    let (a, b) = (Node::new(&env, "a"), Node::new(&env, "b"));
    let _da = a.run(&etcd, &tls, &env.members);
    let _db = b.run(&etcd, &tls, &env.members);
    b.wait_detail("both nodes", 10, |d| states(d).len() == 2);
    assert!(qemu_io(&a.uri(), "write -P 0x7e 0 1M").contains("wrote"));
    assert!(qemu_io(&b.uri(), "read -P 0x7e 0 1M").contains("read"));
}

/// Sixteen connections, alternating between two nodes, write interleaved 4 KiB blocks and
/// whole chunks of the same RAID5 stripes at once (`common::writers`): every stripe's parity
/// is updated by both nodes in every round, so extent ownership changes hands under load.
/// Both nodes then read back every byte, the parity agrees, and with a member failed on one
/// node the reads rebuilt from parity agree too.
#[test]
fn sixteen_writers_on_two_nodes_in_the_same_raid5_stripes_lose_nothing() {
    let Some(etcd) = EtcdServer::start() else {
        return;
    };
    let env = Env::new("sixteen", 4, MEMBER);
    clustered_raid5(&env, &etcd);
    let (a, b, _da, _db) = both_serving(&env, &etcd, &[]);
    let (sa, sb) = (a.socket(), b.socket());
    let servers = [
        (sa.as_path(), env.name.as_str()),
        (sb.as_path(), env.name.as_str()),
    ];
    let hot = writers::ROWS * 3 * writers::CHUNK;
    let w = writers::write_concurrently(&servers, &vec![0; hot], |r| r < writers::ROUNDS);
    assert_eq!(w.failed_writes + w.unanswered_writes, 0, "writes failed");
    for (node, sock) in [(&a, &sa), (&b, &sb)] {
        writers::compare(sock, &env.name, &w.model)
            .unwrap_or_else(|e| panic!("read through node {}: {e}", node.name));
    }
    assert_eq!(check_mismatches(&b), 0, "parity disagrees with the data");
    let handoffs: u64 = [&a, &b]
        .iter()
        .map(|n| n.detail()["cluster"]["extent_handoffs"].as_u64().unwrap())
        .sum();
    eprintln!("{handoffs} extent hand-offs");
    assert!(handoffs > 0, "the nodes never handed an extent over");
    b.ok(&["fail", &env.name, env.members[0].to_str().unwrap()]);
    a.wait_detail("the failure on both nodes", 10, |d| {
        member_state(d, &env.members[0]) == "faulty"
    });
    for (node, sock) in [(&a, &sa), (&b, &sb)] {
        writers::compare(sock, &env.name, &w.model)
            .unwrap_or_else(|e| panic!("degraded read through node {}: {e}", node.name));
    }
}

/// The sixteen writers of the test above, and one node killed mid-round: the survivor's
/// writes wait out the dead node's lease, it takes the slot over and resyncs what the dead
/// node had dirty; then every byte reads as written (an unanswered write's bytes old or new)
/// and the parity agrees.
#[test]
fn a_node_killed_under_sixteen_writers_on_two_nodes_loses_no_acknowledged_write() {
    let Some(etcd) = EtcdServer::start() else {
        return;
    };
    let env = Env::new("sixteenkill", 4, MEMBER);
    clustered_raid5(&env, &etcd);
    let (a, b, da, db) = both_serving_with_short_leases(&env, &etcd);
    let (sa, sb) = (a.socket(), b.socket());
    let servers = [
        (sa.as_path(), env.name.as_str()),
        (sb.as_path(), env.name.as_str()),
    ];
    let hot = writers::ROWS * 3 * writers::CHUNK;
    let w = std::thread::scope(|s| {
        let writing =
            s.spawn(|| writers::write_concurrently(&servers, &vec![0; hot], |r| r < 1000));
        std::thread::sleep(Duration::from_millis(400));
        da.kill9();
        writing.join().unwrap()
    });
    eprintln!(
        "{} rounds, {} writes unanswered",
        w.rounds, w.unanswered_writes
    );
    assert_eq!(w.failed_writes, 0, "writes failed");
    wait_for_takeover(&db);
    b.wait_detail("a's dirty chunks resynced", 60, |d| {
        d["sync"]["action"] == "idle"
    });
    let got = common::raw_client::Client::connect(&sb, &env.name).read(0, hot);
    assert_eq!(
        writers::unexplained(&got, &w),
        None,
        "a byte no write explains"
    );
    assert_eq!(check_mismatches(&b), 0, "parity disagrees with the data");
}
