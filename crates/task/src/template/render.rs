//! One render of one template: Go's text/template language (the `gotmpl` crate) with the
//! functions Nomad's templates offer without Consul or Vault.
//!
//! A function that reads data which is not there yet (`nomadVar`, `key` or `file` of a missing
//! path) fails the render and names what it waits for, as consul-template's blocking queries
//! do: the caller renders again when its sources change. Everything else that goes wrong is an
//! error of the template.

use super::sources::TemplateSources;
use gotmpl::{Template as GoTemplate, TemplateError, Value};
use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use wharf_state::ServiceEntry;

/// What a render reads besides its text.
#[derive(Debug, Clone)]
pub(crate) struct Inputs {
    /// The task's environment, for `env`.
    pub(crate) env: Arc<BTreeMap<String, String>>,
    /// The node's services and variables.
    pub(crate) sources: Arc<dyn TemplateSources>,
    /// The task's directory, for `file` (reads stay inside it).
    pub(crate) task_dir: PathBuf,
}

/// How a render ended, when it did not fail.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Rendered {
    /// The output.
    Done(String),
    /// Data it reads is missing (`nomad.var.block(path)`, ...): render again once it is there.
    Missing(Vec<String>),
}

type Missing = Arc<Mutex<Vec<String>>>;

fn exec_error(message: impl Into<String>) -> TemplateError {
    TemplateError::Exec(message.into())
}

fn string_arg<'a>(function: &str, args: &'a [Value], at: usize) -> gotmpl::Result<&'a str> {
    args.get(at)
        .and_then(Value::as_str)
        .ok_or_else(|| exec_error(format!("{function}: argument {} must be a string", at + 1)))
}

fn want_args(function: &str, args: &[Value], count: usize) -> gotmpl::Result<()> {
    if args.len() == count {
        Ok(())
    } else {
        Err(exec_error(format!("{function}: wants {count} arguments, got {}", args.len())))
    }
}

fn text(value: impl AsRef<str>) -> Value {
    Value::String(Arc::from(value.as_ref()))
}

/// A JSON value as a template value.
pub(crate) fn from_json(value: &serde_json::Value) -> Value {
    use serde_json::Value as J;
    match value {
        J::Null => Value::Nil,
        J::Bool(b) => Value::Bool(*b),
        J::Number(n) => match (n.as_i64(), n.as_u64()) {
            (Some(i), _) => Value::Int(i),
            (None, Some(u)) => Value::Uint(u),
            _ => Value::Float(n.as_f64().unwrap_or(0.0)),
        },
        J::String(s) => text(s),
        J::Array(items) => Value::List(items.iter().map(from_json).collect::<Vec<_>>().into()),
        J::Object(map) => Value::Map(Arc::new(
            map.iter().map(|(k, v)| (Arc::from(k.as_str()), from_json(v))).collect(),
        )),
    }
}

/// A template value as JSON (functions become null).
pub(crate) fn to_json(value: &Value) -> serde_json::Value {
    use serde_json::Value as J;
    match value {
        Value::Bool(b) => J::Bool(*b),
        Value::Int(i) => J::from(*i),
        Value::Uint(u) => J::from(*u),
        Value::Float(f) => serde_json::Number::from_f64(*f).map_or(J::Null, J::Number),
        Value::String(s) => J::String(s.to_string()),
        Value::List(items) => J::Array(items.iter().map(to_json).collect()),
        Value::Map(map) => {
            J::Object(map.iter().map(|(k, v)| (k.to_string(), to_json(v))).collect())
        }
        _ => J::Null,
    }
}

fn service_value(entry: &ServiceEntry) -> Value {
    let address = entry.address.map(|a| a.to_string()).unwrap_or_default();
    let fields = [
        ("ID", text(format!("_wharf-task-{}-{}-{}", entry.alloc_id, entry.task, entry.name))),
        ("Name", text(&entry.name)),
        ("ServiceName", text(&entry.name)),
        ("Address", text(address)),
        ("Port", Value::Int(entry.port.map_or(0, i64::from))),
        ("Tags", Value::List(entry.tags.iter().map(text).collect::<Vec<_>>().into())),
        ("AllocID", text(&entry.alloc_id)),
        ("JobID", text(&entry.job_id)),
        ("Group", text(&entry.group)),
        ("Task", text(&entry.task)),
    ];
    Value::Map(Arc::new(fields.into_iter().map(|(k, v)| (Arc::from(k), v)).collect()))
}

