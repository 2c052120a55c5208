//! md's raid5-cache write journal end to end, with real tools: `create --journal` as
//! `mdadm --examine` reads it; the log as reference §6 describes it, read by a decoder written
//! here from that text (it shares nothing with the `format` crate); kill -9 under fio and a
//! degraded restart; the log device failing (by `fail`, and by real I/O errors); bad usage.

mod common;
mod journal_log;

use common::{
    assert_same_image, canon, mdadm_field, member_state, random_file, require_tools, sh, wait_for,
    Env, FailingFile,
};
use journal_log::{decode_log, log_super, model_parity, newest_pages, Model, PAGE};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};

const MEMBER: u64 = 64 << 20;
const LOG: u64 = 32 << 20;

/// A 4-member RAID5 (64 KiB chunks) with a journal on `log.img` of `log_bytes`.
fn journal_env(name: &str, member_bytes: u64, log_bytes: u64) -> (Env, PathBuf) {
    journal_env_in(name, member_bytes, log_bytes, "write-through")
}

/// [`journal_env`] with the journal in `mode`.
fn journal_env_in(name: &str, member_bytes: u64, log_bytes: u64, mode: &str) -> (Env, PathBuf) {
    let env = Env::new(name, 4, member_bytes);
    let log = env.file("log.img", log_bytes);
    env.create_with_journal(&log, mode);
    (env, log)
}

/// The members, then `log`.
fn with_log(env: &Env, log: &Path) -> Vec<PathBuf> {
    let mut all = env.members.clone();
    all.push(log.to_path_buf());
    all
}

/// `qemu-io -f raw URI -c CMD` (not checked); reads open the export read-only (`-r`), as an
/// array assembled read-only exports it.
fn qemu_io(uri: &str, cmd: &str) -> Output {
    let mut c = Command::new("qemu-io");
    if cmd.starts_with("read") {
        c.arg("-r");
    }
    c.args(["-f", "raw", uri, "-c", cmd])
        .output()
        .expect("spawn qemu-io")
}

fn qemu_io_ok(uri: &str, cmd: &str) {
    let out = qemu_io(uri, cmd);
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && !text.contains("failed"),
        "qemu-io '{cmd}': {text}"
    );
}

/// A write the array must refuse (the journal is gone).
fn assert_write_refused(uri: &str) {
    let out = qemu_io(uri, "write -P 0x99 8M 4k");
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() || text.contains("write failed"),
        "a write went through a read-only array: {text}"
    );
}

#[test]
fn create_with_journal_examines_as_mdadm_does() {
    let Some(mdadm) = testkit::require_tool("mdadm") else {
        return;
    };
    let mdadm = mdadm.to_str().unwrap();
    let (env, log) = journal_env("jexam", MEMBER, LOG);
    let out = sh(mdadm, &["--examine", log.to_str().unwrap()]);
    assert_eq!(mdadm_field(&out, "Device Role"), "Journal", "{out}");
    assert_eq!(mdadm_field(&out, "Feature Map"), "0x200", "{out}");
    assert!(mdadm_field(&out, "Checksum").ends_with("correct"), "{out}");
    for (i, m) in env.members.iter().enumerate() {
        let out = sh(mdadm, &["--examine", m.to_str().unwrap()]);
        assert_eq!(mdadm_field(&out, "Feature Map"), "0x200", "{out}");
        assert_eq!(
            mdadm_field(&out, "Device Role"),
            format!("Active device {i}")
        );
        let e = env.examine(m);
        assert_eq!(e["feature_map"], 0x200, "{e:#}");
        assert!(e["journal_tail_sectors"].is_null(), "{e:#}");
    }
    let e = env.examine(&log);
    assert_eq!(e["device_role"], "journal", "{e:#}");
    assert!(e["role"].is_null(), "{e:#}");
    assert_eq!(e["feature_map"], 0x200, "{e:#}");
    // A new log: journal_tail 0, an empty meta block there (what mdadm writes).
    let img = std::fs::read(&log).unwrap();
    assert_eq!(log_super(&img).journal_tail, 0);
    assert_eq!(e["journal_tail_sectors"], 0, "{e:#}");
    let ring = e["data_size_sectors"].as_u64().unwrap() / 8 * 8;
    assert_eq!(e["journal_log_bytes"], ring * 512, "{e:#}");
    assert_eq!(e["journal_tail_block"]["valid"], true, "{e:#}");
    assert_eq!(e["journal_tail_block"]["pages"], 0, "{e:#}");
    let d = decode_log(&img);
    assert!(d.problems.is_empty(), "{:?}", d.problems);
    assert_eq!(d.units.len(), 1, "{}", d.end);
    assert_eq!(e["journal_tail_block"]["seq"], d.units[0].seq, "{e:#}");
    let text = env.ok(&["examine", log.to_str().unwrap()]);
    assert_eq!(mdadm_field(&text, "Device Role"), "Journal", "{text}");
    assert_eq!(mdadm_field(&text, "Feature Map"), "0x200", "{text}");
    assert!(
        mdadm_field(&text, "Journal Tail").starts_with("0 sectors"),
        "{text}"
    );
}

