//! Redaction never changes what runs, keeps secrets out of the log, and leaves ordinary
//! text alone (CONTRACT §7).

use std::path::Path;

use agent_runtime::Redactor;
use proptest::prelude::*;

use super::*;

const VAR: &str = "DEPLOY_TOKEN";
const VALUE: &str = "tok-9f8e7d6c5b4a0011";

fn redactor() -> Redactor {
    Redactor::new([
        (VAR.to_owned(), VALUE.to_owned()),
        ("LONGER_TOKEN".to_owned(), format!("{VALUE}-and-more")),
    ])
}

/// Credentials of every listed format, built here so no literal one sits in the sources.
fn fake(format: &str) -> String {
    let tail = "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8";
    match format {
        "openai" => format!("sk-{tail}"),
        "openai-project" => format!("sk-proj-{tail}"),
        "anthropic" => format!("sk-ant-api03-{tail}"),
        "github" => format!("ghp_{tail}"),
        "github-fine" => format!("github_pat_11{tail}"),
        "aws" => format!("AKIA{}", "IOSFODNN7EXAMPLE"),
        "slack" => format!("xoxb-{}-{tail}", "1234567890"),
        "bearer" => format!("Bearer {tail}"),
        "header" => format!("Authorization: token {tail}"),
        "url" => format!("postgres://agent:{}@127.0.0.1/db", "pw9x81kd"),
        other => panic!("{other}"),
    }
}

const FORMATS: [&str; 10] = [
    "openai",
    "openai-project",
    "anthropic",
    "github",
    "github-fine",
    "aws",
    "slack",
    "bearer",
    "header",
    "url",
];

fn content() -> String {
    format!(
        "skip_validation_checks = true\npk_sequence_generator_name = 1\ntoken = {VALUE}\n\
         {}\n{}\nplain last line\n",
        fake("header"),
        fake("openai-project")
    )
}

