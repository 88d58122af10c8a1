//! Runs queued for workers on any number of machines, taken under leases.
//!
//! A worker claims the oldest runnable run, or a running one whose lease expired (its
//! worker died or stalled), with `FOR UPDATE SKIP LOCKED`, so concurrent claims never take
//! the same run. A claim draws a new lease token from a sequence; every commit of the
//! run through [`FencedStore`] checks, in its own transaction, that the token still holds.
//! A worker that lost its lease can therefore commit nothing, whatever its clock says: the
//! database's clock alone decides expiry.

use std::sync::Arc;
use std::time::Duration;

use agent_core::{Entry, Handle};

use super::{PostgresStore, decode_summary, engine};
use crate::{RunSummary, Store, StoreError};

/// Where a queued run stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QueueState {
    /// Waiting for a worker.
    Runnable,
    /// Driven by the worker holding its lease.
    Running,
    /// Waiting for a person (approval, an answer, a settlement); `wake` makes it runnable.
    Paused,
    /// Ended for good.
    Ended,
}

impl QueueState {
    fn as_str(self) -> &'static str {
        match self {
            QueueState::Runnable => "runnable",
            QueueState::Running => "running",
            QueueState::Paused => "paused",
            QueueState::Ended => "ended",
        }
    }
}

/// A queued run no worker started ([`PostgresStore::never_started`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NeverStarted {
    /// The run.
    pub run_id: String,
    /// What was submitted (its format is the caller's).
    pub spec: String,
    /// Taken off the queue before any worker started it.
    pub taken_off: bool,
    /// When it was submitted (ms since the epoch).
    pub queued_at_ms: u64,
}

/// A run taken by a worker: what to drive and the token its commits carry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Lease {
    /// The run.
    pub run_id: String,
    /// What the submitter recorded for a worker to drive it (its format is the caller's).
    pub spec: String,
    /// The lease's token: the newest claim of the run holds the only valid one.
    pub token: i64,
}

fn millis(ttl: Duration) -> f64 {
    ttl.as_secs_f64() * 1000.0
}

/// A connection listening for runs that became runnable (`LISTEN agent_queue`: every
/// [`PostgresStore::submit`] and [`PostgresStore::wake`] announces one), so that idle
/// workers need not poll.
pub struct Listener {
    client: postgres::Client,
}

impl Listener {
    /// Waits at most `timeout` for an announcement; whether one came (all that came are
    /// taken). A connection that broke is an error: poll instead.
    pub fn wait(&mut self, timeout: Duration) -> Result<bool, StoreError> {
        use postgres::fallible_iterator::FallibleIterator;
        let mut notifications = self.client.notifications();
        let mut came = false;
        let mut wait = timeout;
        // The first waits; the rest are only those already there.
        while notifications
            .timeout_iter(wait)
            .next()
            .map_err(|e| engine(&e))?
            .is_some()
        {
            came = true;
            wait = Duration::ZERO;
        }
        Ok(came)
    }
}

impl PostgresStore {
    /// A connection of its own that listens for runs becoming runnable.
    pub fn listen(&self) -> Result<Listener, StoreError> {
        let mut client = super::open(&self.url)?;
        client
            .batch_execute("LISTEN agent_queue")
            .map_err(|e| engine(&e))?;
        Ok(Listener { client })
    }

