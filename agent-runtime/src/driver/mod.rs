//! The runtime: how runs are started, continued and stopped. The loop that drives a run
//! (commands of the machine carried out against the model, the gateway and the store) is
//! in `drive`.

mod delegate;
pub use delegate::{DEFAULT_SUB_AGENT_STEPS, sub_agent_run_id};
mod drive;

use std::sync::Arc;

use agent_context::{
    ContextConfig, Extractive, Projector, Summarizer, Tiktoken, TokenCounter, context_window,
};
use agent_core::{
    Budget, CallId, Command, Entry, Event, Input, InputError, Machine, Manifest, Outcome,
    ReplyError, Resolution, RunConfig, RunState, ToolSpec, canonical_json, sha256_hex,
};
use agent_providers::{Model, ModelRequest};
use agent_store::{Store, StoreError};
use agent_tools::Gateway;
use tokio_util::sync::CancellationToken;

use crate::clock::{Clock, SystemClock};
use crate::redact::Redactor;

/// Called with each entry once it is durable (for `--events`).
pub type EventSink = Arc<dyn Fn(&Entry) + Send + Sync>;

/// What a new run needs.
#[derive(Clone, Debug)]
pub struct RunRequest {
    /// The run id (the caller makes ids; the runtime never invents them).
    pub run_id: String,
    /// The goal.
    pub goal: String,
    /// The budgets.
    pub budget: Budget,
}

impl RunRequest {
    /// A request.
    pub fn new(run_id: impl Into<String>, goal: impl Into<String>, budget: Budget) -> Self {
        RunRequest {
            run_id: run_id.into(),
            goal: goal.into(),
            budget,
        }
    }
}

/// How an invocation ended.
#[derive(Clone, Debug)]
pub struct Report {
    /// The run id.
    pub run_id: String,
    /// The outcome (for a paused run, what it waits for).
    pub outcome: Outcome,
    /// The committed state: steps, tool calls, usage.
    pub state: RunState,
}

/// The model of [`Runtime::without_model`], never asked: every entry point that would ask
/// it refuses first.
struct NoModel;

#[async_trait::async_trait]
impl Model for NoModel {
    fn provider(&self) -> &str {
        "none"
    }
    fn model(&self) -> &str {
        "none"
    }
    /// Never asked, so never a call to count.
    fn knows_cost(&self) -> bool {
        true
    }
    async fn decide(
        &self,
        _: ModelRequest<'_>,
    ) -> Result<agent_core::ModelReply, agent_providers::ProviderError> {
        Err(agent_providers::ProviderError::Setup(
            "this runtime has no model".into(),
        ))
    }
}

/// A failure of the runtime itself (not of the run: those are outcomes).
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// The store failed before the run could start or be loaded.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The run's log does not fold.
    #[error("the log of run {run_id} is damaged: {message}")]
    Damaged {
        /// The run.
        run_id: String,
        /// What is wrong.
        message: String,
    },
    /// The machine refused an input: a bug in the runtime.
    #[error("internal error: {0}")]
    Protocol(#[from] InputError),
    /// What the caller asked does not fit the run (not paused, call not pending, ...).
    #[error("{0}")]
    Refused(String),
    /// A person's message does not fit where the run stands (it waits for approval or a
    /// resolution, or was interrupted).
    #[error("run {run_id} cannot take a message: {source}")]
    Reply {
        /// The run.
        run_id: String,
        /// Why.
        source: ReplyError,
    },
    /// A blocking store task died.
    #[error("internal error: the store task failed: {0}")]
    Join(String),
    /// The run was let go at a step where nothing is in flight, as asked
    /// ([`Runtime::with_drain`]): it stands as committed, and goes on from there when it is
    /// taken up again.
    #[error(
        "run {run_id} was let go at its next step, as asked; it goes on from there when resumed"
    )]
    LetGo {
        /// The run.
        run_id: String,
    },
    /// The run's budget caps its cost, and the model cannot say what a call costs
    /// ([`Model::knows_cost`]): its calls would count as free and the cap would never stop
    /// the run. Nothing was committed or asked.
    #[error(
        "the run's cost budget is ${max_cost_usd}, but {provider}:{model} has no price, so \
         its calls would count as free and the budget would never stop the run: give the \
         model's price (HttpModel::with_price) or drop the cost budget"
    )]
    Unpriced {
        /// The model's provider.
        provider: String,
        /// The model.
        model: String,
        /// The budget's cap, in US dollars.
        max_cost_usd: f64,
    },
}

