//! The sandbox of `shell` commands (Linux; the `process` feature): what a command the
//! model asked for may change, and whether it may reach the network, enforced by the
//! kernel rather than judged from the command's text.
//!
//! A sandboxed command is started by its watcher (see `process::watch_with`) in
//! namespaces of its own (user where needed, PID, mount and, without network, network),
//! and there:
//!
//! - it may write only beneath the workspace, the directories the person named, and a
//!   `/tmp` and `/dev/shm` of its own (Landlock: the kernel refuses every other write,
//!   creation, removal, rename or truncation, whatever the file's permissions, and for
//!   root too; reads are left alone, but for credentials, below);
//! - what the file tools may not change either (the run store, agent's settings, the
//!   `.git` of the workspace's repository and of every one nested in it: see
//!   [`crate::Workspace::protected_places`], [`crate::Workspace::protected_found`]) is mounted
//!   read-only, so a command cannot rewrite the log its run is judged by or plant a git
//!   hook; one that is not there, a `shell` command that makes it sees taken away once it
//!   and all it started are gone ([`remove_made`]);
//! - what holds the person's credentials in a home directory ([`CREDENTIALS`]: SSH and
//!   GnuPG keys, cloud and registry tokens, `.netrc`, shell histories, browser profiles),
//!   and as root the system's ([`SYSTEM_CREDENTIALS`]), is hidden, a directory behind an
//!   empty read-only one, a file behind an empty read-only one, so that a command cannot
//!   read a key and print it to the model (and so to its provider and the run's log);
//!   [`Sandbox::showing`] leaves one visible, [`Sandbox::hiding`] hides more;
//! - the system's sockets under `/run` and `/tmp` (Docker's, D-Bus's, which would start
//!   programs outside, an SSH agent's, X's) are not there: both are empty directories of
//!   its own;
//! - without network it has a network of its own with only a loopback interface: servers
//!   it starts on 127.0.0.1 answer it, nothing else does; with network, it still reaches
//!   no socket of the abstract namespace made outside it (Linux 6.12 on);
//! - it holds no capability, root's neither, and cannot gain one (`no_new_privs`: `sudo`
//!   and other set-user-ID programs run with none); it makes no device node.
//!
//! A sandbox that cannot be made (a kernel without Landlock, a system that allows no
//! namespaces) is never run without: the command is refused, saying why.

#[cfg(target_os = "linux")]
use std::path::Path;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::Workspace;
use crate::workspace::{CREDENTIALS, home_dirs};

/// The variable that carries a sandbox's [`Spec`] from `agent` to the watcher of a
/// command; set or removed by `agent` for each command, after any variables a program is
/// given, and removed before the program starts.
pub(crate) const SANDBOX_ENV: &str = "AGENT_LOOP_SANDBOX";

/// The most places a sandbox makes read-only (the workspace's protected places, the
/// `.git` of every repository in it): each costs a few mounts at every command (about
/// 20 µs), and its path a share of the watcher's description ([`MAX_SPEC_BYTES`]).
const MAX_PROTECTED: usize = 1024;

/// The longest description of a sandbox: it travels in one environment variable, which
/// Linux takes up to 128 KiB long.
const MAX_SPEC_BYTES: usize = 120 << 10;

/// Why a sandbox cannot be made by a program that offers no watcher.
pub(crate) const NO_WATCHER: &str = "its sandbox cannot be made: that takes agent's watcher, \
     which this program does not offer (agent_tools::watch_with, first thing in main)";

/// What a sandboxed `shell` command may do beyond reading: write in the workspace (and in
/// the directories given with [`Sandbox::writing`]), and reach the network only when
/// [`Sandbox::with_network`] says so. See the module's documentation for the whole of it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Sandbox {
    network: bool,
    read_only: bool,
    writable: Vec<PathBuf>,
    hidden: Vec<PathBuf>,
    shown: Vec<PathBuf>,
}

impl Sandbox {
    /// A sandbox whose commands write only in the workspace and reach no network.
    pub fn new() -> Sandbox {
        Sandbox::default()
    }

    /// Lets commands reach the network (`true`), or not.
    #[must_use]
    pub fn with_network(mut self, network: bool) -> Sandbox {
        self.network = network;
        self
    }

    /// Keeps commands from writing in the workspace too (`true`): they write only in their
    /// own `/tmp` (and the directories given with [`Sandbox::writing`]), and may run
    /// whatever they like to look at it.
    #[must_use]
    pub fn with_read_only(mut self, read_only: bool) -> Sandbox {
        self.read_only = read_only;
        self
    }

    /// Whether commands may not write in the workspace either.
    pub fn read_only(&self) -> bool {
        self.read_only
    }

    /// Lets commands also write beneath `dir` (a cache a build needs, say:
    /// `~/.cargo`). A directory that does not exist when a command starts gives nothing.
    #[must_use]
    pub fn writing(mut self, dir: impl Into<PathBuf>) -> Sandbox {
        self.writable.push(dir.into());
        self
    }

    /// Hides `place` (a file or a directory) from commands too, as [`CREDENTIALS`] are:
    /// a directory is seen empty, a file empty, neither writable. One that does not exist
    /// when a command starts, or that holds the workspace or a writable directory, is left
    /// as it is.
    #[must_use]
    pub fn hiding(mut self, place: impl Into<PathBuf>) -> Sandbox {
        self.hidden.push(place.into());
        self
    }

