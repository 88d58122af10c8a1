//! The transport against a real HTTP server on 127.0.0.1 serving recorded streams.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use agent_core::*;
use agent_providers::testing::{Reply, Server};
use agent_providers::{
    Dialect, Effort, HttpModel, Model, ModelRequest, Price, RetryPolicy, SpendLimit, Thinking,
};
use serde_json::json;

use crate::fixture;

fn prompt() -> Prompt {
    Prompt {
        system: "sys".into(),
        messages: vec![Message::user_text("weather in Paris?")],
        tools: vec![ToolSpec::new(
            "get_weather",
            "weather",
            json!({"type": "object"}),
            Risk::Read,
        )],
        answer_schema: None,
    }
}

fn quick() -> RetryPolicy {
    RetryPolicy {
        max_attempts: 4,
        base: Duration::from_millis(10),
        max_wait: Duration::from_millis(200),
        max_total_wait: Duration::from_secs(5),
        jitter: false,
    }
}

async fn model(dialect: Dialect, replies: Vec<Reply>) -> (Server, HttpModel) {
    let server = Server::start(replies).await.unwrap();
    let provider = match dialect {
        Dialect::OpenAi => "openai",
        Dialect::Anthropic => "anthropic",
        Dialect::OpenAiResponses => "openai-responses",
        _ => "ollama",
    };
    let model = HttpModel::new(
        dialect,
        provider,
        "test-model",
        &server.url,
        Some("sk-test".into()),
    )
    .unwrap()
    .with_retry(quick());
    (server, model)
}

async fn ask(model: &HttpModel) -> Result<ModelReply, agent_providers::ProviderError> {
    model.decide(ModelRequest::new(&prompt(), 0)).await
}

#[tokio::test]
async fn openai_streams_a_tool_call_and_sends_what_the_api_expects() {
    let (server, model) = model(
        Dialect::OpenAi,
        vec![Reply::stream(fixture("openai/single_tool.sse"))],
    )
    .await;
    let reply = ask(&model).await.unwrap();
    assert!(matches!(reply.decision, Ok(Decision::ToolCalls { .. })));
    let got = server.received();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].path, "/chat/completions");
    assert_eq!(got[0].header("authorization"), Some("Bearer sk-test"));
    assert_eq!(got[0].body["model"], "test-model");
    assert_eq!(got[0].body["stream"], true);
    assert_eq!(got[0].body["stream_options"]["include_usage"], true);
    assert_eq!(got[0].body["tools"][0]["function"]["name"], "get_weather");
}

/// The `prompt_cache_key` of each of four calls `model` makes to `server`: two of one run,
/// one of another, one with no key.
async fn cache_keys(model: &HttpModel, server: &Server) -> Vec<Option<serde_json::Value>> {
    let p = prompt();
    for key in [Some("run-1"), Some("run-1"), Some("run-2"), None] {
        model
            .decide(ModelRequest::new(&p, 0).with_cache_key(key))
            .await
            .unwrap();
    }
    server
        .received()
        .iter()
        .map(|r| r.body.get("prompt_cache_key").cloned())
        .collect()
}

/// The calls of one run go to OpenAI with one `prompt_cache_key`, another run's with
/// another, made from the key so that a run's name does not leave the machine; servers that
/// only speak the dialect, and Anthropic, are sent none, nor is OpenAI with the cache off.
#[tokio::test]
async fn a_run_s_calls_carry_one_cache_key_to_openai_and_none_elsewhere() {
    let replies = |name: &str| (0..4).map(|_| Reply::stream(fixture(name))).collect();
    for (dialect, answer) in [
        (Dialect::OpenAi, "openai/text_only.sse"),
        (Dialect::OpenAiResponses, "openai/responses_text.sse"),
    ] {
        let (server, model) = model(dialect, replies(answer)).await;
        let sent = cache_keys(&model, &server).await;
        let key = sent[0].as_ref().and_then(|k| k.as_str()).unwrap();
        assert!(
            key.len() <= 64 && !key.contains("run-1"),
            "{dialect:?}: {key}"
        );
        assert_eq!(sent[1], sent[0], "{dialect:?}: one run, one key");
        assert!(
            sent[2].is_some() && sent[2] != sent[0],
            "{dialect:?}: {sent:?}"
        );
        assert_eq!(sent[3], None, "{dialect:?}");
    }
    let (server, anthropic) =
        model(Dialect::Anthropic, replies("anthropic/basic_response.txt")).await;
    assert_eq!(
        cache_keys(&anthropic, &server).await,
        [None, None, None, None]
    );
    for (provider, cache) in [("openai-compat", true), ("openai", false)] {
        let server = Server::start(replies("openai/text_only.sse"))
            .await
            .unwrap();
        let model = HttpModel::new(Dialect::OpenAi, provider, "m", &server.url, None)
            .unwrap()
            .with_prompt_cache(cache);
        assert_eq!(
            cache_keys(&model, &server).await,
            [None, None, None, None],
            "{provider}, cache {cache}"
        );
    }
}

#[tokio::test]
async fn anthropic_streams_and_sends_its_headers() {
    let (server, model) = model(
        Dialect::Anthropic,
        vec![Reply::stream(fixture("anthropic/tool_use_response.txt"))],
    )
    .await;
    let reply = ask(&model).await.unwrap();
    assert!(matches!(reply.decision, Ok(Decision::ToolCalls { .. })));
    assert_eq!(reply.usage.input_tokens, 377);
    let got = server.received();
    assert_eq!(got[0].path, "/v1/messages");
    assert_eq!(got[0].header("x-api-key"), Some("sk-test"));
    assert_eq!(got[0].header("anthropic-version"), Some("2023-06-01"));
    // Prompt caching is on by default: the system text is a block with a breakpoint.
    assert_eq!(
        got[0].body["system"],
        serde_json::json!([{"type": "text", "text": "sys", "cache_control": {"type": "ephemeral"}}])
    );
}

