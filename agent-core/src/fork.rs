//! Forks: a new run whose log begins with another run's committed events up to a model
//! call, then goes on differently (another model, prompt, budget or policy). What the
//! prefix holds are facts of the parent: its effects are never executed again, and the
//! fork's own effects get keys of their own (effect keys include the run id).

use crate::event::{Entry, Event, ForkOrigin, Manifest};
use crate::state::{FoldError, RunState, Status};

/// The model call an event belongs to, for the events a model call writes first: its
/// decision (or its rejection), retries and failure.
pub fn model_call_of(event: &Event) -> Option<u32> {
    match event {
        Event::DecisionProposed { turn, .. }
        | Event::DecisionRejected { turn, .. }
        | Event::ModelRetried { turn, .. }
        | Event::ModelFailed { turn, .. } => Some(*turn),
        _ => None,
    }
}

/// How many entries of `entries` came before model call `n` (1-based): the log whose
/// projection is the prompt that call was sent. `None` when the run made no call `n`.
pub fn before_model_call(entries: &[Entry], n: u32) -> Option<usize> {
    entries
        .iter()
        .position(|e| model_call_of(&e.event) == Some(n))
}

/// Why a log cannot be forked where asked.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum ForkError {
    /// The run made fewer model calls.
    #[error("run {run_id} made {calls} model call(s); fork at 1 to {calls}")]
    NoSuchCall {
        /// The run.
        run_id: String,
        /// Its model calls.
        calls: u32,
    },
    /// The log does not fold.
    #[error(transparent)]
    Fold(#[from] FoldError),
    /// The prefix leaves the run somewhere a fork cannot go on from.
    #[error(
        "before model call {at}, run {run_id} was {status}; fork at a call it made while running"
    )]
    NotRunning {
        /// The run.
        run_id: String,
        /// The call.
        at: u32,
        /// Where it stood.
        status: String,
    },
}

/// The log of run `run_id`, forked from `parent` (a whole committed log) before its model
/// call `at` at `now_ms`: the parent's entries before that call, with the first
/// (`run_started`) made the fork's own: its run id, and `manifest` (what shapes the fork
/// from then on) with the origin recorded. The goal stays the parent's.
pub fn fork_log(
    parent: &[Entry],
    at: u32,
    run_id: &str,
    mut manifest: Manifest,
    now_ms: u64,
) -> Result<Vec<Entry>, ForkError> {
    let state = RunState::fold(parent)?;
    // Calls are numbered from 1: there is no call 0 to cut before.
    let cut = before_model_call(parent, at).ok_or_else(|| ForkError::NoSuchCall {
        run_id: state.run_id.clone(),
        calls: state.steps,
    })?;
    let mut prefix: Vec<Entry> = parent[..cut].to_vec();
    let version = prefix.last().map_or(0, |e| e.version);
    manifest.forked_from = Some(Box::new(ForkOrigin {
        run_id: state.run_id.clone(),
        version,
        at,
        made_at_ms: Some(now_ms),
    }));
    if let Some(Entry {
        event:
            Event::RunStarted {
                run_id: id,
                manifest: m,
                ..
            },
        ..
    }) = prefix.first_mut()
    {
        *id = run_id.to_owned();
        *m = manifest;
    }
    // What the parent did next was a model call: the fork, which makes it instead, must be
    // where a model can be asked.
    let forked = RunState::fold(&prefix)?;
    if forked.status != Status::Running || forked.open_turn() {
        return Err(ForkError::NotRunning {
            run_id: state.run_id,
            at,
            status: format!("{:?}", forked.status),
        });
    }
    Ok(prefix)
}
