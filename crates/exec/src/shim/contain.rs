//! The task's containment, read where it lies on the shim's command line (what wharf-isolate's
//! `Containment::to_args` wrote) and applied by the task's own process between its clone and
//! its exec, with system calls from [`wharf_nolibc`] and no allocation: the static shim and the
//! std one take every step alike.
//!
//! In the task's process, in this order (wharf-isolate's `Prepared::apply` takes the same
//! steps for a program that contains a process itself): its cgroups joined (so everything the
//! task starts is counted, limited and killed with it; once it has dropped its privileges it
//! could no longer move itself), private namespaces (a task that can reach `/proc` gets one of
//! its own with its PID namespace), the bind mounts of its host volumes (read-only ones
//! remounted read-only), the Landlock ruleset built from its rules (paths opened as root, in
//! its mount namespace), no supplementary groups, the workload user's gid and uid (which drops
//! every capability), `no_new_privs`, and last the ruleset enforced. The PID namespace is made
//! by the shim just before the clone, so the task is its pid 1.

use super::text::{Argv, Lossy};
use core::ffi::CStr;
use core::fmt::{self, Write};
use wharf_nolibc::contain::{self as steps, Step};
use wharf_nolibc::sys::{self, Errno};

/// A containment on the command line: the arguments of `range` in `argv`, checked.
#[derive(Debug)]
pub(crate) struct Plan<'a> {
    argv: &'a Argv<'a>,
    range: core::ops::Range<usize>,
    user: Option<u32>,
    no_new_privs: bool,
    pid_ns: bool,
    ipc_ns: bool,
    landlock: bool,
    /// Whether the task can reach `/proc` (no Landlock, or a rule for `/` or `/proc`), and so
    /// gets a `/proc` of its own with a PID namespace.
    reaches_proc: bool,
    mounts: bool,
}

/// A failed step and its error number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Failure {
    pub(crate) step: Step,
    pub(crate) errno: i32,
}

fn fail(step: Step) -> impl Fn(Errno) -> Failure {
    move |e| Failure { step, errno: e.0 }
}

const CGROUP: &[u8] = b"cgroup=";
const USER: &[u8] = b"user=";
const BIND: &[u8] = b"bind=";
const BIND_AT: &[u8] = b"bind-at=";
const RULE: &[u8] = b"rule=";

impl<'a> Plan<'a> {
    /// Reads the containment of `range` in `argv`; the error is the first argument that is not
    /// one (or, for a `bind=` without its `bind-at=`, the `bind=`).
    pub(crate) fn parse(
        argv: &'a Argv<'a>,
        range: core::ops::Range<usize>,
    ) -> Result<Plan<'a>, &'a CStr> {
        let mut plan = Plan {
            argv,
            range: range.clone(),
            user: None,
            no_new_privs: false,
            pid_ns: false,
            ipc_ns: false,
            landlock: false,
            reaches_proc: false,
            mounts: false,
        };
        let mut any_rule_reaches_proc = false;
        let mut index = range.start;
        while index < range.end {
            let arg = argv.get(index).unwrap_or(c"");
            let bytes = arg.to_bytes();
            index += 1;
            match bytes {
                b"no-new-privs" => plan.no_new_privs = true,
                b"pid-ns" => plan.pid_ns = true,
                b"ipc-ns" => plan.ipc_ns = true,
                b"landlock" => plan.landlock = true,
                _ if bytes.starts_with(CGROUP) => {
                    if !bytes[CGROUP.len()..].starts_with(b"/") {
                        return Err(arg);
                    }
                }
                _ if bytes.starts_with(USER) => {
                    let id = super::text::parse_u64(&bytes[USER.len()..])
                        .and_then(|id| u32::try_from(id).ok())
                        .filter(|id| *id != 0 && *id != u32::MAX);
                    plan.user = Some(id.ok_or(arg)?);
                }
                _ if bytes.starts_with(BIND) => {
                    let at = argv.get(index).filter(|_| index < range.end).ok_or(arg)?;
                    index += 1;
                    parse_bind(arg, at).ok_or(arg)?;
                    plan.mounts = true;
                }
                // A rule without Landlock would leave the task less contained than asked.
                _ if bytes.starts_with(RULE) && plan.landlock => {
                    let rule = parse_rule(arg).ok_or(arg)?;
                    let path = rule.path.to_bytes();
                    any_rule_reaches_proc |=
                        path == b"/" || path == b"/proc" || path.starts_with(b"/proc/");
                }
                _ => return Err(arg),
            }
        }
        plan.reaches_proc = !plan.landlock || any_rule_reaches_proc;
        Ok(plan)
    }

