//! Pure wire codec: parsing and encoding of handshake options, option replies,
//! transmission requests and (simple or structured) replies.
//!
//! Everything here is synchronous, allocation-light and free of I/O. All
//! integers are big-endian (network byte order) and written explicitly.
//! Parsers take arbitrary bytes and return a typed [`CodecError`]; they never
//! panic (checked by a proptest and by the fuzz targets).

use crate::proto::*;

/// Why some bytes could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CodecError {
    /// A magic number did not match.
    #[error("bad magic number {0:#x}")]
    BadMagic(u64),
    /// Fewer bytes than the structure needs.
    #[error("truncated input: need {need} bytes, have {have}")]
    Truncated { need: usize, have: usize },
    /// Bytes left over after a complete structure.
    #[error("{0} unexpected trailing bytes")]
    Trailing(usize),
    /// A string was not UTF-8, contained NUL, or was longer than 4096 bytes.
    #[error("invalid string")]
    BadString,
    /// Client handshake flags this server did not offer.
    #[error("unknown client flags {0:#x}")]
    UnknownClientFlags(u32),
}

/// Little cursor over a byte slice; every read is bounds-checked.
struct Cur<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Cur<'a> {
    fn new(buf: &'a [u8]) -> Self {
        Cur { buf, pos: 0 }
    }
    fn take(&mut self, n: usize) -> Result<&'a [u8], CodecError> {
        let rest = &self.buf[self.pos..];
        if rest.len() < n {
            return Err(CodecError::Truncated {
                need: self.pos.saturating_add(n),
                have: self.buf.len(),
            });
        }
        self.pos += n;
        Ok(&rest[..n])
    }
    fn u16(&mut self) -> Result<u16, CodecError> {
        let b = self.take(2)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }
    fn u32(&mut self) -> Result<u32, CodecError> {
        let b = self.take(4)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }
    fn u64(&mut self) -> Result<u64, CodecError> {
        let b = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_be_bytes(a))
    }
    /// A string prefixed by a 32-bit length.
    fn string32(&mut self) -> Result<String, CodecError> {
        let len = self.u32()? as usize;
        if len > MAX_STRING_LEN {
            return Err(CodecError::BadString);
        }
        parse_string(self.take(len)?)
    }
    fn finish(&self) -> Result<(), CodecError> {
        match self.buf.len() - self.pos {
            0 => Ok(()),
            n => Err(CodecError::Trailing(n)),
        }
    }
}

/// Validates a protocol string: UTF-8, no NUL, at most 4096 bytes.
pub fn parse_string(b: &[u8]) -> Result<String, CodecError> {
    if b.len() > MAX_STRING_LEN || b.contains(&0) {
        return Err(CodecError::BadString);
    }
    std::str::from_utf8(b)
        .map(str::to_owned)
        .map_err(|_| CodecError::BadString)
}

// ---------------------------------------------------------------- handshake

/// The 18-byte server greeting: `NBDMAGIC`, `IHAVEOPT`, handshake flags.
pub fn server_greeting() -> [u8; 18] {
    let mut out = [0u8; 18];
    out[0..8].copy_from_slice(&NBDMAGIC.to_be_bytes());
    out[8..16].copy_from_slice(&IHAVEOPT.to_be_bytes());
    out[16..18].copy_from_slice(&(FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES).to_be_bytes());
    out
}

/// Client flags after validation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientFlags {
    pub fixed_newstyle: bool,
    pub no_zeroes: bool,
}

/// Parses the 32-bit client flags; any bit we did not offer is an error
/// (the spec requires the server to drop the connection).
pub fn parse_client_flags(buf: &[u8]) -> Result<ClientFlags, CodecError> {
    let mut c = Cur::new(buf);
    let flags = c.u32()?;
    c.finish()?;
    if flags & !(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES) != 0 {
        return Err(CodecError::UnknownClientFlags(flags));
    }
    Ok(ClientFlags {
        fixed_newstyle: flags & FLAG_C_FIXED_NEWSTYLE != 0,
        no_zeroes: flags & FLAG_C_NO_ZEROES != 0,
    })
}

/// Header of one client option.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OptionHeader {
    pub option: u32,
    pub length: u32,
}

/// Parses the 16-byte option header (`IHAVEOPT`, option, length).
pub fn parse_option_header(buf: &[u8]) -> Result<OptionHeader, CodecError> {
    let mut c = Cur::new(buf);
    let magic = c.u64()?;
    if magic != IHAVEOPT {
        return Err(CodecError::BadMagic(magic));
    }
    let option = c.u32()?;
    let length = c.u32()?;
    c.finish()?;
    Ok(OptionHeader { option, length })
}

