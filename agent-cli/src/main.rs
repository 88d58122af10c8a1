//! The `agent` binary: parse, run, map the outcome to an exit code.

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let cli = agent_cli::Cli::parse();
    agent_cli::main(cli)
}
