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
//!   between the check and the use is refused, not followed. Writes go to a fresh
//!   temporary file (`O_TMPFILE`, or an exclusive random name) renamed into place: a planted
//!   link is never written through.

use std::collections::VecDeque;
use std::ffi::OsString;
use std::io::{self, Write};
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use agent_core::{ErrorKind, ToolError};
use cap_std::ambient_authority;
use cap_std::fs::Dir;

/// Symlinks followed while resolving one path, at most (as Linux's `MAXSYMLINKS`).
const MAX_LINKS: usize = 40;

/// The directory every path of a file tool is resolved in, and confined to.
#[derive(Clone)]
pub struct Workspace {
    root: PathBuf,
    dir: Arc<Dir>,
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
        Ok(Workspace {
            root,
            dir: Arc::new(dir),
        })
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
        self.walk(path, &start)
    }

    /// Like [`Workspace::resolve`], for a path that must exist.
    pub fn resolve_existing(&self, path: &str) -> Result<Resolved, ToolError> {
        let resolved = self.resolve(path)?;
        if resolved.exists {
            Ok(resolved)
        } else {
            Err(ToolError::new(
                ErrorKind::ExecutionFailed,
                format!("{path}: no such file or directory in the workspace"),
            ))
        }
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
        let mut current: Vec<OsString> = Vec::new();
        let mut links = 0;
        let mut missing = false;
        while let Some(part) = queue.pop_front() {
            if part == ".." {
                if current.pop().is_none() {
                    return Err(escape(path, "climbs out of the workspace"));
                }
                continue;
            }
            current.push(part);
            if missing {
                continue;
            }
            let candidate: PathBuf = current.iter().collect();
            let meta = match self.dir.symlink_metadata(&candidate) {
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
                continue;
            }
            links += 1;
            if links > MAX_LINKS {
                return Err(escape(path, "goes through too many symlinks (a loop?)"));
            }
            let target = self
                .dir
                .read_link_contents(&candidate)
                .map_err(|e| ToolError::new(ErrorKind::ExecutionFailed, format!("{path}: {e}")))?;
            current.pop();
            let target = if target.is_absolute() {
                let Ok(rel) = target.strip_prefix(&self.root) else {
                    return Err(escape(
                        path,
                        "resolves through a symlink to a place outside the workspace",
                    ));
                };
                current.clear();
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
        let rel: PathBuf = current.iter().collect();
        let exists = !missing;
        Ok(Resolved { rel, exists })
    }

    /// Opens a resolved file for reading, beneath the root.
    pub fn open(&self, resolved: &Resolved) -> io::Result<std::fs::File> {
        self.dir
            .open(resolved.cap_path())
            .map(cap_std::fs::File::into_std)
    }

    /// The metadata of a resolved path (links followed, beneath the root).
    pub fn metadata(&self, resolved: &Resolved) -> io::Result<cap_std::fs::Metadata> {
        self.dir.metadata(resolved.cap_path())
    }

    /// A resolved directory's entries: names, and whether each is a directory.
    pub fn entries(&self, resolved: &Resolved) -> io::Result<Vec<(String, bool)>> {
        let dir = self.dir.open_dir(resolved.cap_path())?;
        let mut out = Vec::new();
        for entry in dir.entries()? {
            let entry = entry?;
            let is_dir = entry.file_type().is_ok_and(|t| t.is_dir());
            out.push((entry.file_name().to_string_lossy().into_owned(), is_dir));
        }
        Ok(out)
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
            self.dir.create_dir_all(parent)?;
            self.dir.open_dir(parent)?
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

    #[test]
    fn resolves_spellings_to_one_path() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(tmp.path().join("ws/secrets")).unwrap();
        std::fs::create_dir_all(tmp.path().join("ws/notes")).unwrap();
        std::fs::write(tmp.path().join("ws/secrets/key.txt"), "k").unwrap();
        std::os::unix::fs::symlink("secrets", tmp.path().join("ws/s")).unwrap();
        let ws = Workspace::new(tmp.path().join("ws")).unwrap();
        let abs = format!("{}/secrets/key.txt", ws.root().display());
        for spelling in [
            "secrets/key.txt",
            "./secrets//key.txt",
            "notes/../secrets/key.txt",
            "s/key.txt",
            "s/../s/./key.txt",
            abs.as_str(),
        ] {
            let r = ws.resolve(spelling).unwrap();
            assert_eq!(r.display(), "secrets/key.txt", "{spelling}");
            assert!(r.exists());
        }
        assert_eq!(ws.resolve(".").unwrap().display(), ".");
        assert!(!ws.resolve("new/file").unwrap().exists());
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
