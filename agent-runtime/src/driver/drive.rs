//! The drive loop: each command of the machine carried out (model calls, checks, tools,
//! commits, waits), each answer handed back, until the run ends or pauses.

use std::sync::Arc;
use std::time::Duration;

use agent_context::{Projector, Summarized};
use agent_core::{
    CallId, Command, Entry, Input, InputError, Machine, ScheduledCall, ToolCall, Usage, Verdict,
};
use agent_providers::{ModelRequest, SpendLimit};
use agent_tools::Checks;
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;

use super::{Report, Runtime, RuntimeError, report};

/// The name the spans give the agent (`gen_ai.agent.name`).
const AGENT_NAME: &str = "agent-loop";

impl Runtime {
    /// Drives the run in an `invoke_agent` span (OpenTelemetry GenAI conventions), under
    /// which each model call is a `chat` span and each tool call an `execute_tool` span.
    pub(super) async fn drive(
        &self,
        run_id: String,
        machine: Machine,
        log: Vec<Entry>,
        cancel: CancellationToken,
    ) -> Result<Report, RuntimeError> {
        self.drive_noted(run_id, machine, log, cancel, Vec::new())
            .await
    }

    /// [`Runtime::drive`], with a person's `notes` read before the run's next model call.
    pub(super) async fn drive_noted(
        &self,
        run_id: String,
        machine: Machine,
        log: Vec<Entry>,
        cancel: CancellationToken,
        notes: Vec<String>,
    ) -> Result<Report, RuntimeError> {
        let span = tracing::info_span!(
            "invoke_agent",
            otel.name = format!("invoke_agent {AGENT_NAME}"),
            otel.kind = "internal",
            gen_ai.operation.name = "invoke_agent",
            gen_ai.agent.name = AGENT_NAME,
            gen_ai.conversation.id = run_id.as_str(),
            gen_ai.provider.name = self.model.provider(),
            gen_ai.request.model = self.model.model(),
            agent.terminal_reason = tracing::field::Empty,
        );
        let inside = span.clone();
        // A person may ask from elsewhere that the run stop (`agent cancel`): as a Ctrl-C
        // here would, no new action starts after that.
        let cancel = cancel.child_token();
        let inbox = Inbox::default();
        let _watch = self.watch_stop_requests(&run_id, &cancel, &inbox).await;
        inbox.extend(notes);
        async move {
            let report = match self
                .drive_in_span(run_id, machine, log, cancel, &inbox)
                .await
            {
                Ok(report) => {
                    // A sub-agent driven to its end by its own id, not by its parent.
                    if self.parent.is_none()
                        && report.outcome.reason.class() != agent_core::ReasonClass::Paused
                    {
                        self.release_parent(&report.run_id).await;
                    }
                    Ok(self.surface_children(report).await)
                }
                Err(e) => Err(e),
            };
            match &report {
                Ok(report) => {
                    inside.record("agent.terminal_reason", report.outcome.reason.as_str());
                    tracing::info!(
                        run_id = report.run_id.as_str(),
                        reason = report.outcome.reason.as_str(),
                        steps = report.state.steps,
                        tool_calls = report.state.tool_calls,
                        "the run stopped driving"
                    );
                }
                Err(e @ RuntimeError::LetGo { .. }) => {
                    tracing::info!(error = %e, "the run was let go")
                }
                Err(e) => tracing::warn!(error = %e, "the run could not be driven"),
            }
            report
        }
        .instrument(span)
        .await
    }

