//! The embedded store that any number of processes share: a directory with a sled
//! database per run, so that a process locks only the runs it drives.
//!
//! ```text
//! STORE/agent-store         the layout's format
//! STORE/runs/ID/            the run's log: a SledStore, held by the process driving it
//! STORE/runs/ID.json        the run's summary, rewritten in place at each commit
//! STORE/runs/ID.owner       who drives it: pid and socket, while a process does
//! STORE/runs/ID.sock        where that process serves the run's committed log
//! STORE/blobs/DIGEST        blobs, one file each, written once by a rename
//! STORE/tmp/                files being written
//! ```
//!
//! Starting runs side by side needs no coordination. Listing runs reads the summaries.
//! Reading a run that a process drives asks that process over its socket; reading any
//! other run opens its database for the moment of the read. Taking a run (to write it)
//! takes its database's lock: a second taker is told which process has it.

mod files;
mod migrate;
mod owner;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use agent_core::{Entry, Handle};

use crate::{RunSummary, SledStore, Store, StoreError};
use files::Blobs;
use owner::{OwnerFile, Served, Server};

/// The layout this code writes and reads (format 1 was one sled database for all runs).
pub const DIR_FORMAT_VERSION: u32 = 2;
/// The file that marks a directory as a store of this layout.
const LAYOUT_FILE: &str = "agent-store";
/// How long taking a run waits for readers that opened its database for a moment (an
/// owner that answers is not waited for).
const TAKE_WAIT: Duration = Duration::from_secs(3);
/// How long a reader tries before it reports the run as held by a process that does not
/// answer.
const READ_WAIT: Duration = Duration::from_secs(3);
/// How long each attempt of a reader to open a run's database waits for its lock.
const READ_LOCK_WAIT: Duration = Duration::from_millis(50);
/// Temporary files older than this were left by a process that died while writing them.
const STALE_TEMP: Duration = Duration::from_secs(3600);
/// The longest run id: it names files.
const MAX_RUN_ID: usize = 100;

/// The embedded store that any number of processes share: a directory with a sled
/// database per run, so that a process locks only the runs it drives.
///
/// ```text
/// STORE/agent-store         the layout's format
/// STORE/runs/ID/            the run's log: a SledStore, held by the process driving it
/// STORE/runs/ID.json        the run's summary, rewritten in place at each commit
/// STORE/runs/ID.owner       who drives it: pid and socket, while a process does
/// STORE/runs/ID.sock        where that process serves the run's committed log
/// STORE/blobs/DIGEST        blobs, one file each, written once by a rename
/// STORE/tmp/                files being written
/// ```
///
/// Listing runs reads the summaries. Reading a run that another process drives asks that
/// process over its socket; reading any other run opens its database for the moment of
/// the read. Appending to a run takes it ([`DirStore::take`]): a run another process
/// drives is [`StoreError::Busy`].
///
/// ```
/// use agent_store::{DirStore, Store};
///
/// let dir = tempfile::tempdir().unwrap();
/// let a = DirStore::open(dir.path()).unwrap();
/// let b = DirStore::open(dir.path()).unwrap(); // as a second process would
/// assert!(a.runs().unwrap().is_empty() && b.runs().unwrap().is_empty());
/// ```
pub struct DirStore {
    root: PathBuf,
    runs: PathBuf,
    tmp: PathBuf,
    blobs: Blobs,
    held: Mutex<HashMap<String, Arc<Held>>>,
    /// One gate per run being taken: taking a run (which may wait for its lock) holds up
    /// no other run's.
    taking: Mutex<HashMap<String, Arc<Mutex<()>>>>,
    /// The first damage found in a run's database this process opened.
    damage: Mutex<Option<StoreError>>,
}

impl std::fmt::Debug for DirStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DirStore")
            .field("root", &self.root)
            .finish()
    }
}

/// A run this process drives.
struct Held {
    served: Arc<Served>,
    /// The summary file, kept open, and the length written to it.
    summary_file: Mutex<(std::fs::File, usize)>,
    owner_file: PathBuf,
    /// Stops listening when the run is let go.
    _server: Server,
}

