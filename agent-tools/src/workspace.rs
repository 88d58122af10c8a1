//! Confinement of file and process tools to the workspace root.

use std::io;
use std::path::{Component, Path, PathBuf};

use agent_core::{ErrorKind, ToolError};

/// The directory every path of a file tool is resolved in, and confined to.
#[derive(Clone, Debug)]
pub struct Workspace {
    root: PathBuf,
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
        Ok(Workspace { root })
    }

    /// The canonical root.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Resolves a path the model gave to an existing path inside the workspace.
    ///
    /// Refused: absolute paths outside the root, `..` that climbs out of it, and symlinks
    /// whose target lies outside it. The check is made on the canonical path, so no spelling
    /// of an escape gets through.
    pub fn resolve(&self, path: &str) -> Result<PathBuf, ToolError> {
        let joined = self.join(path)?;
        let canonical = joined.canonicalize().map_err(|e| match e.kind() {
            io::ErrorKind::NotFound => ToolError::new(
                ErrorKind::ExecutionFailed,
                format!("{path}: no such file or directory in the workspace"),
            ),
            _ => ToolError::new(ErrorKind::ExecutionFailed, format!("{path}: {e}")),
        })?;
        self.confine(path, canonical)
    }

    /// Resolves a path to write: it may not exist yet, but whatever of it exists must
    /// resolve inside the workspace (a symlinked parent or target pointing out is refused).
    pub fn resolve_for_write(&self, path: &str) -> Result<PathBuf, ToolError> {
        let joined = self.join(path)?;
        if joined == self.root {
            return Err(escape(path, "is the workspace root itself, not a file"));
        }
        // The longest prefix that exists decides where the write really lands.
        let mut existing = joined.as_path();
        let mut rest = Vec::new();
        loop {
            if existing.symlink_metadata().is_ok() {
                break;
            }
            match (existing.file_name(), existing.parent()) {
                (Some(name), Some(parent)) => {
                    rest.push(name.to_owned());
                    existing = parent;
                }
                _ => return Err(escape(path, "has no existing parent")),
            }
        }
        let canonical = existing.canonicalize().map_err(|e| {
            if existing.is_symlink() {
                // Writing would create the link's target, wherever it points.
                escape(path, "goes through a symlink whose target does not exist")
            } else {
                ToolError::new(ErrorKind::ExecutionFailed, format!("{path}: {e}"))
            }
        })?;
        let mut resolved = self.confine(path, canonical)?;
        for name in rest.into_iter().rev() {
            resolved.push(name);
        }
        Ok(resolved)
    }

    /// The path relative to the root, for messages (`.` for the root itself).
    pub fn display(&self, path: &Path) -> String {
        match path.strip_prefix(&self.root) {
            Ok(rel) if rel.as_os_str().is_empty() => ".".to_owned(),
            Ok(rel) => rel.display().to_string(),
            Err(_) => path.display().to_string(),
        }
    }

    fn join(&self, path: &str) -> Result<PathBuf, ToolError> {
        if path.contains('\0') {
            return Err(escape(path, "contains a NUL byte"));
        }
        let given = Path::new(path);
        let mut out = if given.is_absolute() {
            PathBuf::new()
        } else {
            self.root.clone()
        };
        for component in given.components() {
            match component {
                Component::Prefix(_) | Component::RootDir => out.push(component.as_os_str()),
                Component::CurDir => {}
                Component::ParentDir => {
                    if !out.pop() || !out.starts_with(&self.root) {
                        return Err(escape(path, "climbs out of the workspace"));
                    }
                }
                Component::Normal(part) => out.push(part),
            }
        }
        if !out.starts_with(&self.root) {
            return Err(escape(path, "is outside the workspace"));
        }
        Ok(out)
    }

    fn confine(&self, path: &str, canonical: PathBuf) -> Result<PathBuf, ToolError> {
        if canonical.starts_with(&self.root) {
            Ok(canonical)
        } else {
            Err(escape(
                path,
                "resolves (through a symlink) outside the workspace",
            ))
        }
    }
}

fn escape(path: &str, why: &str) -> ToolError {
    ToolError::new(
        ErrorKind::Denied,
        format!("path {path:?} {why}; use a path relative to the workspace root"),
    )
}
