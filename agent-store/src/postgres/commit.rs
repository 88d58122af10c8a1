//! Group commit: the commits that arrive while one is on its way go together in the next
//! round trip, as one statement (`agent_commit_batch_v3`, a function of the schema) that runs
//! each commit in a subtransaction of its own. One round trip and one flush of the server's
//! log serve them all; a commit that fails (a conflict, a lost lease) takes none of the
//! others with it.
//!
//! A commit needs the run's summary as of the version it expects: each store keeps the
//! summaries of the runs it wrote last, and reads one only when it has not got it.

use std::collections::HashMap;
use std::sync::{Condvar, Mutex};

use agent_core::Entry;
use postgres::error::SqlState;
use postgres::types::Type;
use serde::{Deserialize, Serialize};

use super::{Lease, PostgresStore, decode_summary, engine, signed, version};
use crate::{RunSummary, StoreError, check_batch};

/// The function a batch of commits calls. Each commit: the lease check (when fenced), the
/// run's row locked and its version compared, the entries inserted (the primary key on run
/// and version refuses a second writer), the summary written; all or nothing, each alone.
/// A fenced commit that holds a person's notes (`notes`: how many `user_note` entries)
/// takes that many of the run's first notes off the lease's row, in the same transaction:
/// a note stays there until a commit holds it, so that a worker that dies in between
/// leaves it to the one that takes the run over.
/// Its name carries its version: a process of an earlier `agent` that connects during an
/// upgrade creates its own function, and does not replace this one with one that does not
/// know a sub-agent's run is fenced by its parent's lease (`v2`), or that a commit takes
/// the notes it holds off the queue (`v3`).
pub(super) const COMMIT_FUNCTION: &str = "
CREATE OR REPLACE FUNCTION agent_commit_batch_v3(batch jsonb) RETURNS jsonb
LANGUAGE plpgsql AS $fn$
DECLARE
    c jsonb;
    current_version bigint;
    holder text;
    results jsonb := '[]'::jsonb;
BEGIN
    FOR c IN SELECT value FROM jsonb_array_elements(batch) LOOP
        BEGIN
            IF c->>'token' IS NOT NULL THEN
                -- A sub-agent's run is fenced by the lease on the run it belongs to, and
                -- is not written past a lease of its own that another holds.
                UPDATE agent_queue SET updated_at = now()
                 WHERE run_id = COALESCE(c->>'lease_run', c->>'run')
                   AND lease_token = (c->>'token')::bigint;
                IF NOT FOUND THEN
                    results := results || jsonb_build_array(jsonb_build_object('lease_lost', true));
                    CONTINUE;
                END IF;
                IF c->>'lease_run' IS NOT NULL THEN
                    SELECT CASE WHEN state = 'held' THEN COALESCE(lease_owner, '')
                                 ELSE 'worker ' || COALESCE(lease_owner, '') END
                      INTO holder FROM agent_queue
                     WHERE run_id = c->>'run' AND lease_expires_at > now()
                       AND lease_token IS DISTINCT FROM (c->>'token')::bigint;
                    IF FOUND THEN
                        results := results || jsonb_build_array(jsonb_build_object('held_by', holder));
                        CONTINUE;
                    END IF;
                END IF;
            END IF;
            SELECT version INTO current_version FROM agent_runs
             WHERE run_id = c->>'run' FOR UPDATE;
            IF NOT FOUND THEN
                current_version := 0;
            END IF;
            IF current_version <> (c->>'expected')::bigint THEN
                results := results || jsonb_build_array(jsonb_build_object('actual', current_version));
                CONTINUE;
            END IF;
            INSERT INTO agent_events (run_id, version, entry)
                SELECT c->>'run', (e->>'v')::bigint, e->>'e'
                  FROM jsonb_array_elements(c->'entries') AS e;
            INSERT INTO agent_runs (run_id, version, summary)
                VALUES (c->>'run', (c->>'version')::bigint, c->>'summary')
                ON CONFLICT (run_id) DO UPDATE
                SET version = EXCLUDED.version, summary = EXCLUDED.summary;
            IF c->>'notes' IS NOT NULL AND c->>'token' IS NOT NULL THEN
                UPDATE agent_queue SET notes = COALESCE((
                    SELECT jsonb_agg(n ORDER BY i) FROM (
                        SELECT n, i,
                               count(*) FILTER (WHERE n->>0 = c->>'run') OVER (ORDER BY i)
                                   AS seen
                          FROM jsonb_array_elements(notes) WITH ORDINALITY AS e(n, i)) AS t
                     WHERE n->>0 IS DISTINCT FROM c->>'run'
                        OR seen > (c->>'notes')::bigint), '[]'::jsonb)
                 WHERE run_id = COALESCE(c->>'lease_run', c->>'run')
                   AND lease_token = (c->>'token')::bigint;
            END IF;
            results := results || jsonb_build_array(
                jsonb_build_object('version', (c->>'version')::bigint));
        EXCEPTION WHEN unique_violation THEN
            -- Another writer inserted these versions first.
            results := results || jsonb_build_array(jsonb_build_object('actual', -1));
        END;
    END LOOP;
    RETURN results;
