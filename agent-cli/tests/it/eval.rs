//! `agent eval`: the shipped cases pass, their broken variants fail naming the expectation,
//! and bad case files are refused before anything runs.

use std::collections::BTreeMap;

use serde_json::Value;

use super::{Env, repo, stderr, stdout};

fn evals() -> String {
    repo().join("examples/evals").display().to_string()
}

fn json_of(out: &std::process::Output) -> Value {
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}{}", stdout(out), stderr(out)))
}

#[test]
fn the_example_cases_pass_with_the_same_figures_every_trial() {
    let env = Env::new();
    let junit = env.dir.path().join("junit.xml");
    let out = env.run(&[
        "--json",
        "eval",
        &evals(),
        "--repeat",
        "2",
        "--jobs",
        "4",
        "--junit",
        junit.to_str().unwrap(),
    ]);
    let v = json_of(&out);
    assert_eq!(out.status.code(), Some(0), "{v:#}");
    let cases = v["cases"].as_array().unwrap();
    assert_eq!(cases.len(), 11);
    for case in cases {
        assert_eq!(case["pass_all"], true, "{case:#}");
        let trials = case["trials"].as_array().unwrap();
        assert_eq!(trials.len(), 2);
        // A script model is deterministic: every trial has the same trajectory figures.
        for key in ["reason", "steps", "tool_calls", "tokens", "cost_usd"] {
            assert_eq!(trials[0][key], trials[1][key], "{} {key}", case["name"]);
        }
    }
    assert_eq!(v["summary"]["pass_all_rate"], 1.0);
    assert_eq!(v["by_reason"]["no_progress"]["trials"], 2);
    assert_eq!(v["by_reason"]["cancelled"]["trials"], 2);
    assert_eq!(v["summary"]["figures"]["duplicated_effects"], 0);
    let xml = std::fs::read_to_string(&junit).unwrap();
    assert_eq!(xml.matches("<testcase").count(), 22, "{xml}");
    assert!(xml.contains("failures=\"0\""), "{xml}");
}

#[test]
fn each_broken_case_fails_and_says_which_expectation_failed() {
    let env = Env::new();
    let broken = repo().join("examples/evals/broken").display().to_string();
    let out = env.run(&["--json", "eval", &broken, "--jobs", "4"]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let v = json_of(&out);
    let failures: BTreeMap<String, Vec<String>> = v["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            let list = c["trials"][0]["failures"]
                .as_array()
                .unwrap()
                .iter()
                .map(|f| f.as_str().unwrap().to_owned())
                .collect();
            (c["name"].as_str().unwrap().to_owned(), list)
        })
        .collect();
    let expected = [
        ("approval-write", "expect.writes_only: summary.txt changed"),
        (
            "cancel-during-tool",
            "expect.files \"finished.txt\": does not exist",
        ),
        (
            "crash-after-dispatch",
            "expect.max_tool_calls: at most 0, got 1",
        ),
        ("direct-answer", "expect.answer: wanted \"41\", got \"42\""),
        ("one-tool-call", "expect.max_tool_calls: at most 0, got 1"),
        ("parallel-reads", "expect.results.fast:"),
        (
            "partial-failure",
            "expect.events.tool_finished: wanted 1, got 2",
        ),
        (
            "repaired-calls",
            "expect.events.call_rejected: wanted 0, got 2",
        ),
        (
            "repeated-plan",
            "expect.reason: wanted completed, got no_progress",
        ),
        (
            "resume-existing-effect",
            "expect.files \"ledger.txt\": holds \"paid\\n\"",
        ),
        (
            "validated-answer",
            "expect.events.answer_rejected: wanted 0, got 1",
        ),
    ];
    assert_eq!(failures.len(), expected.len(), "{failures:#?}");
    for (case, wanted) in expected {
        let got = &failures[case];
        assert_eq!(
            got.len(),
            if case == "parallel-reads" { 2 } else { 1 },
            "{case}: {got:?}"
        );
        assert!(got[0].starts_with(wanted), "{case}: {got:?}");
    }
    // The text names them too, under their case.
    let out = env.run(&["eval", &format!("{broken}/direct-answer.toml")]);
    assert_eq!(out.status.code(), Some(1));
    let text = stdout(&out);
    assert!(
        text.contains("direct-answer") && text.contains("0/1"),
        "{text}"
    );
    assert!(
        text.contains("trial 1: expect.answer: wanted \"41\""),
        "{text}"
    );
    assert!(stderr(&out).contains("1 of 1 trial(s) failed an expectation"));
}