#[test]
fn log_holds_what_was_written_in_mds_format() {
    if !require_tools(&["nbdcopy", "qemu-io", "qemu-img"]) {
        return;
    }
    let (env, log) = journal_env("jlog", MEMBER, LOG);
    let all = with_log(&env, &log);
    let d = env.run(&all);
    let uri = env.uri();
    // Full stripes from 0, a partial-stripe run, and a write of part of two pages.
    let writes = [
        (0u64, 3usize << 20),
        ((5 << 20) + (12 << 10), 200 << 10),
        ((7 << 20) + 1536, 5000),
    ];
    let mut model = Model::default();
    for (i, &(offset, len)) in writes.iter().enumerate() {
        let f = env.dir.path().join(format!("w{i}.bin"));
        random_file(&f, len, 100 + i as u64);
        if offset == 0 {
            sh("nbdcopy", &[f.to_str().unwrap(), &uri]);
        } else {
            qemu_io_ok(&uri, &format!("write -s {} {offset} {len}", f.display()));
        }
        model.write(offset, &std::fs::read(&f).unwrap());
    }
    let j = env.detail()["journal"].clone();
    assert_eq!(j["device"], canon(&log), "{j:#}");
    assert_eq!(j["mode"], "write-through", "{j:#}");
    assert!(j["used_bytes"].as_u64().unwrap() > 3 << 20, "{j:#}");
    assert!(j["logged_bytes"].as_u64().unwrap() > 3 << 20, "{j:#}");
    assert_eq!(
        j["reclaims"], 0,
        "the tail moved already (test too slow?): {j:#}"
    );
    // No clean stop, so nothing is reclaimed: the log holds every unit.
    d.kill9();

    let img = std::fs::read(&log).unwrap();
    let dec = decode_log(&img);
    assert!(dec.problems.is_empty(), "{:#?}", dec.problems);
    assert!(
        dec.units.len() >= 3,
        "{} units; ended {}",
        dec.units.len(),
        dec.end
    );
    let (data, parity) = newest_pages(&dec);
    for (&sector, page) in &data {
        assert!(
            model.page(sector) == *page,
            "logged data page at array sector {sector} differs"
        );
    }
    for &page in model.0.keys() {
        assert!(
            data.contains_key(&(page * 8)),
            "page {page} written but not in the log"
        );
    }
    assert!(!parity.is_empty(), "no parity logged");
    for (&s, p) in &parity {
        assert!(
            model_parity(&model, s) == *p,
            "logged parity at stripe sector {s} is not the XOR of the data"
        );
    }

    // Canaries: a flipped byte in a data page is a checksum mismatch; one in the second meta
    // block ends the chain there.
    let (first_page_sector, _) = dec
        .units
        .iter()
        .flat_map(|u| &u.payloads)
        .find(|p| p.kind == 0)
        .unwrap()
        .pages[0];
    let sb = log_super(&img);
    let mut bad = img.clone();
    bad[((sb.data_offset + first_page_sector) * 512 + 100) as usize] ^= 0x40;
    let flipped = decode_log(&bad);
    assert!(
        flipped
            .problems
            .iter()
            .any(|p| p.contains("checksum mismatch")
                && p.contains(&format!("log sector {first_page_sector} "))),
        "a flipped page byte went unnoticed: {:?}",
        flipped.problems
    );
    let second_meta = {
        let first = &dec.units[0];
        let pages: u64 = first.payloads.iter().map(|p| p.pages.len() as u64).sum();
        sb.journal_tail + 8 * (1 + pages)
    };
    let mut bad = img.clone();
    bad[((sb.data_offset + second_meta) * 512 + 2000) as usize] ^= 1;
    let cut = decode_log(&bad);
    assert_eq!(
        cut.units.len(),
        1,
        "a flipped meta byte went unnoticed: {}",
        cut.end
    );
    assert!(cut.end.contains("meta checksum mismatch"), "{}", cut.end);

    // The engine's recovery replays the same chain, and the array reads back what was written.
    let d = env.run(&all);
    let j = env.detail()["journal"].clone();
    assert_eq!(
        j["replayed"]["units"],
        dec.units.len() as u64,
        "{j:#}\n{}",
        d.log_text()
    );
    assert!(
        d.log_text().contains("journal recovered"),
        "{}",
        d.log_text()
    );
    let refimg = env.dir.path().join("ref.img");
    let size = env.detail()["size_bytes"].as_u64().unwrap();
    let f = std::fs::File::create(&refimg).unwrap();
    f.set_len(size).unwrap();
    for (&page, bytes) in &model.0 {
        std::os::unix::fs::FileExt::write_all_at(&f, bytes, page * PAGE as u64).unwrap();
    }
    assert_same_image(&refimg, &uri);
    env.stop(d);
}