#[tokio::test]
async fn retryable_statuses_are_retried_honouring_retry_after() {
    let (server, model) = model(
        Dialect::OpenAi,
        vec![
            Reply::status(429, r#"{"error":{"message":"slow down"}}"#)
                .header("retry-after-ms", "30"),
            Reply::status(503, r#"{"error":{"message":"unavailable"}}"#),
            Reply::stream(fixture("openai/text_only.sse")),
        ],
    )
    .await;
    let reply = ask(&model).await.unwrap();
    assert!(matches!(reply.decision, Ok(Decision::Final { .. })));
    assert_eq!(server.received().len(), 3);
    let waits: Vec<(u32, u64)> = reply
        .retries
        .iter()
        .map(|r| (r.attempt, r.wait_ms))
        .collect();
    assert_eq!(
        waits,
        [(1, 30), (2, 20)],
        "Retry-After, then the doubled backoff"
    );
    let reason = &reply.retries[0].reason;
    assert!(reason.contains("limiting requests (HTTP 429)"), "{reason}");
}

#[tokio::test]
async fn anthropic_overloaded_529_and_mid_stream_errors_are_retried() {
    let overloaded_mid_stream = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":5,\"output_tokens\":1}}}\n\nevent: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}\n\n";
    let (server, model) = model(
        Dialect::Anthropic,
        vec![
            Reply::status(
                529,
                r#"{"type":"error","error":{"type":"overloaded_error"}}"#,
            ),
            Reply::stream(overloaded_mid_stream),
            Reply::stream(fixture("anthropic/basic_response.txt")),
        ],
    )
    .await;
    let reply = ask(&model).await.unwrap();
    assert!(matches!(reply.decision, Ok(Decision::Final { .. })));
    assert_eq!(server.received().len(), 3);
    assert_eq!(reply.retries.len(), 2);
    // Refused, an attempt cost nothing; accepted, its prompt was read: it may be billed.
    assert!(reply.retries[0].usage.is_zero(), "{:?}", reply.retries[0]);
    let sent = server.received()[1].body.to_string().len();
    let accepted = reply.retries[1].usage;
    assert!(accepted.estimated, "{accepted:?}");
    assert_eq!(accepted.input_tokens, sent.div_ceil(4) as u64);
}

#[tokio::test]
async fn a_cut_stream_is_retried() {
    let full = fixture("openai/text_only.sse");
    let cut: String = full.chars().take(full.len() / 2).collect();
    let (server, model) = model(
        Dialect::OpenAi,
        vec![Reply::stream(cut), Reply::stream(full)],
    )
    .await;
    let reply = ask(&model).await.unwrap();
    assert!(matches!(reply.decision, Ok(Decision::Final { .. })));
    assert_eq!(server.received().len(), 2);
    assert!(
        reply.retries[0].reason.contains("end marker"),
        "{}",
        reply.retries[0].reason
    );
    // The cut attempt read the prompt and wrote part of an answer: both count, estimated.
    let cut = reply.retries[0].usage;
    let sent = server.received()[0].body.to_string().len();
    assert!(cut.estimated, "{cut:?}");
    assert_eq!(cut.input_tokens, sent.div_ceil(4) as u64, "{cut:?}");
    assert!(cut.output_tokens > 0, "{cut:?}");
}

/// A retry is a call like the first attempt: one that could pass the run's budget (what
/// the attempts before it may have cost, with the least its prompt uses) is not made.
#[tokio::test]
async fn a_retry_that_could_pass_the_budget_is_not_made() {
    let full = fixture("openai/text_only.sse");
    let cut: String = full.chars().take(full.len() / 2).collect();
    let replies = || vec![Reply::stream(cut.clone()), Reply::stream(full.clone())];
    // What the cut attempt may have cost, as counted without a limit.
    let (_server, free) = model(Dialect::OpenAi, replies()).await;
    let spent = ask(&free).await.unwrap().retries[0].usage.total_tokens();
    assert!(spent > 0);
    let least = 1_000;
    for (left, made) in [(spent + least - 1, 1), (spent + least, 2)] {
        let (server, model) = model(Dialect::OpenAi, replies()).await;
        let limit = SpendLimit {
            tokens: Some(left),
            usd: None,
            least_input_tokens: least,
        };
        let asked = model
            .decide(ModelRequest::new(&prompt(), 0).with_spend_limit(Some(limit)))
            .await;
        assert_eq!(server.received().len(), made, "{left} left");
        match asked {
            Ok(reply) => assert_eq!(made, 2, "{reply:?}"),
            Err(e) => {
                assert_eq!(made, 1);
                assert!(
                    e.to_string()
                        .contains("another could pass the run's budget"),
                    "{e}"
                );
                assert!(e.stopped_by_budget(), "{e:?}");
                assert_eq!(e.spent().total_tokens(), spent, "what the cut attempt cost");
            }
        }
    }
}

#[tokio::test]
async fn client_errors_are_not_retried_and_say_what_failed() {
    for (status, body, kind, expected) in [
        (
            401,
            "{}",
            ModelErrorKind::Auth,
            "refused the API key (HTTP 401)",
        ),
        (
            403,
            "{}",
            ModelErrorKind::Auth,
            "refused the API key (HTTP 403)",
        ),
        (
            404,
            "{}",
            ModelErrorKind::NotFound,
            "has no model \"test-model\"",
        ),
        (
            400,
            "{}",
            ModelErrorKind::BadRequest,
            "rejected the request (HTTP 400)",
        ),
        (
            422,
            "{}",
            ModelErrorKind::BadRequest,
            "rejected the request (HTTP 422)",
        ),
        (
            429,
            r#"{"error":{"code":"insufficient_quota"}}"#,
            ModelErrorKind::BadRequest,
            "out of quota",
        ),
    ] {
        let (server, model) = model(Dialect::OpenAi, vec![Reply::status(status, body)]).await;
        let err = ask(&model).await.unwrap_err();
        assert_eq!(err.kind(), kind, "{status}: {err}");
        assert!(err.to_string().contains(expected), "{status}: {err}");
        assert!(err.retries().is_empty());
        assert_eq!(server.received().len(), 1, "{status} is not retried");
    }
}

#[tokio::test]
async fn a_refusal_after_retries_keeps_the_retries_and_its_own_kind() {
    let (server, model) = model(
        Dialect::OpenAi,
        vec![Reply::status(503, "{}"), Reply::status(401, "{}")],
    )
    .await;
    let err = ask(&model).await.unwrap_err();
    assert_eq!(server.received().len(), 2);
    assert_eq!(err.kind(), ModelErrorKind::Auth, "{err}");
    assert_eq!(err.retries().len(), 1, "the 503 is reported for the log");
}

#[tokio::test]
async fn retries_stop_at_the_attempt_limit() {
    let (server, model) = model(Dialect::OpenAi, vec![Reply::status(500, "{}"); 6]).await;
    let err = ask(&model).await.unwrap_err();
    assert!(
        err.to_string().contains("gave up after 4 attempts"),
        "{err}"
    );
    assert_eq!(server.received().len(), 4);
    assert_eq!(
        err.kind(),
        ModelErrorKind::Server,
        "the last failure's kind"
    );
    assert!(!err.is_retryable(), "the retry budget is spent");
    assert_eq!(
        err.retries().len(),
        3,
        "each retry is reported, for the log"
    );
}

#[tokio::test]
async fn usage_is_priced_and_text_streams_to_the_sink() {
    let seen = Arc::new(Mutex::new(String::new()));
    let sink = Arc::clone(&seen);
    let (_server, model) = model(
        Dialect::Anthropic,
        vec![Reply::stream(fixture("anthropic/basic_response.txt"))],
    )
    .await;
    let model = model
        .with_price(Price::new(3.0, 15.0))
        .with_text_sink(Arc::new(move |t: &str| sink.lock().unwrap().push_str(t)));
    let reply = ask(&model).await.unwrap();
    let Ok(Decision::Final { answer }) = &reply.decision else {
        panic!()
    };
    assert_eq!(
        &*seen.lock().unwrap(),
        answer,
        "every delta reached the sink"
    );
    let u = reply.usage;
    let expected = u.input_tokens as f64 * 3.0 / 1e6 + u.output_tokens as f64 * 15.0 / 1e6;
    assert!((u.cost_usd - expected).abs() < 1e-12 && u.cost_usd > 0.0);
}

#[tokio::test]
async fn cached_prompt_tokens_are_priced_at_the_cache_rates() {
    // Over the wire, from a recorded shape: Anthropic writes 188,086 tokens to its cache,
    // then reads them.
    let price = Price {
        cache_read_per_million: Some(0.30),
        cache_write_per_million: Some(3.75),
        ..Price::new(3.0, 15.0)
    };
    let (_server, streamed) = model(
        Dialect::Anthropic,
        vec![Reply::stream(fixture(
            "anthropic/cached_tool_use_response.txt",
        ))],
    )
    .await;
    let write = ask(&streamed.with_price(price)).await.unwrap().usage;
    assert_eq!(
        (write.cache_write_tokens, write.cache_read_tokens),
        (188_086, 0)
    );
    let expected = (21.0 * 3.0 + 188_086.0 * 3.75 + 393.0 * 15.0) / 1e6;
    assert!((write.cost_usd - expected).abs() < 1e-12, "{write:?}");
    let (_server, whole) = model(
        Dialect::Anthropic,
        vec![Reply::status(
            200,
            fixture("anthropic/cache_read_message.json"),
        )],
    )
    .await;
    let read = ask(&whole.with_streaming(false).with_price(price))
        .await
        .unwrap()
        .usage;
    assert_eq!(
        (read.cache_write_tokens, read.cache_read_tokens),
        (40, 188_086)
    );
    let expected = (3.0 * 3.0 + 40.0 * 3.75 + 188_086.0 * 0.30 + 8.0 * 15.0) / 1e6;
    assert!((read.cost_usd - expected).abs() < 1e-12, "{read:?}");
    // Without cache prices, a read costs what an input token does and a write a quarter
    // more: an unknown price never makes a budget look larger than it is.
    let plain = Price::new(3.0, 15.0);
    assert!((plain.cost(&read) - (188_129.0 * 3.0 + 40.0 * 0.75 + 8.0 * 15.0) / 1e6).abs() < 1e-12);
}

/// The least a prompt can cost, what a cost budget is checked with before a call: every
/// token at the cheapest rate a prompt token has, and never more than the call costs.
#[test]
fn the_least_a_prompt_can_cost_is_at_the_cheapest_rate() {
    let cached = Price {
        cache_read_per_million: Some(0.30),
        ..Price::new(3.0, 15.0)
    };
    assert!((cached.least_cost(1_000_000) - 0.30).abs() < 1e-12);
    assert!((Price::new(3.0, 15.0).least_cost(1_000_000) - 3.0).abs() < 1e-12);
    // A cache read dearer than an uncached token (no provider's, but written by hand).
    let odd = Price {
        cache_read_per_million: Some(9.0),
        ..Price::new(3.0, 15.0)
    };
    assert!((odd.least_cost(1_000_000) - 3.0).abs() < 1e-12);
    // Whatever the mix of cached, written and uncached tokens, the call costs no less.
    for (read, written) in [(0, 0), (900, 0), (0, 900), (450, 450), (1_000, 0)] {
        let usage = Usage::tokens(1_000, 0).with_cache(read, written);
        for price in [cached, odd, Price::new(3.0, 15.0)] {
            assert!(
                price.least_cost(1_000) <= price.cost(&usage) + 1e-15,
                "{usage:?}"
            );
        }
    }
    let model = HttpModel::new(Dialect::OpenAi, "openai", "m", "http://127.0.0.1:9", None).unwrap();
    assert_eq!(model.least_cost(1_000_000), 0.0, "no price, nothing known");
    let priced = model.with_price(cached);
    assert!((priced.least_cost(1_000_000) - 0.30).abs() < 1e-12);
}

#[tokio::test]
async fn a_server_that_is_not_there_is_a_retried_connection_error() {
    let model = HttpModel::new(
        Dialect::OpenAi,
        "openai-compat",
        "m",
        "http://127.0.0.1:9",
        None,
    )
    .unwrap()
    .with_retry(RetryPolicy {
        max_attempts: 2,
        ..quick()
    });
    let err = ask(&model).await.unwrap_err();
    assert_eq!(err.kind(), ModelErrorKind::Transport);
    let err = err.to_string();
    assert!(
        err.contains("connection error") && err.contains("2 attempts"),
        "{err}"
    );
    // Why, not only that it failed: what lies beneath reqwest's "error sending request".
    assert!(err.contains("Connection refused"), "{err}");
}

/// An `openai-compat` model at `url` with an idle timeout of 100 ms, the given answer
/// timeout, and at most `attempts` attempts.
fn timed_model(url: &str, stream: bool, answer: Duration, attempts: u32) -> HttpModel {
    HttpModel::new(Dialect::OpenAi, "openai-compat", "m", url, None)
        .unwrap()
        .with_streaming(stream)
        .with_idle_timeout(Duration::from_millis(100))
        .with_answer_timeout(answer)
        .with_retry(RetryPolicy {
            max_attempts: attempts,
            ..quick()
        })
}

/// A server on 127.0.0.1 that takes every connection, reads the request, writes
/// `prefix` and then says nothing more, holding the connection open; and how many
/// connections it took.
fn silent_server(prefix: &'static str) -> (String, Arc<std::sync::atomic::AtomicUsize>) {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let taken = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let count = Arc::clone(&taken);
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { break };
            count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            // The request's head and its body (small: one read suffices).
            let mut buf = [0u8; 64 << 10];
            let _ = stream.read(&mut buf);
            let _ = stream.write_all(prefix.as_bytes());
            held.push(stream);
        }
    });
    (url, taken)
}

