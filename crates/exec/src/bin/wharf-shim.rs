//! `wharf-shim`: the parent of one raw_exec task. See `wharf_exec::shim` for what it does; the
//! driver starts it, nobody else should.

fn main() -> std::process::ExitCode {
    wharf_exec::shim::main()
}
