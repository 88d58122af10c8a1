//! `agent submit` and `agent worker`: runs queued in PostgreSQL and driven by workers on
//! any number of machines, each run by one worker at a time under a lease.
//!
//! `submit` resolves the run's settings where the person is (flags, agent.toml) and
//! records what a worker needs: the goal, the model as named and how it is called
//! (streaming, timeouts, retries, prices), the workspace, the policy rules, the budget and
//! the context bounds. A worker takes the oldest runnable run (or one
//! whose lease expired: its worker died), renews its lease while it drives it, and commits
//! through a `FencedStore`, so a worker that lost its lease writes nothing more. A run
//! taken over continues from its last commit, effects in doubt reconciled or paused as
//! after any crash.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use agent_core::{Budget, Input, ReasonClass};
use agent_providers::RetryPolicy;
use agent_runtime::{CancellationToken, Redactor, RunRequest, Runtime, RuntimeError};
use agent_store::{
    FencedStore, Lease, PostgresStore, QueueState, RunSummary, Store as _, StoreError,
};
use agent_tools::{Gateway, Workspace};
use serde::{Deserialize, Serialize};

use crate::app::{say, tell};
use crate::args::{Limits, Setup};
use crate::build::{StoreSource, build, tokio};
use crate::exit::EXIT_OK;
use crate::failure::{Failure, failed, usage};
use crate::render;
use crate::settings::{BudgetChanges, RuleTexts, Settings};
use crate::stores::{self, OpenStore};

/// Runs one worker drives at once, at most (each is a thread with its own runtime).
const MAX_CONCURRENCY: usize = 256;

/// What a worker needs to drive a queued run, as `submit` recorded it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunSpec {
    /// The goal.
    pub goal: String,
    /// The model as named (`openai:gpt-4o`, `script:/abs/path.json`, ...).
    pub model: String,
    /// The API's base URL, if one was given.
    pub base_url: Option<String>,
    /// The workspace, as an absolute path.
    pub workspace: PathBuf,
    /// The policy rules.
    pub rules: RuleTexts,
    /// The MCP configuration named, as an absolute path.
    pub mcp_config: Option<PathBuf>,
    /// The SHA-256 of that configuration as it was when the run was submitted: a worker
    /// starts its servers only if it still reads the same (absent in runs queued before).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mcp_sha256: Option<String>,
    /// The budget the run starts with.
    pub budget: Budget,
    /// The context window, when agent.toml set one.
    pub context_window: Option<usize>,
    /// The compaction threshold, when agent.toml set one.
    pub compact_at: Option<f64>,
    /// How results are masked, when agent.toml said (absent in runs queued before it).
    #[serde(default)]
    pub masking: crate::settings::Masking,
    /// What the final answer must pass (absent in runs queued before validators).
    #[serde(default, skip_serializing_if = "agent_core::AnswerSpec::is_empty")]
    pub answer: agent_core::AnswerSpec,
    /// Whether the model is offered sub-agents.
    #[serde(default)]
    pub sub_agents: bool,
    /// The variables named like secrets that shell commands are given all the same, by
    /// the worker's environment.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub shell_env: Vec<String>,
    /// The sandbox shell commands run in, if one was asked for (absent in runs queued
    /// before sandboxes: none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<agent_core::SandboxRecord>,
    /// How the model is called (absent in runs queued before: the defaults).
    #[serde(default, skip_serializing_if = "Calls::is_default")]
    pub calls: Calls,
}

/// How a queued run's model is called, as the submitter's agent.toml said: streamed or
/// not, how long it is waited for, retried, its prompt cache, thinking and prices. A worker
/// calls it so, and keeps its cost budget with the prices the submitter gave.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Calls {
    /// `stream`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stream: Option<bool>,
    /// `answer_timeout_secs`, in milliseconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub answer_timeout_ms: Option<u64>,
    /// `idle_timeout_secs`, in milliseconds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub idle_timeout_ms: Option<u64>,
    /// `prompt_cache`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prompt_cache: Option<bool>,
    /// `thinking` (a number of tokens in runs queued before it could be adaptive).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub thinking: Option<agent_providers::Thinking>,
    /// `effort`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub effort: Option<agent_providers::Effort>,
    /// `max_output_tokens`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_output_tokens: Option<u32>,
    /// `[retry]`, resolved.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retry: Option<Retry>,
    /// `[prices]`, by model name.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub prices: BTreeMap<String, crate::config::PriceConfig>,
}

