//! What a job says about its network and its health: the group's ports (`network`), the
//! services a task offers with their checks (`service`, `check`, `check_restart`), and how the
//! group's health is judged (`update`). Field names follow Nomad's job spec.
//!
//! ```toml
//! [group.network.port.http]          # a dynamic port, from the node's range
//! [group.network.port.admin]
//! static = 9000                      # a fixed one
//!
//! [group.update]
//! health_check = "checks"            # checks | task_states | manual
//! min_healthy_time = "10s"
//! healthy_deadline = "5m"
//!
//! [[group.task.service]]
//! name = "web"
//! port = "http"
//! tags = ["v1"]
//!
//! [[group.task.service.check]]
//! type = "http"                      # http | tcp | script
//! path = "/health"
//! interval = "10s"
//! timeout = "2s"
//! check_restart = { limit = 3, grace = "30s" }
//! on_update = "require_healthy"      # require_healthy | ignore_warnings | ignore
//! ```
//!
//! Validation lives here with the types (called from [`crate::Job::validate`]), so every
//! problem is reported with its field: `group.task[0].service[1].check[0].path`.
//!
//! Where wharf differs from Nomad on purpose: services belong to tasks (no group-level
//! services, since script checks run inside a task); the only provider is the node's own
//! (`provider = "nomad"` is accepted, `consul` is not); ports are host ports with no `to`
//! mapping (tasks run in the host's network namespace); http checks speak plain HTTP, so
//! `protocol = "https"` is refused rather than silently downgraded. Checks warn (an HTTP 429,
//! a script exiting 1) as Consul's do, so `on_update = "ignore_warnings"` is offered for
//! every check, where Nomad offers it only for checks run by Consul.

use crate::duration::{self, Formatted};
use crate::problems::Problems;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

/// The ports an allocation of the group holds on the node: `network.port.<label>`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Network {
    /// Each port by its label; tasks see `WHARF_PORT_<label>`, `WHARF_IP_<label>` and
    /// `WHARF_ADDR_<label>`.
    #[serde(default, rename = "port")]
    pub ports: BTreeMap<String, PortSpec>,
}

/// One port the group asks for.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PortSpec {
    /// A fixed port number; without one, the node picks a free port from its dynamic range.
    #[serde(default, rename = "static", skip_serializing_if = "Option::is_none")]
    pub static_port: Option<u16>,
}

/// How a group's health is judged: Nomad's `update` block, as far as one node can use it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UpdateStrategy {
    /// What healthy means.
    #[serde(default)]
    pub health_check: HealthCheck,
    /// How long tasks (and checks) must be running (and passing) before the allocation is
    /// healthy.
    #[serde(default = "UpdateStrategy::default_min_healthy_time", with = "duration::serde_str")]
    pub min_healthy_time: Duration,
    /// An allocation not healthy by then is unhealthy.
    #[serde(default = "UpdateStrategy::default_healthy_deadline", with = "duration::serde_str")]
    pub healthy_deadline: Duration,
}

impl UpdateStrategy {
    fn default_min_healthy_time() -> Duration {
        Duration::from_secs(10)
    }

    fn default_healthy_deadline() -> Duration {
        Duration::from_secs(300)
    }

    fn problems(&self, problems: &mut Problems, at: &str) {
        if self.healthy_deadline.is_zero() {
            problems.add(&format!("{at}.healthy_deadline"), "must be greater than zero".into());
        } else if self.min_healthy_time >= self.healthy_deadline {
            problems.add(
                &format!("{at}.min_healthy_time"),
                format!(
                    "{} must be shorter than healthy_deadline ({})",
                    Formatted(self.min_healthy_time),
                    Formatted(self.healthy_deadline)
                ),
            );
        }
    }
}

impl Default for UpdateStrategy {
    /// Nomad's defaults: checks, 10s, 5m.
    fn default() -> Self {
        UpdateStrategy {
            health_check: HealthCheck::default(),
            min_healthy_time: UpdateStrategy::default_min_healthy_time(),
            healthy_deadline: UpdateStrategy::default_healthy_deadline(),
        }
    }
}

