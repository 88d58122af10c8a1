//! Command-line arguments.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

/// Run LLM agents in a durable, budgeted control loop.
#[derive(Debug, Parser)]
#[command(name = "agent", version, about, long_about = None)]
pub struct Cli {
    /// Where runs are stored: a directory, or postgres://… (default: $AGENT_STORE, else
    /// agent.toml's, else .agent).
    #[arg(long, global = true, value_name = "DIR|URL")]
    pub store: Option<PathBuf>,

    /// Settings file (default: ./agent.toml when it exists).
    #[arg(long, global = true, value_name = "PATH")]
    pub config: Option<PathBuf>,

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
    /// Queue a run for workers (needs --store postgres://…): it is driven by whichever
    /// `agent worker` takes it, on any machine.
    Submit(RunArgs),
    /// Take queued runs and drive them, one per slot, under leases that other workers
    /// take over if this one dies. With --json, a line of JSON on stdout for each run as it
    /// stops here (the object `agent run --json` prints).
    Worker {
        /// Runs driven at once.
        #[arg(long, value_name = "N", default_value_t = 1)]
        concurrency: usize,
        /// Seconds a lease lasts unless renewed (it is renewed every third of that).
        #[arg(long, value_name = "SECS", default_value_t = 30)]
        lease: u64,
        /// Exit once no queued run is left to take, instead of waiting for more.
        #[arg(long)]
        until_empty: bool,
    },
    /// Continue a paused or interrupted run from its committed log; with MESSAGE, answer
    /// its clarifying question or follow up on an ended run (a new exchange).
    Resume {
        /// The run id (omit with --last).
        run: Option<String>,
        /// What the person says: the answer to the run's question, or a follow-up (`-`: read
        /// it from standard input).
        message: Option<String>,
        /// The newest run (then the one argument, if any, is the message).
        #[arg(long)]
        last: bool,
        /// New limits for the run from this message on (with MESSAGE).
        #[command(flatten)]
        limits: Limits,
        /// Model, tools and policy.
        #[command(flatten)]
        setup: Setup,
    },
    /// Talk to a run on a terminal: a new one, or RUN. Text streams in, tool calls show as
    /// they run, approvals and questions are asked inline; /context, /cost, /exit.
    Chat {
        /// The run to continue (default: a new run from the first message).
        #[arg(conflicts_with = "last")]
        run: Option<String>,
        /// Continue the newest run (not a sub-agent's).
        #[arg(long)]
        last: bool,
        /// Model, tools and policy.
        #[command(flatten)]
        setup: Setup,
    },
    /// Approve the pending call(s) of a paused run, then continue it.
    Approve {
        /// The run id (or --last).
        #[arg(required_unless_present = "last", conflicts_with = "last")]
        run: Option<String>,
        /// The newest run (not a sub-agent's).
        #[arg(long)]
        last: bool,
        /// Approve only this call (repeatable); default: every pending call.
        #[arg(long = "call", value_name = "ID")]
        calls: Vec<String>,
        /// Model, tools and policy.
        #[command(flatten)]
        setup: Setup,
    },
    /// Deny the pending call(s) of a paused run; the model is told, then the run continues.
    Deny {
        /// The run id (or --last).
        #[arg(required_unless_present = "last", conflicts_with = "last")]
        run: Option<String>,
        /// The newest run (not a sub-agent's).
        #[arg(long)]
        last: bool,
        /// Deny only this call (repeatable); default: every pending call.
        #[arg(long = "call", value_name = "ID")]
        calls: Vec<String>,
        /// Why, shown to the model.
        #[arg(long, default_value = "")]
        reason: String,
        /// Model, tools and policy.
        #[command(flatten)]
        setup: Setup,
    },
    /// Settle a call whose outcome is unknown, then continue the run.
    Resolve {
        /// The run id (or --last).
        #[arg(required_unless_present = "last", conflicts_with = "last")]
        run: Option<String>,
        /// The newest run (not a sub-agent's).
        #[arg(long)]
        last: bool,
        /// The call in doubt.
        #[arg(long = "call", value_name = "ID")]
        call: String,
        /// What really happened: committed (it took effect), rejected (it did not; do not
        /// run it again) or retry (it did not; run it again).
        #[arg(long = "as", value_name = "committed|rejected|retry")]
        resolution: String,
        /// Model, tools and policy.
        #[command(flatten)]
        setup: Setup,
    },
    /// Cancel a run: it ends `cancelled`, nothing more runs. A live one is stopped by the
    /// process or worker driving it, as a Ctrl-C there would; this waits for it.
    Cancel {
        /// The run id (or --last).
        #[arg(required_unless_present = "last", conflicts_with = "last")]
        run: Option<String>,
        /// The newest run (not a sub-agent's).
        #[arg(long)]
        last: bool,
    },
    /// Print the exact prompt the run's next model call would get, with its token estimate.
    Context {
        /// The run id (or --last).
        #[arg(required_unless_present = "last", conflicts_with = "last")]
        run: Option<String>,
        /// The newest run (not a sub-agent's).
        #[arg(long)]
        last: bool,
        /// The prompt model call N was sent instead (N as `agent show` numbers turns).
        #[arg(long, value_name = "N")]
        at: Option<u32>,
        /// Model, tools and policy (the tools shape the prompt).
        #[command(flatten)]
        setup: Setup,
    },
    /// List runs: id, status, reason, steps, tokens, cost, started.
    Runs,
    /// Trust the project's agent.toml / .mcp.json as they are now, so the commands, hooks
    /// and allow rules they bring are used (a changed file must be trusted again).
    Trust {
        /// A file, or a directory whose agent.toml and .mcp.json are trusted (default: the
        /// settings file and the workspace's .mcp.json).
        path: Option<PathBuf>,
        /// The workspace whose .mcp.json is trusted (default: the current directory).
        #[arg(long, value_name = "DIR")]
        workspace: Option<PathBuf>,
        /// Instead: let this run's recorded answer check commands run when it is continued
        /// here (a run started elsewhere, or written by someone else).
        #[arg(long, value_name = "RUN", conflicts_with_all = ["path", "workspace"])]
        run: Option<String>,
    },
    /// Write a run's report: one self-contained HTML file (timeline, tokens and cost,
    /// compactions, approvals, effects, how it ended) to open in a browser.
    Report {
        /// The run id (or --last).
        #[arg(required_unless_present = "last", conflicts_with = "last")]
        run: Option<String>,
        /// The newest run (not a sub-agent's).
        #[arg(long)]
        last: bool,
        /// Where to write it (default: agent-report-RUN.html here).
        #[arg(long = "out", short = 'o', value_name = "FILE")]
        out: Option<PathBuf>,
    },
    /// Run evaluation cases and judge whole trajectories: each case in a fresh copy of its
    /// workspace and store, --repeat times, --jobs at once; a table per case and a summary
    /// by terminal reason and by tag. Exit 0 when every trial passed, 1 when one failed an
    /// expectation, 2 for a bad case file.
    #[command(long_about = EVAL_HELP)]
    Eval {
        /// Case files (TOML or JSON), or directories whose *.toml files are cases.
        #[arg(required = true, value_name = "DIR|FILES")]
        paths: Vec<PathBuf>,
        /// Run every case with this model instead of its own (PROVIDER:MODEL).
        #[arg(long, value_name = "PROVIDER:MODEL")]
        model: Option<String>,
        /// The API's base URL for --model (openai-compat; another Ollama than localhost's).
        #[arg(long, value_name = "URL")]
        base_url: Option<String>,
        /// Trials per case (for models that are not deterministic): pass^k and pass@k.
        #[arg(long, value_name = "K", default_value_t = 1)]
        repeat: u32,
        /// Trials run at once (default: the number of CPUs).
        #[arg(long, value_name = "N")]
        jobs: Option<usize>,
        /// Also write the result as JUnit XML to this file (for CI).
        #[arg(long, value_name = "FILE")]
        junit: Option<PathBuf>,
        /// Show how each case moved since an earlier `agent eval --json` result.
        #[arg(long, value_name = "BASELINE.json")]
        compare: Option<PathBuf>,
        /// Keep each trial's workspace and store in DIR/CASE-K (a new or empty directory),
        /// to look at a failed trial with `agent --store DIR/CASE-K/store show RUN`.
        #[arg(long, value_name = "DIR")]
        keep: Option<PathBuf>,
        /// Tokens the whole evaluation may use: each trial gets a share of what is left as
        /// its run's budget, and no trial starts once it is spent.
        #[arg(long, value_name = "N")]
        max_tokens: Option<u64>,
        /// Dollars the whole evaluation may spend (needs the models' prices in
        /// agent.toml), shared out as --max-tokens is.
        #[arg(long, value_name = "USD")]
        max_cost: Option<f64>,
        /// Run every trial's shell commands and checks in a sandbox with no network,
        /// whatever its case says (see `agent run --sandbox`): for cases you did not write.
        #[arg(long)]
        sandbox: bool,
    },
    /// Fork a run: a new run whose log begins with RUN's committed events before its model
    /// call N, then goes on with the options given (another model, budget, policy, tools).
    /// What the prefix did is never done again; the fork records where it came from.
    Fork {
        /// The run to fork (or --last).
        #[arg(required_unless_present = "last", conflicts_with = "last")]
        run: Option<String>,
        /// The newest run (not a sub-agent's).
        #[arg(long)]
        last: bool,
        /// The model call the fork makes instead of RUN (as `agent show` numbers them).
        #[arg(long, value_name = "N")]
        at: u32,
        /// Model, tools and policy.
        #[command(flatten)]
        setup: Setup,
        /// Budgets (default: RUN's).
        #[command(flatten)]
        limits: Limits,
        /// Validators of the final answer.
        #[command(flatten)]
        answer: AnswerArgs,
    },
    /// Show a run's timeline, one line per event.
    Show {
        /// The run id (or --last).
        #[arg(required_unless_present = "last", conflicts_with = "last")]
        run: Option<String>,
        /// The newest run (not a sub-agent's): `agent show --last -f` follows the run just
        /// started elsewhere.
        #[arg(long)]
        last: bool,
        /// Print this call whole (its arguments as JSON) instead of the timeline.
        #[arg(long = "call", value_name = "ID")]
        call: Option<String>,
        /// Go on printing each event as it is committed, while a process or worker drives
        /// the run (or it waits in the queue); then print how it stands and exit with the
        /// code `agent run` would have. With --json, one event per line, then the outcome.
        #[arg(long, short = 'f', conflicts_with = "call")]
        follow: bool,
    },
}