/// A retry policy as a queued run records it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Retry {
    /// Attempts in all.
    pub max_attempts: u32,
    /// The first backoff, in milliseconds.
    pub base_ms: u64,
    /// The longest single wait, in milliseconds.
    pub max_wait_ms: u64,
    /// The longest total wait, in milliseconds.
    pub max_total_wait_ms: u64,
    /// Whether waits are randomized.
    pub jitter: bool,
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl Calls {
    fn is_default(&self) -> bool {
        *self == Calls::default()
    }

    /// What `settings` say of model calls.
    fn of(settings: &Settings) -> Calls {
        Calls {
            stream: settings.stream,
            answer_timeout_ms: settings.answer_timeout.map(millis),
            idle_timeout_ms: settings.idle_timeout.map(millis),
            prompt_cache: settings.prompt_cache,
            thinking: settings.thinking,
            effort: settings.effort,
            max_output_tokens: settings.max_output_tokens,
            retry: settings.retry.as_ref().map(|r| Retry {
                max_attempts: r.max_attempts,
                base_ms: millis(r.base),
                max_wait_ms: millis(r.max_wait),
                max_total_wait_ms: millis(r.max_total_wait),
                jitter: r.jitter,
            }),
            prices: settings
                .prices
                .iter()
                .map(|(model, p)| (model.clone(), crate::config::PriceConfig::of(p)))
                .collect(),
        }
    }

    /// Gives `settings` these ways of calling the model.
    fn apply(&self, settings: &mut Settings) {
        settings.stream = self.stream;
        settings.answer_timeout = self.answer_timeout_ms.map(Duration::from_millis);
        settings.idle_timeout = self.idle_timeout_ms.map(Duration::from_millis);
        settings.prompt_cache = self.prompt_cache;
        settings.thinking = self.thinking;
        settings.effort = self.effort;
        settings.max_output_tokens = self.max_output_tokens;
        settings.retry = self.retry.as_ref().map(|r| RetryPolicy {
            max_attempts: r.max_attempts.max(1),
            base: Duration::from_millis(r.base_ms),
            max_wait: Duration::from_millis(r.max_wait_ms),
            max_total_wait: Duration::from_millis(r.max_total_wait_ms),
            jitter: r.jitter,
        });
        settings.prices = self
            .prices
            .iter()
            .map(|(model, p)| (model.clone(), p.price()))
            .collect();
    }
}

fn absolute(path: &std::path::Path) -> Result<PathBuf, Failure> {
    std::path::absolute(path).map_err(|e| usage(format!("{}: {e}", path.display())))
}

