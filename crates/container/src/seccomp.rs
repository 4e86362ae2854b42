//! The container's seccomp filter: by default the profile Docker gives its containers (every
//! syscall refused with `EPERM` but an allowlist, with the parts that depend on capabilities
//! following the task's `cap_add` and `cap_drop`), a profile file in Docker's format, or none.
//!
//! runc has no default filter of its own: without this, a container could call any syscall
//! its capabilities allow, `keyctl`, `userfaultfd` and new namespaces among them.
//!
//! A profile, the default one included, is kept in Docker's format ([`Profile`]): rules whose
//! `includes` and `excludes` name capabilities, architectures or a minimum kernel. Resolving it
//! for one container ([`Profile::resolve`]) keeps the rules that apply to its capability set, the
//! node's architecture and kernel, and gives the runtime spec's `linux.seccomp`.

use crate::error::ContainerError;
use oci_spec::runtime::{
    Arch, Capability, LinuxSeccomp, LinuxSeccompAction, LinuxSeccompArg, LinuxSeccompArgBuilder,
    LinuxSeccompFilterFlag, LinuxSeccompOperator, LinuxSyscall,
};
use serde::Deserialize;
use std::collections::HashSet;
use std::path::{Path, PathBuf};

/// Which filter a task's container runs under, from its `security_opt`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum SeccompChoice {
    /// Docker's default profile ([`Profile::docker_default`]).
    #[default]
    Default,
    /// No filter (`seccomp=unconfined`).
    Unconfined,
    /// A profile file in Docker's format on the node (`seccomp=/path.json`).
    File(PathBuf),
}

impl SeccompChoice {
    /// The choice a `security_opt` entry makes, if it is a `seccomp=` entry.
    pub fn from_security_opt(opt: &str) -> Option<Result<SeccompChoice, String>> {
        let value = opt.strip_prefix("seccomp=")?;
        Some(match value {
            "unconfined" => Ok(SeccompChoice::Unconfined),
            "" => Err("seccomp= names no profile (unconfined or an absolute path)".into()),
            path if path.starts_with('/') => Ok(SeccompChoice::File(PathBuf::from(path))),
            other => Err(format!("seccomp={other}: a profile is `unconfined` or an absolute path")),
        })
    }

    /// The runtime spec's filter for a container with these capabilities; `None` when
    /// unconfined.
    pub fn filter(
        &self,
        capabilities: &HashSet<Capability>,
    ) -> Result<Option<LinuxSeccomp>, ContainerError> {
        let profile = match self {
            SeccompChoice::Unconfined => return Ok(None),
            SeccompChoice::Default => Profile::docker_default(),
            SeccompChoice::File(path) => Profile::read(path)?,
        };
        Ok(Some(profile.resolve(capabilities, &Node::this())))
    }
}

/// A seccomp profile in Docker's format.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Profile {
    /// What a syscall no rule names gets.
    pub default_action: LinuxSeccompAction,
    /// The errno of the default action, when it is `SCMP_ACT_ERRNO` (default `EPERM`).
    #[serde(default)]
    pub default_errno_ret: Option<u32>,
    /// The architectures, if given directly (else from `arch_map`).
    #[serde(default)]
    pub architectures: Vec<Arch>,
    /// Per native architecture, the architectures the filter covers.
    #[serde(default)]
    pub arch_map: Vec<ArchMap>,
    /// The filter's flags.
    #[serde(default)]
    pub flags: Vec<LinuxSeccompFilterFlag>,
    /// The rules.
    #[serde(default)]
    pub syscalls: Vec<Rule>,
}

/// One native architecture and the ones its filter also covers (x86_64 runs x86 and x32
/// programs, which enter the kernel with their own syscall numbers).
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ArchMap {
    /// The native architecture.
    pub architecture: Arch,
    /// The others.
    #[serde(default)]
    pub sub_architectures: Vec<Arch>,
}

