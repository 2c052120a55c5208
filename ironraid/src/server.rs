//! The daemon's side of the control socket: one request per connection, answered with one JSON
//! line, except `monitor`, which keeps the connection and streams one event per line.

use crate::control::{EventLine, Request, Response, MAX_REQUEST_BYTES};
use crate::member::Opener;
use crate::results::VerifyResult;
use crate::status::Detail;
use engine::{Array, Event, MemberState};
use std::path::Path;
use std::sync::mpsc::RecvTimeoutError;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::unix::OwnedWriteHalf;
use tokio::net::UnixListener;
use tokio::sync::{mpsc, watch};

/// What request handlers need from the daemon.
pub struct Ctx {
    pub array: Arc<Array>,
    /// Where NBD is served (for `detail`).
    pub addrs: Vec<String>,
    pub stop: watch::Sender<bool>,
    /// How members are opened (for `add`).
    pub opener: Opener,
    /// The NBD server (for the clients `stop` refuses to cut off).
    pub nbd: Arc<nbd::Server>,
    /// This node's membership, if the array is clustered.
    pub cluster: Option<Arc<crate::cluster::node::Node>>,
}

pub async fn control_loop(listener: UnixListener, ctx: Arc<Ctx>) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let ctx = ctx.clone();
        tokio::spawn(async move {
            let (rd, mut wr) = stream.into_split();
            let mut line = String::new();
            let mut reader = BufReader::new(rd.take(MAX_REQUEST_BYTES as u64));
            if reader.read_line(&mut line).await.is_err() {
                return;
            }
            let resp = match serde_json::from_str::<Request>(&line) {
                Err(e) => Response::err(format!("malformed request: {e}")),
                Ok(Request::Monitor) => return monitor(&ctx, reader, wr).await,
                Ok(req) => handle(req, &ctx).await,
            };
            let _ = write_json(&mut wr, &resp).await;
        });
    }
}

async fn write_json<T: serde::Serialize>(wr: &mut OwnedWriteHalf, v: &T) -> std::io::Result<()> {
    let mut out = serde_json::to_string(v).unwrap_or_else(|_| "{\"ok\":false}".into());
    out.push('\n');
    wr.write_all(out.as_bytes()).await
}

/// Run `f` on the blocking pool and turn its result into a response.
async fn blocking<F>(f: F) -> Response
where
    F: FnOnce() -> anyhow::Result<()> + Send + 'static,
{
    match tokio::task::spawn_blocking(f).await {
        Ok(Ok(())) => Response::ok(),
        Ok(Err(e)) => Response::err(format!("{e:#}")),
        Err(e) => Response::err(e.to_string()),
    }
}

fn detail(ctx: &Ctx) -> Response {
    let status = ctx.array.status();
    let mut d = Detail::from_status(&status, ctx.addrs.clone());
    d.nbd_clients = ctx.nbd.clients();
    d.cluster = ctx.cluster.as_ref().map(|n| n.detail());
    d.memory = Some(crate::status::MemoryDetail::from_parts(
        &status.memory,
        &ctx.nbd,
    ));
    Response {
        ok: true,
        detail: Some(d),
        ..Response::default()
    }
}

