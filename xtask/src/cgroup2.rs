//! `cargo xtask cgroup2`: the cgroup tests on a real cgroup v2 kernel.
//!
//! The machines wharf is built on run cgroup v1 (hybrid), where a second mount of `cgroup2`
//! gets no controllers: they are bound to the v1 hierarchies. So the v2 code runs in a small
//! virtual machine instead: Debian's kernel (`linux-image-amd64`, fetched with `apt-get
//! download`, never installed) booted by QEMU with `cgroup_no_v1=all`, from an initramfs this
//! module writes itself (cpio `newc`). It holds busybox, the test binaries and the programs
//! they start, each at its path on this machine (tests find the `wharf` binary and the shim by
//! the absolute paths cargo compiled into them), the shared libraries `ldd` names for them, and
//! `/init` ([`INIT`]).
//!
//! The init mounts `/proc`, `/sys`, `/dev` and `cgroup2` (the initramfs is a tmpfs already, so
//! `/tmp` is writable; nothing is mounted on it, as a workspace may be below it), hands the
//! controllers to `ci.slice` as an init does for its services, and runs each suite in a cgroup
//! of its own below it (`ci.slice/<suite>.service`), so that a test that leaves its parent
//! below its own cgroup meets v2's rule of no processes in a cgroup that hands controllers
//! down, as an agent in a delegated service does. It reports each suite's exit status on the second serial port
//! (the first is the console, which the kernel's messages share), then powers off.
//!
//! KVM is used where `/dev/kvm` opens and boots the kernel (within [`BOOT_LIMIT`]); otherwise
//! the machine is emulated (TCG), with a longer bound. A host whose KVM is PVM (`kvm_pvm`)
//! boots only kernels built as PVM guests, so there TCG is used from the start.
//!
//! The suites ([`SUITES`]) are the cgroup, OOM and kill tests of wharf-isolate, wharf-exec and
//! the agent's resource tests: the v2-only tests of `crates/isolate/tests/cgroup_v2.rs` (a
//! target with `test = false`, which only this step builds and runs), and suites that test
//! whichever hierarchy their host has.

use crate::{cargo, workspace_root};
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// One test binary to run in the machine.
struct Suite {
    package: &'static str,
    test: &'static str,
    /// The tests of it to run (all when empty): those that are about cgroups, in a binary whose
    /// other tests need more of a distribution than busybox has.
    only: &'static [&'static str],
}

impl Suite {
    /// Its name in the machine's reports.
    fn name(&self) -> String {
        format!("{}-{}", self.package.trim_start_matches("wharf-"), self.test)
    }
}

/// The suites, in the order they run.
const SUITES: [Suite; 6] = [
    Suite { package: "wharf-isolate", test: "cgroup_v2", only: &[] },
    Suite { package: "wharf-isolate", test: "cgroup_sweep", only: &[] },
    Suite { package: "wharf-isolate", test: "cgroup_lock", only: &[] },
    Suite { package: "wharf-exec", test: "cgroups", only: &[] },
    Suite {
        package: "wharf-exec",
        test: "exec_driver",
        only: &[
            "a_running_tasks_stats_come_from_its_cgroup",
            "an_exec_task_past_its_memory_limit_is_reported_oom_killed",
            "the_fingerprint_and_the_starts_need_cgroups",
        ],
    },
    Suite { package: "wharf-node", test: "resources", only: &[] },
];

/// PID 1 of the machine. It reads `/wharf-ci/suites`: one suite a line, its name, then the
/// program and its arguments.
const INIT: &str = include_str!("cgroup2_init.sh");

/// The longest a boot may take under KVM before the machine is taken for unable to boot the
/// kernel and emulation is used instead. A boot takes a few seconds.
const BOOT_LIMIT: Duration = Duration::from_secs(60);
/// The longest a whole run may take, with KVM and emulated.
const KVM_LIMIT: Duration = Duration::from_secs(240);
const TCG_LIMIT: Duration = Duration::from_secs(900);
/// The longest one suite may take in the machine (the init stops it then).
const SUITE_LIMIT_SECS: u32 = 300;
/// The machine's memory and processors. Two processors, so that a core can be reserved.
const MEMORY_MB: u32 = 2048;
const PROCESSORS: u32 = 2;