/// `agent submit [OPTIONS] GOAL`.
pub fn submit(settings: &Settings, json: bool, goal: &str) -> Result<u8, Failure> {
    if goal.trim().is_empty() {
        return Err(usage(
            "the goal is empty; say what the agent should achieve",
        ));
    }
    let store = stores::queue(&settings.store, "submit")?;
    let Some(model) = settings.model_text.clone() else {
        return Err(usage(
            "no model: pass --model PROVIDER:MODEL (e.g. script:PATH) or set model in agent.toml",
        ));
    };
    // A worker elsewhere reads the script and the workspace by these paths.
    let model = match model.strip_prefix("script:") {
        Some(path) => format!("script:{}", absolute(std::path::Path::new(path))?.display()),
        None => model,
    };
    if !settings.hooks.is_empty() {
        return Err(usage(
            "agent.toml has hooks: a queued run does not carry them yet; use agent run",
        ));
    }
    // What the project brings is judged here, where the person is, as for `agent run`:
    // the worker takes the spec as given.
    // The workspace may be only where the workers are: then it brings nothing here.
    let root = settings
        .workspace
        .canonicalize()
        .unwrap_or_else(|_| settings.workspace.clone());
    let judged = crate::build::trusted_project(settings, &root)?;
    let (mcp_config, mcp_sha256) = match &settings.mcp {
        crate::settings::McpSource::Flag(p) | crate::settings::McpSource::File(p) => {
            (Some(absolute(p)?), judged.map(|m| m.sha256))
        }
        crate::settings::McpSource::Workspace => (None, None),
    };
    let spec = RunSpec {
        goal: goal.to_owned(),
        model,
        base_url: settings.base_url.clone(),
        workspace: absolute(&settings.workspace)?,
        rules: settings.rules.clone(),
        mcp_config,
        mcp_sha256,
        budget: settings.budget.apply(Budget::default()),
        context_window: settings.context_window,
        compact_at: settings.compact_at,
        masking: settings.masking,
        answer: settings.answer.clone(),
        sub_agents: settings.sub_agents,
        shell_env: settings.shell_env.clone(),
        sandbox: settings.sandbox.as_ref().map(agent_tools::Sandbox::record),
        calls: Calls::of(settings),
    };
    // A worker would refuse it for want of a price: the person hears it now.
    if let (Some(max_cost_usd), Some(crate::settings::ModelChoice::Http(http))) =
        (spec.budget.max_cost_usd, &settings.model)
        && !settings.prices.contains_key(&http.model)
    {
        return Err(Failure::from(agent_runtime::RuntimeError::Unpriced {
            provider: http.provider.to_owned(),
            model: http.model.clone(),
            max_cost_usd,
        }));
    }
    let text = serde_json::to_string(&spec).map_err(failed)?;
    let run_id = ulid::Ulid::generate().to_string();
    store.submit(&run_id, &text)?;
    if json {
        say(format_args!(
            "{}\n",
            serde_json::json!({"run_id": run_id, "status": "queued"})
        ));
    } else {
        say(format_args!("{run_id}\n"));
        tell(format_args!(
            "agent: run {run_id} queued; `agent worker` drives it, `agent show {run_id}` \
             follows it\n"
        ));
    }
    Ok(EXIT_OK)
}

/// The settings a worker drives `spec` with: the spec's, this worker's store and keys, and
/// never a question on a terminal.
fn settings_for(spec: &RunSpec, worker: &Settings) -> Result<Settings, Failure> {
    // The sandbox's places, given to this worker as the flags would give them.
    let sandbox_paths = |of: fn(&agent_core::SandboxRecord) -> &Vec<String>| -> Vec<PathBuf> {
        spec.sandbox
            .iter()
            .flat_map(|s| of(s).iter().map(PathBuf::from))
            .collect()
    };
    let setup = Setup {
        model: Some(spec.model.clone()),
        base_url: spec.base_url.clone(),
        workspace: Some(spec.workspace.clone()),
        allow: spec.rules.allow.clone(),
        ask: spec.rules.ask.clone(),
        deny: spec.rules.deny.clone(),
        mcp_config: spec.mcp_config.clone(),
        no_input: true,
        sub_agents: spec.sub_agents,
        shell_env: spec.shell_env.clone(),
        sandbox: spec.sandbox.is_some(),
        sandbox_network: spec.sandbox.as_ref().is_some_and(|s| s.network),
        sandbox_read_only: spec.sandbox.as_ref().is_some_and(|s| s.read_only),
        sandbox_write: sandbox_paths(|s| &s.write),
        sandbox_hide: sandbox_paths(|s| &s.hide),
        sandbox_show: sandbox_paths(|s| &s.show),
        ..Setup::default()
    };
    let mut settings =
        Settings::resolve(None, None, &setup, &Limits::default(), worker.env.clone())?;
    settings.store = worker.store.clone();
    settings.budget = BudgetChanges {
        max_steps: Some(spec.budget.max_steps),
        max_tool_calls: Some(spec.budget.max_tool_calls),
        max_tokens: spec.budget.max_tokens,
        max_cost_usd: spec.budget.max_cost_usd,
        max_wall_time_ms: spec.budget.max_wall_time_ms,
    };
    settings.context_window = spec.context_window.or(settings.context_window);
    settings.compact_at = spec.compact_at;
    settings.masking = spec.masking;
    settings.answer = spec.answer.clone();
    settings.mcp_sha256 = spec.mcp_sha256.clone();
    spec.calls.apply(&mut settings);
    Ok(settings)
}

