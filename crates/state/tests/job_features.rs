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

const ARTIFACT: &str = "[[group.task.artifact]]";

#[test]
fn artifacts_read_from_toml_and_json() {
    let sum = "a".repeat(64);
    let job = both_ways(&doc(
        "",
        &format!(
            "{ARTIFACT}\nsource = \"https://example.com/app.tar.gz\"\n\
             options = {{ checksum = \"sha256:{sum}\" }}\n\
             {ARTIFACT}\nsource = \"/srv/files/app.conf\"\ndestination = \"local/app.conf\"\nmode = \"file\"\n"
        ),
    ));
    let artifacts = &job.groups[0].tasks[0].artifacts;
    assert_eq!(artifacts.len(), 2);
    assert_eq!(artifacts[0].destination, "local/", "Nomad's default destination");
    assert_eq!(artifacts[0].mode, wharf_state::ArtifactMode::Any);
    assert_eq!(
        wharf_state::Checksum::parse(artifacts[0].options.checksum.as_deref().unwrap()),
        Ok(wharf_state::Checksum::Sha256([0xaa; 32]))
    );
    assert_eq!(artifacts[1].mode, wharf_state::ArtifactMode::File);
}

#[test]
fn artifact_mistakes_name_the_field() {
    let with = |body: &str| doc("", &format!("{ARTIFACT}\n{body}\n"));
    let at = "group.task[0].artifact[0]";
    refused(&with("source = \"ftp://x/y\""), &format!("{at}.source"), "not supported");
    refused(&with("source = \"relative/path\""), &format!("{at}.source"), "absolute path");
    refused(
        &with("source = \"/a\"\ndestination = \"../../etc\""),
        &format!("{at}.destination"),
        "leave the task's directory",
    );
    refused(
        &with("source = \"/a\"\ndestination = \"/etc/passwd\""),
        &format!("{at}.destination"),
        "relative",
    );
    refused(
        &with("source = \"/a\"\noptions = { checksum = \"sha1:abc\" }"),
        &format!("{at}.options.checksum"),
        "use sha256 or md5",
    );
    refused(
        &with("source = \"/a\"\noptions = { checksum = \"md5:123\" }"),
        &format!("{at}.options.checksum"),
        "32 hexadecimal digits",
    );
    refused(&with("source = \"/a\"\nmode = \"tree\""), &format!("{at}.mode"), "unknown variant");
    refused(
        &with("source = \"/a\"\noptions = { archive = false }"),
        &format!("{at}.options.archive"),
        "unknown field",
    );
}

const VOLUMES: &str = "[group.volume.data]\ntype = \"host\"\nsource = \"pgdata\"\n\
                       [group.volume.certs]\nsource = \"certs\"\nread_only = true";

#[test]
fn volumes_read_from_toml_and_json() {
    let job = both_ways(&doc(
        VOLUMES,
        "[[group.task.volume_mount]]\nvolume = \"data\"\ndestination = \"/var/lib/db\"\n\
         [[group.task.volume_mount]]\nvolume = \"certs\"\ndestination = \"/etc/certs\"\nread_only = true",
    ));
    let group = &job.groups[0];
    assert_eq!(group.volumes["data"].source, "pgdata");
    assert!(group.volumes["certs"].read_only);
    assert_eq!(group.tasks[0].volume_mounts.len(), 2);
    let offered = std::collections::BTreeMap::from([
        (
            "pgdata".to_owned(),
            wharf_state::volume::HostVolume { path: "/srv/pg".into(), read_only: false },
        ),
        (
            "certs".to_owned(),
            wharf_state::volume::HostVolume { path: "/etc/ssl".into(), read_only: true },
        ),
    ]);
    let mounts =
        wharf_state::volume::resolve(&group.volumes, &group.tasks[0].volume_mounts, &offered)
            .unwrap();
    assert_eq!(
        mounts.iter().map(|m| (m.source.display().to_string(), m.read_only)).collect::<Vec<_>>(),
        [("/srv/pg".to_owned(), false), ("/etc/ssl".to_owned(), true)]
    );
    assert_eq!(wharf_state::volume::env_name("pg-data"), "WHARF_VOLUME_PG_DATA");
    let writers = |_: &str| true;
    assert!(wharf_state::volume::check_offered("group", &group.volumes, writers, &offered).is_ok());
    let mut read_only = offered.clone();
    read_only.get_mut("pgdata").unwrap().read_only = true;
    let refused = wharf_state::volume::check_offered("group", &group.volumes, writers, &read_only);
    assert_eq!(
        refused.unwrap_err(),
        "group.volume.data: host volume \"pgdata\" is read-only on this node; ask for it with read_only = true"
    );
    let missing =
        wharf_state::volume::check_offered("group", &group.volumes, writers, &Default::default());
    assert!(missing.unwrap_err().contains("the node has no host volume \"certs\""));
}

#[test]
fn volume_mistakes_name_the_field() {
    let mount = |body: &str| doc(VOLUMES, &format!("[[group.task.volume_mount]]\n{body}"));
    let at = "group.task[0].volume_mount[0]";
    refused(
        &mount("volume = \"logs\"\ndestination = \"/x\""),
        &format!("{at}.volume"),
        "no volume \"logs\"",
    );
    refused(
        &mount("volume = \"certs\"\ndestination = \"/x\""),
        &format!("{at}.read_only"),
        "read-only in the group",
    );
    refused(
        &mount("volume = \"data\"\ndestination = \"\""),
        &format!("{at}.destination"),
        "must be a path",
    );
    refused(
        &mount("volume = \"data\""),
        "group.task[0].volume_mount[0]",
        "missing field `destination`",
    );
    refused(
        &doc("[group.volume.data]\nsource = \"\"", ""),
        "group.volume.data.source",
        "cannot be empty",
    );
    refused(
        &doc("[group.volume.data]\ntype = \"csi\"\nsource = \"x\"", ""),
        "group.volume.data.type",
        "unknown variant",
    );
}
