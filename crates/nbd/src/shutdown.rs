//! The server's shutdown signal as the handshake and the transmission loop wait on it: a watch
//! channel whose value turns `true` once.

use tokio::sync::watch;

/// Resolves once shutdown was requested. (Wraps `wait_for` so that no
/// non-`Send` watch guard is held across an await: every future of this
/// crate stays `Send`.)
pub(crate) async fn stopped(rx: &mut watch::Receiver<bool>) {
    let _ = rx.wait_for(|s| *s).await;
}
