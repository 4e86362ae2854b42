//! Tells the crates that depend on this one where the `nolibc` module's source is
//! (`DEP_WHARF_ISOLATE_NOLIBC`), so that wharf-exec can build it into its static shim, which
//! links no C library and so cannot link this crate.

fn main() {
    let dir = std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    println!("cargo::metadata=nolibc={dir}/src/nolibc/mod.rs");
    println!("cargo::rerun-if-changed=build.rs");
}
