//! Runs that wait for a person: pauses kept across resumes, approvals, denials, calls of
//! unknown outcome settled, and secrets kept out of the log.

use super::*;

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
