//! A task's containment: the plan ([`Containment`]), which a driver hands to the task's shim
//! on its command line, and the steps the task's own process takes between fork and exec
//! ([`Prepared::apply`]).
//!
//! ```text
//! driver:  Containment ──to_args──▶ shim command line
//! shim:    Containment::parse_args ─▶ prepare (paths to C strings, the Landlock ABI)
//!          before_fork (PID namespace) ─▶ fork ─▶ child: apply ─▶ execve
//! ```
//!
//! In the child, in this order: the task's cgroup joined (so everything the task ever starts
//! is counted, limited and killed with it; a process that dropped its privileges could no
//! longer move itself), private namespaces (and, if it can reach `/proc`, a `/proc` of its
//! own), the bind mounts of its host volumes (in a mount namespace of its own, read-only ones
//! remounted read-only), the Landlock
//! ruleset built from the rules (paths opened as root, in the task's mount namespace), no
//! supplementary groups, the workload user's gid and uid (which drops every capability),
//! `no_new_privs`, and last the ruleset enforced. [`Prepared::apply`] allocates nothing and
//! reports a failure as a [`ContainmentFailure`] (a step and an error number) small enough to go through
//! a pipe, so it is safe in the child of a multi-threaded process too.

use crate::error::IsolateError;
use crate::landlock::{self, Access, Rule};
use crate::namespace::Namespaces;
use crate::sys;
use crate::users::Ugid;
use std::ffi::{CString, OsStr, OsString};
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// How one task is contained. The default contains nothing.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Containment {
    /// Join the task's cgroup: write `0` into these files (one per hierarchy; see
    /// [`crate::TaskCgroup::join_files`]).
    pub cgroup: Vec<PathBuf>,
    /// Run as this workload user (uid and gid), with no supplementary groups.
    pub user: Option<Ugid>,
    /// Set `no_new_privs` (always set when Landlock is on: enforcing a ruleset needs it).
    pub no_new_privs: bool,
    /// Restrict the file system to these rules; `None`: no Landlock at all. `Some` of an empty
    /// list leaves nothing reachable.
    pub landlock: Option<Vec<Rule>>,
    /// Private namespaces.
    pub namespaces: Namespaces,
    /// Directories of the node bound at other paths, seen by the task alone (they come with a
    /// mount namespace of its own).
    pub mounts: Vec<BindMount>,
}

/// A directory of the node the task sees at another path too.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BindMount {
    /// The node's directory (absolute).
    pub source: PathBuf,
    /// Where the task sees it: an existing directory, by an absolute path with no symbolic
    /// link in it (the child refuses one, `ELOOP`, rather than mount through it).
    pub destination: PathBuf,
    /// Writes through the mount fail (`EROFS`).
    pub read_only: bool,
}

/// The argument that ends a containment on a command line.
const END: &str = "end";

impl Containment {
    /// The containment as command-line arguments, ended by a marker, for
    /// [`Containment::parse_args`] in the shim.
    pub fn to_args(&self) -> Vec<OsString> {
        let mut args: Vec<OsString> = Vec::new();
        for procs in &self.cgroup {
            let mut arg = b"cgroup=".to_vec();
            arg.extend_from_slice(procs.as_os_str().as_bytes());
            args.push(OsString::from_vec(arg));
        }
        if let Some(user) = self.user {
            args.push(format!("user={user}").into());
        }
        if self.no_new_privs {
            args.push("no-new-privs".into());
        }
        if self.namespaces.pid {
            args.push("pid-ns".into());
        }
        if self.namespaces.ipc {
            args.push("ipc-ns".into());
        }
        for mount in &self.mounts {
            let mut arg = if mount.read_only { b"bind=ro,".to_vec() } else { b"bind=rw,".to_vec() };
            arg.extend_from_slice(mount.source.as_os_str().as_bytes());
            args.push(OsString::from_vec(arg));
            let mut arg = b"bind-at=".to_vec();
            arg.extend_from_slice(mount.destination.as_os_str().as_bytes());
            args.push(OsString::from_vec(arg));
        }
        if let Some(rules) = &self.landlock {
            args.push("landlock".into());
            for rule in rules {
                let mut arg = format!(
                    "rule={:x},{},",
                    rule.access.bits(),
                    if rule.if_exists { "if-exists" } else { "must-exist" }
                )
                .into_bytes();
                arg.extend_from_slice(rule.path.as_os_str().as_bytes());
                args.push(OsString::from_vec(arg));
            }
        }
        args.push(END.into());
        args
    }

