//! A connection's socket once it leaves the tokio reactor: the handshake runs async, the
//! transmission phase (and the TLS proxy feeding it) on blocking threads.

use std::io::{self, IoSlice, Read, Write};
use std::net::Shutdown;
use std::os::fd::{AsFd, BorrowedFd};

/// A connected socket in blocking mode.
pub(crate) enum Stream {
    Unix(std::os::unix::net::UnixStream),
    Tcp(std::net::TcpStream),
}

impl Stream {
    pub(crate) fn try_clone(&self) -> io::Result<Stream> {
        Ok(match self {
            Stream::Unix(s) => Stream::Unix(s.try_clone()?),
            Stream::Tcp(s) => Stream::Tcp(s.try_clone()?),
        })
    }

    /// Whether `n` bytes (at most 64: a header) can be read at once (they have arrived),
    /// without reading them.
    pub(crate) fn has_arrived(&self, n: usize) -> bool {
        assert!(n <= 64, "peeking {n} bytes: only headers are peeked");
        let sock = match self {
            Stream::Unix(s) => socket2::SockRef::from(s),
            Stream::Tcp(s) => socket2::SockRef::from(s),
        };
        let mut buf = [std::mem::MaybeUninit::<u8>::uninit(); 64];
        // MSG_PEEK leaves the bytes in the socket, MSG_DONTWAIT never blocks.
        let got = sock.recv_with_flags(&mut buf[..n], libc::MSG_PEEK | libc::MSG_DONTWAIT);
        matches!(got, Ok(k) if k == n)
    }

    pub(crate) fn shutdown(&self, how: Shutdown) -> io::Result<()> {
        match self {
            Stream::Unix(s) => s.shutdown(how),
            Stream::Tcp(s) => s.shutdown(how),
        }
    }
}

impl AsFd for Stream {
    fn as_fd(&self) -> BorrowedFd<'_> {
        match self {
            Stream::Unix(s) => s.as_fd(),
            Stream::Tcp(s) => s.as_fd(),
        }
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

/// Send buffer asked for on Unix sockets: a 1 MiB message and its header fit, with the
/// kernel's per-packet overhead (it doubles what is asked to allow for that).
const UNIX_SEND_BUFFER: usize = 1 << 20;

/// Make room in a Unix socket's send buffer for a whole large message. A message larger than
/// the buffer (Linux: 208 KiB by default) goes out in pieces, the sender sleeping until the
/// peer drains each: a 1 MiB READ reply, or a member client's several queued 256 KiB writes,
/// cost several sleeps and wake-ups. Best effort: the kernel caps the size at
/// `net.core.wmem_max`. (TCP sizes its buffers itself; setting them would stop that.)
pub fn widen_unix_send_buffer(s: &std::os::unix::net::UnixStream) {
    let _ = socket2::SockRef::from(s).set_send_buffer_size(UNIX_SEND_BUFFER);
}

/// A tokio socket that can leave the reactor for blocking I/O.
pub(crate) trait IntoBlocking {
    fn into_blocking(self) -> io::Result<Stream>;
    /// Who is at the other end, for an administrator (`tcp:ADDR`, `unix:pid N`).
    fn peer(&self) -> String;
}

impl IntoBlocking for tokio::net::UnixStream {
    fn peer(&self) -> String {
        match self.peer_cred().ok().and_then(|c| c.pid()) {
            Some(pid) => format!("unix:pid {pid}"),
            None => "unix:unknown process".into(),
        }
    }

    fn into_blocking(self) -> io::Result<Stream> {
        let s = self.into_std()?;
        s.set_nonblocking(false)?;
        widen_unix_send_buffer(&s);
        Ok(Stream::Unix(s))
    }
}

impl IntoBlocking for tokio::net::TcpStream {
    fn peer(&self) -> String {
        match self.peer_addr() {
            Ok(a) => format!("tcp:{a}"),
            Err(_) => "tcp:unknown peer".into(),
        }
    }

    fn into_blocking(self) -> io::Result<Stream> {
        let s = self.into_std()?;
        s.set_nonblocking(false)?;
        Ok(Stream::Tcp(s))
    }
}
