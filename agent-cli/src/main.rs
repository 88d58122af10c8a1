//! The `agent` binary: parse, run, map the outcome to an exit code.

use std::process::ExitCode;

use clap::Parser;

/// jemalloc, unless built without the `jemalloc` feature or for a target it does not serve.
#[cfg(all(feature = "jemalloc", not(target_env = "msvc")))]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() -> ExitCode {
    // Started by a `shell` call as its command's watcher: be that, and nothing else.
    agent_tools::watch_if_asked();
    if let Ok(this) = std::env::current_exe() {
        agent_tools::watch_with(this);
    }
    let cli = agent_cli::Cli::parse();
    agent_cli::main(cli)
}
