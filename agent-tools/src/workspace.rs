//! Confinement of file and process tools to the workspace root.
//!
//! Two layers, so that no spelling, link or race gets a tool out of the workspace:
//!
//! - [`Workspace::resolve`] turns a path the model gave into the workspace-relative path a
//!   tool would really touch (`.`, `..`, repeated slashes, an absolute path inside the
//!   workspace and symlinks resolved, the way the kernel would). Policy rules and hooks
//!   judge that path, so every alias of a file gets the same verdict.
//! - Every file operation then goes through a directory capability (`cap-std`): opens are
//!   resolved beneath the workspace directory handle, so a directory swapped for a link
//!   between the check and the use is refused, not followed. On Linux an open goes
//!   through no symlink at all (`openat2` with `RESOLVE_NO_SYMLINKS`): a resolved path has
//!   none, so a link on it now, even one that stays inside the workspace, was made after
//!   the path was judged and is refused too. Writes go to a fresh
//!   temporary file (`O_TMPFILE`, or an exclusive random name) renamed into place: a planted
//!   link is never written through.

use std::collections::VecDeque;
use std::ffi::{OsStr, OsString};
use std::io::{self, Write};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use agent_core::{ErrorKind, ToolError};
use cap_std::ambient_authority;
use cap_std::fs::Dir;

/// Symlinks followed while resolving one path, at most (as Linux's `MAXSYMLINKS`).
const MAX_LINKS: usize = 40;

/// Whether git takes `dir` for a repository's own directory, as its `is_git_directory`
/// does: a `HEAD` that is a link into `refs/`, or a file that names a ref (`ref: refs/…`)
/// or a commit (40 hexadecimal digits at least), beside `objects` and `refs` (or a
/// `commondir` that says where they are). A `HEAD` that is no regular file nor link (a
/// pipe) is not opened.
pub(crate) fn is_git_directory(dir: &Path) -> bool {
    use std::io::Read as _;
    let head = dir.join("HEAD");
    let Ok(meta) = std::fs::symlink_metadata(&head) else {
        return false;
    };
    let names = if meta.is_symlink() {
        std::fs::read_link(&head).is_ok_and(|to| to.as_os_str().as_bytes().starts_with(b"refs/"))
    } else if meta.is_file() {
        let mut said = Vec::new();
        std::fs::File::open(&head)
            .and_then(|file| file.take(255).read_to_end(&mut said))
            .is_ok()
            && names_a_ref_or_commit(&said)
    } else {
        false
    };
    names
        && (dir.join("commondir").exists()
            || (dir.join("objects").exists() && dir.join("refs").exists()))
}

/// The bytes of `path` when it is a regular file of at most `most` bytes (never opened
/// otherwise: a pipe a command left there would keep the read waiting).
pub(crate) fn small_file(path: &Path, most: u64) -> Option<Vec<u8>> {
    use std::io::Read as _;
    let meta = std::fs::metadata(path).ok()?;
    if !meta.is_file() || meta.len() > most {
        return None;
    }
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .ok()?
        .take(most)
        .read_to_end(&mut bytes)
        .ok()?;
    Some(bytes)
}

/// The configs of git's that apply to every repository of this user: the system's
/// (`/etc/gitconfig`, or `$GIT_CONFIG_SYSTEM`) and the person's (`$XDG_CONFIG_HOME/git/config`,
/// `~/.gitconfig`, or `$GIT_CONFIG_GLOBAL`), all of them, whichever git would read.
fn outer_git_configs() -> Vec<PathBuf> {
    let home = std::env::var_os("HOME").map(PathBuf::from);
    let xdg = std::env::var_os("XDG_CONFIG_HOME")
        .map(PathBuf::from)
        .or_else(|| home.as_ref().map(|home| home.join(".config")));
    let mut files = vec![PathBuf::from("/etc/gitconfig")];
    files.extend(xdg.map(|dir| dir.join("git/config")));
    files.extend(home.map(|home| home.join(".gitconfig")));
    for named in ["GIT_CONFIG_SYSTEM", "GIT_CONFIG_GLOBAL"] {
        files.extend(std::env::var_os(named).map(PathBuf::from));
    }
    files
}

/// A path a config gives (`include.path`), as git takes it: `~/` from the home directory,
/// a relative one from `dir`.
fn config_path(value: &[u8], dir: &Path) -> Option<PathBuf> {
    Some(match value.strip_prefix(b"~/") {
        Some(rest) => PathBuf::from(std::env::var_os("HOME")?).join(OsStr::from_bytes(rest)),
        None => dir.join(OsStr::from_bytes(value)),
    })
}

/// The places git may run the hooks of a repository from, where a config names one with
/// `core.hooksPath` (husky's `.husky/_`, which is ignored by git, so that what is written
/// there shows nowhere): each of `values` (all of them, not only the one git would take:
/// which that is depends on the environment git runs in), `~/` taken as the home
/// directory and a relative path from `top` (the root of its work tree, or the git
/// directory of a bare repository), where git runs hooks.
fn hooks_paths<'a>(top: &Path, values: impl Iterator<Item = &'a Vec<u8>>) -> Vec<PathBuf> {
    values.filter_map(|value| config_path(value, top)).collect()
}

/// A file's identity, size and times: what a look at it tells of whether it changed.
#[derive(Clone, Copy, PartialEq, Eq)]
struct FileStamp {
    dev: u64,
    ino: u64,
    len: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

impl FileStamp {
    /// The stamp of `path`, when it is a regular file.
    fn of(path: &Path) -> Option<FileStamp> {
        use std::os::unix::fs::MetadataExt as _;
        let meta = std::fs::metadata(path).ok().filter(|m| m.is_file())?;
        Some(FileStamp {
            dev: meta.dev(),
            ino: meta.ino(),
            len: meta.len(),
            mtime: (meta.mtime(), meta.mtime_nsec()),
            ctime: (meta.ctime(), meta.ctime_nsec()),
        })
    }
}

/// What a git config file says that matters here, as last read, with its stamp.
struct ConfigRead {
    stamp: Option<FileStamp>,
    /// Its `core.hooksPath` values, as written.
    hooks: Vec<Vec<u8>>,
    /// The files it has git read as config too (`include.path`, and every
    /// `includeIf.*.path` whatever its condition), a relative one taken from its
    /// directory.
    includes: Vec<PathBuf>,
    /// Whether it has git read `config.worktree` too (`extensions.worktreeConfig`).
    reads_worktree: bool,
}

impl ConfigRead {
    /// Reads `path` (up to 1 MiB, as git reads it), whose stamp is `stamp`.
    fn of(path: &Path, stamp: Option<FileStamp>) -> ConfigRead {
        let mut read = ConfigRead {
            stamp,
            hooks: Vec::new(),
            includes: Vec::new(),
            reads_worktree: false,
        };
        let Some(bytes) = stamp.and_then(|_| small_file(path, 1 << 20)) else {
            return read;
        };
        let dir = path.parent().unwrap_or(Path::new("/"));
        let _ = crate::git_config::read(&bytes, |name, value| {
            let section = name.split(|&b| b == b'.').next().unwrap_or_default();
            let key = name.rsplit(|&b| b == b'.').next().unwrap_or_default();
            let conditional = section == b"includeif" && key == b"path" && name.len() > 15;
            match (name, value) {
                (b"core.hookspath", Some(value)) => read.hooks.push(value.to_vec()),
                (b"include.path", Some(value)) => read.includes.extend(config_path(value, dir)),
                (_, Some(value)) if conditional => read.includes.extend(config_path(value, dir)),
                (b"extensions.worktreeconfig", value) => read.reads_worktree = git_true(value),
                _ => {}
            }
        });
        read
    }
}

/// What some git config files say, together: every `core.hooksPath` and every file they
/// include.
#[derive(Default)]
struct Gathered {
    hooks: Vec<Vec<u8>>,
    includes: Vec<PathBuf>,
}

/// What git config files said when last read, by path, with their stamps: a look before
/// each sandboxed command (and after it) reads again only a file that changed, a `stat`
/// each.
#[derive(Default)]
struct ConfigCache(std::collections::HashMap<PathBuf, ConfigRead>);

/// Files remembered at most; past it the cache starts again.
const MAX_CONFIGS_KEPT: usize = 4096;

/// Config files read at most for one repository (its own and those they include): a
/// config a command wrote that includes thousands of files would otherwise have each
/// look read them all.
const MAX_CONFIGS_GATHERED: usize = 64;

/// Included files kept at most for one repository.
const MAX_INCLUDES_GATHERED: usize = 256;

impl ConfigCache {
    /// What `path` says, read again only when its stamp changed (looked at before it is
    /// read: a change made meanwhile is read next time).
    fn file(&mut self, path: &Path) -> &ConfigRead {
        let stamp = FileStamp::of(path);
        let fresh = self.0.get(path).is_some_and(|known| known.stamp == stamp);
        if !fresh {
            if self.0.len() >= MAX_CONFIGS_KEPT {
                self.0.clear();
            }
            self.0
                .insert(path.to_path_buf(), ConfigRead::of(path, stamp));
        }
        &self.0[path]
    }