#[test]
fn journal_missing_at_assembly_starts_read_only() {
    if !require_tools(&["qemu-io"]) {
        return;
    }
    let (env, log) = journal_env("jmiss", MEMBER, 16 << 20);
    let d = env.run(&env.members);
    let det = env.detail();
    assert_eq!(det["state"], "read-only", "{det:#}");
    let why = det["read_only_reason"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(why.contains("journal"), "{det:#}");
    assert!(det["journal"].is_null(), "{det:#}");
    assert_write_refused(&env.uri());
    qemu_io_ok(&env.uri(), "read -P 0 0 64k");
    let text = env.ok(&["detail", &env.name]);
    assert!(
        text.contains("(read-only)") && text.contains("writes refused: "),
        "{text}"
    );
    let log_text = env.stop(d);
    assert!(
        log_text.contains("read-only") && log_text.contains("journal"),
        "{log_text}"
    );
    // With its journal the array is writable again.
    let d = env.run(&with_log(&env, &log));
    let det = env.detail();
    assert!(det["read_only_reason"].is_null(), "{det:#}");
    assert_ne!(det["state"], "read-only", "{det:#}");
    assert_eq!(member_state(&det, &log), "journal", "{det:#}");
    qemu_io_ok(&env.uri(), "write -P 0x11 0 64k");
    env.stop(d);
}

// ---------------------------------------------------------------------------------------------
// kill -9 under fio, then a degraded restart.
// ---------------------------------------------------------------------------------------------

/// fio's random write job over the first 128 MiB, with verify headers; `extra` makes it the
/// crash pass or the verify pass.
fn fio_job(env: &Env, extra: &[&str]) -> Command {
    let mut c = Command::new("fio");
    c.current_dir(env.dir.path()).args([
        "--name=crash",
        "--ioengine=nbd",
        &format!("--uri={}", env.uri()),
        "--rw=randwrite",
        "--bsrange=4k-64k",
        "--size=128m",
        "--iodepth=16",
        "--verify=crc32c",
        "--verify_state_save=0",
    ]);
    c.args(extra);
    c
}

/// Writes fio saw complete (its completion-latency log, one line per I/O: time, latency,
/// direction, length, offset): offset → length. Depending on how it notices the connection
/// dropping, fio reports the writes in flight as failed one by one, or not at all; either way
/// they are missing here, and only these must read back.
fn acknowledged_writes(env: &Env) -> BTreeMap<u64, u64> {
    let log = env.dir.path().join("crash_clat.1.log");
    let text = std::fs::read_to_string(&log).expect("fio's completion log");
    text.lines()
        .filter_map(|l| {
            let f: Vec<u64> = l.split(',').map(|x| x.trim().parse().unwrap()).collect();
            (f[2] == 1).then_some((f[4], f[3]))
        })
        .collect()
}

/// What a verify-only pass found.
struct Verified {
    /// fio's lines about blocks of acknowledged writes that read back wrong.
    acknowledged_bad: Vec<String>,
    /// Bytes fio read and checked.
    bytes: u64,
    text: String,
}

/// "21.4MiB" → bytes.
fn fio_bytes(s: &str) -> u64 {
    let digits: String = s
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '.')
        .collect();
    let unit = &s[digits.len()..];
    let scale = ["B", "KiB", "MiB", "GiB", "TiB"]
        .iter()
        .position(|u| unit.starts_with(u))
        .unwrap_or_else(|| panic!("fio size '{s}'"));
    (digits.parse::<f64>().unwrap() * (1u64 << (10 * scale)) as f64) as u64
}

/// The verify-only pass over the first `ios` writes. Blocks of writes not `acknowledged` may
/// hold old or new data, or a mix; those of acknowledged ones must read back.
fn fio_verify(env: &Env, ios: u64, acknowledged: &BTreeMap<u64, u64>) -> Verified {
    let out = fio_job(
        env,
        &[
            "--do_verify=1",
            "--verify_only=1",
            "--verify_fatal=0",
            "--continue_on_error=verify",
            &format!("--number_ios={ios}"),
        ],
    )
    .output()
    .expect("spawn fio");
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    let acknowledged_bad = text
        .lines()
        .filter(|l| l.starts_with("verify:") || l.contains("verify failed"))
        .filter(|l| {
            let at = l
                .find("requested block: offset=")
                .unwrap_or_else(|| panic!("{l}\n{text}"));
            let offset: u64 = l[at + 24..]
                .split(|c: char| !c.is_ascii_digit())
                .next()
                .unwrap()
                .parse()
                .unwrap();
            acknowledged.contains_key(&offset)
        })
        .map(str::to_string)
        .collect();
    let read = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("READ: bw="))
        .unwrap_or_else(|| panic!("fio verified nothing: {text}"));
    let bytes = fio_bytes(read.split("io=").nth(1).unwrap());
    Verified {
        acknowledged_bad,
        bytes,
        text,
    }
}

