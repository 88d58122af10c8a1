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

#[test]
fn commits_that_arrive_while_one_is_on_its_way_share_the_next_round_trip() {
    const WRITERS: u64 = 12;
    let cluster = Cluster::start();
    let store = PostgresStore::connect(&cluster.url()).unwrap();
    store.append("held", 0, &[started("held", 1)]).unwrap();
    // Another session holds the run's row: the next commit of `held` waits in the database.
    let mut holder = postgres::Client::connect(&cluster.url(), postgres::NoTls).unwrap();
    let mut tx = holder.transaction().unwrap();
    tx.execute(
        "SELECT 1 FROM agent_runs WHERE run_id = 'held' FOR UPDATE",
        &[],
    )
    .unwrap();
    let before = store.commit_stats();
    std::thread::scope(|s| {
        let store = &store;
        s.spawn(move || store.append("held", 1, &[filler(2, 1)]).unwrap());
        while store.commit_stats().round_trips == before.round_trips {
            std::thread::yield_now();
        }
        for w in 0..WRITERS {
            s.spawn(move || {
                let run = format!("w{w}");
                store.append(&run, 0, &[started(&run, 1)]).unwrap();
            });
        }
        // Every writer waits behind the commit on its way; then the row is let go.
        while store.commit_stats().waiting < WRITERS as usize {
            std::thread::yield_now();
        }
        tx.commit().unwrap();
    });
    let after = store.commit_stats();
    assert_eq!(after.commits - before.commits, WRITERS + 1);
    assert_eq!(
        after.round_trips - before.round_trips,
        2,
        "the {WRITERS} waiting commits went in one round trip"
    );
    let runs = store.runs().unwrap();
    assert_eq!(runs.len() as u64, WRITERS + 1);
    assert!(
        runs.iter()
            .all(|r| r.version == if r.run_id == "held" { 2 } else { 1 })
    );
}

#[test]
fn a_failing_commit_in_a_shared_round_trip_takes_none_of_the_others_with_it() {
    let cluster = Cluster::start();
    let store = PostgresStore::connect(&cluster.url()).unwrap();
    let other = PostgresStore::connect(&cluster.url()).unwrap();
    store.append("mine", 0, &[started("mine", 1)]).unwrap();
    // Another writer moved `mine` on: this store's next commit of it is stale.
    other.append("mine", 1, &[filler(2, 1)]).unwrap();
    store.append("gate", 0, &[started("gate", 1)]).unwrap();
    let mut holder = postgres::Client::connect(&cluster.url(), postgres::NoTls).unwrap();
    let mut tx = holder.transaction().unwrap();
    tx.execute(
        "SELECT 1 FROM agent_runs WHERE run_id = 'gate' FOR UPDATE",
        &[],
    )
    .unwrap();
    let before = store.commit_stats();
    std::thread::scope(|s| {
        let store = &store;
        s.spawn(move || store.append("gate", 1, &[filler(2, 1)]).unwrap());
        while store.commit_stats().round_trips == before.round_trips {
            std::thread::yield_now();
        }
        // The stale commit and eight good ones wait together for the next round trip.
        let stale = s.spawn(move || store.append("mine", 1, &[filler(2, 7)]));
        let fresh: Vec<_> = (0..8)
            .map(|w| {
                s.spawn(move || {
                    let run = format!("f{w}");
                    store.append(&run, 0, &[started(&run, 1)])
                })
            })
            .collect();
        while store.commit_stats().waiting < 9 {
            std::thread::yield_now();
        }
        tx.commit().unwrap();
        let refused = stale.join().unwrap().unwrap_err();
        assert!(
            matches!(
                refused,
                StoreError::Conflict {
                    expected: 1,
                    actual: 2,
                    ..
                }
            ),
            "{refused:?}"
        );
        for f in fresh {
            assert_eq!(f.join().unwrap().unwrap(), 1);
        }
    });
    assert_eq!(store.commit_stats().round_trips - before.round_trips, 2);
    assert_eq!(store.load("mine").unwrap()[1], filler(2, 1));
}

