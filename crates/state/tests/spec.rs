//! Job spec parsing and validation, tested on whole documents.

use proptest::prelude::*;
use std::collections::BTreeMap;
use std::time::Duration;
use wharf_state::service::{
    Check, CheckKind, CheckRestart, HealthCheck, Network, OnUpdate, PortSpec, Service,
    UpdateStrategy,
};
use wharf_state::spec::{self, Job, JobType, RestartMode, RestartPolicy, Stage, TaskGroup};

const DESIGN_EXAMPLE: &str = r#"
[job]
id = "hello"
type = "service"            # service | batch

[group]
name = "web"

[[group.task]]
name = "init"
driver = "raw_exec"
lifecycle = { hook = "prestart" }          # prestart | poststart | poststop; sidecar = true|false
config = { command = "/bin/sh", args = ["-c", "echo ready > ${WHARF_ALLOC_DIR}/ready"] }

[[group.task]]
name = "server"
driver = "raw_exec"
leader = true
kill_timeout = "5s"
kill_signal = "SIGTERM"
env = { PORT = "8080" }
config = { command = "python3", args = ["-m", "http.server", "8080"] }
restart = { attempts = 2, interval = "30m", delay = "15s", mode = "fail" }

[[group.task]]
name = "cleanup"
driver = "raw_exec"
lifecycle = { hook = "poststop" }
config = { command = "/bin/sh", args = ["-c", "echo bye"] }
"#;

#[test]
fn design_example_parses() {
    let job = spec::parse_toml(DESIGN_EXAMPLE).unwrap();
    assert_eq!(job.id, "hello");
    assert_eq!(job.job_type, JobType::Service);
    let group = job.group("web").unwrap();
    let stages: Vec<_> = group.tasks.iter().map(|t| (t.name.as_str(), t.stage())).collect();
    assert_eq!(
        stages,
        [("init", Stage::PrestartEphemeral), ("server", Stage::Main), ("cleanup", Stage::Poststop)]
    );
    let server = &group.tasks[1];
    assert!(server.leader);
    assert_eq!(server.env["PORT"], "8080");
    assert_eq!(server.config["args"][2], "8080");
    assert_eq!(
        job.restart_policy(group, server),
        RestartPolicy {
            attempts: 2,
            interval: Duration::from_secs(1800),
            delay: Duration::from_secs(15),
            mode: RestartMode::Fail
        }
    );
    // The same document as JSON reads the same.
    let json = serde_json::to_string(&job.to_spec()).unwrap();
    assert_eq!(spec::parse_json(&json).unwrap(), job);
}

#[test]
fn restart_defaults_follow_job_type_then_group_then_task() {
    let doc = r#"
        [job]
        id = "b"
        type = "batch"
        [group]
        name = "g"
        restart = { attempts = 5, delay = "1s" }
        [[group.task]]
        name = "t"
        driver = "mock"
        restart = { delay = "2s" }
        [[group.task]]
        name = "u"
        driver = "mock"
    "#;
    let job = spec::parse_toml(doc).unwrap();
    let group = &job.groups[0];
    let t = job.restart_policy(group, &group.tasks[0]);
    let u = job.restart_policy(group, &group.tasks[1]);
    assert_eq!(
        (t.attempts, t.interval, t.delay),
        (5, Duration::from_secs(86_400), Duration::from_secs(2))
    );
    assert_eq!((u.attempts, u.delay), (5, Duration::from_secs(1)));
    assert_eq!(RestartPolicy::defaults_for(JobType::Service).attempts, 2);
    assert_eq!(RestartPolicy::defaults_for(JobType::Batch).attempts, 3);
    assert_eq!(
        RestartPolicy::defaults_for(JobType::System),
        RestartPolicy::defaults_for(JobType::Service)
    );
    assert_eq!(
        RestartPolicy::defaults_for(JobType::SysBatch),
        RestartPolicy::defaults_for(JobType::Batch)
    );
}

#[test]
fn nomad_job_types_and_the_default_kill_signal_carry_over() {
    for (name, job_type) in [
        ("service", JobType::Service),
        ("batch", JobType::Batch),
        ("system", JobType::System),
        ("sysbatch", JobType::SysBatch),
    ] {
        let doc = format!(
            "[job]\nid = \"j\"\ntype = \"{name}\"\n[group]\nname = \"g\"\n[[group.task]]\nname = \"t\"\ndriver = \"x\"\n"
        );
        let job = spec::parse_toml(&doc).unwrap();
        assert_eq!(job.job_type, job_type);
        assert_eq!(job.groups[0].tasks[0].kill_signal, wharf_state::Signal::Int, "Nomad's default");
    }
}

