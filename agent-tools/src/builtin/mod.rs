//! Built-in tools. Their names and argument names are part of the contract (§5).

mod list_dir;
mod read_file;

pub use list_dir::ListDir;
pub use read_file::ReadFile;

use std::sync::Arc;

use crate::tool::{Tool, Typed};

/// Every built-in tool of this version.
pub fn all() -> Vec<Arc<dyn Tool>> {
    vec![Arc::new(Typed(ReadFile)), Arc::new(Typed(ListDir))]
}

fn io_error(path: &str, err: &std::io::Error) -> agent_core::ToolError {
    agent_core::ToolError::new(
        agent_core::ErrorKind::ExecutionFailed,
        format!("{path}: {err}"),
    )
}