    async fn drive_in_span(
        &self,
        run_id: String,
        mut machine: Machine,
        log: Vec<Entry>,
        cancel: CancellationToken,
        inbox: &Inbox,
    ) -> Result<Report, RuntimeError> {
        // The projection holds what the next prompt needs; the log itself stays in the
        // store (read again only to summarize it), so memory does not grow with the run.
        let mut projector = self.projector(&log);
        drop(log);
        // Whether the next call's least use is worth knowing: a budget checks it.
        let budgets_spend = {
            let budget = machine.budget();
            budget.max_tokens.is_some() || budget.max_cost_usd.is_some()
        };
        // The provider's counts in the log are a floor of this invocation's prompts only
        // when they were of prompts made as it makes them (a run continued with another
        // model, system text or tools, or a fork, whose log began with another run's
        // counts, has none until its own first call).
        if budgets_spend && self.prompts_as(machine.state().manifest.as_ref()) {
            // A run continued in this invocation may ask for a call before any commit:
            // checked all the same.
            machine.recheck_next_call(self.least_next_call(&machine, &projector));
        } else {
            projector.forget_lower_bound();
        }
        // The name of every model call's span, made once.
        let chat_name = format!("chat {}", self.model.model());
        // The provider refused the last call's prompt as longer than the model's window, and
        // a compaction was made for it: one refused again fails the run.
        let mut compacted_for_overflow = false;
        // What the prompts of this run begin as: those of the run it was forked from, if
        // it was (its first prompt is one the parent sent).
        let cache_key = machine
            .state()
            .manifest
            .as_ref()
            .and_then(|m| m.forked_from.as_ref())
            .map_or_else(|| run_id.clone(), |origin| origin.run_id.clone());
        // A sub-agent was let go with its call in flight: once what came is committed, so
        // is this run.
        let mut letting_go = false;
        loop {
            let next = machine.poll_command();
            if letting_go && !matches!(next, Some(Command::Commit { .. })) {
                return Err(RuntimeError::LetGo { run_id });
            }
            let Some(command) = next else {
                // The machine always queues a command unless it waits for a person.
                let outcome = machine.outcome().ok_or(InputError::Unexpected {
                    input: "nothing",
                    phase: "a phase with no command",
                })?;
                return Ok(report(&run_id, machine, outcome));
            };
            // Let go where nothing is in flight: before the model is asked again, all the
            // run did is committed (a reply's decision is committed with its calls' checks
            // and dispatch, so the run cannot stop between them).
            if matches!(command, Command::CallModel { .. }) && self.lets_go() {
                return Err(RuntimeError::LetGo { run_id });
            }
            // A person's note sent meanwhile is committed first, one at a time: the model
            // reads it in this call's prompt. Looked for in a store that carries notes,
            // once those handed out before are committed (a store may count on that).
            if matches!(command, Command::CallModel { .. }) && inbox.is_open() && inbox.is_empty() {
                let id = run_id.clone();
                let notes = self.store_work(move |store| store.told(&id)).await?;
                if !notes.is_empty() {
                    // Test point: the process dies with notes handed to it, before a
                    // commit holds them.
                    fail::fail_point!("notes_taken", |_| std::process::abort());
                }
                inbox.extend(notes);
            }
            if matches!(command, Command::CallModel { .. })
                && let Some(text) = inbox.next()
            {
                let text = self.redactor.redact_str(&text);
                machine.handle(Input::UserNote { text })?;
                continue;
            }
            match command {
                Command::CallModel { .. } => {
                    if projector.should_compact() {
                        self.compact(
                            &run_id,
                            &mut machine,
                            &mut projector,
                            budgets_spend,
                            &cancel,
                            None,
                        )
                        .await?;
                        continue;
                    }
                    let prompt = projector.prompt();
                    let step = machine.state().steps;
                    let (cap, limit) = if budgets_spend {
                        self.call_limits(&machine, &projector)
                    } else {
                        (None, None)
                    };
                    let request = ModelRequest::new(prompt, step)
                        .with_max_output_tokens(cap)
                        .with_spend_limit(limit)
                        .with_cache_key(Some(&cache_key));
                    let chat = self.chat_span(&chat_name);
                    if let Some(cap) = cap {
                        chat.record("gen_ai.request.max_tokens", cap);
                    }
                    let answer = tokio::select! {
                        answer = self.model.decide(request).instrument(chat.clone()) => Some(answer),
                        () = cancel.cancelled() => None,
                        () = self.deadline(&machine) => None,
                    };
                    record_chat(&chat, answer.as_ref());
                    if answer.is_some() {
                        // Recorded at the time it came, and judged with it: a reply that
                        // came as the wall-clock budget ran out is kept.
                        machine.observe_time(self.clock.now_ms());
                    } else {
                        self.tick(&mut machine)?;
                    }
                    match answer {
                        Some(Ok(mut reply)) => {
                            compacted_for_overflow = false;
                            // The machine only ever holds what the log may hold: secret
                            // values in calls become references, expanded again to run.
                            self.redactor.redact_reply(&mut reply);
                            machine.handle(Input::ModelReplied(reply))?
                        }
                        // The prompt is longer than the model's window, which was taken to
                        // be larger (a server that loads the model with less than it could
                        // hold, a model the defaults do not know, a tokenizer that counts
                        // more than ours): the window is at most what the provider said, and
                        // at most the prompt as counted here; the prompt is compacted to it
                        // and the model asked again, once. (A refusal after retries that may
                        // have cost something is recorded as a failure, with them.)
                        Some(Err(e))
                            if !compacted_for_overflow
                                && e.retries().is_empty()
                                && e.spent().is_zero()
                                && let Some(overflow) = e.context_overflow() =>
                        {
                            compacted_for_overflow = true;
                            let said = overflow
                                .window
                                .map_or(usize::MAX, |w| usize::try_from(w).unwrap_or(usize::MAX));
                            projector.window_at_most(said.min(projector.tokens()));
                            let window = projector.config().context_window;
                            tracing::info!(
                                window,
                                "the prompt is longer than the model's window: compacted to it"
                            );
                            self.compact(
                                &run_id,
                                &mut machine,
                                &mut projector,
                                budgets_spend,
                                &cancel,
                                u64::try_from(window).ok(),
                            )
                            .await?;
                        }
                        Some(Err(e)) => {
                            let mut retries = e.retries().to_vec();
                            for retry in &mut retries {
                                retry.reason = self.redactor.redact_str(&retry.reason);
                            }
                            machine.handle(Input::ModelFailed {
                                message: self.redactor.redact_str(&e.to_string()),
                                kind: e.kind(),
                                retries,
                                usage: e.spent(),
                                by_budget: e.stopped_by_budget(),
                            })?
                        }
                        None if cancel.is_cancelled() => machine.handle(Input::Cancel)?,
                        // The deadline passed: the tick above already stopped the run.
                        None => {}
                    }
                }
                Command::CheckAnswer { answer, .. } => {
                    let judged = tokio::select! {
                        rejection = self.check_answer(&run_id, &machine, &answer) => Some(rejection),
                        () = cancel.cancelled() => None,
                    };
                    match judged {
                        Some(rejection) => {
                            // An answer that passed its checks completes the run, however
                            // long they took; one that failed goes back to the model, if
                            // the budget allows.
                            machine.observe_time(self.clock.now_ms());
                            machine.handle(Input::AnswerChecked {
                                rejection: rejection.map(|r| self.redactor.redact_str(&r)),
                            })?;
                        }
                        None => {
                            self.tick(&mut machine)?;
                            machine.handle(Input::Cancel)?;
                        }
                    }
                }
                Command::CheckCalls { calls, turn } => {
                    let checks = tokio::select! {
                        checks = self.check(&run_id, turn, &calls) => Some(checks),
                        () = cancel.cancelled() => None,
                    };
                    let Some(Checks { verdicts, paths }) = checks else {
                        machine.handle(Input::Cancel)?;
                        continue;
                    };
                    machine.handle(Input::CallsChecked { verdicts, paths })?;
                }
                Command::ExecuteTools { group, turn } => {
                    if group.iter().any(|c| c.effect_key.is_some()) {
                        // Crash point: the dispatch record is durable, the effect not done.
                        fail::fail_point!("after_dispatch", |_| std::process::abort());
                    }
                    // Sub-agent calls are child runs this runtime drives; the gateway runs
                    // the others, at the same time.
                    let (agents, tools): (Vec<_>, Vec<_>) = group
                        .into_iter()
                        .partition(|c| Runtime::is_sub_agent_call(&c.call));
                    let (results, finished, let_go) = if agents.is_empty() {
                        (
                            self.execute(&run_id, &machine, tools, &cancel).await,
                            Vec::new(),
                            false,
                        )
                    } else {
                        let children =
                            self.run_sub_agents(&run_id, turn, &machine, agents, &cancel);
                        let others = async {
                            if tools.is_empty() {
                                Vec::new()
                            } else {
                                self.execute(&run_id, &machine, tools, &cancel).await
                            }
                        };
                        let ((mut results, finished, let_go), others) =
                            tokio::join!(children, others);
                        results.extend(others);
                        (results, finished, let_go)
                    };
                    // Crash point: the tools ran, their results are not committed.
                    fail::fail_point!("after_tools", |_| std::process::abort());
                    let results = results
                        .into_iter()
                        .map(|mut r| {
                            self.redactor.redact_result(&mut r);
                            r
                        })
                        .collect::<Vec<_>>();
                    if cancel.is_cancelled() && !let_go {
                        machine.handle(Input::Cancel)?;
                    }
                    self.tick(&mut machine)?;
                    if !finished.is_empty() {
                        machine.handle(Input::SubAgentsFinished { finished })?;
                    }
                    if let_go {
                        letting_go = true;
                        machine.handle(Input::ToolsLetGo { results })?;
                    } else {
                        machine.handle(Input::ToolsFinished { results })?;
                    }
                }
                Command::Commit {
                    expected_version,
                    entries,
                } => {
                    // Test point: the process dies before this commit is sent.
                    fail::fail_point!("before_commit", |_| std::process::abort());
                    let id = run_id.clone();
                    // Two a turn: at debug level, so that `RUST_LOG=info` does not pay for
                    // them.
                    let commit = tracing::debug_span!(
                        "commit",
                        agent.expected_version = expected_version,
                        agent.entries = entries.len(),
                    );
                    let (entries, encoded) =
                        commit.in_scope(|| self.redactor.redact_entries_encoded(entries));
                    let (entries, result) = self
                        .store_work(move |store| {
                            // Test point: the store refuses this commit (disk full, say).
                            fail::fail_point!("commit_refused", |_| {
                                let refused = agent_store::StoreError::Engine(
                                    "the disk is full (injected)".to_owned(),
                                );
                                (entries.clone(), Err(refused))
                            });
                            let result =
                                store.append_encoded(&id, expected_version, &entries, &encoded);
                            (entries, result)
                        })
                        .instrument(commit)
                        .await?;
                    match result {
                        Ok(version) => {
                            if let Some(sink) = &self.sink {
                                entries.iter().for_each(|e| sink(e));
                            }
                            projector.apply_all(&entries);
                            if budgets_spend {
                                // Checked before the call it limits: one whose prompt alone
                                // passes a budget is not made.
                                machine
                                    .observe_next_call(self.least_next_call(&machine, &projector));
                            }
                            machine.handle(Input::Committed { version })?;
                        }
                        // Another process wrote to the run since this one read it: an
                        // `agent cancel` from elsewhere, or a process that took the run up.
                        // (A first commit that meets a run already there is refused as is.)
                        Err(agent_store::StoreError::Conflict {
                            expected, actual, ..
                        }) if expected > 0 => {
                            if let Some(report) = self.ended_elsewhere(&run_id).await {
                                return Ok(report);
                            }
                            machine.handle(Input::CommitFailed {
                                message: format!(
                                    "another process wrote to the run meanwhile (its log is at \
                                     version {actual}, this process expected {expected}) and \
                                     drives it now; this process wrote nothing more"
                                ),
                            })?;
                        }
                        Err(e) => machine.handle(Input::CommitFailed {
                            message: e.to_string(),
                        })?,
                    }
                }
                Command::ReconcileEffects { calls, .. } => {
                    let findings = self.reconcile(calls).await;
                    machine.handle(Input::EffectsReconciled { findings })?;
                }
                Command::AwaitApproval { .. } | Command::AwaitResolution { .. } => {
                    // No person is attached to this invocation: pause; `agent approve`
                    // continues later from the committed log.
                    let outcome = machine.outcome().ok_or(InputError::Unexpected {
                        input: "AwaitApproval or AwaitResolution",
                        phase: "not paused",
                    })?;
                    return Ok(report(&run_id, machine, outcome));
                }
                Command::Finish(outcome) => return Ok(report(&run_id, machine, outcome)),
            }
        }
    }

