//! What the driver and the shim say to each other: the shim's command line, the one line it
//! writes back once the task runs (or could not start), and the exit record it leaves in the
//! run directory.
//!
//! Both sides are built from this module, so they cannot disagree on the format. Everything
//! the driver reads back (the start report, the exit record) is parsed strictly: a damaged or
//! foreign file is an error, never a panic and never a guess.

use crate::sys::WaitStatus;
use std::ffi::OsString;
use std::path::PathBuf;
use wharf_isolate::Containment;

pub(crate) use crate::shim::{EXIT_RECORD_VERSION, SHIM_PROTOCOL, StartStep};

/// The shim's program name; by default it is looked for beside the current executable.
pub const SHIM_NAME: &str = "wharf-shim";
/// The exit record's file name in the run directory.
pub(crate) const EXIT_FILE: &str = "exit";
/// The shim's own diagnostics, in the run directory.
pub(crate) const SHIM_LOG: &str = "shim.log";

/// The shim's command line, after the program name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ShimArgs {
    /// Where the shim writes its exit record and diagnostics.
    pub(crate) run_dir: PathBuf,
    /// The task's working directory.
    pub(crate) work_dir: PathBuf,
    /// Where `<log_name>.stdout.N` and `<log_name>.stderr.N` go.
    pub(crate) log_dir: PathBuf,
    /// The task's name, the stem of its log files.
    pub(crate) log_name: OsString,
    /// Rotate a log file at this size; 0 never rotates.
    pub(crate) max_file_bytes: u64,
    /// Files kept per stream, the current one included (at least 1).
    pub(crate) max_files: u32,
    /// What the task's process does to itself between its clone and exec (join its cgroup,
    /// and for the isolated driver its user, Landlock, namespaces).
    pub(crate) containment: Containment,
    /// The resolved program to execute.
    pub(crate) program: PathBuf,
    /// What the task sees as `argv[0]`.
    pub(crate) arg0: OsString,
    /// The rest of its arguments.
    pub(crate) args: Vec<OsString>,
}

impl ShimArgs {
    /// The command line, protocol marker first.
    pub(crate) fn to_args(&self) -> Vec<OsString> {
        let mut out: Vec<OsString> = vec![
            SHIM_PROTOCOL.into(),
            self.run_dir.clone().into(),
            self.work_dir.clone().into(),
            self.log_dir.clone().into(),
            self.log_name.clone(),
            self.max_file_bytes.to_string().into(),
            self.max_files.to_string().into(),
        ];
        out.extend(self.containment.to_args());
        out.extend([self.program.clone().into(), self.arg0.clone()]);
        out.extend(self.args.iter().cloned());
        out
    }
}

/// The one line the shim writes on its stdout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum StartReport {
    /// The task's program is executing.
    Started {
        /// Its pid, also its process group and session id.
        pid: i32,
        /// Its start time in clock ticks since boot.
        start_ticks: u64,
    },
    /// It could not be started; the shim exits.
    Failed {
        /// At which step.
        step: StartStep,
        /// The OS error number, 0 if none.
        errno: i32,
        /// What went wrong.
        message: String,
    },
}

impl StartReport {
    /// The line, newline included, as the shim writes it.
    #[cfg(test)]
    fn line(&self) -> String {
        match self {
            StartReport::Started { pid, start_ticks } => format!("started {pid} {start_ticks}\n"),
            StartReport::Failed { step, errno, message } => {
                format!("failed {} {errno} {}\n", step.word(), message.replace('\n', " "))
            }
        }
    }

    /// Reads a line written by [`StartReport::line`] (without its newline).
    pub(crate) fn parse(line: &str) -> Option<StartReport> {
        let mut words = line.splitn(4, ' ');
        match words.next()? {
            "started" => {
                let pid = words.next()?.parse().ok()?;
                let start_ticks = words.next()?.parse().ok()?;
                words.next().is_none().then_some(StartReport::Started { pid, start_ticks })
            }
            "failed" => {
                let step = match words.next()? {
                    "setup" => StartStep::Setup,
                    "work_dir" => StartStep::WorkDir,
                    "confine" => StartStep::Confine,
                    "spawn" => StartStep::Spawn,
                    _ => return None,
                };
                let errno = words.next()?.parse().ok()?;
                let message = words.next().unwrap_or_default().to_owned();
                Some(StartReport::Failed { step, errno, message })
            }
            _ => None,
        }
    }
}

