//! Anything the decision validator accepts can be committed and read back: the limits on
//! nesting and size at the boundary keep every log readable.

use agent_core::{CallId, Decision, Entry, Event, ToolCall, Usage};
use agent_store::{SledStore, Store};
use proptest::prelude::*;
use serde_json::{Map, Value, json};

/// Arbitrary JSON, occasionally wrapped in up to 150 levels of arrays and objects.
fn value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(|f| json!(f)),
        ".{0,40}".prop_map(Value::String),
    ];
    let tree = leaf.prop_recursive(6, 64, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::btree_map(".{0,8}", inner, 0..6)
                .prop_map(|m| Value::Object(m.into_iter().collect::<Map<_, _>>())),
        ]
    });
    (tree, 0usize..150, any::<bool>()).prop_map(|(v, wraps, arrays)| {
        (0..wraps).fold(v, |v, _| {
            if arrays {
                Value::Array(vec![v])
            } else {
                json!({ "k": v })
            }
        })
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn whatever_the_validator_accepts_round_trips_through_the_store(inner in value(), id in ".{1,300}") {
        let decision = Decision::ToolCalls {
            calls: vec![ToolCall::new(CallId(id), "tool", json!({ "a": inner }))],
        };
        let deep = agent_core::nesting_depth(&decision.calls()[0].arguments) > agent_core::MAX_ARGUMENT_DEPTH;
        match decision.check() {
            Err(_) => return Ok(()),
            Ok(()) => prop_assert!(!deep, "a call nested deeper than the limit was accepted"),
        }
        let dir = tempfile::tempdir().unwrap();
        let store = SledStore::open(dir.path().join("store")).unwrap();
        let entries = vec![
            agent_store::conformance::started("r", 1),
            Entry {
                version: 2,
                at_ms: 2,
                event: Event::DecisionProposed { turn: 1, decision, usage: Usage::default(), reasoning: Vec::new() },
            },
        ];
        store.append("r", 0, &entries).unwrap();
        prop_assert_eq!(store.load("r").unwrap(), entries);
    }
}
