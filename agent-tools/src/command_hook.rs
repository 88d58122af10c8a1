//! External hooks: a command run with the JSON Claude Code's hook scripts use (the
//! default `process` feature).

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use agent_core::{ToolCall, ToolResult};
use async_trait::async_trait;
use serde_json::{Value, json};
use tokio::io::AsyncWriteExt;

use crate::hooks::{DEFAULT_HOOK_TIMEOUT, Hook, HookCall, HookDecision, HookEvent};
use crate::process::{KeptFrom, Watcher};

/// An external hook: `bash -c COMMAND` gets one JSON object on stdin and answers with its
/// exit code (0 allow, 2 deny with stderr as the reason) or a JSON object on stdout with
/// `permissionDecision` (`allow`/`deny`/`ask`) and `permissionDecisionReason` (at the top
/// level or under `hookSpecificOutput`). A post hook may answer `additionalContext`.
#[derive(Clone, Debug)]
pub struct CommandHook {
    /// When it runs.
    pub event: HookEvent,
    /// The command line.
    pub command: String,
    /// Tool names it applies to (a regular expression matched against the whole name);
    /// `None` applies to every tool.
    pub matcher: Option<regex::Regex>,
    /// Longest time it may take.
    pub timeout: Duration,
    /// The directory it runs in (the workspace root).
    pub cwd: PathBuf,
}

/// The answer of a command, before interpretation.
pub(crate) enum Answer {
    Exited {
        code: Option<i32>,
        stdout: String,
        stderr: String,
    },
    Failed(String),
}

impl CommandHook {
    /// A hook with the default timeout that applies to tools matching `matcher` (all when
    /// empty or `*`).
    pub fn new(
        event: HookEvent,
        command: impl Into<String>,
        matcher: Option<&str>,
        cwd: impl Into<PathBuf>,
    ) -> Result<CommandHook, regex::Error> {
        let matcher = match matcher.map(str::trim) {
            None | Some("" | "*") => None,
            Some(m) => Some(regex::Regex::new(&format!("^(?:{m})$"))?),
        };
        Ok(CommandHook {
            event,
            command: command.into(),
            matcher,
            timeout: DEFAULT_HOOK_TIMEOUT,
            cwd: cwd.into(),
        })
    }

    /// Runs the hook: its input written, its answer read and its exit awaited, all within
    /// its timeout. On timeout the hook and every process it started are killed.
    async fn ask(&self, input: Value) -> Answer {
        // A hook is the person's own command, given their whole environment (as Claude
        // Code's hooks are).
        run_command(
            &self.command,
            &self.cwd,
            &[],
            KeptFrom {
                unset: &[],
                sandbox: None,
            },
            input.to_string().into_bytes(),
            self.timeout,
        )
        .await
    }

    fn input(&self, run_id: &str, call: &ToolCall, result: Option<&ToolResult>) -> Value {
        let mut input = json!({
            "hook_event_name": self.event.name(),
            "session_id": run_id,
            "cwd": self.cwd.display().to_string(),
            "tool_name": call.name,
            "tool_input": call.arguments,
            "tool_use_id": call.id,
        });
        if let Some(result) = result {
            input["tool_response"] = serde_json::to_value(result).unwrap_or(Value::Null);
        }
        input
    }
}

