//! Budgets (CONTRACT §4) and token usage.

use serde::{Deserialize, Serialize};

/// Every limit on a run, all enforced by code, never by prompt.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Budget {
    /// Model calls (turns); spent means `max_steps`.
    pub max_steps: u32,
    /// Tool calls actually started; a batch that would pass it is not started.
    pub max_tool_calls: u32,
    /// Times the same call (id, tool and arguments) may be run again after its first run.
    pub max_retries_per_tool: u32,
    /// Wall-clock budget in milliseconds from the run's start.
    pub max_wall_time_ms: Option<u64>,
    /// Input plus output tokens over all model calls.
    pub max_tokens: Option<u64>,
    /// Money over all model calls, in US dollars.
    pub max_cost_usd: Option<f64>,
    /// `write`/`external` calls that run without asking; past it each asks.
    pub max_write_actions: Option<u32>,
    /// Turns in a row the same batch may run before the model is corrected (§6).
    pub max_repeated_plan: u32,
    /// Consecutive invalid turns that end the run with `invalid_decision`.
    pub max_invalid_decisions: u32,
    /// Consecutive turns whose calls were all denied that end the run with `policy_violation`.
    pub max_denials: u32,
}

impl Default for Budget {
    fn default() -> Self {
        Budget {
            max_steps: 32,
            max_tool_calls: 128,
            max_retries_per_tool: 2,
            max_wall_time_ms: None,
            max_tokens: None,
            max_cost_usd: None,
            max_write_actions: None,
            max_repeated_plan: 2,
            max_invalid_decisions: 2,
            max_denials: 3,
        }
    }
}

/// Tokens and money used by model calls.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Usage {
    /// Prompt tokens, all of them: those the provider read from or wrote to its prompt
    /// cache included (Anthropic reports those apart; they are added in here).
    pub input_tokens: u64,
    /// Completion tokens.
    pub output_tokens: u64,
    /// Of the prompt tokens, those read from the provider's prompt cache (OpenAI's
    /// `cached_tokens`, Anthropic's `cache_read_input_tokens`).
    #[serde(default, skip_serializing_if = "is_zero_count")]
    pub cache_read_tokens: u64,
    /// Of the prompt tokens, those written to the provider's prompt cache (Anthropic's
    /// `cache_creation_input_tokens`, OpenAI's `cache_write_tokens` from GPT-5.6 on).
    #[serde(default, skip_serializing_if = "is_zero_count")]
    pub cache_write_tokens: u64,
    /// Of the completion tokens, those the model spent reasoning (OpenAI's
    /// `reasoning_tokens`; Anthropic counts thinking in the output without a breakdown).
    #[serde(default, skip_serializing_if = "is_zero_count")]
    pub reasoning_tokens: u64,
    /// Cost in US dollars, when the price is known.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub cost_usd: f64,
    /// The provider reported no usage for the call (some OpenAI-compatible servers do
    /// not), and these counts are an estimate made from the size of the request and the
    /// reply, so that the token and cost budgets still hold. Of a total: some call's was.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub estimated: bool,
}

fn is_zero(v: &f64) -> bool {
    *v == 0.0
}

fn is_zero_count(v: &u64) -> bool {
    *v == 0
}

impl Usage {
    /// Whether nothing was used (no token, no cost): what a log leaves out.
    pub fn is_zero(&self) -> bool {
        *self == Usage::default()
    }

    /// Usage of `input` prompt tokens and `output` completion tokens.
    pub fn tokens(input: u64, output: u64) -> Self {
        Usage {
            input_tokens: input,
            output_tokens: output,
            cache_read_tokens: 0,
            cache_write_tokens: 0,
            reasoning_tokens: 0,
            cost_usd: 0.0,
            estimated: false,
        }
    }

    /// The same usage, of whose prompt tokens `read` came from the provider's cache and
    /// `written` went into it (each at most the prompt tokens).
    pub fn with_cache(mut self, read: u64, written: u64) -> Self {
        self.cache_read_tokens = read.min(self.input_tokens);
        self.cache_write_tokens = written.min(self.input_tokens - self.cache_read_tokens);
        self
    }

    /// The same usage, of whose completion tokens `reasoning` went to reasoning (at most
    /// the completion tokens).
    pub fn with_reasoning(mut self, reasoning: u64) -> Self {
        self.reasoning_tokens = reasoning.min(self.output_tokens);
        self
    }

    /// Prompt tokens neither read from nor written to a cache.
    pub fn uncached_input_tokens(&self) -> u64 {
        self.input_tokens
            .saturating_sub(self.cache_read_tokens)
            .saturating_sub(self.cache_write_tokens)
    }

