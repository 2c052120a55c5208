//! READs a backend answers through the server's pipe (`Backend::read_to_pipe`): the reply is
//! the same as through a buffer, in simple and structured replies, and a backend that gives
//! up halfway leaves nothing of it on the wire, in this reply or a later one.

mod common;

use std::io::Read;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use common::{MemBackend, RawClient, TestServer};
use nbd::proto::*;

const MIB: usize = 1 << 20;

fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 7 + i / 4096) as u8).collect()
}

/// A splicing backend holding `pattern`, whose reads touching 64 KiB..68 KiB give up halfway
/// and then fail (EIO) through the buffer.
fn server() -> (Arc<MemBackend>, TestServer) {
    server_with(|_| {})
}

fn server_with(tweak: impl FnOnce(&mut MemBackend)) -> (Arc<MemBackend>, TestServer) {
    let mut m = MemBackend::new(MIB);
    m.splices = true;
    m.fail_reads = Some((65536, 69632));
    *m.data.lock().unwrap() = pattern(MIB);
    tweak(&mut m);
    let b = Arc::new(m);
    let t = TestServer::one("d", b.clone());
    (b, t)
}

fn read_simple(c: &mut RawClient, handle: u64, offset: u64, len: u32) -> Result<Vec<u8>, u32> {
    c.request(CMD_READ, 0, handle, offset, len);
    let (err, h) = c.simple_reply();
    assert_eq!(h, handle);
    if err != 0 {
        return Err(err);
    }
    let mut d = vec![0u8; len as usize];
    c.s.read_exact(&mut d).unwrap();
    Ok(d)
}

#[test]
fn spliced_reads_reply_as_buffered_ones_do() {
    let (b, t) = server();
    let want = pattern(MIB);
    let mut c = RawClient::connect(&t.sock, "d", false);
    let reads = [
        (0u64, 65536u32),
        (131072, 131072),
        (262144, MIB as u32 - 262144),
    ];
    for (h, (at, len)) in reads.into_iter().enumerate() {
        let got = read_simple(&mut c, h as u64, at, len).unwrap();
        assert!(
            got == want[at as usize..at as usize + len as usize],
            "simple read {at}+{len}"
        );
    }
    let mut s = RawClient::connect(&t.sock, "d", true);
    s.request(CMD_READ, CMD_FLAG_DF, 9, 139264, 65536);
    let (h, d) = s.chunk();
    assert_eq!(
        (h.chunk_type, h.flags, h.handle),
        (REPLY_TYPE_OFFSET_DATA, REPLY_FLAG_DONE, 9)
    );
    assert_eq!(u64::from_be_bytes(d[..8].try_into().unwrap()), 139264);
    assert!(d[8..] == want[139264..139264 + 65536], "structured read");
    assert_eq!(b.spliced.load(Ordering::SeqCst), 4);
    // Below 64 KiB the buffered path is cheaper: not spliced.
    assert!(read_simple(&mut c, 8, 4096, 61440).unwrap() == want[4096..65536]);
    assert_eq!(b.spliced.load(Ordering::SeqCst), 4);
    // The whole MiB touches the failing range: given up, then EIO through the buffer.
    assert_eq!(read_simple(&mut c, 7, 0, MIB as u32), Err(EIO));
    assert_eq!(b.splices_given_up.load(Ordering::SeqCst), 1);
}

/// Canary: a server that sent what the pipe held when the backend gave up (or kept the pipe
/// with it for the next read) fails this: the error reply would carry bytes, or the next
/// read would begin with the abandoned half.
#[test]
fn a_backend_that_gives_up_halfway_leaves_nothing_on_the_wire() {
    let (b, t) = server();
    let want = pattern(MIB);
    let mut c = RawClient::connect(&t.sock, "d", false);
    for round in 0..3u64 {
        assert_eq!(read_simple(&mut c, 10 * round, 65536, 65536), Err(EIO));
        let got = read_simple(&mut c, 10 * round + 1, 262144, 65536).unwrap();
        assert!(
            got == want[262144..262144 + 65536],
            "round {round}: the read after"
        );
    }
    assert_eq!(b.splices_given_up.load(Ordering::SeqCst), 3);
    assert_eq!(b.spliced.load(Ordering::SeqCst), 3);
    let mut s = RawClient::connect(&t.sock, "d", true);
    s.request(CMD_READ, CMD_FLAG_DF, 5, 32768, 65536);
    let (h, d) = s.chunk();
    assert_eq!((h.chunk_type, h.flags), (REPLY_TYPE_ERROR, REPLY_FLAG_DONE));
    assert_eq!(u32::from_be_bytes(d[..4].try_into().unwrap()), EIO);
    assert!(read_simple(&mut c, 99, 0, 4096).unwrap() == want[..4096]);
}

/// A backend that claims a whole read but put half of it in the pipe: the server must not wait
/// for the rest (it would never come, with the connection's writer held) nor send the half; it
/// reads through the buffer instead. Canary: without the byte count check this test hangs.
#[test]
fn a_short_spliced_read_goes_through_the_buffer() {
    let (b, t) = server_with(|m| m.splice_lies = true);
    let want = pattern(MIB);
    let mut c = RawClient::connect(&t.sock, "d", false);
    assert_eq!(read_simple(&mut c, 1, 65536, 65536), Err(EIO));
    assert!(read_simple(&mut c, 2, 0, 4096).unwrap() == want[..4096]);
    assert_eq!(b.splices_given_up.load(Ordering::SeqCst), 1);
}
