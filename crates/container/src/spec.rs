//! The OCI runtime spec (`config.json`) of one container: the image's config merged with the
//! task's by Docker's rules, and Docker's defaults for what the container may do.
//!
//! - Command: the task's `entrypoint` replaces the image's `Entrypoint` and drops its `Cmd`;
//!   `command` (with `args`) replaces the `Cmd`; `args` alone replace the `Cmd` too.
//! - Environment: the image's `Env`, then the task's over it (but a `PATH` the image sets
//!   stays unless the task names another), with wharf's directory variables pointing at the
//!   paths inside the container (`/alloc`, `/local`, `/secrets`, mounted as Nomad mounts
//!   them).
//! - Working directory and user: the task's, else the image's, else `/` and root. A user
//!   name is looked up in the image's `/etc/passwd`.
//! - Defaults as Docker's: its capability set, `no_new_privs`, its seccomp profile (see
//!   [`crate::seccomp`]), its masked and read-only `/proc` and `/sys` paths, the runtime's
//!   minimal `/dev` behind a deny-all device rule,
//!   private PID, IPC and mount namespaces, and the network and hostname of the node unless
//!   `network_mode = "none"`.

use crate::config::{ContainerConfig, NetworkMode};
use crate::error::ContainerError;
use oci_spec::image::ImageConfiguration;
use oci_spec::runtime::{
    Capability, LinuxCapabilities, LinuxDeviceCgroup, LinuxNamespace, LinuxNamespaceType,
    LinuxResources, Mount, Process, Root, Spec, User,
};
use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::str::FromStr;
use wharf_driver::TaskConfig;

/// Docker's default capabilities.
pub const DEFAULT_CAPABILITIES: &[&str] = &[
    "CHOWN",
    "DAC_OVERRIDE",
    "FSETID",
    "FOWNER",
    "MKNOD",
    "NET_RAW",
    "SETGID",
    "SETUID",
    "SETFCAP",
    "SETPCAP",
    "NET_BIND_SERVICE",
    "SYS_CHROOT",
    "KILL",
    "AUDIT_WRITE",
];

/// Docker's masked paths: hidden from the container.
pub const MASKED_PATHS: &[&str] = &[
    "/proc/asound",
    "/proc/acpi",
    "/proc/kcore",
    "/proc/keys",
    "/proc/latency_stats",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/proc/sched_debug",
    "/proc/scsi",
    "/sys/firmware",
    "/sys/devices/virtual/powercap",
];

/// Docker's read-only paths.
pub const READONLY_PATHS: &[&str] =
    &["/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"];

/// Where the allocation's directories appear inside the container.
pub const ALLOC_TARGET: &str = "/alloc";
/// The task's `local/` directory inside the container.
pub const LOCAL_TARGET: &str = "/local";
/// The task's `secrets/` directory inside the container.
pub const SECRETS_TARGET: &str = "/secrets";

const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// What a container's spec is made from.
#[derive(Debug)]
pub struct SpecInputs<'a> {
    /// The task.
    pub task: &'a TaskConfig,
    /// Its `config` block.
    pub config: &'a ContainerConfig,
    /// The image's config.
    pub image: &'a ImageConfiguration,
    /// The mounted root filesystem (for user names, and as `root.path`).
    pub rootfs: &'a Path,
    /// The task's cgroup, as the runtime names it (`/` + path from the hierarchy's root).
    pub cgroups_path: Option<String>,
    /// Host mounts, each already checked against the node's allowed directories.
    pub host_mounts: &'a [(PathBuf, PathBuf, bool)],
}