/// Run the array and fio's write pass; kill -9 the daemon once `logged_bytes` have gone to
/// the log. Returns the writes fio issued and those it saw complete.
fn crash_under_fio(env: &Env, log: &Path, logged_bytes: u64) -> (u64, BTreeMap<u64, u64>) {
    let d = env.run(&with_log(env, log));
    let mut fio = fio_job(
        env,
        &["--do_verify=0", "--write_lat_log=crash", "--log_offset=1"],
    )
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .expect("spawn fio");
    env.wait_detail("fio writing", 60, |det| {
        if let Ok(Some(st)) = fio.try_wait() {
            panic!("fio ended ({st}) before the daemon was killed");
        }
        det["journal"]["logged_bytes"].as_u64().unwrap_or(0) >= logged_bytes
    });
    d.kill9();
    let out = fio.wait_with_output().unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    let issued: u64 = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("issued rwts: total=0,"))
        .and_then(|r| r.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no issued count: {text}"));
    let acknowledged = acknowledged_writes(env);
    assert!(
        (acknowledged.len() as u64) < issued && acknowledged.len() as u64 >= issued / 2,
        "{} of {issued} writes acknowledged: was fio mid-run?\n{text}",
        acknowledged.len()
    );
    (issued, acknowledged)
}

#[test]
fn kill9_under_fio_then_degraded_restart_without_force() {
    if !require_tools(&["fio"]) {
        return;
    }
    let (env, log) = journal_env("jfio", 96 << 20, LOG);
    // Kill the daemon mid-run, once fio has written a good part of its region and the log
    // (31 MiB) has gone round its ring: recovery then reads a chain that wraps.
    let (issued, acknowledged) = crash_under_fio(&env, &log, 48 << 20);

    // One member is lost with the crash: dirty and degraded, which the journal makes safe.
    let gone = env.dir.path().join("m2.gone");
    std::fs::rename(&env.members[2], &gone).unwrap();
    let mut survivors: Vec<PathBuf> = env.members.iter().filter(|m| m.exists()).cloned().collect();
    survivors.push(log.clone());
    let d = env.run_with(&["--run"], &survivors);
    let det = env.detail();
    assert_eq!(det["state"], "degraded", "{det:#}\n{}", d.log_text());
    assert!(
        d.log_text().contains("journal recovered"),
        "{}",
        d.log_text()
    );
    assert!(
        det["journal"]["replayed"]["units"].as_u64().unwrap() > 1,
        "{det:#}"
    );
    let v = fio_verify(&env, issued, &acknowledged);
    assert!(
        v.acknowledged_bad.is_empty(),
        "acknowledged writes read back wrong:\n{}",
        v.text
    );
    assert!(
        v.bytes >= 16 << 20,
        "fio verified only {} bytes:\n{}",
        v.bytes,
        v.text
    );
    assert!(
        det["journal"]["tail_sector"].as_u64().unwrap() > 0,
        "{det:#}"
    );

    // A fresh member rebuilds the lost one; then redundancy agrees and the data still reads.
    let fresh = env.file("m4.img", 96 << 20);
    env.ok(&["add", &env.name, fresh.to_str().unwrap()]);
    env.wait_detail("rebuild onto the fresh member", 120, |det| {
        member_state(det, &fresh) == "in_sync" && det["sync"]["action"] == "idle"
    });
    assert_eq!(env.action_wait("check"), 0);
    let v = fio_verify(&env, issued, &acknowledged);
    assert!(
        v.acknowledged_bad.is_empty(),
        "after the rebuild:\n{}",
        v.text
    );
    env.stop(d);

    // Canary: the verify pass notices acknowledged data gone (8 MiB of a member zeroed).
    let mut members = survivors;
    members.push(fresh);
    let m0 = &env.members[0];
    let data_offset = env.examine(m0)["data_offset_sectors"].as_u64().unwrap() * 512;
    let f = std::fs::OpenOptions::new().write(true).open(m0).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&f, &vec![0u8; 8 << 20], data_offset).unwrap();
    drop(f);
    let d = env.run(&members);
    let v = fio_verify(&env, issued, &acknowledged);
    assert!(
        !v.acknowledged_bad.is_empty(),
        "zeroed data went unnoticed:\n{}",
        v.text
    );
    env.stop(d);
}

// ---------------------------------------------------------------------------------------------
// The log device failing.
// ---------------------------------------------------------------------------------------------