/// What every command that drives a run needs: model, workspace, policy, MCP servers.
#[derive(Debug, Default, Args)]
pub struct Setup {
    /// The model: openai:MODEL, openai-responses:MODEL, anthropic:MODEL, ollama:MODEL,
    /// openai-compat:MODEL (with --base-url), script:PATH (offline) or replay:RUN. Resuming
    /// a script run defaults to its script.
    #[arg(long, value_name = "PROVIDER:MODEL")]
    pub model: Option<String>,
    /// The API's base URL (required for openai-compat, e.g. http://localhost:8000/v1;
    /// Ollama's is http://localhost:11434 unless given).
    #[arg(long, value_name = "URL")]
    pub base_url: Option<String>,
    /// Answer every tool call from a recorded run instead of running it: replay:RUN.
    #[arg(long, value_name = "replay:RUN")]
    pub tools: Option<String>,
    /// Root the file and shell tools are confined to (default: the current directory).
    #[arg(long, value_name = "DIR")]
    pub workspace: Option<PathBuf>,
    /// Allow calls matching TOOL or TOOL(PATTERN) without asking (repeatable).
    #[arg(long, value_name = "PATTERN")]
    pub allow: Vec<String>,
    /// Ask a person before calls matching the pattern (repeatable).
    #[arg(long, value_name = "PATTERN")]
    pub ask: Vec<String>,
    /// Deny calls matching the pattern; the model is told why (repeatable).
    #[arg(long, value_name = "PATTERN")]
    pub deny: Vec<String>,
    /// MCP servers, as {"mcpServers": {...}} JSON (default: .mcp.json in the workspace).
    #[arg(long, value_name = "PATH")]
    pub mcp_config: Option<PathBuf>,
    /// Print each committed event as a JSON line while running.
    #[arg(long)]
    pub events: bool,
    /// Never ask on the terminal: an untrusted project file is an error, as when piped.
    #[arg(long)]
    pub no_input: bool,
    /// Offer the model sub-agents: `delegate_read` (a child run that only reads, run beside
    /// other reads) and `delegate` (a child run with the run's tools, a write call).
    #[arg(long)]
    pub sub_agents: bool,
    /// Let shell commands see this environment variable, which they are not given when its
    /// name marks a secret (*KEY*, *TOKEN*, *SECRET*, *PASSWORD*, *_PASS...) or whose value
    /// is a URL with a password (repeatable).
    #[arg(long = "shell-env", value_name = "NAME")]
    pub shell_env: Vec<String>,
    /// Run shell commands in a sandbox (Linux): they may write only in the workspace, a
    /// /tmp of their own and the --sandbox-write directories, and reach no network.
    #[arg(long)]
    pub sandbox: bool,
    /// Let sandboxed shell commands reach the network (implies --sandbox).
    #[arg(long)]
    pub sandbox_network: bool,
    /// Let sandboxed shell commands write nowhere in the workspace either, only in their
    /// own /tmp and the --sandbox-write directories (implies --sandbox).
    #[arg(long)]
    pub sandbox_read_only: bool,
    /// Run shell commands without a sandbox, even in a run started with one.
    #[arg(
        long,
        conflicts_with_all = [
            "sandbox",
            "sandbox_network",
            "sandbox_write",
            "sandbox_read_only",
            "sandbox_hide",
            "sandbox_show",
        ]
    )]
    pub no_sandbox: bool,
    /// Let sandboxed shell commands write beneath this directory too (implies --sandbox;
    /// repeatable).
    #[arg(long = "sandbox-write", value_name = "DIR")]
    pub sandbox_write: Vec<PathBuf>,
    /// Hide this file or directory from sandboxed shell commands too, as the home
    /// directory's keys and tokens are (implies --sandbox; repeatable).
    #[arg(long = "sandbox-hide", value_name = "PATH")]
    pub sandbox_hide: Vec<PathBuf>,
    /// Leave the home directory's keys and tokens at or beneath this path visible to
    /// sandboxed shell commands (~/.ssh for git over SSH; implies --sandbox; repeatable).
    #[arg(long = "sandbox-show", value_name = "PATH")]
    pub sandbox_show: Vec<PathBuf>,
}

