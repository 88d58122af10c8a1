//! Processes that die with the `agent` that started them (the `process` feature): the
//! `shell` built-in's commands, command hooks and answer checks, and MCP servers.

use std::process::Stdio;

/// A process group that dies when this value is dropped, and when this process dies
/// first, even by `kill -9`, which runs none of our code.
///
/// The group is led by a watcher (`sh`, the POSIX shell, so that an MCP server needs no
/// `bash`) that reads a pipe this process holds until the pipe closes, then kills its
/// whole group, itself included. The pipe closes when the `Watcher` is dropped (the group
/// is then also killed at once, from here) or when this process dies. A command started
/// into the group ([`Watcher::group`], given to `process_group`) is killed with it, and
/// everything it started that stayed in its group; a process that leaves the group (a
/// daemon's `setsid`) is out of reach of this watcher (on Linux, every process `agent`
/// starts has another, see [`watch_with`]). Without it, a command whose run was killed went
/// on, and could do its effect after the run's recovery had looked for it and been told
/// to run the call again.
///
/// The pipe is not inherited by other children (Rust opens it close-on-exec), so only
/// this process keeps the group alive.
pub(crate) struct Watcher {
    /// The watcher's process id, which is its group's.
    group: i32,
    /// Closed when dropped or when this process dies.
    _pipe: tokio::process::ChildStdin,
    /// Not waited for while held, so its id, the group's, is not reused; reaped by tokio
    /// once dropped.
    _process: tokio::process::Child,
}

/// The watcher's script: wait for the pipe to close, then kill the group.
const WATCH: &str = "while read -r _; do :; done; kill -s KILL 0";

impl Watcher {
    /// Starts a watcher, in a process group of its own. `Err` says why in words.
    pub(crate) fn start() -> Result<Watcher, String> {
        let mut process = tokio::process::Command::new("sh")
            .arg("-c")
            .arg(WATCH)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            // Not in this process's group: a Ctrl-C to the run must not end the watcher
            // before what it watches.
            .process_group(0)
            .spawn()
            .map_err(|e| format!("cannot start sh (the process watcher): {e}"))?;
        let group = process
            .id()
            .and_then(|pid| i32::try_from(pid).ok())
            .ok_or("the process watcher ended as it started")?;
        let pipe = process
            .stdin
            .take()
            .ok_or("the process watcher started without its pipe")?;
        Ok(Watcher {
            group,
            _pipe: pipe,
            _process: process,
        })
    }

    /// The group to start a command into.
    pub(crate) fn group(&self) -> i32 {
        self.group
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        // The group may already be gone; that is the goal. The watcher is not reaped yet,
        // so the id still names this group.
        let _ = nix::sys::signal::killpg(
            nix::unistd::Pid::from_raw(self.group),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
}

/// The environment variable that starts a process as a call's watcher
/// ([`watch_if_asked`]).
#[cfg(target_os = "linux")]
pub(crate) const WATCH_ENV: &str = "AGENT_LOOP_WATCH";

/// The environment variable that says whether a watcher runs its program in a PID
/// namespace of its own (see [`watch_with`]): `off` never, `user` always through a user
/// namespace; unset or empty, whenever the system allows it.
pub const PID_NAMESPACE_ENV: &str = "AGENT_LOOP_PID_NAMESPACE";

/// Whether [`PID_NAMESPACE_ENV`] holds a value watchers know (unset, empty, `off` or
/// `user`); `Err` names the variable, its value and what to set instead, in one line. A
/// watcher takes any other value as unset: a typo must not turn the namespace off.
pub fn check_pid_namespace_env() -> Result<(), String> {
    match std::env::var_os(PID_NAMESPACE_ENV) {
        None => Ok(()),
        Some(value) if value.is_empty() || value == "off" || value == "user" => Ok(()),
        Some(value) => Err(format!(
            "{PID_NAMESPACE_ENV}={}: not a setting; set it to off (commands share agent's \
             PID namespace) or user (a user namespace even as root), or unset it",
            value.to_string_lossy()
        )),
    }
}

/// The program started as a call's watcher, once the binary said it serves
/// [`watch_if_asked`] ([`watch_with`]).
#[cfg(target_os = "linux")]
static WATCH_PROGRAM: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();

/// Has the `shell` built-in start each command, command hooks and answer checks each
/// command, and MCP servers each server, under `program` (this binary, which calls
/// [`watch_if_asked`] first thing in `main`) rather than beside an `sh` watcher: a
/// watcher that is the program's parent and its processes' reaper (Linux's child
/// subreaper), so that a process that leaves the program's process group (`setsid`, a
/// daemon's double fork) comes back to it when its parent dies, and is killed with the
/// rest when the call ends, the server is stopped, or this process dies, `kill -9`
/// included. Elsewhere than on Linux, nothing changes.
pub fn watch_with(program: std::path::PathBuf) {
    #[cfg(target_os = "linux")]
    let _ = WATCH_PROGRAM.set(program);
    #[cfg(not(target_os = "linux"))]
    let _ = program;
}

/// Keeps this process's environment, memory and open files from the programs it starts
/// (commands, hooks, MCP servers) when they run as the same user: Linux's dumpable flag
/// off (`PR_SET_DUMPABLE`), so that `/proc/PID/environ`, `/proc/PID/mem` and
/// `/proc/PID/fd` of this process are root's alone, and no process of the user attaches
/// to it. Without it, what a `shell` call withholds from a command's environment (the API
/// keys and the other variables named like secrets) is one `cat /proc/*/environ` away
/// wherever a command does not run in a user namespace of its own (a system that allows
/// none, `AGENT_LOOP_PID_NAMESPACE=off`), and the person's terminal one `/proc/PID/fd/0`.
/// No core dump is written either: it would hold the same keys. Root is not kept out.
/// Call it in `main` after [`watch_if_asked`] (a watcher, started again from this binary,
/// holds none of it). Elsewhere than on Linux, does nothing.
pub fn keep_from_commands() -> Result<(), String> {
    #[cfg(target_os = "linux")]
    nix::sys::prctl::set_dumpable(false)
        .map_err(|e| format!("cannot keep this process from the commands it runs: {e}"))?;
    Ok(())
}

/// Serves as a watcher if this process was started as one (by a `shell` call, a hook or
/// an MCP server's start, see [`watch_with`]: its environment says so and its link is a
/// socket), and then exits; otherwise returns at once. Call it first thing in `main`.
pub fn watch_if_asked() {
    #[cfg(target_os = "linux")]
    if let Some(link) = asked_link() {
        watching::serve(link);
        std::process::exit(0);
    }
}

/// Where a watcher's link to the `agent` that started it is, which says what the watched
/// program's standard streams are ([`WATCH_ENV`]'s value).
#[cfg(target_os = "linux")]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Link {
    /// `1`: the link is the watcher's standard input; the program's is empty, its output
    /// and errors are the watcher's (a `shell` command's pipes).
    Stdin,
    /// `2`: the link is the watcher's standard error; the program's input and output are
    /// the watcher's (an MCP server's protocol pipes), its errors go nowhere.
    Stderr,
    /// `3`: as `1`, but the program's input comes first on the link, a line `input N`
    /// then N bytes, which the program reads from a pipe to its end (a hook's question).
    Fed,
}

#[cfg(target_os = "linux")]
impl Link {
    /// The value of [`WATCH_ENV`] that asks for this link.
    pub(crate) fn value(self) -> &'static str {
        match self {
            Link::Stdin => "1",
            Link::Stderr => "2",
            Link::Fed => "3",
        }
    }
}

