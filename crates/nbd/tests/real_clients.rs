//! Interoperability with real NBD clients: libnbd's nbdinfo/nbdcopy, qemu-io,
//! qemu-img and fio's nbd engine. A test whose client is not installed fails
//! (`common::require_tools`; `IRONRAID_ALLOW_MISSING_TOOLS=1` turns that into a
//! printed skip for local runs).

mod common;

use std::process::Command;
use std::sync::Arc;

use common::{require_tools, run, MemBackend, TestServer};
use rand::RngCore;

const MIB: usize = 1 << 20;

fn random_bytes(n: usize) -> Vec<u8> {
    let mut v = vec![0u8; n];
    rand::thread_rng().fill_bytes(&mut v);
    v
}

fn json_field<'a>(json: &'a str, key: &str) -> &'a str {
    let pat = format!("\"{key}\": ");
    let i = json
        .find(&pat)
        .unwrap_or_else(|| panic!("{key} missing in {json}"))
        + pat.len();
    let rest = &json[i..];
    let end = rest.find([',', '\n', '}']).unwrap();
    rest[..end].trim()
}

#[test]
fn nbdinfo_json_reports_size_flags_and_block_sizes() {
    if !require_tools(&["nbdinfo"]) {
        return;
    }
    let b = Arc::new(MemBackend::new(3 * MIB));
    let t = TestServer::one("disk0", b);
    let json = run(Command::new("nbdinfo").arg("--json").arg(t.uri("disk0")));
    assert_eq!(json_field(&json, "export-size"), (3 * MIB).to_string());
    for f in [
        "can_flush",
        "can_fua",
        "can_trim",
        "can_zero",
        "can_multi_conn",
        "can_cache",
        "can_fast_zero",
        "can_df",
    ] {
        assert_eq!(json_field(&json, f), "true", "{f} in {json}");
    }
    assert_eq!(json_field(&json, "is_read_only"), "false");
    assert_eq!(json_field(&json, "structured"), "true");
    assert!(json.contains("base:allocation"), "{json}");
    assert_eq!(json_field(&json, "block_size_minimum"), "512");
    assert_eq!(json_field(&json, "block_size_preferred"), "4096");
    assert_eq!(json_field(&json, "block_size_maximum"), MIB.to_string());
    assert_eq!(json_field(&json, "description"), "\"test export disk0\"");
    // Default export "" reaches the only export.
    let json = run(Command::new("nbdinfo").arg("--json").arg(t.uri("")));
    assert_eq!(json_field(&json, "export-size"), (3 * MIB).to_string());
    // Unknown export: GO fails with ERR_UNKNOWN, nbdinfo fails.
    let st = Command::new("nbdinfo").arg(t.uri("nope")).output().unwrap();
    assert!(!st.status.success());
    t.stop().unwrap();
}

#[test]
fn nbdinfo_read_only_and_list() {
    if !require_tools(&["nbdinfo"]) {
        return;
    }
    let mut ro = MemBackend::new(MIB);
    ro.read_only = true;
    let exports = vec![
        common::export("alpha", Arc::new(MemBackend::new(MIB))),
        common::export("beta", Arc::new(ro)),
    ];
    let t = TestServer::start(exports, nbd::Limits::default());
    let list = run(Command::new("nbdinfo").arg("--list").arg(t.uri("")));
    assert!(list.contains("export=\"alpha\""), "{list}");
    assert!(list.contains("export=\"beta\""), "{list}");
    assert!(list.contains("test export beta"), "{list}");
    let json = run(Command::new("nbdinfo").arg("--json").arg(t.uri("beta")));
    assert_eq!(json_field(&json, "is_read_only"), "true");
    t.stop().unwrap();
}

fn nbdcopy_roundtrip(connections: u32) {
    let size = 8 * MIB;
    let b = Arc::new(MemBackend::new(size));
    let t = TestServer::one("d", b.clone());
    let src = t.dir.path().join("src.img");
    let dst = t.dir.path().join("dst.img");
    let data = random_bytes(size);
    std::fs::write(&src, &data).unwrap();
    std::fs::write(&dst, []).unwrap();
    let conns = format!("--connections={connections}");
    run(Command::new("nbdcopy")
        .arg(&conns)
        .arg(&src)
        .arg(t.uri("d")));
    assert!(b.snapshot() == data, "backend differs after nbdcopy in");
    run(Command::new("nbdcopy")
        .arg(&conns)
        .arg(t.uri("d"))
        .arg(&dst));
    assert!(
        std::fs::read(&dst).unwrap() == data,
        "file differs after nbdcopy out"
    );
    t.stop().unwrap();
}

