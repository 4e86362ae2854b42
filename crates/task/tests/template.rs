//! Task templates through the real task runner, on the mock driver and the in-memory store
//! under tokio's paused clock: the cases of Nomad's TestTaskTemplateManager_* that need
//! neither Consul nor Vault, with wharf's variables store in place of Consul's keys.

use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;
use wharf_driver::mock::MockDriver;
use wharf_state::{
    Allocation, DesiredStatus, Signal, TaskEventKind, TaskState, TaskStatus, Timestamp, spec,
};
use wharf_store::{MemoryStore, StateStore};
use wharf_task::template::{self, MemorySources};
use wharf_task::{TaskRunner, TaskRunnerConfig, TokioClock};

/// Long enough for anything a test waits for; a test that reaches it has hung.
const LIMIT: Duration = Duration::from_secs(24 * 3600);

/// The bound of a polled wait (virtual time, in steps of 100ms): the longest splay, wait and
/// file poll of these tests fit in it many times over.
const POLL_LIMIT: Duration = Duration::from_secs(600);

struct Harness {
    driver: MockDriver,
    store: MemoryStore,
    changed: Arc<Notify>,
    alloc: Allocation,
    dir: tempfile::TempDir,
    sources: Arc<MemorySources>,
}

impl Harness {
    /// An allocation of a service job with one mock task `t`; `task` is TOML that follows its
    /// `driver` line (its `[[group.task.template]]` tables).
    fn new(task: &str) -> Harness {
        let doc = format!(
            "[job]\nid = \"j\"\ntype = \"service\"\n[group]\nname = \"g\"\n[[group.task]]\nname = \"t\"\ndriver = \"mock\"\n{task}\n"
        );
        let job = spec::parse_toml(&doc).unwrap_or_else(|e| panic!("{e}\n{doc}"));
        let alloc = Allocation {
            id: "a1".into(),
            job,
            task_group: "g".into(),
            desired_status: DesiredStatus::Run,
            modify_index: 1,
            deployment_id: None,
            ports: Vec::new(),
        };
        Harness {
            driver: MockDriver::new(),
            store: MemoryStore::new(),
            changed: Arc::new(Notify::new()),
            alloc,
            dir: tempfile::tempdir().unwrap(),
            sources: MemorySources::new(),
        }
    }

    fn runner(&self) -> TaskRunner {
        let task = self.alloc.job.groups[0].tasks[0].clone();
        let config = TaskRunnerConfig::new(
            self.alloc.clone(),
            task,
            Arc::new(self.driver.clone()),
            Arc::new(self.store.clone()),
            self.dir.path().join("a1"),
        )
        .with_clock(Arc::new(TokioClock::starting_at(Timestamp(1_000_000))))
        .with_state_changed(self.changed.clone())
        .with_template_sources(self.sources.clone());
        TaskRunner::new(config)
    }

    /// Builds the runner, opens its gate and runs it in the background.
    fn start(&self) -> TaskRunner {
        self.run(self.runner())
    }

    /// A runner as an agent started again builds it: restored from the store, then run.
    async fn restored(&self) -> TaskRunner {
        self.store.put_allocation(&self.alloc).await.unwrap();
        let stored = self.store.load_alloc("a1").await.unwrap().unwrap();
        let runner = self.runner();
        runner.restore(stored.tasks.get("t")).await.unwrap();
        self.run(runner)
    }

    fn run(&self, runner: TaskRunner) -> TaskRunner {
        runner.set_start_gate(true);
        let background = runner.clone();
        tokio::spawn(async move { background.run().await });
        runner
    }

    fn task_dir(&self) -> PathBuf {
        self.dir.path().join("a1").join("t")
    }

    fn read(&self, file: &str) -> Option<String> {
        std::fs::read_to_string(self.task_dir().join(file)).ok()
    }

    async fn until(
        &self,
        runner: &TaskRunner,
        what: &str,
        done: impl Fn(&TaskState) -> bool,
    ) -> TaskState {
        let wait = async {
            loop {
                let state = runner.state();
                if done(&state) {
                    return state;
                }
                self.changed.notified().await;
            }
        };
        tokio::time::timeout(LIMIT, wait)
            .await
            .unwrap_or_else(|_| panic!("never {what}: {:#?}", runner.state()))
    }

