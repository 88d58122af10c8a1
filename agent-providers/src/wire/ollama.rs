//! Ollama's own API (`POST /api/chat`): messages much like Chat Completions' (a call's
//! arguments as an object, a result naming its tool), answered as newline-delimited JSON
//! objects, the last one with `"done": true` and the counts. Unlike its OpenAI-compatible
//! endpoint, it takes `options` (`num_ctx`, the window the model is loaded with, which
//! that endpoint leaves at the server's default and fills by dropping the start of the
//! prompt) and `think`.

use agent_core::{Part, Prompt, Reasoning, Role, Usage};
use serde_json::{Value, json};

use super::{Assembled, WireCall, wire_name};
use crate::ProviderError;

/// The window an Ollama model is loaded with when the run's settings name none: enough
/// for an agent's system text, tools and some turns (Ollama's own default, 4,096 tokens,
/// is not), and what 16 GB of memory hold for a model of 8 billion parameters (its
/// weights and about 5 GB of cache for the window).
pub const DEFAULT_WINDOW: usize = 32_768;

/// The field Ollama gives a thinking model's reasoning in, and takes it back in.
pub const THINKING: &str = "thinking";

/// The request body for `POST /api/chat`; the HTTP model adds `options` and `think`.
pub fn request_body(prompt: &Prompt, model: &str, stream: bool) -> Value {
    let mut messages = Vec::with_capacity(prompt.messages.len() + 1);
    if !prompt.system.is_empty() {
        messages.push(json!({"role": "system", "content": prompt.system}));
    }
    for message in &prompt.messages {
        match message.role {
            Role::Assistant => messages.push(assistant_message(message)),
            Role::User => {
                let mut texts = Vec::new();
                for part in &message.parts {
                    match part {
                        Part::ToolResult {
                            call_id,
                            name,
                            content,
                            ..
                        } => messages.push(json!({
                            "role": "tool",
                            "content": content,
                            "tool_name": wire_name(name),
                            "tool_call_id": call_id,
                        })),
                        Part::Text { text } => texts.push(text.as_str()),
                        Part::ToolUse { .. } | Part::Reasoning { .. } => {}
                    }
                }
                if !texts.is_empty() {
                    messages.push(json!({"role": "user", "content": texts.join("\n\n")}));
                }
            }
        }
    }
    // A prompt past the window is refused rather than cut from its start (the system text
    // and the goal first), which the run can then compact; and an answer that fills the
    // window stops there rather than pushing the prompt's start out to go on.
    let mut body = json!({
        "model": model,
        "messages": messages,
        "stream": stream,
        "truncate": false,
        "shift": false,
    });
    if !prompt.tools.is_empty() {
        // As Chat Completions takes them.
        body["tools"] = super::function_tools(&prompt.tools);
    }
    body
}

/// An assistant message: its text, its calls (arguments as an object), and, with calls,
/// what the model thought before them as Ollama gave it (`thinking`), which the templates
/// of thinking models (gpt-oss, Qwen) render for the turn under way.
fn assistant_message(message: &agent_core::Message) -> Value {
    let mut text = Vec::new();
    let mut calls = Vec::new();
    let mut thinking = String::new();
    for part in &message.parts {
        match part {
            Part::Text { text: t } => text.push(t.as_str()),
            Part::ToolUse {
                call_id,
                name,
                arguments,
            } => calls.push(json!({
                "type": "function",
                "id": call_id,
                "function": {
                    "name": wire_name(name),
                    "arguments": serde_json::from_str::<Value>(arguments.as_str())
                        .unwrap_or_else(|_| json!({})),
                },
            })),
            Part::Reasoning {
                reasoning: Reasoning::Content { field, text: t },
            } if field == THINKING => thinking.push_str(t),
            Part::Reasoning { .. } | Part::ToolResult { .. } => {}
        }
    }
    let mut m = json!({"role": "assistant", "content": text.join("\n")});
    if !calls.is_empty() {
        m["tool_calls"] = Value::Array(calls);
        if !thinking.is_empty() {
            m[THINKING] = Value::String(thinking);
        }
    }
    m
}

/// A whole (non-streamed) response: one object, as the last of a stream with all of it.
pub fn parse_response(body: &Value) -> Assembled {
    let mut stream = Stream::default();
    stream.take(body);
    stream.finish()
}

/// Assembles a streamed response object by object (one a line).
#[derive(Debug, Default)]
pub struct Stream {
    text: String,
    thinking: String,
    calls: Vec<WireCall>,
    truncated: bool,
    usage: Usage,
    done: bool,
    grown: u64,
}

impl Stream {
    /// Takes one line of the stream; returns the text it adds, if any, for live display.
    pub fn push(&mut self, line: &str) -> Result<Option<String>, ProviderError> {
        let line = line.trim();
        if line.is_empty() {
            return Ok(None);
        }
        let object: Value = serde_json::from_str(line)
            .map_err(|e| ProviderError::Decode(format!("a stream line is not JSON: {e}")))?;
        if let Some(error) = object.get("error") {
            let error = error
                .as_str()
                .map_or_else(|| error.to_string(), str::to_owned);
            let error: String = error.chars().take(300).collect();
            return Err(ProviderError::Server {
                message: format!("ollama reported an error mid-stream: {error}"),
                retry_after: None,
            });
        }
        Ok(self.take(&object))
    }

    /// What one object brings; the text it adds.
    fn take(&mut self, object: &Value) -> Option<String> {
        let message = &object["message"];
        let text = message["content"].as_str().filter(|t| !t.is_empty());
        if let Some(t) = text {
            self.text.push_str(t);
            self.grown += t.len() as u64;
        }
        if let Some(t) = message[THINKING].as_str() {
            self.thinking.push_str(t);
            self.grown += t.len() as u64;
        }
        // Ollama sends each call whole, once its parser has all of it.
        for call in message["tool_calls"].as_array().into_iter().flatten() {
            let function = &call["function"];
            let call = WireCall {
                id: call["id"].as_str().unwrap_or_default().to_owned(),
                name: function["name"].as_str().unwrap_or_default().to_owned(),
                arguments: match &function["arguments"] {
                    Value::String(s) => s.clone(),
                    Value::Null => String::new(),
                    other => other.to_string(),
                },
                extra: None,
            };
            self.grown += (call.name.len() + call.arguments.len()) as u64;
            self.calls.push(call);
        }
        if object["done"] == true {
            self.done = true;
            self.truncated = object["done_reason"] == "length";
            let count = |field: &str| object[field].as_u64().unwrap_or(0);
            self.usage = Usage::tokens(count("prompt_eval_count"), count("eval_count"));
        }
        text.map(str::to_owned)
    }

    /// Whether the last object (`"done": true`) came.
    pub fn is_done(&self) -> bool {
        self.done
    }

    /// Bytes the answer's pieces have brought so far (text, thinking, calls): an object
    /// that brings none shows the server is there, not that the answer moves.
    pub fn grown(&self) -> u64 {
        self.grown
    }

    /// What came, as one reply.
    pub fn finish(self) -> Assembled {
        let reasoning = if self.thinking.is_empty() {
            Vec::new()
        } else {
            vec![Reasoning::Content {
                field: THINKING.to_owned(),
                text: self.thinking,
            }]
        };
        Assembled {
            text: self.text,
            refusal: None,
            calls: self.calls,
            truncated: self.truncated,
            usage: self.usage,
            reasoning,
        }
    }
}