    /// Queues run `run_id` with `spec` (what a worker needs to drive it). Queuing the
    /// same run again is refused as a conflict.
    pub fn submit(&self, run_id: &str, spec: &str) -> Result<(), StoreError> {
        let inserted = self
            .client()?
            .execute(
                "WITH queued AS (
                     INSERT INTO agent_queue (run_id, spec, state) VALUES ($1, $2, 'runnable')
                     ON CONFLICT (run_id) DO NOTHING RETURNING run_id)
                 SELECT pg_notify('agent_queue', run_id) FROM queued",
                &[&run_id, &spec],
            )
            .map_err(|e| engine(&e))?;
        if inserted == 0 {
            return Err(StoreError::Conflict {
                run_id: run_id.to_owned(),
                expected: 0,
                actual: 0,
            });
        }
        Ok(())
    }

    /// Takes the oldest runnable run, or a running one whose lease expired, for `owner`,
    /// for `ttl`; `None` when there is nothing to do.
    pub fn claim(&self, owner: &str, ttl: Duration) -> Result<Option<Lease>, StoreError> {
        let row = self
            .client()?
            .query_opt(
                "UPDATE agent_queue SET
                     state = 'running',
                     stop_asked = false,
                     stop_runs = '{}',
                     -- The notes still here are for this drive: what people said to a run
                     -- before it began ([`PostgresStore::note_unstarted`]), or to a drive
                     -- that died before a commit held it. A drive that ended let go of its
                     -- own ([`PostgresStore::release`]).
                     lease_owner = $1,
                     lease_token = nextval('agent_lease_tokens'),
                     lease_expires_at = now() + $2 * interval '1 millisecond',
                     updated_at = now()
                 WHERE run_id = (
                     SELECT run_id FROM agent_queue
                     WHERE state = 'runnable'
                        OR (state = 'running' AND lease_expires_at <= now())
                     ORDER BY created_at, run_id
                     FOR UPDATE SKIP LOCKED
                     LIMIT 1)
                 RETURNING run_id, spec, lease_token",
                &[&owner, &millis(ttl)],
            )
            .map_err(|e| engine(&e))?;
        Ok(row.map(|r| Lease {
            run_id: r.get(0),
            spec: r.get(1),
            token: r.get(2),
        }))
    }

    /// Extends `lease` by `ttl` from now; `false` when it was lost (taken over after it
    /// expired, or released).
    pub fn renew(&self, lease: &Lease, ttl: Duration) -> Result<bool, StoreError> {
        let renewed = self
            .client()?
            .execute(
                "UPDATE agent_queue SET
                     lease_expires_at = now() + $3 * interval '1 millisecond',
                     updated_at = now()
                 WHERE run_id = $1 AND lease_token = $2 AND state IN ('running', 'held')",
                &[&lease.run_id, &lease.token, &millis(ttl)],
            )
            .map_err(|e| engine(&e))?;
        Ok(renewed == 1)
    }

    /// Gives the run back in `state` (runnable, paused or ended); `false` when the lease
    /// was lost meanwhile, and then nothing changes. A runnable run is announced to idle
    /// workers, as a new one is. A run that stopped lets go of the notes no commit held
    /// (their senders are told it stopped before it read them); one handed back between
    /// two steps keeps them for the worker that takes it up.
    pub fn release(&self, lease: &Lease, state: QueueState) -> Result<bool, StoreError> {
        let mut client = self.client()?;
        let released = client
            .execute(
                "UPDATE agent_queue SET
                     state = $3, lease_owner = NULL, lease_expires_at = NULL,
                     notes = CASE WHEN $3 = 'runnable' THEN notes ELSE '[]' END,
                     updated_at = now()
                 WHERE run_id = $1 AND lease_token = $2",
                &[&lease.run_id, &lease.token, &state.as_str()],
            )
            .map_err(|e| engine(&e))?;
        if released == 1 && state == QueueState::Runnable {
            client
                .execute("SELECT pg_notify('agent_queue', $1)", &[&lease.run_id])
                .map_err(|e| engine(&e))?;
        }
        Ok(released == 1)
    }

    /// Makes a paused or ended run runnable again (a person answered it, or sent it a
    /// message); `false` when it was neither.
    pub fn wake(&self, run_id: &str) -> Result<bool, StoreError> {
        let woken = self
            .client()?
            .execute(
                "WITH woken AS (
                     UPDATE agent_queue SET state = 'runnable', updated_at = now()
                     WHERE run_id = $1 AND state IN ('paused', 'ended') RETURNING run_id)
                 SELECT pg_notify('agent_queue', run_id) FROM woken",
                &[&run_id],
            )
            .map_err(|e| engine(&e))?;
        Ok(woken == 1)
    }

    /// Keeps a run that waits for a worker from the workers for a moment (it is marked
    /// `paused`), so that something can be recorded in its log with no worker writing
    /// beside it; [`PostgresStore::wake`] hands it back. `false` when it was not waiting for
    /// a worker (one took it first).
    pub fn hold_back(&self, run_id: &str) -> Result<bool, StoreError> {
        let held = self
            .client()?
            .execute(
                "UPDATE agent_queue SET state = 'paused', updated_at = now()
                 WHERE run_id = $1 AND state = 'runnable'",
                &[&run_id],
            )
            .map_err(|e| engine(&e))?;
        Ok(held == 1)
    }

    /// Takes a run waiting for a worker, or for a person's answer, off the queue (`agent
    /// cancel`): no worker takes it after this. `false` when it was not waiting (a worker
    /// took it first, or it was never queued).
    pub fn dequeue(&self, run_id: &str) -> Result<bool, StoreError> {
        let taken_off = self
            .client()?
            .execute(
                "UPDATE agent_queue SET state = 'ended', updated_at = now()
                 WHERE run_id = $1 AND state IN ('runnable', 'paused')",
                &[&run_id],
            )
            .map_err(|e| engine(&e))?;
        Ok(taken_off == 1)
    }

    /// The queued runs no worker started (they have no log, so [`Store::runs`] does not
    /// list them): waiting for one, or taken off the queue first ([`PostgresStore::dequeue`],
    /// then [`QueueState::Ended`]). Each with what was submitted and when (ms since the
    /// epoch), oldest first.
    pub fn never_started(&self) -> Result<Vec<NeverStarted>, StoreError> {
        let rows = self
            .client()?
            .query(
                "SELECT q.run_id, q.spec, q.state,
                        (extract(epoch FROM q.created_at) * 1000)::BIGINT
                 FROM agent_queue q
                 WHERE q.state <> 'held'
                   AND NOT EXISTS (SELECT 1 FROM agent_runs r WHERE r.run_id = q.run_id)
                 ORDER BY q.created_at, q.run_id",
                &[],
            )
            .map_err(|e| engine(&e))?;
        Ok(rows
            .iter()
            .map(|row| {
                let state: String = row.get(2);
                let at: i64 = row.get(3);
                NeverStarted {
                    run_id: row.get(0),
                    spec: row.get(1),
                    taken_off: state == QueueState::Ended.as_str(),
                    queued_at_ms: u64::try_from(at).unwrap_or(0),
                }
            })
            .collect())
    }

    /// The worker holding an unexpired lease on the run, if one does.
    pub fn lease_holder(&self, run_id: &str) -> Result<Option<String>, StoreError> {
        self.live_lease_owner(run_id, &["running"], "lease_owner")
    }

    /// Who drives run `run_id` now, in words: a worker (`worker HOST:PID/SLOT`) or a process
    /// that holds it (in its own words, [`PostgresStore::hold`]); `None` when nothing does.
    pub fn driven_by(&self, run_id: &str) -> Result<Option<String>, StoreError> {
        self.live_lease_owner(run_id, &["running", "held"], DRIVER)
    }

    /// `what` (a column expression) of an unexpired lease in one of `states` (`running`
    /// for a worker's, `held` for a process's) on the run, or, while a sub-agent's run is
    /// running, on the run it belongs to: its holder drives both.
    fn live_lease_owner(
        &self,
        run_id: &str,
        states: &[&str],
        what: &str,
    ) -> Result<Option<String>, StoreError> {
        let mut runs = vec![run_id];
        if agent_core::parent_run_id(run_id).is_some() && self.is_running(run_id)? {
            runs.extend(agent_core::ancestor_run_ids(run_id));
        }
        let row = self
            .client()?
            .query_opt(
                &format!(
                    "SELECT {what} FROM agent_queue
                     WHERE run_id = ANY($1) AND state = ANY($2) AND lease_expires_at > now()
                     ORDER BY length(run_id) DESC LIMIT 1"
                ),
                &[&runs, &states],
            )
            .map_err(|e| engine(&e))?;
        Ok(row.and_then(|r| r.get(0)))
    }

    /// Whether the run's log says it is running (it neither ended nor waits for a person).
    fn is_running(&self, run_id: &str) -> Result<bool, StoreError> {
        let row = self
            .client()?
            .query_opt(
                "SELECT summary FROM agent_runs WHERE run_id = $1",
                &[&run_id],
            )
            .map_err(|e| engine(&e))?;
        Ok(match row {
            Some(row) => decode_summary(run_id, row.get(0))?.status == "running",
            None => false,
        })
    }

    /// Where a queued run stands, if it is queued.
    pub fn queue_state(&self, run_id: &str) -> Result<Option<QueueState>, StoreError> {
        let row = self
            .client()?
            .query_opt(
                "SELECT state FROM agent_queue WHERE run_id = $1",
                &[&run_id],
            )
            .map_err(|e| engine(&e))?;
        Ok(row.and_then(|r| {
            let state: String = r.get(0);
            [
                QueueState::Runnable,
                QueueState::Running,
                QueueState::Paused,
                QueueState::Ended,
            ]
            .into_iter()
            .find(|s| s.as_str() == state)
        }))
    }
}

