//! Hand-crafted (often malformed) protocol traffic over a raw Unix socket.

mod common;

use std::io::{Read, Write};
use std::net::Shutdown;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{wait_until, MemBackend, RawClient, TestServer};
use nbd::codec;
use nbd::proto::*;
use nbd::Limits;

const MIB: usize = 1 << 20;

fn server() -> (Arc<MemBackend>, TestServer) {
    let b = Arc::new(MemBackend::new(MIB));
    let t = TestServer::one("d", b.clone());
    (b, t)
}

/// A READ through `c` works (simple replies).
fn read_ok(c: &mut RawClient, handle: u64) {
    c.request(CMD_READ, 0, handle, 0, 512);
    assert_eq!(c.simple_reply(), (0, handle));
    let mut d = vec![0u8; 512];
    c.s.read_exact(&mut d).unwrap();
}

#[test]
fn bad_request_magic_closes_only_that_connection() {
    let (_b, t) = server();
    let mut other = RawClient::connect(&t.sock, "d", false);
    let mut c = RawClient::connect(&t.sock, "d", false);
    let mut bad = codec::encode_request(&codec::Request {
        flags: 0,
        command: CMD_READ,
        handle: 1,
        offset: 0,
        length: 512,
    });
    bad[0] = 0xff;
    c.s.write_all(&bad).unwrap();
    assert!(c.is_closed());
    read_ok(&mut other, 2);
    let mut fresh = RawClient::connect(&t.sock, "d", true);
    fresh.request(CMD_FLUSH, 0, 3, 0, 0);
    assert_eq!(fresh.simple_reply(), (0, 3));
}

#[test]
fn unknown_command_and_bad_flags_get_einval() {
    let (b, t) = server();
    let mut c = RawClient::connect(&t.sock, "d", false);
    c.request(42, 0, 1, 0, 0);
    assert_eq!(c.simple_reply(), (EINVAL, 1));
    // WRITE with DF (only valid on READ): EINVAL, payload consumed.
    c.request(CMD_WRITE, CMD_FLAG_DF, 2, 0, 512);
    c.s.write_all(&[0xee; 512]).unwrap();
    assert_eq!(c.simple_reply(), (EINVAL, 2));
    // DF without structured replies is not allowed on READ either.
    c.request(CMD_READ, CMD_FLAG_DF, 3, 0, 512);
    assert_eq!(c.simple_reply(), (EINVAL, 3));
    // Undefined flag bit.
    c.request(CMD_FLUSH, 1 << 9, 4, 0, 0);
    assert_eq!(c.simple_reply(), (EINVAL, 4));
    // BLOCK_STATUS without a negotiated context.
    c.request(CMD_BLOCK_STATUS, 0, 5, 0, 512);
    assert_eq!(c.simple_reply(), (EINVAL, 5));
    read_ok(&mut c, 6);
    assert_eq!(b.writes.load(Ordering::SeqCst), 0);
    assert!(b.snapshot().iter().all(|&x| x == 0));
}

#[test]
fn out_of_range_requests() {
    let (b, t) = server();
    let mut c = RawClient::connect(&t.sock, "d", false);
    c.request(CMD_READ, 0, 1, MIB as u64 - 512, 1024);
    assert_eq!(c.simple_reply(), (EINVAL, 1));
    c.request(CMD_READ, 0, 2, u64::MAX - 100, 512);
    assert_eq!(c.simple_reply(), (EINVAL, 2));
    c.request(CMD_WRITE, 0, 3, MIB as u64, 512);
    c.s.write_all(&[1; 512]).unwrap();
    assert_eq!(c.simple_reply(), (ENOSPC, 3));
    c.request(CMD_WRITE_ZEROES, 0, 4, MIB as u64 - 512, 1024);
    assert_eq!(c.simple_reply(), (ENOSPC, 4));
    c.request(CMD_TRIM, 0, 5, MIB as u64, 512);
    assert_eq!(c.simple_reply(), (EINVAL, 5));
    // Misaligned (the client asked for block sizes: min 512).
    c.request(CMD_READ, 0, 6, 1, 512);
    assert_eq!(c.simple_reply(), (EINVAL, 6));
    // Length above the advertised maximum (1 MiB) on a READ: EOVERFLOW, as the spec asks.
    c.request(CMD_READ, 0, 7, 0, 2 * MIB as u32);
    assert_eq!(c.simple_reply(), (EOVERFLOW, 7));
    // Zero-length READ is a successful no-op.
    c.request(CMD_READ, 0, 8, 0, 0);
    assert_eq!(c.simple_reply(), (0, 8));
    read_ok(&mut c, 9);
    assert_eq!(b.writes.load(Ordering::SeqCst), 0);
}

