//! Durability costs of the sled store, on the disk `TMPDIR` points at:
//! - raw fsync latency of that disk (the floor), and commit latency (p50/p99);
//! - durable turns per second with 1, 10, 100 and 1000 runs committing concurrently
//!   (group commit shares flushes);
//! - bytes on disk per turn at 100, 1,000 and 10,000 turns;
//! - the same on PostgreSQL (a throwaway cluster on the same disk, fsync on, reached on a
//!   Unix socket): commit latency, durable turns per second with 1, 4 and 16 writers, and
//!   what the database holds per turn.
//!
//! Run with `cargo bench -p agent-store --bench store`.
#![allow(
    missing_docs,
    clippy::print_stdout,
    clippy::unwrap_used,
    clippy::expect_used
)]

use std::io::Write;
use std::sync::Arc;
use std::time::{Duration, Instant};

use agent_core::*;
use agent_store::conformance::started;
use agent_store::{PostgresStore, SledStore, Store};
use serde_json::json;

/// A realistic turn: the decision and a 2 KB tool result.
fn turn(version: u64, turn: u32) -> Vec<Entry> {
    let call = ToolCall::new(
        format!("c{turn}"),
        "read_file",
        json!({"path": format!("src/file{turn}.rs")}),
    );
    vec![
        Entry {
            version,
            at_ms: 1_700_000_000_000 + version,
            event: Event::DecisionProposed {
                turn,
                decision: Decision::ToolCalls { calls: vec![call] },
                usage: Usage::tokens(1_200, 40),
                reasoning: Vec::new(),
            },
        },
        Entry {
            version: version + 1,
            at_ms: 1_700_000_000_001 + version,
            event: Event::ToolFinished {
                turn,
                result: ToolResult::ok(format!("c{turn}").into(), "read_file", "x".repeat(2_048)),
                effect_key: None,
            },
        },
    ]
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn fsync_latency(dir: &std::path::Path) {
    let mut file = std::fs::File::create(dir.join("fsync.probe")).unwrap();
    let block = vec![7u8; 4_096];
    let mut times = Vec::new();
    for _ in 0..300 {
        let t = Instant::now();
        file.write_all(&block).unwrap();
        file.sync_data().unwrap();
        times.push(t.elapsed());
    }
    times.sort();
    println!(
        "store: raw fsync (4 KiB write + fdatasync): p50 {:?}, p99 {:?}",
        percentile(&times, 0.5),
        percentile(&times, 0.99)
    );
}

fn commit_latency(name: &str, store: &dyn Store) {
    store.append("run", 0, &[started("run", 0)]).unwrap();
    let mut version = 1;
    let mut times = Vec::new();
    for t in 1..=300u32 {
        let entries = turn(version + 1, t);
        let start = Instant::now();
        version = store.append("run", version, &entries).unwrap();
        times.push(start.elapsed());
    }
    times.sort();
    println!(
        "{name}: commit of one turn (2 events, ~2.4 KB, flushed): p50 {:?}, p99 {:?}",
        percentile(&times, 0.5),
        percentile(&times, 0.99)
    );
}

fn concurrent_runs(name: &str, store: Arc<dyn Store>, runs: usize, turns_per_run: u32) {
    let start = Instant::now();
    let threads: Vec<_> = (0..runs)
        .map(|r| {
            let store = Arc::clone(&store);
            std::thread::spawn(move || {
                let id = format!("run-{runs}-{r:04}");
                let mut version = store.append(&id, 0, &[started(&id, 0)]).unwrap();
                let mut times = Vec::with_capacity(turns_per_run as usize);
                for t in 1..=turns_per_run {
                    let began = Instant::now();
                    version = store.append(&id, version, &turn(version + 1, t)).unwrap();
                    times.push(began.elapsed());
                }
                times
            })
        })
        .collect();
    let mut times: Vec<Duration> = threads
        .into_iter()
        .flat_map(|t| t.join().unwrap())
        .collect();
    let elapsed = start.elapsed().as_secs_f64();
    times.sort();
    let turns = runs as f64 * f64::from(turns_per_run);
    println!(
        "{name}: {runs:>4} concurrent runs x {turns_per_run} turns: {:.0} durable turns/s ({:.2} s), \
         commit p50 {:?}, p99 {:?}",
        turns / elapsed,
        elapsed,
        percentile(&times, 0.5),
        percentile(&times, 0.99)
    );
}

fn dir_size(path: &std::path::Path) -> u64 {
    std::fs::read_dir(path)
        .unwrap()
        .filter_map(Result::ok)
        .map(|e| {
            let meta = e.metadata().unwrap();
            if meta.is_dir() {
                dir_size(&e.path())
            } else {
                meta.len()
            }
        })
        .sum()
}

fn bytes_per_turn(dir: &std::path::Path, turns: u32) {
    let path = dir.join(format!("size-{turns}"));
    {
        let store = SledStore::open(&path).unwrap();
        let mut version = store.append("run", 0, &[started("run", 0)]).unwrap();
        for t in 1..=turns {
            version = store.append("run", version, &turn(version + 1, t)).unwrap();
        }
    }
    let size = dir_size(&path);
    let payload: usize = (1..=turns)
        .map(|t| serde_json::to_vec(&turn(1, t)).unwrap().len())
        .sum();
    println!(
        "store: {turns:>5} turns: {:.1} MB on disk, {:.0} bytes per turn (event JSON: {:.0} bytes per turn)",
        size as f64 / 1e6,
        size as f64 / f64::from(turns),
        payload as f64 / f64::from(turns)
    );
}

/// What the database holds per turn: its tables' sizes (with indexes and TOAST) after
/// `turns` turns of one run.
fn postgres_bytes_per_turn(url: &str, turns: u32) {
    let store = PostgresStore::connect(url).unwrap();
    let id = format!("size-{turns}");
    let mut version = store.append(&id, 0, &[started(&id, 0)]).unwrap();
    let mut client = postgres::Client::connect(url, postgres::NoTls).unwrap();
    let size = |client: &mut postgres::Client| -> i64 {
        client
            .query_one(
                "SELECT pg_total_relation_size('agent_events') + pg_total_relation_size('agent_runs')",
                &[],
            )
            .unwrap()
            .get(0)
    };
    let before = size(&mut client);
    for t in 1..=turns {
        version = store.append(&id, version, &turn(version + 1, t)).unwrap();
    }
    let grown = size(&mut client) - before;
    println!(
        "postgres: {turns:>5} turns: {:.1} MB more in the tables, {:.0} bytes per turn",
        grown as f64 / 1e6,
        grown as f64 / f64::from(turns)
    );
}

/// What the queue adds to a run: submitting it, a worker claiming it, one renewal and the
/// release at its end.
fn lease_overhead(url: &str) {
    let store = PostgresStore::connect(url).unwrap();
    let runs = 200;
    let ttl = Duration::from_secs(30);
    let start = Instant::now();
    for i in 0..runs {
        let id = format!("queued-{i}");
        store.submit(&id, "{}").unwrap();
        let lease = store.claim("bench", ttl).unwrap().unwrap();
        assert!(store.renew(&lease, ttl).unwrap());
        assert!(
            store
                .release(&lease, agent_store::QueueState::Ended)
                .unwrap()
        );
    }
    let per_run = start.elapsed() / runs;
    println!("postgres: queue overhead per run (submit, claim, renew, release): {per_run:?}");
}

fn main() {
    let dir = tempfile::tempdir().unwrap();
    fsync_latency(dir.path());
    commit_latency(
        "store",
        &SledStore::open(dir.path().join("latency")).unwrap(),
    );
    for runs in [1, 10, 100, 1000] {
        let store = SledStore::open(dir.path().join(format!("concurrent-{runs}"))).unwrap();
        concurrent_runs(
            "store",
            Arc::new(store),
            runs,
            (2_000 / runs as u32).clamp(5, 200),
        );
    }
    for turns in [100, 1_000, 10_000] {
        bytes_per_turn(dir.path(), turns);
    }
    let cluster = agent_store::testing::Cluster::start_durable();
    let url = cluster.url();
    commit_latency("postgres", &PostgresStore::connect(&url).unwrap());
    for runs in [1, 4, 16] {
        let store = PostgresStore::connect(&url).unwrap();
        concurrent_runs(
            "postgres",
            Arc::new(store),
            runs,
            (2_000 / runs as u32).clamp(5, 200),
        );
    }
    for turns in [100, 1_000] {
        postgres_bytes_per_turn(&url, turns);
    }
    lease_overhead(&url);
}
