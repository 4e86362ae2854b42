//! A task's `template` blocks: files rendered from Go text/template sources before the task
//! starts and again whenever what they read changes, with Nomad's field names.
//!
//! What is checked here needs no node: exactly one of `data` and `source`, a `destination`
//! (and a `source`) that stays inside the task's directories once `..` is resolved, an octal
//! `perms`, `change_signal` with `change_mode = "signal"` only, `change_script` with
//! `change_mode = "script"` only, delimiters that are not empty, and `wait.min <= wait.max`.
//! `${VAR}` references in paths are resolved by the task runner, which checks the result again.

use crate::duration;
use crate::problems::Problems;
use crate::signal::Signal;
use serde::{Deserialize, Serialize};
use std::path::{Component, Path};
use std::time::Duration;

/// One `template` block.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Template {
    /// The template itself, written in the job spec.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<String>,
    /// A file holding the template, relative to the task's directory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    /// Where the output goes, relative to the task's directory (`local/app.conf`), or under
    /// `${WHARF_TASK_DIR}`, `${WHARF_SECRETS_DIR}` or `${WHARF_ALLOC_DIR}`.
    pub destination: String,
    /// The output file's mode, in octal. Default: `"644"`.
    #[serde(default = "default_perms")]
    pub perms: String,
    /// What happens to the running task when the output changes. Default: restart.
    #[serde(default)]
    pub change_mode: ChangeMode,
    /// The signal sent with `change_mode = "signal"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub change_signal: Option<Signal>,
    /// The command run inside the task with `change_mode = "script"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub change_script: Option<ChangeScript>,
    /// A random wait of up to this long before the change mode acts, so that tasks rendering
    /// the same data do not all restart at once. Default: 5s.
    #[serde(default = "default_splay", with = "duration::serde_str")]
    pub splay: Duration,
    /// Reads the output as `KEY=value` lines into the task's environment.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub env: bool,
    /// The action delimiters. Default: `{{`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub left_delimiter: Option<String>,
    /// Default: `}}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub right_delimiter: Option<String>,
    /// How long changes to what the template reads settle before it renders again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait: Option<TemplateWait>,
}

fn default_perms() -> String {
    "644".to_owned()
}

/// The default `splay`, as in Nomad.
pub const DEFAULT_SPLAY: Duration = Duration::from_secs(5);

fn default_splay() -> Duration {
    DEFAULT_SPLAY
}

/// What a changed output does to the running task.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ChangeMode {
    /// Restart the task (not counted against its restart policy).
    #[default]
    Restart,
    /// Send `change_signal`.
    Signal,
    /// Nothing: the file is rewritten, the task reads it when it wants.
    Noop,
    /// Run `change_script` inside the task.
    Script,
}

/// The command a `script` change mode runs inside the task.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChangeScript {
    /// The program.
    pub command: String,
    /// Its arguments.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    /// How long it may run. Default: 5s.
    #[serde(default = "default_script_timeout", with = "duration::serde_str")]
    pub timeout: Duration,
    /// Kill the task when the script fails or times out.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub fail_on_error: bool,
}

fn default_script_timeout() -> Duration {
    Duration::from_secs(5)
}

/// The quiescence bounds of a template's re-render.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TemplateWait {
    /// Render once what it reads has not changed for this long.
    #[serde(with = "duration::serde_str")]
    pub min: Duration,
    /// ... but no later than this long after the first change.
    #[serde(with = "duration::serde_str")]
    pub max: Duration,
}

impl Template {
    /// A template rendering `data` into `destination`, with Nomad's defaults (restart on
    /// change, mode 644, 5s splay).
    pub fn inline(data: impl Into<String>, destination: impl Into<String>) -> Template {
        Template {
            data: Some(data.into()),
            source: None,
            destination: destination.into(),
            perms: default_perms(),
            change_mode: ChangeMode::Restart,
            change_signal: None,
            change_script: None,
            splay: DEFAULT_SPLAY,
            env: false,
            left_delimiter: None,
            right_delimiter: None,
            wait: None,
        }
    }

    /// The output file's mode; None if `perms` is not octal (validation reports it).
    pub fn mode(&self) -> Option<u32> {
        u32::from_str_radix(&self.perms, 8).ok().filter(|mode| *mode <= 0o7777)
    }

    /// The delimiters, with Go's defaults.
    pub fn delimiters(&self) -> (&str, &str) {
        (
            self.left_delimiter.as_deref().unwrap_or("{{"),
            self.right_delimiter.as_deref().unwrap_or("}}"),
        )
    }
}