/// The link this process was asked to watch through, if its environment asks and that
/// stream is a socket, as a watcher's link is (a variable left in a person's environment
/// does not make `agent` a watcher).
#[cfg(target_os = "linux")]
fn asked_link() -> Option<Link> {
    use std::os::fd::AsFd;
    let value = std::env::var_os(WATCH_ENV)?;
    let (link, stat) = if value == Link::Stdin.value() {
        (Link::Stdin, rustix::fs::fstat(std::io::stdin().as_fd()))
    } else if value == Link::Fed.value() {
        (Link::Fed, rustix::fs::fstat(std::io::stdin().as_fd()))
    } else if value == Link::Stderr.value() {
        (Link::Stderr, rustix::fs::fstat(std::io::stderr().as_fd()))
    } else {
        return None;
    };
    stat.is_ok_and(|stat| {
        rustix::fs::FileType::from_raw_mode(stat.st_mode) == rustix::fs::FileType::Socket
    })
    .then_some(link)
}

/// The program to start a command under, if the binary serves as a watcher.
#[cfg(target_os = "linux")]
pub(crate) fn watch_program() -> Option<&'static std::path::Path> {
    WATCH_PROGRAM.get().map(std::path::PathBuf::as_path)
}

/// A program started under its watcher ([`spawn_watched`]): dropping this closes the
/// link, and the watcher then kills the program and every process left below it, those
/// that left its process group included, as it does when this process dies. The watcher
/// itself is never killed from here, so that nothing ends it before its sweep.
#[cfg(target_os = "linux")]
pub(crate) struct Watched {
    link: tokio::io::BufReader<tokio::net::UnixStream>,
    /// Not killed on drop; reaped by tokio once it exits.
    _watcher: tokio::process::Child,
    /// The program's process group: its watcher's, led by the watcher.
    group: Option<i32>,
    /// Whether the watcher said how the program ended.
    told: bool,
}

/// The program's standard streams that are pipes to this process, by [`Link`]: output
/// and errors for [`Link::Stdin`] and [`Link::Fed`], input and output for
/// [`Link::Stderr`].
#[cfg(target_os = "linux")]
pub(crate) struct Pipes {
    #[cfg_attr(not(feature = "mcp"), allow(dead_code))]
    pub(crate) stdin: Option<tokio::process::ChildStdin>,
    pub(crate) stdout: Option<tokio::process::ChildStdout>,
    pub(crate) stderr: Option<tokio::process::ChildStderr>,
}

