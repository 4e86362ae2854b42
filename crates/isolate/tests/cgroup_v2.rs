//! The cgroup layer on a real cgroup v2 kernel: what the fake tree of `cgroup_v2_fake.rs`
//! cannot show, because the kernel decides it. v2's rule that a cgroup which hands controllers
//! down holds no process (the agent moves itself to a leaf), `cgroup.kill`, `cgroup.freeze`,
//! the OOM count of `memory.events`, `cpu.weight` between tasks that contend for a core,
//! reserved cores (`cpuset`), `pids.max`, stats, adoption after a restart.
//!
//! Only `cargo xtask cgroup2` runs these: it boots a kernel with cgroup v2 alone in a virtual
//! machine, and runs this binary in a cgroup of its own below the root, as a service runs
//! (`Cargo.toml` gives the target `test = false`, so a plain `cargo test` leaves it out). On
//! another host each test fails, saying what it needs.
//!
//! Nomad's counterparts: `TestExecutor_IsolationAndConstraints`, `TestExecutor_CgroupPaths`,
//! `TestExecutor_CleanOldProcessesInCGroup`, `TestCustomPathCG2`, and its executor's OOM
//! reporting.

#![allow(clippy::disallowed_methods)] // Tests start the processes they put in cgroups.

mod scratch;

use scratch::*;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::time::Duration;
use wharf_isolate::cgroup::{OomRecord, Version};
use wharf_isolate::{CgroupParent, Cgroups, CpuSet, IsolateError, TaskCgroup};
use wharf_state::spec::Resources;

/// A manager under a parent of the test's own, below the root, on a v2 host.
fn v2_scratch() -> Scratch {
    require_v2();
    scratch()
}

/// Fails, saying why, unless this host runs cgroup v2 alone.
fn require_v2() {
    let mounts = read(Path::new("/proc/self/mountinfo"));
    let v1 = mounts.lines().any(|l| l.contains(" - cgroup "));
    let v2 = mounts.lines().any(|l| l.contains(" - cgroup2 "));
    assert!(
        v2 && !v1,
        "these tests need a host on cgroup v2 alone (this one mounts {}): run them with \
         `cargo xtask cgroup2`, which boots one in a virtual machine",
        if v1 { "cgroup v1" } else { "no cgroup2" }
    );
}

/// The one directory of a v2 task cgroup.
fn dir(cgroup: &TaskCgroup) -> PathBuf {
    let dirs = cgroup.dirs();
    assert_eq!(dirs.len(), 1, "{dirs:?}");
    dirs[0].to_owned()
}

/// The v2 path of this process's cgroup, below the hierarchy's root.
fn own_cgroup() -> PathBuf {
    let membership = read(Path::new("/proc/self/cgroup"));
    let path = membership
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .unwrap_or_else(|| panic!("no v2 line in {membership}"));
    Path::new("/sys/fs/cgroup").join(path.trim().trim_start_matches('/'))
}

fn field(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| l.strip_prefix(key)?.strip_prefix(' ')?.trim().parse().ok())
}

