//! A conformance suite every [`Store`] backend must pass. Call [`check_all`] with a fresh,
//! empty store; each check panics with a message naming the broken promise.

use agent_core::{Budget, Entry, Event, Handle, Manifest, Outcome, TerminalReason};

use crate::{Store, StoreError};

/// The value, or a panic naming the step of the suite that failed: a setup step that
/// fails is a failed check, never skipped.
fn must<T>(step: &str, result: Result<T, StoreError>) -> T {
    match result {
        Ok(value) => value,
        Err(e) => panic!("conformance: {step} failed: {e}"),
    }
}

/// Runs every check on `store`, which must be empty.
pub fn check_all(store: &dyn Store) {
    order_is_kept(store);
    a_conflicting_batch_writes_nothing(store);
    a_batch_must_continue_the_log(store);
    unknown_runs_are_not_found(store);
    the_index_follows_the_log(store);
    a_fork_is_listed_with_its_own_start_and_usage(store);
    blobs_are_stored_once_by_content(store);
    a_log_reads_from_any_version(store);
    a_wait_answers_with_what_is_committed(store);
}

fn a_wait_answers_with_what_is_committed(store: &dyn Store) {
    let run = "conf-wait";
    must("append", store.append(run, 0, &[started(run, 1)]));
    must("append", store.append(run, 1, &[filler(2, 1)]));
    let long = std::time::Duration::from_secs(3600);
    let versions = |from: u64, wait| -> Vec<u64> {
        must("wait_from", store.wait_from(run, from, wait))
            .iter()
            .map(|e| e.version)
            .collect()
    };
    // Entries that are there are answered at once, however long the wait allowed.
    assert_eq!(versions(1, long), [1, 2]);
    assert_eq!(versions(2, long), [2]);
    assert_eq!(
        versions(3, std::time::Duration::ZERO),
        Vec::<u64>::new(),
        "none committed yet"
    );
    assert!(matches!(
        store.wait_from("conf-wait-none", 1, std::time::Duration::ZERO),
        Err(StoreError::RunNotFound(_))
    ));
}

fn a_log_reads_from_any_version(store: &dyn Store) {
    let run = "conf-from";
    let other = "conf-from-2";
    must("append", store.append(run, 0, &[started(run, 1)]));
    must(
        "append",
        store.append(run, 1, &[filler(2, 1), filler(3, 2)]),
    );
    must("append", store.append(other, 0, &[started(other, 1)]));
    let versions = |from: u64| -> Vec<u64> {
        must("load_from", store.load_from(run, from))
            .iter()
            .map(|e| e.version)
            .collect()
    };
    assert_eq!(versions(0), [1, 2, 3], "0 is the whole log");
    assert_eq!(versions(1), [1, 2, 3]);
    assert_eq!(versions(3), [3], "another run's entries are not read");
    assert_eq!(versions(4), Vec::<u64>::new(), "past the end: nothing");
    assert!(matches!(
        store.load_from("conf-from-none", 2),
        Err(StoreError::RunNotFound(_))
    ));
}

fn blobs_are_stored_once_by_content(store: &dyn Store) {
    let big = "x".repeat(100_000);
    let a = must("put_blob", store.put_blob(big.as_bytes()));
    let b = must("put_blob again", store.put_blob(big.as_bytes()));
    assert_eq!(a, b, "equal contents have one handle");
    assert_eq!(
        a,
        Handle::of_bytes(big.as_bytes()),
        "the handle is the content's"
    );
    assert_eq!(
        must("get_blob", store.get_blob(&a)).map(|v| v.len()),
        Some(100_000),
        "a blob reads back whole"
    );
    assert_ne!(must("put_blob other", store.put_blob(b"other")), a);
    assert_eq!(
        must(
            "get_blob unknown",
            store.get_blob(&Handle::of_bytes(b"never stored"))
        ),
        None
    );
    assert_eq!(
        must("get_blob of a log handle", store.get_blob(&Handle::Log(1))),
        None
    );
}

