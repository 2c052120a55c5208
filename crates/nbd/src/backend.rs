//! The storage side: what an export is backed by, and how its errors are
//! translated into the handful of errno values NBD allows on the wire.

use std::io;
use std::os::fd::BorrowedFd;
use std::sync::Arc;

use crate::proto::{EINVAL, EIO, ENOSPC, ENOTSUP, EOVERFLOW, EPERM};

/// Block size constraints advertised with `NBD_INFO_BLOCK_SIZE`.
///
/// `min` and `preferred` must be powers of two, `min <= preferred <= max`,
/// and `max` a multiple of `min` (see [`BlockSizes::sanitized`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockSizes {
    pub min: u32,
    pub preferred: u32,
    pub max: u32,
}

/// Hard upper bound of any single READ/WRITE payload the server accepts.
pub const MAX_PAYLOAD: u32 = 64 * 1024 * 1024;

impl BlockSizes {
    /// Returns a self-consistent copy: `min` a power of two in 1..=64 KiB,
    /// `preferred` a power of two in `min..=32 MiB`, `max` a multiple of `min`
    /// in `preferred..=MAX_PAYLOAD`.
    pub fn sanitized(self) -> BlockSizes {
        let min = self.min.clamp(1, 65536).next_power_of_two();
        let preferred = self.preferred.clamp(min, MAX_PAYLOAD);
        let preferred = if preferred.is_power_of_two() {
            preferred
        } else {
            preferred.next_power_of_two() >> 1
        }
        .max(min);
        let max = self.max.clamp(preferred, MAX_PAYLOAD);
        let max = (max / min * min).max(preferred);
        BlockSizes {
            min,
            preferred,
            max,
        }
    }
}

impl Default for BlockSizes {
    fn default() -> Self {
        BlockSizes {
            min: 512,
            preferred: 4096,
            max: MAX_PAYLOAD,
        }
    }
}

/// What a backend made of a WRITE announced before its payload arrived
/// ([`Backend::write_coming`]); opaque to the server, which only hands it back or drops it.
pub struct WriteHint(pub Box<dyn std::any::Any + Send>);

/// One WRITE of a gathered run ([`Backend::write_gathered`]).
pub struct GatheredWrite<'a> {
    pub offset: u64,
    pub data: &'a [u8],
    pub fua: bool,
    /// What [`Backend::write_coming`] gave for it.
    pub hint: Option<WriteHint>,
}

/// A block device served over NBD.
///
/// All methods are blocking; the server calls them from its per-connection
/// threads, possibly concurrently from many requests and connections. Offsets and lengths
/// are always within `size_bytes()`; when the client negotiated block sizes
/// they are multiples of `block_sizes().min`, otherwise they may be any byte
/// range. `read`/`write` never see more than `block_sizes().max` bytes;
/// `cache` is split by the server into pieces of at most `max` bytes (aligned to
/// `min`); `trim` and `write_zeroes` carry no payload and come whole (up to the
/// protocol's 32-bit length), so a backend that frees space in large units sees
/// every unit the request covers.
pub trait Backend: Send + Sync + 'static {
    /// Export size in bytes.
    fn size_bytes(&self) -> u64;
    /// Whether the export refuses writes (advertised as `NBD_FLAG_READ_ONLY`;
    /// write-type commands then get `EPERM` without reaching the backend).
    fn read_only(&self) -> bool;
    /// Advertised via `NBD_INFO_BLOCK_SIZE` (sanitized first).
    fn block_sizes(&self) -> BlockSizes;
    /// Fills `buf` with the bytes at `offset`.
    fn read(&self, offset: u64, buf: &mut [u8]) -> io::Result<()>;
    /// Whether a successful [`Backend::read`] always writes every byte of its buffer. Then
    /// the server hands it a reused buffer as it is, holding an earlier request's bytes, and
    /// saves zeroing it (a memset of every byte read). False by default: the buffer is zeroed
    /// first, so that what a backend leaves unwritten never reaches a client.
    fn read_fills_buffer(&self) -> bool {
        false
    }
    /// Whether [`Backend::read_to_pipe`] may succeed (asked once per connection; false by
    /// default, and then it is never called).
    fn splices_reads(&self) -> bool {
        false
    }
    /// Moves the `len` bytes at `offset` into the pipe `pipe` without copying them through
    /// user space (`splice(2)` from files), for a READ the server then sends from the pipe.
    /// False: not for this range, and the pipe may hold part of it (the server throws that
    /// away) before it calls [`Backend::read`], which reports whatever failed here.
    fn read_to_pipe(&self, offset: u64, len: usize, pipe: BorrowedFd<'_>) -> bool {
        let _ = (offset, len, pipe);
        false
    }
    /// Writes `data` at `offset`; durable before returning if `fua`.
    fn write(&self, offset: u64, data: &[u8], fua: bool) -> io::Result<()>;
    /// A WRITE of `len` bytes at `offset` has been read up to its payload, which is still
    /// arriving (offset and length not validated yet). A backend that gathers writes, as a
    /// plugged queue or a RAID stripe cache does, may get ready for it: the hint comes back with
    /// the payload in [`Backend::write_hinted`], or is dropped if the request goes no further.
    /// The default gives none.
    fn write_coming(&self, offset: u64, len: u64) -> Option<WriteHint> {
        let _ = (offset, len);
        None
    }
    /// [`Backend::write`] of a request that [`Backend::write_coming`] gave `hint` for.
    fn write_hinted(&self, hint: WriteHint, offset: u64, data: &[u8], fua: bool) -> io::Result<()> {
        drop(hint);
        self.write(offset, data, fua)
    }
    /// Whether the server should hand runs of sequential WRITEs that arrived together to
    /// [`Backend::write_gathered`] at once (a backend that merges adjacent writes, as md's
    /// stripe cache under a plug does). Off by default: the server then runs every request on
    /// its own thread, in parallel.
    fn gathers_writes(&self) -> bool {
        false
    }
    /// Sequential WRITEs that arrived together, each ending where the next begins (each
    /// validated, non-empty, within `block_sizes().max`): one result per write, in order.
    /// The default runs them one after the other.
    fn write_gathered(&self, writes: Vec<GatheredWrite<'_>>) -> Vec<io::Result<()>> {
        writes
            .into_iter()
            .map(|w| match w.hint {
                Some(h) => self.write_hinted(h, w.offset, w.data, w.fua),
                None => self.write(w.offset, w.data, w.fua),
            })
            .collect()
    }
    /// Makes every write completed before this call durable, whatever
    /// connection it came from (the server advertises `CAN_MULTI_CONN`).
    fn flush(&self) -> io::Result<()>;
    /// Discard hint; contents of the range are unspecified afterwards.
    fn trim(&self, offset: u64, len: u64, fua: bool) -> io::Result<()>;
    /// Makes the range read as zeroes. `may_trim` is false when the client
    /// set `NO_HOLE`.
    fn write_zeroes(&self, offset: u64, len: u64, fua: bool, may_trim: bool) -> io::Result<()>;
    /// Prefetch hint.
    fn cache(&self, offset: u64, len: u64) -> io::Result<()> {
        let _ = (offset, len);
        Ok(())
    }
    /// `base:allocation` status of `offset..offset+len` as `(length, flags)` extents in order
    /// (flags: [`crate::proto::STATE_HOLE`], [`crate::proto::STATE_ZERO`]). They start at
    /// `offset` and cover at most `len` bytes (at least one); the server trims the list to one
    /// extent when the client asked for one. The default: all of it allocated data.
    fn block_status(&self, offset: u64, len: u32) -> io::Result<Vec<(u32, u32)>> {
        let _ = offset;
        Ok(vec![(len, 0)])
    }
    /// True if `write_zeroes` is substantially faster than writing zeroes.
    /// When false (the default), requests with `NBD_CMD_FLAG_FAST_ZERO` fail
    /// at once with `ENOTSUP`, as the protocol asks.
    fn fast_zero(&self) -> bool {
        false
    }
}

