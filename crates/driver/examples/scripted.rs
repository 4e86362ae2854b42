//! The driver interface from the caller's side, on the scripted mock driver: start, reattach
//! as a restarted agent does, stop with a signal and a timeout, and the errors a caller acts on.
//!
//! `cargo run -p wharf-driver --features mock --example scripted`

#![allow(clippy::print_stdout)] // An example talks to whoever runs it.

use std::{sync::Arc, time::Duration};
use wharf_driver::mock::MockDriver;
use wharf_driver::{DriverError, DriverRegistry, Signal, TaskConfig};

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), DriverError> {
    let registry = DriverRegistry::new().with(Arc::new(MockDriver::new()));
    let driver = registry.get("mock").expect("registered by name");
    println!("{}: {:?}", driver.name(), driver.capabilities());

    // A task that ignores its stop signal for a minute: killed at the 100ms timeout.
    let config = TaskConfig::new("a1", "web", "/tmp/wharf-example/a1/web")
        .with_driver_config("kill_after", "1m");
    let handle = driver.start_task(config).await?;
    driver.recover_task(&handle).await?; // what an agent does with a saved handle
    driver.stop_task(handle.id(), Duration::from_millis(100), Signal::Term).await?;
    let exit = driver.wait_task(handle.id()).await?;
    println!("stopped: exit code {}, signal {:?}", exit.exit_code, exit.signal);
    driver.destroy_task(handle.id(), false).await?;

    // Errors say what to do: a bad config is fatal, an unknown task is just that.
    let bad = TaskConfig::new("a1", "db", "/tmp/wharf-example/a1/db")
        .with_driver_config("colour", "blue");
    let refused = driver.start_task(bad).await.expect_err("unknown field");
    println!("refused: {refused} (retry? {})", refused.is_retryable());
    assert!(matches!(refused, DriverError::InvalidConfig { .. }));
    let gone = driver.wait_task(handle.id()).await.expect_err("destroyed");
    assert!(matches!(gone, DriverError::TaskNotFound { .. }), "{gone}");
    Ok(())
}
