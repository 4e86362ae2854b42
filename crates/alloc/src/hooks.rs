//! Alloc hooks: code that runs at fixed points of an allocation's life, the one loop that
//! runs them, and the built-in hook that owns the allocation's directory.
//!
//! Every phase runs its hooks in order (the built-in ones first, then those the embedder
//! added), each call bounded by [`HOOK_TIMEOUT`]. What a hook that fails or overruns does
//! depends on the phase, and nothing else does:
//!
//! | phase | when | a failure or an overrun |
//! |---|---|---|
//! | prerun | before any task runs (not for a terminal allocation) | skips the hooks after it and fails the allocation: every task is marked failed (`Setup Failure`) |
//! | postrun | every task runner has finished (not when the agent is shutting down) | is logged; the next hook runs |
//! | update | a non-terminal update was applied | is logged; the next hook runs |
//! | destroy | the tasks are dead, before the allocation's records are deleted | is logged; the next hook runs |
//! | shutdown | the agent leaves the tasks running | the call cannot fail; an overrun is cut off silently and the next hook runs |
//! | prekill | before the tasks are killed, and once every task but the poststop ones is dead | the call cannot fail; an overrun is cut off silently and the next hook runs |
//!
//! The alloc runner calls `run_hooks` for every phase; the table is `AllocHookPhase::policy`,
//! tested row by row.

use crate::alloc_dir;
use crate::error::AllocError;
use crate::spare_dirs::SpareDirs;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use wharf_state::Allocation;
use wharf_task::hooks::{HOOK_TIMEOUT, TaskDirs};

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

/// A point of an allocation's life where every alloc hook runs; each carries its policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AllocHookPhase {
    Prerun,
    Postrun,
    Update,
    Destroy,
    Shutdown,
    Prekill,
}

/// What a hook call that fails or overruns its timeout leads to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OnHookFailure {
    /// The phase's remaining hooks are skipped and the error fails the allocation.
    FailAllocation,
    /// A warning is logged and the next hook runs.
    Log,
    /// Nothing is said and the next hook runs: the calls cannot fail, only overrun.
    Ignore,
}

/// How the hooks of one phase are run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct HookPolicy {
    /// The longest one hook's call may take.
    pub(crate) timeout: Duration,
    /// What a failed or overrun call leads to.
    pub(crate) on_failure: OnHookFailure,
}

impl AllocHookPhase {
    /// The phase's policy: the table in the module docs.
    pub(crate) fn policy(self) -> HookPolicy {
        let on_failure = match self {
            AllocHookPhase::Prerun => OnHookFailure::FailAllocation,
            AllocHookPhase::Postrun | AllocHookPhase::Update | AllocHookPhase::Destroy => {
                OnHookFailure::Log
            }
            AllocHookPhase::Shutdown | AllocHookPhase::Prekill => OnHookFailure::Ignore,
        };
        HookPolicy { timeout: HOOK_TIMEOUT, on_failure }
    }
}

impl fmt::Display for AllocHookPhase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            AllocHookPhase::Prerun => "prerun",
            AllocHookPhase::Postrun => "postrun",
            AllocHookPhase::Update => "update",
            AllocHookPhase::Destroy => "destroy",
            AllocHookPhase::Shutdown => "shutdown",
            AllocHookPhase::Prekill => "prekill",
        })
    }
}

