//! Exit codes (CONTRACT §10).

use agent_core::{ReasonClass, TerminalReason};

/// `completed`.
pub const EXIT_OK: u8 = 0;
/// Bad usage, configuration or input; nothing was written.
pub const EXIT_USAGE: u8 = 2;
/// Paused for a person.
pub const EXIT_PAUSED: u8 = 3;
/// Stopped by a budget, policy or `no_progress`.
pub const EXIT_STOPPED: u8 = 4;
/// Failed.
pub const EXIT_FAILED: u8 = 5;
/// Cancelled.
pub const EXIT_CANCELLED: u8 = 130;

/// The exit code of a terminal reason.
pub fn exit_code(reason: TerminalReason) -> u8 {
    if reason == TerminalReason::Cancelled {
        return EXIT_CANCELLED;
    }
    match reason.class() {
        ReasonClass::Finished => EXIT_OK,
        ReasonClass::Paused => EXIT_PAUSED,
        ReasonClass::Stopped => EXIT_STOPPED,
        ReasonClass::Failed => EXIT_FAILED,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_reason_has_its_documented_code() {
        let codes: Vec<(&str, u8)> = TerminalReason::ALL
            .into_iter()
            .map(|r| (r.as_str(), exit_code(r)))
            .collect();
        assert_eq!(
            codes,
            [
                ("completed", 0),
                ("approval_required", 3),
                ("clarification_required", 3),
                ("outcome_unknown", 3),
                ("cancelled", 130),
                ("deadline_exceeded", 4),
                ("max_steps", 4),
                ("tool_budget_exhausted", 4),
                ("cost_budget_exceeded", 4),
                ("no_progress", 4),
                ("policy_violation", 4),
                ("invalid_decision", 5),
                ("cannot_continue", 5),
                ("model_error", 5),
                ("tool_unavailable", 5),
                ("checkpoint_failed", 5),
            ]
        );
    }
}
