//! Digests and canonical JSON, the two things fingerprints and manifests are made of.

use serde_json::Value;
use sha2::{Digest, Sha256};

/// Hex-encoded SHA-256 of `bytes`.
pub fn sha256_hex(bytes: &[u8]) -> String {
    let digest = Sha256::digest(bytes);
    let mut out = String::with_capacity(digest.len() * 2);
    for byte in digest {
        out.push(char::from(HEX[usize::from(byte >> 4)]));
        out.push(char::from(HEX[usize::from(byte & 0x0f)]));
    }
    out
}

const HEX: &[u8; 16] = b"0123456789abcdef";

/// Canonical JSON text of `value`: object keys sorted, no whitespace.
///
/// Two values that differ only in key order or formatting give the same text, which is
/// what makes plan fingerprints independent of how a model happened to write them.
pub fn canonical_json(value: &Value) -> String {
    let mut out = Vec::with_capacity(64);
    write_canonical(value, &mut out);
    // Only JSON text was written: valid UTF-8.
    String::from_utf8(out).unwrap_or_default()
}

/// Appends the canonical JSON text of `value` to `out`, without intermediate values.
pub(crate) fn write_canonical(value: &Value, out: &mut Vec<u8>) {
    match value {
        Value::Object(map) => {
            out.push(b'{');
            // serde_json's map keeps its keys sorted, unless a crate of the build turns on
            // its `preserve_order`: then they are sorted here.
            if map.keys().is_sorted() {
                write_members(map.iter(), out);
            } else {
                let mut members: Vec<(&String, &Value)> = map.iter().collect();
                members.sort_unstable_by(|a, b| a.0.cmp(b.0));
                write_members(members.into_iter(), out);
            }
            out.push(b'}');
        }
        Value::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_canonical(item, out);
            }
            out.push(b']');
        }
        scalar => {
            let _ = serde_json::to_writer(&mut *out, scalar);
        }
    }
}

/// An object's members, in the order given, as `"key":value` separated by commas.
fn write_members<'a>(members: impl Iterator<Item = (&'a String, &'a Value)>, out: &mut Vec<u8>) {
    for (i, (key, v)) in members.enumerate() {
        if i > 0 {
            out.push(b',');
        }
        // Writing a string into a Vec cannot fail.
        let _ = serde_json::to_writer(&mut *out, key);
        out.push(b':');
        write_canonical(v, out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn canonical_json_sorts_keys_at_every_depth() {
        let a = json!({"b": 1, "a": {"d": [1, {"z": 0, "y": 1}], "c": null}});
        assert_eq!(
            canonical_json(&a),
            r#"{"a":{"c":null,"d":[1,{"y":1,"z":0}]},"b":1}"#
        );
    }

    #[test]
    fn sha256_hex_matches_known_vector() {
        assert_eq!(
            sha256_hex(b"abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }
}
