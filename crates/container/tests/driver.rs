//! The container driver against real runc, overlayfs and cgroups: cases of Nomad's docker
//! driver tests (drivers/docker/driver_test.go) that apply without a daemon, each named after
//! its test, and wharf's own.

mod common;

use common::*;
use serde_json::json;
use std::time::Duration;
use wharf_container::ContainerDriver;
use wharf_driver::{Driver, DriverError, ExitResult, RunState, Signal, TaskConfig, TaskHandle};

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}

fn image(tag: &str) -> String {
    shared_layout().reference(tag)
}

/// A task of the busybox image running `sh -c script`.
fn shell(node: &Node, name: &str, script: &str) -> TaskConfig {
    config(
        node.dir.path(),
        name,
        json!({"image": image("busybox"), "command": "/bin/sh", "args": ["-c", script]}),
    )
}

/// The parents the runtime made for `node` outside the node's own hierarchies that are still
/// there.
fn runtime_parents_left(node: &Node) -> Vec<std::path::PathBuf> {
    let relative = std::path::Path::new(node.parent.trim_start_matches('/'));
    node.cgroups.made_outside_parents(relative).unwrap()
}

async fn wait(driver: &ContainerDriver, handle: &TaskHandle) -> ExitResult {
    tokio::time::timeout(LIMIT, driver.wait_task(handle.id()))
        .await
        .expect("the task did not exit in time")
        .unwrap()
}

/// Starts the task, waits for its end, destroys it; its exit and stdout.
async fn run(driver: &ContainerDriver, config: &TaskConfig) -> (ExitResult, String) {
    let handle = driver.start_task(config.clone()).await.unwrap();
    let exit = wait(driver, &handle).await;
    driver.destroy_task(handle.id(), false).await.unwrap();
    (exit, stdout(config))
}

/// TestDockerDriver_Start_Wait: a long-running container is still running after a while;
/// stopped, its wait returns.
#[test]
fn docker_driver_start_wait() {
    let node = Node::new("start-wait");
    runtime().block_on(async {
        let driver = node.driver();
        let config = shell(&node, "web", "echo hello; exec sleep 1000");
        let handle = driver.start_task(config.clone()).await.unwrap();
        assert!(
            tokio::time::timeout(Duration::from_millis(300), driver.wait_task(handle.id()))
                .await
                .is_err()
        );
        assert_eq!(driver.inspect_task(handle.id()).await.unwrap().state, RunState::Running);
        driver.stop_task(handle.id(), Duration::from_millis(100), Signal::Term).await.unwrap();
        assert!(!wait(&driver, &handle).await.successful());
        assert_eq!(stdout(&config), "hello\n");
        driver.destroy_task(handle.id(), false).await.unwrap();
    });
}

/// TestDockerDriver_Start_WaitFinish: a container that ends on its own ends successfully.
#[test]
fn docker_driver_start_wait_finish() {
    let node = Node::new("wait-finish");
    runtime().block_on(async {
        let driver = node.driver();
        let config = config(
            node.dir.path(),
            "echo",
            json!({"image": image("busybox"), "command": "echo", "args": ["hello"]}),
        );
        let (exit, out) = run(&driver, &config).await;
        assert!(exit.successful(), "{exit:?}");
        assert_eq!(out, "hello\n");
        // A failing command's code comes through.
        let config = shell(&node, "fails", "exit 3");
        assert_eq!(run(&driver, &config).await.0.exit_code, 3);
    });
}

/// TestDockerDriver_Start_LoadImage: an image loaded from a `docker save` archive in the task
/// directory runs, and writes into its task directory (`local/`).
#[test]
fn docker_driver_start_load_image() {
    let node = Node::new("load-image");
    runtime().block_on(async {
        let driver = node.driver();
        let archive = node.dir.path().join("busybox.tar");
        docker_archive(&archive);
        let mut config = config(
            node.dir.path(),
            "load",
            json!({
                "image": format!("docker-archive:{}", archive.display()),
                "command": "sh", "args": ["-c", "echo hello > $WHARF_TASK_DIR/output"],
            }),
        );
        config
            .env
            .insert("WHARF_TASK_DIR".into(), config.task_dir.join("local").display().to_string());
        let (exit, _) = run(&driver, &config).await;
        assert!(exit.successful(), "{exit:?} {}", stderr(&config));
        let written = std::fs::read_to_string(config.task_dir.join("local/output")).unwrap();
        assert_eq!(written.trim(), "hello");
    });
}

