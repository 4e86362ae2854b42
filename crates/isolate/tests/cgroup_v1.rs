//! The cgroup layer against the real cgroups of this host (v1 here). Each test works under a
//! parent of its own, which a guard kills and removes even when the test fails.
//!
//! Nomad's counterparts: `TestExecutor_IsolationAndConstraints` (limits written, cgroup gone
//! after shutdown), `TestExecutor_CgroupPaths` (the process is in the task's cgroup in every
//! hierarchy), `TestExecutor_CgroupPathsAreDestroyed`, and its executor's OOM reporting.

#![allow(clippy::disallowed_methods)] // Tests start the processes they put in cgroups.

use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;
use wharf_isolate::cgroup::{Limits, NodeCpu, Version};
use wharf_isolate::{
    CgroupOptions, CgroupParent, Cgroups, Containment, CpuSet, IsolateError, TaskCgroup,
};
use wharf_state::spec::Resources;

const MIB: u64 = 1 << 20;

/// A manager under a parent of this test's own, destroyed (tasks killed, cgroups removed)
/// when dropped, whatever happened.
struct Scratch {
    cgroups: Option<Cgroups>,
    name: String,
}

impl Scratch {
    /// What an agent's restart does to its manager: the old one goes (with its lock), a new
    /// one opens the same parent.
    fn restart(&mut self) {
        self.cgroups = None;
        self.cgroups = Some(Cgroups::open(options(&self.name)).unwrap());
    }
}

impl std::ops::Deref for Scratch {
    type Target = Cgroups;

    fn deref(&self) -> &Cgroups {
        self.cgroups.as_ref().unwrap()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        // A restart that failed left no manager: a new one cleans up, once the lock is free.
        if self.cgroups.is_none() {
            self.cgroups = Cgroups::open(options(&self.name)).ok();
        }
        if let Some(cgroups) = &self.cgroups
            && let Err(error) = cgroups.destroy_all(&mut sigkill)
        {
            // A test that failed already says so; a clean-up that fails is a failure too.
            if std::thread::panicking() {
                #[allow(clippy::print_stderr)]
                {
                    eprintln!("cannot clean up {}: {error}", self.name);
                }
            } else {
                panic!("cannot clean up {}: {error}", self.name);
            }
        }
    }
}

