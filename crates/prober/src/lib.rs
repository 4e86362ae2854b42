//! wharf-prober watches a fleet of workers: cloud instances that run work through a runner.
//!
//! Each worker is driven through `unknown`, `booting`, `idle`, `running` and `shutdown`, with
//! the idle behaviours `run`, `hold` and `drain`, by probing it over an [`Executor`]: a boot
//! probe, a deployment of the runner binary, and a run probe that lists the work on it in the
//! runner-list grammar. The behaviour matches Arvados' dispatch-cloud worker, with three of its
//! defects fixed: every command has a deadline, an unknown worker with work is never destroyed
//! for a failing boot probe, and a fleet-wide brake stops mass destruction during an outage.
//!
//! - [`worker`]: the per-worker state machine: its pure decisions on a [`Record`]
//!   ([`worker::record`]), and the [`Worker`] that runs its commands.
//! - [`pool`]: the [`Pool`]: creates in the background with throttling, sync with the
//!   instance list, the per-worker probe schedule, the fleet brake, operator actions, metrics.
//! - [`capacity`]: instance types (provider type, preemptible, quota group) and what holds
//!   creates back ([`HoldReason`]).
//! - [`executor`]: the [`Executor`] seam and the [`ScriptedExecutor`] for tests;
//!   [`ssh`] ([`SshExecutor`], on russh) and [`LocalExecutor`] (`sh -c`) implement it.
//! - [`scheduler`]: the [`Scheduler`]: places work on the least-loaded worker with room,
//!   queues it while none has room, and follows it through the run probes until it ends.
//! - [`instance`]: the [`InstanceSet`] seam (the cloud), with [`LoopbackInstanceSet`] (this
//!   host) and [`StaticInstanceSet`] (machines the user already has).
//! - [`runner_list`]: the runner-list grammar; [`quote`]: shell quoting of ids and paths.
//! - [`clock`]: the injected [`Clock`] ([`SystemClock`], [`FakeClock`]).
//!
//! Its neighbours: the runner on each worker is wharf's node CLI (`wharf alloc list --probe`)
//! or any runner speaking the same grammar (crunch-run); the node crate wires a pool into the
//! agent. This crate depends on no other wharf crate, reads time only through [`Clock`], runs
//! commands only through an [`Executor`], and prints nothing (it logs with `tracing`, with a
//! `worker` field).

pub mod capacity;
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
pub mod scheduler;
pub mod ssh;
mod static_set;
pub mod worker;

pub use capacity::{CapacityScope, HoldReason, InstanceType};
pub use clock::{Clock, FakeClock, Moment, SystemClock};
pub use config::{
    Deployment, Prepared, RunnerBinary, RunnerConfig, RunnerFile, Timeouts, WorkerConfig,
    sha256_hex,
};
pub use error::ProberError;
pub use executor::{Executor, Output, Reply, ScriptedExecutor};
pub use instance::{Instance, InstanceId, InstanceSet, Tag, Tags};
pub use local::LocalExecutor;
pub use loopback::{LoopbackConfig, LoopbackInstanceSet};
pub use pool::{BrakeConfig, Creating, InstanceView, NewExecutor, Pool, PoolConfig};
pub use quote::quote;
pub use scheduler::{Phase, Placement, Scheduler, SchedulerConfig};
pub use ssh::{SshExecutor, SshTarget};
pub use static_set::{StaticConfig, StaticHost, StaticInstanceSet};
pub use worker::{
    BootOutcome, Brake, Effect, IdleBehavior, Kill, ProbeOutcome, ProbeReport, Record, Rules,
    RunReport, Runner, State, Worker, WorkerSpec, WorkerView,
};

#[cfg(test)]
mod pool_tests;
#[cfg(test)]
mod scheduler_tests;
#[cfg(test)]
mod worker_tests;
