//! Final answers checked before they count: `--answer-schema` and `--check`.

use serde_json::{Value, json};

use super::{Env, stderr, stdout};

fn json_out(out: &std::process::Output) -> Value {
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}{}", stdout(out), stderr(out)))
}

fn schema(env: &Env) -> String {
    let path = env.dir.path().join("answer.schema.json");
    let schema = json!({
        "type": "object",
        "required": ["total"],
        "properties": {"total": {"type": "integer"}},
        "additionalProperties": false
    });
    std::fs::write(&path, schema.to_string()).unwrap();
    path.display().to_string()
}

fn events(env: &Env, run_id: &str) -> Vec<Value> {
    json_out(&env.run(&["show", "--json", run_id]))["events"]
        .as_array()
        .unwrap()
        .clone()
}

#[test]
fn an_answer_that_fails_its_schema_is_corrected_and_the_parsed_answer_is_in_json() {
    let env = Env::new();
    let model = env.script(json!([
        {"final": "the total is 3"},
        {"final": {"total": "3"}},
        {"final": {"total": 3}}
    ]));
    let schema = schema(&env);
    let out = env.run(&[
        "run",
        "--json",
        "--model",
        &model,
        "--answer-schema",
        &schema,
        "add it up",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let v = json_out(&out);
    assert_eq!(v["reason"], "completed");
    assert_eq!(v["answer_json"], json!({"total": 3}));
    assert_eq!(v["steps"], 3);
    let run_id = v["run_id"].as_str().unwrap();
    let rejections: Vec<String> = events(&env, run_id)
        .iter()
        .filter(|e| e["type"] == "answer_rejected")
        .map(|e| e["problem"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(rejections.len(), 2, "{rejections:?}");
    assert!(rejections[0].contains("not JSON"), "{}", rejections[0]);
    assert!(rejections[1].contains("at /total:"), "{}", rejections[1]);
    // The model saw the correction: it is in the prompt of the third call.
    let prompt = stdout(&env.run(&["context", run_id, "--at", "3"]));
    assert!(
        prompt.contains("Your final answer was rejected"),
        "{prompt}"
    );
    assert!(prompt.contains("at /total:"), "{prompt}");
    // The prompt carries the schema, for providers that ask for structured output.
    let context = json_out(&env.run(&["context", "--json", run_id]));
    assert_eq!(
        context["answer_schema"]["required"],
        json!(["total"]),
        "{context}"
    );
}

#[test]
fn a_check_command_rejects_with_its_output_and_accepts_on_exit_zero() {
    let env = Env::new();
    let model = env.script(json!([
        {"final": "maybe"},
        {"final": "yes"}
    ]));
    let check = r#"read -r answer; if [ "$answer" = yes ]; then exit 0; fi; echo "say yes, not $answer ($AGENT_RUN_ID)"; exit 1"#;
    let out = env.run(&[
        "run", "--json", "--model", &model, "--check", check, "decide",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let v = json_out(&out);
    assert_eq!(v["answer"], "yes");
    assert_eq!(v["answer_json"], Value::Null);
    let run_id = v["run_id"].as_str().unwrap();
    let problem = events(&env, run_id)
        .into_iter()
        .find(|e| e["type"] == "answer_rejected")
        .unwrap()["problem"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(problem.contains("(exit 1)"), "{problem}");
    assert!(
        problem.contains(&format!("say yes, not maybe ({run_id})")),
        "{problem}"
    );
}

/// A check command runs what the model left in the workspace (its tests, its build
/// scripts): it is not given the variables named like secrets, the key the run is paid
/// with among them, unless passed by name as for `shell` (`--shell-env`). Both with the
/// watcher `agent` starts and without a PID namespace.
#[test]
fn a_check_command_is_not_given_the_keys_unless_passed() {
    let env = Env::new();
    let model = env.script(json!([{"final": "first"}, {"final": "second"}]));
    let check = r#"echo "key=[${CANARY_API_KEY:-none}] other=[${CANARY_PLAIN:-none}]"; exit 1"#;
    let problem = |extra: &[&str], namespace: &str| {
        let out = env
            .cmd()
            .env("CANARY_API_KEY", "canary-value-8812")
            .env("CANARY_PLAIN", "plain-value")
            .env("AGENT_LOOP_PID_NAMESPACE", namespace)
            .args(["run", "--json", "--model", &model, "--check", check])
            .args(extra)
            .arg("decide")
            .output()
            .unwrap();
        let run_id = json_out(&out)["run_id"].as_str().unwrap().to_owned();
        events(&env, &run_id)
            .into_iter()
            .find(|e| e["type"] == "answer_rejected")
            .unwrap()["problem"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    for namespace in ["", "off"] {
        let withheld = problem(&[], namespace);
        assert!(
            withheld.contains("key=[none] other=[plain-value]"),
            "{namespace:?}: {withheld}"
        );
    }
    // Passed by name, it is there (and what the check prints of it is redacted).
    let passed = problem(&["--shell-env", "CANARY_API_KEY"], "");
    assert!(
        passed.contains("key=[[REDACTED:CANARY_API_KEY]]"),
        "{passed}"
    );
}

#[test]
fn rejections_past_the_repair_limit_fail_the_run_with_invalid_decision() {
    let env = Env::new();
    let model = env.script(json!([
        {"final": "a"}, {"final": "b"}, {"final": "c"}, {"final": "never asked"}
    ]));
    let out = env.run(&[
        "run", "--json", "--model", &model, "--check", "false", "decide",
    ]);
    assert_eq!(out.status.code(), Some(5), "{}", stderr(&out));
    let v = json_out(&out);
    assert_eq!(v["reason"], "invalid_decision");
    assert_eq!(v["answer"], Value::Null);
    assert_eq!(v["steps"], 3);
    assert!(
        v["message"]
            .as_str()
            .unwrap()
            .contains("failed its validators"),
        "{v}"
    );
}

#[test]
fn validators_recorded_at_the_start_judge_the_answers_of_a_follow_up() {
    let env = Env::new();
    let model = env.script(json!([
        {"final": "yes"},
        {"final": "no"},
        {"final": "yes"}
    ]));
    let check = r#"[ "$(cat)" = yes ]"#;
    let out = env.run(&[
        "run", "--json", "--model", &model, "--check", check, "decide",
    ]);
    let run_id = json_out(&out)["run_id"].as_str().unwrap().to_owned();
    // No --check this time: the run's own validators still apply.
    let out = env.run(&["resume", "--json", &run_id, "and again?"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let v = json_out(&out);
    assert_eq!(v["answer"], "yes");
    assert_eq!(v["steps"], 3);
}

#[test]
fn bad_validators_are_refused_before_anything_is_written() {
    let env = Env::new();
    let model = env.script(json!([{"final": "x"}]));
    let missing = env.dir.path().join("nope.json").display().to_string();
    let not_json = env.dir.path().join("bad.json");
    std::fs::write(&not_json, "{ nope").unwrap();
    let not_schema = env.dir.path().join("notschema.json");
    std::fs::write(&not_schema, r#"{"type": 12}"#).unwrap();
    for (args, expected) in [
        (vec!["--answer-schema", missing.as_str()], "cannot read it"),
        (
            vec!["--answer-schema", not_json.to_str().unwrap()],
            "is not JSON",
        ),
        (
            vec!["--answer-schema", not_schema.to_str().unwrap()],
            "not a valid JSON Schema",
        ),
        (vec!["--check", "  "], "is empty"),
    ] {
        let mut all = vec!["run", "--model", &model];
        all.extend(args);
        all.push("goal");
        let out = env.run(&all);
        assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
        let err = stderr(&out);
        assert!(err.contains(expected), "{err}");
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(!env.store().exists(), "nothing is written");
    }
}

#[test]
fn checks_from_an_untrusted_agent_toml_are_not_run() {
    let env = Env::new();
    let model = env.script(json!([{"final": "x"}]));
    std::fs::write(
        env.dir.path().join("agent.toml"),
        "checks = [\"touch pwned\"]\n",
    )
    .unwrap();
    let out = env.run(&["run", "--no-input", "--model", &model, "goal"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("answer check commands"),
        "{}",
        stderr(&out)
    );
    assert!(!env.dir.path().join("pwned").exists());
}

#[test]
fn a_check_past_its_timeout_rejects_the_answer() {
    let env = Env::new();
    let model = env.script(json!([{"final": "a"}, {"final": "b"}, {"final": "c"}]));
    let config = env.dir.path().join("named.toml");
    std::fs::write(
        &config,
        "checks = [\"sleep 5\"]\ncheck_timeout_secs = 0.2\n",
    )
    .unwrap();
    let config = config.to_str().unwrap();
    let out = env.run(&[
        "--config", config, "run", "--json", "--model", &model, "decide",
    ]);
    assert_eq!(out.status.code(), Some(5), "{}", stderr(&out));
    let v = json_out(&out);
    assert_eq!(v["reason"], "invalid_decision");
    assert!(
        v["message"]
            .as_str()
            .unwrap()
            .contains("timed out after 200 ms"),
        "{v}"
    );

    std::fs::write(
        env.dir.path().join("named.toml"),
        "check_timeout_secs = 0\n",
    )
    .unwrap();
    let out = env.run(&["--config", config, "run", "--model", &model, "decide"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("check_timeout_secs = 0"),
        "{}",
        stderr(&out)
    );
}

/// An answer whose check outlasts the run's wall-clock budget still gets the check's word:
/// it passed, so the run completes (its time ran out while nothing else could be done).
/// Before, the budget's end came first and the verdict fit nowhere: an internal error and
/// a run left without its end.
#[test]
fn an_answer_checked_past_the_deadline_ends_the_run_cleanly() {
    let env = Env::new();
    let model = env.script(json!([{"final": "yes"}]));
    let out = env.run(&[
        "run",
        "--json",
        "--model",
        &model,
        "--timeout",
        "2",
        "--check",
        "sleep 3",
        "decide",
    ]);
    let v = json_out(&out);
    let run_id = v["run_id"].as_str().unwrap().to_owned();
    // The script answers at once; only a host too slow to start a run in 2 s makes the
    // deadline come before the check, and then the answer is not checked at all.
    let reason = v["reason"].as_str().unwrap().to_owned();
    assert!(
        reason == "completed" || reason == "deadline_exceeded",
        "{reason}: {}",
        stderr(&out)
    );
    if reason == "completed" {
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        assert_eq!(v["answer"], "yes");
    }
    let log = events(&env, &run_id);
    assert_eq!(log.last().unwrap()["type"], "run_ended", "{log:?}");
}