#[test]
fn write_longer_than_max_gets_eoverflow_and_keeps_the_connection() {
    let (b, t) = server();
    let mut c = RawClient::connect(&t.sock, "d", false);
    c.request(CMD_WRITE, 0, 1, 0, 2 * MIB as u32);
    c.s.write_all(&vec![7; 2 * MIB]).unwrap();
    assert_eq!(c.simple_reply(), (EOVERFLOW, 1));
    assert_eq!(b.writes.load(Ordering::SeqCst), 0);
    // The payload was read past: the next request on the same connection is served.
    read_ok(&mut c, 2);
}

/// The backend hears of a WRITE before its payload (`write_coming`) and gets the hint back with
/// the payload; a hint whose payload never comes, or whose request is refused, is dropped.
#[test]
fn write_hints_come_back_with_their_payload_or_are_dropped() {
    let (b, t) = server();
    let mut c = RawClient::connect(&t.sock, "d", false);
    c.request(CMD_WRITE, 0, 1, 0, 512);
    c.s.write_all(&[0x11; 512]).unwrap();
    assert_eq!(c.simple_reply(), (0, 1));
    // Refused after its payload was read (DF is for READ only).
    c.request(CMD_WRITE, CMD_FLAG_DF, 2, 0, 512);
    c.s.write_all(&[0x22; 512]).unwrap();
    assert_eq!(c.simple_reply(), (EINVAL, 2));
    // Cut short.
    c.request(CMD_WRITE, 0, 3, 4096, 4096);
    c.s.write_all(&[0x33; 1000]).unwrap();
    c.s.shutdown(Shutdown::Write).unwrap();
    assert!(c.is_closed());
    wait_until(|| t.server.active_connections() == 0);
    assert_eq!(b.hints_given.load(Ordering::SeqCst), 3);
    assert_eq!(b.hints_used.load(Ordering::SeqCst), 1);
    assert_eq!(
        b.hints_live.load(Ordering::SeqCst),
        0,
        "a hint outlived its request"
    );
    assert!(b.snapshot()[..512].iter().all(|&x| x == 0x11));
}

/// A WRITE too large to run inline is handed to the backend only after the WRITE right
/// behind it, whose header has arrived, was announced (`write_coming`): a stripe cache deciding
/// whether a stream fills its row must count that one as coming. Without the announcement
/// ahead, the next reader (another thread) announces it while the first WRITE already runs.
#[test]
fn the_write_behind_a_large_write_is_announced_before_the_large_one_runs() {
    let b = Arc::new(MemBackend {
        gathers: true,
        hint_delay: Duration::from_millis(200),
        ..MemBackend::new(MIB)
    });
    let t = TestServer::one("d", b.clone());
    let mut c = RawClient::connect(&t.sock, "d", false);
    // Header, payload (above the 128 KiB run inline, below the socket's buffer) and the next
    // header go out at once; the first hint's delay lets all of it arrive before the payload
    // is read.
    let len = 192 * 1024;
    let first = codec::Request {
        flags: 0,
        command: CMD_WRITE,
        handle: 1,
        offset: 0,
        length: len,
    };
    let second = codec::Request {
        handle: 2,
        offset: u64::from(len),
        ..first
    };
    let mut burst = codec::encode_request(&first).to_vec();
    burst.extend(vec![0x11; len as usize]);
    burst.extend(codec::encode_request(&second));
    c.s.write_all(&burst).unwrap();
    c.s.write_all(&vec![0x22; len as usize]).unwrap();
    let mut replies = [c.simple_reply(), c.simple_reply()];
    replies.sort_by_key(|r| r.1);
    assert_eq!(replies, [(0, 1), (0, 2)]);
    let seen = b.hints_at_write.lock().unwrap().clone();
    assert_eq!(
        seen.first(),
        Some(&2),
        "the first WRITE ran before the second was announced (hints given at each write: {seen:?})"
    );
    assert_eq!(b.hints_used.load(Ordering::SeqCst), 2);
    let data = b.snapshot();
    assert!(data[..len as usize].iter().all(|&x| x == 0x11));
    assert!(data[len as usize..2 * len as usize]
        .iter()
        .all(|&x| x == 0x22));
}

#[test]
fn write_payload_cut_short_writes_nothing() {
    let (b, t) = server();
    let mut c = RawClient::connect(&t.sock, "d", false);
    c.request(CMD_WRITE, 0, 1, 4096, 4096);
    c.s.write_all(&[0x55; 1000]).unwrap();
    c.s.shutdown(Shutdown::Write).unwrap();
    assert!(c.is_closed());
    wait_until(|| t.server.active_connections() == 0);
    assert_eq!(b.writes.load(Ordering::SeqCst), 0);
    assert!(b.snapshot().iter().all(|&x| x == 0));
    // A complete write on another connection does land.
    let mut c = RawClient::connect(&t.sock, "d", false);
    c.request(CMD_WRITE, CMD_FLAG_FUA, 2, 4096, 512);
    c.s.write_all(&[0x55; 512]).unwrap();
    assert_eq!(c.simple_reply(), (0, 2));
    assert!(b.snapshot()[4096..4608].iter().all(|&x| x == 0x55));
}