    fn args(&self) -> impl Iterator<Item = &'a CStr> + use<'a> {
        let argv = self.argv;
        self.range.clone().filter_map(move |index| argv.get(index))
    }

    fn cgroups(&self) -> impl Iterator<Item = &'a CStr> + use<'a> {
        self.args().filter_map(|arg| suffix(arg, CGROUP))
    }

    fn binds(&self) -> impl Iterator<Item = Bind<'a>> + use<'a> {
        let mut args = self.args();
        core::iter::from_fn(move || {
            let bind = args.find(|arg| arg.to_bytes().starts_with(BIND))?;
            parse_bind(bind, args.next()?)
        })
    }

    fn rules(&self) -> impl Iterator<Item = Rule<'a>> + use<'a> {
        self.args().filter(|arg| arg.to_bytes().starts_with(RULE)).filter_map(parse_rule)
    }

    /// In the shim, just before the clone: makes the PID namespace, which only the shim's next
    /// child (the task) enters, as its pid 1.
    pub(crate) fn before_clone(&self) -> Result<(), Errno> {
        if self.pid_ns { sys::unshare(sys::CLONE_NEWPID) } else { Ok(()) }
    }

    /// Contains the calling process (the task's, between its clone and its exec) for good.
    pub(crate) fn apply(&self) -> Result<(), Failure> {
        for (index, procs) in (0..).zip(self.cgroups()) {
            wharf_nolibc::join_cgroup(procs).map_err(fail(Step::JoinCgroup(index)))?;
        }
        let own_proc = self.pid_ns && self.reaches_proc;
        let own_mounts = own_proc || self.mounts;
        let mut flags = 0;
        if own_mounts {
            flags |= sys::CLONE_NEWNS;
        }
        if self.ipc_ns {
            flags |= sys::CLONE_NEWIPC;
        }
        if flags != 0 {
            sys::unshare(flags).map_err(fail(Step::Namespaces))?;
        }
        if self.pid_ns && sys::getpid() != 1 {
            return Err(Failure { step: Step::Namespaces, errno: sys::EINVAL });
        }
        if own_mounts {
            steps::make_mounts_slave().map_err(fail(Step::MountSlave))?;
        }
        if own_proc {
            steps::mount_proc().map_err(fail(Step::MountProc))?;
        }
        for (index, bind) in (0..).zip(self.binds()) {
            steps::bind_mount(bind.source, bind.beneath_root, bind.read_only)
                .map_err(fail(Step::BindMount(index)))?;
        }
        let ruleset = if self.landlock { Some(self.landlock_ruleset()?) } else { None };
        let restricted = self.drop_privileges().and_then(|()| match ruleset {
            Some(ruleset) => {
                sys::landlock_restrict_self(ruleset).map_err(fail(Step::LandlockRestrict))
            }
            None => Ok(()),
        });
        if let Some(ruleset) = ruleset {
            sys::close(ruleset);
        }
        restricted
    }

    /// The Landlock ruleset of the rules, each cut to what the kernel handles. Each rule's path
    /// is opened (`O_PATH`, close-on-exec) and left open: the exec closes them all, which saves
    /// a call per rule; should the descriptors run out, those opened so far are closed at once.
    fn landlock_ruleset(&self) -> Result<i32, Failure> {
        let abi = sys::landlock_abi().map_err(fail(Step::LandlockRuleset))?;
        let handled = steps::landlock_handled(abi);
        let ruleset = sys::landlock_create_ruleset(handled, steps::landlock_scoped(abi))
            .map_err(fail(Step::LandlockRuleset))?;
        // Descriptors above the ruleset's are the rules' (or this process's copies of the
        // shim's, which it does not need: its stdio are in place).
        let first_rule_fd = ruleset + 1;
        for (index, rule) in (0..).zip(self.rules()) {
            let open = || sys::open(rule.path, sys::O_PATH | sys::O_CLOEXEC, 0);
            let opened = match open() {
                Err(Errno(sys::EMFILE)) => {
                    let _ = sys::close_from(first_rule_fd as u32);
                    open()
                }
                opened => opened,
            };
            let added = match opened {
                Ok(target) => steps::landlock_allow(ruleset, target, rule.access & handled),
                Err(Errno(sys::ENOENT | sys::ENOTDIR)) if rule.if_exists => Ok(()),
                Err(e) => Err(e),
            };
            added.map_err(fail(Step::LandlockRule(index)))?;
        }
        Ok(ruleset)
    }

