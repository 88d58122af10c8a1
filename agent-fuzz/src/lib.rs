//! Every fuzz target of agent-loop, as a function of the input bytes that must not panic,
//! hang or grow without bound, whatever the bytes. `cargo fuzz` (in `fuzz/`, nightly) calls
//! them with generated inputs; `tests/corpus.rs` replays each target's corpus on stable, so
//! every input that once found a bug stays a regression test.
//!
//! Where a cheap property holds, the target checks it too (a decoded event re-encodes to
//! itself, a resolved path stays inside the workspace).
// A fuzz target reports a broken property by panicking: that is how the fuzzer sees it.
#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::path::PathBuf;
use std::sync::OnceLock;

use agent_core::{Entry, RunState, ToolCall, ToolSpec};
use agent_providers::wire::{anthropic, ollama, openai, responses};
use agent_tools::{Action, Policy, Rule, Subject, Workspace};

/// A target: its input bytes, handled.
pub type Target = fn(&[u8]);

/// The targets, by name (the file names under `fuzz/fuzz_targets/` and the corpus
/// directories under `fuzz/corpus/`).
pub const TARGETS: &[(&str, Target)] = &[
    ("openai_stream", openai_stream),
    ("anthropic_stream", anthropic_stream),
    ("openai_response", openai_response),
    ("anthropic_response", anthropic_response),
    ("responses_stream", responses_stream),
    ("responses_response", responses_response),
    ("ollama_stream", ollama_stream),
    ("script", script),
    ("agent_toml", agent_toml),
    ("mcp_config", mcp_config),
    ("mcp_server", mcp_server),
    ("git_config", git_config),
    ("policy", policy),
    ("path_resolver", path_resolver),
    ("shell_parser", shell_parser),
    ("stored_events", stored_events),
];

fn text(data: &[u8]) -> std::borrow::Cow<'_, str> {
    String::from_utf8_lossy(data)
}

/// Server-sent events as the transport hands them over: `data:` payloads, one per line.
pub fn openai_stream(data: &[u8]) {
    let mut stream = openai::Stream::default();
    for line in text(data).lines() {
        let payload = line.strip_prefix("data:").unwrap_or(line).trim();
        if stream.push(payload).is_err() {
            return;
        }
    }
    let _ = (stream.is_done(), stream.grown());
    let _ = stream.finish().decide();
}

/// Hands `push` each payload of `data` with the event its last `event:` line named, until
/// `push` refuses one; whether all were taken.
fn push_events(data: &[u8], mut push: impl FnMut(&str, &str) -> bool) -> bool {
    let mut event = String::new();
    for line in text(data).lines() {
        if let Some(name) = line.strip_prefix("event:") {
            event = name.trim().to_owned();
        } else if !push(&event, line.strip_prefix("data:").unwrap_or(line).trim()) {
            return false;
        }
    }
    true
}

/// `event:` lines name the next `data:` payload, as Anthropic streams them.
pub fn anthropic_stream(data: &[u8]) {
    let mut stream = anthropic::Stream::default();
    if push_events(data, |event, payload| stream.push(event, payload).is_ok()) {
        let _ = (stream.is_done(), stream.grown());
        let _ = stream.finish().decide();
    }
}

/// The events of OpenAI's Responses API (`openai-responses`): `event:` lines name the
/// next `data:` payload, whose `type` says it again.
pub fn responses_stream(data: &[u8]) {
    let mut stream = responses::Stream::default();
    if push_events(data, |event, payload| stream.push(event, payload).is_ok()) {
        let _ = (stream.is_done(), stream.grown());
        let _ = stream.finish().decide();
    }
}

/// A whole Responses API body.
pub fn responses_response(data: &[u8]) {
    if let Ok(body) = serde_json::from_slice(data) {
        let _ = responses::parse_response(&body).decide();
    }
}

/// Ollama's `/api/chat` stream, a JSON object a line (a whole response is one such line).
pub fn ollama_stream(data: &[u8]) {
    let mut stream = ollama::Stream::default();
    for line in text(data).lines() {
        if stream.push(line).is_err() {
            return;
        }
    }
    let _ = (stream.is_done(), stream.grown());
    let _ = stream.finish().decide();
}