/// Who drives a run, from its lease's row: a process that holds it says who it is, a
/// worker's name is its host, PID and slot.
pub(super) const DRIVER: &str =
    "CASE WHEN state = 'held' THEN lease_owner ELSE 'worker ' || lease_owner END";

/// The process that holds a run on the database ([`PostgresStore::hold`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Holder {
    /// Who it is, in words (`process 1234 on builder`).
    pub owner: String,
    /// What its holder said of the machine it runs on, to tell later whether it is still
    /// there (its format is the caller's).
    pub machine: String,
    /// Its lease's token.
    pub token: i64,
}

/// What [`PostgresStore::hold`] came to.
#[derive(Debug)]
pub enum Hold {
    /// The run is held by this process under this lease.
    Held(Lease),
    /// The run is in the queue: workers drive it, and it is not held this way.
    Queued,
    /// Another process holds it, and its lease has not run out.
    By(Holder),
}

impl PostgresStore {
    /// Holds run `run_id` (new or not) for a process that drives it without the queue
    /// (`agent run`, `resume`, `approve`, `chat`), as `owner` (who it is, in words) on
    /// `machine`, for `ttl`: its commits are then fenced like a worker's
    /// ([`FencedStore::holding`]), `agent cancel` can ask it to stop the run, and another
    /// process cannot drive the run meanwhile. A hold whose lease ran out is taken over, and
    /// so is the one whose token is `over` (a holder the caller knows to be dead). Workers
    /// never claim a held run.
    pub fn hold(
        &self,
        run_id: &str,
        owner: &str,
        machine: &str,
        ttl: Duration,
        over: Option<i64>,
    ) -> Result<Hold, StoreError> {
        if run_id.is_empty() || run_id.contains('\0') {
            return Err(StoreError::InvalidRunId {
                id: run_id.to_owned(),
                rule: crate::error::ANY_RUN_ID,
            });
        }
        let mut client = self.client()?;
        // A sub-agent's run is driven by whoever holds the run it belongs to.
        let ancestors: Vec<&str> = agent_core::ancestor_run_ids(run_id).collect();
        if !ancestors.is_empty() {
            let row = client
                .query_opt(
                    &format!(
                        "SELECT {DRIVER}, lease_machine, lease_token
                         FROM agent_queue
                         WHERE run_id = ANY($1) AND state IN ('running', 'held')
                           AND lease_expires_at > now() AND lease_token IS DISTINCT FROM $2
                         ORDER BY length(run_id) DESC LIMIT 1"
                    ),
                    &[&ancestors, &over],
                )
                .map_err(|e| engine(&e))?;
            if let Some(row) = row {
                return Ok(Hold::By(Holder {
                    owner: row.get::<_, Option<String>>(0).unwrap_or_default(),
                    machine: row.get::<_, Option<String>>(1).unwrap_or_default(),
                    token: row.get::<_, Option<i64>>(2).unwrap_or_default(),
                }));
            }
        }
        // A hold that runs out between the two statements is looked for again.
        for _ in 0..3 {
            let row = client
                .query_opt(
                    "INSERT INTO agent_queue AS q
                         (run_id, spec, state, lease_owner, lease_machine, lease_token,
                          lease_expires_at)
                     VALUES ($1, '', 'held', $2, $3, nextval('agent_lease_tokens'),
                             now() + $4 * interval '1 millisecond')
                     ON CONFLICT (run_id) DO UPDATE SET
                         lease_owner = EXCLUDED.lease_owner,
                         lease_machine = EXCLUDED.lease_machine,
                         lease_token = EXCLUDED.lease_token,
                         lease_expires_at = EXCLUDED.lease_expires_at,
                         stop_asked = false,
                         stop_runs = '{}',
                         updated_at = now()
                     WHERE q.state = 'held'
                       AND (q.lease_expires_at <= now() OR q.lease_token = $5)
                     RETURNING lease_token",
                    &[&run_id, &owner, &machine, &millis(ttl), &over],
                )
                .map_err(|e| engine(&e))?;
            if let Some(row) = row {
                return Ok(Hold::Held(Lease {
                    run_id: run_id.to_owned(),
                    spec: String::new(),
                    token: row.get(0),
                }));
            }
            let row = client
                .query_opt(
                    "SELECT state, lease_owner, lease_machine, lease_token,
                            lease_expires_at > now()
                     FROM agent_queue WHERE run_id = $1",
                    &[&run_id],
                )
                .map_err(|e| engine(&e))?;
            let Some(row) = row else { continue };
            let state: String = row.get(0);
            if state != "held" {
                return Ok(Hold::Queued);
            }
            if row.get::<_, Option<bool>>(4) == Some(true) {
                return Ok(Hold::By(Holder {
                    owner: row.get::<_, Option<String>>(1).unwrap_or_default(),
                    machine: row.get::<_, Option<String>>(2).unwrap_or_default(),
                    token: row.get::<_, Option<i64>>(3).unwrap_or_default(),
                }));
            }
        }
        Err(StoreError::Engine(format!(
            "run {run_id}: its hold changed hands three times while it was taken; try again"
        )))
    }

