//! Forks: a new run from another's history before one of its model calls, driven on with
//! another script; what the prefix did is never done again.

use super::*;

/// Six model calls: a write, a read, another write, two reads, the answer.
fn parent_script() -> Value {
    json!({"turns": [
        {"tool_calls": [{"id": "w1", "name": "write_file", "arguments": {"path": "a.txt", "content": "one\n"}}]},
        {"tool_calls": [{"id": "r1", "name": "read_file", "arguments": {"path": "a.txt"}}]},
        {"tool_calls": [{"id": "w2", "name": "write_file", "arguments": {"path": "b.txt", "content": "parent\n"}}]},
        {"tool_calls": [{"id": "r2", "name": "read_file", "arguments": {"path": "b.txt"}}]},
        {"tool_calls": [{"id": "r3", "name": "read_file", "arguments": {"path": "notes.txt"}}]},
        {"final": "parent done"}
    ]})
}

/// Another script for the fork: its first call is the parent's call 3 (a script answers
/// call N with its Nth turn, inherited calls counted).
fn fork_script() -> Value {
    json!({"turns": [
        {"final": "never asked: inherited"},
        {"final": "never asked: inherited"},
        {"tool_calls": [{"id": "w2", "name": "write_file", "arguments": {"path": "b.txt", "content": "fork\n"}}]},
        {"final": "fork done"}
    ]})
}

fn allowing_writes(runtime_gateway: Gateway) -> Gateway {
    let mut policy = agent_tools::Policy::new();
    policy
        .add(agent_tools::Action::Allow, "write_file")
        .unwrap();
    runtime_gateway.with_policy(policy)
}

fn runtime(s: &Setup, script: Value, store: Arc<dyn Store>) -> Runtime {
    let model = Recording {
        inner: ScriptModel::from_json(&script.to_string()).unwrap(),
        trace: Arc::clone(&s.trace),
        prompts: Arc::clone(&s.prompts),
    };
    let gateway = Gateway::with_builtins(Workspace::new(s.dir.path().join("ws")).unwrap()).unwrap();
    Runtime::new(Arc::new(model), Arc::new(allowing_writes(gateway)), store)
}

fn effect_keys(log: &[Entry]) -> Vec<String> {
    log.iter()
        .filter_map(|e| match &e.event {
            Event::EffectDispatched { effect_key, .. } => Some(effect_key.clone()),
            _ => None,
        })
        .collect()
}

#[tokio::test]
async fn a_fork_at_call_3_of_6_continues_from_the_same_prompt_and_never_reruns_a_write() {
    let s = setup();
    let store: Arc<dyn Store> = Arc::new(SledStore::open(s.dir.path().join("store")).unwrap());
    let parent = runtime(&s, parent_script(), Arc::clone(&store));
    let report = parent
        .start(
            RunRequest::new("parent", "write things", Budget::default()),
            CancellationToken::new(),
        )
        .await
        .unwrap();
    assert_eq!(report.outcome.reason, TerminalReason::Completed);
    assert_eq!(report.state.steps, 6);
    let parent_prompt_3 = s.prompts.lock().unwrap()[2].clone();
    // The world moves on after the parent: the fork must not write a.txt again.
    std::fs::write(s.dir.path().join("ws/a.txt"), "changed since\n").unwrap();

    s.prompts.lock().unwrap().clear();
    let forker = runtime(&s, fork_script(), Arc::clone(&store));
    let report = forker
        .fork(
            "parent",
            3,
            "fork",
            Budget::default(),
            CancellationToken::new(),
        )
        .await
        .unwrap();
    assert_eq!(report.outcome.reason, TerminalReason::Completed);
    assert_eq!(report.outcome.answer.as_deref(), Some("fork done"));
    // Its first model call was call 3, with the prompt the parent's call 3 got.
    let prompts = s.prompts.lock().unwrap().clone();
    assert_eq!(prompts.len(), 2);
    assert_eq!(prompts[0], parent_prompt_3);
    // Nothing inherited ran again; the fork's own write happened, under its own key.
    let ws = s.dir.path().join("ws");
    assert_eq!(
        std::fs::read_to_string(ws.join("a.txt")).unwrap(),
        "changed since\n"
    );
    assert_eq!(std::fs::read_to_string(ws.join("b.txt")).unwrap(), "fork\n");
    let parent_log = store.load("parent").unwrap();
    let fork_log = store.load("fork").unwrap();
    let (inherited, own) = (effect_keys(&parent_log)[0].clone(), effect_keys(&fork_log));
    assert_eq!(own.len(), 2, "{own:?}");
    assert_eq!(
        own[0], inherited,
        "the inherited effect keeps the parent's key"
    );
    assert_ne!(
        own[1],
        effect_keys(&parent_log)[1],
        "the fork's w2 is its own effect"
    );
    assert_eq!(own[1], effect_key("fork", 3, &CallId::from("w2")));
    // The fork's log is the parent's prefix, its start made its own and its origin kept.
    let cut = before_model_call(&parent_log, 3).unwrap();
    assert_eq!(fork_log[1..cut], parent_log[1..cut]);
    let Event::RunStarted {
        run_id,
        manifest,
        goal,
    } = &fork_log[0].event
    else {
        panic!("{:?}", fork_log[0])
    };
    assert_eq!((run_id.as_str(), goal.as_str()), ("fork", "write things"));
    let origin = manifest.forked_from.as_deref().unwrap();
    assert_eq!((origin.run_id.as_str(), origin.at), ("parent", 3));
    assert_eq!(origin.version, parent_log[cut - 1].version);
    RunState::fold(&fork_log).unwrap();
}

