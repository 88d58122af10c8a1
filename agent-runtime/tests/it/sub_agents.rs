//! Sub-agents: child runs that answer `delegate` calls, with nested budgets, folded logs,
//! and cancellation that reaches them.

use agent_tools::builtin::Delegate;

use super::*;

fn gateway(s: &Setup, allow: &[&str]) -> Gateway {
    let mut policy = agent_tools::Policy::new();
    for pattern in allow {
        policy.add(agent_tools::Action::Allow, pattern).unwrap();
    }
    let mut gateway = Gateway::with_builtins(Workspace::new(s.dir.path().join("ws")).unwrap())
        .unwrap()
        .with_policy(policy);
    for tool in Delegate::both() {
        gateway.register(Arc::new(tool)).unwrap();
    }
    gateway
}

fn runtime(s: &Setup, model: Arc<dyn Model>, store: Arc<dyn Store>, allow: &[&str]) -> Runtime {
    Runtime::new(model, Arc::new(gateway(s, allow)), store)
}

fn script(value: Value) -> Arc<dyn Model> {
    Arc::new(ScriptModel::from_json(&value.to_string()).unwrap())
}

fn cost(usd: f64) -> Value {
    json!({"input_tokens": 100, "output_tokens": 10, "cost_usd": usd})
}

fn count(log: &[Entry], name: &str) -> usize {
    log.iter().filter(|e| e.event.name() == name).count()
}

/// The call that asked for a sub-agent is paid for before the sub-agent starts: what is
/// left for it is the budget less that call too (its reply is committed only with its
/// calls' results, after the sub-agent ran).
#[tokio::test]
async fn what_is_left_for_a_sub_agent_counts_the_call_that_asked_for_it() {
    let s = setup();
    let store: Arc<dyn Store> = Arc::new(MemoryStore::default());
    let reads: Vec<Value> = (1..=4)
        .map(|n| {
            json!({"tool_calls": [{"id": format!("c{n}"), "name": "read_file",
                "arguments": {"path": "notes.txt", "offset": n}}], "usage": cost(0.1)})
        })
        .collect();
    let model = script(json!({
        "turns": [
            {"tool_calls": [{"id": "d1", "name": "delegate_read",
                "arguments": {"goal": "read the notes"}}], "usage": cost(0.1)},
            {"final": "never asked: the budget is spent", "usage": cost(0.1)}
        ],
        "agents": {"read the notes": {"turns": reads}}
    }));
    let rt = runtime(&s, model, Arc::clone(&store), &[]);
    let budget = Budget {
        max_cost_usd: Some(0.25),
        ..Budget::default()
    };
    let report = rt
        .start(
            RunRequest::new("parent", "read", budget),
            CancellationToken::new(),
        )
        .await
        .unwrap();
    assert_eq!(report.outcome.reason, TerminalReason::CostBudgetExceeded);
    let child = store
        .load(&agent_runtime::sub_agent_run_id(
            "parent",
            1,
            &CallId::from("d1"),
        ))
        .unwrap();
    assert_eq!(
        count(&child, "decision_proposed"),
        2,
        "$0.15 was left: the child stops at $0.20, not at $0.30"
    );
    assert!(
        (report.state.usage.cost_usd - 0.3).abs() < 1e-9,
        "{:?}",
        report.state.usage
    );
}

