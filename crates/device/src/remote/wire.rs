//! One client connection to an NBD export: fixed-newstyle handshake with `NBD_OPT_GO`, then
//! strictly one request at a time (the connection pool in `mod.rs` gives concurrency).
//!
//! Why one request per connection: replies then need no matching, a read lands straight in the
//! caller's buffer, and a timeout is the socket's own (`SO_RCVTIMEO`/`SO_SNDTIMEO`): a request
//! fails when the server makes no progress for that long. A connection that failed mid-request
//! is never reused: its stream position is unknown.
//!
//! No structured replies are negotiated, so every reply is a simple reply (the server must not
//! send structured ones then); wire encoding is the server crate's codec.

use super::uri::{NbdUri, Transport};
use nbd::codec::{self, Request};
use nbd::proto::*;
use std::io::{self, IoSlice, IoSliceMut, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::os::unix::net::UnixStream;
use std::time::Duration;

/// Option replies longer than this are refused (ours ask for a few bytes of info).
const MAX_OPTION_REPLY_BYTES: u32 = 64 << 10;
/// Option replies read before `NBD_REP_ACK` at most.
const MAX_OPTION_REPLIES: usize = 64;

/// What failed: the transport (retry on a fresh connection) or the server's answer (final).
#[derive(Debug)]
pub enum Failure {
    Transport(io::Error),
    /// The server answered with this NBD error value.
    Server(u32),
}

impl From<io::Error> for Failure {
    fn from(e: io::Error) -> Failure {
        Failure::Transport(e)
    }
}

/// What `NBD_OPT_GO` told about the export.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExportInfo {
    pub size_bytes: u64,
    pub flags: u16,
    pub min_block: u32,
    pub max_block: u32,
}

impl ExportInfo {
    pub fn has(&self, flag: u16) -> bool {
        self.flags & flag != 0
    }
}

enum Stream {
    Unix(UnixStream),
    Tcp(TcpStream),
}

impl Stream {
    fn connect(transport: &Transport, timeout: Duration) -> io::Result<Stream> {
        let s = match transport {
            Transport::Unix { socket } => Stream::Unix(UnixStream::connect(socket)?),
            Transport::Tcp { host, port } => {
                let mut last = io::Error::new(io::ErrorKind::NotFound, "host has no address");
                let mut found = None;
                for addr in (host.as_str(), *port).to_socket_addrs()? {
                    match TcpStream::connect_timeout(&addr, timeout) {
                        Ok(s) => {
                            found = Some(s);
                            break;
                        }
                        Err(e) => last = e,
                    }
                }
                let s = found.ok_or(last)?;
                // Header and payload go out as separate writes: no Nagle delay between them.
                s.set_nodelay(true)?;
                Stream::Tcp(s)
            }
        };
        match &s {
            Stream::Unix(u) => {
                u.set_read_timeout(Some(timeout))?;
                u.set_write_timeout(Some(timeout))?;
            }
            Stream::Tcp(t) => {
                t.set_read_timeout(Some(timeout))?;
                t.set_write_timeout(Some(timeout))?;
            }
        }
        Ok(s)
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Unix(s) => s.read(buf),
            Stream::Tcp(s) => s.read(buf),
        }
    }
}