#[test]
fn read_only_export_rejects_writes_with_eperm() {
    let mut m = MemBackend::new(MIB);
    m.read_only = true;
    let b = Arc::new(m);
    let t = TestServer::one("ro", b.clone());
    let mut c = RawClient::connect(&t.sock, "ro", false);
    assert_ne!(c.flags & FLAG_READ_ONLY, 0);
    c.request(CMD_WRITE, 0, 1, 0, 512);
    c.s.write_all(&[1; 512]).unwrap();
    assert_eq!(c.simple_reply(), (EPERM, 1));
    c.request(CMD_TRIM, 0, 2, 0, 512);
    assert_eq!(c.simple_reply(), (EPERM, 2));
    c.request(CMD_WRITE_ZEROES, 0, 3, 0, 512);
    assert_eq!(c.simple_reply(), (EPERM, 3));
    read_ok(&mut c, 4);
    assert_eq!(b.writes.load(Ordering::SeqCst), 0);
}

#[test]
fn handshake_options_unknown_invalid_too_big() {
    let (_b, t) = server();
    let mut c = RawClient::greet(&t.sock);
    c.send_option(99, b"whatever");
    assert_eq!(c.option_reply().0, REP_ERR_UNSUP);
    c.send_option(OPT_STARTTLS, &[]);
    assert_eq!(c.option_reply().0, REP_ERR_UNSUP);
    c.send_option(OPT_LIST, &[1, 2, 3]);
    assert_eq!(c.option_reply().0, REP_ERR_INVALID);
    c.send_option(OPT_GO, &[0, 0, 0, 9, b'x']);
    assert_eq!(c.option_reply().0, REP_ERR_INVALID);
    c.send_option(OPT_INFO, &codec::encode_info_request("nope", &[]));
    assert_eq!(c.option_reply().0, REP_ERR_UNKNOWN);
    // Meta contexts need structured replies first.
    c.send_option(
        OPT_SET_META_CONTEXT,
        &codec::encode_meta_request("d", &[META_BASE_ALLOCATION]),
    );
    assert_eq!(c.option_reply().0, REP_ERR_INVALID);
    c.send_option(7777, &vec![0u8; 8000]);
    assert_eq!(c.option_reply().0, REP_ERR_TOO_BIG);
    c.send_option(OPT_LIST, &[]);
    let (ty, data) = c.option_reply();
    assert_eq!(ty, REP_SERVER);
    assert_eq!(&data[..5], &[0, 0, 0, 1, b'd']);
    assert_eq!(c.option_reply().0, REP_ACK);
    // Haggling continues: GO works.
    c.send_option(
        OPT_GO,
        &codec::encode_info_request("d", &[INFO_NAME, INFO_DESCRIPTION]),
    );
    let mut seen = Vec::new();
    loop {
        let (ty, data) = c.option_reply();
        if ty == REP_ACK {
            break;
        }
        assert_eq!(ty, REP_INFO);
        seen.push(u16::from_be_bytes([data[0], data[1]]));
    }
    seen.sort();
    assert_eq!(
        seen,
        vec![INFO_EXPORT, INFO_NAME, INFO_DESCRIPTION, INFO_BLOCK_SIZE]
    );
    read_ok(&mut c, 1);
}

#[test]
fn handshake_closing_paths() {
    let (_b, t) = server();
    // Unknown client flags.
    let mut s = std::os::unix::net::UnixStream::connect(&t.sock).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut g = [0u8; 18];
    s.read_exact(&mut g).unwrap();
    s.write_all(&0x8000_0001u32.to_be_bytes()).unwrap();
    assert!(matches!(s.read(&mut g), Ok(0)));
    // ABORT: ACK then close.
    let mut c = RawClient::greet(&t.sock);
    c.send_option(OPT_ABORT, &[]);
    assert_eq!(c.option_reply().0, REP_ACK);
    assert!(c.is_closed());
    // EXPORT_NAME of an unknown export: closed without reply.
    let mut c = RawClient::greet(&t.sock);
    c.send_option(OPT_EXPORT_NAME, b"nope");
    assert!(c.is_closed());
    // EXPORT_NAME "" reaches the default export (NO_ZEROES: 10 bytes).
    let mut c = RawClient::greet(&t.sock);
    c.send_option(OPT_EXPORT_NAME, b"");
    let mut r = [0u8; 10];
    c.s.read_exact(&mut r).unwrap();
    assert_eq!(u64::from_be_bytes(r[..8].try_into().unwrap()), MIB as u64);
    read_ok(&mut c, 1);
    // Bad option magic.
    let mut c = RawClient::greet(&t.sock);
    c.s.write_all(&[0u8; 16]).unwrap();
    assert!(c.is_closed());
}

