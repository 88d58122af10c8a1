//! A store of format 1 (one sled database for all runs, at the top of the directory) is
//! converted in place: each run is copied into a database of its own in a staging
//! directory, then the old files move aside into `legacy-format-1/` and the new layout
//! moves up. A crash at any point converts again from what is left: before the move the
//! staging copy is thrown away, after its start the move is finished.

use std::path::Path;

use crate::dir::{LAYOUT_FILE, files};
use crate::{SledStore, Store, StoreError};

/// Where the new layout is built.
const STAGING: &str = "converting-to-format-2";
/// Where the old files are kept.
pub(super) const LEGACY: &str = "legacy-format-1";

/// Whether a directory without the layout file holds a format-1 store, or one whose
/// conversion was interrupted.
pub(super) fn is_format_1(names: &[String]) -> bool {
    names.iter().any(|n| n == "db" || n == LEGACY)
}

fn is_old_file(name: &str) -> bool {
    matches!(
        name,
        "conf" | "db" | "blobs" | "agent-commits" | "snapshots-set-aside"
    ) || name.starts_with("snap.")
}

/// Converts the store in `dir`, unless another process converted it since `dir` was
/// listed. Conversions take turns: two processes opening one format-1 store at once would
/// otherwise each throw away or move the other's staged copy.
pub(super) fn convert(dir: &Path) -> Result<(), StoreError> {
    let _turn = take_turn(dir)?;
    if dir.join(LAYOUT_FILE).exists() {
        return Ok(());
    }
    let staging = dir.join(STAGING);
    if !dir.join(LEGACY).exists() {
        if staging.exists() {
            std::fs::remove_dir_all(&staging).map_err(|e| files::io_error(&staging, &e))?;
        }
        copy_runs(dir, &staging)?;
    }
    move_up(dir, &staging)
}

/// An exclusive lock on the directory itself (`flock`, released when the handle is
/// dropped or the process dies), held for the whole conversion; waits for another
/// process's. Nothing else takes it, so a store in use is not held up.
#[cfg(unix)]
fn take_turn(dir: &Path) -> Result<std::fs::File, StoreError> {
    use rustix::fs::{FlockOperation, flock};
    let io = |e: std::io::Error| files::io_error(dir, &e);
    let handle = std::fs::File::open(dir).map_err(io)?;
    match flock(&handle, FlockOperation::LockExclusive) {
        // A file system without locks (some network ones): converted as before, unserialised.
        Ok(()) | Err(rustix::io::Errno::NOLCK | rustix::io::Errno::OPNOTSUPP) => Ok(handle),
        Err(e) => Err(io(e.into())),
    }
}

/// Elsewhere no lock: conversions are not serialised.
#[cfg(not(unix))]
fn take_turn(_dir: &Path) -> Result<(), StoreError> {
    Ok(())
}

/// Copies every run and blob of the format-1 store in `dir` into a new layout at
/// `staging`, durably.
fn copy_runs(dir: &Path, staging: &Path) -> Result<(), StoreError> {
    // Opening it takes its lock: no process uses it while it is copied.
    let old = SledStore::open(dir)?;
    if let Some(damage) = old.damage() {
        return Err(damage);
    }
    super::create_layout(staging)?;
    let new = super::DirStore::open(staging)?;
    for summary in old.runs()? {
        let log = old.load(&summary.run_id)?;
        new.append(&summary.run_id, 0, &log)?;
        new.release(&summary.run_id);
    }
    for blob in old.blobs() {
        let bytes = blob?;
        new.put_blob(&bytes)?;
    }
    Ok(())
}

/// Moves the old files into [`LEGACY`] and the staged layout up; the layout file last.
fn move_up(dir: &Path, staging: &Path) -> Result<(), StoreError> {
    let legacy = dir.join(LEGACY);
    std::fs::create_dir_all(&legacy).map_err(|e| files::io_error(&legacy, &e))?;
    let rename =
        |from: &Path, to: &Path| std::fs::rename(from, to).map_err(|e| files::io_error(from, &e));
    // The staged runs move up first: while they are still staged, nothing new is up (and
    // a `blobs` up there is sled's).
    if staging.join("runs").exists() {
        for entry in std::fs::read_dir(dir).map_err(|e| files::io_error(dir, &e))? {
            let entry = entry.map_err(|e| files::io_error(dir, &e))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if is_old_file(&name) {
                rename(&entry.path(), &legacy.join(&name))?;
            }
        }
    }
    for name in ["runs", "blobs", "tmp"] {
        let from = staging.join(name);
        if from.exists() {
            rename(&from, &dir.join(name))?;
        }
    }
    let layout = staging.join(LAYOUT_FILE);
    if layout.exists() {
        rename(&layout, &dir.join(LAYOUT_FILE))?;
    }
    std::fs::remove_dir_all(staging).map_err(|e| files::io_error(staging, &e))
}
