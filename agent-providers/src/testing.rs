//! A scripted HTTP server on 127.0.0.1 for tests of the adapters (and of anything that
//! drives them, like the CLI): it answers each request with the next scripted reply, a
//! recorded SSE stream for instance, and records what it was sent.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// One scripted reply.
#[derive(Clone, Debug)]
pub struct Reply {
    /// HTTP status.
    pub status: u16,
    /// Extra headers.
    pub headers: Vec<(String, String)>,
    /// The body, sent as is (an SSE stream, a JSON error).
    pub body: String,
}

impl Reply {
    /// A 200 streaming `body`.
    pub fn stream(body: impl Into<String>) -> Reply {
        Reply {
            status: 200,
            headers: vec![("content-type".into(), "text/event-stream".into())],
            body: body.into(),
        }
    }

    /// A 200 stream of newline-delimited JSON objects, as Ollama's own API sends them.
    pub fn ndjson(body: impl Into<String>) -> Reply {
        Reply {
            status: 200,
            headers: vec![("content-type".into(), "application/x-ndjson".into())],
            body: body.into(),
        }
    }

    /// An error status with a JSON body.
    pub fn status(status: u16, body: impl Into<String>) -> Reply {
        Reply {
            status,
            headers: vec![("content-type".into(), "application/json".into())],
            body: body.into(),
        }
    }

    /// Adds a header.
    pub fn header(mut self, name: &str, value: &str) -> Reply {
        self.headers.push((name.to_owned(), value.to_owned()));
        self
    }
}

/// A request the server received.
#[derive(Clone, Debug)]
pub struct Received {
    /// The path.
    pub path: String,
    /// Headers, names lowercased.
    pub headers: Vec<(String, String)>,
    /// The JSON body.
    pub body: Value,
}

impl Received {
    /// A header's value.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// The running server.
#[derive(Clone, Debug)]
pub struct Server {
    /// `http://127.0.0.1:PORT`.
    pub url: String,
    received: Arc<Mutex<Vec<Received>>>,
}

impl Server {
    /// Starts serving `replies` in order; past them it answers 500.
    pub async fn start(replies: Vec<Reply>) -> std::io::Result<Server> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("http://{}", listener.local_addr()?);
        let received: Arc<Mutex<Vec<Received>>> = Arc::default();
        let queue = Arc::new(Mutex::new(VecDeque::from(replies)));
        let log = Arc::clone(&received);
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                let queue = Arc::clone(&queue);
                let log = Arc::clone(&log);
                tokio::spawn(async move {
                    let Some(request) = read_request(&mut socket).await else {
                        return;
                    };
                    if let Ok(mut log) = log.lock() {
                        log.push(request);
                    }
                    let reply = queue
                        .lock()
                        .ok()
                        .and_then(|mut q| q.pop_front())
                        .unwrap_or_else(|| {
                            Reply::status(500, "{\"error\": \"no scripted reply\"}")
                        });
                    let mut head = format!(
                        "HTTP/1.1 {} Scripted\r\nconnection: close\r\n",
                        reply.status
                    );
                    for (name, value) in &reply.headers {
                        head.push_str(&format!("{name}: {value}\r\n"));
                    }
                    head.push_str("\r\n");
                    let _ = socket.write_all(head.as_bytes()).await;
                    let _ = socket.write_all(reply.body.as_bytes()).await;
                    let _ = socket.shutdown().await;
                });
            }
        });
        Ok(Server { url, received })
    }

    /// Everything received so far.
    pub fn received(&self) -> Vec<Received> {
        self.received.lock().map(|r| r.clone()).unwrap_or_default()
    }
}

async fn read_request(socket: &mut tokio::net::TcpStream) -> Option<Received> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    let head_end = loop {
        let n = socket.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(pos) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break pos + 4;
        }
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let mut lines = head.split("\r\n");
    let path = lines.next()?.split_whitespace().nth(1)?.to_owned();
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    let length: usize = headers
        .iter()
        .find(|(n, _)| n == "content-length")
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0);
    while buf.len() < head_end + length {
        let n = socket.read(&mut chunk).await.ok()?;
        if n == 0 {
            break;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    let body = serde_json::from_slice(&buf[head_end..]).unwrap_or(Value::Null);
    Some(Received {
        path,
        headers,
        body,
    })
}
