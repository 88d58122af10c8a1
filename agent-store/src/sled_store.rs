//! The durable store on sled: one tree of events keyed by run id and big-endian version,
//! one tree of run summaries, one of metadata. A commit is one record (its entries, under
//! the key of the first), flushed to disk before it is confirmed; the version check is made
//! in memory, by the database's only writer. The run's summary is written beside it only
//! now and then (a new run, a change of status, every [`SUMMARY_EVERY`] entries): opening
//! the store brings it up to date from the records after it.

use std::path::{Path, PathBuf};
use std::sync::{Condvar, Mutex};
use std::time::Duration;

use agent_core::{Entry, Handle};

use crate::{RunSummary, Store, StoreError, check_batch};

/// The format this code writes. Format 2: each commit is one record (format 1 had a record
/// per entry). Format 3: sled's tree may hold split fragments (`vendor/sled`'s
/// `Link::Split`), which sled as published, and so an `agent` before format 3, cannot read.
/// This code reads formats 1 to 3, and marks a database format 3 before it first writes
/// anything into it: opening or reading one changes nothing, so an earlier `agent` can
/// still read what was only read, and refuses in words what this one wrote to.
pub const FORMAT_VERSION: u32 = 3;
/// A run's stored summary is rewritten at least once in this many entries.
const SUMMARY_EVERY: u64 = 128;
const FORMAT_KEY: &[u8] = b"format";
/// How long opening waits for a lock a just-dropped handle of this process still holds.
const LOCK_WAIT: Duration = Duration::from_millis(1_000);
/// The file beside sled's that counts the entries ever committed (see [`Marker`]).
const MARKER: &str = "agent-commits";

/// The sled-backed store. Keep one per process: sled allows one open handle per directory.
#[derive(Debug)]
pub struct SledStore {
    path: PathBuf,
    db: sled::Db,
    events: sled::Tree,
    runs: sled::Tree,
    blobs: sled::Tree,
    flusher: GroupFlush,
    marker: Marker,
    /// Set when the database holds fewer entries than were committed.
    damage: Option<String>,
    /// The meta tree and whether it says [`FORMAT_VERSION`] yet.
    meta: sled::Tree,
    marked: std::sync::atomic::AtomicBool,
    /// Every run's summary as of its last append. This handle is the database's only
    /// writer (sled locks it to one process), so the version check is made here, under this
    /// lock, and a commit needs no transaction across the two trees.
    summaries: Mutex<std::collections::HashMap<String, RunSummary>>,
}

/// Detects a database that lost committed data. sled recovers a damaged file by dropping
/// everything after the damage, consistently, so the store alone cannot tell. Beside it, a
/// small file holds the number of entries committed so far, written after each flush
/// (never before: it can only lag the database, so a crash never raises a false alarm).
/// At open, a database holding fewer entries than the file counts has lost commits.
#[derive(Debug)]
struct Marker {
    file: Mutex<std::fs::File>,
    /// Entries committed, flushed or not.
    total: std::sync::atomic::AtomicU64,
    /// The count last written to the file.
    written: std::sync::atomic::AtomicU64,
}

impl Marker {
    fn open(dir: &Path) -> Result<(Marker, Option<u64>), StoreError> {
        use std::io::Read;
        let path = dir.join(MARKER);
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(|e| StoreError::Engine(format!("{}: {e}", path.display())))?;
        let mut text = String::new();
        let _ = file.read_to_string(&mut text);
        let counted = text
            .split_whitespace()
            .find_map(|w| w.strip_prefix("entries="))
            .and_then(|n| n.parse::<u64>().ok());
        Ok((
            Marker {
                file: Mutex::new(file),
                total: Default::default(),
                written: Default::default(),
            },
            counted,
        ))
    }

    /// Records the count covered by a finished flush (monotonic; errors only delay it).
    fn record(&self, covered: u64) {
        use std::os::unix::fs::FileExt;
        use std::sync::atomic::Ordering;
        let file = self.file.lock().unwrap_or_else(|p| p.into_inner());
        if covered <= self.written.load(Ordering::SeqCst) {
            return;
        }
        let text = marker_text(covered);
        // One positioned write: the text always has the same length.
        if file.write_all_at(&text, 0).is_ok() {
            self.written.store(covered, Ordering::SeqCst);
        }
    }
}

