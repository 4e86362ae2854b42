//! A task that races the agent: it swaps directories it owns for symbolic links to a target
//! elsewhere, and back, as fast as it can, so that whatever root does to a directory's path
//! meets the link at some point. The no-follow tests run it beside the starts they watch.
//!
//! Usage: `link-swapper TARGET MODE DIR...`
//!
//! For each `DIR` it makes `DIR.swap`, a link to `TARGET`, beside it; then it swaps each
//! directory with its link in turn (atomically: `renameat2` with `RENAME_EXCHANGE`), prints
//! `swapping` on stdout once it has swapped them all once, and goes on until it has swapped
//! [`MAX_SWAPS`] times, [`MAX_TIME`] has passed, or it is killed. Unless `MODE` (octal) is
//! `-`, it also sets each directory's mode back to `MODE` after each swap, as a task that
//! wants its directories kept as they were would: so root always finds a mode to change.

#![allow(clippy::print_stderr, clippy::print_stdout)] // A test program: its output is its interface.
#![allow(clippy::disallowed_methods)] // It bounds its own run by the real clock.

use std::ffi::CString;
use std::fs::File;
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::time::{Duration, Instant};

const MAX_SWAPS: u64 = 100_000_000;
const MAX_TIME: Duration = Duration::from_secs(120);

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [target, mode, dirs @ ..] = args.as_slice() else {
        fail("usage: link-swapper TARGET MODE DIR...")
    };
    if dirs.is_empty() {
        fail("usage: link-swapper TARGET MODE DIR...");
    }
    let mode = match mode.as_str() {
        "-" => None,
        octal => Some(u32::from_str_radix(octal, 8).unwrap_or_else(|_| fail("MODE is octal"))),
    };
    // Each directory by its name, its link's name, and a handle that follows it whatever its
    // name is.
    let pairs: Vec<(CString, CString, File)> = dirs
        .iter()
        .map(|dir| {
            let swap = format!("{dir}.swap");
            std::os::unix::fs::symlink(target, &swap)
                .unwrap_or_else(|e| fail(&format!("cannot make {swap}: {e}")));
            let handle = File::open(dir).unwrap_or_else(|e| fail(&format!("{dir}: {e}")));
            (c_path(dir), c_path(&swap), handle)
        })
        .collect();
    let started = Instant::now();
    let mut swaps = 0u64;
    while swaps < MAX_SWAPS {
        for (dir, swap, handle) in &pairs {
            // SAFETY: two NUL-terminated paths relative to the working directory.
            let swapped = unsafe {
                libc::renameat2(
                    libc::AT_FDCWD,
                    dir.as_ptr(),
                    libc::AT_FDCWD,
                    swap.as_ptr(),
                    libc::RENAME_EXCHANGE,
                )
            };
            if swapped != 0 {
                fail(&format!("renameat2: {}", std::io::Error::last_os_error()));
            }
            if let Some(mode) = mode {
                let _ = handle.set_permissions(std::fs::Permissions::from_mode(mode));
            }
        }
        if swaps == 0 {
            let mut out = std::io::stdout();
            let _ = writeln!(out, "swapping").and_then(|()| out.flush());
        }
        swaps += pairs.len() as u64;
        if swaps % 4096 < pairs.len() as u64 && started.elapsed() > MAX_TIME {
            break;
        }
    }
}

fn c_path(path: &str) -> CString {
    CString::new(std::path::Path::new(path).as_os_str().as_bytes())
        .unwrap_or_else(|_| fail("a path holds a NUL byte"))
}

fn fail(message: &str) -> ! {
    eprintln!("link-swapper: {message}");
    std::process::exit(2)
}
