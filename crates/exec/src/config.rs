//! A raw_exec task's `config` block, and how its command and working directory are found.
//!
//! | field | meaning |
//! |---|---|
//! | `command` (required) | the program: an absolute path, a path relative to the working directory (it contains a `/`), or a bare name looked up in the task's `PATH` |
//! | `args` | its arguments, a list of strings |
//! | `work_dir` | the working directory, absolute or relative to the task directory; default: the task directory |
//! | `cpu_hard_limit` | cap the task's CPU at its `resources.cpu` (a CFS quota out of the node's MHz), as Nomad's exec driver does; needs cgroups |
//! | `cpu_cfs_period` | the quota's period in microseconds, 1,000 to 1,000,000; default 100,000 |
//!
//! Every error is a [`DriverError::InvalidConfig`] naming the field (`config.command`,
//! `config.args[1]`, ...): fatal, since starting again would fail again.

use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use wharf_driver::DriverError;

/// The `PATH` a bare command is looked up in when the task's environment has none. It is
/// used for the lookup only; the task's environment is left as it was given.
pub const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// A raw_exec task's `config` block.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawExecConfig {
    /// The program to run.
    pub command: String,
    /// Its arguments.
    #[serde(default)]
    pub args: Vec<String>,
    /// The working directory; default: the task directory.
    #[serde(default)]
    pub work_dir: Option<PathBuf>,
    /// Cap the task's CPU at its `resources.cpu` rather than only weighing it.
    #[serde(default)]
    pub cpu_hard_limit: bool,
    /// The period of that cap, in microseconds.
    #[serde(default = "default_cfs_period")]
    pub cpu_cfs_period: u64,
}

fn default_cfs_period() -> u64 {
    wharf_isolate::cgroup::DEFAULT_CFS_PERIOD_US
}

/// The bounds the kernel puts on a CFS period, in microseconds.
const CFS_PERIODS: std::ops::RangeInclusive<u64> = 1_000..=1_000_000;

impl RawExecConfig {
    /// The CFS period of a hard CPU limit, if the task asks for one.
    pub fn hard_limit_period(&self) -> Option<u64> {
        self.cpu_hard_limit.then_some(self.cpu_cfs_period)
    }
}

impl RawExecConfig {
    /// Reads and checks a `config` block; the error names the field.
    pub fn parse(
        config: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<RawExecConfig, DriverError> {
        let parsed: RawExecConfig = deserialize_block(config)?;
        if parsed.command.trim().is_empty() {
            return Err(DriverError::invalid_config("config.command", "must not be empty"));
        }
        if parsed.command.contains('\0') {
            return Err(DriverError::invalid_config("config.command", "contains a NUL byte"));
        }
        if !CFS_PERIODS.contains(&parsed.cpu_cfs_period) {
            return Err(DriverError::invalid_config(
                "config.cpu_cfs_period",
                format!("{} is outside 1000 to 1000000 microseconds", parsed.cpu_cfs_period),
            ));
        }
        if let Some(index) = parsed.args.iter().position(|a| a.contains('\0')) {
            return Err(DriverError::invalid_config(
                format!("config.args[{index}]"),
                "contains a NUL byte",
            ));
        }
        Ok(parsed)
    }
}

/// Reads a `config` block into `T`; the error names the field (`config.args[1]`), and a
/// missing or unknown field by its own name rather than the block's.
pub(crate) fn deserialize_block<T: serde::de::DeserializeOwned>(
    config: &serde_json::Map<String, serde_json::Value>,
) -> Result<T, DriverError> {
    let value = serde_json::Value::Object(config.clone());
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        let message = e.into_inner().to_string();
        let named = ["missing field `", "unknown field `"]
            .iter()
            .find_map(|prefix| message.strip_prefix(prefix)?.split('`').next());
        let field = match (named, path.as_str()) {
            (Some(name), ".") => format!("config.{name}"),
            (_, ".") => "config".to_owned(),
            (_, path) => format!("config.{path}"),
        };
        DriverError::invalid_config(field, message)
    })
}

/// Checks a task's environment: names must be non-empty without `=` or NUL, values without NUL.
pub(crate) fn check_env(env: &BTreeMap<String, String>) -> Result<(), DriverError> {
    for (name, value) in env {
        if name.is_empty() || name.contains(['=', '\0']) {
            return Err(DriverError::invalid_config(
                format!("env.{name}"),
                "a variable name must be non-empty, without '=' or NUL",
            ));
        }
        if value.contains('\0') {
            return Err(DriverError::invalid_config(format!("env.{name}"), "contains a NUL byte"));
        }
    }
    Ok(())
}

/// The working directory: `work_dir` resolved against the task directory, which must exist.
pub(crate) fn resolve_work_dir(
    task_dir: &Path,
    work_dir: Option<&Path>,
) -> Result<PathBuf, DriverError> {
    if !task_dir.is_absolute() {
        return Err(DriverError::invalid_config(
            "task_dir",
            format!("{} is not an absolute path", task_dir.display()),
        ));
    }
    let (field, dir) = match work_dir {
        None => ("task_dir", task_dir.to_owned()),
        Some(dir) => ("config.work_dir", task_dir.join(dir)),
    };
    match std::fs::metadata(&dir) {
        Ok(meta) if meta.is_dir() => Ok(dir),
        Ok(_) => {
            Err(DriverError::invalid_config(field, format!("{} is not a directory", dir.display())))
        }
        Err(e) => Err(DriverError::invalid_config(field, format!("{}: {e}", dir.display()))),
    }
}

