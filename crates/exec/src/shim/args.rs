//! The shim's command line, read where it lies (no copies): what the driver wrote with
//! `protocol::ShimArgs::to_args`.

use super::text::{Argv, Line, Lossy, parse_u64};
use core::ffi::CStr;
use core::fmt::Write;

/// The first argument of every shim command line; a shim refuses any other.
pub(crate) const SHIM_PROTOCOL: &str = "wharf-shim-2";
/// The argument that ends the containment.
const CONTAINMENT_END: &[u8] = b"end";

/// The shim's command line, after the program name.
#[derive(Debug)]
pub(crate) struct Args<'a> {
    /// Where the exit record and diagnostics go.
    pub(crate) run_dir: &'a CStr,
    /// The task's working directory.
    pub(crate) work_dir: &'a CStr,
    /// Where `<log_name>.stdout.N` and `<log_name>.stderr.N` go.
    pub(crate) log_dir: &'a CStr,
    /// The stem of the log files (no `/`).
    pub(crate) log_name: &'a [u8],
    /// Rotate a log file at this size; 0 never rotates.
    pub(crate) max_file_bytes: u64,
    /// Files kept per stream, the current one included (at least 1).
    pub(crate) max_files: u32,
    /// The containment's arguments (its end marker excluded), as indexes into the command line.
    pub(crate) containment: core::ops::Range<usize>,
    /// The program to execute.
    pub(crate) program: &'a CStr,
    /// Where the task's own `argv` (`argv[0]` first) starts in the command line.
    pub(crate) task_argv: usize,
}

impl<'a> Args<'a> {
    /// Reads the command line `argv` (without the program name); the error says what is wrong.
    pub(crate) fn parse(argv: &Argv<'a>) -> Result<Args<'a>, Line<256>> {
        let mut error = Line::new();
        let at = core::cell::Cell::new(0);
        let next = |what: &str| {
            at.set(at.get() + 1);
            argv.get(at.get() - 1).ok_or_else(|| {
                let mut error = Line::new();
                let _ = write!(error, "missing argument: {what}");
                error
            })
        };
        let marker = next("protocol")?;
        if marker.to_bytes() != SHIM_PROTOCOL.as_bytes() {
            let asked = Lossy(marker.to_bytes());
            let _ = write!(error, "this shim speaks {SHIM_PROTOCOL}, the driver asked for {asked}");
            return Err(error);
        }
        let run_dir = next("run dir")?;
        let work_dir = next("work dir")?;
        let log_dir = next("log dir")?;
        let log_name = next("log name")?.to_bytes();
        let max_file_bytes = parse_u64(next("max file bytes")?.to_bytes());
        let max_files = parse_u64(next("max files")?.to_bytes());
        let start = at.get();
        while next("containment end")?.to_bytes() != CONTAINMENT_END {}
        let containment = start..at.get() - 1;
        let program = next("program")?;
        let task_argv = at.get();
        next("arg0")?;
        let bad = |what: &str| {
            let mut error = Line::new();
            let _ = write!(error, "bad {what}");
            Err(error)
        };
        if log_name.is_empty() || log_name.contains(&b'/') {
            return bad("log name");
        }
        let Some(max_file_bytes) = max_file_bytes else { return bad("max file bytes") };
        let Some(max_files) = max_files.and_then(|n| u32::try_from(n).ok()) else {
            return bad("max files");
        };
        Ok(Args {
            run_dir,
            work_dir,
            log_dir,
            log_name,
            max_file_bytes,
            max_files: max_files.max(1),
            containment,
            program,
            task_argv,
        })
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::ffi::{CString, OsString};
    use std::os::unix::ffi::OsStrExt;

    /// A command line as the kernel hands it over, kept alive with its strings.
    pub(crate) struct OwnedArgv {
        _strings: Vec<CString>,
        pointers: Vec<*const u8>,
    }

    impl OwnedArgv {
        pub(crate) fn new(args: &[OsString]) -> OwnedArgv {
            let strings: Vec<CString> =
                args.iter().map(|a| CString::new(a.as_bytes()).unwrap()).collect();
            let mut pointers: Vec<*const u8> = strings.iter().map(|s| s.as_ptr().cast()).collect();
            pointers.push(std::ptr::null());
            OwnedArgv { _strings: strings, pointers }
        }

        pub(crate) fn argv(&self) -> Argv<'_> {
            // SAFETY: the pointers are null-terminated and `self` keeps the strings alive.
            unsafe { Argv::new(self.pointers.as_ptr()) }
        }
    }

    fn parse(args: &[&str]) -> Result<(Vec<String>, String), String> {
        let owned = OwnedArgv::new(&args.iter().map(OsString::from).collect::<Vec<_>>());
        let argv = owned.argv();
        let text = |s: &CStr| s.to_string_lossy().into_owned();
        match Args::parse(&argv) {
            Ok(parsed) => {
                let containment =
                    parsed.containment.clone().map(|i| text(argv.get(i).unwrap())).collect();
                let task = (parsed.task_argv..argv.len()).map(|i| text(argv.get(i).unwrap()));
                let summary = format!(
                    "{} {} {} {} {} {} {} [{}]",
                    text(parsed.run_dir),
                    text(parsed.work_dir),
                    text(parsed.log_dir),
                    String::from_utf8_lossy(parsed.log_name),
                    parsed.max_file_bytes,
                    parsed.max_files,
                    text(parsed.program),
                    task.collect::<Vec<_>>().join(" "),
                );
                Ok((containment, summary))
            }
            Err(error) => Err(String::from_utf8_lossy(error.bytes()).into_owned()),
        }
    }

    #[test]
    fn command_lines_are_read_in_place() {
        let args = ["wharf-shim-2", "/r", "/w", "/l", "t", "10", "0", "cgroup=/c", "end"];
        let (containment, summary) = parse(&[&args[..], &["/p", "p", "-c", ""]].concat()).unwrap();
        assert_eq!(containment, ["cgroup=/c"]);
        assert_eq!(summary, "/r /w /l t 10 1 /p [p -c ]", "max files 0 counts as 1");
    }

    #[test]
    fn bad_shim_args_are_refused() {
        let good = ["wharf-shim-2", "/r", "/w", "/l", "t", "10", "2", "end", "/p", "p"];
        let with = |index: usize, value: &'static str| {
            let mut args = good.to_vec();
            args[index] = value;
            args
        };
        for (args, expected) in [
            (with(0, "wharf-shim-1"), "this shim speaks wharf-shim-2, the driver asked for"),
            (with(4, "a/b"), "bad log name"),
            (with(4, ""), "bad log name"),
            (with(5, "-1"), "bad max file bytes"),
            (with(6, "x"), "bad max files"),
            (with(6, "99999999999"), "bad max files"),
            (with(7, "cgroup=/c"), "missing argument: containment end"),
            (good[..9].to_vec(), "missing argument: arg0"),
            (vec![], "missing argument: protocol"),
        ] {
            let error = parse(&args).unwrap_err();
            assert!(error.starts_with(expected), "{args:?}: {error}");
        }
    }
}