    /// Leaves the places of [`CREDENTIALS`] (and [`SYSTEM_CREDENTIALS`]) at or beneath
    /// `place` visible to commands (a command that needs them: `git push` over SSH with
    /// [`Sandbox::with_network`] needs `~/.ssh`); those given with [`Sandbox::hiding`] stay
    /// hidden.
    #[must_use]
    pub fn showing(mut self, place: impl Into<PathBuf>) -> Sandbox {
        self.shown.push(place.into());
        self
    }

    /// The places hidden beyond [`CREDENTIALS`].
    pub fn hidden(&self) -> &[PathBuf] {
        &self.hidden
    }

    /// The places where [`CREDENTIALS`] are left visible.
    pub fn shown(&self) -> &[PathBuf] {
        &self.shown
    }

    /// Every place a command is to have hidden, whether there or not: [`CREDENTIALS`] in
    /// each home directory and, as root, [`SYSTEM_CREDENTIALS`], but those shown; then
    /// those given with [`Sandbox::hiding`].
    fn to_hide(&self) -> Vec<PathBuf> {
        let same = |path: &PathBuf| path.canonicalize().unwrap_or_else(|_| path.clone());
        let shown: Vec<PathBuf> = self.shown.iter().map(same).collect();
        let mut places: Vec<PathBuf> = home_dirs()
            .iter()
            .flat_map(|home| CREDENTIALS.iter().map(|name| home.join(name)))
            .collect();
        // Only root reads these (the commands of another user could not).
        #[cfg(target_os = "linux")]
        if nix::unistd::geteuid().is_root() {
            places.extend(SYSTEM_CREDENTIALS.iter().map(PathBuf::from));
        }
        // (Each place is looked up only when something is shown.)
        places.retain(|place| !shown.iter().any(|dir| same(place).starts_with(dir)));
        places.extend(self.hidden.iter().cloned());
        places
    }

    /// The sandbox as a run's manifest records it (and a queued run's spec carries it).
    pub fn record(&self) -> agent_core::SandboxRecord {
        let paths = |paths: &[PathBuf]| -> Vec<String> {
            paths.iter().map(|p| p.display().to_string()).collect()
        };
        agent_core::SandboxRecord {
            network: self.network,
            read_only: self.read_only,
            write: paths(&self.writable),
            hide: paths(&self.hidden),
            show: paths(&self.shown),
        }
    }

    /// The sandbox `record` describes ([`Sandbox::record`]'s inverse).
    pub fn from_record(record: &agent_core::SandboxRecord) -> Sandbox {
        let paths =
            |paths: &[String]| -> Vec<PathBuf> { paths.iter().map(PathBuf::from).collect() };
        Sandbox {
            network: record.network,
            read_only: record.read_only,
            writable: paths(&record.write),
            hidden: paths(&record.hide),
            shown: paths(&record.show),
        }
    }

    /// Whether commands may reach the network.
    pub fn network(&self) -> bool {
        self.network
    }

    /// The directories beyond the workspace commands may write in.
    pub fn writable(&self) -> &[PathBuf] {
        &self.writable
    }

    /// What the watcher of a command in `workspace` makes, as [`SANDBOX_ENV`] carries it.
    pub(crate) fn spec(&self, workspace: &Workspace) -> Result<String, String> {
        self.spec_with(workspace, workspace.protected_found())
    }

    /// [`Sandbox::spec`] with what [`Workspace::protected_found`] found.
    fn spec_with(&self, workspace: &Workspace, found: Vec<PathBuf>) -> Result<String, String> {
        let mut protected = workspace.protected_places();
        protected.extend(found);
        protected.sort();
        protected.dedup();
        if protected.len() > MAX_PROTECTED {
            return Err(format!(
                "the workspace {} holds {} git directories and other protected places, more \
                 than the {MAX_PROTECTED} a sandbox keeps read-only; run in a directory \
                 that holds fewer repositories (`--workspace`)",
                workspace.root().display(),
                protected.len()
            ));
        }
        let spec = Spec {
            workspace: workspace.root().to_path_buf(),
            writable: self
                .writable
                .iter()
                .filter_map(|dir| dir.canonicalize().ok())
                .collect(),
            protected,
            hidden: self.to_hide(),
            read_only: self.read_only,
            network: self.network,
        };
        let described = serde_json::to_string(&spec)
            .map_err(|e| format!("cannot describe the sandbox to the command's watcher: {e}"))?;
        if described.len() > MAX_SPEC_BYTES {
            return Err(format!(
                "the sandbox of the workspace {} keeps {} git directories and other places \
                 read-only, {} KiB of paths with those it hides, more than a command's \
                 watcher can be told of; run in a directory that holds fewer repositories \
                 (`--workspace`)",
                workspace.root().display(),
                spec.protected.len(),
                described.len() >> 10
            ));
        }
        Ok(described)
    }

    /// [`Sandbox::spec`] made on tokio's blocking pool: the look for the workspace's
    /// repositories reads directories, as many as the workspace has the first time.
    pub(crate) async fn spec_apart(&self, workspace: &Workspace) -> Result<String, String> {
        self.spec_and_found_apart(workspace)
            .await
            .map(|(spec, _)| spec)
    }

    /// [`Sandbox::spec_apart`], with the places named like `.git` it found in the
    /// workspace ([`Workspace::protected_found`]), there when the command starts.
    pub(crate) async fn spec_and_found_apart(
        &self,
        workspace: &Workspace,
    ) -> Result<(String, Vec<PathBuf>), String> {
        let (sandbox, workspace) = (self.clone(), workspace.clone());
        tokio::task::spawn_blocking(move || {
            let found = workspace.protected_found();
            let spec = sandbox.spec_with(&workspace, found.clone())?;
            Ok((spec, found))
        })
        .await
        .map_err(|e| format!("cannot describe the sandbox to the command's watcher: {e}"))?
    }

