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
    let manager = cgroups.manager()?;
    let relatives: Vec<PathBuf> =
        manager.parents().iter().filter_map(|parent| from_hierarchy_root(parent)).collect();
    let first = relatives.first()?;
    if relatives.iter().any(|r| r != first) {
        tracing::warn!(
            ?relatives,
            "the task cgroups' parent differs between hierarchies; the runtime uses the first"
        );
    }
    Some(format!("/{}/{}", first.display(), cgroup_name(task_id)))
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