/// TestDockerDriver_Start_NoImage: a task without an image fails to start, saying so.
#[test]
fn docker_driver_start_no_image() {
    let node = Node::new("no-image");
    runtime().block_on(async {
        let driver = node.driver();
        let config = config(node.dir.path(), "none", json!({"command": "echo", "args": ["foo"]}));
        match driver.start_task(config).await {
            Err(DriverError::InvalidConfig { reason, .. }) => {
                assert!(reason.contains("image"), "{reason}")
            }
            other => panic!("{other:?}"),
        }
        // An image its layout does not hold is not found, naming the tag.
        let config = wharf_driver::TaskConfig {
            id: wharf_driver::TaskId::new("a1", "none", 1),
            ..config_missing(&node)
        };
        match driver.start_task(config).await {
            Err(DriverError::InvalidConfig { field, reason }) => {
                assert_eq!(field, "config.image");
                assert!(reason.contains("nosuchtag"), "{reason}");
            }
            other => panic!("{other:?}"),
        }
        assert!(driver.store().list().unwrap().is_empty());
    });
}

fn config_missing(node: &Node) -> TaskConfig {
    config(node.dir.path(), "missing", json!({"image": image("nosuchtag"), "command": "true"}))
}

/// TestDockerDriver_Start_Wait_AllocDir: what the container writes into the allocation's
/// directory (`/alloc`) is in the allocation's directory on the node.
#[test]
fn docker_driver_start_wait_alloc_dir() {
    let node = Node::new("alloc-dir");
    runtime().block_on(async {
        let driver = node.driver();
        let config = shell(&node, "writer", "echo -n win > $WHARF_ALLOC_DIR/output.txt");
        let (exit, _) = run(&driver, &config).await;
        assert!(exit.successful(), "{exit:?} {}", stderr(&config));
        assert_eq!(std::fs::read(config.alloc_dir.join("output.txt")).unwrap(), b"win");
    });
}

/// TestDockerDriver_StartN: several containers run at once, and each stops.
#[test]
fn docker_driver_start_n() {
    let node = Node::new("start-n");
    runtime().block_on(async {
        let driver = node.driver();
        let mut handles = Vec::new();
        for n in 0..3 {
            let handle =
                driver.start_task(shell(&node, &format!("t{n}"), "exec sleep 1000")).await.unwrap();
            handles.push(handle);
        }
        for handle in &handles {
            assert_eq!(driver.inspect_task(handle.id()).await.unwrap().state, RunState::Running);
        }
        for handle in &handles {
            driver.stop_task(handle.id(), Duration::from_millis(100), Signal::Int).await.unwrap();
            wait(&driver, handle).await;
            driver.destroy_task(handle.id(), false).await.unwrap();
        }
    });
}

/// TestDockerDriver_StartNVersions: containers of different images (one with a whiteout
/// and an opaque directory in its upper layer) run side by side, each seeing its own files.
#[test]
fn docker_driver_start_n_versions() {
    let node = Node::new("n-versions");
    runtime().block_on(async {
        let driver = node.driver();
        let script =
            "cat /etc/motd 2>&1; test -e /etc/removed && echo removed-visible; ls /var/cache";
        let plain = config(
            node.dir.path(),
            "plain",
            json!({"image": image("busybox"), "command": "sh", "args": ["-c", script]}),
        );
        let layered = config(
            node.dir.path(),
            "layered",
            json!({"image": image("layered"), "command": "sh", "args": ["-c", script]}),
        );
        let h1 = driver.start_task(plain.clone()).await.unwrap();
        let h2 = driver.start_task(layered.clone()).await.unwrap();
        assert!(wait(&driver, &h1).await.exit_code == 0);
        assert!(wait(&driver, &h2).await.exit_code == 0);
        let plain_out = stdout(&plain);
        assert!(plain_out.contains("removed-visible") && plain_out.contains("old"), "{plain_out}");
        assert_eq!(stdout(&layered), "from the upper layer\nnew\n");
        driver.destroy_task(h1.id(), false).await.unwrap();
        driver.destroy_task(h2.id(), false).await.unwrap();
        assert_eq!(driver.store().list().unwrap().len(), 2);
    });
}

