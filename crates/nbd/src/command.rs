//! Pure validation of a request header against the negotiated export
//! parameters, producing a typed [`Command`] or the errno to reply with.

use crate::codec::Request;
use crate::proto::*;

/// What the connection negotiated about its export (input of validation).
#[derive(Debug, Clone, Copy)]
pub struct ExportParams {
    pub size: u64,
    /// Transmission flags sent to the client.
    pub flags: u16,
    pub structured: bool,
    pub base_allocation: bool,
    /// Alignment to enforce (only when the client asked for block sizes).
    pub align: Option<u32>,
    /// Largest READ/WRITE payload.
    pub max_payload: u32,
    pub fast_zero: bool,
}

/// A validated command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    Read {
        offset: u64,
        len: u32,
        df: bool,
    },
    Write {
        offset: u64,
        len: u32,
        fua: bool,
    },
    Flush,
    Trim {
        offset: u64,
        len: u32,
        fua: bool,
    },
    WriteZeroes {
        offset: u64,
        len: u32,
        fua: bool,
        may_trim: bool,
    },
    Cache {
        offset: u64,
        len: u32,
    },
    BlockStatus {
        offset: u64,
        len: u32,
        req_one: bool,
    },
    Disconnect,
}

/// A rejected request: the errno and a short message for structured errors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rejection {
    pub errno: u32,
    pub msg: &'static str,
}

fn reject(errno: u32, msg: &'static str) -> Rejection {
    Rejection { errno, msg }
}

/// Flags a client may set on `command` given the negotiation.
pub fn allowed_flags(command: u16, p: &ExportParams) -> u16 {
    let mut f = 0;
    if p.flags & FLAG_SEND_FUA != 0 {
        f |= CMD_FLAG_FUA;
    }
    match command {
        CMD_READ if p.flags & FLAG_SEND_DF != 0 => f | CMD_FLAG_DF,
        CMD_WRITE_ZEROES => f | CMD_FLAG_NO_HOLE | CMD_FLAG_FAST_ZERO,
        CMD_BLOCK_STATUS => f | CMD_FLAG_REQ_ONE,
        _ => f,
    }
}

/// Validates `r`. The caller has already read the payload of a WRITE.
pub fn validate(r: &Request, p: &ExportParams) -> Result<Command, Rejection> {
    let known = matches!(
        r.command,
        CMD_READ
            | CMD_WRITE
            | CMD_DISC
            | CMD_FLUSH
            | CMD_TRIM
            | CMD_CACHE
            | CMD_WRITE_ZEROES
            | CMD_BLOCK_STATUS
    );
    if !known {
        return Err(reject(EINVAL, "unknown command"));
    }
    if r.command == CMD_DISC {
        return Ok(Command::Disconnect);
    }
    if r.flags & !allowed_flags(r.command, p) != 0 {
        return Err(reject(EINVAL, "command flag not allowed"));
    }
    if r.command == CMD_FLUSH {
        if r.offset != 0 || r.length != 0 {
            return Err(reject(EINVAL, "flush offset/length must be zero"));
        }
        return Ok(Command::Flush);
    }
    if r.command == CMD_BLOCK_STATUS && !p.base_allocation {
        return Err(reject(EINVAL, "no metadata context negotiated"));
    }
    let writes = matches!(r.command, CMD_WRITE | CMD_TRIM | CMD_WRITE_ZEROES);
    if writes && p.flags & FLAG_READ_ONLY != 0 {
        return Err(reject(EPERM, "export is read-only"));
    }
    check_range(r, p)?;
    Ok(build(r))
}

fn check_range(r: &Request, p: &ExportParams) -> Result<(), Rejection> {
    if matches!(r.command, CMD_READ | CMD_WRITE) && r.length > p.max_payload {
        // EOVERFLOW, as the spec asks: the client may retry in smaller pieces.
        return Err(reject(EOVERFLOW, "request longer than maximum block size"));
    }
    let end = r.offset.checked_add(u64::from(r.length));
    if end.is_none_or(|e| e > p.size) {
        return Err(match r.command {
            CMD_WRITE | CMD_WRITE_ZEROES => reject(ENOSPC, "request beyond end of export"),
            _ => reject(EINVAL, "request beyond end of export"),
        });
    }
    if let Some(a) = p.align.filter(|&a| a > 1 && r.command != CMD_BLOCK_STATUS) {
        if !r.offset.is_multiple_of(u64::from(a)) || !r.length.is_multiple_of(a) {
            return Err(reject(EINVAL, "request not aligned to minimum block size"));
        }
    }
    if r.command == CMD_BLOCK_STATUS && r.length == 0 {
        return Err(reject(EINVAL, "block status needs a non-zero length"));
    }
    if r.command == CMD_WRITE_ZEROES && r.flags & CMD_FLAG_FAST_ZERO != 0 && !p.fast_zero {
        return Err(reject(ENOTSUP, "fast zero not supported"));
    }
    Ok(())
}