/// One rule: syscalls, an action, maybe argument conditions, and when the rule applies.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Rule {
    /// The syscalls' names.
    #[serde(default)]
    pub names: Vec<String>,
    /// One syscall's name (the older spelling).
    #[serde(default)]
    pub name: Option<String>,
    /// What they get.
    pub action: LinuxSeccompAction,
    /// The errno of an `SCMP_ACT_ERRNO` action.
    #[serde(default)]
    pub errno_ret: Option<u32>,
    /// Conditions on the arguments.
    #[serde(default)]
    pub args: Vec<LinuxSeccompArg>,
    /// The rule applies only if all of this holds.
    #[serde(default)]
    pub includes: Condition,
    /// The rule does not apply if any of this holds.
    #[serde(default)]
    pub excludes: Condition,
}

/// Capabilities, architectures (Go's names: `amd64`, `x32`, `386`...) and a minimum kernel.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    /// Capabilities (`CAP_SYS_ADMIN`).
    #[serde(default)]
    pub caps: Vec<String>,
    /// Architectures.
    #[serde(default)]
    pub arches: Vec<String>,
    /// A kernel version, `major.minor`.
    #[serde(default)]
    pub min_kernel: Option<String>,
}

/// What a profile is resolved against: the node's architecture and kernel.
#[derive(Debug, Clone)]
pub struct Node {
    /// The architecture, by Go's name (`amd64`).
    pub arch: &'static str,
    /// The seccomp architecture.
    pub seccomp_arch: Option<Arch>,
    /// The kernel's `(major, minor)`.
    pub kernel: (u32, u32),
}

impl Node {
    /// This node.
    pub fn this() -> Node {
        let (arch, seccomp_arch) = match std::env::consts::ARCH {
            "x86_64" => ("amd64", Some(Arch::ScmpArchX86_64)),
            "x86" => ("386", Some(Arch::ScmpArchX86)),
            "aarch64" => ("arm64", Some(Arch::ScmpArchAarch64)),
            "arm" => ("arm", Some(Arch::ScmpArchArm)),
            "s390x" => ("s390x", Some(Arch::ScmpArchS390x)),
            "powerpc64" => ("ppc64le", Some(Arch::ScmpArchPpc64le)),
            "riscv64" => ("riscv64", Some(Arch::ScmpArchRiscv64)),
            other => (other, None),
        };
        Node { arch, seccomp_arch, kernel: kernel_version() }
    }
}

/// The running kernel's `(major, minor)`; `(0, 0)` if `uname` says something unreadable,
/// which keeps rules that need a newer kernel out.
fn kernel_version() -> (u32, u32) {
    let mut name: libc::utsname = unsafe { std::mem::zeroed() };
    // SAFETY: uname fills the struct it is given; the release is NUL-terminated.
    if unsafe { libc::uname(&mut name) } != 0 {
        return (0, 0);
    }
    let release: Vec<u8> = name.release.iter().take_while(|c| **c != 0).map(|c| *c as u8).collect();
    parse_version(&String::from_utf8_lossy(&release)).unwrap_or((0, 0))
}

fn parse_version(text: &str) -> Option<(u32, u32)> {
    let mut parts = text.split(|c: char| !c.is_ascii_digit());
    Some((parts.next()?.parse().ok()?, parts.next()?.parse().ok()?))
}

/// The largest profile file read: Docker's own is about 20 KiB.
const MAX_PROFILE_BYTES: u64 = 1 << 20;