impl Drop for Held {
    fn drop(&mut self) {
        // Only our own claim is removed: a crash of ours may have let another take over.
        if OwnerFile::read(&self.owner_file).is_some_and(|o| o.pid == std::process::id()) {
            let _ = std::fs::remove_file(&self.owner_file);
        }
    }
}

impl DirStore {
    /// Opens the store in `dir`, creating it if the directory is missing or empty. A
    /// directory holding a store of the earlier layout (one sled database for all runs) is
    /// converted first, its files kept aside in `legacy-format-1/`.
    pub fn open(dir: impl AsRef<Path>) -> Result<DirStore, StoreError> {
        let given = dir.as_ref();
        let names: Vec<String> = match std::fs::read_dir(given) {
            Ok(entries) => entries
                .filter_map(Result::ok)
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) if e.kind() == std::io::ErrorKind::NotADirectory => {
                return Err(StoreError::not_a_directory(given));
            }
            Err(e) => return Err(files::io_error(given, &e)),
        };
        DirStore::open_listed(given, &names)
    }

    /// Opens the store in `given`, whose names were listed in `names` a moment before:
    /// another process may have made the store since.
    fn open_listed(given: &Path, names: &[String]) -> Result<DirStore, StoreError> {
        let has = |name: &str| names.iter().any(|n| n == name);
        if has(LAYOUT_FILE) {
            check_layout(given)?;
        } else if names.is_empty() || creation_cut_short(given, names) {
            create_layout(given)?;
        } else if given.join(LAYOUT_FILE).exists() {
            // Listed while another process was making the store, which it has since
            // finished (its layout file is written before any run or blob) and begun to use.
            check_layout(given)?;
        } else if migrate::is_format_1(names) {
            migrate::convert(given)?;
            // Converted here, or by another process meanwhile (by another agent version?).
            check_layout(given)?;
        } else {
            return Err(StoreError::NotAStore(given.to_path_buf()));
        }
        let root = std::fs::canonicalize(given).map_err(|e| files::io_error(given, &e))?;
        let tmp = root.join("tmp");
        files::sweep(&tmp, STALE_TEMP);
        Ok(DirStore {
            runs: root.join("runs"),
            blobs: Blobs {
                dir: root.join("blobs"),
                tmp: tmp.clone(),
            },
            tmp,
            root,
            held: Mutex::default(),
            taking: Mutex::default(),
            damage: Mutex::default(),
        })
    }

    /// Opens an existing store only; a missing directory is `Ok(None)`.
    pub fn open_existing(dir: impl AsRef<Path>) -> Result<Option<DirStore>, StoreError> {
        if dir.as_ref().exists() {
            DirStore::open(dir).map(Some)
        } else {
            Ok(None)
        }
    }

    /// The store's directory.
    pub fn path(&self) -> &Path {
        &self.root
    }

    /// Damage found in a run's database this process opened: what it holds can be read,
    /// writes to it are refused.
    pub fn damage(&self) -> Option<StoreError> {
        let damage = self.damage.lock().unwrap_or_else(|p| p.into_inner());
        damage.as_ref().map(|d| match d {
            StoreError::Damaged { path, message } => StoreError::Damaged {
                path: path.clone(),
                message: message.clone(),
            },
            other => StoreError::Engine(other.to_string()),
        })
    }

    /// Takes an existing run for this process to drive: no other process can write it until
    /// this one lets go ([`DirStore::release`], or the end of the process). A run another
    /// process drives is [`StoreError::Busy`], naming it.
    pub fn take(&self, run_id: &str) -> Result<(), StoreError> {
        check_run_id(run_id)?;
        if !self.run_dir(run_id).is_dir() {
            return Err(StoreError::RunNotFound(run_id.to_owned()));
        }
        self.held(run_id).map(drop)
    }

    /// Lets go of a run this process drives, so that another process can take it.
    pub fn release(&self, run_id: &str) {
        let held = self
            .held
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(run_id);
        drop(held);
    }

    /// The process driving the run, if one is: this one or another that answers.
    pub fn driver(&self, run_id: &str) -> Option<u32> {
        if self.lookup(run_id).is_some() {
            return Some(std::process::id());
        }
        OwnerFile::read(&self.owner_path(run_id))
            .filter(OwnerFile::alive)
            .map(|o| o.pid)
    }

    fn run_dir(&self, run_id: &str) -> PathBuf {
        self.runs.join(run_id)
    }

    fn owner_path(&self, run_id: &str) -> PathBuf {
        self.runs.join(format!("{run_id}.owner"))
    }

    fn summary_path(&self, run_id: &str) -> PathBuf {
        self.runs.join(format!("{run_id}.json"))
    }

    fn note_damage(&self, db: &SledStore) {
        if let Some(damage) = db.damage() {
            let mut slot = self.damage.lock().unwrap_or_else(|p| p.into_inner());
            slot.get_or_insert(damage);
        }
    }

    fn busy(&self, run_id: &str) -> StoreError {
        let owner = OwnerFile::read(&self.owner_path(run_id));
        StoreError::Busy {
            run_id: run_id.to_owned(),
            by: match owner {
                Some(o) if o.alive() => format!("process {}", o.pid),
                Some(o) => format!("process {}, which does not answer", o.pid),
                None => "another process".to_owned(),
            },
        }
    }

    /// The run held by this process, taking it (and creating its directory) if needed.
    fn held(&self, run_id: &str) -> Result<Arc<Held>, StoreError> {
        if let Some(run) = self.lookup(run_id) {
            return Ok(run);
        }
        let gate = Arc::clone(
            self.taking
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .entry(run_id.to_owned())
                .or_default(),
        );
        let taken = {
            let _gate = gate.lock().unwrap_or_else(|p| p.into_inner());
            // Another thread of this process may have taken it while this one waited.
            match self.lookup(run_id) {
                Some(run) => Ok(run),
                None => self.take_now(run_id),
            }
        };
        self.taking
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(run_id);
        taken
    }

    fn lookup(&self, run_id: &str) -> Option<Arc<Held>> {
        self.held
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(run_id)
            .cloned()
    }

    /// Takes the run: its database's lock, its summary file, its socket and owner file.
    fn take_now(&self, run_id: &str) -> Result<Arc<Held>, StoreError> {
        let dir = self.run_dir(run_id);
        std::fs::create_dir_all(&dir).map_err(|e| files::io_error(&dir, &e))?;
        let deadline = Instant::now() + TAKE_WAIT;
        let db = loop {
            match SledStore::open_waiting(&dir, READ_LOCK_WAIT) {
                Ok(db) => break db,
                // A reader holds it for a moment; an owner that answers holds it for good.
                Err(StoreError::Locked { .. })
                    if Instant::now() < deadline
                        && !OwnerFile::read(&self.owner_path(run_id))
                            .is_some_and(|o| o.alive()) => {}
                Err(StoreError::Locked { .. }) => return Err(self.busy(run_id)),
                Err(e) => return Err(e),
            }
        };
        self.note_damage(&db);
        if let Some(damage) = db.damage() {
            return Err(damage);
        }
        let summary = db
            .summary(run_id)
            .unwrap_or_else(|| RunSummary::new(run_id));
        // Written whole (a process that died between a commit and its summary left it
        // behind), then kept open and rewritten in place at each commit.
        self.write_summary(&summary)?;
        let path = self.summary_path(run_id);
        let file = std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .map_err(|e| files::io_error(&path, &e))?;
        let written = summary.encode()?.len();
        let served = Arc::new(Served {
            run_id: run_id.to_owned(),
            durable: summary.version.into(),
            summary: Mutex::new(summary),
            db,
            watch: Mutex::default(),
            moved: std::sync::Condvar::new(),
            readers: 0.into(),
            stop_asked: false.into(),
            told: Mutex::default(),
        });
        let socket = owner::socket_path(&dir);
        let server = Server::start(socket.clone(), run_id, Arc::clone(&served))?;
        let owner_file = self.owner_path(run_id);
        let claim = OwnerFile {
            pid: std::process::id(),
            socket,
            since_ms: now_ms(),
        };
        let bytes = serde_json::to_vec(&claim).map_err(|e| StoreError::Engine(e.to_string()))?;
        files::replace(&self.tmp, &owner_file, &bytes, false)?;
        let run = Arc::new(Held {
            served,
            summary_file: Mutex::new((file, written)),
            owner_file,
            _server: server,
        });
        self.held
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(run_id.to_owned(), Arc::clone(&run));
        Ok(run)
    }

    fn write_summary(&self, summary: &RunSummary) -> Result<(), StoreError> {
        let bytes = summary.encode()?;
        // Not flushed: the run's database is the truth, and whoever takes the run next
        // writes its summary again from it.
        files::replace(
            &self.tmp,
            &self.summary_path(&summary.run_id),
            &bytes,
            false,
        )
    }

    /// Reads a run no process here drives: from the process that drives it, or from its
    /// database when none does.
    fn read_elsewhere<T>(
        &self,
        run_id: &str,
        from_owner: impl Fn(&OwnerFile) -> Option<T>,
        from_db: impl Fn(&SledStore) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        check_run_id(run_id)?;
        if !self.run_dir(run_id).is_dir() {
            return Err(StoreError::RunNotFound(run_id.to_owned()));
        }
        let deadline = Instant::now() + READ_WAIT;
        loop {
            if let Some(owner) = OwnerFile::read(&self.owner_path(run_id))
                && let Some(found) = from_owner(&owner)
            {
                return Ok(found);
            }
            match read_db(&self.run_dir(run_id)) {
                // Made, its database not yet: the run has nothing to read yet.
                Ok(None) => return Err(StoreError::RunNotFound(run_id.to_owned())),
                Ok(Some(db)) => {
                    self.note_damage(&db);
                    return from_db(&db);
                }
                Err(StoreError::Locked { .. }) if Instant::now() < deadline => {}
                Err(StoreError::Locked { .. }) => return Err(self.busy(run_id)),
                Err(e) => return Err(e),
            }
        }
    }

    /// The summary of a run as the process driving it has it (when its file was read
    /// half written).
    fn owner_summary(&self, run_id: &str) -> Option<RunSummary> {
        if let Some(run) = self
            .held
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(run_id)
        {
            return Some(
                run.served
                    .summary
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .clone(),
            );
        }
        owner::summary(&OwnerFile::read(&self.owner_path(run_id))?.socket)
    }

    /// A summary that may be stale (its process died before writing the last one), read
    /// again from the run's database if nobody holds it.
    fn refreshed(&self, summary: RunSummary) -> RunSummary {
        let dir = self.run_dir(&summary.run_id);
        let Ok(Some(db)) = read_db(&dir) else {
            return summary;
        };
        self.note_damage(&db);
        match db.summary(&summary.run_id) {
            Some(fresh) if fresh != summary => {
                let _ = self.write_summary(&fresh);
                fresh
            }
            _ => summary,
        }
    }
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Run ids name files: letters, digits, `-`, `_` and `.` (not first), at most 100.
fn check_run_id(run_id: &str) -> Result<(), StoreError> {
    let fits = !run_id.is_empty()
        && run_id.len() <= MAX_RUN_ID
        && !run_id.starts_with('.')
        && run_id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
    if fits {
        Ok(())
    } else {
        Err(StoreError::InvalidRunId {
            id: run_id.to_owned(),
            rule: "a run id names a file here: 1 to 100 letters, digits, '-', '_' and '.', \
                   the first not a '.' (as the ids `agent run` makes are)",
        })
    }
}