/// Drives one leased run until it ends or pauses; what the queue should say of it next.
fn drive(
    store: &Arc<PostgresStore>,
    worker: &Settings,
    json: bool,
    drain: &CancellationToken,
    lease: &Lease,
    ttl: Duration,
) -> Result<Option<QueueState>, Failure> {
    let spec: RunSpec = serde_json::from_str(&lease.spec).map_err(|e| {
        failed(format!(
            "run {} has a spec this worker cannot read: {e}",
            lease.run_id
        ))
    })?;
    let settings = settings_for(&spec, worker)?;
    let choice = settings
        .model
        .clone()
        .ok_or_else(|| usage(format!("run {} names no model", lease.run_id)))?;
    let rt = tokio()?;
    let fenced = FencedStore::new(Arc::clone(store), lease.clone());
    let runtime = build(
        &settings,
        &choice,
        StoreSource::Open(Box::new(OpenStore::Fenced(fenced))),
        &rt,
        false,
        false,
    )?
    .with_drain(drain.clone());
    let cancel = CancellationToken::new();
    // The lease is renewed every third of its length; once it is lost the run is cancelled
    // here (its commits would fail anyway) and left to the worker that took it.
    let renewer = {
        let store = Arc::clone(store);
        let lease = lease.clone();
        let cancel = cancel.clone();
        rt.spawn(async move {
            loop {
                tokio::time::sleep(ttl / 3).await;
                let store = Arc::clone(&store);
                let lease = lease.clone();
                let held = tokio::task::spawn_blocking(move || store.renew(&lease, ttl)).await;
                if !matches!(held, Ok(Ok(true))) {
                    cancel.cancel();
                    break;
                }
            }
        })
    };
    // Whether the run has a log yet (reading none of it: the runtime loads it to resume).
    let started = match store.load_from(&lease.run_id, u64::MAX) {
        Ok(_) => true,
        Err(StoreError::RunNotFound(_)) => false,
        Err(e) => return Err(e.into()),
    };
    // What people said to the run while it waited to begin, read after its goal.
    let notes = if started {
        Vec::new()
    } else {
        runtime.store().told(&lease.run_id)
    };
    let report = rt.block_on(async {
        if started {
            runtime.resume(&lease.run_id, cancel.clone()).await
        } else {
            let request =
                RunRequest::new(lease.run_id.clone(), spec.goal.clone(), spec.budget.clone());
            runtime.start_noted(request, notes, cancel.clone()).await
        }
    });
    renewer.abort();
    // Whatever ended the drive (a commit refused by the fence, or the renewer), a lease no
    // longer held means the run belongs to another worker now.
    let held = !cancel.is_cancelled() && store.renew(lease, ttl).unwrap_or(false);
    if !held {
        tell(format_args!(
            "agent: worker: lost the lease on run {}; another worker has it\n",
            lease.run_id
        ));
        return Ok(None);
    }
    let report = match report {
        // The worker is shutting down: the run goes back to the queue as it stands, for
        // another worker to take up at once.
        Err(RuntimeError::LetGo { run_id }) => {
            let message = "handed back to the queue at its next step: the worker is stopping";
            tell(format_args!("agent: worker: run {run_id} {message}\n"));
            if json {
                let value = serde_json::json!({
                    "run_id": run_id, "status": "queued", "reason": null, "message": message,
                });
                say(format_args!("{value}\n"));
            }
            return Ok(Some(QueueState::Runnable));
        }
        other => other?,
    };
    tell(format_args!(
        "agent: worker: {}\n",
        render::outcome_text(&report)
            .lines()
            .next()
            .unwrap_or_default()
    ));
    if json {
        say(format_args!("{}\n", render::outcome_json(&report)));
    }
    Ok(Some(match report.outcome.reason.class() {
        ReasonClass::Paused => QueueState::Paused,
        _ => QueueState::Ended,
    }))
}

