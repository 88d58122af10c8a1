//! Plan fingerprints and the correction message of CONTRACT §6.

use crate::decision::ToolCall;
use crate::digest::{canonical_json, sha256_hex, write_canonical};
use crate::tool::{ToolError, ToolOutcome, ToolResult};

/// Fingerprint of a batch: a hash of its calls' names and canonical arguments, independent
/// of call ids and of the order the calls were listed in.
pub fn fingerprint(calls: &[ToolCall]) -> String {
    fingerprint_and_signatures(calls).0
}

/// The batch's fingerprint and each call's [`call_signature`], from one canonical encoding
/// of each call's arguments.
pub(crate) fn fingerprint_and_signatures(calls: &[ToolCall]) -> (String, Vec<u128>) {
    let mut parts: Vec<Vec<u8>> = calls.iter().map(plan_part).collect();
    let signatures = calls
        .iter()
        .zip(&parts)
        .map(|(c, part)| signature_of(c.id.as_str(), part))
        .collect();
    parts.sort();
    (sha256_hex(&parts.join(&b'\n')), signatures)
}

/// A call as the fingerprint sees it: its tool, a NUL, its arguments in canonical JSON.
fn plan_part(call: &ToolCall) -> Vec<u8> {
    let mut part = Vec::with_capacity(call.name.len() + 64);
    part.extend_from_slice(call.name.as_bytes());
    part.push(0);
    write_canonical(&call.arguments, &mut part);
    part
}

/// Identity of one request for the retry budget: the same id, tool and arguments. The
/// first 128 bits of a SHA-256: a run remembers one per call it ran, so it is kept small
/// (a chance collision among a million calls is about 1 in 10^26).
pub(crate) fn call_signature(call: &ToolCall) -> u128 {
    signature_of(call.id.as_str(), &plan_part(call))
}

/// SHA-256 of the id, a NUL, then the call's [`plan_part`], cut to 128 bits.
fn signature_of(id: &str, part: &[u8]) -> u128 {
    use sha2::{Digest, Sha256};
    let digest = Sha256::new()
        .chain_update(id.as_bytes())
        .chain_update([0])
        .chain_update(part)
        .finalize();
    let mut first = [0u8; 16];
    first.copy_from_slice(&digest[..16]);
    u128::from_be_bytes(first)
}

/// Longest excerpt of a previous result quoted in a correction.
const LEARNED_EXCERPT: usize = 400;

/// `result` with its text cut to what [`correction_message`] may quote of it: its first
/// [`LEARNED_EXCERPT`] characters, and one more, which tells the correction the text went
/// on. The correction made from it is the one the whole result makes.
pub(crate) fn quotable(result: &ToolResult) -> ToolResult {
    let cut = |text: &str| {
        // No more bytes than the characters kept: nothing to cut, and nothing to count.
        if text.len() <= LEARNED_EXCERPT + 1 {
            return text.to_owned();
        }
        match text.char_indices().nth(LEARNED_EXCERPT + 1) {
            Some((at, _)) => text[..at].to_owned(),
            None => text.to_owned(),
        }
    };
    let outcome = match &result.outcome {
        ToolOutcome::Output(text) => ToolOutcome::Output(cut(text)),
        ToolOutcome::Error(error) => ToolOutcome::Error(ToolError {
            kind: error.kind,
            message: cut(&error.message),
            retryable: error.retryable,
        }),
    };
    ToolResult {
        call_id: result.call_id.clone(),
        name: result.name.clone(),
        outcome,
    }
}

