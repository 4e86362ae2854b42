//! Landlock: the files a task can reach, in the manner of OpenBSD's `unveil` and of Nomad's
//! exec2 driver.
//!
//! A task starts with no access to the file system at all; each [`Rule`] opens one file or
//! directory tree with some [`Access`] rights. Job specs and node settings name rules as
//! [`Unveil`] entries, a mode and a path (`"rx:/usr/bin"`, `"rwc:/srv/data"`), and
//! [`default_unveils`] is the node-level list of system paths a dynamically linked program
//! needs. Once enforced, the task and everything it starts keep the restriction for good.
//!
//! Beyond files, a Landlock domain (ABI 6 and later) also scopes signals and abstract unix
//! sockets: the task cannot signal, or connect to an abstract socket of, any process outside
//! its own domain (other tasks, the agent). The network is not restricted.
//!
//! The rules are turned into a ruleset in the task's own process between fork and exec
//! (`crate::Prepared::apply`), after its namespaces are set up, so that a path such as
//! `/proc` names what the task will see. This module holds the values; the system calls are in
//! `sys`.

use crate::error::IsolateError;
use std::fmt;
use std::path::{Path, PathBuf};

/// A set of Landlock file-system access rights (the bits of `<linux/landlock.h>`).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Access(u64);

impl Access {
    /// Execute a file.
    pub const EXECUTE: Access = Access(1 << 0);
    /// Open a file for writing.
    pub const WRITE_FILE: Access = Access(1 << 1);
    /// Open a file for reading.
    pub const READ_FILE: Access = Access(1 << 2);
    /// List a directory.
    pub const READ_DIR: Access = Access(1 << 3);
    /// Remove or rename a directory.
    pub const REMOVE_DIR: Access = Access(1 << 4);
    /// Remove or rename a file.
    pub const REMOVE_FILE: Access = Access(1 << 5);
    /// Create a character device.
    pub const MAKE_CHAR: Access = Access(1 << 6);
    /// Create a directory.
    pub const MAKE_DIR: Access = Access(1 << 7);
    /// Create a regular file.
    pub const MAKE_REG: Access = Access(1 << 8);
    /// Create a unix socket.
    pub const MAKE_SOCK: Access = Access(1 << 9);
    /// Create a named pipe.
    pub const MAKE_FIFO: Access = Access(1 << 10);
    /// Create a block device.
    pub const MAKE_BLOCK: Access = Access(1 << 11);
    /// Create a symbolic link.
    pub const MAKE_SYM: Access = Access(1 << 12);
    /// Link or rename a file across directories (ABI 2).
    pub const REFER: Access = Access(1 << 13);
    /// Truncate a file (ABI 3).
    pub const TRUNCATE: Access = Access(1 << 14);
    /// Device-specific `ioctl`s on a device file (ABI 5).
    pub const IOCTL_DEV: Access = Access(1 << 15);

    /// No rights.
    pub const NONE: Access = Access(0);
    /// The rights that mean something for a file that is not a directory; the others apply to
    /// what a directory holds.
    pub const FILE: Access = Access(
        Access::EXECUTE.0
            | Access::WRITE_FILE.0
            | Access::READ_FILE.0
            | Access::TRUNCATE.0
            | Access::IOCTL_DEV.0,
    );

    /// Every right this crate knows.
    const KNOWN: Access = Access((1 << 16) - 1);

    /// Every right a kernel with Landlock ABI `abi` can restrict (none for 0).
    pub fn handled_by(abi: u32) -> Access {
        let bits = match abi {
            0 => 0,
            1 => (1 << 13) - 1,
            2 => (1 << 14) - 1,
            3 | 4 => (1 << 15) - 1,
            _ => (1 << 16) - 1,
        };
        Access(bits)
    }

    /// The raw bits.
    pub fn bits(self) -> u64 {
        self.0
    }

    /// The rights of `bits`; `None` if a bit is not a right this crate knows.
    pub fn from_bits(bits: u64) -> Option<Access> {
        (bits & !Access::KNOWN.0 == 0).then_some(Access(bits))
    }

