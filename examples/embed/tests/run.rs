//! The embedded run completes, the custom tool's typed arguments were checked against its
//! generated schema, and every turn is in the store.

use agent_core::{Event, TerminalReason};
use agent_store::Store;
use example_embed::run_example;

#[test]
fn the_embedded_run_uses_the_custom_tool_and_completes() {
    let (report, store) = run_example().expect("the run goes");
    assert_eq!(report.outcome.reason, TerminalReason::Completed);
    assert_eq!(
        report.outcome.answer.as_deref(),
        Some("Book Aurora: it seats 12 and is free.")
    );
    let log = store.load(&report.run_id).unwrap();
    let result = log
        .iter()
        .find_map(|e| match &e.event {
            Event::ToolFinished { result, .. } => Some(result.content()),
            _ => None,
        })
        .expect("the tool ran");
    assert_eq!(result, "Aurora (12 seats) is free");
    let names: Vec<&str> = log.iter().map(|e| e.event.name()).collect();
    assert_eq!(
        names,
        [
            "run_started",
            "decision_proposed",
            "tool_finished",
            "decision_proposed",
            "run_ended"
        ]
    );
}