/// Body of `NBD_OPT_INFO` / `NBD_OPT_GO`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InfoRequest {
    pub name: String,
    pub requests: Vec<u16>,
}

/// Body of `NBD_OPT_LIST_META_CONTEXT` / `NBD_OPT_SET_META_CONTEXT`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetaContextRequest {
    pub export: String,
    pub queries: Vec<String>,
}

/// A decoded client option.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClientOption {
    ExportName(String),
    Abort,
    List,
    StartTls,
    Info(InfoRequest),
    Go(InfoRequest),
    StructuredReply,
    ListMetaContext(MetaContextRequest),
    SetMetaContext(MetaContextRequest),
    /// Any option this server does not implement (answered `NBD_REP_ERR_UNSUP`).
    Unknown(u32),
}

/// Decodes the data of option `option`. Errors mean "syntactically invalid"
/// (`NBD_REP_ERR_INVALID`).
pub fn parse_option(option: u32, data: &[u8]) -> Result<ClientOption, CodecError> {
    let empty = |o: ClientOption| match data.len() {
        0 => Ok(o),
        n => Err(CodecError::Trailing(n)),
    };
    match option {
        OPT_EXPORT_NAME => parse_string(data).map(ClientOption::ExportName),
        OPT_ABORT => empty(ClientOption::Abort),
        OPT_LIST => empty(ClientOption::List),
        OPT_STARTTLS => empty(ClientOption::StartTls),
        OPT_STRUCTURED_REPLY => empty(ClientOption::StructuredReply),
        OPT_INFO => parse_info(data).map(ClientOption::Info),
        OPT_GO => parse_info(data).map(ClientOption::Go),
        OPT_LIST_META_CONTEXT => parse_meta(data).map(ClientOption::ListMetaContext),
        OPT_SET_META_CONTEXT => parse_meta(data).map(ClientOption::SetMetaContext),
        other => Ok(ClientOption::Unknown(other)),
    }
}

fn parse_info(data: &[u8]) -> Result<InfoRequest, CodecError> {
    let mut c = Cur::new(data);
    let name = c.string32()?;
    let n = c.u16()?;
    let mut requests = Vec::with_capacity(usize::from(n).min(data.len() / 2));
    for _ in 0..n {
        requests.push(c.u16()?);
    }
    c.finish()?;
    Ok(InfoRequest { name, requests })
}

fn parse_meta(data: &[u8]) -> Result<MetaContextRequest, CodecError> {
    let mut c = Cur::new(data);
    let export = c.string32()?;
    let n = c.u32()?;
    let mut queries = Vec::new();
    for _ in 0..n {
        queries.push(c.string32()?);
    }
    c.finish()?;
    Ok(MetaContextRequest { export, queries })
}

/// Encodes one option as a client sends it (used by tests and fuzzers).
pub fn encode_option(option: u32, data: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(OPTION_HEADER_LEN + data.len());
    out.extend_from_slice(&IHAVEOPT.to_be_bytes());
    out.extend_from_slice(&option.to_be_bytes());
    out.extend_from_slice(&(data.len() as u32).to_be_bytes());
    out.extend_from_slice(data);
    out
}

/// Encodes the data of an `NBD_OPT_INFO`/`NBD_OPT_GO` option.
pub fn encode_info_request(name: &str, requests: &[u16]) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(&(name.len() as u32).to_be_bytes());
    out.extend_from_slice(name.as_bytes());
    out.extend_from_slice(&(requests.len() as u16).to_be_bytes());
    for r in requests {
        out.extend_from_slice(&r.to_be_bytes());
    }
    out
}

/// Encodes the data of a `LIST_META_CONTEXT`/`SET_META_CONTEXT` option.
pub fn encode_meta_request(export: &str, queries: &[&str]) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(&(export.len() as u32).to_be_bytes());
    out.extend_from_slice(export.as_bytes());
    out.extend_from_slice(&(queries.len() as u32).to_be_bytes());
    for q in queries {
        out.extend_from_slice(&(q.len() as u32).to_be_bytes());
        out.extend_from_slice(q.as_bytes());
    }
    out
}

/// One option reply: magic, option, reply type, length, data.
pub fn encode_option_reply(option: u32, reply_type: u32, data: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(20 + data.len());
    out.extend_from_slice(&OPTION_REPLY_MAGIC.to_be_bytes());
    out.extend_from_slice(&option.to_be_bytes());
    out.extend_from_slice(&reply_type.to_be_bytes());
    out.extend_from_slice(&(data.len() as u32).to_be_bytes());
    out.extend_from_slice(data);
    out
}

