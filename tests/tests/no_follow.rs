//! Root never follows a link a task controls. In each test a task (the `link-swapper` program,
//! a real process) swaps a directory it can write for a symbolic link to a canary directory
//! outside its reach, back and forth as fast as it can, while the node starts a task again
//! and again and works in that directory as root each time. Whatever the timing, the canary's
//! mode, owner and contents never change.
//!
//! One test per place where root works in a directory a task can write: the `exec` driver's
//! modes on the allocation directory's entries, the task runner's `secrets/`, and the shim's
//! log files.

// Real processes on the real clock, and the racing task started by the test itself.
#![allow(clippy::disallowed_methods)]

use std::collections::BTreeMap;
use std::io::BufRead;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};
use wharf_driver::{Driver, ExitResult, LogConfig, TaskConfig, TaskId};

/// Every wait gives up after this long.
const LIMIT: Duration = Duration::from_secs(30);
/// Each test's starts stop after this long, however many are left.
const BUDGET: Duration = Duration::from_secs(60);
/// How long a loop of quick calls races the swapper.
const RACE_TIME: Duration = Duration::from_secs(3);

/// A directory no task may change, with a mode, an owner and a file of its own: what root
/// would change if it followed one of the links.
struct Canary {
    path: PathBuf,
    before: Look,
}

/// A directory's mode, owner and entries (each with its text).
type Look = (u32, u32, u32, Vec<(String, String)>);

impl Canary {
    fn new(root: &Path) -> Canary {
        let path = root.join("canary");
        std::fs::create_dir(&path).unwrap();
        std::fs::write(path.join("keep"), "the canary's own\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o750)).unwrap();
        std::os::unix::fs::chown(&path, Some(4242), Some(4243)).unwrap();
        let before = look(&path);
        assert_eq!((before.0, before.1, before.2), (0o750, 4242, 4243));
        Canary { path, before }
    }

    fn assert_untouched(&self, after: &str) {
        assert_eq!(look(&self.path), self.before, "the canary changed after {after}");
    }
}

fn look(dir: &Path) -> Look {
    let meta = std::fs::symlink_metadata(dir).unwrap();
    let mut entries: Vec<(String, String)> = std::fs::read_dir(dir)
        .unwrap()
        .map(|entry| {
            let entry = entry.unwrap();
            let text = std::fs::read_to_string(entry.path()).unwrap_or_default();
            (entry.file_name().to_string_lossy().into_owned(), text)
        })
        .collect();
    entries.sort();
    (meta.mode() & 0o7777, meta.uid(), meta.gid(), entries)
}

/// The racing task: `link-swapper`, swapping each of `dirs` with a link to `target`.
struct Swapper(Child);

impl Swapper {
    /// Starts it and waits (bounded) until it has swapped each directory once. With `mode`, it
    /// sets each directory's mode back to `mode` after each swap.
    fn start(dirs: &[PathBuf], target: &Path, mode: Option<u32>) -> Swapper {
        let mut command = Command::new(env!("CARGO_BIN_EXE_link-swapper"));
        command.arg(target).arg(mode.map_or("-".to_owned(), |mode| format!("{mode:o}")));
        command.args(dirs);
        let mut child = command.stdout(Stdio::piped()).spawn().unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = std::io::BufReader::new(stdout).read_line(&mut line);
            let _ = tx.send(line);
        });
        let swapper = Swapper(child);
        let line = rx.recv_timeout(LIMIT).expect("link-swapper never started swapping");
        assert_eq!(line, "swapping\n", "link-swapper failed to start (its error is above)");
        swapper
    }

    /// Stops it, after checking that it raced the whole time.
    fn stop(mut self) {
        assert!(self.0.try_wait().unwrap().is_none(), "link-swapper stopped before the test did");
    }
}

impl Drop for Swapper {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `dir`, or its `.swap` name if the swapper left the link at `dir`: the real directory.
fn real_dir(dir: &Path) -> PathBuf {
    if std::fs::symlink_metadata(dir).unwrap().is_dir() {
        dir.to_owned()
    } else {
        PathBuf::from(format!("{}.swap", dir.display()))
    }
}

/// A temporary directory that workload users can pass through (mode 0755), as a node's data
/// directory must be.
fn searchable_tempdir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    dir
}

