//! The token and cost budgets, checked before a model call with the least its prompt will
//! use: a call certain to pass one is not made.

use std::sync::atomic::{AtomicU32, Ordering};

use agent_tools::builtin::Delegate;

use agent_providers::SpendLimit;

use super::*;

/// The script, priced: a prompt token costs at least `least_per_token` dollars.
struct Metered {
    inner: ScriptModel,
    /// The model's name.
    name: &'static str,
    calls: AtomicU32,
    least_per_token: f64,
    /// The output limit each call was given.
    caps: Mutex<Vec<Option<u32>>>,
    /// What each call was told it may use, attempts included.
    limits: Mutex<Vec<Option<SpendLimit>>>,
}

#[async_trait]
impl Model for Metered {
    fn provider(&self) -> &str {
        "script"
    }
    fn model(&self) -> &str {
        self.name
    }
    fn knows_cost(&self) -> bool {
        true
    }
    fn least_cost(&self, input_tokens: u64) -> f64 {
        input_tokens as f64 * self.least_per_token
    }
    /// Output at $10 a million tokens.
    fn output_tokens_for(&self, usd: f64) -> Option<u64> {
        Some((usd.max(0.0) * 100_000.0).round() as u64)
    }
    async fn decide(&self, request: ModelRequest<'_>) -> Result<ModelReply, ProviderError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        self.caps.lock().unwrap().push(request.max_output_tokens);
        self.limits.lock().unwrap().push(request.spend_limit);
        self.inner.decide(request).await
    }
}

/// What each call of these scripts uses: a prompt of 1,000 tokens, 10 written, $0.01.
fn used() -> Value {
    json!({"input_tokens": 1_000, "output_tokens": 10, "cost_usd": 0.01})
}

/// `turns` reads, then an answer.
fn reads(turns: usize) -> Value {
    let mut script: Vec<Value> = (1..=turns)
        .map(|n| {
            json!({"tool_calls": [{"id": format!("r{n}"), "name": "read_file",
                                   "arguments": {"path": "notes.txt"}}],
                   "usage": used()})
        })
        .collect();
    script.push(json!({"final": "done", "usage": used()}));
    json!({ "turns": script })
}

/// A runtime on `script` whose prompt tokens cost at least `least_per_token` dollars.
fn metered(
    s: &Setup,
    script: Value,
    extra: Vec<Arc<dyn Tool>>,
    least_per_token: f64,
) -> (Runtime, Arc<Metered>) {
    let store = Arc::new(MemoryStore::new());
    metered_on(s, store, "metered", script, extra, least_per_token)
}

/// [`metered`], on `store`, the model named `name`.
fn metered_on(
    s: &Setup,
    store: Arc<dyn Store>,
    name: &'static str,
    script: Value,
    extra: Vec<Arc<dyn Tool>>,
    least_per_token: f64,
) -> (Runtime, Arc<Metered>) {
    let model = Arc::new(Metered {
        inner: ScriptModel::from_json(&script.to_string()).unwrap(),
        name,
        calls: AtomicU32::new(0),
        least_per_token,
        caps: Mutex::default(),
        limits: Mutex::default(),
    });
    let mut gateway =
        Gateway::with_builtins(Workspace::new(s.dir.path().join("ws")).unwrap()).unwrap();
    for tool in extra {
        gateway.register(tool).unwrap();
    }
    let rt = Runtime::new(
        Arc::clone(&model) as Arc<dyn Model>,
        Arc::new(gateway),
        store,
    );
    (rt, model)
}

async fn run(rt: &Runtime, budget: Budget) -> agent_runtime::Report {
    rt.start(
        RunRequest::new("run-m", "g", budget),
        CancellationToken::new(),
    )
    .await
    .unwrap()
}