impl Stream {
    fn read_vectored(&mut self, bufs: &mut [IoSliceMut<'_>]) -> io::Result<usize> {
        match self {
            Stream::Unix(s) => s.read_vectored(bufs),
            Stream::Tcp(s) => s.read_vectored(bufs),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Unix(s) => s.write(buf),
            Stream::Tcp(s) => s.write(buf),
        }
    }
    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        match self {
            Stream::Unix(s) => s.write_vectored(bufs),
            Stream::Tcp(s) => s.write_vectored(bufs),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

fn protocol_error(what: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what.into())
}

/// What a request carries besides its header.
pub enum Payload<'a> {
    None,
    /// WRITE: these bytes follow the header.
    Write(&'a [u8]),
    /// READ: the reply's data goes here.
    Read(&'a mut [u8]),
}

/// A connection in transmission phase.
pub struct Conn {
    stream: Stream,
    next_handle: u64,
}

impl Conn {
    /// Connect and negotiate `uri`'s export; every socket operation bounded by `timeout`.
    pub fn open(uri: &NbdUri, timeout: Duration) -> io::Result<(Conn, ExportInfo)> {
        let mut stream = Stream::connect(&uri.transport, timeout)?;
        let info = handshake(&mut stream, &uri.export)?;
        Ok((
            Conn {
                stream,
                next_handle: 1,
            },
            info,
        ))
    }

    /// Send one request and wait for its reply.
    pub fn request(
        &mut self,
        command: u16,
        flags: u16,
        offset: u64,
        length: u32,
        payload: Payload<'_>,
    ) -> Result<(), Failure> {
        let handle = self.next_handle;
        self.next_handle += 1;
        let header = codec::encode_request(&Request {
            flags,
            command,
            handle,
            offset,
            length,
        });
        match &payload {
            Payload::Write(data) => {
                assert_eq!(
                    data.len(),
                    length as usize,
                    "write payload is the request length"
                );
                write_both(&mut self.stream, &header, data)?;
            }
            _ => self.stream.write_all(&header)?,
        }
        let mut reply = [0u8; SIMPLE_REPLY_LEN];
        let (buf, early) = match payload {
            Payload::Read(buf) => {
                assert_eq!(
                    buf.len(),
                    length as usize,
                    "read buffer is the request length"
                );
                let early = read_reply_and_data(&mut self.stream, &mut reply, buf)?;
                (Some(buf), early)
            }
            _ => {
                self.stream.read_exact(&mut reply)?;
                (None, 0)
            }
        };
        let reply =
            codec::parse_simple_reply(&reply).map_err(|e| protocol_error(format!("reply: {e}")))?;
        if reply.handle != handle {
            return Err(protocol_error(format!(
                "reply for handle {} while {handle} is the only one in flight",
                reply.handle
            ))
            .into());
        }
        if reply.error != 0 {
            if early > 0 {
                return Err(protocol_error("data after an error reply").into());
            }
            return Err(Failure::Server(reply.error));
        }
        if let Some(buf) = buf {
            self.stream.read_exact(&mut buf[early..])?;
        }
        Ok(())
    }

    /// Say goodbye (`NBD_CMD_DISC`), best effort: the server then closes its side cleanly.
    pub fn disconnect(mut self) {
        let header = codec::encode_request(&Request {
            flags: 0,
            command: CMD_DISC,
            handle: 0,
            offset: 0,
            length: 0,
        });
        let _ = self.stream.write_all(&header);
    }
}

/// Header and payload in as few system calls as the socket takes (one, usually).
fn write_both(s: &mut Stream, header: &[u8], data: &[u8]) -> io::Result<()> {
    let mut sent = 0usize;
    while sent < header.len() {
        let iov = [IoSlice::new(&header[sent..]), IoSlice::new(data)];
        match s.write_vectored(&iov) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => sent += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    s.write_all(&data[sent - header.len()..])
}

/// The reply header, and in the same system calls whatever of the read's data already
/// arrived (nothing follows a reply on a connection with one request in flight, so this never
/// takes bytes that are not this reply's). Returns the data bytes received.
fn read_reply_and_data(s: &mut Stream, reply: &mut [u8], data: &mut [u8]) -> io::Result<usize> {
    let mut got = 0usize;
    while got < reply.len() {
        let mut iov = [IoSliceMut::new(&mut reply[got..]), IoSliceMut::new(data)];
        match s.read_vectored(&mut iov) {
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(got - reply.len())
}

fn read_u16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

fn read_u32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// Greeting, client flags, `NBD_OPT_GO` asking for block sizes; replies until `NBD_REP_ACK`.
fn handshake(s: &mut Stream, export: &str) -> io::Result<ExportInfo> {
    let mut greeting = [0u8; 18];
    s.read_exact(&mut greeting)?;
    if greeting[..8] != NBDMAGIC.to_be_bytes() || greeting[8..16] != IHAVEOPT.to_be_bytes() {
        return Err(protocol_error(
            "not a fixed-newstyle NBD server (bad greeting)",
        ));
    }
    let server_flags = read_u16(&greeting, 16);
    if server_flags & FLAG_FIXED_NEWSTYLE == 0 {
        return Err(protocol_error("server does not speak fixed newstyle"));
    }
    let mut client_flags = FLAG_C_FIXED_NEWSTYLE;
    if server_flags & FLAG_NO_ZEROES != 0 {
        client_flags |= FLAG_C_NO_ZEROES;
    }
    s.write_all(&client_flags.to_be_bytes())?;
    let go = codec::encode_info_request(export, &[INFO_BLOCK_SIZE]);
    s.write_all(&codec::encode_option(OPT_GO, &go))?;
    let mut info = None;
    let mut sizes = (1u32, 32 << 20);
    for _ in 0..MAX_OPTION_REPLIES {
        let mut h = [0u8; 20];
        s.read_exact(&mut h)?;
        let h = codec::parse_option_reply_header(&h)
            .map_err(|e| protocol_error(format!("option reply: {e}")))?;
        if h.option != OPT_GO || h.length > MAX_OPTION_REPLY_BYTES {
            return Err(protocol_error("unexpected option reply to NBD_OPT_GO"));
        }
        let mut data = vec![0u8; h.length as usize];
        s.read_exact(&mut data)?;
        match h.reply_type {
            REP_ACK => {
                let (size_bytes, flags) = info.ok_or_else(|| {
                    protocol_error("NBD_OPT_GO acknowledged without NBD_INFO_EXPORT")
                })?;
                return Ok(ExportInfo {
                    size_bytes,
                    flags,
                    min_block: sizes.0,
                    max_block: sizes.1,
                });
            }
            REP_INFO if data.len() >= 2 => match read_u16(&data, 0) {
                INFO_EXPORT if data.len() == 12 => {
                    let size = u64::from_be_bytes(data[2..10].try_into().expect("8 bytes"));
                    info = Some((size, read_u16(&data, 10)));
                }
                INFO_BLOCK_SIZE if data.len() == 14 => {
                    sizes = (read_u32(&data, 2), read_u32(&data, 10));
                }
                _ => {}
            },
            t if t & (1 << 31) != 0 => {
                let msg = String::from_utf8_lossy(&data);
                return Err(io::Error::other(format!(
                    "export '{export}' refused (NBD reply {t:#x}): {msg}"
                )));
            }
            _ => {}
        }
    }
    Err(protocol_error("too many option replies"))
}