END
$fn$;
";

/// The most commits sent in one round trip, and about the most bytes.
const MAX_BATCH: usize = 64;
const MAX_BATCH_BYTES: usize = 8 << 20;
/// How many times a batch the database gave up on as a whole is sent.
const MAX_ATTEMPTS: u32 = 5;
/// Summaries kept for the runs written last.
const MAX_SUMMARIES: usize = 1024;

/// One commit as the batch function reads it.
#[derive(Serialize)]
struct Commit {
    run: String,
    expected: i64,
    token: Option<i64>,
    /// The run whose lease `token` is, when not `run` (its sub-agent's).
    #[serde(skip_serializing_if = "Option::is_none")]
    lease_run: Option<String>,
    /// How many `user_note` entries it holds, when any: that many of the run's notes
    /// leave the lease's row with it.
    #[serde(skip_serializing_if = "Option::is_none")]
    notes: Option<usize>,
    entries: Vec<Encoded>,
    summary: String,
    version: i64,
}

#[derive(Serialize)]
struct Encoded {
    v: i64,
    e: String,
}

/// What the batch function says of one commit.
#[derive(Deserialize)]
struct Verdict {
    version: Option<i64>,
    actual: Option<i64>,
    #[serde(default)]
    lease_lost: bool,
    /// Who else holds the sub-agent's run the commit was for.
    held_by: Option<String>,
}

type Outcome = Result<u64, StoreError>;

/// How a store's commits went to the database: how many shared each round trip.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CommitStats {
    /// Commits asked for.
    pub commits: u64,
    /// Round trips (batches) that carried them.
    pub round_trips: u64,
    /// Commits waiting now for the next round trip.
    pub waiting: usize,
    /// Batches sent again after the database gave up on them as a whole.
    pub retries: u64,
}

/// Commits waiting for the next round trip, and the outcomes of those sent.
#[derive(Default)]
pub(super) struct Batcher {
    state: Mutex<BatchState>,
    done: Condvar,
    summaries: Mutex<HashMap<String, RunSummary>>,
}

#[derive(Default)]
struct BatchState {
    /// Round trips made, for [`CommitStats`].
    round_trips: u64,
    /// Batches sent again.
    retries: u64,
    next_ticket: u64,
    queue: Vec<(u64, Commit, usize)>,
    outcomes: HashMap<u64, Outcome>,
    sending: bool,
}

impl PostgresStore {
    /// How this store's commits went to the database so far.
    pub fn commit_stats(&self) -> CommitStats {
        let state = self.batcher.state.lock().unwrap_or_else(|p| p.into_inner());
        CommitStats {
            commits: state.next_ticket,
            round_trips: state.round_trips,
            waiting: state.queue.len(),
            retries: state.retries,
        }
    }

