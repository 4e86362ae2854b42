//! The container's waiter: the task's process under wharf's shim, and the parent of the
//! container's init.
//!
//! The shim starts it as it starts any task (so it joins the task's cgroup, and its output
//! goes to the task's log files). It becomes a child subreaper, runs `<runtime> create` (the
//! container's init is left as its child once `create` exits) and `<runtime> start`, then
//! waits for that init: signals it receives it passes on, and when the init exits it exits
//! the same way (the same code, or the same signal), which the shim records as the task's
//! exit. It writes `started` (or `failed` with the reason) into the bundle directory, which
//! the driver waits for before it calls the start done.
//!
//! A std program of a few hundred KiB, against the tens of MiB a `runc run` left in the
//! foreground would keep per container. Programs embed it by calling [`run_if_invoked`]
//! first thing in `main` (the `wharf` binary does); the `wharf-container-waiter` binary is
//! just that.

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};

/// The first argument that makes a program the waiter.
pub const WAITER_FLAG: &str = "--wharf-container-waiter";
/// Written into the bundle directory once the container runs.
pub const STARTED_FILE: &str = "started";
/// Written into the bundle directory, with the reason, if it could not be started.
pub const FAILED_FILE: &str = "failed";
/// The container init's pid, as the runtime writes it.
pub const PID_FILE: &str = "pid";
/// The runtime's log, in the bundle directory.
pub const RUNTIME_LOG: &str = "runtime.log";
/// The exit code when the container could not be started (Docker's for the same).
pub const START_FAILED_CODE: i32 = 125;

/// Signals passed on to the container's init.
const FORWARDED: &[libc::c_int] = &[
    libc::SIGTERM,
    libc::SIGINT,
    libc::SIGHUP,
    libc::SIGQUIT,
    libc::SIGUSR1,
    libc::SIGUSR2,
    libc::SIGWINCH,
    libc::SIGALRM,
    libc::SIGCONT,
];

/// Runs the waiter and exits if this process was started as one (its first argument is
/// [`WAITER_FLAG`]); returns otherwise.
pub fn run_if_invoked() {
    let args: Vec<OsString> = std::env::args_os().collect();
    if args.get(1).is_none_or(|a| a != WAITER_FLAG) {
        return;
    }
    let code = match &args[2..] {
        [runtime, root, bundle, id] => {
            run(Path::new(runtime), Path::new(root), Path::new(bundle), &id.to_string_lossy())
        }
        _ => {
            report(None, "usage: --wharf-container-waiter <runtime> <root> <bundle> <id>");
            2
        }
    };
    std::process::exit(code)
}

/// The arguments that make a program started with them the waiter of container `id`.
pub fn waiter_args(runtime: &Path, root: &Path, bundle: &Path, id: &str) -> Vec<String> {
    vec![
        WAITER_FLAG.to_owned(),
        runtime.display().to_string(),
        root.display().to_string(),
        bundle.display().to_string(),
        id.to_owned(),
    ]
}

