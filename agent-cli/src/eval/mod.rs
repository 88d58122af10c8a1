//! `agent eval`: runs evaluation cases, each in a fresh copy of its workspace and store,
//! K times, in parallel, and judges whole trajectories: the terminal reason, the answer,
//! files, effects, tools, events, steps, tokens, cost and time. The summary is broken
//! down by terminal reason and by tag, never one global average.

mod case;
mod report;
mod trial;

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

pub use case::Case;
pub use report::{CaseResult, EvalReport};
pub use trial::{Children, Invocation, Trial};

use crate::app::{say, tell};
use crate::exit::{EXIT_CANCELLED, EXIT_OK, EXIT_PAUSED};
use crate::failure::{Failure, failed, usage};

/// Exit code of an evaluation in which some expectation failed.
pub const EXIT_EVAL_FAILED: u8 = 1;

/// What `agent eval` was asked.
#[derive(Debug)]
pub struct EvalOptions {
    /// The settings every trial's `agent` reads: how the models are called and priced
    /// ([`crate::config::Config::model_calls`] of the settings `agent eval` was started
    /// with), as a settings file.
    pub model_calls: String,
    /// Tokens the whole evaluation may use.
    pub max_tokens: Option<u64>,
    /// Dollars the whole evaluation may spend.
    pub max_cost: Option<f64>,
    /// Case files and directories.
    pub paths: Vec<PathBuf>,
    /// The model every case runs with instead of its own.
    pub model: Option<String>,
    /// `--base-url` for that model.
    pub base_url: Option<String>,
    /// Trials per case.
    pub repeat: u32,
    /// Trials at once.
    pub jobs: usize,
    /// Where to write JUnit XML.
    pub junit: Option<PathBuf>,
    /// An earlier `--json` result to compare with.
    pub compare: Option<PathBuf>,
    /// Keep each trial's workspace and store under this directory (new or empty).
    pub keep: Option<PathBuf>,
    /// Print the result as JSON.
    pub json: bool,
    /// Every trial in a sandbox without network, whatever its case says.
    pub sandbox: bool,
}

/// Runs the cases and prints the result; 0 when every trial passed.
pub fn eval(options: &EvalOptions) -> Result<u8, Failure> {
    if options.repeat == 0 {
        return Err(usage("--repeat 0 runs nothing; give at least 1"));
    }
    if options.jobs == 0 {
        return Err(usage("--jobs 0 runs nothing; give at least 1"));
    }
    if options.max_tokens == Some(0) {
        return Err(usage("--max-tokens 0 runs nothing; give at least 1"));
    }
    if let Some(usd) = options.max_cost
        && !(usd.is_finite() && usd > 0.0)
    {
        return Err(usage(format!(
            "--max-cost {usd}: give a positive number of dollars"
        )));
    }
    // Every case is read and checked before anything runs.
    let files = case::find(&options.paths).map_err(usage)?;
    let cases: Vec<Case> = files
        .iter()
        .map(|f| Case::load(f))
        .collect::<Result<_, _>>()
        .map_err(usage)?;
    let mut seen = std::collections::BTreeSet::new();
    for case in &cases {
        if !seen.insert(case.name.as_str()) {
            return Err(usage(format!(
                "{}: another case is named {:?}; names must differ",
                case.file.display(),
                case.name
            )));
        }
    }
    let baseline = match &options.compare {
        None => None,
        Some(path) => Some(report::load_baseline(path).map_err(usage)?),
    };
    if let Some(keep) = &options.keep
        && std::fs::read_dir(keep).is_ok_and(|mut entries| entries.next().is_some())
    {
        return Err(usage(format!(
            "--keep {}: the directory is not empty; give a new or empty one",
            keep.display()
        )));
    }
    let exe =
        std::env::current_exe().map_err(|e| failed(format!("cannot find agent itself: {e}")))?;
    let invocation = Invocation {
        exe,
        settings: options.model_calls.clone(),
        model: options.model.clone(),
        base_url: options.base_url.clone(),
        sandbox: options.sandbox,
        // The trials' processes run in their workspaces: paths given to them are absolute.
        keep: options
            .keep
            .as_deref()
            .map(std::path::absolute)
            .transpose()
            .map_err(|e| usage(format!("--keep: {e}")))?,
        children: Arc::default(),
    };
    stop_on_terminate(&invocation.children)?;
    let purse = Purse::new(options.max_tokens, options.max_cost);
    let trials = run_all(&invocation, &cases, options.repeat, options.jobs, &purse);
    let result = EvalReport::new(&cases, trials, options.repeat);
    if let Some(path) = &options.junit {
        write_file(path, &result.junit())?;
    }
    if options.json {
        say(format_args!("{}\n", result.json(baseline.as_ref())));
    } else {
        say(format_args!("{}", result.text(baseline.as_ref())));
    }
    if let Some(interrupted) = invocation.children.stopped() {
        tell(format_args!(
            "agent: {}: {} of {} trial(s) did not run or finish\n",
            if interrupted {
                "interrupted"
            } else {
                "asked to stop"
            },
            result.stopped_trials(),
            result.trials()
        ));
        return Ok(if interrupted {
            EXIT_CANCELLED
        } else {
            EXIT_PAUSED
        });
    }
    if result.all_passed() {
        Ok(EXIT_OK)
    } else {
        if !options.json {
            tell(format_args!(
                "agent: {} of {} trial(s) failed an expectation\n",
                result.failed_trials(),
                result.trials()
            ));
        }
        Ok(EXIT_EVAL_FAILED)
    }
}