    /// Whether commands in `workspace` can run in this sandbox here: one is made, as for a
    /// command, and `true` run in it. `Err` says why not, in the words a refused command
    /// would get. Worth a few milliseconds before a run, so that a person learns it then
    /// rather than from every command the model tries.
    pub async fn probe(&self, workspace: &Workspace) -> Result<(), String> {
        #[cfg(target_os = "linux")]
        {
            use crate::process::{Ended, KeptFrom, Link, spawn_watched};
            let spec = self.spec(workspace)?;
            let program = crate::process::watch_program()
                .filter(|p| p.is_file())
                .ok_or(NO_WATCHER)?;
            let kept_from = KeptFrom {
                unset: &[],
                sandbox: Some(&spec),
            };
            let no_env: [(&str, &str); 0] = [];
            let (mut watched, _pipes) = spawn_watched(
                program,
                Link::Stdin,
                "true",
                [],
                no_env,
                kept_from,
                workspace.root(),
            )
            .map_err(|e| format!("cannot start {}: {e}", program.display()))?;
            match watched.ended().await {
                Some(Ended::Code(0)) => Ok(()),
                Some(Ended::NotStarted(why)) => Err(why),
                Some(Ended::Code(code)) => Err(format!("`true` exited {code} in it")),
                Some(Ended::Signal(signal)) => Err(format!("`true` was killed in it ({signal})")),
                None => Err("its watcher ended without saying how".to_owned()),
            }
        }
        #[cfg(not(target_os = "linux"))]
        {
            let _ = workspace;
            Err("commands are sandboxed on Linux only".to_owned())
        }
    }

    /// Sentences for the model: what its commands may not do.
    pub(crate) fn told(&self) -> String {
        let mut places: Vec<String> = Vec::new();
        if !self.read_only {
            places.push("the workspace".to_owned());
        }
        places.extend(self.writable.iter().map(|dir| dir.display().to_string()));
        places.push("/tmp".to_owned());
        let last = places.pop().unwrap_or_default();
        let places = if places.is_empty() {
            last
        } else {
            format!("{} and {last}", places.join(", "))
        };
        let kept = if self.read_only {
            "the workspace is read-only"
        } else {
            "git's own files (every .git, bare repository, hooks directory a repository names and \
             config file it includes) and agent's own files are read-only"
        };
        let network = if self.network {
            ""
        } else {
            ", and have no network beyond their own 127.0.0.1"
        };
        let mut hidden =
            "the home directory's keys and tokens (.ssh, .aws, .netrc and the like)".to_owned();
        let shown: Vec<String> = self.shown.iter().map(|p| p.display().to_string()).collect();
        if !shown.is_empty() {
            hidden.push_str(&format!(" but those in {}", shown.join(" and ")));
        }
        for place in &self.hidden {
            hidden.push_str(&format!(", {}", place.display()));
        }
        format!(
            "Commands run in a sandbox: they may write only in {places} ({kept}){network}; \
             {hidden} are hidden from them (seen empty)."
        )
    }
}

/// Takes away those of `absent` (protected places, each with what it is, that were not
/// there before a sandboxed command) that are there now, links as links, directories
/// whole; what was taken, named relative to `root` with what it is, for the model.
#[cfg(target_os = "linux")]
pub(crate) fn remove_made(absent: &[(PathBuf, String)], root: &Path) -> Vec<String> {
    let mut removed = Vec::new();
    for (place, what) in absent {
        let Ok(found) = std::fs::symlink_metadata(place) else {
            continue;
        };
        let gone = if found.is_dir() {
            std::fs::remove_dir_all(place)
        } else {
            std::fs::remove_file(place)
        };
        let name = place.strip_prefix(root).unwrap_or(place).display();
        match gone {
            Ok(()) => removed.push(format!("{name} ({what}): removed")),
            Err(e) => removed.push(format!("{name} ({what}): could not be removed ({e})")),
        }
    }
    removed
}

/// [`Workspace::protected_found`] on tokio's blocking pool (it may read directories).
#[cfg(target_os = "linux")]
pub(crate) async fn found_apart(workspace: &Workspace) -> Vec<PathBuf> {
    let workspace = workspace.clone();
    tokio::task::spawn_blocking(move || workspace.protected_found())
        .await
        .unwrap_or_default()
}

/// The places like `.git` found in `workspace` now that were not among `before` (found
/// before a sandboxed command or call) and make git run programs, each named relative to
/// the root with what it runs ([`runs_programs`]): what it wrote there runs when a person
/// uses git in them, outside any sandbox.
#[cfg(target_os = "linux")]
pub(crate) async fn made_since(before: &[PathBuf], workspace: &Workspace) -> Vec<String> {
    found_apart(workspace)
        .await
        .into_iter()
        .filter(|place| !before.contains(place))
        .filter_map(|place| {
            let runs = runs_programs(&place);
            let name = place.strip_prefix(workspace.root()).unwrap_or(&place);
            (!runs.is_empty()).then(|| format!("{} ({})", name.display(), runs.join("; ")))
        })
        .collect()
}

/// What a sandboxed command or an MCP server's call is told after it when it made
/// something (`who` made it: "the command", "the server"): the protected places it made,
/// taken away ([`remove_made`]; `forbidden` says whose they are not to make), and the
/// repositories it made in which git would run what it wrote ([`made_since`]). `None` when
/// it made neither.
#[cfg(target_os = "linux")]
pub(crate) fn after_note(
    who: &str,
    forbidden: &str,
    removed: &[String],
    made: &[String],
) -> Option<String> {
    if removed.is_empty() && made.is_empty() {
        return None;
    }
    let mut note = String::from("--- agent ---\n");
    if !removed.is_empty() {
        note.push_str(&format!(
            "{who} made what {forbidden}: {}\n",
            removed.join("; ")
        ));
    }
    if !made.is_empty() {
        note.push_str(&format!(
            "{who} made a repository in which git would run what {who} wrote (look before \
             using git there): {}\n",
            made.join("; ")
        ));
    }
    Some(note)
}

