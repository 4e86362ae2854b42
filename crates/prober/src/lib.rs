//! wharf-prober watches a fleet of workers: cloud instances that run work through a runner.
//!
//! - [`worker`]: the per-worker state machine (unknown, booting, idle, running, shutdown; idle
//!   behaviours run, hold, drain): boot probe, runner deployment, run probe, shutdown of broken
//!   and idle workers, starting and killing runners.
//! - [`executor`]: the [`Executor`] seam that runs a command on a worker under a deadline, with
//!   a scripted implementation for tests.
//! - [`runner_list`]: the runner-list grammar the run probe parses.
//! - [`instance`]: the [`InstanceSet`] seam (the cloud).
//! - [`clock`]: the injected [`Clock`].
//!
//! Its neighbours: the runner on each worker is wharf's node CLI (`wharf alloc list --probe`)
//! or any runner speaking the same grammar; the node crate wires a pool into the agent. This
//! crate uses no other wharf crate's internals, reads no clock except through [`Clock`], and
//! runs commands only through an [`Executor`].

pub mod clock;
mod config;
mod error;
pub mod executor;
pub mod instance;
mod local;
mod loopback;
mod metrics;
pub mod pool;
mod quote;
pub mod runner_list;
pub mod ssh;
pub mod worker;

pub use clock::{Clock, FakeClock, Moment, SystemClock};
pub use config::{Deployment, Prepared, RunnerConfig, Timeouts, WorkerConfig, sha256_hex};
pub use error::ProberError;
pub use executor::{Executor, Output, Reply, ScriptedExecutor};
pub use instance::{Instance, InstanceId, InstanceSet, Tag, Tags};
pub use local::LocalExecutor;
pub use loopback::{LoopbackConfig, LoopbackInstanceSet};
pub use pool::{BrakeConfig, NewExecutor, Pool, PoolConfig};
pub use quote::quote;
pub use ssh::{SshExecutor, SshTarget};
pub use worker::{
    BootOutcome, Brake, Effect, IdleBehavior, ProbeOutcome, State, Worker, WorkerSpec, WorkerView,
};

#[cfg(test)]
mod worker_tests;

#[cfg(test)]
mod pool_tests;
