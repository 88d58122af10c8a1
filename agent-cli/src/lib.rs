//! The `agent` command line. `main` stays thin: parse the arguments, resolve the settings,
//! build the parts, run, and map the outcome to the documented exit code (CONTRACT §10).
//!
//! This crate is the only one that knows about terminals and exit codes.
#![allow(clippy::print_stdout, clippy::print_stderr)]

mod app;
mod args;
mod build;
mod chat;
pub mod config;
mod exit;
mod failure;
mod render;
pub mod settings;
mod trust;

pub use app::main;
pub use args::{Cli, Commands, Limits, Setup};
pub use exit::{
    EXIT_CANCELLED, EXIT_FAILED, EXIT_OK, EXIT_PAUSED, EXIT_STOPPED, EXIT_USAGE, exit_code,
};
