//! OpenAI Chat Completions (and the servers that copy it: Ollama, vLLM, llama.cpp).

use std::collections::BTreeMap;

use agent_core::{Part, Prompt, Reasoning, Role, Usage, provider_schema};
use serde_json::{Value, json};

use super::{Assembled, WireCall, wire_name};
use crate::ProviderError;

/// The request body for `POST /chat/completions`.
pub fn request_body(prompt: &Prompt, model: &str, stream: bool) -> Value {
    let mistral = is_mistral(model);
    let id = |call_id: &agent_core::CallId| -> Value {
        if mistral {
            mistral_id(call_id.as_str()).into()
        } else {
            call_id.as_str().into()
        }
    };
    let mut messages = vec![json!({"role": "system", "content": prompt.system})];
    for message in &prompt.messages {
        match message.role {
            Role::Assistant => messages.push(assistant_message(message, &id)),
            // One `tool` message per result.
            Role::User => super::openai_user_items(
                message,
                &mut messages,
                |call_id, content| json!({"role": "tool", "tool_call_id": id(call_id), "content": content}),
            ),
        }
    }
    let lower = model.to_ascii_lowercase();
    if lower.contains("deepseek") {
        let since = messages
            .iter()
            .rposition(|m| m["role"] == "user")
            .map_or(0, |at| at + 1);
        pad_reasoning(&mut messages[since..]);
    } else if lower.contains("kimi") {
        pad_reasoning(&mut messages);
    }
    let mut body = json!({"model": model, "messages": messages});
    if !prompt.tools.is_empty() {
        body["tools"] = super::function_tools(&prompt.tools);
    }
    if let Some(schema) = &prompt.answer_schema {
        // Structured output for the text reply (tool calls are not affected); not strict,
        // since strict mode accepts only a subset of JSON Schema. The run checks the
        // answer itself either way.
        body["response_format"] = json!({"type": "json_schema", "json_schema": {
            "name": "final_answer",
            "schema": provider_schema(schema),
            "strict": false,
        }});
    }
    if stream {
        body["stream"] = Value::Bool(true);
        body["stream_options"] = json!({"include_usage": true});
    }
    body
}

fn usage_of(v: &Value) -> Option<Usage> {
    let u = v.get("usage")?;
    let count = |pointer: &str| u.pointer(pointer).and_then(Value::as_u64).unwrap_or(0);
    // Prompt tokens read from the server's cache: OpenAI's field, DeepSeek's and
    // Moonshot's own.
    let cached = [
        "/prompt_tokens_details/cached_tokens",
        "/prompt_cache_hit_tokens",
        "/cached_tokens",
    ]
    .into_iter()
    .map(count)
    .max()
    .unwrap_or(0);
    let reasoning = count("/completion_tokens_details/reasoning_tokens");
    Some(
        Usage::tokens(
            u.get("prompt_tokens")?.as_u64()?,
            u.get("completion_tokens")
                .and_then(Value::as_u64)
                .unwrap_or(0),
        )
        // Written to the cache: GPT-5.6 and later bill these above an uncached token
        // (OpenRouter reports Claude's the same way).
        .with_cache(cached, count("/prompt_tokens_details/cache_write_tokens"))
        .with_reasoning(reasoning),
    )
}

