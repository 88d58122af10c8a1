//! Shell commands in a sandbox (`--sandbox`): what the kernel keeps them from, as root and
//! as another user (through a user namespace), each beside the same command run without
//! the sandbox, which does what the sandbox stops; and the sandbox is never left out.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use serde_json::{Value, json};

use crate::crash::{call_results, not_root, one_shell_call};
use crate::{Env, stderr};

/// Runs one `shell` call of `command` with `flags` added to `run`, as `agent` runs here or
/// as `nobody`; the call's result.
fn one_call(env: &Env, as_nobody: bool, command: &str, flags: &[&str]) -> Value {
    call_of(env, as_nobody, &one_shell_call(env, command), flags)
}

/// Runs `model`, whose call is `call-1`, with `shell` allowed and `flags`, as [`one_call`]
/// does; the call's result.
fn call_of(env: &Env, as_nobody: bool, model: &str, flags: &[&str]) -> Value {
    let mut cmd = if as_nobody {
        let mut cmd = not_root(env);
        cmd.arg("--store").arg(env.store());
        cmd
    } else {
        env.cmd()
    };
    let out = cmd
        .args(["run", "--json", "--allow", "shell", "--model", model])
        .args(flags)
        .arg("go")
        .output()
        .unwrap();
    call_results(env, &out)("call-1")
}

/// The call's output (stdout and stderr as the model reads them, a failed command's too).
fn output(result: &Value) -> &str {
    result["output"]
        .as_str()
        .or_else(|| result["error"]["message"].as_str())
        .unwrap_or_else(|| panic!("no output: {result}"))
}

/// A directory anyone may write in, outside the system's temporary one (a sandboxed
/// command has a `/tmp` of its own, so a place there proves nothing about its writes).
fn writable_by_all(in_dir: &Path) -> tempfile::TempDir {
    let dir = tempfile::tempdir_in(in_dir).unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    dir
}

/// A directory anyone may write in where a sandboxed command has no directory of its own
/// in place of the system's (not beneath `/tmp`, `/run` or `/dev/shm`, where a write
/// would land in its own and prove nothing of the rules on writes): `/var/tmp`, else
/// cargo's directory for the tests' files.
pub(crate) fn outside_covered() -> tempfile::TempDir {
    let covered = |dir: &Path| {
        ["/tmp", "/run", "/dev/shm"]
            .iter()
            .any(|c| dir.starts_with(c))
    };
    let place = [
        Path::new("/var/tmp"),
        Path::new(env!("CARGO_TARGET_TMPDIR")),
    ]
    .into_iter()
    .find(|dir| dir.is_dir() && !covered(dir))
    .expect("a directory for the tests outside /tmp: /var/tmp, or the target directory");
    writable_by_all(place)
}

/// `agent run --json` of `model` with the MCP servers of `config`, `var` set.
fn run_with_mcp(
    env: &Env,
    config: &str,
    model: &str,
    (name, value): (&str, &std::ffi::OsStr),
) -> std::process::Output {
    crate::mcp_run(env, config, model)
        .env(name, value)
        .output()
        .unwrap()
}

/// The run a paused `agent run` (not `--json`) named first on standard error.
fn paused_run_id(out: &std::process::Output) -> String {
    let said = stderr(out);
    said.strip_prefix("agent: run ")
        .and_then(|rest| rest.split(' ').next())
        .unwrap_or_else(|| panic!("{said}"))
        .to_owned()
}

/// Who the tests can run `agent` as: itself, and `nobody` when it is root.
fn users() -> Vec<bool> {
    if nix::unistd::geteuid().is_root() {
        vec![false, true]
    } else {
        vec![false]
    }
}

/// A sandboxed command writes in the workspace, and nowhere else: not a directory outside
/// it (Landlock refuses), not the run store or the repository's `.git` inside it
/// (read-only), not the system's `/tmp`, which it does not even see (a file beside the
/// workspace there is not found; what it writes in its own `/tmp` is gone after). Without
/// the sandbox the same command does all of it.
#[test]
fn a_sandboxed_command_writes_in_the_workspace_and_nowhere_else() {
    for as_nobody in users() {
        for sandboxed in [false, true] {
            let env = Env::new();
            let outside = outside_covered();
            let beside = writable_by_all(&std::env::temp_dir());
            std::fs::write(beside.path().join("seen.txt"), "seen-5519\n").unwrap();
            let git = env.dir.path().join(".git");
            std::fs::create_dir(&git).unwrap();
            std::fs::write(git.join("config"), "[core]\n").unwrap();
            std::fs::set_permissions(&git, std::fs::Permissions::from_mode(0o777)).unwrap();
            std::fs::set_permissions(git.join("config"), std::fs::Permissions::from_mode(0o666))
                .unwrap();
            // The store is made before the call, as a run makes it.
            let command = format!(
                "echo made > made.txt; echo a > {outside}/escaped.txt; cat {beside}/seen.txt; \
                 echo b > {beside}/escaped.txt; echo c > /tmp/own-5519.txt && cat /tmp/own-5519.txt; \
                 echo '[core] hooksPath = /x' >> .git/config; echo d > store/planted; \
                 echo end",
                outside = outside.path().display(),
                beside = beside.path().display(),
            );
            let flags: &[&str] = if sandboxed { &["--sandbox"] } else { &[] };
            let result = one_call(&env, as_nobody, &command, flags);
            let said = output(&result);
            let case = format!("nobody: {as_nobody}, sandboxed: {sandboxed}: {said}");
            assert!(said.contains("\nc\nend\n"), "{case}");
            assert!(env.dir.path().join("made.txt").exists(), "{case}");
            assert_eq!(
                outside.path().join("escaped.txt").exists(),
                !sandboxed,
                "{case}"
            );
            assert_eq!(said.contains("seen-5519"), !sandboxed, "{case}");
            assert_eq!(
                beside.path().join("escaped.txt").exists(),
                !sandboxed,
                "{case}"
            );
            assert_eq!(
                std::fs::read_to_string(git.join("config")).unwrap() == "[core]\n",
                sandboxed,
                "{case}"
            );
            assert_eq!(env.store().join("planted").exists(), !sandboxed, "{case}");
            if sandboxed {
                assert!(said.contains("Read-only file system"), "{case}");
                assert!(!Path::new("/tmp/own-5519.txt").exists(), "{case}");
            } else {
                let _ = std::fs::remove_file("/tmp/own-5519.txt");
            }
        }
    }
}

