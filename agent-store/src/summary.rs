//! The run index: one small record per run, kept up to date by each commit, so listing
//! runs never reads their logs.

use std::collections::BTreeMap;

use agent_core::{Entry, Event, TerminalReason, Usage};
use serde::{Deserialize, Serialize};

/// What `agent runs` shows of a run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunSummary {
    /// The run id.
    pub run_id: String,
    /// The goal.
    pub goal: String,
    /// `running`, or the class of the stop: `finished`, `paused`, `stopped`, `failed`.
    pub status: String,
    /// The terminal reason, once stopped or paused.
    pub reason: Option<TerminalReason>,
    /// Model calls made.
    pub steps: u32,
    /// When the run started (ms since the epoch): for a fork, when it was made.
    pub started_at_ms: u64,
    /// When it ended, if it has.
    pub ended_at_ms: Option<u64>,
    /// The log's version.
    pub version: u64,
    /// Calls still waiting for approval.
    #[serde(default)]
    pub pending: u32,
    /// Who drives the run right now, when someone does (`process 1234`, or a worker): filled
    /// in by a store that knows, when it lists runs; never stored.
    #[serde(default)]
    pub live: Option<String>,
    /// The run this one was forked from (`RUN@call N`), when it was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forked_from: Option<String>,
    /// The run whose sub-agent this is (`RUN/call ID`), when it is one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<String>,
    /// What the run's model calls used, its sub-agents' included, as its budgets count
    /// them (a fork's own, not what it inherited from its parent); `None` in a summary
    /// written before the usage was kept (unknown, not zero).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    /// For a fork, the last version of its log inherited from its parent: the usage counts
    /// what comes after.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inherited_until: Option<u64>,
    /// What each of its sub-agents had used when it last reported (a report says the
    /// child's whole usage so far: only what was not counted yet counts).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub sub_agent_usage: BTreeMap<String, Usage>,
}

impl RunSummary {
    /// An empty summary for a run about to get its first entry.
    pub fn new(run_id: &str) -> Self {
        RunSummary {
            run_id: run_id.to_owned(),
            goal: String::new(),
            status: "running".to_owned(),
            reason: None,
            steps: 0,
            started_at_ms: 0,
            ended_at_ms: None,
            version: 0,
            pending: 0,
            live: None,
            forked_from: None,
            parent: None,
            usage: Some(Usage::default()),
            inherited_until: None,
            sub_agent_usage: BTreeMap::new(),
        }
    }

    /// The summary as stored (JSON).
    #[cfg(any(feature = "sled", feature = "postgres"))]
    pub(crate) fn encode(&self) -> Result<Vec<u8>, crate::StoreError> {
        serde_json::to_vec(self).map_err(|e| crate::StoreError::Corrupt {
            what: format!("summary of run {}", self.run_id),
            message: e.to_string(),
        })
    }

    /// A stored summary of run `run_id`.
    #[cfg(any(feature = "sled", feature = "postgres"))]
    pub(crate) fn decode(run_id: &str, bytes: &[u8]) -> Result<RunSummary, crate::StoreError> {
        serde_json::from_slice(bytes).map_err(|e| crate::StoreError::Corrupt {
            what: format!("summary of run {run_id}"),
            message: e.to_string(),
        })
    }

    /// Adds what `event` says the run used, as the run's own fold counts it
    /// (`agent_core::RunState`): nothing when the usage before is unknown.
    fn count_usage(&mut self, event: &Event) {
        if let Some(total) = &mut self.usage {
            event.count_usage(total, &mut self.sub_agent_usage);
        }
    }

    /// Updates the summary with one committed entry.
    pub fn apply(&mut self, entry: &Entry) {
        self.version = entry.version;
        self.count_usage(&entry.event);
        match &entry.event {
            Event::RunStarted { goal, manifest, .. } => {
                self.forked_from = manifest
                    .forked_from
                    .as_ref()
                    .map(|o| format!("{}@{}", o.run_id, o.at));
                self.inherited_until = manifest.forked_from.as_ref().map(|o| o.version);
                self.parent = manifest
                    .parent
                    .as_ref()
                    .map(|p| format!("{}/{}", p.run_id, p.call_id));
                self.goal.clone_from(goal);
                // A fork starts when it is made; its first events keep its parent's times.
                self.started_at_ms = manifest
                    .forked_from
                    .as_ref()
                    .and_then(|o| o.made_at_ms)
                    .unwrap_or(entry.at_ms);
            }
            Event::DecisionProposed { .. }
            | Event::DecisionRejected { .. }
            | Event::ModelFailed { .. } => self.steps += 1,
            Event::ApprovalRequested { pending, .. } => {
                self.pending = u32::try_from(pending.len().max(1)).unwrap_or(u32::MAX);
                self.status = "paused".to_owned();
                self.reason = Some(TerminalReason::ApprovalRequired);
            }
            Event::ApprovalGranted { call_ids } | Event::ApprovalDenied { call_ids, .. } => {
                let settled = u32::try_from(call_ids.len().max(1)).unwrap_or(u32::MAX);
                self.pending = self.pending.saturating_sub(settled);
                if self.pending == 0 {
                    self.status = "running".to_owned();
                    self.reason = None;
                }
            }
            Event::ResolutionRequested { pending, .. } => {
                self.pending = u32::try_from(pending.len()).unwrap_or(u32::MAX);
                self.status = "paused".to_owned();
                self.reason = Some(TerminalReason::OutcomeUnknown);
            }
            Event::EffectResolved { .. } => {
                self.pending = self.pending.saturating_sub(1);
                if self.pending == 0 {
                    self.status = "running".to_owned();
                    self.reason = None;
                }
            }
            Event::UserMessage { .. } => {
                self.status = "running".to_owned();
                self.reason = None;
                self.ended_at_ms = None;
            }
            Event::RunEnded { outcome } => {
                self.status = outcome.reason.class().as_str().to_owned();
                self.reason = Some(outcome.reason);
                self.ended_at_ms = Some(entry.at_ms);
            }
            Event::CallRejected { .. }
            | Event::AnswerRejected { .. }
            | Event::SubAgentFinished { .. }
            | Event::CorrectionIssued { .. }
            | Event::EffectDispatched { .. }
            | Event::EffectReconciled { .. }
            | Event::ContextCompacted { .. }
            | Event::CompactionDeclined { .. }
            | Event::ModelRetried { .. }
            | Event::RunResumed {}
            | Event::ToolFinished { .. } => {}
        }
        // A fork's inherited prefix is folded: its usage was the parent's spending.
        if self.inherited_until == Some(entry.version) && self.usage.is_some() {
            self.usage = Some(Usage::default());
        }
    }
}
