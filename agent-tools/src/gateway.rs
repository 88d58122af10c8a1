//! The gateway: the one door between the model's intents and real actions.

use std::collections::BTreeMap;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use agent_core::{
    CallId, ErrorKind, Handle, Risk, ScheduledCall, ToolCall, ToolError, ToolResult, ToolSpec,
    Verdict,
};
use futures::FutureExt as _;
use futures::future::join_all;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;

use crate::builtin::head_tail;
use crate::hooks::{Hook, HookCall, HookDecision};
use crate::policy::{Policy, Subject};
use crate::tool::{Tool, ToolContext};
use crate::workspace::{Resolved, Seen, Workspace};
use serde_json::Value;

/// Where the whole of an output too large for the model is kept; the result keeps the
/// handle. The store implements it.
pub trait BlobSink: Send + Sync {
    /// Stores `content` and returns its handle (a [`Handle::Blob`]).
    fn put(&self, content: &str) -> Result<Handle, StorageError>;
}

/// Where `read_result` finds what a handle names: `blob:sha256:…` (a stored output) or
/// `log:VERSION` (a result in the run's log). The runtime implements it over the store.
pub trait ResultSource: Send + Sync {
    /// The whole text behind `handle` in run `run_id`, or `None` if it names nothing the
    /// run may read.
    fn fetch(&self, run_id: &str, handle: &Handle) -> Result<Option<String>, StorageError>;
}

/// The storage behind a [`BlobSink`] or a [`ResultSource`] failed (a disk, a database).
#[derive(Debug, thiserror::Error)]
#[error("the store failed: {0}")]
pub struct StorageError(#[source] pub Box<dyn std::error::Error + Send + Sync>);

impl StorageError {
    /// Wraps the storage's own error.
    pub fn new(error: impl Into<Box<dyn std::error::Error + Send + Sync>>) -> StorageError {
        StorageError(error.into())
    }
}

pub use agent_core::PREVIEW_BYTES;

/// Deepest nesting accepted in a tool's input schema (an MCP server's, say).
pub const MAX_SCHEMA_DEPTH: usize = 64;

/// Bytes of a tool's input schema, as JSON, accepted at most: it goes with every model
/// call, and into the run's first event.
pub const MAX_SCHEMA_BYTES: usize = 32 * 1024;

/// Whether `spec`'s input schema is within [`MAX_SCHEMA_DEPTH`] and [`MAX_SCHEMA_BYTES`],
/// as [`Gateway::register`] requires; else what is wrong, in words. The specs are recorded
/// in a run's first event and go with every model call.
pub fn schema_within_bounds(spec: &ToolSpec) -> Result<(), String> {
    let depth = agent_core::nesting_depth(&spec.input_schema);
    if depth > MAX_SCHEMA_DEPTH {
        return Err(format!(
            "it nests {depth} levels deep; at most {MAX_SCHEMA_DEPTH} are accepted"
        ));
    }
    let bytes = serde_json::to_string(&spec.input_schema).map_or(0, |text| text.len());
    if bytes > MAX_SCHEMA_BYTES {
        return Err(format!(
            "it takes {bytes} bytes as JSON; at most {MAX_SCHEMA_BYTES} are accepted, as it \
             goes with every model call"
        ));
    }
    Ok(())
}

/// Calls of one parallel group running at once, at most.
pub const DEFAULT_CONCURRENCY: usize = 8;

/// A tool could not be registered.
#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    /// Two tools share a name.
    #[error("two tools are named {0:?}; tool names must be unique")]
    DuplicateTool(String),
    /// No tool of this name is registered to be replaced.
    #[error("no tool is named {0:?}; only a registered tool can be replaced")]
    UnknownTool(String),
    /// A tool's input schema is not a valid JSON Schema.
    #[error("tool {tool:?} has an invalid input schema: {message}")]
    InvalidSchema {
        /// The tool.
        tool: String,
        /// What the schema compiler said.
        message: String,
    },
}

struct Registered {
    tool: Arc<dyn Tool>,
    spec: ToolSpec,
    /// The schema compiled: at registration for a tool from outside, at its first call
    /// for a built-in one (whose schemas a test compiles), so a run pays only for the
    /// tools it calls.
    validator: std::sync::OnceLock<Result<jsonschema::Validator, String>>,
}

impl Registered {
    fn validator(&self) -> &Result<jsonschema::Validator, String> {
        self.validator.get_or_init(|| compile(&self.spec))
    }
}

