//! What every task runs commands with: the workspace's root, cargo (refusing protoc), and a
//! step that names itself and its time.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The workspace's root directory.
pub(crate) fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("xtask lives in the workspace").to_owned()
}

/// A cargo command in the workspace. wharf builds with nothing but a Rust toolchain and a C
/// compiler: `PROTOC` names a program that always fails, so a build script that reaches for
/// `protoc` (prost-build and its kind read `PROTOC` first, and rerun when it changes) breaks
/// every build xtask runs, not only the builds of machines that lack it.
pub(crate) fn cargo() -> Command {
    let mut command = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    command.current_dir(workspace_root()).env("PROTOC", refusing_protoc());
    command
}

/// A `protoc` that refuses to run, saying why; written once under target/.
fn refusing_protoc() -> PathBuf {
    let path = workspace_root().join("target/xtask/protoc-refused");
    let script = "#!/bin/sh\necho 'wharf builds without protoc: a build script ran it (PROTOC)' >&2\nexit 1\n";
    if std::fs::read_to_string(&path).ok().as_deref() != Some(script) {
        let written = std::fs::create_dir_all(path.parent().expect("a parent")).and_then(|()| {
            use std::os::unix::fs::PermissionsExt as _;
            std::fs::write(&path, script)?;
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755))
        });
        if let Err(error) = written {
            eprintln!("cannot write {}: {error}", path.display());
        }
    }
    path
}

/// Runs `command`, failing with `step` named if it does not succeed.
/// Runs `command`, failing with `step` named if it does not succeed; says how long it took,
/// so that a CI run shows where its time goes.
pub(crate) fn run(step: &str, command: &mut Command) -> Result<(), String> {
    eprintln!("\n==> {step}");
    let started = std::time::Instant::now();
    let status = command.status().map_err(|e| format!("{step}: cannot run {command:?}: {e}"))?;
    eprintln!("==> {step}: {:.0}s", started.elapsed().as_secs_f64());
    if status.success() { Ok(()) } else { Err(format!("{step} failed ({status})")) }
}
