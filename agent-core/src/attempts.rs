//! How many times each call ran, by [`call_signature`](crate::progress): the retry budget's
//! memory. A run remembers every call it ran, in its working and its committed state, so
//! this grows with the run; it is kept to the signature's 16 bytes a call.

use std::collections::BTreeMap;

use serde::{Serialize, Serializer};

/// Signatures gathered unsorted before they are merged into the sorted ones.
const MERGE_EVERY: usize = 64;

/// Runs by call signature. A signature that ran once costs its 16 bytes (a `BTreeMap`
/// entry cost some 31): the signatures sit in a sorted array, with the latest ones in a
/// short unsorted tail merged into it now and then (a merge moves each signature once, so
/// it costs a few instructions a signature every [`MERGE_EVERY`] calls); a signature that
/// ran again is counted in a small map.
#[derive(Clone, Debug, Default)]
pub(crate) struct Attempts {
    /// Signatures that ran, sorted.
    sorted: Vec<u128>,
    /// Signatures that ran since the last merge, in the order they ran.
    recent: Vec<u128>,
    /// Runs after the first, by signature.
    again: BTreeMap<u128, u32>,
}

impl Attempts {
    /// How many times the call with this signature ran.
    pub(crate) fn get(&self, signature: u128) -> u32 {
        if self.sorted.binary_search(&signature).is_ok() || self.recent.contains(&signature) {
            1 + self.again.get(&signature).copied().unwrap_or(0)
        } else {
            0
        }
    }

    /// Counts one more run of the call with this signature.
    pub(crate) fn record(&mut self, signature: u128) {
        if self.get(signature) > 0 {
            *self.again.entry(signature).or_insert(0) += 1;
            return;
        }
        self.recent.push(signature);
        if self.recent.len() >= MERGE_EVERY {
            self.merge();
        }
    }

    /// Forgets every run.
    pub(crate) fn clear(&mut self) {
        self.sorted = Vec::new();
        self.recent.clear();
        self.again.clear();
    }

    /// Moves the recent signatures into the sorted ones: the recent sorted, then both merged
    /// from the back, in place, into room made at the end (exactly as much as is needed).
    fn merge(&mut self) {
        self.recent.sort_unstable();
        let old = self.sorted.len();
        self.sorted.reserve_exact(self.recent.len());
        self.sorted.resize(old + self.recent.len(), 0);
        let (mut left, mut right, mut out) = (old, self.recent.len(), self.sorted.len());
        while right > 0 {
            out -= 1;
            if left > 0 && self.sorted[left - 1] > self.recent[right - 1] {
                left -= 1;
                self.sorted[out] = self.sorted[left];
            } else {
                right -= 1;
                self.sorted[out] = self.recent[right];
            }
        }
        self.recent.clear();
    }

    /// Every signature with its runs, in order.
    fn counts(&self) -> BTreeMap<u128, u32> {
        self.sorted
            .iter()
            .chain(&self.recent)
            .map(|s| (*s, 1 + self.again.get(s).copied().unwrap_or(0)))
            .collect()
    }
}

/// Equal when they count the same runs, however they hold them.
impl PartialEq for Attempts {
    fn eq(&self, other: &Attempts) -> bool {
        self.counts() == other.counts()
    }
}

/// As a map from signature to runs, as a `BTreeMap` was.
impl Serialize for Attempts {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.counts().serialize(serializer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Whatever the order and the repeats, it counts what a map counts.
        #[test]
        fn it_counts_what_a_map_counts(
            signatures in proptest::collection::vec(0u128..400, 0..1_000),
            clear_at in proptest::option::of(0usize..1_000),
        ) {
            let mut attempts = Attempts::default();
            let mut map: BTreeMap<u128, u32> = BTreeMap::new();
            for (i, s) in signatures.iter().enumerate() {
                if clear_at == Some(i) {
                    attempts.clear();
                    map.clear();
                }
                prop_assert_eq!(attempts.get(*s), map.get(s).copied().unwrap_or(0));
                attempts.record(*s);
                *map.entry(*s).or_insert(0) += 1;
            }
            for s in 0u128..400 {
                prop_assert_eq!(attempts.get(s), map.get(&s).copied().unwrap_or(0));
            }
            prop_assert_eq!(attempts.counts(), map);
            prop_assert!(attempts.sorted.is_sorted());
        }
    }

    #[test]
    fn holds_sixteen_bytes_a_signature_once_merged() {
        let mut attempts = Attempts::default();
        for s in 0..(MERGE_EVERY as u128 * 10) {
            attempts.record(s.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        }
        assert!(attempts.recent.is_empty());
        assert_eq!(attempts.sorted.capacity(), MERGE_EVERY * 10);
        assert!(attempts.again.is_empty());
    }
}