fn sigkill(pid: i32) -> std::io::Result<()> {
    // SAFETY: kill takes plain integers; the pid was read from a frozen test cgroup.
    if unsafe { libc::kill(pid, libc::SIGKILL) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

fn options(parent: &str) -> CgroupOptions {
    CgroupOptions {
        parent: CgroupParent::Absolute(parent.into()),
        pids_max: Some(64),
        reserved_cores: CpuSet::new(),
        cpu: NodeCpu { mhz_per_core: 2000 },
        sweep_siblings: false,
    }
}

fn scratch() -> Scratch {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let name = format!(
        "wharf-test-isolate-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    );
    let cgroups = Cgroups::open(options(&name)).unwrap_or_else(|e| {
        panic!(
            "these tests need writable cgroups (run as root on a host with cgroup v1 or v2): {e}"
        )
    });
    Scratch { cgroups: Some(cgroups), name }
}

fn limits(scratch: &Scratch, memory: u32, hard_limit: Option<u64>) -> Limits {
    scratch.limits(&Resources { cpu: 500, memory, memory_max: None, cores: 0 }, hard_limit)
}

/// Starts `sh -c script` inside `cgroup`, joined between fork and exec as the shim does it.
fn spawn_in(cgroup: &TaskCgroup, script: &str) -> Child {
    let containment = Containment { cgroup: cgroup.procs_files(), ..Containment::default() };
    let prepared = containment.prepare().unwrap();
    let mut command = Command::new("/bin/sh");
    command.args(["-c", script]).stdin(Stdio::null()).stdout(Stdio::piped());
    // SAFETY: `apply` only writes to descriptors that are already open.
    unsafe {
        command.pre_exec(move || {
            prepared.apply().map_err(|failure| std::io::Error::from_raw_os_error(failure.errno))
        });
    }
    command.spawn().unwrap()
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The directory of `cgroup` in the hierarchy whose mount is named `controller`.
fn dir_of(cgroup: &TaskCgroup, controller: &str) -> PathBuf {
    cgroup
        .dirs()
        .into_iter()
        .find(|d| d.components().any(|c| c.as_os_str() == controller))
        .unwrap_or_else(|| panic!("no {controller} directory in {:?}", cgroup.dirs()))
        .to_owned()
}

/// Waits for a child with a bound, killing it if the bound passes.
fn wait(child: &mut Child) -> std::process::ExitStatus {
    for _ in 0..2000 {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let _ = child.kill();
    panic!("the child did not exit within 20 s");
}

/// Reads the first line the child writes: how the tests wait for it to reach a point.
fn first_line(child: &mut Child) -> String {
    use std::io::BufRead;
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.as_mut().unwrap()).read_line(&mut line).unwrap();
    line.trim().to_owned()
}

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

/// A process that allocates past its limit is killed by the kernel, and the cgroup says so.
#[test]
fn an_oom_kill_is_recorded() {
    let scratch = scratch();
    let cgroup = scratch.create("a1/oom/00000000", &limits(&scratch, 16, None)).unwrap();
    assert!(!cgroup.oom_killed().unwrap());
    // `tail` keeps the last line, and /dev/zero has no line end: it grows until killed.
    let mut child = spawn_in(&cgroup, "exec tail /dev/zero");
    let status = wait(&mut child);
    assert_eq!(status.signal(), Some(libc::SIGKILL), "{status:?}");
    assert!(cgroup.oom_killed().unwrap());
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

#[test]
fn a_bad_parent_is_refused_with_its_reason() {
    for (parent, reason) in
        [("../x", "no `.` or `..`"), ("/", "names no cgroup"), ("a\nb", "newline")]
    {
        let error = Cgroups::open(options(parent)).unwrap_err().to_string();
        assert!(error.contains(reason), "{parent:?}: {error}");
    }
}

/// The node's default layout puts each agent's parent beside the others': an agent that
/// starts removes the empty parents of agents that were killed, and leaves the others alone.
#[test]
fn a_new_agent_sweeps_what_dead_agents_left_but_not_running_tasks() {
    let group = format!("wharf-test-isolate-sweep-{}", std::process::id());
    // Dropped last: the group's own directories, once the agents' parents are gone.
    struct Group(Vec<PathBuf>);
    impl Drop for Group {
        fn drop(&mut self) {
            for dir in &self.0 {
                let _ = std::fs::remove_dir(dir);
            }
        }
    }
    let mut group_dirs = Group(Vec::new());
    let open = |node: &str, sweep: bool| Scratch {
        cgroups: Some(
            Cgroups::open(CgroupOptions {
                sweep_siblings: sweep,
                ..options(&format!("{group}/{node}"))
            })
            .unwrap(),
        ),
        name: format!("{group}/{node}"),
    };
    let parents = |scratch: &Scratch| -> Vec<PathBuf> {
        scratch.parents().into_iter().map(Path::to_path_buf).collect()
    };
    // A killed agent leaves its parent behind: made here as it would have been.
    let mut dead = open("dead", false);
    let dead_dirs = parents(&dead);
    group_dirs.0 = dead_dirs.iter().filter_map(|d| d.parent()).map(Path::to_path_buf).collect();
    dead.cgroups = None;
    for dir in &dead_dirs {
        std::fs::create_dir_all(dir).unwrap();
    }
    // A killed agent whose task still runs in its cgroup; and one whose task ended while it
    // was gone, which left an empty cgroup.
    let mut busy = open("busy", false);
    let task = busy.create("a1/left/00000000", &limits(&busy, 16, None)).unwrap();
    let mut child = spawn_in(&task, "echo up; sleep 60");
    assert_eq!(first_line(&mut child), "up");
    busy.cgroups = None;
    let mut idle = open("idle", false);
    let ended = idle.create("a1/ended/00000000", &limits(&idle, 16, None)).unwrap();
    let idle_dirs = parents(&idle);
    idle.cgroups = None;
    let live = open("live", false);

    let new = open("new", true);
    assert!(dead_dirs.iter().all(|d| !d.exists()), "the dead agent's empty parent is gone");
    assert!(ended.dirs().iter().all(|d| !d.exists()), "an empty task cgroup is gone");
    assert!(idle_dirs.iter().all(|d| !d.exists()), "and its parent with it");
    assert!(parents(&live).iter().all(|d| d.exists()), "a live agent's parent stays");
    // A task cgroup with a process in it stays, and the parent holding it.
    for dir in task.dirs() {
        assert!(dir.exists() && dir.parent().unwrap().exists(), "{} is gone", dir.display());
    }

    busy.restart();
    task.kill_all(&mut sigkill).unwrap();
    wait(&mut child);
    busy.remove(&task).unwrap();
    drop((new, live, busy));
    for dir in &group_dirs.0 {
        let entries = std::fs::read_dir(dir).unwrap().flatten();
        let left: Vec<_> =
            entries.filter(|e| e.file_type().unwrap().is_dir()).map(|e| e.path()).collect();
        assert!(left.is_empty(), "left behind: {left:?}");
    }
}
