//! Private PID and IPC namespaces and `no_new_privs`, for real: a forked child applies them and
//! shows what it sees. The PID cases follow exec2's functional "pid namespace" case (`ps`
//! sees the task as pid 1).

mod common;

use common::{defaults, require_root, run, test_user};
use wharf_isolate::landlock::Unveil;
use wharf_isolate::namespace::Namespaces;
use wharf_isolate::{BindMount, Containment};

fn with(pid: bool, ipc: bool) -> Containment {
    Containment { namespaces: Namespaces { pid, ipc }, ..Containment::default() }
}

#[test]
fn a_private_pid_namespace_makes_the_task_pid_1_and_hides_every_other_process() {
    require_root();
    Namespaces { pid: true, ipc: true }.check_supported().unwrap();
    let outcome = run(&with(true, false), &["/usr/bin/ls", "/proc"], &[]);
    assert!(outcome.ok(), "{outcome:?}");
    let pids: Vec<&str> =
        outcome.stdout.lines().filter(|name| name.bytes().all(|b| b.is_ascii_digit())).collect();
    assert_eq!(pids, ["1"], "only itself, as pid 1: {outcome:?}");

    let host = run(&with(false, false), &["/bin/sh", "-c", "echo $$"], &[]);
    assert_ne!(host.stdout.trim(), "1");
    // The host's /proc is untouched by the task's mount.
    assert!(std::fs::read_dir("/proc").unwrap().count() > 10);
}

#[test]
fn a_landlocked_task_that_cannot_reach_proc_needs_no_proc_of_its_own() {
    require_root();
    let containment = Containment {
        landlock: Some(defaults()),
        namespaces: Namespaces { pid: true, ipc: true },
        user: Some(test_user(21)),
        ..Containment::default()
    };
    let outcome = run(&containment, &["/bin/sh", "-c", "echo $$; ls /proc"], &[]);
    assert_eq!(outcome.stdout, "1\n", "{outcome:?}");
    assert!(outcome.stderr.contains("Permission denied"), "{outcome:?}");
}

#[test]
#[allow(clippy::disallowed_methods)] // It kills what would outlive the test, if the kernel did not.
fn everything_in_a_pid_namespace_dies_with_its_first_process() {
    require_root();
    // The task leaves a daemon behind (setsid plus double fork, its output elsewhere) and
    // exits: the kernel kills the daemon with the namespace.
    let marker = format!("61.{}", std::process::id());
    let script = format!("setsid sh -c 'sleep {marker} >/dev/null 2>&1 &'; echo left");
    let outcome = run(&with(true, false), &["/bin/sh", "-c", &script], &[]);
    assert!(outcome.ok() && outcome.stdout == "left\n", "{outcome:?}");
    let survivors: Vec<u32> = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|cmdline| cmdline.ends_with(format!("\0{marker}\0").as_bytes()))
        })
        .collect();
    for pid in &survivors {
        // SAFETY: kill takes integers; the pid was just seen running the test's own marker.
        unsafe { libc::kill(*pid as i32, libc::SIGKILL) };
    }
    assert!(survivors.is_empty(), "the daemon outlived its namespace: {survivors:?}");
}

#[test]
fn a_private_ipc_namespace_is_not_the_hosts() {
    require_root();
    let host = std::fs::read_link("/proc/self/ns/ipc").unwrap();
    let link = ["/usr/bin/readlink", "/proc/self/ns/ipc"];
    let private = run(&with(false, true), &link, &[]);
    assert!(private.ok(), "{private:?}");
    assert_ne!(private.stdout.trim(), host.to_str().unwrap());
    let shared = run(&with(false, false), &link, &[]);
    assert_eq!(shared.stdout.trim(), host.to_str().unwrap());
}

#[test]
fn landlock_rules_for_proc_name_the_tasks_own_proc() {
    require_root();
    // A rule made in the child after its /proc is mounted covers that /proc.
    let mut rules = defaults();
    rules.push(Unveil::parse("r:/proc").unwrap().rule(false));
    let containment = Containment {
        landlock: Some(rules),
        namespaces: Namespaces { pid: true, ipc: true },
        user: Some(test_user(20)),
        no_new_privs: true,
        ..Containment::default()
    };
    let script = "tr '\\0' ' ' < /proc/1/cmdline; echo; grep ^NoNewPrivs /proc/self/status";
    let outcome = run(&containment, &["/bin/sh", "-c", script], &[]);
    assert!(outcome.ok(), "{outcome:?}");
    assert_eq!(outcome.stdout, format!("/bin/sh -c {script} \nNoNewPrivs:\t1\n"));
}

