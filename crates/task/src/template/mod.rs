//! A task's `template` blocks, rendered by the template hook, with Nomad's rules:
//!
//! - The first render blocks the task's start: prestart renders every template and writes
//!   its file (through the task's directories, following no link), and templates with
//!   `env = true` feed the task's environment from the file they wrote. Data that is not
//!   there yet (a variable, a key, a file) holds the start until it comes, up to
//!   [`FIRST_RENDER_LIMIT`] (a kill or an agent shutdown ends the wait); then, as on a
//!   template error, the start fails with a "Template" event and the task's restart policy
//!   decides what follows.
//! - Every start renders again, so a restart re-renders.
//! - While the task lives, a watcher renders again when its sources change (the service
//!   catalog, a variable, and files read with `file`, polled every [`FILE_POLL`]), after the
//!   templates' `wait` lets the changes settle. An output that changed is written and its
//!   `change_mode` acts, after a random `splay`: a restart wins over everything; else each
//!   distinct `change_signal` is sent once and each `change_script` runs in the task. An
//!   unchanged output does nothing.
//! - After an agent restart the watcher starts with the reattached task and compares what it
//!   renders with the files on disk, so a change made while the agent was away still acts.
//!
//! The hook reaches its runner through `TaskLifecycle`, a narrow interface the runner gives
//! it once built.

mod place;
mod render;
mod sources;

pub use sources::{MemorySources, TemplateSources, VariableItems};

use crate::error::TaskError;
use crate::hooks::{HookContext, PrestartResponse, TaskDirs, TaskHook};
use parking_lot::Mutex;
use place::Placed;
use render::{Inputs, Rendered};
use std::collections::{BTreeMap, BTreeSet};
use std::hash::BuildHasher;
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;
use wharf_driver::ExecResult;
use wharf_state::{ChangeMode, Signal, Task, TaskEventKind, Template, TemplateWait};

/// The longest the first render waits for missing data before the start fails.
pub const FIRST_RENDER_LIMIT: Duration = Duration::from_secs(50);

/// How often a template that reads files with `file` looks at them again.
pub const FILE_POLL: Duration = Duration::from_secs(2);

/// What the template hook may do to its task.
#[async_trait::async_trait]
pub(crate) trait TaskLifecycle: Send + Sync + std::fmt::Debug {
    /// Restarts the running task, not counted as a failure.
    async fn restart(&self, reason: &str) -> Result<(), TaskError>;
    /// Sends `signal` to the running task.
    async fn signal(&self, signal: Signal, reason: &str) -> Result<(), TaskError>;
    /// Runs a command in the running task.
    async fn exec(&self, command: &[String], timeout: Duration) -> Result<ExecResult, TaskError>;
    /// Records an event on the task.
    async fn emit(&self, event: TaskEventKind);
    /// Stops the task for good after recording `event` as its failure.
    async fn kill(&self, event: TaskEventKind);
    /// Returns once the runner is asked to kill its task or to leave it (agent shutdown).
    async fn wind_down(&self);
}

/// Renders a task's templates (see the module docs).
#[derive(Debug)]
pub(crate) struct TemplateHook {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    templates: Vec<Template>,
    sources: Arc<dyn TemplateSources>,
    lifecycle: OnceLock<Arc<dyn TaskLifecycle>>,
    state: Mutex<WatchState>,
}

/// What the watcher renders with, and what it rendered last.
#[derive(Debug, Default)]
struct WatchState {
    watcher: Option<tokio::task::JoinHandle<()>>,
    inputs: Option<Inputs>,
    placed: Vec<Placed>,
    /// Per template, its last output; None until it first rendered.
    last: Vec<Option<String>>,
}

impl Drop for TemplateHook {
    fn drop(&mut self) {
        self.inner.stop_watching();
    }
}

fn template_error(message: impl Into<String>) -> TaskError {
    TaskError::Template { message: message.into() }
}

