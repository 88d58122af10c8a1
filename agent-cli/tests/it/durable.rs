//! A commit is confirmed only once it would survive a power cut: the real `agent` under
//! `strace`, whose record of the process's system calls shows what reached the disk
//! before each event was reported. (A `kill -9` test cannot tell: the kernel's page cache
//! outlives the process, so a write that was never flushed survives it too.)

use std::path::Path;
use std::process::Command;

use serde_json::json;

use super::{Env, stderr};

/// One system call as `strace -f -y` printed it: its name, its first argument (with `-y`,
/// a descriptor's path after the number) and whether this line is where it returned.
struct Call<'a> {
    name: &'a str,
    first: &'a str,
    returned: bool,
}

/// Parses `PID name(args) = r`, `PID name(args <unfinished ...>` and
/// `PID <... name resumed>...) = r`; `None` for signals and exits.
fn parse(line: &str) -> Option<Call<'_>> {
    let rest = line.split_once(' ')?.1.trim_start();
    if let Some(resumed) = rest.strip_prefix("<... ") {
        let name = resumed.split_once(' ')?.0;
        return Some(Call {
            name,
            first: "",
            returned: true,
        });
    }
    let unfinished = rest.strip_suffix(" <unfinished ...>");
    let (name, args) = unfinished.unwrap_or(rest).split_once('(')?;
    if !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
        return None;
    }
    let first = args.split([',', ')']).next().unwrap_or("");
    Some(Call {
        name,
        first,
        returned: unfinished.is_none(),
    })
}

/// What a descriptor argument names: `11</tmp/x/db>` -> `/tmp/x/db`.
fn path_of(first: &str) -> &str {
    first
        .split_once('<')
        .map_or("", |(_, p)| p.strip_suffix('>').unwrap_or(p))
}

/// `agent ARGS` in `env` under `strace` with `strace_args` (its environment as `Env` sets
/// it, removals included).
fn under_strace(env: &Env, strace_args: &[&str], args: &[&str]) -> Command {
    let agent = env.cmd();
    let mut strace = Command::new("strace");
    for (key, value) in agent.get_envs() {
        match value {
            Some(value) => strace.env(key, value),
            None => strace.env_remove(key),
        };
    }
    strace
        .args(strace_args)
        .arg(agent.get_program())
        .args(agent.get_args())
        .args(args)
        .current_dir(env.dir.path());
    strace
}

/// The system calls of `agent ARGS` (every thread's, in the order `strace` saw them) and
/// what it printed on stdout.
fn traced(env: &Env, args: &[&str]) -> (Vec<String>, String) {
    let trace = env.dir.path().join("strace.txt");
    let out = env.dir.path().join("stdout.txt");
    let trace_arg = trace.display().to_string();
    let status = under_strace(
        env,
        &[
            "-f",
            "-qq",
            "-y",
            "-s",
            "0",
            "-o",
            &trace_arg,
            "-e",
            "trace=write,pwrite64,pwritev,pwritev2,fsync,fdatasync,sync_file_range,\
             openat,mkdir,rename",
            // Every `fsync` starts 300 ms late: a new database's directories are synced
            // on threads of their own while the run starts (its `conf` is, with an
            // `fdatasync`), and an event reported before they are would be seen as such.
            // Held on entry, not on exit: strace prints a call's exit before it holds it
            // there, and the trace would show the sync done while the thread still waits.
            "-e",
            "inject=fsync:delay_enter=300000",
        ],
        args,
    )
    .stdout(std::fs::File::create(&out).unwrap())
    .output()
    .expect("strace runs (`cargo xtask test` installs it when missing)");
    assert_eq!(status.status.code(), Some(0), "{}", stderr(&status));
    let lines = std::fs::read_to_string(&trace)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect();
    (lines, std::fs::read_to_string(&out).unwrap())
}

fn is_db(path: &str) -> bool {
    Path::new(path).file_name().is_some_and(|n| n == "db")
}

