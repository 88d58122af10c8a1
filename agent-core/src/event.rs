//! The event log's entries: intents (what the model proposed) and facts (what happened).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::budget::{Budget, Usage};
use crate::decision::{CallId, Decision, Reasoning};
use crate::reason::{Outcome, PendingCall};
use crate::tool::ToolResult;

/// What a tool found when it looked an effect up after a restart.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Finding {
    /// The effect is there; the receipt says how the tool knows.
    Applied {
        /// The tool's receipt.
        receipt: String,
    },
    /// The effect is not there: running the call is safe.
    NotApplied,
}

/// A person's word on a call whose outcome was unknown (`agent resolve --as`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Resolution {
    /// It took effect.
    Committed,
    /// It did not take effect; do not run it again.
    Rejected,
    /// It did not take effect; run it again.
    Retry,
}

impl std::str::FromStr for Resolution {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "committed" => Ok(Resolution::Committed),
            "rejected" => Ok(Resolution::Rejected),
            "retry" => Ok(Resolution::Retry),
            other => Err(format!(
                "{other:?} is not a resolution; use committed, rejected or retry"
            )),
        }
    }
}

/// The versions that shaped a run, recorded at its start (CONTRACT §7).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    /// Version of the runtime that started the run.
    pub runtime_version: String,
    /// Provider name (`script`, `openai`, ...).
    pub provider: String,
    /// Model name as given to the provider.
    pub model: String,
    /// SHA-256 of the system prompt.
    pub system_prompt_digest: String,
    /// SHA-256 of the canonical JSON of the tool specs.
    pub tool_schema_digest: String,
    /// The run's budgets.
    pub budget: Budget,
    /// The tools offered at the start, whole: `agent context` rebuilds the prompt from
    /// them without starting any server.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tools: Vec<crate::tool::ToolSpec>,
    /// What a final answer must pass before it counts (CONTRACT §2); `None`: any
    /// non-empty answer completes the run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub answer: Option<Box<AnswerSpec>>,
    /// The run this one was forked from, when it was (`agent fork`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forked_from: Option<Box<ForkOrigin>>,
    /// The run and call that started this one, for a sub-agent's run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<Box<ParentCall>>,
    /// The directory its tools act in, as the process that started it had it (absolute),
    /// when the runtime knows one: a process that takes the run up elsewhere works there
    /// too unless told otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workspace: Option<String>,
    /// The sandbox its commands run in, when they do (`agent run --sandbox`): a process
    /// that takes the run up keeps them in it unless told otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<Box<SandboxRecord>>,
}

/// The sandbox a run's commands run in, as its manifest records it: what they may do
/// beyond reading and writing in the workspace.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SandboxRecord {
    /// Whether they may reach the network.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub network: bool,
    /// Whether they may not write in the workspace either.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub read_only: bool,
    /// The directories beyond the workspace where they may write (absolute).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub write: Vec<String>,
    /// The places they do not see beyond a home directory's credentials (absolute).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hide: Vec<String>,
    /// The places where a home directory's credentials are left visible (absolute).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub show: Vec<String>,
}

/// The call of another run that a sub-agent's run answers.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ParentCall {
    /// The parent run.
    pub run_id: String,
    /// The parent's model call that proposed the call.
    pub turn: u32,
    /// The call.
    pub call_id: CallId,
}

/// Where a forked run came from: its log began as a copy of this run's, up to this point.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ForkOrigin {
    /// The run forked.
    pub run_id: String,
    /// The last version of that run's log the fork inherited.
    pub version: u64,
    /// The model call the fork makes first (its prefix is what came before that call).
    pub at: u32,
    /// When the fork was made (ms since the epoch): its wall-clock budget counts from then,
    /// and it is the fork's start as runs are listed (its first events keep the parent's
    /// times). `None` in a fork made before this was recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub made_at_ms: Option<u64>,
}

/// The validators of a run's final answer, recorded at its start so that every
/// invocation of the run (resume, approve, a follow-up) judges answers the same way.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct AnswerSpec {
    /// A JSON Schema the answer, read as JSON, must be valid against.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schema: Option<serde_json::Value>,
    /// Commands run in the workspace with the answer on stdin; exit 0 accepts.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub checks: Vec<String>,
}

impl AnswerSpec {
    /// Whether it validates nothing.
    pub fn is_empty(&self) -> bool {
        self.schema.is_none() && self.checks.is_empty()
    }
}

/// One entry of a run's log: its version (1-based, contiguous), the time it was made and
/// the event.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Entry {
    /// The state version this entry advances the run to.
    pub version: u64,
    /// Milliseconds since the Unix epoch, as given by the runtime's clock.
    pub at_ms: u64,
    /// What happened.
    #[serde(flatten)]
    pub event: Event,
}

