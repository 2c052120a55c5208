//! External tools a test needs (mdadm, nbdinfo, qemu-io, fio, `/dev/fuse`, ...): finding them,
//! and failing the test when one is missing — or skipping it, on a developer's machine that
//! lacks some, when `IRONRAID_ALLOW_MISSING_TOOLS=1`.
//!
//! A test makes one check first, then returns early if it said no:
//!
//! ```no_run
//! // Tools the test runs by name (looked up on PATH):
//! if !testkit::require_tools(&["nbdinfo", "nbdcopy"]) {
//!     return;
//! }
//! // A tool the test runs by its full path (PATH or an sbin directory):
//! let Some(mdadm) = testkit::require_tool("mdadm") else {
//!     return;
//! };
//! ```

use std::path::{Path, PathBuf};

/// Environment switch for developers without every external tool: when set to `1`, a test whose
/// tool is missing prints `SKIPPED (tool X missing)` and passes. `./scripts/test.sh` clears it,
/// so there a missing tool fails the test instead of passing it silently.
pub const ALLOW_MISSING_TOOLS: &str = "IRONRAID_ALLOW_MISSING_TOOLS";

/// Directories [`locate`] searches after PATH: system tools such as mdadm live in /usr/sbin,
/// which a non-root PATH may lack.
pub const SBIN_DIRS: [&str; 3] = ["/usr/sbin", "/sbin", "/usr/local/sbin"];

/// A regular file with an execute bit (following symlinks).
fn executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// A name starting with `/` is a path that must exist (`/dev/fuse`): `Some(Some(path))` if it
/// does, `Some(None)` if not; `None` for a program name.
fn as_path(tool: &str) -> Option<Option<PathBuf>> {
    tool.starts_with('/')
        .then(|| Path::new(tool).exists().then(|| PathBuf::from(tool)))
}

/// Where `tool` is on PATH (as a test that runs it by name finds it). A name starting with `/`
/// is a path that must exist (`/dev/fuse`).
pub fn on_path(tool: &str) -> Option<PathBuf> {
    if let Some(path) = as_path(tool) {
        return path;
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(tool))
        .find(|p| executable(p))
}

/// Is `tool` here, for a test that runs it by name? See [`on_path`].
pub fn tool_present(tool: &str) -> bool {
    on_path(tool).is_some()
}

/// Where `tool` is: on PATH, or else in one of [`SBIN_DIRS`] (a test then runs it by this full
/// path). A name starting with `/` is a path that must exist (`/dev/fuse`).
pub fn locate(tool: &str) -> Option<PathBuf> {
    if let Some(path) = as_path(tool) {
        return path;
    }
    on_path(tool).or_else(|| {
        SBIN_DIRS
            .iter()
            .map(|dir| Path::new(dir).join(tool))
            .find(|p| executable(p))
    })
}

/// The Debian package that provides `tool` (for the failure message); `?` if unknown.
pub fn package_of(tool: &str) -> &'static str {
    match tool {
        "nbdinfo" | "nbdcopy" => "libnbd-bin",
        "qemu-io" | "qemu-img" => "qemu-utils",
        "mkfs.ext4" | "e2fsck" => "e2fsprogs",
        "fusermount3" => "fuse3",
        "losetup" | "mount" | "umount" => "mount",
        "nbdfuse" => "nbdfuse",
        "nbdkit" => "nbdkit",
        "fio" => "fio",
        "mdadm" => "mdadm",
        "openssl" => "openssl",
        "etcd" => "etcd-server",
        "/dev/fuse" => "the fuse kernel module (in a container: --device /dev/fuse)",
        _ => "?",
    }
}

/// The one check a test that runs external tools by name makes first:
/// `if !require_tools(&["fio"]) { return; }`.
///
/// All on PATH (see [`on_path`]): true. One missing: see [`tool_missing`] (which, if it returns,
/// makes this return false).
pub fn require_tools(tools: &[&str]) -> bool {
    match tools.iter().copied().find(|t| !tool_present(t)) {
        None => true,
        Some(missing) => {
            tool_missing(missing, "not installed");
            false
        }
    }
}

