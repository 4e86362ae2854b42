//! Builds the static shim (`src/shim/static_main.rs`): the shim's code as a program with no C
//! library, no start files and `panic=abort`, which cargo cannot build as a binary of this
//! package (its profile would give it std's unwinding). It is compiled here with `rustc`
//! directly, in two steps with the same flags: the wharf-nolibc crate (its system calls) as an
//! rlib, from the root file the crate names for this use (`wharf_nolibc::LIB_RS`, which is why
//! it is also a build dependency), then the shim, linked to it with `--extern`, into
//! `$OUT_DIR/wharf-shim`, which the library carries as `shim::STATIC_SHIM`. On another
//! architecture than x86_64 or aarch64 that file is empty and the driver uses the
//! `wharf-shim` program instead.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The shim's modules, beside `static_main.rs`.
const MODULES: [&str; 5] = ["args", "contain", "life", "logs", "text"];

fn main() {
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let shim = out.join("wharf-shim");
    let manifest = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets it"));
    let source = manifest.join("src/shim");
    let nolibc = Path::new(wharf_nolibc::LIB_RS);
    println!("cargo::rerun-if-changed=build.rs");
    println!("cargo::rerun-if-changed={}", source.display());
    println!("cargo::rerun-if-changed={}", nolibc.parent().unwrap_or(nolibc).display());

    let arch = std::env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_default();
    if !matches!(arch.as_str(), "x86_64" | "aarch64") {
        std::fs::write(&shim, b"").expect("cannot write the empty static shim");
        return;
    }
    let mut modules = String::new();
    for module in MODULES {
        modules += &path_module(&source.join(format!("{module}.rs")), module);
    }
    std::fs::write(out.join("modules.rs"), modules).expect("cannot write modules.rs");

    let deps = out.join("nolibc");
    std::fs::create_dir_all(&deps).expect("cannot make the directory for wharf-nolibc");
    let rlib = deps.join("libwharf_nolibc.rlib");
    let mut nolibc_build = rustc(&out, "rlib", "wharf_nolibc");
    nolibc_build.arg("-o").arg(&rlib).arg(nolibc);
    run("wharf-nolibc for the static shim", &mut nolibc_build);

    let mut shim_build = rustc(&out, "bin", "wharf_shim");
    shim_build
        .arg("--extern")
        .arg(format!("wharf_nolibc={}", rlib.display()))
        .arg("-L")
        .arg(format!("dependency={}", deps.display()))
        // Nothing to relocate at start (not position-independent); no symbols to load.
        .args(["-C", "strip=symbols"])
        // The program starts at its own `_start` and links nothing of the C library.
        .args(["-C", "link-arg=-nostartfiles", "-C", "link-arg=-nostdlib"])
        .args(["-C", "link-arg=-static", "-C", "link-arg=-no-pie"])
        // One writable segment, not a relro one beside it: each is a private page per shim,
        // and with nothing relocated at start there is nothing for relro to protect.
        .args(["-C", "link-arg=-Wl,-z,norelro"])
        .arg("-o")
        .arg(&shim)
        .arg(source.join("static_main.rs"));
    run("the static shim", &mut shim_build);
}

/// `rustc` with the flags both crates of the static shim are compiled with: no unwinding
/// without std, code that is not position-independent, optimised, no debug info, one codegen
/// unit.
fn rustc(out: &Path, crate_type: &str, name: &str) -> Command {
    let rustc = std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let target = std::env::var("TARGET").expect("cargo sets TARGET");
    #[allow(clippy::disallowed_methods)] // A build step: rustc, not a task.
    let mut command = Command::new(rustc);
    command
        .env("WHARF_SHIM_OUT_DIR", out)
        .args(["--edition", "2024", "--crate-type", crate_type, "--crate-name", name])
        .args(["--target", &target, "-A", "warnings"])
        .args(["-C", "panic=abort", "-C", "relocation-model=static", "-C", "opt-level=2"])
        .args(["-C", "debuginfo=0", "-C", "codegen-units=1"]);
    command
}

/// Runs a compile step, failing the build with rustc's messages if it fails.
fn run(what: &str, command: &mut Command) {
    let output = command.output().unwrap_or_else(|e| {
        panic!("cannot run {:?} for {what}: {e}", command.get_program().to_string_lossy())
    });
    if !output.status.success() {
        let args: Vec<&OsStr> = command.get_args().collect();
        panic!(
            "building {what} failed ({}), {args:?}:\n{}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
    }
}

/// `#[path = "<path>"] mod <name>;`
fn path_module(path: &Path, name: &str) -> String {
    format!("#[path = {:?}]\nmod {name};\n", path.display().to_string())
}