impl TemplateHook {
    /// The hook for `task`'s templates, or None if it has none.
    pub(crate) fn for_task(
        task: &Task,
        sources: Arc<dyn TemplateSources>,
    ) -> Option<Arc<TemplateHook>> {
        if task.templates.is_empty() {
            return None;
        }
        let inner = Inner {
            templates: task.templates.clone(),
            sources,
            lifecycle: OnceLock::new(),
            state: Mutex::new(WatchState::default()),
        };
        Some(Arc::new(TemplateHook { inner: Arc::new(inner) }))
    }

    /// Gives the hook its task, once the runner is built.
    pub(crate) fn attach(&self, lifecycle: Arc<dyn TaskLifecycle>) {
        let _ = self.inner.lifecycle.set(lifecycle);
    }
}

impl Inner {
    fn stop_watching(&self) {
        if let Some(watcher) = self.state.lock().watcher.take() {
            watcher.abort();
        }
    }

    fn place_all(
        &self,
        env: &BTreeMap<String, String>,
        dirs: &TaskDirs,
    ) -> Result<Vec<Placed>, TaskError> {
        self.templates
            .iter()
            .map(|t| {
                place::place(&t.destination, env, dirs)
                    .map_err(|e| template_error(format!("destination: {e}")))
            })
            .collect()
    }

    /// The text of template `index`: its `data`, or its `source` file read now.
    fn source_text(
        &self,
        index: usize,
        inputs: &Inputs,
        dirs: &TaskDirs,
    ) -> Result<String, String> {
        let template = &self.templates[index];
        if let Some(data) = &template.data {
            return Ok(data.clone());
        }
        let source = template.source.as_deref().unwrap_or_default();
        let placed = place::place(source, &inputs.env, dirs).map_err(|e| format!("source: {e}"))?;
        let bytes =
            placed.read().map_err(|e| format!("source {}: {e}", placed.path().display()))?;
        String::from_utf8(bytes)
            .map_err(|_| format!("source {} is not UTF-8", placed.path().display()))
    }

    /// Renders every template once: per template, its output or what it waits for.
    fn render_all(&self, inputs: &Inputs, dirs: &TaskDirs) -> Result<Vec<Rendered>, TaskError> {
        (0..self.templates.len())
            .map(|i| {
                let template = &self.templates[i];
                let text = self.source_text(i, inputs, dirs).map_err(template_error)?;
                render::render(&template.destination, &text, template.delimiters(), inputs)
                    .map_err(|e| template_error(format!("{}: {e}", template.destination)))
            })
            .collect()
    }

    /// Writes template `index`'s output unless the file holds it already.
    fn write(&self, index: usize, placed: &Placed, output: &str) -> Result<(), TaskError> {
        let template = &self.templates[index];
        let mode = template.mode().unwrap_or(0o644);
        if let Ok(existing) = placed.read()
            && existing == output.as_bytes()
            && file_mode(placed) == Some(mode)
        {
            return Ok(());
        }
        placed
            .write(output.as_bytes(), mode)
            .map_err(|e| template_error(format!("writing {}: {e}", placed.path().display())))
    }

    /// The first render of a start: waits for missing data (bounded), writes every file.
    async fn first_render(
        &self,
        inputs: &Inputs,
        dirs: &TaskDirs,
        placed: &[Placed],
    ) -> Result<Vec<String>, TaskError> {
        let mut changes = self.sources.changes();
        let deadline = Instant::now() + FIRST_RENDER_LIMIT;
        let poll = self.polls_files().then_some(Duration::from_millis(250));
        let outputs = loop {
            changes.borrow_and_update();
            let rendered = self.render_all(inputs, dirs)?;
            let waits: Vec<String> = rendered
                .iter()
                .filter_map(|r| match r {
                    Rendered::Missing(waits) => Some(waits.join(", ")),
                    Rendered::Done(_) => None,
                })
                .collect();
            if waits.is_empty() {
                break rendered
                    .into_iter()
                    .map(|r| match r {
                        Rendered::Done(output) => output,
                        Rendered::Missing(_) => String::new(),
                    })
                    .collect::<Vec<_>>();
            }
            let more = tokio::time::timeout_at(deadline, next_change(&mut changes, poll));
            let stopped = self.wind_down();
            tokio::select! {
                more = more => {
                    if more.is_err() {
                        return Err(template_error(format!("Missing: {}", waits.join(", "))));
                    }
                }
                () = stopped => {
                    let waits = waits.join(", ");
                    return Err(template_error(format!("stopped while waiting for {waits}")));
                }
            }
        };
        for (i, output) in outputs.iter().enumerate() {
            self.write(i, &placed[i], output)?;
        }
        Ok(outputs)
    }