fn build(r: &Request) -> Command {
    let (offset, len) = (r.offset, r.length);
    let fua = r.flags & CMD_FLAG_FUA != 0;
    match r.command {
        CMD_READ => Command::Read {
            offset,
            len,
            df: r.flags & CMD_FLAG_DF != 0,
        },
        CMD_WRITE => Command::Write { offset, len, fua },
        CMD_TRIM => Command::Trim { offset, len, fua },
        CMD_WRITE_ZEROES => Command::WriteZeroes {
            offset,
            len,
            fua,
            may_trim: r.flags & CMD_FLAG_NO_HOLE == 0,
        },
        CMD_CACHE => Command::Cache { offset, len },
        _ => Command::BlockStatus {
            offset,
            len,
            req_one: r.flags & CMD_FLAG_REQ_ONE != 0,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params() -> ExportParams {
        ExportParams {
            size: 1 << 20,
            flags: FLAG_HAS_FLAGS | FLAG_SEND_FUA | FLAG_SEND_DF,
            structured: true,
            base_allocation: false,
            align: Some(512),
            max_payload: 65536,
            fast_zero: false,
        }
    }

    fn req(command: u16, flags: u16, offset: u64, length: u32) -> Request {
        Request {
            flags,
            command,
            handle: 1,
            offset,
            length,
        }
    }

    #[test]
    fn validation_errors() {
        let p = params();
        let e = |r| validate(&r, &p).unwrap_err().errno;
        assert_eq!(e(req(99, 0, 0, 0)), EINVAL);
        assert_eq!(e(req(CMD_WRITE, CMD_FLAG_DF, 0, 512)), EINVAL);
        assert_eq!(e(req(CMD_READ, 0, 1 << 20, 512)), EINVAL);
        assert_eq!(e(req(CMD_WRITE, 0, 1 << 20, 512)), ENOSPC);
        assert_eq!(e(req(CMD_READ, 0, u64::MAX, 512)), EINVAL);
        assert_eq!(e(req(CMD_READ, 0, 0, 131072)), EOVERFLOW);
        assert_eq!(e(req(CMD_READ, 0, 1, 512)), EINVAL);
        assert_eq!(e(req(CMD_FLUSH, 0, 1, 0)), EINVAL);
        assert_eq!(e(req(CMD_BLOCK_STATUS, 0, 0, 512)), EINVAL);
        assert_eq!(
            e(req(CMD_WRITE_ZEROES, CMD_FLAG_FAST_ZERO, 0, 512)),
            ENOTSUP
        );
        let ro = ExportParams {
            flags: p.flags | FLAG_READ_ONLY,
            ..p
        };
        assert_eq!(
            validate(&req(CMD_TRIM, 0, 0, 512), &ro).unwrap_err().errno,
            EPERM
        );
    }

    #[test]
    fn validation_ok() {
        let p = params();
        assert_eq!(
            validate(&req(CMD_READ, CMD_FLAG_DF | CMD_FLAG_FUA, 512, 1024), &p),
            Ok(Command::Read {
                offset: 512,
                len: 1024,
                df: true
            })
        );
        assert_eq!(
            validate(&req(CMD_DISC, 0, 0, 0), &p),
            Ok(Command::Disconnect)
        );
        assert_eq!(validate(&req(CMD_READ, 0, 0, 0), &p).map(|_| ()), Ok(()));
        assert_eq!(
            validate(&req(CMD_WRITE_ZEROES, CMD_FLAG_NO_HOLE, 0, 1 << 20), &p),
            Ok(Command::WriteZeroes {
                offset: 0,
                len: 1 << 20,
                fua: false,
                may_trim: false
            })
        );
    }
}
