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
