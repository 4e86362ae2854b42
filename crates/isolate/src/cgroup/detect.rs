//! Which cgroup hierarchy this host runs, where each controller is mounted, and where this
//! process's own cgroup is in it: read from `/proc/self/mountinfo` and `/proc/self/cgroup`.
//!
//! - **v2** (unified): one `cgroup2` mount holds every controller.
//! - **v1** (legacy, or hybrid with an empty `cgroup2` beside): one `cgroup` mount per
//!   controller or per group of co-mounted controllers (`cpu,cpuacct`).
//!
//! v1 is used when it has every controller wharf needs (memory, cpu, cpuacct, pids, freezer;
//! cpuset if it can), else v2 when its root offers memory, cpu and pids. A host that mixes
//! them (some controllers on each side) is refused with a reason: the layer does one or the
//! other.

use super::manager::{Controller, Version};
use crate::error::IsolateError;
use std::path::{Path, PathBuf};

/// One mounted hierarchy wharf uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Hierarchy {
    /// The controllers it carries that wharf uses (v2: all of them).
    pub(crate) controllers: Vec<Controller>,
    /// Where it is mounted: its root as this process sees it.
    pub(crate) mount: PathBuf,
    /// The directory of this process's own cgroup in it.
    pub(crate) own: PathBuf,
}

/// The hierarchies of a host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Layout {
    pub(crate) version: Version,
    pub(crate) hierarchies: Vec<Hierarchy>,
}

/// The v1 controllers a task's cgroup must have.
const V1_REQUIRED: [Controller; 5] = [
    Controller::Memory,
    Controller::Cpu,
    Controller::Cpuacct,
    Controller::Pids,
    Controller::Freezer,
];

/// A mount of `/proc/self/mountinfo` that is a cgroup hierarchy.
#[derive(Debug)]
struct Mount {
    /// The path inside the hierarchy that is mounted (not `/` in some containers).
    root: String,
    point: PathBuf,
    v2: bool,
    /// v1: the controllers in the super options (`rw,cpu,cpuacct`).
    options: Vec<String>,
}