/// What makes git run programs in the repository whose `.git` is `place`, each in words:
/// its hooks (the files in `hooks/`, git's own `.sample`s aside), the settings of its
/// `config` (and `config.worktree`) that name a program or include another file (and
/// aliases that run a shell command), a `commondir` that sends git elsewhere, or, for a
/// `.git` file, that it points elsewhere; for a directory a `core.hooksPath` names, the
/// hooks in it; for a file a config includes, its settings that name a program. Empty
/// for a repository as `git init` or `git clone` makes it.
pub(crate) fn runs_programs(place: &Path) -> Vec<String> {
    let mut found = Vec::new();
    let dot_git = place
        .file_name()
        .is_some_and(|name| name.eq_ignore_ascii_case(".git"));
    let file = std::fs::metadata(place).is_ok_and(|m| m.is_file());
    if file && !dot_git {
        // A file a repository's config includes: git reads it as config.
        settings_named(place, "config", &mut found);
        return found;
    }
    if file {
        let said = crate::workspace::small_file(place, 4 << 10).unwrap_or_default();
        let said = String::from_utf8_lossy(&said);
        let to = said.lines().next().unwrap_or_default().trim();
        found.push(format!("a .git file that says \"{}\"", to.escape_debug()));
        return found;
    }
    if !dot_git && !crate::workspace::is_git_directory(place) {
        // A directory a repository's `core.hooksPath` names: what is in it runs as hooks.
        hooks_in(place, "", &mut found);
        return found;
    }
    hooks_in(&place.join("hooks"), "hooks/", &mut found);
    // git reads `config.worktree` too once the config asks it to, and a `commondir` file
    // sends it to another directory's config and hooks.
    for file in ["config", "config.worktree"] {
        settings_named(&place.join(file), file, &mut found);
    }
    let common = place.join("commondir");
    if std::fs::symlink_metadata(&common).is_ok() {
        let said = crate::workspace::small_file(&common, 4 << 10).unwrap_or_default();
        let said = String::from_utf8_lossy(&said);
        let to = said.lines().next().unwrap_or_default().trim();
        found.push(format!("a commondir that says \"{}\"", to.escape_debug()));
    }
    found
}

/// The hooks in `dir` (git's own `.sample`s aside), named after `prefix`, eight at most.
fn hooks_in(dir: &Path, prefix: &str, found: &mut Vec<String>) {
    let Ok(hooks) = std::fs::read_dir(dir) else {
        return;
    };
    let mut named: Vec<String> = hooks
        .flatten()
        .map(|hook| hook.file_name().to_string_lossy().into_owned())
        .filter(|name| !name.ends_with(".sample"))
        .take(MAX_NAMED_HOOKS + 1)
        .map(|name| format!("{prefix}{}", name.escape_debug()))
        .collect();
    named.sort();
    if named.len() > MAX_NAMED_HOOKS {
        named.truncate(MAX_NAMED_HOOKS);
        named.push(format!("{prefix}…"));
    }
    found.extend(named);
}

/// The settings of the config file `path` (`file` in words) that make git run a program,
/// read as git reads it (`git_config`: a simpler reader would miss what git obeys), eight
/// at most; a file that is not a small one, or that git refuses, is said.
fn settings_named(path: &Path, file: &str, found: &mut Vec<String>) {
    let config = match crate::workspace::small_file(path, 1 << 20) {
        Some(config) => config,
        // Not a file of a size git writes (a pipe, a device, a link, megabytes): said, not
        // read.
        None if std::fs::symlink_metadata(path).is_ok() => {
            found.push(format!("a {file} that is not a small file"));
            return;
        }
        None => return,
    };
    let place = if file == "config" {
        String::new()
    } else {
        format!("{file}: ")
    };
    let mut named: Vec<String> = Vec::new();
    let mut more = false;
    let read = crate::git_config::read(&config, |name, value| {
        if !crate::git_config::runs_a_program(name, value) {
            return;
        }
        let name = format!("{place}{}", String::from_utf8_lossy(name).escape_debug());
        if named.contains(&name) {
            return;
        }
        if named.len() < MAX_NAMED_SETTINGS {
            named.push(name);
        } else {
            more = true;
        }
    });
    found.extend(named);
    if more {
        found.push(format!("{place}…"));
    }
    // git runs nothing there until the file is mended; what comes after is then obeyed.
    if let Err(refused) = read {
        found.push(format!(
            "a {file} git refuses from its line {} on (what follows runs once it is mended)",
            refused.line
        ));
    }
}

/// Hooks named at most, of a repository a command made.
const MAX_NAMED_HOOKS: usize = 8;

/// Settings named at most, of a repository a command made.
const MAX_NAMED_SETTINGS: usize = 8;

/// What holds the system's credentials, hidden from a sandboxed command that runs as root
/// (which reads them without any capability, as their owner): password hashes, the SSH
/// server's keys, TLS keys, Kerberos keys. Unless shown, as [`crate::CREDENTIALS`] are.
pub const SYSTEM_CREDENTIALS: &[&str] = &[
    "/etc/shadow",
    "/etc/shadow-",
    "/etc/gshadow",
    "/etc/gshadow-",
    "/etc/ssh/ssh_host_rsa_key",
    "/etc/ssh/ssh_host_ecdsa_key",
    "/etc/ssh/ssh_host_ed25519_key",
    "/etc/ssh/ssh_host_dsa_key",
    "/etc/ssl/private",
    "/etc/krb5.keytab",
];