    /// What `files` say into `into`, with what they include, each file once (git follows
    /// includes ten deep; here every one is followed, and a file that includes itself
    /// read once), [`MAX_CONFIGS_GATHERED`] files at most.
    fn gather(&mut self, files: &[PathBuf], into: &mut Gathered) {
        let mut seen = std::collections::HashSet::new();
        let mut left: Vec<PathBuf> = files.iter().rev().cloned().collect();
        while let Some(file) = left.pop() {
            if seen.len() >= MAX_CONFIGS_GATHERED {
                break;
            }
            if !seen.insert(file.clone()) {
                continue;
            }
            let read = self.file(&file);
            into.hooks.extend(read.hooks.iter().cloned());
            let room = MAX_INCLUDES_GATHERED.saturating_sub(into.includes.len());
            into.includes
                .extend(read.includes.iter().take(room).cloned());
            left.extend(read.includes.iter().take(room).rev().cloned());
        }
    }

    /// What a repository's own configs say (its `config`, and its `config.worktree` where
    /// the config has git read it), with what they include. A `.git` file has none.
    fn repository(&mut self, git_dir: &Path) -> Gathered {
        let config = git_dir.join("config");
        let mut gathered = Gathered::default();
        self.gather(std::slice::from_ref(&config), &mut gathered);
        // As it was just looked at: no second `stat`.
        if self.0.get(&config).is_some_and(|read| read.reads_worktree) {
            self.gather(&[git_dir.join("config.worktree")], &mut gathered);
        }
        gathered
    }

    /// What the system's and the person's configs say, with what they include.
    fn outer(&mut self) -> Gathered {
        let mut gathered = Gathered::default();
        self.gather(&outer_git_configs(), &mut gathered);
        gathered
    }
}

/// Whether git takes a setting's value for true: no value, `true`, `yes`, `on`, or a
/// number other than 0.
fn git_true(value: Option<&[u8]>) -> bool {
    let Some(value) = value else {
        return true;
    };
    let word = value.to_ascii_lowercase();
    matches!(word.as_slice(), b"true" | b"yes" | b"on")
        || std::str::from_utf8(&word)
            .ok()
            .and_then(|n| n.parse::<i64>().ok())
            .is_some_and(|n| n != 0)
}

/// Whether a `HEAD` file's bytes name a ref or a commit, as git's `validate_headref` asks.
fn names_a_ref_or_commit(said: &[u8]) -> bool {
    match said.strip_prefix(b"ref:") {
        Some(rest) => rest.trim_ascii_start().starts_with(b"refs/"),
        None => said.len() >= 40 && said[..40].iter().all(u8::is_ascii_hexdigit),
    }
}

/// Whether two file names are the same but for ASCII case.
fn same_name(a: &OsStr, b: &OsStr) -> bool {
    a.as_bytes().eq_ignore_ascii_case(b.as_bytes())
}

/// The places in a home directory, relative to it, that hold credentials: keys, tokens and
/// passwords the person's own tools keep there, and what often holds them (shell
/// histories, browser profiles with their cookies). In each of [`home_dirs`], a sandboxed
/// command does not see them (`Sandbox`, unless shown), and where one lies in the
/// workspace its file tools do not read them without asking
/// ([`Workspace::conceal_credentials`]).
pub const CREDENTIALS: &[&str] = &[
    ".ssh",
    ".gnupg",
    ".password-store",
    ".local/share/keyrings",
    ".aws",
    ".azure",
    ".config/gcloud",
    ".oci",
    ".kube",
    ".docker",
    ".config/containers/auth.json",
    ".netrc",
    ".git-credentials",
    ".config/git/credentials",
    ".config/gh",
    ".config/hub",
    ".config/glab-cli",
    ".npmrc",
    ".yarnrc.yml",
    ".pypirc",
    ".cargo/credentials",
    ".cargo/credentials.toml",
    ".gem/credentials",
    ".m2/settings.xml",
    ".gradle/gradle.properties",
    ".pgpass",
    ".my.cnf",
    ".vault-token",
    ".terraform.d/credentials.tfrc.json",
    ".config/rclone",
    ".config/op",
    ".bash_history",
    ".zsh_history",
    ".local/share/fish/fish_history",
    ".python_history",
    ".psql_history",
    ".mysql_history",
    ".node_repl_history",
    ".mozilla",
    ".config/google-chrome",
    ".config/chromium",
    ".config/BraveSoftware",
];

/// The home directories whose [`CREDENTIALS`] are kept from the model: the person's
/// (`HOME`), `/root`, and each directory of `/home`; each once, links resolved.
pub fn home_dirs() -> Vec<PathBuf> {
    let mut homes: Vec<PathBuf> = std::env::var_os("HOME")
        .map(PathBuf::from)
        .filter(|home| home.is_absolute())
        .into_iter()
        .collect();
    homes.push(PathBuf::from("/root"));
    if let Ok(entries) = std::fs::read_dir("/home") {
        homes.extend(entries.filter_map(|entry| Some(entry.ok()?.path())));
    }
    let mut homes: Vec<PathBuf> = homes
        .into_iter()
        .map(|home| home.canonicalize().unwrap_or(home))
        .collect();
    homes.sort();
    homes.dedup();
    homes
}

/// Whether `rel` is `place` or lies beneath it (both relative to the root), names compared
/// without regard to ASCII case.
fn lies_in(rel: &Path, place: &Path) -> bool {
    let mut names = rel.components();
    place.components().all(|c| {
        names
            .next()
            .is_some_and(|n| same_name(n.as_os_str(), c.as_os_str()))
    })
}

/// Bytes of a file a tool may read on the async thread instead of tokio's blocking pool
/// (see [`Workspace::reads_inline`]).
pub const INLINE_READ_BYTES: u64 = 64 << 10;

/// The directory every path of a file tool is resolved in, and confined to.
#[derive(Clone)]
pub struct Workspace {
    root: PathBuf,
    dir: Arc<Dir>,
    /// The root's device, when the root is on a local disk or memory file system.
    local_dev: Option<u64>,
    /// Places in the workspace no tool may change ([`Workspace::protect`]), relative to the
    /// root, each with what it is.
    protected: Vec<(PathBuf, String)>,
    /// Names no tool may change wherever they are ([`Workspace::protect_everywhere`]),
    /// each with what it is.
    protected_names: Vec<(OsString, String)>,
    /// What a directory git takes for a bare repository's is, when no tool may change one
    /// ([`Workspace::protect_bare_repositories`]).
    bare_repositories: Option<String>,
    /// What a directory a repository's `core.hooksPath` names is, when no tool may change
    /// one ([`Workspace::protect_hooks_paths`]).
    hooks_paths: Option<String>,
    /// Places in the workspace no tool reads without asking ([`Workspace::conceal`]),
    /// relative to the root, each with what it is.
    concealed: Vec<(PathBuf, String)>,
    /// The workspace's directories as the last look for [`Workspace::protected_names`]
    /// read them, shared by the clones.
    listings: Arc<std::sync::Mutex<crate::named::Listings>>,
    /// What a config file a repository's config includes is, when no tool may change one
    /// ([`Workspace::protect_config_includes`]).
    config_includes: Option<String>,
    /// What git config files said when last read, shared by the clones.
    config_cache: Arc<std::sync::Mutex<ConfigCache>>,
}

impl std::fmt::Debug for Workspace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Workspace")
            .field("root", &self.root)
            .finish()
    }
}