    /// The workload user and `no_new_privs` (always with Landlock: enforcing needs it).
    fn drop_privileges(&self) -> Result<(), Failure> {
        if let Some(user) = self.user {
            sys::clear_groups().map_err(fail(Step::Groups))?;
            sys::set_gid(user).map_err(fail(Step::Gid))?;
            sys::set_uid(user).map_err(fail(Step::Uid))?;
        }
        if self.no_new_privs || self.landlock {
            sys::set_no_new_privs().map_err(fail(Step::NoNewPrivs))?;
        }
        Ok(())
    }

    /// What failed, for people (the driver adds the error's text).
    pub(crate) fn describe(&self, failure: Failure, out: &mut dyn Write) -> fmt::Result {
        match failure.step {
            Step::JoinCgroup(index) => {
                let path = self.cgroups().nth(index as usize).map_or(&b""[..], CStr::to_bytes);
                write!(out, "cannot join the task's cgroup ({})", Lossy(path))
            }
            Step::Namespaces => out.write_str("cannot make the private namespaces"),
            Step::MountSlave => out.write_str("cannot make the task's mounts private"),
            Step::MountProc => out.write_str("cannot mount the task's /proc"),
            Step::BindMount(index) => match self.binds().nth(index as usize) {
                Some(bind) => write!(
                    out,
                    "cannot mount {} at /{}",
                    Lossy(bind.source.to_bytes()),
                    Lossy(bind.beneath_root.to_bytes())
                ),
                None => write!(out, "cannot make bind mount {index}"),
            },
            Step::LandlockRuleset => out.write_str("cannot create the Landlock ruleset"),
            Step::LandlockRule(index) => match self.rules().nth(index as usize) {
                Some(rule) => write!(out, "cannot unveil {}", Lossy(rule.path.to_bytes())),
                None => write!(out, "cannot add Landlock rule {index}"),
            },
            Step::Groups => out.write_str("cannot drop supplementary groups"),
            Step::Gid => out.write_str("cannot switch to the workload user's group"),
            Step::Uid => out.write_str("cannot switch to the workload user"),
            Step::NoNewPrivs => out.write_str("cannot set no_new_privs"),
            Step::LandlockRestrict => out.write_str("cannot enforce the Landlock ruleset"),
        }
    }
}

/// The rest of `arg` after `prefix`, if it starts with it.
fn suffix<'a>(arg: &'a CStr, prefix: &[u8]) -> Option<&'a CStr> {
    let bytes = arg.to_bytes_with_nul();
    bytes.starts_with(prefix).then(|| CStr::from_bytes_with_nul(&bytes[prefix.len()..]).ok())?
}

/// A host volume bound for the task.
#[derive(Debug, Clone, Copy)]
struct Bind<'a> {
    source: &'a CStr,
    /// The destination relative to `/`.
    beneath_root: &'a CStr,
    read_only: bool,
}

/// `bind=<ro|rw>,<source>` and `bind-at=<destination>`, both absolute, the destination a plain
/// path below `/` (no `.` or `..`).
fn parse_bind<'a>(bind: &'a CStr, at: &'a CStr) -> Option<Bind<'a>> {
    let spec = suffix(bind, BIND)?;
    let read_only = match spec.to_bytes().get(..3)? {
        b"ro," => true,
        b"rw," => false,
        _ => return None,
    };
    let source = CStr::from_bytes_with_nul(&spec.to_bytes_with_nul()[3..]).ok()?;
    let destination = suffix(at, BIND_AT)?.to_bytes_with_nul();
    let beneath_root = CStr::from_bytes_with_nul(destination.strip_prefix(b"/")?).ok()?;
    let plain = beneath_root
        .to_bytes()
        .split(|b| *b == b'/')
        .all(|component| component != b"." && component != b"..");
    let covers_root = beneath_root.to_bytes().iter().all(|b| *b == b'/');
    (source.to_bytes().starts_with(b"/") && plain && !covers_root).then_some(Bind {
        source,
        beneath_root,
        read_only,
    })
}

/// A Landlock rule: `rule=<rights in hex>,<if-exists|must-exist>,<absolute path>`.
#[derive(Debug, Clone, Copy)]
struct Rule<'a> {
    path: &'a CStr,
    access: u64,
    if_exists: bool,
}

