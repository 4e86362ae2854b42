//! The shim: the parent of one task, and the reason a task outlives the agent.
//!
//! The driver starts one shim per task (on the `posix_spawn` fast path: the agent forks
//! nothing and runs no code in the child). The shim then, in this order:
//! 1. closes every descriptor it inherited beyond stdin, stdout and stderr, leaves the agent's
//!    session (`setsid`), so nothing aimed at the agent's terminal or group reaches it, and
//!    becomes a child subreaper, so every process the task leaves behind is re-parented to it
//!    rather than to init;
//! 2. starts the task with a vfork-style clone (as `posix_spawn` does: it costs the same
//!    whatever the shim's size) in a session and process group of its own (its pid is both
//!    ids), in its working directory, with the shim's environment, which the driver set to
//!    exactly the task's; the task's process takes its containment steps between its clone and
//!    its exec (joining its cgroup; under the isolated driver also its user, Landlock,
//!    namespaces);
//! 3. writes one line on its stdout for the driver (the start report): the task's pid and start
//!    time, or why it could not start; then it yields the CPU once, so that the driver it has
//!    just woken runs first; only then does it create files (the log files and the run
//!    directory), the slowest step on a busy file system and not needed before the task has
//!    run: its first output waits in the pipes;
//! 4. copies the task's stdout and stderr into size-rotated files (module `logs`) and reaps every
//!    child it has, until the task's main process exits;
//! 5. then kills whatever the task left behind (its process group, and any descendant that
//!    escaped it, which the subreaper setting has made the shim's child), reaps it all, drains
//!    the pipes, and records the exit status durably (temp file, fsync, rename, fsync of the
//!    directory) in the run directory, then exits.
//!
//! So the shim's exit means the whole task is gone and its exit record is on disk, whether or
//! not the agent is alive to see it. It writes its own diagnostics to `shim.log` in the run
//! directory, made only when there is something to say; it never signals anything but its own
//! children and the task's process group, pinned by a pidfd.
//!
//! ## Two builds of one shim
//!
//! The shim's code (modules `life`, `args`, `contain`, `logs`, `text`) uses `core` alone, with
//! system calls from [`wharf_nolibc`]: no allocator, no C library. The build script compiles
//! it into a static program of its own (`static_main.rs`: no dynamic loader, no relocations,
//! no C start-up), which this crate carries ([`STATIC_SHIM`]) and both drivers, raw_exec and
//! the isolated `exec`, start by default from a sealed in-memory file: a start then costs two
//! program starts that load nothing, and a running shim holds a few pages of its own.
//!
//! The same code also runs inside a std program: the `wharf-shim` binary of this crate, and
//! any program that embeds the shim through [`run_if_invoked`], for a machine where the static
//! build cannot be had. Both builds take every containment step (module `contain`: cgroups,
//! namespaces, mounts, Landlock, the workload user, `no_new_privs`) with the same code.

// With no allocator, an error's text is a fixed buffer on the stack.
#[allow(clippy::result_large_err)]
mod args;
mod contain;
#[allow(clippy::result_large_err)]
mod life;
mod logs;
mod text;

pub(crate) use args::SHIM_PROTOCOL;
#[cfg(test)]
pub(crate) use life::exit_record;
pub(crate) use life::{EXIT_RECORD_VERSION, StartStep};

use crate::sys;
use args::Args;
use std::ffi::{CString, OsString};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::OnceLock;
use text::{Argv, Lossy};

/// The static shim (see the module docs), built by this crate's build script; empty on an
/// architecture it is not built for.
pub const STATIC_SHIM: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/wharf-shim"));

/// A path that executes [`STATIC_SHIM`] in this process and its children: a sealed in-memory
/// file, made once per process, named through `/proc/self/fd`. `None` where that cannot be
/// had (no static build for this architecture, memory files refused execution).
pub(crate) fn static_shim() -> Option<PathBuf> {
    static SHIM: OnceLock<Option<PathBuf>> = OnceLock::new();
    SHIM.get_or_init(|| {
        if STATIC_SHIM.is_empty() {
            return None;
        }
        match sys::sealed_memory_file(c"wharf-shim", STATIC_SHIM) {
            // The descriptor stays open for the life of the process: every shim started from
            // it shares its pages.
            Ok(fd) => Some(PathBuf::from(format!("/proc/self/fd/{}", std::os::fd::IntoRawFd::into_raw_fd(fd)))),
            Err(e) => {
                tracing::warn!(error = %e, "cannot hold the static shim in memory; using the wharf-shim program");
                None
            }
        }
    })
    .clone()
}

