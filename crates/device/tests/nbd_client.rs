//! The NBD member client against a real server (nbdkit): data round trips, and what a
//! reconnect must and must not bring back.
//!
//! nbdkit's `memory` plugin forgets everything when it restarts, like a server that lost its
//! cache: a write the client still holds unflushed must come back by replay; a flushed one is
//! the server's to keep, and the client holds it no more.

use device::{Device, NbdDevice, RemoteOptions};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use testkit::require_tools;

/// An nbdkit on a Unix socket that can be killed and started again with the same arguments.
struct Server {
    sock: PathBuf,
    args: Vec<String>,
    child: Option<Child>,
}

impl Server {
    fn start(dir: &Path, args: &[&str]) -> Server {
        let mut s = Server {
            sock: dir.join("s.sock"),
            args: args.iter().map(|a| a.to_string()).collect(),
            child: None,
        };
        s.restart();
        s
    }

    fn restart(&mut self) {
        assert!(self.child.is_none(), "already running");
        let _ = std::fs::remove_file(&self.sock);
        let child = Command::new("nbdkit")
            .arg("-f")
            .arg("-U")
            .arg(&self.sock)
            .args(&self.args)
            .stdout(Stdio::null())
            .spawn()
            .expect("spawn nbdkit");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::os::unix::net::UnixStream::connect(&self.sock).is_err() {
            let exited = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten());
            assert!(
                exited.is_none(),
                "nbdkit {:?} exited: {exited:?}",
                self.args
            );
            assert!(Instant::now() < deadline, "nbdkit did not listen");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn kill(&mut self) {
        let mut c = self.child.take().expect("running");
        c.kill().unwrap();
        c.wait().unwrap();
    }

    fn uri(&self) -> String {
        format!("nbd+unix:///?socket={}", self.sock.display())
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if self.child.is_some() {
            self.kill();
        }
    }
}

fn opts(timeout_ms: u64, retry_ms: u64) -> RemoteOptions {
    RemoteOptions {
        timeout: Duration::from_millis(timeout_ms),
        retry: Duration::from_millis(retry_ms),
        ..RemoteOptions::default()
    }
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31) ^ seed)
        .collect()
}

#[test]
fn reads_writes_zeroes_and_splits_over_a_real_server() {
    if !require_tools(&["nbdkit"]) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // A server maximum of 64K makes the 1 MiB requests below go out in pieces.
    let srv = Server::start(
        dir.path(),
        &["--filter=blocksize", "memory", "16M", "maxlen=65536"],
    );
    let dev = NbdDevice::open(&srv.uri(), opts(2000, 2000)).unwrap();
    assert_eq!(dev.len_bytes(), 16 << 20);
    assert!(dev.max_connections() > 1, "nbdkit memory offers multi-conn");
    let data = pattern(1 << 20, 7);
    dev.write_at(&data, 512, true).unwrap();
    let mut back = vec![0u8; 1 << 20];
    dev.read_at(&mut back, 512).unwrap();
    assert!(back == data);
    dev.discard_zeroes(4096, 8192).unwrap();
    dev.read_at(&mut back, 512).unwrap();
    assert!(back[3584..3584 + 8192].iter().all(|&b| b == 0));
    assert!(back[..3584] == data[..3584]);
    dev.flush().unwrap();
    // Many threads at once share the pool.
    std::thread::scope(|s| {
        for t in 0..8u8 {
            let dev = &dev;
            s.spawn(move || {
                let d = pattern(65536, t);
                let at = (2 << 20) + u64::from(t) * 65536;
                dev.write_at(&d, at, false).unwrap();
                let mut b = vec![0u8; 65536];
                dev.read_at(&mut b, at).unwrap();
                assert!(b == d, "thread {t}");
            });
        }
    });
}