#[tokio::test]
async fn an_approved_call_runs_exactly_what_was_proposed() {
    let s = setup();
    let proposed = content();
    let script = json!({"turns": [
        {"tool_calls": [{"id": "w1", "name": "write_file",
            "arguments": {"path": "config.toml", "content": proposed}}]},
        {"final": "written"}
    ]});
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let first = s
        .runtime(script.clone(), Arc::clone(&store), vec![])
        .with_redactor(redactor());
    let paused = first
        .start(
            RunRequest::new("run-a", "write the config", Budget::default()),
            CancellationToken::new(),
        )
        .await
        .unwrap();
    assert_eq!(paused.outcome.reason, TerminalReason::ApprovalRequired);
    // What the person is shown holds the reference, not the value.
    let shown = serde_json::to_string(&paused.outcome.pending).unwrap();
    assert!(
        !shown.contains(VALUE) && shown.contains("[secret:$DEPLOY_TOKEN]"),
        "{shown}"
    );
    // Another invocation approves: it rebuilds the call from the log alone.
    let second = s
        .runtime(script, Arc::clone(&store), vec![])
        .with_redactor(redactor());
    let done = second
        .approve("run-a", vec![], CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(done.outcome.reason, TerminalReason::Completed);
    let written = std::fs::read_to_string(s.dir.path().join("ws/config.toml")).unwrap();
    assert_eq!(
        written, proposed,
        "the file holds the proposed content byte for byte"
    );
    let log = serde_json::to_string(&store.load("run-a").unwrap()).unwrap();
    assert!(!log.contains(VALUE), "{log}");
    assert!(log.contains("skip_validation_checks = true"));
    assert!(log.contains("pk_sequence_generator_name"));
}

/// A call whose path holds a secret's value waits for a person: the place its path led
/// to is kept with a reference in place of the value, as its arguments are, so the log
/// and the person never see the value, and the approval in another invocation writes
/// exactly there.
#[tokio::test]
async fn a_path_holding_a_secret_is_kept_with_a_reference_and_written_after_an_approval() {
    let s = setup();
    let script = json!({"turns": [
        {"tool_calls": [{"id": "w1", "name": "write_file",
            "arguments": {"path": format!("out/{VALUE}.txt"), "content": "x"}}]},
        {"final": "written"}
    ]});
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let paused = s
        .runtime(script.clone(), Arc::clone(&store), vec![])
        .with_redactor(redactor())
        .start(
            RunRequest::new("run-p", "write it", Budget::default()),
            CancellationToken::new(),
        )
        .await
        .unwrap();
    assert_eq!(paused.outcome.reason, TerminalReason::ApprovalRequired);
    assert_eq!(
        paused.outcome.pending[0].path.as_deref(),
        Some("out/[secret:$DEPLOY_TOKEN].txt")
    );
    let done = s
        .runtime(script, Arc::clone(&store), vec![])
        .with_redactor(redactor())
        .approve("run-p", vec![], CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(done.outcome.reason, TerminalReason::Completed);
    let written = s.dir.path().join(format!("ws/out/{VALUE}.txt"));
    assert_eq!(std::fs::read_to_string(written).unwrap(), "x");
    let log = serde_json::to_string(&store.load("run-p").unwrap()).unwrap();
    assert!(!log.contains(VALUE), "{log}");
    assert!(
        log.contains("\"path\":\"out/[secret:$DEPLOY_TOKEN].txt\""),
        "{log}"
    );
}

#[tokio::test]
async fn a_call_whose_secret_is_gone_is_not_run_and_the_reason_is_given() {
    let s = setup();
    let script = json!({"turns": [
        {"tool_calls": [{"id": "w1", "name": "write_file",
            "arguments": {"path": "config.toml", "content": content()}}]},
        {"final": "gave up"}
    ]});
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    s.runtime(script.clone(), Arc::clone(&store), vec![])
        .with_redactor(redactor())
        .start(
            RunRequest::new("run-b", "write", Budget::default()),
            CancellationToken::new(),
        )
        .await
        .unwrap();
    let done = s
        .runtime(script, Arc::clone(&store), vec![])
        .with_redactor(Redactor::none())
        .approve("run-b", vec![], CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(done.outcome.reason, TerminalReason::Completed);
    assert!(!s.dir.path().join("ws/config.toml").exists());
    let log = store.load("run-b").unwrap();
    let result = log
        .iter()
        .find_map(|e| match &e.event {
            Event::ToolFinished { result, .. } => Some(result.content()),
            _ => None,
        })
        .unwrap();
    assert!(
        result.contains("not run") && result.contains(VAR),
        "{result}"
    );
}

#[tokio::test]
async fn results_answers_and_blobs_are_redacted() {
    let s = setup();
    let big = format!("{}\n{}", fake("github"), "x".repeat(60_000));
    // A `.env` line and a private key, in pieces: this file goes through the redactor.
    let assigned = format!("STRIPE_SECRET_KEY{}rk_live_{}", "=", "51H8x2abc9");
    let key = format!(
        "-----BEGIN {}-----\n{}\n-----END {0}-----",
        "OPENSSH PRIVATE KEY", "b3BlbnNzaC1rZXktdjEAAAAABG5vbmU0"
    );
    std::fs::write(
        s.dir.path().join("ws/env.txt"),
        format!("T={VALUE}\n{assigned}\n{key}\n{big}"),
    )
    .unwrap();
    let script = json!({"turns": [
        {"tool_calls": [{"id": "r1", "name": "dump", "arguments": {"path": "env.txt"}}]},
        {"final": format!("found {VALUE} and {}", fake("aws"))}
    ]});
    let store: Arc<dyn Store> = Arc::new(MemoryStore::new());
    let gateway = with_dump(s.dir.path().join("ws")).with_blob_sink(Arc::new(
        agent_runtime::StoreBlobs::new(Arc::clone(&store)).with_redactor(redactor()),
    ));
    let model = ScriptModel::from_json(&script.to_string()).unwrap();
    let rt = Runtime::new(Arc::new(model), Arc::new(gateway), Arc::clone(&store))
        .with_redactor(redactor());
    let report = rt
        .start(
            RunRequest::new("run-c", "look", Budget::default()),
            CancellationToken::new(),
        )
        .await
        .unwrap();
    let answer = report.outcome.answer.unwrap();
    assert!(
        !answer.contains(VALUE) && !answer.contains(&fake("aws")),
        "{answer}"
    );
    let log = serde_json::to_string(&store.load("run-c").unwrap()).unwrap();
    assert!(!log.contains(VALUE) && !log.contains(&fake("github")));
    for gone in ["51H8x2abc9", "b3BlbnNzaC1rZXktdjEAAAAABG5vbmU0"] {
        assert!(!log.contains(gone), "{gone}");
    }
    let handle = stored_handle(&log);
    let blob = String::from_utf8(store.get_blob(&handle).unwrap().unwrap()).unwrap();
    assert!(
        blob.contains("[REDACTED:DEPLOY_TOKEN]"),
        "the blob is redacted"
    );
    assert!(!blob.contains(VALUE) && !blob.contains(&fake("github")));
    assert!(
        blob.contains("STRIPE_SECRET_KEY=[REDACTED]"),
        "{}",
        &blob[..200]
    );
    for gone in ["51H8x2abc9", "b3BlbnNzaC1rZXktdjEAAAAABG5vbmU0"] {
        assert!(!blob.contains(gone), "{gone}");
    }
}

#[test]
fn every_listed_format_is_caught() {
    let r = Redactor::new([]);
    for format in FORMATS {
        let secret = fake(format);
        let text = format!("before {secret} after");
        let out = r.redact_str(&text);
        assert!(out.contains("[REDACTED]"), "{format}: {out}");
        assert!(
            out.starts_with("before ") && out.ends_with(" after"),
            "{out}"
        );
        // The part that is the credential is gone.
        let tail = "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8";
        assert!(
            !out.contains(tail) && !out.contains("pw9x81kd"),
            "{format}: {out}"
        );
    }
}

/// Every `.rs`, `.toml` and `.md` file of this repository.
fn corpus(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if path.is_dir() {
            if !matches!(name.as_str(), "target" | ".git" | "fuzz") {
                corpus(&path, out);
            }
        } else if name.ends_with(".rs") || name.ends_with(".toml") || name.ends_with(".md") {
            out.push(path);
        }
    }
}

#[test]
fn real_source_text_comes_out_unchanged() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let mut files = Vec::new();
    corpus(root, &mut files);
    assert!(files.len() > 50, "{} files", files.len());
    let r = Redactor::new([]);
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        let out = r.redact_str(&text);
        if out != text {
            let line = text
                .lines()
                .zip(out.lines())
                .find(|(a, b)| a != b)
                .map(|(a, _)| a.to_owned());
            panic!("{} changed at: {line:?}", file.display());
        }
    }
}