    /// The run as it stands when another process ended it while this one drove it (an
    /// `agent cancel` from another machine): that end is this invocation's. `None` when the
    /// run goes on, or its log cannot be read.
    async fn ended_elsewhere(&self, run_id: &str) -> Option<Report> {
        let report = self.standing(run_id).await.ok().flatten()?;
        matches!(report.state.status, agent_core::Status::Ended(_)).then_some(report)
    }

    /// Judges a final answer by the validators the run recorded at its start; validators
    /// that cannot be built reject it (fail closed), saying why.
    async fn check_answer(&self, run_id: &str, machine: &Machine, answer: &str) -> Option<String> {
        let spec = machine.state().manifest.as_ref()?.answer.as_ref()?;
        let span = tracing::info_span!("check_answer", agent.checks = spec.checks.len());
        let checker = match agent_tools::AnswerChecker::new(spec, &self.check_dir) {
            Ok(checker) => {
                let checker = checker
                    .with_timeout(self.check_timeout)
                    .passing(self.check_passing.iter().cloned());
                match &self.sandbox {
                    Some(sandbox) => {
                        checker.sandboxed(sandbox.clone(), self.gateway.workspace().clone())
                    }
                    None => checker,
                }
            }
            Err(e) => return Some(format!("the answer cannot be validated: {e}")),
        };
        checker.check(run_id, answer).instrument(span).await
    }