    /// Input plus output tokens.
    pub fn total_tokens(&self) -> u64 {
        self.input_tokens.saturating_add(self.output_tokens)
    }

    /// What `self` has beyond `earlier` (a later total of the same calls), never below
    /// zero.
    pub fn since(&self, earlier: &Usage) -> Usage {
        Usage {
            input_tokens: self.input_tokens.saturating_sub(earlier.input_tokens),
            output_tokens: self.output_tokens.saturating_sub(earlier.output_tokens),
            cache_read_tokens: self
                .cache_read_tokens
                .saturating_sub(earlier.cache_read_tokens),
            cache_write_tokens: self
                .cache_write_tokens
                .saturating_sub(earlier.cache_write_tokens),
            reasoning_tokens: self
                .reasoning_tokens
                .saturating_sub(earlier.reasoning_tokens),
            cost_usd: (self.cost_usd - earlier.cost_usd).max(0.0),
            estimated: self.estimated,
        }
    }

    /// Adds another call's usage to this total.
    pub fn add(&mut self, other: &Usage) {
        self.input_tokens = self.input_tokens.saturating_add(other.input_tokens);
        self.output_tokens = self.output_tokens.saturating_add(other.output_tokens);
        self.cache_read_tokens = self
            .cache_read_tokens
            .saturating_add(other.cache_read_tokens);
        self.cache_write_tokens = self
            .cache_write_tokens
            .saturating_add(other.cache_write_tokens);
        self.reasoning_tokens = self.reasoning_tokens.saturating_add(other.reasoning_tokens);
        // A cost from outside that is not a finite, positive number adds nothing.
        if other.cost_usd.is_finite() && other.cost_usd > 0.0 {
            self.cost_usd += other.cost_usd;
        }
        self.estimated |= other.estimated;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_the_contracts() {
        let b = Budget::default();
        assert_eq!(
            (
                b.max_steps,
                b.max_tool_calls,
                b.max_retries_per_tool,
                b.max_repeated_plan,
                b.max_invalid_decisions,
                b.max_denials
            ),
            (32, 128, 2, 2, 2, 3)
        );
        assert_eq!(b.max_wall_time_ms, None);
        let partial: Budget = serde_json::from_str(r#"{"max_steps": 5}"#).unwrap();
        assert_eq!(partial.max_steps, 5);
        assert_eq!(partial.max_tool_calls, 128);
    }

    #[test]
    fn cached_tokens_are_part_of_the_prompt_and_add_up() {
        let call = Usage::tokens(1_000, 10).with_cache(600, 300);
        assert_eq!(call.uncached_input_tokens(), 100);
        // A provider cannot report more cached tokens than the prompt has.
        let odd = Usage::tokens(100, 0).with_cache(80, 80);
        assert_eq!((odd.cache_read_tokens, odd.cache_write_tokens), (80, 20));
        assert_eq!(odd.uncached_input_tokens(), 0);
        let mut total = Usage::default();
        total.add(&call);
        total.add(&odd);
        total.add(&Usage::tokens(0, 50).with_reasoning(80));
        assert_eq!(total.reasoning_tokens, 50, "no more than the output");
        assert_eq!(
            (
                total.input_tokens,
                total.cache_read_tokens,
                total.cache_write_tokens
            ),
            (1_100, 680, 320)
        );
        // Logs written before caches were counted read the same, and write the same.
        let old: Usage = serde_json::from_str(r#"{"input_tokens":5,"output_tokens":1}"#).unwrap();
        assert_eq!(old, Usage::tokens(5, 1));
        assert_eq!(
            serde_json::to_string(&old).unwrap(),
            r#"{"input_tokens":5,"output_tokens":1}"#
        );
        assert_eq!(
            serde_json::to_string(&call).unwrap(),
            r#"{"input_tokens":1000,"output_tokens":10,"cache_read_tokens":600,"cache_write_tokens":300}"#
        );
    }

    #[test]
    fn only_finite_positive_costs_add_up() {
        let mut total = Usage::default();
        let cost = |c: f64| Usage {
            cost_usd: c,
            ..Usage::tokens(1, 1)
        };
        total.add(&cost(0.25));
        for bad in [f64::INFINITY, f64::NAN, -1.0, f64::NEG_INFINITY] {
            total.add(&cost(bad));
        }
        assert_eq!(
            total.cost_usd, 0.25,
            "a price from outside cannot lower or poison it"
        );
        assert_eq!(total.total_tokens(), 10);
        let mut full = Usage::tokens(u64::MAX, 0);
        full.add(&Usage::tokens(5, 0));
        assert_eq!(full.input_tokens, u64::MAX, "saturates");
    }
}
