//! The trust boundary, attacked: planted links, aliases of denied paths, compound shell
//! commands, and races between the check and the use. Every case is a row of a table; the
//! spellings of paths are also generated (property test) against a tree with links inside
//! and outside.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use agent_core::{ErrorKind, Risk, ScheduledCall, ToolCall, ToolOutcome, Verdict};
use agent_tools::{Action, CommandHook, Gateway, HookEvent, Policy, Workspace};
use proptest::prelude::*;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

mod shell;

/// `outer/ws` is the workspace; `outer/outside` is what must never be touched.
struct Tree {
    _outer: tempfile::TempDir,
    ws: PathBuf,
    outside: PathBuf,
}

fn tree() -> Tree {
    let outer = tempfile::tempdir().unwrap();
    let ws = outer.path().join("ws");
    let outside = outer.path().join("outside");
    for dir in ["secrets", "notes", "src", "a/b", "c"] {
        std::fs::create_dir_all(ws.join(dir)).unwrap();
    }
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::write(ws.join("secrets/key.txt"), "KEY\n").unwrap();
    std::fs::write(ws.join("notes/a.txt"), "note\n").unwrap();
    std::fs::write(ws.join("src/lib.rs"), "fn x() {}\n").unwrap();
    std::fs::write(ws.join("Cargo.toml"), "[package]\n").unwrap();
    std::fs::write(ws.join("a/b/secret.txt"), "SECRET\n").unwrap();
    std::fs::write(ws.join("c/plain.txt"), "plain\n").unwrap();
    std::fs::write(outside.join("bashrc"), "OUTSIDE\n").unwrap();
    let link = |target: &str, at: &str| std::os::unix::fs::symlink(target, ws.join(at)).unwrap();
    link("secrets", "s");
    link("../Cargo.toml", "src/manifest");
    link("../outside", "out");
    link("a", "l1");
    link("a/b", "l3");
    link("../a/b/secret.txt", "c/to_secret");
    std::os::unix::fs::symlink(&outside, ws.join("abs_out")).unwrap();
    let ws = ws.canonicalize().unwrap();
    Tree {
        _outer: outer,
        ws,
        outside,
    }
}

