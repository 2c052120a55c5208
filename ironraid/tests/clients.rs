//! Real NBD clients against `ironraid run`: nbdinfo, nbdcopy, qemu-img, qemu-io, fio.

mod common;

use common::{
    assert_same_image, member_state, random_file, require_tools, same_files, sh, Env, FailingFile,
};

const MEMBER: u64 = 64 << 20;
const DATA: usize = 24 << 20;

#[test]
fn nbdinfo_reports_size_and_flags() {
    if !require_tools(&["nbdinfo"]) {
        return;
    }
    let env = Env::new("info5", 4, MEMBER);
    env.create("5", &["--chunk", "64K"]);
    let d = env.run_all();
    let detail: serde_json::Value =
        serde_json::from_str(&env.ok(&["detail", "info5", "--json"])).unwrap();
    let json: serde_json::Value =
        serde_json::from_str(&sh("nbdinfo", &["--json", &env.uri()])).unwrap();
    let export = &json["exports"][0];
    assert_eq!(export["export-size"], detail["size_bytes"]);
    for flag in [
        "can_flush",
        "can_fua",
        "can_trim",
        "can_zero",
        "can_multi_conn",
    ] {
        assert_eq!(
            export[flag],
            serde_json::Value::Bool(true),
            "{flag} in {export}"
        );
    }
    assert_eq!(export["is_read_only"], serde_json::Value::Bool(false));
    assert_eq!(export["block_size_minimum"], 512);
    let list = sh(
        "nbdinfo",
        &[
            "--list",
            &format!("nbd+unix://?socket={}", env.socket().display()),
        ],
    );
    assert!(
        list.contains("export=\"info5\"") || list.contains("info5"),
        "{list}"
    );
    // Default export "" reaches the array too.
    let plain = sh(
        "nbdinfo",
        &[
            "--size",
            &format!("nbd+unix://?socket={}", env.socket().display()),
        ],
    );
    assert_eq!(plain.trim(), detail["size_bytes"].to_string());
    env.stop(d);
}

fn copy_roundtrip(level: &str, n: usize, extra: &[&str]) {
    let env = Env::new(&format!("copy{level}"), n, MEMBER);
    env.create(level, extra);
    let src = env.dir.path().join("src.bin");
    let back = env.dir.path().join("back.bin");
    random_file(&src, DATA, 42);
    let d = env.run_all();
    sh(
        "nbdcopy",
        &["--connections=4", src.to_str().unwrap(), &env.uri()],
    );
    sh("nbdcopy", &[&env.uri(), back.to_str().unwrap()]);
    let got = std::fs::read(&back).unwrap();
    let want = std::fs::read(&src).unwrap();
    assert!(got[..DATA] == want[..], "{level}: data read back differs");
    let log = env.stop(d);
    assert!(log.contains("stopped cleanly"), "{log}");
    // After a clean stop and a new run the bytes are still there.
    let d = env.run_all();
    let back2 = env.dir.path().join("back2.bin");
    sh("nbdcopy", &[&env.uri(), back2.to_str().unwrap()]);
    assert!(
        std::fs::read(&back2).unwrap()[..DATA] == want[..],
        "{level}: differs after restart"
    );
    assert!(!d.log_text().contains("not stopped cleanly"));
    env.stop(d);
}

#[test]
fn nbdcopy_roundtrip_raid0() {
    if !require_tools(&["nbdcopy"]) {
        return;
    }
    copy_roundtrip("0", 3, &["--chunk", "64K"]);
}

/// `DATA` random bytes (from `seed`) written to the export over 4 connections; returns them.
fn write_random(env: &Env, seed: u64) -> Vec<u8> {
    let src = env.dir.path().join("src.bin");
    random_file(&src, DATA, seed);
    sh(
        "nbdcopy",
        &["--connections=4", src.to_str().unwrap(), &env.uri()],
    );
    std::fs::read(&src).unwrap()
}

/// The export's first `DATA` bytes, read with 1 MiB requests (each may be spliced).
fn read_in_mib(env: &Env) -> Vec<u8> {
    let back = env.dir.path().join("back.bin");
    sh(
        "nbdcopy",
        &["--request-size=1048576", &env.uri(), back.to_str().unwrap()],
    );
    let mut got = std::fs::read(&back).unwrap();
    got.truncate(DATA);
    got
}