/// A server on 127.0.0.1 for one connection: it reads the request (small: one read
/// suffices) and hands the connection to `answer`, on a thread of its own. Its URL.
fn one_connection(answer: impl FnOnce(std::net::TcpStream) + Send + 'static) -> String {
    use std::io::Read;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        let (mut socket, _) = listener.accept().unwrap();
        let mut buf = [0u8; 64 << 10];
        let _ = socket.read(&mut buf);
        answer(socket);
    });
    url
}

/// An event stream's head: what a server sends before its events.
const SSE_HEAD: &str = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\r\n";

/// A server that accepts the connection and never answers (a proxy whose upstream is
/// gone, a server stuck), or stops in the middle of its body, does not hold the run
/// forever: silent for the answer timeout before it begins, or the idle timeout inside a
/// body, the attempt fails as a transport error, and is retried.
#[tokio::test]
async fn a_silent_server_is_given_up_on_and_retried() {
    let half =
        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n{\"id\"";
    for (prefix, stream) in [("", true), ("", false), (half, false)] {
        let (url, taken) = silent_server(prefix);
        let model = timed_model(&url, stream, Duration::from_millis(100), 2);
        // A bound on the test, not a measure: without the timeout it would wait forever.
        let err = tokio::time::timeout(Duration::from_secs(60), ask(&model))
            .await
            .expect("the model call ended")
            .unwrap_err();
        assert_eq!(err.kind(), ModelErrorKind::Transport, "{prefix:?}: {err}");
        let text = err.to_string();
        assert!(
            text.contains("openai-compat was silent for 0.1 s") && text.contains("2 attempts"),
            "{prefix:?}: {text}"
        );
        assert_eq!(taken.load(std::sync::atomic::Ordering::SeqCst), 2);
    }
}

/// An answer may take longer to begin than the idle timeout: a whole one is written
/// first, and a local server may load the model before it streams. It is waited for up
/// to the answer timeout.
#[tokio::test]
async fn an_answer_is_waited_for_longer_than_a_silence_before_it_begins() {
    use std::io::Write;
    let whole = json!({
        "choices": [{"message": {"role": "assistant", "content": "done"},
            "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1}
    })
    .to_string();
    for (stream, body, kind) in [
        (false, whole, "application/json"),
        (true, fixture("openai/text_only.sse"), "text/event-stream"),
    ] {
        let url = one_connection(move |mut socket| {
            // The model at work: three times the idle timeout below.
            std::thread::sleep(Duration::from_millis(300));
            let head = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: {kind}\r\ncontent-length: {}\r\n\r\n",
                body.len()
            );
            socket.write_all(head.as_bytes()).unwrap();
            socket.write_all(body.as_bytes()).unwrap();
        });
        let model = timed_model(&url, stream, Duration::from_secs(60), 1);
        let reply = ask(&model).await;
        assert!(
            matches!(&reply, Ok(r) if matches!(r.decision, Ok(Decision::Final { .. }))),
            "stream {stream}: {reply:?}"
        );
    }
}

/// A stream's keep-alive pings, and pieces that add nothing to the answer (an empty
/// delta, a role alone), keep the call alive past the idle timeout (a model may think long
/// between two pieces), for the answer timeout at most: a server that sends nothing else
/// does not hold the run without end. Pieces that do add to it, reasoning included, keep
/// it alive as long as they come.
#[tokio::test]
async fn pings_and_empty_pieces_keep_a_stream_alive_for_the_answer_timeout_at_most() {
    use std::io::Write;
    // `piece` every 50 ms, `times` times (without end if `None`), then `answer`.
    let serve = |piece: &str, times: Option<usize>, answer: String| {
        let piece = piece.to_owned();
        one_connection(move |mut socket| {
            socket.write_all(SSE_HEAD.as_bytes()).unwrap();
            let mut sent = 0;
            while times.is_none_or(|n| sent < n) {
                // Ends once the client has given up and closed the connection.
                if socket.write_all(piece.as_bytes()).is_err() {
                    return;
                }
                sent += 1;
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = socket.write_all(answer.as_bytes());
        })
    };
    let model = |dialect: Dialect, url: &str, answer: Duration| {
        HttpModel::new(dialect, "server", "m", url, Some("k".into()))
            .unwrap()
            .with_idle_timeout(Duration::from_secs(1))
            .with_answer_timeout(answer)
            .with_retry(RetryPolicy {
                max_attempts: 1,
                ..quick()
            })
    };
    let anthropic = fixture("anthropic/basic_response.txt");
    let openai = fixture("openai/text_only.sse");
    let responses = fixture("openai/responses_text.sse");
    let ping = "event: ping\ndata: {\"type\": \"ping\"}\n\n";
    // Forty pings: twice the idle timeout, and the answer after them.
    let url = serve(ping, Some(40), anthropic.clone());
    let reply = ask(&model(Dialect::Anthropic, &url, Duration::from_secs(60))).await;
    assert!(matches!(&reply, Ok(r) if r.decision.is_ok()), "{reply:?}");

    let delta = |text: &str| {
        format!(
            "data: {}\n\n",
            json!({"choices": [{"index": 0, "delta": {"content": text}}]})
        )
    };
    let reasoning = format!(
        "data: {}\n\n",
        json!({"choices": [{"index": 0, "delta": {"reasoning_content": "hm"}}]})
    );
    let role = format!(
        "data: {}\n\n",
        json!({"choices": [{"index": 0, "delta": {"role": "assistant"}}]})
    );
    let block = |kind: &str, field: &str, text: &str| {
        format!(
            "event: content_block_delta\ndata: {}\n\n",
            json!({"type": "content_block_delta", "index": 0,
                   "delta": {"type": kind, field: text}})
        )
    };
    let item = |kind: &str, text: &str| {
        format!(
            "event: {kind}\ndata: {}\n\n",
            json!({"type": kind, "output_index": 0, "delta": text})
        )
    };
    // Pieces that move the answer, for 1.5 times the answer timeout, then the answer.
    for (dialect, piece, answer) in [
        (Dialect::OpenAi, delta("."), &openai),
        (Dialect::OpenAi, reasoning, &openai),
        (
            Dialect::Anthropic,
            block("thinking_delta", "thinking", "hm"),
            &anthropic,
        ),
        (
            Dialect::OpenAiResponses,
            item("response.reasoning_summary_text.delta", "hm"),
            &responses,
        ),
    ] {
        let url = serve(&piece, Some(30), answer.clone());
        let reply = ask(&model(dialect, &url, Duration::from_secs(1))).await;
        assert!(
            matches!(&reply, Ok(r) if r.decision.is_ok()),
            "{piece}: {reply:?}"
        );
    }
    // Pieces that do not, without end.
    for (dialect, piece) in [
        (Dialect::Anthropic, ping.to_owned()),
        (Dialect::Anthropic, block("text_delta", "text", "")),
        (Dialect::OpenAi, delta("")),
        (Dialect::OpenAi, role),
        (
            Dialect::OpenAiResponses,
            item("response.output_text.delta", ""),
        ),
    ] {
        let url = serve(&piece, None, String::new());
        // A bound on the test, not a measure: without the bound it would wait forever.
        let err = tokio::time::timeout(
            Duration::from_secs(60),
            ask(&model(dialect, &url, Duration::from_secs(1))),
        )
        .await
        .expect("the model call ended")
        .unwrap_err();
        assert_eq!(err.kind(), ModelErrorKind::Transport, "{piece}: {err}");
        assert!(
            err.to_string().contains(
                "server sent nothing that adds to the answer (keep-alive pings, empty pieces) \
                 for 1 s"
            ),
            "{piece}: {err}"
        );
    }
}

/// A stream whose headers came may still say nothing while the model thinks (a reasoning
/// model, before its first piece): that silence is waited for up to the answer timeout,
/// not the idle timeout, which bounds each silence once the answer has begun.
#[tokio::test]
async fn a_stream_is_waited_for_until_its_answer_begins_then_between_its_pieces() {
    use std::io::{Read, Write};
    // The headers at once, then `first` (after `wait`), then nothing more: the body ends
    // there, or with `hold` the connection is held open until the client closes it.
    let serve = |wait: Duration, first: String, hold: bool| {
        one_connection(move |mut socket| {
            socket.write_all(SSE_HEAD.as_bytes()).unwrap();
            std::thread::sleep(wait);
            let _ = socket.write_all(first.as_bytes());
            if hold {
                // Until the client gives up and closes.
                let _ = socket.read(&mut [0u8; 1024]);
            }
        })
    };
    let model = |url: &str, answer: Duration| {
        HttpModel::new(Dialect::OpenAi, "server", "m", url, Some("k".into()))
            .unwrap()
            .with_idle_timeout(Duration::from_millis(300))
            .with_answer_timeout(answer)
            .with_retry(RetryPolicy {
                max_attempts: 1,
                ..quick()
            })
    };
    // Thinking for three idle timeouts, then the whole answer.
    let url = serve(
        Duration::from_secs(1),
        fixture("openai/text_only.sse"),
        false,
    );
    let reply = ask(&model(&url, Duration::from_secs(60))).await;
    assert!(matches!(&reply, Ok(r) if r.decision.is_ok()), "{reply:?}");
    // Bounds on the test, not measures: without the timeouts it would wait forever.
    let within = |call| async move {
        tokio::time::timeout(Duration::from_secs(60), call)
            .await
            .expect("the model call ended")
    };
    // Thinking without end: the answer timeout, not the idle one.
    let url = serve(Duration::from_secs(3600), String::new(), true);
    let thinking = model(&url, Duration::from_secs(1));
    let err = within(ask(&thinking)).await.unwrap_err();
    assert_eq!(err.kind(), ModelErrorKind::Transport, "{err}");
    assert!(
        err.to_string().contains("server was silent for 1 s"),
        "{err}"
    );
    // Silent after its first piece: the idle timeout.
    let piece = "data: {\"choices\": [{\"index\": 0, \"delta\": {\"content\": \"Hel\"}}]}\n\n";
    let url = serve(Duration::ZERO, piece.to_owned(), true);
    let begun = model(&url, Duration::from_secs(60));
    let err = within(ask(&begun)).await.unwrap_err();
    assert!(
        err.to_string().contains("server was silent for 0.3 s"),
        "{err}"
    );
}

/// A server that redirects the request elsewhere is not followed: the request carries
/// the API key (Anthropic's `x-api-key` is no header an HTTP client knows to drop on the
/// way) and the whole prompt. The call fails once, saying where it was sent, and is not
/// asked again; the place it points to hears nothing.
#[tokio::test]
async fn a_redirect_is_not_followed_and_says_where_it_pointed() {
    use std::io::{Read, Write};
    use std::sync::atomic::{AtomicUsize, Ordering};
    // Counts the connections it is given, and answers each with `answer`.
    let serve = |answer: String| {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let count = Arc::new(AtomicUsize::new(0));
        let counted = count.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { break };
                counted.fetch_add(1, Ordering::SeqCst);
                let mut buf = [0u8; 64 << 10];
                let _ = stream.read(&mut buf);
                let _ = stream.write_all(answer.as_bytes());
            }
        });
        (url, count)
    };
    let (elsewhere, heard) =
        serve("HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: 2\r\n\r\nok".into());
    for (dialect, status) in [
        (Dialect::Anthropic, 307),
        (Dialect::OpenAi, 308),
        (Dialect::OpenAi, 302),
    ] {
        let target = format!("{elsewhere}/v1/messages");
        let (url, asked) = serve(format!(
            "HTTP/1.1 {status} Moved\r\nlocation: {target}\r\ncontent-length: 0\r\n\r\n"
        ));
        let model = HttpModel::new(dialect, "server", "m", &url, Some("sk-secret".into()))
            .unwrap()
            .with_retry(quick());
        let err = ask(&model).await.unwrap_err();
        assert_eq!(err.kind(), ModelErrorKind::BadRequest, "{err}");
        assert!(
            err.to_string().contains(&format!(
                "server answered HTTP {status}, sending the request to \"{target}\"; agent does \
                 not follow redirects"
            )),
            "{err}"
        );
        assert_eq!(asked.load(Ordering::SeqCst), 1, "asked once, not again");
    }
    assert_eq!(
        heard.load(Ordering::SeqCst),
        0,
        "the place pointed to heard nothing"
    );
}

