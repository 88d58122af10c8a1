//! `agent-runtime` is the thin async loop around the sans-IO machine of `agent-core`: it
//! carries out each [`Command`](agent_core::Command) with the model, the tool gateway and
//! the store, and feeds the result back, in the contract's order. It never asks the model
//! again before the store confirmed the previous turn.
//!
//! ```
//! use std::sync::Arc;
//! use agent_core::{Budget, TerminalReason};
//! use agent_providers::ScriptModel;
//! use agent_runtime::{RunRequest, Runtime};
//! use agent_store::{MemoryStore, Store};
//! use agent_tools::{Gateway, Workspace};
//!
//! let model = ScriptModel::from_json(r#"{"turns": [{"final": "hi"}]}"#).unwrap();
//! let gateway = Gateway::with_builtins(Workspace::new(".").unwrap()).unwrap();
//! let store = Arc::new(MemoryStore::new());
//! let runtime = Runtime::new(Arc::new(model), Arc::new(gateway), store.clone());
//! let rt = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
//! let report = rt
//!     .block_on(runtime.start(RunRequest::new("r1", "say hi", Budget::default()), Default::default()))
//!     .unwrap();
//! assert_eq!(report.outcome.reason, TerminalReason::Completed);
//! assert_eq!(store.load("r1").unwrap().len(), 3);
//! ```

mod blobs;
mod clock;
mod driver;
mod redact;
mod summarize;

pub use blobs::StoreBlobs;
pub use clock::{Clock, SystemClock};
pub use driver::{
    DEFAULT_SUB_AGENT_STEPS, EventSink, Report, RunRequest, Runtime, RuntimeError, sub_agent_run_id,
};
pub use redact::{MissingSecret, Redactor};
pub use summarize::ModelSummarizer;

/// Reads `FAILPOINTS` once per process (test builds with the `failpoints` feature only).
#[cfg(feature = "failpoints")]
fn init_failpoints() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| std::mem::forget(fail::FailScenario::setup()));
}
pub use tokio_util::sync::CancellationToken;