/// A tmpfs mounted on a temporary directory of the host and made shared, unmounted when
/// dropped.
struct SharedMount {
    dir: tempfile::TempDir,
}

impl SharedMount {
    fn new() -> SharedMount {
        let dir = tempfile::tempdir().unwrap();
        let target = std::ffi::CString::new(dir.path().to_str().unwrap()).unwrap();
        // SAFETY: NUL-terminated strings that outlive the calls.
        let mounted = unsafe {
            libc::mount(c"tmpfs".as_ptr(), target.as_ptr(), c"tmpfs".as_ptr(), 0, std::ptr::null())
        };
        assert_eq!(mounted, 0, "mount: {}", std::io::Error::last_os_error());
        let mount = SharedMount { dir };
        // SAFETY: as above; a propagation change takes no source, type or data.
        let shared = unsafe {
            libc::mount(
                std::ptr::null(),
                target.as_ptr(),
                std::ptr::null(),
                libc::MS_SHARED,
                std::ptr::null(),
            )
        };
        assert_eq!(shared, 0, "make shared: {}", std::io::Error::last_os_error());
        mount
    }
}

impl Drop for SharedMount {
    fn drop(&mut self) {
        let target = std::ffi::CString::new(self.dir.path().to_str().unwrap()).unwrap();
        // SAFETY: a NUL-terminated string that outlives the call.
        unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) };
    }
}

/// exec2's "mount propagation slave": the mount namespace that comes with the task's own
/// `/proc` is a slave of the host's, so a mount the host shares shows in it as `master:`
/// (mounts made on the host reach the task, none of the task's reach the host).
#[test]
fn the_tasks_mounts_are_slaves_of_the_hosts() {
    require_root();
    let shared = SharedMount::new();
    let point = format!(" {} ", shared.dir.path().display());
    let host = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let line = host.lines().find(|l| l.contains(&point)).unwrap();
    assert!(line.contains(" shared:"), "{line}");

    let outcome = run(&with(true, false), &["/usr/bin/grep", &point, "/proc/self/mountinfo"], &[]);
    assert!(outcome.ok(), "{outcome:?}");
    assert!(outcome.stdout.contains(" master:"), "not a slave: {outcome:?}");
    assert!(!outcome.stdout.contains(" shared:"), "still shared: {outcome:?}");
}

/// A bind's destination is opened with no link on its path, and the bind made through that
/// descriptor: a task that turns a directory of the destination's path into a link (aimed at
/// a directory of the node) between the node's check and its start gets a refusal (`ELOOP`),
/// and nothing is mounted where the link points. The same path without the link binds.
#[test]
fn a_bind_whose_destination_became_a_link_is_refused_not_followed() {
    require_root();
    let scratch = tempfile::tempdir().unwrap();
    let root = std::fs::canonicalize(scratch.path()).unwrap();
    let volume = root.join("volume");
    std::fs::create_dir(&volume).unwrap();
    std::fs::write(volume.join("file"), "the volume").unwrap();
    let task_dir = root.join("task");
    std::fs::create_dir_all(task_dir.join("local/data")).unwrap();
    let node_dir = root.join("node");
    std::fs::create_dir_all(node_dir.join("data")).unwrap();
    std::fs::write(node_dir.join("data/own"), "the node's").unwrap();
    let containment = |read_only| Containment {
        mounts: vec![BindMount {
            source: volume.clone(),
            destination: task_dir.join("local/data"),
            read_only,
        }],
        ..Containment::default()
    };
    let destination = task_dir.join("local/data").display().to_string();
    let list = |c: &Containment| run(c, &["/usr/bin/ls", &destination], &[]);

    for read_only in [false, true] {
        let outcome = list(&containment(read_only));
        assert_eq!(outcome.stdout, "file\n", "bound, read_only {read_only}: {outcome:?}");
    }

    // The task swaps `local` for a link to the node's directory.
    std::fs::rename(task_dir.join("local"), task_dir.join("was-local")).unwrap();
    std::os::unix::fs::symlink(&node_dir, task_dir.join("local")).unwrap();
    for read_only in [false, true] {
        let bound = containment(read_only);
        let outcome = list(&bound);
        let failure = outcome.failure.as_ref().expect("the bind is refused");
        assert_eq!(failure.errno, libc::ELOOP, "{outcome:?}");
        let said = failure.describe(&bound);
        assert!(said.contains("cannot mount") && said.contains("local/data"), "{said}");
    }
    let node_sees: Vec<_> =
        std::fs::read_dir(node_dir.join("data")).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(node_sees, ["own"]);
}