/// A path resolved inside the workspace: what a tool would really touch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Resolved {
    rel: PathBuf,
    exists: bool,
    /// What the walk saw at the path, when its last step looked at the thing itself.
    seen: Option<Seen>,
}

/// What a path named when it was resolved (links not followed: a resolved path has none).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Seen {
    /// A regular file: its device and its length in bytes.
    File {
        /// The device it is on.
        dev: u64,
        /// Its length in bytes.
        len: u64,
    },
    /// A directory.
    Dir,
    /// A FIFO, a socket or a device.
    Other,
}

impl Seen {
    fn of(meta: &cap_std::fs::Metadata) -> Seen {
        use cap_std::fs::MetadataExt;
        if meta.is_file() {
            Seen::File {
                dev: meta.dev(),
                len: meta.len(),
            }
        } else if meta.is_dir() {
            Seen::Dir
        } else {
            Seen::Other
        }
    }
}

impl Resolved {
    /// The path relative to the root, without `.`, `..` or symlinks (empty for the root).
    pub fn rel(&self) -> &Path {
        &self.rel
    }

    /// Whether something exists at that path (links resolved).
    pub fn exists(&self) -> bool {
        self.exists
    }

    /// What was there when the path was resolved (`None` when the walk did not look at
    /// the thing itself: the root, a missing path, a path ending in `..`). It may have
    /// changed since: a tool checks what it opened, not this.
    pub fn seen(&self) -> Option<Seen> {
        self.seen
    }

    /// This resolution if something exists there; else the error a tool gives for a
    /// missing `path` (as the model spelled it).
    pub fn existing(self, path: &str) -> Result<Resolved, ToolError> {
        if self.exists {
            Ok(self)
        } else {
            Err(ToolError::new(
                ErrorKind::ExecutionFailed,
                format!("{path}: no such file or directory in the workspace"),
            ))
        }
    }

    /// Whether this is the root itself.
    pub fn is_root(&self) -> bool {
        self.rel.as_os_str().is_empty()
    }

    /// The relative path as policy rules see it: `/`-separated, `.` for the root.
    pub fn display(&self) -> String {
        if self.is_root() {
            ".".to_owned()
        } else {
            self.rel.to_string_lossy().into_owned()
        }
    }

    /// The path to hand to the directory capability (`.` for the root).
    fn cap_path(&self) -> &Path {
        if self.is_root() {
            Path::new(".")
        } else {
            &self.rel
        }
    }
}

impl Workspace {
    /// A workspace rooted at `root`, which must be an existing directory.
    pub fn new(root: impl AsRef<Path>) -> io::Result<Workspace> {
        let root = root.as_ref().canonicalize()?;
        if !root.is_dir() {
            return Err(io::Error::new(
                io::ErrorKind::NotADirectory,
                format!("{} is not a directory", root.display()),
            ));
        }
        let dir = Dir::open_ambient_dir(&root, ambient_authority())?;
        let local_dev = local_device(&dir);
        Ok(Workspace {
            root,
            dir: Arc::new(dir),
            local_dev,
            protected: Vec::new(),
            protected_names: Vec::new(),
            bare_repositories: None,
            hooks_paths: None,
            concealed: Vec::new(),
            listings: Arc::default(),
            config_includes: None,
            config_cache: Arc::default(),
        })
    }

    /// Keeps every tool from changing `path` and what lies below it, where it is in the
    /// workspace: the run store (`.agent`, the log a run is judged by) or agent's own
    /// settings. A call of a tool that is not read-only on a path that resolves there is
    /// denied, naming `what`; reads are left alone. A `path` outside the workspace is out
    /// of the tools' reach already and is ignored; one that does not exist yet is
    /// protected where it will be.
    pub fn protect(mut self, path: &Path, what: &str) -> Workspace {
        if let Some(rel) = self.inside(path) {
            self.protected.push((rel, what.to_owned()));
        }
        self
    }

    /// Keeps every tool from changing what is named `name`, and what lies below it,
    /// wherever it is in the workspace: `.git`, in the workspace's own repository and in
    /// every repository nested in it (its hooks and config run commands the next time a
    /// person uses git there; a submodule's `.git` file says where they are). Denied as
    /// [`Workspace::protect`] denies.
    pub fn protect_everywhere(mut self, name: &str, what: &str) -> Workspace {
        self.protected_names
            .push((OsString::from(name), what.to_owned()));
        // What a look for the other names found is not what this one finds: a clone made
        // before shares none of it.
        self.listings = Arc::default();
        self
    }

    /// Keeps every tool from changing a directory of the workspace that git takes for a
    /// repository's own (a bare repository: a `HEAD` that names a ref or a commit, beside
    /// `objects` and `refs`), and what lies below it, as [`Workspace::protect_everywhere`]
    /// keeps them from `.git`: its hooks and config run commands when a person uses git in
    /// it, or in any directory beneath it that is no repository of its own (a command that
    /// turns `src` into one is obeyed by the person's next `git diff` there). The workspace's
    /// root is not one of them (it is the person's to change, and the workspace whole);
    /// unless it is one already, its `HEAD` is protected as [`Workspace::protect`] does,
    /// so that no tool makes it one (where no `.git` comes first, git would obey a config
    /// written there in the whole workspace).
    pub fn protect_bare_repositories(mut self, what: &str) -> Workspace {
        self.bare_repositories = Some(what.to_owned());
        self.listings = Arc::default();
        if !is_git_directory(&self.root) {
            self.protected.push((
                PathBuf::from("HEAD"),
                "what would make the workspace a bare repository".to_owned(),
            ));
        }
        self
    }

    /// Keeps every tool from changing the directory of the workspace from which git runs a
    /// repository's hooks when its config (or the person's, or the system's) names one with
    /// `core.hooksPath` (husky's `.husky/_`, which git ignores, so that a hook written
    /// there would show in no `git status`; every directory so named, not only the one
    /// git would take, which depends on the environment it runs in), and what lies below
    /// it: a sandboxed command has it read-only for each repository found as
    /// [`Workspace::protected_found`] finds them, and the file tools may not change what
    /// lies in those of a repository whose work tree holds the path (the workspace's own,
    /// or one nested in it). One that is the workspace's root, or holds it, is left alone
    /// (the workspace whole would be read-only).
    pub fn protect_hooks_paths(mut self, what: &str) -> Workspace {
        self.hooks_paths = Some(what.to_owned());
        self
    }

    /// Keeps every tool from changing a file of the workspace that git reads as config
    /// because a config includes it (`include.path`, `includeIf.*.path`: a repository's
    /// `[include] path = ../.gitconfig`, a team's settings kept in the work tree), the
    /// person's or the system's configs' too: a `core.fsmonitor` written there runs at
    /// the person's next `git status`, the very command that would show the change. A
    /// sandboxed command has each one that is there read-only (for each repository found
    /// as [`Workspace::protected_found`] finds them), and the file tools may not change
    /// one (there or not) of a repository whose work tree holds the path. Every include is
    /// followed, whatever its condition.
    pub fn protect_config_includes(mut self, what: &str) -> Workspace {
        self.config_includes = Some(what.to_owned());
        self
    }

