//! Scheduling of a batch (CONTRACT §5): which calls may share a parallel group.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::decision::ToolCall;
use crate::effect::effect_key;
use crate::tool::{Risk, ToolSpec};

/// A call approved to run, with what the executor needs to know about it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ScheduledCall {
    /// The call.
    pub call: ToolCall,
    /// The tool's risk.
    pub risk: Risk,
    /// The effect key for `write`/`external` calls.
    pub effect_key: Option<String>,
    /// For a call that acts on a path: where it led in the workspace when the call was
    /// judged. The executor acts on that place or refuses the call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
}

/// Splits approved calls, in the model's order, into groups run one after another. Calls in
/// one group may run concurrently: consecutive `read` (or concurrency-safe) calls share a
/// group, every other call is a group of its own, so side effects keep the declared order.
pub fn schedule(
    calls: Vec<ToolCall>,
    tools: &BTreeMap<String, ToolSpec>,
    run_id: &str,
    turn: u32,
) -> Vec<Vec<ScheduledCall>> {
    let mut groups: Vec<Vec<ScheduledCall>> = Vec::new();
    let mut open_parallel = false;
    for call in calls {
        let spec = tools.get(&call.name);
        let risk = spec.map_or(Risk::External, |s| s.risk);
        let parallel = spec.is_some_and(ToolSpec::runs_concurrently);
        let effect_key = (risk != Risk::Read).then(|| effect_key(run_id, turn, &call.id));
        let scheduled = ScheduledCall {
            call,
            risk,
            effect_key,
            path: None,
        };
        match groups.last_mut() {
            Some(group) if parallel && open_parallel => group.push(scheduled),
            _ => groups.push(vec![scheduled]),
        }
        open_parallel = parallel;
    }
    groups
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn tools() -> BTreeMap<String, ToolSpec> {
        let mut m = BTreeMap::new();
        for (name, risk) in [("r", Risk::Read), ("w", Risk::Write), ("x", Risk::External)] {
            m.insert(name.to_owned(), ToolSpec::new(name, "", json!({}), risk));
        }
        let mut safe = ToolSpec::new("s", "", json!({}), Risk::External);
        safe.concurrency_safe = true;
        m.insert("s".to_owned(), safe);
        m
    }

    fn shape(names: &[&str]) -> Vec<Vec<String>> {
        let calls = names
            .iter()
            .enumerate()
            .map(|(i, n)| ToolCall::new(format!("c{i}"), *n, json!({})))
            .collect();
        schedule(calls, &tools(), "run", 1)
            .into_iter()
            .map(|g| g.into_iter().map(|c| c.call.name).collect())
            .collect()
    }

    #[test]
    fn reads_share_groups_and_side_effects_run_alone_in_order() {
        assert_eq!(shape(&["r", "r", "r"]), [vec!["r", "r", "r"]]);
        assert_eq!(
            shape(&["r", "w", "r", "r", "x", "x"]),
            [vec!["r"], vec!["w"], vec!["r", "r"], vec!["x"], vec!["x"]]
        );
        assert_eq!(shape(&["r", "s", "w"]), [vec!["r", "s"], vec!["w"]]);
    }

    #[test]
    fn only_side_effects_get_effect_keys() {
        let calls = vec![
            ToolCall::new("a", "r", json!({})),
            ToolCall::new("b", "w", json!({})),
        ];
        let groups = schedule(calls, &tools(), "run", 1);
        assert!(groups[0][0].effect_key.is_none());
        assert!(groups[1][0].effect_key.is_some());
    }
}