/// A server without multi-conn, FUA or WRITE_ZEROES: one connection shared by every thread,
/// FUA as a write plus a flush, zeroing by writing zeroes; the data comes out the same.
/// Structured replies: qemu-nbd sends a sparse file's holes as OFFSET_HOLE chunks and its data
/// as OFFSET_DATA chunks; each lands where its offset says, over buffers full of 0xff.
#[test]
fn structured_replies_bring_data_and_holes_into_place() {
    if !require_tools(&["qemu-nbd"]) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("sparse.img");
    let mut want = vec![0u8; 4 << 20];
    want[1 << 20..(1 << 20) + (64 << 10)].copy_from_slice(&pattern(64 << 10, 3));
    want[(3 << 20) + 4096..(3 << 20) + 12288].copy_from_slice(&pattern(8192, 9));
    {
        use std::os::unix::fs::FileExt;
        let f = std::fs::File::create(&file).unwrap();
        f.set_len(want.len() as u64).unwrap();
        f.write_all_at(&want[1 << 20..(1 << 20) + (64 << 10)], 1 << 20)
            .unwrap();
        f.write_all_at(&want[(3 << 20) + 4096..(3 << 20) + 12288], (3 << 20) + 4096)
            .unwrap();
    }
    let sock = dir.path().join("q.sock");
    // Killed however the test ends.
    struct Kill(Child);
    impl Drop for Kill {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let _server = Kill(
        Command::new("qemu-nbd")
            .args(["-t", "-f", "raw", "-k"])
            .arg(&sock)
            .arg(&file)
            .stdout(Stdio::null())
            .spawn()
            .expect("spawn qemu-nbd"),
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::os::unix::net::UnixStream::connect(&sock).is_err() {
        assert!(Instant::now() < deadline, "qemu-nbd did not listen");
        std::thread::sleep(Duration::from_millis(10));
    }
    let uri = format!("nbd+unix:///?socket={}", sock.display());
    let dev = NbdDevice::open(&uri, opts(2000, 2000)).unwrap();
    assert!(
        dev.structured_replies(),
        "qemu-nbd offers structured replies"
    );
    let mut back = vec![0xffu8; want.len()];
    dev.read_at(&mut back, 0).unwrap();
    let wrong = back.iter().zip(&want).position(|(a, b)| a != b);
    assert_eq!(wrong, None, "the whole export read back");
    // A read that starts inside the data and ends inside a hole.
    let at = (1 << 20) + 4096;
    let mut part = vec![0xffu8; 1 << 20];
    dev.read_at(&mut part, at as u64).unwrap();
    assert!(
        part == want[at..at + part.len()],
        "a read across data and a hole"
    );
}

#[test]
fn fallbacks_without_multi_conn_fua_or_write_zeroes() {
    if !require_tools(&["nbdkit"]) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let srv = Server::start(
        dir.path(),
        &[
            "--filter=multi-conn",
            "--filter=nozero",
            "--filter=fua",
            "memory",
            "8M",
            "multi-conn-mode=disable",
            "zeromode=none",
        ],
    );
    let dev = NbdDevice::open(&srv.uri(), opts(2000, 2000)).unwrap();
    assert_eq!(dev.max_connections(), 1);
    std::thread::scope(|s| {
        for t in 0..4u8 {
            let dev = &dev;
            s.spawn(move || {
                let d = pattern(65536, t);
                let at = u64::from(t) << 20;
                dev.write_at(&d, at, true).unwrap();
                dev.discard_zeroes(at + 4096, 8192).unwrap();
                let mut b = vec![0u8; 65536];
                dev.read_at(&mut b, at).unwrap();
                assert!(b[..4096] == d[..4096], "thread {t}");
                assert!(b[4096..12288].iter().all(|&x| x == 0), "thread {t}");
                assert!(b[12288..] == d[12288..], "thread {t}");
            });
        }
    });
    dev.flush().unwrap();
}

/// `nbd://HOST:PORT/EXPORT` over TCP, a named export (nbdkit's `-e`).
#[test]
fn tcp_uri_with_a_named_export() {
    if !require_tools(&["nbdkit"]) {
        return;
    }
    // A port the kernel just handed out and took back: free unless something races for it.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut child = Command::new("nbdkit")
        .args([
            "-f",
            "-i",
            "127.0.0.1",
            "-p",
            &port.to_string(),
            "-e",
            "disk one",
        ])
        .args(["memory", "4M"])
        .stdout(Stdio::null())
        .spawn()
        .expect("spawn nbdkit");
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "nbdkit did not listen on {port}");
        std::thread::sleep(Duration::from_millis(10));
    }
    let uri = format!("nbd://127.0.0.1:{port}/disk%20one");
    let dev = NbdDevice::open(&uri, opts(2000, 2000)).unwrap();
    assert_eq!(dev.len_bytes(), 4 << 20);
    let data = pattern(65536, 9);
    dev.write_at(&data, 4096, false).unwrap();
    let mut back = vec![0u8; 65536];
    dev.read_at(&mut back, 4096).unwrap();
    assert!(back == data);
    drop(dev);
    child.kill().unwrap();
    child.wait().unwrap();
}

