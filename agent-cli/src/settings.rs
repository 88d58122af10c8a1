//! One resolved configuration per command: each value from its flag, else `agent.toml`,
//! else the environment, else the default, validated here and nowhere else. Resolving reads
//! no file and starts nothing: the file's contents and the environment's keys come in as
//! values, so every precedence rule is a unit test (`tests/it/settings.rs`). `build` turns
//! a `Settings` into working parts.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use agent_context::ContextConfig;
use agent_core::Budget;
use agent_providers::{Dialect, ModelSpec, Price, RetryPolicy};
use agent_tools::{Action, HookEvent, Policy};

use crate::args::{Limits, Setup};
use crate::config::{self, Config};
use crate::stores::StoreLocation;

/// A setting that makes no sense; the message names it and what to give instead. Always
/// a usage error: nothing was written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct SettingsError(pub String);

fn bad(message: impl Into<String>) -> SettingsError {
    SettingsError(message.into())
}

/// What resolution takes from the environment, read once by the command line and passed
/// in: the providers' keys.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Env {
    /// `OPENAI_API_KEY` (also sent to OpenAI-compatible servers when set).
    pub openai_key: Option<String>,
    /// `ANTHROPIC_API_KEY`.
    pub anthropic_key: Option<String>,
    /// `OLLAMA_API_KEY` (Ollama's cloud; a local server needs none).
    pub ollama_key: Option<String>,
    /// `MCP_TIMEOUT`, in milliseconds (as Claude Code reads it): how long an MCP server
    /// may take to start and list its tools.
    pub mcp_timeout_ms: Option<u64>,
    /// `AGENT_STORE`: the store when `--store` does not name one (a directory or a
    /// PostgreSQL URL; it may hold a password).
    pub store: Option<String>,
}

impl std::fmt::Debug for Env {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the keys themselves.
        f.debug_struct("Env")
            .field("openai_key", &self.openai_key.is_some())
            .field("anthropic_key", &self.anthropic_key.is_some())
            .field("ollama_key", &self.ollama_key.is_some())
            .field("mcp_timeout_ms", &self.mcp_timeout_ms)
            .field("store", &self.store.as_deref().map(StoreLocation::parse))
            .finish()
    }
}

impl Env {
    /// The keys this process has (empty values count as unset).
    pub fn from_process() -> Env {
        let key = |var: &str| std::env::var(var).ok().filter(|k| !k.trim().is_empty());
        Env {
            openai_key: key("OPENAI_API_KEY"),
            anthropic_key: key("ANTHROPIC_API_KEY"),
            ollama_key: key("OLLAMA_API_KEY"),
            mcp_timeout_ms: std::env::var("MCP_TIMEOUT")
                .ok()
                .and_then(|v| v.trim().parse::<u64>().ok())
                .filter(|ms| *ms > 0),
            store: std::env::var("AGENT_STORE")
                .ok()
                .filter(|s| !s.trim().is_empty()),
        }
    }
}

/// The settings file as read: its contents, where it is (relative paths in it are taken
/// from its directory), and whether the command line named it (`--config`: trusted as
/// given).
#[derive(Debug)]
pub struct ConfigFile {
    /// Where it was read.
    pub path: PathBuf,
    /// What it says.
    pub config: Config,
    /// Named by `--config`.
    pub explicit: bool,
    /// The SHA-256 of the bytes `config` was parsed from: its trust is judged by them.
    pub sha256: String,
}

/// The settings file a command uses, as it was read.
#[derive(Clone, Debug)]
pub struct FileInUse {
    /// Where it was read.
    pub path: PathBuf,
    /// Named by `--config`: used as given, with no trust asked.
    pub explicit: bool,
    /// The SHA-256 of the bytes the settings were parsed from.
    pub sha256: String,
}

impl ConfigFile {
    /// `explicit`, or `./agent.toml` when it exists; `None` when there is no file.
    pub fn load(explicit: Option<&Path>) -> Result<Option<ConfigFile>, SettingsError> {
        Ok(config::load(explicit)
            .map_err(bad)?
            .map(|(path, config, sha256)| ConfigFile {
                path,
                config,
                explicit: explicit.is_some(),
                sha256,
            }))
    }
}

/// The model a command uses, as named (`--model` or `model` in agent.toml).
#[derive(Clone, Debug, PartialEq)]
pub enum ModelChoice {
    /// An offline script.
    Script(PathBuf),
    /// The decisions of a recorded run.
    Replay(String),
    /// A provider's HTTP API.
    Http(HttpChoice),
}

/// A model behind an HTTP API, with everything needed to reach it.
#[derive(Clone, PartialEq)]
pub struct HttpChoice {
    /// The wire format.
    pub dialect: Dialect,
    /// `openai`, `openai-responses`, `anthropic`, `ollama` or `openai-compat`.
    pub provider: &'static str,
    /// The model's name at the provider.
    pub model: String,
    /// Where the API is (`None`: an OpenAI-compatible server needs one, and none was given).
    pub base_url: Option<String>,
    /// The key sent, if any.
    pub api_key: Option<String>,
    /// The variable the key must come from, when the provider needs one.
    pub key_var: Option<&'static str>,
}

impl std::fmt::Debug for HttpChoice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpChoice")
            .field("provider", &self.provider)
            .field("model", &self.model)
            .field("base_url", &self.base_url)
            .field("api_key", &self.api_key.as_ref().map(|_| "…"))
            .finish()
    }
}

