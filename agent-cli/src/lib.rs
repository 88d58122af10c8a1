//! The `agent` command line. `main` stays thin: parse the arguments, resolve the settings,
//! build the parts, run, and map the outcome to the documented exit code (CONTRACT §10).
//!
//! This crate is the only one that knows about terminals and exit codes.
//!
//! A command's configuration is resolved in one place, with no side effect, so a program
//! (or a test) can see what a command line would do:
//!
//! ```
//! use agent_cli::settings::{Env, ModelChoice, Settings};
//! use agent_cli::{Limits, Setup};
//!
//! let setup = Setup {
//!     model: Some("openai:gpt-4o".into()),
//!     ..Setup::default()
//! };
//! let limits = Limits { max_steps: Some(5), ..Limits::default() };
//! let settings = Settings::resolve(None, None, &setup, &limits, Env::default()).unwrap();
//! assert_eq!(settings.store.dir(), Some(std::path::Path::new(".agent")));
//! assert_eq!(settings.budget.max_steps, Some(5));
//! let Some(ModelChoice::Http(http)) = &settings.model else { unreachable!() };
//! // No key in this environment: said before anything is written.
//! assert!(http.ready().unwrap_err().to_string().contains("OPENAI_API_KEY is not set"));
//! ```
#![allow(clippy::print_stdout, clippy::print_stderr)]

mod app;
mod args;
mod build;
mod chat;
pub mod config;
pub mod eval;
mod exit;
mod failure;
mod progress;
mod render;
mod report;
pub mod settings;
pub mod stores;
mod telemetry;
mod trust;
pub mod worker;

pub use app::main;
pub use args::{Cli, Commands, Limits, Setup};
pub use exit::{
    EXIT_CANCELLED, EXIT_FAILED, EXIT_OK, EXIT_PAUSED, EXIT_STOPPED, EXIT_USAGE, exit_code,
};
