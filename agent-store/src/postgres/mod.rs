//! The store on PostgreSQL (feature `postgres`): one database shared by any number of
//! processes and machines.
//!
//! Three tables: `agent_events` (one row per entry, primary key run id and version),
//! `agent_runs` (each run's version and summary) and `agent_blobs` (content-addressed
//! outputs). A commit is one subtransaction: the run's row is locked (`FOR UPDATE`), its
//! version checked against the commit's, the entries inserted and the summary written. Two
//! writers that both think they are first both insert version 1 of a new run: the primary
//! key refuses the second, which is reported as the conflict it is. The database enforces
//! the expected-version check; nothing here relies on one writer per run.
//!
//! The client is the synchronous `postgres` crate (tokio-postgres underneath, on a runtime
//! of its own): the `Store` trait is synchronous and the runtime calls it from blocking
//! threads. Call it from a blocking context, never from inside an async task. Reads each
//! take a connection of a small pool (opened as needed, up to [`MAX_CONNECTIONS`]).
//! Commits that arrive while one is on its way share the next round trip: one statement
//! carries them all, each in a subtransaction of its own (`commit.rs`), and the server
//! flushes its log once for them.

use std::collections::HashMap;
use std::sync::{Condvar, Mutex, MutexGuard};

use agent_core::{Entry, Handle};
use postgres::{Client, NoTls};

use crate::{RunSummary, Store, StoreError};

mod commit;
mod queue;

pub use commit::CommitStats;
pub use queue::{FencedStore, Hold, Holder, Lease, Listener, NeverStarted, QueueState};

/// The schema, created when missing.
const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS agent_runs (
    run_id  TEXT PRIMARY KEY,
    version BIGINT NOT NULL,
    summary TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS agent_events (
    run_id  TEXT NOT NULL,
    version BIGINT NOT NULL,
    entry   TEXT NOT NULL,
    PRIMARY KEY (run_id, version)
);
CREATE TABLE IF NOT EXISTS agent_blobs (
    handle TEXT PRIMARY KEY,
    bytes  BYTEA NOT NULL
);
CREATE SEQUENCE IF NOT EXISTS agent_lease_tokens;
CREATE TABLE IF NOT EXISTS agent_queue (
    run_id           TEXT PRIMARY KEY,
    spec             TEXT NOT NULL,
    state            TEXT NOT NULL,
    lease_owner      TEXT,
    lease_token      BIGINT,
    lease_expires_at TIMESTAMPTZ,
    created_at       TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at       TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS agent_queue_claimable ON agent_queue (state, created_at);
ALTER TABLE agent_queue ADD COLUMN IF NOT EXISTS stop_asked BOOLEAN NOT NULL DEFAULT false;
ALTER TABLE agent_queue ADD COLUMN IF NOT EXISTS lease_machine TEXT;
ALTER TABLE agent_queue ADD COLUMN IF NOT EXISTS stop_runs TEXT[] NOT NULL DEFAULT '{}';
ALTER TABLE agent_queue ADD COLUMN IF NOT EXISTS notes JSONB NOT NULL DEFAULT '[]';
";

/// Connections a store opens to its database, at most.
pub const MAX_CONNECTIONS: usize = 16;

/// A store in a PostgreSQL database.
pub struct PostgresStore {
    url: String,
    pool: Mutex<Pool>,
    returned: Condvar,
    batcher: commit::Batcher,
}

/// Idle connections, and how many are open in all.
struct Pool {
    idle: Vec<Client>,
    open: usize,
}

/// A connection taken from the pool; it goes back when dropped (unless it broke).
struct Pooled<'a> {
    store: &'a PostgresStore,
    client: Option<Client>,
}

impl std::ops::Deref for Pooled<'_> {
    type Target = Client;
    fn deref(&self) -> &Client {
        self.client
            .as_ref()
            .unwrap_or_else(|| unreachable!("a lease holds its client until dropped"))
    }
}

impl std::ops::DerefMut for Pooled<'_> {
    fn deref_mut(&mut self) -> &mut Client {
        self.client
            .as_mut()
            .unwrap_or_else(|| unreachable!("a lease holds its client until dropped"))
    }
}

