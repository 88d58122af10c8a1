//! What the machine and its driver say to each other: the inputs it takes, the commands
//! it gives, the verdicts of the gateway, and why an input or a reply is refused.

use crate::budget::Usage;
use crate::decision::{CallId, ModelReply, ToolCall};
use crate::event::{Entry, Finding, Resolution};
use crate::reason::{Outcome, PendingCall};
use crate::schedule::ScheduledCall;
use crate::state::FoldError;
use crate::tool::ToolResult;

/// What the gateway says about one call (existence is checked by the machine itself).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Run it.
    Allow,
    /// Ask a person first.
    Ask {
        /// Why, for the person.
        why: String,
    },
    /// Refuse it; the model sees a `denied` error with the reason.
    Deny {
        /// Why, for the model.
        reason: String,
    },
    /// The arguments do not validate; the model sees an `invalid_arguments` error.
    Invalid {
        /// What is wrong, with the path inside the arguments.
        message: String,
    },
    /// The tool is gone (its server died and did not restart): the run stops with
    /// `tool_unavailable`.
    Unavailable {
        /// What happened to the tool.
        reason: String,
    },
}

/// Something that happened outside the machine.
#[derive(Clone, Debug, PartialEq)]
pub enum Input {
    /// The time is now `ms` milliseconds since the epoch.
    Tick(u64),
    /// The model answered the outstanding `CallModel`.
    ModelReplied(ModelReply),
    /// The provider failed past its retry budget.
    ModelFailed {
        /// The provider's error.
        message: String,
        /// Its class.
        kind: crate::decision::ModelErrorKind,
        /// The attempts that failed before the last one.
        retries: Vec<crate::decision::Retry>,
        /// What the last attempt may have cost (an estimate; nothing for one the provider
        /// refused or never answered).
        usage: Usage,
        /// The retries were stopped because another attempt could pass the run's token or
        /// cost budget: the run ends `cost_budget_exceeded`, the failure recorded.
        by_budget: bool,
    },
    /// The gateway's verdicts for the outstanding `CheckCalls`.
    CallsChecked {
        /// One verdict per call id; a call without one is denied (fail closed).
        verdicts: Vec<(CallId, Verdict)>,
        /// For calls that act on a path: where it led in the workspace when they were
        /// judged (relative to it). A call approved later acts on that place or not at all.
        paths: Vec<(CallId, String)>,
    },
    /// The outstanding `ExecuteTools` finished; results in any order.
    ToolsFinished {
        /// The results, correlated by call id.
        results: Vec<ToolResult>,
    },
    /// The run is let go before the outstanding `ExecuteTools` finished (a sub-agent let go
    /// at its own next step: `agent` asked to stop): the results that came are committed;
    /// a call without one stays dispatched and unanswered, as after a crash, for whoever
    /// takes the run up to reconcile or run. Once that commit is confirmed the machine
    /// stands as one loaded from the log would (it asks for what recovery asks).
    ToolsLetGo {
        /// The results that came, correlated by call id.
        results: Vec<ToolResult>,
    },
    /// The outstanding `Commit` is durable at this version.
    Committed {
        /// The version the store now holds.
        version: u64,
    },
    /// The outstanding `Commit` failed.
    CommitFailed {
        /// The store's error.
        message: String,
    },
    /// A person approved pending calls (all of them when `call_ids` is empty).
    ApprovalGranted {
        /// The approved calls.
        call_ids: Vec<CallId>,
    },
    /// A person denied pending calls (all of them when `call_ids` is empty).
    ApprovalDenied {
        /// The denied calls.
        call_ids: Vec<CallId>,
        /// Why, shown to the model.
        reason: String,
    },
    /// What the tools found for the outstanding `ReconcileEffects`; a call without a
    /// finding is unknown.
    EffectsReconciled {
        /// One finding per call id: `None` when the tool cannot tell.
        findings: Vec<(CallId, Option<Finding>)>,
    },
    /// A person settled a call whose outcome was unknown.
    Resolved {
        /// The call.
        call_id: CallId,
        /// The person's word.
        resolution: Resolution,
    },
    /// Before the outstanding `CallModel`: the runtime compacted the prompt; the machine
    /// commits the compaction, then asks for the model call again.
    ContextCompacted {
        /// The summary.
        summary: String,
        /// The last version it covers.
        through_version: u64,
        /// Estimated prompt tokens before.
        tokens_before: u64,
        /// Estimated prompt tokens after.
        tokens_after: u64,
        /// What the summary's model calls used.
        usage: Usage,
        /// The model's window, when the provider refused a prompt as past it.
        window: Option<u64>,
    },
    /// Before the outstanding `CallModel`: the runtime summarized the history, but the
    /// summary would not make the prompt smaller; the machine commits that (and what the
    /// summary used), then asks for the model call again.
    CompactionDeclined {
        /// Estimated prompt tokens.
        tokens_before: u64,
        /// Estimated prompt tokens with the summary.
        tokens_after: u64,
        /// What the summary's model calls used.
        usage: Usage,
    },
    /// Before `ToolsFinished`: calls of the outstanding `ExecuteTools` were answered by
    /// sub-agent runs, which used this much (it counts toward the run's budgets).
    SubAgentsFinished {
        /// Per call: the sub-agent's run and its usage.
        finished: Vec<(CallId, String, crate::budget::Usage)>,
    },
    /// Instead of the outstanding `CallModel`: a person's note to the running run (sent
    /// from elsewhere). The machine commits it, then asks for the model call again: the
    /// model reads it in that call's prompt. Not a step, and no new exchange.
    UserNote {
        /// What the person said.
        text: String,
    },
    /// The validators' word on the outstanding `CheckAnswer`.
    AnswerChecked {
        /// `None`: the answer passed; otherwise what failed, as the model will be told.
        rejection: Option<String>,
    },
    /// The caller cancelled the run.
    Cancel,
}

