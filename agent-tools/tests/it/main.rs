//! Integration tests of the tool gateway and the built-in tools, on real directories.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod bounded;
mod builtins;
mod confinement;
mod gateway;
mod hooks;
mod more_builtins;
mod trust;