    /// The process holding run `run_id` ([`PostgresStore::hold`]), if its lease has not run
    /// out.
    pub fn held_by(&self, run_id: &str) -> Result<Option<String>, StoreError> {
        self.live_lease_owner(run_id, &["held"], "lease_owner")
    }

    /// Lets go of a run held under `lease`: another process may drive it at once.
    pub fn let_go(&self, lease: &Lease) -> Result<(), StoreError> {
        self.client()?
            .execute(
                "DELETE FROM agent_queue WHERE run_id = $1 AND lease_token = $2 AND state = 'held'",
                &[&lease.run_id, &lease.token],
            )
            .map_err(|e| engine(&e))?;
        Ok(())
    }
}

/// A held run's lease kept alive by a thread, renewed every third of its length, and let go
/// when dropped.
struct Renewal {
    stop: Option<std::sync::mpsc::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
    store: Arc<PostgresStore>,
    lease: Lease,
}

impl std::fmt::Debug for Renewal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Renewal")
            .field("lease", &self.lease)
            .finish()
    }
}

impl Drop for Renewal {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        // A database that does not answer lets the lease run out instead. On a thread of its
        // own: the synchronous client cannot be used where an async runtime runs, and the
        // store may be dropped there.
        let store = Arc::clone(&self.store);
        let lease = self.lease.clone();
        let _ = std::thread::spawn(move || store.let_go(&lease)).join();
    }
}