/// A tool's schema compiled, or why it cannot be.
/// What `value` breaks of a schema: each error's path inside the value (`/` for the value
/// itself) and its message.
pub(crate) fn schema_errors<'a>(
    validator: &'a jsonschema::Validator,
    value: &'a serde_json::Value,
) -> impl Iterator<Item = (String, String)> + 'a {
    validator.iter_errors(value).map(|e| {
        let path = e.instance_path().to_string();
        let path = if path.is_empty() {
            "/".to_owned()
        } else {
            path
        };
        (path, e.to_string())
    })
}

fn compile(spec: &ToolSpec) -> Result<jsonschema::Validator, String> {
    jsonschema::validator_for(&spec.input_schema).map_err(|e| e.to_string())
}

/// What a watcher of the gateway is told while calls run (for live display; nothing in
/// the log depends on it).
#[derive(Debug)]
pub enum ToolActivity<'a> {
    /// The call starts now (its checks passed and a slot was free).
    Started {
        /// The call, as it runs.
        call: &'a ToolCall,
    },
    /// The call finished (or failed, timed out, was cancelled).
    Finished {
        /// Its result.
        result: &'a ToolResult,
        /// How long it ran.
        elapsed: Duration,
    },
}

/// The gateway's word on a batch of calls ([`Gateway::check_judged`]), as the machine's
/// `CallsChecked` input takes it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Checks {
    /// One verdict per call, in the order the calls were given.
    pub verdicts: Vec<(CallId, Verdict)>,
    /// For calls allowed or asked about that act on a path: where it led in the workspace
    /// when they were judged (relative to the workspace, as policy saw it).
    pub paths: Vec<(CallId, String)>,
}

/// A watcher of calls as they start and finish.
pub type ToolObserver = Arc<dyn Fn(ToolActivity<'_>) + Send + Sync>;

/// Registry, validation, policy and execution of tools.
pub struct Gateway {
    tools: BTreeMap<String, Registered>,
    observer: Option<ToolObserver>,
    policy: Policy,
    hooks: Vec<Arc<dyn Hook>>,
    blobs: Option<Arc<dyn BlobSink>>,
    replay: Option<Arc<crate::replay::ToolReplay>>,
    workspace: Arc<Workspace>,
    concurrency: usize,
    /// Paths resolved by recent checks, for the runs of their calls (see [`Judged`]).
    judged: std::sync::Mutex<std::collections::VecDeque<Judged>>,
}

/// A call's path as a check resolved and judged it, kept for the call's run in this
/// process, so that the call acts on what policy, the hooks and any person asked saw:
///
/// - a regular file that existed is acted on as resolved then, without resolving it again,
///   where the workspace's file operations go through no symlink
///   ([`Workspace::opens_exactly`]): a link made on its path since makes the tool's open
///   fail, and never leads elsewhere;
/// - any other path (a file about to be written, a directory) is resolved again, as what
///   is there may have changed (a group before the call may create it), and the call is
///   refused if it now leads somewhere else than the path that was judged.
#[derive(Debug)]
struct Judged {
    run_id: String,
    call_id: CallId,
    tool: String,
    given: String,
    subject: Subject,
    resolved: Resolved,
}

/// Whether `now` is the place recorded as `then` (a resolution's [`Resolved::display`]).
/// A name that is not UTF-8 is recorded with U+FFFD in place of its bytes, which another
/// name could match: a record holding U+FFFD matches nothing, and the call is refused.
fn same_place(then: &str, now: &Resolved) -> bool {
    !then.contains(char::REPLACEMENT_CHARACTER) && now.display() == then
}

/// Resolutions kept for calls not run yet, at most: a call asked about and never approved
/// leaves one behind, and the oldest goes first (its run then resolves the path again).
const JUDGED_KEPT: usize = 256;

impl std::fmt::Debug for Gateway {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gateway")
            .field("tools", &self.tools.keys().collect::<Vec<_>>())
            .field("workspace", &self.workspace)
            .finish()
    }
}

impl Gateway {
    /// An empty gateway acting in `workspace`.
    pub fn new(workspace: Workspace) -> Gateway {
        Gateway {
            tools: BTreeMap::new(),
            observer: None,
            policy: Policy::default(),
            hooks: Vec::new(),
            blobs: None,
            replay: None,
            workspace: Arc::new(workspace),
            concurrency: DEFAULT_CONCURRENCY,
            judged: Default::default(),
        }
    }

    /// A gateway with every built-in tool registered.
    pub fn with_builtins(workspace: Workspace) -> Result<Gateway, GatewayError> {
        let mut gateway = Gateway::new(workspace);
        for tool in crate::builtin::all() {
            gateway.add(tool, false)?;
        }
        Ok(gateway)
    }

