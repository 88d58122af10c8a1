//! Sub-agents: a `delegate` or `delegate_read` call answered by a child run with its own
//! log, context and budgets, driven by this runtime with a share of its tools (never
//! more: the same gateway, policy and hooks; no sub-agent tools, so no grandchildren).
//!
//! The child's id is made from the parent's run id, turn and call id, so a call that runs
//! again after a crash finds its child and continues it (or reads how it ended) instead of
//! starting another: the child's own effects keep their exactly-once guarantees. What the
//! child used counts toward the parent's token and cost budgets, live: children that run
//! together share what is left, and the one whose model call passes it is cancelled.

use std::collections::BTreeSet;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};

use agent_context::{Digest, Summarized, Summarizer};
use agent_core::{
    Budget, CallId, Entry, ErrorKind, Event, Machine, ModelReply, ParentCall, Prompt, Risk,
    ScheduledCall, TerminalReason, ToolCall, ToolError, ToolResult, Usage,
};
use agent_providers::{Model, ModelRequest, ProviderError};
use agent_tools::builtin::{DELEGATE_READ, is_delegate};
use futures::StreamExt as _;
use tokio_util::sync::CancellationToken;

use super::{Report, RunRequest, Runtime, RuntimeError};

/// Model calls a sub-agent may make unless its call says.
pub const DEFAULT_SUB_AGENT_STEPS: u32 = 16;

pub use agent_core::sub_agent_run_id;

/// What the parent may still spend, shared by the children of one group.
struct Spend {
    used: Mutex<Usage>,
    max_tokens: Option<u64>,
    max_cost_usd: Option<f64>,
}

impl Spend {
    /// Adds a child's model call; whether the parent's budget is now spent.
    fn add(&self, usage: &Usage) -> bool {
        let mut used = self.used.lock().unwrap_or_else(|p| p.into_inner());
        used.add(usage);
        self.max_tokens
            .is_some_and(|max| used.total_tokens() >= max)
            || self.max_cost_usd.is_some_and(|max| used.cost_usd >= max)
    }
}

/// The parent's model, for a child: every reply's usage is added to what the parent
/// spent, and the child is cancelled once that passes the parent's budget.
struct Guarded {
    inner: Arc<dyn Model>,
    spend: Arc<Spend>,
    stop: CancellationToken,
}

#[async_trait::async_trait]
impl Model for Guarded {
    fn provider(&self) -> &str {
        self.inner.provider()
    }
    fn model(&self) -> &str {
        self.inner.model()
    }

    fn knows_cost(&self) -> bool {
        self.inner.knows_cost()
    }
    fn least_cost(&self, input_tokens: u64) -> f64 {
        self.inner.least_cost(input_tokens)
    }
    fn output_tokens_for(&self, usd: f64) -> Option<u64> {
        self.inner.output_tokens_for(usd)
    }
    fn counts_whole_prompts(&self) -> bool {
        self.inner.counts_whole_prompts()
    }
    fn counts_text(&self) -> bool {
        self.inner.counts_text()
    }
    async fn decide(&self, request: ModelRequest<'_>) -> Result<ModelReply, ProviderError> {
        let reply = self.inner.decide(request).await;
        if let Ok(reply) = &reply
            && self.spend.add(&reply.usage)
        {
            self.stop.cancel();
        }
        reply
    }
}

/// The parent's summarizer, for a child: what a child's summary uses counts against what
/// the parent has left, as its model calls do, and past it the child is cancelled.
struct GuardedSummaries {
    inner: Arc<dyn Summarizer>,
    spend: Arc<Spend>,
    stop: CancellationToken,
}

#[async_trait::async_trait]
impl Summarizer for GuardedSummaries {
    async fn summarize(&self, history: &[Entry], prompt: &Prompt) -> Summarized {
        let summarized = self.inner.summarize(history, prompt).await;
        if self.spend.add(&summarized.usage) {
            self.stop.cancel();
        }
        summarized
    }

    fn reads_history(&self) -> bool {
        self.inner.reads_history()
    }

    fn summarize_digest(&self, digest: &Digest) -> Option<String> {
        self.inner.summarize_digest(digest)
    }
}

/// A sub-agent call's arguments (checked against the tool's schema before it runs).
#[derive(serde::Deserialize)]
struct Args {
    goal: String,
    #[serde(default)]
    tools: Option<Vec<String>>,
    #[serde(default)]
    max_steps: Option<u32>,
}

