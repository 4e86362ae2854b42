//! The `wharf` binary.

fn main() -> std::process::ExitCode {
    wharf_node::cli::main()
}
