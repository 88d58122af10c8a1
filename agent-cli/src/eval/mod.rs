//! `agent eval`: runs evaluation cases, each in a fresh copy of its workspace and store,
//! K times, in parallel, and judges whole trajectories: the terminal reason, the answer,
//! files, effects, tools, events, steps, tokens, cost and time. The summary is broken
//! down by terminal reason and by tag, never one global average.

mod case;
mod report;
mod trial;

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

pub use case::Case;
pub use report::{CaseResult, EvalReport};
pub use trial::{Invocation, Trial};

use crate::app::{say, tell};
use crate::exit::EXIT_OK;
use crate::failure::{Failure, failed, usage};

/// Exit code of an evaluation in which some expectation failed.
pub const EXIT_EVAL_FAILED: u8 = 1;

/// What `agent eval` was asked.
#[derive(Debug)]
pub struct EvalOptions {
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
}

/// Runs the cases and prints the result; 0 when every trial passed.
pub fn eval(options: &EvalOptions) -> Result<u8, Failure> {
    if options.repeat == 0 {
        return Err(usage("--repeat 0 runs nothing; give at least 1"));
    }
    if options.jobs == 0 {
        return Err(usage("--jobs 0 runs nothing; give at least 1"));
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
        model: options.model.clone(),
        base_url: options.base_url.clone(),
        // The trials' processes run in their workspaces: paths given to them are absolute.
        keep: options
            .keep
            .as_deref()
            .map(std::path::absolute)
            .transpose()
            .map_err(|e| usage(format!("--keep: {e}")))?,
    };
    let trials = run_all(&invocation, &cases, options.repeat, options.jobs);
    let result = EvalReport::new(&cases, trials, options.repeat);
    if let Some(path) = &options.junit {
        write_file(path, &result.junit())?;
    }
    if options.json {
        say(format_args!("{}\n", result.json(baseline.as_ref())));
    } else {
        say(format_args!("{}", result.text(baseline.as_ref())));
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

/// Every trial of every case, `jobs` at a time; results by case, in trial order.
fn run_all(invocation: &Invocation, cases: &[Case], repeat: u32, jobs: usize) -> Vec<Vec<Trial>> {
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
                    let trial = invocation.trial(&cases[c], k);
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
    let mut file = tempfile::NamedTempFile::new_in(dir)
        .map_err(|e| usage(format!("{}: cannot write there ({e})", path.display())))?;
    std::io::Write::write_all(&mut file, text.as_bytes())
        .map_err(|e| failed(format!("{}: {e}", path.display())))?;
    file.persist(path)
        .map_err(|e| failed(format!("{}: {e}", path.display())))?;
    Ok(())
}
