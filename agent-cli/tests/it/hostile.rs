//! Hostile and broken input from the command line: numbers that make no sense, usage that
//! overflows, readers that go away. No panic (exit 101), one-line errors, exit 2.

use std::process::Stdio;

use serde_json::{Value, json};

use crate::{Env, stderr};

#[test]
fn nonsense_numbers_in_agent_toml_are_named_in_one_line() {
    let env = Env::new();
    let model = env.script(json!([{"final": "ok"}]));
    for (setting, key) in [
        ("max_tokens = 0", "max_tokens"),
        ("max_steps = 0", "max_steps"),
        ("compact_at = -1.0", "compact_at"),
        ("compact_at = nan", "compact_at"),
        ("timeout = inf", "timeout"),
        ("timeout = 1e30", "timeout"),
        ("context_window = 3", "context_window"),
        ("max_cost_usd = -2.0", "max_cost_usd"),
        ("[retry]\nmax_attempts = 0", "max_attempts"),
        (
            "[[hooks.pre_tool_use]]\ncommand = \"true\"\ntimeout_secs = 1e30",
            "timeout_secs",
        ),
        (
            "[[hooks.pre_tool_use]]\ncommand = \"true\"\nmatcher = \"(unclosed\"",
            "matcher",
        ),
    ] {
        std::fs::write(
            env.dir.path().join("agent.toml"),
            format!("model = {model:?}\n{setting}\n"),
        )
        .unwrap();
        let out = env.run(&["run", "g"]);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{setting}: {err}");
        assert!(err.contains(key), "{setting}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{setting}: {err}");
        assert!(!env.store().exists(), "{setting}: nothing is written");
    }
    let out = env.run(&["run", "--timeout", "1e30", "--model", &model, "g"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
}

#[test]
fn usage_that_overflows_leaves_a_run_that_can_be_read_resumed_and_ended() {
    let env = Env::new();
    let huge = json!({"input_tokens": u64::MAX, "output_tokens": u64::MAX});
    let model = env.script(json!([
        {"tool_calls": [{"id": "c1", "name": "list_dir", "arguments": {}}], "usage": huge},
        {"tool_calls": [{"id": "c2", "name": "list_dir", "arguments": {}}], "usage": huge},
        {"request_approval": {"summary": "may I?"}, "usage": huge},
    ]));
    let out = env.run(&["run", "--json", "--model", &model, "g"]);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        v["usage"]["input_tokens"],
        u64::MAX,
        "saturated, not wrapped"
    );
    let id = v["run_id"].as_str().unwrap().to_owned();
    for args in [
        vec!["context", &id],
        vec!["show", &id],
        vec!["runs"],
        vec!["resume", "--json", &id],
    ] {
        let out = env.run(&args);
        assert_ne!(out.status.code(), Some(101), "{args:?}: {}", stderr(&out));
        assert!(out.status.code().is_some());
    }
    let out = env.run(&["cancel", &id]);
    assert_eq!(out.status.code(), Some(130), "{}", stderr(&out));
}

#[test]
fn a_reader_that_goes_away_is_not_a_panic() {
    let env = Env::new();
    let model = env.script(json!([
        {"tool_calls": [{"id": "c1", "name": "list_dir", "arguments": {}}]},
        {"final": "done"}
    ]));
    let out = env.run(&["run", "--json", "--model", &model, "g"]);
    let id = serde_json::from_slice::<Value>(&out.stdout).unwrap()["run_id"]
        .as_str()
        .unwrap()
        .to_owned();
    for args in [
        vec!["context", &id],
        vec!["show", &id],
        vec!["show", "--json", &id],
    ] {
        // The reader closes its end before the command writes a byte.
        let mut child = env
            .cmd()
            .args(&args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        drop(child.stdout.take());
        let out = child.wait_with_output().unwrap();
        assert_eq!(out.status.code(), Some(0), "{args:?}: {}", stderr(&out));
        assert!(stderr(&out).is_empty(), "{args:?}: {}", stderr(&out));
    }
}

#[test]
fn arguments_nested_too_deep_are_refused_and_the_log_stays_readable() {
    let env = Env::new();
    let deep: Value =
        serde_json::from_str(&format!("{}{}", "[".repeat(100), "]".repeat(100))).unwrap();
    let model = env.script(json!([
        {"tool_calls": [{"id": "c1", "name": "list_dir", "arguments": {"path": deep}}]},
        {"final": "flattened"}
    ]));
    let out = env.run(&["run", "--json", "--model", &model, "g"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let id = serde_json::from_slice::<Value>(&out.stdout).unwrap()["run_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let show = env.run(&["show", "--json", &id]);
    assert_eq!(show.status.code(), Some(0), "{}", stderr(&show));
    let text = String::from_utf8_lossy(&show.stdout);
    assert!(text.contains("levels deep; at most 32"), "{text}");
    let resumed = env.run(&["resume", "--json", &id]);
    assert_eq!(resumed.status.code(), Some(0), "{}", stderr(&resumed));
}

#[test]
fn a_damaged_store_is_an_error_naming_it_never_an_empty_list() {
    let env = Env::new();
    let model = env.script(json!([{"final": "ok"}]));
    for _ in 0..3 {
        let out = env.run(&["run", "--model", &model, "g"]);
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    }
    std::fs::OpenOptions::new()
        .write(true)
        .open(env.store().join("db"))
        .unwrap()
        .set_len(100)
        .unwrap();
    for args in [vec!["runs"], vec!["run", "--model", &model, "g"]] {
        let out = env.run(&args);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(
            err.contains("damaged") && err.contains(env.store().to_str().unwrap()),
            "{err}"
        );
        assert_eq!(err.trim().lines().count(), 1, "{err}");
    }
}

#[test]
fn a_run_waiting_for_an_answer_can_be_cancelled() {
    let env = Env::new();
    let model = env.script(json!([{"clarification": "which meeting?"}]));
    let out = env.run(&["run", "--json", "--model", &model, "g"]);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    let id = serde_json::from_slice::<Value>(&out.stdout).unwrap()["run_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let cancelled = env.run(&["cancel", "--json", &id]);
    assert_eq!(cancelled.status.code(), Some(130), "{}", stderr(&cancelled));
    let runs: Value = serde_json::from_slice(&env.run(&["runs", "--json"]).stdout).unwrap();
    assert_eq!(runs[0]["reason"], "cancelled");
    let again = env.run(&["cancel", &id]);
    assert_eq!(again.status.code(), Some(2), "{}", stderr(&again));
}
