//! Graceful shutdown: in-flight requests are finished and answered.

mod common;

use std::io::Write;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{MemBackend, RawClient, TestServer};
use nbd::codec;
use nbd::proto::*;
use nbd::Limits;

#[test]
fn shutdown_drains_in_flight_requests() {
    let mut m = MemBackend::new(1 << 20);
    m.delay = Duration::from_millis(300);
    let b = Arc::new(m);
    let t = TestServer::one("d", b.clone());
    let mut c = RawClient::connect(&t.sock, "d", false);
    let mut batch = Vec::new();
    for i in 0..4u64 {
        batch.extend_from_slice(&codec::encode_request(&codec::Request {
            flags: 0,
            command: CMD_WRITE,
            handle: i,
            offset: i * 512,
            length: 512,
        }));
        batch.extend_from_slice(&[0xa0 + i as u8; 512]);
    }
    c.s.write_all(&batch).unwrap();
    // Let the server read all four requests, then shut down mid-flight.
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(b.writes.load(Ordering::SeqCst), 0);
    let server = t.server.clone();
    let stopper = std::thread::spawn(move || server.shutdown());
    let mut got: Vec<u64> = (0..4)
        .map(|_| {
            let (e, h) = c.simple_reply();
            assert_eq!(e, 0);
            h
        })
        .collect();
    got.sort();
    assert_eq!(got, vec![0, 1, 2, 3]);
    assert!(c.is_closed(), "connection closed after draining");
    stopper.join().unwrap();
    let start = Instant::now();
    t.stop().unwrap();
    assert!(start.elapsed() < Duration::from_secs(5));
    assert_eq!(b.writes.load(Ordering::SeqCst), 4);
    let s = b.snapshot();
    for i in 0..4usize {
        assert!(s[i * 512..(i + 1) * 512]
            .iter()
            .all(|&x| x == 0xa0 + i as u8));
    }
}

#[test]
fn shutdown_closes_idle_handshakes_and_connections() {
    let b = Arc::new(MemBackend::new(1 << 20));
    let t = TestServer::one("d", b);
    let mut idle_hs = RawClient::greet(&t.sock);
    let mut idle = RawClient::connect(&t.sock, "d", true);
    let start = Instant::now();
    let server = t.server.clone();
    t.stop().unwrap();
    assert!(start.elapsed() < Duration::from_secs(5));
    assert!(idle_hs.is_closed());
    assert!(idle.is_closed());
    assert_eq!(server.active_connections(), 0);
}

/// A write still inside the backend when its connection is gone — the client
/// left and the grace period ran out — must have returned before the server
/// reports that it stopped.
#[test]
fn shutdown_waits_for_backend_calls_of_dropped_connections() {
    let mut m = MemBackend::new(1 << 20);
    m.delay = Duration::from_millis(1500);
    let b = Arc::new(m);
    let limits = Limits {
        shutdown_grace: Duration::from_millis(100),
        ..Limits::default()
    };
    let t = TestServer::start(vec![common::export("d", b.clone())], limits);
    let mut c = RawClient::connect(&t.sock, "d", false);
    c.request(CMD_WRITE, 0, 1, 4096, 512);
    c.s.write_all(&[0x5a; 512]).unwrap();
    // Let the server read the request and enter the (slow) backend write.
    std::thread::sleep(Duration::from_millis(200));
    drop(c);
    assert_eq!(
        b.writes.load(Ordering::SeqCst),
        0,
        "the write is still running"
    );
    let start = Instant::now();
    t.stop().unwrap();
    assert_eq!(
        b.writes.load(Ordering::SeqCst),
        1,
        "shutdown returned after {:?} while a backend write was still running",
        start.elapsed()
    );
    assert!(b.snapshot()[4096..4608].iter().all(|&x| x == 0x5a));
}

/// A backend call that outlasts `shutdown_backend_timeout` is reported, not
/// waited for forever.
#[test]
fn shutdown_reports_backend_calls_that_do_not_return() {
    let mut m = MemBackend::new(1 << 20);
    m.delay = Duration::from_secs(3);
    let b = Arc::new(m);
    let limits = Limits {
        shutdown_grace: Duration::from_millis(50),
        shutdown_backend_timeout: Duration::from_millis(200),
        ..Limits::default()
    };
    let t = TestServer::start(vec![common::export("d", b.clone())], limits);
    let server = t.server.clone();
    let mut c = RawClient::connect(&t.sock, "d", false);
    c.request(CMD_WRITE, 0, 1, 0, 512);
    c.s.write_all(&[1; 512]).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while server.request_threads() == 0 || server.inflight_bytes() == 0 {
        assert!(Instant::now() < deadline, "the write never started");
        std::thread::sleep(Duration::from_millis(10));
    }
    let start = Instant::now();
    let err = t.stop().expect_err("a backend call was still running");
    assert_eq!(err.kind(), std::io::ErrorKind::TimedOut, "{err}");
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "{:?}",
        start.elapsed()
    );
    assert_eq!(server.request_threads(), 1);
    // The thread still ends on its own once the backend returns.
    while server.request_threads() > 0 {
        assert!(Instant::now() < deadline, "the thread never ended");
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(b.writes.load(Ordering::SeqCst), 1);
}
