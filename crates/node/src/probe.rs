//! `wharf alloc list --probe`: the runner-list protocol of DESIGN.md for a prober.
//!
//! With an agent answering, it asks the agent. With none, it reads the store itself: an
//! allocation whose record says it runs is listed as `<id>` if one of its tasks is still alive
//! and as `<id> stale` if none is; a store that cannot be read makes the node `broken`. It exits
//! 0 whenever it could answer.
//!
//! It never hangs: an agent that accepts connections but does not answer (frozen, or stopped
//! with SIGSTOP) gets [`AGENT_DEADLINE`], after which the store is read as if no agent ran; a
//! store that does not answer within [`STORE_DEADLINE`] makes the node `broken`. Both together
//! stay well under the prober's command deadline, so the prober always gets an answer.

use crate::client::{Client, ClientError};
use crate::config::NodeConfig;
use hyper::Method;
use std::io::Write;
use std::sync::Arc;
use std::time::Duration;
use wharf_driver::{DriverRegistry, RunState, TaskHandle};
use wharf_store::{RedbStore, StateStore, StoreError, StoredAlloc};

/// How long the agent has to answer before the store is read instead.
pub const AGENT_DEADLINE: Duration = Duration::from_secs(5);
/// How long reading the store may take before the node is reported broken.
pub const STORE_DEADLINE: Duration = Duration::from_secs(5);

/// Prints the probe lines.
pub async fn print(client: &Client, config: &NodeConfig) -> anyhow::Result<()> {
    let lines = lines(client, config).await?;
    let mut out = std::io::stdout().lock();
    for line in lines {
        writeln!(out, "{line}")?;
    }
    Ok(())
}

/// The probe lines, as [`print()`] prints them (the probe channel sends them itself).
pub async fn lines(client: &Client, config: &NodeConfig) -> anyhow::Result<Vec<String>> {
    let asked = tokio::time::timeout(AGENT_DEADLINE, client.call(Method::GET, "/v1/probe", None));
    let lines = match asked.await {
        Ok(Ok(text)) => String::from_utf8_lossy(&text).lines().map(str::to_owned).collect(),
        Ok(Err(ClientError::Unreachable { .. })) | Err(_) => {
            tokio::time::timeout(STORE_DEADLINE, offline(config))
                .await
                .unwrap_or_else(|_| vec!["broken".into()])
        }
        Ok(Err(other)) => return Err(other.into()),
    };
    Ok(lines)
}

/// The driver handles recorded for an allocation's tasks.
pub(crate) fn task_handles(stored: &StoredAlloc) -> impl Iterator<Item = TaskHandle> + '_ {
    stored.tasks.values().filter_map(|task| {
        task.local_state
            .as_deref()
            .and_then(|bytes| wharf_task::local_state::LocalState::decode(bytes).ok())
            .and_then(|local| local.handle)
    })
}

/// The task drivers that read the handles a stopped agent left (the probe and the wipe), each
/// handle by the driver that made it, whether or not the configuration still enables it.
pub(crate) fn handle_readers(
    config: &NodeConfig,
    cgroups: wharf_exec::TaskCgroups,
) -> DriverRegistry {
    // Both drivers run tasks under the same shim.
    let options = wharf_exec::RawExecOptions {
        shim_path: config.drivers.raw_exec.shim_path.clone(),
        ..Default::default()
    };
    let mut drivers = DriverRegistry::new();
    if let Ok(exec) = config.drivers.exec.options(&config.data_dir) {
        let driver = wharf_exec::ExecDriver::new(options.clone(), exec);
        drivers.register(Arc::new(driver.with_cgroups(cgroups.clone())));
    }
    drivers.register(Arc::new(wharf_exec::RawExecDriver::new(options).with_cgroups(cgroups)));
    drivers
}

/// The probe lines read from the store, with no agent running.
pub async fn offline(config: &NodeConfig) -> Vec<String> {
    let path = config.store_path();
    if !path.exists() {
        return Vec::new();
    }
    let store = match RedbStore::open(&path) {
        Ok(store) => store,
        // Held by an agent that does not answer: it cannot take work.
        Err(StoreError::Locked { .. }) | Err(_) => return vec!["broken".into()],
    };
    let snapshot = match store.load_all().await {
        Ok(snapshot) => snapshot,
        Err(_) => return vec!["broken".into()],
    };
    let drivers = handle_readers(config, wharf_exec::TaskCgroups::default());
    let mut lines = Vec::new();
    for stored in snapshot.allocs {
        let states: Vec<_> = stored.tasks.values().filter_map(|t| t.state.clone()).collect();
        let terminal = stored.alloc.server_terminal()
            || wharf_state::client_status(&states).is_some_and(|(status, _)| status.is_terminal());
        if terminal {
            continue;
        }
        let mut alive = false;
        for handle in task_handles(&stored) {
            let Some(driver) = drivers.get(&handle.driver) else { continue };
            if driver.recover_task(&handle).await.is_ok()
                && driver
                    .inspect_task(handle.id())
                    .await
                    .is_ok_and(|info| info.state == RunState::Running)
            {
                alive = true;
            }
        }
        lines.push(if alive {
            stored.alloc.id.clone()
        } else {
            format!("{} stale", stored.alloc.id)
        });
    }
    lines
}