/// A whole OpenAI-style response body.
pub fn openai_response(data: &[u8]) {
    if let Ok(body) = serde_json::from_slice(data) {
        let _ = openai::parse_response(&body).decide();
    }
}

/// A whole Anthropic response body.
pub fn anthropic_response(data: &[u8]) {
    if let Ok(body) = serde_json::from_slice(data) {
        let _ = anthropic::parse_response(&body).decide();
    }
}

/// A `--model script:PATH` file.
pub fn script(data: &[u8]) {
    let _ = agent_providers::ScriptModel::from_json(&text(data));
}

/// An `agent.toml`: parsed and validated; an error is one line.
pub fn agent_toml(data: &[u8]) {
    if let Err(e) = agent_cli::config::parse(&text(data)) {
        assert!(!e.contains('\n'), "a multi-line error: {e:?}");
    }
}

/// An MCP configuration (`.mcp.json`, `--mcp-config`): parsed; an error is one line.
pub fn mcp_config(data: &[u8]) {
    let path = std::path::Path::new(".mcp.json");
    if let Err(e) = agent_tools::mcp::McpConfig::parse(path, data) {
        let e = e.to_string();
        assert!(!e.contains('\n'), "a multi-line error: {e:?}");
    }
}

/// A repository's git config, as a sandboxed command may leave it: read as git reads it;
/// each setting has a name, and a file refused is refused at one of its lines.
pub fn git_config(data: &[u8]) {
    use agent_tools::git_config;
    let mut settings = 0;
    let read = git_config::read(data, |name, value| {
        assert!(!name.is_empty());
        let _ = git_config::runs_a_program(name, value);
        settings += 1;
    });
    assert!(
        settings <= data.len(),
        "{settings} settings of {} bytes",
        data.len()
    );
    if let Err(refused) = read {
        // As git counts: the end of the file is a line more.
        let lines = data.iter().filter(|&&b| b == b'\n').count() + 2;
        assert!(
            (1..=lines).contains(&refused.line),
            "line {} of {lines}",
            refused.line
        );
    }
}

/// A tool that stands for one an MCP server listed: it is judged, never run.
struct Listed(ToolSpec);

#[async_trait::async_trait]
impl agent_tools::Tool for Listed {
    fn spec(&self) -> ToolSpec {
        self.0.clone()
    }

    async fn call(
        &self,
        _arguments: serde_json::Value,
        _ctx: &agent_tools::ToolContext,
    ) -> Result<String, agent_core::ToolError> {
        Ok(String::new())
    }
}