/// A typed log event. Past-tense names; facts are what resume trusts.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Event {
    /// Fact: the run was created.
    RunStarted {
        /// The run id.
        run_id: String,
        /// The goal as the user gave it.
        goal: String,
        /// What shaped the run.
        manifest: Manifest,
    },
    /// Intent: the model proposed this decision (it passed the structural checks).
    DecisionProposed {
        /// The model call this came from (1-based).
        turn: u32,
        /// The decision.
        decision: Decision,
        /// What the call used.
        usage: Usage,
        /// What the model thought before it decided (kept to send back, never acted on).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        reasoning: Vec<Reasoning>,
    },
    /// Fact: the model's reply was not a valid decision.
    DecisionRejected {
        /// The model call (1-based).
        turn: u32,
        /// What the model said.
        raw: String,
        /// Why it is invalid, as shown to the model.
        problem: String,
        /// What the call used.
        usage: Usage,
    },
    /// Fact: a model call attempt failed and was retried.
    ModelRetried {
        /// The model call (1-based).
        turn: u32,
        /// The attempt and why it failed.
        retry: crate::decision::Retry,
    },
    /// Fact: the provider failed past its retry budget.
    ModelFailed {
        /// The model call (1-based).
        turn: u32,
        /// The provider's error.
        message: String,
        /// Its class (`other` in logs written before kinds were recorded).
        #[serde(default)]
        kind: crate::decision::ModelErrorKind,
        /// What its last attempt may have cost, estimated: one the provider accepted (its
        /// prompt read) before it failed. It counts toward the run's budgets.
        #[serde(default, skip_serializing_if = "Usage::is_zero")]
        usage: Usage,
    },
    /// Fact: a proposed call was refused before running (unknown tool, invalid arguments,
    /// denied); the result is what the model sees.
    CallRejected {
        /// The turn that proposed it.
        turn: u32,
        /// The error result.
        result: ToolResult,
    },
    /// Fact: the same plan came again; it was not run and the model was told so.
    CorrectionIssued {
        /// The turn whose batch was not run.
        turn: u32,
        /// The batch fingerprint.
        fingerprint: String,
        /// The message the model gets.
        message: String,
        /// The calls that were not run.
        call_ids: Vec<CallId>,
    },
    /// Fact: the run waits for a person before these calls can run.
    ApprovalRequested {
        /// The turn that proposed them.
        turn: u32,
        /// The model's own summary, when it asked itself.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        summary: Option<String>,
        /// The calls waiting.
        pending: Vec<PendingCall>,
        /// Calls of the same batch already allowed; they run with the approved ones.
        allowed: Vec<CallId>,
        /// For allowed calls that act on a path: where it led when they were checked. They
        /// act on that place or not at all (the pending calls hold their own).
        #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
        allowed_paths: BTreeMap<CallId, String>,
    },
    /// Fact: a person approved these calls (all pending ones when the request had no calls).
    ApprovalGranted {
        /// The approved calls.
        call_ids: Vec<CallId>,
    },
    /// Fact: a person denied these calls.
    ApprovalDenied {
        /// The denied calls.
        call_ids: Vec<CallId>,
        /// The person's reason, shown to the model.
        reason: String,
    },
    /// Fact: a `write`/`external` call is about to be dispatched. Committed before the call
    /// starts, so after a crash an effect without a result is known to be in doubt.
    EffectDispatched {
        /// The turn that proposed it.
        turn: u32,
        /// The call.
        call_id: CallId,
        /// The effect key (run id, turn, call id).
        effect_key: String,
        /// The tool.
        tool: String,
        /// SHA-256 of the canonical arguments.
        arguments_digest: String,
    },
    /// Fact: after a restart, the tool looked the effect up.
    EffectReconciled {
        /// The call.
        call_id: CallId,
        /// Whether the effect is there (`applied`) or not (`not_applied`).
        finding: Finding,
    },
    /// Fact: the outcome of these side effects is unknown; a person must settle them.
    ResolutionRequested {
        /// The turn that proposed them.
        turn: u32,
        /// The calls in doubt.
        pending: Vec<PendingCall>,
    },
    /// Fact: a person settled a call whose outcome was unknown.
    EffectResolved {
        /// The call.
        call_id: CallId,
        /// The person's word.
        resolution: Resolution,
    },
    /// Fact: the final answer of this turn (its `decision_proposed`) failed the run's
    /// validators; the model is told why and asked again. Counts as an invalid decision.
    AnswerRejected {
        /// The model call whose answer it was.
        turn: u32,
        /// What failed, as shown to the model.
        problem: String,
    },
    /// Fact: the sub-agent run a call started stopped; what it used counts toward this
    /// run's token and cost budgets (its result is the call's `tool_finished`).
    SubAgentFinished {
        /// The turn that proposed the call.
        turn: u32,
        /// The call.
        call_id: CallId,
        /// The sub-agent's run.
        run_id: String,
        /// What it used, all its model calls together.
        usage: Usage,
    },
    /// Fact: a call ran and this is its result.
    ToolFinished {
        /// The turn that proposed it.
        turn: u32,
        /// The result.
        result: ToolResult,
        /// The effect key, for `write`/`external` calls.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        effect_key: Option<String>,
    },
    /// Fact: the history up to `through_version` is replaced, in the prompt, by a summary.
    /// Replaying the log reproduces the same prompt.
    ContextCompacted {
        /// The summary (the prompt adds the fixed prefix and the facts block).
        summary: String,
        /// The last version the summary covers.
        through_version: u64,
        /// Estimated prompt tokens before.
        tokens_before: u64,
        /// Estimated prompt tokens after.
        tokens_after: u64,
        /// What the model calls that wrote the summary used (none for a summary made
        /// without a model); it counts toward the run's token and cost budgets.
        #[serde(default, skip_serializing_if = "Usage::is_zero")]
        usage: Usage,
        /// The model's window, in tokens, when the compaction was made because the
        /// provider refused a prompt as past it (a window smaller than the run took it to
        /// be): from this event on the prompt is kept within it, in every process.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        window: Option<u64>,
    },
    /// Fact: the history was summarized, but the summary would not have made the prompt
    /// smaller, so it was not used; none is tried again before the prompt grew by a tenth
    /// of the window. Its model calls were paid for all the same.
    CompactionDeclined {
        /// Estimated prompt tokens.
        tokens_before: u64,
        /// Estimated prompt tokens with the summary.
        tokens_after: u64,
        /// What the model calls that wrote the summary used.
        #[serde(default, skip_serializing_if = "Usage::is_zero")]
        usage: Usage,
    },
    /// Fact: a process took the run up again after none had driven it since the event
    /// before: the one that drove it crashed, was killed, or let it go (as a worker of the
    /// queue does when it loses its lease). The time in between is not worked time: the
    /// wall-clock budget counts again from here.
    RunResumed {},
    /// Fact: a person spoke to the run after its start: the answer to its clarifying
    /// question, or a follow-up after it ended. It opens a new *exchange*: step, tool-call,
    /// retry and repeat limits count again from here; tokens, cost and wall time count over
    /// the whole run. (The goal, in `run_started`, is the first user message.)
    UserMessage {
        /// What the person said.
        text: String,
        /// The run's budget from here on, when the person changed it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        budget: Option<crate::budget::Budget>,
    },
    /// Fact: a person spoke to the run while it ran (sent from elsewhere, `agent resume RUN
    /// MESSAGE` of a live run), read before its next model call. Unlike a `user_message`,
    /// it opens no new exchange: the run goes on under the same limits.
    UserNote {
        /// What the person said.
        text: String,
    },
    /// Fact: the run stopped with this outcome.
    RunEnded {
        /// The outcome.
        outcome: Outcome,
    },
}

