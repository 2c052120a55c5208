//! Graceful shutdown: in-flight requests are finished and answered.

mod common;

use std::io::Write;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{MemBackend, RawClient, TestServer};
use nbd::codec;
use nbd::proto::*;

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
