//! The durable store on sled: one tree of events keyed by run id and big-endian version,
//! one tree of run summaries, one of metadata. A commit is one sled transaction over the
//! events and the summary, flushed to disk before it is confirmed.

use std::path::{Path, PathBuf};
use std::sync::{Condvar, Mutex};
use std::time::Duration;

use agent_core::Entry;
use sled::Transactional;
use sled::transaction::{ConflictableTransactionError, TransactionError};

use crate::{RunSummary, Store, StoreError, check_batch};

/// The format this code writes and reads.
pub const FORMAT_VERSION: u32 = 1;
const FORMAT_KEY: &[u8] = b"format";
/// How long opening waits for a lock a just-dropped handle of this process still holds.
const LOCK_WAIT: Duration = Duration::from_millis(1_000);

/// The sled-backed store. Keep one per process: sled allows one open handle per directory.
#[derive(Debug)]
pub struct SledStore {
    path: PathBuf,
    db: sled::Db,
    events: sled::Tree,
    runs: sled::Tree,
    blobs: sled::Tree,
    flusher: GroupFlush,
}

/// Group commit: concurrent appends share flushes. Each append takes a ticket after its
/// write is in memory; one flush started after that covers it, whoever starts it.
#[derive(Debug, Default)]
struct GroupFlush {
    state: Mutex<FlushState>,
    done: Condvar,
}

#[derive(Debug, Default)]
struct FlushState {
    requested: u64,
    flushed: u64,
    flushing: bool,
    failed: Option<String>,
}

impl GroupFlush {
    /// Returns once a flush that began after this call has finished.
    fn wait_durable(&self, db: &sled::Db) -> Result<(), StoreError> {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        st.requested += 1;
        let ticket = st.requested;
        loop {
            if st.flushed >= ticket {
                return match &st.failed {
                    Some(e) => Err(StoreError::Engine(format!("flush failed: {e}"))),
                    None => Ok(()),
                };
            }
            if !st.flushing {
                st.flushing = true;
                let target = st.requested;
                drop(st);
                let result = db.flush();
                st = self.state.lock().unwrap_or_else(|p| p.into_inner());
                st.flushing = false;
                st.flushed = target;
                st.failed = result.err().map(|e| e.to_string());
                self.done.notify_all();
                continue;
            }
            st = self.done.wait(st).unwrap_or_else(|p| p.into_inner());
        }
    }
}

impl SledStore {
    /// Opens the store in `dir`, creating it if the directory is missing or empty.
    pub fn open(dir: impl AsRef<Path>) -> Result<SledStore, StoreError> {
        let path = dir.as_ref().to_path_buf();
        let names: Vec<String> = match std::fs::read_dir(&path) {
            Ok(entries) => entries
                .filter_map(Result::ok)
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => return Err(StoreError::Engine(format!("{}: {e}", path.display()))),
        };
        // Only sled's own files: a store, or one whose creation a crash interrupted.
        let sled_owned =
            |n: &String| matches!(n.as_str(), "conf" | "db" | "blobs") || n.starts_with("snap.");
        if !names.iter().all(sled_owned) {
            return Err(StoreError::NotAStore(path));
        }
        let db = open_db(&path)?;
        let meta = db.open_tree("meta")?;
        match meta.get(FORMAT_KEY)? {
            Some(found) if found.as_ref() == FORMAT_VERSION.to_string().as_bytes() => {}
            Some(found) => {
                return Err(StoreError::UnknownFormat {
                    path,
                    found: String::from_utf8_lossy(&found).into_owned(),
                    expected: FORMAT_VERSION,
                });
            }
            None if untouched(&db)? => {
                meta.insert(FORMAT_KEY, FORMAT_VERSION.to_string().as_bytes())?;
                db.flush()?;
            }
            None => return Err(StoreError::NotAStore(path)),
        }
        Ok(SledStore {
            events: db.open_tree("events")?,
            runs: db.open_tree("runs")?,
            blobs: db.open_tree("blobs")?,
            flusher: GroupFlush::default(),
            db,
            path,
        })
    }

    /// Opens an existing store only; a missing directory is `Ok(None)`.
    pub fn open_existing(dir: impl AsRef<Path>) -> Result<Option<SledStore>, StoreError> {
        if dir.as_ref().exists() {
            SledStore::open(dir).map(Some)
        } else {
            Ok(None)
        }
    }