/// Reads of levels without parity go from the members' page caches to the socket (`splice`):
/// what fio's verifying readers and nbdcopy get back is what was written, with concurrent
/// writes and reads of every size up to the pipe's 1 MiB, and the daemon says it spliced; an
/// array with integrity records never splices (its records verify bytes in memory).
/// Canaries: splicing from the member offset without the data offset failed fio's verify;
/// with the device's splice waiting for room in the pipe, the 1 MiB read at byte 512 (257
/// pages for a pipe of 256) hung until `timeout` killed qemu-io.
#[test]
fn spliced_reads_return_what_was_written() {
    if !require_tools(&["nbdcopy", "fio", "qemu-io", "timeout"]) {
        return;
    }
    let integrity: &[&str] = &["--integrity", "crc32c"];
    let write_back: &[&str] = &[
        "--consistency-policy",
        "journal",
        "--journal-mode",
        "write-back",
    ];
    for (case, (level, n, extra)) in [
        ("linear", 3, &[][..]),
        ("0", 3, &[]),
        ("1", 3, &[]),
        ("10", 3, &[]),
        ("1", 3, integrity),
        ("5", 3, &[]),
        ("6", 4, &[]),
        // Rows the write-back cache holds are read from it, never from the members.
        ("5", 3, write_back),
        ("5", 3, integrity),
    ]
    .into_iter()
    .enumerate()
    {
        let what = format!("level {level} {extra:?}");
        let env = Env::new(&format!("splice{case}"), n, MEMBER);
        let mut args = vec!["--chunk", "64K"];
        args.extend_from_slice(extra);
        let mut members = env.members.clone();
        let log;
        if extra == write_back {
            log = env.file("log.img", 64 << 20);
            args.extend(["--journal", log.to_str().unwrap()]);
            members.push(log.clone());
        }
        env.create(level, &args);
        let d = env.run(&members);
        let out = sh(
            "fio",
            &[
                "--name=splice",
                "--ioengine=nbd",
                &format!("--uri={}", env.uri()),
                "--rw=randrw",
                "--bsrange=4k-1m",
                "--size=28m",
                "--iodepth=16",
                "--numjobs=2",
                "--offset_increment=30m",
                "--verify=crc32c",
                "--verify_fatal=1",
                "--verify_state_save=0",
                "--do_verify=1",
                "--group_reporting",
            ],
        );
        assert!(out.contains("err= 0"), "{what}: fio {out}");
        assert!(!out.contains("verify: bad"), "{what}: fio {out}");
        let want = write_random(&env, 7);
        assert!(read_in_mib(&env) == want, "{what}: data read back differs");
        // 1 MiB not page-aligned: one page more than the pipe has slots for; it must come back
        // through the buffer, not wait for room.
        for op in [
            "write -P 0xab 512 2M",
            "read -P 0xab 512 1M",
            "read -P 0xab 4096 1M",
        ] {
            let out = sh(
                "timeout",
                &["60", "qemu-io", "-f", "raw", &env.uri(), "-c", op],
            );
            assert!(
                !out.contains("Pattern verification failed"),
                "{what}: {op}: {out}"
            );
        }
        let spliced = env.detail()["spliced_reads"].as_u64().unwrap();
        if extra != integrity {
            assert!(
                spliced >= (DATA >> 20) as u64,
                "{what}: {spliced} reads spliced"
            );
        } else {
            assert_eq!(spliced, 0, "{what}: spliced past its records");
        }
        env.stop(d);
    }
}