    /// Both sets.
    #[must_use]
    pub const fn union(self, other: Access) -> Access {
        Access(self.0 | other.0)
    }

    /// The rights of `self` that are not in `other`.
    #[must_use]
    pub const fn without(self, other: Access) -> Access {
        Access(self.0 & !other.0)
    }

    /// The rights in both.
    #[must_use]
    pub const fn intersection(self, other: Access) -> Access {
        Access(self.0 & other.0)
    }

    /// Whether every right of `other` is in `self`.
    pub fn contains(self, other: Access) -> bool {
        self.0 & other.0 == other.0
    }

    /// Whether there are none.
    pub fn is_empty(self) -> bool {
        self.0 == 0
    }
}

impl fmt::Debug for Access {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Access({:#x})", self.0)
    }
}

/// An `unveil` mode: any of `r` (read), `w` (write), `x` (execute) and `c` (create), as
/// exec2 spells them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Mode {
    /// `r`: read files, list directories.
    pub read: bool,
    /// `w`: write and truncate files (and device `ioctl`s).
    pub write: bool,
    /// `x`: execute files.
    pub execute: bool,
    /// `c`: create, remove and rename entries in directories (files, directories, symbolic
    /// links, named pipes, sockets; never devices). Nothing for a file that is not a
    /// directory. exec2 lets `c` create but not remove; wharf lets it do both, since a
    /// program that makes files usually cleans them up.
    pub create: bool,
}

impl Mode {
    /// Every right: `rwxc`.
    pub const ALL: Mode = Mode { read: true, write: true, execute: true, create: true };
    /// Read and execute: `rx`.
    pub const READ_EXECUTE: Mode = Mode { read: true, write: false, execute: true, create: false };
    /// Read only: `r`.
    pub const READ: Mode = Mode { read: true, write: false, execute: false, create: false };

    /// Reads a mode such as `"rwc"`: one or more of `r`, `w`, `x`, `c`, each at most once.
    pub fn parse(text: &str) -> Result<Mode, String> {
        let mut mode = Mode::default();
        if text.is_empty() {
            return Err("an empty mode; use one or more of r, w, x, c".into());
        }
        for letter in text.chars() {
            let flag = match letter {
                'r' => &mut mode.read,
                'w' => &mut mode.write,
                'x' => &mut mode.execute,
                'c' => &mut mode.create,
                other => {
                    return Err(format!("mode {text:?}: {other:?} is not one of r, w, x, c"));
                }
            };
            if std::mem::replace(flag, true) {
                return Err(format!("mode {text:?}: {letter:?} is given twice"));
            }
        }
        Ok(mode)
    }

    /// The Landlock rights of this mode on a directory tree (on a file, only the
    /// [`Access::FILE`] part counts).
    pub fn access(self) -> Access {
        let mut access = Access::NONE;
        if self.read {
            access = access.union(Access::READ_FILE).union(Access::READ_DIR);
        }
        if self.write {
            access =
                access.union(Access::WRITE_FILE).union(Access::TRUNCATE).union(Access::IOCTL_DEV);
        }
        if self.execute {
            access = access.union(Access::EXECUTE);
        }
        if self.create {
            for right in [
                Access::MAKE_REG,
                Access::MAKE_DIR,
                Access::MAKE_SYM,
                Access::MAKE_FIFO,
                Access::MAKE_SOCK,
                Access::REMOVE_FILE,
                Access::REMOVE_DIR,
                Access::REFER,
            ] {
                access = access.union(right);
            }
        }
        access
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (set, letter) in
            [(self.read, 'r'), (self.write, 'w'), (self.execute, 'x'), (self.create, 'c')]
        {
            if set {
                write!(f, "{letter}")?;
            }
        }
        Ok(())
    }
}

/// One path opened to a task, written `"<mode>:<path>"` (`"r:/etc/passwd"`, `"rwc:/srv"`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Unveil {
    /// What the task may do there.
    pub mode: Mode,
    /// An absolute path: a file, or a directory and everything beneath it.
    pub path: PathBuf,
}