    /// Appends as [`crate::Store::append`] does; with `fence`, only while that lease still
    /// holds (checked in the same transaction): the run's own, or the one on the run it is a
    /// sub-agent's run of, when no one else holds the sub-agent's run itself. The fence
    /// also says how many of the run's notes queued on the lease's row the entries hold
    /// (their `user_note`s that came from there): that many leave the row with them.
    pub(super) fn append_fenced(
        &self,
        run_id: &str,
        expected_version: u64,
        entries: &[Entry],
        fence: Option<(&Lease, usize)>,
    ) -> Result<u64, StoreError> {
        let (fence, held) = match fence {
            Some((lease, held)) => (Some(lease), held),
            None => (None, 0),
        };
        if run_id.is_empty() || run_id.contains('\0') {
            return Err(StoreError::InvalidRunId {
                id: run_id.to_owned(),
                rule: crate::error::ANY_RUN_ID,
            });
        }
        check_batch(run_id, expected_version, expected_version, entries)?;
        let mut summary = self.summary_at(run_id, expected_version)?;
        let mut encoded = Vec::with_capacity(entries.len());
        let mut bytes = 0;
        for entry in entries {
            let text = serde_json::to_string(entry).map_err(|err| StoreError::Corrupt {
                what: format!("new entry {} of run {run_id}", entry.version),
                message: err.to_string(),
            })?;
            bytes += text.len();
            encoded.push(Encoded {
                v: signed(entry.version, run_id)?,
                e: text,
            });
            summary.apply(entry);
        }
        let commit = Commit {
            run: run_id.to_owned(),
            expected: signed(expected_version, run_id)?,
            token: fence.map(|lease| lease.token),
            lease_run: fence
                .filter(|lease| lease.run_id != run_id)
                .map(|lease| lease.run_id.clone()),
            notes: Some(held).filter(|n| *n > 0 && fence.is_some()),
            entries: encoded,
            summary: String::from_utf8(summary.encode()?)
                .map_err(|e| StoreError::Engine(e.to_string()))?,
            version: signed(summary.version, run_id)?,
        };
        let outcome = self.send(commit, bytes);
        let mut summaries = self
            .batcher
            .summaries
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        match &outcome {
            Ok(_) => {
                if summaries.len() >= MAX_SUMMARIES {
                    summaries.clear();
                }
                summaries.insert(run_id.to_owned(), summary);
            }
            Err(_) => {
                summaries.remove(run_id);
            }
        }
        outcome
    }

    /// The run's summary at `expected` (a new run's at 0), from those kept or the database.
    /// A run at another version is the conflict it is.
    fn summary_at(&self, run_id: &str, expected: u64) -> Result<RunSummary, StoreError> {
        let kept = self
            .batcher
            .summaries
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(run_id)
            .filter(|s| s.version == expected)
            .cloned();
        if let Some(summary) = kept {
            return Ok(summary);
        }
        let row = self
            .client()?
            .query_typed_opt(
                "SELECT version, summary FROM agent_runs WHERE run_id = $1",
                &[(&run_id, Type::TEXT)],
            )
            .map_err(|e| engine(&e))?;
        let (current, summary) = match &row {
            Some(row) => (version(row.get(0)), decode_summary(run_id, row.get(1))?),
            None => (0, RunSummary::new(run_id)),
        };
        if current != expected {
            return Err(StoreError::Conflict {
                run_id: run_id.to_owned(),
                expected,
                actual: current,
            });
        }
        Ok(summary)
    }

    /// Queues the commit and waits for its outcome; the first waiter with nothing in flight
    /// sends everything queued, again and again until the queue is empty.
    fn send(&self, commit: Commit, bytes: usize) -> Outcome {
        let batcher = &self.batcher;
        let mut state = batcher.state.lock().unwrap_or_else(|p| p.into_inner());
        state.next_ticket += 1;
        let ticket = state.next_ticket;
        state.queue.push((ticket, commit, bytes));
        loop {
            if let Some(outcome) = state.outcomes.remove(&ticket) {
                return outcome;
            }
            if state.sending {
                state = batcher.done.wait(state).unwrap_or_else(|p| p.into_inner());
                continue;
            }
            // Lead: take a batch, send it without the lock, hand out the outcomes.
            let mut taken = Vec::new();
            let mut size = 0;
            while !state.queue.is_empty() && taken.len() < MAX_BATCH {
                let next = state.queue[0].2;
                if !taken.is_empty() && size + next > MAX_BATCH_BYTES {
                    break;
                }
                size += next;
                taken.push(state.queue.remove(0));
            }
            state.sending = true;
            state.round_trips += 1;
            drop(state);
            let outcomes = self.round_trip(taken);
            state = batcher.state.lock().unwrap_or_else(|p| p.into_inner());
            state.sending = false;
            state.outcomes.extend(outcomes);
            batcher.done.notify_all();
        }
    }

