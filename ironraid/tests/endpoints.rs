//! NBD conventions of `ironraid run` (issue 26 item 8): `--nbd` URIs and extra endpoints
//! beside the default socket, `--export-name`, socket mode, the URIs printed at start,
//! 64 MiB requests (EOVERFLOW beyond, the connection kept), and idle connections that cannot
//! lock real clients out.

mod common;

use common::raw_client::Client;
use common::*;
use nbd::proto::EOVERFLOW;
use std::os::unix::fs::PermissionsExt;
use std::time::{Duration, Instant};

const MIB: usize = 1 << 20;

/// A TCP port nobody listens on now.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn nbdinfo_size(uri: &str) -> u64 {
    sh("nbdinfo", &["--size", uri]).trim().parse().unwrap()
}

#[test]
fn uris_extra_endpoints_export_name_and_socket_mode() {
    if !require_tools(&["nbdinfo"]) {
        return;
    }
    let env = Env::new("ep", 3, 32 << 20);
    env.create("5", &[]);
    let port = free_port();
    let extra = env.dir.path().join("extra.sock");
    let tcp = format!("nbd://127.0.0.1:{port}");
    let unix = format!("nbd+unix:///disk0?socket={}", extra.display());
    let (d, printed) = env.run_printing(
        &[
            "--nbd",
            &tcp,
            "--nbd",
            &unix,
            "--export-name",
            "disk0",
            "--socket-mode",
            "0660",
        ],
        3,
    );
    let default = env.socket();
    let want = [
        format!("nbd+unix:///disk0?socket={}", default.display()),
        format!("nbd://127.0.0.1:{port}/disk0"),
        unix.clone(),
    ];
    for w in &want {
        assert!(
            printed.contains(w),
            "{w} not among the printed URIs {printed:?}"
        );
    }
    let size = env.detail()["size_bytes"].as_u64().unwrap();
    for uri in &want {
        assert_eq!(nbdinfo_size(uri), size, "{uri}");
    }
    // The default export ("") reaches it too; the array's own name is not an export now.
    assert_eq!(nbdinfo_size(&format!("nbd://127.0.0.1:{port}")), size);
    let wrong = std::process::Command::new("nbdinfo")
        .args(["--size", &format!("nbd://127.0.0.1:{port}/ep")])
        .output()
        .unwrap();
    assert!(!wrong.status.success());
    for s in [&default, &extra] {
        let mode = std::fs::metadata(s).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o660, "{}", s.display());
    }
    env.stop(d);
}

#[test]
fn requests_of_64_mib_are_served_and_larger_ones_get_eoverflow() {
    let env = Env::new("big", 2, 96 << 20);
    env.create("0", &[]);
    let d = env.run_all();
    // A raw client: the reference clients split requests at the advertised maximum, so they
    // cannot send an oversized one.
    let mut c = Client::connect(&env.socket(), &env.name);
    let data: Vec<u8> = (0..64 * MIB).map(|i| (i / 4096) as u8).collect();
    c.write_all(&[(0, data.clone())]);
    assert!(c.read(0, 64 * MIB) == data, "64 MiB read back differs");
    let over = 64 * MIB + 4096;
    assert_eq!(c.try_read(0, over), Err(EOVERFLOW));
    assert_eq!(c.write_all_answers(&[(0, vec![0xee; over])]), [EOVERFLOW]);
    // The same connection goes on, and the refused write wrote nothing.
    assert!(c.read(0, 8192) == data[..8192]);
    drop(c);
    env.stop(d);
}

#[test]
fn idle_tcp_connections_cannot_lock_out_a_real_client() {
    if !require_tools(&["nbdinfo"]) {
        return;
    }
    let env = Env::new("flood", 2, 16 << 20);
    env.create("1", &[]);
    let port = free_port();
    let (d, _) = env.run_printing(&["--nbd", &format!("tcp:127.0.0.1:{port}")], 0);
    // More than the server's connection limit (128), none sending a byte.
    let idle: Vec<std::net::TcpStream> = (0..200)
        .map(|_| std::net::TcpStream::connect(("127.0.0.1", port)).unwrap())
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    let start = Instant::now();
    let size = nbdinfo_size(&format!("nbd://127.0.0.1:{port}/flood"));
    let took = start.elapsed();
    assert_eq!(size, env.detail()["size_bytes"].as_u64().unwrap());
    assert!(took < Duration::from_secs(2), "nbdinfo took {took:?}");
    drop(idle);
    env.stop(d);
}
