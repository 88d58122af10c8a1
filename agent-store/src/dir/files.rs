//! Files any process reads without a lock: each is replaced whole by a rename, so a reader
//! sees the old file or the new one, never a part.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use agent_core::Handle;

use crate::StoreError;

/// A numbered temporary name in `tmp`, unique to this process.
fn temp_name(tmp: &Path, what: &str) -> PathBuf {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    tmp.join(format!("{what}.{}.{n}", std::process::id()))
}

pub(super) fn io_error(path: &Path, e: &std::io::Error) -> StoreError {
    StoreError::Engine(format!("{}: {e}", path.display()))
}

/// Writes `bytes` to `to` through a temporary file in `tmp` and a rename. With `durable`,
/// the file and the directory's entry for it are on disk before this returns.
pub(super) fn replace(
    tmp: &Path,
    to: &Path,
    bytes: &[u8],
    durable: bool,
) -> Result<(), StoreError> {
    let name = to
        .file_name()
        .map_or_else(|| "file".into(), |n| n.to_string_lossy());
    let temp = temp_name(tmp, &name);
    let written = (|| {
        let mut file = std::fs::File::create(&temp)?;
        file.write_all(bytes)?;
        if durable {
            file.sync_all()?;
        }
        std::fs::rename(&temp, to)?;
        if durable && let Some(dir) = to.parent() {
            std::fs::File::open(dir)?.sync_all()?;
        }
        Ok::<(), std::io::Error>(())
    })();
    written.map_err(|e| {
        let _ = std::fs::remove_file(&temp);
        io_error(to, &e)
    })
}

/// Blobs as files named by their digest: written once, durably, before their handle is
/// given out; checked against the digest when read.
#[derive(Debug)]
pub(super) struct Blobs {
    pub(super) dir: PathBuf,
    pub(super) tmp: PathBuf,
}

impl Blobs {
    pub(super) fn put(&self, bytes: &[u8]) -> Result<Handle, StoreError> {
        let handle = Handle::of_bytes(bytes);
        let Handle::Blob(digest) = &handle else {
            unreachable!("of_bytes makes a blob handle");
        };
        let path = self.dir.join(digest);
        if !path.exists() {
            replace(&self.tmp, &path, bytes, true)?;
        }
        Ok(handle)
    }

    pub(super) fn get(&self, handle: &Handle) -> Result<Option<Vec<u8>>, StoreError> {
        let Handle::Blob(digest) = handle else {
            return Ok(None);
        };
        // A digest is lowercase hex; anything else names no file of ours.
        if digest.is_empty() || !digest.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Ok(None);
        }
        let path = self.dir.join(digest);
        let bytes = match std::fs::read(&path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io_error(&path, &e)),
        };
        if &Handle::of_bytes(&bytes) != handle {
            return Err(StoreError::Corrupt {
                what: format!("blob {handle}"),
                message: format!("{} does not hold the bytes it is named for", path.display()),
            });
        }
        Ok(Some(bytes))
    }
}

/// Removes the files in `tmp` last changed longer than `age` ago: what processes that died
/// in the middle of a write left behind. (A live write takes moments, never an hour.)
pub(super) fn sweep(tmp: &Path, age: std::time::Duration) {
    let Ok(entries) = std::fs::read_dir(tmp) else {
        return;
    };
    for entry in entries.filter_map(Result::ok) {
        let old = entry
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|at| at.elapsed().ok())
            .is_some_and(|elapsed| elapsed > age);
        if old {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}