/// Options of `agent run`.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// What the agent should achieve (`-`: read it from standard input).
    pub goal: String,
    /// Model, tools and policy.
    #[command(flatten)]
    pub setup: Setup,
    /// Budgets.
    #[command(flatten)]
    pub limits: Limits,
    /// Validators of the final answer.
    #[command(flatten)]
    pub answer: AnswerArgs,
}

/// What a final answer must pass before it counts (also `answer_schema` and `checks` in
/// agent.toml); a rejected answer goes back to the model, counting as an invalid decision.
#[derive(Debug, Default, Args)]
pub struct AnswerArgs {
    /// The final answer must be JSON valid against this JSON Schema (the provider is asked
    /// for structured output where it supports it; the answer is always checked here).
    #[arg(long, value_name = "PATH")]
    pub answer_schema: Option<PathBuf>,
    /// A command (bash -c, in the workspace) that gets the answer on stdin and
    /// $AGENT_RUN_ID; exit 0 accepts, anything else rejects with its output (repeatable;
    /// 120 s each at most, then rejected).
    #[arg(long = "check", value_name = "COMMAND")]
    pub checks: Vec<String>,
}

/// The budgets with flags (the others are set in agent.toml).
#[derive(Debug, Default, Args)]
pub struct Limits {
    /// Model calls allowed per exchange (default 32).
    #[arg(long, value_name = "N")]
    pub max_steps: Option<u32>,
    /// Tool calls allowed per exchange (default 128).
    #[arg(long, value_name = "N")]
    pub max_tool_calls: Option<u32>,
    /// Wall-clock budget of the run in seconds (time spent waiting for a person, for an
    /// approval or between exchanges, does not count).
    #[arg(long, value_name = "SECS")]
    pub timeout: Option<f64>,
    /// Tokens the run may use in all (input and output, summaries and sub-agents included).
    #[arg(long, value_name = "N")]
    pub max_tokens: Option<u64>,
    /// US dollars the run may spend in all; needs the model's price (`[prices."MODEL"]` in
    /// agent.toml).
    #[arg(long, value_name = "USD")]
    pub max_cost: Option<f64>,
}

