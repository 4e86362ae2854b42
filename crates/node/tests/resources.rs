//! The node's resources end to end, through the `wharf` binary on this host's real cgroups
//! (v1 or v2, whichever it runs; `cargo xtask cgroup2` runs them on a v2 kernel too):
//! admission (an allocation too large is refused with 409 and nothing is kept), the node
//! fingerprint (`GET /v1/node`, `wharf node status`), task stats from the cgroup (API, CLI,
//! metrics), an OOM kill in a task's state and events, and task cgroups kept across an
//! agent's SIGKILL and restart and gone after destroy.
//!
//! Each agent here gets a cgroup parent of its own (`[cgroups] parent`), which a guard kills
//! and removes once the test is over, whatever happened.

// Real processes on the real clock: the tests start and kill agents.
#![allow(clippy::disallowed_methods)]

mod common;

use common::*;
use hyper::Method;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};
use wharf_node::api::AllocSummary;
use wharf_node::client::{ApiPath, Client, ClientError};
use wharf_node::usage::{AllocStats, NodeStatus};
use wharf_state::{ClientStatus, TaskEventKind, TaskStatus};

/// A cgroup parent for one test's agents, killed and removed when dropped.
struct CgroupParent {
    name: String,
    /// `name` is below the agent's own cgroup (which it inherits from the test), not below
    /// each hierarchy's root.
    under_own: bool,
    /// Held until the parent is cleaned up, after the test's agents have gone.
    _turn: Turn,
}