/// A node directory a thousand levels below a temporary one, each level searchable: every
/// lookup of a path in it walks those levels, which stretches the moment between a look at a
/// path and a change made through the same path, as a slow file system would. (Code that
/// follows a link there loses the race within a few starts.) Returns the temporary directory,
/// to be removed, and the node directory.
fn deep_node_dir() -> (tempfile::TempDir, PathBuf) {
    let top = searchable_tempdir();
    let node: PathBuf =
        std::iter::once(top.path().to_owned()).chain((0..1000).map(|_| "d".into())).collect();
    std::fs::create_dir_all(&node).unwrap();
    (top, node)
}

/// Task `name` of allocation `a1` under `root`, laid out as the task runner does, running
/// `command` with `args`.
fn task_config(root: &Path, name: &str, command: &str, args: &[&str]) -> TaskConfig {
    let alloc_root = root.join("a1");
    let task_dir = alloc_root.join(name);
    for dir in ["local", "secrets", "logs"] {
        std::fs::create_dir_all(task_dir.join(dir)).unwrap();
    }
    std::fs::create_dir_all(alloc_root.join("alloc")).unwrap();
    TaskConfig {
        id: TaskId::new("a1", name, 1),
        alloc_id: "a1".into(),
        job_id: "j".into(),
        group: "g".into(),
        task_name: name.into(),
        env: BTreeMap::from([("PATH".to_owned(), "/usr/bin:/bin".to_owned())]),
        alloc_dir: alloc_root.join("alloc"),
        logs: LogConfig { dir: task_dir.join("logs"), max_files: 2, max_file_bytes: 1 << 20 },
        task_dir,
        resources: Default::default(),
        driver_config: serde_json::json!({"command": command, "args": args})
            .as_object()
            .cloned()
            .unwrap(),
        mounts: Vec::new(),
    }
}

/// Starts `config` under `driver` `runs` times (or until [`BUDGET`] is spent), each run to its
/// end; returns how many ran.
async fn start_again_and_again(driver: &dyn Driver, config: &TaskConfig, runs: u64) -> u64 {
    let started = Instant::now();
    let mut done = 0;
    for run in 1..=runs {
        if started.elapsed() > BUDGET {
            break;
        }
        let config = TaskConfig { id: TaskId::new("a1", &config.task_name, run), ..config.clone() };
        let handle = driver.start_task(config).await.unwrap();
        let exit = tokio::time::timeout(LIMIT, driver.wait_task(handle.id()))
            .await
            .expect("the task never exited")
            .unwrap();
        assert_eq!(exit, ExitResult::code(0), "run {run}");
        driver.destroy_task(handle.id(), false).await.unwrap();
        done += 1;
    }
    done
}

/// wharf-exec builds its shim (the std build the `exec` driver starts) beside the test
/// binaries' target directory.
fn std_shim() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let shim = exe.parent().and_then(Path::parent).map(|dir| dir.join("wharf-shim")).unwrap();
    assert!(
        shim.is_file(),
        "{} is missing: build wharf-exec's binaries (`cargo build -p wharf-exec`, or `cargo test \
         --workspace`) so the exec driver's shim exists",
        shim.display()
    );
    shim
}

/// A cgroup manager under a parent of this test's own, emptied and removed when dropped.
struct ScratchCgroups(Arc<wharf_isolate::Cgroups>);

impl ScratchCgroups {
    fn new(name: &str) -> ScratchCgroups {
        let options = wharf_isolate::CgroupOptions {
            parent: wharf_isolate::CgroupParent::Absolute(format!(
                "wharf-test-{name}-{}",
                std::process::id()
            )),
            pids_max: Some(64),
            reserved_cores: wharf_isolate::CpuSet::new(),
            cpu: wharf_isolate::cgroup::NodeCpu { mhz_per_core: 2000 },
            sweep_siblings: false,
        };
        let cgroups = wharf_isolate::Cgroups::open(options).unwrap_or_else(|e| {
            panic!("this test needs writable cgroups (root on a host with cgroup v1 or v2): {e}")
        });
        ScratchCgroups(Arc::new(cgroups))
    }
}

