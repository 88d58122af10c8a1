//! A small MCP server over stdio for agent-loop's tests:
//! - `meet` (read-only) waits until `n` calls are in flight at once, which can only happen
//!   if the client runs them in parallel;
//! - `delete_item` (destructive) must ask before it runs;
//! - `echo` (no annotations) is `external`;
//! - `crash` exits the process, to test restarts;
//! - `env` prints one of the server's environment variables;
//! - `mixed` answers with every kind of content (text, an embedded resource, a resource
//!   link, an image).
#![allow(missing_docs)]

use std::sync::Arc;
use std::time::Duration;

use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{CallToolResult, ContentBlock, Resource, ServerCapabilities, ServerConfig};
use rmcp::{ServerHandler, ServiceExt, schemars, tool, tool_handler, tool_router};
use serde::Deserialize;
use tokio::sync::Mutex;
use tokio::sync::Notify;

#[derive(Clone)]
struct Fixture {
    // Read through the code `tool_handler` generates.
    #[allow(dead_code)]
    tool_router: ToolRouter<Fixture>,
    in_flight: Arc<Mutex<u32>>,
    arrived: Arc<Notify>,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
struct MeetArgs {
    /// How many calls must be in flight together.
    n: u32,
    /// A label echoed back.
    tag: String,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
struct DeleteArgs {
    /// What to delete.
    id: String,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
struct EchoArgs {
    /// Text to echo.
    text: String,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
struct EnvArgs {
    /// The variable's name.
    name: String,
}

#[tool_router]
impl Fixture {
    fn new() -> Self {
        Fixture {
            tool_router: Self::tool_router(),
            in_flight: Arc::default(),
            arrived: Arc::default(),
        }
    }

    #[tool(
        description = "Waits until n calls are in flight together, then answers",
        annotations(read_only_hint = true)
    )]
    async fn meet(&self, Parameters(args): Parameters<MeetArgs>) -> String {
        *self.in_flight.lock().await += 1;
        self.arrived.notify_waiters();
        let met = tokio::time::timeout(Duration::from_secs(10), async {
            loop {
                let notified = self.arrived.notified();
                if *self.in_flight.lock().await >= args.n {
                    self.arrived.notify_waiters();
                    return;
                }
                notified.await;
            }
        })
        .await
        .is_ok();
        if met {
            format!("{} met {} calls", args.tag, args.n)
        } else {
            format!("{} waited alone", args.tag)
        }
    }

    #[tool(
        description = "Deletes an item for good",
        annotations(destructive_hint = true, read_only_hint = false)
    )]
    async fn delete_item(&self, Parameters(args): Parameters<DeleteArgs>) -> String {
        format!("deleted {}", args.id)
    }

    #[tool(description = "Echoes its text")]
    async fn echo(&self, Parameters(args): Parameters<EchoArgs>) -> String {
        args.text
    }

    #[tool(
        description = "Prints the value of one of the server's environment variables",
        annotations(read_only_hint = true)
    )]
    async fn env(&self, Parameters(args): Parameters<EnvArgs>) -> String {
        format!(
            "{}={}",
            args.name,
            std::env::var(&args.name).unwrap_or_default()
        )
    }

    #[tool(
        description = "Answers with every kind of content",
        annotations(read_only_hint = true)
    )]
    async fn mixed(&self) -> CallToolResult {
        CallToolResult::success(vec![
            ContentBlock::text("plain words"),
            ContentBlock::embedded_text("file:///notes.txt", "embedded words"),
            ContentBlock::resource_link(
                Resource::new("file:///big.log", "big.log")
                    .with_mime_type("text/plain")
                    .with_size(1234),
            ),
            ContentBlock::image("aGVsbG8h", "image/png"),
        ])
    }

    #[tool(description = "Exits the server process at once")]
    async fn crash(&self) -> String {
        std::process::exit(3);
    }
}

#[tool_handler]
impl ServerHandler for Fixture {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
    }
}

#[tokio::main]
async fn main() {
    let Ok(service) = Fixture::new().serve(rmcp::transport::stdio()).await else {
        std::process::exit(1);
    };
    let _ = service.waiting().await;
}