/// Runs `phase` of every hook in `hooks`, in order, each call bounded by the phase's timeout,
/// and deals with a failed or overrun call as the phase's policy says. Returns an error only
/// under [`OnHookFailure::FailAllocation`]: the first failure, naming its hook.
pub(crate) async fn run_hooks(
    hooks: &[Arc<dyn AllocHook>],
    phase: AllocHookPhase,
    ctx: AllocHookContext<'_>,
    alloc_id: &str,
) -> Result<(), AllocError> {
    let policy = phase.policy();
    for hook in hooks {
        let call = async {
            match phase {
                AllocHookPhase::Prerun => hook.prerun(ctx).await,
                AllocHookPhase::Postrun => hook.postrun(ctx).await,
                AllocHookPhase::Update => hook.update(ctx).await,
                AllocHookPhase::Destroy => hook.destroy(ctx).await,
                AllocHookPhase::Shutdown => {
                    hook.shutdown(ctx).await;
                    Ok(())
                }
                AllocHookPhase::Prekill => {
                    hook.prekill(ctx).await;
                    Ok(())
                }
            }
        };
        let error = match tokio::time::timeout(policy.timeout, call).await {
            Ok(Ok(())) => continue,
            Ok(Err(error)) => error,
            Err(_) => AllocError::Hook { hook: hook.name().to_owned(), reason: "timed out".into() },
        };
        match policy.on_failure {
            OnHookFailure::FailAllocation => return Err(error),
            OnHookFailure::Log => {
                tracing::warn!(alloc_id = %alloc_id, %error, "{phase} hook failed")
            }
            OnHookFailure::Ignore => {}
        }
    }
    Ok(())
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
        alloc_dir::shared_dirs(alloc_root)
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

#[cfg(test)]
mod tests {
    use super::*;
    use parking_lot::Mutex;
    use tokio::time::Instant;
    use wharf_state::{Job, JobType, Task, TaskGroup};

    const PHASES: [AllocHookPhase; 6] = [
        AllocHookPhase::Prerun,
        AllocHookPhase::Postrun,
        AllocHookPhase::Update,
        AllocHookPhase::Destroy,
        AllocHookPhase::Shutdown,
        AllocHookPhase::Prekill,
    ];

    /// What a scripted hook does when called.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    enum Script {
        Succeed,
        Fail,
        Hang,
    }

    /// A hook that records its calls in a log shared with the others, and does as scripted.
    #[derive(Debug)]
    struct Scripted {
        name: &'static str,
        script: Script,
        calls: Arc<Mutex<Vec<String>>>,
    }

    impl Scripted {
        async fn call(&self, phase: &str) -> Result<(), AllocError> {
            self.calls.lock().push(format!("{} {phase}", self.name));
            match self.script {
                Script::Succeed => Ok(()),
                Script::Fail => {
                    Err(AllocError::Hook { hook: self.name.into(), reason: "scripted".into() })
                }
                Script::Hang => std::future::pending().await,
            }
        }
    }

    #[async_trait::async_trait]
    impl AllocHook for Scripted {
        fn name(&self) -> &str {
            self.name
        }
        async fn prerun(&self, _ctx: AllocHookContext<'_>) -> Result<(), AllocError> {
            self.call("prerun").await
        }
        async fn postrun(&self, _ctx: AllocHookContext<'_>) -> Result<(), AllocError> {
            self.call("postrun").await
        }
        async fn update(&self, _ctx: AllocHookContext<'_>) -> Result<(), AllocError> {
            self.call("update").await
        }
        async fn destroy(&self, _ctx: AllocHookContext<'_>) -> Result<(), AllocError> {
            self.call("destroy").await
        }
        async fn shutdown(&self, _ctx: AllocHookContext<'_>) {
            // These calls cannot fail: only a hang matters.
            let _ = self.call("shutdown").await;
        }
        async fn prekill(&self, _ctx: AllocHookContext<'_>) {
            let _ = self.call("prekill").await;
        }
    }

    /// Runs `phase` over hooks `a`, `b`, `c` scripted as given; returns the result, the calls
    /// made, and how long it took on the paused clock.
    async fn run(
        phase: AllocHookPhase,
        scripts: [Script; 3],
    ) -> (Result<(), AllocError>, Vec<String>, Duration) {
        let calls = Arc::new(Mutex::new(Vec::new()));
        let hooks: Vec<Arc<dyn AllocHook>> = ["a", "b", "c"]
            .into_iter()
            .zip(scripts)
            .map(|(name, script)| {
                Arc::new(Scripted { name, script, calls: calls.clone() }) as Arc<dyn AllocHook>
            })
            .collect();
        let task = Task::new("web", "mock");
        let alloc =
            Allocation::new("a1", Job::new("j", JobType::Batch, TaskGroup::new("g", [task])), "g");
        let ctx = AllocHookContext { alloc: &alloc, alloc_root: Path::new("/nonexistent/a1") };
        let started = Instant::now();
        let result = run_hooks(&hooks, phase, ctx, "a1").await;
        let calls = calls.lock().clone();
        (result, calls, started.elapsed())
    }

    fn calls(phase: AllocHookPhase, names: &[&str]) -> Vec<String> {
        names.iter().map(|name| format!("{name} {phase}")).collect()
    }

    /// The policy table of the module docs, one row per phase.
    #[test]
    fn policy_table() {
        use OnHookFailure::*;
        let table = [
            (AllocHookPhase::Prerun, FailAllocation),
            (AllocHookPhase::Postrun, Log),
            (AllocHookPhase::Update, Log),
            (AllocHookPhase::Destroy, Log),
            (AllocHookPhase::Shutdown, Ignore),
            (AllocHookPhase::Prekill, Ignore),
        ];
        assert_eq!(table.map(|(phase, _)| phase), PHASES, "one row per phase");
        for (phase, on_failure) in table {
            assert_eq!(phase.policy(), HookPolicy { timeout: HOOK_TIMEOUT, on_failure }, "{phase}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn every_phase_calls_its_own_method_of_every_hook_in_order() {
        for phase in PHASES {
            let (result, made, took) = run(phase, [Script::Succeed; 3]).await;
            assert!(result.is_ok(), "{phase}: {result:?}");
            assert_eq!(made, calls(phase, &["a", "b", "c"]));
            assert_eq!(took, Duration::ZERO, "{phase}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_prerun_skips_the_hooks_after_it_and_fails_the_allocation() {
        let phase = AllocHookPhase::Prerun;
        let (result, made, _) = run(phase, [Script::Succeed, Script::Fail, Script::Succeed]).await;
        let error = result.expect_err("a prerun failure fails the allocation");
        assert_eq!(error.to_string(), "alloc hook b: scripted");
        assert_eq!(made, calls(phase, &["a", "b"]), "c never runs");
    }

    #[tokio::test(start_paused = true)]
    async fn a_prerun_that_overruns_fails_the_allocation_at_the_timeout() {
        let phase = AllocHookPhase::Prerun;
        let (result, made, took) =
            run(phase, [Script::Hang, Script::Succeed, Script::Succeed]).await;
        let error = result.expect_err("an overrun prerun fails the allocation");
        assert_eq!(error.to_string(), "alloc hook a: timed out");
        assert_eq!(made, calls(phase, &["a"]));
        assert_eq!(took, HOOK_TIMEOUT);
    }

    #[tokio::test(start_paused = true)]
    async fn logged_phases_go_on_past_a_failure_and_an_overrun() {
        for phase in [AllocHookPhase::Postrun, AllocHookPhase::Update, AllocHookPhase::Destroy] {
            let (result, made, took) =
                run(phase, [Script::Fail, Script::Hang, Script::Succeed]).await;
            assert!(result.is_ok(), "{phase}: {result:?}");
            assert_eq!(made, calls(phase, &["a", "b", "c"]));
            assert_eq!(took, HOOK_TIMEOUT, "{phase}: the hang is cut off at the timeout");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn shutdown_and_prekill_cut_off_an_overrun_and_go_on() {
        for phase in [AllocHookPhase::Shutdown, AllocHookPhase::Prekill] {
            let (result, made, took) =
                run(phase, [Script::Hang, Script::Fail, Script::Succeed]).await;
            assert!(result.is_ok(), "{phase}: {result:?}");
            assert_eq!(made, calls(phase, &["a", "b", "c"]));
            assert_eq!(took, HOOK_TIMEOUT, "{phase}");
        }
    }
}