/// What the init writes on the second serial port starts with this.
const MARKER: &str = "wharf-cgroup2:";

pub(crate) fn run() -> Result<(), String> {
    let dir = workspace_root().join("target/cgroup2");
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let qemu = which("qemu-system-x86_64").ok_or(
        "cargo xtask cgroup2 needs qemu-system-x86_64: install qemu-system-x86 (see .ci/run)",
    )?;
    let busybox = ["/bin/busybox", "/usr/bin/busybox"]
        .into_iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
        .ok_or("cargo xtask cgroup2 needs busybox: install busybox-static (see .ci/run)")?;

    eprintln!("\n==> cgroup v2: building the test binaries");
    let built = build()?;
    eprintln!("\n==> cgroup v2: the kernel");
    let kernel = kernel(&dir.join("kernel"))?;
    eprintln!("kernel: {}", kernel.display());

    let mut image = Image::default();
    image.add_busybox(&busybox, &dir.join("stage"))?;
    let mut suites = String::new();
    for suite in &SUITES {
        let program = &built.tests[&(suite.package, suite.test)];
        if program.to_string_lossy().contains(char::is_whitespace) {
            return Err(format!(
                "{}: the machine's init needs paths without spaces",
                program.display()
            ));
        }
        check_selection(suite, program)?;
        image.add_program(program, &dir.join("stage"))?;
        suites += &format!("{} {}", suite.name(), program.display());
        if !suite.only.is_empty() {
            suites += " --exact";
        }
        for test in suite.only {
            suites += &format!(" {test}");
        }
        suites += "\n";
    }
    for program in &built.programs {
        image.add_program(program, &dir.join("stage"))?;
    }
    image.add_data("wharf-ci/suites", 0o644, suites.into_bytes());
    image.add_data(
        "init",
        0o755,
        INIT.replace("@SUITE_LIMIT@", &SUITE_LIMIT_SECS.to_string()).into(),
    );
    let initramfs = dir.join("initramfs.cpio");
    image.write(&initramfs)?;
    let size = std::fs::metadata(&initramfs).map(|m| m.len()).unwrap_or(0);
    eprintln!("initramfs: {} ({:.0} MiB)", initramfs.display(), size as f64 / (1 << 20) as f64);

    let markers = match kvm_usable() {
        Ok(()) => {
            eprintln!("\n==> cgroup v2: booting with KVM");
            match boot(&qemu, &kernel, &initramfs, &dir, Accel::Kvm)? {
                Booted::Ran(markers) => markers,
                Booted::NoBoot => {
                    eprintln!(
                        "the kernel did not boot under KVM within {BOOT_LIMIT:?}: emulating instead"
                    );
                    boot_tcg(&qemu, &kernel, &initramfs, &dir)?
                }
            }
        }
        Err(reason) => {
            eprintln!("\n==> cgroup v2: emulating the machine (TCG): {reason}");
            boot_tcg(&qemu, &kernel, &initramfs, &dir)?
        }
    };
    judge(&markers)
}

fn boot_tcg(qemu: &Path, kernel: &Path, initramfs: &Path, dir: &Path) -> Result<String, String> {
    match boot(qemu, kernel, initramfs, dir, Accel::Tcg)? {
        Booted::Ran(markers) => Ok(markers),
        Booted::NoBoot => Err("the emulated machine did not boot the kernel".into()),
    }
}

/// Whether every suite ran and passed, from what the init reported.
fn judge(markers: &str) -> Result<(), String> {
    let reported: Vec<&str> =
        markers.lines().filter_map(|l| l.trim().strip_prefix(MARKER)).map(str::trim).collect();
    let mut failed = Vec::new();
    for suite in &SUITES {
        let name = suite.name();
        let status = reported.iter().find_map(|r| r.strip_prefix(&format!("{name} exit ")));
        match status {
            Some("0") => {}
            Some(code) => failed.push(format!("{name} (exit {code})")),
            None => failed.push(format!("{name} (no result)")),
        }
    }
    if !reported.contains(&"done") && failed.is_empty() {
        failed.push("the machine did not finish".into());
    }
    if failed.is_empty() {
        eprintln!("cgroup v2: every suite passed on a real cgroup v2 kernel");
        Ok(())
    } else {
        Err(format!("cgroup v2 suites failed: {}", failed.join(", ")))
    }
}

