//! sd_notify for `Type=notify` units: one datagram to the unix socket systemd names in
//! `$NOTIFY_SOCKET` (a path, or an abstract name written with a leading `@`). Without that
//! variable (not started by systemd) it does nothing.

use std::os::unix::net::UnixDatagram;

/// Send `state` (e.g. `READY=1\nSTATUS=…`); a failure is logged, never fatal: the array
/// serves whether or not systemd hears of it.
pub fn notify(state: &str) {
    let Some(target) = std::env::var_os("NOTIFY_SOCKET").filter(|v| !v.is_empty()) else {
        return;
    };
    if let Err(e) = send(&target.to_string_lossy(), state) {
        tracing::warn!("sd_notify to {}: {e}", target.to_string_lossy());
    }
}

fn send(target: &str, state: &str) -> std::io::Result<()> {
    let sock = UnixDatagram::unbound()?;
    match target.strip_prefix('@') {
        Some(name) => {
            use std::os::linux::net::SocketAddrExt;
            let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())?;
            sock.send_to_addr(state.as_bytes(), &addr)?;
        }
        None => {
            sock.send_to(state.as_bytes(), target)?;
        }
    }
    Ok(())
}
