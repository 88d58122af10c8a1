//! What the model sees of results: large outputs kept as blobs, compaction, masked results
//! read back, and prompts replayed byte for byte.

use super::*;

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
    let turns = paged_reads(&s, 12);
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
    // Each older result masked as soon as it leaves the recent turns, not in a batch.
    let rt = Runtime::new(Arc::new(model), Arc::new(gateway), Arc::clone(&store)).with_context(
        agent_context::ContextConfig {
            unmasked_result_chars: 0,
            ..agent_context::ContextConfig::default()
        },
    );
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

/// The prompt is a function of the committed log: rebuilding it from each prefix of the log
/// gives, byte for byte, what the model got at each call, compactions included.
#[tokio::test]
async fn replaying_the_log_reproduces_every_prompt_byte_for_byte() {
    let s = setup();
    let turns = paged_reads(&s, 12);
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

/// What each summary of the test summarizers costs.
fn summary_usage() -> Usage {
    Usage {
        cost_usd: 0.25,
        ..Usage::tokens(500, 100)
    }
}

/// A summarizer whose summaries do not help (longer than what they would replace), each
/// paid for, and how often it was asked.
struct Wordy(std::sync::atomic::AtomicUsize);

#[async_trait]
impl agent_context::Summarizer for Wordy {
    async fn summarize(&self, _history: &[Entry], _prompt: &Prompt) -> agent_context::Summarized {
        self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        agent_context::Summarized {
            summary: Ok("far too long a summary ".repeat(4_000)),
            usage: summary_usage(),
        }
    }
}

#[tokio::test]
async fn a_summary_that_does_not_help_is_not_asked_for_again_every_turn() {
    let s = setup();
    let turns = paged_reads(&s, 12);
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let wordy = Arc::new(Wordy(std::sync::atomic::AtomicUsize::new(0)));
    let rt = s
        .runtime(json!({ "turns": turns }), Arc::clone(&store), vec![])
        .with_context(agent_context::ContextConfig {
            context_window: 6_000,
            // Each older result masked at once: the prompt grows by one turn at a time,
            // which is what the count below is about.
            unmasked_result_chars: 0,
            ..agent_context::ContextConfig::default()
        })
        .with_summarizer(wordy.clone());
    let report = rt
        .start(
            RunRequest::new("run-w", "read the big file", Budget::default()),
            CancellationToken::new(),
        )
        .await
        .unwrap();
    assert_eq!(report.outcome.reason, TerminalReason::Completed);
    let asked = wordy.0.load(std::sync::atomic::Ordering::Relaxed);
    let log = store.load("run-w").unwrap();
    let compacted = log
        .iter()
        .filter(|e| matches!(e.event, Event::ContextCompacted { .. }))
        .count();
    assert_eq!(
        compacted, 0,
        "a summary longer than the history replaces nothing"
    );
    assert!(
        (1..=3).contains(&asked),
        "asked {asked} times over 13 model calls: once, and again only as the prompt grew"
    );
    // Each summary asked for is in the log, with what it cost, and counts in the run's
    // usage (the script's own calls report none).
    let declined: Vec<(u64, u64, Usage)> = log
        .iter()
        .filter_map(|e| match &e.event {
            Event::CompactionDeclined {
                tokens_before,
                tokens_after,
                usage,
            } => Some((*tokens_before, *tokens_after, *usage)),
            _ => None,
        })
        .collect();
    assert_eq!(declined.len(), asked);
    assert!(
        declined
            .iter()
            .all(|(before, after, usage)| after >= before && *usage == summary_usage())
    );
    assert_eq!(report.state.usage.total_tokens(), 600 * asked as u64);
    assert!((report.state.usage.cost_usd - 0.25 * asked as f64).abs() < 1e-9);

    // Continued from its log, the run knows the summaries that did not help: none is
    // asked for again before the prompt grows.
    let again = Arc::new(Wordy(std::sync::atomic::AtomicUsize::new(0)));
    let follow = s
        .runtime(
            json!({ "turns": turns_then(13, "once more") }),
            Arc::clone(&store),
            vec![],
        )
        .with_context(small_window())
        .with_summarizer(again.clone());
    let report = follow
        .reply("run-w", "anything else?", None, CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(report.outcome.answer.as_deref(), Some("once more"));
    assert_eq!(again.0.load(std::sync::atomic::Ordering::Relaxed), 0);
}

/// A script of `skip` turns that are never played (the run made those calls already),
/// then `answer`.
fn turns_then(skip: usize, answer: &str) -> Value {
    let mut turns = vec![json!({"final": "never played"}); skip];
    turns.push(json!({ "final": answer }));
    Value::Array(turns)
}

/// A summarizer whose short summaries help, each paid for.
struct Paid;

#[async_trait]
impl agent_context::Summarizer for Paid {
    async fn summarize(&self, _history: &[Entry], _prompt: &Prompt) -> agent_context::Summarized {
        agent_context::Summarized {
            summary: Ok("read pages of big.txt".to_owned()),
            usage: summary_usage(),
        }
    }
}

/// What a summary's model call used counts toward the run's budgets like any call: past
/// the cost budget, the model is not asked again.
#[tokio::test]
async fn a_summary_s_cost_counts_toward_the_budget() {
    let s = setup();
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let rt = summarizing(&s, &store, Arc::new(Paid));
    let budget = Budget {
        max_tokens: Some(600),
        ..Budget::default()
    };
    let report = rt
        .start(
            RunRequest::new("run-p", "read the big file", budget),
            CancellationToken::new(),
        )
        .await
        .unwrap();
    assert_eq!(report.outcome.reason, TerminalReason::CostBudgetExceeded);
    let log = store.load("run-p").unwrap();
    let kinds: Vec<&str> = log.iter().map(|e| e.event.name()).collect();
    let at = kinds
        .iter()
        .position(|k| *k == "context_compacted")
        .unwrap();
    assert_eq!(kinds[at + 1..], ["run_ended"], "no model call after it");
    assert_eq!(report.state.usage.total_tokens(), 600);
}

/// [`Paid`], counting how often it was asked.
struct PaidCounted(std::sync::atomic::AtomicUsize);

#[async_trait]
impl agent_context::Summarizer for PaidCounted {
    async fn summarize(&self, history: &[Entry], prompt: &Prompt) -> agent_context::Summarized {
        self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Paid.summarize(history, prompt).await
    }
}

/// A summary whose request alone would pass what is left of the budget is not asked for:
/// the summary is made from the log, at no cost, and the run goes on.
#[tokio::test]
async fn a_summary_the_budget_cannot_pay_for_is_made_from_the_log() {
    let s = setup();
    // Each call's prompt counted at 12,000 tokens by the provider; no result is masked, so
    // the prompt only grows until it is compacted.
    let turns: Vec<Value> = paged_reads(&s, 12)
        .into_iter()
        .map(|mut turn| {
            turn["usage"] = json!({"input_tokens": 12_000, "output_tokens": 10});
            turn
        })
        .collect();
    let window = agent_context::ContextConfig {
        context_window: 6_000,
        recent_result_turns: 100,
        unmasked_result_chars: 1_000_000,
        ..agent_context::ContextConfig::default()
    };
    let run = |budget: Budget| {
        let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
        let summarizer = Arc::new(PaidCounted(Default::default()));
        let rt = s
            .runtime(json!({ "turns": turns }), Arc::clone(&store), vec![])
            .with_context(window.clone())
            .with_summarizer(Arc::clone(&summarizer) as Arc<dyn agent_context::Summarizer>);
        async move {
            let report = rt
                .start(
                    RunRequest::new("run-b", "read the big file", budget),
                    CancellationToken::new(),
                )
                .await
                .unwrap();
            let log = store.load("run-b").unwrap();
            let asked = summarizer.0.load(std::sync::atomic::Ordering::Relaxed);
            (report, log, asked)
        }
    };
    // With no budget, the model is asked for the summary after some calls.
    let (_, log, asked) = run(Budget::default()).await;
    assert!(asked >= 1);
    let at = log
        .iter()
        .position(|e| e.event.name() == "context_compacted")
        .unwrap();
    let calls = log[..at]
        .iter()
        .filter(|e| e.event.name() == "decision_proposed")
        .count() as u64;
    // With 3,000 tokens left by then, the summary's request (the messages it would send,
    // thousands of tokens) cannot be paid for.
    let budget = Budget {
        max_tokens: Some(calls * 12_010 + 3_000),
        ..Budget::default()
    };
    let (report, log, asked) = run(budget).await;
    assert_eq!(asked, 0, "the model was not asked for the summary");
    let compacted: Vec<&Usage> = log
        .iter()
        .filter_map(|e| match &e.event {
            Event::ContextCompacted { usage, .. } => Some(usage),
            _ => None,
        })
        .collect();
    assert_eq!(compacted, [&Usage::default()], "compacted, at no cost");
    // The run went on with its compacted prompt, and stopped at the budget.
    assert_eq!(report.outcome.reason, TerminalReason::CostBudgetExceeded);
    assert_eq!(u64::from(report.state.steps), calls + 1);
}

/// A summarizer that never answers, and says when it was asked.
struct Stuck(Arc<tokio::sync::Notify>);

#[async_trait]
impl agent_context::Summarizer for Stuck {
    async fn summarize(&self, _history: &[Entry], _prompt: &Prompt) -> agent_context::Summarized {
        self.0.notify_one();
        std::future::pending().await
    }
}

/// A summary is a model call like the others: cancelling the run stops the wait for it.
#[tokio::test]
async fn a_run_waiting_for_its_summary_can_be_cancelled() {
    let s = setup();
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let asked = Arc::new(tokio::sync::Notify::new());
    let rt = summarizing(&s, &store, Arc::new(Stuck(Arc::clone(&asked))));
    let cancel = CancellationToken::new();
    let canceller = cancel.clone();
    let run = rt.start(
        RunRequest::new("run-s", "read the big file", Budget::default()),
        cancel,
    );
    let (report, ()) = tokio::join!(
        tokio::time::timeout(std::time::Duration::from_secs(60), run),
        async move {
            asked.notified().await;
            canceller.cancel();
        }
    );
    let report = report.expect("the run stopped when cancelled").unwrap();
    assert_eq!(report.outcome.reason, TerminalReason::Cancelled);
    let log = store.load("run-s").unwrap();
    assert_eq!(log.last().unwrap().event.name(), "run_ended");
}

/// A store that counts the reads of a run's log.
struct CountedReads {
    inner: MemoryStore,
    reads: std::sync::atomic::AtomicUsize,
}

impl Store for CountedReads {
    fn append(&self, run_id: &str, expected: u64, entries: &[Entry]) -> Result<u64, StoreError> {
        self.inner.append(run_id, expected, entries)
    }
    fn load(&self, run_id: &str) -> Result<Vec<Entry>, StoreError> {
        self.reads
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
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

/// A summarizer that records the history it was given; `reads` says whether it wants it.
struct Seen {
    reads: bool,
    histories: Mutex<Vec<Vec<&'static str>>>,
}

#[async_trait]
impl agent_context::Summarizer for Seen {
    async fn summarize(&self, history: &[Entry], _prompt: &Prompt) -> agent_context::Summarized {
        let names = history.iter().map(|e| e.event.name()).collect();
        self.histories.lock().unwrap().push(names);
        Ok("short".to_owned()).into()
    }
    fn reads_history(&self) -> bool {
        self.reads
    }
}

/// Compacting a long run: the extractive summary comes from what the projection kept, so
/// the log is never read back; a summarizer that reads the history gets the log since the
/// last compaction, and one that does not gets none (and no read).
#[tokio::test]
async fn compacting_reads_the_log_back_only_for_a_summarizer_that_reads_it() {
    let s = setup();
    let script = || json!({ "turns": paged_reads(&s, 16) });
    let context = || agent_context::ContextConfig {
        context_window: 6_000,
        unmasked_result_chars: 0,
        ..agent_context::ContextConfig::default()
    };
    let mut reads_of = Vec::new();
    for summarizer in [
        None,
        Some(Arc::new(Seen {
            reads: true,
            histories: Mutex::default(),
        })),
        Some(Arc::new(Seen {
            reads: false,
            histories: Mutex::default(),
        })),
    ] {
        let store = Arc::new(CountedReads {
            inner: MemoryStore::new(),
            reads: std::sync::atomic::AtomicUsize::new(0),
        });
        let mut rt = s
            .runtime(script(), Arc::clone(&store) as Arc<dyn Store>, vec![])
            .with_context(context());
        if let Some(summarizer) = &summarizer {
            rt = rt.with_summarizer(Arc::clone(summarizer) as Arc<dyn agent_context::Summarizer>);
        }
        let report = rt
            .start(
                RunRequest::new("run-c", "read the big file", Budget::default()),
                CancellationToken::new(),
            )
            .await
            .unwrap();
        assert_eq!(report.outcome.reason, TerminalReason::Completed);
        let reads = store.reads.load(std::sync::atomic::Ordering::Relaxed);
        let log = store.inner.load("run-c").unwrap();
        let compactions: Vec<&Entry> = log
            .iter()
            .filter(|e| matches!(e.event, Event::ContextCompacted { .. }))
            .collect();
        assert!(compactions.len() >= 2, "{}", compactions.len());
        match &summarizer {
            None => {
                // The summary is the one the whole log makes, as ever.
                let Event::ContextCompacted { summary, .. } = &compactions[1].event else {
                    unreachable!()
                };
                let from = usize::try_from(compactions[0].version).unwrap() - 1;
                let through = usize::try_from(compactions[1].version).unwrap() - 1;
                assert_eq!(*summary, agent_context::extract(&log[from..through], 6_000));
            }
            Some(seen) => {
                let histories = seen.histories.lock().unwrap();
                assert_eq!(histories.len(), compactions.len());
                if seen.reads {
                    assert_eq!(histories[0][0], "run_started");
                    assert_eq!(histories[1][0], "context_compacted", "since the last one");
                    assert!(histories[1].len() > 4, "{:?}", histories[1]);
                } else {
                    assert!(histories.iter().all(Vec::is_empty), "{histories:?}");
                }
            }
        }
        reads_of.push(reads);
    }
    assert_eq!(reads_of[0], 0, "the extractive summary reads no log back");
    assert_eq!(
        reads_of[2], 0,
        "nor does a summarizer that does not read it"
    );
    assert!(reads_of[1] >= 2, "one read a compaction: {reads_of:?}");
}

/// A script of `reads` calls reading `big.txt` (written into the workspace, 200 lines) a
/// page further each time, then a final answer.
/// A run of twelve [`paged_reads`] in a [`small_window`], compacted by `summarizer`.
fn summarizing(
    s: &Setup,
    store: &Arc<dyn Store>,
    summarizer: Arc<dyn agent_context::Summarizer>,
) -> Runtime {
    s.runtime(
        json!({ "turns": paged_reads(s, 12) }),
        Arc::clone(store),
        vec![],
    )
    .with_context(small_window())
    .with_summarizer(summarizer)
}

/// A window of 6,000 tokens, each older result masked at once: a run of [`paged_reads`]
/// is compacted within a few turns.
pub(crate) fn small_window() -> agent_context::ContextConfig {
    agent_context::ContextConfig {
        context_window: 6_000,
        unmasked_result_chars: 0,
        ..agent_context::ContextConfig::default()
    }
}

fn paged_reads(s: &Setup, reads: usize) -> Vec<Value> {
    std::fs::write(
        s.dir.path().join("ws/big.txt"),
        "a line of the big file\n".repeat(200),
    )
    .unwrap();
    let mut turns: Vec<Value> = (0..reads)
        .map(|i| {
            json!({"tool_calls": [{"id": format!("c{i}"), "name": "read_file",
            "arguments": {"path": "big.txt", "offset": i + 1}}]})
        })
        .collect();
    turns.push(json!({"final": "done"}));
    turns
}
