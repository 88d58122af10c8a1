//! From resolved [`Settings`] to working parts: the model, the gateway (with the trust check
//! before anything a project file brings is used), the runtime over the store. Every side
//! effect of setting up (reading a script, starting MCP servers, opening the store) is here.

use std::io::{IsTerminal as _, Write as _};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use agent_providers::{HttpModel, Model, ReplayModel, ScriptModel};
use agent_runtime::{CancellationToken, ModelSummarizer, Redactor, Runtime, StoreBlobs};
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
    if let Some(warning) = http.clear_text_key() {
        crate::app::tell(format_args!("agent: warning: {warning}\n"));
    }
    if let Some(warning) = http.ollama_through_compat() {
        crate::app::tell(format_args!("agent: warning: {warning}\n"));
    }
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
    if let Some(wait) = settings.answer_timeout {
        model = model.with_answer_timeout(wait);
    }
    if let Some(wait) = settings.idle_timeout {
        model = model.with_idle_timeout(wait);
    }
    if let Some(cache) = settings.prompt_cache {
        model = model.with_prompt_cache(cache);
    }
    model = model
        .with_thinking(settings.thinking)
        .with_effort(settings.effort);
    if let Some(cap) = settings.max_output_tokens {
        model = model.with_max_output_tokens(cap);
    }
    if let Some(policy) = &settings.retry {
        model = model.with_retry(policy.clone());
    }
    if let Some(price) = settings.prices.get(&http.model) {
        model = model.with_price(*price);
    }
    // The window the projection keeps the prompt within: Ollama loads the model with it.
    model = model.with_context_window(settings.context_config(&http.model).context_window);
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
/// trusted. With it, the MCP configuration its servers were started from.
pub fn gateway(
    settings: &Settings,
    rt: &tokio::runtime::Runtime,
    access: StoreAccess<'_>,
) -> Result<(Gateway, Option<McpConfig>), Failure> {
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
    // workspace's repository, any nested in it, and any bare one.
    ws = ws
        .protect_everywhere(".git", "a git directory")
        .protect_bare_repositories("a bare repository")
        .protect_hooks_paths("the hooks a repository's core.hooksPath names")
        .protect_config_includes("a file git reads as config (a config includes it)");
    // Nor the files that set up agent itself: a model could take a `deny` rule out, name
    // a costlier model, or loosen the schema its answers are checked against, for the
    // next run, with no question asked (only what widens needs trust). Where no such file
    // is yet, where one would be found.
    let here = PathBuf::from(crate::config::DEFAULT_FILE);
    ws = ws.protect(&here, "agent's settings file");
    if let Some(file) = &settings.file {
        ws = ws.protect(&file.path, "agent's settings file");
    }
    ws = ws.protect(&dir.join(".mcp.json"), "agent's MCP configuration");
    if let McpSource::Flag(path) | McpSource::File(path) = &settings.mcp {
        ws = ws.protect(path, "agent's MCP configuration");
    }
    if let Some(schema) = &settings.file_answer.0 {
        ws = ws.protect(schema, "the answer schema in use");
    }
    // A workspace that is a home directory (or holds one) holds the person's keys: a model
    // prompted by what it read there reads them, and its provider with it, only if a
    // person says so.
    ws = ws.conceal_credentials();
    let root = ws.root().to_path_buf();
    // Read once: the servers started are the ones judged, whatever the file says later.
    let mcp = trusted_project(settings, &root)?;
    let mut gateway = Gateway::with_builtins(ws)
        .map_err(failed)?
        .with_policy(settings.policy.clone());
    for h in &settings.hooks {
        gateway = gateway.with_hook(Arc::new(hook(h, &root)?));
    }
    if !settings.shell_env.is_empty() || settings.sandbox.is_some() {
        // A name mistyped passes nothing: said, not silently run without it.
        for name in &settings.shell_env {
            if std::env::var_os(name).is_none() {
                crate::app::tell(format_args!(
                    "agent: shell_env {name}: no such variable in this environment; shell \
                     commands will not have it\n"
                ));
            }
        }
        let mut shell = agent_tools::builtin::Shell::passing(settings.shell_env.iter().cloned());
        if let Some(sandbox) = &settings.sandbox {
            // Told now, not by every command the model tries.
            rt.block_on(sandbox.probe(gateway.workspace()))
                .map_err(|why| {
                    let why = why.trim_start_matches("its sandbox cannot be made: ");
                    usage(format!(
                        "commands cannot be sandboxed here: {why}; run without --sandbox (and \
                     without sandbox in agent.toml)"
                    ))
                })?;
            shell = shell.sandboxed(sandbox.clone());
        }
        gateway
            .replace(Arc::new(agent_tools::Typed(shell)))
            .map_err(failed)?;
    }
    if settings.sub_agents {
        for tool in agent_tools::builtin::Delegate::both() {
            gateway.register(Arc::new(tool)).map_err(usage)?;
        }
    }
    if let Some(McpInUse { config, .. }) = &mcp {
        let started = rt.block_on(mcp::connect_reporting_in(
            config,
            gateway.workspace(),
            settings.mcp_timeout,
        ));
        let tools = started.map_err(|e| match e {
            mcp::McpError::TimedOut { .. } => usage(format!(
                "{e}; set MCP_TIMEOUT (milliseconds) to wait longer"
            )),
            other => usage(other),
        })?;
        for left in &tools.left_out {
            crate::app::tell(format_args!(
                "agent: MCP server {:?}: its tool {:?} is left out: {}\n",
                left.server, left.tool, left.reason
            ));
        }
        for tool in tools.tools {
            gateway.register(tool).map_err(usage)?;
        }
    }
    if let Some(run) = &settings.replay_tools {
        let log = access.load(run)?;
        gateway = gateway.with_replay(ToolReplay::from_log(run, &log));
    }
    Ok((gateway, mcp.map(|m| m.config)))
}

