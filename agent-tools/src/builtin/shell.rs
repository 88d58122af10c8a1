use std::process::Stdio;
use std::time::Duration;

use agent_core::{ErrorKind, Risk, ToolError};
use async_trait::async_trait;
use schemars::JsonSchema;
use serde::Deserialize;

use super::{HeadTail, head_tail};
use crate::Sandbox;
use crate::process::Watcher;
use crate::tool::{ToolContext, TypedTool};

/// Characters of output kept (the head and, mostly, the tail).
const OUTPUT_CAP: usize = 30_000;

/// `shell`: runs a command with `bash -c` in the workspace root, in this process's
/// environment less the variables named like secrets ([`agent_core::named_like_secret`]:
/// `OPENAI_API_KEY`, `GH_TOKEN`, ...) that were not passed ([`Shell::passing`]). A model
/// asked to run commands must not be able to read the keys the run is paid with: the
/// redaction of what it is shown stops a value copied whole, not one encoded or sent away.
///
/// [`Shell::sandboxed`] runs each command in a [`Sandbox`]: the kernel then keeps it from
/// writing outside the workspace and from the network, whatever the command says.
#[derive(Clone, Debug, Default)]
pub struct Shell {
    passed: std::collections::BTreeSet<String>,
    sandbox: Option<Sandbox>,
}

impl Shell {
    /// A shell whose commands also see the variables named here, secrets or not (a token
    /// a command needs, say). Names are matched exactly.
    pub fn passing(names: impl IntoIterator<Item = impl Into<String>>) -> Shell {
        Shell {
            passed: names.into_iter().map(Into::into).collect(),
            sandbox: None,
        }
    }

    /// This shell, its commands run in `sandbox` (Linux; elsewhere, and where the sandbox
    /// cannot be made, each command is refused, saying why: never run without it). It
    /// needs `agent`'s watcher ([`crate::watch_with`], called first thing in `main`).
    #[must_use]
    pub fn sandboxed(mut self, sandbox: Sandbox) -> Shell {
        self.sandbox = Some(sandbox);
        self
    }

    /// The sandbox its commands run in, if any.
    pub fn sandbox(&self) -> Option<&Sandbox> {
        self.sandbox.as_ref()
    }

    /// Of the variables named in `names` (those of an environment), the ones a command is
    /// not given: named like secrets, and not passed.
    pub fn withheld<N: AsRef<std::ffi::OsStr>>(
        &self,
        names: impl IntoIterator<Item = N>,
    ) -> Vec<N> {
        crate::process::withheld_secrets(names, |name| self.passed.contains(name))
    }

    /// What this process's environment holds that a command is not given: the variables
    /// named like secrets, and those whose value is a URL with a password, not passed.
    fn withheld_here(&self) -> Vec<std::ffi::OsString> {
        crate::process::withheld_here(|name| self.passed.contains(name))
    }
}

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
        let mut text = "Run a shell command (bash -c) in the workspace root. Returns the exit \
         code, stdout and stderr; long output keeps its beginning and its end. The command \
         and every process it starts are killed when it times out or the run is cancelled. \
         Environment variables named like secrets (*KEY*, *TOKEN*, *SECRET*, *PASSWORD*, \
         *_PASS and the like) or holding a URL with a password are unset unless the person \
         passed them."
            .to_owned();
        if let Some(sandbox) = &self.sandbox {
            text.push(' ');
            text.push_str(&sandbox.told());
        }
        text
    }

    async fn run(&self, args: ShellArgs, ctx: &ToolContext) -> Result<String, ToolError> {
        let limit = Duration::from_millis(args.timeout_ms.unwrap_or(u64::MAX));
        let withheld = self.withheld_here();
        if let Some(sandbox) = &self.sandbox {
            return run_sandboxed(sandbox, &args.command, &withheld, limit, ctx).await;
        }
        // A binary replaced or deleted since it started cannot serve: the group's watcher
        // does, as for a binary that never offered.
        #[cfg(target_os = "linux")]
        if let Some(program) = crate::process::watch_program().filter(|p| p.is_file()) {
            return run_under(program, &args.command, &withheld, limit, ctx, None).await;
        }
        run_in_group(&args.command, &withheld, limit, ctx).await
    }
}