/// A token cancelled when the worker is asked to stop (SIGTERM, as a service manager or
/// an orchestrator asks; Ctrl-C; or SIGHUP, its terminal closed, unless started ignoring
/// it): it takes no more runs, and hands those it drives back
/// to the queue at their next step, their calls in flight finished and committed first. A
/// second signal stops it at once (its runs are then taken over when their leases run
/// out, as after a crash).
fn drain_on_signals() -> Result<CancellationToken, Failure> {
    use tokio::signal::unix::SignalKind;
    crate::build::drain_on_signals(
        &[
            SignalKind::terminate(),
            SignalKind::interrupt(),
            SignalKind::hangup(),
        ],
        "agent: worker: stopping: no more runs are taken, and those driven here go back to \
         the queue at their next step (a second signal stops at once; their leases then run \
         out)\n",
        i32::from(crate::exit::EXIT_CANCELLED),
    )
}

/// How often an idle worker looks for runs nobody announced (expired leases).
const IDLE_POLL: Duration = Duration::from_secs(1);

/// Announcements of runnable runs, counted, for the slots of a worker to wait on.
#[derive(Default)]
struct Wakeups {
    count: std::sync::Mutex<u64>,
    came: std::sync::Condvar,
}

impl Wakeups {
    fn seen(&self) -> u64 {
        *self.count.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Returns when an announcement came after `seen`, or after `at_most`.
    fn wait(&self, seen: u64, at_most: Duration) {
        let count = self.count.lock().unwrap_or_else(|p| p.into_inner());
        let _ = self.came.wait_timeout_while(count, at_most, |n| *n == seen);
    }

    fn announce(&self) {
        *self.count.lock().unwrap_or_else(|p| p.into_inner()) += 1;
        self.came.notify_all();
    }
}

/// Listens for runs made runnable and wakes the idle slots; without a listening
/// connection (it broke, or could not be opened) the slots poll, and it tries again.
fn listen(store: &PostgresStore, wakeups: &Wakeups) {
    loop {
        match store.listen() {
            Ok(mut listener) => {
                while let Ok(came) = listener.wait(Duration::from_secs(30)) {
                    if came {
                        wakeups.announce();
                    }
                }
            }
            Err(_) => std::thread::sleep(Duration::from_secs(5)),
        }
    }
}

/// `agent worker`.
pub fn worker(
    settings: &Settings,
    json: bool,
    concurrency: usize,
    lease_secs: u64,
    until_empty: bool,
) -> Result<u8, Failure> {
    if !(1..=MAX_CONCURRENCY).contains(&concurrency) {
        return Err(usage(format!(
            "--concurrency {concurrency}: give 1 to {MAX_CONCURRENCY} runs at once"
        )));
    }
    if lease_secs == 0 {
        return Err(usage("--lease must be at least 1 second"));
    }
    let store = Arc::new(stores::queue(&settings.store, "worker")?);
    let ttl = Duration::from_secs(lease_secs);
    let owner = format!(
        "{}:{}",
        std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_owned())
            .unwrap_or_else(|_| "host".to_owned()),
        std::process::id()
    );
    // Idle slots wait for an announcement of a run made runnable (submit, approve), and
    // look again every second anyway (runs whose lease expired are announced by nobody).
    let wakeups = Arc::new(Wakeups::default());
    let drain = drain_on_signals()?;
    if !until_empty {
        let (store, wakeups) = (Arc::clone(&store), Arc::clone(&wakeups));
        // It lives as long as the process: a worker without --until-empty never returns.
        std::thread::spawn(move || listen(&store, &wakeups));
    }
    let failures = std::thread::scope(|scope| {
        let slots: Vec<_> = (0..concurrency)
            .map(|slot| {
                let store = Arc::clone(&store);
                let wakeups = Arc::clone(&wakeups);
                let owner = format!("{owner}/{slot}");
                let drain = &drain;
                scope.spawn(move || -> Result<(), Failure> {
                    loop {
                        if drain.is_cancelled() {
                            return Ok(());
                        }
                        let seen = wakeups.seen();
                        let Some(lease) = store.claim(&owner, ttl)? else {
                            if until_empty {
                                return Ok(());
                            }
                            wakeups.wait(seen, IDLE_POLL);
                            continue;
                        };
                        let next = match drive(&store, settings, json, drain, &lease, ttl) {
                            Ok(next) => next,
                            Err(failure) => {
                                // The run cannot be driven here (a spec, a model, a tool
                                // this machine lacks): it waits for a person, not forever
                                // for a worker that fails the same way.
                                tell(format_args!(
                                    "agent: worker: run {}: {}\n",
                                    lease.run_id, failure.message
                                ));
                                if json {
                                    let value = serde_json::json!({
                                        "run_id": lease.run_id, "status": "paused",
                                        "reason": null, "message": failure.message,
                                    });
                                    say(format_args!("{value}\n"));
                                }
                                Some(QueueState::Paused)
                            }
                        };
                        if let Some(state) = next {
                            store.release(&lease, state)?;
                        }
                    }
                })
            })
            .collect();
        slots
            .into_iter()
            .filter_map(|slot| slot.join().ok().and_then(Result::err))
            .collect::<Vec<Failure>>()
    });
    match failures.into_iter().next() {
        Some(failure) => Err(failure),
        None => Ok(EXIT_OK),
    }
}