/// The container's spec.
pub fn build(inputs: &SpecInputs<'_>) -> Result<Spec, ContainerError> {
    let SpecInputs { task, config, image, rootfs, .. } = inputs;
    let image_config = image.config().clone().unwrap_or_default();
    let args =
        command_line(config, image_config.entrypoint().as_deref(), image_config.cmd().as_deref())?;
    let env = environment(task, image_config.env().as_deref().unwrap_or_default());
    let cwd = config
        .work_dir
        .clone()
        .or_else(|| image_config.working_dir().clone().filter(|d| !d.is_empty()))
        .unwrap_or_else(|| "/".into());
    let user_text = config.user.clone().or_else(|| image_config.user().clone()).unwrap_or_default();
    let user = resolve_user(rootfs, &user_text)?;
    let capabilities = capabilities(config)?;
    let seccomp = config.seccomp().filter(&capabilities)?;

    let mut process = Process::default();
    process.set_terminal(Some(false));
    process.set_args(Some(args));
    process.set_env(Some(env));
    process.set_cwd(PathBuf::from(cwd));
    process.set_user(user);
    process.set_no_new_privileges(Some(config.no_new_privileges()));
    process.set_rlimits(None);
    let mut caps = LinuxCapabilities::default();
    caps.set_bounding(Some(capabilities.clone()));
    caps.set_effective(Some(capabilities.clone()));
    caps.set_permitted(Some(capabilities));
    caps.set_inheritable(None);
    caps.set_ambient(None);
    process.set_capabilities(Some(caps));

    let mut root = Root::default();
    root.set_path(rootfs.to_path_buf());
    root.set_readonly(Some(config.readonly_rootfs));

    let mut spec = Spec::default();
    spec.set_process(Some(process));
    spec.set_root(Some(root));
    spec.set_hostname(match config.network_mode {
        NetworkMode::Host => None,
        NetworkMode::None => Some(task.task_name.clone()),
    });
    spec.set_mounts(Some(mounts(inputs)));
    spec.set_annotations(None);

    let mut linux = spec.linux().clone().unwrap_or_default();
    let mut namespaces =
        vec![LinuxNamespaceType::Pid, LinuxNamespaceType::Ipc, LinuxNamespaceType::Mount];
    if config.network_mode == NetworkMode::None {
        namespaces.extend([LinuxNamespaceType::Network, LinuxNamespaceType::Uts]);
    }
    linux.set_namespaces(Some(
        namespaces
            .into_iter()
            .map(|typ| {
                let mut namespace = LinuxNamespace::default();
                namespace.set_typ(typ);
                namespace
            })
            .collect(),
    ));
    let mut deny_all = LinuxDeviceCgroup::default();
    deny_all.set_allow(false);
    deny_all.set_access(Some("rwm".into()));
    let mut resources = LinuxResources::default();
    resources.set_devices(Some(vec![deny_all]));
    linux.set_resources(Some(resources));
    linux.set_cgroups_path(inputs.cgroups_path.as_ref().map(PathBuf::from));
    linux.set_masked_paths(Some(MASKED_PATHS.iter().map(|p| (*p).to_owned()).collect()));
    linux.set_readonly_paths(Some(READONLY_PATHS.iter().map(|p| (*p).to_owned()).collect()));
    linux.set_seccomp(seccomp);
    spec.set_linux(Some(linux));
    Ok(spec)
}

/// The process's argv by Docker's rules.
fn command_line(
    config: &ContainerConfig,
    image_entrypoint: Option<&[String]>,
    image_cmd: Option<&[String]>,
) -> Result<Vec<String>, ContainerError> {
    let entrypoint: Vec<String> = match &config.entrypoint {
        Some(entrypoint) => entrypoint.clone(),
        None => image_entrypoint.unwrap_or_default().to_vec(),
    };
    let cmd: Vec<String> = match (&config.command, config.args.is_empty()) {
        (Some(command), _) => {
            std::iter::once(command.clone()).chain(config.args.iter().cloned()).collect()
        }
        (None, false) => config.args.clone(),
        (None, true) if config.entrypoint.is_some() => Vec::new(),
        (None, true) => image_cmd.unwrap_or_default().to_vec(),
    };
    let argv: Vec<String> = entrypoint.into_iter().chain(cmd).collect();
    if argv.is_empty() {
        return Err(ContainerError::InvalidConfig {
            field: "config.command".into(),
            reason: "the image has no Entrypoint or Cmd, and the task names no command".into(),
        });
    }
    if argv.iter().any(|a| a.contains('\0')) {
        return Err(ContainerError::InvalidConfig {
            field: "config.args".into(),
            reason: "an argument holds a NUL byte".into(),
        });
    }
    Ok(argv)
}

