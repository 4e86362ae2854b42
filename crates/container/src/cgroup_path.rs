//! The task's cgroup as the OCI runtime names it (`linux.cgroupsPath`): its path from the root
//! of its hierarchy, so the runtime puts the container's processes into the very cgroup
//! wharf-isolate made with the task's limits, and stats, OOM reports and kills by cgroup work
//! as for the other drivers.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use wharf_exec::TaskCgroups;
use wharf_isolate::cgroup::cgroup_name;

/// `/<path of the parent from its hierarchy's root>/<task's cgroup name>`, or `None` where
/// tasks get no cgroup (the runtime then makes its own). Where the hierarchies of a v1 host
/// place the parent differently, the first hierarchy's place is used and the log says so.
pub(crate) fn cgroups_path(cgroups: &TaskCgroups, task_id: &str) -> Option<String> {
    let relatives = parent_relatives(cgroups);
    let first = relatives.first()?;
    if relatives.iter().any(|r| r != first) {
        tracing::warn!(
            ?relatives,
            "the task cgroups' parent differs between hierarchies; the runtime uses the first"
        );
    }
    Some(format!("/{}/{}", first.display(), cgroup_name(task_id)))
}

/// The node's parent in each hierarchy, from that hierarchy's root.
fn parent_relatives(cgroups: &TaskCgroups) -> Vec<PathBuf> {
    let Some(manager) = cgroups.manager() else { return Vec::new() };
    manager.parents().iter().filter_map(|parent| from_hierarchy_root(parent)).collect()
}

/// Removes the parent the runtime made in the hierarchies whose parent is not the node's own
/// (on a v1 host: blkio, devices, `name=systemd`, the hybrid's empty cgroup2, ...): the
/// runtime makes the container's path in every hierarchy mounted and removes only the
/// container's own cgroup, so without this each node would leave an empty directory in each
/// of them. Where another of the node's containers still has its cgroup there, the kernel
/// refuses, and the directory stays for the last one. The caller keeps any container from
/// being made meanwhile (the runtime makes the parent, then the container's cgroup in it).
pub(crate) fn remove_runtime_parents(cgroups: &TaskCgroups) {
    // The runtime's parent is the first hierarchy's (see `cgroups_path`).
    let (Some(manager), Some(parent)) =
        (cgroups.manager(), parent_relatives(cgroups).into_iter().next())
    else {
        return;
    };
    let Ok(made) = manager.made_outside_parents(&parent) else { return };
    for dir in made {
        match std::fs::remove_dir(&dir) {
            Ok(()) => tracing::debug!(dir = %dir.display(), "removed the runtime's cgroup parent"),
            Err(error) => {
                tracing::trace!(dir = %dir.display(), %error, "runtime's cgroup parent kept")
            }
        }
    }
}

/// `dir`'s path below the root of its cgroup hierarchy: the mount point is the highest
/// ancestor on the same filesystem.
fn from_hierarchy_root(dir: &Path) -> Option<PathBuf> {
    let device = std::fs::metadata(dir).ok()?.dev();
    let mut root = dir;
    while let Some(parent) = root.parent() {
        if std::fs::metadata(parent).ok()?.dev() != device {
            break;
        }
        root = parent;
    }
    dir.strip_prefix(root).ok().map(Path::to_path_buf)
}