#[test]
fn handshake_timeout_and_option_count() {
    let b = Arc::new(MemBackend::new(MIB));
    let limits = Limits {
        handshake_timeout: Duration::from_millis(300),
        max_options: 3,
        ..Limits::default()
    };
    let t = TestServer::start(vec![common::export("d", b)], limits);
    let mut c = RawClient::greet(&t.sock);
    let start = Instant::now();
    assert!(c.is_closed());
    assert!(start.elapsed() < Duration::from_secs(5));
    let mut c = RawClient::greet(&t.sock);
    for _ in 0..3 {
        c.send_option(99, &[]);
        assert_eq!(c.option_reply().0, REP_ERR_UNSUP);
    }
    assert!(c.is_closed());
}

fn be32(d: &[u8]) -> u32 {
    u32::from_be_bytes(d[..4].try_into().unwrap())
}

/// Structured replies + SET_META_CONTEXT(base:allocation) + GO; returns the
/// client and the context id the server assigned.
fn connect_with_meta(t: &TestServer) -> (RawClient, u32) {
    let mut c = RawClient::greet(&t.sock);
    c.send_option(OPT_STRUCTURED_REPLY, &[]);
    assert_eq!(c.option_reply().0, REP_ACK);
    c.send_option(OPT_LIST_META_CONTEXT, &codec::encode_meta_request("d", &[]));
    let (ty, data) = c.option_reply();
    assert_eq!(
        (ty, &data[4..]),
        (REP_META_CONTEXT, META_BASE_ALLOCATION.as_bytes())
    );
    assert_eq!(c.option_reply().0, REP_ACK);
    let q = codec::encode_meta_request("d", &[META_BASE_ALLOCATION]);
    c.send_option(OPT_SET_META_CONTEXT, &q);
    let (ty, data) = c.option_reply();
    assert_eq!(ty, REP_META_CONTEXT);
    assert_eq!(c.option_reply().0, REP_ACK);
    c.send_option(OPT_GO, &codec::encode_info_request("d", &[]));
    while c.option_reply().0 != REP_ACK {}
    c.structured = true;
    (c, be32(&data))
}

#[test]
fn structured_read_chunks_and_errors() {
    let mut m = MemBackend::new(MIB);
    m.fail_reads = Some((8192, 8192 + 512));
    let t = TestServer::one("d", Arc::new(m));
    let mut c = RawClient::connect(&t.sock, "d", true);
    assert_ne!(c.flags & FLAG_SEND_DF, 0);
    // Good read: one OFFSET_DATA chunk with DONE.
    c.request(CMD_READ, CMD_FLAG_DF, 1, 0, 4096);
    let (h, d) = c.chunk();
    let got = (h.chunk_type, h.flags, h.handle, d.len());
    assert_eq!(got, (REPLY_TYPE_OFFSET_DATA, REPLY_FLAG_DONE, 1, 4104));
    // Failing read without DF: data chunks + ERROR_OFFSET at the bad block.
    c.request(CMD_READ, 0, 2, 0, 65536);
    let (mut data_bytes, mut error_offsets) = (0, Vec::new());
    loop {
        let (h, d) = c.chunk();
        match h.chunk_type {
            REPLY_TYPE_OFFSET_DATA => data_bytes += d.len() - 8,
            REPLY_TYPE_ERROR_OFFSET => {
                assert_eq!(be32(&d), EIO);
                error_offsets.push(u64::from_be_bytes(d[d.len() - 8..].try_into().unwrap()));
            }
            t => assert_eq!(t, REPLY_TYPE_NONE),
        }
        if h.flags & REPLY_FLAG_DONE != 0 {
            break;
        }
    }
    assert_eq!(error_offsets, vec![8192]);
    assert_eq!(data_bytes, 65536 - 4096);
    // Failing read with DF: a single ERROR chunk.
    c.request(CMD_READ, CMD_FLAG_DF, 3, 8192, 512);
    let (h, d) = c.chunk();
    assert_eq!((h.chunk_type, h.flags), (REPLY_TYPE_ERROR, REPLY_FLAG_DONE));
    assert_eq!(be32(&d), EIO);
    // Invalid READ under structured replies: structured error.
    c.request(CMD_READ, 0, 4, MIB as u64, 512);
    let (h, d) = c.chunk();
    assert_eq!((h.chunk_type, h.handle), (REPLY_TYPE_ERROR, 4));
    assert_eq!(be32(&d), EINVAL);
    // Block status: this connection selected no context.
    c.request(CMD_BLOCK_STATUS, 0, 5, 0, 4096);
    assert_eq!(c.chunk().0.chunk_type, REPLY_TYPE_ERROR);
}