/// A sandboxed command reaches no server outside its own network (here one listening on
/// the host's 127.0.0.1), and a server it starts on its own 127.0.0.1 answers it;
/// `--sandbox-network` gives the network back, the rest of the sandbox kept.
#[test]
fn a_sandboxed_command_has_a_network_of_its_own() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let command = format!(
        "(exec 3<>/dev/tcp/127.0.0.1/{port}) 2>/dev/null && echo reached-host; \
         python3 -c 'import socket; s = socket.socket(); s.bind((\"127.0.0.1\", 0)); \
         s.listen(); socket.create_connection(s.getsockname()); print(\"own-loopback\")'"
    );
    for as_nobody in users() {
        for (flags, reached) in [
            (&[][..], true),
            (&["--sandbox"][..], false),
            (&["--sandbox-network"][..], true),
        ] {
            let env = Env::new();
            let result = one_call(&env, as_nobody, &command, flags);
            let said = output(&result);
            let case = format!("nobody: {as_nobody}, {flags:?}: {said}");
            assert_eq!(said.contains("reached-host"), reached, "{case}");
            assert!(said.contains("own-loopback"), "{case}");
        }
    }
}

/// Where the sandbox cannot be made (here: namespaces turned off), a run that asks for it
/// does not start: one line says why (before, every command the model tried was refused),
/// and nothing runs or is written.
#[test]
fn a_sandbox_that_cannot_be_made_stops_the_run_before_it_starts() {
    let env = Env::new();
    let model = one_shell_call(&env, "echo ran > ran.txt");
    let out = env
        .cmd()
        .env("AGENT_LOOP_PID_NAMESPACE", "off")
        .args(["run", "--json", "--sandbox", "--allow", "shell", "--model"])
        .arg(&model)
        .arg("go")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let err = stderr(&out);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.starts_with("agent: commands cannot be sandboxed here: it needs namespaces")
            && err.contains("run without --sandbox"),
        "{err}"
    );
    assert!(!env.dir.path().join("ran.txt").exists());
    let runs = crate::stdout(&env.run(&["runs", "--json"]));
    assert!(!runs.contains("run_id"), "no run was made: {runs}");
}

/// `--sandbox-write` lets commands write in one more directory; one that is not there is
/// refused before anything runs, in one line.
#[test]
fn a_directory_named_for_sandboxed_writes_must_be_there() {
    let env = Env::new();
    let cache = outside_covered();
    let result = one_call(
        &env,
        false,
        &format!("echo x > {}/built", cache.path().display()),
        &["--sandbox-write", cache.path().to_str().unwrap()],
    );
    assert!(output(&result).starts_with("exit code: 0"), "{result}");
    assert!(cache.path().join("built").exists());

    refused_at_start(
        &["--sandbox-write", "no-such-dir"],
        "--sandbox-write no-such-dir: no such directory",
    );
}

/// `agent run` with `flags` is refused before anything runs or is written: exit 2, one
/// line, saying `says`.
fn refused_at_start(flags: &[&str], says: &str) {
    refused_at_start_in(&Env::new(), flags, says);
}