    /// Checks the calls as the model proposed them (secret references expanded); a call
    /// whose secret this process does not have is refused, with the reason.
    pub(super) async fn check(&self, run_id: &str, turn: u32, calls: &[ToolCall]) -> Checks {
        let mut expanded = Vec::new();
        let mut missing = Vec::new();
        // Calls without references are checked as they are, not copied.
        let as_proposed = if calls.iter().all(|call| call.secrets.is_empty()) {
            calls
        } else {
            for call in calls {
                match self.redactor.expand_call(call) {
                    Ok(call) => expanded.push(call),
                    Err(e) => missing.push((call.id.clone(), e.to_string())),
                }
            }
            &expanded
        };
        let Checks {
            verdicts: mut checked,
            mut paths,
        } = self.gateway.check_judged(run_id, as_proposed).await;
        checked.extend(
            missing
                .into_iter()
                .map(|(id, reason)| (id, Verdict::Deny { reason })),
        );
        if self.asks_denied {
            for (_, verdict) in &mut checked {
                if let Verdict::Ask { why } = verdict {
                    *verdict = Verdict::Deny {
                        reason: format!(
                            "a reading sub-agent cannot wait for a person, and this call would \
                             ask one ({why}); do without it, or say in your answer what it \
                             would take"
                        ),
                    };
                }
            }
        }
        // A sub-agent already started (the run is taken up after a crash, or after it was
        // let go) is continued, not asked about again: it was allowed when it started. A
        // rule that now denies it still does.
        for (call_id, verdict) in &mut checked {
            if let Verdict::Ask { .. } = verdict
                && let Some(call) = calls.iter().find(|c| c.id == *call_id)
                && Runtime::is_sub_agent_call(call)
                && self
                    .started(&agent_core::sub_agent_run_id(run_id, turn, call_id))
                    .await
            {
                *verdict = Verdict::Allow;
            }
        }
        // Hooks saw the real values; what they say goes to the log.
        let redact = |text: &mut String| *text = self.redactor.redact_str(text);
        for (_, verdict) in &mut checked {
            match verdict {
                Verdict::Ask { why } => redact(why),
                Verdict::Deny { reason } => redact(reason),
                Verdict::Invalid { message } => redact(message),
                Verdict::Unavailable { reason } => redact(reason),
                Verdict::Allow => {}
            }
        }
        // A path that holds a secret's value is kept with a reference in its place, as the
        // call's arguments are, and expanded again to run the call (`expand_scheduled`).
        // One the call spells as it is, with no secret in it, holds none. The paths come
        // in the calls' order.
        let mut proposed = calls.iter();
        for (id, path) in &mut paths {
            let spelled = proposed.find(|c| c.id == *id).is_some_and(|c| {
                c.secrets.is_empty()
                    && c.arguments
                        .as_object()
                        .is_some_and(|args| args.values().any(|v| v.as_str() == Some(path)))
            });
            if !spelled {
                *path = self.redactor.reference_str(path);
            }
        }
        // In the model's order.
        let verdicts = calls
            .iter()
            .filter_map(|c| {
                let at = checked.iter().position(|(id, _)| *id == c.id)?;
                Some(checked.swap_remove(at))
            })
            .collect();
        Checks { verdicts, paths }
    }