#[test]
fn block_status_base_allocation() {
    let (b, t) = server();
    nbd::Backend::write(&*b, 6144, &[1u8; 1024], false).unwrap();
    let (mut c, ctx_id) = connect_with_meta(&t);
    c.request(CMD_BLOCK_STATUS, 0, 6, 4096, 8192);
    let (h, d) = c.chunk();
    assert_eq!(
        (h.chunk_type, h.flags),
        (REPLY_TYPE_BLOCK_STATUS, REPLY_FLAG_DONE)
    );
    assert_eq!(be32(&d), ctx_id);
    // The backend's extents: 2048 bytes hole+zero, 1024 data, 5120 hole+zero.
    let extents: Vec<(u32, u32)> = d[4..]
        .chunks(8)
        .map(|e| (be32(&e[..4]), be32(&e[4..])))
        .collect();
    assert_eq!(extents, vec![(2048, 3), (1024, 0), (5120, 3)]);
    // REQ_ONE: only the first.
    c.request(CMD_BLOCK_STATUS, CMD_FLAG_REQ_ONE, 7, 4096, 8192);
    let (h, d) = c.chunk();
    assert_eq!(h.chunk_type, REPLY_TYPE_BLOCK_STATUS);
    assert_eq!(&d[4..], &[0, 0, 8, 0, 0, 0, 0, 3]);
    c.request(CMD_BLOCK_STATUS, 0, 8, 0, 0);
    assert_eq!(c.chunk().0.chunk_type, REPLY_TYPE_ERROR);
    c.request(CMD_BLOCK_STATUS, 0, 9, MIB as u64 - 512, 1024);
    assert_eq!(c.chunk().0.chunk_type, REPLY_TYPE_ERROR);
}

#[test]
fn simple_read_error_has_no_payload() {
    let mut m = MemBackend::new(MIB);
    m.fail_reads = Some((0, 512));
    let t = TestServer::one("d", Arc::new(m));
    let mut c = RawClient::connect(&t.sock, "d", false);
    c.request(CMD_READ, 0, 1, 0, 4096);
    assert_eq!(c.simple_reply(), (EIO, 1));
    c.request(CMD_READ, 0, 2, 4096, 512);
    assert_eq!(c.simple_reply(), (0, 2));
}

#[test]
fn zeroes_trim_fast_zero_and_cache() {
    let mut m = MemBackend::new(MIB);
    m.block_sizes.max = 65536;
    let b = Arc::new(m);
    let t = TestServer::one("d", b.clone());
    b.data.lock().unwrap().fill(0xff);
    let mut c = RawClient::connect(&t.sock, "d", false);
    c.request(CMD_WRITE_ZEROES, CMD_FLAG_FAST_ZERO, 1, 0, 4096);
    assert_eq!(c.simple_reply(), (ENOTSUP, 1));
    assert!(b.snapshot().iter().all(|&x| x == 0xff));
    c.request(
        CMD_WRITE_ZEROES,
        CMD_FLAG_NO_HOLE | CMD_FLAG_FUA,
        2,
        512,
        1024,
    );
    assert_eq!(c.simple_reply(), (0, 2));
    // TRIM and CACHE longer than the 64 KiB maximum are split, not refused.
    c.request(CMD_TRIM, 0, 3, 4096, (MIB - 4096) as u32);
    assert_eq!(c.simple_reply(), (0, 3));
    c.request(CMD_CACHE, 0, 4, 0, MIB as u32);
    assert_eq!(c.simple_reply(), (0, 4));
    c.request(CMD_FLUSH, 0, 5, 0, 0);
    assert_eq!(c.simple_reply(), (0, 5));
    let s = b.snapshot();
    assert!(s[..512].iter().all(|&x| x == 0xff));
    assert!(s[512..1536].iter().all(|&x| x == 0));
    assert!(s[1536..4096].iter().all(|&x| x == 0xff));
    assert!(s[4096..].iter().all(|&x| x == 0));
}