/// The programs the machine runs, as built here.
struct Built {
    /// Each suite's test binary.
    tests: BTreeMap<(&'static str, &'static str), PathBuf>,
    /// The packages' programs the tests start (`wharf`, `wharf-shim`).
    programs: Vec<PathBuf>,
}

/// Builds the suites' test binaries (and the programs of their packages), as `cargo test
/// --workspace` does (so with the same features, and what the tests step built is used
/// again), and finds them in cargo's messages.
fn build() -> Result<Built, String> {
    let mut built = Built { tests: BTreeMap::new(), programs: Vec::new() };
    let mut command = cargo();
    command.args(["test", "--workspace", "--no-run", "--message-format=json-render-diagnostics"]);
    for suite in &SUITES {
        command.args(["--test", suite.test]);
    }
    let output =
        command.stderr(Stdio::inherit()).output().map_err(|e| format!("cannot run cargo: {e}"))?;
    if !output.status.success() {
        return Err(format!("building the tests failed ({})", output.status));
    }
    for line in output.stdout.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
        let Ok(message) = serde_json::from_slice::<serde_json::Value>(line) else { continue };
        if message["reason"] != "compiler-artifact" {
            continue;
        }
        let Some(executable) = message["executable"].as_str() else { continue };
        let name = message["target"]["name"].as_str().unwrap_or_default();
        let kinds = message["target"]["kind"].as_array().cloned().unwrap_or_default();
        // `path+file:///…/crates/exec#wharf-exec@0.1.0`, or before cargo 1.77
        // `wharf-exec 0.1.0 (path+file:///…)`.
        let package_id = message["package_id"].as_str().unwrap_or_default();
        let of = |package: &str| {
            package_id.contains(&format!("#{package}@"))
                || package_id.starts_with(&format!("{package} "))
        };
        if message["profile"]["test"] == true && kinds.iter().any(|k| k == "test") {
            if let Some(suite) = SUITES.iter().find(|s| s.test == name && of(s.package)) {
                built.tests.insert((suite.package, suite.test), executable.into());
            }
        } else if kinds.iter().any(|k| k == "bin") && SUITES.iter().any(|s| of(s.package)) {
            built.programs.push(executable.into());
        }
    }
    for suite in &SUITES {
        if !built.tests.contains_key(&(suite.package, suite.test)) {
            return Err(format!("cargo named no test binary {} of {}", suite.test, suite.package));
        }
    }
    built.programs.sort();
    built.programs.dedup();
    Ok(built)
}

/// Fails unless each test a suite selects is in its binary: a test renamed or gone would
/// otherwise be skipped without a word.
fn check_selection(suite: &Suite, program: &Path) -> Result<(), String> {
    if suite.only.is_empty() {
        return Ok(());
    }
    let output = Command::new(program)
        .args(["--list", "--exact"])
        .args(suite.only)
        .output()
        .map_err(|e| format!("cannot run {}: {e}", program.display()))?;
    let listed = String::from_utf8_lossy(&output.stdout);
    let found: Vec<&str> = listed.lines().filter_map(|l| l.strip_suffix(": test")).collect();
    let missing: Vec<&str> = suite.only.iter().copied().filter(|t| !found.contains(t)).collect();
    if missing.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "{} has no test {} (xtask/src/cgroup2.rs selects it)",
            suite.name(),
            missing.join(", ")
        ))
    }
}