    /// The calls as proposed (secret references expanded), and those whose secret this
    /// process does not have.
    pub(super) fn expand_scheduled(
        &self,
        calls: Vec<ScheduledCall>,
    ) -> (
        Vec<ScheduledCall>,
        Vec<(ToolCall, crate::redact::MissingSecret)>,
    ) {
        let mut expanded = Vec::new();
        let mut missing = Vec::new();
        for mut scheduled in calls {
            if let Some(path) = &mut scheduled.path
                && let std::borrow::Cow::Owned(expanded) = self.redactor.expand_str(path)
            {
                *path = expanded;
            }
            // A call without references is run as it is, not copied.
            if scheduled.call.secrets.is_empty() {
                expanded.push(scheduled);
                continue;
            }
            match self.redactor.expand_call(&scheduled.call) {
                Ok(call) => {
                    scheduled.call = call;
                    expanded.push(scheduled);
                }
                Err(e) => missing.push((scheduled.call, e)),
            }
        }
        (expanded, missing)
    }

    /// Asks the tools whether effects in doubt took place, with the calls as proposed.
    pub(super) async fn reconcile(
        &self,
        calls: Vec<ScheduledCall>,
    ) -> Vec<(CallId, Option<agent_core::Finding>)> {
        // A sub-agent's call is continued, never repeated: running it again finds its child
        // run by id and goes on from that run's log (whose own effects are settled there).
        let (agents, calls): (Vec<_>, Vec<_>) = calls
            .into_iter()
            .partition(|c| Runtime::is_sub_agent_call(&c.call));
        let continued = agents
            .into_iter()
            .map(|c| (c.call.id, Some(agent_core::Finding::NotApplied)));
        let (expanded, missing) = self.expand_scheduled(calls);
        let mut findings = self.gateway.reconcile(&expanded).await;
        findings.extend(continued);
        // Without the value, no look-up can tell: a person will be asked.
        findings.extend(missing.into_iter().map(|(call, _)| (call.id, None)));
        findings
    }