    /// What keeps `rel` from the file tools as git's config has it
    /// ([`Workspace::protect_hooks_paths`], [`Workspace::protect_config_includes`]): it
    /// lies in a directory from which git may run the hooks of a repository whose work
    /// tree holds it (the workspace's own, or one nested in it on the way down to `rel`:
    /// a `.git` in the root or in a directory above `rel`), or it is a file one of their
    /// configs (or the person's, or the system's) includes. A `stat` for each directory on
    /// the way, and the configs of the repositories found there, read again only once
    /// changed.
    fn kept_by_git_config(&self, rel: &Path) -> Option<&str> {
        if self.hooks_paths.is_none() && self.config_includes.is_none() {
            return None;
        }
        let mut tops = vec![self.root.clone()];
        let mut dir = self.root.clone();
        let mut components = rel.components().peekable();
        while let Some(c) = components.next() {
            if components.peek().is_none() {
                break;
            }
            dir.push(c);
            tops.push(dir.clone());
        }
        let mut cache = self.config_cache.lock().unwrap_or_else(|p| p.into_inner());
        let mut outer: Option<Gathered> = None;
        for top in &tops {
            let git_dir = top.join(".git");
            if std::fs::symlink_metadata(&git_dir).is_err() {
                continue;
            }
            let outer = match &mut outer {
                Some(outer) => outer,
                None => outer.insert(cache.outer()),
            };
            let own = cache.repository(&git_dir);
            if let Some(what) = self.hooks_paths.as_deref() {
                let in_hooks = hooks_paths(top, outer.hooks.iter().chain(&own.hooks))
                    .iter()
                    .filter_map(|hooks| self.hooks_inside(hooks))
                    .any(|hooks| lies_in(rel, &hooks));
                if in_hooks {
                    return Some(what);
                }
            }
            if let Some(what) = self.config_includes.as_deref() {
                let included = outer
                    .includes
                    .iter()
                    .chain(&own.includes)
                    .filter_map(|file| self.inside(file))
                    .any(|file| lies_in(rel, &file));
                if included {
                    return Some(what);
                }
            }
        }
        None
    }

    /// A file a config includes, as an absolute path in the workspace below its root (its
    /// links resolved), when it is there (a sandboxed command cannot be kept from making
    /// one that is not: one it makes is named after it).
    fn included(&self, file: &Path) -> Option<PathBuf> {
        let rel = self.inside(file)?;
        let place = self.root.join(&rel);
        (!rel.as_os_str().is_empty() && place.is_file()).then_some(place)
    }

    /// `hooks`, relative to the root, when it is a directory below the root (its links
    /// resolved).
    fn hooks_inside(&self, hooks: &Path) -> Option<PathBuf> {
        let real = hooks.canonicalize().ok()?;
        let rel = real.strip_prefix(&self.root).ok()?;
        (!rel.as_os_str().is_empty()).then(|| rel.to_path_buf())
    }

    /// Keeps every tool from reading or changing `path`, and what lies below it, without a
    /// person's approval, where it is in the workspace: a call on a path that resolves
    /// there asks, naming `what`, where policy would let it run by default (a read, or a
    /// write a rule for the whole tool allows), unless an allow rule names the path (a
    /// rule for the whole tool does not); a call that asks or is
    /// denied anyway stays so. Where `path` is a link, the place it leads to is concealed
    /// (paths are judged where they lead). A `path` outside the workspace is ignored.
    pub fn conceal(mut self, path: &Path, what: &str) -> Workspace {
        if let Some(rel) = self.inside(path) {
            self.concealed.push((rel, what.to_owned()));
        }
        self
    }

    /// Conceals ([`Workspace::conceal`]) the [`CREDENTIALS`] of each of [`home_dirs`] that
    /// lies in the workspace (the workspace is a home directory, or holds some): a model
    /// reads none of the person's keys with the file tools without asking. Costs nothing
    /// where no home directory lies in the workspace.
    pub fn conceal_credentials(mut self) -> Workspace {
        for home in home_dirs() {
            if !home.starts_with(&self.root) {
                continue;
            }
            for name in CREDENTIALS {
                self = self.conceal(&home.join(name), "a home directory's credentials");
            }
        }
        self
    }

    /// What keeps `resolved` from being touched without asking, when it lies in a place
    /// [`Workspace::conceal`] named (names compared as [`Workspace::protected`] does).
    pub fn concealed(&self, resolved: &Resolved) -> Option<&str> {
        self.concealed
            .iter()
            .find(|(place, _)| lies_in(&resolved.rel, place))
            .map(|(_, what)| what.as_str())
    }

    /// Where `path` is relative to the root, links resolved as far as it exists; `None`
    /// outside the root, or when that cannot be told.
    fn inside(&self, path: &Path) -> Option<PathBuf> {
        let absolute = std::path::absolute(path).ok()?;
        let mut existing = absolute.as_path();
        let mut missing = Vec::new();
        while std::fs::symlink_metadata(existing).is_err() {
            match existing.file_name() {
                Some(name) => missing.push(name),
                // `..` or the root itself: nothing to name.
                None => return None,
            }
            existing = existing.parent()?;
        }
        let mut real = existing.canonicalize().ok()?;
        real.extend(missing.iter().rev());
        real.strip_prefix(&self.root).ok().map(Path::to_path_buf)
    }

    /// What keeps `resolved` from being changed by a tool, when it lies in a place
    /// [`Workspace::protect`] named.
    ///
    /// Names are compared without regard to ASCII case: on a file system that ignores case
    /// (macOS's, Windows') `.AGENT` is the store and `.Git` the git directory. Where case
    /// matters this protects a few more names than it must, and keeps no read from them.
    pub fn protected(&self, resolved: &Resolved) -> Option<&str> {
        let rel = &resolved.rel;
        self.protected
            .iter()
            .find(|(place, _)| lies_in(rel, place))
            .map(|(_, what)| what.as_str())
            .or_else(|| {
                self.protected_names
                    .iter()
                    .find(|(name, _)| rel.components().any(|c| same_name(c.as_os_str(), name)))
                    .map(|(_, what)| what.as_str())
            })
            .or_else(|| {
                let what = self.bare_repositories.as_deref()?;
                let mut dir = self.root.clone();
                rel.components()
                    .any(|c| {
                        dir.push(c);
                        is_git_directory(&dir)
                    })
                    .then_some(what)
            })
            .or_else(|| self.kept_by_git_config(rel))
    }

    /// The places in the workspace no tool may change, as absolute paths, each with what
    /// it is, whether they are there or not: those [`Workspace::protect`] named, and those
    /// named [`Workspace::protect_everywhere`] at the root (not deeper: finding them would
    /// mean walking the whole workspace). What a sandboxed command may neither change nor
    /// make either.
    pub fn protected_paths(&self) -> Vec<(PathBuf, &str)> {
        let named = self
            .protected
            .iter()
            .map(|(place, what)| (place.as_os_str(), what.as_str()));
        let everywhere = self
            .protected_names
            .iter()
            .map(|(name, what)| (name.as_os_str(), what.as_str()));
        let mut paths: Vec<(PathBuf, &str)> = named
            .chain(everywhere)
            .map(|(place, what)| (self.root.join(place), what))
            .collect();
        paths.sort();
        paths.dedup_by(|a, b| a.0 == b.0);
        paths
    }

    /// Those of [`Workspace::protected_paths`] that are there now.
    pub fn protected_places(&self) -> Vec<PathBuf> {
        self.protected_paths()
            .into_iter()
            .map(|(place, _)| place)
            .filter(|place| std::fs::symlink_metadata(place).is_ok())
            .collect()
    }

