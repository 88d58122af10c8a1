//! `agent-providers` turns whatever a model says into exactly one typed decision
//! (CONTRACT §2): `HttpModel` (the default `http` feature) speaks OpenAI Chat Completions (and compatible servers)
//! and Anthropic Messages, streamed or not, with retries; [`ScriptModel`] plays the offline
//! script of CONTRACT §10; [`ReplayModel`] answers with a recorded run's decisions. The
//! translators in [`wire`] are pure and tested without a network.
//!
//! ```
//! use agent_core::{Decision, Prompt};
//! use agent_providers::{Model, ModelRequest, ScriptModel};
//!
//! let model = ScriptModel::from_json(r#"{"turns": [{"final": "hello"}]}"#).unwrap();
//! let prompt = Prompt { system: String::new(), messages: vec![], tools: vec![], answer_schema: None };
//! let rt = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
//! let reply = rt.block_on(model.decide(ModelRequest::new(&prompt, 0))).unwrap();
//! assert_eq!(reply.decision, Ok(Decision::Final { answer: "hello".into() }));
//! ```

mod error;
#[cfg(feature = "http")]
mod http;
mod replay;
mod script;
mod spec;
#[cfg(feature = "testing")]
pub mod testing;
mod think;
pub mod wire;

pub use error::{ContextOverflow, ProviderError};
#[cfg(feature = "http")]
pub use http::{
    DEFAULT_MAX_RESPONSE_BYTES, Dialect, HttpModel, Price, RetryPolicy, TextSink, retry_after, tls,
};
pub use replay::ReplayModel;
pub use script::{ScriptError, ScriptModel};
pub use spec::{ModelSpec, SpecError};
pub use think::{Effort, Thinking};

use agent_core::{ModelReply, Prompt};
use async_trait::async_trait;

/// One model call.
#[derive(Clone, Copy, Debug)]
pub struct ModelRequest<'a> {
    /// The prompt, built from the committed log.
    pub prompt: &'a Prompt,
    /// Model calls this run already made (0 for the first call).
    pub step: u32,
    /// The most this call may write, when the run's token or cost budget leaves only so
    /// much: output past it would certainly pass the budget. A model with an output cap
    /// of its own asks for the smaller. `None`: no such limit.
    pub max_output_tokens: Option<u32>,
    /// What the call may use in all, its retried attempts included, before it passes the
    /// run's budget: a model that retries stops when another attempt could not fit.
    /// `None`: no such limit.
    pub spend_limit: Option<SpendLimit>,
    /// What this call's prompt shares its beginning with: the same for every call of a
    /// run, and of a fork and the run it was forked from. A provider that routes requests
    /// to its prompt caches by a key of the caller's (OpenAI's `prompt_cache_key`) gets a
    /// key made from it, so that a run's calls go where their prefix is cached. `None`:
    /// none is sent.
    pub cache_key: Option<&'a str>,
}

/// What one model call may use before it passes its run's token or cost budget, and the
/// least an attempt of it uses (its prompt's tokens at the fewest).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct SpendLimit {
    /// Tokens left, prompt and output of every attempt together.
    pub tokens: Option<u64>,
    /// Dollars left.
    pub usd: Option<f64>,
    /// Tokens of the prompt at the fewest: what every attempt uses.
    pub least_input_tokens: u64,
}

impl SpendLimit {
    /// Whether another attempt, whose prompt costs `least_usd` at the least, could still
    /// fit once `spent` was used by the attempts before it.
    pub fn allows_another(&self, spent: &agent_core::Usage, least_usd: f64) -> bool {
        self.tokens
            .is_none_or(|left| spent.total_tokens().saturating_add(self.least_input_tokens) <= left)
            && self
                .usd
                .is_none_or(|left| spent.cost_usd + least_usd <= left)
    }
}

impl<'a> ModelRequest<'a> {
    /// A call with `prompt`, after `step` calls of the run, with no limit of its own on
    /// what it writes.
    pub fn new(prompt: &'a Prompt, step: u32) -> Self {
        ModelRequest {
            prompt,
            step,
            max_output_tokens: None,
            spend_limit: None,
            cache_key: None,
        }
    }

