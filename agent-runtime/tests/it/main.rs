//! The driver with real parts: the script model, the gateway on a temporary workspace, sled
//! on disk. Wrappers record the order in which model and store are used.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::sync::{Arc, Mutex};

use agent_core::*;
use agent_providers::{Model, ModelRequest, ProviderError, ScriptModel};
use agent_runtime::{Clock, RunRequest, Runtime};
use agent_store::{MemoryStore, SledStore, Store, StoreError};
use agent_tools::{Gateway, Tool, ToolContext, Workspace};
use async_trait::async_trait;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

mod redaction;
mod soak;

type Trace = Arc<Mutex<Vec<String>>>;

/// Records every prompt and the order of calls.
struct Recording {
    inner: ScriptModel,
    trace: Trace,
    prompts: Arc<Mutex<Vec<Prompt>>>,
}

#[async_trait]
impl Model for Recording {
    fn provider(&self) -> &str {
        "script"
    }
    fn model(&self) -> &str {
        "recording"
    }
    async fn decide(&self, request: ModelRequest<'_>) -> Result<ModelReply, ProviderError> {
        self.trace
            .lock()
            .unwrap()
            .push(format!("model {}", request.step));
        self.prompts.lock().unwrap().push(request.prompt.clone());
        self.inner.decide(request).await
    }
}

/// A store that records appends and can fail the Nth one (`fail_at`), or every Nth one
/// (`fail_every`), as if the process died before the commit was durable.
struct Watched<S> {
    inner: S,
    trace: Trace,
    fail_at: Option<usize>,
    fail_every: Option<usize>,
}

impl<S: Store> Store for Watched<S> {
    fn append(&self, run_id: &str, expected: u64, entries: &[Entry]) -> Result<u64, StoreError> {
        let mut trace = self.trace.lock().unwrap();
        let n = trace.iter().filter(|t| t.starts_with("commit")).count() + 1;
        trace.push(format!("commit {expected}+{}", entries.len()));
        if self.fail_at == Some(n) || self.fail_every.is_some_and(|k| n.is_multiple_of(k)) {
            return Err(StoreError::Engine("disk full".into()));
        }
        self.inner.append(run_id, expected, entries)
    }
    fn load(&self, run_id: &str) -> Result<Vec<Entry>, StoreError> {
        self.inner.load(run_id)
    }
    fn runs(&self) -> Result<Vec<agent_store::RunSummary>, StoreError> {
        self.inner.runs()
    }
    fn put_blob(&self, bytes: &[u8]) -> Result<Handle, StoreError> {
        self.inner.put_blob(bytes)
    }
    fn get_blob(&self, handle: &Handle) -> Result<Option<Vec<u8>>, StoreError> {
        self.inner.get_blob(handle)
    }
}

struct Setup {
    dir: tempfile::TempDir,
    trace: Trace,
    prompts: Arc<Mutex<Vec<Prompt>>>,
}

fn setup() -> Setup {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("ws")).unwrap();
    std::fs::write(dir.path().join("ws/notes.txt"), "the meeting is at noon\n").unwrap();
    Setup {
        dir,
        trace: Arc::default(),
        prompts: Arc::default(),
    }
}

impl Setup {
    fn runtime(&self, script: Value, store: Arc<dyn Store>, extra: Vec<Arc<dyn Tool>>) -> Runtime {
        let model = Recording {
            inner: ScriptModel::from_json(&script.to_string()).unwrap(),
            trace: Arc::clone(&self.trace),
            prompts: Arc::clone(&self.prompts),
        };
        let mut gateway =
            Gateway::with_builtins(Workspace::new(self.dir.path().join("ws")).unwrap()).unwrap();
        for tool in extra {
            gateway.register(tool).unwrap();
        }
        Runtime::new(Arc::new(model), Arc::new(gateway), store)
    }

    fn watched(&self, fail_at: Option<usize>) -> Arc<dyn Store> {
        Arc::new(Watched {
            inner: SledStore::open(self.dir.path().join("store")).unwrap(),
            trace: Arc::clone(&self.trace),
            fail_at,
            fail_every: None,
        })
    }
}

/// `dump {path}`: a file's whole content, however large (the built-in `read_file` stops at
/// its cap), for the tests of what happens to large outputs.
struct Dump;