/// The store as the worker holding `lease` sees it: every commit of the leased run checks
/// the lease in its own transaction and fails with [`StoreError::LeaseLost`] once another
/// worker took the run over. Reads, blobs and other runs pass through.
#[derive(Debug)]
pub struct FencedStore {
    store: Arc<PostgresStore>,
    lease: Lease,
    /// When the database was last asked whether someone asked to stop the run, or one of
    /// its sub-agents' runs.
    stop_looked: std::sync::Mutex<std::collections::HashMap<String, std::time::Instant>>,
    /// How many of each run's first notes on the row were handed out to its drive and are
    /// not held by a commit yet: see [`PostgresStore::notes_of`].
    handed: std::sync::Mutex<std::collections::HashMap<String, usize>>,
    /// For a held run, its lease's renewal, kept for its drop: the lease is let go once the
    /// store is done.
    _renewal: Option<Renewal>,
}

/// How often a worker asks the database whether someone asked to stop its run, at most.
const STOP_LOOK: Duration = Duration::from_secs(1);

impl FencedStore {
    /// The store of `lease`'s holder.
    pub fn new(store: Arc<PostgresStore>, lease: Lease) -> FencedStore {
        FencedStore {
            store,
            lease,
            stop_looked: std::sync::Mutex::default(),
            handed: std::sync::Mutex::default(),
            _renewal: None,
        }
    }