/// [`refused_at_start`] in `env`'s directory as it is.
fn refused_at_start_in(env: &Env, flags: &[&str], says: &str) {
    let model = one_shell_call(env, "true");
    let out = env
        .cmd()
        .arg("run")
        .args(flags)
        .args(["--model", &model, "go"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let err = stderr(&out);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains(says), "{err}");
    assert!(!env.store().exists(), "nothing written");
}

/// A repository a sandboxed command makes whose git would run programs (a hook, a
/// setting that names one) is named in the command's result: whoever uses git there later
/// runs them, though the repository is read-only to the commands after. One as `git init`
/// makes it is not named. Without the sandbox nothing is looked for.
#[test]
fn a_repository_a_sandboxed_command_makes_with_hooks_is_named() {
    for sandboxed in [false, true] {
        let env = Env::new();
        // A repository whose hooks run from a directory not made yet.
        let app = env.dir.path().join("app/.git");
        std::fs::create_dir_all(&app).unwrap();
        std::fs::write(
            app.join("config"),
            "[core]\n\thooksPath = .husky/_\n[include]\n\tpath = ../app.gitconfig\n",
        )
        .unwrap();
        let command = "mkdir -p plain/.git/hooks made/.git/hooks && \
                       touch plain/.git/hooks/pre-commit.sample && \
                       printf '[core]\\n\\tbare = false\\n' > plain/.git/config && \
                       printf '[core]\\n\\tfsmonitor = evil\\n' > made/.git/config && \
                       echo evil > made/.git/hooks/post-checkout && \
                       mkdir -p src/objects src/refs && echo 'ref: refs/heads/main' > src/HEAD && \
                       printf '[alias]\\n\\tst = !evil\\n' > src/config && \
                       mkdir -p objects refs && echo 'ref: refs/heads/main' > HEAD && \
                       mkdir -p app/.husky/_ && echo evil > app/.husky/_/pre-commit && \
                       printf '[core]\\n\\tfsmonitor = evil\\n' > app/app.gitconfig && echo end";
        let flags: &[&str] = if sandboxed { &["--sandbox"] } else { &[] };
        let result = one_call(&env, false, command, flags);
        let said = output(&result);
        assert!(said.contains("--- stdout ---\nend\n"), "{said}");
        let named = "the command made a repository in which git would run what the \
                     command wrote (look before using git there): app/.husky/_ \
                     (pre-commit); app/app.gitconfig (core.fsmonitor); made/.git (hooks/post-checkout; core.fsmonitor); src \
                     (alias.st)\n";
        assert_eq!(said.contains(named), sandboxed, "{said}");
        assert!(!said.contains("plain/.git"), "{said}");
        // The workspace made a bare repository's directory: its `HEAD` is taken away.
        let removed = "the command made what no command may make: HEAD (what would make \
                       the workspace a bare repository): removed\n";
        assert_eq!(said.contains(removed), sandboxed, "{said}");
        assert_eq!(env.dir.path().join("HEAD").exists(), !sandboxed, "{said}");
    }
}

/// A workspace that holds more repositories than a sandbox keeps read-only is refused
/// before anything runs, in one line: no command runs with some of them left writable.
#[test]
fn a_workspace_with_more_repositories_than_a_sandbox_keeps_is_refused() {
    let env = Env::new();
    // With the run's store, 1,024 places.
    for i in 0..1023 {
        std::fs::create_dir_all(env.dir.path().join(format!("src/r{i}/.git"))).unwrap();
    }
    let result = one_call(&env, false, "echo end", &["--sandbox"]);
    assert!(output(&result).contains("end"), "{result}");
    std::fs::remove_dir_all(env.store()).unwrap();
    for more in ["src/r1023/.git", ".git"] {
        std::fs::create_dir_all(env.dir.path().join(more)).unwrap();
    }
    refused_at_start_in(&env, &["--sandbox"], "holds 1025 git directories");
}

/// An answer check runs what the model left in the workspace (its tests, its build
/// scripts): with `--sandbox` it runs in the sandbox too, writing in the workspace and
/// nowhere else, where without it the same check writes outside.
#[test]
fn an_answer_check_runs_in_the_sandbox_too() {
    for sandboxed in [false, true] {
        let env = Env::new();
        let outside = outside_covered();
        let model = env.script(json!([{"final": "yes"}]));
        let check = format!(
            "echo x > {}/escaped; echo y > made-by-check",
            outside.path().display()
        );
        let mut args = vec!["run", "--json", "--check", &check, "--model", &model];
        if sandboxed {
            args.push("--sandbox");
        }
        args.push("go");
        let out = env.run(&args);
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        assert!(env.dir.path().join("made-by-check").exists());
        assert_eq!(
            outside.path().join("escaped").exists(),
            !sandboxed,
            "sandboxed: {sandboxed}"
        );
    }
}

/// A run started with `--sandbox` records it: `agent show` says so, and a call approved
/// later from a command that says nothing of a sandbox runs in it (said on the terminal),
/// as it does where a project's agent.toml says `sandbox = false` (a file does not take a
/// run's sandbox away), while `--no-sandbox` runs it without, as the person then asked.
#[test]
fn a_run_keeps_its_sandbox_when_taken_up_unless_told_otherwise() {
    for (no_sandbox, file_says_no) in [(false, false), (false, true), (true, false)] {
        let env = Env::new();
        let outside = outside_covered();
        let model = one_shell_call(
            &env,
            &format!("echo x > {}/escaped", outside.path().display()),
        );
        let out = env.run(&["run", "--sandbox", "--model", &model, "go"]);
        assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
        let id = paused_run_id(&out);
        assert!(
            stderr(&out).contains(
                "approved, a shell command runs in the run's sandbox: it writes only in \
                 the workspace, no network, no credentials"
            ),
            "{}",
            stderr(&out)
        );
        let shown = crate::stdout(&env.run(&["show", &id]));
        assert!(shown.contains("commands sandboxed (no network)"), "{shown}");
        if file_says_no {
            std::fs::write(env.dir.path().join("agent.toml"), "sandbox = false\n").unwrap();
        }
        let mut args = vec!["approve", &id, "--model", &model];
        if no_sandbox {
            args.push("--no-sandbox");
        }
        let out = env.run(&args);
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        assert_eq!(
            stderr(&out).contains("runs its commands in a sandbox, as it started"),
            !no_sandbox,
            "{}",
            stderr(&out)
        );
        assert_eq!(
            outside.path().join("escaped").exists(),
            no_sandbox,
            "--no-sandbox: {no_sandbox}, sandbox = false: {file_says_no}"
        );
    }
}

/// agent.toml may ask for the sandbox with no one's trust (it only narrows what commands
/// do), but what it widens in it, the network, a directory to write in or credentials to
/// show, needs trust as an `allow` rule does; a directory it names is relative to it.
#[test]
fn agent_toml_asks_for_the_sandbox_and_needs_trust_to_widen_it() {
    let env = Env::new();
    let outside = outside_covered();
    let toml = env.dir.path().join("agent.toml");
    let model = one_shell_call(
        &env,
        &format!(
            "echo x > {}/escaped; echo y > cache/made",
            outside.path().display()
        ),
    );
    std::fs::write(&toml, "sandbox = true\n").unwrap();
    let result = call_of(&env, false, &model, &[]);
    assert!(output(&result).contains("cache/made"), "{result}");
    assert!(!outside.path().join("escaped").exists());

    std::fs::create_dir(env.dir.path().join("cache")).unwrap();
    for widening in [
        "sandbox_network = true\n",
        "sandbox_write = [\"cache\"]\n",
        "sandbox_show = [\"cache\"]\n",
    ] {
        std::fs::write(&toml, format!("sandbox = true\n{widening}")).unwrap();
        let out = env.run(&["run", "--allow", "shell", "--model", &model, "go"]);
        assert_eq!(out.status.code(), Some(2), "{widening}: {}", stderr(&out));
        let err = stderr(&out);
        let named = widening.split(' ').next().unwrap();
        assert!(
            err.contains(named) && err.contains("agent trust"),
            "{widening}: {err}"
        );
    }
    let out = env.run(&["trust"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let result = call_of(&env, false, &model, &[]);
    assert!(output(&result).starts_with("exit code: 0"), "{result}");
    assert!(env.dir.path().join("cache/made").exists());
    assert!(!outside.path().join("escaped").exists());
}

/// A sandboxed command holds no capability, and as root neither (its bounding set is
/// empty: nothing it starts gains one), so it makes no device node, in the workspace
/// either, where without the sandbox root makes one (a node for a disk is a way to write
/// it whatever the file rules say).
#[test]
fn a_sandboxed_command_holds_no_capability_even_as_root() {
    let command = "grep -E '^Cap(Eff|Bnd)' /proc/self/status; mknod node c 1 3 && echo made-node";
    let as_root = nix::unistd::geteuid().is_root();
    for sandboxed in [false, true] {
        let env = Env::new();
        let flags: &[&str] = if sandboxed { &["--sandbox"] } else { &[] };
        let result = one_call(&env, false, command, flags);
        let said = output(&result);
        if sandboxed {
            assert!(said.contains("CapEff:\t0000000000000000"), "{said}");
            assert!(said.contains("CapBnd:\t0000000000000000"), "{said}");
            assert!(!said.contains("made-node"), "{said}");
            assert!(!env.dir.path().join("node").exists(), "{said}");
        } else if as_root {
            assert!(said.contains("made-node"), "{said}");
        }
    }
}

/// With the network given back, a sandboxed command still reaches no socket of the
/// abstract namespace made outside it (an X server's, a D-Bus bus's; here one this test
/// listens on), where the kernel scopes them (Landlock ABI 6, Linux 6.12); without the
/// sandbox it does.
#[test]
fn a_sandboxed_command_with_network_reaches_no_abstract_socket_outside() {
    use std::os::linux::net::SocketAddrExt;
    if !kernel_at_least(6, 12) {
        return;
    }
    let name = format!("agent-sandbox-test-{}", std::process::id());
    let address = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
    let _listener = std::os::unix::net::UnixListener::bind_addr(&address).unwrap();
    let command = format!(
        "python3 -c 'import socket; s = socket.socket(socket.AF_UNIX); \
         s.connect(\"\\0{name}\"); print(\"reached-abstract\")'"
    );
    for (flags, reached) in [(&[][..], true), (&["--sandbox-network"][..], false)] {
        let env = Env::new();
        let result = one_call(&env, false, &command, flags);
        let said = output(&result);
        assert_eq!(
            said.contains("reached-abstract"),
            reached,
            "{flags:?}: {said}"
        );
    }
}

/// Whether this machine's kernel is at least `major.minor`.
fn kernel_at_least(major: u32, minor: u32) -> bool {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    let mut parts = release
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|p| p.parse::<u32>().ok());
    (parts.next().unwrap_or(0), parts.next().unwrap_or(0)) >= (major, minor)
}

/// An evaluation's trials run their commands in a sandbox when their case says
/// `sandbox = true`, and all of them with `agent eval --sandbox`, whatever the case says:
/// a case's model that writes outside its trial's workspace then cannot.
#[test]
fn evaluation_trials_run_in_the_sandbox_their_case_or_the_flag_asks_for() {
    for (case_says, flag, sandboxed) in [
        ("", false, false),
        ("sandbox = true\n", false, true),
        ("sandbox_network = false\n", true, true),
    ] {
        let env = Env::new();
        let outside = outside_covered();
        let model = one_shell_call(
            &env,
            &format!(
                "echo x > {}/escaped; echo y > made",
                outside.path().display()
            ),
        );
        let case = env.dir.path().join("case.toml");
        std::fs::write(
            &case,
            format!(
                "goal = \"write\"\nmodel = {model:?}\nallow = [\"shell\"]\n{case_says}\
                 [expect]\nreason = \"completed\"\n\n[[expect.files]]\npath = \"made\"\n\
                 content = \"y\\n\"\n"
            ),
        )
        .unwrap();
        let mut cmd = env.bare();
        cmd.arg("eval");
        if flag {
            cmd.arg("--sandbox");
        }
        let out = cmd.arg(&case).output().unwrap();
        assert_eq!(
            out.status.code(),
            Some(0),
            "{}{}",
            crate::stdout(&out),
            stderr(&out)
        );
        assert_eq!(
            outside.path().join("escaped").exists(),
            !sandboxed,
            "case: {case_says:?}, --sandbox: {flag}"
        );
    }
}

/// A protected place that is not there cannot be bound read-only: one a sandboxed
/// command makes (a `.git` with a hook, where the workspace had no repository; an
/// `agent.toml`) is taken away once the command and all it started are gone, and the
/// model is told. Without the sandbox the same command leaves them (the file tools, not
/// the shell, keep them from being made there).
#[test]
fn what_a_sandboxed_command_may_not_make_is_taken_away() {
    for sandboxed in [false, true] {
        let env = Env::new();
        let command = "mkdir -p .git/hooks && echo evil > .git/hooks/pre-commit; \
                       echo 'model = \"openai:o1-pro\"' > agent.toml; echo kept > kept.txt";
        let flags: &[&str] = if sandboxed { &["--sandbox"] } else { &[] };
        let result = one_call(&env, false, command, flags);
        let said = output(&result);
        let ws = env.dir.path();
        assert!(ws.join("kept.txt").exists(), "{said}");
        assert_eq!(ws.join(".git").exists(), !sandboxed, "{said}");
        assert_eq!(ws.join("agent.toml").exists(), !sandboxed, "{said}");
        assert_eq!(
            said.contains("the command made what no command may make: .git (a git directory): removed; agent.toml (agent's settings file): removed"),
            sandboxed,
            "{said}"
        );
    }
}

/// A protected place cannot be moved away with its directory and another made where it
/// was: the directories between the workspace and it, and the workspace itself, are
/// mount points for the command, which cannot be renamed (here the settings file named by
/// `--config` in a subdirectory, and a workspace whose parent the command may write in).
/// Without the sandbox both moves succeed.
#[test]
fn a_protected_place_cannot_be_moved_away_with_its_directory() {
    for sandboxed in [false, true] {
        let env = Env::new();
        let parent = outside_covered();
        let ws = parent.path().join("ws");
        std::fs::create_dir_all(ws.join("conf")).unwrap();
        std::fs::write(ws.join("conf/agent.toml"), "max_steps = 20\n").unwrap();
        let command = "mv conf conf2; mkdir -p conf && echo 'max_steps = 999' > conf/agent.toml; \
                       mv ../ws ../moved; echo end";
        let model = one_shell_call(&env, command);
        let mut cmd = env.cmd();
        cmd.arg("--config")
            .arg(ws.join("conf/agent.toml"))
            .args(["run", "--json", "--allow", "shell", "--workspace"])
            .arg(&ws)
            .args(["--model", &model]);
        if sandboxed {
            cmd.arg("--sandbox")
                .arg("--sandbox-write")
                .arg(parent.path());
        }
        let out = cmd.arg("go").output().unwrap();
        let said = call_results(&env, &out)("call-1").to_string();
        assert_eq!(parent.path().join("moved").exists(), !sandboxed, "{said}");
        let conf = if sandboxed {
            ws.join("conf/agent.toml")
        } else {
            parent.path().join("moved/conf2/agent.toml")
        };
        assert_eq!(
            std::fs::read_to_string(&conf).unwrap(),
            "max_steps = 20\n",
            "{said}"
        );
        if sandboxed {
            assert!(!ws.join("conf2").exists(), "{said}");
        }
    }
}

/// A repository nested in the workspace (a checkout beside others, a submodule whose
/// `.git` is a file) is kept from a sandboxed command as the workspace's own is: its hooks
/// and config, and where a submodule's `.git` file says they are, cannot be changed, nor
/// the repository moved away with its directory and another made in its place; its
/// other files are written as any. One made by an earlier command of the run is kept so
/// too. Without the sandbox all of it is changed.
#[test]
fn a_sandboxed_command_changes_no_git_directory_nested_in_the_workspace() {
    for as_nobody in users() {
        for sandboxed in [false, true] {
            let env = Env::new();
            let ws = env.dir.path();
            let nested = ws.join("src/proj/.git");
            std::fs::create_dir_all(nested.join("hooks")).unwrap();
            // Its hooks run from `.husky/_` (as husky sets them up), which git ignores.
            // and its config includes a file of the work tree (settings a team shares).
            let config = "[core]\n\thooksPath = .husky/_\n[include]\n\tpath = ../team.gitconfig\n";
            std::fs::write(nested.join("config"), config).unwrap();
            std::fs::create_dir_all(ws.join("src/proj/.husky/_")).unwrap();
            let team = ws.join("src/proj/team.gitconfig");
            std::fs::write(&team, "[core]\n").unwrap();
            std::fs::create_dir_all(ws.join("vendor/sub")).unwrap();
            let pointer = ws.join("vendor/sub/.git");
            std::fs::write(&pointer, "gitdir: ../../.git/modules/sub\n").unwrap();
            // A bare repository, as `git init --bare` makes one.
            let backups = ws.join("backups/site.git");
            for dir in ["objects", "refs/heads"] {
                std::fs::create_dir_all(backups.join(dir)).unwrap();
            }
            std::fs::write(backups.join("HEAD"), "ref: refs/heads/main\n").unwrap();
            std::fs::write(backups.join("config"), "[core]\n").unwrap();
            for place in [
                ws.join("src"),
                ws.join("src/proj"),
                nested.clone(),
                nested.join("hooks"),
                ws.join("src/proj/.husky"),
                ws.join("src/proj/.husky/_"),
                ws.join("vendor"),
                ws.join("vendor/sub"),
                ws.join("backups"),
                backups.clone(),
            ] {
                std::fs::set_permissions(&place, std::fs::Permissions::from_mode(0o777)).unwrap();
            }
            for file in [
                nested.join("config"),
                pointer.clone(),
                backups.join("config"),
                team.clone(),
            ] {
                std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o666)).unwrap();
            }
            // The first command makes a repository, and turns `lib` into a bare one; the
            // second tries them all.
            let model = env.script(json!([
                    {"tool_calls": [{"id": "call-0", "name": "shell", "arguments": {
                        "command": "mkdir -p made/.git && echo '[core]' > made/.git/config && \
                                    mkdir -p lib/objects lib/refs && echo '[core]' > lib/config && \
                                    echo 'ref: refs/heads/main' > lib/HEAD && echo made"}}]},
                    {"tool_calls": [{"id": "call-1", "name": "shell", "arguments": {"command":
                        "echo '[core] fsmonitor = evil' >> src/proj/.git/config; \
                         echo evil > src/proj/.git/hooks/pre-commit; \
                         echo evil > src/proj/.husky/_/pre-commit; \
                         echo '[core] fsmonitor = evil' >> src/proj/team.gitconfig; \
                         echo 'gitdir: ../../evil' > vendor/sub/.git; \
                         echo '[core] fsmonitor = evil' >> made/.git/config; \
                         echo '[core] fsmonitor = evil' >> backups/site.git/config; \
                         echo '[core] fsmonitor = evil' >> lib/config; \
                         echo code > src/proj/main.c; \
                         mv src/proj src/moved; echo end"}}]},
                    {"final": "done"}
            ]));
            let flags: &[&str] = if sandboxed { &["--sandbox"] } else { &[] };
            let result = call_of(&env, as_nobody, &model, flags);
            let said = output(&result);
            let case = format!("nobody: {as_nobody}, sandboxed: {sandboxed}: {said}");
            assert!(said.contains("--- stdout ---\nend\n"), "{case}");
            let proj = if sandboxed { "src/proj" } else { "src/moved" };
            let proj = ws.join(proj);
            assert_eq!(ws.join("src/moved").exists(), !sandboxed, "{case}");
            assert_eq!(
                std::fs::read_to_string(proj.join("main.c")).unwrap(),
                "code\n",
                "{case}"
            );
            let unchanged = [
                (proj.join(".git/config"), config),
                (pointer.clone(), "gitdir: ../../.git/modules/sub\n"),
                (ws.join("made/.git/config"), "[core]\n"),
                (backups.join("config"), "[core]\n"),
                (proj.join("team.gitconfig"), "[core]\n"),
                (ws.join("lib/config"), "[core]\n"),
            ];
            for (file, was) in unchanged {
                assert_eq!(
                    std::fs::read_to_string(&file).unwrap() == was,
                    sandboxed,
                    "{}: {case}",
                    file.display()
                );
            }
            for hook in [".git/hooks/pre-commit", ".husky/_/pre-commit"] {
                assert_eq!(proj.join(hook).exists(), !sandboxed, "{hook}: {case}");
            }
            if sandboxed {
                assert!(said.contains("Read-only file system"), "{case}");
            }
        }
    }
}