impl HttpChoice {
    /// The base URL and key, or what is missing to call the model at all.
    pub fn ready(&self) -> Result<(&str, Option<&str>), SettingsError> {
        let Some(url) = self.base_url.as_deref() else {
            return Err(bad(format!(
                "--model openai-compat:{} needs --base-url URL (vLLM: http://localhost:8000/v1; \
                 for a model Ollama runs, --model ollama:{0} needs none)",
                self.model
            )));
        };
        // Said now, not as a connection error after the run has started and retried.
        match reqwest::Url::parse(url) {
            Ok(parsed) if matches!(parsed.scheme(), "http" | "https") && parsed.has_host() => {}
            _ => {
                return Err(bad(format!(
                    "the base URL {url:?} (--base-url or base_url) is not an http:// or \
                     https:// URL; for example http://localhost:11434/v1"
                )));
            }
        }
        if let (Some(var), None) = (self.key_var, &self.api_key) {
            let whose = if self.provider == "anthropic" {
                "Anthropic"
            } else {
                "OpenAI"
            };
            return Err(bad(format!(
                "{var} is not set; export your {whose} key, or use --model script:PATH"
            )));
        }
        Ok((url, self.api_key.as_deref()))
    }

    /// A warning when the key would cross a network in clear text: sent over `http://` to
    /// a host that is not this machine (a server on it, `localhost`, `127.0.0.1` or `::1`,
    /// is the usual reason for `http://`). `None` when no key is sent, or it goes safely.
    pub fn clear_text_key(&self) -> Option<String> {
        self.api_key.as_ref()?;
        let url = reqwest::Url::parse(self.base_url.as_deref()?).ok()?;
        if url.scheme() != "http" {
            return None;
        }
        let host = url.host_str()?;
        let local = host.eq_ignore_ascii_case("localhost")
            || host
                .trim_start_matches('[')
                .trim_end_matches(']')
                .parse::<std::net::IpAddr>()
                .is_ok_and(|ip| ip.is_loopback());
        (!local).then(|| {
            format!(
                "the API key goes to {host} over http://, in clear text for anyone on the way \
                 to read; use https:// (or a server on this machine)"
            )
        })
    }

    /// A warning when an OpenAI-compatible model is Ollama's (its port, 11434, and its
    /// OpenAI-compatible path): through there Ollama loads the model with its own default
    /// window (4,096 tokens) and drops the start of a longer prompt without a word.
    pub fn ollama_through_compat(&self) -> Option<String> {
        if self.provider != "openai-compat" {
            return None;
        }
        let url = reqwest::Url::parse(self.base_url.as_deref()?).ok()?;
        (url.port() == Some(11434) && url.path().trim_end_matches('/').ends_with("/v1")).then(
            || {
                format!(
                    "{} looks like Ollama's OpenAI-compatible endpoint, which loads the model with \
                 Ollama's default window (4,096 tokens unless OLLAMA_CONTEXT_LENGTH says) and \
                 drops the start of longer prompts; --model ollama:{} has it load the model \
                 with the run's window",
                    url.as_str(),
                    self.model
                )
            },
        )
    }
}

/// Where the MCP servers come from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum McpSource {
    /// `--mcp-config PATH`.
    Flag(PathBuf),
    /// `mcp_config` in agent.toml (relative to the file).
    File(PathBuf),
    /// The workspace's `.mcp.json`, if there is one.
    Workspace,
}

/// Policy rules as written, by action.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RuleTexts {
    /// Allowed without asking.
    pub allow: Vec<String>,
    /// Asked.
    pub ask: Vec<String>,
    /// Denied.
    pub deny: Vec<String>,
}

/// One external hook, checked.
#[derive(Clone, Debug, PartialEq)]
pub struct HookSetting {
    /// Before or after a call.
    pub event: HookEvent,
    /// The command line (`bash -c`).
    pub command: String,
    /// Which tools it applies to, a regular expression (all when `None`).
    pub matcher: Option<String>,
    /// Longest time it may take (the hooks' default when `None`).
    pub timeout: Option<Duration>,
}

/// Budget values the flags and agent.toml set; the others keep the run's (or the
/// contract's defaults).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct BudgetChanges {
    /// `--max-steps` / `max_steps`.
    pub max_steps: Option<u32>,
    /// `--max-tool-calls` / `max_tool_calls`.
    pub max_tool_calls: Option<u32>,
    /// `max_tokens`.
    pub max_tokens: Option<u64>,
    /// `max_cost_usd`.
    pub max_cost_usd: Option<f64>,
    /// `--timeout` / `timeout`, in milliseconds.
    pub max_wall_time_ms: Option<u64>,
}

impl BudgetChanges {
    /// `budget` with these values in place.
    pub fn apply(&self, mut budget: Budget) -> Budget {
        if let Some(n) = self.max_steps {
            budget.max_steps = n;
        }
        if let Some(n) = self.max_tool_calls {
            budget.max_tool_calls = n;
        }
        if self.max_tokens.is_some() {
            budget.max_tokens = self.max_tokens;
        }
        if self.max_cost_usd.is_some() {
            budget.max_cost_usd = self.max_cost_usd;
        }
        if self.max_wall_time_ms.is_some() {
            budget.max_wall_time_ms = self.max_wall_time_ms;
        }
        budget
    }
}

