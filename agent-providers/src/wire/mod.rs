//! Pure translators between the provider-neutral prompt and each provider's wire format.
//! No network here: request bodies out, response bodies or stream events in, one decision
//! out.

pub mod anthropic;
pub mod ollama;
pub mod openai;
pub mod responses;

use agent_core::{Decision, ModelReply, ToolCall, Usage};
use serde_json::{Value, json};

/// Longest tool name both APIs accept (OpenAI: 64 of `[A-Za-z0-9_-]`).
pub const MAX_NAME: usize = 64;

/// A tool name as sent on the wire: within the providers' pattern and length. Long names
/// keep their start and gain a short hash, so they stay distinct.
pub fn wire_name(name: &str) -> String {
    let clean: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    if clean.len() <= MAX_NAME && clean == name {
        return clean;
    }
    let hash = agent_core::sha256_hex(name.as_bytes());
    let keep: String = clean.chars().take(MAX_NAME - 9).collect();
    format!("{keep}_{}", &hash[..8])
}

/// A call id as Anthropic takes it (`^[a-zA-Z0-9_-]+$`, not empty). An id another
/// provider made (a run forked or continued with another model; Kimi's servers give ids
/// like `functions.read_file:0`) keeps its allowed characters and gains a short hash of
/// itself, so that two ids stay apart and a result still pairs with its call.
pub fn anthropic_id(id: &str) -> std::borrow::Cow<'_, str> {
    let allowed = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '-';
    if !id.is_empty() && id.chars().all(allowed) {
        return id.into();
    }
    let kept: String = id
        .chars()
        .map(|c| if allowed(c) { c } else { '_' })
        .collect();
    let hash = agent_core::sha256_hex(id.as_bytes());
    format!("{kept}_{}", &hash[..8]).into()
}

/// Puts back the tool names `wire_name` changed in the calls of a reply.
pub fn restore_names(reply: &mut ModelReply, tools: &[agent_core::ToolSpec]) {
    if let Ok(Decision::ToolCalls { calls }) = &mut reply.decision {
        for call in calls {
            if let Some(tool) = tools.iter().find(|t| wire_name(&t.name) == call.name) {
                call.name.clone_from(&tool.name);
            }
        }
    }
}

/// A user message as OpenAI's APIs take it: one item per tool result, made by `result`
/// from the call id and the content (they answer the calls right before them, so they come
/// first), then the person's text, if any, as one user message.
pub(crate) fn openai_user_items(
    message: &agent_core::Message,
    out: &mut Vec<Value>,
    result: impl Fn(&agent_core::CallId, &str) -> Value,
) {
    let mut texts = Vec::new();
    for part in &message.parts {
        match part {
            agent_core::Part::ToolResult {
                call_id, content, ..
            } => out.push(result(call_id, content)),
            agent_core::Part::Text { text } => texts.push(text.as_str()),
            // Neither API takes reasoning back in a user message.
            agent_core::Part::ToolUse { .. } | agent_core::Part::Reasoning { .. } => {}
        }
    }
    if !texts.is_empty() {
        out.push(json!({"role": "user", "content": texts.join("\n\n")}));
    }
}

/// The tools as Chat Completions takes them (and Ollama's own API): functions, each with
/// its name as the wire allows it and its schema as providers take it.
pub(crate) fn function_tools(tools: &[agent_core::ToolSpec]) -> Value {
    tools
        .iter()
        .map(|t| {
            json!({"type": "function", "function": {
                "name": wire_name(&t.name),
                "description": t.description,
                "parameters": agent_core::provider_schema(&t.input_schema),
            }})
        })
        .collect()
}

/// A tool call as it came over the wire, arguments still text.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WireCall {
    /// The call id.
    pub id: String,
    /// The tool name.
    pub name: String,
    /// The arguments as JSON text.
    pub arguments: String,
    /// What the provider attached to the call and wants back with it (Gemini's
    /// `extra_content`), kept as [`agent_core::Reasoning::CallExtra`].
    pub extra: Option<Value>,
}