    /// Every place in the workspace named as [`Workspace::protect_everywhere`] names them,
    /// at any depth, that is there now, as an absolute path: the `.git` of each repository
    /// nested in it (a submodule's `.git` file); where [`Workspace::protect_bare_repositories`]
    /// asks, each directory below the root that git takes for a bare repository's; where
    /// [`Workspace::protect_hooks_paths`] asks, each directory below the root that a
    /// `core.hooksPath` of one of these repositories names: what a sandboxed command may
    /// no more change than a file tool may. A link stands for what it leads to; one that
    /// leads to nothing, or to the workspace or a directory that holds it (which a command
    /// could make to have the whole workspace read-only), is left out. Found by walking
    /// the workspace (no link is followed into a directory); a walk after the first reads
    /// again only the directories where a directory or such a name (or a `HEAD`) came or
    /// went since, known on Linux by watching them (inotify), elsewhere or where watches
    /// run short by their times (see `named.rs`).
    pub fn protected_found(&self) -> Vec<PathBuf> {
        use crate::named::Looked;
        let bare = self.bare_repositories.is_some();
        if self.protected_names.is_empty() && !bare {
            return Vec::new();
        }
        let looked_for = |name: &OsStr| {
            if self
                .protected_names
                .iter()
                .any(|(protected, _)| same_name(name, protected))
            {
                Looked::Found
            } else if bare && same_name(name, OsStr::new("HEAD")) {
                // Its directory may be a bare repository's (looked at below); it may be
                // a directory itself, and is walked into.
                Looked::FoundAndPast
            } else {
                Looked::Past
            }
        };
        let mut listings = self.listings.lock().unwrap_or_else(|p| p.into_inner());
        let found = listings.find(&self.root, looked_for);
        drop(listings);
        let mut found: Vec<PathBuf> = found
            .into_iter()
            .filter_map(|place| {
                let head = bare
                    && place
                        .file_name()
                        .is_some_and(|n| same_name(n, OsStr::new("HEAD")));
                if !head {
                    return Some(place);
                }
                let dir = place.parent()?;
                (dir != self.root && is_git_directory(dir)).then(|| dir.to_path_buf())
            })
            .collect();
        found.retain(|place| match std::fs::symlink_metadata(place) {
            Ok(meta) if meta.is_symlink() => place
                .canonicalize()
                .is_ok_and(|target| !self.root.starts_with(target)),
            Ok(_) => true,
            Err(_) => false,
        });
        if self.hooks_paths.is_some() || self.config_includes.is_some() {
            let mut cache = self.config_cache.lock().unwrap_or_else(|p| p.into_inner());
            let outer = cache.outer();
            let mut kept: Vec<PathBuf> = Vec::new();
            if self.config_includes.is_some() {
                kept.extend(outer.includes.iter().filter_map(|file| self.included(file)));
            }
            for git_dir in &found {
                // Hooks run from the work tree's root, or a bare repository's directory.
                let dot_git = git_dir
                    .file_name()
                    .is_some_and(|name| same_name(name, OsStr::new(".git")));
                let top = match git_dir.parent() {
                    Some(parent) if dot_git => parent,
                    _ => git_dir,
                };
                let own = cache.repository(git_dir);
                if self.hooks_paths.is_some() {
                    let hooks = hooks_paths(top, outer.hooks.iter().chain(&own.hooks));
                    kept.extend(
                        hooks
                            .iter()
                            .filter_map(|hooks| Some(self.root.join(self.hooks_inside(hooks)?))),
                    );
                }
                if self.config_includes.is_some() {
                    kept.extend(own.includes.iter().filter_map(|file| self.included(file)));
                }
            }
            drop(cache);
            // One in a place kept already (`.git/hooks-elsewhere`) is kept with it.
            let apart: Vec<PathBuf> = kept
                .into_iter()
                .filter(|place| !found.iter().any(|kept| place.starts_with(kept)))
                .collect();
            found.extend(apart);
        }
        found.sort();
        found.dedup();
        found
    }

    /// Whether the root is on a local disk or memory file system (ext4, XFS, Btrfs, tmpfs,
    /// overlayfs and the like; not NFS, SMB, FUSE or an unknown kind), where reading a small
    /// file cannot hang. Only known on Linux; `false` elsewhere.
    pub fn is_local(&self) -> bool {
        self.local_dev.is_some()
    }

    /// Whether a tool may read `resolved` on the async thread rather than on tokio's
    /// blocking pool: a regular file of at most [`INLINE_READ_BYTES`] on the root's own
    /// local file system. Handing a read to the pool and back wakes two threads, which
    /// costs more than reading a few kilobytes from the page cache (about a third of a
    /// one-read turn's CPU, BENCHMARKS.md); such a read is bounded, so the call's timeout
    /// and cancellation lose nothing by it. Anything else (a big file, another mount, a
    /// network or FUSE file system) goes to the pool, where a hung read cannot hold up the
    /// run.
    pub fn reads_inline(&self, resolved: &Resolved) -> bool {
        match (self.local_dev, resolved.seen) {
            (Some(root), Some(Seen::File { dev, len })) => dev == root && len <= INLINE_READ_BYTES,
            _ => false,
        }
    }

    /// Whether an open of a resolved path goes through no symlink at all (on Linux, when
    /// `openat2` worked the last time it was asked). A resolution made earlier in this
    /// process may then be acted on again: its path has no link in it, so the open either
    /// reaches the very path that was judged or is refused, if a link was made on it since.
    pub fn opens_exactly(&self) -> bool {
        #[cfg(target_os = "linux")]
        {
            OPENAT2_WORKS.load(std::sync::atomic::Ordering::Relaxed)
        }
        #[cfg(not(target_os = "linux"))]
        {
            false
        }
    }

    /// Whether a file opened for a read that [`Workspace::reads_inline`] allowed may still
    /// be read in place: it is on the root's own local file system, at most
    /// [`INLINE_READ_BYTES`] long (the resolution may be older than the open).
    pub fn reads_inline_opened(&self, opened: &std::fs::Metadata) -> bool {
        use std::os::unix::fs::MetadataExt;
        self.local_dev == Some(opened.dev()) && opened.len() <= INLINE_READ_BYTES
    }

    /// The canonical root.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The directory capability every file operation goes through.
    pub fn dir(&self) -> &Dir {
        &self.dir
    }

    /// Resolves a path the model gave to the workspace-relative path it names, following
    /// `.`, `..` and symlinks as the kernel would. The path need not exist (a file about to
    /// be written). Refused, as `denied`: a NUL byte, an absolute path outside the root,
    /// `..` that climbs out of it, a symlink whose target lies outside it, a link loop.
    pub fn resolve(&self, path: &str) -> Result<Resolved, ToolError> {
        if path.contains('\0') {
            return Err(escape(path, "contains a NUL byte"));
        }
        let given = Path::new(path);
        let start = if given.is_absolute() {
            self.strip_root(path, given)?
        } else {
            given.to_path_buf()
        };
        #[cfg(target_os = "linux")]
        if let Some(resolved) = self.resolve_plain(&start) {
            return Ok(resolved);
        }
        self.walk(path, &start)
    }

    /// Resolves at once a path of two or more plain components that names something
    /// through no symlink: one `openat2` beneath the root that follows none, and a `stat`
    /// of what it opened. Three system calls for any depth, where [`Workspace::walk`]
    /// looks at each component in turn. `None` when the walk must decide: a `.`/`..`
    /// component, a symlink on the way or at the end, something missing, any error, or no
    /// `openat2`; the walk then resolves it as before.
    #[cfg(target_os = "linux")]
    fn resolve_plain(&self, start: &Path) -> Option<Resolved> {
        use rustix::fs::{FileType, OFlags};
        let mut plain = 0;
        for component in start.components() {
            match component {
                Component::Normal(_) => plain += 1,
                Component::CurDir => {}
                _ => return None,
            }
        }
        // A single component costs the walk one `stat`, less than this.
        if plain < 2 {
            return None;
        }
        // With `O_PATH | O_NOFOLLOW` a link at the end is opened itself, and seen below.
        let flags = OFlags::PATH | OFlags::NOFOLLOW;
        let fd = openat2_through_no_link(&self.dir, start, flags)?.ok()?;
        let stat = rustix::fs::fstat(&fd).ok()?;
        let seen = match FileType::from_raw_mode(stat.st_mode) {
            FileType::Symlink => return None,
            FileType::RegularFile => Seen::File {
                dev: stat.st_dev,
                len: u64::try_from(stat.st_size).ok()?,
            },
            FileType::Directory => Seen::Dir,
            _ => Seen::Other,
        };
        Some(Resolved {
            rel: start
                .components()
                .filter(|c| matches!(c, Component::Normal(_)))
                .collect(),
            exists: true,
            seen: Some(seen),
        })
    }