    /// The store of a run held by this process ([`PostgresStore::hold`] gave `lease`): a
    /// thread renews the lease every third of `ttl` for as long as the store lives, and the
    /// run is let go when it is dropped. (A lease that could not be renewed in time may be
    /// taken over; this store's commits then fail with [`StoreError::LeaseLost`].)
    pub fn holding(store: Arc<PostgresStore>, lease: Lease, ttl: Duration) -> FencedStore {
        let (stop, stopped) = std::sync::mpsc::channel::<()>();
        let thread = {
            let store = Arc::clone(&store);
            let lease = lease.clone();
            std::thread::spawn(move || {
                while let Err(std::sync::mpsc::RecvTimeoutError::Timeout) =
                    stopped.recv_timeout(ttl / 3)
                {
                    // One that fails is tried again at the next third.
                    let _ = store.renew(&lease, ttl);
                }
            })
        };
        let renewal = Renewal {
            stop: Some(stop),
            thread: Some(thread),
            store: Arc::clone(&store),
            lease: lease.clone(),
        };
        FencedStore {
            _renewal: Some(renewal),
            ..FencedStore::new(store, lease)
        }
    }
}

impl PostgresStore {
    /// Asks the worker or process holding run `run_id` to stop it (`agent cancel`), through
    /// the run's lease or, for a sub-agent's run, the lease on the run it belongs to (the
    /// request names it); `false` when none holds it.
    pub(super) fn ask_worker_to_stop(&self, run_id: &str) -> Result<bool, StoreError> {
        let mut runs = vec![run_id];
        runs.extend(agent_core::ancestor_run_ids(run_id));
        let asked = self
            .client()?
            .execute(
                "UPDATE agent_queue SET
                     stop_asked = stop_asked OR run_id = $1,
                     stop_runs = CASE WHEN run_id = $1 OR $1 = ANY(stop_runs) THEN stop_runs
                                      ELSE array_append(stop_runs, $1) END
                 WHERE run_id = ANY($2) AND state IN ('running', 'held')
                   AND lease_expires_at > now()",
                &[&run_id, &runs],
            )
            .map_err(|e| engine(&e))?;
        Ok(asked >= 1)
    }

    /// Hands a person's note for run `run_id` to the worker or process that holds it (for a
    /// sub-agent's run, the run it belongs to), on its lease's row (`notes`: pairs of the
    /// run and the text, 64 at most unread); `false` when none holds it, or it holds 64.
    pub(super) fn tell_holder(&self, run_id: &str, text: &str) -> Result<bool, StoreError> {
        let mut runs = vec![run_id];
        runs.extend(agent_core::ancestor_run_ids(run_id));
        let told = self
            .client()?
            .execute(
                "UPDATE agent_queue
                 SET notes = notes || jsonb_build_array(jsonb_build_array($1::text, $3::text))
                 WHERE run_id = (
                     SELECT run_id FROM agent_queue
                     WHERE run_id = ANY($2) AND state IN ('running', 'held')
                       AND lease_expires_at > now()
                     ORDER BY length(run_id) DESC LIMIT 1)
                   AND jsonb_array_length(notes) < 64",
                &[&run_id, &runs, &text],
            )
            .map_err(|e| engine(&e))?;
        Ok(told == 1)
    }