/// A minimal valid document with `task_lines` as its tasks.
fn doc_with_tasks(task_lines: &str) -> String {
    format!("[job]\nid = \"j\"\ntype = \"service\"\n[group]\nname = \"g\"\n{task_lines}")
}

/// A job whose one task `t` (driver `x`) has `extra` lines.
fn task_with(extra: &str) -> String {
    doc_with_tasks(&format!("[[group.task]]\nname = \"t\"\ndriver = \"x\"\n{extra}"))
}

/// A job whose group has `extra` lines and one task `t` (driver `x`).
fn group_with(extra: &str) -> String {
    doc_with_tasks(&format!("{extra}[[group.task]]\nname = \"t\"\ndriver = \"x\"\n"))
}

#[test]
fn invalid_specs_name_the_field() {
    // (document, the field the error must name, a phrase it must contain)
    let cases: Vec<(String, &str, &str)> = vec![
        (task_with("bogus = 1\n"), "group.task[0].bogus", "unknown field `bogus`"),
        (doc_with_tasks("[[group.task]]\nname = \"\"\ndriver = \"x\"\n"), "group.task[0].name", "[A-Za-z0-9_-]{1,64}"),
        (doc_with_tasks("[[group.task]]\nname = \"a/b\"\ndriver = \"x\"\n"), "group.task[0].name", "directory name"),
        (doc_with_tasks("[[group.task]]\nname = \"alloc\"\ndriver = \"x\"\n"), "group.task[0].name", "reserved"),
        (doc_with_tasks(&format!("[[group.task]]\nname = \"{}\"\ndriver = \"x\"\n", "n".repeat(65))), "group.task[0].name", "{1,64}"),
        (
            group_with("[[group.task]]\nname = \"t\"\ndriver = \"x\"\n"),
            "group.task[1].name",
            "duplicate task name \"t\"",
        ),
        (
            doc_with_tasks("[[group.task]]\nname = \"a\"\ndriver = \"x\"\nleader = true\n[[group.task]]\nname = \"b\"\ndriver = \"x\"\nleader = true\n"),
            "group.task",
            "only one task may be the leader, found 2: a, b",
        ),
        (
            task_with("lifecycle = { hook = \"poststop\", sidecar = true }\n"),
            "group.task[0].lifecycle.sidecar",
            "poststop task cannot be a sidecar",
        ),
        (
            task_with("lifecycle = { hook = \"prerun\" }\n"),
            "group.task[0].lifecycle.hook",
            "unknown variant `prerun`",
        ),
        (task_with("kill_timeout = \"5 minutes\"\n"), "group.task[0].kill_timeout", "invalid duration"),
        (task_with("kill_timeout = 5\n"), "group.task[0].kill_timeout", "invalid type"),
        (task_with("kill_signal = \"SIGFOO\"\n"), "group.task[0].kill_signal", "unknown signal \"SIGFOO\""),
        (task_with("restart = { interval = \"1s\" }\n"), "group.task[0].restart", "shorter than the minimum of 5s"),
        (task_with("restart = { interval = \"1x\" }\n"), "group.task[0].restart.interval", "unknown unit"),
        (
            task_with("restart = { attempts = 10, delay = \"1m\", interval = \"5m\" }\n"),
            "group.task[0].restart",
            "do not fit in the interval",
        ),
        (
            task_with("restart = { attempts = 0, mode = \"delay\" }\n"),
            "group.task[0].restart",
            "ambiguous",
        ),
        (doc_with_tasks("[[group.task]]\nname = \"t\"\ndriver = \"\"\n"), "group.task[0].driver", "needs a driver"),
        (task_with("env = { \"A=B\" = \"1\" }\n"), "group.task[0].env", "not a valid variable name"),
        (task_with("resources = { memory = 0 }\n"), "group.task[0].resources.memory", "at least 1"),
        (task_with("resources = { cpu = 0 }\n"), "group.task[0].resources.cpu", "at least 1"),
        (
            task_with("resources = { memory = 512, memory_max = 256 }\n"),
            "group.task[0].resources.memory_max",
            "below `memory`",
        ),
        (
            task_with("resources = { memory = 1, memory_mb = 2 }\n"),
            "group.task[0].resources",
            "duplicate field `memory`",
        ),
        (task_with("resources = { disk = 1 }\n"), "group.task[0].resources.disk", "unknown field `disk`"),
        (
            group_with("reschedule = { delay = \"1s\" }\n"),
            "group.reschedule",
            "delay 1s is shorter than the minimum of 5s",
        ),
        (
            group_with("reschedule = { delay_function = \"linear\" }\n"),
            "group.reschedule.delay_function",
            "unknown variant `linear`",
        ),
        (
            group_with("reschedule = { attempts = 3, unlimited = true }\n"),
            "group.reschedule",
            "ambiguous",
        ),
        (
            group_with("reschedule = { tries = 3 }\n"),
            "group.reschedule.tries",
            "unknown field `tries`",
        ),
        (doc_with_tasks(""), "group", "missing field `task`"),
        (doc_with_tasks("task = []\n"), "group.task", "at least one task"),
        ("[job]\nid = \"j\"\ntype = \"daemon\"\n".into(), "job.type", "unknown variant `daemon`"),
        ("[job]\nid = \"\"\ntype = \"batch\"\n[group]\nname = \"g\"\ntask = [{ name = \"t\", driver = \"x\" }]\n".into(), "job.id", "1 to 128"),
        ("this is not toml".into(), "", "TOML parse error"),
    ];
    for (doc, field, phrase) in cases {
        let err = spec::parse_toml(&doc).expect_err(&doc);
        let problem = err
            .problems
            .iter()
            .find(|p| p.field == field)
            .unwrap_or_else(|| panic!("no problem names {field:?} for\n{doc}\ngot: {err}"));
        assert!(
            problem.message.contains(phrase),
            "{field}: {:?} lacks {phrase:?}",
            problem.message
        );
    }
}

