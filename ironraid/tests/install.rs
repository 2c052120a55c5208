//! The install path (issue 26 item 9): man pages and completions generated from the clap
//! definitions, and the Debian package (`cargo deb`, as `scripts/deb.sh` builds it) unpacked
//! into a scratch root with `dpkg -x` and run from there.

mod common;
use common::*;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The subcommands `ironraid --help` lists.
fn subcommands() -> Vec<String> {
    let help = sh(BIN, &["--help"]);
    help.split("Commands:")
        .nth(1)
        .unwrap()
        .split("Options:")
        .next()
        .unwrap()
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|w| *w != "help")
        .map(str::to_string)
        .collect()
}

/// Ask bash's completion function what follows `words` (the last one being completed).
fn bash_complete(script: &Path, words: &[&str]) -> String {
    let cword = words.len() - 1;
    let code = format!(
        "source {}; COMP_WORDS=({}); COMP_CWORD={cword}; _ironraid ironraid {} {}; echo \"${{COMPREPLY[@]}}\"",
        script.display(),
        words.join(" "),
        words[cword],
        words[cword - 1]
    );
    sh("bash", &["-c", &code])
}

#[test]
fn generate_writes_a_man_page_per_subcommand_and_completions() {
    if !require_tools(&["bash"]) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    sh(BIN, &["generate", dir.path().to_str().unwrap()]);
    let subs = subcommands();
    assert!(
        subs.len() > 10 && subs.iter().any(|s| s == "run"),
        "{subs:?}"
    );
    assert!(!subs.iter().any(|s| s == "generate"), "generate is hidden");
    for sub in subs
        .iter()
        .map(|s| format!("ironraid-{s}"))
        .chain(["ironraid".into()])
    {
        let page = dir.path().join("man").join(format!("{sub}.8"));
        let text =
            std::fs::read_to_string(&page).unwrap_or_else(|e| panic!("{}: {e}", page.display()));
        assert!(
            text.contains(&format!("\n.TH {sub} 8 ")),
            "{sub}: {}",
            &text[..200.min(text.len())]
        );
    }
    let run = std::fs::read_to_string(dir.path().join("man/ironraid-run.8")).unwrap();
    assert!(
        run.contains("\\-\\-scan") && run.contains("\\-\\-metrics"),
        "{run}"
    );
    let completions = dir.path().join("completions");
    let bash = completions.join("ironraid.bash");
    assert_eq!(bash_complete(&bash, &["ironraid", "ru"]).trim(), "run");
    assert_eq!(
        bash_complete(&bash, &["ironraid", "run", "--sc"]).trim(),
        "--scan"
    );
    let zsh = std::fs::read_to_string(completions.join("_ironraid")).unwrap();
    assert!(zsh.starts_with("#compdef ironraid"), "{zsh}");
    let fish = std::fs::read_to_string(completions.join("ironraid.fish")).unwrap();
    assert!(fish.contains("complete -c ironraid"), "{fish}");
}

/// `cargo deb` as `scripts/deb.sh` runs it, minus the build: the binary under test is the one
/// packaged.
fn build_deb(out: &Path) -> PathBuf {
    let release = Path::new(BIN).parent().unwrap();
    let generated = release.join("generated");
    let _ = std::fs::remove_dir_all(&generated);
    sh(BIN, &["generate", generated.to_str().unwrap()]);
    let script =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/deb.sh"))
            .unwrap();
    assert!(
        script.contains("cargo deb -p ironraid --no-build")
            && script.contains("generate \"$target_dir/release/generated\""),
        "{script}"
    );
    let deb = out.join("ironraid.deb");
    let st = Command::new("cargo")
        .args([
            "deb",
            "-p",
            "ironraid",
            "--no-build",
            "--output",
            deb.to_str().unwrap(),
        ])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .status()
        .unwrap();
    assert!(st.success(), "cargo deb: {st}");
    deb
}

#[test]
fn deb_unpacked_into_a_scratch_root_runs_and_ships_units_pages_completions_config() {
    if !require_tools(&["cargo-deb", "dpkg-deb", "readelf"]) {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let deb = build_deb(tmp.path());
    let root = tmp.path().join("root");
    sh(
        "dpkg-deb",
        &["-x", deb.to_str().unwrap(), root.to_str().unwrap()],
    );
    let bin = root.join("usr/bin/ironraid");
    let version = sh(bin.to_str().unwrap(), &["--version"]);
    assert_eq!(
        version.trim(),
        format!("ironraid {}", env!("CARGO_PKG_VERSION"))
    );
    let sections = sh("readelf", &["-S", "-W", bin.to_str().unwrap()]);
    assert!(
        !sections.contains(".debug_info"),
        "the shipped binary carries debug info"
    );
    assert!(
        sections.contains(".symtab"),
        "the symbol table stays (perf names functions)"
    );
    for f in [
        "lib/systemd/system/ironraid@.service",
        "lib/systemd/system/ironraid-monitor.service",
        "lib/systemd/system/ironraid-check.service",
        "lib/systemd/system/ironraid-check.timer",
        "usr/share/man/man8/ironraid.8",
        "usr/share/man/man8/ironraid-run.8",
        "usr/share/bash-completion/completions/ironraid",
        "usr/share/zsh/vendor-completions/_ironraid",
        "usr/share/fish/vendor_completions.d/ironraid.fish",
        "usr/share/doc/ironraid/README.md",
        "usr/share/doc/ironraid/commands.md",
        "usr/share/doc/ironraid/design.md",
    ] {
        assert!(root.join(f).is_file(), "{f} is not in the package");
    }
    let info = sh("dpkg-deb", &["-I", deb.to_str().unwrap()]);
    assert!(
        info.contains("Package: ironraid") && info.contains("Section: admin"),
        "{info}"
    );
    // The packaged binary does real work from the scratch root: an array over files, and the
    // example config parses.
    let env = Env::new("pkg", 2, 16 << 20);
    let mut c = Command::new(&bin);
    c.env("IRONRAID_RUNDIR", env.rundir());
    let out = c
        .args(["create", "--level", "1", "--name", "pkg", "--assume-clean"])
        .args(&env.members)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let uuid = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let scan = sh(
        bin.to_str().unwrap(),
        &["examine", "--scan", env.members[0].to_str().unwrap()],
    );
    assert_eq!(
        scan.trim(),
        format!("ARRAY UUID={uuid} name=pkg level=raid1 num-devices=2")
    );
    let example = root.join("usr/share/doc/ironraid/examples/ironraid.conf");
    sh(
        bin.to_str().unwrap(),
        &["examine", "--scan", "--config", example.to_str().unwrap()],
    );
}
