//! `agent-store` keeps agent-loop's event logs: each run's entries, appended one turn at a
//! time as an atomic batch tagged with the version it expects, and a small index of runs.
//!
//! `SledStore` is durable (sled on disk, flushed before a commit is confirmed; the default
//! `sled` feature); [`MemoryStore`] is for tests. Both implement [`Store`], which is all
//! the runtime sees. Without default features the crate is the trait, the memory store
//! and the [`conformance`] suite, for a backend of your own.
//!
//! ```
//! use agent_store::{MemoryStore, Store, StoreError};
//!
//! let store = MemoryStore::new();
//! assert!(matches!(store.load("r1"), Err(StoreError::RunNotFound(_))));
//! assert!(store.runs().unwrap().is_empty());
//! ```

pub mod conformance;
#[cfg(feature = "sled")]
mod dir;
mod error;
mod memory;
#[cfg(feature = "postgres")]
mod postgres;
#[cfg(feature = "sled")]
mod sled_store;
mod summary;
#[cfg(feature = "testing")]
pub mod testing;

#[cfg(feature = "sled")]
pub use dir::{DIR_FORMAT_VERSION, DirStore};
pub use error::StoreError;
pub use memory::MemoryStore;
#[cfg(feature = "postgres")]
pub use postgres::{
    CommitStats, FencedStore, Hold, Holder, Lease, Listener, MAX_CONNECTIONS, NeverStarted,
    PostgresStore, QueueState,
};
#[cfg(feature = "sled")]
pub use sled_store::{FORMAT_VERSION, SledStore};
pub use summary::RunSummary;

use std::time::{Duration, Instant};

use agent_core::{Entry, Handle};

/// How often [`Store::wait_from`] looks at a store that cannot tell of a commit.
pub const FOLLOW_POLL: Duration = Duration::from_millis(200);

/// Persistence of event logs. Implementations must make `append` atomic (all entries or
/// none) and durable before it returns `Ok`.
pub trait Store: Send + Sync {
    /// Appends `entries` to the run's log if the log is at `expected_version`; returns the
    /// new version. A mismatch is [`StoreError::Conflict`] and writes nothing.
    fn append(
        &self,
        run_id: &str,
        expected_version: u64,
        entries: &[Entry],
    ) -> Result<u64, StoreError>;

    /// [`Store::append`] for entries whose JSON the caller already made: `encoded[i]` must
    /// be exactly `serde_json::to_vec(&entries[i])`, so a store that keeps entries as JSON
    /// writes those bytes instead of encoding the entries again (the runtime encodes each
    /// entry once, to look for secrets before it is written). Stores that keep another
    /// form ignore `encoded`, as this default does.
    fn append_encoded(
        &self,
        run_id: &str,
        expected_version: u64,
        entries: &[Entry],
        encoded: &[Vec<u8>],
    ) -> Result<u64, StoreError> {
        let _ = encoded;
        self.append(run_id, expected_version, entries)
    }

    /// The run's whole log, in version order.
    fn load(&self, run_id: &str) -> Result<Vec<Entry>, StoreError>;

    /// The run's log from version `from` on (all of it for 0 or 1), in version order: what
    /// a reader that already has the rest needs, without reading the whole log.
    fn load_from(&self, run_id: &str, from: u64) -> Result<Vec<Entry>, StoreError> {
        let mut log = self.load(run_id)?;
        log.retain(|e| e.version >= from);
        Ok(log)
    }

    /// The run's log from version `from` on, once there is some: at once when entries from
    /// `from` are committed, else as soon as the first of them is, or an empty list after
    /// `wait`. For a reader that follows a run as it is written (`agent show --follow`).
    /// This default looks again every [`FOLLOW_POLL`]; a store that can be told of a
    /// commit answers when it is made, and one that knows that none is coming (nobody
    /// drives the run) may answer at once.
    fn wait_from(&self, run_id: &str, from: u64, wait: Duration) -> Result<Vec<Entry>, StoreError> {
        let deadline = Instant::now() + wait;
        loop {
            let found = self.load_from(run_id, from)?;
            let now = Instant::now();
            if !found.is_empty() || now >= deadline {
                return Ok(found);
            }
            std::thread::sleep(FOLLOW_POLL.min(deadline - now));
        }
    }

    /// Asks whoever drives run `run_id` now to stop it, as a Ctrl-C at its terminal would
    /// (`agent cancel` of a live run): `Ok(true)` when the request reached it, `Ok(false)`
    /// when nothing drives the run or this store carries no such requests (the default).
    fn ask_to_stop(&self, run_id: &str) -> Result<bool, StoreError> {
        let _ = run_id;
        Ok(false)
    }

    /// For the process driving run `run_id`: whether someone asked it to stop
    /// ([`Store::ask_to_stop`]) since it last looked (a request is seen once). `None` when
    /// this store carries no such requests (the default), so that a driver need not keep
    /// asking.
    fn stop_asked(&self, run_id: &str) -> Option<bool> {
        let _ = run_id;
        None
    }

    /// Hands a person's note to the process driving run `run_id` now (`agent resume RUN
    /// MESSAGE` of a live run), which commits it before the run's next model call
    /// ([`Store::told`]): `Ok(true)` when it reached that process, `Ok(false)` when nothing
    /// drives the run or this store carries no notes (the default).
    fn tell(&self, run_id: &str, text: &str) -> Result<bool, StoreError> {
        let _ = (run_id, text);
        Ok(false)
    }

    /// For the process driving run `run_id`: the notes sent to it ([`Store::tell`]) since it
    /// last looked, in the order they came (each is handed out once). None by default.
    fn told(&self, run_id: &str) -> Vec<String> {
        let _ = run_id;
        Vec::new()
    }

    /// For a process that begins to drive run `run_id`: lets go of the notes sent while no
    /// drive was going on (their senders were told the run stopped before it read them).
    /// By default, those [`Store::told`] hands out now.
    fn let_go_of_notes(&self, run_id: &str) {
        drop(self.told(run_id));
    }

    /// Every run's summary, by run id.
    fn runs(&self) -> Result<Vec<RunSummary>, StoreError>;

    /// Stores `bytes` once, by content ([`Handle::of_bytes`]), durably; returns its handle.
    fn put_blob(&self, bytes: &[u8]) -> Result<Handle, StoreError>;

    /// The bytes of a blob, or `None` if the handle names no blob (a `log:N` handle never
    /// does).
    fn get_blob(&self, handle: &Handle) -> Result<Option<Vec<u8>>, StoreError>;
}

/// Checks that a batch continues a log at `current` and was tagged with `expected`.
pub(crate) fn check_batch(
    run_id: &str,
    current: u64,
    expected: u64,
    entries: &[Entry],
) -> Result<(), StoreError> {
    if current != expected {
        return Err(StoreError::Conflict {
            run_id: run_id.to_owned(),
            expected,
            actual: current,
        });
    }
    let mut last = current;
    for entry in entries {
        if entry.version != last + 1 {
            return Err(StoreError::NotContiguous {
                run_id: run_id.to_owned(),
                expected_after: last,
                found: entry.version,
            });
        }
        last = entry.version;
    }
    Ok(())
}
