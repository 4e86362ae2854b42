//! Checks as they run: a task's checks resolved against its allocation's ports into
//! [`CheckPlan`]s, the HTTP request an http check sends, and how an answer is judged.
//!
//! - http: 2xx passes, 429 (Too Many Requests) warns, anything else is critical; so is no
//!   answer within the timeout. These are Consul's rules (Nomad's own checks pass any status
//!   below 400, having followed redirects; wharf's client follows none, so a 3xx is an
//!   answer the service should not give to its health check).
//! - tcp: an accepted connection passes.
//! - script: exit 0 passes, 1 warns, anything else is critical (Consul's and Nomad's rule).
//!
//! Output is kept to [`OUTPUT_LIMIT`] bytes, as Nomad keeps 3 KiB.

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use wharf_driver::ExecResult;
use wharf_state::service::{CheckKind, CheckRestartPolicy};
use wharf_state::{Allocation, CheckStatus, Task};

/// The most output a result keeps.
pub const OUTPUT_LIMIT: usize = 3 * 1024;

/// One check of an allocation, by the task, service and check names.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct CheckId {
    /// The task whose service it checks.
    pub task: String,
    /// The service.
    pub service: String,
    /// The check's name within the service.
    pub check: String,
}

impl fmt::Display for CheckId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}/{}", self.task, self.service, self.check)
    }
}

/// What one run of a check does.
#[derive(Debug, Clone)]
pub enum Probe {
    /// Send `request` to `addr`.
    Http {
        /// The service's address and port.
        addr: SocketAddr,
        /// The request, ready to send.
        request: Arc<HttpRequest>,
    },
    /// Connect to `addr`.
    Tcp {
        /// The service's address and port.
        addr: SocketAddr,
    },
    /// Run `command` inside the task.
    Script {
        /// The program and its arguments.
        command: Vec<String>,
    },
    /// The port label has no port in the allocation (it was placed without one): every run
    /// is critical and says so.
    NoPort {
        /// The label.
        label: String,
    },
}

/// A check, ready to run.
#[derive(Debug, Clone)]
pub struct CheckPlan {
    /// Which check.
    pub id: CheckId,
    /// http, tcp or script.
    pub kind: CheckKind,
    /// What each run does.
    pub probe: Probe,
    /// Time between runs.
    pub interval: Duration,
    /// The longest one run may take.
    pub timeout: Duration,
    /// When failures restart the task.
    pub restart: Option<CheckRestartPolicy>,
}

/// The checks of `task`'s services, resolved against `alloc`'s ports.
pub fn plans(alloc: &Allocation, task: &Task) -> Vec<CheckPlan> {
    let mut plans = Vec::new();
    for service in &task.services {
        for check in &service.checks {
            let probe = match check.kind {
                CheckKind::Script => Probe::Script {
                    command: check.command.iter().chain(&check.args).cloned().collect(),
                },
                kind => {
                    let label = service.check_port(check).unwrap_or_default();
                    match alloc.port(label) {
                        None => Probe::NoPort { label: label.to_owned() },
                        Some(port) if kind == CheckKind::Tcp => Probe::Tcp { addr: port.address() },
                        Some(port) => Probe::Http {
                            addr: port.address(),
                            request: Arc::new(HttpRequest::new(
                                check.request_method(),
                                &check.request_path(),
                                &port.address().to_string(),
                                &check.header,
                                check.body.as_deref(),
                            )),
                        },
                    }
                }
            };
            plans.push(CheckPlan {
                id: CheckId {
                    task: task.name.clone(),
                    service: service.name.clone(),
                    check: service.check_name(check),
                },
                kind: check.kind,
                probe,
                interval: check.interval,
                timeout: check.timeout,
                restart: service.check_restart(check),
            });
        }
    }
    plans
}

/// An HTTP/1.1 request, rendered once and sent on every run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpRequest {
    /// The method.
    pub method: String,
    /// The path and query.
    pub target: String,
    bytes: Vec<u8>,
}

