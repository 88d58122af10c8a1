//! The commands.

use std::io::{IsTerminal as _, Write as _};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use agent_context::{ContextConfig, Projector};
use agent_core::{Budget, CallId, Event, ReplyError, Resolution, RunState};
use agent_providers::{
    Dialect, HttpModel, Model, ModelSpec, Price, ReplayModel, RetryPolicy, ScriptModel,
};
use agent_runtime::{
    CancellationToken, EventSink, ModelSummarizer, Redactor, Report, RunRequest, Runtime,
    RuntimeError, StoreBlobs,
};
use agent_store::{SledStore, Store, StoreError};
use agent_tools::mcp::{self, McpConfig};
use agent_tools::{Action, CommandHook, Gateway, HookEvent, Policy, ToolReplay, Workspace};

use crate::args::{Cli, Commands, Limits, RunArgs, Setup};
use crate::config::{self, Config, HookConfig};
use crate::exit::{EXIT_FAILED, EXIT_OK, EXIT_USAGE, exit_code};
use crate::render;
use crate::trust;

/// A command that could not run, with its exit code.
struct Failure {
    code: u8,
    message: String,
}

fn usage(message: impl std::fmt::Display) -> Failure {
    Failure {
        code: EXIT_USAGE,
        message: message.to_string(),
    }
}

/// A failure that is not the person's input: a store that failed or lost data.
fn failed(message: impl std::fmt::Display) -> Failure {
    Failure {
        code: EXIT_FAILED,
        message: message.to_string(),
    }
}

impl From<StoreError> for Failure {
    fn from(e: StoreError) -> Self {
        // The library says what is wrong; the command line adds what to do about it.
        let advice = match &e {
            StoreError::RunNotFound(_) => "; `agent runs` lists the runs",
            StoreError::NotAStore(_) => "; choose another --store directory",
            StoreError::Locked { .. } => ", or use another --store",
            _ => "",
        };
        match e {
            // The store itself failed or lost data: not the person's input.
            StoreError::Damaged { .. } | StoreError::Corrupt { .. } | StoreError::Engine(_) => {
                failed(e)
            }
            _ => usage(format!("{e}{advice}")),
        }
    }
}

impl From<RuntimeError> for Failure {
    fn from(e: RuntimeError) -> Self {
        match e {
            RuntimeError::Store(e) => Failure::from(e),
            RuntimeError::Damaged { .. } => failed(e),
            RuntimeError::Refused(_) => usage(e),
            RuntimeError::Reply { run_id, source } => {
                let what = match source {
                    ReplyError::AwaitingApproval => format!(
                        "it waits for approval of its pending calls: use `agent approve \
                         {run_id}` or `agent deny {run_id} --reason TEXT`"
                    ),
                    ReplyError::AwaitingResolution => format!(
                        "it waits for calls of unknown outcome to be settled: use `agent \
                         resolve {run_id} --call ID --as committed|rejected|retry`"
                    ),
                    ReplyError::NotEnded => format!(
                        "it was interrupted, not ended: use `agent resume {run_id}` without \
                         a message first"
                    ),
                    other => other.to_string(),
                };
                usage(format!("run {run_id} cannot take a message: {what}"))
            }
            other => Failure {
                code: EXIT_FAILED,
                message: other.to_string(),
            },
        }
    }
}

#[path = "chat.rs"]
mod chat;

/// Whether answer text was streamed to the terminal during the current model call (so an
/// interactive session does not print the answer twice).
static STREAMED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Writes to standard output; a reader that went away (`agent context RUN | head -1`) is
/// not an error of ours, so a broken pipe ends the printing quietly.
fn say(text: impl std::fmt::Display) {
    let mut out = std::io::stdout().lock();
    let _ = write!(out, "{text}").and_then(|()| out.flush());
}

/// Writes to standard error, the same way.
fn tell(text: impl std::fmt::Display) {
    let mut err = std::io::stderr().lock();
    let _ = write!(err, "{text}").and_then(|()| err.flush());
}

/// Runs a parsed command line and returns the process's exit code.
pub fn main(cli: Cli) -> ExitCode {
    match dispatch(cli) {
        Ok(code) => ExitCode::from(code),
        Err(failure) => {
            tell(format_args!("agent: {}\n", failure.message));
            ExitCode::from(failure.code)
        }
    }
}

/// The settings file, with relative paths in it taken from its own directory.
struct Settings {
    config: Config,
    base: PathBuf,
    /// The file read, if any.
    file: Option<PathBuf>,
    /// Whether the command line named it (`--config`): then it is trusted as given.
    explicit: bool,
}

impl Settings {
    fn load(explicit: Option<&Path>) -> Result<Settings, Failure> {
        Ok(match config::load(explicit).map_err(usage)? {
            Some((path, config)) => Settings {
                config,
                base: path.parent().map(Path::to_path_buf).unwrap_or_default(),
                file: Some(path),
                explicit: explicit.is_some(),
            },
            None => Settings::none(),
        })
    }