/// What a watched program is kept from: the variables of this process's environment it is
/// not given, and, when it runs in a sandbox ([`crate::Sandbox`]), that sandbox as its
/// watcher makes it.
#[derive(Clone, Copy)]
pub(crate) struct KeptFrom<'a> {
    pub(crate) unset: &'a [std::ffi::OsString],
    pub(crate) sandbox: Option<&'a str>,
}

/// Starts `program` with `args`, `env` added and what `kept_from` says kept from it, in
/// `cwd`, under `watcher` (this binary, see [`watch_with`]) linked by `link`. `Err`
/// when the watcher cannot be started; a program that cannot be started is told on the
/// link ([`Watched::ended`], [`Watched::why_not_started`]).
#[cfg(target_os = "linux")]
pub(crate) fn spawn_watched<'a>(
    watcher: &std::path::Path,
    link: Link,
    program: &str,
    args: impl IntoIterator<Item = &'a str>,
    env: impl IntoIterator<Item = (&'a str, &'a str)>,
    kept_from: KeptFrom<'_>,
    cwd: &std::path::Path,
) -> std::io::Result<(Watched, Pipes)> {
    let KeptFrom { unset, sandbox } = kept_from;
    let (ours, theirs) = std::os::unix::net::UnixStream::pair()?;
    let theirs = Stdio::from(std::os::fd::OwnedFd::from(theirs));
    let mut command = tokio::process::Command::new(watcher);
    command
        .env(WATCH_ENV, link.value())
        .arg(program)
        .args(args)
        .envs(env)
        .current_dir(cwd)
        // The watcher leaves this process's group (a Ctrl-C to the run must not end it
        // before what it watches) and its session, first thing (see `watching::serve`).
        .kill_on_drop(false);
    // Whether the program gets a PID namespace is this process's setting, not one a
    // program's own variables (an MCP server's `env`) could change.
    match std::env::var_os(PID_NAMESPACE_ENV) {
        Some(value) => command.env(PID_NAMESPACE_ENV, value),
        None => command.env_remove(PID_NAMESPACE_ENV),
    };
    // Nor whether it is sandboxed.
    match sandbox {
        Some(spec) => command.env(crate::sandbox::SANDBOX_ENV, spec),
        None => command.env_remove(crate::sandbox::SANDBOX_ENV),
    };
    // The watcher passes its environment on to the program: what the program must not
    // see, the watcher does not have.
    for name in unset {
        command.env_remove(name);
    }
    match link {
        Link::Stdin | Link::Fed => command
            .stdin(theirs)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped()),
        Link::Stderr => command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(theirs),
    };
    let spawned = command.spawn();
    // The watcher's end of the socket, closed here.
    drop(command);
    let mut child = spawned?;
    let pipes = Pipes {
        stdin: child.stdin.take(),
        stdout: child.stdout.take(),
        stderr: child.stderr.take(),
    };
    ours.set_nonblocking(true)?;
    let link = tokio::net::UnixStream::from_std(ours)?;
    Ok((
        Watched {
            link: tokio::io::BufReader::new(link),
            group: child.id().and_then(|pid| i32::try_from(pid).ok()),
            _watcher: child,
            told: false,
        },
        pipes,
    ))
}

#[cfg(target_os = "linux")]
impl Watched {
    /// Gives the program its input ([`Link::Fed`]): it reads it, then the end of it.
    pub(crate) async fn feed(&mut self, input: &[u8]) -> std::io::Result<()> {
        use tokio::io::AsyncWriteExt;
        let link = self.link.get_mut();
        link.write_all(format!("input {}\n", input.len()).as_bytes())
            .await?;
        link.write_all(input).await
    }

    /// How the program ended, once it has; `None` if the watcher ended without saying
    /// (the program, or anything else, killed it): the program's group is then killed
    /// from here ([`Watched::kill_group`]).
    pub(crate) async fn ended(&mut self) -> Option<Ended> {
        use tokio::io::AsyncBufReadExt;
        let mut line = String::new();
        let said = match self.link.read_line(&mut line).await {
            Ok(0) | Err(_) => None,
            Ok(_) => Ended::parse(&line),
        };
        match said {
            Some(ended) => {
                self.told = true;
                Some(ended)
            }
            None => {
                self.kill_group();
                None
            }
        }
    }

