//! write_file, edit_file, glob, grep and shell on real directories and processes.

use agent_core::{ErrorKind, sha256_hex};
use agent_tools::Typed;
use agent_tools::builtin::{EditFile, Glob, Grep, Shell, WriteFile};
use serde_json::json;

use crate::builtins::call;

#[tokio::test]
async fn write_file_creates_parents_and_reports_the_content_hash() {
    let dir = tempfile::tempdir().unwrap();
    let out = call(
        &Typed(WriteFile),
        dir.path(),
        json!({"path": "a/b/c.txt", "content": "hi\n"}),
    )
    .await
    .unwrap();
    assert_eq!(
        std::fs::read_to_string(dir.path().join("a/b/c.txt")).unwrap(),
        "hi\n"
    );
    assert!(out.contains(&sha256_hex(b"hi\n")), "{out}");
    // Replacing leaves no temporary file behind.
    call(
        &Typed(WriteFile),
        dir.path(),
        json!({"path": "a/b/c.txt", "content": "bye"}),
    )
    .await
    .unwrap();
    assert_eq!(
        std::fs::read_to_string(dir.path().join("a/b/c.txt")).unwrap(),
        "bye"
    );
    assert_eq!(
        std::fs::read_dir(dir.path().join("a/b")).unwrap().count(),
        1
    );
}

#[tokio::test]
async fn writes_are_confined_by_every_route() {
    let outer = tempfile::tempdir().unwrap();
    let root = outer.path().join("ws");
    std::fs::create_dir(&root).unwrap();
    std::fs::create_dir(outer.path().join("elsewhere")).unwrap();
    #[cfg(unix)]
    {
        std::os::unix::fs::symlink(outer.path().join("elsewhere"), root.join("out")).unwrap();
        std::os::unix::fs::symlink(outer.path().join("target.txt"), root.join("dangling.txt"))
            .unwrap();
    }
    let escapes = [
        "../x.txt".to_owned(),
        "a/../../x.txt".to_owned(),
        outer.path().join("x.txt").display().to_string(),
        "out/x.txt".to_owned(),
        "out/new/dir/x.txt".to_owned(),
        "dangling.txt".to_owned(),
    ];
    for path in escapes {
        let err = call(
            &Typed(WriteFile),
            &root,
            json!({"path": path, "content": "x"}),
        )
        .await
        .expect_err(&path);
        assert_eq!(err.kind, ErrorKind::Denied, "{path}: {err}");
        let err = call(
            &Typed(EditFile),
            &root,
            json!({"path": path, "old": "a", "new": "b"}),
        )
        .await
        .expect_err(&path);
        assert!(
            matches!(err.kind, ErrorKind::Denied | ErrorKind::ExecutionFailed),
            "{path}: {err}"
        );
    }
    assert_eq!(
        std::fs::read_dir(outer.path().join("elsewhere"))
            .unwrap()
            .count(),
        0
    );
    assert!(!outer.path().join("x.txt").exists() && !outer.path().join("target.txt").exists());
}

#[tokio::test]
async fn edit_file_replaces_one_unique_occurrence_or_says_why_not() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("f.rs"), "fn a() {}\nfn b() {}\nfn a() {}\n").unwrap();
    let edit = |old: &str, new: &str| {
        let root = dir.path().to_path_buf();
        let args = json!({"path": "f.rs", "old": old, "new": new});
        async move { call(&Typed(EditFile), &root, args).await }
    };
    let err = edit("fn a() {}", "x").await.unwrap_err();
    assert!(err.message.contains("occurs 2 times"), "{err}");
    let err = edit("fn zz", "x").await.unwrap_err();
    assert!(err.message.contains("not found"), "{err}");
    let err = edit("", "x").await.unwrap_err();
    assert_eq!(err.kind, ErrorKind::InvalidArguments);
    let ok = edit("fn b() {}", "fn b() { 1 }").await.unwrap();
    assert!(ok.contains("line 2"), "{ok}");
    assert_eq!(
        std::fs::read_to_string(dir.path().join("f.rs")).unwrap(),
        "fn a() {}\nfn b() { 1 }\nfn a() {}\n"
    );
}

