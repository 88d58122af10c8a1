//! The closed set of decisions a model can make (CONTRACT §2) and their structural checks.

use std::collections::BTreeSet;
use std::fmt;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::budget::Usage;

/// Identity of one logical tool request, chosen by the model (or its provider).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct CallId(pub String);

impl CallId {
    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl From<&str> for CallId {
    fn from(s: &str) -> Self {
        CallId(s.to_owned())
    }
}

impl From<String> for CallId {
    fn from(s: String) -> Self {
        CallId(s)
    }
}

impl fmt::Display for CallId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// One tool call as proposed by the model: an intent, not yet an action.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolCall {
    /// The call's id, unique within its batch.
    pub id: CallId,
    /// The tool's name.
    pub name: String,
    /// The arguments; must be a JSON object.
    pub arguments: Value,
    /// Where known secret values stood in the arguments as proposed: the log keeps a
    /// reference to the variable, and the runtime expands it again before the call runs
    /// (CONTRACT §7). Empty for almost every call.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub secrets: Vec<SecretRef>,
}

impl ToolCall {
    /// A call with the given id, tool name and arguments.
    pub fn new(id: impl Into<CallId>, name: impl Into<String>, arguments: Value) -> Self {
        ToolCall {
            id: id.into(),
            name: name.into(),
            arguments,
            secrets: Vec::new(),
        }
    }
}

/// Words that make an environment variable's name a secret's: its value is redacted from
/// what is logged, and kept from the commands a model runs.
pub const SECRET_WORDS: [&str; 4] = ["KEY", "TOKEN", "SECRET", "PASSWORD"];

/// Words that make a name a secret's where they are a whole part of it, between
/// underscores, beside another (`SMTP_PASS`, `MYSQL_PWD`, `GPG_PASSPHRASE`, `GITLAB_PAT`;
/// not `PWD`, the working directory, nor `COMPASS_HOME`).
pub const SECRET_PARTS: [&str; 5] = ["PASS", "PASSWD", "PWD", "PASSPHRASE", "PAT"];

/// Whether an environment variable named `name` holds a secret, by its name
/// ([`SECRET_WORDS`] anywhere in it, or one of [`SECRET_PARTS`] as one of its parts, in any
/// case): `OPENAI_API_KEY`, `GH_TOKEN`, `db_password`, `SMTP_PASS`.
pub fn named_like_secret(name: &str) -> bool {
    let upper = name.to_ascii_uppercase();
    if SECRET_WORDS.iter().any(|word| upper.contains(word)) {
        return true;
    }
    let parts: Vec<&str> = upper.split('_').filter(|p| !p.is_empty()).collect();
    parts.len() > 1 && parts.iter().any(|part| SECRET_PARTS.contains(part))
}

/// Whether an environment variable holds a secret, by its name ([`named_like_secret`]) or
/// by its value: a URL with a password in it (`DATABASE_URL=postgres://app:pw@db/app`, a
/// proxy's `http://user:pw@proxy:3128`).
pub fn holds_secret(name: &str, value: &str) -> bool {
    named_like_secret(name) || url_with_password(value)
}

/// Whether `value` holds a URL whose authority names a user and a password
/// (`scheme://user:password@host`).
fn url_with_password(value: &str) -> bool {
    value.match_indices("://").any(|(at, _)| {
        let authority = value[at + 3..]
            .split(['/', '?', '#', ' '])
            .next()
            .unwrap_or_default();
        authority
            .rsplit_once('@')
            .and_then(|(user_info, _)| user_info.split_once(':'))
            .is_some_and(|(user, password)| !user.is_empty() && !password.is_empty())
    })
}

/// A known secret value inside a proposed call, logged as a reference: the string at
/// `pointer` (a JSON pointer into the arguments; the member's name itself when `in_key`)
/// holds the placeholder `[secret:$VAR]` at byte `at`, `len` bytes long, where the call
/// as proposed held the value of the variable `var`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SecretRef {
    /// JSON pointer to the string (or, with `in_key`, to the member whose name it is).
    pub pointer: String,
    /// Whether the placeholder is in the member's name rather than in a string value.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub in_key: bool,
    /// Byte offset of the placeholder.
    pub at: usize,
    /// Length of the placeholder in bytes.
    pub len: usize,
    /// The variable whose value stood there.
    pub var: String,
}