impl Unveil {
    /// Reads `"<mode>:<path>"`. The path must be absolute and free of NUL bytes; whether it
    /// exists is checked when a task starts.
    pub fn parse(entry: &str) -> Result<Unveil, IsolateError> {
        let bad = |reason: String| IsolateError::Unveil { entry: entry.to_owned(), reason };
        let (mode, path) = entry
            .split_once(':')
            .ok_or_else(|| bad("expected <mode>:<path>, such as \"r:/etc/hosts\"".into()))?;
        let mode = Mode::parse(mode).map_err(bad)?;
        if !path.starts_with('/') {
            return Err(bad(format!("{path:?} is not an absolute path")));
        }
        if path.contains('\0') {
            return Err(bad("the path contains a NUL byte".into()));
        }
        let path = PathBuf::from(path);
        if names_own_proc(&path) && (mode.write || mode.execute || mode.create) {
            return Err(bad(
                "under /proc/self only `r` can be unveiled: each process has its own, so the \
                 entry opens /proc for reading"
                    .into(),
            ));
        }
        Ok(Unveil { mode, path })
    }

    /// The rule that enforces it; `if_exists` lets a missing path be skipped.
    ///
    /// A path under `/proc/self` (or `/proc/thread-self`) names the process that opens it, and
    /// each of the task's processes has its own: its rule is on `/proc` instead, for reading,
    /// as exec2 does. In the task's own PID namespace that `/proc` shows its processes only.
    pub fn rule(&self, if_exists: bool) -> Rule {
        let path =
            if names_own_proc(&self.path) { PathBuf::from("/proc") } else { self.path.clone() };
        Rule { path, access: self.mode.access(), if_exists }
    }
}

/// Whether `path` is `/proc/self` or `/proc/thread-self`, or beneath either.
fn names_own_proc(path: &Path) -> bool {
    use std::path::Component::{Normal, RootDir};
    let mut components = path.components();
    matches!(
        (components.next(), components.next(), components.next()),
        (Some(RootDir), Some(Normal(proc)), Some(Normal(own)))
            if proc == "proc" && (own == "self" || own == "thread-self")
    )
}

impl fmt::Display for Unveil {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.mode, self.path.display())
    }
}

/// One Landlock rule: `access` beneath `path`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Rule {
    /// A file, or a directory and everything beneath it. Symbolic links in it are followed
    /// when the rule is made.
    pub path: PathBuf,
    /// The rights; on a file that is not a directory only the [`Access::FILE`] part counts.
    pub access: Access,
    /// Skip the rule if the path does not exist (system paths that differ between hosts);
    /// otherwise a missing path fails the start.
    pub if_exists: bool,
}

impl Rule {
    /// A rule for `path` with `access`, required to exist.
    pub fn new(path: impl Into<PathBuf>, access: Access) -> Rule {
        Rule { path: path.into(), access, if_exists: false }
    }
}