/// Canary: with the replay in `recover` removed, the read after the restart returns zeroes.
#[test]
fn unflushed_writes_are_resent_after_the_server_restarts() {
    if !require_tools(&["nbdkit"]) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mut srv = Server::start(dir.path(), &["memory", "8M"]);
    let dev = NbdDevice::open(&srv.uri(), opts(2000, 10_000)).unwrap();
    let flushed = pattern(4096, 1);
    let unflushed = pattern(8192, 2);
    dev.write_at(&flushed, 0, false).unwrap();
    dev.flush().unwrap();
    dev.write_at(&unflushed, 1 << 20, false).unwrap();
    srv.kill();
    srv.restart();
    let mut back = vec![0u8; 8192];
    dev.read_at(&mut back, 1 << 20).unwrap();
    assert!(
        back == unflushed,
        "an unflushed write was lost on reconnect"
    );
    // The flushed write was the server's to keep: the client no longer held it.
    let mut first = vec![0u8; 4096];
    dev.read_at(&mut first, 0).unwrap();
    assert!(
        first.iter().all(|&b| b == 0),
        "a flushed write was replayed"
    );
}

#[test]
fn a_server_gone_past_the_retry_window_fails_requests_for_good() {
    if !require_tools(&["nbdkit"]) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mut srv = Server::start(dir.path(), &["memory", "8M"]);
    let dev = NbdDevice::open(&srv.uri(), opts(500, 1000)).unwrap();
    srv.kill();
    let t = Instant::now();
    let err = dev.write_at(&[1u8; 512], 0, false).unwrap_err();
    let waited = t.elapsed();
    assert!(
        waited >= Duration::from_millis(900),
        "gave up after {waited:?}"
    );
    assert!(waited < Duration::from_secs(5), "retried for {waited:?}");
    assert!(err.to_string().contains("retries"), "{err}");
    // Failed for good, as a dead disk: even a server back now does not revive this device.
    srv.restart();
    let t = Instant::now();
    assert!(dev.read_at(&mut [0u8; 512], 0).is_err());
    assert!(t.elapsed() < Duration::from_millis(100));
}

/// A server that stalls (no progress for longer than the timeout) is the same as a gone one;
/// canary: without socket timeouts the read waits the full 5 s delay and succeeds.
#[test]
fn a_stalled_request_times_out_and_fails_past_the_window() {
    if !require_tools(&["nbdkit"]) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let srv = Server::start(
        dir.path(),
        &["--filter=delay", "memory", "8M", "delay-read=5"],
    );
    let dev = NbdDevice::open(&srv.uri(), opts(300, 1000)).unwrap();
    let t = Instant::now();
    assert!(dev.read_at(&mut [0u8; 512], 0).is_err());
    let waited = t.elapsed();
    assert!(waited < Duration::from_secs(3), "waited {waited:?}");
}

