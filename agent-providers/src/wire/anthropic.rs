//! Anthropic Messages.

use std::collections::BTreeMap;

use agent_core::{Part, Prompt, Reasoning, Role, Usage, provider_schema};
use serde_json::{Value, json};

use super::{Assembled, WireCall, anthropic_id, wire_name};
use crate::{ProviderError, Thinking};

/// Output tokens asked for when nothing else is configured.
pub const DEFAULT_MAX_TOKENS: u32 = 8_192;

/// At most this many `cache_control` breakpoints in one request (the API's limit).
pub const MAX_BREAKPOINTS: usize = 4;

/// The request body for `POST /v1/messages`. With `cache`, prompt-cache breakpoints mark
/// the stable parts: the last tool (tools are cached whole), the system text, and the last
/// block of each of the last two user messages: the newest one, so that the next request
/// reads everything up to it, and the one before, which the previous request wrote.
pub fn request_body(
    prompt: &Prompt,
    model: &str,
    max_tokens: u32,
    stream: bool,
    cache: bool,
) -> Value {
    request_body_thinking(prompt, model, max_tokens, stream, cache, None)
}

/// The tool a run whose answer has a schema (an object schema) gives its final answer
/// with: the API has no structured output of its own, so the answer's schema is offered as
/// this tool's input schema, and the tool's input is the answer.
pub const ANSWER_TOOL: &str = "final_answer";

/// The answer schema offered as [`ANSWER_TOOL`], when the prompt has one it can be: an
/// object schema, and no tool of the run already has the name.
fn answer_tool_schema(prompt: &Prompt) -> Option<&Value> {
    let schema = prompt.answer_schema.as_ref()?;
    let object = schema.get("type").and_then(Value::as_str) == Some("object");
    let taken = prompt
        .tools
        .iter()
        .any(|t| wire_name(&t.name) == ANSWER_TOOL);
    (object && !taken).then_some(schema)
}

/// A reply that called [`ANSWER_TOOL`] alone is the final answer: its input, as JSON text.
/// (Called with other tools, the call is left as it is, and the run tells the model that
/// no tool has that name.)
pub fn answer_from_tool(assembled: &mut Assembled, prompt: &Prompt) {
    if answer_tool_schema(prompt).is_none() {
        return;
    }
    if let [call] = assembled.calls.as_slice()
        && call.name == ANSWER_TOOL
    {
        assembled.text = call.arguments.clone();
        assembled.calls.clear();
    }
}

/// Least thinking budget the API accepts, in tokens.
pub const MIN_THINKING_TOKENS: u32 = 1_024;

/// The output limit of a call that thinks adaptively, unless one is given: the thinking
/// counts in it, and a reply cut short of its decision is paid for and useless.
pub const DEFAULT_MAX_TOKENS_ADAPTIVE: u32 = 16_000;