/// What a person says to a run that may be queued.
pub enum QueuedAnswer {
    /// Nothing: `agent resume RUN`.
    Continue,
    /// An approval, a denial, a settlement.
    Input(Input),
    /// A message (an answer to its question, or a follow-up after its end).
    Message(String),
}

/// The runs of a database's queue no worker started, as `agent runs` lists them, with the
/// goal submitted and started when submitted: `queued`, or, taken off the queue by
/// `agent cancel`, `stopped` (`cancelled`).
pub fn never_started_runs(store: &PostgresStore) -> Result<Vec<RunSummary>, Failure> {
    Ok(store
        .never_started()?
        .into_iter()
        .map(|queued| {
            let mut run = RunSummary::new(&queued.run_id);
            run.started_at_ms = queued.queued_at_ms;
            run.goal = serde_json::from_str::<RunSpec>(&queued.spec)
                .map(|spec| spec.goal)
                .unwrap_or_default();
            if queued.taken_off {
                run.status = "stopped".to_owned();
                run.reason = Some(agent_core::TerminalReason::Cancelled);
            } else {
                run.status = "queued".to_owned();
            }
            run
        })
        .collect())
}

/// `agent cancel` of a run waiting in a database's queue for a worker or for a person: it
/// is taken off the queue, so that no worker starts it. One no worker ever started has no
/// log: that is said here (`Ok(Some(code))`); one that waits to go on (re-queued after an
/// answer) or for an answer is cancelled by the caller as any other (`Ok(None)`, as for a
/// run this does not apply to).
pub fn cancel_queued(settings: &Settings, json: bool, run_id: &str) -> Result<Option<u8>, Failure> {
    let crate::stores::StoreLocation::Postgres(_) = &settings.store else {
        return Ok(None);
    };
    let store = stores::queue(&settings.store, "cancel")?;
    if !store.dequeue(run_id)? {
        return Ok(None);
    }
    match store.load(run_id) {
        Err(agent_store::StoreError::RunNotFound(_)) => {}
        Ok(_) => return Ok(None),
        Err(e) => return Err(e.into()),
    }
    let message = "taken off the queue before a worker started it; nothing ran";
    if json {
        let value = serde_json::json!({
            "run_id": run_id, "status": "stopped", "reason": "cancelled", "message": message,
        });
        say(format_args!("{value}\n"));
    } else {
        tell(format_args!("agent: run {run_id} cancelled: {message}\n"));
    }
    Ok(Some(crate::exit::exit_code(
        agent_core::TerminalReason::Cancelled,
    )))
}