fn gateway(ws: &Path, rules: &[(Action, &str)]) -> Gateway {
    let mut policy = Policy::new();
    for (action, rule) in rules {
        policy.add(*action, rule).unwrap();
    }
    Gateway::with_builtins(Workspace::new(ws).unwrap())
        .unwrap()
        .with_policy(policy)
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

async fn verdict(g: &Gateway, tool: &str, args: Value) -> Verdict {
    let call = ToolCall::new("c1", tool, args);
    g.check("run-1", &[call]).await.remove(0).1
}

async fn run(g: &Gateway, tool: &str, args: Value) -> Result<String, agent_core::ToolError> {
    let risk = if matches!(tool, "write_file" | "edit_file") {
        Risk::Write
    } else {
        Risk::Read
    };
    let call = ScheduledCall {
        call: ToolCall::new("c1", tool, args),
        risk,
        effect_key: None,
        path: None,
    };
    let mut results = g
        .execute("run-1", vec![vec![call]], &CancellationToken::new())
        .await;
    match results.remove(0).outcome {
        ToolOutcome::Output(text) => Ok(text),
        ToolOutcome::Error(e) => Err(e),
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum V {
    Allow,
    Ask,
    Deny,
}

fn kind(v: &Verdict) -> V {
    match v {
        Verdict::Allow => V::Allow,
        Verdict::Ask { .. } => V::Ask,
        Verdict::Deny { .. } => V::Deny,
        other => panic!("unexpected verdict {other:?}"),
    }
}

#[test]
fn a_planted_temp_file_link_is_never_written_through() {
    let t = tree();
    let target = t.outside.join("bashrc");
    // What the old writer used as its temporary name, planted by a cloned repository.
    std::os::unix::fs::symlink("../outside/bashrc", t.ws.join(".config.json.agent-tmp")).unwrap();
    std::os::unix::fs::symlink("../outside/bashrc", t.ws.join(".lib.rs.agent-tmp")).unwrap();
    let g = gateway(&t.ws, &[]);
    rt().block_on(async {
        run(
            &g,
            "write_file",
            json!({"path": "config.json", "content": "{}"}),
        )
        .await
        .unwrap();
        run(
            &g,
            "edit_file",
            json!({"path": "src/lib.rs", "old": "fn x", "new": "fn y"}),
        )
        .await
        .unwrap();
    });
    assert_eq!(std::fs::read_to_string(&target).unwrap(), "OUTSIDE\n");
    let written = t.ws.join("config.json");
    assert!(!written.symlink_metadata().unwrap().is_symlink());
    assert_eq!(std::fs::read_to_string(written).unwrap(), "{}");
    assert_eq!(
        std::fs::read_to_string(t.ws.join("src/lib.rs")).unwrap(),
        "fn y() {}\n"
    );
}

#[test]
fn writes_through_links_out_are_refused_and_links_inside_write_their_target() {
    let t = tree();
    let g = gateway(&t.ws, &[]);
    rt().block_on(async {
        for path in ["out/bashrc", "abs_out/bashrc", "out/new.txt", "out"] {
            let err = run(&g, "write_file", json!({"path": path, "content": "X"}))
                .await
                .unwrap_err();
            assert_eq!(err.kind, ErrorKind::Denied, "{path}: {err:?}");
        }
        // A link inside the workspace: the file it names is written, the link stays.
        run(
            &g,
            "write_file",
            json!({"path": "src/manifest", "content": "[x]\n"}),
        )
        .await
        .unwrap();
    });
    assert_eq!(
        std::fs::read_to_string(t.outside.join("bashrc")).unwrap(),
        "OUTSIDE\n"
    );
    assert!(!t.outside.join("new.txt").exists());
    assert_eq!(
        std::fs::read_to_string(t.ws.join("Cargo.toml")).unwrap(),
        "[x]\n"
    );
    assert!(
        t.ws.join("src/manifest")
            .symlink_metadata()
            .unwrap()
            .is_symlink()
    );
}

/// What a sandbox keeps read-only of the names protected everywhere: each one at any
/// depth, in any case, a submodule's `.git` file as a repository's `.git` directory, a
/// link for what it leads to; not a link that leads nowhere, nor one that leads to the
/// workspace or a directory holding it (the whole workspace would be made read-only);
/// nothing beneath a `.git`, nothing through a link to a directory. A name protected
/// nowhere finds nothing.
#[test]
fn the_places_named_as_protected_everywhere_are_found_at_any_depth() {
    let t = tree();
    for dir in [
        ".git/modules/sub",
        "vendor/lib/.git",
        "src/deep/er/.GIT",
        "sub",
    ] {
        std::fs::create_dir_all(t.ws.join(dir)).unwrap();
    }
    std::fs::write(t.ws.join("sub/.git"), "gitdir: ../.git/modules/sub\n").unwrap();
    for (target, at) in [
        ("../vendor/lib/.git", "notes/.git"),
        ("..", "c/.git"),
        ("/", "a/.git"),
        ("../nowhere", "src/.git"),
    ] {
        std::os::unix::fs::symlink(target, t.ws.join(at)).unwrap();
    }
    let ws = Workspace::new(&t.ws).unwrap();
    assert!(ws.protected_found().is_empty());
    let ws = ws.protect_everywhere(".git", "a git directory");
    let found: Vec<PathBuf> = [
        ".git",
        "notes/.git",
        "src/deep/er/.GIT",
        "sub/.git",
        "vendor/lib/.git",
    ]
    .iter()
    .map(|place| t.ws.join(place))
    .collect();
    assert_eq!(ws.protected_found(), found);
    // The clones share what was read, and find the same.
    assert_eq!(ws.clone().protected_found(), found);
    // A clone that protects one more name finds that too.
    let more = ws.clone().protect_everywhere("lib.rs", "a library");
    let mut with_lib = found.clone();
    with_lib.push(t.ws.join("src/lib.rs"));
    with_lib.sort();
    assert_eq!(more.protected_found(), with_lib);
    assert_eq!(ws.protected_found(), found);
}

/// Makes `dir` what git takes for a bare repository's directory: `head` as its `HEAD`,
/// beside `objects` and `refs`.
fn bare(dir: &std::path::Path, head: &str) {
    std::fs::create_dir_all(dir.join("objects")).unwrap();
    std::fs::create_dir_all(dir.join("refs")).unwrap();
    std::fs::write(dir.join("HEAD"), head).unwrap();
}

/// A directory git takes for a bare repository (one `git init --bare` made, or `src`
/// turned into one by hand) is found at any depth, and no file tool changes it; a `HEAD`
/// that names nothing, or without `objects` and `refs`, is no repository; a directory
/// named `HEAD` is walked into; a pipe as `HEAD` is not opened; the root is never one.
#[test]
fn bare_repositories_are_found_at_any_depth_and_changed_by_no_tool() {
    let t = tree();
    // Made by git: a bare repository, and a repository whose git directory lies apart
    // (`--separate-git-dir`: its `.git` is a file that points there).
    for args in [
        &["init", "-q", "--bare", "backups/site.git"][..],
        &["init", "-q", "--separate-git-dir=meta", "checkout"],
    ] {
        let made = std::process::Command::new("git")
            .args(args)
            .current_dir(&t.ws)
            .status()
            .unwrap();
        assert!(made.success());
    }
    bare(&t.ws.join("src"), "ref: refs/heads/main\n");
    bare(&t.ws.join("a/b"), &format!("{}\n", "0a".repeat(20)));
    bare(&t.ws.join("notes"), "hello\n");
    std::fs::create_dir_all(t.ws.join("c/refs")).unwrap();
    std::fs::write(t.ws.join("c/HEAD"), "ref: refs/heads/main\n").unwrap();
    std::fs::create_dir_all(t.ws.join("linked/objects")).unwrap();
    std::fs::create_dir_all(t.ws.join("linked/refs")).unwrap();
    std::os::unix::fs::symlink("refs/heads/main", t.ws.join("linked/HEAD")).unwrap();
    std::fs::create_dir_all(t.ws.join("wt")).unwrap();
    std::fs::write(t.ws.join("wt/HEAD"), "ref: refs/heads/wt\n").unwrap();
    std::fs::write(t.ws.join("wt/commondir"), "../src\n").unwrap();
    std::fs::create_dir_all(t.ws.join("HEAD/deeper/.git")).unwrap();
    std::fs::create_dir_all(t.ws.join("piped/objects")).unwrap();
    std::fs::create_dir_all(t.ws.join("piped/refs")).unwrap();
    nix::unistd::mkfifo(&t.ws.join("piped/HEAD"), nix::sys::stat::Mode::S_IRWXU).unwrap();
    let ws = Workspace::new(&t.ws)
        .unwrap()
        .protect_everywhere(".git", "a git directory");
    let without = ws.protected_found();
    assert_eq!(
        without,
        [t.ws.join("HEAD/deeper/.git"), t.ws.join("checkout/.git")]
    );
    let ws = ws.protect_bare_repositories("a bare repository");
    let found = places(
        &t,
        &[
            "HEAD/deeper/.git",
            "a/b",
            "backups/site.git",
            "checkout/.git",
            "linked",
            "meta",
            "src",
            "wt",
        ],
    );
    assert_eq!(ws.protected_found(), found);

    let g = writing(ws);
    let rt = rt();
    for path in [
        "backups/site.git/config",
        "backups/site.git/hooks/post-receive",
        "src/config",
        "src/lib.rs",
        "a/b/secret.txt",
        "wt/config.worktree",
        "meta/hooks/pre-commit",
        // The root's `HEAD` would make the workspace one.
        "HEAD",
    ] {
        let v = write_verdict(&rt, &g, path);
        assert!(denied_as(&v, "a bare repository"), "{path}: {v:?}");
    }
    for path in ["notes/config", "c/config", "piped/config", "new.txt"] {
        let v = write_verdict(&rt, &g, path);
        assert_eq!(v, Verdict::Allow, "{path}");
    }

    // A workspace that is a bare repository itself stays the person's to change.
    bare(&t.outside, "ref: refs/heads/main\n");
    let ws = Workspace::new(&t.outside)
        .unwrap()
        .protect_bare_repositories("a bare repository");
    assert!(ws.protected_found().is_empty());
    let g = writing(ws);
    for path in ["config", "HEAD"] {
        let v = write_verdict(&rt, &g, path);
        assert_eq!(v, Verdict::Allow, "{path}");
    }
}

fn git(dir: &std::path::Path, args: &[&str]) {
    let done = std::process::Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(args)
        .status()
        .unwrap();
    assert!(done.success(), "git {args:?}");
}

/// A gateway over `ws` whose policy lets `write_file` run wherever the workspace lets it.
fn writing(ws: Workspace) -> Gateway {
    let mut policy = Policy::new();
    policy.add(Action::Allow, "write_file").unwrap();
    Gateway::with_builtins(ws).unwrap().with_policy(policy)
}

/// The verdict on a `write_file` call of `path`.
fn write_verdict(rt: &tokio::runtime::Runtime, g: &Gateway, path: &str) -> Verdict {
    rt.block_on(verdict(
        g,
        "write_file",
        json!({"path": path, "content": "x"}),
    ))
}

/// Whether `v` denies the call as no tool may change what `what` names.
fn denied_as(v: &Verdict, what: &str) -> bool {
    matches!(v, Verdict::Deny { reason } if reason.contains(what))
}

/// `rel`, each beneath the workspace of `t`.
fn places(t: &Tree, rel: &[&str]) -> Vec<PathBuf> {
    rel.iter().map(|place| t.ws.join(place)).collect()
}

/// The directory a repository's `core.hooksPath` names (husky's `.husky/_`, which git
/// ignores) is found with the repository, a relative one taken from its work tree (or a
/// bare repository's directory), and no file tool changes the workspace's own; one that
/// is the root, or lies in a `.git` already, is not found apart.
#[test]
fn the_hooks_a_repository_s_config_names_are_found_and_changed_by_no_tool() {
    let t = tree();
    git(&t.ws, &["init", "-q"]);
    git(&t.ws, &["config", "core.hooksPath", ".husky/_"]);
    std::fs::create_dir_all(t.ws.join(".husky/_")).unwrap();
    std::fs::write(t.ws.join(".husky/_/h"), "#!/bin/sh\n").unwrap();
    let lib = t.ws.join("vendor/lib");
    std::fs::create_dir_all(lib.join("hooks-here")).unwrap();
    std::fs::create_dir_all(lib.join("hooks-there")).unwrap();
    git(&lib, &["init", "-q"]);
    git(&lib, &["config", "core.hooksPath", "hooks-here"]);
    // Named twice: git takes the last, both are kept.
    git(&lib, &["config", "--add", "core.hooksPath", "hooks-there"]);
    let inner = t.ws.join("vendor/inner");
    std::fs::create_dir_all(&inner).unwrap();
    git(&inner, &["init", "-q"]);
    git(&inner, &["config", "core.hooksPath", ".git/more-hooks"]);
    std::fs::create_dir_all(inner.join(".git/more-hooks")).unwrap();
    let site = t.ws.join("backups/site.git");
    std::fs::create_dir_all(&site).unwrap();
    git(&site, &["init", "-q", "--bare"]);
    git(&site, &["config", "core.hooksPath", "custom"]);
    std::fs::create_dir_all(site.join("custom")).unwrap();
    // Named, but not there: nothing to keep.
    let gone = t.ws.join("vendor/gone");
    std::fs::create_dir_all(&gone).unwrap();
    git(&gone, &["init", "-q"]);
    git(&gone, &["config", "core.hooksPath", "nowhere"]);

    let ws = Workspace::new(&t.ws)
        .unwrap()
        .protect_everywhere(".git", "a git directory")
        .protect_bare_repositories("a bare repository");
    let repositories = places(
        &t,
        &[
            ".git",
            "backups/site.git",
            "vendor/gone/.git",
            "vendor/inner/.git",
            "vendor/lib/.git",
        ],
    );
    assert_eq!(ws.protected_found(), repositories);
    let ws = ws.protect_hooks_paths("the hooks a repository's core.hooksPath names");
    let mut found = repositories.clone();
    found.extend(places(
        &t,
        &[
            ".husky/_",
            "vendor/lib/hooks-here",
            "vendor/lib/hooks-there",
        ],
    ));
    found.sort();
    assert_eq!(ws.protected_found(), found);

    // What a config says is read again once it changed: a setting taken out, and a
    // worktree's config, which git reads only once the config says so.
    git(&lib, &["config", "--unset-all", "core.hooksPath"]);
    std::fs::write(
        lib.join(".git/config.worktree"),
        "[core]\n\thooksPath = hooks-there\n",
    )
    .unwrap();
    let mut later = repositories.clone();
    later.push(t.ws.join(".husky/_"));
    later.sort();
    assert_eq!(ws.protected_found(), later);
    git(&lib, &["config", "extensions.worktreeConfig", "true"]);
    let mut later = later.clone();
    later.push(t.ws.join("vendor/lib/hooks-there"));
    later.sort();
    assert_eq!(ws.protected_found(), later);

    let g = writing(ws);
    let rt = rt();
    let write = |path: &str| write_verdict(&rt, &g, path);
    for path in [".husky/_/pre-commit", "vendor/lib/hooks-there/pre-commit"] {
        let v = write(path);
        assert!(denied_as(&v, "core.hooksPath"), "{path}: {v:?}");
    }
    for path in [".husky/pre-commit", "vendor/lib/README"] {
        assert_eq!(write(path), Verdict::Allow, "{path}");
    }

    // Files git reads as config because a config includes them: the workspace's own
    // repository's `../.gitconfig` (relative to its git directory), what that includes in
    // turn (and itself, read once), and one of an `includeIf`, not there yet.
    git(&t.ws, &["config", "include.path", "../.gitconfig"]);
    git(
        &t.ws,
        &[
            "config",
            "includeIf.gitdir:/elsewhere/.path",
            "../team/settings",
        ],
    );
    std::fs::write(
        t.ws.join(".gitconfig"),
        "[include]\n\tpath = shared.gitconfig\n\tpath = .gitconfig\n",
    )
    .unwrap();
    std::fs::write(t.ws.join("shared.gitconfig"), "[core]\n").unwrap();
    let ws = Workspace::new(&t.ws)
        .unwrap()
        .protect_everywhere(".git", "a git directory")
        .protect_config_includes("a file git reads as config");
    let found = places(&t, &[".git", ".gitconfig", "shared.gitconfig"]);
    let found_now: Vec<PathBuf> = ws
        .protected_found()
        .into_iter()
        .filter(|place| {
            !place.starts_with(t.ws.join("vendor")) && !place.starts_with(t.ws.join("backups"))
        })
        .collect();
    assert_eq!(found_now, found);
    let g = writing(ws);
    for path in [".gitconfig", "shared.gitconfig", "team/settings"] {
        let v = write_verdict(&rt, &g, path);
        assert!(denied_as(&v, "a file git reads as config"), "{path}: {v:?}");
    }
    assert_eq!(write_verdict(&rt, &g, "team/other"), Verdict::Allow);
    // git itself refuses a file that includes itself: it is taken out before git runs
    // again.
    std::fs::write(t.ws.join(".gitconfig"), "[core]\n").unwrap();

    // Hooks run from the work tree's root itself: the workspace stays writable.
    git(&t.ws, &["config", "core.hooksPath", "."]);
    let ws = Workspace::new(&t.ws)
        .unwrap()
        .protect_everywhere(".git", "a git directory")
        .protect_hooks_paths("the hooks a repository's core.hooksPath names");
    assert!(!ws.protected_found().contains(&t.ws));
    let g = writing(ws);
    assert_eq!(write_verdict(&rt, &g, "pre-commit"), Verdict::Allow);
}

/// The run store (or agent's settings) inside the workspace: no tool may change it, by
/// any spelling or link, whatever policy allows; reads are left alone. Checked as a call
/// is checked, and again as it is run (an approval given elsewhere).
#[test]
fn a_protected_place_is_changed_by_no_tool_under_any_name() {
    let t = tree();
    std::fs::create_dir_all(t.ws.join(".agent/runs")).unwrap();
    std::fs::write(t.ws.join(".agent/agent-store"), "format=2\n").unwrap();
    std::os::unix::fs::symlink(".agent", t.ws.join("st")).unwrap();
    let mut policy = Policy::new();
    policy.add(Action::Allow, "write_file").unwrap();
    policy.add(Action::Allow, "edit_file").unwrap();
    let g = Gateway::with_builtins(
        Workspace::new(&t.ws)
            .unwrap()
            .protect(&t.ws.join(".agent"), "the run store")
            // Not made yet: protected where it will be.
            .protect(&t.ws.join("config/agent-loop"), "agent's own settings")
            // Outside: out of reach already, and ignored.
            .protect(&t.outside, "elsewhere")
            .protect_everywhere(".git", "a git directory"),
    )
    .unwrap()
    .with_policy(policy);
    let rt = rt();
    for (tool, path) in [
        ("write_file", ".agent/agent-store"),
        ("write_file", "./.agent/new"),
        ("write_file", "src/../.agent/runs/x"),
        ("write_file", "st/agent-store"),
        ("write_file", ".agent"),
        ("edit_file", ".agent/agent-store"),
        ("write_file", "config/agent-loop/trusted.json"),
        // Spelt in another case: the same place where the file system ignores case.
        ("write_file", ".AGENT/agent-store"),
        ("write_file", ".git/hooks/pre-commit"),
        // A repository nested in the workspace, and a submodule's `.git` file.
        ("write_file", "vendor/lib/.git/hooks/pre-commit"),
        ("write_file", "vendor/sub/.git"),
        ("edit_file", "src/.Git/config"),
    ] {
        let args = if tool == "edit_file" {
            json!({"path": path, "old": "format", "new": "x"})
        } else {
            json!({"path": path, "content": "x"})
        };
        let v = rt.block_on(verdict(&g, tool, args.clone()));
        assert!(
            matches!(&v, Verdict::Deny { reason } if reason.contains("which no tool may change")),
            "{tool} {path}: {v:?}"
        );
        let ran = rt.block_on(run(&g, tool, args));
        assert!(
            ran.as_ref()
                .is_err_and(|e| e.message.contains("which no tool may change")),
            "{tool} {path} ran: {ran:?}"
        );
    }
    assert_eq!(
        std::fs::read_to_string(t.ws.join(".agent/agent-store")).unwrap(),
        "format=2\n"
    );
    assert!(!t.ws.join(".agent/new").exists() && !t.ws.join("config").exists());
    assert!(!t.ws.join(".git").exists() && !t.ws.join("vendor").exists());
    // Reads, and writes beside it, are judged as before.
    let read = rt.block_on(verdict(&g, "read_file", json!({"path": "st/agent-store"})));
    assert_eq!(read, Verdict::Allow);
    for beside in [
        ".agents-notes.txt",
        "vendor/.gitignore",
        "src/.github/ci.yml",
    ] {
        let args = json!({"path": beside, "content": "x"});
        assert_eq!(
            rt.block_on(verdict(&g, "write_file", args)),
            Verdict::Allow,
            "{beside}"
        );
    }
    let read = json!({"path": "vendor/lib/.git/config"});
    assert!(
        !matches!(rt.block_on(verdict(&g, "read_file", read)), Verdict::Deny { reason } if reason.contains("which no tool may change"))
    );
}

#[test]
fn path_rules_judge_every_alias() {
    let t = tree();
    let abs_key = format!("{}/secrets/key.txt", t.ws.display());
    let abs_toml = format!("{}/src/../Cargo.toml", t.ws.display());
    use Action::*;
    let deny_secrets: &[(Action, &str)] = &[(Deny, "read_file(secrets/**)")];
    let allow_src: &[(Action, &str)] = &[(Allow, "write_file(src/**)")];
    type Rules<'a> = &'a [(Action, &'a str)];
    let table: Vec<(Rules, &str, Value, V)> = vec![
        (
            deny_secrets,
            "read_file",
            json!({"path": "secrets/key.txt"}),
            V::Deny,
        ),
        (
            deny_secrets,
            "read_file",
            json!({"path": "notes/../secrets/key.txt"}),
            V::Deny,
        ),
        (deny_secrets, "read_file", json!({"path": abs_key}), V::Deny),
        (
            deny_secrets,
            "read_file",
            json!({"path": "s/key.txt"}),
            V::Deny,
        ),
        (
            deny_secrets,
            "read_file",
            json!({"path": "./secrets//key.txt"}),
            V::Deny,
        ),
        (
            deny_secrets,
            "read_file",
            json!({"path": "s/../s/./key.txt"}),
            V::Deny,
        ),
        (
            deny_secrets,
            "read_file",
            json!({"path": "notes/a.txt"}),
            V::Allow,
        ),
        (
            deny_secrets,
            "read_file",
            json!({"path": "../outside/bashrc"}),
            V::Deny,
        ),
        (
            deny_secrets,
            "read_file",
            json!({"path": "out/bashrc"}),
            V::Deny,
        ),
        (
            deny_secrets,
            "read_file",
            json!({"path": "/etc/passwd"}),
            V::Deny,
        ),
        (
            allow_src,
            "write_file",
            json!({"path": "src/lib.rs", "content": ""}),
            V::Allow,
        ),
        (
            allow_src,
            "write_file",
            json!({"path": "src/new/mod.rs", "content": ""}),
            V::Allow,
        ),
        (
            allow_src,
            "write_file",
            json!({"path": "src/../Cargo.toml", "content": ""}),
            V::Ask,
        ),
        (
            allow_src,
            "write_file",
            json!({"path": abs_toml, "content": ""}),
            V::Ask,
        ),
        (
            allow_src,
            "write_file",
            json!({"path": "src/manifest", "content": ""}),
            V::Ask,
        ),
        (
            allow_src,
            "edit_file",
            json!({"path": "src/lib.rs", "old": "a", "new": "b"}),
            V::Ask,
        ),
        (
            allow_src,
            "write_file",
            json!({"path": "out/x", "content": ""}),
            V::Deny,
        ),
    ];
    rt().block_on(async {
        for (rules, tool, args, want) in table {
            let g = gateway(&t.ws, rules);
            let got = verdict(&g, tool, args.clone()).await;
            assert_eq!(kind(&got), want, "{rules:?} {tool} {args}: {got:?}");
        }
    });
}

#[test]
fn a_directory_swapped_for_a_link_after_the_check_is_refused() {
    let t = tree();
    std::fs::create_dir_all(t.ws.join("work")).unwrap();
    let g = gateway(&t.ws, &[(Action::Allow, "write_file(work/**)")]);
    rt().block_on(async {
        let v = verdict(
            &g,
            "write_file",
            json!({"path": "work/bashrc", "content": "X"}),
        )
        .await;
        assert_eq!(v, Verdict::Allow);
        // Between the check and the run, `work` becomes a link out of the workspace.
        std::fs::remove_dir(t.ws.join("work")).unwrap();
        std::os::unix::fs::symlink("../outside", t.ws.join("work")).unwrap();
        let err = run(
            &g,
            "write_file",
            json!({"path": "work/bashrc", "content": "X"}),
        )
        .await
        .unwrap_err();
        assert_eq!(err.kind, ErrorKind::Denied, "{err:?}");
    });
    assert_eq!(
        std::fs::read_to_string(t.outside.join("bashrc")).unwrap(),
        "OUTSIDE\n"
    );
}

#[test]
fn the_capability_refuses_even_a_path_resolved_before_the_swap() {
    let t = tree();
    std::fs::create_dir_all(t.ws.join("work")).unwrap();
    let ws = Workspace::new(&t.ws).unwrap();
    let resolved = ws.resolve("work/bashrc").unwrap();
    std::fs::remove_dir(t.ws.join("work")).unwrap();
    std::os::unix::fs::symlink(&t.outside, t.ws.join("work")).unwrap();
    assert!(ws.write_atomic(&resolved, b"X").is_err());
    let read = ws.resolve("c/plain.txt").unwrap();
    std::fs::remove_file(t.ws.join("c/plain.txt")).unwrap();
    std::os::unix::fs::symlink(t.outside.join("bashrc"), t.ws.join("c/plain.txt")).unwrap();
    assert!(
        ws.open(&read).is_err(),
        "a file swapped for a link out is not opened"
    );
    assert_eq!(
        std::fs::read_to_string(t.outside.join("bashrc")).unwrap(),
        "OUTSIDE\n"
    );
}

/// The last step of a use: between the resolution policy judged and the tool's open, a
/// directory on the path becomes a link to another place *inside* the workspace (which
/// the capability alone allows). The open and the write go through no link at all, so
/// they are refused rather than reach a file policy never saw.
#[test]
fn a_path_is_opened_exactly_as_resolved_not_through_a_link_made_since() {
    let t = tree();
    let ws = Workspace::new(&t.ws).unwrap();
    std::fs::write(t.ws.join("notes/key.txt"), "a note\n").unwrap();
    let read = ws.resolve("notes/key.txt").unwrap();
    let write = ws.resolve("notes/new.txt").unwrap();
    let deep = ws.resolve("notes/deep/new.txt").unwrap();
    assert_eq!(read.display(), "notes/key.txt");
    std::fs::rename(t.ws.join("notes"), t.ws.join("notes.old")).unwrap();
    std::os::unix::fs::symlink("secrets", t.ws.join("notes")).unwrap();
    match ws.open(&read) {
        Ok(mut file) => {
            let mut text = String::new();
            std::io::Read::read_to_string(&mut file, &mut text).unwrap();
            panic!("opened through the new link: {text:?}");
        }
        Err(e) => assert!(e.to_string().contains("symbolic link"), "{e}"),
    }
    assert!(ws.write_atomic(&write, b"X").is_err());
    assert!(!t.ws.join("secrets/new.txt").exists());
    // Nor is a directory made through the link on the way to a new file.
    assert!(ws.write_atomic(&deep, b"X").is_err());
    assert!(!t.ws.join("secrets/deep").exists());
    assert!(ws.entries(&ws.resolve("notes.old").unwrap()).is_ok());
    assert!(ws.entries(&read_dir_then_swap(&t)).is_err());
}

/// `a/b` resolved as a directory, then `a` swapped for a link to `c`.
fn read_dir_then_swap(t: &Tree) -> agent_tools::Resolved {
    let ws = Workspace::new(&t.ws).unwrap();
    let resolved = ws.resolve("a/b").unwrap();
    std::fs::create_dir_all(t.ws.join("c/b")).unwrap();
    std::fs::rename(t.ws.join("a"), t.ws.join("a.old")).unwrap();
    std::os::unix::fs::symlink("c", t.ws.join("a")).unwrap();
    resolved
}

/// `docs` links to `notes`, and a read of `docs/a.txt` is judged (`notes/a.txt`), then
/// `checked_since` other calls that never run; then `docs` is made to link to `secrets`,
/// where reads are denied.
fn docs_swapped_after_the_check(t: &Tree, g: &Gateway, checked_since: usize) {
    rt().block_on(async {
        assert_eq!(
            verdict(g, "read_file", json!({"path": "docs/a.txt"})).await,
            Verdict::Allow
        );
        let others: Vec<ToolCall> = (0..checked_since)
            .map(|i| ToolCall::new(format!("o{i}"), "read_file", json!({"path": "notes/a.txt"})))
            .collect();
        g.check("run-1", &others).await;
    });
    std::fs::remove_file(t.ws.join("docs")).unwrap();
    std::os::unix::fs::symlink("secrets", t.ws.join("docs")).unwrap();
    std::fs::copy(t.ws.join("secrets/key.txt"), t.ws.join("secrets/a.txt")).unwrap();
}

/// The tree with `docs` linking to `notes`, and a gateway that denies reads in `secrets`.
fn docs_tree() -> (Tree, Gateway) {
    let t = tree();
    std::os::unix::fs::symlink("notes", t.ws.join("docs")).unwrap();
    let g = gateway(&t.ws, &[(Action::Deny, "read_file(secrets/**)")]);
    (t, g)
}

fn read_docs_a(g: &Gateway) -> Result<String, agent_core::ToolError> {
    rt().block_on(run(g, "read_file", json!({"path": "docs/a.txt"})))
}

#[test]
fn a_call_checked_in_this_process_reads_the_file_that_was_judged() {
    let (t, g) = docs_tree();
    docs_swapped_after_the_check(&t, &g, 0);
    let out = read_docs_a(&g).unwrap();
    assert!(out.contains("note") && !out.contains("KEY"), "{out}");
}

#[test]
fn a_deny_rule_applies_when_a_link_changes_after_a_check_elsewhere() {
    let (t, elsewhere) = docs_tree();
    // The check ran in another process (before an approval, say): this gateway resolves
    // the path again, and judges where it leads now.
    docs_swapped_after_the_check(&t, &elsewhere, 0);
    let g = gateway(&t.ws, &[(Action::Deny, "read_file(secrets/**)")]);
    let err = read_docs_a(&g).unwrap_err();
    assert_eq!(err.kind, ErrorKind::Denied, "{err:?}");
}

#[test]
fn resolutions_kept_for_calls_never_run_are_bounded_and_the_oldest_is_resolved_again() {
    let (t, g) = docs_tree();
    // 256 calls checked since, and never run.
    docs_swapped_after_the_check(&t, &g, 256);
    let err = read_docs_a(&g).unwrap_err();
    assert_eq!(err.kind, ErrorKind::Denied, "{err:?}");
}

/// Between the check and the run, the judged file is replaced by a link (to a file
/// inside, which reads would reach): the open refuses it, and nothing is read through it.
#[test]
fn a_judged_file_replaced_by_a_link_after_the_check_is_not_read_through_it() {
    let t = tree();
    let g = gateway(&t.ws, &[(Action::Deny, "read_file(secrets/**)")]);
    rt().block_on(async {
        assert_eq!(
            verdict(&g, "read_file", json!({"path": "notes/a.txt"})).await,
            Verdict::Allow
        );
    });
    std::fs::remove_file(t.ws.join("notes/a.txt")).unwrap();
    std::os::unix::fs::symlink("../secrets/key.txt", t.ws.join("notes/a.txt")).unwrap();
    let err = rt()
        .block_on(run(&g, "read_file", json!({"path": "notes/a.txt"})))
        .unwrap_err();
    assert!(err.message.contains("symbolic link"), "{err:?}");
    assert!(!err.message.contains("KEY"), "{err:?}");
}

/// A write judged for where a link led is refused, not carried out, when the link leads
/// elsewhere by the time it runs: there policy would have asked a person first.
#[test]
fn a_write_whose_path_leads_elsewhere_since_the_check_is_refused() {
    let t = tree();
    std::fs::create_dir_all(t.ws.join("work")).unwrap();
    std::os::unix::fs::symlink("work", t.ws.join("docs")).unwrap();
    let g = gateway(&t.ws, &[(Action::Allow, "write_file(work/**)")]);
    let args = json!({"path": "docs/new.txt", "content": "X"});
    rt().block_on(async {
        assert_eq!(
            verdict(&g, "write_file", args.clone()).await,
            Verdict::Allow
        );
    });
    std::fs::remove_file(t.ws.join("docs")).unwrap();
    std::os::unix::fs::symlink("src", t.ws.join("docs")).unwrap();
    let err = rt().block_on(run(&g, "write_file", args)).unwrap_err();
    assert_eq!(err.kind, ErrorKind::Denied, "{err:?}");
    assert!(err.message.contains("now leads to src/new.txt"), "{err:?}");
    assert!(!t.ws.join("src/new.txt").exists());
    assert!(!t.ws.join("work/new.txt").exists());
}

/// A write through `docs` (a link to `work`), checked by one gateway, where policy asks a
/// person; `docs` then leads to `leads_to_at_run`, and another gateway (another process,
/// after the approval) runs the call bound to the place recorded by the check.
fn write_approved_elsewhere(
    leads_to_at_run: &str,
) -> (Tree, Result<String, agent_core::ToolError>) {
    let t = tree();
    std::fs::create_dir_all(t.ws.join("work")).unwrap();
    std::os::unix::fs::symlink("work", t.ws.join("docs")).unwrap();
    let rules = [(Action::Ask, "write_file(**)")];
    let call = ToolCall::new(
        "c1",
        "write_file",
        json!({"path": "docs/new.txt", "content": "X"}),
    );
    let checks =
        rt().block_on(gateway(&t.ws, &rules).check_judged("run-1", std::slice::from_ref(&call)));
    assert!(
        matches!(checks.verdicts[..], [(_, Verdict::Ask { .. })]),
        "{checks:?}"
    );
    assert_eq!(
        checks.paths,
        vec![(call.id.clone(), "work/new.txt".to_owned())]
    );
    std::fs::remove_file(t.ws.join("docs")).unwrap();
    std::os::unix::fs::symlink(leads_to_at_run, t.ws.join("docs")).unwrap();
    let scheduled = ScheduledCall {
        call,
        risk: Risk::Write,
        effect_key: None,
        path: Some(checks.paths[0].1.clone()),
    };
    let mut results = rt().block_on(gateway(&t.ws, &rules).execute(
        "run-1",
        vec![vec![scheduled]],
        &CancellationToken::new(),
    ));
    let result = match results.remove(0).outcome {
        ToolOutcome::Output(text) => Ok(text),
        ToolOutcome::Error(e) => Err(e),
    };
    (t, result)
}

#[test]
fn a_write_approved_in_another_process_is_refused_where_its_path_now_leads_elsewhere() {
    let (t, result) = write_approved_elsewhere("src");
    let err = result.unwrap_err();
    assert_eq!(err.kind, ErrorKind::Denied, "{err:?}");
    assert!(
        err.message
            .contains("now leads to src/new.txt, not to work/new.txt"),
        "{err:?}"
    );
    assert!(!t.ws.join("src/new.txt").exists());
    assert!(!t.ws.join("work/new.txt").exists());
}

#[test]
fn a_write_approved_in_another_process_runs_where_its_path_still_leads() {
    let (t, result) = write_approved_elsewhere("work");
    result.unwrap();
    assert_eq!(
        std::fs::read_to_string(t.ws.join("work/new.txt")).unwrap(),
        "X"
    );
}

/// A name that is not UTF-8 is recorded with U+FFFD in its place, which a real name could
/// hold: such a record binds the call to nothing, and it is refused.
#[test]
fn a_recorded_path_with_a_replacement_character_matches_no_place() {
    let t = tree();
    let lossy = "notes/\u{FFFD}.txt";
    std::fs::write(t.ws.join(lossy), "not this one\n").unwrap();
    let g = gateway(&t.ws, &[]);
    let scheduled = ScheduledCall {
        call: ToolCall::new("c1", "read_file", json!({"path": lossy})),
        risk: Risk::Read,
        effect_key: None,
        path: Some(lossy.to_owned()),
    };
    let mut results =
        rt().block_on(g.execute("run-1", vec![vec![scheduled]], &CancellationToken::new()));
    let ToolOutcome::Error(err) = results.remove(0).outcome else {
        panic!("the call ran");
    };
    assert_eq!(err.kind, ErrorKind::Denied, "{err:?}");
}

/// `check_judged` records where a path led for calls allowed or asked about, and nothing
/// for a call denied or a tool without a path (a command is asked about by default).
#[test]
fn the_check_records_the_place_of_each_call_allowed_or_asked_about() {
    let (t, _) = docs_tree();
    let g = gateway(
        &t.ws,
        &[
            (Action::Deny, "read_file(secrets/**)"),
            (Action::Ask, "write_file(src/**)"),
        ],
    );
    let calls = [
        ToolCall::new("read", "read_file", json!({"path": "docs/a.txt"})),
        ToolCall::new("denied", "read_file", json!({"path": "s/key.txt"})),
        ToolCall::new(
            "ask",
            "write_file",
            json!({"path": "./src/../src/x.rs", "content": ""}),
        ),
        ToolCall::new("list", "list_dir", json!({"path": "."})),
        ToolCall::new("shell", "shell", json!({"command": "true"})),
    ];
    let checks = rt().block_on(g.check_judged("run-1", &calls));
    let kinds: Vec<(&str, V)> = checks
        .verdicts
        .iter()
        .map(|(id, v)| (id.as_str(), kind(v)))
        .collect();
    assert_eq!(
        kinds,
        [
            ("read", V::Allow),
            ("denied", V::Deny),
            ("ask", V::Ask),
            ("list", V::Allow),
            ("shell", V::Ask),
        ]
    );
    let paths: Vec<(&str, &str)> = checks
        .paths
        .iter()
        .map(|(id, p)| (id.as_str(), p.as_str()))
        .collect();
    assert_eq!(
        paths,
        [("read", "notes/a.txt"), ("ask", "src/x.rs"), ("list", ".")]
    );
}

/// A file that grew between the check and the run is read as it is when opened, not up
/// to the length the check saw.
#[test]
fn a_file_that_grew_since_the_check_is_read_to_its_new_end() {
    let t = tree();
    let g = gateway(&t.ws, &[]);
    let path = t.ws.join("notes/grows.txt");
    std::fs::write(&path, "line 1\n").unwrap();
    rt().block_on(async {
        assert_eq!(
            verdict(&g, "read_file", json!({"path": "notes/grows.txt"})).await,
            Verdict::Allow
        );
    });
    let text: String = (1..=300).map(|i| format!("line {i}\n")).collect();
    std::fs::write(&path, text).unwrap();
    let out = rt()
        .block_on(run(&g, "read_file", json!({"path": "notes/grows.txt"})))
        .unwrap();
    assert!(out.contains("line 300"), "{out}");
}

/// A file that does not exist when the call is checked (an earlier group of the same
/// turn writes it) is resolved again when the call runs, and read.
#[test]
fn a_file_made_between_the_check_and_the_run_is_read() {
    let t = tree();
    let g = gateway(&t.ws, &[]);
    rt().block_on(async {
        assert_eq!(
            verdict(&g, "read_file", json!({"path": "notes/later.txt"})).await,
            Verdict::Allow
        );
    });
    std::fs::write(t.ws.join("notes/later.txt"), "made later\n").unwrap();
    let out = rt()
        .block_on(run(&g, "read_file", json!({"path": "notes/later.txt"})))
        .unwrap();
    assert!(out.contains("made later"), "{out}");
}

/// A path tool that answers with the resolution the gateway handed it.
struct ShowsResolution;

#[derive(serde::Deserialize, schemars::JsonSchema)]
struct PathArgs {
    #[allow(dead_code)]
    path: String,
}

#[async_trait::async_trait]
impl agent_tools::TypedTool for ShowsResolution {
    type Args = PathArgs;
    const NAME: &'static str = "shows_resolution";
    const RISK: Risk = Risk::Read;
    const MAIN_ARGUMENT: Option<&'static str> = Some("path");

    fn description(&self) -> String {
        "test".to_owned()
    }

    async fn run(
        &self,
        _args: PathArgs,
        ctx: &agent_tools::ToolContext,
    ) -> Result<String, agent_core::ToolError> {
        Ok(match &ctx.resolved {
            Some((given, resolved)) => format!("{given} -> {}", resolved.display()),
            None => "none".to_owned(),
        })
    }
}

#[test]
fn the_gateway_hands_a_path_tool_the_resolution_policy_judged() {
    let t = tree();
    let mut g = gateway(&t.ws, &[]);
    g.register(Arc::new(agent_tools::Typed(ShowsResolution)))
        .unwrap();
    rt().block_on(async {
        let out = run(
            &g,
            "shows_resolution",
            json!({"path": "notes/../s/key.txt"}),
        )
        .await;
        assert_eq!(out.unwrap(), "notes/../s/key.txt -> secrets/key.txt");
    });
}

#[test]
fn hooks_see_the_resolved_path_and_the_spelling() {
    let t = tree();
    let seen = t.ws.join("../hook-input.json");
    let hook = CommandHook::new(
        HookEvent::PreToolUse,
        format!("cat > {}", seen.display()),
        None,
        &t.ws,
    )
    .unwrap();
    let g = gateway(&t.ws, &[]).with_hook(Arc::new(hook));
    rt().block_on(async {
        verdict(&g, "read_file", json!({"path": "notes/../s/key.txt"})).await;
    });
    let input: Value = serde_json::from_str(&std::fs::read_to_string(seen).unwrap()).unwrap();
    assert_eq!(input["tool_input"]["path"], "secrets/key.txt");
    assert_eq!(input["raw_tool_input"]["path"], "notes/../s/key.txt");
}

/// One segment of a generated path.
fn segment() -> impl Strategy<Value = &'static str> {
    prop::sample::select(vec![
        ".",
        "..",
        "",
        "a",
        "b",
        "c",
        "l1",
        "l3",
        "out",
        "abs_out",
        "secret.txt",
        "plain.txt",
        "to_secret",
        "bashrc",
        "secrets",
        "key.txt",
        "s",
        "notes",
        "r1",
        "r2",
        "r3",
    ])
}

/// Where a generated link is placed, and what it points to (`@OUT` and `@WS` stand for the
/// absolute paths of the outside directory and of the workspace).
fn planted_link() -> impl Strategy<Value = (&'static str, &'static str)> {
    (
        prop::sample::select(vec!["", "a/", "c/", "a/b/"]),
        prop::sample::select(vec![
            "a",
            "a/b",
            "..",
            ".",
            "../outside",
            "../..",
            "c/../a",
            "@OUT",
            "@WS/secrets",
            "@WS/a/b/secret.txt",
            "r1",
            "r2",
            "../r3",
            "secrets/key.txt",
            "nowhere",
        ]),
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Every spelling: the resolver agrees with the kernel, escapes are refused, and a deny
    /// rule on a directory applies to every spelling that reaches a file in it.
    #[test]
    fn generated_spellings(
        parts in prop::collection::vec(segment(), 1..7),
        absolute in any::<bool>(),
        links in prop::collection::vec(planted_link(), 3),
    ) {
        let t = tree();
        // A random part of the tree: three more links, inside and outside, loops allowed.
        for (i, (place, target)) in links.iter().enumerate() {
            let target = target
                .replace("@OUT", &t.outside.display().to_string())
                .replace("@WS", &t.ws.display().to_string());
            let at = t.ws.join(format!("{place}r{}", i + 1));
            std::os::unix::fs::symlink(&target, at).unwrap();
        }
        let spelled = parts.join("/");
        let spelled = if absolute { format!("{}/{spelled}", t.ws.display()) } else { spelled };
        let ws = Workspace::new(&t.ws).unwrap();
        let resolved = ws.resolve(&spelled);
        // The kernel is the oracle for paths that exist.
        let on_disk = if absolute { PathBuf::from(&spelled) } else { t.ws.join(&spelled) };
        if let Ok(real) = on_disk.canonicalize() {
            match real.strip_prefix(&t.ws) {
                // No segment names the workspace itself, so nothing climbs out and back in.
                Ok(rel) => {
                    let r = resolved.as_ref().map_err(|e| e.message.clone());
                    prop_assert!(r.is_ok(), "{spelled}: {r:?}");
                    let r = r.unwrap();
                    let want = if rel.as_os_str().is_empty() { ".".to_owned() } else { rel.display().to_string() };
                    prop_assert_eq!(r.display(), want, "{}", spelled);
                }
                Err(_) => prop_assert!(resolved.is_err(), "{spelled} leaves the workspace: {resolved:?}"),
            }
        }
        if let Ok(r) = &resolved {
            prop_assert!(!r.display().starts_with(".."));
        }
        // Through the gateway: never the outside file, never the denied one.
        let g = gateway(&t.ws, &[(Action::Deny, "read_file(a/b/**)"), (Action::Deny, "read_file(secrets/**)")]);
        let (v, out) = rt().block_on(async {
            let v = verdict(&g, "read_file", json!({"path": spelled})).await;
            let out = if v == Verdict::Allow { run(&g, "read_file", json!({"path": spelled})).await.ok() } else { None };
            (v, out)
        });
        if let Some(text) = out {
            prop_assert!(!text.contains("OUTSIDE"), "{spelled} read outside");
            prop_assert!(!text.contains("SECRET") && !text.contains("KEY"), "{spelled} read a denied file: {v:?}");
        }
    }
}

/// Credentials in the workspace (a workspace that is a home directory): no tool reads or
/// writes them without a person's approval, by any spelling or link, and where a link
/// names one, where it leads is concealed too; a rule for the whole tool does not let it,
/// a rule naming the place does, and a deny rule still denies. The rest of the workspace
/// is judged as before.
#[test]
fn credentials_in_the_workspace_are_touched_only_with_a_person_s_approval() {
    let t = tree();
    std::fs::create_dir_all(t.ws.join(".ssh")).unwrap();
    std::fs::write(t.ws.join(".ssh/id_ed25519"), "KEY\n").unwrap();
    std::fs::create_dir_all(t.ws.join("dotfiles/aws")).unwrap();
    std::fs::write(t.ws.join("dotfiles/aws/credentials"), "AWS\n").unwrap();
    std::os::unix::fs::symlink("dotfiles/aws", t.ws.join(".aws")).unwrap();
    std::os::unix::fs::symlink(".ssh/id_ed25519", t.ws.join("key")).unwrap();
    let gateway = |rules: &[(Action, &str)]| {
        let mut policy = Policy::new();
        for (action, rule) in rules {
            policy.add(*action, rule).unwrap();
        }
        Gateway::with_builtins(
            Workspace::new(&t.ws)
                .unwrap()
                .conceal(&t.ws.join(".ssh"), "credentials")
                .conceal(&t.ws.join(".aws"), "credentials")
                .conceal(&t.outside, "elsewhere"),
        )
        .unwrap()
        .with_policy(policy)
    };
    let rt = rt();
    let calls = [
        ("read_file", json!({"path": ".ssh/id_ed25519"})),
        ("read_file", json!({"path": "./src/../.ssh/id_ed25519"})),
        ("read_file", json!({"path": ".SSH/id_ed25519"})),
        ("read_file", json!({"path": "key"})),
        ("read_file", json!({"path": ".aws/credentials"})),
        ("read_file", json!({"path": "dotfiles/aws/credentials"})),
        ("list_dir", json!({"path": ".ssh"})),
        ("grep", json!({"pattern": "KEY", "path": ".ssh"})),
        (
            "write_file",
            json!({"path": ".ssh/authorized_keys", "content": "x"}),
        ),
    ];
    let whole_tools = [
        (Action::Allow, "read_file"),
        (Action::Allow, "list_dir"),
        (Action::Allow, "grep"),
        (Action::Allow, "write_file"),
    ];
    for rules in [&[][..], &whole_tools[..]] {
        let g = gateway(rules);
        for (tool, args) in &calls {
            let v = rt.block_on(verdict(&g, tool, args.clone()));
            // (A write asks anyway, for its own reason, where no rule lets it.)
            let why = if rules.is_empty() && *tool == "write_file" {
                "asks by default"
            } else {
                "holds credentials, which a tool touches only"
            };
            assert!(
                matches!(&v, Verdict::Ask { why: said } if said.contains(why)),
                "{rules:?} {tool} {args}: {v:?}"
            );
        }
        for (tool, args) in [
            ("read_file", json!({"path": "notes/a.txt"})),
            ("list_dir", json!({"path": "."})),
            ("grep", json!({"pattern": "KEY", "path": "."})),
        ] {
            let v = rt.block_on(verdict(&g, tool, args.clone()));
            assert_eq!(v, Verdict::Allow, "{rules:?} {tool} {args}");
        }
    }
    let named = gateway(&[(Action::Allow, "read_file(.ssh/**)")]);
    let v = rt.block_on(verdict(&named, "read_file", json!({"path": "key"})));
    assert_eq!(v, Verdict::Allow);
    let v = rt.block_on(verdict(
        &named,
        "read_file",
        json!({"path": ".aws/credentials"}),
    ));
    assert_eq!(kind(&v), V::Ask);
    let denied = gateway(&[(Action::Deny, "read_file(.ssh/**)")]);
    let v = rt.block_on(verdict(&denied, "read_file", json!({"path": "key"})));
    assert_eq!(kind(&v), V::Deny);
    // A search of the whole workspace passes by them (hidden directories are not walked).
    let g = gateway(&[]);
    let found = rt
        .block_on(run(&g, "grep", json!({"pattern": "KEY|AWS", "path": "."})))
        .unwrap();
    assert!(
        !found.contains(".ssh") && !found.contains(".aws"),
        "{found}"
    );
}