/// Reads the layout from the two files' texts. `controllers_of` reads a v2 cgroup's
/// `cgroup.controllers` (a file read, kept out so tables can test the rest).
pub(crate) fn layout(
    mountinfo: &str,
    proc_cgroup: &str,
    controllers_of: impl Fn(&Path) -> Option<String>,
) -> Result<Layout, IsolateError> {
    let mounts: Vec<Mount> = mountinfo.lines().filter_map(parse_mount).collect();
    // "hierarchy-id:controllers:path"; the v2 line has id 0 and no controllers.
    let memberships: Vec<(Vec<&str>, &str)> = proc_cgroup
        .lines()
        .filter_map(|line| {
            let mut parts = line.splitn(3, ':');
            let (_id, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
            let names = controllers.split(',').filter(|c| !c.is_empty()).collect();
            Some((names, path))
        })
        .collect();
    let own_dir = |mount: &Mount, path: &str| -> PathBuf {
        // The process's path is relative to the hierarchy's root; the mount shows `root`.
        let inside = path.strip_prefix(mount.root.trim_end_matches('/')).unwrap_or(path);
        mount.point.join(inside.trim_start_matches('/'))
    };

    let mut v1 = Vec::new();
    for mount in mounts.iter().filter(|m| !m.v2) {
        let controllers: Vec<Controller> =
            mount.options.iter().filter_map(|o| Controller::from_name(o)).collect();
        if controllers.is_empty() {
            continue;
        }
        let Some((_, path)) = memberships
            .iter()
            .find(|(names, _)| controllers.iter().all(|c| names.contains(&c.name())))
        else {
            continue;
        };
        v1.push(Hierarchy { mount: mount.point.clone(), own: own_dir(mount, path), controllers });
    }
    let has = |c: Controller| v1.iter().any(|h| h.controllers.contains(&c));
    let missing: Vec<&str> = V1_REQUIRED.iter().filter(|c| !has(**c)).map(|c| c.name()).collect();
    if missing.is_empty() {
        return Ok(Layout { version: Version::V1, hierarchies: v1 });
    }

    let unified = mounts.iter().find(|m| m.v2).and_then(|mount| {
        let (_, path) = memberships.iter().find(|(names, _)| names.is_empty())?;
        Some((mount.point.clone(), own_dir(mount, path)))
    });
    if let Some((mount, own)) = unified {
        let own = super::v2::agent_cgroup(&own, &mount);
        let offered = controllers_of(&own).unwrap_or_default();
        let offered: Vec<&str> = offered.split_whitespace().collect();
        let needed = ["memory", "cpu", "pids"];
        let lacking: Vec<&str> = needed.iter().copied().filter(|c| !offered.contains(c)).collect();
        if lacking.is_empty() {
            let mut controllers = vec![Controller::Memory, Controller::Cpu, Controller::Pids];
            if offered.contains(&"cpuset") {
                controllers.push(Controller::Cpuset);
            }
            return Ok(Layout {
                version: Version::V2,
                hierarchies: vec![Hierarchy { mount, own, controllers }],
            });
        }
        if v1.is_empty() {
            return Err(IsolateError::Unavailable {
                reason: format!(
                    "the cgroup v2 hierarchy at {} does not offer {} to this process",
                    own.display(),
                    lacking.join(", ")
                ),
            });
        }
    }
    Err(IsolateError::Unavailable {
        reason: if v1.is_empty() {
            "no cgroup hierarchy is mounted".into()
        } else {
            format!("the cgroup v1 controllers {} are not mounted", missing.join(", "))
        },
    })
}

/// Where every cgroup hierarchy in `mountinfo` (v1 and v2) is mounted from its root; a mount
/// of a cgroup below the root is left out, as it names other cgroups by the same paths.
pub(crate) fn mount_points(mountinfo: &str) -> Vec<PathBuf> {
    mountinfo
        .lines()
        .filter_map(parse_mount)
        .filter(|mount| mount.root == "/")
        .map(|mount| mount.point)
        .collect()
}

/// One line of mountinfo, if it is a cgroup mount:
/// `36 25 0:32 / /sys/fs/cgroup/memory rw,relatime shared:15 - cgroup cgroup rw,memory`.
fn parse_mount(line: &str) -> Option<Mount> {
    let (left, right) = line.split_once(" - ")?;
    let fields: Vec<&str> = left.split(' ').collect();
    let (root, point) = (fields.get(3)?, fields.get(4)?);
    let mut right = right.split(' ');
    let fstype = right.next()?;
    let _source = right.next()?;
    let options = right.next().unwrap_or_default();
    let v2 = match fstype {
        "cgroup2" => true,
        "cgroup" => false,
        _ => return None,
    };
    Some(Mount {
        root: unescape(root),
        point: PathBuf::from(unescape(point)),
        v2,
        options: options.split(',').map(str::to_owned).collect(),
    })
}

/// mountinfo writes space, tab, newline and backslash as octal escapes (`\040`).
fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes
            .get(i + 1..i + 4)
            .filter(|digits| bytes[i] == b'\\' && digits.iter().all(|d| (b'0'..=b'7').contains(d)));
        match octal {
            Some(digits) => {
                let code = digits.iter().fold(0u32, |n, d| n * 8 + u32::from(d - b'0'));
                out.push(u8::try_from(code).unwrap_or(b'?'));
                i += 4;
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mount_points_are_those_of_both_versions_mounted_from_their_root() {
        let mountinfo = "\
25 30 0:22 / /sys/fs/cgroup ro,nosuid shared:9 - tmpfs tmpfs ro,mode=755
26 25 0:23 / /sys/fs/cgroup/unified rw,nosuid shared:10 - cgroup2 cgroup2 rw
27 25 0:24 / /sys/fs/cgroup/systemd rw,nosuid shared:11 - cgroup cgroup rw,name=systemd
31 25 0:28 / /sys/fs/cgroup/blkio rw,nosuid shared:15 - cgroup cgroup rw,blkio
32 25 0:28 /wharf /mnt/blkio-below rw,nosuid shared:15 - cgroup cgroup rw,blkio
40 30 8:1 / /mnt/cgroup rw shared:1 - ext4 /dev/sda1 rw
";
        let points = ["unified", "systemd", "blkio"].map(|h| Path::new("/sys/fs/cgroup").join(h));
        assert_eq!(mount_points(mountinfo), points);
    }

    /// This machine's kind: hybrid, v1 controllers each on their own mount, an empty unified
    /// hierarchy, and a memory cgroup that is not the root.
    const HYBRID: &str = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
34 31 0:31 / /sys/fs/cgroup/cpuset rw,relatime - cgroup cgroup rw,cpuset
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
37 31 0:34 / /sys/fs/cgroup/freezer rw,relatime - cgroup cgroup rw,freezer
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";
    const HYBRID_SELF: &str = "9:name=systemd:/\n8:pids:/\n6:freezer:/\n4:memory:/box/1\n3:cpuset:/\n2:cpuacct:/\n1:cpu:/\n0::/\n";

    const UNIFIED: &str = "\
29 23 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot
";

    fn none(_: &Path) -> Option<String> {
        None
    }

    #[test]
    fn a_hybrid_host_uses_v1_with_each_controllers_own_cgroup() {
        let layout = layout(HYBRID, HYBRID_SELF, none).unwrap();
        assert_eq!(layout.version, Version::V1);
        let dir = |c: Controller| {
            layout.hierarchies.iter().find(|h| h.controllers.contains(&c)).unwrap().own.clone()
        };
        assert_eq!(dir(Controller::Memory), PathBuf::from("/sys/fs/cgroup/memory/box/1"));
        assert_eq!(dir(Controller::Cpu), PathBuf::from("/sys/fs/cgroup/cpu"));
        assert_eq!(dir(Controller::Cpuset), PathBuf::from("/sys/fs/cgroup/cpuset"));
        assert_eq!(layout.hierarchies.len(), 6, "{layout:?}");
    }

    #[test]
    fn co_mounted_controllers_share_one_hierarchy() {
        let mountinfo = "\
1 0 0:1 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct
2 0 0:2 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory
3 0 0:3 / /sys/fs/cgroup/pids rw - cgroup cgroup rw,pids
4 0 0:4 / /sys/fs/cgroup/freezer rw - cgroup cgroup rw,freezer
";
        let own = "4:cpu,cpuacct:/a\n3:memory:/a\n2:pids:/a\n1:freezer:/a\n";
        let layout = layout(mountinfo, own, none).unwrap();
        assert_eq!(layout.version, Version::V1);
        assert_eq!(layout.hierarchies.len(), 4);
        assert_eq!(layout.hierarchies[0].controllers, vec![Controller::Cpu, Controller::Cpuacct]);
        assert_eq!(layout.hierarchies[0].own, PathBuf::from("/sys/fs/cgroup/cpu,cpuacct/a"));
        // No cpuset: tasks that reserve cores will be refused, the rest run.
        assert!(!layout.hierarchies.iter().any(|h| h.controllers.contains(&Controller::Cpuset)));
    }

    #[test]
    fn a_mount_of_a_sub_cgroup_is_followed() {
        // A container sees its own cgroup as the hierarchy's mount point.
        let mountinfo = "7 0 0:7 /ctr /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n";
        let offered = |_: &Path| Some("cpu memory pids".into());
        let node = layout(mountinfo, "0::/ctr/node\n", offered).unwrap();
        assert_eq!(node.hierarchies[0].own, PathBuf::from("/sys/fs/cgroup/node"));
        // An agent in the leaf `agent` (see `agent_cgroup`) owns the cgroup above it: here
        // the container's.
        let leaf = layout(mountinfo, "0::/ctr/agent\n", offered).unwrap();
        assert_eq!(leaf.hierarchies[0].own, PathBuf::from("/sys/fs/cgroup"));
    }

    #[test]
    fn a_unified_host_uses_v2_when_its_controllers_are_offered() {
        let offered = |dir: &Path| {
            assert_eq!(dir, Path::new("/sys/fs/cgroup/system.slice/wharf.service"));
            Some("cpuset cpu io memory hugetlb pids rdma misc\n".to_owned())
        };
        let layout = layout(UNIFIED, "0::/system.slice/wharf.service\n", offered).unwrap();
        assert_eq!(layout.version, Version::V2);
        assert_eq!(
            layout.hierarchies[0].controllers,
            vec![Controller::Memory, Controller::Cpu, Controller::Pids, Controller::Cpuset]
        );
    }

    #[test]
    fn hosts_without_what_is_needed_are_refused_with_the_reason() {
        let cases: [(&str, &str, Option<&str>, &str); 3] = [
            (UNIFIED, "0::/x\n", Some("cpu io\n"), "does not offer memory, pids"),
            ("", "", None, "no cgroup hierarchy is mounted"),
            (
                "1 0 0:1 / /c/memory rw - cgroup cgroup rw,memory\n",
                "1:memory:/\n",
                None,
                "cpu, cpuacct, pids, freezer are not mounted",
            ),
        ];
        for (mountinfo, own, offered, reason) in cases {
            let error = layout(mountinfo, own, |_| offered.map(str::to_owned)).unwrap_err();
            assert!(error.to_string().contains(reason), "{error}");
        }
    }

    #[test]
    fn escaped_mount_points_are_read() {
        let mount = parse_mount("1 0 0:1 / /a\\040b rw - cgroup2 cgroup2 rw").unwrap();
        assert_eq!(mount.point, PathBuf::from("/a b"));
        assert!(parse_mount("1 0 0:1 / /proc rw - proc proc rw").is_none());
        assert!(parse_mount("garbage").is_none());
    }
}