    fn none() -> Settings {
        Settings {
            config: Config::default(),
            base: PathBuf::new(),
            file: None,
            explicit: false,
        }
    }

    /// The workspace directory the flags and the file name.
    fn workspace(&self, flag: Option<&Path>) -> PathBuf {
        match (flag, &self.config.workspace) {
            (Some(dir), _) => dir.to_path_buf(),
            (None, Some(dir)) => self.path(dir),
            (None, None) => PathBuf::from("."),
        }
    }

    fn path(&self, p: &Path) -> PathBuf {
        if p.is_absolute() || self.base.as_os_str().is_empty() {
            p.to_path_buf()
        } else {
            self.base.join(p)
        }
    }

    fn store(&self, flag: Option<&Path>) -> PathBuf {
        match (flag, &self.config.store) {
            (Some(dir), _) => dir.to_path_buf(),
            (None, Some(dir)) => self.path(dir),
            (None, None) => PathBuf::from(".agent"),
        }
    }

    fn model(&self, flag: Option<&str>) -> Option<String> {
        if let Some(m) = flag {
            return Some(m.to_owned());
        }
        let m = self.config.model.as_deref()?;
        Some(match m.strip_prefix("script:") {
            Some(path) => format!("script:{}", self.path(Path::new(path)).display()),
            None => m.to_owned(),
        })
    }
}

fn dispatch(cli: Cli) -> Result<u8, Failure> {
    let json = cli.json;
    let settings = Settings::load(cli.config.as_deref())?;
    let store = settings.store(cli.store.as_deref());
    let ids = |calls: Vec<String>| calls.into_iter().map(CallId::from).collect();
    // The commands that continue an existing run differ only in what they do first.
    let (run_id, setup, what) = match cli.command {
        Commands::Run(args) => return run(&settings, &store, json, args),
        Commands::Cancel { run } => return cancel(&store, json, &run),
        Commands::Context { run, at, setup } => {
            return context(&settings, &store, json, &run, at, &setup);
        }
        Commands::Runs => return runs(&store, json),
        Commands::Trust { path, workspace } => {
            return trust_command(&settings, json, path.as_deref(), workspace.as_deref());
        }
        Commands::Show { run, call } => return show(&store, json, &run, call.as_deref()),
        Commands::Chat { run, setup } => return chat::chat(&settings, &store, run, &setup),
        Commands::Resume {
            run,
            message,
            last,
            limits,
            setup,
        } => {
            let (run, message) = match (last, run, message) {
                (false, Some(run), message) => (run, message),
                (false, None, _) => {
                    return Err(usage("which run? give its id, or --last for the newest"));
                }
                (true, message, None) => (newest_run(&store)?, message),
                (true, _, Some(_)) => {
                    return Err(usage(
                        "with --last, give only the message (the run is the newest one)",
                    ));
                }
            };
            match message {
                Some(text) if text.trim().is_empty() => {
                    return Err(usage("the message is empty; say something to the run"));
                }
                Some(text) => (run, setup, Resume::Reply(text, limits)),
                None if limits.any() => {
                    return Err(usage(
                        "new limits apply from a message on: give one (agent resume RUN \
                         MESSAGE --max-steps N)",
                    ));
                }
                None => (run, setup, Resume::Continue),
            }
        }
        Commands::Approve { run, calls, setup } => (run, setup, Resume::Approve(ids(calls))),
        Commands::Deny {
            run,
            calls,
            reason,
            setup,
        } => (run, setup, Resume::Deny(ids(calls), reason)),
        Commands::Resolve {
            run,
            call,
            resolution,
            setup,
        } => {
            let resolution = resolution.parse().map_err(usage)?;
            (run, setup, Resume::Resolve(CallId::from(call), resolution))
        }
    };
    drive_existing(&settings, &store, json, &run_id, &setup, what)
}

