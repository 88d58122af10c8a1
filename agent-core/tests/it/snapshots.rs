//! Event transcripts of a few scenarios, reviewed as snapshots.

use agent_core::*;
use serde_json::json;

use crate::harness::{Person, Reply::*, check, world};

#[test]
fn transcript_of_a_tool_call_then_answer() {
    let r = check(
        world(vec![
            Calls(vec![
                ("c1", "read", json!({"path": "notes.txt"})),
                ("c2", "ghost", json!({})),
            ]),
            Final("The notes say hello."),
        ]),
        TerminalReason::Completed,
    );
    insta::assert_json_snapshot!(r.log);
}

#[test]
fn transcript_of_a_denied_write() {
    let mut w = world(vec![
        Calls(vec![(
            "w1",
            "write",
            json!({"path": "out.txt", "content": "x"}),
        )]),
        Final("I could not write the file."),
    ]);
    w.verdicts.insert(
        "write".into(),
        Verdict::Ask {
            why: "write risk asks by default".into(),
        },
    );
    w.person.push_back(Person::Deny("keep the tree clean"));
    let r = check(w, TerminalReason::Completed);
    insta::assert_json_snapshot!(r.log);
}

#[test]
fn transcript_of_a_repeated_plan() {
    let same = || Calls(vec![("c1", "read", json!({"path": "a.txt"}))]);
    let r = check(
        world(vec![same(), same(), same(), same()]),
        TerminalReason::NoProgress,
    );
    insta::assert_json_snapshot!(r.log);
}
