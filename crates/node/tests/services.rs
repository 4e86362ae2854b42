//! Services, ports, checks, check_restart and allocation health end to end: the real `wharf`
//! agent running real HTTP servers (`python3 -m http.server`) under raw_exec on the ports it
//! gives them, checked over real sockets, killed with SIGKILL and restarted.

// Real processes on the real clock: these tests start programs and wait in real time.
#![allow(clippy::disallowed_methods)]

mod common;

use common::*;
use hyper::{Method, StatusCode};
use std::path::Path;
use wharf_node::api::AllocDetail;
use wharf_node::client::{ApiPath, Client, ClientError};
use wharf_state::{CheckStatus, ServiceEntry, TaskEventKind};

/// The interpreter the servers run on; tasks get a fixed PATH, so it must be a system one.
const PYTHON: &str = "/usr/bin/python3";

fn python() {
    assert!(
        Path::new(PYTHON).exists(),
        "{PYTHON} is missing: install the python3 package (apt-get install python3); these tests run `python3 -m http.server` as a task"
    );
}

/// Node configuration giving the agent its own range of dynamic ports, so tests running at
/// once never hand out the same port.
fn ports(min: u16, max: u16) -> String {
    format!("[network]\nmin_dynamic_port = {min}\nmax_dynamic_port = {max}\n")
}

/// A job whose task `server` serves its own directory over HTTP on its dynamic port `http`,
/// as service `web` with an http check on `check_path` and a script check, run inside the
/// task through raw_exec's exec, that says the address the task was given; `extra` goes into
/// the http check, `update` into the group, `prepare` runs in the shell before the server.
fn web_job(id: &str, update: &str, check_path: &str, extra: &str, prepare: &str) -> String {
    format!(
        r#"[job]
id = "{id}"
type = "service"

[group]
name = "g"
restart = {{ attempts = 3, interval = "5m", delay = "1s", mode = "fail" }}

[group.network.port.http]

{update}

[[group.task]]
name = "server"
driver = "raw_exec"
kill_timeout = "2s"
config = {{ command = "/bin/sh", args = ["-c", "{prepare}exec {PYTHON} -m http.server $WHARF_PORT_http --bind $WHARF_IP_http --directory $WHARF_TASK_DIR"] }}

[[group.task.service]]
name = "web"
port = "http"
tags = ["v1", "e2e"]

[[group.task.service.check]]
name = "alive"
type = "http"
path = "{check_path}"
interval = "1s"
timeout = "1s"
{extra}

[[group.task.service.check]]
name = "script"
type = "script"
command = "/bin/sh"
args = ["-c", "echo serving on $WHARF_ADDR_http"]
interval = "1s"
timeout = "5s"
"#
    )
}

/// The output a passing script check of `web_job` gives for `port`.
fn script_output(port: &wharf_state::AllocatedPort) -> String {
    format!("serving on {}\n", port.address())
}

const QUICK_HEALTH: &str =
    "[group.update]\nmin_healthy_time = \"2s\"\nhealthy_deadline = \"25s\"\n";

fn healthy(detail: &AllocDetail) -> Option<bool> {
    detail.state.deployment_status.as_ref().and_then(|d| d.healthy)
}

async fn services(client: &Client) -> Vec<ServiceEntry> {
    client.json(Method::GET, ApiPath::v1(["services"]), None).await.unwrap()
}