/// The async driver.
pub struct Runtime {
    model: Arc<dyn Model>,
    gateway: Arc<Gateway>,
    store: Arc<dyn Store>,
    clock: Arc<dyn Clock>,
    context: ContextConfig,
    counter: Arc<dyn TokenCounter>,
    summarizer: Arc<dyn Summarizer>,
    sink: Option<EventSink>,
    redactor: Redactor,
    /// False for [`Runtime::without_model`].
    has_model: bool,
    /// Store work runs on the driving task's thread (see [`Runtime::with_inline_store`]).
    inline_store: bool,
    /// The validators new runs record for their final answers.
    answer: Option<agent_core::AnswerSpec>,
    /// Where check commands run, and for how long at most.
    check_dir: std::path::PathBuf,
    check_timeout: std::time::Duration,
    /// Variables named like secrets that check commands are given all the same.
    check_passing: Vec<String>,
    /// The sandbox the runs' commands and answer checks run in, if any.
    sandbox: Option<agent_tools::Sandbox>,
    /// The only tools of the gateway this runtime's runs may use (a sub-agent's).
    only_tools: Option<std::collections::BTreeSet<String>>,
    /// The call a sub-agent's run answers, recorded in the manifest of the run it starts.
    parent: Option<agent_core::ParentCall>,
    /// Calls that would ask a person are denied instead (a reading sub-agent, which runs
    /// beside other reads and cannot wait for one).
    asks_denied: bool,
    /// Once cancelled, runs are let go at their next step ([`Runtime::with_drain`]).
    drain: Option<CancellationToken>,
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime")
            .field("provider", &self.model.provider())
            .field("model", &self.model.model())
            .field("gateway", &self.gateway)
            .finish_non_exhaustive()
    }
}

impl Runtime {
    /// A runtime with the system clock and the default system prompt.
    pub fn new(model: Arc<dyn Model>, gateway: Arc<Gateway>, store: Arc<dyn Store>) -> Runtime {
        #[cfg(feature = "failpoints")]
        crate::init_failpoints();
        let context = ContextConfig {
            context_window: context_window(model.model()),
            ..ContextConfig::default()
        };
        Runtime {
            model,
            gateway,
            store,
            clock: Arc::new(SystemClock),
            context,
            counter: Arc::new(Tiktoken),
            summarizer: Arc::new(Extractive::default()),
            sink: None,
            // Credential formats only: a library reads no environment behind its user's back
            // (the `agent` binary passes `Redactor::from_env`).
            redactor: Redactor::new([]),
            has_model: true,
            inline_store: false,
            answer: None,
            check_dir: std::path::PathBuf::from("."),
            check_timeout: agent_tools::DEFAULT_CHECK_TIMEOUT,
            check_passing: Vec::new(),
            sandbox: None,
            only_tools: None,
            parent: None,
            asks_denied: false,
            drain: None,
        }
    }

    /// A runtime without a model: it cancels runs and builds their prompts, and refuses,
    /// before anything is written, whatever would ask a model (start, resume, reply,
    /// approve, deny, resolve).
    pub fn without_model(gateway: Arc<Gateway>, store: Arc<dyn Store>) -> Runtime {
        let mut runtime = Runtime::new(Arc::new(NoModel), gateway, store);
        runtime.has_model = false;
        runtime
    }

    /// Refuses what needs a model on a runtime without one.
    /// Refuses to drive a run under `budget` when the budget caps the cost and the model
    /// cannot say what its calls cost.
    fn keeps(&self, budget: &Budget) -> Result<(), RuntimeError> {
        match budget.max_cost_usd {
            Some(max_cost_usd) if !self.model.knows_cost() => Err(RuntimeError::Unpriced {
                provider: self.model.provider().to_owned(),
                model: self.model.model().to_owned(),
                max_cost_usd,
            }),
            _ => Ok(()),
        }
    }

    fn needs_model(&self) -> Result<(), RuntimeError> {
        if self.has_model {
            Ok(())
        } else {
            Err(RuntimeError::Refused(
                "this runtime has no model: it can cancel runs and show their prompts, not \
                 drive them"
                    .to_owned(),
            ))
        }
    }

    /// Lets the runs it drives go at their next step once `drain` is cancelled (a worker or
    /// a process asked to shut down): before a run asks its model again, all it did
    /// committed; never with a model call or a tool call in flight, whose outcome is
    /// committed first. The call that drives the run (`start`, `resume`, `approve`, ...) then returns
    /// [`RuntimeError::LetGo`], the run as committed: interrupted, nothing in doubt, taken up
    /// from there by the next process that resumes it. A sub-agent is let go at its own next
    /// step, and then its parent, whose call to it stays in flight (the results of the
    /// other calls of its group are committed): resumed, the parent continues the child from
    /// its log, as after a crash, with nothing in doubt.
    pub fn with_drain(mut self, drain: CancellationToken) -> Runtime {
        self.drain = Some(drain);
        self
    }

