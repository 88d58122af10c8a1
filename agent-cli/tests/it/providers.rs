//! The `agent` binary against real wire formats served on 127.0.0.1, and replays.

use agent_providers::testing::{Reply, Server};
use serde_json::{Value, json};

use super::{Env, stderr};

fn fixture(name: &str) -> String {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../agent-providers/tests/fixtures")
        .join(name);
    format!("{}\n\n", std::fs::read_to_string(path).unwrap().trim_end())
}

/// A Chat Completions stream of `chunks`, ended by `[DONE]`.
fn openai_sse(chunks: &[Value]) -> String {
    chunks
        .iter()
        .map(|c| format!("data: {c}\n\n"))
        .collect::<String>()
        + "data: [DONE]\n\n"
}

/// An OpenAI stream that calls `list_dir` once.
fn list_dir_call() -> String {
    openai_sse(&[
        json!({"choices":[{"index":0,"delta":{"role":"assistant","tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"list_dir","arguments":""}}]}}]}),
        json!({"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{}"}}]}}]}),
        json!({"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}),
        json!({"choices":[],"usage":{"prompt_tokens":50,"completion_tokens":7}}),
    ])
}

/// A server that answers `first`, then with a text answer; and a workspace whose
/// `hello.txt` says "hi there".
async fn hello_then_answer(first: String) -> (Server, Env) {
    let server = Server::start(vec![
        Reply::stream(first),
        Reply::stream(fixture("openai/text_only.sse")),
    ])
    .await
    .unwrap();
    let env = Env::new();
    std::fs::write(env.dir.path().join("hello.txt"), "hi there").unwrap();
    (server, env)
}

fn run_json(env: &Env, args: &[&str], key: Option<(&str, &str)>) -> (Option<i32>, Value, String) {
    let mut cmd = env.cmd();
    cmd.env_remove("OPENAI_API_KEY")
        .env_remove("ANTHROPIC_API_KEY");
    if let Some((var, value)) = key {
        cmd.env(var, value);
    }
    let out = cmd.args(args).output().unwrap();
    let v = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    (out.status.code(), v, stderr(&out))
}

/// `agent run --json --model MODEL --base-url URL GOAL` with the key in `key`.
fn run_model(
    env: &Env,
    model: &str,
    url: &str,
    goal: &str,
    key: (&str, &str),
) -> (Option<i32>, Value, String) {
    run_json(
        env,
        &["run", "--json", "--model", model, "--base-url", url, goal],
        Some(key),
    )
}

/// A workspace with `notes.txt` saying hello, and an `agent.toml` of `settings`.
fn notes_and(settings: &str) -> Env {
    let env = Env::new();
    std::fs::write(env.dir.path().join("notes.txt"), "hello\n").unwrap();
    std::fs::write(env.dir.path().join("agent.toml"), settings).unwrap();
    env
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_run_end_to_end_with_tool_results_paired() {
    let server = Server::start(vec![
        Reply::stream(list_dir_call()),
        Reply::stream(fixture("openai/text_only.sse")),
    ])
    .await
    .unwrap();
    let env = Env::new();
    std::fs::write(env.dir.path().join("hello.txt"), "hi").unwrap();
    // A file named after the key: the tool's output holds it, so "never stored" is a
    // claim about redaction, not only about where the key is sent.
    std::fs::write(env.dir.path().join("sk-test-1234567890.txt"), "x").unwrap();
    let (code, v, err) = run_model(
        &env,
        "openai:gpt-4o",
        &server.url,
        "what is here?",
        ("OPENAI_API_KEY", "sk-test-1234567890"),
    );
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(v["reason"], "completed");
    assert!(v["usage"]["input_tokens"].as_u64().unwrap() >= 50);
    let got = server.received();
    assert_eq!(got.len(), 2);
    let messages = got[1].body["messages"].as_array().unwrap();
    let tool = messages.iter().find(|m| m["role"] == "tool").unwrap();
    assert_eq!(tool["tool_call_id"], "call_1");
    assert!(tool["content"].as_str().unwrap().contains("hello.txt"));
    // The key is sent, and never stored.
    let sent = format!("Bearer {}", "sk-test-1234567890");
    assert_eq!(got[0].header("authorization"), Some(sent.as_str()));
    let id = v["run_id"].as_str().unwrap();
    let log = String::from_utf8_lossy(&env.run(&["show", "--json", id]).stdout).into_owned();
    assert!(!log.contains("sk-test-1234567890"));
    assert!(log.contains("[REDACTED:OPENAI_API_KEY].txt"), "{log}");
    assert!(log.contains("\"provider\":\"openai\""));
}

/// A call whose retry the run's budget cannot pay for ends the run on its budget, exit 4
/// and `cost_budget_exceeded` as before a call, not as the provider's failure (exit 5).
/// The budget lets the first attempt go (its prompt, instructions and tools, has some 700
/// tokens at the least), not a second after the first was billed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_the_budget_cannot_pay_for_stops_the_run_on_its_budget() {
    let full = fixture("openai/text_only.sse");
    let cut: String = full.chars().take(full.len() / 2).collect();
    let server = Server::start(vec![Reply::stream(cut), Reply::stream(full)])
        .await
        .unwrap();
    let env = Env::new();
    let (code, v, err) = run_json(
        &env,
        &[
            "run",
            "--json",
            "--model",
            "openai:gpt-4o",
            "--base-url",
            &server.url,
            "--max-tokens",
            "1000",
            "hi",
        ],
        Some(("OPENAI_API_KEY", "test-key-1")),
    );
    assert_eq!(code, Some(4), "{err}");
    assert_eq!(v["reason"], "cost_budget_exceeded", "{v}");
    assert_eq!(v["error_kind"], "transport", "{v}");
    assert!(
        v["advice"].as_str().unwrap().contains("raise --max-tokens"),
        "{v}"
    );
    assert_eq!(server.received().len(), 1, "no second attempt");
}

/// A local server that gives its tool calls no id (as builds of llama.cpp's server and LM
/// Studio do): the run goes on, each call under an id of its own, and the result goes
/// back to the server paired with the call by that id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_gives_calls_no_ids_is_answered_call_by_call() {
    let no_ids = openai_sse(&[
        json!({"choices":[{"index":0,"delta":{"role":"assistant","tool_calls":[{"index":0,"id":"","type":"function","function":{"name":"list_dir","arguments":"{}"}}]}}]}),
        json!({"choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"type":"function","function":{"name":"read_file","arguments":"{\"path\":\"hello.txt\"}"}}]}}]}),
        json!({"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}),
    ]);
    let (server, env) = hello_then_answer(no_ids).await;
    let (code, v, err) = run_json(
        &env,
        &[
            "run",
            "--json",
            "--model",
            "openai-compat:local-model",
            "--base-url",
            &server.url,
            "what is here?",
        ],
        None,
    );
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(v["tool_calls"], 2, "{v}");
    let got = server.received();
    assert_eq!(got.len(), 2);
    let messages = got[1].body["messages"].as_array().unwrap();
    let asked: Vec<&str> =
        messages.iter().find(|m| m["role"] == "assistant").unwrap()["tool_calls"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["id"].as_str().unwrap())
            .collect();
    let answered: Vec<&str> = messages
        .iter()
        .filter(|m| m["role"] == "tool")
        .map(|m| m["tool_call_id"].as_str().unwrap())
        .collect();
    assert_eq!(asked.len(), 2);
    assert!(
        asked.iter().all(|id| !id.is_empty()) && asked[0] != asked[1],
        "{asked:?}"
    );
    assert_eq!(answered, asked, "each result paired with its call");
    let read = messages
        .iter()
        .find(|m| m["role"] == "tool" && m["tool_call_id"] == asked[1])
        .unwrap();
    assert!(
        read["content"].as_str().unwrap().contains("hi there"),
        "{read}"
    );
}

