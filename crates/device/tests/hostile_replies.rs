//! The member client against a server that breaks the rules of structured replies. No real
//! server sends these, so the server here is scripted byte by byte: the export name of the URI
//! picks how it answers every READ. What must hold: a read either returns exactly the bytes
//! the server placed once each, or fails with an error naming what was wrong. Well-formed
//! but unusual replies (chunks out of order, holes, an error chunk with or without a code)
//! are read as the protocol says.

use device::{Device, NbdDevice, RemoteOptions};
use nbd::codec::{self, ChunkHeader};
use nbd::proto::*;
use std::io::{self, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const SIZE: u64 = 1 << 20;
/// The export's byte at `at`: zero in its second half (where holes may be sent), a pattern
/// in the first.
fn byte_at(at: u64) -> u8 {
    if at >= SIZE / 2 {
        0
    } else {
        (at as u8).wrapping_mul(37) ^ (at >> 9) as u8 | 1
    }
}

fn content(at: u64, len: u64) -> Vec<u8> {
    (at..at + len).map(byte_at).collect()
}

fn data_chunk(handle: u64, done: bool, at: u64, bytes: &[u8]) -> Vec<u8> {
    let flags = if done { REPLY_FLAG_DONE } else { 0 };
    let mut out = codec::chunk_offset_data_prefix(handle, flags, at, bytes.len())
        .expect("fits")
        .to_vec();
    out.extend_from_slice(bytes);
    out
}

/// A chunk of any type with `body` as it comes (malformed on purpose where a case says so).
fn raw_chunk(handle: u64, done: bool, chunk_type: u16, body: &[u8]) -> Vec<u8> {
    let mut out = codec::chunk_header(&ChunkHeader {
        flags: if done { REPLY_FLAG_DONE } else { 0 },
        chunk_type,
        handle,
        length: body.len() as u32,
    })
    .to_vec();
    out.extend_from_slice(body);
    out
}

fn hole_chunk(handle: u64, done: bool, at: u64, len: u32) -> Vec<u8> {
    let mut body = at.to_be_bytes().to_vec();
    body.extend_from_slice(&len.to_be_bytes());
    raw_chunk(handle, done, REPLY_TYPE_OFFSET_HOLE, &body)
}

/// What the scripted server sends for one READ, and whether it then hangs up.
struct Answer {
    bytes: Vec<u8>,
    hang_up: bool,
}

fn send(bytes: Vec<u8>) -> Answer {
    Answer {
        bytes,
        hang_up: false,
    }
}

/// The reply of `case` to READ `handle` of `len` bytes at `at`; `conn` counts the case's
/// connections from 0.
fn answer(case: &str, conn: usize, handle: u64, at: u64, len: u32) -> Answer {
    let want = content(at, u64::from(len));
    let half = u64::from(len / 2);
    let (first, second) = want.split_at(half as usize);
    match case {
        // 4 KiB pieces, last first, each all-zero piece as a hole.
        "pieces-reversed-with-holes" => {
            let mut out = Vec::new();
            let pieces: Vec<u64> = (0..u64::from(len)).step_by(4096).collect();
            for (i, &p) in pieces.iter().rev().enumerate() {
                let n = (u64::from(len) - p).min(4096);
                let done = i + 1 == pieces.len();
                let bytes = &want[p as usize..(p + n) as usize];
                out.extend(if bytes.iter().all(|&b| b == 0) {
                    hole_chunk(handle, done, at + p, n as u32)
                } else {
                    data_chunk(handle, done, at + p, bytes)
                });
            }
            send(out)
        }
        "error-chunk-after-data" => {
            let mut out = data_chunk(handle, false, at, first);
            out.extend(codec::chunk_error_offset(
                handle,
                REPLY_FLAG_DONE,
                EPERM,
                "scripted",
                at + half,
            ));
            send(out)
        }
        "error-chunk-without-a-code" => send(codec::chunk_error(handle, REPLY_FLAG_DONE, 0, "")),
        // The first connection drops after half the data; the next answers whole.
        "drop-mid-reply-then-whole" if conn == 0 => Answer {
            bytes: data_chunk(handle, false, at, first),
            hang_up: true,
        },
        "drop-mid-reply-then-whole" => {
            let mut out = data_chunk(handle, false, at + half, second);
            out.extend(data_chunk(handle, true, at, first));
            send(out)
        }
        // The byte count comes out right (all but the last 4 KiB, then 4 KiB again over the
        // data): only the overlap shows it.
        "overlap" => {
            let short = want.len() - 4096;
            let mut out = data_chunk(handle, false, at, &want[..short]);
            out.extend(data_chunk(handle, true, at + 8192, &[0xEE; 4096]));
            send(out)
        }
        "gap" => send(data_chunk(handle, true, at, first)),
        "outside-the-read" => {
            let mut out = data_chunk(handle, false, at + 4096, &want);
            out.extend(data_chunk(handle, true, at, &want[..4096]));
            send(out)
        }
        "hole-of-wrong-size" => {
            let mut out = data_chunk(handle, false, at, first);
            out.extend(raw_chunk(
                handle,
                true,
                REPLY_TYPE_OFFSET_HOLE,
                &(at + half).to_be_bytes(),
            ));
            send(out)
        }
        "unknown-chunk-type" => {
            let mut out = data_chunk(handle, false, at, &want);
            out.extend(raw_chunk(handle, true, 3, &[0; 8]));
            send(out)
        }
        "stranger-handle" => send(data_chunk(handle ^ 0x5a5a, true, at, &want)),
        "error-chunk-too-short" => {
            let mut out = data_chunk(handle, false, at, &want);
            out.extend(raw_chunk(
                handle,
                true,
                REPLY_TYPE_ERROR,
                &EIO.to_be_bytes(),
            ));
            send(out)
        }
        "none-not-last" => {
            let mut out = raw_chunk(handle, false, REPLY_TYPE_NONE, &[]);
            out.extend(data_chunk(handle, true, at, &want));
            send(out)
        }
        "unnegotiated-chunks" => send(data_chunk(handle, true, at, &want)),
        other => panic!("no case {other}"),
    }
}

/// One connection of the scripted server: the handshake (structured replies acknowledged when
/// `structured`), then READs answered by `answer`, writes and flushes acknowledged.
fn serve_connection(
    mut s: UnixStream,
    structured: bool,
    conns: &Mutex<Vec<String>>,
) -> io::Result<()> {
    s.write_all(&codec::server_greeting())?;
    s.read_exact(&mut [0u8; 4])?;
    let case = loop {
        let mut h = [0u8; OPTION_HEADER_LEN];
        s.read_exact(&mut h)?;
        let h = codec::parse_option_header(&h).map_err(io::Error::other)?;
        let mut data = vec![0u8; h.length as usize];
        s.read_exact(&mut data)?;
        match codec::parse_option(h.option, &data).map_err(io::Error::other)? {
            codec::ClientOption::Go(info) => {
                let flags = FLAG_HAS_FLAGS | FLAG_SEND_FLUSH;
                let export = codec::info_export(SIZE, flags);
                s.write_all(&codec::encode_option_reply(OPT_GO, REP_INFO, &export))?;
                s.write_all(&codec::encode_option_reply(OPT_GO, REP_ACK, &[]))?;
                break info.name;
            }
            codec::ClientOption::StructuredReply => {
                let reply = if structured { REP_ACK } else { REP_ERR_UNSUP };
                s.write_all(&codec::encode_option_reply(h.option, reply, &[]))?;
            }
            _ => s.write_all(&codec::encode_option_reply(h.option, REP_ERR_UNSUP, &[]))?,
        }
    };
    let conn = {
        let mut seen = conns.lock().unwrap();
        seen.push(case.clone());
        seen.iter().filter(|c| **c == case).count() - 1
    };
    loop {
        let mut r = [0u8; REQUEST_LEN];
        s.read_exact(&mut r)?;
        let r = codec::parse_request(&r).map_err(io::Error::other)?;
        match r.command {
            CMD_READ => {
                let a = answer(&case, conn, r.handle, r.offset, r.length);
                s.write_all(&a.bytes)?;
                if a.hang_up {
                    return Ok(());
                }
            }
            CMD_DISC => return Ok(()),
            command => {
                if command == CMD_WRITE {
                    io::copy(&mut (&mut s).take(u64::from(r.length)), &mut io::sink())?;
                }
                s.write_all(&codec::simple_reply(0, r.handle))?;
            }
        }
    }
}

/// The scripted server on a Unix socket in `dir`, serving until the test process ends.
fn start(dir: &Path, structured: bool) -> PathBuf {
    let sock = dir.join(if structured {
        "chunks.sock"
    } else {
        "simple.sock"
    });
    let listener = UnixListener::bind(&sock).unwrap();
    let conns = Arc::new(Mutex::new(Vec::new()));
    std::thread::spawn(move || {
        for s in listener.incoming() {
            let conns = Arc::clone(&conns);
            let s = s.expect("accept");
            // A connection ends when the client hangs up or a case hangs up on it.
            std::thread::spawn(move || serve_connection(s, structured, &conns));
        }
    });
    sock
}

/// Short windows: a case whose every reply is wrong fails its read within a second or so.
fn opts() -> RemoteOptions {
    RemoteOptions {
        timeout: Duration::from_millis(2000),
        retry: Duration::from_millis(300),
        ..RemoteOptions::default()
    }
}

fn open(sock: &Path, case: &str) -> NbdDevice {
    NbdDevice::open(
        &format!("nbd+unix:///{case}?socket={}", sock.display()),
        opts(),
    )
    .unwrap_or_else(|e| panic!("{case}: {e}"))
}

/// Reads of 64 KiB at three places: in the data, across data and zeroes, in the zeroes.
const READS: [u64; 3] = [8192, SIZE / 2 - 32768, SIZE - 65536];

#[test]
fn well_formed_chunks_in_any_order_read_back_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let sock = start(dir.path(), true);
    for case in ["pieces-reversed-with-holes", "drop-mid-reply-then-whole"] {
        let dev = open(&sock, case);
        assert!(dev.structured_replies(), "{case}: negotiated");
        for at in READS {
            let mut buf = vec![0xA5u8; 65536];
            dev.read_at(&mut buf, at)
                .unwrap_or_else(|e| panic!("{case} at {at}: {e}"));
            let wrong = buf
                .iter()
                .zip(content(at, 65536))
                .position(|(a, b)| *a != b);
            assert_eq!(wrong, None, "{case}: read at {at}");
        }
    }
}