/// Runs `bash -c command` in `cwd` with `env` added and what `kept_from` says kept from it
/// (in its sandbox, when it names one: never without), `input` on its stdin: its answer read
/// and its exit awaited, all within `timeout`. However this ends (answered, timed out, or
/// this process killed), the command and every process it started that stayed in its
/// process group are killed ([`Watcher`]); on Linux, under this binary as its watcher
/// ([`crate::watch_with`]), those that left the group too.
pub(crate) async fn run_command(
    command: &str,
    cwd: &std::path::Path,
    env: &[(&str, &str)],
    kept_from: KeptFrom<'_>,
    input: Vec<u8>,
    timeout: Duration,
) -> Answer {
    // A sandbox is made by the watcher, or the command is not run.
    if kept_from.sandbox.is_some() {
        #[cfg(target_os = "linux")]
        if let Some(program) = crate::process::watch_program().filter(|p| p.is_file()) {
            return run_watched(program, command, cwd, env, kept_from, &input, timeout)
                .await
                .unwrap_or_else(|e| {
                    Answer::Failed(format!(
                        "its sandbox cannot be made: cannot start {}: {e}",
                        program.display()
                    ))
                });
        }
        let why = if cfg!(target_os = "linux") {
            crate::sandbox::NO_WATCHER
        } else {
            "its sandbox cannot be made: commands are sandboxed on Linux only"
        };
        return Answer::Failed(why.to_owned());
    }
    let withheld = kept_from.unset;
    #[cfg(target_os = "linux")]
    if let Some(program) = crate::process::watch_program().filter(|p| p.is_file()) {
        match run_watched(program, command, cwd, env, kept_from, &input, timeout).await {
            Ok(answer) => return answer,
            // A binary that cannot be started again (a file system mounted `noexec`, say):
            // the group's watcher serves.
            Err(e) => tracing::warn!(
                "cannot start {} as a hook's watcher ({e}); the hook runs in a process \
                 group instead",
                program.display()
            ),
        }
    }
    let watcher = match Watcher::start() {
        Ok(watcher) => watcher,
        Err(why) => return Answer::Failed(format!("could not start: {why}")),
    };
    let mut bash = tokio::process::Command::new("bash");
    bash.arg("-c")
        .arg(command)
        .current_dir(cwd)
        .envs(env.iter().copied())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        // The watcher's process group, so that what it started dies with it.
        .process_group(watcher.group());
    for name in withheld {
        bash.env_remove(name);
    }
    let mut child = match bash.spawn() {
        Ok(child) => child,
        Err(e) => return Answer::Failed(format!("could not start: {e}")),
    };
    let (Some(mut stdin), Some(stdout), Some(stderr)) =
        (child.stdin.take(), child.stdout.take(), child.stderr.take())
    else {
        return Answer::Failed("started without its pipes".to_owned());
    };
    let exchange = async {
        let write = async move {
            // A command that does not read its input is its own business; its answer
            // still counts.
            let _ = stdin.write_all(&input).await;
            drop(stdin);
        };
        let (_, out, err, status) = tokio::join!(
            write,
            read_capped(stdout),
            read_capped(stderr),
            child.wait()
        );
        (out, err, status)
    };
    match tokio::time::timeout(timeout, exchange).await {
        Err(_) => Answer::Failed(format!("timed out after {} ms", timeout.as_millis())),
        Ok((_, _, Err(e))) => Answer::Failed(e.to_string()),
        Ok((stdout, stderr, Ok(status))) => Answer::Exited {
            code: status.code(),
            stdout: String::from_utf8_lossy(&stdout).trim().to_owned(),
            stderr: String::from_utf8_lossy(&stderr).trim().to_owned(),
        },
    }
}

/// [`run_command`] under `program` serving as the command's watcher (see
/// [`crate::watch_with`]): its parent and reaper, which gives it `input`, reports how it
/// ended, and kills every process left below it once this side of its link closes, those
/// that left the command's group included. `Err` when the watcher cannot be started.
#[cfg(target_os = "linux")]
async fn run_watched(
    program: &std::path::Path,
    command: &str,
    cwd: &std::path::Path,
    env: &[(&str, &str)],
    kept_from: KeptFrom<'_>,
    input: &[u8],
    timeout: Duration,
) -> std::io::Result<Answer> {
    use crate::process::{Ended, Link, Pipes, spawn_watched};
    let spawned = spawn_watched(
        program,
        Link::Fed,
        "bash",
        ["-c", command],
        env.iter().copied(),
        kept_from,
        cwd,
    )?;
    let (mut watched, stdout, stderr) = match spawned {
        (
            watched,
            Pipes {
                stdout: Some(stdout),
                stderr: Some(stderr),
                ..
            },
        ) => (watched, stdout, stderr),
        _ => return Ok(Answer::Failed("started without its pipes".to_owned())),
    };
    let exchange = async {
        // A watcher that could not start the command has said so already; its line is
        // still read below.
        let _ = watched.feed(input).await;
        tokio::join!(read_capped(stdout), read_capped(stderr), watched.ended())
    };
    // However this ends, the link closes when `watched` is dropped, and the watcher kills
    // what is left.
    Ok(match tokio::time::timeout(timeout, exchange).await {
        Err(_) => Answer::Failed(format!("timed out after {} ms", timeout.as_millis())),
        Ok((_, _, Some(Ended::NotStarted(why)))) => {
            Answer::Failed(format!("could not start: {why}"))
        }
        Ok((_, _, None)) => Answer::Failed("its watcher ended without saying how".to_owned()),
        Ok((stdout, stderr, Some(ended))) => Answer::Exited {
            code: match ended {
                Ended::Code(code) => Some(code),
                _ => None,
            },
            stdout: String::from_utf8_lossy(&stdout).trim().to_owned(),
            stderr: String::from_utf8_lossy(&stderr).trim().to_owned(),
        },
    })
}

