//! `agent chat` and the approvals `agent run` asks inline, driven through a real
//! pseudo-terminal: what a person types goes in at the terminal, what they see comes out
//! of it, and the log holds exactly what the non-interactive commands would have written.

use std::io::{Read, Write};
use std::process::{Child, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::{Env, stderr};

/// A child process on the slave side of a pseudo-terminal (stdin, stdout and stderr).
struct Terminal {
    child: Child,
    master: std::fs::File,
    /// What the terminal showed, escape sequences removed, and how far `expect` read.
    screen: Arc<(Mutex<String>, Condvar)>,
    read: usize,
    /// Set by the reader once the terminal has nothing more to show (every slave side
    /// closed), just before its last wake-up.
    drained: Arc<AtomicBool>,
}

/// A test that fails leaves no `agent` behind it on the terminal.
impl Drop for Terminal {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Failure bound for a line that never comes; nothing waits this long when things work.
const PATIENCE: Duration = Duration::from_secs(60);

impl Terminal {
    fn spawn(env: &Env, args: &[&str]) -> Terminal {
        let mut cmd = env.cmd();
        cmd.args(args);
        Terminal::start(cmd)
    }

    /// As a person's shell starts it: in a session of its own whose controlling terminal
    /// this is (`setsid --ctty`), so that Ctrl-C typed at the terminal ([`Terminal::ctrl_c`])
    /// reaches every process of the foreground process group, as it does at a real one.
    fn spawn_in_session(env: &Env, args: &[&str]) -> Terminal {
        Terminal::start_in_session(env.cmd(), args)
    }

    /// [`Terminal::spawn_in_session`] of `agent` (an `agent` command of the test's).
    fn start_in_session(agent: std::process::Command, args: &[&str]) -> Terminal {
        let mut cmd = std::process::Command::new("setsid");
        cmd.arg("--ctty")
            .arg(agent.get_program())
            .args(agent.get_args())
            .args(args);
        for (name, value) in agent.get_envs() {
            match value {
                Some(value) => cmd.env(name, value),
                None => cmd.env_remove(name),
            };
        }
        if let Some(dir) = agent.get_current_dir() {
            cmd.current_dir(dir);
        }
        Terminal::start(cmd)
    }

    fn start(mut cmd: std::process::Command) -> Terminal {
        let pty = nix::pty::openpty(None, None).unwrap();
        let slave = pty.slave;
        let child = cmd
            .stdin(Stdio::from(slave.try_clone().unwrap()))
            .stdout(Stdio::from(slave.try_clone().unwrap()))
            .stderr(Stdio::from(slave))
            .spawn()
            .unwrap();
        let master = std::fs::File::from(pty.master);
        let mut reader = master.try_clone().unwrap();
        let screen: Arc<(Mutex<String>, Condvar)> = Arc::default();
        let shared = Arc::clone(&screen);
        let drained = Arc::new(AtomicBool::new(false));
        let done = Arc::clone(&drained);
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            // EIO once the child closed the last slave descriptor.
            while let Ok(n) = reader.read(&mut buf) {
                if n == 0 {
                    break;
                }
                let (text, more) = &*shared;
                text.lock()
                    .unwrap()
                    .push_str(&plain(&String::from_utf8_lossy(&buf[..n])));
                more.notify_all();
            }
            let (text, more) = &*shared;
            let _held = text.lock().unwrap();
            done.store(true, Ordering::SeqCst);
            more.notify_all();
        });
        Terminal {
            child,
            master,
            screen,
            read: 0,
            drained,
        }
    }

    /// Waits until `text` appears after what was already read, and moves past it.
    fn expect(&mut self, text: &str) -> String {
        let read = self.read;
        let (seen, end) = self.wait_for(
            || format!("{text:?} never appeared"),
            |shown| {
                let at = shown[read..].find(text)?;
                let end = read + at + text.len();
                Some((shown[read..end].to_owned(), end))
            },
        );
        self.read = end;
        seen
    }

    /// Waits, at most `PATIENCE`, until `ready` finds what it looks for on the screen;
    /// fails with `never` and the screen otherwise.
    fn wait_for<T>(
        &self,
        never: impl Fn() -> String,
        mut ready: impl FnMut(&str) -> Option<T>,
    ) -> T {
        let (screen, more) = &*self.screen;
        let deadline = Instant::now() + PATIENCE;
        let mut shown = screen.lock().unwrap();
        loop {
            if let Some(found) = ready(&shown) {
                return found;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            assert!(
                !left.is_zero(),
                "{}; the terminal showed:\n{}",
                never(),
                &*shown
            );
            shown = more.wait_timeout(shown, left).unwrap().0;
        }
    }

    fn type_line(&mut self, line: &str) {
        self.master.write_all(line.as_bytes()).unwrap();
        self.master.write_all(b"\r").unwrap();
    }

    /// Ctrl-C, as the terminal's line discipline delivers it: SIGINT to the process.
    fn interrupt(&self) {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT).unwrap();
    }

    /// Ctrl-C typed at the terminal: its line discipline sends SIGINT to the foreground
    /// process group (a terminal of [`Terminal::spawn_in_session`]).
    fn ctrl_c(&mut self) {
        self.master.write_all(b"\x03").unwrap();
    }

    /// Types `/exit` and waits for a clean end; returns what the terminal showed.
    fn exit(mut self) -> String {
        self.type_line("/exit");
        let (code, screen) = self.wait();
        assert_eq!(code, Some(0), "{screen}");
        screen
    }

    /// Waits for the terminal to show all the child wrote and close (at most `PATIENCE`: a
    /// child that never ends fails the test, and is killed), then for the child to exit.
    fn wait(mut self) -> (Option<i32>, String) {
        // The reader sets `drained` holding the screen's lock, so it is read under it.
        let shown = self.wait_for(
            || "the terminal never closed".to_owned(),
            |shown| {
                self.drained
                    .load(Ordering::SeqCst)
                    .then(|| shown.to_owned())
            },
        );
        let status = self.child.wait().unwrap();
        (status.code(), shown)
    }
}

