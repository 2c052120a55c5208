//! Arrays as wide as md's (issue 24 item 6): a v1.2 superblock has 1,920 role slots, and RAID6's
//! Q tells at most 255 data disks apart (GF(2^8)), so 257 members. Both limits hold end to end:
//! created, examined by mdadm, served, written, run with two members failed, rebuilt onto spares
//! and checked; one member more is refused with a reason.

mod common;

use common::{mdadm_field, member_state, require_tools, sh, Env};

const MIB: u64 = 1 << 20;

/// `qemu-io -c CMD` on the export; its output.
fn qemu_io(env: &Env, cmd: &str) -> String {
    sh("qemu-io", &["-f", "raw", &env.uri(), "-c", cmd])
}

/// `qemu-io` reads `len` bytes at `at` and compares them with `pattern`; true if all match.
fn reads_pattern(env: &Env, pattern: u8, at: u64, len: u64) -> bool {
    let out = qemu_io(env, &format!("read -P {pattern:#x} {at} {len}"));
    !out.contains("verification failed") && out.contains(&format!("read {len}/{len} bytes"))
}

fn write_pattern(env: &Env, pattern: u8, at: u64, len: u64) {
    let out = qemu_io(env, &format!("write -P {pattern:#x} {at} {len}"));
    assert!(out.contains(&format!("wrote {len}/{len} bytes")), "{out}");
}

#[test]
fn raid6_of_257_members_survives_two_failures_and_rebuilds() {
    let Some(mdadm) = testkit::require_tool("mdadm") else {
        return;
    };
    if !require_tools(&["qemu-io"]) {
        return;
    }
    let env = Env::new("wide6", 257, 16 * MIB);
    env.create("6", &[]);
    // mdadm reads our superblock of a 257-member array as its own.
    let x = sh(
        mdadm.to_str().unwrap(),
        &["--examine", env.members[100].to_str().unwrap()],
    );
    assert_eq!(mdadm_field(&x, "Raid Level"), "raid6", "{x}");
    assert_eq!(mdadm_field(&x, "Raid Devices"), "257", "{x}");
    assert_eq!(mdadm_field(&x, "Device Role"), "Active device 100", "{x}");
    let d = env.run_all();
    // Several whole stripes (255 data chunks of 512 KiB each: 127.5 MiB per stripe) and a
    // partial one.
    write_pattern(&env, 0x5a, 0, 320 * MIB);
    let m = |i: usize| env.members[i].to_str().unwrap().to_string();
    env.ok(&["fail", "wide6", &m(7)]);
    env.ok(&["fail", "wide6", &m(200)]);
    assert!(
        reads_pattern(&env, 0x5a, 0, 320 * MIB),
        "degraded read (2 members gone)"
    );
    write_pattern(&env, 0x6b, 100 * MIB, 64 * MIB);
    env.ok(&["remove", "wide6", &m(7)]);
    env.ok(&["remove", "wide6", &m(200)]);
    let spares = [env.file("s0.img", 16 * MIB), env.file("s1.img", 16 * MIB)];
    for s in &spares {
        env.ok(&["add", "wide6", s.to_str().unwrap()]);
    }
    env.wait_detail("both spares to rebuild", 120, |d| {
        spares.iter().all(|s| member_state(d, s) == "in_sync")
    });
    assert_eq!(
        env.action_wait("check"),
        0,
        "parity and Q agree after the rebuild"
    );
    assert!(reads_pattern(&env, 0x5a, 0, 100 * MIB));
    assert!(reads_pattern(&env, 0x6b, 100 * MIB, 64 * MIB));
    assert!(reads_pattern(&env, 0x5a, 164 * MIB, 156 * MIB));
    // The rebuilt members carry the data: fail two others and read again.
    env.ok(&["fail", "wide6", &m(0)]);
    env.ok(&["fail", "wide6", &m(128)]);
    assert!(reads_pattern(&env, 0x6b, 100 * MIB, 64 * MIB));
    env.stop(d);
    let x = sh(
        mdadm.to_str().unwrap(),
        &["--examine", spares[1].to_str().unwrap()],
    );
    assert!(
        mdadm_field(&x, "Device Role").starts_with("Active device "),
        "{x}"
    );
}

#[test]
fn raid5_of_384_members_serves_and_one_more_raid6_member_is_refused() {
    if !require_tools(&["qemu-io"]) {
        return;
    }
    let env = Env::new("wide5", 384, 8 * MIB);
    // Started with a soft open-file limit below the member count (common: 1,024 with 1,920
    // members allowed): ironraid raises it to the hard limit itself.
    let mut create = vec![
        "-c",
        "ulimit -Sn 256 && exec \"$@\"",
        "bash",
        common::BIN,
        "create",
        "--level",
        "5",
        "--name",
        "wide5",
        "--chunk",
        "64K",
    ];
    let members = env.member_args();
    create.extend(members.iter().map(String::as_str));
    let out = std::process::Command::new("bash")
        .args(&create)
        .env("IRONRAID_RUNDIR", env.rundir())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let d = env.run_all();
    write_pattern(&env, 0x3c, 0, 100 * MIB);
    env.ok(&["fail", "wide5", env.members[383].to_str().unwrap()]);
    assert!(reads_pattern(&env, 0x3c, 0, 100 * MIB), "degraded read");
    env.stop(d);
    // RAID6 beyond 257 members: Q's weights would repeat (the error says so).
    let over = Env::new("over6", 258, 8 * MIB);
    let mut args = vec!["create", "--level", "6", "--name", "over6"];
    let members = over.member_args();
    args.extend(members.iter().map(String::as_str));
    let out = over.ironraid(&args);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("RAID6 has at most 257 devices"), "{err}");
}
