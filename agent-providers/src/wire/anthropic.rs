//! Anthropic Messages.

use std::collections::BTreeMap;

use agent_core::{Part, Prompt, Role, Usage, provider_schema};
use serde_json::{Value, json};

use super::{Assembled, WireCall, wire_name};
use crate::ProviderError;

/// Output tokens asked for when nothing else is configured.
pub const DEFAULT_MAX_TOKENS: u32 = 8_192;

/// The request body for `POST /v1/messages`.
pub fn request_body(prompt: &Prompt, model: &str, max_tokens: u32, stream: bool) -> Value {
    let messages: Vec<Value> = prompt
        .messages
        .iter()
        .map(|message| {
            let role = match message.role {
                Role::User => "user",
                Role::Assistant => "assistant",
            };
            // In a user message, tool results come first (the API requires it).
            let mut results = Vec::new();
            let mut others = Vec::new();
            for part in &message.parts {
                match part {
                    Part::Text { text } => others.push(json!({"type": "text", "text": text})),
                    Part::ToolUse {
                        call_id,
                        name,
                        arguments,
                    } => others.push(json!({"type": "tool_use", "id": call_id, "name": wire_name(name), "input": arguments})),
                    Part::ToolResult {
                        call_id,
                        ok,
                        content,
                        ..
                    } => results.push(json!({
                        "type": "tool_result",
                        "tool_use_id": call_id,
                        "content": content,
                        "is_error": !ok,
                    })),
                }
            }
            results.extend(others);
            json!({"role": role, "content": results})
        })
        .collect();
    let mut body = json!({
        "model": model,
        "max_tokens": max_tokens,
        "system": prompt.system,
        "messages": messages,
    });
    if !prompt.tools.is_empty() {
        body["tools"] = prompt
            .tools
            .iter()
            .map(|t| {
                json!({
                    "name": wire_name(&t.name),
                    "description": t.description,
                    "input_schema": provider_schema(&t.input_schema),
                })
            })
            .collect();
    }
    if stream {
        body["stream"] = Value::Bool(true);
    }
    body
}

/// A whole (non-streamed) response.
pub fn parse_response(body: &Value) -> Assembled {
    let mut a = Assembled::default();
    for block in body["content"].as_array().into_iter().flatten() {
        match block["type"].as_str() {
            Some("text") => a.text.push_str(block["text"].as_str().unwrap_or_default()),
            Some("tool_use") => a.calls.push(WireCall {
                id: block["id"].as_str().unwrap_or_default().to_owned(),
                name: block["name"].as_str().unwrap_or_default().to_owned(),
                arguments: block["input"].to_string(),
            }),
            _ => {}
        }
    }
    a.truncated = body["stop_reason"] == "max_tokens";
    if body["stop_reason"] == "refusal" {
        a.refusal = Some(if a.text.is_empty() {
            "the model refused".to_owned()
        } else {
            a.text.clone()
        });
    }
    a.usage = Usage::tokens(
        body["usage"]["input_tokens"].as_u64().unwrap_or(0),
        body["usage"]["output_tokens"].as_u64().unwrap_or(0),
    );
    a
}

#[derive(Debug, Default)]
struct Block {
    kind: String,
    text: String,
    id: String,
    name: String,
    json: String,
}

/// Assembles a streamed response event by event, by block index.
#[derive(Debug, Default)]
pub struct Stream {
    blocks: BTreeMap<u64, Block>,
    input_tokens: u64,
    output_tokens: u64,
    stop_reason: Option<String>,
    done: bool,
}

impl Stream {
    /// Takes one event; returns the text delta, if any, for live display.
    pub fn push(&mut self, event: &str, data: &str) -> Result<Option<String>, ProviderError> {
        if event == "ping" {
            return Ok(None);
        }
        let v: Value = match serde_json::from_str(data) {
            Ok(v) => v,
            // Unknown events with odd payloads are ignored; known ones must parse.
            Err(_) if !KNOWN.contains(&event) => return Ok(None),
            Err(e) => {
                return Err(ProviderError::Decode(format!(
                    "a {event} event is not JSON: {e}"
                )));
            }
        };
        let index = v["index"].as_u64().unwrap_or(0);
        match event {
            "message_start" => {
                let usage = &v["message"]["usage"];
                self.input_tokens = usage["input_tokens"].as_u64().unwrap_or(0);
                self.output_tokens = usage["output_tokens"].as_u64().unwrap_or(0);
            }
            "content_block_start" => {
                let b = &v["content_block"];
                self.blocks.insert(
                    index,
                    Block {
                        kind: b["type"].as_str().unwrap_or_default().to_owned(),
                        text: b["text"].as_str().unwrap_or_default().to_owned(),
                        id: b["id"].as_str().unwrap_or_default().to_owned(),
                        name: b["name"].as_str().unwrap_or_default().to_owned(),
                        json: String::new(),
                    },
                );
            }
            "content_block_delta" => {
                let block = self.blocks.entry(index).or_default();
                let delta = &v["delta"];
                match delta["type"].as_str() {
                    Some("text_delta") => {
                        let t = delta["text"].as_str().unwrap_or_default();
                        block.text.push_str(t);
                        return Ok(Some(t.to_owned()));
                    }
                    Some("input_json_delta") => {
                        block
                            .json
                            .push_str(delta["partial_json"].as_str().unwrap_or_default());
                    }
                    _ => {}
                }
            }
            "message_delta" => {
                if let Some(reason) = v["delta"]["stop_reason"].as_str() {
                    self.stop_reason = Some(reason.to_owned());
                }
                if let Some(out) = v["usage"]["output_tokens"].as_u64() {
                    self.output_tokens = out;
                }
            }
            "message_stop" => self.done = true,
            "error" => {
                let kind = v["error"]["type"].as_str().unwrap_or("unknown");
                return Err(ProviderError::from_error_type(
                    kind,
                    format!(
                        "the provider reported an error mid-stream: {} ({kind})",
                        v["error"]["message"].as_str().unwrap_or("no message"),
                    ),
                ));
            }
            _ => {}
        }
        Ok(None)
    }

    /// Whether `message_stop` came.
    pub fn is_done(&self) -> bool {
        self.done
    }

    /// What the stream said.
    pub fn finish(self) -> Assembled {
        let mut a = Assembled::default();
        for block in self.blocks.into_values() {
            match block.kind.as_str() {
                "text" => a.text.push_str(&block.text),
                "tool_use" => a.calls.push(WireCall {
                    id: block.id,
                    name: block.name,
                    arguments: block.json,
                }),
                _ => {}
            }
        }
        a.truncated = self.stop_reason.as_deref() == Some("max_tokens");
        if self.stop_reason.as_deref() == Some("refusal") {
            a.refusal = Some(if a.text.is_empty() {
                "the model refused".to_owned()
            } else {
                a.text.clone()
            });
        }
        a.usage = Usage::tokens(self.input_tokens, self.output_tokens);
        a
    }
}

const KNOWN: &[&str] = &[
    "message_start",
    "content_block_start",
    "content_block_delta",
    "content_block_stop",
    "message_delta",
    "message_stop",
    "error",
];
