//! What the library crates promise someone who picks one of them up from its docs alone:
//!
//! - its README is its crate documentation (`#![doc = include_str!("../README.md")]`) and shows
//!   a compiled example (a `rust` code block; the doc tests run it);
//! - turning its heavy default features off really removes them from the dependency tree
//!   ([`LEAN`]), and crates above the store never pull in its engine;
//! - every program in its `examples/` runs to success;
//! - it packages as it would publish (`cargo package`, which also builds the packaged crate
//!   against the other packaged crates).
//!
//! Library crates are the workspace members that may be published.

use crate::{cargo, run, workspace_root};
use serde_json::Value;

/// Crates whose default features pull in something heavy, and the crates that must be absent
/// from their normal and build dependencies with default features off.
pub(crate) const LEAN: &[(&str, &[&str])] = &[
    ("wharf-store", &["redb", "tokio"]),
    ("wharf-prober", &["russh", "ring", "hyper", "rustls", "quick-xml"]),
    ("wharf-fleet", &["redb", "hyper", "base64"]),
];

/// Crates that must stay free of the listed crates with their default features on.
const NEVER: &[(&str, &[&str])] = &[
    // The store's trait and its memory store are all they use: the engine is the embedder's.
    ("wharf-task", &["redb"]),
    ("wharf-alloc", &["redb"]),
];

/// Every promise.
pub(crate) fn check() -> Result<(), String> {
    let mut problems = Vec::new();
    for library in &libraries()? {
        problems.extend(library.doc_problems());
    }
    if !problems.is_empty() {
        return Err(format!("library crates lack docs:\n  {}", problems.join("\n  ")));
    }
    check_builds()
}

/// The promises about what builds and runs: lean trees, examples, packaging.
fn check_builds() -> Result<(), String> {
    let libraries = libraries()?;
    eprintln!(
        "\n==> library crates: {}",
        libraries.iter().map(|l| l.name.as_str()).collect::<Vec<_>>().join(", ")
    );
    let mut problems = Vec::new();
    for (krate, absent) in LEAN {
        problems.extend(tree_problems(krate, true, absent)?);
    }
    for (krate, absent) in NEVER {
        problems.extend(tree_problems(krate, false, absent)?);
    }
    if !problems.is_empty() {
        return Err(format!("library crates break their promises:\n  {}", problems.join("\n  ")));
    }
    for library in &libraries {
        for (example, features) in &library.examples {
            let mut command = cargo();
            command.args(["run", "--quiet", "-p", &library.name, "--example", example]);
            if !features.is_empty() {
                command.args(["--features", &features.join(",")]);
            }
            run_bounded(&format!("example {example} of {}", library.name), &mut command)?;
        }
    }
    forget_packaged(&libraries);
    seed_verify_dir();
    let mut package = cargo();
    package.args(["package", "--allow-dirty", "--quiet", "--target-dir"]).arg(verify_dir());
    for library in &libraries {
        package.args(["-p", &library.name]);
    }
    run("cargo package (library crates)", &mut package)
}

/// The longest an example may take (built by the tests already, so this is its run): one that
/// hangs fails the check rather than hold CI.
const EXAMPLE_LIMIT: std::time::Duration = std::time::Duration::from_secs(300);

/// Runs `command` in a process group of its own, and kills the group (cargo and the example it
/// started) if it is not done within [`EXAMPLE_LIMIT`].
fn run_bounded(step: &str, command: &mut std::process::Command) -> Result<(), String> {
    use std::os::unix::process::CommandExt;
    eprintln!("\n==> {step}");
    let mut child = command
        .process_group(0)
        .spawn()
        .map_err(|e| format!("{step}: cannot run {command:?}: {e}"))?;
    let started = std::time::Instant::now();
    loop {
        match child.try_wait().map_err(|e| format!("{step}: {e}"))? {
            Some(status) if status.success() => return Ok(()),
            Some(status) => return Err(format!("{step} failed ({status})")),
            None if started.elapsed() > EXAMPLE_LIMIT => {
                let group = format!("-{}", child.id());
                let _ = std::process::Command::new("kill").args(["-KILL", "--", &group]).status();
                let _ = child.wait();
                return Err(format!("{step} did not finish within {EXAMPLE_LIMIT:?}; killed"));
            }
            // A tool's poll of a child it may have to kill; nothing waits on its timing.
            None => std::thread::sleep(std::time::Duration::from_millis(100)),
        }
    }
}