#[tokio::test]
async fn two_reading_sub_agents_share_the_parents_cost_budget_and_the_one_past_it_is_cancelled() {
    let s = setup();
    let store: Arc<dyn Store> = Arc::new(SledStore::open(s.dir.path().join("store")).unwrap());
    let model = script(json!({
        "turns": [
            {"tool_calls": [
                {"id": "d1", "name": "delegate_read", "arguments": {"goal": "count the apples"}},
                {"id": "d2", "name": "delegate_read", "arguments": {"goal": "count the pears"}}
            ], "usage": cost(0.1)},
            {"final": "never asked: the budget is spent", "usage": cost(0.1)}
        ],
        "agents": {
            "count the apples": {"turns": [{"final": "3 apples", "usage": cost(0.1)}]},
            "count the pears": {"turns": [
                {"tool_calls": [{"id": "r1", "name": "read_file", "arguments": {"path": "notes.txt"}}], "usage": cost(0.5)},
                {"tool_calls": [{"id": "r2", "name": "read_file", "arguments": {"path": "notes.txt"}}], "usage": cost(0.5)},
                {"final": "2 pears", "usage": cost(0.1)}
            ]}
        }
    }));
    let rt = runtime(&s, model, Arc::clone(&store), &[]);
    let budget = Budget {
        max_cost_usd: Some(1.0),
        ..Budget::default()
    };
    let report = rt
        .start(
            RunRequest::new("parent", "count the fruit", budget),
            CancellationToken::new(),
        )
        .await
        .unwrap();
    assert_eq!(
        report.outcome.reason,
        TerminalReason::CostBudgetExceeded,
        "{:?}",
        report.outcome
    );
    // The children's model calls count: 0.1 (parent) + 0.1 (apples) + 1.0 (pears).
    assert!(
        (report.state.usage.cost_usd - 1.2).abs() < 1e-9,
        "{:?}",
        report.state.usage
    );
    assert_eq!(report.state.steps, 1, "the parent was not asked again");

    let apples_id = agent_runtime::sub_agent_run_id("parent", 1, &CallId::from("d1"));
    let pears_id = agent_runtime::sub_agent_run_id("parent", 1, &CallId::from("d2"));
    let parent = store.load("parent").unwrap();
    let apples = store.load(&apples_id).unwrap();
    let pears = store.load(&pears_id).unwrap();
    // Every log folds, and each child ended once.
    for log in [&parent, &apples, &pears] {
        RunState::fold(log).unwrap();
    }
    let ended = |log: &[Entry]| RunState::fold(log).unwrap().outcome().unwrap().reason;
    assert_eq!(ended(&apples), TerminalReason::Completed);
    assert_eq!(ended(&pears), TerminalReason::Cancelled);
    assert_eq!(count(&pears, "run_ended"), 1);
    // The parent recorded each child and its usage, and got each one's result by call id.
    let children: Vec<(String, String)> = parent
        .iter()
        .filter_map(|e| match &e.event {
            Event::SubAgentFinished {
                call_id, run_id, ..
            } => Some((call_id.to_string(), run_id.clone())),
            _ => None,
        })
        .collect();
    assert_eq!(
        children,
        [
            ("d1".to_owned(), apples_id.clone()),
            ("d2".to_owned(), pears_id.clone())
        ]
    );
    let results: Vec<&ToolResult> = parent
        .iter()
        .filter_map(|e| match &e.event {
            Event::ToolFinished { result, .. } => Some(result),
            _ => None,
        })
        .collect();
    assert_eq!(results[0].content(), "3 apples");
    assert_eq!(results[1].error_kind(), Some(ErrorKind::Cancelled));
    // A reading sub-agent had the parent's read tools only, and a link to its call.
    let Event::RunStarted { manifest, goal, .. } = &pears[0].event else {
        panic!()
    };
    assert_eq!(goal, "count the pears");
    let tools: Vec<&str> = manifest.tools.iter().map(|t| t.name.as_str()).collect();
    assert!(
        tools.contains(&"read_file") && !tools.contains(&"write_file"),
        "{tools:?}"
    );
    assert!(
        !tools.iter().any(|t| t.starts_with("delegate")),
        "{tools:?}"
    );
    let link = manifest.parent.as_deref().unwrap();
    assert_eq!(
        (link.run_id.as_str(), link.turn, link.call_id.as_str()),
        ("parent", 1, "d2")
    );
}

#[tokio::test]
async fn the_parents_prompt_holds_the_childs_answer_as_the_calls_result() {
    let s = setup();
    let store: Arc<dyn Store> = Arc::new(MemoryStore::default());
    let model = script(json!({
        "turns": [
            {"tool_calls": [{"id": "d1", "name": "delegate", "arguments": {"goal": "write the summary", "tools": ["read_file", "write_file"], "max_steps": 4}}]},
            {"final": "the summary is written"}
        ],
        "agents": {
            "write the summary": {"turns": [
                {"tool_calls": [{"id": "r1", "name": "read_file", "arguments": {"path": "notes.txt"}}]},
                {"tool_calls": [{"id": "w1", "name": "write_file", "arguments": {"path": "summary.txt", "content": "noon\n"}}]},
                {"final": "summary.txt says: noon"}
            ]}
        }
    }));
    let rt = runtime(&s, model, Arc::clone(&store), &["delegate", "write_file"]);
    let report = rt
        .start(
            RunRequest::new("parent", "summarize the notes", Budget::default()),
            CancellationToken::new(),
        )
        .await
        .unwrap();
    assert_eq!(
        report.outcome.reason,
        TerminalReason::Completed,
        "{:?}",
        report.outcome
    );
    assert_eq!(
        std::fs::read_to_string(s.dir.path().join("ws/summary.txt")).unwrap(),
        "noon\n"
    );
    let child_id = agent_runtime::sub_agent_run_id("parent", 1, &CallId::from("d1"));
    let child = store.load(&child_id).unwrap();
    let Event::RunStarted { manifest, .. } = &child[0].event else {
        panic!()
    };
    let tools: Vec<&str> = manifest.tools.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(
        tools,
        ["read_file", "write_file"],
        "only the tools the call named"
    );
    assert_eq!(manifest.budget.max_steps, 4);
    // The parent's prompt before its last call: the child's answer is the call's result.
    let log = store.load("parent").unwrap();
    let before_last = before_model_call(&log, 2).unwrap();
    let prompt = rt.projector(&log[..before_last]).prompt().clone();
    insta::assert_snapshot!(
        "parent_with_a_sub_agents_result",
        agent_context::testing::snapshot_text(&prompt)
    );
}