#[test]
fn every_event_is_reported_after_its_commit_reached_the_disk() {
    let env = Env::new();
    std::fs::write(env.dir.path().join("notes.txt"), "some notes\n").unwrap();
    // Past 128 KiB an entry is a file of its own beside sled's log (a sled blob), made
    // durable on its own before the log entry that points at it.
    let long_answer = "a long answer. ".repeat(10_000);
    let model = env.script(json!([
        {"tool_calls": [{"id": "c1", "name": "read_file", "arguments": {"path": "notes.txt"}}]},
        {"tool_calls": [{"id": "c2", "name": "read_file", "arguments": {"path": "notes.txt"}}]},
        {"final": long_answer}
    ]));
    let (trace, stdout) = traced(&env, &["run", "--events", "--model", &model, "a goal"]);
    assert!(stdout.contains("a long answer."), "{stdout}");

    // The files written since their last flush (a write makes a file dirty, an
    // `fdatasync` or `fsync` that returned makes it clean), and the directories holding a
    // name made since theirs (a new file or directory needs its directory flushed).
    let mut dirty: Vec<String> = Vec::new();
    let mut unnamed: Vec<String> = Vec::new();
    // Calls another thread's line interrupted: name, first argument, their opening line.
    let mut pending: Vec<(String, String, &str)> = Vec::new();
    let mut db_syncs = 0;
    let mut blob_syncs = 0;
    let mut reported = 0;
    let store = env.store().display().to_string();
    let parent = |p: &str| {
        Path::new(p)
            .parent()
            .map(|d| d.display().to_string())
            .unwrap_or_default()
    };
    for line in &trace {
        let Some(call) = parse(line) else { continue };
        assert_ne!(
            call.name, "sync_file_range",
            "sync_file_range neither writes a file's metadata nor flushes the disk's \
             cache: {line}"
        );
        let first = if call.first.starts_with('"') {
            // A path argument (`mkdir`): `"/tmp/x/runs/ID"`.
            call.first.trim_matches('"').to_owned()
        } else {
            path_of(call.first).to_owned()
        };
        if !call.returned {
            // Its arguments are printed only here; it counts when it returns.
            pending.push((call.name.to_owned(), first, line));
            continue;
        }
        let (name, path, opening) = if line.contains("<... ") {
            // The same thread's call: two threads may each have one of a name pending.
            let pid = |l: &str| l.split_once(' ').map_or("", |(pid, _)| pid).to_owned();
            let at = pending
                .iter()
                .rposition(|(n, _, opening)| n == call.name && pid(opening) == pid(line))
                .unwrap_or_else(|| panic!("{line} resumes nothing"));
            pending.remove(at)
        } else {
            (call.name.to_owned(), first, line.as_str())
        };
        // What `openat` opened, from its result: `= 11</tmp/x/db>`.
        let opened = line.rsplit_once("= ").map_or("", |(_, r)| path_of(r));
        let sled_file = |p: &str| is_db(p) || p.contains("/blobs/") || p.ends_with("/conf");
        match name.as_str() {
            "pwrite64" | "pwritev" | "pwritev2" | "write"
                if sled_file(&path) && !dirty.contains(&path) =>
            {
                dirty.push(path);
            }
            "openat" if opening.contains("O_CREAT") && sled_file(opened) => {
                unnamed.push(parent(opened));
            }
            "mkdir" if path.starts_with(&store) && line.ends_with("= 0") => {
                unnamed.push(parent(&path));
            }
            // `(DELAYED)`: a call strace held up (see `traced`).
            "fdatasync" | "fsync" if line.trim_end_matches(" (DELAYED)").ends_with("= 0") => {
                if is_db(&path) {
                    db_syncs += 1;
                }
                if path.contains("/blobs/") {
                    blob_syncs += 1;
                }
                dirty.retain(|p| *p != path);
                unnamed.retain(|d| *d != path);
            }
            "write" if path.ends_with("stdout.txt") => {
                reported += 1;
                assert!(
                    dirty.is_empty(),
                    "event {reported} was reported while {dirty:?} held writes not yet \
                     flushed"
                );
                assert!(
                    unnamed.is_empty(),
                    "event {reported} was reported before {unnamed:?} were flushed: a power \
                     cut could lose the names made in them, and the run with them"
                );
            }
            _ => {}
        }
    }
    // Events are written as they are committed, one at a time: each was checked.
    assert!(
        reported >= 6,
        "{reported} writes of events seen in the trace"
    );
    // One flush a commit at least: the start, two turns, the answer.
    assert!(db_syncs >= 4, "{db_syncs} flushes of the database");
    assert!(blob_syncs >= 1, "the long answer's blob was never flushed");
}

/// A new run whose database's files cannot be made durable confirms nothing: the first
/// `fsync` of a run in a store that exists is one of its new database's directories' (on
/// the threads that sync the new files), made to fail; the run stops with the checkpoint
/// failure's exit code and the disk's error in words, and no event is reported.
#[test]
fn a_new_database_whose_files_cannot_be_synced_reports_nothing() {
    let env = Env::new();
    let model = env.script(json!([{"final": "done"}]));
    let first = env.run(&["run", "--model", &model, "a goal"]);
    assert_eq!(first.status.code(), Some(0), "{}", stderr(&first));

    let out = under_strace(
        &env,
        &[
            "-f",
            "-qq",
            "-o",
            "/dev/null",
            "-e",
            "trace=fsync",
            "-e",
            "inject=fsync:error=EIO:when=1",
        ],
        &["run", "--events", "--model", &model, "a goal"],
    )
    .output()
    .expect("strace runs (`cargo xtask test` installs it when missing)");
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(5), "{err}");
    assert!(
        err.contains("could not be committed") && err.contains("Input/output error (os error 5)"),
        "{err}"
    );
    assert!(
        out.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}