/// An assistant message as Chat Completions takes it: its text, its calls with what the
/// provider attached to each, and (with calls) the reasoning that led to them: DeepSeek
/// refuses a request without it, the templates of Qwen and the like render it; that of an
/// answer is left out, as those servers ignore it. Only `reasoning_content` of the texts:
/// servers that send `reasoning` need none back, and some refuse fields they do not know.
/// OpenRouter's blocks go unchanged and in order. `id` writes a call id.
fn assistant_message(
    message: &agent_core::Message,
    id: &dyn Fn(&agent_core::CallId) -> Value,
) -> Value {
    let mut text = Vec::new();
    let mut uses = Vec::new();
    let mut extras = std::collections::HashMap::new();
    let mut reasoning = String::new();
    let mut details = Vec::new();
    for part in &message.parts {
        match part {
            Part::Text { text: t } => text.push(t.as_str()),
            Part::ToolUse {
                call_id,
                name,
                arguments,
            } => uses.push((call_id, name, arguments)),
            Part::Reasoning { reasoning: r } => match r {
                Reasoning::CallExtra {
                    call_id,
                    extra_content,
                } => {
                    extras.insert(call_id, extra_content);
                }
                Reasoning::Content { field, text } if field == REASONING_CONTENT => {
                    reasoning.push_str(text);
                }
                Reasoning::Details { details: blocks } => details.extend(blocks.iter().cloned()),
                _ => {}
            },
            Part::ToolResult { .. } => {}
        }
    }
    let mut m = json!({"role": "assistant"});
    m["content"] = if text.is_empty() {
        Value::Null
    } else {
        Value::String(text.join("\n"))
    };
    if uses.is_empty() {
        return m;
    }
    let calls = uses
        .into_iter()
        .map(|(call_id, name, arguments)| {
            let mut call = json!({
                "id": id(call_id),
                "type": "function",
                "function": {"name": wire_name(name), "arguments": arguments.to_string()},
            });
            if let Some(extra) = extras.get(call_id) {
                call["extra_content"] = (*extra).clone();
            }
            call
        })
        .collect();
    m["tool_calls"] = Value::Array(calls);
    if !reasoning.is_empty() {
        m[REASONING_CONTENT] = Value::String(reasoning);
    }
    if !details.is_empty() {
        m[REASONING_DETAILS] = Value::Array(details);
    }
    m
}

/// Whether `model` is one of Mistral's, whose API (and vLLM serving them) takes only call
/// ids of 9 letters and digits.
fn is_mistral(model: &str) -> bool {
    let model = model.to_ascii_lowercase();
    [
        "mistral",
        "magistral",
        "codestral",
        "devstral",
        "ministral",
        "pixtral",
    ]
    .iter()
    .any(|family| model.contains(family))
}

/// A call id as Mistral takes it: its own (9 letters and digits) as it is; another
/// model's (a run continued or forked on Mistral) as the first 9 hex digits of its hash,
/// the same each time, so that a result still pairs with its call.
fn mistral_id(id: &str) -> std::borrow::Cow<'_, str> {
    if id.len() == 9 && id.bytes().all(|b| b.is_ascii_alphanumeric()) {
        return id.into();
    }
    agent_core::sha256_hex(id.as_bytes())[..9].to_owned().into()
}

/// The field in which DeepSeek, vLLM and llama.cpp send what the model thought.
const REASONING_CONTENT: &str = "reasoning_content";

/// Gives an empty `reasoning_content` to the messages of calls among `messages` that have
/// none (the calls of another model the run was continued from, or a reply that thought
/// nothing). DeepSeek's thinking mode refuses a request in which a message of calls since
/// the last user message has none (earlier turns need none); Kimi's, one in which any
/// message of calls has none. Both take an empty one.
fn pad_reasoning(messages: &mut [Value]) {
    for message in messages {
        if message["role"] == "assistant"
            && message.get("tool_calls").is_some()
            && message.get(REASONING_CONTENT).is_none()
        {
            message[REASONING_CONTENT] = Value::String(String::new());
        }
    }
}

/// The fields in which servers send what the model thought, beside the answer.
const REASONING_FIELDS: [&str; 2] = [REASONING_CONTENT, "reasoning"];

/// The field in which OpenRouter sends the model's reasoning as blocks.
const REASONING_DETAILS: &str = "reasoning_details";

/// What the model thought, as a message (or a stream's deltas) gave it: the texts of
/// [`REASONING_FIELDS`], then OpenRouter's blocks.
fn reasoning_of(mut texts: [String; 2], details: Vec<Value>) -> Vec<Reasoning> {
    // A server that sends both fields (vLLM, as it renames one to the other) sends the
    // same text twice: it is kept once, where it goes back.
    if texts[0] == texts[1] {
        texts[1].clear();
    }
    let mut reasoning: Vec<Reasoning> = REASONING_FIELDS
        .iter()
        .zip(texts)
        .filter(|(_, text)| !text.is_empty())
        .map(|(field, text)| Reasoning::Content {
            field: (*field).to_owned(),
            text,
        })
        .collect();
    if !details.is_empty() {
        reasoning.push(Reasoning::Details { details });
    }
    reasoning
}

/// OpenRouter's reasoning blocks, as their streamed pieces build them.
#[derive(Debug, Default)]
struct Details {
    blocks: Vec<Value>,
    /// Where the block of each `type` and `index` is in `blocks` (a server's pieces are
    /// many; each is found at once).
    at: std::collections::HashMap<(String, u64), usize>,
}