#[test]
fn nbdcopy_in_and_out_identical() {
    if !require_tools(&["nbdcopy"]) {
        return;
    }
    nbdcopy_roundtrip(1);
}

#[test]
fn nbdcopy_four_connections() {
    if !require_tools(&["nbdcopy"]) {
        return;
    }
    nbdcopy_roundtrip(4);
}

#[test]
fn qemu_io_odd_offsets_and_qemu_img_compare() {
    if !require_tools(&["qemu-io", "qemu-img"]) {
        return;
    }
    // min 512: qemu aligns (read-modify-write); min 1: the odd request
    // reaches the server as is.
    for min in [512, 1] {
        qemu_io_odd_offsets(min);
    }
}

fn qemu_io_odd_offsets(min: u32) {
    let mut m = MemBackend::new(MIB);
    m.block_sizes.min = min;
    let b = Arc::new(m);
    let t = TestServer::one("q", b.clone());
    let out = run(Command::new("qemu-io")
        .args(["-f", "raw", &t.uri("q")])
        .args([
            "-c",
            "write -P 0xab 513 1000",
            "-c",
            "read -P 0xab 513 1000",
        ])
        .args([
            "-c",
            "write -z 4096 8192",
            "-c",
            "discard 65536 4096",
            "-c",
            "flush",
        ]));
    assert!(!out.contains("verification failed"), "{out}");
    let snap = b.snapshot();
    assert_eq!(snap[512], 0);
    assert!(snap[513..1513].iter().all(|&x| x == 0xab));
    assert_eq!(snap[1513], 0);
    assert!(b.flushes.load(std::sync::atomic::Ordering::SeqCst) >= 1);
    // A wrong pattern is detected (the check above can fail).
    let out = Command::new("qemu-io")
        .args(["-f", "raw", &t.uri("q")])
        .args(["-c", "read -P 0xcd 513 1000"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("verification failed"), "{stdout}");

    qemu_img_compare(&t, &snap);
    t.stop().unwrap();
}

/// `qemu-img compare` sees `snap` equal to the export, and a one-byte change
/// as different.
fn qemu_img_compare(t: &TestServer, snap: &[u8]) {
    let img = t.dir.path().join("ref.img");
    std::fs::write(&img, snap).unwrap();
    let cmp = |img: &std::path::Path| {
        Command::new("qemu-img")
            .args(["compare", "-f", "raw", "-F", "raw"])
            .arg(img)
            .arg(t.uri("q"))
            .output()
            .unwrap()
    };
    let same = cmp(&img);
    assert!(
        same.status.success(),
        "{}",
        String::from_utf8_lossy(&same.stdout)
    );
    let mut other = snap.to_vec();
    other[700_000] ^= 0x5a;
    std::fs::write(&img, &other).unwrap();
    assert_eq!(
        cmp(&img).status.code(),
        Some(1),
        "qemu-img compare must see the difference"
    );
}

#[test]
fn fio_randrw_verify() {
    if !require_tools(&["fio"]) {
        return;
    }
    let b = Arc::new(MemBackend::new(16 * MIB));
    let t = TestServer::one("f", b.clone());
    let out = run(Command::new("fio")
        .args(["--name=nbdtest", "--ioengine=nbd", "--rw=randrw", "--bs=4k"])
        .args([
            "--iodepth=16",
            "--size=8M",
            "--verify=crc32c",
            "--do_verify=1",
        ])
        .args([
            "--verify_fatal=1",
            "--verify_state_save=0",
            "--output-format=terse",
        ])
        .current_dir(t.dir.path())
        .arg(format!("--uri={}", t.uri("f"))));
    assert!(!out.is_empty());
    assert!(b.writes.load(std::sync::atomic::Ordering::SeqCst) > 0);
    t.stop().unwrap();
}

#[test]
fn nbdinfo_over_tcp() {
    if !require_tools(&["nbdinfo"]) {
        return;
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let server = nbd::Server::new(
        vec![common::export("t", Arc::new(MemBackend::new(MIB)))],
        nbd::Limits::default(),
    );
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let port = listener.local_addr().unwrap().port();
    let task = rt.spawn(server.clone().serve_tcp(listener));
    let json = run(Command::new("nbdinfo")
        .arg("--json")
        .arg(format!("nbd://127.0.0.1:{port}/t")));
    assert_eq!(json_field(&json, "export-size"), MIB.to_string());
    server.shutdown();
    rt.block_on(task).unwrap().unwrap();
    assert_eq!(server.active_connections(), 0);
}