    /// Tells `observer` when each call starts and finishes.
    pub fn with_observer(mut self, observer: ToolObserver) -> Gateway {
        self.observer = Some(observer);
        self
    }

    /// Registers a tool; its schema is compiled once, here.
    pub fn register(&mut self, tool: Arc<dyn Tool>) -> Result<(), GatewayError> {
        self.add(tool, true)
    }

    /// Puts `tool` in place of the registered tool of its name (a built-in tool set up
    /// otherwise, say `Shell::passing`), and returns the tool it replaced. Its schema is
    /// compiled now, unless it is the replaced tool's.
    pub fn replace(&mut self, tool: Arc<dyn Tool>) -> Result<Arc<dyn Tool>, GatewayError> {
        let spec = tool.spec();
        let Some(old) = self.tools.remove(&spec.name) else {
            return Err(GatewayError::UnknownTool(spec.name));
        };
        let same_schema = spec.input_schema == old.spec.input_schema;
        if let Err(e) = self.add(tool, !same_schema) {
            self.tools.insert(spec.name, old);
            return Err(e);
        }
        Ok(old.tool)
    }

    /// Registers a tool, compiling its schema now when `compile_now`.
    fn add(&mut self, tool: Arc<dyn Tool>, compile_now: bool) -> Result<(), GatewayError> {
        let spec = tool.spec();
        if self.tools.contains_key(&spec.name) {
            return Err(GatewayError::DuplicateTool(spec.name));
        }
        if let Err(message) = schema_within_bounds(&spec) {
            return Err(GatewayError::InvalidSchema {
                tool: spec.name,
                message,
            });
        }
        let validator = std::sync::OnceLock::new();
        if compile_now {
            let compiled = compile(&spec).map_err(|message| GatewayError::InvalidSchema {
                tool: spec.name.clone(),
                message,
            })?;
            let _ = validator.set(Ok(compiled));
        }
        self.tools.insert(
            spec.name.clone(),
            Registered {
                tool,
                spec,
                validator,
            },
        );
        Ok(())
    }

    /// Uses `policy` for verdicts.
    pub fn with_policy(mut self, policy: Policy) -> Gateway {
        self.policy = policy;
        self
    }

    /// Adds a hook; hooks run in the order they were added.
    pub fn with_hook(mut self, hook: Arc<dyn Hook>) -> Gateway {
        self.hooks.push(hook);
        self
    }

    /// Keeps whole outputs that are too large for the model in `sink`.
    pub fn with_blob_sink(mut self, sink: Arc<dyn BlobSink>) -> Gateway {
        self.blobs = Some(sink);
        self
    }

    /// Lets `read_result` read stored outputs and logged results back.
    pub fn with_result_source(mut self, source: Arc<dyn ResultSource>) -> Gateway {
        let tool: Arc<dyn Tool> = Arc::new(crate::tool::Typed(crate::builtin::ReadResult(source)));
        // Registering a built-in with its own schema cannot fail; it is compiled at its
        // first call, as the other built-ins are.
        let _ = self.add(tool, false);
        self
    }

    /// Answers every call from a recorded run instead of running it.
    pub fn with_replay(mut self, replay: crate::replay::ToolReplay) -> Gateway {
        self.replay = Some(Arc::new(replay));
        self
    }

    /// Runs at most `n` calls of a group at once.
    pub fn with_concurrency(mut self, n: usize) -> Gateway {
        self.concurrency = n.max(1);
        self
    }

    /// How many calls of a group run at once, at most.
    pub fn concurrency(&self) -> usize {
        self.concurrency
    }

    /// The workspace the tools act in.
    pub fn workspace(&self) -> &Workspace {
        &self.workspace
    }

    /// Every tool's spec, sorted by name.
    pub fn specs(&self) -> Vec<ToolSpec> {
        self.tools.values().map(|r| r.spec.clone()).collect()
    }

    /// Validates each call's arguments against its tool's schema, then asks policy, then
    /// the pre-call hooks (for calls policy did not deny).
    pub async fn check(&self, run_id: &str, calls: &[ToolCall]) -> Vec<(CallId, Verdict)> {
        self.check_judged(run_id, calls).await.verdicts
    }

    /// What [`Gateway::check`] says, and for each call allowed or asked about that acts on
    /// a path, where the path led when it was judged: the machine's `CallsChecked`. Given
    /// back in [`ScheduledCall::path`], it binds the call to that place even when it runs
    /// in another process (after an approval there).
    pub async fn check_judged(&self, run_id: &str, calls: &[ToolCall]) -> Checks {
        let each = calls
            .iter()
            .map(|call| async move { (call.id.clone(), self.check_one(run_id, call).await) });
        let mut checks = Checks::default();
        for (id, (verdict, path)) in join_all(each).await {
            if let Some(path) = path {
                checks.paths.push((id.clone(), path));
            }
            checks.verdicts.push((id, verdict));
        }
        checks
    }