impl Profile {
    /// Reads a profile file in Docker's format.
    pub fn read(path: &Path) -> Result<Profile, ContainerError> {
        let invalid = |reason: String| ContainerError::InvalidConfig {
            field: "config.security_opt".into(),
            reason,
        };
        let cannot = |e: std::io::Error| {
            invalid(format!("cannot read the seccomp profile {}: {e}", path.display()))
        };
        // The path is the job's: a link, a device or a FIFO is refused (never followed, read
        // or waited on), and so is a file too large for a profile.
        use std::os::unix::fs::OpenOptionsExt;
        let file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
            .open(path)
            .map_err(cannot)?;
        if !file.metadata().map_err(cannot)?.is_file() {
            return Err(cannot(std::io::Error::other("not a regular file")));
        }
        let mut text = Vec::new();
        std::io::Read::read_to_end(
            &mut std::io::Read::take(file, MAX_PROFILE_BYTES + 1),
            &mut text,
        )
        .map_err(cannot)?;
        if text.len() as u64 > MAX_PROFILE_BYTES {
            return Err(cannot(std::io::Error::other("larger than 1 MiB")));
        }
        // Where the file goes wrong, not what it holds: it may be a file the job's author
        // cannot read otherwise.
        serde_json::from_slice(&text).map_err(|e| {
            invalid(format!(
                "{} is not a seccomp profile in Docker's format (line {}, column {})",
                path.display(),
                e.line(),
                e.column()
            ))
        })
    }

    /// The filter for a container with these capabilities on `node`.
    pub fn resolve(&self, capabilities: &HashSet<Capability>, node: &Node) -> LinuxSeccomp {
        let caps: HashSet<String> = capabilities.iter().filter_map(capability_name).collect();
        let syscalls: Vec<LinuxSyscall> = self
            .syscalls
            .iter()
            .filter(|rule| rule.applies(&caps, node))
            .map(Rule::to_runtime)
            .collect();
        let mut filter = LinuxSeccomp::default();
        filter.set_default_action(self.default_action);
        filter.set_default_errno_ret(match self.default_action {
            LinuxSeccompAction::ScmpActErrno => Some(self.default_errno_ret.unwrap_or(EPERM)),
            _ => self.default_errno_ret,
        });
        filter.set_architectures(Some(self.architectures(node)).filter(|a| !a.is_empty()));
        filter.set_flags(Some(self.flags.clone()).filter(|f| !f.is_empty()));
        filter.set_syscalls(Some(syscalls));
        filter
    }

    fn architectures(&self, node: &Node) -> Vec<Arch> {
        if !self.architectures.is_empty() {
            return self.architectures.clone();
        }
        self.arch_map
            .iter()
            .find(|map| Some(map.architecture) == node.seccomp_arch)
            .map(|map| {
                std::iter::once(map.architecture)
                    .chain(map.sub_architectures.iter().copied())
                    .collect()
            })
            .unwrap_or_default()
    }
}

fn capability_name(capability: &Capability) -> Option<String> {
    match serde_json::to_value(capability) {
        Ok(serde_json::Value::String(name)) => Some(name),
        _ => None,
    }
}

impl Rule {
    /// Docker's rules: every `includes` condition holds, no `excludes` condition does.
    fn applies(&self, caps: &HashSet<String>, node: &Node) -> bool {
        let has_cap = |name: &String| caps.contains(&name.to_ascii_uppercase());
        let kernel_at_least =
            |min: &String| parse_version(min).is_some_and(|min| node.kernel >= min);
        let on_arch = |arches: &Vec<String>| arches.iter().any(|a| a == node.arch);
        let included = self.includes.caps.iter().all(has_cap)
            && (self.includes.arches.is_empty() || on_arch(&self.includes.arches))
            && self.includes.min_kernel.as_ref().is_none_or(kernel_at_least);
        let excluded = self.excludes.caps.iter().any(has_cap)
            || on_arch(&self.excludes.arches)
            || self.excludes.min_kernel.as_ref().is_some_and(kernel_at_least);
        included && !excluded
    }

    fn to_runtime(&self) -> LinuxSyscall {
        let mut syscall = LinuxSyscall::default();
        syscall.set_names(self.names.iter().chain(&self.name).cloned().collect());
        syscall.set_action(self.action);
        syscall.set_errno_ret(self.errno_ret);
        syscall.set_args(Some(self.args.clone()).filter(|a| !a.is_empty()));
        syscall
    }
}

const EPERM: u32 = libc::EPERM as u32;

