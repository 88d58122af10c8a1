//! Integration tests of the run machine: scenarios, properties and transcripts. No async
//! runtime anywhere.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

mod exchanges;
mod harness;
mod props;
mod recovery;
mod resumes;
mod scenarios;
mod snapshots;
mod stops;
