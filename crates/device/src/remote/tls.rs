//! TLS to a member (`nbds://`, `nbds+unix://`): `NBD_OPT_STARTTLS` in the middle of option
//! haggling, then rustls (ring provider, as the server side); never a plaintext fallback.
//!
//! Certificates as libnbd takes them: `?tls-certificates=DIR` names a directory holding
//! `ca-cert.pem` (the CA the server's certificate must chain to) and, optionally,
//! `client-cert.pem` with `client-key.pem` (for servers that require client certificates).
//! Without it the CA is the one `run --member-tls-ca` gave, else the system's bundle. The name
//! checked against the server's certificate is `?tls-hostname=`, else the URI's host, else
//! (a Unix socket) `localhost`.
//!
//! After negotiation one session state serves both directions, so the send half and the
//! receive half share it under a lock, each doing its own socket I/O outside that lock. TLS
//! records must leave in the order the session sealed them: sealing and sending happen under
//! one send lock (order: send lock, then session). Known limit: when the session must answer
//! the server by itself (a key update) while a caller's send is stuck on a full socket, the
//! reader waits for that send; the send timeout ends it (the connection is then dropped and
//! its requests retried).

use super::transport::{RecvHalf, SendHalf, Sock, Split};
use super::uri::{NbdUri, TlsParams, Transport};
use nbd::combine::write_all_vectored;
use nbd::{read_certs, read_key};
use parking_lot::Mutex;
use rustls::pki_types::ServerName;
use rustls::{ClientConfig, ClientConnection, RootCertStore};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The CA bundle Debian and its kin keep the system's trusted roots in.
const SYSTEM_CA_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";
/// Plaintext sealed per round of sending: bounds the memory a large write takes.
const SEAL_BYTES: usize = 256 << 10;
/// Ciphertext read from the socket at most per receive.
const RAW_RECV_BYTES: usize = 64 << 10;

/// What every connection of one member negotiates TLS with.
pub struct TlsSetup {
    config: Arc<ClientConfig>,
    server_name: ServerName<'static>,
}

fn invalid(what: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, what)
}

impl TlsSetup {
    /// From the URI's TLS parameters; `default_ca` is the CA used when the URI names no
    /// certificate directory.
    pub fn new(uri: &NbdUri, params: &TlsParams, default_ca: Option<&Path>) -> io::Result<Self> {
        let dir = params.certificates.as_ref().map(PathBuf::from);
        let ca = match (&dir, default_ca) {
            (Some(d), _) => d.join("ca-cert.pem"),
            (None, Some(ca)) => ca.to_path_buf(),
            (None, None) => PathBuf::from(SYSTEM_CA_BUNDLE),
        };
        let mut roots = RootCertStore::empty();
        for c in read_certs(&ca)? {
            roots
                .add(c)
                .map_err(|e| invalid(format!("{}: {e}", ca.display())))?;
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| invalid(format!("TLS: {e}")))?
            .with_root_certificates(roots);
        let client_cert = dir
            .map(|d| (d.join("client-cert.pem"), d.join("client-key.pem")))
            .filter(|(cert, _)| cert.exists());
        let config = match client_cert {
            Some((cert, key)) => builder
                .with_client_auth_cert(read_certs(&cert)?, read_key(&key)?)
                .map_err(|e| invalid(format!("{}: {e}", cert.display())))?,
            None => builder.with_no_client_auth(),
        };
        let name = match (&params.hostname, &uri.transport) {
            (Some(h), _) => h.clone(),
            (None, Transport::Tcp { host, .. }) => host.clone(),
            (None, Transport::Unix { .. }) => "localhost".to_string(),
        };
        let server_name = ServerName::try_from(name.clone())
            .map_err(|e| invalid(format!("TLS server name '{name}': {e}")))?;
        Ok(TlsSetup {
            config: Arc::new(config),
            server_name,
        })
    }

    /// The TLS handshake on `sock` (right after the server acknowledged `NBD_OPT_STARTTLS`).
    pub fn handshake(&self, mut sock: Sock) -> io::Result<TlsStream> {
        let mut conn = ClientConnection::new(self.config.clone(), self.server_name.clone())
            .map_err(|e| io::Error::other(format!("TLS: {e}")))?;
        while conn.is_handshaking() {
            conn.complete_io(&mut sock)
                .map_err(|e| io::Error::new(e.kind(), format!("TLS handshake: {e}")))?;
        }
        // Writes seal whole (in `SEAL_BYTES` rounds); the session must not cut them short.
        conn.set_buffer_limit(None);
        Ok(TlsStream { conn, sock })
    }
}