/// A run's database opened to be read, waiting a moment for another handle's lock; `None`
/// when it has none yet. A reader never makes one: a directory its writer has only just
/// made, or one that is no run at all, is left as it is.
fn read_db(dir: &Path) -> Result<Option<SledStore>, StoreError> {
    if !dir.join("db").exists() {
        return Ok(None);
    }
    SledStore::open_waiting(dir, READ_LOCK_WAIT).map(Some)
}

fn layout_text() -> String {
    format!("format={DIR_FORMAT_VERSION} layout=database-per-run\n")
}

/// Whether `dir` holds only what [`create_layout`] makes before its layout file: a store
/// whose creation a crash interrupted, holding no run and no blob yet.
fn creation_cut_short(dir: &Path, names: &[String]) -> bool {
    let empty = |sub: &str| {
        std::fs::read_dir(dir.join(sub)).map_or(true, |mut entries| entries.next().is_none())
    };
    names
        .iter()
        .all(|n| matches!(n.as_str(), "runs" | "blobs" | "tmp"))
        && empty("runs")
        && empty("blobs")
}

fn create_layout(dir: &Path) -> Result<(), StoreError> {
    // The directories this makes, the store's own among them, outermost first.
    let absolute = std::path::absolute(dir).map_err(|e| files::io_error(dir, &e))?;
    let mut made: Vec<&Path> = absolute.ancestors().take_while(|a| !a.exists()).collect();
    made.reverse();
    for sub in ["runs", "blobs", "tmp"] {
        let path = dir.join(sub);
        std::fs::create_dir_all(&path).map_err(|e| files::io_error(&path, &e))?;
    }
    // Written last: a directory without it, emptied of all else, is created again. Its
    // flush makes the names of `runs`, `blobs` and `tmp` durable too.
    files::replace(
        &dir.join("tmp"),
        &dir.join(LAYOUT_FILE),
        layout_text().as_bytes(),
        true,
    )?;
    // And the store's own name, in the directory that holds it (and so on up for each
    // directory made): else a power cut could lose the store with every run in it. A
    // directory this process may write in but not read (`-wx`) cannot be opened to be
    // flushed; the store is made all the same.
    for made in made {
        if let Some(parent) = made.parent() {
            match std::fs::File::open(parent) {
                Ok(dir) => dir.sync_all().map_err(|e| files::io_error(parent, &e))?,
                Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {}
                Err(e) => return Err(files::io_error(parent, &e)),
            }
        }
    }
    Ok(())
}