/// Where `cargo package` builds the packaged crates to verify them.
fn verify_dir() -> std::path::PathBuf {
    workspace_root().join("target/package-verify")
}

/// Lends the packaging build what the tests built already: hard links to every third-party
/// artifact of `target/debug` (the same crate, version, features and profile hash to the same
/// file name, so cargo takes them as fresh). Without this a fresh machine builds the library
/// crates' whole dependency tree a second time, minutes on two cores. Our own crates are left
/// out: the packaged ones are built from their packages. A link that cannot be made (another
/// file system) is only a build that is not saved.
fn seed_verify_dir() {
    let from = workspace_root().join("target/debug");
    let to = verify_dir().join("debug");
    for dir in ["deps", "build", ".fingerprint"] {
        for entry in std::fs::read_dir(from.join(dir)).into_iter().flatten().flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if !name.starts_with("wharf") && !name.starts_with("libwharf") {
                link_tree(&entry.path(), &to.join(dir).join(&name));
            }
        }
    }
}

/// Hard-links `from` (a file, or a directory and everything below it) at `to`, keeping what
/// is there already.
fn link_tree(from: &std::path::Path, to: &std::path::Path) {
    let Ok(file_type) = std::fs::symlink_metadata(from).map(|m| m.file_type()) else { return };
    if file_type.is_dir() {
        if std::fs::create_dir_all(to).is_err() {
            return;
        }
        for entry in std::fs::read_dir(from).into_iter().flatten().flatten() {
            link_tree(&entry.path(), &to.join(entry.file_name()));
        }
    } else if file_type.is_file() && !to.exists() {
        if let Some(parent) = to.parent() {
            let _ = std::fs::create_dir_all(parent);
        }
        let _ = std::fs::hard_link(from, to);
    }
}

/// Removes what an earlier `cargo package` left of our crates. Cargo verifies each crate
/// against the others through a registry of its own in `target/package`, unpacks them under
/// `$CARGO_HOME/registry/src/-<hash>/` (a local registry's directory name starts with `-`),
/// and builds them as registry crates, which it takes never to change: it reuses a `.crate`
/// file, an unpacked copy and a build of the same version that it finds. Without this a
/// second run would verify against the first run's sources. Third-party builds stay.
fn forget_packaged(libraries: &[Library]) {
    let mut stale = vec![workspace_root().join("target/package")];
    let fingerprints = verify_dir().join("debug/.fingerprint");
    for entry in std::fs::read_dir(&fingerprints).into_iter().flatten().flatten() {
        if entry.file_name().to_string_lossy().starts_with("wharf-") {
            stale.push(entry.path());
        }
    }
    let home = std::env::var_os("CARGO_HOME").map(std::path::PathBuf::from).or_else(|| {
        std::env::var_os("HOME").map(|home| std::path::Path::new(&home).join(".cargo"))
    });
    let registries = home.map(|home| home.join("registry/src"));
    for registry in registries.iter().flat_map(std::fs::read_dir).flatten().flatten() {
        if registry.file_name().to_string_lossy().starts_with('-') {
            for library in libraries {
                stale.push(registry.path().join(format!("{}-{}", library.name, library.version)));
            }
        }
    }
    for path in stale {
        if let Err(e) = std::fs::remove_dir_all(&path)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            eprintln!("warning: cannot remove {}: {e}", path.display());
        }
    }
}