/// A request the server never answers while it keeps answering others on the same connection
/// (nbdkit's eval plugin, parallel: a read of 64 KiB at 64 KiB sleeps, every other read answers
/// at once) times out as a silent server does: the connection is dropped, the request retried,
/// and past the window it fails. Canary: with the timeout counted from the last byte received
/// (as before), the other reader's replies kept the connection "alive": the stuck read waited
/// until that reader gave up (11.7 s).
#[test]
fn a_request_never_answered_among_answered_ones_times_out() {
    if !require_tools(&["nbdkit"]) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let srv = Server::start(
        dir.path(),
        &[
            "eval",
            "thread_model=echo parallel",
            "get_size=echo 1M",
            "pread=if [ $4 -eq 65536 ]; then sleep 30; fi; head -c $3 /dev/zero",
            // A member must be writable; what is written does not matter here.
            "pwrite=cat >/dev/null",
        ],
    );
    let dev = NbdDevice::open(&srv.uri(), opts(400, 1200)).unwrap();
    let stuck_done = std::sync::atomic::AtomicBool::new(false);
    let t = Instant::now();
    let (stuck, answered) = std::thread::scope(|s| {
        let busy = s.spawn(|| {
            let mut answered = 0u32;
            while !stuck_done.load(std::sync::atomic::Ordering::SeqCst)
                && t.elapsed() < Duration::from_secs(10)
            {
                if dev.read_at(&mut [0u8; 4096], 0).is_ok() {
                    answered += 1;
                }
            }
            answered
        });
        std::thread::sleep(Duration::from_millis(50));
        let stuck = dev.read_at(&mut vec![0u8; 65536], 65536);
        stuck_done.store(true, std::sync::atomic::Ordering::SeqCst);
        (stuck, busy.join().unwrap())
    });
    let waited = t.elapsed();
    assert!(stuck.is_err(), "the unanswered read succeeded");
    assert!(waited < Duration::from_secs(5), "waited {waited:?}");
    assert!(
        answered > 10,
        "the other reads were answered meanwhile: {answered}"
    );
}

/// Many requests of many threads at once on one connection (no multi-conn): nbdkit's delay
/// filter holds each 300 ms, so 16 reads one after the other would take 4.8 s.
/// Canary: with one request in flight per connection (a lock held in `Pipeline::requests` from
/// the send to the reply, as the client before pipelining did) this took 4.8 s and failed.
#[test]
fn one_connection_carries_many_requests_at_once() {
    if !require_tools(&["nbdkit"]) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let srv = Server::start(
        dir.path(),
        &[
            "--filter=multi-conn",
            "--filter=delay",
            "memory",
            "8M",
            "multi-conn-mode=disable",
            "delay-read=300ms",
        ],
    );
    let dev = NbdDevice::open(&srv.uri(), opts(3000, 3000)).unwrap();
    assert_eq!(dev.max_connections(), 1);
    let t = Instant::now();
    std::thread::scope(|s| {
        for i in 0..16u64 {
            let dev = &dev;
            s.spawn(move || dev.read_at(&mut [0u8; 4096], i << 16).unwrap());
        }
    });
    let took = t.elapsed();
    assert_eq!(dev.open_connections(), 1);
    assert!(
        took < Duration::from_millis(2000),
        "16 delayed reads took {took:?}"
    );
}

/// With multi-conn offered, a busy member opens more connections, up to the configured count.
#[test]
fn multi_conn_spreads_a_busy_member_over_connections() {
    if !require_tools(&["nbdkit"]) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let srv = Server::start(
        dir.path(),
        &["--filter=delay", "memory", "8M", "delay-read=200ms"],
    );
    let dev = NbdDevice::open(
        &srv.uri(),
        RemoteOptions {
            connections: 3,
            ..opts(3000, 3000)
        },
    )
    .unwrap();
    std::thread::scope(|s| {
        for i in 0..24u64 {
            let dev = &dev;
            s.spawn(move || dev.read_at(&mut [0u8; 4096], i << 16).unwrap());
        }
    });
    assert_eq!(dev.open_connections(), 3);
}

