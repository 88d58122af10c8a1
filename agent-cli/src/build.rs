//! From resolved [`Settings`] to working parts: the model, the gateway (with the trust check
//! before anything a project file brings is used), the runtime over the store. Every side
//! effect of setting up (reading a script, starting MCP servers, opening the store) is here.

use std::io::{IsTerminal as _, Write as _};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use agent_providers::{HttpModel, Model, ReplayModel, ScriptModel};
use agent_runtime::{CancellationToken, EventSink, ModelSummarizer, Redactor, Runtime, StoreBlobs};
use agent_tools::mcp::{self, McpConfig};
use agent_tools::{CommandHook, Gateway, ToolReplay, Workspace};

use crate::failure::{Failure, failed, usage};
use crate::render;
use crate::settings::{HookSetting, McpSource, ModelChoice, Settings};
use crate::stores::{OpenStore, StoreLocation};
use crate::trust;

/// Whether answer text was streamed to the terminal during the current model call (so an
/// interactive session does not print the answer twice).
pub static STREAMED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// How a command reaches the store for recorded runs (replays).
#[derive(Clone, Copy)]
pub enum StoreAccess<'a> {
    /// Not open yet: open it for the look-up only.
    At(&'a StoreLocation),
    /// Already open in this process (sled allows one handle).
    Open(&'a OpenStore),
}

impl StoreAccess<'_> {
    fn load(self, run: &str) -> Result<Vec<agent_core::Entry>, Failure> {
        Ok(match self {
            StoreAccess::At(location) => OpenStore::must_exist(location)?.as_store().load(run)?,
            StoreAccess::Open(store) => store.as_store().load(run)?,
        })
    }
}

/// The model `choice` names. `live` streams answer text to the terminal as it comes.
pub fn model(
    choice: &ModelChoice,
    settings: &Settings,
    access: StoreAccess<'_>,
    live: bool,
) -> Result<Arc<dyn Model>, Failure> {
    let http = match choice {
        ModelChoice::Script(path) => {
            return Ok(Arc::new(ScriptModel::from_path(path).map_err(usage)?));
        }
        ModelChoice::Replay(run) => {
            let log = access.load(run)?;
            return Ok(Arc::new(ReplayModel::from_log(run, &log)));
        }
        ModelChoice::Http(http) => http,
    };
    let (url, key) = http.ready().map_err(usage)?;
    let mut model = HttpModel::new(
        http.dialect,
        http.provider,
        &http.model,
        url,
        key.map(str::to_owned),
    )
    .map_err(failed)?;
    if let Some(stream) = settings.stream {
        model = model.with_streaming(stream);
    }
    if let Some(cache) = settings.prompt_cache {
        model = model.with_prompt_cache(cache);
    }
    model = model.with_thinking(settings.thinking);
    if let Some(policy) = &settings.retry {
        model = model.with_retry(policy.clone());
    }
    if let Some(price) = settings.prices.get(&http.model) {
        model = model.with_price(*price);
    }
    if live && std::io::stderr().is_terminal() {
        // The answer appears as it is written.
        model = model.with_text_sink(Arc::new(|text: &str| {
            STREAMED.store(true, std::sync::atomic::Ordering::Relaxed);
            crate::progress::stop_spinner();
            let mut err = std::io::stderr().lock();
            let _ = write!(err, "{}", crate::render::for_terminal(text));
            let _ = err.flush();
        }));
    }
    Ok(Arc::new(model))
}

fn hook(h: &HookSetting, cwd: &Path) -> Result<CommandHook, Failure> {
    let mut hook = CommandHook::new(h.event, h.command.clone(), h.matcher.as_deref(), cwd)
        .map_err(|e| {
            let text = e.to_string();
            let why = text.lines().last().unwrap_or_default().trim().to_owned();
            usage(format!("hook {:?}: matcher: {why}", h.command))
        })?;
    if let Some(timeout) = h.timeout {
        hook.timeout = timeout;
    }
    Ok(hook)
}

/// The MCP configuration in use: `--mcp-config`, the settings file's, or the workspace's
/// `.mcp.json` when there is one.
pub fn mcp_path(settings: &Settings, root: &Path) -> Option<PathBuf> {
    match &settings.mcp {
        McpSource::Flag(path) | McpSource::File(path) => Some(path.clone()),
        McpSource::Workspace => Some(root.join(".mcp.json")).filter(|p| p.is_file()),
    }
}