#[test]
fn retry_after_reads_both_headers() {
    let mut h = reqwest::header::HeaderMap::new();
    h.insert("retry-after", "2".parse().unwrap());
    assert_eq!(
        agent_providers::retry_after(&h),
        Some(Duration::from_secs(2))
    );
    h.insert("retry-after-ms", "150".parse().unwrap());
    assert_eq!(
        agent_providers::retry_after(&h),
        Some(Duration::from_millis(150))
    );
}

#[test]
fn hostile_retry_after_values_saturate_or_are_ignored() {
    let one = |name: &str, value: &str| {
        let mut h = reqwest::header::HeaderMap::new();
        h.insert(
            reqwest::header::HeaderName::from_bytes(name.as_bytes()).unwrap(),
            value.parse().unwrap(),
        );
        agent_providers::retry_after(&h)
    };
    assert_eq!(one("retry-after", "inf"), Some(Duration::MAX));
    assert_eq!(one("retry-after", "1e300"), Some(Duration::MAX));
    assert_eq!(one("retry-after-ms", "1e30"), Some(Duration::MAX));
    assert_eq!(one("retry-after", "-5"), Some(Duration::ZERO));
    assert_eq!(one("retry-after", "-inf"), Some(Duration::ZERO));
    assert_eq!(one("retry-after", "NaN"), None);
    assert_eq!(one("retry-after", "Wed, 21 Oct 2015 07:28:00 GMT"), None);
}