/// What makes an allocation healthy.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HealthCheck {
    /// Every task runs and every check passes, for `min_healthy_time`.
    #[default]
    Checks,
    /// Every task runs for `min_healthy_time`; checks do not count.
    TaskStates,
    /// Nothing is judged on the node; an operator sets health.
    Manual,
}

/// How a check counts towards the allocation's health (Nomad's `on_update`). A check without
/// its own takes its service's; both default to `require_healthy`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnUpdate {
    /// The check must pass.
    #[default]
    RequireHealthy,
    /// The check must pass or warn.
    IgnoreWarnings,
    /// The check does not count (a readiness check, in Nomad's terms): it runs, shows and can
    /// restart nothing, whatever it says.
    Ignore,
}

impl OnUpdate {
    fn is_default(&self) -> bool {
        *self == OnUpdate::RequireHealthy
    }
}

/// Where a service is registered. Only the node's own catalog exists.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ServiceProvider {
    /// The node's catalog (`GET /v1/services`), as Nomad's native service discovery.
    #[default]
    Nomad,
}

/// Something a task offers on a port, with the checks that say whether it works.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Service {
    /// Its name in the catalog: letters, digits and dashes, at most 63 (RFC 1123).
    pub name: String,
    /// The label of the group's port it listens on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<String>,
    /// Free-form tags, listed with it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tags: Vec<String>,
    /// Where it is registered: the node's catalog.
    #[serde(default)]
    pub provider: ServiceProvider,
    /// check_restart settings for every check of the service; a check's own settings win.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub check_restart: Option<CheckRestart>,
    /// How its checks count towards the allocation's health, unless a check says otherwise.
    #[serde(default, skip_serializing_if = "OnUpdate::is_default")]
    pub on_update: OnUpdate,
    /// The checks, in the order written.
    #[serde(default, rename = "check", skip_serializing_if = "Vec::is_empty")]
    pub checks: Vec<Check>,
}

/// How a check probes its service.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CheckKind {
    /// An HTTP request: 2xx passes, 429 warns, anything else (or no answer) is critical.
    Http,
    /// A TCP connection: accepted passes, anything else is critical.
    Tcp,
    /// A command run inside the task through its driver: exit 0 passes, 1 warns, anything
    /// else is critical.
    Script,
}

/// One check of a service.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Check {
    /// Unique within the service; by default `service: "<name>" check`, as in Nomad.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    /// http, tcp or script.
    #[serde(rename = "type")]
    pub kind: CheckKind,
    /// A port label other than the service's, for http and tcp.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<String>,
    /// The request path for http, such as `/health` (a query may follow).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// The request method for http; GET by default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub method: Option<String>,
    /// Request headers for http, each with one or more values.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub header: BTreeMap<String, Vec<String>>,
    /// A request body for http.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body: Option<String>,
    /// `http` only: wharf's check client speaks plain HTTP.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol: Option<String>,
    /// The program a script check runs inside the task.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<String>,
    /// Its arguments.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    /// How often it runs; at least 1s.
    #[serde(with = "duration::serde_str")]
    pub interval: Duration,
    /// How long one run may take before it counts as critical; at least 1s.
    #[serde(with = "duration::serde_str")]
    pub timeout: Duration,
    /// When failing runs restart the task; over the service's settings field by field.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub check_restart: Option<CheckRestart>,
    /// How it counts towards the allocation's health; its service's setting by default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_update: Option<OnUpdate>,
}

/// The shortest interval and timeout a check may have (Nomad's and Consul's minimum).
pub const MIN_CHECK_INTERVAL: Duration = Duration::from_secs(1);

/// check_restart as written: each field may be left to the service's settings.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CheckRestart {
    /// Restart the task after this many failing runs in a row; 0 never restarts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u32>,
    /// How long after the task starts failures are not counted; 1s by default.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "duration::serde_str::option"
    )]
    pub grace: Option<Duration>,
    /// Count warnings as passing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ignore_warnings: Option<bool>,
}

/// check_restart as applied to one check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CheckRestartPolicy {
    /// Failing runs in a row that restart the task; never 0 (a limit of 0 is no policy).
    pub limit: u32,
    /// How long after the task starts failures are not counted.
    pub grace: Duration,
    /// Whether warnings count as passing.
    pub ignore_warnings: bool,
}