    /// A call's verdict, and for an allowed or asked-about call that acts on a path, where
    /// the path led.
    async fn check_one(&self, run_id: &str, call: &ToolCall) -> (Verdict, Option<String>) {
        let registered = match self.admitted(call) {
            Ok(registered) => registered,
            Err(refused) => return (refused, None),
        };
        let (subject, path) = match self.subject_resolved(&registered.spec, call) {
            Ok(subject) => subject,
            Err(refused) => return (refused, None),
        };
        let concealed = path
            .as_ref()
            .and_then(|(_, resolved)| self.workspace.concealed(resolved));
        let verdict = self
            .judge_subject(run_id, call, registered, &subject, concealed)
            .await;
        let Some((given, resolved)) = path else {
            return (verdict, None);
        };
        if !matches!(verdict, Verdict::Allow | Verdict::Ask { .. }) {
            return (verdict, None);
        }
        let Subject::Path {
            resolved: judged, ..
        } = &subject
        else {
            return (verdict, None);
        };
        let judged = judged.clone();
        self.remember(Judged {
            run_id: run_id.to_owned(),
            call_id: call.id.clone(),
            tool: call.name.clone(),
            given,
            subject,
            resolved,
        });
        (verdict, Some(judged))
    }

    /// The call's tool, if it exists, is available and the arguments fit its schema;
    /// otherwise the verdict that refuses the call.
    fn admitted(&self, call: &ToolCall) -> Result<&Registered, Verdict> {
        let Some(registered) = self.tools.get(&call.name) else {
            return Err(Verdict::Deny {
                reason: format!("no tool is named {:?}", call.name),
            });
        };
        if let Err(why) = registered.tool.available() {
            return Err(Verdict::Unavailable {
                reason: why.to_string(),
            });
        }
        let validator = registered
            .validator()
            .as_ref()
            .map_err(|message| Verdict::Invalid {
                message: format!("the tool's own schema does not compile: {message}"),
            })?;
        let problems: Vec<String> = schema_errors(validator, &call.arguments)
            .map(|(path, message)| format!("{path}: {message}"))
            .collect();
        if !problems.is_empty() {
            return Err(Verdict::Invalid {
                message: problems.join("; "),
            });
        }
        Ok(registered)
    }

    /// Policy's verdict on a call's subject, then the pre-call hooks' (unless policy
    /// denied it). A path in a place the workspace conceals (`concealed`, what it is) is
    /// asked about where policy would let it run by default (see [`Workspace::conceal`]).
    async fn judge_subject(
        &self,
        run_id: &str,
        call: &ToolCall,
        registered: &Registered,
        subject: &Subject,
        concealed: Option<&str>,
    ) -> Verdict {
        let mut verdict = self.policy.judge(&registered.spec, subject);
        if let (Verdict::Allow, Some(what), Subject::Path { resolved, .. }) =
            (&verdict, concealed, subject)
            && !self.policy.allows_by_name(&registered.spec, subject)
        {
            verdict = Verdict::Ask {
                why: format!(
                    "{resolved} holds {what}, which a tool touches only with a person's \
                     approval or an allow rule naming it (`{}({resolved})`)",
                    registered.spec.name
                ),
            };
        }
        if matches!(verdict, Verdict::Deny { .. }) {
            return verdict;
        }
        if !self.hooks.iter().any(|h| h.applies_to(&call.name)) {
            return verdict;
        }
        // Hooks judge the path the tool would touch, and see the spelling too.
        let resolved = match (subject, registered.spec.main_argument.as_deref()) {
            (Subject::Path { resolved, .. }, Some(arg)) => {
                let mut view = call.clone();
                if let Some(map) = view.arguments.as_object_mut() {
                    map.insert(arg.to_owned(), Value::String(resolved.clone()));
                }
                Some(view)
            }
            _ => None,
        };
        let view = HookCall {
            call: resolved.as_ref().unwrap_or(call),
            proposed: call,
        };
        let mut allowed_by_hook = false;
        for hook in self.hooks.iter().filter(|h| h.applies_to(&call.name)) {
            match hook.before(run_id, &view).await {
                HookDecision::NoObjection => {}
                HookDecision::Allow => allowed_by_hook = true,
                HookDecision::Ask(why) => return Verdict::Ask { why },
                HookDecision::Deny(reason) => return Verdict::Deny { reason },
            }
        }
        match verdict {
            Verdict::Ask { .. } if allowed_by_hook => Verdict::Allow,
            other => other,
        }
    }

