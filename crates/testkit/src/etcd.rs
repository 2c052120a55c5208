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

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

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
        let dir = std::env::temp_dir().join(format!(
            "ironraid-etcd-{}-{}",
            std::process::id(),
            free_port()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("etcd data directory");
        let (client, peer) = (free_port(), free_port());
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
        let server = EtcdServer {
            child,
            dir,
            endpoint,
        };
        let t0 = Instant::now();
        let addr = format!("127.0.0.1:{client}");
        while std::net::TcpStream::connect(&addr).is_err() {
            assert!(
                t0.elapsed() < Duration::from_secs(20),
                "etcd did not start: {}",
                server.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Some(server)
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