    /// The store's directory.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// Whether a database holds nothing at all: new, or created by a process that crashed
/// before writing the format.
fn untouched(db: &sled::Db) -> Result<bool, StoreError> {
    if !db.is_empty() {
        return Ok(false);
    }
    for name in db.tree_names() {
        if db.open_tree(&name)?.first()?.is_some() {
            return Ok(false);
        }
    }
    Ok(true)
}

fn open_db(path: &Path) -> Result<sled::Db, StoreError> {
    let started = std::time::Instant::now();
    loop {
        match sled::open(path) {
            Ok(db) => return Ok(db),
            Err(sled::Error::Io(e)) if e.to_string().contains("could not acquire lock") => {
                // sled releases its file lock a moment after the last handle drops.
                if started.elapsed() >= LOCK_WAIT {
                    return Err(StoreError::Locked {
                        path: path.to_path_buf(),
                        message: e.to_string(),
                    });
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => return Err(e.into()),
        }
    }
}

fn run_key(run_id: &str) -> Result<Vec<u8>, StoreError> {
    if run_id.is_empty() || run_id.contains('\0') {
        return Err(StoreError::InvalidRunId(run_id.to_owned()));
    }
    Ok(run_id.as_bytes().to_vec())
}

/// Run id, a NUL, then the version big-endian: a run's entries sort in version order.
fn event_key(run_id: &str, version: u64) -> Vec<u8> {
    let mut key = Vec::with_capacity(run_id.len() + 9);
    key.extend_from_slice(run_id.as_bytes());
    key.push(0);
    key.extend_from_slice(&version.to_be_bytes());
    key
}

fn decode_summary(what: &str, bytes: &[u8]) -> Result<RunSummary, StoreError> {
    serde_json::from_slice(bytes).map_err(|e| StoreError::Corrupt {
        what: format!("summary of run {what}"),
        message: e.to_string(),
    })
}

impl Store for SledStore {
    fn append(
        &self,
        run_id: &str,
        expected_version: u64,
        entries: &[Entry],
    ) -> Result<u64, StoreError> {
        let key = run_key(run_id)?;
        let encoded: Vec<(Vec<u8>, Vec<u8>)> = entries
            .iter()
            .map(|e| {
                serde_json::to_vec(e)
                    .map(|bytes| (event_key(run_id, e.version), bytes))
                    .map_err(|err| StoreError::Corrupt {
                        what: format!("new entry {} of run {run_id}", e.version),
                        message: err.to_string(),
                    })
            })
            .collect::<Result<_, _>>()?;
        let version = (&self.events, &self.runs)
            .transaction(|(events, runs)| {
                let mut summary = match runs.get(&key)? {
                    Some(bytes) => decode_summary(run_id, &bytes)
                        .map_err(ConflictableTransactionError::Abort)?,
                    None => RunSummary::new(run_id),
                };
                check_batch(run_id, summary.version, expected_version, entries)
                    .map_err(ConflictableTransactionError::Abort)?;
                for (k, v) in &encoded {
                    events.insert(k.as_slice(), v.as_slice())?;
                }
                for entry in entries {
                    summary.apply(entry);
                }
                let bytes = serde_json::to_vec(&summary).map_err(|e| {
                    ConflictableTransactionError::Abort(StoreError::Corrupt {
                        what: format!("summary of run {run_id}"),
                        message: e.to_string(),
                    })
                })?;
                runs.insert(key.as_slice(), bytes)?;
                Ok(summary.version)
            })
            .map_err(|e| match e {
                TransactionError::Abort(err) => err,
                TransactionError::Storage(err) => err.into(),
            })?;
        // The flush is the durability point: confirm nothing before it.
        self.flusher.wait_durable(&self.db)?;
        Ok(version)
    }

    fn load(&self, run_id: &str) -> Result<Vec<Entry>, StoreError> {
        let key = run_key(run_id)?;
        let Some(summary) = self.runs.get(&key)? else {
            return Err(StoreError::RunNotFound(run_id.to_owned()));
        };
        let summary = decode_summary(run_id, &summary)?;
        let mut prefix = key;
        prefix.push(0);
        let mut entries = Vec::with_capacity(usize::try_from(summary.version).unwrap_or(0));
        for item in self.events.scan_prefix(&prefix) {
            let (k, v) = item?;
            let entry: Entry = serde_json::from_slice(&v).map_err(|e| StoreError::Corrupt {
                what: format!("entry {:?} of run {run_id}", k.get(prefix.len()..)),
                message: e.to_string(),
            })?;
            let expected = entries.len() as u64 + 1;
            if entry.version != expected {
                return Err(StoreError::Corrupt {
                    what: format!("run {run_id}"),
                    message: format!("entry {} found where {expected} belongs", entry.version),
                });
            }
            entries.push(entry);
        }
        if entries.len() as u64 != summary.version {
            return Err(StoreError::Corrupt {
                what: format!("run {run_id}"),
                message: format!(
                    "the index says version {}, the log holds {} entries",
                    summary.version,
                    entries.len()
                ),
            });
        }
        Ok(entries)
    }

    fn runs(&self) -> Result<Vec<RunSummary>, StoreError> {
        self.runs
            .iter()
            .map(|item| {
                let (k, v) = item?;
                decode_summary(&String::from_utf8_lossy(&k), &v)
            })
            .collect()
    }

    fn put_blob(&self, bytes: &[u8]) -> Result<String, StoreError> {
        let handle = crate::blob_handle(bytes);
        if !self.blobs.contains_key(handle.as_bytes())? {
            self.blobs.insert(handle.as_bytes(), bytes)?;
            self.flusher.wait_durable(&self.db)?;
        }
        Ok(handle)
    }

    fn get_blob(&self, handle: &str) -> Result<Option<Vec<u8>>, StoreError> {
        Ok(self.blobs.get(handle.as_bytes())?.map(|v| v.to_vec()))
    }
}
