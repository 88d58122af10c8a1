//! OpenAI Responses (`POST /v1/responses`): the input as a list of items (messages,
//! `function_call`s and their `function_call_output`s by `call_id`, `reasoning` items),
//! streamed as typed events. Nothing is stored at the provider (`store: false`): the
//! reasoning of each call comes back encrypted in its `reasoning` items, which are sent
//! again with the next call so that the model goes on from it.

use std::collections::BTreeMap;

use agent_core::{Part, Prompt, Reasoning, Role, Usage, provider_schema};
use serde_json::{Value, json};

use super::{Assembled, WireCall, wire_name};
use crate::ProviderError;

/// The request body for `POST /v1/responses`.
pub fn request_body(prompt: &Prompt, model: &str, stream: bool) -> Value {
    let mut input = Vec::new();
    for message in &prompt.messages {
        match message.role {
            Role::Assistant => {
                let mut text = Vec::new();
                let mut calls = Vec::new();
                for part in &message.parts {
                    match part {
                        // Reasoning first, as it came before what followed from it.
                        Part::Reasoning {
                            reasoning:
                                Reasoning::ResponsesItem {
                                    id,
                                    summary,
                                    encrypted_content,
                                },
                        } => {
                            let mut item = json!({
                                "type": "reasoning",
                                "id": id,
                                "summary": summary
                                    .iter()
                                    .map(|t| json!({"type": "summary_text", "text": t}))
                                    .collect::<Vec<_>>(),
                            });
                            if let Some(content) = encrypted_content {
                                item["encrypted_content"] = json!(content);
                            }
                            input.push(item);
                        }
                        // Another provider's reasoning means nothing here.
                        Part::Reasoning { .. } | Part::ToolResult { .. } => {}
                        Part::Text { text: t } => text.push(t.as_str()),
                        Part::ToolUse {
                            call_id,
                            name,
                            arguments,
                        } => calls.push(json!({
                            "type": "function_call",
                            "call_id": call_id,
                            "name": wire_name(name),
                            "arguments": arguments.to_string(),
                        })),
                    }
                }
                if !text.is_empty() {
                    input.push(json!({"role": "assistant", "content": text.join("\n")}));
                }
                input.extend(calls);
            }
            Role::User => super::openai_user_items(
                message,
                &mut input,
                |call_id, output| json!({"type": "function_call_output", "call_id": call_id, "output": output}),
            ),
        }
    }
    let mut body = json!({
        "model": model,
        "instructions": prompt.system,
        "input": input,
        // Nothing is kept at the provider: the log is the state, and the reasoning comes
        // back encrypted to be sent again.
        "store": false,
        "include": ["reasoning.encrypted_content"],
    });
    if !prompt.tools.is_empty() {
        body["tools"] = prompt
            .tools
            .iter()
            .map(|t| {
                json!({
                    "type": "function",
                    "name": wire_name(&t.name),
                    "description": t.description,
                    "parameters": provider_schema(&t.input_schema),
                    "strict": false,
                })
            })
            .collect();
    }
    if let Some(schema) = &prompt.answer_schema {
        // Structured output for the text reply; not strict (see the Chat dialect).
        body["text"] = json!({"format": {
            "type": "json_schema",
            "name": "final_answer",
            "schema": provider_schema(schema),
            "strict": false,
        }});
    }
    if stream {
        body["stream"] = Value::Bool(true);
    }
    body
}

/// Usage as the Responses API reports it: `input_tokens` counts the tokens read from and
/// written to the cache too (GPT-5.6 and later bill the written ones above an uncached
/// token).
fn usage_of(response: &Value) -> Usage {
    let u = &response["usage"];
    let count = |pointer: &str| u.pointer(pointer).and_then(Value::as_u64).unwrap_or(0);
    Usage::tokens(count("/input_tokens"), count("/output_tokens"))
        .with_cache(
            count("/input_tokens_details/cached_tokens"),
            count("/input_tokens_details/cache_write_tokens"),
        )
        .with_reasoning(count("/output_tokens_details/reasoning_tokens"))
}

