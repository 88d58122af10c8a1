//! The soak test: many runs with random scripted failures (provider errors, bad replies,
//! tools that time out or panic, commits that fail as if the process died between them),
//! each driven until it ends, resumed after every "crash". It checks that nothing panics,
//! that every invocation ends with a typed reason, that a paused run can be continued, and
//! that every log folds.
//!
//! `cargo test -p agent-runtime --test it soak` runs 100 runs; the full soak, 1,000 runs, is
//! `cargo test -p agent-runtime --test it -- --ignored soak` (or `SOAK_RUNS=N`).
#![allow(clippy::print_stderr)]

use super::*;

/// A deterministic random sequence (an LCG): the soak is reproducible from its seed.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        self.0 >> 33
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// A tool that misbehaves on purpose: `mode` 0 answers, 1 never answers (its 5 ms timeout
/// fires), 2 panics, 3 fails.
struct Flaky;

#[async_trait]
impl Tool for Flaky {
    fn spec(&self) -> ToolSpec {
        let mut spec = ToolSpec::new(
            "flaky",
            "misbehaves",
            json!({"type": "object", "properties": {"mode": {"type": "integer"}}, "required": ["mode"]}),
            Risk::Read,
        );
        spec.timeout_ms = 5;
        spec
    }
    async fn call(&self, args: Value, _: &ToolContext) -> Result<String, ToolError> {
        match args["mode"].as_u64() {
            Some(1) => std::future::pending().await,
            // A panic that skips the panic hook, so the soak's output stays readable.
            Some(2) => std::panic::resume_unwind(Box::new("flaky tool panicked on purpose")),
            Some(3) => Err(ToolError::new(ErrorKind::ExecutionFailed, "it failed")),
            _ => Ok("fine".into()),
        }
    }
}

fn random_turn(rng: &mut Lcg, k: u64) -> Value {
    let id = format!("c{k}");
    match rng.below(12) {
        0 => json!({"final": "done"}),
        1 => json!({"invalid": "not a decision"}),
        2 => json!({"error": "HTTP 503: overloaded"}),
        3 => json!({"request_approval": {"summary": "may I?"}}),
        4 => json!({"clarification": "which one?"}),
        5 => json!({"cannot_continue": "no way"}),
        6 => {
            json!({"tool_calls": [{"id": id, "name": "flaky", "arguments": {"mode": rng.below(4)}}]})
        }
        7 => json!({"tool_calls": [{"id": id, "name": "write_file",
                      "arguments": {"path": format!("out/{k}.txt"), "content": "x"}}]}),
        8 => json!({"tool_calls": [{"id": id, "name": "no_such_tool", "arguments": {}}]}),
        9 => json!({"tool_calls": [{"id": id, "name": "read_file", "arguments": {"path": 7}}]}),
        _ => json!({"tool_calls": [
            {"id": format!("{id}a"), "name": "list_dir", "arguments": {}},
            {"id": format!("{id}b"), "name": "flaky", "arguments": {"mode": rng.below(4)}}
        ]}),
    }
}

fn soak(runs: usize, seed: u64) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let s = setup();
    let mut rng = Lcg(seed);
    let store = Arc::new(Watched {
        inner: MemoryStore::new(),
        trace: Trace::default(),
        fail_at: None,
        fail_every: Some(7),
    });
    let mut reasons = std::collections::BTreeMap::<String, usize>::new();
    for r in 0..runs {
        let turns: Vec<Value> = (0..(2 + rng.below(10)))
            .map(|k| random_turn(&mut rng, k))
            .collect();
        let script = json!({ "turns": turns });
        let runtime = || {
            let store: Arc<dyn Store> = store.clone();
            s.runtime(script.clone(), store, vec![Arc::new(Flaky)])
                .with_redactor(agent_runtime::Redactor::none())
        };
        let run_id = format!("soak-{r}");
        let mut started = false;
        let mut finished = None;
        for _attempt in 0..60 {
            let rt_ = runtime();
            let report = rt.block_on(async {
                if !started {
                    rt_.start(
                        RunRequest::new(run_id.clone(), "soak", Budget::default()),
                        CancellationToken::new(),
                    )
                    .await
                } else {
                    rt_.resume(&run_id, CancellationToken::new()).await
                }
            });
            let report = match report {
                Ok(report)
                    if report.outcome.reason == TerminalReason::CheckpointFailed
                        && store.load(&run_id).is_err() =>
                {
                    // The first commit was lost: the run does not exist yet.
                    started = false;
                    continue;
                }
                Ok(report) => report,
                // Nothing was committed yet: start again.
                Err(agent_runtime::RuntimeError::Store(StoreError::RunNotFound(_))) => {
                    started = false;
                    continue;
                }
                Err(e) => panic!("{run_id}: {e}"),
            };
            started = true;
            let reason = report.outcome.reason;
            if std::env::var("SOAK_DEBUG").is_ok() {
                eprintln!("{run_id}: {reason} {}", report.outcome.message);
            }
            let next = match reason {
                TerminalReason::CheckpointFailed => "resume",
                TerminalReason::ApprovalRequired => "approve",
                TerminalReason::OutcomeUnknown => "resolve",
                TerminalReason::ClarificationRequired => "cancel",
                _ => "end",
            };
            let continued = rt.block_on(async {
                match next {
                    "approve" => Some(rt_.approve(&run_id, vec![], CancellationToken::new()).await),
                    "resolve" => {
                        let call = report.outcome.pending[0].call_id.clone();
                        Some(
                            rt_.resolve(&run_id, call, Resolution::Retry, CancellationToken::new())
                                .await,
                        )
                    }
                    "cancel" => Some(rt_.cancel(&run_id).await),
                    _ => None,
                }
            });
            let reason = match continued {
                Some(Ok(after)) => after.outcome.reason,
                // The continuation's own commit was lost: the next attempt picks it up.
                Some(Err(agent_runtime::RuntimeError::Store(_))) => {
                    TerminalReason::CheckpointFailed
                }
                Some(Err(e)) => panic!("{run_id}: {next}: {e}"),
                None => reason,
            };
            if reason.class() != agent_core::ReasonClass::Paused
                && reason != TerminalReason::CheckpointFailed
            {
                finished = Some(reason);
                break;
            }
        }
        let reason = finished.unwrap_or_else(|| panic!("{run_id} never ended"));
        *reasons.entry(reason.as_str().to_owned()).or_default() += 1;
        let log = store.load(&run_id).unwrap();
        let state = RunState::fold(&log).unwrap_or_else(|e| panic!("{run_id}: {e}"));
        assert_eq!(state.outcome().map(|o| o.reason), Some(reason), "{run_id}");
    }
    eprintln!("soak: {runs} runs, seed {seed}: {reasons:?}");
    assert!(
        reasons.len() >= 5,
        "the failures reached many reasons: {reasons:?}"
    );
}

#[test]
fn soak_small() {
    soak(100, 0x50a4);
}

#[test]
#[ignore = "the full soak: cargo test -p agent-runtime --test it -- --ignored soak"]
fn soak_full() {
    let runs = std::env::var("SOAK_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000);
    soak(runs, 0x50a4_1000);
}
