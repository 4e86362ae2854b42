//! The cgroup layer against the real cgroups of this host (v1 here). Each test works under a
//! parent of its own, which a guard kills and removes even when the test fails.
//!
//! Nomad's counterparts: `TestExecutor_IsolationAndConstraints` (limits written, cgroup gone
//! after shutdown), `TestExecutor_CgroupPaths` (the process is in the task's cgroup in every
//! hierarchy), `TestExecutor_CgroupPathsAreDestroyed`, and its executor's OOM reporting.

#![allow(clippy::disallowed_methods)] // Tests start the processes they put in cgroups.

mod scratch;

use scratch::*;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::time::Duration;
use wharf_isolate::cgroup::{OomRecord, Version};
use wharf_isolate::{Cgroups, CpuSet, IsolateError};
use wharf_state::spec::Resources;

/// `TestExecutor_IsolationAndConstraints`: the limits are in the files, and the cgroup is gone
/// once removed.
#[test]
fn limits_are_written_and_the_cgroup_is_removed() {
    let scratch = scratch();
    assert_eq!(scratch.version(), Version::V1, "this host runs cgroup v1");
    let limits = scratch.limits(
        &Resources { cpu: 1000, memory: 64, memory_max: Some(128), cores: 0 },
        Some(100_000),
    );
    let cgroup = scratch.create("a1/web/00000000", &limits).unwrap();
    assert_eq!(cgroup.name(), "a1.web.00000000");
    let memory = dir_of(&cgroup, "memory");
    assert_eq!(read(&memory.join("memory.limit_in_bytes")).trim(), (128 * MIB).to_string());
    assert_eq!(read(&memory.join("memory.soft_limit_in_bytes")).trim(), (64 * MIB).to_string());
    let cpu = dir_of(&cgroup, "cpu");
    assert_eq!(read(&cpu.join("cpu.shares")).trim(), "1000");
    // 1000 MHz of 2000 MHz cores: half of each period.
    assert_eq!(read(&cpu.join("cpu.cfs_quota_us")).trim(), "50000");
    assert_eq!(read(&dir_of(&cgroup, "pids").join("pids.max")).trim(), "64");

    scratch.remove(&cgroup).unwrap();
    for dir in cgroup.dirs() {
        assert!(
            !dir.join("cgroup.procs").exists() || dir.ends_with("share"),
            "{} is left",
            dir.display()
        );
    }
    scratch.remove(&cgroup).unwrap();
}

/// `TestExecutor_CgroupPaths`: a process that joins is in the task's cgroup in every hierarchy
/// wharf uses, and so is everything it starts.
#[test]
fn a_joined_process_and_its_children_are_in_every_hierarchy() {
    let scratch = scratch();
    let cgroup = scratch.create("a1/paths/00000000", &limits(&scratch, 64, None)).unwrap();
    let mut child = spawn_in(&cgroup, "sleep 30 & echo $!; wait");
    let grandchild: i32 = first_line(&mut child).parse().unwrap();
    for pid in [child.id() as i32, grandchild] {
        let membership = read(Path::new(&format!("/proc/{pid}/cgroup")));
        for controller in ["memory", "cpu", "cpuacct", "pids", "freezer"] {
            let line = membership
                .lines()
                .find(|l| l.split(':').nth(1) == Some(controller))
                .unwrap_or_else(|| panic!("no {controller} line in {membership}"));
            assert!(line.ends_with(&format!("{}/a1.paths.00000000", scratch.name)), "{line}");
        }
        let cpuset = membership.lines().find(|l| l.split(':').nth(1) == Some("cpuset")).unwrap();
        assert!(cpuset.ends_with(&format!("{}/share", scratch.name)), "{cpuset}");
    }
    let mut pids = cgroup.pids().unwrap();
    pids.sort();
    let mut expected = vec![child.id() as i32, grandchild];
    expected.sort();
    assert_eq!(pids, expected);

    assert_eq!(cgroup.kill_all(&mut sigkill).unwrap(), 2);
    assert_eq!(wait(&mut child).signal(), Some(libc::SIGKILL));
    scratch.remove(&cgroup).unwrap();
}