#[test]
fn a_commit_the_database_could_not_serialize_is_sent_again() {
    let cluster = Cluster::start();
    let mut admin = postgres::Client::connect(&cluster.url(), postgres::NoTls).unwrap();
    // As a distributed PostgreSQL-compatible database runs every transaction.
    admin
        .batch_execute(
            "ALTER DATABASE postgres SET default_transaction_isolation TO 'serializable'",
        )
        .unwrap();
    let store = PostgresStore::connect(&cluster.url()).unwrap();
    store.append("x", 0, &[started("x", 1)]).unwrap();
    let mut holder = postgres::Client::connect(&cluster.url(), postgres::NoTls).unwrap();
    let mut tx = holder.transaction().unwrap();
    tx.execute(
        "UPDATE agent_runs SET summary = summary WHERE run_id = 'x'",
        &[],
    )
    .unwrap();
    let waiting_on_a_lock = |admin: &mut postgres::Client| -> i64 {
        admin
            .query_one(
                "SELECT count(*) FROM pg_stat_activity
                 WHERE wait_event_type = 'Lock' AND query LIKE '%agent_commit_batch%'",
                &[],
            )
            .unwrap()
            .get(0)
    };
    std::thread::scope(|s| {
        let store = &store;
        let commit = s.spawn(move || store.append("x", 1, &[filler(2, 1)]));
        // The commit's statement has its snapshot and waits for the row.
        while waiting_on_a_lock(&mut admin) == 0 {
            std::thread::yield_now();
        }
        // The row changed under its snapshot: serializable isolation refuses it (40001).
        tx.commit().unwrap();
        assert_eq!(commit.join().unwrap().unwrap(), 2);
    });
    assert_eq!(store.commit_stats().retries, 1);
    assert_eq!(store.load("x").unwrap().len(), 2);
}

#[test]
fn a_listener_hears_of_runs_submitted_and_woken() {
    use std::time::Duration;
    let cluster = Cluster::start();
    let store = PostgresStore::connect(&cluster.url()).unwrap();
    let mut listener = store.listen().unwrap();
    assert!(!listener.wait(Duration::ZERO).unwrap(), "nothing yet");
    store.submit("r", "spec").unwrap();
    // Announced at the submit's commit; the long timeout only bounds a broken test.
    assert!(listener.wait(Duration::from_secs(60)).unwrap());
    assert!(!listener.wait(Duration::ZERO).unwrap(), "taken once");
    let lease = store.claim("w", Duration::from_secs(60)).unwrap().unwrap();
    store
        .release(&lease, agent_store::QueueState::Paused)
        .unwrap();
    assert!(
        !listener.wait(Duration::ZERO).unwrap(),
        "a pause announces nothing"
    );
    assert!(store.wake("r").unwrap());
    assert!(listener.wait(Duration::from_secs(60)).unwrap());
    assert!(
        !store.wake("r").unwrap(),
        "a runnable run is not woken again"
    );
    assert!(!listener.wait(Duration::ZERO).unwrap());
}