#[tokio::test]
async fn a_call_whose_prompt_alone_passes_the_token_budget_is_not_made() {
    let s = setup();
    let (rt, model) = metered(&s, reads(5), vec![], 0.000_004);
    let report = run(
        &rt,
        Budget {
            max_tokens: Some(2_500),
            ..Budget::default()
        },
    )
    .await;
    assert_eq!(report.outcome.reason, TerminalReason::CostBudgetExceeded);
    // Spent alone, 2,020 tokens would let a third call start, and end at 3,030.
    assert_eq!(model.calls.load(Ordering::SeqCst), 2);
    assert_eq!(report.state.usage.total_tokens(), 2_020);
    assert!(
        report
            .outcome
            .message
            .contains("2020 tokens used, and the next call's prompt alone has at least 1000"),
        "{}",
        report.outcome.message
    );
    // Each call may write what is left once its prompt is paid for: 2,500 at first (no
    // count of a prompt yet), then 2,500 - 1,010 - 1,000.
    assert_eq!(*model.caps.lock().unwrap(), [Some(2_500), Some(490)]);
    // And all its attempts together what is left, each using the prompt at the least.
    let limit = |tokens, least| {
        Some(SpendLimit {
            tokens: Some(tokens),
            usd: None,
            least_input_tokens: least,
        })
    };
    assert_eq!(
        *model.limits.lock().unwrap(),
        [limit(2_500, 0), limit(1_490, 1_000)]
    );
    // A call that fits exactly is made.
    let (rt, model) = metered(&s, reads(5), vec![], 0.000_004);
    let report = run(
        &rt,
        Budget {
            max_tokens: Some(3_020),
            ..Budget::default()
        },
    )
    .await;
    assert_eq!(report.outcome.reason, TerminalReason::CostBudgetExceeded);
    assert_eq!(model.calls.load(Ordering::SeqCst), 3);
}

/// Counts with o200k, and how many texts it was asked to count.
#[derive(Default)]
struct Counting(std::sync::atomic::AtomicUsize);

impl agent_context::TokenCounter for Counting {
    fn count(&self, text: &str) -> usize {
        self.0.fetch_add(1, Ordering::SeqCst);
        agent_context::Tiktoken.count(text)
    }
}

/// A run's first call, whose prompt no provider has counted, is checked with the runtime's
/// own count (half of o200k's): a goal that alone passes the token budget is not sent. A
/// run whose prompt's bytes cannot pass its budgets counts nothing for it.
#[tokio::test]
async fn a_first_call_whose_goal_alone_passes_the_budget_is_not_made() {
    let s = setup();
    // About 74 KB, some 17,000 tokens by o200k's count.
    let goal = "the quarterly figures, read out word by word. ".repeat(1_600);
    let start = |max_tokens: u64| {
        let (rt, model) = metered(&s, reads(1), vec![], 0.000_004);
        let counter = Arc::new(Counting::default());
        let rt = rt.with_token_counter(Arc::clone(&counter) as _);
        let budget = Budget {
            max_tokens: Some(max_tokens),
            ..Budget::default()
        };
        let goal = goal.clone();
        async move {
            let report = rt
                .start(
                    RunRequest::new("run-m", &goal, budget),
                    CancellationToken::new(),
                )
                .await
                .unwrap();
            (report, model, counter)
        }
    };
    let (report, model, counter) = start(5_000).await;
    assert_eq!(report.outcome.reason, TerminalReason::CostBudgetExceeded);
    assert_eq!(model.calls.load(Ordering::SeqCst), 0, "nothing was sent");
    assert!(
        report
            .outcome
            .message
            .contains("0 tokens used, and the next call's prompt alone has at least 8"),
        "{}",
        report.outcome.message
    );
    assert!(counter.0.load(Ordering::SeqCst) > 0);
    // Its bytes fit the budget: nothing is counted, and the run goes on.
    let (report, model, counter) = start(1_000_000).await;
    assert_eq!(report.outcome.reason, TerminalReason::Completed);
    assert_eq!(model.calls.load(Ordering::SeqCst), 2);
    assert_eq!(counter.0.load(Ordering::SeqCst), 0, "no token was counted");
}

