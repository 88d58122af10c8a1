//! Project files are not trusted blindly (CONTRACT §5).
//!
//! A cloned repository can ship an `agent.toml` or a workspace `.mcp.json` that starts
//! commands (MCP servers, hooks), widens the policy (`allow` rules, another `workspace`) or
//! sends the API key elsewhere (`base_url`), or lets a run cost more than the defaults do
//! (more steps, tool calls or retries, sub-agents, extended thinking). What such a file
//! brings is used only once a person trusted the file's current content: `agent trust`,
//! or a question on a terminal. Trust is kept in the user's config directory, keyed by
//! the file's absolute path and the SHA-256 of its content, so a changed file must be
//! trusted again. Files named on the command line (`--config`, `--mcp-config`) are
//! trusted: the person chose them. The MCP file an `agent.toml` found in the workspace
//! names is a project file of its own. Each file is read once ([`read_once`]), and judged
//! on the bytes that are parsed and used.
//!
//! The answer check commands a run recorded are commands too, written by whoever wrote
//! the store: they run on continuing a run only where it was started (remembered here by
//! run id and the commands' SHA-256) or once a person trusted them (`agent trust --run`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use agent_core::sha256_hex;
use serde::{Deserialize, Serialize};

/// The file in the config directory that holds the trusted hashes.
const FILE: &str = "trusted.json";

/// Where trust is kept: `$AGENT_CONFIG_DIR`, else `$XDG_CONFIG_HOME/agent-loop`, else
/// `$HOME/.config/agent-loop`.
pub fn config_dir() -> Result<PathBuf, String> {
    let var = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty());
    if let Some(dir) = var("AGENT_CONFIG_DIR") {
        return Ok(PathBuf::from(dir));
    }
    if let Some(dir) = var("XDG_CONFIG_HOME") {
        return Ok(PathBuf::from(dir).join("agent-loop"));
    }
    if let Some(home) = var("HOME") {
        return Ok(PathBuf::from(home).join(".config/agent-loop"));
    }
    Err(
        "cannot tell where your config directory is; set HOME, XDG_CONFIG_HOME or \
         AGENT_CONFIG_DIR"
            .to_owned(),
    )
}

/// The trusted files and their content hashes, and the runs whose answer check commands
/// may run.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct Trusted {
    /// Absolute path → SHA-256 of the content trusted.
    files: BTreeMap<String, String>,
    /// Run id → SHA-256 of the answer check commands it recorded, for the runs started
    /// here (or trusted with `agent trust --run`): the last [`MAX_TRUSTED_RUNS`].
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    runs: BTreeMap<String, TrustedRun>,
}

/// How many runs' answer check commands are remembered: the one trusted longest ago is
/// forgotten first, and continuing it then asks again. The trust file is read by every
/// command that starts or continues a run, so it stays small (about 100 KB at most).
pub const MAX_TRUSTED_RUNS: usize = 1_000;

/// A run whose answer check commands may run: their SHA-256, and when it was trusted, as
/// a count that grows with each run trusted (no clock: only the order matters).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "RunEntry")]
struct TrustedRun {
    checks: String,
    order: u64,
}

/// A [`TrustedRun`] as the trust file holds it: the hash alone in files written before
/// runs were counted (the oldest then).
#[derive(Deserialize)]
#[serde(untagged)]
enum RunEntry {
    Counted { checks: String, order: u64 },
    Hash(String),
}

impl From<RunEntry> for TrustedRun {
    fn from(entry: RunEntry) -> Self {
        match entry {
            RunEntry::Counted { checks, order } => TrustedRun { checks, order },
            RunEntry::Hash(checks) => TrustedRun { checks, order: 0 },
        }
    }
}

/// The SHA-256 of a run's answer check commands, in order.
fn checks_hash(checks: &[String]) -> String {
    sha256_hex(serde_json::to_string(checks).unwrap_or_default().as_bytes())
}