    /// Like [`Workspace::resolve`], for a path that must exist.
    pub fn resolve_existing(&self, path: &str) -> Result<Resolved, ToolError> {
        self.resolve(path)?.existing(path)
    }

    /// `known` (a resolution of `path` made already) or else a resolution of `path`.
    pub fn resolve_known(
        &self,
        known: Option<Resolved>,
        path: &str,
    ) -> Result<Resolved, ToolError> {
        known.map_or_else(|| self.resolve(path), Ok)
    }

    /// The path relative to the root, for messages (`.` for the root itself).
    pub fn display(&self, path: &Path) -> String {
        match path.strip_prefix(&self.root) {
            Ok(rel) if rel.as_os_str().is_empty() => ".".to_owned(),
            Ok(rel) => rel.display().to_string(),
            Err(_) => path.display().to_string(),
        }
    }

    /// An absolute path made relative to the root: directly when it is spelled under the
    /// root, otherwise through the real location of its longest existing prefix.
    fn strip_root(&self, path: &str, given: &Path) -> Result<PathBuf, ToolError> {
        if let Ok(rel) = given.strip_prefix(&self.root) {
            return Ok(rel.to_path_buf());
        }
        let mut existing = given;
        let mut rest = Vec::new();
        while existing.symlink_metadata().is_err() {
            match (existing.file_name(), existing.parent()) {
                (Some(name), Some(parent)) => {
                    rest.push(name.to_owned());
                    existing = parent;
                }
                _ => break,
            }
        }
        let real = existing
            .canonicalize()
            .map_err(|_| escape(path, "is outside the workspace"))?;
        let Ok(rel) = real.strip_prefix(&self.root) else {
            return Err(escape(path, "is outside the workspace"));
        };
        let mut rel = rel.to_path_buf();
        rel.extend(rest.iter().rev());
        Ok(rel)
    }

    /// Resolves `start` (relative) component by component beneath the root.
    fn walk(&self, path: &str, start: &Path) -> Result<Resolved, ToolError> {
        let mut queue: VecDeque<OsString> = VecDeque::new();
        push_components(&mut queue, start, path)?;
        // The path so far, `/`-separated, and where each of its components ends.
        let mut current: Vec<u8> = Vec::with_capacity(path.len());
        let mut ends: Vec<usize> = Vec::new();
        let pop = |current: &mut Vec<u8>, ends: &mut Vec<usize>| {
            ends.pop()?;
            current.truncate(ends.last().map_or(0, |&end| end));
            Some(())
        };
        let mut links = 0;
        let mut missing = false;
        // What the last component pushed is, while `current` ends with it.
        let mut seen = None;
        while let Some(part) = queue.pop_front() {
            seen = None;
            if part == ".." {
                if pop(&mut current, &mut ends).is_none() {
                    return Err(escape(path, "climbs out of the workspace"));
                }
                continue;
            }
            if !current.is_empty() {
                current.push(b'/');
            }
            current.extend_from_slice(part.as_bytes());
            ends.push(current.len());
            if missing {
                continue;
            }
            let candidate = Path::new(OsStr::from_bytes(&current));
            let meta = match self.dir.symlink_metadata(candidate) {
                Ok(meta) => meta,
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    missing = true;
                    continue;
                }
                // Not a directory, permission denied...: the tool's own open will say so.
                Err(_) => {
                    missing = true;
                    continue;
                }
            };
            if !meta.file_type().is_symlink() {
                seen = Some(Seen::of(&meta));
                continue;
            }
            links += 1;
            if links > MAX_LINKS {
                return Err(escape(path, "goes through too many symlinks (a loop?)"));
            }
            let target = self
                .dir
                .read_link_contents(candidate)
                .map_err(|e| ToolError::new(ErrorKind::ExecutionFailed, format!("{path}: {e}")))?;
            pop(&mut current, &mut ends);
            let target = if target.is_absolute() {
                let Ok(rel) = target.strip_prefix(&self.root) else {
                    return Err(escape(
                        path,
                        "resolves through a symlink to a place outside the workspace",
                    ));
                };
                current.clear();
                ends.clear();
                rel.to_path_buf()
            } else {
                target
            };
            let mut front = VecDeque::new();
            push_components(&mut front, &target, path)?;
            while let Some(part) = front.pop_back() {
                queue.push_front(part);
            }
        }
        let rel = PathBuf::from(OsString::from_vec(current));
        let exists = !missing;
        Ok(Resolved { rel, exists, seen })
    }

    /// Opens a resolved path for reading, beneath the root. Never waits: a FIFO with no
    /// writer opens at once (non-blocking; reads of a regular file are not affected) and a
    /// terminal does not become the controlling one, so a caller checks the file it got
    /// (`File::metadata`) before reading. On Linux the open goes through no symlink: a
    /// link on the resolved path now was made after it was judged, and is refused.
    pub fn open(&self, resolved: &Resolved) -> io::Result<std::fs::File> {
        #[cfg(target_os = "linux")]
        if let Some(opened) = open_beneath_exact(
            &self.dir,
            resolved.cap_path(),
            rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::NONBLOCK | rustix::fs::OFlags::NOCTTY,
        ) {
            return opened.map(std::fs::File::from);
        }
        let mut options = cap_std::fs::OpenOptions::new();
        options.read(true);
        #[cfg(unix)]
        {
            use cap_std::fs::OpenOptionsExt;
            options.custom_flags(NO_WAIT_FLAGS);
        }
        self.dir
            .open_with(resolved.cap_path(), &options)
            .map(cap_std::fs::File::into_std)
    }

    /// A resolved directory as a capability, its missing components made one by one, each
    /// beneath the one before and opened through no symlink (see [`open_beneath_exact`]).
    fn create_dir_all_exact(&self, rel: &Path) -> io::Result<Dir> {
        let mut dir = self.dir.try_clone()?;
        for part in rel.components() {
            let name = Path::new(part.as_os_str());
            match dir.create_dir(name) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(e),
            }
            dir = open_dir_exact(&dir, name)?;
        }
        Ok(dir)
    }

    /// The metadata of a resolved path, reached through no symlink on Linux, as
    /// [`Workspace::open`] opens it.
    pub fn metadata(&self, resolved: &Resolved) -> io::Result<cap_std::fs::Metadata> {
        #[cfg(target_os = "linux")]
        if let Some(opened) =
            open_beneath_exact(&self.dir, resolved.cap_path(), rustix::fs::OFlags::PATH)
        {
            return cap_std::fs::Metadata::from_file(&std::fs::File::from(opened?));
        }
        self.dir.metadata(resolved.cap_path())
    }

    /// A resolved directory's entries: names, and whether each is a directory.
    pub fn entries(&self, resolved: &Resolved) -> io::Result<Vec<(String, bool)>> {
        let mut out = Vec::new();
        self.each_entry(resolved, |name, is_dir| out.push((name, is_dir)))?;
        Ok(out)
    }

    /// The same, each entry handed to `each` as it is read: a directory of any size costs
    /// what `each` keeps.
    pub fn each_entry(
        &self,
        resolved: &Resolved,
        mut each: impl FnMut(String, bool),
    ) -> io::Result<()> {
        let dir = open_dir_exact(&self.dir, resolved.cap_path())?;
        for entry in dir.entries()? {
            let entry = entry?;
            let is_dir = entry.file_type().is_ok_and(|t| t.is_dir());
            each(entry.file_name().to_string_lossy().into_owned(), is_dir);
        }
        Ok(())
    }

    /// Writes `bytes` to a resolved path atomically: a fresh temporary file in the same
    /// directory (never a predictable name, never through a link), synced, then renamed
    /// over the target. Parent directories are created. A target that is a symlink is
    /// replaced by the file, never followed; an existing file keeps its permissions.
    pub fn write_atomic(&self, resolved: &Resolved, bytes: &[u8]) -> io::Result<()> {
        let Some(name) = resolved.rel.file_name() else {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "the workspace root is not a file",
            ));
        };
        let parent = resolved.rel.parent().unwrap_or(Path::new(""));
        let dir = if parent.as_os_str().is_empty() {
            self.dir.try_clone()?
        } else {
            self.create_dir_all_exact(parent)?
        };
        let keep = match dir.symlink_metadata(name) {
            Ok(meta) if meta.is_dir() => {
                return Err(io::Error::new(
                    io::ErrorKind::IsADirectory,
                    "it is a directory",
                ));
            }
            Ok(meta) if meta.is_file() => Some(meta.permissions()),
            _ => None,
        };
        let mut temp = cap_tempfile::TempFile::new(&dir)?;
        temp.write_all(bytes)?;
        if let Some(permissions) = keep {
            temp.as_file().set_permissions(permissions)?;
        }
        temp.as_file().sync_all()?;
        temp.replace(name)
    }
}

