//! A pipe per request thread, through which a READ's bytes go from a backend's files to the
//! socket without passing through user space (`splice(2)` in, `splice(2)` out: the pipe holds
//! references to page-cache pages, not copies).
//!
//! Why: a read through a buffer costs two copies in the server (file to buffer, buffer to
//! socket); spliced, the kernel moves page references, and on a Unix socket the client's
//! receive is the only copy left. A pipe is made once per thread and kept; one whose content
//! is in doubt (a backend that failed halfway, a send that failed) is closed, never reused.

use std::cell::RefCell;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

/// The most a pipe is asked to hold: a READ up to this long may be spliced (the kernel's
/// default `fs.pipe-max-size`; a longer one is read through a buffer).
const PIPE_BYTES: usize = 1 << 20;

/// Shorter READs go through a buffer: their copies cost less than the two `splice` calls and
/// the byte count check a spliced one makes beside the reply's write (4 KiB random reads ran
/// 0.81–1.00× the buffered path's IOPS spliced, `bench/transport`, 2026-11-28).
pub(crate) const SPLICE_MIN_BYTES: usize = 64 << 10;

pub(crate) struct Pipe {
    read: OwnedFd,
    write: OwnedFd,
    /// What the kernel granted (`F_SETPIPE_SZ` may give less, e.g. past a user's pipe quota).
    capacity: usize,
}

impl Pipe {
    fn new() -> io::Result<Pipe> {
        let (read, write) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)?;
        // Less than asked (or the default) where the kernel refuses: longer READs then go
        // through a buffer.
        let capacity = rustix::pipe::fcntl_setpipe_size(&write, PIPE_BYTES)
            .or_else(|_| rustix::pipe::fcntl_getpipe_size(&write))?;
        Ok(Pipe {
            read,
            write,
            capacity,
        })
    }

    /// Where a backend puts the bytes.
    pub(crate) fn input(&self) -> BorrowedFd<'_> {
        self.write.as_fd()
    }

    /// Whether the pipe holds exactly `len` bytes.
    pub(crate) fn holds(&self, len: usize) -> bool {
        matches!(rustix::io::ioctl_fionread(&self.read), Ok(n) if n == len as u64)
    }

    /// Send the `len` bytes the pipe holds to `sock`, all of them.
    pub(crate) fn send_to(&self, sock: BorrowedFd<'_>, len: usize) -> io::Result<()> {
        let mut left = len;
        while left > 0 {
            let flags = rustix::pipe::SpliceFlags::MOVE;
            match rustix::pipe::splice(&self.read, None, sock, None, left, flags) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => left -= n,
                Err(rustix::io::Errno::INTR) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }
}

thread_local! {
    static PIPE: RefCell<Option<Pipe>> = const { RefCell::new(None) };
}

/// Run `f` with this thread's pipe when it can hold `len` bytes; `f` says whether the pipe
/// is left empty and fit for reuse (else it is closed). None: no pipe of that size here.
pub(crate) fn with_pipe<T>(len: usize, f: impl FnOnce(&Pipe) -> (T, bool)) -> Option<T> {
    PIPE.with(|cell| {
        let mut slot = cell.borrow_mut();
        if slot.is_none() {
            *slot = Some(Pipe::new().ok()?);
        }
        let pipe = slot.as_ref().expect("made above");
        if len > pipe.capacity {
            return None;
        }
        let (out, clean) = f(pipe);
        if !clean {
            *slot = None;
        }
        Some(out)
    })
}
