//! A command that could not run: its message and its exit code, by the class of the error
//! (the person's input is a usage error; a store that failed or lost data is a failure).

use agent_core::ReplyError;
use agent_runtime::RuntimeError;
use agent_store::StoreError;

use crate::exit::{EXIT_FAILED, EXIT_PAUSED, EXIT_USAGE};
use crate::settings::SettingsError;

/// A command that could not run, with its exit code.
#[derive(Debug)]
pub struct Failure {
    /// The exit code.
    pub code: u8,
    /// One line: what is wrong and what to do.
    pub message: String,
}

/// Bad usage, configuration or input; nothing was written.
pub fn usage(message: impl std::fmt::Display) -> Failure {
    Failure {
        code: EXIT_USAGE,
        message: message.to_string(),
    }
}

/// A failure that is not the person's input: a store that failed or lost data, a client
/// that could not be set up.
pub fn failed(message: impl std::fmt::Display) -> Failure {
    Failure {
        code: EXIT_FAILED,
        message: message.to_string(),
    }
}

impl From<SettingsError> for Failure {
    fn from(e: SettingsError) -> Self {
        usage(e)
    }
}

impl From<StoreError> for Failure {
    fn from(e: StoreError) -> Self {
        // The library says what is wrong; the command line adds what to do about it.
        let busy;
        let advice = match &e {
            StoreError::RunNotFound(_) => "; `agent runs` lists the runs",
            StoreError::Busy { run_id, .. } => {
                busy = format!(", or stop it with `agent cancel {run_id}`");
                busy.as_str()
            }
            StoreError::NotAStore(_) | StoreError::NotADirectory { .. } => {
                "; choose another --store directory"
            }
            StoreError::Locked { .. } => ", or use another --store",
            _ => "",
        };
        match e {
            // The store itself failed or lost data: not the person's input.
            StoreError::Damaged { .. }
            | StoreError::Corrupt { .. }
            | StoreError::Engine(_)
            | StoreError::LeaseLost(_) => failed(e),
            _ => usage(format!("{e}{advice}")),
        }
    }
}

impl From<RuntimeError> for Failure {
    fn from(e: RuntimeError) -> Self {
        match e {
            RuntimeError::Store(e) => Failure::from(e),
            RuntimeError::Damaged { .. } => failed(e),
            RuntimeError::Refused(_) => usage(e),
            RuntimeError::Reply { run_id, source } => {
                let what = match source {
                    ReplyError::AwaitingApproval => format!(
                        "it waits for approval of its pending calls: use `agent approve \
                         {run_id}` or `agent deny {run_id} --reason TEXT`"
                    ),
                    ReplyError::AwaitingResolution => format!(
                        "it waits for calls of unknown outcome to be settled: use `agent \
                         resolve {run_id} --call ID --as committed|rejected|retry`"
                    ),
                    ReplyError::NotEnded => format!(
                        "it was interrupted, not ended, and new limits come with a message to \
                         an ended run: use `agent resume {run_id} MESSAGE` without them, or \
                         `agent resume {run_id}` first"
                    ),
                    other => other.to_string(),
                };
                usage(format!("run {run_id} cannot take a message: {what}"))
            }
            RuntimeError::Unpriced {
                provider,
                model,
                max_cost_usd,
            } => usage(format!(
                "the run's cost budget is ${max_cost_usd} (--max-cost, max_cost_usd), but agent \
                 knows no \
                 price for {provider}:{model}, so its calls would count as free and the budget \
                 would never stop the run: give the price in agent.toml, [prices.{}] with \
                 input = and output = in dollars per million tokens",
                toml_key(&model)
            )),
            RuntimeError::LetGo { run_id } => Failure {
                code: EXIT_PAUSED,
                message: format!(
                    "run {run_id} was let go at its next step, as the process was asked to \
                     stop (SIGTERM, or SIGHUP as its terminal closed): all it did is committed, nothing is in doubt; `agent \
                     resume {run_id}` goes on with it"
                ),
            },
            other => failed(other),
        }
    }
}

/// `name` as a quoted TOML key, as the README writes prices' keys.
fn toml_key(name: &str) -> String {
    serde_json::to_string(name).unwrap_or_default()
}