impl HttpRequest {
    /// `method target` with `headers` and `body`. `Host` is `host` unless `headers` sets it,
    /// and so is the `User-Agent`. The connection is kept open for the next run (HTTP/1.1).
    pub fn new(
        method: &str,
        target: &str,
        host: &str,
        headers: &BTreeMap<String, Vec<String>>,
        body: Option<&str>,
    ) -> HttpRequest {
        let has = |name: &str| headers.keys().any(|k| k.eq_ignore_ascii_case(name));
        let mut text = format!("{method} {target} HTTP/1.1\r\n");
        if !has("host") {
            text.push_str(&format!("Host: {host}\r\n"));
        }
        if !has("user-agent") {
            text.push_str(concat!("User-Agent: wharf-health/", env!("CARGO_PKG_VERSION"), "\r\n"));
        }
        for (name, values) in headers {
            for value in values {
                text.push_str(&format!("{name}: {value}\r\n"));
            }
        }
        if let Some(body) = body {
            text.push_str(&format!("Content-Length: {}\r\n", body.len()));
        }
        text.push_str("\r\n");
        text.push_str(body.unwrap_or_default());
        HttpRequest {
            method: method.to_owned(),
            target: target.to_owned(),
            bytes: text.into_bytes(),
        }
    }

    /// The request as sent.
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// Whether an answer to it has a body (not for HEAD).
    pub fn has_body(&self) -> bool {
        !self.method.eq_ignore_ascii_case("HEAD")
    }
}

/// An answer to an http check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpReply {
    /// The status code.
    pub status: u16,
    /// The reason phrase.
    pub reason: String,
    /// The body, up to [`OUTPUT_LIMIT`]; read only for answers that do not pass.
    pub body: String,
}

/// Whether an answer with `status` passes, warns or is critical.
pub fn http_status(status: u16) -> CheckStatus {
    match status {
        200..=299 => CheckStatus::Passing,
        429 => CheckStatus::Warning,
        _ => CheckStatus::Critical,
    }
}

/// The status and output of an http answer.
pub fn judge_http(request: &HttpRequest, reply: &HttpReply) -> (CheckStatus, String) {
    let status = http_status(reply.status);
    let mut output =
        format!("HTTP {} {}: {} {}", request.method, request.target, reply.status, reply.reason);
    if !reply.body.is_empty() {
        output.push('\n');
        output.push_str(&reply.body);
    }
    (status, limit(output))
}

/// The status and output of a script's run.
pub fn judge_script(result: &ExecResult) -> (CheckStatus, String) {
    let status = match (result.exit.exit_code, result.exit.signal) {
        (0, None) => CheckStatus::Passing,
        (1, None) => CheckStatus::Warning,
        _ => CheckStatus::Critical,
    };
    let mut output = String::from_utf8_lossy(&result.stdout).into_owned();
    output.push_str(&String::from_utf8_lossy(&result.stderr));
    if status != CheckStatus::Passing && output.is_empty() {
        output = match (result.exit.signal, &result.exit.error) {
            (_, Some(error)) => error.clone(),
            (Some(signal), None) => format!("killed by signal {signal}"),
            (None, None) => format!("exit code {}", result.exit.exit_code),
        };
    }
    (status, limit(output))
}

