use std::process::Stdio;
use std::time::Duration;

use agent_core::{ErrorKind, Risk, ToolError};
use async_trait::async_trait;
use schemars::JsonSchema;
use serde::Deserialize;

use super::{HeadTail, head_tail};
use crate::tool::{ToolContext, TypedTool};

/// Characters of output kept (the head and, mostly, the tail).
const OUTPUT_CAP: usize = 30_000;

/// `shell`: runs a command with `bash -c` in the workspace root.
pub struct Shell;

/// Arguments of `shell`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ShellArgs {
    /// The command line, run by `bash -c` in the workspace root.
    pub command: String,
    /// Time limit in milliseconds (at most the tool's own timeout).
    #[serde(default)]
    #[schemars(range(min = 1))]
    pub timeout_ms: Option<u64>,
}

#[async_trait]
impl TypedTool for Shell {
    type Args = ShellArgs;
    const NAME: &'static str = "shell";
    const RISK: Risk = Risk::External;
    const MAIN_ARGUMENT: Option<&'static str> = Some("command");

    fn description(&self) -> String {
        "Run a shell command (bash -c) in the workspace root. Returns the exit code, stdout \
         and stderr; long output keeps its beginning and its end. The command and every \
         process it starts are killed when it times out or the run is cancelled."
            .to_owned()
    }

    async fn run(&self, args: ShellArgs, ctx: &ToolContext) -> Result<String, ToolError> {
        let limit = Duration::from_millis(args.timeout_ms.unwrap_or(u64::MAX));
        // Started first, in a process group of its own that the command joins: without it
        // the command does not run.
        let watcher = Watcher::start()?;
        let mut command = tokio::process::Command::new("bash");
        command
            .arg("-c")
            .arg(&args.command)
            .current_dir(ctx.workspace.root())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            // The watcher's process group, so that a timeout, or the watcher, can kill
            // everything it started.
            .process_group(watcher.group);
        let mut child = command.spawn().map_err(|e| {
            ToolError::new(
                ErrorKind::ExecutionFailed,
                format!("cannot start bash: {e}"),
            )
        })?;
        // Kills the whole group however this call ends: done, timed out, cancelled, or
        // dropped by the gateway; and should this process die first, the watcher does.
        let _group = ProcessGroup(watcher.group.unsigned_abs());
        let (Some(stdout), Some(stderr)) = (child.stdout.take(), child.stderr.take()) else {
            return Err(ToolError::new(
                ErrorKind::ExecutionFailed,
                "bash started without its output pipes",
            ));
        };
        // Output is read through bounded buffers: gigabytes of it cost kilobytes.
        let run = async {
            let (out, err, status) = tokio::join!(
                // Both together stay under OUTPUT_CAP, so the counts of what was cut stay.
                drain(stdout, HeadTail::new(9_000, 18_000)),
                drain(stderr, HeadTail::new(1_000, 1_500)),
                child.wait(),
            );
            (out, err, status)
        };
        let (stdout, stderr, status) = tokio::select! {
            done = run => done,
            () = tokio::time::sleep(limit) => {
                return Err(ToolError::new(
                    ErrorKind::Timeout,
                    format!(
                        "the command did not finish within {} ms; it and the processes it \
                         started were killed",
                        limit.as_millis()
                    ),
                ));
            }
            () = ctx.cancel.cancelled() => {
                return Err(ToolError::new(
                    ErrorKind::Cancelled,
                    "the run was cancelled; the command and its processes were killed",
                ));
            }
        };
        let status = status.map_err(|e| {
            ToolError::new(ErrorKind::ExecutionFailed, format!("waiting for bash: {e}"))
        })?;
        let code = status
            .code()
            .map_or_else(|| "killed by a signal".to_owned(), |c| c.to_string());
        let mut text = format!("exit code: {code}\n");
        let stdout = stdout.text();
        let stderr = stderr.text();
        if !stdout.is_empty() {
            text.push_str(&format!("--- stdout ---\n{stdout}"));
            if !stdout.ends_with('\n') {
                text.push('\n');
            }
        }
        if !stderr.is_empty() {
            text.push_str(&format!("--- stderr ---\n{stderr}"));
        }
        let text = head_tail(&text, OUTPUT_CAP);
        if status.success() {
            Ok(text)
        } else {
            Err(ToolError::new(ErrorKind::ExecutionFailed, text))
        }
    }
}

/// Reads a pipe to its end into a bounded buffer.
async fn drain(mut pipe: impl tokio::io::AsyncRead + Unpin, mut into: HeadTail) -> HeadTail {
    use tokio::io::AsyncReadExt;
    let mut buf = vec![0u8; 64 << 10];
    while let Ok(n) = pipe.read(&mut buf).await {
        if n == 0 {
            break;
        }
        into.push(&buf[..n]);
    }
    into
}

/// A process group killed when dropped.
pub(crate) struct ProcessGroup(pub(crate) u32);

/// Kills a command's process group when this process ends before the call does, even by
/// `kill -9`, which runs none of our code. The watcher is a process (`bash`) that leads a
/// process group the command then joins; it reads a pipe this process holds until the pipe
/// closes, then kills its whole group, itself included. The pipe closes when the call ends
/// (the group is killed then anyway, [`ProcessGroup`]) or when this process dies. Without
/// it, a command whose run was killed went on, and could do its effect after the run's
/// recovery had looked for it and been told to run the call again.
struct Watcher {
    /// The group the command joins: the watcher's own.
    group: i32,
    /// Closed when the call ends or this process dies.
    _pipe: tokio::process::ChildStdin,
    /// Reaped by tokio once it exits.
    _process: tokio::process::Child,
}

/// The watcher's script: wait for the pipe to close, then kill the group.
const WATCH: &str = "while read -r _; do :; done; kill -KILL 0";

impl Watcher {
    fn start() -> Result<Watcher, ToolError> {
        let mut process = tokio::process::Command::new("bash")
            .arg("-c")
            .arg(WATCH)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            // Not in this process's group: a Ctrl-C to the run must not end the watcher
            // before the command.
            .process_group(0)
            .spawn()
            .map_err(|e| {
                ToolError::new(
                    ErrorKind::ExecutionFailed,
                    format!("cannot start bash (the command's watcher): {e}"),
                )
            })?;
        let failed = |what: &str| ToolError::new(ErrorKind::ExecutionFailed, what.to_owned());
        let group = process
            .id()
            .and_then(|pid| i32::try_from(pid).ok())
            .ok_or_else(|| failed("the command's watcher ended as it started"))?;
        let pipe = process
            .stdin
            .take()
            .ok_or_else(|| failed("the command's watcher started without its pipe"))?;
        Ok(Watcher {
            group,
            _pipe: pipe,
            _process: process,
        })
    }
}

impl Drop for ProcessGroup {
    fn drop(&mut self) {
        if let Ok(pid) = i32::try_from(self.0) {
            // The group may already be gone; that is the goal.
            let _ = nix::sys::signal::killpg(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
}
