//! Host volumes through the alloc runner: a task's `volume_mount`s, resolved against the
//! node's host volumes, reach its driver as `TaskConfig::mounts` (what a driver with a file
//! system of its own mounts) and its environment as `WHARF_VOLUME_<NAME>`; a mount the node
//! cannot satisfy fails the task's setup with a reason.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use wharf_alloc::{AllocRunner, AllocRunnerConfig};
use wharf_driver::mock::MockDriver;
use wharf_state::volume::HostVolume;
use wharf_state::{Allocation, ClientStatus, TaskEventKind, spec};
use wharf_store::MemoryStore;

const SPEC: &str = "[job]\nid = \"j\"\ntype = \"batch\"\n[group]\nname = \"g\"\n\
    [group.volume.data]\nsource = \"pgdata\"\n[group.volume.certs]\nsource = \"certs\"\nread_only = true\n\
    [[group.task]]\nname = \"db\"\ndriver = \"mock\"\nconfig = { run_for = \"1s\" }\n\
    [[group.task.volume_mount]]\nvolume = \"data\"\ndestination = \"/var/lib/db\"\n\
    [[group.task.volume_mount]]\nvolume = \"certs\"\ndestination = \"/etc/certs\"\nread_only = true\n";

async fn run(offered: BTreeMap<String, HostVolume>) -> (MockDriver, AllocRunner) {
    let job = spec::parse_toml(SPEC).unwrap();
    let driver = MockDriver::new();
    let dir = tempfile::tempdir().unwrap();
    let config = AllocRunnerConfig::new(
        Allocation::new("a1", job, "g"),
        Arc::new(MemoryStore::new()),
        dir.path().join("a1"),
    )
    .with_driver(Arc::new(driver.clone()))
    .with_host_volumes(Arc::new(offered));
    let runner = AllocRunner::new(config).unwrap();
    tokio::time::timeout(Duration::from_secs(3600), runner.run()).await.unwrap();
    (driver, runner)
}

#[tokio::test(start_paused = true)]
async fn mounts_reach_the_driver_request_and_the_environment() {
    let offered = BTreeMap::from([
        ("pgdata".to_owned(), HostVolume { path: "/srv/pg".into(), read_only: false }),
        ("certs".to_owned(), HostVolume { path: "/etc/ssl/private".into(), read_only: false }),
    ]);
    let (driver, runner) = run(offered).await;
    assert_eq!(runner.state().client_status, ClientStatus::Complete);
    let started = driver.started();
    let config = &started[0];
    let mounts: Vec<_> = config
        .mounts
        .iter()
        .map(|m| {
            (m.volume.as_str(), m.source.display().to_string(), m.destination.as_str(), m.read_only)
        })
        .collect();
    assert_eq!(
        mounts,
        [
            ("data", "/srv/pg".to_owned(), "/var/lib/db", false),
            ("certs", "/etc/ssl/private".to_owned(), "/etc/certs", true),
        ]
    );
    assert_eq!(config.env["WHARF_VOLUME_DATA"], "/srv/pg");
    assert_eq!(config.env["WHARF_VOLUME_CERTS"], "/etc/ssl/private");
}

/// An agent restarted with a config that no longer offers a volume: the task cannot start,
/// and says why, rather than run without its data.
#[tokio::test(start_paused = true)]
async fn a_mount_the_node_no_longer_offers_fails_the_setup() {
    let offered = BTreeMap::from([(
        "pgdata".to_owned(),
        HostVolume { path: "/srv/pg".into(), read_only: false },
    )]);
    let (driver, runner) = run(offered).await;
    assert!(driver.started().is_empty(), "never started");
    let state = runner.state();
    assert_eq!(state.client_status, ClientStatus::Failed);
    let reason = state.task_states["db"].events.iter().find_map(|e| match &e.kind {
        TaskEventKind::SetupFailure { error } => Some(error.clone()),
        _ => None,
    });
    assert_eq!(reason.as_deref(), Some("volume_mount: the node has no host volume \"certs\""));
}
