//! Terminal reasons reached through the binary that no other test reaches there:
//! `deadline_exceeded`, `no_progress`, `tool_unavailable`, and a person's `rejected` and
//! one-of-several approvals. Each checks the exit code and the `--json` object.

use serde_json::{Value, json};

use crate::{Env, stderr};

fn json_of(out: &std::process::Output) -> Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|_| panic!("not JSON: {}", stderr(out)))
}

#[test]
fn a_slow_model_past_the_wall_clock_budget_is_deadline_exceeded() {
    let env = Env::new();
    let model = env.script(json!([{"final": "late", "delay_ms": 30_000}]));
    let out = env.run(&["run", "--json", "--timeout", "0.3", "--model", &model, "g"]);
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
    let v = json_of(&out);
    assert_eq!(v["reason"], "deadline_exceeded");
    assert_eq!(v["status"], "stopped");
    assert_eq!(v["answer"], Value::Null);
}

#[test]
fn the_same_plan_after_a_correction_is_no_progress() {
    let env = Env::new();
    let same = json!({"tool_calls": [{"id": "c1", "name": "list_dir", "arguments": {}}]});
    let model = env.script(json!([same, same, same, same, same, {"final": "x"}]));
    let out = env.run(&["run", "--json", "--model", &model, "g"]);
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
    let v = json_of(&out);
    assert_eq!(v["reason"], "no_progress");
    assert_eq!(v["tool_calls"], 2, "the repeats past the limit did not run");
}

#[test]
fn a_server_that_dies_twice_is_tool_unavailable() {
    let env = Env::new();
    let config = crate::py_mcp_config(&env, "d");
    // Different arguments each time, so the plan is not a repeat.
    let die = |id: &str| json!({"tool_calls": [{"id": id, "name": "mcp__d__die", "arguments": {"attempt": id}}]});
    let model = env.script(json!([die("k1"), die("k2"), die("k3"), {"final": "x"}]));
    let out = env.run(&[
        "run",
        "--json",
        "--model",
        &model,
        "--mcp-config",
        config,
        "g",
    ]);
    assert_eq!(out.status.code(), Some(5), "{}", stderr(&out));
    let v = json_of(&out);
    assert_eq!(v["reason"], "tool_unavailable");
    assert_eq!(v["status"], "failed");
    assert!(
        v["message"].as_str().unwrap().contains("mcp__d__die"),
        "{v}"
    );
}

#[test]
fn approving_one_of_several_pending_calls_runs_that_one_only() {
    let env = Env::new();
    let model = env.script(json!([
        {"tool_calls": [
            {"id": "w1", "name": "write_file", "arguments": {"path": "one.txt", "content": "1"}},
            {"id": "w2", "name": "write_file", "arguments": {"path": "two.txt", "content": "2"}}
        ]},
        {"final": "done"}
    ]));
    let out = env.run(&["run", "--json", "--model", &model, "g"]);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    let v = json_of(&out);
    let pending: Vec<&str> = v["pending"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["call_id"].as_str().unwrap())
        .collect();
    assert_eq!(pending, ["w1", "w2"]);
    assert!(
        v["pending"][0]["why"]
            .as_str()
            .unwrap()
            .contains("write_file is a write tool, which asks by default"),
        "{v}"
    );
    let id = v["run_id"].as_str().unwrap().to_owned();
    let partly = env.run(&["approve", "--json", &id, "--call", "w1"]);
    assert_eq!(partly.status.code(), Some(3), "{}", stderr(&partly));
    let v = json_of(&partly);
    assert_eq!(v["pending"].as_array().unwrap().len(), 1);
    assert_eq!(v["pending"][0]["call_id"], "w2");
    let done = env.run(&[
        "deny",
        "--json",
        &id,
        "--call",
        "w2",
        "--reason",
        "not that one",
    ]);
    assert_eq!(done.status.code(), Some(0), "{}", stderr(&done));
    assert!(env.dir.path().join("one.txt").exists());
    assert!(!env.dir.path().join("two.txt").exists());
}

/// Without `--store`, runs go to `.agent` in the current directory.
#[test]
fn the_default_store_is_dot_agent_in_the_current_directory() {
    let env = Env::new();
    let model = env.script(json!([{"final": "ok"}]));
    let agent = |args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_agent"))
            .current_dir(env.dir.path())
            .env("AGENT_CONFIG_DIR", env.dir.path().join("config"))
            .args(args)
            .output()
            .unwrap()
    };
    let out = agent(&["run", "--json", "--model", &model, "g"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(env.dir.path().join(".agent/agent-store").exists());
    let runs: Value = serde_json::from_slice(&agent(&["runs", "--json"]).stdout).unwrap();
    assert_eq!(runs[0]["run_id"], json_of(&out)["run_id"]);
}

/// A store that refuses a commit ends the run `checkpoint_failed`, exit 5; the model is not
/// asked again, and what was committed before stays.
#[test]
fn a_refused_commit_is_checkpoint_failed() {
    let env = Env::new();
    let model = env.script(json!([
        {"tool_calls": [{"id": "c1", "name": "list_dir", "arguments": {}}]},
        {"final": "never"}
    ]));
    // The first commit (the start) goes through; the second is refused.
    let out = env
        .cmd()
        .env("FAILPOINTS", "commit_refused=1*off->return")
        .args(["run", "--json", "--model", &model, "g"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(5), "{}", stderr(&out));
    let v = json_of(&out);
    assert_eq!(v["reason"], "checkpoint_failed");
    assert_eq!(v["status"], "failed");
    assert_eq!(
        v["steps"], 0,
        "the turn whose commit was refused does not count"
    );
    let id = v["run_id"].as_str().unwrap();
    let show: Value = serde_json::from_slice(&env.run(&["show", "--json", id]).stdout).unwrap();
    assert_eq!(
        show["events"].as_array().unwrap().len(),
        1,
        "only the start was committed"
    );
}

#[test]
fn the_log_says_what_happened_and_the_command_line_says_what_to_do() {
    let env = Env::new();
    let list = json!({"tool_calls": [{"id": "c1", "name": "list_dir", "arguments": {}}]});
    let model = env.script(json!([list, {"final": "x"}]));
    let out = env.run(&["run", "--model", &model, "--max-steps", "1", "g"]);
    assert_eq!(out.status.code(), Some(4));
    assert!(
        stderr(&out).contains("raise --max-steps"),
        "{}",
        stderr(&out)
    );
    let out = env.run(&["run", "--json", "--model", &model, "--max-steps", "1", "g"]);
    let v = json_of(&out);
    let message = v["message"].as_str().unwrap();
    assert!(
        message.contains("step budget") && !message.contains("--"),
        "{message}"
    );
    let show = env.run(&["show", "--json", v["run_id"].as_str().unwrap()]);
    let log = String::from_utf8_lossy(&show.stdout);
    assert!(
        !log.contains("--max-steps"),
        "no flag names in the durable log: {log}"
    );
}