/// A process that left its session and process group (setsid, double fork) dies with its
/// cgroup.
#[test]
fn a_kill_by_cgroup_reaches_escaped_processes() {
    let scratch = scratch();
    let cgroup = scratch.create("a1/escape/00000000", &limits(&scratch, 64, None)).unwrap();
    let mut child = spawn_in(&cgroup, "setsid sh -c 'sleep 60 & echo $!' ; sleep 60");
    let escaped: i32 = first_line(&mut child).parse().unwrap();
    let session = |pid: i32| {
        read(Path::new(&format!("/proc/{pid}/stat")))
            .rsplit(')')
            .next()
            .unwrap()
            .split_whitespace()
            .nth(3)
            .unwrap()
            .to_owned()
    };
    assert_ne!(session(escaped), session(child.id() as i32), "the grandchild left the session");
    assert!(cgroup.pids().unwrap().contains(&escaped));

    cgroup.kill_all(&mut sigkill).unwrap();
    wait(&mut child);
    // The escaped process was re-parented to init (or a subreaper); it is gone once its
    // cgroup is empty, which removal waits for.
    scratch.remove(&cgroup).unwrap();
    assert!(
        !Path::new(&format!("/proc/{escaped}/cmdline")).exists()
            || read(Path::new(&format!("/proc/{escaped}/cmdline"))).is_empty(),
        "the escaped process survived"
    );
}

/// A kill reaches every process the cgroup holds when it is killed, one that joined after the
/// cgroup's processes were last read included: v1 keeps a `cgroup.procs` listing per open
/// file, so a listing read again through a file kept open would not show it.
#[test]
fn a_kill_reaches_a_process_that_joined_after_the_last_read() {
    let scratch = scratch();
    let cgroup = scratch.create("a1/late/00000000", &limits(&scratch, 64, None)).unwrap();
    let mut first = spawn_in(&cgroup, "echo up; exec sleep 60");
    assert_eq!(first_line(&mut first), "up");
    assert_eq!(cgroup.pids().unwrap(), vec![first.id() as i32]);
    let mut late = spawn_in(&cgroup, "echo up; exec sleep 60");
    assert_eq!(first_line(&mut late), "up");
    let mut pids = cgroup.pids().unwrap();
    pids.sort_unstable();
    let mut expected = vec![first.id() as i32, late.id() as i32];
    expected.sort_unstable();
    assert_eq!(pids, expected);

    assert_eq!(cgroup.kill_all(&mut sigkill).unwrap(), 2);
    assert_eq!(wait(&mut late).signal(), Some(libc::SIGKILL));
    assert_eq!(wait(&mut first).signal(), Some(libc::SIGKILL));
    scratch.remove(&cgroup).unwrap();
}

/// A process that allocates past its limit is killed by the kernel, and the cgroup says so.
#[test]
fn an_oom_kill_is_recorded() {
    let scratch = scratch();
    let cgroup = scratch.create("a1/oom/00000000", &limits(&scratch, 16, None)).unwrap();
    assert_eq!(cgroup.oom_killed().unwrap(), OomRecord::NotKilled);
    // `tail` keeps the last line, and /dev/zero has no line end: it grows until killed.
    let mut child = spawn_in(&cgroup, "exec tail /dev/zero");
    let status = wait(&mut child);
    assert_eq!(status.signal(), Some(libc::SIGKILL), "{status:?}");
    assert_eq!(cgroup.oom_killed().unwrap(), OomRecord::Killed);
    let stats = cgroup.stats().unwrap();
    assert!(stats.memory_max_usage >= 15 * MIB, "{stats:?}");
    scratch.remove(&cgroup).unwrap();
}

#[test]
fn stats_count_the_tasks_cpu_and_memory() {
    let scratch = scratch();
    let cgroup = scratch.create("a1/stats/00000000", &limits(&scratch, 64, None)).unwrap();
    // Busy for a while, holding 8 MiB, then report and wait.
    let mut child = spawn_in(
        &cgroup,
        "x=$(head -c 8388608 /dev/zero | tr '\\0' a); i=0; while [ $i -lt 20000 ]; do i=$((i+1)); done; echo ready; sleep 30",
    );
    assert_eq!(first_line(&mut child), "ready");
    let stats = cgroup.stats().unwrap();
    assert!(stats.cpu_total >= Duration::from_millis(5), "{stats:?}");
    assert!(stats.memory_max_usage >= 8 * MIB, "{stats:?}");
    assert!(stats.memory_rss > 0 && stats.processes >= 1, "{stats:?}");
    assert!(stats.measured.max_usage);
    cgroup.kill_all(&mut sigkill).unwrap();
    wait(&mut child);
    scratch.remove(&cgroup).unwrap();
}

