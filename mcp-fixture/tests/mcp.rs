//! agent-tools' MCP client against a real MCP server process (this crate's binary).
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::sync::Arc;

use agent_core::*;
use agent_tools::mcp::{McpConfig, McpError, connect};
use agent_tools::{Gateway, Workspace};
use serde_json::json;
use tokio_util::sync::CancellationToken;

fn config(servers: serde_json::Value) -> McpConfig {
    serde_json::from_value(json!({ "mcpServers": servers })).unwrap()
}

fn fixture() -> serde_json::Value {
    json!({"fx": {"command": env!("CARGO_BIN_EXE_agent-mcp-fixture")}})
}

async fn gateway(dir: &std::path::Path) -> Gateway {
    let tools = connect(&config(fixture()), dir).await.unwrap();
    let mut g = Gateway::with_builtins(Workspace::new(dir).unwrap()).unwrap();
    for t in tools {
        g.register(t).unwrap();
    }
    g
}

fn call(id: &str, name: &str, args: serde_json::Value) -> ToolCall {
    ToolCall::new(id, name, args)
}

#[tokio::test]
async fn tools_are_listed_with_their_risk_from_annotations() {
    let dir = tempfile::tempdir().unwrap();
    let g = gateway(dir.path()).await;
    let specs: Vec<(String, Risk)> = g
        .specs()
        .into_iter()
        .filter(|s| s.name.starts_with("mcp__"))
        .map(|s| (s.name, s.risk))
        .collect();
    assert_eq!(
        specs,
        [
            ("mcp__fx__crash".to_owned(), Risk::External),
            ("mcp__fx__delete_item".to_owned(), Risk::Write),
            ("mcp__fx__echo".to_owned(), Risk::External),
            ("mcp__fx__env".to_owned(), Risk::Read),
            ("mcp__fx__meet".to_owned(), Risk::Read),
            ("mcp__fx__mixed".to_owned(), Risk::Read),
        ]
    );
    let meet = g
        .specs()
        .into_iter()
        .find(|s| s.name == "mcp__fx__meet")
        .unwrap();
    assert_eq!(meet.input_schema["required"], json!(["n", "tag"]));
}

#[tokio::test]
async fn read_only_tools_run_in_parallel_and_destructive_ones_ask() {
    let dir = tempfile::tempdir().unwrap();
    let g = gateway(dir.path()).await;
    let verdicts = g
        .check(
            "run",
            &[
                call("a", "mcp__fx__meet", json!({"n": 3, "tag": "a"})),
                call("d", "mcp__fx__delete_item", json!({"id": "42"})),
                call("e", "mcp__fx__echo", json!({"text": "hi"})),
                call("x", "mcp__fx__meet", json!({"n": "three", "tag": "x"})),
            ],
        )
        .await;
    assert_eq!(verdicts[0].1, Verdict::Allow);
    assert!(matches!(&verdicts[1].1, Verdict::Ask { why } if why.contains("write")));
    assert!(matches!(&verdicts[2].1, Verdict::Ask { why } if why.contains("external")));
    assert!(matches!(&verdicts[3].1, Verdict::Invalid { message } if message.starts_with("/n")));

    // The machine's scheduler puts the three reads in one group; the server answers
    // "met" only if all three are in flight together.
    let specs: std::collections::BTreeMap<String, ToolSpec> =
        g.specs().into_iter().map(|s| (s.name.clone(), s)).collect();
    let calls: Vec<ToolCall> = ["a", "b", "c"]
        .iter()
        .map(|t| call(t, "mcp__fx__meet", json!({"n": 3, "tag": t})))
        .collect();
    let groups = schedule(calls, &specs, "run", 1);
    assert_eq!(groups.len(), 1);
    let results = g.execute("run", groups, &CancellationToken::new()).await;
    let texts: Vec<String> = results.iter().map(ToolResult::content).collect();
    assert_eq!(texts, ["a met 3 calls", "b met 3 calls", "c met 3 calls"]);
}

