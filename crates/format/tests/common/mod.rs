//! Test helper: finding the external tools a test needs, and failing when one is missing.

#![allow(dead_code)]

use std::path::PathBuf;

/// Environment switch for developers without every external tool: when set to `1`, a test whose
/// tool is missing prints `SKIPPED (tool X missing)` and passes. `./scripts/test.sh` clears it,
/// so there a missing tool fails the test instead of passing it silently.
pub const ALLOW_MISSING_TOOLS: &str = "IRONRAID_ALLOW_MISSING_TOOLS";

/// Where `tool` is: on PATH, or in an sbin directory (mdadm lives in /usr/sbin, which a
/// non-root PATH may lack; the tests run it by its full path).
fn locate(tool: &str) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let path = std::env::var_os("PATH").unwrap_or_default();
    let mut dirs: Vec<PathBuf> = std::env::split_paths(&path).collect();
    dirs.extend(["/usr/sbin", "/sbin", "/usr/local/sbin"].map(PathBuf::from));
    dirs.into_iter().map(|d| d.join(tool)).find(|p| {
        std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    })
}

/// The one check a test that needs an external tool makes first:
/// `let Some(mdadm) = require_tool("mdadm") else { return; };`
///
/// Found: its path. Missing: the test fails, naming the tool, unless
/// `IRONRAID_ALLOW_MISSING_TOOLS=1`; then this prints `SKIPPED (tool X missing)` (straight to
/// stderr, past the test harness's capture, so the skip is seen) and returns `None`.
pub fn require_tool(tool: &str) -> Option<PathBuf> {
    if let Some(p) = locate(tool) {
        return Some(p);
    }
    let test = std::thread::current()
        .name()
        .unwrap_or("this test")
        .to_string();
    if std::env::var(ALLOW_MISSING_TOOLS).is_ok_and(|v| v == "1") {
        use std::io::Write;
        let _ = writeln!(
            std::io::stderr(),
            "SKIPPED (tool {tool} missing): {test} [{ALLOW_MISSING_TOOLS}=1]"
        );
        return None;
    }
    panic!(
        "{test} needs {tool}, which is not installed (Debian package: {tool}; ./scripts/test.sh \
         installs it). To skip such tests locally, set {ALLOW_MISSING_TOOLS}=1."
    );
}