/// Write-back mode end to end: acknowledged data waits in the log and the cache; kill -9 under
/// fio, a member lost with the crash; the restart (degraded, so write-through) keeps every
/// acknowledged write, a fresh member rebuilds, and `journal-mode` switches back to write-back,
/// which the journal device keeps across a restart.
#[test]
fn write_back_kill9_under_fio_then_degraded_restart() {
    if !require_tools(&["fio"]) {
        return;
    }
    let (env, log) = journal_env_in("jwb", 96 << 20, LOG, "write-back");
    let (issued, acknowledged) = crash_under_fio(&env, &log, 24 << 20);
    std::fs::rename(&env.members[1], env.dir.path().join("m1.gone")).unwrap();
    let mut survivors: Vec<PathBuf> = env.members.iter().filter(|m| m.exists()).cloned().collect();
    survivors.push(log.clone());
    let d = env.run_with(&["--run"], &survivors);
    let det = env.detail();
    assert_eq!(det["state"], "degraded", "{det:#}\n{}", d.log_text());
    assert_eq!(
        det["journal"]["mode"], "write-through",
        "degraded arrays write through"
    );
    let v = fio_verify(&env, issued, &acknowledged);
    assert!(
        v.acknowledged_bad.is_empty(),
        "acknowledged writes read back wrong:\n{}",
        v.text
    );
    let fresh = env.file("m4.img", 96 << 20);
    env.ok(&["add", &env.name, fresh.to_str().unwrap()]);
    env.wait_detail("rebuild onto the fresh member", 120, |det| {
        member_state(det, &fresh) == "in_sync" && det["sync"]["action"] == "idle"
    });
    assert_eq!(env.action_wait("check"), 0);
    env.ok(&["journal-mode", &env.name, "write-back"]);
    assert_eq!(env.detail()["journal"]["mode"], "write-back");
    qemu_io_ok(&env.uri(), "write -P 0x5a 200M 12k");
    env.stop(d);
    let mut members = survivors;
    members.push(fresh);
    let d = env.run(&members);
    assert_eq!(
        env.detail()["journal"]["mode"],
        "write-back",
        "the mode is kept"
    );
    qemu_io_ok(&env.uri(), "read -P 0x5a 200M 12k");
    let v = fio_verify(&env, issued, &acknowledged);
    assert!(
        v.acknowledged_bad.is_empty(),
        "after the rebuild:\n{}",
        v.text
    );
    env.stop(d);
}

/// The state of a running array whose journal has failed: writes refused, reads served, the
/// journal faulty, and why.
fn assert_journal_failed(env: &Env, log: &Path, data_cmd: &str) {
    let det = env.detail();
    assert_eq!(det["state"], "read-only", "{det:#}");
    assert_eq!(member_state(&det, log), "faulty", "{det:#}");
    let why = det["read_only_reason"].as_str().unwrap_or_default();
    assert!(why.contains("journal"), "{det:#}");
    assert_eq!(det["journal"]["failed"], why, "{det:#}");
    assert_write_refused(&env.uri());
    qemu_io_ok(&env.uri(), data_cmd);
    let text = env.ok(&["detail", &env.name]);
    assert!(text.contains("(read-only)"), "{text}");
    assert!(text.contains(&format!("journal FAILED: {why}")), "{text}");
}

/// After a stop, the members with the failed log: read-only, and the daemon says why.
fn assert_restart_read_only(env: &Env, log: &Path, data_cmd: &str) {
    let d = env.run(&with_log(env, log));
    let det = env.detail();
    assert_eq!(det["state"], "read-only", "{det:#}");
    let why = det["read_only_reason"].as_str().unwrap_or_default();
    assert!(why.contains("journal"), "{det:#}");
    let said = d.log_text();
    assert!(
        said.contains("read-only") && said.contains("journal"),
        "the daemon did not say it starts read-only for want of its journal:\n{said}"
    );
    assert_write_refused(&env.uri());
    qemu_io_ok(&env.uri(), data_cmd);
    env.stop(d);
}

/// Wait for the resync a new or dropped journal starts, to finish.
fn wait_resynced(env: &Env) -> serde_json::Value {
    env.wait_detail("the resync after the journal change", 60, |det| {
        det["sync"]["action"] == "idle" && det["sync"]["last_action"] == "resync"
    })
}

#[test]
fn journal_failed_by_administrator_then_dropped() {
    let Some(mdadm) = testkit::require_tool("mdadm") else {
        return;
    };
    if !require_tools(&["qemu-io"]) {
        return;
    }
    let (env, log) = journal_env("jfail", MEMBER, 16 << 20);
    let d = env.run(&with_log(&env, &log));
    qemu_io_ok(&env.uri(), "write -P 0x5a 0 1M");
    env.ok(&["fail", &env.name, log.to_str().unwrap()]);
    assert_journal_failed(&env, &log, "read -P 0x5a 0 1M");
    env.stop(d);
    assert_restart_read_only(&env, &log, "read -P 0x5a 0 1M");

    // Without the journal from now on: writable, resynced, the data kept.
    let d = env.run_with(&["--drop-journal"], &env.members);
    let det = wait_resynced(&env);
    assert_eq!(det["consistency_policy"], "resync", "{det:#}");
    assert!(det["journal"].is_null(), "{det:#}");
    assert!(det["read_only_reason"].is_null(), "{det:#}");
    assert!(d.log_text().contains("resync"), "{}", d.log_text());
    qemu_io_ok(&env.uri(), "read -P 0x5a 0 1M");
    qemu_io_ok(&env.uri(), "write -P 0x6b 1M 1M");
    assert_eq!(env.action_wait("check"), 0);
    env.stop(d);
    for m in &env.members {
        let out = sh(mdadm.to_str().unwrap(), &["--examine", m.to_str().unwrap()]);
        assert_eq!(mdadm_field(&out, "Feature Map"), "0x0", "{out}");
    }
}

