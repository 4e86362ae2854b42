//! Host volumes: directories of the node that a node's config offers by name
//! (`[host_volume.NAME]`), a group asks for (`volume`) and its tasks mount (`volume_mount`),
//! as Nomad's host volumes; and how a task's mounts resolve against what the node offers.

use crate::problems::Problems;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::PathBuf;

/// A directory the node offers, from its config's `[host_volume.NAME]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostVolume {
    /// The directory on the node.
    pub path: PathBuf,
    /// Tasks may only read it.
    #[serde(default)]
    pub read_only: bool,
}

/// What a group asks for: `[group.volume.NAME]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VolumeRequest {
    /// Only `host` volumes exist on a node.
    #[serde(rename = "type", default)]
    pub kind: VolumeKind,
    /// The node's host volume, by the name its config gives it.
    pub source: String,
    /// The group only reads it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub read_only: bool,
}

/// The kinds of volume.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum VolumeKind {
    /// A directory of the node.
    #[default]
    Host,
}

/// Where a task mounts one of its group's volumes: `[[group.task.volume_mount]]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VolumeMount {
    /// The group's volume, by its name in `volume`.
    pub volume: String,
    /// Where the task sees it (for drivers with a file system of their own; process drivers
    /// give the task the node's path in `WHARF_VOLUME_<NAME>`).
    pub destination: String,
    /// The task only reads it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub read_only: bool,
}

/// A task's mount resolved against the node: the node's directory and whether it is
/// read-only (if the node's volume, the group's request or the mount says so).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolvedMount {
    /// The group's name for the volume.
    pub volume: String,
    /// The node's directory.
    pub source: PathBuf,
    /// Where the task asked to see it.
    pub destination: String,
    /// Whether it may only be read.
    pub read_only: bool,
}

/// The environment variable that gives a process task the path of its mount of `volume`:
/// `WHARF_VOLUME_<NAME>`, the name upper-cased with `-` as `_`.
pub fn env_name(volume: &str) -> String {
    format!("WHARF_VOLUME_{}", volume.to_ascii_uppercase().replace('-', "_"))
}

/// Why a group's volumes cannot be had on a node offering `offered`: the first volume asked
/// for that the node does not have, or that the group would write to and the node offers
/// read-only. `at` names the group's field path.
pub fn check_offered(
    at: &str,
    volumes: &BTreeMap<String, VolumeRequest>,
    writers: impl Fn(&str) -> bool,
    offered: &BTreeMap<String, HostVolume>,
) -> Result<(), String> {
    for (name, request) in volumes {
        let Some(host) = offered.get(&request.source) else {
            return Err(format!(
                "{at}.volume.{name}: the node has no host volume {:?}",
                request.source
            ));
        };
        if host.read_only && !request.read_only && writers(name) {
            return Err(format!(
                "{at}.volume.{name}: host volume {:?} is read-only on this node; ask for it with read_only = true",
                request.source
            ));
        }
    }
    Ok(())
}

/// Resolves a task's `mounts` of the group's `volumes` against the node's `offered` ones.
pub fn resolve(
    volumes: &BTreeMap<String, VolumeRequest>,
    mounts: &[VolumeMount],
    offered: &BTreeMap<String, HostVolume>,
) -> Result<Vec<ResolvedMount>, String> {
    mounts
        .iter()
        .map(|mount| {
            let request = volumes
                .get(&mount.volume)
                .ok_or_else(|| format!("the group has no volume {:?}", mount.volume))?;
            let host = offered
                .get(&request.source)
                .ok_or_else(|| format!("the node has no host volume {:?}", request.source))?;
            Ok(ResolvedMount {
                volume: mount.volume.clone(),
                source: host.path.clone(),
                destination: mount.destination.clone(),
                read_only: host.read_only || request.read_only || mount.read_only,
            })
        })
        .collect()
}

/// Adds the problems of a group's volumes (at `at`) and of its tasks' mounts of them, given as
/// `(task field path, mounts)`.
pub(crate) fn validate<'a>(
    problems: &mut Problems,
    at: &str,
    volumes: &BTreeMap<String, VolumeRequest>,
    tasks: impl Iterator<Item = (String, &'a [VolumeMount])>,
) {
    for (name, request) in volumes {
        let valid = (1..=64).contains(&name.len())
            && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
        if !valid {
            problems
                .add(&format!("{at}.volume"), format!("{name:?} must match [A-Za-z0-9_-]{{1,64}}"));
        }
        if request.source.is_empty() {
            problems.add(
                &format!("{at}.volume.{name}.source"),
                "names the node's host volume; it cannot be empty".into(),
            );
        }
    }
    for (task_at, mounts) in tasks {
        for (mi, mount) in mounts.iter().enumerate() {
            let at = format!("{task_at}.volume_mount[{mi}]");
            match volumes.get(&mount.volume) {
                None => problems.add(
                    &format!("{at}.volume"),
                    format!("the group has no volume {:?}", mount.volume),
                ),
                Some(request) if request.read_only && !mount.read_only => problems.add(
                    &format!("{at}.read_only"),
                    format!(
                        "volume {:?} is read-only in the group; set read_only = true",
                        mount.volume
                    ),
                ),
                Some(_) => {}
            }
            if mount.destination.is_empty() || mount.destination.contains('\0') {
                problems.add(&format!("{at}.destination"), "must be a path".into());
            }
        }
    }
}
