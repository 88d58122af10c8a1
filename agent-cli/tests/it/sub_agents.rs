//! Sub-agents through the `agent` command: a crash in the middle of a child resumed, and
//! the child shown folded in its parent's timeline.

use serde_json::{Value, json};

use super::{Env, stderr, stdout};

fn json_of(out: &std::process::Output) -> Value {
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}{}", stdout(out), stderr(out)))
}

#[test]
fn a_crash_in_the_middle_of_a_child_resumes_both_and_its_write_happens_once() {
    let env = Env::new();
    let turns = json!({
        "turns": [
            {"tool_calls": [{"id": "d1", "name": "delegate", "arguments": {"goal": "write the report"}}]},
            {"final": "the report is written"}
        ],
        "agents": {"write the report": {"turns": [
            {"tool_calls": [{"id": "w1", "name": "write_file", "arguments": {"path": "report.txt", "content": "R\n"}}]},
            {"final": "report.txt holds R"}
        ]}}
    });
    let path = env.dir.path().join("parent.json");
    std::fs::write(&path, turns.to_string()).unwrap();
    let model = format!("script:{}", path.display());
    // The child's write runs, then the process dies before its result is committed.
    let allow = [
        "--allow",
        "delegate",
        "--allow",
        "write_file",
        "--sub-agents",
    ];
    let out = env
        .cmd()
        .env("FAILPOINTS", "after_tools=return")
        .args(["run", "--json", "--model", &model])
        .args(allow)
        .arg("report")
        .output()
        .unwrap();
    assert!(!out.status.success(), "the crash point aborted the process");
    let runs = json_of(&env.run(&["runs", "--json"]));
    let runs = runs.as_array().unwrap();
    assert_eq!(runs.len(), 2, "{runs:?}");
    let parent = runs.iter().find(|r| r.get("parent").is_none()).unwrap();
    let child = runs.iter().find(|r| r.get("parent").is_some()).unwrap();
    let (parent_id, child_id) = (
        parent["run_id"].as_str().unwrap().to_owned(),
        child["run_id"].as_str().unwrap().to_owned(),
    );
    assert_eq!(child["parent"], format!("{parent_id}/d1"));
    assert_eq!(child["status"], "running", "the child was interrupted");

    // Resuming the parent continues the child (its write is found done, not repeated).
    let out = env.run(&[
        "resume",
        "--json",
        &parent_id,
        "--model",
        &model,
        "--allow",
        "delegate",
        "--allow",
        "write_file",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let v = json_of(&out);
    assert_eq!(v["answer"], "the report is written");
    assert_eq!(
        std::fs::read_to_string(env.dir.path().join("report.txt")).unwrap(),
        "R\n"
    );
    let child_events = json_of(&env.run(&["show", "--json", &child_id]))["events"]
        .as_array()
        .unwrap()
        .clone();
    let count = |t: &str| child_events.iter().filter(|e| e["type"] == t).count();
    assert_eq!(count("effect_dispatched"), 1, "{child_events:#?}");
    assert_eq!(count("effect_reconciled"), 1);
    assert_eq!(count("run_ended"), 1);
    let reconciled = child_events
        .iter()
        .find(|e| e["type"] == "effect_reconciled")
        .unwrap();
    assert!(reconciled["finding"]["applied"].is_object(), "{reconciled}");

    // The parent's timeline shows the child folded under the call; show CHILD shows it all.
    let shown = stdout(&env.run(&["show", &parent_id]));
    assert!(
        shown.contains(&format!(
            "└ sub-agent run {child_id}: completed: report.txt holds R"
        )),
        "{shown}"
    );
    let folded = json_of(&env.run(&["show", "--json", &parent_id]));
    assert_eq!(folded["children"][0]["run_id"], child_id.as_str());
    assert_eq!(folded["children"][0]["reason"], "completed");
    let whole = stdout(&env.run(&["show", &child_id]));
    assert!(whole.contains("write_file"), "{whole}");
    let table = stdout(&env.run(&["runs"]));
    assert!(
        table.contains(&format!("sub-agent of {parent_id}/d1")),
        "{table}"
    );
}

/// `agent run --json` of a run whose sub-agent's write waits for approval, the run's final
/// answer `answer` once it has the sub-agent's: its output (the run paused, exit 3) and
/// its model.
fn paused_on_its_sub_agent(env: &Env, answer: &str) -> (std::process::Output, String) {
    let turns = json!({
        "turns": [
            {"tool_calls": [{"id": "d1", "name": "delegate", "arguments": {"goal": "save the note"}}]},
            {"final": answer}
        ],
        "agents": {"save the note": {"turns": [
            {"tool_calls": [{"id": "w1", "name": "write_file", "arguments": {"path": "note.txt", "content": "hi\n"}}]},
            {"final": "saved"}
        ]}}
    });
    let (out, model) = super::run_with_sub_agents(env, &turns, "note it");
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    (out, model)
}

#[test]
fn agent_approve_parent_lists_and_answers_a_childs_approval() {
    let env = Env::new();
    let (out, model) = paused_on_its_sub_agent(&env, "done");
    let v = json_of(&out);
    assert_eq!(v["reason"], "approval_required");
    assert_eq!(v["pending"][0]["call_id"], "w1");
    assert_eq!(v["pending"][0]["tool"], "write_file");
    let id = v["run_id"].as_str().unwrap().to_owned();
    let runs = json_of(&env.run(&["runs", "--json"]));
    let parent = runs
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["run_id"] == id.as_str())
        .unwrap()
        .clone();
    assert_eq!(parent["status"], "paused", "{parent}");
    // Listed as it is answered: waiting for approval of its sub-agent's call.
    assert_eq!(parent["reason"], "approval_required", "{parent}");
    assert_eq!(parent["pending"], 1, "{parent}");
    assert!(parent.get("in_doubt").is_none(), "{parent}");

    // No --sub-agents here: the run recorded them. One place for the person: the parent.
    let out = env.run(&[
        "approve", "--json", &id, "--call", "w1", "--allow", "delegate", "--model", &model,
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(json_of(&out)["answer"], "done");
    assert_eq!(
        std::fs::read_to_string(env.dir.path().join("note.txt")).unwrap(),
        "hi\n"
    );
}

/// `agent cancel` of the sub-agent a paused run waits on: the run no longer waits for a
/// person about that call; `agent resume` goes on with the sub-agent's end, and the child
/// did nothing more.
#[test]
fn cancelling_the_sub_agent_a_run_waits_on_lets_the_run_go_on() {
    let env = Env::new();
    let (out, model) = paused_on_its_sub_agent(&env, "done without it");
    let id = json_of(&out)["run_id"].as_str().unwrap().to_owned();
    let runs = json_of(&env.run(&["runs", "--json"]));
    let child = runs[1]["run_id"].as_str().unwrap().to_owned();
    assert_eq!(runs[1]["parent"], format!("{id}/d1"));

    let cancelled = env.run(&["cancel", &child]);
    assert_eq!(cancelled.status.code(), Some(130), "{}", stderr(&cancelled));
    assert!(
        stderr(&cancelled).contains(&format!(
            "run {id} waited on this sub-agent; `agent resume {id}` goes on with its end"
        )),
        "{}",
        stderr(&cancelled)
    );
    let runs = json_of(&env.run(&["runs", "--json"]));
    assert_eq!(runs[0]["pending"], 0, "{}", runs[0]);
    assert_ne!(runs[0]["status"], "paused", "{}", runs[0]);

    // Its sub-agent was allowed when it started: read again, it is not asked about.
    let resumed = env.run(&["resume", "--json", &id, "--model", &model]);
    assert_eq!(resumed.status.code(), Some(0), "{}", stderr(&resumed));
    assert_eq!(json_of(&resumed)["answer"], "done without it");
    assert!(!env.dir.path().join("note.txt").exists());
    let shown = json_of(&env.run(&["show", "--json", &id]));
    let results: Vec<&Value> = shown["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["type"] == "tool_finished")
        .collect();
    assert_eq!(results.len(), 1, "{results:?}");
    assert_eq!(results[0]["result"]["error"]["kind"], "cancelled");
    assert_eq!(
        json_of(&env.run(&["show", "--json", &child]))["events"]
            .as_array()
            .unwrap()
            .last()
            .unwrap()["outcome"]["reason"],
        "cancelled"
    );
}

/// `agent approve CHILD` of the sub-agent a paused run waits on (rather than of the run):
/// the sub-agent goes on to its end, and the run goes on with its answer when resumed.
#[test]
fn approving_the_sub_agent_itself_lets_the_run_go_on() {
    let env = Env::new();
    let (out, model) = paused_on_its_sub_agent(&env, "done");
    let id = json_of(&out)["run_id"].as_str().unwrap().to_owned();
    let child = json_of(&env.run(&["runs", "--json"]))[1]["run_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let approved = env.run(&["approve", "--json", &child, "--model", &model]);
    assert_eq!(approved.status.code(), Some(0), "{}", stderr(&approved));
    assert_eq!(json_of(&approved)["answer"], "saved");
    assert!(
        stderr(&approved).contains(&format!(
            "run {id} waited on this sub-agent; `agent resume {id}` goes on with its end"
        )),
        "{}",
        stderr(&approved)
    );
    let resumed = env.run(&["resume", "--json", &id, "--model", &model]);
    assert_eq!(resumed.status.code(), Some(0), "{}", stderr(&resumed));
    assert_eq!(json_of(&resumed)["answer"], "done");
    assert_eq!(
        std::fs::read_to_string(env.dir.path().join("note.txt")).unwrap(),
        "hi\n"
    );
}

/// The usage `agent show` totals under a timeline is the run's as `--json` reports it:
/// its sub-agents' model calls included, as its budgets count them.
#[test]
fn the_usage_shown_under_a_timeline_counts_the_sub_agents() {
    let env = Env::new();
    let used = |input: u64, output: u64| json!({"input_tokens": input, "output_tokens": output});
    let turns = json!({
        "turns": [
            {"tool_calls": [{"id": "d1", "name": "delegate_read", "arguments": {"goal": "look"}}],
             "usage": used(100, 10)},
            {"final": "parent done", "usage": used(200, 20)}
        ],
        "agents": {"look": {"turns": [{"final": "child done", "usage": used(1000, 100)}]}}
    });
    let path = env.dir.path().join("parent.json");
    std::fs::write(&path, turns.to_string()).unwrap();
    let model = format!("script:{}", path.display());
    let v = json_of(&env.run(&["run", "--json", "--sub-agents", "--model", &model, "go"]));
    assert_eq!(
        (&v["usage"]["input_tokens"], &v["usage"]["output_tokens"]),
        (&json!(1300), &json!(130))
    );
    let shown = env.run(&["show", v["run_id"].as_str().unwrap()]);
    assert!(
        stderr(&shown).contains("usage: 1300 in, 130 out"),
        "{}",
        stderr(&shown)
    );
    // `agent runs` says the same of each run: the parent's whole, the child's its own.
    let runs = json_of(&env.run(&["runs", "--json"]));
    let used: Vec<(Value, Value)> = runs
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["usage"]["input_tokens"].clone(),
                r["usage"]["output_tokens"].clone(),
            )
        })
        .collect();
    assert_eq!(
        used,
        [(json!(1300), json!(130)), (json!(1000), json!(100))],
        "{runs}"
    );
    assert!(!runs.to_string().contains("sub_agent_usage"), "{runs}");
    let table = stdout(&env.run(&["runs"]));
    assert!(
        table.contains("TOKENS") && table.contains(" 1430 "),
        "{table}"
    );
}

/// A fork of a run started with sub-agents has them too, as `agent resume` and `agent chat`
/// of the run do, without `--sub-agents` again: a delegate call it makes anew starts a
/// child of its own.
#[test]
fn a_fork_of_a_run_with_sub_agents_keeps_them() {
    let env = Env::new();
    let turns = json!({
        "turns": [
            {"tool_calls": [{"id": "d1", "name": "delegate", "arguments": {"goal": "look"}}]},
            {"final": "looked"}
        ],
        "agents": {"look": {"turns": [{"final": "seen"}]}}
    });
    let (out, _) = super::run_with_sub_agents(&env, &turns, "look around");
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let parent = json_of(&out)["run_id"].as_str().unwrap().to_owned();

    let out = env.run(&[
        "fork", "--json", &parent, "--at", "1", "--allow", "delegate",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let fork = json_of(&out);
    assert_eq!(fork["answer"], "looked");
    assert_eq!(fork["tool_calls"], 1, "{fork}");
    let fork_id = fork["run_id"].as_str().unwrap();
    let runs = json_of(&env.run(&["runs", "--json"]));
    let child = runs
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["parent"] == format!("{fork_id}/d1"))
        .unwrap_or_else(|| panic!("the fork's own child: {runs}"));
    assert_eq!(child["reason"], "completed");
}

/// `agent show --follow` of a run shows what its sub-agent does while it does it, under
/// the call it answers, before the run's own entries that follow.
#[test]
fn following_a_run_shows_its_sub_agent_at_work() {
    use std::io::BufRead;
    let env = Env::new();
    let path = env.dir.path().join("delegates.json");
    let script = json!({
        "turns": [
            {"tool_calls": [{"id": "d1", "name": "delegate", "arguments": {"goal": "wait for go"}}]},
            {"final": "went"}
        ],
        "agents": {"wait for go": {"turns": [
            {"tool_calls": [{"id": "c1", "name": "shell", "arguments": {
                "command": "while [ ! -e go ]; do sleep 0.05; done"}}]},
            {"final": "waited"}
        ]}}
    });
    std::fs::write(&path, script.to_string()).unwrap();
    let model = format!("script:{}", path.display());
    let mut run = env
        .cmd()
        .args([
            "run",
            "--sub-agents",
            "--allow",
            "delegate",
            "--allow",
            "shell",
        ])
        .args(["--model", &model, "wait"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // Its first entry is there once `agent runs` lists it.
    let id = super::first_run_once(&env, "the run started", |_| true);
    let mut follow = env
        .cmd()
        .args(["show", "--follow", &id])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufReader::new(follow.stdout.take().unwrap()).lines();
    let mut seen = Vec::new();
    // Should the command never be shown, the run is let finish after a minute, and the
    // test fails instead of waiting for ever.
    let go = env.dir.path().join("go");
    let deadline = go.clone();
    std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_secs(60));
        let _ = std::fs::write(deadline, "");
    });
    // The sub-agent's command is shown while it runs (it ends only once `go` is there).
    for line in lines.by_ref() {
        let line = line.unwrap();
        let dispatched = line.contains("│ d1") && line.contains("effect_dispatched   c1 shell");
        seen.push(line);
        if dispatched {
            break;
        }
    }
    assert!(
        seen.last()
            .is_some_and(|l| l.contains("effect_dispatched   c1 shell")),
        "{seen:#?}"
    );
    std::fs::write(&go, "").unwrap();
    seen.extend(lines.map(Result::unwrap));
    assert!(follow.wait().unwrap().success());
    assert!(run.wait().unwrap().success());
    let at = |what: &str| {
        seen.iter()
            .position(|l| l.contains(what))
            .unwrap_or_else(|| panic!("{what}: {seen:#?}"))
    };
    assert!(at("│ d1    1") < at("│ d1    6"));
    assert!(at("│ d1    6") < at("sub_agent_finished"), "{seen:#?}");
    assert!(at("sub_agent_finished") < at("final went"), "{seen:#?}");
    // Each of the sub-agent's entries shown once.
    assert_eq!(
        seen.iter().filter(|l| l.contains("│ d1")).count(),
        6,
        "{seen:#?}"
    );
}
