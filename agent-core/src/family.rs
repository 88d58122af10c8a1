//! How a sub-agent's run is named: its parent's run id, a dot, and twelve hexadecimal
//! digits of a digest of the parent's turn and call. The name is all a store needs to
//! tell that a run belongs to another (its holder drives both), without reading either log.

use crate::{CallId, sha256_hex};

/// Hexadecimal digits after the dot of a sub-agent's run id.
const DIGITS: usize = 12;

/// The run id of the sub-agent that answers `call_id` of `parent`'s model call `turn`: the
/// same for the same call, so a call that runs again after a crash finds its child.
pub fn sub_agent_run_id(parent: &str, turn: u32, call_id: &CallId) -> String {
    let digest = sha256_hex(format!("{turn}/{call_id}").as_bytes());
    format!("{parent}.{}", &digest[..DIGITS])
}

/// The run whose sub-agent `run_id` is by its name ([`sub_agent_run_id`]); `None` for a run
/// not named as a sub-agent's.
pub fn parent_run_id(run_id: &str) -> Option<&str> {
    let (parent, digits) = run_id.rsplit_once('.')?;
    let named = !parent.is_empty()
        && digits.len() == DIGITS
        && digits
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    named.then_some(parent)
}

/// The runs `run_id` is a sub-agent's run of, by its name, nearest first.
pub fn ancestor_run_ids(run_id: &str) -> impl Iterator<Item = &str> {
    std::iter::successors(parent_run_id(run_id), |&run| parent_run_id(run))
}

/// Whether `run_id` is `root` or, at any depth, a sub-agent's run below it.
pub fn in_family_of(root: &str, run_id: &str) -> bool {
    run_id == root || ancestor_run_ids(run_id).any(|run| run == root)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sub_agents_run_names_its_parent_and_nothing_else_does() {
        let child = sub_agent_run_id("01ABC", 3, &CallId::from("d1"));
        assert_eq!(parent_run_id(&child), Some("01ABC"));
        let grandchild = sub_agent_run_id(&child, 1, &CallId::from("d2"));
        assert_eq!(
            ancestor_run_ids(&grandchild).collect::<Vec<_>>(),
            [child.as_str(), "01ABC"]
        );
        assert!(in_family_of("01ABC", &grandchild));
        assert!(in_family_of(&child, &grandchild));
        assert!(in_family_of("01ABC", "01ABC"));
        assert!(!in_family_of(&grandchild, &child));
        assert!(!in_family_of("01AB", &child), "a prefix is not a parent");
        for id in [
            "01ABC",
            "report.txt",
            ".0123456789ab",
            "01ABC.0123456789a",
            "01ABC.0123456789abc",
            "01ABC.0123456789AB",
            "01ABC.0123456789ag",
        ] {
            assert_eq!(parent_run_id(id), None, "{id}");
        }
        assert_ne!(
            sub_agent_run_id("01ABC", 3, &CallId::from("d1")),
            sub_agent_run_id("01ABC", 4, &CallId::from("d1"))
        );
    }
}
