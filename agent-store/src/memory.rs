//! An in-memory store, for tests and embedders that need no durability.

use std::collections::BTreeMap;
use std::sync::Mutex;

use agent_core::{Entry, Handle};

use crate::{RunSummary, Store, StoreError, check_batch};

/// A store that keeps everything in memory.
#[derive(Debug, Default)]
pub struct MemoryStore {
    runs: Mutex<BTreeMap<String, (Vec<Entry>, RunSummary)>>,
    blobs: Mutex<BTreeMap<Handle, Vec<u8>>>,
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, (Vec<Entry>, RunSummary)>> {
        // A poisoned lock only means another thread panicked mid-append; the map itself
        // is always left whole, so keep using it.
        self.runs.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Store for MemoryStore {
    fn append(
        &self,
        run_id: &str,
        expected_version: u64,
        entries: &[Entry],
    ) -> Result<u64, StoreError> {
        let mut runs = self.lock();
        let current = runs.get(run_id).map_or(0, |(_, s)| s.version);
        check_batch(run_id, current, expected_version, entries)?;
        let (log, summary) = runs
            .entry(run_id.to_owned())
            .or_insert_with(|| (Vec::new(), RunSummary::new(run_id)));
        for entry in entries {
            summary.apply(entry);
            log.push(entry.clone());
        }
        Ok(summary.version)
    }

    fn load(&self, run_id: &str) -> Result<Vec<Entry>, StoreError> {
        self.lock()
            .get(run_id)
            .map(|(log, _)| log.clone())
            .ok_or_else(|| StoreError::RunNotFound(run_id.to_owned()))
    }

    fn runs(&self) -> Result<Vec<RunSummary>, StoreError> {
        Ok(self.lock().values().map(|(_, s)| s.clone()).collect())
    }

    fn put_blob(&self, bytes: &[u8]) -> Result<Handle, StoreError> {
        let handle = Handle::of_bytes(bytes);
        let mut blobs = self.blobs.lock().unwrap_or_else(|p| p.into_inner());
        blobs
            .entry(handle.clone())
            .or_insert_with(|| bytes.to_vec());
        Ok(handle)
    }

    fn get_blob(&self, handle: &Handle) -> Result<Option<Vec<u8>>, StoreError> {
        let blobs = self.blobs.lock().unwrap_or_else(|p| p.into_inner());
        Ok(blobs.get(handle).cloned())
    }
}

#[cfg(test)]
mod tests {
    /// The suite every backend passes, here without sled (`--no-default-features`).
    #[test]
    fn the_memory_store_passes_the_conformance_suite() {
        crate::conformance::check_all(&super::MemoryStore::new());
    }
}