/// A model that cancels the run the moment the child makes its first call, which takes
/// long: cancelling the parent must reach the child.
struct CancelsOnChild {
    inner: ScriptModel,
    cancel: CancellationToken,
}

#[async_trait]
impl Model for CancelsOnChild {
    fn provider(&self) -> &str {
        "script"
    }
    fn model(&self) -> &str {
        "cancels"
    }
    async fn decide(&self, request: ModelRequest<'_>) -> Result<ModelReply, ProviderError> {
        let first = request
            .prompt
            .messages
            .first()
            .and_then(|m| m.parts.first());
        if matches!(first, Some(Part::Text { text }) if text == "take your time") {
            self.cancel.cancel();
        }
        self.inner.decide(request).await
    }
}

#[tokio::test]
async fn cancelling_the_parent_cancels_its_sub_agent() {
    let s = setup();
    let store: Arc<dyn Store> = Arc::new(MemoryStore::default());
    let cancel = CancellationToken::new();
    let inner = ScriptModel::from_json(
        &json!({
            "turns": [
                {"tool_calls": [{"id": "d1", "name": "delegate_read", "arguments": {"goal": "take your time"}}]},
                {"final": "never asked"}
            ],
            "agents": {"take your time": {"turns": [{"final": "late", "delay_ms": 60000}]}}
        })
        .to_string(),
    )
    .unwrap();
    let model = Arc::new(CancelsOnChild {
        inner,
        cancel: cancel.clone(),
    });
    let rt = runtime(&s, model, Arc::clone(&store), &[]);
    let report = rt
        .start(RunRequest::new("parent", "wait", Budget::default()), cancel)
        .await
        .unwrap();
    assert_eq!(report.outcome.reason, TerminalReason::Cancelled);
    let child_id = agent_runtime::sub_agent_run_id("parent", 1, &CallId::from("d1"));
    let child = store.load(&child_id).unwrap();
    let state = RunState::fold(&child).unwrap();
    assert_eq!(state.outcome().unwrap().reason, TerminalReason::Cancelled);
    assert_eq!(state.steps, 0, "its model call never answered");
}

fn approval_script() -> Arc<dyn Model> {
    script(json!({
        "turns": [
            {"tool_calls": [{"id": "d1", "name": "delegate", "arguments": {"goal": "save the note"}}]},
            {"final": "the child is done"}
        ],
        "agents": {"save the note": {"turns": [
            {"tool_calls": [{"id": "w1", "name": "write_file", "arguments": {"path": "note.txt", "content": "hi\n"}}]},
            {"final": "saved, or told why not"}
        ]}}
    }))
}

/// Run `parent` of [`approval_script`], which may delegate (writes ask, in the child as
/// anywhere): its setup, store and runtime, and the report of its start.
async fn paused_on_its_child() -> (Setup, Arc<dyn Store>, Runtime, agent_runtime::Report) {
    let s = setup();
    let store: Arc<dyn Store> = Arc::new(MemoryStore::default());
    let rt = runtime(&s, approval_script(), Arc::clone(&store), &["delegate"]);
    let report = rt
        .start(
            RunRequest::new("parent", "note it", Budget::default()),
            CancellationToken::new(),
        )
        .await
        .unwrap();
    (s, store, rt, report)
}

/// The parent of [`approval_script`] completed, and its child's write was not made.
fn completed_without_the_note(s: &Setup, report: &agent_runtime::Report) {
    assert_eq!(
        report.outcome.reason,
        TerminalReason::Completed,
        "{:?}",
        report.outcome
    );
    assert!(!s.dir.path().join("ws/note.txt").exists());
}

