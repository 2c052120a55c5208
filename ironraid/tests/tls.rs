//! TLS on TCP (issue 26 item 7): `run --tls-cert/--tls-key` serves NBD with STARTTLS, required
//! by default, checked with nbdinfo (`nbds://`) and qemu-img (`tls-creds-x509`); a plain-text
//! client is refused; `--tls-ca` requires client certificates. Certificates are made with
//! openssl in the test.

mod common;

use common::*;
use std::process::{Command, Output};

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn nbdinfo(uri: &str) -> Output {
    Command::new("nbdinfo")
        .args(["--size", uri])
        .output()
        .expect("spawn nbdinfo")
}

#[test]
fn nbd_over_tls_with_nbdinfo_and_qemu_img_and_plain_clients_refused() {
    if !require_tools(&["nbdinfo", "qemu-img", "openssl"]) {
        return;
    }
    let env = Env::new("sec", 2, 16 << 20);
    env.create("1", &[]);
    let certs = env.dir.path().join("pki");
    std::fs::create_dir_all(&certs).unwrap();
    let client_dir = make_certificates(&certs);
    let port = free_port();
    let pem = |f: &str| certs.join(f).display().to_string();
    let (d, uris) = env.run_printing(
        &[
            "--nbd".into(),
            format!("nbd://127.0.0.1:{port}"),
            "--tls-cert".into(),
            pem("server-cert.pem"),
            "--tls-key".into(),
            pem("server-key.pem"),
        ],
        2,
    );
    let nbds = format!("nbds://127.0.0.1:{port}/sec");
    assert!(uris.contains(&nbds), "{uris:?}");
    let size = env.detail()["size_bytes"].as_u64().unwrap().to_string();
    let with_ca = format!("{nbds}?tls-certificates={}", client_dir.display());
    let out = nbdinfo(&with_ca);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), size);
    // Required by default: a plain-text client is refused.
    let out = nbdinfo(&format!("nbd://127.0.0.1:{port}/sec"));
    assert!(!out.status.success(), "a plain client was served");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("TLS"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // qemu with its x509 credentials object.
    let info = sh(
        "qemu-img",
        &[
            "info",
            "--object",
            &format!(
                "tls-creds-x509,id=tls0,dir={},endpoint=client",
                client_dir.display()
            ),
            "--image-opts",
            &format!("driver=nbd,host=127.0.0.1,port={port},export=sec,tls-creds=tls0"),
        ],
    );
    assert!(info.contains(&format!("({size} bytes)")), "{info}");
    // The local Unix socket stays plain.
    assert_eq!(
        String::from_utf8_lossy(&nbdinfo(&env.uri()).stdout).trim(),
        size
    );
    env.stop(d);

    // --tls-ca: client certificates signed by that CA are required.
    let (d, _) = env.run_printing(
        &[
            "--nbd".into(),
            format!("nbd://127.0.0.1:{port}"),
            "--tls-cert".into(),
            pem("server-cert.pem"),
            "--tls-key".into(),
            pem("server-key.pem"),
            "--tls-ca".into(),
            pem("ca-cert.pem"),
        ],
        2,
    );
    let out = nbdinfo(&with_ca);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let anonymous = certs.join("anonymous");
    std::fs::create_dir_all(&anonymous).unwrap();
    std::fs::copy(certs.join("ca-cert.pem"), anonymous.join("ca-cert.pem")).unwrap();
    let out = nbdinfo(&format!("{nbds}?tls-certificates={}", anonymous.display()));
    assert!(
        !out.status.success(),
        "served a client without a certificate"
    );
    env.stop(d);
}