fn stdout(output: &std::process::Output) -> String {
    assert!(output.status.success(), "{output:?}");
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// A real HTTP server task on its dynamic port becomes healthy; its service is listed with
/// its address, port, tags and health through the API and the CLI, and its check shows in
/// `wharf alloc status` and the metrics.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http_server_on_its_dynamic_port_becomes_healthy() {
    python();
    let dir = tempfile::tempdir().unwrap();
    let mut agent = AgentProcess::start(dir.path(), &ports(21_000, 21_099));
    let client = agent.client();
    let id = submit(&client, &web_job("web", QUICK_HEALTH, "/", "", "")).await.unwrap();
    let detail = until(&client, &id, "healthy", |d| healthy(d).is_some()).await;
    assert_eq!(healthy(&detail), Some(true), "{:#?}", detail.state);
    let port = &detail.alloc.ports[0];
    assert_eq!(port.label, "http");
    assert!((21_000..=21_099).contains(&port.value), "{port:?}");
    assert_eq!(detail.checks[0].status, CheckStatus::Passing);
    assert_eq!(detail.checks[0].last.as_ref().unwrap().status_code, Some(200));
    // The script ran inside the task, through the driver's exec, with the task's environment.
    let script = &detail.checks[1];
    assert_eq!((script.check.as_str(), script.status), ("script", CheckStatus::Passing));
    assert_eq!(script.last.as_ref().unwrap().output, script_output(port));

    let listed = services(&client).await;
    assert_eq!(listed.len(), 1);
    let web = &listed[0];
    assert_eq!(
        (web.name.as_str(), web.address, web.port, web.health),
        ("web", Some(port.host_ip), Some(port.value), CheckStatus::Passing)
    );
    assert_eq!(web.tags, ["v1", "e2e"]);
    assert_eq!((web.alloc_id.as_str(), web.task.as_str()), (id.as_str(), "server"));

    let list = stdout(&agent.cli(&["service", "list"]));
    assert!(list.contains("web") && list.contains(&port.address().to_string()), "{list}");
    assert!(list.contains("passing") && list.contains("v1,e2e"), "{list}");
    let status = stdout(&agent.cli(&["alloc", "status", &id]));
    assert!(status.contains("Health   = healthy"), "{status}");
    assert!(status.contains(&format!("Ports    = http {}", port.address())), "{status}");
    assert!(status.contains("alive") && status.contains("passing"), "{status}");

    let metrics = client.call(Method::GET, "/v1/metrics", None).await.unwrap();
    let metrics = String::from_utf8_lossy(&metrics);
    let series = format!(
        "wharf_check_passing{{alloc_id=\"{id}\",task=\"server\",service=\"web\",check=\"alive\"}} 1\n"
    );
    assert!(metrics.contains(&series), "{metrics}");
    assert!(metrics.contains("wharf_alloc_health{health=\"healthy\"} 1\n"), "{metrics}");
    assert!(metrics.contains("wharf_services 1\n") && metrics.contains("wharf_ports_held 1\n"));
    if let Err(problems) = wharf_tests::promtool::check_metrics(&metrics) {
        panic!("the agent's metrics fail Prometheus' linter: {problems}\nin:\n{metrics}");
    }

    // Stopped: out of the catalog, its port back.
    client.call(Method::POST, ApiPath::v1(["allocations", &id, "stop"]), None).await.unwrap();
    until(&client, &id, "stopped", |d| d.done).await;
    assert!(services(&client).await.is_empty());
    let metrics = client.call(Method::GET, "/v1/metrics", None).await.unwrap();
    assert!(String::from_utf8_lossy(&metrics).contains("wharf_ports_held 0\n"));
    assert!(agent.terminate().success());
}

/// The same server made to fail its check (the file it serves is removed) is restarted by
/// check_restart, through its restart policy, with an event that names the check; restarted,
/// it serves the file again and passes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_failing_its_check_is_restarted_by_check_restart() {
    python();
    let dir = tempfile::tempdir().unwrap();
    let mut agent = AgentProcess::start(dir.path(), &ports(21_100, 21_199));
    let client = agent.client();
    let spec = web_job(
        "flaky",
        QUICK_HEALTH,
        "/alive",
        "check_restart = { limit = 2, grace = \"1s\" }",
        "echo ok > $WHARF_TASK_DIR/alive && ",
    );
    let id = submit(&client, &spec).await.unwrap();
    until(&client, &id, "healthy", |d| healthy(d) == Some(true)).await;
    std::fs::remove_file(agent.data_dir.join(format!("allocs/{id}/server/alive"))).unwrap();
    let restarted =
        until(&client, &id, "restarted", |d| d.state.task_states["server"].restarts >= 1).await;
    let events = &restarted.state.task_states["server"].events;
    assert!(
        events.iter().any(|e| e.kind
            == TaskEventKind::RestartSignaled {
                reason: "healthcheck: check \"alive\" unhealthy".into()
            }),
        "{events:#?}"
    );
    let passing = until(&client, &id, "passing again", |d| {
        d.checks[0].status == CheckStatus::Passing
            && d.state.task_states["server"]
                .events
                .back()
                .is_some_and(|e| e.kind.title() != "Restarting")
    })
    .await;
    assert_eq!(passing.state.task_states["server"].restarts, 1, "restarted once");
    assert_eq!(healthy(&passing), Some(true), "a judged allocation stays judged");
    // The node's counter has the restart too: it reads the task states, which count exactly.
    let metrics = client.call(Method::GET, "/v1/metrics", None).await.unwrap();
    let metrics = String::from_utf8_lossy(&metrics);
    assert!(metrics.contains("wharf_task_restarts_total 1\n"), "{metrics}");
    assert!(agent.terminate().success());
}