/// Syscalls Docker's default profile allows every container. Left out, so refused with
/// `EPERM`: the key store (`add_key`, `keyctl`, `request_key`), `userfaultfd`, kernel modules,
/// clocks, accounting, swap, `reboot`, namespaces and mounts, `bpf`, `perf_event_open`,
/// `ptrace` and other processes' memory (unless a capability below grants them), and
/// `io_uring` (left out of Docker's later profiles after its exploits).
#[rustfmt::skip]
pub const ALLOWED: &[&str] = &[
    // Files and directories.
    "access", "chdir", "chmod", "chown", "chown32", "close", "close_range", "copy_file_range",
    "creat", "dup", "dup2", "dup3", "faccessat", "faccessat2", "fadvise64", "fadvise64_64",
    "fallocate", "fchdir", "fchmod", "fchmodat", "fchmodat2", "fchown", "fchown32", "fchownat",
    "fcntl", "fcntl64", "fdatasync", "fgetxattr", "flistxattr", "flock", "fremovexattr",
    "fsetxattr", "fstat", "fstat64", "fstatat64", "fstatfs", "fstatfs64", "fsync", "ftruncate",
    "ftruncate64", "futimesat", "getcwd", "getdents", "getdents64", "getxattr", "lchown",
    "lchown32", "lgetxattr", "link", "linkat", "listxattr", "llistxattr", "_llseek",
    "lremovexattr", "lseek", "lsetxattr", "lstat", "lstat64", "mkdir", "mkdirat", "mknod",
    "mknodat", "newfstatat", "open", "openat", "openat2", "pread64", "preadv", "preadv2",
    "pwrite64", "pwritev", "pwritev2", "read", "readahead", "readlink", "readlinkat", "readv",
    "removexattr", "rename", "renameat", "renameat2", "rmdir", "sendfile", "sendfile64",
    "setxattr", "splice", "stat", "stat64", "statfs", "statfs64", "statx", "symlink",
    "symlinkat", "sync", "sync_file_range", "syncfs", "tee", "truncate", "truncate64", "umask",
    "unlink", "unlinkat", "utime", "utimensat", "utimensat_time64", "utimes", "vmsplice",
    "write", "writev",
    // File events and asynchronous I/O.
    "epoll_create", "epoll_create1", "epoll_ctl", "epoll_ctl_old", "epoll_pwait",
    "epoll_pwait2", "epoll_wait", "epoll_wait_old", "eventfd", "eventfd2", "fanotify_mark",
    "inotify_add_watch", "inotify_init", "inotify_init1", "inotify_rm_watch", "io_cancel",
    "io_destroy", "io_getevents", "io_pgetevents", "io_pgetevents_time64", "io_setup",
    "io_submit", "ioctl", "ioprio_get", "ioprio_set", "_newselect", "pipe", "pipe2", "poll",
    "ppoll", "ppoll_time64", "pselect6", "pselect6_time64", "select", "signalfd", "signalfd4",
    "timerfd_create", "timerfd_gettime", "timerfd_gettime64", "timerfd_settime",
    "timerfd_settime64",
    // Memory.
    "brk", "cachestat", "madvise", "map_shadow_stack", "membarrier", "memfd_create",
    "memfd_secret", "mincore", "mlock", "mlock2", "mlockall", "mmap", "mmap2", "mprotect",
    "mremap", "msync", "munlock", "munlockall", "munmap", "pkey_alloc", "pkey_free",
    "pkey_mprotect", "remap_file_pages",
    // Processes, threads, signals, scheduling.
    "capget", "capset", "execve", "execveat", "exit", "exit_group", "fork", "futex",
    "futex_requeue", "futex_time64", "futex_wait", "futex_waitv", "futex_wake", "get_robust_list",
    "get_thread_area", "getcpu", "getegid", "getegid32", "geteuid", "geteuid32", "getgid",
    "getgid32", "getgroups", "getgroups32", "getitimer", "getpgid", "getpgrp", "getpid",
    "getppid", "getpriority", "getrandom", "getresgid", "getresgid32", "getresuid",
    "getresuid32", "getrlimit", "getrusage", "getsid", "gettid", "getuid", "getuid32", "kill",
    "landlock_add_rule", "landlock_create_ruleset", "landlock_restrict_self", "pause",
    "pidfd_open", "pidfd_send_signal", "prctl", "prlimit64", "process_mrelease",
    "restart_syscall", "rseq", "rt_sigaction", "rt_sigpending", "rt_sigprocmask",
    "rt_sigqueueinfo", "rt_sigreturn", "rt_sigsuspend", "rt_sigtimedwait",
    "rt_sigtimedwait_time64", "rt_tgsigqueueinfo", "sched_get_priority_max",
    "sched_get_priority_min", "sched_getaffinity", "sched_getattr", "sched_getparam",
    "sched_getscheduler", "sched_rr_get_interval", "sched_rr_get_interval_time64",
    "sched_setaffinity", "sched_setattr", "sched_setparam", "sched_setscheduler", "sched_yield",
    "seccomp", "set_robust_list", "set_thread_area", "set_tid_address", "setfsgid",
    "setfsgid32", "setfsuid", "setfsuid32", "setgid", "setgid32", "setgroups", "setgroups32",
    "setitimer", "setpgid", "setpriority", "setregid", "setregid32", "setresgid", "setresgid32",
    "setresuid", "setresuid32", "setreuid", "setreuid32", "setrlimit", "setsid", "setuid",
    "setuid32", "sigaltstack", "sigprocmask", "sigreturn", "tgkill", "tkill", "ugetrlimit",
    "vfork", "wait4", "waitid", "waitpid",
    // Time.
    "adjtimex", "alarm", "clock_adjtime", "clock_adjtime64", "clock_getres",
    "clock_getres_time64", "clock_gettime", "clock_gettime64", "clock_nanosleep",
    "clock_nanosleep_time64", "gettimeofday", "nanosleep", "time", "timer_create",
    "timer_delete", "timer_getoverrun", "timer_gettime", "timer_gettime64", "timer_settime",
    "timer_settime64", "times",
    // Sockets.
    "accept", "accept4", "bind", "connect", "getpeername", "getsockname", "getsockopt",
    "listen", "recv", "recvfrom", "recvmmsg", "recvmmsg_time64", "recvmsg", "send", "sendmmsg",
    "sendmsg", "sendto", "setsockopt", "shutdown", "socket", "socketcall", "socketpair",
    // System V and POSIX IPC.
    "ipc", "mq_getsetattr", "mq_notify", "mq_open", "mq_timedreceive", "mq_timedreceive_time64",
    "mq_timedsend", "mq_timedsend_time64", "mq_unlink", "msgctl", "msgget", "msgrcv", "msgsnd",
    "semctl", "semget", "semop", "semtimedop", "semtimedop_time64", "shmat", "shmctl", "shmdt",
    "shmget",
    // The system, read.
    "sysinfo", "uname",
];