/// Runs the shim and exits, if this process was started as one; returns at once otherwise.
///
/// This is how a program embeds the shim rather than ship the `wharf-shim` binary beside
/// itself (cargo builds a dependency's library, never its binaries): call it first thing in
/// `main`, and make the program its own shim with
/// `RawExecDriver::with_shim(std::env::current_exe()?)` (or
/// [`RawExecOptions::shim_path`](crate::RawExecOptions::shim_path)). The driver starts a shim
/// with a first argument that names the shim protocol, `wharf-shim-2`; with any other
/// command line this returns at once and the program goes on as usual. (Neither driver needs
/// this by default: they carry a static shim of their own, which takes every containment
/// step.)
///
/// Started as the shim, the process must have one thread: the shim closes every descriptor it
/// inherited beyond stdin, stdout and stderr, and another thread (an async runtime's, for one)
/// may own some. So call it before any thread starts and before an async runtime is built
/// (`#[tokio::main]` builds one before `main`'s body runs: build it by hand after this call).
/// A process with more threads refuses to be the shim: the driver's start fails with a
/// message that says so, and the process exits with status 2.
///
/// ```no_run
/// fn main() -> Result<(), Box<dyn std::error::Error>> {
///     wharf_exec::shim::run_if_invoked(); // never returns when started as the shim
///     let driver = wharf_exec::RawExecDriver::with_shim(std::env::current_exe()?);
///     // ... build a tokio runtime and use the driver
///     # drop(driver);
///     Ok(())
/// }
/// ```
pub fn run_if_invoked() {
    if std::env::args_os().nth(1).as_deref() != Some(std::ffi::OsStr::new(SHIM_PROTOCOL)) {
        return;
    }
    let code = match std::fs::read_dir("/proc/self/task").map(Iterator::count) {
        // SAFETY: this thread is the process's only one, and it never returns to the code that
        // called it (the process exits below): nothing that owned a descriptor above 2 runs
        // again.
        Ok(1) => unsafe { run() },
        threads => {
            let threads =
                threads.map_or_else(|e| format!("an unknown number ({e}) of"), |n| n.to_string());
            life::report_failure(
                StartStep::Setup,
                0,
                format_args!(
                    "the program embedding the shim had {threads} threads when started as the \
                     shim; call wharf_exec::shim::run_if_invoked() first in main, before any \
                     thread or async runtime starts"
                ),
            );
            2
        }
    };
    std::process::exit(i32::from(code))
}

/// The shim's entry point in a std program: the `wharf-shim` binary's `main` calls it and
/// nothing else. A program that embeds the shim calls [`run_if_invoked`] instead.
///
/// # Safety
///
/// Call it first thing in the program's `main`, with nothing else running: it closes every
/// descriptor above 2 (the shim must not pass on what it inherited), which would pull them
/// from under any other owner.
pub unsafe fn main() -> ExitCode {
    // SAFETY: the caller's promise is this function's.
    ExitCode::from(unsafe { run() })
}

/// The shim's whole life in a std program; returns its exit status.
///
/// # Safety
///
/// As for [`main`].
unsafe fn run() -> u8 {
    // SAFETY: the caller runs this first in `main`, so nothing owns a descriptor above 2.
    unsafe { sys::close_inherited_fds() };
    let strings: Vec<CString> = std::env::args_os()
        .skip(1)
        .chain(std::iter::once(OsString::new()))
        .map(|arg| CString::new(arg.into_vec()).unwrap_or_default())
        .collect();
    let environment: Vec<CString> = std::env::vars_os()
        .map(|(name, value)| {
            let mut entry = name.into_vec();
            entry.push(b'=');
            entry.extend_from_slice(value.as_bytes());
            CString::new(entry).unwrap_or_default()
        })
        .collect();
    let pointers = |strings: &[CString]| -> Vec<*const u8> {
        strings.iter().map(|s| s.as_ptr().cast()).chain(std::iter::once(std::ptr::null())).collect()
    };
    // The extra empty argument above only reserves the array's last slot: drop it.
    let mut argv_pointers = pointers(&strings);
    argv_pointers.truncate(strings.len() - 1);
    argv_pointers.push(std::ptr::null());
    let envp = pointers(&environment);
    // SAFETY: both arrays are null-terminated and live, with their strings, until the process
    // exits (this function's caller never returns to anything else).
    let argv = unsafe { Argv::new(argv_pointers.as_ptr()) };
    let args = match Args::parse(&argv) {
        Ok(args) => args,
        Err(message) => {
            life::report_failure(StartStep::Setup, 0, format_args!("{}", Lossy(message.bytes())));
            return 2;
        }
    };
    let run_dir = PathBuf::from(std::ffi::OsStr::from_bytes(args.run_dir.to_bytes()));
    std::panic::set_hook(Box::new(move |info| {
        let run_dir = CString::new(run_dir.as_os_str().as_bytes()).unwrap_or_default();
        life::Diag { run_dir: &run_dir, fd: -1 }.note(format_args!("panicked: {info}"));
    }));
    let Some(confine) = life::read_containment(&argv, args.containment.clone()) else {
        return 2;
    };
    // SAFETY: this thread is the only one and runs nothing else; `argv` holds `args`.
    unsafe { life::run(&args, &argv, envp.as_ptr(), &confine) }
}

#[cfg(test)]
pub(crate) mod tests {
    pub(crate) use super::args::tests::OwnedArgv;
    use super::*;

    /// Reads a command line as the shim does; the error as text.
    pub(crate) fn parse<'a>(argv: &Argv<'a>) -> Result<Args<'a>, String> {
        Args::parse(argv).map_err(|e| String::from_utf8_lossy(e.bytes()).into_owned())
    }

    #[test]
    fn the_static_shim_is_built_for_this_machine() {
        assert!(STATIC_SHIM.starts_with(b"\x7fELF"), "{} bytes", STATIC_SHIM.len());
        let path = static_shim().expect("an in-memory static shim");
        assert!(crate::sys::executable(&path), "{}", path.display());
    }

    #[test]
    fn both_sides_name_the_run_files_alike() {
        assert_eq!(life::EXIT_FILE.to_str(), Ok(crate::protocol::EXIT_FILE));
        assert_eq!(life::SHIM_LOG.to_str(), Ok(crate::protocol::SHIM_LOG));
    }
}