    /// Reads what [`Containment::to_args`] wrote, up to and including its end marker.
    pub fn parse_args(args: &mut impl Iterator<Item = OsString>) -> Result<Containment, String> {
        let mut containment = Containment::default();
        loop {
            let arg = args.next().ok_or("the containment has no end marker")?;
            let bytes = arg.as_bytes();
            match bytes {
                b"end" => return Ok(containment),
                b"no-new-privs" => containment.no_new_privs = true,
                b"pid-ns" => containment.namespaces.pid = true,
                b"ipc-ns" => containment.namespaces.ipc = true,
                b"landlock" => containment.landlock = Some(Vec::new()),
                _ => {
                    if let Some(procs) = bytes.strip_prefix(b"cgroup=") {
                        if !procs.starts_with(b"/") {
                            return Err(format!("bad cgroup {:?}", arg.to_string_lossy()));
                        }
                        containment.cgroup.push(PathBuf::from(OsStr::from_bytes(procs)));
                    } else if let Some(id) = bytes.strip_prefix(b"user=") {
                        let user = std::str::from_utf8(id)
                            .ok()
                            .and_then(|id| id.parse().ok())
                            .and_then(Ugid::new)
                            .ok_or_else(|| format!("bad user {:?}", arg.to_string_lossy()))?;
                        containment.user = Some(user);
                    } else if let Some(bind) = bytes.strip_prefix(b"bind=") {
                        let mount = parse_bind(bind, args.next())
                            .ok_or_else(|| format!("bad bind {:?}", arg.to_string_lossy()))?;
                        containment.mounts.push(mount);
                    } else if let Some(rule) = bytes.strip_prefix(b"rule=") {
                        let rule = parse_rule(rule)
                            .ok_or_else(|| format!("bad rule {:?}", arg.to_string_lossy()))?;
                        containment
                            .landlock
                            .as_mut()
                            .ok_or("a Landlock rule before the landlock marker")?
                            .push(rule);
                    } else {
                        return Err(format!("unknown containment {:?}", arg.to_string_lossy()));
                    }
                }
            }
        }
    }

    /// Whether it contains nothing: the task runs as its parent does.
    pub fn is_empty(&self) -> bool {
        *self == Containment::default()
    }

