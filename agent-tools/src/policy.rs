//! Policy: whether an intent may become an action without asking a person.

use agent_core::{Risk, ToolCall, ToolSpec, Verdict};

/// The policy of a run. This version applies the contract's defaults by risk: `read` is
/// allowed, `write` and `external` ask.
#[derive(Clone, Debug, Default)]
pub struct Policy {
    _private: (),
}

impl Policy {
    /// The verdict for one call whose arguments already validated.
    pub fn verdict(&self, spec: &ToolSpec, _call: &ToolCall) -> Verdict {
        match spec.risk {
            Risk::Read => Verdict::Allow,
            risk => Verdict::Ask {
                why: format!(
                    "{} is a {} tool, which asks by default",
                    spec.name,
                    risk.as_str()
                ),
            },
        }
    }
}