#[tokio::test]
async fn a_server_that_dies_is_restarted_once_then_unavailable() {
    let dir = tempfile::tempdir().unwrap();
    let g = gateway(dir.path()).await;
    let run = |id: &str, name: &str, args: serde_json::Value| {
        let groups = vec![vec![ScheduledCall {
            call: call(id, name, args),
            risk: Risk::External,
            effect_key: None,
            path: None,
        }]];
        let g = &g;
        async move {
            g.execute("run", groups, &CancellationToken::new())
                .await
                .remove(0)
        }
    };
    let crashed = run("c1", "mcp__fx__crash", json!({})).await;
    assert_eq!(
        crashed.error_kind(),
        Some(ErrorKind::OutcomeUnknown),
        "{crashed:?}"
    );
    // Restarted once: it works again.
    let echoed = run("e1", "mcp__fx__echo", json!({"text": "back"})).await;
    assert_eq!(echoed.content(), "back");
    let crashed = run("c2", "mcp__fx__crash", json!({})).await;
    assert_eq!(crashed.error_kind(), Some(ErrorKind::OutcomeUnknown));
    // Gone for good: the gate says unavailable, which stops a run with tool_unavailable.
    let verdicts = g
        .check("run", &[call("e2", "mcp__fx__echo", json!({"text": "x"}))])
        .await;
    assert!(
        matches!(&verdicts[0].1, Verdict::Unavailable { reason } if reason.contains("restarted once")),
        "{verdicts:?}"
    );
}

#[tokio::test]
async fn a_server_that_fails_to_start_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let err = connect(
        &config(json!({"broken": {"command": "/no/such/server"}})),
        dir.path(),
    )
    .await
    .err()
    .unwrap();
    assert!(
        matches!(&err, McpError::Start { server, .. } if server == "broken"),
        "{err}"
    );
    assert!(
        err.to_string()
            .starts_with("MCP server \"broken\" failed to start")
    );
    let err = connect(&config(json!({"mute": {"command": "true"}})), dir.path())
        .await
        .err()
        .unwrap();
    assert!(err.to_string().contains("\"mute\""), "{err}");
}