/// Debian's kernel, kept under `dir` by package name. `WHARF_CGROUP2_KERNEL` names another
/// (a `vmlinuz` with cgroup v2, its controllers, namespaces, Landlock and the 8250 serial
/// console built in).
fn kernel(dir: &Path) -> Result<PathBuf, String> {
    if let Some(path) = std::env::var_os("WHARF_CGROUP2_KERNEL") {
        return Ok(path.into());
    }
    let download = dir.join("download");
    // Lists never read, or older than the mirror (which then no longer has the version they
    // name), are read again once.
    let mut updated = false;
    let (package, vmlinuz) = loop {
        let package = match kernel_package() {
            Ok(package) => package,
            Err(_) if !updated => {
                apt_update()?;
                updated = true;
                continue;
            }
            Err(error) => return Err(error),
        };
        let vmlinuz = dir.join(&package).join("vmlinuz");
        if vmlinuz.exists() {
            return Ok(vmlinuz);
        }
        let _ = std::fs::remove_dir_all(&download);
        std::fs::create_dir_all(&download).map_err(|e| format!("{}: {e}", download.display()))?;
        let fetched = Command::new("apt-get")
            .args(["download", "-q", &package])
            .current_dir(&download)
            .status()
            .map_err(|e| format!("cannot run apt-get: {e}"))?;
        match (fetched.success(), updated) {
            (true, _) => break (package, vmlinuz),
            (false, false) => {
                apt_update()?;
                updated = true;
            }
            (false, true) => return Err(format!("apt-get download {package} failed")),
        }
    };
    let deb = std::fs::read_dir(&download)
        .map_err(|e| format!("{}: {e}", download.display()))?
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|e| e == "deb"))
        .ok_or_else(|| format!("apt-get download {package} left no .deb"))?;
    // Only the kernel image: the package's modules are not needed (everything the tests use
    // is built in) and weigh hundreds of megabytes, so the archive streams through tar.
    let mut unpack = Command::new("dpkg-deb")
        .arg("--fsys-tarfile")
        .arg(&deb)
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run dpkg-deb: {e}"))?;
    let archive = unpack.stdout.take().expect("piped");
    let image = Command::new("tar")
        .args(["-x", "-O", "--wildcards", "./boot/vmlinuz-*"])
        .stdin(archive)
        .output()
        .map_err(|e| format!("cannot run tar: {e}"))?;
    let unpacked = unpack.wait().map_err(|e| format!("dpkg-deb: {e}"))?;
    if !unpacked.success() || !image.status.success() || image.stdout.is_empty() {
        return Err(format!("{} holds no ./boot/vmlinuz-*", deb.display()));
    }
    let parent = vmlinuz.parent().expect("a parent");
    std::fs::create_dir_all(parent).map_err(|e| format!("{}: {e}", parent.display()))?;
    let partial = parent.join("vmlinuz.partial");
    std::fs::write(&partial, &image.stdout).map_err(|e| format!("{}: {e}", partial.display()))?;
    std::fs::rename(&partial, &vmlinuz).map_err(|e| format!("{}: {e}", vmlinuz.display()))?;
    let _ = std::fs::remove_dir_all(&download);
    Ok(vmlinuz)
}

/// The package `linux-image-amd64` depends on now: `linux-image-<version>-amd64`.
fn kernel_package() -> Result<String, String> {
    let output = Command::new("apt-cache")
        .args(["depends", "linux-image-amd64"])
        .output()
        .map_err(|e| format!("cannot run apt-cache: {e}"))?;
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|l| l.trim().strip_prefix("Depends:"))
        .map(str::trim)
        .find(|p| p.starts_with("linux-image-"))
        .map(str::to_owned)
        .ok_or_else(|| "apt-cache knows no linux-image-amd64 (is this Debian?)".into())
}

fn apt_update() -> Result<(), String> {
    let status = Command::new("apt-get")
        .args(["update", "-qq"])
        .status()
        .map_err(|e| format!("cannot run apt-get: {e}"))?;
    if status.success() { Ok(()) } else { Err(format!("apt-get update failed ({status})")) }
}

