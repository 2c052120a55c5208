//! A raw NBD client over a Unix socket that speaks the protocol itself: fixed newstyle
//! handshake, `NBD_OPT_GO` without asking for `NBD_INFO_BLOCK_SIZE` (so the server must take
//! any byte range), then simple requests, many in flight at once. Tests use it where they need
//! byte-granular requests or control over what is in flight, which qemu and fio do not give.

use std::io::{self, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use nbd::codec::{self, Request};
use nbd::proto::*;

/// What [`Client::write_all_answers`] gives a write the server never answered.
pub const UNANSWERED: u32 = u32::MAX;

pub struct Client {
    s: UnixStream,
}

impl Client {
    pub fn connect(sock: &Path, name: &str) -> Client {
        let mut s = UnixStream::connect(sock).expect("connect to the NBD socket");
        s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        let mut greeting = [0u8; 18];
        s.read_exact(&mut greeting).unwrap();
        assert_eq!(greeting, codec::server_greeting());
        s.write_all(&(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES).to_be_bytes())
            .unwrap();
        let go = codec::encode_info_request(name, &[]);
        s.write_all(&codec::encode_option(OPT_GO, &go)).unwrap();
        loop {
            let mut h = [0u8; 20];
            s.read_exact(&mut h).unwrap();
            let h = codec::parse_option_reply_header(&h).unwrap();
            let mut data = vec![0u8; h.length as usize];
            s.read_exact(&mut data).unwrap();
            match h.reply_type {
                REP_INFO => {}
                REP_ACK => return Client { s },
                other => panic!("unexpected reply {other:#x} to NBD_OPT_GO"),
            }
        }
    }

    fn send(&mut self, command: u16, handle: u64, offset: u64, length: usize) {
        self.try_send(command, handle, offset, length).unwrap();
    }

    fn try_send(&mut self, command: u16, handle: u64, offset: u64, len: usize) -> io::Result<()> {
        let r = Request {
            flags: 0,
            command,
            handle,
            offset,
            length: u32::try_from(len).unwrap(),
        };
        self.s.write_all(&codec::encode_request(&r))
    }

    /// One simple reply: (error, handle).
    fn reply(&mut self) -> (u32, u64) {
        self.try_reply().unwrap()
    }

    fn try_reply(&mut self) -> io::Result<(u32, u64)> {
        let mut h = [0u8; 16];
        self.s.read_exact(&mut h)?;
        let r = codec::parse_simple_reply(&h).unwrap();
        Ok((r.error, r.handle))
    }

    /// `len` bytes at `offset`; panics if the server answers an error.
    pub fn read(&mut self, offset: u64, len: usize) -> Vec<u8> {
        self.try_read(offset, len)
            .unwrap_or_else(|e| panic!("read {offset}+{len}: error {e}"))
    }

    /// `len` bytes at `offset`, or the NBD error the server answered.
    pub fn try_read(&mut self, offset: u64, len: usize) -> Result<Vec<u8>, u32> {
        self.send(CMD_READ, 0, offset, len);
        let (err, handle) = self.reply();
        assert_eq!(handle, 0, "read {offset}+{len}: reply for another handle");
        if err != 0 {
            return Err(err);
        }
        let mut data = vec![0u8; len];
        self.s.read_exact(&mut data).unwrap();
        Ok(data)
    }

    /// `NBD_CMD_FLUSH`: false if the server failed it or the connection broke.
    pub fn try_flush(&mut self) -> bool {
        self.try_send(CMD_FLUSH, 2, 0, 0).is_ok() && matches!(self.try_reply(), Ok((0, 2)))
    }

    /// `NBD_CMD_WRITE_ZEROES` of `len` bytes at `offset`; panics if the server answers an
    /// error.
    pub fn write_zeroes(&mut self, offset: u64, len: usize) {
        self.send(CMD_WRITE_ZEROES, 1, offset, len);
        assert_eq!(self.reply(), (0, 1), "zeroes at {offset} len {len}");
    }

    /// Sends every write (from a second thread, so that they are all in flight together and
    /// the server is never stuck sending replies nobody reads) and waits for every reply;
    /// panics if one fails. The server may run them in any order: callers keep them from
    /// overlapping.
    pub fn write_all(&mut self, writes: &[(u64, Vec<u8>)]) {
        for (h, err) in self.write_all_answers(writes).into_iter().enumerate() {
            assert_eq!(err, 0, "write {h} failed");
        }
    }

    /// As [`Client::write_all`], but returns the NBD error of each write (0: done), and
    /// [`UNANSWERED`] for each write without a reply when the connection broke (the server
    /// died): such a write may or may not have landed.
    pub fn write_all_answers(&mut self, writes: &[(u64, Vec<u8>)]) -> Vec<u32> {
        let mut sender = Client {
            s: self.s.try_clone().unwrap(),
        };
        let mut answers = vec![UNANSWERED; writes.len()];
        std::thread::scope(|scope| {
            scope.spawn(|| {
                for (h, (offset, data)) in writes.iter().enumerate() {
                    let sent = sender
                        .try_send(CMD_WRITE, h as u64, *offset, data.len())
                        .and_then(|()| sender.s.write_all(data));
                    if sent.is_err() {
                        break;
                    }
                }
            });
            for _ in 0..writes.len() {
                let Ok((err, h)) = self.try_reply() else {
                    break;
                };
                answers[h as usize] = err;
            }
        });
        answers
    }
}