/// Syscalls allowed only to a container that holds a capability (through `cap_add`), as
/// Docker's default profile grants them: the capability's own syscalls, no more.
#[rustfmt::skip]
pub const ALLOWED_WITH_CAPABILITY: &[(&str, &[&str])] = &[
    ("CAP_DAC_READ_SEARCH", &["open_by_handle_at"]),
    (
        "CAP_SYS_ADMIN",
        &[
            "bpf", "clone", "clone3", "fanotify_init", "fsconfig", "fsmount", "fsopen", "fspick",
            "lookup_dcookie", "mount", "mount_setattr", "move_mount", "name_to_handle_at",
            "open_tree", "perf_event_open", "quotactl", "quotactl_fd", "setdomainname",
            "sethostname", "setns", "syslog", "umount", "umount2", "unshare",
        ],
    ),
    ("CAP_SYS_BOOT", &["reboot"]),
    ("CAP_SYS_CHROOT", &["chroot"]),
    ("CAP_SYS_MODULE", &["delete_module", "init_module", "finit_module"]),
    ("CAP_SYS_PACCT", &["acct"]),
    (
        "CAP_SYS_PTRACE",
        &["kcmp", "pidfd_getfd", "process_madvise", "process_vm_readv", "process_vm_writev", "ptrace"],
    ),
    ("CAP_SYS_RAWIO", &["iopl", "ioperm"]),
    ("CAP_SYS_TIME", &["settimeofday", "stime", "clock_settime", "clock_settime64"]),
    ("CAP_SYS_TTY_CONFIG", &["vhangup"]),
    ("CAP_SYS_NICE", &["get_mempolicy", "mbind", "set_mempolicy", "set_mempolicy_home_node"]),
    ("CAP_SYSLOG", &["syslog"]),
    ("CAP_BPF", &["bpf"]),
    ("CAP_PERFMON", &["perf_event_open"]),
];

