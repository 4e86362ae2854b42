//! The containment steps a task's process takes on itself between its clone and its exec,
//! each with no allocation: mounts for a private mount namespace, and Landlock rules by path.
//! wharf-exec's shim puts them in order (with [`crate::join_cgroup`], `unshare`, the user
//! switch and `no_new_privs` from [`crate::sys`]), in the static shim and the std one alike.

use crate::open_beneath;
use crate::sys::{self, Errno};
use core::ffi::CStr;

/// A step of a task's containment, in the order a task's process takes them, for saying which
/// one failed (wharf-isolate's `ContainmentStep` is this type).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Joining the task's cgroup in the hierarchy of this index.
    JoinCgroup(u32),
    /// Making the private namespaces.
    Namespaces,
    /// Making the task's mounts slaves of the host's.
    MountSlave,
    /// Mounting the task's `/proc`.
    MountProc,
    /// Binding the host volume of this index.
    BindMount(u32),
    /// Creating the Landlock ruleset.
    LandlockRuleset,
    /// Adding the Landlock rule of this index.
    LandlockRule(u32),
    /// Dropping supplementary groups.
    Groups,
    /// Switching to the workload user's gid.
    Gid,
    /// Switching to the workload user's uid.
    Uid,
    /// Setting `no_new_privs`.
    NoNewPrivs,
    /// Enforcing the Landlock ruleset.
    LandlockRestrict,
}

/// Makes every mount of this (new) mount namespace a slave of its peer on the host: mounts
/// made here stay here, and an unmount on the host still reaches here, so a task never keeps a
/// host file system busy.
pub fn make_mounts_slave() -> Result<(), Errno> {
    sys::mount(None, c"/", None, sys::MS_REC | sys::MS_SLAVE)
}

/// Mounts a new procfs on `/proc`, which shows the processes of the caller's PID namespace.
pub fn mount_proc() -> Result<(), Errno> {
    let flags = sys::MS_NOSUID | sys::MS_NODEV | sys::MS_NOEXEC;
    sys::mount(Some(c"proc"), c"/proc", Some(c"proc"), flags)
}

/// Binds the directory `source` at `destination`, a directory named relative to `/` with no
/// symbolic link on the way (one is refused, `ELOOP`, rather than followed: the task may have
/// put it there). Read-only, the bind is then remounted read-only, keeping the `nosuid`,
/// `nodev` and `noexec` its file system has.
pub fn bind_mount(source: &CStr, destination: &CStr, read_only: bool) -> Result<(), Errno> {
    let root = sys::open(c"/", sys::O_PATH | sys::O_DIRECTORY | sys::O_CLOEXEC, 0)?;
    let result = bind_beneath(root, source, destination, read_only);
    sys::close(root);
    result
}

fn bind_beneath(
    root: i32,
    source: &CStr,
    destination: &CStr,
    read_only: bool,
) -> Result<(), Errno> {
    let open =
        || open_beneath(root, destination, sys::O_PATH | sys::O_DIRECTORY | sys::O_CLOEXEC, 0);
    let target = open()?;
    let bound = sys::mount(Some(source), FdPath::of(target).c_str(), None, sys::MS_BIND);
    sys::close(target);
    bound?;
    if !read_only {
        return Ok(());
    }
    // Opened again, the path now leads to the bind's root, which the remount must name.
    let bind = open()?;
    let remounted = sys::fs_flags(bind).and_then(|kept| {
        let kept = kept & (sys::MS_NOSUID | sys::MS_NODEV | sys::MS_NOEXEC);
        let flags = sys::MS_REMOUNT | sys::MS_BIND | sys::MS_RDONLY | kept;
        sys::mount(None, FdPath::of(bind).c_str(), None, flags)
    });
    sys::close(bind);
    remounted
}

/// `/proc/self/fd/<fd>`: a path for what a descriptor names, for calls that take a path.
struct FdPath([u8; 32]);

impl FdPath {
    fn of(fd: i32) -> FdPath {
        let mut path = [0u8; 32];
        let prefix = b"/proc/self/fd/";
        path[..prefix.len()].copy_from_slice(prefix);
        let mut digits = [0u8; 10];
        let mut n = fd.unsigned_abs();
        let mut len = 0;
        loop {
            digits[len] = b'0' + (n % 10) as u8;
            len += 1;
            n /= 10;
            if n == 0 {
                break;
            }
        }
        for (i, digit) in digits[..len].iter().rev().enumerate() {
            path[prefix.len() + i] = *digit;
        }
        FdPath(path)
    }

    fn c_str(&self) -> &CStr {
        // The buffer is longer than the prefix and ten digits, so a NUL always ends it.
        CStr::from_bytes_until_nul(&self.0).unwrap_or(c"/proc/self/fd")
    }
}

/// Landlock's file rights that mean something for a file that is not a directory (execute,
/// write, read, truncate, device `ioctl`s); the others are about what a directory holds.
pub const LANDLOCK_FILE_RIGHTS: u64 = 1 | 1 << 1 | 1 << 2 | 1 << 14 | 1 << 15;

