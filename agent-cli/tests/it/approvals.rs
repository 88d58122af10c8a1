//! Approvals and settings on the command line: asking, approving, denying, allow and deny
//! flags, and agent.toml (policy, hooks, budgets) once trusted.

use super::*;

#[test]
fn a_write_asks_then_approve_runs_it_and_completes() {
    let env = Env::new();
    let model = write_script(&env);
    let out = env.run(&["run", "--json", "--model", &model, "save the answer"]);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["status"], "paused");
    assert_eq!(v["reason"], "approval_required");
    assert_eq!(v["pending"][0]["call_id"], "w1");
    assert_eq!(v["pending"][0]["tool"], "write_file");
    assert_eq!(v["pending"][0]["arguments"]["path"], "out/result.txt");
    assert!(
        !env.dir.path().join("out/result.txt").exists(),
        "nothing ran before approval"
    );
    let id = v["run_id"].as_str().unwrap();

    let wrong = env.run(&["approve", id, "--call", "nope"]);
    assert_eq!(wrong.status.code(), Some(2));
    assert!(
        stderr(&wrong).contains("call nope is not pending"),
        "{}",
        stderr(&wrong)
    );

    let done = env.run(&["approve", "--json", id]);
    assert_eq!(done.status.code(), Some(0), "{}", stderr(&done));
    let v: Value = serde_json::from_slice(&done.stdout).unwrap();
    assert_eq!(
        (v["reason"].as_str(), v["tool_calls"].as_u64()),
        (Some("completed"), Some(1))
    );
    assert_eq!(
        std::fs::read_to_string(env.dir.path().join("out/result.txt")).unwrap(),
        "42\n"
    );
}

