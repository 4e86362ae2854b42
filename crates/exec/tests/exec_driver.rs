//! The isolated `exec` driver with real processes, real cgroups and real time: what a task can
//! and cannot reach, the user it runs as, its namespaces and limits, and what survives an agent
//! restart. The cases follow exec2's own tests: `TestFunctional_cases` in `plugin/driver_test.go`
//! (users, `/etc/passwd` with and without unveiled paths, writes to the task, alloc and secrets
//! directories, programs that cannot be run, `id`, the PID namespace, `TMPDIR`) and its
//! `Test_doFingerprint_*` (here: the fingerprint without cgroups).
//!
//! Ordering never relies on sleeping: a task tells the test it reached a point by writing to a
//! FIFO, and every wait is bounded.

mod common;

use common::*;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::time::Duration;
use tokio::time::timeout;
use wharf_driver::{Driver, DriverError, ExitResult, FsIsolation, Health, TaskConfig, TaskHandle};
use wharf_exec::{ExecDriver, TaskCgroups};
use wharf_isolate::landlock::Unveil;
use wharf_state::Signal;
use wharf_state::spec::Resources;

async fn wait(driver: &ExecDriver, handle: &TaskHandle) -> ExitResult {
    timeout(LIMIT, driver.wait_task(handle.id())).await.expect("the task never exited").unwrap()
}

/// Runs `script` under `sh` to its end; returns how it ended and its stdout and stderr.
async fn run(driver: &ExecDriver, config: TaskConfig) -> (ExitResult, String, String) {
    let handle = driver.start_task(config).await.unwrap();
    let exit = wait(driver, &handle).await;
    let read = |stream: &str| {
        let file = format!("{}.{stream}.0", handle.config.task_name);
        std::fs::read_to_string(handle.config.logs.dir.join(file)).unwrap_or_default()
    };
    // The shim has exited: the output is all in the files.
    let (stdout, stderr) = (read("stdout"), read("stderr"));
    driver.destroy_task(handle.id(), false).await.unwrap();
    (exit, stdout, stderr)
}

fn user_of(handle: &TaskHandle) -> u32 {
    handle.driver_state.value()["user"].as_u64().unwrap() as u32
}

fn unveiled(mut config: TaskConfig, entries: &[&str]) -> TaskConfig {
    config.driver_config.insert("unveil".into(), serde_json::json!(entries));
    config
}

/// exec2's "dynamic user" and "id dynamic": a uid of the range, no other group, no account;
/// `HOME` and `TMPDIR` in the task's directory ("use TMPDIR").
#[tokio::test]
async fn a_task_runs_as_a_workload_user_of_the_range() {
    let scratch = CgroupScratch::new(Some(64));
    let root = searchable_tempdir();
    let options = exec_options(root.path(), 1);
    let range = options.users;
    let driver = scratch.exec_driver(options);
    let script = "id; echo home=$HOME; mktemp";
    let config = shell(root.path(), "who", script);
    let task_dir = config.task_dir.clone();
    // As the task runner lays it out.
    for dir in ["local", "secrets"] {
        std::fs::create_dir(task_dir.join(dir)).unwrap();
    }
    let handle = driver.start_task(config).await.unwrap();
    let user = user_of(&handle);
    assert!(range.contains(user), "{user} is not in {range:?}");
    let info = driver.inspect_task(handle.id()).await.unwrap();
    assert_eq!(info.attributes["user"], user.to_string());
    assert_eq!(wait(&driver, &handle).await, ExitResult::code(0));
    let stdout = std::fs::read_to_string(task_dir.join("logs/who.stdout.0")).unwrap();
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines[0], format!("uid={user} gid={user} groups={user}"));
    assert_eq!(lines[1], format!("home={}", task_dir.display()));
    assert!(
        lines[2].starts_with(&format!("{}/tmp.", task_dir.join("local").display())),
        "{stdout}"
    );
    // Its directory is its own and private to it; the driver's are root's.
    let meta = std::fs::metadata(&task_dir).unwrap();
    assert_eq!((meta.uid(), meta.gid(), meta.mode() & 0o777), (user, user, 0o700));
    for own in ["local", "secrets"] {
        assert_eq!(std::fs::metadata(task_dir.join(own)).unwrap().uid(), user, "{own}");
    }
    assert_eq!(std::fs::metadata(task_dir.join("logs")).unwrap().uid(), 0);
    // The driver's run records are beside the task directory, out of its reach.
    let runs = root.path().join(".exec/who");
    assert_eq!(std::fs::metadata(&runs).unwrap().uid(), 0);
    assert!(std::fs::read_dir(&runs).unwrap().count() == 1, "one run");
    driver.destroy_task(handle.id(), false).await.unwrap();
    assert!(std::fs::read_dir(&runs).unwrap().count() == 0, "its records go with it");
}

