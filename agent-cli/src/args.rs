//! Command-line arguments.

use std::path::PathBuf;

use clap::{Parser, Subcommand};

/// Run LLM agents in a durable, budgeted control loop.
#[derive(Debug, Parser)]
#[command(name = "agent", version, about, long_about = None)]
pub struct Cli {
    /// Where runs are stored.
    #[arg(long, global = true, default_value = ".agent", value_name = "DIR")]
    pub store: PathBuf,

    /// Print one JSON object (or array) instead of text.
    #[arg(long, global = true)]
    pub json: bool,

    /// The command.
    #[command(subcommand)]
    pub command: Commands,
}

/// The commands of this version.
#[derive(Debug, Subcommand)]
pub enum Commands {
    /// Start a run.
    Run(RunArgs),
    /// Continue a paused or interrupted run from its committed log.
    Resume {
        /// The run id.
        run: String,
        /// The model to continue with (default: the run's own script model).
        #[arg(long, value_name = "PROVIDER:MODEL")]
        model: Option<String>,
        /// Root the file tools are confined to.
        #[arg(long, default_value = ".", value_name = "DIR")]
        workspace: PathBuf,
        /// Print each committed event as a JSON line while running.
        #[arg(long)]
        events: bool,
    },
    /// List runs: id, status, reason, steps, started.
    Runs,
    /// Show a run's timeline, one line per event.
    Show {
        /// The run id.
        run: String,
    },
}

/// Options of `agent run`.
#[derive(Debug, clap::Args)]
pub struct RunArgs {
    /// What the agent should achieve.
    pub goal: String,
    /// The model: script:PATH (offline); openai:, anthropic:, openai-compat: come later.
    #[arg(long, value_name = "PROVIDER:MODEL")]
    pub model: String,
    /// Root the file tools are confined to.
    #[arg(long, default_value = ".", value_name = "DIR")]
    pub workspace: PathBuf,
    /// Model calls allowed (default 32).
    #[arg(long, value_name = "N")]
    pub max_steps: Option<u32>,
    /// Tool calls allowed (default 128).
    #[arg(long, value_name = "N")]
    pub max_tool_calls: Option<u32>,
    /// Wall-clock budget in seconds.
    #[arg(long, value_name = "SECS")]
    pub timeout: Option<f64>,
    /// Print each committed event as a JSON line while running.
    #[arg(long)]
    pub events: bool,
}