    /// Keeps a check's resolution for the call's run (see [`Judged`]).
    fn remember(&self, judged: Judged) {
        let mut kept = self.judged.lock().unwrap_or_else(|p| p.into_inner());
        kept.retain(|k| k.run_id != judged.run_id || k.call_id != judged.call_id);
        if kept.len() >= JUDGED_KEPT {
            kept.pop_front();
        }
        kept.push_back(judged);
    }

    /// What a check in this process judged for exactly this call (the same run, call id,
    /// tool and path argument), taken out: a call runs once.
    fn recall(&self, run_id: &str, spec: &ToolSpec, call: &ToolCall) -> Option<Judged> {
        let mut kept = self.judged.lock().unwrap_or_else(|p| p.into_inner());
        let at = kept
            .iter()
            .position(|k| k.run_id == run_id && k.call_id == call.id)?;
        let judged = kept.remove(at)?;
        drop(kept);
        let raw = spec
            .main_argument
            .as_deref()
            .and_then(|arg| call.arguments.get(arg))
            .and_then(Value::as_str)?;
        (judged.tool == call.name && judged.given == raw).then_some(judged)
    }

    /// The resolution a call's tool acts on, judged by policy once more (in case it
    /// changed), or the reason the call is refused. See [`Judged`] for a path a check in
    /// this process judged. Any other is resolved now, and refused if it leads elsewhere
    /// than `judged_path` (where it led when a check in another process judged it, before
    /// an approval there) or if policy denies where it leads now.
    fn resolution_to_act_on(
        &self,
        run_id: &str,
        spec: &ToolSpec,
        call: &ToolCall,
        judged_path: Option<&str>,
    ) -> Result<Option<(String, Resolved)>, String> {
        let judged = match self.recall(run_id, spec, call) {
            Some(judged)
                if matches!(judged.resolved.seen(), Some(Seen::File { .. }))
                    && self.workspace.opens_exactly() =>
            {
                if let Verdict::Deny { reason } = self.policy.judge(spec, &judged.subject) {
                    return Err(reason);
                }
                return Ok(Some((judged.given, judged.resolved)));
            }
            other => other,
        };
        match self.subject_resolved(spec, call) {
            Err(Verdict::Deny { reason }) => Err(reason),
            Ok((subject @ Subject::Path { .. }, path)) => {
                if let Some((given, now)) = &path {
                    // This process's own check is exact; the record is for a check elsewhere.
                    let then = match (&judged, judged_path) {
                        (Some(judged), _) => {
                            (now.rel() != judged.resolved.rel()).then(|| judged.resolved.display())
                        }
                        (None, Some(then)) => (!same_place(then, now)).then(|| then.to_owned()),
                        (None, None) => None,
                    };
                    if let Some(then) = then {
                        return Err(format!(
                            "{given:?} now leads to {}, not to {then} as when the call was \
                             checked: the workspace changed in between; call it again to have \
                             it checked anew",
                            now.display(),
                        ));
                    }
                }
                if let Verdict::Deny { reason } = self.policy.judge(spec, &subject) {
                    return Err(reason);
                }
                Ok(path)
            }
            Ok(_) | Err(_) => Ok(None),
        }
    }

    /// What the call's main argument means: a path resolved in the workspace (an escape is
    /// refused here, as a denial), a command line analysed, or text; and for a path the
    /// argument as given and its resolution.
    fn subject_resolved(
        &self,
        spec: &ToolSpec,
        call: &ToolCall,
    ) -> Result<(Subject, Option<(String, Resolved)>), Verdict> {
        match Subject::of(spec, call) {
            Subject::Path { given, .. } => {
                let raw = spec
                    .main_argument
                    .as_deref()
                    .and_then(|arg| call.arguments.get(arg))
                    .and_then(Value::as_str)
                    .unwrap_or_default();
                let resolved = match self.workspace.resolve(raw) {
                    Ok(resolved) => resolved,
                    Err(e) => return Err(Verdict::Deny { reason: e.message }),
                };
                if spec.risk != Risk::Read
                    && let Some(what) = self.workspace.protected(&resolved)
                {
                    return Err(Verdict::Deny {
                        reason: format!(
                            "{raw:?} is in {what} ({}), which no tool may change",
                            resolved.display()
                        ),
                    });
                }
                Ok((
                    Subject::Path {
                        resolved: resolved.display(),
                        given,
                    },
                    Some((raw.to_owned(), resolved)),
                ))
            }
            other => Ok((other, None)),
        }
    }