    /// Gets ready to contain a task: opens the cgroup files, checks what the kernel offers and
    /// turns paths into C strings, so that [`Prepared::apply`] has nothing left to allocate.
    pub fn prepare(&self) -> Result<Prepared, IsolateError> {
        let cgroup = self
            .cgroup
            .iter()
            .map(|procs| {
                std::fs::OpenOptions::new()
                    .write(true)
                    .custom_flags(libc::O_CLOEXEC)
                    .open(procs)
                    .map(OwnedFd::from)
                    .map_err(IsolateError::io(procs))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let landlock = match &self.landlock {
            None => None,
            Some(rules) => {
                let abi = landlock::abi()?;
                let handled = Access::handled_by(abi);
                let scoped = if abi >= 6 { SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL } else { 0 };
                let rules = rules
                    .iter()
                    .map(|rule| {
                        let path =
                            CString::new(rule.path.as_os_str().as_bytes()).map_err(|_| {
                                IsolateError::Unveil {
                                    entry: rule.path.display().to_string(),
                                    reason: "the path contains a NUL byte".into(),
                                }
                            })?;
                        let access = rule.access.intersection(handled).bits();
                        Ok(PreparedRule { path, access, if_exists: rule.if_exists })
                    })
                    .collect::<Result<Vec<_>, IsolateError>>()?;
                Some(PreparedLandlock { abi, handled: handled.bits(), scoped, rules })
            }
        };
        let mounts = self
            .mounts
            .iter()
            .map(|mount| {
                let c_path = |path: &Path| {
                    CString::new(path.as_os_str().as_bytes()).map_err(|_| IsolateError::Invalid {
                        what: path.display().to_string(),
                        reason: "the path contains a NUL byte".into(),
                    })
                };
                Ok(PreparedMount {
                    source: c_path(&mount.source)?,
                    beneath_root: c_path(beneath_root(&mount.destination)?)?,
                    read_only: mount.read_only,
                })
            })
            .collect::<Result<Vec<_>, IsolateError>>()?;
        Ok(Prepared {
            mounts,
            own_proc: reaches_proc(self.landlock.as_deref()),
            cgroup,
            user: self.user,
            no_new_privs: self.no_new_privs || landlock.is_some(),
            landlock,
            namespaces: self.namespaces,
        })
    }
}

/// Whether a task under these Landlock rules (`None`: no Landlock) can reach `/proc`, and so
/// needs one of its own in a private PID namespace.
fn reaches_proc(rules: Option<&[Rule]>) -> bool {
    rules.is_none_or(|rules| {
        rules.iter().any(|r| r.path == Path::new("/") || r.path.starts_with("/proc"))
    })
}

/// A bind's destination (absolute) relative to `/`, which the child opens beneath `/` with no
/// link on the way.
fn beneath_root(destination: &Path) -> Result<&Path, IsolateError> {
    let invalid = |reason: &str| IsolateError::Invalid {
        what: destination.display().to_string(),
        reason: reason.into(),
    };
    let relative = destination
        .strip_prefix("/")
        .map_err(|_| invalid("a bind's destination must be absolute"))?;
    if relative.components().any(|c| !matches!(c, std::path::Component::Normal(_))) {
        return Err(invalid("a bind's destination must be a plain path below /, without . or .."));
    }
    if relative.file_name().is_none() {
        return Err(invalid("a bind cannot cover /"));
    }
    Ok(relative)
}

/// `bind=<ro|rw>,<source>` (after the `bind=`), then `bind-at=<destination>`: both absolute.
fn parse_bind(text: &[u8], at: Option<OsString>) -> Option<BindMount> {
    let (read_only, source) = match text.split_at_checked(3)? {
        (b"ro,", source) => (true, source),
        (b"rw,", source) => (false, source),
        _ => return None,
    };
    let at = at?;
    let destination = at.as_bytes().strip_prefix(b"bind-at=")?;
    if !source.starts_with(b"/") || !destination.starts_with(b"/") {
        return None;
    }
    Some(BindMount {
        source: PathBuf::from(OsStr::from_bytes(source)),
        destination: PathBuf::from(OsStr::from_bytes(destination)),
        read_only,
    })
}

/// `rule=<access in hex>,<if-exists|must-exist>,<path>`, after the `rule=`.
fn parse_rule(text: &[u8]) -> Option<Rule> {
    let mut parts = text.splitn(3, |b| *b == b',');
    let access = u64::from_str_radix(std::str::from_utf8(parts.next()?).ok()?, 16).ok()?;
    let if_exists = match parts.next()? {
        b"if-exists" => true,
        b"must-exist" => false,
        _ => return None,
    };
    let path = parts.next().filter(|p| p.starts_with(b"/"))?;
    Some(Rule {
        path: PathBuf::from(OsStr::from_bytes(path)),
        access: Access::from_bits(access)?,
        if_exists,
    })
}

/// `LANDLOCK_SCOPE_ABSTRACT_UNIX_SOCKET` (ABI 6).
const SCOPE_ABSTRACT_UNIX_SOCKET: u64 = 1 << 0;
/// `LANDLOCK_SCOPE_SIGNAL` (ABI 6).
const SCOPE_SIGNAL: u64 = 1 << 1;

/// A [`Containment`] ready to be applied.
#[derive(Debug)]
pub struct Prepared {
    /// The cgroup files the process joins through, open for writing.
    cgroup: Vec<OwnedFd>,
    user: Option<Ugid>,
    no_new_privs: bool,
    landlock: Option<PreparedLandlock>,
    namespaces: Namespaces,
    /// Whether a PID namespace comes with a `/proc` of its own (a mount namespace).
    own_proc: bool,
    mounts: Vec<PreparedMount>,
}

#[derive(Debug)]
struct PreparedMount {
    source: CString,
    /// The destination, relative to `/`.
    beneath_root: CString,
    read_only: bool,
}

#[derive(Debug)]
struct PreparedLandlock {
    abi: u32,
    handled: u64,
    scoped: u64,
    rules: Vec<PreparedRule>,
}

#[derive(Debug)]
struct PreparedRule {
    path: CString,
    /// Only rights the kernel handles.
    access: u64,
    if_exists: bool,
}

impl Prepared {
    /// The Landlock ABI that will be used, if Landlock is on.
    pub fn landlock_abi(&self) -> Option<u32> {
        self.landlock.as_ref().map(|l| l.abi)
    }

    /// What the parent does just before it forks the task: makes the PID namespace, which only
    /// the caller's next children enter. Call it in the process (and thread) that then forks
    /// exactly one child for the task; that child becomes the namespace's pid 1.
    pub fn before_fork(&self) -> Result<(), IsolateError> {
        if self.namespaces.pid {
            sys::unshare(libc::CLONE_NEWPID)
                .map_err(|source| IsolateError::Sys { call: "unshare", source })?;
        }
        Ok(())
    }

    /// Contains the calling process for good: call it in the task's process between fork and
    /// exec (the forked child, single-threaded). It allocates nothing.
    pub fn apply(&self) -> Result<(), ContainmentFailure> {
        for (index, procs) in self.cgroup.iter().enumerate() {
            // "0" is the writing process itself.
            let step = ContainmentStep::JoinCgroup(u32::try_from(index).unwrap_or(u32::MAX));
            sys::write_once(procs.as_fd(), b"0").map_err(fail(step))?;
        }
        let own_mounts = self.namespaces.pid && self.own_proc || !self.mounts.is_empty();
        let mut flags = self.namespaces.child_flags(self.own_proc);
        if own_mounts {
            flags |= libc::CLONE_NEWNS;
        }
        if flags != 0 {
            sys::unshare(flags).map_err(fail(ContainmentStep::Namespaces))?;
        }
        // The PID namespace is made before the fork, so the task must be its pid 1.
        if self.namespaces.pid && std::process::id() != 1 {
            return Err(ContainmentFailure {
                step: ContainmentStep::Namespaces,
                errno: libc::EINVAL,
            });
        }
        if own_mounts {
            sys::make_mounts_slave().map_err(fail(ContainmentStep::MountSlave))?;
        }
        if self.namespaces.pid && self.own_proc {
            sys::mount_proc().map_err(fail(ContainmentStep::MountProc))?;
        }
        for (index, mount) in self.mounts.iter().enumerate() {
            let step = ContainmentStep::BindMount(u32::try_from(index).unwrap_or(u32::MAX));
            sys::bind_mount(&mount.source, &mount.beneath_root, mount.read_only)
                .map_err(fail(step))?;
        }
        let ruleset = match &self.landlock {
            Some(landlock) => Some(landlock.build()?),
            None => None,
        };
        if let Some(user) = self.user {
            sys::clear_groups().map_err(fail(ContainmentStep::Groups))?;
            sys::set_gid(user.get()).map_err(fail(ContainmentStep::Gid))?;
            sys::set_uid(user.get()).map_err(fail(ContainmentStep::Uid))?;
        }
        if self.no_new_privs {
            sys::set_no_new_privs().map_err(fail(ContainmentStep::NoNewPrivs))?;
        }
        if let Some(ruleset) = ruleset {
            sys::landlock_restrict_self(ruleset.as_fd())
                .map_err(fail(ContainmentStep::LandlockRestrict))?;
        }
        Ok(())
    }
}

impl PreparedLandlock {
    /// The ruleset, built from the rules: each path opened (`O_PATH`), its rights cut down to
    /// a file's if it is not a directory.
    fn build(&self) -> Result<OwnedFd, ContainmentFailure> {
        let ruleset = sys::landlock_create_ruleset(self.handled, self.scoped)
            .map_err(fail(ContainmentStep::LandlockRuleset))?;
        for (index, rule) in self.rules.iter().enumerate() {
            let step = ContainmentStep::LandlockRule(u32::try_from(index).unwrap_or(u32::MAX));
            let target = match sys::open_path(&rule.path) {
                Ok(fd) => fd,
                Err(e)
                    if rule.if_exists
                        && matches!(e.raw_os_error(), Some(libc::ENOENT | libc::ENOTDIR)) =>
                {
                    continue;
                }
                Err(e) => return Err(fail(step)(e)),
            };
            let access = if sys::is_dir(target.as_fd()).map_err(fail(step))? {
                rule.access
            } else {
                rule.access & Access::FILE.bits()
            };
            if access != 0 {
                sys::landlock_add_path_rule(ruleset.as_fd(), target.as_fd(), access)
                    .map_err(fail(step))?;
            }
        }
        Ok(ruleset)
    }
}

fn fail(step: ContainmentStep) -> impl Fn(io::Error) -> ContainmentFailure {
    move |error| ContainmentFailure { step, errno: error.raw_os_error().unwrap_or(0) }
}

/// The step of [`Prepared::apply`] that failed (the indexes are of [`Containment::cgroup`],
/// [`Containment::mounts`] and [`Containment::landlock`]). One type with the static shim's,
/// which takes the same steps.
pub use wharf_nolibc::contain::Step as ContainmentStep;

/// A failed step of [`Prepared::apply`] and its error number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ContainmentFailure {
    /// What failed.
    pub step: ContainmentStep,
    /// The OS error number.
    pub errno: i32,
}

impl ContainmentFailure {
    /// The length of [`ContainmentFailure::encode`]'s bytes.
    pub const ENCODED_LEN: usize = 12;

