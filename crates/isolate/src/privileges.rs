//! `no_new_privs`: once set, no `execve` of the task or of anything it starts can gain
//! privileges. Setuid and setgid bits and file capabilities are ignored, so a workload user
//! cannot become root through a setuid program. It is also what lets an unprivileged process
//! enforce a Landlock ruleset. The flag is set in the task's own process between fork and exec
//! (`crate::Prepared::apply`); this module lets others check it.

use crate::error::IsolateError;

/// Whether `no_new_privs` is set on the calling thread.
pub fn no_new_privs() -> Result<bool, IsolateError> {
    crate::sys::no_new_privs().map_err(|source| IsolateError::Sys { call: "prctl", source })
}