/// A command's whole configuration.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Where runs are kept.
    pub store: StoreLocation,
    /// The workspace the tools are confined to.
    pub workspace: PathBuf,
    /// Whether the workspace was named (`--workspace` or agent.toml's `workspace`), rather
    /// than taken to be the current directory.
    pub workspace_named: bool,
    /// The model named, if any (resuming a script run without one uses its script).
    pub model: Option<ModelChoice>,
    /// As it was named (a script's path made relative to agent.toml's directory).
    pub model_text: Option<String>,
    /// `--base-url` or `base_url`, for a model named later (a recorded one).
    pub base_url: Option<String>,
    /// The providers' keys.
    pub env: Env,
    /// Whether to stream model replies.
    pub stream: Option<bool>,
    /// How long a model's answer may take to begin, when agent.toml says.
    pub answer_timeout: Option<Duration>,
    /// How long a model's answer may stay silent once begun, when agent.toml says.
    pub idle_timeout: Option<Duration>,
    /// Whether to mark prompts for the provider's prompt cache (default true).
    pub prompt_cache: Option<bool>,
    /// Thinking (a budget in tokens, or adaptive), when agent.toml sets it.
    pub thinking: Option<agent_providers::Thinking>,
    /// The effort asked of the model, when agent.toml sets it.
    pub effort: Option<agent_providers::Effort>,
    /// Output tokens a model call may write, when agent.toml caps them.
    pub max_output_tokens: Option<u32>,
    /// How model calls are retried, when agent.toml says.
    pub retry: Option<RetryPolicy>,
    /// Prices per million tokens, by model name.
    pub prices: BTreeMap<String, Price>,
    /// The policy: agent.toml's rules, then the flags'.
    pub policy: Policy,
    /// The same rules as written, by action (for a run queued for a worker).
    pub rules: RuleTexts,
    /// The hooks of agent.toml.
    pub hooks: Vec<HookSetting>,
    /// Where MCP servers are configured.
    pub mcp: McpSource,
    /// How long each MCP server may take to start and list its tools.
    pub mcp_timeout: Duration,
    /// `--tools replay:RUN`: the run whose results answer every call.
    pub replay_tools: Option<String>,
    /// Budget values set.
    pub budget: BudgetChanges,
    /// The context window, when agent.toml overrides the model's.
    pub context_window: Option<usize>,
    /// The compaction threshold, when agent.toml sets it.
    pub compact_at: Option<f64>,
    /// How results are masked, when agent.toml says.
    pub masking: Masking,
    /// `--events`.
    pub events: bool,
    /// `--no-input`.
    pub no_input: bool,
    /// agent.toml's `answer_schema` (relative to the file) and `checks`; with the flags of
    /// `run`, they make [`Settings::answer`].
    pub file_answer: (Option<PathBuf>, Vec<String>),
    /// How long each answer check command may take.
    pub check_timeout: Duration,
    /// Whether the model is offered sub-agents (`delegate`, `delegate_read`).
    pub sub_agents: bool,
    /// The variables named like secrets that shell commands are given all the same
    /// (agent.toml's `shell_env`, then `--shell-env`).
    pub shell_env: Vec<String>,
    /// The sandbox shell commands run in, when one was asked for (agent.toml's `sandbox`,
    /// `sandbox_network`, `sandbox_write`, `sandbox_hide` and `sandbox_show`, then the
    /// flags).
    pub sandbox: Option<agent_tools::Sandbox>,
    /// Whether this command said whether to sandbox (a sandbox of its own, from the flags
    /// or the settings file, or `--no-sandbox`): if not, a run taken up keeps the sandbox
    /// it started with.
    pub sandbox_said: bool,
    /// The validators of the final answer of a run this command starts (set by
    /// [`Settings::with_answer`]; runs that exist keep the ones they recorded).
    pub answer: agent_core::AnswerSpec,
    /// The settings file in use.
    pub file: Option<FileInUse>,
    /// What the settings file brings that needs a person's trust (empty when it was named
    /// explicitly, or brings nothing of the kind).
    pub file_brings: Vec<String>,
    /// The SHA-256 the MCP configuration must still have (a queued run's, as it was
    /// judged when the run was submitted).
    pub mcp_sha256: Option<String>,
}

impl Settings {
    /// These settings for taking up run `run_id` (`log`, its log): in the workspace it was
    /// started in, unless one was named here. `None` when they stand as they are; the
    /// recorded one, and a line to tell the person, when the run works elsewhere than the
    /// current directory. A recorded workspace that is not a directory here is refused.
    pub fn in_run_workspace(
        &self,
        run_id: &str,
        log: &[agent_core::Entry],
    ) -> Result<Option<(Settings, String)>, SettingsError> {
        let recorded = match log.first().map(|e| &e.event) {
            Some(agent_core::Event::RunStarted { manifest, .. }) => manifest.workspace.clone(),
            _ => None,
        };
        let Some(recorded) = recorded.filter(|_| !self.workspace_named) else {
            return Ok(None);
        };
        let recorded = PathBuf::from(recorded);
        let here =
            std::fs::canonicalize(&self.workspace).unwrap_or_else(|_| self.workspace.clone());
        if recorded == here {
            return Ok(None);
        }
        // A log written elsewhere may hold anything: only an absolute directory is taken.
        if !recorded.is_absolute() || !recorded.is_dir() {
            return Err(bad(format!(
                "run {run_id} works in {}, which is not a directory here; pass --workspace DIR \
                 to give it another",
                recorded.display()
            )));
        }
        let said = format!(
            "agent: run {run_id} works in {}, where it started (--workspace DIR gives it \
             another)\n",
            recorded.display()
        );
        Ok(Some((
            Settings {
                workspace: recorded,
                workspace_named: true,
                ..self.clone()
            },
            said,
        )))
    }

