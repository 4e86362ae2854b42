//! The README's first command, as a new user runs it: `cargo build --release`, then
//! `target/release/wharf run examples/hello.toml`. It must work with nothing but a Rust
//! toolchain and a C compiler (no `protoc`: [`crate::cargo`] refuses it), and the binary the
//! fleet copies to every worker must stay small.

use crate::{cargo, run, workspace_root};
use std::process::Command;
use std::time::{Duration, Instant};

/// The most `target/release/wharf` may weigh before CI fails: 40 MB, a guard against the
/// 103 MB of an unstripped build. The bench's `build` row keeps the 25 MB target and says
/// when it is missed (32 MB with the container driver, its OCI types and the HTTPS stack).
const MAX_BINARY_BYTES: u64 = 40_000_000;

/// The longest the example may run: it finishes by itself in a few seconds.
const EXAMPLE_LIMIT: Duration = Duration::from_secs(120);

pub(crate) fn check() -> Result<(), String> {
    run("release build (the README's first command)", cargo().args(["build", "--release"]))?;
    let binary = workspace_root().join("target/release/wharf");
    let size =
        std::fs::metadata(&binary).map_err(|e| format!("no {}: {e}", binary.display()))?.len();
    eprintln!("{}: {:.1} MB", binary.display(), size as f64 / 1e6);
    if size > MAX_BINARY_BYTES {
        return Err(format!(
            "{} is {size} bytes; at most {MAX_BINARY_BYTES} (is the release profile stripped?)",
            binary.display()
        ));
    }
    // In a scratch directory, as `wharf run` keeps its data in ./wharf-data.
    let scratch = workspace_root().join("target/xtask/first-run");
    let _ = std::fs::remove_dir_all(&scratch);
    std::fs::create_dir_all(&scratch).map_err(|e| format!("{}: {e}", scratch.display()))?;
    eprintln!("\n==> wharf run examples/hello.toml");
    let mut child = Command::new(&binary)
        .arg("run")
        .arg(workspace_root().join("examples/hello.toml"))
        .current_dir(&scratch)
        .env_remove("WHARF_ADDR")
        .env_remove("WHARF_DATA_DIR")
        .env_remove("WHARF_TOKEN")
        .spawn()
        .map_err(|e| format!("cannot run {}: {e}", binary.display()))?;
    let started = Instant::now();
    let status = loop {
        match child.try_wait().map_err(|e| e.to_string())? {
            Some(status) => break status,
            None if started.elapsed() > EXAMPLE_LIMIT => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("wharf run examples/hello.toml took over {EXAMPLE_LIMIT:?}"));
            }
            None => std::thread::sleep(Duration::from_millis(100)),
        }
    };
    let _ = std::fs::remove_dir_all(&scratch);
    if status.success() {
        Ok(())
    } else {
        Err(format!("wharf run examples/hello.toml failed ({status})"))
    }
}