/// Whether KVM can be used: `/dev/kvm` opens, and is not PVM (which boots only PVM guests).
fn kvm_usable() -> Result<(), String> {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/kvm")
        .map_err(|e| format!("/dev/kvm cannot be opened ({e})"))?;
    if Path::new("/sys/module/kvm_pvm").exists() {
        return Err("this host's KVM is PVM (kvm_pvm), which boots only PVM guest kernels".into());
    }
    Ok(())
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Accel {
    Kvm,
    Tcg,
}

enum Booted {
    /// It booted and ran to its end (or its bound): what the init reported.
    Ran(String),
    /// It did not boot within [`BOOT_LIMIT`] (KVM only).
    NoBoot,
}

/// Boots the machine, echoes its console, and returns what the init reported.
fn boot(
    qemu: &Path,
    kernel: &Path,
    initramfs: &Path,
    dir: &Path,
    accel: Accel,
) -> Result<Booted, String> {
    let markers = dir.join("markers.log");
    let _ = std::fs::remove_file(&markers);
    let mut command = Command::new(qemu);
    command.args(["-nodefaults", "-no-reboot", "-display", "none"]);
    match accel {
        Accel::Kvm => command.args(["-accel", "kvm", "-cpu", "host"]),
        Accel::Tcg => command.args(["-accel", "tcg"]),
    };
    command
        .args(["-m", &MEMORY_MB.to_string(), "-smp", &PROCESSORS.to_string()])
        .arg("-kernel")
        .arg(kernel)
        .arg("-initrd")
        .arg(initramfs)
        .args(["-append", "console=ttyS0 cgroup_no_v1=all panic=-1 quiet"])
        .args(["-serial", "stdio"])
        .arg("-serial")
        .arg(format!("file:{}", markers.display()))
        .stdin(Stdio::null())
        .stdout(Stdio::piped());
    let mut child = command.spawn().map_err(|e| format!("cannot run {}: {e}", qemu.display()))?;
    let console = child.stdout.take().expect("piped");
    let echo = std::thread::spawn(move || {
        for line in BufReader::new(console).split(b'\n').map_while(Result::ok) {
            // The firmware's screen controls are of no use in a log.
            let line: String = String::from_utf8_lossy(&line)
                .chars()
                .filter(|c| !c.is_control() || *c == '\t')
                .collect();
            eprintln!("vm| {line}");
        }
    });
    let limit = match accel {
        Accel::Kvm => KVM_LIMIT,
        Accel::Tcg => TCG_LIMIT,
    };
    let started = Instant::now();
    let read = || std::fs::read_to_string(&markers).unwrap_or_default();
    let mut booted = false;
    let status = loop {
        if let Some(status) = child.try_wait().map_err(|e| e.to_string())? {
            break Some(status);
        }
        booted = booted || read().contains(&format!("{MARKER} booted"));
        if !booted && accel == Accel::Kvm && started.elapsed() > BOOT_LIMIT {
            let _ = child.kill();
            let _ = child.wait();
            let _ = echo.join();
            return Ok(Booted::NoBoot);
        }
        if started.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let _ = echo.join();
    let reported = read();
    match status {
        None => Err(format!(
            "the machine ran longer than {limit:?}; it reported:\n{}",
            if reported.is_empty() { "nothing" } else { &reported }
        )),
        Some(_) if !reported.contains(&format!("{MARKER} booted")) => Ok(Booted::NoBoot),
        Some(_) => Ok(Booted::Ran(reported)),
    }
}

/// `program` on the `PATH`, if it is there.
fn which(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|dir| dir.join(program)).find(|p| p.is_file())
}

/// What goes into the initramfs, by path inside it.
#[derive(Default)]
struct Image {
    entries: BTreeMap<PathBuf, Entry>,
}

enum Entry {
    Dir,
    File { source: PathBuf, mode: u32 },
    Data { bytes: Vec<u8>, mode: u32 },
    Symlink(String),
    CharDevice { major: u32, minor: u32 },
}

/// The directories every Linux program expects, and the files of this machine's own.
const DIRECTORIES: [&str; 10] =
    ["bin", "dev", "etc", "proc", "root", "run", "sys", "tmp", "usr", "var"];

impl Image {
    fn insert(&mut self, path: impl Into<PathBuf>, entry: Entry) {
        let path: PathBuf = path.into();
        let mut parent = path.parent();
        while let Some(dir) = parent.filter(|d| !d.as_os_str().is_empty()) {
            self.entries.entry(dir.to_owned()).or_insert(Entry::Dir);
            parent = dir.parent();
        }
        self.entries.insert(path, entry);
    }

    fn add_data(&mut self, path: &str, mode: u32, bytes: Vec<u8>) {
        self.insert(path, Entry::Data { bytes, mode });
    }

    /// busybox, with a link for each of its programs in `/bin` (and `/usr/bin`, `/sbin`,
    /// `/usr/sbin` as links to it), and the files a system has in `/etc`.
    fn add_busybox(&mut self, busybox: &Path, stage: &Path) -> Result<(), String> {
        for dir in DIRECTORIES {
            self.insert(dir, Entry::Dir);
        }
        self.add_program(busybox, stage)?;
        let inside = busybox.strip_prefix("/").unwrap_or(busybox).to_owned();
        if inside != Path::new("bin/busybox") {
            self.insert("bin/busybox", Entry::Symlink(format!("/{}", inside.display())));
        }
        let list = Command::new(busybox)
            .arg("--list")
            .output()
            .map_err(|e| format!("cannot run {}: {e}", busybox.display()))?;
        for name in String::from_utf8_lossy(&list.stdout).lines().map(str::trim) {
            if !name.is_empty() && name != "busybox" && !name.contains('/') {
                self.insert(format!("bin/{name}"), Entry::Symlink("busybox".into()));
            }
        }
        for link in ["usr/bin", "sbin", "usr/sbin"] {
            self.insert(link, Entry::Symlink("/bin".into()));
        }
        self.insert("dev/console", Entry::CharDevice { major: 5, minor: 1 });
        self.add_data(
            "etc/passwd",
            0o644,
            b"root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n"
                .to_vec(),
        );
        self.add_data("etc/group", 0o644, b"root:x:0:\nnogroup:x:65534:\n".to_vec());
        self.add_data("etc/hosts", 0o644, b"127.0.0.1 localhost\n::1 localhost\n".to_vec());
        self.add_data(
            "etc/os-release",
            0o644,
            b"NAME=\"wharf cgroup v2 test machine\"\nID=wharf-cgroup2\n".to_vec(),
        );
        Ok(())
    }

    /// `program` at its own path, with debug information left out (into `stage`) where
    /// `objcopy` can, and the shared libraries `ldd` names for it.
    fn add_program(&mut self, program: &Path, stage: &Path) -> Result<(), String> {
        let inside = program
            .strip_prefix("/")
            .map_err(|_| format!("{} is not an absolute path", program.display()))?;
        let source = strip(program, &stage.join(inside));
        self.insert(inside, Entry::File { source, mode: 0o755 });
        let output = Command::new("ldd")
            .arg(program)
            .output()
            .map_err(|e| format!("cannot run ldd: {e}"))?;
        // `libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)`, `/lib64/ld-linux-x86-64.so.2
        // (0x...)`; a static program has none.
        for line in String::from_utf8_lossy(&output.stdout).lines() {
            let path = line.split("=>").last().unwrap_or_default().split_whitespace().next();
            let Some(library) = path.filter(|p| p.starts_with('/')) else { continue };
            let inside = Path::new(library).strip_prefix("/").expect("absolute").to_owned();
            // The file itself at the path the program asks for (links resolved when read).
            self.insert(inside, Entry::File { source: library.into(), mode: 0o755 });
        }
        Ok(())
    }

    /// Writes the archive in the kernel's `newc` cpio format.
    fn write(&self, path: &Path) -> Result<(), String> {
        let file = std::fs::File::create(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let mut cpio = Cpio { out: std::io::BufWriter::new(file), inode: 1 };
        let io = |e: std::io::Error| format!("{}: {e}", path.display());
        cpio.entry(".", 0o040_755, (0, 0), &[]).map_err(io)?;
        for (name, entry) in &self.entries {
            let name = name.to_str().ok_or_else(|| format!("{} is not UTF-8", name.display()))?;
            match entry {
                Entry::Dir => {
                    let mode = if name == "tmp" { 0o041_777 } else { 0o040_755 };
                    cpio.entry(name, mode, (0, 0), &[]).map_err(io)?;
                }
                Entry::File { source, mode } => {
                    let bytes =
                        std::fs::read(source).map_err(|e| format!("{}: {e}", source.display()))?;
                    cpio.entry(name, 0o100_000 | mode, (0, 0), &bytes).map_err(io)?;
                }
                Entry::Data { bytes, mode } => {
                    cpio.entry(name, 0o100_000 | mode, (0, 0), bytes).map_err(io)?;
                }
                Entry::Symlink(target) => {
                    cpio.entry(name, 0o120_777, (0, 0), target.as_bytes()).map_err(io)?;
                }
                Entry::CharDevice { major, minor } => {
                    cpio.entry(name, 0o020_600, (*major, *minor), &[]).map_err(io)?;
                }
            }
        }
        cpio.entry("TRAILER!!!", 0, (0, 0), &[]).map_err(io)?;
        cpio.out.flush().map_err(io)
    }
}

/// `program` without its debug information, written to `into`, where `objcopy` can make it
/// (the image is smaller, and the machine unpacks it faster); else `program` itself.
fn strip(program: &Path, into: &Path) -> PathBuf {
    if let Some(parent) = into.parent() {
        let _ = std::fs::create_dir_all(parent);
    }
    let stripped = Command::new("objcopy")
        .arg("--strip-debug")
        .arg(program)
        .arg(into)
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if stripped { into.to_owned() } else { program.to_owned() }
}

/// A cpio archive being written, in the `newc` format the kernel unpacks.
struct Cpio {
    out: std::io::BufWriter<std::fs::File>,
    inode: u32,
}

impl Cpio {
    fn entry(
        &mut self,
        name: &str,
        mode: u32,
        (major, minor): (u32, u32),
        data: &[u8],
    ) -> std::io::Result<()> {
        let size = u32::try_from(data.len())
            .map_err(|_| std::io::Error::other(format!("{name} is larger than 4 GiB")))?;
        let name_size = name.len() as u32 + 1;
        let fields = [
            self.inode,
            mode,
            0, // uid
            0, // gid
            if mode & 0o170_000 == 0o040_000 { 2 } else { 1 },
            0, // mtime
            size,
            0, // the device it is on
            0,
            major,
            minor,
            name_size,
            0, // no checksum
        ];
        self.inode += 1;
        let mut header = String::from("070701");
        for field in fields {
            header += &format!("{field:08x}");
        }
        self.out.write_all(header.as_bytes())?;
        self.out.write_all(name.as_bytes())?;
        self.out.write_all(&[0])?;
        self.pad(header.len() + name.len() + 1)?;
        self.out.write_all(data)?;
        self.pad(data.len())
    }

    /// Pads to a multiple of four bytes, as the format aligns headers and data.
    fn pad(&mut self, written: usize) -> std::io::Result<()> {
        let padding = (4 - written % 4) % 4;
        self.out.write_all(&[0u8; 3][..padding])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cpio_entry_is_a_newc_header_then_name_and_data_aligned_to_four() {
        let dir = std::env::temp_dir().join(format!("xtask-cpio-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("a.cpio");
        let mut image = Image::default();
        image.add_data("etc/x", 0o644, b"hello".to_vec());
        image.write(&path).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        // ".", "etc", "etc/x", the trailer; each header 110 bytes.
        let text = String::from_utf8_lossy(&bytes);
        assert_eq!(text.matches("070701").count(), 4, "{text}");
        let file = text.find("etc/x\0").unwrap();
        let header = &text[file - 110..file];
        // Mode 100644, size 5, name "etc/x" and its NUL.
        assert_eq!(&header[14..22], "000081a4");
        assert_eq!(&header[54..62], "00000005");
        assert_eq!(&header[94..102], "00000006");
        // Header and name (116 bytes) need no padding; the data follows, then 3 bytes.
        assert_eq!(&bytes[file + 6..file + 11], b"hello");
        assert_eq!(&bytes[file + 11..file + 14], &[0, 0, 0]);
        // The trailer's header and name are 121 bytes: three more end the archive.
        assert!(text.ends_with("TRAILER!!!\0\0\0\0"), "{text}");
    }
}