#[async_trait]
impl Tool for Dump {
    fn spec(&self) -> ToolSpec {
        ToolSpec::new(
            "dump",
            "prints a file whole",
            json!({"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}),
            Risk::Read,
        )
    }
    async fn call(&self, args: Value, ctx: &ToolContext) -> Result<String, ToolError> {
        let path = ctx
            .workspace
            .root()
            .join(args["path"].as_str().unwrap_or_default());
        std::fs::read_to_string(path)
            .map_err(|e| ToolError::new(ErrorKind::ExecutionFailed, e.to_string()))
    }
}

/// The handle a shortened output names (`… stored as HANDLE; …`).
fn stored_handle(text: &str) -> Handle {
    text.split("stored as ")
        .nth(1)
        .and_then(|rest| rest.split(';').next())
        .unwrap_or_else(|| panic!("no handle in {text}"))
        .parse()
        .unwrap()
}

/// The built-in tools and `dump`, in `ws`.
fn with_dump(ws: std::path::PathBuf) -> Gateway {
    let mut g = Gateway::with_builtins(Workspace::new(ws).unwrap()).unwrap();
    g.register(Arc::new(Dump)).unwrap();
    g
}

fn read_script() -> Value {
    json!({"turns": [
        {"tool_calls": [{"id": "c1", "name": "read_file", "arguments": {"path": "notes.txt"}}]},
        {"final": "The meeting is at noon."}
    ]})
}

#[tokio::test]
async fn a_script_run_reads_a_file_and_completes_on_sled() {
    let s = setup();
    let store = s.watched(None);
    let rt = s.runtime(read_script(), Arc::clone(&store), vec![]);
    let report = rt
        .start(
            RunRequest::new("run-a", "When is the meeting?", Budget::default()),
            CancellationToken::new(),
        )
        .await
        .unwrap();
    assert_eq!(report.outcome.reason, TerminalReason::Completed);
    assert_eq!(
        report.outcome.answer.as_deref(),
        Some("The meeting is at noon.")
    );
    assert_eq!((report.state.steps, report.state.tool_calls), (2, 1));
    // The second prompt carries the file's content as the result of c1.
    let prompts = s.prompts.lock().unwrap();
    let last = prompts[1].messages.last().unwrap();
    assert!(
        matches!(&last.parts[0], Part::ToolResult { call_id, ok: true, content, .. }
        if call_id.as_str() == "c1" && content.contains("the meeting is at noon"))
    );
    // What is on disk folds to the reported state.
    let log = store.load("run-a").unwrap();
    assert_eq!(RunState::fold(&log).unwrap(), report.state);
    let Event::RunStarted { manifest, .. } = &log[0].event else {
        panic!()
    };
    assert_eq!(manifest.provider, "script");
    assert_eq!(manifest.system_prompt_digest.len(), 64);
}

#[tokio::test]
async fn the_model_is_never_asked_before_the_previous_turn_is_committed() {
    let s = setup();
    let rt = s.runtime(read_script(), s.watched(None), vec![]);
    rt.start(
        RunRequest::new("run-b", "g", Budget::default()),
        CancellationToken::new(),
    )
    .await
    .unwrap();
    // The contract's properties, not one grouping of events into commits: the commits
    // continue the log with no gap, and between two model calls there is a commit.
    let trace = s.trace.lock().unwrap().clone();
    check_commits_between_model_calls(&trace);
    assert_eq!(trace.iter().filter(|t| t.starts_with("model")).count(), 2);
    assert!(
        trace.last().unwrap().starts_with("commit"),
        "the run ends committed"
    );
}

/// Commits continue the log with no gap (`commit E+N` starts where the previous ended),
/// and the model is never asked twice without a commit in between.
fn check_commits_between_model_calls(trace: &[String]) {
    let mut version = 0u64;
    let mut committed_since_model = true;
    for line in trace {
        if let Some(commit) = line.strip_prefix("commit ") {
            let (expected, n) = commit.split_once('+').unwrap();
            assert_eq!(expected.parse::<u64>().unwrap(), version, "{trace:?}");
            version += n.parse::<u64>().unwrap();
            committed_since_model = true;
        } else {
            assert!(
                committed_since_model,
                "model asked twice without a commit: {trace:?}"
            );
            committed_since_model = false;
        }
    }
}

#[tokio::test]
async fn a_failed_commit_stops_the_run_and_the_model_is_not_asked_again() {
    let s = setup();
    let rt = s.runtime(read_script(), s.watched(Some(2)), vec![]);
    let report = rt
        .start(
            RunRequest::new("run-c", "g", Budget::default()),
            CancellationToken::new(),
        )
        .await
        .unwrap();
    assert_eq!(report.outcome.reason, TerminalReason::CheckpointFailed);
    assert!(report.outcome.message.contains("disk full"));
    // Nothing after the refused (second) commit: the model is not asked again.
    let trace = s.trace.lock().unwrap().clone();
    let refused = trace
        .iter()
        .enumerate()
        .filter(|(_, t)| t.starts_with("commit"))
        .nth(1)
        .map(|(i, _)| i)
        .unwrap();
    assert_eq!(refused, trace.len() - 1, "{trace:?}");
    check_commits_between_model_calls(&trace[..refused]);
}

/// A tool that waits until cancelled, telling the test when it started.
struct Waits(Arc<tokio::sync::Notify>);

#[async_trait]
impl Tool for Waits {
    fn spec(&self) -> ToolSpec {
        ToolSpec::new("wait", "waits", json!({"type": "object"}), Risk::Read)
    }
    async fn call(&self, _: Value, ctx: &ToolContext) -> Result<String, ToolError> {
        self.0.notify_one();
        ctx.cancel.cancelled().await;
        Err(ToolError::new(ErrorKind::Cancelled, "stopped"))
    }
}

#[tokio::test]
async fn cancel_while_a_tool_runs_stops_with_its_result_kept() {
    let s = setup();
    let started = Arc::new(tokio::sync::Notify::new());
    let script = json!({"turns": [
        {"tool_calls": [{"id": "w", "name": "wait"}]},
        {"final": "never"}
    ]});
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let rt = s.runtime(
        script,
        Arc::clone(&store),
        vec![Arc::new(Waits(Arc::clone(&started)))],
    );
    let cancel = CancellationToken::new();
    let canceller = cancel.clone();
    let (report, ()) = tokio::join!(
        rt.start(RunRequest::new("run-d", "g", Budget::default()), cancel),
        async move {
            started.notified().await;
            canceller.cancel();
        }
    );
    let report = report.unwrap();
    assert_eq!(report.outcome.reason, TerminalReason::Cancelled);
    let log = store.load("run-d").unwrap();
    assert!(
        log.iter()
            .any(|e| matches!(&e.event, Event::ToolFinished { result, .. }
        if result.error_kind() == Some(ErrorKind::Cancelled)))
    );
    assert_eq!(report.state.steps, 1);
}

/// Reads tokio's (pausable) clock, so deadlines are tested without waiting.
struct TokioClock(tokio::time::Instant);

impl Clock for TokioClock {
    fn now_ms(&self) -> u64 {
        1_700_000_000_000 + self.0.elapsed().as_millis() as u64
    }
}

#[tokio::test(start_paused = true)]
async fn the_wall_clock_budget_interrupts_a_slow_model() {
    let s = setup();
    let script = json!({"turns": [{"final": "too late", "delay_ms": 60000}]});
    let rt = s
        .runtime(script, Arc::new(MemoryStore::new()), vec![])
        .with_clock(Arc::new(TokioClock(tokio::time::Instant::now())));
    let budget = Budget {
        max_wall_time_ms: Some(2_000),
        ..Budget::default()
    };
    let before = tokio::time::Instant::now();
    let report = rt
        .start(
            RunRequest::new("run-e", "g", budget),
            CancellationToken::new(),
        )
        .await
        .unwrap();
    assert_eq!(report.outcome.reason, TerminalReason::DeadlineExceeded);
    assert_eq!(
        before.elapsed().as_millis(),
        2_000,
        "stopped at the deadline, not after the model"
    );
}

/// A write tool, which asks by default.
struct Save;

#[async_trait]
impl Tool for Save {
    fn spec(&self) -> ToolSpec {
        ToolSpec::new("save", "saves", json!({"type": "object"}), Risk::Write)
    }
    async fn call(&self, _: Value, _: &ToolContext) -> Result<String, ToolError> {
        Ok("saved".into())
    }
}

/// A run started on a script that calls `save` (which asks), then answers `answer`:
/// paused for approval.
async fn paused_on_save(s: &Setup, store: &Arc<dyn Store>, run_id: &str, answer: &str) -> Runtime {
    let script = json!({"turns": [
        {"tool_calls": [{"id": "s1", "name": "save"}]},
        {"final": answer}
    ]});
    let rt = s.runtime(script, Arc::clone(store), vec![Arc::new(Save)]);
    let report = rt
        .start(
            RunRequest::new(run_id, "g", Budget::default()),
            CancellationToken::new(),
        )
        .await
        .unwrap();
    assert_eq!(report.outcome.reason, TerminalReason::ApprovalRequired);
    rt
}

#[tokio::test]
async fn a_paused_run_stays_paused_across_resume() {
    let s = setup();
    let script = json!({"turns": [
        {"tool_calls": [{"id": "s1", "name": "save"}]},
        {"final": "saved"}
    ]});
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let rt = s.runtime(script, Arc::clone(&store), vec![Arc::new(Save)]);
    let report = rt
        .start(
            RunRequest::new("run-f", "g", Budget::default()),
            CancellationToken::new(),
        )
        .await
        .unwrap();
    assert_eq!(report.outcome.reason, TerminalReason::ApprovalRequired);
    assert_eq!(report.outcome.pending[0].tool, "save");
    let again = rt.resume("run-f", CancellationToken::new()).await.unwrap();
    assert_eq!(again.outcome.reason, TerminalReason::ApprovalRequired);
    assert_eq!(
        store.load("run-f").unwrap().len(),
        3,
        "resume wrote nothing new"
    );
    assert_eq!(store.runs().unwrap()[0].status, "paused");
}

#[tokio::test]
async fn approve_runs_the_pending_call_and_the_run_completes() {
    let s = setup();
    let script = json!({"turns": [
        {"tool_calls": [{"id": "r1", "name": "read_file", "arguments": {"path": "notes.txt"}},
                        {"id": "s1", "name": "save"}]},
        {"final": "saved"}
    ]});
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let rt = s.runtime(script, Arc::clone(&store), vec![Arc::new(Save)]);
    let paused = rt
        .start(
            RunRequest::new("run-g", "g", Budget::default()),
            CancellationToken::new(),
        )
        .await
        .unwrap();
    assert_eq!(paused.outcome.reason, TerminalReason::ApprovalRequired);
    let err = rt
        .approve("run-g", vec![CallId::from("r1")], CancellationToken::new())
        .await
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "call r1 is not pending in run run-g; pending: s1"
    );
    let done = rt
        .approve("run-g", vec![], CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(done.outcome.reason, TerminalReason::Completed);
    assert_eq!(
        done.state.tool_calls, 2,
        "the allowed read and the approved save ran"
    );
    let err = rt
        .approve("run-g", vec![], CancellationToken::new())
        .await
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("is not waiting for approval; it is finished (completed)"),
        "{err}"
    );
}

#[tokio::test]
async fn deny_tells_the_model_and_the_run_goes_on() {
    let s = setup();
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let rt = paused_on_save(&s, &store, "run-h", "not saved").await;
    let done = rt
        .deny(
            "run-h",
            vec![],
            "not on Fridays".into(),
            CancellationToken::new(),
        )
        .await
        .unwrap();
    assert_eq!(done.outcome.reason, TerminalReason::Completed);
    assert_eq!(done.state.tool_calls, 0);
    let prompts = s.prompts.lock().unwrap();
    let told = prompts.last().unwrap().messages.last().unwrap();
    assert!(
        matches!(&told.parts[0], Part::ToolResult { ok: false, content, .. }
        if content.contains("not on Fridays")),
        "{told:?}"
    );
}

#[tokio::test]
async fn secrets_never_reach_the_log() {
    let s = setup();
    std::fs::write(
        s.dir.path().join("ws/env.txt"),
        "API_TOKEN=tok-9f8e7d6c5b4a\n",
    )
    .unwrap();
    let script = json!({"turns": [
        {"tool_calls": [{"id": "c1", "name": "read_file", "arguments": {"path": "env.txt"}}]},
        {"final": "the token is tok-9f8e7d6c5b4a"}
    ]});
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let rt =
        s.runtime(script, Arc::clone(&store), vec![])
            .with_redactor(agent_runtime::Redactor::new([(
                "API_TOKEN".to_owned(),
                "tok-9f8e7d6c5b4a".to_owned(),
            )]));
    let report = rt
        .start(
            RunRequest::new("run-s", "find tok-9f8e7d6c5b4a", Budget::default()),
            CancellationToken::new(),
        )
        .await
        .unwrap();
    assert_eq!(report.outcome.reason, TerminalReason::Completed);
    let text = serde_json::to_string(&store.load("run-s").unwrap()).unwrap();
    assert!(!text.contains("tok-9f8e7d6c5b4a"), "{text}");
    assert!(text.contains("[REDACTED:API_TOKEN]"));
    // The model never sees it again either.
    let prompts = s.prompts.lock().unwrap();
    assert!(
        !serde_json::to_string(&prompts[1])
            .unwrap()
            .contains("tok-9f8e7d6c5b4a")
    );
}

/// A payment that reports that its outcome is unknown the first time.
struct Pay(Arc<std::sync::atomic::AtomicUsize>);

#[async_trait]
impl Tool for Pay {
    fn spec(&self) -> ToolSpec {
        ToolSpec::new("pay", "pays", json!({"type": "object"}), Risk::External)
    }
    async fn call(&self, _: Value, _: &ToolContext) -> Result<String, ToolError> {
        self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Err(ToolError::new(
            ErrorKind::OutcomeUnknown,
            "the bank timed out after the request was sent",
        ))
    }
}

#[tokio::test]
async fn resolve_settles_an_unknown_outcome_and_cancel_ends_a_paused_run() {
    let s = setup();
    let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let script = json!({"turns": [
        {"tool_calls": [{"id": "p1", "name": "pay", "arguments": {"amount": 5}}]},
        {"final": "paid"}
    ]});
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let rt = s.runtime(
        script.clone(),
        Arc::clone(&store),
        vec![Arc::new(Pay(Arc::clone(&calls)))],
    );
    rt.start(
        RunRequest::new("run-p", "g", Budget::default()),
        CancellationToken::new(),
    )
    .await
    .unwrap();
    let paused = rt
        .approve("run-p", vec![], CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(paused.outcome.reason, TerminalReason::OutcomeUnknown);
    assert_eq!(paused.outcome.pending[0].call_id.as_str(), "p1");
    let again = rt.resume("run-p", CancellationToken::new()).await.unwrap();
    assert_eq!(
        again.outcome.reason,
        TerminalReason::OutcomeUnknown,
        "resume never guesses"
    );
    let err = rt
        .approve("run-p", vec![], CancellationToken::new())
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("not waiting for approval"),
        "{err}"
    );
    let done = rt
        .resolve(
            "run-p",
            CallId::from("p1"),
            Resolution::Committed,
            CancellationToken::new(),
        )
        .await
        .unwrap();
    assert_eq!(done.outcome.reason, TerminalReason::Completed);
    assert_eq!(
        calls.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "paid once"
    );

    // Cancel: a paused run ends `cancelled`; an ended one cannot be cancelled.
    let rt = s.runtime(
        script,
        Arc::clone(&store),
        vec![Arc::new(Pay(Arc::clone(&calls)))],
    );
    rt.start(
        RunRequest::new("run-q", "g", Budget::default()),
        CancellationToken::new(),
    )
    .await
    .unwrap();
    let cancelled = rt.cancel("run-q").await.unwrap();
    assert_eq!(cancelled.outcome.reason, TerminalReason::Cancelled);
    let err = rt.cancel("run-q").await.unwrap_err();
    assert!(
        err.to_string()
            .contains("already ended: stopped (cancelled)"),
        "{err}"
    );
}

#[tokio::test]
async fn large_outputs_are_kept_as_blobs_in_the_store() {
    let s = setup();
    std::fs::write(s.dir.path().join("ws/big.txt"), "line\n".repeat(20_000)).unwrap();
    let script = json!({"turns": [
        {"tool_calls": [{"id": "c1", "name": "dump", "arguments": {"path": "big.txt"}}]},
        {"final": "big"}
    ]});
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let model = ScriptModel::from_json(&script.to_string()).unwrap();
    let gateway = with_dump(s.dir.path().join("ws"))
        .with_blob_sink(Arc::new(agent_runtime::StoreBlobs::new(Arc::clone(&store))));
    let rt = Runtime::new(Arc::new(model), Arc::new(gateway), Arc::clone(&store));
    rt.start(
        RunRequest::new("run-b", "g", Budget::default()),
        CancellationToken::new(),
    )
    .await
    .unwrap();
    let log = store.load("run-b").unwrap();
    let result = log
        .iter()
        .find_map(|e| match &e.event {
            Event::ToolFinished { result, .. } => Some(result.content()),
            _ => None,
        })
        .unwrap();
    let handle = stored_handle(&result);
    let blob = store.get_blob(&handle).unwrap().unwrap();
    assert_eq!(blob.len(), 100_000, "the whole output is kept");
    assert!(
        result.len() < 2_300,
        "the log keeps a 2,000-byte preview: {}",
        result.len()
    );
}

#[tokio::test]
async fn a_long_run_is_compacted_and_the_model_sees_the_summary_and_facts() {
    let s = setup();
    std::fs::write(
        s.dir.path().join("ws/big.txt"),
        "a line of the big file\n".repeat(200),
    )
    .unwrap();
    let mut turns: Vec<Value> = (0..12)
        .map(|i| {
            json!({"tool_calls": [{"id": format!("c{i}"), "name": "read_file",
            "arguments": {"path": "big.txt", "offset": i + 1}}]})
        })
        .collect();
    turns.push(json!({"final": "done"}));
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let rt = s
        .runtime(json!({ "turns": turns }), Arc::clone(&store), vec![])
        .with_context(agent_context::ContextConfig {
            context_window: 6_000,
            ..agent_context::ContextConfig::default()
        });
    let report = rt
        .start(
            RunRequest::new("run-c", "read the big file", Budget::default()),
            CancellationToken::new(),
        )
        .await
        .unwrap();
    assert_eq!(report.outcome.reason, TerminalReason::Completed);
    assert_eq!(report.state.steps, 13, "compaction is not a model call");
    let log = store.load("run-c").unwrap();
    let compactions: Vec<(u64, u64)> = log
        .iter()
        .filter_map(|e| match &e.event {
            Event::ContextCompacted {
                tokens_before,
                tokens_after,
                ..
            } => Some((*tokens_before, *tokens_after)),
            _ => None,
        })
        .collect();
    assert!(
        !compactions.is_empty(),
        "a 6,000-token window forces a compaction"
    );
    assert!(compactions.iter().all(|(before, after)| after < before));
    // CONTRACT §9: past 80% of the window the history is compacted, so no prompt the
    // model got was estimated above 80% of it.
    let prompts = s.prompts.lock().unwrap();
    for (i, entry) in log.iter().enumerate() {
        if matches!(
            entry.event,
            Event::DecisionProposed { .. } | Event::DecisionRejected { .. }
        ) {
            let estimated = rt.projector(&log[..i]).tokens();
            assert!(
                estimated * 10 <= 6_000 * 8,
                "the prompt before entry {} was estimated at {estimated} tokens",
                entry.version
            );
        }
    }
    let compacted = prompts.iter().find(|p| {
        p.messages.first().is_some_and(|m| {
            m.parts.iter().any(|part|
            matches!(part, Part::Text { text } if text.starts_with(agent_context::SUMMARY_PREFIX)))
        })
    });
    assert!(compacted.is_some(), "the model saw the summary");
}

#[tokio::test]
async fn read_result_reads_back_a_masked_older_result() {
    let s = setup();
    std::fs::write(
        s.dir.path().join("ws/long.txt"),
        format!("BEGIN {} END\n", "y".repeat(3_000)),
    )
    .unwrap();
    let script = json!({"turns": [
        {"tool_calls": [{"id": "c1", "name": "read_file", "arguments": {"path": "long.txt"}}]},
        {"tool_calls": [{"id": "c2", "name": "list_dir", "arguments": {}}]},
        {"tool_calls": [{"id": "c3", "name": "list_dir", "arguments": {"path": "."}}]},
        {"tool_calls": [{"id": "c4", "name": "glob", "arguments": {"pattern": "*"}}]},
        {"tool_calls": [{"id": "c5", "name": "read_result", "arguments": {"handle": "log:3"}}]},
        {"final": "done"}
    ]});
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let model = ScriptModel::from_json(&script.to_string()).unwrap();
    let blobs = Arc::new(agent_runtime::StoreBlobs::new(Arc::clone(&store)));
    let gateway = Gateway::with_builtins(Workspace::new(s.dir.path().join("ws")).unwrap())
        .unwrap()
        .with_result_source(blobs);
    let model = Recording {
        inner: model,
        trace: Arc::clone(&s.trace),
        prompts: Arc::clone(&s.prompts),
    };
    let rt = Runtime::new(Arc::new(model), Arc::new(gateway), Arc::clone(&store));
    let report = rt
        .start(
            RunRequest::new("run-r", "g", Budget::default()),
            CancellationToken::new(),
        )
        .await
        .unwrap();
    assert_eq!(report.outcome.reason, TerminalReason::Completed);
    let prompts = s.prompts.lock().unwrap();
    let last = serde_json::to_string(prompts.last().unwrap()).unwrap();
    assert!(
        last.contains("read_result handle \\\"log:3\\\""),
        "c1 is masked: {last}"
    );
    let log = store.load("run-r").unwrap();
    let read_back = log
        .iter()
        .find_map(|e| match &e.event {
            Event::ToolFinished { result, .. } if result.call_id.as_str() == "c5" => {
                Some(result.content())
            }
            _ => None,
        })
        .unwrap();
    assert!(
        read_back.contains("BEGIN") && read_back.contains("END"),
        "{}",
        &read_back[..100]
    );
}

#[tokio::test]
async fn read_result_reads_only_handles_its_own_run_handed_out() {
    let s = setup();
    std::fs::write(
        s.dir.path().join("ws/big.txt"),
        format!("PRIVATE {}\n", "z".repeat(60_000)),
    )
    .unwrap();
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let blobs = Arc::new(agent_runtime::StoreBlobs::new(Arc::clone(&store)));
    let runtime = |script: Value| {
        let gateway = with_dump(s.dir.path().join("ws"))
            .with_blob_sink(blobs.clone())
            .with_result_source(blobs.clone());
        let model = ScriptModel::from_json(&script.to_string()).unwrap();
        Runtime::new(Arc::new(model), Arc::new(gateway), Arc::clone(&store))
    };
    let result_of = |run: &str, call: &str| {
        store
            .load(run)
            .unwrap()
            .iter()
            .find_map(|e| match &e.event {
                Event::ToolFinished { result, .. } if result.call_id.as_str() == call => {
                    Some(result.content())
                }
                _ => None,
            })
            .unwrap()
    };
    runtime(json!({"turns": [
        {"tool_calls": [{"id": "c1", "name": "dump", "arguments": {"path": "big.txt"}}]},
        {"final": "read"}
    ]}))
    .start(
        RunRequest::new("run-a", "g", Budget::default()),
        CancellationToken::new(),
    )
    .await
    .unwrap();
    let shown = result_of("run-a", "c1");
    let handle = stored_handle(&shown);
    // Its own run reads it back; another run that learned the handle cannot.
    for (run, turns) in [
        (
            "run-a2",
            vec![
                json!({"tool_calls": [{"id": "c1", "name": "dump", "arguments": {"path": "big.txt"}}]}),
            ],
        ),
        (
            "run-b",
            vec![json!({"tool_calls": [{"id": "l1", "name": "list_dir", "arguments": {}}]})],
        ),
    ] {
        let mut turns = turns;
        turns.push(json!({"tool_calls": [{"id": "r1", "name": "read_result", "arguments": {"handle": handle}}]}));
        turns.push(json!({"final": "done"}));
        runtime(json!({ "turns": turns }))
            .start(
                RunRequest::new(run, "g", Budget::default()),
                CancellationToken::new(),
            )
            .await
            .unwrap();
    }
    assert!(result_of("run-a2", "r1").contains("PRIVATE"));
    let refused = result_of("run-b", "r1");
    assert!(
        !refused.contains("PRIVATE") && refused.contains("no stored result"),
        "{refused}"
    );
}

#[tokio::test]
async fn cancel_ends_a_run_whose_log_does_not_fold() {
    let s = setup();
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    // Two start events: no run folds from that.
    let first = agent_store::conformance::started("run-x", 1);
    let mut second = agent_store::conformance::started("run-x", 2);
    second.version = 2;
    store.append("run-x", 0, &[first, second]).unwrap();
    let rt = s.runtime(json!({"turns": []}), Arc::clone(&store), vec![]);
    assert!(matches!(
        rt.resume("run-x", CancellationToken::new()).await,
        Err(agent_runtime::RuntimeError::Damaged { .. })
    ));
    let report = rt.cancel("run-x").await.unwrap();
    assert_eq!(report.outcome.reason, TerminalReason::Cancelled);
    let log = store.load("run-x").unwrap();
    assert!(
        matches!(&log.last().unwrap().event, Event::RunEnded { outcome } if outcome.reason == TerminalReason::Cancelled)
    );
    assert!(matches!(
        rt.cancel("run-x").await,
        Err(agent_runtime::RuntimeError::Refused(m)) if m.contains("already ended")
    ));
    let summary = store.runs().unwrap();
    assert_eq!(summary[0].reason, Some(TerminalReason::Cancelled));
}

/// The prompt is a function of the committed log: rebuilding it from each prefix of the log
/// gives, byte for byte, what the model got at each call, compactions included.
#[tokio::test]
async fn replaying_the_log_reproduces_every_prompt_byte_for_byte() {
    let s = setup();
    std::fs::write(
        s.dir.path().join("ws/big.txt"),
        "a line of the big file\n".repeat(200),
    )
    .unwrap();
    let mut turns: Vec<Value> = (0..12)
        .map(|i| {
            json!({"tool_calls": [{"id": format!("c{i}"), "name": "read_file",
            "arguments": {"path": "big.txt", "offset": i + 1}}]})
        })
        .collect();
    turns.push(json!({"final": "done"}));
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let context = agent_context::ContextConfig {
        context_window: 6_000,
        ..agent_context::ContextConfig::default()
    };
    let rt = s
        .runtime(json!({ "turns": turns }), Arc::clone(&store), vec![])
        .with_context(context);
    rt.start(
        RunRequest::new("run-p", "read the big file", Budget::default()),
        CancellationToken::new(),
    )
    .await
    .unwrap();
    let log = store.load("run-p").unwrap();
    assert!(
        log.iter()
            .any(|e| matches!(e.event, Event::ContextCompacted { .. })),
        "the run compacted"
    );
    // Each model call answered with the entry that records its decision: the prompt it got
    // is the projection of everything before that entry.
    let calls: Vec<usize> = log
        .iter()
        .enumerate()
        .filter(|(_, e)| {
            matches!(
                e.event,
                Event::DecisionProposed { .. } | Event::DecisionRejected { .. }
            )
        })
        .map(|(i, _)| i)
        .collect();
    let prompts = s.prompts.lock().unwrap();
    assert_eq!(calls.len(), prompts.len());
    for (n, (at, sent)) in calls.iter().zip(prompts.iter()).enumerate() {
        let rebuilt = rt.projector(&log[..*at]).prompt().clone();
        assert_eq!(
            serde_json::to_string(&rebuilt).unwrap(),
            serde_json::to_string(sent).unwrap(),
            "model call {}",
            n + 1
        );
    }
}

#[tokio::test]
async fn read_result_pages_through_a_blob_by_offset_and_limit() {
    let s = setup();
    let text: String = (0..20_000)
        .map(|i| char::from(b'a' + (i % 26) as u8))
        .collect();
    let whole = format!("{text}{text}{text}");
    std::fs::write(s.dir.path().join("ws/abc.txt"), &whole).unwrap();
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let blobs = Arc::new(agent_runtime::StoreBlobs::new(Arc::clone(&store)));
    let gateway = with_dump(s.dir.path().join("ws"))
        .with_blob_sink(blobs.clone())
        .with_result_source(blobs);
    let first = json!({"turns": [
        {"tool_calls": [{"id": "d1", "name": "dump", "arguments": {"path": "abc.txt"}}]},
        {"final": "x"}
    ]});
    let gateway = Arc::new(gateway);
    let model = ScriptModel::from_json(&first.to_string()).unwrap();
    Runtime::new(Arc::new(model), Arc::clone(&gateway), Arc::clone(&store))
        .start(
            RunRequest::new("run-o", "g", Budget::default()),
            CancellationToken::new(),
        )
        .await
        .unwrap();
    let log = store.load("run-o").unwrap();
    let shown = serde_json::to_string(&log).unwrap();
    let handle = stored_handle(&shown);
    // A second model turn, on the same run, reads a page of it.
    let page = json!({"turns": [
        {"tool_calls": [{"id": "d1", "name": "dump", "arguments": {"path": "abc.txt"}}]},
        {"tool_calls": [{"id": "r1", "name": "read_result",
            "arguments": {"handle": handle, "offset": 26_003, "limit": 5}}]},
        {"final": "x"}
    ]});
    let model = ScriptModel::from_json(&page.to_string()).unwrap();
    Runtime::new(Arc::new(model), gateway, Arc::clone(&store))
        .start(
            RunRequest::new("run-p2", "g", Budget::default()),
            CancellationToken::new(),
        )
        .await
        .unwrap();
    let read = store
        .load("run-p2")
        .unwrap()
        .iter()
        .find_map(|e| match &e.event {
            Event::ToolFinished { result, .. } if result.call_id.as_str() == "r1" => {
                Some(result.content())
            }
            _ => None,
        })
        .unwrap();
    assert_eq!(
        read,
        format!(
            "{}\n(characters 26003-26008 of 60000; call again with offset 26008 for more)",
            &whole[26_003..26_008]
        )
    );
}

#[tokio::test]
async fn a_runtime_without_a_model_cancels_and_refuses_what_needs_one() {
    let s = setup();
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    paused_on_save(&s, &store, "run-w", "saved").await;
    let before = store.load("run-w").unwrap().len();
    let bare = Runtime::without_model(
        Arc::new(Gateway::new(Workspace::new(s.dir.path()).unwrap())),
        Arc::clone(&store),
    );
    let token = CancellationToken::new;
    for refused in [
        bare.resume("run-w", token()).await,
        bare.approve("run-w", vec![], token()).await,
        bare.reply("run-w", "go", None, token()).await,
        bare.start(RunRequest::new("run-x", "g", Budget::default()), token())
            .await,
    ] {
        let err = refused.unwrap_err().to_string();
        assert!(err.contains("no model"), "{err}");
    }
    assert_eq!(
        store.load("run-w").unwrap().len(),
        before,
        "nothing written"
    );
    assert!(store.load("run-x").is_err(), "no run started");
    let cancelled = bare.cancel("run-w").await.unwrap();
    assert_eq!(cancelled.outcome.reason, TerminalReason::Cancelled);
}
