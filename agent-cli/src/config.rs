//! `agent.toml`: the settings a project keeps next to its code. Flags override it.

use std::path::{Path, PathBuf};

use serde::Deserialize;

/// The file's contents.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// `--model`.
    pub model: Option<String>,
    /// `--store`.
    pub store: Option<PathBuf>,
    /// `--workspace`.
    pub workspace: Option<PathBuf>,
    /// `--mcp-config`.
    pub mcp_config: Option<PathBuf>,
    /// `--max-steps`.
    pub max_steps: Option<u32>,
    /// `--max-tool-calls`.
    pub max_tool_calls: Option<u32>,
    /// `--timeout`, in seconds.
    pub timeout: Option<f64>,
    /// The model's context window in tokens, when the built-in table is wrong for it.
    pub context_window: Option<usize>,
    /// Share of the window past which the history is compacted (default 0.8).
    pub compact_at: Option<f64>,
    /// Turns whose tool results are shown whole (default 2).
    pub recent_result_turns: Option<usize>,
    /// Characters older results may take, whole, before they are masked together
    /// (default 12,000; 0 masks each as soon as it is older than `recent_result_turns`).
    pub unmasked_result_chars: Option<usize>,
    /// `--base-url`.
    pub base_url: Option<String>,
    /// Token budget (input + output, all model calls).
    pub max_tokens: Option<u64>,
    /// Money budget in US dollars (needs a price for the model).
    pub max_cost_usd: Option<f64>,
    /// Whether to stream model replies (default true).
    pub stream: Option<bool>,
    /// Seconds a model's answer may take to begin (default 600): a local model reading a
    /// long prompt on a CPU, or a model that thinks long first, may need more.
    pub answer_timeout_secs: Option<f64>,
    /// Seconds a model's answer may stay silent once it has begun (default 120).
    pub idle_timeout_secs: Option<f64>,
    /// Thinking before each decision (Anthropic): a number of tokens the model may think
    /// for (at least 1024; refused by Claude Opus 4.7 and later), or `"adaptive"` (the
    /// model decides; the current models' way).
    pub thinking: Option<agent_providers::Thinking>,
    /// How much the model should reason and write (`low`, `medium`, `high`, ...): sent to
    /// every provider in its words.
    pub effort: Option<agent_providers::Effort>,
    /// Output tokens a model call may write at most (the provider's own limit otherwise;
    /// Anthropic's 8192).
    pub max_output_tokens: Option<u32>,
    /// Whether to mark the prompt's stable parts for the provider's prompt cache (default
    /// true; Anthropic caches only what is marked, OpenAI caches repeated prefixes itself).
    pub prompt_cache: Option<bool>,
    /// `--sub-agents`.
    pub sub_agents: Option<bool>,
    /// `--shell-env` names (before the flags' own).
    #[serde(default)]
    pub shell_env: Vec<String>,
    /// `--sandbox`.
    pub sandbox: Option<bool>,
    /// `--sandbox-network`.
    pub sandbox_network: Option<bool>,
    /// `--sandbox-read-only`.
    pub sandbox_read_only: Option<bool>,
    /// `--sandbox-write` directories (relative to the file; before the flags' own).
    #[serde(default)]
    pub sandbox_write: Vec<PathBuf>,
    /// `--sandbox-hide` places (relative to the file; before the flags' own).
    #[serde(default)]
    pub sandbox_hide: Vec<PathBuf>,
    /// `--sandbox-show` places (relative to the file; before the flags' own).
    #[serde(default)]
    pub sandbox_show: Vec<PathBuf>,
    /// `--answer-schema` (relative to the file).
    pub answer_schema: Option<PathBuf>,
    /// `--check` commands (before the flags' own).
    #[serde(default)]
    pub checks: Vec<String>,
    /// Seconds each check command may take (default 120).
    pub check_timeout_secs: Option<f64>,
    /// Retries of model calls.
    pub retry: Option<RetryConfig>,
    /// Prices per million tokens, by model name.
    #[serde(default)]
    pub prices: std::collections::BTreeMap<String, PriceConfig>,
    /// Policy rules.
    #[serde(default)]
    pub policy: PolicyConfig,
    /// Hooks.
    #[serde(default)]
    pub hooks: HooksConfig,
}