/// A service that never answers is unhealthy at its healthy_deadline, with the reason in its
/// deployment status, on its task's events and in `wharf alloc status`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_that_never_answers_is_unhealthy_at_its_deadline() {
    let dir = tempfile::tempdir().unwrap();
    let mut agent = AgentProcess::start(dir.path(), &ports(21_200, 21_299));
    let client = agent.client();
    let spec = job(
        "silent",
        "service",
        "[group.network.port.http]\n\
         [group.update]\nmin_healthy_time = \"1s\"\nhealthy_deadline = \"4s\"\n\
         [[group.task]]\nname = \"sleeper\"\ndriver = \"raw_exec\"\n\
         config = { command = \"/bin/sleep\", args = [\"600\"] }\n\
         [[group.task.service]]\nname = \"web\"\nport = \"http\"\n\
         [[group.task.service.check]]\ntype = \"tcp\"\ninterval = \"1s\"\ntimeout = \"1s\"\n",
    );
    let id = submit(&client, &spec).await.unwrap();
    let detail = until(&client, &id, "judged", |d| healthy(d).is_some()).await;
    let status = detail.state.deployment_status.as_ref().unwrap();
    assert_eq!(status.healthy, Some(false));
    assert_eq!(
        status.description.as_deref(),
        Some(
            "not healthy by its healthy_deadline of 4s; task \"sleeper\": Services not healthy by deadline: web"
        )
    );
    assert!(detail.state.task_states["sleeper"].events.iter().any(|e| e.kind
        == TaskEventKind::AllocUnhealthy {
            message: "Services not healthy by deadline: web".into()
        }));
    let check = &detail.checks[0];
    assert_eq!(check.status, CheckStatus::Critical);
    assert!(check.last.as_ref().unwrap().output.contains("Connection refused"), "{check:?}");
    let shown = stdout(&agent.cli(&["alloc", "status", &id]));
    assert!(shown.contains("Health   = unhealthy at "), "{shown}");
    assert!(shown.contains("Services not healthy by deadline: web"), "{shown}");
    assert_eq!(services(&client).await[0].health, CheckStatus::Critical);
    assert!(agent.terminate().success());
}

fn sleeper_with_ports(id: &str, ports: &str) -> String {
    job(
        id,
        "service",
        &format!(
            "{ports}[[group.task]]\nname = \"sleep\"\ndriver = \"raw_exec\"\n\
             config = {{ command = \"/bin/sleep\", args = [\"600\"] }}\n"
        ),
    )
}

