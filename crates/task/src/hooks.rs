//! Task hooks: code that runs at fixed points of a task's life, and the built-in one that
//! builds the task's directories.
//!
//! A hook implements the phases it cares about; the rest default to doing nothing. Prestart
//! hooks run before every start and may add environment variables, keep state across restarts
//! and agent restarts, and declare themselves done so they are skipped from then on. Every
//! call is bounded by [`HOOK_TIMEOUT`]; a hook that fails or overruns becomes an event, and
//! only a prestart failure stops the task from starting.

use crate::error::TaskError;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;
use wharf_driver::ExitResult;
use wharf_isolate::dirs::OpenDir;
use wharf_state::{Allocation, Task, TaskEventKind};

/// The longest a hook call may take.
pub const HOOK_TIMEOUT: Duration = Duration::from_secs(60);

/// The directories of one task.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskDirs {
    /// The allocation's directory shared by its tasks: `<alloc root>/alloc`.
    pub alloc_dir: PathBuf,
    /// The task's directory: `<alloc root>/<task>`; its working directory.
    pub task_dir: PathBuf,
    /// `local/`, the task's scratch space.
    pub local_dir: PathBuf,
    /// `secrets/`, readable by the task's user only (mode 0700).
    pub secrets_dir: PathBuf,
    /// `logs/`, where its output goes.
    pub logs_dir: PathBuf,
}

/// Creates `dir` and any missing parent with `mode` (for a new directory).
fn create_dir(dir: &Path, mode: u32) -> Result<(), TaskError> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(mode)
        .create(dir)
        .map_err(|source| TaskError::Io { path: dir.to_owned(), source })
}

impl TaskDirs {
    /// Creates the task's own directories: its directory, `local/`, `logs/` and `secrets/`
    /// (mode 0700, even if it existed), but not the shared allocation directory.
    ///
    /// The task may write in its directory, and so may have put a link in place of any of the
    /// three (a workload user that unveiled a path above it, a task left running, a task of
    /// raw_exec): they are made and changed through the open task directory, never through a
    /// path a link could redirect, and a link is refused rather than followed.
    pub fn create_own(&self) -> Result<(), TaskError> {
        create_dir(&self.task_dir, 0o755)?;
        let dirs = |source| TaskError::Dirs { source };
        let task_dir = OpenDir::open(&self.task_dir).map_err(dirs)?;
        for (dir, mode) in
            [(&self.local_dir, 0o755), (&self.logs_dir, 0o755), (&self.secrets_dir, 0o700)]
        {
            let relative = dir.strip_prefix(&self.task_dir).map_err(|_| TaskError::Io {
                path: dir.clone(),
                source: std::io::Error::other(format!(
                    "not inside the task directory {}",
                    self.task_dir.display()
                )),
            })?;
            let made = task_dir.make_dir(relative, mode).map_err(dirs)?;
            // An existing directory keeps its mode through make_dir(): set it.
            if *dir == self.secrets_dir {
                made.set_mode(mode).map_err(dirs)?;
            }
        }
        Ok(())
    }

    /// The layout of DESIGN.md under an allocation's root directory.
    pub fn new(alloc_root: &Path, task: &str) -> TaskDirs {
        let task_dir = alloc_root.join(task);
        TaskDirs {
            alloc_dir: alloc_root.join("alloc"),
            local_dir: task_dir.join("local"),
            secrets_dir: task_dir.join("secrets"),
            logs_dir: task_dir.join("logs"),
            task_dir,
        }
    }
}

/// What every hook call can see.
#[derive(Debug, Clone, Copy)]
pub struct HookContext<'a> {
    /// The allocation, as of the latest update.
    pub alloc: &'a Allocation,
    /// The task.
    pub task: &'a Task,
    /// Its directories.
    pub dirs: &'a TaskDirs,
    /// Its environment as built so far.
    pub env: &'a BTreeMap<String, String>,
}

/// What a prestart hook hands back.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PrestartResponse {
    /// Variables to add to the task's environment.
    pub env: BTreeMap<String, String>,
    /// State to keep for the next call (after a restart or an agent restart).
    pub state: Option<serde_json::Value>,
    /// Skip this hook from now on; its `env` is remembered.
    pub done: bool,
    /// Events to record, such as progress messages.
    pub events: Vec<TaskEventKind>,
}

/// A hook into a task's life. Every method has a default that does nothing.
#[async_trait::async_trait]
pub trait TaskHook: Send + Sync + std::fmt::Debug + 'static {
    /// A name, unique among a task's hooks; its state is kept under it.
    fn name(&self) -> &str;

    /// How long its `prestart` may take; [`HOOK_TIMEOUT`] unless it does slow work by design
    /// (fetching artifacts) and bounds that work itself.
    fn prestart_timeout(&self, _ctx: HookContext<'_>) -> Duration {
        HOOK_TIMEOUT
    }

    /// Before every start. `previous` is the state it returned last time.
    async fn prestart(
        &self,
        _ctx: HookContext<'_>,
        _previous: Option<&serde_json::Value>,
    ) -> Result<PrestartResponse, TaskError> {
        Ok(PrestartResponse::default())
    }

    /// After the driver started the task. Errors are recorded, nothing more.
    async fn poststart(&self, _ctx: HookContext<'_>) -> Result<(), TaskError> {
        Ok(())
    }

    /// Before the task is killed or restarted.
    async fn prekill(&self, _ctx: HookContext<'_>) {}

    /// After each exit.
    async fn exited(&self, _ctx: HookContext<'_>, _exit: &ExitResult) {}

    /// When the allocation is updated.
    async fn update(&self, _ctx: HookContext<'_>) {}

    /// Once, when the task will never run again. Must be idempotent.
    async fn stop(&self, _ctx: HookContext<'_>) -> Result<(), TaskError> {
        Ok(())
    }

    /// When the agent shuts down and leaves the task running.
    async fn shutdown(&self, _ctx: HookContext<'_>) {}
}

/// Builds the task's directories (`local/`, `secrets/` with mode 0700, `logs/`) and the
/// allocation's shared directory if it is missing.
#[derive(Debug, Default)]
pub struct TaskDirHook;

#[async_trait::async_trait]
impl TaskHook for TaskDirHook {
    fn name(&self) -> &str {
        "task_dir"
    }

    async fn prestart(
        &self,
        ctx: HookContext<'_>,
        _previous: Option<&serde_json::Value>,
    ) -> Result<PrestartResponse, TaskError> {
        let dirs = ctx.dirs;
        create_dir(&dirs.alloc_dir, 0o755)?;
        dirs.create_own()?;
        Ok(PrestartResponse {
            events: vec![TaskEventKind::Setup { message: "Building Task Directory".into() }],
            ..PrestartResponse::default()
        })
    }
}