/// `text` cut to at most [`OUTPUT_LIMIT`] bytes, at a character boundary.
pub fn limit(mut text: String) -> String {
    if text.len() > OUTPUT_LIMIT {
        let mut end = OUTPUT_LIMIT;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use wharf_driver::ExitResult;
    use wharf_state::spec;

    const JOB: &str = r#"
[job]
id = "j"
type = "service"
[group]
name = "g"
[group.network.port.http]
[group.network.port.admin]
[[group.task]]
name = "web"
driver = "mock"
[[group.task.service]]
name = "web"
port = "http"
check_restart = { limit = 2 }
[[group.task.service.check]]
name = "alive"
type = "http"
path = "health?deep=1"
method = "HEAD"
header = { Host = ["example.test"], X-Probe = ["a", "b"] }
interval = "5s"
timeout = "2s"
[[group.task.service.check]]
name = "admin"
type = "tcp"
port = "admin"
interval = "10s"
timeout = "1s"
[[group.task.service.check]]
name = "script"
type = "script"
command = "/bin/check"
args = ["--quick"]
interval = "30s"
timeout = "3s"
"#;

    fn allocation(ports: &[(&str, u16)]) -> Allocation {
        Allocation {
            id: "a1".into(),
            job: spec::parse_toml(JOB).unwrap(),
            task_group: "g".into(),
            desired_status: wharf_state::DesiredStatus::Run,
            modify_index: 1,
            deployment_id: None,
            ports: ports
                .iter()
                .map(|(label, value)| wharf_state::AllocatedPort {
                    label: (*label).into(),
                    value: *value,
                    host_ip: [127, 0, 0, 1].into(),
                })
                .collect(),
        }
    }

    /// Nomad's `TestChecks_GetCheckQuery`, as far as wharf's checks have its fields: each
    /// check's kind, target, timing and restart policy come from the spec and the ports.
    #[test]
    fn plans_resolve_ports_and_settings() {
        let alloc = allocation(&[("http", 20_001), ("admin", 20_002)]);
        let task = &alloc.job.groups[0].tasks[0];
        let plans = plans(&alloc, task);
        let [alive, admin, script] = &plans[..] else { panic!("{plans:?}") };
        assert_eq!(alive.id.to_string(), "web/web/alive");
        assert_eq!(
            (alive.interval, alive.timeout),
            (Duration::from_secs(5), Duration::from_secs(2))
        );
        assert_eq!(alive.restart.map(|r| r.limit), Some(2));
        let Probe::Http { addr, request } = &alive.probe else { panic!("{alive:?}") };
        assert_eq!(addr.to_string(), "127.0.0.1:20001");
        assert_eq!(
            std::str::from_utf8(request.bytes()).unwrap(),
            "HEAD /health?deep=1 HTTP/1.1\r\nUser-Agent: wharf-health/0.1.0\r\nHost: example.test\r\n\
             X-Probe: a\r\nX-Probe: b\r\n\r\n"
        );
        assert!(!request.has_body());
        assert!(matches!(admin.probe, Probe::Tcp { addr } if addr.port() == 20_002));
        assert!(
            matches!(&script.probe, Probe::Script { command } if command == &["/bin/check", "--quick"])
        );

        let unplaced = allocation(&[("http", 20_001)]);
        let resolved = super::plans(&unplaced, &unplaced.job.groups[0].tasks[0]);
        assert!(matches!(&resolved[1].probe, Probe::NoPort { label } if label == "admin"));
    }

    #[test]
    fn requests_with_a_body_say_its_length() {
        let request = HttpRequest::new("POST", "/", "h:1", &BTreeMap::new(), Some("some payload"));
        assert!(std::str::from_utf8(request.bytes()).unwrap().ends_with(
            "Host: h:1\r\nUser-Agent: wharf-health/0.1.0\r\nContent-Length: 12\r\n\r\nsome payload"
        ));
    }

    /// Nomad's `TestChecker_Do_HTTP` statuses, with Consul's rule for 429.
    #[test]
    fn http_answers_are_judged_by_status() {
        let request = HttpRequest::new("GET", "/fail", "h:1", &BTreeMap::new(), None);
        let reply =
            |status, body: &str| HttpReply { status, reason: "R".into(), body: body.into() };
        for (status, want) in [
            (200, CheckStatus::Passing),
            (201, CheckStatus::Passing),
            (204, CheckStatus::Passing),
            (301, CheckStatus::Critical),
            (404, CheckStatus::Critical),
            (429, CheckStatus::Warning),
            (500, CheckStatus::Critical),
            (503, CheckStatus::Critical),
        ] {
            assert_eq!(judge_http(&request, &reply(status, "")).0, want, "{status}");
        }
        assert_eq!(
            judge_http(&request, &reply(500, "500 problem")).1,
            "HTTP GET /fail: 500 R\n500 problem"
        );
        // "500 truncate": a long body is cut to the limit.
        let long = judge_http(&request, &reply(500, &"a".repeat(OUTPUT_LIMIT + 5))).1;
        assert_eq!(long.len(), OUTPUT_LIMIT);
        assert_eq!(
            limit("é".repeat(OUTPUT_LIMIT)).len(),
            OUTPUT_LIMIT,
            "cut at a character boundary"
        );
    }

    #[test]
    fn scripts_are_judged_by_exit_code() {
        let run = |code, signal, out: &str| ExecResult {
            stdout: out.as_bytes().to_vec(),
            stderr: Vec::new(),
            exit: ExitResult { exit_code: code, signal, oom_killed: false, error: None },
        };
        assert_eq!(judge_script(&run(0, None, "ok\n")), (CheckStatus::Passing, "ok\n".into()));
        assert_eq!(judge_script(&run(1, None, "slow")), (CheckStatus::Warning, "slow".into()));
        assert_eq!(judge_script(&run(2, None, "")), (CheckStatus::Critical, "exit code 2".into()));
        assert_eq!(
            judge_script(&run(0, Some(9), "")),
            (CheckStatus::Critical, "killed by signal 9".into())
        );
    }
}
