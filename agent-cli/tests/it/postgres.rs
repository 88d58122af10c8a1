//! Runs kept in PostgreSQL (`--store postgres://…` or `AGENT_STORE`), on a throwaway
//! cluster: every command reads and writes them there.

use agent_store::testing::Cluster;
use serde_json::Value;

use crate::{Env, repo, stderr, stdout};

#[test]
fn runs_live_in_postgres_and_every_command_reads_them() {
    let cluster = Cluster::start();
    let url = cluster.url();
    let env = Env::new();
    let root = repo();
    let script = format!(
        "script:{}",
        root.join("examples/meeting/script.json").display()
    );
    let ws = root.join("examples/meeting/workspace");
    let run = |store_flag: bool, goal: &str| {
        let mut cmd = env.bare();
        if store_flag {
            cmd.arg("--store").arg(&url);
        } else {
            cmd.env("AGENT_STORE", &url);
        }
        cmd.args(["run", "--json", "--model", &script, "--workspace"])
            .arg(&ws)
            .arg(goal)
            .output()
            .unwrap()
    };
    let first = run(true, "When and where is the launch meeting?");
    assert_eq!(first.status.code(), Some(0), "{}", stderr(&first));
    let first: Value = serde_json::from_slice(&first.stdout).unwrap();
    assert_eq!(first["reason"], "completed");
    // The environment names the same database.
    let second = run(false, "Again: when and where?");
    assert_eq!(second.status.code(), Some(0), "{}", stderr(&second));
    assert!(
        !env.dir.path().join(".agent").exists(),
        "nothing was written beside the project"
    );

    let agent = |args: &[&str]| {
        env.bare()
            .arg("--store")
            .arg(&url)
            .args(args)
            .output()
            .unwrap()
    };
    let listed = agent(&["runs", "--json"]);
    assert_eq!(listed.status.code(), Some(0), "{}", stderr(&listed));
    let runs: Value = serde_json::from_slice(&listed.stdout).unwrap();
    let runs = runs.as_array().unwrap();
    assert_eq!(runs.len(), 2);
    assert!(runs.iter().all(|r| r["status"] == "finished"), "{runs:?}");
    let id = first["run_id"].as_str().unwrap();
    let shown = agent(&["show", id]);
    assert_eq!(shown.status.code(), Some(0), "{}", stderr(&shown));
    let timeline = stdout(&shown);
    assert!(
        timeline.lines().next().unwrap().contains("run_started"),
        "{timeline}"
    );
    assert!(
        timeline.lines().last().unwrap().contains("run_ended"),
        "{timeline}"
    );
    let context = agent(&["context", id]);
    assert_eq!(context.status.code(), Some(0), "{}", stderr(&context));
    assert!(stdout(&context).contains("launch meeting"));
    // Unknown runs are reported as such, and no password is ever printed.
    let unknown = agent(&["show", "nope"]);
    assert_eq!(unknown.status.code(), Some(2));
    assert!(
        stderr(&unknown).contains("no run \"nope\""),
        "{}",
        stderr(&unknown)
    );
}

#[test]
fn a_database_that_is_not_there_is_a_failure_that_hides_the_password() {
    let env = Env::new();
    let dir = tempfile::tempdir().unwrap();
    // Written in pieces: the repository's own text goes through the redactor in a test.
    let password = "s3cr3t-pw";
    let url = format!(
        "postgresql://agent:{password}@localhost/db?host={}",
        dir.path().display()
    );
    let out = env
        .bare()
        .arg("--store")
        .arg(&url)
        .args(["runs"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(5), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(err.contains("cannot connect to PostgreSQL"), "{err}");
    assert!(!err.contains(password), "{err}");
}
