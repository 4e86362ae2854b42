//! The cgroup v2 code's file handling, against a fake cgroupfs tree: a temporary directory
//! mounted as `cgroup2` in a made-up mountinfo. It checks which files are written with what
//! and how the kernel's files are read; it cannot check what the kernel does with them, and
//! the v2 code has not been run against a real v2 hierarchy on this project's machines (which
//! run v1).
//!
//! A real cgroupfs fills every new directory with its files; the fake one does not, so each
//! test writes the files the kernel would have before the code reads them.

use std::path::{Path, PathBuf};
use wharf_isolate::cgroup::{NodeCpu, OomRecord, Version};
use wharf_isolate::{CgroupOptions, CgroupParent, Cgroups, CpuSet, IsolateError, TaskCgroup};
use wharf_state::spec::Resources;

const MIB: u64 = 1 << 20;

struct Fake {
    root: tempfile::TempDir,
}

impl Fake {
    /// A unified hierarchy whose root offers `controllers`, with a parent `wharf` that the
    /// "kernel" gave `cgroup.kill` (Linux 5.14) if `kill_file`.
    fn new(controllers: &str, kill_file: bool) -> Fake {
        let fake = Fake { root: tempfile::tempdir().unwrap() };
        fake.write("cgroup.controllers", controllers);
        fake.write("cgroup.subtree_control", "");
        fake.write("cpuset.cpus.effective", "0-3\n");
        std::fs::create_dir(fake.path("wharf")).unwrap();
        if kill_file {
            fake.write("wharf/cgroup.kill", "");
        }
        fake
    }

    fn path(&self, relative: &str) -> PathBuf {
        self.root.path().join(relative)
    }

    fn write(&self, relative: &str, text: &str) {
        let path = self.path(relative);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }

    fn read(&self, relative: &str) -> String {
        let path = self.path(relative);
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    }

    fn open(&self) -> Result<Cgroups, IsolateError> {
        self.open_as(CgroupParent::Absolute("/wharf".into()), "0::/\n")
    }

    /// A manager under `parent`, for an agent whose `/proc/self/cgroup` is `own`.
    fn open_as(&self, parent: CgroupParent, own: &str) -> Result<Cgroups, IsolateError> {
        let mountinfo =
            format!("29 23 0:26 / {} rw,nosuid - cgroup2 cgroup2 rw\n", self.root.path().display());
        Cgroups::open_with(
            &mountinfo,
            own,
            CgroupOptions {
                parent,
                pids_max: Some(100),
                reserved_cores: CpuSet::parse("3").unwrap(),
                cpu: NodeCpu { mhz_per_core: 2000 },
                sweep_siblings: false,
            },
        )
    }

    /// What the kernel does on rmdir: the control files go with the directory.
    fn clear(&self, dir: &Path) {
        for entry in std::fs::read_dir(dir).unwrap().flatten() {
            if entry.file_type().unwrap().is_file() {
                std::fs::remove_file(entry.path()).unwrap();
            }
        }
    }
}

/// A kill that is never needed: a fake tree has no processes.
fn no_kill(pid: i32) -> std::io::Result<()> {
    panic!("nothing runs in a fake tree, yet pid {pid} was to be killed")
}

/// The cgroup of task run `task_id` with the limits of `resources` (no hard CPU limit).
fn create(
    cgroups: &Cgroups,
    task_id: &str,
    resources: Resources,
) -> Result<TaskCgroup, IsolateError> {
    cgroups.create(task_id, &cgroups.limits(&resources, None), &mut no_kill)
}

fn resources(memory: u32, memory_max: Option<u32>, cores: u32) -> Resources {
    Resources { cpu: 1000, memory, memory_max, cores }
}

#[test]
fn controllers_are_handed_down_to_the_partitions() {
    let fake = Fake::new("cpuset cpu io memory hugetlb pids\n", true);
    let cgroups = fake.open().unwrap();
    assert_eq!(cgroups.version(), Version::V2);
    for level in ["", "wharf/", "wharf/share/", "wharf/reserve/"] {
        assert_eq!(
            fake.read(&format!("{level}cgroup.subtree_control")),
            "+cpuset +cpu +memory +pids",
            "{level}"
        );
    }
    // Core 3 is the node's own; nothing is reserved yet.
    assert_eq!(fake.read("wharf/share/cpuset.cpus"), "0-2");
    assert_eq!(fake.read("wharf/reserve/cpuset.cpus"), "");
    assert_eq!(cgroups.parents(), vec![fake.path("wharf")]);
}