/// A boxed future: a child is driven by the same code as its parent, so the recursion
/// goes through a box. It gives the child's report and what the child had used before.
type Driving<'a> = Pin<Box<dyn Future<Output = Result<(Report, Usage), RuntimeError>> + Send + 'a>>;

impl Runtime {
    /// Whether this runtime carries out `call` itself, as a sub-agent.
    pub(super) fn is_sub_agent_call(call: &ToolCall) -> bool {
        is_delegate(&call.name)
    }

    /// Whether the sub-agent run `child_id` was started (its log has an entry).
    pub(super) async fn started(&self, child_id: &str) -> bool {
        self.load_log(child_id)
            .await
            .is_ok_and(|log| !log.is_empty())
    }

    /// A runtime for a child: the same store, gateway, clock and context settings, the
    /// guarded model and summarizer, only `tools`, no event sink and no answer validators
    /// of its own.
    fn child(
        &self,
        model: Arc<dyn Model>,
        summarizer: Arc<dyn Summarizer>,
        tools: BTreeSet<String>,
        parent: ParentCall,
        read_only: bool,
    ) -> Runtime {
        Runtime {
            model,
            gateway: Arc::clone(&self.gateway),
            store: Arc::clone(&self.store),
            clock: Arc::clone(&self.clock),
            context: self.context.clone(),
            counter: Arc::clone(&self.counter),
            summarizer,
            sink: None,
            redactor: self.redactor.clone(),
            has_model: true,
            inline_store: self.inline_store,
            answer: None,
            check_dir: self.check_dir.clone(),
            check_timeout: self.check_timeout,
            check_passing: self.check_passing.clone(),
            sandbox: self.sandbox.clone(),
            only_tools: Some(tools),
            parent: Some(parent),
            asks_denied: read_only,
            // Let go at its own next step with its parent: what it runs now is finished
            // and committed first, and the parent's call is left to continue it.
            drain: self.drain.clone(),
        }
    }

    /// Runs the sub-agent calls of a group together, as many at once as the gateway runs
    /// tools (each child makes model calls: a reply of a hundred must not become a hundred
    /// requests to the provider at once). Each gets a result (the child's answer, or why
    /// it stopped) and, when a child ran, its run id and usage, in the model's order; one
    /// whose child was let go ([`Runtime::with_drain`]) gets none, and `true` says so.
    pub(super) async fn run_sub_agents(
        &self,
        run_id: &str,
        turn: u32,
        machine: &Machine,
        calls: Vec<ScheduledCall>,
        cancel: &CancellationToken,
    ) -> (Vec<ToolResult>, Vec<(CallId, String, Usage)>, bool) {
        let budget = machine.budget();
        let spend = Arc::new(Spend {
            used: Mutex::new(machine.spent()),
            max_tokens: budget.max_tokens,
            max_cost_usd: budget.max_cost_usd,
        });
        let runs = calls.into_iter().map(|scheduled| {
            self.run_sub_agent(
                run_id,
                turn,
                machine,
                scheduled.call,
                Arc::clone(&spend),
                cancel,
            )
        });
        let mut results = Vec::new();
        let mut finished = Vec::new();
        let mut done = futures::stream::iter(runs).buffered(self.gateway.concurrency());
        let mut let_go = false;
        while let Some((result, child)) = done.next().await {
            match result {
                Some(result) => results.push(result),
                None => let_go = true,
            }
            finished.extend(child);
        }
        (results, finished, let_go)
    }