/// SIGTERM (a CI job's timeout, a service manager) or SIGHUP: the trials running are
/// asked to stop at their next step (their runs let go, nothing in doubt), none begins
/// after, and the report of what ran is printed (exit 3); a second signal ends the
/// evaluation at once (143). Before, the evaluation died at once and its trials' processes
/// ran on.
///
/// Ctrl-C (SIGINT) does the same (the trials' processes, in the terminal's foreground
/// group, are cancelled by it themselves), exit 130.
fn stop_on_terminate(children: &Arc<Children>) -> Result<(), Failure> {
    use tokio::signal::unix::SignalKind;
    for (signals, stopping, code, interrupted) in [
        (
            &[SignalKind::terminate(), SignalKind::hangup()][..],
            "agent: asked to stop: the trials running stop at their next step and no other \
             begins (again to stop at once)\n",
            143,
            false,
        ),
        (
            &[SignalKind::interrupt()][..],
            "agent: interrupted: the trials running stop and no other begins (Ctrl-C again \
             to stop at once)\n",
            130,
            true,
        ),
    ] {
        let drain = crate::build::drain_on_signals(signals, stopping, code)?;
        let children = Arc::clone(children);
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .map_err(|e| failed(format!("cannot start a thread's runtime: {e}")))?;
        std::thread::spawn(move || {
            rt.block_on(drain.cancelled());
            children.stop(interrupted);
        });
    }
    Ok(())
}

/// What the whole evaluation may use (`--max-tokens`, `--max-cost`), shared out among the
/// trials as they start: each gets, as its run's budget, what is left (less what the
/// trials running have been given) divided among the slots not running one, and gives
/// back what it did not use when it ends. So what the trials are given never adds up to
/// more than the limit; a run may pass its own budget by its first model call (which
/// nothing counted yet), so the evaluation by one call of each trial at most.
struct Purse {
    tokens: Option<u64>,
    cost: Option<f64>,
    state: Mutex<Spending>,
}

#[derive(Default)]
struct Spending {
    spent_tokens: u64,
    spent_cost: f64,
    given_tokens: u64,
    given_cost: f64,
    running: usize,
}

/// A trial's share of the evaluation's budget.
#[derive(Clone, Copy, Debug, Default)]
pub struct Allowance {
    /// Tokens, under `--max-tokens`.
    pub tokens: Option<u64>,
    /// Dollars, under `--max-cost`.
    pub cost: Option<f64>,
}

