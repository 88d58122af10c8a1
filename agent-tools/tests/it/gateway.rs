use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use agent_core::*;
use agent_tools::{Gateway, Tool, ToolContext, Workspace};
use async_trait::async_trait;
use serde_json::{Value, json};
use tokio::sync::Barrier;
use tokio_util::sync::CancellationToken;

/// A test tool with a chosen behaviour.
struct Probe {
    name: &'static str,
    risk: Risk,
    timeout_ms: u64,
    behaviour: Behaviour,
}

enum Behaviour {
    Echo,
    /// Waits until `n` calls are inside at once: only concurrent calls can pass.
    Rendezvous(Arc<Barrier>),
    Hang(Arc<Dropped>),
    Panic,
}

/// How many hanging calls had their state dropped, and a wake-up for each drop.
#[derive(Default)]
struct Dropped {
    count: AtomicUsize,
    notify: tokio::sync::Notify,
}

impl Dropped {
    /// Waits until `n` calls' state was dropped: at once on a current-thread runtime,
    /// when another worker gets to the aborted task on a multi-thread one.
    async fn reach(&self, n: usize) {
        loop {
            let dropped = self.notify.notified();
            if self.count.load(Ordering::SeqCst) >= n {
                return;
            }
            tokio::time::timeout(std::time::Duration::from_secs(30), dropped)
                .await
                .expect("the call's state was never dropped");
        }
    }
}