/// The one check a test that runs an external tool by its full path makes first:
/// `let Some(mdadm) = require_tool("mdadm") else { return; };`
///
/// Found (see [`locate`]): its path. Missing: see [`tool_missing`] (which, if it returns, makes
/// this return `None`).
pub fn require_tool(tool: &str) -> Option<PathBuf> {
    let found = locate(tool);
    if found.is_none() {
        tool_missing(tool, "not installed");
    }
    found
}

/// `tool` is missing or unusable here (`why`): the test fails, naming the tool and its package,
/// unless `IRONRAID_ALLOW_MISSING_TOOLS=1`; only then does this return (after printing
/// `SKIPPED (tool X missing)` straight to stderr, past the test harness's capture, so the skip is
/// seen), and the caller returns from the test.
pub fn tool_missing(tool: &str, why: &str) {
    let test = std::thread::current()
        .name()
        .unwrap_or("this test")
        .to_string();
    if std::env::var(ALLOW_MISSING_TOOLS).is_ok_and(|v| v == "1") {
        use std::io::Write;
        let _ = writeln!(
            std::io::stderr(),
            "SKIPPED (tool {tool} missing): {test}: {why} [{ALLOW_MISSING_TOOLS}=1]"
        );
        return;
    }
    panic!(
        "{test} needs {tool}: {why} (Debian package: {}; ./scripts/test.sh installs the \
         packages). To skip such tests locally, set {ALLOW_MISSING_TOOLS}=1.",
        package_of(tool)
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::OsString;
    use std::panic::catch_unwind;
    use std::sync::{Mutex, MutexGuard};

    /// Tests here run in parallel threads of one process; those that read or change PATH or the
    /// switch hold this lock, so none sees another's setting.
    static ENV: Mutex<()> = Mutex::new(());

    /// Holds [`ENV`] and puts back the variables it changed when dropped (even on a panic).
    struct EnvGuard {
        saved: Vec<(&'static str, Option<OsString>)>,
        _lock: MutexGuard<'static, ()>,
    }

    impl EnvGuard {
        fn lock() -> EnvGuard {
            EnvGuard {
                saved: Vec::new(),
                _lock: ENV.lock().unwrap_or_else(|poisoned| poisoned.into_inner()),
            }
        }

        fn set(&mut self, key: &'static str, value: Option<&str>) {
            if !self.saved.iter().any(|(k, _)| *k == key) {
                self.saved.push((key, std::env::var_os(key)));
            }
            match value {
                Some(v) => std::env::set_var(key, v),
                None => std::env::remove_var(key),
            }
        }
    }

    impl Drop for EnvGuard {
        fn drop(&mut self) {
            for (key, value) in self.saved.drain(..).rev() {
                match value {
                    Some(v) => std::env::set_var(key, v),
                    None => std::env::remove_var(key),
                }
            }
        }
    }

    const NONSENSE: &str = "no-such-tool-xyz";

    /// The message of the panic `f` raised; panics itself if `f` returned.
    fn panic_message<R>(f: impl FnOnce() -> R + std::panic::UnwindSafe) -> String {
        let payload = match catch_unwind(f) {
            Ok(_) => panic!("expected a panic"),
            Err(payload) => payload,
        };
        payload
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
            .expect("panic message")
    }

    #[test]
    fn locate_finds_sh_and_not_a_nonsense_name() {
        let _env = EnvGuard::lock();
        let sh = locate("sh").expect("sh is on PATH");
        assert_eq!(sh.file_name().unwrap(), "sh");
        assert_eq!(on_path("sh"), Some(sh));
        assert!(tool_present("sh"));
        assert_eq!(locate(NONSENSE), None);
        assert_eq!(on_path(NONSENSE), None);
        assert!(!tool_present(NONSENSE));
    }

    #[test]
    fn a_name_starting_with_slash_is_a_path_that_must_exist() {
        assert_eq!(locate("/dev/null"), Some(PathBuf::from("/dev/null")));
        assert_eq!(on_path("/dev/null"), Some(PathBuf::from("/dev/null")));
        assert_eq!(locate("/no/such/path/xyz"), None);
        assert!(!tool_present("/no/such/path/xyz"));
    }

    #[test]
    fn locate_searches_sbin_dirs_after_path_but_on_path_does_not() {
        // Any program in an sbin directory will do; a machine with none has nothing to test.
        let Some(prog) = SBIN_DIRS
            .iter()
            .filter_map(|d| std::fs::read_dir(d).ok())
            .flatten()
            .filter_map(Result::ok)
            .find(|e| executable(&e.path()))
        else {
            return;
        };
        let name = prog.file_name().into_string().unwrap();
        let mut env = EnvGuard::lock();
        env.set("PATH", Some("/nonexistent-testkit-dir"));
        let found = locate(&name).expect("found in an sbin dir");
        assert!(
            SBIN_DIRS.iter().any(|d| found.starts_with(d)),
            "{}",
            found.display()
        );
        assert_eq!(on_path(&name), None);
    }

    #[test]
    fn package_names() {
        assert_eq!(package_of("nbdinfo"), "libnbd-bin");
        assert_eq!(package_of("nbdcopy"), "libnbd-bin");
        assert_eq!(package_of("qemu-io"), "qemu-utils");
        assert_eq!(package_of("qemu-img"), "qemu-utils");
        assert_eq!(package_of("mkfs.ext4"), "e2fsprogs");
        assert_eq!(package_of("e2fsck"), "e2fsprogs");
        assert_eq!(package_of("fusermount3"), "fuse3");
        for t in ["losetup", "mount", "umount"] {
            assert_eq!(package_of(t), "mount");
        }
        for t in ["nbdfuse", "nbdkit", "fio", "mdadm"] {
            assert_eq!(package_of(t), t);
        }
        assert_eq!(
            package_of("/dev/fuse"),
            "the fuse kernel module (in a container: --device /dev/fuse)"
        );
        assert_eq!(package_of(NONSENSE), "?");
    }

    #[test]
    fn a_present_tool_is_required_without_fuss() {
        let mut env = EnvGuard::lock();
        env.set(ALLOW_MISSING_TOOLS, None);
        assert_eq!(require_tool("sh"), locate("sh"));
        assert!(require_tools(&["sh", "/dev/null"]));
        assert!(require_tools(&[]));
    }

    #[test]
    fn a_missing_tool_fails_the_test_unless_the_switch_is_set() {
        let mut env = EnvGuard::lock();
        let this = std::thread::current().name().unwrap().to_string();

        // Switch unset (or anything but `1`): the test fails, naming the tool, why, its package
        // and the switch.
        for setting in [None, Some("0"), Some("yes")] {
            env.set(ALLOW_MISSING_TOOLS, setting);
            let msg = panic_message(|| require_tool(NONSENSE));
            assert_eq!(
                msg,
                format!(
                    "{this} needs {NONSENSE}: not installed (Debian package: ?; \
                     ./scripts/test.sh installs the packages). To skip such tests locally, set \
                     IRONRAID_ALLOW_MISSING_TOOLS=1."
                )
            );
            let msg = panic_message(|| require_tools(&["sh", "mdadm-no-such", NONSENSE]));
            assert!(msg.contains("needs mdadm-no-such: not installed"), "{msg}");
            let msg = panic_message(|| tool_missing("/dev/fuse", "cannot open"));
            assert!(
                msg.contains(
                    "needs /dev/fuse: cannot open (Debian package: the fuse kernel module \
                     (in a container: --device /dev/fuse);"
                ),
                "{msg}"
            );
        }

        // Switch set: a skip (printed to stderr), and the caller is told to return.
        env.set(ALLOW_MISSING_TOOLS, Some("1"));
        assert_eq!(require_tool(NONSENSE), None);
        assert!(!require_tools(&["sh", NONSENSE]));
        tool_missing("losetup", "no loop devices");
        // A present tool is still found.
        assert!(require_tool("sh").is_some());
        assert!(require_tools(&["sh"]));
    }
}
