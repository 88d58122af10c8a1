//! The HTTP transport: one streamed request per model call, retried with backoff when the
//! failure is worth retrying, never when it is not.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use agent_core::{ModelReply, Retry};
use async_trait::async_trait;
use eventsource_stream::{EventStreamError, Eventsource};
use futures::StreamExt;
use serde_json::{Value, json};

use crate::wire::{self, Assembled};
use crate::{Effort, Model, ModelRequest, ProviderError, Thinking};

/// Which wire format a server speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Dialect {
    /// OpenAI Chat Completions (also Ollama, vLLM, llama.cpp, LM Studio). OpenAI's own
    /// (provider `openai`) is left for its Responses API when it says a model's calls with
    /// tools go there.
    OpenAi,
    /// Anthropic Messages.
    Anthropic,
    /// OpenAI Responses (`/responses`): reasoning kept across turns.
    OpenAiResponses,
    /// Ollama's own API (`/api/chat`, newline-delimited JSON): the window the model is
    /// loaded with is sent (`options.num_ctx`), which its OpenAI-compatible endpoint
    /// cannot take.
    Ollama,
}

/// When and how long to retry.
#[derive(Clone, Debug)]
pub struct RetryPolicy {
    /// Attempts in all, the first included.
    pub max_attempts: u32,
    /// The first backoff; each next one doubles.
    pub base: Duration,
    /// Longest single wait (a longer `Retry-After` is cut to it).
    pub max_wait: Duration,
    /// Longest total wait over all retries of one call.
    pub max_total_wait: Duration,
    /// Whether to randomize waits (between half and all of the backoff).
    pub jitter: bool,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_attempts: 4,
            base: Duration::from_millis(500),
            max_wait: Duration::from_secs(30),
            max_total_wait: Duration::from_secs(60),
            jitter: true,
        }
    }
}

/// Price per million tokens, in US dollars.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Price {
    /// Input tokens.
    pub input_per_million: f64,
    /// Output tokens.
    pub output_per_million: f64,
    /// Input tokens read from the provider's prompt cache; unknown, the input price (no
    /// discount is assumed).
    pub cache_read_per_million: Option<f64>,
    /// Input tokens written to the provider's prompt cache; unknown,
    /// [`Price::DEFAULT_CACHE_WRITE_FACTOR`] times the input price.
    pub cache_write_per_million: Option<f64>,
}

impl Price {
    /// What a cache write costs against an uncached input token when no price is given:
    /// Anthropic's surcharge for its five-minute cache and OpenAI's from GPT-5.6 on, the
    /// highest a provider reports per written token, so that a budget is never
    /// underestimated.
    pub const DEFAULT_CACHE_WRITE_FACTOR: f64 = 1.25;

    /// A price of `input` and `output` dollars per million tokens, caches at the defaults.
    pub fn new(input: f64, output: f64) -> Price {
        Price {
            input_per_million: input,
            output_per_million: output,
            cache_read_per_million: None,
            cache_write_per_million: None,
        }
    }

    /// The least a prompt of `input_tokens` tokens can cost, in US dollars: every token read
    /// from the provider's cache, when that is cheaper than an uncached one.
    pub fn least_cost(&self, input_tokens: u64) -> f64 {
        let read = self
            .cache_read_per_million
            .unwrap_or(self.input_per_million);
        input_tokens as f64 * read.min(self.input_per_million) / 1e6
    }

    /// The cost of one call's `usage`, in US dollars.
    pub fn cost(&self, usage: &agent_core::Usage) -> f64 {
        let read = self
            .cache_read_per_million
            .unwrap_or(self.input_per_million);
        let write = self
            .cache_write_per_million
            .unwrap_or(self.input_per_million * Self::DEFAULT_CACHE_WRITE_FACTOR);
        (usage.uncached_input_tokens() as f64 * self.input_per_million
            + usage.cache_read_tokens as f64 * read
            + usage.cache_write_tokens as f64 * write
            + usage.output_tokens as f64 * self.output_per_million)
            / 1e6
    }
}

/// An output limit every model of the providers takes: a call's own limit above it is not
/// sent to a model with no cap configured (OpenAI refuses a `max_completion_tokens` past the
/// model's maximum, which differs from model to model).
pub const SURELY_TAKEN_OUTPUT_CAP: u32 = 4_096;

/// Receives answer text as it is written.
pub type TextSink = Arc<dyn Fn(&str) + Send + Sync>;

/// A model behind an HTTP API.
pub struct HttpModel {
    dialect: Dialect,
    provider: String,
    model: String,
    base_url: String,
    api_key: Option<String>,
    client: reqwest::Client,
    retry: RetryPolicy,
    price: Option<Price>,
    idle_timeout: Duration,
    answer_timeout: Duration,
    max_tokens: u32,
    /// The output cap asked of every dialect, when one was given.
    max_output: Option<u32>,
    stream: bool,
    prompt_cache: bool,
    thinking: Option<Thinking>,
    effort: Option<Effort>,
    on_text: Option<TextSink>,
    max_response_bytes: usize,
    /// The window the model works in, in tokens: sent to Ollama as the one to load the
    /// model with.
    context_window: Option<usize>,
    /// OpenAI said its Chat Completions will not take this model's calls with tools (its
    /// reasoning models from GPT-5.4 on): it is asked through the Responses API instead.
    responses_instead: std::sync::atomic::AtomicBool,
}

impl std::fmt::Debug for HttpModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the key.
        f.debug_struct("HttpModel")
            .field("provider", &self.provider)
            .field("model", &self.model)
            .field("base_url", &self.base_url)
            .finish_non_exhaustive()
    }
}