/// Nomad's default grace.
pub const DEFAULT_CHECK_RESTART_GRACE: Duration = Duration::from_secs(1);

impl CheckRestart {
    /// `self` with the fields `over` sets replaced.
    fn merged(self, over: CheckRestart) -> CheckRestart {
        CheckRestart {
            limit: over.limit.or(self.limit),
            grace: over.grace.or(self.grace),
            ignore_warnings: over.ignore_warnings.or(self.ignore_warnings),
        }
    }
}

impl Service {
    /// A service called `name`, with no port, tags or checks.
    pub fn new(name: impl Into<String>) -> Service {
        Service {
            name: name.into(),
            port: None,
            tags: Vec::new(),
            provider: ServiceProvider::Nomad,
            check_restart: None,
            on_update: OnUpdate::RequireHealthy,
            checks: Vec::new(),
        }
    }

    /// Listens on the group's port `label`.
    pub fn with_port(mut self, label: impl Into<String>) -> Service {
        self.port = Some(label.into());
        self
    }

    /// Adds a check.
    pub fn with_check(mut self, check: Check) -> Service {
        self.checks.push(check);
        self
    }

    /// The check's name: its own, or Nomad's default for the service.
    pub fn check_name(&self, check: &Check) -> String {
        if check.name.is_empty() {
            format!("service: {:?} check", self.name)
        } else {
            check.name.clone()
        }
    }

    /// The check_restart policy of `check`, if it restarts its task at all: the service's
    /// settings, then the check's.
    pub fn check_restart(&self, check: &Check) -> Option<CheckRestartPolicy> {
        let merged = match (self.check_restart, check.check_restart) {
            (None, None) => return None,
            (Some(service), None) => service,
            (None, Some(own)) => own,
            (Some(service), Some(own)) => service.merged(own),
        };
        let limit = merged.limit.filter(|limit| *limit > 0)?;
        Some(CheckRestartPolicy {
            limit,
            grace: merged.grace.unwrap_or(DEFAULT_CHECK_RESTART_GRACE),
            ignore_warnings: merged.ignore_warnings.unwrap_or(false),
        })
    }

    /// How `check` counts towards the allocation's health: its own setting, else the
    /// service's.
    pub fn check_on_update(&self, check: &Check) -> OnUpdate {
        check.on_update.unwrap_or(self.on_update)
    }

    /// The port label `check` probes: its own, else the service's.
    pub fn check_port<'a>(&'a self, check: &'a Check) -> Option<&'a str> {
        check.port.as_deref().or(self.port.as_deref())
    }
}

impl Check {
    /// A check of `kind` named `name`, run every `interval` for at most `timeout`; an http
    /// check also needs [`Check::with_path`], a script check a `command`.
    pub fn new(
        name: impl Into<String>,
        kind: CheckKind,
        interval: Duration,
        timeout: Duration,
    ) -> Check {
        Check {
            name: name.into(),
            kind,
            port: None,
            path: None,
            method: None,
            header: BTreeMap::new(),
            body: None,
            protocol: None,
            command: None,
            args: Vec::new(),
            interval,
            timeout,
            check_restart: None,
            on_update: None,
        }
    }

    /// Requests `path` (an http check).
    pub fn with_path(mut self, path: impl Into<String>) -> Check {
        self.path = Some(path.into());
        self
    }

    /// Restarts the task after `limit` failing runs in a row, once `grace` has passed.
    pub fn with_check_restart(mut self, limit: u32, grace: Duration) -> Check {
        self.check_restart =
            Some(CheckRestart { limit: Some(limit), grace: Some(grace), ignore_warnings: None });
        self
    }

    /// The request path of an http check, always starting with `/`.
    pub fn request_path(&self) -> String {
        match self.path.as_deref() {
            Some(path) if path.starts_with('/') => path.to_owned(),
            Some(path) => format!("/{path}"),
            None => "/".to_owned(),
        }
    }

    /// The request method of an http check.
    pub fn request_method(&self) -> &str {
        self.method.as_deref().unwrap_or("GET")
    }
}

