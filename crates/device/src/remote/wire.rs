//! Opening a connection to an NBD export: fixed-newstyle handshake with `NBD_OPT_GO`, then
//! transmission through a [`Pipeline`] (many requests in flight).
//!
//! Structured replies are asked for and used when the server agrees (a server that does not
//! know them answers in simple replies, and then a chunk is a protocol error); wire encoding is
//! the server crate's codec.

use super::pipeline::{stall_tick, Pipeline};
use super::tls::TlsSetup;
use super::transport::{split_plain, Sock};
use super::uri::NbdUri;
use nbd::codec;
use nbd::proto::*;
use std::io::{self, Read, Write};
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
    /// Structured replies were negotiated (`NBD_OPT_STRUCTURED_REPLY`).
    pub structured: bool,
}

impl ExportInfo {
    pub fn has(&self, flag: u16) -> bool {
        self.flags & flag != 0
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

/// A connection to `uri`'s export, negotiated (over TLS when `tls` is given) and in
/// transmission phase; every socket operation of the negotiation bounded by `timeout`.
pub fn open(
    uri: &NbdUri,
    timeout: Duration,
    tls: Option<&TlsSetup>,
) -> io::Result<(Pipeline, ExportInfo)> {
    let mut sock = Sock::connect(&uri.transport, timeout, timeout)?;
    greet(&mut sock)?;
    let (info, split) = match tls {
        None => {
            let structured = structured_replies(&mut sock)?;
            let info = go(&mut sock, &uri.export, structured)?;
            sock.set_timeouts(timeout, stall_tick(timeout))?;
            (info, split_plain(sock)?)
        }
        Some(tls) => {
            starttls(&mut sock)?;
            let mut stream = tls.handshake(sock)?;
            let structured = structured_replies(&mut stream)?;
            let info = go(&mut stream, &uri.export, structured)?;
            stream.sock().set_timeouts(timeout, stall_tick(timeout))?;
            (info, stream.split()?)
        }
    };
    Ok((Pipeline::start(split, timeout, info.structured), info))
}

fn read_u16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

fn read_u32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// The server's greeting, and our flags in answer.
fn greet(s: &mut (impl Read + Write)) -> io::Result<()> {
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
    s.write_all(&client_flags.to_be_bytes())
}

/// Send `option` without data and read its one reply: the reply type and its data.
fn one_reply_option(
    s: &mut (impl Read + Write),
    option: u32,
    name: &str,
) -> io::Result<(u32, Vec<u8>)> {
    s.write_all(&codec::encode_option(option, &[]))?;
    let mut h = [0u8; 20];
    s.read_exact(&mut h)?;
    let h = codec::parse_option_reply_header(&h)
        .map_err(|e| protocol_error(format!("option reply: {e}")))?;
    if h.option != option || h.length > MAX_OPTION_REPLY_BYTES {
        return Err(protocol_error(format!("unexpected option reply to {name}")));
    }
    let mut data = vec![0u8; h.length as usize];
    s.read_exact(&mut data)?;
    Ok((h.reply_type, data))
}

/// `NBD_OPT_STARTTLS`: the server must acknowledge it; anything else ends the connection (the
/// URI asked for TLS: never go on in plaintext).
fn starttls(s: &mut (impl Read + Write)) -> io::Result<()> {
    let (reply, data) = one_reply_option(s, OPT_STARTTLS, "NBD_OPT_STARTTLS")?;
    if reply == REP_ACK {
        return Ok(());
    }
    Err(io::Error::new(
        io::ErrorKind::ConnectionRefused,
        format!(
            "the server refused TLS (NBD reply {reply:#x}{}{}); not going on in plaintext",
            if data.is_empty() { "" } else { ": " },
            String::from_utf8_lossy(&data)
        ),
    ))
}

/// `NBD_OPT_STRUCTURED_REPLY`: whether the server will answer in chunks (a server that does
/// not know the option says so, and simple replies it is). Why ask: a read's error then says
/// where it failed, and a sparse export's holes come as a length instead of zeroes.
fn structured_replies(s: &mut (impl Read + Write)) -> io::Result<bool> {
    match one_reply_option(s, OPT_STRUCTURED_REPLY, "NBD_OPT_STRUCTURED_REPLY")?.0 {
        REP_ACK => Ok(true),
        t if t & (1 << 31) != 0 => Ok(false),
        t => Err(protocol_error(format!(
            "NBD_OPT_STRUCTURED_REPLY answered with reply type {t:#x}"
        ))),
    }
}

/// `NBD_OPT_GO` asking for block sizes; replies until `NBD_REP_ACK`.
fn go(s: &mut (impl Read + Write), export: &str, structured: bool) -> io::Result<ExportInfo> {
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
                    structured,
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
            REP_ERR_TLS_REQD => {
                return Err(io::Error::new(
                    io::ErrorKind::PermissionDenied,
                    format!("export '{export}' requires TLS (an nbds:// URI)"),
                ));
            }
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