#[test]
fn error_chunks_are_the_reads_error() {
    let dir = tempfile::tempdir().unwrap();
    let sock = start(dir.path(), true);
    for (case, errno) in [
        ("error-chunk-after-data", EPERM),
        ("error-chunk-without-a-code", EIO),
    ] {
        let dev = open(&sock, case);
        let err = dev.read_at(&mut vec![0u8; 65536], 8192).expect_err(case);
        let want = format!("server says {}", io::Error::from_raw_os_error(errno as i32));
        assert!(
            err.to_string().contains(&want),
            "{case}: {err} (want {want})"
        );
        // A server's error is final for that request, not a reason to fail the member.
        dev.write_at(&[7u8; 4096], 0, false)
            .unwrap_or_else(|e| panic!("{case}: {e}"));
    }
}

#[test]
fn malformed_replies_fail_the_read_never_return_wrong_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let chunks = start(dir.path(), true);
    let simple = start(dir.path(), false);
    for (sock, case, says) in [
        (&chunks, "overlap", "chunks overlap"),
        (&chunks, "gap", "covered 32768 of its 65536 bytes"),
        (&chunks, "outside-the-read", "outside its read"),
        (
            &chunks,
            "hole-of-wrong-size",
            "reply chunk of type 2 (8 bytes)",
        ),
        (&chunks, "unknown-chunk-type", "reply chunk of type 3"),
        (&chunks, "stranger-handle", "nobody waits for"),
        (
            &chunks,
            "error-chunk-too-short",
            "reply chunk of type 32769 (4 bytes)",
        ),
        (&chunks, "none-not-last", "reply chunk of type 0 (0 bytes)"),
        (&simple, "unnegotiated-chunks", "bad magic"),
    ] {
        let dev = open(sock, case);
        let t = Instant::now();
        let mut buf = vec![0u8; 65536];
        let got = dev.read_at(&mut buf, 8192);
        let err = got.expect_err(&format!("{case}: read succeeded"));
        assert!(
            err.to_string().contains(says),
            "{case}: the error names the fault ({says}): {err}"
        );
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "{case}: {:?}",
            t.elapsed()
        );
    }
}