/// The one message a model gets when it repeats a plan: what it repeated, that it was not
/// run again, and what the earlier runs already returned.
pub fn correction_message(calls: &[ToolCall], repeats: u32, learned: &[ToolResult]) -> String {
    let mut msg = format!(
        "You have proposed the same tool calls {repeats} turns in a row; they were not run \
         again this time:"
    );
    for call in calls {
        msg.push_str(&format!(
            "\n- {} {}",
            call.name,
            canonical_json(&call.arguments)
        ));
    }
    let relevant: Vec<&ToolResult> = learned
        .iter()
        .filter(|r| calls.iter().any(|c| c.name == r.name))
        .collect();
    if relevant.is_empty() {
        msg.push_str("\nTheir earlier runs returned nothing you can use.");
    } else {
        msg.push_str("\nWhat they already returned:");
        for result in relevant {
            let content = result.content();
            let excerpt: String = content.chars().take(LEARNED_EXCERPT).collect();
            let cut = if excerpt.len() < content.len() {
                " [...]"
            } else {
                ""
            };
            let status = if result.is_ok() { "ok" } else { "error" };
            msg.push_str(&format!("\n- {} ({status}): {excerpt}{cut}", result.name));
        }
    }
    msg.push_str(
        "\nDo not propose these calls again: use what you learned, try a different approach, \
         or give your final answer. Proposing the same calls again ends the run.",
    );
    msg
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_result_cut_to_what_a_correction_quotes_makes_the_same_correction() {
        let calls = [ToolCall::new("x", "read_file", json!({"path": "a.txt"}))];
        let texts = [
            String::new(),
            "short".to_owned(),
            "a".repeat(LEARNED_EXCERPT),
            "a".repeat(LEARNED_EXCERPT + 1),
            "a".repeat(LEARNED_EXCERPT + 2),
            "é".repeat(LEARNED_EXCERPT + 50),
            "x".repeat(50_000),
        ];
        for text in &texts {
            for result in [
                ToolResult::ok("x".into(), "read_file", text.clone()),
                ToolResult::error(
                    "x".into(),
                    "read_file",
                    ToolError::new(crate::ErrorKind::ExecutionFailed, text.clone()),
                ),
            ] {
                let kept = quotable(&result);
                assert!(kept.content().chars().count() <= LEARNED_EXCERPT + 40);
                assert_eq!(
                    correction_message(&calls, 2, &[kept]),
                    correction_message(&calls, 2, &[result]),
                    "{} characters",
                    text.chars().count()
                );
            }
        }
    }

    /// Fingerprints are stored in `correction_issued` events: the same plan keeps the
    /// same fingerprint across versions (computed independently, with Python's `json` and
    /// `hashlib`).
    #[test]
    fn fingerprints_keep_their_value() {
        let calls = [
            ToolCall::new("x", "read_file", json!({"path": "a\"b\u{e9}\n"})),
            ToolCall::new(
                "y",
                "grep",
                json!({"z": [1, 2.5, null, true], "a": {"y": 1, "x": "q"}}),
            ),
        ];
        assert_eq!(
            fingerprint(&calls),
            "e94d38c95a2169de00863046790da82f7da035903a978c8c8d2b9a8d8447dac5"
        );
    }

    #[test]
    fn one_pass_gives_the_fingerprint_and_each_call_signature() {
        let calls = [
            ToolCall::new("c2", "read_file", json!({"path": "b", "limit": 3})),
            ToolCall::new("c1", "read_file", json!({"limit": 3, "path": "a"})),
            ToolCall::new("c1", "list_dir", json!({})),
        ];
        let (fp, signatures) = fingerprint_and_signatures(&calls);
        assert_eq!(fp, fingerprint(&calls));
        let each: Vec<u128> = calls.iter().map(call_signature).collect();
        assert_eq!(
            signatures, each,
            "in the calls' order, not the fingerprint's"
        );
        assert_ne!(signatures[0], signatures[1]);
        assert_ne!(
            signatures[1], signatures[2],
            "the tool counts, not only the id"
        );
    }

    #[test]
    fn fingerprint_ignores_ids_order_and_key_order() {
        let a = [
            ToolCall::new("c1", "read_file", json!({"path": "a", "limit": 3})),
            ToolCall::new("c2", "list_dir", json!({})),
        ];
        let b = [
            ToolCall::new("x", "list_dir", json!({})),
            ToolCall::new("y", "read_file", json!({"limit": 3, "path": "a"})),
        ];
        assert_eq!(fingerprint(&a), fingerprint(&b));
        let c = [ToolCall::new("c1", "read_file", json!({"path": "b"}))];
        assert_ne!(fingerprint(&a), fingerprint(&c));
    }

    #[test]
    fn signature_depends_on_the_id() {
        let a = ToolCall::new("c1", "read_file", json!({"path": "a"}));
        let b = ToolCall::new("c2", "read_file", json!({"path": "a"}));
        assert_ne!(call_signature(&a), call_signature(&b));
    }
}
