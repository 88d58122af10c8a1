//! The shared directory store: the conformance suite, two handles on one directory (as two
//! processes would hold it: sled's lock is per open file, so a second handle in this process
//! meets the same lock another process would), and the conversion of a format-1 store.

use agent_core::Handle;
use agent_store::conformance::{check_all, check_reopen, filler, started};
use agent_store::{DIR_FORMAT_VERSION, DirStore, SledStore, Store, StoreError};

#[test]
fn dir_store_conforms() {
    let dir = tempfile::tempdir().unwrap();
    check_all(&DirStore::open(dir.path().join("store")).unwrap());
}

#[test]
fn dir_store_passes_the_reopen_check() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store");
    check_reopen(&|| Box::new(DirStore::open(&path).unwrap()));
}

#[test]
fn runs_side_by_side_need_no_coordination_and_each_reads_the_other() {
    let dir = tempfile::tempdir().unwrap();
    let a = DirStore::open(dir.path()).unwrap();
    let b = DirStore::open(dir.path()).unwrap();
    a.append("ra", 0, &[started("ra", 1)]).unwrap();
    b.append("rb", 0, &[started("rb", 2)]).unwrap();
    a.append("ra", 1, &[filler(2, 1)]).unwrap();
    // Each holds its own run; the other's is read through its owner.
    assert_eq!(a.load("rb").unwrap(), [started("rb", 2)]);
    assert_eq!(b.load("ra").unwrap(), [started("ra", 1), filler(2, 1)]);
    assert_eq!(b.load_from("ra", 2).unwrap(), [filler(2, 1)]);
    let me = format!("process {}", std::process::id());
    for store in [&a, &b] {
        let runs = store.runs().unwrap();
        let seen: Vec<(&str, u64, Option<&str>)> = runs
            .iter()
            .map(|s| (s.run_id.as_str(), s.version, s.live.as_deref()))
            .collect();
        assert_eq!(seen, [("ra", 2, Some(&*me)), ("rb", 1, Some(&*me))]);
    }
}

#[test]
fn threads_of_one_process_that_start_one_run_at_once_meet_the_version_check_not_a_lock() {
    let dir = tempfile::tempdir().unwrap();
    let store = DirStore::open(dir.path()).unwrap();
    let outcomes: Vec<Result<u64, StoreError>> = std::thread::scope(|s| {
        let threads: Vec<_> = (0..8)
            .map(|_| s.spawn(|| store.append("same", 0, &[started("same", 1)])))
            .collect();
        threads.into_iter().map(|t| t.join().unwrap()).collect()
    });
    let ok = outcomes.iter().filter(|o| o.is_ok()).count();
    assert_eq!(ok, 1, "{outcomes:?}");
    assert!(
        outcomes
            .iter()
            .all(|o| matches!(o, Ok(1) | Err(StoreError::Conflict { .. }))),
        "{outcomes:?}"
    );
    assert_eq!(store.load("same").unwrap().len(), 1);
}

#[test]
fn a_run_driven_elsewhere_cannot_be_taken_or_written() {
    let dir = tempfile::tempdir().unwrap();
    let a = DirStore::open(dir.path()).unwrap();
    let b = DirStore::open(dir.path()).unwrap();
    a.append("r", 0, &[started("r", 1)]).unwrap();
    let busy = b.take("r").unwrap_err();
    assert!(
        matches!(&busy, StoreError::Busy { run_id, by } if run_id == "r"
            && by == &format!("process {}", std::process::id())),
        "{busy:?}"
    );
    assert!(matches!(
        b.append("r", 1, &[filler(2, 1)]),
        Err(StoreError::Busy { .. })
    ));
    assert_eq!(a.load("r").unwrap().len(), 1, "nothing was written");
    // Once let go, the other takes it and goes on.
    a.release("r");
    b.take("r").unwrap();
    assert_eq!(b.append("r", 1, &[filler(2, 1)]).unwrap(), 2);
    assert_eq!(a.load("r").unwrap().len(), 2);
    assert!(matches!(b.take("none"), Err(StoreError::RunNotFound(_))));
}

