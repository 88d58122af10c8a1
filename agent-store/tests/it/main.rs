//! The stores against the conformance suite, and the sled store on real disk.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod dir;
#[cfg(feature = "postgres")]
mod postgres;
mod roundtrip;
mod sled_tree;

use agent_store::conformance::{check_all, filler, started};
use agent_store::{FORMAT_VERSION, MemoryStore, SledStore, Store, StoreError};

/// sled itself, for writing what a foreign or damaged store holds. Like `SledStore::open`,
/// it waits out the lock a just-dropped handle still holds for a moment.
fn raw_sled(path: &std::path::Path) -> sled::Db {
    let started = std::time::Instant::now();
    loop {
        match sled::open(path) {
            Ok(db) => return db,
            Err(e) if started.elapsed() < std::time::Duration::from_secs(2) => {
                assert!(e.to_string().contains("could not acquire lock"), "{e}");
                std::thread::yield_now();
            }
            Err(e) => panic!("{e}"),
        }
    }
}

#[test]
fn memory_store_conforms() {
    check_all(&MemoryStore::new());
}

#[test]
fn sled_store_conforms() {
    let dir = tempfile::tempdir().unwrap();
    check_all(&SledStore::open(dir.path().join("store")).unwrap());
}

#[test]
fn sled_store_passes_the_reopen_check() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store");
    agent_store::conformance::check_reopen(&|| Box::new(SledStore::open(&path).unwrap()));
}

#[test]
fn sled_store_keeps_everything_across_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(".agent");
    {
        let store = SledStore::open(&path).unwrap();
        store.append("r1", 0, &[started("r1", 5)]).unwrap();
        store
            .append("r1", 1, &[filler(2, 1), filler(3, 2)])
            .unwrap();
        store.append("r2", 0, &[started("r2", 6)]).unwrap();
    }
    // Reopened right after the drop, in the same process.
    let store = SledStore::open(&path).unwrap();
    let log = store.load("r1").unwrap();
    assert_eq!(log.len(), 3);
    assert_eq!(log[2], filler(3, 2));
    let ids: Vec<String> = store
        .runs()
        .unwrap()
        .into_iter()
        .map(|s| s.run_id)
        .collect();
    assert_eq!(ids, ["r1", "r2"]);
    assert_eq!(store.append("r1", 3, &[filler(4, 3)]).unwrap(), 4);
}

#[test]
fn entries_a_crash_left_without_their_summary_are_counted_at_the_next_open() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store");
    {
        let store = SledStore::open(&path).unwrap();
        store.append("r", 0, &[started("r", 1)]).unwrap();
    }
    {
        // What a crash between a commit's entries and its summary leaves: entries 2 and 3
        // in the events tree, the summary still at version 1.
        let db = raw_sled(&path);
        let events = db.open_tree("events").unwrap();
        for entry in [filler(2, 1), filler(3, 2)] {
            let mut key = b"r\0".to_vec();
            key.extend_from_slice(&entry.version.to_be_bytes());
            events
                .insert(key, serde_json::to_vec(&entry).unwrap())
                .unwrap();
        }
        db.flush().unwrap();
    }
    let store = SledStore::open(&path).unwrap();
    assert!(store.damage().is_none());
    assert_eq!(store.runs().unwrap()[0].version, 3);
    assert_eq!(store.load("r").unwrap().len(), 3);
    // The next commit follows them; it never writes over them.
    assert!(matches!(
        store.append("r", 1, &[filler(2, 9)]),
        Err(StoreError::Conflict { actual: 3, .. })
    ));
    assert_eq!(store.append("r", 3, &[filler(4, 3)]).unwrap(), 4);
}

#[test]
fn run_ids_with_a_common_prefix_do_not_mix() {
    let dir = tempfile::tempdir().unwrap();
    let store = SledStore::open(dir.path()).unwrap();
    store.append("run", 0, &[started("run", 1)]).unwrap();
    store
        .append("run1", 0, &[started("run1", 1), filler(2, 1)])
        .unwrap();
    assert_eq!(store.load("run").unwrap().len(), 1);
    assert_eq!(store.load("run1").unwrap().len(), 2);
    assert!(matches!(
        store.append("", 0, &[started("", 1)]),
        Err(StoreError::InvalidRunId { .. })
    ));
}

