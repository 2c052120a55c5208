//! Fixed-newstyle handshake and option haggling (async, over any stream).
//!
//! Ends either in transmission (`NBD_OPT_GO` / `NBD_OPT_EXPORT_NAME`) or in a
//! closed connection. Every option is bounded by [`Limits`]; the caller wraps
//! the whole exchange in the handshake timeout.

use std::io;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::watch;
use tracing::debug;

use crate::backend::{Backend, Export};
use crate::codec::{self, ClientOption, InfoRequest, MetaContextRequest};
use crate::limits::Limits;
use crate::proto::*;
use crate::shutdown::stopped;

/// Option data longer than the limit but at most this long is read and
/// discarded (answered `NBD_REP_ERR_TOO_BIG`); anything longer closes.
const DISCARD_CAP: u64 = 1 << 20;

/// What the handshake agreed on.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Negotiated {
    /// Index into the server's export list.
    pub export: usize,
    /// Structured replies were negotiated.
    pub structured: bool,
    /// `base:allocation` is selected for this export.
    pub base_allocation: bool,
    /// The client asked for `NBD_INFO_BLOCK_SIZE`, so it promised to honour
    /// the advertised minimum (alignment is then enforced).
    pub block_sizes: bool,
    /// Transmission flags that were sent.
    pub flags: u16,
}

/// Transmission flags advertised for `backend`.
pub(crate) fn transmission_flags(backend: &dyn Backend, structured: bool) -> u16 {
    let mut f = FLAG_HAS_FLAGS
        | FLAG_SEND_FLUSH
        | FLAG_SEND_FUA
        | FLAG_SEND_TRIM
        | FLAG_SEND_WRITE_ZEROES
        | FLAG_SEND_FAST_ZERO
        | FLAG_SEND_CACHE
        | FLAG_CAN_MULTI_CONN;
    if backend.read_only() {
        f |= FLAG_READ_ONLY;
    }
    if structured {
        f |= FLAG_SEND_DF;
    }
    f
}

/// Looks an export up; `""` is the first (default) export.
pub(crate) fn find_export(exports: &[Export], name: &str) -> Option<usize> {
    exports
        .iter()
        .position(|e| e.name == name)
        .or(if name.is_empty() && !exports.is_empty() {
            Some(0)
        } else {
            None
        })
}

/// Where the connection stands on TLS.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TlsState {
    /// The server has no certificate: `NBD_OPT_STARTTLS` is unsupported.
    Unavailable,
    /// Offered; `required`: nothing but STARTTLS and ABORT before it.
    Offered { required: bool },
    /// The options now run inside TLS.
    Active,
}

/// How a handshake ended.
#[derive(Debug)]
pub(crate) enum Outcome {
    Transmit(Negotiated),
    Close,
    /// `NBD_OPT_STARTTLS` was acknowledged: the caller runs the TLS handshake and then
    /// [`haggle`] again over the TLS stream (option state starts afresh, as the spec asks).
    StartTls {
        no_zeroes: bool,
    },
}

struct Haggle<'a, S> {
    stream: &'a mut S,
    exports: &'a [Export],
    limits: &'a Limits,
    tls: TlsState,
    no_zeroes: bool,
    structured: bool,
    /// Export index for which `base:allocation` was selected.
    meta: Option<usize>,
    out: Vec<u8>,
}

enum Step {
    Continue,
    Close,
    Transmit(Negotiated),
    StartTls,
}

/// The greeting and the client's flags: whether it asked for `NO_ZEROES` (None: close).
pub(crate) async fn greet<S>(stream: &mut S) -> io::Result<Option<bool>>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    stream.write_all(&codec::server_greeting()).await?;
    stream.flush().await?;
    let mut cf = [0u8; 4];
    stream.read_exact(&mut cf).await?;
    match codec::parse_client_flags(&cf) {
        Ok(f) => Ok(Some(f.no_zeroes)),
        Err(e) => {
            debug!("closing: {e}");
            Ok(None)
        }
    }
}

/// Option haggling, after [`greet`] (or after STARTTLS, over the TLS stream).
pub(crate) async fn haggle<S>(
    stream: &mut S,
    exports: &[Export],
    limits: &Limits,
    tls: TlsState,
    no_zeroes: bool,
    shutdown: &mut watch::Receiver<bool>,
) -> io::Result<Outcome>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let mut h = Haggle {
        stream,
        exports,
        limits,
        tls,
        no_zeroes,
        structured: false,
        meta: None,
        out: Vec::new(),
    };
    for _ in 0..limits.max_options.max(1) {
        let step = h.one_option(shutdown).await?;
        h.send().await?;
        match step {
            Step::Continue => {}
            Step::Close => return Ok(Outcome::Close),
            Step::Transmit(n) => return Ok(Outcome::Transmit(n)),
            Step::StartTls => return Ok(Outcome::StartTls { no_zeroes }),
        }
    }
    debug!("closing: too many options");
    Ok(Outcome::Close)
}