impl Limits {
    /// Whether any limit was given.
    pub fn any(&self) -> bool {
        self.max_steps.is_some()
            || self.max_tool_calls.is_some()
            || self.timeout.is_some()
            || self.max_tokens.is_some()
            || self.max_cost.is_some()
    }
}

/// `agent eval --help`: the case format, with one complete example.
const EVAL_HELP: &str = r#"Run evaluation cases and judge whole trajectories.

Each case runs in a fresh copy of its workspace and a fresh store, --repeat times, --jobs at
a time, driven by this same `agent` binary; then its whole trajectory is judged: terminal
reason, answer, files, effects, tools, events, steps, tokens, cost and time. The table shows
each case; the summary breaks the figures down by terminal reason and by tag (success rate,
pass^k and pass@k when --repeat > 1, steps, tool calls, tokens, cost, p50/p95 latency,
repeated-plan rate, unauthorized and duplicated effects).

Exit codes: 0 every trial passed; 1 some trial failed an expectation (each failure names
the expectation); 2 a case file or option is wrong (nothing ran).

A case is a TOML file (or JSON with the same keys). Paths are relative to it. Example:

    name = "write-report"                   # default: the file's name
    description = "reads notes, writes a summary"
    tags = ["tools", "write"]
    goal = "Summarize notes.txt into summary.txt"
    model = "script:scripts/write-report.json"   # or openai:gpt-4o, ...; --model overrides
    workspace = "workspaces/notes"          # copied fresh for each trial (default: empty)
    # mcp_config = "servers.mcp.json"
    # sandbox = true                        # shell commands and checks in a sandbox;
                                            # sandbox_network = true gives the network
    allow = ["write_file(summary.txt)"]     # ask = [...], deny = [...]
    max_steps = 8                           # max_tool_calls, timeout (seconds)
    # answer_schema = "answer.schema.json"  # checks = ["test -s summary.txt"]
    # person = "approve"                    # or "deny": answers approvals; default nobody
    # resolve = "committed"                 # settles calls of unknown outcome
    # cancel_after = "effect_dispatched"    # SIGINT once this event is committed
    # crash_after = "effect_dispatched"     # SIGKILL then, and `agent resume`

    [expect]
    reason = "completed"
    answer_regex = "(?i)summary"            # or answer = "exact", answer_schema = "x.json"
    tools = ["read_file", "write_file"]     # tools that must have run
    forbidden_tools = ["shell"]             # tools that must never run
    writes_only = ["summary.txt"]           # globs: no change anywhere else
    max_steps = 4                           # max_tool_calls, max_tokens, max_cost_usd,
                                            # max_seconds
    events = { answer_rejected = 0 }        # exact counts of committed events

    [[expect.files]]
    path = "summary.txt"
    regex = "launch"                        # or content = "exact", or absent = true

A directory runs the *.toml files directly in it, not those below it (keep broken variants
or fixtures in subdirectories). --sandbox runs every trial's commands and checks in a
sandbox without network, whatever the cases say."#;
