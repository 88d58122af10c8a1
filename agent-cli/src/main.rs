//! The `agent` binary: parse, run, map the outcome to an exit code.

use std::process::ExitCode;

use clap::Parser;

/// jemalloc, unless built without the `jemalloc` feature or for a target it does not serve.
#[cfg(all(feature = "jemalloc", not(target_env = "msvc")))]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() -> ExitCode {
    let cli = agent_cli::Cli::parse();
    agent_cli::main(cli)
}