/// Whether this process may ask a person: stdin and stderr are terminals, and the person
/// did not say `--no-input`.
pub fn interactive(settings: &Settings) -> bool {
    !settings.no_input && std::io::stdin().is_terminal() && std::io::stderr().is_terminal()
}

/// The gateway: built-in tools confined to the workspace, the policy, the hooks, and the
/// tools of the MCP servers (started on `rt`) — once the project files that bring them are
/// trusted.
pub fn gateway(
    settings: &Settings,
    rt: &tokio::runtime::Runtime,
    access: StoreAccess<'_>,
) -> Result<Gateway, Failure> {
    let dir = &settings.workspace;
    let mut ws =
        Workspace::new(dir).map_err(|e| usage(format!("--workspace {}: {e}", dir.display())))?;
    // A model allowed to write files must not rewrite the log its run is judged by, nor
    // what this person trusts.
    if let StoreLocation::Dir(store) = &settings.store {
        ws = ws.protect(store, "the run store");
    }
    if let Ok(config) = crate::trust::config_dir() {
        ws = ws.protect(&config, "agent's own settings");
    }
    // Its hooks and config run commands the next time the person uses git: the
    // workspace's repository, and any nested in it.
    ws = ws.protect_everywhere(".git", "a git directory");
    let root = ws.root().to_path_buf();
    // Nothing a project file brings is used, or started, before a person trusted it.
    ensure_trusted(&untrusted_parts(settings, &root)?, interactive(settings))?;
    let mut gateway = Gateway::with_builtins(ws)
        .map_err(failed)?
        .with_policy(settings.policy.clone());
    for h in &settings.hooks {
        gateway = gateway.with_hook(Arc::new(hook(h, &root)?));
    }
    if !settings.shell_env.is_empty() {
        // A name mistyped passes nothing: said, not silently run without it.
        for name in &settings.shell_env {
            if std::env::var_os(name).is_none() {
                crate::app::tell(format_args!(
                    "agent: shell_env {name}: no such variable in this environment; shell \
                     commands will not have it\n"
                ));
            }
        }
        let shell = agent_tools::builtin::Shell::passing(settings.shell_env.iter().cloned());
        gateway
            .replace(Arc::new(agent_tools::Typed(shell)))
            .map_err(failed)?;
    }
    if settings.sub_agents {
        for tool in agent_tools::builtin::Delegate::both() {
            gateway.register(Arc::new(tool)).map_err(usage)?;
        }
    }
    if let Some(path) = mcp_path(settings, &root) {
        let config = McpConfig::from_path(&path).map_err(usage)?;
        let started = rt.block_on(mcp::connect_within(&config, &root, settings.mcp_timeout));
        let tools = started.map_err(|e| match e {
            mcp::McpError::TimedOut { .. } => usage(format!(
                "{e}; set MCP_TIMEOUT (milliseconds) to wait longer"
            )),
            other => usage(other),
        })?;
        for tool in tools {
            gateway.register(tool).map_err(usage)?;
        }
    }
    if let Some(run) = &settings.replay_tools {
        let log = access.load(run)?;
        gateway = gateway.with_replay(ToolReplay::from_log(run, &log));
    }
    Ok(gateway)
}

