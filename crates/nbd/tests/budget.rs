//! One payload byte budget for all connections: many connections sending
//! large requests at once never hold more than `Limits::max_inflight_bytes`,
//! and all of them complete (back-pressure, not failure).

mod common;

use std::io::{Read, Write};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use common::{MemBackend, RawClient, TestServer};
use nbd::proto::*;
use nbd::{codec, BlockSizes, Limits};

const MIB: usize = 1 << 20;

/// Server-wide budget in these tests.
const TOTAL: usize = 4 * MIB;

/// A backend slow enough that requests pile up against the budget.
fn slow_backend(size: usize, max_payload: u32) -> Arc<MemBackend> {
    let mut m = MemBackend::new(size);
    m.delay = Duration::from_millis(5);
    m.block_sizes = BlockSizes {
        min: 512,
        preferred: 4096,
        max: max_payload,
    };
    Arc::new(m)
}

/// The byte every write of connection `conn`, request `i` carries.
fn pattern(conn: usize, i: usize) -> u8 {
    (conn * 16 + i + 1) as u8
}

/// Sends `reqs` (header plus payload) from a second thread while reading
/// the simple replies; returns the handles in arrival order and, for each
/// READ, its data (by handle).
fn pipeline(c: &mut RawClient, reqs: Vec<(codec::Request, Vec<u8>)>) -> Vec<(u64, Vec<u8>)> {
    let lens: std::collections::HashMap<u64, (u16, u32)> = reqs
        .iter()
        .map(|(r, _)| (r.handle, (r.command, r.length)))
        .collect();
    let mut w = c.s.try_clone().unwrap();
    let n = reqs.len();
    let sender = std::thread::spawn(move || {
        for (r, payload) in reqs {
            w.write_all(&codec::encode_request(&r)).unwrap();
            w.write_all(&payload).unwrap();
        }
    });
    let got = (0..n)
        .map(|_| {
            let (e, h) = c.simple_reply();
            assert_eq!(e, 0, "request {h} failed");
            let (cmd, len) = lens[&h];
            let mut data = Vec::new();
            if cmd == CMD_READ {
                data = vec![0u8; len as usize];
                c.s.read_exact(&mut data).unwrap();
            }
            (h, data)
        })
        .collect();
    sender.join().unwrap();
    got
}

fn request(command: u16, handle: u64, offset: u64, length: usize) -> codec::Request {
    codec::Request {
        flags: 0,
        command,
        handle,
        offset,
        length: length as u32,
    }
}

#[test]
fn many_connections_share_one_budget() {
    const CONNS: usize = 12;
    const PER_CONN: usize = 4;
    const LEN: usize = MIB;
    let b = slow_backend(CONNS * PER_CONN * LEN, LEN as u32);
    let limits = Limits {
        max_inflight_bytes: TOTAL,
        max_inflight_bytes_per_conn: 2 * MIB,
        ..Limits::default()
    };
    let t = TestServer::start(vec![common::export("d", b.clone())], limits);
    let clients: Vec<_> = (0..CONNS)
        .map(|conn| {
            let sock = t.sock.clone();
            std::thread::spawn(move || {
                let mut c = RawClient::connect(&sock, "d", false);
                c.s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
                let at = |i: usize| ((conn * PER_CONN + i) * LEN) as u64;
                let writes = (0..PER_CONN)
                    .map(|i| {
                        let r = request(CMD_WRITE, i as u64, at(i), LEN);
                        (r, vec![pattern(conn, i); LEN])
                    })
                    .collect();
                assert_eq!(pipeline(&mut c, writes).len(), PER_CONN);
                let reads = (0..PER_CONN)
                    .map(|i| (request(CMD_READ, i as u64, at(i), LEN), Vec::new()))
                    .collect();
                for (h, data) in pipeline(&mut c, reads) {
                    let want = pattern(conn, h as usize);
                    assert!(data.iter().all(|&x| x == want), "conn {conn} read {h}");
                }
            })
        })
        .collect();
    for c in clients {
        c.join().unwrap();
    }
    let peak = t.server.inflight_bytes_peak();
    assert!(peak <= TOTAL, "peak {peak} above the budget {TOTAL}");
    assert!(
        peak >= TOTAL / 2,
        "peak {peak}: the budget was never under pressure, the test shows nothing"
    );
    // A grant is given back just after its reply is written, maybe after the client read it.
    common::wait_until(|| t.server.inflight_bytes() == 0);
    assert_eq!(b.writes.load(Ordering::SeqCst), CONNS * PER_CONN);
}

#[test]
fn request_larger_than_the_whole_budget_runs_alone() {
    const BIG: usize = 3 * MIB;
    let b = slow_backend(16 * MIB, BIG as u32);
    let limits = Limits {
        max_inflight_bytes: MIB,
        ..Limits::default()
    };
    let t = TestServer::start(vec![common::export("d", b.clone())], limits);
    // Small requests on other connections keep the budget busy meanwhile.
    let small: Vec<_> = (0..4)
        .map(|conn| {
            let sock = t.sock.clone();
            std::thread::spawn(move || {
                let mut c = RawClient::connect(&sock, "d", false);
                let reqs = (0..32)
                    .map(|i| {
                        let at = (8 * MIB + (conn * 32 + i) * 4096) as u64;
                        (request(CMD_WRITE, i as u64, at, 4096), vec![7u8; 4096])
                    })
                    .collect();
                pipeline(&mut c, reqs);
            })
        })
        .collect();
    let mut c = RawClient::connect(&t.sock, "d", false);
    let big = vec![(request(CMD_WRITE, 1, 0, BIG), vec![0xbb; BIG])];
    pipeline(&mut c, big);
    let read = vec![(request(CMD_READ, 2, 0, BIG), Vec::new())];
    let got = pipeline(&mut c, read);
    assert!(got[0].1.iter().all(|&x| x == 0xbb));
    for s in small {
        s.join().unwrap();
    }
    assert!(t.server.inflight_bytes_peak() <= MIB);
    // A grant is given back just after its reply is written, maybe after the client read it.
    common::wait_until(|| t.server.inflight_bytes() == 0);
}