/// Terminal output without its escape sequences (colours, cursor moves, modes) and
/// carriage returns.
fn plain(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\u{1b}' => {
                if chars.peek() == Some(&'[') {
                    chars.next();
                    // Parameters, then one final byte in @..~.
                    for c in chars.by_ref() {
                        if ('@'..='~').contains(&c) {
                            break;
                        }
                    }
                } else {
                    chars.next();
                }
            }
            '\r' => {}
            c => out.push(c),
        }
    }
    out
}

fn events(env: &Env, run: &str) -> Vec<Value> {
    let out = env.run(&["show", "--json", run]);
    let show: Value = serde_json::from_slice(&out.stdout).unwrap();
    show["events"].as_array().unwrap().clone()
}

#[test]
fn a_chat_with_a_question_approvals_a_denial_and_ctrl_c_then_resume_elsewhere() {
    let env = Env::new();
    let model = env.script(json!([
        {"clarification": "Which file should I tidy?"},
        {"tool_calls": [{"id": "w1", "name": "write_file", "arguments": {"path": "a.txt", "content": "A\n"}}]},
        {"tool_calls": [{"id": "w2", "name": "write_file", "arguments": {"path": "b.txt", "content": "B\n"}}]},
        {"final": "Wrote a.txt; b.txt was refused."},
        {"tool_calls": [{"id": "s1", "name": "shell", "arguments": {"command": "sleep 600"}}]},
        {"final": "All done."}
    ]));
    let mut t = Terminal::spawn(&env, &["chat", "--model", &model]);
    t.expect("> ");
    // Exchange 1: the goal, and the model's question.
    t.type_line("tidy my notes");
    t.expect("? Which file should I tidy?");
    t.expect("> ");
    // Exchange 2: the answer; one write approved, one denied with a reason.
    t.type_line("notes.txt");
    let asked = t.expect("[a]lways write_file > ");
    assert!(
        asked.contains("w1 write_file") && asked.contains("path=\"a.txt\""),
        "the whole call is shown: {asked}"
    );
    t.type_line("y");
    t.expect("✓ w1 write_file (ok");
    t.expect("[a]lways write_file > ");
    t.type_line("n not that one");
    t.expect("Wrote a.txt; b.txt was refused.");
    t.expect("> ");
    // Exchange 3: a slow command, allowed for the session, stopped by Ctrl-C.
    t.type_line("now the slow check");
    t.expect("[a]lways shell > ");
    t.type_line("a");
    t.expect("s1 shell command=\"sleep 600\"");
    t.interrupt();
    t.expect("✗ s1 shell (cancelled");
    t.expect("stopped; the run is kept");
    t.expect("> ");
    t.type_line("/cost");
    t.expect("5 model calls, 2 tool calls");
    t.exit();

    assert_eq!(
        std::fs::read_to_string(env.dir.path().join("a.txt")).unwrap(),
        "A\n"
    );
    assert!(
        !env.dir.path().join("b.txt").exists(),
        "the denied write never ran"
    );
    let runs: Value = serde_json::from_slice(&env.run(&["runs", "--json"]).stdout).unwrap();
    let run = runs[0]["run_id"].as_str().unwrap().to_owned();
    let log = events(&env, &run);
    let said: Vec<&str> = log
        .iter()
        .filter(|e| e["type"] == "user_message")
        .map(|e| e["text"].as_str().unwrap())
        .collect();
    assert_eq!(said, ["notes.txt", "now the slow check"]);
    let denied = log.iter().find(|e| e["type"] == "approval_denied").unwrap();
    assert!(
        denied["reason"].as_str().unwrap().ends_with("not that one"),
        "{denied}"
    );
    let ended: Vec<&str> = log
        .iter()
        .filter(|e| e["type"] == "run_ended")
        .map(|e| e["outcome"]["reason"].as_str().unwrap())
        .collect();
    assert_eq!(ended, ["clarification_required", "completed", "cancelled"]);

    // Another process goes on with the same run.
    let out = env.run(&["resume", "--json", &run, "finish up"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["answer"], "All done.");
    assert_eq!(v["run_id"], run.as_str());
}

/// Ctrl-C at a real terminal signals every process of its foreground group. It stops the
/// run's command, and leaves the MCP servers `agent` started as they were: they live in
/// process groups of their own, so their next call is answered by the same server.
#[test]
fn ctrl_c_at_the_terminal_stops_a_command_and_leaves_mcp_servers_running() {
    let env = Env::new();
    let config = crate::py_mcp_config(&env, "s");
    let env_call = |id: &str| json!({"tool_calls": [{"id": id, "name": "mcp__s__env", "arguments": {"name": "HOME"}}]});
    let model = env.script(json!([
        env_call("m1"),
        {"tool_calls": [{"id": "s1", "name": "shell", "arguments": {"command": "sleep 600"}}]},
        env_call("m2"),
        {"final": "done"}
    ]));
    let mut t = Terminal::spawn_in_session(
        &env,
        &[
            "chat",
            "--mcp-config",
            config,
            "--allow",
            "shell",
            "--model",
            &model,
        ],
    );
    t.expect("> ");
    t.type_line("check");
    t.expect("✓ m1 mcp__s__env (ok");
    t.expect("s1 shell command=\"sleep 600\"");
    t.ctrl_c();
    t.expect("✗ s1 shell (cancelled");
    t.expect("stopped; the run is kept");
    t.expect("> ");
    t.type_line("go on");
    t.expect("✓ m2 mcp__s__env (ok");
    t.expect("done");
    t.expect("> ");
    t.exit();
}

/// A command cannot reach the person's terminal: it runs in a session of its own, with no
/// controlling terminal, so `/dev/tty` does not open; what it writes there is never shown
/// (past the escaping of what `agent` shows), and it can neither read what the person types
/// nor push keystrokes in to answer `agent`'s questions. In a PID namespace and without.
/// In a namespace (made directly, or through a user namespace), the terminal is not there
/// to be opened by its name (`/dev/pts/N`) either: the namespace has terminals of its own.
#[test]
fn a_command_cannot_reach_the_persons_terminal() {
    for namespace in ["", "user", "off"] {
        let env = Env::new();
        let by_name = if namespace == "off" {
            ""
        } else {
            "for p in /dev/pts/[0-9]*; do [ -e $p ] && printf 'ma%s\\n' rker >$p && echo wrote $p; \
             done; echo pts: $(ls /dev/pts); "
        };
        let model = env.script(json!([
            {"tool_calls": [{"id": "s1", "name": "shell", "arguments": {
                "command": format!("{by_name}printf 'ma%s\\n' rker >/dev/tty; echo tty=$?; \
                                    read -r -t 1 line </dev/tty; echo read=$?")}}]},
            {"final": "done"}
        ]));
        let mut agent = env.cmd();
        agent.env("AGENT_LOOP_PID_NAMESPACE", namespace);
        let t = Terminal::start_in_session(
            agent,
            &["run", "--json", "--allow", "shell", "--model", &model, "go"],
        );
        let (code, screen) = t.wait();
        assert_eq!(code, Some(0), "{screen}");
        assert!(!screen.contains("marker"), "{namespace:?}: {screen}");
        let runs: Value = serde_json::from_slice(&env.run(&["runs", "--json"]).stdout).unwrap();
        let finished = events(&env, runs[0]["run_id"].as_str().unwrap())
            .into_iter()
            .find(|e| e["type"] == "tool_finished")
            .unwrap();
        let output = finished["result"]["output"].as_str().unwrap().to_owned();
        let listed = if namespace == "off" {
            ""
        } else {
            "pts: ptmx\n"
        };
        assert!(
            output.starts_with(&format!(
                "exit code: 0\n--- stdout ---\n{listed}tty=1\nread=1\n"
            )),
            "{namespace:?}: {output}"
        );
        assert!(
            output.contains("/dev/tty: No such device or address"),
            "{output}"
        );
    }
}

/// A run of the script `turns` (goal `one`), run to its first answer; its id.
fn finished_run(env: &Env, turns: Value) -> String {
    let model = env.script(turns);
    let out = env.run(&["run", "--json", "--model", &model, "one"]);
    assert_eq!(out.status.code(), Some(0));
    serde_json::from_slice::<Value>(&out.stdout).unwrap()["run_id"]
        .as_str()
        .unwrap()
        .to_owned()
}

#[test]
fn chat_continues_a_run_and_leaves_on_ctrl_d() {
    let env = Env::new();
    let run = finished_run(&env, json!([{"final": "first"}, {"final": "second"}]));
    let mut t = Terminal::spawn(&env, &["chat", &run]);
    t.expect("finished (completed)");
    t.expect("> ");
    t.type_line("/context");
    t.expect("=== 1 user");
    t.expect("one");
    t.expect("> ");
    t.type_line("and then?");
    t.expect("second");
    t.expect("> ");
    t.master.write_all(&[4]).unwrap(); // Ctrl-D
    let (code, screen) = t.wait();
    assert_eq!(code, Some(0), "{screen}");
    assert_eq!(
        events(&env, &run).len(),
        6,
        "one exchange more: message, decision, end"
    );
    // Ctrl-C at the prompt (the line editor reads it as a key) leaves too; `--last` is
    // the newest run (a run named beside it is refused).
    let mut t = Terminal::spawn(&env, &["chat", "--last"]);
    t.expect(&run);
    t.expect("> ");
    t.master.write_all(&[3]).unwrap();
    let (code, screen) = t.wait();
    assert_eq!(code, Some(0), "{screen}");
    assert_eq!(events(&env, &run).len(), 6, "leaving writes nothing");
    let out = env.run(&["chat", "--last", &run]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
}

/// An exchange stopped by `agent cancel` from another process says so at the chat (the
/// person did not press Ctrl-C), and the run is kept to go on with.
#[test]
fn a_chat_says_its_exchange_was_stopped_from_elsewhere() {
    let env = Env::new();
    let model = env.script(json!([
        {"tool_calls": [{"id": "s1", "name": "shell", "arguments": {"command": "sleep 600"}}]},
        {"final": "went on"}
    ]));
    let mut t = Terminal::spawn(&env, &["chat", "--allow", "shell", "--model", &model]);
    t.expect("> ");
    t.type_line("wait");
    t.expect("s1 shell command=\"sleep 600\"");
    let runs: Value = serde_json::from_slice(&env.run(&["runs", "--json"]).stdout).unwrap();
    let run = runs[0]["run_id"].as_str().unwrap().to_owned();
    let cancelled = env.run(&["cancel", &run]);
    assert_eq!(
        cancelled.status.code(),
        Some(130),
        "{}",
        String::from_utf8_lossy(&cancelled.stderr)
    );
    t.expect("✗ s1 shell (cancelled");
    t.expect("stopped from elsewhere (`agent cancel`); the run is kept");
    t.expect("> ");
    t.type_line("go on");
    t.expect("went on");
    t.expect("> ");
    t.exit();
}

/// `agent chat` whose first exchange runs a command that waits for a file `go` (then the
/// model says "went on"), once that command runs.
fn chat_waiting_for_go(env: &Env) -> Terminal {
    let model = env.script(json!([
        {"tool_calls": [{"id": "s1", "name": "shell", "arguments": {
            "command": "while [ ! -e go ]; do sleep 0.05; done"}}]},
        {"final": "went on"}
    ]));
    let mut t = Terminal::spawn(env, &["chat", "--allow", "shell", "--model", &model]);
    t.expect("> ");
    t.type_line("wait");
    t.expect("s1 shell command=");
    t
}

/// A message sent from another terminal to the run a chat drives (`agent resume RUN
/// MESSAGE`) is shown in the chat as it is read, before the model call that reads it.
#[test]
fn a_chat_shows_a_message_sent_to_its_run_from_elsewhere() {
    let env = Env::new();
    let mut t = chat_waiting_for_go(&env);
    let runs: Value = serde_json::from_slice(&env.run(&["runs", "--json"]).stdout).unwrap();
    let run = runs[0]["run_id"].as_str().unwrap().to_owned();
    let (mut told, _) = crate::handed(&env, &[&run, "mind the tests"]);
    std::fs::write(env.dir.path().join("go"), "").unwrap();
    t.expect("✉ the run reads a message: \"mind the tests\"");
    t.expect("went on");
    assert!(told.wait().unwrap().success());
    t.expect("> ");
    t.exit();
}

/// A line typed in a chat while its run works is handed to the run, which reads it before
/// its next model call; one the run stops before reading (here at its step limit) is the
/// chat's next message.
#[test]
fn a_line_typed_while_the_run_works_is_read_before_its_next_model_call() {
    let env = Env::new();
    let model = env.script(json!([
        {"tool_calls": [{"id": "s1", "name": "shell", "arguments": {
            "command": "while [ ! -e go ]; do sleep 0.05; done; rm go"}}]},
        {"tool_calls": [{"id": "s2", "name": "shell", "arguments": {
            "command": "while [ ! -e go ]; do sleep 0.05; done"}}]},
        {"final": "went on"}
    ]));
    // Two model calls an exchange (the chat has no flag for it).
    std::fs::write(env.dir.path().join("agent.toml"), "max_steps = 2\n").unwrap();
    let mut t = Terminal::spawn(&env, &["chat", "--allow", "shell", "--model", &model]);
    t.expect("> ");
    t.type_line("wait");
    t.expect("s1 shell command=");
    t.type_line("mind the tests");
    t.expect("✉ sent: the run reads it before its next model call");
    std::fs::write(env.dir.path().join("go"), "").unwrap();
    t.expect("✉ the run reads a message: \"mind the tests\"");
    t.expect("s2 shell command=");
    // At its step limit after this command: what is typed now is not read in this exchange.
    t.type_line("and the docs");
    t.expect("✉ sent");
    std::fs::write(env.dir.path().join("go"), "").unwrap();
    t.expect("the run stopped before it read what you typed: it is your next message");
    t.expect("went on");
    t.expect("> ");
    t.exit();
    let runs: Value = serde_json::from_slice(&env.run(&["runs", "--json"]).stdout).unwrap();
    let run = runs[0]["run_id"].as_str().unwrap().to_owned();
    let shown: Value = serde_json::from_slice(&env.run(&["show", "--json", &run]).stdout).unwrap();
    let said: Vec<(String, String)> = shown["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["type"] == "user_note" || e["type"] == "user_message")
        .map(|e| {
            (
                e["type"].as_str().unwrap().to_owned(),
                e["text"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(
        said,
        [
            ("user_note".to_owned(), "mind the tests".to_owned()),
            ("user_message".to_owned(), "and the docs".to_owned())
        ]
    );
}

/// Ctrl-D typed while the run works ends the chat once the exchange does, as it would at
/// the prompt.
#[test]
fn ctrl_d_typed_while_the_run_works_ends_the_chat_with_the_exchange() {
    let env = Env::new();
    let mut t = chat_waiting_for_go(&env);
    t.master.write_all(b"\x04").unwrap();
    t.expect("(Ctrl-D: the chat ends with this exchange)");
    std::fs::write(env.dir.path().join("go"), "").unwrap();
    t.expect("went on");
    let (code, screen) = t.wait();
    assert_eq!(code, Some(0), "{screen}");
}

/// So is a line typed while the run goes on after an approval asked inline.
#[test]
fn a_line_typed_while_the_run_goes_on_after_an_approval_is_read_too() {
    let env = Env::new();
    let model = env.script(json!([
        {"tool_calls": [{"id": "w1", "name": "write_file", "arguments": {
            "path": "a.txt", "content": "a"}}]},
        {"tool_calls": [{"id": "s1", "name": "shell", "arguments": {
            "command": "while [ ! -e go ]; do sleep 0.05; done"}}]},
        {"final": "went on"}
    ]));
    let mut t = Terminal::spawn(&env, &["chat", "--allow", "shell", "--model", &model]);
    t.expect("> ");
    t.type_line("write it");
    t.expect("approve? [y]es / [n]o [reason] / [a]lways write_file > ");
    t.type_line("y");
    t.expect("s1 shell command=");
    t.type_line("mind the tests");
    t.expect("✉ sent: the run reads it before its next model call");
    std::fs::write(env.dir.path().join("go"), "").unwrap();
    t.expect("✉ the run reads a message: \"mind the tests\"");
    t.expect("went on");
    t.expect("> ");
    t.exit();
}

impl Terminal {
    /// SIGTERM to `agent`, as a service manager or `docker stop` sends it.
    fn terminate(&self) {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    }
}

/// A chat asked to stop (SIGTERM) in the middle of an exchange lets its run go at the next
/// step: the command in flight finishes and is committed, and the chat ends (exit 3), the
/// run going on with the next `agent chat RUN`. Asked to stop while it waits for the
/// person, it ends at once: nothing is in flight. `agent run` asked to stop at an
/// approval's question ends at once too, the run paused for it (exit 3).
#[test]
fn a_chat_or_a_run_asked_to_stop_ends_with_nothing_in_doubt() {
    let env = Env::new();
    let model = env.script(json!([
        {"tool_calls": [{"id": "s1", "name": "shell", "arguments": {
            "command": "while [ ! -e go ]; do sleep 0.05; done; echo ran >> ran.txt"}}]},
        {"final": "went"}
    ]));
    let mut t = Terminal::spawn(&env, &["chat", "--allow", "shell", "--model", &model]);
    t.expect("> ");
    t.type_line("wait");
    t.expect("s1 shell command=");
    t.terminate();
    t.expect("asked to stop: the run stops at its next step");
    std::fs::write(env.dir.path().join("go"), "").unwrap();
    t.expect("was let go at its next step");
    let (code, screen) = t.wait();
    assert_eq!(code, Some(3), "{screen}");
    let runs: Value = serde_json::from_slice(&env.run(&["runs", "--json"]).stdout).unwrap();
    let run = runs[0]["run_id"].as_str().unwrap().to_owned();
    let kinds = crate::event_types(&env, &run);
    assert_eq!(
        kinds.last().map(String::as_str),
        Some("tool_finished"),
        "{kinds:?}"
    );
    assert_eq!(
        std::fs::read_to_string(env.dir.path().join("ran.txt")).unwrap(),
        "ran\n"
    );

    // Waiting for the next message: it ends at once, leaving as /exit does.
    let mut t = Terminal::spawn(&env, &["chat", &run]);
    t.expect("> ");
    t.terminate();
    let (code, screen) = t.wait();
    assert_eq!(code, Some(0), "{screen}");
    assert!(
        screen.contains("asked to stop while waiting for an answer"),
        "{screen}"
    );

    // `agent run` at an approval's question: the run stays paused for it.
    let env = Env::new();
    let model = crate::write_script(&env);
    let mut t = Terminal::spawn(&env, &["run", "--model", &model, "save it"]);
    t.expect("[a]lways write_file > ");
    t.terminate();
    let (code, screen) = t.wait();
    assert_eq!(code, Some(3), "{screen}");
    let runs: Value = serde_json::from_slice(&env.run(&["runs", "--json"]).stdout).unwrap();
    assert_eq!(runs[0]["status"], "paused", "{runs}");
}

/// A chat holds its run between messages: `agent cancel` from elsewhere says at once that
/// the run already ended (it is not asked to stop a drive that is not going on).
#[test]
fn a_run_a_chat_holds_between_messages_is_not_cancelled_from_elsewhere() {
    let env = Env::new();
    let run = finished_run(&env, json!([{"final": "first"}]));
    let mut t = Terminal::spawn(&env, &["chat", &run]);
    t.expect("> ");
    let cancelled = env.run(&["cancel", &run]);
    let err = String::from_utf8_lossy(&cancelled.stderr).into_owned();
    assert_eq!(cancelled.status.code(), Some(2), "{err}");
    assert!(
        err.contains(&format!(
            "run {run} already ended: finished (completed); process "
        )),
        "{err}"
    );
    t.exit();
}

#[test]
fn chat_needs_a_terminal() {
    let env = Env::new();
    let out = env.run(&["chat", "--model", "script:x.json"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("needs a terminal"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn run_on_a_terminal_asks_approvals_inline_and_no_input_pauses() {
    let env = Env::new();
    let model = crate::write_script(&env);
    let mut t = Terminal::spawn(&env, &["run", "--json", "--model", &model, "save it"]);
    t.expect("w1 write_file");
    t.expect("[a]lways write_file > ");
    t.type_line("y");
    let (code, screen) = t.wait();
    assert_eq!(code, Some(0), "{screen}");
    assert!(screen.contains("\"reason\":\"completed\""), "{screen}");
    assert_eq!(
        std::fs::read_to_string(env.dir.path().join("out/result.txt")).unwrap(),
        "42\n"
    );

    // --no-input: paused, exit 3, the pending call in the JSON; nothing asked.
    let env = Env::new();
    let model = crate::write_script(&env);
    let t = Terminal::spawn(
        &env,
        &["run", "--json", "--no-input", "--model", &model, "save it"],
    );
    let (code, screen) = t.wait();
    assert_eq!(code, Some(3), "{screen}");
    assert!(!screen.contains("approve?"), "{screen}");
    assert!(screen.contains("\"pending\":[{"), "{screen}");
}

/// An OpenAI stream whose answer arrives in pieces.
fn pieces(parts: &[&str]) -> String {
    let mut body: String = parts
        .iter()
        .map(|p| json!({"choices":[{"index":0,"delta":{"content": p}}]}))
        .chain([json!({"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]})])
        .map(|c| format!("data: {c}\n\n"))
        .collect();
    body.push_str("data: [DONE]\n\n");
    body
}

#[test]
fn chat_streams_a_real_models_text_once() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let server = rt
        .block_on(agent_providers::testing::Server::start(vec![
            agent_providers::testing::Reply::stream(pieces(&[
                "The launch ",
                "is on ",
                "Thursday.",
                // What a prompt injection might have it write: set the clipboard.
                " \u{1b}]52;c;cm0gLXJmIH4=\u{7}",
            ])),
        ]))
        .unwrap();
    let env = Env::new();
    let mut t = Terminal::spawn(
        &env,
        &[
            "chat",
            "--model",
            "openai-compat:local",
            "--base-url",
            &server.url,
        ],
    );
    t.expect("> ");
    t.type_line("when is the launch?");
    t.expect(r"The launch is on Thursday. \u001b]52;c;cm0gLXJmIH4=\u0007");
    t.expect("> ");
    let screen = t.exit();
    assert_eq!(
        screen.matches("The launch is on Thursday.").count(),
        1,
        "shown as it came, not again: {screen}"
    );
    assert!(
        !screen.contains("\u{1b}]52"),
        "shown, not obeyed: {screen:?}"
    );
}

#[test]
fn chat_on_an_interrupted_run_goes_on_with_it() {
    let env = Env::new();
    let model = env.script(json!([
        {"tool_calls": [{"id": "c1", "name": "list_dir", "arguments": {}}]},
        {"final": "listed"},
        {"final": "and more"}
    ]));
    // Killed after its tool ran, before the result was committed.
    let out = env
        .cmd()
        .env("FAILPOINTS", "after_tools=return")
        .args(["run", "--model", &model, "look"])
        .output()
        .unwrap();
    assert_ne!(out.status.code(), Some(0));
    let runs: Value = serde_json::from_slice(&env.run(&["runs", "--json"]).stdout).unwrap();
    let run = runs[0]["run_id"].as_str().unwrap().to_owned();
    let mut t = Terminal::spawn(&env, &["chat", &run]);
    t.expect("listed");
    t.expect("> ");
    t.type_line("anything else?");
    t.expect("and more");
    t.expect("> ");
    t.exit();
    let log = events(&env, &run);
    assert!(
        log.iter().any(|e| e["type"] == "user_message"),
        "the follow-up was taken"
    );
}

#[test]
fn a_run_on_a_terminal_shows_its_steps_tools_and_tokens_and_nothing_when_piped() {
    let env = Env::new();
    std::fs::write(env.dir.path().join("a.txt"), "alpha\n").unwrap();
    let script = env.script(json!([
        {"tool_calls": [{"id": "c1", "name": "read_file", "arguments": {"path": "a.txt"}}],
         "usage": {"input_tokens": 1200, "output_tokens": 40}},
        {"final": "It says alpha.", "usage": {"input_tokens": 1300, "output_tokens": 9}}
    ]));
    let mut t = Terminal::spawn(&env, &["run", "--model", &script, "read a.txt"]);
    // The spinner while the model thinks, then one line per model call and per tool call.
    t.expect("step 1: ");
    t.expect("is thinking");
    t.expect("step 1: 1 tool call (1200 in, 40 out); so far 1200 in, 40 out");
    t.expect("✓ c1 read_file (ok");
    t.expect("step 2: a final answer (1300 in, 9 out); so far 2500 in, 49 out");
    let (code, screen) = t.wait();
    assert_eq!(code, Some(0), "{screen}");
    assert!(screen.contains("It says alpha."), "{screen}");

    // Piped: none of it.
    let out = env
        .cmd()
        .args(["run", "--model", &script, "read a.txt"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    let err = stderr(&out);
    assert!(
        !err.contains("step 1") && !err.contains("c1 read_file"),
        "{err}"
    );
}

/// `agent chat` on a run in the database's queue: a worker on its own machine drives it,
/// the terminal shows what the worker commits, asks the person's approval, then their
/// answer to its question and their next message when it waits for them, each recorded
/// and the run queued again; nothing runs in the chat's own process.
#[test]
fn chat_on_a_queued_run_asks_the_person_while_a_worker_drives_it() {
    let q = crate::postgres::Queue::new();
    let model = q.script(
        "job",
        json!([
            {"tool_calls": [{"id": "w1", "name": "write_file",
                "arguments": {"path": "out.txt", "content": "approved"}}]},
            {"clarification": "Which heading?"},
            {"final": "Written under Notes."},
            {"final": "Nothing else to do."}
        ]),
    );
    let id = q.submit(&model, &[], "write it");
    let mut chat = q.env.bare();
    chat.arg("--store").arg(&q.url).args(["chat", &id]);
    let mut t = Terminal::start(chat);
    t.expect("is in the queue");
    // The worker starts once the chat has read where the run stands (nothing yet): what
    // the run did before the chat began is `agent show`'s, and is not shown here.
    let mut worker = q.worker(&[], false);
    // The worker runs the run until it waits for the approval; its events show here.
    t.expect("approval_requested");
    let asked = t.expect("[a]lways write_file > ");
    assert!(asked.contains("w1 write_file"), "{asked}");
    assert!(!q.ws.join("out.txt").exists());
    t.type_line("y");
    // Approved and queued again: the worker writes, then asks its question.
    t.expect("approval_granted");
    t.expect("tool_finished");
    t.expect("? Which heading?");
    t.expect("> ");
    t.type_line("Notes");
    t.expect("Written under Notes.");
    t.expect("> ");
    t.type_line("anything else?");
    t.expect("Nothing else to do.");
    t.expect("> ");
    let screen = t.exit();
    worker.kill().unwrap();
    worker.wait().unwrap();

    assert_eq!(
        std::fs::read_to_string(q.ws.join("out.txt")).unwrap(),
        "approved",
        "{screen}"
    );
    let log = q.events(&id);
    let said: Vec<&str> = log
        .iter()
        .filter(|e| e["type"] == "user_message")
        .map(|e| e["text"].as_str().unwrap())
        .collect();
    assert_eq!(said, ["Notes", "anything else?"]);
    let ended: Vec<&str> = log
        .iter()
        .filter(|e| e["type"] == "run_ended")
        .map(|e| e["outcome"]["reason"].as_str().unwrap())
        .collect();
    assert_eq!(ended, ["clarification_required", "completed", "completed"]);
}

/// `agent chat RUN` of a run started with sub-agents goes on with them, without
/// `--sub-agents` again (it was refused: "started with tools this invocation does not
/// have").
#[test]
fn a_chat_on_a_run_with_sub_agents_goes_on_with_them() {
    let env = Env::new();
    let turns = json!({
        "turns": [
            {"final": "first"},
            {"tool_calls": [{"id": "d1", "name": "delegate", "arguments": {"goal": "look"}}]},
            {"final": "second"}
        ],
        "agents": {"look": {"turns": [{"final": "seen"}]}}
    });
    let (out, _) = crate::run_with_sub_agents(&env, &turns, "start");
    assert_eq!(out.status.code(), Some(0));
    let run: Value = serde_json::from_slice(&out.stdout).unwrap();
    let run = run["run_id"].as_str().unwrap().to_owned();
    let mut t = Terminal::spawn(&env, &["chat", &run, "--allow", "delegate"]);
    t.expect("> ");
    t.type_line("more");
    t.expect("second");
    t.expect("> ");
    t.exit();
    let kinds = crate::event_types(&env, &run);
    assert!(kinds.iter().any(|k| k == "sub_agent_finished"), "{kinds:?}");
}

/// Asked on a terminal to approve a `shell` command of a sandboxed run, the person is told
/// what it may do there.
#[test]
fn an_approval_asked_inline_says_the_command_runs_in_the_sandbox() {
    let env = Env::new();
    let model = env.script(json!([
        {"tool_calls": [{"id": "s1", "name": "shell", "arguments": {"command": "echo hi"}}]},
        {"final": "done"}
    ]));
    let mut t = Terminal::spawn(&env, &["run", "--sandbox", "--model", &model, "go"]);
    t.expect("s1 shell command=");
    t.expect(
        "(approved, it runs in the run's sandbox: it writes only in the workspace, no network, \
         no credentials)",
    );
    t.expect("[a]lways shell > ");
    t.type_line("y");
    let (code, screen) = t.wait();
    assert_eq!(code, Some(0), "{screen}");
}
