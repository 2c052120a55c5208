//! `ironraid generate DIR` (hidden): the man pages and shell completions packages ship,
//! made from the clap definitions so they never disagree with `--help`.
//!
//! Writes `DIR/man/ironraid.8` and one `ironraid-SUBCOMMAND.8` per subcommand (section 8, as
//! mdadm's), and `DIR/completions/ironraid.bash`, `_ironraid` (zsh) and `ironraid.fish`.

use anyhow::Context;
use clap_complete::Shell;
use std::path::Path;

pub fn generate(cmd: clap::Command, dir: &Path) -> anyhow::Result<()> {
    let man = dir.join("man");
    let completions = dir.join("completions");
    for d in [&man, &completions] {
        std::fs::create_dir_all(d).with_context(|| format!("cannot create {}", d.display()))?;
    }
    let mut cmd = cmd.disable_help_subcommand(true);
    cmd.build();
    man_pages(&cmd, &man)?;
    for (shell, file) in [
        (Shell::Bash, "ironraid.bash"),
        (Shell::Zsh, "_ironraid"),
        (Shell::Fish, "ironraid.fish"),
    ] {
        let path = completions.join(file);
        let mut f = std::fs::File::create(&path)
            .with_context(|| format!("cannot create {}", path.display()))?;
        clap_complete::generate(shell, &mut cmd.clone(), "ironraid", &mut f);
    }
    Ok(())
}

fn man_pages(cmd: &clap::Command, dir: &Path) -> anyhow::Result<()> {
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        man_pages(sub, dir)?;
    }
    clap_mangen::Man::new(cmd.clone())
        .section("8")
        .manual("System Administration")
        .generate_to(dir)
        .with_context(|| format!("cannot write a man page into {}", dir.display()))?;
    Ok(())
}