/// Waits (at most 20 s) until `done` holds.
fn eventually(what: &str, mut done: impl FnMut() -> bool) {
    for _ in 0..2000 {
        if done() {
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!("{what}: not within 20 s");
}

fn gone(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat.rsplit(')').next().is_some_and(|rest| rest.trim_start().starts_with('Z')),
        Err(_) => true,
    }
}

/// `TestExecutor_IsolationAndConstraints`: the limits are in the v2 files, as the kernel
/// reads them back, and the cgroup is gone once removed.
#[test]
fn limits_are_written_to_the_v2_files_and_the_cgroup_is_removed() {
    let scratch = v2_scratch();
    assert_eq!(scratch.version(), Version::V2);
    let limits = scratch.limits(
        &Resources { cpu: 1000, memory: 64, memory_max: Some(128), cores: 0 },
        Some(100_000),
    );
    let cgroup = scratch.create("a1/web/00000000", &limits).unwrap();
    let dir = dir(&cgroup);
    assert_eq!(dir, scratch.parents()[0].join("share/a1.web.00000000"));
    let file = |name: &str| read(&dir.join(name)).trim().to_owned();
    assert_eq!(file("memory.max"), (128 * MIB).to_string());
    assert_eq!(file("memory.low"), (64 * MIB).to_string());
    if dir.join("memory.swap.max").exists() {
        assert_eq!(file("memory.swap.max"), "0");
    }
    // 1000 shares on runc's scale.
    assert_eq!(file("cpu.weight"), "39");
    // 1000 MHz of 2000 MHz cores: half of each period.
    assert_eq!(file("cpu.max"), "50000 100000");
    assert_eq!(file("pids.max"), "64");

    scratch.remove(&cgroup).unwrap();
    assert!(!dir.exists(), "{} is left", dir.display());
    scratch.remove(&cgroup).unwrap();
}

/// `TestExecutor_CgroupPaths`: a process that joins is in the task's cgroup, and so is what it
/// starts.
#[test]
fn a_joined_process_and_its_children_are_in_the_tasks_cgroup() {
    let scratch = v2_scratch();
    let cgroup = scratch.create("a1/paths/00000000", &limits(&scratch, 64, None)).unwrap();
    let mut child = spawn_in(&cgroup, "sleep 30 & echo $!; wait");
    let grandchild: i32 = first_line(&mut child).parse().unwrap();
    let expected = format!("0::/{}/share/a1.paths.00000000", scratch.name);
    for pid in [child.id() as i32, grandchild] {
        assert_eq!(read(Path::new(&format!("/proc/{pid}/cgroup"))).trim(), expected);
    }
    let mut pids = cgroup.pids().unwrap();
    pids.sort_unstable();
    let mut both = vec![child.id() as i32, grandchild];
    both.sort_unstable();
    assert_eq!(pids, both);
    cgroup.kill_all(&mut sigkill).unwrap();
    assert_eq!(wait(&mut child).signal(), Some(libc::SIGKILL));
    scratch.remove(&cgroup).unwrap();
}

/// `TestCustomPathCG2` and v2's rule of no internal processes: a parent below the agent's own
/// cgroup needs that cgroup to hand its controllers down, which it may only while it holds no
/// process. The agent's processes move to a leaf `agent` beside the tasks' cgroups. A manager
/// opened again (an agent restarting from that leaf) finds the same parent, and adopts what
/// runs there.
#[test]
fn below_its_own_cgroup_the_agent_moves_to_a_leaf_and_finds_its_parent_again() {
    require_v2();
    let own = own_cgroup();
    assert_ne!(own, Path::new("/sys/fs/cgroup"), "the test runs in a cgroup of its own");
    let me = std::process::id().to_string();
    assert!(read(&own.join("cgroup.procs")).lines().any(|l| l == me));
    assert_eq!(read(&own.join("cgroup.subtree_control")).trim(), "", "nothing is enabled yet");

    let mut agent = scratch_under_own();
    let parent = own.join(&agent.name);
    assert_eq!(agent.parents(), vec![parent.as_path()]);
    assert_eq!(own_cgroup(), own.join("agent"), "this process moved to the leaf");
    assert_eq!(read(&own.join("cgroup.procs")).trim(), "", "the cgroup holds no process");
    let enabled = read(&own.join("cgroup.subtree_control"));
    for controller in ["cpu", "memory", "pids"] {
        assert!(enabled.split_whitespace().any(|c| c == controller), "{controller}: {enabled}");
    }

    let cgroup = agent.create("a1/own/00000000", &limits(&agent, 16, None)).unwrap();
    assert_eq!(dir(&cgroup), parent.join("share/a1.own.00000000"));
    let mut child = spawn_in(&cgroup, "echo up; exec sleep 60");
    assert_eq!(first_line(&mut child), "up");
    assert_eq!(cgroup.pids().unwrap(), vec![child.id() as i32]);

    // The agent restarts from its leaf: the same parent, the task adopted, not swept.
    agent.restart();
    assert_eq!(agent.parents(), vec![parent.as_path()], "a restarted agent finds its parent");
    let adopted = agent.adopt("a1/own/00000000", None).unwrap();
    assert_eq!(agent.remove_orphans(&mut sigkill), Vec::<String>::new());
    assert_eq!(adopted.pids().unwrap(), vec![child.id() as i32]);
    adopted.kill_all(&mut sigkill).unwrap();
    assert_eq!(wait(&mut child).signal(), Some(libc::SIGKILL));
    agent.remove(&adopted).unwrap();
}

/// `cgroup.kill` ends every process of the cgroup at once, one that left the task's session
/// and process group included; none is handed to the caller.
#[test]
fn cgroup_kill_ends_every_process_escaped_ones_included() {
    let scratch = v2_scratch();
    let cgroup = scratch.create("a1/escape/00000000", &limits(&scratch, 64, None)).unwrap();
    assert!(dir(&cgroup).join("cgroup.kill").exists(), "this kernel has cgroup.kill");
    let mut child = spawn_in(&cgroup, "setsid sh -c 'sleep 60 & echo $!'; sleep 60");
    let escaped: i32 = first_line(&mut child).parse().unwrap();
    assert!(cgroup.pids().unwrap().contains(&escaped));

    let mut handed = Vec::new();
    let killed = cgroup
        .kill_all(&mut |pid| {
            handed.push(pid);
            sigkill(pid)
        })
        .unwrap();
    assert_eq!((killed, handed), (0, Vec::new()), "the kernel killed them all");
    assert_eq!(wait(&mut child).signal(), Some(libc::SIGKILL));
    let events = dir(&cgroup).join("cgroup.events");
    eventually("the cgroup is empty", || field(&read(&events), "populated") == Some(0));
    assert!(gone(escaped), "the escaped process survived");
    scratch.remove(&cgroup).unwrap();
}

/// The kill of kernels without `cgroup.kill`: `cgroup.freeze` holds every process (a busy one
/// included) before any is handed to the caller, and stays asked for while each is (a v2
/// freeze lets a fatal signal through: a killed process leaves the freeze to exit, and the
/// cgroup reads as frozen again once it has); then the cgroup is thawed and they are gone.
#[test]
fn a_frozen_cgroup_has_each_process_killed_then_is_thawed() {
    let scratch = v2_scratch();
    let cgroup = scratch.create("a1/frozen/00000000", &limits(&scratch, 64, None)).unwrap();
    let dir = dir(&cgroup);
    let mut child = spawn_in(&cgroup, "(while :; do :; done) & echo $!; sleep 60");
    let busy: i32 = first_line(&mut child).parse().unwrap();
    let mut handed = Vec::new();
    let started = std::time::Instant::now();
    let killed = cgroup
        .kill_all_frozen(&mut |pid| {
            if handed.is_empty() {
                let events = read(&dir.join("cgroup.events"));
                assert_eq!(field(&events, "frozen"), Some(1), "frozen before a kill: {events}");
            }
            assert_eq!(read(&dir.join("cgroup.freeze")).trim(), "1", "still frozen");
            handed.push(pid);
            sigkill(pid)
        })
        .unwrap();
    // The freeze takes at once, and is seen so: the bounded wait for it (a second) never ran
    // out.
    let took = started.elapsed();
    assert!(took < Duration::from_millis(900), "the kill took {took:?}");
    handed.sort_unstable();
    let mut expected = vec![child.id() as i32, busy];
    expected.sort_unstable();
    assert_eq!((killed, handed), (2, expected));
    assert_eq!(read(&dir.join("cgroup.freeze")).trim(), "0", "thawed after");
    assert_eq!(wait(&mut child).signal(), Some(libc::SIGKILL));
    eventually("the busy process is gone", || gone(busy));
    scratch.remove(&cgroup).unwrap();
}

/// A process past `memory.max` is killed by the kernel, and `memory.events` counts it; a
/// process that exits on its own is no OOM kill. `memory.peak` shows the usage.
#[test]
fn an_oom_kill_is_counted_in_memory_events() {
    let scratch = v2_scratch();
    let cgroup = scratch.create("a1/oom/00000000", &limits(&scratch, 16, None)).unwrap();
    assert_eq!(cgroup.oom_killed().unwrap(), OomRecord::NotKilled);
    // `tail` keeps the last line, and /dev/zero has no line end: it grows until killed.
    let mut child = spawn_in(&cgroup, "exec tail /dev/zero");
    let status = wait(&mut child);
    assert_eq!(status.signal(), Some(libc::SIGKILL), "{status:?}");
    assert_eq!(cgroup.oom_killed().unwrap(), OomRecord::Killed);
    let events = read(&dir(&cgroup).join("memory.events"));
    assert!(field(&events, "oom_kill") >= Some(1), "{events}");
    let stats = cgroup.stats().unwrap();
    assert!(stats.measured.max_usage && stats.memory_max_usage >= 15 * MIB, "{stats:?}");
    scratch.remove(&cgroup).unwrap();

    let cgroup = scratch.create("a1/fine/00000000", &limits(&scratch, 16, None)).unwrap();
    let mut child = spawn_in(&cgroup, "exit 3");
    assert_eq!(wait(&mut child).code(), Some(3));
    assert_eq!(cgroup.oom_killed().unwrap(), OomRecord::NotKilled);
    scratch.remove(&cgroup).unwrap();
}

/// Stats from the v2 files: CPU time from `cpu.stat`, memory from `memory.stat` and
/// `memory.peak`, processes from `pids.current`.
#[test]
fn stats_count_the_tasks_cpu_and_memory() {
    let scratch = v2_scratch();
    let cgroup = scratch.create("a1/stats/00000000", &limits(&scratch, 64, None)).unwrap();
    // Busy for a while, holding 8 MiB, then report and wait.
    let mut child = spawn_in(
        &cgroup,
        "x=$(head -c 8388608 /dev/zero | tr '\\0' a); i=0; while [ $i -lt 20000 ]; do i=$((i+1)); done; echo ready; sleep 30",
    );
    assert_eq!(first_line(&mut child), "ready");
    let stats = cgroup.stats().unwrap();
    assert!(stats.cpu_total >= Duration::from_millis(5), "{stats:?}");
    assert!(stats.cpu_user + stats.cpu_system <= stats.cpu_total + Duration::from_millis(1));
    assert!(stats.measured.max_usage && stats.memory_max_usage >= 8 * MIB, "{stats:?}");
    assert!(stats.memory_rss > 0 && stats.processes >= 1, "{stats:?}");
    cgroup.kill_all(&mut sigkill).unwrap();
    wait(&mut child);
    scratch.remove(&cgroup).unwrap();
}

/// `cpu.weight` divides a core between tasks that both want it: two busy loops on one core,
/// one with eight times the other's MHz (weights 61 and 8), share it about so.
#[test]
fn the_cpu_weight_divides_a_contended_core() {
    let scratch = v2_scratch();
    let create = |task: &str, cpu: u32| {
        let resources = Resources { cpu, memory: 16, memory_max: None, cores: 0 };
        scratch.create(task, &scratch.limits(&resources, None)).unwrap()
    };
    let (light, heavy) = (create("a1/light/00000000", 200), create("a1/heavy/00000000", 1600));
    assert_eq!(read(&dir(&light).join("cpu.weight")).trim(), "8");
    assert_eq!(read(&dir(&heavy).join("cpu.weight")).trim(), "61");
    let core = scratch.shared_cores().iter().next().expect("a shared core");
    let script = format!("echo up; exec taskset -c {core} sh -c 'while :; do :; done'");
    let mut light_child = spawn_in(&light, &script);
    let mut heavy_child = spawn_in(&heavy, &script);
    assert_eq!(first_line(&mut light_child), "up");
    assert_eq!(first_line(&mut heavy_child), "up");
    let used = |cgroup: &TaskCgroup| cgroup.stats().unwrap().cpu_total;
    let (light_before, heavy_before) = (used(&light), used(&heavy));
    // The window of the measurement, not an ordering: a second of contention.
    std::thread::sleep(Duration::from_secs(1));
    let light_used = used(&light) - light_before;
    let heavy_used = used(&heavy) - heavy_before;
    let ratio = heavy_used.as_secs_f64() / light_used.as_secs_f64().max(1e-6);
    assert!(ratio > 3.0, "heavy {heavy_used:?}, light {light_used:?}: {ratio:.1} to 1");
    for (cgroup, child) in [(&light, &mut light_child), (&heavy, &mut heavy_child)] {
        cgroup.kill_all(&mut sigkill).unwrap();
        wait(child);
        scratch.remove(cgroup).unwrap();
    }
}

/// Reserved cores are the task's alone: its processes run on them only, and every other task
/// on the rest, until they are released.
#[test]
fn reserved_cores_leave_the_shared_set_until_released() {
    let scratch = v2_scratch();
    assert!(scratch.can_reserve_cores(), "the root offers cpuset");
    let all = scratch.shared_cores();
    assert!(all.len() >= 2, "this test needs two cores, the machine has {all}");
    let share = scratch.parents()[0].join("share");
    let effective = || CpuSet::parse(&read(&share.join("cpuset.cpus.effective"))).unwrap();
    assert_eq!(effective(), all);
    let resources = Resources { cpu: 100, memory: 16, memory_max: None, cores: 1 };
    let pinned = scratch.create("a1/pinned/00000000", &scratch.limits(&resources, None)).unwrap();
    let cores = pinned.cores().unwrap().clone();
    assert_eq!(cores.len(), 1);
    assert_eq!(read(&dir(&pinned).join("cpuset.cpus.effective")).trim(), cores.to_string());
    assert_eq!(effective(), all.difference(&cores), "the shared tasks lost the core");

    let allowed = |cgroup: &TaskCgroup| {
        let mut child = spawn_in(cgroup, "grep Cpus_allowed_list /proc/self/status");
        let line = first_line(&mut child);
        wait(&mut child);
        CpuSet::parse(line.split_whitespace().nth(1).unwrap()).unwrap()
    };
    assert_eq!(allowed(&pinned), cores);
    let shared = scratch.create("a1/shared/00000000", &limits(&scratch, 16, None)).unwrap();
    assert_eq!(allowed(&shared), all.difference(&cores));

    // Every core but one is the most a node gives away.
    let greedy = Resources { cores: u32::try_from(all.len()).unwrap(), ..resources };
    match scratch.create("a1/greedy/00000000", &scratch.limits(&greedy, None)) {
        Err(IsolateError::NotEnoughCores { .. }) => {}
        other => panic!("{other:?}"),
    }
    scratch.remove(&pinned).unwrap();
    assert_eq!(scratch.shared_cores(), all);
    assert_eq!(effective(), all);
    assert_eq!(allowed(&shared), all);
    scratch.remove(&shared).unwrap();
}

/// `pids.max` holds: forks past it fail, `pids.events` counts them, and the task keeps no
/// more processes than its limit.
#[test]
fn forks_past_pids_max_are_refused() {
    let scratch = v2_scratch();
    let cgroup = scratch.create("a1/forks/00000000", &limits(&scratch, 64, None)).unwrap();
    let dir = dir(&cgroup);
    assert_eq!(read(&dir.join("pids.max")).trim(), "64");
    // A hundred sleeps are asked for. A shell whose fork fails stops there (or goes on, as
    // some do); the sleeps leave its output alone, so it ends when the shell does.
    let mut child = spawn_in(
        &cgroup,
        "i=0; while [ $i -lt 100 ]; do sleep 60 </dev/null >/dev/null 2>&1 & i=$((i+1)); done",
    );
    wait(&mut child);
    let events = read(&dir.join("pids.events"));
    assert!(field(&events, "max") > Some(0), "no refused fork counted: {events}");
    let current: u64 = read(&dir.join("pids.current")).trim().parse().unwrap();
    // The limit, less the shell that ended.
    assert!((60..=63).contains(&current), "{current} processes");
    assert_eq!(cgroup.stats().unwrap().processes, current);
    cgroup.kill_all(&mut sigkill).unwrap();
    eventually("the sleeps are gone", || cgroup.pids().unwrap().is_empty());
    scratch.remove(&cgroup).unwrap();
}

/// After a restart, a new manager adopts the cgroups of tasks that still run and removes the
/// others, killing what is left in them; a second manager cannot take the parent meanwhile.
#[test]
fn a_new_manager_adopts_live_cgroups_and_removes_orphans() {
    let mut agent = v2_scratch();
    let kept = agent.create("a1/kept/00000000", &limits(&agent, 64, None)).unwrap();
    let orphan = agent.create("a1/orphan/00000000", &limits(&agent, 64, None)).unwrap();
    let mut kept_child = spawn_in(&kept, "echo up; sleep 60");
    let mut orphan_child = spawn_in(&orphan, "echo up; sleep 60");
    assert_eq!(first_line(&mut kept_child), "up");
    assert_eq!(first_line(&mut orphan_child), "up");
    match Cgroups::open(options(&agent.name)) {
        Err(IsolateError::ParentInUse { .. }) => {}
        other => panic!("{other:?}"),
    }
    agent.restart();
    let adopted = agent.adopt("a1/kept/00000000", None).unwrap();
    assert_eq!(adopted.dirs(), kept.dirs());
    assert_eq!(agent.remove_orphans(&mut sigkill), vec!["a1.orphan.00000000".to_owned()]);
    assert_eq!(wait(&mut orphan_child).signal(), Some(libc::SIGKILL));
    assert!(!dir(&orphan).exists());
    assert!(kept_child.try_wait().unwrap().is_none(), "the adopted task runs on");
    adopted.kill_all(&mut sigkill).unwrap();
    wait(&mut kept_child);
    agent.remove(&adopted).unwrap();
}

/// `TestExecutor_CleanOldProcessesInCGroup`: a run started again under the id of a run whose
/// agent died before it saved the run's handle finds that run's cgroup with its process in
/// it; the process is killed, and the cgroup holds the new run's alone.
#[test]
fn a_run_started_again_kills_what_the_lost_run_left_in_its_cgroup() {
    let mut agent = v2_scratch();
    let lost = agent.create("a1/again/00000000", &limits(&agent, 64, None)).unwrap();
    let mut lost_child = spawn_in(&lost, "echo up; exec sleep 60");
    assert_eq!(first_line(&mut lost_child), "up");
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

/// A parent from the root (`absolute`) is made there, with the controllers handed down to it
/// from the root; the root itself may hold processes (v2 exempts it).
#[test]
fn an_absolute_parent_is_below_the_root() {
    let scratch = v2_scratch();
    assert!(matches!(options(&scratch.name).parent, CgroupParent::Absolute(_)));
    let parent = Path::new("/sys/fs/cgroup").join(&scratch.name);
    assert_eq!(scratch.parents(), vec![parent.as_path()]);
    for level in [parent.clone(), parent.join("share"), parent.join("reserve")] {
        let enabled = read(&level.join("cgroup.subtree_control"));
        for controller in ["cpuset", "cpu", "memory", "pids"] {
            assert!(
                enabled.split_whitespace().any(|c| c == controller),
                "{}: {enabled}",
                level.display()
            );
        }
    }
}