async fn handle(req: Request, ctx: &Ctx) -> Response {
    let array = ctx.array.clone();
    match req {
        Request::Detail => detail(ctx),
        Request::Stop { force } => stop(ctx, force).await,
        Request::Fail { member, force } => {
            blocking(move || {
                match force {
                    true => array.fail_member(&member),
                    false => array.fail_member_safely(&member),
                }
                .map_err(anyhow::Error::from)
            })
            .await
        }
        Request::Remove { member } => {
            let cluster = ctx.cluster.clone();
            blocking(move || {
                let dev_number = array
                    .status()
                    .members
                    .iter()
                    .find(|m| m.name == crate::member::name(Path::new(&member)))
                    .map(|m| m.dev_number);
                array.remove_member(&member)?;
                if let (Some(node), Some(dev)) = (&cluster, dev_number) {
                    node.publish_removed(dev)?;
                }
                Ok(())
            })
            .await
        }
        Request::Add { member, force } => add(ctx, member, force).await,
        Request::Action { action } => match ctx.cluster.clone().filter(|n| !n.runs_actions()) {
            // Background work is the coordinator's: it takes the request.
            Some(node) => blocking(move || node.forward_action(&action)).await,
            None => match array.request_action(&action) {
                Ok(()) => Response::ok(),
                Err(e) => Response::err(e.to_string()),
            },
        },
        Request::Speed { min, max } => {
            if max == Some(0) {
                return Response::err("speed: --max must be above 0");
            }
            array.set_sync_speed(min, max);
            if let Some(node) = &ctx.cluster {
                if let Err(e) = node.publish_speed(min, max) {
                    return Response::err(format!(
                        "speed set on this node only: the other nodes' is unchanged ({e:#})"
                    ));
                }
            }
            detail(ctx)
        }
        Request::JournalMode { mode } => {
            let res = match mode.as_deref() {
                None => Ok(()),
                Some("write-back") => array.set_journal_mode(true),
                Some("write-through") => array.set_journal_mode(false),
                Some(other) => {
                    return Response::err(format!(
                        "journal-mode: '{other}' is neither write-through nor write-back"
                    ))
                }
            };
            match res {
                Ok(()) => detail(ctx),
                Err(e) => Response::err(e.to_string()),
            }
        }
        Request::Verify { ranges } => {
            let ranges: Vec<(u64, u64)> = ranges.iter().map(|r| (r[0], r[1])).collect();
            match tokio::task::spawn_blocking(move || array.verify(&ranges)).await {
                Ok(Ok(r)) => Response {
                    ok: true,
                    verify: Some(VerifyResult::from_engine(&r)),
                    ..Response::default()
                },
                Ok(Err(e)) => Response::err(e.to_string()),
                Err(e) => Response::err(e.to_string()),
            }
        }
        Request::Guide {
            kind,
            ranges,
            assume_data_journal,
        } => {
            let ranges: Vec<(u64, u64)> = ranges.iter().map(|r| (r[0], r[1])).collect();
            let res = tokio::task::spawn_blocking(move || {
                crate::guide::run(&array, &kind, &ranges, assume_data_journal)
            })
            .await;
            match res {
                Ok(Ok(g)) => Response {
                    ok: true,
                    guide: Some(g),
                    ..Response::default()
                },
                Ok(Err(e)) => Response::err(format!("{e:#}")),
                Err(e) => Response::err(e.to_string()),
            }
        }
        Request::Monitor => Response::err("monitor is a streaming request"),
    }
}

/// `add`: a member already in the array is named as such (opening it would fail on the
/// daemon's own lock).
async fn add(ctx: &Ctx, member: String, force: bool) -> Response {
    let array = ctx.array.clone();
    let opener = ctx.opener.clone();
    let cluster = ctx.cluster.clone();
    blocking(move || {
        // Opening it would fail on our own lock ("in use by another process").
        let name = crate::member::name(Path::new(&member));
        if let Some(m) = array.status().members.iter().find(|m| m.name == name) {
            let as_what = match m.state {
                MemberState::InSync => "an active member",
                MemberState::Rebuilding => "a member being rebuilt",
                MemberState::Faulty => "a faulty member (`remove` it first)",
                MemberState::Spare => "a spare",
                MemberState::Journal => "the journal",
            };
            anyhow::bail!("{member} is already {as_what} of {}", array.name());
        }
        let dev = opener.open(Path::new(&member))?;
        array.add_member(dev, force).map_err(anyhow::Error::from)?;
        if let Some(node) = &cluster {
            // The other nodes open the same device (a path as every node names it).
            let shared_name = match device::is_nbd_uri(&member) {
                true => member.clone(),
                false => std::fs::canonicalize(&member)?.display().to_string(),
            };
            let dev_number = array
                .status()
                .members
                .iter()
                .find(|m| m.name == name)
                .map(|m| m.dev_number)
                .ok_or_else(|| anyhow::anyhow!("{member} is not in the array after its add"))?;
            node.publish_added(dev_number, &shared_name)?;
        }
        Ok(())
    })
    .await
}

