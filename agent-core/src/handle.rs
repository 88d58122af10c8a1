//! Handles: where a result the prompt shows shortened can be read whole (CONTRACT §9).

use std::fmt;
use std::str::FromStr;

/// A stored output (`blob:sha256:HEX`, the SHA-256 of its bytes, so equal contents are
/// stored once) or a committed result (`log:N`, entry N of the run's log). Written and
/// parsed here only, whatever crate hands it out or reads it back.
///
/// ```
/// use agent_core::Handle;
///
/// let blob = Handle::of_bytes(b"hello");
/// assert!(blob.to_string().starts_with("blob:sha256:2cf24dba"));
/// assert_eq!("log:7".parse::<Handle>(), Ok(Handle::Log(7)));
/// assert_eq!(blob.to_string().parse::<Handle>(), Ok(blob));
/// assert!("log:x".parse::<Handle>().is_err());
/// // In JSON, a handle is its text.
/// assert_eq!(serde_json::to_string(&Handle::Log(7)).unwrap(), r#""log:7""#);
/// ```
#[derive(
    Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
#[serde(try_from = "String", into = "String")]
pub enum Handle {
    /// A blob: the lowercase hex SHA-256 of its bytes.
    Blob(String),
    /// A result committed as this version of the run's log.
    Log(u64),
}

/// The text before a blob's digest.
pub const BLOB_PREFIX: &str = "blob:sha256:";
const LOG_PREFIX: &str = "log:";
const DIGEST_LEN: usize = 64;

impl Handle {
    /// The handle of `bytes` stored as a blob.
    pub fn of_bytes(bytes: &[u8]) -> Handle {
        Handle::Blob(crate::digest::sha256_hex(bytes))
    }

    /// Every blob handle written in `text`, in order (for example in a result that was
    /// shortened to its preview).
    pub fn blobs_in(text: &str) -> Vec<Handle> {
        let mut found = Vec::new();
        let mut rest = text;
        while let Some(at) = rest.find(BLOB_PREFIX) {
            rest = &rest[at + BLOB_PREFIX.len()..];
            if let Some(digest) = digest_at(rest) {
                found.push(Handle::Blob(digest.to_owned()));
                rest = &rest[DIGEST_LEN..];
            }
        }
        found
    }
}

/// A full digest at the start of `text`: 64 lowercase hex characters.
fn digest_at(text: &str) -> Option<&str> {
    let digest = text.get(..DIGEST_LEN)?;
    digest
        .bytes()
        .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        .then_some(digest)
}

impl fmt::Display for Handle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Handle::Blob(digest) => write!(f, "{BLOB_PREFIX}{digest}"),
            Handle::Log(version) => write!(f, "{LOG_PREFIX}{version}"),
        }
    }
}

impl From<Handle> for String {
    fn from(handle: Handle) -> String {
        handle.to_string()
    }
}

impl TryFrom<String> for Handle {
    type Error = HandleError;

    fn try_from(text: String) -> Result<Handle, HandleError> {
        text.parse()
    }
}

/// Text that is not a handle.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not a handle (blob:sha256:HEX or log:N)")]
pub struct HandleError(pub String);

impl FromStr for Handle {
    type Err = HandleError;

    fn from_str(text: &str) -> Result<Handle, HandleError> {
        let bad = || HandleError(text.to_owned());
        if let Some(rest) = text.strip_prefix(BLOB_PREFIX) {
            return match digest_at(rest) {
                Some(digest) if rest.len() == DIGEST_LEN => Ok(Handle::Blob(digest.to_owned())),
                _ => Err(bad()),
            };
        }
        let version = text.strip_prefix(LOG_PREFIX).ok_or_else(bad)?;
        if version.is_empty() || !version.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad());
        }
        version.parse().map(Handle::Log).map_err(|_| bad())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_round_trip_and_nothing_else_parses() {
        let blob = Handle::of_bytes(b"x");
        assert_eq!(blob.to_string().parse::<Handle>(), Ok(blob.clone()));
        assert_eq!(Handle::Log(0).to_string(), "log:0");
        for bad in [
            "",
            "log:",
            "log:-1",
            "log:+1",
            "log:1 ",
            "log:99999999999999999999",
            "blob:sha256:abc",
            "blob:sha256:",
            &format!("{}X", blob),
            &blob.to_string().to_uppercase(),
            "blob:md5:00",
        ] {
            assert!(bad.parse::<Handle>().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn blobs_are_found_in_text() {
        let a = Handle::of_bytes(b"a");
        let b = Handle::of_bytes(b"b");
        let text = format!("stored as {a}; and {b}, not blob:sha256:short or log:3");
        assert_eq!(Handle::blobs_in(&text), [a, b]);
        assert!(Handle::blobs_in("blob:sha256:").is_empty());
    }
}
