//! The store as the gateway's blob sink and `read_result`'s source.

use std::sync::Arc;

use agent_core::{Event, Handle};
use agent_store::Store;
use agent_tools::{BlobSink, ResultSource, StorageError};

use crate::redact::Redactor;

/// Keeps whole tool outputs in the run store's content-addressed blobs (secrets redacted
/// first, like everything else bound for the disk), and reads them, or results of the
/// log, back for `read_result`.
///
/// A run reads only what its own log handed out: a `blob:` handle must appear in one of
/// its own results (blobs are shared by content, so the scope is the log, not the blob),
/// and a `log:N` handle names an entry of its own log.
pub struct StoreBlobs {
    store: Arc<dyn Store>,
    redactor: Redactor,
}

impl StoreBlobs {
    /// Blobs in `store`, credential formats redacted (no environment is read: give the
    /// runtime's redactor with [`StoreBlobs::with_redactor`]).
    pub fn new(store: Arc<dyn Store>) -> StoreBlobs {
        StoreBlobs {
            store,
            redactor: Redactor::new([]),
        }
    }

    /// Uses another redactor (the runtime's, with MCP servers' secrets too).
    pub fn with_redactor(mut self, redactor: Redactor) -> StoreBlobs {
        self.redactor = redactor;
        self
    }
}

impl BlobSink for StoreBlobs {
    fn put(&self, content: &str) -> Result<Handle, StorageError> {
        let content = self.redactor.redact_str(content);
        self.store
            .put_blob(content.as_bytes())
            .map_err(StorageError::new)
    }
}

/// The words the gateway puts before a handle it hands out (see `Gateway::shape_output`).
fn handed_out(content: &str, handle: &Handle) -> bool {
    content.contains(&format!("stored as {handle};"))
}

impl ResultSource for StoreBlobs {
    fn fetch(&self, run_id: &str, handle: &Handle) -> Result<Option<String>, StorageError> {
        let log = self.store.load(run_id).map_err(StorageError::new)?;
        let results = || {
            log.iter().filter_map(|e| match &e.event {
                Event::ToolFinished { result, .. } | Event::CallRejected { result, .. } => {
                    Some((e.version, result))
                }
                _ => None,
            })
        };
        match handle {
            Handle::Blob(_) => {
                if !results().any(|(_, r)| handed_out(&r.content(), handle)) {
                    return Ok(None);
                }
                let bytes = self.store.get_blob(handle).map_err(StorageError::new)?;
                Ok(bytes.map(|b| String::from_utf8_lossy(&b).into_owned()))
            }
            Handle::Log(version) => Ok(results()
                .find(|(v, _)| v == version)
                .map(|(_, r)| r.content())),
        }
    }
}