#[test]
fn a_run_nobody_drives_is_listed_as_not_live_and_read_from_its_database() {
    let dir = tempfile::tempdir().unwrap();
    {
        let a = DirStore::open(dir.path()).unwrap();
        a.append("r", 0, &[started("r", 1), filler(2, 1)]).unwrap();
    }
    let b = DirStore::open(dir.path()).unwrap();
    let runs = b.runs().unwrap();
    assert_eq!(runs.len(), 1);
    assert_eq!(runs[0].live, None);
    assert_eq!(runs[0].status, "running");
    assert_eq!(b.driver("r"), None);
    assert_eq!(b.load("r").unwrap().len(), 2);
}

#[test]
fn a_summary_missing_its_last_commit_is_read_again_from_the_log() {
    let dir = tempfile::tempdir().unwrap();
    {
        let a = DirStore::open(dir.path()).unwrap();
        a.append("r", 0, &[started("r", 1)]).unwrap();
        a.append("r", 1, &[filler(2, 1)]).unwrap();
    }
    // As if the process died between its last commit and writing the summary.
    let summary = dir.path().join("runs/r.json");
    let mut stale: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&summary).unwrap()).unwrap();
    stale["version"] = 1.into();
    std::fs::write(&summary, stale.to_string()).unwrap();
    let b = DirStore::open(dir.path()).unwrap();
    assert_eq!(b.runs().unwrap()[0].version, 2);
    // And the file is mended.
    let mended: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&summary).unwrap()).unwrap();
    assert_eq!(mended["version"], 2);
}

/// The summary file is written now and then, not at every commit; a live run is listed
/// as its owner has it, and the file catches up when the run ends.
#[test]
fn a_live_run_is_listed_as_its_owner_has_it_between_summary_writes() {
    let dir = tempfile::tempdir().unwrap();
    let a = DirStore::open(dir.path()).unwrap();
    a.append("r", 0, &[started("r", 1)]).unwrap();
    for v in 2..=6 {
        a.append("r", v - 1, &[filler(v, 1)]).unwrap();
    }
    let on_disk = |path: &std::path::Path| -> u64 {
        let bytes = std::fs::read(path).unwrap();
        let summary: agent_store::RunSummary = serde_json::from_slice(&bytes).unwrap();
        summary.version
    };
    let file = dir.path().join("runs/r.json");
    assert_eq!(
        on_disk(&file),
        1,
        "written with the run's first commit only"
    );
    let b = DirStore::open(dir.path()).unwrap();
    let runs = b.runs().unwrap();
    assert_eq!(runs.len(), 1);
    assert_eq!(runs[0].version, 6, "the owner's summary, not the file's");
    assert!(runs[0].live.is_some());
}

#[test]
fn a_summary_read_half_written_is_asked_of_the_process_driving_the_run() {
    let dir = tempfile::tempdir().unwrap();
    let a = DirStore::open(dir.path()).unwrap();
    a.append("r", 0, &[started("r", 1), filler(2, 1)]).unwrap();
    std::fs::write(dir.path().join("runs/r.json"), "{\"run_id\": \"r\", \"go").unwrap();
    let b = DirStore::open(dir.path()).unwrap();
    let runs = b.runs().unwrap();
    assert_eq!(runs.len(), 1);
    assert_eq!((runs[0].version, runs[0].steps), (2, 1));
}

#[test]
fn files_left_half_written_by_a_dead_process_are_swept_when_old() {
    let dir = tempfile::tempdir().unwrap();
    DirStore::open(dir.path()).unwrap();
    let tmp = dir.path().join("tmp");
    let (old, new) = (tmp.join("blob.1.0"), tmp.join("blob.2.0"));
    std::fs::write(&old, "left by a crash").unwrap();
    std::fs::write(&new, "being written").unwrap();
    let two_hours_ago = std::time::SystemTime::now() - std::time::Duration::from_secs(7200);
    std::fs::File::options()
        .write(true)
        .open(&old)
        .unwrap()
        .set_modified(two_hours_ago)
        .unwrap();
    DirStore::open(dir.path()).unwrap();
    assert!(!old.exists());
    assert!(new.exists(), "a file being written now is left alone");
}