    /// The same call, whose prompt begins as those of the other calls of `key` do (see
    /// [`ModelRequest::cache_key`]).
    pub fn with_cache_key(mut self, key: Option<&'a str>) -> Self {
        self.cache_key = key;
        self
    }

    /// The same call, within `limit` (see [`ModelRequest::spend_limit`]).
    pub fn with_spend_limit(mut self, limit: Option<SpendLimit>) -> Self {
        self.spend_limit = limit;
        self
    }

    /// The same call, writing at most `tokens` (see [`ModelRequest::max_output_tokens`]).
    pub fn with_max_output_tokens(mut self, tokens: Option<u32>) -> Self {
        self.max_output_tokens = tokens;
        self
    }
}

/// A model: one decision per call.
#[async_trait]
pub trait Model: Send + Sync {
    /// The provider's name, recorded in the run's manifest (`script`, `openai`, ...).
    fn provider(&self) -> &str;
    /// The model's name, recorded in the run's manifest.
    fn model(&self) -> &str;
    /// Asks for one decision. An invalid reply is `Ok` with an invalid decision; `Err` is
    /// a provider failure past its retry budget.
    async fn decide(&self, request: ModelRequest<'_>) -> Result<ModelReply, ProviderError>;
    /// Whether the usage of each reply carries what the call cost
    /// ([`Usage::cost_usd`](agent_core::Usage::cost_usd)). The runtime refuses to drive a
    /// run with a cost budget on a model that does not: its calls would count as free and
    /// the budget would never stop the run. An [`HttpModel`] knows its cost once it is
    /// given a price; a [`ScriptModel`] and a [`ReplayModel`] report the costs their
    /// script or run holds.
    fn knows_cost(&self) -> bool {
        false
    }
    /// The least a call whose prompt has `input_tokens` tokens can cost, in US dollars:
    /// each token at the cheapest price a prompt token has (a read from the provider's
    /// cache, when that is cheaper), nothing written. The runtime checks a cost budget with
    /// it before a call. 0 when the price is not known.
    fn least_cost(&self, input_tokens: u64) -> f64 {
        let _ = input_tokens;
        0.0
    }
    /// Whether the prompt tokens a reply's usage reports are all the prompt's, as OpenAI's
    /// and Anthropic's are. Some servers count only what they did not have cached (Ollama,
    /// whose key-value cache keeps the start of the last prompt): the runtime then never
    /// takes such a count as the size of the prompt, which would keep it from compacting a
    /// prompt past the window. True by default.
    fn counts_whole_prompts(&self) -> bool {
        true
    }
    /// Whether the tokens a reply's usage reports are counted from the prompt's text by a
    /// tokenizer (the provider's), so that a count of that text is a guide to them: the
    /// runtime then stops a call whose prompt alone, by its own count, would pass a token
    /// or cost budget before any provider counted a prompt like it. A [`ScriptModel`] and
    /// a [`ReplayModel`] report what their script or run holds, whatever the text: false.
    /// True by default.
    fn counts_text(&self) -> bool {
        true
    }
    /// The output tokens `usd` dollars pay for at the most, when the price is known: what
    /// the runtime caps a call's output at when a cost budget leaves only so much.
    fn output_tokens_for(&self, usd: f64) -> Option<u64> {
        let _ = usd;
        None
    }
}

#[cfg(test)]
mod tests {
    use agent_core::Usage;

    use super::SpendLimit;

    #[test]
    fn another_attempt_fits_only_with_its_least_prompt() {
        let spent = Usage {
            cost_usd: 0.5,
            ..Usage::tokens(600, 100)
        };
        let tokens = SpendLimit {
            tokens: Some(1_000),
            least_input_tokens: 300,
            ..SpendLimit::default()
        };
        assert!(tokens.allows_another(&spent, 0.0), "700 + 300 fits 1,000");
        let more = SpendLimit {
            least_input_tokens: 301,
            ..tokens
        };
        assert!(!more.allows_another(&spent, 0.0));
        let usd = SpendLimit {
            usd: Some(1.0),
            ..SpendLimit::default()
        };
        assert!(usd.allows_another(&spent, 0.5));
        assert!(!usd.allows_another(&spent, 0.51));
        assert!(
            SpendLimit::default().allows_another(&spent, 1e9),
            "no budget, no limit"
        );
    }
}