    /// Runs the groups one after another, the calls of a group concurrently (at most
    /// [`DEFAULT_CONCURRENCY`] at once). Every started call gets exactly one result; once
    /// `cancel` fires, no new group starts and running calls end as `cancelled`.
    pub async fn execute(
        &self,
        run_id: &str,
        groups: Vec<Vec<ScheduledCall>>,
        cancel: &CancellationToken,
    ) -> Vec<ToolResult> {
        let limit = Arc::new(Semaphore::new(self.concurrency.max(1)));
        let mut results = Vec::new();
        for group in groups {
            if cancel.is_cancelled() {
                break;
            }
            let runs = group.into_iter().map(|scheduled| {
                let span = tool_span(&scheduled.call);
                let inside = span.clone();
                let run = self.run_one(run_id, scheduled, cancel, Arc::clone(&limit));
                async move {
                    let result = run.await;
                    if let Some(kind) = result.error_kind() {
                        inside.record("error.type", kind.as_str());
                    }
                    result
                }
                .instrument(span)
            });
            results.extend(join_all(runs).await);
        }
        results
    }

    /// After a crash: asks each call's tool whether its effect took place.
    pub async fn reconcile(
        &self,
        calls: &[ScheduledCall],
    ) -> Vec<(CallId, Option<agent_core::Finding>)> {
        let looks = calls.iter().map(|scheduled| async move {
            let finding = match self.tools.get(&scheduled.call.name) {
                Some(registered) => {
                    let ctx = ToolContext {
                        workspace: Arc::clone(&self.workspace),
                        cancel: CancellationToken::new(),
                        run_id: String::new(),
                        call_id: scheduled.call.id.clone(),
                        effect_key: scheduled.effect_key.clone(),
                        resolved: None,
                    };
                    registered
                        .tool
                        .reconcile(&scheduled.call.arguments, &ctx)
                        .await
                }
                None => None,
            };
            (scheduled.call.id.clone(), finding)
        });
        join_all(looks).await
    }