#[test]
fn queued_runs_are_claimed_oldest_first_once_each_and_paused_runs_wake() {
    use agent_store::QueueState;
    use std::time::Duration;
    let cluster = Cluster::start();
    let store = PostgresStore::connect(&cluster.url()).unwrap();
    let minute = Duration::from_secs(60);
    for run in ["q1", "q2", "q3"] {
        store.submit(run, &format!("spec of {run}")).unwrap();
    }
    assert!(
        matches!(
            store.submit("q1", "again"),
            Err(StoreError::Conflict { .. })
        ),
        "a run is queued once"
    );
    let a = store.claim("worker-a", minute).unwrap().unwrap();
    assert_eq!((a.run_id.as_str(), a.spec.as_str()), ("q1", "spec of q1"));
    let b = store.claim("worker-b", minute).unwrap().unwrap();
    assert_eq!(b.run_id, "q2");
    assert_ne!(a.token, b.token);
    assert_eq!(store.queue_state("q1").unwrap(), Some(QueueState::Running));
    // A run paused for a person comes back when woken.
    assert!(store.release(&a, QueueState::Paused).unwrap());
    let c = store.claim("worker-c", minute).unwrap().unwrap();
    assert_eq!(c.run_id, "q3", "a paused run is not claimed");
    assert!(store.claim("worker-c", minute).unwrap().is_none());
    assert!(store.wake("q1").unwrap());
    assert!(!store.wake("q1").unwrap(), "only a paused run wakes");
    let again = store.claim("worker-c", minute).unwrap().unwrap();
    assert_eq!(again.run_id, "q1");
    assert!(again.token > a.token);
    assert!(store.release(&again, QueueState::Ended).unwrap());
    assert_eq!(store.queue_state("q1").unwrap(), Some(QueueState::Ended));
    assert_eq!(store.queue_state("nope").unwrap(), None);

    // Workers racing for the queue: each run is taken exactly once.
    for i in 0..20 {
        store.submit(&format!("race-{i:02}"), "s").unwrap();
    }
    let taken: Vec<String> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..6)
            .map(|w| {
                let store = &store;
                s.spawn(move || {
                    let mut mine = Vec::new();
                    while let Some(lease) = store.claim(&format!("w{w}"), minute).unwrap() {
                        mine.push(lease.run_id);
                    }
                    mine
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect()
    });
    let mut sorted = taken.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(
        sorted.len(),
        taken.len(),
        "no run was taken twice: {taken:?}"
    );
    assert_eq!(taken.len(), 20);
}

/// A note for a queued run whose worker's lease ran out is kept on its row and handed to
/// the worker that takes the run over; a run a worker holds, or one waiting for its first
/// worker, is not noted this way.
#[test]
fn a_note_for_a_run_whose_lease_ran_out_goes_to_the_worker_that_takes_it_over() {
    use agent_store::FencedStore;
    use std::sync::Arc;
    use std::time::Duration;
    let cluster = Cluster::start();
    let store = Arc::new(PostgresStore::connect(&cluster.url()).unwrap());
    store.submit("live", "s").unwrap();
    store.submit("dead", "s").unwrap();
    assert!(!store.note_orphaned("live", "not begun").unwrap());
    let live = store.claim("a", Duration::from_secs(60)).unwrap().unwrap();
    assert_eq!(live.run_id, "live");
    // A lease of no time at all: run out as soon as it is taken.
    let dead = store.claim("b", Duration::ZERO).unwrap().unwrap();
    assert_eq!(dead.run_id, "dead");
    assert!(!store.note_orphaned("live", "its worker holds it").unwrap());
    assert!(store.note_orphaned("dead", "for the next").unwrap());
    assert!(!store.note_orphaned("nope", "no such run").unwrap());
    let next = store.claim("c", Duration::from_secs(60)).unwrap().unwrap();
    assert_eq!(next.run_id, "dead");
    assert_eq!(
        FencedStore::new(Arc::clone(&store), next).told("dead"),
        ["for the next"]
    );
    assert!(!store.note_orphaned("dead", "taken over").unwrap());
}

#[test]
fn a_worker_whose_lease_expired_and_was_taken_over_commits_nothing() {
    use agent_store::{FencedStore, QueueState};
    use std::sync::Arc;
    use std::time::Duration;
    let cluster = Cluster::start();
    let store = Arc::new(PostgresStore::connect(&cluster.url()).unwrap());
    let run = "leased";
    store.submit(run, "spec").unwrap();
    // A lease of no length: expired at once, as if the worker stalled past it.
    let stalled = store.claim("stalled", Duration::ZERO).unwrap().unwrap();
    let old = FencedStore::new(Arc::clone(&store), stalled.clone());
    assert_eq!(old.append(run, 0, &[started(run, 1)]).unwrap(), 1);
    // An expired lease drives nothing: the run is not listed as live.
    assert_eq!(store.runs().unwrap()[0].live, None);
    let taken = store
        .claim("rescuer", Duration::from_secs(60))
        .unwrap()
        .expect("an expired lease is taken over");
    assert_eq!(taken.run_id, run);
    let new = FencedStore::new(Arc::clone(&store), taken.clone());
    // The stalled worker wakes up: its commit, renewal and release all fail.
    let refused = old.append(run, 1, &[filler(2, 1)]).unwrap_err();
    assert!(
        matches!(&refused, StoreError::LeaseLost(r) if r == run),
        "{refused:?}"
    );
    assert!(!store.renew(&stalled, Duration::from_secs(60)).unwrap());
    assert!(!store.release(&stalled, QueueState::Ended).unwrap());
    // The new holder continues from the last commit.
    assert_eq!(
        new.load(run).unwrap().len(),
        1,
        "nothing of the stalled worker's was written"
    );
    assert_eq!(new.append(run, 1, &[filler(2, 1)]).unwrap(), 2);
    assert!(store.renew(&taken, Duration::from_secs(60)).unwrap());
    assert_eq!(
        store.runs().unwrap()[0].live.as_deref(),
        Some("worker rescuer"),
        "the lease holder is listed as driving it"
    );
    // A held lease is not taken over.
    assert!(
        store
            .claim("third", Duration::from_secs(60))
            .unwrap()
            .is_none()
    );
    // Other runs pass through the fence untouched.
    assert_eq!(new.append("other", 0, &[started("other", 1)]).unwrap(), 1);
}

/// A run a process drives without the queue is held: another process cannot hold it while
/// the lease lasts (it learns who does), can ask the holder to stop it, takes it over once
/// the lease ran out or from a holder it knows to be dead, and the first holder's commits
/// then fail. Workers never claim a held run, and one let go is gone from the queue.
/// A sub-agent's run goes with the run it belongs to: its commits are fenced by that run's
/// lease, it is driven by that run's holder (and asked to stop through it) while it runs,
/// no one else takes it meanwhile, and a holder of the sub-agent's run itself is not
/// written past.
#[test]
fn a_sub_agents_run_goes_with_the_run_it_belongs_to() {
    use agent_core::{CallId, Entry, Event, Outcome, TerminalReason, sub_agent_run_id};
    use agent_store::{FencedStore, Hold};
    use std::sync::Arc;
    use std::time::Duration;
    let cluster = Cluster::start();
    let store = Arc::new(PostgresStore::connect(&cluster.url()).unwrap());
    let minute = Duration::from_secs(60);
    let parent = "parent";
    let child = sub_agent_run_id(parent, 1, &CallId::from("d1"));
    let hold = |run: &str, who: &str, over: Option<i64>| {
        store
            .hold(run, &format!("process {who}"), who, minute, over)
            .unwrap()
    };
    let Hold::Held(first) = hold(parent, "1", None) else {
        panic!("a run nobody holds is held")
    };
    let fenced = FencedStore::new(Arc::clone(&store), first.clone());
    fenced.append(parent, 0, &[started(parent, 1)]).unwrap();
    fenced.append(&child, 0, &[started(&child, 2)]).unwrap();
    assert_eq!(store.held_by(&child).unwrap().as_deref(), Some("process 1"));
    let listed = store.runs().unwrap();
    let listed_child = listed.iter().find(|r| r.run_id == child).unwrap();
    assert_eq!(listed_child.live.as_deref(), Some("process 1"));
    // Nobody else takes it, though it has no hold of its own.
    let Hold::By(holder) = hold(&child, "2", None) else {
        panic!("a sub-agent's run is held with its parent")
    };
    assert_eq!(
        (holder.owner.as_str(), holder.token),
        ("process 1", first.token)
    );
    // Asked to stop, the parent's holder learns it for the sub-agent's run alone.
    assert!(store.ask_to_stop(&child).unwrap());
    assert_eq!(fenced.stop_asked(parent), Some(false));
    assert_eq!(fenced.stop_asked(&child), Some(true));
    assert!(
        !store.ask_to_stop("stranger.0123456789ab").unwrap(),
        "nobody holds a run by that name's parent"
    );
    // Ended, it is driven by nobody, though its parent still is.
    let end = Entry {
        version: 2,
        at_ms: 3,
        event: Event::RunEnded {
            outcome: Outcome::stop(TerminalReason::Cancelled, "asked"),
        },
    };
    fenced.append(&child, 1, &[end]).unwrap();
    assert_eq!(store.held_by(&child).unwrap(), None);
    assert_eq!(store.held_by(parent).unwrap().as_deref(), Some("process 1"));
    let listed = store.runs().unwrap();
    assert_eq!(
        listed.iter().find(|r| r.run_id == child).unwrap().live,
        None
    );
    // The parent taken over, its old holder writes neither run.
    let Hold::Held(second) = hold(parent, "3", Some(first.token)) else {
        panic!("a dead holder's run is taken over")
    };
    let lost = fenced.append(&child, 2, &[filler(3, 2)]).unwrap_err();
    assert!(
        matches!(&lost, StoreError::LeaseLost(run) if run == parent),
        "{lost:?}"
    );
    // A sub-agent's run someone else holds itself is not written by its parent's holder.
    store.let_go(&second).unwrap();
    let other = sub_agent_run_id(parent, 1, &CallId::from("d2"));
    let Hold::Held(_) = hold(&other, "4", None) else {
        panic!("a sub-agent's run whose parent nobody holds is held")
    };
    let Hold::Held(third) = hold(parent, "5", None) else {
        panic!("a run let go is held again")
    };
    let busy = FencedStore::new(Arc::clone(&store), third)
        .append(&other, 0, &[started(&other, 4)])
        .unwrap_err();
    assert!(
        matches!(&busy, StoreError::Busy { run_id, by } if run_id == &other && by == "process 4"),
        "{busy:?}"
    );
    assert!(matches!(
        store.load(&other),
        Err(StoreError::RunNotFound(_))
    ));
}

#[test]
fn a_run_held_by_a_process_is_its_alone_until_let_go_or_run_out() {
    use agent_store::{FencedStore, Hold};
    use std::sync::Arc;
    use std::time::Duration;
    let cluster = Cluster::start();
    let store = Arc::new(PostgresStore::connect(&cluster.url()).unwrap());
    let run = "held";
    let minute = Duration::from_secs(60);
    let Hold::Held(first) = store
        .hold(run, "process 1 on a", "a/1", minute, None)
        .unwrap()
    else {
        panic!("a run nobody holds is held")
    };
    // Held before its first commit, it is not a queued run no worker started.
    assert!(store.never_started().unwrap().is_empty());
    let fenced = FencedStore::holding(Arc::clone(&store), first.clone(), minute);
    assert_eq!(fenced.append(run, 0, &[started(run, 1)]).unwrap(), 1);
    assert_eq!(
        store.runs().unwrap()[0].live.as_deref(),
        Some("process 1 on a")
    );
    assert_eq!(
        store.held_by(run).unwrap().as_deref(),
        Some("process 1 on a")
    );
    let Hold::By(holder) = store
        .hold(run, "process 2 on b", "b/2", minute, None)
        .unwrap()
    else {
        panic!("a live hold is not taken")
    };
    assert_eq!(
        (holder.owner.as_str(), holder.machine.as_str(), holder.token),
        ("process 1 on a", "a/1", first.token)
    );
    assert!(
        store.claim("worker", minute).unwrap().is_none(),
        "workers leave it"
    );
    assert_eq!(store.queue_state(run).unwrap(), None, "not in the queue");
    // Asked to stop, the holder learns it once.
    assert!(store.ask_to_stop(run).unwrap());
    assert_eq!(fenced.stop_asked(run), Some(true));
    // Taken over from a holder known to be dead: its commits fail from then on.
    let Hold::Held(second) = store
        .hold(run, "process 2 on b", "b/2", minute, Some(holder.token))
        .unwrap()
    else {
        panic!("a dead holder's run is taken over")
    };
    let refused = fenced.append(run, 1, &[filler(2, 1)]).unwrap_err();
    assert!(matches!(refused, StoreError::LeaseLost(_)), "{refused:?}");
    drop(fenced);
    assert_eq!(
        store.held_by(run).unwrap().as_deref(),
        Some("process 2 on b"),
        "the dead one let nothing go"
    );
    // Let go, it is free at once; a lease that ran out is taken over.
    store.let_go(&second).unwrap();
    assert_eq!(store.held_by(run).unwrap(), None);
    assert_eq!(store.runs().unwrap()[0].live, None);
    let Hold::Held(brief) = store
        .hold(run, "process 3 on c", "c/3", Duration::ZERO, None)
        .unwrap()
    else {
        panic!("a run let go is held again")
    };
    assert_eq!(
        store.held_by(run).unwrap(),
        None,
        "a lease of no length ran out"
    );
    assert!(!store.ask_to_stop(run).unwrap(), "nobody to ask");
    assert!(matches!(
        store.hold(run, "process 4 on d", "d/4", minute, None).unwrap(),
        Hold::Held(lease) if lease.token > brief.token
    ));
    // A queued run is the workers': it is not held.
    store.submit("queued", "spec").unwrap();
    assert!(matches!(
        store
            .hold("queued", "process 5 on e", "e/5", minute, None)
            .unwrap(),
        Hold::Queued
    ));
}

/// A held run's lease is renewed while its store lives (its end moves on), and let go when
/// the store is dropped.
#[test]
fn a_held_runs_lease_is_renewed_while_its_store_lives_and_let_go_after() {
    use agent_store::{FencedStore, Hold};
    use std::sync::Arc;
    use std::time::{Duration, Instant};
    let cluster = Cluster::start();
    let store = Arc::new(PostgresStore::connect(&cluster.url()).unwrap());
    let mut admin = postgres::Client::connect(&cluster.url(), postgres::NoTls).unwrap();
    let mut ends = || -> f64 {
        admin
            .query_one(
                "SELECT extract(epoch FROM lease_expires_at)::float8 FROM agent_queue
                 WHERE run_id = 'r'",
                &[],
            )
            .unwrap()
            .get(0)
    };
    let ttl = Duration::from_secs(3);
    let Hold::Held(lease) = store.hold("r", "process 1 on a", "a/1", ttl, None).unwrap() else {
        panic!("held")
    };
    let first = ends();
    let fenced = FencedStore::holding(Arc::clone(&store), lease, ttl);
    // Renewed every second: waited for, not timed.
    let deadline = Instant::now() + Duration::from_secs(60);
    while ends() <= first {
        assert!(Instant::now() < deadline, "the lease was never renewed");
        std::thread::sleep(Duration::from_millis(50));
    }
    drop(fenced);
    assert_eq!(store.held_by("r").unwrap(), None);
    assert!(matches!(
        store.hold("r", "process 2 on b", "b/2", ttl, None).unwrap(),
        Hold::Held(_)
    ));
}

/// A person's notes reach the holder of a run through its lease's row: those for a
/// sub-agent's run through the run it belongs to, each handed once to the run it is for,
/// in the order they came. They stay on the row until a commit holds them (a holder that
/// took the run over is handed them again), and leave it with that commit. At most 64
/// wait there; a run nobody holds is told nothing.
#[test]
fn notes_reach_the_holder_of_a_run_once_each_and_leave_with_the_commit_that_holds_them() {
    use agent_core::{CallId, Entry, Event, sub_agent_run_id};
    use agent_store::{FencedStore, Hold};
    use std::sync::Arc;
    use std::time::Duration;
    let noted = |text: &str, version: u64| Entry {
        version,
        at_ms: 10 + version,
        event: Event::UserNote {
            text: text.to_owned(),
        },
    };
    let cluster = Cluster::start();
    let store = Arc::new(PostgresStore::connect(&cluster.url()).unwrap());
    let parent = "parent";
    let child = sub_agent_run_id(parent, 1, &CallId::from("d1"));
    assert!(!store.tell(parent, "nobody holds it").unwrap());
    let Hold::Held(lease) = store
        .hold(parent, "process 1", "1", Duration::from_secs(60), None)
        .unwrap()
    else {
        panic!("a run nobody holds is held")
    };
    let fenced = FencedStore::new(Arc::clone(&store), lease.clone());
    fenced.append(parent, 0, &[started(parent, 1)]).unwrap();
    fenced.append(&child, 0, &[started(&child, 2)]).unwrap();
    assert!(store.tell(parent, "first").unwrap());
    assert!(store.tell(&child, "for the child").unwrap());
    assert!(store.tell(parent, "second").unwrap());
    assert_eq!(fenced.told(&child), ["for the child"]);
    assert_eq!(fenced.told(parent), ["first", "second"]);
    assert!(fenced.told(parent).is_empty(), "handed once");
    assert!(fenced.told(&child).is_empty(), "handed once");
    // Held by no commit yet: one that drives the run after this one is handed them again.
    let after = FencedStore::new(Arc::clone(&store), lease.clone());
    assert_eq!(after.told(parent), ["first", "second"]);
    // A commit that holds one takes it off the row: the run's first, none of the others'.
    fenced.append(parent, 1, &[noted("first", 2)]).unwrap();
    assert!(
        fenced.told(parent).is_empty(),
        "\"second\" was handed already"
    );
    let after = FencedStore::new(Arc::clone(&store), lease.clone());
    assert_eq!(after.told(parent), ["second"]);
    assert_eq!(after.told(&child), ["for the child"]);
    fenced
        .append(&child, 1, &[noted("for the child", 2)])
        .unwrap();
    fenced.append(parent, 2, &[noted("second", 3)]).unwrap();
    let after = FencedStore::new(Arc::clone(&store), lease.clone());
    assert!(after.told(parent).is_empty() && after.told(&child).is_empty());
    assert!(
        !store.tell("stranger.0123456789ab", "to nobody").unwrap(),
        "nobody holds a run by that name's parent"
    );
    for n in 0..64 {
        assert!(store.tell(&child, &n.to_string()).unwrap(), "note {n}");
    }
    assert!(!store.tell(parent, "one too many").unwrap());
    let told = fenced.told(&child);
    assert_eq!(told.len(), 64);
    assert_eq!((told[0].as_str(), told[63].as_str()), ("0", "63"));
    assert!(!store.tell(parent, "handed, not held").unwrap());
    let held: Vec<Entry> = (0..64).map(|n| noted(&n.to_string(), 3 + n)).collect();
    fenced.append(&child, 2, &held).unwrap();
    assert!(store.tell(parent, "room again").unwrap());
    // A note the drive was given otherwise (with `agent resume` of an interrupted run),
    // committed before it looks, takes none of those waiting off the row.
    let other = FencedStore::new(Arc::clone(&store), lease.clone());
    other
        .append(parent, 3, &[noted("given otherwise", 4)])
        .unwrap();
    assert_eq!(other.told(parent), ["room again"]);
    other.append(parent, 4, &[noted("room again", 5)]).unwrap();
    assert!(fenced.told(parent).is_empty());
    assert!(fenced.told(&child).is_empty());
}