/// A call's id: the one the server gave, or, from a server that gives none (builds of
/// llama.cpp's server, LM Studio and Gemini's OpenAI-compatible endpoint send `""` or no
/// `id`), one made from the call and its place in the reply. The same reply always gets
/// the same ids, two calls of one reply never share one, and the id goes back to the
/// server with the call's result like any other. Without it every call of such a server
/// was an invalid decision (an empty call id), and the run failed on its first tool call.
fn call_id(call: &WireCall, index: usize) -> String {
    if !call.id.is_empty() {
        return call.id.clone();
    }
    let hash =
        agent_core::sha256_hex(format!("{index}\n{}\n{}", call.name, call.arguments).as_bytes());
    format!("call_{}", &hash[..16])
}

/// Everything a reply said, assembled from a response or a stream.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Assembled {
    /// Answer text.
    pub text: String,
    /// A refusal, when the provider reports one.
    pub refusal: Option<String>,
    /// Tool calls in order.
    pub calls: Vec<WireCall>,
    /// Whether the output limit cut it.
    pub truncated: bool,
    /// Tokens used.
    pub usage: Usage,
    /// What the model thought before it answered, in order.
    pub reasoning: Vec<agent_core::Reasoning>,
}

impl Assembled {
    /// Turns what the model said into exactly one decision (CONTRACT §2).
    pub fn decide(mut self) -> ModelReply {
        let mut reasoning = std::mem::take(&mut self.reasoning);
        reasoning.extend(self.calls.iter().enumerate().filter_map(|(index, c)| {
            c.extra
                .as_ref()
                .map(|extra| agent_core::Reasoning::CallExtra {
                    call_id: call_id(c, index).into(),
                    extra_content: extra.clone(),
                })
        }));
        self.decide_only().with_reasoning(reasoning)
    }

    fn decide_only(self) -> ModelReply {
        let usage = self.usage;
        let raw = || {
            json!({
                "text": self.text,
                "tool_calls": self.calls.iter().map(|c| json!({"id": c.id, "name": c.name, "arguments": c.arguments})).collect::<Vec<_>>(),
            })
            .to_string()
        };
        if let Some(reason) = &self.refusal {
            return ModelReply::decision(
                Decision::CannotContinue {
                    reason: reason.clone(),
                },
                usage,
            );
        }
        if !self.calls.is_empty() {
            if self.truncated {
                return ModelReply::invalid(
                    raw(),
                    "the reply hit the output limit in the middle of a tool call; propose \
                     smaller calls (for example write a file in parts)",
                    usage,
                );
            }
            let mut calls = Vec::with_capacity(self.calls.len());
            for (index, c) in self.calls.iter().enumerate() {
                let id = call_id(c, index);
                let arguments = if c.arguments.trim().is_empty() {
                    Value::Object(serde_json::Map::new())
                } else {
                    match serde_json::from_str::<Value>(&c.arguments) {
                        Ok(v) if v.is_object() => v,
                        Ok(_) => {
                            return ModelReply::invalid(
                                raw(),
                                format!("the arguments of call {id} are not a JSON object"),
                                usage,
                            );
                        }
                        Err(e) => {
                            return ModelReply::invalid(
                                raw(),
                                format!("the arguments of call {id} are not valid JSON: {e}"),
                                usage,
                            );
                        }
                    }
                };
                calls.push(ToolCall::new(id, c.name.clone(), arguments));
            }
            return ModelReply::decision(Decision::ToolCalls { calls }, usage);
        }
        if self.text.trim().is_empty() {
            let problem = if self.truncated {
                "the reply hit the output limit before saying anything"
            } else {
                "the reply is empty"
            };
            return ModelReply::invalid(raw(), problem, usage);
        }
        if self.truncated {
            // A cut answer is never a final answer (CONTRACT §2).
            return ModelReply::invalid(
                raw(),
                "the reply was cut at the output limit, so it is not a final answer; answer \
                 again, shorter (or in parts, with tools)",
                usage,
            );
        }
        ModelReply::decision(Decision::Final { answer: self.text }, usage)
    }
}
