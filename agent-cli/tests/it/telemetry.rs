//! Spans: a run's spans exported over OTLP/HTTP to a collector served here on 127.0.0.1,
//! decoded with the OpenTelemetry protobuf definitions.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::KeyValue;
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message as _;
use serde_json::json;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

use super::{Env, stderr};

/// A collector: answers every POST with 200 and keeps each body with its path.
async fn collector() -> (String, Arc<Mutex<Vec<(String, Vec<u8>)>>>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let got = Arc::new(Mutex::new(Vec::new()));
    let keep = Arc::clone(&got);
    tokio::spawn(async move {
        loop {
            let Ok((mut socket, _)) = listener.accept().await else {
                return;
            };
            let keep = Arc::clone(&keep);
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 8192];
                let (head_end, length) = loop {
                    let n = socket.read(&mut chunk).await.unwrap_or(0);
                    if n == 0 {
                        return;
                    }
                    buf.extend_from_slice(&chunk[..n]);
                    if let Some(at) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                        let head = String::from_utf8_lossy(&buf[..at]).to_ascii_lowercase();
                        let length = head
                            .lines()
                            .find_map(|l| l.strip_prefix("content-length:"))
                            .map_or(0, |v| v.trim().parse::<usize>().unwrap());
                        break (at + 4, length);
                    }
                };
                while buf.len() < head_end + length {
                    let n = socket.read(&mut chunk).await.unwrap_or(0);
                    if n == 0 {
                        return;
                    }
                    buf.extend_from_slice(&chunk[..n]);
                }
                let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
                let path = head.split_whitespace().nth(1).unwrap_or("").to_owned();
                keep.lock()
                    .unwrap()
                    .push((path, buf[head_end..head_end + length].to_vec()));
                let _ = socket
                    .write_all(b"HTTP/1.1 200 OK\r\ncontent-type: application/x-protobuf\r\ncontent-length: 0\r\n\r\n")
                    .await;
            });
        }
    });
    (url, got)
}

/// Every span of the bodies the collector got, with each body's resource.
fn exported(got: &Mutex<Vec<(String, Vec<u8>)>>) -> Vec<(Option<Resource>, Span)> {
    let mut spans = Vec::new();
    for (path, body) in got.lock().unwrap().iter() {
        assert_eq!(path, "/v1/traces");
        let request = ExportTraceServiceRequest::decode(body.as_slice()).unwrap();
        for resource in request.resource_spans {
            for scope in resource.scope_spans {
                spans.extend(
                    scope
                        .spans
                        .into_iter()
                        .map(|s| (resource.resource.clone(), s)),
                );
            }
        }
    }
    spans
}

fn attributes(span: &Span) -> BTreeMap<String, String> {
    values(&span.attributes)
}