/// [`request_body`] with thinking, when given: up to a budget of tokens (the output limit
/// is raised past the budget where it is not already: the API requires `budget_tokens <
/// max_tokens`), or adaptive (the thinking counts within `max_tokens`).
pub fn request_body_thinking(
    prompt: &Prompt,
    model: &str,
    max_tokens: u32,
    stream: bool,
    cache: bool,
    thinking: Option<Thinking>,
) -> Value {
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
                    } => others.push(json!({"type": "tool_use", "id": anthropic_id(call_id.as_str()), "name": wire_name(name), "input": arguments.to_value()})),
                    Part::ToolResult {
                        call_id,
                        ok,
                        content,
                        ..
                    } => results.push(json!({
                        "type": "tool_result",
                        "tool_use_id": anthropic_id(call_id.as_str()),
                        "content": content,
                        "is_error": !ok,
                    })),
                    // Sent back as it came: the API checks the signature of the thinking
                    // of a tool-use turn.
                    // Another provider's reasoning means nothing here, and is left out.
                    Part::Reasoning { reasoning } => match reasoning {
                        Reasoning::Thinking {
                            thinking,
                            signature,
                        } => others.push(
                            json!({"type": "thinking", "thinking": thinking, "signature": signature}),
                        ),
                        Reasoning::RedactedThinking { data } => {
                            others.push(json!({"type": "redacted_thinking", "data": data}));
                        }
                        Reasoning::ResponsesItem { .. }
                        | Reasoning::Content { .. }
                        | Reasoning::Details { .. }
                        | Reasoning::CallExtra { .. } => {}
                    },
                }
            }
            results.extend(others);
            json!({"role": role, "content": results})
        })
        .collect();
    let mut messages = messages;
    let mut tools: Vec<Value> = prompt
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
    let answer_tool = answer_tool_schema(prompt);
    if let Some(schema) = answer_tool {
        tools.push(json!({
            "name": ANSWER_TOOL,
            "description": "Give your final answer, once the goal is reached: call this tool \
                            alone, with the answer as its input.",
            "input_schema": provider_schema(schema),
        }));
    }
    let mut system = Value::String(prompt.system.clone());
    if cache {
        let breakpoint = || json!({"type": "ephemeral"});
        if let Some(last) = tools.last_mut() {
            last["cache_control"] = breakpoint();
        }
        if !prompt.system.is_empty() {
            system =
                json!([{"type": "text", "text": prompt.system, "cache_control": breakpoint()}]);
        }
        let users = messages
            .iter_mut()
            .rev()
            .filter(|m| m["role"] == "user")
            .take(2);
        for message in users {
            if let Some(block) = message["content"]
                .as_array_mut()
                .and_then(|blocks| blocks.last_mut())
            {
                block["cache_control"] = breakpoint();
            }
        }
    }
    let mut body = json!({
        "model": model,
        "max_tokens": max_tokens,
        "system": system,
        "messages": messages,
    });
    if !tools.is_empty() {
        body["tools"] = Value::Array(tools);
    }
    if answer_tool.is_some() && thinking.is_none() {
        // Forced: every reply calls a tool, the answer tool for the final answer. (The
        // API refuses forced tool use with thinking; then the answer tool is only offered.)
        body["tool_choice"] = json!({"type": "any"});
    }
    match thinking {
        Some(Thinking::Budget(budget)) => {
            let budget = budget.max(MIN_THINKING_TOKENS);
            body["thinking"] = json!({"type": "enabled", "budget_tokens": budget});
            if max_tokens <= budget {
                body["max_tokens"] = json!(budget.saturating_add(DEFAULT_MAX_TOKENS / 2));
            }
        }
        Some(Thinking::Adaptive) => body["thinking"] = json!({"type": "adaptive"}),
        None => {}
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
                extra: None,
            }),
            Some("thinking") => a.reasoning.push(Reasoning::Thinking {
                thinking: block["thinking"].as_str().unwrap_or_default().to_owned(),
                signature: block["signature"].as_str().unwrap_or_default().to_owned(),
            }),
            Some("redacted_thinking") => a.reasoning.push(Reasoning::RedactedThinking {
                data: block["data"].as_str().unwrap_or_default().to_owned(),
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
    let mut tokens = PromptTokens::default();
    tokens.update(&body["usage"]);
    a.usage = tokens.usage(body["usage"]["output_tokens"].as_u64().unwrap_or(0));
    a
}

/// The prompt's tokens as Anthropic counts them: `input_tokens` are only those after the
/// last cache breakpoint; the cached ones are reported apart.
#[derive(Debug, Default)]
struct PromptTokens {
    uncached: u64,
    cache_read: u64,
    cache_write: u64,
}

impl PromptTokens {
    /// Takes the counts a `usage` object has (a stream's `message_delta` may repeat them).
    fn update(&mut self, usage: &Value) {
        let count = |key: &str| usage.get(key).and_then(Value::as_u64);
        if let Some(n) = count("input_tokens") {
            self.uncached = n;
        }
        if let Some(n) = count("cache_read_input_tokens") {
            self.cache_read = n;
        }
        if let Some(n) = count("cache_creation_input_tokens") {
            self.cache_write = n;
        }
    }

    /// The usage of the call, all prompt tokens in `input_tokens`.
    fn usage(&self, output: u64) -> Usage {
        let all = self
            .uncached
            .saturating_add(self.cache_read)
            .saturating_add(self.cache_write);
        Usage::tokens(all, output).with_cache(self.cache_read, self.cache_write)
    }
}

#[derive(Debug, Default)]
struct Block {
    kind: String,
    text: String,
    id: String,
    name: String,
    json: String,
    /// A thinking block's signature, or a redacted one's data.
    signature: String,
}

/// Assembles a streamed response event by event, by block index.
#[derive(Debug, Default)]
pub struct Stream {
    blocks: BTreeMap<u64, Block>,
    input: PromptTokens,
    output_tokens: u64,
    stop_reason: Option<String>,
    done: bool,
    grown: u64,
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
                self.input.update(usage);
                self.output_tokens = usage["output_tokens"].as_u64().unwrap_or(0);
            }
            "content_block_start" => {
                let b = &v["content_block"];
                // A block begun is the answer moving, even an empty one.
                self.grown += 1;
                self.blocks.insert(
                    index,
                    Block {
                        kind: b["type"].as_str().unwrap_or_default().to_owned(),
                        text: b["text"]
                            .as_str()
                            .or(b["thinking"].as_str())
                            .unwrap_or_default()
                            .to_owned(),
                        id: b["id"].as_str().unwrap_or_default().to_owned(),
                        name: b["name"].as_str().unwrap_or_default().to_owned(),
                        json: String::new(),
                        signature: b["signature"]
                            .as_str()
                            .or(b["data"].as_str())
                            .unwrap_or_default()
                            .to_owned(),
                    },
                );
            }
            "content_block_delta" => {
                let block = self.blocks.entry(index).or_default();
                let delta = &v["delta"];
                self.grown += ["text", "partial_json", "thinking", "signature"]
                    .iter()
                    .filter_map(|field| delta[*field].as_str())
                    .map(|piece| piece.len() as u64)
                    .sum::<u64>();
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
                    Some("thinking_delta") => {
                        block
                            .text
                            .push_str(delta["thinking"].as_str().unwrap_or_default());
                    }
                    Some("signature_delta") => {
                        block
                            .signature
                            .push_str(delta["signature"].as_str().unwrap_or_default());
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
                self.input.update(&v["usage"]);
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

    /// How far the answer has moved: a byte for each block begun, and the bytes of every
    /// delta (text, a call's arguments, thinking, a signature). A ping or an empty delta
    /// shows the server is there, not that the answer moves.
    pub fn grown(&self) -> u64 {
        self.grown
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
                    extra: None,
                }),
                "thinking" => a.reasoning.push(Reasoning::Thinking {
                    thinking: block.text,
                    signature: block.signature,
                }),
                "redacted_thinking" => a.reasoning.push(Reasoning::RedactedThinking {
                    data: block.signature,
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
        a.usage = self.input.usage(self.output_tokens);
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