/// TestDockerDriver_Entrypoint (and Cmd/Args): the image's Entrypoint and Cmd, replaced by the
/// task's by Docker's rules.
#[test]
fn docker_driver_entrypoint() {
    let node = Node::new("entrypoint");
    runtime().block_on(async {
        let driver = node.driver();
        let cases = [
            ("image", json!({}), "from image\n"),
            ("args", json!({"args": ["new", "args"]}), "new args\n"),
            ("command", json!({"command": "-n", "args": ["no newline"]}), "no newline"),
            (
                "entry",
                json!({"entrypoint": ["/bin/sh", "-c"], "args": ["echo $FROM_IMAGE $0", "x"]}),
                "1 x\n",
            ),
        ];
        for (name, extra, expected) in cases {
            let mut block = extra.as_object().unwrap().clone();
            block.insert("image".into(), image("entry").into());
            let config = config(node.dir.path(), name, serde_json::Value::Object(block));
            let (exit, out) = run(&driver, &config).await;
            assert!(exit.successful(), "{name}: {exit:?} {}", stderr(&config));
            assert_eq!(out, expected, "{name}");
        }
    });
}

/// TestDockerDriver_User: the task's user runs the container; a user the image does not
/// know fails the start, naming it. The image's user is the default.
#[test]
fn docker_driver_user() {
    let node = Node::new("user");
    runtime().block_on(async {
        let driver = node.driver();
        let config_as = |name: &str, user: Option<&str>, image_tag: &str| {
            let mut block = json!({"image": image(image_tag), "entrypoint": ["/bin/id"]});
            if let Some(user) = user {
                block["user"] = user.into();
            }
            config(node.dir.path(), name, block)
        };
        let (_, out) = run(&driver, &config_as("nobody", Some("nobody"), "busybox")).await;
        assert!(out.starts_with("uid=65534(nobody) gid=65534(nogroup)"), "{out}");
        let (_, out) = run(&driver, &config_as("numeric", Some("4321:50"), "busybox")).await;
        assert!(out.starts_with("uid=4321 gid=50(staff)"), "{out}");
        let (_, out) = run(&driver, &config_as("image", None, "entry")).await;
        assert!(out.starts_with("uid=1234(app) gid=1234(app)"), "{out}");
        match driver.start_task(config_as("alice", Some("alice"), "busybox")).await {
            Err(DriverError::InvalidConfig { field, reason }) => {
                assert_eq!(field, "config.user");
                assert!(reason.contains("alice"), "{reason}");
            }
            other => panic!("{other:?}"),
        }
    });
}

/// TestDockerDriver_WorkDir: the task's working directory, else the image's.
#[test]
fn docker_driver_work_dir() {
    let node = Node::new("work-dir");
    runtime().block_on(async {
        let driver = node.driver();
        let task = config(
            node.dir.path(),
            "set",
            json!({"image": image("busybox"), "work_dir": "/etc", "command": "pwd"}),
        );
        assert_eq!(run(&driver, &task).await.1, "/etc\n");
        let from_image = config(
            node.dir.path(),
            "image",
            json!({"image": image("entry"), "entrypoint": ["/bin/pwd"]}),
        );
        assert_eq!(run(&driver, &from_image).await.1, "/tmp\n");
    });
}

/// TestDockerDriver_ReadonlyRootfs: with `readonly_rootfs` the root cannot be written, the
/// allocation's directories still can.
#[test]
fn docker_driver_readonly_rootfs() {
    let node = Node::new("readonly");
    runtime().block_on(async {
        let driver = node.driver();
        let script = "touch /written 2>/dev/null && echo root-writable; touch /alloc/ok && echo alloc-writable";
        let mut readonly = shell(&node, "ro", script);
        readonly.driver_config.insert("readonly_rootfs".into(), true.into());
        assert_eq!(run(&driver, &readonly).await.1, "alloc-writable\n");
        let writable = shell(&node, "rw", script);
        assert_eq!(run(&driver, &writable).await.1, "root-writable\nalloc-writable\n");
    });
}