/// The project files in use that bring something needing trust, and what they bring.
fn untrusted_parts(settings: &Settings, root: &Path) -> Result<Vec<trust::ProjectFile>, Failure> {
    let mut files = Vec::new();
    if let (Some((path, _)), false) = (&settings.file, settings.file_brings.is_empty()) {
        let (mut file, _) = trust::ProjectFile::read(path).map_err(usage)?;
        file.brings = settings.file_brings.clone();
        files.push(file);
    }
    if settings.mcp == McpSource::Workspace {
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

/// The secrets to keep out of the log: the environment's secret-named variables and every
/// value of the `env` block of the MCP servers in use (where MCP configs keep tokens).
pub fn redactor(settings: &Settings) -> Redactor {
    let redactor = Redactor::from_env();
    let root = settings
        .workspace
        .canonicalize()
        .unwrap_or_else(|_| settings.workspace.clone());
    match mcp_path(settings, &root).and_then(|p| McpConfig::from_path(&p).ok()) {
        Some(config) => redactor.with_secrets(config.secrets()),
        None => redactor,
    }
}

/// The runtime over `store`: outputs too large for the model are kept whole in the store
/// and read back with `read_result` (as are older results the prompt shows shortened); a
/// real model writes the summaries of compaction and has its tokens counted with o200k.
pub fn runtime(
    settings: &Settings,
    model: Arc<dyn Model>,
    gateway: Gateway,
    store: OpenStore,
    redactor: Redactor,
) -> Runtime {
    let store = store.into_shared();
    let blobs = Arc::new(StoreBlobs::new(Arc::clone(&store)).with_redactor(redactor.clone()));
    let gateway = gateway
        .with_blob_sink(blobs.clone())
        .with_result_source(blobs);
    let real_model = model.provider() != "script";
    let context = settings.context_config(model.model());
    let mut runtime = Runtime::new(Arc::clone(&model), Arc::new(gateway), store)
        .with_redactor(redactor)
        .with_context(context)
        .with_answer_checks(settings.answer.clone())
        .with_check_commands_in(&settings.workspace, settings.check_timeout);
    if real_model {
        runtime = runtime.with_summarizer(Arc::new(ModelSummarizer::new(model)));
    } else {
        // A script has no tokenizer of its own: its prompts are estimated at four bytes a
        // token, and no process pays for loading o200k to play one.
        runtime = runtime.with_token_counter(Arc::new(agent_context::CharEstimate));
    }
    if settings.events {
        runtime = runtime.with_event_sink(event_printer());
    }
    runtime
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

/// The async runtime of a command that drives one run: one thread, which also makes the
/// run's commits (see [`runtime`]); tools and tokio's blocking pool still run beside it.
pub fn tokio_one_run() -> Result<tokio::runtime::Runtime, Failure> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| failed(format!("cannot start the async runtime: {e}")))
}

/// The async runtime of a command that drives several runs at once, or talks to a person
/// while a run goes on (workers, `agent chat`).
pub fn tokio() -> Result<tokio::runtime::Runtime, Failure> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| failed(format!("cannot start the async runtime: {e}")))
}

/// A token cancelled by the next Ctrl-C (SIGINT): no new side effect starts after that.
/// The handler is in place when this returns, so a Ctrl-C a moment later is never the
/// default one that kills the process.
pub fn cancel_on_ctrl_c(rt: &tokio::runtime::Runtime) -> CancellationToken {
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

/// Where the run store comes from for [`build`].
pub enum StoreSource<'a> {
    /// A store to open (or create) once every input is checked.
    At(&'a StoreLocation),
    /// A store this process already opened.
    Open(Box<OpenStore>),
}

/// The whole runtime of a command that drives runs: the model `choice` names, the gateway,
/// the store. `observe` shows each tool call on the terminal as it runs.
pub fn build(
    settings: &Settings,
    choice: &ModelChoice,
    store: StoreSource<'_>,
    rt: &tokio::runtime::Runtime,
    live: bool,
    observe: bool,
) -> Result<Runtime, Failure> {
    let (model, gateway) = {
        let access = match &store {
            StoreSource::At(location) => StoreAccess::At(location),
            StoreSource::Open(store) => StoreAccess::Open(store.as_ref()),
        };
        (
            model(choice, settings, access, live)?,
            gateway(settings, rt, access)?,
        )
    };
    // On a terminal, the run shows what it does as it does it.
    let shown = observe || std::io::stderr().is_terminal();
    let model: Arc<dyn Model> = if shown {
        Arc::new(crate::progress::Shown::new(model))
    } else {
        model
    };
    let gateway = if shown {
        gateway.with_observer(crate::chat::tool_lines())
    } else {
        gateway
    };
    // Written to only now, when everything that can be wrong with the input was checked.
    let store = match store {
        StoreSource::At(location) => OpenStore::create(location)?.writable()?,
        StoreSource::Open(store) => *store,
    };
    // A current-thread runtime drives this one run: its commits need no other thread. Not
    // PostgreSQL's: its synchronous client runs a runtime of its own, which cannot start
    // inside this one.
    let inline = rt.handle().runtime_flavor() == tokio::runtime::RuntimeFlavor::CurrentThread
        && matches!(store, OpenStore::Dir(_));
    Ok(runtime(settings, model, gateway, store, redactor(settings)).with_inline_store(inline))
}
