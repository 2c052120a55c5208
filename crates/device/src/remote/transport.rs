//! The byte pipe under a connection: a Unix or TCP socket, and after negotiation its two
//! directions apart, so that callers send while another caller receives.
//!
//! A plain socket splits into two descriptors of one socket (`try_clone`). TLS cannot split
//! that way (one session state serves both directions): see `tls`, which implements the same
//! two halves over shared state.

use super::uri::Transport;
use nbd::combine::write_all_vectored;
use std::io::{self, IoSlice, Read, Write};
use std::net::{Shutdown, TcpStream, ToSocketAddrs};
use std::os::unix::net::UnixStream;
use std::time::Duration;

/// A connected socket.
pub enum Sock {
    Unix(UnixStream),
    Tcp(TcpStream),
}

impl Sock {
    /// Connect, with every later send bounded by `send_timeout` and every receive by
    /// `recv_timeout` (the caller reading replies wakes at that pace to check on progress).
    pub fn connect(
        transport: &Transport,
        send_timeout: Duration,
        recv_timeout: Duration,
    ) -> io::Result<Sock> {
        let s = match transport {
            Transport::Unix { socket } => {
                let s = UnixStream::connect(socket)?;
                // Queued writes go out whole, as the server's replies do.
                nbd::widen_unix_send_buffer(&s);
                Sock::Unix(s)
            }
            Transport::Tcp { host, port } => {
                let mut last = io::Error::new(io::ErrorKind::NotFound, "host has no address");
                let mut found = None;
                for addr in (host.as_str(), *port).to_socket_addrs()? {
                    match TcpStream::connect_timeout(&addr, send_timeout) {
                        Ok(s) => {
                            found = Some(s);
                            break;
                        }
                        Err(e) => last = e,
                    }
                }
                let s = found.ok_or(last)?;
                // Requests go out as soon as written: no Nagle delay behind a reply's ACK.
                s.set_nodelay(true)?;
                Sock::Tcp(s)
            }
        };
        s.set_timeouts(send_timeout, recv_timeout)?;
        Ok(s)
    }

    pub fn set_timeouts(&self, send: Duration, recv: Duration) -> io::Result<()> {
        match self {
            Sock::Unix(u) => {
                u.set_write_timeout(Some(send))?;
                u.set_read_timeout(Some(recv))
            }
            Sock::Tcp(t) => {
                t.set_write_timeout(Some(send))?;
                t.set_read_timeout(Some(recv))
            }
        }
    }

    pub fn try_clone(&self) -> io::Result<Sock> {
        Ok(match self {
            Sock::Unix(u) => Sock::Unix(u.try_clone()?),
            Sock::Tcp(t) => Sock::Tcp(t.try_clone()?),
        })
    }

    /// Both directions closed: a thread blocked on the socket returns at once.
    pub fn shutdown(&self) {
        let _ = match self {
            Sock::Unix(u) => u.shutdown(Shutdown::Both),
            Sock::Tcp(t) => t.shutdown(Shutdown::Both),
        };
    }
}

impl Read for Sock {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Sock::Unix(s) => s.read(buf),
            Sock::Tcp(s) => s.read(buf),
        }
    }
}

impl Write for Sock {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Sock::Unix(s) => s.write(buf),
            Sock::Tcp(s) => s.write(buf),
        }
    }
    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        match self {
            Sock::Unix(s) => s.write_vectored(bufs),
            Sock::Tcp(s) => s.write_vectored(bufs),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Sends whole messages (header and payload as pieces).
pub trait SendHalf: Send {
    fn send(&mut self, parts: &[&[u8]]) -> io::Result<()>;
}

/// Receives bytes; a receive timeout comes back as `WouldBlock`/`TimedOut`, and the half stays
/// usable after it (no byte is lost).
pub trait RecvHalf: Send {
    fn recv(&mut self, buf: &mut [u8]) -> io::Result<usize>;
}

impl SendHalf for Sock {
    fn send(&mut self, parts: &[&[u8]]) -> io::Result<()> {
        write_all_vectored(self, parts)
    }
}

impl RecvHalf for Sock {
    fn recv(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.read(buf)
    }
}

/// The two halves of a negotiated connection, and a handle that can shut it down.
pub struct Split {
    pub send: Box<dyn SendHalf>,
    pub recv: Box<dyn RecvHalf>,
    pub closer: Sock,
}

/// A plain socket's halves: three descriptors of one socket.
pub fn split_plain(sock: Sock) -> io::Result<Split> {
    Ok(Split {
        send: Box::new(sock.try_clone()?),
        closer: sock.try_clone()?,
        recv: Box::new(sock),
    })
}