#[tokio::test]
async fn whole_responses_work_too() {
    let openai_body = json!({
        "choices": [{"message": {"role": "assistant", "content": null, "tool_calls": [
            {"id": "call_9", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Oslo\"}"}}
        ]}, "finish_reason": "tool_calls"}],
        "usage": {"prompt_tokens": 20, "completion_tokens": 9}
    });
    let (server, m) = model(
        Dialect::OpenAi,
        vec![Reply::status(200, openai_body.to_string())],
    )
    .await;
    let reply = ask(&m.with_streaming(false)).await.unwrap();
    let Ok(Decision::ToolCalls { calls }) = &reply.decision else {
        panic!("{:?}", reply.decision)
    };
    assert_eq!(calls[0].arguments["city"], "Oslo");
    assert_eq!(reply.usage, Usage::tokens(20, 9));
    assert!(server.received()[0].body.get("stream").is_none());

    let anthropic_body = json!({
        "content": [{"type": "text", "text": "It is sunny."}],
        "stop_reason": "end_turn",
        "usage": {"input_tokens": 30, "output_tokens": 5}
    });
    let (_server, m) = model(
        Dialect::Anthropic,
        vec![Reply::status(200, anthropic_body.to_string())],
    )
    .await;
    let reply = ask(&m.with_streaming(false)).await.unwrap();
    assert_eq!(
        reply.decision,
        Ok(Decision::Final {
            answer: "It is sunny.".into()
        })
    );
    assert_eq!(reply.usage, Usage::tokens(30, 5));
}

#[test]
fn building_a_model_changes_nothing_process_wide() {
    // An application embedding the crate keeps its own TLS choices: the client brings its
    // own rustls settings instead of installing a process-wide default provider.
    let model = HttpModel::new(
        Dialect::OpenAi,
        "openai",
        "gpt-4o",
        "https://api.openai.com/v1",
        None,
    );
    assert!(model.is_ok());
    assert!(rustls::crypto::CryptoProvider::get_default().is_none());
}

/// A hostile or broken server cannot make the client hold more than its bound: a whole
/// response, a stream whose one event never ends, and an error body are all cut.
#[tokio::test]
async fn oversized_responses_are_cut_at_the_bound_and_not_retried() {
    let big_json = format!(r#"{{"choices": [], "pad": "{}"}}"#, "x".repeat(10_000));
    let (server, m) = model(Dialect::OpenAi, vec![Reply::status(200, big_json)]).await;
    let err = ask(&m.with_streaming(false).with_max_response_bytes(4_096))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ModelErrorKind::Decode, "{err}");
    assert!(err.to_string().contains("in one response"), "{err}");
    assert_eq!(
        server.received().len(),
        1,
        "a response too large is not asked again"
    );

    // One event that never ends: no newline, ever.
    let endless = format!("data: {}", "y".repeat(20_000));
    let (server, m) = model(Dialect::OpenAi, vec![Reply::stream(endless)]).await;
    let err = ask(&m.with_max_response_bytes(4_096)).await.unwrap_err();
    assert_eq!(err.kind(), ModelErrorKind::Decode, "{err}");
    assert_eq!(server.received().len(), 1);

    // A huge error body: the refusal quotes its beginning only.
    let (_server, m) = model(
        Dialect::OpenAi,
        vec![Reply::status(400, "z".repeat(2_000_000))],
    )
    .await;
    let err = ask(&m).await.unwrap_err();
    assert_eq!(err.kind(), ModelErrorKind::BadRequest);
    assert!(err.to_string().len() < 1_000, "{}", err.to_string().len());

    // Under the bound, the same model works.
    let ok = fixture("openai/text_only.sse");
    let (_server, m) = model(Dialect::OpenAi, vec![Reply::stream(ok)]).await;
    assert!(ask(&m.with_max_response_bytes(1_000_000)).await.is_ok());
}

/// The weather prompt, for a run whose answer has a schema.
fn prompt_with_schema(schema: serde_json::Value) -> Prompt {
    Prompt {
        answer_schema: Some(schema),
        ..prompt()
    }
}

fn answer_schema() -> serde_json::Value {
    json!({"type": "object", "required": ["sky"], "properties": {"sky": {"type": "string"}}})
}