/// Reads an exit record; the error says what is wrong with it.
pub(crate) fn parse_exit_record(bytes: &[u8]) -> Result<WaitStatus, String> {
    let text = std::str::from_utf8(bytes).map_err(|_| "not text".to_owned())?;
    let words: Vec<&str> = text.split_ascii_whitespace().collect();
    let number = |word: &str| word.parse::<i32>().map_err(|_| format!("bad number {word:?}"));
    match words.as_slice() {
        [EXIT_RECORD_VERSION, "exited", code] => Ok(WaitStatus::Exited(number(code)?)),
        [EXIT_RECORD_VERSION, "signaled", signal] => Ok(WaitStatus::Signaled(number(signal)?)),
        [version, ..] if *version != EXIT_RECORD_VERSION && version.starts_with("wharf-exit-") => {
            Err(format!("written in format {version}, this wharf reads {EXIT_RECORD_VERSION}"))
        }
        _ => Err(format!("not an exit record: {:?}", text.chars().take(80).collect::<String>())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use wharf_nolibc::sys::WaitStatus as NolibcStatus;

    #[test]
    fn shim_args_are_read_back_by_the_shim() {
        let args = ShimArgs {
            run_dir: "/d/run".into(),
            work_dir: "/d".into(),
            log_dir: "/d/logs".into(),
            log_name: "web".into(),
            max_file_bytes: 1024,
            max_files: 3,
            containment: Containment {
                cgroup: vec!["/cg/a/cgroup.procs".into()],
                no_new_privs: true,
                ..Containment::default()
            },
            program: "/bin/sh".into(),
            arg0: "sh".into(),
            args: vec!["-c".into(), "echo 'a b'".into(), "".into()],
        };
        let owned = crate::shim::tests::OwnedArgv::new(&args.to_args());
        let argv = owned.argv();
        let parsed = crate::shim::tests::parse(&argv).unwrap();
        let text = |index: usize| argv.get(index).unwrap().to_str().unwrap().to_owned();
        assert_eq!(parsed.run_dir, c"/d/run");
        assert_eq!(parsed.work_dir, c"/d");
        assert_eq!(parsed.log_dir, c"/d/logs");
        assert_eq!(parsed.log_name, b"web");
        assert_eq!((parsed.max_file_bytes, parsed.max_files), (1024, 3));
        let containment: Vec<String> = parsed.containment.clone().map(text).collect();
        assert_eq!(containment, ["cgroup=/cg/a/cgroup.procs", "no-new-privs"]);
        assert_eq!(parsed.program, c"/bin/sh");
        let task: Vec<String> = (parsed.task_argv..argv.len()).map(text).collect();
        assert_eq!(task, ["sh", "-c", "echo 'a b'", ""]);
    }

    #[test]
    fn start_reports_round_trip_and_garbage_is_refused() {
        for report in [
            StartReport::Started { pid: 42, start_ticks: 123_456_789 },
            StartReport::Failed {
                step: StartStep::Spawn,
                errno: 2,
                message: "No such file".into(),
            },
            StartReport::Failed { step: StartStep::Setup, errno: 13, message: String::new() },
            StartReport::Failed { step: StartStep::WorkDir, errno: 2, message: "gone".into() },
            StartReport::Failed { step: StartStep::Confine, errno: 28, message: "cgroup".into() },
            StartReport::Failed { step: StartStep::Setup, errno: 0, message: "two\nlines".into() },
        ] {
            let line = report.line();
            let parsed = StartReport::parse(line.trim_end_matches('\n')).unwrap();
            match (&report, &parsed) {
                (StartReport::Failed { message, .. }, StartReport::Failed { message: m, .. }) => {
                    assert_eq!(message.replace('\n', " "), *m)
                }
                _ => assert_eq!(parsed, report),
            }
        }
        for garbage in ["", "started", "started 1", "started x 2", "started 1 2 3", "failed oops 1"]
        {
            assert_eq!(StartReport::parse(garbage), None, "{garbage:?}");
        }
    }

    #[test]
    fn exit_records_round_trip_and_garbage_is_refused() {
        for status in [WaitStatus::Exited(0), WaitStatus::Exited(255), WaitStatus::Signaled(9)] {
            let mut record = String::new();
            let raw = match status {
                WaitStatus::Exited(code) => NolibcStatus::Exited(code),
                WaitStatus::Signaled(signal) => NolibcStatus::Signaled(signal),
            };
            crate::shim::exit_record(raw, &mut record).unwrap();
            assert_eq!(parse_exit_record(record.as_bytes()), Ok(status));
        }
        for (bytes, expected) in [
            (&b""[..], "not an exit record"),
            (b"\xff\xfe", "not text"),
            (b"wharf-exit-1 exited", "not an exit record"),
            (b"wharf-exit-1 exited x", "bad number"),
            (b"wharf-exit-1 vanished 3", "not an exit record"),
            (b"wharf-exit-2 exited 3", "written in format wharf-exit-2"),
        ] {
            let error = parse_exit_record(bytes).unwrap_err();
            assert!(error.starts_with(expected), "{bytes:?}: {error}");
        }
    }
}