/// A server killed with many writes and reads in flight on one connection, and restarted empty
/// (nbdkit's memory plugin): every write in flight is unknown, so it must be sent again, and
/// the acknowledged but unflushed ones re-sent before anything else; reads in flight are
/// retried after that and see them. Canary: with a dying connection's waiting requests
/// completed as done instead of failed (`Shared::die` setting `Ok`), the writes in flight were
/// lost (zeroes read back).
#[test]
fn a_drop_with_many_requests_in_flight_resends_every_unknown_write() {
    if !require_tools(&["nbdkit"]) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mut srv = Server::start(
        dir.path(),
        &[
            "--filter=multi-conn",
            "--filter=delay",
            "memory",
            "16M",
            "multi-conn-mode=disable",
            "delay-write=400ms",
            "delay-read=400ms",
        ],
    );
    let dev = NbdDevice::open(&srv.uri(), opts(5000, 15_000)).unwrap();
    // Acknowledged, never flushed.
    std::thread::scope(|s| {
        for i in 0..8u64 {
            let dev = &dev;
            s.spawn(move || {
                dev.write_at(&pattern(8192, i as u8), i << 16, false)
                    .unwrap()
            });
        }
    });
    let started = Instant::now();
    std::thread::scope(|s| {
        for i in 0..16u64 {
            let dev = &dev;
            s.spawn(move || {
                let at = (8 << 20) + (i << 16);
                dev.write_at(&pattern(8192, 100 + i as u8), at, false)
                    .unwrap();
            });
        }
        for i in 0..8u64 {
            let dev = &dev;
            s.spawn(move || {
                let mut back = vec![0u8; 8192];
                dev.read_at(&mut back, i << 16).unwrap();
                assert!(
                    back == pattern(8192, i as u8),
                    "read {i} in flight at the drop"
                );
            });
        }
        std::thread::sleep(Duration::from_millis(150));
        srv.kill();
        srv.restart();
    });
    assert!(
        started.elapsed() > Duration::from_millis(500),
        "the requests were not in flight at the drop"
    );
    assert_eq!(dev.open_connections(), 1);
    std::thread::scope(|s| {
        for i in 0..16u64 {
            let dev = &dev;
            s.spawn(move || {
                let mut back = vec![0u8; 8192];
                dev.read_at(&mut back, (8 << 20) + (i << 16)).unwrap();
                let lost = back != pattern(8192, 100 + i as u8);
                assert!(!lost, "write {i} in flight at the drop lost");
            });
        }
        for i in 0..8u64 {
            let dev = &dev;
            s.spawn(move || {
                let mut back = vec![0u8; 8192];
                dev.read_at(&mut back, i << 16).unwrap();
                assert!(
                    back == pattern(8192, i as u8),
                    "acknowledged write {i} lost"
                );
            });
        }
    });
}

/// A CA, a server certificate for `localhost` and 127.0.0.1, and a client certificate, in
/// nbdkit's and libnbd's file names. A second, unrelated CA in `DIR/other`.
fn make_certs(dir: &Path) {
    let openssl = |args: &[&str]| {
        let out = Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .output()
            .expect("run openssl");
        assert!(
            out.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    std::fs::create_dir(dir.join("other")).unwrap();
    for ca in ["", "other/"] {
        openssl(&[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "2",
            "-subj",
            "/CN=test CA",
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
            "-keyout",
            &format!("{ca}ca-key.pem"),
            "-out",
            &format!("{ca}ca-cert.pem"),
        ]);
    }
    std::fs::write(
        dir.join("server.ext"),
        "subjectAltName=DNS:localhost,IP:127.0.0.1\n",
    )
    .unwrap();
    std::fs::write(dir.join("client.ext"), "extendedKeyUsage=clientAuth\n").unwrap();
    for (who, cn) in [("server", "localhost"), ("client", "ironraid")] {
        openssl(&[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-subj",
            &format!("/CN={cn}"),
            "-keyout",
            &format!("{who}-key.pem"),
            "-out",
            &format!("{who}.csr"),
        ]);
        openssl(&[
            "x509",
            "-req",
            "-in",
            &format!("{who}.csr"),
            "-CA",
            "ca-cert.pem",
            "-CAkey",
            "ca-key.pem",
            "-CAcreateserial",
            "-days",
            "2",
            "-extfile",
            &format!("{who}.ext"),
            "-out",
            &format!("{who}-cert.pem"),
        ]);
    }
}

/// `nbds+unix://` and `nbds://` against `nbdkit --tls=require`, with client certificates
/// required (`--tls-verify-peer`): data round trips over a pipelined TLS connection, and a
/// TLS reconnect replays what the restarted server lost. Canary: without the client
/// certificate (client-cert.pem removed from DIR) the handshake fails.
#[test]
fn tls_members_with_client_certificates_round_trip_and_reconnect() {
    if !require_tools(&["nbdkit", "openssl"]) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    make_certs(dir.path());
    let certs = dir.path().display().to_string();
    let tls_args = [
        "--tls=require",
        &format!("--tls-certificates={certs}"),
        "--tls-verify-peer",
    ];
    let mut args: Vec<&str> = tls_args.to_vec();
    args.extend(["memory", "8M"]);
    let mut srv = Server::start(dir.path(), &args);
    let uri = format!(
        "nbds+unix:///?socket={}&tls-certificates={certs}",
        srv.sock.display()
    );
    let dev = NbdDevice::open(&uri, opts(3000, 10_000)).unwrap();
    std::thread::scope(|s| {
        for t in 0..8u8 {
            let dev = &dev;
            s.spawn(move || {
                let d = pattern(300_032 + 4096 * t as usize, t);
                let at = u64::from(t) << 20;
                dev.write_at(&d, at, false).unwrap();
                let mut b = vec![0u8; d.len()];
                dev.read_at(&mut b, at).unwrap();
                assert!(b == d, "thread {t}");
            });
        }
    });
    srv.kill();
    srv.restart();
    let mut b = vec![0u8; 300_032];
    dev.read_at(&mut b, 0).unwrap();
    assert!(
        b == pattern(300_032, 0),
        "unflushed write lost over a TLS reconnect"
    );

    // The same over TCP, the server's certificate checked against 127.0.0.1.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut child = Command::new("nbdkit")
        .args(["-f", "-i", "127.0.0.1", "-p", &port.to_string()])
        .args(tls_args)
        .args(["memory", "4M"])
        .stdout(Stdio::null())
        .spawn()
        .expect("spawn nbdkit");
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "nbdkit did not listen on {port}");
        std::thread::sleep(Duration::from_millis(10));
    }
    let tcp = NbdDevice::open(
        &format!("nbds://127.0.0.1:{port}/?tls-certificates={certs}"),
        opts(3000, 3000),
    );
    child.kill().unwrap();
    child.wait().unwrap();
    let tcp = tcp.unwrap();
    assert_eq!(tcp.len_bytes(), 4 << 20);
}