/// What the model decided this turn.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Decision {
    /// The model thinks the goal is reached.
    Final {
        /// The answer; never empty once validated.
        answer: String,
    },
    /// Run these tools.
    ToolCalls {
        /// The batch; never empty once validated.
        calls: Vec<ToolCall>,
    },
    /// The model asks a person before acting.
    RequestApproval {
        /// What the model wants to do, for the person.
        summary: String,
        /// The calls it wants approved, if any.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        calls: Vec<ToolCall>,
    },
    /// The goal is ambiguous; a person must answer.
    Clarification {
        /// The question for the person.
        question: String,
    },
    /// The model gives up.
    CannotContinue {
        /// Why.
        reason: String,
    },
}

impl Decision {
    /// The contract's word for this decision.
    pub fn kind(&self) -> &'static str {
        match self {
            Decision::Final { .. } => "final",
            Decision::ToolCalls { .. } => "tool_calls",
            Decision::RequestApproval { .. } => "request_approval",
            Decision::Clarification { .. } => "clarification",
            Decision::CannotContinue { .. } => "cannot_continue",
        }
    }

    /// The calls this decision proposes (empty for decisions without calls).
    pub fn calls(&self) -> &[ToolCall] {
        match self {
            Decision::ToolCalls { calls } | Decision::RequestApproval { calls, .. } => calls,
            _ => &[],
        }
    }

    /// Checks the structure of the decision (CONTRACT §2): a non-empty answer, a non-empty
    /// batch, object arguments, non-empty and unique call ids, and the limits that keep
    /// everything committed readable back and a turn's cost bounded ([`MAX_CALLS`],
    /// [`MAX_ARGUMENT_DEPTH`], [`MAX_ARGUMENT_BYTES`], [`MAX_TEXT_BYTES`], [`MAX_ID_BYTES`]).
    pub fn check(&self) -> Result<(), DecisionProblem> {
        let text = match self {
            Decision::Final { answer: t }
            | Decision::RequestApproval { summary: t, .. }
            | Decision::Clarification { question: t }
            | Decision::CannotContinue { reason: t } => t.len(),
            Decision::ToolCalls { .. } => 0,
        };
        if text > MAX_TEXT_BYTES {
            return Err(DecisionProblem::TooLong {
                what: self.kind(),
                bytes: text,
            });
        }
        match self {
            Decision::Final { answer } if answer.trim().is_empty() => {
                Err(DecisionProblem::EmptyAnswer)
            }
            // Asked as it is, it would be an empty message in every later prompt (which
            // Anthropic refuses), and a person would be asked nothing.
            Decision::Clarification { question } if question.trim().is_empty() => {
                Err(DecisionProblem::EmptyQuestion)
            }
            Decision::ToolCalls { calls } if calls.is_empty() => Err(DecisionProblem::EmptyBatch),
            Decision::ToolCalls { calls } | Decision::RequestApproval { calls, .. } => {
                check_calls(calls)
            }
            _ => Ok(()),
        }
    }
}

/// Deepest nesting of arrays and objects accepted in a call's arguments. The log's own
/// nesting around them stays far below the JSON parser's limit, so a committed call can
/// always be read back.
pub const MAX_ARGUMENT_DEPTH: usize = 32;

/// Largest arguments of one call, as compact JSON.
pub const MAX_ARGUMENT_BYTES: usize = 1 << 20;

/// Largest answer, question, summary or reason.
pub const MAX_TEXT_BYTES: usize = 1 << 20;

/// Longest call id or tool name.
pub const MAX_ID_BYTES: usize = 256;

/// Most tool calls in one decision: eight times the default tool-call budget of a whole
/// exchange, far more than a model proposes at once. A reply with more (a model in a loop,
/// or a server that is not what it claims) is refused before any call is judged, so its
/// size costs the run no more than its parsing.
pub const MAX_CALLS: usize = 1024;

/// Whether `c` may not be in a call id or tool name: a control character (a line break,
/// an escape that moves a terminal's cursor) or one that reorders the text around it
/// (bidirectional formatting). Ids and names are shown to the person who approves a call,
/// on one line with what it does.
fn is_unshowable(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{061c}' | '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}'
        )
}

