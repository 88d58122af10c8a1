//! MCP servers over stdio, their tools offered to the model as `mcp__<server>__<tool>`.
//!
//! Servers are configured in the common `{"mcpServers": {"name": {"command": ..., "args":
//! [...], "env": {...}}}}` form. Tool annotations decide the risk: `readOnlyHint` → `read`
//! (and so parallel), `destructiveHint` → `write`, `openWorldHint` or no annotation →
//! `external` (asks by default). A server that dies is restarted once; after that its
//! tools are unavailable and the run stops with `tool_unavailable`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use agent_core::{ErrorKind, Risk, ToolError, ToolSpec};
use async_trait::async_trait;
use rmcp::model::{CallToolRequestParams, PaginatedRequestParams, Tool as McpToolDef};
use rmcp::service::RunningService;
use rmcp::transport::TokioChildProcess;
use rmcp::{RoleClient, ServiceExt};
use serde::Deserialize;
use serde_json::Value;
use tokio::sync::Mutex;

use crate::process::Watcher;
use crate::tool::{Tool, ToolContext, Unavailable};

/// Tools of one server offered at most. Every tool's name, description and schema go with
/// every model call, and a server is software from outside: one that lists thousands
/// would make each call cost that much (OpenAI refuses more than 128 tools in a request).
pub const MAX_SERVER_TOOLS: usize = 256;

/// Pages of a server's tool list read at most (a cursor that never ends, say).
pub const MAX_TOOL_PAGES: usize = 64;

/// Characters of a tool's description the model is shown at most; the rest is cut.
pub const MAX_DESCRIPTION_CHARS: usize = 4_000;

/// Characters of a tool's name as the model sees it (`mcp__<server>__<tool>`) at most:
/// what OpenAI's API accepts; a longer one would fail every model call of the run.
pub const MAX_TOOL_NAME_CHARS: usize = 64;

/// The `{"mcpServers": {...}}` file.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct McpConfig {
    /// Servers by name.
    #[serde(rename = "mcpServers", default)]
    pub servers: BTreeMap<String, ServerConfig>,
}

/// How to start one server.
#[derive(Clone, Debug, Deserialize)]
pub struct ServerConfig {
    /// The program.
    pub command: String,
    /// Its arguments.
    #[serde(default)]
    pub args: Vec<String>,
    /// Extra environment variables.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// The sandbox it runs in, if any (`"sandbox": true`, or `{"network": false,
    /// "write": ["~/.npm"]}`): see [`ServerSandbox`].
    #[serde(default, deserialize_with = "server_sandbox")]
    pub sandbox: Option<ServerSandbox>,
}

/// The sandbox of a server that asks for one (Linux): the sandbox of `shell` commands
/// ([`crate::Sandbox`]), with the network unless it says otherwise. The server writes only
/// in the workspace, a `/tmp` of its own and `write`, reads none of the person's
/// credentials but those its `env` block gives it, holds no privilege, and cannot change
/// the run store, agent's settings or the repository's `.git`. One that cannot be made
/// keeps the server from starting.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerSandbox {
    /// Whether it may reach the network (default: yes; most servers call an API).
    #[serde(default = "yes")]
    pub network: bool,
    /// Directories beyond the workspace where it may write (a cache: `~/.npm` for `npx`,
    /// `~/.cache/uv` for `uvx`), absolute, from the home directory (`~/`), or relative to
    /// the workspace.
    #[serde(default)]
    pub write: Vec<PathBuf>,
}

fn yes() -> bool {
    true
}

/// `"sandbox": true | false | {...}`.
fn server_sandbox<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<ServerSandbox>, D::Error> {
    use serde::de::Error;
    const GIVE: &str = r#"give true, false or {"network": false, "write": ["DIR"]}"#;
    match Value::deserialize(deserializer)? {
        Value::Bool(false) | Value::Null => Ok(None),
        Value::Bool(true) => Ok(Some(ServerSandbox {
            network: true,
            write: Vec::new(),
        })),
        spec @ Value::Object(_) => serde_json::from_value(spec)
            .map(Some)
            .map_err(|e| D::Error::custom(format!("sandbox: {e}; {GIVE}"))),
        other => Err(D::Error::custom(format!(
            "sandbox: {other} is not one; {GIVE}"
        ))),
    }
}

impl ServerSandbox {
    /// The sandbox's description for the watcher of a server started in `workspace`.
    #[cfg(feature = "process")]
    fn spec(&self, workspace: &crate::Workspace) -> Result<String, String> {
        let home = std::env::var_os("HOME").map(PathBuf::from);
        let mut sandbox = crate::Sandbox::new().with_network(self.network);
        for dir in &self.write {
            let dir = match (dir.strip_prefix("~"), &home) {
                (Ok(rest), Some(home)) => home.join(rest),
                _ => workspace.root().join(dir),
            };
            sandbox = sandbox.writing(dir);
        }
        sandbox.spec(workspace)
    }
}

