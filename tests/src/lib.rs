//! Helpers shared by wharf's end-to-end tests; the tests themselves are in `tests/`.
//!
//! - [`sshd`]: a real OpenSSH server on 127.0.0.1 for the prober's SSH tests and benchmark.

pub mod sshd;