/// The canary test of the issue, with exec2's "write to task/alloc/secrets directory" cases: a
/// task writes its own directories and reads what is unveiled to it, and nothing else: not
/// another task's directory, not the agent's data directory, not `/tmp`, not `/etc/passwd`.
#[tokio::test]
async fn a_task_reaches_its_own_directories_and_unveiled_paths_only() {
    let scratch = CgroupScratch::new(Some(64));
    let root = searchable_tempdir();
    let driver = scratch.exec_driver(exec_options(root.path(), 2));
    // Canaries, each readable by any user, so only Landlock stands in the way.
    let sibling = task_dir(root.path(), "sibling");
    let canaries = [
        sibling.join("canary"),
        root.path().join("state.canary"),
        std::env::temp_dir().join(format!("wharf-canary-{}", std::process::id())),
    ];
    for canary in &canaries {
        std::fs::write(canary, "secret").unwrap();
    }
    let unveiled_file = root.path().join("shared/readme");
    std::fs::create_dir_all(unveiled_file.parent().unwrap()).unwrap();
    std::fs::write(&unveiled_file, "for every task").unwrap();

    let mut script = String::from("set -u\n");
    for canary in &canaries {
        script += &format!("cat {} && echo LEAK\n", canary.display());
    }
    script += "cat /etc/passwd && echo LEAK\n";
    script += "ls / >/dev/null && echo LEAK\n";
    script += &format!("cat {}; echo\n", unveiled_file.display());
    script += "echo mine > $WHARF_TASK_DIR/note && cat $WHARF_TASK_DIR/note\n";
    script += "echo shared > $WHARF_ALLOC_DIR/data/note && cat $WHARF_ALLOC_DIR/data/note\n";
    script += "echo hush > $WHARF_SECRETS_DIR/key && cat $WHARF_SECRETS_DIR/key\n";
    script += "echo sneak > $WHARF_TASK_DIR/logs/fake.stdout.0 || echo logs-refused\n";
    script += "mv $WHARF_TASK_DIR/logs $WHARF_TASK_DIR/moved || echo move-refused\n";
    let mut config = unveiled(
        shell(root.path(), "canary", &script),
        &[&format!("r:{}", unveiled_file.display())],
    );
    let alloc = config.alloc_dir.clone();
    std::fs::create_dir_all(alloc.join("data")).unwrap();
    config.env.insert("WHARF_TASK_DIR".into(), config.task_dir.display().to_string());
    config.env.insert("WHARF_ALLOC_DIR".into(), alloc.display().to_string());
    let secrets = config.task_dir.join("secrets");
    std::fs::create_dir_all(&secrets).unwrap();
    config.env.insert("WHARF_SECRETS_DIR".into(), secrets.display().to_string());

    let (exit, stdout, stderr) = run(&driver, config).await;
    assert_eq!(exit, ExitResult::code(0), "{stderr}");
    assert!(!stdout.contains("LEAK"), "{stdout}");
    assert_eq!(stdout, "for every task\nmine\nshared\nhush\nlogs-refused\nmove-refused\n");
    assert_eq!(stderr.matches("Permission denied").count(), 7, "{stderr}");
    for canary in &canaries[2..] {
        std::fs::remove_file(canary).unwrap();
    }
}

/// exec2's `/etc/passwd` cases: denied with the defaults, readable once the node or the task
/// unveils it, and a task's own paths refused where the node does not allow them.
#[tokio::test]
async fn etc_passwd_is_out_of_reach_until_the_node_or_the_task_unveils_it() {
    let scratch = CgroupScratch::new(Some(64));
    let root = searchable_tempdir();
    let read = |name: &str| shell(root.path(), name, "cat /etc/passwd");

    let driver = scratch.exec_driver(exec_options(root.path(), 3));
    let (exit, _, stderr) = run(&driver, read("defaults")).await;
    assert_eq!(exit, ExitResult::code(1));
    assert!(stderr.contains("cat: /etc/passwd: Permission denied"), "{stderr}");
    let (exit, stdout, _) = run(&driver, unveiled(read("by-task"), &["r:/etc/passwd"])).await;
    assert_eq!(exit, ExitResult::code(0));
    assert!(stdout.starts_with("root:x:0:0:"), "{stdout}");

    let mut node = exec_options(root.path(), 4);
    node.users_file = root.path().join("node-users");
    node.unveil_paths = vec![Unveil::parse("r:/etc/passwd").unwrap()];
    node.unveil_by_task = false;
    let driver = scratch.exec_driver(node);
    let (exit, stdout, _) = run(&driver, read("by-node")).await;
    assert_eq!(exit, ExitResult::code(0));
    assert!(stdout.starts_with("root:x:0:0:"), "{stdout}");
    match driver.start_task(unveiled(read("refused"), &["r:/etc/hosts"])).await {
        Err(DriverError::InvalidConfig { field, reason }) => {
            assert_eq!(field, "config.unveil");
            assert!(reason.contains("unveil_by_task = false"), "{reason}");
        }
        other => panic!("{other:?}"),
    }
}