    /// These settings with the validators a new run's final answer must pass: agent.toml's
    /// `answer_schema`, unless `--answer-schema` names another, and its `checks`, then the
    /// `--check` flags'. The schema is read and compiled here, so a bad one is refused
    /// before anything is written.
    pub fn with_answer(
        mut self,
        flags: &crate::args::AnswerArgs,
    ) -> Result<Settings, SettingsError> {
        let (file_schema, file_checks) = &self.file_answer;
        let schema = match flags.answer_schema.as_ref().or(file_schema.as_ref()) {
            None => None,
            Some(path) => {
                let what = format!("the answer schema {}", path.display());
                // A project's agent.toml names it: read as any project file is (regular,
                // at most 1 MiB); one named by the flag may be a pipe.
                let named = flags.answer_schema.is_some();
                let text = crate::trust::read_once(path, named).map_err(|e| {
                    bad(format!(
                        "{what}: cannot read it ({e}); give a JSON Schema file"
                    ))
                })?;
                let value: serde_json::Value = serde_json::from_slice(&text).map_err(|e| {
                    bad(format!("{what} is not JSON ({e}); give a JSON Schema file"))
                })?;
                Some(value)
            }
        };
        let mut checks = file_checks.clone();
        checks.extend(flags.checks.iter().cloned());
        if let Some(empty) = checks.iter().find(|c| c.trim().is_empty()) {
            return Err(bad(format!(
                "the check command {empty:?} is empty; give a command line"
            )));
        }
        let spec = agent_core::AnswerSpec { schema, checks };
        agent_tools::AnswerChecker::new(&spec, &self.workspace).map_err(|e| {
            let path = flags.answer_schema.as_ref().or(file_schema.as_ref());
            match path {
                Some(p) => bad(format!("{}: {e}", p.display())),
                None => bad(e.to_string()),
            }
        })?;
        self.answer = spec;
        Ok(self)
    }

