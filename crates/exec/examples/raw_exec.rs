//! raw_exec on its own, in a program of yours: it runs a shell command as a task under the
//! shim, waits for its exit, and reads its output back. The program is its own shim: cargo
//! builds a dependency's library, not its `wharf-shim` binary, so the program calls
//! `wharf_exec::shim::run_if_invoked()` first and names itself as the driver's shim.
//!
//! `cargo run -p wharf-exec --example raw_exec`

#![allow(clippy::print_stdout)] // An example talks to whoever runs it.

use wharf_exec::RawExecDriver;
use wharf_exec::driver::{Driver, LogFrom, LogStream, LogTarget, TaskConfig};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Started by the driver as a task's shim, the program runs the shim here and exits.
    wharf_exec::shim::run_if_invoked();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    runtime.block_on(run())
}

async fn run() -> Result<(), Box<dyn std::error::Error>> {
    let root = std::env::temp_dir().join(format!("raw-exec-example-{}", std::process::id()));
    let config = TaskConfig::new("a1", "hello", root.join("hello"))
        .with_driver_config("command", "/bin/sh")
        .with_driver_config("args", ["-c", "echo hello from $WHO; exit 3"])
        .with_env("WHO", "a task");
    std::fs::create_dir_all(&config.logs.dir)?;

    let driver = RawExecDriver::with_shim(std::env::current_exe()?);
    let handle = driver.start_task(config.clone()).await?;
    let exit = driver.wait_task(handle.id()).await?;
    let mut stdout =
        driver.task_logs(&LogTarget::of(&config), LogStream::Stdout, LogFrom::Start).await?;
    let output = String::from_utf8(stdout.read(64 << 10).await?)?;
    print!("{output}");
    println!("exit code {}", exit.exit_code);

    driver.destroy_task(handle.id(), false).await?;
    std::fs::remove_dir_all(&root)?;
    assert_eq!((output.as_str(), exit.exit_code), ("hello from a task\n", 3));
    Ok(())
}