#[test]
fn a_directory_that_is_not_a_store_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("notes.txt"), "mine").unwrap();
    let err = SledStore::open(dir.path()).unwrap_err();
    assert!(matches!(err, StoreError::NotAStore(_)), "{err}");
    assert!(err.to_string().contains("not an agent store"));
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        1,
        "nothing was written"
    );
}

#[test]
fn a_store_of_another_format_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    {
        let db = raw_sled(dir.path());
        db.open_tree("meta")
            .unwrap()
            .insert("format", "99")
            .unwrap();
        db.flush().unwrap();
    }
    let err = SledStore::open(dir.path()).unwrap_err();
    assert!(
        matches!(&err, StoreError::UnknownFormat { found, expected, .. } if found == "99" && *expected == FORMAT_VERSION),
        "{err}"
    );
}

/// The format a database's meta tree says.
fn stored_format(path: &std::path::Path) -> Vec<u8> {
    raw_sled(path)
        .open_tree("meta")
        .unwrap()
        .get("format")
        .unwrap()
        .unwrap()
        .to_vec()
}

#[test]
fn a_format_2_store_is_read_and_marked_at_its_first_write() {
    let dir = tempfile::tempdir().unwrap();
    {
        let db = raw_sled(dir.path());
        db.open_tree("meta").unwrap().insert("format", "2").unwrap();
        db.flush().unwrap();
    }
    {
        let store = SledStore::open(dir.path()).unwrap();
        assert!(store.runs().unwrap().is_empty());
    }
    assert_eq!(
        stored_format(dir.path()),
        b"2",
        "opening and reading write nothing"
    );
    {
        let store = SledStore::open(dir.path()).unwrap();
        store.put_blob(b"bytes").unwrap();
    }
    assert_eq!(
        stored_format(dir.path()),
        FORMAT_VERSION.to_string().as_bytes()
    );
}

/// The key format 1 and 2 both give an entry of run `run`.
fn raw_event_key(run: &str, version: u64) -> Vec<u8> {
    let mut key = run.as_bytes().to_vec();
    key.push(0);
    key.extend_from_slice(&version.to_be_bytes());
    key
}

#[test]
fn a_format_1_store_is_read_and_continued_with_records_of_whole_commits() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store");
    {
        // What an earlier `agent` wrote: a record per entry, the summary at each commit.
        let db = raw_sled(&path);
        db.open_tree("meta").unwrap().insert("format", "1").unwrap();
        let events = db.open_tree("events").unwrap();
        let mut summary = agent_store::RunSummary::new("r");
        for entry in [started("r", 1), filler(2, 1), filler(3, 2)] {
            summary.apply(&entry);
            events
                .insert(
                    raw_event_key("r", entry.version),
                    serde_json::to_vec(&entry).unwrap(),
                )
                .unwrap();
        }
        db.open_tree("runs")
            .unwrap()
            .insert("r", serde_json::to_vec(&summary).unwrap())
            .unwrap();
        db.flush().unwrap();
    }
    {
        let store = SledStore::open(&path).unwrap();
        assert_eq!(store.load("r").unwrap().len(), 3);
    }
    assert_eq!(
        stored_format(&path),
        b"1",
        "reading leaves an earlier agent's database as it was"
    );
    {
        let store = SledStore::open(&path).unwrap();
        assert_eq!(store.append("r", 3, &[filler(4, 3)]).unwrap(), 4);
    }
    assert_eq!(
        stored_format(&path),
        FORMAT_VERSION.to_string().as_bytes(),
        "any write may split a node of the tree in a way an earlier agent cannot read: \
         the database says so from the first"
    );
    {
        let store = SledStore::open(&path).unwrap();
        assert_eq!(
            store
                .append("r", 4, &[filler(5, 4), filler(6, 5), filler(7, 6)])
                .unwrap(),
            7
        );
        let versions = |from| -> Vec<u64> {
            store
                .load_from("r", from)
                .unwrap()
                .iter()
                .map(|e| e.version)
                .collect()
        };
        assert_eq!(
            versions(2),
            [2, 3, 4, 5, 6, 7],
            "old records, then a new one"
        );
        assert_eq!(versions(6), [6, 7], "from the middle of a commit's record");
    }
    let db = raw_sled(&path);
    assert_eq!(
        db.open_tree("meta")
            .unwrap()
            .get("format")
            .unwrap()
            .unwrap(),
        FORMAT_VERSION.to_string().as_bytes(),
        "marked with the format it now holds, so an older agent refuses it in words"
    );
    let events = db.open_tree("events").unwrap();
    assert_eq!(events.len(), 5, "entries 5 to 7 are one record");
    let record = events.get(raw_event_key("r", 5)).unwrap().unwrap();
    let held: Vec<agent_core::Entry> = serde_json::from_slice(&record).unwrap();
    assert_eq!(held, [filler(5, 4), filler(6, 5), filler(7, 6)]);
}