/// How deeply arrays and objects nest in `value` (a scalar is 0), without recursion.
pub fn nesting_depth(value: &Value) -> usize {
    let mut deepest = 0;
    let mut stack = vec![(value, 0usize)];
    while let Some((v, depth)) = stack.pop() {
        deepest = deepest.max(depth);
        match v {
            Value::Array(items) => stack.extend(items.iter().map(|i| (i, depth + 1))),
            Value::Object(map) => stack.extend(map.values().map(|i| (i, depth + 1))),
            _ => {}
        }
    }
    deepest
}

fn check_calls(calls: &[ToolCall]) -> Result<(), DecisionProblem> {
    if calls.len() > MAX_CALLS {
        return Err(DecisionProblem::TooManyCalls { calls: calls.len() });
    }
    let mut seen = BTreeSet::new();
    for call in calls {
        if call.id.0.len() > MAX_ID_BYTES || call.name.len() > MAX_ID_BYTES {
            return Err(DecisionProblem::IdTooLong { max: MAX_ID_BYTES });
        }
        if let Some(text) = [call.id.0.as_str(), call.name.as_str()]
            .into_iter()
            .find(|text| text.chars().any(is_unshowable))
        {
            return Err(DecisionProblem::UnshowableId {
                shown: format!("{text:?}"),
            });
        }
        if call.id.0.is_empty() {
            return Err(DecisionProblem::EmptyCallId {
                name: call.name.clone(),
            });
        }
        if call.name.is_empty() {
            return Err(DecisionProblem::EmptyToolName {
                call_id: call.id.clone(),
            });
        }
        if !call.arguments.is_object() {
            return Err(DecisionProblem::ArgumentsNotObject {
                call_id: call.id.clone(),
            });
        }
        let depth = nesting_depth(&call.arguments);
        if depth > MAX_ARGUMENT_DEPTH {
            return Err(DecisionProblem::ArgumentsTooDeep {
                call_id: call.id.clone(),
                depth,
            });
        }
        let bytes = serde_json::to_vec(&call.arguments).map_or(usize::MAX, |b| b.len());
        if bytes > MAX_ARGUMENT_BYTES {
            return Err(DecisionProblem::ArgumentsTooLarge {
                call_id: call.id.clone(),
                bytes,
            });
        }
        if !seen.insert(&call.id) {
            return Err(DecisionProblem::DuplicateCallId {
                call_id: call.id.clone(),
            });
        }
    }
    Ok(())
}

/// Why a reply is an invalid decision. The text is shown to the model so it can repair.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DecisionProblem {
    /// A `final` decision with an empty answer.
    #[error("the final answer is empty; give the answer or call a tool")]
    EmptyAnswer,
    /// A `tool_calls` decision with no calls.
    #[error("the tool_calls batch is empty; propose at least one call or give a final answer")]
    EmptyBatch,
    /// A clarification whose question is empty.
    #[error("the question is empty; ask it, or call a tool or give a final answer")]
    EmptyQuestion,
    /// Two calls of one batch share an id.
    #[error("call id {call_id} appears twice in one batch; every call needs its own id")]
    DuplicateCallId {
        /// The repeated id.
        call_id: CallId,
    },
    /// A call's arguments are not a JSON object.
    #[error("the arguments of call {call_id} are not a JSON object")]
    ArgumentsNotObject {
        /// The offending call.
        call_id: CallId,
    },
    /// A call without an id.
    #[error("a call to {name} has an empty id")]
    EmptyCallId {
        /// The tool it named.
        name: String,
    },
    /// A call without a tool name.
    #[error("call {call_id} names no tool")]
    EmptyToolName {
        /// The offending call.
        call_id: CallId,
    },
    /// A call's arguments nest deeper than [`MAX_ARGUMENT_DEPTH`].
    #[error(
        "the arguments of call {call_id} nest {depth} levels deep; at most 32 levels are \
         accepted, flatten them"
    )]
    ArgumentsTooDeep {
        /// The offending call.
        call_id: CallId,
        /// How deep they nest.
        depth: usize,
    },
    /// A call's arguments are larger than [`MAX_ARGUMENT_BYTES`].
    #[error(
        "the arguments of call {call_id} are {bytes} bytes; at most 1 MiB is accepted, \
         split the work into smaller calls"
    )]
    ArgumentsTooLarge {
        /// The offending call.
        call_id: CallId,
        /// Their size as compact JSON.
        bytes: usize,
    },
    /// More calls than [`MAX_CALLS`] in one decision.
    #[error(
        "the reply proposes {calls} tool calls; at most 1024 are accepted in one turn, \
         propose the first few"
    )]
    TooManyCalls {
        /// How many it proposed.
        calls: usize,
    },
    /// A call id or tool name longer than [`MAX_ID_BYTES`].
    #[error("a call id or tool name is longer than {max} bytes")]
    IdTooLong {
        /// The limit.
        max: usize,
    },
    /// A call id or tool name with a control character or a bidirectional override.
    #[error(
        "the call id or tool name {shown} has a control or direction character; use letters, \
         digits, `_` and `-`"
    )]
    UnshowableId {
        /// The id or name, escaped (at most [`MAX_ID_BYTES`] before escaping).
        shown: String,
    },
    /// An answer, question, summary or reason larger than [`MAX_TEXT_BYTES`].
    #[error("the {what} text is {bytes} bytes; at most 1 MiB is accepted, be shorter")]
    TooLong {
        /// The decision's kind.
        what: &'static str,
        /// Its size.
        bytes: usize,
    },
}