/// A project file and what it brings that needs trust.
#[derive(Debug, Clone)]
pub struct ProjectFile {
    /// Its absolute path.
    pub path: PathBuf,
    /// The SHA-256 of its content now.
    pub hash: String,
    /// What in it needs trust, in words (`allow rules shell, git*`, `MCP server github`).
    pub brings: Vec<String>,
}

impl ProjectFile {
    /// Reads `path` now ([`read_once`]); `brings` is filled by the caller.
    pub fn read(path: &Path) -> Result<(ProjectFile, Vec<u8>), String> {
        let bytes = read_once(path, false)?;
        Ok((ProjectFile::of(path, &bytes)?, bytes))
    }

    /// The file at `path` as `bytes` show it: the bytes that were read and parsed, so
    /// that what is judged is what is used (the file may change after it was read).
    pub fn of(path: &Path, bytes: &[u8]) -> Result<ProjectFile, String> {
        Ok(ProjectFile {
            path: std::path::absolute(path).map_err(|e| format!("{}: {e}", path.display()))?,
            hash: sha256_hex(bytes),
            brings: Vec::new(),
        })
    }
}

/// The most bytes a project file may hold (an `agent.toml`, an MCP configuration): such a
/// file is a few kilobytes, it is read whole, and a trust question lists all it brings.
pub const MAX_PROJECT_FILE: u64 = 1 << 20;

/// The content of a project file, read once by whoever judges and uses it. At most
/// [`MAX_PROJECT_FILE`] bytes. A file found in the workspace (`named` false) must be a
/// regular file: a FIFO or a device there, under a name `agent` looks for, would make
/// every command in that directory wait, or read without end. One the person named
/// (`--config <(...)`) may be a pipe.
pub fn read_once(path: &Path, named: bool) -> Result<Vec<u8>, String> {
    use std::io::Read as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let at = path.display();
    let mut options = std::fs::OpenOptions::new();
    options.read(true);
    if !named {
        // Opening a FIFO to read waits for a writer; with O_NONBLOCK it returns, and the
        // type is then told from the open file, not from a look at the path before it.
        let nonblock = rustix::fs::OFlags::NONBLOCK.bits();
        options.custom_flags(i32::try_from(nonblock).unwrap_or(0));
    }
    let file = options.open(path).map_err(|e| format!("{at}: {e}"))?;
    if !named {
        let meta = file.metadata().map_err(|e| format!("{at}: {e}"))?;
        if !meta.is_file() {
            return Err(format!(
                "{at} is not a regular file; agent reads a project file only when it is one \
                 (name it with --config or --mcp-config to read it as it is)"
            ));
        }
    }
    let mut bytes = Vec::new();
    file.take(MAX_PROJECT_FILE + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("{at}: {e}"))?;
    if bytes.len() as u64 > MAX_PROJECT_FILE {
        return Err(format!(
            "{at} is larger than {} KiB; a settings or MCP file is a few kilobytes: \
             shorten it",
            MAX_PROJECT_FILE >> 10
        ));
    }
    Ok(bytes)
}

/// Refuses a file that is neither an `agent.toml` nor an MCP configuration (`.mcp.json`):
/// trusting is for the files that can start commands, and a mistyped path (`agent trust
/// .env`) is not trusted silently. Either kind may have any name (`--config`,
/// `--mcp-config`); the error names the problem the file's extension suggests.
pub fn check_kind(path: &Path, bytes: &[u8]) -> Result<(), String> {
    let text = String::from_utf8_lossy(bytes);
    let Err(as_toml) = crate::config::parse(&text) else {
        return Ok(());
    };
    let as_json = serde_json::from_str::<serde_json::Value>(&text)
        .map_err(|e| e.to_string())
        .and_then(|value| match value.get("mcpServers") {
            Some(_) => serde_json::from_value::<agent_tools::mcp::McpConfig>(value)
                .map(drop)
                .map_err(|e| e.to_string()),
            None => Err("it has no \"mcpServers\"".to_owned()),
        });
    let Err(as_json) = as_json else {
        return Ok(());
    };
    let why = if path.extension().is_some_and(|e| e == "json") {
        format!("as JSON: {as_json}")
    } else {
        format!("as TOML: {}", as_toml.trim_start_matches(':').trim_start())
    };
    Err(format!(
        "nothing trusted: {} is neither an agent.toml nor a .mcp.json ({why})",
        path.display()
    ))
}