/// `TestCustomPathCG2`: by default the parent is a `wharf` child of the agent's own cgroup
/// (a systemd service's, here), and the controllers are handed down from that cgroup, not from
/// the root, which is not the agent's to change.
#[test]
fn the_default_parent_is_a_wharf_child_of_the_agents_own_cgroup() {
    let fake = Fake::new("cpu memory pids\n", true);
    let own = "system.slice/wharf-agent.service";
    fake.write(&format!("{own}/cgroup.controllers"), "cpu io memory pids\n");
    fake.write(&format!("{own}/cgroup.subtree_control"), "");
    let cgroups = fake.open_as(CgroupParent::default(), &format!("0::/{own}\n")).unwrap();
    assert_eq!(cgroups.parents(), vec![fake.path(&format!("{own}/wharf"))]);
    for level in ["", "wharf/", "wharf/share/", "wharf/reserve/"] {
        assert_eq!(
            fake.read(&format!("{own}/{level}cgroup.subtree_control")),
            "+cpu +memory +pids",
            "{level}"
        );
    }
    assert_eq!(fake.read("cgroup.subtree_control"), "", "the root is left alone");
    let cgroup = create(&cgroups, "a1/web/00000000", resources(64, None, 0)).unwrap();
    assert_eq!(
        cgroup.join_files(),
        vec![fake.path(&format!("{own}/wharf/share/a1.web.00000000/cgroup.procs"))]
    );
}

/// An agent started in the leaf its cgroup's processes moved to (restarted there, or by
/// systemd's `DelegateSubgroup=agent`) keeps its parent beside the leaf, where its tasks are,
/// not below the leaf, and hands down the controllers its cgroup is offered: the leaf itself
/// may be offered none yet.
#[test]
fn an_agent_in_its_leaf_keeps_its_parent_beside_the_leaf() {
    let fake = Fake::new("cpu memory pids\n", true);
    let own = "system.slice/wharf-agent.service";
    fake.write(&format!("{own}/cgroup.controllers"), "cpu io memory pids\n");
    fake.write(&format!("{own}/cgroup.subtree_control"), "");
    fake.write(&format!("{own}/agent/cgroup.controllers"), "");
    let cgroups = fake.open_as(CgroupParent::default(), &format!("0::/{own}/agent\n")).unwrap();
    assert_eq!(cgroups.parents(), vec![fake.path(&format!("{own}/wharf"))]);
    assert_eq!(fake.read(&format!("{own}/cgroup.subtree_control")), "+cpu +memory +pids");
    assert!(!fake.path(&format!("{own}/agent/wharf")).exists());
}

/// A run started again under the id of a lost run (its agent died before saving its handle)
/// finds that run's cgroup: what is in it is killed before the new run's limits are written.
#[test]
fn a_run_started_again_kills_what_the_lost_run_left() {
    let fake = Fake::new("cpu memory pids\n", true);
    let cgroups = fake.open().unwrap();
    let dir = "wharf/share/a1.web.00000004";
    fake.write(&format!("{dir}/cgroup.procs"), "4242\n");
    fake.write(&format!("{dir}/cgroup.kill"), "");
    create(&cgroups, "a1/web/00000004", resources(64, None, 0)).unwrap();
    assert_eq!(fake.read(&format!("{dir}/cgroup.kill")), "1", "killed whole");
    assert_eq!(fake.read(&format!("{dir}/memory.max")), (64 * MIB).to_string());
}

#[test]
fn limits_go_into_the_v2_files() {
    let fake = Fake::new("cpuset cpu memory pids\n", true);
    let cgroups = fake.open().unwrap();
    let limits = cgroups.limits(&resources(256, Some(512), 0), Some(100_000));
    let cgroup = cgroups.create("a1/web/00000000", &limits, &mut no_kill).unwrap();
    let dir = "wharf/share/a1.web.00000000";
    assert_eq!(cgroup.dirs(), vec![fake.path(dir)]);
    assert_eq!(fake.read(&format!("{dir}/memory.max")), (512 * MIB).to_string());
    assert_eq!(fake.read(&format!("{dir}/memory.low")), (256 * MIB).to_string());
    // 1000 shares on runc's scale.
    assert_eq!(fake.read(&format!("{dir}/cpu.weight")), "39");
    assert_eq!(fake.read(&format!("{dir}/cpu.max")), "50000 100000");
    assert_eq!(fake.read(&format!("{dir}/pids.max")), "100");
    assert_eq!(cgroup.join_files(), vec![fake.path(&format!("{dir}/cgroup.procs"))]);

    fake.clear(&fake.path(dir));
    cgroups.remove(&cgroup).unwrap();
    assert!(!fake.path(dir).exists());
}