/// A reply that could not be turned into a decision, kept for the model's repair.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct InvalidReply {
    /// What the model said, as received.
    pub raw: String,
    /// Why it is not a decision.
    pub problem: String,
}

/// Why a model call failed, as a class a program can act on (the message says the rest).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ModelErrorKind {
    /// The provider is limiting requests (HTTP 429): wait and try again.
    RateLimited,
    /// The provider refused the credentials (HTTP 401/403).
    Auth,
    /// The provider has no such model or endpoint (HTTP 404).
    NotFound,
    /// The provider refused the request as malformed or too large (other 4xx).
    BadRequest,
    /// The provider failed on its side (5xx, overloaded).
    Server,
    /// The connection failed, broke, or went silent.
    Transport,
    /// The provider answered something that could not be read.
    Decode,
    /// The client could not be set up (TLS, HTTP client).
    Setup,
    /// A scripted or recorded model has nothing more to say.
    Exhausted,
    /// Anything else (a scripted failure, an older log without a kind).
    #[default]
    Other,
}

impl ModelErrorKind {
    /// Every kind.
    pub const ALL: [ModelErrorKind; 10] = [
        ModelErrorKind::RateLimited,
        ModelErrorKind::Auth,
        ModelErrorKind::NotFound,
        ModelErrorKind::BadRequest,
        ModelErrorKind::Server,
        ModelErrorKind::Transport,
        ModelErrorKind::Decode,
        ModelErrorKind::Setup,
        ModelErrorKind::Exhausted,
        ModelErrorKind::Other,
    ];

    /// The kind as written in the log and in `--json` output.
    pub fn as_str(self) -> &'static str {
        match self {
            ModelErrorKind::RateLimited => "rate_limited",
            ModelErrorKind::Auth => "auth",
            ModelErrorKind::NotFound => "not_found",
            ModelErrorKind::BadRequest => "bad_request",
            ModelErrorKind::Server => "server",
            ModelErrorKind::Transport => "transport",
            ModelErrorKind::Decode => "decode",
            ModelErrorKind::Setup => "setup",
            ModelErrorKind::Exhausted => "exhausted",
            ModelErrorKind::Other => "other",
        }
    }

    /// Whether trying the same call again later may succeed.
    pub fn is_transient(self) -> bool {
        matches!(
            self,
            ModelErrorKind::RateLimited | ModelErrorKind::Server | ModelErrorKind::Transport
        )
    }
}

impl std::fmt::Display for ModelErrorKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One retried attempt of a model call, recorded in the log.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Retry {
    /// The attempt that failed (1-based).
    pub attempt: u32,
    /// Why (status code, connection error, cut stream).
    pub reason: String,
    /// How long the provider waited before the next attempt.
    pub wait_ms: u64,
    /// What the failed attempt may have cost: one the provider accepted (its prompt read,
    /// perhaps part of an answer written) before it failed, estimated from the sizes as
    /// for a provider that reports no usage; it counts toward the run's budgets. Nothing
    /// for an attempt refused or never answered.
    #[serde(default, skip_serializing_if = "Usage::is_zero")]
    pub usage: Usage,
}