/// OTLP key-values as text.
fn values(kvs: &[KeyValue]) -> BTreeMap<String, String> {
    kvs.iter()
        .map(|kv| {
            let value = match kv.value.as_ref().and_then(|v| v.value.as_ref()) {
                Some(AnyValue::StringValue(s)) => s.clone(),
                Some(AnyValue::IntValue(i)) => i.to_string(),
                Some(AnyValue::BoolValue(b)) => b.to_string(),
                Some(AnyValue::DoubleValue(d)) => d.to_string(),
                other => format!("{other:?}"),
            };
            (kv.key.clone(), value)
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runs_spans_reach_an_otlp_collector_with_the_genai_attributes() {
    let (url, got) = collector().await;
    let env = Env::new();
    std::fs::write(env.dir.path().join("a.txt"), "alpha\n").unwrap();
    std::fs::write(env.dir.path().join("b.txt"), "beta\n").unwrap();
    let model = env.script(json!([
        {"tool_calls": [
            {"id": "c1", "name": "read_file", "arguments": {"path": "a.txt"}},
            {"id": "c2", "name": "read_file", "arguments": {"path": "b.txt"}},
            {"id": "c3", "name": "read_file", "arguments": {"path": "missing.txt"}}
        ], "usage": {"input_tokens": 120, "output_tokens": 30,
                     "cache_read_tokens": 90, "cache_write_tokens": 25}},
        {"final": "read", "usage": {"input_tokens": 200, "output_tokens": 5}}
    ]));
    let out = env
        .cmd()
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", &url)
        .env("OTEL_SERVICE_NAME", "agent-test")
        .args(["run", "--json", "--model", &model, "read a and b"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let run_id = serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()["run_id"]
        .as_str()
        .unwrap()
        .to_owned();
    // The process sent what it had before it exited.
    let exported = exported(&got);
    assert!(!exported.is_empty(), "no spans were exported");
    for (resource, _) in &exported {
        let service = resource
            .as_ref()
            .map(|r| values(&r.attributes)["service.name"].clone());
        assert_eq!(
            service.as_deref(),
            Some("agent-test"),
            "the service name comes from OTEL_SERVICE_NAME"
        );
    }
    let spans: Vec<Span> = exported.into_iter().map(|(_, s)| s).collect();
    let named = |name: &str| -> Vec<&Span> { spans.iter().filter(|s| s.name == name).collect() };
    let run = named("invoke_agent agent-loop");
    assert_eq!(
        run.len(),
        1,
        "{:?}",
        spans.iter().map(|s| &s.name).collect::<Vec<_>>()
    );
    let run = run[0];
    let a = attributes(run);
    assert_eq!(a["gen_ai.operation.name"], "invoke_agent");
    assert_eq!(a["gen_ai.agent.name"], "agent-loop");
    assert_eq!(a["gen_ai.conversation.id"], run_id);
    assert_eq!(a["agent.terminal_reason"], "completed");

    let model_name = model.trim_start_matches("script:");
    let chats = named(&format!("chat {model_name}"));
    assert_eq!(chats.len(), 2);
    for chat in &chats {
        assert_eq!(chat.parent_span_id, run.span_id, "a chat is under its run");
        assert_eq!(chat.trace_id, run.trace_id);
        let c = attributes(chat);
        assert_eq!(c["gen_ai.operation.name"], "chat");
        assert_eq!(c["gen_ai.provider.name"], "script");
        assert_eq!(c["gen_ai.request.model"], model_name);
    }
    let first = attributes(chats.iter().min_by_key(|s| s.start_time_unix_nano).unwrap());
    assert_eq!(first["gen_ai.usage.input_tokens"], "120");
    assert_eq!(first["gen_ai.usage.output_tokens"], "30");
    assert_eq!(first["gen_ai.usage.cache_read.input_tokens"], "90");
    assert_eq!(first["gen_ai.usage.cache_creation.input_tokens"], "25");
    assert_eq!(first["gen_ai.response.finish_reasons"], "tool_calls");

    let tools = named("execute_tool read_file");
    assert_eq!(tools.len(), 3);
    let mut by_call = BTreeMap::new();
    for tool in &tools {
        assert_eq!(
            tool.parent_span_id, run.span_id,
            "a tool call is under its run"
        );
        let t = attributes(tool);
        assert_eq!(t["gen_ai.operation.name"], "execute_tool");
        assert_eq!(t["gen_ai.tool.name"], "read_file");
        by_call.insert(t["gen_ai.tool.call.id"].clone(), t);
    }
    assert!(!by_call["c1"].contains_key("error.type"));
    assert_eq!(by_call["c3"]["error.type"], "execution_failed");
    // Parallel reads overlap in time.
    let (c1, c2) = (tools[0], tools[1]);
    assert!(
        c1.start_time_unix_nano < c2.end_time_unix_nano
            && c2.start_time_unix_nano < c1.end_time_unix_nano
    );
    // Commits are spans of the run too; no message content is recorded anywhere.
    assert!(
        named("commit")
            .iter()
            .all(|s| s.parent_span_id == run.span_id)
    );
    assert!(!named("commit").is_empty());
    let everything = format!("{spans:?}");
    assert!(!everything.contains("alpha") && !everything.contains("read a and b"));
}

#[test]
fn without_an_endpoint_nothing_is_exported_and_stderr_stays_quiet() {
    let env = Env::new();
    let model = env.script(json!([{"final": "ok"}]));
    let out = env
        .cmd()
        .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
        .env_remove("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        .env_remove("RUST_LOG")
        .args(["run", "--model", &model, "g"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    assert!(
        !stderr(&out).contains("stopped driving"),
        "{}",
        stderr(&out)
    );
    // With RUST_LOG, the runtime's logs appear on stderr.
    let out = env
        .cmd()
        .env("RUST_LOG", "agent_runtime=info")
        .env("NO_COLOR", "1")
        .args(["run", "--model", &model, "g"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    let err = stderr(&out);
    let line = err
        .lines()
        .find(|l| l.contains("the run stopped driving"))
        .unwrap_or_else(|| panic!("{err}"));
    assert!(line.contains("INFO") && line.contains("run_id="), "{line}");
    assert!(line.contains("reason=\"completed\""), "{line}");
    // So is an endpoint that is not a URL.
    let out = env
        .cmd()
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", "not a url")
        .args(["run", "--model", &model, "g"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    assert!(
        err.contains("invalid endpoint 'not a url'") && err.contains("give a collector's URL"),
        "{err}"
    );
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    // A RUST_LOG that means nothing is said so, before anything runs.
    let out = env
        .cmd()
        .env("RUST_LOG", "agent_runtime=loud")
        .args(["run", "--model", &model, "g"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    assert!(
        err.starts_with("agent: RUST_LOG=\"agent_runtime=loud\""),
        "{err}"
    );
    assert_eq!(err.trim().lines().count(), 1, "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_model_call_is_one_chat_span_with_the_retry_as_its_event() {
    use agent_providers::testing::{Reply, Server};
    let (url, got) = collector().await;
    let text = [
        json!({"choices":[{"index":0,"delta":{"role":"assistant","content":"hi"}}]}),
        json!({"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}),
        json!({"choices":[],"usage":{"prompt_tokens":12,"completion_tokens":1}}),
    ]
    .iter()
    .map(|c| format!("data: {c}\n\n"))
    .collect::<String>()
        + "data: [DONE]\n\n";
    let server = Server::start(vec![
        Reply::status(503, r#"{"error":{"message":"busy","type":"server_error"}}"#),
        Reply::stream(text),
    ])
    .await
    .unwrap();
    let env = Env::new();
    std::fs::write(env.dir.path().join("agent.toml"), "[retry]\nbase_ms = 1\n").unwrap();
    let out = env
        .cmd()
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", &url)
        .env("OPENAI_API_KEY", "sk-test")
        .args([
            "run",
            "--model",
            "openai:gpt-4o",
            "--base-url",
            &server.url,
            "hi",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let spans: Vec<Span> = exported(&got).into_iter().map(|(_, s)| s).collect();
    let chats: Vec<&Span> = spans.iter().filter(|s| s.name == "chat gpt-4o").collect();
    assert_eq!(chats.len(), 1, "one model call, retried inside");
    let chat = attributes(chats[0]);
    assert_eq!(chat["gen_ai.provider.name"], "openai");
    assert_eq!(chat["gen_ai.response.model"], "gpt-4o");
    assert_eq!(chat["gen_ai.usage.input_tokens"], "12");
    assert_eq!(chat["gen_ai.response.finish_reasons"], "stop");
    let retries: Vec<_> = chats[0]
        .events
        .iter()
        .filter(|e| e.name == "retry")
        .collect();
    assert_eq!(retries.len(), 1, "{:?}", chats[0].events);
    let event = values(&retries[0].attributes);
    assert_eq!(event["attempt"], "1");
    assert!(event["reason"].contains("503"), "{event:?}");
}