/// `--sandbox-read-only`: a command writes nothing in the workspace, even where the
/// workspace lies in `/tmp` (whose own copy it may write in), while its own `/tmp` works;
/// the model is told, and the run records it (`agent show`). Without it the same
/// command writes there.
#[test]
fn a_read_only_sandbox_writes_nothing_in_the_workspace() {
    for (in_tmp, read_only) in [(true, false), (true, true), (false, true)] {
        let env = Env::new();
        let elsewhere = outside_covered();
        let ws = if in_tmp {
            env.dir.path().to_path_buf()
        } else {
            elsewhere.path().to_path_buf()
        };
        let model = one_shell_call(
            &env,
            "echo x > made.txt; echo y > /tmp/own && cat /tmp/own; echo end",
        );
        let flag = if read_only {
            "--sandbox-read-only"
        } else {
            "--sandbox"
        };
        let out = env
            .cmd()
            .args(["run", "--json", "--allow", "shell", flag, "--workspace"])
            .arg(&ws)
            .args(["--model", &model, "go"])
            .output()
            .unwrap();
        let result = call_results(&env, &out)("call-1");
        let said = output(&result);
        let case = format!("in /tmp: {in_tmp}, read-only: {read_only}: {said}");
        assert_eq!(ws.join("made.txt").exists(), !read_only, "{case}");
        assert!(said.contains("\ny\nend\n"), "{case}");
        assert_eq!(said.contains("Read-only file system"), read_only, "{case}");
        let id = serde_json::from_slice::<Value>(&out.stdout).unwrap()["run_id"]
            .as_str()
            .unwrap()
            .to_owned();
        let shown = crate::stdout(&env.run(&["show", &id]));
        let kind = if read_only {
            "read-only, no network"
        } else {
            "no network"
        };
        assert!(
            shown.contains(&format!("commands sandboxed ({kind})")),
            "{shown}"
        );
        let log: Value =
            serde_json::from_str(&crate::stdout(&env.run(&["show", "--json", &id]))).unwrap();
        let told = log["events"][0]["manifest"]["tools"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["name"] == "shell")
            .map(|t| t["description"].to_string())
            .unwrap();
        assert_eq!(
            told.contains("may write only in /tmp (the workspace is read-only)"),
            read_only,
            "{told}"
        );
    }
}