fn check_layout(dir: &Path) -> Result<(), StoreError> {
    let path = dir.join(LAYOUT_FILE);
    let text = std::fs::read_to_string(&path).map_err(|e| files::io_error(&path, &e))?;
    let found = text
        .split_whitespace()
        .find_map(|w| w.strip_prefix("format="))
        .unwrap_or("none");
    if found != DIR_FORMAT_VERSION.to_string() {
        return Err(StoreError::UnknownFormat {
            path: dir.to_path_buf(),
            found: found.to_owned(),
            expected: DIR_FORMAT_VERSION,
        });
    }
    for sub in ["runs", "blobs", "tmp"] {
        let path = dir.join(sub);
        std::fs::create_dir_all(&path).map_err(|e| files::io_error(&path, &e))?;
    }
    Ok(())
}

impl Store for DirStore {
    fn append(
        &self,
        run_id: &str,
        expected_version: u64,
        entries: &[Entry],
    ) -> Result<u64, StoreError> {
        self.append_encoded(run_id, expected_version, entries, &[])
    }

    fn append_encoded(
        &self,
        run_id: &str,
        expected_version: u64,
        entries: &[Entry],
        encoded: &[Vec<u8>],
    ) -> Result<u64, StoreError> {
        check_run_id(run_id)?;
        let run = self.held(run_id)?;
        let version = run
            .served
            .db
            .append_encoded(run_id, expected_version, entries, encoded)?;
        run.served.committed(version);
        let mut summary = run.served.summary.lock().unwrap_or_else(|p| p.into_inner());
        // The run's database folded the entries into its summary; not folded again here.
        let Some(now) = run.served.db.summary(run_id) else {
            return Ok(version);
        };
        let due = crate::sled_store::summary_due(&crate::sled_store::Due::of(&summary), &now);
        *summary = now;
        // The file is written when the database writes its own summary (a new run, a
        // change of status, every 128 entries); meanwhile readers ask the owner, which
        // serves the summary as of the last commit.
        if !due {
            return Ok(version);
        }
        // In place, padded to the length last written: one write, no new file. A reader
        // that meets it half written asks the owner instead. Not flushed: the run's
        // database is the truth, and whoever takes the run next writes it again from it.
        let mut bytes = summary.encode()?;
        let mut file = run.summary_file.lock().unwrap_or_else(|p| p.into_inner());
        if bytes.len() < file.1 {
            bytes.resize(file.1, b' ');
        }
        {
            use std::os::unix::fs::FileExt;
            file.0
                .write_all_at(&bytes, 0)
                .map_err(|e| files::io_error(&self.summary_path(run_id), &e))?;
        }
        file.1 = bytes.len();
        Ok(version)
    }