/// The image's environment with the task's over it.
fn environment(task: &TaskConfig, image_env: &[String]) -> Vec<String> {
    let mut env: BTreeMap<String, String> = image_env
        .iter()
        .filter_map(|entry| entry.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
    let image_path = env.get("PATH").cloned();
    for (name, value) in &task.env {
        env.insert(name.clone(), value.clone());
    }
    // The node's default PATH is the host's: a PATH of the image's own describes the image.
    if let Some(path) = image_path
        && task.env.get("PATH").is_none_or(|p| p == wharf_exec::config::DEFAULT_PATH)
    {
        env.insert("PATH".into(), path);
    }
    env.entry("PATH".into()).or_insert_with(|| DEFAULT_PATH.into());
    for (name, target) in [
        ("WHARF_ALLOC_DIR", ALLOC_TARGET),
        ("WHARF_TASK_DIR", LOCAL_TARGET),
        ("WHARF_SECRETS_DIR", SECRETS_TARGET),
    ] {
        if env.contains_key(name) {
            env.insert(name.into(), target.into());
        }
    }
    env.into_iter().map(|(k, v)| format!("{k}={v}")).collect()
}

/// Docker's default capabilities with the task's `cap_add` and `cap_drop`.
fn capabilities(config: &ContainerConfig) -> Result<HashSet<Capability>, ContainerError> {
    let parse = |field: &str, name: &str| -> Result<Capability, ContainerError> {
        let upper = name.to_ascii_uppercase();
        let bare = upper.strip_prefix("CAP_").unwrap_or(&upper);
        Capability::from_str(bare).map_err(|_| ContainerError::InvalidConfig {
            field: format!("config.{field}"),
            reason: format!("{name:?} is not a Linux capability"),
        })
    };
    let is_all = |name: &String| name.eq_ignore_ascii_case("ALL");
    let mut set: HashSet<Capability> = if config.cap_drop.iter().any(is_all) {
        HashSet::new()
    } else {
        DEFAULT_CAPABILITIES.iter().map(|c| parse("cap_add", c)).collect::<Result<_, _>>()?
    };
    for name in config.cap_drop.iter().filter(|n| !is_all(n)) {
        set.remove(&parse("cap_drop", name)?);
    }
    for name in &config.cap_add {
        if is_all(name) {
            set.extend(all_capabilities());
        } else {
            set.insert(parse("cap_add", name)?);
        }
    }
    Ok(set)
}

fn all_capabilities() -> impl Iterator<Item = Capability> {
    // Every capability this kernel has: `cap_last_cap` numbers them.
    let last: u32 = std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
        .ok()
        .and_then(|t| t.trim().parse().ok())
        .unwrap_or(40);
    (0..=last).filter_map(|n| {
        serde_json::from_value(serde_json::Value::String(capability_name(n)?.into())).ok()
    })
}

fn capability_name(number: u32) -> Option<&'static str> {
    const NAMES: &[&str] = &[
        "CAP_CHOWN",
        "CAP_DAC_OVERRIDE",
        "CAP_DAC_READ_SEARCH",
        "CAP_FOWNER",
        "CAP_FSETID",
        "CAP_KILL",
        "CAP_SETGID",
        "CAP_SETUID",
        "CAP_SETPCAP",
        "CAP_LINUX_IMMUTABLE",
        "CAP_NET_BIND_SERVICE",
        "CAP_NET_BROADCAST",
        "CAP_NET_ADMIN",
        "CAP_NET_RAW",
        "CAP_IPC_LOCK",
        "CAP_IPC_OWNER",
        "CAP_SYS_MODULE",
        "CAP_SYS_RAWIO",
        "CAP_SYS_CHROOT",
        "CAP_SYS_PTRACE",
        "CAP_SYS_PACCT",
        "CAP_SYS_ADMIN",
        "CAP_SYS_BOOT",
        "CAP_SYS_NICE",
        "CAP_SYS_RESOURCE",
        "CAP_SYS_TIME",
        "CAP_SYS_TTY_CONFIG",
        "CAP_MKNOD",
        "CAP_LEASE",
        "CAP_AUDIT_WRITE",
        "CAP_AUDIT_CONTROL",
        "CAP_SETFCAP",
        "CAP_MAC_OVERRIDE",
        "CAP_MAC_ADMIN",
        "CAP_SYSLOG",
        "CAP_WAKE_ALARM",
        "CAP_BLOCK_SUSPEND",
        "CAP_AUDIT_READ",
        "CAP_PERFMON",
        "CAP_BPF",
        "CAP_CHECKPOINT_RESTORE",
    ];
    NAMES.get(number as usize).copied()
}

/// The runtime's default mounts (`/proc`, a tmpfs `/dev`, `/dev/pts`, `/dev/shm`,
/// `/dev/mqueue`, a read-only `/sys`), the allocation's directories, and the host mounts.
fn mounts(inputs: &SpecInputs<'_>) -> Vec<Mount> {
    let mut mounts: Vec<Mount> = oci_spec::runtime::get_default_mounts()
        .into_iter()
        .filter(|m| m.destination() != Path::new("/sys/fs/cgroup"))
        .collect();
    let task_dir = &inputs.task.task_dir;
    let binds = [
        (inputs.task.alloc_dir.clone(), PathBuf::from(ALLOC_TARGET), false),
        (task_dir.join("local"), PathBuf::from(LOCAL_TARGET), false),
        (task_dir.join("secrets"), PathBuf::from(SECRETS_TARGET), false),
    ];
    for (source, target, readonly) in binds.iter().chain(inputs.host_mounts) {
        let mut mount = Mount::default();
        mount.set_destination(target.clone());
        mount.set_typ(Some("bind".into()));
        mount.set_source(Some(source.clone()));
        let mut options = vec!["rbind".to_owned(), "rprivate".to_owned()];
        if *readonly {
            options.push("ro".into());
        }
        mount.set_options(Some(options));
        mounts.push(mount);
    }
    mounts
}

