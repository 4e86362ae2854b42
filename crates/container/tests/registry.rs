//! Pulls over the OCI distribution API from a real registry (Debian's `docker-registry`) on
//! 127.0.0.1, the fixture images pushed into it with skopeo.

// Real programs: the registry and skopeo.
#![allow(clippy::disallowed_methods)]

mod common;

use common::*;
use serde_json::json;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;
use wharf_container::{ContainerError, ImageRef, ImageStore, RegistryOptions, fetch};
use wharf_driver::{Driver, DriverError};

/// A registry serving from a temporary directory, killed when dropped.
struct Registry {
    child: Child,
    address: String,
    _dir: tempfile::TempDir,
}

impl Registry {
    fn start() -> Registry {
        for (program, package) in
            [("/usr/bin/docker-registry", "docker-registry"), ("/usr/bin/skopeo", "skopeo")]
        {
            assert!(
                Path::new(program).exists(),
                "these tests need {program}: apt-get install {package}"
            );
        }
        let dir = tempfile::tempdir().unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let address = format!("127.0.0.1:{port}");
        let config = dir.path().join("config.yml");
        std::fs::write(&config, format!(
            "version: 0.1\nlog:\n  level: error\nstorage:\n  filesystem:\n    rootdirectory: {}\nhttp:\n  addr: {address}\n",
            dir.path().join("data").display()
        )).unwrap();
        let child = Command::new("/usr/bin/docker-registry")
            .arg("serve")
            .arg(&config)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let registry = Registry { child, address, _dir: dir };
        // Ready once it accepts connections: bounded by LIMIT.
        let mut waited = Duration::ZERO;
        while std::net::TcpStream::connect(&registry.address).is_err() {
            assert!(waited < LIMIT, "the registry did not listen on {}", registry.address);
            std::thread::sleep(Duration::from_millis(10));
            waited += Duration::from_millis(10);
        }
        registry
    }

    /// Pushes the fixture image `tag` as `test/<tag>:1`; returns its reference.
    fn push(&self, tag: &str) -> String {
        let layout = shared_layout();
        let reference = format!("{}/test/{tag}:1", self.address);
        let pushed = Command::new("/usr/bin/skopeo")
            .args(["--insecure-policy", "copy", "--quiet", "--dest-tls-verify=false"])
            .arg(format!("oci:{}:{tag}", layout.dir.display()))
            .arg(format!("docker://{reference}"))
            .output()
            .unwrap();
        assert!(pushed.status.success(), "skopeo: {}", String::from_utf8_lossy(&pushed.stderr));
        reference
    }

    fn options(&self) -> RegistryOptions {
        RegistryOptions { insecure: vec![self.address.clone()], timeout: Some(LIMIT) }
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}

#[test]
fn an_image_is_pulled_from_a_registry_by_tag_and_by_digest() {
    let registry = Registry::start();
    let reference = registry.push("layered");
    let dir = tempfile::tempdir().unwrap();
    let store = std::sync::Arc::new(ImageStore::open(dir.path().join("store")).unwrap());
    runtime().block_on(async {
        let image =
            fetch(&store, &ImageRef::parse(&reference).unwrap(), &registry.options(), false)
                .await
                .unwrap();
        assert_eq!(image.layers.len(), 2);
        let layers = store.layer_dirs(&image).unwrap();
        assert_eq!(
            std::fs::read_to_string(layers[1].join("etc/motd")).unwrap(),
            "from the upper layer\n"
        );
        // By digest: the same manifest, verified.
        let by_digest = format!("{}/test/layered@{}", registry.address, image.manifest);
        let again =
            fetch(&store, &ImageRef::parse(&by_digest).unwrap(), &registry.options(), false)
                .await
                .unwrap();
        assert_eq!((again.manifest, again.layers), (image.manifest.clone(), image.layers.clone()));
        // A tag the registry does not have is not found.
        let missing = format!("{}/test/layered:nope", registry.address);
        match fetch(&store, &ImageRef::parse(&missing).unwrap(), &registry.options(), false).await {
            Err(ContainerError::ImageNotFound { .. }) => {}
            other => panic!("{other:?}"),
        }
        // Plain HTTP only for the registries the node lists: this one is tried over HTTPS.
        let other = tempfile::tempdir().unwrap();
        let fresh = std::sync::Arc::new(ImageStore::open(other.path()).unwrap());
        match fetch(
            &fresh,
            &ImageRef::parse(&reference).unwrap(),
            &RegistryOptions::default(),
            false,
        )
        .await
        {
            Err(error @ ContainerError::Pull { .. }) => assert!(error.is_retryable()),
            other => panic!("{other:?}"),
        }
        assert!(fresh.list().unwrap().is_empty());
    });
}

/// TestDockerDriver_Start_BadPull_Recoverable: a registry that cannot be reached fails the
/// start with an error worth a retry.
#[test]
fn docker_driver_start_bad_pull_recoverable() {
    let node = Node::new("bad-pull");
    runtime().block_on(async {
        let mut options = node.options();
        options.registries.insecure = vec!["127.0.0.1:1".into()];
        let driver = node.driver_with(options);
        let config = config(
            node.dir.path(),
            "pull",
            json!({"image": "127.0.0.1:1/foo", "command": "echo", "args": ["hello"]}),
        );
        match driver.start_task(config).await {
            Err(error @ DriverError::Retryable { .. }) => {
                assert!(error.to_string().contains("127.0.0.1:1"), "{error}")
            }
            other => panic!("{other:?}"),
        }
    });
}

/// A container runs from an image the driver pulls at its start.
#[test]
fn a_container_runs_from_a_pulled_image() {
    let registry = Registry::start();
    let reference = registry.push("busybox");
    let node = Node::new("pulled");
    runtime().block_on(async {
        let mut options = node.options();
        options.registries = registry.options();
        let driver = node.driver_with(options);
        let config = config(
            node.dir.path(),
            "pulled",
            json!({"image": reference, "command": "echo", "args": ["pulled"]}),
        );
        let handle = driver.start_task(config.clone()).await.unwrap();
        let exit =
            tokio::time::timeout(LIMIT, driver.wait_task(handle.id())).await.unwrap().unwrap();
        assert!(exit.successful(), "{exit:?}");
        assert_eq!(stdout(&config), "pulled\n");
        driver.destroy_task(handle.id(), false).await.unwrap();
    });
}