/// A TLS session on its socket, before the split (the rest of the option haggling).
pub struct TlsStream {
    conn: ClientConnection,
    sock: Sock,
}

impl Read for TlsStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        rustls::Stream::new(&mut self.conn, &mut self.sock).read(buf)
    }
}

impl Write for TlsStream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        rustls::Stream::new(&mut self.conn, &mut self.sock).write(buf)
    }
    fn flush(&mut self) -> io::Result<()> {
        rustls::Stream::new(&mut self.conn, &mut self.sock).flush()
    }
}

impl TlsStream {
    pub fn sock(&self) -> &Sock {
        &self.sock
    }

    /// The two halves over one session.
    pub fn split(self) -> io::Result<Split> {
        let recv_sock = self.sock.try_clone()?;
        let closer = self.sock.try_clone()?;
        let shared = Arc::new(Shared {
            sending: Mutex::new(self.sock),
            session: Mutex::new(self.conn),
        });
        Ok(Split {
            send: Box::new(TlsSend(shared.clone())),
            recv: Box::new(TlsRecv {
                shared,
                sock: recv_sock,
                raw: vec![0u8; RAW_RECV_BYTES],
                start: 0,
                end: 0,
            }),
            closer,
        })
    }
}

struct Shared {
    /// The socket's sending direction; held while sealing so records leave in order.
    sending: Mutex<Sock>,
    session: Mutex<ClientConnection>,
}

impl Shared {
    /// Seal `parts` (nothing: only what the session itself wants to send) and send it.
    fn seal_and_send(&self, parts: &[&[u8]]) -> io::Result<()> {
        let mut sock = self.sending.lock();
        let mut pending: Vec<&[u8]> = parts.iter().copied().filter(|p| !p.is_empty()).collect();
        loop {
            let mut sealed = Vec::new();
            {
                let mut session = self.session.lock();
                let mut room = SEAL_BYTES;
                while room > 0 && !pending.is_empty() {
                    let n = pending[0].len().min(room);
                    session.writer().write_all(&pending[0][..n])?;
                    room -= n;
                    pending[0] = &pending[0][n..];
                    if pending[0].is_empty() {
                        pending.remove(0);
                    }
                }
                while session.wants_write() {
                    session.write_tls(&mut sealed)?;
                }
            }
            write_all_vectored(&mut *sock, &[&sealed])?;
            if pending.is_empty() {
                return Ok(());
            }
        }
    }
}

struct TlsSend(Arc<Shared>);

impl SendHalf for TlsSend {
    fn send(&mut self, parts: &[&[u8]]) -> io::Result<()> {
        self.0.seal_and_send(parts)
    }
}

struct TlsRecv {
    shared: Arc<Shared>,
    sock: Sock,
    /// Ciphertext received and not yet given to the session: `raw[start..end]`.
    raw: Vec<u8>,
    start: usize,
    end: usize,
}

impl TlsRecv {
    /// Plaintext from what the session already holds or `raw` still has; `None`: neither has
    /// any. Also says whether the session has something of its own to send (a key update).
    fn plaintext_held(&mut self, buf: &mut [u8]) -> io::Result<(Option<usize>, bool)> {
        let mut session = self.shared.session.lock();
        loop {
            match session.reader().read(buf) {
                Ok(n) => return Ok((Some(n), session.wants_write())),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
            if self.start == self.end {
                return Ok((None, session.wants_write()));
            }
            let n = session.read_tls(&mut &self.raw[self.start..self.end])?;
            self.start += n;
            session
                .process_new_packets()
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("TLS: {e}")))?;
        }
    }
}

impl RecvHalf for TlsRecv {
    fn recv(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            let (got, wants_write) = self.plaintext_held(buf)?;
            if wants_write {
                self.shared.seal_and_send(&[])?;
            }
            if let Some(n) = got {
                return Ok(n);
            }
            let n = self.sock.read(&mut self.raw)?;
            if n == 0 {
                return Ok(0);
            }
            (self.start, self.end) = (0, n);
        }
    }
}