#[test]
fn pipelined_requests_all_answered() {
    let b = Arc::new(MemBackend::new(MIB));
    let limits = Limits {
        max_inflight_per_conn: 2,
        ..Limits::default()
    };
    let t = TestServer::start(vec![common::export("d", b.clone())], limits);
    let mut c = RawClient::connect(&t.sock, "d", false);
    let mut batch = Vec::new();
    for i in 0..200u64 {
        batch.extend_from_slice(&codec::encode_request(&codec::Request {
            flags: 0,
            command: CMD_WRITE,
            handle: i,
            offset: i * 4096,
            length: 4096,
        }));
        batch.extend_from_slice(&[i as u8; 4096]);
    }
    let mut w = c.s.try_clone().unwrap();
    let sender = std::thread::spawn(move || w.write_all(&batch).unwrap());
    let mut handles: Vec<u64> = (0..200)
        .map(|_| {
            let (e, h) = c.simple_reply();
            assert_eq!(e, 0);
            h
        })
        .collect();
    sender.join().unwrap();
    handles.sort();
    assert_eq!(handles, (0..200).collect::<Vec<_>>());
    let s = b.snapshot();
    for i in 0..200usize {
        assert!(s[i * 4096..(i + 1) * 4096].iter().all(|&x| x == i as u8));
    }
}

/// A 1 MiB READ, simple or structured, whose reply sits in the client's socket.
fn send_big_read(c: &mut RawClient) -> usize {
    c.request(CMD_READ, 0, 7, 0, MIB as u32);
    let head = if c.structured { 20 + 8 } else { 16 };
    head + MIB
}