fn run(runtime: &Path, root: &Path, bundle: &Path, id: &str) -> i32 {
    // SAFETY: prctl with integer arguments.
    if unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) } != 0 {
        report(
            Some(bundle),
            &format!("cannot become a subreaper: {}", std::io::Error::last_os_error()),
        );
        return START_FAILED_CODE;
    }
    // Blocked before anything starts, so none is lost; read one by one with sigwaitinfo.
    let mut set = signal_set();
    // SAFETY: a set this function owns, and a null old set.
    unsafe { libc::sigprocmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };

    let log = bundle.join(RUNTIME_LOG);
    let runtime_command = |args: &[&str]| {
        // The container's runtime, run by the task's own process.
        #[allow(clippy::disallowed_methods)]
        let mut command = Command::new(runtime);
        command.arg("--root").arg(root).arg("--log").arg(&log).args(args).stdin(Stdio::null());
        // The runtime, and the container's init after it, must not inherit the blocked
        // signals: an init that blocks SIGTERM would never see a stop.
        // SAFETY: sigemptyset and sigprocmask are async-signal-safe, on a set of the child's.
        unsafe {
            command.pre_exec(|| {
                let mut none: libc::sigset_t = std::mem::zeroed();
                libc::sigemptyset(&mut none);
                libc::sigprocmask(libc::SIG_SETMASK, &none, std::ptr::null_mut());
                Ok(())
            });
        }
        command
    };
    let pid_file = bundle.join(PID_FILE);
    let bundle_text = bundle.display().to_string();
    let pid_text = pid_file.display().to_string();
    // The container's init keeps create's stdout and stderr: the shim's pipes to the logs.
    let created =
        runtime_command(&["create", "--bundle", &bundle_text, "--pid-file", &pid_text, id])
            .status();
    if let Some(reason) = failure("create", created, &log) {
        report(Some(bundle), &reason);
        let _ = runtime_command(&["delete", "--force", id]).output();
        return START_FAILED_CODE;
    }
    let Some(init) =
        std::fs::read_to_string(&pid_file).ok().and_then(|t| t.trim().parse::<libc::pid_t>().ok())
    else {
        report(Some(bundle), &format!("the runtime wrote no pid to {pid_text}"));
        let _ = runtime_command(&["delete", "--force", id]).output();
        return START_FAILED_CODE;
    };
    let started = runtime_command(&["start", id]).stdout(Stdio::null()).status();
    if let Some(reason) = failure("start", started, &log) {
        report(Some(bundle), &reason);
        let _ = runtime_command(&["delete", "--force", id]).output();
        return START_FAILED_CODE;
    }
    let _ = std::fs::write(bundle.join(STARTED_FILE), init.to_string());
    wait_for(init, &mut set)
}

/// Passes signals on to `init` and reaps children until `init` exits; returns, or dies of,
/// what it exited with.
fn wait_for(init: libc::pid_t, set: &mut libc::sigset_t) -> i32 {
    loop {
        // Reap first: the init may have exited before its SIGCHLD was waited for.
        loop {
            let mut status = 0;
            // SAFETY: waitpid with a status the function owns.
            let pid = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) };
            if pid == init {
                return exit_like(status);
            }
            if pid <= 0 {
                break;
            }
        }
        // SAFETY: a set this function owns, no info wanted.
        let signal = unsafe { libc::sigwaitinfo(set, std::ptr::null_mut()) };
        if signal > 0 && signal != libc::SIGCHLD {
            // SAFETY: a signal to the container's init, which is our child (not yet reaped, so
            // its pid cannot be another process's).
            unsafe { libc::kill(init, signal) };
        }
    }
}

/// Exits as the init did: with its code, or by its signal.
fn exit_like(status: libc::c_int) -> i32 {
    if libc::WIFEXITED(status) {
        return libc::WEXITSTATUS(status);
    }
    let signal = libc::WTERMSIG(status);
    // SAFETY: the default action for the signal, then the signal unblocked and raised.
    unsafe {
        libc::signal(signal, libc::SIG_DFL);
        let mut one: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut one);
        libc::sigaddset(&mut one, signal);
        libc::sigprocmask(libc::SIG_UNBLOCK, &one, std::ptr::null_mut());
        libc::raise(signal);
    }
    // A signal whose default is not to end the process: say it the shell's way.
    128 + signal
}

fn signal_set() -> libc::sigset_t {
    // SAFETY: sigemptyset and sigaddset on a set this function owns.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGCHLD);
        for signal in FORWARDED {
            libc::sigaddset(&mut set, *signal);
        }
        set
    }
}

/// Why a runtime command failed, from its status and the last line of its log.
fn failure(step: &str, result: std::io::Result<ExitStatus>, log: &Path) -> Option<String> {
    match result {
        Ok(status) if status.success() => None,
        Ok(status) => {
            let text = std::fs::read_to_string(log).unwrap_or_default();
            let last = text.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or_default();
            let message = last.split_once("msg=").map_or(last, |(_, msg)| {
                msg.trim_end_matches(|c: char| c != '"').trim_matches('"')
            });
            Some(format!("runtime {step} failed ({status}): {message}"))
        }
        Err(e) => Some(format!("cannot run the runtime's {step}: {e}")),
    }
}

/// Says why the container could not start: on stderr (the task's log) and in the bundle's
/// `failed` file for the driver.
fn report(bundle: Option<&Path>, reason: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "wharf container: {reason}");
    if let Some(bundle) = bundle {
        let _ = std::fs::write(PathBuf::from(bundle).join(FAILED_FILE), reason);
    }
}