    fn load(&self, run_id: &str) -> Result<Vec<Entry>, StoreError> {
        self.load_from(run_id, 1)
    }

    fn load_from(&self, run_id: &str, from: u64) -> Result<Vec<Entry>, StoreError> {
        if let Some(run) = self.lookup(run_id) {
            return run.served.db.load_from(run_id, from);
        }
        self.read_elsewhere(
            run_id,
            |owner| owner::load_from(&owner.socket, from),
            |db| db.load_from(run_id, from),
        )
    }

    /// Asks the process that drives the run to answer when it commits. A run nobody drives
    /// is answered at once with what it holds: no commit comes until someone takes it.
    fn wait_from(&self, run_id: &str, from: u64, wait: Duration) -> Result<Vec<Entry>, StoreError> {
        check_run_id(run_id)?;
        if let Some(run) = self.lookup(run_id) {
            run.served.wait_past(from, wait);
            return run.served.db.load_from(run_id, from);
        }
        let owner = OwnerFile::read(&self.owner_path(run_id));
        if let Some(found) = owner
            .as_ref()
            .and_then(|owner| owner::wait_from(&owner.socket, from, wait))
        {
            return Ok(found);
        }
        // An owner that is there but did not answer the wait: an earlier `agent`, which
        // does not know it, or one that is stopped (it holds the database all the same).
        // Asked plainly after a pause, not over and over.
        if let Some(owner) = owner.filter(OwnerFile::alive) {
            std::thread::sleep(crate::FOLLOW_POLL.min(wait));
            return Ok(owner::load_from(&owner.socket, from).unwrap_or_default());
        }
        self.load_from(run_id, from)
    }