impl<S: AsyncRead + AsyncWrite + Unpin> Haggle<'_, S> {
    async fn send(&mut self) -> io::Result<()> {
        if !self.out.is_empty() {
            self.stream.write_all(&self.out).await?;
            self.stream.flush().await?;
            self.out.clear();
        }
        Ok(())
    }

    fn reply(&mut self, option: u32, reply_type: u32, data: &[u8]) {
        self.out
            .extend_from_slice(&codec::encode_option_reply(option, reply_type, data));
    }

    fn error(&mut self, option: u32, reply_type: u32, msg: &str) {
        self.reply(option, reply_type, msg.as_bytes());
    }

    /// Reads one option (header and data) and handles it.
    async fn one_option(&mut self, shutdown: &mut watch::Receiver<bool>) -> io::Result<Step> {
        let mut hdr = [0u8; OPTION_HEADER_LEN];
        tokio::select! {
            r = self.stream.read_exact(&mut hdr) => { r?; }
            _ = stopped(shutdown) => return Ok(Step::Close),
        }
        let Ok(h) = codec::parse_option_header(&hdr) else {
            debug!("closing: bad option magic");
            return Ok(Step::Close);
        };
        if h.length > self.limits.max_option_bytes {
            return self.too_big(h.option, h.length).await;
        }
        let mut data = vec![0u8; h.length as usize];
        self.stream.read_exact(&mut data).await?;
        if *shutdown.borrow() {
            return Ok(match h.option {
                OPT_ABORT => self.abort(),
                OPT_EXPORT_NAME => Step::Close,
                o => {
                    self.error(o, REP_ERR_SHUTDOWN, "server is shutting down");
                    Step::Continue
                }
            });
        }
        match codec::parse_option(h.option, &data) {
            Ok(opt) => Ok(self.handle(h.option, opt)),
            Err(e) if h.option == OPT_EXPORT_NAME => {
                debug!("closing: bad export name: {e}");
                Ok(Step::Close)
            }
            Err(_) if h.option == OPT_ABORT => Ok(self.abort()),
            Err(e) => {
                self.error(h.option, REP_ERR_INVALID, &format!("malformed option: {e}"));
                Ok(Step::Continue)
            }
        }
    }

    async fn too_big(&mut self, option: u32, length: u32) -> io::Result<Step> {
        if option == OPT_EXPORT_NAME || u64::from(length) > DISCARD_CAP {
            debug!("closing: option {option} with {length} data bytes");
            if option != OPT_EXPORT_NAME {
                self.error(option, REP_ERR_TOO_BIG, "option data too large");
            }
            self.send().await?;
            return Ok(Step::Close);
        }
        let mut sink = tokio::io::sink();
        let copied =
            tokio::io::copy(&mut (&mut *self.stream).take(u64::from(length)), &mut sink).await?;
        if copied != u64::from(length) {
            return Ok(Step::Close);
        }
        self.error(option, REP_ERR_TOO_BIG, "option data too large");
        Ok(Step::Continue)
    }

    fn abort(&mut self) -> Step {
        self.reply(OPT_ABORT, REP_ACK, &[]);
        Step::Close
    }

    fn handle(&mut self, code: u32, opt: ClientOption) -> Step {
        if self.tls == (TlsState::Offered { required: true }) {
            match opt {
                ClientOption::StartTls | ClientOption::Abort => {}
                ClientOption::ExportName(_) => {
                    debug!("closing: NBD_OPT_EXPORT_NAME before the required STARTTLS");
                    return Step::Close;
                }
                _ => {
                    self.error(
                        code,
                        REP_ERR_TLS_REQD,
                        "TLS is required: NBD_OPT_STARTTLS first",
                    );
                    return Step::Continue;
                }
            }
        }
        match opt {
            ClientOption::ExportName(name) => self.export_name(&name),
            ClientOption::Abort => self.abort(),
            ClientOption::List => {
                for e in self.exports {
                    let d = codec::rep_server_data(&e.name, &e.description);
                    self.reply(code, REP_SERVER, &d);
                }
                self.reply(code, REP_ACK, &[]);
                Step::Continue
            }
            ClientOption::StartTls => match self.tls {
                TlsState::Unavailable => {
                    self.error(
                        code,
                        REP_ERR_UNSUP,
                        "TLS is not configured on this endpoint",
                    );
                    Step::Continue
                }
                TlsState::Active => {
                    self.error(code, REP_ERR_INVALID, "TLS is already active");
                    Step::Continue
                }
                TlsState::Offered { .. } => {
                    self.reply(code, REP_ACK, &[]);
                    Step::StartTls
                }
            },
            ClientOption::Info(req) => {
                self.info(code, &req);
                Step::Continue
            }
            ClientOption::Go(req) => self.go(&req),
            ClientOption::StructuredReply => {
                self.structured = true;
                self.reply(code, REP_ACK, &[]);
                Step::Continue
            }
            ClientOption::ListMetaContext(req) => {
                self.meta_context(code, &req, false);
                Step::Continue
            }
            ClientOption::SetMetaContext(req) => {
                self.meta_context(code, &req, true);
                Step::Continue
            }
            ClientOption::Unknown(o) => {
                self.error(o, REP_ERR_UNSUP, "unsupported option");
                Step::Continue
            }
        }
    }

    fn export_name(&mut self, name: &str) -> Step {
        let Some(idx) = find_export(self.exports, name) else {
            debug!("closing: unknown export {name:?} in NBD_OPT_EXPORT_NAME");
            return Step::Close;
        };
        let b = &*self.exports[idx].backend;
        let flags = transmission_flags(b, self.structured);
        let r = codec::export_name_reply(b.size_bytes(), flags, self.no_zeroes);
        self.out.extend_from_slice(&r);
        Step::Transmit(self.negotiated(idx, flags, false))
    }

    fn negotiated(&self, export: usize, flags: u16, block_sizes: bool) -> Negotiated {
        Negotiated {
            export,
            structured: self.structured,
            base_allocation: self.structured && self.meta == Some(export),
            block_sizes,
            flags,
        }
    }

    /// Sends the `NBD_REP_INFO` replies and the ACK; returns the export and
    /// flags, or `None` after an error reply.
    fn info(&mut self, code: u32, req: &InfoRequest) -> Option<(usize, u16)> {
        let Some(idx) = find_export(self.exports, &req.name) else {
            self.error(code, REP_ERR_UNKNOWN, "unknown export");
            return None;
        };
        let e = &self.exports[idx];
        let b = &*e.backend;
        let flags = transmission_flags(b, self.structured);
        let bs = b.block_sizes().sanitized();
        let mut infos = vec![
            codec::info_export(b.size_bytes(), flags),
            codec::info_block_size(bs.min, bs.preferred, bs.max),
        ];
        if req.requests.contains(&INFO_NAME) {
            infos.push(codec::info_string(INFO_NAME, &e.name));
        }
        if req.requests.contains(&INFO_DESCRIPTION) && !e.description.is_empty() {
            infos.push(codec::info_string(INFO_DESCRIPTION, &e.description));
        }
        for d in infos {
            self.reply(code, REP_INFO, &d);
        }
        self.reply(code, REP_ACK, &[]);
        Some((idx, flags))
    }

    fn go(&mut self, req: &InfoRequest) -> Step {
        match self.info(OPT_GO, req) {
            Some((idx, flags)) => {
                let bs = req.requests.contains(&INFO_BLOCK_SIZE);
                Step::Transmit(self.negotiated(idx, flags, bs))
            }
            None => Step::Continue,
        }
    }

    fn meta_context(&mut self, code: u32, req: &MetaContextRequest, set: bool) {
        if !self.structured {
            self.error(code, REP_ERR_INVALID, "structured replies not negotiated");
            return;
        }
        let Some(idx) = find_export(self.exports, &req.export) else {
            self.error(code, REP_ERR_UNKNOWN, "unknown export");
            return;
        };
        let matches = |q: &str| q == META_BASE_ALLOCATION || (!set && q == "base:");
        let selected = if set || !req.queries.is_empty() {
            req.queries.iter().any(|q| matches(q))
        } else {
            true // LIST with no query: every context we know.
        };
        if selected {
            let id = if set { META_BASE_ALLOCATION_ID } else { 0 };
            let d = codec::meta_context_data(id, META_BASE_ALLOCATION);
            self.reply(code, REP_META_CONTEXT, &d);
        }
        if set {
            self.meta = selected.then_some(idx);
        }
        self.reply(code, REP_ACK, &[]);
    }
}