/// Spliced reads while a member is rebuilt: the spare holds zeroes past its recovery point, so
/// a read spliced from it there would return zeroes for data. Reads during the rebuild (RAID1,
/// RAID10, RAID5: there the rows past it are reconstructed) come back exactly, and some were
/// spliced. Canary: picking the copy in
/// `splice_copies` without its in-sync check made the first read during the RAID1 rebuild
/// differ.
#[test]
fn spliced_reads_during_a_rebuild_skip_the_spare_past_its_recovery_point() {
    if !require_tools(&["nbdcopy"]) {
        return;
    }
    let chunk: &[&str] = &["--chunk", "64K"];
    for (level, n, extra) in [("1", 2, &[][..]), ("10", 4, chunk), ("5", 3, chunk)] {
        let env = Env::new(&format!("splrb{level}"), n, MEMBER);
        env.create(level, extra);
        let d = env.run_with(&["--speed-min", "1M", "--speed-max", "1M"], &env.members);
        let want = write_random(&env, 11);
        let gone = env.members[0].to_str().unwrap();
        env.ok(&["fail", &env.name, gone]);
        env.ok(&["remove", &env.name, gone]);
        let spare = env.file("spare.img", MEMBER);
        env.ok(&["add", &env.name, spare.to_str().unwrap()]);
        // Past 2 MiB of each member: reads of RAID5 rows below it may splice (those above
        // are reconstructed), while the rest takes 10 s more at 1 MiB/s.
        env.wait_detail("the rebuild to pass 2 MiB", 30, |d| {
            d["sync"]["action"] == "recover" && d["sync"]["done_bytes"].as_u64() >= Some(2 << 20)
        });
        let spliced_before = env.detail()["spliced_reads"].as_u64().unwrap();
        for round in 0..3 {
            let got = read_in_mib(&env);
            let det = env.detail();
            assert_eq!(
                det["sync"]["action"], "recover",
                "level {level}: the rebuild ended before read {round}: {det:#}"
            );
            if let Some(at) = (0..DATA).find(|&i| got[i] != want[i]) {
                panic!(
                    "level {level}: read {round} during the rebuild differs from byte {at}: {:#}",
                    det["sync"]
                );
            }
            std::thread::sleep(std::time::Duration::from_millis(700));
        }
        let spliced = env.detail()["spliced_reads"].as_u64().unwrap() - spliced_before;
        eprintln!("level {level}: {spliced} reads spliced during the rebuild");
        assert!(
            spliced > 0,
            "level {level}: no read spliced during the rebuild"
        );
        env.ok(&["speed", &env.name, "--max", "500M"]);
        env.wait_detail("the rebuild to end", 60, |d| d["state"] == "clean");
        assert!(
            read_in_mib(&env) == want,
            "level {level}: differs after the rebuild"
        );
        env.stop(d);
    }
}

/// A member that starts failing every request while reads splice: the reads that reach it
/// (its page cache dropped) fail in the splice, fall back to the buffered read, which reads
/// around it (the other copy, or the row's reconstruction) and fails it when the rewrite fails
/// too; every read returns what was written. RAID1 and RAID5, the failing member a file on
/// nbdfuse over nbdkit's error filter.
#[test]
fn spliced_reads_go_around_a_member_that_starts_failing() {
    if !require_tools(&["nbdcopy", "nbdkit", "nbdfuse", "dd"]) {
        return;
    }
    for (level, n) in [("1", 2), ("5", 3)] {
        let mut env = Env::new(&format!("splfail{level}"), n - 1, MEMBER);
        let failing = FailingFile::new(&env, "m", MEMBER);
        env.members.push(failing.path());
        env.create(level, &["--chunk", "64K"]);
        let d = env.run_all();
        let want = write_random(&env, 13);
        let read_back = |what: &str| {
            let got = read_in_mib(&env);
            if let Some(at) = (0..DATA).find(|&i| got[i] != want[i]) {
                panic!("level {level}: {what}: differs from byte {at}");
            }
        };
        read_back("healthy");
        assert!(
            env.detail()["spliced_reads"].as_u64() > Some(0),
            "level {level}: nothing spliced while healthy"
        );
        // Its pages out of the page cache, so that reads reach the failing export.
        let fuse = format!("if={}", failing.path().display());
        sh("dd", &[&fuse, "iflag=nocache", "count=0", "status=none"]);
        failing.fail(true);
        read_back("with a member failing");
        let det = env.detail();
        assert_eq!(
            member_state(&det, &failing.path()),
            "faulty",
            "level {level}: the failing member was never read: {det:#}"
        );
        env.stop(d);
    }
}

#[test]
fn nbdcopy_roundtrip_raid1() {
    if !require_tools(&["nbdcopy"]) {
        return;
    }
    copy_roundtrip("1", 2, &[]);
}

#[test]
fn nbdcopy_roundtrip_raid5() {
    if !require_tools(&["nbdcopy"]) {
        return;
    }
    copy_roundtrip("5", 4, &[]);
}

#[test]
fn nbdcopy_roundtrip_raid6() {
    if !require_tools(&["nbdcopy"]) {
        return;
    }
    copy_roundtrip("6", 5, &["--chunk", "128K"]);
}

#[test]
fn nbdcopy_roundtrip_raid10() {
    if !require_tools(&["nbdcopy"]) {
        return;
    }
    copy_roundtrip("10", 4, &["--layout", "f2"]);
}