fn list_of_strings(function: &str, value: &Value) -> gotmpl::Result<Vec<String>> {
    match value {
        Value::List(items) => Ok(items
            .iter()
            .map(|item| match item {
                Value::String(s) => s.to_string(),
                other => other.to_string(),
            })
            .collect()),
        _ => Err(exec_error(format!("{function}: wants a list"))),
    }
}

/// `path` as the `file` function reads it: relative to the task's directory, or absolute
/// inside it.
fn file_in_task_dir(task_dir: &Path, path: &str) -> gotmpl::Result<PathBuf> {
    let relative = match Path::new(path).strip_prefix(task_dir) {
        Ok(rest) => rest.to_owned(),
        Err(_) if Path::new(path).is_absolute() => {
            return Err(exec_error(format!("file: {path:?} is outside the task's directory")));
        }
        Err(_) => PathBuf::from(path),
    };
    if wharf_state::template::path_escapes(&relative.to_string_lossy()).is_some() {
        return Err(exec_error(format!("file: {path:?} is outside the task's directory")));
    }
    Ok(relative)
}

fn data_functions(template: GoTemplate, inputs: &Inputs, missing: &Missing) -> GoTemplate {
    let env = inputs.env.clone();
    let sources = inputs.sources.clone();
    let services = move |args: &[Value]| {
        want_args("nomadService", args, 1)?;
        let query = string_arg("nomadService", args, 0)?;
        // "tag.name" keeps the instances that carry the tag, as Consul's `service` does.
        let (tag, name) = match query.split_once('.') {
            Some((tag, name)) => (Some(tag), name),
            None => (None, query),
        };
        let entries = sources.services(name);
        let list: Vec<Value> = entries
            .iter()
            .filter(|e| tag.is_none_or(|tag| e.tags.iter().any(|t| t == tag)))
            .map(service_value)
            .collect();
        Ok(Value::List(list.into()))
    };
    let services = Arc::new(services);
    let (sources, waits) = (inputs.sources.clone(), missing.clone());
    let variable = move |args: &[Value]| {
        want_args("nomadVar", args, 1)?;
        let path = string_arg("nomadVar", args, 0)?;
        match sources.variable(path) {
            Some(items) => Ok(Value::Map(Arc::new(
                items.into_iter().map(|(k, v)| (Arc::from(k.as_str()), text(v))).collect(),
            ))),
            None => {
                waits.lock().push(format!("nomad.var.block({path})"));
                Err(exec_error(format!("nomadVar: no variable at {path:?} yet")))
            }
        }
    };
    let key_lookup = {
        let sources = inputs.sources.clone();
        move |path: &str| -> Option<String> {
            let (parent, item) = path.rsplit_once('/')?;
            sources.variable(parent)?.get(item).cloned()
        }
    };
    let key_lookup = Arc::new(key_lookup);
    let (lookup, waits) = (key_lookup.clone(), missing.clone());
    let key = move |args: &[Value]| {
        want_args("key", args, 1)?;
        let path = string_arg("key", args, 0)?;
        match lookup(path) {
            Some(value) => Ok(text(value)),
            None => {
                waits.lock().push(format!("kv.block({path})"));
                Err(exec_error(format!("key: nothing at {path:?} yet")))
            }
        }
    };
    let key_or_default = move |args: &[Value]| {
        want_args("keyOrDefault", args, 2)?;
        let path = string_arg("keyOrDefault", args, 0)?;
        let default = string_arg("keyOrDefault", args, 1)?;
        Ok(text(key_lookup(path).unwrap_or_else(|| default.to_owned())))
    };
    let (task_dir, waits) = (inputs.task_dir.clone(), missing.clone());
    let file = move |args: &[Value]| {
        want_args("file", args, 1)?;
        let path = string_arg("file", args, 0)?;
        let relative = file_in_task_dir(&task_dir, path)?;
        let dir = wharf_isolate::dirs::OpenDir::open(&task_dir)
            .map_err(|e| exec_error(format!("file: {e}")))?;
        match dir.read_file(&relative) {
            Ok(bytes) => Ok(text(String::from_utf8_lossy(&bytes))),
            Err(wharf_isolate::IsolateError::Io { source, .. })
                if source.kind() == std::io::ErrorKind::NotFound =>
            {
                waits.lock().push(format!("file({path})"));
                Err(exec_error(format!("file: {path:?} does not exist yet")))
            }
            Err(e) => Err(exec_error(format!("file: {e}"))),
        }
    };
    let sources = inputs.sources.clone();
    let variable_list = move |args: &[Value]| {
        let prefix = match args {
            [] => "",
            [_] => string_arg("nomadVarList", args, 0)?,
            _ => return Err(exec_error("nomadVarList: wants at most 1 argument")),
        };
        let list: Vec<Value> = sources
            .variable_paths(prefix)
            .into_iter()
            .map(|path| {
                let fields = [("Path", text(&path)), ("Namespace", text("default"))];
                Value::Map(Arc::new(fields.into_iter().map(|(k, v)| (Arc::from(k), v)).collect()))
            })
            .collect();
        Ok(Value::List(list.into()))
    };
    let sources = inputs.sources.clone();
    let variable_exists = move |args: &[Value]| {
        want_args("nomadVarExists", args, 1)?;
        Ok(Value::Bool(sources.variable(string_arg("nomadVarExists", args, 0)?).is_some()))
    };
    let service_alias = services.clone();
    template
        .func("env", move |args| {
            want_args("env", args, 1)?;
            let name = string_arg("env", args, 0)?;
            Ok(text(env.get(name).map(String::as_str).unwrap_or("")))
        })
        .func("nomadService", move |args| services(args))
        .func("service", move |args| service_alias(args))
        .func("nomadVar", variable)
        .func("nomadVarList", variable_list)
        .func("nomadVarExists", variable_exists)
        .func("key", key)
        .func("keyOrDefault", key_or_default)
        .func("file", file)
}

