//! Alloc hooks: code that runs at fixed points of an allocation's life, and the built-in
//! one that owns the allocation's directory.
//!
//! Prerun hooks run before any task (skipped for a terminal allocation); the first failure
//! stops the rest and fails every task. Postrun hooks run after every task has finished
//! (not when the agent is shutting down). Update hooks run for non-terminal updates. Destroy
//! hooks run when the allocation is garbage-collected, shutdown hooks when the agent exits and
//! leaves it running, prekill hooks before its tasks are killed. Every call is bounded by
//! [`wharf_task::hooks::HOOK_TIMEOUT`].

use crate::AllocError;
use crate::SpareDirs;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use wharf_state::Allocation;
use wharf_task::hooks::TaskDirs;

/// What an alloc hook sees.
#[derive(Debug, Clone, Copy)]
pub struct AllocHookContext<'a> {
    /// The allocation, as of the latest update.
    pub alloc: &'a Allocation,
    /// The allocation's directory: `<data dir>/allocs/<alloc id>`.
    pub alloc_root: &'a Path,
}

/// A hook into an allocation's life. Every method has a default that does nothing.
#[async_trait::async_trait]
pub trait AllocHook: Send + Sync + std::fmt::Debug + 'static {
    /// A name for logs and errors.
    fn name(&self) -> &str;

    /// Before the tasks run.
    async fn prerun(&self, _ctx: AllocHookContext<'_>) -> Result<(), AllocError> {
        Ok(())
    }

    /// After every task has finished. Must be safe without a prior prerun.
    async fn postrun(&self, _ctx: AllocHookContext<'_>) -> Result<(), AllocError> {
        Ok(())
    }

    /// On a non-terminal update of the allocation.
    async fn update(&self, _ctx: AllocHookContext<'_>) -> Result<(), AllocError> {
        Ok(())
    }

    /// When the allocation is destroyed. Best effort.
    async fn destroy(&self, _ctx: AllocHookContext<'_>) -> Result<(), AllocError> {
        Ok(())
    }

    /// When the agent shuts down, leaving the tasks running.
    async fn shutdown(&self, _ctx: AllocHookContext<'_>) {}

    /// Before the tasks are killed, and once every task is dead.
    async fn prekill(&self, _ctx: AllocHookContext<'_>) {}
}

/// Creates the allocation's directory with its shared `alloc/` (`data/`, `logs/`, `tmp/`)
/// before the tasks run, and removes the whole tree when the allocation is destroyed.
///
/// With [`SpareDirs`], the allocation's directory and its tasks' directories are ready-made
/// shells renamed into place, which keeps inode allocation off the start's path.
#[derive(Debug, Default)]
pub struct AllocDirHook {
    spares: Option<Arc<SpareDirs>>,
}

impl AllocDirHook {
    /// The hook, taking directories from `spares` when it has them.
    pub fn new(spares: Option<Arc<SpareDirs>>) -> AllocDirHook {
        AllocDirHook { spares }
    }

    /// The shared directories under `alloc_root`.
    pub fn shared_dirs(alloc_root: &Path) -> [PathBuf; 3] {
        let shared = alloc_root.join("alloc");
        [shared.join("data"), shared.join("logs"), shared.join("tmp")]
    }
}

#[async_trait::async_trait]
impl AllocHook for AllocDirHook {
    fn name(&self) -> &str {
        "alloc_dir"
    }

    async fn prerun(&self, ctx: AllocHookContext<'_>) -> Result<(), AllocError> {
        if let Some(spares) = &self.spares
            && spares.take_alloc(ctx.alloc_root)
            && let Ok(group) = ctx.alloc.group()
        {
            for task in &group.tasks {
                spares.take_task(&TaskDirs::new(ctx.alloc_root, &task.name).task_dir);
            }
        }
        // Whatever no shell provided (or all of it, without spares); a no-op otherwise.
        for dir in AllocDirHook::shared_dirs(ctx.alloc_root) {
            std::fs::create_dir_all(&dir).map_err(|e| AllocError::Hook {
                hook: self.name().into(),
                reason: format!("cannot create {}: {e}", dir.display()),
            })?;
        }
        Ok(())
    }

    async fn destroy(&self, ctx: AllocHookContext<'_>) -> Result<(), AllocError> {
        match std::fs::remove_dir_all(ctx.alloc_root) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(AllocError::Hook {
                hook: self.name().into(),
                reason: format!("cannot remove {}: {e}", ctx.alloc_root.display()),
            }),
        }
    }
}