impl Input {
    pub(super) fn name(&self) -> &'static str {
        match self {
            Input::Tick(_) => "Tick",
            Input::ModelReplied(_) => "ModelReplied",
            Input::ModelFailed { .. } => "ModelFailed",
            Input::CallsChecked { .. } => "CallsChecked",
            Input::ToolsFinished { .. } => "ToolsFinished",
            Input::ToolsLetGo { .. } => "ToolsLetGo",
            Input::Committed { .. } => "Committed",
            Input::CommitFailed { .. } => "CommitFailed",
            Input::ApprovalGranted { .. } => "ApprovalGranted",
            Input::ApprovalDenied { .. } => "ApprovalDenied",
            Input::EffectsReconciled { .. } => "EffectsReconciled",
            Input::Resolved { .. } => "Resolved",
            Input::ContextCompacted { .. } => "ContextCompacted",
            Input::CompactionDeclined { .. } => "CompactionDeclined",
            Input::AnswerChecked { .. } => "AnswerChecked",
            Input::SubAgentsFinished { .. } => "SubAgentsFinished",
            Input::UserNote { .. } => "UserNote",
            Input::Cancel => "Cancel",
        }
    }
}

/// What the machine asks the runtime to do next.
#[derive(Clone, Debug, PartialEq)]
pub enum Command {
    /// Build the context from the committed log and ask the model for one decision.
    CallModel {
        /// The model call's number (1-based).
        turn: u32,
    },
    /// Validate these calls' arguments and ask policy and pre-call hooks about them.
    CheckCalls {
        /// The turn that proposed them.
        turn: u32,
        /// Calls to known tools, in the model's order.
        calls: Vec<ToolCall>,
    },
    /// Run this group; its calls may run concurrently. The next group comes only after
    /// its results.
    ExecuteTools {
        /// The turn that proposed them.
        turn: u32,
        /// The calls.
        group: Vec<ScheduledCall>,
    },
    /// After a restart: ask each tool whether these dispatched effects took place.
    ReconcileEffects {
        /// The turn they belong to.
        turn: u32,
        /// The calls in doubt.
        calls: Vec<ScheduledCall>,
    },
    /// Wait for a person to settle these calls of unknown outcome.
    AwaitResolution {
        /// The calls in doubt.
        pending: Vec<PendingCall>,
    },
    /// Append these entries atomically if the log is at `expected_version`, durably.
    Commit {
        /// The version the log must be at.
        expected_version: u64,
        /// The entries, versions `expected_version + 1 ..`.
        entries: Vec<Entry>,
    },
    /// Run the run's answer validators (its manifest's `answer`) on this final answer.
    CheckAnswer {
        /// The model call that gave it.
        turn: u32,
        /// The answer.
        answer: String,
    },
    /// Wait for a person to approve or deny these calls.
    AwaitApproval {
        /// The calls waiting (empty when the model asked about a plan without calls).
        pending: Vec<PendingCall>,
        /// The model's own summary, when it asked.
        summary: Option<String>,
    },
    /// The run has stopped with this outcome; nothing more will be asked.
    Finish(Outcome),
}

/// An input that does not fit where the machine is.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum InputError {
    /// The input answers a command that is not outstanding.
    #[error("{input} is not expected while the machine is {phase}")]
    Unexpected {
        /// The input's name.
        input: &'static str,
        /// The phase's name.
        phase: &'static str,
    },
    /// An approval or resolution names a call that is not pending.
    #[error("call {0} is not pending")]
    NotPending(CallId),
}

/// Why a person's message cannot be given to a run (CONTRACT §7).
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum ReplyError {
    /// The log does not fold.
    #[error(transparent)]
    Fold(#[from] FoldError),
    /// The message is empty.
    #[error("the message is empty")]
    Empty,
    /// The run waits for a person's approval of calls: that is answered by approving or
    /// denying them, not by a message.
    #[error("the run waits for approval of its pending calls")]
    AwaitingApproval,
    /// The run waits for a person to settle calls of unknown outcome.
    #[error("the run waits for calls of unknown outcome to be settled")]
    AwaitingResolution,
    /// The run has not ended (it was interrupted): it is resumed, not answered.
    #[error("the run has not ended; it was interrupted and is resumed without a message")]
    NotEnded,
}