/// `uid[:gid]` or a name (with an optional `:group`) of the image's `/etc/passwd`.
fn resolve_user(rootfs: &Path, text: &str) -> Result<User, ContainerError> {
    let mut user = User::default();
    if text.is_empty() {
        return Ok(user);
    }
    let bad =
        |reason: String| ContainerError::InvalidConfig { field: "config.user".into(), reason };
    let (name, group) = match text.split_once(':') {
        Some((name, group)) => (name, Some(group)),
        None => (text, None),
    };
    let passwd = read_image_file(rootfs, "etc/passwd");
    let (uid, primary_gid) = match name.parse::<u32>() {
        Ok(uid) => {
            (uid, lookup(&passwd, |f| f[2] == name).and_then(|f| f[3].parse().ok()).unwrap_or(0))
        }
        Err(_) => {
            let fields = lookup(&passwd, |f| f[0] == name)
                .ok_or_else(|| bad(format!("no user {name:?} in the image's /etc/passwd")))?;
            let uid = fields[2].parse().map_err(|_| bad(format!("user {name:?} has a bad uid")))?;
            (uid, fields[3].parse().unwrap_or(0))
        }
    };
    let gid = match group {
        None => primary_gid,
        Some(group) => match group.parse::<u32>() {
            Ok(gid) => gid,
            Err(_) => {
                let groups = read_image_file(rootfs, "etc/group");
                lookup(&groups, |f| f[0] == group)
                    .and_then(|f| f[2].parse().ok())
                    .ok_or_else(|| bad(format!("no group {group:?} in the image's /etc/group")))?
            }
        },
    };
    user.set_uid(uid);
    user.set_gid(gid);
    Ok(user)
}

fn lookup(file: &str, matches: impl Fn(&[&str]) -> bool) -> Option<Vec<String>> {
    file.lines()
        .map(|line| line.split(':').collect::<Vec<_>>())
        .find(|fields| fields.len() >= 4 && matches(fields))
        .map(|fields| fields.into_iter().map(str::to_owned).collect())
}

/// A small file of the image, read only if no part of its path is a symlink (which would be
/// followed on the node, outside the container's root).
fn read_image_file(rootfs: &Path, relative: &str) -> String {
    let mut path = rootfs.to_path_buf();
    for part in relative.split('/') {
        path.push(part);
        if std::fs::symlink_metadata(&path).map_or(true, |m| m.file_type().is_symlink()) {
            return String::new();
        }
    }
    std::fs::read_to_string(&path).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(value: serde_json::Value) -> ContainerConfig {
        let mut value = value;
        value["image"] = "oci:/x".into();
        ContainerConfig::parse(value.as_object().unwrap()).unwrap()
    }

    fn strings(items: &[&str]) -> Vec<String> {
        items.iter().map(|s| (*s).to_owned()).collect()
    }

    /// Docker's rules: an entrypoint of the task's drops the image's Cmd; a command or args
    /// replace the Cmd; the image's Entrypoint stays unless replaced.
    #[test]
    fn commands_merge_by_dockers_rules() {
        let entry = strings(&["/entry"]);
        let cmd = strings(&["default", "cmd"]);
        let cases: [(serde_json::Value, &[&str]); 5] = [
            (serde_json::json!({}), &["/entry", "default", "cmd"]),
            (serde_json::json!({"args": ["x"]}), &["/entry", "x"]),
            (
                serde_json::json!({"command": "/bin/sh", "args": ["-c", "true"]}),
                &["/entry", "/bin/sh", "-c", "true"],
            ),
            (serde_json::json!({"entrypoint": ["/bin/echo"]}), &["/bin/echo"]),
            (
                serde_json::json!({"entrypoint": ["/bin/echo"], "args": ["hi"]}),
                &["/bin/echo", "hi"],
            ),
        ];
        for (value, expected) in cases {
            let argv = command_line(&config(value.clone()), Some(&entry), Some(&cmd)).unwrap();
            assert_eq!(argv, strings(expected), "{value}");
        }
        assert!(matches!(
            command_line(&config(serde_json::json!({})), None, None),
            Err(ContainerError::InvalidConfig { field, .. }) if field == "config.command"
        ));
    }

    #[test]
    fn capabilities_start_from_dockers_set() {
        let default = capabilities(&config(serde_json::json!({}))).unwrap();
        assert_eq!(default.len(), DEFAULT_CAPABILITIES.len());
        let changed = capabilities(&config(
            serde_json::json!({"cap_add": ["net_admin"], "cap_drop": ["CAP_CHOWN"]}),
        ))
        .unwrap();
        assert!(changed.contains(&Capability::NetAdmin) && !changed.contains(&Capability::Chown));
        let none =
            capabilities(&config(serde_json::json!({"cap_drop": ["ALL"], "cap_add": ["KILL"]})))
                .unwrap();
        assert_eq!(none.into_iter().collect::<Vec<_>>(), [Capability::Kill]);
        assert!(capabilities(&config(serde_json::json!({"cap_add": ["FLY"]}))).is_err());
    }
}
