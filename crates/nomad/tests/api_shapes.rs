//! wharf's Nomad shapes against a fixture of Nomad's `api` structs (field names and JSON
//! types): a renamed, missing or retyped field fails here before any client sees it.

use serde_json::{Value, json};
use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;
use wharf_nomad::shapes::{self, AllocContext};
use wharf_state::{
    AllocState, Allocation, ClientStatus, TaskEvent, TaskEventKind, TaskState, Timestamp,
};

fn fixture() -> BTreeMap<String, Vec<(String, String)>> {
    let path = format!("{}/tests/fixtures/nomad-api-fields.txt", env!("CARGO_MANIFEST_DIR"));
    let mut structs: BTreeMap<String, Vec<(String, String)>> = BTreeMap::new();
    for line in std::fs::read_to_string(path).unwrap().lines() {
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let [name, field, kind]: [&str; 3] =
            line.split_whitespace().collect::<Vec<_>>().try_into().unwrap();
        structs.entry(name.to_owned()).or_default().push((field.to_owned(), kind.to_owned()));
    }
    structs
}

fn type_of(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "bool",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// Every field of `name` in the fixture is in `value`, with its type.
fn check(name: &str, value: &Value, fixture: &BTreeMap<String, Vec<(String, String)>>) {
    let fields = fixture.get(name).unwrap_or_else(|| panic!("{name} is not in the fixture"));
    let object = value.as_object().unwrap_or_else(|| panic!("{name} is not an object"));
    for (field, kind) in fields {
        let found = object.get(field).unwrap_or_else(|| panic!("{name}.{field} is missing"));
        let (nullable, kind) = match kind.strip_prefix('?') {
            Some(kind) => (true, kind),
            None => (false, kind.as_str()),
        };
        let actual = type_of(found);
        assert!(
            actual == kind || (nullable && actual == "null"),
            "{name}.{field} is {actual}, Nomad's api has {kind}"
        );
    }
}

fn sample_alloc() -> (Allocation, AllocState) {
    let job = wharf_nomad::translate(&json!({
        "ID": "shape", "Type": "service",
        "TaskGroups": [{"Name": "g", "Tasks": [{"Name": "t", "Driver": "raw_exec", "Config": {"command": "/bin/true"}}]}]
    }))
    .unwrap();
    let alloc = Allocation::new("a1", job.groups[0].job.clone(), "g");
    let mut task = TaskState::new();
    task.events = VecDeque::from([
        TaskEvent::new(Timestamp(1_000), TaskEventKind::Received),
        TaskEvent::new(
            Timestamp(2_000),
            TaskEventKind::Terminated {
                exit_code: 2,
                signal: None,
                oom_killed: false,
                message: None,
            },
        ),
        TaskEvent::new(
            Timestamp(3_000),
            TaskEventKind::Restarting { delay: Duration::from_secs(1), reason: "policy".into() },
        ),
    ]);
    let state = AllocState {
        client_status: ClientStatus::Running,
        client_description: "Tasks are running".into(),
        task_states: BTreeMap::from([("t".to_owned(), task)]),
        deployment_status: None,
    };
    (alloc, state)
}

#[test]
fn allocation_shapes_match_nomads_api() {
    let fixture = fixture();
    let (alloc, state) = sample_alloc();
    let job = json!({"ID": "shape"});
    let context = AllocContext {
        node_id: "n",
        node_name: "node",
        namespace: "default",
        name: "shape.g[0]",
        eval_id: "e",
        job: &job,
        created: Timestamp(500),
        create_index: 500,
    };
    let nomad = shapes::allocation(&alloc, &state, &context);
    assert_eq!(nomad.modify_index, 3_000, "the index is the time of the last change");
    assert_eq!(nomad.create_time, 500_000_000);
    let value = serde_json::to_value(&nomad).unwrap();
    check("Allocation", &value, &fixture);
    check("TaskState", &value["TaskStates"]["t"], &fixture);
    for event in value["TaskStates"]["t"]["Events"].as_array().unwrap() {
        check("TaskEvent", event, &fixture);
    }
    let events: Vec<&str> = value["TaskStates"]["t"]["Events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["Type"].as_str().unwrap())
        .collect();
    assert_eq!(events, ["Received", "Terminated", "Restarting"]);
    let stub = serde_json::to_value(shapes::AllocationListStub::from(&nomad)).unwrap();
    check("AllocationListStub", &stub, &fixture);
}

#[test]
fn node_evaluation_and_job_shapes_match_nomads_api() {
    let fixture = fixture();
    let node = shapes::Node {
        id: "n".into(),
        name: "node".into(),
        datacenter: "dc1".into(),
        node_class: String::new(),
        node_pool: "default".into(),
        http_addr: "127.0.0.1:4646".into(),
        tls_enabled: false,
        attributes: BTreeMap::new(),
        node_resources: shapes::NodeResources {
            cpu: shapes::NodeCpuResources {
                cpu_shares: 4000,
                total_cpu_cores: 2,
                reservable_cpu_cores: vec![0, 1],
            },
            memory: shapes::NodeMemoryResources { memory_mb: 2048 },
            disk: shapes::NodeDiskResources { disk_mb: 0 },
            networks: Vec::new(),
            min_dynamic_port: 20000,
            max_dynamic_port: 32000,
        },
        meta: BTreeMap::new(),
        drain: false,
        scheduling_eligibility: "eligible".into(),
        status: "ready".into(),
        status_description: String::new(),
        status_updated_at: 0,
        drivers: BTreeMap::from([(
            "raw_exec".to_owned(),
            shapes::DriverInfo {
                attributes: BTreeMap::new(),
                detected: true,
                healthy: true,
                health_description: "Healthy".into(),
                update_time: shapes::ZERO_TIME.into(),
            },
        )]),
        create_index: 1,
        modify_index: 1,
    };
    let value = serde_json::to_value(&node).unwrap();
    check("Node", &value, &fixture);
    check("NodeResources", &value["NodeResources"], &fixture);
    check("DriverInfo", &value["Drivers"]["raw_exec"], &fixture);
    let stub = shapes::NodeListStub::of(&node, "0.1.0");
    assert_eq!(stub.address, "127.0.0.1");
    check("NodeListStub", &serde_json::to_value(&stub).unwrap(), &fixture);

    let eval = shapes::Evaluation {
        id: "e".into(),
        priority: 50,
        eval_type: "service".into(),
        triggered_by: "job-register".into(),
        namespace: "default".into(),
        job_id: "j".into(),
        job_modify_index: 1,
        node_id: String::new(),
        deployment_id: String::new(),
        status: "complete".into(),
        status_description: String::new(),
        next_eval: String::new(),
        previous_eval: String::new(),
        blocked_eval: String::new(),
        failed_t_g_allocs: None,
        queued_allocations: BTreeMap::new(),
        snapshot_index: 1,
        create_index: 1,
        modify_index: 1,
        create_time: 1,
        modify_time: 1,
    };
    check("Evaluation", &serde_json::to_value(&eval).unwrap(), &fixture);

    let mut summary = shapes::TaskGroupSummary::default();
    summary.add(ClientStatus::Running);
    let stub = shapes::JobListStub {
        id: "j".into(),
        parent_id: String::new(),
        name: "j".into(),
        namespace: "default".into(),
        datacenters: vec!["*".into()],
        job_type: "service".into(),
        priority: 50,
        periodic: false,
        parameterized_job: false,
        stop: false,
        status: "running".into(),
        status_description: String::new(),
        job_summary: shapes::JobSummary {
            job_id: "j".into(),
            namespace: "default".into(),
            summary: BTreeMap::from([("g".to_owned(), summary)]),
            create_index: 1,
            modify_index: 1,
        },
        create_index: 1,
        modify_index: 1,
        job_modify_index: 1,
        submit_time: 1,
        meta: BTreeMap::new(),
    };
    let value = serde_json::to_value(&stub).unwrap();
    check("JobListStub", &value, &fixture);
    check("JobSummary", &value["JobSummary"], &fixture);
    check("TaskGroupSummary", &value["JobSummary"]["Summary"]["g"], &fixture);
    assert_eq!(value["JobSummary"]["Summary"]["g"]["Running"], 1);

    let register = shapes::JobRegisterResponse {
        eval_id: "e".into(),
        eval_create_index: 1,
        job_modify_index: 1,
        warnings: String::new(),
        last_index: 1,
        request_time: 0,
    };
    check("JobRegisterResponse", &serde_json::to_value(&register).unwrap(), &fixture);
    let validate = shapes::JobValidateResponse {
        driver_config_validated: true,
        validation_errors: vec![],
        error: String::new(),
        warnings: String::new(),
    };
    check("JobValidateResponse", &serde_json::to_value(&validate).unwrap(), &fixture);
    let frame = shapes::StreamFrame {
        offset: 0,
        data: String::new(),
        file: "alloc/logs/t.stdout.0".into(),
        file_event: String::new(),
    };
    check("StreamFrame", &serde_json::to_value(&frame).unwrap(), &fixture);
    let info = shapes::AllocFileInfo {
        name: "alloc".into(),
        is_dir: true,
        size: 0,
        file_mode: "drwxr-xr-x".into(),
        mod_time: shapes::ZERO_TIME.into(),
        content_type: String::new(),
    };
    check("AllocFileInfo", &serde_json::to_value(&info).unwrap(), &fixture);
}
