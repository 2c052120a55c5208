//! The daemon's memory by named limit (issue 24 item 5): `detail --json` reports what each
//! bounded pool and queue holds against its limit, and after client load none is past it.

mod common;

use common::{require_tools, sh, Env};

const MIB: u64 = 1 << 20;

#[test]
fn detail_reports_each_pool_against_its_limit() {
    if !require_tools(&["qemu-io"]) {
        return;
    }
    let env = Env::new("mem5", 4, 128 * MIB);
    env.create("5", &[]);
    let d = env.run_all();
    // 1 MiB requests (what a file system or fio sends), then one larger than the NBD buffer
    // pool keeps (it is freed, not kept).
    let mut cmds: Vec<String> = (0..32)
        .map(|i| format!("write -P 0x42 {}M 1M", i))
        .collect();
    cmds.push("write -P 0x43 32M 40M".into());
    cmds.push("read -P 0x42 0 32M".into());
    let uri = env.uri();
    let mut args: Vec<&str> = vec!["-f", "raw", &uri];
    for c in &cmds {
        args.extend(["-c", c.as_str()]);
    }
    let out = sh("qemu-io", &args);
    assert!(!out.contains("verification failed"), "{out}");
    let detail = env.detail();
    let m = &detail["memory"];
    assert!(m.is_object(), "no memory section: {detail:#}");
    for pool in [
        "stripe_cache",
        "buffer_pool",
        "nbd_payload",
        "nbd_buffer_pool",
    ] {
        let limit = m[pool]["limit_bytes"].as_u64().unwrap();
        let held = m[pool]["held_bytes"].as_u64().unwrap();
        assert!(
            limit > 0 && held <= limit,
            "{pool}: {held} of {limit}: {m:#}"
        );
    }
    // Defaults: 64 MiB of stripe data, 64 MiB of NBD payloads in flight, the payload
    // buffers written above came back to their pool.
    assert_eq!(m["stripe_cache"]["limit_bytes"], 64 * MIB);
    assert_eq!(m["nbd_payload"]["limit_bytes"], 64 * MIB);
    let peak = m["nbd_payload_peak_bytes"].as_u64().unwrap();
    assert!(peak > 0 && peak <= 64 * MIB, "{m:#}");
    assert!(
        m["nbd_buffer_pool"]["held_bytes"].as_u64().unwrap() > 0,
        "{m:#}"
    );
    assert!(
        m["nbd_request_threads"].as_u64().unwrap()
            <= m["nbd_request_threads_limit"].as_u64().unwrap(),
        "{m:#}"
    );
    let (rss, peak_rss) = (
        m["rss_bytes"].as_u64().unwrap(),
        m["peak_rss_bytes"].as_u64().unwrap(),
    );
    assert!(rss > 0 && rss <= peak_rss, "{m:#}");
    env.stop(d);
}

/// `run --stripe-cache SIZE` (md's stripe_cache_size) sets the stripe cache's limit, which
/// holds under 1 MiB writes larger than it (each waits for room, none is refused); a size
/// below the floor is refused with a clear error and serves nothing.
#[test]
fn the_stripe_cache_limit_is_set_at_run_and_holds() {
    if !require_tools(&["qemu-io"]) {
        return;
    }
    let env = Env::new("stripecache", 4, 64 * MIB);
    env.create("5", &[]);
    let err = env
        .try_run_with(&["--stripe-cache", "512K"], &env.members)
        .err()
        .expect("a 512K stripe cache is refused");
    assert!(
        err.contains("--stripe-cache") && err.contains("at least 1M"),
        "{err}"
    );
    let d = env.run_with(&["--stripe-cache", "2M"], &env.members);
    let uri = env.uri();
    let out = sh(
        "qemu-io",
        &[
            "-f",
            "raw",
            &uri,
            "-c",
            "aio_write -P 0x5e 0 16M",
            "-c",
            "aio_flush",
            "-c",
            "read -P 0x5e 0 16M",
        ],
    );
    assert!(!out.contains("fail"), "{out}");
    let m = &env.detail()["memory"];
    assert_eq!(m["stripe_cache"]["limit_bytes"], 2 * MIB, "{m:#}");
    assert_eq!(m["buffer_pool"]["limit_bytes"], 2 * MIB, "{m:#}");
    env.stop(d);
}