/// Runs `command` in `sandbox`, under this binary as its watcher, which makes the sandbox
/// (see [`crate::Sandbox`]); refused, with the reason, wherever that cannot be.
async fn run_sandboxed(
    sandbox: &Sandbox,
    command_line: &str,
    withheld: &[std::ffi::OsString],
    limit: Duration,
    ctx: &ToolContext,
) -> Result<String, ToolError> {
    let refused = |why: &str| {
        ToolError::new(
            ErrorKind::ExecutionFailed,
            format!("the command was not run: {why}"),
        )
    };
    #[cfg(target_os = "linux")]
    {
        // With the repositories in the workspace now.
        let (spec, before) = sandbox
            .spec_and_found_apart(&ctx.workspace)
            .await
            .map_err(|why| refused(&why))?;
        let Some(program) = crate::process::watch_program().filter(|p| p.is_file()) else {
            return Err(refused(crate::sandbox::NO_WATCHER));
        };
        // The protected places its sandbox could not bind read-only, not being there: one
        // it makes is taken away after it, as the file tools would not have made it.
        let absent: Vec<(std::path::PathBuf, String)> = ctx
            .workspace
            .protected_paths()
            .into_iter()
            .filter(|(place, _)| std::fs::symlink_metadata(place).is_err())
            .map(|(place, what)| (place, what.to_owned()))
            .collect();
        let outcome = run_under(program, command_line, withheld, limit, ctx, Some(&spec)).await;
        let removed = crate::sandbox::remove_made(&absent, ctx.workspace.root());
        // A repository it made is read-only to the commands after it, but what it wrote
        // there runs when a person uses git in it: said.
        let made = crate::sandbox::made_since(&before, &ctx.workspace).await;
        let Some(note) =
            crate::sandbox::after_note("the command", "no command may make", &removed, &made)
        else {
            return outcome;
        };
        match outcome {
            Ok(mut text) => {
                text.push_str(&note);
                Ok(text)
            }
            Err(mut error) => {
                error.message.push('\n');
                error.message.push_str(&note);
                Err(error)
            }
        }
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = (sandbox, command_line, withheld, limit, ctx);
        Err(refused("commands are sandboxed on Linux only"))
    }
}

/// Runs `command` in a process group led by an `sh` watcher ([`Watcher`]).
async fn run_in_group(
    command_line: &str,
    withheld: &[std::ffi::OsString],
    limit: Duration,
    ctx: &ToolContext,
) -> Result<String, ToolError> {
    // Started first, in a process group of its own that the command joins: without it
    // the command does not run. Dropped however this call ends (done, timed out,
    // cancelled, or dropped by the gateway), it kills the whole group; should this
    // process die first, the watcher does.
    let watcher =
        Watcher::start().map_err(|why| ToolError::new(ErrorKind::ExecutionFailed, why))?;
    let mut command = tokio::process::Command::new("bash");
    command
        .arg("-c")
        .arg(command_line)
        .current_dir(ctx.workspace.root())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        // The watcher's process group, so that a timeout, or the watcher, can kill
        // everything it started.
        .process_group(watcher.group());
    for name in withheld {
        command.env_remove(name);
    }
    let mut child = command.spawn().map_err(|e| {
        ToolError::new(
            ErrorKind::ExecutionFailed,
            format!("cannot start bash: {e}"),
        )
    })?;
    let (Some(stdout), Some(stderr)) = (child.stdout.take(), child.stderr.take()) else {
        return Err(ToolError::new(
            ErrorKind::ExecutionFailed,
            "bash started without its output pipes",
        ));
    };
    let ended = async {
        let status = child.wait().await.map_err(|e| {
            ToolError::new(ErrorKind::ExecutionFailed, format!("waiting for bash: {e}"))
        })?;
        Ok(status.code())
    };
    let outcome = finish(stdout, stderr, ended, limit, ctx).await;
    drop(watcher);
    outcome
}

