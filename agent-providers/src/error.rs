//! Why a model call failed, typed: a program decides whether to retry, wait or give up from
//! the variant, and a person reads the message.

use std::time::Duration;

use agent_core::{ModelErrorKind, Retry};

/// Why a model call failed (after the provider's own retries).
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum ProviderError {
    /// The provider is limiting requests (HTTP 429, a `rate_limit_error` event).
    #[error("{message}")]
    RateLimited {
        /// What the provider said.
        message: String,
        /// How long the provider asked to wait, if it said.
        retry_after: Option<Duration>,
    },
    /// The provider refused the credentials (HTTP 401/403).
    #[error("{message}")]
    Auth {
        /// What the provider said.
        message: String,
    },
    /// The provider has no such model or endpoint (HTTP 404).
    #[error("{message}")]
    NotFound {
        /// What the provider said.
        message: String,
    },
    /// The provider refused the request as it is (another 4xx, an invalid request event).
    #[error("{message}")]
    BadRequest {
        /// What the provider said.
        message: String,
    },
    /// The provider failed on its side (5xx, overloaded, a timeout it reported).
    #[error("{message}")]
    Server {
        /// What the provider said.
        message: String,
        /// How long the provider asked to wait, if it said.
        retry_after: Option<Duration>,
    },
    /// The connection failed, broke, or went silent.
    #[error("{0}")]
    Transport(String),
    /// The provider answered something that could not be read.
    #[error("{0}")]
    Decode(String),
    /// The client could not be set up (TLS, HTTP client).
    #[error("{0}")]
    Setup(String),
    /// A scripted or recorded model's failure, played back.
    #[error("{0}")]
    Scripted(String),
    /// A script or recording has no answer for this call.
    #[error("{0}")]
    Exhausted(String),
    /// The provider failed on every attempt the retry budget allowed.
    #[error("{last} ({why})")]
    GaveUp {
        /// The last failure.
        last: Box<ProviderError>,
        /// Why no further attempt was made.
        why: String,
        /// The attempts before the last one.
        retries: Vec<Retry>,
        /// What the last attempt may have cost: one the provider accepted before it failed
        /// is estimated as a retried one is ([`Retry::usage`]); nothing otherwise.
        spent: agent_core::Usage,
        /// No further attempt was made because it could pass the run's token or cost budget
        /// ([`crate::ModelRequest::with_spend_limit`]): the budget stopped the run, not the
        /// provider's failures alone.
        by_budget: bool,
    },
}

/// A request the provider refused because its prompt does not fit the model's window.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ContextOverflow {
    /// The window, in tokens, when the provider said it.
    pub window: Option<u64>,
}

/// How providers say a prompt is longer than the window, lowercased: OpenAI's code and its
/// Responses API's words, the "maximum context length" of OpenAI, vLLM, Mistral and
/// DeepSeek, Anthropic's, llama.cpp's server's, Gemini's.
const OVERFLOW_SAID: [&str; 7] = [
    "context_length_exceeded",
    "maximum context length",
    "exceeds the context window",
    "prompt is too long",
    "exceeds the available context size",
    "exceed_context_size",
    "exceeds the maximum number of tokens",
];

/// What precedes the window's size where a provider gives it: "maximum context length is
/// 8192 tokens", "prompt is too long: 210012 tokens > 200000 maximum", llama.cpp's
/// `"n_ctx": 4096` and "exceeds the available context size (4096 tokens)" (Ollama's
/// words too), Gemini's "allowed (1048576)".
const WINDOW_SAID: [&str; 6] = [
    "maximum context length is ",
    "tokens > ",
    "\"n_ctx\":",
    "available context size (",
    "allowed (",
    "context window of ",
];

/// The number at the start of `text` (spaces before it, thousands commas in it skipped).
fn number_at(text: &str) -> Option<u64> {
    let digits: String = text
        .trim_start()
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == ',')
        .filter(char::is_ascii_digit)
        .take(20)
        .collect();
    digits.parse().ok().filter(|n| *n > 0)
}

impl ProviderError {
    /// Whether the provider refused the request because its prompt is longer than the
    /// model's window, and the window when it said. A run whose window was set too large
    /// (a server that loads the model with less than it could hold, a model the defaults
    /// do not know) then compacts its prompt and asks again, instead of failing.
    pub fn context_overflow(&self) -> Option<ContextOverflow> {
        let message = match self {
            ProviderError::BadRequest { message } => message,
            ProviderError::GaveUp { last, .. } => return last.context_overflow(),
            _ => return None,
        };
        let lower = message.to_ascii_lowercase();
        if !OVERFLOW_SAID.iter().any(|said| lower.contains(said)) {
            return None;
        }
        let window = WINDOW_SAID.iter().find_map(|marker| {
            let at = lower.find(marker)?;
            number_at(&lower[at + marker.len()..])
        });
        Some(ContextOverflow { window })
    }