/// `[retry]`: how model calls are retried (408, 409, 429, 5xx, cut streams).
#[derive(Debug, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct RetryConfig {
    /// Attempts in all (default 4).
    pub max_attempts: Option<u32>,
    /// First backoff in milliseconds (default 500; doubles each time).
    pub base_ms: Option<u64>,
    /// Longest total wait in seconds (default 60).
    pub max_total_wait_secs: Option<u64>,
}

/// `[prices."MODEL"]`: US dollars per million tokens (also how a queued run records them).
#[derive(Clone, Debug, PartialEq, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct PriceConfig {
    /// Input tokens.
    pub input: f64,
    /// Output tokens.
    pub output: f64,
    /// Input tokens read from the provider's prompt cache (default: the input price).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_read: Option<f64>,
    /// Input tokens written to the provider's prompt cache (default: 1.25 times the input
    /// price).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_write: Option<f64>,
}

impl PriceConfig {
    /// The price the model is given.
    pub fn price(&self) -> agent_providers::Price {
        agent_providers::Price {
            cache_read_per_million: self.cache_read,
            cache_write_per_million: self.cache_write,
            ..agent_providers::Price::new(self.input, self.output)
        }
    }

    /// A price as written.
    pub fn of(price: &agent_providers::Price) -> PriceConfig {
        PriceConfig {
            input: price.input_per_million,
            output: price.output_per_million,
            cache_read: price.cache_read_per_million,
            cache_write: price.cache_write_per_million,
        }
    }
}

/// `[policy]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicyConfig {
    /// Allowed without asking.
    #[serde(default)]
    pub allow: Vec<String>,
    /// Asked.
    #[serde(default)]
    pub ask: Vec<String>,
    /// Denied.
    #[serde(default)]
    pub deny: Vec<String>,
}

/// `[hooks]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HooksConfig {
    /// `[[hooks.pre_tool_use]]`.
    #[serde(default)]
    pub pre_tool_use: Vec<HookConfig>,
    /// `[[hooks.post_tool_use]]`.
    #[serde(default)]
    pub post_tool_use: Vec<HookConfig>,
}

/// One external hook.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HookConfig {
    /// The command line (`bash -c`).
    pub command: String,
    /// Tool names it applies to, a regular expression (default: all).
    pub matcher: Option<String>,
    /// Longest time it may take (default 10 s).
    pub timeout_secs: Option<f64>,
}

/// The settings file looked for in the working directory when `--config` names none.
pub const DEFAULT_FILE: &str = "agent.toml";

/// Reads `explicit`, or `./agent.toml` when it exists; `None` when there is no file. With
/// the file, the SHA-256 of the very bytes parsed, which its trust is judged by.
pub fn load(explicit: Option<&Path>) -> Result<Option<(PathBuf, Config, String)>, String> {
    let path = match explicit {
        Some(p) => p.to_path_buf(),
        None => {
            let default = PathBuf::from(DEFAULT_FILE);
            if !default.exists() {
                return Ok(None);
            }
            default
        }
    };
    let bytes =
        crate::trust::read_once(&path, explicit.is_some()).map_err(|e| format!("--config {e}"))?;
    let text = std::str::from_utf8(&bytes).map_err(|e| {
        format!(
            "--config {}: not UTF-8 text ({e}); save it as UTF-8",
            path.display()
        )
    })?;
    let config = parse(text).map_err(|problem| format!("{}{problem}", path.display()))?;
    Ok(Some((path, config, agent_core::sha256_hex(&bytes))))
}

/// What is wrong with the TOML `text`, in one line that can follow the file's name:
/// ` line N: message`, or `: message` when the parser names no place.
pub fn toml_problem(text: &str, e: &toml::de::Error) -> String {
    let line = e.span().map(|s| {
        text.get(..s.start.min(text.len()))
            .map_or(0, |t| t.matches('\n').count())
            + 1
    });
    let message = e.message().replace('\n', " ");
    match line {
        Some(line) => {
            // The key whose value is wrong, when the line is a plain `key = value`: a value's
            // complaint ("invalid value: string \"lots\"") does not say which setting.
            let about_a_value =
                message.starts_with("invalid ") || message.starts_with("unknown variant");
            let key = about_a_value
                .then(|| text.lines())
                .into_iter()
                .flatten()
                .nth(line - 1)
                .and_then(|l| l.split_once('='))
                .map(|(key, _)| key.trim())
                .filter(|key| {
                    !key.is_empty()
                        && key
                            .chars()
                            .all(|c| c.is_ascii_alphanumeric() || "_-.".contains(c))
                        && !message.contains(&format!("`{key}`"))
                });
            match key {
                Some(key) => format!(" line {line}, {key}: {message}"),
                None => format!(" line {line}: {message}"),
            }
        }
        None => format!(": {message}"),
    }
}

