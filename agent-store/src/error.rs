//! The store's errors.

use std::path::PathBuf;

/// What a store that keys runs by any text takes as a run id.
#[cfg(any(feature = "sled", feature = "postgres"))]
pub(crate) const ANY_RUN_ID: &str = "ids are non-empty and contain no NUL byte";

/// Why a store operation failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The run's log is not at the version the commit expected.
    #[error("run {run_id} is at version {actual}, the commit expected {expected}")]
    Conflict {
        /// The run.
        run_id: String,
        /// The version the commit was tagged with.
        expected: u64,
        /// The version the log is at.
        actual: u64,
    },
    /// The entries of a commit do not continue the log.
    #[error("run {run_id}: entry version {found} does not follow {expected_after}")]
    NotContiguous {
        /// The run.
        run_id: String,
        /// The version before it.
        expected_after: u64,
        /// The version found.
        found: u64,
    },
    /// No run has that id.
    #[error("no run {0:?} in this store")]
    RunNotFound(String),
    /// A run id that cannot be stored.
    #[error("invalid run id {id:?}: {rule}")]
    InvalidRunId {
        /// The id given.
        id: String,
        /// What this store takes as a run id.
        rule: &'static str,
    },
    /// The directory exists but is something else.
    #[error("{} is not an agent store (it holds other files)", .0.display())]
    NotAStore(PathBuf),
    /// The store's path names a file, or goes through one.
    #[error("{}", on_a_file(path, file))]
    NotADirectory {
        /// The store.
        path: PathBuf,
        /// The file: the store's path itself, or a directory's place on its way.
        file: PathBuf,
    },
    /// The store was written by an unknown format version.
    #[error("{} has store format {found:?}, this agent reads format {expected}; use a matching agent version", path.display())]
    UnknownFormat {
        /// The store.
        path: PathBuf,
        /// The format found.
        found: String,
        /// The format this code reads.
        expected: u32,
    },
    /// Another process holds the store.
    #[error(
        "the store {} is in use by another agent process; wait for it to finish",
        path.display()
    )]
    Locked {
        /// The store.
        path: PathBuf,
        /// The lock error.
        message: String,
    },
    /// Another process drives the run: only one may write a run at a time.
    #[error("run {run_id} is being driven by {by}; wait for it to end")]
    Busy {
        /// The run.
        run_id: String,
        /// Who drives it (`process 1234`).
        by: String,
    },
    /// The store lost committed data (its database was damaged): reads of what it still
    /// holds work, writes are refused.
    #[error(
        "the store {} is damaged: {message}; nothing was changed, what it still holds can be \
         read, restore it from a backup or move it aside",
        path.display()
    )]
    Damaged {
        /// The store.
        path: PathBuf,
        /// What is missing.
        message: String,
    },
    /// A record that does not decode.
    #[error("garbled record in the store ({what}): {message}")]
    Corrupt {
        /// Which record.
        what: String,
        /// The decoder's error.
        message: String,
    },
    /// The storage engine failed.
    #[error("storage error: {0}")]
    Engine(String),
    /// This process's lease on the run was taken over (it expired): another worker or
    /// process drives the run now, and nothing this one wanted to commit was written.
    #[error(
        "the lease on run {0} ran out and was taken over (another worker or process drives \
         it now); nothing was written"
    )]
    LeaseLost(String),
}

#[cfg(feature = "sled")]
impl From<sled::Error> for StoreError {
    fn from(e: sled::Error) -> Self {
        match e {
            // sled's text for it carries a debug dump of no use to a person.
            sled::Error::Corruption { .. } => {
                StoreError::Engine("sled reports corrupted data".to_owned())
            }
            other => StoreError::Engine(other.to_string()),
        }
    }
}

#[cfg(feature = "sled")]
impl StoreError {
    /// The error for a store whose path `read_dir` found a file on (`ENOTDIR`).
    pub(crate) fn not_a_directory(path: &std::path::Path) -> StoreError {
        let file = path
            .ancestors()
            .find(|a| a.is_file())
            .unwrap_or(path)
            .to_path_buf();
        StoreError::NotADirectory {
            path: path.to_path_buf(),
            file,
        }
    }
}

fn on_a_file(path: &std::path::Path, file: &std::path::Path) -> String {
    if path == file {
        format!(
            "{} is a file, not an agent store (a store is a directory)",
            path.display()
        )
    } else {
        format!(
            "{} cannot be an agent store: {} is a file, not a directory",
            path.display(),
            file.display()
        )
    }
}
