//! The lock above the cgroup parents, on this host's real cgroups. In a test binary of its
//! own: its test forks a child that holds copies of every descriptor the process has open,
//! the other tests' parent locks included, for a second.

#![allow(clippy::disallowed_methods)] // Tests start the processes they put in cgroups.

mod scratch;

use scratch::*;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use wharf_isolate::Cgroups;

/// A process an agent forks while it holds the lock above the parents keeps that lock until
/// it executes its program; one that joins cgroups first can take long on a loaded host. An
/// agent starting beside it meanwhile waits for it instead of refusing to start.
#[test]
fn a_child_forked_while_a_parent_is_made_does_not_stop_the_next_agent() {
    let group = format!("wharf-test-isolate-forked-{}", std::process::id());
    let first_name = format!("{group}/first");
    let first = Scratch {
        cgroups: Some(Cgroups::open(options(&first_name)).unwrap()),
        name: first_name,
        under_own: false,
    };
    let above: Vec<PathBuf> =
        first.parents().iter().filter_map(|p| p.parent()).map(Path::to_path_buf).collect();
    // Held as an agent holds them while it makes its parent.
    let locks: Vec<std::fs::File> = above
        .iter()
        .map(|dir| {
            let lock = std::fs::File::open(dir).unwrap();
            // SAFETY: flock on a descriptor this test owns.
            assert_eq!(unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) }, 0);
            lock
        })
        .collect();
    // SAFETY: the child only sleeps and exits, both async-signal-safe.
    let child = unsafe { libc::fork() };
    if child == 0 {
        // A child on its way to exec, slower than the agent's own hold of the lock.
        let pause = libc::timespec { tv_sec: 1, tv_nsec: 0 };
        // SAFETY: in the forked child, which only sleeps and exits.
        unsafe {
            libc::nanosleep(&pause, std::ptr::null_mut());
            libc::_exit(0);
        }
    }
    assert!(child > 0, "fork: {}", std::io::Error::last_os_error());
    drop(locks);
    let second_name = format!("{group}/second");
    let second = Cgroups::open(options(&second_name));
    let mut status = 0;
    // SAFETY: waits for the child forked above.
    unsafe { libc::waitpid(child, &mut status, 0) };
    let second = Scratch { cgroups: Some(second.unwrap()), name: second_name, under_own: false };
    drop((first, second));
    for dir in above {
        let _ = std::fs::remove_dir(dir);
    }
}