impl Drop for ScratchCgroups {
    fn drop(&mut self) {
        if let Err(error) = wharf_exec::destroy_cgroups(&self.0) {
            assert!(std::thread::panicking(), "cannot clean up the test's cgroups: {error}");
        }
    }
}

/// Each start of an `exec` task opens the allocation directory and every directory in it to
/// the allocation's tasks (mode 1777). A sibling task swaps a directory of its own there for a
/// link to the canary, and sets the directory's mode back after each swap, so that every
/// start finds it to change.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sibling_swapping_its_alloc_dir_entry_for_a_link_never_gets_root_to_chmod_through_it() {
    let (_top, root) = deep_node_dir();
    let canary = Canary::new(&root);
    let cgroups = ScratchCgroups::new("no-follow-alloc");
    let mut options = wharf_exec::ExecOptions::new(root.join("workload-users"));
    options.users = wharf_isolate::users::UgidRange::new(1_900_300_000, 1_900_300_099).unwrap();
    let raw = wharf_exec::RawExecOptions {
        shim_path: Some(std_shim()),
        ..wharf_exec::RawExecOptions::default()
    };
    let driver = wharf_exec::ExecDriver::new(raw, options)
        .with_cgroups(wharf_exec::TaskCgroups::On(cgroups.0.clone()));
    let config = task_config(&root, "web", "/bin/true", &[]);
    let sibling_dirs: Vec<PathBuf> =
        (0..2).map(|n| config.alloc_dir.join(format!("sibling-{n}"))).collect();
    for dir in &sibling_dirs {
        std::fs::create_dir(dir).unwrap();
    }
    let swapper = Swapper::start(&sibling_dirs, &canary.path, Some(0o755));
    let runs = start_again_and_again(&driver, &config, 150).await;
    swapper.stop();
    canary.assert_untouched(&format!("{runs} starts"));
    assert_eq!(look(&config.alloc_dir).0, 0o1777);
}

/// The task runner makes `secrets/` private (mode 0700) before each start, even if it
/// existed. The task swaps it for a link to the canary.
#[test]
fn a_task_swapping_its_secrets_for_a_link_never_gets_root_to_chmod_through_it() {
    let root = searchable_tempdir();
    let canary = Canary::new(root.path());
    let dirs = wharf_task::TaskDirs::new(&root.path().join("a1"), "web");
    dirs.create_own().unwrap();
    let swapper =
        Swapper::start(std::slice::from_ref(&dirs.secrets_dir), &canary.path, Some(0o755));
    let started = Instant::now();
    let (mut made, mut refused) = (0, 0);
    // A build takes microseconds: 2,000 of them could all fall within one time slice in which
    // the swapper does not run. Time bounds the loop, so the swapper runs through it.
    while made + refused < 1_000_000 && started.elapsed() < RACE_TIME {
        match dirs.create_own() {
            Ok(()) => made += 1,
            Err(error) => {
                let text = error.to_string();
                assert!(text.contains("symbolic link"), "{text}");
                refused += 1;
            }
        }
    }
    swapper.stop();
    canary.assert_untouched(&format!("{made} builds and {refused} refusals"));
    assert!(made > 0, "the task's directories were never built ({refused} refusals)");
    assert!(refused > 0, "the link was never met in {made} builds: the swapper never ran?");
}

/// The shim creates the task's log files in `logs/` after each start. The task swaps `logs/`
/// for a link to the canary.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_swapping_its_logs_for_a_link_never_gets_the_shim_to_write_through_it() {
    let root = searchable_tempdir();
    let canary = Canary::new(root.path());
    let driver = wharf_exec::RawExecDriver::new(wharf_exec::RawExecOptions::default());
    let config = task_config(root.path(), "web", "/bin/echo", &["a line for the log"]);
    let swapper = Swapper::start(std::slice::from_ref(&config.logs.dir), &canary.path, None);
    let runs = start_again_and_again(&driver, &config, 100).await;
    swapper.stop();
    canary.assert_untouched(&format!("{runs} starts"));
    let logged = std::fs::read_to_string(real_dir(&config.logs.dir).join("web.stdout.0"))
        .unwrap_or_default();
    assert!(logged.lines().count() > 0, "no start wrote its log in {runs} starts");
}