    /// Returns once the task is to stop; never without a runner (a hook used on its own).
    async fn wind_down(&self) {
        match self.lifecycle.get() {
            Some(lifecycle) => lifecycle.wind_down().await,
            None => std::future::pending().await,
        }
    }

    fn polls_files(&self) -> bool {
        self.templates
            .iter()
            .any(|t| t.source.is_some() || t.data.as_deref().is_some_and(|d| d.contains("file")))
    }

    /// The settling bounds of a re-render: the longest `wait` any template asks for.
    fn wait(&self) -> Option<TemplateWait> {
        self.templates
            .iter()
            .filter_map(|t| t.wait)
            .reduce(|a, b| TemplateWait { min: a.min.max(b.min), max: a.max.max(b.max) })
    }

    fn start_watching(
        self: &Arc<Self>,
        inputs: Inputs,
        placed: Vec<Placed>,
        last: Vec<Option<String>>,
        dirs: TaskDirs,
    ) {
        let mut state = self.state.lock();
        state.inputs = Some(inputs);
        state.placed = placed;
        state.last = last;
        if state.watcher.as_ref().is_some_and(|w| !w.is_finished()) {
            return;
        }
        let inner = self.clone();
        state.watcher = Some(tokio::spawn(async move { inner.watch(dirs).await }));
    }

    /// Renders again whenever the sources change, until the hook stops it.
    async fn watch(self: Arc<Self>, dirs: TaskDirs) {
        let mut changes = self.sources.changes();
        let poll = self.polls_files().then_some(FILE_POLL);
        // A watcher started for a reattached task compares with the files first.
        let restored = self.state.lock().last.iter().any(Option::is_none);
        if !restored && !next_change(&mut changes, poll).await {
            return;
        }
        loop {
            if let Some(wait) = self.wait() {
                settle(&mut changes, wait).await;
            }
            changes.borrow_and_update();
            self.rerender(&dirs).await;
            if !next_change(&mut changes, poll).await {
                return;
            }
        }
    }

    /// One re-render: the changed outputs written, their change modes applied.
    async fn rerender(&self, dirs: &TaskDirs) {
        let Some(inputs) = self.state.lock().inputs.clone() else { return };
        let rendered = match self.render_all(&inputs, dirs) {
            Ok(rendered) => rendered,
            Err(error) => {
                self.emit(TaskEventKind::Template {
                    message: format!("re-render failed: {error}"),
                })
                .await;
                return;
            }
        };
        let mut changed = Vec::new();
        for (i, rendered) in rendered.into_iter().enumerate() {
            let Rendered::Done(output) = rendered else { continue };
            let (placed, last) = {
                let state = self.state.lock();
                (state.placed[i].clone(), state.last[i].clone())
            };
            let on_disk = last
                .or_else(|| placed.read().ok().map(|b| String::from_utf8_lossy(&b).into_owned()));
            if on_disk.as_deref() == Some(output.as_str()) {
                self.state.lock().last[i] = Some(output);
                continue;
            }
            if let Err(error) = self.write(i, &placed, &output) {
                self.emit(TaskEventKind::Template { message: error.to_string() }).await;
                continue;
            }
            self.state.lock().last[i] = Some(output);
            changed.push(i);
        }
        if !changed.is_empty() {
            self.act(&changed).await;
        }
    }