impl Purse {
    fn new(tokens: Option<u64>, cost: Option<f64>) -> Purse {
        Purse {
            tokens,
            cost,
            state: Mutex::default(),
        }
    }

    /// A share for a trial about to start, `slots` trials running at most; why not, once
    /// the budget is spent.
    fn give(&self, slots: usize) -> Result<Allowance, String> {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let free = slots.saturating_sub(s.running).max(1);
        let mut allowance = Allowance::default();
        if let Some(limit) = self.tokens {
            let left = limit.saturating_sub(s.spent_tokens + s.given_tokens);
            if left == 0 {
                return Err(format!(
                    "not run: the evaluation's --max-tokens {limit} was spent ({} used)",
                    s.spent_tokens
                ));
            }
            allowance.tokens = Some((left / free as u64).max(1));
        }
        if let Some(limit) = self.cost {
            let left = limit - s.spent_cost - s.given_cost;
            // Less than a hundredth of a cent buys no model call.
            if left < 0.000_01 {
                return Err(format!(
                    "not run: the evaluation's --max-cost ${limit} was spent (${:.4} used)",
                    s.spent_cost
                ));
            }
            allowance.cost = Some(left / free as f64);
        }
        s.given_tokens += allowance.tokens.unwrap_or(0);
        s.given_cost += allowance.cost.unwrap_or(0.0);
        s.running += 1;
        Ok(allowance)
    }

    /// A trial given `allowance` ended, having used `trial`'s tokens and cost.
    fn settle(&self, allowance: Allowance, trial: &Trial) {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        s.given_tokens = s.given_tokens.saturating_sub(allowance.tokens.unwrap_or(0));
        s.given_cost -= allowance.cost.unwrap_or(0.0);
        s.spent_tokens = s.spent_tokens.saturating_add(trial.tokens);
        s.spent_cost += trial.cost_usd;
        s.running = s.running.saturating_sub(1);
    }
}

/// Every trial of every case, `jobs` at a time, within `purse`; results by case, in trial
/// order.
fn run_all(
    invocation: &Invocation,
    cases: &[Case],
    repeat: u32,
    jobs: usize,
    purse: &Purse,
) -> Vec<Vec<Trial>> {
    let queue: Mutex<VecDeque<(usize, u32)>> = Mutex::new(
        (0..cases.len())
            .flat_map(|c| (0..repeat).map(move |k| (c, k)))
            .collect(),
    );
    let done: Mutex<Vec<Vec<Option<Trial>>>> =
        Mutex::new(cases.iter().map(|_| vec![None; repeat as usize]).collect());
    let workers = jobs.min(cases.len() * repeat as usize).max(1);
    std::thread::scope(|scope| {
        for _ in 0..workers {
            scope.spawn(|| {
                loop {
                    let next = queue.lock().map(|mut q| q.pop_front()).ok().flatten();
                    let Some((c, k)) = next else { break };
                    let stopping = || invocation.children.stopping();
                    let given = if stopping() {
                        Err(trial::NOT_BEGUN.to_owned())
                    } else {
                        purse.give(workers)
                    };
                    let trial = match given {
                        Ok(allowance) => {
                            let trial = invocation.trial(&cases[c], k, allowance);
                            purse.settle(allowance, &trial);
                            // Asked to stop while it ran: not judged.
                            if !trial.pass && stopping() {
                                trial.stopped()
                            } else {
                                trial
                            }
                        }
                        Err(why) => Trial::not_run(why),
                    };
                    if let Ok(mut done) = done.lock() {
                        done[c][k as usize] = Some(trial);
                    }
                }
            });
        }
    });
    done.into_inner()
        .unwrap_or_default()
        .into_iter()
        .map(|trials| trials.into_iter().flatten().collect())
        .collect()
}

/// Writes a file whole, through a temporary file beside it.
fn write_file(path: &Path, text: &str) -> Result<(), Failure> {
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    crate::app::write_whole(dir, path, text.as_bytes())
        .map_err(|e| usage(format!("{}: cannot write there ({e})", path.display())))
}