/// One named export.
pub struct Export {
    pub name: String,
    pub description: String,
    pub backend: Arc<dyn Backend>,
}

/// Maps an I/O error to one of the NBD error values. Unknown errors become
/// `EIO`; no other errno value is ever sent.
pub fn errno_for(e: &io::Error) -> u32 {
    if let Some(raw) = e.raw_os_error() {
        return match raw {
            libc::EPERM | libc::EACCES | libc::EROFS => EPERM,
            libc::ENOSPC | libc::EDQUOT | libc::EFBIG => ENOSPC,
            libc::EINVAL => EINVAL,
            libc::EOVERFLOW => EOVERFLOW,
            libc::ENOTSUP => ENOTSUP,
            _ => EIO,
        };
    }
    match e.kind() {
        io::ErrorKind::PermissionDenied | io::ErrorKind::ReadOnlyFilesystem => EPERM,
        io::ErrorKind::StorageFull | io::ErrorKind::FileTooLarge => ENOSPC,
        io::ErrorKind::InvalidInput => EINVAL,
        io::ErrorKind::Unsupported => ENOTSUP,
        _ => EIO,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errno_mapping_never_leaks() {
        assert_eq!(
            errno_for(&io::Error::from_raw_os_error(libc::EDQUOT)),
            ENOSPC
        );
        assert_eq!(errno_for(&io::Error::from_raw_os_error(libc::EROFS)), EPERM);
        assert_eq!(
            errno_for(&io::Error::from_raw_os_error(libc::ENOTSUP)),
            ENOTSUP
        );
        assert_eq!(errno_for(&io::Error::from_raw_os_error(libc::ENOENT)), EIO);
        assert_eq!(errno_for(&io::Error::from_raw_os_error(9999)), EIO);
        assert_eq!(errno_for(&io::Error::other("x")), EIO);
        assert_eq!(errno_for(&io::ErrorKind::Unsupported.into()), ENOTSUP);
        assert_eq!(errno_for(&io::ErrorKind::InvalidInput.into()), EINVAL);
    }

    #[test]
    fn block_sizes_sanitized() {
        let b = BlockSizes {
            min: 0,
            preferred: 3000,
            max: u32::MAX,
        }
        .sanitized();
        assert_eq!(
            b,
            BlockSizes {
                min: 1,
                preferred: 2048,
                max: MAX_PAYLOAD
            }
        );
        let b = BlockSizes {
            min: 4096,
            preferred: 512,
            max: 10_000,
        }
        .sanitized();
        assert_eq!(
            b,
            BlockSizes {
                min: 4096,
                preferred: 4096,
                max: 8192
            }
        );
    }
}