/// What must fail, and say why: a server that does not do TLS when asked (never a plaintext
/// fallback), a certificate from another CA, a plain client at a TLS-only server.
/// Canary: `wire::open` going on in plaintext when STARTTLS is refused opened the first.
#[test]
fn tls_refusals_are_errors_never_plaintext() {
    if !require_tools(&["nbdkit", "openssl"]) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    make_certs(dir.path());
    let certs = dir.path().display().to_string();
    let sub = |name: &str| {
        let d = dir.path().join(name);
        std::fs::create_dir(&d).unwrap();
        d
    };
    let plain = Server::start(&sub("plain"), &["--tls=off", "memory", "1M"]);
    let uri = format!(
        "nbds+unix:///?socket={}&tls-certificates={certs}",
        plain.sock.display()
    );
    let err = NbdDevice::open(&uri, opts(2000, 2000))
        .err()
        .expect("opened without TLS");
    assert!(err.to_string().contains("refused TLS"), "{err}");

    let tls = Server::start(
        &sub("tls"),
        &[
            "--tls=require",
            &format!("--tls-certificates={certs}"),
            "memory",
            "1M",
        ],
    );
    let other = dir.path().join("other").display().to_string();
    let uri = format!(
        "nbds+unix:///?socket={}&tls-certificates={other}",
        tls.sock.display()
    );
    let err = NbdDevice::open(&uri, opts(2000, 2000))
        .err()
        .expect("trusted another CA");
    assert!(err.to_string().contains("TLS handshake"), "{err}");
    let err = NbdDevice::open(&tls.uri(), opts(2000, 2000))
        .err()
        .expect("plain at TLS-only");
    assert!(err.to_string().contains("requires TLS"), "{err}");
    // The right CA given as the option rather than in the URI.
    let uri = format!("nbds+unix:///?socket={}", tls.sock.display());
    let with_ca = RemoteOptions {
        tls_ca: Some(dir.path().join("ca-cert.pem")),
        ..opts(2000, 2000)
    };
    NbdDevice::open(&uri, with_ca).unwrap();
}