    /// Keeps a person's note for queued run `run_id` that no worker has begun yet, for its
    /// first model call: the worker that begins it reads it ([`FencedStore::told`], before
    /// the drive) and commits it with the run's start; it stays here until that commit
    /// holds it. `false` when the run is not waiting to begin (a worker took
    /// it meanwhile, or it has a log), or holds 64 notes.
    pub fn note_unstarted(&self, run_id: &str, text: &str) -> Result<bool, StoreError> {
        let noted = self
            .client()?
            .execute(
                "UPDATE agent_queue
                 SET notes = notes || jsonb_build_array(jsonb_build_array($1::text, $2::text)),
                     updated_at = now()
                 WHERE run_id = $1 AND state = 'runnable'
                   AND NOT EXISTS (SELECT 1 FROM agent_runs r WHERE r.run_id = $1)
                   AND jsonb_array_length(notes) < 64",
                &[&run_id, &text],
            )
            .map_err(|e| engine(&e))?;
        Ok(noted == 1)
    }

    /// Keeps a person's note for queued run `run_id` whose worker stopped renewing its
    /// lease in the middle of a step (it died, or lost the database): the worker that takes
    /// the run over reads it before its next model call ([`FencedStore::told`]) and commits
    /// it there; it stays on the row until a commit holds it. `false` when the run is not
    /// in that state (a worker holds it, or took it over meanwhile), or holds 64 notes.
    pub fn note_orphaned(&self, run_id: &str, text: &str) -> Result<bool, StoreError> {
        let noted = self
            .client()?
            .execute(
                "UPDATE agent_queue
                 SET notes = notes || jsonb_build_array(jsonb_build_array($1::text, $2::text))
                 WHERE run_id = $1 AND state = 'running' AND lease_expires_at <= now()
                   AND jsonb_array_length(notes) < 64",
                &[&run_id, &text],
            )
            .map_err(|e| engine(&e))?;
        Ok(noted == 1)
    }

    /// The notes for `run_id` on the row of `lease` (its run, or a sub-agent's run of it)
    /// not handed out yet, in the order they came. They stay on the row: the commit that
    /// holds them takes them off (`notes` of the commit function), so that a worker that
    /// dies before that commit leaves them to the one that takes the run over. `handed` is
    /// how many of the run's first notes there were handed out already; it counts them
    /// all now.
    fn notes_of(
        &self,
        lease: &Lease,
        run_id: &str,
        handed: &mut usize,
    ) -> Result<Vec<String>, StoreError> {
        let row = self
            .client()?
            .query_opt(
                "SELECT notes::text FROM agent_queue WHERE run_id = $1 AND lease_token = $2",
                &[&lease.run_id, &lease.token],
            )
            .map_err(|e| engine(&e))?;
        let Some(row) = row else {
            return Ok(Vec::new());
        };
        let notes: Vec<(String, String)> = serde_json::from_str(row.get(0)).unwrap_or_default();
        let waiting: Vec<String> = notes
            .into_iter()
            .filter(|(run, _)| run == run_id)
            .map(|(_, text)| text)
            .collect();
        let given = (*handed).min(waiting.len());
        *handed = waiting.len();
        Ok(waiting.into_iter().skip(given).collect())
    }

    /// Whether the holder of `lease` was asked to stop `run_id` (its run, or a sub-agent's
    /// run of it) since it last looked.
    fn stop_asked_of(&self, lease: &Lease, run_id: &str) -> Result<bool, StoreError> {
        let row = self
            .client()?
            .query_opt(
                "UPDATE agent_queue SET
                     stop_asked = stop_asked AND run_id <> $3,
                     stop_runs = array_remove(stop_runs, $3)
                 WHERE run_id = $1 AND lease_token = $2
                   AND CASE WHEN run_id = $3 THEN stop_asked ELSE $3 = ANY(stop_runs) END
                 RETURNING run_id",
                &[&lease.run_id, &lease.token, &run_id],
            )
            .map_err(|e| engine(&e))?;
        Ok(row.is_some())
    }
}

