//! Where running arrays keep their sockets (see `shared/INTERFACE.md`).

use std::path::PathBuf;

/// `$IRONRAID_RUNDIR`, else `$XDG_RUNTIME_DIR/ironraid`, else `/run/ironraid`.
pub fn rundir() -> PathBuf {
    if let Some(d) = std::env::var_os("IRONRAID_RUNDIR").filter(|d| !d.is_empty()) {
        return PathBuf::from(d);
    }
    if let Some(d) = std::env::var_os("XDG_RUNTIME_DIR").filter(|d| !d.is_empty()) {
        return PathBuf::from(d).join("ironraid");
    }
    PathBuf::from("/run/ironraid")
}

pub fn control_socket(name: &str) -> PathBuf {
    rundir().join(format!("{name}.ctl"))
}

pub fn nbd_socket(name: &str) -> PathBuf {
    rundir().join(format!("{name}.nbd"))
}
