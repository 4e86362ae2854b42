//! `wharf wipe`: what destroying a machine does to its node, on a node that is a directory.
//!
//! The fleet's loopback instances are agents on this host, each with its own data directory.
//! Destroying one must leave nothing behind, as destroying a cloud instance does: the agent is
//! killed (SIGKILL, so it cannot restart anything; one that has not yet announced itself in
//! its agent file, as on a machine destroyed while it starts, is found by its command line),
//! every task it recorded is killed with its whole process group through the driver's forced
//! destroy, and the directory is removed.
//! Tasks get no kill timeout and poststop tasks do not run: a destroyed machine gets neither.
//! The node's cgroups go too, with anything still in them.
//!
//! Containers are destroyed as the other tasks are (`runc delete --force`, their root
//! unmounted); then every container the runtime still keeps state for is deleted, whether a
//! task records it or not (an agent killed mid-destroy leaves one), and every mount left under
//! the data directory is unmounted, so that removing the directory neither fails on a busy
//! mount point nor deletes through a mount what it shows.

use crate::agent_file::AgentFile;
use crate::config::NodeConfig;
use anyhow::Context;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;
use wharf_store::{RedbStore, StateStore};

/// What a wipe did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Wiped {
    /// Whether an agent was running and was killed.
    pub agent_killed: bool,
    /// Tasks destroyed (killed if they still ran).
    pub tasks_destroyed: usize,
}

/// Kills the agent of `config.data_dir` and all its tasks, then removes the directory.
pub async fn wipe(config: &NodeConfig) -> anyhow::Result<Wiped> {
    let data_dir = &config.data_dir;
    let mut wiped = Wiped::default();
    if let Some(file) = AgentFile::read(data_dir).map_err(anyhow::Error::msg)? {
        let is_agent = |cmdline: &str| cmdline.split(' ').any(|word| word == "agent");
        wiped.agent_killed =
            wharf_exec::process::kill_if(file.pid, is_agent, Duration::from_secs(10))
                .with_context(|| format!("cannot kill the agent (pid {})", file.pid))?;
    }
    // An agent that has not announced itself yet (a machine destroyed right after it was
    // made) is not in the agent file: it would take the store, or make the directory again
    // once it is removed, and outlive the wipe.
    if let Some(wanted) = identity(data_dir) {
        for pid in starting_agents(wanted) {
            // Asked again with the process held (its pidfd open): the same process.
            let still = |_: &str| agent_data_dir(pid) == Some(wanted);
            let killed = wharf_exec::process::kill_if(pid, still, Duration::from_secs(10))
                .with_context(|| format!("cannot kill the starting agent (pid {pid})"))?;
            wiped.agent_killed |= killed;
        }
    }
    let store_path = config.store_path();
    if store_path.exists() {
        let store = RedbStore::open(&store_path)?;
        let snapshot = store.load_all().await?;
        // The agent is dead, so its cgroups are free to take: every task's, and whatever else
        // is left in them, is killed and removed below.
        let task_cgroups = wipe_cgroups(config);
        let mut drivers = crate::probe::handle_readers(config, task_cgroups.clone());
        let containers = crate::container::driver(
            &config.drivers.container,
            data_dir,
            config.drivers.raw_exec.shim_path.clone(),
            &task_cgroups,
        );
        if let Some(containers) = &containers {
            drivers.register(containers.clone());
        }
        for stored in &snapshot.allocs {
            for handle in crate::probe::task_handles(stored) {
                let Some(driver) = drivers.get(&handle.driver) else { continue };
                // Gone already, or never started: nothing to kill.
                if driver.recover_task(&handle).await.is_ok() {
                    driver
                        .destroy_task(handle.id(), true)
                        .await
                        .with_context(|| format!("cannot kill task {}", handle.id()))?;
                    wiped.tasks_destroyed += 1;
                }
            }
        }
        if let Some(containers) = &containers {
            // A container runc cannot delete is no reason to keep the node: what runs in it is
            // killed with the node's cgroups below, and its mounts go with the directory.
            match containers.delete_all_containers().await {
                Ok(deleted) if !deleted.is_empty() => {
                    tracing::info!(containers = ?deleted, "deleted containers no task recorded");
                }
                Ok(_) => {}
                Err(error) => tracing::warn!(%error, "cannot delete every container; going on"),
            }
        }
        if let Some(cgroups) = task_cgroups.manager() {
            wharf_exec::destroy_cgroups(cgroups).context("cannot remove the node's cgroups")?;
        }
    }
    if data_dir.exists() {
        wharf_container::unmount_all_under(data_dir).with_context(|| {
            format!("cannot unmount what is mounted under {}", data_dir.display())
        })?;
    }
    match std::fs::remove_dir_all(data_dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e).with_context(|| format!("cannot remove {}", data_dir.display())),
    }
    Ok(wiped)
}

/// The processes started as the agent of the directory `wanted` (device and inode): `agent`
/// among their arguments (a command of the node's CLI with that word among its own is taken
/// for one too: the node is going), and the directory given by `--data-dir` or, without it,
/// by `WHARF_DATA_DIR`, as the process sees it (through its root, or its working directory
/// for a relative one). An agent configured through `--config` alone, or on the default
/// directory, is found by its agent file only.
fn starting_agents(wanted: (u64, u64)) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else { return Vec::new() };
    let own = std::process::id();
    entries
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| *pid != own && agent_data_dir(*pid) == Some(wanted))
        .collect()
}

/// The data directory (device and inode) of process `pid`, if it was started as an agent.
fn agent_data_dir(pid: u32) -> Option<(u64, u64)> {
    let proc = PathBuf::from(format!("/proc/{pid}"));
    let cmdline = std::fs::read(proc.join("cmdline")).ok()?;
    let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
    if !args.contains(&&b"agent"[..]) {
        return None;
    }
    let flag =
        args.iter().enumerate().find_map(|(at, arg)| match arg.strip_prefix(b"--data-dir") {
            Some(b"") => args.get(at + 1).copied(),
            Some(rest) => rest.strip_prefix(b"="),
            None => None,
        });
    let environ;
    let given = match flag {
        Some(dir) => dir,
        None => {
            environ = std::fs::read(proc.join("environ")).ok()?;
            environ.split(|b| *b == 0).find_map(|var| var.strip_prefix(b"WHARF_DATA_DIR="))?
        }
    };
    let given = Path::new(std::ffi::OsStr::from_bytes(given));
    identity(&match given.strip_prefix("/") {
        Ok(below_root) => proc.join("root").join(below_root),
        Err(_) => proc.join("cwd").join(given),
    })
}

/// A path's device and inode.
fn identity(path: &Path) -> Option<(u64, u64)> {
    std::fs::metadata(path).ok().map(|meta| (meta.dev(), meta.ino()))
}

/// The node's cgroups, as its agent had them (the node's configuration with the data
/// directory as the agent saw it), so that the wipe can kill and remove them.
fn wipe_cgroups(config: &NodeConfig) -> wharf_exec::TaskCgroups {
    let mut config = config.clone();
    if let Ok(canonical) = config.data_dir.canonicalize() {
        config.data_dir = canonical;
    }
    match wharf_isolate::Host::detect() {
        Ok(host) => {
            let resources = crate::resources::NodeResources::new(&config, &host);
            crate::resources::task_cgroups(&config, &resources)
        }
        Err(error) => wharf_exec::TaskCgroups::Off { reason: error.to_string() },
    }
}
