//! NBD conventions of `ironraid run` (issue 26 item 8): `--nbd` URIs and extra endpoints
//! beside the default socket, `--export-name`, socket mode, the URIs printed at start,
//! 64 MiB requests (EOVERFLOW beyond, the connection kept), and idle connections that cannot
//! lock real clients out.

mod common;

use common::*;
use nbd::codec::{self, Request};
use nbd::proto::*;
use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::path::Path;
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

/// A raw NBD client (the reference clients split requests at the advertised maximum, so
/// they cannot send an oversized one).
struct Raw(UnixStream);

impl Raw {
    fn connect(sock: &Path) -> Raw {
        let mut s = UnixStream::connect(sock).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        let mut greeting = [0u8; 18];
        s.read_exact(&mut greeting).unwrap();
        s.write_all(&(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES).to_be_bytes())
            .unwrap();
        let go = codec::encode_info_request("", &[]);
        s.write_all(&codec::encode_option(OPT_GO, &go)).unwrap();
        loop {
            let mut h = [0u8; 20];
            s.read_exact(&mut h).unwrap();
            let h = codec::parse_option_reply_header(&h).unwrap();
            let mut data = vec![0u8; h.length as usize];
            s.read_exact(&mut data).unwrap();
            if h.reply_type == REP_ACK {
                return Raw(s);
            }
            assert_eq!(h.reply_type, REP_INFO);
        }
    }

    /// Sends one request (with `payload` for a write); the reply's error and its data.
    fn request(&mut self, command: u16, offset: u64, len: usize, payload: &[u8]) -> (u32, Vec<u8>) {
        let r = Request {
            flags: 0,
            command,
            handle: 7,
            offset,
            length: u32::try_from(len).unwrap(),
        };
        self.0.write_all(&codec::encode_request(&r)).unwrap();
        self.0.write_all(payload).unwrap();
        let mut h = [0u8; 16];
        self.0.read_exact(&mut h).unwrap();
        let rep = codec::parse_simple_reply(&h).unwrap();
        assert_eq!(rep.handle, 7);
        let mut data = Vec::new();
        if command == CMD_READ && rep.error == 0 {
            data = vec![0u8; len];
            self.0.read_exact(&mut data).unwrap();
        }
        (rep.error, data)
    }
}

#[test]
fn requests_of_64_mib_are_served_and_larger_ones_get_eoverflow() {
    let env = Env::new("big", 2, 96 << 20);
    env.create("0", &[]);
    let d = env.run_all();
    let mut c = Raw::connect(&env.socket());
    let data: Vec<u8> = (0..64 * MIB).map(|i| (i / 4096) as u8).collect();
    assert_eq!(c.request(CMD_WRITE, 0, 64 * MIB, &data).0, 0);
    let (err, back) = c.request(CMD_READ, 0, 64 * MIB, &[]);
    assert_eq!(err, 0);
    assert!(back == data, "64 MiB read back differs");
    let over = 64 * MIB + 4096;
    assert_eq!(c.request(CMD_READ, 0, over, &[]).0, EOVERFLOW);
    assert_eq!(
        c.request(CMD_WRITE, 0, over, &vec![0xee; over]).0,
        EOVERFLOW
    );
    // The same connection goes on, and the refused write wrote nothing.
    let (err, back) = c.request(CMD_READ, 0, 8192, &[]);
    assert_eq!(err, 0);
    assert!(back == data[..8192]);
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
