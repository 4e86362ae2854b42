//! What the container tests share: fixture images built from busybox-static as OCI image
//! layouts with gzip layers, task configs in temporary directories, the node's cgroups.

#![allow(dead_code, unreachable_pub)] // Each test binary uses its own part of this module.

use flate2::Compression;
use flate2::write::GzEncoder;
use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use wharf_container::{ContainerDriver, ContainerOptions, Digest};
use wharf_driver::{LogConfig, TaskConfig, TaskId};

/// Every wait in these tests gives up after this long.
pub const LIMIT: Duration = Duration::from_secs(20);

/// The waiter program of this crate.
pub const WAITER: &str = env!("CARGO_BIN_EXE_wharf-container-waiter");

/// The busybox the fixture images are made of.
pub fn busybox() -> PathBuf {
    let path = PathBuf::from("/bin/busybox");
    let bytes = std::fs::read(&path).unwrap_or_else(|e| {
        panic!("these tests build their images from a static busybox (apt-get install busybox-static): {e}")
    });
    // A dynamic busybox would need the host's libc inside the image.
    assert!(!has_interpreter(&bytes), "/bin/busybox is not static: apt-get install busybox-static");
    path
}

/// Whether a 64-bit ELF file names a program interpreter (is dynamically linked).
fn has_interpreter(elf: &[u8]) -> bool {
    let read = |at: usize, len: usize| -> u64 {
        elf[at..at + len].iter().rev().fold(0, |n, b| (n << 8) | u64::from(*b))
    };
    let (offset, size, count) =
        (read(0x20, 8) as usize, read(0x36, 2) as usize, read(0x38, 2) as usize);
    (0..count).any(|i| read(offset + i * size, 4) == 3)
}

/// A layer being written: a tar, gzip-compressed when done.
pub struct LayerBuilder {
    tar: tar::Builder<Vec<u8>>,
}

impl Default for LayerBuilder {
    fn default() -> Self {
        Self::new()
    }
}

impl LayerBuilder {
    pub fn new() -> LayerBuilder {
        let mut tar = tar::Builder::new(Vec::new());
        tar.mode(tar::HeaderMode::Deterministic);
        LayerBuilder { tar }
    }

    pub fn dir(mut self, path: &str, mode: u32) -> Self {
        let mut header = tar::Header::new_gnu();
        header.set_entry_type(tar::EntryType::Directory);
        header.set_mode(mode);
        header.set_size(0);
        self.tar.append_data(&mut header, path, std::io::empty()).unwrap();
        self
    }

    pub fn file(mut self, path: &str, mode: u32, content: &[u8]) -> Self {
        let mut header = tar::Header::new_gnu();
        header.set_entry_type(tar::EntryType::Regular);
        header.set_mode(mode);
        header.set_size(content.len() as u64);
        self.tar.append_data(&mut header, path, content).unwrap();
        self
    }

    pub fn symlink(mut self, path: &str, target: &str) -> Self {
        let mut header = tar::Header::new_gnu();
        header.set_entry_type(tar::EntryType::Symlink);
        header.set_mode(0o777);
        header.set_size(0);
        self.tar.append_link(&mut header, path, target).unwrap();
        self
    }

    /// An entry whose name is written as is, bypassing the checks of the tar crate (which
    /// refuses `..`): what a hostile layer holds.
    pub fn raw_file(mut self, name: &str, content: &[u8]) -> Self {
        let mut header = tar::Header::new_old();
        header.as_old_mut().name[..name.len()].copy_from_slice(name.as_bytes());
        header.set_entry_type(tar::EntryType::Regular);
        header.set_mode(0o644);
        header.set_size(content.len() as u64);
        header.set_cksum();
        self.tar.append(&header, content).unwrap();
        self
    }

    /// The layer, gzip-compressed.
    pub fn gzip(self) -> Vec<u8> {
        let tar = self.tar.into_inner().unwrap();
        let mut gz = GzEncoder::new(Vec::new(), Compression::fast());
        gz.write_all(&tar).unwrap();
        gz.finish().unwrap()
    }