impl Trusted {
    fn path() -> Result<PathBuf, String> {
        Ok(config_dir()?.join(FILE))
    }

    /// The trust file, or nothing trusted when there is none yet.
    pub fn load() -> Result<Trusted, String> {
        Trusted::load_from(&Trusted::path()?)
    }

    /// The trust file at `path`, or nothing trusted when there is none yet.
    fn load_from(path: &Path) -> Result<Trusted, String> {
        match std::fs::read_to_string(path) {
            Ok(text) => serde_json::from_str(&text).map_err(|e| {
                format!(
                    "{} is damaged ({e}); delete it and trust your projects again",
                    path.display()
                )
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Trusted::default()),
            Err(e) => Err(format!("{}: {e}", path.display())),
        }
    }

    /// Whether this file, with this content, was trusted.
    pub fn trusts(&self, file: &ProjectFile) -> bool {
        self.files
            .get(&file.path.to_string_lossy().into_owned())
            .is_some_and(|hash| *hash == file.hash)
    }

    /// Trusts the file's current content and saves (atomically).
    pub fn trust(&mut self, file: &ProjectFile) -> Result<(), String> {
        self.update(|trusted| {
            trusted
                .files
                .insert(file.path.to_string_lossy().into_owned(), file.hash.clone());
        })
    }

    /// Whether the run `run_id`'s answer check commands, as `checks`, may run: it was
    /// started here with them, or a person trusted them.
    pub fn trusts_checks(&self, run_id: &str, checks: &[String]) -> bool {
        self.runs
            .get(run_id)
            .is_some_and(|run| run.checks == checks_hash(checks))
    }

    /// Lets the run `run_id`'s answer check commands, as `checks`, run, and saves.
    pub fn trust_checks(&mut self, run_id: &str, checks: &[String]) -> Result<(), String> {
        self.update(|trusted| trusted.remember_checks(run_id, checks))
    }

    /// Lets the run `run_id`'s answer check commands, as `checks`, run, as the run trusted
    /// last, and forgets the one trusted longest ago beyond [`MAX_TRUSTED_RUNS`].
    fn remember_checks(&mut self, run_id: &str, checks: &[String]) {
        let order = self
            .runs
            .values()
            .map(|run| run.order + 1)
            .max()
            .unwrap_or(1);
        let checks = checks_hash(checks);
        self.runs
            .insert(run_id.to_owned(), TrustedRun { checks, order });
        while self.runs.len() > MAX_TRUSTED_RUNS {
            let oldest = self
                .runs
                .iter()
                .min_by_key(|(id, run)| (run.order, id.as_str()))
                .map(|(id, _)| id.clone());
            match oldest {
                Some(id) => self.runs.remove(&id),
                None => break,
            };
        }
    }

    /// Makes `change` to the trust file, and to this copy, which becomes what was saved
    /// ([`Trusted::update_at`]).
    fn update(&mut self, change: impl FnOnce(&mut Trusted)) -> Result<(), String> {
        *self = Trusted::update_at(&Trusted::path()?, change)?;
        Ok(())
    }

    /// Makes `change` to the trust file at `path` as it is now, not as this process read
    /// it earlier: any number of `agent` processes may trust files and remember their runs
    /// at once, and none may lose what another saved. Under an exclusive lock on a file
    /// beside it, the file is read, changed and replaced (atomically, so a reader without
    /// the lock sees the old file or the new). Returns what was saved.
    fn update_at(path: &Path, change: impl FnOnce(&mut Trusted)) -> Result<Trusted, String> {
        let dir = path.parent().unwrap_or(Path::new("."));
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let lock_path = dir.join(format!(".{FILE}.lock"));
        let lock = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(|e| format!("{}: {e}", lock_path.display()))?;
        loop {
            match rustix::fs::flock(&lock, rustix::fs::FlockOperation::LockExclusive) {
                Err(rustix::io::Errno::INTR) => {}
                locked => break locked,
            }
        }
        .map_err(|e| format!("cannot lock {}: {e}", lock_path.display()))?;
        let mut now = Trusted::load_from(path)?;
        change(&mut now);
        let text = serde_json::to_string_pretty(&now).map_err(|e| e.to_string())?;
        let tmp = dir.join(format!(".{FILE}.{}", std::process::id()));
        std::fs::write(&tmp, text).map_err(|e| format!("{}: {e}", tmp.display()))?;
        std::fs::rename(&tmp, path).map_err(|e| format!("{}: {e}", path.display()))?;
        // The lock goes with its file, closed here.
        drop(lock);
        Ok(now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The trust file remembers the last [`MAX_TRUSTED_RUNS`] runs' checks: the run
    /// trusted longest ago is forgotten first, a run trusted again counts as new, and a
    /// file written before runs were counted is read, its runs as the oldest.
    #[test]
    fn the_runs_whose_checks_are_trusted_are_the_last_ones_trusted() {
        let checks = |i: usize| vec![format!("test -s answer-{i}")];
        let mut trusted: Trusted = serde_json::from_value(serde_json::json!({
            "files": {},
            "runs": {"zz-old": checks_hash(&checks(0))}
        }))
        .unwrap();
        assert!(trusted.trusts_checks("zz-old", &checks(0)));
        assert!(!trusted.trusts_checks("zz-old", &checks(1)));
        trusted.remember_checks("run-0", &checks(0));
        // Trusted again: now the newest but one, so it outlives run-1 .. run-N.
        trusted.remember_checks("run-1", &checks(1));
        trusted.remember_checks("run-0", &checks(0));
        for i in 2..=MAX_TRUSTED_RUNS {
            trusted.remember_checks(&format!("run-{i}"), &checks(i));
        }
        assert_eq!(trusted.runs.len(), MAX_TRUSTED_RUNS);
        assert!(!trusted.trusts_checks("zz-old", &checks(0)), "counted last");
        assert!(
            !trusted.trusts_checks("run-1", &checks(1)),
            "trusted longest ago"
        );
        assert!(trusted.trusts_checks("run-0", &checks(0)));
        let last = MAX_TRUSTED_RUNS;
        assert!(trusted.trusts_checks(&format!("run-{last}"), &checks(last)));
        // What is saved is read back the same.
        let text = serde_json::to_string(&trusted).unwrap();
        let again: Trusted = serde_json::from_str(&text).unwrap();
        assert_eq!(again.runs, trusted.runs);
    }

    /// Many `agent` processes may save the trust file at once (runs started side by side,
    /// each remembering its checks): each change is made to the file as it is then, so
    /// none is lost. Threads stand for the processes here: each opens the lock file
    /// itself, as a process does.
    #[test]
    fn changes_saved_at_once_are_all_kept() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config").join(FILE);
        let (threads, each) = (8, 25);
        std::thread::scope(|scope| {
            for t in 0..threads {
                let path = &path;
                scope.spawn(move || {
                    for i in 0..each {
                        let run = format!("run-{t}-{i}");
                        let checks = vec![format!("check {t} {i}")];
                        let saved = Trusted::update_at(path, |trusted| {
                            trusted.remember_checks(&run, &checks);
                        })
                        .unwrap();
                        assert!(saved.trusts_checks(&run, &checks));
                    }
                });
            }
        });
        let trusted = Trusted::load_from(&path).unwrap();
        assert_eq!(trusted.runs.len(), threads * each);
        for t in 0..threads {
            for i in 0..each {
                let checks = vec![format!("check {t} {i}")];
                assert!(trusted.trusts_checks(&format!("run-{t}-{i}"), &checks));
            }
        }
    }
}