/// Header of an option reply, as a client decodes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OptionReplyHeader {
    pub option: u32,
    pub reply_type: u32,
    pub length: u32,
}

/// Parses a 20-byte option reply header.
pub fn parse_option_reply_header(buf: &[u8]) -> Result<OptionReplyHeader, CodecError> {
    let mut c = Cur::new(buf);
    let magic = c.u64()?;
    if magic != OPTION_REPLY_MAGIC {
        return Err(CodecError::BadMagic(magic));
    }
    let h = OptionReplyHeader {
        option: c.u32()?,
        reply_type: c.u32()?,
        length: c.u32()?,
    };
    c.finish()?;
    Ok(h)
}

/// Data of `NBD_REP_SERVER`: name length, name, then the description.
pub fn rep_server_data(name: &str, description: &str) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(&(name.len() as u32).to_be_bytes());
    out.extend_from_slice(name.as_bytes());
    out.extend_from_slice(description.as_bytes());
    out
}

/// Data of `NBD_REP_INFO` / `NBD_INFO_EXPORT`.
pub fn info_export(size: u64, transmission_flags: u16) -> Vec<u8> {
    let mut out = Vec::with_capacity(12);
    out.extend_from_slice(&INFO_EXPORT.to_be_bytes());
    out.extend_from_slice(&size.to_be_bytes());
    out.extend_from_slice(&transmission_flags.to_be_bytes());
    out
}

/// Data of `NBD_REP_INFO` / `NBD_INFO_NAME` or `NBD_INFO_DESCRIPTION`.
pub fn info_string(info_type: u16, s: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(2 + s.len());
    out.extend_from_slice(&info_type.to_be_bytes());
    out.extend_from_slice(s.as_bytes());
    out
}

/// Data of `NBD_REP_INFO` / `NBD_INFO_BLOCK_SIZE`.
pub fn info_block_size(min: u32, preferred: u32, max: u32) -> Vec<u8> {
    let mut out = Vec::with_capacity(14);
    out.extend_from_slice(&INFO_BLOCK_SIZE.to_be_bytes());
    for v in [min, preferred, max] {
        out.extend_from_slice(&v.to_be_bytes());
    }
    out
}

/// Data of `NBD_REP_META_CONTEXT`.
pub fn meta_context_data(id: u32, name: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(4 + name.len());
    out.extend_from_slice(&id.to_be_bytes());
    out.extend_from_slice(name.as_bytes());
    out
}

/// Reply to `NBD_OPT_EXPORT_NAME`: size, transmission flags, maybe 124 zeroes.
pub fn export_name_reply(size: u64, transmission_flags: u16, no_zeroes: bool) -> Vec<u8> {
    let mut out = Vec::with_capacity(10 + 124);
    out.extend_from_slice(&size.to_be_bytes());
    out.extend_from_slice(&transmission_flags.to_be_bytes());
    if !no_zeroes {
        out.resize(out.len() + 124, 0);
    }
    out
}

// ------------------------------------------------------------- transmission

/// A transmission request header (the payload of a WRITE follows it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    pub flags: u16,
    pub command: u16,
    pub handle: u64,
    pub offset: u64,
    pub length: u32,
}

/// Parses a 28-byte request header; only the magic is checked here.
pub fn parse_request(buf: &[u8]) -> Result<Request, CodecError> {
    let mut c = Cur::new(buf);
    let magic = c.u32()?;
    if magic != REQUEST_MAGIC {
        return Err(CodecError::BadMagic(u64::from(magic)));
    }
    let r = Request {
        flags: c.u16()?,
        command: c.u16()?,
        handle: c.u64()?,
        offset: c.u64()?,
        length: c.u32()?,
    };
    c.finish()?;
    Ok(r)
}

/// Encodes a request header (client side; tests and fuzzers).
pub fn encode_request(r: &Request) -> [u8; REQUEST_LEN] {
    let mut out = [0u8; REQUEST_LEN];
    out[0..4].copy_from_slice(&REQUEST_MAGIC.to_be_bytes());
    out[4..6].copy_from_slice(&r.flags.to_be_bytes());
    out[6..8].copy_from_slice(&r.command.to_be_bytes());
    out[8..16].copy_from_slice(&r.handle.to_be_bytes());
    out[16..24].copy_from_slice(&r.offset.to_be_bytes());
    out[24..28].copy_from_slice(&r.length.to_be_bytes());
    out
}