fn parse_rule(arg: &CStr) -> Option<Rule<'_>> {
    let text = suffix(arg, RULE)?.to_bytes_with_nul();
    let comma = text.iter().position(|b| *b == b',')?;
    let access = parse_hex(&text[..comma]).filter(|bits| *bits <= 0xffff)?;
    let rest = &text[comma + 1..];
    let (if_exists, path) = if let Some(path) = rest.strip_prefix(b"if-exists,") {
        (true, path)
    } else {
        (false, rest.strip_prefix(b"must-exist,")?)
    };
    let path = CStr::from_bytes_with_nul(path).ok().filter(|p| p.to_bytes().starts_with(b"/"))?;
    Some(Rule { path, access, if_exists })
}

fn parse_hex(text: &[u8]) -> Option<u64> {
    if text.is_empty() || text.len() > 16 {
        return None;
    }
    text.iter().try_fold(0u64, |n, &b| {
        let digit = (b as char).to_digit(16)?;
        Some(n << 4 | u64::from(digit))
    })
}

#[cfg(test)]
mod tests {
    use super::super::args::tests::OwnedArgv;
    use super::*;
    use std::ffi::OsString;
    use std::path::PathBuf;
    use wharf_isolate::landlock::{Access, Rule as IsolateRule};
    use wharf_isolate::namespace::Namespaces;
    use wharf_isolate::{BindMount, Containment};

    fn sample() -> Containment {
        Containment {
            cgroup: vec!["/sys/fs/cgroup/a/cgroup.procs".into(), "/sys/fs/cgroup/b/tasks".into()],
            user: wharf_isolate::users::Ugid::new(80_001),
            no_new_privs: true,
            landlock: Some(vec![
                IsolateRule { path: "/usr".into(), access: Access::FILE, if_exists: true },
                IsolateRule { path: "/srv/task".into(), access: Access::EXECUTE, if_exists: false },
            ]),
            namespaces: Namespaces { pid: true, ipc: true },
            mounts: vec![BindMount {
                source: "/srv/data".into(),
                destination: "/srv/task/data".into(),
                read_only: true,
            }],
        }
    }

    /// The command line of `containment` without its end marker, as the shim's `Args` give it.
    fn argv_of(containment: &Containment) -> OwnedArgv {
        let mut args = containment.to_args();
        assert_eq!(args.pop(), Some(OsString::from("end")));
        OwnedArgv::new(&args)
    }

    /// Every argument wharf-isolate writes is read back as written.
    #[test]
    fn a_containment_is_read_back_from_the_command_line() {
        let containment = sample();
        let owned = argv_of(&containment);
        let argv = owned.argv();
        let plan = Plan::parse(&argv, 0..argv.len()).unwrap();
        let cgroups: Vec<PathBuf> = plan.cgroups().map(|c| c.to_str().unwrap().into()).collect();
        assert_eq!(cgroups, containment.cgroup);
        assert_eq!(plan.user, Some(80_001));
        assert!(plan.no_new_privs && plan.pid_ns && plan.ipc_ns && plan.landlock && plan.mounts);
        assert!(!plan.reaches_proc, "no rule reaches /proc");
        let rules: Vec<(String, u64, bool)> = plan
            .rules()
            .map(|r| (r.path.to_str().unwrap().into(), r.access, r.if_exists))
            .collect();
        assert_eq!(
            rules,
            [
                ("/usr".into(), Access::FILE.bits(), true),
                ("/srv/task".into(), Access::EXECUTE.bits(), false)
            ]
        );
        let binds: Vec<(&CStr, &CStr, bool)> =
            plan.binds().map(|b| (b.source, b.beneath_root, b.read_only)).collect();
        assert_eq!(binds, [(c"/srv/data", c"srv/task/data", true)]);
    }

    #[test]
    fn only_a_task_that_can_reach_proc_gets_its_own() {
        let reaches = |landlock: Option<&[&str]>| {
            let containment = Containment {
                landlock: landlock.map(|paths| {
                    paths
                        .iter()
                        .map(|p| IsolateRule {
                            path: p.into(),
                            access: Access::FILE,
                            if_exists: true,
                        })
                        .collect()
                }),
                ..Containment::default()
            };
            let owned = argv_of(&containment);
            let argv = owned.argv();
            Plan::parse(&argv, 0..argv.len()).unwrap().reaches_proc
        };
        assert!(reaches(None));
        assert!(reaches(Some(&["/usr", "/"])));
        assert!(reaches(Some(&["/proc/self"])));
        assert!(reaches(Some(&["/proc"])));
        assert!(!reaches(Some(&["/usr", "/procfs"])));
        assert!(!reaches(Some(&[])));
    }