#[tokio::test]
async fn runs_use_mcp_tools_pause_on_a_crash_and_stop_when_the_server_is_gone() {
    use agent_providers::ScriptModel;
    use agent_runtime::{RunRequest, Runtime};
    use agent_store::{MemoryStore, Store};

    let dir = tempfile::tempdir().unwrap();
    let g = Arc::new(gateway(dir.path()).await);
    let store = Arc::new(MemoryStore::new());
    let runtime = |script: serde_json::Value| {
        let model = ScriptModel::from_json(&script.to_string()).unwrap();
        Runtime::new(Arc::new(model), Arc::clone(&g), store.clone())
    };

    // A read-only MCP call runs; a crash of an external call pauses as outcome_unknown,
    // naming the call, and is not run again.
    let rt = runtime(json!({"turns": [
        {"tool_calls": [{"id": "m1", "name": "mcp__fx__meet", "arguments": {"n": 1, "tag": "solo"}}]},
        {"tool_calls": [{"id": "k1", "name": "mcp__fx__crash", "arguments": {}}]},
        {"final": "never"}
    ]}));
    let paused = rt
        .start(
            RunRequest::new("r1", "g", Budget::default()),
            CancellationToken::new(),
        )
        .await
        .unwrap();
    assert_eq!(
        paused.outcome.reason,
        TerminalReason::ApprovalRequired,
        "external tools ask"
    );
    let report = rt
        .approve("r1", vec![], CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(report.outcome.reason, TerminalReason::OutcomeUnknown);
    assert!(report.outcome.message.contains("k1"));
    let log = store.load("r1").unwrap();
    assert!(
        log.iter()
            .any(|e| matches!(&e.event, Event::ToolFinished { result, .. }
        if result.call_id.as_str() == "m1" && result.content() == "solo met 1 calls"))
    );

    // The server was restarted once; a second crash leaves it gone for good.
    let crash = vec![vec![ScheduledCall {
        call: call("k2", "mcp__fx__crash", json!({})),
        risk: Risk::External,
        effect_key: None,
        path: None,
    }]];
    g.execute("r1", crash, &CancellationToken::new()).await;
    let rt = runtime(json!({"turns": [
        {"tool_calls": [{"id": "m2", "name": "mcp__fx__meet", "arguments": {"n": 1, "tag": "x"}}]},
        {"final": "never"}
    ]}));
    let report = rt
        .start(
            RunRequest::new("r2", "g", Budget::default()),
            CancellationToken::new(),
        )
        .await
        .unwrap();
    assert_eq!(report.outcome.reason, TerminalReason::ToolUnavailable);
    assert!(
        report.outcome.message.contains("mcp__fx__meet"),
        "{}",
        report.outcome.message
    );
}

/// A server's `env` block holds its token: the token never reaches the log, even when the
/// server prints it.
#[tokio::test]
async fn the_values_of_a_servers_env_block_are_kept_out_of_the_log() {
    use agent_providers::ScriptModel;
    use agent_runtime::{Redactor, RunRequest, Runtime};
    use agent_store::{MemoryStore, Store};

    let token = "fx-token-7d3a9c1e5b";
    let dir = tempfile::tempdir().unwrap();
    let config = config(json!({"fx": {
        "command": env!("CARGO_BIN_EXE_agent-mcp-fixture"),
        "env": {"FX_TOKEN": token}
    }}));
    let mut g = Gateway::with_builtins(Workspace::new(dir.path()).unwrap()).unwrap();
    for tool in connect(&config, dir.path()).await.unwrap() {
        g.register(tool).unwrap();
    }
    let store = Arc::new(MemoryStore::new());
    let model = ScriptModel::from_json(
        &json!({"turns": [
            {"tool_calls": [{"id": "e1", "name": "mcp__fx__env", "arguments": {"name": "FX_TOKEN"}}]},
            {"final": format!("the token is {token}")}
        ]})
        .to_string(),
    )
    .unwrap();
    let rt = Runtime::new(Arc::new(model), Arc::new(g), store.clone())
        .with_redactor(Redactor::new([]).with_secrets(config.secrets()));
    let report = rt
        .start(
            RunRequest::new("r1", "g", Budget::default()),
            CancellationToken::new(),
        )
        .await
        .unwrap();
    assert_eq!(report.outcome.reason, TerminalReason::Completed);
    let log = serde_json::to_string(&store.load("r1").unwrap()).unwrap();
    assert!(!log.contains(token), "{log}");
    assert!(log.contains("FX_TOKEN=[REDACTED:fx.FX_TOKEN]"), "{log}");
}

/// Every kind of content a server sends reaches the model in some form.
#[tokio::test]
async fn every_kind_of_content_is_kept() {
    let dir = tempfile::tempdir().unwrap();
    let g = gateway(dir.path()).await;
    let group = vec![vec![ScheduledCall {
        call: call("x1", "mcp__fx__mixed", json!({})),
        risk: Risk::Read,
        effect_key: None,
        path: None,
    }]];
    let results = g.execute("r", group, &CancellationToken::new()).await;
    let text = results[0].content();
    for part in [
        "plain words",
        "[resource file:///notes.txt]\nembedded words",
        "[resource link file:///big.log, text/plain, 1234 bytes]",
        "[image: image/png, 6 bytes]",
    ] {
        assert!(text.contains(part), "{part} in {text}");
    }
}

/// A server that never answers the handshake does not hang start-up.
#[tokio::test]
async fn a_server_that_never_answers_is_given_up_on_in_time() {
    let dir = tempfile::tempdir().unwrap();
    let err = agent_tools::mcp::connect_within(
        &config(json!({"mute": {"command": "sleep", "args": ["600"]}})),
        dir.path(),
        std::time::Duration::from_millis(300),
    )
    .await
    .err()
    .unwrap();
    let text = err.to_string();
    assert!(
        text.contains("\"mute\"") && text.contains("within 300 ms"),
        "{text}"
    );
}

/// Approving without the MCP servers the run started with is refused, never reported as
/// done: the approved change would silently not happen.
#[tokio::test]
async fn a_run_is_not_continued_without_the_tools_it_started_with() {
    use agent_providers::ScriptModel;
    use agent_runtime::{RunRequest, Runtime, RuntimeError};
    use agent_store::{MemoryStore, Store};

    let dir = tempfile::tempdir().unwrap();
    let with_mcp = Arc::new(gateway(dir.path()).await);
    let bare = Arc::new(Gateway::with_builtins(Workspace::new(dir.path()).unwrap()).unwrap());
    let store = Arc::new(MemoryStore::new());
    let script = json!({"turns": [
        {"tool_calls": [{"id": "d1", "name": "mcp__fx__delete_item", "arguments": {"id": "42"}}]},
        {"final": "deleted"}
    ]})
    .to_string();
    let runtime = |g: &Arc<Gateway>| {
        let model = ScriptModel::from_json(&script).unwrap();
        Runtime::new(Arc::new(model), Arc::clone(g), store.clone())
    };
    let paused = runtime(&with_mcp)
        .start(
            RunRequest::new("r1", "g", Budget::default()),
            CancellationToken::new(),
        )
        .await
        .unwrap();
    assert_eq!(paused.outcome.reason, TerminalReason::ApprovalRequired);
    let before = store.load("r1").unwrap();
    let err = runtime(&bare)
        .approve("r1", vec![], CancellationToken::new())
        .await
        .unwrap_err();
    assert!(
        matches!(&err, RuntimeError::Refused(m) if m.contains("mcp__fx__delete_item")),
        "{err}"
    );
    assert_eq!(store.load("r1").unwrap(), before, "nothing was recorded");
    // With the same tools it goes on.
    let done = runtime(&with_mcp)
        .approve("r1", vec![], CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(done.outcome.reason, TerminalReason::Completed);
}

/// An MCP server in Python that lists its tools as `HOSTILE` says: `paged` (three pages
/// of two), `many` (pages of 100 without end), `endless` (empty pages without end, each
/// counted in `pages.txt`), `long_description`, `big_schema`, `deep_schema`, `long_name`.
const HOSTILE_SERVER: &str = r#"
import json, os, sys
mode = os.environ["HOSTILE"]
def tool(i, **extra):
    t = {"name": "t%d" % i, "inputSchema": {"type": "object"}}
    t.update(extra)
    return t
def nested(depth):
    schema = {"type": "object"}
    for _ in range(depth):
        schema = {"type": "object", "properties": {"p": schema}}
    return schema
for line in sys.stdin:
    msg = json.loads(line)
    if "id" not in msg:
        continue
    method, mid = msg.get("method"), msg["id"]
    if method == "initialize":
        result = {"protocolVersion": msg["params"]["protocolVersion"],
                  "capabilities": {"tools": {}}, "serverInfo": {"name": "h", "version": "1"}}
    elif method == "tools/list":
        page = int((msg.get("params") or {}).get("cursor") or 0)
        if mode == "paged":
            result = {"tools": [tool(page * 2 + i) for i in range(2)]}
            if page < 2:
                result["nextCursor"] = str(page + 1)
        elif mode == "many":
            result = {"tools": [tool(page * 100 + i) for i in range(100)],
                      "nextCursor": str(page + 1)}
        elif mode == "endless":
            with open("pages.txt", "w") as f:
                f.write(str(page + 1))
            result = {"tools": [], "nextCursor": str(page + 1)}
        elif mode == "long_description":
            result = {"tools": [tool(0, description="d" * 10000)]}
        elif mode == "big_schema":
            props = {"p%d" % i: {"type": "string", "description": "x" * 100} for i in range(400)}
            result = {"tools": [tool(0, inputSchema={"type": "object", "properties": props}),
                                tool(1)]}
        elif mode == "deep_schema":
            result = {"tools": [tool(0, inputSchema=nested(40)), tool(1)]}
        else:
            result = {"tools": [tool(0, name="n" * 60), tool(1)]}
    else:
        print(json.dumps({"jsonrpc": "2.0", "id": mid,
                          "error": {"code": -32601, "message": "unknown method"}}), flush=True)
        continue
    print(json.dumps({"jsonrpc": "2.0", "id": mid, "result": result}), flush=True)
"#;

/// What a server that lists its tools as `mode` says brings: its tools registered in a
/// gateway, or why it was refused.
async fn hostile(dir: &std::path::Path, mode: &str) -> Result<Vec<ToolSpec>, String> {
    let (specs, left_out) = hostile_reporting(dir, mode).await?;
    assert_eq!(left_out, [], "{mode}");
    Ok(specs)
}

/// [`hostile`], with the tools the server listed that were left out.
async fn hostile_reporting(
    dir: &std::path::Path,
    mode: &str,
) -> Result<(Vec<ToolSpec>, Vec<agent_tools::mcp::LeftOut>), String> {
    std::fs::write(dir.join("hostile.py"), HOSTILE_SERVER).unwrap();
    let servers = json!({"h": {"command": "python3", "args": ["hostile.py"],
                               "env": {"HOSTILE": mode}}});
    let timeout = agent_tools::mcp::DEFAULT_STARTUP_TIMEOUT;
    let connected = agent_tools::mcp::connect_reporting(&config(servers), dir, timeout)
        .await
        .map_err(|e| e.to_string())?;
    let mut g = Gateway::new(Workspace::new(dir).unwrap());
    for t in connected.tools {
        g.register(t).map_err(|e| e.to_string())?;
    }
    Ok((g.specs(), connected.left_out))
}

/// A server is software from outside: its list of tools is read within bounds, page by
/// page, and what it lists cannot make every model call cost without end.
#[tokio::test]
async fn a_servers_list_of_tools_is_bounded() {
    use agent_tools::mcp::{MAX_DESCRIPTION_CHARS, MAX_SERVER_TOOLS, MAX_TOOL_PAGES};
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    let names: Vec<String> = hostile(dir, "paged")
        .await
        .unwrap()
        .into_iter()
        .map(|s| s.name)
        .collect();
    assert_eq!(
        names,
        [
            "mcp__h__t0",
            "mcp__h__t1",
            "mcp__h__t2",
            "mcp__h__t3",
            "mcp__h__t4",
            "mcp__h__t5"
        ]
    );

    let err = hostile(dir, "many").await.unwrap_err();
    assert!(
        err.contains(&format!("more than {MAX_SERVER_TOOLS} tools")),
        "{err}"
    );
    let err = hostile(dir, "endless").await.unwrap_err();
    assert!(
        err.contains(&format!("past {MAX_TOOL_PAGES} pages")),
        "{err}"
    );
    assert_eq!(
        std::fs::read_to_string(dir.join("pages.txt")).unwrap(),
        MAX_TOOL_PAGES.to_string()
    );

    let specs = hostile(dir, "long_description").await.unwrap();
    let shown = &specs[0].description;
    assert!(
        shown.starts_with(&"d".repeat(MAX_DESCRIPTION_CHARS))
            && shown.ends_with("[... 6000 more characters of this description not shown]"),
        "{}",
        &shown[MAX_DESCRIPTION_CHARS - 10..]
    );
    assert!(!shown.contains(&"d".repeat(MAX_DESCRIPTION_CHARS + 1)));

    // A tool beyond a bound is left out, with the reason; the server's others are offered.
    for (mode, tool, reason) in [
        ("big_schema", "t0", "at most 32768 are accepted"),
        ("deep_schema", "t0", "levels deep; at most 64"),
        ("long_name", &"n".repeat(60), "(68 characters)"),
    ] {
        let (specs, left_out) = hostile_reporting(dir, mode).await.unwrap();
        let names: Vec<&str> = specs.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["mcp__h__t1"], "{mode}");
        assert_eq!(left_out.len(), 1, "{mode}: {left_out:?}");
        assert_eq!(
            (left_out[0].server.as_str(), left_out[0].tool.as_str()),
            ("h", tool)
        );
        assert!(left_out[0].reason.contains(reason), "{mode}: {left_out:?}");
    }
}