/// `format=F entries=N\n` with N in 20 digits, written without the formatting machinery
/// (it is written after every flush).
fn marker_text(covered: u64) -> Vec<u8> {
    let mut text = Vec::with_capacity(48);
    text.extend_from_slice(b"format=");
    push_digits(&mut text, u64::from(FORMAT_VERSION), 1);
    text.extend_from_slice(b" entries=");
    push_digits(&mut text, covered, 20);
    text.push(b'\n');
    text
}

/// `n` in decimal, padded with zeros to at least `width` digits.
fn push_digits(out: &mut Vec<u8>, n: u64, width: usize) {
    let mut digits = [b'0'; 20];
    let mut rest = n;
    let mut used = 0;
    for digit in digits.iter_mut().rev() {
        // A digit, 0 to 9.
        *digit = b'0' + u8::try_from(rest % 10).unwrap_or(0);
        rest /= 10;
        used += 1;
        if rest == 0 && used >= width {
            break;
        }
    }
    out.extend_from_slice(&digits[20 - used..]);
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
    /// Appends waiting for a flush another one makes: with none, a finished flush wakes
    /// nobody (a process driving one run then makes no futex call a commit).
    waiting: usize,
}

impl GroupFlush {
    /// Returns once a flush that began after this call has finished; the marker then
    /// counts every entry whose write was in memory when that flush began.
    fn wait_durable(&self, db: &sled::Db, marker: &Marker) -> Result<(), StoreError> {
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
                let covered = marker.total.load(std::sync::atomic::Ordering::SeqCst);
                let result = db.flush();
                if result.is_ok() {
                    marker.record(covered);
                }
                st = self.state.lock().unwrap_or_else(|p| p.into_inner());
                st.flushing = false;
                st.flushed = target;
                st.failed = result.err().map(|e| e.to_string());
                if st.waiting > 0 {
                    self.done.notify_all();
                }
                continue;
            }
            st.waiting += 1;
            st = self.done.wait(st).unwrap_or_else(|p| p.into_inner());
            st.waiting -= 1;
        }
    }
}

impl SledStore {
    /// Marks the database with [`FORMAT_VERSION`] before the first write into one of an
    /// earlier format: from then on an earlier `agent` refuses it rather than misreads it
    /// (any write may split a node of sled's tree, which sled as published cannot read).
    fn mark(&self) -> Result<(), StoreError> {
        use std::sync::atomic::Ordering;
        if !self.marked.load(Ordering::SeqCst) {
            self.meta
                .insert(FORMAT_KEY, FORMAT_VERSION.to_string().as_bytes())?;
            self.marked.store(true, Ordering::SeqCst);
        }
        Ok(())
    }

    /// Opens the store in `dir`, creating it if the directory is missing or empty. A store
    /// whose database cannot be read is [`StoreError::Damaged`], naming it.
    pub fn open(dir: impl AsRef<Path>) -> Result<SledStore, StoreError> {
        SledStore::open_waiting(dir.as_ref(), LOCK_WAIT)
    }

    /// Opens the store in `dir`, waiting at most `wait` for another handle's lock.
    pub(crate) fn open_waiting(dir: &Path, wait: Duration) -> Result<SledStore, StoreError> {
        let path = dir.to_path_buf();
        SledStore::open_at(&path, wait).map_err(|e| match e {
            StoreError::Engine(message) => StoreError::Damaged {
                path: path.clone(),
                message: format!("its database cannot be read ({message})"),
            },
            other => other,
        })
    }

