//! A task's environment: the `WHARF_*` variables (with the allocation's ports as
//! `WHARF_PORT_<label>`, `WHARF_IP_<label>` and `WHARF_ADDR_<label>`), the task's own `env`
//! with `${VAR}` interpolation, and the same interpolation over its driver config.
//!
//! Tasks do not inherit the agent's environment: what a task sees is what its spec and this
//! module give it, so moving a job between nodes does not change its environment. A `PATH`
//! is provided when the task sets none, so commands can be found.

use std::collections::BTreeMap;
use std::path::Path;
use wharf_state::AllocatedPort;

/// `PATH` for tasks that do not set one.
pub const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Where a task's files are, for its environment.
#[derive(Debug, Clone, Copy)]
pub struct EnvPaths<'a> {
    /// The directory shared by the allocation's tasks.
    pub alloc_dir: &'a Path,
    /// The task's own directory.
    pub task_dir: &'a Path,
    /// The task's private directory for secrets.
    pub secrets_dir: &'a Path,
}

/// Identity of a task, for its environment.
#[derive(Debug, Clone, Copy)]
pub struct EnvIdentity<'a> {
    /// The allocation's id.
    pub alloc_id: &'a str,
    /// `<job>.<group>[<index>]`-style name shown to users.
    pub alloc_name: &'a str,
    /// The job's id.
    pub job_id: &'a str,
    /// The group's name.
    pub group: &'a str,
    /// The task's name.
    pub task: &'a str,
}

/// The full environment of a task: `WHARF_*` (with `ports`, the allocation's), a default
/// `PATH`, then the task's own variables with `${VAR}` replaced by the value of `VAR` among the
/// `WHARF_*` variables and the task's own (raw) variables. References to unknown variables
/// stay as written.
pub fn build(
    identity: EnvIdentity<'_>,
    paths: EnvPaths<'_>,
    ports: &[AllocatedPort],
    task_env: &BTreeMap<String, String>,
) -> BTreeMap<String, String> {
    let mut env = BTreeMap::from([
        ("PATH".to_owned(), DEFAULT_PATH.to_owned()),
        ("WHARF_ALLOC_ID".to_owned(), identity.alloc_id.to_owned()),
        ("WHARF_ALLOC_NAME".to_owned(), identity.alloc_name.to_owned()),
        ("WHARF_JOB_ID".to_owned(), identity.job_id.to_owned()),
        ("WHARF_GROUP_NAME".to_owned(), identity.group.to_owned()),
        ("WHARF_TASK_NAME".to_owned(), identity.task.to_owned()),
        ("WHARF_ALLOC_DIR".to_owned(), paths.alloc_dir.display().to_string()),
        ("WHARF_TASK_DIR".to_owned(), paths.task_dir.display().to_string()),
        ("WHARF_SECRETS_DIR".to_owned(), paths.secrets_dir.display().to_string()),
    ]);
    for port in ports {
        let label = &port.label;
        env.insert(format!("WHARF_PORT_{label}"), port.value.to_string());
        env.insert(format!("WHARF_IP_{label}"), port.host_ip.to_string());
        env.insert(format!("WHARF_ADDR_{label}"), port.address().to_string());
    }
    let lookup = |name: &str| task_env.get(name).or_else(|| env.get(name)).cloned();
    let resolved: Vec<(String, String)> =
        task_env.iter().map(|(key, value)| (key.clone(), interpolate(value, &lookup))).collect();
    env.extend(resolved);
    env
}

/// Replaces every `${NAME}` in `text` whose value `lookup` knows. `$${` writes a literal `${`.
pub fn interpolate(text: &str, lookup: &dyn Fn(&str) -> Option<String>) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find('$') {
        out.push_str(&rest[..start]);
        let after = &rest[start..];
        if let Some(escaped) = after.strip_prefix("$${") {
            out.push_str("${");
            rest = escaped;
            continue;
        }
        let Some(inner) = after.strip_prefix("${") else {
            out.push('$');
            rest = &after[1..];
            continue;
        };
        match inner.find('}') {
            Some(end) => {
                let name = &inner[..end];
                match lookup(name) {
                    Some(value) => out.push_str(&value),
                    None => out.push_str(&after[..end + 3]),
                }
                rest = &inner[end + 1..];
            }
            None => {
                out.push_str(after);
                rest = "";
            }
        }
    }
    out.push_str(rest);
    out
}

