//! Tool specs, results and the closed set of tool error kinds (CONTRACT §5).

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::decision::CallId;

/// Default per-call timeout (CONTRACT §4).
pub const DEFAULT_TOOL_TIMEOUT_MS: u64 = 120_000;
/// Default size limit of one tool result, in characters (CONTRACT §9).
pub const DEFAULT_RESULT_LIMIT: usize = 50_000;
/// Bytes of an oversized output shown in its place, before its handle (CONTRACT §9).
pub const PREVIEW_BYTES: usize = 2_000;

/// How much harm a tool can do, which decides default policy and scheduling.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Risk {
    /// Reads only; allowed by default and may run in parallel.
    Read,
    /// Changes the workspace; asks by default and runs alone.
    Write,
    /// Reaches outside the workspace (processes, network); asks by default and runs alone.
    External,
}

impl Risk {
    /// The contract's word for this risk.
    pub fn as_str(self) -> &'static str {
        match self {
            Risk::Read => "read",
            Risk::Write => "write",
            Risk::External => "external",
        }
    }
}

/// Everything a tool declares about itself.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ToolSpec {
    /// Name the model calls the tool by.
    pub name: String,
    /// What the tool does, for the model.
    pub description: String,
    /// JSON Schema of the arguments object.
    pub input_schema: Value,
    /// The tool's risk class.
    pub risk: Risk,
    /// Whether running the same call twice has the effect of running it once.
    pub idempotent: bool,
    /// Whether a non-`read` tool may still share a parallel group.
    #[serde(default)]
    pub concurrency_safe: bool,
    /// Per-call timeout in milliseconds.
    pub timeout_ms: u64,
    /// Largest result, in characters, shown to the model whole.
    pub result_limit: usize,
    /// The argument that `tool(pattern)` policy rules match (a path or a command).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub main_argument: Option<String>,
}

impl ToolSpec {
    /// A spec with the contract's defaults: idempotent only when `read`, 120 s, 50,000 chars.
    pub fn new(
        name: impl Into<String>,
        description: impl Into<String>,
        input_schema: Value,
        risk: Risk,
    ) -> Self {
        ToolSpec {
            name: name.into(),
            description: description.into(),
            input_schema,
            risk,
            idempotent: risk == Risk::Read,
            concurrency_safe: false,
            timeout_ms: DEFAULT_TOOL_TIMEOUT_MS,
            result_limit: DEFAULT_RESULT_LIMIT,
            main_argument: None,
        }
    }

    /// Whether calls of this tool may run beside other calls.
    pub fn runs_concurrently(&self) -> bool {
        self.risk == Risk::Read || self.concurrency_safe
    }

    /// Whether a call of this tool is a side effect the effect ledger tracks.
    pub fn has_side_effects(&self) -> bool {
        self.risk != Risk::Read
    }
}

/// The closed set of reasons a call can fail (CONTRACT §5).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    /// No tool of that name is registered.
    UnknownTool,
    /// The arguments do not validate against the tool's schema.
    InvalidArguments,
    /// Policy, a hook or a person refused the call.
    Denied,
    /// The call ran past its timeout.
    Timeout,
    /// The run was cancelled while the call ran.
    Cancelled,
    /// The tool ran and failed.
    ExecutionFailed,
    /// The call was dispatched but its result is unknown.
    OutcomeUnknown,
}

/// Per-kind defaults, kept in one table rather than scattered `match` arms.
struct KindInfo {
    #[cfg_attr(not(test), allow(dead_code))]
    kind: ErrorKind,
    name: &'static str,
    retryable: bool,
    hint: &'static str,
}

const KINDS: [KindInfo; 7] = [
    KindInfo {
        kind: ErrorKind::UnknownTool,
        name: "unknown_tool",
        retryable: false,
        hint: "no tool has that name; call one of the tools listed",
    },
    KindInfo {
        kind: ErrorKind::InvalidArguments,
        name: "invalid_arguments",
        retryable: false,
        hint: "the arguments do not match the tool's schema; fix them and call again",
    },
    KindInfo {
        kind: ErrorKind::Denied,
        name: "denied",
        retryable: false,
        hint: "the call was not allowed; do not repeat it, find another way",
    },
    KindInfo {
        kind: ErrorKind::Timeout,
        name: "timeout",
        retryable: true,
        hint: "the call took longer than its time limit",
    },
    KindInfo {
        kind: ErrorKind::Cancelled,
        name: "cancelled",
        retryable: false,
        hint: "the run was cancelled while the call ran",
    },
    KindInfo {
        kind: ErrorKind::ExecutionFailed,
        name: "execution_failed",
        retryable: false,
        hint: "the tool ran and failed",
    },
    KindInfo {
        kind: ErrorKind::OutcomeUnknown,
        name: "outcome_unknown",
        retryable: false,
        hint: "the call was started but whether it took effect is unknown",
    },
];