/// What a model thought before it decided, as its provider gave it. It is never an answer
/// and never a decision: it is kept because the provider needs it back (Anthropic requires
/// the thinking blocks of a tool-use turn, unchanged, beside the tool results) and because
/// a person may want to read it (`agent show`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Reasoning {
    /// An Anthropic `thinking` block: the (summarized) thinking and the signature by which
    /// the provider checks that it comes back unchanged.
    Thinking {
        /// The thinking text.
        thinking: String,
        /// The provider's signature of it.
        signature: String,
    },
    /// An Anthropic `redacted_thinking` block: thinking the provider encrypted.
    RedactedThinking {
        /// The encrypted thinking, opaque.
        data: String,
    },
    /// An OpenAI Responses `reasoning` item: its id, the summary the model wrote of its
    /// reasoning, and the reasoning itself encrypted (what lets a model that keeps no state
    /// go on from it in the next call).
    ResponsesItem {
        /// The item's id (`rs_…`).
        id: String,
        /// The summary's texts, in order.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        summary: Vec<String>,
        /// The encrypted reasoning, when asked for.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        encrypted_content: Option<String>,
    },
    /// The reasoning text an OpenAI-compatible server sends beside the answer, named by its
    /// field: `reasoning_content` (DeepSeek, vLLM, llama.cpp) or `reasoning` (Ollama,
    /// OpenRouter). DeepSeek's thinking mode refuses a request whose tool-using turns come
    /// back without their `reasoning_content`.
    Content {
        /// The field it came in.
        field: String,
        /// The text, whole.
        text: String,
    },
    /// OpenRouter's `reasoning_details`: the model's reasoning as blocks (text, summaries,
    /// encrypted reasoning with signatures) that must come back unchanged with the calls
    /// they led to (Gemini 3 and Claude behind it refuse or lose their reasoning without).
    Details {
        /// The blocks, in order, each as the provider gave it.
        details: Vec<Value>,
    },
    /// What a provider attached to one of the reply's calls and wants back with it,
    /// unchanged: Gemini's `extra_content` (its thought signature) on its OpenAI-compatible
    /// endpoint, without which the next call of a tool-using run is refused.
    CallExtra {
        /// The call it goes with.
        call_id: CallId,
        /// The object as the provider gave it.
        extra_content: Value,
    },
}

impl Reasoning {
    /// The text a person can read: the thinking, or the summary, or nothing for encrypted
    /// reasoning.
    pub fn readable(&self) -> Option<String> {
        match self {
            Reasoning::Thinking { thinking, .. } | Reasoning::Content { text: thinking, .. } => {
                Some(thinking.clone())
            }
            Reasoning::ResponsesItem { summary, .. } if !summary.is_empty() => {
                Some(summary.join("\n\n"))
            }
            Reasoning::ResponsesItem { .. }
            | Reasoning::RedactedThinking { .. }
            | Reasoning::CallExtra { .. }
            // Its text also comes as `reasoning` text, which is shown.
            | Reasoning::Details { .. } => None,
        }
    }
}

/// What a provider hands the runtime for one model call.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelReply {
    /// The decision, or why the reply is not one.
    pub decision: Result<Decision, InvalidReply>,
    /// Tokens (and money) the call used.
    pub usage: Usage,
    /// Attempts that failed before this reply.
    pub retries: Vec<Retry>,
    /// What the model thought before it decided, in the order given.
    pub reasoning: Vec<Reasoning>,
}

impl ModelReply {
    /// A reply carrying a decision.
    pub fn decision(decision: Decision, usage: Usage) -> Self {
        ModelReply {
            decision: Ok(decision),
            usage,
            retries: Vec::new(),
            reasoning: Vec::new(),
        }
    }

    /// The same reply, with what the model thought before it.
    pub fn with_reasoning(mut self, reasoning: Vec<Reasoning>) -> Self {
        self.reasoning = reasoning;
        self
    }

