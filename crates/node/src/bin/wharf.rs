//! The `wharf` binary.

fn main() -> std::process::ExitCode {
    // Started as a container's waiter (the container driver's default): runs it, never returns.
    wharf_container::waiter::run_if_invoked();
    wharf_node::cli::main()
}