fn tree() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path();
    std::fs::create_dir_all(p.join("src/deep")).unwrap();
    std::fs::create_dir_all(p.join("target")).unwrap();
    std::fs::write(p.join(".gitignore"), "target/\n").unwrap();
    std::fs::write(p.join("src/lib.rs"), "pub fn answer() -> u32 { 42 }\n").unwrap();
    std::fs::write(
        p.join("src/deep/mod.rs"),
        "// TODO: answer again\nfn x() {}\n",
    )
    .unwrap();
    std::fs::write(p.join("target/out.rs"), "fn answer() {}\n").unwrap();
    std::fs::write(p.join("README.md"), "The answer is here.\n").unwrap();
    std::fs::write(p.join("blob.bin"), [b'a', 0, b'n', b's']).unwrap();
    dir
}

#[tokio::test]
async fn glob_matches_paths_and_respects_gitignore() {
    let dir = tree();
    let out = call(&Typed(Glob), dir.path(), json!({"pattern": "**/*.rs"}))
        .await
        .unwrap();
    assert_eq!(out, "src/deep/mod.rs\nsrc/lib.rs");
    let out = call(&Typed(Glob), dir.path(), json!({"pattern": "src/*.rs"}))
        .await
        .unwrap();
    assert_eq!(out, "src/lib.rs", "* stays within a directory");
    let out = call(&Typed(Glob), dir.path(), json!({"pattern": "*.nothing"}))
        .await
        .unwrap();
    assert!(out.starts_with("no file matches"));
    let err = call(&Typed(Glob), dir.path(), json!({"pattern": "[z-a]"}))
        .await
        .unwrap_err();
    assert_eq!(err.kind, ErrorKind::InvalidArguments);
}

#[tokio::test]
async fn grep_finds_lines_skips_ignored_and_binary_files() {
    let dir = tree();
    let out = call(&Typed(Grep), dir.path(), json!({"pattern": "answer"}))
        .await
        .unwrap();
    assert_eq!(
        out,
        "README.md:1: The answer is here.\nsrc/deep/mod.rs:1: // TODO: answer again\nsrc/lib.rs:1: pub fn answer() -> u32 { 42 }"
    );
    let out = call(
        &Typed(Grep),
        dir.path(),
        json!({"pattern": "fn \\w+", "path": "src/deep"}),
    )
    .await
    .unwrap();
    assert_eq!(out, "src/deep/mod.rs:2: fn x() {}");
    let err = call(&Typed(Grep), dir.path(), json!({"pattern": "("}))
        .await
        .unwrap_err();
    assert_eq!(err.kind, ErrorKind::InvalidArguments);
    let err = call(
        &Typed(Grep),
        dir.path(),
        json!({"pattern": "x", "path": "../"}),
    )
    .await
    .unwrap_err();
    assert_eq!(err.kind, ErrorKind::Denied);
}

#[tokio::test]
async fn shell_runs_in_the_workspace_and_reports_the_exit_code() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("here.txt"), "").unwrap();
    let out = call(
        &Typed(Shell::default()),
        dir.path(),
        json!({"command": "ls; echo oops >&2"}),
    )
    .await
    .unwrap();
    assert_eq!(
        out,
        "exit code: 0\n--- stdout ---\nhere.txt\n--- stderr ---\noops\n"
    );
    let err = call(
        &Typed(Shell::default()),
        dir.path(),
        json!({"command": "echo failing; exit 3"}),
    )
    .await
    .unwrap_err();
    assert_eq!(err.kind, ErrorKind::ExecutionFailed);
    assert!(
        err.message
            .starts_with("exit code: 3\n--- stdout ---\nfailing"),
        "{err}"
    );
}

#[tokio::test]
async fn shell_output_keeps_its_head_and_tail() {
    let dir = tempfile::tempdir().unwrap();
    let out = call(
        &Typed(Shell::default()),
        dir.path(),
        json!({"command": "echo FIRST; for i in $(seq 1 20000); do echo line $i; done; echo LAST"}),
    )
    .await
    .unwrap();
    assert!(
        out.contains("FIRST") && out.ends_with("LAST\n"),
        "{}",
        &out[out.len() - 50..]
    );
    assert!(
        out.contains("bytes cut ...]"),
        "the middle is cut and counted"
    );
    assert!(out.chars().count() < 30_200);
}

/// Whether a process is gone (or only a zombie waiting to be reaped).
#[cfg(target_os = "linux")]
pub fn gone(pid: &str) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit(')')
            .next()
            .is_some_and(|rest| rest.trim_start().starts_with('Z')),
    }
}

