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

/// A tool call's arguments in a prompt: the object's compact JSON text, which is what a
/// provider sends (OpenAI's dialects send it as a string; Anthropic's embeds it). A prompt
/// holds one per call until it is compacted, thousands in a long run, and a one-member
/// object as a [`Value`] takes a map node of some 640 bytes; as text it takes its length.
/// Serialized, it is the object again, as a [`Value`] would be.
#[derive(Clone, PartialEq, Eq)]
pub struct Arguments(Box<str>);

impl Arguments {
    /// The compact JSON text of `value` (keys in the order a [`Value`]'s map keeps them).
    pub fn new(value: &Value) -> Arguments {
        // `to_string` writes into a byte buffer; `Display` goes through the formatter.
        Arguments(
            serde_json::to_string(value)
                .unwrap_or_else(|_| value.to_string())
                .into_boxed_str(),
        )
    }

    /// The JSON text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The arguments as a value again.
    pub fn to_value(&self) -> Value {
        // The text was written from a value: it reads back.
        serde_json::from_str(&self.0).unwrap_or(Value::Null)
    }
}

impl From<&Value> for Arguments {
    fn from(value: &Value) -> Arguments {
        Arguments::new(value)
    }
}

impl From<Value> for Arguments {
    fn from(value: Value) -> Arguments {
        Arguments::new(&value)
    }
}

impl std::fmt::Display for Arguments {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::fmt::Debug for Arguments {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Arguments({})", self.0)
    }
}

impl Serialize for Arguments {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.to_value().serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for Arguments {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Arguments, D::Error> {
        Value::deserialize(deserializer).map(|value| Arguments::new(&value))
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
        /// The arguments object, as JSON text.
        arguments: Arguments,
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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn arguments_are_the_objects_text_and_serialize_as_the_object() {
        let value = json!({"path": "a \"b\" \u{e9}.txt", "n": [1, 2.5, null], "a": {}});
        let arguments = Arguments::new(&value);
        assert_eq!(arguments.as_str(), value.to_string());
        assert_eq!(arguments.to_string(), value.to_string());
        assert_eq!(arguments.to_value(), value);
        let part = Part::ToolUse {
            call_id: CallId::from("c1"),
            name: "read_file".to_owned(),
            arguments: arguments.clone(),
        };
        let text = serde_json::to_string(&part).unwrap();
        assert_eq!(
            serde_json::from_str::<Value>(&text).unwrap(),
            json!({"type": "tool_use", "call_id": "c1", "name": "read_file", "arguments": value})
        );
        assert!(
            text.ends_with(&format!(r#""arguments":{value}}}"#)),
            "{text}"
        );
        let back: Part = serde_json::from_str(&text).unwrap();
        assert_eq!(back, part);
        assert_ne!(Arguments::new(&json!({"path": "x"})), arguments);
    }
}