/// Interpolates every string in a driver config with the task's environment.
pub fn interpolate_config(
    config: &serde_json::Map<String, serde_json::Value>,
    env: &BTreeMap<String, String>,
) -> serde_json::Map<String, serde_json::Value> {
    fn walk(
        value: &serde_json::Value,
        lookup: &dyn Fn(&str) -> Option<String>,
    ) -> serde_json::Value {
        match value {
            serde_json::Value::String(s) => serde_json::Value::String(interpolate(s, lookup)),
            serde_json::Value::Array(items) => items.iter().map(|v| walk(v, lookup)).collect(),
            serde_json::Value::Object(map) => serde_json::Value::Object(
                map.iter().map(|(k, v)| (k.clone(), walk(v, lookup))).collect(),
            ),
            other => other.clone(),
        }
    }
    let lookup = |name: &str| env.get(name).cloned();
    config.iter().map(|(k, v)| (k.clone(), walk(v, &lookup))).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interpolation_table() {
        let vars =
            BTreeMap::from([("A".to_owned(), "1".to_owned()), ("DIR".to_owned(), "/x".to_owned())]);
        let lookup = |n: &str| vars.get(n).cloned();
        let cases = [
            ("plain", "plain"),
            ("${A}", "1"),
            ("${DIR}/ready", "/x/ready"),
            ("a${A}b${A}c", "a1b1c"),
            ("${MISSING}", "${MISSING}"),
            ("$${A}", "${A}"),
            ("$A and $", "$A and $"),
            ("${A", "${A"),
            ("${}", "${}"),
            ("é${A}ü", "é1ü"),
        ];
        for (input, want) in cases {
            assert_eq!(interpolate(input, &lookup), want, "{input}");
        }
    }

    #[test]
    fn task_env_sees_wharf_vars_and_its_own() {
        let task_env = BTreeMap::from([
            ("DATA".to_owned(), "${WHARF_ALLOC_DIR}/data".to_owned()),
            ("GREETING".to_owned(), "hi ${NAME}".to_owned()),
            ("NAME".to_owned(), "web".to_owned()),
            ("PATH".to_owned(), "/opt/bin".to_owned()),
            ("LISTEN".to_owned(), "--port=${WHARF_PORT_http}".to_owned()),
        ]);
        let env = build(
            EnvIdentity {
                alloc_id: "a1",
                alloc_name: "j.g[0]",
                job_id: "j",
                group: "g",
                task: "t",
            },
            EnvPaths {
                alloc_dir: Path::new("/d/a1/alloc"),
                task_dir: Path::new("/d/a1/t"),
                secrets_dir: Path::new("/d/a1/t/secrets"),
            },
            &[
                AllocatedPort {
                    label: "http".into(),
                    value: 20_001,
                    host_ip: [127, 0, 0, 1].into(),
                },
                AllocatedPort { label: "v6".into(), value: 9000, host_ip: "::1".parse().unwrap() },
            ],
            &task_env,
        );
        assert_eq!(env["DATA"], "/d/a1/alloc/data");
        assert_eq!(env["GREETING"], "hi web");
        assert_eq!(env["PATH"], "/opt/bin", "the task's PATH wins");
        assert_eq!(env["WHARF_TASK_NAME"], "t");
        assert_eq!(env["WHARF_SECRETS_DIR"], "/d/a1/t/secrets");
        assert_eq!(env["WHARF_PORT_http"], "20001");
        assert_eq!(env["WHARF_IP_http"], "127.0.0.1");
        assert_eq!(env["WHARF_ADDR_http"], "127.0.0.1:20001");
        assert_eq!(env["WHARF_ADDR_v6"], "[::1]:9000");
        assert_eq!(env["LISTEN"], "--port=20001", "ports interpolate like any variable");
        for key in [
            "WHARF_ALLOC_ID",
            "WHARF_ALLOC_NAME",
            "WHARF_JOB_ID",
            "WHARF_GROUP_NAME",
            "WHARF_TASK_DIR",
        ] {
            assert!(env.contains_key(key), "{key}");
        }
    }

    #[test]
    fn driver_config_strings_are_interpolated_deeply() {
        let env = BTreeMap::from([("WHARF_ALLOC_DIR".to_owned(), "/a".to_owned())]);
        let config = serde_json::json!({"command": "/bin/sh", "args": ["-c", "echo > ${WHARF_ALLOC_DIR}/ready"], "n": 3, "nested": {"p": "${WHARF_ALLOC_DIR}"}});
        let out = interpolate_config(config.as_object().unwrap(), &env);
        assert_eq!(
            serde_json::Value::Object(out),
            serde_json::json!({"command": "/bin/sh", "args": ["-c", "echo > /a/ready"], "n": 3, "nested": {"p": "/a"}})
        );
    }
}