#[test]
fn qemu_io_odd_offsets_and_qemu_img_compare() {
    if !require_tools(&["qemu-io", "qemu-img", "nbdinfo"]) {
        return;
    }
    let env = Env::new("qemu6", 5, MEMBER);
    env.create("6", &["--chunk", "64K"]);
    let d = env.run_all();
    let uri = env.uri();
    let io = |cmds: &[&str]| {
        let mut args = vec!["-f", "raw", uri.as_str()];
        for c in cmds {
            args.push("-c");
            args.push(c);
        }
        sh("qemu-io", &args)
    };
    let out = io(&[
        "write -P 0xab 513 1000",
        "write -P 0xcd 70001 200000",
        "write -P 0x11 1048575 3",
        "read -P 0xab 513 1000",
        "read -P 0xcd 70001 200000",
        "read -P 0x11 1048575 3",
        "read -P 0 0 513",
        "flush",
    ]);
    assert!(!out.contains("Pattern verification failed"), "{out}");
    // Reference image with the same content; qemu-img compare sees no difference.
    let refimg = env.dir.path().join("ref.img");
    let size: u64 = sh("nbdinfo", &["--size", &uri]).trim().parse().unwrap();
    std::fs::File::create(&refimg)
        .unwrap()
        .set_len(size)
        .unwrap();
    sh(
        "qemu-io",
        &[
            "-f",
            "raw",
            refimg.to_str().unwrap(),
            "-c",
            "write -P 0xab 513 1000",
            "-c",
            "write -P 0xcd 70001 200000",
            "-c",
            "write -P 0x11 1048575 3",
        ],
    );
    assert_same_image(&refimg, &uri);
    env.stop(d);
}

#[test]
fn fio_verify_random_and_sequential() {
    if !require_tools(&["fio"]) {
        return;
    }
    let env = Env::new("fio5", 4, MEMBER);
    env.create("5", &["--chunk", "64K"]);
    let d = env.run_all();
    // Sequential 4 KiB and 1 KiB writes at queue depth 16 reach RAID5's stripes as gathered
    // runs (several WRITEs per stripe write); their data and parity must be as right as ever.
    for (rw, bs) in [
        ("randwrite", "4k"),
        ("write", "256k"),
        ("randrw", "16k"),
        ("write", "4k"),
        ("write", "1k"),
    ] {
        let out = sh(
            "fio",
            &[
                "--name=verify",
                "--ioengine=nbd",
                &format!("--uri={}", env.uri()),
                &format!("--rw={rw}"),
                &format!("--bs={bs}"),
                "--size=32m",
                "--iodepth=16",
                "--numjobs=2",
                "--offset_increment=64m",
                "--verify=crc32c",
                "--verify_fatal=1",
                "--verify_state_save=0",
                "--do_verify=1",
                "--group_reporting",
            ],
        );
        assert!(out.contains("err= 0"), "fio {rw}: {out}");
        assert!(!out.contains("verify: bad"), "fio {rw}: {out}");
    }
    env.ok(&["action", "fio5", "check", "--wait"]);
    let checked = env.detail();
    assert_eq!(checked["mismatch_count"], 0, "{checked:#}");
    env.stop(d);
}

#[test]
fn degraded_raid5_serves_correct_data() {
    if !require_tools(&["nbdcopy"]) {
        return;
    }
    let env = Env::new("deg5", 4, MEMBER);
    env.create("5", &["--chunk", "64K"]);
    let src = env.dir.path().join("src.bin");
    random_file(&src, DATA, 7);
    let d = env.run_all();
    sh("nbdcopy", &[src.to_str().unwrap(), &env.uri()]);
    env.stop(d);
    // Member 2 is gone: the array runs degraded and reconstructs its chunks from parity.
    std::fs::remove_file(&env.members[2]).unwrap();
    let survivors: Vec<_> = env
        .members
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != 2)
        .map(|(_, m)| m.clone())
        .collect();
    let d = env.run_with(&["--run"], &survivors);
    let detail: serde_json::Value =
        serde_json::from_str(&env.ok(&["detail", "deg5", "--json"])).unwrap();
    assert_eq!(detail["state"], "degraded", "{detail}");
    let back = env.dir.path().join("back.bin");
    sh("nbdcopy", &[&env.uri(), back.to_str().unwrap()]);
    assert!(
        std::fs::read(&back).unwrap()[..DATA] == std::fs::read(&src).unwrap()[..],
        "degraded read differs"
    );
    // Degraded writes work too.
    let src2 = env.dir.path().join("src2.bin");
    random_file(&src2, DATA, 8);
    sh("nbdcopy", &[src2.to_str().unwrap(), &env.uri()]);
    let back2 = env.dir.path().join("back2.bin");
    sh("nbdcopy", &[&env.uri(), back2.to_str().unwrap()]);
    assert!(std::fs::read(&back2).unwrap()[..DATA] == std::fs::read(&src2).unwrap()[..]);
    env.stop(d);
    assert!(!same_files(&src, &src2));
}