    async fn run_sub_agent(
        &self,
        run_id: &str,
        turn: u32,
        machine: &Machine,
        call: ToolCall,
        spend: Arc<Spend>,
        cancel: &CancellationToken,
    ) -> (Option<ToolResult>, Option<(CallId, String, Usage)>) {
        let fail = |kind: ErrorKind, message: String| {
            Some(ToolResult::error(
                call.id.clone(),
                call.name.clone(),
                ToolError::new(kind, message),
            ))
        };
        let args: Args = match serde_json::from_value(call.arguments.clone()) {
            Ok(args) => args,
            Err(e) => return (fail(ErrorKind::InvalidArguments, e.to_string()), None),
        };
        // Never wider than the parent: its tools (reads only for `delegate_read`), no
        // sub-agents, and within those, the ones the call names.
        let read_only = call.name == DELEGATE_READ;
        let mut tools: BTreeSet<String> = machine
            .tools()
            .filter(|t| !is_delegate(&t.name) && (!read_only || t.risk == Risk::Read))
            .map(|t| t.name.clone())
            .collect();
        if let Some(named) = &args.tools {
            if let Some(unknown) = named.iter().find(|n| !tools.contains(*n)) {
                let have: Vec<&str> = tools.iter().map(String::as_str).collect();
                return (
                    fail(
                        ErrorKind::InvalidArguments,
                        format!(
                            "/tools: {unknown:?} is not a tool a sub-agent may have; it may have: {}",
                            have.join(", ")
                        ),
                    ),
                    None,
                );
            }
            tools = named.iter().cloned().collect();
        }
        let child_id = sub_agent_run_id(run_id, turn, &call.id);
        let stop = cancel.child_token();
        let summarizer = Arc::new(GuardedSummaries {
            inner: Arc::clone(&self.summarizer),
            spend: Arc::clone(&spend),
            stop: stop.clone(),
        });
        let model = Arc::new(Guarded {
            inner: Arc::clone(&self.model),
            spend,
            stop: stop.clone(),
        });
        let parent = ParentCall {
            run_id: run_id.to_owned(),
            turn,
            call_id: call.id.clone(),
        };
        let child = self.child(model, summarizer, tools, parent, read_only);
        let worked = machine.state().worked_by(self.clock.now_ms());
        let budget = sub_agent_budget(machine.budget(), &machine.spent(), worked, args.max_steps);
        let report = match child
            .sub_agent_report(&child_id, &args.goal, budget, stop)
            .await
        {
            Ok(found) => found,
            // Let go at its next step: the call stays in flight, continued by whoever
            // takes the parent up.
            Err(RuntimeError::LetGo { .. }) => return (None, None),
            Err(e) => {
                return (
                    fail(
                        ErrorKind::ExecutionFailed,
                        format!("the sub-agent run {child_id} could not run: {e}"),
                    ),
                    None,
                );
            }
        };
        let (report, _) = report;
        // The child's whole usage: the parent's fold counts what it had not counted yet
        // (a call run again after a pause or a crash reports the same child again).
        let usage = report.state.usage;
        let outcome = &report.outcome;
        let result = match (&outcome.answer, outcome.reason) {
            (Some(answer), TerminalReason::Completed) => Some(ToolResult::ok(
                call.id.clone(),
                call.name.clone(),
                answer.clone(),
            )),
            (_, reason) => {
                let waits = matches!(
                    reason,
                    TerminalReason::ApprovalRequired | TerminalReason::OutcomeUnknown
                );
                let kind = if reason == TerminalReason::Cancelled {
                    ErrorKind::Cancelled
                } else if waits && call.name != DELEGATE_READ {
                    // The child waits for a person: so does this call, whose outcome is
                    // unknown until then (the parent pauses on it; `agent approve PARENT`
                    // answers the child, then runs the call again, which continues it).
                    ErrorKind::OutcomeUnknown
                } else {
                    ErrorKind::ExecutionFailed
                };
                fail(
                    kind,
                    format!(
                        "the sub-agent (run {child_id}) stopped without an answer: {reason}: {}",
                        outcome.message
                    ),
                )
            }
        };
        (result, Some((call.id, child_id, usage)))
    }

    /// Drives the child run `child_id`: continued when it exists (after a crash, the call
    /// runs again and finds it), read when it has ended, started otherwise.
    fn sub_agent_report<'a>(
        &'a self,
        child_id: &'a str,
        goal: &'a str,
        budget: Budget,
        cancel: CancellationToken,
    ) -> Driving<'a> {
        Box::pin(async move {
            let log = self.load_log(child_id).await.unwrap_or_default();
            if log.is_empty() {
                let request = RunRequest::new(child_id, goal, budget);
                return Ok((self.start(request, cancel).await?, Usage::default()));
            }
            let before = agent_core::RunState::fold(&log)
                .map(|s| s.usage)
                .unwrap_or_default();
            if let Some(Event::RunEnded { .. }) = log.last().map(|e| &e.event)
                && let Some(report) = self.standing_as_logged(child_id).await?
            {
                return Ok((report, before));
            }
            Ok((self.resume(child_id, cancel).await?, before))
        })
    }
}

/// A child's budget: its own step limit, and what is left of the parent's tokens, money
/// and time (`worked_ms` of it spent).
fn sub_agent_budget(
    parent: &Budget,
    used: &Usage,
    worked_ms: u64,
    max_steps: Option<u32>,
) -> Budget {
    Budget {
        max_steps: max_steps.unwrap_or(DEFAULT_SUB_AGENT_STEPS),
        max_tokens: parent
            .max_tokens
            .map(|max| max.saturating_sub(used.total_tokens()).max(1)),
        max_cost_usd: parent
            .max_cost_usd
            .map(|max| (max - used.cost_usd).max(f64::MIN_POSITIVE)),
        max_wall_time_ms: parent
            .max_wall_time_ms
            .map(|max| max.saturating_sub(worked_ms).max(1)),
        ..parent.clone()
    }
}