/// Bytes of a hook's stdout or stderr kept at most.
const HOOK_OUTPUT_CAP: u64 = 64 << 10;

/// Reads a pipe to its end, keeping at most [`HOOK_OUTPUT_CAP`] bytes.
async fn read_capped(mut pipe: impl tokio::io::AsyncRead + Unpin) -> Vec<u8> {
    use tokio::io::AsyncReadExt;
    let mut kept = Vec::new();
    let mut buf = [0u8; 8192];
    while let Ok(n) = pipe.read(&mut buf).await {
        if n == 0 {
            break;
        }
        let room = HOOK_OUTPUT_CAP as usize - kept.len().min(HOOK_OUTPUT_CAP as usize);
        kept.extend_from_slice(&buf[..n.min(room)]);
    }
    kept
}

/// Finds `key` at the top level of a hook's answer or under `hookSpecificOutput`.
fn field<'a>(answer: &'a Value, key: &str) -> Option<&'a str> {
    answer
        .get(key)
        .or_else(|| answer.get("hookSpecificOutput").and_then(|h| h.get(key)))
        .and_then(Value::as_str)
}

#[async_trait]
impl Hook for CommandHook {
    fn name(&self) -> String {
        format!("`{}`", self.command)
    }

    fn applies_to(&self, tool: &str) -> bool {
        self.matcher.as_ref().is_none_or(|m| m.is_match(tool))
    }

    async fn before(&self, run_id: &str, call: &HookCall<'_>) -> HookDecision {
        if self.event != HookEvent::PreToolUse {
            return HookDecision::NoObjection;
        }
        let name = self.name();
        let mut input = self.input(run_id, call.call, None);
        if call.call.arguments != call.proposed.arguments {
            input["raw_tool_input"] = call.proposed.arguments.clone();
        }
        match self.ask(input).await {
            Answer::Failed(why) => HookDecision::Deny(format!("hook {name} {why}")),
            Answer::Exited {
                code: Some(2),
                stderr,
                ..
            } => HookDecision::Deny(if stderr.is_empty() {
                format!("hook {name} denied the call")
            } else {
                stderr
            }),
            Answer::Exited {
                code: Some(0),
                stdout,
                ..
            } if stdout.is_empty() => HookDecision::NoObjection,
            Answer::Exited {
                code: Some(0),
                stdout,
                ..
            } => {
                let Ok(answer) = serde_json::from_str::<Value>(&stdout) else {
                    return HookDecision::Deny(format!(
                        "hook {name} printed something that is not JSON: {}",
                        stdout.chars().take(200).collect::<String>()
                    ));
                };
                if !answer.is_object() {
                    return HookDecision::Deny(format!(
                        "hook {name} printed JSON that is not an object"
                    ));
                }
                let reason = field(&answer, "permissionDecisionReason")
                    .unwrap_or_default()
                    .to_owned();
                match field(&answer, "permissionDecision") {
                    None => HookDecision::NoObjection,
                    Some("allow") => HookDecision::Allow,
                    Some("ask") => HookDecision::Ask(if reason.is_empty() {
                        format!("hook {name} asks")
                    } else {
                        reason
                    }),
                    Some("deny") => HookDecision::Deny(if reason.is_empty() {
                        format!("hook {name} denied the call")
                    } else {
                        reason
                    }),
                    Some(other) => HookDecision::Deny(format!(
                        "hook {name} answered permissionDecision {other:?}; expected allow, deny or ask"
                    )),
                }
            }
            Answer::Exited { code, stderr, .. } => HookDecision::Deny(format!(
                "hook {name} failed ({}){}",
                code.map_or_else(
                    || "killed by a signal".to_owned(),
                    |c| format!("exit code {c}")
                ),
                if stderr.is_empty() {
                    String::new()
                } else {
                    format!(": {stderr}")
                }
            )),
        }
    }

    async fn after(&self, run_id: &str, call: &ToolCall, result: &ToolResult) -> Option<String> {
        if self.event != HookEvent::PostToolUse {
            return None;
        }
        let name = self.name();
        match self.ask(self.input(run_id, call, Some(result))).await {
            Answer::Failed(why) => Some(format!("post hook {name} {why}")),
            Answer::Exited {
                code: Some(0),
                stdout,
                ..
            } => {
                let answer: Value = serde_json::from_str(&stdout).ok()?;
                field(&answer, "additionalContext").map(str::to_owned)
            }
            Answer::Exited { code, stderr, .. } => Some(format!(
                "post hook {name} failed (exit code {}): {stderr}",
                code.map_or_else(|| "none".to_owned(), |c| c.to_string())
            )),
        }
    }
}