/// Polls until `pid` is gone; a bound, not a wait for a fixed time.
#[cfg(target_os = "linux")]
pub fn eventually_gone(pid: &str) -> bool {
    for _ in 0..500 {
        if gone(pid) {
            return true;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    false
}

#[cfg(target_os = "linux")]
#[tokio::test]
async fn a_timeout_kills_the_whole_process_group() {
    let dir = tempfile::tempdir().unwrap();
    let err = call(
        &Typed(Shell::default()),
        dir.path(),
        json!({"command": "sleep 300 & echo $! > child.pid; wait", "timeout_ms": 300}),
    )
    .await
    .unwrap_err();
    assert_eq!(err.kind, ErrorKind::Timeout);
    // Killed midway, it may have done part of its work: not to be run again blindly.
    assert!(!err.retryable, "{err:?}");
    assert!(err.message.contains("check its effect"), "{err:?}");
    let pid = std::fs::read_to_string(dir.path().join("child.pid")).unwrap();
    assert!(
        eventually_gone(pid.trim()),
        "the background sleep {pid} survived"
    );
}

#[cfg(target_os = "linux")]
#[tokio::test]
async fn cancel_kills_the_whole_process_group() {
    let dir = tempfile::tempdir().unwrap();
    let ctx = crate::builtins::ctx(dir.path());
    let cancel = ctx.cancel.clone();
    let root = dir.path().to_path_buf();
    let tool = Typed(Shell::default());
    let run = agent_tools::Tool::call(
        &tool,
        json!({"command": "sleep 300 & echo $! > child.pid; wait"}),
        &ctx,
    );
    let watcher = async move {
        // Cancel once the child has written its pid.
        let pid_file = root.join("child.pid");
        loop {
            if std::fs::read_to_string(&pid_file).is_ok_and(|s| s.ends_with('\n')) {
                break;
            }
            tokio::task::yield_now().await;
        }
        cancel.cancel();
    };
    let (result, ()) = tokio::join!(run, watcher);
    let err = result.unwrap_err();
    assert_eq!(err.kind, ErrorKind::Cancelled);
    assert!(
        !err.retryable && err.message.contains("check its effect"),
        "{err:?}"
    );
    let pid = std::fs::read_to_string(dir.path().join("child.pid")).unwrap();
    assert!(
        eventually_gone(pid.trim()),
        "the background sleep {pid} survived"
    );
}

/// `edit_file` against targets that exist outside the workspace, holding the text it
/// would replace: every route is denied and every target stays as it was. (An unconfined
/// edit would succeed here; a missing target could not tell the two apart.)
#[tokio::test]
async fn edits_of_existing_files_outside_are_denied_and_leave_them_unchanged() {
    let outer = tempfile::tempdir().unwrap();
    let root = outer.path().join("ws");
    std::fs::create_dir(&root).unwrap();
    std::fs::create_dir(outer.path().join("elsewhere")).unwrap();
    let outside = [
        outer.path().join("x.txt"),
        outer.path().join("elsewhere/y.txt"),
    ];
    for file in &outside {
        std::fs::write(file, "a secret a\n").unwrap();
    }
    std::os::unix::fs::symlink(outer.path().join("elsewhere"), root.join("out")).unwrap();
    std::os::unix::fs::symlink(outer.path().join("x.txt"), root.join("link.txt")).unwrap();
    let routes = [
        "../x.txt".to_owned(),
        "a/../../x.txt".to_owned(),
        outer.path().join("x.txt").display().to_string(),
        "out/y.txt".to_owned(),
        "link.txt".to_owned(),
    ];
    for path in routes {
        let err = call(
            &Typed(EditFile),
            &root,
            json!({"path": path, "old": "secret", "new": "EDITED"}),
        )
        .await
        .expect_err(&path);
        assert_eq!(err.kind, ErrorKind::Denied, "{path}: {err}");
    }
    for file in &outside {
        assert_eq!(std::fs::read_to_string(file).unwrap(), "a secret a\n");
    }
}

/// `glob` lists what is inside the workspace only: a link to a directory outside is not
/// walked into, and a pattern cannot climb out.
#[tokio::test]
async fn glob_stays_inside_the_workspace() {
    let outer = tempfile::tempdir().unwrap();
    let root = outer.path().join("ws");
    std::fs::create_dir_all(root.join("src")).unwrap();
    std::fs::write(root.join("src/in.rs"), "").unwrap();
    std::fs::create_dir(outer.path().join("elsewhere")).unwrap();
    std::fs::write(outer.path().join("elsewhere/secret.rs"), "").unwrap();
    std::fs::write(outer.path().join("top.rs"), "").unwrap();
    std::os::unix::fs::symlink(outer.path().join("elsewhere"), root.join("out")).unwrap();
    for pattern in ["**/*.rs", "../*.rs", "out/*.rs", "**"] {
        let out = call(&Typed(Glob), &root, json!({ "pattern": pattern }))
            .await
            .unwrap();
        assert!(
            !out.contains("secret.rs") && !out.contains("top.rs"),
            "{pattern}: {out}"
        );
    }
    let all = call(&Typed(Glob), &root, json!({"pattern": "**/*.rs"}))
        .await
        .unwrap();
    assert_eq!(all, "src/in.rs");
}

/// Set in the copy of this test binary that [`shell_commands_are_not_given_secrets`]
/// starts with secrets in its environment.
const SECRETS_CHILD: &str = "AGENT_TOOLS_TEST_SECRETS_CHILD";

/// A command is not given the variables named like secrets, unless they are passed. This
/// process cannot change its own environment, so it runs this test again in a copy of
/// itself started with secrets in its environment; that copy runs the commands.
#[tokio::test]
async fn shell_commands_are_not_given_secrets() {
    const LINE: &str =
        r#"printf '%s|%s|%s\n' "${MY_API_KEY-unset}" "${GH_TOKEN-unset}" "$PLAIN_VALUE""#;
    if std::env::var_os(SECRETS_CHILD).is_none() {
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "more_builtins::shell_commands_are_not_given_secrets",
                "--nocapture",
            ])
            .env(SECRETS_CHILD, "1")
            .env("MY_API_KEY", "key-0123456789")
            .env("GH_TOKEN", "tok-0123456789")
            .env("PLAIN_VALUE", "visible")
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{stdout}");
        assert!(stdout.contains("1 passed"), "{stdout}");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let command = json!({ "command": LINE });
    let out = call(&Typed(Shell::default()), dir.path(), command.clone())
        .await
        .unwrap();
    assert_eq!(out, "exit code: 0\n--- stdout ---\nunset|unset|visible\n");
    let out = call(&Typed(Shell::passing(["GH_TOKEN"])), dir.path(), command)
        .await
        .unwrap();
    assert_eq!(
        out,
        "exit code: 0\n--- stdout ---\nunset|tok-0123456789|visible\n"
    );
}

/// A sandboxed shell in a program that offers no watcher (this test binary calls no
/// `watch_with`) cannot make its sandbox: each command is refused, saying why, and nothing
/// runs; the probe a program makes before a run says the same. Never run without it.
#[tokio::test]
async fn a_sandbox_that_cannot_be_made_is_never_left_out() {
    let dir = tempfile::tempdir().unwrap();
    let sandbox = agent_tools::Sandbox::new();
    let shell = Shell::default().sandboxed(sandbox.clone());
    let told = agent_tools::TypedTool::description(&shell);
    assert!(
        told.contains("sandbox") && told.contains("no network"),
        "the model is told: {told}"
    );
    let wider = Shell::default().sandboxed(sandbox.clone().writing("/cache").with_network(true));
    let told = agent_tools::TypedTool::description(&wider);
    assert!(
        told.contains("workspace, /cache and /tmp") && !told.contains("no network"),
        "{told}"
    );
    let err = call(
        &Typed(shell),
        dir.path(),
        json!({"command": "echo ran > ran.txt"}),
    )
    .await
    .unwrap_err();
    assert_eq!(err.kind, ErrorKind::ExecutionFailed);
    assert!(
        err.message
            .starts_with("the command was not run: its sandbox cannot be made")
            && err.message.contains("watch_with"),
        "{}",
        err.message
    );
    assert!(!dir.path().join("ran.txt").exists());
    let workspace = agent_tools::Workspace::new(dir.path()).unwrap();
    let probed = sandbox.probe(&workspace).await.unwrap_err();
    assert!(probed.contains("watch_with"), "{probed}");
    // Nor an MCP server that asks for one: it is not started.
    let config: agent_tools::mcp::McpConfig = serde_json::from_value(json!({"mcpServers": {
        "s": {"command": "sh", "args": ["-c", "echo ran > ran.txt"], "sandbox": true}
    }}))
    .unwrap();
    let timeout = std::time::Duration::from_secs(30);
    let refused = agent_tools::mcp::connect_reporting(&config, dir.path(), timeout)
        .await
        .err()
        .unwrap()
        .to_string();
    assert!(
        refused.contains("sandbox cannot be made") && refused.contains("watch_with"),
        "{refused}"
    );
    assert!(!dir.path().join("ran.txt").exists());
}