/// The TLS settings of one reqwest client (`ClientBuilder::tls_backend_preconfigured`):
/// rustls with ring and the platform's certificate verifier (as reqwest would choose),
/// without installing anything process-wide, so an application embedding this crate keeps
/// its own TLS choices.
pub fn tls() -> Result<rustls::ClientConfig, ProviderError> {
    use rustls_platform_verifier::BuilderVerifierExt as _;
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let fail = |e: rustls::Error| ProviderError::Setup(format!("cannot set up TLS: {e}"));
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(fail)?
        .with_platform_verifier()
        .map_err(fail)?
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

impl HttpModel {
    /// A model of `provider` (`openai`, `anthropic`, `openai-compat`) at `base_url`.
    pub fn new(
        dialect: Dialect,
        provider: &str,
        model: &str,
        base_url: &str,
        api_key: Option<String>,
    ) -> Result<HttpModel, ProviderError> {
        let client = reqwest::Client::builder()
            .tls_backend_preconfigured(tls()?)
            .connect_timeout(Duration::from_secs(10))
            // A request carries the API key and the whole prompt: it goes to the base URL
            // and nowhere else (see `attempt`). The providers' own clients do not follow
            // redirects either.
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| ProviderError::Setup(format!("cannot build the HTTP client: {e}")))?;
        Ok(HttpModel {
            dialect,
            provider: provider.to_owned(),
            model: model.to_owned(),
            base_url: base_url.trim_end_matches('/').to_owned(),
            api_key,
            client,
            retry: RetryPolicy::default(),
            price: None,
            idle_timeout: Duration::from_secs(120),
            answer_timeout: Duration::from_secs(600),
            max_tokens: wire::anthropic::DEFAULT_MAX_TOKENS,
            max_output: None,
            stream: true,
            prompt_cache: true,
            thinking: None,
            effort: None,
            on_text: None,
            max_response_bytes: DEFAULT_MAX_RESPONSE_BYTES,
            responses_instead: std::sync::atomic::AtomicBool::new(false),
            context_window: None,
        })
    }

    /// The window, in tokens, the run's prompts are kept within. Ollama is asked to load
    /// the model with it (`options.num_ctx`): left to itself it loads it with its own
    /// default (4,096 tokens unless `OLLAMA_CONTEXT_LENGTH` says) and drops the start of a
    /// longer prompt (the system text and the goal first) without a word. Other providers
    /// have the window they have, and are sent nothing.
    pub fn with_context_window(mut self, tokens: usize) -> Self {
        self.context_window = Some(tokens);
        self
    }

    /// Retries by `policy`.
    pub fn with_retry(mut self, policy: RetryPolicy) -> Self {
        self.retry = policy;
        self
    }

    /// Prices usage, so the cost budget applies.
    pub fn with_price(mut self, price: Price) -> Self {
        self.price = Some(price);
        self
    }

    /// Gives up on a server silent for this long once its answer has begun (retryable):
    /// between two events of its stream once one brought a piece of the answer (text,
    /// reasoning, a call), or two pieces of a body. Two minutes by default.
    /// Keep-alive pings, and pieces that add nothing to the answer (an empty delta), keep a
    /// stream alive for the answer timeout at most.
    pub fn with_idle_timeout(mut self, timeout: Duration) -> Self {
        self.idle_timeout = timeout;
        self
    }

    /// Gives up on an answer that has not begun after this long (retryable). A whole answer
    /// (`with_streaming(false)`) is written before it is sent, a local server may load the
    /// model before it streams anything, and a reasoning model may stream nothing but the
    /// response's headers while it thinks: ten minutes by default, as the providers' own
    /// clients wait. It is never shorter than the idle timeout.
    pub fn with_answer_timeout(mut self, timeout: Duration) -> Self {
        self.answer_timeout = timeout;
        self
    }

    /// Whether to mark the prompt's stable parts for the provider's prompt cache (on by
    /// default). Anthropic caches only what is marked (`cache_control` breakpoints); OpenAI
    /// caches a repeated prefix by itself, and is sent a `prompt_cache_key` made from the
    /// call's [`ModelRequest::cache_key`], so that the calls of a run go to where their
    /// prefix is cached rather than share one place with every run of the same system text
    /// and tools.
    pub fn with_prompt_cache(mut self, cache: bool) -> Self {
        self.prompt_cache = cache;
        self
    }

    /// Anthropic's thinking before each decision: up to a budget of tokens (at least
    /// [`wire::anthropic::MIN_THINKING_TOKENS`]; refused by Claude Opus 4.7 and later), or
    /// adaptive (the current models' way; the output limit is then
    /// [`wire::anthropic::DEFAULT_MAX_TOKENS_ADAPTIVE`] unless one is given). The thinking is
    /// recorded with each decision and sent back with the tool results of its turn, as the
    /// API requires. The OpenAI dialects have no such setting, and ignore it.
    pub fn with_thinking(mut self, thinking: Option<Thinking>) -> Self {
        self.thinking = thinking;
        self
    }

    /// How much the model should reason and write, in each dialect's words: Anthropic's
    /// `output_config.effort`, OpenAI's `reasoning_effort`, the Responses API's
    /// `reasoning.effort`. Not sent when not given (the provider's default).
    pub fn with_effort(mut self, effort: Option<Effort>) -> Self {
        self.effort = effort;
        self
    }

    /// Asks for at most `tokens` of output a call (reasoning included): OpenAI's
    /// `max_completion_tokens`, an OpenAI-compatible server's `max_tokens`, the Responses
    /// API's `max_output_tokens`, Anthropic's `max_tokens` (which is
    /// [`wire::anthropic::DEFAULT_MAX_TOKENS`] otherwise; the others have the model's own
    /// limit). A reply cut there ends `length` and is never taken as a final answer. What
    /// one call can cost is then bounded by its prompt and this.
    pub fn with_max_output_tokens(mut self, tokens: u32) -> Self {
        let tokens = tokens.max(1);
        self.max_output = Some(tokens);
        self.max_tokens = tokens;
        self
    }

    /// Asks for whole responses instead of streams (some servers stream badly).
    pub fn with_streaming(mut self, stream: bool) -> Self {
        self.stream = stream;
        self
    }

    /// Accepts responses up to `bytes` (default [`DEFAULT_MAX_RESPONSE_BYTES`]); a longer
    /// one is cut there and the call fails as undecodable (not retried).
    pub fn with_max_response_bytes(mut self, bytes: usize) -> Self {
        self.max_response_bytes = bytes.max(1);
        self
    }

    /// Calls `sink` with answer text as it streams in.
    pub fn with_text_sink(mut self, sink: TextSink) -> Self {
        self.on_text = Some(sink);
        self
    }

    /// The dialect the next call is made in: this model's, unless OpenAI asked for its
    /// Responses API instead.
    fn dialect(&self) -> Dialect {
        if self
            .responses_instead
            .load(std::sync::atomic::Ordering::Relaxed)
        {
            Dialect::OpenAiResponses
        } else {
            self.dialect
        }
    }

    /// Whether a refusal says that OpenAI's Chat Completions does not take this model's
    /// calls with tools and reasoning, and to use the Responses API: "Function tools with
    /// reasoning_effort are not supported for gpt-5.4 in /v1/chat/completions. Please use
    /// /v1/responses instead." (GPT-5.6 refuses them without a `reasoning_effort` too.)
    /// Only OpenAI's own API is asked elsewhere on its word.
    fn asks_for_responses(&self, dialect: Dialect, status: u16, body: &str) -> bool {
        dialect == Dialect::OpenAi
            && self.provider == "openai"
            && status == 400
            && body.contains("/v1/responses")
            && body.contains("reasoning_effort")
    }

    fn endpoint(&self, dialect: Dialect) -> String {
        match dialect {
            Dialect::OpenAi => format!("{}/chat/completions", self.base_url),
            Dialect::OpenAiResponses => format!("{}/responses", self.base_url),
            Dialect::Anthropic => format!("{}/v1/messages", self.base_url),
            Dialect::Ollama => format!("{}/api/chat", self.base_url),
        }
    }

    /// The error an HTTP status names. The body is the server's (untrusted): a bounded
    /// excerpt of it goes into the message.
    fn refusal(&self, status: u16, body: &str, retry_after: Option<Duration>) -> ProviderError {
        let body: String = body.chars().take(300).collect();
        let provider = &self.provider;
        match status {
            429 if body.contains("insufficient_quota") => ProviderError::BadRequest {
                message: format!("{provider} says the account is out of quota (HTTP 429): {body}"),
            },
            // Ollama cannot load the model with this window in the memory it has: asking
            // again changes nothing.
            500 if body.contains("requires more system memory") => ProviderError::BadRequest {
                message: format!(
                    "{provider} has not the memory to load the model (HTTP 500): {body}"
                ),
            },
            429 => ProviderError::RateLimited {
                message: format!("{provider} is limiting requests (HTTP 429): {body}"),
                retry_after,
            },
            401 | 403 => ProviderError::Auth {
                message: format!("{provider} refused the API key (HTTP {status}): {body}"),
            },
            404 => ProviderError::NotFound {
                message: format!(
                    "{provider} has no model {:?} at {} (HTTP 404): {body}",
                    self.model, self.base_url
                ),
            },
            408 | 409 | 500..=599 => ProviderError::Server {
                message: format!("HTTP {status}: {body}"),
                retry_after,
            },
            _ => ProviderError::BadRequest {
                message: format!("{provider} rejected the request (HTTP {status}): {body}"),
            },
        }
    }

    /// One attempt of a call in `dialect`, whose request is `body`.
    async fn attempt(
        &self,
        dialect: Dialect,
        body: &str,
        spent: &mut Spent,
    ) -> Result<Assembled, ProviderError> {
        let mut request = self
            .client
            .post(self.endpoint(dialect))
            .header("content-type", "application/json")
            .body(body.to_owned());
        match (dialect, &self.api_key) {
            // Ollama needs none; its cloud and the proxies in front of it take a bearer.
            (Dialect::OpenAi | Dialect::OpenAiResponses | Dialect::Ollama, Some(key)) => {
                request = request.bearer_auth(key);
            }
            (Dialect::Anthropic, Some(key)) => request = request.header("x-api-key", key),
            (_, None) => {}
        }
        if dialect == Dialect::Anthropic {
            request = request.header("anthropic-version", "2023-06-01");
        }
        let silent_for = |wait: Duration| {
            ProviderError::Transport(format!(
                "{} was silent for {} s",
                self.provider,
                wait.as_secs_f64()
            ))
        };
        let silent = || silent_for(self.idle_timeout);
        // Before anything: a whole answer is written first, and a local server may load
        // the model before it streams a byte.
        let first = self.answer_timeout.max(self.idle_timeout);
        let response = tokio::time::timeout(first, request.send())
            .await
            .map_err(|_| silent_for(first))?
            .map_err(|e| ProviderError::Transport(format!("connection error: {}", why(&e))))?;
        let status = response.status().as_u16();
        spent.accepted = (200..300).contains(&status);
        if (300..400).contains(&status) {
            // Followed, it would send the key (Anthropic's `x-api-key` is no header a
            // client knows to drop) and the prompt wherever the server points.
            let location = response
                .headers()
                .get(reqwest::header::LOCATION)
                .map(|l| {
                    String::from_utf8_lossy(l.as_bytes())
                        .chars()
                        .take(300)
                        .collect()
                })
                .unwrap_or_else(|| "nowhere".to_owned());
            return Err(ProviderError::BadRequest {
                message: format!(
                    "{} answered HTTP {status}, sending the request to {location:?}; agent does \
                     not follow redirects (a request carries the API key and the prompt): if \
                     that is where the model is served, make it the base URL",
                    self.provider
                ),
            });
        }
        if !(200..300).contains(&status) {
            let retry_after = retry_after(response.headers());
            // Only its beginning is shown: the rest is not read at all.
            let (head, _) = read_at_most(response, MAX_ERROR_BODY_BYTES, self.idle_timeout).await;
            let head = head.unwrap_or_default();
            let text = String::from_utf8_lossy(&head);
            if self.asks_for_responses(dialect, status, &text) {
                tracing::info!(
                    model = %self.model,
                    "OpenAI's Chat Completions takes no tools with this model's reasoning: \
                     asked through the Responses API from now on"
                );
                self.responses_instead
                    .store(true, std::sync::atomic::Ordering::Relaxed);
            }
            return Err(self.refusal(status, &text, retry_after));
        }
        if !self.stream {
            let (body, complete) =
                read_at_most(response, self.max_response_bytes, self.idle_timeout).await;
            let body = body.map_err(|e| match e {
                Unread::Silent => silent(),
                Unread::Broke(e) => {
                    ProviderError::Transport(format!("the response broke: {}", why(&e)))
                }
            })?;
            if !complete {
                return Err(too_large(&self.provider, self.max_response_bytes));
            }
            let text = String::from_utf8_lossy(&body);
            let body: Value = serde_json::from_str(&text).map_err(|e| {
                ProviderError::Decode(format!(
                    "{} answered something that is not JSON: {e}",
                    self.provider
                ))
            })?;
            return Ok(match dialect {
                Dialect::OpenAi => wire::openai::parse_response(&body),
                Dialect::OpenAiResponses => wire::responses::parse_response(&body),
                Dialect::Anthropic => wire::anthropic::parse_response(&body),
                Dialect::Ollama => wire::ollama::parse_response(&body),
            });
        }
        // The stream is cut, whatever its events look like, once it passed the bound: a
        // server that never ends an event would otherwise grow one without limit.
        let limit = self.max_response_bytes;
        let bytes = response.bytes_stream().scan(0usize, move |seen, chunk| {
            let item = match chunk {
                Ok(bytes) => {
                    *seen += bytes.len();
                    if *seen > limit {
                        Err(Cut::TooLarge)
                    } else {
                        Ok(bytes)
                    }
                }
                Err(e) => Err(Cut::Transport(e)),
            };
            futures::future::ready(Some(item))
        });
        // Server-sent events, or (Ollama) a JSON object a line.
        let mut events: std::pin::Pin<Box<dyn futures::Stream<Item = Result<Piece, Cut>> + Send>> =
            if dialect == Dialect::Ollama {
                Box::pin(lines(bytes).map(|line| {
                    line.map(|data| Piece {
                        event: String::new(),
                        data,
                    })
                }))
            } else {
                Box::pin(bytes.eventsource().map(|event| match event {
                    Ok(event) => Ok(Piece {
                        event: event.event,
                        data: event.data,
                    }),
                    Err(EventStreamError::Transport(cut)) => Err(cut),
                    Err(e) => Err(Cut::Broken(e.to_string())),
                }))
            };
        let mut openai = wire::openai::Stream::default();
        let mut ollama = wire::ollama::Stream::default();
        let mut anthropic = wire::anthropic::Stream::default();
        let mut responses = wire::responses::Stream::default();
        // Keep-alive pings, and pieces that bring nothing (an empty delta, a role alone),
        // show the server is there, not that the answer moves: they keep the call alive
        // for the answer timeout at most (a model may think long between two pieces), so
        // a server that sends nothing else cannot hold the run without end. Comments,
        // which the parser drops, keep nothing alive.
        //
        // Until the answer begins (its first piece of text, reasoning or a call), the model
        // may think in silence: a server sends its headers at once, and a reasoning model
        // may send nothing more for minutes. That wait is the answer timeout, as before the
        // headers; once the answer moves, the idle timeout bounds each silence. Giving up
        // early there would pay for the thinking again on each retry.
        let pings_for = self.answer_timeout.max(self.idle_timeout);
        let mut moved = tokio::time::Instant::now();
        let mut heard = moved;
        let mut heard_any = false;
        let mut grown = 0;
        let mut stalled = false;
        loop {
            let begun = grown > 0;
            let silence = if begun {
                heard + self.idle_timeout
            } else {
                moved + pings_for
            };
            let only_pings = moved + pings_for;
            let nothing_added = || {
                ProviderError::Transport(format!(
                    "{} sent nothing that adds to the answer (keep-alive pings, empty pieces) \
                     for {} s",
                    self.provider,
                    pings_for.as_secs_f64()
                ))
            };
            let next = match tokio::time::timeout_at(silence.min(only_pings), events.next()).await {
                Err(_) if !begun && heard_any => return Err(nothing_added()),
                Err(_) if !begun => return Err(silent_for(pings_for)),
                Err(_) if stalled && only_pings <= silence => return Err(nothing_added()),
                Err(_) => {
                    return Err(silent());
                }
                Ok(None) => break,
                Ok(Some(Err(Cut::TooLarge))) => {
                    return Err(too_large(&self.provider, limit));
                }
                Ok(Some(Err(e))) => {
                    return Err(ProviderError::Transport(format!("the stream broke: {e}")));
                }
                Ok(Some(Ok(event))) => event,
            };
            heard = tokio::time::Instant::now();
            heard_any = true;
            let (pushed, now_grown) = match dialect {
                Dialect::OpenAi => (openai.push(&next.data), openai.grown()),
                Dialect::OpenAiResponses => {
                    (responses.push(&next.event, &next.data), responses.grown())
                }
                Dialect::Anthropic => (anthropic.push(&next.event, &next.data), anthropic.grown()),
                Dialect::Ollama => (ollama.push(&next.data), ollama.grown()),
            };
            stalled = now_grown == grown;
            if !stalled {
                grown = now_grown;
                spent.grown = usize::try_from(grown).unwrap_or(usize::MAX);
                moved = heard;
            }
            if let (Some(text), Some(sink)) = (pushed?, &self.on_text) {
                sink(&text);
            }
        }
        let (done, assembled) = match dialect {
            Dialect::OpenAi => (openai.is_done(), openai.finish()),
            Dialect::OpenAiResponses => (responses.is_done(), responses.finish()),
            Dialect::Anthropic => (anthropic.is_done(), anthropic.finish()),
            Dialect::Ollama => (ollama.is_done(), ollama.finish()),
        };
        if !done {
            return Err(ProviderError::Transport(
                "the stream ended before its end marker".to_owned(),
            ));
        }
        Ok(assembled)
    }

    /// The request of one call, in `dialect`.
    fn request_text(&self, dialect: Dialect, request: &ModelRequest<'_>) -> String {
        // What this call may write: this model's cap, and the call's own when its budget
        // leaves less (the smaller wins).
        let asked = request.max_output_tokens.map(|tokens| tokens.max(1));
        let cap = match (self.max_output, asked) {
            (Some(own), Some(asked)) => Some(own.min(asked)),
            (Some(own), None) => Some(own),
            // A limit past the model's own is refused by some providers (OpenAI's): without
            // a cap of this model's, only one every model takes is sent.
            (None, Some(asked)) => (asked <= SURELY_TAKEN_OUTPUT_CAP).then_some(asked),
            (None, None) => None,
        };
        let (limit, thinking) = self.anthropic_limit(asked);
        let body = match dialect {
            Dialect::OpenAi => wire::openai::request_body(request.prompt, &self.model, self.stream),
            Dialect::OpenAiResponses => {
                wire::responses::request_body(request.prompt, &self.model, self.stream)
            }
            Dialect::Anthropic => wire::anthropic::request_body_thinking(
                request.prompt,
                &self.model,
                limit,
                self.stream,
                self.prompt_cache,
                thinking,
            ),
            Dialect::Ollama => wire::ollama::request_body(request.prompt, &self.model, self.stream),
        };
        let mut body = body;
        if let Some(effort) = self.effort {
            let effort = Value::from(effort.as_str());
            match dialect {
                Dialect::OpenAi => body["reasoning_effort"] = effort,
                Dialect::OpenAiResponses => body["reasoning"] = json!({ "effort": effort }),
                Dialect::Anthropic => body["output_config"] = json!({ "effort": effort }),
                Dialect::Ollama => body["think"] = ollama_think(self.effort),
            }
        }
        if let Some(cap) = cap {
            let field = match (dialect, self.provider.as_str()) {
                (Dialect::OpenAi, "openai") => Some("max_completion_tokens"),
                // The older name, which servers that speak the dialect accept.
                (Dialect::OpenAi, _) => Some("max_tokens"),
                (Dialect::OpenAiResponses, _) => Some("max_output_tokens"),
                // Its request has it already.
                (Dialect::Anthropic, _) => None,
                (Dialect::Ollama, _) => {
                    body["options"]["num_predict"] = Value::from(cap);
                    None
                }
            };
            if let Some(field) = field {
                body[field] = Value::from(cap);
            }
        }
        if let (Dialect::Ollama, Some(window)) = (dialect, self.context_window) {
            body["options"]["num_ctx"] = Value::from(window);
        }
        if let Some(key) = request.cache_key.filter(|_| self.routes_by_cache_key()) {
            body["prompt_cache_key"] = Value::from(cache_key(key));
        }
        body.to_string()
    }

    fn backoff(&self, attempt: u32) -> Duration {
        let exp = self.retry.base.saturating_mul(1 << (attempt - 1).min(16));
        let wait = exp.min(self.retry.max_wait);
        if self.retry.jitter {
            // Between half and all of the backoff, so many clients do not retry in step.
            let nanos = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.subsec_nanos())
                .unwrap_or(0);
            let share = 0.5 + f64::from(nanos % 1_000) / 2_000.0;
            wait.mul_f64(share)
        } else {
            wait
        }
    }
}