    async fn run_one(
        &self,
        run_id: &str,
        scheduled: ScheduledCall,
        cancel: &CancellationToken,
        limit: Arc<Semaphore>,
    ) -> ToolResult {
        let ScheduledCall {
            call,
            effect_key,
            path: judged_path,
            ..
        } = scheduled;
        let fail = |kind: ErrorKind, message: String| {
            ToolResult::error(
                call.id.clone(),
                call.name.clone(),
                ToolError::new(kind, message),
            )
        };
        if let Some(replay) = &self.replay {
            // Nothing runs: the recorded run answers.
            return replay.answer(&call);
        }
        let Some(registered) = self.tools.get(&call.name) else {
            return fail(
                ErrorKind::UnknownTool,
                format!("no tool is named {:?}", call.name),
            );
        };
        let Ok(_permit) = limit.acquire_owned().await else {
            return fail(ErrorKind::ExecutionFailed, "the executor shut down".into());
        };
        // The tree may have changed since the check (or the check ran in another process,
        // before an approval, or waited for a permit): see `resolution_to_act_on`.
        let judged_path = judged_path.as_deref();
        let resolved = match self.resolution_to_act_on(run_id, &registered.spec, &call, judged_path)
        {
            Ok(resolved) => resolved,
            Err(reason) => return fail(ErrorKind::Denied, reason),
        };
        let ctx = ToolContext {
            workspace: Arc::clone(&self.workspace),
            cancel: cancel.child_token(),
            run_id: run_id.to_owned(),
            call_id: call.id.clone(),
            effect_key,
            resolved,
        };
        let stop = ctx.cancel.clone();
        let started = std::time::Instant::now();
        if let Some(observe) = &self.observer {
            observe(ToolActivity::Started { call: &call });
        }
        let tool = Arc::clone(&registered.tool);
        let arguments = call.arguments.clone();
        let call_future = async move { tool.call(arguments, &ctx).await };
        // A panicking tool is a failed call, not a crashed run. On a current-thread runtime
        // the call runs inside this future and its panic is caught here: a task of its own
        // would run on this same thread, after a round trip through the scheduler.
        // Elsewhere it gets a task of its own, which another worker may run.
        let mut running: Running = if on_current_thread() {
            Box::pin(
                AssertUnwindSafe(call_future)
                    .catch_unwind()
                    .map(|caught| caught.map_err(|panic| panic_text(panic.as_ref()))),
            )
        } else {
            let task = tokio_util::task::AbortOnDropHandle::new(tokio::spawn(call_future));
            Box::pin(task.map(|joined| joined.map_err(panic_message)))
        };
        let timeout = Duration::from_millis(registered.spec.timeout_ms);
        let limit = registered.spec.result_limit;
        let answered = |joined: Result<Result<String, ToolError>, String>| match joined {
            Ok(Ok(output)) => ToolResult::ok(
                call.id.clone(),
                call.name.clone(),
                self.shape_output(output, limit),
            ),
            Ok(Err(mut error)) => {
                error.message = head_tail(&error.message, limit);
                ToolResult::error(call.id.clone(), call.name.clone(), error)
            }
            Err(panicked) => fail(ErrorKind::ExecutionFailed, panicked),
        };
        // A call done at its first poll (a small file read in place) has nothing left to
        // time out or cancel: it needs no timer, whose registration can wake the runtime's
        // driver (a system call).
        let mut result = if let Poll::Ready(joined) = futures::poll!(running.as_mut()) {
            answered(joined)
        } else {
            // A call with an effect, stopped halfway, may have acted: in part (a command
            // killed midway), or in whole later (an edit on the blocking pool, which cannot
            // be stopped, or an MCP server's call, which runs in the server). Unless it is
            // idempotent, trying it again blindly could do it twice.
            let may_have_acted = registered.spec.risk != Risk::Read && !registered.spec.idempotent;
            let stopped = |kind: ErrorKind, what: String| {
                if !may_have_acted {
                    return fail(kind, what);
                }
                let mut error = ToolError::new(
                    kind,
                    format!(
                        "{what}; it was stopped, but it may have acted, in part or in whole (a \
                         tool that runs elsewhere, such as an MCP server, may still finish \
                         it): check its effect before calling it again"
                    ),
                );
                error.retryable = false;
                ToolResult::error(call.id.clone(), call.name.clone(), error)
            };
            tokio::select! {
                joined = &mut running => answered(joined),
                () = tokio::time::sleep(timeout) => {
                    stop.cancel();
                    stopped(
                        ErrorKind::Timeout,
                        format!("{} did not finish within {} ms", call.name, timeout.as_millis()),
                    )
                }
                () = cancel.cancelled() => {
                    stop.cancel();
                    stopped(ErrorKind::Cancelled, "the run was cancelled while the call ran".into())
                }
            }
        };
        // A call that timed out or was cancelled stops here (its task is aborted), before
        // the hooks look at its result.
        drop(running);
        for hook in self.hooks.iter().filter(|h| h.applies_to(&call.name)) {
            if let Some(note) = hook.after(run_id, &call, &result).await {
                annotate(&mut result, &hook.name(), &note);
            }
        }
        if let Some(observe) = &self.observer {
            observe(ToolActivity::Finished {
                result: &result,
                elapsed: started.elapsed(),
            });
        }
        result
    }

    /// An output over `limit` characters is stored whole in the blob sink and shown as its
    /// first 2,000 bytes and the handle (CONTRACT §9). Without a sink it is cut to `limit`.
    fn shape_output(&self, output: String, limit: usize) -> String {
        let total = output.chars().count();
        if total <= limit {
            return output;
        }
        match self.blobs.as_ref().map(|b| b.put(&output)) {
            Some(Ok(handle)) => {
                let mut end = PREVIEW_BYTES.min(limit).min(output.len());
                while !output.is_char_boundary(end) {
                    end -= 1;
                }
                // Pointing to read_result only when the model can call it.
                let how = if self.tools.contains_key("read_result") {
                    "; read the rest with read_result"
                } else {
                    ""
                };
                format!(
                    "[output of {total} characters stored as {handle}; its first {end} bytes \
                     follow{how}]\n{}",
                    &output[..end]
                )
            }
            failed => {
                let why = match failed {
                    Some(Err(e)) => format!("; storing the whole output failed: {e}"),
                    _ => String::new(),
                };
                let head: String = output.chars().take(limit).collect();
                format!(
                    "[output cut: the first {limit} of {total} characters are shown{why}]\n{head}"
                )
            }
        }
    }
}

fn annotate(result: &mut ToolResult, hook: &str, note: &str) {
    let line = format!("\n[note from hook {hook}: {note}]");
    match &mut result.outcome {
        agent_core::ToolOutcome::Output(text) => text.push_str(&line),
        agent_core::ToolOutcome::Error(error) => error.message.push_str(&line),
    }
}

/// A tool call running: its output or error, or what its panic said.
type Running = std::pin::Pin<
    Box<dyn std::future::Future<Output = Result<Result<String, ToolError>, String>> + Send>,