    /// Runs the tools with the calls as proposed (secret references expanded); a passed
    /// deadline cancels them like the caller would.
    pub(super) async fn execute(
        &self,
        run_id: &str,
        machine: &Machine,
        group: Vec<ScheduledCall>,
        cancel: &CancellationToken,
    ) -> Vec<agent_core::ToolResult> {
        let order: Vec<CallId> = group.iter().map(|s| s.call.id.clone()).collect();
        let (runnable, missing) = self.expand_scheduled(group);
        let refused = missing.into_iter().map(|(call, e)| {
            agent_core::ToolResult::error(
                call.id,
                call.name,
                agent_core::ToolError::new(
                    agent_core::ErrorKind::ExecutionFailed,
                    format!("not run: {e}"),
                ),
            )
        });
        let token = cancel.child_token();
        let run = self.gateway.execute(run_id, vec![runnable], &token);
        tokio::pin!(run);
        let mut results = tokio::select! {
            results = &mut run => results,
            () = self.deadline(machine) => {
                token.cancel();
                run.await
            }
        };
        results.extend(refused);
        order
            .iter()
            .filter_map(|id| {
                let at = results.iter().position(|r| r.call_id == *id)?;
                Some(results.swap_remove(at))
            })
            .collect()
    }

    /// Cancels `cancel` once someone asks the store that the run stop
    /// ([`agent_store::Store::ask_to_stop`]), looking every [`STOP_POLL`] until dropped;
    /// nothing when the store carries no such requests. A request made before this drive
    /// began (while the run waited between two) is not this drive's: it is let go by a first
    /// look made before the drive begins, so that one made after is never taken for it.
    async fn watch_stop_requests(
        &self,
        run_id: &str,
        cancel: &CancellationToken,
        inbox: &Inbox,
    ) -> Option<Watch> {
        let store = Arc::clone(&self.store);
        let run_id = run_id.to_owned();
        let cancel = cancel.clone();
        let inline = self.inline_store;
        // The store may block (a database's round trip): asked off the async threads,
        // unless its work is done inline ([`Runtime::with_inline_store`]) as every other.
        let asked = move |first: bool| {
            let store = Arc::clone(&store);
            let run_id = run_id.clone();
            let look = move || {
                // The first look lets go of notes sent while no drive was going on (their
                // senders were told the run stopped before it read them); the drive takes
                // the others before each model call.
                if first {
                    store.let_go_of_notes(&run_id);
                }
                store.stop_asked(&run_id)
            };
            async move {
                if inline {
                    Some(look())
                } else {
                    tokio::task::spawn_blocking(look).await.ok()
                }
            }
        };
        // The first look lets go of an earlier request, and says whether to look at all.
        if !matches!(asked(true).await, Some(Some(_))) {
            return None;
        }
        inbox.open();
        let task = tokio::spawn(async move {
            loop {
                tokio::time::sleep(STOP_POLL).await;
                if matches!(asked(false).await, Some(Some(true))) {
                    cancel.cancel();
                    return;
                }
            }
        });
        Some(Watch(task))
    }

