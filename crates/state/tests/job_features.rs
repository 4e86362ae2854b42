//! The job spec's `max_run_duration`, `shutdown_delay`, artifacts, host volumes and
//! readiness: read from TOML and JSON alike, and every mistake named by its field.

use std::time::Duration;
use wharf_state::spec;

fn doc(group: &str, task: &str) -> String {
    format!(
        "[job]\nid = \"j\"\ntype = \"batch\"\n[group]\nname = \"g\"\n{group}\n\
         [[group.task]]\nname = \"t\"\ndriver = \"raw_exec\"\n{task}\n"
    )
}

/// Parses `text` and expects one problem naming `field` with `phrase` in it.
fn refused(text: &str, field: &str, phrase: &str) {
    let error = spec::parse_toml(text).expect_err(text);
    assert!(
        error.problems.iter().any(|p| p.field == field && p.message.contains(phrase)),
        "expected {field}: …{phrase}… in\n{error}\nfor\n{text}"
    );
}

/// Parses `text` as TOML, writes it as JSON and reads that back: the same job.
fn both_ways(text: &str) -> wharf_state::Job {
    let job = spec::parse_toml(text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    let json = serde_json::to_string(&job.to_spec()).unwrap();
    let again = spec::parse_json(&json).unwrap_or_else(|e| panic!("{e}\n{json}"));
    assert_eq!(again, job, "{json}");
    job
}

#[test]
fn lifetime_settings_read_from_toml_and_json() {
    let job = both_ways(&doc(
        "max_run_duration = \"90s\"\nshutdown_delay = \"2s\"",
        "shutdown_delay = \"500ms\"",
    ));
    let group = &job.groups[0];
    assert_eq!(group.max_run_duration, Some(Duration::from_secs(90)));
    assert_eq!(group.shutdown_delay, Some(Duration::from_secs(2)));
    assert_eq!(group.tasks[0].shutdown_delay, Some(Duration::from_millis(500)));
    let plain = both_ways(&doc("", ""));
    assert_eq!(
        (plain.groups[0].max_run_duration, plain.groups[0].shutdown_delay),
        (None, None),
        "no limit and no delay unless asked"
    );
}

#[test]
fn lifetime_mistakes_name_the_field() {
    refused(&doc("max_run_duration = \"0\"", ""), "group.max_run_duration", "longer than 0");
    refused(&doc("max_run_duration = \"soon\"", ""), "group.max_run_duration", "invalid duration");
    refused(&doc("shutdown_delay = \"2h\"", ""), "group.shutdown_delay", "maximum of 1h0m0s");
    refused(&doc("", "shutdown_delay = \"3h\""), "group.task[0].shutdown_delay", "maximum");
    refused(&doc("", "shutdown_delay = 5"), "group.task[0].shutdown_delay", "invalid type");
}
