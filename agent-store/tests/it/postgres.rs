//! The PostgreSQL store against the conformance suite, on a throwaway cluster.

use agent_store::conformance::{check_all, check_reopen, filler, started};
use agent_store::testing::Cluster;
use agent_store::{PostgresStore, Store, StoreError};

#[test]
fn the_postgres_store_conforms_and_reopens() {
    let cluster = Cluster::start();
    check_all(&PostgresStore::connect(&cluster.url()).unwrap());
    let url = cluster.url();
    check_reopen(&|| Box::new(PostgresStore::connect(&url).unwrap()));
}

#[test]
fn two_writers_of_one_run_cannot_both_commit_a_version() {
    let cluster = Cluster::start();
    let a = PostgresStore::connect(&cluster.url()).unwrap();
    let b = PostgresStore::connect(&cluster.url()).unwrap();
    let run = "shared";
    assert_eq!(a.append(run, 0, &[started(run, 1)]).unwrap(), 1);
    // Both read version 1; the first commit wins, the second is a conflict.
    assert_eq!(a.append(run, 1, &[filler(2, 1)]).unwrap(), 2);
    let lost = b.append(run, 1, &[filler(2, 1)]).unwrap_err();
    assert!(
        matches!(
            lost,
            StoreError::Conflict {
                expected: 1,
                actual: 2,
                ..
            }
        ),
        "{lost:?}"
    );
    assert_eq!(
        b.load(run).unwrap().len(),
        2,
        "nothing of the loser was written"
    );
    // Many writers racing for the first entry of a new run: exactly one wins.
    let fresh = "fresh";
    let stores: Vec<PostgresStore> = (0..8)
        .map(|_| PostgresStore::connect(&cluster.url()).unwrap())
        .collect();
    let results: Vec<Result<u64, StoreError>> = std::thread::scope(|s| {
        let handles: Vec<_> = stores
            .iter()
            .map(|store| s.spawn(move || store.append(fresh, 0, &[started(fresh, 1)])))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(
        results.iter().filter(|r| r.is_ok()).count(),
        1,
        "{results:?}"
    );
    // The database's unique key refused the others, and said so as a conflict.
    assert!(
        results
            .iter()
            .filter_map(|r| r.as_ref().err())
            .all(|e| matches!(e, StoreError::Conflict { .. })),
        "{results:?}"
    );
    assert_eq!(a.load(fresh).unwrap().len(), 1);
}

#[test]
fn a_server_that_is_not_there_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let err =
        PostgresStore::connect(&format!("host={} user=agent", dir.path().display())).unwrap_err();
    assert!(
        err.to_string().contains("cannot connect to PostgreSQL"),
        "{err}"
    );
}

#[test]
fn one_store_serves_more_writers_than_it_has_connections() {
    let cluster = Cluster::start();
    let store = PostgresStore::connect(&cluster.url()).unwrap();
    let writers = 2 * agent_store::MAX_CONNECTIONS;
    std::thread::scope(|s| {
        for w in 0..writers {
            let store = &store;
            s.spawn(move || {
                let run = format!("writer-{w}");
                store.append(&run, 0, &[started(&run, 1)]).unwrap();
                for v in 2..=20u64 {
                    store
                        .append(&run, v - 1, &[filler(v, u32::try_from(v).unwrap())])
                        .unwrap();
                }
            });
        }
    });
    let runs = store.runs().unwrap();
    assert_eq!(runs.len(), writers);
    assert!(runs.iter().all(|r| r.version == 20), "{runs:?}");
    for r in &runs {
        let log = store.load(&r.run_id).unwrap();
        let versions: Vec<u64> = log.iter().map(|e| e.version).collect();
        assert_eq!(versions, (1..=20).collect::<Vec<u64>>());
    }
}
