//! The store as the gateway's blob sink: large outputs are kept once, by content.

use std::sync::Arc;

use agent_store::Store;
use agent_tools::BlobSink;

/// Keeps whole tool outputs in the run store's content-addressed blobs.
pub struct StoreBlobs(pub Arc<dyn Store>);

impl BlobSink for StoreBlobs {
    fn put(&self, content: &str) -> Result<String, String> {
        self.0
            .put_blob(content.as_bytes())
            .map_err(|e| e.to_string())
    }
}