/// The effective capability mask of the container's shell, from /proc/self/status.
fn cap_eff(out: &str) -> u64 {
    let line = out.lines().find(|l| l.starts_with("CapEff:")).unwrap_or_else(|| panic!("{out}"));
    u64::from_str_radix(line.split_whitespace().nth(1).unwrap(), 16).unwrap()
}

/// TestDockerDriver_Capabilities (cap_add, cap_drop): Docker's default set, changed by the
/// task's `cap_add` and `cap_drop`.
#[test]
fn docker_driver_capabilities() {
    let node = Node::new("caps");
    runtime().block_on(async {
        let driver = node.driver();
        const CHOWN: u64 = 1 << 0;
        const NET_ADMIN: u64 = 1 << 12;
        const SYS_ADMIN: u64 = 1 << 21;
        const NET_RAW: u64 = 1 << 13;
        let status = |name: &str, extra: serde_json::Value| {
            let mut block = extra.as_object().unwrap().clone();
            block.insert("image".into(), image("busybox").into());
            block.insert("command".into(), "cat".into());
            block.insert("args".into(), json!(["/proc/self/status"]));
            config(node.dir.path(), name, serde_json::Value::Object(block))
        };
        let default = cap_eff(&run(&driver, &status("default", json!({}))).await.1);
        assert_eq!(default.count_ones(), 14, "{default:x}");
        assert!(default & CHOWN != 0 && default & NET_RAW != 0 && default & SYS_ADMIN == 0);
        let changed = cap_eff(
            &run(
                &driver,
                &status("changed", json!({"cap_add": ["NET_ADMIN"], "cap_drop": ["chown"]})),
            )
            .await
            .1,
        );
        assert_eq!(changed, (default | NET_ADMIN) & !CHOWN);
        let none = cap_eff(&run(&driver, &status("none", json!({"cap_drop": ["ALL"]}))).await.1);
        assert_eq!(none, 0);
        match driver.start_task(status("bad", json!({"cap_add": ["CAP_FLY"]}))).await {
            Err(DriverError::InvalidConfig { field, .. }) => assert_eq!(field, "config.cap_add"),
            other => panic!("{other:?}"),
        }
    });
}

/// TestDockerDriver_SecurityOpt: `no_new_privs` is on by default and `security_opt` can turn
/// it off; Docker's masked `/proc` paths are hidden and its read-only ones read-only.
#[test]
fn docker_driver_security_opt() {
    let node = Node::new("security-opt");
    runtime().block_on(async {
        let driver = node.driver();
        let script = "grep NoNewPrivs /proc/self/status; grep -c ' /proc/keys ' /proc/self/mountinfo; echo 1 > /proc/sys/kernel/domainname 2>/dev/null || echo sys-readonly; ls /dev";
        let default = shell(&node, "default", script);
        let out = run(&driver, &default).await.1;
        let mut lines = out.lines();
        assert_eq!(lines.next().unwrap().split_whitespace().nth(1), Some("1"), "{out}");
        // /proc/keys lists the node's keys (this kernel has it: /proc/kcore it has not).
        assert!(std::path::Path::new("/proc/keys").exists(), "this test reads /proc/keys, which this kernel lacks");
        assert_eq!(lines.next(), Some("1"), "/proc/keys is masked (a mount over it): {out}");
        assert_eq!(lines.next(), Some("sys-readonly"), "{out}");
        let devices: Vec<&str> = lines.collect();
        for device in ["null", "zero", "urandom", "pts", "shm"] {
            assert!(devices.contains(&device), "{device} in {devices:?}");
        }
        assert!(!devices.iter().any(|d| d.starts_with("sd") || d.starts_with("nvme") || *d == "mem"), "{devices:?}");
        let mut off = shell(&node, "off", "grep NoNewPrivs /proc/self/status");
        off.driver_config.insert("security_opt".into(), json!(["no-new-privileges:false"]));
        assert!(run(&driver, &off).await.1.split_whitespace().nth(1) == Some("0"));
    });
}