#[test]
fn deny_tells_the_model_and_nothing_is_written() {
    let env = Env::new();
    let model = write_script(&env);
    let out = env.run(&["run", "--json", "--model", &model, "g"]);
    let id = serde_json::from_slice::<Value>(&out.stdout).unwrap()["run_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let done = env.run(&["deny", "--json", &id, "--reason", "not in this repo"]);
    assert_eq!(done.status.code(), Some(0), "{}", stderr(&done));
    assert!(!env.dir.path().join("out").exists());
    let show = stdout(&env.run(&["show", &id]));
    assert!(
        show.contains("approval_denied") && show.contains("not in this repo"),
        "{show}"
    );
}

#[test]
fn allow_and_deny_flags_decide_without_asking() {
    let env = Env::new();
    let model = write_script(&env);
    let out = env.run(&[
        "run",
        "--json",
        "--model",
        &model,
        "--allow",
        "write_file(out/**)",
        "g",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(env.dir.path().join("out/result.txt").exists());

    let env = Env::new();
    let model = env.script(json!([
        {"tool_calls": [{"id": "s1", "name": "shell", "arguments": {"command": "rm -rf notes"}}]},
        {"tool_calls": [{"id": "s2", "name": "shell", "arguments": {"command": "rm -rf other"}}]},
        {"tool_calls": [{"id": "s3", "name": "shell", "arguments": {"command": "rm -rf again"}}]},
        {"final": "x"}
    ]));
    let out = env.run(&[
        "run",
        "--json",
        "--model",
        &model,
        "--allow",
        "shell",
        "--deny",
        "shell(rm *)",
        "g",
    ]);
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["reason"], "policy_violation");
    assert_eq!(v["tool_calls"], 0);
}

#[test]
fn agent_toml_sets_policy_hooks_and_budgets_once_trusted() {
    let env = Env::new();
    let model = env.script(json!([
        {"tool_calls": [{"id": "s1", "name": "shell", "arguments": {"command": "touch made.txt"}}]},
        {"tool_calls": [{"id": "s2", "name": "shell", "arguments": {"command": "touch no.txt"}}]},
        {"final": "done"}
    ]));
    let hook = env.dir.path().join("gate.sh");
    std::fs::write(
        &hook,
        "#!/bin/sh\nif grep -q no.txt; then echo 'no.txt is reserved' >&2; exit 2; fi\n",
    )
    .unwrap();
    let toml = format!(
        "model = {model:?}\nmax_steps = 5\n[policy]\nallow = [\"shell(touch *)\"]\n\
         [[hooks.pre_tool_use]]\ncommand = \"sh {}\"\nmatcher = \"shell\"\n",
        hook.display()
    );
    std::fs::write(env.dir.path().join("agent.toml"), &toml).unwrap();
    // A project file that brings rules and commands is not used before a person trusts it.
    let out = env.run(&["run", "--json", "g"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("not trusted") && err.contains("agent trust"),
        "{err}"
    );
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(!env.store().exists(), "nothing is written");
    let trusted = env.run(&["trust"]);
    assert_eq!(trusted.status.code(), Some(0), "{}", stderr(&trusted));
    assert!(stdout(&trusted).contains("agent.toml"));

    let out = env.run(&["run", "--json", "g"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(env.dir.path().join("made.txt").exists());
    assert!(!env.dir.path().join("no.txt").exists());
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let show = stdout(&env.run(&["show", v["run_id"].as_str().unwrap()]));
    assert!(show.contains("no.txt is reserved"), "{show}");

    // A changed file must be trusted again.
    std::fs::write(
        env.dir.path().join("agent.toml"),
        toml.replace("touch *", "*"),
    )
    .unwrap();
    let out = env.run(&["run", "--json", "g"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    // Named on the command line, the file is the person's choice.
    let out = env.run(&["--config", "agent.toml", "run", "--json", "g"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
}

#[test]
fn a_project_file_that_only_narrows_needs_no_trust() {
    let env = Env::new();
    let model = env.script(json!([{"final": "ok"}]));
    std::fs::write(
        env.dir.path().join("agent.toml"),
        format!("model = {model:?}\nmax_steps = 3\n[policy]\ndeny = [\"shell(rm *)\"]\n"),
    )
    .unwrap();
    let out = env.run(&["run", "--json", "g"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
}

#[test]
fn bad_settings_are_one_line_exit_2() {
    let env = Env::new();
    let model = env.script(json!([{"final": "x"}]));
    std::fs::write(env.dir.path().join("bad.toml"), "max_stepz = 3\n").unwrap();
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            vec!["--config", "bad.toml", "run", "--model", &model, "g"],
            "line 1: unknown field `max_stepz`",
        ),
        (
            vec!["--config", "missing.toml", "run", "--model", &model, "g"],
            "--config missing.toml",
        ),
        (
            vec!["run", "--model", &model, "--allow", "shell(", "g"],
            "policy rule \"shell(\"",
        ),
        (
            vec!["run", "--model", &model, "--mcp-config", "none.json", "g"],
            "MCP config none.json",
        ),
        (vec!["run", "g"], "no model"),
    ];
    for (args, expected) in cases {
        let out = env.run(&args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
        let err = stderr(&out);
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(err.contains(expected), "{args:?}: {err}");
        assert!(!env.store().exists());
    }
}

/// A write through a link waits for a person, who is shown where it leads. Before the
/// approval (another `agent` process), the link is pointed elsewhere: the call is refused
/// and nothing is written in either place; the model is told why.
#[test]
fn an_approved_write_is_refused_if_its_path_leads_elsewhere_since_it_was_asked_about() {
    let env = Env::new();
    let ws = env.dir.path();
    std::fs::create_dir_all(ws.join("work")).unwrap();
    std::fs::create_dir_all(ws.join("src")).unwrap();
    std::os::unix::fs::symlink("work", ws.join("docs")).unwrap();
    let model = env.script(json!([
        {"tool_calls": [{"id": "w1", "name": "write_file",
                         "arguments": {"path": "docs/new.txt", "content": "X"}}]},
        {"final": "done"}
    ]));
    let out = env.run(&["run", "--json", "--model", &model, "write it"]);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["pending"][0]["path"], "work/new.txt");
    let id = v["run_id"].as_str().unwrap().to_owned();
    let asked = stdout(&env.run(&["show", &id]));
    assert!(
        asked.contains("path=\"docs/new.txt\" (leads to work/new.txt)"),
        "{asked}"
    );

    std::fs::remove_file(ws.join("docs")).unwrap();
    std::os::unix::fs::symlink("src", ws.join("docs")).unwrap();
    let done = env.run(&["approve", "--json", &id]);
    assert_eq!(done.status.code(), Some(0), "{}", stderr(&done));
    assert!(!ws.join("src/new.txt").exists());
    assert!(!ws.join("work/new.txt").exists());
    let show = stdout(&env.run(&["show", &id]));
    assert!(
        show.contains("now leads to src/new.txt, not to work/new.txt"),
        "{show}"
    );
}

/// A run started with `--workspace` and approved later from the directory its store is in
/// (no `--workspace` given) works where it started: the write lands there, and the person
/// is told. A workspace named when approving wins; one that is gone is refused, with
/// nothing run.
#[test]
fn a_run_is_taken_up_in_the_workspace_it_started_in() {
    let env = Env::new();
    let model = write_script(&env);
    let ws = env.dir.path().join("project");
    let other = env.dir.path().join("elsewhere");
    std::fs::create_dir_all(&ws).unwrap();
    std::fs::create_dir_all(&other).unwrap();
    let ws_arg = ws.to_str().unwrap();
    let paused = |env: &Env| {
        let out = env.run(&[
            "run",
            "--json",
            "--model",
            &model,
            "--workspace",
            ws_arg,
            "save",
        ]);
        assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        v["run_id"].as_str().unwrap().to_owned()
    };
    let result = |dir: &Path| dir.join("out/result.txt");

    let id = paused(&env);
    let done = env.run(&["approve", "--json", &id]);
    assert_eq!(done.status.code(), Some(0), "{}", stderr(&done));
    assert_eq!(std::fs::read_to_string(result(&ws)).unwrap(), "42\n");
    assert!(
        !result(env.dir.path()).exists(),
        "nothing written where agent was started"
    );
    let said = stderr(&done);
    let canonical = std::fs::canonicalize(&ws).unwrap();
    assert!(
        said.contains(&format!(
            "works in {}, where it started",
            canonical.display()
        )),
        "{said}"
    );

    let id = paused(&env);
    let named = env.run(&[
        "approve",
        "--json",
        "--workspace",
        other.to_str().unwrap(),
        &id,
    ]);
    assert_eq!(named.status.code(), Some(0), "{}", stderr(&named));
    assert_eq!(std::fs::read_to_string(result(&other)).unwrap(), "42\n");
    assert!(!stderr(&named).contains("where it started"));

    let id = paused(&env);
    std::fs::remove_dir_all(&ws).unwrap();
    let gone = env.run(&["approve", &id]);
    assert_eq!(gone.status.code(), Some(2), "{}", stderr(&gone));
    assert!(
        stderr(&gone).contains("which is not a directory here; pass --workspace DIR"),
        "{}",
        stderr(&gone)
    );
    assert_eq!(
        event_types(&env, &id).last().map(String::as_str),
        Some("approval_requested"),
        "nothing ran"
    );
}
