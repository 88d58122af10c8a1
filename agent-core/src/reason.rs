//! Terminal reasons (CONTRACT §3) and the outcome of an invocation.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::decision::CallId;

/// Why an invocation stopped. Exactly one per stop; never collapsed into a boolean.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TerminalReason {
    /// A `final` decision passed validation and was committed.
    Completed,
    /// A call needs a person's approval.
    ApprovalRequired,
    /// The model asked a question only a person can answer.
    ClarificationRequired,
    /// After a crash, a side effect's result is unknown.
    OutcomeUnknown,
    /// The caller cancelled.
    Cancelled,
    /// The wall-clock budget is spent.
    DeadlineExceeded,
    /// The model-call budget is spent.
    MaxSteps,
    /// The tool-call budget, or a tool's retry budget, is spent.
    ToolBudgetExhausted,
    /// The token or money budget is spent.
    CostBudgetExceeded,
    /// The same plan repeated after a correction.
    NoProgress,
    /// Calls were denied until the denial limit was reached.
    PolicyViolation,
    /// The model kept breaking the protocol past the repair limit.
    InvalidDecision,
    /// The model said it cannot continue.
    CannotContinue,
    /// The model provider failed past its retry budget.
    ModelError,
    /// A tool the run needs is gone.
    ToolUnavailable,
    /// The event log could not be committed.
    CheckpointFailed,
}

/// The class of a terminal reason: whether the run can go on later.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReasonClass {
    /// The goal was reached.
    Finished,
    /// Waiting for a person; can be resumed.
    Paused,
    /// A budget, policy or the caller stopped it.
    Stopped,
    /// Something broke.
    Failed,
}

impl ReasonClass {
    /// The contract's word (`finished`, `paused`, `stopped`, `failed`).
    pub fn as_str(self) -> &'static str {
        match self {
            ReasonClass::Finished => "finished",
            ReasonClass::Paused => "paused",
            ReasonClass::Stopped => "stopped",
            ReasonClass::Failed => "failed",
        }
    }
}

impl TerminalReason {
    /// Every reason, in the contract's order.
    pub const ALL: [TerminalReason; 16] = [
        TerminalReason::Completed,
        TerminalReason::ApprovalRequired,
        TerminalReason::ClarificationRequired,
        TerminalReason::OutcomeUnknown,
        TerminalReason::Cancelled,
        TerminalReason::DeadlineExceeded,
        TerminalReason::MaxSteps,
        TerminalReason::ToolBudgetExhausted,
        TerminalReason::CostBudgetExceeded,
        TerminalReason::NoProgress,
        TerminalReason::PolicyViolation,
        TerminalReason::InvalidDecision,
        TerminalReason::CannotContinue,
        TerminalReason::ModelError,
        TerminalReason::ToolUnavailable,
        TerminalReason::CheckpointFailed,
    ];

    /// The stable snake_case word of the contract.
    pub fn as_str(self) -> &'static str {
        use TerminalReason::*;
        match self {
            Completed => "completed",
            ApprovalRequired => "approval_required",
            ClarificationRequired => "clarification_required",
            OutcomeUnknown => "outcome_unknown",
            Cancelled => "cancelled",
            DeadlineExceeded => "deadline_exceeded",
            MaxSteps => "max_steps",
            ToolBudgetExhausted => "tool_budget_exhausted",
            CostBudgetExceeded => "cost_budget_exceeded",
            NoProgress => "no_progress",
            PolicyViolation => "policy_violation",
            InvalidDecision => "invalid_decision",
            CannotContinue => "cannot_continue",
            ModelError => "model_error",
            ToolUnavailable => "tool_unavailable",
            CheckpointFailed => "checkpoint_failed",
        }
    }

    /// Whether the run finished, paused, stopped or failed.
    pub fn class(self) -> ReasonClass {
        use TerminalReason::*;
        match self {
            Completed => ReasonClass::Finished,
            ApprovalRequired | ClarificationRequired | OutcomeUnknown => ReasonClass::Paused,
            Cancelled | DeadlineExceeded | MaxSteps | ToolBudgetExhausted | CostBudgetExceeded
            | NoProgress | PolicyViolation => ReasonClass::Stopped,
            InvalidDecision | CannotContinue | ModelError | ToolUnavailable | CheckpointFailed => {
                ReasonClass::Failed
            }
        }
    }
}

impl fmt::Display for TerminalReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A word that is not one of the contract's terminal reasons.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown terminal reason {0:?}")]
pub struct UnknownReason(pub String);

impl FromStr for TerminalReason {
    type Err = UnknownReason;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        TerminalReason::ALL
            .into_iter()
            .find(|r| r.as_str() == s)
            .ok_or_else(|| UnknownReason(s.to_owned()))
    }
}

/// A call waiting for a person's word.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PendingCall {
    /// The call's id.
    pub call_id: CallId,
    /// The tool it would run.
    pub tool: String,
    /// Its arguments.
    pub arguments: Value,
    /// Why it needs approval.
    pub why: String,
    /// For a tool that acts on a path: where the path led in the workspace when the call
    /// was checked (relative to the workspace). The call acts on that place or not at all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
}

/// How an invocation ended: the reason, the answer for `completed`, and words for a person.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Outcome {
    /// The terminal reason.
    pub reason: TerminalReason,
    /// The final answer; only for `completed`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub answer: Option<String>,
    /// What happened, in words the user can act on.
    pub message: String,
    /// For `approval_required`: the calls waiting.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pending: Vec<PendingCall>,
    /// For `model_error`: the class of the provider's failure.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_error: Option<crate::decision::ModelErrorKind>,
}

impl Outcome {
    /// An outcome other than `completed`.
    pub fn stop(reason: TerminalReason, message: impl Into<String>) -> Self {
        Outcome {
            reason,
            answer: None,
            message: message.into(),
            pending: Vec::new(),
            model_error: None,
        }
    }

    /// The `completed` outcome with its answer.
    pub fn completed(answer: impl Into<String>) -> Self {
        Outcome {
            reason: TerminalReason::Completed,
            answer: Some(answer.into()),
            message: "the model gave its final answer".to_owned(),
            pending: Vec::new(),
            model_error: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_round_trip_and_match_serde() {
        for reason in TerminalReason::ALL {
            assert_eq!(reason.as_str().parse::<TerminalReason>().unwrap(), reason);
            assert_eq!(serde_json::to_value(reason).unwrap(), reason.as_str());
        }
        assert!("done".parse::<TerminalReason>().is_err());
    }

    #[test]
    fn classes_match_the_contract_table() {
        let paused: Vec<_> = TerminalReason::ALL
            .into_iter()
            .filter(|r| r.class() == ReasonClass::Paused)
            .map(TerminalReason::as_str)
            .collect();
        assert_eq!(
            paused,
            [
                "approval_required",
                "clarification_required",
                "outcome_unknown"
            ]
        );
        let failed: Vec<_> = TerminalReason::ALL
            .into_iter()
            .filter(|r| r.class() == ReasonClass::Failed)
            .map(TerminalReason::as_str)
            .collect();
        assert_eq!(
            failed,
            [
                "invalid_decision",
                "cannot_continue",
                "model_error",
                "tool_unavailable",
                "checkpoint_failed"
            ]
        );
        assert_eq!(TerminalReason::Completed.class(), ReasonClass::Finished);
        assert_eq!(TerminalReason::NoProgress.class(), ReasonClass::Stopped);
    }
}