#[test]
fn hostile_run_ids_name_no_file_outside_the_store() {
    let dir = tempfile::tempdir().unwrap();
    let store = DirStore::open(dir.path().join("s")).unwrap();
    for id in ["../x", "a/b", ".hidden", "", "a\0b", &"x".repeat(101)] {
        assert!(
            matches!(
                store.append(id, 0, &[started(id, 1)]),
                Err(StoreError::InvalidRunId { .. })
            ),
            "{id:?}"
        );
        let refused = store.load(id).unwrap_err();
        assert!(
            matches!(refused, StoreError::InvalidRunId { .. })
                && refused.to_string().contains("letters, digits"),
            "{refused}"
        );
    }
    assert!(!dir.path().join("x").exists());
}

#[test]
fn a_blob_file_that_was_changed_is_reported_not_returned() {
    let dir = tempfile::tempdir().unwrap();
    let store = DirStore::open(dir.path()).unwrap();
    let handle = store.put_blob(b"the real bytes").unwrap();
    let Handle::Blob(digest) = &handle else {
        panic!("{handle:?}")
    };
    std::fs::write(dir.path().join("blobs").join(digest), b"other bytes").unwrap();
    let err = store.get_blob(&handle).unwrap_err();
    assert!(matches!(err, StoreError::Corrupt { .. }), "{err:?}");
    // A digest that is not hex names nothing.
    let odd = Handle::Blob("../../etc/passwd".to_owned());
    assert_eq!(store.get_blob(&odd).unwrap(), None);
}

#[test]
fn reading_a_run_whose_database_is_not_made_yet_makes_none() {
    let dir = tempfile::tempdir().unwrap();
    let writer = DirStore::open(dir.path()).unwrap();
    writer.append("r", 0, &[started("r", 1)]).unwrap();
    // What a writer that has made the run's directory, and not yet its database, leaves;
    // or a directory that is no run at all.
    let made = dir.path().join("runs").join("new");
    std::fs::create_dir(&made).unwrap();
    let reader = DirStore::open(dir.path()).unwrap();
    let ids: Vec<String> = reader
        .runs()
        .unwrap()
        .into_iter()
        .map(|s| s.run_id)
        .collect();
    assert_eq!(ids, ["r"]);
    assert!(matches!(
        reader.load("new"),
        Err(StoreError::RunNotFound(_))
    ));
    assert_eq!(
        std::fs::read_dir(&made).unwrap().count(),
        0,
        "a reader wrote"
    );
    // Its writer then makes it as if nobody had looked.
    writer.append("new", 0, &[started("new", 2)]).unwrap();
    assert_eq!(reader.load("new").unwrap(), [started("new", 2)]);
}

#[test]
fn a_directory_of_other_files_or_an_unknown_format_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("notes.txt"), "mine").unwrap();
    assert!(matches!(
        DirStore::open(dir.path()),
        Err(StoreError::NotAStore(_))
    ));
    // A file, or a path through one: named, whichever it is.
    let file = dir.path().join("notes.txt");
    for path in [file.clone(), file.join("sub")] {
        let err = DirStore::open(&path).unwrap_err();
        assert!(
            matches!(&err, StoreError::NotADirectory { path: p, file: f } if *p == path && *f == file),
            "{err:?}"
        );
        let err = SledStore::open(&path).unwrap_err();
        assert!(matches!(err, StoreError::NotADirectory { .. }), "{err:?}");
    }
    let other = tempfile::tempdir().unwrap();
    DirStore::open(other.path()).unwrap();
    std::fs::write(other.path().join("agent-store"), "format=9\n").unwrap();
    let err = DirStore::open(other.path()).unwrap_err();
    assert!(
        matches!(&err, StoreError::UnknownFormat { found, expected, .. }
            if found == "9" && *expected == DIR_FORMAT_VERSION),
        "{err:?}"
    );
}