    /// The class of the failure, as recorded in the log.
    pub fn kind(&self) -> ModelErrorKind {
        match self {
            ProviderError::RateLimited { .. } => ModelErrorKind::RateLimited,
            ProviderError::Auth { .. } => ModelErrorKind::Auth,
            ProviderError::NotFound { .. } => ModelErrorKind::NotFound,
            ProviderError::BadRequest { .. } => ModelErrorKind::BadRequest,
            ProviderError::Server { .. } => ModelErrorKind::Server,
            ProviderError::Transport(_) => ModelErrorKind::Transport,
            ProviderError::Decode(_) => ModelErrorKind::Decode,
            ProviderError::Setup(_) => ModelErrorKind::Setup,
            ProviderError::Scripted(_) => ModelErrorKind::Other,
            ProviderError::Exhausted(_) => ModelErrorKind::Exhausted,
            ProviderError::GaveUp { last, .. } => last.kind(),
        }
    }

    /// Whether the same request may succeed if sent again.
    pub fn is_retryable(&self) -> bool {
        match self {
            ProviderError::GaveUp { .. } => false,
            other => other.kind().is_transient(),
        }
    }

    /// How long the provider asked to wait before the next attempt.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            ProviderError::RateLimited { retry_after, .. }
            | ProviderError::Server { retry_after, .. } => *retry_after,
            _ => None,
        }
    }

    /// The attempts that failed before the last one (empty unless retried).
    pub fn retries(&self) -> &[Retry] {
        match self {
            ProviderError::GaveUp { retries, .. } => retries,
            _ => &[],
        }
    }

    /// Whether the retries were stopped by the run's budget (see [`ProviderError::GaveUp`]).
    pub fn stopped_by_budget(&self) -> bool {
        matches!(
            self,
            ProviderError::GaveUp {
                by_budget: true,
                ..
            }
        )
    }

    /// What the last attempt may have cost (see [`ProviderError::GaveUp`]).
    pub fn spent(&self) -> agent_core::Usage {
        match self {
            ProviderError::GaveUp { spent, .. } => *spent,
            _ => agent_core::Usage::default(),
        }
    }

    /// An error of `kind` with `message`, as a recorded failure is played back.
    pub fn of_kind(kind: ModelErrorKind, message: String) -> ProviderError {
        match kind {
            ModelErrorKind::RateLimited => ProviderError::RateLimited {
                message,
                retry_after: None,
            },
            ModelErrorKind::Auth => ProviderError::Auth { message },
            ModelErrorKind::NotFound => ProviderError::NotFound { message },
            ModelErrorKind::BadRequest => ProviderError::BadRequest { message },
            ModelErrorKind::Server => ProviderError::Server {
                message,
                retry_after: None,
            },
            ModelErrorKind::Transport => ProviderError::Transport(message),
            ModelErrorKind::Decode => ProviderError::Decode(message),
            ModelErrorKind::Setup => ProviderError::Setup(message),
            ModelErrorKind::Exhausted => ProviderError::Exhausted(message),
            ModelErrorKind::Other => ProviderError::Scripted(message),
        }
    }

    /// The error a provider's error `type` (or `code`) names, for error events and bodies:
    /// `rate_limit_error`, `overloaded_error`, `authentication_error`, `not_found_error`,
    /// `invalid_request_error` and their OpenAI counterparts. Exhausted quota (`insufficient_quota`)
    /// is a refusal, not a rate limit: retrying only bills the wait. An unknown type is the
    /// provider's own failure only when it says so; otherwise the request is refused.
    pub fn from_error_type(error_type: &str, message: String) -> ProviderError {
        let t = error_type.to_ascii_lowercase();
        if t.contains("quota") {
            // Out of credit: waiting does not help, paying does.
            ProviderError::BadRequest { message }
        } else if t.contains("rate_limit") {
            ProviderError::RateLimited {
                message,
                retry_after: None,
            }
        } else if t.contains("overloaded") || t.contains("api_error") || t.contains("server") {
            ProviderError::Server {
                message,
                retry_after: None,
            }
        } else if t.contains("auth") || t.contains("permission") || t.contains("api_key") {
            ProviderError::Auth { message }
        } else if t.contains("not_found") {
            ProviderError::NotFound { message }
        } else {
            ProviderError::BadRequest { message }
        }
    }
}