    /// Resolves a command's settings: `store` is `--store`, `setup` and `limits` the flags
    /// (defaults for commands without them), `file` the settings file, `env` the keys.
    pub fn resolve(
        file: Option<ConfigFile>,
        store: Option<&Path>,
        setup: &Setup,
        limits: &Limits,
        env: Env,
    ) -> Result<Settings, SettingsError> {
        let (config, base, file) = match file {
            Some(f) => {
                let base = f.path.parent().map(Path::to_path_buf).unwrap_or_default();
                let in_use = FileInUse {
                    path: f.path,
                    explicit: f.explicit,
                    sha256: f.sha256,
                };
                (f.config, base, Some(in_use))
            }
            None => (Config::default(), PathBuf::new(), None),
        };
        let relative = |p: &Path| -> PathBuf {
            if p.is_absolute() || base.as_os_str().is_empty() {
                p.to_path_buf()
            } else {
                base.join(p)
            }
        };
        let pick = |flag: Option<&Path>, file: &Option<PathBuf>, default: &str| match (flag, file) {
            (Some(p), _) => p.to_path_buf(),
            (None, Some(p)) => relative(p),
            (None, None) => PathBuf::from(default),
        };
        // The flag, else AGENT_STORE (a worker's environment names the shared database),
        // else the project's file, else `.agent`; a URL is never taken as a path.
        let store = match (store, &env.store, &config.store) {
            (Some(flag), _, _) => StoreLocation::parse(&flag.to_string_lossy()),
            (None, Some(text), _) => StoreLocation::parse(text),
            (None, None, Some(path)) => match StoreLocation::parse(&path.to_string_lossy()) {
                StoreLocation::Dir(dir) => StoreLocation::Dir(relative(&dir)),
                url => url,
            },
            (None, None, None) => StoreLocation::Dir(PathBuf::from(".agent")),
        };
        let workspace = pick(setup.workspace.as_deref(), &config.workspace, ".");
        let workspace_named = setup.workspace.is_some() || config.workspace.is_some();
        let base_url = setup.base_url.clone().or(config.base_url.clone());
        let model_text = match (&setup.model, &config.model) {
            (Some(m), _) => Some(m.clone()),
            (None, Some(m)) => Some(match m.strip_prefix("script:") {
                Some(path) => format!("script:{}", relative(Path::new(path)).display()),
                None => m.clone(),
            }),
            (None, None) => None,
        };
        let model = model_text
            .as_deref()
            .map(|text| model_choice(text, base_url.as_deref(), &env))
            .transpose()?;

        let mut policy = Policy::new();
        let p = &config.policy;
        let joined = |file: &[String], flags: &[String]| [file, flags].concat();
        let rules = RuleTexts {
            allow: joined(&p.allow, &setup.allow),
            ask: joined(&p.ask, &setup.ask),
            deny: joined(&p.deny, &setup.deny),
        };
        for (action, texts) in [
            (Action::Allow, &p.allow),
            (Action::Ask, &p.ask),
            (Action::Deny, &p.deny),
            (Action::Allow, &setup.allow),
            (Action::Ask, &setup.ask),
            (Action::Deny, &setup.deny),
        ] {
            for text in texts {
                policy.add(action, text).map_err(|e| bad(e.to_string()))?;
            }
        }

        let hooks = [
            (HookEvent::PreToolUse, &config.hooks.pre_tool_use),
            (HookEvent::PostToolUse, &config.hooks.post_tool_use),
        ]
        .into_iter()
        .flat_map(|(event, list)| {
            list.iter().map(move |h| HookSetting {
                event,
                command: h.command.clone(),
                matcher: h.matcher.clone(),
                // Checked with the file: within (0, a day].
                timeout: h.timeout_secs.map(Duration::from_secs_f64),
            })
        })
        .collect();

        let mcp = match (&setup.mcp_config, &config.mcp_config) {
            (Some(path), _) => McpSource::Flag(path.clone()),
            (None, Some(path)) => McpSource::File(relative(path)),
            (None, None) => McpSource::Workspace,
        };
        let replay_tools = match &setup.tools {
            None => None,
            Some(text) => match text.strip_prefix("replay:").filter(|r| !r.is_empty()) {
                Some(run) => Some(run.to_owned()),
                None => {
                    return Err(bad(format!(
                        "--tools {text:?}: the only form is replay:RUN"
                    )));
                }
            },
        };

        let mut shell_env: Vec<String> = Vec::new();
        let mut seen = std::collections::HashSet::new();
        for (whose, names) in [
            ("shell_env in the settings file", &config.shell_env),
            ("--shell-env", &setup.shell_env),
        ] {
            for name in names {
                if name.is_empty() || name.contains(['=', '\0']) {
                    return Err(bad(format!(
                        "{whose}: {name:?} is not an environment variable's name; give a \
                         name such as GH_TOKEN"
                    )));
                }
                if seen.insert(name.as_str()) {
                    shell_env.push(name.clone());
                }
            }
        }

        let sandbox = sandbox_of(&config, setup, &relative)?;

        let budget = budget_changes(&config, limits)?;
        let retry = config.retry.as_ref().map(|r| {
            let mut policy = RetryPolicy::default();
            if let Some(n) = r.max_attempts {
                policy.max_attempts = n.max(1);
            }
            if let Some(ms) = r.base_ms {
                policy.base = Duration::from_millis(ms);
            }
            if let Some(secs) = r.max_total_wait_secs {
                policy.max_total_wait = Duration::from_secs(secs);
            }
            policy
        });
        let prices = config
            .prices
            .iter()
            .map(|(model, p)| (model.clone(), p.price()))
            .collect();
        let mcp_timeout = env.mcp_timeout_ms.map_or(
            agent_tools::mcp::DEFAULT_STARTUP_TIMEOUT,
            Duration::from_millis,
        );
        let file_brings = match &file {
            Some(f) if !f.explicit => brings(&config, setup, limits),
            _ => Vec::new(),
        };
        // An Ollama model is loaded with the window the run keeps to: one an agent can work
        // in unless the settings say.
        let context_window = config.context_window.or_else(|| {
            matches!(&model, Some(ModelChoice::Http(h)) if h.dialect == Dialect::Ollama)
                .then_some(agent_providers::wire::ollama::DEFAULT_WINDOW)
        });
        Ok(Settings {
            store,
            workspace,
            workspace_named,
            model,
            model_text,
            base_url,
            env,
            stream: config.stream,
            answer_timeout: config.answer_timeout_secs.map(Duration::from_secs_f64),
            idle_timeout: config.idle_timeout_secs.map(Duration::from_secs_f64),
            prompt_cache: config.prompt_cache,
            thinking: config.thinking,
            effort: config.effort,
            max_output_tokens: config.max_output_tokens,
            retry,
            prices,
            policy,
            rules,
            hooks,
            mcp,
            mcp_timeout,
            replay_tools,
            budget,
            context_window,
            compact_at: config.compact_at,
            masking: Masking {
                recent_result_turns: config.recent_result_turns,
                unmasked_result_chars: config.unmasked_result_chars,
            },
            file_answer: (
                config.answer_schema.as_deref().map(relative),
                config.checks.clone(),
            ),
            answer: agent_core::AnswerSpec::default(),
            sub_agents: setup.sub_agents || config.sub_agents.unwrap_or(false),
            shell_env,
            // A settings file's `sandbox = false` does not take away the sandbox a run
            // was started in: only the person's `--no-sandbox` does.
            sandbox_said: sandbox.is_some() || setup.no_sandbox,
            sandbox,
            check_timeout: config
                .check_timeout_secs
                .map_or(agent_tools::DEFAULT_CHECK_TIMEOUT, Duration::from_secs_f64),
            events: setup.events,
            no_input: setup.no_input,
            file,
            file_brings,
            mcp_sha256: None,
        })
    }

    /// The model `text` names, with these settings' base URL and keys (for a model named
    /// after resolution: the one a run recorded).
    pub fn model_named(&self, text: &str) -> Result<ModelChoice, SettingsError> {
        model_choice(text, self.base_url.as_deref(), &self.env)
    }

