//! `delegate` and `delegate_read`: a sub-task handed to a sub-agent, a fresh run with its
//! own log, context and budgets. The gateway checks their calls like any other (schema,
//! policy, hooks); the runtime's driver carries them out, since only it can drive a run.

use agent_core::{ErrorKind, Risk, ToolError, ToolSpec};
use async_trait::async_trait;
use serde_json::{Value, json};

use crate::tool::{Tool, ToolContext};

/// The sub-agent that may use the run's tools (a subset, when `tools` names them): a
/// `write` call, asked about unless allowed.
pub const DELEGATE: &str = "delegate";
/// The sub-agent that may only read: a `read` call, run beside other reads.
pub const DELEGATE_READ: &str = "delegate_read";

/// Whether `name` is one of the sub-agent tools.
pub fn is_delegate(name: &str) -> bool {
    name == DELEGATE || name == DELEGATE_READ
}

/// The specs of a sub-agent tool; `call` refuses, as these run only under a runtime.
#[derive(Clone, Copy, Debug)]
pub struct Delegate {
    /// `delegate_read` when true.
    pub read_only: bool,
}

impl Delegate {
    /// Both sub-agent tools.
    pub fn both() -> [Delegate; 2] {
        [Delegate { read_only: false }, Delegate { read_only: true }]
    }
}

#[async_trait]
impl Tool for Delegate {
    fn spec(&self) -> ToolSpec {
        let mut properties = json!({
            "goal": {"type": "string", "minLength": 1,
                     "description": "the sub-task, said whole: the sub-agent sees nothing else"},
            "max_steps": {"type": "integer", "minimum": 1, "maximum": 64,
                          "description": "model calls the sub-agent may make (default 16)"},
        });
        let (name, description, risk) = if self.read_only {
            (
                DELEGATE_READ,
                "Hand a sub-task that only reads (search, read, summarize) to a sub-agent with \
                 a fresh context; its final answer is this call's result. Several run at once.",
                Risk::Read,
            )
        } else {
            properties["tools"] = json!({"type": "array", "items": {"type": "string"},
                "description": "the only tools it may use (default: all of yours)"});
            (
                DELEGATE,
                "Hand a sub-task to a sub-agent with a fresh context and your tools (or those \
                 named); its final answer is this call's result.",
                Risk::Write,
            )
        };
        let schema = json!({
            "type": "object",
            "required": ["goal"],
            "properties": properties,
            "additionalProperties": false,
        });
        let mut spec = ToolSpec::new(name, description, schema, risk);
        // A sub-agent's time is bounded by its own budgets and the run's.
        spec.timeout_ms = 24 * 60 * 60 * 1000;
        spec
    }

    async fn call(&self, _: Value, _: &ToolContext) -> Result<String, ToolError> {
        Err(ToolError::new(
            ErrorKind::ExecutionFailed,
            "a sub-agent runs only under agent-runtime's driver",
        ))
    }
}
