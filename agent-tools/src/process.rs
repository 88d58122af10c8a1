//! Processes that die with the `agent` that started them (the `process` feature): the
//! `shell` built-in's commands, command hooks and answer checks, and MCP servers.

use std::process::Stdio;

/// A process group that dies when this value is dropped, and when this process dies
/// first, even by `kill -9`, which runs none of our code.
///
/// The group is led by a watcher (`sh`, the POSIX shell, so that an MCP server needs no
/// `bash`) that reads a pipe this process holds until the pipe closes, then kills its
/// whole group, itself included. The pipe closes when the `Watcher` is dropped (the group
/// is then also killed at once, from here) or when this process dies. A command started
/// into the group ([`Watcher::group`], given to `process_group`) is killed with it, and
/// everything it started that stayed in its group; a process that leaves the group (a
/// daemon's `setsid`) is out of reach. Without it, a command whose run was killed went
/// on, and could do its effect after the run's recovery had looked for it and been told
/// to run the call again.
///
/// The pipe is not inherited by other children (Rust opens it close-on-exec), so only
/// this process keeps the group alive.
pub(crate) struct Watcher {
    /// The watcher's process id, which is its group's.
    group: i32,
    /// Closed when dropped or when this process dies.
    _pipe: tokio::process::ChildStdin,
    /// Not waited for while held, so its id, the group's, is not reused; reaped by tokio
    /// once dropped.
    _process: tokio::process::Child,
}

/// The watcher's script: wait for the pipe to close, then kill the group.
const WATCH: &str = "while read -r _; do :; done; kill -s KILL 0";

impl Watcher {
    /// Starts a watcher, in a process group of its own. `Err` says why in words.
    pub(crate) fn start() -> Result<Watcher, String> {
        let mut process = tokio::process::Command::new("sh")
            .arg("-c")
            .arg(WATCH)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            // Not in this process's group: a Ctrl-C to the run must not end the watcher
            // before what it watches.
            .process_group(0)
            .spawn()
            .map_err(|e| format!("cannot start sh (the process watcher): {e}"))?;
        let group = process
            .id()
            .and_then(|pid| i32::try_from(pid).ok())
            .ok_or("the process watcher ended as it started")?;
        let pipe = process
            .stdin
            .take()
            .ok_or("the process watcher started without its pipe")?;
        Ok(Watcher {
            group,
            _pipe: pipe,
            _process: process,
        })
    }

    /// The group to start a command into.
    pub(crate) fn group(&self) -> i32 {
        self.group
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        // The group may already be gone; that is the goal. The watcher is not reaped yet,
        // so the id still names this group.
        let _ = nix::sys::signal::killpg(
            nix::unistd::Pid::from_raw(self.group),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
}