#[test]
fn the_stored_summary_lags_the_log_and_an_open_brings_it_level() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store");
    let mut expected = agent_store::RunSummary::new("r");
    {
        let store = SledStore::open(&path).unwrap();
        let first = started("r", 1);
        expected.apply(&first);
        store.append("r", 0, &[first]).unwrap();
        // 299 more entries, in commits of one and of two.
        let mut version = 1;
        while version < 300 {
            let commit: Vec<_> = (version + 1..=(version + 1 + version % 2).min(300))
                .map(|v| filler(v, v as u32))
                .collect();
            commit.iter().for_each(|e| expected.apply(e));
            version = store.append("r", version, &commit).unwrap();
        }
        assert_eq!(store.runs().unwrap(), [expected.clone()]);
    }
    {
        let db = raw_sled(&path);
        let stored = db.open_tree("runs").unwrap().get("r").unwrap().unwrap();
        let stored: agent_store::RunSummary = serde_json::from_slice(&stored).unwrap();
        assert!(
            stored.version < 300,
            "the summary is not written at every commit (it says {})",
            stored.version
        );
        assert!(stored.version >= 256, "but at least every 128 entries");
    }
    let store = SledStore::open(&path).unwrap();
    assert_eq!(store.runs().unwrap(), [expected]);
    assert!(store.damage().is_none());
}
#[test]
fn a_sled_database_without_our_format_is_not_a_store() {
    let dir = tempfile::tempdir().unwrap();
    {
        let db = raw_sled(dir.path());
        db.insert("someone", "else").unwrap();
        db.flush().unwrap();
    }
    assert!(matches!(
        SledStore::open(dir.path()),
        Err(StoreError::NotAStore(_))
    ));
}

#[test]
fn a_garbled_record_is_an_error_not_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = SledStore::open(dir.path()).unwrap();
        store
            .append("r1", 0, &[started("r1", 1), filler(2, 1)])
            .unwrap();
    }
    {
        let db = raw_sled(dir.path());
        let events = db.open_tree("events").unwrap();
        let mut key = b"r1\0".to_vec();
        key.extend_from_slice(&2u64.to_be_bytes());
        events.insert(key, &b"{not json"[..]).unwrap();
        db.flush().unwrap();
    }
    let store = SledStore::open(dir.path()).unwrap();
    let err = store.load("r1").unwrap_err();
    assert!(matches!(err, StoreError::Corrupt { .. }), "{err}");
    assert!(err.to_string().contains("garbled record"));
}

#[test]
fn opening_a_missing_store_read_only_creates_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("nowhere");
    assert!(SledStore::open_existing(&path).unwrap().is_none());
    assert!(!path.exists());
}

#[test]
fn a_store_whose_creation_was_interrupted_opens() {
    let dir = tempfile::tempdir().unwrap();
    {
        // A crash right after sled created its files, before the format was written.
        let db = raw_sled(dir.path());
        db.flush().unwrap();
    }
    let store = SledStore::open(dir.path()).unwrap();
    store.append("r1", 0, &[started("r1", 1)]).unwrap();
}

#[test]
fn concurrent_commits_sharing_flushes_lose_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let store = std::sync::Arc::new(SledStore::open(dir.path()).unwrap());
    let threads: Vec<_> = (0..16)
        .map(|r| {
            let store = std::sync::Arc::clone(&store);
            std::thread::spawn(move || {
                let id = format!("run-{r}");
                let mut version = store.append(&id, 0, &[started(&id, 1)]).unwrap();
                for t in 1..=25u32 {
                    version = store
                        .append(&id, version, &[filler(version + 1, t)])
                        .unwrap();
                }
                version
            })
        })
        .collect();
    for t in threads {
        assert_eq!(t.join().unwrap(), 26);
    }
    drop(store);
    let store = SledStore::open(dir.path()).unwrap();
    for r in 0..16 {
        assert_eq!(store.load(&format!("run-{r}")).unwrap().len(), 26);
    }
}

