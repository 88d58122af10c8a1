//! The store as the gateway's blob sink and `read_result`'s source.

use std::sync::Arc;

use agent_core::Event;
use agent_store::Store;
use agent_tools::{BlobSink, ResultSource};

/// Keeps whole tool outputs in the run store's content-addressed blobs, and reads them, or
/// results of the log, back for `read_result`.
pub struct StoreBlobs(pub Arc<dyn Store>);

impl BlobSink for StoreBlobs {
    fn put(&self, content: &str) -> Result<String, String> {
        self.0
            .put_blob(content.as_bytes())
            .map_err(|e| e.to_string())
    }
}

impl ResultSource for StoreBlobs {
    fn fetch(&self, run_id: &str, handle: &str) -> Result<Option<String>, String> {
        if handle.starts_with("blob:") {
            let bytes = self.0.get_blob(handle).map_err(|e| e.to_string())?;
            return Ok(bytes.map(|b| String::from_utf8_lossy(&b).into_owned()));
        }
        let Some(version) = handle
            .strip_prefix("log:")
            .and_then(|v| v.parse::<u64>().ok())
        else {
            return Ok(None);
        };
        let log = self.0.load(run_id).map_err(|e| e.to_string())?;
        Ok(log
            .into_iter()
            .find(|e| e.version == version)
            .and_then(|e| match e.event {
                Event::ToolFinished { result, .. } | Event::CallRejected { result, .. } => {
                    Some(result.content())
                }
                _ => None,
            }))
    }
}