/// On cgroup v2, an agent whose parent is below its own cgroup moves every process of that
/// cgroup (this test binary's, which every test's agent and shims share until then) to a
/// leaf, as an agent does before it starts any task: a task another test's shim has just
/// forked, and which has just joined its cgroup, would go with them. So the tests with such
/// a parent run alone, and the others together.
enum Turn {
    Together { _shared: RwLockReadGuard<'static, ()> },
    Alone { _exclusive: RwLockWriteGuard<'static, ()> },
}

static TURNS: RwLock<()> = RwLock::new(());

impl CgroupParent {
    fn new() -> CgroupParent {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let name = format!(
            "wharf-test-node-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        let turn = Turn::Together { _shared: TURNS.read().unwrap_or_else(PoisonError::into_inner) };
        CgroupParent { name, under_own: false, _turn: turn }
    }

    /// The parent an agent with `data_dir` has by default: `wharf/<data dir>` below its own
    /// cgroup.
    fn default_for(data_dir: &Path) -> CgroupParent {
        let name = format!("wharf/{}", wharf_node::resources::node_cgroup_name(data_dir));
        let turn =
            Turn::Alone { _exclusive: TURNS.write().unwrap_or_else(PoisonError::into_inner) };
        CgroupParent { name, under_own: true, _turn: turn }
    }

    /// The agent config lines that put its tasks' cgroups here.
    fn config(&self) -> String {
        format!("[cgroups]\nparent = \"/{}\"\npids_limit = 256\n", self.name)
    }

    /// The directory of the parent in the hierarchy that holds `controller` (v2: the one).
    fn dir(&self, controller: &str) -> PathBuf {
        match hierarchy() {
            "v1" => Path::new("/sys/fs/cgroup").join(controller).join(&self.name),
            _ => Path::new("/sys/fs/cgroup").join(&self.name),
        }
    }

    /// The directory of the task cgroup `name` that holds `controller`'s files (v2: below
    /// `share`, as these tasks reserve no cores).
    fn task_dir(&self, controller: &str, name: &str) -> PathBuf {
        match hierarchy() {
            "v1" => self.dir(controller).join(name),
            _ => self.dir(controller).join("share").join(name),
        }
    }

    /// The task cgroups under the parent (from the memory hierarchy).
    fn tasks(&self) -> Vec<String> {
        let dir = match hierarchy() {
            "v1" => self.dir("memory"),
            _ => self.dir("memory").join("share"),
        };
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
            .filter_map(|e| e.file_name().into_string().ok())
            .collect();
        names.sort();
        names
    }
}

/// The cgroup hierarchy this host runs, as the node names it: `v1` where the memory
/// controller is mounted as a v1 hierarchy, else `v2`.
fn hierarchy() -> &'static str {
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let v1 = mounts.lines().any(|l| {
        l.split_once(" - cgroup ")
            .is_some_and(|(_, options)| options.split([' ', ',']).any(|o| o == "memory"))
    });
    if v1 { "v1" } else { "v2" }
}

impl Drop for CgroupParent {
    fn drop(&mut self) {
        let parent = if self.under_own {
            wharf_isolate::CgroupParent::UnderOwn(self.name.clone())
        } else {
            wharf_isolate::CgroupParent::Absolute(self.name.clone())
        };
        let options = wharf_isolate::CgroupOptions {
            parent,
            pids_max: None,
            reserved_cores: wharf_isolate::CpuSet::new(),
            cpu: wharf_isolate::cgroup::NodeCpu { mhz_per_core: 1000 },
            sweep_siblings: false,
        };
        let cleaned = wharf_isolate::Cgroups::open(options)
            .map_err(|e| e.to_string())
            .and_then(|cgroups| wharf_exec::destroy_cgroups(&cgroups).map_err(|e| e.to_string()));
        if let Err(error) = cleaned {
            assert!(std::thread::panicking(), "cannot clean up cgroup {}: {error}", self.name);
        }
    }
}

fn task(name: &str, script: &str, extra: &str) -> String {
    format!("{}{extra}", sh_task(name, script))
}

async fn node_status(client: &Client) -> NodeStatus {
    client.json(Method::GET, ApiPath::v1(["node"]), None).await.unwrap()
}

/// The case: a job asking for more memory than the node has free is refused with 409
/// and a message naming the shortfall, and nothing of it is kept, even across a restart.
#[tokio::test]
async fn an_allocation_too_large_for_the_node_is_refused_and_nothing_is_kept() {
    let cgroups = CgroupParent::new();
    let dir = tempfile::tempdir().unwrap();
    let config = format!(
        "{}[resources]\nmemory_total_mb = 2048\n[resources.reserved]\nmemory = 1024\n",
        cgroups.config()
    );
    let agent = AgentProcess::start(dir.path(), &config);
    let client = agent.client();
    let node = node_status(&client).await;
    assert_eq!((node.memory_mb, node.reserved.memory_mb, node.free.memory_mb), (2048, 1024, 1024));

    let big = job("big", "batch", &task("t", "exit 0", "resources = { memory = 4096 }\n"));
    match submit(&client, &big).await {
        Err(ClientError::Api { status, message }) => {
            assert_eq!(status.as_u16(), 409, "{message}");
            assert!(message.contains("needs 4096 MB memory, 1024 MB free"), "{message}");
        }
        other => panic!("{other:?}"),
    }
    // The CLI says so and exits 2, as for any request the agent rejects.
    let spec = dir.path().join("big.toml");
    std::fs::write(&spec, &big).unwrap();
    let out = agent.cli(&["run", "--detach", spec.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("needs 4096 MB memory, 1024 MB free"),
        "{out:?}"
    );

    // What fits is accepted, and holds its share until it is done.
    let fits =
        job("fits", "service", &task("t", "exec sleep 600", "resources = { memory = 1000 }\n"));
    let id = submit(&client, &fits).await.unwrap();
    let node = node_status(&client).await;
    assert_eq!((node.allocated.memory_mb, node.free.memory_mb, node.allocations), (1000, 24, 1));
    let more =
        job("more", "service", &task("t", "exec sleep 600", "resources = { memory = 100 }\n"));
    match submit(&client, &more).await {
        Err(ClientError::Api { status, message }) => {
            assert_eq!(status.as_u16(), 409);
            assert!(message.contains("needs 100 MB memory, 24 MB free"), "{message}");
        }
        other => panic!("{other:?}"),
    }
    client.call(Method::POST, ApiPath::v1(["allocations", &id, "stop"]), None).await.unwrap();
    until(&client, &id, "stopped", |d| d.done).await;
    assert_eq!(node_status(&client).await.allocated.memory_mb, 0);

    // Nothing of the refused ones was written: a restarted agent knows only the one that ran.
    let (data_dir, config) = agent.kill9();
    assert!(
        !data_dir
            .join("allocs")
            .read_dir()
            .unwrap()
            .flatten()
            .any(|e| { e.file_name().to_string_lossy() != id })
    );
    let agent = AgentProcess::launch(data_dir, config);
    let allocs: Vec<AllocSummary> =
        agent.client().json(Method::GET, ApiPath::v1(["allocations"]), None).await.unwrap();
    assert_eq!(allocs.iter().map(|a| a.id.as_str()).collect::<Vec<_>>(), [id.as_str()]);
}

/// `GET /v1/node` and `wharf node status`: totals, the reservation, cgroups, drivers, and the
/// one line a fleet's prober reads (`--probe`).
#[tokio::test]
async fn the_node_reports_its_resources_cgroups_and_drivers() {
    let cgroups = CgroupParent::new();
    let dir = tempfile::tempdir().unwrap();
    let config = format!(
        "{}[resources]\ncpu_total_compute = 4000\n[resources.reserved]\ncpu = 500\n",
        cgroups.config()
    );
    let agent = AgentProcess::start(dir.path(), &config);
    let node = node_status(&agent.client()).await;
    assert_eq!(node.cpu.total_mhz, 4000);
    assert_eq!(node.reserved.cpu_mhz, 500);
    assert_eq!(node.free.cpu_mhz, 3500);
    assert!(node.memory_mb > 0 && node.cpu.cores >= 1, "{node:?}");
    assert!(node.cgroups.enabled, "{:?}", node.cgroups);
    assert_eq!(node.cgroups.version.as_deref(), Some(hierarchy()));
    assert!(node.cgroups.parents.iter().all(|p| p.ends_with(&cgroups.name)), "{:?}", node.cgroups);
    let raw_exec = &node.drivers["raw_exec"];
    assert_eq!(raw_exec.health, wharf_driver::Health::Healthy, "{raw_exec:?}");

    let out = agent.cli(&["node", "status"]);
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    let cgroups_line = format!("Cgroups    = {} under", hierarchy());
    for line in
        ["= 4000 MHz", "Reserved   = 500 MHz CPU", cgroups_line.as_str(), "raw_exec     healthy"]
    {
        assert!(text.contains(line), "{line:?} missing from:\n{text}");
    }
    let out = agent.cli(&["--json", "node", "status"]);
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["free"]["cpu_mhz"], 3500);
    // The line a fleet's prober reads: what the node can give work, which it parses.
    let out = agent.cli(&["node", "status", "--probe"]);
    assert!(out.status.success(), "{out:?}");
    let line = String::from_utf8_lossy(&out.stdout);
    let has = wharf_prober::Resources::parse(&line).unwrap();
    assert_eq!(
        (has.cpu_mhz, has.memory_mb, has.cores),
        (3500, node.free.memory_mb, node.free.cores)
    );
    assert!(line.contains(" free_cpu_mhz=3500 "), "{line}");
}

/// A task's usage comes from its cgroup, in the API, `wharf alloc status` and the metrics.
#[tokio::test]
async fn task_stats_come_from_the_cgroup() {
    let cgroups = CgroupParent::new();
    let dir = tempfile::tempdir().unwrap();
    let agent = AgentProcess::start(dir.path(), &cgroups.config());
    let client = agent.client();
    // 8 MiB held, then waiting; its pid file says it got there.
    let script =
        "x=$(head -c 8388608 /dev/zero | tr '\\0' a); echo $$ > \"$WHARF_TASK_DIR/pid\"; sleep 600";
    let id = submit(&client, &job("stats", "service", &task("t", script, ""))).await.unwrap();
    read_pid(&dir.path().join(format!("data/allocs/{id}/t/pid")));
    // The stats are a running task's: the task can write its pid file before its runner has
    // recorded the start.
    until(&client, &id, "running", |d| d.state.task_states["t"].status == TaskStatus::Running)
        .await;

    // The kernel folds its per-CPU memory counters into `memory.stat` every two seconds or
    // so: the resident memory shows within that.
    let stats = tokio::time::timeout(LIMIT, async {
        loop {
            let path = ApiPath::v1(["allocations", &id, "stats"]);
            let stats: AllocStats = client.json(Method::GET, path, None).await.unwrap();
            if stats.tasks["t"].memory.rss_bytes > 0 {
                return stats;
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("the task's resident memory never showed");
    let usage = &stats.tasks["t"];
    assert_eq!(usage.source, wharf_driver::UsageSource::Cgroup);
    assert!(usage.memory.max_usage_bytes >= 8 << 20, "{usage:?}");
    assert!(usage.cpu.total_seconds > 0.0 && usage.processes >= 1, "{usage:?}");
    assert!(usage.cpu.user_seconds + usage.cpu.system_seconds <= usage.cpu.total_seconds + 0.05);
    assert_eq!(stats.total.memory.max_usage_bytes, usage.memory.max_usage_bytes);

    let out = agent.cli(&["alloc", "status", &id]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("Resources:"), "{text}");
    for column in ["USER s", "SYS s", "THROTTLED", "RSS MiB", "CACHE MiB", "SWAP MiB", "MAX MiB"] {
        assert!(text.contains(column), "no {column} in:\n{text}");
    }

    let metrics = String::from_utf8(
        client.call(Method::GET, ApiPath::v1(["metrics"]), None).await.unwrap().to_vec(),
    )
    .unwrap();
    let labels = format!("alloc_id=\"{id}\",task=\"t\"");
    for series in [
        format!("wharf_task_memory_bytes{{{labels},kind=\"rss\"}}"),
        format!("wharf_task_memory_bytes{{{labels},kind=\"cache\"}}"),
        format!("wharf_task_memory_bytes{{{labels},kind=\"swap\"}}"),
        format!("wharf_task_memory_bytes{{{labels},kind=\"max_usage\"}}"),
        format!("wharf_task_cpu_seconds_total{{{labels},mode=\"user\"}}"),
        format!("wharf_task_cpu_seconds_total{{{labels},mode=\"system\"}}"),
        format!("wharf_task_cpu_throttled_periods_total{{{labels}}}"),
        format!("wharf_task_cpu_throttled_seconds_total{{{labels}}}"),
    ] {
        assert!(metrics.lines().any(|l| l.starts_with(&series)), "no {series} in:\n{metrics}");
    }
    assert!(metrics.contains("wharf_node_memory_bytes{state=\"free\"}"), "{metrics}");

    client.call(Method::POST, ApiPath::v1(["allocations", &id, "stop"]), None).await.unwrap();
    until(&client, &id, "stopped", |d| d.done).await;
}

/// Through the agent: a task's `resources` are in its cgroup's files (the memory limit, the
/// CPU weight, the node's pids limit), and a stop whose signal the task ignores kills, at the
/// task's `kill_timeout`, whatever its cgroup holds, a process that left its session and
/// process group included; then the cgroup is gone.
#[tokio::test]
async fn a_tasks_limits_are_in_its_cgroup_and_a_stop_kills_all_it_holds() {
    let cgroups = CgroupParent::new();
    let dir = tempfile::tempdir().unwrap();
    let agent = AgentProcess::start(dir.path(), &cgroups.config());
    let client = agent.client();
    let script = "trap '' TERM; \
                  setsid sh -c 'echo $$ > \"$WHARF_TASK_DIR/escaped\"; exec sleep 600' & \
                  echo $$ > \"$WHARF_TASK_DIR/pid\"; wait";
    let extra = "resources = { cpu = 700, memory = 48 }\n\
                 kill_signal = \"SIGTERM\"\nkill_timeout = \"1s\"\n";
    let id = submit(&client, &job("held", "service", &task("t", script, extra))).await.unwrap();
    let task_dir = dir.path().join(format!("data/allocs/{id}/t"));
    let (main, escaped) = (read_pid(&task_dir.join("pid")), read_pid(&task_dir.join("escaped")));
    until(&client, &id, "running", |d| d.state.task_states["t"].status == TaskStatus::Running)
        .await;
    let names = cgroups.tasks();
    assert_eq!(names.len(), 1, "{names:?}");
    let file = |controller: &str, name: &str| {
        let path = cgroups.task_dir(controller, &names[0]).join(name);
        std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
            .trim()
            .to_owned()
    };
    match hierarchy() {
        "v1" => {
            assert_eq!(file("memory", "memory.limit_in_bytes"), (48u64 << 20).to_string());
            assert_eq!(file("cpu", "cpu.shares"), "700");
        }
        _ => {
            assert_eq!(file("memory", "memory.max"), (48u64 << 20).to_string());
            // 700 shares on runc's scale.
            assert_eq!(file("cpu", "cpu.weight"), "27");
        }
    }
    assert_eq!(file("pids", "pids.max"), "256");
    let procs = file("pids", "cgroup.procs");
    for pid in [main, escaped] {
        assert!(procs.lines().any(|l| l == pid.to_string()), "{pid} not in {procs}");
    }

    client.call(Method::POST, ApiPath::v1(["allocations", &id, "stop"]), None).await.unwrap();
    let detail = until(&client, &id, "stopped", |d| d.done).await;
    let ended = detail.state.task_states["t"].events.iter().find_map(|e| match &e.kind {
        TaskEventKind::Terminated { signal, .. } => Some(*signal),
        _ => None,
    });
    assert_eq!(ended, Some(Some(libc::SIGKILL)), "{:?}", detail.state.task_states["t"].events);
    eventually("the escaped process is gone", || !alive(escaped));
    eventually("the task's cgroup is removed", || cgroups.tasks().is_empty());
}

/// The case: a task that allocates past its `memory` is OOM-killed, and both its state
/// and its events say so.
#[tokio::test]
async fn an_oom_killed_task_says_so_in_its_state_and_events() {
    let cgroups = CgroupParent::new();
    let dir = tempfile::tempdir().unwrap();
    let agent = AgentProcess::start(dir.path(), &cgroups.config());
    let client = agent.client();
    let hungry =
        task("t", "tail /dev/zero", "resources = { memory = 32 }\nrestart = { attempts = 0 }\n");
    let id = submit(&client, &job("hungry", "batch", &hungry)).await.unwrap();
    let detail = until(&client, &id, "dead", |d| d.done).await;
    assert_eq!(detail.state.client_status, ClientStatus::Failed);
    let state = &detail.state.task_states["t"];
    assert_eq!(state.status, TaskStatus::Dead);
    assert!(state.failed);
    let oom = state.events.iter().find_map(|e| match &e.kind {
        kind @ TaskEventKind::Terminated { oom_killed: true, .. } => Some(kind.clone()),
        _ => None,
    });
    let oom = oom.unwrap_or_else(|| panic!("no OOM kill in {:?}", state.events));
    assert_eq!(oom.title(), "OOM Killed");
    assert!(oom.to_string().contains("OOM Killed: true"), "{oom}");
    let out = agent.cli(&["alloc", "status", &id]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("OOM Killed"), "{out:?}");
    // The run is over: its cgroup is gone.
    assert_eq!(cgroups.tasks(), Vec::<String>::new());
}

/// The case: after the agent is killed with SIGKILL and started again, the tasks keep
/// their cgroups (the same ones, adopted, not swept), and once they are destroyed no cgroup is
/// left.
#[tokio::test]
async fn task_cgroups_survive_an_agent_sigkill_and_none_is_left_after_destroy() {
    let cgroups = CgroupParent::new();
    let dir = tempfile::tempdir().unwrap();
    let agent = AgentProcess::start(dir.path(), &cgroups.config());
    let client = agent.client();
    let script = "echo $$ > \"$WHARF_TASK_DIR/pid\"; sleep 600 & wait";
    let id = submit(&client, &job("keep", "service", &task("t", script, ""))).await.unwrap();
    // Running is published once the run's handle is durable: before that, a restarted agent
    // would not know the run, and would sweep its cgroup with it as an orphan's.
    until(&client, &id, "running", |d| d.state.task_states["t"].status == TaskStatus::Running)
        .await;
    let pid = read_pid(&dir.path().join(format!("data/allocs/{id}/t/pid")));
    let names = cgroups.tasks();
    assert_eq!(names.len(), 1, "{names:?}");
    let procs = cgroups.task_dir("freezer", &names[0]).join("cgroup.procs");
    let members = || std::fs::read_to_string(&procs).unwrap_or_default();
    assert!(members().lines().any(|l| l == pid.to_string()), "{}", members());

    let (data_dir, config) = agent.kill9();
    assert!(alive(pid));
    assert_eq!(cgroups.tasks(), names, "the cgroup outlives the agent");
    let mut agent = AgentProcess::launch(data_dir, config);
    let client = agent.client();
    until(&client, &id, "reattached", |d| {
        d.state.task_states["t"].events.iter().any(|e| e.kind == TaskEventKind::Reattached)
    })
    .await;
    assert_eq!(cgroups.tasks(), names, "the same cgroup, adopted, not swept");
    assert!(members().lines().any(|l| l == pid.to_string()));
    let stats: AllocStats =
        client.json(Method::GET, ApiPath::v1(["allocations", &id, "stats"]), None).await.unwrap();
    assert_eq!(stats.tasks["t"].source, wharf_driver::UsageSource::Cgroup);

    client.call(Method::POST, ApiPath::v1(["allocations", &id, "stop"]), None).await.unwrap();
    until(&client, &id, "stopped", |d| d.done).await;
    eventually("the task's cgroup is removed", || cgroups.tasks().is_empty());
    assert!(!alive(pid));
    // A clean shutdown with nothing left running leaves no cgroup at all.
    assert!(agent.terminate().success());
    assert!(!cgroups.dir("memory").exists());
}

/// The node's default cgroup parent: `wharf/<data dir>` below the agent's own cgroup, in each
/// hierarchy (the agent inherits the test's, whose memory cgroup on this host is not the root).
/// A task's process is in its cgroup there, and an agent that leaves no task behind leaves no
/// parent. On v2 the agent's cgroup must hold no process to hand controllers down: the agent
/// (and whatever shares its cgroup, this test among them) moves to a leaf `agent` beside it.
#[tokio::test]
async fn by_default_task_cgroups_are_below_the_agents_own_cgroup() {
    let dir = tempfile::tempdir().unwrap();
    let parent = CgroupParent::default_for(&dir.path().join("data"));
    let (own, mount) = own_cgroup();
    let expected = format!("{}/{}", own.trim_end_matches('/'), parent.name);
    let memory_parent = mount.join(expected.trim_start_matches('/'));

    let mut agent = AgentProcess::start(dir.path(), "");
    let client = agent.client();
    let node = node_status(&client).await;
    assert!(node.cgroups.enabled, "{:?}", node.cgroups);
    assert!(
        node.cgroups.parents.contains(&memory_parent.display().to_string()),
        "{} is not among {:?}",
        memory_parent.display(),
        node.cgroups.parents
    );
    let script = "echo $$ > \"$WHARF_TASK_DIR/pid\"; exec sleep 600";
    let id = submit(&client, &job("own", "service", &task("t", script, ""))).await.unwrap();
    let pid = read_pid(&dir.path().join(format!("data/allocs/{id}/t/pid")));
    let membership = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
    let (line, task) = match hierarchy() {
        "v1" => (membership.lines().find(|l| l.contains(":memory:")).unwrap(), String::new()),
        _ => {
            let own_dir = mount.join(own.trim_start_matches('/'));
            let agent_pid = agent.child.id().to_string();
            let leaf = std::fs::read_to_string(own_dir.join("agent/cgroup.procs")).unwrap();
            assert!(leaf.lines().any(|l| l == agent_pid), "the agent is in the leaf: {leaf}");
            let left = std::fs::read_to_string(own_dir.join("cgroup.procs")).unwrap();
            assert_eq!(left.trim(), "", "the agent's cgroup holds no process");
            (membership.lines().next().unwrap(), "share/".to_owned())
        }
    };
    assert!(line.ends_with(&format!(":{expected}/{task}{id}.t.00000001")), "{line}");

    client.call(Method::POST, ApiPath::v1(["allocations", &id, "stop"]), None).await.unwrap();
    until(&client, &id, "stopped", |d| d.done).await;
    assert!(agent.terminate().success());
    assert!(!memory_parent.exists(), "{} is left", memory_parent.display());
}

/// The agent's own cgroup, in the memory hierarchy on v1, and where that hierarchy is mounted.
/// On v2, an agent that moved to its cgroup's leaf took this process with it: the cgroup above
/// the leaf is the one the agents' parents are below.
fn own_cgroup() -> (String, &'static Path) {
    let membership = std::fs::read_to_string("/proc/self/cgroup").unwrap();
    match hierarchy() {
        "v1" => {
            let own = membership
                .lines()
                .find_map(|l| l.split_once(":memory:").map(|(_, path)| path.to_owned()))
                .expect("a memory hierarchy");
            (own, Path::new("/sys/fs/cgroup/memory"))
        }
        _ => {
            let own = membership
                .lines()
                .find_map(|l| l.strip_prefix("0::").map(str::to_owned))
                .expect("a v2 line");
            let own = own.strip_suffix("/agent").map(str::to_owned).unwrap_or(own);
            (own, Path::new("/sys/fs/cgroup"))
        }
    }
}

/// With the default parent, an agent killed with SIGKILL and started again (on v2, from the
/// leaf its first run moved it to) finds its parent where it was: it reattaches to the running
/// task in the same cgroup, sweeps nothing of it, and makes no parent of its own below the leaf.
#[tokio::test]
async fn by_default_a_restarted_agent_finds_its_tasks_cgroups_again() {
    let dir = tempfile::tempdir().unwrap();
    let parent = CgroupParent::default_for(&dir.path().join("data"));
    let (own, mount) = own_cgroup();
    let parent_dir = mount.join(own.trim_matches('/')).join(&parent.name);
    let agent = AgentProcess::start(dir.path(), "");
    let client = agent.client();
    let script = "echo $$ > \"$WHARF_TASK_DIR/pid\"; exec sleep 600";
    let id = submit(&client, &job("again", "service", &task("t", script, ""))).await.unwrap();
    until(&client, &id, "running", |d| d.state.task_states["t"].status == TaskStatus::Running)
        .await;
    let pid = read_pid(&dir.path().join(format!("data/allocs/{id}/t/pid")));
    let membership = || std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
    let before = membership();
    assert!(before.contains(&parent.name), "{before}");

    let (data_dir, config) = agent.kill9();
    let mut agent = AgentProcess::launch(data_dir, config);
    let client = agent.client();
    until(&client, &id, "reattached", |d| {
        d.state.task_states["t"].events.iter().any(|e| e.kind == TaskEventKind::Reattached)
    })
    .await;
    let node = node_status(&client).await;
    assert!(
        node.cgroups.parents.contains(&parent_dir.display().to_string()),
        "{} is not among {:?}",
        parent_dir.display(),
        node.cgroups.parents
    );
    assert_eq!(membership(), before, "the task is where it was, not swept");
    assert!(alive(pid));
    let stats: AllocStats =
        client.json(Method::GET, ApiPath::v1(["allocations", &id, "stats"]), None).await.unwrap();
    assert_eq!(stats.tasks["t"].source, wharf_driver::UsageSource::Cgroup);

    client.call(Method::POST, ApiPath::v1(["allocations", &id, "stop"]), None).await.unwrap();
    until(&client, &id, "stopped", |d| d.done).await;
    assert!(!alive(pid));
    assert!(agent.terminate().success());
    assert!(!parent_dir.exists(), "{} is left", parent_dir.display());
}

/// Where cgroups cannot be written (here: an agent that is not root), raw_exec runs tasks as
/// plain processes, as before cgroups, and says so once in the log, with the reason, however
/// many tasks start. Their usage comes from `/proc`, `GET /v1/node` says why there are no
/// cgroups, and a task that needs one (`cpu_hard_limit`) fails, naming the field.
#[tokio::test]
async fn without_writable_cgroups_raw_exec_runs_plain_processes_and_says_so_once() {
    const NOBODY: u32 = 65534;
    let dir = tempfile::tempdir().unwrap();
    std::os::unix::fs::chown(dir.path(), Some(NOBODY), Some(NOBODY)).unwrap();
    let logs = tempfile::tempdir().unwrap();
    let log = logs.path().join("agent.log");
    let mut agent = AgentProcess::start_as(dir.path(), "", NOBODY, &log);
    let client = agent.client();
    let node = node_status(&client).await;
    assert!(!node.cgroups.enabled, "{:?}", node.cgroups);
    let reason = node.cgroups.reason.clone().unwrap_or_default();
    assert!(reason.contains("Permission denied"), "{reason}");
    assert_eq!(node.drivers["raw_exec"].health, wharf_driver::Health::Healthy);

    let quick = submit(&client, &job("quick", "batch", &task("t", "exit 0", ""))).await.unwrap();
    let detail = until(&client, &quick, "done", |d| d.done).await;
    assert_eq!(detail.state.client_status, ClientStatus::Complete);
    let script = "echo $$ > \"$WHARF_TASK_DIR/pid\"; exec sleep 600";
    let long = submit(&client, &job("long", "service", &task("t", script, ""))).await.unwrap();
    let pid = read_pid(&dir.path().join(format!("data/allocs/{long}/t/pid")));
    until(&client, &long, "running", |d| d.state.task_states["t"].status == TaskStatus::Running)
        .await;
    let membership = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
    assert!(!membership.contains("wharf"), "{membership}");
    let stats: AllocStats =
        client.json(Method::GET, ApiPath::v1(["allocations", &long, "stats"]), None).await.unwrap();
    assert_eq!(stats.tasks["t"].source, wharf_driver::UsageSource::Proc);
    assert!(stats.tasks["t"].processes >= 1, "{stats:?}");

    let capped = "[[group.task]]\nname = \"t\"\ndriver = \"raw_exec\"\n\
                  restart = { attempts = 0 }\n\
                  config = { command = \"/bin/true\", cpu_hard_limit = true }\n";
    let capped = submit(&client, &job("capped", "batch", capped)).await.unwrap();
    let detail = until(&client, &capped, "failed", |d| d.done).await;
    assert_eq!(detail.state.client_status, ClientStatus::Failed);
    let events: Vec<String> =
        detail.state.task_states["t"].events.iter().map(|e| e.kind.to_string()).collect();
    assert!(
        events.iter().any(|e| e.contains("config.cpu_hard_limit") && e.contains("needs a cgroup")),
        "{events:?}"
    );

    client.call(Method::POST, ApiPath::v1(["allocations", &long, "stop"]), None).await.unwrap();
    until(&client, &long, "stopped", |d| d.done).await;
    assert!(agent.terminate().success());
    eventually("the agent's last line is logged", || {
        std::fs::read_to_string(&log).unwrap_or_default().contains("agent shut down")
    });
    let text = std::fs::read_to_string(&log).unwrap();
    let said: Vec<&str> =
        text.lines().filter(|l| l.contains("runs tasks without cgroups")).collect();
    assert_eq!(said.len(), 1, "{text}");
    assert!(said[0].contains("Permission denied"), "{}", said[0]);
}