fn three_strings(
    function: &'static str,
    apply: fn(&str, &str, &str) -> String,
) -> impl Fn(&[Value]) -> gotmpl::Result<Value> + Send + Sync + 'static {
    move |args: &[Value]| {
        want_args(function, args, 3)?;
        Ok(text(apply(
            string_arg(function, args, 0)?,
            string_arg(function, args, 1)?,
            string_arg(function, args, 2)?,
        )))
    }
}

fn two_strings(
    function: &'static str,
    apply: fn(&str, &str) -> String,
) -> impl Fn(&[Value]) -> gotmpl::Result<Value> + Send + Sync + 'static {
    move |args: &[Value]| {
        want_args(function, args, 2)?;
        Ok(text(apply(string_arg(function, args, 0)?, string_arg(function, args, 1)?)))
    }
}

fn one_string(
    function: &'static str,
    apply: fn(&str) -> String,
) -> impl Fn(&[Value]) -> gotmpl::Result<Value> + Send + Sync + 'static {
    move |args: &[Value]| {
        want_args(function, args, 1)?;
        Ok(text(apply(string_arg(function, args, 0)?)))
    }
}

fn title(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut at_word_start = true;
    for c in s.chars() {
        if at_word_start {
            out.extend(c.to_uppercase())
        } else {
            out.push(c)
        }
        at_word_start = c.is_whitespace();
    }
    out
}