/// A sandbox as the watcher of one command makes it.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Spec {
    /// The workspace's root, where the command may write.
    workspace: PathBuf,
    /// Other directories where it may write.
    writable: Vec<PathBuf>,
    /// Places in the workspace it may not change.
    protected: Vec<PathBuf>,
    /// Places it may not see (nor change), where they are there.
    #[serde(default)]
    hidden: Vec<PathBuf>,
    /// Whether it may not write in the workspace either.
    read_only: bool,
    /// Whether it may reach the network.
    network: bool,
}

/// Directories the command gets empty ones of its own in place of, each with its mode:
/// where the system's sockets are, and temporary files other programs share.
#[cfg(target_os = "linux")]
const COVERED: [(&str, &str); 3] = [("/tmp", "1777"), ("/dev/shm", "1777"), ("/run", "755")];

/// Devices a command may write to, wherever its files may not be.
#[cfg(target_os = "linux")]
const DEVICES: [&str; 5] = [
    "/dev/null",
    "/dev/zero",
    "/dev/full",
    "/dev/ptmx",
    "/dev/pts",
];

#[cfg(target_os = "linux")]
impl Spec {
    /// The sandbox this watcher was asked to make, if any: `Err` when the variable is
    /// there but does not say one (the command is then refused, not run without).
    pub(crate) fn asked() -> Option<Result<Spec, String>> {
        let value = std::env::var_os(SANDBOX_ENV)?;
        Some(
            value
                .to_str()
                .and_then(|text| serde_json::from_str(text).ok())
                .ok_or_else(|| format!("{SANDBOX_ENV} does not describe a sandbox")),
        )
    }

    /// Whether commands have a network namespace of their own.
    pub(crate) fn own_network(&self) -> bool {
        !self.network
    }

    /// In the watcher, once in the new mount (and network) namespace, before the
    /// namespace's init starts: the covered directories emptied (the workspace, or a
    /// writable directory, that lies beneath one put back in place), the protected places
    /// made read-only, and the loopback interface brought up.
    pub(crate) fn prepare(&self) -> Result<(), String> {
        use nix::mount::{MsFlags, mount};
        use std::os::fd::AsRawFd;
        let is_dir = |dir: &str| std::fs::symlink_metadata(dir).is_ok_and(|m| m.is_dir());
        let covered = |path: &Path| {
            COVERED
                .iter()
                .any(|(dir, _)| path.starts_with(dir) && is_dir(dir))
        };
        // Opened before the covering, put back after it.
        let mut kept = Vec::new();
        for dir in std::iter::once(&self.workspace).chain(&self.writable) {
            if covered(dir) {
                let file = std::fs::File::open(dir)
                    .map_err(|e| format!("cannot open {}: {e}", dir.display()))?;
                kept.push((dir, file));
            }
        }
        for (dir, mode) in COVERED {
            if !is_dir(dir) {
                continue;
            }
            mount(
                Some("tmpfs"),
                dir,
                Some("tmpfs"),
                MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
                Some(format!("mode={mode}").as_str()),
            )
            .map_err(|e| format!("cannot mount an empty {dir} for the command: {e}"))?;
        }
        for (dir, file) in kept {
            std::fs::create_dir_all(dir)
                .map_err(|e| format!("cannot make {} again: {e}", dir.display()))?;
            let source = format!("/proc/self/fd/{}", file.as_raw_fd());
            let flags = MsFlags::MS_BIND | MsFlags::MS_REC;
            mount(
                Some(source.as_str()),
                dir,
                None::<&str>,
                flags,
                None::<&str>,
            )
            .map_err(|e| format!("cannot put {} back in place: {e}", dir.display()))?;
        }
        // The workspace and every directory between it and a protected place are bound
        // onto themselves, outermost first: a mount point cannot be renamed or removed,
        // so the command cannot move a protected place away with its parent and make
        // another where it was (`mv config c2; mkdir config`).
        let mut pinned: Vec<&Path> = vec![self.workspace.as_path()];
        for place in &self.protected {
            let mut ancestors: Vec<&Path> = place
                .ancestors()
                .skip(1)
                .take_while(|dir| dir.starts_with(&self.workspace) && *dir != self.workspace)
                .collect();
            ancestors.reverse();
            pinned.extend(ancestors);
        }
        let mut seen = std::collections::HashSet::new();
        for dir in pinned {
            if seen.insert(dir) {
                let flags = MsFlags::MS_BIND | MsFlags::MS_REC;
                mount(Some(dir), dir, None::<&str>, flags, None::<&str>)
                    .map_err(|e| format!("cannot pin {} in place: {e}", dir.display()))?;
            }
        }
        for place in &self.protected {
            read_only(place)?;
        }
        // Read-only, the workspace is so as a whole, by its mount: whatever the rules on
        // writes say of a directory it lies in (`/tmp`, one of its own).
        if self.read_only {
            read_only(&self.workspace)?;
        }
        // Files are hidden behind an empty one made in a covered directory, of the
        // command's own, and unlinked there once bound: written through none of its
        // places (`/dev/null`'s would take writes and say nothing).
        let empty = COVERED
            .iter()
            .map(|(dir, _)| Path::new(dir))
            .find(|dir| is_dir(&dir.to_string_lossy()))
            .map(|dir| dir.join(".agent-loop-hidden"))
            .filter(|empty| {
                std::fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .open(empty)
                    .is_ok()
            });
        let hidden = self
            .hidden
            .iter()
            .try_for_each(|place| self.hide(place, empty.as_deref()));
        if let Some(empty) = &empty {
            let _ = std::fs::remove_file(empty);
        }
        hidden?;
        // The command starts in the workspace as mounted now: its `..` leads through the
        // covered directories, not to the system's beneath them.
        std::env::set_current_dir(&self.workspace)
            .map_err(|e| format!("cannot enter {}: {e}", self.workspace.display()))?;
        if self.own_network() {
            loopback_up()?;
        }
        Ok(())
    }