#[async_trait]
impl Tool for Probe {
    fn spec(&self) -> ToolSpec {
        let mut spec = ToolSpec::new(
            self.name,
            "probe",
            json!({"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}),
            self.risk,
        );
        spec.timeout_ms = self.timeout_ms;
        spec
    }

    async fn call(&self, arguments: Value, ctx: &ToolContext) -> Result<String, ToolError> {
        match &self.behaviour {
            Behaviour::Echo => Ok(format!("n={}", arguments["n"])),
            Behaviour::Rendezvous(barrier) => {
                barrier.wait().await;
                Ok(format!("met n={}", arguments["n"]))
            }
            Behaviour::Hang(dropped) => {
                struct OnDrop(Arc<Dropped>);
                impl Drop for OnDrop {
                    fn drop(&mut self) {
                        self.0.count.fetch_add(1, Ordering::SeqCst);
                        self.0.notify.notify_waiters();
                    }
                }
                let _guard = OnDrop(Arc::clone(dropped));
                ctx.cancel.cancelled().await;
                std::future::pending::<()>().await;
                unreachable!()
            }
            Behaviour::Panic => panic!("probe exploded"),
        }
    }
}

fn probe(name: &'static str, behaviour: Behaviour) -> Arc<dyn Tool> {
    Arc::new(Probe {
        name,
        risk: Risk::Read,
        timeout_ms: 60_000,
        behaviour,
    })
}

fn gateway(tools: Vec<Arc<dyn Tool>>) -> (tempfile::TempDir, Gateway) {
    let dir = tempfile::tempdir().unwrap();
    let mut g = Gateway::with_builtins(Workspace::new(dir.path()).unwrap()).unwrap();
    for t in tools {
        g.register(t).unwrap();
    }
    (dir, g)
}

fn scheduled(id: &str, name: &str, n: i64) -> ScheduledCall {
    ScheduledCall {
        call: ToolCall::new(id, name, json!({ "n": n })),
        risk: Risk::Read,
        effect_key: None,
        path: None,
    }
}

#[tokio::test]
async fn schema_invalid_arguments_name_the_path_and_the_problem() {
    let (_d, g) = gateway(vec![probe("echo", Behaviour::Echo)]);
    let verdicts = g
        .check(
            "run",
            &[
                ToolCall::new("a", "echo", json!({"n": "x"})),
                ToolCall::new("b", "echo", json!({})),
                ToolCall::new("c", "echo", json!({"n": 3})),
            ],
        )
        .await;
    let Verdict::Invalid { message } = &verdicts[0].1 else {
        panic!("{verdicts:?}")
    };
    assert_eq!(message, "/n: \"x\" is not of type \"integer\"");
    let Verdict::Invalid { message } = &verdicts[1].1 else {
        panic!("{verdicts:?}")
    };
    assert!(
        message.starts_with("/: ") && message.contains("\"n\" is a required property"),
        "{message}"
    );
    assert_eq!(verdicts[2], (CallId::from("c"), Verdict::Allow));
}

#[tokio::test]
async fn default_policy_allows_reads_and_asks_for_writes() {
    let (_d, mut g) = gateway(vec![]);
    g.register(Arc::new(Probe {
        name: "save",
        risk: Risk::Write,
        timeout_ms: 1_000,
        behaviour: Behaviour::Echo,
    }))
    .unwrap();
    let v = g
        .check(
            "run",
            &[
                ToolCall::new("r", "list_dir", json!({})),
                ToolCall::new("w", "save", json!({"n": 1})),
            ],
        )
        .await;
    assert_eq!(v[0].1, Verdict::Allow);
    assert!(matches!(&v[1].1, Verdict::Ask { why } if why.contains("write")));
}

#[test]
fn registering_two_tools_of_one_name_or_a_broken_schema_fails() {
    let (_d, mut g) = gateway(vec![]);
    let err = g.register(probe("read_file", Behaviour::Echo)).unwrap_err();
    assert!(err.to_string().contains("read_file"));
    struct Broken;
    #[async_trait]
    impl Tool for Broken {
        fn spec(&self) -> ToolSpec {
            ToolSpec::new("broken", "", json!({"type": 12}), Risk::Read)
        }
        async fn call(&self, _: Value, _: &ToolContext) -> Result<String, ToolError> {
            Ok(String::new())
        }
    }
    let err = g.register(Arc::new(Broken)).unwrap_err();
    assert!(err.to_string().contains("invalid input schema"), "{err}");
}

#[tokio::test]
async fn a_group_runs_concurrently_and_results_keep_their_ids() {
    // Three calls meet at a barrier of three: this only completes if they run at once.
    let barrier = Arc::new(Barrier::new(3));
    let (_d, g) = gateway(vec![probe("meet", Behaviour::Rendezvous(barrier))]);
    let group = vec![
        scheduled("x", "meet", 1),
        scheduled("y", "meet", 2),
        scheduled("z", "meet", 3),
    ];
    let results = g
        .execute("run", vec![group], &CancellationToken::new())
        .await;
    let got: Vec<(String, String)> = results
        .iter()
        .map(|r| (r.call_id.to_string(), r.content()))
        .collect();
    assert_eq!(
        got,
        [
            ("x".to_owned(), "met n=1".to_owned()),
            ("y".to_owned(), "met n=2".to_owned()),
            ("z".to_owned(), "met n=3".to_owned())
        ]
    );
}

// A call runs inside the gateway's own future on a current-thread runtime, in a task of its
// own on a multi-thread one: each behaviour below holds on both.

#[tokio::test]
async fn a_timeout_ends_the_call_and_keeps_its_siblings() {
    a_timeout_ends_the_call_and_keeps_its_siblings_here().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timeout_ends_the_call_and_keeps_its_siblings_on_a_multi_thread_runtime() {
    a_timeout_ends_the_call_and_keeps_its_siblings_here().await;
}

async fn a_timeout_ends_the_call_and_keeps_its_siblings_here() {
    let dropped = Arc::new(Dropped::default());
    let (_d, mut g) = gateway(vec![probe("echo", Behaviour::Echo)]);
    g.register(Arc::new(Probe {
        name: "hang",
        risk: Risk::Read,
        timeout_ms: 50,
        behaviour: Behaviour::Hang(Arc::clone(&dropped)),
    }))
    .unwrap();
    let group = vec![scheduled("h", "hang", 1), scheduled("e", "echo", 2)];
    let results = g
        .execute("run", vec![group], &CancellationToken::new())
        .await;
    assert_eq!(results[0].error_kind(), Some(ErrorKind::Timeout));
    assert!(results[0].content().contains("50 ms"));
    let ToolOutcome::Error(timeout) = &results[0].outcome else {
        panic!("{:?}", results[0])
    };
    assert!(timeout.retryable, "a timeout may be retried");
    assert_eq!(results[1].content(), "n=2");
    // The timed-out call's state is dropped (its task aborted on a multi-thread runtime).
    dropped.reach(1).await;
    assert_eq!(dropped.count.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn cancel_ends_running_calls_and_starts_no_new_group() {
    let dropped = Arc::new(Dropped::default());
    let (_d, g) = gateway(vec![
        probe("hang", Behaviour::Hang(Arc::clone(&dropped))),
        probe("echo", Behaviour::Echo),
    ]);
    let cancel = CancellationToken::new();
    let groups = vec![
        vec![scheduled("h", "hang", 1)],
        vec![scheduled("e", "echo", 2)],
    ];
    let canceller = cancel.clone();
    let (results, ()) = tokio::join!(g.execute("run", groups, &cancel), async move {
        tokio::task::yield_now().await;
        canceller.cancel();
    });
    assert_eq!(results.len(), 1, "the second group never started");
    assert_eq!(results[0].error_kind(), Some(ErrorKind::Cancelled));
}

/// A call with an effect, stopped by its timeout or a cancel, may have acted (in part, or
/// later, elsewhere): the model is told to check, not invited to try again.
#[tokio::test]
async fn a_stopped_call_with_an_effect_says_to_check_before_trying_again() {
    let dropped = Arc::new(Dropped::default());
    let (_d, mut g) = gateway(vec![]);
    for (name, timeout_ms) in [("slow_write", 50), ("hung_write", 60_000)] {
        g.register(Arc::new(Probe {
            name,
            risk: Risk::Write,
            timeout_ms,
            behaviour: Behaviour::Hang(Arc::clone(&dropped)),
        }))
        .unwrap();
    }
    let timed_out = g
        .execute(
            "run",
            vec![vec![scheduled("w", "slow_write", 1)]],
            &CancellationToken::new(),
        )
        .await;
    let cancel = CancellationToken::new();
    let canceller = cancel.clone();
    let (cancelled, ()) = tokio::join!(
        g.execute("run", vec![vec![scheduled("c", "hung_write", 2)]], &cancel),
        async move {
            tokio::task::yield_now().await;
            canceller.cancel();
        }
    );
    for (results, kind) in [
        (&timed_out, ErrorKind::Timeout),
        (&cancelled, ErrorKind::Cancelled),
    ] {
        let ToolOutcome::Error(error) = &results[0].outcome else {
            panic!("{:?}", results[0])
        };
        assert_eq!(error.kind, kind);
        assert!(!error.retryable, "{error:?}");
        assert!(
            error.message.contains("may have acted")
                && error
                    .message
                    .contains("check its effect before calling it again"),
            "{error:?}"
        );
    }
    assert!(timed_out[0].content().contains("within 50 ms"));
}

#[tokio::test]
async fn a_panicking_tool_is_a_failed_call_not_a_crash() {
    a_panicking_tool_is_a_failed_call_here().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_tool_is_a_failed_call_not_a_crash_on_a_multi_thread_runtime() {
    a_panicking_tool_is_a_failed_call_here().await;
}

async fn a_panicking_tool_is_a_failed_call_here() {
    let (_d, g) = gateway(vec![
        probe("boom", Behaviour::Panic),
        probe("echo", Behaviour::Echo),
    ]);
    let group = vec![scheduled("b", "boom", 1), scheduled("e", "echo", 2)];
    let results = g
        .execute("run", vec![group], &CancellationToken::new())
        .await;
    assert_eq!(results[0].error_kind(), Some(ErrorKind::ExecutionFailed));
    assert!(results[0].content().contains("probe exploded"));
    assert_eq!(results[1].content(), "n=2");
}

/// A tool whose output is 60,008 characters, over the default 50,000 limit.
struct Talkative;

#[async_trait]
impl Tool for Talkative {
    fn spec(&self) -> ToolSpec {
        ToolSpec::new("talkative", "talks", json!({"type": "object"}), Risk::Read)
    }
    async fn call(&self, _: Value, _: &ToolContext) -> Result<String, ToolError> {
        Ok("x".repeat(60_008))
    }
}

#[tokio::test]
async fn long_outputs_are_cut_to_the_tools_limit_with_a_marker() {
    let dir = tempfile::tempdir().unwrap();
    let mut g = Gateway::with_builtins(Workspace::new(dir.path()).unwrap()).unwrap();
    g.register(Arc::new(Talkative)).unwrap();
    let call = ScheduledCall {
        call: ToolCall::new("c", "talkative", json!({})),
        risk: Risk::Read,
        effect_key: None,
        path: None,
    };
    let results = g
        .execute("run", vec![vec![call]], &CancellationToken::new())
        .await;
    // Without a blob sink: cut to the tool's limit (plus a one-line marker), saying how
    // much there was.
    let text = results[0].content();
    let (marker, kept) = text.split_once('\n').unwrap();
    assert_eq!(kept.chars().count(), 50_000, "{marker}");
    assert!(kept.chars().all(|c| c == 'x'));
    assert!(marker.contains("60008") && marker.len() < 200, "{marker}");
}

/// Records how many calls are inside at once.
struct Gauge {
    inside: Arc<AtomicUsize>,
    most: Arc<AtomicUsize>,
}

#[async_trait]
impl Tool for Gauge {
    fn spec(&self) -> ToolSpec {
        ToolSpec::new("gauge", "gauge", json!({"type": "object"}), Risk::Read)
    }
    async fn call(&self, _: Value, _: &ToolContext) -> Result<String, ToolError> {
        let now = self.inside.fetch_add(1, Ordering::SeqCst) + 1;
        self.most.fetch_max(now, Ordering::SeqCst);
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        self.inside.fetch_sub(1, Ordering::SeqCst);
        Ok("done".into())
    }
}

#[tokio::test]
async fn concurrency_within_a_group_is_bounded() {
    let most = Arc::new(AtomicUsize::new(0));
    let dir = tempfile::tempdir().unwrap();
    let mut g = Gateway::new(Workspace::new(dir.path()).unwrap()).with_concurrency(2);
    g.register(Arc::new(Gauge {
        inside: Arc::default(),
        most: Arc::clone(&most),
    }))
    .unwrap();
    let group: Vec<ScheduledCall> = (0..6)
        .map(|i| scheduled(&format!("g{i}"), "gauge", i))
        .collect();
    let results = g
        .execute("run", vec![group], &CancellationToken::new())
        .await;
    assert_eq!(results.len(), 6);
    assert!(results.iter().all(ToolResult::is_ok));
    assert_eq!(most.load(Ordering::SeqCst), 2);
}

/// Keeps blobs in memory and names them by number (as log handles, to tell them apart).
#[derive(Default)]
struct Blobs(std::sync::Mutex<Vec<String>>);

impl agent_tools::BlobSink for Blobs {
    fn put(&self, content: &str) -> Result<Handle, agent_tools::StorageError> {
        let mut blobs = self.0.lock().unwrap();
        blobs.push(content.to_owned());
        Ok(Handle::Log(blobs.len() as u64))
    }
}

/// Returns a long output or a long error.
struct Loud;

#[async_trait]
impl Tool for Loud {
    fn spec(&self) -> ToolSpec {
        let mut s = ToolSpec::new("loud", "loud", json!({"type": "object"}), Risk::Read);
        s.result_limit = 100;
        s
    }
    async fn call(&self, args: Value, _: &ToolContext) -> Result<String, ToolError> {
        let text = format!("START{}END", "x".repeat(1_000));
        if args["fail"] == json!(true) {
            Err(ToolError::new(ErrorKind::ExecutionFailed, text))
        } else {
            Ok(text)
        }
    }
}

#[tokio::test]
async fn large_outputs_go_to_the_blob_sink_and_errors_keep_head_and_tail() {
    let blobs = Arc::new(Blobs::default());
    let dir = tempfile::tempdir().unwrap();
    let mut g = Gateway::new(Workspace::new(dir.path()).unwrap()).with_blob_sink(blobs.clone());
    g.register(Arc::new(Loud)).unwrap();
    let call = |id: &str, fail: bool| ScheduledCall {
        call: ToolCall::new(id, "loud", json!({ "fail": fail })),
        risk: Risk::Read,
        effect_key: None,
        path: None,
    };
    let results = g
        .execute(
            "run",
            vec![vec![call("ok", false), call("bad", true)]],
            &CancellationToken::new(),
        )
        .await;
    let ok = results[0].content();
    assert!(
        ok.starts_with(
            "[output of 1008 characters stored as log:1; its first 100 bytes follow]\nSTART"
        ),
        "no read_result registered, none promised: {ok}"
    );
    assert!(!ok.contains("END"), "only the preview is shown");
    assert_eq!(
        blobs.0.lock().unwrap()[0].len(),
        1008,
        "the sink holds the whole output"
    );
    let bad = results[1].content();
    assert!(
        bad.contains("START") && bad.contains("END") && bad.contains("characters cut"),
        "{bad}"
    );
}

#[tokio::test]
async fn a_stored_output_points_to_read_result_when_the_model_has_it() {
    let dir = tempfile::tempdir().unwrap();
    let mut g = Gateway::new(Workspace::new(dir.path()).unwrap())
        .with_blob_sink(Arc::new(Blobs::default()));
    g.register(Arc::new(Loud)).unwrap();
    struct Nothing;
    impl agent_tools::ResultSource for Nothing {
        fn fetch(&self, _: &str, _: &Handle) -> Result<Option<String>, agent_tools::StorageError> {
            Ok(None)
        }
    }
    let g = g.with_result_source(Arc::new(Nothing));
    let call = ScheduledCall {
        call: ToolCall::new("ok", "loud", json!({ "fail": false })),
        risk: Risk::Read,
        effect_key: None,
        path: None,
    };
    let results = g
        .execute("run", vec![vec![call]], &CancellationToken::new())
        .await;
    assert!(
        results[0]
            .content()
            .contains("follow; read the rest with read_result]"),
        "{}",
        results[0].content()
    );
}

#[tokio::test]
async fn read_result_takes_only_handles_and_says_what_a_handle_looks_like() {
    /// Knows one handle; fails for another, as a broken disk would.
    struct One;
    impl agent_tools::ResultSource for One {
        fn fetch(
            &self,
            _: &str,
            handle: &Handle,
        ) -> Result<Option<String>, agent_tools::StorageError> {
            match handle {
                Handle::Log(3) => Ok(Some("the third".into())),
                Handle::Log(4) => Err(agent_tools::StorageError::new("disk on fire")),
                _ => Ok(None),
            }
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let g = Gateway::new(Workspace::new(dir.path()).unwrap()).with_result_source(Arc::new(One));
    let read = |id: &str, handle: &str| ScheduledCall {
        call: ToolCall::new(id, "read_result", json!({ "handle": handle })),
        risk: Risk::Read,
        effect_key: None,
        path: None,
    };
    let results = g
        .execute(
            "run",
            vec![vec![
                read("a", "log:3"),
                read("b", "../etc/passwd"),
                read("c", "log:9"),
                read("d", "log:4"),
            ]],
            &CancellationToken::new(),
        )
        .await;
    assert_eq!(results[0].content(), "the third");
    assert_eq!(results[1].error_kind(), Some(ErrorKind::InvalidArguments));
    assert!(
        results[1]
            .content()
            .contains("is not a handle (blob:sha256:HEX or log:N)"),
        "{}",
        results[1].content()
    );
    assert_eq!(results[2].error_kind(), Some(ErrorKind::InvalidArguments));
    assert!(results[2].content().contains("no stored result"));
    assert_eq!(results[3].error_kind(), Some(ErrorKind::ExecutionFailed));
    assert!(
        results[3]
            .content()
            .contains("the store failed: disk on fire")
    );
}