#[test]
fn reserved_cores_move_from_share_to_reserve_and_back() {
    let fake = Fake::new("cpuset cpu memory pids\n", true);
    let cgroups = fake.open().unwrap();
    let cgroup = create(&cgroups, "a1/pinned/00000000", resources(64, None, 2)).unwrap();
    let dir = "wharf/reserve/a1.pinned.00000000";
    assert_eq!(cgroup.dirs(), vec![fake.path(dir)]);
    assert_eq!(fake.read(&format!("{dir}/cpuset.cpus")), "0-1");
    assert_eq!(fake.read("wharf/reserve/cpuset.cpus"), "0-1");
    assert_eq!(fake.read("wharf/share/cpuset.cpus"), "2");
    match create(&cgroups, "a1/more/00000000", resources(64, None, 1)) {
        Err(IsolateError::NotEnoughCores { needed: 1, free: 0 }) => {}
        other => panic!("{other:?}"),
    }
    fake.clear(&fake.path(dir));
    cgroups.remove(&cgroup).unwrap();
    assert_eq!(fake.read("wharf/reserve/cpuset.cpus"), "");
    assert_eq!(fake.read("wharf/share/cpuset.cpus"), "0-2");
}

#[test]
fn stats_and_oom_read_the_v2_files() {
    let fake = Fake::new("cpu memory pids\n", true);
    let cgroups = fake.open().unwrap();
    assert!(!cgroups.can_reserve_cores());
    let cgroup = create(&cgroups, "a1/web/00000001", resources(64, None, 0)).unwrap();
    let dir = "wharf/share/a1.web.00000001";
    fake.write(&format!("{dir}/memory.stat"), "anon 1048576\nfile 4096\nkernel 8192\n");
    fake.write(&format!("{dir}/memory.swap.current"), "0\n");
    fake.write(&format!("{dir}/memory.peak"), "2097152\n");
    fake.write(
        &format!("{dir}/cpu.stat"),
        "usage_usec 3000\nuser_usec 2000\nsystem_usec 1000\nnr_periods 10\nnr_throttled 4\nthrottled_usec 500\n",
    );
    fake.write(&format!("{dir}/pids.current"), "3\n");
    fake.write(&format!("{dir}/memory.events"), "low 0\nhigh 0\nmax 2\noom 1\noom_kill 0\n");
    let stats = cgroup.stats().unwrap();
    assert_eq!(
        (stats.memory_rss, stats.memory_cache, stats.memory_max_usage),
        (MIB, 4096, 2 * MIB)
    );
    assert_eq!((stats.cpu_user.as_micros(), stats.cpu_system.as_micros()), (2000, 1000));
    assert_eq!(stats.cpu_total.as_micros(), 3000);
    assert_eq!(
        (stats.cpu_periods, stats.cpu_throttled_periods, stats.cpu_throttled.as_micros()),
        (10, 4, 500)
    );
    assert_eq!(stats.processes, 3);
    assert!(stats.measured.swap && stats.measured.max_usage);
    assert_eq!(cgroup.oom_killed().unwrap(), OomRecord::NotKilled);
    fake.write(&format!("{dir}/memory.events"), "low 0\nhigh 0\nmax 9\noom 2\noom_kill 1\n");
    assert_eq!(cgroup.oom_killed().unwrap(), OomRecord::Killed);

    // Figures are read afresh each time, from the files kept open.
    fake.write(&format!("{dir}/pids.current"), "5\n");
    assert_eq!(cgroup.stats().unwrap().processes, 5);

    // Before Linux 5.19 there is no memory.peak: max usage is not measured.
    let older = create(&cgroups, "a1/web/00000009", resources(64, None, 0)).unwrap();
    let dir = "wharf/share/a1.web.00000009";
    for file in ["memory.stat", "memory.swap.current", "cpu.stat", "pids.current"] {
        let source = fake.read(&format!("wharf/share/a1.web.00000001/{file}"));
        fake.write(&format!("{dir}/{file}"), &source);
    }
    let stats = older.stats().unwrap();
    assert!(!stats.measured.max_usage && stats.memory_max_usage == 0);
}