/// The namespace flags of `clone`: without `CAP_SYS_ADMIN` a container may fork and make
/// threads, but not make namespaces.
const CLONE_NAMESPACE_FLAGS: u64 = (libc::CLONE_NEWNS
    | libc::CLONE_NEWUTS
    | libc::CLONE_NEWIPC
    | libc::CLONE_NEWUSER
    | libc::CLONE_NEWPID
    | libc::CLONE_NEWNET
    | libc::CLONE_NEWCGROUP) as u64;

/// `personality` values allowed: Linux, 32-bit Linux, and the query (`0xffffffff`); not
/// `ADDR_NO_RANDOMIZE` and the like, which weaken the container's own defences.
const PERSONALITIES: &[u64] = &[0x0, 0x0008, 0x20000, 0x20008, 0xffff_ffff];

impl Profile {
    /// Docker's default profile.
    pub fn docker_default() -> Profile {
        let allow = |names: &[&str]| Rule {
            names: names.iter().map(|n| (*n).to_owned()).collect(),
            name: None,
            action: LinuxSeccompAction::ScmpActAllow,
            errno_ret: None,
            args: Vec::new(),
            includes: Condition::default(),
            excludes: Condition::default(),
        };
        let only_with = |cap: &str, rule: Rule| Rule {
            includes: Condition { caps: vec![cap.to_owned()], ..Condition::default() },
            ..rule
        };
        let on_arches = |arches: &[&str], rule: Rule| Rule {
            includes: Condition {
                arches: arches.iter().map(|a| (*a).to_owned()).collect(),
                ..Condition::default()
            },
            ..rule
        };
        let without_sys_admin = |rule: Rule| Rule {
            excludes: Condition { caps: vec!["CAP_SYS_ADMIN".into()], ..Condition::default() },
            ..rule
        };
        let arg = |index: usize, value: u64, op: LinuxSeccompOperator, value_two: Option<u64>| {
            let builder = LinuxSeccompArgBuilder::default().index(index).value(value).op(op);
            let builder = match value_two {
                Some(two) => builder.value_two(two),
                None => builder,
            };
            builder.build().expect("every field of a seccomp argument is set")
        };

        let mut rules = vec![allow(ALLOWED)];
        // Docker allows these from kernel 4.8, which closed ptrace's way around seccomp;
        // older kernels get them only with CAP_SYS_PTRACE.
        rules.push(Rule {
            includes: Condition { min_kernel: Some("4.8".into()), ..Condition::default() },
            ..allow(&["process_vm_readv", "process_vm_writev", "ptrace"])
        });
        for value in PERSONALITIES {
            rules.push(Rule {
                args: vec![arg(0, *value, LinuxSeccompOperator::ScmpCmpEq, None)],
                ..allow(&["personality"])
            });
        }
        rules.push(on_arches(&["amd64", "x32"], allow(&["arch_prctl"])));
        rules.push(on_arches(&["amd64", "x32", "386"], allow(&["modify_ldt"])));
        rules.push(on_arches(
            &["arm", "arm64"],
            allow(&[
                "arm_fadvise64_64",
                "arm_sync_file_range",
                "sync_file_range2",
                "breakpoint",
                "cacheflush",
                "set_tls",
            ]),
        ));
        for (cap, names) in ALLOWED_WITH_CAPABILITY {
            rules.push(only_with(cap, allow(names)));
        }
        // Without CAP_SYS_ADMIN: clone without namespace flags (s390 passes the flags second),
        // and clone3, whose flags seccomp cannot see, refused with ENOSYS so that the C
        // library falls back to clone.
        let clone_flags_at = |index: usize| {
            without_sys_admin(Rule {
                args: vec![arg(
                    index,
                    CLONE_NAMESPACE_FLAGS,
                    LinuxSeccompOperator::ScmpCmpMaskedEq,
                    Some(0),
                )],
                ..allow(&["clone"])
            })
        };
        let mut clone = clone_flags_at(0);
        clone.excludes.arches = vec!["s390".into(), "s390x".into()];
        rules.push(clone);
        let mut clone_s390 = clone_flags_at(1);
        clone_s390.includes.arches = vec!["s390".into(), "s390x".into()];
        rules.push(clone_s390);
        rules.push(without_sys_admin(Rule {
            action: LinuxSeccompAction::ScmpActErrno,
            errno_ret: Some(libc::ENOSYS as u32),
            ..allow(&["clone3"])
        }));

        Profile {
            default_action: LinuxSeccompAction::ScmpActErrno,
            default_errno_ret: Some(EPERM),
            architectures: Vec::new(),
            arch_map: vec![
                ArchMap {
                    architecture: Arch::ScmpArchX86_64,
                    sub_architectures: vec![Arch::ScmpArchX86, Arch::ScmpArchX32],
                },
                ArchMap {
                    architecture: Arch::ScmpArchAarch64,
                    sub_architectures: vec![Arch::ScmpArchArm],
                },
                ArchMap {
                    architecture: Arch::ScmpArchS390x,
                    sub_architectures: vec![Arch::ScmpArchS390],
                },
            ],
            flags: Vec::new(),
            syscalls: rules,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn x86_64() -> Node {
        Node { arch: "amd64", seccomp_arch: Some(Arch::ScmpArchX86_64), kernel: (6, 1) }
    }

    fn allowed(filter: &LinuxSeccomp) -> HashSet<String> {
        filter
            .syscalls()
            .iter()
            .flatten()
            .filter(|s| s.action() == LinuxSeccompAction::ScmpActAllow)
            .flat_map(|s| s.names().iter().cloned())
            .collect()
    }

    fn caps(names: &[Capability]) -> HashSet<Capability> {
        names.iter().copied().collect()
    }

    #[test]
    fn the_default_refuses_with_eperm_on_x86s_three_abis() {
        let filter = Profile::docker_default().resolve(&caps(&[Capability::Chown]), &x86_64());
        assert_eq!(filter.default_action(), LinuxSeccompAction::ScmpActErrno);
        assert_eq!(filter.default_errno_ret(), Some(libc::EPERM as u32));
        assert_eq!(
            filter.architectures().as_deref(),
            Some(&[Arch::ScmpArchX86_64, Arch::ScmpArchX86, Arch::ScmpArchX32][..])
        );
        let json = serde_json::to_value(&filter).unwrap();
        assert_eq!(
            json["architectures"],
            serde_json::json!(["SCMP_ARCH_X86_64", "SCMP_ARCH_X86", "SCMP_ARCH_X32"])
        );
        let allowed = allowed(&filter);
        for name in ["read", "execve", "arch_prctl", "modify_ldt", "ptrace", "personality"] {
            assert!(allowed.contains(name), "{name}");
        }
        for name in ["keyctl", "add_key", "mount", "unshare", "setns", "reboot", "bpf", "chroot"] {
            assert!(!allowed.contains(name), "{name}");
        }
    }

    #[test]
    fn capabilities_unlock_their_syscalls() {
        let profile = Profile::docker_default();
        let plain = profile.resolve(&caps(&[Capability::SysChroot]), &x86_64());
        let admin =
            profile.resolve(&caps(&[Capability::SysChroot, Capability::SysAdmin]), &x86_64());
        assert!(allowed(&plain).contains("chroot"));
        for name in ["mount", "unshare", "setns", "clone3", "sethostname"] {
            assert!(allowed(&admin).contains(name), "{name}");
        }
        // Without CAP_SYS_ADMIN, clone is allowed only without namespace flags, and clone3
        // says ENOSYS.
        let clone: Vec<&LinuxSyscall> = plain
            .syscalls()
            .iter()
            .flatten()
            .filter(|s| s.names().iter().any(|n| n == "clone" || n == "clone3"))
            .collect();
        assert_eq!(clone.len(), 2, "{clone:?}");
        let args = clone[0].args().as_ref().unwrap();
        assert_eq!(args[0].op(), LinuxSeccompOperator::ScmpCmpMaskedEq);
        assert_eq!(args[0].value() & libc::CLONE_NEWUSER as u64, libc::CLONE_NEWUSER as u64);
        assert_eq!(clone[1].errno_ret(), Some(libc::ENOSYS as u32));
        // With it, neither conditional rule is kept.
        assert!(
            admin
                .syscalls()
                .iter()
                .flatten()
                .all(|s| s.args().is_none() || !s.names().iter().any(|n| n == "clone"))
        );
    }

    #[test]
    fn a_minimum_kernel_keeps_rules_out_of_older_kernels() {
        let old = Node { kernel: (4, 4), ..x86_64() };
        assert!(!allowed(&Profile::docker_default().resolve(&caps(&[]), &old)).contains("ptrace"));
    }

    #[test]
    fn security_opt_chooses_the_profile() {
        assert_eq!(SeccompChoice::from_security_opt("no-new-privileges"), None);
        assert_eq!(
            SeccompChoice::from_security_opt("seccomp=unconfined"),
            Some(Ok(SeccompChoice::Unconfined))
        );
        assert_eq!(
            SeccompChoice::from_security_opt("seccomp=/etc/p.json"),
            Some(Ok(SeccompChoice::File("/etc/p.json".into())))
        );
        assert!(matches!(SeccompChoice::from_security_opt("seccomp=p.json"), Some(Err(_))));
        assert!(matches!(SeccompChoice::from_security_opt("seccomp="), Some(Err(_))));
        assert_eq!(SeccompChoice::Unconfined.filter(&caps(&[])).unwrap(), None);
    }

    #[test]
    fn a_profile_file_in_dockers_format_is_read() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("profile.json");
        std::fs::write(
            &path,
            r#"{"defaultAction": "SCMP_ACT_ERRNO",
                "archMap": [{"architecture": "SCMP_ARCH_X86_64", "subArchitectures": ["SCMP_ARCH_X86"]}],
                "syscalls": [
                  {"names": ["read", "write"], "action": "SCMP_ACT_ALLOW", "comment": "basic"},
                  {"name": "mount", "action": "SCMP_ACT_ALLOW", "args": [],
                   "includes": {"caps": ["CAP_SYS_ADMIN"]}}
                ]}"#,
        )
        .unwrap();
        let profile = Profile::read(&path).unwrap();
        let filter = profile.resolve(&caps(&[]), &x86_64());
        assert_eq!(allowed(&filter), ["read", "write"].map(String::from).into());
        assert_eq!(filter.default_errno_ret(), Some(libc::EPERM as u32));
        assert_eq!(
            filter.architectures().as_deref(),
            Some(&[Arch::ScmpArchX86_64, Arch::ScmpArchX86][..])
        );
        assert!(
            allowed(&profile.resolve(&caps(&[Capability::SysAdmin]), &x86_64())).contains("mount")
        );
        std::fs::write(&path, "{not json").unwrap();
        match Profile::read(&path) {
            Err(ContainerError::InvalidConfig { field, .. }) => {
                assert_eq!(field, "config.security_opt")
            }
            other => panic!("{other:?}"),
        }
    }
}
