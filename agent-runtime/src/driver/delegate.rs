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

use agent_core::{
    Budget, CallId, ErrorKind, Event, Machine, ModelReply, ParentCall, Risk, ScheduledCall,
    TerminalReason, ToolCall, ToolError, ToolResult, Usage, sha256_hex,
};
use agent_providers::{Model, ModelRequest, ProviderError};
use agent_tools::builtin::{DELEGATE_READ, is_delegate};
use tokio_util::sync::CancellationToken;

use super::{Report, RunRequest, Runtime, RuntimeError};

/// Model calls a sub-agent may make unless its call says.
pub const DEFAULT_SUB_AGENT_STEPS: u32 = 16;

/// The run id of the sub-agent that answers `call_id` of `parent`'s model call `turn`.
pub fn sub_agent_run_id(parent: &str, turn: u32, call_id: &CallId) -> String {
    let digest = sha256_hex(format!("{turn}/{call_id}").as_bytes());
    format!("{parent}.{}", &digest[..12])
}

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
/// goes through a box.
type Driving<'a> = Pin<Box<dyn Future<Output = Result<Report, RuntimeError>> + Send + 'a>>;

impl Runtime {
    /// Whether this runtime carries out `call` itself, as a sub-agent.
    pub(super) fn is_sub_agent_call(call: &ToolCall) -> bool {
        is_delegate(&call.name)
    }

    /// A runtime for a child: the same store, gateway, clock and context settings, the
    /// guarded model, only `tools`, no event sink and no answer validators of its own.
    fn child(&self, model: Arc<dyn Model>, tools: BTreeSet<String>, parent: ParentCall) -> Runtime {
        Runtime {
            model,
            gateway: Arc::clone(&self.gateway),
            store: Arc::clone(&self.store),
            clock: Arc::clone(&self.clock),
            context: self.context.clone(),
            counter: Arc::clone(&self.counter),
            summarizer: Arc::clone(&self.summarizer),
            sink: None,
            redactor: self.redactor.clone(),
            has_model: true,
            inline_store: self.inline_store,
            answer: None,
            check_dir: self.check_dir.clone(),
            check_timeout: self.check_timeout,
            only_tools: Some(tools),
            parent: Some(parent),
        }
    }

    /// Runs the sub-agent calls of a group at once. Each gets a result (the child's answer,
    /// or why it stopped) and, when a child ran, its run id and usage.
    pub(super) async fn run_sub_agents(
        &self,
        run_id: &str,
        turn: u32,
        machine: &Machine,
        calls: Vec<ScheduledCall>,
        cancel: &CancellationToken,
    ) -> (Vec<ToolResult>, Vec<(CallId, String, Usage)>) {
        let budget = machine.budget();
        let spend = Arc::new(Spend {
            used: Mutex::new(machine.state().usage),
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
        for (result, child) in futures::future::join_all(runs).await {
            results.push(result);
            finished.extend(child);
        }
        (results, finished)
    }

    async fn run_sub_agent(
        &self,
        run_id: &str,
        turn: u32,
        machine: &Machine,
        call: ToolCall,
        spend: Arc<Spend>,
        cancel: &CancellationToken,
    ) -> (ToolResult, Option<(CallId, String, Usage)>) {
        let fail = |kind: ErrorKind, message: String| {
            ToolResult::error(
                call.id.clone(),
                call.name.clone(),
                ToolError::new(kind, message),
            )
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
        let child = self.child(model, tools, parent);
        let state = machine.state();
        let worked = state.worked_by(self.clock.now_ms());
        let budget = sub_agent_budget(machine.budget(), &state.usage, worked, args.max_steps);
        let report = match child
            .sub_agent_report(&child_id, &args.goal, budget, stop)
            .await
        {
            Ok(report) => report,
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
        let usage = report.state.usage;
        let outcome = &report.outcome;
        let result = match (&outcome.answer, outcome.reason) {
            (Some(answer), TerminalReason::Completed) => {
                ToolResult::ok(call.id.clone(), call.name.clone(), answer.clone())
            }
            (_, reason) => {
                let kind = if reason == TerminalReason::Cancelled {
                    ErrorKind::Cancelled
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
                return self.start(request, cancel).await;
            }
            if let Some(Event::RunEnded { .. }) = log.last().map(|e| &e.event)
                && let Some(report) = self.standing(child_id).await?
            {
                return Ok(report);
            }
            self.resume(child_id, cancel).await
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
