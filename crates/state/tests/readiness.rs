//! A task's `wait_healthy` and `wait_deadline`: read from TOML and JSON alike, and every
//! mistake (an unknown task, a task waiting on itself, a cycle) named by its field.

use std::time::Duration;
use wharf_state::spec;

/// A group of tasks `a`, `b` and `c`, each with a script check, and `extra` TOML after each
/// task's name (in order).
fn doc(extra: [&str; 3]) -> String {
    let mut text = String::from("[job]\nid = \"j\"\ntype = \"service\"\n[group]\nname = \"g\"\n");
    for (name, extra) in ["a", "b", "c"].iter().zip(extra) {
        text.push_str(&format!(
            "[[group.task]]\nname = \"{name}\"\ndriver = \"raw_exec\"\n{extra}\n\
             [[group.task.service]]\nname = \"{name}-svc\"\n\
             [[group.task.service.check]]\nname = \"up\"\ntype = \"script\"\n\
             command = \"/bin/true\"\ninterval = \"1s\"\ntimeout = \"1s\"\n"
        ));
    }
    text
}

/// Parses `text` and expects one problem naming `field` with `phrase` in it.
fn refused(text: &str, field: &str, phrase: &str) {
    let error = spec::parse_toml(text).expect_err(text);
    assert!(
        error.problems.iter().any(|p| p.field == field && p.message.contains(phrase)),
        "expected {field}: …{phrase}… in\n{error}\nfor\n{text}"
    );
}

#[test]
fn wait_healthy_reads_from_toml_and_json() {
    let text = doc(["wait_healthy = [\"b\", \"c\"]\nwait_deadline = \"45s\"", "", ""]);
    let job = spec::parse_toml(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    let json = serde_json::to_string(&job.to_spec()).unwrap();
    let again = spec::parse_json(&json).unwrap_or_else(|e| panic!("{e}\n{json}"));
    assert_eq!(again, job, "{json}");
    let a = &job.groups[0].tasks[0];
    assert_eq!(a.wait_healthy, ["b", "c"]);
    assert_eq!(a.wait_deadline, Some(Duration::from_secs(45)));
    let b = &job.groups[0].tasks[1];
    assert!(b.wait_healthy.is_empty() && b.wait_deadline.is_none(), "nothing to wait for");
}

#[test]
fn wait_healthy_mistakes_name_the_field() {
    let field = "group.task[0].wait_healthy";
    refused(&doc(["wait_healthy = [\"db\"]", "", ""]), field, "no task \"db\"");
    refused(&doc(["wait_healthy = [\"a\"]", "", ""]), field, "cannot wait for itself");
    refused(
        &doc(["wait_healthy = [\"b\"]", "wait_healthy = [\"c\"]", "wait_healthy = [\"a\"]"]),
        field,
        "cycle: a -> b -> c -> a",
    );
    refused(
        &doc(["", "wait_healthy = [\"c\"]", "wait_healthy = [\"b\"]"]),
        "group.task[1].wait_healthy",
        "cycle: b -> c -> b",
    );
    let deadline = "group.task[0].wait_deadline";
    refused(
        &doc(["wait_healthy = [\"b\"]\nwait_deadline = \"0s\"", "", ""]),
        deadline,
        "longer than 0",
    );
    refused(&doc(["wait_healthy = [\"b\"]\nwait_deadline = \"48h\"", "", ""]), deadline, "maximum");
    refused(&doc(["wait_deadline = \"1m\"", "", ""]), deadline, "names no task");
    refused(&doc(["wait_healthy = \"b\"", "", ""]), field, "invalid type");
}

#[test]
fn a_task_without_checks_cannot_be_waited_for() {
    let text = "[job]\nid = \"j\"\ntype = \"service\"\n[group]\nname = \"g\"\n\
                [[group.task]]\nname = \"a\"\ndriver = \"raw_exec\"\nwait_healthy = [\"b\"]\n\
                [[group.task]]\nname = \"b\"\ndriver = \"raw_exec\"\n";
    refused(text, "group.task[0].wait_healthy", "task \"b\" has no service check");
}

/// `wait_ready` and `notify_socket` read from TOML and JSON alike.
#[test]
fn wait_ready_and_notify_socket_read_from_toml_and_json() {
    let text = doc(["wait_ready = [\"b\"]\nwait_deadline = \"20s\"", "notify_socket = true", ""]);
    let job = spec::parse_toml(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    let json = serde_json::to_string(&job.to_spec()).unwrap();
    assert!(json.contains("\"notify_socket\":true") && json.contains("\"wait_ready\":[\"b\"]"));
    let again = spec::parse_json(&json).unwrap_or_else(|e| panic!("{e}\n{json}"));
    assert_eq!(again, job, "{json}");
    let (a, b, c) = (&job.groups[0].tasks[0], &job.groups[0].tasks[1], &job.groups[0].tasks[2]);
    assert_eq!(a.wait_ready, ["b"]);
    assert_eq!(a.wait_deadline, Some(Duration::from_secs(20)));
    assert!(b.notify_socket && !a.notify_socket && !c.notify_socket);
}

/// Each mistake of `wait_ready` is named by its field: an unknown task, the task itself, a
/// task without a notify socket, a cycle through both kinds of wait, a wrong type.
#[test]
fn wait_ready_mistakes_name_the_field() {
    let field = "group.task[0].wait_ready";
    refused(&doc(["wait_ready = [\"db\"]", "", ""]), field, "no task \"db\"");
    refused(&doc(["wait_ready = [\"a\"]\nnotify_socket = true", "", ""]), field, "itself");
    refused(&doc(["wait_ready = [\"b\"]", "", ""]), field, "does not set notify_socket = true");
    refused(
        &doc(["wait_ready = [\"b\"]", "notify_socket = true\nwait_healthy = [\"a\"]", ""]),
        "group.task[0].wait_ready",
        "cycle: a -> b -> a",
    );
    refused(&doc(["wait_ready = \"b\"", "notify_socket = true", ""]), field, "invalid type");
    refused(
        &doc(["", "notify_socket = \"yes\"", ""]),
        "group.task[1].notify_socket",
        "invalid type",
    );
    let deadline = "group.task[0].wait_deadline";
    refused(&doc(["wait_deadline = \"1m\"", "", ""]), deadline, "wait_healthy or wait_ready");
}