#[tokio::test]
async fn a_schema_asks_openai_for_structured_output_in_both_dialects() {
    let schema = answer_schema();
    let chat_body = json!({
        "choices": [{"message": {"role": "assistant", "content": "{\"sky\":\"blue\"}"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 20, "completion_tokens": 9}
    });
    let (server, m) = model(
        Dialect::OpenAi,
        vec![Reply::status(200, chat_body.to_string())],
    )
    .await;
    let reply = m
        .with_streaming(false)
        .decide(ModelRequest::new(&prompt_with_schema(schema.clone()), 0))
        .await
        .unwrap();
    assert_eq!(
        reply.decision,
        Ok(Decision::Final {
            answer: "{\"sky\":\"blue\"}".into()
        })
    );
    let sent = &server.received()[0].body;
    assert_eq!(sent["response_format"]["type"], "json_schema");
    assert_eq!(
        sent["response_format"]["json_schema"]["schema"]["required"],
        json!(["sky"])
    );
    assert_eq!(
        sent["tools"].as_array().unwrap().len(),
        1,
        "the run's tools stay offered"
    );

    let body =
        agent_providers::wire::responses::request_body(&prompt_with_schema(schema), "m", false);
    assert_eq!(body["text"]["format"]["type"], "json_schema");
    assert_eq!(body["text"]["format"]["schema"]["required"], json!(["sky"]));
    // Without a schema, neither asks for a format.
    let plain = agent_providers::wire::responses::request_body(&prompt(), "m", false);
    assert!(plain.get("text").is_none());
    let plain = agent_providers::wire::openai::request_body(&prompt(), "m", false);
    assert!(plain.get("response_format").is_none());
}

#[tokio::test]
async fn anthropic_answers_a_schema_through_a_forced_answer_tool() {
    let tool_use = |name: &str| {
        json!({
            "content": [{"type": "tool_use", "id": "toolu_1", "name": name, "input": {"sky": "grey"}}],
            "stop_reason": "tool_use",
            "usage": {"input_tokens": 30, "output_tokens": 5}
        })
        .to_string()
    };
    let (server, m) = model(
        Dialect::Anthropic,
        vec![
            Reply::status(200, tool_use("final_answer")),
            Reply::status(200, tool_use("get_weather")),
        ],
    )
    .await;
    let m = m.with_streaming(false);
    let p = prompt_with_schema(answer_schema());
    let reply = m.decide(ModelRequest::new(&p, 0)).await.unwrap();
    let Ok(Decision::Final { answer }) = &reply.decision else {
        panic!("{:?}", reply.decision)
    };
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(answer).unwrap(),
        json!({"sky": "grey"})
    );
    let sent = &server.received()[0].body;
    assert_eq!(sent["tool_choice"], json!({"type": "any"}));
    let names: Vec<&str> = sent["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["get_weather", "final_answer"]);
    assert_eq!(sent["tools"][1]["input_schema"]["required"], json!(["sky"]));
    // Another tool is still a tool call.
    let reply = m.decide(ModelRequest::new(&p, 1)).await.unwrap();
    assert!(
        matches!(reply.decision, Ok(Decision::ToolCalls { .. })),
        "{:?}",
        reply.decision
    );

    // With thinking the tool is offered, not forced (the API refuses both); a schema that
    // is not an object's is not offered as a tool at all; nor without a schema.
    let thinking = agent_providers::wire::anthropic::request_body_thinking(
        &p,
        "m",
        4096,
        false,
        false,
        Some(agent_providers::Thinking::Budget(2048)),
    );
    assert!(thinking.get("tool_choice").is_none());
    assert_eq!(thinking["tools"].as_array().unwrap().len(), 2);
    let adaptive = agent_providers::wire::anthropic::request_body_thinking(
        &p,
        "m",
        4096,
        false,
        false,
        Some(agent_providers::Thinking::Adaptive),
    );
    assert!(adaptive.get("tool_choice").is_none(), "{adaptive}");
    let list = prompt_with_schema(json!({"type": "array"}));
    let body = agent_providers::wire::anthropic::request_body(&list, "m", 4096, false, false);
    assert!(body.get("tool_choice").is_none());
    assert_eq!(body["tools"].as_array().unwrap().len(), 1);
    let body = agent_providers::wire::anthropic::request_body(&prompt(), "m", 4096, false, false);
    assert!(body.get("tool_choice").is_none());
}

/// A server that reports no usage (some OpenAI-compatible ones do not, streamed or not)
/// gets an estimate from the request's and the reply's size, marked as one, so that a
/// token or cost budget still holds; one that reports usage is taken at its word.
#[tokio::test]
async fn usage_a_server_does_not_report_is_estimated_from_the_sizes() {
    let call = json!({"choices":[{"index":0,"delta":{"role":"assistant","tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}}]},"finish_reason":"tool_calls"}]});
    let stream = format!("data: {call}\n\ndata: [DONE]\n\n");
    let whole = json!({"id": "c", "object": "chat.completion", "choices": [{"index": 0,
        "finish_reason": "stop", "message": {"role": "assistant", "content": "It is sunny."}}]});
    for (reply, streamed) in [
        (Reply::stream(stream), true),
        (Reply::status(200, whole.to_string()), false),
    ] {
        let (server, model) = model(Dialect::OpenAi, vec![reply]).await;
        let model = model
            .with_streaming(streamed)
            .with_price(Price::new(2.0, 8.0));
        let reply = ask(&model).await.unwrap();
        let sent = server.received()[0].body.to_string().len();
        let usage = reply.usage;
        assert!(usage.estimated, "{usage:?}");
        assert_eq!(usage.input_tokens, sent.div_ceil(4) as u64, "{usage:?}");
        let answer = serde_json::to_string(reply.decision.as_ref().unwrap()).unwrap();
        assert_eq!(
            usage.output_tokens,
            (answer.len() + 2).div_ceil(4) as u64,
            "{usage:?}"
        );
        let cost = (usage.input_tokens as f64 * 2.0 + usage.output_tokens as f64 * 8.0) / 1e6;
        assert!((usage.cost_usd - cost).abs() < 1e-12, "priced: {usage:?}");
    }
    let (_server, model) = model(
        Dialect::OpenAi,
        vec![Reply::stream(fixture("openai/text_only.sse"))],
    )
    .await;
    let usage = ask(&model).await.unwrap().usage;
    assert_eq!(
        (usage.input_tokens, usage.output_tokens, usage.estimated),
        (14, 30, false)
    );
}

/// An output cap is asked of each dialect in its own words; without one, the OpenAI
/// dialects ask for none and Anthropic for its default. A call's own limit (its budget
/// leaves only so much) is sent the same way, the smaller of it and the model's cap;
/// without a cap of the model's, only a limit every model takes is sent (OpenAI refuses
/// one past the model's maximum).
#[tokio::test]
async fn an_output_cap_is_sent_in_each_dialect_s_words() {
    let cases = [
        (
            Dialect::OpenAi,
            "openai",
            "openai/text_only.sse",
            "max_completion_tokens",
        ),
        (
            Dialect::OpenAi,
            "openai-compat",
            "openai/text_only.sse",
            "max_tokens",
        ),
        (
            Dialect::OpenAiResponses,
            "openai-responses",
            "openai/responses_text.sse",
            "max_output_tokens",
        ),
        (
            Dialect::Anthropic,
            "anthropic",
            "anthropic/basic_response.txt",
            "max_tokens",
        ),
    ];
    // (the model's cap, the call's, what is asked for; None: the dialect's default)
    let limits = [
        (None, None, None),
        (Some(300), None, Some(300)),
        (None, Some(300), Some(300)),
        (Some(200), Some(300), Some(200)),
        (Some(500), Some(300), Some(300)),
        (None, Some(50_000), None),
        (Some(60_000), Some(50_000), Some(50_000)),
    ];
    for (dialect, provider, answer, field) in cases {
        for (own, asked, expected) in limits {
            let server = Server::start(vec![Reply::stream(fixture(answer))])
                .await
                .unwrap();
            let mut model =
                HttpModel::new(dialect, provider, "m", &server.url, Some("k".into())).unwrap();
            if let Some(own) = own {
                model = model.with_max_output_tokens(own);
            }
            model
                .decide(ModelRequest::new(&prompt(), 0).with_max_output_tokens(asked))
                .await
                .unwrap();
            let body = &server.received()[0].body;
            let expected = match (expected, dialect) {
                (Some(tokens), _) => json!(tokens),
                (None, Dialect::Anthropic) => json!(8_192),
                (None, _) => json!(null),
            };
            assert_eq!(
                body[field], expected,
                "{provider} {own:?} {asked:?}: {body}"
            );
        }
    }
    // A thinking budget is lowered under the call's limit, not the limit raised past it.
    for (asked, budget, limit) in [
        (Some(2_000), 1_999, 2_000),
        (Some(500), 1_024, 1_025),
        (None, 4_000, 8_192),
    ] {
        let (server, model) = model(
            Dialect::Anthropic,
            vec![Reply::stream(fixture("anthropic/basic_response.txt"))],
        )
        .await;
        let model = model.with_thinking(Some(Thinking::Budget(4_000)));
        model
            .decide(ModelRequest::new(&prompt(), 0).with_max_output_tokens(asked))
            .await
            .unwrap();
        let body = &server.received()[0].body;
        assert_eq!(body["thinking"]["budget_tokens"], budget, "{asked:?}");
        assert_eq!(body["max_tokens"], limit, "{asked:?}");
    }
    // What a price lets a call write.
    let priced = HttpModel::new(Dialect::OpenAi, "openai", "m", "http://127.0.0.1:9", None)
        .unwrap()
        .with_price(Price::new(2.0, 8.0));
    assert_eq!(priced.output_tokens_for(0.0026), Some(325));
    assert_eq!(priced.output_tokens_for(-1.0), Some(0));
    assert_eq!(priced.output_tokens_for(f64::NAN), None);
    let unpriced =
        HttpModel::new(Dialect::OpenAi, "openai", "m", "http://127.0.0.1:9", None).unwrap();
    assert_eq!(unpriced.output_tokens_for(1.0), None);
}

/// The effort is sent in each dialect's words, and only when given; thinking adaptively, an
/// Anthropic call may write more by default, its thinking included.
#[tokio::test]
async fn the_effort_is_sent_in_each_dialect_s_words() {
    let cases = [
        (Dialect::OpenAi, "openai", "openai/text_only.sse"),
        (
            Dialect::OpenAiResponses,
            "openai-responses",
            "openai/responses_text.sse",
        ),
        (
            Dialect::Anthropic,
            "anthropic",
            "anthropic/basic_response.txt",
        ),
    ];
    for (dialect, provider, answer) in cases {
        for effort in [None, Some(Effort::Low), Some(Effort::Max)] {
            let server = Server::start(vec![Reply::stream(fixture(answer))])
                .await
                .unwrap();
            let model = HttpModel::new(dialect, provider, "m", &server.url, Some("k".into()))
                .unwrap()
                .with_effort(effort);
            ask(&model).await.unwrap();
            let body = &server.received()[0].body;
            let sent = [
                &body["reasoning_effort"],
                &body["reasoning"]["effort"],
                &body["output_config"]["effort"],
            ];
            let expected = effort.map_or(json!(null), |e| json!(e.as_str()));
            let at = match dialect {
                Dialect::OpenAi => 0,
                Dialect::OpenAiResponses => 1,
                Dialect::Anthropic => 2,
                _ => unreachable!("not among the cases"),
            };
            for (i, value) in sent.iter().enumerate() {
                let want = if i == at { &expected } else { &json!(null) };
                assert_eq!(*value, want, "{provider} {effort:?}: {body}");
            }
        }
    }
    for (cap, limit) in [(None, 16_000), (Some(2_000), 2_000)] {
        let (server, model) = model(
            Dialect::Anthropic,
            vec![Reply::stream(fixture("anthropic/basic_response.txt"))],
        )
        .await;
        let mut model = model.with_thinking(Some(Thinking::Adaptive));
        if let Some(cap) = cap {
            model = model.with_max_output_tokens(cap);
        }
        ask(&model).await.unwrap();
        let body = &server.received()[0].body;
        assert_eq!(body["thinking"], json!({"type": "adaptive"}));
        assert_eq!(body["max_tokens"], limit, "{cap:?}");
    }
}

/// A call that fails for good says what its last attempt may have cost: one the provider
/// accepted (a cut stream) is estimated, one it refused (a 503) cost nothing.
#[tokio::test]
async fn a_call_that_fails_for_good_says_what_its_last_attempt_may_have_cost() {
    let full = fixture("openai/text_only.sse");
    let cut: String = full.chars().take(full.len() / 2).collect();
    for (last, billed) in [
        (Reply::stream(cut.clone()), true),
        (Reply::status(503, "{}"), false),
    ] {
        let (server, model) = model(Dialect::OpenAi, vec![Reply::stream(cut.clone()), last]).await;
        let model = model.with_retry(RetryPolicy {
            max_attempts: 2,
            ..quick()
        });
        let err = ask(&model).await.unwrap_err();
        assert_eq!(err.retries().len(), 1, "{err}");
        assert!(err.retries()[0].usage.estimated, "{err}");
        let spent = err.spent();
        if billed {
            let sent = server.received()[1].body.to_string().len();
            assert!(spent.estimated, "{spent:?}");
            assert_eq!(spent.input_tokens, sent.div_ceil(4) as u64, "{spent:?}");
        } else {
            assert!(spent.is_zero(), "{spent:?}");
        }
    }
}

/// OpenAI's refusal of a reasoning model's calls with tools on Chat Completions, as GPT-5.6
/// words it.
const USE_RESPONSES: &str = r#"{"error":{"message":"Function tools with reasoning_effort are not supported for gpt-5.6-terra in /v1/chat/completions. To use function tools, use /v1/responses or set reasoning_effort to 'none'.","type":"invalid_request_error","param":"reasoning_effort","code":null}}"#;

/// When OpenAI says a model's calls with tools go through its Responses API, the call is
/// made there at once and so are the model's later calls, with the same effort, output cap
/// and cache key in that API's words; the refusal is no retry. A server that only speaks
/// the dialect is taken at its word as it is, and so is another refusal of OpenAI's.
#[tokio::test]
async fn openai_s_word_to_use_the_responses_api_is_followed_at_once_and_after() {
    let server = Server::start(vec![
        Reply::status(400, USE_RESPONSES),
        Reply::stream(fixture("openai/responses_reasoning_tool.sse")),
        Reply::stream(fixture("openai/responses_text.sse")),
    ])
    .await
    .unwrap();
    let terra =
        |url: &str| HttpModel::new(Dialect::OpenAi, "openai", "gpt-5.6-terra", url, None).unwrap();
    let model = terra(&server.url)
        .with_effort(Some(Effort::High))
        .with_max_output_tokens(1_000);
    let p = prompt();
    let first = model
        .decide(ModelRequest::new(&p, 0).with_cache_key(Some("run")))
        .await
        .unwrap();
    let Ok(Decision::ToolCalls { calls }) = &first.decision else {
        panic!("{:?}", first.decision)
    };
    assert_eq!(calls[0].name, "read_file");
    assert!(first.retries.is_empty(), "{:?}", first.retries);
    assert!(matches!(
        first.reasoning[..],
        [Reasoning::ResponsesItem { .. }]
    ));
    let second = model
        .decide(ModelRequest::new(&p, 1).with_cache_key(Some("run")))
        .await
        .unwrap();
    assert!(matches!(second.decision, Ok(Decision::Final { .. })));
    let got = server.received();
    let paths: Vec<&str> = got.iter().map(|r| r.path.as_str()).collect();
    assert_eq!(paths, ["/chat/completions", "/responses", "/responses"]);
    assert_eq!(got[0].body["reasoning_effort"], "high");
    for asked in &got[1..] {
        assert_eq!(asked.body["reasoning"]["effort"], "high", "{}", asked.body);
        assert_eq!(asked.body["max_output_tokens"], 1_000);
        assert_eq!(asked.body["input"][0]["content"], "weather in Paris?");
        assert_eq!(
            asked.body["prompt_cache_key"],
            got[0].body["prompt_cache_key"]
        );
    }

    // Another process going on with that run: the model's last reply came through the
    // Responses API, so its next call goes there at once, refused nowhere.
    let server = Server::start(vec![Reply::stream(fixture("openai/responses_text.sse"))])
        .await
        .unwrap();
    let model = terra(&server.url);
    let mut resumed = prompt();
    resumed.messages.push(Message {
        role: Role::Assistant,
        parts: vec![
            Part::Reasoning {
                reasoning: first.reasoning[0].clone(),
            },
            Part::Text {
                text: "Looking.".into(),
            },
        ],
    });
    resumed.messages.push(Message::user_text("go on"));
    model.decide(ModelRequest::new(&resumed, 1)).await.unwrap();
    assert_eq!(server.received()[0].path, "/responses");

    // Not OpenAI's own API, or not that refusal: the call fails as it did.
    for (provider, refusal) in [
        ("openai-compat", USE_RESPONSES),
        (
            "openai",
            r#"{"error":{"message":"Unsupported value: 'reasoning_effort' does not support 'minimal' with this model.","param":"reasoning_effort"}}"#,
        ),
    ] {
        let server = Server::start(vec![
            Reply::status(400, refusal),
            Reply::stream(fixture("openai/responses_text.sse")),
        ])
        .await
        .unwrap();
        let model = HttpModel::new(Dialect::OpenAi, provider, "m", &server.url, None).unwrap();
        let failed = model.decide(ModelRequest::new(&p, 0)).await.unwrap_err();
        assert!(failed.to_string().contains("HTTP 400"), "{failed}");
        assert_eq!(server.received().len(), 1, "{provider}");
    }
}

/// A stream of Ollama's: thinking, a text answer in pieces, then the counts.
fn ollama_answer() -> String {
    [
        json!({"model":"qwen3","message":{"role":"assistant","content":"","thinking":"Easy."},"done":false}),
        json!({"model":"qwen3","message":{"role":"assistant","content":"Sunny "},"done":false}),
        json!({"model":"qwen3","message":{"role":"assistant","content":"in Paris."},"done":false}),
        json!({"model":"qwen3","message":{"role":"assistant","content":""},"done":true,"done_reason":"stop","prompt_eval_count":40,"eval_count":7}),
    ]
    .iter()
    .map(|line| format!("{line}\n"))
    .collect()
}

/// Ollama's own API: `/api/chat`, the window and the output cap in `options`, the effort as
/// `think`, no key unless one is given; its lines streamed to the display as they come.
#[tokio::test]
async fn ollama_is_asked_with_the_window_and_streams_its_lines() {
    let server = Server::start(vec![
        Reply::ndjson(ollama_answer()),
        Reply::ndjson(ollama_answer()),
    ])
    .await
    .unwrap();
    let shown = Arc::new(Mutex::new(String::new()));
    let sink = Arc::clone(&shown);
    let model = HttpModel::new(Dialect::Ollama, "ollama", "qwen3:8b", &server.url, None)
        .unwrap()
        .with_context_window(32_768)
        .with_max_output_tokens(2_000)
        .with_effort(Some(Effort::Xhigh))
        .with_text_sink(Arc::new(move |t: &str| {
            sink.lock().unwrap().push_str(t);
        }));
    let p = prompt();
    let reply = model
        .decide(ModelRequest::new(&p, 0).with_cache_key(Some("run")))
        .await
        .unwrap();
    assert_eq!(
        reply.decision,
        Ok(Decision::Final {
            answer: "Sunny in Paris.".into()
        })
    );
    assert_eq!(*shown.lock().unwrap(), "Sunny in Paris.");
    assert!(
        !model.counts_whole_prompts(),
        "Ollama counts what it did not have cached"
    );
    let got = &server.received()[0];
    assert_eq!(got.path, "/api/chat");
    assert_eq!(got.header("authorization"), None);
    assert_eq!(
        got.body["options"],
        json!({"num_ctx": 32_768, "num_predict": 2_000})
    );
    assert_eq!(got.body["think"], "high");
    assert_eq!(got.body["stream"], true);
    // Refused past the window, not cut from its start; stopped at it, not shifted.
    assert_eq!(got.body["truncate"], false);
    assert_eq!(got.body["shift"], false);
    assert_eq!(
        got.body["messages"][0],
        json!({"role": "system", "content": "sys"})
    );
    assert_eq!(got.body.get("prompt_cache_key"), None);
    // Ollama counted 40 prompt tokens (what its cache did not hold): the budgets count the
    // prompt as at least its estimate, four bytes of request a token, and say so.
    let least = got.body.to_string().len().div_ceil(4) as u64;
    assert!(least > 40);
    assert_eq!(
        reply.usage,
        Usage {
            estimated: true,
            ..Usage::tokens(least, 7)
        }
    );

    // Whole, with a key (Ollama's cloud), no effort: no `think`, the model's own.
    let whole = Server::start(vec![Reply::status(
        200,
        json!({"message":{"role":"assistant","content":"Hi."},"done":true,"prompt_eval_count":5000,"eval_count":1}).to_string(),
    )])
    .await
    .unwrap();
    let model = HttpModel::new(
        Dialect::Ollama,
        "ollama",
        "m",
        &whole.url,
        Some("ok-1".into()),
    )
    .unwrap()
    .with_streaming(false);
    let reply = model.decide(ModelRequest::new(&p, 0)).await.unwrap();
    assert_eq!(
        reply.decision,
        Ok(Decision::Final {
            answer: "Hi.".into()
        })
    );
    assert_eq!(reply.usage, Usage::tokens(5_000, 1), "a whole count stands");
    let got = &whole.received()[0];
    assert_eq!(got.header("authorization"), Some("Bearer ok-1"));
    assert_eq!(got.body["stream"], false);
    assert_eq!(got.body.get("think"), None);
    assert_eq!(got.body.get("options"), None);

    // A stream that stops before its last line was cut: retried, not taken as an answer.
    let cut: String = ollama_answer()
        .lines()
        .take(3)
        .map(|l| format!("{l}\n"))
        .collect();
    let server = Server::start(vec![Reply::ndjson(cut), Reply::ndjson(ollama_answer())])
        .await
        .unwrap();
    let model = HttpModel::new(Dialect::Ollama, "ollama", "m", &server.url, None)
        .unwrap()
        .with_retry(quick());
    let reply = model.decide(ModelRequest::new(&p, 0)).await.unwrap();
    assert_eq!(reply.retries.len(), 1, "{:?}", reply.retries);
    assert!(matches!(reply.decision, Ok(Decision::Final { .. })));
}

/// Each provider's refusal of a prompt past the model's window, through the transport: a
/// context overflow (with the window when it says it), not retried; other refusals are none.
#[tokio::test]
async fn a_prompt_past_the_window_is_told_apart_with_the_window_when_said() {
    let cases: [(&str, Option<u64>); 8] = [
        // OpenAI, and vLLM in its words.
        (
            r#"{"error":{"message":"This model's maximum context length is 128000 tokens. However, your messages resulted in 130512 tokens. Please reduce the length of the messages.","type":"invalid_request_error","param":"messages","code":"context_length_exceeded"}}"#,
            Some(128_000),
        ),
        (
            r#"{"object":"error","message":"This model's maximum context length is 32768 tokens. However, you requested 33010 tokens (31010 in the messages, 2000 in the completion). Please reduce the length of the messages or completion.","type":"BadRequestError","param":null,"code":400}"#,
            Some(32_768),
        ),
        // OpenAI's Responses API.
        (
            r#"{"error":{"message":"Your input exceeds the context window of this model. Please adjust your input and try again.","type":"invalid_request_error","param":"input","code":"context_length_exceeded"}}"#,
            None,
        ),
        // Anthropic.
        (
            r#"{"type":"error","error":{"type":"invalid_request_error","message":"prompt is too long: 210012 tokens > 200000 maximum"}}"#,
            Some(200_000),
        ),
        // llama.cpp's server.
        (
            r#"{"error":{"code":400,"message":"the request exceeds the available context size, try increasing it","type":"exceed_context_size_error","n_prompt_tokens":5012,"n_ctx":4096}}"#,
            Some(4_096),
        ),
        // Ollama's own API, asked not to cut the prompt (`truncate: false`).
        (
            r#"{"error":"{\"error\":{\"code\":400,\"message\":\"request (351 tokens) exceeds the available context size (256 tokens), try increasing it\",\"type\":\"exceed_context_size_error\",\"n_prompt_tokens\":351,\"n_ctx\":256}}"}"#,
            Some(256),
        ),
        // Gemini.
        (
            r#"{"error":{"code":400,"message":"The input token count (1100000) exceeds the maximum number of tokens allowed (1048576).","status":"INVALID_ARGUMENT"}}"#,
            Some(1_048_576),
        ),
        // Not an overflow.
        (
            r#"{"error":{"message":"Invalid value for 'tool_choice'","type":"invalid_request_error"}}"#,
            None,
        ),
    ];
    for (i, (body, window)) in cases.into_iter().enumerate() {
        let (server, model) = model(Dialect::OpenAi, vec![Reply::status(400, body)]).await;
        let failed = ask(&model).await.unwrap_err();
        assert_eq!(server.received().len(), 1, "not retried: {body}");
        let overflow = failed.context_overflow();
        if i == 7 {
            assert_eq!(overflow, None, "{failed}");
        } else {
            assert_eq!(
                overflow,
                Some(agent_providers::ContextOverflow { window }),
                "{failed}"
            );
        }
    }
    // A 5xx saying the same words is the server's failure, not the prompt's.
    let (_server, model) = model(
        Dialect::OpenAi,
        vec![Reply::status(500, r#"{"error":"maximum context length"}"#); 4],
    )
    .await;
    assert_eq!(ask(&model).await.unwrap_err().context_overflow(), None);
}