/// An MCP configuration in use, read once: its servers are started, the values of their
/// `env` blocks redacted and, when a project brought it, its trust judged, all from the
/// same bytes.
pub struct McpInUse {
    /// What it says.
    pub config: McpConfig,
    /// The file as it was read, when the project brought it (the workspace's `.mcp.json`,
    /// or the one an agent.toml found in the workspace names) and it starts servers.
    pub project: Option<trust::ProjectFile>,
    /// The SHA-256 of the bytes read.
    pub sha256: String,
}

/// Reads the MCP configuration in use (once), then refuses, or on a terminal asks once,
/// for the project files in use that are not trusted as they were read: nothing a project
/// file brings is used, or started, before a person trusted it.
pub fn trusted_project(settings: &Settings, root: &Path) -> Result<Option<McpInUse>, Failure> {
    let mcp = mcp_in_use(settings, root)?;
    ensure_trusted(
        &untrusted_parts(settings, mcp.as_ref())?,
        interactive(settings),
    )?;
    Ok(mcp)
}

/// Reads the MCP configuration in use, if any ([`mcp_path`]).
pub fn mcp_in_use(settings: &Settings, root: &Path) -> Result<Option<McpInUse>, Failure> {
    let Some(path) = mcp_path(settings, root) else {
        return Ok(None);
    };
    // A file the project brings needs trust for its own content: trusting an agent.toml
    // that names `tools/mcp.json` is not trusting whatever that file says next week.
    let brought = match &settings.mcp {
        McpSource::Flag(_) => false,
        McpSource::File(_) => settings.file.as_ref().is_some_and(|f| !f.explicit),
        McpSource::Workspace => true,
    };
    let bytes = trust::read_once(&path, !brought).map_err(|e| usage(format!("MCP config {e}")))?;
    let sha256 = agent_core::sha256_hex(&bytes);
    if let Some(judged) = settings.mcp_sha256.as_ref().filter(|h| **h != sha256) {
        return Err(usage(format!(
            "MCP config {} changed since this run was submitted (sha256 {} then, {} now); \
             submit the run again to use it as it is",
            path.display(),
            judged.chars().take(16).collect::<String>(),
            &sha256[..16]
        )));
    }
    let config = McpConfig::parse(&path, &bytes).map_err(usage)?;
    let project = if brought && !config.servers.is_empty() {
        let mut file = trust::ProjectFile::of(&path, &bytes).map_err(usage)?;
        file.brings = config
            .servers
            .iter()
            .map(|(name, s)| {
                let mut line = vec![s.command.clone()];
                line.extend(s.args.iter().cloned());
                format!("MCP server {name} (runs {})", line.join(" "))
            })
            .collect();
        Some(file)
    } else {
        None
    };
    Ok(Some(McpInUse {
        config,
        project,
        sha256,
    }))
}