fn fragment() -> impl Strategy<Value = String> {
    prop_oneof![
        Just(VALUE.to_owned()),
        Just(format!("{VALUE}-and-more")),
        Just("[secret:$DEPLOY_TOKEN]".to_owned()),
        Just("[REDACTED:DEPLOY_TOKEN]".to_owned()),
        Just(fake("openai-project")),
        Just(fake("bearer")),
        Just("password = hunter2hunter2".to_owned()),
        Just("é\n\t\"".to_owned()),
        "[ -~]{0,12}",
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// Whatever the argument text, the call logged and expanded again is the call proposed,
    /// and the log holds no known secret value.
    #[test]
    fn a_logged_call_expands_to_the_proposed_one(
        value in prop::collection::vec(fragment(), 0..8),
        key in prop::collection::vec(fragment(), 1..3),
        items in prop::collection::vec(prop::collection::vec(fragment(), 0..3), 0..3),
    ) {
        let r = redactor();
        let value = value.concat();
        let items: Vec<String> = items.into_iter().map(|i| i.concat()).collect();
        let proposed = ToolCall::new(
            "c1",
            "shell",
            json!({"command": value, "nested": {key.concat(): items}}),
        );
        let mut logged = proposed.clone();
        r.reference_call(&mut logged);
        let on_disk = serde_json::to_string(&logged).unwrap();
        prop_assert!(!on_disk.contains(VALUE), "{}", on_disk);
        let back: ToolCall = serde_json::from_str(&on_disk).unwrap();
        prop_assert_eq!(r.expand_call(&back).unwrap(), proposed);
    }
}
