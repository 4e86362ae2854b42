//! What wharf-isolate finds on this machine, as a node reads it at start: its CPUs, their speed
//! and its memory (for admission and CPU quotas), and the Landlock ABI the kernel offers (for
//! the isolated `exec` driver). It changes nothing on the machine.
//!
//! `cargo run -p wharf-isolate --example host`

#![allow(clippy::print_stdout)] // An example talks to whoever runs it.

fn main() -> Result<(), wharf_isolate::IsolateError> {
    let host = wharf_isolate::Host::detect()?;
    println!(
        "{} cores ({}) at {} MHz, {} MHz in all, {} MiB of memory",
        host.cores(),
        host.cpus,
        host.mhz_per_core,
        host.total_mhz(),
        host.memory_mb
    );
    match wharf_isolate::landlock::abi() {
        Ok(abi) => println!("Landlock ABI {abi}"),
        Err(error) => println!("no Landlock: {error}"),
    }
    // Reserving cores for a task takes whole cores from the node's set, the lowest first.
    let reserved = host.cpus.take_lowest(1).expect("a machine has a core");
    println!("one reserved core: {reserved}; shared: {}", host.cpus.difference(&reserved));
    Ok(())
}