    /// Whether the run is to be let go at this step ([`Runtime::with_drain`]).
    pub(super) fn lets_go(&self) -> bool {
        self.drain
            .as_ref()
            .is_some_and(CancellationToken::is_cancelled)
    }

    /// Makes commits and log reads on the thread of the task that drives the run, blocking
    /// it for the flush, instead of on tokio's blocking pool. For a process that drives one
    /// run on a current-thread runtime (the `agent` command) this saves a round trip to
    /// another thread at every commit, and nothing else waits on that thread meanwhile. Keep
    /// the default when one runtime thread drives several runs: their commits then proceed
    /// side by side (and a store that groups flushes groups them), and when the store may
    /// not be called from inside a runtime (the synchronous `postgres` client starts one
    /// of its own).
    pub fn with_inline_store(mut self, inline: bool) -> Runtime {
        self.inline_store = inline;
        self
    }

    /// Store work, inline or on the blocking pool (see [`Runtime::with_inline_store`]).
    pub(crate) async fn store_work<T: Send + 'static>(
        &self,
        work: impl FnOnce(&dyn Store) -> T + Send + 'static,
    ) -> Result<T, RuntimeError> {
        if self.inline_store {
            return Ok(work(self.store.as_ref()));
        }
        let store = Arc::clone(&self.store);
        tokio::task::spawn_blocking(move || work(store.as_ref()))
            .await
            .map_err(|e| RuntimeError::Join(e.to_string()))
    }

    /// Uses another redactor (the default redacts credential formats only; add the values
    /// of secret-named environment variables with `Redactor::from_env`).
    pub fn with_redactor(mut self, redactor: Redactor) -> Runtime {
        self.redactor = redactor;
        self
    }

    /// Validates the final answers of the runs it starts with `spec` (an answer schema,
    /// check commands), recorded in each run's manifest: every later invocation of such a
    /// run judges its answers the same way. An empty spec validates nothing.
    pub fn with_answer_checks(mut self, spec: agent_core::AnswerSpec) -> Runtime {
        self.answer = (!spec.is_empty()).then_some(spec);
        self
    }

    /// Runs answer check commands in `dir` (the workspace root; default the current
    /// directory), each for at most `timeout`.
    pub fn with_check_commands_in(
        mut self,
        dir: impl Into<std::path::PathBuf>,
        timeout: std::time::Duration,
    ) -> Runtime {
        self.check_dir = dir.into();
        self.check_timeout = timeout;
        self
    }

    /// Gives check commands these variables named like secrets, which they are not given
    /// otherwise ([`agent_tools::AnswerChecker::passing`]): a check runs what the model left
    /// in the workspace.
    pub fn with_checks_passing(mut self, names: impl IntoIterator<Item = String>) -> Runtime {
        self.check_passing = names.into_iter().collect();
        self
    }

    /// The sandbox the runs' commands run in (give the gateway's `shell` the same,
    /// [`agent_tools::builtin::Shell::sandboxed`]): recorded in each new run's manifest,
    /// for the processes that take the run up, and answer check commands run in it, in the
    /// gateway's workspace ([`agent_tools::AnswerChecker::sandboxed`]): a check must not
    /// run what the model left there outside it.
    pub fn with_sandbox(mut self, sandbox: Option<agent_tools::Sandbox>) -> Runtime {
        self.sandbox = sandbox;
        self
    }

    /// Uses another clock.
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Runtime {
        self.clock = clock;
        self
    }

    /// Uses another system prompt.
    pub fn with_system_prompt(mut self, system: impl Into<String>) -> Runtime {
        self.context.system = system.into();
        self
    }

    /// Bounds the prompt differently (window, compaction threshold, result budgets).
    pub fn with_context(mut self, context: ContextConfig) -> Runtime {
        self.context = context;
        self
    }

    /// Counts prompt tokens with `counter` (default: tiktoken's o200k, loaded when a count
    /// is first needed).
    pub fn with_token_counter(mut self, counter: Arc<dyn TokenCounter>) -> Runtime {
        self.counter = counter;
        self
    }

    /// Writes compaction summaries with `summarizer` (default: the extractive one).
    pub fn with_summarizer(mut self, summarizer: Arc<dyn Summarizer>) -> Runtime {
        self.summarizer = summarizer;
        self
    }

    /// The projection of a run's log: the exact prompt its next model call would get.
    pub fn projector(&self, log: &[Entry]) -> Projector {
        self.projector_with(self.specs(), log)
    }

    /// The projection of a run's log with the given tools offered (for example the ones
    /// the run recorded at its start, without starting their servers).
    pub fn projector_with(&self, tools: Vec<ToolSpec>, log: &[Entry]) -> Projector {
        let mut projector = Projector::new(self.context.clone(), tools, Arc::clone(&self.counter));
        if !self.model.counts_whole_prompts() {
            projector.counts_may_be_partial();
        }
        projector.apply_all(log);
        projector
    }

    /// Calls `sink` with every entry once it is durable.
    pub fn with_event_sink(mut self, sink: EventSink) -> Runtime {
        self.sink = Some(sink);
        self
    }

    /// The manifest a new run records: what shaped it.
    pub fn manifest(&self, budget: Budget) -> Manifest {
        let specs: Vec<ToolSpec> = self.specs();
        let tools = serde_json::to_value(&specs).unwrap_or_default();
        Manifest {
            runtime_version: env!("CARGO_PKG_VERSION").to_owned(),
            provider: self.model.provider().to_owned(),
            model: self.model.model().to_owned(),
            system_prompt_digest: sha256_hex(self.context.system.as_bytes()),
            tool_schema_digest: sha256_hex(canonical_json(&tools).as_bytes()),
            budget,
            tools: specs,
            answer: self.answer.clone().map(Box::new),
            forked_from: None,
            parent: self.parent.clone().map(Box::new),
            workspace: Some(self.gateway.workspace().root().display().to_string()),
            sandbox: self
                .sandbox
                .as_ref()
                .map(|sandbox| Box::new(sandbox.record())),
        }
    }

    /// Whether this runtime makes its prompts as the run with `manifest` was started to:
    /// the same provider and model, system text and tools, and not a fork (whose log began
    /// with another run's).
    pub(super) fn prompts_as(&self, manifest: Option<&Manifest>) -> bool {
        let Some(manifest) = manifest else {
            return false;
        };
        let now = self.manifest(Budget::default());
        manifest.forked_from.is_none()
            && manifest.provider == now.provider
            && manifest.model == now.model
            && manifest.system_prompt_digest == now.system_prompt_digest
            && manifest.tool_schema_digest == now.tool_schema_digest
    }

    /// The tools this runtime's runs may use: the gateway's, or the sub-agent's share.
    fn specs(&self) -> Vec<ToolSpec> {
        let specs = self.gateway.specs();
        match &self.only_tools {
            None => specs,
            Some(only) => specs
                .into_iter()
                .filter(|s| only.contains(&s.name))
                .collect(),
        }
    }

    /// The store the runtime commits to (to read a run's log, say, between invocations).
    pub fn store(&self) -> Arc<dyn Store> {
        Arc::clone(&self.store)
    }

    /// Where a run stands, without driving it: its outcome if it ended or waits for a
    /// person (the pending calls included), `None` if it was interrupted (`resume` goes on
    /// with it).
    pub async fn standing(&self, run_id: &str) -> Result<Option<Report>, RuntimeError> {
        Ok(match self.standing_as_logged(run_id).await? {
            Some(report) => Some(self.surface_children(report).await),
            None => None,
        })
    }

    /// [`Runtime::standing`] as the run's own log has it (a pause on sub-agents shown as
    /// the calls in doubt it is).
    async fn standing_as_logged(&self, run_id: &str) -> Result<Option<Report>, RuntimeError> {
        let (machine, _) = self.load(run_id).await?;
        let outcome = machine.outcome();
        Ok(outcome.map(|outcome| Report {
            run_id: run_id.to_owned(),
            outcome,
            state: machine.state().clone(),
        }))
    }

    /// Starts a run and drives it until it stops or pauses.
    pub async fn start(
        &self,
        request: RunRequest,
        cancel: CancellationToken,
    ) -> Result<Report, RuntimeError> {
        self.start_noted(request, Vec::new(), cancel).await
    }

    /// [`Runtime::start`], with what a person said to the run before it began (`notes`,
    /// each a `user_note`) committed with its start, in one batch (a queued run's notes
    /// are not lost to a worker that dies before its first commit), and read by its first
    /// model call after its goal.
    pub async fn start_noted(
        &self,
        request: RunRequest,
        notes: Vec<String>,
        cancel: CancellationToken,
    ) -> Result<Report, RuntimeError> {
        self.needs_model()?;
        self.keeps(&request.budget)?;
        let run_id = request.run_id;
        let config = RunConfig {
            run_id: run_id.clone(),
            goal: self.redactor.redact_str(&request.goal),
            manifest: self.manifest(request.budget),
            tools: self.specs(),
        };
        let notes = notes
            .iter()
            .map(|text| self.redactor.redact_str(text))
            .collect();
        let machine = Machine::start_noted(config, notes, self.clock.now_ms());
        self.drive(run_id, machine, Vec::new(), cancel).await
    }

    /// Forks run `parent` before its model call `at` (1-based, as `agent show` numbers
    /// calls) into a new run `run_id`, and drives the fork on with this runtime's model,
    /// tools, system prompt and answer validators, under `budget`. The fork's log begins
    /// with the parent's committed entries before that call, so its first prompt is the one
    /// the parent's call got (with the same system prompt and tools); inherited effects are
    /// the parent's facts and never run again, and the fork's own get keys of its own.
    pub async fn fork(
        &self,
        parent: &str,
        at: u32,
        run_id: &str,
        budget: Budget,
        cancel: CancellationToken,
    ) -> Result<Report, RuntimeError> {
        self.needs_model()?;
        self.create_fork(parent, at, run_id, budget).await?;
        self.resume(run_id, cancel).await
    }

    /// Writes the log of a fork (see [`Runtime::fork`]) without driving it: its next
    /// model call is call `at`. Needs no model.
    pub async fn create_fork(
        &self,
        parent: &str,
        at: u32,
        run_id: &str,
        budget: Budget,
    ) -> Result<(), RuntimeError> {
        let log = self.load_log(parent).await?;
        if log.is_empty() {
            return Err(RuntimeError::Refused(format!("there is no run {parent}")));
        }
        let made = self.clock.now_ms();
        let entries = agent_core::fork_log(&log, at, run_id, self.manifest(budget), made).map_err(
            |e| match e {
                agent_core::ForkError::Fold(e) => RuntimeError::Damaged {
                    run_id: parent.to_owned(),
                    message: e.to_string(),
                },
                other => RuntimeError::Refused(other.to_string()),
            },
        )?;
        let id = run_id.to_owned();
        self.store_work(move |store| store.append(&id, 0, &entries))
            .await??;
        Ok(())
    }

    /// Continues a run from its committed log.
    pub async fn resume(
        &self,
        run_id: &str,
        cancel: CancellationToken,
    ) -> Result<Report, RuntimeError> {
        self.needs_model()?;
        let (machine, log) = self.take_up(run_id).await?;
        self.check_tools(run_id, &log)?;
        self.keeps(machine.budget())?;
        self.drive(run_id.to_owned(), machine, log, cancel).await
    }

    /// Gives a person's message to a run that ended or paused on a question (CONTRACT §7):
    /// the answer to its clarification, or a follow-up that opens a new exchange. `budget`,
    /// when given, is the run's budget from then on (to raise a spent token, cost or time
    /// budget). The message is redacted like everything else that is logged.
    ///
    /// An interrupted run (a crash, or let go) is taken up as [`Runtime::resume`] does, the
    /// message read as a note (`user_note`) before its next model call, once what was in
    /// flight is settled: it opens no new exchange, so no `budget` comes with it. A run that
    /// stops before that call never reads it (its log says so: no `user_note`).
    pub async fn reply(
        &self,
        run_id: &str,
        text: &str,
        budget: Option<Budget>,
        cancel: CancellationToken,
    ) -> Result<Report, RuntimeError> {
        self.needs_model()?;
        let log = self.load_log(run_id).await?;
        self.check_tools(run_id, &log)?;
        let interrupted = matches!(
            RunState::fold(&log).map(|s| s.status),
            Ok(agent_core::Status::Running)
        );
        if interrupted && budget.is_none() {
            drop(log);
            let (machine, log) = self.take_up(run_id).await?;
            self.keeps(machine.budget())?;
            let note = self.redactor.redact_str(text);
            return self
                .drive_noted(run_id.to_owned(), machine, log, cancel, vec![note])
                .await;
        }
        let machine = self.with_message(run_id, &log, text, budget)?;
        self.keeps(machine.budget())?;
        self.drive(run_id.to_owned(), machine, log, cancel).await
    }

    /// Approves pending calls of a paused run (all of them when `call_ids` is empty), then
    /// continues it.
    pub async fn approve(
        &self,
        run_id: &str,
        call_ids: Vec<CallId>,
        cancel: CancellationToken,
    ) -> Result<Report, RuntimeError> {
        // A sub-agent's approvals are answered through its parent.
        if let Some(report) = self
            .settle_children(run_id, &call_ids, None, cancel.clone())
            .await?
        {
            return Ok(report);
        }
        self.settle(run_id, Input::ApprovalGranted { call_ids }, cancel)
            .await
    }

    /// Denies pending calls of a paused run (all of them when `call_ids` is empty); the
    /// model is told the reason, then the run continues.
    pub async fn deny(
        &self,
        run_id: &str,
        call_ids: Vec<CallId>,
        reason: String,
        cancel: CancellationToken,
    ) -> Result<Report, RuntimeError> {
        if let Some(report) = self
            .settle_children(run_id, &call_ids, Some(&reason), cancel.clone())
            .await?
        {
            return Ok(report);
        }
        self.settle(run_id, Input::ApprovalDenied { call_ids, reason }, cancel)
            .await
    }

    /// Settles a call of unknown outcome by a person's word (`agent resolve`), then
    /// continues the run.
    pub async fn resolve(
        &self,
        run_id: &str,
        call_id: CallId,
        resolution: Resolution,
        cancel: CancellationToken,
    ) -> Result<Report, RuntimeError> {
        self.settle(
            run_id,
            Input::Resolved {
                call_id,
                resolution,
            },
            cancel,
        )
        .await
    }

    /// Cancels a paused or interrupted run: `cancelled` is committed and nothing more runs.
    /// A run whose log no longer folds (damaged by hand, or by a bug) can still be ended:
    /// `cancelled` is appended after what is there. A sub-agent's run whose parent waits
    /// on it, paused with its call in doubt, lets the parent go on with that answer when it
    /// is next driven, as any sub-agent driven to its end by its own id does.
    pub async fn cancel(&self, run_id: &str) -> Result<Report, RuntimeError> {
        let report = self.cancel_one(run_id).await?;
        // Its sub-agents stop with it.
        for child in self.children_of(run_id).await {
            // A child that already ended stays as it ended.
            let _ = self.cancel_one(&child).await;
        }
        self.release_parent(run_id).await;
        Ok(report)
    }

    /// The sub-agent runs a run started: those its log names, and those of the calls of
    /// its latest turn (a crash may have come before their results).
    async fn children_of(&self, run_id: &str) -> Vec<String> {
        let Ok(log) = self.load_log(run_id).await else {
            return Vec::new();
        };
        let mut children: Vec<String> = log
            .iter()
            .filter_map(|e| match &e.event {
                Event::SubAgentFinished { run_id, .. } => Some(run_id.clone()),
                _ => None,
            })
            .collect();
        if let Ok(state) = RunState::fold(&log) {
            for call in &state.turn_calls {
                if agent_tools::builtin::is_delegate(&call.name) {
                    children.push(delegate::sub_agent_run_id(run_id, state.turn, &call.id));
                }
            }
        }
        children.sort();
        children.dedup();
        let mut existing = Vec::new();
        for child in children {
            if self.load_log(&child).await.is_ok_and(|l| !l.is_empty()) {
                existing.push(child);
            }
        }
        existing
    }

    async fn cancel_one(&self, run_id: &str) -> Result<Report, RuntimeError> {
        let (mut machine, log) = match self.load(run_id).await {
            Ok(loaded) => loaded,
            Err(RuntimeError::Damaged { message, .. }) => {
                return self.cancel_unfolded(run_id, &message).await;
            }
            Err(e) => return Err(e),
        };
        match machine.poll_command() {
            // Paused by its end (a question for a person): cancelled after it.
            Some(Command::Finish(outcome))
                if outcome.reason.class() == agent_core::ReasonClass::Paused =>
            {
                self.append_cancelled(
                    run_id,
                    format!("cancelled by a person while it waited ({})", outcome.reason),
                )
                .await
            }
            Some(Command::Finish(outcome)) => Err(RuntimeError::Refused(format!(
                "run {run_id} already ended: {} ({})",
                outcome.reason.class().as_str(),
                outcome.reason
            ))),
            // Whatever the run would do next is not done.
            _ => {
                machine.handle(Input::Cancel)?;
                self.drive(run_id.to_owned(), machine, log, CancellationToken::new())
                    .await
            }
        }
    }

    async fn cancel_unfolded(&self, run_id: &str, why: &str) -> Result<Report, RuntimeError> {
        self.append_cancelled(
            run_id,
            format!("cancelled by a person; its log could not be read as a run ({why})"),
        )
        .await
    }

    /// Appends `cancelled` after what the log holds, unless it ended for good already.
    async fn append_cancelled(
        &self,
        run_id: &str,
        message: String,
    ) -> Result<Report, RuntimeError> {
        let log = self.load_log(run_id).await?;
        if let Some(Event::RunEnded { outcome }) = log.last().map(|e| &e.event)
            && outcome.reason.class() != agent_core::ReasonClass::Paused
        {
            return Err(RuntimeError::Refused(format!(
                "run {run_id} already ended: {} ({})",
                outcome.reason.class().as_str(),
                outcome.reason
            )));
        }
        let outcome = Outcome::stop(agent_core::TerminalReason::Cancelled, message);
        let version = log.len() as u64;
        let entry = Entry {
            version: version + 1,
            at_ms: self.clock.now_ms(),
            event: Event::RunEnded {
                outcome: outcome.clone(),
            },
        };
        let id = run_id.to_owned();
        let committed = entry.clone();
        self.store_work(move |store| store.append(&id, version, &[committed]))
            .await??;
        let mut log = log;
        log.push(entry.clone());
        let state = RunState::fold(&log).unwrap_or_default();
        Ok(Report {
            run_id: run_id.to_owned(),
            outcome,
            state,
        })
    }

    /// Records a person's answer to a paused run (`ApprovalGranted`, `ApprovalDenied` or
    /// `Resolved`) and stops there, for a run that something else drives on (a worker of
    /// the queue). Needs no model; the answer is checked as [`Runtime::approve`] checks it,
    /// and an approval a sub-agent waits for is answered through its parent as there.
    pub async fn record_answer(&self, run_id: &str, input: Input) -> Result<(), RuntimeError> {
        let through_children = match &input {
            Input::ApprovalGranted { call_ids } => {
                self.record_children_answers(run_id, call_ids, None).await?
            }
            Input::ApprovalDenied { call_ids, reason } => {
                self.record_children_answers(run_id, call_ids, Some(reason))
                    .await?
            }
            _ => false,
        };
        if through_children {
            return Ok(());
        }
        self.record_answer_here(run_id, input).await
    }

    /// [`Runtime::record_answer`] in the run itself.
    async fn record_answer_here(&self, run_id: &str, input: Input) -> Result<(), RuntimeError> {
        let (mut machine, log) = self.load(run_id).await?;
        drop(log);
        self.answer(run_id, &mut machine, input)?;
        self.commit_first(run_id, machine).await
    }

    /// Records a person's note (`user_note`) for an interrupted run that stands between two
    /// steps, without continuing it: its next model call reads it, whoever takes the run up
    /// (a worker of the queue). A run interrupted in the middle of a step (calls whose
    /// results are not committed) is refused: its note would come before their results.
    /// Needs no model.
    pub async fn record_note(&self, run_id: &str, text: &str) -> Result<(), RuntimeError> {
        let (mut machine, log) = self.load(run_id).await?;
        drop(log);
        if !matches!(machine.poll_command(), Some(Command::CallModel { .. })) {
            return Err(RuntimeError::Refused(format!(
                "run {run_id} stopped in the middle of a step; a message can be read once \
                 it is taken up again: send it then"
            )));
        }
        let text = self.redactor.redact_str(text);
        machine.handle(Input::UserNote { text })?;
        self.commit_first(run_id, machine).await
    }

    /// Records a person's message to a run (as [`Runtime::reply`] does, with the same
    /// checks and new limits) without continuing it: for a run another process continues,
    /// such as a worker of a queue. Needs no model.
    pub async fn record_reply(
        &self,
        run_id: &str,
        text: &str,
        budget: Option<Budget>,
    ) -> Result<(), RuntimeError> {
        let log = self.load_log(run_id).await?;
        let machine = self.with_message(run_id, &log, text, budget)?;
        drop(log);
        self.commit_first(run_id, machine).await
    }

    /// The run's machine with a person's message (redacted) staged after its log.
    fn with_message(
        &self,
        run_id: &str,
        log: &[Entry],
        text: &str,
        budget: Option<Budget>,
    ) -> Result<Machine, RuntimeError> {
        Machine::reply(
            self.specs(),
            log,
            self.redactor.redact_str(text),
            budget,
            self.clock.now_ms(),
        )
        .map_err(|e| reply_error(run_id, e))
    }

    /// Commits what the machine staged first, and nothing more.
    async fn commit_first(&self, run_id: &str, mut machine: Machine) -> Result<(), RuntimeError> {
        let Some(Command::Commit {
            expected_version,
            entries,
        }) = machine.poll_command()
        else {
            return Err(RuntimeError::Refused(format!(
                "run {run_id}: what was recorded led to no commit"
            )));
        };
        let entries = self.redactor.redact_entries(entries);
        let id = run_id.to_owned();
        self.store_work(move |store| store.append(&id, expected_version, &entries))
            .await??;
        Ok(())
    }

    async fn settle(
        &self,
        run_id: &str,
        input: Input,
        cancel: CancellationToken,
    ) -> Result<Report, RuntimeError> {
        self.needs_model()?;
        let (mut machine, log) = self.load(run_id).await?;
        self.check_tools(run_id, &log)?;
        self.keeps(machine.budget())?;
        self.answer(run_id, &mut machine, input)?;
        self.drive(run_id.to_owned(), machine, log, cancel).await
    }

    /// Hands a person's answer to a machine that waits for one, or says why it does not fit.
    fn answer(
        &self,
        run_id: &str,
        machine: &mut Machine,
        input: Input,
    ) -> Result<(), RuntimeError> {
        let waits_for = match machine.poll_command() {
            Some(Command::AwaitApproval { .. }) => "approval",
            Some(Command::AwaitResolution { .. }) => "resolution",
            _ => "",
        };
        let fits = matches!(
            (waits_for, &input),
            (
                "approval",
                Input::ApprovalGranted { .. } | Input::ApprovalDenied { .. }
            ) | ("resolution", Input::Resolved { .. })
        );
        if !fits {
            let wanted = match input {
                Input::Resolved { .. } => "a resolution (outcome_unknown)",
                _ => "approval",
            };
            let status = match machine.state().outcome().cloned().or(machine.outcome()) {
                Some(o) => format!("{} ({})", o.reason.class().as_str(), o.reason),
                None => "running".to_owned(),
            };
            return Err(RuntimeError::Refused(format!(
                "run {run_id} is not waiting for {wanted}; it is {status}"
            )));
        }
        machine.handle(input).map_err(|e| match e {
            InputError::NotPending(id) => {
                let pending = machine
                    .outcome()
                    .map(|o| {
                        o.pending
                            .iter()
                            .map(|p| p.call_id.to_string())
                            .collect::<Vec<_>>()
                            .join(", ")
                    })
                    .unwrap_or_default();
                RuntimeError::Refused(format!(
                    "call {id} is not pending in run {run_id}; pending: {pending}"
                ))
            }
            other => RuntimeError::Protocol(other),
        })?;
        Ok(())
    }

    /// Refuses to drive a run on with fewer tools than it was started with: a call
    /// approved for a tool this invocation lacks (an MCP server not configured this time)
    /// would be recorded as run and silently not happen.
    fn check_tools(&self, run_id: &str, log: &[Entry]) -> Result<(), RuntimeError> {
        let Some(Event::RunStarted { manifest, .. }) = log.first().map(|e| &e.event) else {
            return Ok(());
        };
        let have: std::collections::BTreeSet<String> =
            self.specs().into_iter().map(|s| s.name).collect();
        let missing: Vec<&str> = manifest
            .tools
            .iter()
            .map(|t| t.name.as_str())
            .filter(|name| !have.contains(*name))
            .collect();
        if missing.is_empty() {
            return Ok(());
        }
        Err(RuntimeError::Refused(format!(
            "run {run_id} was started with tools this invocation does not have ({}); continue \
             it with the same tools (the same MCP servers)",
            missing.join(", ")
        )))
    }

    /// A run's committed log, read off the async threads.
    async fn load_log(&self, run_id: &str) -> Result<Vec<Entry>, RuntimeError> {
        self.load_log_from(run_id, 1).await
    }

    async fn load_log_from(&self, run_id: &str, from: u64) -> Result<Vec<Entry>, RuntimeError> {
        let id = run_id.to_owned();
        Ok(self
            .store_work(move |store| store.load_from(&id, from))
            .await??)
    }

    async fn load(&self, run_id: &str) -> Result<(Machine, Vec<Entry>), RuntimeError> {
        self.load_as(run_id, Machine::resume).await
    }

    /// The run's machine to drive on from here ([`Machine::take_up`]), and its log.
    async fn take_up(&self, run_id: &str) -> Result<(Machine, Vec<Entry>), RuntimeError> {
        self.load_as(run_id, Machine::take_up).await
    }

    async fn load_as(
        &self,
        run_id: &str,
        rebuild: Rebuild,
    ) -> Result<(Machine, Vec<Entry>), RuntimeError> {
        let log = self.load_log(run_id).await?;
        let machine = rebuild(self.specs(), &log, self.clock.now_ms()).map_err(|e| {
            RuntimeError::Damaged {
                run_id: run_id.to_owned(),
                message: e.to_string(),
            }
        })?;
        Ok((machine, log))
    }
}

/// How a run's machine is made from its log: [`Machine::resume`] or [`Machine::take_up`].
type Rebuild = fn(Vec<ToolSpec>, &[Entry], u64) -> Result<Machine, agent_core::FoldError>;

pub(crate) fn report(run_id: &str, machine: Machine, outcome: Outcome) -> Report {
    Report {
        run_id: run_id.to_owned(),
        outcome,
        state: machine.into_state(),
    }
}

/// Why a message could not be added to a run: a log that does not fold is damaged.
fn reply_error(run_id: &str, e: ReplyError) -> RuntimeError {
    match e {
        ReplyError::Fold(e) => RuntimeError::Damaged {
            run_id: run_id.to_owned(),
            message: e.to_string(),
        },
        source => RuntimeError::Reply {
            run_id: run_id.to_owned(),
            source,
        },
    }
}