/// Whether `path`, as written (with `${VAR}` references left in), stays inside the task's
/// directories: relative with no `..` climbing above its start, or starting with one of the
/// directory variables. None if it stays; else why not.
pub fn path_escapes(path: &str) -> Option<String> {
    const ROOTS: [&str; 3] = ["${WHARF_TASK_DIR}", "${WHARF_SECRETS_DIR}", "${WHARF_ALLOC_DIR}"];
    let rest = ROOTS.iter().find_map(|root| path.strip_prefix(root));
    let relative = match rest {
        Some(rest) => rest.trim_start_matches('/'),
        None if path.starts_with('/') => {
            return Some(format!(
                "{path:?} is absolute; write it relative to the task's directory or under \
                 ${{WHARF_TASK_DIR}}, ${{WHARF_SECRETS_DIR}} or ${{WHARF_ALLOC_DIR}}"
            ));
        }
        None => path,
    };
    let mut depth = 0usize;
    for component in Path::new(relative).components() {
        match component {
            Component::ParentDir if depth == 0 => {
                return Some(format!("{path:?} escapes the task's directories"));
            }
            Component::ParentDir => depth -= 1,
            Component::Normal(_) => depth += 1,
            Component::CurDir | Component::RootDir | Component::Prefix(_) => {}
        }
    }
    None
}

/// Adds the problems of `templates` (the task at `at`) to `problems`.
pub(crate) fn validate(problems: &mut Problems, at: &str, templates: &[Template]) {
    let mut destinations = std::collections::HashSet::new();
    for (i, template) in templates.iter().enumerate() {
        let at = format!("{at}.template[{i}]");
        match (&template.data, &template.source) {
            (Some(_), Some(_)) => {
                problems.add(&format!("{at}.source"), "set `data` or `source`, not both".into())
            }
            (None, None) => problems.add(
                &format!("{at}.data"),
                "a template needs `data` (the template) or `source` (a file holding it)".into(),
            ),
            _ => {}
        }
        if let Some(source) = &template.source
            && let Some(problem) = path_escapes(source)
        {
            problems.add(&format!("{at}.source"), problem);
        }
        if template.destination.trim().is_empty() {
            problems.add(&format!("{at}.destination"), "a template needs a destination".into());
        } else if let Some(problem) = path_escapes(&template.destination) {
            problems.add(&format!("{at}.destination"), problem);
        } else if !destinations.insert(template.destination.as_str()) {
            problems.add(
                &format!("{at}.destination"),
                format!("another template already renders into {:?}", template.destination),
            );
        }
        if template.mode().is_none() {
            problems.add(
                &format!("{at}.perms"),
                format!("{:?} is not an octal file mode such as \"644\"", template.perms),
            );
        }
        validate_change_mode(problems, &at, template);
        for (field, delimiter) in [
            ("left_delimiter", &template.left_delimiter),
            ("right_delimiter", &template.right_delimiter),
        ] {
            if delimiter.as_deref().is_some_and(|d| d.trim().is_empty()) {
                problems.add(&format!("{at}.{field}"), "a delimiter cannot be empty".into());
            }
        }
        if let Some(wait) = template.wait
            && wait.min > wait.max
        {
            problems.add(
                &format!("{at}.wait"),
                format!(
                    "min {} is longer than max {}",
                    duration::Formatted(wait.min),
                    duration::Formatted(wait.max)
                ),
            );
        }
    }
}

fn validate_change_mode(problems: &mut Problems, at: &str, template: &Template) {
    match template.change_mode {
        ChangeMode::Signal if template.change_signal.is_none() => problems.add(
            &format!("{at}.change_signal"),
            "change_mode \"signal\" needs a change_signal, such as \"SIGHUP\"".into(),
        ),
        ChangeMode::Script if template.change_script.is_none() => problems.add(
            &format!("{at}.change_script"),
            "change_mode \"script\" needs a change_script block with a command".into(),
        ),
        _ => {}
    }
    if template.change_signal.is_some() && template.change_mode != ChangeMode::Signal {
        problems.add(
            &format!("{at}.change_signal"),
            "change_signal is only used with change_mode \"signal\"".into(),
        );
    }
    if let Some(script) = &template.change_script {
        if template.change_mode != ChangeMode::Script {
            problems.add(
                &format!("{at}.change_script"),
                "change_script is only used with change_mode \"script\"".into(),
            );
        }
        if script.command.trim().is_empty() {
            problems.add(&format!("{at}.change_script.command"), "a script needs a command".into());
        }
        if script.timeout.is_zero() {
            problems.add(&format!("{at}.change_script.timeout"), "must be longer than 0s".into());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_inside_the_task_directories_pass_and_escapes_are_named() {
        for inside in ["local/app.conf", "a/../b", "${WHARF_SECRETS_DIR}/token", "./x"] {
            assert_eq!(path_escapes(inside), None, "{inside}");
        }
        for outside in ["../x", "local/../../x", "/etc/passwd", "${WHARF_TASK_DIR}/../../x"] {
            assert!(path_escapes(outside).is_some(), "{outside}");
        }
    }
}