#[test]
fn journal_io_errors_then_new_journal() {
    let Some(mdadm) = testkit::require_tool("mdadm") else {
        return;
    };
    if !require_tools(&["qemu-io", "nbdkit", "nbdfuse", "fusermount3", "/dev/fuse"]) {
        return;
    }
    let env = Env::new("jeio", 4, MEMBER);
    let failing = FailingFile::new(&env, "log", 16 << 20);
    let log = failing.path();
    env.create_with_journal(&log, "write-through");
    let d = env.run(&with_log(&env, &log));
    qemu_io_ok(&env.uri(), "write -P 0x3c 0 1M");
    failing.fail(true);
    // The first write after the log breaks is refused; from then on the array is read-only.
    assert_write_refused(&env.uri());
    assert_journal_failed(&env, &log, "read -P 0x3c 0 1M");
    assert!(
        d.log_text().contains("Input/output error"),
        "{}",
        d.log_text()
    );
    env.stop(d);
    failing.fail(false);
    assert_restart_read_only(&env, &log, "read -P 0x3c 0 1M");

    // A new journal: writable again, the whole array resynced, mdadm sees the new log.
    let fresh = env.file("log2.img", 16 << 20);
    let d = env.run_with(&["--add-journal", fresh.to_str().unwrap()], &env.members);
    let det = wait_resynced(&env);
    assert_eq!(det["journal"]["device"], canon(&fresh), "{det:#}");
    assert!(det["read_only_reason"].is_null(), "{det:#}");
    assert_eq!(member_state(&det, &fresh), "journal", "{det:#}");
    qemu_io_ok(&env.uri(), "read -P 0x3c 0 1M");
    qemu_io_ok(&env.uri(), "write -P 0x4d 1M 1M");
    env.stop(d);
    let out = sh(
        mdadm.to_str().unwrap(),
        &["--examine", fresh.to_str().unwrap()],
    );
    assert_eq!(mdadm_field(&out, "Device Role"), "Journal", "{out}");
    assert_eq!(mdadm_field(&out, "Feature Map"), "0x200", "{out}");
    // And it assembles with it as any journal array does.
    let d = env.run(&with_log(&env, &fresh));
    let det = env.detail();
    assert!(det["read_only_reason"].is_null(), "{det:#}");
    qemu_io_ok(&env.uri(), "read -P 0x4d 1M 1M");
    env.stop(d);
}

// ---------------------------------------------------------------------------------------------
// Bad usage.
// ---------------------------------------------------------------------------------------------

#[test]
fn journal_bad_usage_is_refused_and_writes_nothing() {
    let env = Env::new("jbad", 4, MEMBER);
    let log = env.file("log.img", 16 << 20);
    let log_arg = log.to_str().unwrap().to_string();
    let members = env.member_args();
    let create = |args: &[&str], n: usize| {
        let mut all: Vec<&str> = vec!["create"];
        all.extend_from_slice(args);
        all.extend(members[..n].iter().map(String::as_str));
        let out = env.ironraid(&all);
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        )
    };
    let (code, err) = create(&["--level", "5", "--consistency-policy", "journal"], 4);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("--journal"), "{err}");
    let (code, err) = create(&["--level", "5", "--journal", &log_arg], 4);
    assert_eq!(code, Some(2), "{err}");
    let (code, err) = create(
        &[
            "--level",
            "1",
            "--consistency-policy",
            "journal",
            "--journal",
            &log_arg,
        ],
        2,
    );
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("raid1") && err.contains("journal"), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "one line on stderr: {err}");
    let (code, err) = create(&["--level", "5", "--journal-mode", "write-back"], 4);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("--journal-mode"), "{err}");
    // Nothing was written: no superblock anywhere.
    for p in env.members.iter().chain([&log]) {
        let out = env.ironraid(&["examine", p.to_str().unwrap()]);
        assert_eq!(
            out.status.code(),
            Some(1),
            "{} got a superblock",
            p.display()
        );
    }
}