#[tokio::test]
async fn a_childs_approval_surfaces_on_the_parent_and_is_answered_there() {
    let (s, store, rt, report) = paused_on_its_child().await;
    assert_eq!(
        report.outcome.reason,
        TerminalReason::ApprovalRequired,
        "{:?}",
        report.outcome
    );
    assert_eq!(report.outcome.pending.len(), 1);
    let pending = &report.outcome.pending[0];
    assert_eq!(
        (pending.call_id.as_str(), pending.tool.as_str()),
        ("w1", "write_file")
    );
    assert!(
        pending.why.starts_with("sub-agent of call d1:"),
        "{}",
        pending.why
    );
    assert!(!s.dir.path().join("ws/note.txt").exists());
    // Where it stands says the same, without driving anything.
    let standing = rt.standing("parent").await.unwrap().unwrap();
    assert_eq!(standing.outcome, report.outcome);
    // A call that is not pending is refused, naming those that are.
    let err = rt
        .approve(
            "parent",
            vec![CallId::from("nope")],
            CancellationToken::new(),
        )
        .await
        .unwrap_err();
    assert!(err.to_string().contains("pending: w1"), "{err}");

    let report = rt
        .approve("parent", vec![CallId::from("w1")], CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(
        report.outcome.reason,
        TerminalReason::Completed,
        "{:?}",
        report.outcome
    );
    assert_eq!(
        std::fs::read_to_string(s.dir.path().join("ws/note.txt")).unwrap(),
        "hi\n"
    );
    let child_id = agent_runtime::sub_agent_run_id("parent", 1, &CallId::from("d1"));
    let child = store.load(&child_id).unwrap();
    assert_eq!(count(&child, "approval_granted"), 1);
    assert_eq!(count(&child, "tool_finished"), 1, "the write ran once");
    let parent = store.load("parent").unwrap();
    assert_eq!(count(&parent, "effect_resolved"), 1);
    let result = parent.iter().rev().find_map(|e| match &e.event {
        Event::ToolFinished { result, .. } => Some(result.content().to_owned()),
        _ => None,
    });
    assert_eq!(result.as_deref(), Some("saved, or told why not"));
}

#[tokio::test]
async fn a_childs_call_denied_through_the_parent_is_told_to_the_child() {
    let (s, store, rt, _) = paused_on_its_child().await;
    let report = rt
        .deny("parent", vec![], "not now".into(), CancellationToken::new())
        .await
        .unwrap();
    completed_without_the_note(&s, &report);
    let child_id = agent_runtime::sub_agent_run_id("parent", 1, &CallId::from("d1"));
    let child = store.load(&child_id).unwrap();
    assert_eq!(count(&child, "approval_denied"), 1);
    let denied = child.iter().find_map(|e| match &e.event {
        Event::CallRejected { result, .. } => Some(result.content().to_owned()),
        _ => None,
    });
    assert!(denied.unwrap().contains("not now"));
}

/// An answer recorded for a run something else drives on (a worker of the queue) reaches a
/// sub-agent's approval through its parent as `deny` would, and drives nothing: the run
/// goes on from it when it is resumed.
#[tokio::test]
async fn a_childs_denial_is_recorded_through_the_parent_without_driving_it() {
    let (s, store, rt, _) = paused_on_its_child().await;
    let before = store.load("parent").unwrap().len();
    let nope = Input::ApprovalDenied {
        call_ids: vec![CallId::from("nope")],
        reason: "no".into(),
    };
    let err = rt.record_answer("parent", nope).await.unwrap_err();
    assert!(err.to_string().contains("pending: w1"), "{err}");
    let denial = Input::ApprovalDenied {
        call_ids: vec![CallId::from("w1")],
        reason: "not now".into(),
    };
    rt.record_answer("parent", denial).await.unwrap();
    let child_id = agent_runtime::sub_agent_run_id("parent", 1, &CallId::from("d1"));
    let child = store.load(&child_id).unwrap();
    assert_eq!(count(&child, "approval_denied"), 1);
    assert_eq!(
        count(&child, "decision_proposed"),
        1,
        "the child was not driven"
    );
    let parent = store.load("parent").unwrap();
    assert_eq!(
        parent.len(),
        before + 1,
        "the call marked to run again, no more"
    );
    assert_eq!(count(&parent, "effect_resolved"), 1);

    let report = rt.resume("parent", CancellationToken::new()).await.unwrap();
    completed_without_the_note(&s, &report);
    let child = store.load(&child_id).unwrap();
    let told = child.iter().find_map(|e| match &e.event {
        Event::CallRejected { result, .. } => Some(result.content().to_owned()),
        _ => None,
    });
    assert!(told.unwrap().contains("not now"));
}

#[tokio::test]
async fn cancelling_a_parent_paused_on_its_child_cancels_the_child_too() {
    let (s, store, rt, _) = paused_on_its_child().await;
    let report = rt.cancel("parent").await.unwrap();
    assert_eq!(report.outcome.reason, TerminalReason::Cancelled);
    let child_id = agent_runtime::sub_agent_run_id("parent", 1, &CallId::from("d1"));
    let child = RunState::fold(&store.load(&child_id).unwrap()).unwrap();
    assert_eq!(child.outcome().unwrap().reason, TerminalReason::Cancelled);
    assert!(!s.dir.path().join("ws/note.txt").exists());
}

/// A runtime asked to let its runs go while a sub-agent's call runs lets the child go at
/// its next step (its call finished and committed), then the parent, whose call is left in
/// flight: whoever takes the parent up continues the child, and nothing is in doubt or
/// done twice.
#[tokio::test]
async fn a_sub_agent_is_let_go_at_its_next_step_with_its_parent() {
    let s = setup();
    let store: Arc<dyn Store> = Arc::new(MemoryStore::default());
    let drain = CancellationToken::new();
    let job = Arc::new(DrainedMeanwhile {
        drain: drain.clone(),
        calls: Default::default(),
    });
    let turns = json!({
        "turns": [
            {"tool_calls": [{"id": "d1", "name": "delegate", "arguments": {"goal": "work"}}]},
            {"final": "all done"}
        ],
        "agents": {"work": {"turns": [
            {"tool_calls": [{"id": "c1", "name": "job"}]},
            {"final": "worked"}
        ]}}
    });
    // Taken up, the run continues its sub-agent without asking about it again: it was
    // allowed when it started (here by a rule the process taking it up does not have).
    let driver = |drain: Option<CancellationToken>| {
        let allow: &[&str] = if drain.is_some() {
            &["delegate", "job"]
        } else {
            &["job"]
        };
        let mut gateway = gateway(&s, allow);
        gateway.register(job.clone()).unwrap();
        let rt = Runtime::new(script(turns.clone()), Arc::new(gateway), Arc::clone(&store));
        match drain {
            Some(drain) => rt.with_drain(drain),
            None => rt,
        }
    };
    let let_go = driver(Some(drain))
        .start(
            RunRequest::new("parent", "g", Budget::default()),
            CancellationToken::new(),
        )
        .await
        .unwrap_err();
    assert!(
        matches!(&let_go, agent_runtime::RuntimeError::LetGo { run_id } if run_id == "parent"),
        "{let_go:?}"
    );
    let child_id = agent_runtime::sub_agent_run_id("parent", 1, &CallId::from("d1"));
    let child = store.load(&child_id).unwrap();
    assert!(
        matches!(&child.last().unwrap().event,
            Event::ToolFinished { result, .. } if result.content() == "done"),
        "the child's call is committed: {:?}",
        child.last()
    );
    let child_state = RunState::fold(&child).unwrap();
    assert_eq!(child_state.status, agent_core::Status::Running);
    assert!(child_state.in_doubt().is_empty());
    let parent = store.load("parent").unwrap();
    assert_eq!(parent.last().unwrap().event.name(), "effect_dispatched");
    assert_eq!(count(&parent, "tool_finished"), 0);
    // In the middle of a step, it takes no note: it would come before the call's result.
    let refused = driver(None)
        .record_note("parent", "hello")
        .await
        .unwrap_err();
    assert!(
        refused.to_string().contains("middle of a step"),
        "{refused}"
    );
    assert_eq!(store.load("parent").unwrap().len(), parent.len());
    assert_eq!(
        RunState::fold(&parent).unwrap().status,
        agent_core::Status::Running
    );

    // Taken up where a rule denies sub-agents, the call is denied, not continued.
    let copy: Arc<dyn Store> = Arc::new(MemoryStore::default());
    for id in ["parent", child_id.as_str()] {
        copy.append(id, 0, &store.load(id).unwrap()).unwrap();
    }
    let mut policy = agent_tools::Policy::new();
    policy.add(agent_tools::Action::Deny, "delegate").unwrap();
    let mut denying = gateway(&s, &[]).with_policy(policy);
    denying.register(job.clone()).unwrap();
    let report = Runtime::new(script(turns.clone()), Arc::new(denying), Arc::clone(&copy))
        .resume("parent", CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(report.outcome.answer.as_deref(), Some("all done"));
    assert_eq!(
        copy.load(&child_id).unwrap().len(),
        child.len(),
        "not continued"
    );
    assert_eq!(count(&copy.load("parent").unwrap(), "call_rejected"), 1);

    let report = driver(None)
        .resume("parent", CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(report.outcome.reason, TerminalReason::Completed);
    assert_eq!(report.outcome.answer.as_deref(), Some("all done"));
    assert_eq!(job.calls.load(std::sync::atomic::Ordering::SeqCst), 1);
    let child = store.load(&child_id).unwrap();
    assert_eq!(
        count(&child, "effect_reconciled"),
        0,
        "nothing was in doubt"
    );
    assert_eq!(count(&child, "effect_dispatched"), 1);
    let parent = store.load("parent").unwrap();
    let told = parent.iter().find_map(|e| match &e.event {
        Event::ToolFinished { result, .. } => Some(result.content().to_owned()),
        _ => None,
    });
    assert_eq!(told.as_deref(), Some("worked"));
}

/// Cancelled by a person, the child a parent waits on releases the parent: its call no
/// longer waits for a person, and the parent goes on with the child's end when resumed.
#[tokio::test]
async fn cancelling_the_child_a_parent_waits_on_lets_the_parent_go_on() {
    let (s, store, rt, _) = paused_on_its_child().await;
    let child_id = agent_runtime::sub_agent_run_id("parent", 1, &CallId::from("d1"));
    let report = rt.cancel(&child_id).await.unwrap();
    assert_eq!(report.outcome.reason, TerminalReason::Cancelled);
    assert!(rt.standing("parent").await.unwrap().is_none(), "not paused");
    let before = store.load("parent").unwrap().len();
    // Cancelling it again (it already ended) changes nothing more.
    assert!(rt.cancel(&child_id).await.is_err());
    assert_eq!(store.load("parent").unwrap().len(), before);

    let report = rt.resume("parent", CancellationToken::new()).await.unwrap();
    completed_without_the_note(&s, &report);
    let parent = store.load("parent").unwrap();
    let told = parent.iter().find_map(|e| match &e.event {
        Event::ToolFinished { result, .. } => Some(result.content().to_owned()),
        _ => None,
    });
    assert!(told.unwrap().contains("cancelled"));
}

/// A child a parent waits on, answered by its own id rather than through the parent and
/// so driven to its end, releases the parent as a cancel does: the parent goes on with
/// the child's answer, and the child does not run again.
#[tokio::test]
async fn a_child_answered_by_its_own_id_lets_the_parent_go_on() {
    let (s, store, rt, _) = paused_on_its_child().await;
    let child_id = agent_runtime::sub_agent_run_id("parent", 1, &CallId::from("d1"));
    let child = rt
        .approve(&child_id, vec![], CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(child.outcome.reason, TerminalReason::Completed);
    assert!(s.dir.path().join("ws/note.txt").exists());
    assert!(rt.standing("parent").await.unwrap().is_none(), "not paused");
    let child_entries = store.load(&child_id).unwrap().len();

    let report = rt.resume("parent", CancellationToken::new()).await.unwrap();
    assert_eq!(report.outcome.answer.as_deref(), Some("the child is done"));
    let parent = store.load("parent").unwrap();
    let told = parent.iter().find_map(|e| match &e.event {
        Event::ToolFinished { result, .. } => Some(result.content().to_owned()),
        _ => None,
    });
    assert_eq!(told.as_deref(), Some("saved, or told why not"));
    assert_eq!(store.load(&child_id).unwrap().len(), child_entries);
}

#[tokio::test]
async fn a_reading_sub_agent_is_denied_what_would_ask_a_person_and_goes_on() {
    let s = setup();
    let store: Arc<dyn Store> = Arc::new(MemoryStore::default());
    let model = script(json!({
        "turns": [
            {"tool_calls": [{"id": "d1", "name": "delegate_read", "arguments": {"goal": "peek"}}]},
            {"final": "done"}
        ],
        "agents": {"peek": {"turns": [
            {"tool_calls": [{"id": "r1", "name": "read_file", "arguments": {"path": "notes.txt"}}]},
            {"final": "could not read it"}
        ]}}
    }));
    let mut policy = agent_tools::Policy::new();
    policy
        .add(agent_tools::Action::Ask, "read_file(notes.txt)")
        .unwrap();
    let gateway = gateway(&s, &[]).with_policy(policy);
    let rt = Runtime::new(model, Arc::new(gateway), Arc::clone(&store));
    let report = rt
        .start(
            RunRequest::new("parent", "have a look", Budget::default()),
            CancellationToken::new(),
        )
        .await
        .unwrap();
    assert_eq!(
        report.outcome.reason,
        TerminalReason::Completed,
        "{:?}",
        report.outcome
    );
    let child_id = agent_runtime::sub_agent_run_id("parent", 1, &CallId::from("d1"));
    let child = store.load(&child_id).unwrap();
    let denied = child
        .iter()
        .find_map(|e| match &e.event {
            Event::CallRejected { result, .. } => Some(result.clone()),
            _ => None,
        })
        .expect("the read was refused");
    assert_eq!(denied.error_kind(), Some(ErrorKind::Denied));
    assert!(
        denied.content().contains("cannot wait for a person"),
        "{}",
        denied.content()
    );
    assert_eq!(count(&child, "approval_requested"), 0);
}

#[tokio::test]
async fn a_sub_agent_call_that_asks_for_more_than_the_parent_has_is_refused_and_starts_nothing() {
    let s = setup();
    let store: Arc<dyn Store> = Arc::new(MemoryStore::default());
    let model = script(json!({
        "turns": [
            {"tool_calls": [
                // No grandchildren, and no tool the run does not have.
                {"id": "d1", "name": "delegate", "arguments": {"goal": "nest", "tools": ["delegate"]}},
                {"id": "d2", "name": "delegate", "arguments": {"goal": "fetch", "tools": ["fetch_url"]}},
                // Outside the schema: a step budget past its bound, an empty goal.
                {"id": "d3", "name": "delegate_read", "arguments": {"goal": "x", "max_steps": 100000}},
                {"id": "d4", "name": "delegate_read", "arguments": {"goal": ""}}
            ]},
            {"final": "done"}
        ]
    }));
    let rt = runtime(&s, model, Arc::clone(&store), &["delegate"]);
    let report = rt
        .start(
            RunRequest::new("parent", "try", Budget::default()),
            CancellationToken::new(),
        )
        .await
        .unwrap();
    assert_eq!(
        report.outcome.reason,
        TerminalReason::Completed,
        "{:?}",
        report.outcome
    );
    let log = store.load("parent").unwrap();
    let results: Vec<ToolResult> = log
        .iter()
        .filter_map(|e| match &e.event {
            Event::ToolFinished { result, .. } | Event::CallRejected { result, .. } => {
                Some(result.clone())
            }
            _ => None,
        })
        .collect();
    assert_eq!(results.len(), 4);
    for result in &results {
        assert_eq!(
            result.error_kind(),
            Some(ErrorKind::InvalidArguments),
            "{result:?}"
        );
    }
    let of = |id: &str| {
        results
            .iter()
            .find(|r| r.call_id.as_str() == id)
            .unwrap()
            .content()
    };
    assert!(
        of("d1").contains("\"delegate\" is not a tool a sub-agent may have"),
        "{results:#?}"
    );
    assert!(of("d2").contains("fetch_url"), "{results:#?}");
    assert!(of("d3").contains("/max_steps"), "{results:#?}");
    assert!(of("d4").contains("/goal"), "{results:#?}");
    assert_eq!(count(&log, "sub_agent_finished"), 0, "no child started");
    assert_eq!(store.runs().unwrap().len(), 1);
}

/// The script model, counting the sub-agents' model calls in progress at once.
struct CountsChildren {
    inner: ScriptModel,
    in_flight: std::sync::atomic::AtomicUsize,
    most: std::sync::atomic::AtomicUsize,
}

#[async_trait]
impl Model for CountsChildren {
    fn provider(&self) -> &str {
        "script"
    }
    fn model(&self) -> &str {
        "counts"
    }
    async fn decide(&self, request: ModelRequest<'_>) -> Result<ModelReply, ProviderError> {
        use std::sync::atomic::Ordering::SeqCst;
        let child = request
            .prompt
            .messages
            .first()
            .and_then(|m| m.parts.first());
        let child = matches!(child, Some(Part::Text { text }) if text.starts_with("part "));
        if child {
            let now = self.in_flight.fetch_add(1, SeqCst) + 1;
            self.most.fetch_max(now, SeqCst);
            // Lets every other child that was started reach its call too.
            for _ in 0..4 {
                tokio::task::yield_now().await;
            }
            self.in_flight.fetch_sub(1, SeqCst);
        }
        self.inner.decide(request).await
    }
}

/// A reply of many sub-agent calls starts them a few at a time (as many as the gateway runs
/// tools at once), not all together: each is a run making model calls, and a model's
/// reply of a hundred would otherwise make a hundred requests to the provider at once.
#[tokio::test]
async fn many_sub_agents_run_a_few_at_a_time_and_each_answers_its_call() {
    let s = setup();
    let store: Arc<dyn Store> = Arc::new(MemoryStore::default());
    let n = 20;
    let calls: Vec<Value> = (0..n)
        .map(|i| {
            json!({"id": format!("d{i}"), "name": "delegate_read",
            "arguments": {"goal": format!("part {i}")}})
        })
        .collect();
    let agents: serde_json::Map<String, Value> = (0..n)
        .map(|i| {
            let turns = json!({"turns": [{"final": format!("answer {i}")}]});
            (format!("part {i}"), turns)
        })
        .collect();
    let inner = ScriptModel::from_json(
        &json!({
            "turns": [{"tool_calls": calls}, {"final": "all parts done"}],
            "agents": agents
        })
        .to_string(),
    )
    .unwrap();
    let model = Arc::new(CountsChildren {
        inner,
        in_flight: Default::default(),
        most: Default::default(),
    });
    // Store work on the driving thread: every child started reaches its model call before
    // any of them goes on, so `most` is how many were started together.
    let rt = runtime(&s, model.clone(), Arc::clone(&store), &[]).with_inline_store(true);
    let report = rt
        .start(
            RunRequest::new("many", "do the parts", Budget::default()),
            CancellationToken::new(),
        )
        .await
        .unwrap();
    assert_eq!(report.outcome.reason, TerminalReason::Completed);
    let most = model.most.load(std::sync::atomic::Ordering::SeqCst);
    assert_eq!(
        most,
        agent_tools::DEFAULT_CONCURRENCY,
        "at most this many at once"
    );
    // Each call got its own child's answer, in the model's order.
    let log = store.load("many").unwrap();
    let results: Vec<(String, String)> = log
        .iter()
        .filter_map(|e| match &e.event {
            Event::ToolFinished { result, .. } => {
                Some((result.call_id.to_string(), result.content()))
            }
            _ => None,
        })
        .collect();
    let expected: Vec<(String, String)> = (0..n)
        .map(|i| (format!("d{i}"), format!("answer {i}")))
        .collect();
    assert_eq!(results, expected);
}

/// A summary that helps, and what it cost.
struct PaidSummary;

#[async_trait]
impl agent_context::Summarizer for PaidSummary {
    async fn summarize(&self, _history: &[Entry], _prompt: &Prompt) -> agent_context::Summarized {
        agent_context::Summarized {
            summary: Ok("read some pages".to_owned()),
            usage: Usage {
                cost_usd: 0.25,
                ..Usage::tokens(500, 100)
            },
        }
    }
}

/// What a child's summary costs counts toward the parent's budget as the child's model
/// calls do: past it, the children still running are cancelled.
#[tokio::test]
async fn a_sub_agent_s_summary_counts_toward_the_parents_budget() {
    let s = setup();
    std::fs::write(
        s.dir.path().join("ws/big.txt"),
        "a line of the big file\n".repeat(200),
    )
    .unwrap();
    let store: Arc<dyn Store> = Arc::new(MemoryStore::default());
    let mut reads: Vec<Value> = (0..14)
        .map(|i| {
            json!({"tool_calls": [{"id": format!("r{i}"), "name": "read_file",
                "arguments": {"path": "big.txt", "offset": i + 1}}]})
        })
        .collect();
    reads.push(json!({"final": "read"}));
    // Thirty different directories: no repeated plan ends the lister before its time.
    let lists_of = |i: usize| {
        std::fs::create_dir_all(s.dir.path().join(format!("ws/d{i}"))).unwrap();
        json!({"tool_calls": [{"id": format!("l{i}"), "name": "list_dir",
            "arguments": {"path": format!("d{i}")}}]})
    };
    let mut lists: Vec<Value> = (0..30).map(lists_of).collect();
    lists.push(json!({"final": "listed"}));
    let model = script(json!({
        "turns": [
            {"tool_calls": [
                {"id": "d1", "name": "delegate_read",
                    "arguments": {"goal": "read the big file", "max_steps": 20}},
                {"id": "d2", "name": "delegate_read",
                    "arguments": {"goal": "list a lot", "max_steps": 40}}
            ]},
            {"final": "never asked: the budget is spent"}
        ],
        "agents": {
            "read the big file": {"turns": reads},
            "list a lot": {"turns": lists}
        }
    }));
    let rt = runtime(&s, model, Arc::clone(&store), &[])
        .with_inline_store(true)
        .with_context(crate::results::small_window())
        .with_summarizer(Arc::new(PaidSummary));
    let budget = Budget {
        max_cost_usd: Some(0.2),
        ..Budget::default()
    };
    let report = rt
        .start(
            RunRequest::new("parent", "read and list", budget),
            CancellationToken::new(),
        )
        .await
        .unwrap();
    assert_eq!(report.outcome.reason, TerminalReason::CostBudgetExceeded);
    let reader = store
        .load(&agent_runtime::sub_agent_run_id(
            "parent",
            1,
            &CallId::from("d1"),
        ))
        .unwrap();
    assert_eq!(
        count(&reader, "context_compacted"),
        1,
        "the reader's summary was paid for"
    );
    let lister = store
        .load(&agent_runtime::sub_agent_run_id(
            "parent",
            1,
            &CallId::from("d2"),
        ))
        .unwrap();
    let ended = RunState::fold(&lister).unwrap().outcome().unwrap().reason;
    assert_eq!(
        ended,
        TerminalReason::Cancelled,
        "the other child was stopped"
    );
    assert!(
        (report.state.usage.cost_usd - 0.25).abs() < 1e-9,
        "{:?}",
        report.state.usage
    );
}