impl Event {
    /// Adds to `total` what this event says the run's model calls used, as the run's
    /// budgets count it: decisions, rejected and failed calls, retried attempts that may be
    /// billed, summaries, and its sub-agents' calls. A sub-agent reports its whole usage so
    /// far, so only what `sub_agents` (each child's last report, kept here) had not counted
    /// counts. Whether the event says it used anything. For readers that total a log
    /// (`agent show`, a report, a store's run index); [`crate::RunState`] folds the same.
    pub fn count_usage(&self, total: &mut Usage, sub_agents: &mut BTreeMap<String, Usage>) -> bool {
        match self {
            Event::DecisionProposed { usage, .. }
            | Event::DecisionRejected { usage, .. }
            | Event::ModelFailed { usage, .. }
            | Event::ContextCompacted { usage, .. }
            | Event::CompactionDeclined { usage, .. } => total.add(usage),
            Event::ModelRetried { retry, .. } => total.add(&retry.usage),
            Event::SubAgentFinished { run_id, usage, .. } => {
                let counted = sub_agents
                    .insert(run_id.clone(), *usage)
                    .unwrap_or_default();
                total.add(&usage.since(&counted));
            }
            _ => return false,
        }
        true
    }

    /// The event's snake_case name, as in its JSON `type`.
    pub fn name(&self) -> &'static str {
        match self {
            Event::RunStarted { .. } => "run_started",
            Event::DecisionProposed { .. } => "decision_proposed",
            Event::DecisionRejected { .. } => "decision_rejected",
            Event::ModelRetried { .. } => "model_retried",
            Event::ModelFailed { .. } => "model_failed",
            Event::CallRejected { .. } => "call_rejected",
            Event::CorrectionIssued { .. } => "correction_issued",
            Event::ApprovalRequested { .. } => "approval_requested",
            Event::ApprovalGranted { .. } => "approval_granted",
            Event::ApprovalDenied { .. } => "approval_denied",
            Event::EffectDispatched { .. } => "effect_dispatched",
            Event::EffectReconciled { .. } => "effect_reconciled",
            Event::ResolutionRequested { .. } => "resolution_requested",
            Event::EffectResolved { .. } => "effect_resolved",
            Event::AnswerRejected { .. } => "answer_rejected",
            Event::SubAgentFinished { .. } => "sub_agent_finished",
            Event::ToolFinished { .. } => "tool_finished",
            Event::ContextCompacted { .. } => "context_compacted",
            Event::CompactionDeclined { .. } => "compaction_declined",
            Event::RunResumed {} => "run_resumed",
            Event::UserMessage { .. } => "user_message",
            Event::UserNote { .. } => "user_note",
            Event::RunEnded { .. } => "run_ended",
        }
    }

    /// Whether this records what the model proposed rather than what happened.
    pub fn is_intent(&self) -> bool {
        matches!(self, Event::DecisionProposed { .. })
    }
}