/// The project files in use that bring something needing trust, and what they bring: each
/// as it was read and parsed, never read again to be judged.
fn untrusted_parts(
    settings: &Settings,
    mcp: Option<&McpInUse>,
) -> Result<Vec<trust::ProjectFile>, Failure> {
    let mut files = Vec::new();
    if let (Some(used), false) = (&settings.file, settings.file_brings.is_empty()) {
        files.push(trust::ProjectFile {
            path: std::path::absolute(&used.path)
                .map_err(|e| usage(format!("{}: {e}", used.path.display())))?,
            hash: used.sha256.clone(),
            brings: settings.file_brings.clone(),
        });
    }
    files.extend(mcp.and_then(|m| m.project.clone()));
    Ok(files)
}

/// The most characters of one thing a question or a refusal lists (a command from a file
/// or a log), the rest counted.
const SHOWN_ITEM_CHARS: usize = 1_000;

/// `item` escaped for the terminal, cut to [`SHOWN_ITEM_CHARS`] with a count of the rest.
fn shown_item(item: &str) -> String {
    match item.char_indices().nth(SHOWN_ITEM_CHARS) {
        None => render::escape(item),
        Some((cut, _)) => format!(
            "{}... ({} more characters)",
            render::escape(&item[..cut]),
            item[cut..].chars().count()
        ),
    }
}

/// Asks the person at the terminal: `header`, then each of `items` on a line of its own
/// (escaped: they may come from a file or a log), then `question` with `[y/N]`. Yes only
/// for `y` or `yes`.
fn ask(header: &str, items: &[String], question: &str) -> bool {
    let mut err = std::io::stderr().lock();
    let _ = writeln!(err, "{header}");
    for item in items {
        let _ = writeln!(err, "  - {}", shown_item(item));
    }
    let _ = write!(err, "{question} [y/N] ");
    let _ = err.flush();
    drop(err);
    let mut answer = String::new();
    let _ = std::io::stdin().read_line(&mut answer);
    matches!(answer.trim().to_ascii_lowercase().as_str(), "y" | "yes")
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
        let header = format!("agent: {path} is not trusted yet. It brings:");
        if !ask(&header, &file.brings, "Trust this file as it is now?") {
            return Err(usage(format!(
                "{path} was not trusted; nothing was run (trust it later with `agent trust {path}`)"
            )));
        }
        trusted.trust(file).map_err(usage)?;
    }
    Ok(())
}

/// The answer check commands a run recorded at its start, if any.
fn recorded_checks(log: &[agent_core::Entry]) -> &[String] {
    match log.first().map(|e| &e.event) {
        Some(agent_core::Event::RunStarted { manifest, .. }) => manifest
            .answer
            .as_ref()
            .map_or(&[], |a| a.checks.as_slice()),
        _ => &[],
    }
}

/// Remembers that the run `run_id`, started here, runs `checks` on its final answer: the
/// person gave them (flags, or an agent.toml they trusted), so continuing it asks nothing.
/// Said on stderr, not fatal, when the trust file cannot be written: continuing the run
/// then asks.
pub fn trust_own_checks(run_id: &str, checks: &[String]) {
    if checks.is_empty() {
        return;
    }
    let saved = trust::Trusted::load().and_then(|mut t| t.trust_checks(run_id, checks));
    if let Err(e) = saved {
        crate::app::tell(format_args!(
            "agent: cannot remember this run's answer checks ({e}); continuing it will ask \
             about them\n"
        ));
    }
}

/// Refuses, or on a terminal asks once, to continue a run whose recorded answer check
/// commands were not given here: a run store is data (a shared database, a repository's
/// `.agent`), and whoever wrote the log chose the commands that run when the run ends.
pub fn ensure_checks_trusted(
    run_id: &str,
    log: &[agent_core::Entry],
    interactive: bool,
) -> Result<(), Failure> {
    let checks = recorded_checks(log);
    if checks.is_empty() {
        return Ok(());
    }
    let mut trusted = trust::Trusted::load().map_err(usage)?;
    if trusted.trusts_checks(run_id, checks) {
        return Ok(());
    }
    let listed = checks
        .iter()
        .map(|c| shown_item(c))
        .collect::<Vec<_>>()
        .join("; ");
    if !interactive {
        return Err(usage(format!(
            "run {run_id} runs commands on its final answer that were not given here ({listed}); \
             read them, then run `agent trust --run {run_id}`"
        )));
    }
    let header = format!(
        "agent: run {run_id} was not started here. When it ends, it runs these commands on its \
         answer:"
    );
    if !ask(&header, checks, "Let them run?") {
        return Err(usage(format!(
            "run {run_id} was not continued; nothing was run (let its checks run later with \
             `agent trust --run {run_id}`)"
        )));
    }
    trusted.trust_checks(run_id, checks).map_err(usage)
}

