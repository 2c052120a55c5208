//! TLS for NBD over TCP: `NBD_OPT_STARTTLS` upgrades the connection in the middle of option
//! haggling (rustls, ring provider). After the handshake the transmission phase works on
//! blocking sockets shared by several threads, which a TLS session cannot be: a proxy task
//! carries the bytes between the TLS stream and one end of a socket pair, and the
//! transmission threads get the other end.

use std::io::{self, BufReader};
use std::path::Path;
use std::sync::Arc;

use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio_rustls::rustls::{self, pki_types::CertificateDer, pki_types::PrivateKeyDer};
use tokio_rustls::{server::TlsStream, TlsAcceptor};

use crate::stream::Stream;

/// The server's certificate, and whether TLS is required (nbdkit's `--tls=require`) or only
/// offered.
pub struct TlsConfig {
    acceptor: TlsAcceptor,
    required: bool,
}

fn invalid(what: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, what)
}

/// The PEM certificates in `path` (at least one), for either side of a TLS connection.
pub fn read_certs(path: &Path) -> io::Result<Vec<CertificateDer<'static>>> {
    let file = std::fs::File::open(path)
        .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
    let certs = rustls_pemfile::certs(&mut BufReader::new(file)).collect::<io::Result<Vec<_>>>()?;
    if certs.is_empty() {
        return Err(invalid(format!("{}: no PEM certificate", path.display())));
    }
    Ok(certs)
}

/// The PEM private key in `path`.
pub fn read_key(path: &Path) -> io::Result<PrivateKeyDer<'static>> {
    let file = std::fs::File::open(path)
        .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))?;
    rustls_pemfile::private_key(&mut BufReader::new(file))?
        .ok_or_else(|| invalid(format!("{}: no PEM private key", path.display())))
}

impl TlsConfig {
    /// From PEM files: the certificate chain, its key, and (for client certificates, which
    /// are then required) the CA that signs them.
    pub fn from_pem_files(
        cert: &Path,
        key: &Path,
        client_ca: Option<&Path>,
        required: bool,
    ) -> io::Result<TlsConfig> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| invalid(format!("TLS: {e}")))?;
        let builder = match client_ca {
            None => builder.with_no_client_auth(),
            Some(ca) => {
                let mut roots = rustls::RootCertStore::empty();
                for c in read_certs(ca)? {
                    roots
                        .add(c)
                        .map_err(|e| invalid(format!("{}: {e}", ca.display())))?;
                }
                let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                    Arc::new(roots),
                    provider,
                )
                .build()
                .map_err(|e| invalid(format!("{}: {e}", ca.display())))?;
                builder.with_client_cert_verifier(verifier)
            }
        };
        let config = builder
            .with_single_cert(read_certs(cert)?, read_key(key)?)
            .map_err(|e| invalid(format!("{} with {}: {e}", cert.display(), key.display())))?;
        Ok(TlsConfig {
            acceptor: TlsAcceptor::from(Arc::new(config)),
            required,
        })
    }

    pub fn required(&self) -> bool {
        self.required
    }

    pub(crate) async fn accept<S>(&self, stream: S) -> io::Result<TlsStream<S>>
    where
        S: AsyncRead + AsyncWrite + Unpin,
    {
        self.acceptor.accept(stream).await
    }
}

/// The blocking end of a socket pair whose other end a task bridges to `tls`.
pub(crate) fn proxied<S>(mut tls: TlsStream<S>) -> io::Result<Stream>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (ours, theirs) = std::os::unix::net::UnixStream::pair()?;
    theirs.set_nonblocking(true)?;
    let mut theirs = tokio::net::UnixStream::from_std(theirs)?;
    tokio::spawn(async move {
        let _ = tokio::io::copy_bidirectional(&mut tls, &mut theirs).await;
        let _ = tls.shutdown().await;
    });
    Ok(Stream::Unix(ours))
}