    /// Applies the change modes of the templates whose output changed.
    async fn act(&self, changed: &[usize]) {
        let Some(lifecycle) = self.lifecycle.get().cloned() else { return };
        let acting: Vec<&Template> = changed
            .iter()
            .map(|i| &self.templates[*i])
            .filter(|t| t.change_mode != ChangeMode::Noop)
            .collect();
        let Some(splay) = acting.iter().map(|t| t.splay).max() else { return };
        tokio::time::sleep(random_below(splay)).await;
        if acting.iter().any(|t| t.change_mode == ChangeMode::Restart) {
            if let Err(error) =
                lifecycle.restart("Template with change_mode restart re-rendered").await
            {
                tracing::debug!(%error, "template re-rendered while the task was not running");
            }
            return;
        }
        let signals: BTreeSet<Signal> = acting.iter().filter_map(|t| t.change_signal).collect();
        let mut failed = Vec::new();
        for signal in signals {
            if let Err(error) = lifecycle.signal(signal, "Template re-rendered").await
                && !matches!(error, TaskError::NotRunning { .. })
            {
                failed.push(format!("{signal}: {error}"));
            }
        }
        if !failed.is_empty() {
            let message = format!("Template failed to send signals: {}", failed.join("; "));
            lifecycle.kill(TaskEventKind::Template { message }).await;
            return;
        }
        for script in acting
            .iter()
            .filter(|t| t.change_mode == ChangeMode::Script)
            .filter_map(|t| t.change_script.as_ref())
        {
            let mut command = vec![script.command.clone()];
            command.extend(script.args.iter().cloned());
            let outcome = match lifecycle.exec(&command, script.timeout).await {
                Ok(result) if result.exit.exit_code == 0 && result.exit.signal.is_none() => Ok(()),
                Ok(result) => Err(format!("exited with code {}", result.exit.exit_code)),
                Err(TaskError::NotRunning { .. }) => continue,
                Err(error) => Err(error.to_string()),
            };
            match outcome {
                Ok(()) => {
                    let message = format!("Template ran script {}", command.join(" "));
                    lifecycle.emit(TaskEventKind::Template { message }).await;
                }
                Err(error) => {
                    let message =
                        format!("Template failed to run script {}: {error}", command.join(" "));
                    if script.fail_on_error {
                        lifecycle.kill(TaskEventKind::Template { message }).await;
                        return;
                    }
                    lifecycle.emit(TaskEventKind::Template { message }).await;
                }
            }
        }
    }

    async fn emit(&self, event: TaskEventKind) {
        if let Some(lifecycle) = self.lifecycle.get() {
            lifecycle.emit(event).await;
        }
    }
}

fn file_mode(placed: &Placed) -> Option<u32> {
    use std::os::unix::fs::MetadataExt;
    std::fs::symlink_metadata(placed.path()).ok().map(|m| m.mode() & 0o7777)
}

/// A uniformly spread wait below `limit` (zero for zero).
fn random_below(limit: Duration) -> Duration {
    let nanos = u64::try_from(limit.as_nanos()).unwrap_or(u64::MAX);
    if nanos == 0 {
        return Duration::ZERO;
    }
    // std's hasher keys are random per process: enough spread for a splay, with no dependency.
    let random = std::collections::hash_map::RandomState::new().hash_one(Instant::now());
    Duration::from_nanos(random % nanos)
}

/// Waits for the sources to change, or for the next file poll. False once the sources are
/// gone and no file is polled: nothing can change any more.
async fn next_change(changes: &mut watch::Receiver<u64>, poll: Option<Duration>) -> bool {
    match poll {
        Some(poll) => {
            tokio::select! {
                _ = changes.changed() => {}
                () = tokio::time::sleep(poll) => {}
            }
            true
        }
        None => changes.changed().await.is_ok(),
    }
}