/// Opens `rel` (a resolved path, with no symlink in it) beneath `dir` through no symlink at
/// all: Linux's `openat2` with `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS`. A link found on the
/// path now was made after the path was resolved and judged; the capability alone would
/// follow it to wherever it points inside the workspace, a file the policy never saw, so
/// the open is refused instead. `None` where the kernel has no `openat2` (before 5.6) or a
/// filter forbids it: the capability's open then stands.
#[cfg(target_os = "linux")]
fn open_beneath_exact(
    dir: &Dir,
    rel: &Path,
    flags: rustix::fs::OFlags,
) -> Option<io::Result<rustix::fd::OwnedFd>> {
    use rustix::io::Errno;
    match openat2_through_no_link(dir, rel, flags)? {
        Ok(fd) => Some(Ok(fd)),
        Err(Errno::LOOP) => Some(Err(io::Error::other(format!(
            "{}: a part of this path was replaced by a symbolic link after the path was \
             checked; the tool does not follow it (try the call again)",
            rel.display()
        )))),
        Err(e) => Some(Err(e.into())),
    }
}

/// `openat2` beneath `dir` through no symlink (`RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS`).
/// `None` where the kernel has no `openat2` (before 5.6; the process then stops asking) or
/// a filter forbids it.
#[cfg(target_os = "linux")]
fn openat2_through_no_link(
    dir: &Dir,
    rel: &Path,
    flags: rustix::fs::OFlags,
) -> Option<rustix::io::Result<rustix::fd::OwnedFd>> {
    use rustix::fs::{Mode, OFlags, ResolveFlags};
    use rustix::io::Errno;
    use std::sync::atomic::{AtomicBool, Ordering};
    static MISSING: AtomicBool = AtomicBool::new(false);
    if MISSING.load(Ordering::Relaxed) {
        return None;
    }
    let resolve = ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS;
    match rustix::fs::openat2(dir, rel, flags | OFlags::CLOEXEC, Mode::empty(), resolve) {
        Err(Errno::NOSYS) => {
            MISSING.store(true, Ordering::Relaxed);
            OPENAT2_WORKS.store(false, Ordering::Relaxed);
            None
        }
        Err(Errno::PERM) => {
            OPENAT2_WORKS.store(false, Ordering::Relaxed);
            None
        }
        opened => {
            if !OPENAT2_WORKS.load(Ordering::Relaxed) {
                OPENAT2_WORKS.store(true, Ordering::Relaxed);
            }
            Some(opened)
        }
    }
}

/// Whether the last `openat2` was carried out (not refused as unknown or forbidden): see
/// [`Workspace::opens_exactly`].
#[cfg(target_os = "linux")]
static OPENAT2_WORKS: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// The directory `rel` beneath `dir` as a capability, opened through no symlink (see
/// [`open_beneath_exact`]).
fn open_dir_exact(dir: &Dir, rel: &Path) -> io::Result<Dir> {
    #[cfg(target_os = "linux")]
    if let Some(opened) = open_beneath_exact(
        dir,
        rel,
        rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::DIRECTORY,
    ) {
        return opened.map(|fd| Dir::from_std_file(std::fs::File::from(fd)));
    }
    dir.open_dir(rel)
}

/// `O_NONBLOCK | O_NOCTTY`: an open that never waits for a FIFO's writer nor takes a
/// terminal.
#[cfg(target_os = "linux")]
const NO_WAIT_FLAGS: i32 =
    (rustix::fs::OFlags::NONBLOCK.bits() | rustix::fs::OFlags::NOCTTY.bits()) as i32;
#[cfg(all(unix, not(target_os = "linux")))]
const NO_WAIT_FLAGS: i32 = 0;

/// File systems whose reads come from a local disk or memory (`statfs`'s `f_type`).
const LOCAL_FILE_SYSTEMS: [i64; 11] = [
    0xEF53,      // ext2, ext3, ext4
    0x5846_5342, // XFS
    0x9123_683E, // Btrfs
    0x0102_1994, // tmpfs
    0x8584_58F6, // ramfs
    0x794C_7630, // overlayfs
    0xF2F5_2010, // F2FS
    0x2FC1_2FC1, // ZFS
    0xCA45_1A4E, // bcachefs
    0x3153_464A, // JFS
    0x5265_4973, // ReiserFS
];

/// Whether `statfs`'s `f_type` names a local disk or memory file system.
pub fn is_local_file_system(f_type: i64) -> bool {
    LOCAL_FILE_SYSTEMS.contains(&f_type)
}

/// The device of `dir` when it is on a local file system; `None` when that cannot be told
/// (a file system `fstatfs` fails on is treated as remote: every read goes to the pool).
#[cfg(target_os = "linux")]
fn local_device(dir: &Dir) -> Option<u64> {
    use cap_std::fs::MetadataExt;
    let fs = rustix::fs::fstatfs(dir).ok()?;
    // `f_type` is a signed word of the platform's size: the magic is its low 32 bits.
    #[allow(clippy::unnecessary_cast, clippy::useless_conversion)]
    let kind = (fs.f_type as i64) & 0xFFFF_FFFF;
    if !is_local_file_system(kind) {
        return None;
    }
    dir.dir_metadata().ok().map(|m| m.dev())
}

#[cfg(not(target_os = "linux"))]
fn local_device(_dir: &Dir) -> Option<u64> {
    None
}

/// Appends the components of `path` (relative) to `queue`, `.` and empty ones dropped.
fn push_components(
    queue: &mut VecDeque<OsString>,
    path: &Path,
    given: &str,
) -> Result<(), ToolError> {
    for component in path.components() {
        match component {
            Component::CurDir => {}
            Component::ParentDir => queue.push_back(OsString::from("..")),
            Component::Normal(part) => queue.push_back(part.to_owned()),
            Component::RootDir | Component::Prefix(_) => {
                return Err(escape(given, "is outside the workspace"));
            }
        }
    }
    Ok(())
}