    /// Bad arguments are refused, naming the argument, rather than half-applied.
    #[test]
    fn bad_containment_arguments_are_named() {
        for (args, bad) in [
            (&["pid-ns", "mount-ns"][..], "mount-ns"),
            (&["cgroup=relative/cgroup.procs"], "cgroup=relative/cgroup.procs"),
            (&["user=0"], "user=0"),
            (&["user=4294967295"], "user=4294967295"),
            (&["user=x"], "user=x"),
            (&["bind=ro,/a"], "bind=ro,/a"),
            (&["bind=rx,/a", "bind-at=/b"], "bind=rx,/a"),
            (&["bind=ro,/a", "bind-at=/b/../c"], "bind=ro,/a"),
            (&["bind=ro,/a", "bind-at=/"], "bind=ro,/a"),
            (&["bind=ro,a", "bind-at=/b"], "bind=ro,a"),
            (&["landlock", "rule=3,if-exists,relative"], "rule=3,if-exists,relative"),
            (&["landlock", "rule=10000,if-exists,/a"], "rule=10000,if-exists,/a"),
            (&["landlock", "rule=3,maybe,/a"], "rule=3,maybe,/a"),
            (&["landlock", "rule=,must-exist,/a"], "rule=,must-exist,/a"),
            (&["rule=3,must-exist,/a", "landlock"], "rule=3,must-exist,/a"),
        ] {
            let args: Vec<OsString> = args.iter().map(OsString::from).collect();
            let owned = OwnedArgv::new(&args);
            let argv = owned.argv();
            let error = Plan::parse(&argv, 0..argv.len()).unwrap_err();
            assert_eq!(error.to_str(), Ok(bad), "{args:?}");
        }
    }

    /// A task with more rules than it may open descriptors still gets every one: the rules'
    /// descriptors are closed when they run out, and the ruleset is enforced.
    #[test]
    fn more_rules_than_descriptors_are_all_applied() {
        let mut args: Vec<OsString> = vec!["landlock".into()];
        // Read and list everything, write nothing.
        args.extend((0..64).map(|_| OsString::from("rule=d,must-exist,/")));
        let owned = OwnedArgv::new(&args);
        let argv = owned.argv();
        let plan = Plan::parse(&argv, 0..argv.len()).unwrap();
        let scratch = tempfile::tempdir().unwrap();
        let new_file = std::ffi::CString::new(
            scratch.path().join("new").into_os_string().into_encoded_bytes(),
        )
        .unwrap();
        // SAFETY: the child makes system calls only (`apply` allocates nothing) and exits.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            // SAFETY: dup, close, setrlimit, open and _exit with valid arguments.
            let code = unsafe {
                // Room for eight more descriptors: the ruleset and seven rules at a time.
                let lowest_free = libc::dup(0);
                libc::close(lowest_free);
                let room = (lowest_free + 8) as libc::rlim_t;
                let limit = libc::rlimit { rlim_cur: room, rlim_max: room };
                if lowest_free < 0 || libc::setrlimit(libc::RLIMIT_NOFILE, &limit) != 0 {
                    3
                } else if plan.apply().is_err() {
                    1
                } else if libc::open(new_file.as_ptr(), libc::O_CREAT | libc::O_WRONLY, 0o600) >= 0
                {
                    2
                } else {
                    0
                }
            };
            // SAFETY: ends the child without running anything of the parent's.
            unsafe { libc::_exit(code) };
        }
        assert!(pid > 0, "fork failed");
        let mut status = 0;
        // SAFETY: our own child; `status` is writable.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        assert!(libc::WIFEXITED(status), "{status:#x}");
        let code = libc::WEXITSTATUS(status);
        assert_eq!(code, 0, "1: apply failed, 2: the write was allowed, 3: setrlimit failed");
        assert!(!scratch.path().join("new").exists());
    }

    #[test]
    fn failures_name_their_argument() {
        let containment = sample();
        let owned = argv_of(&containment);
        let argv = owned.argv();
        let plan = Plan::parse(&argv, 0..argv.len()).unwrap();
        let describe = |step| {
            let mut text = String::new();
            plan.describe(Failure { step, errno: 13 }, &mut text).unwrap();
            text
        };
        assert_eq!(
            describe(Step::JoinCgroup(1)),
            "cannot join the task's cgroup (/sys/fs/cgroup/b/tasks)"
        );
        assert_eq!(describe(Step::LandlockRule(1)), "cannot unveil /srv/task");
        assert_eq!(describe(Step::BindMount(0)), "cannot mount /srv/data at /srv/task/data");
        assert_eq!(describe(Step::Uid), "cannot switch to the workload user");
    }
}