#[test]
fn kills_use_cgroup_kill_where_the_kernel_has_it() {
    let fake = Fake::new("cpu memory pids\n", true);
    let cgroups = fake.open().unwrap();
    let cgroup = create(&cgroups, "a1/web/00000002", resources(64, None, 0)).unwrap();
    let dir = "wharf/share/a1.web.00000002";
    fake.write(&format!("{dir}/cgroup.kill"), "");
    let mut sent = Vec::new();
    // Empty: nothing is written.
    assert_eq!(
        cgroup
            .kill_all(&mut |pid| {
                sent.push(pid);
                Ok(())
            })
            .unwrap(),
        0
    );
    assert_eq!(fake.read(&format!("{dir}/cgroup.kill")), "", "nothing is written");
    fake.write(&format!("{dir}/cgroup.procs"), "4242\n");
    assert_eq!(
        cgroup
            .kill_all(&mut |pid| {
                sent.push(pid);
                Ok(())
            })
            .unwrap(),
        0
    );
    assert!(sent.is_empty(), "the kernel kills them all");
    assert_eq!(fake.read(&format!("{dir}/cgroup.kill")), "1");
}

#[test]
fn without_cgroup_kill_the_cgroup_is_frozen_killed_and_thawed() {
    let fake = Fake::new("cpu memory pids\n", false);
    let cgroups = fake.open().unwrap();
    let cgroup = create(&cgroups, "a1/web/00000003", resources(64, None, 0)).unwrap();
    let dir = "wharf/share/a1.web.00000003";
    fake.write(&format!("{dir}/cgroup.procs"), "4242\n4243\n");
    fake.write(&format!("{dir}/cgroup.freeze"), "0");
    fake.write(&format!("{dir}/cgroup.events"), "populated 1\nfrozen 1\n");
    let mut sent = Vec::new();
    let frozen_when_sent = std::cell::Cell::new(true);
    let killed = cgroup
        .kill_all(&mut |pid| {
            frozen_when_sent
                .set(frozen_when_sent.get() && fake.read(&format!("{dir}/cgroup.freeze")) == "1");
            sent.push(pid);
            Ok(())
        })
        .unwrap();
    assert_eq!((killed, sent), (2, vec![4242, 4243]));
    assert!(frozen_when_sent.get(), "each kill was sent while the cgroup was frozen");
    assert_eq!(fake.read(&format!("{dir}/cgroup.freeze")), "0", "thawed after");
    assert!(!fake.path(&format!("{dir}/cgroup.kill")).exists());
}

#[test]
fn orphans_are_found_in_both_partitions() {
    let fake = Fake::new("cpuset cpu memory pids\n", true);
    let cgroups = fake.open().unwrap();
    let live = create(&cgroups, "a1/live/00000000", resources(64, None, 0)).unwrap();
    // Left by an agent that died: one sharing, one with core 1 reserved.
    std::fs::create_dir(fake.path("wharf/share/a0.old.00000000")).unwrap();
    fake.write("wharf/reserve/a0.pinned.00000000/cpuset.cpus", "1\n");
    drop(cgroups);
    let cgroups = fake.open().unwrap();
    // Until it is swept, the orphan's core is not shared.
    assert_eq!(fake.read("wharf/share/cpuset.cpus"), "0,2");
    cgroups.adopt("a1/live/00000000", None).unwrap();
    fake.clear(&fake.path("wharf/reserve/a0.pinned.00000000"));
    let removed = cgroups.remove_orphans(&mut |_| Ok(()));
    assert_eq!(removed, vec!["a0.old.00000000".to_owned(), "a0.pinned.00000000".to_owned()]);
    assert!(!fake.path("wharf/share/a0.old.00000000").exists());
    assert_eq!(fake.read("wharf/share/cpuset.cpus"), "0-2");
    assert!(live.dirs()[0].exists());
}

#[test]
fn a_hierarchy_without_memory_is_refused() {
    let fake = Fake::new("cpu io pids\n", true);
    let error = fake.open().unwrap_err().to_string();
    assert!(error.contains("does not offer memory"), "{error}");
}