impl Store for FencedStore {
    fn append(
        &self,
        run_id: &str,
        expected_version: u64,
        entries: &[Entry],
    ) -> Result<u64, StoreError> {
        // A sub-agent's run goes with the run it belongs to.
        if !agent_core::in_family_of(&self.lease.run_id, run_id) {
            return self
                .store
                .append_fenced(run_id, expected_version, entries, None);
        }
        // The notes it holds that were handed out from the row ([`Store::told`]): the drive
        // commits them in the order it was handed them, before it looks for more, and a
        // note it was given otherwise (`agent resume RUN MESSAGE` of an interrupted run)
        // before it looks at all. They leave the row with the commit.
        let handed = self.handed.lock().unwrap_or_else(|p| p.into_inner());
        let notes = entries
            .iter()
            .filter(|e| matches!(e.event, agent_core::Event::UserNote { .. }))
            .count();
        let count = handed.get(run_id).copied().unwrap_or(0);
        let held = notes.min(count);
        drop(handed);
        let version = self.store.append_fenced(
            run_id,
            expected_version,
            entries,
            Some((&self.lease, held)),
        )?;
        if held > 0 {
            let mut handed = self.handed.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(count) = handed.get_mut(run_id) {
                *count = count.saturating_sub(held);
            }
        }
        Ok(version)
    }

    fn load(&self, run_id: &str) -> Result<Vec<Entry>, StoreError> {
        self.store.load(run_id)
    }

    fn load_from(&self, run_id: &str, from: u64) -> Result<Vec<Entry>, StoreError> {
        self.store.load_from(run_id, from)
    }

    fn ask_to_stop(&self, run_id: &str) -> Result<bool, StoreError> {
        self.store.ask_worker_to_stop(run_id)
    }

    fn tell(&self, run_id: &str, text: &str) -> Result<bool, StoreError> {
        self.store.tell_holder(run_id, text)
    }

    /// The leased run's notes, and its sub-agents' runs'; none when the database does not
    /// answer now (they are looked for again before the next model call).
    fn told(&self, run_id: &str) -> Vec<String> {
        if !agent_core::in_family_of(&self.lease.run_id, run_id) {
            return Vec::new();
        }
        let mut handed = self.handed.lock().unwrap_or_else(|p| p.into_inner());
        let count = handed.entry(run_id.to_owned()).or_default();
        self.store
            .notes_of(&self.lease, run_id, count)
            .unwrap_or_default()
    }

    /// Nothing: the notes on the row are unread by any drive (one that ended let go of its
    /// own, [`PostgresStore::release`]; one that died left them for this one).
    fn let_go_of_notes(&self, run_id: &str) {
        let _ = run_id;
    }

    /// Asks the database at most every second for each run (the driver looks more often):
    /// the leased run and its sub-agents' runs.
    fn stop_asked(&self, run_id: &str) -> Option<bool> {
        if !agent_core::in_family_of(&self.lease.run_id, run_id) {
            return Some(false);
        }
        {
            let mut looked = self.stop_looked.lock().unwrap_or_else(|p| p.into_inner());
            let now = std::time::Instant::now();
            if looked
                .get(run_id)
                .is_some_and(|&at| now.duration_since(at) < STOP_LOOK)
            {
                return Some(false);
            }
            looked.insert(run_id.to_owned(), now);
        }
        // A database that does not answer now is asked again later.
        Some(
            self.store
                .stop_asked_of(&self.lease, run_id)
                .unwrap_or(false),
        )
    }

    fn runs(&self) -> Result<Vec<RunSummary>, StoreError> {
        self.store.runs()
    }

    fn put_blob(&self, bytes: &[u8]) -> Result<Handle, StoreError> {
        self.store.put_blob(bytes)
    }

    fn get_blob(&self, handle: &Handle) -> Result<Option<Vec<u8>>, StoreError> {
        self.store.get_blob(handle)
    }
}