/// Finds the program `command` names, as a shell would: a name with a `/` is a path (relative
/// to `work_dir`), a bare name is looked up in `PATH` (the task's, else [`DEFAULT_PATH`]).
/// `field` names the config field in errors.
pub(crate) fn resolve_command(
    field: &str,
    command: &str,
    env: &BTreeMap<String, String>,
    work_dir: &Path,
) -> Result<PathBuf, DriverError> {
    let invalid = |reason: String| DriverError::invalid_config(field, reason);
    if command.contains('/') {
        let path = work_dir.join(command);
        return match std::fs::metadata(&path) {
            Ok(meta) if meta.is_dir() => Err(invalid(format!("{} is a directory", path.display()))),
            Ok(_) if !crate::sys::executable(&path) => {
                Err(invalid(format!("{} is not executable", path.display())))
            }
            Ok(_) => Ok(path),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                Err(invalid(format!("{} does not exist", path.display())))
            }
            Err(e) => Err(invalid(format!("{}: {e}", path.display()))),
        };
    }
    let search = env.get("PATH").map_or(DEFAULT_PATH, String::as_str);
    let mut not_executable = None;
    for dir in search.split(':') {
        // An empty entry means the current directory, as in a shell.
        let candidate = work_dir.join(if dir.is_empty() { "." } else { dir }).join(command);
        match std::fs::metadata(&candidate) {
            Ok(meta) if meta.is_file() && crate::sys::executable(&candidate) => {
                return Ok(candidate);
            }
            Ok(meta) if meta.is_file() => {
                not_executable.get_or_insert(candidate);
            }
            _ => {}
        }
    }
    Err(invalid(match not_executable {
        Some(path) => format!("{} is not executable", path.display()),
        None => format!("{command:?} not found in PATH {search:?}"),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse(value: serde_json::Value) -> Result<RawExecConfig, DriverError> {
        RawExecConfig::parse(value.as_object().unwrap())
    }

    #[test]
    fn configs_parse_or_name_the_bad_field() {
        assert_eq!(
            parse(json!({"command": "sh", "args": ["-c", "true"], "work_dir": "sub"})).unwrap(),
            RawExecConfig {
                command: "sh".into(),
                args: vec!["-c".into(), "true".into()],
                work_dir: Some("sub".into()),
                cpu_hard_limit: false,
                cpu_cfs_period: 100_000,
            }
        );
        for (config, field) in [
            (json!({}), "config.command"),
            (json!({"args": []}), "config.command"),
            (json!({"command": ""}), "config.command"),
            (json!({"command": "  "}), "config.command"),
            (json!({"command": 3}), "config.command"),
            (json!({"command": "a\u{0}b"}), "config.command"),
            (json!({"command": "sh", "args": "-c"}), "config.args"),
            (json!({"command": "sh", "args": ["-c", 1]}), "config.args[1]"),
            (json!({"command": "sh", "args": ["ok", "a\u{0}"]}), "config.args[1]"),
            (json!({"command": "sh", "argv": []}), "config.argv"),
            (json!({"command": "sh", "work_dir": 1}), "config.work_dir"),
            (json!({"command": "sh", "cpu_hard_limit": "yes"}), "config.cpu_hard_limit"),
            (json!({"command": "sh", "cpu_cfs_period": 999}), "config.cpu_cfs_period"),
            (json!({"command": "sh", "cpu_cfs_period": 2_000_000}), "config.cpu_cfs_period"),
        ] {
            match parse(config.clone()) {
                Err(DriverError::InvalidConfig { field: f, .. }) => {
                    assert_eq!(f, field, "{config}")
                }
                other => panic!("{config}: {other:?}"),
            }
        }
    }

    #[test]
    fn bad_environments_are_refused() {
        let env = |name: &str, value: &str| BTreeMap::from([(name.to_owned(), value.to_owned())]);
        assert_eq!(check_env(&env("A", "1 2=3")), Ok(()));
        for (name, value) in [("", "x"), ("A=B", "x"), ("A\0", "x"), ("A", "x\0y")] {
            assert!(check_env(&env(name, value)).is_err(), "{name:?}={value:?}");
        }
    }

    #[test]
    fn commands_resolve_like_a_shell_would() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let bin = dir.path().join("bin");
        std::fs::create_dir(&bin).unwrap();
        let write = |name: &str, mode: u32| {
            let path = bin.join(name);
            std::fs::write(&path, "#!/bin/sh\n").unwrap();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
        };
        write("tool", 0o755);
        write("plain", 0o644);
        let path = BTreeMap::from([("PATH".to_owned(), format!("/nonexistent:{}", bin.display()))]);
        let none = BTreeMap::new();
        let ok = |command: &str, env: &BTreeMap<String, String>| {
            resolve_command("config.command", command, env, dir.path())
        };
        assert_eq!(ok("tool", &path).unwrap(), bin.join("tool"));
        assert_eq!(ok("bin/tool", &none).unwrap(), dir.path().join("bin/tool"));
        assert_eq!(ok("sh", &none).unwrap().file_name().unwrap(), "sh");
        for (command, env, reason) in [
            ("plain", &path, "is not executable"),
            ("bin/plain", &none, "is not executable"),
            ("bin", &none, "not found in PATH"),
            ("./bin", &none, "is a directory"),
            ("missing", &path, "not found in PATH"),
            ("/nonexistent/x", &none, "does not exist"),
        ] {
            match ok(command, env) {
                Err(DriverError::InvalidConfig { field, reason: r }) => {
                    assert_eq!(field, "config.command");
                    assert!(r.contains(reason), "{command}: {r}");
                }
                other => panic!("{command}: {other:?}"),
            }
        }
    }
}