/// Lets the run `run_id`'s recorded answer check commands run (`agent trust --run`).
pub fn trust_run_checks(run_id: &str, log: &[agent_core::Entry]) -> Result<Vec<String>, Failure> {
    let checks = recorded_checks(log).to_vec();
    if !checks.is_empty() {
        let mut trusted = trust::Trusted::load().map_err(usage)?;
        trusted.trust_checks(run_id, &checks).map_err(usage)?;
    }
    Ok(checks)
}

/// The secrets to keep out of the log: the environment's secret-named variables and every
/// value of the `env` block of the MCP servers in use (where MCP configs keep tokens).
pub fn redactor(mcp: Option<&McpConfig>) -> Redactor {
    let redactor = Redactor::from_env();
    match mcp {
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
    shown: bool,
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
        .with_check_commands_in(&settings.workspace, settings.check_timeout)
        .with_checks_passing(settings.shell_env.iter().cloned())
        .with_sandbox(settings.sandbox.clone());
    if real_model {
        runtime = runtime.with_summarizer(Arc::new(ModelSummarizer::new(model)));
    } else {
        // A script has no tokenizer of its own: its prompts are estimated at four bytes a
        // token, and no process pays for loading o200k to play one.
        runtime = runtime.with_token_counter(Arc::new(agent_context::CharEstimate));
    }
    let events = settings.events;
    if events || shown {
        runtime = runtime.with_event_sink(Arc::new(move |entry| {
            if events {
                print_event(entry);
            }
            // What a run shows on a terminal: a person's message from elsewhere, as it
            // is committed, before the model call that reads it.
            if let (true, agent_core::Event::UserNote { text }) = (shown, &entry.event) {
                crate::app::tell(format_args!(
                    "  ✉ the run reads a message: {}\n",
                    render::cut(&format!("{text:?}"), 200)
                ));
            }
        }));
    }
    runtime
}

/// `--events`: the committed entry, a JSON line on standard output.
fn print_event(entry: &agent_core::Entry) {
    if let Ok(line) = serde_json::to_string(entry) {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "{line}");
        let _ = out.flush();
    }
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

/// A token cancelled by SIGTERM (a service manager, `timeout`, `docker stop`) or SIGHUP (the
/// terminal closed), for
/// [`Runtime::with_drain`]: the run is let go at its next step, what is in flight finished
/// and committed, and can be resumed with nothing in doubt. A second SIGTERM ends the
/// process at once (exit 143), the run interrupted as by a crash.
pub fn drain_on_terminate() -> Result<CancellationToken, Failure> {
    use tokio::signal::unix::SignalKind;
    drain_on_signals(
        // A closed terminal (SIGHUP, an SSH session that dropped) is asked the same.
        &[SignalKind::terminate(), SignalKind::hangup()],
        "agent: asked to stop: the run stops at its next step, once what is in flight is \
         done and committed (again to stop at once)\n",
        143,
    )
}

/// A token cancelled by the first of `signals`, saying `stopping`; the next ends the
/// process at once with `code`. Listened for on a thread of its own, whatever the process
/// is doing (driving a run, or waiting for a person at the terminal); every handler is in
/// place when this returns, so a signal a moment later is never the default one that ends
/// the process.
pub fn drain_on_signals(
    signals: &[tokio::signal::unix::SignalKind],
    stopping: &'static str,
    code: i32,
) -> Result<CancellationToken, Failure> {
    let rt = tokio_one_run()?;
    let mut listening = Vec::with_capacity(signals.len());
    let ignored = ignored_signals();
    {
        let _entered = rt.enter();
        // A signal the process was started ignoring stays ignored (`nohup` promises that).
        for &kind in signals.iter().filter(|k| !ignored(k.as_raw_value())) {
            let signal = tokio::signal::unix::signal(kind)
                .map_err(|e| failed(format!("cannot listen for signals: {e}")))?;
            listening.push(signal);
        }
    }
    let drain = CancellationToken::new();
    let token = drain.clone();
    std::thread::spawn(move || {
        rt.block_on(async move {
            let (came, mut signals) = tokio::sync::mpsc::unbounded_channel();
            for mut signal in listening {
                let came = came.clone();
                tokio::spawn(async move {
                    while signal.recv().await.is_some() && came.send(()).is_ok() {}
                });
            }
            if signals.recv().await.is_none() {
                return;
            }
            // Waiting for a person, nothing is in flight and all is committed.
            if let Some(code) = at_prompt() {
                crate::app::tell(format_args!(
                    "\nagent: asked to stop while waiting for an answer; all is committed\n"
                ));
                std::process::exit(i32::from(code));
            }
            crate::app::tell(format_args!("{stopping}"));
            token.cancel();
            if signals.recv().await.is_some() {
                std::process::exit(code);
            }
        });
    });
    Ok(drain)
}

/// The signals this process was started ignoring (`SigIgn` of `/proc/self/status`, as
/// `nohup` leaves SIGHUP), as a test of a signal's number; none where that cannot be read.
fn ignored_signals() -> impl Fn(i32) -> bool {
    let mask = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            let line = status.lines().find_map(|l| l.strip_prefix("SigIgn:"))?;
            u64::from_str_radix(line.trim(), 16).ok()
        })
        .unwrap_or(0);
    move |signal| (1..=64).contains(&signal) && mask & (1u64 << (signal - 1)) != 0
}