    /// Tells the process that drives the run, over its socket (or this one, directly).
    fn ask_to_stop(&self, run_id: &str) -> Result<bool, StoreError> {
        check_run_id(run_id)?;
        if let Some(run) = self.lookup(run_id) {
            run.served.stop_asked.store(true, Ordering::SeqCst);
            return Ok(true);
        }
        Ok(OwnerFile::read(&self.owner_path(run_id))
            .is_some_and(|owner| owner::ask_to_stop(&owner.socket)))
    }

    fn stop_asked(&self, run_id: &str) -> Option<bool> {
        Some(
            self.lookup(run_id)
                .is_some_and(|run| run.served.stop_asked.swap(false, Ordering::SeqCst)),
        )
    }

    fn tell(&self, run_id: &str, text: &str) -> Result<bool, StoreError> {
        check_run_id(run_id)?;
        if let Some(run) = self.lookup(run_id) {
            return Ok(run.served.take_note(text.to_owned()));
        }
        Ok(OwnerFile::read(&self.owner_path(run_id))
            .is_some_and(|owner| owner::tell(&owner.socket, text)))
    }

    fn told(&self, run_id: &str) -> Vec<String> {
        self.lookup(run_id)
            .map(|run| {
                std::mem::take(&mut *run.served.told.lock().unwrap_or_else(|p| p.into_inner()))
            })
            .unwrap_or_default()
    }

    fn runs(&self) -> Result<Vec<RunSummary>, StoreError> {
        let listing = std::fs::read_dir(&self.runs).map_err(|e| files::io_error(&self.runs, &e))?;
        let mut ids = std::collections::BTreeSet::new();
        for entry in listing {
            let entry = entry.map_err(|e| files::io_error(&self.runs, &e))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            let id = name.strip_suffix(".json").unwrap_or(&name);
            if check_run_id(id).is_ok() && self.run_dir(id).is_dir() {
                ids.insert(id.to_owned());
            }
        }
        let mut out = Vec::with_capacity(ids.len());
        for id in ids {
            let driver = self.driver(&id);
            let from_file = || {
                std::fs::read(self.summary_path(&id))
                    .ok()
                    .and_then(|bytes| serde_json::from_slice::<RunSummary>(&bytes).ok())
            };
            // A live run's file lags its commits (it is written now and then): its owner
            // says where it is.
            let summary = if driver.is_some() {
                self.owner_summary(&id).or_else(from_file)
            } else {
                from_file().or_else(|| self.owner_summary(&id))
            };
            let summary = match summary {
                Some(summary) if driver.is_some() || summary.status != "running" => summary,
                // Not driven and not settled: maybe a commit the summary missed.
                Some(summary) => self.refreshed(summary),
                // A run whose first summary was never written.
                None => self.refreshed(RunSummary::new(&id)),
            };
            if summary.version == 0 {
                // Created, never committed to: not a run yet.
                continue;
            }
            out.push(RunSummary {
                live: driver.map(|pid| format!("process {pid}")),
                ..summary
            });
        }
        Ok(out)
    }

