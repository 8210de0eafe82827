//! External tools: finding them and running them with their output in the panic message.

use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Output};
use std::time::{Duration, Instant};

/// Some(path) if the tool is installed; otherwise prints why the test is skipped.
pub fn tool(name: &str) -> Option<PathBuf> {
    let found = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join(name))
            .find(|candidate| candidate.is_file())
    });
    if found.is_none() {
        eprintln!("SKIPPED: `{name}` is not installed (run scripts/install-deps.sh)");
    }
    found
}

/// Some(()) if every tool is installed; otherwise prints why the test is skipped.
pub fn tools(names: &[&str]) -> Option<()> {
    names.iter().try_for_each(|name| tool(name).map(drop))
}

/// Runs a command (stdin closed), panics with its output if it fails.
pub fn run(command: &mut Command) -> Output {
    let output = command
        .output()
        .unwrap_or_else(|e| panic!("cannot run {command:?}: {e}"));
    if !output.status.success() {
        panic!(
            "{command:?} failed ({}):\nstdout:\n{}\nstderr:\n{}",
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }
    output
}

pub fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// Sends SIGTERM to `child` and waits up to `deadline` for it to exit; past it the child is
/// killed and reaped, and the answer is None.
pub fn terminate(mut child: Child, deadline: Duration) -> Option<ExitStatus> {
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    wait_or_kill(&mut child, deadline)
}

/// Waits up to `deadline` for `child` to exit; past it the child is killed and reaped, and
/// the answer is None.
pub fn wait_or_kill(child: &mut Child, deadline: Duration) -> Option<ExitStatus> {
    let until = Instant::now() + deadline;
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return Some(status),
            Ok(None) if Instant::now() < until => std::thread::sleep(Duration::from_millis(20)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return None;
            }
        }
    }
}
