//! A Nomad job's `Templates` as `nomad job run -output` writes them, translated into wharf's
//! template blocks.

use serde_json::json;
use std::time::Duration;
use wharf_nomad::translate;
use wharf_state::{ChangeMode, Signal};

#[test]
fn nomad_templates_become_wharf_templates() {
    let job = json!({
        "ID": "web", "Type": "service",
        "TaskGroups": [{"Name": "g", "Tasks": [{
            "Name": "t", "Driver": "raw_exec", "Config": {"command": "/bin/true"},
            "Templates": [
                {
                    "EmbeddedTmpl": "{{ with nomadVar \"app\" }}{{ .x }}{{ end }}",
                    "DestPath": "${NOMAD_SECRETS_DIR}/app.conf", "SourcePath": "",
                    "ChangeMode": "signal", "ChangeSignal": "SIGHUP", "ChangeScript": null,
                    "Splay": 5_000_000_000u64, "Perms": "0600", "LeftDelim": "{{", "RightDelim": "}}",
                    "Envvars": false, "ErrMissingKey": false, "VaultGrace": 0, "Uid": null, "Gid": null,
                    "Wait": {"Min": 2_000_000_000u64, "Max": 10_000_000_000u64}
                },
                {
                    "EmbeddedTmpl": "A=1\n", "DestPath": "local/app.env", "ChangeMode": "script",
                    "ChangeSignal": "SIGHUP", "Envvars": true,
                    "ChangeScript": {"Command": "/bin/reload", "Args": ["-q"], "Timeout": 3_000_000_000u64, "FailOnError": true}
                }
            ]
        }]}]
    });
    let translated = translate(&job).unwrap();
    let templates = &translated.groups[0].job.groups[0].tasks[0].templates;
    let (first, second) = (&templates[0], &templates[1]);
    assert_eq!(first.destination, "${WHARF_SECRETS_DIR}/app.conf");
    assert_eq!((first.change_mode, first.change_signal), (ChangeMode::Signal, Some(Signal::Hup)));
    assert_eq!((first.splay, first.mode()), (Duration::from_secs(5), Some(0o600)));
    let wait = first.wait.unwrap();
    assert_eq!((wait.min, wait.max), (Duration::from_secs(2), Duration::from_secs(10)));
    assert!(second.env);
    assert_eq!((second.change_mode, second.change_signal), (ChangeMode::Script, None));
    let script = second.change_script.as_ref().unwrap();
    assert_eq!(
        (script.command.as_str(), script.timeout, script.fail_on_error),
        ("/bin/reload", Duration::from_secs(3), true)
    );
    translated.groups[0].job.validate().unwrap();
}