    /// Runs the batch statement. A statement the database gave up on as a whole (a
    /// serialization failure, as a distributed PostgreSQL-compatible database reports
    /// under contention, or a deadlock) wrote nothing and is sent again, a few times.
    fn commit_statement(&self, body: &str) -> Result<postgres::Row, StoreError> {
        let mut attempts = 0;
        loop {
            attempts += 1;
            let result = self.client()?.query_typed_one(
                "SELECT agent_commit_batch_v3($1::jsonb)::text",
                &[(&body, Type::TEXT)],
            );
            match result {
                Ok(row) => return Ok(row),
                Err(e)
                    if attempts < MAX_ATTEMPTS
                        && matches!(
                            e.code(),
                            Some(&SqlState::T_R_SERIALIZATION_FAILURE)
                                | Some(&SqlState::T_R_DEADLOCK_DETECTED)
                        ) =>
                {
                    self.batcher
                        .state
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .retries += 1;
                }
                Err(e) => return Err(engine(&e)),
            }
        }
    }

    /// Sends one batch (ordered by run, so that batches of several processes lock runs in
    /// one order and never deadlock) and reads each commit's outcome.
    fn round_trip(&self, mut taken: Vec<(u64, Commit, usize)>) -> Vec<(u64, Outcome)> {
        taken.sort_by(|a, b| a.1.run.cmp(&b.1.run).then(a.0.cmp(&b.0)));
        let commits: Vec<&Commit> = taken.iter().map(|(_, c, _)| c).collect();
        let sent = serde_json::to_string(&commits)
            .map_err(|e| StoreError::Engine(format!("cannot encode a commit: {e}")))
            .and_then(|body| {
                let row = self.commit_statement(&body)?;
                let text: String = row.get(0);
                serde_json::from_str::<Vec<Verdict>>(&text).map_err(|e| StoreError::Corrupt {
                    what: "the outcome of a commit".to_owned(),
                    message: e.to_string(),
                })
            });
        match sent {
            Ok(verdicts) if verdicts.len() == taken.len() => taken
                .into_iter()
                .zip(verdicts)
                .map(|((ticket, commit, _), verdict)| (ticket, judge(&commit, &verdict)))
                .collect(),
            Ok(verdicts) => {
                let message = format!(
                    "{} outcomes came back for {} commits",
                    verdicts.len(),
                    taken.len()
                );
                taken
                    .into_iter()
                    .map(|(ticket, ..)| (ticket, Err(StoreError::Engine(message.clone()))))
                    .collect()
            }
            Err(e) => {
                let message = e.to_string();
                taken
                    .into_iter()
                    .map(|(ticket, ..)| (ticket, Err(StoreError::Engine(message.clone()))))
                    .collect()
            }
        }
    }
}

fn judge(commit: &Commit, verdict: &Verdict) -> Outcome {
    let expected = version(commit.expected);
    if verdict.lease_lost {
        return Err(StoreError::LeaseLost(
            commit
                .lease_run
                .clone()
                .unwrap_or_else(|| commit.run.clone()),
        ));
    }
    if let Some(holder) = &verdict.held_by {
        return Err(StoreError::Busy {
            run_id: commit.run.clone(),
            by: if holder.is_empty() {
                "another process".to_owned()
            } else {
                holder.clone()
            },
        });
    }
    match (verdict.version, verdict.actual) {
        (Some(v), _) => Ok(version(v)),
        // -1: the versions were inserted by another writer at the same moment.
        (None, Some(actual)) => Err(StoreError::Conflict {
            run_id: commit.run.clone(),
            expected,
            actual: if actual < 0 {
                expected + 1
            } else {
                version(actual)
            },
        }),
        (None, None) => Err(StoreError::Engine(format!(
            "no outcome for the commit of run {}",
            commit.run
        ))),
    }
}