/// Every file right a kernel with Landlock ABI `abi` handles (none for 0).
pub fn landlock_handled(abi: u32) -> u64 {
    match abi {
        0 => 0,
        1 => (1 << 13) - 1,
        2 => (1 << 14) - 1,
        3 | 4 => (1 << 15) - 1,
        _ => (1 << 16) - 1,
    }
}

/// The scopes a kernel with Landlock ABI `abi` confines: abstract unix sockets and signals
/// (ABI 6), so a task can reach neither outside its domain.
pub fn landlock_scoped(abi: u32) -> u64 {
    if abi >= 6 { 1 | 1 << 1 } else { 0 }
}

/// Adds to `ruleset` a rule allowing `access` beneath `target` (an `O_PATH` descriptor), cut to
/// the rights of a file when `target` is not a directory. The kernel refuses a directory's
/// rights on a file (`EINVAL`), which is how a file is told from a directory here: one call for
/// either, where asking first would cost every rule a call.
pub fn landlock_allow(ruleset: i32, target: i32, access: u64) -> Result<(), Errno> {
    if access == 0 {
        return Ok(());
    }
    match sys::landlock_add_path_rule(ruleset, target, access) {
        Err(Errno(sys::EINVAL)) if access & !LANDLOCK_FILE_RIGHTS != 0 => {
            let file = access & LANDLOCK_FILE_RIGHTS;
            if file == 0 { Ok(()) } else { sys::landlock_add_path_rule(ruleset, target, file) }
        }
        added => added,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_descriptor_path_names_the_descriptor() {
        assert_eq!(FdPath::of(0).c_str(), c"/proc/self/fd/0");
        assert_eq!(FdPath::of(1234).c_str(), c"/proc/self/fd/1234");
        assert_eq!(FdPath::of(i32::MAX).c_str(), c"/proc/self/fd/2147483647");
    }

    /// The flags agree with what `/proc/self/mountinfo` says of the mount of `/`.
    #[test]
    fn a_file_systems_flags_are_read() {
        let root = sys::open(c"/", sys::O_PATH | sys::O_DIRECTORY | sys::O_CLOEXEC, 0).unwrap();
        let flags = sys::fs_flags(root).unwrap();
        sys::close(root);
        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        let options = mountinfo
            .lines()
            .rfind(|line| line.split(' ').nth(4) == Some("/"))
            .and_then(|line| line.split(' ').nth(5))
            .unwrap();
        let options: std::vec::Vec<&str> = options.split(',').collect();
        for (bit, name) in [(1, "ro"), (2, "nosuid"), (4, "nodev"), (8, "noexec")] {
            assert_eq!(flags & bit != 0, options.contains(&name), "{name}: {flags:#x} {options:?}");
        }
    }

    /// A directory gets every right asked for; a file the rights of a file, and no rule when
    /// it was asked for none of those; what is asked for is always added.
    #[test]
    fn landlock_rules_on_files_keep_a_files_rights() {
        let Ok(abi) = sys::landlock_abi() else {
            panic!("this test needs Landlock (Linux 5.13 or later with it enabled)");
        };
        let handled = landlock_handled(abi);
        let ruleset = sys::landlock_create_ruleset(handled, 0).unwrap();
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("f"), "x").unwrap();
        let open = |p: &std::path::Path| {
            let p = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).unwrap();
            sys::open(&p, sys::O_PATH | sys::O_CLOEXEC, 0).unwrap()
        };
        let (d, f) = (open(dir.path()), open(&dir.path().join("f")));
        let read_dir = 1 << 3;
        let read_file = 1 << 2;
        assert_eq!(landlock_allow(ruleset, d, handled), Ok(()));
        assert_eq!(landlock_allow(ruleset, f, handled), Ok(()), "cut to a file's rights");
        assert_eq!(landlock_allow(ruleset, f, read_dir), Ok(()), "nothing left: no rule");
        assert_eq!(landlock_allow(ruleset, f, read_file | read_dir), Ok(()));
        assert_eq!(landlock_allow(ruleset, f, 0), Ok(()));
        assert_eq!(landlock_allow(ruleset, -1, read_file), Err(Errno(sys::EBADF)));
        for fd in [d, f, ruleset] {
            sys::close(fd);
        }
    }

    #[test]
    fn landlock_rights_follow_the_abi() {
        assert_eq!(landlock_handled(0), 0);
        assert_eq!(landlock_handled(1), 0x1fff);
        assert_eq!(landlock_handled(3), 0x7fff);
        assert_eq!(landlock_handled(7), 0xffff);
        assert_eq!(landlock_scoped(5), 0);
        assert_eq!(landlock_scoped(6), 3);
        assert_eq!(LANDLOCK_FILE_RIGHTS & landlock_handled(1), 0b111);
    }
}
