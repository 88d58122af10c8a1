//! `agent fork`: a run from another's history, its lineage in `runs` and `show`.

use serde_json::{Value, json};

use super::{Env, stderr, stdout};

fn json_of(out: &std::process::Output) -> Value {
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}{}", stdout(out), stderr(out)))
}

#[test]
fn a_fork_goes_on_from_the_same_prompt_and_shows_its_lineage() {
    let env = Env::new();
    let parent = env.script(json!([
        {"tool_calls": [{"id": "s1", "name": "shell", "arguments": {"command": "echo parent >> effects.txt"}}]},
        {"tool_calls": [{"id": "r1", "name": "read_file", "arguments": {"path": "effects.txt"}}]},
        {"tool_calls": [{"id": "r2", "name": "read_file", "arguments": {"path": "effects.txt"}}]},
        {"final": "parent done"}
    ]));
    let out = env.run(&[
        "run", "--json", "--allow", "shell", "--model", &parent, "note it",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let parent_id = json_of(&out)["run_id"].as_str().unwrap().to_owned();
    // A run started after the parent, before the fork.
    let between = env.dir.path().join("between.json");
    std::fs::write(
        &between,
        json!({"turns": [{"final": "between"}]}).to_string(),
    )
    .unwrap();
    let out = env.run(&[
        "run",
        "--model",
        &format!("script:{}", between.display()),
        "b",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));

    let other = env.dir.path().join("other.json");
    let turns = json!({"turns": [
        {"final": "inherited"},
        {"final": "inherited"},
        {"tool_calls": [{"id": "s2", "name": "shell", "arguments": {"command": "echo fork >> effects.txt"}}]},
        {"final": "fork done"}
    ]});
    std::fs::write(&other, turns.to_string()).unwrap();
    let model = format!("script:{}", other.display());
    let out = env.run(&[
        "fork", &parent_id, "--at", "3", "--json", "--allow", "shell", "--model", &model,
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let v = json_of(&out);
    assert_eq!(v["answer"], "fork done");
    let fork_id = v["run_id"].as_str().unwrap().to_owned();
    assert_ne!(fork_id, parent_id);
    // The newest run is the fork just made, though its log begins with its parent's.
    let last = json_of(&env.run(&["show", "--json", "--last"]));
    assert_eq!(last["events"][0]["run_id"], fork_id.as_str());
    // The inherited shell call did not run again; the fork's own did, once.
    let effects = std::fs::read_to_string(env.dir.path().join("effects.txt")).unwrap();
    assert_eq!(effects, "parent\nfork\n");

    // Call 3 of the fork got exactly the prompt call 3 of the parent got.
    let prompt = |id: &str| {
        let v = json_of(&env.run(&["context", "--json", id, "--at", "3"]));
        json!([v["system"], v["messages"], v["tools"]])
    };
    assert_eq!(prompt(&fork_id), prompt(&parent_id));
    let text = |id: &str| stdout(&env.run(&["context", id, "--at", "3"]));
    assert_eq!(text(&fork_id), text(&parent_id));

    let runs = json_of(&env.run(&["runs", "--json"]));
    let fork = runs
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["run_id"] == fork_id.as_str())
        .unwrap();
    assert_eq!(fork["forked_from"], format!("{parent_id}@3"));
    let table = stdout(&env.run(&["runs"]));
    assert!(table.contains(&format!("fork of {parent_id}@3")), "{table}");
    let shown = stdout(&env.run(&["show", &fork_id]));
    let first = shown.lines().next().unwrap();
    assert!(
        first.contains(&format!("forked from {parent_id} before its model call 3")),
        "{first}"
    );
}

#[test]
fn a_fork_where_the_run_never_was_is_refused_with_nothing_written() {
    let env = Env::new();
    let model = env.script(json!([{"final": "done"}]));
    let out = env.run(&["run", "--json", "--model", &model, "g"]);
    let id = json_of(&out)["run_id"].as_str().unwrap().to_owned();
    for at in ["0", "2"] {
        let out = env.run(&["fork", &id, "--at", at, "--model", &model]);
        assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
        assert!(
            stderr(&out).contains("made 1 model call(s); --at takes 1 to 1"),
            "{}",
            stderr(&out)
        );
    }
    let out = env.run(&["fork", "NOPE", "--at", "1", "--model", &model]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let runs = json_of(&env.run(&["runs", "--json"]));
    assert_eq!(runs.as_array().unwrap().len(), 1);
}

/// A fork's token budget and its line in `agent runs` count the calls it made itself: its
/// inherited calls were its parent's spending. `agent show` says both.
#[test]
fn a_fork_s_budget_and_listing_count_its_own_calls() {
    let env = Env::new();
    let list = |id: &str, input: u64| {
        json!({"tool_calls": [{"id": id, "name": "list_dir", "arguments": {}}],
               "usage": {"input_tokens": input, "output_tokens": 1000}})
    };
    let script = env.script(json!([
        list("c1", 40_000),
        list("c2", 41_000),
        {"final": "three", "usage": {"input_tokens": 42_000, "output_tokens": 100}}
    ]));
    let out = env.run(&["run", "--json", "--model", &script, "go"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let parent = json_of(&out)["run_id"].as_str().unwrap().to_owned();
    let out = env.run(&[
        "fork",
        &parent,
        "--at",
        "3",
        "--json",
        "--max-tokens",
        "50000",
        "--model",
        &script,
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let fork = json_of(&out)["run_id"].as_str().unwrap().to_owned();
    let runs = json_of(&env.run(&["runs", "--json"]));
    let listed = |id: &str| {
        runs.as_array()
            .unwrap()
            .iter()
            .find(|r| r["run_id"] == id)
            .map(|r| r["usage"]["input_tokens"].clone())
    };
    assert_eq!(
        (listed(&parent), listed(&fork)),
        (Some(json!(123_000)), Some(json!(42_000)))
    );
    // The usage line goes to standard error, after the timeline.
    let shown = stderr(&env.run(&["show", &fork]));
    assert!(
        shown.ends_with(
            "usage: 42000 in, 100 out (the fork's own; before it, its parent's calls used \
             81000 in, 2000 out)\n"
        ),
        "{shown}"
    );
}