/// `approve`, `deny`, `resolve` and `resume` of a run in a database's queue: the answer or
/// message is recorded and the run queued again for a worker (`Ok(Some(code))`), since the
/// run's workspace is on the workers' machines. `Ok(None)` for a run this does not apply
/// to (a directory store, a run never queued, or `resume` without a message of an ended
/// one), which the caller continues here.
pub fn answer_queued(
    settings: &Settings,
    json: bool,
    run_id: &str,
    answer: QueuedAnswer,
) -> Result<Option<u8>, Failure> {
    let crate::stores::StoreLocation::Postgres(_) = &settings.store else {
        return Ok(None);
    };
    let store = Arc::new(stores::queue(&settings.store, "resume")?);
    let state = store.queue_state(run_id)?;
    // Its worker stopped answering in the middle of a step (a live one was handed the
    // message before this): the worker that takes it over reads it.
    if state == Some(QueueState::Running)
        && let QueuedAnswer::Message(text) = &answer
        && let Some(code) = note_orphaned(settings, &store, json, run_id, text)?
    {
        return Ok(Some(code));
    }
    match (state, &answer) {
        (None, _) | (Some(QueueState::Ended), QueuedAnswer::Continue | QueuedAnswer::Input(_)) => {
            return Ok(None);
        }
        (Some(QueueState::Paused), QueuedAnswer::Continue) => {
            return Err(usage(format!(
                "run {run_id} waits in the queue for a person: answer it with `agent approve`, \
                 `agent deny`, `agent resolve` or `agent resume {run_id} MESSAGE`"
            )));
        }
        // Handed back to the queue between two steps (a worker let it go): its next model
        // call reads the message, whichever worker takes it up.
        (Some(QueueState::Runnable), QueuedAnswer::Message(text)) if store.load(run_id).is_ok() => {
            return note_queued(&store, json, run_id, text).map(Some);
        }
        // Not begun yet: the worker that begins it reads the message after its goal.
        (Some(QueueState::Runnable), QueuedAnswer::Message(text)) => {
            return note_unstarted(settings, &store, json, run_id, text).map(Some);
        }
        (Some(QueueState::Runnable | QueueState::Running), _) => {
            return Err(usage(format!(
                "run {run_id} is {} in the queue: workers drive it",
                if state == Some(QueueState::Running) {
                    "being driven by a worker"
                } else {
                    "waiting for a worker"
                }
            )));
        }
        (Some(QueueState::Paused | QueueState::Ended), _) => {}
    }
    let runtime = recorder(&store)?;
    let rt = tokio()?;
    match answer {
        QueuedAnswer::Input(input) => rt.block_on(runtime.record_answer(run_id, input))?,
        QueuedAnswer::Message(text) => {
            let log = store.load(run_id)?;
            let budget = crate::app::new_budget(settings, run_id, &log)?;
            drop(log);
            rt.block_on(runtime.record_reply(run_id, &text, budget))?;
        }
        // Answered above: nothing to record.
        QueuedAnswer::Continue => return Ok(None),
    }
    store.wake(run_id)?;
    say_queued(
        json,
        run_id,
        "answered; it is queued again and a worker goes on with it",
    );
    Ok(Some(EXIT_OK))
}

/// A message to a queued run no worker has begun: kept with the run in the queue, read by
/// its first model call after its goal. New limits are refused (the run begins with those
/// it was submitted with).
fn note_unstarted(
    settings: &Settings,
    store: &PostgresStore,
    json: bool,
    run_id: &str,
    text: &str,
) -> Result<u8, Failure> {
    let submitted = store
        .never_started()?
        .into_iter()
        .find(|r| r.run_id == run_id)
        .and_then(|r| serde_json::from_str::<RunSpec>(&r.spec).ok())
        .map(|spec| spec.budget);
    if submitted.is_some_and(|budget| settings.budget.apply(budget.clone()) != budget) {
        return Err(usage(format!(
            "run {run_id} waits for a worker to begin it: new limits are not given to it; \
             send the message without them"
        )));
    }
    if text.len() > crate::app::MAX_NOTE {
        return Err(usage(format!(
            "the message is {} bytes; a run takes at most {} KiB before it begins: send a \
             shorter one",
            text.len(),
            crate::app::MAX_NOTE / 1024
        )));
    }
    let text = Redactor::from_env().redact_str(text);
    if !store.note_unstarted(run_id, &text)? {
        return Err(usage(format!(
            "run {run_id} could not be given the message: a worker took it meanwhile, or it \
             holds 64 unread; send it again"
        )));
    }
    say_queued(
        json,
        run_id,
        "has your message; it reads it after its goal, once a worker begins it",
    );
    Ok(EXIT_OK)
}