/// How a command reaches the store for recorded runs (replays).
#[derive(Clone, Copy)]
enum StoreAccess<'a> {
    /// Not open yet: open it for the look-up only.
    Dir(&'a Path),
    /// Already open in this process (sled allows one handle).
    Open(&'a SledStore),
}

fn load_run(access: StoreAccess<'_>, run: &str) -> Result<Vec<agent_core::Entry>, Failure> {
    Ok(match access {
        StoreAccess::Dir(dir) => open_existing(dir)?.load(run)?,
        StoreAccess::Open(store) => store.load(run)?,
    })
}

/// Builds the model a `--model` value names. Keys come from the environment and are
/// checked here, before anything is written.
fn load_model(
    text: &str,
    settings: &Settings,
    setup: &Setup,
    access: StoreAccess<'_>,
    json: bool,
) -> Result<Arc<dyn Model>, Failure> {
    let base_url = setup.base_url.clone().or(settings.config.base_url.clone());
    let key = |var: &str| std::env::var(var).ok().filter(|k| !k.trim().is_empty());
    let (dialect, provider, model, url, api_key) = match ModelSpec::parse(text)
        .map_err(|e| usage(format!("--{e}")))?
    {
        ModelSpec::Script(path) => {
            return Ok(Arc::new(ScriptModel::from_path(path).map_err(usage)?));
        }
        ModelSpec::Replay(run) => {
            let log = load_run(access, &run)?;
            return Ok(Arc::new(ReplayModel::from_log(&run, &log)));
        }
        ModelSpec::OpenAi(model) => {
            let api_key = key("OPENAI_API_KEY").ok_or_else(|| {
                usage(
                    "OPENAI_API_KEY is not set; export your OpenAI key, or use --model script:PATH",
                )
            })?;
            let url = base_url.unwrap_or_else(|| "https://api.openai.com/v1".to_owned());
            (Dialect::OpenAi, "openai", model, url, Some(api_key))
        }
        ModelSpec::Anthropic(model) => {
            let api_key = key("ANTHROPIC_API_KEY").ok_or_else(|| {
                usage("ANTHROPIC_API_KEY is not set; export your Anthropic key, or use --model script:PATH")
            })?;
            let url = base_url.unwrap_or_else(|| "https://api.anthropic.com".to_owned());
            (Dialect::Anthropic, "anthropic", model, url, Some(api_key))
        }
        ModelSpec::OpenAiCompat(model) => {
            let url = base_url.ok_or_else(|| {
                usage(format!(
                    "--model openai-compat:{model} needs --base-url URL (Ollama: http://localhost:11434/v1)"
                ))
            })?;
            (
                Dialect::OpenAi,
                "openai-compat",
                model,
                url,
                key("OPENAI_API_KEY"),
            )
        }
    };
    let mut http = HttpModel::new(dialect, provider, &model, &url, api_key).map_err(usage)?;
    if let Some(stream) = settings.config.stream {
        http = http.with_streaming(stream);
    }
    if let Some(r) = &settings.config.retry {
        let mut policy = RetryPolicy::default();
        if let Some(n) = r.max_attempts {
            policy.max_attempts = n.max(1);
        }
        if let Some(ms) = r.base_ms {
            policy.base = std::time::Duration::from_millis(ms);
        }
        if let Some(secs) = r.max_total_wait_secs {
            policy.max_total_wait = std::time::Duration::from_secs(secs);
        }
        http = http.with_retry(policy);
    }
    if let Some(p) = settings.config.prices.get(&model) {
        http = http.with_price(Price {
            input_per_million: p.input,
            output_per_million: p.output,
        });
    }
    if !json && std::io::stderr().is_terminal() {
        // The answer appears as it is written.
        http = http.with_text_sink(Arc::new(|text: &str| {
            STREAMED.store(true, std::sync::atomic::Ordering::Relaxed);
            let mut err = std::io::stderr().lock();
            let _ = write!(err, "{text}");
            let _ = err.flush();
        }));
    }
    Ok(Arc::new(http))
}

fn hook(event: HookEvent, h: &HookConfig, cwd: &Path) -> Result<CommandHook, Failure> {
    let mut hook =
        CommandHook::new(event, h.command.clone(), h.matcher.as_deref(), cwd).map_err(|e| {
            let text = e.to_string();
            let why = text.lines().last().unwrap_or_default().trim().to_owned();
            usage(format!("hook {:?}: matcher: {why}", h.command))
        })?;
    if let Some(secs) = h.timeout_secs {
        let secs = config::check_seconds("timeout_secs", secs, 86_400.0)
            .map_err(|e| usage(format!("hook {:?}: {e}", h.command)))?;
        hook.timeout = Duration::from_secs_f64(secs);
    }
    Ok(hook)
}

/// The gateway: built-in tools confined to the workspace, policy from the settings file and
/// the flags, hooks from the settings file, and the tools of the MCP servers (started on
/// `rt`).
fn gateway(
    settings: &Settings,
    setup: &Setup,
    rt: &tokio::runtime::Runtime,
    access: StoreAccess<'_>,
) -> Result<Gateway, Failure> {
    let dir = settings.workspace(setup.workspace.as_deref());
    let ws =
        Workspace::new(&dir).map_err(|e| usage(format!("--workspace {}: {e}", dir.display())))?;
    let root = ws.root().to_path_buf();
    // Nothing a project file brings is used, or started, before a person trusted it.
    let interactive =
        !setup.no_input && std::io::stdin().is_terminal() && std::io::stderr().is_terminal();
    ensure_trusted(&untrusted_parts(settings, setup, &root)?, interactive)?;
    let mut policy = Policy::new();
    let p = &settings.config.policy;
    let rules = [
        (Action::Allow, &p.allow),
        (Action::Ask, &p.ask),
        (Action::Deny, &p.deny),
        (Action::Allow, &setup.allow),
        (Action::Ask, &setup.ask),
        (Action::Deny, &setup.deny),
    ];
    for (action, texts) in rules {
        for text in texts {
            policy.add(action, text).map_err(usage)?;
        }
    }
    let mut gateway = Gateway::with_builtins(ws)
        .map_err(|e| Failure {
            code: EXIT_FAILED,
            message: e.to_string(),
        })?
        .with_policy(policy);
    let hooks = &settings.config.hooks;
    for h in &hooks.pre_tool_use {
        gateway = gateway.with_hook(Arc::new(hook(HookEvent::PreToolUse, h, &root)?));
    }
    for h in &hooks.post_tool_use {
        gateway = gateway.with_hook(Arc::new(hook(HookEvent::PostToolUse, h, &root)?));
    }
    if let Some(path) = mcp_path(settings, setup, &root) {
        let config = McpConfig::from_path(&path).map_err(usage)?;
        for tool in rt.block_on(mcp::connect(&config, &root)).map_err(usage)? {
            gateway.register(tool).map_err(usage)?;
        }
    }
    if let Some(text) = &setup.tools {
        let Some(run) = text.strip_prefix("replay:").filter(|r| !r.is_empty()) else {
            return Err(usage(format!(
                "--tools {text:?}: the only form is replay:RUN"
            )));
        };
        let log = load_run(access, run)?;
        gateway = gateway.with_replay(ToolReplay::from_log(run, &log));
    }
    Ok(gateway)
}

/// The MCP configuration in use: `--mcp-config`, the settings file's, or the workspace's
/// `.mcp.json`.
fn mcp_path(settings: &Settings, setup: &Setup, root: &Path) -> Option<PathBuf> {
    match (&setup.mcp_config, &settings.config.mcp_config) {
        (Some(path), _) => Some(path.clone()),
        (None, Some(path)) => Some(settings.path(path)),
        (None, None) => Some(root.join(".mcp.json")).filter(|p| p.is_file()),
    }
}

/// The project files in use that bring something needing trust, and what they bring.
fn untrusted_parts(
    settings: &Settings,
    setup: &Setup,
    root: &Path,
) -> Result<Vec<trust::ProjectFile>, Failure> {
    let mut files = Vec::new();
    if let (Some(path), false) = (&settings.file, settings.explicit) {
        let c = &settings.config;
        let mut brings = Vec::new();
        if !c.policy.allow.is_empty() {
            brings.push(format!("allow rules {}", c.policy.allow.join(", ")));
        }
        let hooks: Vec<&str> = c
            .hooks
            .pre_tool_use
            .iter()
            .chain(&c.hooks.post_tool_use)
            .map(|h| h.command.as_str())
            .collect();
        if !hooks.is_empty() {
            brings.push(format!("hook commands {}", hooks.join(", ")));
        }
        if let (Some(mcp), None) = (&c.mcp_config, &setup.mcp_config) {
            brings.push(format!("the MCP servers of {}", mcp.display()));
        }
        if let (Some(ws), None) = (&c.workspace, &setup.workspace) {
            brings.push(format!("the workspace {}", ws.display()));
        }
        if let (Some(url), None) = (&c.base_url, &setup.base_url) {
            brings.push(format!("base_url {url} (where your API key is sent)"));
        }
        if !brings.is_empty() {
            let (mut file, _) = trust::ProjectFile::read(path).map_err(usage)?;
            file.brings = brings;
            files.push(file);
        }
    }
    if setup.mcp_config.is_none() && settings.config.mcp_config.is_none() {
        let path = root.join(".mcp.json");
        if path.is_file() {
            let config = McpConfig::from_path(&path).map_err(usage)?;
            if !config.servers.is_empty() {
                let (mut file, _) = trust::ProjectFile::read(&path).map_err(usage)?;
                file.brings = config
                    .servers
                    .iter()
                    .map(|(name, s)| {
                        let mut line = vec![s.command.clone()];
                        line.extend(s.args.iter().cloned());
                        format!("MCP server {name} (runs {})", line.join(" "))
                    })
                    .collect();
                files.push(file);
            }
        }
    }
    Ok(files)
}

/// Refuses, or on a terminal asks once, for project files not trusted as they are now.
fn ensure_trusted(files: &[trust::ProjectFile], interactive: bool) -> Result<(), Failure> {
    if files.is_empty() {
        return Ok(());
    }
    let mut trusted = trust::Trusted::load().map_err(usage)?;
    for file in files {
        if trusted.trusts(file) {
            continue;
        }
        let path = file.path.display();
        if !interactive {
            return Err(usage(format!(
                "{path} is not trusted: it brings {}; read it, then run `agent trust {path}` \
                 (or name it with --config / --mcp-config to use it as given)",
                file.brings.join("; ")
            )));
        }
        let mut err = std::io::stderr().lock();
        let _ = writeln!(err, "agent: {path} is not trusted yet. It brings:");
        for what in &file.brings {
            let _ = writeln!(err, "  - {}", render::escape(what));
        }
        let _ = write!(err, "Trust this file as it is now? [y/N] ");
        let _ = err.flush();
        drop(err);
        let mut answer = String::new();
        let _ = std::io::stdin().read_line(&mut answer);
        if !matches!(answer.trim().to_ascii_lowercase().as_str(), "y" | "yes") {
            return Err(usage(format!(
                "{path} was not trusted; nothing was run (trust it later with `agent trust {path}`)"
            )));
        }
        trusted.trust(file).map_err(usage)?;
    }
    Ok(())
}

/// `agent trust [PATH]`.
fn trust_command(
    settings: &Settings,
    json: bool,
    path: Option<&Path>,
    workspace: Option<&Path>,
) -> Result<u8, Failure> {
    let candidates: Vec<PathBuf> = match path {
        Some(p) if p.is_dir() => vec![p.join("agent.toml"), p.join(".mcp.json")],
        Some(p) => {
            if !p.is_file() {
                return Err(usage(format!(
                    "{}: no such file; give an agent.toml, a .mcp.json or their directory",
                    p.display()
                )));
            }
            vec![p.to_path_buf()]
        }
        None => {
            let mut v: Vec<PathBuf> = settings.file.iter().cloned().collect();
            v.push(settings.workspace(workspace).join(".mcp.json"));
            if let Some(mcp) = &settings.config.mcp_config {
                v.push(settings.path(mcp));
            }
            v
        }
    };
    let files: Vec<&PathBuf> = candidates.iter().filter(|p| p.is_file()).collect();
    if files.is_empty() {
        return Err(usage(
            "no agent.toml or .mcp.json here; give the file or its directory: agent trust PATH",
        ));
    }
    let mut trusted = trust::Trusted::load().map_err(usage)?;
    let mut done = Vec::new();
    for path in files {
        let (file, _) = trust::ProjectFile::read(path).map_err(usage)?;
        trusted.trust(&file).map_err(usage)?;
        done.push(file);
    }
    if json {
        let list: Vec<serde_json::Value> = done
            .iter()
            .map(|f| serde_json::json!({"path": f.path, "sha256": f.hash}))
            .collect();
        say(format_args!("{}\n", serde_json::Value::Array(list)));
    } else {
        for f in &done {
            say(format_args!(
                "trusted {} (sha256 {})\n",
                f.path.display(),
                &f.hash[..16]
            ));
        }
    }
    Ok(EXIT_OK)
}

/// The budget of a new run: agent.toml, then the flags, over the contract's defaults.
fn budget(settings: &Settings, limits: &Limits) -> Result<Budget, Failure> {
    adjusted(settings, limits, Budget::default())
}

/// `budget` with agent.toml's budgets, then the flags, applied.
fn adjusted(settings: &Settings, args: &Limits, mut budget: Budget) -> Result<Budget, Failure> {
    let c = &settings.config;
    if let Some(n) = args.max_steps.or(c.max_steps) {
        if n == 0 {
            return Err(usage("--max-steps must be at least 1"));
        }
        budget.max_steps = n;
    }
    if let Some(n) = args.max_tool_calls.or(c.max_tool_calls) {
        budget.max_tool_calls = n;
    }
    if c.max_tokens.is_some() {
        budget.max_tokens = c.max_tokens;
    }
    if let Some(usd) = c.max_cost_usd {
        if !(usd.is_finite() && usd > 0.0) {
            return Err(usage("max_cost_usd must be a positive number of dollars"));
        }
        budget.max_cost_usd = Some(usd);
    }
    if let Some(secs) = args.timeout.or(c.timeout) {
        let secs = config::check_seconds("--timeout", secs, 365.0 * 86_400.0).map_err(usage)?;
        budget.max_wall_time_ms = Some((secs * 1000.0).round() as u64);
    }
    Ok(budget)
}

fn tokio() -> Result<tokio::runtime::Runtime, Failure> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| Failure {
            code: EXIT_FAILED,
            message: format!("cannot start the async runtime: {e}"),
        })
}