/// A store with `runs` runs of `turns` entries each, closed.
fn filled(path: &std::path::Path, runs: usize, turns: u64) {
    let store = SledStore::open(path).unwrap();
    for r in 0..runs {
        let id = format!("run-{r}");
        store.append(&id, 0, &[started(&id, 1)]).unwrap();
        for v in 2..=turns {
            store.append(&id, v - 1, &[filler(v, 200)]).unwrap();
        }
    }
}

#[test]
fn a_truncated_database_is_reported_never_reinitialised() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store");
    filled(&path, 3, 20);
    let db = path.join("db");
    std::fs::OpenOptions::new()
        .write(true)
        .open(&db)
        .unwrap()
        .set_len(100)
        .unwrap();
    let Err(err) = SledStore::open(&path) else {
        panic!("a damaged store is an error");
    };
    let text = err.to_string();
    assert!(text.contains(path.to_str().unwrap()), "{text}");
    assert_eq!(text.lines().count(), 1, "{text}");
    // Nothing was written: opening again says the same.
    let again = SledStore::open(&path).err().unwrap().to_string();
    assert_eq!(again, text);
}

#[test]
fn bytes_damaged_in_the_middle_are_detected_and_what_remains_is_readable() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store");
    filled(&path, 2, 300);
    let db = path.join("db");
    let len = std::fs::metadata(&db).unwrap().len();
    let mut bytes = std::fs::read(&db).unwrap();
    let middle = (len / 2) as usize;
    for (i, b) in bytes[middle..middle + 4096].iter_mut().enumerate() {
        *b = (i as u8).wrapping_mul(31).wrapping_add(7);
    }
    std::fs::write(&db, bytes).unwrap();
    match SledStore::open(&path) {
        Err(e) => {
            let text = e.to_string();
            assert!(text.contains(path.to_str().unwrap()), "{text}");
        }
        Ok(store) => {
            let damage = store.damage().expect("the lost commits are detected");
            assert!(damage.to_string().contains("entries committed"), "{damage}");
            // What it still holds reads back; nothing more is written.
            for run in store.runs().unwrap() {
                assert_eq!(store.load(&run.run_id).unwrap().len() as u64, run.version);
            }
            assert!(matches!(
                store.append("run-0", 1, &[filler(2, 10)]),
                Err(StoreError::Damaged { .. })
            ));
        }
    }
}

#[test]
fn a_locked_store_says_so_in_words() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store");
    let _held = SledStore::open(&path).unwrap();
    let err = SledStore::open(&path).err().unwrap();
    assert!(matches!(err, StoreError::Locked { .. }), "{err:?}");
    let text = err.to_string();
    assert!(
        text.contains(&path.display().to_string()),
        "names the store: {text}"
    );
    assert_eq!(text.lines().count(), 1, "{text}");
    assert!(!text.contains("Os {"), "{text}");
}

/// A backend that cannot keep blobs.
struct NoBlobs(MemoryStore);

impl Store for NoBlobs {
    fn append(
        &self,
        run_id: &str,
        expected: u64,
        entries: &[agent_core::Entry],
    ) -> Result<u64, StoreError> {
        self.0.append(run_id, expected, entries)
    }
    fn load(&self, run_id: &str) -> Result<Vec<agent_core::Entry>, StoreError> {
        self.0.load(run_id)
    }
    fn runs(&self) -> Result<Vec<agent_store::RunSummary>, StoreError> {
        self.0.runs()
    }
    fn put_blob(&self, _: &[u8]) -> Result<agent_core::Handle, StoreError> {
        Err(StoreError::Engine("no room for blobs".into()))
    }
    fn get_blob(&self, handle: &agent_core::Handle) -> Result<Option<Vec<u8>>, StoreError> {
        self.0.get_blob(handle)
    }
}

#[test]
fn the_conformance_suite_fails_a_backend_whose_setup_steps_fail() {
    let broken = std::panic::catch_unwind(|| check_all(&NoBlobs(MemoryStore::new())));
    let message = broken.expect_err("a backend without blobs does not conform");
    let text = message
        .downcast_ref::<String>()
        .cloned()
        .unwrap_or_default();
    assert!(text.contains("put_blob failed"), "{text}");
}

