//! The run index: one small record per run, kept up to date by each commit, so listing
//! runs never reads their logs.

use std::collections::{BTreeMap, HashMap};

use agent_core::{Entry, Event, TerminalReason, Usage, sub_agent_run_id};
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
    /// While the run waits for a person to settle calls in doubt: for each such call, the
    /// run id a sub-agent answering it has (only a delegate call has such a run), so that a
    /// run whose calls wait on sub-agents that wait for approval is listed as waiting for
    /// approval ([`RunSummary::surface_sub_agents`]).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub in_doubt: BTreeMap<String, String>,
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
            in_doubt: BTreeMap::new(),
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
            Event::ResolutionRequested { pending, turn } => {
                self.pending = u32::try_from(pending.len()).unwrap_or(u32::MAX);
                self.in_doubt = pending
                    .iter()
                    .map(|p| {
                        let child = sub_agent_run_id(&self.run_id, *turn, &p.call_id);
                        (p.call_id.as_str().to_owned(), child)
                    })
                    .collect();
                self.status = "paused".to_owned();
                self.reason = Some(TerminalReason::OutcomeUnknown);
            }
            Event::EffectResolved { call_id, .. } => {
                self.in_doubt.remove(call_id.as_str());
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
            | Event::UserNote { .. }
            | Event::ToolFinished { .. } => {}
        }
        if self.reason != Some(TerminalReason::OutcomeUnknown) {
            self.in_doubt.clear();
        }
        // A fork's inherited prefix is folded: its usage was the parent's spending.
        if self.inherited_until == Some(entry.version) && self.usage.is_some() {
            self.usage = Some(Usage::default());
        }
    }

    /// Lists a run paused on calls in doubt that are all answered by sub-agents waiting
    /// for a person's approval as waiting for approval itself, of its sub-agents' calls
    /// (their count), as `agent run` and `agent show` say it: approving the run answers
    /// them. A sub-agent's own sub-agents are looked at before it.
    pub fn surface_sub_agents(runs: &mut [RunSummary]) {
        let index: HashMap<String, usize> = runs
            .iter()
            .enumerate()
            .map(|(n, run)| (run.run_id.clone(), n))
            .collect();
        let mut deepest_first: Vec<usize> = (0..runs.len()).collect();
        deepest_first.sort_by_key(|&n| {
            std::cmp::Reverse(agent_core::ancestor_run_ids(&runs[n].run_id).count())
        });
        for n in deepest_first {
            let run = &runs[n];
            if run.status != "paused"
                || run.reason != Some(TerminalReason::OutcomeUnknown)
                || run.in_doubt.is_empty()
            {
                continue;
            }
            let mut pending = 0u32;
            let waiting = run.in_doubt.values().all(|child| {
                index.get(child).is_some_and(|&c| {
                    let child = &runs[c];
                    pending = pending.saturating_add(child.pending);
                    child.status == "paused"
                        && child.reason == Some(TerminalReason::ApprovalRequired)
                })
            });
            if waiting {
                runs[n].reason = Some(TerminalReason::ApprovalRequired);
                runs[n].pending = pending;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use agent_core::{CallId, Outcome, PendingCall};

    fn pending(call_id: &str, tool: &str) -> PendingCall {
        PendingCall {
            call_id: CallId::from(call_id),
            tool: tool.to_owned(),
            arguments: serde_json::json!({}),
            why: "because".to_owned(),
            path: None,
        }
    }

    /// The summary of run `run_id` after `events`.
    fn summary(run_id: &str, events: Vec<Event>) -> RunSummary {
        let mut summary = RunSummary::new(run_id);
        for (n, event) in events.into_iter().enumerate() {
            summary.apply(&Entry {
                version: n as u64 + 1,
                at_ms: 1,
                event,
            });
        }
        summary
    }

    fn in_doubt(run_id: &str, calls: &[(&str, &str)]) -> RunSummary {
        let pending = calls.iter().map(|(id, tool)| pending(id, tool)).collect();
        summary(
            run_id,
            vec![Event::ResolutionRequested { turn: 1, pending }],
        )
    }

    fn waiting_for_approval(run_id: &str, calls: &[&str]) -> RunSummary {
        let pending = calls.iter().map(|id| pending(id, "write_file")).collect();
        summary(
            run_id,
            vec![Event::ApprovalRequested {
                turn: 1,
                summary: None,
                pending,
                allowed: Vec::new(),
                allowed_paths: BTreeMap::new(),
            }],
        )
    }

    fn child(parent: &str, call_id: &str) -> String {
        sub_agent_run_id(parent, 1, &CallId::from(call_id))
    }

    fn reasons(runs: &[RunSummary]) -> Vec<(Option<TerminalReason>, u32)> {
        runs.iter().map(|r| (r.reason, r.pending)).collect()
    }

    #[test]
    fn a_run_waiting_on_sub_agents_that_wait_for_approval_is_listed_as_waiting_for_it() {
        use TerminalReason::{ApprovalRequired, OutcomeUnknown};
        let (d1, d2) = (child("p", "d1"), child("p", "d2"));
        let grandchild = child(&d2, "e1");
        let mut runs = vec![
            in_doubt("p", &[("d1", "delegate"), ("d2", "delegate")]),
            waiting_for_approval(&d1, &["w1", "w2"]),
            in_doubt(&d2, &[("e1", "delegate")]),
            waiting_for_approval(&grandchild, &["w3"]),
        ];
        RunSummary::surface_sub_agents(&mut runs);
        assert_eq!(
            reasons(&runs),
            [
                (Some(ApprovalRequired), 3),
                (Some(ApprovalRequired), 2),
                (Some(ApprovalRequired), 1),
                (Some(ApprovalRequired), 1)
            ]
        );

        // One of them stopped: the run's call in doubt is a person's to settle.
        let mut runs = vec![
            in_doubt("p", &[("d1", "delegate"), ("d2", "delegate")]),
            waiting_for_approval(&d1, &["w1"]),
            summary(
                &d2,
                vec![Event::RunEnded {
                    outcome: Outcome::stop(TerminalReason::Cancelled, "cancelled"),
                }],
            ),
        ];
        RunSummary::surface_sub_agents(&mut runs);
        assert_eq!(runs[0].reason, Some(OutcomeUnknown));
        assert_eq!(runs[0].pending, 2);

        // A call in doubt that is no sub-agent's: the same.
        let mut runs = vec![
            in_doubt("p", &[("d1", "delegate"), ("s1", "shell")]),
            waiting_for_approval(&d1, &["w1"]),
        ];
        RunSummary::surface_sub_agents(&mut runs);
        assert_eq!(runs[0].reason, Some(OutcomeUnknown));

        // Settled: the sub-agent's call no longer counts.
        let mut settled = in_doubt("p", &[("s1", "shell"), ("d1", "delegate")]);
        settled.apply(&Entry {
            version: 2,
            at_ms: 1,
            event: Event::EffectResolved {
                call_id: CallId::from("s1"),
                resolution: agent_core::Resolution::Committed,
            },
        });
        let mut runs = vec![settled, waiting_for_approval(&d1, &["w1"])];
        RunSummary::surface_sub_agents(&mut runs);
        assert_eq!(runs[0].reason, Some(ApprovalRequired));
        assert_eq!(runs[0].pending, 1);

        // Once the run goes on, nothing is kept.
        let mut ended = in_doubt("p", &[("d1", "delegate")]);
        ended.apply(&Entry {
            version: 2,
            at_ms: 1,
            event: Event::RunEnded {
                outcome: Outcome::stop(TerminalReason::Cancelled, "cancelled"),
            },
        });
        assert!(ended.in_doubt.is_empty());
    }
}