    /// Compacts the prompt (a summary the summarizer makes, or the one the projection keeps
    /// from the log when the budget cannot pay for a model's) and hands the machine what came
    /// of it: a compaction, or one declined as it would not have made the prompt smaller; or
    /// the run cancelled or past its deadline meanwhile. `window`: the model's window the
    /// provider's refusal of a prompt showed, recorded with the compaction.
    async fn compact(
        &self,
        run_id: &str,
        machine: &mut Machine,
        projector: &mut Projector,
        budgets_spend: bool,
        cancel: &CancellationToken,
        window: Option<u64>,
    ) -> Result<(), RuntimeError> {
        let span = tracing::info_span!(
            "compact",
            agent.tokens_before = projector.tokens(),
            agent.tokens_after = tracing::field::Empty,
        );
        let before = projector.tokens();
        let (summary, usage) = match self.summarizer.summarize_digest(projector.digest()) {
            Some(summary) => (summary, Usage::default()),
            // A summary the budget could not pay for (its request alone
            // passes it) is made from the log instead, at no cost.
            None if budgets_spend
                && !self.affords(machine, projector.summary_lower_bound() as u64) =>
            {
                tracing::info!(
                    parent: &span,
                    "the summary is made from the log: the budget left \
                     cannot pay for a model's"
                );
                (projector.digest().summary(), Usage::default())
            }
            None => {
                // What came before the last compaction is in its
                // summary; the log is read back only for a summarizer
                // that reads it.
                let log = if self.summarizer.reads_history() {
                    self.load_log_from(run_id, projector.summary_from())
                        .instrument(span.clone())
                        .await?
                } else {
                    Vec::new()
                };
                // A model call like the others: cancelled with the run,
                // bounded by its wall-clock budget.
                let asked = tokio::select! {
                    summarized = self
                        .summarizer
                        .summarize(&log, projector.prompt())
                        .instrument(span.clone()) => Some(summarized),
                    () = cancel.cancelled() => None,
                    () = self.deadline(machine) => None,
                };
                let Some(Summarized { summary, usage }) = asked else {
                    self.tick(machine)?;
                    if cancel.is_cancelled() {
                        machine.handle(Input::Cancel)?;
                    }
                    return Ok(());
                };
                machine.observe_time(self.clock.now_ms());
                // The one fallback: the extractive summary of the log,
                // which the projection keeps as it goes.
                let summary = summary.unwrap_or_else(|_| projector.digest().summary());
                (summary, usage)
            }
        };
        let after = projector.tokens_after_compaction(&summary);
        span.record("agent.tokens_after", after);
        // Compact only when it helps; otherwise the model gets what there is,
        // and no summary is asked for again until the prompt grew. Either
        // way it is committed, with what the summary cost.
        let (tokens_before, tokens_after) = (before as u64, after as u64);
        machine.handle(if after >= before {
            // Its commit tells the projector too; this process knows now.
            projector.compaction_declined(before);
            Input::CompactionDeclined {
                tokens_before,
                tokens_after,
                usage,
            }
        } else {
            Input::ContextCompacted {
                summary,
                through_version: projector.version(),
                tokens_before,
                tokens_after,
                usage,
                window,
            }
        })?;
        Ok(())
    }

    /// Resolves when the run's wall-clock budget is spent, as the machine counts it (the
    /// time worked, not the waits for a person between exchanges): a tick then ends the
    /// run. Never if it has no such budget.
    pub(super) async fn deadline(&self, machine: &Machine) {
        loop {
            match machine.wall_time_left(self.clock.now_ms()) {
                None => std::future::pending().await,
                Some(0) => return,
                Some(left) => tokio::time::sleep(Duration::from_millis(left)).await,
            }
        }
    }

    pub(super) fn tick(&self, machine: &mut Machine) -> Result<(), InputError> {
        machine.handle(Input::Tick(self.clock.now_ms()))
    }
}

impl Runtime {
    /// What a model call whose prompt has `least` tokens at the fewest may use before it
    /// passes the run's token or cost budget, all its attempts together.
    fn spend_limit(&self, machine: &Machine, least: u64) -> SpendLimit {
        let budget = machine.budget();
        let used = machine.state().budget_usage();
        SpendLimit {
            tokens: budget
                .max_tokens
                .map(|max| max.saturating_sub(used.total_tokens())),
            usd: budget.max_cost_usd.map(|max| max - used.cost_usd),
            least_input_tokens: least,
        }
    }

    /// Whether a model call whose prompt has `least` tokens at the fewest may still fit the
    /// run's token and cost budgets.
    fn affords(&self, machine: &Machine, least: u64) -> bool {
        self.spend_limit(machine, least)
            .allows_another(&Usage::default(), self.model.least_cost(least))
    }

    /// The least the next model call will use, for the budgets to stop a call its prompt
    /// alone would take past one: the provider's count (`least_counted`), or,
    /// without a count of a prompt like it, the projector's own
    /// ([`Projector::counted_lower_bound`]), taken only when the prompt's bytes could pass
    /// what the budgets leave (a run far from its budgets loads no tokenizer for it) and
    /// the model's usage is counted from the text (not a script's).
    fn least_next_call(&self, machine: &Machine, projector: &Projector) -> Usage {
        let counted = self.least_counted(projector);
        if counted.input_tokens > 0
            || !self.model.counts_text()
            || self.affords(machine, projector.upper_bound() as u64)
        {
            return counted;
        }
        let least = projector.counted_lower_bound() as u64;
        Usage {
            cost_usd: self.model.least_cost(least),
            ..Usage::tokens(least, 0)
        }
    }

    /// The least the next model call will use by the provider's count: the projector's
    /// floor of its prompt, each token at the model's cheapest input price. What a call's
    /// output limit leaves room for (an estimate of ours would cut an answer short).
    fn least_counted(&self, projector: &Projector) -> Usage {
        let least = projector.lower_bound() as u64;
        Usage {
            cost_usd: self.model.least_cost(least),
            ..Usage::tokens(least, 0)
        }
    }