#[test]
fn reserved_cores_leave_the_shared_set_until_released() {
    let scratch = scratch();
    assert!(scratch.can_reserve_cores());
    let all = scratch.shared_cores();
    assert!(all.len() >= 2, "this test needs two cores, the host has {all}");
    let resources = Resources { cpu: 100, memory: 16, memory_max: None, cores: 1 };
    let limits = scratch.limits(&resources, None);
    let cgroup = scratch.create("a1/pinned/00000000", &limits).unwrap();
    let cores = cgroup.cores().unwrap().clone();
    assert_eq!(cores.len(), 1);
    assert_eq!(read(&dir_of(&cgroup, "cpuset").join("cpuset.cpus")).trim(), cores.to_string());
    assert_eq!(scratch.shared_cores(), all.difference(&cores));
    let share = scratch
        .parents()
        .into_iter()
        .find(|p| p.starts_with("/sys/fs/cgroup/cpuset"))
        .unwrap()
        .join("share");
    assert_eq!(CpuSet::parse(&read(&share.join("cpuset.cpus"))).unwrap(), all.difference(&cores));

    // A process of the task runs on its core only.
    let mut child = spawn_in(&cgroup, "grep Cpus_allowed_list /proc/self/status");
    let line = first_line(&mut child);
    assert_eq!(line.split_whitespace().nth(1), Some(cores.to_string().as_str()), "{line}");
    wait(&mut child);

    // Every core but one is the most a node gives away.
    let greedy = Resources { cores: u32::try_from(all.len()).unwrap(), ..resources };
    match scratch.create("a1/greedy/00000000", &scratch.limits(&greedy, None)) {
        Err(IsolateError::NotEnoughCores { .. }) => {}
        other => panic!("{other:?}"),
    }
    scratch.remove(&cgroup).unwrap();
    assert_eq!(scratch.shared_cores(), all);
    assert_eq!(CpuSet::parse(&read(&share.join("cpuset.cpus"))).unwrap(), all);
}

/// After a restart, the new agent's manager adopts the cgroups of tasks that still run and
/// removes the others, killing what is left in them.
#[test]
fn a_new_manager_adopts_live_cgroups_and_removes_orphans() {
    let mut agent = scratch();
    let first = &agent;
    let kept = first.create("a1/kept/00000000", &limits(first, 64, None)).unwrap();
    let orphan = first.create("a1/orphan/00000000", &limits(first, 64, None)).unwrap();
    let mut kept_child = spawn_in(&kept, "echo up; sleep 60");
    let mut orphan_child = spawn_in(&orphan, "echo up; sleep 60");
    assert_eq!(first_line(&mut kept_child), "up");
    assert_eq!(first_line(&mut orphan_child), "up");

    // A second agent cannot take the parent while the first holds it.
    match Cgroups::open(options(&first.name)) {
        Err(IsolateError::ParentInUse { .. }) => {}
        other => panic!("{other:?}"),
    }
    // The first agent dies (its manager goes, with its lock); the cgroups stay.
    agent.restart();
    let second = &agent;
    let adopted = second.adopt("a1/kept/00000000", None).unwrap();
    assert_eq!(adopted.dirs(), kept.dirs());
    assert_eq!(second.remove_orphans(&mut sigkill), vec!["a1.orphan.00000000".to_owned()]);
    assert_eq!(wait(&mut orphan_child).signal(), Some(libc::SIGKILL));
    assert!(orphan.dirs().iter().all(|d| d.ends_with("share") || !d.exists()));
    assert!(kept_child.try_wait().unwrap().is_none(), "the adopted task runs on");
    assert!(second.adopt("a1/gone/00000000", None).is_err());

    adopted.kill_all(&mut sigkill).unwrap();
    wait(&mut kept_child);
    second.remove(&adopted).unwrap();
}

/// `TestExecutor_CleanOldProcessesInCGroup`: a run started again under the id of a run whose
/// agent died before it saved the run's handle finds that run's cgroup, with its process still
/// in it. The process is killed, and the cgroup holds the new run's alone.
#[test]
fn a_run_started_again_kills_what_the_lost_run_left_in_its_cgroup() {
    let mut agent = scratch();
    let lost = agent.create("a1/again/00000000", &limits(&agent, 64, None)).unwrap();
    let mut lost_child = spawn_in(&lost, "echo up; exec sleep 60");
    assert_eq!(first_line(&mut lost_child), "up");
    assert_eq!(lost.pids().unwrap(), vec![lost_child.id() as i32]);

    agent.restart();
    let again = agent.create("a1/again/00000000", &limits(&agent, 64, None)).unwrap();
    assert_eq!(again.dirs(), lost.dirs());
    assert_eq!(wait(&mut lost_child).signal(), Some(libc::SIGKILL));
    let mut child = spawn_in(&again, "echo up; exec sleep 60");
    assert_eq!(first_line(&mut child), "up");
    assert_eq!(again.pids().unwrap(), vec![child.id() as i32]);

    again.kill_all(&mut sigkill).unwrap();
    wait(&mut child);
    agent.remove(&again).unwrap();
}