/// A read-only sandbox is kept as such by a process that takes the run up: a command
/// approved later writes nothing in the workspace either.
#[test]
fn a_read_only_sandbox_is_kept_when_the_run_is_taken_up() {
    let env = Env::new();
    let model = one_shell_call(&env, "echo x > made.txt");
    let out = env.run(&["run", "--sandbox-read-only", "--model", &model, "go"]);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    let said = stderr(&out);
    assert!(
        said.contains("approved, a shell command runs in the run's sandbox: it writes only in its own /tmp, no network, no credentials"),
        "{said}"
    );
    let id = paused_run_id(&out);
    let out = env.run(&["approve", &id, "--model", &model]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(!env.dir.path().join("made.txt").exists());
}

/// A home directory with credentials where the tools of the person keep them, each file
/// holding its own marker, and a file of notes that is none; readable by anyone (so that
/// `nobody`, outside the sandbox, reads them all).
fn home_with_credentials() -> tempfile::TempDir {
    let home = outside_covered();
    for (place, text) in [
        (".ssh/id_ed25519", "ssh-key-7301"),
        (".netrc", "netrc-password-7301"),
        (".config/gh/hosts.yml", "gh-token-7301"),
        ("notes.txt", "notes-7301"),
    ] {
        let path = home.path().join(place);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, text).unwrap();
    }
    home
}