impl ErrorKind {
    fn info(self) -> &'static KindInfo {
        // The table lists every variant once; the index is the variant's position.
        &KINDS[self as usize]
    }

    /// The contract's word for this kind.
    pub fn as_str(self) -> &'static str {
        self.info().name
    }

    /// Whether trying the same call again may succeed.
    pub fn default_retryable(self) -> bool {
        self.info().retryable
    }

    /// A short sentence for the model when the tool gave no message of its own.
    pub fn default_hint(self) -> &'static str {
        self.info().hint
    }
}

impl std::fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A failed call, as data for the model.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolError {
    /// What kind of failure.
    pub kind: ErrorKind,
    /// What went wrong, in words the model can act on.
    pub message: String,
    /// Whether the same call may succeed if tried again.
    pub retryable: bool,
}

impl ToolError {
    /// An error with the kind's default retryability; an empty message takes the kind's hint.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        let message = message.into();
        let message = if message.is_empty() {
            kind.default_hint().to_owned()
        } else {
            message
        };
        ToolError {
            kind,
            message,
            retryable: kind.default_retryable(),
        }
    }
}

impl std::fmt::Display for ToolError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.kind, self.message)
    }
}

/// What one call produced: its output text, or an error.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolOutcome {
    /// The tool succeeded with this output.
    Output(String),
    /// The call failed.
    Error(ToolError),
}

/// The result of one call, always correlated by call id (never by position).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolResult {
    /// The call this result answers.
    pub call_id: CallId,
    /// The tool that was called.
    pub name: String,
    /// Output or error.
    #[serde(flatten)]
    pub outcome: ToolOutcome,
}

impl ToolResult {
    /// A successful result.
    pub fn ok(call_id: CallId, name: impl Into<String>, output: impl Into<String>) -> Self {
        ToolResult {
            call_id,
            name: name.into(),
            outcome: ToolOutcome::Output(output.into()),
        }
    }

    /// A failed result.
    pub fn error(call_id: CallId, name: impl Into<String>, error: ToolError) -> Self {
        ToolResult {
            call_id,
            name: name.into(),
            outcome: ToolOutcome::Error(error),
        }
    }

    /// Whether the call succeeded.
    pub fn is_ok(&self) -> bool {
        matches!(self.outcome, ToolOutcome::Output(_))
    }

    /// The error kind, when the call failed.
    pub fn error_kind(&self) -> Option<ErrorKind> {
        match &self.outcome {
            ToolOutcome::Output(_) => None,
            ToolOutcome::Error(e) => Some(e.kind),
        }
    }

    /// The text the model is shown: the output, or `kind: message`.
    pub fn content(&self) -> String {
        match &self.outcome {
            ToolOutcome::Output(text) => text.clone(),
            ToolOutcome::Error(e) => e.to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kind_table_is_in_variant_order() {
        let all = [
            ErrorKind::UnknownTool,
            ErrorKind::InvalidArguments,
            ErrorKind::Denied,
            ErrorKind::Timeout,
            ErrorKind::Cancelled,
            ErrorKind::ExecutionFailed,
            ErrorKind::OutcomeUnknown,
        ];
        for kind in all {
            assert_eq!(kind.info().kind, kind);
            let wire = serde_json::to_value(kind).unwrap();
            assert_eq!(wire, kind.as_str());
        }
    }

    #[test]
    fn result_serializes_in_the_contract_shape() {
        let r = ToolResult::error(
            CallId::from("c2"),
            "read_policy",
            ToolError::new(ErrorKind::Timeout, "took 120 s"),
        );
        let text = serde_json::to_string(&r).unwrap();
        assert_eq!(
            text,
            r#"{"call_id":"c2","name":"read_policy","error":{"kind":"timeout","message":"took 120 s","retryable":true}}"#
        );
        let back: ToolResult = serde_json::from_str(&text).unwrap();
        assert_eq!(back, r);
        let ok = ToolResult::ok(CallId::from("c1"), "read_file", "hello");
        let text = serde_json::to_string(&ok).unwrap();
        assert_eq!(
            text,
            r#"{"call_id":"c1","name":"read_file","output":"hello"}"#
        );
        assert_eq!(serde_json::from_str::<ToolResult>(&text).unwrap(), ok);
    }
}