#[tokio::test]
async fn a_call_whose_prompt_alone_passes_the_cost_budget_is_not_made() {
    let s = setup();
    let (rt, model) = metered(&s, reads(5), vec![], 0.000_004);
    let report = run(
        &rt,
        Budget {
            max_cost_usd: Some(0.023),
            ..Budget::default()
        },
    )
    .await;
    assert_eq!(report.outcome.reason, TerminalReason::CostBudgetExceeded);
    // $0.02 spent: a third call would start below $0.023, at $0.004 at the least.
    assert_eq!(model.calls.load(Ordering::SeqCst), 2);
    assert!(
        report
            .outcome
            .message
            .contains("$0.0200 spent, and the next call's prompt alone costs at least $0.0040"),
        "{}",
        report.outcome.message
    );
    // $0.023 at $10 a million, then $0.023 - $0.01 - $0.004.
    assert_eq!(*model.caps.lock().unwrap(), [Some(2_300), Some(900)]);
    // Without a budget that limits them, calls are not limited.
    let (rt, model) = metered(&s, reads(1), vec![], 0.000_004);
    run(&rt, Budget::default()).await;
    assert_eq!(*model.caps.lock().unwrap(), [None, None]);
}

/// A count the provider gave in an earlier invocation is a floor of this one's prompts when
/// they are made as that one's were: a call approved in another process is not made when
/// its prompt alone would pass the budget. Continued with another model (whose tokenizer
/// may count fewer), with other tools, or in a fork, the count is no floor: the runtime's
/// own, half of o200k's, is (less than the 1,000 the script says), and the call is made.
#[tokio::test]
async fn a_count_from_an_earlier_invocation_holds_for_the_same_model_and_tools_only() {
    let s = setup();
    let script = json!({"turns": [
        {"tool_calls": [{"id": "s1", "name": "save"}], "usage": used()},
        {"final": "saved", "usage": used()}
    ]});
    // 1,010 used: room for a prompt of 890, not of 1,000.
    let budget = Budget {
        max_tokens: Some(1_900),
        ..Budget::default()
    };
    let other_tool: Arc<dyn Tool> = Arc::new(Dump);
    for (name, more_tools, made) in [
        ("metered", vec![], false),
        ("another", vec![], true),
        ("metered", vec![other_tool], true),
    ] {
        let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
        let (rt, model) = metered_on(
            &s,
            Arc::clone(&store),
            "metered",
            script.clone(),
            vec![Arc::new(Save)],
            0.000_004,
        );
        let paused = run(&rt, budget.clone()).await;
        assert_eq!(paused.outcome.reason, TerminalReason::ApprovalRequired);
        assert_eq!(model.calls.load(Ordering::SeqCst), 1);
        // Another invocation: a runtime of its own on the same store.
        let mut tools: Vec<Arc<dyn Tool>> = vec![Arc::new(Save)];
        tools.extend(more_tools);
        let (again, model) = metered_on(&s, store, name, script.clone(), tools, 0.000_004);
        let report = again
            .approve("run-m", vec![], CancellationToken::new())
            .await
            .unwrap();
        let (reason, calls) = if made {
            (TerminalReason::Completed, 1)
        } else {
            (TerminalReason::CostBudgetExceeded, 0)
        };
        assert_eq!(
            report.outcome.reason, reason,
            "{name}: {}",
            report.outcome.message
        );
        assert_eq!(model.calls.load(Ordering::SeqCst), calls, "{name}");
    }
    // A fork's log begins with its parent's counts, made under the parent's settings.
    let (rt, model) = metered(&s, reads(2), vec![], 0.000_004);
    run(&rt, Budget::default()).await;
    assert_eq!(model.calls.load(Ordering::SeqCst), 3);
    let fork = rt
        .fork("run-m", 2, "fork", budget, CancellationToken::new())
        .await
        .unwrap();
    // Its call 2 is made (and passes the budget, which the parent's call 1 used 1,010 of).
    assert_eq!(model.calls.load(Ordering::SeqCst), 4);
    assert_eq!(fork.outcome.reason, TerminalReason::CostBudgetExceeded);
}