    /// How prompts for `model` are bounded: its context window (or agent.toml's), the
    /// compaction threshold, the default system text.
    pub fn context_config(&self, model: &str) -> ContextConfig {
        let defaults = ContextConfig::default();
        ContextConfig {
            context_window: self
                .context_window
                .unwrap_or_else(|| agent_context::context_window(model)),
            compact_at: self.compact_at.unwrap_or(defaults.compact_at),
            recent_result_turns: self
                .masking
                .recent_result_turns
                .unwrap_or(defaults.recent_result_turns),
            unmasked_result_chars: self
                .masking
                .unmasked_result_chars
                .unwrap_or(defaults.unmasked_result_chars),
            ..defaults
        }
    }
}

/// How older tool results are masked, when agent.toml sets it (`recent_result_turns`,
/// `unmasked_result_chars`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Masking {
    /// Turns whose results are shown whole.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recent_result_turns: Option<usize>,
    /// Characters older results may take before they are masked together.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unmasked_result_chars: Option<usize>,
}

/// The model a `--model` value names.
fn model_choice(
    text: &str,
    base_url: Option<&str>,
    env: &Env,
) -> Result<ModelChoice, SettingsError> {
    let spec = ModelSpec::parse(text).map_err(|e| bad(format!("--{e}")))?;
    let http =
        |dialect, provider, model: String, default: Option<&str>, key: &Option<String>, key_var| {
            ModelChoice::Http(HttpChoice {
                dialect,
                provider,
                model,
                base_url: base_url.or(default).map(str::to_owned),
                api_key: key.clone(),
                key_var,
            })
        };
    Ok(match spec {
        ModelSpec::Script(path) => ModelChoice::Script(path),
        ModelSpec::Replay(run) => ModelChoice::Replay(run),
        ModelSpec::OpenAi(model) => http(
            Dialect::OpenAi,
            "openai",
            model,
            Some("https://api.openai.com/v1"),
            &env.openai_key,
            Some("OPENAI_API_KEY"),
        ),
        ModelSpec::OpenAiResponses(model) => http(
            Dialect::OpenAiResponses,
            "openai-responses",
            model,
            Some("https://api.openai.com/v1"),
            &env.openai_key,
            Some("OPENAI_API_KEY"),
        ),
        ModelSpec::Anthropic(model) => http(
            Dialect::Anthropic,
            "anthropic",
            model,
            Some("https://api.anthropic.com"),
            &env.anthropic_key,
            Some("ANTHROPIC_API_KEY"),
        ),
        // A local server needs no key; its cloud's is sent when set.
        ModelSpec::Ollama(model) => http(
            Dialect::Ollama,
            "ollama",
            model,
            Some("http://localhost:11434"),
            &env.ollama_key,
            None,
        ),
        // A local server may need no key; one is sent when set.
        ModelSpec::OpenAiCompat(model) => http(
            Dialect::OpenAi,
            "openai-compat",
            model,
            None,
            &env.openai_key,
            None,
        ),
    })
}

/// The budget values of agent.toml, then of the flags, checked.
fn budget_changes(config: &Config, flags: &Limits) -> Result<BudgetChanges, SettingsError> {
    let max_steps = flags.max_steps.or(config.max_steps);
    if max_steps == Some(0) {
        return Err(bad("--max-steps must be at least 1"));
    }
    let max_wall_time_ms = match flags.timeout.or(config.timeout) {
        Some(secs) => {
            let secs = config::check_seconds("--timeout", secs, 365.0 * 86_400.0).map_err(bad)?;
            Some((secs * 1000.0).round() as u64)
        }
        None => None,
    };
    let max_tokens = flags.max_tokens.or(config.max_tokens);
    if max_tokens == Some(0) {
        return Err(bad("--max-tokens must be at least 1"));
    }
    if let Some(usd) = flags.max_cost
        && !(usd.is_finite() && usd > 0.0)
    {
        return Err(bad(format!(
            "--max-cost {usd}: give a positive number of dollars"
        )));
    }
    Ok(BudgetChanges {
        max_steps,
        max_tool_calls: flags.max_tool_calls.or(config.max_tool_calls),
        max_tokens,
        // The file's is checked with the file: positive and finite.
        max_cost_usd: flags.max_cost.or(config.max_cost_usd),
        max_wall_time_ms,
    })
}