impl Runtime {
    /// The sub-agents a paused run waits on: its calls in doubt answered by child runs
    /// that wait for a person's approval, each with the child's run id and how it stands.
    pub(super) async fn waiting_children(
        &self,
        run_id: &str,
        outcome: &agent_core::Outcome,
    ) -> Vec<(agent_core::PendingCall, String, agent_core::Outcome)> {
        if outcome.reason != TerminalReason::OutcomeUnknown {
            return Vec::new();
        }
        let Ok(log) = self.load_log(run_id).await else {
            return Vec::new();
        };
        let Ok(state) = agent_core::RunState::fold(&log) else {
            return Vec::new();
        };
        let mut waiting = Vec::new();
        for pending in &outcome.pending {
            if !is_delegate(&pending.tool) {
                return Vec::new();
            }
            let child = sub_agent_run_id(run_id, state.turn, &pending.call_id);
            match self.standing_as_logged(&child).await {
                Ok(Some(report)) if report.outcome.reason == TerminalReason::ApprovalRequired => {
                    waiting.push((pending.clone(), child, report.outcome));
                }
                _ => return Vec::new(),
            }
        }
        waiting
    }

    /// A paused run whose calls in doubt are all sub-agents waiting for approval is shown
    /// as waiting for approval of the children's calls.
    pub(super) async fn surface_children(&self, mut report: Report) -> Report {
        let waiting = self.waiting_children(&report.run_id, &report.outcome).await;
        if waiting.is_empty() {
            return report;
        }
        let mut pending = Vec::new();
        let mut names = Vec::new();
        for (call, child, outcome) in waiting {
            names.push(format!("{} (run {child})", call.call_id));
            for mut p in outcome.pending {
                p.why = format!("sub-agent of call {}: {}", call.call_id, p.why);
                pending.push(p);
            }
        }
        report.outcome = agent_core::Outcome {
            pending,
            ..agent_core::Outcome::stop(
                TerminalReason::ApprovalRequired,
                format!(
                    "the sub-agent of call {} needs a person's approval",
                    names.join(", ")
                ),
            )
        };
        report
    }

    /// Answers the approvals a paused run's sub-agents wait for (all their pending calls
    /// when `call_ids` is empty), then continues the run: each call in doubt runs again and
    /// continues its child. `None` when the run waits on no such child.
    pub(super) async fn settle_children(
        &self,
        run_id: &str,
        call_ids: &[CallId],
        denial: Option<&str>,
        cancel: CancellationToken,
    ) -> Result<Option<Report>, RuntimeError> {
        let Some(mut in_doubt) = self.answer_children(run_id, call_ids, denial).await? else {
            return Ok(None);
        };
        // The last call in doubt runs again as the run goes on; the others are marked first.
        let last = in_doubt.pop();
        self.retry_calls(run_id, in_doubt).await?;
        match last {
            Some(call_id) => Ok(Some(
                self.resolve(run_id, call_id, agent_core::Resolution::Retry, cancel)
                    .await?,
            )),
            None => Ok(None),
        }
    }

    /// As [`Runtime::settle_children`], without continuing the run: the answers are
    /// recorded in the children, and each of the run's calls in doubt marked to run again,
    /// for a run something else drives on (a worker of the queue). `false` when the run
    /// waits on no such child.
    pub(super) async fn record_children_answers(
        &self,
        run_id: &str,
        call_ids: &[CallId],
        denial: Option<&str>,
    ) -> Result<bool, RuntimeError> {
        let Some(in_doubt) = self.answer_children(run_id, call_ids, denial).await? else {
            return Ok(false);
        };
        self.retry_calls(run_id, in_doubt).await?;
        Ok(true)
    }

    /// Records `run_id`'s calls `call_ids` as to run again (a person's word, not a retry of
    /// the model's): each finds its child where the answer left it.
    async fn retry_calls(&self, run_id: &str, call_ids: Vec<CallId>) -> Result<(), RuntimeError> {
        for call_id in call_ids {
            let input = agent_core::Input::Resolved {
                call_id,
                resolution: agent_core::Resolution::Retry,
            };
            self.record_answer_here(run_id, input).await?;
        }
        Ok(())
    }