    /// Fixed-size bytes for a pipe: step, rule index, error number.
    pub fn encode(self) -> [u8; ContainmentFailure::ENCODED_LEN] {
        let (code, index) = match self.step {
            ContainmentStep::Namespaces => (1, 0),
            ContainmentStep::MountSlave => (2, 0),
            ContainmentStep::MountProc => (3, 0),
            ContainmentStep::LandlockRuleset => (4, 0),
            ContainmentStep::LandlockRule(index) => (5, index),
            ContainmentStep::Groups => (6, 0),
            ContainmentStep::Gid => (7, 0),
            ContainmentStep::Uid => (8, 0),
            ContainmentStep::NoNewPrivs => (9, 0),
            ContainmentStep::LandlockRestrict => (10, 0),
            ContainmentStep::JoinCgroup(index) => (11, index),
            ContainmentStep::BindMount(index) => (12, index),
        };
        let mut bytes = [0; ContainmentFailure::ENCODED_LEN];
        bytes[..4].copy_from_slice(&u32::to_le_bytes(code));
        bytes[4..8].copy_from_slice(&u32::to_le_bytes(index));
        bytes[8..].copy_from_slice(&i32::to_le_bytes(self.errno));
        bytes
    }

    /// Reads [`ContainmentFailure::encode`]'s bytes; `None` if they are not such.
    pub fn decode(bytes: &[u8]) -> Option<ContainmentFailure> {
        let word = |at: usize| Some(u32::from_le_bytes(bytes.get(at..at + 4)?.try_into().ok()?));
        if bytes.len() != ContainmentFailure::ENCODED_LEN {
            return None;
        }
        let step = match word(0)? {
            1 => ContainmentStep::Namespaces,
            2 => ContainmentStep::MountSlave,
            3 => ContainmentStep::MountProc,
            4 => ContainmentStep::LandlockRuleset,
            5 => ContainmentStep::LandlockRule(word(4)?),
            6 => ContainmentStep::Groups,
            7 => ContainmentStep::Gid,
            8 => ContainmentStep::Uid,
            9 => ContainmentStep::NoNewPrivs,
            10 => ContainmentStep::LandlockRestrict,
            11 => ContainmentStep::JoinCgroup(word(4)?),
            12 => ContainmentStep::BindMount(word(4)?),
            _ => return None,
        };
        Some(ContainmentFailure { step, errno: word(8)? as i32 })
    }