/// Gemini's OpenAI-compatible endpoint streams a call without `index`, in pieces, with
/// its thought signature in `extra_content`; it refuses the next request unless the
/// signature comes back on the call. The run keeps it in its log and sends it back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gemini_call_goes_back_with_its_thought_signature() {
    let extra = json!({"google": {"thought_signature": "CrICAdHtim827fQ=="}});
    let call = openai_sse(&[
        json!({"choices":[{"index":0,"delta":{"role":"assistant","tool_calls":[{"extra_content":extra,"id":"call_1","type":"function","function":{"name":"read_file","arguments":"{\"path\":"}}]}}],"model":"gemini-3-flash-preview"}),
        json!({"choices":[{"index":0,"delta":{"tool_calls":[{"id":"","type":"","function":{"arguments":"\"hello.txt\"}"}}]}}]}),
        json!({"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}),
    ]);
    let (server, env) = hello_then_answer(call).await;
    let (code, v, err) = run_model(
        &env,
        "openai-compat:gemini-3-flash-preview",
        &server.url,
        "what does hello.txt say?",
        ("OPENAI_API_KEY", "k"),
    );
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(v["tool_calls"], 1, "{v}");
    let got = server.received();
    assert_eq!(got.len(), 2);
    let messages = got[1].body["messages"].as_array().unwrap();
    let asked = &messages.iter().find(|m| m["role"] == "assistant").unwrap()["tool_calls"];
    assert_eq!(asked.as_array().unwrap().len(), 1, "{asked}");
    assert_eq!(asked[0]["id"], "call_1");
    assert_eq!(asked[0]["function"]["arguments"], r#"{"path":"hello.txt"}"#);
    assert_eq!(asked[0]["extra_content"], extra, "{asked}");
    let read = messages.iter().find(|m| m["role"] == "tool").unwrap();
    assert!(
        read["content"].as_str().unwrap().contains("hi there"),
        "{read}"
    );
    // The first request had nothing to send back.
    assert!(!got[0].body.to_string().contains("extra_content"));
}

/// DeepSeek's thinking mode streams `reasoning_content` before a call and refuses the
/// next request unless it comes back on that call's message. The run keeps it in its log,
/// sends it back, and `agent show` shows it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deepseek_reasoning_goes_back_with_its_calls_and_shows_in_show() {
    let call = openai_sse(&[
        json!({"choices":[{"index":0,"delta":{"role":"assistant","content":null,"reasoning_content":"I should read "}}]}),
        json!({"choices":[{"index":0,"delta":{"content":null,"reasoning_content":"hello.txt first."}}]}),
        json!({"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_00_x","type":"function","function":{"name":"read_file","arguments":"{\"path\":\"hello.txt\"}"}}]}}]}),
        json!({"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}],"usage":{"prompt_tokens":50,"completion_tokens":20}}),
    ]);
    let (server, env) = hello_then_answer(call).await;
    let (code, v, err) = run_model(
        &env,
        "openai-compat:deepseek-v4-flash",
        &server.url,
        "what does hello.txt say?",
        ("OPENAI_API_KEY", "k"),
    );
    assert_eq!(code, Some(0), "{err}");
    let got = server.received();
    assert_eq!(got.len(), 2);
    let messages = got[1].body["messages"].as_array().unwrap();
    let assistant = messages.iter().find(|m| m["role"] == "assistant").unwrap();
    assert_eq!(
        assistant["reasoning_content"], "I should read hello.txt first.",
        "{assistant}"
    );
    assert_eq!(assistant["tool_calls"][0]["id"], "call_00_x");
    assert!(
        !v["answer"].as_str().unwrap().contains("I should read"),
        "the thinking is never the answer: {v}"
    );
    let id = v["run_id"].as_str().unwrap();
    let shown = super::stdout(&env.run(&["show", id]));
    let line = shown
        .lines()
        .find(|l| l.contains("tool_calls call_00_x"))
        .unwrap();
    assert!(
        line.contains(r#"thinking "I should read hello.txt first.""#),
        "{line}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anthropic_run_and_a_rejected_key() {
    let server = Server::start(vec![
        Reply::stream(fixture("anthropic/basic_response.txt")),
        Reply::status(401, r#"{"type":"error","error":{"type":"authentication_error","message":"invalid x-api-key"}}"#),
    ])
    .await
    .unwrap();
    let env = Env::new();
    let args = [
        "run",
        "--json",
        "--model",
        "anthropic:claude-sonnet-4-5",
        "--base-url",
        &server.url,
        "hi",
    ];
    let (code, v, err) = run_json(&env, &args, Some(("ANTHROPIC_API_KEY", "k-1")));
    assert_eq!(code, Some(0), "{err}");
    assert!(v["answer"].as_str().is_some());
    let (code, v, _) = run_json(&env, &args, Some(("ANTHROPIC_API_KEY", "k-1")));
    assert_eq!(code, Some(5));
    assert_eq!(v["reason"], "model_error");
    assert_eq!(v["error_kind"], "auth", "{v}");
    assert!(
        v["message"]
            .as_str()
            .unwrap()
            .contains("refused the API key"),
        "{v}"
    );
    assert!(
        v["advice"].as_str().unwrap().contains("ANTHROPIC_API_KEY"),
        "the command line, not the library, says what to check: {v}"
    );
    let id = v["run_id"].as_str().unwrap();
    let log: Value = serde_json::from_slice(&env.run(&["show", "--json", id]).stdout).unwrap();
    let failed = log["events"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e.to_string().contains("model_failed"))
        .expect("the failure is in the log");
    assert!(failed.to_string().contains(r#""kind":"auth""#), "{failed}");
    assert_eq!(server.received().len(), 2, "401 is not retried");
}

/// `agent run --json --model MODEL hi` against a server that answers `status` with `body`
/// (exit code, JSON, standard error), and how many requests it got.
async fn refused_run(model: &str, status: u16, body: &str) -> (Option<i32>, Value, String, usize) {
    let server = Server::start(vec![Reply::status(status, body)])
        .await
        .unwrap();
    let env = Env::new();
    let args = [
        "run",
        "--json",
        "--model",
        model,
        "--base-url",
        &server.url,
        "hi",
    ];
    let (code, v, err) = run_json(&env, &args, None);
    (code, v, err, server.received().len())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_without_the_model_or_the_path_says_what_to_check() {
    // Ollama's own answer to a base URL without `/v1`.
    let (code, v, err, asked) =
        refused_run("openai-compat:llama3", 404, "404 page not found").await;
    assert_eq!(code, Some(5), "{err}");
    assert_eq!(v["error_kind"], "not_found", "{v}");
    let advice = v["advice"].as_str().unwrap();
    assert!(
        advice.contains("--model") && advice.contains("http://localhost:11434/v1"),
        "{v}"
    );
    assert_eq!(asked, 1, "404 is not retried");

    // Ollama's own API, for a model not pulled.
    let body = r#"{"error":"model 'qwen3:8b' not found"}"#;
    let (code, v, err, _) = refused_run("ollama:qwen3:8b", 404, body).await;
    assert_eq!(code, Some(5), "{err}");
    assert_eq!(v["error_kind"], "not_found", "{v}");
    assert!(v["advice"].as_str().unwrap().contains("ollama pull"), "{v}");
    assert!(v["message"].as_str().unwrap().contains("not found"), "{v}");

    // A model that cannot call tools, as Ollama refuses it.
    let body = r#"{"error":"registry.ollama.ai/library/gemma:2b does not support tools"}"#;
    let (code, v, err, _) = refused_run("ollama:gemma:2b", 400, body).await;
    assert_eq!(code, Some(5), "{err}");
    let advice = v["advice"].as_str().unwrap();
    assert!(advice.contains("cannot call tools"), "{v}");

    // Not the memory to load it with the run's window: not retried, and said what to give.
    let body =
        r#"{"error":"model requires more system memory (9.1 GiB) than is available (7.2 GiB)"}"#;
    let (code, v, err, asked) = refused_run("ollama:qwen3:8b", 500, body).await;
    assert_eq!(code, Some(5), "{err}");
    assert_eq!(asked, 1, "not retried");
    assert!(
        v["advice"].as_str().unwrap().contains("context_window"),
        "{v}"
    );

    // Nothing listens where Ollama was looked for (it was not started).
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let env = notes_and("[retry]\nmax_attempts = 1\n");
    let url = format!("http://127.0.0.1:{port}");
    let args = [
        "run",
        "--json",
        "--model",
        "ollama:qwen3",
        "--base-url",
        &url,
        "hi",
    ];
    let (code, v, err) = run_json(&env, &args, None);
    assert_eq!(code, Some(5), "{err}");
    assert!(
        v["advice"].as_str().unwrap().contains("ollama serve"),
        "{v}"
    );
}

#[test]
fn missing_keys_and_base_urls_are_usage_errors_before_anything_is_written() {
    let env = Env::new();
    for (args, expected) in [
        (
            vec!["run", "--model", "openai:gpt-4o", "g"],
            "OPENAI_API_KEY is not set",
        ),
        (
            vec!["run", "--model", "anthropic:claude-sonnet-4-5", "g"],
            "ANTHROPIC_API_KEY is not set",
        ),
        (
            vec!["run", "--model", "openai-compat:llama3.1", "g"],
            "needs --base-url",
        ),
        (vec!["run", "--model", "replay:NOPE", "g"], "no store at"),
        (
            vec!["run", "--model", "x:y", "--tools", "record:x", "g"],
            "unknown provider",
        ),
    ] {
        let (code, _, err) = run_json(&env, &args, None);
        assert_eq!(code, Some(2), "{args:?}: {err}");
        assert!(err.contains(expected), "{args:?}: {err}");
        assert!(!env.store().exists());
    }
}

#[test]
fn replay_reproduces_a_run_and_tool_replay_answers_from_the_log() {
    let env = Env::new();
    std::fs::write(env.dir.path().join("notes.txt"), "the answer is 42\n").unwrap();
    let model = env.script(json!([
        {"tool_calls": [{"id": "c1", "name": "read_file", "arguments": {"path": "notes.txt"}}]},
        {"final": "42"}
    ]));
    let (code, v, err) = run_json(&env, &["run", "--json", "--model", &model, "g"], None);
    assert_eq!(code, Some(0), "{err}");
    let id = v["run_id"].as_str().unwrap().to_owned();

    // Model replay: the same decisions, tools for real.
    let (code, v, err) = run_json(
        &env,
        &["run", "--json", "--model", &format!("replay:{id}"), "g"],
        None,
    );
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(v["answer"], "42");
    assert_eq!(v["tool_calls"], 1);

    // Tool replay: the file is gone, yet the read answers from the recorded run.
    std::fs::remove_file(env.dir.path().join("notes.txt")).unwrap();
    let other = env.script(json!([
        {"tool_calls": [
            {"id": "x1", "name": "read_file", "arguments": {"path": "notes.txt"}},
            {"id": "x2", "name": "read_file", "arguments": {"path": "other.txt"}}
        ]},
        {"final": "done"}
    ]));
    let (code, v, err) = run_json(
        &env,
        &[
            "run",
            "--json",
            "--model",
            &other,
            "--tools",
            &format!("replay:{id}"),
            "g",
        ],
        None,
    );
    assert_eq!(code, Some(0), "{err}");
    let show: Value = serde_json::from_slice(
        &env.run(&["show", "--json", v["run_id"].as_str().unwrap()])
            .stdout,
    )
    .unwrap();
    let results: Vec<&Value> = show["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["type"] == "tool_finished")
        .map(|e| &e["result"])
        .collect();
    assert!(
        results[0]["output"]
            .as_str()
            .unwrap()
            .contains("the answer is 42")
    );
    assert!(
        results[1]["error"]["message"]
            .as_str()
            .unwrap()
            .contains("has no result for read_file")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_priced_model_stops_at_the_cost_budget() {
    let server = Server::start(vec![
        Reply::stream(list_dir_call()),
        Reply::stream(list_dir_call()),
    ])
    .await
    .unwrap();
    let env = Env::new();
    std::fs::write(
        env.dir.path().join("agent.toml"),
        "max_cost_usd = 0.0001\n[prices.\"gpt-4o\"]\ninput = 2.5\noutput = 10.0\n",
    )
    .unwrap();
    let (code, v, err) = run_model(
        &env,
        "openai:gpt-4o",
        &server.url,
        "g",
        ("OPENAI_API_KEY", "sk-x"),
    );
    assert_eq!(code, Some(4), "{err}");
    assert_eq!(v["reason"], "cost_budget_exceeded");
    // Its first prompt (instructions and tools: some 700 tokens at the least, by half of
    // o200k's count) costs more than $0.0001 at $2.50 a million: it is not sent.
    assert_eq!(server.received().len(), 0);
    let message = v["message"].as_str().unwrap();
    assert!(
        message.contains("$0.0000 spent, and the next call's prompt alone costs at least $0.00"),
        "{message}"
    );
}

/// A call whose prompt alone would pass the cost budget is not sent: the provider counted
/// 1,000 tokens in the last prompt, the next has at least those, and they cost at least
/// $0.0005 at the cache-read rate. Over the wire, as a user meets it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_whose_prompt_alone_passes_the_cost_budget_is_not_sent() {
    let call = list_dir_call()
        .replace(r#""prompt_tokens":50"#, r#""prompt_tokens":1000"#)
        .replace(r#""completion_tokens":7"#, r#""completion_tokens":10"#);
    assert!(
        call.contains(r#""completion_tokens":10,"prompt_tokens":1000"#),
        "{call}"
    );
    // $0.00208 a call; after one, $0.0025 leaves less than the next prompt's $0.0005. Each
    // call may write what is left at $8 a million once its prompt is paid for: $0.0025
    // buys 312 tokens; $0.0026 buys 325, then $0.00002 buys 2.
    for (max, sent, caps) in [("0.0025", 1, vec![312]), ("0.0026", 2, vec![325, 2])] {
        let server = Server::start(vec![
            Reply::stream(call.clone()),
            Reply::stream(call.clone()),
        ])
        .await
        .unwrap();
        let env = Env::new();
        std::fs::write(
            env.dir.path().join("agent.toml"),
            format!(
                "max_cost_usd = {max}\n[prices.\"gpt-4.1\"]\ninput = 2.0\noutput = 8.0\ncache_read = 0.5\n"
            ),
        )
        .unwrap();
        let (code, v, err) = run_model(
            &env,
            "openai:gpt-4.1",
            &server.url,
            "g",
            ("OPENAI_API_KEY", "sk-x"),
        );
        assert_eq!(code, Some(4), "{err}");
        assert_eq!(v["reason"], "cost_budget_exceeded");
        assert_eq!(server.received().len(), sent, "max {max}: {v}");
        let asked: Vec<_> = server
            .received()
            .iter()
            .map(|r| r.body["max_completion_tokens"].clone())
            .collect();
        assert_eq!(asked, caps.iter().map(|c| json!(c)).collect::<Vec<_>>());
        let message = v["message"].as_str().unwrap();
        assert_eq!(
            message.contains("the next call's prompt alone costs at least $0.0005"),
            sent == 1,
            "{message}"
        );
    }
}

/// A cost budget with no price for the model would never stop a run (every call would
/// count as free): such a run is refused before anything is asked or written, and so is
/// continuing a budgeted run once its price is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cost_budget_without_the_models_price_is_refused_before_anything_is_spent() {
    let server = Server::start(vec![Reply::stream(fixture("openai/text_only.sse"))])
        .await
        .unwrap();
    let env = Env::new();
    let toml = env.dir.path().join("agent.toml");
    std::fs::write(&toml, "max_cost_usd = 0.5\n").unwrap();
    let key = Some(("OPENAI_API_KEY", "sk-x"));
    let url = server.url.as_str();
    let (code, _, err) = run_json(
        &env,
        &[
            "run",
            "--json",
            "--model",
            "openai:gpt-4.1",
            "--base-url",
            url,
            "g",
        ],
        key,
    );
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("cost budget is $0.5")
            && err.contains("openai:gpt-4.1")
            && err.contains("[prices.\"gpt-4.1\"]"),
        "{err}"
    );
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(server.received().is_empty(), "no model call was made");
    let runs: Value = serde_json::from_slice(&env.run(&["runs", "--json"]).stdout).unwrap();
    assert_eq!(
        runs.as_array().map(Vec::len),
        Some(0),
        "no run was written: {runs}"
    );

    // Priced, the run goes; without the price again, it is not continued.
    std::fs::write(
        &toml,
        "max_cost_usd = 0.5\n[prices.\"gpt-4.1\"]\ninput = 2.0\noutput = 8.0\n",
    )
    .unwrap();
    let (code, v, err) = run_json(
        &env,
        &[
            "run",
            "--json",
            "--model",
            "openai:gpt-4.1",
            "--base-url",
            url,
            "g",
        ],
        key,
    );
    assert_eq!(code, Some(0), "{err}");
    let run = v["run_id"].as_str().unwrap().to_owned();
    let logged = |env: &Env| -> usize {
        let show: Value =
            serde_json::from_slice(&env.run(&["show", "--json", &run]).stdout).unwrap();
        show["events"].as_array().unwrap().len()
    };
    let before = logged(&env);
    std::fs::write(&toml, "max_cost_usd = 0.5\n").unwrap();
    let (code, _, err) = run_json(
        &env,
        &[
            "resume",
            "--json",
            "--model",
            "openai:gpt-4.1",
            "--base-url",
            url,
            &run,
            "more",
        ],
        key,
    );
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("[prices.\"gpt-4.1\"]"), "{err}");
    assert_eq!(logged(&env), before, "the message was not committed");
    assert_eq!(server.received().len(), 1);
}

/// `max_output_tokens` in agent.toml caps every model call's output, in the dialect's own
/// words; a queued run carries it; a project file that raises it past Anthropic's default
/// needs trust, as a longer reply costs more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_output_cap_comes_from_agent_toml() {
    let server = Server::start(vec![
        Reply::stream(fixture("openai/text_only.sse")),
        Reply::stream(fixture("openai/text_only.sse")),
    ])
    .await
    .unwrap();
    let env = Env::new();
    let toml = env.dir.path().join("agent.toml");
    std::fs::write(&toml, "max_output_tokens = 300\n").unwrap();
    let (code, _, err) = run_model(
        &env,
        "openai:gpt-4o",
        &server.url,
        "g",
        ("OPENAI_API_KEY", "sk-x"),
    );
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(server.received()[0].body["max_completion_tokens"], 300);
    // Raised past the default by a project file: asked about, not taken silently.
    std::fs::write(&toml, "max_output_tokens = 64000\n").unwrap();
    let (code, _, err) = run_json(
        &env,
        &[
            "run",
            "--json",
            "--no-input",
            "--model",
            "openai:gpt-4o",
            "--base-url",
            &server.url,
            "g",
        ],
        Some(("OPENAI_API_KEY", "sk-x")),
    );
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("max_output_tokens 64000"), "{err}");
    assert_eq!(server.received().len(), 1, "nothing was asked");
}

/// A provider that echoes the key in its error: the key is in neither the log nor the
/// summary on stderr.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_echoed_by_the_provider_is_redacted_on_stderr_too() {
    let key = format!("sk-test-{}", "9876543210abcdef");
    let server = Server::start(vec![Reply::status(
        401,
        format!(r#"{{"error":{{"message":"Incorrect API key provided: {key}","type":"invalid_request_error"}}}}"#),
    )])
    .await
    .unwrap();
    let env = Env::new();
    let (code, _, err) = run_json(
        &env,
        &[
            "run",
            "--model",
            "openai:gpt-4o",
            "--base-url",
            &server.url,
            "hi",
        ],
        Some(("OPENAI_API_KEY", &key)),
    );
    assert_eq!(code, Some(5), "{err}");
    assert!(!err.contains(&key), "{err}");
    assert!(err.contains("model_error"), "{err}");
    let runs: Value = serde_json::from_slice(&env.run(&["runs", "--json"]).stdout).unwrap();
    let id = runs[0]["run_id"].as_str().unwrap();
    let log = String::from_utf8_lossy(&env.run(&["show", "--json", id]).stdout).into_owned();
    assert!(!log.contains(&key));
}

/// An Anthropic stream answering `text`, whose prompt was read from the cache but for
/// `uncached` tokens.
fn anthropic_cached_answer(text: &str, uncached: u64, read: u64) -> String {
    [
        (
            "message_start",
            json!({"type":"message_start","message":{"id":"msg_2","type":"message","role":"assistant","model":"claude-sonnet-4-5","content":[],"stop_reason":null,"usage":{"input_tokens":uncached,"cache_creation_input_tokens":0,"cache_read_input_tokens":read,"output_tokens":1}}}),
        ),
        (
            "content_block_start",
            json!({"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}),
        ),
        (
            "content_block_delta",
            json!({"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":text}}),
        ),
        ("content_block_stop", json!({"type":"content_block_stop","index":0})),
        (
            "message_delta",
            json!({"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":12}}),
        ),
        ("message_stop", json!({"type":"message_stop"})),
    ]
    .iter()
    .map(|(event, data)| format!("event: {event}\ndata: {data}\n\n"))
    .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anthropic_prompt_caching_marks_requests_and_prices_cached_tokens() {
    let server = Server::start(vec![
        Reply::stream(fixture("anthropic/cached_tool_use_response.txt")),
        Reply::stream(anthropic_cached_answer("It says hello.", 50, 188_107)),
    ])
    .await
    .unwrap();
    let env = notes_and(
        "[prices.\"claude-sonnet-4-5\"]\ninput = 3.0\noutput = 15.0\ncache_read = 0.3\ncache_write = 3.75\n",
    );
    let args = |url: &str| {
        [
            "run",
            "--json",
            "--model",
            "anthropic:claude-sonnet-4-5",
            "--base-url",
            url,
            "what do the notes say?",
        ]
        .map(str::to_owned)
    };
    let run = |args: &[String]| {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        run_json(&env, &args, Some(("ANTHROPIC_API_KEY", "sk-ant-test")))
    };
    let (code, v, err) = run(&args(&server.url));
    assert_eq!(code, Some(0), "{err}");
    // Both calls' prompts, cached tokens included; what the cache read and wrote.
    let (write_in, read_in) = (21 + 188_086, 50 + 188_107);
    assert_eq!(v["usage"]["input_tokens"], write_in + read_in);
    assert_eq!(v["usage"]["cache_write_tokens"], 188_086);
    assert_eq!(v["usage"]["cache_read_tokens"], 188_107);
    assert_eq!(v["usage"]["output_tokens"], 393 + 12);
    let cost =
        (21.0 * 3.0 + 188_086.0 * 3.75 + 393.0 * 15.0 + 50.0 * 3.0 + 188_107.0 * 0.3 + 12.0 * 15.0)
            / 1e6;
    let got = v["usage"]["cost_usd"].as_f64().unwrap();
    assert!((got - cost).abs() < 1e-9, "{got} against {cost}");
    // The second request marks the tools, the system text and the two user messages.
    let sent = server.received();
    let second = &sent[1].body;
    assert_eq!(second["system"][0]["cache_control"]["type"], "ephemeral");
    let tools = second["tools"].as_array().unwrap();
    assert_eq!(tools.last().unwrap()["cache_control"]["type"], "ephemeral");
    let marked: Vec<usize> = second["messages"]
        .as_array()
        .unwrap()
        .iter()
        .enumerate()
        .filter(|(_, m)| {
            m["content"]
                .as_array()
                .unwrap()
                .last()
                .unwrap()
                .get("cache_control")
                .is_some()
        })
        .map(|(i, _)| i)
        .collect();
    assert_eq!(marked, [0, 2], "the goal and the tool result");
    // `agent show` says what the cache did, per call and for the run.
    let id = v["run_id"].as_str().unwrap();
    let show = env.run(&["show", id]);
    let shown = super::stdout(&show);
    assert!(
        shown.contains("(188107 in (188086 cache write), 393 out, $0.7113)"),
        "{shown}"
    );
    let total = format!(
        "usage: {} in (188107 cache read, 188086 cache write), 405 out, ${cost:.4}",
        write_in + read_in
    );
    assert_eq!(
        stderr(&show).trim(),
        total,
        "the total is on standard error"
    );

    // Turned off in agent.toml: no marks at all.
    let server = Server::start(vec![Reply::stream(anthropic_cached_answer("Hi.", 10, 0))])
        .await
        .unwrap();
    std::fs::write(env.dir.path().join("agent.toml"), "prompt_cache = false\n").unwrap();
    let (code, _, err) = run(&args(&server.url));
    assert_eq!(code, Some(0), "{err}");
    let body = server.received()[0].body.to_string();
    assert!(!body.contains("cache_control"), "{body}");
}

/// A text answer from OpenAI whose prompt of `prompt` tokens had `read` read from the
/// cache and `written` written to it (GPT-5.6 and later report writes).
fn openai_cached_answer(prompt: u64, read: u64, written: u64) -> String {
    openai_sse(&[
        json!({"choices":[{"index":0,"delta":{"role":"assistant","content":"It says hi there."}}]}),
        json!({"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}),
        json!({"choices":[],"usage":{"prompt_tokens":prompt,"completion_tokens":6,
            "prompt_tokens_details":{"cached_tokens":read,"cache_write_tokens":written}}}),
    ])
}

/// OpenAI routes a request to its prompt caches by the `prompt_cache_key` it comes with:
/// every call of a run has the run's key, a fork its parent's (its first prompt is one the
/// parent sent), another run another. What GPT-5.6 writes to its cache is billed at 1.25
/// times an uncached token, and counted so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_calls_of_a_run_share_a_cache_key_and_cache_writes_are_priced() {
    let server = Server::start(vec![
        Reply::stream(list_dir_call()),
        Reply::stream(fixture("openai/text_only.sse")),
        Reply::stream(openai_cached_answer(2600, 2000, 400)),
        Reply::stream(fixture("openai/text_only.sse")),
    ])
    .await
    .unwrap();
    let env = Env::new();
    std::fs::write(
        env.dir.path().join("agent.toml"),
        "[prices.\"gpt-5.6\"]\ninput = 2.0\noutput = 10.0\ncache_read = 0.2\n",
    )
    .unwrap();
    let key = ("OPENAI_API_KEY", "sk-x");
    let url = server.url.as_str();
    let (code, v, err) = run_model(&env, "openai:gpt-5.6", url, "what is here?", key);
    assert_eq!(code, Some(0), "{err}");
    let parent = v["run_id"].as_str().unwrap().to_owned();
    let fork = [
        "fork",
        "--json",
        &parent,
        "--at",
        "2",
        "--model",
        "openai:gpt-5.6",
    ];
    let (code, forked, err) =
        run_json(&env, &[&fork[..], &["--base-url", url]].concat(), Some(key));
    assert_eq!(code, Some(0), "{err}");
    let (code, _, err) = run_model(&env, "openai:gpt-5.6", url, "and now?", key);
    assert_eq!(code, Some(0), "{err}");
    let sent = server.received();
    let keys: Vec<&str> = sent
        .iter()
        .map(|r| r.body["prompt_cache_key"].as_str().unwrap())
        .collect();
    assert_eq!(keys[0], keys[1], "one run, one key");
    assert_eq!(
        keys[2], keys[0],
        "a fork's calls go where its parent's prefix is"
    );
    assert_eq!(sent[2].body["messages"], sent[1].body["messages"]);
    assert_ne!(keys[3], keys[0], "another run, another key");
    assert!(!keys[0].contains(&parent), "{}", keys[0]);

    // The fork's call: 200 tokens neither read nor written, 2,000 read at $0.20/M, 400
    // written at 1.25 x $2/M (no cache_write price given), 6 out at $10/M; with the call
    // it inherited (50 in, 7 out).
    assert_eq!(forked["usage"]["cache_write_tokens"], 400, "{forked}");
    assert_eq!(forked["usage"]["cache_read_tokens"], 2000);
    let own = (200.0 * 2.0 + 2000.0 * 0.2 + 400.0 * 2.5 + 6.0 * 10.0) / 1e6;
    let cost = own + (50.0 * 2.0 + 7.0 * 10.0) / 1e6;
    let got = forked["usage"]["cost_usd"].as_f64().unwrap();
    assert!((got - cost).abs() < 1e-12, "{got} against {cost}");
    let show = env.run(&["show", forked["run_id"].as_str().unwrap()]);
    let shown = super::stdout(&show);
    let line = format!("(2600 in (2000 cache read, 400 cache write), 6 out, ${own:.4})");
    assert!(shown.contains(&line), "{line} in {shown}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anthropic_thinking_goes_back_with_the_tool_results_and_shows_in_show() {
    let server = Server::start(vec![
        Reply::stream(fixture("anthropic/thinking_tool_use_response.txt")),
        Reply::stream(anthropic_cached_answer("They say hello.", 700, 0)),
    ])
    .await
    .unwrap();
    let env = notes_and("thinking = 2048\n");
    // Thinking is billed: a project's file asks for it only once a person trusted it.
    let out = env.run(&["trust"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let (code, v, err) = run_model(
        &env,
        "anthropic:claude-sonnet-4-5",
        &server.url,
        "what do the notes say?",
        ("ANTHROPIC_API_KEY", "sk-ant-test"),
    );
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(
        v["answer"], "They say hello.",
        "the thinking is never the answer"
    );
    let sent = server.received();
    assert_eq!(
        sent[0].body["thinking"],
        json!({"type": "enabled", "budget_tokens": 2048})
    );
    // The tool-use turn's assistant message comes back with its thinking first, unchanged.
    let messages = sent[1].body["messages"].as_array().unwrap();
    let assistant = messages.iter().find(|m| m["role"] == "assistant").unwrap();
    let blocks = assistant["content"].as_array().unwrap();
    let recorded = fixture("anthropic/thinking_tool_use_response.txt");
    let signature = "EqQBCgIYAhIM1gbcDa9GJwZA2b3hGgxBdjrkzLoky3dl1pkiMOYds/+==";
    assert!(recorded.contains(signature));
    assert_eq!(blocks[0]["type"], "thinking");
    assert_eq!(blocks[0]["signature"], signature);
    assert_eq!(
        blocks[0]["thinking"],
        "The user wants to know what the notes say.\n\nI should read notes.txt before \
         answering, with \"read_file\"."
    );
    assert_eq!(blocks[1]["type"], "redacted_thinking");
    assert_eq!(blocks[2]["type"], "tool_use");
    // A person reads it in `agent show`, escaped, on the decision's line.
    let id = v["run_id"].as_str().unwrap();
    let shown = super::stdout(&env.run(&["show", id]));
    let line = shown
        .lines()
        .find(|l| l.contains("tool_calls toolu_01ThinkingExample"))
        .unwrap();
    assert!(
        line.contains(r#"thinking "The user wants to know what the notes say.\n\nI should read"#),
        "{line}"
    );
    // An out-of-range budget is a configuration error, before any call.
    std::fs::write(env.dir.path().join("agent.toml"), "thinking = 10\n").unwrap();
    let (code, _, err) = run_json(
        &env,
        &[
            "run",
            "--model",
            "anthropic:claude-sonnet-4-5",
            "--base-url",
            &server.url,
            "hi",
        ],
        Some(("ANTHROPIC_API_KEY", "sk-ant-test")),
    );
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("thinking = 10: give at least 1024"), "{err}");
    assert_eq!(server.received().len(), 2);
}

/// The current Claude models think adaptively (Claude Opus 4.7 refuses a budget), guided by
/// an effort, which OpenAI's reasoning models take too: both from agent.toml, over the wire.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adaptive_thinking_and_the_effort_come_from_agent_toml() {
    let server = Server::start(vec![
        Reply::stream(fixture("anthropic/thinking_tool_use_response.txt")),
        Reply::stream(anthropic_cached_answer("They say hello.", 700, 0)),
        Reply::stream(fixture("openai/text_only.sse")),
    ])
    .await
    .unwrap();
    let env = notes_and("thinking = \"adaptive\"\neffort = \"medium\"\n");
    let out = env.run(&["trust"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let (code, v, err) = run_model(
        &env,
        "anthropic:claude-opus-4-7",
        &server.url,
        "what do the notes say?",
        ("ANTHROPIC_API_KEY", "sk-ant-test"),
    );
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(v["answer"], "They say hello.");
    let sent = server.received();
    for request in &sent {
        assert_eq!(request.body["thinking"], json!({"type": "adaptive"}));
        assert_eq!(request.body["output_config"], json!({"effort": "medium"}));
        assert_eq!(request.body["max_tokens"], 16_000, "room for the thinking");
    }
    // The thinking went back with the tool's result, as with a budget.
    let messages = sent[1].body["messages"].as_array().unwrap();
    let assistant = messages.iter().find(|m| m["role"] == "assistant").unwrap();
    assert_eq!(assistant["content"][0]["type"], "thinking");
    let (code, _, err) = run_model(
        &env,
        "openai:gpt-5",
        &server.url,
        "hi",
        ("OPENAI_API_KEY", "sk-x"),
    );
    assert_eq!(code, Some(0), "{err}");
    let body = &server.received()[2].body;
    assert_eq!(body["reasoning_effort"], "medium");
    assert!(body.get("thinking").is_none(), "{body}");
}

/// `openai:gpt-5.6-terra` with tools: OpenAI's Chat Completions refuses its calls and
/// names the Responses API, where the run goes on, its reasoning passed back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_openai_model_chat_completions_refuses_runs_through_the_responses_api() {
    let refusal = r#"{"error":{"message":"Function tools with reasoning_effort are not supported for gpt-5.6-terra in /v1/chat/completions. To use function tools, use /v1/responses or set reasoning_effort to 'none'.","type":"invalid_request_error","param":"reasoning_effort","code":null}}"#;
    let server = Server::start(vec![
        Reply::status(400, refusal),
        Reply::stream(fixture("openai/responses_reasoning_tool.sse")),
        Reply::stream(fixture("openai/responses_text.sse")),
    ])
    .await
    .unwrap();
    let env = notes_and("");
    let base = format!("{}/v1", server.url);
    let key = ("OPENAI_API_KEY", "sk-x");
    let (code, v, err) = run_model(
        &env,
        "openai:gpt-5.6-terra",
        &base,
        "what do the notes say?",
        key,
    );
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(v["answer"], "The notes say hello.");
    let sent = server.received();
    let paths: Vec<&str> = sent.iter().map(|r| r.path.as_str()).collect();
    assert_eq!(
        paths,
        ["/v1/chat/completions", "/v1/responses", "/v1/responses"]
    );
    let input = sent[2].body["input"].as_array().unwrap();
    assert_eq!(input[1]["type"], "reasoning", "{input:?}");
    let show = env.run(&["show", v["run_id"].as_str().unwrap()]);
    assert!(
        !super::stdout(&show).contains("retr"),
        "the refusal is no retry"
    );
}

/// A Chat Completions stream that reads `part{i}.txt`, whose prompt the server counted as
/// `prompt_tokens`.
fn read_part(i: usize, prompt_tokens: u64) -> String {
    openai_sse(&[
        json!({"choices":[{"index":0,"delta":{"role":"assistant","tool_calls":[{"index":0,"id":format!("call_{i}"),"type":"function","function":{"name":"read_file","arguments":format!("{{\"path\":\"part{i}.txt\"}}")}}]}}]}),
        json!({"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}),
        json!({"choices":[],"usage":{"prompt_tokens":prompt_tokens,"completion_tokens":9}}),
    ])
}

/// `count` files `part{i}.txt` in the workspace of `env`, each of `words` distinct words.
fn write_parts(env: &Env, count: usize, words: usize) {
    for i in 0..count {
        let text: Vec<String> = (0..words).map(|w| format!("w{i}x{w}")).collect();
        std::fs::write(env.dir.path().join(format!("part{i}.txt")), text.join(" ")).unwrap();
    }
}

/// `agent run` of `openai-compat:local` at `url`, asked to read the parts.
fn read_the_parts(env: &Env, url: &str) -> (Option<i32>, Value, String) {
    let key = ("OPENAI_API_KEY", "k");
    run_model(env, "openai-compat:local", url, "read the parts", key)
}

/// The types of the events of run `id`, in order.
fn event_kinds(env: &Env, id: &str) -> Vec<String> {
    let show = env.run(&["show", "--json", id]);
    let shown: Value = serde_json::from_str(&super::stdout(&show)).unwrap();
    shown["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["type"].as_str().unwrap().to_owned())
        .collect()
}

/// A server that counts only the prompt tokens it did not have cached (Ollama, whose cache
/// keeps the start of the last prompt) reports a few dozen a call however long the prompt
/// grew. Taken as the prompt's size, its counts kept the prompt from ever being compacted,
/// past the window; the prompt is compacted as the window says.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_counting_only_uncached_tokens_still_gets_a_compacted_prompt() {
    let mut replies: Vec<Reply> = (0..10).map(|i| Reply::stream(read_part(i, 30))).collect();
    replies.push(Reply::stream(fixture("openai/text_only.sse")));
    let server = Server::start(replies).await.unwrap();
    let env = notes_and("context_window = 2000\n");
    write_parts(&env, 10, 100);
    let (code, v, err) = read_the_parts(&env, &server.url);
    assert_eq!(code, Some(0), "{err}");
    let kinds = event_kinds(&env, v["run_id"].as_str().unwrap());
    assert!(kinds.iter().any(|k| k == "context_compacted"), "{kinds:?}");
}

/// Lines of Ollama's `/api/chat` stream.
fn ollama_lines(lines: &[Value]) -> String {
    lines.iter().map(|line| format!("{line}\n")).collect()
}

/// `ollama:MODEL` talks to Ollama's own API and has it load the model with the window the
/// run keeps its prompt within (32,768 tokens unless agent.toml says), where its
/// OpenAI-compatible endpoint would have left the server's default and dropped the start
/// of a longer prompt. Thinking is kept and goes back with the calls it led to.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ollama_run_loads_the_model_with_the_run_s_window() {
    let call = ollama_lines(&[
        json!({"model":"qwen3:8b","message":{"role":"assistant","content":"","thinking":"Look at the notes."},"done":false}),
        json!({"model":"qwen3:8b","message":{"role":"assistant","content":"","tool_calls":[{"function":{"index":0,"name":"read_file","arguments":{"path":"notes.txt"}}}]},"done":false}),
        json!({"model":"qwen3:8b","message":{"role":"assistant","content":""},"done":true,"done_reason":"stop","prompt_eval_count":900,"eval_count":20}),
    ]);
    let answer = ollama_lines(&[
        json!({"model":"qwen3:8b","message":{"role":"assistant","content":"They say hello."},"done":false}),
        json!({"model":"qwen3:8b","message":{"role":"assistant","content":""},"done":true,"done_reason":"stop","prompt_eval_count":60,"eval_count":5}),
    ]);
    let server = Server::start(vec![
        Reply::ndjson(call),
        Reply::ndjson(answer.clone()),
        Reply::ndjson(answer),
    ])
    .await
    .unwrap();
    let env = notes_and("");
    let run = |goal: &str| {
        let args = [
            "run",
            "--json",
            "--model",
            "ollama:qwen3:8b",
            "--base-url",
            &server.url,
            goal,
        ];
        let mut cmd = env.cmd();
        cmd.env_remove("OLLAMA_API_KEY");
        let out = cmd.args(args).output().unwrap();
        let v: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
        (out.status.code(), v, stderr(&out))
    };
    let (code, v, err) = run("what do the notes say?");
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(v["answer"], "They say hello.");
    let sent = server.received();
    assert_eq!(sent[0].path, "/api/chat");
    assert_eq!(sent[0].header("authorization"), None);
    assert_eq!(sent[0].body["options"]["num_ctx"], 32_768);
    let messages = sent[1].body["messages"].as_array().unwrap();
    let asked = messages.iter().find(|m| m["role"] == "assistant").unwrap();
    assert_eq!(asked["thinking"], "Look at the notes.");
    assert_eq!(
        asked["tool_calls"][0]["function"]["arguments"],
        json!({"path": "notes.txt"})
    );
    let result = messages.iter().find(|m| m["role"] == "tool").unwrap();
    assert_eq!(result["tool_name"], "read_file");
    assert_eq!(result["tool_call_id"], asked["tool_calls"][0]["id"]);
    assert!(result["content"].as_str().unwrap().contains("hello"));
    let show = env.run(&["show", v["run_id"].as_str().unwrap()]);
    assert!(super::stdout(&show).contains("Look at the notes."));

    // The window agent.toml gives is the one the model is loaded with.
    std::fs::write(env.dir.path().join("agent.toml"), "context_window = 8192\n").unwrap();
    let (code, _, err) = run("and now?");
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(server.received()[2].body["options"]["num_ctx"], 8_192);
}

/// A server whose model was loaded with a smaller window than the run took it to have
/// (vLLM serving a model with `--max-model-len 3000`, here) refuses the prompt once it
/// grows past it. The run compacts its prompt to the window the server named and asks
/// again, instead of failing; refused again, it fails as before, having asked once more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prompt_the_server_finds_too_long_is_compacted_and_asked_again() {
    let overflow = r#"{"object":"error","message":"This model's maximum context length is 3000 tokens. However, you requested 3912 tokens (3400 in the messages, 512 in the completion). Please reduce the length of the messages or completion.","type":"BadRequestError","param":null,"code":400}"#;
    let server = Server::start(vec![
        Reply::stream(read_part(0, 2900)),
        Reply::stream(read_part(1, 2900)),
        Reply::status(400, overflow),
        // The summary the compaction asks the model for.
        Reply::stream(fixture("openai/text_only.sse")),
        Reply::stream(fixture("openai/text_only.sse")),
    ])
    .await
    .unwrap();
    let env = notes_and("");
    write_parts(&env, 2, 300);
    let (code, v, err) = read_the_parts(&env, &server.url);
    assert_eq!(code, Some(0), "{err}");
    let sent = server.received();
    assert_eq!(sent.len(), 5);
    assert_eq!(sent[3].body["tools"], Value::Null, "the summary's request");
    let length = |i: usize| sent[i].body["messages"].to_string().len();
    assert!(length(4) < length(2), "asked again with a shorter prompt");
    let id = v["run_id"].as_str().unwrap();
    let kinds = event_kinds(&env, id);
    assert!(kinds.iter().any(|k| k == "context_compacted"), "{kinds:?}");
    assert!(!kinds.iter().any(|k| k == "model_failed"), "{kinds:?}");
    // Said where the run is shown, and kept with the compaction: another process holds the
    // prompt within the window the server named.
    let shown = super::stdout(&env.run(&["show", id]));
    assert!(
        shown.contains("past the model's window, 3000 tokens from now on"),
        "{shown}"
    );
    let context = env.run(&["context", "--json", id]);
    let context: Value = serde_json::from_str(&super::stdout(&context)).unwrap();
    assert_eq!(context["context_window"], 3000, "{context}");

    // Refused again after the compaction (its summary's request too): the run fails,
    // having asked twice, not forever.
    let server = Server::start(vec![Reply::status(400, overflow); 4])
        .await
        .unwrap();
    let key = ("OPENAI_API_KEY", "k");
    let (code, v, err) = run_model(&env, "openai-compat:local", &server.url, "hi", key);
    assert_eq!(code, Some(5), "{err}");
    assert_eq!(v["reason"], "model_error");
    assert_eq!(server.received().len(), 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_responses_run_end_to_end_with_reasoning_passed_back() {
    let server = Server::start(vec![
        Reply::stream(fixture("openai/responses_reasoning_tool.sse")),
        Reply::stream(fixture("openai/responses_text.sse")),
    ])
    .await
    .unwrap();
    let env = Env::new();
    std::fs::write(env.dir.path().join("notes.txt"), "hello\n").unwrap();
    let base = format!("{}/v1", server.url);
    let (code, v, err) = run_model(
        &env,
        "openai-responses:gpt-5",
        &base,
        "what do the notes say?",
        ("OPENAI_API_KEY", "sk-test-responses"),
    );
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(v["answer"], "The notes say hello.");
    assert_eq!(v["usage"]["input_tokens"], 2210 + 2420);
    assert_eq!(v["usage"]["cache_read_tokens"], 1920 + 2304);
    assert_eq!(v["usage"]["reasoning_tokens"], 128);
    let sent = server.received();
    assert_eq!(sent.len(), 2);
    assert_eq!(sent[0].path, "/v1/responses");
    assert_eq!(
        sent[0].header("authorization"),
        Some("Bearer sk-test-responses")
    );
    assert_eq!(sent[0].body["store"], false);
    // The second call gets the first one's reasoning back, then the call and its output,
    // paired by call id.
    let input = sent[1].body["input"].as_array().unwrap();
    let kinds: Vec<&str> = input
        .iter()
        .map(|i| i["type"].as_str().unwrap_or("message"))
        .collect();
    assert_eq!(
        kinds,
        [
            "message",
            "reasoning",
            "function_call",
            "function_call_output"
        ]
    );
    assert_eq!(input[1]["id"], "rs_68af4030592c81938ec0a5fbab4a3e9f");
    assert_eq!(
        input[1]["encrypted_content"],
        "gAAAAABor0Aw1xZ5aVZlcfNhQ8M2aqPwF0Zsv1h0Ekm7wV0pP0yYtQ=="
    );
    assert_eq!(input[2]["call_id"], "call_Mf3n0m4GgK1lqJ2lV2W3y1Ae");
    assert_eq!(input[3]["call_id"], "call_Mf3n0m4GgK1lqJ2lV2W3y1Ae");
    assert!(input[3]["output"].as_str().unwrap().contains("hello"));
    // The run remembers its dialect, and `agent show` shows the reasoning's summary.
    let id = v["run_id"].as_str().unwrap();
    let shown = super::stdout(&env.run(&["show", id]));
    assert!(shown.contains("model openai-responses:gpt-5"), "{shown}");
    assert!(
        shown.contains("(2210 in (1920 cache read), 145 out (128 reasoning))"),
        "{shown}"
    );
    assert!(
        shown.contains(r#"thinking "**Reading the notes**\n\nThe user asks"#),
        "{shown}"
    );
    // Without a key it says which variable to set.
    let (code, _, err) = run_json(
        &env,
        &[
            "run",
            "--model",
            "openai-responses:gpt-5",
            "--base-url",
            &base,
            "hi",
        ],
        None,
    );
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("OPENAI_API_KEY"), "{err}");
}

/// How long a model's answer may take to begin, and stay silent once begun, are set in
/// `agent.toml` (a local model reading a long prompt on a CPU needs more than the
/// defaults; a person may want less): a server that sends nothing after its head fails the
/// run after the answer timeout given, one that sends a piece and then nothing after the
/// idle timeout given, not the default ten and two minutes. A value that makes no sense is
/// refused before anything runs.
#[test]
fn the_model_calls_timeouts_come_from_agent_toml() {
    use std::io::{Read, Write};
    let env = Env::new();
    // A stream's head and `sent`, then nothing, until the client gives up and closes.
    let serve = |sent: String| {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}/v1", listener.local_addr().unwrap());
        std::thread::spawn(move || {
            let (mut socket, _) = listener.accept().unwrap();
            let mut buf = [0u8; 64 << 10];
            let _ = socket.read(&mut buf);
            let head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\r\n";
            socket
                .write_all(format!("{head}{sent}").as_bytes())
                .unwrap();
            let _ = socket.read(&mut buf);
        });
        url
    };
    let config = env.dir.path().join("timeouts.toml");
    let config_path = config.to_str().unwrap().to_owned();
    let run = |url: &str| {
        let args = [
            "run",
            "--json",
            "--config",
            &config_path,
            "--model",
            "openai-compat:m",
            "--base-url",
            url,
            "go",
        ];
        run_json(&env, &args, None)
    };
    std::fs::write(
        &config,
        "answer_timeout_secs = 0.5\nidle_timeout_secs = 0.3\n[retry]\nmax_attempts = 1\n",
    )
    .unwrap();
    let piece = json!({"choices": [{"index": 0, "delta": {"content": "Hel"}}]});
    for (sent, silent) in [
        (format!("data: {piece}\n\n"), "0.3"),
        (String::new(), "0.5"),
    ] {
        let (code, out, err) = run(&serve(sent));
        assert_eq!(code, Some(5), "{err}");
        assert_eq!(out["reason"], "model_error", "{out}");
        let message = out["message"].as_str().unwrap();
        assert!(
            message.contains(&format!("openai-compat was silent for {silent} s")),
            "{out}"
        );
    }
    for bad in ["idle_timeout_secs = 0", "answer_timeout_secs = -1"] {
        std::fs::write(&config, bad).unwrap();
        let (code, _, err) = run("http://127.0.0.1:9/v1");
        assert_eq!(code, Some(2), "{err}");
        assert!(
            err.contains(bad) && err.contains("give a number of seconds"),
            "{err}"
        );
    }
}