    /// What the next model call may use before it passes the token or cost budget: all
    /// its attempts together, and what it may write (what is left less the least its
    /// prompt uses: the prompt is sent whole or not at all, the output can be cut; `None`
    /// when no budget limits it).
    fn call_limits(
        &self,
        machine: &Machine,
        projector: &Projector,
    ) -> (Option<u32>, Option<SpendLimit>) {
        let least = self.least_counted(projector);
        let limit = self.spend_limit(machine, least.input_tokens);
        let by_tokens = limit
            .tokens
            .map(|left| left.saturating_sub(least.input_tokens));
        let by_cost = limit
            .usd
            .and_then(|left| self.model.output_tokens_for(left - least.cost_usd));
        let cap = match (by_tokens, by_cost) {
            (Some(tokens), Some(cost)) => Some(tokens.min(cost)),
            (tokens, cost) => tokens.or(cost),
        };
        let cap = cap.map(|cap| u32::try_from(cap).unwrap_or(u32::MAX).max(1));
        (cap, Some(limit))
    }

    /// The span of one model call (`chat {model}`); what it used is recorded when it
    /// answers. Message contents are never recorded.
    fn chat_span(&self, name: &str) -> tracing::Span {
        tracing::info_span!(
            "chat",
            otel.name = name,
            otel.kind = "client",
            gen_ai.operation.name = "chat",
            gen_ai.provider.name = self.model.provider(),
            gen_ai.request.model = self.model.model(),
            gen_ai.request.max_tokens = tracing::field::Empty,
            gen_ai.response.model = self.model.model(),
            gen_ai.usage.input_tokens = tracing::field::Empty,
            gen_ai.usage.output_tokens = tracing::field::Empty,
            gen_ai.usage.cache_read.input_tokens = tracing::field::Empty,
            gen_ai.usage.cache_creation.input_tokens = tracing::field::Empty,
            gen_ai.response.finish_reasons = tracing::field::Empty,
            error.type = tracing::field::Empty,
        )
    }
}

/// What a model call used and how it ended, on its span; each retry is an event of it.
fn record_chat(
    span: &tracing::Span,
    answer: Option<&Result<agent_core::ModelReply, agent_providers::ProviderError>>,
) {
    let (retries, usage) = match answer {
        Some(Ok(reply)) => {
            let finish = match &reply.decision {
                Ok(agent_core::Decision::ToolCalls { .. }) => "tool_calls",
                Ok(_) => "stop",
                Err(_) => "invalid",
            };
            span.record("gen_ai.response.finish_reasons", finish);
            (reply.retries.as_slice(), Some(reply.usage))
        }
        Some(Err(e)) => {
            span.record("error.type", e.kind().as_str());
            (e.retries(), None)
        }
        None => {
            span.record("error.type", "cancelled");
            (&[][..], None)
        }
    };
    if let Some(usage) = usage {
        span.record("gen_ai.usage.input_tokens", usage.input_tokens);
        span.record("gen_ai.usage.output_tokens", usage.output_tokens);
        span.record(
            "gen_ai.usage.cache_read.input_tokens",
            usage.cache_read_tokens,
        );
        span.record(
            "gen_ai.usage.cache_creation.input_tokens",
            usage.cache_write_tokens,
        );
    }
    for retry in retries {
        tracing::info!(
            parent: span,
            attempt = retry.attempt,
            reason = retry.reason.as_str(),
            wait_ms = retry.wait_ms,
            "retry"
        );
    }
}

/// How often a run's driver looks whether someone asked it to stop.
const STOP_POLL: Duration = Duration::from_millis(200);

/// A task that ends when this is dropped.
struct Watch(tokio::task::JoinHandle<()>);

/// The notes people sent a run while it is driven ([`agent_store::Store::tell`]), looked
/// for before each model call in a store that carries such requests ([`Inbox::open`]), and
/// committed one at a time.
#[derive(Default)]
pub(super) struct Inbox {
    open: std::sync::atomic::AtomicBool,
    notes: std::sync::Mutex<std::collections::VecDeque<String>>,
}

impl Inbox {
    /// The store carries notes: look for them.
    fn open(&self) {
        self.open.store(true, std::sync::atomic::Ordering::Relaxed);
    }

    fn is_open(&self) -> bool {
        self.open.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn extend(&self, notes: Vec<String>) {
        if !notes.is_empty() {
            let mut waiting = self.notes.lock().unwrap_or_else(|p| p.into_inner());
            waiting.extend(notes);
        }
    }

    fn is_empty(&self) -> bool {
        self.notes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_empty()
    }

    fn next(&self) -> Option<String> {
        self.notes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .pop_front()
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        self.0.abort();
    }
}
