//! Prometheus metrics (issue 26 item 6): `run --metrics` scraped with curl during a rebuild,
//! every value checked against what `detail --json` says around the scrape.

mod common;
use common::*;
use std::time::Duration;

const MIB: u64 = 1 << 20;

fn scrape_tcp(port: u16) -> String {
    sh(
        "curl",
        &[
            "-sSf",
            "--max-time",
            "10",
            &format!("http://127.0.0.1:{port}/metrics"),
        ],
    )
}

/// The value of series `name` whose labels include every pair of `labels`.
fn value(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find(|l| {
            let (series, _) = l.rsplit_once(' ').unwrap();
            let (n, rest) = series.split_once('{').unwrap_or((series, ""));
            n == name
                && labels
                    .iter()
                    .all(|(k, v)| rest.contains(&format!("{k}=\"{v}\"")))
        })
        .unwrap_or_else(|| panic!("no {name} {labels:?} in:\n{text}"))
        .rsplit_once(' ')
        .unwrap()
        .1
        .parse()
        .unwrap()
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn json_u64(v: &serde_json::Value) -> f64 {
    v.as_u64().unwrap() as f64
}

#[test]
fn metrics_during_a_rebuild_agree_with_detail() {
    if !require_tools(&["curl", "qemu-io"]) {
        return;
    }
    let env = Env::new("met5", 4, 64 * MIB);
    let spare = env.file("spare.img", 64 * MIB);
    env.create("5", &["--spare", spare.to_str().unwrap()]);
    let mut all = env.members.clone();
    all.push(spare.clone());
    let port = free_port();
    let unix = env.dir.path().join("metrics.sock");
    let d = env.run_with(
        &[
            "--metrics",
            &format!("tcp:127.0.0.1:{port}"),
            "--speed-max",
            "2M",
        ],
        &all,
    );
    sh(
        "qemu-io",
        &["-f", "raw", &env.uri(), "-c", "write -P 0x3c 0 120M"],
    );
    let idle = scrape_tcp(port);
    let dev = [("device", "met5")];
    assert_eq!(
        value(&idle, "ironraid_md_state", &[dev[0], ("state", "active")]),
        1.0
    );
    assert_eq!(
        value(&idle, "ironraid_md_disks", &[dev[0], ("state", "spare")]),
        1.0
    );
    let m0 = canon(&env.members[0]);
    let writes = value(
        &idle,
        "ironraid_member_ios_total",
        &[("member", &m0), ("op", "write")],
    );
    let written = value(
        &idle,
        "ironraid_member_bytes_total",
        &[("member", &m0), ("op", "write")],
    );
    assert!(
        writes > 0.0 && written >= (16 * MIB) as f64,
        "{writes} {written}"
    );

    env.ok(&["fail", "met5", &canon(&env.members[1])]);
    let before = env.wait_detail("the rebuild to make progress", 30, |d| {
        d["sync"]["action"] == "recover" && d["sync"]["done_bytes"].as_u64().unwrap() > 0
    });
    let text = scrape_tcp(port);
    let after = env.detail();
    assert_eq!(
        after["sync"]["action"], "recover",
        "the rebuild ended too soon: {after:#}"
    );
    let size = json_u64(&before["size_bytes"]);
    assert_eq!(
        value(&text, "ironraid_md_blocks", &dev),
        (size / 1024.0).floor()
    );
    assert_eq!(
        value(&text, "ironraid_md_disks_required", &dev),
        json_u64(&before["raid_devices"])
    );
    // Each bounded pool against its limit, as `detail --json` reports them.
    for pool in [
        "stripe_cache",
        "buffer_pool",
        "nbd_payload",
        "nbd_buffer_pool",
    ] {
        let at = [dev[0], ("pool", pool)];
        let limit = value(&text, "ironraid_pool_limit_bytes", &at);
        assert_eq!(
            limit,
            json_u64(&after["memory"][pool]["limit_bytes"]),
            "{pool}"
        );
        assert!(
            value(&text, "ironraid_pool_held_bytes", &at) <= limit,
            "{pool}"
        );
    }
    assert!(value(&text, "ironraid_resident_bytes", &dev) > 0.0);
    assert_eq!(
        value(
            &text,
            "ironraid_md_state",
            &[dev[0], ("state", "recovering")]
        ),
        1.0
    );
    assert_eq!(
        value(&text, "ironraid_md_state", &[dev[0], ("state", "active")]),
        0.0
    );
    assert_eq!(
        value(&text, "ironraid_md_disks", &[dev[0], ("state", "active")]),
        3.0
    );
    assert_eq!(
        value(&text, "ironraid_md_disks", &[dev[0], ("state", "failed")]),
        1.0
    );
    assert_eq!(
        value(&text, "ironraid_md_disks", &[dev[0], ("state", "down")]),
        1.0
    );
    assert_eq!(value(&text, "ironraid_degraded_members", &dev), 1.0);
    assert_eq!(
        value(
            &text,
            "ironraid_sync_action",
            &[dev[0], ("action", "recover")]
        ),
        1.0
    );
    let done = value(&text, "ironraid_sync_done_bytes", &dev);
    let (lo, hi) = (
        json_u64(&before["sync"]["done_bytes"]),
        json_u64(&after["sync"]["done_bytes"]),
    );
    assert!(lo <= done && done <= hi, "{lo} <= {done} <= {hi}");
    let synced = value(&text, "ironraid_md_blocks_synced", &dev);
    assert_eq!(synced, (done / 1024.0).floor());
    let total = value(&text, "ironraid_sync_total_bytes", &dev);
    assert_eq!(total, json_u64(&after["sync"]["total_bytes"]));
    let progress = value(&text, "ironraid_sync_progress_ratio", &dev);
    assert!((progress - done / total).abs() < 1e-9, "{progress}");
    let rate = value(&text, "ironraid_sync_rate_bytes_per_second", &dev);
    // The rate is detail's: how it counts skipped regions is status's business.
    assert!(rate > 0.0, "rate {rate}");
    let eta = value(&text, "ironraid_sync_eta_seconds", &dev);
    assert!((eta - (total - done) / rate).abs() < 1e-6, "{eta}");
    assert_eq!(
        value(&text, "ironraid_mismatch_count", &dev),
        json_u64(&after["mismatch_count"])
    );
    let used = value(&text, "ironraid_used_bytes", &dev);
    assert_eq!(used, json_u64(&after["used_regions"]["used_bytes"]));
    let sp = canon(&spare);
    assert_eq!(
        value(
            &text,
            "ironraid_member_state",
            &[("member", &sp), ("state", "rebuilding")]
        ),
        1.0
    );
    assert!(
        value(
            &text,
            "ironraid_member_bytes_total",
            &[("member", &sp), ("op", "write")]
        ) > 0.0
    );
    assert!(
        value(
            &text,
            "ironraid_member_ios_total",
            &[("member", &m0), ("op", "read")]
        ) > 0.0
    );
    assert_eq!(
        value(
            &text,
            "ironraid_member_io_errors_total",
            &[("member", &m0), ("op", "read")]
        ),
        0.0
    );
    assert_eq!(value(&text, "ironraid_nbd_connections", &dev), 0.0);

    // A client holding a connection is counted.
    let mut held = std::process::Command::new("qemu-io")
        .args(["-f", "raw", &env.uri(), "-c", "sleep 3000"])
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(3);
    let mut conns = 0.0;
    while conns == 0.0 && std::time::Instant::now() < deadline {
        conns = value(&scrape_tcp(port), "ironraid_nbd_connections", &dev);
    }
    held.wait().unwrap();
    assert_eq!(conns, 1.0);

    env.ok(&["speed", "met5", "--max", "1G"]);
    env.wait_detail("the rebuild to finish", 60, |d| {
        d["sync"]["action"] == "idle"
    });
    let end = scrape_tcp(port);
    assert_eq!(
        value(&end, "ironraid_md_state", &[dev[0], ("state", "active")]),
        1.0
    );
    assert_eq!(
        value(&end, "ironraid_md_blocks_synced", &dev),
        value(&end, "ironraid_md_blocks", &dev)
    );
    assert_eq!(
        value(&end, "ironraid_md_disks", &[dev[0], ("state", "active")]),
        4.0
    );
    assert!(
        end.trim_end().ends_with("# EOF"),
        "OpenMetrics text ends with # EOF"
    );
    assert!(
        sh(
            "curl",
            &[
                "-s",
                "-o",
                "/dev/null",
                "-w",
                "%{http_code}",
                &format!("http://127.0.0.1:{port}/")
            ]
        ) == "404"
    );
    env.stop(d);
    assert!(!unix.exists());
}

#[test]
fn metrics_over_a_unix_socket_with_integrity_counts() {
    if !require_tools(&["curl"]) {
        return;
    }
    let env = Env::new("met6", 4, 32 * MIB);
    env.create("6", &["--integrity", "crc32c"]);
    let sock = env.dir.path().join("metrics.sock");
    let d = env.run_with(
        &["--metrics", &format!("unix:{}", sock.display())],
        &env.members,
    );
    let text = sh(
        "curl",
        &[
            "-sSf",
            "--unix-socket",
            sock.to_str().unwrap(),
            "http://localhost/metrics",
        ],
    );
    let dev = [("device", "met6")];
    let det = env.detail();
    assert_eq!(value(&text, "ironraid_md_disks_required", &dev), 4.0);
    assert_eq!(
        value(&text, "ironraid_size_bytes", &dev),
        json_u64(&det["size_bytes"])
    );
    assert_eq!(
        value(&text, "ironraid_integrity_repaired_total", &dev),
        json_u64(&det["integrity_detail"]["repaired"])
    );
    assert_eq!(
        value(&text, "ironraid_spliced_reads_total", &dev),
        json_u64(&det["spliced_reads"])
    );
    assert_eq!(
        value(
            &text,
            "ironraid_integrity_errors_found_total",
            &[dev[0], ("kind", "data")]
        ),
        0.0
    );
    // Idle connections that never send a request hold at most 16 slots; past them a scrape is
    // closed at once rather than queued, and the slots come back when the idle clients go.
    let idle: Vec<std::os::unix::net::UnixStream> = (0..40)
        .map(|_| std::os::unix::net::UnixStream::connect(&sock).unwrap())
        .collect();
    std::thread::sleep(Duration::from_millis(200));
    let t = std::time::Instant::now();
    let sock_s = sock.to_str().unwrap();
    let url = "http://localhost/metrics";
    let out = std::process::Command::new("curl")
        .args(["-sSf", "--max-time", "15", "--unix-socket", sock_s, url])
        .output()
        .unwrap();
    assert!(
        !out.status.success(),
        "a scrape past the limit is closed unanswered"
    );
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    drop(idle);
    std::thread::sleep(Duration::from_millis(200));
    let again = sh(
        "curl",
        &["-sSf", "--max-time", "5", "--unix-socket", sock_s, url],
    );
    assert!(again.contains("ironraid_md_blocks"), "{again}");
    env.stop(d);
    assert!(!sock.exists(), "the metrics socket is removed at stop");
}