/// `TestCustomPathCG1`: a parent is a path below each hierarchy's root (`absolute`) or, as an
/// agent's is by default, below the agent's own cgroup in each hierarchy (`relative`),
/// wherever the agent is in it (this host puts the tests' memory cgroup below the root).
#[test]
fn a_parent_is_below_each_root_or_below_the_agents_own_cgroup() {
    let membership = read(Path::new("/proc/self/cgroup"));
    // The directory of this process's cgroup in the hierarchy mounted at `mount`.
    let own = |mount: &Path| -> PathBuf {
        let controllers: Vec<&str> =
            mount.file_name().unwrap().to_str().unwrap().split(',').collect();
        let line = membership
            .lines()
            .find(|l| {
                let mut names: Vec<&str> = l.split(':').nth(1).unwrap().split(',').collect();
                names.sort_unstable();
                let mut wanted = controllers.clone();
                wanted.sort_unstable();
                names == wanted
            })
            .unwrap_or_else(|| panic!("no line for {} in {membership}", mount.display()));
        mount.join(line.splitn(3, ':').nth(2).unwrap().trim_start_matches('/'))
    };
    let absolute = scratch();
    let relative = scratch_under_own();
    for (scratch, under_own) in [(&absolute, false), (&relative, true)] {
        let parents = scratch.parents();
        assert!(parents.len() >= 5, "{parents:?}");
        for parent in parents {
            let mount =
                parent.ancestors().find(|a| a.parent() == Some(Path::new("/sys/fs/cgroup")));
            let mount =
                mount.unwrap_or_else(|| panic!("{} is not in a v1 mount", parent.display()));
            let base = if under_own { own(mount) } else { mount.to_owned() };
            assert_eq!(parent, base.join(&scratch.name), "under own: {under_own}");
        }
    }
    // A task's process in a relative parent's cgroup is below this process's own cgroup.
    let cgroup = relative.create("a1/own/00000000", &limits(&relative, 16, None)).unwrap();
    let mut child = spawn_in(&cgroup, "echo up; exec sleep 60");
    assert_eq!(first_line(&mut child), "up");
    let memory = dir_of(&cgroup, "memory");
    assert_eq!(
        memory,
        own(Path::new("/sys/fs/cgroup/memory")).join(&relative.name).join("a1.own.00000000")
    );
    assert_eq!(cgroup.pids().unwrap(), vec![child.id() as i32]);
    cgroup.kill_all(&mut sigkill).unwrap();
    wait(&mut child);
    relative.remove(&cgroup).unwrap();
}

#[test]
fn a_bad_parent_is_refused_with_its_reason() {
    for (parent, reason) in
        [("../x", "no `.` or `..`"), ("/", "names no cgroup"), ("a\nb", "newline")]
    {
        let error = Cgroups::open(options(parent)).unwrap_err().to_string();
        assert!(error.contains(reason), "{parent:?}: {error}");
    }
}

/// What a container runtime leaves outside the node's hierarchies (its parent's path, made in
/// every hierarchy mounted) is found there, and the node's own parents never are: on this
/// hybrid host, the `name=systemd` hierarchy and the empty cgroup2 are not the node's.
#[test]
fn directories_made_outside_the_nodes_parents_are_told_from_its_own() {
    let scratch = scratch();
    let relative = Path::new(&scratch.name);
    assert_eq!(scratch.made_outside_parents(relative).unwrap(), Vec::<PathBuf>::new());
    let parents = scratch.parents();
    let others: Vec<PathBuf> = wharf_isolate::cgroup::mount_points()
        .unwrap()
        .into_iter()
        .filter(|mount| !parents.iter().any(|parent| parent.starts_with(mount)))
        .collect();
    assert!(!others.is_empty(), "this host has no cgroup hierarchy the node leaves alone");
    /// Removes the directories made in the other hierarchies, whatever happened.
    struct Made(Vec<PathBuf>);
    impl Drop for Made {
        fn drop(&mut self) {
            self.0.iter().for_each(|dir| drop(std::fs::remove_dir(dir)));
        }
    }
    let made = Made(others.iter().map(|mount| mount.join(relative)).collect());
    for dir in &made.0 {
        std::fs::create_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    }
    let mut found = scratch.made_outside_parents(relative).unwrap();
    found.sort();
    let mut expected = made.0.clone();
    expected.sort();
    assert_eq!(found, expected);
}