impl Drop for Pooled<'_> {
    fn drop(&mut self) {
        let Some(client) = self.client.take() else {
            return;
        };
        let mut pool = self.store.lock();
        if client.is_closed() {
            // A broken connection is dropped; the next caller opens a new one.
            pool.open -= 1;
        } else {
            pool.idle.push(client);
        }
        drop(pool);
        self.store.returned.notify_one();
    }
}

impl std::fmt::Debug for PostgresStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the connection string: it may hold a password.
        f.debug_struct("PostgresStore").finish_non_exhaustive()
    }
}

fn engine(e: &postgres::Error) -> StoreError {
    // The error's own text is only "db error" when the server said what went wrong.
    match e.as_db_error() {
        Some(db) => StoreError::Engine(format!(
            "PostgreSQL: {} ({})",
            db.message(),
            db.code().code()
        )),
        None => StoreError::Engine(format!("PostgreSQL: {e}")),
    }
}

fn version(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}

fn signed(v: u64, run_id: &str) -> Result<i64, StoreError> {
    i64::try_from(v).map_err(|_| StoreError::Corrupt {
        what: format!("run {run_id}"),
        message: format!("version {v} does not fit the database"),
    })
}

impl PostgresStore {
    /// Connects to `url` (`postgres://user@host/db`, or the key-value form, including
    /// `host=/path/to/socket/dir`) and creates the tables when missing.
    pub fn connect(url: &str) -> Result<PostgresStore, StoreError> {
        let mut client = open(url)?;
        // One process at a time creates what is missing (concurrent `CREATE`s of one name
        // fail): the advisory lock is held to the end of the transaction.
        let mut tx = client.transaction().map_err(|e| engine(&e))?;
        tx.batch_execute("SELECT pg_advisory_xact_lock(7242011)")
            .and_then(|()| tx.batch_execute(SCHEMA))
            .and_then(|()| tx.batch_execute(commit::COMMIT_FUNCTION))
            .map_err(|e| engine(&e))?;
        tx.commit().map_err(|e| engine(&e))?;
        Ok(PostgresStore {
            url: url.to_owned(),
            pool: Mutex::new(Pool {
                idle: vec![client],
                open: 1,
            }),
            returned: Condvar::new(),
            batcher: commit::Batcher::default(),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Pool> {
        // The pool's state is consistent between statements: a panic elsewhere leaves it so.
        self.pool.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// An idle connection, a new one while fewer than [`MAX_CONNECTIONS`] are open, or the
    /// next one returned.
    fn client(&self) -> Result<Pooled<'_>, StoreError> {
        let mut pool = self.lock();
        loop {
            if let Some(client) = pool.idle.pop() {
                return Ok(Pooled {
                    store: self,
                    client: Some(client),
                });
            }
            if pool.open < MAX_CONNECTIONS {
                pool.open += 1;
                drop(pool);
                return match open(&self.url) {
                    Ok(client) => Ok(Pooled {
                        store: self,
                        client: Some(client),
                    }),
                    Err(e) => {
                        self.lock().open -= 1;
                        Err(e)
                    }
                };
            }
            pool = self.returned.wait(pool).unwrap_or_else(|p| p.into_inner());
        }
    }
}

fn open(url: &str) -> Result<Client, StoreError> {
    Client::connect(url, NoTls)
        .map_err(|e| StoreError::Engine(format!("cannot connect to PostgreSQL: {e}")))
}

fn decode_summary(run_id: &str, text: &str) -> Result<RunSummary, StoreError> {
    RunSummary::decode(run_id, text.as_bytes())
}

impl Store for PostgresStore {
    fn append(
        &self,
        run_id: &str,
        expected_version: u64,
        entries: &[Entry],
    ) -> Result<u64, StoreError> {
        self.append_fenced(run_id, expected_version, entries, None)
    }

    fn load(&self, run_id: &str) -> Result<Vec<Entry>, StoreError> {
        self.load_from(run_id, 1)
    }

    fn load_from(&self, run_id: &str, from: u64) -> Result<Vec<Entry>, StoreError> {
        let mut client = self.client()?;
        // One snapshot for the version and the entries.
        let mut tx = client
            .build_transaction()
            .isolation_level(postgres::IsolationLevel::RepeatableRead)
            .read_only(true)
            .start()
            .map_err(|e| engine(&e))?;
        let Some(row) = tx
            .query_opt(
                "SELECT version FROM agent_runs WHERE run_id = $1",
                &[&run_id],
            )
            .map_err(|e| engine(&e))?
        else {
            return Err(StoreError::RunNotFound(run_id.to_owned()));
        };
        let last = version(row.get(0));
        let first = from.clamp(1, last.saturating_add(1));
        let rows = tx
            .query(
                "SELECT version, entry FROM agent_events
                 WHERE run_id = $1 AND version >= $2 AND version <= $3 ORDER BY version",
                &[&run_id, &signed(first, run_id)?, &signed(last, run_id)?],
            )
            .map_err(|e| engine(&e))?;
        tx.commit().map_err(|e| engine(&e))?;
        let mut entries = Vec::with_capacity(rows.len());
        for row in rows {
            let v = version(row.get(0));
            let entry: Entry =
                serde_json::from_str(row.get(1)).map_err(|e| StoreError::Corrupt {
                    what: format!("entry {v} of run {run_id}"),
                    message: e.to_string(),
                })?;
            let expected = first + entries.len() as u64;
            if entry.version != expected || v != expected {
                return Err(StoreError::Corrupt {
                    what: format!("run {run_id}"),
                    message: format!("entry {} found where {expected} belongs", entry.version),
                });
            }
            entries.push(entry);
        }
        if first + entries.len() as u64 != last + 1 {
            return Err(StoreError::Corrupt {
                what: format!("run {run_id}"),
                message: format!(
                    "the index says version {last}, the log holds {} entries",
                    first - 1 + entries.len() as u64
                ),
            });
        }
        Ok(entries)
    }

    /// Asks the worker holding the run, through its queue row: the worker looks every
    /// second or so. A run no worker holds (not queued, or driven by an `agent run`
    /// process) cannot be asked.
    fn ask_to_stop(&self, run_id: &str) -> Result<bool, StoreError> {
        self.ask_worker_to_stop(run_id)
    }

    fn tell(&self, run_id: &str, text: &str) -> Result<bool, StoreError> {
        self.tell_holder(run_id, text)
    }

    fn runs(&self) -> Result<Vec<RunSummary>, StoreError> {
        let rows = self
            .client()?
            .query(
                // A worker of the queue, or a process that holds the run (it says who).
                &format!(
                    "SELECT r.run_id, r.summary, {} FROM agent_runs r
                     LEFT JOIN agent_queue q ON q.run_id = r.run_id
                         AND q.state IN ('running', 'held') AND q.lease_expires_at > now()
                     ORDER BY r.run_id",
                    queue::DRIVER
                ),
                &[],
            )
            .map_err(|e| engine(&e))?;
        let mut runs = rows
            .iter()
            .map(|row| {
                let summary = decode_summary(row.get(0), row.get(1))?;
                Ok(RunSummary {
                    live: row.get(2),
                    ..summary
                })
            })
            .collect::<Result<Vec<_>, StoreError>>()?;
        // A running sub-agent's run is driven by whoever drives the run it belongs to.
        let live: HashMap<String, String> = runs
            .iter()
            .filter_map(|r| Some((r.run_id.clone(), r.live.clone()?)))
            .collect();
        for run in &mut runs {
            if run.live.is_none() && run.status == "running" {
                run.live = agent_core::ancestor_run_ids(&run.run_id)
                    .find_map(|parent| live.get(parent).cloned());
            }
        }
        Ok(runs)
    }

    fn put_blob(&self, bytes: &[u8]) -> Result<Handle, StoreError> {
        let handle = Handle::of_bytes(bytes);
        self.client()?
            .execute(
                "INSERT INTO agent_blobs (handle, bytes) VALUES ($1, $2)
                 ON CONFLICT (handle) DO NOTHING",
                &[&handle.to_string(), &bytes],
            )
            .map_err(|e| engine(&e))?;
        Ok(handle)
    }

    fn get_blob(&self, handle: &Handle) -> Result<Option<Vec<u8>>, StoreError> {
        if !matches!(handle, Handle::Blob(_)) {
            return Ok(None);
        }
        let row = self
            .client()?
            .query_opt(
                "SELECT bytes FROM agent_blobs WHERE handle = $1",
                &[&handle.to_string()],
            )
            .map_err(|e| engine(&e))?;
        Ok(row.map(|r| r.get(0)))
    }
}