/// TestDockerDriver_SecurityOptUnconfined: Docker's default profile refuses a syscall outside
/// it with EPERM (`unshare`, which a user namespace needs no capability for); `cap_add =
/// ["SYS_ADMIN"]` grants it as Docker's profile does; `seccomp=unconfined` lifts the filter.
#[test]
fn docker_driver_security_opt_unconfined() {
    let node = Node::new("seccomp");
    runtime().block_on(async {
        let driver = node.driver();
        let script = "unshare -U true 2>&1 && echo unshared; grep Seccomp: /proc/self/status";
        let with = |name: &str, extra: serde_json::Value| {
            let mut config = shell(&node, name, script);
            for (key, value) in extra.as_object().unwrap() {
                config.driver_config.insert(key.clone(), value.clone());
            }
            config
        };
        let default = run(&driver, &with("default", json!({}))).await.1;
        assert!(default.contains("Operation not permitted"), "{default}");
        assert!(!default.contains("unshared"), "{default}");
        assert!(default.contains("Seccomp:\t2"), "a filter is installed: {default}");
        let unconfined =
            run(&driver, &with("unconfined", json!({"security_opt": ["seccomp=unconfined"]})))
                .await
                .1;
        assert_eq!(unconfined, "unshared\nSeccomp:\t0\n");
        let admin = run(&driver, &with("admin", json!({"cap_add": ["SYS_ADMIN"]}))).await.1;
        assert_eq!(admin, "unshared\nSeccomp:\t2\n");
    });
}

/// TestDockerDriver_SecurityOptFromFile: `seccomp=/path.json` applies a profile file in
/// Docker's format (here one that refuses `mkdir` with EACCES and allows the rest), from a
/// directory the node allows for host paths; a file outside them, a file that is not there,
/// a FIFO and a link are refused before anything starts, naming it.
#[test]
fn docker_driver_security_opt_from_file() {
    let node = Node::new("seccomp-file");
    runtime().block_on(async {
        let allowed = node.dir.path().join("profiles");
        std::fs::create_dir_all(&allowed).unwrap();
        let mut options = node.options();
        options.allowed_mount_dirs = vec![allowed.clone()];
        let driver = node.driver_with(options);
        let profile = allowed.join("no-mkdir.json");
        std::fs::write(
            &profile,
            r#"{"defaultAction": "SCMP_ACT_ALLOW",
                "archMap": [{"architecture": "SCMP_ARCH_X86_64",
                             "subArchitectures": ["SCMP_ARCH_X86", "SCMP_ARCH_X32"]}],
                "syscalls": [{"names": ["mkdir", "mkdirat"], "action": "SCMP_ACT_ERRNO",
                              "errnoRet": 13}]}"#,
        )
        .unwrap();
        let mut from_file =
            shell(&node, "file", "mkdir /tmp/new 2>&1; unshare -U true && echo unshared");
        from_file
            .driver_config
            .insert("security_opt".into(), json!([format!("seccomp={}", profile.display())]));
        let out = run(&driver, &from_file).await.1;
        assert!(out.contains("Permission denied"), "EACCES from the file's rule: {out}");
        assert!(out.ends_with("unshared\n"), "{out}");

        let fifo = allowed.join("fifo.json");
        #[allow(clippy::disallowed_methods)] // mkfifo(1) makes the test's FIFO
        let made = std::process::Command::new("mkfifo").arg(&fifo).status().unwrap();
        assert!(made.success());
        let link = allowed.join("link.json");
        std::os::unix::fs::symlink("/etc/shadow", &link).unwrap();
        let refused = [
            ("/etc/hostname".to_owned(), "allowed_mount_dirs"),
            (allowed.join("nonexistent.json").display().to_string(), "nonexistent.json"),
            (fifo.display().to_string(), "not a regular file"),
            (link.display().to_string(), "link.json"),
        ];
        for (i, (path, phrase)) in refused.into_iter().enumerate() {
            let mut config = shell(&node, &format!("refused{i}"), "true");
            config.driver_config.insert("security_opt".into(), json!([format!("seccomp={path}")]));
            match driver.start_task(config).await {
                Err(DriverError::InvalidConfig { field, reason }) => {
                    assert_eq!(field, "config.security_opt", "{path}");
                    assert!(reason.contains(phrase), "{path}: {reason}");
                }
                other => panic!("{path}: {other:?}"),
            }
        }
    });
}