fn escape(path: &str, why: &str) -> ToolError {
    ToolError::new(
        ErrorKind::Denied,
        format!("path {path:?} {why}; use a path relative to the workspace root"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A config that includes thousands of files, each including more: a bounded number
    /// is kept, and fewer read.
    #[test]
    fn a_config_that_includes_thousands_of_files_costs_a_bounded_look() {
        let tmp = tempfile::tempdir().unwrap();
        let git_dir = tmp.path().join(".git");
        std::fs::create_dir(&git_dir).unwrap();
        let lines: String = (0..3000)
            .map(|i| format!("[include]\n\tpath = ../c{i}\n"))
            .collect();
        std::fs::write(git_dir.join("config"), &lines).unwrap();
        for i in 0..3000 {
            let more = format!("[include]\n\tpath = d{i}\n[core]\n\thooksPath = h{i}\n");
            std::fs::write(tmp.path().join(format!("c{i}")), more).unwrap();
        }
        let mut cache = ConfigCache::default();
        let gathered = cache.repository(&git_dir);
        assert_eq!(gathered.includes.len(), MAX_INCLUDES_GATHERED);
        assert_eq!(gathered.hooks.len(), MAX_CONFIGS_GATHERED - 1);
        assert_eq!(cache.0.len(), MAX_CONFIGS_GATHERED);
        assert_eq!(gathered.includes[0], git_dir.join("../c0"));
    }

    #[test]
    fn resolves_spellings_to_one_path() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(tmp.path().join("ws/secrets")).unwrap();
        std::fs::create_dir_all(tmp.path().join("ws/notes")).unwrap();
        std::fs::create_dir_all(tmp.path().join("ws/secrets/sub")).unwrap();
        std::fs::write(tmp.path().join("ws/secrets/key.txt"), "k").unwrap();
        std::os::unix::fs::symlink("secrets", tmp.path().join("ws/s")).unwrap();
        std::os::unix::fs::symlink("../key.txt", tmp.path().join("ws/secrets/sub/up")).unwrap();
        let ws = Workspace::new(tmp.path().join("ws")).unwrap();
        let abs = format!("{}/secrets/key.txt", ws.root().display());
        for spelling in [
            "secrets/key.txt",
            "./secrets//key.txt",
            "notes/../secrets/key.txt",
            "s/key.txt",
            "s/../s/./key.txt",
            "secrets/sub/../key.txt",
            "s/sub/up",
            "secrets/sub/../sub/../key.txt",
            abs.as_str(),
        ] {
            let r = ws.resolve(spelling).unwrap();
            assert_eq!(r.display(), "secrets/key.txt", "{spelling}");
            assert!(r.exists());
        }
        assert_eq!(ws.resolve(".").unwrap().display(), ".");
        assert_eq!(ws.resolve("secrets/sub/..").unwrap().display(), "secrets");
        assert_eq!(ws.resolve("s/sub/../../notes").unwrap().display(), "notes");
        assert!(!ws.resolve("new/file").unwrap().exists());
        assert_eq!(ws.resolve("new/a/../b").unwrap().display(), "new/b");
    }

    #[test]
    #[cfg(target_os = "linux")]
    fn the_one_step_resolution_agrees_with_the_walk_and_leaves_it_links_and_dot_dots() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("ws");
        std::fs::create_dir_all(root.join("a/b/c")).unwrap();
        std::fs::write(root.join("a/b/c/f.txt"), "abc").unwrap();
        std::fs::write(root.join("a/top.txt"), "x").unwrap();
        let fifo = std::process::Command::new("mkfifo")
            .arg(root.join("a/b/fifo"))
            .status()
            .unwrap();
        assert!(fifo.success());
        std::os::unix::fs::symlink("b", root.join("a/lb")).unwrap();
        std::os::unix::fs::symlink("c/f.txt", root.join("a/b/lf")).unwrap();
        std::os::unix::fs::symlink("/etc", root.join("a/out")).unwrap();
        let ws = Workspace::new(&root).unwrap();
        let walked = |p: &str| ws.walk(p, Path::new(p)).unwrap();
        for p in [
            "a/b",
            "a/b/c/f.txt",
            "./a/b/c",
            "a//b/c/f.txt",
            "a/b/c/",
            "a/b/fifo",
        ] {
            let one_step = ws
                .resolve_plain(Path::new(p))
                .unwrap_or_else(|| panic!("{p}: not resolved in one step"));
            assert_eq!(one_step, walked(p), "{p}");
            assert_eq!(ws.resolve(p).unwrap(), one_step, "{p}");
        }
        assert_eq!(walked("a/b/fifo").seen(), Some(Seen::Other));
        for p in [
            "a/lb/c/f.txt",
            "a/b/lf",
            "a/b/../top.txt",
            "a/b/missing.txt",
            "a/top.txt/x",
            "a/b/c/f.txt/",
            "a",
            "a/out/passwd",
        ] {
            assert_eq!(ws.resolve_plain(Path::new(p)), None, "{p}");
        }
        assert_eq!(ws.resolve("a/lb/c/f.txt").unwrap(), walked("a/b/c/f.txt"));
        assert_eq!(ws.resolve("a/b/lf").unwrap(), walked("a/b/c/f.txt"));
        assert!(ws.resolve("a/out/passwd").is_err());
    }

    #[test]
    fn a_resolution_says_what_it_saw_and_small_local_files_are_read_inline() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(tmp.path().join("ws/notes")).unwrap();
        std::fs::write(tmp.path().join("ws/notes/a.txt"), "abc").unwrap();
        let big = vec![b'x'; INLINE_READ_BYTES as usize + 1];
        std::fs::write(tmp.path().join("ws/big.txt"), big).unwrap();
        std::os::unix::fs::symlink("notes/a.txt", tmp.path().join("ws/link")).unwrap();
        let ws = Workspace::new(tmp.path().join("ws")).unwrap();
        assert!(
            ws.is_local(),
            "a temporary directory is on a local file system"
        );
        let seen = |p: &str| ws.resolve(p).unwrap().seen();
        let Some(Seen::File { len: 3, .. }) = seen("notes/a.txt") else {
            panic!("{:?}", seen("notes/a.txt"));
        };
        // Through a link, the file it names.
        assert_eq!(seen("link"), seen("notes/a.txt"));
        assert_eq!(seen("notes"), Some(Seen::Dir));
        // The walk ended on `..` or found nothing: it did not look.
        assert_eq!(seen("notes/.."), None);
        assert_eq!(seen("notes/missing.txt"), None);
        assert_eq!(seen("."), None);
        let inline = |p: &str| ws.reads_inline(&ws.resolve(p).unwrap());
        assert!(inline("notes/a.txt"));
        assert!(inline("link"));
        assert!(!inline("big.txt"));
        assert!(!inline("notes"));
        assert!(!inline("notes/missing.txt"));
    }

    #[test]
    fn only_local_file_systems_are_local() {
        for local in [0xEF53, 0x0102_1994, 0x5846_5342, 0x9123_683E, 0x794C_7630] {
            assert!(is_local_file_system(local), "{local:#x}");
        }
        // NFS, SMB2, CIFS, FUSE, 9p, an unknown kind.
        for remote in [
            0x6969,
            0xFE53_4D42,
            0xFF53_4D42,
            0x6573_5546,
            0x0102_1997,
            0x1234,
        ] {
            assert!(!is_local_file_system(remote), "{remote:#x}");
        }
    }

    #[test]
    fn refuses_what_leaves() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(tmp.path().join("ws")).unwrap();
        std::fs::create_dir_all(tmp.path().join("outside")).unwrap();
        std::os::unix::fs::symlink("../outside", tmp.path().join("ws/out")).unwrap();
        std::os::unix::fs::symlink("loop", tmp.path().join("ws/loop")).unwrap();
        let ws = Workspace::new(tmp.path().join("ws")).unwrap();
        for bad in [
            "..",
            "../outside/x",
            "out/x",
            "out",
            "/etc/passwd",
            "loop",
            "a\0b",
        ] {
            let err = ws.resolve(bad).unwrap_err();
            assert_eq!(err.kind, ErrorKind::Denied, "{bad}: {err:?}");
        }
    }
}