    /// The layer, uncompressed.
    pub fn plain(self) -> Vec<u8> {
        self.tar.into_inner().unwrap()
    }
}

/// The applets the fixture images link to busybox.
const APPLETS: &[&str] = &[
    "sh", "echo", "cat", "sleep", "id", "pwd", "env", "true", "false", "touch", "ls", "kill", "dd",
    "head", "test", "mkdir", "rm", "grep", "trap", "stat", "hostname", "ip", "readlink", "wc",
    "tail", "printf", "yes", "unshare",
];

/// busybox at /bin/busybox with its applets, /etc/passwd and /etc/group (root, nobody and
/// `app` with uid 1234), /tmp, and `/etc/removed`, which the upper fixture layer hides.
pub fn busybox_layer() -> Vec<u8> {
    let binary = std::fs::read(busybox()).unwrap();
    let mut layer = LayerBuilder::new()
        .dir("bin", 0o755)
        .dir("etc", 0o755)
        .dir("tmp", 0o1777)
        .dir("var", 0o755)
        .dir("var/cache", 0o755)
        .file("var/cache/old", 0o644, b"old cache")
        .file("bin/busybox", 0o755, &binary)
        .file(
            "etc/passwd",
            0o644,
            b"root:x:0:0:root:/root:/bin/sh\napp:x:1234:1234:app:/home/app:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n",
        )
        .file("etc/group", 0o644, b"root:x:0:\napp:x:1234:\nstaff:x:50:\nnogroup:x:65534:\n")
        .file("etc/removed", 0o644, b"this file is hidden by a whiteout\n");
    for applet in APPLETS {
        layer = layer.symlink(&format!("bin/{applet}"), "busybox");
    }
    layer.gzip()
}

/// The upper fixture layer: a whiteout of `/etc/removed`, an opaque `/var/cache` with a new
/// file, and `/etc/motd`.
pub fn upper_layer() -> Vec<u8> {
    LayerBuilder::new()
        .dir("etc", 0o755)
        .file("etc/.wh.removed", 0o644, b"")
        .file("etc/motd", 0o644, b"from the upper layer\n")
        .dir("var", 0o755)
        .dir("var/cache", 0o755)
        .file("var/cache/.wh..wh..opq", 0o644, b"")
        .file("var/cache/new", 0o644, b"new cache")
        .gzip()
}

/// An OCI image layout written by a test.
pub struct Layout {
    pub dir: PathBuf,
    manifests: Vec<serde_json::Value>,
}

impl Layout {
    pub fn new(dir: &Path) -> Layout {
        std::fs::create_dir_all(dir.join("blobs/sha256")).unwrap();
        std::fs::write(dir.join("oci-layout"), br#"{"imageLayoutVersion":"1.0.0"}"#).unwrap();
        Layout { dir: dir.to_owned(), manifests: Vec::new() }
    }

    /// Writes a blob; returns its descriptor's digest and size.
    pub fn blob(&self, bytes: &[u8]) -> (String, usize) {
        let digest = Digest::of(bytes);
        std::fs::write(self.dir.join("blobs/sha256").join(digest.hex()), bytes).unwrap();
        (digest.to_string(), bytes.len())
    }

    /// Adds an image tagged `tag` with `layers` (gzip) and the image config's `config` part.
    pub fn image(mut self, tag: &str, layers: &[Vec<u8>], config: serde_json::Value) -> Layout {
        let diff_ids: Vec<String> = layers
            .iter()
            .map(|l| {
                let mut plain = Vec::new();
                std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(&l[..]), &mut plain)
                    .unwrap();
                Digest::of(&plain).to_string()
            })
            .collect();
        let image_config = serde_json::json!({
            "architecture": host_arch(), "os": "linux", "config": config,
            "rootfs": {"type": "layers", "diff_ids": diff_ids},
        });
        let (config_digest, config_size) = self.blob(image_config.to_string().as_bytes());
        let layer_descriptors: Vec<serde_json::Value> = layers
            .iter()
            .map(|l| {
                let (digest, size) = self.blob(l);
                serde_json::json!({"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": digest, "size": size})
            })
            .collect();
        let manifest = serde_json::json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": config_digest, "size": config_size},
            "layers": layer_descriptors,
        });
        let (digest, size) = self.blob(manifest.to_string().as_bytes());
        self.manifests.push(serde_json::json!({
            "mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": digest, "size": size,
            "annotations": {"org.opencontainers.image.ref.name": tag},
        }));
        let index = serde_json::json!({"schemaVersion": 2, "manifests": self.manifests});
        std::fs::write(self.dir.join("index.json"), index.to_string()).unwrap();
        self
    }

    /// The reference of the image tagged `tag`.
    pub fn reference(&self, tag: &str) -> String {
        format!("oci:{}:{tag}", self.dir.display())
    }
}