/// TestDockerDriver_Mounts: a host directory under an allowed directory is bound in (read-only
/// if asked); one outside them is refused before anything starts.
#[test]
fn docker_driver_mounts() {
    let node = Node::new("mounts");
    runtime().block_on(async {
        let allowed = node.dir.path().join("shared");
        std::fs::create_dir_all(allowed.join("data")).unwrap();
        std::fs::write(allowed.join("data/in"), "from the host").unwrap();
        let mut options = node.options();
        options.allowed_mount_dirs = vec![allowed.clone()];
        let driver = node.driver_with(options);
        let script = "cat /data/in; echo out > /data/out; echo; cat /ro/in; echo x > /ro/x 2>/dev/null || echo ro-refused";
        let mut config = shell(&node, "mounts", script);
        config.driver_config.insert("mounts".into(), json!([
            {"source": allowed.join("data"), "target": "/data"},
            {"source": allowed.join("data"), "target": "/ro", "readonly": true},
        ]));
        let (exit, out) = run(&driver, &config).await;
        assert!(exit.successful(), "{exit:?} {}", stderr(&config));
        assert_eq!(out, "from the host\nfrom the hostro-refused\n");
        assert_eq!(std::fs::read_to_string(allowed.join("data/out")).unwrap(), "out\n");
        let mut outside = shell(&node, "outside", "true");
        outside.driver_config.insert("mounts".into(), json!([{"source": "/etc", "target": "/host-etc"}]));
        match driver.start_task(outside).await {
            Err(DriverError::InvalidConfig { field, .. }) => assert_eq!(field, "config.mounts[0].source"),
            other => panic!("{other:?}"),
        }
    });
}

/// A group's host volumes reach the container at their destinations, read-only where the
/// volume or the mount says so, with no allow-list entry (the node's config declared them).
#[test]
fn host_volumes_are_mounted_in_the_container() {
    let node = Node::new("volumes");
    runtime().block_on(async {
        let volume = node.dir.path().join("volume");
        std::fs::create_dir_all(&volume).unwrap();
        std::fs::write(volume.join("in"), "on the node").unwrap();
        let driver = node.driver();
        let script = "cat /srv/data/in; echo; echo w > /srv/data/w; cat /srv/ro/in; echo x > /srv/ro/x 2>/dev/null || echo ro-refused";
        let mut config = shell(&node, "volumes", script);
        let mount = |destination: &str, read_only| wharf_driver::Mount {
            volume: "data".into(),
            source: volume.clone(),
            destination: destination.into(),
            read_only,
        };
        config.mounts = vec![mount("/srv/data", false), mount("/srv/ro", true)];
        let (exit, out) = run(&driver, &config).await;
        assert!(exit.successful(), "{exit:?} {}", stderr(&config));
        assert_eq!(out, "on the node\non the nodero-refused\n");
        assert_eq!(std::fs::read_to_string(volume.join("w")).unwrap(), "w\n");
        assert!(!volume.join("x").exists());
    });
}

/// TestDockerDriver_OOMKilled (MemoryLimit): the task's memory limit holds inside the
/// container, and a container past it is reported OOM-killed.
#[test]
fn docker_driver_oom_killed() {
    let node = Node::new("oom");
    runtime().block_on(async {
        let driver = node.driver();
        let mut config = shell(&node, "hungry", "tail /dev/zero");
        config.resources.memory = 16;
        config.resources.memory_max = Some(16);
        let handle = driver.start_task(config).await.unwrap();
        let exit = wait(&driver, &handle).await;
        assert!(exit.oom_killed, "{exit:?}");
        driver.destroy_task(handle.id(), false).await.unwrap();
    });
}

/// TestDockerDriver_Stats: a running container's usage comes from its cgroup.
#[test]
fn docker_driver_stats() {
    let node = Node::new("stats");
    runtime().block_on(async {
        let driver = node.driver();
        let handle = driver.start_task(shell(&node, "busy", "exec sleep 1000")).await.unwrap();
        let stats = driver.task_stats(handle.id()).await.unwrap();
        assert_eq!(stats.source, wharf_driver::UsageSource::Cgroup);
        assert!(stats.memory_rss_bytes > 0 && stats.processes >= 2, "{stats:?}");
        driver.destroy_task(handle.id(), true).await.unwrap();
    });
}

