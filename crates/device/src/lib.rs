//! Member devices: the one seam between the engine and storage.
//!
//! Every member I/O of an array goes through [`Device`]. Two backends implement it:
//!
//! * [`FileDevice`]: a regular file or block device. It opens the path twice, once with
//!   `O_DIRECT` (when the file system allows it) and once buffered, and takes the direct path for
//!   every request whose memory, offset and length meet the alignment that `statx(DIOALIGN)`
//!   reports; everything else goes through the page cache. Both descriptors see the same data
//!   (the kernel writes back and invalidates cached pages around direct I/O), so the choice is
//!   per request and invisible to the caller. `flush` is `fdatasync`; a FUA write is
//!   `pwritev2(RWF_DSYNC)`.
//! * [`NbdDevice`]: an NBD export (`nbd://HOST[:PORT]/EXPORT`, `nbd+unix:///EXPORT?socket=PATH`)
//!   through our own client, with per-request timeouts, reconnects that re-send every unflushed
//!   write, and a bounded retry window after which it fails like a local I/O error.
//! * [`SimDevice`]: an in-memory device that injects faults from a seed: I/O errors, power cuts
//!   (unflushed writes lost or torn at sector granularity), lost writes, misdirected writes and
//!   bit rot. Same seed and same sequence of calls ⇒ same outcome.
//!
//! Contract for callers (asserted by the backends): offsets and lengths are multiples of
//! [`SECTOR_BYTES`] and inside the device. Errors are `std::io::Error`s; the engine wraps them
//! with the member's name.

mod aligned;
mod file;
pub mod remote;
mod sim;

pub use aligned::AlignedBuf;
pub use file::{FileDevice, OpenMode};
pub use remote::{is_nbd_uri, NbdDevice, RemoteOptions};
pub use sim::{Faults, PowerRail, SimDevice, SimStats};

use std::io;
use std::os::fd::BorrowedFd;

/// md's sector: every offset and length a device sees is a multiple of this.
pub const SECTOR_BYTES: u64 = 512;

/// A member device. Calls may come from many threads at once; each call is synchronous.
pub trait Device: Send + Sync {
    /// Human-readable name (the path for files), used in every error message.
    fn name(&self) -> &str;
    /// Size in bytes (a multiple of [`SECTOR_BYTES`]).
    fn len_bytes(&self) -> u64;
    /// Fill `buf` from `offset_bytes`.
    fn read_at(&self, buf: &mut [u8], offset_bytes: u64) -> io::Result<()>;
    /// Write `buf` at `offset_bytes`; with `fua` the data is durable when this returns.
    fn write_at(&self, buf: &[u8], offset_bytes: u64, fua: bool) -> io::Result<()>;
    /// Write the concatenation of `bufs` at `offset_bytes`, as one write (a power cut tears it
    /// like one). The default gathers into one buffer; backends that can write from the
    /// pieces themselves (`pwritev`) spare that copy.
    fn write_vectored_at(&self, bufs: &[&[u8]], offset_bytes: u64, fua: bool) -> io::Result<()> {
        let total = bufs.iter().map(|b| b.len()).sum();
        let mut all = AlignedBuf::zeroed(total);
        let mut at = 0;
        for b in bufs {
            all[at..at + b.len()].copy_from_slice(b);
            at += b.len();
        }
        self.write_at(&all, offset_bytes, fua)
    }
    /// Move the `len` bytes at `offset_bytes` into the pipe `pipe` without copying them
    /// through user space (`splice(2)` of page-cache pages), for a server that sends them on
    /// from there. Never waits for room in the pipe (`WouldBlock`: the caller sized it and no
    /// one drains it meanwhile). Any error leaves the pipe holding part of them; `Unsupported`
    /// (the default) means this device cannot, and the caller reads instead.
    fn splice_to_pipe(
        &self,
        pipe: BorrowedFd<'_>,
        offset_bytes: u64,
        len: usize,
    ) -> io::Result<()> {
        let _ = (pipe, offset_bytes, len);
        Err(io::ErrorKind::Unsupported.into())
    }
    /// Make every write that completed before this call durable.
    fn flush(&self) -> io::Result<()>;
    /// Tell the device the range's content is no longer needed; it then reads as zeroes.
    /// Devices that cannot guarantee zeroes write them.
    fn discard_zeroes(&self, offset_bytes: u64, len_bytes: u64) -> io::Result<()>;
}

/// Asserts the sector contract shared by every backend.
fn check_range(dev: &dyn Device, offset_bytes: u64, len_bytes: u64) {
    assert!(
        offset_bytes.is_multiple_of(SECTOR_BYTES),
        "{}: offset {offset_bytes} not sector aligned",
        dev.name()
    );
    assert!(
        len_bytes.is_multiple_of(SECTOR_BYTES),
        "{}: length {len_bytes} not sector aligned",
        dev.name()
    );
    assert!(
        offset_bytes
            .checked_add(len_bytes)
            .is_some_and(|end| end <= dev.len_bytes()),
        "{}: I/O {offset_bytes}+{len_bytes} beyond device end {}",
        dev.name(),
        dev.len_bytes()
    );
}