#[tokio::test]
async fn a_fork_the_run_did_not_reach_is_refused_and_nothing_is_written() {
    let s = setup();
    let store: Arc<dyn Store> = Arc::new(MemoryStore::default());
    let parent = runtime(&s, parent_script(), Arc::clone(&store));
    parent
        .start(
            RunRequest::new("parent", "g", Budget::default()),
            CancellationToken::new(),
        )
        .await
        .unwrap();
    for at in [0, 7] {
        let err = parent
            .fork(
                "parent",
                at,
                "fork",
                Budget::default(),
                CancellationToken::new(),
            )
            .await
            .unwrap_err();
        assert!(err.to_string().contains("made 6 model call(s)"), "{err}");
    }
    let err = parent
        .fork(
            "nobody",
            1,
            "fork",
            Budget::default(),
            CancellationToken::new(),
        )
        .await
        .unwrap_err();
    assert!(err.to_string().contains("nobody"), "{err}");
    assert!(store.load("fork").map_or(true, |log| log.is_empty()));
    // A fork id that is taken is refused by the store's version check.
    parent
        .fork(
            "parent",
            2,
            "fork",
            Budget::default(),
            CancellationToken::new(),
        )
        .await
        .unwrap();
    assert!(
        parent
            .create_fork("parent", 2, "fork", Budget::default())
            .await
            .is_err()
    );
}

/// A fork's wall-clock budget counts from when it is made: a fork of a run that began an
/// hour ago, given 10 s, waits 3 s for its model and completes; its summary says it
/// started then (so the newest run is the fork just made).
#[tokio::test(start_paused = true)]
async fn a_fork_made_long_after_its_parent_has_its_whole_wall_clock_budget() {
    let s = setup();
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let clock = Arc::new(TokioClock(tokio::time::Instant::now()));
    let parent = runtime(&s, parent_script(), Arc::clone(&store)).with_clock(clock.clone());
    parent
        .start(
            RunRequest::new("parent", "write things", Budget::default()),
            CancellationToken::new(),
        )
        .await
        .unwrap();
    tokio::time::advance(std::time::Duration::from_secs(3_600)).await;
    let made_at = clock.now_ms();
    let script = json!({"turns": [
        {"final": "never asked: inherited"},
        {"final": "fork done", "delay_ms": 3000}
    ]});
    let forker = runtime(&s, script, Arc::clone(&store)).with_clock(clock.clone());
    let budget = Budget {
        max_wall_time_ms: Some(10_000),
        ..Budget::default()
    };
    let report = forker
        .fork("parent", 2, "fork", budget, CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(
        (report.outcome.reason, report.outcome.answer.as_deref()),
        (TerminalReason::Completed, Some("fork done")),
        "{}",
        report.outcome.message
    );
    let summary = store
        .runs()
        .unwrap()
        .into_iter()
        .find(|r| r.run_id == "fork")
        .unwrap();
    assert_eq!(summary.started_at_ms, made_at);
}
