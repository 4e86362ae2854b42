//! Helpers shared by wharf's end-to-end tests; the tests themselves are in `tests/`.
//!
//! - [`sshd`]: a real OpenSSH server on 127.0.0.1 for the prober's SSH tests and benchmark.
//! - [`netns`]: hosts made of network namespaces (veth link, own address, own sshd) for
//!   end-to-end tests of the fleet over a real network.
//! - [`announce`]: starting an agent or a fleet and reading the address it announces.
//! - [`fleet`]: a `wharf fleet` process that wipes what it leaves behind when dropped.
//! - [`etcd`]: a real etcd on 127.0.0.1 for the fleet's stores and failover tests.
//! - [`promtool`]: Prometheus' linter on a metrics text.
//! - [`proc_stat`]: what a process's `/proc/<pid>/stat` says of it.
//! - [`rng`]: a seeded random number generator for crash and fault rounds.

pub mod announce;
pub mod etcd;
pub mod fleet;
pub mod netns;
pub mod proc_stat;
pub mod promtool;
pub mod rng;
pub mod sshd;