fn value_functions(template: GoTemplate) -> GoTemplate {
    template
        .func("toJSON", |args| {
            want_args("toJSON", args, 1)?;
            Ok(text(to_json(&args[0]).to_string()))
        })
        .func("toJSONPretty", |args| {
            want_args("toJSONPretty", args, 1)?;
            serde_json::to_string_pretty(&to_json(&args[0]))
                .map(text)
                .map_err(|e| exec_error(format!("toJSONPretty: {e}")))
        })
        .func("parseJSON", |args| {
            want_args("parseJSON", args, 1)?;
            let input = string_arg("parseJSON", args, 0)?;
            serde_json::from_str::<serde_json::Value>(input)
                .map(|v| from_json(&v))
                .map_err(|e| exec_error(format!("parseJSON: {e}")))
        })
        .func("split", |args| {
            want_args("split", args, 2)?;
            let (sep, input) = (string_arg("split", args, 0)?, string_arg("split", args, 1)?);
            if input.is_empty() {
                return Ok(Value::List(Vec::new().into()));
            }
            Ok(Value::List(input.split(sep).map(text).collect::<Vec<_>>().into()))
        })
        .func("join", |args| {
            want_args("join", args, 2)?;
            let sep = string_arg("join", args, 0)?;
            Ok(text(list_of_strings("join", &args[1])?.join(sep)))
        })
        .func("contains", |args| {
            want_args("contains", args, 2)?;
            let found = match &args[1] {
                Value::List(items) => {
                    items.iter().any(|item| item.to_string() == args[0].to_string())
                }
                Value::String(s) => s.contains(string_arg("contains", args, 0)?),
                _ => return Err(exec_error("contains: wants a list or a string to look in")),
            };
            Ok(Value::Bool(found))
        })
        .func("parseInt", |args| {
            want_args("parseInt", args, 1)?;
            let input = string_arg("parseInt", args, 0)?;
            input
                .trim()
                .parse::<i64>()
                .map(Value::Int)
                .map_err(|e| exec_error(format!("parseInt: {e}")))
        })
        .func("parseBool", |args| {
            want_args("parseBool", args, 1)?;
            match string_arg("parseBool", args, 0)?.trim() {
                "1" | "t" | "T" | "true" | "TRUE" | "True" => Ok(Value::Bool(true)),
                "0" | "f" | "F" | "false" | "FALSE" | "False" => Ok(Value::Bool(false)),
                other => Err(exec_error(format!("parseBool: {other:?} is not a boolean"))),
            }
        })
}

fn string_functions(template: GoTemplate) -> GoTemplate {
    template
        .func("toLower", one_string("toLower", str::to_lowercase))
        .func("toUpper", one_string("toUpper", str::to_uppercase))
        .func("toTitle", one_string("toTitle", title))
        .func("trimSpace", one_string("trimSpace", |s| s.trim().to_owned()))
        .func(
            "trimPrefix",
            two_strings("trimPrefix", |p, s| s.strip_prefix(p).unwrap_or(s).to_owned()),
        )
        .func(
            "trimSuffix",
            two_strings("trimSuffix", |p, s| s.strip_suffix(p).unwrap_or(s).to_owned()),
        )
        .func("trim", two_strings("trim", |cut, s| s.trim_matches(|c| cut.contains(c)).to_owned()))
        .func("replaceAll", three_strings("replaceAll", |old, new, s| s.replace(old, new)))
        .func("indent", |args| {
            want_args("indent", args, 2)?;
            let spaces =
                args[0].as_int().ok_or_else(|| exec_error("indent: wants a number of spaces"))?;
            let pad = " ".repeat(usize::try_from(spaces).unwrap_or(0));
            let input = string_arg("indent", args, 1)?;
            Ok(text(input.lines().map(|l| format!("{pad}{l}")).collect::<Vec<_>>().join("\n")))
        })
}