/// The node-level default list, as exec2's `unveil_defaults`: the system's program and
/// library directories (read and execute), what the dynamic loader reads, a few harmless
/// devices, time zones, locales, name resolution and TLS certificates (read). Paths missing
/// on this host are skipped when a task starts. Not in it: `/etc/passwd`, `/proc`, `/sys`,
/// `/tmp`, `/home`, `/root`, `/var`.
pub fn default_unveils() -> Vec<Unveil> {
    const DEFAULTS: &[(&str, &str)] = &[
        // Programs.
        ("rx", "/bin"),
        ("rx", "/sbin"),
        ("rx", "/usr/bin"),
        ("rx", "/usr/sbin"),
        ("rx", "/usr/local/bin"),
        ("rx", "/usr/local/sbin"),
        // Shared libraries and what the dynamic loader reads.
        ("rx", "/lib"),
        ("rx", "/lib32"),
        ("rx", "/lib64"),
        ("rx", "/usr/lib"),
        ("rx", "/usr/lib32"),
        ("rx", "/usr/lib64"),
        ("rx", "/usr/libexec"),
        ("rx", "/usr/local/lib"),
        ("rx", "/usr/local/lib64"),
        ("r", "/etc/ld.so.cache"),
        ("r", "/etc/ld.so.conf"),
        ("r", "/etc/ld.so.conf.d"),
        ("r", "/etc/ld.so.preload"),
        // Devices every program may use.
        ("rw", "/dev/null"),
        ("rw", "/dev/full"),
        ("r", "/dev/zero"),
        ("r", "/dev/random"),
        ("r", "/dev/urandom"),
        // Time and language.
        ("r", "/etc/localtime"),
        ("r", "/usr/share/zoneinfo"),
        ("r", "/usr/share/locale"),
        // Name resolution.
        ("r", "/etc/hosts"),
        ("r", "/etc/host.conf"),
        ("r", "/etc/resolv.conf"),
        ("r", "/etc/nsswitch.conf"),
        ("r", "/etc/gai.conf"),
        ("r", "/etc/services"),
        ("r", "/etc/protocols"),
        // TLS certificates.
        ("r", "/etc/ssl/certs"),
        ("r", "/etc/ssl/cert.pem"),
        ("r", "/etc/pki/tls/certs"),
        ("r", "/etc/ca-certificates"),
        ("r", "/usr/share/ca-certificates"),
    ];
    DEFAULTS
        .iter()
        .map(|(mode, path)| Unveil {
            mode: Mode::parse(mode).unwrap_or_default(),
            path: PathBuf::from(path),
        })
        .collect()
}

/// The rules of [`default_unveils`] that this host has, each by the path it resolves to (one
/// rule where `/bin` is a link to `/usr/bin`) and cut to a file's rights where it is a file:
/// a task's process then makes one call per rule, where a path it would look up and find
/// missing, or find a file, costs it two. Each rule says `if_exists`, so a path that goes away
/// before a task starts is skipped.
pub fn default_rules() -> Vec<Rule> {
    let mut rules: Vec<Rule> = Vec::new();
    for unveil in default_unveils() {
        let Ok(path) = std::fs::canonicalize(&unveil.path) else { continue };
        let mut access = unveil.mode.access();
        if !path.is_dir() {
            access = access.intersection(Access::FILE);
        }
        match rules.iter_mut().find(|rule| rule.path == path) {
            Some(rule) => rule.access = rule.access.union(access),
            None if access != Access::NONE => rules.push(Rule { path, access, if_exists: true }),
            None => {}
        }
    }
    rules
}