/// One output item into what the reply says.
fn take_item(a: &mut Assembled, item: &Value) {
    let text = |v: &Value| v.as_str().unwrap_or_default().to_owned();
    match item["type"].as_str() {
        Some("message") => {
            for part in item["content"].as_array().into_iter().flatten() {
                match part["type"].as_str() {
                    Some("output_text") => a.text.push_str(part["text"].as_str().unwrap_or("")),
                    Some("refusal") => a.refusal = Some(text(&part["refusal"])),
                    _ => {}
                }
            }
        }
        Some("function_call") => a.calls.push(WireCall {
            id: text(&item["call_id"]),
            name: text(&item["name"]),
            arguments: text(&item["arguments"]),
            extra: None,
        }),
        Some("reasoning") => a.reasoning.push(Reasoning::ResponsesItem {
            id: text(&item["id"]),
            summary: item["summary"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|s| s["text"].as_str().map(str::to_owned))
                .collect(),
            encrypted_content: item["encrypted_content"].as_str().map(str::to_owned),
        }),
        _ => {}
    }
}

/// A whole (non-streamed) response, or the one a stream's last event carries.
pub fn parse_response(body: &Value) -> Assembled {
    let mut a = Assembled::default();
    for item in body["output"].as_array().into_iter().flatten() {
        take_item(&mut a, item);
    }
    finish_status(&mut a, body);
    a.usage = usage_of(body);
    a
}

/// What an `incomplete` status says of the reply.
fn finish_status(a: &mut Assembled, body: &Value) {
    if body["status"] == "incomplete" {
        match body["incomplete_details"]["reason"].as_str() {
            Some("max_output_tokens") => a.truncated = true,
            reason => {
                a.refusal.get_or_insert_with(|| {
                    format!(
                        "the provider stopped the reply ({})",
                        reason.unwrap_or("no reason given")
                    )
                });
            }
        }
    }
}

/// Assembles a streamed response: output items as each is done, then the response the
/// last event carries (authoritative when it lists its output).
#[derive(Debug, Default)]
pub struct Stream {
    items: BTreeMap<u64, Value>,
    last: Option<Value>,
    grown: u64,
}

impl Stream {
    /// Takes one event; returns the text delta, if any, for live display.
    pub fn push(&mut self, event: &str, data: &str) -> Result<Option<String>, ProviderError> {
        let v: Value = match serde_json::from_str(data) {
            Ok(v) => v,
            Err(_) if !event.starts_with("response.") && event != "error" => return Ok(None),
            Err(e) => {
                return Err(ProviderError::Decode(format!(
                    "a {event} event is not JSON: {e}"
                )));
            }
        };
        // The event's type is in its data too; a server that sends no `event:` line is
        // read by it.
        let kind = v["type"].as_str().unwrap_or(event);
        if kind.ends_with(".delta") {
            // Text, a call's arguments, reasoning, its summary: all move the answer.
            self.grown += v["delta"].as_str().map_or(0, |d| d.len() as u64);
        }
        match kind {
            "response.output_text.delta" => {
                return Ok(v["delta"].as_str().map(str::to_owned));
            }
            "response.output_item.done" => {
                let index = v["output_index"]
                    .as_u64()
                    .unwrap_or(self.items.len() as u64);
                self.items.insert(index, v["item"].clone());
                self.grown += 1;
            }
            "response.completed" | "response.incomplete" => {
                self.last = Some(v["response"].clone());
            }
            "response.failed" => {
                let error = &v["response"]["error"];
                return Err(failure(error));
            }
            "error" => return Err(failure(&v)),
            _ => {}
        }
        Ok(None)
    }

    /// Whether the response's last event came.
    pub fn is_done(&self) -> bool {
        self.last.is_some()
    }

    /// How far the answer has moved: the bytes of every delta (text, a call's arguments,
    /// reasoning), and one for each output item done. An empty delta shows the server is
    /// there, not that the answer moves.
    pub fn grown(&self) -> u64 {
        self.grown
    }

    /// What the stream said.
    pub fn finish(self) -> Assembled {
        let last = self.last.unwrap_or(Value::Null);
        if last["output"].as_array().is_some_and(|o| !o.is_empty()) {
            return parse_response(&last);
        }
        let mut a = Assembled::default();
        for item in self.items.values() {
            take_item(&mut a, item);
        }
        finish_status(&mut a, &last);
        a.usage = usage_of(&last);
        a
    }
}

/// The error a `response.failed` or `error` event reports, classified by its code.
fn failure(error: &Value) -> ProviderError {
    let code = error["code"]
        .as_str()
        .or(error["type"].as_str())
        .unwrap_or("unknown");
    let message = error["message"].as_str().unwrap_or("no message");
    ProviderError::from_error_type(
        code,
        format!("the provider reported an error mid-stream: {message} ({code})"),
    )
}