/// exec2's "execute non-existent program", "execute non-executable file" (unveiled with x, but
/// not executable) and "run 'env' without default paths": each refused at the start, naming
/// `config.command`.
#[tokio::test]
async fn programs_out_of_reach_are_refused_naming_the_command() {
    let scratch = CgroupScratch::new(Some(64));
    let root = searchable_tempdir();
    let tools = root.path().join("tools");
    std::fs::create_dir(&tools).unwrap();
    std::fs::copy("/usr/bin/true", tools.join("true")).unwrap();
    let driver = scratch.exec_driver(exec_options(root.path(), 5));
    let command = |name: &str, command: &str| {
        config(root.path(), name, serde_json::json!({ "command": command }))
    };
    let mut bare = exec_options(root.path(), 6);
    bare.users_file = root.path().join("bare-users");
    bare.unveil_defaults = false;
    let bare = scratch.exec_driver(bare);
    let not_executable = unveiled(command("noexec", "/etc/os-release"), &["rx:/etc"]);
    for (driver, config, reason) in [
        (&driver, command("missing", "/usr/bin/doesnotexist"), "does not exist"),
        (&driver, not_executable, "is not executable"),
        (&driver, command("hidden", &tools.join("true").display().to_string()), "unveiled with x"),
        (&bare, command("bare", "/usr/bin/env"), "unveiled with x"),
    ] {
        match driver.start_task(config).await {
            Err(DriverError::InvalidConfig { field, reason: r }) => {
                assert_eq!(field, "config.command");
                assert!(r.contains(reason), "{r}");
            }
            other => panic!("{other:?}"),
        }
    }
    // Unveiled with x, the same program runs.
    let allowed = unveiled(
        command("allowed", &tools.join("true").display().to_string()),
        &[&format!("rx:{}", tools.display())],
    );
    assert_eq!(run(&driver, allowed).await.0, ExitResult::code(0));
}

