//! The task hook that fetches a task's artifacts before its first start.
//!
//! Artifacts are fetched once: the hook says it is done after the first success, and the task
//! runner keeps that in the task's local state, so neither a restart of the task nor a restore
//! after an agent restart fetches them again. A failure records a "Failed Artifact Download"
//! event and the task's restart policy decides whether it is tried again.

use crate::fetch::Fetcher;
use parking_lot::Mutex;
use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;
use wharf_state::{Artifact, TaskEventKind};
use wharf_task::env;
use wharf_task::{HookContext, PrestartResponse, TaskError, TaskHook};

/// Fetches every `artifact` of a task into its directory before it starts.
///
/// Within one agent's life, an artifact fetched while a later one of the same task failed is
/// not fetched again when the task is retried (Nomad's partial progress); the agent keeps no
/// such record across its own restarts, where a task whose artifacts were not all fetched
/// fetches them all.
#[derive(Debug)]
pub struct ArtifactHook {
    fetcher: Arc<Fetcher>,
    /// (alloc id, task, artifact index) of artifacts in place while the task's set is not.
    fetched: Mutex<HashSet<(String, String, usize)>>,
}

impl ArtifactHook {
    /// The hook, fetching through `fetcher`.
    pub fn new(fetcher: Arc<Fetcher>) -> ArtifactHook {
        ArtifactHook { fetcher, fetched: Mutex::new(HashSet::new()) }
    }
}

#[wharf_task::async_trait]
impl TaskHook for ArtifactHook {
    fn name(&self) -> &str {
        "artifacts"
    }

    /// One artifact's limit for each, and a little to record the outcome.
    fn prestart_timeout(&self, ctx: HookContext<'_>) -> Duration {
        let count = u32::try_from(ctx.task.artifacts.len()).unwrap_or(u32::MAX).max(1);
        self.fetcher.limits().timeout.saturating_mul(count) + Duration::from_secs(5)
    }

    async fn prestart(
        &self,
        ctx: HookContext<'_>,
        _previous: Option<&serde_json::Value>,
    ) -> Result<PrestartResponse, TaskError> {
        let artifacts = &ctx.task.artifacts;
        let mut response = PrestartResponse { done: true, ..PrestartResponse::default() };
        if artifacts.is_empty() {
            return Ok(response);
        }
        let lookup = |name: &str| ctx.env.get(name).cloned();
        let key = |index| (ctx.alloc.id.clone(), ctx.task.name.clone(), index);
        for (index, artifact) in artifacts.iter().enumerate() {
            if self.fetched.lock().contains(&key(index)) {
                continue;
            }
            // `${NOMAD_TASK_DIR}`-style variables, as Nomad interpolates them.
            let artifact = Artifact {
                source: env::interpolate(&artifact.source, &lookup),
                destination: env::interpolate(&artifact.destination, &lookup),
                ..artifact.clone()
            };
            let placed =
                self.fetcher.fetch(&artifact, &ctx.dirs.task_dir).await.map_err(|error| {
                    tracing::warn!(task = %ctx.task.name, %error, "artifact download failed");
                    TaskError::HookEvent {
                        hook: self.name().to_owned(),
                        event: TaskEventKind::ArtifactDownloadFailed { error: error.to_string() },
                    }
                })?;
            tracing::debug!(task = %ctx.task.name, source = %artifact.source, placed = %placed.display(), "artifact in place");
            self.fetched.lock().insert(key(index));
        }
        self.fetched
            .lock()
            .retain(|(alloc, task, _)| *alloc != ctx.alloc.id || *task != ctx.task.name);
        response.events.push(TaskEventKind::Setup {
            message: format!("Downloaded {} artifact(s)", artifacts.len()),
        });
        Ok(response)
    }
}