/// What a settings file brings that a person must trust before it is used: allow rules,
/// hook commands, and the MCP servers, workspace and base URL it names (unless a flag
/// overrides them); and what would make a run cost more than the defaults let it: more
/// steps or tool calls, more attempts at a failed model call, sub-agents, extended
/// thinking; and secrets given to shell commands. A budget at or below its default only
/// narrows, and needs no trust.
fn brings(c: &Config, setup: &Setup, limits: &Limits) -> Vec<String> {
    let mut brings = Vec::new();
    let defaults = Budget::default();
    if let (Some(n), None) = (c.max_steps, limits.max_steps)
        && n > defaults.max_steps
    {
        brings.push(format!(
            "max_steps {n} (above the default {}: more model calls, each billed)",
            defaults.max_steps
        ));
    }
    if let (Some(n), None) = (c.max_tool_calls, limits.max_tool_calls)
        && n > defaults.max_tool_calls
    {
        brings.push(format!(
            "max_tool_calls {n} (above the default {})",
            defaults.max_tool_calls
        ));
    }
    let attempts = RetryPolicy::default().max_attempts;
    if let Some(n) = c.retry.as_ref().and_then(|r| r.max_attempts)
        && n > attempts
    {
        brings.push(format!(
            "retry.max_attempts {n} (above the default {attempts}: a model call may be \
             sent, and billed, that many times)"
        ));
    }
    if c.sub_agents == Some(true) && !setup.sub_agents {
        brings.push(
            "sub_agents (the model may start child runs, each with model calls of its own)"
                .to_owned(),
        );
    }
    let secrets: Vec<&str> = c
        .shell_env
        .iter()
        .filter(|name| !setup.shell_env.contains(name))
        .map(String::as_str)
        .collect();
    if !secrets.is_empty() {
        brings.push(format!(
            "shell_env {} (commands the model runs see these variables, secrets among them)",
            secrets.join(", ")
        ));
    }
    if c.sandbox_network == Some(true) && !setup.sandbox_network {
        brings.push("sandbox_network (sandboxed commands may reach the network)".to_owned());
    }
    let writable: Vec<String> = c
        .sandbox_write
        .iter()
        .filter(|dir| !setup.sandbox_write.contains(dir))
        .map(|dir| dir.display().to_string())
        .collect();
    if !writable.is_empty() {
        brings.push(format!(
            "sandbox_write {} (sandboxed commands may write there)",
            writable.join(", ")
        ));
    }
    let shown: Vec<String> = c
        .sandbox_show
        .iter()
        .filter(|place| !setup.sandbox_show.contains(place))
        .map(|place| place.display().to_string())
        .collect();
    if !shown.is_empty() {
        brings.push(format!(
            "sandbox_show {} (sandboxed commands may read the credentials there)",
            shown.join(", ")
        ));
    }
    if let Some(thinking) = c.thinking {
        brings.push(format!(
            "thinking {thinking} (what the model thinks each turn is billed as output)"
        ));
    }
    // Less effort narrows; more than the providers' default may cost more.
    if let Some(effort) = c.effort
        && effort.above_default()
    {
        brings.push(format!(
            "effort {effort} (more reasoning and writing each turn, billed as output)"
        ));
    }
    // A cap narrows, except past the one Anthropic's calls otherwise have.
    if let Some(n) = c.max_output_tokens
        && n > agent_providers::wire::anthropic::DEFAULT_MAX_TOKENS
    {
        brings.push(format!(
            "max_output_tokens {n} (above {}: longer replies, each billed)",
            agent_providers::wire::anthropic::DEFAULT_MAX_TOKENS
        ));
    }
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
    if !c.checks.is_empty() {
        brings.push(format!("answer check commands {}", c.checks.join(", ")));
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
    brings
}

/// The sandbox of shell commands the settings file and the flags ask for, if any: the
/// file's places (relative to it, by `relative`, or to the home directory where they begin
/// with `~`), then the flags' (relative to the current directory). Each writable one must
/// be a directory, each to hide be there.
fn sandbox_of(
    config: &Config,
    setup: &Setup,
    relative: &dyn Fn(&Path) -> PathBuf,
) -> Result<Option<agent_tools::Sandbox>, SettingsError> {
    let home = std::env::var_os("HOME").map(PathBuf::from);
    let relative = |place: &Path| match (place.strip_prefix("~"), &home) {
        (Ok(rest), Some(home)) => home.join(rest),
        _ => relative(place),
    };
    let network = setup.sandbox_network || config.sandbox_network == Some(true);
    // Narrows: a settings file may ask for it with no one's trust.
    let read_only = setup.sandbox_read_only || config.sandbox_read_only == Some(true);
    let file_dirs = config
        .sandbox_write
        .iter()
        .map(|dir| ("sandbox_write in the settings file:", relative(dir)));
    let flag_dirs = setup
        .sandbox_write
        .iter()
        .map(|dir| ("--sandbox-write", dir.clone()));
    let dirs: Vec<(&str, PathBuf)> = file_dirs.chain(flag_dirs).collect();
    let hide: Vec<(&str, PathBuf)> = (config.sandbox_hide.iter())
        .map(|place| ("sandbox_hide in the settings file:", relative(place)))
        .chain((setup.sandbox_hide.iter()).map(|place| ("--sandbox-hide", place.clone())))
        .collect();
    let show: Vec<(&str, PathBuf)> = (config.sandbox_show.iter())
        .map(|place| ("sandbox_show in the settings file:", relative(place)))
        .chain((setup.sandbox_show.iter()).map(|place| ("--sandbox-show", place.clone())))
        .collect();
    let asked = setup.sandbox
        || config.sandbox == Some(true)
        || network
        || read_only
        || !dirs.is_empty()
        || !hide.is_empty()
        || !show.is_empty();
    if !asked || setup.no_sandbox {
        return Ok(None);
    }
    let mut sandbox = agent_tools::Sandbox::new()
        .with_network(network)
        .with_read_only(read_only);
    for (whose, dir) in dirs {
        if !dir.is_dir() {
            return Err(bad(format!(
                "{whose} {}: no such directory; give a directory sandboxed commands may \
                 write in",
                dir.display()
            )));
        }
        let dir = std::path::absolute(&dir)
            .map_err(|e| bad(format!("{whose} {}: {e}", dir.display())))?;
        sandbox = sandbox.writing(dir);
    }
    for (whose, place) in hide {
        // A place misspelt would hide nothing, and say nothing of it.
        if std::fs::symlink_metadata(&place).is_err() {
            return Err(bad(format!(
                "{whose} {}: no such file or directory; give a file or directory to hide \
                 from sandboxed commands",
                place.display()
            )));
        }
        let place = std::path::absolute(&place)
            .map_err(|e| bad(format!("{whose} {}: {e}", place.display())))?;
        sandbox = sandbox.hiding(place);
    }
    for (whose, place) in show {
        let place = std::path::absolute(&place)
            .map_err(|e| bad(format!("{whose} {}: {e}", place.display())))?;
        sandbox = sandbox.showing(place);
    }
    Ok(Some(sandbox))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn choice(url: &str, key: Option<&str>) -> HttpChoice {
        HttpChoice {
            dialect: Dialect::OpenAi,
            provider: "openai-compat",
            model: "m".into(),
            base_url: Some(url.into()),
            api_key: key.map(str::to_owned),
            key_var: None,
        }
    }

    /// The log of a run started at `workspace`.
    fn started_in(workspace: Option<&str>) -> Vec<agent_core::Entry> {
        let manifest = agent_core::Manifest {
            runtime_version: "t".into(),
            provider: "script".into(),
            model: "m".into(),
            system_prompt_digest: String::new(),
            tool_schema_digest: String::new(),
            budget: agent_core::Budget::default(),
            tools: Vec::new(),
            answer: None,
            forked_from: None,
            parent: None,
            workspace: workspace.map(str::to_owned),
            sandbox: None,
        };
        let event = agent_core::Event::RunStarted {
            run_id: "r".into(),
            goal: "g".into(),
            manifest,
        };
        vec![agent_core::Entry {
            version: 1,
            at_ms: 0,
            event,
        }]
    }

    /// A run is taken up where its log says it started only when that is an absolute
    /// directory here: a relative path, a file, a missing place or one with control
    /// characters (a log written elsewhere may hold anything) is refused; none recorded, or
    /// a workspace named here, leaves the settings as they are.
    #[test]
    fn a_recorded_workspace_is_taken_only_as_an_absolute_directory() {
        let settings = Settings::resolve(
            None,
            None,
            &crate::Setup::default(),
            &crate::Limits::default(),
            Env::default(),
        )
        .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("f");
        std::fs::write(&file, "").unwrap();
        let place = dir.path().to_str().unwrap();
        let (moved, said) = settings
            .in_run_workspace("r", &started_in(Some(place)))
            .unwrap()
            .expect("moved");
        assert_eq!(moved.workspace, dir.path());
        assert!(said.contains(&format!("works in {place}")), "{said}");
        for hostile in [
            "..",
            "relative/dir",
            file.to_str().unwrap(),
            "/no/such/place",
            "/tmp/\u{1b}]52;c;aGk=\u{7}",
            "",
        ] {
            let refused = settings
                .in_run_workspace("r", &started_in(Some(hostile)))
                .unwrap_err();
            assert!(
                refused.0.contains("not a directory here"),
                "{hostile}: {}",
                refused.0
            );
        }
        assert!(
            settings
                .in_run_workspace("r", &started_in(None))
                .unwrap()
                .is_none()
        );
        let named = Settings {
            workspace_named: true,
            ..settings
        };
        assert!(
            named
                .in_run_workspace("r", &started_in(Some("..")))
                .unwrap()
                .is_none()
        );
    }

    /// A key sent over http:// to another machine is warned about; to this machine (a
    /// local server), over https://, or with no key at all, nothing is said.
    #[test]
    fn a_key_in_clear_text_to_another_machine_is_warned_about() {
        let warned = |url: &str| choice(url, Some("k")).clear_text_key();
        for url in [
            "http://proxy.corp:8080/v1",
            "http://10.0.0.5/v1",
            "http://127.0.0.1.example.com/v1",
            "HTTP://Gpu-Box:11434/v1",
        ] {
            let warning = warned(url).unwrap_or_else(|| panic!("{url}: no warning"));
            assert!(warning.contains("over http://"), "{warning}");
        }
        assert!(
            warned("http://proxy.corp/v1")
                .unwrap()
                .contains("proxy.corp")
        );
        for url in [
            "http://localhost:11434/v1",
            "http://LOCALHOST/v1",
            "http://127.0.0.1:8080/v1",
            "http://127.8.9.10/v1",
            "http://[::1]:8000/v1",
            "https://api.openai.com/v1",
            "https://10.0.0.5/v1",
        ] {
            assert_eq!(warned(url), None, "{url}");
        }
        assert_eq!(choice("http://proxy.corp/v1", None).clear_text_key(), None);
    }

    /// Ollama's OpenAI-compatible endpoint, by its port and path, is pointed at `ollama:`.
    #[test]
    fn ollama_through_its_openai_compatible_endpoint_is_pointed_at_its_own() {
        for url in ["http://localhost:11434/v1", "http://gpu-box:11434/v1/"] {
            let warning = choice(url, None)
                .ollama_through_compat()
                .unwrap_or_else(|| panic!("{url}: no warning"));
            assert!(warning.contains("--model ollama:m"), "{warning}");
        }
        for url in ["http://localhost:8000/v1", "http://localhost:11434"] {
            assert_eq!(choice(url, None).ollama_through_compat(), None, "{url}");
        }
        let native = HttpChoice {
            dialect: Dialect::Ollama,
            provider: "ollama",
            ..choice("http://localhost:11434/v1", None)
        };
        assert_eq!(native.ollama_through_compat(), None);
    }
}