fn event_printer() -> EventSink {
    Arc::new(|entry| {
        if let Ok(line) = serde_json::to_string(entry) {
            let mut out = std::io::stdout().lock();
            let _ = writeln!(out, "{line}");
            let _ = out.flush();
        }
    })
}

/// Cancels the run on Ctrl-C: no new side effect starts after that.
/// A token cancelled by the next Ctrl-C (SIGINT). The handler is in place when this
/// returns, so a Ctrl-C a moment later is never the default one that kills the process.
fn cancel_on_ctrl_c(rt: &tokio::runtime::Runtime) -> CancellationToken {
    let cancel = CancellationToken::new();
    let token = cancel.clone();
    let _entered = rt.enter();
    match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt()) {
        Ok(mut interrupts) => {
            rt.spawn(async move {
                if interrupts.recv().await.is_some() {
                    token.cancel();
                }
            });
        }
        Err(_) => {
            rt.spawn(async move {
                if tokio::signal::ctrl_c().await.is_ok() {
                    token.cancel();
                }
            });
        }
    }
    cancel
}

/// The secrets to keep out of the log: the environment's secret-named variables and every
/// value of the `env` block of the MCP servers in use (where MCP configs keep tokens).
fn redactor(settings: &Settings, setup: Option<&Setup>) -> Redactor {
    let redactor = Redactor::from_env();
    let Some(setup) = setup else {
        return redactor;
    };
    let root = settings.workspace(setup.workspace.as_deref());
    let root = root.canonicalize().unwrap_or(root);
    let Some(config) = mcp_path(settings, setup, &root).and_then(|p| McpConfig::from_path(&p).ok())
    else {
        return redactor;
    };
    redactor.with_secrets(config.secrets())
}

