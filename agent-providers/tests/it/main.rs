//! The adapters: the script model, the wire translators on recorded provider traffic, and
//! the HTTP transport against a real server on 127.0.0.1.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod http;
mod script;
mod wire;

/// A recorded provider stream from `tests/fixtures`, framed as a server sends it: some
/// recordings were saved without the blank line that ends their last event.
pub fn fixture(name: &str) -> String {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    format!("{}\n\n", text.trim_end())
}

/// `(event, data)` pairs of an SSE text, as a server sends them.
pub fn sse(text: &str) -> Vec<(String, String)> {
    text.split("\n\n")
        .filter(|block| !block.trim().is_empty())
        .map(|block| {
            let mut event = "message".to_owned();
            let mut data = Vec::new();
            for line in block.lines() {
                if let Some(e) = line.strip_prefix("event:") {
                    event = e.trim().to_owned();
                } else if let Some(d) = line.strip_prefix("data:") {
                    data.push(d.trim_start().to_owned());
                }
            }
            (event, data.join("\n"))
        })
        .collect()
}
