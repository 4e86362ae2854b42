//! Private namespaces for a task: PID (the task sees only its own processes, and all of them
//! die with it) and IPC (System V IPC objects and POSIX message queues of its own).
//!
//! A PID namespace applies to the children of the process that makes it, so the shim makes it
//! just before it forks the task (`crate::Prepared::before_fork`): the task is the namespace's
//! first process, its pid 1. Like any pid 1 it receives only the signals it has a handler for
//! (the kernel's rule for init; a driver that signals it makes up for that), and when it
//! exits, the kernel kills everything left in its namespace.
//!
//! A task that can reach `/proc` (no Landlock, or a rule for `/`, `/proc` or below) also gets
//! a mount namespace of its own, whose mounts are slaves of the host's (an unmount on the host
//! reaches it, its own mounts never reach the host), with a `/proc` that shows its namespace;
//! nothing else in it changes. A task that cannot reach `/proc` does without: the mount
//! namespace would cost every start its copy of the host's mounts for nothing.

use crate::error::IsolateError;

/// Which private namespaces a task gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Namespaces {
    /// A PID namespace (with a mount namespace for its `/proc`, if it can reach `/proc`).
    pub pid: bool,
    /// An IPC namespace.
    pub ipc: bool,
}

impl Namespaces {
    /// The flags for `unshare` in the task's own process (the PID namespace is made before the
    /// fork; the mount namespace for its own `/proc`, if `own_proc`, after, by the task).
    pub(crate) fn child_flags(self, own_proc: bool) -> libc::c_int {
        let mut flags = 0;
        if self.pid && own_proc {
            flags |= libc::CLONE_NEWNS;
        }
        if self.ipc {
            flags |= libc::CLONE_NEWIPC;
        }
        flags
    }

    /// Checks that this kernel lets processes make the namespaces asked for; the error names
    /// the first that is missing and why.
    pub fn check_supported(self) -> Result<(), IsolateError> {
        let wanted = [(self.pid, "pid"), (self.pid, "mnt"), (self.ipc, "ipc")];
        for (_, kind) in wanted.iter().filter(|(wanted, _)| *wanted) {
            let unsupported = |reason: String| IsolateError::Unsupported {
                feature: "namespaces",
                reason: format!("{kind} namespaces: {reason}"),
            };
            if std::fs::symlink_metadata(format!("/proc/self/ns/{kind}")).is_err() {
                return Err(unsupported("this kernel is built without them".into()));
            }
            let limit = format!("/proc/sys/user/max_{kind}_namespaces");
            if let Ok(text) = std::fs::read_to_string(&limit)
                && text.trim() == "0"
            {
                return Err(unsupported(format!("{limit} is 0")));
            }
        }
        Ok(())
    }
}
