//! `zbd`: create, inspect, check and benchmark compressed block volumes.
//! Thin: parse arguments, dispatch to one module per subcommand, print one error line.

mod commands;
mod dedup_index;
mod log;
mod metrics;
mod notify;
mod sample;
mod served;
mod target;
mod thin;
mod volumes;

use clap::{CommandFactory, Parser, Subcommand};
use std::io::Write;
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "zbd",
    version,
    about = "Transparent block-level compression for any Linux filesystem"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Create a volume on a new sparse file or an existing block device.
    Create(commands::create::Args),
    /// Show a volume's space, savings and I/O statistics.
    Stat(commands::stat::Args),
    /// Verify metadata and every stored block's checksum.
    Check(commands::check::Args),
    /// Verify every stored block at a bounded rate, through the server if the volume is served.
    Scrub(commands::scrub::Args),
    /// Offline cleaning: compact every extent with dead space.
    Compact(commands::compact::Args),
    /// Offline deduplication: blocks equal to an earlier block share its stored copy
    /// (volumes created with --metadata-pages).
    Dedup(commands::dedup::Args),
    /// Named block devices in one volume: create, list, delete (served as NBD exports).
    Device(commands::device::Args),
    /// Snapshots of a device: create (O(1)), list, delete.
    Snapshot(commands::snapshot::Args),
    /// Make a writable device from a snapshot, sharing its blocks.
    Clone(commands::snapshot::CloneArgs),
    /// Stop listing a clone's origin. A clone never depends on its snapshot (deleting the
    /// snapshot keeps every block the clone shares), so nothing is copied.
    Flatten(commands::snapshot::FlattenArgs),
    /// Roll a device back to one of its snapshots.
    Rollback(commands::snapshot::RollbackArgs),
    /// The byte ranges where two devices or snapshots of a volume differ, as JSON.
    Diff(commands::snapshot::DiffArgs),
    /// Change what opens of a volume do by default (offline): dedup=on|off, dict=on|off.
    Set(commands::set::Args),
    /// Benchmarks: codecs on 4 KiB blocks, engine throughput.
    Bench(commands::bench::Args),
    /// Estimate what deduplication and compression would save on files, trees or images.
    Estimate(commands::estimate::Args),
    /// Write a file into a volume and read it back (used by scripts/demo.sh).
    Copy(commands::copy::Args),
    /// Serve a volume over NBD until SIGTERM/SIGINT.
    Serve(commands::serve::ServeArgs),
    /// Make a block device of a served volume (kernel nbd-client, or nbdfuse + loop device).
    Attach(commands::attach::AttachArgs),
    /// Undo `zbd attach`.
    Detach(commands::detach::DetachArgs),
    /// Every volume served on this host, with its socket, size, savings and state.
    List(commands::list::Args),
    /// Write the manual pages (zbd.1, zbd-SUBCOMMAND.1) into DIR.
    #[command(hide = true)]
    GenMan(commands::docs::ManArgs),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell).
    #[command(hide = true)]
    Completions(commands::docs::CompletionsArgs),
    /// Grow a volume's logical size or data area, offline or served, up to the room it was created
    /// with.
    Grow(commands::grow::Args),
    /// Upgrade a format 2 volume to the current format (offline, in place).
    Upgrade(commands::upgrade::Args),
    /// Break the lock a crashed server left on a rados:POOL/NAME volume (fences it first).
    Unlock(commands::unlock::Args),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Create(a) => commands::create::run(a),
        Command::Stat(a) => commands::stat::run(a),
        Command::Check(a) => commands::check::run(a),
        Command::Scrub(a) => commands::scrub::run(a),
        Command::Compact(a) => commands::compact::run(a),
        Command::Dedup(a) => commands::dedup::run(a),
        Command::Set(a) => commands::set::run(a),
        Command::Device(a) => commands::device::run(a),
        Command::Snapshot(a) => commands::snapshot::run(a),
        Command::Clone(a) => commands::snapshot::clone(a),
        Command::Flatten(a) => commands::snapshot::flatten(a),
        Command::Rollback(a) => commands::snapshot::rollback(a),
        Command::Diff(a) => commands::snapshot::diff(a),
        Command::Bench(a) => commands::bench::run(a),
        Command::Copy(a) => commands::copy::run(a),
        Command::Estimate(a) => commands::estimate::run(a),
        Command::Serve(a) => commands::serve::run(a),
        Command::Attach(a) => commands::attach::run(a),
        Command::Detach(a) => commands::detach::run(a),
        Command::List(a) => commands::list::run(a),
        Command::GenMan(a) => commands::docs::man(Cli::command(), a),
        Command::Completions(a) => commands::docs::completions(Cli::command(), a),
        Command::Unlock(a) => commands::unlock::run(a),
        Command::Grow(a) => commands::grow::run(a),
        Command::Upgrade(a) => commands::upgrade::run(a),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            log::flush(std::time::Duration::from_secs(1));
            let _ = writeln!(std::io::stderr(), "zbd: error: {}", error_line(&e));
            ExitCode::from(1)
        }
    }
}

/// The error and its causes on one line, leaving out a cause whose text the line already holds
/// (an error that prints its source in its own message, as thiserror's `{source}` does).
fn error_line(error: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in error.chain() {
        let text = cause.to_string();
        if line.contains(&text) {
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(&text);
    }
    line
}