/// A simple reply header (the READ payload, if any, follows it).
pub fn simple_reply(error: u32, handle: u64) -> [u8; SIMPLE_REPLY_LEN] {
    let mut out = [0u8; SIMPLE_REPLY_LEN];
    out[0..4].copy_from_slice(&SIMPLE_REPLY_MAGIC.to_be_bytes());
    out[4..8].copy_from_slice(&error.to_be_bytes());
    out[8..16].copy_from_slice(&handle.to_be_bytes());
    out
}

/// Decoded simple reply header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SimpleReply {
    pub error: u32,
    pub handle: u64,
}

/// Parses a 16-byte simple reply header.
pub fn parse_simple_reply(buf: &[u8]) -> Result<SimpleReply, CodecError> {
    let mut c = Cur::new(buf);
    let magic = c.u32()?;
    if magic != SIMPLE_REPLY_MAGIC {
        return Err(CodecError::BadMagic(u64::from(magic)));
    }
    let r = SimpleReply {
        error: c.u32()?,
        handle: c.u64()?,
    };
    c.finish()?;
    Ok(r)
}

/// Decoded structured reply chunk header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkHeader {
    pub flags: u16,
    pub chunk_type: u16,
    pub handle: u64,
    pub length: u32,
}

/// Encodes a structured reply chunk header.
pub fn chunk_header(h: &ChunkHeader) -> [u8; STRUCTURED_HEADER_LEN] {
    let mut out = [0u8; STRUCTURED_HEADER_LEN];
    out[0..4].copy_from_slice(&STRUCTURED_REPLY_MAGIC.to_be_bytes());
    out[4..6].copy_from_slice(&h.flags.to_be_bytes());
    out[6..8].copy_from_slice(&h.chunk_type.to_be_bytes());
    out[8..16].copy_from_slice(&h.handle.to_be_bytes());
    out[16..20].copy_from_slice(&h.length.to_be_bytes());
    out
}

/// Parses a 20-byte structured reply chunk header.
pub fn parse_chunk_header(buf: &[u8]) -> Result<ChunkHeader, CodecError> {
    let mut c = Cur::new(buf);
    let magic = c.u32()?;
    if magic != STRUCTURED_REPLY_MAGIC {
        return Err(CodecError::BadMagic(u64::from(magic)));
    }
    let h = ChunkHeader {
        flags: c.u16()?,
        chunk_type: c.u16()?,
        handle: c.u64()?,
        length: c.u32()?,
    };
    c.finish()?;
    Ok(h)
}

/// `NBD_REPLY_TYPE_NONE` with `DONE`.
pub fn chunk_none(handle: u64) -> [u8; STRUCTURED_HEADER_LEN] {
    chunk_header(&ChunkHeader {
        flags: REPLY_FLAG_DONE,
        chunk_type: REPLY_TYPE_NONE,
        handle,
        length: 0,
    })
}

/// Header plus offset of an `OFFSET_DATA` chunk carrying `data_len` bytes.
/// `None` if the chunk would not fit the 32-bit length field.
pub fn chunk_offset_data_prefix(
    handle: u64,
    flags: u16,
    offset: u64,
    data_len: usize,
) -> Option<[u8; STRUCTURED_HEADER_LEN + 8]> {
    let length = u32::try_from(data_len.checked_add(8)?).ok()?;
    let mut out = [0u8; STRUCTURED_HEADER_LEN + 8];
    out[..STRUCTURED_HEADER_LEN].copy_from_slice(&chunk_header(&ChunkHeader {
        flags,
        chunk_type: REPLY_TYPE_OFFSET_DATA,
        handle,
        length,
    }));
    out[STRUCTURED_HEADER_LEN..].copy_from_slice(&offset.to_be_bytes());
    Some(out)
}

fn error_chunk(handle: u64, flags: u16, error: u32, msg: &str, offset: Option<u64>) -> Vec<u8> {
    // Keep messages short and on a char boundary.
    let mut end = msg.len().min(256);
    while !msg.is_char_boundary(end) {
        end -= 1;
    }
    let msg = &msg.as_bytes()[..end];
    let (ty, extra) = match offset {
        Some(_) => (REPLY_TYPE_ERROR_OFFSET, 8),
        None => (REPLY_TYPE_ERROR, 0),
    };
    let length = (6 + msg.len() + extra) as u32;
    let mut out = Vec::with_capacity(STRUCTURED_HEADER_LEN + length as usize);
    out.extend_from_slice(&chunk_header(&ChunkHeader {
        flags,
        chunk_type: ty,
        handle,
        length,
    }));
    out.extend_from_slice(&error.to_be_bytes());
    out.extend_from_slice(&(msg.len() as u16).to_be_bytes());
    out.extend_from_slice(msg);
    if let Some(off) = offset {
        out.extend_from_slice(&off.to_be_bytes());
    }
    out
}