>;

/// Whether the task runs on a current-thread runtime.
fn on_current_thread() -> bool {
    tokio::runtime::Handle::try_current().is_ok_and(|runtime| {
        runtime.runtime_flavor() == tokio::runtime::RuntimeFlavor::CurrentThread
    })
}

fn panic_message(join: tokio::task::JoinError) -> String {
    if join.is_cancelled() {
        return "the call was aborted".to_owned();
    }
    panic_text(join.into_panic().as_ref())
}

fn panic_text(payload: &(dyn std::any::Any + Send)) -> String {
    let text = payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "no message".to_owned());
    format!("the tool panicked: {text}")
}

/// The span of one tool call, as the OpenTelemetry GenAI conventions name it: its
/// arguments are not recorded (they may hold what the conventions leave to an opt-in).
fn tool_span(call: &agent_core::ToolCall) -> tracing::Span {
    tracing::info_span!(
        "execute_tool",
        otel.name = format!("execute_tool {}", call.name),
        otel.kind = "internal",
        gen_ai.operation.name = "execute_tool",
        gen_ai.tool.name = call.name.as_str(),
        gen_ai.tool.call.id = call.id.as_str(),
        error.type = tracing::field::Empty,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Built-in tools' schemas are compiled at their first call, not at registration: each
    /// of them compiles, and one left uncalled stays uncompiled.
    #[tokio::test]
    async fn builtin_schemas_compile_when_first_needed() {
        for tool in crate::builtin::all() {
            let spec = tool.spec();
            assert!(
                compile(&spec).is_ok(),
                "{}: {:?}",
                spec.name,
                compile(&spec).err()
            );
        }
        let dir = tempfile::tempdir().unwrap();
        let gateway = Gateway::with_builtins(Workspace::new(dir.path()).unwrap()).unwrap();
        assert!(gateway.tools.values().all(|t| t.validator.get().is_none()));
        let call = ToolCall::new("c1", "read_file", serde_json::json!({"path": 3}));
        let checked = gateway.check("r", &[call]).await;
        assert!(
            matches!(&checked[0].1, Verdict::Invalid { message } if message.contains("/path")),
            "{checked:?}"
        );
        assert!(gateway.tools["read_file"].validator.get().is_some());
        assert!(gateway.tools["write_file"].validator.get().is_none());
    }

    /// A tool named as another but whose schema does not compile, or named as none.
    struct Odd<const KNOWN: bool>;

    #[async_trait::async_trait]
    impl<const KNOWN: bool> crate::tool::TypedTool for Odd<KNOWN> {
        type Args = Value;
        const NAME: &'static str = if KNOWN { "read_file" } else { "not_there" };
        const RISK: Risk = Risk::Read;
        fn description(&self) -> String {
            "odd".to_owned()
        }
        fn customize(&self, mut spec: ToolSpec) -> ToolSpec {
            spec.input_schema = serde_json::json!({"type": 12});
            spec
        }
        async fn run(&self, _: Value, _: &ToolContext) -> Result<String, ToolError> {
            Ok(String::new())
        }
    }

    /// A registered tool is replaced by one of its name, and only then; one that cannot
    /// be registered leaves the tool it would replace in place.
    #[test]
    fn a_tool_is_replaced_by_one_of_its_name_that_registers() {
        use crate::tool::Typed;
        let dir = tempfile::tempdir().unwrap();
        let mut gateway = Gateway::with_builtins(Workspace::new(dir.path()).unwrap()).unwrap();
        let count = gateway.tools.len();
        let unknown = gateway.replace(Arc::new(Typed(Odd::<false>)));
        assert!(
            matches!(&unknown, Err(GatewayError::UnknownTool(name)) if name == "not_there"),
            "{:?}",
            unknown.err()
        );
        let invalid = gateway.replace(Arc::new(Typed(Odd::<true>)));
        assert!(
            matches!(&invalid, Err(GatewayError::InvalidSchema { tool, .. }) if tool == "read_file"),
            "{:?}",
            invalid.err()
        );
        assert_ne!(gateway.tools["read_file"].spec.description, "odd");
        assert_eq!(gateway.tools.len(), count);
        // The same schema: nothing compiled before the first call.
        let old = gateway
            .replace(Arc::new(Typed(crate::builtin::ReadFile)))
            .unwrap();
        assert_eq!(old.spec().name, "read_file");
        assert!(gateway.tools["read_file"].validator.get().is_none());
        assert_eq!(gateway.tools.len(), count);
    }
}