    /// Hides `place` from the command, where it is there (through any links) and holds
    /// neither the workspace nor a writable directory: a directory behind an empty
    /// read-only one, anything else behind an empty read-only file (`empty`, else
    /// `/dev/null`).
    fn hide(&self, place: &Path, empty: Option<&Path>) -> Result<(), String> {
        use nix::mount::{MsFlags, mount};
        let Ok(found) = place.canonicalize() else {
            // Not there, or not for this user to reach: nothing to read.
            return Ok(());
        };
        let needed = std::iter::once(&self.workspace)
            .chain(&self.writable)
            .any(|dir| dir.starts_with(&found));
        if needed {
            return Ok(());
        }
        let failed = |e: nix::Error| {
            format!(
                "cannot hide {} from the command: {e} (--sandbox-show leaves a home \
                 directory's credentials visible)",
                found.display()
            )
        };
        if found.is_dir() {
            let flags =
                MsFlags::MS_RDONLY | MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC;
            mount(
                Some("tmpfs"),
                &found,
                Some("tmpfs"),
                flags,
                Some("mode=755,size=4k,nr_inodes=1"),
            )
            .map_err(failed)
        } else {
            let empty = empty.unwrap_or(Path::new("/dev/null"));
            bind_read_only(empty, &found).map_err(failed)
        }
    }

    /// In the namespace's init, as the last thing before it starts the command: writes
    /// confined (Landlock) to the workspace, the writable directories, the covered ones
    /// and a few devices, and no privilege to gain. For this process and every process it
    /// starts, with no way back.
    pub(crate) fn confine(&self) -> Result<(), String> {
        use landlock::{
            ABI, AccessFs, Ruleset, RulesetAttr, RulesetCreatedAttr, RulesetStatus, Scope,
            path_beneath_rules,
        };
        let failed = |e: landlock::RulesetError| format!("cannot confine its writes: {e}");
        // Truncation (ABI 3, Linux 6.2) is confined where the kernel can; writes, creation,
        // removal and renames from ABI 1 (Linux 5.13) on.
        let abi = ABI::V3;
        let handled = AccessFs::from_write(abi);
        // No device nodes, even in the workspace (a node for a disk is a way to it).
        let write = handled & !(AccessFs::MakeChar | AccessFs::MakeBlock);
        let dirs = std::iter::once(&self.workspace)
            .chain(&self.writable)
            .map(PathBuf::as_path)
            .chain(COVERED.iter().map(|(dir, _)| Path::new(dir)));
        let status = Ruleset::default()
            .handle_access(handled)
            .map_err(failed)?
            // Nor a socket of the abstract namespace made outside (the network's own
            // keeps them out without network; with it, X's and D-Bus's are there), nor a
            // signal to a process outside: where the kernel can (ABI 6, Linux 6.12).
            .scope(Scope::AbstractUnixSocket | Scope::Signal)
            .map_err(failed)?
            .create()
            .map_err(failed)?
            .add_rules(path_beneath_rules(dirs, write))
            .map_err(failed)?
            .add_rules(path_beneath_rules(
                DEVICES,
                AccessFs::from_file(abi) & write,
            ))
            .map_err(failed)?
            .restrict_self()
            .map_err(failed)?;
        match status.ruleset {
            RulesetStatus::NotEnforced => Err("cannot confine its writes: this kernel has no \
                 Landlock (Linux 5.13 or later, with landlock among its security modules)"
                .to_owned()),
            RulesetStatus::FullyEnforced | RulesetStatus::PartiallyEnforced => Ok(()),
        }
    }
}

/// Makes `place` read-only in this mount namespace: bound onto itself, then the binding
/// remounted read-only, with the flags the system's mount has (a user namespace may not
/// drop them).
#[cfg(target_os = "linux")]
fn read_only(place: &Path) -> Result<(), String> {
    bind_read_only(place, place)
        .map_err(|e| format!("cannot make {} read-only: {e}", place.display()))
}

/// Binds `source` onto `place`, read-only, with the flags `source`'s mount has.
#[cfg(target_os = "linux")]
fn bind_read_only(source: &Path, place: &Path) -> Result<(), nix::Error> {
    use nix::mount::{MsFlags, mount};
    use nix::sys::statvfs::{FsFlags, statvfs};
    let recursive = MsFlags::MS_BIND | MsFlags::MS_REC;
    mount(Some(source), place, None::<&str>, recursive, None::<&str>)?;
    let has = statvfs(place)?.flags();
    let mut flags = MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY;
    for (kept, flag) in [
        (FsFlags::ST_NOSUID, MsFlags::MS_NOSUID),
        (FsFlags::ST_NODEV, MsFlags::MS_NODEV),
        (FsFlags::ST_NOEXEC, MsFlags::MS_NOEXEC),
        (FsFlags::ST_NOATIME, MsFlags::MS_NOATIME),
        (FsFlags::ST_NODIRATIME, MsFlags::MS_NODIRATIME),
        (FsFlags::ST_RELATIME, MsFlags::MS_RELATIME),
    ] {
        if has.contains(kept) {
            flags |= flag;
        }
    }
    mount(None::<&str>, place, None::<&str>, flags, None::<&str>)
}