#[test]
fn a_store_whose_creation_was_cut_short_is_created_again() {
    let dir = tempfile::tempdir().unwrap();
    // What a crash before the layout file leaves.
    for sub in ["runs", "blobs", "tmp"] {
        std::fs::create_dir(dir.path().join(sub)).unwrap();
    }
    std::fs::write(dir.path().join("tmp/agent-store.1.0"), "half").unwrap();
    let store = DirStore::open(dir.path()).unwrap();
    store.append("r", 0, &[started("r", 1)]).unwrap();
    // With a run in it, it is no longer taken for an empty one.
    std::fs::remove_file(dir.path().join("agent-store")).unwrap();
    assert!(matches!(
        DirStore::open(dir.path()),
        Err(StoreError::NotAStore(_))
    ));
}

/// A format-1 store: one sled database holding two runs and a blob.
fn format_1_store(path: &std::path::Path) -> Handle {
    let old = SledStore::open(path).unwrap();
    old.append("r1", 0, &[started("r1", 1), filler(2, 1)])
        .unwrap();
    old.append("r2", 0, &[started("r2", 2)]).unwrap();
    old.put_blob(b"an old blob").unwrap()
}

fn check_converted(path: &std::path::Path, blob: &Handle) {
    let store = DirStore::open(path).unwrap();
    assert_eq!(store.load("r1").unwrap(), [started("r1", 1), filler(2, 1)]);
    assert_eq!(store.load("r2").unwrap(), [started("r2", 2)]);
    assert_eq!(
        store.get_blob(blob).unwrap().as_deref(),
        Some(&b"an old blob"[..])
    );
    let ids: Vec<String> = store
        .runs()
        .unwrap()
        .into_iter()
        .map(|s| s.run_id)
        .collect();
    assert_eq!(ids, ["r1", "r2"]);
    assert!(path.join("legacy-format-1").join("db").exists());
    assert!(!path.join("db").exists());
    assert_eq!(store.append("r2", 1, &[filler(2, 1)]).unwrap(), 2);
}

#[test]
fn a_format_1_store_is_converted_and_its_files_kept_aside() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(".agent");
    let blob = format_1_store(&path);
    check_converted(&path, &blob);
    // Opened again: converted once only.
    let store = DirStore::open(&path).unwrap();
    assert_eq!(store.load("r2").unwrap().len(), 2);
}

#[test]
fn handles_opening_one_format_1_store_at_once_convert_it_once() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(".agent");
    let blob = format_1_store(&path);
    // Each handle opens the directory as another process would (see the top of the file).
    let barrier = std::sync::Barrier::new(6);
    std::thread::scope(|s| {
        let opened: Vec<_> = (0..6)
            .map(|_| {
                s.spawn(|| {
                    barrier.wait();
                    DirStore::open(&path).map(drop)
                })
            })
            .collect();
        for handle in opened {
            handle.join().unwrap().unwrap();
        }
    });
    check_converted(&path, &blob);
}

#[test]
fn a_conversion_cut_short_is_finished_from_what_it_left() {
    // Cut before the move: the staged copy is thrown away and made again.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(".agent");
    let blob = format_1_store(&path);
    let staging = path.join("converting-to-format-2");
    std::fs::create_dir_all(staging.join("runs/half")).unwrap();
    check_converted(&path, &blob);
    assert!(!staging.exists());

    // Cut in the middle of the move: some old files aside, the staged layout not yet up.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(".agent");
    let blob = format_1_store(&path);
    DirStore::open(&path).unwrap();
    // Undo the end of the move by hand: the layout back in staging, `conf` back on top.
    let staging = path.join("converting-to-format-2");
    std::fs::create_dir(&staging).unwrap();
    for name in ["runs", "blobs", "tmp", "agent-store"] {
        std::fs::rename(path.join(name), staging.join(name)).unwrap();
    }
    std::fs::rename(path.join("legacy-format-1/conf"), path.join("conf")).unwrap();
    check_converted(&path, &blob);
    assert!(path.join("legacy-format-1").join("conf").exists());
}