pub fn host_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    }
}

/// The fixture layout: `busybox` (one layer, `Cmd` `sh`), `layered` (busybox and the upper
/// layer with the whiteout), `entry` (Entrypoint `echo`, Cmd `from image`, WorkingDir `/tmp`,
/// User `app`, Env `FROM_IMAGE=1`).
pub fn fixture_layout(dir: &Path) -> Layout {
    let base = busybox_layer();
    let upper = upper_layer();
    Layout::new(dir)
        .image(
            "busybox",
            std::slice::from_ref(&base),
            serde_json::json!({"Cmd": ["sh"], "Env": ["PATH=/bin"]}),
        )
        .image(
            "layered",
            &[base.clone(), upper],
            serde_json::json!({"Cmd": ["sh"], "Env": ["PATH=/bin"]}),
        )
        .image(
            "entry",
            &[base],
            serde_json::json!({
                "Entrypoint": ["/bin/echo"], "Cmd": ["from", "image"], "WorkingDir": "/tmp",
                "User": "app", "Env": ["PATH=/bin", "FROM_IMAGE=1"],
            }),
        )
}

/// A task with this driver config, in its own directory under `root`.
pub fn config(root: &Path, name: &str, driver_config: serde_json::Value) -> TaskConfig {
    let dir = root.join(name);
    std::fs::create_dir_all(dir.join("logs")).unwrap();
    TaskConfig {
        id: TaskId::new("a1", name, 0),
        alloc_id: "a1".into(),
        job_id: "j".into(),
        group: "g".into(),
        task_name: name.into(),
        env: BTreeMap::from([
            ("PATH".to_owned(), "/usr/local/bin:/usr/bin:/bin".to_owned()),
            ("WHARF_TEST".to_owned(), "yes".to_owned()),
            ("WHARF_ALLOC_DIR".to_owned(), root.join("alloc").display().to_string()),
        ]),
        alloc_dir: root.join("alloc"),
        logs: LogConfig { dir: dir.join("logs"), max_files: 3, max_file_bytes: 1 << 20 },
        task_dir: dir,
        resources: Default::default(),
        driver_config: driver_config.as_object().cloned().unwrap(),
        mounts: Vec::new(),
    }
}

/// The node's cgroups for one test binary: a parent of its own, removed at the end.
pub struct Node {
    pub dir: tempfile::TempDir,
    pub cgroups: Arc<wharf_isolate::Cgroups>,
    pub parent: String,
}

impl Node {
    pub fn new(name: &str) -> Node {
        Node::at(
            tempfile::tempdir().unwrap(),
            &format!("/wharf-container-test-{name}-{}", std::process::id()),
        )
    }

    /// The node whose data is in `dir` and task cgroups under `parent`: what a restarted agent
    /// opens again.
    pub fn at(dir: tempfile::TempDir, parent: &str) -> Node {
        check_runc();
        let parent = parent.to_owned();
        let options = wharf_isolate::CgroupOptions {
            parent: wharf_isolate::CgroupParent::Absolute(parent.clone()),
            pids_max: None,
            reserved_cores: wharf_isolate::CpuSet::new(),
            cpu: wharf_isolate::cgroup::NodeCpu { mhz_per_core: 2000 },
            sweep_siblings: false,
        };
        let cgroups = wharf_isolate::Cgroups::open(options).unwrap_or_else(|e| {
            panic!("these tests need writable cgroups (root on a host with cgroup v1 or v2): {e}")
        });
        Node { dir, cgroups: Arc::new(cgroups), parent }
    }

