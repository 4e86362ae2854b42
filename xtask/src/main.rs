//! wharf's build tasks. `cargo xtask ci` is the one command CI runs; `cargo xtask bench`
//! keeps its run in docs/BENCHMARKS-history.jsonl and writes docs/BENCHMARKS.md from every
//! kept run.
//!
//! This crate stays small (one dependency) because it builds before anything else.

#![allow(clippy::print_stdout, clippy::print_stderr, clippy::disallowed_methods)]

mod boundaries;
mod cgroup2;
mod code_rules;
mod library;
mod release;
mod tools;

use std::path::PathBuf;
use std::process::ExitCode;
pub(crate) use tools::{cargo, run, workspace_root};

const USAGE: &str = "\
usage: cargo xtask <task>

tasks:
  ci              fmt check, clippy, tests, the cgroup v2 tests, docs, crate boundaries, code,
                  lean feature sets, examples, packaging, quick bench
  cgroup2         the cgroup tests on a real cgroup v2 kernel, in a virtual machine (QEMU,
                  Debian's kernel, a busybox initramfs)
  boundaries      check the crate dependency rules of DESIGN.md
  code            check the code's shape: no file-level import cycle inside a crate, no
                  function over 150 lines outside tests
  library         check what the library crates promise users: READMEs as crate docs with
                  an example, dependency trees without the heavy default features, every
                  example runs, every crate packages
  release         the README's first command: a release build (no protoc, no -dev
                  package), its binary's size, and examples/hello.toml run with it
  bench [--quick] run the benchmarks, append the run to docs/BENCHMARKS-history.jsonl and
                  write docs/BENCHMARKS.md: the medians of every kept run, each target met
                  or missed, the misses last (--quick: a short run that only checks every
                  scenario produces figures; its verdicts mean nothing; writes nothing)";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.iter().map(String::as_str).collect::<Vec<_>>().as_slice() {
        ["ci"] => ci(),
        ["cgroup2"] => cgroup2::run(),
        ["boundaries"] => check_boundaries(),
        ["code"] => check_code_rules(),
        ["library"] => library::check(),
        ["release"] => release::check(),
        ["bench"] => bench(false),
        ["bench", "--quick"] => bench(true),
        _ => Err(USAGE.to_owned()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("{message}");
            ExitCode::FAILURE
        }
    }
}

fn ci() -> Result<(), String> {
    run("rustfmt", cargo().args(["fmt", "--all", "--", "--check"]))?;
    run(
        "clippy",
        cargo().args([
            "clippy",
            "--workspace",
            "--all-targets",
            "--all-features",
            "--",
            "-D",
            "warnings",
        ]),
    )?;
    // Test targets with `test = false` are left out of `--all-targets`: the ones only the
    // cgroup v2 step runs are named.
    run(
        "clippy (tests of the cgroup v2 step)",
        cargo()
            .args(["clippy", "--package", "wharf-isolate", "--test", "cgroup_v2"])
            .args(["--", "-D", "warnings"]),
    )?;
    for (krate, _) in library::LEAN {
        run(
            &format!("clippy ({krate} without default features)"),
            cargo()
                .args(["clippy", "-p", krate, "--no-default-features", "--all-targets"])
                .args(["--", "-D", "warnings"]),
        )?;
    }
    run("tests", cargo().args(["test", "--workspace", "--all-targets"]))?;
    cgroup2::run()?;
    run("doc tests", cargo().args(["test", "--workspace", "--doc"]))?;
    run(
        "docs",
        cargo()
            .args(["doc", "--workspace", "--no-deps", "--all-features"])
            .env("RUSTDOCFLAGS", "-D warnings"),
    )?;
    check_boundaries()?;
    check_code_rules()?;
    library::check()?;
    release::check()?;
    bench(true)?;
    eprintln!("\nci: all checks passed");
    Ok(())
}

fn check_code_rules() -> Result<(), String> {
    eprintln!("\n==> code rules");
    let root = workspace_root();
    let mut crates = Vec::new();
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(root.join("crates"))
        .map_err(|e| format!("cannot list crates/: {e}"))?
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .collect();
    dirs.extend(["xtask", "bench", "tests"].iter().map(|dir| root.join(dir)));
    dirs.sort();
    for dir in dirs {
        let src = dir.join("src");
        if src.join("lib.rs").exists() || src.join("main.rs").exists() {
            let name =
                dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
            crates.push(code_rules::CrateSources { name, src });
        }
    }
    let problems = code_rules::check(&root, &crates)?;
    if problems.is_empty() {
        eprintln!("no import cycle, no function over {} lines", code_rules::MAX_FUNCTION_LINES);
        Ok(())
    } else {
        Err(format!("the code breaks its shape rules:\n  {}", problems.join("\n  ")))
    }
}

fn check_boundaries() -> Result<(), String> {
    eprintln!("\n==> crate boundaries");
    let output = cargo()
        .args(["metadata", "--format-version", "1"])
        .output()
        .map_err(|e| format!("cannot run cargo metadata: {e}"))?;
    if !output.status.success() {
        return Err(format!("cargo metadata failed: {}", String::from_utf8_lossy(&output.stderr)));
    }
    let metadata: serde_json::Value = serde_json::from_slice(&output.stdout)
        .map_err(|e| format!("cargo metadata printed invalid JSON: {e}"))?;
    let mut violations = boundaries::check(&metadata)?;
    violations.extend(boundaries::check_clippy_configs(&workspace_root())?);
    if violations.is_empty() {
        eprintln!("crate boundaries hold");
        Ok(())
    } else {
        Err(format!("crate boundaries broken (see DESIGN.md):\n  {}", violations.join("\n  ")))
    }
}

fn bench(quick: bool) -> Result<(), String> {
    let mut command = cargo();
    command.args(["run", "--package", "wharf-bench"]);
    if quick {
        // The quick run only proves every scenario still produces figures; a debug build
        // reuses what the tests compiled.
        command.args(["--", "--quick"]);
    } else {
        // The bench appends the run to the history beside the page, then writes the page
        // from every kept run. A miss does not fail the step: it is on the page.
        let out = workspace_root().join("docs/BENCHMARKS.md");
        command.args(["--release", "--", "--out"]).arg(out);
    }
    run(if quick { "bench (quick)" } else { "bench" }, &mut command)
}