/// Bytes of an error response read, at most (only its beginning is shown).
const MAX_ERROR_BODY_BYTES: usize = 64 * 1024;

/// Bytes of a model's response accepted by default: far past any answer a model writes,
/// well short of what would hurt the process.
pub const DEFAULT_MAX_RESPONSE_BYTES: usize = 32 * 1024 * 1024;

/// Why a stream was cut.
#[derive(Debug)]
enum Cut {
    Transport(reqwest::Error),
    TooLarge,
    /// The events could not be read (not UTF-8, say).
    Broken(String),
}

/// One piece of a stream: a server-sent event (its type, when it has one, and its data),
/// or a line of newline-delimited JSON (no type).
struct Piece {
    event: String,
    data: String,
}

/// The lines of a stream of bytes, without their `\n` (nor a `\r` before it); the last
/// one may have none. tokio-util's line codec, which looks at each byte once however the
/// stream is cut; the stream's own bound (`Cut::TooLarge`) bounds a line too.
fn lines<B: AsRef<[u8]> + Send>(
    bytes: impl futures::Stream<Item = Result<B, Cut>> + Send + Unpin,
) -> impl futures::Stream<Item = Result<String, Cut>> + Send {
    let reader = tokio_util::io::StreamReader::new(bytes.map(|chunk| {
        chunk
            .map(std::io::Cursor::new)
            .map_err(std::io::Error::other)
    }));
    tokio_util::codec::FramedRead::new(reader, tokio_util::codec::LinesCodec::new()).map(|line| {
        line.map_err(|e| match e {
            tokio_util::codec::LinesCodecError::Io(e) => match e.downcast::<Cut>() {
                Ok(cut) => cut,
                Err(e) => Cut::Broken(e.to_string()),
            },
            other => Cut::Broken(other.to_string()),
        })
    })
}