fn runtime(
    settings: &Settings,
    model: Arc<dyn Model>,
    gateway: Gateway,
    store: SledStore,
    events: bool,
    redactor: Redactor,
) -> Runtime {
    let store: Arc<dyn Store> = Arc::new(store);
    // Outputs too large for the model are kept whole in the store, and read back with
    // read_result, as are older results the prompt shows shortened.
    let blobs = Arc::new(StoreBlobs::new(Arc::clone(&store)).with_redactor(redactor.clone()));
    let gateway = gateway
        .with_blob_sink(blobs.clone())
        .with_result_source(blobs);
    let real_model = model.provider() != "script";
    let mut runtime =
        Runtime::new(Arc::clone(&model), Arc::new(gateway), store).with_redactor(redactor);
    if real_model {
        runtime = runtime.with_summarizer(Arc::new(ModelSummarizer::new(Arc::clone(&model))));
    }
    runtime = runtime.with_context(context_config(settings, model.model()));
    if events {
        runtime.with_event_sink(event_printer())
    } else {
        runtime
    }
}

/// How prompts are bounded for `model`: its context window (or agent.toml's), agent.toml's
/// compaction threshold, the default system text.
fn context_config(settings: &Settings, model: &str) -> ContextConfig {
    let c = &settings.config;
    let defaults = ContextConfig {
        context_window: agent_context::context_window(model),
        ..ContextConfig::default()
    };
    ContextConfig {
        context_window: c.context_window.unwrap_or(defaults.context_window),
        compact_at: c.compact_at.unwrap_or(defaults.compact_at),
        ..defaults
    }
}