/// exec2's "cwd is task dir", "work_dir overrides cwd to alloc dir", "work_dir relative path
/// resolved" and "work_dir outside sandbox rejected without unveil_by_task": a task starts in
/// its directory, or in a `work_dir` it may reach (its own directories, the allocation's, an
/// unveiled path); one outside, such as `/tmp` or another task's directory, is refused at the
/// start, naming `config.work_dir`.
#[tokio::test]
async fn a_task_works_in_its_directory_or_a_work_dir_within_its_reach() {
    let scratch = CgroupScratch::new(Some(64));
    let root = searchable_tempdir();
    let driver = scratch.exec_driver(exec_options(root.path(), 14));
    let alloc = root.path().join("alloc");
    let scratch_dir = root.path().join("scratch");
    for dir in [&alloc, &scratch_dir] {
        std::fs::create_dir_all(dir).unwrap();
    }
    // Landlock allows the task in; the directory's mode must too.
    std::fs::set_permissions(&scratch_dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    task_dir(root.path(), "sibling");
    let in_dir = |name: &str, work_dir: Option<&str>| {
        let mut config = shell(root.path(), name, "pwd -P; touch here");
        std::fs::create_dir_all(config.task_dir.join("local")).unwrap();
        if let Some(dir) = work_dir {
            config.driver_config.insert("work_dir".into(), dir.into());
        }
        config
    };

    let default = in_dir("default", None);
    let own = default.task_dir.clone();
    let local = in_dir("relative", Some("local"));
    let local_dir = local.task_dir.join("local");
    let unveiled_dir = unveiled(
        in_dir("unveiled", Some(scratch_dir.to_str().unwrap())),
        &[&format!("rwc:{}", scratch_dir.display())],
    );
    for (config, expected) in [
        (default, own),
        (in_dir("alloc", Some("../alloc")), alloc.clone()),
        (local, local_dir),
        (unveiled_dir, scratch_dir.clone()),
    ] {
        let (exit, stdout, stderr) = run(&driver, config).await;
        assert_eq!(exit, ExitResult::code(0), "{stderr}");
        assert_eq!(stdout, format!("{}\n", expected.display()));
        assert!(expected.join("here").exists(), "{stdout}");
    }

    for (name, work_dir) in [("tmp", "/tmp"), ("nosy", "../sibling"), ("above", "..")] {
        match driver.start_task(in_dir(name, Some(work_dir))).await {
            Err(DriverError::InvalidConfig { field, reason }) => {
                assert_eq!(field, "config.work_dir");
                assert!(reason.contains("outside what the task may reach"), "{reason}");
            }
            other => panic!("{work_dir}: {other:?}"),
        }
    }
}

/// exec2's `TestFunctional_TaskStats_RSS`: a running task's usage comes from its cgroup, with
/// its resident memory, its CPU time and its processes.
#[tokio::test]
async fn a_running_tasks_stats_come_from_its_cgroup() {
    let scratch = CgroupScratch::new(Some(64));
    let root = searchable_tempdir();
    let driver = scratch.exec_driver(exec_options(root.path(), 15));
    let alloc = root.path().join("alloc");
    std::fs::create_dir_all(&alloc).unwrap();
    let fifo = alloc.join("up");
    mkfifo_for_anyone(&fifo);
    // The shell is there and has run once it has written to the FIFO; it then waits.
    let script = format!("echo up > {}; sleep 60", fifo.display());
    let handle = driver.start_task(shell(root.path(), "idle", &script)).await.unwrap();
    assert_eq!(read_fifo(&fifo).trim(), "up");
    // The kernel folds its per-CPU memory counters into `memory.stat` every two seconds or
    // so: the resident memory shows within that (as exec2's test, which takes the stats after
    // an interval).
    let usage = timeout(LIMIT, async {
        loop {
            let usage = driver.task_stats(handle.id()).await.unwrap();
            if usage.memory_rss_bytes > 0 {
                return usage;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("the task's resident memory never showed");
    assert_eq!(usage.source, wharf_driver::UsageSource::Cgroup);
    assert!(usage.memory_max_usage_bytes >= usage.memory_rss_bytes, "{usage:?}");
    assert!(usage.cpu_time > Duration::ZERO && usage.processes >= 1, "{usage:?}");
    driver.stop_task(handle.id(), Duration::from_secs(5), Signal::Kill).await.unwrap();
    driver.destroy_task(handle.id(), false).await.unwrap();
}

/// exec2's "/proc" cases: `/proc` is out of reach by default; a task that unveils a part of
/// it (`/proc/cpuinfo`, its own `/proc/self/mountinfo`, all of `/proc`) reads that part of a
/// `/proc` of its own, which shows it runs with `no_new_privs`.
#[tokio::test]
async fn a_task_reads_the_parts_of_proc_it_unveils() {
    let scratch = CgroupScratch::new(Some(64));
    let root = searchable_tempdir();
    let driver = scratch.exec_driver(exec_options(root.path(), 16));
    let (exit, _, stderr) =
        run(&driver, shell(root.path(), "veiled", "head -1 /proc/cpuinfo")).await;
    assert_eq!(exit, ExitResult::code(1));
    assert!(stderr.contains("Permission denied"), "{stderr}");

    let script = "head -1 /proc/cpuinfo | grep -c .; grep -c ' / / ' /proc/self/mountinfo";
    for (name, entries) in
        [("parts", &["r:/proc/cpuinfo", "r:/proc/self/mountinfo"][..]), ("whole", &["r:/proc"][..])]
    {
        let (exit, stdout, stderr) =
            run(&driver, unveiled(shell(root.path(), name, script), entries)).await;
        assert_eq!(exit, ExitResult::code(0), "{name}: {stderr}");
        assert_eq!(stdout, "1\n1\n", "{name}");
    }
    let status = unveiled(
        shell(root.path(), "status", "grep -E '^(NoNewPrivs|Uid)' /proc/self/status"),
        &["r:/proc"],
    );
    let (_, stdout, _) = run(&driver, status).await;
    assert!(stdout.contains("NoNewPrivs:\t1"), "{stdout}");
}

/// Both builds of the shim take the same containment steps (one code, in module
/// `shim::contain`): the driver's own static shim, the default, and the `wharf-shim` program.
/// The same task sees the same thing under either: a workload user, `no_new_privs`, its own
/// PID and IPC namespaces and `/proc`, Landlock's refusal outside what it may reach.
#[tokio::test]
async fn a_task_is_contained_alike_under_either_shim() {
    let scratch = CgroupScratch::new(Some(64));
    let root = searchable_tempdir();
    let script = "echo pid=$$; id -u; grep -E '^NoNewPrivs' /proc/self/status; \
                  readlink /proc/self/ns/ipc /proc/1/ns/ipc | uniq | wc -l; \
                  cat /etc/passwd >/dev/null 2>&1 || echo passwd refused";
    let mut seen = Vec::new();
    for (n, driver) in [
        (21, scratch.exec_driver(exec_options(root.path(), 21))),
        (22, scratch.exec_driver_with_std_shim(exec_options(root.path(), 22))),
    ] {
        let shim = driver.shim_path();
        assert_eq!(shim.starts_with("/proc/self/fd"), n == 21, "{}", shim.display());
        let config = unveiled(shell(root.path(), &format!("shim{n}"), script), &["r:/proc"]);
        let (exit, stdout, stderr) = run(&driver, config).await;
        assert_eq!(exit, ExitResult::code(0), "{stderr}");
        let mut lines = stdout.lines();
        assert_eq!(lines.next(), Some("pid=1"), "{stdout}");
        let uid: u32 = lines.next().unwrap().parse().unwrap();
        assert!(exec_options(root.path(), n).users.contains(uid), "{uid}");
        seen.push(lines.map(str::to_owned).collect::<Vec<_>>());
    }
    // pid 1 is the task itself here: its IPC namespace is the one it runs in.
    assert_eq!(seen[0], ["NoNewPrivs:\t1", "1", "passwd refused"]);
    assert_eq!(seen[0], seen[1]);
}

/// exec2's "pid namespace": the task is pid 1 of its own namespace, unless it asks for the
/// host's.
#[tokio::test]
async fn a_task_is_pid_1_of_its_own_namespace_unless_it_asks_for_the_hosts() {
    let scratch = CgroupScratch::new(Some(64));
    let root = searchable_tempdir();
    let driver = scratch.exec_driver(exec_options(root.path(), 7));
    let (_, stdout, _) = run(&driver, shell(root.path(), "private", "echo $$")).await;
    assert_eq!(stdout, "1\n");
    let mut host = shell(root.path(), "host", "echo $$");
    host.driver_config.insert("pid_mode".into(), "host".into());
    let (_, stdout, _) = run(&driver, host).await;
    assert_ne!(stdout, "1\n");
}

/// The signal test: a task cannot signal another task's processes, whether it can see
/// them (host PID namespace: another uid, another Landlock domain) or not (its own).
#[tokio::test]
async fn a_task_cannot_signal_another_tasks_processes() {
    let scratch = CgroupScratch::new(Some(64));
    let root = searchable_tempdir();
    let driver = scratch.exec_driver(exec_options(root.path(), 8));
    let victim = driver.start_task(shell(root.path(), "victim", "exec sleep 60")).await.unwrap();
    let pid = victim.driver_state.value()["task_pid"].as_i64().unwrap();
    for (pid_mode, refusal) in [("host", "Operation not permitted"), ("private", "No such process")]
    {
        let mut attacker =
            shell(root.path(), &format!("attacker-{pid_mode}"), &format!("kill -9 {pid}"));
        attacker.driver_config.insert("pid_mode".into(), pid_mode.into());
        let (exit, _, stderr) = run(&driver, attacker).await;
        assert_ne!(exit, ExitResult::code(0), "{pid_mode}: {stderr}");
        assert!(stderr.contains(refusal), "{pid_mode}: {stderr}");
    }
    assert!(alive(pid as i32), "the victim still runs");
    driver.stop_task(victim.id(), Duration::from_secs(5), Signal::Kill).await.unwrap();
    driver.destroy_task(victim.id(), false).await.unwrap();
}

/// A restarted agent keeps every live task's workload user: a new task gets another one, a
/// task that runs again gets its own back.
#[tokio::test]
async fn workload_users_survive_an_agent_restart() {
    let mut scratch = CgroupScratch::new(Some(64));
    let root = searchable_tempdir();
    let driver = scratch.exec_driver(exec_options(root.path(), 9));
    let long = driver.start_task(shell(root.path(), "long", "exec sleep 60")).await.unwrap();
    let first = user_of(&long);
    drop(driver);
    scratch.restart();

    let driver = scratch.exec_driver(exec_options(root.path(), 9));
    driver.recover_task(&long).await.unwrap();
    let other = driver.start_task(shell(root.path(), "other", "exit 0")).await.unwrap();
    assert_ne!(user_of(&other), first);
    assert_eq!(wait(&driver, &other).await, ExitResult::code(0));
    driver.destroy_task(other.id(), false).await.unwrap();

    driver.stop_task(long.id(), Duration::from_secs(5), Signal::Kill).await.unwrap();
    driver.destroy_task(long.id(), false).await.unwrap();
    // The same task's next run.
    let mut again = shell(root.path(), "long", "exit 0");
    again.id = wharf_driver::TaskId::new("a1", "long", 1);
    let handle = driver.start_task(again).await.unwrap();
    assert_eq!(user_of(&handle), first);
    assert_eq!(wait(&driver, &handle).await, ExitResult::code(0));
    driver.destroy_task(handle.id(), false).await.unwrap();
}

/// The cgroup limits hold under `exec` as under raw_exec: past its memory, the task is
/// OOM-killed and reported so.
#[tokio::test]
async fn an_exec_task_past_its_memory_limit_is_reported_oom_killed() {
    let scratch = CgroupScratch::new(Some(64));
    let root = searchable_tempdir();
    let driver = scratch.exec_driver(exec_options(root.path(), 10));
    let mut config = shell(root.path(), "hungry", "tail /dev/zero");
    config.resources = Resources { cpu: 100, memory: 16, memory_max: None, cores: 0 };
    let handle = driver.start_task(config).await.unwrap();
    let exit = wait(&driver, &handle).await;
    assert!(exit.oom_killed, "{exit:?}");
    driver.destroy_task(handle.id(), false).await.unwrap();
}

#[tokio::test]
async fn the_fingerprint_and_the_starts_need_cgroups() {
    let scratch = CgroupScratch::new(Some(64));
    let root = searchable_tempdir();
    let driver = scratch.exec_driver(exec_options(root.path(), 11));
    assert_eq!(driver.name(), "exec");
    let capabilities = driver.capabilities();
    assert_eq!((capabilities.exec, capabilities.fs_isolation), (false, FsIsolation::Unveil));
    let fingerprint = driver.fingerprint().await;
    assert_eq!(fingerprint.health, Health::Healthy, "{}", fingerprint.description);
    assert!(fingerprint.attributes.contains_key("driver.exec.landlock_abi"));
    assert_eq!(fingerprint.attributes["driver.exec.unveil.tasks"], "true");

    let raw = wharf_exec::RawExecOptions { shim_path: Some(SHIM.into()), ..Default::default() };
    let off = TaskCgroups::Off { reason: "cgroups are read-only here".into() };
    let without = ExecDriver::new(raw, exec_options(root.path(), 11)).with_cgroups(off);
    let fingerprint = without.fingerprint().await;
    assert_eq!(fingerprint.health, Health::Unhealthy);
    assert!(fingerprint.description.contains("cgroups are read-only here"), "{fingerprint:?}");
    let error = without.start_task(shell(root.path(), "nocg", "true")).await.unwrap_err();
    assert!(error.to_string().contains("exec needs a cgroup for every task"), "{error}");
}

#[tokio::test]
async fn exec_inside_a_task_is_not_offered_and_configs_are_checked() {
    let scratch = CgroupScratch::new(Some(64));
    let root = searchable_tempdir();
    let driver = scratch.exec_driver(exec_options(root.path(), 12));
    let handle = driver.start_task(shell(root.path(), "idle", "exec sleep 60")).await.unwrap();
    match driver.exec_task(handle.id(), &["true".into()], Duration::from_secs(5)).await {
        Err(DriverError::Unsupported { driver, operation }) => {
            assert_eq!((driver.as_str(), operation), ("exec", "exec"));
        }
        other => panic!("{other:?}"),
    }
    driver.stop_task(handle.id(), Duration::from_secs(5), Signal::Kill).await.unwrap();
    driver.destroy_task(handle.id(), false).await.unwrap();

    let check = |value: serde_json::Value| driver.validate_config(value.as_object().unwrap());
    assert_eq!(check(serde_json::json!({"command": "env", "unveil": ["r:/etc"]})), Ok(()));
    for (value, field) in [
        (serde_json::json!({"command": "env", "unveil": ["/etc"]}), "config.unveil[0]"),
        (serde_json::json!({"command": "env", "ipc_mode": "shared"}), "config.ipc_mode"),
    ] {
        match check(value) {
            Err(DriverError::InvalidConfig { field: f, .. }) => assert_eq!(f, field),
            other => panic!("{other:?}"),
        }
    }
}

/// No `unveil` entry reaches the node's data directory, the shim the driver runs as root (for
/// writing), or the host's `/proc/1`: a task's entries are refused when its job is checked and
/// again at its start, a node's `unveil_paths` entry makes the driver unhealthy and fails each
/// start; every error names the path and why.
#[tokio::test]
async fn unveil_entries_that_reach_the_node_are_refused_when_checked_and_at_start() {
    let scratch = CgroupScratch::new(Some(64));
    let root = searchable_tempdir();
    let data_dir = root.path().join("data");
    std::fs::create_dir(&data_dir).unwrap();
    let mut options = exec_options(root.path(), 17);
    options.data_dir = Some(data_dir.clone());
    // The shim program is the one a node runs as root that a task could find on disk.
    let driver = scratch.exec_driver_with_std_shim(options.clone());
    let check = |unveil: &str, pid_mode: &str| {
        let config = serde_json::json!({"command": "env", "unveil": ["r:/etc", unveil], "pid_mode": pid_mode});
        driver.validate_config(config.as_object().unwrap())
    };
    let data = format!("rwc:{}", data_dir.join("allocs").display());
    let shim = format!("rw:{SHIM}");
    for (unveil, pid_mode, reason) in [
        (data.as_str(), "private", "overlaps the node's data directory"),
        (&shim, "private", "overlaps a program the node runs as root"),
        ("r:/proc", "host", "overlaps the host's init (/proc/1)"),
    ] {
        match check(unveil, pid_mode) {
            Err(DriverError::InvalidConfig { field, reason: r }) => {
                assert_eq!(field, "config.unveil[1]", "{unveil}");
                let path = unveil.split_once(':').unwrap().1;
                assert!(r.starts_with(&format!("{path} {reason}")), "{unveil}: {r}");
            }
            other => panic!("{unveil}: {other:?}"),
        }
    }
    assert_eq!(check("r:/proc", "private"), Ok(()), "a /proc of the task's own");
    assert_eq!(check(&format!("rx:{SHIM}"), "private"), Ok(()));

    let task = unveiled(shell(root.path(), "reach", "true"), &[&data]);
    match driver.start_task(task).await {
        Err(DriverError::InvalidConfig { field, reason }) => {
            assert_eq!(field, "config.unveil[0]");
            assert!(reason.contains("the node's data directory"), "{reason}");
        }
        other => panic!("{other:?}"),
    }

    options.unveil_paths = vec![Unveil::parse(&format!("r:{}", root.path().display())).unwrap()];
    let node = scratch.exec_driver_with_std_shim(options);
    let fingerprint = node.fingerprint().await;
    assert_eq!(fingerprint.health, Health::Unhealthy, "{fingerprint:?}");
    assert!(fingerprint.description.contains("the node's data directory"), "{fingerprint:?}");
    let error = node.start_task(shell(root.path(), "node", "true")).await.unwrap_err();
    let error = error.to_string();
    assert!(error.contains("drivers.exec.unveil_paths[0]"), "{error}");
    assert!(error.contains("overlaps the node's data directory"), "{error}");
}

/// As pid 1 of its namespace a task would drop a SIGTERM it has no handler for, and a stop
/// would wait out the whole kill timeout; the driver ends it as the signal would end any other
/// process. A task that traps the signal still gets it.
#[tokio::test]
async fn a_stop_ends_a_pid_1_task_as_it_would_any_other_process() {
    let scratch = CgroupScratch::new(Some(64));
    let root = searchable_tempdir();
    let driver = scratch.exec_driver(exec_options(root.path(), 13));
    let kill_timeout = Duration::from_secs(600);

    let plain = driver.start_task(shell(root.path(), "plain", "exec sleep 600")).await.unwrap();
    let stopped = timeout(LIMIT, driver.stop_task(plain.id(), kill_timeout, Signal::Term)).await;
    stopped.expect("the stop waited for the kill timeout").unwrap();
    assert_eq!(wait(&driver, &plain).await, ExitResult::signalled(libc::SIGKILL));
    driver.destroy_task(plain.id(), false).await.unwrap();

    let alloc = root.path().join("alloc");
    std::fs::create_dir_all(&alloc).unwrap();
    let fifo = alloc.join("trapped");
    mkfifo_for_anyone(&fifo);
    let script = format!(
        "trap 'echo bye; exit 7' TERM; echo ready > {}; while :; do sleep 0.1; done",
        fifo.display()
    );
    let trapping = driver.start_task(shell(root.path(), "trapping", &script)).await.unwrap();
    assert_eq!(read_fifo(&fifo).trim(), "ready");
    let stopped = timeout(LIMIT, driver.stop_task(trapping.id(), kill_timeout, Signal::Term)).await;
    stopped.expect("the trapped TERM never ended it").unwrap();
    assert_eq!(wait(&driver, &trapping).await, ExitResult::code(7));
    driver.destroy_task(trapping.id(), false).await.unwrap();
}

/// Host volumes: a task reaches the node directories it mounts, and only as it mounts them (a
/// read-only mount is readable and not writable), while a directory beside them it does not
/// mount stays out of reach. The directories are open to every user, so only Landlock stands
/// in the way.
#[tokio::test]
async fn a_task_reaches_its_host_volumes_as_mounted_and_nothing_beside_them() {
    let scratch = CgroupScratch::new(Some(64));
    let root = searchable_tempdir();
    let driver = scratch.exec_driver(exec_options(root.path(), 1));
    let volumes = root.path().join("host-volumes");
    for name in ["data", "certs", "other"] {
        std::fs::create_dir_all(volumes.join(name)).unwrap();
        std::fs::set_permissions(volumes.join(name), std::fs::Permissions::from_mode(0o777))
            .unwrap();
        std::fs::write(volumes.join(name).join("file"), name).unwrap();
    }
    let mut script = String::from("set -u\n");
    script += "cat $DATA/file; echo; echo written > $DATA/new && cat $DATA/new\n";
    script += "cat $CERTS/file; echo; echo x > $CERTS/new || echo ro-refused\n";
    script += "cat $OTHER/file && echo LEAK; true\n";
    let mut config = shell(root.path(), "mounter", &script);
    for (name, read_only) in [("data", false), ("certs", true)] {
        config.mounts.push(wharf_driver::Mount {
            volume: name.into(),
            source: volumes.join(name),
            destination: format!("volumes/{name}"),
            read_only,
        });
    }
    for name in ["data", "certs", "other"] {
        config.env.insert(name.to_uppercase(), volumes.join(name).display().to_string());
    }
    let (exit, stdout, stderr) = run(&driver, config).await;
    assert_eq!(exit, ExitResult::code(0), "{stderr}");
    assert_eq!(stdout, "data\nwritten\ncerts\nro-refused\n", "{stderr}");
    assert_eq!(stderr.matches("Permission denied").count(), 2, "{stderr}");
}

/// Host volumes are bound at their destinations in the task's own mount namespace: a relative
/// destination in the task directory (made for it), an absolute one over a directory of the
/// node, which the node itself still sees as it was. A read-only volume is read-only there
/// too, although the task may write everything else in its directory.
#[tokio::test]
async fn a_task_sees_its_host_volumes_at_their_destinations_read_only_as_asked() {
    let scratch = CgroupScratch::new(Some(64));
    let root = searchable_tempdir();
    let driver = scratch.exec_driver(exec_options(root.path(), 18));
    let volumes = root.path().join("host-volumes");
    for name in ["data", "certs"] {
        std::fs::create_dir_all(volumes.join(name)).unwrap();
        std::fs::set_permissions(volumes.join(name), std::fs::Permissions::from_mode(0o777))
            .unwrap();
        std::fs::write(volumes.join(name).join("file"), name).unwrap();
    }
    // An absolute destination: a directory of the node with a file of its own.
    let covered = root.path().join("covered");
    std::fs::create_dir(&covered).unwrap();
    std::fs::write(covered.join("underneath"), "node").unwrap();

    let mut script = String::from("set -u\n");
    script += "cat $HOME/local/data/file; echo\n";
    script += "echo written > $HOME/local/data/new && cat $HOME/local/data/new\n";
    script += "cat $COVERED/file; echo\n";
    script += "ls $COVERED\n";
    script += "echo x > $COVERED/new || echo ro-refused\n";
    let mut config = shell(root.path(), "binder", &script);
    for (name, destination, read_only) in
        [("data", "local/data".to_owned(), false), ("certs", covered.display().to_string(), true)]
    {
        config.mounts.push(wharf_driver::Mount {
            volume: name.into(),
            source: volumes.join(name),
            destination,
            read_only,
        });
    }
    config.env.insert("COVERED".into(), covered.display().to_string());
    let task_dir = config.task_dir.clone();
    let (exit, stdout, stderr) = run(&driver, config).await;
    assert_eq!(exit, ExitResult::code(0), "{stderr}");
    assert_eq!(stdout, "data\nwritten\ncerts\nfile\nro-refused\n", "{stderr}");
    assert!(stderr.contains("Read-only file system"), "{stderr}");
    assert_eq!(std::fs::read_to_string(volumes.join("data/new")).unwrap(), "written\n");
    let node_sees: Vec<_> =
        std::fs::read_dir(&covered).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(node_sees, ["underneath"], "the bind was the task's alone");
    assert!(task_dir.join("local/data").is_dir(), "the relative destination was made");
    assert!(!task_dir.join("local/data/file").exists(), "and is bare outside the task");
}

/// A destination the driver cannot bind is refused at start, naming the volume: an absolute
/// one the node does not have, and a relative one leaving the task directory.
#[tokio::test]
async fn a_host_volume_destination_that_cannot_be_bound_is_refused_naming_it() {
    let scratch = CgroupScratch::new(Some(64));
    let root = searchable_tempdir();
    let driver = scratch.exec_driver(exec_options(root.path(), 19));
    let volume = root.path().join("vol");
    std::fs::create_dir(&volume).unwrap();
    let missing = root.path().join("no-such-dir").display().to_string();
    for (destination, reason) in
        [(missing.as_str(), "No such file"), ("../escape", "must stay in the task directory")]
    {
        let mut config = shell(root.path(), "unbound", "true");
        config.mounts.push(wharf_driver::Mount {
            volume: "data".into(),
            source: volume.clone(),
            destination: destination.into(),
            read_only: false,
        });
        let error = driver.start_task(config).await.unwrap_err().to_string();
        assert!(error.contains("volume_mount \"data\": destination"), "{error}");
        assert!(error.contains(reason), "{error}");
    }
    assert!(!root.path().join("escape").exists());
}

/// What the agent wrote in the task directory before the start (a template rendered with
/// `perms = "600"`, in a directory it made) is the workload user's to read; a file that has
/// another link elsewhere is not handed over, nor is `logs/`.
#[tokio::test]
async fn files_the_agent_made_for_the_task_are_its_workload_users() {
    let scratch = CgroupScratch::new(Some(64));
    let root = searchable_tempdir();
    let driver = scratch.exec_driver(exec_options(root.path(), 20));
    let script =
        "cat local/conf/app.conf; echo; cat top.conf; echo; cat local/linked || echo refused";
    let config = shell(root.path(), "owner", script);
    let dir = config.task_dir.clone();
    std::fs::create_dir_all(dir.join("local/conf")).unwrap();
    for (file, text) in [("local/conf/app.conf", "private"), ("top.conf", "top")] {
        std::fs::write(dir.join(file), text).unwrap();
        std::fs::set_permissions(dir.join(file), std::fs::Permissions::from_mode(0o600)).unwrap();
    }
    let elsewhere = root.path().join("elsewhere");
    std::fs::write(&elsewhere, "the node's").unwrap();
    std::fs::set_permissions(&elsewhere, std::fs::Permissions::from_mode(0o600)).unwrap();
    std::fs::hard_link(&elsewhere, dir.join("local/linked")).unwrap();
    let (exit, stdout, stderr) = run(&driver, config).await;
    assert_eq!(exit, ExitResult::code(0), "{stderr}");
    assert_eq!(stdout, "private\ntop\nrefused\n", "{stderr}");
    assert_eq!(std::fs::metadata(&elsewhere).unwrap().uid(), 0, "the linked file stays root's");
    assert_eq!(std::fs::metadata(dir.join("logs")).unwrap().uid(), 0);
}