/// After a crash, a degraded journal array started with `run --drop-journal` either replays
/// the old log first (when it is given) or is refused without `--force` (the superblocks of a
/// journal array do not say whether it crashed): never wrong acknowledged data. (Found by this
/// suite: dropping used to skip both, and about one run in three read zeros back.)
#[test]
fn dropping_the_journal_of_a_crashed_degraded_array_keeps_acknowledged_data() {
    if !require_tools(&["fio"]) {
        return;
    }
    for attempt in 0..8 {
        let (env, log) = journal_env("jdrop", 96 << 20, LOG);
        let (issued, acknowledged) = crash_under_fio(&env, &log, 16 << 20);
        std::fs::rename(&env.members[2], env.dir.path().join("m2.gone")).unwrap();
        let mut given: Vec<PathBuf> = env.members.iter().filter(|m| m.exists()).cloned().collect();
        given.push(log.clone());
        let d = match env.try_run_with(&["--drop-journal", "--run"], &given) {
            Ok(d) => d,
            Err(refused) => {
                assert!(
                    refused.contains("force"),
                    "refused without saying why: {refused}"
                );
                continue;
            }
        };
        let v = fio_verify(&env, issued, &acknowledged);
        assert!(
            v.acknowledged_bad.is_empty(),
            "attempt {attempt}: acknowledged writes read back wrong after --drop-journal:\n{}\n{}",
            v.acknowledged_bad.join("\n"),
            d.log_text()
        );
        env.stop(d);
    }
}

// ---------------------------------------------------------------------------------------------
// Power cuts (issue 21, items 2 and 5): members and log that keep only what was flushed.
// ---------------------------------------------------------------------------------------------

/// A disk with a volatile write cache: a file served by nbdkit through its cache filter in
/// write-back mode (writes wait in the filter's cache until a flush or an FUA write), mounted
/// as a file by nbdfuse. A power cut kills nbdkit: its cache is gone, the file keeps what was
/// flushed to it.
struct Volatile {
    backing: PathBuf,
    sock: PathBuf,
    mnt: PathBuf,
    tmp: PathBuf,
    nbdkit: Option<Child>,
    nbdfuse: Option<Child>,
}

impl Volatile {
    fn new(env: &Env, name: &str, bytes: u64) -> Volatile {
        let base = env.dir.path();
        let mut v = Volatile {
            backing: env.file(&format!("{name}.backing"), bytes),
            sock: base.join(format!("{name}.sock")),
            mnt: base.join(format!("{name}.fuse")),
            tmp: base.join(format!("{name}.cache")),
            nbdkit: None,
            nbdfuse: None,
        };
        std::fs::create_dir_all(&v.mnt).unwrap();
        std::fs::create_dir_all(&v.tmp).unwrap();
        v.power_on();
        v
    }

    /// The device, as the array sees it.
    fn path(&self) -> PathBuf {
        self.mnt.join("nbd")
    }

    fn power_on(&mut self) {
        let _ = std::fs::remove_file(&self.sock);
        let log = std::fs::File::create(self.tmp.join("nbdkit.log")).unwrap();
        self.nbdkit = Some(
            Command::new("nbdkit")
                .env("TMPDIR", &self.tmp)
                .args(["-f", "-U", self.sock.to_str().unwrap(), "--filter=cache"])
                .arg("file")
                .arg(format!("file={}", self.backing.display()))
                .args(["cache=writeback", "cache-on-read=false"])
                .stdout(Stdio::null())
                .stderr(log)
                .spawn()
                .expect("spawn nbdkit"),
        );
        wait_for(&self.sock);
        self.nbdfuse = Some(
            Command::new("nbdfuse")
                .arg(&self.mnt)
                .arg(format!("nbd+unix:///?socket={}", self.sock.display()))
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("spawn nbdfuse"),
        );
        wait_for(&self.path());
    }

    /// The power goes: what nbdkit's cache held is lost.
    fn cut(&mut self) {
        if let Some(mut k) = self.nbdkit.take() {
            let _ = k.kill();
            let _ = k.wait();
        }
    }

    fn unmount(&mut self) {
        let _ = Command::new("fusermount3")
            .args(["-u", "-z"])
            .arg(&self.mnt)
            .status();
        if let Some(mut f) = self.nbdfuse.take() {
            let _ = f.kill();
            let _ = f.wait();
        }
    }
}

impl Drop for Volatile {
    fn drop(&mut self) {
        self.cut();
        self.unmount();
    }
}

/// Four volatile members and a volatile log, on one power supply.
struct Machine {
    members: Vec<Volatile>,
    log: Volatile,
}

impl Machine {
    /// A 4-member RAID5 (64 KiB chunks) with its journal in `mode`, on volatile devices.
    fn new(name: &str, mode: &str) -> Option<(Env, Machine)> {
        if !require_tools(&[
            "nbdkit",
            "nbdfuse",
            "fusermount3",
            "/dev/fuse",
            "qemu-io",
            "nbdcopy",
        ]) {
            return None;
        }
        let mut env = Env::new(name, 0, 0);
        let members: Vec<Volatile> = (0..4)
            .map(|i| Volatile::new(&env, &format!("m{i}"), MEMBER))
            .collect();
        let log = Volatile::new(&env, "log", 16 << 20);
        env.members = members.iter().map(Volatile::path).collect();
        env.create_with_journal(&log.path(), mode);
        Some((env, Machine { members, log }))
    }

    fn all(&self) -> Vec<PathBuf> {
        let mut all: Vec<PathBuf> = self.members.iter().map(Volatile::path).collect();
        all.push(self.log.path());
        all
    }

