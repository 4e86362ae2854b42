//! The shim embedded in a program outside wharf, built by cargo as any user's program is: a
//! crate of its own whose one wharf dependency is wharf-exec (cargo builds a dependency's
//! library, never its binaries, so no `wharf-shim` exists for it), whose `main` calls
//! `wharf_exec::shim::run_if_invoked()` first and names itself as the driver's shim. The
//! program is this crate's `examples/raw_exec.rs`, unchanged.
//!
//! The outside crate is built offline against this workspace's lock file, in a target
//! directory of its own under `target/tmp` that later runs reuse.

#![allow(clippy::disallowed_methods)] // It builds programs with cargo and runs them.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;
use std::time::Duration;

/// A cold build of the outside crate compiles wharf-exec's dependencies again.
const BUILD_LIMIT: Duration = Duration::from_secs(900);
/// Running one of its programs.
const RUN_LIMIT: Duration = Duration::from_secs(30);

const THREADED: &str = r#"
//! Starts a thread before the shim's entry point: started as the shim, it must refuse.
fn main() {
    std::thread::spawn(std::thread::park);
    wharf_exec::shim::run_if_invoked();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    runtime.block_on(async {
        use wharf_exec::driver::{Driver, TaskConfig};
        let root = std::env::temp_dir().join(format!("threaded-shim-{}", std::process::id()));
        let config = TaskConfig::new("a1", "t", root.join("t")).with_driver_config("command", "/bin/true");
        std::fs::create_dir_all(&config.logs.dir).unwrap();
        let driver = wharf_exec::RawExecDriver::with_shim(std::env::current_exe().unwrap());
        match driver.start_task(config).await {
            Ok(_) => println!("started"),
            Err(error) => println!("refused: {error}"),
        }
        std::fs::remove_dir_all(&root).unwrap();
    });
}
"#;

/// Runs `command` to its end, killing it after `limit`.
fn bounded(mut command: Command, limit: Duration) -> Output {
    let child = command
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {command:?}: {e}"));
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(limit) {
        Ok(output) => output.unwrap(),
        Err(_) => {
            // SAFETY: kill takes plain integers; the child is ours and not yet reaped.
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
            panic!("{command:?} did not finish within {limit:?}");
        }
    }
}

/// Builds the outside crate once per test run; returns its binaries' directory.
fn outside_binaries() -> &'static Path {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT.get_or_init(|| {
        let exec = Path::new(env!("CARGO_MANIFEST_DIR"));
        let workspace = exec.parent().and_then(Path::parent).unwrap();
        let tmp = Path::new(env!("CARGO_TARGET_TMPDIR"));
        let krate = tmp.join("embeds-shim");
        std::fs::create_dir_all(krate.join("src/bin")).unwrap();
        let manifest = format!(
            "[package]\nname = \"embeds-shim\"\nversion = \"0.0.0\"\nedition = \"2024\"\npublish = false\n\n\
             [dependencies]\nwharf-exec = {{ path = {:?} }}\n\
             tokio = {{ version = \"1\", default-features = false, features = [\"rt\"] }}\n\n\
             # Not a member of the wharf workspace it sits in.\n[workspace]\n",
            exec.display().to_string()
        );
        std::fs::write(krate.join("Cargo.toml"), manifest).unwrap();
        std::fs::copy(workspace.join("Cargo.lock"), krate.join("Cargo.lock")).unwrap();
        let example = std::fs::read_to_string(exec.join("examples/raw_exec.rs")).unwrap();
        std::fs::write(krate.join("src/main.rs"), example).unwrap();
        std::fs::write(krate.join("src/bin/threaded.rs"), THREADED).unwrap();
        let target = tmp.join("embeds-shim-target");
        let mut build = Command::new(env!("CARGO"));
        build
            .args(["build", "--offline", "--quiet", "--manifest-path"])
            .arg(krate.join("Cargo.toml"))
            .env("CARGO_TARGET_DIR", &target)
            .env_remove("RUSTFLAGS");
        let built = bounded(build, BUILD_LIMIT);
        assert!(
            built.status.success(),
            "the outside crate does not build: {}",
            String::from_utf8_lossy(&built.stderr)
        );
        target.join("debug")
    })
}

/// Nothing from the wharf workspace is in the build: the program was linked from wharf-exec's
/// library, and there is no `wharf-shim` for it to find.
#[test]
fn a_program_outside_wharf_embeds_the_shim_and_runs_a_task() {
    let binaries = outside_binaries();
    assert!(!binaries.join("wharf-shim").exists(), "cargo built no shim binary for the crate");
    let run = bounded(Command::new(binaries.join("embeds-shim")), RUN_LIMIT);
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(run.status.success(), "{run:?}");
    assert_eq!(stdout, "hello from a task\nexit code 3\n");
}

/// A program that started a thread before the shim's entry point cannot close its inherited
/// descriptors safely: started as the shim, it refuses, and the start fails saying why.
#[test]
fn the_embedded_shim_refuses_to_run_beside_other_threads() {
    let run = bounded(Command::new(outside_binaries().join("threaded")), RUN_LIMIT);
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(run.status.success(), "{run:?}");
    assert!(
        stdout.starts_with("refused: ")
            && stdout.contains("call wharf_exec::shim::run_if_invoked() first"),
        "{stdout}"
    );
}