/// Port labels become parts of variable names (`WHARF_PORT_<label>`).
fn check_port_label(problems: &mut Problems, field: &str, label: &str) {
    let valid = (1..=64).contains(&label.len())
        && label.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
    if !valid {
        problems.add(
            field,
            format!(
                "{label:?} must match [A-Za-z0-9_]{{1,64}} (it becomes part of WHARF_PORT_<label>)"
            ),
        );
    }
}

/// Service names follow RFC 1123 labels, as Nomad's do: they are looked up by name.
fn valid_service_name(name: &str) -> bool {
    let bytes = name.as_bytes();
    (1..=63).contains(&bytes.len())
        && bytes.iter().all(|b| b.is_ascii_alphanumeric() || *b == b'-')
        && bytes.first() != Some(&b'-')
        && bytes.last() != Some(&b'-')
}

/// An HTTP token (RFC 9110): what a method or a header name may be made of.
fn is_token(text: &str) -> bool {
    !text.is_empty()
        && text.bytes().all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

/// Validates the group's ports: labels, static numbers, and no static port twice.
pub(crate) fn validate_network(problems: &mut Problems, at: &str, network: &Network) {
    let mut statics: BTreeMap<u16, &str> = BTreeMap::new();
    for (label, port) in &network.ports {
        let field = format!("{at}.network.port.{label}");
        check_port_label(problems, &field, label);
        match port.static_port {
            Some(0) => problems.add(
                &format!("{field}.static"),
                "0 is not a port; leave `static` out for a port the node picks".into(),
            ),
            Some(number) => {
                if let Some(other) = statics.insert(number, label) {
                    problems.add(
                        &format!("{field}.static"),
                        format!("port {number} is already taken by port {other:?}"),
                    );
                }
            }
            None => {}
        }
    }
}

/// Validates one task's services and their checks against the group's ports.
pub(crate) fn validate_services(
    problems: &mut Problems,
    at: &str,
    services: &[Service],
    network: Option<&Network>,
) {
    let has_port = |label: &str| network.is_some_and(|n| n.ports.contains_key(label));
    let mut names = HashSet::new();
    for (si, service) in services.iter().enumerate() {
        let at = format!("{at}.service[{si}]");
        if !valid_service_name(&service.name) {
            problems.add(
                &format!("{at}.name"),
                format!(
                    "{:?} must be 1 to 63 letters, digits and dashes, not starting or ending with \
                     a dash (RFC 1123)",
                    service.name
                ),
            );
        } else if !names.insert(service.name.as_str()) {
            problems.add(
                &format!("{at}.name"),
                format!("the task already has a service {:?}", service.name),
            );
        }
        if let Some(label) = &service.port
            && !has_port(label)
        {
            problems.add(
                &format!("{at}.port"),
                format!(
                    "{label:?} is not a port of the group; declare it as group.network.port.{label}"
                ),
            );
        }
        for (ti, tag) in service.tags.iter().enumerate() {
            if tag.is_empty() || tag.chars().any(char::is_control) {
                problems.add(
                    &format!("{at}.tags[{ti}]"),
                    "tags must be non-empty, without control characters".into(),
                );
            }
        }
        let mut check_names = HashSet::new();
        for (ci, check) in service.checks.iter().enumerate() {
            let at = format!("{at}.check[{ci}]");
            let name = service.check_name(check);
            if !check_names.insert(name.clone()) {
                problems.add(
                    &format!("{at}.name"),
                    format!("the service already has a check named {name:?}; give each a name"),
                );
            }
            if name.chars().any(char::is_control) || name.len() > 128 {
                problems.add(
                    &format!("{at}.name"),
                    "at most 128 bytes, without control characters".into(),
                );
            }
            validate_check(problems, &at, service, check, &has_port);
        }
    }
}

fn validate_check(
    problems: &mut Problems,
    at: &str,
    service: &Service,
    check: &Check,
    has_port: &dyn Fn(&str) -> bool,
) {
    for (field, value) in [("interval", check.interval), ("timeout", check.timeout)] {
        if value < MIN_CHECK_INTERVAL {
            problems.add(
                &format!("{at}.{field}"),
                format!(
                    "{} is shorter than the minimum of {}",
                    Formatted(value),
                    Formatted(MIN_CHECK_INTERVAL)
                ),
            );
        }
    }
    let http_only = [
        ("path", check.path.is_some()),
        ("method", check.method.is_some()),
        ("header", !check.header.is_empty()),
        ("body", check.body.is_some()),
        ("protocol", check.protocol.is_some()),
    ];
    let script_only = [("command", check.command.is_some()), ("args", !check.args.is_empty())];
    let (kind, misplaced): (&str, Vec<&str>) = match check.kind {
        CheckKind::Http => ("http", script_only.iter().filter(|f| f.1).map(|f| f.0).collect()),
        CheckKind::Tcp => {
            ("tcp", http_only.iter().chain(&script_only).filter(|f| f.1).map(|f| f.0).collect())
        }
        CheckKind::Script => (
            "script",
            http_only
                .iter()
                .chain(&[("port", check.port.is_some())])
                .filter(|f| f.1)
                .map(|f| f.0)
                .collect(),
        ),
    };
    for field in misplaced {
        problems.add(&format!("{at}.{field}"), format!("a {kind} check has no {field}"));
    }
    match check.kind {
        CheckKind::Http | CheckKind::Tcp => match service.check_port(check) {
            None => problems.add(
                &format!("{at}.port"),
                format!(
                    "a {kind} check needs a port: set `port` on the check or on service {:?}",
                    service.name
                ),
            ),
            Some(label) if check.port.is_some() && !has_port(label) => problems.add(
                &format!("{at}.port"),
                format!(
                    "{label:?} is not a port of the group; declare it as group.network.port.{label}"
                ),
            ),
            Some(_) => {}
        },
        CheckKind::Script => {
            if check.command.as_deref().is_none_or(str::is_empty) {
                problems.add(
                    &format!("{at}.command"),
                    "a script check needs the command to run inside the task".into(),
                );
            }
        }
    }
    // Nomad's rules: a check that does not count cannot restart its task, and one whose
    // warnings count as healthy cannot restart it for warning.
    if let Some(policy) = service.check_restart(check) {
        match service.check_on_update(check) {
            OnUpdate::Ignore => problems.add(
                &format!("{at}.on_update"),
                "\"ignore\" cannot be used with check_restart: a check that does not count for \
                 health cannot restart its task"
                    .into(),
            ),
            OnUpdate::IgnoreWarnings if !policy.ignore_warnings => problems.add(
                &format!("{at}.on_update"),
                "\"ignore_warnings\" needs check_restart's ignore_warnings = true, or warnings \
                 would restart a task that counts as healthy"
                    .into(),
            ),
            _ => {}
        }
    }
    if check.kind != CheckKind::Http {
        return;
    }
    match check.path.as_deref() {
        None | Some("") => problems
            .add(&format!("{at}.path"), "an http check needs a path, such as \"/health\"".into()),
        Some(path) if path.contains("://") => problems.add(
            &format!("{at}.path"),
            format!("{path:?} must be a path on the service (\"/health\"), not a URL"),
        ),
        Some(path) if path.bytes().any(|b| b <= b' ' || b == 0x7f) => problems.add(
            &format!("{at}.path"),
            format!("{path:?} cannot contain spaces or control characters; percent-encode them"),
        ),
        Some(_) => {}
    }
    if let Some(method) = &check.method
        && !is_token(method)
    {
        problems.add(&format!("{at}.method"), format!("{method:?} is not an HTTP method"));
    }
    if let Some(protocol) = &check.protocol
        && protocol != "http"
    {
        problems.add(
            &format!("{at}.protocol"),
            format!("{protocol:?} is not supported: checks speak plain \"http\""),
        );
    }
    for (name, values) in &check.header {
        if !is_token(name) {
            problems.add(&format!("{at}.header"), format!("{name:?} is not a header name"));
        }
        if values.iter().any(|v| v.bytes().any(|b| b == b'\r' || b == b'\n' || b == 0)) {
            problems.add(
                &format!("{at}.header.{name}"),
                "values cannot contain line breaks or NUL bytes".into(),
            );
        }
    }
}

/// Validates the group's update block.
pub(crate) fn validate_update(problems: &mut Problems, at: &str, update: &UpdateStrategy) {
    update.problems(problems, &format!("{at}.update"));
}
