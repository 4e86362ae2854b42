//! Helpers shared by wharf's end-to-end tests; the tests themselves are in `tests/`.
//!
//! - [`sshd`]: a real OpenSSH server on 127.0.0.1 for the prober's SSH tests and benchmark.

#![allow(clippy::disallowed_methods)] // Test fixtures start helper processes (sshd, ssh-keygen).

pub mod sshd;