    /// A reply that is not a decision.
    pub fn invalid(raw: impl Into<String>, problem: impl Into<String>, usage: Usage) -> Self {
        ModelReply {
            decision: Err(InvalidReply {
                raw: raw.into(),
                problem: problem.into(),
            }),
            usage,
            retries: Vec::new(),
            reasoning: Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Names that hold secrets by a word anywhere in them or by a part of them, and values
    /// that do: URLs with a password; and what is none.
    #[test]
    fn secrets_are_known_by_name_or_by_a_url_s_password() {
        for name in [
            "OPENAI_API_KEY",
            "gh_token",
            "DB_PASSWORD",
            "SMTP_PASS",
            "MYSQL_PWD",
            "GPG_PASSPHRASE",
            "GITLAB_PAT",
            "ldap_passwd",
        ] {
            assert!(named_like_secret(name), "{name}");
        }
        for name in [
            "PWD",
            "OLDPWD",
            "PATH",
            "COMPASS_HOME",
            "PATTERN",
            "PAT",
            "_PASS_",
        ] {
            assert!(!named_like_secret(name), "{name}");
        }
        for value in [
            "postgres://app:pw@db:5432/app",
            "http://user:hunter@proxy:3128",
            "redis://default:x@cache/0 and more",
            "see https://example.org then amqp://u:v@mq",
        ] {
            assert!(holds_secret("DATABASE_URL", value), "{value}");
        }
        for value in [
            "postgres://app@db/app",
            "postgres://db/app",
            "https://example.org/a:b@c",
            "mailto:me@example.org",
            "http://:pw@host",
            "http://user:@host",
        ] {
            assert!(!holds_secret("DATABASE_URL", value), "{value}");
        }
    }

    fn call(id: &str, args: Value) -> ToolCall {
        ToolCall::new(id, "read_file", args)
    }

    #[test]
    fn structural_problems_are_found() {
        let cases = [
            (
                Decision::Final {
                    answer: "  ".into(),
                },
                Some(DecisionProblem::EmptyAnswer),
            ),
            (
                Decision::ToolCalls { calls: vec![] },
                Some(DecisionProblem::EmptyBatch),
            ),
            (
                Decision::Clarification {
                    question: " \n".into(),
                },
                Some(DecisionProblem::EmptyQuestion),
            ),
            (
                Decision::Clarification {
                    question: "Which file?".into(),
                },
                None,
            ),
            (
                Decision::ToolCalls {
                    calls: vec![call("a", json!({})), call("a", json!({}))],
                },
                Some(DecisionProblem::DuplicateCallId {
                    call_id: "a".into(),
                }),
            ),
            (
                Decision::ToolCalls {
                    calls: vec![call("a", json!([1]))],
                },
                Some(DecisionProblem::ArgumentsNotObject {
                    call_id: "a".into(),
                }),
            ),
            (
                Decision::RequestApproval {
                    summary: "s".into(),
                    calls: vec![],
                },
                None,
            ),
            (
                Decision::ToolCalls {
                    calls: vec![call("a", json!({})), call("b", json!({}))],
                },
                None,
            ),
            // As many calls as accepted, then one more.
            (
                Decision::ToolCalls {
                    calls: (0..MAX_CALLS)
                        .map(|i| call(&format!("c{i}"), json!({})))
                        .collect(),
                },
                None,
            ),
            (
                Decision::RequestApproval {
                    summary: "s".into(),
                    calls: (0..=MAX_CALLS)
                        .map(|i| call(&format!("c{i}"), json!({})))
                        .collect(),
                },
                Some(DecisionProblem::TooManyCalls {
                    calls: MAX_CALLS + 1,
                }),
            ),
        ];
        for (decision, expected) in cases {
            assert_eq!(decision.check().err(), expected, "{decision:?}");
        }
    }

    #[test]
    fn decisions_use_snake_case_tags() {
        let d = Decision::CannotContinue {
            reason: "no access".into(),
        };
        assert_eq!(
            serde_json::to_value(&d).unwrap(),
            json!({"type": "cannot_continue", "reason": "no access"})
        );
        assert_eq!(d.kind(), "cannot_continue");
    }

    /// Each kind of reasoning is written to the log under its own `kind` and read back
    /// as it was: what a provider needs back survives a restart.
    #[test]
    fn every_kind_of_reasoning_reads_back_as_it_was_written() {
        let kinds = [
            (
                Reasoning::Content {
                    field: "reasoning_content".into(),
                    text: "read it first".into(),
                },
                "content",
            ),
            (
                Reasoning::Details {
                    details: vec![
                        json!({"type": "reasoning.encrypted", "data": "CiQB", "index": 0}),
                    ],
                },
                "details",
            ),
            (
                Reasoning::CallExtra {
                    call_id: "call_1".into(),
                    extra_content: json!({"google": {"thought_signature": "CrIC"}}),
                },
                "call_extra",
            ),
        ];
        for (reasoning, kind) in kinds {
            let written = serde_json::to_value(&reasoning).unwrap();
            assert_eq!(written["kind"], kind, "{written}");
            let read: Reasoning = serde_json::from_value(written).unwrap();
            assert_eq!(read, reasoning);
        }
    }
}
