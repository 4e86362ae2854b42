//! What the v1 code reads on kernels this host's does not show, against a fake cgroupfs tree
//! (temporary directories mounted as v1 hierarchies in a made-up mountinfo): the OOM record
//! of a kernel older than Linux 4.13, whose `memory.oom_control` has no `oom_kill` count (so
//! whether the OOM killer ended a process is unknown), and stats without swap accounting. The
//! real v1 hierarchy is tested in `cgroup_v1.rs`.

use wharf_isolate::cgroup::{NodeCpu, OomRecord};
use wharf_isolate::{CgroupOptions, CgroupParent, Cgroups, CpuSet, TaskCgroup};
use wharf_state::spec::Resources;

const CONTROLLERS: [&str; 5] = ["memory", "cpu", "cpuacct", "pids", "freezer"];

struct Fake {
    root: tempfile::TempDir,
}

impl Fake {
    /// One hierarchy per controller wharf needs (no cpuset), the agent at each one's root.
    fn new() -> Fake {
        Fake { root: tempfile::tempdir().unwrap() }
    }

    fn open(&self) -> Cgroups {
        let mut mountinfo = String::new();
        let mut own = String::new();
        for (id, controller) in CONTROLLERS.iter().enumerate() {
            let mount = self.root.path().join(controller);
            std::fs::create_dir(&mount).unwrap();
            mountinfo += &format!(
                "{} 31 0:{id} / {} rw,relatime - cgroup cgroup rw,{controller}\n",
                40 + id,
                mount.display()
            );
            own += &format!("{}:{controller}:/\n", id + 1);
        }
        let options = CgroupOptions {
            parent: CgroupParent::Absolute("/wharf".into()),
            pids_max: Some(100),
            reserved_cores: CpuSet::new(),
            cpu: NodeCpu { mhz_per_core: 2000 },
            sweep_siblings: false,
        };
        Cgroups::open_with(&mountinfo, &own, options).unwrap()
    }

    fn write(&self, controller: &str, file: &str, text: &str) {
        let path = self.root.path().join(controller).join("wharf/a1.web.00000000").join(file);
        std::fs::write(path, text).unwrap();
    }
}

fn create(cgroups: &Cgroups) -> TaskCgroup {
    let resources = Resources { cpu: 500, memory: 64, memory_max: None, cores: 0 };
    cgroups
        .create("a1/web/00000000", &cgroups.limits(&resources, None), &mut |pid| {
            panic!("nothing runs in a fake tree, yet pid {pid} was to be killed")
        })
        .unwrap()
}

/// Before Linux 4.13 `memory.oom_control` counts no kills: then nobody can tell whether the
/// OOM killer ended a process, and a limit that was hit (`memory.failcnt`) is no sign of it.
/// Where the count is there, it alone decides.
#[test]
fn without_an_oom_kill_count_an_oom_kill_is_unknown() {
    let fake = Fake::new();
    let cgroups = fake.open();
    assert_eq!(cgroups.version(), wharf_isolate::cgroup::Version::V1);
    let cgroup = create(&cgroups);
    let cases = [
        ("oom_kill_disable 0\nunder_oom 0\n", "0\n", OomRecord::NotCounted),
        ("oom_kill_disable 0\nunder_oom 0\n", "3\n", OomRecord::NotCounted),
        ("oom_kill_disable 0\nunder_oom 0\noom_kill 0\n", "3\n", OomRecord::NotKilled),
        ("oom_kill_disable 0\nunder_oom 0\noom_kill 1\n", "3\n", OomRecord::Killed),
    ];
    for (control, failcnt, record) in cases {
        fake.write("memory", "memory.oom_control", control);
        fake.write("memory", "memory.failcnt", failcnt);
        assert_eq!(cgroup.oom_killed().unwrap(), record, "{control:?} {failcnt:?}");
    }
}

/// Without swap accounting `memory.stat` has no `swap` line: swap is not measured (and not
/// reported as 0 bytes that were measured).
#[test]
fn stats_without_swap_accounting_leave_swap_unmeasured() {
    let fake = Fake::new();
    let cgroups = fake.open();
    let cgroup = create(&cgroups);
    fake.write("memory", "memory.stat", "cache 4096\nrss 81920\n");
    fake.write("memory", "memory.max_usage_in_bytes", "90112\n");
    fake.write("cpuacct", "cpuacct.usage", "3000000\n");
    fake.write("cpuacct", "cpuacct.usage_all", "cpu user system\n0 2000000 500000\n1 0 500000\n");
    fake.write("cpu", "cpu.stat", "nr_periods 10\nnr_throttled 2\nthrottled_time 7000\n");
    fake.write("pids", "pids.current", "2\n");
    let stats = cgroup.stats().unwrap();
    assert_eq!(
        (stats.memory_rss, stats.memory_cache, stats.memory_max_usage),
        (81920, 4096, 90112)
    );
    assert_eq!(stats.cpu_total.as_millis(), 3);
    assert_eq!((stats.cpu_user.as_millis(), stats.cpu_system.as_millis()), (2, 1));
    assert_eq!((stats.cpu_periods, stats.cpu_throttled_periods), (10, 2));
    assert_eq!(stats.cpu_throttled.as_micros(), 7);
    assert_eq!(stats.processes, 2);
    assert!(!stats.measured.swap && stats.measured.max_usage, "{:?}", stats.measured);

    fake.write("memory", "memory.stat", "cache 4096\nrss 81920\nswap 8192\n");
    let stats = cgroup.stats().unwrap();
    assert!(stats.measured.swap && stats.memory_swap == 8192, "{stats:?}");
}