impl Details {
    /// Adds `pieces`: a piece of a block already begun (the same `type` and `index`) adds
    /// to its `text`, `summary` or `data` and sets its other fields (a signature, an id);
    /// any other piece begins a block.
    fn add(&mut self, pieces: &Value) {
        const GROWING: [&str; 3] = ["text", "summary", "data"];
        for piece in pieces.as_array().into_iter().flatten() {
            let Some(fields) = piece.as_object() else {
                continue;
            };
            let key = piece["index"]
                .as_u64()
                .map(|index| (piece["type"].as_str().unwrap_or_default().to_owned(), index));
            let begun = key.as_ref().and_then(|key| self.at.get(key).copied());
            let Some(Value::Object(block)) = begun.and_then(|at| self.blocks.get_mut(at)) else {
                if let Some(key) = key {
                    self.at.insert(key, self.blocks.len());
                }
                self.blocks.push(piece.clone());
                continue;
            };
            for (key, value) in fields {
                match (block.get_mut(key), value) {
                    (Some(Value::String(so_far)), Value::String(more))
                        if GROWING.contains(&key.as_str()) =>
                    {
                        so_far.push_str(more);
                    }
                    (_, Value::Null) => {}
                    _ => {
                        block.insert(key.clone(), value.clone());
                    }
                }
            }
        }
    }
}

/// What a server attached to a call (Gemini: `extra_content`, holding its thought
/// signature), when it is an object.
fn extra_of(call: &Value) -> Option<Value> {
    call.get("extra_content").filter(|v| v.is_object()).cloned()
}

fn text_of(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        _ => None,
    }
}

/// A whole (non-streamed) response.
pub fn parse_response(body: &Value) -> Assembled {
    let choice = &body["choices"][0];
    let message = &choice["message"];
    let calls = message["tool_calls"]
        .as_array()
        .map(|calls| {
            calls
                .iter()
                .map(|c| WireCall {
                    id: c["id"].as_str().unwrap_or_default().to_owned(),
                    name: c["function"]["name"]
                        .as_str()
                        .unwrap_or_default()
                        .to_owned(),
                    arguments: match &c["function"]["arguments"] {
                        Value::String(s) => s.clone(),
                        Value::Null => String::new(),
                        other => other.to_string(),
                    },
                    extra: extra_of(c),
                })
                .collect()
        })
        .unwrap_or_default();
    Assembled {
        text: text_of(&message["content"]).unwrap_or_default(),
        refusal: text_of(&message["refusal"]),
        calls,
        truncated: choice["finish_reason"] == "length",
        usage: usage_of(body).unwrap_or_default(),
        reasoning: reasoning_of(
            REASONING_FIELDS.map(|field| text_of(&message[field]).unwrap_or_default()),
            message[REASONING_DETAILS]
                .as_array()
                .cloned()
                .unwrap_or_default(),
        ),
    }
}

/// Assembles a streamed response chunk by chunk.
#[derive(Debug, Default)]
pub struct Stream {
    text: String,
    refusal: Option<String>,
    calls: BTreeMap<u64, WireCall>,
    truncated: bool,
    usage: Option<Usage>,
    done: bool,
    grown: u64,
    /// The index of the call the last piece went to.
    last: Option<u64>,
    /// What the model thought, by field ([`REASONING_FIELDS`]).
    reasoning: [String; 2],
    /// OpenRouter's reasoning blocks, as their pieces built them.
    details: Details,
}

impl Stream {
    /// Where a piece of a call that gives no `index` goes (Gemini's endpoint and some
    /// proxies send none): to the call the last piece went to, unless it starts another
    /// one (it gives another id than that call's, or it names a tool and that call has a
    /// name already); then to a new one after all the others.
    fn unindexed(&self, call: &Value) -> u64 {
        let next = self.calls.keys().next_back().map_or(0, |k| k + 1);
        let Some((index, so_far)) = self.last.and_then(|i| self.calls.get(&i).map(|c| (i, c)))
        else {
            return next;
        };
        let another = match call["id"].as_str().filter(|id| !id.is_empty()) {
            Some(id) if !so_far.id.is_empty() => id != so_far.id,
            _ => {
                call["function"]["name"]
                    .as_str()
                    .is_some_and(|n| !n.is_empty())
                    && !so_far.name.is_empty()
            }
        };
        if another { next } else { index }
    }