fn run(settings: &Settings, store_dir: &Path, json: bool, args: RunArgs) -> Result<u8, Failure> {
    // Everything that can be wrong with the input is checked before anything is written.
    if args.goal.trim().is_empty() {
        return Err(usage(
            "the goal is empty; say what the agent should achieve",
        ));
    }
    let model = settings.model(args.setup.model.as_deref()).ok_or_else(|| {
        usage("no model: pass --model PROVIDER:MODEL (e.g. script:PATH) or set model in agent.toml")
    })?;
    let model = load_model(
        &model,
        settings,
        &args.setup,
        StoreAccess::Dir(store_dir),
        json,
    )?;
    let budget = budget(settings, &args.limits)?;
    let rt = tokio()?;
    let asks = chat::interactive(&args.setup);
    let mut gateway = gateway(settings, &args.setup, &rt, StoreAccess::Dir(store_dir))?;
    if asks {
        gateway = gateway.with_observer(chat::tool_lines());
    }
    let store = writable(SledStore::open(store_dir)?)?;
    let redactor = redactor(settings, Some(&args.setup));
    let runtime = runtime(settings, model, gateway, store, args.setup.events, redactor);
    let cancel = cancel_on_ctrl_c(&rt);
    let run_id = ulid::Ulid::generate().to_string();
    let report =
        rt.block_on(runtime.start(RunRequest::new(run_id, args.goal, budget), cancel.clone()))?;
    let report = ask_inline(asks, &rt, &runtime, report, &cancel)?;
    Ok(finish(&report, json))
}

/// On a terminal, a run that pauses for approval asks the person there and then, instead
/// of exiting 3.
fn ask_inline(
    asks: bool,
    rt: &tokio::runtime::Runtime,
    runtime: &Runtime,
    report: Report,
    cancel: &CancellationToken,
) -> Result<Report, Failure> {
    if !asks || report.outcome.reason != agent_core::TerminalReason::ApprovalRequired {
        return Ok(report);
    }
    let mut editor = rustyline::DefaultEditor::new().map_err(|e| Failure {
        code: EXIT_FAILED,
        message: format!("cannot read the terminal: {e}"),
    })?;
    let mut always = std::collections::BTreeSet::new();
    Ok(chat::settle_inline(
        rt,
        runtime,
        &mut editor,
        report,
        &mut always,
        cancel,
    )?)
}

/// The model a run continues with when none is given: its own script, for a script run.
fn recorded_model(store: &SledStore, run_id: &str) -> Result<String, Failure> {
    let log = store.load(run_id)?;
    let Some(Event::RunStarted { manifest, .. }) = log.first().map(|e| &e.event) else {
        return Err(usage(format!("run {run_id} has no start event")));
    };
    if manifest.provider != "script" {
        return Err(usage(format!(
            "run {run_id} used {}:{}; pass --model to continue it",
            manifest.provider, manifest.model
        )));
    }
    Ok(format!("script:{}", manifest.model))
}

/// The id of the run started last in the store.
fn newest_run(store_dir: &Path) -> Result<String, Failure> {
    let store = open_existing(store_dir)?;
    let runs = store.runs()?;
    runs.into_iter()
        .max_by(|a, b| (a.started_at_ms, &a.run_id).cmp(&(b.started_at_ms, &b.run_id)))
        .map(|r| r.run_id)
        .ok_or_else(|| usage(format!("no runs in {} yet", store_dir.display())))
}