/// `text` with its control characters written as escapes (`\n`, `\u{1b}`).
fn escaped(text: &str) -> String {
    text.chars()
        .map(|c| {
            if c.is_control() {
                c.escape_default().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

/// An MCP configuration or server that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum McpError {
    /// The configuration file is unreadable or malformed.
    #[error("MCP config {path}: {message}")]
    Config {
        /// The file.
        path: String,
        /// What is wrong.
        message: String,
    },
    /// A server did not start or did not answer the handshake.
    #[error("MCP server {server:?} failed to start: {message}")]
    Start {
        /// The server's name.
        server: String,
        /// What happened.
        message: String,
    },
    /// A server did not start and list its tools in the time it was given.
    #[error(
        "MCP server {server:?} failed to start: it did not start and list its tools within {} ms",
        waited.as_millis()
    )]
    TimedOut {
        /// The server's name.
        server: String,
        /// How long it was given.
        waited: Duration,
    },
}

impl McpConfig {
    /// Reads and parses a config file.
    /// Every value of every server's `env` block, named `SERVER.VAR`: MCP configurations
    /// keep their tokens there, so the runtime keeps these values out of the log.
    pub fn secrets(&self) -> Vec<(String, String)> {
        self.servers
            .iter()
            .flat_map(|(server, s)| {
                s.env
                    .iter()
                    .map(move |(name, value)| (format!("{server}.{name}"), value.clone()))
            })
            .collect()
    }

    /// Reads a configuration file.
    pub fn from_path(path: &Path) -> Result<McpConfig, McpError> {
        let bytes = std::fs::read(path).map_err(|e| McpError::Config {
            path: path.display().to_string(),
            message: e.to_string(),
        })?;
        McpConfig::parse(path, &bytes)
    }

    /// Parses the content of the configuration file at `path` (named in errors), for a
    /// caller that read it itself: one that judges the bytes it read (hashes them for
    /// trust, say) and must use those bytes, not what the file holds a moment later.
    /// `${VAR}` and `${VAR:-default}` in a server's command, arguments and `env` values are
    /// replaced by this process's variables ([`McpConfig::expanded`]).
    /// An error names what the file spelt (a key, a variable) with its control characters
    /// as escapes: one line, whatever the file holds.
    pub fn parse(path: &Path, bytes: &[u8]) -> Result<McpConfig, McpError> {
        let config: McpConfig = serde_json::from_slice(bytes).map_err(|e| McpError::Config {
            path: path.display().to_string(),
            message: escaped(&e.to_string()),
        })?;
        config
            .expanded(|name| std::env::var(name).ok())
            .map_err(|message| McpError::Config {
                path: path.display().to_string(),
                message: escaped(&message),
            })
    }

    /// The configuration with `${VAR}` in each server's command, arguments and `env`
    /// values replaced by `lookup(VAR)`, and `${VAR:-default}` by that or, when it is unset
    /// or empty, by `default`, as `.mcp.json` files are written for other clients. This is
    /// how a server is given a token of this environment: servers do not inherit variables
    /// named like secrets (see [`withheld_from_servers`]). A variable that is not set and
    /// has no default is an error naming it.
    pub fn expanded(
        mut self,
        lookup: impl Fn(&str) -> Option<String>,
    ) -> Result<McpConfig, String> {
        for (name, server) in &mut self.servers {
            let replace = |what: String, text: &mut String| {
                *text =
                    expand(text, &lookup).map_err(|e| format!("server {name:?}, {what}: {e}"))?;
                Ok::<(), String>(())
            };
            replace("command".to_owned(), &mut server.command)?;
            for (i, arg) in server.args.iter_mut().enumerate() {
                replace(format!("args[{i}]"), arg)?;
            }
            for (var, value) in &mut server.env {
                replace(format!("env {var}"), value)?;
            }
        }
        Ok(self)
    }
}

/// `text` with each `${VAR}` and `${VAR:-default}` replaced (see [`McpConfig::expanded`]);
/// a `$` not followed by `{` is kept as it is.
fn expand(text: &str, lookup: &impl Fn(&str) -> Option<String>) -> Result<String, String> {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("${") {
        out.push_str(&rest[..at]);
        let inner = &rest[at + 2..];
        let Some(end) = inner.find('}') else {
            return Err(format!("{:?} has a ${{ with no closing }}", text));
        };
        let (var, default) = match inner[..end].split_once(":-") {
            Some((var, default)) => (var, Some(default)),
            None => (&inner[..end], None),
        };
        let named = var
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && var.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !named {
            return Err(format!("${{{var}}} does not name an environment variable"));
        }
        match (lookup(var).filter(|v| !v.is_empty()), default) {
            (Some(value), _) => out.push_str(&value),
            (None, Some(default)) => out.push_str(default),
            (None, None) => {
                return Err(format!(
                    "${{{var}}} is not set in this environment; set it, or give a default \
                     (${{{var}:-default}})"
                ));
            }
        }
        rest = &inner[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

/// What a server that failed to start was not given, for its error: a server that needs a
/// token it expected to inherit fails so.
fn not_given(withheld: &[std::ffi::OsString]) -> String {
    if withheld.is_empty() {
        return String::new();
    }
    let names: Vec<String> = withheld
        .iter()
        .map(|n| n.to_string_lossy().into_owned())
        .collect();
    format!(
        " (it was not given {}, named like secrets: a server that needs one gets it in its \
         env block, as \"{}\": \"${{{}}}\")",
        names.join(", "),
        names[0],
        names[0]
    )
}

/// The variables of this process's environment a server is not given: those named like
/// secrets ([`agent_core::named_like_secret`]: `OPENAI_API_KEY`, `GH_TOKEN`, ...) that its
/// `env` block does not set. A server is software from outside, and the keys a run is
/// paid with are not its to read; the MCP reference clients pass a server only a few
/// variables. Give a server a token in its `env` block: `"GH_TOKEN": "${GH_TOKEN}"`.
pub fn withheld_from_servers<N: AsRef<std::ffi::OsStr>>(
    config: &ServerConfig,
    names: impl IntoIterator<Item = N>,
) -> Vec<N> {
    crate::process::withheld_secrets(names, |name| config.env.contains_key(name))
}

type Client = RunningService<RoleClient, ()>;

/// A running server: its client, and its watcher, so that it dies with this process,
/// `kill -9` included, rather than finish a call the run's recovery will ask about.
struct Connection {
    client: Client,
    /// Dropped after the client: kills what the server started too.
    _watcher: Guard,
}

/// What kills a server and what it started.
enum Guard {
    /// The watcher of the process group the server runs in ([`Watcher`]): what leaves the
    /// group (a daemon's `setsid`) is out of its reach.
    Group { _watcher: Watcher },
    /// On Linux, when the binary serves as a watcher ([`crate::watch_with`]): the server's
    /// parent and reaper, which kills everything below it, what left the group included.
    #[cfg(target_os = "linux")]
    Reaper { _watched: crate::process::Watched },
}

/// One server: its connection, restarted at most once.
struct Server {
    name: String,
    config: ServerConfig,
    cwd: PathBuf,
    /// Its sandbox's description, when it runs in one.
    sandbox: Option<String>,
    /// In a sandbox, the places in the workspace it may not change, each with what it is:
    /// one that is not there cannot be bound read-only, and one a call makes is taken away
    /// after the call, as after a `shell` command.
    protected: Vec<(PathBuf, String)>,
    /// In a sandbox, the workspace: a repository a call makes there is named after it, as
    /// after a `shell` command (its sandbox, described at the start, does not keep it).
    workspace: Option<crate::Workspace>,
    state: Mutex<State>,
}

enum State {
    Up {
        /// Boxed: a client is large, and the other states are small.
        connection: Box<Connection>,
        restarts_left: u8,
        /// Which connection this is (0 first, 1 after the restart).
        generation: u8,
    },
    /// Died; may be restarted once more.
    Down { restarts_left: u8 },
    /// Died again, or could not restart.
    Gone(Unavailable),
}

impl Server {
    async fn spawn(
        name: &str,
        config: &ServerConfig,
        cwd: &Path,
        sandbox: Option<&str>,
    ) -> Result<Box<Connection>, String> {
        // As `withheld_from_servers` says, and the variables whose value is a URL with a
        // password in it.
        let withheld = crate::process::withheld_here(|name| config.env.contains_key(name));
        #[cfg(target_os = "linux")]
        if let Some(program) = crate::process::watch_program().filter(|p| p.is_file()) {
            use crate::process::{KeptFrom, Link, Pipes, spawn_watched};
            let spawned = spawn_watched(
                program,
                Link::Stderr,
                &config.command,
                config.args.iter().map(String::as_str),
                config.env.iter().map(|(k, v)| (k.as_str(), v.as_str())),
                KeptFrom {
                    unset: &withheld,
                    sandbox,
                },
                cwd,
            );
            match spawned {
                Ok((
                    watched,
                    Pipes {
                        stdin: Some(stdin),
                        stdout: Some(stdout),
                        ..
                    },
                )) => {
                    return match ().serve((stdout, stdin)).await {
                        Ok(client) => Ok(Box::new(Connection {
                            client,
                            _watcher: Guard::Reaper { _watched: watched },
                        })),
                        Err(e) => Err(match watched.why_not_started().await {
                            Some(why) => format!("{}: {why}", config.command),
                            None => format!(
                                "server {name}: handshake failed: {e}{}",
                                not_given(&withheld)
                            ),
                        }),
                    };
                }
                Ok(_) => return Err("the server's watcher started without its pipes".into()),
                // A binary that cannot be started again (a file system mounted `noexec`,
                // say): the group's watcher serves.
                Err(e) => tracing::warn!(
                    "cannot start {} as MCP server {name}'s watcher ({e}); the server runs \
                     in a process group instead",
                    program.display()
                ),
            }
        }
        if sandbox.is_some() {
            // Never run without the sandbox it asked for.
            return Err(format!("server {name}: {}", crate::sandbox::NO_WATCHER));
        }
        let watcher = Watcher::start()?;
        let mut command = tokio::process::Command::new(&config.command);
        command
            .args(&config.args)
            .envs(&config.env)
            .current_dir(cwd)
            // A server given up on (start-up timeout, dropped client) does not linger.
            .kill_on_drop(true)
            .process_group(watcher.group());
        for name in &withheld {
            command.env_remove(name);
        }
        let (transport, _stderr) = TokioChildProcess::builder(command)
            // The server's own logging would garble the terminal.
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("{}: {e}", config.command))?;
        let client = ().serve(transport).await.map_err(|e| {
            format!(
                "server {name}: handshake failed: {e}{}",
                not_given(&withheld)
            )
        })?;
        Ok(Box::new(Connection {
            client,
            _watcher: Guard::Group { _watcher: watcher },
        }))
    }

    /// Calls a tool, restarting the server once if it died.
    async fn call(&self, tool: &str, arguments: Value) -> Result<String, ToolError> {
        let mut state = self.state.lock().await;
        if let State::Down { restarts_left } = *state {
            *state = if restarts_left == 0 {
                State::Gone(Unavailable::Exited {
                    server: format!("MCP server {}", self.name),
                })
            } else {
                let sandbox = self.sandbox.as_deref();
                match Server::spawn(&self.name, &self.config, &self.cwd, sandbox).await {
                    Ok(connection) => State::Up {
                        connection,
                        restarts_left: restarts_left - 1,
                        generation: 1,
                    },
                    Err(why) => State::Gone(Unavailable::RestartFailed {
                        server: format!("MCP server {}", self.name),
                        why,
                    }),
                }
            };
        }
        let (peer, generation) = match &*state {
            State::Up {
                connection,
                generation,
                ..
            } => (connection.client.peer().clone(), *generation),
            State::Gone(why) => {
                return Err(ToolError::new(ErrorKind::ExecutionFailed, why.to_string()));
            }
            State::Down { .. } => {
                return Err(ToolError::new(
                    ErrorKind::ExecutionFailed,
                    "MCP server is down",
                ));
            }
        };
        // Calls run concurrently: the lock is not held while the server works.
        drop(state);
        let arguments = match arguments {
            Value::Object(map) => map,
            _ => serde_json::Map::new(),
        };
        let request = CallToolRequestParams::new(tool.to_owned()).with_arguments(arguments);
        let absent: Vec<(PathBuf, String)> = self
            .protected
            .iter()
            .filter(|(place, _)| std::fs::symlink_metadata(place).is_err())
            .cloned()
            .collect();
        #[cfg(target_os = "linux")]
        let before = match &self.workspace {
            Some(workspace) => crate::sandbox::found_apart(workspace).await,
            None => Vec::new(),
        };
        let outcome = self.call_peer(&peer, generation, request).await;
        #[cfg(target_os = "linux")]
        {
            let removed = crate::sandbox::remove_made(&absent, &self.cwd);
            let made = match &self.workspace {
                Some(workspace) => crate::sandbox::made_since(&before, workspace).await,
                None => Vec::new(),
            };
            let Some(note) =
                crate::sandbox::after_note("the server", "it may not make", &removed, &made)
            else {
                return outcome;
            };
            match outcome {
                Ok(text) => Ok(text + "\n" + &note),
                Err(mut error) => {
                    error.message.push('\n');
                    error.message.push_str(&note);
                    Err(error)
                }
            }
        }
        #[cfg(not(target_os = "linux"))]
        {
            let _ = absent;
            outcome
        }
    }

    /// One call of the server's, on the connection `generation` (marked down if it died).
    async fn call_peer(
        &self,
        peer: &rmcp::Peer<rmcp::RoleClient>,
        generation: u8,
        request: CallToolRequestParams,
    ) -> Result<String, ToolError> {
        match peer.call_tool(request).await {
            Ok(result) => {
                let text = result
                    .content
                    .iter()
                    .map(content_text)
                    .collect::<Vec<_>>()
                    .join("\n");
                let text = match (&result.structured_content, text.is_empty()) {
                    (Some(structured), true) => structured.to_string(),
                    _ => text,
                };
                if result.is_error == Some(true) {
                    Err(ToolError::new(ErrorKind::ExecutionFailed, text))
                } else {
                    Ok(text)
                }
            }
            Err(e) => {
                if !peer.is_transport_closed() {
                    return Err(ToolError::new(ErrorKind::ExecutionFailed, e.to_string()));
                }
                let mut state = self.state.lock().await;
                // Only the first caller to see this connection die marks it down.
                if let State::Up {
                    generation: current,
                    restarts_left,
                    ..
                } = &*state
                    && *current == generation
                {
                    *state = State::Down {
                        restarts_left: *restarts_left,
                    };
                }
                // The call may or may not have taken effect before the server died.
                Err(ToolError::new(
                    ErrorKind::OutcomeUnknown,
                    format!("MCP server {} exited during the call: {e}", self.name),
                ))
            }
        }
    }

    /// `Err(why)` once the server is gone for good.
    fn available(&self) -> Result<(), Unavailable> {
        match self.state.try_lock() {
            Ok(state) => match &*state {
                State::Gone(why) => Err(why.clone()),
                State::Down { restarts_left: 0 } => Err(Unavailable::Exited {
                    server: format!("MCP server {}", self.name),
                }),
                _ => Ok(()),
            },
            // Busy with a call: it is there.
            Err(_) => Ok(()),
        }
    }
}

/// What the model is shown of one content block: text as it is, an embedded text resource
/// with its URI, a link as its URI, and binary content (images, audio, blobs) as a typed
/// placeholder with its MIME type and size, so nothing a server sent is silently lost.
pub fn content_text(block: &rmcp::model::ContentBlock) -> String {
    use rmcp::model::{ContentBlock, ResourceContents};
    // Base64 holds 3 bytes in 4 characters.
    let decoded = |base64: &str| base64.trim_end_matches('=').len() * 3 / 4;
    match block {
        ContentBlock::Text(t) => t.text.clone(),
        ContentBlock::Image(i) => format!("[image: {}, {} bytes]", i.mime_type, decoded(&i.data)),
        ContentBlock::Audio(a) => format!("[audio: {}, {} bytes]", a.mime_type, decoded(&a.data)),
        ContentBlock::Resource(r) => match &r.resource {
            ResourceContents::TextResourceContents { uri, text, .. } => {
                format!("[resource {uri}]\n{text}")
            }
            ResourceContents::BlobResourceContents {
                uri,
                mime_type,
                blob,
                ..
            } => format!(
                "[resource {uri}: {}, {} bytes]",
                mime_type.as_deref().unwrap_or("application/octet-stream"),
                decoded(blob)
            ),
            other => format!(
                "[resource of a kind this client does not know: {}]",
                kind_of(other)
            ),
        },
        ContentBlock::ResourceLink(link) => {
            let mut text = format!("[resource link {}", link.uri);
            if let Some(mime) = &link.mime_type {
                text.push_str(&format!(", {mime}"));
            }
            if let Some(size) = link.size {
                text.push_str(&format!(", {size} bytes"));
            }
            text.push(']');
            if let Some(d) = &link.description {
                text.push_str(&format!(" {d}"));
            }
            text
        }
        other => format!(
            "[content of a kind this client does not know: {}]",
            kind_of(other)
        ),
    }
}

/// The `type` a serialized value names, for placeholders of kinds added after this client.
fn kind_of(value: &impl serde::Serialize) -> String {
    serde_json::to_value(value)
        .ok()
        .and_then(|v| v.get("type").and_then(Value::as_str).map(str::to_owned))
        .unwrap_or_else(|| "unknown".to_owned())
}

/// How long a server may take to start, answer the handshake and list its tools, unless
/// told otherwise ([`connect_within`]).
pub const DEFAULT_STARTUP_TIMEOUT: Duration = Duration::from_secs(30);

/// One tool of a server.
struct McpTool {
    server: Arc<Server>,
    tool: String,
    spec: ToolSpec,
}

#[async_trait]
impl Tool for McpTool {
    fn spec(&self) -> ToolSpec {
        self.spec.clone()
    }

    fn available(&self) -> Result<(), Unavailable> {
        self.server.available()
    }

    async fn call(&self, arguments: Value, _ctx: &ToolContext) -> Result<String, ToolError> {
        self.server.call(&self.tool, arguments).await
    }
}

/// A tool's description as the model sees it: at most [`MAX_DESCRIPTION_CHARS`] of it.
fn description(text: &str) -> String {
    match text.char_indices().nth(MAX_DESCRIPTION_CHARS) {
        None => text.to_owned(),
        Some((end, _)) => format!(
            "{}[... {} more characters of this description not shown]",
            &text[..end],
            text[end..].chars().count()
        ),
    }
}

/// Names the model sees keep to letters, digits, `_` and `-`.
fn sanitize(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// The risk a tool's annotations claim.
pub fn risk_of(def: &McpToolDef) -> Risk {
    let Some(a) = &def.annotations else {
        return Risk::External;
    };
    if a.read_only_hint == Some(true) {
        Risk::Read
    } else if a.destructive_hint == Some(true) {
        Risk::Write
    } else {
        Risk::External
    }
}

fn spec_of(server: &str, def: &McpToolDef) -> ToolSpec {
    let risk = risk_of(def);
    let mut spec = ToolSpec::new(
        format!("mcp__{}__{}", sanitize(server), sanitize(&def.name)),
        description(def.description.as_deref().unwrap_or_default()),
        Value::Object(def.input_schema.as_ref().clone()),
        risk,
    );
    spec.idempotent = risk == Risk::Read
        || def
            .annotations
            .as_ref()
            .and_then(|a| a.idempotent_hint)
            .unwrap_or(false);
    spec
}

/// The tool `def` of server `server` as the model is offered it (`mcp__<server>__<tool>`,
/// names kept to letters, digits, `_` and `-`, the description cut at
/// [`MAX_DESCRIPTION_CHARS`], the risk its annotations claim), or why it is left out, in
/// words: a name longer than model APIs take, a schema beyond
/// [`crate::schema_within_bounds`]. Whatever the server sent.
pub fn offered(server: &str, def: &McpToolDef) -> Result<ToolSpec, String> {
    let spec = spec_of(server, def);
    if spec.name.len() > MAX_TOOL_NAME_CHARS {
        return Err(format!(
            "it would be offered as {} ({} characters), and model APIs accept at most \
             {MAX_TOOL_NAME_CHARS}: give the server a shorter name in the MCP configuration",
            shown_name(&spec.name),
            spec.name.len()
        ));
    }
    crate::gateway::schema_within_bounds(&spec)?;
    Ok(spec)
}

/// A server's tools, page by page, within [`MAX_SERVER_TOOLS`] and [`MAX_TOOL_PAGES`].
async fn list_tools(client: &Client) -> Result<Vec<McpToolDef>, String> {
    let mut tools = Vec::new();
    let mut cursor = None;
    for _ in 0..MAX_TOOL_PAGES {
        let params = cursor.map(|c| PaginatedRequestParams::default().with_cursor(Some(c)));
        let page = client
            .list_tools(params)
            .await
            .map_err(|e| format!("listing its tools failed: {e}"))?;
        tools.extend(page.tools);
        if tools.len() > MAX_SERVER_TOOLS {
            return Err(format!(
                "it lists more than {MAX_SERVER_TOOLS} tools, and each would go with every \
                 model call: turn some off in the server's own settings, or split it"
            ));
        }
        match page.next_cursor {
            Some(next) => cursor = Some(next),
            None => return Ok(tools),
        }
    }
    Err(format!(
        "its list of tools goes on past {MAX_TOOL_PAGES} pages; it is not read further"
    ))
}

/// Starts every configured server (in `cwd`) and returns their tools, each server given
/// [`DEFAULT_STARTUP_TIMEOUT`] to start, answer and list its tools. A tool beyond the
/// bounds is left out, with a warning in the log ([`connect_reporting`] returns them).
pub async fn connect(config: &McpConfig, cwd: &Path) -> Result<Vec<Arc<dyn Tool>>, McpError> {
    connect_within(config, cwd, DEFAULT_STARTUP_TIMEOUT).await
}

/// [`connect`] with a start-up timeout of its own.
pub async fn connect_within(
    config: &McpConfig,
    cwd: &Path,
    timeout: Duration,
) -> Result<Vec<Arc<dyn Tool>>, McpError> {
    let connected = connect_reporting(config, cwd, timeout).await?;
    for left in &connected.left_out {
        tracing::warn!(server = %left.server, tool = %left.tool, "{}", left.reason);
    }
    Ok(connected.tools)
}

/// The servers' tools, and those left out.
pub struct Connected {
    /// The tools offered.
    pub tools: Vec<Arc<dyn Tool>>,
    /// The tools a server listed that are not offered, and why.
    pub left_out: Vec<LeftOut>,
}

/// A tool a server listed that is not offered: its name as the model would see it, or its
/// schema, is beyond what every model call can carry. The server's other tools are; a
/// person who cannot change a third-party server still gets them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeftOut {
    /// The server.
    pub server: String,
    /// The tool, as the server names it.
    pub tool: String,
    /// Why, in words.
    pub reason: String,
}

/// A name a server gave, to be shown: its first 80 characters, and `...` when it goes on
/// (a server could send a name of megabytes).
fn shown_name(name: &str) -> String {
    match name.char_indices().nth(80) {
        None => name.to_owned(),
        Some((cut, _)) => format!("{}...", &name[..cut]),
    }
}

/// [`connect_within`], returning what was left out instead of logging it. A server that
/// asks for a sandbox has every `.git` and bare repository kept from it
/// ([`connect_reporting_in`] names what else).
pub async fn connect_reporting(
    config: &McpConfig,
    cwd: &Path,
    timeout: Duration,
) -> Result<Connected, McpError> {
    let workspace = crate::Workspace::new(cwd).ok().map(|workspace| {
        workspace
            .protect_everywhere(".git", "a git directory")
            .protect_bare_repositories("a bare repository")
            .protect_hooks_paths("the hooks a repository's core.hooksPath names")
            .protect_config_includes("a file git reads as config (a config includes it)")
    });
    connect_servers(config, cwd, workspace.as_ref(), timeout).await
}

/// [`connect_reporting`] for servers started in `workspace`'s root, those that ask for a
/// sandbox kept from changing what it protects ([`crate::Workspace::protected_places`]:
/// the run store, agent's settings, `.git`), as `shell` commands are.
pub async fn connect_reporting_in(
    config: &McpConfig,
    workspace: &crate::Workspace,
    timeout: Duration,
) -> Result<Connected, McpError> {
    connect_servers(config, workspace.root(), Some(workspace), timeout).await
}

async fn connect_servers(
    config: &McpConfig,
    cwd: &Path,
    workspace: Option<&crate::Workspace>,
    timeout: Duration,
) -> Result<Connected, McpError> {
    let mut tools: Vec<Arc<dyn Tool>> = Vec::new();
    let mut left_out = Vec::new();
    for (name, server_config) in &config.servers {
        let start = |message: String| McpError::Start {
            server: name.clone(),
            message,
        };
        let sandbox = match (&server_config.sandbox, workspace) {
            (Some(sandbox), Some(workspace)) => Some(sandbox.spec(workspace).map_err(start)?),
            (Some(_), None) => {
                return Err(start(format!(
                    "its sandbox cannot be made: {} is not a directory it can be made in",
                    cwd.display()
                )));
            }
            (None, _) => None,
        };
        let started = tokio::time::timeout(timeout, async {
            let connection = Server::spawn(name, server_config, cwd, sandbox.as_deref()).await?;
            let defs = list_tools(&connection.client).await?;
            Ok::<_, String>((connection, defs))
        })
        .await;
        let (connection, defs) = match started {
            Ok(result) => result.map_err(start)?,
            Err(_) => {
                return Err(McpError::TimedOut {
                    server: name.clone(),
                    waited: timeout,
                });
            }
        };
        let server = Arc::new(Server {
            name: name.clone(),
            config: server_config.clone(),
            cwd: cwd.to_path_buf(),
            protected: match (&sandbox, workspace) {
                (Some(_), Some(workspace)) => workspace
                    .protected_paths()
                    .into_iter()
                    .map(|(place, what)| (place, what.to_owned()))
                    .collect(),
                _ => Vec::new(),
            },
            workspace: workspace.filter(|_| sandbox.is_some()).cloned(),
            sandbox,
            state: Mutex::new(State::Up {
                connection,
                restarts_left: 1,
                generation: 0,
            }),
        });
        for def in defs {
            match offered(name, &def) {
                Ok(spec) => tools.push(Arc::new(McpTool {
                    server: Arc::clone(&server),
                    tool: def.name.to_string(),
                    spec,
                })),
                Err(reason) => left_out.push(LeftOut {
                    server: name.clone(),
                    tool: shown_name(&def.name),
                    reason,
                }),
            }
        }
    }
    Ok(Connected { tools, left_out })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lookup(name: &str) -> Option<String> {
        match name {
            "GH_TOKEN" => Some("ghp-123".into()),
            "EMPTY" => Some(String::new()),
            _ => None,
        }
    }

    #[test]
    fn variables_are_expanded_with_defaults_and_a_missing_one_is_named() {
        let ok = |text: &str| expand(text, &lookup).unwrap();
        assert_eq!(ok("${GH_TOKEN}"), "ghp-123");
        assert_eq!(ok("Bearer ${GH_TOKEN}!"), "Bearer ghp-123!");
        assert_eq!(ok("${NOPE:-fallback}"), "fallback");
        assert_eq!(
            ok("${EMPTY:-fallback}"),
            "fallback",
            "empty counts as unset"
        );
        assert_eq!(ok("${GH_TOKEN:-x}/${NOPE:-}"), "ghp-123/");
        assert_eq!(
            ok("$HOME and $ and {x}"),
            "$HOME and $ and {x}",
            "only ${{...}}"
        );
        let err = |text: &str| expand(text, &lookup).unwrap_err();
        assert!(
            err("${NOPE}").contains("${NOPE} is not set"),
            "{}",
            err("${NOPE}")
        );
        assert!(err("a ${GH_TOKEN").contains("no closing"));
        assert!(err("${1X}").contains("does not name"));
        assert!(err("${A-B}").contains("does not name"));
    }

    #[test]
    fn a_config_expands_command_arguments_and_env_and_says_where() {
        let config: McpConfig = serde_json::from_value(serde_json::json!({"mcpServers": {
            "gh": {"command": "${NOPE:-npx}", "args": ["-y", "--token=${GH_TOKEN}"],
                   "env": {"GITHUB_TOKEN": "${GH_TOKEN}"}}
        }}))
        .unwrap();
        let expanded = config.clone().expanded(lookup).unwrap();
        let gh = &expanded.servers["gh"];
        assert_eq!(gh.command, "npx");
        assert_eq!(gh.args, ["-y", "--token=ghp-123"]);
        assert_eq!(gh.env["GITHUB_TOKEN"], "ghp-123");
        let err = config.expanded(|_| None).unwrap_err();
        assert!(
            err.starts_with("server \"gh\", args[1]: ${GH_TOKEN}"),
            "{err}"
        );
    }

    #[test]
    fn a_server_s_sandbox_is_read_from_true_false_or_what_it_may_do() {
        use serde_json::json;
        let sandbox_of = |entry: Value| {
            let config: McpConfig = serde_json::from_value(
                serde_json::json!({"mcpServers": {"s": {"command": "x", "sandbox": entry}}}),
            )
            .map_err(|e| e.to_string())?;
            Ok::<_, String>(config.servers["s"].sandbox.clone())
        };
        let with_network = ServerSandbox {
            network: true,
            write: Vec::new(),
        };
        assert_eq!(sandbox_of(json!(true)), Ok(Some(with_network.clone())));
        assert_eq!(sandbox_of(json!(false)), Ok(None));
        assert_eq!(sandbox_of(json!({})), Ok(Some(with_network)));
        assert_eq!(
            sandbox_of(json!({"network": false, "write": ["~/.npm"]})),
            Ok(Some(ServerSandbox {
                network: false,
                write: vec![PathBuf::from("~/.npm")],
            }))
        );
        // A misspelt key is not a sandbox with nothing said.
        let misspelt = sandbox_of(json!({"netwrk": false})).unwrap_err();
        assert!(
            misspelt.starts_with("sandbox: unknown field `netwrk`") && misspelt.contains("give"),
            "{misspelt}"
        );
        let other = sandbox_of(json!("yes")).unwrap_err();
        assert!(
            other.starts_with("sandbox: \"yes\" is not one; give true"),
            "{other}"
        );
        let none: McpConfig =
            serde_json::from_value(serde_json::json!({"mcpServers": {"s": {"command": "x"}}}))
                .unwrap();
        assert_eq!(none.servers["s"].sandbox, None);
        // What the file spelt with a line break in it is named on one line.
        let file = br#"{"mcpServers": {"s": {"command": "x", "sandbox": {"\net\u001b[2J": 1}}}}"#;
        let err = McpConfig::parse(Path::new(".mcp.json"), file)
            .unwrap_err()
            .to_string();
        assert!(err.contains("unknown field `\\net\\u{1b}[2J`"), "{err}");
        assert!(!err.chars().any(char::is_control), "{err}");
    }

    #[test]
    fn servers_are_not_given_variables_named_like_secrets_unless_their_env_sets_them() {
        let server = ServerConfig {
            command: "x".into(),
            args: Vec::new(),
            env: [("GH_TOKEN".to_owned(), "v".to_owned())].into(),
            sandbox: None,
        };
        let names = ["PATH", "OPENAI_API_KEY", "GH_TOKEN", "HOME", "DB_PASSWORD"];
        assert_eq!(
            withheld_from_servers(&server, names),
            ["OPENAI_API_KEY", "DB_PASSWORD"]
        );
    }
}