/// Parses and validates the text of an `agent.toml`; the error is one line, starting with
/// ` line N: ` or `: ` so that it can follow the file's name.
pub fn parse(text: &str) -> Result<Config, String> {
    let config: Config = toml::from_str(text).map_err(|e| toml_problem(text, &e))?;
    config
        .validate()
        .map_err(|problem| format!(": {problem}"))?;
    Ok(config)
}

/// Longest time any setting may name: a day for a hook, a year for a run.
const DAY_SECS: f64 = 86_400.0;
const YEAR_SECS: f64 = 365.0 * DAY_SECS;

/// `value` as a number of seconds within `(0, max]`, or why not, naming `key`.
pub fn check_seconds(key: &str, value: f64, max: f64) -> Result<f64, String> {
    if value.is_finite() && value > 0.0 && value <= max {
        Ok(value)
    } else {
        Err(format!(
            "{key} = {value:?}: give a number of seconds above 0 and at most {max}"
        ))
    }
}

impl Config {
    /// The keys that say how a model is called and what its tokens cost, as a settings file
    /// of their own: `stream`, the timeouts, `thinking`, `effort`, `max_output_tokens`,
    /// `prompt_cache`, `context_window`, `[retry]` and `[prices]`. What an evaluation's
    /// trials take from the settings it was started with: facts about the models, not about
    /// the cases (whose policy, budgets and tools are their own).
    pub fn model_calls(&self) -> Result<String, String> {
        let mut table = toml::Table::new();
        let mut put = |key: &str, value: Result<toml::Value, toml::ser::Error>| match value {
            Ok(value) => {
                table.insert(key.to_owned(), value);
                Ok(())
            }
            Err(e) => Err(format!("{key}: {e}")),
        };
        if let Some(v) = self.stream {
            put("stream", Ok(v.into()))?;
        }
        if let Some(v) = self.answer_timeout_secs {
            put("answer_timeout_secs", Ok(v.into()))?;
        }
        if let Some(v) = self.idle_timeout_secs {
            put("idle_timeout_secs", Ok(v.into()))?;
        }
        if let Some(v) = &self.thinking {
            put("thinking", toml::Value::try_from(v))?;
        }
        if let Some(v) = &self.effort {
            put("effort", toml::Value::try_from(v))?;
        }
        if let Some(v) = self.max_output_tokens {
            put("max_output_tokens", Ok(i64::from(v).into()))?;
        }
        if let Some(v) = self.prompt_cache {
            put("prompt_cache", Ok(v.into()))?;
        }
        if let Some(v) = self.context_window {
            put("context_window", toml::Value::try_from(v))?;
        }
        if let Some(v) = &self.retry {
            put("retry", toml::Value::try_from(v))?;
        }
        if !self.prices.is_empty() {
            put("prices", toml::Value::try_from(&self.prices))?;
        }
        toml::to_string(&table).map_err(|e| e.to_string())
    }