/// A run continued from its log asks for its next call before any commit: the call is
/// checked all the same, against the count the log holds, when this invocation makes its
/// prompts as the run's did (and against half of o200k's count otherwise).
#[tokio::test]
async fn the_first_call_of_a_continued_run_is_checked_before_it_is_made() {
    let s = setup();
    // 1,010 used: room for a prompt of 890, not of 1,000.
    let budget = Budget {
        max_tokens: Some(1_900),
        ..Budget::default()
    };
    // A run stopped before its second call, its end then taken off: a run whose process
    // died there.
    let (rt, _) = metered(&s, reads(3), vec![], 0.000_004);
    let stopped = run(&rt, budget).await;
    assert_eq!(stopped.outcome.reason, TerminalReason::CostBudgetExceeded);
    let mut log = rt.store().load("run-m").unwrap();
    assert!(matches!(
        log.pop().map(|e| e.event),
        Some(Event::RunEnded { .. })
    ));
    for (name, calls) in [("metered", 0), ("another", 1)] {
        let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
        store.append("run-m", 0, &log).unwrap();
        let (again, model) = metered_on(&s, store, name, reads(3), vec![], 0.000_004);
        let report = again
            .resume("run-m", CancellationToken::new())
            .await
            .unwrap();
        assert_eq!(report.outcome.reason, TerminalReason::CostBudgetExceeded);
        assert_eq!(model.calls.load(Ordering::SeqCst), calls, "{name}");
        if calls == 0 {
            assert!(
                report.outcome.message.contains("so it was not made"),
                "{}",
                report.outcome.message
            );
        }
    }
}

/// A sub-agent's calls are checked the same way, against what its parent has left, with
/// the least its prompt costs as the parent's model knows it.
#[tokio::test]
async fn a_sub_agent_s_call_whose_prompt_alone_passes_what_is_left_is_not_made() {
    let s = setup();
    // A child's prompt is small: 200 tokens a call, at $0.00002 at the least.
    let small = json!({"input_tokens": 200, "output_tokens": 10, "cost_usd": 0.01});
    let reads: Vec<Value> = (1..=3)
        .map(|n| {
            json!({"tool_calls": [{"id": format!("c{n}"), "name": "read_file",
                                   "arguments": {"path": "notes.txt", "offset": n}}],
                   "usage": small})
        })
        .collect();
    let script = json!({
        "turns": [
            {"tool_calls": [{"id": "d1", "name": "delegate_read",
                             "arguments": {"goal": "read the notes"}}], "usage": used()},
            {"final": "read", "usage": used()}
        ],
        "agents": {"read the notes": {"turns": reads}}
    });
    let delegates = Delegate::both()
        .into_iter()
        .map(|tool| Arc::new(tool) as Arc<dyn Tool>)
        .collect();
    let (rt, model) = metered(&s, script, delegates, 0.000_02);
    // $0.01 for the parent's call leaves $0.023: the child's second call starts at $0.01
    // spent with $0.004 at the least to come; its third, at $0.02, would pass what is left.
    let report = run(
        &rt,
        Budget {
            max_cost_usd: Some(0.033),
            ..Budget::default()
        },
    )
    .await;
    assert_eq!(report.outcome.reason, TerminalReason::CostBudgetExceeded);
    assert_eq!(
        model.calls.load(Ordering::SeqCst),
        3,
        "the parent's call and two of the child's"
    );
    // And each call may write what is left: the parent's $0.033, the child's $0.023, then
    // $0.023 - $0.01 - $0.004.
    assert_eq!(
        *model.caps.lock().unwrap(),
        [Some(3_300), Some(2_300), Some(900)]
    );
}