/// A publishable workspace member.
struct Library {
    name: String,
    version: String,
    dir: std::path::PathBuf,
    lib_path: Option<std::path::PathBuf>,
    /// Each example's name and the features it needs.
    examples: Vec<(String, Vec<String>)>,
}

impl Library {
    /// What is missing from its documentation.
    fn doc_problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        let readme = std::fs::read_to_string(self.dir.join("README.md")).unwrap_or_default();
        if !readme.lines().any(|l| l.trim_start().starts_with("```rust") && !l.contains("ignore")) {
            problems.push(format!("{}: README.md has no compiled ```rust example", self.name));
        }
        let lib = self.lib_path.as_ref().and_then(|p| std::fs::read_to_string(p).ok());
        if !lib.is_some_and(|l| l.contains(r#"#![doc = include_str!("../README.md")]"#)) {
            problems.push(format!(
                "{}: its lib.rs does not use README.md as the crate docs (#![doc = include_str!(\"../README.md\")])",
                self.name
            ));
        }
        if self.examples.is_empty() {
            problems.push(format!("{}: it has no program in examples/", self.name));
        }
        problems
    }
}

/// The publishable workspace members, from `cargo metadata`.
fn libraries() -> Result<Vec<Library>, String> {
    let output = cargo()
        .args(["metadata", "--format-version", "1", "--no-deps"])
        .output()
        .map_err(|e| format!("cannot run cargo metadata: {e}"))?;
    let metadata: Value = serde_json::from_slice(&output.stdout)
        .map_err(|e| format!("cargo metadata printed invalid JSON: {e}"))?;
    let root = workspace_root();
    let mut libraries = Vec::new();
    for package in metadata["packages"].as_array().into_iter().flatten() {
        // `publish = false` is an empty list of registries.
        if package["publish"].as_array().is_some_and(Vec::is_empty) {
            continue;
        }
        let name = package["name"].as_str().unwrap_or_default().to_owned();
        let version = package["version"].as_str().unwrap_or_default().to_owned();
        let manifest =
            std::path::PathBuf::from(package["manifest_path"].as_str().unwrap_or_default());
        let dir = manifest.parent().unwrap_or(&root).to_owned();
        let targets = package["targets"].as_array().cloned().unwrap_or_default();
        let kind =
            |t: &Value, k: &str| t["kind"].as_array().is_some_and(|ks| ks.iter().any(|x| x == k));
        let lib_path = targets
            .iter()
            .find(|t| kind(t, "lib"))
            .and_then(|t| t["src_path"].as_str())
            .map(std::path::PathBuf::from);
        let examples = targets
            .iter()
            .filter(|t| kind(t, "example"))
            .filter_map(|t| {
                let features = t["required-features"].as_array().into_iter().flatten();
                let features = features.filter_map(|f| f.as_str().map(str::to_owned)).collect();
                Some((t["name"].as_str()?.to_owned(), features))
            })
            .collect();
        libraries.push(Library { name, version, dir, lib_path, examples });
    }
    libraries.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(libraries)
}

/// The crates of `absent` that `krate`'s normal and build dependencies hold, with its default
/// features off when `lean`.
fn tree_problems(krate: &str, lean: bool, absent: &[&str]) -> Result<Vec<String>, String> {
    let mut tree = cargo();
    tree.args(["tree", "-p", krate, "-e", "normal,build", "--prefix", "none", "--format", "{p}"]);
    if lean {
        tree.arg("--no-default-features");
    }
    let output = tree.output().map_err(|e| format!("cannot run cargo tree: {e}"))?;
    if !output.status.success() {
        return Err(format!(
            "cargo tree -p {krate} failed: {}",
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    let text = String::from_utf8_lossy(&output.stdout);
    let features = if lean { "without default features" } else { "with default features" };
    Ok(absent
        .iter()
        .filter(|name| text.lines().any(|l| l.split_whitespace().next() == Some(**name)))
        .map(|name| format!("{krate} {features} depends on {name}; it must not"))
        .collect())
}