/// Brings up the loopback interface of the network namespace this process is in (a new
/// one has it down): one `RTM_NEWLINK` request over rtnetlink, its answer read.
#[cfg(target_os = "linux")]
fn loopback_up() -> Result<(), String> {
    use nix::sys::socket::{
        AddressFamily, MsgFlags, NetlinkAddr, SockFlag, SockProtocol, SockType, recv, sendto,
        socket,
    };
    use std::os::fd::AsRawFd;
    let failed = |e: nix::Error| format!("cannot bring up its loopback interface: {e}");
    let socket = socket(
        AddressFamily::Netlink,
        SockType::Raw,
        SockFlag::SOCK_CLOEXEC,
        SockProtocol::NetlinkRoute,
    )
    .map_err(failed)?;
    sendto(
        socket.as_raw_fd(),
        &loopback_up_request(),
        &NetlinkAddr::new(0, 0),
        MsgFlags::empty(),
    )
    .map_err(failed)?;
    let mut answer = [0u8; 512];
    let read = recv(socket.as_raw_fd(), &mut answer, MsgFlags::empty()).map_err(failed)?;
    match acknowledged(&answer[..read]) {
        Some(0) => Ok(()),
        Some(errno) => Err(failed(nix::Error::from_raw(-errno))),
        None => Err(
            "cannot bring up its loopback interface: the kernel's answer was not \
                     an acknowledgement"
                .to_owned(),
        ),
    }
}

/// `RTM_NEWLINK` for interface 1 (every network namespace's loopback) with `IFF_UP` set,
/// asking for an acknowledgement: a `nlmsghdr` and an `ifinfomsg`, in this machine's
/// byte order.
#[cfg(target_os = "linux")]
fn loopback_up_request() -> Vec<u8> {
    const RTM_NEWLINK: u16 = 16;
    const NLM_F_REQUEST: u16 = 1;
    const NLM_F_ACK: u16 = 4;
    const IFF_UP: u32 = 1;
    const LOOPBACK: i32 = 1;
    let mut message = Vec::with_capacity(32);
    message.extend(32u32.to_ne_bytes());
    message.extend(RTM_NEWLINK.to_ne_bytes());
    message.extend((NLM_F_REQUEST | NLM_F_ACK).to_ne_bytes());
    message.extend(1u32.to_ne_bytes()); // sequence number
    message.extend(0u32.to_ne_bytes()); // port id: the kernel's
    message.extend([0u8, 0u8]); // family (unspecified), padding
    message.extend(0u16.to_ne_bytes()); // device type
    message.extend(LOOPBACK.to_ne_bytes());
    message.extend(IFF_UP.to_ne_bytes()); // flags
    message.extend(IFF_UP.to_ne_bytes()); // which flags change
    message
}