    /// Every number checked: a value that makes no sense is an error naming its key.
    pub fn validate(&self) -> Result<(), String> {
        if self.max_steps == Some(0) {
            return Err("max_steps = 0: give at least 1".into());
        }
        if self.max_tokens == Some(0) {
            return Err("max_tokens = 0: give at least 1 (or leave it out for no limit)".into());
        }
        if let Some(t) = self.timeout {
            check_seconds("timeout", t, YEAR_SECS)?;
        }
        if let Some(t) = self.check_timeout_secs {
            check_seconds("check_timeout_secs", t, DAY_SECS)?;
        }
        if let Some(t) = self.answer_timeout_secs {
            check_seconds("answer_timeout_secs", t, DAY_SECS)?;
        }
        if let Some(t) = self.idle_timeout_secs {
            check_seconds("idle_timeout_secs", t, DAY_SECS)?;
        }
        if let Some(w) = self.context_window
            && w < 1_000
        {
            return Err(format!("context_window = {w}: give at least 1000 tokens"));
        }
        if self.max_output_tokens == Some(0) {
            return Err(
                "max_output_tokens = 0: give the output tokens a model call may write, at least 1"
                    .to_owned(),
            );
        }
        if let Some(agent_providers::Thinking::Budget(t)) = self.thinking
            && t < 1_024
        {
            return Err(format!(
                "thinking = {t}: give at least 1024 tokens (the provider's least budget), \"adaptive\", or leave it out"
            ));
        }
        if let Some(c) = self.compact_at
            && !(c.is_finite() && c > 0.0 && c <= 1.0)
        {
            return Err(format!(
                "compact_at = {c:?}: give a share of the window above 0 and at most 1 (e.g. 0.8)"
            ));
        }
        if let Some(usd) = self.max_cost_usd
            && !(usd.is_finite() && usd > 0.0)
        {
            return Err(format!(
                "max_cost_usd = {usd:?}: give a positive number of dollars"
            ));
        }
        if let Some(r) = &self.retry
            && r.max_attempts == Some(0)
        {
            return Err("retry.max_attempts = 0: give at least 1".into());
        }
        for (model, p) in &self.prices {
            let rates = [
                ("input", Some(p.input)),
                ("output", Some(p.output)),
                ("cache_read", p.cache_read),
                ("cache_write", p.cache_write),
            ];
            for (what, v) in rates.into_iter().filter_map(|(w, v)| Some((w, v?))) {
                if !(v.is_finite() && v >= 0.0) {
                    return Err(format!(
                        "prices.\"{model}\".{what} = {v:?}: give dollars per million tokens, 0 or more"
                    ));
                }
            }
        }
        for h in self
            .hooks
            .pre_tool_use
            .iter()
            .chain(&self.hooks.post_tool_use)
        {
            if let Some(t) = h.timeout_secs {
                check_seconds(&format!("hook {:?} timeout_secs", h.command), t, DAY_SECS)?;
            }
            if let Some(m) = &h.matcher
                && let Err(e) = regex::Regex::new(m)
            {
                let first = e.to_string();
                let why = first.lines().last().unwrap_or("").trim().to_owned();
                return Err(format!(
                    "hook {:?} matcher {m:?} is not a regular expression ({why})",
                    h.command
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An evaluation's trials get what says how models are called and priced, whole and
    /// as written, and nothing of the policy, budgets or tools the file also holds.
    #[test]
    fn the_model_calls_are_the_files_model_keys_alone() {
        let file = parse(
            "max_steps = 3\nstream = false\nanswer_timeout_secs = 900.5\nthinking = \"adaptive\"\n\
             effort = \"low\"\nmax_output_tokens = 77\nprompt_cache = false\ncontext_window = 32000\n\
             max_cost_usd = 1.5\nshell_env = [\"GH_TOKEN\"]\n\
             [retry]\nmax_attempts = 2\n\
             [prices.\"gpt-4o\"]\ninput = 2.5\noutput = 10.0\ncache_read = 1.25\n\
             [policy]\nallow = [\"shell\"]\n",
        )
        .unwrap();
        let calls = parse(&file.model_calls().unwrap()).unwrap();
        assert_eq!(calls.stream, Some(false));
        assert_eq!(calls.answer_timeout_secs, Some(900.5));
        assert_eq!(calls.thinking, file.thinking);
        assert_eq!(calls.effort, file.effort);
        assert_eq!(calls.max_output_tokens, Some(77));
        assert_eq!(calls.prompt_cache, Some(false));
        assert_eq!(calls.context_window, Some(32000));
        assert_eq!(calls.retry.and_then(|r| r.max_attempts), Some(2));
        assert_eq!(calls.prices, file.prices);
        assert_eq!(
            (calls.max_steps, calls.max_cost_usd, calls.shell_env.len()),
            (None, None, 0)
        );
        assert!(calls.policy.allow.is_empty());
        assert_eq!(parse("").unwrap().model_calls().unwrap(), "");
    }
}