    /// What failed, for people, with the rule's path for a Landlock rule of `containment`.
    pub fn describe(&self, containment: &Containment) -> String {
        let error = io::Error::from_raw_os_error(self.errno);
        let what = match self.step {
            ContainmentStep::JoinCgroup(index) => match containment.cgroup.get(index as usize) {
                Some(procs) => format!("cannot join the task's cgroup ({})", procs.display()),
                None => "cannot join the task's cgroup".to_owned(),
            },
            ContainmentStep::Namespaces => "cannot make the private namespaces".to_owned(),
            ContainmentStep::MountSlave => "cannot make the task's mounts private".to_owned(),
            ContainmentStep::MountProc => "cannot mount the task's /proc".to_owned(),
            ContainmentStep::BindMount(index) => match containment.mounts.get(index as usize) {
                Some(mount) => format!(
                    "cannot mount {} at {}",
                    mount.source.display(),
                    mount.destination.display()
                ),
                None => format!("cannot make bind mount {index}"),
            },
            ContainmentStep::LandlockRuleset => "cannot create the Landlock ruleset".to_owned(),
            ContainmentStep::LandlockRule(index) => {
                let rule = containment.landlock.as_ref().and_then(|r| r.get(index as usize));
                match rule {
                    Some(rule) => format!("cannot unveil {}", rule.path.display()),
                    None => format!("cannot add Landlock rule {index}"),
                }
            }
            ContainmentStep::Groups => "cannot drop supplementary groups".to_owned(),
            ContainmentStep::Gid => "cannot switch to the workload user's group".to_owned(),
            ContainmentStep::Uid => "cannot switch to the workload user".to_owned(),
            ContainmentStep::NoNewPrivs => "cannot set no_new_privs".to_owned(),
            ContainmentStep::LandlockRestrict => "cannot enforce the Landlock ruleset".to_owned(),
        };
        format!("{what}: {error}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::landlock::Mode;

    fn sample() -> Containment {
        Containment {
            cgroup: vec!["/sys/fs/cgroup/memory/w/a.t.0/cgroup.procs".into()],
            user: Ugid::new(80_001),
            no_new_privs: true,
            landlock: Some(vec![
                Rule::new("/usr/bin", Mode::READ_EXECUTE.access()),
                Rule { path: "/odd, path".into(), access: Access::READ_FILE, if_exists: true },
            ]),
            namespaces: Namespaces { pid: true, ipc: true },
            mounts: vec![
                BindMount {
                    source: "/srv/a, b".into(),
                    destination: "/data".into(),
                    read_only: true,
                },
                BindMount {
                    source: "/srv/c".into(),
                    destination: "/t/local/c".into(),
                    read_only: false,
                },
            ],
        }
    }

    #[test]
    fn containments_round_trip_through_arguments() {
        for containment in [
            sample(),
            Containment::default(),
            Containment { landlock: Some(Vec::new()), ..Containment::default() },
        ] {
            let mut args = containment.to_args().into_iter().chain(["after".into()]);
            assert_eq!(Containment::parse_args(&mut args).unwrap(), containment);
            assert_eq!(args.next().unwrap(), "after", "the end marker is consumed, no more");
        }
    }

    #[test]
    fn bad_containment_arguments_are_refused() {
        for (args, reason) in [
            (vec![], "no end marker"),
            (vec!["user=0", "end"], "bad user"),
            (vec!["user=x", "end"], "bad user"),
            (vec!["rule=4,must-exist,/a", "end"], "before the landlock marker"),
            (vec!["landlock", "rule=zz,must-exist,/a", "end"], "bad rule"),
            (vec!["landlock", "rule=4,maybe,/a", "end"], "bad rule"),
            (vec!["landlock", "rule=4,if-exists,relative", "end"], "bad rule"),
            (vec!["landlock", "rule=10000,if-exists,/a", "end"], "bad rule"),
            (vec!["chroot", "end"], "unknown containment"),
            (vec!["bind=ro,/a", "end"], "bad bind"),
            (vec!["bind=xx,/a", "bind-at=/b", "end"], "bad bind"),
            (vec!["bind=rw,/a", "bind-at=b", "end"], "bad bind"),
            (vec!["bind=rw,a", "bind-at=/b", "end"], "bad bind"),
            (vec!["cgroup=relative/cgroup.procs", "end"], "bad cgroup"),
        ] {
            let mut args = args.into_iter().map(OsString::from);
            let error = Containment::parse_args(&mut args).unwrap_err();
            assert!(error.contains(reason), "{error}");
        }
    }

    #[test]
    fn only_a_task_that_can_reach_proc_gets_its_own() {
        let rule = |path: &str| Rule::new(path, Access::READ_FILE);
        assert!(reaches_proc(None));
        assert!(!reaches_proc(Some(&[])));
        assert!(!reaches_proc(Some(&[rule("/usr/bin"), rule("/procfs"), rule("/etc")])));
        for path in ["/", "/proc", "/proc/self/status"] {
            assert!(reaches_proc(Some(&[rule("/usr"), rule(path)])), "{path}");
        }
    }

    #[test]
    fn failures_round_trip_through_bytes_and_name_their_rule() {
        for step in [
            ContainmentStep::JoinCgroup(0),
            ContainmentStep::Namespaces,
            ContainmentStep::LandlockRule(1),
            ContainmentStep::Uid,
            ContainmentStep::LandlockRestrict,
            ContainmentStep::BindMount(1),
        ] {
            let failure = ContainmentFailure { step, errno: libc::EPERM };
            assert_eq!(ContainmentFailure::decode(&failure.encode()), Some(failure));
        }
        assert_eq!(ContainmentFailure::decode(&[0; 12]), None);
        assert_eq!(ContainmentFailure::decode(&[1; 5]), None);
        let failure =
            ContainmentFailure { step: ContainmentStep::LandlockRule(1), errno: libc::ENOENT };
        let text = failure.describe(&sample());
        assert!(text.starts_with("cannot unveil /odd, path: No such file"), "{text}");
        let failure =
            ContainmentFailure { step: ContainmentStep::JoinCgroup(0), errno: libc::ENOSPC };
        let text = failure.describe(&sample());
        assert!(
            text.starts_with(
                "cannot join the task's cgroup (/sys/fs/cgroup/memory/w/a.t.0/cgroup.procs)"
            ),
            "{text}"
        );
    }
}