/// What to do with an existing run.
enum Resume {
    Continue,
    Reply(String, Limits),
    Approve(Vec<CallId>),
    Deny(Vec<CallId>, String),
    Resolve(CallId, Resolution),
}

fn drive_existing(
    settings: &Settings,
    store_dir: &Path,
    json: bool,
    run_id: &str,
    setup: &Setup,
    what: Resume,
) -> Result<u8, Failure> {
    let store = writable(open_existing(store_dir)?)?;
    let log = store.load(run_id)?;
    let text = match settings.model(setup.model.as_deref()) {
        Some(text) => text,
        None => recorded_model(&store, run_id)?,
    };
    let model = load_model(&text, settings, setup, StoreAccess::Open(&store), json)?;
    // A message's new limits, checked before anything is written.
    let reply = match &what {
        Resume::Reply(text, limits) => {
            let state = RunState::fold(&log).map_err(|e| Failure {
                code: EXIT_FAILED,
                message: format!("the log of run {run_id} is damaged: {e}"),
            })?;
            let current = match (&state.budget, &state.manifest) {
                (Some(budget), _) => budget.clone(),
                (None, Some(manifest)) => manifest.budget.clone(),
                (None, None) => Budget::default(),
            };
            let new = adjusted(settings, limits, current.clone())?;
            Some((text.clone(), (new != current).then_some(new)))
        }
        _ => None,
    };
    let rt = tokio()?;
    let asks = chat::interactive(setup);
    let mut gateway = gateway(settings, setup, &rt, StoreAccess::Open(&store))?;
    if asks {
        gateway = gateway.with_observer(chat::tool_lines());
    }
    let redactor = redactor(settings, Some(setup));
    let runtime = runtime(settings, model, gateway, store, setup.events, redactor);
    let cancel = cancel_on_ctrl_c(&rt);
    let token = cancel.clone();
    let report = rt.block_on(async {
        let cancel = token;
        if let Some((text, budget)) = reply {
            return runtime.reply(run_id, &text, budget, cancel).await;
        }
        match what {
            Resume::Continue | Resume::Reply(..) => runtime.resume(run_id, cancel).await,
            Resume::Approve(calls) => runtime.approve(run_id, calls, cancel).await,
            Resume::Deny(calls, reason) => runtime.deny(run_id, calls, reason, cancel).await,
            Resume::Resolve(call, resolution) => {
                runtime.resolve(run_id, call, resolution, cancel).await
            }
        }
    })?;
    let report = ask_inline(asks, &rt, &runtime, report, &cancel)?;
    Ok(finish(&report, json))
}

fn cancel(store_dir: &Path, json: bool, run_id: &str) -> Result<u8, Failure> {
    let store = writable(open_existing(store_dir)?)?;
    let ws = Workspace::new(".").map_err(|e| usage(format!("the current directory: {e}")))?;
    // Cancelling asks no model and starts nothing.
    let runtime = Runtime::without_model(Arc::new(Gateway::new(ws)), Arc::new(store))
        .with_redactor(Redactor::from_env());
    let rt = tokio()?;
    let report = rt.block_on(runtime.cancel(run_id))?;
    Ok(finish(&report, json))
}

fn finish(report: &Report, json: bool) -> u8 {
    if json {
        say(format_args!("{}\n", render::outcome_json(report)));
    } else {
        if let Some(answer) = &report.outcome.answer {
            say(format_args!("{answer}\n"));
        }
        tell(format_args!("agent: {}\n", render::outcome_text(report)));
    }
    exit_code(report.outcome.reason)
}

/// A store that may be written: a damaged one is refused before anything happens.
fn writable(store: SledStore) -> Result<SledStore, Failure> {
    match store.damage() {
        Some(damage) => Err(failed(damage)),
        None => Ok(store),
    }
}

/// After a read-only command printed what a damaged store still holds: the damage.
fn report_damage(store: &SledStore) -> Result<u8, Failure> {
    match store.damage() {
        Some(damage) => Err(failed(damage)),
        None => Ok(EXIT_OK),
    }
}

fn open_existing(dir: &Path) -> Result<SledStore, Failure> {
    SledStore::open_existing(dir)?.ok_or_else(|| {
        usage(format!(
            "no store at {}; runs are created by `agent run` (or pass --store DIR)",
            dir.display()
        ))
    })
}