/// A message to a queued run whose worker's lease ran out in the middle of a step: kept
/// on its row for the worker that takes it over, read before its next model call. `None`
/// when the run is not in that state (a worker drives it), for the caller to say so.
fn note_orphaned(
    settings: &Settings,
    store: &PostgresStore,
    json: bool,
    run_id: &str,
    text: &str,
) -> Result<Option<u8>, Failure> {
    let log = store.load(run_id)?;
    if crate::app::new_budget(settings, run_id, &log)?.is_some() {
        return Err(usage(format!(
            "run {run_id} waits for a worker to take it over: new limits are not given to it; \
             send the message without them"
        )));
    }
    if text.len() > crate::app::MAX_NOTE {
        return Err(usage(format!(
            "the message is {} bytes; a run between two workers takes at most {} KiB: send a \
             shorter one",
            text.len(),
            crate::app::MAX_NOTE / 1024
        )));
    }
    let text = Redactor::from_env().redact_str(text);
    if !store.note_orphaned(run_id, &text)? {
        return Ok(None);
    }
    say_queued(
        json,
        run_id,
        "has your message; its worker stopped answering, and the worker that takes it over \
         reads it before its next model call",
    );
    Ok(Some(EXIT_OK))
}

/// What records a person's answer or message in a queued run, driving nothing.
fn recorder(store: &Arc<PostgresStore>) -> Result<Runtime, Failure> {
    let ws = Workspace::new(".").map_err(|e| usage(format!("the current directory: {e}")))?;
    let shared: Arc<dyn agent_store::Store> = Arc::clone(store) as _;
    Ok(Runtime::without_model(Arc::new(Gateway::new(ws)), shared)
        .with_redactor(Redactor::from_env()))
}

/// That what a person said was recorded in queued run `run_id` (`what` happened, in words):
/// with `--json`, `{"run_id", "status": "queued"}`.
fn say_queued(json: bool, run_id: &str, what: &str) {
    if json {
        let value = serde_json::json!({"run_id": run_id, "status": "queued"});
        say(format_args!("{value}\n"));
    } else {
        tell(format_args!("agent: run {run_id} {what}\n"));
    }
}

/// A message to a queued run that waits for a worker, recorded as a note its next model
/// call reads.
fn note_queued(
    store: &Arc<PostgresStore>,
    json: bool,
    run_id: &str,
    text: &str,
) -> Result<u8, Failure> {
    let runtime = recorder(store)?;
    // No worker takes it up while the note is written.
    if !store.hold_back(run_id)? {
        return Err(usage(format!(
            "a worker took run {run_id} up meanwhile: send the message again (it is handed \
             to that worker)"
        )));
    }
    let recorded = tokio()?.block_on(runtime.record_note(run_id, text));
    store.wake(run_id)?;
    recorded?;
    say_queued(
        json,
        run_id,
        "has your message; the worker that takes it up reads it before its next model call",
    );
    Ok(EXIT_OK)
}

#[cfg(test)]
mod tests {
    use agent_providers::{Effort, Thinking};

    use super::Calls;

    /// A run queued before thinking could be adaptive is read as it was written; the new
    /// settings are written in agent.toml's words.
    #[test]
    fn calls_queued_before_adaptive_thinking_read_as_they_were() {
        let old: Calls = serde_json::from_str(r#"{"thinking": 2048, "stream": false}"#).unwrap();
        assert_eq!(old.thinking, Some(Thinking::Budget(2048)));
        assert_eq!((old.effort, old.stream), (None, Some(false)));
        let new = Calls {
            thinking: Some(Thinking::Adaptive),
            effort: Some(Effort::Low),
            ..Calls::default()
        };
        let text = serde_json::to_string(&new).unwrap();
        assert_eq!(text, r#"{"thinking":"adaptive","effort":"low"}"#);
        assert_eq!(serde_json::from_str::<Calls>(&text).unwrap(), new);
    }
}
