//! The vendored sled's B-tree and page cache, where `vendor/sled` changed them (the split
//! of the rightmost leaf, the cache's shards): whatever the order of inserts and removes,
//! and with a cache small enough that pages are evicted and read back from disk, the tree
//! holds what a map would, in order, before and after it is opened again.

use std::collections::BTreeMap;

use proptest::prelude::*;

/// An operation on the tree: keys that only grow (a log's), keys anywhere, removals.
#[derive(Clone, Debug)]
enum Op {
    Append(u16),
    Insert(u32, u16),
    Remove(u32),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0u16..2_000).prop_map(Op::Append),
        3 => (any::<u32>(), 0u16..2_000).prop_map(|(k, n)| Op::Insert(k, n)),
        1 => any::<u32>().prop_map(Op::Remove),
    ]
}

/// Opens `config`'s database once the lock of a handle just dropped is released: sled
/// lets go of its file a moment after the last handle drops (a write or a truncation its
/// thread pool still finishes holds it), and `SledStore` waits for it the same way.
fn open_when_free(config: sled::Config) -> sled::Db {
    let started = std::time::Instant::now();
    loop {
        match config.open() {
            Ok(db) => return db,
            Err(sled::Error::Io(e))
                if e.to_string().contains("could not acquire lock")
                    && started.elapsed() < std::time::Duration::from_secs(10) =>
            {
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            Err(e) => panic!("{e}"),
        }
    }
}

/// A database whose cache holds a few pages: most are evicted and read back.
fn small_cache(path: &std::path::Path) -> sled::Db {
    open_when_free(sled::Config::new().path(path).cache_capacity(16 * 1024))
}

fn value(n: u16) -> Vec<u8> {
    vec![u8::try_from(n % 251).unwrap(); usize::from(n)]
}

fn check(tree: &sled::Tree, model: &BTreeMap<Vec<u8>, Vec<u8>>) -> Result<(), TestCaseError> {
    let stored: Vec<(Vec<u8>, Vec<u8>)> = tree
        .iter()
        .map(|kv| {
            let (k, v) = kv.unwrap();
            (k.to_vec(), v.to_vec())
        })
        .collect();
    let expected: Vec<(Vec<u8>, Vec<u8>)> =
        model.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    prop_assert_eq!(stored.len(), expected.len());
    prop_assert!(stored == expected, "the tree differs from the map");
    // Backwards too, and each key on its own.
    let backwards: Vec<Vec<u8>> = tree.iter().rev().map(|kv| kv.unwrap().0.to_vec()).collect();
    let mut keys: Vec<Vec<u8>> = model.keys().cloned().collect();
    keys.reverse();
    prop_assert_eq!(backwards, keys);
    for (k, v) in model {
        prop_assert_eq!(tree.get(k).unwrap().map(|v| v.to_vec()), Some(v.clone()));
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    #[test]
    fn the_tree_holds_what_a_map_holds_whatever_the_order(ops in proptest::collection::vec(op(), 1..400)) {
        let dir = tempfile::tempdir().unwrap();
        let mut model = BTreeMap::new();
        let mut next: u64 = 0;
        {
            let db = small_cache(dir.path());
            let tree = db.open_tree("t").unwrap();
            for op in &ops {
                match op {
                    Op::Append(n) => {
                        // Big-endian, after every key so far: the rightmost leaf grows.
                        let key = [[0xff_u8].as_slice(), &next.to_be_bytes()].concat();
                        next += 1;
                        tree.insert(&key, value(*n)).unwrap();
                        model.insert(key, value(*n));
                    }
                    Op::Insert(k, n) => {
                        let key = k.to_be_bytes().to_vec();
                        tree.insert(&key, value(*n)).unwrap();
                        model.insert(key, value(*n));
                    }
                    Op::Remove(k) => {
                        let key = k.to_be_bytes().to_vec();
                        tree.remove(&key).unwrap();
                        model.remove(&key);
                    }
                }
            }
            check(&tree, &model)?;
            db.flush().unwrap();
        }
        let db = small_cache(dir.path());
        check(&db.open_tree("t").unwrap(), &model)?;
    }
}

/// A database flushed only when asked, as the store flushes each commit, with a cache of
/// a few pages.
fn flushed_by_hand(path: &std::path::Path) -> sled::Db {
    open_when_free(
        sled::Config::new()
            .path(path)
            .cache_capacity(64 * 1024)
            .flush_every_ms(None),
    )
}

/// `vendor/sled` flushes with `fdatasync` and writes zeros ahead of its log's end, so that
/// a flush overwrites blocks the file has rather than growing it. A log several segments
/// long (512 KiB each), flushed after every entry as a store flushes each commit, with
/// entries past 128 KiB among them (those are files of their own), reads back whole when
/// opened again, and again after more is appended to the reopened log.
#[test]
fn a_log_of_many_segments_flushed_entry_by_entry_reads_back_whole() {
    let dir = tempfile::tempdir().unwrap();
    let open = || flushed_by_hand(dir.path());
    // Sizes that straddle pages, the zeroed stretch and segment ends; every 40th entry is
    // a blob.
    let size = |i: usize| match i % 40 {
        39 => 150_000 + i,
        n => 300 + n * 97 + (i * 7919) % 4_000,
    };
    let entry = |i: usize| vec![u8::try_from(i % 251).unwrap(); size(i)];
    let key = |i: usize| u64::try_from(i).unwrap().to_be_bytes();
    let mut written = 0;
    let mut total = 0;
    for round in 0..2 {
        let db = open();
        let tree = db.open_tree("log").unwrap();
        for i in 0..written {
            assert_eq!(
                tree.get(key(i)).unwrap().as_deref(),
                Some(entry(i).as_slice()),
                "entry {i} after reopening, round {round}"
            );
        }
        let upto = written + 400;
        for i in written..upto {
            tree.insert(key(i), entry(i)).unwrap();
            db.flush().unwrap();
            total += size(i);
        }
        written = upto;
    }
    assert!(
        total > 4 * 512 * 1024,
        "{total} bytes span too few segments"
    );
    let db = open();
    let tree = db.open_tree("log").unwrap();
    assert_eq!(tree.len(), written);
    for i in 0..written {
        assert_eq!(
            tree.get(key(i)).unwrap().as_deref(),
            Some(entry(i).as_slice()),
            "entry {i}"
        );
    }
}

/// A database opened again to be read keeps the size of what it holds: `vendor/sled` cuts
/// the file at the recovered end of its log, where sled filled the rest of the segment
/// with zeros (512 KiB on disk for every run ever shown). Appending after the cut works,
/// and everything reads back.
#[test]
fn a_database_opened_again_is_cut_at_its_log_not_padded_to_a_segment() {
    let dir = tempfile::tempdir().unwrap();
    let open = || flushed_by_hand(dir.path());
    let entry = |i: u64| format!("entry {i} ").repeat(40).into_bytes();
    let mut written = 0_u64;
    for round in 0..3 {
        {
            let db = open();
            let tree = db.open_tree("log").unwrap();
            for i in 0..written {
                assert_eq!(
                    tree.get(i.to_be_bytes()).unwrap().as_deref(),
                    Some(entry(i).as_slice()),
                    "entry {i}, round {round}"
                );
            }
            for i in written..written + 20 {
                tree.insert(i.to_be_bytes(), entry(i)).unwrap();
                db.flush().unwrap();
            }
            written += 20;
        }
        // Opened to be read, then closed: what `agent show` does.
        drop(open());
        let len = std::fs::metadata(dir.path().join("db")).unwrap().len();
        assert!(
            len < 128 * 1024,
            "round {round}: the database holds {written} small entries in {len} bytes"
        );
    }
}
