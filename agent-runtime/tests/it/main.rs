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

mod approvals;
mod forks;
mod redaction;
mod results;
mod soak;
mod spend;
mod sub_agents;

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
        self.runtime_allowing(script, store, extra, &[])
    }

    /// [`Setup::runtime`] whose policy allows the calls `allow` matches.
    fn runtime_allowing(
        &self,
        script: Value,
        store: Arc<dyn Store>,
        extra: Vec<Arc<dyn Tool>>,
        allow: &[&str],
    ) -> Runtime {
        let model = Recording {
            inner: ScriptModel::from_json(&script.to_string()).unwrap(),
            trace: Arc::clone(&self.trace),
            prompts: Arc::clone(&self.prompts),
        };
        let mut policy = agent_tools::Policy::new();
        for pattern in allow {
            policy.add(agent_tools::Action::Allow, pattern).unwrap();
        }
        let mut gateway =
            Gateway::with_builtins(Workspace::new(self.dir.path().join("ws")).unwrap())
                .unwrap()
                .with_policy(policy);
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

/// A model that cannot say what its calls cost (this test's, which does not override
/// `Model::knows_cost`) cannot drive a run with a cost budget: nothing is asked or written.
/// A token budget needs no price.
#[tokio::test]
async fn a_cost_budget_needs_a_model_that_knows_what_calls_cost() {
    let s = setup();
    let store = s.watched(None);
    let rt = s.runtime(read_script(), Arc::clone(&store), vec![]);
    let capped = Budget {
        max_cost_usd: Some(2.0),
        ..Budget::default()
    };
    let err = rt
        .start(
            RunRequest::new("run-c", "g", capped),
            CancellationToken::new(),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(&err, agent_runtime::RuntimeError::Unpriced { model, max_cost_usd, .. }
            if model == "recording" && *max_cost_usd == 2.0),
        "{err}"
    );
    assert!(
        matches!(store.load("run-c"), Err(StoreError::RunNotFound(_))),
        "nothing was written"
    );
    assert!(
        s.prompts.lock().unwrap().is_empty(),
        "the model was not asked"
    );
    let tokens = Budget {
        max_tokens: Some(1_000),
        ..Budget::default()
    };
    let report = rt
        .start(
            RunRequest::new("run-t", "g", tokens),
            CancellationToken::new(),
        )
        .await
        .unwrap();
    assert_eq!(report.outcome.reason, TerminalReason::Completed);
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

/// A store that carries stop requests and notes ([`Store::tell`]), as a directory store
/// does, and says, in order, when the driver looked for a stop request and when it
/// committed.
#[derive(Default)]
struct StopLooks {
    inner: MemoryStore,
    seen: Mutex<Vec<&'static str>>,
    notes: Mutex<Vec<String>>,
}

impl Store for StopLooks {
    fn append(&self, run_id: &str, expected: u64, entries: &[Entry]) -> Result<u64, StoreError> {
        let noted = entries
            .iter()
            .any(|e| matches!(e.event, Event::UserNote { .. }));
        let what = if noted { "note" } else { "commit" };
        self.seen.lock().unwrap().push(what);
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
    fn stop_asked(&self, _: &str) -> Option<bool> {
        self.seen.lock().unwrap().push("looked");
        Some(false)
    }
    fn tell(&self, _: &str, text: &str) -> Result<bool, StoreError> {
        self.notes.lock().unwrap().push(text.to_owned());
        Ok(true)
    }
    fn told(&self, _: &str) -> Vec<String> {
        self.seen.lock().unwrap().push("told");
        std::mem::take(&mut *self.notes.lock().unwrap())
    }
}

/// A tool during which a person sends the run two notes.
struct NotedMeanwhile(Arc<StopLooks>);

#[async_trait]
impl Tool for NotedMeanwhile {
    fn spec(&self) -> ToolSpec {
        ToolSpec::new("job", "works", json!({"type": "object"}), Risk::Read)
    }
    async fn call(&self, _: Value, _: &ToolContext) -> Result<String, ToolError> {
        self.0.tell("run-n", "mind the tests").unwrap();
        self.0.tell("run-n", "and the docs").unwrap();
        // The driver's watch for stop requests looks again meanwhile: the notes wait for
        // the model call all the same.
        let looks = |store: &StopLooks| store.seen.lock().unwrap().len();
        let before = looks(&self.0);
        while looks(&self.0) == before {
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        Ok("done".into())
    }
}

/// Notes a person sends a running run are committed before its next model call, one
/// `user_note` each, after the results of the calls it ran, and the model reads them in that
/// call's prompt; one sent before the drive began is not this drive's and is dropped.
#[tokio::test]
async fn notes_sent_to_a_running_run_are_read_before_its_next_model_call() {
    let s = setup();
    let store = Arc::new(StopLooks::default());
    store.tell("run-n", "stale").unwrap();
    let shared: Arc<dyn Store> = Arc::clone(&store) as _;
    let tool: Arc<dyn Tool> = Arc::new(NotedMeanwhile(Arc::clone(&store)));
    let script = json!({"turns": [
        {"tool_calls": [{"id": "c1", "name": "job"}]},
        {"final": "done"}
    ]});
    let report = s
        .runtime(script, shared, vec![tool])
        .start(
            RunRequest::new("run-n", "g", Budget::default()),
            CancellationToken::new(),
        )
        .await
        .unwrap();
    assert_eq!(report.outcome.reason, TerminalReason::Completed);
    assert_eq!(report.state.steps, 2);
    let log = store.load("run-n").unwrap();
    let kinds: Vec<&str> = log.iter().map(|e| e.event.name()).collect();
    assert_eq!(
        kinds[2..5],
        ["tool_finished", "user_note", "user_note"],
        "{kinds:?}"
    );
    let notes: Vec<&str> = log
        .iter()
        .filter_map(|e| match &e.event {
            Event::UserNote { text } => Some(text.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(notes, ["mind the tests", "and the docs"]);
    // The store is asked for more only once the notes it handed out are committed (a
    // database's queue takes them off as they are).
    let seen: Vec<&str> = store
        .seen
        .lock()
        .unwrap()
        .iter()
        .copied()
        .filter(|s| *s != "looked")
        .collect();
    let first = seen.iter().position(|s| *s == "note").unwrap();
    assert_eq!(seen[first + 1..first + 2], ["note"], "{seen:?}");
    let prompts = s.prompts.lock().unwrap();
    assert_eq!(prompts.len(), 2);
    let last = serde_json::to_string(prompts[1].messages.last().unwrap()).unwrap();
    assert!(
        last.contains("mind the tests") && last.contains("and the docs"),
        "{last}"
    );
    assert!(
        !serde_json::to_string(&prompts[1])
            .unwrap()
            .contains("stale")
    );
}

/// What a person said to a run before it began (a queued run's worker hands it over) is
/// committed with the run's start, in order, and its first model call reads it
/// after the goal; a store that carries no notes takes them all the same.
#[tokio::test]
async fn notes_given_at_the_start_are_read_by_the_first_model_call() {
    let s = setup();
    let store: Arc<dyn Store> = Arc::new(agent_store::MemoryStore::new());
    let report = s
        .runtime(
            json!({"turns": [{"final": "done"}]}),
            Arc::clone(&store),
            Vec::new(),
        )
        .start_noted(
            RunRequest::new("run-s", "the goal", Budget::default()),
            vec!["first this".into(), "then that".into()],
            CancellationToken::new(),
        )
        .await
        .unwrap();
    assert_eq!(report.outcome.reason, TerminalReason::Completed);
    let log = store.load("run-s").unwrap();
    let kinds: Vec<&str> = log.iter().map(|e| e.event.name()).collect();
    assert_eq!(
        kinds[..4],
        ["run_started", "user_note", "user_note", "decision_proposed"],
        "{kinds:?}"
    );
    let prompts = s.prompts.lock().unwrap();
    let first = serde_json::to_string(&prompts[0].messages).unwrap();
    let at = |text: &str| first.find(text).unwrap();
    assert!(
        at("the goal") < at("first this") && at("first this") < at("then that"),
        "{first}"
    );
}

/// The driver lets go of a stop request made before it began by looking once before it
/// does anything: a request made once the run is going (`agent cancel` right after its
/// first commit) is never taken for an earlier one and dropped.
#[tokio::test]
async fn the_first_look_for_a_stop_request_comes_before_the_run_does_anything() {
    let s = setup();
    let store = Arc::new(StopLooks::default());
    let shared: Arc<dyn Store> = Arc::clone(&store) as _;
    // Commits on the driving thread: nothing else runs before the drive yields.
    let rt = s
        .runtime(json!({"turns": [{"final": "done"}]}), shared, Vec::new())
        .with_inline_store(true);
    let report = rt
        .start(
            RunRequest::new("run-s", "g", Budget::default()),
            CancellationToken::new(),
        )
        .await
        .unwrap();
    assert_eq!(report.outcome.reason, TerminalReason::Completed);
    // (Looking for notes is not doing anything.)
    let seen = store.seen.lock().unwrap().clone();
    let first = seen.iter().find(|s| **s != "told");
    assert_eq!(first, Some(&"looked"), "{seen:?}");
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

/// The wall-clock budget counts the time worked, not the time since the run began: a
/// follow-up an hour after the first exchange ended gets what the first left of it (here
/// nearly all), and its slow model is waited for, not cut off at once.
#[tokio::test(start_paused = true)]
async fn a_follow_up_long_after_the_first_exchange_has_what_is_left_of_the_wall_clock_budget() {
    let s = setup();
    let script = json!({"turns": [
        {"final": "first"},
        {"final": "second", "delay_ms": 3000}
    ]});
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let rt = s
        .runtime(script, Arc::clone(&store), vec![])
        .with_clock(Arc::new(TokioClock(tokio::time::Instant::now())));
    let budget = Budget {
        max_wall_time_ms: Some(10_000),
        ..Budget::default()
    };
    let first = rt
        .start(
            RunRequest::new("run-later", "g", budget),
            CancellationToken::new(),
        )
        .await
        .unwrap();
    assert_eq!(first.outcome.reason, TerminalReason::Completed);
    tokio::time::advance(std::time::Duration::from_secs(3_600)).await;
    let before = tokio::time::Instant::now();
    let second = rt
        .reply("run-later", "and then?", None, CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(
        (second.outcome.reason, second.outcome.answer.as_deref()),
        (TerminalReason::Completed, Some("second"))
    );
    assert_eq!(
        before.elapsed().as_millis(),
        3_000,
        "the model was waited for"
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

/// Counts one token per character, and how often it was asked.
struct PerChar(std::sync::atomic::AtomicUsize);

impl agent_context::TokenCounter for PerChar {
    fn count(&self, text: &str) -> usize {
        self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        text.chars().count()
    }
}

#[tokio::test]
async fn the_token_counter_is_the_one_given() {
    let s = setup();
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    paused_on_save(&s, &store, "run-t", "saved").await;
    let log = store.load("run-t").unwrap();
    let counter = Arc::new(PerChar(std::sync::atomic::AtomicUsize::new(0)));
    let runtime = Runtime::without_model(
        Arc::new(Gateway::new(Workspace::new(s.dir.path()).unwrap())),
        Arc::clone(&store),
    )
    .with_token_counter(counter.clone());
    let tokens = runtime.projector(&log).tokens();
    assert!(
        counter.0.load(std::sync::atomic::Ordering::Relaxed) > 0,
        "it was asked"
    );
    let default = Runtime::without_model(
        Arc::new(Gateway::new(Workspace::new(s.dir.path()).unwrap())),
        Arc::clone(&store),
    );
    assert_ne!(
        tokens,
        default.projector(&log).tokens(),
        "not tiktoken's count"
    );
}

/// Records the thread of every store call.
struct Threads {
    inner: SledStore,
    seen: Mutex<Vec<std::thread::ThreadId>>,
}

impl Store for Threads {
    fn append(&self, run_id: &str, expected: u64, entries: &[Entry]) -> Result<u64, StoreError> {
        self.seen.lock().unwrap().push(std::thread::current().id());
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

/// With `with_inline_store`, the commits are made on the thread that drives the run (a
/// current-thread runtime's); without, on tokio's blocking pool. The run is the same.
#[test]
fn inline_store_work_stays_on_the_driving_thread_and_changes_nothing_else() {
    let mut logs = Vec::new();
    // One workspace (the run records it), a store each.
    let s = setup();
    for inline in [true, false] {
        let store = Arc::new(Threads {
            inner: SledStore::open(s.dir.path().join(format!("store-{inline}"))).unwrap(),
            seen: Mutex::default(),
        });
        let rt = s
            .runtime(read_script(), Arc::clone(&store) as Arc<dyn Store>, vec![])
            .with_inline_store(inline)
            .with_clock(Arc::new(Fixed));
        let tokio = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let report = tokio
            .block_on(rt.start(
                RunRequest::new("run-i", "When is the meeting?", Budget::default()),
                CancellationToken::new(),
            ))
            .unwrap();
        assert_eq!(report.outcome.reason, TerminalReason::Completed);
        let here = std::thread::current().id();
        let seen = store.seen.lock().unwrap().clone();
        assert!(seen.len() >= 3, "{seen:?}");
        assert_eq!(
            seen.iter().all(|t| *t == here),
            inline,
            "commits on the driving thread exactly when inline: {seen:?}"
        );
        logs.push(store.load("run-i").unwrap());
    }
    assert_eq!(logs[0], logs[1]);
}

/// A clock that stands still, so two runs' logs can be compared whole.
struct Fixed;

impl Clock for Fixed {
    fn now_ms(&self) -> u64 {
        1_000
    }
}

/// A clock the test moves by hand.
struct HandClock(Arc<std::sync::atomic::AtomicU64>);

impl Clock for HandClock {
    fn now_ms(&self) -> u64 {
        self.0.load(std::sync::atomic::Ordering::SeqCst)
    }
}

/// A model whose call takes the run past its wall-clock budget: its answer comes back
/// just after the deadline, before the runtime's timer for it fired.
struct AnswersLate {
    clock: Arc<std::sync::atomic::AtomicU64>,
    past: u64,
}

#[async_trait]
impl Model for AnswersLate {
    fn provider(&self) -> &str {
        "late"
    }
    fn model(&self) -> &str {
        "late"
    }
    async fn decide(&self, _: ModelRequest<'_>) -> Result<ModelReply, ProviderError> {
        self.clock
            .fetch_add(self.past, std::sync::atomic::Ordering::SeqCst);
        Ok(ModelReply::decision(
            Decision::ToolCalls {
                calls: vec![ToolCall::new(
                    "c1",
                    "read_file",
                    json!({"path": "notes.txt"}),
                )],
            },
            Usage::tokens(1_000, 50),
        ))
    }
}

/// A run whose process died after its first, slow turn, taken up by another process an hour
/// later: the hour is not worked time. `run_resumed` is committed first, and the slow second
/// call is waited for with what the first turn left of the budget, not cut off at once.
#[tokio::test(start_paused = true)]
async fn a_run_taken_up_an_hour_after_its_process_died_has_what_it_had_left_of_the_budget() {
    let s = setup();
    let script = json!({"turns": [
        {"tool_calls": [{"id": "c1", "name": "read_file", "arguments": {"path": "notes.txt"}}],
         "delay_ms": 3000},
        {"final": "done", "delay_ms": 3000}
    ]});
    let clock = Arc::new(TokioClock(tokio::time::Instant::now()));
    let budget = Budget {
        max_wall_time_ms: Some(10_000),
        ..Budget::default()
    };
    let first: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let rt = s
        .runtime(script.clone(), Arc::clone(&first), vec![])
        .with_clock(clock.clone());
    let whole = rt
        .start(
            RunRequest::new("run-up", "g", budget),
            CancellationToken::new(),
        )
        .await
        .unwrap();
    assert_eq!(whole.outcome.reason, TerminalReason::Completed);
    // What the process had committed when it died: its first turn, whole.
    let mut log = first.load("run-up").unwrap();
    let cut = log
        .iter()
        .position(|e| e.event.name() == "tool_finished")
        .unwrap();
    log.truncate(cut + 1);
    let left: Arc<dyn Store> = Arc::new(MemoryStore::new());
    left.append("run-up", 0, &log).unwrap();

    tokio::time::advance(std::time::Duration::from_secs(3_600)).await;
    let taken_at = clock.now_ms();
    let rt = s
        .runtime(script, Arc::clone(&left), vec![])
        .with_clock(clock.clone());
    let report = rt.resume("run-up", CancellationToken::new()).await.unwrap();
    assert_eq!(report.outcome.reason, TerminalReason::Completed);
    assert_eq!(report.outcome.answer.as_deref(), Some("done"));
    let log = left.load("run-up").unwrap();
    let kinds: Vec<&str> = log.iter().map(|e| e.event.name()).collect();
    assert_eq!(
        kinds,
        [
            "run_started",
            "decision_proposed",
            "tool_finished",
            "run_resumed",
            "decision_proposed",
            "run_ended"
        ]
    );
    assert_eq!(log[3].at_ms, taken_at);
    let worked = report.state.worked_by(log.last().unwrap().at_ms);
    assert_eq!(worked, 6_000, "two slow calls, not the hour between them");
}

/// A tool during whose call the process is asked to shut down ([`Runtime::with_drain`]):
/// it cancels `drain`, then finishes its work.
struct DrainedMeanwhile {
    drain: CancellationToken,
    calls: std::sync::atomic::AtomicUsize,
}

#[async_trait]
impl Tool for DrainedMeanwhile {
    fn spec(&self) -> ToolSpec {
        ToolSpec::new("job", "works", json!({"type": "object"}), Risk::Write)
    }
    async fn call(&self, _: Value, _: &ToolContext) -> Result<String, ToolError> {
        self.calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.drain.cancel();
        Ok("done".into())
    }
}

/// A runtime asked to let its runs go while a call runs finishes that call, commits its
/// result and stops before the model is asked again: the run is left as committed, not
/// ended and nothing in doubt, and the process that takes it up goes on from there without
/// running the call again.
#[tokio::test]
async fn a_run_let_go_while_its_call_runs_commits_the_call_and_goes_on_elsewhere() {
    let s = setup();
    let script = json!({"turns": [
        {"tool_calls": [{"id": "c1", "name": "job"}]},
        {"final": "all done"}
    ]});
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let drain = CancellationToken::new();
    let tool = Arc::new(DrainedMeanwhile {
        drain: drain.clone(),
        calls: Default::default(),
    });
    let rt = s
        .runtime_allowing(
            script.clone(),
            Arc::clone(&store),
            vec![tool.clone()],
            &["job"],
        )
        .with_drain(drain);
    let let_go = rt
        .start(
            RunRequest::new("run-l", "g", Budget::default()),
            CancellationToken::new(),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(&let_go, agent_runtime::RuntimeError::LetGo { run_id } if run_id == "run-l"),
        "{let_go:?}"
    );
    let log = store.load("run-l").unwrap();
    let state = RunState::fold(&log).unwrap();
    assert_eq!(state.status, Status::Running, "not ended, not paused");
    assert_eq!((state.steps, state.tool_calls), (1, 1));
    assert!(matches!(
        &log.last().unwrap().event,
        Event::ToolFinished { result, .. } if result.content() == "done"
    ));
    assert!(
        log.iter()
            .any(|e| matches!(e.event, Event::EffectDispatched { .. })),
        "a side effect"
    );
    assert!(state.in_doubt().is_empty(), "nothing in doubt");
    // Let go between two steps, it takes a note without being driven (for a worker).
    rt.record_note("run-l", "mind the tests").await.unwrap();
    assert!(matches!(
        &store.load("run-l").unwrap().last().unwrap().event,
        Event::UserNote { text } if text == "mind the tests"
    ));

    let elsewhere = s.runtime_allowing(script, Arc::clone(&store), vec![tool.clone()], &["job"]);
    let report = elsewhere
        .resume("run-l", CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(report.outcome.reason, TerminalReason::Completed);
    assert_eq!(report.outcome.answer.as_deref(), Some("all done"));
    assert_eq!(tool.calls.load(std::sync::atomic::Ordering::SeqCst), 1);
}

/// A tool that, while it runs, has another process write `event` to the run's log: an
/// `agent cancel` from another machine, or a process taking the run up.
struct WrittenMeanwhile {
    store: Arc<dyn Store>,
    run_id: &'static str,
    event: Event,
}

#[async_trait]
impl Tool for WrittenMeanwhile {
    fn spec(&self) -> ToolSpec {
        ToolSpec::new(
            "slow",
            "takes its time",
            json!({"type": "object"}),
            Risk::Read,
        )
    }
    async fn call(&self, _: Value, _: &ToolContext) -> Result<String, ToolError> {
        let log = self.store.load(self.run_id).unwrap();
        let entry = Entry {
            version: log.len() as u64 + 1,
            at_ms: log.last().unwrap().at_ms + 1,
            event: self.event.clone(),
        };
        self.store
            .append(self.run_id, log.len() as u64, &[entry])
            .unwrap();
        Ok("done".into())
    }
}

/// A run cancelled from elsewhere while this process ran its tool: the result cannot be
/// committed after the end, and the invocation reports the run as it now stands
/// (cancelled, with the other's words), not a failed commit; the log is left as the cancel
/// left it.
#[tokio::test]
async fn a_run_ended_by_another_process_meanwhile_is_reported_as_it_ended() {
    let s = setup();
    let script = json!({"turns": [
        {"tool_calls": [{"id": "c1", "name": "slow"}]},
        {"final": "never"}
    ]});
    let cases = [
        (
            Event::RunEnded {
                outcome: Outcome::stop(TerminalReason::Cancelled, "cancelled from elsewhere"),
            },
            TerminalReason::Cancelled,
        ),
        (Event::RunResumed {}, TerminalReason::CheckpointFailed),
    ];
    for (event, reason) in cases {
        let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
        let tool = WrittenMeanwhile {
            store: Arc::clone(&store),
            run_id: "run-m",
            event: event.clone(),
        };
        let rt = s.runtime(script.clone(), Arc::clone(&store), vec![Arc::new(tool)]);
        let report = rt
            .start(
                RunRequest::new("run-m", "g", Budget::default()),
                CancellationToken::new(),
            )
            .await
            .unwrap();
        assert_eq!(report.outcome.reason, reason, "{}", report.outcome.message);
        let log = store.load("run-m").unwrap();
        assert_eq!(log.last().unwrap().event, event, "nothing written after it");
        if reason == TerminalReason::Cancelled {
            assert_eq!(report.outcome.message, "cancelled from elsewhere");
            assert_eq!(report.state.version, log.len() as u64);
            // A new run under a taken id is refused, not taken for that run.
            let again = rt
                .start(
                    RunRequest::new("run-m", "g", Budget::default()),
                    CancellationToken::new(),
                )
                .await
                .unwrap();
            assert_eq!(again.outcome.reason, TerminalReason::CheckpointFailed);
            assert_eq!(store.load("run-m").unwrap(), log);
        } else {
            assert!(
                report
                    .outcome
                    .message
                    .contains("another process wrote to the run"),
                "{}",
                report.outcome.message
            );
        }
    }
}

/// An answer that arrives as the wall-clock budget runs out is kept (it was paid for), and
/// the run stops there, its calls not run: no internal error, whichever came first.
#[tokio::test]
async fn an_answer_that_comes_as_the_deadline_passes_is_kept_and_the_run_stops() {
    let s = setup();
    let clock = Arc::new(std::sync::atomic::AtomicU64::new(1_700_000_000_000));
    let model = AnswersLate {
        clock: Arc::clone(&clock),
        past: 61_000,
    };
    let gateway = Gateway::with_builtins(Workspace::new(s.dir.path().join("ws")).unwrap()).unwrap();
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let rt = Runtime::new(Arc::new(model), Arc::new(gateway), Arc::clone(&store))
        .with_clock(Arc::new(HandClock(clock)));
    let budget = Budget {
        max_wall_time_ms: Some(60_000),
        ..Budget::default()
    };
    let report = rt
        .start(
            RunRequest::new("run-late", "g", budget),
            CancellationToken::new(),
        )
        .await
        .unwrap();
    assert_eq!(report.outcome.reason, TerminalReason::DeadlineExceeded);
    let log = store.load("run-late").unwrap();
    let kinds: Vec<&str> = log.iter().map(|e| e.event.name()).collect();
    assert_eq!(kinds, ["run_started", "decision_proposed", "run_ended"]);
    assert_eq!(
        report.state.usage.total_tokens(),
        1_050,
        "the late answer counts"
    );
    assert_eq!(report.state.tool_calls, 0, "nothing ran past the deadline");
}