async fn refused(client: &Client, spec: &str) -> String {
    match submit(client, spec).await {
        Err(ClientError::Api { status, message }) => {
            assert_eq!(status, StatusCode::CONFLICT, "{message}");
            message
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
}

/// Admission refuses an allocation whose static port is held, or used by another program
/// (naming the port and its label), or whose dynamic ports the range cannot give (naming the
/// label and the range); nothing of a refused one is kept. A port comes back when its allocation ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn port_conflicts_and_exhaustion_are_refused_naming_the_port() {
    let dir = tempfile::tempdir().unwrap();
    let mut agent = AgentProcess::start(dir.path(), &ports(21_300, 21_300));
    let client = agent.client();
    let first =
        submit(&client, &sleeper_with_ports("a", "[group.network.port.http]\n")).await.unwrap();
    let detail = until(&client, &first, "running", |d| !d.alloc.ports.is_empty()).await;
    assert_eq!(detail.alloc.ports[0].value, 21_300);

    // Nothing is left of the range: the label that asked, and the range, as the README says.
    let exhausted = "the allocation's ports are not available on this node: no dynamic port \
                     left for label \"http\": all of 21300-21300 are held or in use (1 held by \
                     allocations)";
    let message = refused(&client, &sleeper_with_ports("b", "[group.network.port.http]\n")).await;
    assert_eq!(message, exhausted);
    let message =
        refused(&client, &sleeper_with_ports("c", "[group.network.port.db]\nstatic = 21300\n"))
            .await;
    assert!(
        message.contains(&format!("static port 21300 (label \"db\") is already held by allocation {first} (label \"http\")")),
        "{message}"
    );
    let foreign = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let taken = foreign.local_addr().unwrap().port();
    let message = refused(
        &client,
        &sleeper_with_ports("d", &format!("[group.network.port.x]\nstatic = {taken}\n")),
    )
    .await;
    assert!(
        message.contains(&format!(
            "static port {taken} (label \"x\") is in use on this node by another program"
        )),
        "{message}"
    );
    let listed: Vec<wharf_node::api::AllocSummary> =
        client.json(Method::GET, "/v1/allocations", None).await.unwrap();
    assert_eq!(listed.len(), 1, "nothing of a refused allocation is kept");
    // The CLI says the same, as a request the agent refused (exit 2).
    let spec_file = dir.path().join("b.toml");
    std::fs::write(&spec_file, sleeper_with_ports("b", "[group.network.port.http]\n")).unwrap();
    let run = agent.cli(&["run", "--detach", spec_file.to_str().unwrap()]);
    assert_eq!(run.status.code(), Some(2), "{run:?}");
    assert_eq!(String::from_utf8_lossy(&run.stderr), format!("wharf: {exhausted}\n"), "{run:?}");

    client.call(Method::POST, ApiPath::v1(["allocations", &first, "stop"]), None).await.unwrap();
    until(&client, &first, "stopped", |d| d.done).await;
    let second =
        submit(&client, &sleeper_with_ports("b", "[group.network.port.http]\n")).await.unwrap();
    let detail = until(&client, &second, "placed", |d| !d.alloc.ports.is_empty()).await;
    assert_eq!(detail.alloc.ports[0].value, 21_300, "the port came back");
    assert!(agent.terminate().success());
}

/// After a SIGKILL of the agent and a restart: the allocation's ports stay held, its checks
/// run again, its service is listed again, and its health, judged before, is not judged again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restarts_keep_ports_checks_and_health() {
    python();
    let dir = tempfile::tempdir().unwrap();
    let agent = AgentProcess::start(dir.path(), &ports(21_400, 21_499));
    let client = agent.client();
    let id = submit(&client, &web_job("web", QUICK_HEALTH, "/", "", "")).await.unwrap();
    let before = until(&client, &id, "healthy", |d| healthy(d) == Some(true)).await;
    let (data_dir, config) = agent.kill9();

    let mut agent = AgentProcess::launch(data_dir, config);
    let client = agent.client();
    // Both checks run again: the http one over the network, the script one through the
    // driver's exec into the reattached task.
    let after = until(&client, &id, "checked again", |d| {
        d.checks.iter().all(|c| c.last.as_ref().is_some_and(|r| r.status == CheckStatus::Passing))
    })
    .await;
    assert_eq!(
        after.checks[1].last.as_ref().unwrap().output,
        script_output(&before.alloc.ports[0])
    );
    assert_eq!(after.alloc.ports, before.alloc.ports, "the ports are held still");
    assert_eq!(after.state.deployment_status, before.state.deployment_status, "not judged again");
    assert!(
        after.state.task_states["server"]
            .events
            .iter()
            .any(|e| e.kind == TaskEventKind::Reattached)
    );
    let port = before.alloc.ports[0].value;
    let message = refused(
        &client,
        &sleeper_with_ports("other", &format!("[group.network.port.p]\nstatic = {port}\n")),
    )
    .await;
    assert!(
        message.contains(&format!(
            "static port {port} (label \"p\") is already held by allocation {id}"
        )),
        "{message}"
    );
    let listed = services(&client).await;
    assert_eq!((listed.len(), listed[0].port), (1, Some(port)));
    assert!(agent.terminate().success());
}

/// `wharf_check_runs_total` from the agent's metrics.
async fn check_runs(client: &Client) -> f64 {
    let text = client.call(Method::GET, "/v1/metrics", None).await.unwrap();
    String::from_utf8_lossy(&text)
        .lines()
        .find_map(|l| l.strip_prefix("wharf_check_runs_total ")?.parse().ok())
        .expect("wharf_check_runs_total is exported")
}

/// `wharf_check_runs_total` is a counter: the runs of an allocation's checks stay counted
/// after the allocation is garbage-collected.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_runs_stay_counted_after_garbage_collection() {
    let dir = tempfile::tempdir().unwrap();
    let config = format!("{}[gc]\nmax_allocs = 0\ninterval = \"100ms\"\n", ports(21_500, 21_599));
    let mut agent = AgentProcess::start(dir.path(), &config);
    let client = agent.client();
    let spec = job(
        "counted",
        "batch",
        "[[group.task]]\nname = \"t\"\ndriver = \"raw_exec\"\n\
         config = { command = \"/bin/sleep\", args = [\"600\"] }\n\
         [[group.task.service]]\nname = \"s\"\n\
         [[group.task.service.check]]\ntype = \"script\"\ncommand = \"/bin/true\"\n\
         interval = \"1s\"\ntimeout = \"2s\"\n",
    );
    let id = submit(&client, &spec).await.unwrap();
    until(&client, &id, "checked", |d| d.checks[0].last.is_some()).await;
    let counted = check_runs(&client).await;
    assert!(counted >= 1.0, "{counted}");
    client.call(Method::POST, ApiPath::v1(["allocations", &id, "stop"]), None).await.unwrap();
    let collected = async {
        loop {
            let list: Vec<wharf_node::api::AllocSummary> =
                client.json(Method::GET, "/v1/allocations", None).await.unwrap();
            if list.is_empty() {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    };
    tokio::time::timeout(LIMIT, collected).await.expect("the allocation is collected");
    let after = check_runs(&client).await;
    assert!(after >= counted, "the total went down from {counted} to {after}");
    assert!(agent.terminate().success());
}
