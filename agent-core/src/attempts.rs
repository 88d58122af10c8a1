//! How many times each call ran, by [`call_signature`](crate::progress): the retry budget's
//! memory. A run remembers every call it ran, in its working and its committed state, so
//! this grows with the run; it is kept to the signature's 16 bytes a call.

use std::collections::BTreeMap;

use serde::{Serialize, Serializer};

/// Signatures gathered unsorted before they are merged into the middle level.
const MERGE_EVERY: usize = 64;

/// Signatures the middle level holds before it is merged into the sorted array.
const MIDDLE: usize = 2_048;

/// Runs by call signature. A signature that ran once costs its 16 bytes (a `BTreeMap`
/// entry cost some 31): signatures sit in three sorted levels of growing size, as in a
/// log-structured merge tree: the latest [`MERGE_EVERY`] unsorted, up to [`MIDDLE`] sorted,
/// and all the others in one sorted array of exactly their size. A merge moves each
/// signature of the level it goes into once, so a run's cost a call stays flat (a few
/// hundred instructions at 100,000 calls); a signature that ran again is counted in a small
/// map.
#[derive(Clone, Debug, Default)]
pub(crate) struct Attempts {
    /// Most of the signatures that ran, sorted.
    sorted: Vec<u128>,
    /// Signatures merged from `recent` since the last merge into `sorted`, sorted.
    middle: Vec<u128>,
    /// Signatures that ran since the last merge into `middle`, in the order they ran.
    recent: Vec<u128>,
    /// Runs after the first, by signature.
    again: BTreeMap<u128, u32>,
}

impl Attempts {
    /// How many times the call with this signature ran.
    pub(crate) fn get(&self, signature: u128) -> u32 {
        let ran = self.recent.contains(&signature)
            || self.middle.binary_search(&signature).is_ok()
            || self.sorted.binary_search(&signature).is_ok();
        if ran {
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
            self.recent.sort_unstable();
            merge_into(&mut self.middle, &mut self.recent, false);
            if self.middle.len() >= MIDDLE {
                merge_into(&mut self.sorted, &mut self.middle, true);
            }
        }
    }

    /// Forgets every run.
    pub(crate) fn clear(&mut self) {
        self.sorted = Vec::new();
        self.middle.clear();
        self.recent.clear();
        self.again.clear();
    }

    /// Every signature with its runs, in order.
    fn counts(&self) -> BTreeMap<u128, u32> {
        self.sorted
            .iter()
            .chain(&self.middle)
            .chain(&self.recent)
            .map(|s| (*s, 1 + self.again.get(s).copied().unwrap_or(0)))
            .collect()
    }
}

/// Merges `from` (sorted) into `into` (sorted), from the back, in place, and empties
/// `from`. With `exact`, `into` grows by exactly what it needs (it is the big level).
fn merge_into(into: &mut Vec<u128>, from: &mut Vec<u128>, exact: bool) {
    let old = into.len();
    if exact {
        into.reserve_exact(from.len());
    }
    into.resize(old + from.len(), 0);
    let (mut left, mut right, mut out) = (old, from.len(), into.len());
    while right > 0 {
        out -= 1;
        if left > 0 && into[left - 1] > from[right - 1] {
            left -= 1;
            into[out] = into[left];
        } else {
            right -= 1;
            into[out] = from[right];
        }
    }
    from.clear();
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
            signatures in proptest::collection::vec(0u128..6_000, 0..5_000),
            clear_at in proptest::option::of(0usize..5_000),
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
            for s in 0u128..6_000 {
                prop_assert_eq!(attempts.get(s), map.get(&s).copied().unwrap_or(0));
            }
            prop_assert_eq!(attempts.counts(), map);
            prop_assert!(attempts.sorted.is_sorted() && attempts.middle.is_sorted());
        }
    }

    #[test]
    fn holds_sixteen_bytes_a_signature_once_merged() {
        let mut attempts = Attempts::default();
        for s in 0..(MIDDLE as u128 * 3) {
            attempts.record(s.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        }
        assert!(attempts.recent.is_empty() && attempts.middle.is_empty());
        assert_eq!(attempts.sorted.len(), MIDDLE * 3);
        assert_eq!(attempts.sorted.capacity(), MIDDLE * 3);
        assert!(attempts.again.is_empty());
    }
}