    /// Takes one `data:` payload; returns the text delta, if any, for live display.
    pub fn push(&mut self, data: &str) -> Result<Option<String>, ProviderError> {
        if data.trim() == "[DONE]" {
            self.done = true;
            return Ok(None);
        }
        let chunk: Value = serde_json::from_str(data)
            .map_err(|e| ProviderError::Decode(format!("a stream chunk is not JSON: {e}")))?;
        if let Some(error) = chunk.get("error") {
            let kind = error["type"]
                .as_str()
                .or_else(|| error["code"].as_str())
                .unwrap_or("unknown");
            return Err(ProviderError::from_error_type(
                kind,
                format!("the provider reported an error mid-stream: {error}"),
            ));
        }
        if let Some(usage) = usage_of(&chunk) {
            self.usage = Some(usage);
        }
        let mut delta_text = None;
        for choice in chunk["choices"].as_array().into_iter().flatten() {
            let delta = &choice["delta"];
            self.grown += delta_size(delta);
            if let Some(t) = text_of(&delta["content"]) {
                self.text.push_str(&t);
                delta_text = Some(t);
            }
            for (field, so_far) in REASONING_FIELDS.iter().zip(&mut self.reasoning) {
                if let Some(t) = delta[*field].as_str() {
                    so_far.push_str(t);
                }
            }
            self.details.add(&delta[REASONING_DETAILS]);
            if let Some(r) = text_of(&delta["refusal"]) {
                self.refusal.get_or_insert_with(String::new).push_str(&r);
            }
            for call in delta["tool_calls"].as_array().into_iter().flatten() {
                let indexed = call["index"].as_u64();
                let index = indexed.unwrap_or_else(|| self.unindexed(call));
                self.last = Some(index);
                let entry = self.calls.entry(index).or_default();
                // A later piece of the call may carry `"id": ""` (as some proxies send):
                // the id its first piece gave stands.
                if let Some(id) = call["id"].as_str().filter(|id| !id.is_empty()) {
                    entry.id = id.to_owned();
                }
                // A piece with no index that names its call's tool again does not make the
                // name longer.
                if let Some(name) = call["function"]["name"].as_str()
                    && (indexed.is_some() || entry.name.is_empty())
                {
                    entry.name.push_str(name);
                }
                match &call["function"]["arguments"] {
                    Value::String(s) => entry.arguments.push_str(s),
                    // Some servers send the arguments as an object, whole.
                    Value::Object(_) => entry.arguments = call["function"]["arguments"].to_string(),
                    _ => {}
                }
                if let Some(extra) = extra_of(call) {
                    entry.extra = Some(extra);
                }
            }
            if choice["finish_reason"] == "length" {
                self.truncated = true;
            }
        }
        Ok(delta_text)
    }

    /// Whether the end marker came.
    pub fn is_done(&self) -> bool {
        self.done
    }

    /// Bytes the answer's pieces have brought so far: text, reasoning (`reasoning_content`
    /// and the like, which is not kept), a refusal, calls' names and arguments. A piece
    /// that brings none (an empty delta, a role alone) shows the server is there, not
    /// that the answer moves.
    pub fn grown(&self) -> u64 {
        self.grown
    }

    /// What the stream said.
    pub fn finish(self) -> Assembled {
        Assembled {
            text: self.text,
            refusal: self.refusal,
            calls: self.calls.into_values().collect(),
            truncated: self.truncated,
            usage: self.usage.unwrap_or_default(),
            reasoning: reasoning_of(self.reasoning, self.details.blocks),
        }
    }
}

/// Bytes a chunk's `delta` brings: the text of every field but the role, and of its calls'
/// names and arguments (not their ids or types, which a server may send again and again).
fn delta_size(delta: &Value) -> u64 {
    fn text(v: &Value) -> u64 {
        match v {
            Value::String(s) => s.len() as u64,
            Value::Array(a) => a.iter().map(text).sum(),
            Value::Object(o) => o.values().map(text).sum(),
            _ => 0,
        }
    }
    let Some(fields) = delta.as_object() else {
        return 0;
    };
    fields
        .iter()
        .map(|(key, value)| match key.as_str() {
            "role" => 0,
            "tool_calls" => value
                .as_array()
                .into_iter()
                .flatten()
                .map(|call| text(&call["function"]["name"]) + text(&call["function"]["arguments"]))
                .sum(),
            _ => text(value),
        })
        .sum()
}
