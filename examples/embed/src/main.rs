//! `cargo run -p example-embed`: the example run, its answer and its events.
// Printing is what this program is for.
#![allow(clippy::print_stdout, clippy::print_stderr)]

use agent_core::TerminalReason;
use agent_store::Store;
use example_embed::run_example;

fn main() {
    match run_example() {
        Ok((report, store)) => {
            if report.outcome.reason == TerminalReason::Completed {
                println!("{}", report.outcome.answer.unwrap_or_default());
            } else {
                println!("stopped: {}", report.outcome.message);
            }
            for entry in store.load(&report.run_id).unwrap_or_default() {
                println!("  {} {}", entry.version, entry.event.name());
            }
        }
        Err(e) => {
            eprintln!("example-embed: {e}");
            std::process::exit(1);
        }
    }
}