/// sled 0.34 refuses to open a database whose snapshot was torn by a kill while it was
/// being written (spacejam/sled#1527); the kill -9 harness of agent-cli hit it. The
/// snapshot only caches sled's log: it is set aside and everything committed is still there.
#[test]
fn a_torn_snapshot_is_set_aside_and_nothing_committed_is_lost() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store");
    filled(&path, 3, 20);
    // Make sure sled wrote a snapshot, then tear it.
    {
        let db = raw_sled(&path);
        db.flush().unwrap();
    }
    let snapshots: Vec<std::path::PathBuf> = std::fs::read_dir(&path)
        .unwrap()
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("snap.")
        })
        .collect();
    assert!(!snapshots.is_empty(), "sled keeps a snapshot");
    for snapshot in &snapshots {
        let len = std::fs::metadata(snapshot).unwrap().len();
        std::fs::write(snapshot, vec![0xAB; len as usize]).unwrap();
    }
    assert!(
        matches!(sled::open(&path), Err(sled::Error::Corruption { .. })),
        "sled alone refuses it"
    );
    let store = SledStore::open(&path).expect("the store opens");
    assert!(store.damage().is_none(), "{:?}", store.damage());
    assert_eq!(store.runs().unwrap().len(), 3);
    for run in store.runs().unwrap() {
        assert_eq!(store.load(&run.run_id).unwrap().len(), 20, "{}", run.run_id);
    }
    assert!(
        path.join("snapshots-set-aside").is_dir(),
        "kept, not deleted"
    );
}

#[test]
fn entries_handed_over_as_json_are_stored_as_those_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store");
    let commit = [filler(2, 1), filler(3, 2)];
    let json: Vec<Vec<u8>> = commit
        .iter()
        .map(|e| serde_json::to_vec(e).unwrap())
        .collect();
    {
        let store = SledStore::open(&path).unwrap();
        let first = started("r", 1);
        let first_json = vec![serde_json::to_vec(&first).unwrap()];
        assert_eq!(
            store.append_encoded("r", 0, &[first], &first_json).unwrap(),
            1
        );
        assert_eq!(store.append_encoded("r", 1, &commit, &json).unwrap(), 3);
        // Without bytes (or with too few), the store encodes the entries itself.
        assert_eq!(
            store.append_encoded("r", 3, &[filler(4, 3)], &[]).unwrap(),
            4
        );
        assert_eq!(store.load_from("r", 2).unwrap()[..2], commit);
    }
    let db = raw_sled(&path);
    let record = db
        .open_tree("events")
        .unwrap()
        .get(raw_event_key("r", 2))
        .unwrap()
        .unwrap();
    assert_eq!(
        record.as_ref(),
        serde_json::to_vec(&commit[..]).unwrap().as_slice(),
        "the record is the bytes `serde_json` writes for the commit"
    );
}

#[test]
#[cfg(debug_assertions)]
#[should_panic(expected = "not the entries' JSON")]
fn bytes_that_are_not_the_entries_json_are_caught_in_debug_builds() {
    let dir = tempfile::tempdir().unwrap();
    let store = SledStore::open(dir.path().join("store")).unwrap();
    let wrong = vec![serde_json::to_vec(&started("other", 9)).unwrap()];
    let _ = store.append_encoded("r", 0, &[started("r", 1)], &wrong);
}

#[test]
fn a_record_whose_entries_do_not_continue_the_log_is_corrupt_at_open() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store");
    {
        let store = SledStore::open(&path).unwrap();
        store.append("r", 0, &[started("r", 1)]).unwrap();
        // Stored summary stays at version 1: this commit is not one that writes it.
        store.append("r", 1, &[filler(2, 1), filler(3, 2)]).unwrap();
    }
    {
        // The record under key 2 replaced by one that claims versions 7 and 8.
        let db = raw_sled(&path);
        db.open_tree("events")
            .unwrap()
            .insert(
                raw_event_key("r", 2),
                serde_json::to_vec(&[filler(7, 6), filler(8, 7)]).unwrap(),
            )
            .unwrap();
        db.flush().unwrap();
    }
    let err = SledStore::open(&path).unwrap_err();
    assert!(
        matches!(&err, StoreError::Corrupt { message, .. } if message.contains("entry 7 found where 2 belongs")),
        "{err}"
    );
}