    fn put_blob(&self, bytes: &[u8]) -> Result<Handle, StoreError> {
        self.blobs.put(bytes)
    }

    fn get_blob(&self, handle: &Handle) -> Result<Option<Vec<u8>>, StoreError> {
        self.blobs.get(handle)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conformance::{filler, started};
    use std::sync::atomic::Ordering;

    /// Another process's reader of a run this one drives, waiting for the entry after the
    /// last: what it got, sent once it returns.
    fn waiting_reader(
        dir: &Path,
        owner: &DirStore,
    ) -> std::sync::mpsc::Receiver<Result<Vec<Entry>, StoreError>> {
        let reader = DirStore::open(dir).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(reader.wait_from("r", 2, Duration::from_secs(50)));
        });
        // The reader asks over the owner's socket (it does not hold the run); its request
        // is waiting before the test goes on.
        let served = Arc::clone(&owner.lookup("r").unwrap().served);
        while served.readers_waiting() == 0 {
            std::thread::yield_now();
        }
        rx
    }

    /// A reader following a run (`agent show --follow`) is answered by the commit it waits
    /// for, not by the end of its wait.
    #[test]
    fn a_reader_waiting_for_a_commit_is_answered_when_it_is_made() {
        let dir = tempfile::tempdir().unwrap();
        let owner = DirStore::open(dir.path()).unwrap();
        owner.append("r", 0, &[started("r", 1)]).unwrap();
        let answered = waiting_reader(dir.path(), &owner);
        owner.append("r", 1, &[filler(2, 1), filler(3, 2)]).unwrap();
        let got = answered
            .recv_timeout(Duration::from_secs(30))
            .expect("answered at the commit")
            .unwrap();
        assert_eq!(got.iter().map(|e| e.version).collect::<Vec<_>>(), [2, 3]);
    }

    /// Another process hands the one driving a run notes over the run's socket; the driver
    /// takes them once, in order, and holds at most [`owner::MAX_NOTES`] unread.
    #[test]
    fn notes_reach_the_driver_once_and_are_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let owner = DirStore::open(dir.path()).unwrap();
        owner.append("r", 0, &[started("r", 1)]).unwrap();
        let other = DirStore::open(dir.path()).unwrap();
        assert!(!other.tell("nobody", "hi").unwrap(), "nothing drives it");
        for n in 0..owner::MAX_NOTES {
            assert!(other.tell("r", &format!("note {n}")).unwrap());
        }
        assert!(!other.tell("r", "one too many").unwrap());
        let told = owner.told("r");
        assert_eq!(told.len(), owner::MAX_NOTES);
        assert_eq!((told[0].as_str(), told[63].as_str()), ("note 0", "note 63"));
        assert!(owner.told("r").is_empty(), "each is handed out once");
        assert!(other.tell("r", "room again").unwrap());
        assert_eq!(owner.told("r"), ["room again"]);
    }

    /// Another process asks the one driving a run to stop it (`agent cancel`): the request
    /// reaches the owner over the run's socket, which sees it once. A run nobody drives
    /// cannot be asked.
    #[test]
    fn the_process_driving_a_run_is_asked_to_stop_it() {
        let dir = tempfile::tempdir().unwrap();
        let owner = DirStore::open(dir.path()).unwrap();
        owner.append("r", 0, &[started("r", 1)]).unwrap();
        let other = DirStore::open(dir.path()).unwrap();
        assert_eq!(owner.stop_asked("r"), Some(false));
        assert!(other.ask_to_stop("r").unwrap());
        assert_eq!(owner.stop_asked("r"), Some(true));
        assert_eq!(owner.stop_asked("r"), Some(false), "a request is seen once");
        owner.release("r");
        assert!(!other.ask_to_stop("r").unwrap(), "nothing drives it");
        assert_eq!(other.stop_asked("r"), Some(false));
    }

    /// A process of the same user (a command the run started, say) that opens connection
    /// after connection to a run's owner gets a thread for each of the first
    /// [`owner::MAX_READERS`] only; past those, an answer that says the owner is there and
    /// busy: the run is not taken for interrupted, and a reader is served again once
    /// they are gone.
    #[test]
    fn an_owner_serves_a_bounded_number_of_readers_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let owner = DirStore::open(dir.path()).unwrap();
        owner.append("r", 0, &[started("r", 1)]).unwrap();
        let served = Arc::clone(&owner.lookup("r").unwrap().served);
        let socket = owner::socket_path(&owner.run_dir("r"));
        // Connections that never ask: each holds a reader's thread until it closes.
        let held: Vec<std::os::unix::net::UnixStream> = (0..owner::MAX_READERS)
            .map(|_| std::os::unix::net::UnixStream::connect(&socket).unwrap())
            .collect();
        while served.readers.load(Ordering::SeqCst) < owner::MAX_READERS {
            std::thread::yield_now();
        }
        let reader = DirStore::open(dir.path()).unwrap();
        assert_eq!(
            reader.driver("r"),
            Some(std::process::id()),
            "busy, not gone"
        );
        assert!(
            owner::summary(&socket).is_none(),
            "no summary from a busy owner"
        );
        assert!(owner::load_from(&socket, 1).is_none(), "nor entries");
        assert_eq!(served.readers.load(Ordering::SeqCst), owner::MAX_READERS);
        drop(held);
        while served.readers.load(Ordering::SeqCst) > 0 {
            std::thread::yield_now();
        }
        assert_eq!(owner::summary(&socket).map(|s| s.version), Some(1));
    }

    /// ... and by the run being let go, which no commit follows.
    #[test]
    fn a_reader_waiting_for_a_commit_is_answered_when_the_run_is_let_go() {
        let dir = tempfile::tempdir().unwrap();
        let owner = DirStore::open(dir.path()).unwrap();
        owner.append("r", 0, &[started("r", 1)]).unwrap();
        let answered = waiting_reader(dir.path(), &owner);
        owner.release("r");
        let got = answered
            .recv_timeout(Duration::from_secs(30))
            .expect("answered when let go")
            .unwrap();
        assert!(got.is_empty(), "{got:?}");
    }

    /// Twenty processes opening one new store at once: one lists the directory while
    /// another has made `runs`, `blobs` and `tmp` but not yet its layout file, and looks
    /// again once that other has finished and begun a run.
    #[test]
    fn a_store_made_and_used_by_another_process_since_the_listing_is_opened() {
        let dir = tempfile::tempdir().unwrap();
        let other = DirStore::open(dir.path()).unwrap();
        other.append("r", 0, &[started("r", 1)]).unwrap();
        let listed: Vec<String> = ["runs", "blobs", "tmp"].map(String::from).to_vec();
        let store = DirStore::open_listed(dir.path(), &listed).unwrap();
        assert_eq!(store.load("r").unwrap().len(), 1);
    }

    /// The same for a store of format 1: one that another process converted since the
    /// listing is not converted again.
    #[test]
    fn a_store_converted_by_another_process_since_the_listing_is_opened() {
        let dir = tempfile::tempdir().unwrap();
        let old = crate::SledStore::open(dir.path()).unwrap();
        old.append("r", 0, &[started("r", 1)]).unwrap();
        drop(old);
        let listed: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert!(migrate::is_format_1(&listed), "{listed:?}");
        let other = DirStore::open(dir.path()).unwrap();
        assert_eq!(other.load("r").unwrap().len(), 1);
        other.release("r");
        let store = DirStore::open_listed(dir.path(), &listed).unwrap();
        assert_eq!(store.load("r").unwrap().len(), 1);
        assert!(dir.path().join(migrate::LEGACY).join("db").exists());
    }
}