/// A group's `reschedule` block takes the job type's defaults (Nomad's) for what it leaves out,
/// and reads back from JSON the same.
#[test]
fn reschedule_defaults_follow_the_job_type_then_the_group() {
    use wharf_state::{DelayFunction, ReschedulePolicy};
    let doc = |kind: &str, block: &str| {
        format!(
            "[job]\nid = \"j\"\ntype = \"{kind}\"\n[group]\nname = \"g\"\n{block}[[group.task]]\nname = \"t\"\ndriver = \"x\"\n"
        )
    };
    let policy = |kind: &str, block: &str| {
        let job = spec::parse_toml(&doc(kind, block)).unwrap();
        let json = serde_json::to_string(&job.to_spec()).unwrap();
        assert_eq!(spec::parse_json(&json).unwrap(), job);
        job.reschedule_policy(&job.groups[0])
    };
    assert_eq!(policy("service", ""), ReschedulePolicy::defaults_for(JobType::Service));
    assert_eq!(policy("batch", ""), ReschedulePolicy::defaults_for(JobType::Batch));
    let tuned =
        policy("service", "reschedule = { delay = \"10s\", delay_function = \"fibonacci\" }\n");
    assert_eq!(
        (tuned.delay, tuned.delay_function),
        (Duration::from_secs(10), DelayFunction::Fibonacci)
    );
    assert_eq!((tuned.max_delay, tuned.unlimited), (Duration::from_secs(3600), true));
    let off = policy("batch", "reschedule = { attempts = 0 }\n");
    assert!(!off.enabled());
}

/// Nomad's names (`memory`, `memory_max`, `cores`) and wharf's older `memory_mb` both read.
#[test]
fn resources_take_nomads_names_and_the_old_one() {
    let resources = |block: &str| {
        let doc = doc_with_tasks(&format!(
            "[[group.task]]\nname = \"t\"\ndriver = \"x\"\nresources = {{ {block} }}\n"
        ));
        spec::parse_toml(&doc).unwrap().groups[0].tasks[0].resources
    };
    let nomad = resources("cpu = 500, memory = 256, memory_max = 512, cores = 1");
    assert_eq!(nomad, spec::Resources { cpu: 500, memory: 256, memory_max: Some(512), cores: 1 });
    assert_eq!(nomad.memory_limit(), 512);
    let old = resources("memory_mb = 128");
    assert_eq!((old.memory, old.memory_max, old.cores, old.cpu), (128, None, 0, 100));
    assert_eq!(old.memory_limit(), 128);
    // Written back, the new name is used.
    let json = serde_json::to_value(old).unwrap();
    assert_eq!(json, serde_json::json!({"cpu": 100, "memory": 128}));
}

#[test]
fn every_problem_is_reported_at_once() {
    let doc = doc_with_tasks(
        "[[group.task]]\nname = \"a b\"\ndriver = \"\"\n[[group.task]]\nname = \"c\"\ndriver = \"x\"\nlifecycle = { hook = \"poststop\", sidecar = true }\n",
    );
    let err = spec::parse_toml(&doc).unwrap_err();
    let fields: Vec<_> = err.problems.iter().map(|p| p.field.as_str()).collect();
    assert_eq!(
        fields,
        ["group.task[0].name", "group.task[0].driver", "group.task[1].lifecycle.sidecar"]
    );
    assert_eq!(err.to_string().lines().count(), 3);
}