    /// Kills the program's process group, which is its watcher's, once the watcher is
    /// gone without saying how the program ended (killed by the program it watched): the
    /// program and its group would otherwise go on, past the call's end and its time
    /// limit. Never while the watcher lives: it is in the group, and its sweep also kills
    /// what left the group. The group's id is the watcher's, which stays taken until the
    /// watcher is reaped (when this value is dropped), so this kill reaches no one else.
    fn kill_group(&self) {
        if let (Some(group), false) = (self.group, self.told) {
            let _ = nix::sys::signal::killpg(
                nix::unistd::Pid::from_raw(group),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }

    /// Ends the watch and waits for the watcher to be gone: in a PID namespace, whatever
    /// the program started is gone with it (its init's end kills the rest), so what it
    /// left can be looked at without a process of it changing it meanwhile.
    pub(crate) async fn end(mut self) {
        use tokio::io::AsyncWriteExt;
        let _ = self.link.get_mut().shutdown().await;
        let _ = self._watcher.wait().await;
    }

    /// Ends the watch (the watcher kills what it started) and returns why the program
    /// could not be started, if that is what its watcher reported.
    #[cfg(feature = "mcp")]
    pub(crate) async fn why_not_started(mut self) -> Option<String> {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        // Closing this side's writing is the watcher's signal; what it wrote is still read.
        let _ = self.link.get_mut().shutdown().await;
        let mut report = String::new();
        let _ = self.link.read_to_string(&mut report).await;
        report.lines().find_map(|line| match Ended::parse(line) {
            Some(Ended::NotStarted(why)) => Some(why),
            _ => None,
        })
    }
}

/// How a watched command ended, as its watcher reports it on the link: one line.
#[cfg(target_os = "linux")]
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Ended {
    /// It exited with this code.
    Code(i32),
    /// A signal killed it.
    Signal(i32),
    /// It could not be started: why.
    NotStarted(String),
}

#[cfg(target_os = "linux")]
impl Ended {
    pub(crate) fn line(&self) -> String {
        match self {
            Ended::Code(code) => format!("code {code}\n"),
            Ended::Signal(signal) => format!("signal {signal}\n"),
            Ended::NotStarted(why) => format!("error {}\n", why.replace('\n', " ")),
        }
    }

    pub(crate) fn parse(line: &str) -> Option<Ended> {
        let (word, rest) = line.trim_end_matches('\n').split_once(' ')?;
        match word {
            "code" => rest.parse().ok().map(Ended::Code),
            "signal" => rest.parse().ok().map(Ended::Signal),
            "error" => Some(Ended::NotStarted(rest.to_owned())),
            _ => None,
        }
    }
}

/// The watcher's side (see [`watch_with`]): its arguments are the program to run and its
/// arguments; one of its standard streams is a socket to the `agent` that started it (the
/// link, see [`Link`]), the others are the program's.
#[cfg(target_os = "linux")]
mod watching {
    use std::io::{Read, Write};
    use std::os::fd::AsFd;
    use std::os::unix::net::UnixStream;
    use std::os::unix::process::CommandExt;
    use std::process::{Command, Stdio};

    use nix::sys::signal::{Signal, kill};
    use nix::sys::wait::{Id, WaitPidFlag, WaitStatus, waitid, waitpid};
    use nix::unistd::Pid;

    use super::{Ended, Link, PID_NAMESPACE_ENV, WATCH_ENV};
    use crate::sandbox::{SANDBOX_ENV, Spec};

    /// Set by a watcher for the init it starts when it gave the namespace mounts of its
    /// own ([`own_mounts`]), so that the init may put this PID namespace's `/proc` in
    /// place of the system's ([`own_proc`]); never set otherwise, whatever the
    /// environment `agent` was started with, since over the system's mounts that would
    /// replace every process's `/proc`.
    const OWN_MOUNTS_ENV: &str = "AGENT_LOOP_OWN_MOUNTS";

    pub(super) fn serve(which: Link) {
        // A session of its own, led by this watcher, whose id is its group's: the one
        // `agent` kills should the watcher die without a report, and for the init of a
        // namespace (below) one the program joins, so that a `kill 0` from the program
        // reaches no process outside. A session with no
        // controlling terminal, so that nothing it starts opens `/dev/tty`: a command
        // cannot write past `agent`'s escaping to the person's terminal, read what they
        // type, or push keystrokes into it (`TIOCSTI`) to answer `agent`'s questions.
        let _ = nix::unistd::setsid();
        // A `kill $PPID` from the program, or a `killall agent`, must not end the watcher
        // before its sweep: it ends when `agent`'s end of the link closes (SIGKILL still
        // ends it). Caught, and so harmless, from before the program starts, so that it
        // cannot signal first; not blocked, since a blocked mask is inherited, and a
        // handler is not (the program starts with each at its default).
        let polite = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        for signal in [
            Signal::SIGTERM,
            Signal::SIGINT,
            Signal::SIGHUP,
            Signal::SIGQUIT,
        ] {
            let _ = signal_hook::flag::register(signal as i32, polite.clone());
        }
        let refuse = |why: String| {
            if let Some(link) = link_of(which) {
                let _ = (&link).write_all(Ended::NotStarted(why).line().as_bytes());
            }
        };
        // A sandbox asked for is made, or the program is not started.
        let sandbox = match Spec::asked().transpose() {
            Ok(sandbox) => sandbox,
            Err(why) => return refuse(why),
        };
        // The first process of a PID namespace is its init, this watcher started again.
        let init = std::process::id() == 1;
        if !init {
            let own_network = sandbox.as_ref().is_some_and(Spec::own_network);
            match (enter_pid_namespace(own_network), &sandbox) {
                (Namespace::Entered { own_mounts }, None) => {
                    return start_init(which, own_mounts);
                }
                (Namespace::Entered { own_mounts: true }, Some(sandbox)) => {
                    return match sandbox.prepare() {
                        Ok(()) => start_init(which, true),
                        Err(why) => refuse(format!("its sandbox cannot be made: {why}")),
                    };
                }
                (Namespace::Broken(why), _) => return refuse(why),
                (_, Some(_)) => {
                    return refuse(format!(
                        "its sandbox cannot be made: it needs namespaces of its own (user, \
                         PID, mount, network), which this system does not allow (or \
                         {PID_NAMESPACE_ENV}=off says not to use them)"
                    ));
                }
                (Namespace::NotAllowed, None) => {}
            }
        }
        if init {
            // Named as the watcher that started it (its program's file name, as the
            // kernel takes it, 15 bytes at most), not `exe` (`/proc/self/exe`).
            let arg0 = std::env::args_os().next().unwrap_or_default();
            let name = std::path::Path::new(&arg0).file_name().unwrap_or_default();
            let name = name.as_encoded_bytes();
            if let Ok(name) = std::ffi::CString::new(&name[..name.len().min(15)]) {
                let _ = nix::sys::prctl::set_name(&name);
            }
            if std::env::var_os(OWN_MOUNTS_ENV).is_some_and(|own| own == "1") {
                own_proc();
            }
            if let Err(why) = drop_capabilities(sandbox.is_some()) {
                return refuse(why);
            }
            // The last: a confined process can mount nothing.
            if let Some(Err(why)) = sandbox.as_ref().map(Spec::confine) {
                return refuse(format!("its sandbox cannot be made: {why}"));
            }
        } else {
            // Without it, a process that left the group still escapes; the rest holds.
            let _ = nix::sys::prctl::set_child_subreaper(true);
        }

        let Some(link) = link_of(which) else {
            return;
        };
        // The program's input, read whole before it starts: nothing is left unread on the
        // link, whatever happens next.
        let input = match which {
            Link::Fed => match read_input(&link) {
                Some(input) => Some(input),
                None => return,
            },
            Link::Stdin | Link::Stderr => None,
        };
        let mut args = std::env::args_os().skip(1);
        let Some(program) = args.next() else {
            return;
        };
        let mut command = Command::new(program);
        command
            .args(args)
            .env_remove(WATCH_ENV)
            .env_remove(OWN_MOUNTS_ENV)
            .env_remove(SANDBOX_ENV)
            // This watcher's own group, whose id is the watcher's pid, which `agent` knows:
            // should the program kill this watcher (`kill -9 $PPID`, possible outside a
            // PID namespace), `agent` kills the group itself.
            .process_group(nix::unistd::getpgrp().as_raw());
        match which {
            Link::Stdin => command.stdin(Stdio::null()),
            Link::Fed => command.stdin(Stdio::piped()),
            Link::Stderr => command.stderr(Stdio::null()),
        };
        let spawned = command.spawn();
        // This process's copies of the program's pipes are closed, so that they close when
        // the program's processes close theirs (the link was copied above).
        if let Ok(null) = std::fs::File::options()
            .read(true)
            .write(true)
            .open("/dev/null")
        {
            if which == Link::Stderr {
                let _ = nix::unistd::dup2_stdin(&null);
            }
            let _ = nix::unistd::dup2_stdout(&null);
            let _ = nix::unistd::dup2_stderr(&null);
        }
        let mut child = match spawned {
            Ok(child) => child,
            Err(e) => {
                let _ = (&link).write_all(Ended::NotStarted(e.to_string()).line().as_bytes());
                return;
            }
        };
        if let (Some(input), Some(mut stdin)) = (input, child.stdin.take()) {
            // A program that does not read its input is its own business.
            std::thread::spawn(move || {
                let _ = stdin.write_all(&input);
            });
        }
        let Ok(pid) = i32::try_from(child.id()).map(Pid::from_raw) else {
            return;
        };
        if let Ok(mut report) = link.try_clone() {
            std::thread::spawn(move || {
                // Not reaped (`WNOWAIT`): the sweep reaps it with the rest.
                let flags = WaitPidFlag::WEXITED | WaitPidFlag::WNOWAIT;
                let waited = loop {
                    match waitid(Id::Pid(pid), flags) {
                        Err(nix::errno::Errno::EINTR) => {}
                        waited => break waited,
                    }
                };
                let ended = match waited {
                    Ok(WaitStatus::Exited(_, code)) => Ended::Code(code),
                    Ok(WaitStatus::Signaled(_, signal, _)) => Ended::Signal(signal as i32),
                    _ => return,
                };
                let _ = report.write_all(ended.line().as_bytes());
            });
        }
        drop(child);
        // Until the call ends: `agent` closes the link then, or dies. A caught signal may
        // interrupt the wait, which goes on.
        let mut byte = [0u8; 64];
        loop {
            match (&link).read(&mut byte) {
                Ok(0) => break,
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => break,
            }
        }
        // The init of a namespace needs no sweep: when it exits, the kernel kills every
        // process left in it. Otherwise the program's group is this watcher's: killing it
        // would end the watcher before its sweep, which kills the group's processes and
        // those that left it alike.
        if !init {
            sweep();
        }
    }

    /// A copy of the link, from the standard stream `which` names.
    fn link_of(which: Link) -> Option<UnixStream> {
        let stream = match which {
            Link::Stdin | Link::Fed => std::io::stdin().as_fd().try_clone_to_owned(),
            Link::Stderr => std::io::stderr().as_fd().try_clone_to_owned(),
        };
        stream.ok().map(UnixStream::from)
    }

    /// Whether this watcher's children go into a PID namespace of their own
    /// ([`enter_pid_namespace`]).
    enum Namespace {
        /// They do: the next one is the namespace's init. `own_mounts`: with mounts of
        /// their own ([`own_mounts`]).
        Entered { own_mounts: bool },
        /// The system does not allow it, or the person said not to ([`PID_NAMESPACE_ENV`]):
        /// the watcher watches as a subreaper.
        NotAllowed,
        /// A user namespace was made but its user could not be mapped: why.
        Broken(String),
    }

    /// Makes this watcher's next child the first process of a PID namespace of its own,
    /// when the system allows it: directly when privileged (`CAP_SYS_ADMIN`), else inside
    /// a user namespace that maps this user, and only it, to itself (the program runs as
    /// the same user and groups; set-user-ID programs such as `sudo` gain nothing there).
    /// Not through a user namespace where AppArmor would leave it powerless
    /// ([`apparmor_restricts_userns`]). [`PID_NAMESPACE_ENV`] set to `off` says never,
    /// `user` always through a user namespace (restricted or not).
    fn enter_pid_namespace(own_network: bool) -> Namespace {
        use nix::sched::{CloneFlags, unshare};
        let asked = std::env::var(PID_NAMESPACE_ENV).unwrap_or_default();
        if asked == "off" {
            return Namespace::NotAllowed;
        }
        // A network namespace, for a sandbox without network, goes with the mounts: a
        // namespace without either is no sandbox, and is refused one.
        let network = if own_network {
            CloneFlags::CLONE_NEWNET
        } else {
            CloneFlags::empty()
        };
        if asked != "user" {
            if unshare(CloneFlags::CLONE_NEWPID | CloneFlags::CLONE_NEWNS | network).is_ok() {
                return Namespace::Entered {
                    own_mounts: own_mounts(),
                };
            }
            if unshare(CloneFlags::CLONE_NEWPID).is_ok() {
                return Namespace::Entered { own_mounts: false };
            }
        }
        let restriction =
            std::fs::read_to_string("/proc/sys/kernel/apparmor_restrict_unprivileged_userns");
        if asked != "user" && apparmor_restricts_userns(restriction.ok().as_deref()) {
            return Namespace::NotAllowed;
        }
        let (uid, gid) = (nix::unistd::geteuid(), nix::unistd::getegid());
        let namespaces = CloneFlags::CLONE_NEWUSER | CloneFlags::CLONE_NEWPID;
        let with_mounts = if unshare(namespaces | CloneFlags::CLONE_NEWNS | network).is_ok() {
            true
        } else if unshare(namespaces).is_ok() {
            false
        } else {
            return Namespace::NotAllowed;
        };
        // In a new user namespace a user is no one until mapped; an unprivileged process
        // may map only its own ids, and its groups only once it gave up `setgroups`.
        let mapped = std::fs::write("/proc/self/setgroups", "deny")
            .and_then(|()| std::fs::write("/proc/self/uid_map", format!("{uid} {uid} 1\n")))
            .and_then(|()| std::fs::write("/proc/self/gid_map", format!("{gid} {gid} 1\n")));
        match mapped {
            // The init needs `CAP_SYS_ADMIN` in this namespace to mount its `/proc`: a
            // process of a user other than the namespace's root loses its capabilities when
            // it starts a program, save those it holds as ambient ones, which the init
            // drops before it starts its own ([`drop_capabilities`]).
            Ok(()) => Namespace::Entered {
                own_mounts: with_mounts && own_mounts() && keep_for_init(),
            },
            Err(e) => Namespace::Broken(format!(
                "cannot map its user into the user namespace of its watcher: {e} \
                 (set {PID_NAMESPACE_ENV}=off to run commands without one)"
            )),
        }
    }

    /// Makes the mount namespace this watcher just entered its own (every mount private,
    /// so that nothing mounted here reaches the system's), then puts a devpts instance of
    /// its own on `/dev/pts`: the terminals open on the system (the person's, those of
    /// their other shells, which the user may open by name, `/dev/pts/N`) are not there
    /// to open, and a program that makes a terminal makes it in this instance. `false`
    /// (and nothing mounted) if the mounts could not be made private; a devpts that could
    /// not be mounted leaves the system's in place.
    fn own_mounts() -> bool {
        use nix::mount::{MsFlags, mount};
        let private = MsFlags::MS_REC | MsFlags::MS_PRIVATE;
        if mount(None::<&str>, "/", None::<&str>, private, None::<&str>).is_err() {
            return false;
        }
        let _ = mount(
            Some("devpts"),
            "/dev/pts",
            Some("devpts"),
            MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC,
            Some("newinstance,ptmxmode=0666,mode=0620"),
        );
        true
    }

    /// Keeps `CAP_SYS_ADMIN` in this user namespace for the init this watcher starts
    /// next, as an ambient capability; `false` if it cannot.
    fn keep_for_init() -> bool {
        use caps::{CapSet, Capability};
        if nix::unistd::geteuid().is_root() {
            // The namespace's root keeps its capabilities when it starts a program.
            return true;
        }
        caps::raise(None, CapSet::Inheritable, Capability::CAP_SYS_ADMIN).is_ok()
            && caps::raise(None, CapSet::Ambient, Capability::CAP_SYS_ADMIN).is_ok()
    }

    /// In the init of a namespace whose watcher gave it mounts of its own: a `/proc` of
    /// this PID namespace's over the system's, so that a program sees the processes of
    /// its call alone, and cannot read another's environment (the person's shell's, with
    /// the keys `agent` withholds from commands, an MCP server's) or open files. Where it
    /// cannot be mounted (a container whose `/proc` is partly covered), the system's stays.
    fn own_proc() {
        use nix::mount::{MsFlags, mount};
        let _ = mount(
            Some("proc"),
            "/proc",
            Some("proc"),
            MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
            None::<&str>,
        );
    }

    /// In the init of a namespace, before it starts the program: every capability the
    /// init holds dropped, unless it is root (the program then runs as root, as `agent`
    /// does). The program must not inherit what let the init mount its `/proc`, with
    /// which it could take the namespace's mounts away. A sandboxed program gets none,
    /// root's included, nor can it gain one by starting another (the bounding set is
    /// emptied first): root's capabilities would load a kernel module, make a device node
    /// to write a disk through, or reach the hardware, none of which the sandbox's rules
    /// on files and the network see.
    fn drop_capabilities(sandboxed: bool) -> Result<(), String> {
        use caps::CapSet;
        let root = nix::unistd::geteuid().is_root();
        // Only root gains the bounding set's capabilities by starting a program (another
        // user, here or in a user namespace, gains none, and may not empty it).
        let sets: &[CapSet] = if sandboxed && root {
            &[
                CapSet::Bounding,
                CapSet::Ambient,
                CapSet::Inheritable,
                CapSet::Effective,
                CapSet::Permitted,
            ]
        } else if root && !sandboxed {
            &[CapSet::Ambient]
        } else {
            &[
                CapSet::Ambient,
                CapSet::Inheritable,
                CapSet::Effective,
                CapSet::Permitted,
            ]
        };
        for &set in sets {
            caps::clear(None, set)
                .map_err(|e| format!("cannot drop the capabilities of its watcher: {e}"))?;
        }
        Ok(())
    }

    /// Whether the system lets an unprivileged process make a user namespace but not use
    /// it, as Ubuntu (23.10 and later) does by default: the namespace is made, then the
    /// process is denied every capability in it, so that its user cannot be mapped and
    /// the watcher could run nothing. `setting` is
    /// `/proc/sys/kernel/apparmor_restrict_unprivileged_userns`, when there is one.
    pub(super) fn apparmor_restricts_userns(setting: Option<&str>) -> bool {
        setting.is_some_and(|value| value.trim() != "0")
    }

    /// Starts this binary again, with the same arguments, environment and standard
    /// streams, as the init of the PID namespace [`enter_pid_namespace`] made: the
    /// watcher proper. Nothing inside a namespace can kill its init, nor signal a process
    /// outside, and everything inside dies when the init exits. Then lets go of the
    /// streams, so that they close when the init and the program close theirs, and waits
    /// for the init.
    fn start_init(which: Link, own_mounts: bool) {
        let mut args = std::env::args_os();
        let arg0 = args.next().unwrap_or_default();
        let mut init = Command::new("/proc/self/exe");
        init.arg0(arg0).args(args);
        if own_mounts {
            init.env(OWN_MOUNTS_ENV, "1");
        } else {
            init.env_remove(OWN_MOUNTS_ENV);
        }
        let spawned = init.spawn();
        let link = link_of(which);
        let mut init = match spawned {
            Ok(init) => init,
            Err(e) => {
                if let Some(link) = link {
                    let why = format!("cannot start its watcher in a PID namespace: {e}");
                    let _ = (&link).write_all(Ended::NotStarted(why).line().as_bytes());
                }
                return;
            }
        };
        drop(link);
        if let Ok(null) = std::fs::File::options()
            .read(true)
            .write(true)
            .open("/dev/null")
        {
            let _ = nix::unistd::dup2_stdin(&null);
            let _ = nix::unistd::dup2_stdout(&null);
            let _ = nix::unistd::dup2_stderr(&null);
        }
        let _ = init.wait();
    }

    /// The program's input, as `agent` sends it first on a [`Link::Fed`] link: a line
    /// `input N`, then N bytes. `None` if the link says anything else or closes first.
    pub(super) fn read_input(mut link: &UnixStream) -> Option<Vec<u8>> {
        /// More than any question `agent` asks a hook.
        const MOST: usize = 1 << 30;
        let mut line = Vec::new();
        let mut byte = [0u8; 1];
        loop {
            link.read_exact(&mut byte).ok()?;
            if byte[0] == b'\n' {
                break;
            }
            // A header is a few bytes: a longer line is not one.
            if line.len() == 32 {
                return None;
            }
            line.push(byte[0]);
        }
        let len: usize = std::str::from_utf8(&line)
            .ok()?
            .strip_prefix("input ")?
            .parse()
            .ok()
            .filter(|&len| len <= MOST)?;
        let mut input = vec![0; len];
        link.read_exact(&mut input).ok()?;
        Some(input)
    }

    /// Kills every process left below this one, those that left the command's group
    /// included (they came back to this reaper when their parents died), until none is.
    fn sweep() {
        loop {
            let children = children();
            if children.is_empty() {
                return;
            }
            for &pid in &children {
                let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
            }
            for pid in children {
                let _ = waitpid(Pid::from_raw(pid), None);
            }
        }
    }

    /// This process's children, from every thread's list in `/proc`.
    fn children() -> Vec<i32> {
        let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
            return Vec::new();
        };
        tasks
            .flatten()
            .filter_map(|task| std::fs::read_to_string(task.path().join("children")).ok())
            .flat_map(|list| {
                list.split_whitespace()
                    .filter_map(|pid| pid.parse().ok())
                    .collect::<Vec<i32>>()
            })
            .collect()
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::Ended;
    use super::watching::{apparmor_restricts_userns, read_input};

    #[test]
    fn a_user_namespace_is_not_tried_where_apparmor_makes_it_powerless() {
        assert!(apparmor_restricts_userns(Some("1\n")));
        assert!(apparmor_restricts_userns(Some("2")));
        assert!(!apparmor_restricts_userns(Some("0\n")));
        assert!(!apparmor_restricts_userns(None));
    }

    #[test]
    fn a_hooks_input_is_read_whole_from_its_header_and_nothing_else_is_taken_for_it() {
        use std::io::Write;
        use std::os::unix::net::UnixStream;
        let sent = |bytes: &[u8]| {
            let (mut ours, theirs) = UnixStream::pair().unwrap();
            ours.write_all(bytes).unwrap();
            drop(ours);
            read_input(&theirs)
        };
        assert_eq!(sent(b"input 3\nabc"), Some(b"abc".to_vec()));
        assert_eq!(sent(b"input 0\n"), Some(Vec::new()));
        // What follows the input stays on the link.
        let (mut ours, theirs) = UnixStream::pair().unwrap();
        ours.write_all(b"input 2\nhi and more").unwrap();
        assert_eq!(read_input(&theirs), Some(b"hi".to_vec()));
        drop(ours);
        let mut rest = String::new();
        std::io::Read::read_to_string(&mut &theirs, &mut rest).unwrap();
        assert_eq!(rest, " and more");
        for bad in [
            &b"input 4\nabc"[..],
            b"input x\n",
            b"output 3\nabc",
            b"input 2000000000\n",
            b"input 3",
            b"",
            b"input 00000000000000000000000000000003\nabc",
        ] {
            assert_eq!(sent(bad), None, "{:?}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn how_a_command_ended_reads_back_from_its_line() {
        for ended in [
            Ended::Code(0),
            Ended::Code(-1),
            Ended::Signal(15),
            Ended::NotStarted("No such file or directory (os error 2)".into()),
        ] {
            assert_eq!(Ended::parse(&ended.line()), Some(ended));
        }
        assert_eq!(
            Ended::NotStarted("two\nlines".into()).line(),
            "error two lines\n"
        );
        for garbage in ["", "\n", "code\n", "code x\n", "exit 0\n"] {
            assert_eq!(Ended::parse(garbage), None, "{garbage:?}");
        }
    }
}

/// The variables of this process's environment that hold secrets
/// ([`agent_core::holds_secret`]: named like secrets, or a URL with a password in it) and
/// that `given` does not pass on: what a program started for the run is not handed.
pub(crate) fn withheld_here(given: impl Fn(&str) -> bool) -> Vec<std::ffi::OsString> {
    std::env::vars_os()
        .filter(|(name, value)| {
            let name = name.to_string_lossy();
            agent_core::holds_secret(&name, &value.to_string_lossy()) && !given(&name)
        })
        .map(|(name, _)| name)
        .collect()
}

/// Of the variables named in `names` (those of an environment), the ones named like
/// secrets ([`agent_core::named_like_secret`]: `OPENAI_API_KEY`, `GH_TOKEN`, ...) that
/// `given` does not pass on: what a program started for the run is not handed.
pub(crate) fn withheld_secrets<N: AsRef<std::ffi::OsStr>>(
    names: impl IntoIterator<Item = N>,
    given: impl Fn(&str) -> bool,
) -> Vec<N> {
    names
        .into_iter()
        .filter(|name| {
            let text = name.as_ref().to_string_lossy();
            agent_core::named_like_secret(&text) && !given(&text)
        })
        .collect()
}
