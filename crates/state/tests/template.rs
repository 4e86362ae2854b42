//! `template` blocks in TOML and JSON specs, and the problems validation names.

use std::time::Duration;
use wharf_state::{ChangeMode, Signal, spec};

fn toml_with(template: &str) -> String {
    format!(
        "[job]\nid = \"j\"\ntype = \"service\"\n[group]\nname = \"g\"\n\
         [[group.task]]\nname = \"t\"\ndriver = \"raw_exec\"\n\
         [[group.task.template]]\n{template}\n"
    )
}

#[test]
fn every_field_reads_from_toml() {
    let job = spec::parse_toml(&toml_with(
        "data = \"port={{ env \\\"PORT\\\" }}\"\ndestination = \"local/app.conf\"\n\
         perms = \"600\"\nchange_mode = \"signal\"\nchange_signal = \"SIGHUP\"\nsplay = \"1s\"\n\
         env = true\nleft_delimiter = \"[[\"\nright_delimiter = \"]]\"\n\
         wait = { min = \"2s\", max = \"10s\" }",
    ))
    .unwrap();
    let template = &job.groups[0].tasks[0].templates[0];
    assert_eq!(template.destination, "local/app.conf");
    assert_eq!(template.mode(), Some(0o600));
    assert_eq!(template.change_mode, ChangeMode::Signal);
    assert_eq!(template.change_signal, Some(Signal::Hup));
    assert_eq!(template.splay, Duration::from_secs(1));
    assert!(template.env);
    assert_eq!(template.delimiters(), ("[[", "]]"));
    let wait = template.wait.unwrap();
    assert_eq!((wait.min, wait.max), (Duration::from_secs(2), Duration::from_secs(10)));
}

#[test]
fn defaults_are_nomads_and_json_reads_the_same_shape() {
    let json = r#"{"job":{"id":"j","type":"batch"},"group":{"name":"g","task":[{"name":"t",
        "driver":"raw_exec","template":[{"source":"local/in.tpl","destination":"out.txt",
        "change_mode":"script","change_script":{"command":"/bin/reload","args":["-q"]}}]}]}}"#;
    let job = spec::parse_json(json).unwrap();
    let template = &job.groups[0].tasks[0].templates[0];
    assert_eq!(template.source.as_deref(), Some("local/in.tpl"));
    assert_eq!(template.mode(), Some(0o644));
    assert_eq!(template.splay, Duration::from_secs(5));
    assert_eq!(template.delimiters(), ("{{", "}}"));
    let script = template.change_script.as_ref().unwrap();
    assert_eq!((script.command.as_str(), script.timeout), ("/bin/reload", Duration::from_secs(5)));
    let toml = spec::parse_toml(&toml_with("data = \"x\"\ndestination = \"out\"")).unwrap();
    assert_eq!(toml.groups[0].tasks[0].templates[0].change_mode, ChangeMode::Restart);
}

#[test]
fn invalid_templates_name_the_field() {
    let cases = [
        ("destination = \"out\"", "group.task[0].template[0].data", "needs `data`"),
        (
            "data = \"x\"\nsource = \"y\"\ndestination = \"out\"",
            "group.task[0].template[0].source",
            "not both",
        ),
        (
            "data = \"x\"\ndestination = \"../../etc/passwd\"",
            "group.task[0].template[0].destination",
            "escapes",
        ),
        (
            "data = \"x\"\ndestination = \"/etc/passwd\"",
            "group.task[0].template[0].destination",
            "absolute",
        ),
        (
            "source = \"../../x\"\ndestination = \"out\"",
            "group.task[0].template[0].source",
            "escapes",
        ),
        (
            "data = \"x\"\ndestination = \"\"",
            "group.task[0].template[0].destination",
            "needs a destination",
        ),
        (
            "data = \"x\"\ndestination = \"out\"\nperms = \"rw\"",
            "group.task[0].template[0].perms",
            "octal",
        ),
        (
            "data = \"x\"\ndestination = \"out\"\nchange_mode = \"signal\"",
            "group.task[0].template[0].change_signal",
            "needs a change_signal",
        ),
        (
            "data = \"x\"\ndestination = \"out\"\nchange_signal = \"SIGHUP\"",
            "group.task[0].template[0].change_signal",
            "only used",
        ),
        (
            "data = \"x\"\ndestination = \"out\"\nchange_mode = \"script\"",
            "group.task[0].template[0].change_script",
            "needs a change_script",
        ),
        (
            "data = \"x\"\ndestination = \"out\"\nleft_delimiter = \"\"",
            "group.task[0].template[0].left_delimiter",
            "empty",
        ),
        (
            "data = \"x\"\ndestination = \"out\"\nwait = { min = \"5s\", max = \"1s\" }",
            "group.task[0].template[0].wait",
            "longer than max",
        ),
        (
            "data = \"x\"\ndestination = \"out\"\nchange_mode = \"reload\"",
            "group.task[0].template[0].change_mode",
            "unknown variant",
        ),
        (
            "data = \"x\"\ndestination = \"out\"\nsplay = \"soon\"",
            "group.task[0].template[0].splay",
            "",
        ),
        (
            "data = \"x\"\ndestination = \"out\"\nchange_signal = \"SIGNOPE\"",
            "group.task[0].template[0].change_signal",
            "unknown signal",
        ),
    ];
    for (body, field, message) in cases {
        let error = spec::parse_toml(&toml_with(body)).expect_err(body);
        let problem = &error.problems[0];
        assert_eq!(problem.field, field, "{body}: {error}");
        assert!(problem.message.contains(message), "{body}: {error}");
    }
}

#[test]
fn two_templates_cannot_render_into_one_file() {
    let doc = toml_with("data = \"a\"\ndestination = \"out\"")
        + "[[group.task.template]]\ndata = \"b\"\ndestination = \"out\"\n";
    let error = spec::parse_toml(&doc).unwrap_err();
    assert_eq!(error.problems[0].field, "group.task[0].template[1].destination");
}
