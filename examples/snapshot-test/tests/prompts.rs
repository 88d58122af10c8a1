//! Snapshots of what this agent's model is sent. `cargo insta review` shows a changed one
//! as a text diff.

use agent_context::testing::{LogBuilder, snapshot_text};
use agent_core::ErrorKind;
use example_snapshot_test::prompt_after;
use serde_json::json;

#[test]
fn after_a_failed_lookup_and_a_retry() {
    let log = LogBuilder::new("Find a room for 40 people on Thursday.")
        .calls(&[("c1", "find_room", json!({"seats": 40}))])
        .failed(
            "c1",
            "find_room",
            ErrorKind::ExecutionFailed,
            "no room has 40 seats",
        )
        .calls(&[("c2", "find_room", json!({"seats": 30}))])
        .ok("c2", "find_room", "Borealis (30 seats) is free")
        .build();
    insta::assert_snapshot!(snapshot_text(&prompt_after(&log)));
}

#[test]
fn a_follow_up_after_the_answer() {
    let log = LogBuilder::new("Find a room for ten people.")
        .calls(&[("c1", "find_room", json!({"seats": 10}))])
        .ok("c1", "find_room", "Aurora (12 seats) is free")
        .answer("Book Aurora.")
        .say("And for twenty?")
        .build();
    let text = snapshot_text(&prompt_after(&log));
    assert!(
        text.ends_with(
            "=== 4 assistant\nBook Aurora.\n=== 5 user\nAnd for twenty?\n=== tools\nfind_room\n"
        ),
        "{text}"
    );
    insta::assert_snapshot!(text);
}