/// A sandboxed command reads none of the credentials of the home directory (`HOME`): an
/// SSH key, a `.netrc`, the GitHub CLI's token, which the same command without the sandbox
/// prints to the model (and so to its provider and the run's log); it reads the rest of
/// the home. `--sandbox-show` leaves the places beneath it visible, the others hidden;
/// `--sandbox-hide` hides one more. As root and as `nobody`.
#[test]
fn a_sandboxed_command_reads_no_credentials_of_the_home_directory() {
    let home = home_with_credentials();
    let h = home.path().display().to_string();
    let command = format!(
        "cat {h}/.ssh/id_ed25519 {h}/.netrc {h}/.config/gh/hosts.yml {h}/notes.txt; ls -a {h}/.ssh"
    );
    let show_ssh = format!("{h}/.ssh");
    let hide_notes = format!("{h}/notes.txt");
    let all = ["ssh-key", "netrc-password", "gh-token", "notes"];
    let cases: [(&[&str], &[&str]); 4] = [
        (&[], &all),
        (&["--sandbox"], &["notes"]),
        (&["--sandbox-show", &show_ssh], &["ssh-key", "notes"]),
        (&["--sandbox-hide", &hide_notes], &[]),
    ];
    for as_nobody in users() {
        for (flags, seen) in cases {
            let env = Env::new();
            let model = one_shell_call(&env, &command);
            let mut cmd = if as_nobody {
                let mut cmd = not_root(&env);
                cmd.arg("--store").arg(env.store());
                cmd
            } else {
                env.cmd()
            };
            let out = cmd
                .env("HOME", home.path())
                .args(["run", "--json", "--allow", "shell", "--model", &model])
                .args(flags)
                .arg("go")
                .output()
                .unwrap();
            let result = call_results(&env, &out)("call-1");
            let said = output(&result);
            for marker in all {
                assert_eq!(
                    said.contains(&format!("{marker}-7301")),
                    seen.contains(&marker),
                    "nobody: {as_nobody}, {flags:?}, {marker}: {said}"
                );
            }
            assert_eq!(
                said.contains("id_ed25519\n"),
                seen.contains(&"ssh-key"),
                "{said}"
            );
        }
    }
}