/// Runs `command` under `program` serving as its watcher (see
/// [`crate::process::watch_with`]): the watcher starts `bash`, reports how it ended on a
/// socket (its standard input), and when this side of the socket closes (the call ended,
/// or this process died) kills every process left below it, those that left the group
/// included.
#[cfg(target_os = "linux")]
async fn run_under(
    program: &std::path::Path,
    command_line: &str,
    withheld: &[std::ffi::OsString],
    limit: Duration,
    ctx: &ToolContext,
    sandbox: Option<&str>,
) -> Result<String, ToolError> {
    use crate::process::{Ended, KeptFrom, Link, Pipes, spawn_watched};
    let failed = |what: String| ToolError::new(ErrorKind::ExecutionFailed, what);
    let spawned = spawn_watched(
        program,
        Link::Stdin,
        "bash",
        ["-c", command_line],
        [],
        KeptFrom {
            unset: withheld,
            sandbox,
        },
        ctx.workspace.root(),
    );
    let (mut watched, stdout, stderr) = match spawned {
        Ok((
            watched,
            Pipes {
                stdout: Some(stdout),
                stderr: Some(stderr),
                ..
            },
        )) => (watched, stdout, stderr),
        Ok(_) => {
            return Err(failed(
                "the command's watcher started without its pipes".into(),
            ));
        }
        Err(e) if sandbox.is_some() => {
            return Err(failed(format!(
                "the command was not run: cannot start {} to make its sandbox: {e}",
                program.display()
            )));
        }
        Err(e) => {
            // A binary that cannot be started again (a file system mounted `noexec`, say):
            // the group's watcher serves.
            tracing::warn!(
                "cannot start {} as the command's watcher ({e}); the command runs in a \
                 process group instead",
                program.display()
            );
            return run_in_group(command_line, withheld, limit, ctx).await;
        }
    };
    // Held until the call's answer is made: output that background processes still write
    // is read until they close it, as in a process group.
    let ended = async {
        match watched.ended().await {
            Some(Ended::Code(code)) => Ok(Some(code)),
            Some(Ended::Signal(_)) => Ok(None),
            // What keeps a sandboxed command from starting, its sandbox's making included.
            Some(Ended::NotStarted(why)) if sandbox.is_some() => {
                Err(failed(format!("the command was not run: {why}")))
            }
            Some(Ended::NotStarted(why)) => Err(failed(format!("cannot start bash: {why}"))),
            None => Err(failed(
                "the command's watcher ended without saying how the command ended".into(),
            )),
        }
    };
    // Closing the link when this returns (done, timed out, cancelled) has the watcher kill
    // what is left; it is reaped by tokio once it exits.
    let outcome = finish(stdout, stderr, ended, limit, ctx).await;
    if sandbox.is_some() {
        // What a sandboxed command left is looked at next: nothing of it runs by then.
        watched.end().await;
    }
    outcome
}

/// Reads the command's output until its pipes close and `ended` says how it ended, within
/// `limit` and until the run is cancelled; then the call's answer.
async fn finish(
    stdout: impl tokio::io::AsyncRead + Unpin,
    stderr: impl tokio::io::AsyncRead + Unpin,
    ended: impl std::future::Future<Output = Result<Option<i32>, ToolError>>,
    limit: Duration,
    ctx: &ToolContext,
) -> Result<String, ToolError> {
    // Output is read through bounded buffers: gigabytes of it cost kilobytes.
    let run = async {
        tokio::join!(
            // Both together stay under OUTPUT_CAP, so the counts of what was cut stay.
            drain(stdout, HeadTail::new(9_000, 18_000)),
            drain(stderr, HeadTail::new(1_000, 1_500)),
            ended,
        )
    };
    let (stdout, stderr, code) = tokio::select! {
        done = run => done,
        () = tokio::time::sleep(limit) => {
            return Err(stopped(
                ErrorKind::Timeout,
                &format!(
                    "the command did not finish within {} ms; it and the processes it \
                     started were killed",
                    limit.as_millis()
                ),
            ));
        }
        () = ctx.cancel.cancelled() => {
            return Err(stopped(
                ErrorKind::Cancelled,
                "the run was cancelled; the command and its processes were killed",
            ));
        }
    };
    let code = code?;
    let mut text = format!(
        "exit code: {}\n",
        code.map_or_else(|| "killed by a signal".to_owned(), |c| c.to_string())
    );
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
    if code == Some(0) {
        Ok(text)
    } else {
        Err(ToolError::new(ErrorKind::ExecutionFailed, text))
    }
}

/// A command killed midway: what it did until then stands, so running it again blindly
/// could do part of it twice.
fn stopped(kind: ErrorKind, what: &str) -> ToolError {
    let mut error = ToolError::new(
        kind,
        format!("{what}; what it did before that stands: check its effect before running it again"),
    );
    error.retryable = false;
    error
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

#[cfg(test)]
mod tests {
    use super::Shell;

    #[test]
    fn variables_named_like_secrets_are_withheld_unless_passed() {
        let names = [
            "PATH",
            "HOME",
            "OPENAI_API_KEY",
            "gh_token",
            "DB_PASSWORD",
            "AWS_SECRET_ACCESS_KEY",
            "KEYBOARD",
            "GH_TOKEN",
        ];
        assert_eq!(
            Shell::default().withheld(names),
            [
                "OPENAI_API_KEY",
                "gh_token",
                "DB_PASSWORD",
                "AWS_SECRET_ACCESS_KEY",
                "KEYBOARD",
                "GH_TOKEN"
            ]
        );
        // Passed by its exact name only.
        assert_eq!(
            Shell::passing(["GH_TOKEN", "DB_PASSWORD"]).withheld(names),
            [
                "OPENAI_API_KEY",
                "gh_token",
                "AWS_SECRET_ACCESS_KEY",
                "KEYBOARD"
            ]
        );
    }
}