/// For durable backends: what one handle committed, the next handle (opened after the
/// first is dropped) reads back, and appends continue where they stopped. `open` opens the
/// same store each time.
pub fn check_reopen(open: &dyn Fn() -> Box<dyn Store>) {
    let run = "conf-reopen";
    {
        let store = open();
        must("append", store.append(run, 0, &[started(run, 1)]));
        must(
            "append",
            store.append(run, 1, &[filler(2, 1), filler(3, 2)]),
        );
        must("put_blob", store.put_blob(b"kept across handles"));
    }
    let store = open();
    let log = must("load after reopening", store.load(run));
    assert_eq!(log.len(), 3, "a reopened store holds every committed entry");
    assert_eq!(log[2], filler(3, 2));
    assert_eq!(
        store.append(run, 3, &[filler(4, 3)]).ok(),
        Some(4),
        "appends continue"
    );
    let handle = Handle::of_bytes(b"kept across handles");
    assert!(
        must("get_blob after reopening", store.get_blob(&handle)).is_some(),
        "blobs survive reopening"
    );
    assert!(
        must("runs after reopening", store.runs())
            .iter()
            .any(|s| s.run_id == run)
    );
}

/// A `run_started` entry at version 1 for `run_id`.
pub fn started(run_id: &str, at_ms: u64) -> Entry {
    Entry {
        version: 1,
        at_ms,
        event: Event::RunStarted {
            run_id: run_id.to_owned(),
            goal: format!("goal of {run_id}"),
            manifest: Manifest {
                runtime_version: "conformance".into(),
                provider: "none".into(),
                model: "none".into(),
                system_prompt_digest: String::new(),
                tool_schema_digest: String::new(),
                budget: Budget::default(),
                tools: Vec::new(),
                answer: None,
                forked_from: None,
                parent: None,
                workspace: None,
                sandbox: None,
            },
        },
    }
}

/// A `model_failed` entry, a cheap filler event.
pub fn filler(version: u64, turn: u32) -> Entry {
    Entry {
        version,
        at_ms: 1_000 + version,
        event: Event::ModelFailed {
            turn,
            message: format!("filler {version}"),
            kind: agent_core::ModelErrorKind::Other,
            usage: agent_core::Usage::default(),
        },
    }
}

fn order_is_kept(store: &dyn Store) {
    let run = "conf-order";
    assert_eq!(store.append(run, 0, &[started(run, 1)]).ok(), Some(1));
    let batch: Vec<Entry> = (2..=300).map(|v| filler(v, v as u32)).collect();
    assert_eq!(
        store.append(run, 1, &batch).ok(),
        Some(300),
        "append returns the new version"
    );
    let log = must("load", store.load(run));
    let versions: Vec<u64> = log.iter().map(|e| e.version).collect();
    assert_eq!(
        versions,
        (1..=300).collect::<Vec<_>>(),
        "entries load in version order"
    );
    assert_eq!(log[150], batch[149], "entries load as written");
}

fn a_conflicting_batch_writes_nothing(store: &dyn Store) {
    let run = "conf-conflict";
    must("append", store.append(run, 0, &[started(run, 1)]));
    let stale = store.append(run, 0, &[filler(1, 1), filler(2, 2)]);
    assert!(
        matches!(
            stale,
            Err(StoreError::Conflict {
                expected: 0,
                actual: 1,
                ..
            })
        ),
        "a stale expected version is a conflict: {stale:?}"
    );
    let ahead = store.append(run, 5, &[filler(6, 6)]);
    assert!(
        matches!(ahead, Err(StoreError::Conflict { .. })),
        "{ahead:?}"
    );
    assert_eq!(
        store.load(run).map(|l| l.len()).ok(),
        Some(1),
        "nothing of a refused batch is written"
    );
    let fresh = store.append("conf-never", 3, &[filler(4, 1)]);
    assert!(
        matches!(fresh, Err(StoreError::Conflict { actual: 0, .. })),
        "{fresh:?}"
    );
    assert!(
        matches!(store.load("conf-never"), Err(StoreError::RunNotFound(_))),
        "a refused first batch creates no run"
    );
}