/// TestDockerDriver_Signal: a signal sent to the task reaches the container's process.
#[test]
fn docker_driver_signal() {
    let node = Node::new("signal");
    runtime().block_on(async {
        let driver = node.driver();
        let fifo = node.dir.path().join("alloc");
        std::fs::create_dir_all(&fifo).unwrap();
        let config = shell(&node, "trap", "trap 'echo got USR1; exit 0' USR1; echo ready > /alloc/ready; while true; do sleep 0.05; done");
        let handle = driver.start_task(config.clone()).await.unwrap();
        // The trap is set once the file is there.
        let ready = config.alloc_dir.join("ready");
        tokio::time::timeout(LIMIT, async {
            while !ready.exists() {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await
        .unwrap();
        driver.signal_task(handle.id(), Signal::Usr1).await.unwrap();
        let exit = wait(&driver, &handle).await;
        assert!(exit.successful(), "{exit:?}");
        assert_eq!(stdout(&config), "got USR1\n");
        driver.destroy_task(handle.id(), false).await.unwrap();
    });
}

/// TestDockerDriver_ExecCommand: a command run in the container (`runc exec`) sees its
/// files, and its output and exit code come back.
#[test]
fn docker_driver_exec_command() {
    let node = Node::new("exec");
    runtime().block_on(async {
        let driver = node.driver();
        let handle = driver
            .start_task(config(
                node.dir.path(),
                "layered",
                json!({"image": image("layered"), "command": "sleep", "args": ["1000"]}),
            ))
            .await
            .unwrap();
        let command = |c: &[&str]| c.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        let result =
            driver.exec_task(handle.id(), &command(&["cat", "/etc/motd"]), LIMIT).await.unwrap();
        assert_eq!(result.stdout, b"from the upper layer\n");
        assert!(result.exit.successful());
        let failed = driver
            .exec_task(handle.id(), &command(&["sh", "-c", "echo oops >&2; exit 7"]), LIMIT)
            .await
            .unwrap();
        assert_eq!((failed.exit.exit_code, failed.stderr), (7, b"oops\n".to_vec()));
        driver.destroy_task(handle.id(), true).await.unwrap();
    });
}

/// TestDockerDriver_Start_KillTimeout: a container that ignores the stop signal is killed once
/// the kill timeout has passed, not before.
#[test]
fn docker_driver_start_kill_timeout() {
    let node = Node::new("kill-timeout");
    runtime().block_on(async {
        let driver = node.driver();
        let handle = driver.start_task(shell(&node, "stubborn", "exec sleep 1000")).await.unwrap();
        let timeout = Duration::from_millis(400);
        let sent = tokio::time::Instant::now();
        driver.stop_task(handle.id(), timeout, Signal::Usr1).await.unwrap();
        let exit = wait(&driver, &handle).await;
        assert!(sent.elapsed() >= timeout, "{:?}", sent.elapsed());
        assert_eq!(exit.signal, Some(libc::SIGKILL), "{exit:?}");
        driver.destroy_task(handle.id(), false).await.unwrap();
    });
}

/// A container no task of this driver records (its agent was killed; a node being wiped), once
/// deleted with the rest, takes with it the parents the runtime made outside the node's
/// hierarchies, as a destroy does: the wipe of such a node left them before.
#[test]
fn containers_deleted_without_their_tasks_leave_no_runtime_parent() {
    let node = Node::new("delete-all");
    runtime().block_on(async {
        let driver = node.driver();
        let handle = driver.start_task(shell(&node, "orphan", "exec sleep 1000")).await.unwrap();
        let another_driver = node.driver();
        let deleted = another_driver.delete_all_containers().await.unwrap();
        assert_eq!(deleted.len(), 1, "{deleted:?}");
        let left = runtime_parents_left(&node);
        assert!(left.is_empty(), "left: {left:?}");
        // The task's driver finds its container gone, and ends the rest of the task.
        driver.destroy_task(handle.id(), true).await.unwrap();
    });
}

/// The runtime's parents an agent killed mid-destroy leaves (after the runtime's delete, before
/// their removal) go with the wipe's deletion of the containers, though none is left to
/// delete: the wipe of such a node left them before.
#[test]
fn runtime_parents_left_with_no_container_go_with_the_deletion_of_all() {
    let node = Node::new("parents-left");
    runtime().block_on(async {
        let driver = node.driver();
        let handle = driver.start_task(shell(&node, "killed", "exec sleep 1000")).await.unwrap();
        let info = driver.inspect_task(handle.id()).await.unwrap();
        let container_id = info.attributes["container_id"].clone();
        // The runtime's delete, as the killed agent's destroy ran it: it removes the
        // container's own cgroup and leaves its parents.
        #[allow(clippy::disallowed_methods)] // The test plays the runtime's part.
        let deleted = std::process::Command::new(node.options().runtime_program())
            .arg("--root")
            .arg(node.dir.path().join("data/runtime"))
            .args(["delete", "--force", &container_id])
            .output()
            .unwrap();
        assert!(deleted.status.success(), "{deleted:?}");
        let left = runtime_parents_left(&node);
        assert!(!left.is_empty(), "the runtime made no parent outside the node's hierarchies");

        let deleted = node.driver().delete_all_containers().await.unwrap();
        assert!(deleted.is_empty(), "{deleted:?}");
        let left = runtime_parents_left(&node);
        assert!(left.is_empty(), "left: {left:?}");
        driver.destroy_task(handle.id(), true).await.unwrap();
    });
}

/// A start the runtime fails after making the container's cgroups (its program is not in the
/// image) leaves no parent of the runtime's behind, as a destroy would not.
#[test]
fn a_start_the_runtime_fails_leaves_no_runtime_parent() {
    let node = Node::new("start-fails");
    runtime().block_on(async {
        let driver = node.driver();
        let config = config(
            node.dir.path(),
            "absent",
            json!({"image": image("busybox"), "command": "/no/such/program"}),
        );
        let failed = driver.start_task(config).await;
        assert!(failed.is_err(), "{failed:?}");
        let left = runtime_parents_left(&node);
        assert!(left.is_empty(), "left: {left:?}");
    });
}

/// TestDockerDriver_DestroyTask, and wharf's own: destroying a running container (with force)
/// leaves nothing behind: no runtime state, no mount, no cgroup, no directory.
#[test]
fn docker_driver_destroy_task_leaves_nothing() {
    let node = Node::new("destroy");
    runtime().block_on(async {
        let driver = node.driver();
        let config = shell(&node, "doomed", "exec sleep 1000");
        let handle = driver.start_task(config.clone()).await.unwrap();
        let info = driver.inspect_task(handle.id()).await.unwrap();
        let container_id = info.attributes["container_id"].clone();
        let cgroup = info.attributes["cgroup"].clone();
        let container_dir = config.task_dir.join(wharf_container::CONTAINERS_DIR);
        let rootfs = std::fs::read_dir(&container_dir)
            .unwrap()
            .next()
            .unwrap()
            .unwrap()
            .path()
            .join("rootfs");
        assert!(wharf_container::is_mounted(&rootfs));
        match driver.destroy_task(handle.id(), false).await {
            Err(DriverError::Other { reason }) => assert!(reason.contains("running"), "{reason}"),
            other => panic!("{other:?}"),
        }
        driver.destroy_task(handle.id(), true).await.unwrap();
        assert!(!wharf_container::is_mounted(&rootfs));
        assert!(
            !node.dir.path().join("data/runtime").join(&container_id).exists(),
            "runtime state left"
        );
        assert_eq!(
            std::fs::read_dir(&container_dir).unwrap().count(),
            0,
            "container directory left"
        );
        for parent in node.cgroups.parents() {
            assert!(!parent.join(&cgroup).exists(), "cgroup left in {}", parent.display());
        }
        // Nor the parent the runtime made in the hierarchies that are not the node's (v1's
        // blkio, devices, ...), once the node's last container is gone: where the parent's
        // path is found in a cgroup mount, it is the node's own.
        let left = runtime_parents_left(&node);
        assert!(left.is_empty(), "left: {left:?}");
        assert!(matches!(
            driver.inspect_task(handle.id()).await,
            Err(DriverError::TaskNotFound { .. })
        ));
    });
}