#[test]
fn json_errors_name_the_field_too() {
    let err = spec::parse_json(r#"{"job":{"id":"j","type":"batch"},"group":{"name":"g","task":[{"name":"t","driver":"x","kill_timeout":"soon"}]}}"#).unwrap_err();
    assert_eq!(err.problems[0].field, "group.task[0].kill_timeout");
    let err = spec::parse_json("{} trailing").unwrap_err();
    assert!(
        err.to_string().contains("missing field `job`") || err.to_string().contains("trailing"),
        "{err}"
    );
}

#[test]
fn unknown_drivers_are_named() {
    let job = spec::parse_toml(DESIGN_EXAMPLE).unwrap();
    assert!(job.check_drivers(|d| d == "raw_exec").is_ok());
    let err = job.check_drivers(|d| d == "docker").unwrap_err();
    assert_eq!(err.problems.len(), 3);
    assert_eq!(err.problems[0].field, "group.task[0].driver");
    assert!(err.problems[0].message.contains("unknown driver \"raw_exec\""));
}

fn name() -> impl Strategy<Value = String> {
    "[A-Za-z0-9_-]{1,12}"
}

fn arb_job() -> impl Strategy<Value = Job> {
    let task = (
        name(),
        prop_oneof![Just("raw_exec".to_owned()), Just("mock".to_owned())],
        proptest::collection::btree_map("[A-Z_]{1,6}", "[ -~]{0,10}", 0..3),
        prop_oneof![
            Just(None),
            Just(Some(spec::Lifecycle { hook: spec::LifecycleHook::Prestart, sidecar: false })),
            Just(Some(spec::Lifecycle { hook: spec::LifecycleHook::Prestart, sidecar: true })),
            Just(Some(spec::Lifecycle { hook: spec::LifecycleHook::Poststart, sidecar: true })),
            Just(Some(spec::Lifecycle { hook: spec::LifecycleHook::Poststop, sidecar: false })),
        ],
        1u64..600_000,
        proptest::option::of(0u32..4),
        proptest::sample::select(wharf_state::Signal::ALL),
    )
        .prop_map(|(name, driver, env, lifecycle, kill_ms, attempts, kill_signal)| {
            spec::Task {
                name,
                driver,
                config: serde_json::json!({ "command": "/bin/true", "args": ["a", 1, true] })
                    .as_object()
                    .cloned()
                    .unwrap(),
                env,
                leader: false,
                lifecycle,
                kill_timeout: Duration::from_millis(kill_ms),
                kill_signal,
                restart: spec::RestartOverrides { attempts, ..Default::default() },
                resources: Default::default(),
                ..spec::Task::new("", "")
            }
        });
    let check = (
        prop_oneof![Just(CheckKind::Http), Just(CheckKind::Tcp), Just(CheckKind::Script)],
        1u64..120,
        proptest::option::of((0u32..5, proptest::option::of(0u64..60), any::<bool>())),
    )
        .prop_map(|(kind, secs, restart)| Check {
            name: format!("{kind:?}-{secs}"),
            kind,
            port: None,
            path: (kind == CheckKind::Http).then(|| "/health?x=1".to_owned()),
            method: (kind == CheckKind::Http).then(|| "HEAD".to_owned()),
            header: if kind == CheckKind::Http {
                BTreeMap::from([("X-Probe".to_owned(), vec!["a".to_owned(), "b".to_owned()])])
            } else {
                BTreeMap::new()
            },
            body: None,
            protocol: None,
            command: (kind == CheckKind::Script).then(|| "/bin/true".to_owned()),
            args: Vec::new(),
            interval: Duration::from_secs(secs),
            timeout: Duration::from_secs(1 + secs / 2),
            check_restart: restart.map(|(limit, grace, ignore)| CheckRestart {
                limit: Some(limit),
                grace: grace.map(Duration::from_secs),
                ignore_warnings: Some(ignore),
            }),
            on_update: None,
        });
    let service =
        (proptest::collection::vec(check, 0..3), proptest::collection::vec("[a-z]{1,5}", 0..3))
            .prop_map(|(mut checks, tags)| {
                for (i, check) in checks.iter_mut().enumerate() {
                    check.name = format!("c{i}");
                }
                Service {
                    name: "web".into(),
                    port: Some("http".into()),
                    tags,
                    provider: Default::default(),
                    check_restart: None,
                    on_update: Default::default(),
                    checks,
                }
            });
    let update = proptest::option::of((0u64..60, 61u64..600)).prop_map(|times| {
        times.map(|(min, deadline)| UpdateStrategy {
            health_check: HealthCheck::TaskStates,
            min_healthy_time: Duration::from_secs(min),
            healthy_deadline: Duration::from_secs(deadline),
        })
    });
    (
        name(),
        prop_oneof![
            Just(JobType::Service),
            Just(JobType::Batch),
            Just(JobType::System),
            Just(JobType::SysBatch)
        ],
        name(),
        proptest::collection::vec(task, 1..5),
        proptest::option::of(service),
        update,
        proptest::option::of(1u16..),
    )
        .prop_map(|(id, job_type, group_name, mut tasks, service, update, static_port)| {
            for (i, task) in tasks.iter_mut().enumerate() {
                task.name = format!("{}{i}", task.name);
            }
            tasks[0].leader = true;
            tasks[0].services.extend(service);
            let ports = BTreeMap::from([
                ("http".to_owned(), PortSpec::default()),
                ("fixed".to_owned(), PortSpec { static_port }),
            ]);
            Job {
                id,
                job_type,
                groups: vec![TaskGroup {
                    name: group_name,
                    restart: Default::default(),
                    network: Some(Network { ports }),
                    update,
                    reschedule: Default::default(),
                    tasks,
                    ..TaskGroup::new("", [])
                }],
            }
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn valid_specs_round_trip_through_toml_and_json(job in arb_job()) {
        prop_assert!(job.validate().is_ok(), "{:?}", job.validate());
        let toml_text = toml::to_string(&job.to_spec()).unwrap();
        prop_assert_eq!(&spec::parse_toml(&toml_text).unwrap(), &job);
        let json_text = serde_json::to_string_pretty(&job.to_spec()).unwrap();
        prop_assert_eq!(&spec::parse_json(&json_text).unwrap(), &job);
    }

    #[test]
    fn parsers_never_panic(input in "\\PC{0,200}") {
        let _ = spec::parse_toml(&input);
        let _ = spec::parse_json(&input);
    }

    #[test]
    fn parsers_never_panic_on_near_valid_documents(cut in 0usize..900, junk in "[\\[\\]{}=\"a-z0-9., \n]{0,8}") {
        let mut doc = DESIGN_EXAMPLE.to_owned();
        let cut = cut.min(doc.len());
        let cut = (0..=cut).rev().find(|&i| doc.is_char_boundary(i)).unwrap_or(0);
        doc.insert_str(cut, &junk);
        let _ = spec::parse_toml(&doc);
    }
}

/// A job id is refused when it could name a path (`/`, `\`, `..`, `.`) or cannot be shown on
/// one line (controls, spaces), or is empty or over 128 bytes; ids with dots, colons and
/// letters beyond ASCII are fine.
#[test]
fn job_ids_cannot_name_a_path() {
    let with_id = |id: &str| {
        let mut job = spec::parse_toml(&doc_with_tasks(
            "[[group.task]]\nname = \"t\"\ndriver = \"raw_exec\"\n",
        ))
        .unwrap();
        job.id = id.to_owned();
        job.validate()
    };
    for id in ["web", "web.v2", "team:web-2", "café", &"x".repeat(128)] {
        assert!(with_id(id).is_ok(), "{id:?}: {:?}", with_id(id));
    }
    let long = "é".repeat(65);
    for id in [
        "../../escape-job",
        "a/b",
        "/abs",
        "a\\b",
        "..",
        ".",
        "a..b",
        "",
        "a b",
        "bell\u{7}",
        &long,
    ] {
        let err = with_id(id).expect_err(id);
        assert_eq!(err.problems.len(), 1, "{id:?}: {err}");
        assert_eq!(err.problems[0].field, "job.id", "{id:?}");
        assert!(err.problems[0].message.contains("1 to 128 bytes, with no `/`"), "{err}");
    }
}

/// The service example of the README: a dynamic port, a service with an http check and
/// check_restart, and the update block, read as written.
const SERVICE_EXAMPLE: &str = r#"
[job]
id = "web"
type = "service"

[group]
name = "web"

[group.network.port.http]
[group.network.port.admin]
static = 9000

[group.update]
health_check = "checks"
min_healthy_time = "5s"
healthy_deadline = "1m"

[[group.task]]
name = "server"
driver = "raw_exec"
config = { command = "python3", args = ["-m", "http.server", "${WHARF_PORT_http}"] }

[[group.task.service]]
name = "web"
port = "http"
tags = ["v1", "public"]
check_restart = { limit = 3, grace = "10s" }

[[group.task.service.check]]
name = "alive"
type = "http"
path = "health"
header = { X-Probe = ["wharf"] }
interval = "2s"
timeout = "1s"
check_restart = { ignore_warnings = true }
on_update = "ignore_warnings"

[[group.task.service.check]]
type = "tcp"
port = "admin"
interval = "5s"
timeout = "1s"

[[group.task.service.check]]
name = "script"
type = "script"
command = "/bin/test"
args = ["-e", "local/ready"]
interval = "5s"
timeout = "2s"
check_restart = { limit = 0 }
"#;

#[test]
fn services_checks_ports_and_update_read_as_written() {
    let job = spec::parse_toml(SERVICE_EXAMPLE).unwrap();
    let group = &job.groups[0];
    let ports = &group.network.as_ref().unwrap().ports;
    assert_eq!(ports["http"], PortSpec { static_port: None });
    assert_eq!(ports["admin"], PortSpec { static_port: Some(9000) });
    let update = job.health_strategy(group).unwrap();
    assert_eq!(update.health_check, HealthCheck::Checks);
    assert_eq!(update.min_healthy_time, Duration::from_secs(5));
    assert_eq!(update.healthy_deadline, Duration::from_secs(60));

    let service = &group.tasks[0].services[0];
    assert_eq!((service.name.as_str(), service.port.as_deref()), ("web", Some("http")));
    assert_eq!(service.tags, ["v1", "public"]);
    let [alive, tcp, script] = &service.checks[..] else { panic!("three checks") };
    assert_eq!(alive.request_path(), "/health", "a relative path is made absolute");
    assert_eq!(alive.request_method(), "GET");
    assert_eq!(service.check_name(tcp), "service: \"web\" check", "Nomad's default name");
    assert_eq!(service.check_port(tcp), Some("admin"));
    assert_eq!(service.check_port(alive), Some("http"));
    // check_restart merges field by field (Nomad's `CheckRestart.Merge`), with a 1s grace
    // by default, and a limit of 0 turns it off.
    assert_eq!(
        service.check_restart(alive),
        Some(wharf_state::CheckRestartPolicy {
            limit: 3,
            grace: Duration::from_secs(10),
            ignore_warnings: true
        })
    );
    assert!(!service.check_restart(tcp).unwrap().ignore_warnings);
    assert_eq!(service.check_restart(script), None);
    let bare = Service {
        check_restart: Some(CheckRestart { limit: Some(2), ..Default::default() }),
        ..service.clone()
    };
    assert_eq!(bare.check_restart(tcp).unwrap().grace, Duration::from_secs(1));
    // on_update: the check's own, else the service's (Nomad's `Service.Canonicalize`).
    assert_eq!(service.check_on_update(alive), OnUpdate::IgnoreWarnings);
    assert_eq!(service.check_on_update(tcp), OnUpdate::RequireHealthy);
    let readiness = Service { on_update: OnUpdate::Ignore, ..service.clone() };
    assert_eq!(readiness.check_on_update(tcp), OnUpdate::Ignore);
    assert_eq!(readiness.check_on_update(alive), OnUpdate::IgnoreWarnings);

    // Round trip, and the update block's defaults are Nomad's.
    assert_eq!(spec::parse_json(&serde_json::to_string(&job.to_spec()).unwrap()).unwrap(), job);
    assert_eq!(
        UpdateStrategy::default(),
        UpdateStrategy {
            health_check: HealthCheck::Checks,
            min_healthy_time: Duration::from_secs(10),
            healthy_deadline: Duration::from_secs(300)
        }
    );
}

/// Nomad watches the health of service and system jobs only (`TestHealthHook_BatchNoop`,
/// `TestHealthHook_System`): the others have no health strategy.
#[test]
fn only_long_running_jobs_have_their_health_judged() {
    for (kind, judged) in
        [("service", true), ("system", true), ("batch", false), ("sysbatch", false)]
    {
        let job = spec::parse_toml(&format!(
            "[job]\nid = \"j\"\ntype = \"{kind}\"\n[group]\nname = \"g\"\n[[group.task]]\nname = \"t\"\ndriver = \"x\"\n"
        ))
        .unwrap();
        assert_eq!(job.health_strategy(&job.groups[0]).is_some(), judged, "{kind}");
    }
}

/// A document with one task (`task_extra` added to it) and `group_extra` in the group.
fn service_doc(group_extra: &str, task_extra: &str) -> String {
    format!(
        "[job]\nid = \"j\"\ntype = \"service\"\n[group]\nname = \"g\"\n{group_extra}\n\
         [[group.task]]\nname = \"t\"\ndriver = \"x\"\n{task_extra}"
    )
}

const PORT_HTTP: &str = "[group.network.port.http]\n";

fn service_with_check(check: &str) -> String {
    service_doc(
        PORT_HTTP,
        &format!(
            "[[group.task.service]]\nname = \"web\"\nport = \"http\"\n[[group.task.service.check]]\n{check}"
        ),
    )
}

#[test]
fn invalid_services_checks_and_ports_name_the_field() {
    let http = "type = \"http\"\npath = \"/\"\ninterval = \"1s\"\ntimeout = \"1s\"\n";
    let cases: Vec<(String, &str, &str)> = vec![
        (
            service_doc("[group.network.port.\"my-port\"]\n", ""),
            "group.network.port.my-port",
            "WHARF_PORT_<label>",
        ),
        (
            service_doc("[group.network.port.db]\nstatic = 0\n", ""),
            "group.network.port.db.static",
            "leave `static` out",
        ),
        (
            service_doc("[group.network.port.db]\nstatic = 70000\n", ""),
            "group.network.port.db.static",
            "u16",
        ),
        (
            service_doc(
                "[group.network.port.a]\nstatic = 80\n[group.network.port.b]\nstatic = 80\n",
                "",
            ),
            "group.network.port.b.static",
            "port 80 is already taken by port \"a\"",
        ),
        (
            service_doc("[group.network.port.http]\nto = 80\n", ""),
            "group.network.port.http.to",
            "unknown field `to`",
        ),
        (
            service_doc(
                "[group.update]\nmin_healthy_time = \"5m\"\nhealthy_deadline = \"1m\"\n",
                "",
            ),
            "group.update.min_healthy_time",
            "shorter than healthy_deadline",
        ),
        (
            service_doc("[group.update]\nhealthy_deadline = \"0s\"\n", ""),
            "group.update.healthy_deadline",
            "greater than zero",
        ),
        (
            service_doc("[group.update]\nhealth_check = \"vibes\"\n", ""),
            "group.update.health_check",
            "unknown variant `vibes`",
        ),
        (
            service_doc("[group.update]\nmax_parallel = 2\n", ""),
            "group.update.max_parallel",
            "unknown field `max_parallel`",
        ),
        (
            service_doc("", "[[group.task.service]]\nname = \"web_1\"\n"),
            "group.task[0].service[0].name",
            "RFC 1123",
        ),
        (
            service_doc(
                "",
                "[[group.task.service]]\nname = \"web\"\n[[group.task.service]]\nname = \"web\"\n",
            ),
            "group.task[0].service[1].name",
            "already has a service \"web\"",
        ),
        (
            service_doc("", "[[group.task.service]]\nname = \"web\"\nport = \"http\"\n"),
            "group.task[0].service[0].port",
            "group.network.port.http",
        ),
        (
            service_doc("", "[[group.task.service]]\nname = \"web\"\nprovider = \"consul\"\n"),
            "group.task[0].service[0].provider",
            "unknown variant `consul`",
        ),
        (
            service_doc("", "[[group.task.service]]\nname = \"web\"\ntags = [\"\"]\n"),
            "group.task[0].service[0].tags[0]",
            "non-empty",
        ),
        (
            service_with_check("type = \"grpc\"\ninterval = \"1s\"\ntimeout = \"1s\"\n"),
            "group.task[0].service[0].check[0].type",
            "unknown variant `grpc`",
        ),
        (
            service_with_check("type = \"http\"\npath = \"/\"\ntimeout = \"1s\"\n"),
            "group.task[0].service[0].check[0]",
            "missing field `interval`",
        ),
        (
            service_with_check(
                "type = \"http\"\npath = \"/\"\ninterval = \"500ms\"\ntimeout = \"1s\"\n",
            ),
            "group.task[0].service[0].check[0].interval",
            "shorter than the minimum of 1s",
        ),
        (
            service_with_check(
                "type = \"http\"\npath = \"/\"\ninterval = \"1s\"\ntimeout = \"100ms\"\n",
            ),
            "group.task[0].service[0].check[0].timeout",
            "shorter than the minimum of 1s",
        ),
        (
            service_with_check("type = \"http\"\ninterval = \"1s\"\ntimeout = \"1s\"\n"),
            "group.task[0].service[0].check[0].path",
            "needs a path",
        ),
        (
            service_with_check(
                "type = \"http\"\npath = \"http://x/\"\ninterval = \"1s\"\ntimeout = \"1s\"\n",
            ),
            "group.task[0].service[0].check[0].path",
            "not a URL",
        ),
        (
            service_with_check(
                "type = \"http\"\npath = \"/a b\"\ninterval = \"1s\"\ntimeout = \"1s\"\n",
            ),
            "group.task[0].service[0].check[0].path",
            "percent-encode",
        ),
        (
            service_with_check(&format!("{http}method = \"GET /x\"\n")),
            "group.task[0].service[0].check[0].method",
            "not an HTTP method",
        ),
        (
            service_with_check(&format!("{http}protocol = \"https\"\n")),
            "group.task[0].service[0].check[0].protocol",
            "plain \"http\"",
        ),
        (
            service_with_check(&format!("{http}header = {{ \"X A\" = [\"1\"] }}\n")),
            "group.task[0].service[0].check[0].header",
            "not a header name",
        ),
        (
            service_with_check(&format!("{http}header = {{ X-A = [\"1\\r\\nEvil: 1\"] }}\n")),
            "group.task[0].service[0].check[0].header.X-A",
            "line breaks",
        ),
        (
            service_with_check(&format!("{http}command = \"/bin/true\"\n")),
            "group.task[0].service[0].check[0].command",
            "a http check has no command",
        ),
        (
            service_with_check(&format!("{http}port = \"admin\"\n")),
            "group.task[0].service[0].check[0].port",
            "not a port of the group",
        ),
        (
            service_with_check(
                "type = \"tcp\"\npath = \"/\"\ninterval = \"1s\"\ntimeout = \"1s\"\n",
            ),
            "group.task[0].service[0].check[0].path",
            "a tcp check has no path",
        ),
        (
            service_with_check("type = \"script\"\ninterval = \"1s\"\ntimeout = \"1s\"\n"),
            "group.task[0].service[0].check[0].command",
            "needs the command",
        ),
        (
            service_with_check(&format!("{http}check_restart = {{ limit = -1 }}\n")),
            "group.task[0].service[0].check[0].check_restart.limit",
            "invalid value",
        ),
        (
            service_with_check(&format!("{http}check_restart = {{ grace = \"soon\" }}\n")),
            "group.task[0].service[0].check[0].check_restart.grace",
            "invalid duration",
        ),
        (
            service_doc(
                "",
                "[[group.task.service]]\nname = \"web\"\n[[group.task.service.check]]\ntype = \"tcp\"\ninterval = \"1s\"\ntimeout = \"1s\"\n",
            ),
            "group.task[0].service[0].check[0].port",
            "needs a port",
        ),
        (
            service_with_check(&format!("{http}[[group.task.service.check]]\n{http}")),
            "group.task[0].service[0].check[1].name",
            "already has a check named \"service: \\\"web\\\" check\"",
        ),
        (
            service_with_check(&format!("{http}on_update = \"sometimes\"\n")),
            "group.task[0].service[0].check[0].on_update",
            "unknown variant `sometimes`",
        ),
        // Nomad's `ServiceCheck.validateNomad` rules, through the service's settings too.
        (
            service_with_check(&format!(
                "{http}on_update = \"ignore\"\ncheck_restart = {{ limit = 2 }}\n"
            )),
            "group.task[0].service[0].check[0].on_update",
            "\"ignore\" cannot be used with check_restart",
        ),
        (
            service_doc(
                PORT_HTTP,
                &format!(
                    "[[group.task.service]]\nname = \"web\"\nport = \"http\"\n\
                     on_update = \"ignore_warnings\"\ncheck_restart = {{ limit = 2 }}\n\
                     [[group.task.service.check]]\n{http}"
                ),
            ),
            "group.task[0].service[0].check[0].on_update",
            "needs check_restart's ignore_warnings = true",
        ),
    ];
    for (doc, field, phrase) in cases {
        let err = spec::parse_toml(&doc).expect_err(&doc);
        let problem = err
            .problems
            .iter()
            .find(|p| p.field == field)
            .unwrap_or_else(|| panic!("no problem names {field:?} for\n{doc}\ngot: {err}"));
        assert!(
            problem.message.contains(phrase),
            "{field}: {:?} lacks {phrase:?}",
            problem.message
        );
    }
}

/// Every example of the README is a valid job spec.
#[test]
fn the_examples_are_valid() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples");
    let mut read = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "toml") {
            let text = std::fs::read_to_string(&path).unwrap();
            spec::parse_toml(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            read += 1;
        }
    }
    assert!(read >= 4, "only {read} examples in {}", dir.display());
}
