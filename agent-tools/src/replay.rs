//! `--tools replay:RUN`: every tool call is answered with the result a recorded run got for
//! the same tool and arguments, and nothing runs. Try a new model or prompt on the same world.

use std::collections::BTreeMap;

use agent_core::{
    CallId, Entry, ErrorKind, Event, ToolCall, ToolError, ToolResult, canonical_json,
};

/// Results of a recorded run, by tool and canonical arguments.
#[derive(Clone, Debug, Default)]
pub struct ToolReplay {
    run_id: String,
    results: BTreeMap<(String, String), ToolResult>,
}

impl ToolReplay {
    /// The results of the run whose log is `entries` (the first result of each call wins).
    pub fn from_log(run_id: &str, entries: &[Entry]) -> ToolReplay {
        let mut calls: BTreeMap<CallId, ToolCall> = BTreeMap::new();
        let mut results = BTreeMap::new();
        for entry in entries {
            match &entry.event {
                Event::DecisionProposed { decision, .. } => {
                    calls.clear();
                    for call in decision.calls() {
                        calls.insert(call.id.clone(), call.clone());
                    }
                }
                Event::ToolFinished { result, .. } => {
                    if let Some(call) = calls.get(&result.call_id) {
                        results
                            .entry((call.name.clone(), canonical_json(&call.arguments)))
                            .or_insert_with(|| result.clone());
                    }
                }
                _ => {}
            }
        }
        ToolReplay {
            run_id: run_id.to_owned(),
            results,
        }
    }

    /// Recorded results.
    pub fn len(&self) -> usize {
        self.results.len()
    }

    /// Whether the run recorded no result.
    pub fn is_empty(&self) -> bool {
        self.results.is_empty()
    }

    /// The recorded answer to `call`, under its own id; an error result when there is none.
    pub fn answer(&self, call: &ToolCall) -> ToolResult {
        let key = (call.name.clone(), canonical_json(&call.arguments));
        match self.results.get(&key) {
            Some(recorded) => ToolResult {
                call_id: call.id.clone(),
                name: call.name.clone(),
                outcome: recorded.outcome.clone(),
            },
            None => ToolResult::error(
                call.id.clone(),
                call.name.clone(),
                ToolError::new(
                    ErrorKind::ExecutionFailed,
                    format!(
                        "replay: run {} has no result for {} {}",
                        self.run_id, call.name, key.1
                    ),
                ),
            ),
        }
    }
}