/// An `NBD_REPLY_TYPE_ERROR` chunk (message truncated to 256 bytes).
pub fn chunk_error(handle: u64, flags: u16, error: u32, msg: &str) -> Vec<u8> {
    error_chunk(handle, flags, error, msg, None)
}

/// An `NBD_REPLY_TYPE_ERROR_OFFSET` chunk (message truncated to 256 bytes).
pub fn chunk_error_offset(handle: u64, flags: u16, error: u32, msg: &str, offset: u64) -> Vec<u8> {
    error_chunk(handle, flags, error, msg, Some(offset))
}

/// An `NBD_REPLY_TYPE_BLOCK_STATUS` chunk with `(length, status)` extents.
pub fn chunk_block_status(
    handle: u64,
    flags: u16,
    context: u32,
    extents: &[(u32, u32)],
) -> Vec<u8> {
    let length = (4 + 8 * extents.len()) as u32;
    let mut out = Vec::with_capacity(STRUCTURED_HEADER_LEN + length as usize);
    out.extend_from_slice(&chunk_header(&ChunkHeader {
        flags,
        chunk_type: REPLY_TYPE_BLOCK_STATUS,
        handle,
        length,
    }));
    out.extend_from_slice(&context.to_be_bytes());
    for (len, status) in extents {
        out.extend_from_slice(&len.to_be_bytes());
        out.extend_from_slice(&status.to_be_bytes());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_roundtrip() {
        let r = Request {
            flags: 3,
            command: CMD_WRITE,
            handle: 0x0102_0304_0506_0708,
            offset: 1 << 40,
            length: 4096,
        };
        assert_eq!(parse_request(&encode_request(&r)), Ok(r));
    }

    #[test]
    fn bad_request_magic() {
        let mut b = encode_request(&Request {
            flags: 0,
            command: 0,
            handle: 0,
            offset: 0,
            length: 0,
        });
        assert!(matches!(
            parse_request(&b[..5]),
            Err(CodecError::Truncated { .. })
        ));
        b[0] ^= 1;
        assert!(matches!(parse_request(&b), Err(CodecError::BadMagic(_))));
    }

    #[test]
    fn go_option_roundtrip() {
        let data = encode_info_request("disk", &[INFO_NAME, INFO_BLOCK_SIZE]);
        let o = parse_option(OPT_GO, &data).unwrap();
        assert_eq!(
            o,
            ClientOption::Go(InfoRequest {
                name: "disk".into(),
                requests: vec![INFO_NAME, INFO_BLOCK_SIZE]
            })
        );
        // One byte short / long is invalid.
        assert!(parse_option(OPT_GO, &data[..data.len() - 1]).is_err());
        let mut long = data.clone();
        long.push(0);
        assert!(parse_option(OPT_GO, &long).is_err());
    }

    #[test]
    fn meta_roundtrip_and_flags() {
        let data = encode_meta_request("", &[META_BASE_ALLOCATION]);
        let o = parse_option(OPT_SET_META_CONTEXT, &data).unwrap();
        assert_eq!(
            o,
            ClientOption::SetMetaContext(MetaContextRequest {
                export: String::new(),
                queries: vec![META_BASE_ALLOCATION.into()]
            })
        );
        assert!(parse_client_flags(&3u32.to_be_bytes()).is_ok());
        assert!(parse_client_flags(&4u32.to_be_bytes()).is_err());
        assert!(parse_option(OPT_LIST, &[1]).is_err());
        assert!(parse_option(OPT_EXPORT_NAME, b"a\0b").is_err());
    }

    #[test]
    fn error_chunk_layout() {
        let c = chunk_error_offset(7, REPLY_FLAG_DONE, EIO, "boom", 512);
        let h = parse_chunk_header(&c[..20]).unwrap();
        assert_eq!(h.chunk_type, REPLY_TYPE_ERROR_OFFSET);
        assert_eq!(h.length as usize, c.len() - 20);
        assert_eq!(&c[20..24], &EIO.to_be_bytes());
        assert_eq!(&c[c.len() - 8..], &512u64.to_be_bytes());
    }
}
