//! The static `wharf-shim`: the shim's code (the modules beside this file) as a program of its
//! own, with no C library. The build script compiles this file by itself, with `panic=abort`,
//! no start files and static linking, into the bytes the driver carries (`STATIC_SHIM`).
//!
//! The kernel starts it at `_start` with the stack pointer on `argc`, then `argv` and `envp`:
//! there is nothing to relocate (the program is not position-independent) and nothing to set
//! up (no thread-local storage, no allocator), so `_start` only aligns the stack and calls
//! [`start`].

#![no_std]
#![no_main]
// The memory functions below are loops that must stay loops, not calls to themselves.
#![no_builtins]

// The modules of `src/shim`, at the paths the build script gives (wharf-nolibc is a crate of
// its own, which the build script links with `--extern`).
include!(concat!(env!("WHARF_SHIM_OUT_DIR"), "/modules.rs"));

use core::ffi::CStr;
use life::StartStep;
use wharf_nolibc::sys;
use text::{Argv, Lossy};

#[cfg(target_arch = "x86_64")]
core::arch::global_asm!(
    ".globl _start",
    "_start:",
    "xor ebp, ebp",
    "mov rdi, rsp",
    "and rsp, -16",
    "call {start}",
    "ud2",
    start = sym start,
);

#[cfg(target_arch = "aarch64")]
core::arch::global_asm!(
    ".globl _start",
    "_start:",
    "mov x29, xzr",
    "mov x30, xzr",
    "mov x0, sp",
    "and sp, x0, -16",
    "bl {start}",
    "brk 1",
    start = sym start,
);

/// Where the diagnostics of a panic go, once the arguments are read. Kept with the data, whose
/// page every shim writes anyway, rather than in `.bss`, where the linker may place it after
/// the output buffer, in a page of its own.
#[unsafe(link_section = ".data")]
static mut RUN_DIR: Option<&'static CStr> = None;

/// The program: `stack` points at `argc`, followed by `argv` and `envp`.
///
/// # Safety
///
/// Called once, by `_start`, with the stack the kernel set up.
unsafe extern "C" fn start(stack: *const usize) -> ! {
    // SAFETY: the kernel's layout: argc, argv[argc], NULL, envp..., NULL.
    let (argv, envp) = unsafe {
        let argc = *stack;
        let argv = stack.add(1).cast::<*const u8>();
        (argv, argv.add(argc + 1))
    };
    // Nothing is open yet but what the driver passed on purpose (stdin, stdout, stderr).
    let _ = sys::close_from(3);
    // Started from an in-memory file, the process would be named after its descriptor.
    sys::set_name(c"wharf-shim");
    // SAFETY: the kernel's arrays live and stay unchanged for the life of the process; the
    // first entry is the program's own name.
    let argv: Argv<'static> = unsafe { Argv::new(argv.add(1)) };
    let args = match args::Args::parse(&argv) {
        Ok(args) => args,
        Err(message) => {
            life::report_failure(StartStep::Setup, 0, format_args!("{}", Lossy(message.bytes())));
            sys::exit(2);
        }
    };
    // SAFETY: one thread, and this is written once before anything reads it.
    unsafe { RUN_DIR = Some(args.run_dir) };
    let Some(confine) = life::read_containment(&argv, args.containment.clone()) else {
        sys::exit(2);
    };
    // SAFETY: one thread, which runs nothing else; the kernel's arrays hold `args`.
    let code = unsafe { life::run(&args, &argv, envp, &confine) };
    sys::exit(i32::from(code))
}

#[panic_handler]
fn panic(info: &core::panic::PanicInfo<'_>) -> ! {
    // SAFETY: one thread; written once, before any code that could panic reads it.
    if let Some(run_dir) = unsafe { RUN_DIR } {
        life::Diag { run_dir, fd: -1 }.note(format_args!("panicked: {info}"));
    }
    sys::exit(101)
}

/// Named by the unwind tables of the precompiled `core`; never called, since this program
/// aborts on a panic rather than unwinding.
#[unsafe(no_mangle)]
extern "C" fn rust_eh_personality() {}

// The memory and string functions the compiler calls (for copies of larger values, `CStr`),
// which a C library would provide. Plain loops: the shim copies little.

/// # Safety
///
/// As C's `memcpy`.
#[unsafe(no_mangle)]
unsafe extern "C" fn memcpy(dest: *mut u8, src: *const u8, n: usize) -> *mut u8 {
    for i in 0..n {
        // SAFETY: the caller's promise: both ranges are valid for `n` bytes.
        unsafe { *dest.add(i) = *src.add(i) };
    }
    dest
}

/// # Safety
///
/// As C's `memmove`.
#[unsafe(no_mangle)]
unsafe extern "C" fn memmove(dest: *mut u8, src: *const u8, n: usize) -> *mut u8 {
    if (dest as usize) <= (src as usize) {
        // SAFETY: forwards is safe when the destination starts first.
        return unsafe { memcpy(dest, src, n) };
    }
    for i in (0..n).rev() {
        // SAFETY: the caller's promise: both ranges are valid for `n` bytes.
        unsafe { *dest.add(i) = *src.add(i) };
    }
    dest
}

/// # Safety
///
/// As C's `memset`.
#[unsafe(no_mangle)]
unsafe extern "C" fn memset(dest: *mut u8, byte: i32, n: usize) -> *mut u8 {
    for i in 0..n {
        // SAFETY: the caller's promise: the range is valid for `n` bytes.
        unsafe { *dest.add(i) = byte as u8 };
    }
    dest
}

/// # Safety
///
/// As C's `memcmp`.
#[unsafe(no_mangle)]
unsafe extern "C" fn memcmp(a: *const u8, b: *const u8, n: usize) -> i32 {
    for i in 0..n {
        // SAFETY: the caller's promise: both ranges are valid for `n` bytes.
        let (x, y) = unsafe { (*a.add(i), *b.add(i)) };
        if x != y {
            return i32::from(x) - i32::from(y);
        }
    }
    0
}

/// # Safety
///
/// As C's `bcmp`.
#[unsafe(no_mangle)]
unsafe extern "C" fn bcmp(a: *const u8, b: *const u8, n: usize) -> i32 {
    // SAFETY: the caller's promise.
    unsafe { memcmp(a, b, n) }
}

/// # Safety
///
/// As C's `strlen`.
#[unsafe(no_mangle)]
unsafe extern "C" fn strlen(s: *const u8) -> usize {
    let mut n = 0;
    // SAFETY: the caller's promise: the string is NUL-terminated.
    while unsafe { *s.add(n) } != 0 {
        n += 1;
    }
    n
}