    fn open_at(path: &Path, wait: Duration) -> Result<SledStore, StoreError> {
        let path = path.to_path_buf();
        let names: Vec<String> = match std::fs::read_dir(&path) {
            Ok(entries) => entries
                .filter_map(Result::ok)
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) if e.kind() == std::io::ErrorKind::NotADirectory => {
                return Err(StoreError::not_a_directory(&path));
            }
            Err(e) => return Err(StoreError::Engine(format!("{}: {e}", path.display()))),
        };
        // Only sled's own files and the marker: a store, or one whose creation a crash
        // interrupted.
        let sled_owned = |n: &String| {
            matches!(n.as_str(), "conf" | "db" | "blobs" | MARKER | SET_ASIDE)
                || n.starts_with("snap.")
        };
        if !names.iter().all(sled_owned) {
            return Err(StoreError::NotAStore(path));
        }
        let db = open_db(&path, wait)?;
        let (marker, counted) = Marker::open(&path)?;
        let meta = db.open_tree("meta")?;
        match meta.get(FORMAT_KEY)? {
            Some(found) if found.as_ref() == FORMAT_VERSION.to_string().as_bytes() => {}
            Some(found) if found.as_ref() == b"1" || found.as_ref() == b"2" => {}
            Some(found) => {
                return Err(StoreError::UnknownFormat {
                    path,
                    found: String::from_utf8_lossy(&found).into_owned(),
                    expected: FORMAT_VERSION,
                });
            }
            // A database emptied by damage is not a new store: never re-initialised.
            None if counted.unwrap_or(0) > 0 => {
                return Err(StoreError::Damaged {
                    path,
                    message: format!(
                        "its database holds none of the {} entries committed to it",
                        counted.unwrap_or(0)
                    ),
                });
            }
            None if untouched(&db)? => {
                // Made durable by the first commit's flush. A crash before it leaves a
                // database that is untouched, or holds only this key: either opens as new.
                meta.insert(FORMAT_KEY, FORMAT_VERSION.to_string().as_bytes())?;
            }
            None => return Err(StoreError::NotAStore(path)),
        }
        let runs = db.open_tree("runs")?;
        let events = db.open_tree("events")?;
        let mut total = 0u64;
        let mut summaries = std::collections::HashMap::new();
        for item in runs.iter() {
            let (k, v) = item?;
            let run_id = String::from_utf8_lossy(&k).into_owned();
            let summary = settle_summary(&events, &runs, RunSummary::decode(&run_id, &v)?)?;
            total = total.saturating_add(summary.version);
            summaries.insert(run_id, summary);
        }
        let damage = match counted {
            Some(counted) if counted > total => Some(format!(
                "its database holds {total} of the {counted} entries committed to it (a log \
                 was cut short)"
            )),
            _ => None,
        };
        marker.total.store(
            total.max(counted.unwrap_or(0)),
            std::sync::atomic::Ordering::SeqCst,
        );
        if damage.is_none() {
            // A store made before the marker existed gets one now.
            marker.record(total);
        }
        let marked =
            meta.get(FORMAT_KEY)?.as_deref() == Some(FORMAT_VERSION.to_string().as_bytes());
        Ok(SledStore {
            events,
            runs,
            meta,
            marked: std::sync::atomic::AtomicBool::new(marked),
            summaries: Mutex::new(summaries),
            blobs: db.open_tree("blobs")?,
            flusher: GroupFlush::default(),
            marker,
            damage,
            db,
            path,
        })
    }

    /// `Some(what)` when the database holds fewer entries than were committed to it: the
    /// store reads what it holds and refuses writes.
    pub fn damage(&self) -> Option<StoreError> {
        self.damage.as_ref().map(|message| StoreError::Damaged {
            path: self.path.clone(),
            message: message.clone(),
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

    /// The run's summary as of its last commit.
    pub(crate) fn summary(&self, run_id: &str) -> Option<RunSummary> {
        self.summaries
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(run_id)
            .cloned()
    }

    /// The bytes of every blob, in no particular order.
    pub(crate) fn blobs(&self) -> impl Iterator<Item = Result<Vec<u8>, StoreError>> + '_ {
        self.blobs
            .iter()
            .map(|item| item.map(|(_, v)| v.to_vec()).map_err(StoreError::from))
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

/// Where snapshots sled could not read are moved (never deleted).
const SET_ASIDE: &str = "snapshots-set-aside";

/// Bytes of sled's page cache. Its default, 1 GiB, lets a process's memory grow with the
/// store it writes; runs append and read each log whole and rarely, so a small cache costs
/// nothing measurable and keeps memory flat (with `vendor/sled`'s cache shards, which
/// evict; sled's own 256 shards never did for a run's few accesses). 512 KiB counts the
/// same instructions a turn as 1 MiB did; 256 KiB read pages back (BENCHMARKS.md).
const CACHE_BYTES: u64 = 512 * 1024;

fn open_db(path: &Path, wait: Duration) -> Result<sled::Db, StoreError> {
    let started = std::time::Instant::now();
    let mut set_aside = false;
    loop {
        match sled::Config::new()
            .path(path)
            .cache_capacity(CACHE_BYTES)
            // Every commit is flushed before it is confirmed (group commit): sled's own
            // timer would only add flushes, and work that depends on the clock.
            .flush_every_ms(None)
            .open()
        {
            Ok(db) => return Ok(db),
            // sled 0.34 can leave a torn snapshot when it is killed while writing one
            // (spacejam/sled#1527, #1533), and then refuses to open. A snapshot only caches
            // what sled's log holds: it is moved aside and sled rebuilds from the log. If the
            // log lost commits, the commit marker reports the store as damaged.
            Err(sled::Error::Corruption { .. }) if !set_aside && set_aside_snapshots(path)? => {
                set_aside = true;
            }
            Err(sled::Error::Io(e)) if e.to_string().contains("could not acquire lock") => {
                // sled releases its file lock a moment after the last handle drops.
                if started.elapsed() >= wait {
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

/// Moves sled's snapshot files into [`SET_ASIDE`]; whether there were any.
fn set_aside_snapshots(path: &Path) -> Result<bool, StoreError> {
    let io = |e: std::io::Error| StoreError::Engine(format!("{}: {e}", path.display()));
    let snapshots: Vec<std::path::PathBuf> = std::fs::read_dir(path)
        .map_err(io)?
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().starts_with("snap."))
        .map(|e| e.path())
        .collect();
    if snapshots.is_empty() {
        return Ok(false);
    }
    let dir = path.join(SET_ASIDE);
    std::fs::create_dir_all(&dir).map_err(io)?;
    for snapshot in snapshots {
        let Some(name) = snapshot.file_name() else {
            continue;
        };
        let mut to = dir.join(name);
        let mut n = 1;
        while to.exists() {
            to = dir.join(format!("{}.{n}", name.to_string_lossy()));
            n += 1;
        }
        std::fs::rename(&snapshot, &to).map_err(io)?;
    }
    Ok(true)
}

fn run_key(run_id: &str) -> Result<Vec<u8>, StoreError> {
    if run_id.is_empty() || run_id.contains('\0') {
        return Err(StoreError::InvalidRunId {
            id: run_id.to_owned(),
            rule: crate::error::ANY_RUN_ID,
        });
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

/// The record of a commit from its entries' JSON: the one entry's, or an array of them
/// (the bytes `serde_json` writes for the slice).
fn record_of(encoded: &[Vec<u8>]) -> Vec<u8> {
    if let [one] = encoded {
        return one.clone();
    }
    let mut record = Vec::with_capacity(encoded.iter().map(|e| e.len() + 1).sum::<usize>() + 1);
    record.push(b'[');
    for (i, json) in encoded.iter().enumerate() {
        if i > 0 {
            record.push(b',');
        }
        record.extend_from_slice(json);
    }
    record.push(b']');
    record
}

/// The entries of one record: a commit of several entries is a JSON array, a commit of one
/// (and every record of format 1) a JSON object.
fn decode_record(run_id: &str, key_version: u64, bytes: &[u8]) -> Result<Vec<Entry>, StoreError> {
    let corrupt = |e: serde_json::Error| StoreError::Corrupt {
        what: format!("entry {key_version} of run {run_id}"),
        message: e.to_string(),
    };
    match bytes.iter().find(|b| !b.is_ascii_whitespace()) {
        Some(b'[') => serde_json::from_slice(bytes).map_err(corrupt),
        _ => serde_json::from_slice(bytes)
            .map(|e| vec![e])
            .map_err(corrupt),
    }
}

/// The version in an event key of run `run_id` (`None` for another run's key).
fn key_version(run_id: &str, key: &[u8]) -> Option<u64> {
    let rest = key.strip_prefix(run_id.as_bytes())?.strip_prefix(&[0])?;
    <[u8; 8]>::try_from(rest).ok().map(u64::from_be_bytes)
}

/// A run's summary made to agree with its entries: the stored summary is written only now
/// and then, and a crash between a commit and its summary leaves records it does not count
/// yet (they are there, whole); they are counted now, and the summary written again.
fn settle_summary(
    events: &sled::Tree,
    runs: &sled::Tree,
    mut summary: RunSummary,
) -> Result<RunSummary, StoreError> {
    let run_id = summary.run_id.clone();
    let mut changed = false;
    while let Some(bytes) = events.get(event_key(&run_id, summary.version + 1))? {
        for entry in decode_record(&run_id, summary.version + 1, &bytes)? {
            if entry.version != summary.version + 1 {
                return Err(StoreError::Corrupt {
                    what: format!("run {run_id}"),
                    message: format!(
                        "entry {} found where {} belongs",
                        entry.version,
                        summary.version + 1
                    ),
                });
            }
            summary.apply(&entry);
        }
        changed = true;
    }
    if changed {
        runs.insert(run_key(&run_id)?, summary.encode()?)?;
    }
    Ok(summary)
}

/// Whether a commit that took a run's summary from `before` to `after` writes it.
pub(crate) fn summary_due(before: &Due, after: &RunSummary) -> bool {
    before.version == 0
        || before.status != after.status
        || before.reason != after.reason
        || before.version / SUMMARY_EVERY != after.version / SUMMARY_EVERY
}

/// What of a summary decides whether it is written again ([`summary_due`]).
pub(crate) struct Due {
    version: u64,
    status: String,
    reason: Option<agent_core::TerminalReason>,
}

impl Due {
    pub(crate) fn of(summary: &RunSummary) -> Due {
        Due {
            version: summary.version,
            status: summary.status.clone(),
            reason: summary.reason,
        }
    }
}

impl Store for SledStore {
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
        if let Some(damage) = self.damage() {
            return Err(damage);
        }
        let key = run_key(run_id)?;
        let Some(first) = entries.first() else {
            // Nothing to write; the version check still speaks.
            let summaries = self.summaries.lock().unwrap_or_else(|p| p.into_inner());
            let current = summaries.get(run_id).map_or(0, |s| s.version);
            check_batch(run_id, current, expected_version, entries)?;
            return Ok(current);
        };
        // One record: a single sled insert is atomic, so a commit needs no batch (which
        // costs sled a second write and sync for its manifest).
        let record = if encoded.len() == entries.len() {
            debug_assert!(
                entries
                    .iter()
                    .zip(encoded)
                    .all(|(e, json)| serde_json::to_vec(e).ok().as_ref() == Some(json)),
                "append_encoded: bytes that are not the entries' JSON"
            );
            record_of(encoded)
        } else {
            match entries {
                [one] => serde_json::to_vec(one),
                many => serde_json::to_vec(many),
            }
            .map_err(|err| StoreError::Corrupt {
                what: format!("new entry {} of run {run_id}", first.version),
                message: err.to_string(),
            })?
        };
        let version = {
            let mut summaries = self.summaries.lock().unwrap_or_else(|p| p.into_inner());
            let current = summaries.get(run_id).map_or(0, |s| s.version);
            check_batch(run_id, current, expected_version, entries)?;
            self.mark()?;
            // Brought up to date in place, before the record is written: the record may be
            // in the tree even if a write below fails, and it must never be written over.
            if !summaries.contains_key(run_id) {
                summaries.insert(run_id.to_owned(), RunSummary::new(run_id));
            }
            let summary = summaries
                .get_mut(run_id)
                .ok_or_else(|| StoreError::RunNotFound(run_id.to_owned()))?;
            let before = Due::of(summary);
            for entry in entries {
                summary.apply(entry);
            }
            let version = summary.version;
            let stored = match summary_due(&before, summary).then(|| summary.encode()) {
                Some(Err(e)) => {
                    // Forgotten, so that the next commit finds it from the database, not
                    // ahead of it.
                    summaries.remove(run_id);
                    return Err(e);
                }
                Some(Ok(bytes)) => Some(bytes),
                None => None,
            };
            self.events
                .insert(event_key(run_id, first.version), record)?;
            // The summary after the record: a crash in between leaves a record the stored
            // summary does not count yet, which the next open counts (`settle_summary`).
            if let Some(bytes) = stored {
                self.runs.insert(key.as_slice(), bytes)?;
            }
            version
        };
        self.marker
            .total
            .fetch_add(entries.len() as u64, std::sync::atomic::Ordering::SeqCst);
        // The flush is the durability point: confirm nothing before it.
        self.flusher.wait_durable(&self.db, &self.marker)?;
        Ok(version)
    }

    fn load(&self, run_id: &str) -> Result<Vec<Entry>, StoreError> {
        self.load_from(run_id, 1)
    }

    fn load_from(&self, run_id: &str, from: u64) -> Result<Vec<Entry>, StoreError> {
        run_key(run_id)?;
        let last = self
            .summaries
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(run_id)
            .map(|s| s.version);
        let Some(last) = last else {
            return Err(StoreError::RunNotFound(run_id.to_owned()));
        };
        let first = from.clamp(1, last.saturating_add(1));
        let wanted = last.saturating_sub(first - 1);
        let mut entries = Vec::with_capacity(usize::try_from(wanted).unwrap_or(0));
        // The record that holds `first` may begin before it (a commit of several entries).
        let start = self
            .events
            .range(event_key(run_id, 0)..=event_key(run_id, first))
            .next_back()
            .transpose()?
            .map_or_else(|| event_key(run_id, first), |(k, _)| k.to_vec());
        for item in self.events.range(start..) {
            let (k, v) = item?;
            let Some(at) = key_version(run_id, &k) else {
                // The next run's entries: this run's log ended.
                break;
            };
            for entry in decode_record(run_id, at, &v)? {
                if entry.version < first {
                    continue;
                }
                let expected = first + entries.len() as u64;
                if entry.version != expected {
                    return Err(StoreError::Corrupt {
                        what: format!("run {run_id}"),
                        message: format!("entry {} found where {expected} belongs", entry.version),
                    });
                }
                entries.push(entry);
            }
        }
        if entries.len() as u64 != wanted {
            return Err(StoreError::Corrupt {
                what: format!("run {run_id}"),
                message: format!(
                    "the index says version {}, the log holds {} entries",
                    last,
                    first - 1 + entries.len() as u64
                ),
            });
        }
        Ok(entries)
    }

    fn runs(&self) -> Result<Vec<RunSummary>, StoreError> {
        let mut runs: Vec<RunSummary> = self
            .summaries
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .cloned()
            .collect();
        runs.sort_by(|a, b| a.run_id.cmp(&b.run_id));
        Ok(runs)
    }

    fn put_blob(&self, bytes: &[u8]) -> Result<Handle, StoreError> {
        let handle = Handle::of_bytes(bytes);
        let key = handle.to_string();
        if !self.blobs.contains_key(key.as_bytes())? {
            if let Some(damage) = self.damage() {
                return Err(damage);
            }
            self.mark()?;
            self.blobs.insert(key.as_bytes(), bytes)?;
            self.flusher.wait_durable(&self.db, &self.marker)?;
        }
        Ok(handle)
    }

    fn get_blob(&self, handle: &Handle) -> Result<Option<Vec<u8>>, StoreError> {
        if !matches!(handle, Handle::Blob(_)) {
            return Ok(None);
        }
        let key = handle.to_string();
        Ok(self.blobs.get(key.as_bytes())?.map(|v| v.to_vec()))
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_marker_is_what_formatting_would_write() {
        for n in [0, 7, 10, 12_345, u64::MAX] {
            assert_eq!(
                super::marker_text(n),
                format!("format={} entries={n:020}\n", super::FORMAT_VERSION).into_bytes()
            );
        }
    }
}
