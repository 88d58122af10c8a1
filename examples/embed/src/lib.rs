//! Embedding agent-loop in your own program: a tool of your own with typed arguments, the
//! in-memory store, and an offline script standing in for the model. Swap the script for
//! `agent_providers::HttpModel` (default features) and the store for `SledStore` to go live.
//!
//! `cargo run -p example-embed` prints the answer and the run's events;
//! `cargo test -p example-embed` checks them.

use std::sync::Arc;

use agent_core::{Budget, Risk, ToolError};
use agent_providers::ScriptModel;
use agent_runtime::{Report, RunRequest, Runtime};
use agent_store::MemoryStore;
use agent_tools::{Gateway, ToolContext, Typed, TypedTool, Workspace};
use schemars::JsonSchema;
use serde::Deserialize;

/// Looks a room up in the office directory (here a fixed table).
pub struct RoomFinder;

/// Arguments of `find_room`: their JSON Schema is generated, never written by hand.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FindRoom {
    /// How many people must fit.
    pub seats: u32,
}

#[async_trait::async_trait]
impl TypedTool for RoomFinder {
    type Args = FindRoom;
    const NAME: &'static str = "find_room";
    const RISK: Risk = Risk::Read;

    fn description(&self) -> String {
        "Finds a free meeting room with at least `seats` seats.".to_owned()
    }

    async fn run(&self, args: FindRoom, _ctx: &ToolContext) -> Result<String, ToolError> {
        let rooms = [("Ada", 4), ("Aurora", 12), ("Borealis", 30)];
        rooms
            .iter()
            .find(|(_, seats)| *seats >= args.seats)
            .map(|(name, seats)| format!("{name} ({seats} seats) is free"))
            .ok_or_else(|| {
                ToolError::new(
                    agent_core::ErrorKind::ExecutionFailed,
                    format!("no room has {} seats", args.seats),
                )
            })
    }
}

/// The model's part, scripted: it calls the tool, then answers.
pub const SCRIPT: &str = r#"{"turns": [
  {"tool_calls": [{"id": "c1", "name": "find_room", "arguments": {"seats": 10}}]},
  {"final": "Book Aurora: it seats 12 and is free."}
]}"#;

/// Runs the example to its end and returns the report and the store.
pub fn run_example() -> Result<(Report, Arc<MemoryStore>), Box<dyn std::error::Error>> {
    let model = ScriptModel::from_json(SCRIPT)?;
    let mut gateway = Gateway::new(Workspace::new(".")?);
    gateway.register(Arc::new(Typed(RoomFinder)))?;
    let store = Arc::new(MemoryStore::new());
    let runtime = Runtime::new(Arc::new(model), Arc::new(gateway), store.clone());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()?;
    let request = RunRequest::new("run-1", "Find a room for ten people.", Budget::default());
    let report = rt.block_on(runtime.start(request, Default::default()))?;
    Ok((report, store))
}
