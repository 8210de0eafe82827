//! Hidden subcommands that generate the manual and shell completions from the clap definition,
//! so they never drift from the flags: `zbd gen-man DIR` writes `zbd.1` and one page per
//! subcommand (`zbd-serve.1`, ...); `zbd completions bash|zsh|fish|...` prints a completion
//! script. `make man completions` (and the Debian package) call them.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result};

#[derive(clap::Args, Debug)]
pub struct ManArgs {
    /// Directory to write the pages into (created if missing).
    pub dir: PathBuf,
}

#[derive(clap::Args, Debug)]
pub struct CompletionsArgs {
    /// Shell to complete for.
    #[arg(value_enum)]
    pub shell: clap_complete::Shell,
}

fn write_page(command: clap::Command, path: &Path) -> Result<()> {
    let mut page = Vec::new();
    clap_mangen::Man::new(command)
        .render(&mut page)
        .with_context(|| format!("cannot render {}", path.display()))?;
    std::fs::write(path, page).with_context(|| format!("cannot write {}", path.display()))
}

/// Writes `zbd.1` and `zbd-SUB.1` for every visible subcommand into `args.dir`.
pub fn man(mut command: clap::Command, args: ManArgs) -> Result<ExitCode> {
    std::fs::create_dir_all(&args.dir)
        .with_context(|| format!("cannot create {}", args.dir.display()))?;
    command.build();
    let name = command.get_name().to_string();
    let subcommands: Vec<clap::Command> = command
        .get_subcommands()
        .filter(|sub| !sub.is_hide_set() && sub.get_name() != "help")
        .cloned()
        .collect();
    write_page(command, &args.dir.join(format!("{name}.1")))?;
    for sub in subcommands {
        let page_name = format!("{name}-{}", sub.get_name());
        let path = args.dir.join(format!("{page_name}.1"));
        write_page(sub.name(page_name), &path)?;
    }
    Ok(ExitCode::SUCCESS)
}

/// Prints the completion script for `args.shell`.
pub fn completions(mut command: clap::Command, args: CompletionsArgs) -> Result<ExitCode> {
    let name = command.get_name().to_string();
    clap_complete::generate(args.shell, &mut command, name, &mut std::io::stdout());
    Ok(ExitCode::SUCCESS)
}