fn a_batch_must_continue_the_log(store: &dyn Store) {
    let run = "conf-gap";
    must("append", store.append(run, 0, &[started(run, 1)]));
    let gap = store.append(run, 1, &[filler(2, 1), filler(4, 2)]);
    assert!(
        matches!(gap, Err(StoreError::NotContiguous { found: 4, .. })),
        "{gap:?}"
    );
    assert_eq!(
        store.load(run).map(|l| l.len()).ok(),
        Some(1),
        "a batch is all or nothing"
    );
}

fn unknown_runs_are_not_found(store: &dyn Store) {
    assert!(matches!(
        store.load("conf-missing"),
        Err(StoreError::RunNotFound(_))
    ));
}

/// A fork is written whole up to where it was made (its parent's entries, with their times
/// and usage), then goes on: it is listed as started when it was made, with the usage of
/// its own calls, not its parent's.
fn a_fork_is_listed_with_its_own_start_and_usage(store: &dyn Store) {
    let run = "conf-fork";
    let mut first = started(run, 7);
    if let Event::RunStarted { manifest, .. } = &mut first.event {
        manifest.forked_from = Some(Box::new(agent_core::ForkOrigin {
            run_id: "conf-parent".into(),
            version: 2,
            at: 2,
            made_at_ms: Some(500),
        }));
    }
    let used = |version: u64, input: u64| Entry {
        version,
        at_ms: 500 + version,
        event: Event::ModelFailed {
            turn: 1,
            message: "cut".into(),
            kind: agent_core::ModelErrorKind::Other,
            usage: agent_core::Usage::tokens(input, 0),
        },
    };
    must(
        "append the prefix",
        store.append(run, 0, &[first, used(2, 1_000)]),
    );
    must("append its own", store.append(run, 2, &[used(3, 30)]));
    let runs = must("runs", store.runs());
    let summary = runs.iter().find(|s| s.run_id == run).cloned();
    let summary = summary.unwrap_or_else(|| panic!("run {run} is listed"));
    assert_eq!(summary.started_at_ms, 500, "a fork starts when it is made");
    let used = summary.usage.map(|u| u.input_tokens);
    assert_eq!(used, Some(30), "a fork's usage is its own");
}

fn the_index_follows_the_log(store: &dyn Store) {
    let run = "conf-index";
    must("append", store.append(run, 0, &[started(run, 7)]));
    must("append", store.append(run, 1, &[filler(2, 1)]));
    // A sub-agent reports its whole usage so far each time: the second report adds only
    // what is new. A retried attempt may be billed.
    let child = |version: u64, input: u64| Entry {
        version,
        at_ms: 50 + version,
        event: Event::SubAgentFinished {
            turn: 1,
            call_id: "d1".into(),
            run_id: format!("{run}.child"),
            usage: agent_core::Usage::tokens(input, input / 10),
        },
    };
    let retried = Entry {
        version: 5,
        at_ms: 60,
        event: Event::ModelRetried {
            turn: 2,
            retry: agent_core::Retry {
                attempt: 1,
                reason: "cut".into(),
                wait_ms: 1,
                usage: agent_core::Usage::tokens(7, 0),
            },
        },
    };
    must(
        "append usage",
        store.append(run, 2, &[child(3, 1_000), child(4, 1_500), retried]),
    );
    let end = Entry {
        version: 6,
        at_ms: 99,
        event: Event::RunEnded {
            outcome: Outcome::stop(TerminalReason::MaxSteps, "spent"),
        },
    };
    must("append the end", store.append(run, 5, &[end]));
    let runs = must("runs", store.runs());
    let summary = runs.iter().find(|s| s.run_id == run).cloned();
    let summary = summary.unwrap_or_else(|| panic!("run {run} is listed"));
    assert_eq!(summary.goal, format!("goal of {run}"));
    assert_eq!(
        (summary.status.as_str(), summary.reason),
        ("stopped", Some(TerminalReason::MaxSteps))
    );
    assert_eq!((summary.steps, summary.version), (1, 6));
    assert_eq!((summary.started_at_ms, summary.ended_at_ms), (7, Some(99)));
    let used = summary.usage.map(|u| (u.input_tokens, u.output_tokens));
    assert_eq!(used, Some((1_507, 150)), "a new run's usage is kept");
}