impl std::error::Error for Cut {}

impl std::fmt::Display for Cut {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Cut::Transport(e) => f.write_str(&why(e)),
            Cut::TooLarge => f.write_str("the response is too large"),
            Cut::Broken(e) => f.write_str(e),
        }
    }
}

/// An HTTP client's error with what lies beneath it: reqwest says "error sending request
/// for url (…)" and keeps why (the connection refused, the name not found, the certificate
/// refused) in its sources, which a person needs to act.
fn why(e: &(dyn std::error::Error + 'static)) -> String {
    let said = e.to_string();
    let mut deepest = e;
    while let Some(source) = deepest.source() {
        deepest = source;
    }
    let beneath = deepest.to_string();
    if std::ptr::addr_eq(deepest, e) || beneath.is_empty() || said.contains(&beneath) {
        said
    } else {
        format!("{said}: {beneath}")
    }
}

fn too_large(provider: &str, limit: usize) -> ProviderError {
    ProviderError::Decode(format!(
        "{provider} sent more than {} MiB in one response; it was cut there",
        limit / (1024 * 1024)
    ))
}

/// The body, up to `limit` bytes, and whether that was all of it; reading stops at the
/// limit, or when nothing comes for `idle`.
async fn read_at_most(
    mut response: reqwest::Response,
    limit: usize,
    idle: Duration,
) -> (Result<Vec<u8>, Unread>, bool) {
    let mut body = Vec::new();
    loop {
        let Ok(chunk) = tokio::time::timeout(idle, response.chunk()).await else {
            return (Err(Unread::Silent), false);
        };
        match chunk {
            Ok(Some(chunk)) => {
                let room = limit - body.len();
                if chunk.len() > room {
                    body.extend_from_slice(&chunk[..room]);
                    return (Ok(body), false);
                }
                body.extend_from_slice(&chunk);
            }
            Ok(None) => return (Ok(body), true),
            Err(e) => return (Err(Unread::Broke(e)), false),
        }
    }
}

/// Why a body was not read to its end.
enum Unread {
    /// Nothing came for the idle timeout.
    Silent,
    /// The connection failed.
    Broke(reqwest::Error),
}

/// `retry-after-ms` (OpenAI) or `Retry-After` in seconds. The server is not trusted: a
/// negative value is no wait, a huge or infinite one saturates (the caller cuts it to its
/// longest wait), and one that is not a number is ignored.
pub fn retry_after(headers: &reqwest::header::HeaderMap) -> Option<Duration> {
    let get = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let number = |v: &str| v.trim().parse::<f64>().ok().filter(|n| !n.is_nan());
    if let Some(ms) = get("retry-after-ms").and_then(number) {
        return Some(seconds(ms / 1000.0));
    }
    get("retry-after").and_then(number).map(seconds)
}

/// Bytes of request or reply counted as one token where a provider reports no usage: about
/// what English text and JSON take (code takes a little less; the JSON around a prompt
/// adds a little).
pub const ESTIMATED_BYTES_PER_TOKEN: usize = 4;

/// The usage of a call whose provider reported none (a prompt is never zero tokens): the
/// request's bytes and the reply's, [`ESTIMATED_BYTES_PER_TOKEN`] to a token.
fn estimated_usage(request_bytes: usize, reply: &ModelReply) -> agent_core::Usage {
    let reply_bytes = match &reply.decision {
        Ok(decision) => serde_json::to_string(decision).map_or(0, |s| s.len()),
        Err(invalid) => invalid.raw.len(),
    } + serde_json::to_string(&reply.reasoning).map_or(0, |s| s.len());
    let tokens =
        |bytes: usize| u64::try_from(bytes.div_ceil(ESTIMATED_BYTES_PER_TOKEN)).unwrap_or(u64::MAX);
    agent_core::Usage {
        estimated: true,
        ..agent_core::Usage::tokens(tokens(request_bytes), tokens(reply_bytes))
    }
}

/// What a failed attempt got as far as: whether the provider accepted it (a 2xx status:
/// its prompt is read, and billed), and how many bytes of answer it had written.
#[derive(Default)]
struct Spent {
    accepted: bool,
    grown: usize,
}

/// Whether the model's last reply in `prompt` came through OpenAI's Responses API (it
/// carries that API's reasoning items).
fn answered_through_responses(prompt: &agent_core::Prompt) -> bool {
    prompt
        .messages
        .iter()
        .rev()
        .find(|m| m.role == agent_core::Role::Assistant)
        .is_some_and(|m| {
            m.parts.iter().any(|p| {
                matches!(
                    p,
                    agent_core::Part::Reasoning {
                        reasoning: agent_core::Reasoning::ResponsesItem { .. }
                    }
                )
            })
        })
}

/// Ollama's `think` for an effort: `false` for none, else its words (`low`, `medium`,
/// `high`), the nearest of them for the others.
fn ollama_think(effort: Option<Effort>) -> Value {
    match effort {
        None => Value::Null,
        Some(Effort::None) => Value::Bool(false),
        Some(Effort::Minimal | Effort::Low) => Value::from("low"),
        Some(Effort::Medium) => Value::from("medium"),
        Some(Effort::High | Effort::Xhigh | Effort::Max) => Value::from("high"),
    }
}

/// The `prompt_cache_key` sent for calls whose prompts begin alike as `key` says: a hash
/// of it, so that a run's id (which a person may have named) never leaves the machine, and
/// the key stays within the API's 64 characters.
fn cache_key(key: &str) -> String {
    format!("agent-{}", &agent_core::sha256_hex(key.as_bytes())[..32])
}

impl HttpModel {
    /// Whether the provider routes requests to its prompt caches by a key of the caller's:
    /// OpenAI's own API, in both its dialects, with the prompt cache on. Other servers that
    /// speak Chat Completions are sent no such field, as some refuse fields they do not
    /// know.
    fn routes_by_cache_key(&self) -> bool {
        self.prompt_cache
            && matches!(
                (self.dialect, self.provider.as_str()),
                (Dialect::OpenAi, "openai") | (Dialect::OpenAiResponses, _)
            )
    }

    /// Anthropic's `max_tokens` for a call that may write `asked` tokens at most, and the
    /// thinking to ask for: a thinking budget must stay below `max_tokens`, and is lowered
    /// under a call's own limit rather than the limit raised past it (at least the API's
    /// least budget, then one token more than it may be written).
    fn anthropic_limit(&self, asked: Option<u32>) -> (u32, Option<Thinking>) {
        let own = match (self.thinking, self.max_output) {
            (Some(Thinking::Adaptive), None) => wire::anthropic::DEFAULT_MAX_TOKENS_ADAPTIVE,
            _ => self.max_tokens,
        };
        let Some(asked) = asked else {
            return (own, self.thinking);
        };
        let limit = own.min(asked);
        match self.thinking {
            Some(Thinking::Budget(budget))
                if budget.max(wire::anthropic::MIN_THINKING_TOKENS) >= limit =>
            {
                let budget = limit
                    .saturating_sub(1)
                    .max(wire::anthropic::MIN_THINKING_TOKENS);
                (limit.max(budget + 1), Some(Thinking::Budget(budget)))
            }
            thinking => (limit, thinking),
        }
    }

    /// The estimated usage of an attempt that failed after `spent`, priced when a price
    /// is known: nothing for one the provider refused or never answered.
    fn spent_on(&self, spent: &Spent, request_bytes: usize) -> agent_core::Usage {
        if !spent.accepted {
            return agent_core::Usage::default();
        }
        let tokens = |bytes: usize| {
            u64::try_from(bytes.div_ceil(ESTIMATED_BYTES_PER_TOKEN)).unwrap_or(u64::MAX)
        };
        let mut usage = agent_core::Usage {
            estimated: true,
            ..agent_core::Usage::tokens(tokens(request_bytes), tokens(spent.grown))
        };
        if let Some(price) = self.price {
            usage.cost_usd = price.cost(&usage);
        }
        usage
    }
}

/// A duration of `secs` seconds from an untrusted number: clamped at zero, saturating.
fn seconds(secs: f64) -> Duration {
    Duration::try_from_secs_f64(secs.max(0.0)).unwrap_or(Duration::MAX)
}

#[async_trait]
impl Model for HttpModel {
    fn provider(&self) -> &str {
        &self.provider
    }

    fn model(&self) -> &str {
        &self.model
    }

    fn knows_cost(&self) -> bool {
        self.price.is_some()
    }

    /// OpenAI's and Anthropic's counts are of the whole prompt; a server that only speaks
    /// the dialect may count what it had to read (Ollama leaves out what its cache held).
    fn counts_whole_prompts(&self) -> bool {
        self.provider != "openai-compat" && self.dialect != Dialect::Ollama
    }

    fn least_cost(&self, input_tokens: u64) -> f64 {
        self.price
            .as_ref()
            .map_or(0.0, |price| price.least_cost(input_tokens))
    }

    fn output_tokens_for(&self, usd: f64) -> Option<u64> {
        let price = self.price?.output_per_million;
        (price > 0.0 && usd.is_finite()).then(|| (usd.max(0.0) / price * 1e6).floor() as u64)
    }

    async fn decide(&self, request: ModelRequest<'_>) -> Result<ModelReply, ProviderError> {
        // A run this model already took to the Responses API (in an earlier process: the
        // model's last reply carries that API's reasoning) goes on there.
        if self.dialect == Dialect::OpenAi
            && self.provider == "openai"
            && answered_through_responses(request.prompt)
        {
            self.responses_instead
                .store(true, std::sync::atomic::Ordering::Relaxed);
        }
        let mut dialect = self.dialect();
        // Made once for every attempt; its size is the estimate of a prompt whose usage
        // the provider does not report.
        let mut text = self.request_text(dialect, &request);
        let mut retries = Vec::new();
        let mut waited = Duration::ZERO;
        let mut attempt = 0;
        loop {
            attempt += 1;
            let mut spent = Spent::default();
            match self.attempt(dialect, &text, &mut spent).await {
                Ok(mut assembled) => {
                    if dialect == Dialect::Anthropic {
                        wire::anthropic::answer_from_tool(&mut assembled, request.prompt);
                    }
                    let mut reply = assembled.decide();
                    wire::restore_names(&mut reply, &request.prompt.tools);
                    if reply.usage.input_tokens == 0 && reply.usage.output_tokens == 0 {
                        // No usage reported: the budgets hold on an estimate.
                        reply.usage = estimated_usage(text.len(), &reply);
                    } else if dialect == Dialect::Ollama {
                        // Ollama's count may leave out what its cache held (a few dozen
                        // tokens for a prompt of thousands): the token budget counts the
                        // prompt as at least its estimate.
                        let least = estimated_usage(text.len(), &reply).input_tokens;
                        if least > reply.usage.input_tokens {
                            reply.usage.input_tokens = least;
                            reply.usage.estimated = true;
                        }
                    }
                    if let Some(price) = self.price {
                        reply.usage.cost_usd = price.cost(&reply.usage);
                    }
                    reply.retries = retries;
                    return Ok(reply);
                }
                // OpenAI asked for its Responses API: the call is made there at once, as if
                // this attempt had not been (a refusal costs nothing). The model changes
                // dialect once, so this happens once.
                Err(_) if self.dialect() != dialect => {
                    dialect = self.dialect();
                    text = self.request_text(dialect, &request);
                    attempt -= 1;
                }
                Err(e) if !e.is_retryable() => {
                    let spent = self.spent_on(&spent, text.len());
                    // Alone and costing nothing, the failure is said as it is.
                    return Err(if retries.is_empty() && spent.is_zero() {
                        e
                    } else {
                        ProviderError::GaveUp {
                            last: Box::new(e),
                            why: format!(
                                "not worth retrying, after {attempt} attempt{}",
                                if attempt == 1 { "" } else { "s" }
                            ),
                            retries,
                            spent,
                            by_budget: false,
                        }
                    });
                }
                Err(e) => {
                    if attempt >= self.retry.max_attempts {
                        return Err(ProviderError::GaveUp {
                            last: Box::new(e),
                            why: format!(
                                "gave up after {attempt} attempt{}",
                                if attempt == 1 { "" } else { "s" }
                            ),
                            retries,
                            spent: self.spent_on(&spent, text.len()),
                            by_budget: false,
                        });
                    }
                    let spent = self.spent_on(&spent, text.len());
                    if let Some(limit) = request.spend_limit {
                        // What the attempts so far may have cost, and the least another
                        // would: past the run's budget, no more are made.
                        let mut so_far = spent;
                        retries.iter().for_each(|r| so_far.add(&r.usage));
                        if !limit.allows_another(&so_far, self.least_cost(limit.least_input_tokens))
                        {
                            return Err(ProviderError::GaveUp {
                                last: Box::new(e),
                                why: format!(
                                    "gave up after {attempt} attempt{}: another could pass the \
                                     run's budget",
                                    if attempt == 1 { "" } else { "s" }
                                ),
                                retries,
                                spent,
                                by_budget: true,
                            });
                        }
                    }
                    let wait = e
                        .retry_after()
                        .unwrap_or_else(|| self.backoff(attempt))
                        .min(self.retry.max_wait);
                    if waited + wait > self.retry.max_total_wait {
                        return Err(ProviderError::GaveUp {
                            last: Box::new(e),
                            why: format!(
                                "gave up: retrying would wait past {} s in all",
                                self.retry.max_total_wait.as_secs()
                            ),
                            retries,
                            spent,
                            by_budget: false,
                        });
                    }
                    tokio::time::sleep(wait).await;
                    waited += wait;
                    retries.push(Retry {
                        attempt,
                        reason: e.to_string(),
                        wait_ms: u64::try_from(wait.as_millis()).unwrap_or(u64::MAX),
                        usage: spent,
                    });
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use futures::StreamExt;

    use super::{Cut, lines};

    /// The lines of `chunks`, as a server might cut them.
    fn split(chunks: Vec<Result<Vec<u8>, Cut>>) -> Vec<Result<String, String>> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        runtime.block_on(
            lines(futures::stream::iter(chunks))
                .map(|line| line.map_err(|cut| cut.to_string()))
                .collect(),
        )
    }

    #[test]
    fn lines_are_found_wherever_the_stream_is_cut() {
        let ok = |s: &str| Ok(s.as_bytes().to_vec());
        assert_eq!(
            split(vec![
                ok("{\"a\":"),
                ok("1}\n{\"b\""),
                ok(":2}\n\n{\"c\":3}")
            ]),
            [
                Ok("{\"a\":1}".into()),
                Ok("{\"b\":2}".into()),
                Ok(String::new()),
                Ok("{\"c\":3}".into())
            ]
        );
        // Many lines in one piece, one line in many.
        let many: String = (0..1_000).map(|i| format!("{i}\n")).collect();
        let got = split(vec![ok(&many)]);
        assert_eq!(got.len(), 1_000);
        assert_eq!(got[999], Ok("999".into()));
        let long = "x".repeat(5_000);
        let bytes: Vec<_> = long.bytes().map(|b| Ok(vec![b])).collect();
        assert_eq!(split(bytes), [Ok(long)]);
        // A cut ends the lines there.
        assert_eq!(
            split(vec![ok("a\nb"), Err(Cut::TooLarge), ok("c\n")]),
            [Ok("a".into()), Err("the response is too large".into())]
        );
    }
}