/// Whether the command waits for a person at the terminal now ([`prompting`]), and the
/// exit code it ends with if asked to stop then ([`stopped_at_prompt_with`]).
static AT_PROMPT: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
static AT_PROMPT_CODE: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);

/// The exit code of this command when a stop signal comes while it waits for a person
/// ([`prompting`]): 3 for a run paused for its approval, 0 (the default) for a chat between
/// exchanges.
pub fn stopped_at_prompt_with(code: u8) {
    AT_PROMPT_CODE.store(code, std::sync::atomic::Ordering::SeqCst);
}

/// The command waits for a person at the terminal until this is dropped: a stop signal
/// (SIGTERM) then ends it at once, as nothing is in flight and all is committed.
#[must_use]
pub fn prompting() -> Prompting {
    AT_PROMPT.store(true, std::sync::atomic::Ordering::SeqCst);
    Prompting
}

/// See [`prompting`].
pub struct Prompting;

impl Drop for Prompting {
    fn drop(&mut self) {
        AT_PROMPT.store(false, std::sync::atomic::Ordering::SeqCst);
    }
}

/// The exit code to stop with when the command waits for a person now.
fn at_prompt() -> Option<u8> {
    AT_PROMPT
        .load(std::sync::atomic::Ordering::SeqCst)
        .then(|| AT_PROMPT_CODE.load(std::sync::atomic::Ordering::SeqCst))
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
    let (model, (gateway, mcp)) = {
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
    let runtime = runtime(
        settings,
        model,
        gateway,
        store,
        redactor(mcp.as_ref()),
        shown,
    );
    Ok(runtime.with_inline_store(inline))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::settings::{ConfigFile, Env};
    use crate::{Limits, Setup};

    /// A project file is judged on the bytes its settings came from: written over after
    /// it was read (by a trusted version, say), it is still judged as it was read.
    #[test]
    fn a_project_file_is_judged_as_it_was_read_not_as_it_is_later() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("agent.toml");
        let read = "[policy]\nallow = [\"shell\"]\n";
        std::fs::write(&path, read).unwrap();
        let (path, config, sha256) = crate::config::load(Some(&path)).unwrap().unwrap();
        let file = ConfigFile {
            path,
            config,
            explicit: false,
            sha256,
        };
        let settings = Settings::resolve(
            Some(file),
            None,
            &Setup::default(),
            &Limits::default(),
            Env::default(),
        )
        .unwrap();
        std::fs::write(dir.path().join("agent.toml"), "# nothing\n").unwrap();
        let parts = untrusted_parts(&settings, None).unwrap();
        assert_eq!(parts.len(), 1);
        assert_eq!(parts[0].hash, agent_core::sha256_hex(read.as_bytes()));
        assert_eq!(parts[0].brings, ["allow rules shell"]);
        assert_eq!(parts[0].path, dir.path().join("agent.toml"));
    }
}
