//! `wharf-shim`: the parent of one raw_exec task. See `wharf_exec::shim` for what it does; the
//! driver starts it, nobody else should.

fn main() -> std::process::ExitCode {
    // SAFETY: this is the whole program and nothing has run before: no descriptor above 2 is
    // owned by anything yet.
    unsafe { wharf_exec::shim::main() }
}