/// The error number of a netlink acknowledgement (`NLMSG_ERROR`; 0 for success, a
/// negated `errno` otherwise), if `answer` begins with one.
#[cfg(target_os = "linux")]
fn acknowledged(answer: &[u8]) -> Option<i32> {
    const NLMSG_ERROR: u16 = 2;
    let kind = u16::from_ne_bytes(answer.get(4..6)?.try_into().ok()?);
    let errno = i32::from_ne_bytes(answer.get(16..20)?.try_into().ok()?);
    (kind == NLMSG_ERROR).then_some(errno)
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    #[test]
    fn the_model_is_told_what_its_commands_may_not_see() {
        let told = Sandbox::new()
            .showing("/home/p/.ssh")
            .hiding("/srv/secrets")
            .told();
        assert!(
            told.ends_with(
                "; the home directory's keys and tokens (.ssh, .aws, .netrc and the like) but \
                 those in /home/p/.ssh, /srv/secrets are hidden from them (seen empty)."
            ),
            "{told}"
        );
        let told = Sandbox::new().told();
        assert!(
            told.contains("no network beyond their own 127.0.0.1; the home"),
            "{told}"
        );
        // What the workspace keeps from them, as the walk finds it (not only a `.git`).
        assert!(
            told.contains(
                "(git's own files (every .git, bare repository, hooks directory a repository \
                 names and config file it includes) and agent's own files are read-only)"
            ),
            "{told}"
        );
    }

    /// More places than a command's watcher can be told of (their paths, long) are refused
    /// in words, before the command would fail to start (`Argument list too long`).
    #[test]
    fn a_sandbox_too_long_to_describe_is_refused_plainly() {
        let tmp = tempfile::tempdir().unwrap();
        let long = "d".repeat(200);
        for i in 0..700 {
            std::fs::create_dir_all(tmp.path().join(format!("{long}{i}/.git"))).unwrap();
        }
        let workspace = Workspace::new(tmp.path())
            .unwrap()
            .protect_everywhere(".git", "a git directory");
        let err = Sandbox::new().spec(&workspace).unwrap_err();
        assert!(err.contains("keeps 700 git directories"), "{err}");
        assert!(
            err.contains("more than a command's watcher can be told of"),
            "{err}"
        );
        assert!(!err.contains('\n'), "{err}");
        std::fs::remove_dir_all(tmp.path().join(format!("{long}0"))).unwrap();
        for i in 1..400 {
            std::fs::remove_dir_all(tmp.path().join(format!("{long}{i}"))).unwrap();
        }
        let spec = Sandbox::new().spec(&workspace).unwrap();
        assert!(spec.len() <= MAX_SPEC_BYTES, "{}", spec.len());
    }

    /// What makes git run programs in a repository: not what `git init` or `git clone`
    /// writes, but hooks, settings that name a program or include a file, and aliases that
    /// run a shell command; a `.git` file says where it points.
    #[test]
    fn a_repository_s_hooks_and_program_settings_are_named() {
        let tmp = tempfile::tempdir().unwrap();
        let git = tmp.path().join(".git");
        std::fs::create_dir_all(git.join("hooks")).unwrap();
        std::fs::write(git.join("hooks/pre-commit.sample"), "#!/bin/sh\n").unwrap();
        let cloned = "[core]\n\trepositoryformatversion = 0\n\tbare = false\n\
                      [remote \"origin\"]\n\turl = https://example.invalid/r.git\n\
                      \tfetch = +refs/heads/*:refs/remotes/origin/*\n\
                      [branch \"main\"]\n\tremote = origin\n\tmerge = refs/heads/main\n\
                      [alias]\n\tst = status\n";
        std::fs::write(git.join("config"), cloned).unwrap();
        assert!(runs_programs(&git).is_empty(), "{:?}", runs_programs(&git));
        std::fs::write(git.join("hooks/pre-commit"), "#!/bin/sh\nevil\n").unwrap();
        let planted = format!(
            "{cloned}[core]\n\tfsmonitor = evil\n  SSHCommand=evil\n\
             [filter \"x\"]\n\tclean = evil\n[alias]\n\tgo = \"!evil\"\n\
             [include]\n\tpath = ../elsewhere\n[pager]\n\tlog = evil\n"
        );
        std::fs::write(git.join("config"), planted).unwrap();
        assert_eq!(
            runs_programs(&git),
            [
                "hooks/pre-commit",
                "core.fsmonitor",
                "core.sshcommand",
                "filter.x.clean",
                "alias.go",
                "include.path",
                "pager.log"
            ]
        );
        // Read as git reads it: a setting on its header's line, after a lone carriage
        // return; eight named at most; a file git refuses is said.
        std::fs::write(
            git.join("config"),
            "[core] fsmonitor = evil\n[a]\rpager = x\n\tsshCommand = evil\n",
        )
        .unwrap();
        assert_eq!(
            runs_programs(&git),
            [
                "hooks/pre-commit",
                "core.fsmonitor",
                "a.pager",
                "a.sshcommand"
            ]
        );
        std::fs::remove_file(git.join("hooks/pre-commit")).unwrap();
        let many: String = (0..20).map(|i| format!("[s{i}]\n\tcmd = evil\n")).collect();
        std::fs::write(git.join("config"), &many).unwrap();
        let named = runs_programs(&git);
        assert_eq!(named.len(), 9, "{named:?}");
        assert_eq!(named[7..], ["s7.cmd", "…"]);
        std::fs::write(git.join("config"), "[core]\n\tbare = false\n\t=\n").unwrap();
        assert_eq!(
            runs_programs(&git),
            ["a config git refuses from its line 3 on (what follows runs once it is mended)"]
        );
        // What git reads besides: a worktree's config, another directory's.
        std::fs::write(git.join("config"), "[core]\n\tbare = false\n").unwrap();
        std::fs::write(git.join("config.worktree"), "[core]\n\tfsmonitor = evil\n").unwrap();
        std::fs::write(git.join("commondir"), "../../elsewhere\n").unwrap();
        assert_eq!(
            runs_programs(&git),
            [
                "config.worktree: core.fsmonitor",
                "a commondir that says \"../../elsewhere\""
            ]
        );
        std::fs::create_dir(tmp.path().join("sub")).unwrap();
        let file = tmp.path().join("sub/.git");
        std::fs::write(&file, "gitdir: ../elsewhere\n").unwrap();
        assert_eq!(
            runs_programs(&file),
            ["a .git file that says \"gitdir: ../elsewhere\""]
        );
        // A config that is a pipe is not opened (the read would wait for ever).
        let piped = tmp.path().join("piped/.git");
        std::fs::create_dir_all(&piped).unwrap();
        nix::unistd::mkfifo(&piped.join("config"), nix::sys::stat::Mode::S_IRWXU).unwrap();
        assert_eq!(runs_programs(&piped), ["a config that is not a small file"]);
        // A directory a `core.hooksPath` names: its hooks.
        let husky = tmp.path().join(".husky/_");
        std::fs::create_dir_all(&husky).unwrap();
        std::fs::write(husky.join("pre-commit"), "evil\n").unwrap();
        std::fs::write(husky.join("h"), "evil\n").unwrap();
        assert_eq!(runs_programs(&husky), ["h", "pre-commit"]);
    }

    #[test]
    fn the_loopback_request_is_a_whole_netlink_message() {
        let request = loopback_up_request();
        assert_eq!(request.len(), 32);
        let length = u32::from_ne_bytes(request[0..4].try_into().unwrap());
        assert_eq!(
            length as usize,
            request.len(),
            "the header counts the message"
        );
        let index = i32::from_ne_bytes(request[20..24].try_into().unwrap());
        assert_eq!(index, 1, "the loopback interface");
    }

    #[test]
    fn only_an_acknowledgement_is_read_as_one() {
        let mut answer = vec![0u8; 36];
        answer[4..6].copy_from_slice(&2u16.to_ne_bytes());
        answer[16..20].copy_from_slice(&(-1i32).to_ne_bytes());
        assert_eq!(acknowledged(&answer), Some(-1));
        answer[4..6].copy_from_slice(&3u16.to_ne_bytes());
        assert_eq!(acknowledged(&answer), None, "NLMSG_DONE is not an answer");
        assert_eq!(acknowledged(&answer[..10]), None, "cut short");
    }
}