    pub fn options(&self) -> ContainerOptions {
        let mut options = ContainerOptions::new(self.dir.path().join("data"));
        options.waiter = Some(WAITER.into());
        options
    }

    pub fn driver_with(&self, options: ContainerOptions) -> ContainerDriver {
        ContainerDriver::new(
            options,
            wharf_exec::RawExecOptions::default(),
            wharf_exec::TaskCgroups::On(self.cgroups.clone()),
        )
        .unwrap()
    }

    pub fn driver(&self) -> ContainerDriver {
        self.driver_with(self.options())
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        if let Err(error) = wharf_exec::destroy_cgroups(&self.cgroups)
            && !std::thread::panicking()
        {
            panic!("cannot clean up cgroup {}: {error}", self.parent);
        }
    }
}

/// Fails with what to install when runc is missing.
pub fn check_runc() {
    let found = ["/usr/sbin/runc", "/usr/bin/runc", "/usr/local/bin/runc", "/usr/local/sbin/runc"]
        .iter()
        .any(|p| Path::new(p).is_file());
    assert!(found, "these tests run containers with runc: apt-get install runc");
}

/// Reads the task's stdout log.
pub fn stdout(config: &TaskConfig) -> String {
    std::fs::read_to_string(config.logs.dir.join(format!("{}.stdout.0", config.task_name)))
        .unwrap_or_default()
}

/// Reads the task's stderr log.
pub fn stderr(config: &TaskConfig) -> String {
    std::fs::read_to_string(config.logs.dir.join(format!("{}.stderr.0", config.task_name)))
        .unwrap_or_default()
}

/// The fixture layout, built once per test binary (read only: each test's store imports it).
pub fn shared_layout() -> &'static Layout {
    static LAYOUT: std::sync::OnceLock<(tempfile::TempDir, Layout)> = std::sync::OnceLock::new();
    &LAYOUT
        .get_or_init(|| {
            let dir = tempfile::tempdir().unwrap();
            let layout = fixture_layout(&dir.path().join("layout"));
            (dir, layout)
        })
        .1
}

/// A `docker save` archive of the busybox fixture image, with uncompressed layers.
pub fn docker_archive(path: &Path) {
    let layer = {
        let mut plain = Vec::new();
        std::io::Read::read_to_end(
            &mut flate2::read::GzDecoder::new(&busybox_layer()[..]),
            &mut plain,
        )
        .unwrap();
        plain
    };
    let diff_id = Digest::of(&layer);
    let config = serde_json::json!({
        "architecture": host_arch(), "os": "linux", "config": {"Cmd": ["sh"], "Env": ["PATH=/bin"]},
        "rootfs": {"type": "layers", "diff_ids": [diff_id.to_string()]},
    })
    .to_string();
    let config_name = format!("{}.json", Digest::of(config.as_bytes()).hex());
    let layer_name = format!("{}/layer.tar", diff_id.hex());
    let manifest = serde_json::json!([{"Config": config_name, "RepoTags": ["busybox:latest"], "Layers": [layer_name]}]).to_string();
    let mut tar = tar::Builder::new(std::fs::File::create(path).unwrap());
    for (name, bytes) in [
        (config_name.as_str(), config.as_bytes()),
        (layer_name.as_str(), &layer[..]),
        ("manifest.json", manifest.as_bytes()),
    ] {
        let mut header = tar::Header::new_gnu();
        header.set_mode(0o644);
        header.set_size(bytes.len() as u64);
        tar.append_data(&mut header, name, bytes).unwrap();
    }
    tar.finish().unwrap();
}