/// Bytes queued for reading on `c`'s socket once they stop growing (the peek does not
/// consume them).
fn queued_when_settled(c: &RawClient, want: usize) -> usize {
    let sock = socket2::SockRef::from(&c.s);
    let mut buf = vec![std::mem::MaybeUninit::<u8>::uninit(); 2 * want];
    let (mut last, mut stable_since) = (0, Instant::now());
    let start = Instant::now();
    loop {
        let n = sock.peek(&mut buf).unwrap();
        if n != last {
            (last, stable_since) = (n, Instant::now());
        }
        let settled = stable_since.elapsed() > Duration::from_millis(300);
        if n >= want || settled || start.elapsed() > Duration::from_secs(5) {
            return n;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn a_large_read_reply_is_written_whole_without_waiting_for_the_client() {
    // The server's send buffer holds a whole 1 MiB reply: its thread writes it in one go
    // instead of sleeping until the client drains each 208 KiB (the kernel's default).
    // Needs `net.core.wmem_max` >= 1 MiB (`scripts/test.sh` raises it).
    let wmem_max: usize = std::fs::read_to_string("/proc/sys/net/core/wmem_max")
        .expect("/proc/sys/net/core/wmem_max")
        .trim()
        .parse()
        .unwrap();
    assert!(
        wmem_max >= MIB,
        "net.core.wmem_max is {wmem_max}: the kernel caps every send buffer there, below a \
         1 MiB reply (recent kernels default to 4 MiB; `sysctl -w net.core.wmem_max=4194304`)"
    );
    let (_b, t) = server();
    for structured in [false, true] {
        let mut c = RawClient::connect(&t.sock, "d", structured);
        let want = send_big_read(&mut c);
        let queued = queued_when_settled(&c, want);
        assert_eq!(
            queued, want,
            "structured {structured}: the reply stopped at {queued} of {want} bytes until read"
        );
        let mut reply = vec![0u8; want];
        c.s.read_exact(&mut reply).unwrap();
    }
}

#[test]
fn reads_get_unzeroed_buffers_only_from_backends_that_fill_them() {
    for fills in [false, true] {
        let mut b = MemBackend::new(2 * MIB);
        b.fills_reads = fills;
        let b = Arc::new(b);
        let t = TestServer::one("d", b.clone());
        let mut c = RawClient::connect(&t.sock, "d", false);
        // A WRITE's payload buffer goes back to the pool, full of 0xab; the READ of the same
        // size that follows gets it again.
        c.request(CMD_WRITE, 0, 1, MIB as u64, MIB as u32);
        c.s.write_all(&vec![0xab; MIB]).unwrap();
        assert_eq!(c.simple_reply(), (0, 1));
        c.request(CMD_READ, 0, 2, 0, MIB as u32);
        assert_eq!(c.simple_reply(), (0, 2));
        let mut d = vec![1u8; MIB];
        c.s.read_exact(&mut d).unwrap();
        assert!(d.iter().all(|&x| x == 0), "fills {fills}: wrong data read");
        let dirty = b.reads_given_dirty.load(Ordering::SeqCst);
        // Zeroing is skipped (the memset of every byte read) only where the backend says
        // it overwrites all of the buffer anyway.
        assert_eq!(dirty, usize::from(fills), "fills {fills}");
    }
}

/// Sends `writes` (offset, length) as one pipelined burst (WRITE i carries the byte i + 1 and
/// handle i), reads every reply and checks the data; returns the runs the backend was given
/// as (WRITEs, payload bytes).
fn burst_of_writes(
    b: &Arc<MemBackend>,
    limits: Limits,
    writes: &[(u64, u32)],
) -> Vec<(usize, usize)> {
    let t = TestServer::start(vec![common::export("d", b.clone())], limits);
    let mut c = RawClient::connect(&t.sock, "d", false);
    let mut burst = Vec::new();
    for (i, &(offset, length)) in writes.iter().enumerate() {
        burst.extend_from_slice(&codec::encode_request(&codec::Request {
            flags: 0,
            command: CMD_WRITE,
            handle: i as u64,
            offset,
            length,
        }));
        burst.extend(std::iter::repeat_n(i as u8 + 1, length as usize));
    }
    let mut w = c.s.try_clone().unwrap();
    let sender = std::thread::spawn(move || w.write_all(&burst).unwrap());
    let mut handles: Vec<u64> = (0..writes.len())
        .map(|_| {
            let (e, h) = c.simple_reply();
            assert_eq!(e, 0, "WRITE {h}");
            h
        })
        .collect();
    sender.join().unwrap();
    handles.sort();
    assert_eq!(handles, (0..writes.len() as u64).collect::<Vec<_>>());
    let s = b.snapshot();
    for (i, &(offset, length)) in writes.iter().enumerate() {
        let r = offset as usize..(offset + u64::from(length)) as usize;
        assert!(s[r].iter().all(|&x| x == i as u8 + 1), "WRITE {i}'s data");
    }
    assert_eq!(
        b.hints_live.load(Ordering::SeqCst),
        0,
        "a hint outlived its request"
    );
    b.runs.lock().unwrap().clone()
}

/// A backend that asks for them gets the WRITEs of a sequential stream that arrived together
/// as runs (md's plug), never more than a connection may have in flight nor more than 128 KiB
/// (what one thread runs inline); a stream with gaps, or a backend that does not ask, gets
/// every WRITE on its own.
#[test]
fn sequential_writes_that_arrived_together_are_gathered_into_runs() {
    let gathering = || {
        Arc::new(MemBackend {
            gathers: true,
            ..MemBackend::new(4 * MIB)
        })
    };
    let limits = Limits {
        max_threads_per_conn: 8,
        ..Limits::default()
    };
    let stream: Vec<(u64, u32)> = (0..128).map(|i| (i * 4096, 4096)).collect();
    let runs = burst_of_writes(&gathering(), limits, &stream);
    assert!(
        runs.iter().any(|&(n, _)| n > 1),
        "128 sequential WRITEs sent at once were never gathered: runs {runs:?}"
    );
    assert!(
        runs.iter().all(|&(n, _)| n <= 8),
        "a run held more requests than the connection may have in flight: {runs:?}"
    );
    // 1 KiB pieces (a guest with 512-byte sectors) are a stream too.
    let small: Vec<(u64, u32)> = (0..256).map(|i| (i * 1024, 1024)).collect();
    let runs = burst_of_writes(&gathering(), limits, &small);
    assert!(
        runs.iter().any(|&(n, _)| n > 1),
        "1 KiB stream: runs {runs:?}"
    );
    // WRITEs above the limit, each followed by small ones that continue it: a run stays within
    // its byte limit, whatever its first WRITE's size (such a WRITE runs alone).
    let mixed: Vec<(u64, u32)> = (0..16u64)
        .flat_map(|i| {
            let at = i * (168 << 10);
            [
                (at, 160 << 10),
                (at + (160 << 10), 4096),
                (at + (164 << 10), 4096),
            ]
        })
        .collect();
    let runs = burst_of_writes(&gathering(), limits, &mixed);
    assert!(
        runs.iter().all(|&(_, bytes)| bytes <= 128 << 10),
        "a run held more than 128 KiB: {runs:?}"
    );
    assert!(
        runs.iter().any(|&(n, _)| n > 1),
        "mixed stream: runs {runs:?}"
    );
    // Every other 4 KiB: nothing continues anything.
    let gaps: Vec<(u64, u32)> = (0..128).map(|i| (i * 8192, 4096)).collect();
    let runs = burst_of_writes(&gathering(), limits, &gaps);
    assert!(runs.is_empty(), "writes with gaps were gathered: {runs:?}");
    // Not asked for: the stream goes one request at a time.
    let runs = burst_of_writes(&Arc::new(MemBackend::new(MIB)), limits, &stream);
    assert!(
        runs.is_empty(),
        "a backend that did not ask got runs: {runs:?}"
    );
}

#[test]
fn client_vanishing_mid_request_leaves_server_healthy() {
    let (b, t) = server();
    {
        // Half a header, then gone.
        let mut c = RawClient::connect(&t.sock, "d", false);
        c.s.write_all(&[0x25, 0x60, 0x95]).unwrap();
    }
    {
        // Many reads queued, nobody reading the replies.
        let mut c = RawClient::connect(&t.sock, "d", false);
        for i in 0..64 {
            c.request(CMD_READ, 0, i, 0, 65536);
        }
    }
    {
        // Gone in the middle of the handshake.
        let mut c = RawClient::greet(&t.sock);
        c.s.write_all(&IHAVEOPT.to_be_bytes()).unwrap();
    }
    wait_until(|| t.server.active_connections() == 0);
    let mut c = RawClient::connect(&t.sock, "d", false);
    read_ok(&mut c, 1);
    assert_eq!(b.writes.load(Ordering::SeqCst), 0);
}

#[test]
fn connection_limit() {
    let b = Arc::new(MemBackend::new(MIB));
    let limits = Limits {
        max_connections: 1,
        ..Limits::default()
    };
    let t = TestServer::start(vec![common::export("d", b)], limits);
    let mut first = RawClient::connect(&t.sock, "d", false);
    // Served: past its handshake (one still in it would make room for the next).
    read_ok(&mut first, 1);
    let mut s = std::os::unix::net::UnixStream::connect(&t.sock).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut g = [0u8; 18];
    assert!(matches!(s.read(&mut g), Ok(0) | Err(_)));
    read_ok(&mut first, 3);
    c_disc(first);
    wait_until(|| t.server.active_connections() == 0);
    let mut again = RawClient::connect(&t.sock, "d", false);
    read_ok(&mut again, 2);
}

/// Connections that never send a byte hold only handshake slots: when those are full the
/// oldest is closed, and a real client still gets in at once.
#[test]
fn idle_connections_in_the_handshake_cannot_lock_clients_out() {
    let b = Arc::new(MemBackend::new(MIB));
    let limits = Limits {
        max_handshakes: 4,
        max_connections: 8,
        ..Limits::default()
    };
    let t = TestServer::start(vec![common::export("d", b)], limits);
    let idle: Vec<_> = (0..32)
        .map(|_| std::os::unix::net::UnixStream::connect(&t.sock).unwrap())
        .collect();
    let start = Instant::now();
    let mut c = RawClient::connect(&t.sock, "d", false);
    read_ok(&mut c, 1);
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "{:?}",
        start.elapsed()
    );
    wait_until(|| t.server.active_connections() <= 5);
    drop(idle);
}

/// A burst of real clients larger than the handshake limit (a fio job with many connections,
/// VMs booting together) all get in: none is closed to make room for another that came later.
#[test]
fn a_burst_of_clients_past_the_handshake_limit_all_get_in() {
    let b = Arc::new(MemBackend::new(MIB));
    let limits = Limits {
        max_handshakes: 4,
        ..Limits::default()
    };
    let t = TestServer::start(vec![common::export("d", b)], limits);
    // Every one greeted (in the handshake) before any goes on.
    let greeted: Vec<RawClient> = (0..32).map(|_| RawClient::greet(&t.sock)).collect();
    let clients: Vec<std::thread::JoinHandle<()>> = greeted
        .into_iter()
        .enumerate()
        .map(|(i, c)| {
            std::thread::spawn(move || {
                let mut c = c.go("d", false);
                read_ok(&mut c, i as u64);
                c_disc(c);
            })
        })
        .collect();
    for c in clients {
        c.join()
            .expect("a client of the burst was closed in its handshake");
    }
}

/// Request threads of all connections stay within `Limits::max_threads` (each connection keeps
/// one), and every request is still answered.
#[test]
fn request_threads_of_all_connections_are_capped() {
    let b = Arc::new(MemBackend {
        delay: Duration::from_millis(20),
        ..MemBackend::new(MIB)
    });
    let limits = Limits {
        max_threads: 6,
        ..Limits::default()
    };
    let t = TestServer::start(vec![common::export("d", b)], limits);
    let mut clients: Vec<RawClient> = (0..4)
        .map(|_| RawClient::connect(&t.sock, "d", false))
        .collect();
    // Every connection's own thread first (those are not capped), then the load.
    wait_until(|| t.server.request_threads() == 4);
    for c in &mut clients {
        for h in 0..16 {
            c.request(CMD_READ, 0, h, 0, 512);
        }
    }
    let mut most = 0;
    let watch = Instant::now();
    while watch.elapsed() < Duration::from_millis(150) {
        most = most.max(t.server.request_threads());
        std::thread::sleep(Duration::from_millis(2));
    }
    for c in &mut clients {
        for _ in 0..16 {
            let (err, _) = c.simple_reply();
            assert_eq!(err, 0);
            let mut d = vec![0u8; 512];
            c.s.read_exact(&mut d).unwrap();
        }
    }
    assert!(
        most > 4,
        "the connections started more threads than one each ({most})"
    );
    assert!(most <= 6, "{most} request threads, the cap is 6");
}

fn c_disc(mut c: RawClient) {
    c.request(CMD_DISC, 0, 99, 0, 0);
    assert!(c.is_closed());
}