    async fn running(&self, runner: &TaskRunner) {
        self.until(runner, "running", |s| s.status == TaskStatus::Running).await;
    }

    /// Waits (in virtual time, bounded) until `file` holds `want`.
    async fn until_file(&self, file: &str, want: &str) {
        let wait = async {
            while self.read(file).as_deref() != Some(want) {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        };
        tokio::time::timeout(LIMIT, wait).await.unwrap_or_else(|_| {
            panic!("{file} never held {want:?}; it holds {:?}", self.read(file))
        });
    }

    /// Waits (in virtual time, bounded) until `check` holds of the driver.
    async fn until_driver(&self, what: &str, check: impl Fn(&MockDriver) -> bool) {
        let wait = async {
            while !check(&self.driver) {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        };
        tokio::time::timeout(POLL_LIMIT, wait).await.unwrap_or_else(|_| panic!("never {what}"));
    }

    fn signals(&self) -> Vec<Signal> {
        self.driver.signals_sent().into_iter().map(|(_, s)| s).collect()
    }
}

fn template_events(state: &TaskState) -> Vec<String> {
    state
        .events
        .iter()
        .filter_map(|e| match &e.kind {
            TaskEventKind::Template { message } => Some(message.clone()),
            _ => None,
        })
        .collect()
}

fn has_event(state: &TaskState, title: &str) -> bool {
    state.events.iter().any(|e| e.kind.title() == title)
}

/// Settling time for a watcher that has nothing to do: long in virtual time, free in real.
async fn quiet_for(duration: Duration) {
    tokio::time::sleep(duration).await;
}

#[tokio::test(start_paused = true)]
async fn task_template_manager_unblock_static() {
    let h = Harness::new(
        "[[group.task.template]]\ndata = \"hello, world!\"\ndestination = \"my.tmpl\"\nchange_mode = \"noop\"",
    );
    let runner = h.start();
    h.running(&runner).await;
    assert_eq!(h.read("my.tmpl").as_deref(), Some("hello, world!"));
    assert_eq!(h.driver.start_count("a1", "t"), 1);
}

#[tokio::test(start_paused = true)]
async fn task_template_manager_unblock_variables() {
    let h = Harness::new(
        "[[group.task.template]]\ndata = '{{ with nomadVar \"app/db\" }}{{ .password }}{{ end }}'\n\
         destination = \"local/db.conf\"\nchange_mode = \"noop\"",
    );
    let runner = h.start();
    // The variable is missing: the first render blocks the start.
    quiet_for(Duration::from_secs(10)).await;
    assert_eq!(runner.state().status, TaskStatus::Pending);
    assert!(h.driver.started().is_empty());
    h.sources.put_variable("app/db", [("password", "s3cret")]);
    h.running(&runner).await;
    assert_eq!(h.read("local/db.conf").as_deref(), Some("s3cret"));
}

#[tokio::test(start_paused = true)]
async fn template_missing_data_fails_the_start_with_a_template_event_and_the_policy_applies() {
    let h = Harness::new(
        "[[group.task.template]]\ndata = '{{ key \"app/x/y\" }}'\ndestination = \"out\"\nchange_mode = \"noop\"",
    );
    let runner = h.start();
    let state = h.until(&runner, "restarting", |s| has_event(s, "Restarting")).await;
    let messages = template_events(&state);
    assert_eq!(messages, ["Missing: kv.block(app/x/y)"], "{state:#?}");
    assert!(h.driver.started().is_empty());
    // The restart renders again and starts once the data is there.
    h.sources.put_variable("app/x", [("y", "ok")]);
    h.running(&runner).await;
    assert_eq!(h.read("out").as_deref(), Some("ok"));
}

#[tokio::test(start_paused = true)]
async fn template_render_error_fails_the_start_with_a_template_event() {
    let h = Harness::new("[[group.task.template]]\ndata = '{{ nope }}'\ndestination = \"out\"");
    let runner = h.start();
    let state = h.until(&runner, "restarting", |s| has_event(s, "Restarting")).await;
    let messages = template_events(&state);
    assert!(messages.len() == 1 && messages[0].contains("nope"), "{state:#?}");
    assert!(h.driver.started().is_empty());
}

#[tokio::test(start_paused = true)]
async fn task_template_manager_rerender_noop() {
    let h = Harness::new(
        "[[group.task.template]]\ndata = '{{ key \"app/foo\" }}'\ndestination = \"my.tmpl\"\nchange_mode = \"noop\"",
    );
    h.sources.put_variable("app", [("foo", "bar")]);
    let runner = h.start();
    h.running(&runner).await;
    assert_eq!(h.read("my.tmpl").as_deref(), Some("bar"));
    h.sources.put_variable("app", [("foo", "baz")]);
    h.until_file("my.tmpl", "baz").await;
    quiet_for(Duration::from_secs(30)).await;
    assert!(h.signals().is_empty());
    assert_eq!(h.driver.start_count("a1", "t"), 1);
    assert_eq!(runner.state().restarts, 0);
}

#[tokio::test(start_paused = true)]
async fn task_template_manager_rerender_signal() {
    let h = Harness::new(
        "[[group.task.template]]\ndata = '{{ key \"app/foo\" }}'\ndestination = \"my.tmpl\"\n\
         change_mode = \"signal\"\nchange_signal = \"SIGALRM\"\nsplay = \"0s\"\n\
         [[group.task.template]]\ndata = '{{ key \"app/bam\" }}'\ndestination = \"my-second.tmpl\"\n\
         change_mode = \"signal\"\nchange_signal = \"SIGUSR1\"\nsplay = \"0s\"",
    );
    h.sources.put_variable("app", [("foo", "bar"), ("bam", "cat")]);
    let runner = h.start();
    h.running(&runner).await;
    assert!(h.signals().is_empty(), "no signal for the first render");
    h.sources.put_variable("app", [("foo", "baz"), ("bam", "dog")]);
    h.until_driver("sent two signals", |d| d.signals_sent().len() == 2).await;
    let mut signals = h.signals();
    signals.sort_by_key(|s| s.number());
    assert_eq!(signals, [Signal::Usr1, Signal::Alrm]);
    assert_eq!(h.read("my.tmpl").as_deref(), Some("baz"));
    assert_eq!(h.read("my-second.tmpl").as_deref(), Some("dog"));
    assert_eq!(h.driver.start_count("a1", "t"), 1);
}

#[tokio::test(start_paused = true)]
async fn task_template_manager_rerender_restart() {
    let h = Harness::new(
        "[[group.task.template]]\ndata = '{{ key \"app/bam\" }}'\ndestination = \"my.tmpl\"\nsplay = \"1s\"",
    );
    h.sources.put_variable("app", [("bam", "cat")]);
    let runner = h.start();
    h.running(&runner).await;
    h.sources.put_variable("app", [("bam", "dog")]);
    let state =
        h.until(&runner, "restarted", |s| s.restarts == 1 && s.status == TaskStatus::Running).await;
    assert!(has_event(&state, "Restart Signaled"), "{state:#?}");
    assert_eq!(h.driver.start_count("a1", "t"), 2);
    assert_eq!(h.read("my.tmpl").as_deref(), Some("dog"));
    assert!(
        h.signals().iter().all(|s| *s == wharf_state::spec::DEFAULT_KILL_SIGNAL),
        "only the kill signal"
    );
}

#[tokio::test(start_paused = true)]
async fn task_template_manager_rerender_script() {
    let h = Harness::new(
        "[[group.task.template]]\ndata = '{{ key \"app/bam\" }}'\ndestination = \"my.tmpl\"\n\
         change_mode = \"script\"\nsplay = \"0s\"\nchange_script = { command = \"/bin/reload\", args = [\"now\"] }",
    );
    h.sources.put_variable("app", [("bam", "cat")]);
    let runner = h.start();
    h.running(&runner).await;
    assert!(h.driver.execs().is_empty());
    h.sources.put_variable("app", [("bam", "dog")]);
    let state = h.until(&runner, "ran the script", |s| !template_events(s).is_empty()).await;
    assert_eq!(template_events(&state), ["Template ran script /bin/reload now"]);
    let execs: Vec<Vec<String>> = h.driver.execs().into_iter().map(|(_, c)| c).collect();
    assert_eq!(execs, [vec!["/bin/reload".to_owned(), "now".to_owned()]]);
    assert_eq!(h.driver.start_count("a1", "t"), 1);
}

#[tokio::test(start_paused = true)]
async fn task_template_manager_permissions() {
    let h = Harness::new(
        "[[group.task.template]]\ndata = \"hello, world!\"\ndestination = \"my.tmpl\"\nperms = \"777\"\nchange_mode = \"noop\"",
    );
    let runner = h.start();
    h.running(&runner).await;
    let mode = std::fs::metadata(h.task_dir().join("my.tmpl")).unwrap().permissions().mode();
    assert_eq!(mode & 0o7777, 0o777);
}

#[tokio::test(start_paused = true)]
async fn task_template_manager_env() {
    let h = Harness::new(
        "[[group.task.template]]\ndata = \"\"\"\n# Comment lines are ok\n\nFOO=bar\nfoo=123\nANYTHING_goes=Spaces are=ok!\n\"\"\"\n\
         destination = \"test.env\"\nchange_mode = \"noop\"\nenv = true",
    );
    let runner = h.start();
    h.running(&runner).await;
    let env = &h.driver.started()[0].env;
    assert_eq!(env["FOO"], "bar");
    assert_eq!(env["foo"], "123");
    assert_eq!(env["ANYTHING_goes"], "Spaces are=ok!");
}

#[test]
fn task_template_manager_env_missing() {
    let dir = tempfile::tempdir().unwrap();
    let dirs = wharf_task::TaskDirs::new(dir.path(), "t");
    std::fs::create_dir_all(&dirs.task_dir).unwrap();
    std::fs::write(dirs.task_dir.join("exists.env"), "FOO=bar\n").unwrap();
    let mut exists = wharf_state::Template::inline("FOO=bar\n", "exists.env");
    exists.env = true;
    let mut missing = wharf_state::Template::inline("WHAT=ever\n", "missing.env");
    missing.env = true;
    let env = Default::default();
    let loaded = template::load_env(std::slice::from_ref(&exists), &env, &dirs).unwrap();
    assert_eq!(loaded["FOO"], "bar");
    let error = template::load_env(&[exists, missing], &env, &dirs).unwrap_err();
    assert!(error.to_string().contains("missing.env"), "{error}");
}

#[tokio::test(start_paused = true)]
async fn task_template_manager_interpolate_destination() {
    let h = Harness::new(
        "env = { NAME = \"conf\" }\n[[group.task.template]]\ndata = \"hello, world!\"\n\
         destination = \"${WHARF_ALLOC_ID}-${NAME}.tmpl\"\nchange_mode = \"noop\"",
    );
    let runner = h.start();
    h.running(&runner).await;
    assert_eq!(h.read("a1-conf.tmpl").as_deref(), Some("hello, world!"));
}

#[tokio::test(start_paused = true)]
async fn task_template_manager_escapes() {
    // Inside: the secrets and shared directories through their variables.
    let h = Harness::new(
        "[[group.task.template]]\ndata = \"s\"\ndestination = \"${WHARF_SECRETS_DIR}/dst\"\nchange_mode = \"noop\"\n\
         [[group.task.template]]\ndata = \"a\"\ndestination = \"${WHARF_ALLOC_DIR}/shared\"\nchange_mode = \"noop\"",
    );
    let runner = h.start();
    h.running(&runner).await;
    assert_eq!(h.read("secrets/dst").as_deref(), Some("s"));
    let shared = h.dir.path().join("a1/alloc/shared");
    assert_eq!(std::fs::read_to_string(shared).unwrap(), "a");

    // Outside once interpolated: refused at start, nothing written above the task directory.
    let h = Harness::new(
        "env = { ESCAPE = \"../\" }\n[[group.task.template]]\ndata = \"x\"\n\
         destination = \"${ESCAPE}${ESCAPE}${ESCAPE}escaped\"\nchange_mode = \"noop\"",
    );
    let runner = h.start();
    let state = h.until(&runner, "refused", |s| !template_events(s).is_empty()).await;
    assert!(template_events(&state)[0].contains("escapes the task's directories"), "{state:#?}");
    assert!(h.driver.started().is_empty());
    assert!(!h.dir.path().join("escaped").exists());
}

#[tokio::test(start_paused = true)]
async fn task_template_manager_change_mode_mixed() {
    let h = Harness::new(
        "[[group.task.template]]\ndata = '{{ key \"app/restart\" }}'\ndestination = \"restart.tmpl\"\nsplay = \"0s\"\n\
         [[group.task.template]]\ndata = '{{ key \"app/signal\" }}'\ndestination = \"signal.tmpl\"\n\
         change_mode = \"signal\"\nchange_signal = \"SIGALRM\"\nsplay = \"0s\"\n\
         [[group.task.template]]\ndata = '{{ key \"app/script\" }}'\ndestination = \"script.tmpl\"\n\
         change_mode = \"script\"\nsplay = \"0s\"\nchange_script = { command = \"/bin/reload\" }",
    );
    h.sources.put_variable("app", [("restart", "1"), ("signal", "1"), ("script", "1")]);
    let runner = h.start();
    h.running(&runner).await;

    // Signal and script templates change: both act, nothing restarts.
    h.sources.put_variable("app", [("restart", "1"), ("signal", "2"), ("script", "2")]);
    h.until_driver("signalled and ran the script", |d| {
        !d.signals_sent().is_empty() && !d.execs().is_empty()
    })
    .await;
    assert_eq!(h.signals(), [Signal::Alrm]);
    assert_eq!(h.driver.start_count("a1", "t"), 1);

    // A restart template changes with the others: the restart wins, no signal or script.
    h.sources.put_variable("app", [("restart", "2"), ("signal", "3"), ("script", "3")]);
    h.until(&runner, "restarted", |s| s.restarts == 1 && s.status == TaskStatus::Running).await;
    assert_eq!(h.signals().iter().filter(|s| **s == Signal::Alrm).count(), 1);
    assert_eq!(h.driver.execs().len(), 1);
    assert_eq!(h.read("signal.tmpl").as_deref(), Some("3"));
}

#[tokio::test(start_paused = true)]
async fn template_waits_for_changes_to_settle() {
    let h = Harness::new(
        "[[group.task.template]]\ndata = '{{ key \"app/v\" }}'\ndestination = \"out\"\n\
         change_mode = \"noop\"\nwait = { min = \"5s\", max = \"20s\" }",
    );
    h.sources.put_variable("app", [("v", "1")]);
    let runner = h.start();
    h.running(&runner).await;
    let changed_at = tokio::time::Instant::now();
    h.sources.put_variable("app", [("v", "2")]);
    h.until_file("out", "2").await;
    let took = changed_at.elapsed();
    assert!(took >= Duration::from_secs(5) && took < Duration::from_secs(6), "{took:?}");
}

#[tokio::test(start_paused = true)]
async fn template_file_changes_are_seen_and_a_restart_re_renders() {
    let h = Harness::new(
        "[[group.task.template]]\ndata = '{{ file \"local/in.txt\" }}!'\ndestination = \"out\"\nchange_mode = \"noop\"",
    );
    std::fs::create_dir_all(h.task_dir().join("local")).unwrap();
    std::fs::write(h.task_dir().join("local/in.txt"), "one").unwrap();
    let runner = h.start();
    h.running(&runner).await;
    assert_eq!(h.read("out").as_deref(), Some("one!"));
    std::fs::write(h.task_dir().join("local/in.txt"), "two").unwrap();
    h.until_file("out", "two!").await;
    // A restart renders again before the start.
    std::fs::write(h.task_dir().join("out"), "stale").unwrap();
    runner.restart("test", false).await.unwrap();
    h.until(&runner, "restarted", |s| s.restarts == 1 && s.status == TaskStatus::Running).await;
    assert_eq!(h.read("out").as_deref(), Some("two!"));
}

#[tokio::test(start_paused = true)]
async fn task_template_manager_first_render_restored() {
    let h = Harness::new(
        "[[group.task.template]]\ndata = '{{ key \"secret/password\" }}'\ndestination = \"my.tmpl\"\nsplay = \"0s\"",
    );
    h.sources.put_variable("secret", [("password", "barbaz")]);
    let first = h.start();
    h.running(&first).await;
    assert_eq!(h.read("my.tmpl").as_deref(), Some("barbaz"));
    first.shutdown();
    first.wait_finished().await;

    // The agent comes back and nothing changed: the task is reattached and left alone.
    let second = h.restored().await;
    h.until(&second, "reattached", |s| has_event(s, "Reattached")).await;
    quiet_for(Duration::from_secs(30)).await;
    assert_eq!((h.driver.start_count("a1", "t"), second.state().restarts), (1, 0));
    second.shutdown();
    second.wait_finished().await;

    // The data changed while the agent was away: the template's change mode acts.
    h.sources.put_variable("secret", [("password", "bazbar")]);
    let third = h.restored().await;
    h.until(&third, "restarted", |s| s.restarts == 1 && s.status == TaskStatus::Running).await;
    assert_eq!(h.read("my.tmpl").as_deref(), Some("bazbar"));
    assert_eq!(h.driver.start_count("a1", "t"), 2);
}

#[tokio::test(start_paused = true)]
async fn task_template_manager_signal_error() {
    let h = Harness::new(
        "config = { signal_error = \"test error\" }\n[[group.task.template]]\n\
         data = '{{ key \"app/foo\" }}'\ndestination = \"my.tmpl\"\n\
         change_mode = \"signal\"\nchange_signal = \"SIGALRM\"\nsplay = \"0s\"",
    );
    h.sources.put_variable("app", [("foo", "bar")]);
    let runner = h.start();
    h.running(&runner).await;
    h.sources.put_variable("app", [("foo", "baz")]);
    let state = h.until(&runner, "killed", |s| s.status == TaskStatus::Dead).await;
    let messages = template_events(&state);
    assert!(
        messages.iter().any(|m| m.contains("failed to send signals") && m.contains("test error")),
        "{state:#?}"
    );
    assert!(state.failed, "a task its template could not signal is failed");
}

#[tokio::test(start_paused = true)]
async fn a_kill_ends_a_first_render_that_waits_for_data() {
    let h = Harness::new(
        "[[group.task.template]]\ndata = '{{ nomadVar \"never/there\" }}'\ndestination = \"out\"",
    );
    let runner = h.start();
    quiet_for(Duration::from_secs(5)).await;
    let asked = tokio::time::Instant::now();
    runner.kill(None).await;
    assert!(asked.elapsed() < Duration::from_secs(1), "the kill waited {:?}", asked.elapsed());
    assert_eq!(runner.state().status, TaskStatus::Dead);
    assert!(h.driver.started().is_empty());
}

#[test]
fn task_template_manager_env_multi() {
    let dir = tempfile::tempdir().unwrap();
    let dirs = wharf_task::TaskDirs::new(dir.path(), "t");
    std::fs::create_dir_all(&dirs.task_dir).unwrap();
    std::fs::write(dirs.task_dir.join("zzz.env"), "FOO=bar\nSHARED=nope\n").unwrap();
    std::fs::write(dirs.task_dir.join("aaa.env"), "BAR=foo\nSHARED=yup\n").unwrap();
    // Read in the order written, not by name: the later template wins.
    let templates: Vec<_> = ["zzz.env", "aaa.env"]
        .into_iter()
        .map(|file| {
            let mut template = wharf_state::Template::inline("", file);
            template.env = true;
            template
        })
        .collect();
    let env = template::load_env(&templates, &Default::default(), &dirs).unwrap();
    assert_eq!((env["FOO"].as_str(), env["BAR"].as_str()), ("bar", "foo"));
    assert_eq!(env["SHARED"], "yup");
}

#[tokio::test(start_paused = true)]
async fn task_template_manager_unblock_static_already_rendered() {
    use std::os::unix::fs::MetadataExt;
    let h = Harness::new(
        "[[group.task.template]]\ndata = \"hello, world!\"\ndestination = \"my.tmpl\"\nchange_mode = \"noop\"",
    );
    std::fs::create_dir_all(h.task_dir()).unwrap();
    std::fs::write(h.task_dir().join("my.tmpl"), "hello, world!").unwrap();
    std::fs::set_permissions(h.task_dir().join("my.tmpl"), std::fs::Permissions::from_mode(0o644))
        .unwrap();
    let inode = std::fs::metadata(h.task_dir().join("my.tmpl")).unwrap().ino();
    let runner = h.start();
    h.running(&runner).await;
    assert_eq!(h.read("my.tmpl").as_deref(), Some("hello, world!"));
    let after = std::fs::metadata(h.task_dir().join("my.tmpl")).unwrap().ino();
    assert_eq!(inode, after, "a file that holds the output already is left as it is");
}