/// Lets changes settle: returns once none came for `wait.min`, or `wait.max` after it began.
async fn settle(changes: &mut watch::Receiver<u64>, wait: TemplateWait) {
    let until = Instant::now() + wait.max;
    loop {
        let quiet = (Instant::now() + wait.min).min(until);
        tokio::select! {
            () = tokio::time::sleep_until(quiet) => return,
            changed = changes.changed() => {
                if changed.is_err() || Instant::now() >= until {
                    return;
                }
            }
        }
    }
}

/// The environment the `env = true` templates of `templates` give a task: each one's file,
/// read back from its destination, as `KEY=value` lines (blank lines and `#` comments
/// skipped; later templates win). A file that is missing or a line that is not `KEY=value`
/// is an error naming it.
pub fn load_env(
    templates: &[Template],
    task_env: &BTreeMap<String, String>,
    dirs: &TaskDirs,
) -> Result<BTreeMap<String, String>, TaskError> {
    let mut env = BTreeMap::new();
    for template in templates.iter().filter(|t| t.env) {
        let placed = place::place(&template.destination, task_env, dirs).map_err(template_error)?;
        let bytes = placed
            .read()
            .map_err(|e| template_error(format!("env file {}: {e}", placed.path().display())))?;
        let text = String::from_utf8_lossy(&bytes);
        for (number, line) in text.lines().enumerate() {
            let line = line.trim_start();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            match line.split_once('=') {
                Some((key, value)) if !key.trim().is_empty() => {
                    env.insert(key.trim().to_owned(), value.to_owned());
                }
                _ => {
                    return Err(template_error(format!(
                        "env file {} line {}: not KEY=value",
                        placed.path().display(),
                        number + 1
                    )));
                }
            }
        }
    }
    Ok(env)
}

#[async_trait::async_trait]
impl TaskHook for TemplateHook {
    fn name(&self) -> &str {
        "template"
    }

    async fn prestart(
        &self,
        ctx: HookContext<'_>,
        _previous: Option<&serde_json::Value>,
    ) -> Result<PrestartResponse, TaskError> {
        let inner = &self.inner;
        let inputs = Inputs {
            env: Arc::new(ctx.env.clone()),
            sources: inner.sources.clone(),
            task_dir: ctx.dirs.task_dir.clone(),
        };
        let placed = inner.place_all(ctx.env, ctx.dirs)?;
        let outputs = inner.first_render(&inputs, ctx.dirs, &placed).await?;
        let env = load_env(&inner.templates, ctx.env, ctx.dirs)?;
        inner.start_watching(
            inputs,
            placed,
            outputs.into_iter().map(Some).collect(),
            ctx.dirs.clone(),
        );
        Ok(PrestartResponse { env, ..PrestartResponse::default() })
    }

    async fn poststart(&self, ctx: HookContext<'_>) -> Result<(), TaskError> {
        // A task reattached after an agent restart had no prestart: watch it from here, and
        // compare with what is on disk first.
        let inner = &self.inner;
        if inner.state.lock().watcher.as_ref().is_some_and(|w| !w.is_finished()) {
            return Ok(());
        }
        let inputs = Inputs {
            env: Arc::new(ctx.env.clone()),
            sources: inner.sources.clone(),
            task_dir: ctx.dirs.task_dir.clone(),
        };
        let placed = inner.place_all(ctx.env, ctx.dirs)?;
        let last = vec![None; placed.len()];
        inner.start_watching(inputs, placed, last, ctx.dirs.clone());
        Ok(())
    }

    async fn stop(&self, _ctx: HookContext<'_>) -> Result<(), TaskError> {
        self.inner.stop_watching();
        Ok(())
    }

    async fn shutdown(&self, _ctx: HookContext<'_>) {
        self.inner.stop_watching();
    }
}