    /// Power cut under a running daemon: every device loses what it was not asked to keep,
    /// then the daemon dies with the machine; then power comes back.
    fn cut(&mut self, d: common::Daemon) {
        for v in self
            .members
            .iter_mut()
            .chain(std::iter::once(&mut self.log))
        {
            v.cut();
        }
        d.kill9();
        for v in self
            .members
            .iter_mut()
            .chain(std::iter::once(&mut self.log))
        {
            v.unmount();
            v.power_on();
        }
    }
}

/// qemu-io on one connection running every command in `cmds`; its output.
fn qemu_io_many(uri: &str, read_only: bool, cmds: &[String]) -> String {
    let mut c = Command::new("qemu-io");
    if read_only {
        c.arg("-r");
    }
    c.args(["-f", "raw", uri]);
    for cmd in cmds {
        c.args(["-c", cmd]);
    }
    let out = c.output().expect("spawn qemu-io");
    String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr)
}

/// 256 FUA writes of 64 KiB, each with its own pattern, as qemu-io commands (`op` is
/// `write -f` or `read`).
fn fua_pieces(op: &str) -> Vec<String> {
    (0..256u64)
        .map(|i| {
            let at = (i * 37 % 256) * (64 << 10);
            format!("{op} -P {} {at} 64k", 1 + i % 250)
        })
        .collect()
}

fn pieces_wrong(out: &str) -> usize {
    out.matches("Pattern verification failed").count()
}

/// Item 5: acknowledged FUA writes, then a power cut: the members lack what the log holds. A
/// read-only start must not serve the older bytes: it refuses and says to start normally,
/// which replays the log; read-only after that serves everything.
#[test]
fn read_only_start_after_a_power_cut_never_serves_older_data() {
    let Some((env, mut machine)) = Machine::new("jrocut", "write-through") else {
        return;
    };
    let d = env.run(&machine.all());
    let out = qemu_io_many(&env.uri(), false, &fua_pieces("write -f"));
    assert!(!out.contains("failed"), "{out}");
    machine.cut(d);

    match env.try_run_with(&["--read-only"], &machine.all()) {
        Ok(d) => {
            let out = qemu_io_many(&env.uri(), true, &fua_pieces("read"));
            assert_eq!(
                pieces_wrong(&out),
                0,
                "a read-only start served older data than was acknowledged:\n{out}"
            );
            env.stop(d);
        }
        Err(log) => assert!(
            log.contains("without --read-only") && log.contains("journal"),
            "the refusal must say what to do:\n{log}"
        ),
    }
    let d = env.run(&machine.all());
    let det = env.detail();
    assert!(
        det["journal"]["replayed"]["pages"].as_u64().unwrap() > 0,
        "{det:#}"
    );
    let out = qemu_io_many(&env.uri(), true, &fua_pieces("read"));
    assert_eq!(pieces_wrong(&out), 0, "after the replay:\n{out}");
    env.stop(d);
    let d = env.run_with(&["--read-only"], &machine.all());
    let out = qemu_io_many(&env.uri(), true, &fua_pieces("read"));
    assert_eq!(
        pieces_wrong(&out),
        0,
        "read-only after a clean stop:\n{out}"
    );
    env.stop(d);
}

/// Item 2: write-back, 16 MiB copied and flushed, the log failed by the administrator, the
/// power cut right after `fail` returns: nothing flushed is lost, and `detail` said the log is
/// failed (its cache written out) before the cut.
#[test]
fn write_back_log_failed_then_power_cut_keeps_flushed_data() {
    let Some((env, mut machine)) = Machine::new("jwbcut", "write-back") else {
        return;
    };
    let src = env.dir.path().join("src.img");
    random_file(&src, 16 << 20, 21);
    let d = env.run(&machine.all());
    sh("nbdcopy", &["--flush", src.to_str().unwrap(), &env.uri()]);
    let log = machine.log.path();
    env.ok(&["fail", &env.name, log.to_str().unwrap()]);
    let det = env.detail();
    machine.cut(d);
    assert_eq!(det["journal"]["state"], "failed", "{det:#}");
    assert_eq!(det["journal"]["cache_bytes"], 0, "{det:#}");
    assert_eq!(det["state"], "read-only", "{det:#}");

    // The log is recorded faulty: the array starts read-only, with every flushed byte.
    let d = env.run(&machine.all());
    let back = env.dir.path().join("back.img");
    sh("nbdcopy", &[&env.uri(), back.to_str().unwrap()]);
    let (a, b) = (std::fs::read(&src).unwrap(), std::fs::read(&back).unwrap());
    let lost: Vec<usize> = (0..a.len() / (64 << 10))
        .filter(|&i| a[i << 16..(i + 1) << 16] != b[i << 16..(i + 1) << 16])
        .collect();
    assert!(
        lost.is_empty(),
        "{} flushed 64 KiB pieces lost (first at {:?})",
        lost.len(),
        lost.first().map(|i| i << 16)
    );
    env.stop(d);
}