/// The Landlock ABI version this kernel offers (7 on Linux 6.15 and later). The error says
/// why there is none: not built into the kernel, or not enabled at boot.
pub fn abi() -> Result<u32, IsolateError> {
    crate::sys::landlock_abi().map_err(|source| {
        let reason = match source.raw_os_error() {
            Some(libc::ENOSYS) => "Landlock is not built into this kernel (Linux 5.13 or later with CONFIG_SECURITY_LANDLOCK)",
            Some(libc::EOPNOTSUPP) => "Landlock is built into this kernel but not enabled: add landlock to the lsm= boot parameter",
            _ => "Landlock cannot be queried",
        };
        IsolateError::Unsupported { feature: "landlock", reason: format!("{reason}: {source}") }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_parse_and_print_back() {
        for (text, printed) in [("r", "r"), ("rx", "rx"), ("xr", "rx"), ("cwxr", "rwxc")] {
            assert_eq!(Mode::parse(text).unwrap().to_string(), printed);
        }
        for (text, reason) in [
            ("", "an empty mode"),
            ("rr", "'r' is given twice"),
            ("rq", "'q' is not one of"),
            ("R", "'R' is not one of"),
        ] {
            let error = Mode::parse(text).unwrap_err();
            assert!(error.contains(reason), "{text:?}: {error}");
        }
    }

    #[test]
    fn unveil_entries_parse_or_name_the_problem() {
        let entry = Unveil::parse("rwc:/srv/a:b").unwrap();
        assert_eq!(entry.mode, Mode { read: true, write: true, execute: false, create: true });
        assert_eq!(entry.path, Path::new("/srv/a:b"));
        assert_eq!(entry.to_string(), "rwc:/srv/a:b");
        for (text, reason) in [
            ("/etc/hosts", "expected <mode>:<path>"),
            ("r:etc/hosts", "is not an absolute path"),
            ("r:", "is not an absolute path"),
            (":/etc", "an empty mode"),
            ("rz:/etc", "'z' is not one of"),
            ("r:/a\0b", "NUL byte"),
            ("rw:/proc/self/oom_score_adj", "only `r`"),
            ("rx:/proc/thread-self", "only `r`"),
        ] {
            match Unveil::parse(text) {
                Err(IsolateError::Unveil { entry, reason: r }) => {
                    assert_eq!(entry, text);
                    assert!(r.contains(reason), "{text:?}: {r}");
                }
                other => panic!("{text:?}: {other:?}"),
            }
        }
    }

    #[test]
    fn an_entry_under_proc_self_opens_proc_for_reading() {
        let rule = |entry: &str| Unveil::parse(entry).unwrap().rule(false);
        for entry in ["r:/proc/self/mountinfo", "r:/proc/thread-self/status", "r:/proc/self"] {
            assert_eq!(rule(entry).path, Path::new("/proc"), "{entry}");
            assert_eq!(rule(entry).access, Access::READ_FILE.union(Access::READ_DIR));
        }
        for entry in ["r:/proc/cpuinfo", "r:/proc/selfish", "r:/srv/proc/self"] {
            assert_eq!(rule(entry).path, Path::new(&entry[2..]), "{entry}");
        }
    }

    #[test]
    fn modes_map_to_the_rights_they_name() {
        let rights = |text: &str| Mode::parse(text).unwrap().access();
        assert_eq!(rights("r"), Access::READ_FILE.union(Access::READ_DIR));
        assert_eq!(rights("x"), Access::EXECUTE);
        assert!(rights("w").contains(Access::WRITE_FILE.union(Access::TRUNCATE)));
        let create = rights("c");
        for granted in [Access::MAKE_REG, Access::MAKE_DIR, Access::REMOVE_FILE, Access::REFER] {
            assert!(create.contains(granted), "{granted:?}");
        }
        // Device nodes are never granted, whatever the mode.
        let all = Mode::ALL.access();
        assert!(!all.contains(Access::MAKE_CHAR) && !all.contains(Access::MAKE_BLOCK));
        // On a file, create means nothing.
        assert!(create.intersection(Access::FILE).is_empty());
    }

    #[test]
    fn each_abi_handles_the_rights_it_introduced() {
        assert!(Access::handled_by(0).is_empty());
        assert!(!Access::handled_by(1).contains(Access::REFER));
        assert!(Access::handled_by(2).contains(Access::REFER));
        assert!(!Access::handled_by(2).contains(Access::TRUNCATE));
        assert!(Access::handled_by(3).contains(Access::TRUNCATE));
        assert!(!Access::handled_by(4).contains(Access::IOCTL_DEV));
        assert!(Access::handled_by(7).contains(Mode::ALL.access()));
        assert_eq!(Access::from_bits(1 << 16), None);
        assert_eq!(Access::from_bits(Access::READ_FILE.bits()), Some(Access::READ_FILE));
    }

    #[test]
    fn the_defaults_are_system_paths_that_never_write_or_create_outside_dev() {
        let defaults = default_unveils();
        assert!(
            defaults
                .iter()
                .any(|u| u.path == Path::new("/usr/bin") && u.mode == Mode::READ_EXECUTE)
        );
        for unveil in &defaults {
            assert!(!unveil.mode.create, "{unveil}");
            assert!(!unveil.mode.write || unveil.path.starts_with("/dev"), "{unveil}");
            for private in ["/tmp", "/etc/passwd", "/proc", "/root", "/home", "/var"] {
                assert!(!unveil.path.starts_with(private), "{unveil}");
            }
        }
    }
}