fn context(
    settings: &Settings,
    store_dir: &Path,
    json: bool,
    run_id: &str,
    at: Option<u32>,
    setup: &Setup,
) -> Result<u8, Failure> {
    let store = open_existing(store_dir)?;
    let damage = store.damage();
    let mut log = store.load(run_id)?;
    if log.is_empty() {
        return Err(usage(format!("no run {run_id} in {}", store_dir.display())));
    }
    if let Some(n) = at {
        // The prompt of call N is the projection of everything committed before it.
        let calls = RunState::fold(&log).map(|s| s.steps).unwrap_or(0);
        let Some(first) = log.iter().position(|e| model_call(&e.event) == Some(n)) else {
            return Err(usage(format!(
                "run {run_id} made {calls} model call(s); --at takes 1 to {calls}"
            )));
        };
        log.truncate(first);
    }
    // A command that only reads starts nothing and calls nothing: no model, no MCP
    // server, no hook. The model's name sets the context window; the tools are the ones the
    // run recorded at its start.
    let (recorded_model, recorded) = match log.first().map(|e| &e.event) {
        Some(Event::RunStarted { manifest, .. }) => {
            (manifest.model.clone(), manifest.tools.clone())
        }
        _ => (String::new(), Vec::new()),
    };
    let model_name = match settings.model(setup.model.as_deref()) {
        Some(text) => match ModelSpec::parse(&text).map_err(|e| usage(format!("--{e}")))? {
            ModelSpec::OpenAi(m) | ModelSpec::Anthropic(m) | ModelSpec::OpenAiCompat(m) => m,
            ModelSpec::Script(_) | ModelSpec::Replay(_) => recorded_model,
        },
        None => recorded_model,
    };
    let tools = if recorded.is_empty() {
        // A run from before tools were recorded: the built-ins.
        let ws = Workspace::new(".").map_err(|e| usage(format!("the current directory: {e}")))?;
        Gateway::with_builtins(ws).map_err(failed)?.specs()
    } else {
        recorded
    };
    let mut projector = Projector::new(
        context_config(settings, &model_name),
        tools,
        Arc::new(agent_context::Tiktoken),
    );
    for entry in &log {
        projector.apply(entry);
    }
    let prompt = projector.prompt();
    let window = projector.config().context_window;
    if json {
        let value = serde_json::json!({
            "run_id": run_id,
            "system": prompt.system,
            "messages": prompt.messages,
            "tools": prompt.tools,
            "estimated_tokens": projector.tokens(),
            "context_window": window,
        });
        say(format_args!("{value}\n"));
    } else {
        say(format_args!(
            "{}",
            render::prompt_text(prompt, projector.tokens(), window)
        ));
    }
    match damage {
        Some(damage) => Err(failed(damage)),
        None => Ok(EXIT_OK),
    }
}

/// The model call an event belongs to, for events a model call writes first.
fn model_call(event: &Event) -> Option<u32> {
    match event {
        Event::DecisionProposed { turn, .. }
        | Event::DecisionRejected { turn, .. }
        | Event::ModelRetried { turn, .. }
        | Event::ModelFailed { turn, .. } => Some(*turn),
        _ => None,
    }
}

fn runs(store_dir: &Path, json: bool) -> Result<u8, Failure> {
    let store = SledStore::open_existing(store_dir)?;
    let mut runs = match &store {
        Some(store) => store.runs()?,
        None => Vec::new(),
    };
    runs.sort_by(|a, b| (a.started_at_ms, &a.run_id).cmp(&(b.started_at_ms, &b.run_id)));
    if json {
        say(format_args!(
            "{}\n",
            serde_json::to_string(&runs).unwrap_or_default()
        ));
    } else {
        say(format_args!("{}\n", render::runs_table(&runs)));
    }
    match &store {
        Some(store) => report_damage(store),
        None => Ok(EXIT_OK),
    }
}

fn show(store_dir: &Path, json: bool, run_id: &str, call: Option<&str>) -> Result<u8, Failure> {
    let store = open_existing(store_dir)?;
    let entries = store.load(run_id)?;
    if let Some(id) = call {
        // Every proposal of that call id (a model may reuse ids across turns).
        let found: Vec<serde_json::Value> = entries
            .iter()
            .filter_map(|e| match &e.event {
                Event::DecisionProposed { turn, decision, .. } => Some((*turn, decision)),
                _ => None,
            })
            .flat_map(|(turn, decision)| {
                let calls = match decision {
                    agent_core::Decision::ToolCalls { calls }
                    | agent_core::Decision::RequestApproval { calls, .. } => calls.as_slice(),
                    _ => &[],
                };
                calls
                    .iter()
                    .filter(|c| c.id.as_str() == id)
                    .map(move |c| {
                        serde_json::json!({
                            "turn": turn,
                            "call_id": c.id,
                            "tool": c.name,
                            "arguments": c.arguments,
                        })
                    })
                    .collect::<Vec<_>>()
            })
            .collect();
        if found.is_empty() {
            return Err(usage(format!(
                "run {run_id} has no call {id:?}; `agent show {run_id}` lists its calls"
            )));
        }
        let value = serde_json::Value::Array(found);
        if json {
            say(format_args!("{value}\n"));
        } else {
            say(format_args!(
                "{}\n",
                serde_json::to_string_pretty(&value).unwrap_or_default()
            ));
        }
        return Ok(EXIT_OK);
    }
    if json {
        let value = serde_json::json!({ "run_id": run_id, "events": entries });
        say(format_args!("{value}\n"));
    } else {
        say(format_args!("{}", render::timeline(run_id, &entries)));
    }
    report_damage(&store)
}
