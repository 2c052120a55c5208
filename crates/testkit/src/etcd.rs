//! A real etcd server for a test: Debian's `etcd` on free loopback ports, with its data in a
//! directory of its own, started with the settings the cluster design study asks for (pre-vote
//! on) and a short election timeout, and killed when dropped.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct EtcdServer {
    child: Child,
    dir: PathBuf,
    /// The client URL (`http://127.0.0.1:PORT`).
    pub endpoint: String,
}

/// Two loopback ports free now (held together while asked for, so they differ). Another test
/// may still take one before etcd binds it: see [`EtcdServer::start_with`].
fn free_ports() -> (u16, u16) {
    let bind = || TcpListener::bind("127.0.0.1:0").expect("a free port");
    let (a, b) = (bind(), bind());
    let port = |l: &TcpListener| l.local_addr().expect("bound").port();
    (port(&a), port(&b))
}

/// Starts tried before giving up: a port taken by another test between our asking and
/// etcd's bind makes etcd exit, and a new pair is tried.
const START_ATTEMPTS: usize = 5;

impl EtcdServer {
    /// Start one; None if `etcd` is missing (and the test may skip, see
    /// [`crate::require_tool`]). Panics if it does not answer within 20 s.
    pub fn start() -> Option<EtcdServer> {
        EtcdServer::start_with(None)
    }

    /// [`EtcdServer::start`] serving TLS (an `https://` endpoint) with `certs`'s
    /// `server-cert.pem` and `server-key.pem`, requiring client certificates signed by its
    /// `ca-cert.pem`.
    pub fn start_tls(certs: &std::path::Path) -> Option<EtcdServer> {
        EtcdServer::start_with(Some(certs))
    }

    fn start_with(certs: Option<&std::path::Path>) -> Option<EtcdServer> {
        let etcd = crate::require_tool("etcd")?;
        let mut why = String::new();
        for _ in 0..START_ATTEMPTS {
            match EtcdServer::spawn(&etcd, certs) {
                Ok(server) => return Some(server),
                Err(log) => why = log,
            }
        }
        panic!("etcd did not start in {START_ATTEMPTS} attempts; last log:\n{why}");
    }

    /// One etcd on fresh ports, up and answering; Err with its log if it exited or never
    /// answered. Answering is not enough: when another test's process holds the port, the
    /// connect reaches that one while ours exits, so it must also still run a moment later.
    fn spawn(
        etcd: &std::path::Path,
        certs: Option<&std::path::Path>,
    ) -> Result<EtcdServer, String> {
        let (client, peer) = free_ports();
        let dir =
            std::env::temp_dir().join(format!("ironraid-etcd-{}-{client}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("etcd data directory");
        let scheme = if certs.is_some() { "https" } else { "http" };
        let endpoint = format!("{scheme}://127.0.0.1:{client}");
        let peer_url = format!("http://127.0.0.1:{peer}");
        let log = std::fs::File::create(dir.join("etcd.log")).expect("etcd log");
        let mut cmd = Command::new(etcd);
        if let Some(c) = certs {
            cmd.arg("--cert-file")
                .arg(c.join("server-cert.pem"))
                .arg("--key-file")
                .arg(c.join("server-key.pem"))
                .arg("--trusted-ca-file")
                .arg(c.join("ca-cert.pem"))
                .arg("--client-cert-auth");
        }
        let child = cmd
            .args(["--name", "t", "--data-dir"])
            .arg(dir.join("data"))
            .args(["--listen-client-urls", &endpoint])
            .args(["--advertise-client-urls", &endpoint])
            .args(["--listen-peer-urls", &peer_url])
            .args(["--initial-advertise-peer-urls", &peer_url])
            .args(["--initial-cluster", &format!("t={peer_url}")])
            .args(["--pre-vote=true", "--heartbeat-interval", "50"])
            .args(["--election-timeout", "500"])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start etcd");
        let mut server = EtcdServer {
            child,
            dir,
            endpoint,
        };
        let t0 = Instant::now();
        let addr = format!("127.0.0.1:{client}");
        let exited = |s: &mut EtcdServer| s.child.try_wait().ok().flatten().is_some();
        while std::net::TcpStream::connect(&addr).is_err() {
            if exited(&mut server) || t0.elapsed() > Duration::from_secs(20) {
                return Err(server.log());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        std::thread::sleep(Duration::from_millis(300));
        if exited(&mut server) {
            return Err(server.log());
        }
        Ok(server)
    }

    /// What etcd logged so far (for a failing test's message).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("etcd.log")).unwrap_or_default()
    }

    /// Stop it (SIGSTOP: it answers nothing, as a partitioned or hung etcd) or let it go on.
    pub fn pause(&self, paused: bool) {
        let sig = if paused { "-STOP" } else { "-CONT" };
        let _ = Command::new("kill")
            .args([sig, &self.child.id().to_string()])
            .status();
    }
}

impl Drop for EtcdServer {
    fn drop(&mut self) {
        self.pause(false);
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
