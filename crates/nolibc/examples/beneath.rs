//! Opens paths beneath a directory as wharf's shim opens its task's log directory: no link
//! followed on the way, nothing above the directory reached. It reads nothing and changes
//! nothing; it shows what is opened and what is refused, and why.
//!
//! `cargo run -p wharf-nolibc --example beneath [dir [path...]]` (by default `/` and a few
//! paths below it).

#![allow(clippy::print_stdout)] // An example talks to whoever runs it.

use std::ffi::CString;
use wharf_nolibc::{open_beneath, sys};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let dir = CString::new(args.next().unwrap_or_else(|| "/".into()))?;
    let mut paths: Vec<String> = args.collect();
    if paths.is_empty() {
        paths = ["proc/version", "proc/self/status", "../etc", "/etc"].map(String::from).into();
    }
    let flags = sys::O_PATH | sys::O_DIRECTORY | sys::O_CLOEXEC;
    let dir_fd = sys::open(&dir, flags, 0).map_err(|e| format!("cannot open {dir:?}: {e:?}"))?;
    for path in paths {
        let c_path = CString::new(path.as_str())?;
        match open_beneath(dir_fd, &c_path, sys::O_RDONLY | sys::O_CLOEXEC, 0) {
            Ok(fd) => {
                println!("{path}: opened");
                sys::close(fd);
            }
            Err(sys::Errno(sys::ELOOP)) => println!("{path}: refused, a link on the way"),
            Err(sys::Errno(sys::EXDEV)) => println!("{path}: refused, it leaves the directory"),
            Err(sys::Errno(errno)) => println!("{path}: errno {errno}"),
        }
    }
    sys::close(dir_fd);
    Ok(())
}