/// 20 ms polls `stop` waits for clients that are leaving (2 s).
const STOP_CLIENT_GRACE_POLLS: u32 = 100;

/// md refuses to stop an open array: connected clients would lose what they have not
/// flushed. With `force` the array is flushed first, so what they wrote is kept.
async fn stop(ctx: &Ctx, force: bool) -> Response {
    // A client that just disconnected (a script's `nbdcopy; ironraid stop`) is gone once the
    // server has read its EOF and answered what it had in flight: allow it that moment.
    let mut clients = ctx.nbd.clients();
    for _ in 0..STOP_CLIENT_GRACE_POLLS {
        if clients.is_empty() || force {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        clients = ctx.nbd.clients();
    }
    if !clients.is_empty() && !force {
        let s = if clients.len() == 1 { "" } else { "s" };
        return Response::err(format!(
            "array '{}' is in use: {} NBD client{s} connected ({}); disconnect them, or `stop \
             --force` to flush and stop anyway",
            ctx.array.name(),
            clients.len(),
            clients.join(", ")
        ));
    }
    if !clients.is_empty() {
        let array = ctx.array.clone();
        let flushed = blocking(move || array.flush().map_err(anyhow::Error::from)).await;
        if !flushed.ok {
            return flushed;
        }
        tracing::warn!(array = %ctx.array.name(), clients = %clients.join(", "), "stop --force: flushed; cutting off connected NBD clients");
    }
    let _ = ctx.stop.send(true);
    Response::ok()
}

/// Events that describe the state the array is in when a monitor attaches (as `mdadm
/// --monitor` reports a degraded array when it starts).
fn initial_events(array: &Array) -> Vec<EventLine> {
    let s = array.status();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0);
    let (event, message) = if s.failed {
        ("array_failed", "array is failed".to_string())
    } else if !s.missing_roles.is_empty() {
        (
            "array_degraded",
            format!("running without roles {:?}", s.missing_roles),
        )
    } else {
        return Vec::new();
    };
    vec![EventLine {
        event: event.into(),
        array: s.name,
        member: None,
        message,
        unix_ms: now,
    }]
}

/// Stream events until the client closes the connection (or the daemon exits).
async fn monitor<R: AsyncRead + Unpin>(
    ctx: &Ctx,
    mut reader: BufReader<R>,
    mut wr: OwnedWriteHalf,
) {
    let rx = ctx.array.subscribe();
    let (tx, mut events) = mpsc::unbounded_channel::<Event>();
    // The engine's channel is std's; bridge it on a plain thread (not the blocking pool, which
    // the runtime would wait for at exit).
    let bridge = std::thread::Builder::new()
        .name("monitor".into())
        .spawn(move || loop {
            match rx.recv_timeout(Duration::from_millis(500)) {
                Ok(ev) => {
                    if tx.send(ev).is_err() {
                        return;
                    }
                }
                Err(RecvTimeoutError::Timeout) if tx.is_closed() => return,
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => return,
            }
        });
    if let Err(e) = bridge {
        let _ = write_json(&mut wr, &Response::err(format!("cannot monitor: {e}"))).await;
        return;
    }
    if write_json(&mut wr, &Response::ok()).await.is_err() {
        return;
    }
    for ev in initial_events(&ctx.array) {
        if write_json(&mut wr, &ev).await.is_err() {
            return;
        }
    }
    let mut sink = [0u8; 256];
    loop {
        tokio::select! {
            ev = events.recv() => {
                let Some(ev) = ev else { return };
                if write_json(&mut wr, &EventLine::from(&ev)).await.is_err() {
                    return;
                }
            }
            n = reader.read(&mut sink) => {
                if !matches!(n, Ok(k) if k > 0) {
                    return;
                }
            }
        }
    }
}
