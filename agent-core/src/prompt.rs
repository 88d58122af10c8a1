//! Provider-neutral prompt types, shared by the context projection and the providers.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::decision::{CallId, Reasoning};
use crate::tool::ToolSpec;

/// Everything a model is sent for one call.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Prompt {
    /// The system text.
    pub system: String,
    /// The conversation, oldest first.
    pub messages: Vec<Message>,
    /// The tools the model may call.
    pub tools: Vec<ToolSpec>,
    /// The JSON Schema the final answer must be valid against, when the run has one:
    /// providers that support structured output ask for it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub answer_schema: Option<Value>,
}

/// Who speaks a message.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// The person and the runtime (goal, tool results, corrections).
    User,
    /// The model.
    Assistant,
}

/// One message, made of parts.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Message {
    /// The speaker.
    pub role: Role,
    /// Text, tool uses and tool results, in order.
    pub parts: Vec<Part>,
}

impl Message {
    /// A user message of one text part.
    pub fn user_text(text: impl Into<String>) -> Self {
        Message {
            role: Role::User,
            parts: vec![Part::Text { text: text.into() }],
        }
    }

    /// An assistant message of one text part.
    pub fn assistant_text(text: impl Into<String>) -> Self {
        Message {
            role: Role::Assistant,
            parts: vec![Part::Text { text: text.into() }],
        }
    }
}

/// A piece of a message.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Part {
    /// Plain text.
    Text {
        /// The text.
        text: String,
    },
    /// The model calling a tool.
    ToolUse {
        /// The call's id.
        call_id: CallId,
        /// The tool's name.
        name: String,
        /// The arguments object.
        arguments: Value,
    },
    /// The result of a call, paired with its `ToolUse` by id.
    ToolResult {
        /// The call it answers.
        call_id: CallId,
        /// The tool's name.
        name: String,
        /// `false` for any error.
        ok: bool,
        /// Output, or `kind: message` for an error.
        content: String,
    },
    /// What the model thought before the parts after it, sent back to the provider that
    /// gave it (others leave it out).
    Reasoning {
        /// As the provider gave it.
        reasoning: Reasoning,
    },
}
