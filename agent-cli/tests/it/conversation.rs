//! A person talks to runs from the command line (CONTRACT §7, §10): `agent resume RUN
//! MESSAGE` answers a clarification or follows up on an ended run, `--last` picks the
//! newest run, new limits come with a message, and `agent context --at N` shows the prompt
//! of any model call.

use serde_json::{Value, json};

use crate::{Env, stderr};

fn object(out: &std::process::Output) -> Value {
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)))
}

fn events(env: &Env, run: &str) -> Vec<Value> {
    let show = object(&env.run(&["show", "--json", run]));
    show["events"].as_array().unwrap().clone()
}

#[test]
fn an_answered_question_and_a_follow_up_continue_one_run() {
    let env = Env::new();
    std::fs::write(env.dir.path().join("notes.txt"), "hello\n").unwrap();
    let model = env.script(json!([
        {"clarification": "Which file?"},
        {"tool_calls": [{"id": "c1", "name": "read_file", "arguments": {"path": "notes.txt"}}]},
        {"final": "notes.txt says hello."},
        {"final": "It has one line."}
    ]));
    let out = env.run(&["run", "--json", "--model", &model, "summarize my notes"]);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    let v = object(&out);
    assert_eq!(v["reason"], "clarification_required");
    let run = v["run_id"].as_str().unwrap().to_owned();
    let text = env.run(&["run", "--model", &model, "another"]);
    assert!(
        stderr(&text).contains("agent resume"),
        "the pause says how to answer: {}",
        stderr(&text)
    );

    let out = env.run(&["resume", "--json", &run, "notes.txt please"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let v = object(&out);
    assert_eq!(v["answer"], "notes.txt says hello.");
    assert_eq!(
        (v["steps"].as_u64(), v["tool_calls"].as_u64()),
        (Some(3), Some(1))
    );

    // A follow-up on the finished run; the script answers the 4th model call of the run.
    let out = env.run(&["resume", "--json", &run, "how many lines?"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(object(&out)["answer"], "It has one line.");

    let log = events(&env, &run);
    let kinds: Vec<&str> = log.iter().map(|e| e["type"].as_str().unwrap()).collect();
    let said: Vec<&str> = log
        .iter()
        .filter(|e| e["type"] == "user_message")
        .map(|e| e["text"].as_str().unwrap())
        .collect();
    assert_eq!(said, ["notes.txt please", "how many lines?"]);
    assert_eq!(kinds.iter().filter(|k| **k == "run_ended").count(), 3);
    assert_eq!(kinds.last(), Some(&"run_ended"));

    // The prompt of the 4th call holds every message in its place, the newest last.
    let ctx = object(&env.run(&["context", "--json", &run, "--at", "4"]));
    let texts: Vec<String> = ctx["messages"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|m| m["parts"].as_array().unwrap().clone())
        .filter_map(|p| p["text"].as_str().map(str::to_owned))
        .collect();
    let at = |t: &str| texts.iter().position(|x| x == t).unwrap_or(usize::MAX);
    assert!(at("summarize my notes") < at("Which file?"), "{texts:?}");
    assert!(at("Which file?") < at("notes.txt please"), "{texts:?}");
    assert!(
        at("notes.txt please") < at("notes.txt says hello."),
        "{texts:?}"
    );
    assert_eq!(texts.last().map(String::as_str), Some("how many lines?"));
    // The 2nd call did not see the follow-up yet.
    let ctx2 = env.run(&["context", &run, "--at", "2"]);
    let shown = String::from_utf8_lossy(&ctx2.stdout);
    assert!(shown.contains("notes.txt please") && !shown.contains("how many lines?"));
    let out = env.run(&["context", &run, "--at", "9"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("made 4 model call(s)"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn last_picks_the_newest_run() {
    let env = Env::new();
    let model = env.script(json!([{"final": "first"}, {"final": "second"}]));
    let older = object(&env.run(&["run", "--json", "--model", &model, "one"]));
    let newer = object(&env.run(&["run", "--json", "--model", &model, "two"]));
    let out = env.run(&["resume", "--json", "--last", "and then?"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let v = object(&out);
    assert_eq!(v["run_id"], newer["run_id"]);
    assert_eq!(v["answer"], "second");
    let untouched = events(&env, older["run_id"].as_str().unwrap());
    assert!(untouched.iter().all(|e| e["type"] != "user_message"));
    let out = env.run(&["resume", "--last", "x", "y"]);
    assert_eq!(out.status.code(), Some(2));
}

/// `approve`, `deny`, `resolve`, `cancel` and `fork` take `--last` as `resume` does: the
/// newest run the person started, and never a run named beside it.
#[test]
fn the_commands_that_act_on_a_run_take_last_too() {
    let env = Env::new();
    let writing = |path: &str| {
        env.script(json!([
            {"tool_calls": [{"id": "w1", "name": "write_file", "arguments": {"path": path, "content": "x"}}]},
            {"final": "written"}
        ]))
    };
    let paused = |path: &str| {
        let out = env.run(&["run", "--json", "--model", &writing(path), "save"]);
        assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
        object(&out)["run_id"].as_str().unwrap().to_owned()
    };
    // The run as `agent runs --json` lists it.
    let listed = |id: &str| {
        let runs: Value = serde_json::from_slice(&env.run(&["runs", "--json"]).stdout).unwrap();
        let run = runs.as_array().unwrap().iter().find(|r| r["run_id"] == id);
        run.cloned().unwrap_or_default()
    };
    let older = paused("older.txt");

    let newer = paused("approved.txt");
    let both = env.run(&["approve", "--last", &newer]);
    assert_eq!(both.status.code(), Some(2), "{}", stderr(&both));
    let v = object(&env.run(&["approve", "--json", "--last"]));
    assert_eq!(
        (&v["run_id"], &v["reason"]),
        (&json!(newer), &json!("completed"))
    );
    assert!(env.dir.path().join("approved.txt").exists());

    let denied = paused("denied.txt");
    let v = object(&env.run(&["deny", "--json", "--last", "--reason", "no"]));
    assert_eq!(
        (&v["run_id"], &v["reason"]),
        (&json!(denied), &json!("completed"))
    );
    assert!(!env.dir.path().join("denied.txt").exists());

    let doubted = paused("resolved.txt");
    let out = env.run(&["resolve", "--last", "--call", "w1", "--as", "committed"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains(&doubted), "{}", stderr(&out));

    let v = object(&env.run(&["cancel", "--json", "--last"]));
    assert_eq!(v["run_id"], doubted.as_str(), "{v}");
    assert_eq!(listed(&doubted)["status"], "stopped");

    let out = env.run(&["fork", "--json", "--last", "--at", "1"]);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    let fork = object(&out)["run_id"].as_str().unwrap().to_owned();
    assert_eq!(listed(&fork)["forked_from"], format!("{doubted}@1"));

    // The first run was never touched: still waiting for its approval.
    assert_eq!(listed(&older)["status"], "paused");
    assert!(!env.dir.path().join("older.txt").exists());
}

/// A run's sub-agents are runs of their own, started after it: `--last` is still the run
/// the person started, never one of its children (a follow-up went into the child's log).
#[test]
fn last_is_never_a_sub_agent_s_run() {
    let env = Env::new();
    let script = json!({
        "turns": [
            {"tool_calls": [{"id": "d1", "name": "delegate_read", "arguments": {"goal": "look"}}]},
            {"final": "parent done"},
            {"final": "parent again"}
        ],
        "agents": {"look": {"turns": [{"final": "child done"}]}}
    });
    std::fs::write(env.dir.path().join("s.json"), script.to_string()).unwrap();
    let model = format!("script:{}", env.dir.path().join("s.json").display());
    let parent = object(&env.run(&["run", "--json", "--sub-agents", "--model", &model, "go"]));
    assert_eq!(parent["answer"], "parent done");
    let out = env.run(&["resume", "--json", "--last", "and then?"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let v = object(&out);
    assert_eq!(v["run_id"], parent["run_id"]);
    assert_eq!(v["answer"], "parent again");
    // The commands that only read take --last the same way.
    let shown = object(&env.run(&["show", "--json", "--last"]));
    assert_eq!(shown["run_id"], parent["run_id"]);
    let context = object(&env.run(&["context", "--json", "--last"]));
    assert_eq!(context["run_id"], parent["run_id"], "{context}");
    let out = env.run(&["report", "--last", "-o", "last.html"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let page = std::fs::read_to_string(env.dir.path().join("last.html")).unwrap();
    assert!(page.contains(parent["run_id"].as_str().unwrap()));
    let both = env.run(&["show", "--last", parent["run_id"].as_str().unwrap()]);
    assert_eq!(both.status.code(), Some(2));
}

#[test]
fn limits_count_per_exchange_and_a_message_can_raise_them() {
    let env = Env::new();
    let list = |id: &str| json!({"tool_calls": [{"id": id, "name": "list_dir", "arguments": {"path": id}}]});
    let model = env.script(json!([list("a"), list("b"), list("c"), list("d"), {"final": "done"}]));
    let out = env.run(&[
        "run",
        "--json",
        "--model",
        &model,
        "--max-steps",
        "2",
        "look",
    ]);
    assert_eq!(out.status.code(), Some(4));
    let run = object(&out)["run_id"].as_str().unwrap().to_owned();
    // The same limit again: two more model calls in the new exchange.
    let out = env.run(&["resume", "--json", &run, "go on"]);
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
    let v = object(&out);
    assert_eq!(
        (v["reason"].as_str(), v["steps"].as_u64()),
        (Some("max_steps"), Some(4))
    );
    // Raised with the message: recorded in the log, and the run completes.
    let out = env.run(&["resume", "--json", &run, "finish it", "--max-steps", "5"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let log = events(&env, &run);
    let last_message = log
        .iter()
        .rev()
        .find(|e| e["type"] == "user_message")
        .unwrap();
    assert_eq!(last_message["budget"]["max_steps"], 5);
    // Limits without a message have nothing to apply to.
    let out = env.run(&["resume", &run, "--max-steps", "9"]);
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(stderr(&out).lines().count(), 1, "{}", stderr(&out));
}

/// `--max-cost` and `--max-tokens` cap a run's spending from the command line, over the
/// whole run; a message raises a spent cap.
#[test]
fn the_cost_and_token_caps_come_from_flags_and_a_message_raises_them() {
    let env = Env::new();
    let paid = |id: &str| {
        json!({"tool_calls": [{"id": id, "name": "list_dir", "arguments": {"path": "."}}],
            "usage": {"input_tokens": 100, "output_tokens": 10, "cost_usd": 0.3}})
    };
    let model = env.script(json!([paid("a"), paid("b"), paid("c"), {"final": "done"}]));
    let out = env.run(&[
        "run",
        "--json",
        "--model",
        &model,
        "--max-cost",
        "0.5",
        "look",
    ]);
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
    let v = object(&out);
    assert_eq!(
        (v["reason"].as_str(), v["steps"].as_u64()),
        (Some("cost_budget_exceeded"), Some(2)),
        "$0.60 after two calls passes $0.50"
    );
    let run = v["run_id"].as_str().unwrap().to_owned();
    // Tokens count over the whole run too: 220 used, and the last prompt alone had 100, so
    // with 300 allowed no call is made (the next prompt has at least as many: this
    // invocation makes it as the run's were made); with 330, one more.
    let out = env.run(&[
        "resume",
        "--json",
        &run,
        "go on",
        "--max-cost",
        "5",
        "--max-tokens",
        "300",
    ]);
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
    let v = object(&out);
    assert_eq!(v["steps"], 2);
    assert!(
        v["message"]
            .as_str()
            .is_some_and(|m| m.contains("220 tokens used, and the next call's prompt alone")),
        "{v}"
    );
    let out = env.run(&["resume", "--json", &run, "go on", "--max-tokens", "330"]);
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
    assert_eq!(object(&out)["steps"], 3);
    let out = env.run(&["resume", "--json", &run, "finish", "--max-tokens", "10000"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(object(&out)["answer"], "done");
    let out = env.run(&["run", "--model", &model, "--max-cost", "nan", "look"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("--max-cost NaN"), "{}", stderr(&out));
}

#[test]
fn a_message_to_a_run_waiting_for_approval_is_refused_and_writes_nothing() {
    let env = Env::new();
    let model = crate::write_script(&env);
    let out = env.run(&["run", "--json", "--model", &model, "save"]);
    assert_eq!(out.status.code(), Some(3));
    let run = object(&out)["run_id"].as_str().unwrap().to_owned();
    let before = events(&env, &run).len();
    let out = env.run(&["resume", &run, "just do it"]);
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains(&format!("agent approve {run}")), "{err}");
    let out = env.run(&["resume", &run, "   "]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("empty"), "{}", stderr(&out));
    assert_eq!(events(&env, &run).len(), before, "nothing was written");
}

/// `agent run` of a run whose command waits for a file `go`, with `extra` options, once
/// that command is dispatched: the process and the run's id.
fn running_until_go(env: &Env, extra: &[&str]) -> (std::process::Child, String) {
    let model = env.script(json!([
        {"tool_calls": [{"id": "c1", "name": "shell", "arguments": {
            "command": "while [ ! -e go ]; do sleep 0.05; done"}}]},
        {"final": "went"}
    ]));
    let child = env
        .cmd()
        .args(["run", "--json", "--allow", "shell", "--model", &model])
        .args(extra)
        .arg("wait")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let id = crate::first_run_once(env, "its command is dispatched", |id| {
        events(env, id)
            .iter()
            .any(|e| e["type"] == "effect_dispatched")
    });
    (child, id)
}

/// `agent resume --json RUN "also say hello"` of the live run `id`, and once it said it
/// handed the message over, `go` made (the run's command ends): what it printed, and what
/// it said after that.
fn told_then_go(env: &Env, id: &str) -> (std::process::Output, String) {
    told_this_then_go(env, id, "also say hello")
}

/// The same with the message `text`.
fn told_this_then_go(env: &Env, id: &str, text: &str) -> (std::process::Output, String) {
    let (told, mut said) = crate::handed(env, &["--json", id, text]);
    std::fs::write(env.dir.path().join("go"), "").unwrap();
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut said, &mut rest).unwrap();
    (told.wait_with_output().unwrap(), rest)
}

/// A secret in a message to a live run is redacted before it leaves the sender: the run
/// commits the note without it, and the sender knows the note it reads as its own.
#[test]
fn a_secret_in_a_message_to_a_live_run_is_redacted_and_the_message_read() {
    let env = Env::new();
    let (run, id) = running_until_go(&env, &[]);
    let key = format!("AKIA{}", "IOSFODNN7EXAMPLE");
    let (told, rest) = told_this_then_go(&env, &id, &format!("use {key} for the bucket"));
    assert_eq!(told.status.code(), Some(0), "{rest}");
    assert_eq!(object(&told), json!({"run_id": id, "status": "read"}));
    let out = run.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let events = events(&env, &id);
    let note = events.iter().find(|e| e["type"] == "user_note").unwrap();
    let text = note["text"].as_str().unwrap();
    assert!(
        text.starts_with("use ") && text.ends_with(" for the bucket"),
        "{text}"
    );
    assert!(!text.contains(&key), "{text}");
}

/// `agent resume RUN MESSAGE` of a run another process drives hands the message to that
/// process, which commits it before the run's next model call: the model reads it after
/// the results of the calls it ran, and the run goes on under the same limits.
#[test]
fn a_message_to_a_live_run_is_read_before_its_next_model_call() {
    let env = Env::new();
    let (run, id) = running_until_go(&env, &[]);
    let (told, rest) = told_then_go(&env, &id);
    assert_eq!(told.status.code(), Some(0), "{rest}");
    assert_eq!(object(&told), json!({"run_id": id, "status": "read"}));
    assert!(
        rest.contains(&format!("run {id} read your message")),
        "{rest}"
    );
    let out = run.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(object(&out)["answer"], "went");

    let kinds: Vec<String> = events(&env, &id)
        .iter()
        .map(|e| e["type"].as_str().unwrap().to_owned())
        .collect();
    let at = |kind: &str| kinds.iter().position(|k| k == kind).unwrap();
    assert!(at("tool_finished") < at("user_note"), "{kinds:?}");
    assert_eq!(
        kinds.iter().filter(|k| *k == "decision_proposed").count(),
        2
    );
    // The second model call's prompt: the command's result, then the message.
    let prompt = String::from_utf8(env.run(&["context", &id, "--at", "2"]).stdout).unwrap();
    let result = prompt.find("[tool result c1").unwrap();
    let note = prompt.find("also say hello").unwrap();
    assert!(result < note, "{prompt}");
}

/// A live run that stops before its next model call (here at its step limit) never reads
/// the message: the sender is told so, exit 2, and how to send it as a follow-up.
#[test]
fn a_message_a_live_run_stopped_before_reading_is_said_unread() {
    let env = Env::new();
    let (run, id) = running_until_go(&env, &["--max-steps", "1"]);
    let (out, rest) = told_then_go(&env, &id);
    assert_eq!(out.status.code(), Some(2), "{rest}");
    assert_eq!(object(&out), json!({"run_id": id, "status": "unread"}));
    assert!(
        rest.contains(&format!(
            "run {id} stopped before it read your message; `agent resume {id} MESSAGE`"
        )),
        "{rest}"
    );
    let out = run.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
    assert!(
        !events(&env, &id).iter().any(|e| e["type"] == "user_note"),
        "nothing was written"
    );
}

/// A message too long for a live run is refused before it is handed over: one line saying
/// the limit, exit 2, nothing written; the run goes on.
#[test]
fn a_message_too_long_for_a_live_run_is_refused_and_nothing_is_written() {
    let env = Env::new();
    let (run, id) = running_until_go(&env, &[]);
    let long = "x".repeat(70 * 1024);
    let out = env.run(&["resume", &id, &long]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("a live run takes at most 64 KiB") && err.trim().lines().count() == 1,
        "{err}"
    );
    std::fs::write(env.dir.path().join("go"), "").unwrap();
    let out = run.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(!events(&env, &id).iter().any(|e| e["type"] == "user_note"));
}