/// Renders `source` with `delimiters`.
pub(crate) fn render(
    name: &str,
    source: &str,
    delimiters: (&str, &str),
    inputs: &Inputs,
) -> Result<Rendered, String> {
    let missing: Missing = Arc::default();
    let template = GoTemplate::new(name).delims(delimiters.0, delimiters.1);
    let template = string_functions(value_functions(data_functions(template, inputs, &missing)));
    let template = template.parse(source).map_err(|e| e.to_string())?;
    let data = Value::Map(Arc::default());
    match template.execute_to_string(&data) {
        Ok(output) => Ok(Rendered::Done(output)),
        Err(error) => {
            let waits = std::mem::take(&mut *missing.lock());
            if waits.is_empty() { Err(error.to_string()) } else { Ok(Rendered::Missing(waits)) }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::template::sources::MemorySources;

    fn inputs(sources: Arc<MemorySources>) -> Inputs {
        Inputs {
            env: Arc::new(BTreeMap::from([("PORT".to_owned(), "8080".to_owned())])),
            sources,
            task_dir: PathBuf::from("/nonexistent"),
        }
    }

    fn render_ok(source: &str, sources: Arc<MemorySources>) -> String {
        match render("t", source, ("{{", "}}"), &inputs(sources)) {
            Ok(Rendered::Done(out)) => out,
            other => panic!("{source}: {other:?}"),
        }
    }

    #[test]
    fn functions_read_env_variables_services_and_json() {
        let sources = MemorySources::new();
        sources.put_variable("app/config", [("user", "ann"), ("port", "9000")]);
        sources.set_services(vec![ServiceEntry {
            name: "db".into(),
            address: Some("10.0.0.2".parse().unwrap()),
            port: Some(5432),
            tags: vec!["primary".into()],
            health: wharf_state::CheckStatus::Passing,
            alloc_id: "a1".into(),
            job_id: "j".into(),
            group: "g".into(),
            task: "t".into(),
        }]);
        let cases = [
            (r#"{{ env "PORT" }}/{{ env "NOPE" }}"#, "8080/"),
            (r#"{{ with nomadVar "app/config" }}{{ .user }}:{{ .port }}{{ end }}"#, "ann:9000"),
            (r#"{{ key "app/config/port" }}"#, "9000"),
            (r#"{{ range nomadVarList "app/" }}{{ .Path }};{{ end }}"#, "app/config;"),
            (r#"{{ nomadVarExists "app/config" }} {{ nomadVarExists "app/none" }}"#, "true false"),
            (r#"{{ keyOrDefault "app/none/x" "d" }}"#, "d"),
            (
                r#"{{ range nomadService "db" }}{{ .Address }}:{{ .Port }} {{ join "," .Tags }}{{ end }}"#,
                "10.0.0.2:5432 primary",
            ),
            (
                r#"{{ range service "primary.db" }}{{ .Name }}{{ end }}{{ range service "replica.db" }}x{{ end }}"#,
                "db",
            ),
            (r#"{{ with parseJSON "{\"a\":[1,2]}" }}{{ toJSON .a }}{{ end }}"#, "[1,2]"),
            (r#"{{ split "," "a,b,c" | join "-" }}"#, "a-b-c"),
            (
                r#"{{ "Hello" | toUpper }} {{ "  x " | trimSpace }} {{ replaceAll "a" "o" "banana" }}"#,
                "HELLO x bonono",
            ),
            (r#"{{ if contains "b" (split "," "a,b") }}yes{{ end }}"#, "yes"),
        ];
        for (source, want) in cases {
            assert_eq!(render_ok(source, sources.clone()), want, "{source}");
        }
    }

    #[test]
    fn missing_data_waits_and_bad_templates_fail() {
        let sources = MemorySources::new();
        let got = render(
            "t",
            r#"{{ nomadVar "x/y" }}{{ key "a/b" }}"#,
            ("{{", "}}"),
            &inputs(sources.clone()),
        );
        assert_eq!(got, Ok(Rendered::Missing(vec!["nomad.var.block(x/y)".into()])));
        let error = render("t", "{{ nope }}", ("{{", "}}"), &inputs(sources.clone())).unwrap_err();
        assert!(error.contains("nope"), "{error}");
        let error = render("t", "{{ if }}", ("{{", "}}"), &inputs(sources)).unwrap_err();
        assert!(!error.is_empty());
    }

    #[test]
    fn custom_delimiters_leave_braces_alone() {
        let out = render(
            "t",
            r#"{{ raw }} [[ env "PORT" ]]"#,
            ("[[", "]]"),
            &inputs(MemorySources::new()),
        );
        assert_eq!(out, Ok(Rendered::Done("{{ raw }} 8080".into())));
    }
}