#[test]
fn a_comparison_with_an_earlier_result_shows_what_moved() {
    let env = Env::new();
    let case = format!("{}/repaired-calls.toml", evals());
    let base = env.run(&["--json", "eval", &case]);
    assert_eq!(base.status.code(), Some(0), "{}", stderr(&base));
    let mut before = json_of(&base);
    before["cases"][0]["figures"]["steps_mean"] = Value::from(2.0);
    let path = env.dir.path().join("baseline.json");
    std::fs::write(&path, before.to_string()).unwrap();
    let out = env.run(&["eval", &case, "--compare", path.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(
        text.contains("repaired-calls: steps 2.0 → 3.0 (+1.0)"),
        "{text}"
    );
}

#[test]
fn bad_cases_are_refused_before_anything_runs() {
    let env = Env::new();
    let dir = env.dir.path();
    std::fs::write(dir.join("s.json"), r#"{"turns": [{"final": "x"}]}"#).unwrap();
    let cases = [
        (
            "goal = \"g\"\nmodel = \"script:s.json\"\nexpected = 1\n",
            "case.toml line 3: unknown field `expected`",
        ),
        (
            "goal = \"g\"\nmodel = \"script:s.json\"\n[expect]\nreason = \"done\"\n",
            "expect.reason = \"done\" is not a terminal reason",
        ),
        ("goal = \"g\"\nmodel = \"script:nope.json\"\n", "the script"),
        (
            "goal = \"g\"\nmodel = \"script:s.json\"\n[expect]\nanswer_regex = \"(\"\n",
            "expect.answer_regex \"(\"",
        ),
        (
            "goal = \"g\"\nmodel = \"script:s.json\"\ncrash_after = \"boom\"\n",
            "crash_after = \"boom\" is not an event",
        ),
        (
            "goal = \"g\"\nmodel = \"script:s.json\"\n[[expect.files]]\npath = \"a\"\n",
            "give exactly one of content, regex or absent",
        ),
        (
            "goal = \"  \"\nmodel = \"script:s.json\"\n",
            "the goal is empty",
        ),
    ];
    for (text, wanted) in cases {
        let file = dir.join("case.toml");
        std::fs::write(&file, text).unwrap();
        let out = env.run(&["eval", file.to_str().unwrap()]);
        assert_eq!(out.status.code(), Some(2), "{text}: {}", stderr(&out));
        let err = stderr(&out);
        assert!(
            err.starts_with(&format!("agent: {}", file.display())) && err.contains(wanted),
            "{text}: {err}"
        );
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(stdout(&out).is_empty());
    }
    let out = env.run(&["eval", dir.join("nothing").to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("no such file or directory"));
    let out = env.run(&["eval", &evals(), "--repeat", "0"]);
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn the_help_documents_the_case_format_with_a_whole_example() {
    let env = Env::new();
    let out = env.run(&["eval", "--help"]);
    assert_eq!(out.status.code(), Some(0));
    let help = stdout(&out);
    for key in [
        "[expect]",
        "writes_only",
        "[[expect.files]]",
        "pass^k",
        "crash_after",
        "--compare",
    ] {
        assert!(help.contains(key), "{key}: {help}");
    }
}

#[test]
fn a_case_may_be_json_and_a_model_given_on_the_command_line_replaces_its_own() {
    let env = Env::new();
    let dir = env.dir.path();
    std::fs::write(dir.join("a.json"), r#"{"turns": [{"final": "from a"}]}"#).unwrap();
    std::fs::write(dir.join("b.json"), r#"{"turns": [{"final": "from b"}]}"#).unwrap();
    let case = serde_json::json!({
        "goal": "say where you are from",
        "model": "script:a.json",
        "tags": ["json"],
        "expect": {"reason": "completed", "answer": "from a"}
    });
    std::fs::write(dir.join("case.json"), case.to_string()).unwrap();
    let file = dir.join("case.json").display().to_string();
    let out = env.run(&["eval", &file]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}{}",
        stdout(&out),
        stderr(&out)
    );
    let other = format!("script:{}", dir.join("b.json").display());
    let out = env.run(&["--json", "eval", &file, "--model", &other]);
    assert_eq!(out.status.code(), Some(1));
    let v = json_of(&out);
    assert_eq!(
        v["cases"][0]["trials"][0]["failures"][0],
        "expect.answer: wanted \"from a\", got \"from b\""
    );
    assert_eq!(v["by_tag"]["json"]["cases"], 1);
}

#[test]
fn a_kept_trial_can_be_looked_at_afterwards() {
    let env = Env::new();
    let case = repo()
        .join("examples/evals/broken/direct-answer.toml")
        .display()
        .to_string();
    // Relative to where `agent eval` runs (its trials run elsewhere).
    let keep = env.dir.path().join("kept");
    let out = env.run(&["eval", &case, "--keep", "kept"]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let text = stdout(&out);
    let trial = keep.join("direct-answer-1");
    let hint = format!(
        "kept in {}; agent --store {}/store show ",
        trial.display(),
        trial.display()
    );
    let at = text.find(&hint).unwrap_or_else(|| panic!("{text}"));
    let run = text[at + hint.len()..].lines().next().unwrap().trim();
    let shown = env
        .bare()
        .arg("--store")
        .arg(trial.join("store"))
        .args(["show", run])
        .output()
        .unwrap();
    assert_eq!(shown.status.code(), Some(0), "{}", stderr(&shown));
    assert!(stdout(&shown).contains("final 42"), "{}", stdout(&shown));
    // A directory that holds something already is refused before anything runs.
    let out = env.run(&["eval", &case, "--keep", keep.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("is not empty"), "{}", stderr(&out));
}

/// `--max-tokens` holds for the whole evaluation: each trial's run gets what is left as its
/// budget, the run that would pass it stops `cost_budget_exceeded`, and no trial starts
/// once it is spent (each saying so).
#[test]
fn an_evaluation_s_token_budget_is_shared_out_among_its_trials() {
    let env = Env::new();
    let dir = env.dir.path();
    let used = serde_json::json!({"input_tokens": 100, "output_tokens": 10});
    let script = serde_json::json!({"turns": [
        {"tool_calls": [{"id": "c1", "name": "list_dir", "arguments": {}}], "usage": used},
        {"final": "done", "usage": used}
    ]});
    std::fs::write(dir.join("s.json"), script.to_string()).unwrap();
    let case = serde_json::json!({
        "goal": "look around", "model": "script:s.json",
        "expect": {"reason": "completed"}
    });
    std::fs::write(dir.join("case.json"), case.to_string()).unwrap();
    let file = dir.join("case.json").display().to_string();
    let args = ["--json", "eval", &file, "--repeat", "4", "--jobs", "1"];
    let out = env.run(&[&args[..], &["--max-tokens", "500"]].concat());
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let v = json_of(&out);
    let trials = v["cases"][0]["trials"].as_array().unwrap();
    let reasons: Vec<Value> = trials.iter().map(|t| t["reason"].clone()).collect();
    // 220 tokens a trial: 500, then 280 left, then 60 (its first call, 110, is made:
    // nothing counted it before), then nothing.
    assert_eq!(
        reasons,
        [
            "completed".into(),
            "completed".into(),
            "cost_budget_exceeded".into(),
            Value::Null
        ],
        "{v:#}"
    );
    let tokens: Vec<u64> = trials
        .iter()
        .map(|t| t["tokens"].as_u64().unwrap())
        .collect();
    assert_eq!(tokens, [220, 220, 110, 0]);
    assert_eq!(
        trials[3]["failures"][0],
        "not run: the evaluation's --max-tokens 500 was spent (550 used)"
    );
    // Without the budget, every trial runs whole.
    let out = env.run(&args);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let bad = env.run(&[&args[..], &["--max-cost", "0"]].concat());
    assert_eq!(bad.status.code(), Some(2));
    assert!(
        stderr(&bad).contains("--max-cost 0: give a positive number"),
        "{}",
        stderr(&bad)
    );
}

/// The trials of an evaluation call and price the models as the agent.toml `agent eval`
/// was started with says (here: whole responses, and a price, so that the cost a case
/// expects is the real one); the cases' own policy and budgets stay theirs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trials_call_and_price_the_model_as_agent_toml_says() {
    use agent_providers::testing::{Reply, Server};
    let answer = serde_json::json!({
        "id": "chatcmpl-1", "object": "chat.completion", "model": "gpt-4o",
        "choices": [{"index": 0, "finish_reason": "stop",
            "message": {"role": "assistant", "content": "hello"}}],
        "usage": {"prompt_tokens": 1000, "completion_tokens": 100}
    })
    .to_string();
    let server = Server::start(vec![Reply::status(200, answer)])
        .await
        .unwrap();
    let env = Env::new();
    let dir = env.dir.path();
    std::fs::write(
        dir.join("agent.toml"),
        "stream = false\nmax_steps = 7\n[prices.\"gpt-4o\"]\ninput = 2.5\noutput = 10.0\n",
    )
    .unwrap();
    let case = serde_json::json!({
        "goal": "say hello", "model": "openai:gpt-4o",
        "expect": {"reason": "completed", "max_cost_usd": 0.001}
    });
    std::fs::write(dir.join("case.json"), case.to_string()).unwrap();
    let out = env
        .cmd()
        .env("OPENAI_API_KEY", "test-key-1")
        .args(["--json", "eval", "case.json", "--base-url", &server.url])
        .output()
        .unwrap();
    let v = json_of(&out);
    let trial = &v["cases"][0]["trials"][0];
    // 1,000 tokens in at $2.50 a million, 100 out at $10.
    assert_eq!(trial["cost_usd"], 0.0035, "{v:#}");
    assert_eq!(
        trial["failures"][0], "expect.max_cost_usd: at most 0.001, got 0.0035",
        "{v:#}"
    );
    assert_eq!(out.status.code(), Some(1));
    let asked = server.received();
    assert_eq!(asked.len(), 1);
    assert_ne!(asked[0].body["stream"], true, "{}", asked[0].body);
}

/// SIGTERM to an evaluation (a CI job's timeout) is passed on to the trial running: its
/// run is let go at its next step, once its command is done, and stands interrupted; no
/// other trial begins; the report of what ran is printed and the evaluation exits 3.
/// Before, the evaluation died at once and its trial ran on without it.
#[test]
fn an_evaluation_asked_to_stop_stops_its_trials_at_their_next_step() {
    stopped_evaluation("-TERM", 3, "asked to stop");
}

/// Ctrl-C does the same, exit 130 (here sent to the evaluation alone, which passes it on).
#[test]
fn an_evaluation_interrupted_reports_what_ran() {
    stopped_evaluation("-INT", 130, "interrupted");
}

fn stopped_evaluation(signal: &str, code: i32, said: &str) {
    let env = Env::new();
    let dir = env.dir.path();
    let script = serde_json::json!({"turns": [
        {"tool_calls": [{"id": "c1", "name": "shell", "arguments": {
            "command": "touch started; while [ ! -e go ]; do sleep 0.05; done"}}]},
        {"final": "went"}
    ]});
    std::fs::write(dir.join("waits.json"), script.to_string()).unwrap();
    std::fs::write(
        dir.join("waits.toml"),
        "goal = \"wait for go\"\nmodel = \"script:waits.json\"\nallow = [\"shell\"]\n\n\
         [expect]\nreason = \"completed\"\n",
    )
    .unwrap();
    let eval = env
        .cmd()
        .args([
            "--json",
            "eval",
            "waits.toml",
            "--repeat",
            "2",
            "--jobs",
            "1",
        ])
        .args(["--keep", "kept"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let trial = dir.join("kept/waits-1");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !trial.join("workspace/started").exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "the trial's command never ran"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let asked = std::process::Command::new("kill")
        .args([signal, &eval.id().to_string()])
        .status()
        .unwrap();
    assert!(asked.success());
    std::fs::write(trial.join("workspace/go"), "").unwrap();
    let out = eval.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(code), "{}", stderr(&out));
    assert!(
        stderr(&out).contains(&format!("{said}: 2 of 2 trial(s) did not run or finish")),
        "{}",
        stderr(&out)
    );
    let v = json_of(&out);
    let trials = v["cases"][0]["trials"].as_array().unwrap();
    assert_eq!(
        trials[0]["failures"][0],
        "stopped: the evaluation was asked to stop before the trial ended",
        "{v}"
    );
    assert_eq!(
        trials[1]["failures"][0],
        "not run: the evaluation was asked to stop"
    );
    assert!(
        !dir.join("kept/waits-2").exists(),
        "the second trial never began"
    );
    // The first trial's run was let go once its command was done: interrupted, to resume.
    let run = trials[0]["run_id"].as_str().unwrap();
    let shown = env
        .bare()
        .arg("--store")
        .arg(trial.join("store"))
        .args(["show", "--json", run])
        .output()
        .unwrap();
    let events: Value = serde_json::from_slice(&shown.stdout).unwrap();
    let kinds: Vec<&str> = events["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["type"].as_str().unwrap())
        .collect();
    assert_eq!(kinds.last(), Some(&"tool_finished"), "{kinds:?}");
}