    /// After the sub-agent run `child_id` ended, driven by its own id rather than through
    /// its parent (a person resumed, answered or cancelled it): the call of its parent that
    /// waits in doubt on it is marked to run again, which reads the child's end, so the
    /// parent goes on with that answer when it is next driven, as a parent driven meanwhile
    /// does; no person has a call left to settle. A parent that does not wait on it is left
    /// as it is, and so is one that cannot be written now (a person settles its call).
    pub(super) async fn release_parent(&self, child_id: &str) {
        if let Err(e) = self.try_release_parent(child_id).await {
            tracing::warn!(run_id = child_id, error = %e, "the parent waiting on this sub-agent was not released");
        }
    }

    async fn try_release_parent(&self, child_id: &str) -> Result<(), RuntimeError> {
        let Some(parent) = agent_core::parent_run_id(child_id) else {
            return Ok(());
        };
        let (machine, _) = self.load(parent).await?;
        match machine.state().call_waiting_on(child_id) {
            Some(call) => self.retry_calls(parent, vec![call.call_id.clone()]).await,
            None => Ok(()),
        }
    }

    /// Records the answers to the approvals a paused run's sub-agents wait for (all their
    /// pending calls when `call_ids` is empty) in the children; the run's calls in doubt
    /// that wait on them. `None` when the run waits on no such child.
    async fn answer_children(
        &self,
        run_id: &str,
        call_ids: &[CallId],
        denial: Option<&str>,
    ) -> Result<Option<Vec<CallId>>, RuntimeError> {
        let Some(standing) = self.standing_as_logged(run_id).await? else {
            return Ok(None);
        };
        let waiting = self.waiting_children(run_id, &standing.outcome).await;
        if waiting.is_empty() {
            return Ok(None);
        }
        let known: Vec<&CallId> = waiting
            .iter()
            .flat_map(|(_, _, o)| o.pending.iter().map(|p| &p.call_id))
            .collect();
        if let Some(unknown) = call_ids.iter().find(|id| !known.contains(id)) {
            let list: Vec<String> = known.iter().map(ToString::to_string).collect();
            return Err(RuntimeError::Refused(format!(
                "call {unknown} is not pending in run {run_id}; pending: {}",
                list.join(", ")
            )));
        }
        for (_, child, outcome) in &waiting {
            let ids: Vec<CallId> = outcome
                .pending
                .iter()
                .map(|p| p.call_id.clone())
                .filter(|id| call_ids.is_empty() || call_ids.contains(id))
                .collect();
            if ids.is_empty() {
                continue;
            }
            let input = match denial {
                None => agent_core::Input::ApprovalGranted { call_ids: ids },
                Some(reason) => agent_core::Input::ApprovalDenied {
                    call_ids: ids,
                    reason: reason.to_owned(),
                },
            };
            self.record_answer_here(child, input).await?;
        }
        Ok(Some(
            waiting
                .into_iter()
                .map(|(call, _, _)| call.call_id)
                .collect(),
        ))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use agent_core::Usage;
    use agent_providers::{Model, ScriptModel};
    use tokio_util::sync::CancellationToken;

    use super::{Guarded, Spend};

    /// A child's model is its parent's, guarded: what the parent's model says of itself
    /// (its cost known, its prompts' counts whole or not) holds for the child's.
    #[test]
    fn a_guarded_model_says_of_itself_what_the_model_inside_does() {
        struct Partial(ScriptModel);
        #[async_trait::async_trait]
        impl Model for Partial {
            fn provider(&self) -> &str {
                self.0.provider()
            }
            fn model(&self) -> &str {
                self.0.model()
            }
            fn counts_whole_prompts(&self) -> bool {
                false
            }
            async fn decide(
                &self,
                request: agent_providers::ModelRequest<'_>,
            ) -> Result<agent_core::ModelReply, agent_providers::ProviderError> {
                self.0.decide(request).await
            }
        }
        let guarded = |inner: Arc<dyn Model>| Guarded {
            inner,
            spend: Arc::new(Spend {
                used: Mutex::new(Usage::default()),
                max_tokens: None,
                max_cost_usd: None,
            }),
            stop: CancellationToken::new(),
        };
        let script = || ScriptModel::from_json(r#"{"turns": []}"#).unwrap();
        assert!(guarded(Arc::new(script())).counts_whole_prompts());
        assert!(!guarded(Arc::new(Partial(script()))).counts_whole_prompts());
    }
}