/// Where the workspace is the home directory, so that the rules on writes let a command
/// write there, a hidden place takes no write either: no key planted in
/// `~/.ssh/authorized_keys`, nothing added to `~/.netrc` (refused, not swallowed), and
/// nothing of how files are hidden is left in the command's own directories.
#[test]
fn a_hidden_place_takes_no_write_where_the_workspace_is_the_home_directory() {
    let home = home_with_credentials();
    let command = "echo key >> .ssh/authorized_keys; echo 'machine m password p' >> .netrc; \
                   ls -a /tmp /run /dev/shm; echo end";
    for sandboxed in [false, true] {
        let env = Env::new();
        let mut flags = vec!["--workspace", home.path().to_str().unwrap()];
        if sandboxed {
            flags.push("--sandbox");
        }
        let model = one_shell_call(&env, command);
        let out = env
            .cmd()
            .env("HOME", home.path())
            .args(["run", "--json", "--allow", "shell", "--model", &model])
            .args(&flags)
            .arg("go")
            .output()
            .unwrap();
        let result = call_results(&env, &out)("call-1");
        let said = output(&result);
        assert!(said.contains("\nend\n"), "{said}");
        assert_eq!(
            home.path().join(".ssh/authorized_keys").exists(),
            !sandboxed,
            "{said}"
        );
        let netrc = std::fs::read_to_string(home.path().join(".netrc")).unwrap();
        assert_eq!(netrc == "netrc-password-7301", sandboxed, "{said}");
        assert_eq!(
            said.matches("Read-only file system").count(),
            if sandboxed { 2 } else { 0 },
            "{said}"
        );
        assert!(!said.contains("agent-loop"), "{said}");
        let _ = std::fs::remove_file(home.path().join(".ssh/authorized_keys"));
        std::fs::write(home.path().join(".netrc"), "netrc-password-7301").unwrap();
    }
}

/// A place named to hide must be there (a misspelt one would hide nothing and say
/// nothing): refused before anything runs, in one line. One that holds the workspace is
/// left visible, or no command could run.
#[test]
fn a_place_named_to_hide_must_be_there_and_never_hides_the_workspace() {
    refused_at_start(
        &["--sandbox-hide", "no-such-place"],
        "--sandbox-hide no-such-place: no such file or directory",
    );

    let env = Env::new();
    let workspace = env.dir.path().to_str().unwrap();
    let result = one_call(
        &env,
        false,
        "echo x > made.txt && cat made.txt",
        &["--sandbox-hide", workspace],
    );
    assert!(output(&result).starts_with("exit code: 0"), "{result}");
    assert!(env.dir.path().join("made.txt").exists());
}