/// What an MCP server may send, `{"tools": [...], "arguments": {...}, "content": [...]}`:
/// each tool it lists is offered within bounds (a name of letters, digits, `_` and `-`
/// that model APIs take, a description cut short) or left out in one line, its schema
/// compiles or the tool is refused, a call of each with `arguments` is judged; each
/// content block is shown as text.
pub fn mcp_server(data: &[u8]) {
    let Ok(said) = serde_json::from_slice::<serde_json::Value>(data) else {
        return;
    };
    let mut gateway = agent_tools::Gateway::new(tree().1.clone());
    let listed = said["tools"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default();
    for def in listed {
        let Ok(def) = serde_json::from_value::<rmcp::model::Tool>(def.clone()) else {
            continue;
        };
        match agent_tools::mcp::offered("srv", &def) {
            Ok(spec) => {
                assert!(spec.name.len() <= agent_tools::mcp::MAX_TOOL_NAME_CHARS);
                assert!(
                    spec.name
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-'),
                    "{:?}",
                    spec.name
                );
                let most = agent_tools::mcp::MAX_DESCRIPTION_CHARS + 80;
                assert!(spec.description.chars().count() <= most);
                let _ = gateway.register(std::sync::Arc::new(Listed(spec)));
            }
            Err(reason) => assert!(!reason.contains('\n'), "{reason:?}"),
        }
    }
    let arguments = said.get("arguments").cloned().unwrap_or_default();
    let calls: Vec<ToolCall> = gateway
        .specs()
        .iter()
        .enumerate()
        .map(|(i, spec)| ToolCall::new(format!("c{i}"), spec.name.clone(), arguments.clone()))
        .collect();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a runtime");
    let verdicts = runtime.block_on(gateway.check("fuzz", &calls));
    assert_eq!(verdicts.len(), calls.len());
    let blocks = said["content"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default();
    for block in blocks {
        if let Ok(block) = serde_json::from_value::<rmcp::model::ContentBlock>(block.clone()) {
            let _ = agent_tools::mcp::content_text(&block);
        }
    }
}

fn spec(name: &str, arg: &str) -> ToolSpec {
    let mut spec = ToolSpec::new(name, "", serde_json::json!({}), agent_core::Risk::External);
    spec.main_argument = Some(arg.to_owned());
    spec
}

/// The first line is a rule (`allow`/`ask`/`deny` chosen by its first byte), the rest a
/// command line and a path the rule judges.
pub fn policy(data: &[u8]) {
    let text = text(data);
    let (rule, rest) = text.split_once('\n').unwrap_or((&text, ""));
    let action = match data.first().map(|b| b % 3) {
        Some(0) => Action::Allow,
        Some(1) => Action::Ask,
        _ => Action::Deny,
    };
    if Rule::parse(action, rule).is_err() {
        return;
    }
    let mut policy = Policy::new();
    if policy.add(action, rule).is_err() {
        return;
    }
    let _ = policy.judge(&spec("shell", "command"), &Subject::command(rest));
    let call = ToolCall::new("c", "read_file", serde_json::json!({ "path": rest }));
    let _ = policy.verdict(&spec("read_file", "path"), &call);
}

/// A workspace with links inside and outside, made once per process.
fn tree() -> &'static (tempfile::TempDir, Workspace, PathBuf) {
    static TREE: OnceLock<(tempfile::TempDir, Workspace, PathBuf)> = OnceLock::new();
    TREE.get_or_init(|| {
        let outer = tempfile::tempdir().expect("a temporary directory");
        let ws = outer.path().join("ws");
        for dir in ["a/b", "c", "secrets"] {
            std::fs::create_dir_all(ws.join(dir)).expect("the tree");
        }
        std::fs::create_dir_all(outer.path().join("outside")).expect("the tree");
        for (target, link) in [
            ("a", "l1"),
            ("../outside", "out"),
            ("a/b/../..", "up"),
            ("loop", "loop"),
            ("secrets", "c/s"),
        ] {
            let _ = std::os::unix::fs::symlink(target, ws.join(link));
        }
        let workspace = Workspace::new(&ws).expect("the workspace");
        let root = workspace.root().to_path_buf();
        (outer, workspace, root)
    })
}

/// Any path string: resolved inside the workspace or refused, never outside.
pub fn path_resolver(data: &[u8]) {
    let (_, workspace, root) = tree();
    if let Ok(resolved) = workspace.resolve(&text(data)) {
        let full = root.join(resolved.rel());
        assert!(full.starts_with(root), "{full:?} left the workspace");
        assert!(
            !resolved.rel().components().any(|c| matches!(
                c,
                std::path::Component::ParentDir | std::path::Component::RootDir
            )),
            "{:?} is not clean",
            resolved.rel()
        );
    }
}

/// Any command line.
pub fn shell_parser(data: &[u8]) {
    let _ = agent_tools::command_line::analyze(&text(data));
}

/// Bytes read back from a store: a decoded entry re-encodes to itself and folds or is
/// refused, never a panic.
pub fn stored_events(data: &[u8]) {
    let Ok(entry) = serde_json::from_slice::<Entry>(data) else {
        return;
    };
    let bytes = serde_json::to_vec(&entry).expect("an entry encodes");
    let again: Entry = serde_json::from_slice(&bytes).expect("what was encoded decodes");
    assert_eq!(again, entry);
    let _ = RunState::fold([&entry]);
}
