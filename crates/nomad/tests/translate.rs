//! Nomad job JSON, as `nomad job run -output` prints it, translated into wharf's spec: what
//! maps, what is shown back, and what is refused with its field named.

use serde_json::{Value, json};
use std::time::Duration;
use wharf_nomad::{NomadError, translate};
use wharf_state::{
    CheckKind, DelayFunction, HealthCheck, JobType, LifecycleHook, RestartMode, Signal,
};

fn fixture(name: &str) -> Value {
    let path = format!("{}/tests/fixtures/{name}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let body: Value = serde_json::from_str(&text).unwrap();
    wharf_nomad::job_of_request(&body).unwrap().clone()
}

fn refused(job: &Value) -> String {
    match translate(job) {
        Ok(_) => panic!("the job was accepted"),
        Err(error) => error.to_string(),
    }
}

#[test]
fn full_service_job_maps_field_by_field() {
    let job = translate(&fixture("web.json")).unwrap();
    assert_eq!((job.id.as_str(), job.name.as_str()), ("web", "web-frontend"));
    assert_eq!(job.job_type, JobType::Service);
    assert_eq!((job.region.as_str(), job.namespace.as_str()), ("eu-west", "shop"));
    assert_eq!(job.datacenters, ["dc1", "dc2"]);
    assert_eq!(job.priority, 70);
    assert_eq!(job.meta["team"], "checkout");
    assert_eq!(job.submitted["Meta"]["team"], "checkout");
    assert_eq!(job.submitted["Region"], "eu-west");

    let [group] = job.groups.as_slice() else { panic!("one group") };
    assert_eq!((group.name.as_str(), group.count), ("frontend", 3));
    let spec = &group.job;
    assert_eq!(spec.id, "web");
    let g = &spec.groups[0];
    assert_eq!(g.restart.attempts, Some(2));
    assert_eq!(g.restart.interval, Some(Duration::from_secs(1800)));
    assert_eq!(g.reschedule.delay_function, Some(DelayFunction::Exponential));
    assert_eq!(g.reschedule.unlimited, Some(true));
    assert_eq!(g.reschedule.max_delay, Some(Duration::from_secs(3600)));
    let update = g.update.unwrap();
    assert_eq!(update.health_check, HealthCheck::Checks);
    assert_eq!(update.min_healthy_time, Duration::from_secs(5));
    assert_eq!(update.healthy_deadline, Duration::from_secs(60));
    let ports = &g.network.as_ref().unwrap().ports;
    assert_eq!(ports["admin"].static_port, Some(9901));
    assert_eq!(ports["http"].static_port, None);

    let setup = &g.tasks[0];
    assert_eq!(setup.driver, "exec");
    assert_eq!(setup.lifecycle.unwrap().hook, LifecycleHook::Prestart);
    assert_eq!(setup.resources.memory, 64);

    let server = &g.tasks[1];
    assert_eq!(server.driver, "raw_exec");
    assert!(server.leader);
    assert_eq!(server.kill_timeout, Duration::from_secs(20));
    assert_eq!(server.kill_signal, Signal::Term);
    assert_eq!(server.restart.mode, Some(RestartMode::Delay));
    assert_eq!(server.restart.attempts, Some(5));
    assert_eq!(
        (server.resources.cpu, server.resources.memory, server.resources.memory_max),
        (250, 128, Some(256))
    );
    assert_eq!(server.config["args"][2], "${NOMAD_PORT_http}");
    let service = &server.services[0];
    assert_eq!((service.name.as_str(), service.port.as_deref()), ("web", Some("http")));
    assert_eq!(service.tags, ["frontend", "v1"]);
    let check = &service.checks[0];
    assert_eq!(check.kind, CheckKind::Http);
    assert_eq!((check.interval, check.timeout), (Duration::from_secs(10), Duration::from_secs(2)));
    assert_eq!(check.header["X-Probe"], ["wharf"]);
    assert_eq!(check.check_restart.unwrap().limit, Some(3));
}

#[test]
fn tasks_get_nomads_environment() {
    let job = translate(&fixture("web.json")).unwrap();
    let group = &job.groups[0];
    let instance = group.instance(&job.name, 2);
    let env = &instance.groups[0].tasks[1].env;
    let expected = [
        ("NOMAD_ALLOC_ID", "${WHARF_ALLOC_ID}"),
        ("NOMAD_ALLOC_DIR", "${WHARF_ALLOC_DIR}"),
        ("NOMAD_TASK_DIR", "${WHARF_TASK_DIR}/local"),
        ("NOMAD_SECRETS_DIR", "${WHARF_SECRETS_DIR}"),
        ("NOMAD_TASK_NAME", "server"),
        ("NOMAD_GROUP_NAME", "frontend"),
        ("NOMAD_JOB_NAME", "web-frontend"),
        ("NOMAD_JOB_ID", "web"),
        ("NOMAD_PORT_http", "${WHARF_PORT_http}"),
        ("NOMAD_IP_http", "${WHARF_IP_http}"),
        ("NOMAD_ADDR_admin", "${WHARF_ADDR_admin}"),
        ("NOMAD_CPU_LIMIT", "250"),
        ("NOMAD_MEMORY_LIMIT", "128"),
        ("NOMAD_MEMORY_MAX_LIMIT", "256"),
        ("NOMAD_ALLOC_INDEX", "2"),
        ("NOMAD_ALLOC_NAME", "web-frontend.frontend[2]"),
        ("NOMAD_META_team", "checkout"),
        ("NOMAD_META_role", "server"),
        // A user's reference to Nomad's variable, written as the wharf variable it means.
        ("STATIC_DIR", "${WHARF_TASK_DIR}/local/static"),
        ("MODE", "prod"),
    ];
    for (name, value) in expected {
        assert_eq!(env.get(name).map(String::as_str), Some(value), "{name}");
    }
    assert!(
        !instance.groups[0].tasks[0].env.contains_key("NOMAD_META_role"),
        "task meta stays with its task"
    );
}

#[test]
fn nomad_init_example_refuses_the_port_mapping_by_name() {
    let error = refused(&fixture("init-example.json"));
    assert!(error.starts_with("Job.TaskGroups[0].Networks[0].DynamicPorts[0].To:"), "{error}");
}

#[test]
fn docker_maps_to_the_container_driver_with_the_common_keys() {
    let mut job = fixture("init-example.json");
    job["TaskGroups"][0]["Networks"][0]["DynamicPorts"][0]["To"] = json!(0);
    let error = refused(&job);
    assert!(error.starts_with("Job.TaskGroups[0].Tasks[0].Config.auth_soft_fail:"), "{error}");
    job["TaskGroups"][0]["Tasks"][0]["Config"] = json!({"image": "redis:7", "ports": ["db"], "command": "redis-server", "args": ["--port", "${NOMAD_PORT_db}"], "entrypoint": ["/bin/sh"]});
    let translated = translate(&job).unwrap();
    let task = &translated.groups[0].job.groups[0].tasks[0];
    assert_eq!(task.driver, "container");
    assert_eq!(task.config["image"], "redis:7");
    assert_eq!(task.config["entrypoint"][0], "/bin/sh");
    // Defaults Nomad fills in: region, namespace and priority, shown back.
    assert_eq!(
        (translated.region.as_str(), translated.namespace.as_str(), translated.priority),
        ("global", "default", 50)
    );
    assert_eq!(translated.submitted["Namespace"], "default");
    let mut podman = job.clone();
    podman["TaskGroups"][0]["Tasks"][0]["Driver"] = json!("podman");
    assert_eq!(translate(&podman).unwrap().groups[0].job.groups[0].tasks[0].driver, "container");
}

fn minimal() -> Value {
    json!({
        "ID": "batch1", "Type": "batch",
        "TaskGroups": [{"Name": "g", "Tasks": [{"Name": "t", "Driver": "raw_exec", "Config": {"command": "/bin/true"}}]}]
    })
}

#[test]
fn fields_that_change_how_tasks_run_are_refused_by_name() {
    let cases: [(&str, Value, &str); 9] = [
        (
            "/TaskGroups/0/Tasks/0/Vault",
            json!({"Policies": ["db"]}),
            "Job.TaskGroups[0].Tasks[0].Vault: wharf has no Vault integration",
        ),
        (
            "/TaskGroups/0/Tasks/0/Templates",
            json!([{"EmbeddedTmpl": "x", "DestPath": "local/x", "Uid": 1000}]),
            "Job.TaskGroups[0].Tasks[0].Templates[0].Uid:",
        ),
        (
            "/TaskGroups/0/Tasks/0/Artifacts",
            json!([{"GetterSource": "https://x"}]),
            "Job.TaskGroups[0].Tasks[0].Artifacts:",
        ),
        (
            "/TaskGroups/0/Volumes",
            json!({"data": {"Type": "csi", "Source": "vol"}}),
            "Job.TaskGroups[0].Volumes: wharf reads host volumes from its own spec only",
        ),
        (
            "/TaskGroups/0/Tasks/0/CSIPluginConfig",
            json!({"ID": "p"}),
            "Job.TaskGroups[0].Tasks[0].CSIPluginConfig:",
        ),
        ("/Periodic", json!({"Spec": "@daily", "Enabled": true}), "Job.Periodic:"),
        (
            "/Constraints",
            json!([{"LTarget": "${attr.kernel.name}", "RTarget": "linux", "Operand": "="}]),
            "Job.Constraints:",
        ),
        (
            "/TaskGroups/0/Tasks/0/Resources",
            json!({"CPU": 100, "Devices": [{"Name": "nvidia/gpu"}]}),
            "Job.TaskGroups[0].Tasks[0].Resources.Devices:",
        ),
        (
            "/TaskGroups/0/Tasks/0/Unheard",
            json!(1),
            "Job.TaskGroups[0].Tasks[0].Unheard: wharf does not implement",
        ),
    ];
    for (pointer, value, expected) in cases {
        let mut job = minimal();
        let (parent, key) = pointer.rsplit_once('/').unwrap();
        job.pointer_mut(parent).unwrap()[key] = value;
        let error = refused(&job);
        assert!(error.starts_with(expected), "{pointer}: {error}");
    }
}

#[test]
fn connect_and_consul_services_are_refused() {
    let mut job = minimal();
    job["TaskGroups"][0]["Tasks"][0]["Services"] =
        json!([{"Name": "api", "Provider": "nomad", "Connect": {"SidecarService": {}}}]);
    assert!(refused(&job).starts_with(
        "Job.TaskGroups[0].Tasks[0].Services[0].Connect: wharf has no Consul Connect"
    ));
    job["TaskGroups"][0]["Tasks"][0]["Services"] = json!([{"Name": "api", "Provider": "consul"}]);
    assert!(refused(&job).starts_with("Job.TaskGroups[0].Tasks[0].Services[0].Provider:"));
    job["TaskGroups"][0]["Tasks"][0]["Services"] = Value::Null;
    job["TaskGroups"][0]["Services"] = json!([{"Name": "api"}]);
    assert!(refused(&job).starts_with("Job.TaskGroups[0].Services:"));
}

#[test]
fn drivers_other_than_the_four_are_refused_by_name() {
    for driver in ["java", "qemu", "raw-exec", ""] {
        let mut job = minimal();
        job["TaskGroups"][0]["Tasks"][0]["Driver"] = json!(driver);
        let error = refused(&job);
        assert!(
            error.starts_with(&format!(
                "Job.TaskGroups[0].Tasks[0].Driver: {driver:?} is not a driver"
            )),
            "{error}"
        );
    }
}

#[test]
fn bad_values_are_named_and_wharf_rules_still_apply() {
    let mut job = minimal();
    job["TaskGroups"][0]["Tasks"][0]["KillTimeout"] = json!(-5);
    assert!(
        refused(&job).starts_with("Job.TaskGroups[0].Tasks[0].KillTimeout: expected nanoseconds")
    );
    let mut job = minimal();
    job["Type"] = json!("cron");
    assert!(refused(&job).starts_with("Job.Type:"));
    let mut job = minimal();
    job["ID"] = json!("");
    assert_eq!(refused(&job), "Job.ID: a job needs an ID");
    // Two tasks of one name: wharf's own validation, through the translation.
    let mut job = minimal();
    let task = job["TaskGroups"][0]["Tasks"][0].clone();
    job["TaskGroups"][0]["Tasks"].as_array_mut().unwrap().push(task);
    assert!(matches!(translate(&job), Err(NomadError::Spec(_))), "{}", refused(&job));
    // A bare job is accepted as well as {"Job": ...}; a body with neither is named.
    assert!(wharf_nomad::job_of_request(&minimal()).is_ok());
    assert!(wharf_nomad::job_of_request(&json!({"Foo": 1})).is_err());
}

#[test]
fn fields_nomad_fills_in_with_defaults_are_accepted() {
    let mut job = minimal();
    job["TaskGroups"][0]["Consul"] =
        json!({"Namespace": "", "Cluster": "default", "Partition": ""});
    job["TaskGroups"][0]["EphemeralDisk"] =
        json!({"Sticky": false, "Migrate": false, "SizeMB": 300});
    job["TaskGroups"][0]["Tasks"][0]["LogConfig"] =
        json!({"MaxFiles": 10, "MaxFileSizeMB": 10, "Disabled": false});
    job["NomadTokenID"] = json!("");
    job["Status"] = json!("running");
    job["Version"] = json!(3);
    let translated = translate(&job).unwrap();
    // Shown back as given.
    assert_eq!(translated.submitted["TaskGroups"][0]["EphemeralDisk"]["SizeMB"], 300);
}

#[test]
fn groups_and_counts_become_allocations() {
    let mut job = minimal();
    let mut second = job["TaskGroups"][0].clone();
    second["Name"] = json!("other");
    second["Count"] = json!(0);
    job["TaskGroups"].as_array_mut().unwrap().push(second);
    let translated = translate(&job).unwrap();
    let counts: Vec<(&str, u32)> =
        translated.groups.iter().map(|g| (g.name.as_str(), g.count)).collect();
    assert_eq!(counts, [("g", 1), ("other", 0)]);
    assert_eq!(translated.groups[1].job.groups[0].name, "other");
    assert_eq!(translated.job_type, JobType::Batch);
}

/// A group's and a task's `ShutdownDelay` (nanoseconds, as Nomad writes them) carry over; a
/// zero one is no delay.
#[test]
fn shutdown_delays_carry_over() {
    let mut job = minimal();
    job["TaskGroups"][0]["ShutdownDelay"] = json!(5_000_000_000u64);
    job["TaskGroups"][0]["Tasks"][0]["ShutdownDelay"] = json!(2_000_000_000u64);
    let translated = translate(&job).unwrap();
    let group = &translated.groups[0].job.groups[0];
    assert_eq!(group.shutdown_delay, Some(std::time::Duration::from_secs(5)));
    assert_eq!(group.tasks[0].shutdown_delay, Some(std::time::Duration::from_secs(2)));
    job["TaskGroups"][0]["ShutdownDelay"] = json!(0);
    let translated = translate(&job).unwrap();
    assert_eq!(translated.groups[0].job.groups[0].shutdown_delay, None);
}