/// What a run's sandbox hides and shows is recorded with it and kept by a process that
/// takes the run up: a command approved later reads what was shown and not what was
/// hidden; `agent show` and the person asked to approve are told what it may read.
#[test]
fn what_a_sandbox_hides_and_shows_is_kept_when_the_run_is_taken_up() {
    let home = home_with_credentials();
    let h = home.path().display().to_string();
    let env = Env::new();
    let model = one_shell_call(
        &env,
        &format!("cat {h}/.ssh/id_ed25519 {h}/.netrc {h}/notes.txt"),
    );
    let show = format!("{h}/.ssh");
    let hide = format!("{h}/notes.txt");
    let out = env
        .cmd()
        .env("HOME", home.path())
        .args(["run", "--sandbox-show", &show, "--sandbox-hide", &hide])
        .args(["--model", &model, "go"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    let said = stderr(&out);
    assert!(
        said.contains(&format!("no network, the credentials in {show:?} visible")),
        "{said}"
    );
    let id = paused_run_id(&out);
    let shown = crate::stdout(&env.run(&["show", &id]));
    assert!(
        shown.contains(&format!(
            "commands sandboxed (no network, the credentials in {show:?} visible)"
        )),
        "{shown}"
    );
    let out = env
        .cmd()
        .env("HOME", home.path())
        .args(["approve", &id, "--json", "--model", &model])
        .output()
        .unwrap();
    let result = call_results(&env, &out)("call-1");
    let said = output(&result);
    assert!(said.contains("ssh-key-7301"), "{said}");
    assert!(!said.contains("netrc-password-7301"), "{said}");
    assert!(!said.contains("notes-7301"), "{said}");
}

/// Root's sandboxed commands, which hold no capability but own the system's credential
/// files, read none of them (here the password hashes of `/etc/shadow`), where the same
/// command without the sandbox, or with them shown, reads them; another user reads them
/// in no case.
#[test]
fn a_sandboxed_command_run_as_root_reads_no_password_hashes() {
    let as_root = nix::unistd::geteuid().is_root();
    let command = "wc -c < /etc/shadow";
    for as_nobody in users() {
        for (flags, read) in [
            (&[][..], true),
            (&["--sandbox"][..], false),
            (&["--sandbox-show", "/etc/shadow"][..], true),
        ] {
            let env = Env::new();
            let result = one_call(&env, as_nobody, command, flags);
            let said = output(&result);
            let bytes: Option<u64> = said
                .lines()
                .find_map(|line| line.trim().parse().ok())
                .filter(|_| said.starts_with("exit code: 0"));
            let readable = as_root && !as_nobody && read;
            assert_eq!(
                bytes.is_some_and(|n| n > 0),
                readable,
                "nobody: {as_nobody}, {flags:?}: {said}"
            );
        }
    }
}

/// agent.toml may hide a place with no one's trust and show credentials with it, each
/// place named from the home directory with `~` as a person writes it (not relative to
/// the file, where `~/.ssh` would name nothing and show nothing).
#[test]
fn agent_toml_names_what_the_sandbox_hides_and_shows_from_the_home_directory() {
    let home = home_with_credentials();
    let h = home.path().display().to_string();
    let env = Env::new();
    let model = one_shell_call(
        &env,
        &format!("cat {h}/.ssh/id_ed25519 {h}/.netrc {h}/notes.txt"),
    );
    let agent = |args: &[&str]| {
        env.cmd()
            .env("HOME", home.path())
            .args(args)
            .output()
            .unwrap()
    };
    let run = || agent(&["run", "--json", "--allow", "shell", "--model", &model, "go"]);
    // The call's output, read with the same home (the file names places from it).
    let output_of = |out: &std::process::Output| {
        assert_eq!(out.status.code(), Some(0), "{}", stderr(out));
        let run: Value = serde_json::from_slice(&out.stdout).unwrap();
        let shown = agent(&["show", "--json", run["run_id"].as_str().unwrap()]);
        let log: Value = serde_json::from_slice(&shown.stdout).unwrap();
        let finished = log["events"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["type"] == "tool_finished")
            .unwrap()
            .clone();
        output(&finished["result"]).to_owned()
    };
    std::fs::write(
        env.dir.path().join("agent.toml"),
        "sandbox_hide = [\"~/notes.txt\"]\n",
    )
    .unwrap();
    let said = output_of(&run());
    assert!(
        !said.contains("notes-7301") && !said.contains("ssh-key-7301"),
        "{said}"
    );
    std::fs::write(
        env.dir.path().join("agent.toml"),
        "sandbox_show = [\"~/.ssh\"]\n",
    )
    .unwrap();
    let out = run();
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("sandbox_show ~/.ssh"),
        "{}",
        stderr(&out)
    );
    let out = agent(&["trust"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let said = output_of(&run());
    assert!(said.contains("ssh-key-7301"), "{said}");
    assert!(
        said.contains("notes-7301") && !said.contains("netrc-password-7301"),
        "{said}"
    );
}

/// An MCP server whose entry says `"sandbox": true` runs in the sandbox `shell` commands
/// run in, with the network: it reads none of the home directory's credentials, writes
/// nowhere outside the workspace, not in the run store, and a `.git` it makes where there
/// was none is taken away after the call, and a repository it makes with hooks is named;
/// `{"network": false}` takes the network away too. The same server without it does all of that. One whose sandbox
/// cannot be made does not start, and nothing runs.
#[test]
fn an_mcp_server_that_asks_for_a_sandbox_runs_in_one() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let home = home_with_credentials();
    let outside = outside_covered();
    let command = format!(
        "cat {h}/.ssh/id_ed25519; echo x > {o}/escaped; echo d > store/planted; \
         mkdir -p .git/hooks && echo evil > .git/hooks/pre-commit; \
         mkdir -p sub/.git/hooks && echo evil > sub/.git/hooks/pre-commit; \
         (exec 3<>/dev/tcp/127.0.0.1/{port}) 2>/dev/null && echo reached-host; echo end",
        h = home.path().display(),
        o = outside.path().display(),
    );
    for (sandbox, confined, network) in [
        (json!(false), false, true),
        (json!(true), true, true),
        (json!({"network": false}), true, false),
        // The network is a server's unless it says otherwise.
        (json!({"write": []}), true, true),
    ] {
        let env = Env::new();
        let config = crate::py_mcp_config_sandboxed(&env, "r", sandbox.clone());
        std::fs::create_dir_all(env.store()).unwrap();
        let model = env.script(json!([
            {"tool_calls": [{"id": "call-1", "name": "mcp__r__run",
                             "arguments": {"command": command}}]},
            {"final": "done"}
        ]));
        let out = run_with_mcp(&env, config, &model, ("HOME", home.path().as_os_str()));
        let result = call_results(&env, &out)("call-1");
        let said = output(&result);
        let case = format!("sandbox {sandbox}: {said}");
        assert!(said.contains("end"), "{case}");
        assert_eq!(said.contains("ssh-key-7301"), !confined, "{case}");
        assert_eq!(outside.path().join("escaped").exists(), !confined, "{case}");
        assert_eq!(env.store().join("planted").exists(), !confined, "{case}");
        assert_eq!(said.contains("reached-host"), network, "{case}");
        // A protected place that was not there, made by a call, is taken away after it.
        assert_eq!(env.dir.path().join(".git").exists(), !confined, "{case}");
        assert_eq!(
            said.contains("the server made what it may not make: .git (a git directory): removed"),
            confined,
            "{case}"
        );
        // A repository made where none was known is not the sandbox's to take away (it was
        // described at the start): named, with what git would run there.
        assert!(
            env.dir.path().join("sub/.git/hooks/pre-commit").exists(),
            "{case}"
        );
        assert_eq!(
            said.contains(
                "the server made a repository in which git would run what the server wrote \
                 (look before using git there): sub/.git (hooks/pre-commit)"
            ),
            confined,
            "{case}"
        );
        let _ = std::fs::remove_file(outside.path().join("escaped"));
    }

    let env = Env::new();
    let config = crate::py_mcp_config_sandboxed(&env, "r", json!(true));
    let model = env.script(json!([
        {"tool_calls": [{"id": "call-1", "name": "mcp__r__run",
                         "arguments": {"command": "echo ran > ran.txt"}}]},
        {"final": "done"}
    ]));
    let out = run_with_mcp(
        &env,
        config,
        &model,
        ("AGENT_LOOP_PID_NAMESPACE", "off".as_ref()),
    );
    assert_ne!(out.status.code(), Some(0), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("MCP server \"r\" failed to start") && err.contains("sandbox cannot be made"),
        "{err}"
    );
    assert!(!env.dir.path().join("ran.txt").exists());
}
