//! Effect keys (CONTRACT §8): one business change, stable across retries and restarts.

use crate::decision::CallId;
use crate::digest::sha256_hex;

/// The effect key of a call: derived from run id, turn and call id only, so a resumed
/// run computes the same key for the same call.
pub fn effect_key(run_id: &str, turn: u32, call_id: &CallId) -> String {
    let digest = sha256_hex(format!("{run_id}\u{0}{turn}\u{0}{call_id}").as_bytes());
    format!("eff_{}", &digest[..32])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_is_stable_and_distinguishes_each_input() {
        let k = effect_key("run1", 3, &CallId::from("c1"));
        assert_eq!(k, effect_key("run1", 3, &CallId::from("c1")));
        assert!(k.starts_with("eff_") && k.len() == 36);
        assert_ne!(k, effect_key("run2", 3, &CallId::from("c1")));
        assert_ne!(k, effect_key("run1", 4, &CallId::from("c1")));
        assert_ne!(k, effect_key("run1", 3, &CallId::from("c2")));
    }
}
