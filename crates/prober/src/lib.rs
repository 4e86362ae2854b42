#![doc = include_str!("../README.md")]
//!
//! ## Inside
//!
//! wharf-prober watches a fleet of workers: cloud instances that run work through a runner.
//!
//! Each worker is driven through `unknown`, `booting`, `idle`, `running` and `shutdown`, with
//! the idle behaviours `run`, `hold` and `drain`, by probing it over an [`Executor`]: a boot
//! probe, a deployment of the runner binary, and a run probe that lists the work on it in the
//! runner-list grammar. The behaviour matches Arvados' dispatch-cloud worker, with its
//! defects fixed (see the differences below).
//!
//! - [`worker`]: the per-worker state machine: its pure decisions on a [`Record`]
//!   ([`worker::record`]), and the [`Worker`] that runs its commands.
//! - [`pool`]: the [`Pool`]: creates in the background with throttling, sync with the
//!   instance list, the per-worker probe schedule, the fleet brake, operator actions, metrics.
//! - [`capacity`]: instance types (provider type, preemptible, quota group) and what holds
//!   creates back ([`HoldReason`]).
//! - [`executor`]: the [`Executor`] seam and the [`ScriptedExecutor`] for tests;
//!   [`ssh`] ([`SshExecutor`], on russh) and [`LocalExecutor`] (`sh -c`) implement it;
//!   [`channel`]'s [`ChannelExecutor`] sends the runner's commands over one long-lived session.
//! - [`instance`]: the [`InstanceSet`] seam (the cloud), with [`LoopbackInstanceSet`] (this
//!   host), [`StaticInstanceSet`] (machines the user already has) and, with feature `ec2`,
//!   `Ec2InstanceSet` ([`ec2`]: Amazon EC2 or anything speaking its Query API).
//! - [`runner_list`]: the runner-list grammar; [`runner_outcome`]: the outcome line of work
//!   that left the list ([`RunnerOutcome`]); [`quote`]: shell quoting of ids and paths;
//!   [`resources`]: what a worker has for work, as its runner reports it.
//! - [`clock`]: the injected [`Clock`] ([`SystemClock`], [`FakeClock`]).
//!
//! Its neighbours: the runner on each worker is wharf's node CLI (`wharf alloc list --probe`)
//! or any runner speaking the same grammar (crunch-run); wharf-fleet places work on the pool's
//! workers and follows it, and this crate knows nothing of scheduling. It depends on no other
//! wharf crate, reads time only through [`Clock`], runs commands only through an [`Executor`],
//! and prints nothing (it logs with `tracing`, with a `worker` field).
//!
//! # Where it differs from Arvados, on purpose
//!
//! Arvados' own worker, pool and throttle tests, ported, pass here. What differs, and why:
//!
//! - **Probe deadlines.** Arvados runs probe commands with no deadline: a hung command or SSH
//!   handshake stops that worker's probing for good, and its probe timeout never fires. Here
//!   every command has one ([`WorkerConfig::command_deadline`], `deploy_deadline`); a command
//!   cut off counts as a failed probe, and is stopped on the worker too (under the worker's
//!   own `timeout`, and by TERM and KILL over the channel), so hung probes do not pile up.
//! - **The fleet brake.** Arvados judges each worker alone, so a network outage or a broken
//!   key destroys every worker once the probe timeout passes. Here no worker is shut down for
//!   being unresponsive while more than [`BrakeConfig::max_failing_share`] (and at least
//!   `min_failing`) of the booted workers fail at once; the reason is logged and exported.
//! - **sha256 for the runner binary.** Arvados names and checks the deployed binary by md5
//!   and writes it in place. Here it is `runner~<sha256>`, written to a temp file, checked,
//!   renamed into place and checked again: md5 no longer guards integrity, and a copy cut off
//!   halfway must never sit at the path the check trusts.
//! - **An unknown worker with work is never shut down** for a failing boot probe or for its
//!   age (Arvados' main branch does, after the boot timeout, losing the work it runs).
//! - **Probe scheduling** is per worker, each at its own interval, with a bound on probes in
//!   flight, instead of one loop at a global rate whose passes stretch with the fleet.
//! - **A new instance is probed as soon as its create returns**, and again after half the time
//!   it has been booting (at least 250 ms, at most `probe_interval`) until it has booted,
//!   where Arvados waits for its next probe tick each time: an instance that boots in a second
//!   is in service about then, not up to two intervals later (a fleet of 100 loopback workers
//!   took a minute to boot on 5 s ticks). Instances a list finds (a restarted prober) still
//!   have their first probes spread over one interval.
//! - **One read of the runner binary for the copies under way.** A binary named by file is
//!   read when a worker needs a copy; the copies that run together share that read, so a
//!   hundred workers booting at once hold the binary once, not a hundred times.
//! - **Creates in flight**: at `max_concurrent_creates`, creates wait until one ends (and
//!   subscribers hear when it does) rather than for a fixed 5 s; an instance a list shows
//!   before its create returns counts once, not twice.
//! - **Quota groups** come from the configuration ([`InstanceType::quota_group`]) rather than
//!   from the driver.
//! - **Probes over a channel.** Arvados opens an SSH session (a fork, a shell, the runner) for
//!   every probe. [`ChannelExecutor`] sends the runner's commands over one long-lived session per
//!   worker instead, with the same deadlines, and falls back to a session per command when the
//!   channel breaks or the runner has none (see [`channel`] and the README).
//! - **Metric names** end in `_total` for counters and not for gauges, as Prometheus' linter
//!   asks (`boot_outcomes_total`, `instances`).

pub mod capacity;
pub mod channel;
pub mod clock;
mod config;
mod deadline;
#[cfg(feature = "ec2")]
pub mod ec2;
mod error;
pub mod executor;
pub mod instance;
mod invocation;
mod local;
mod loopback;
mod metrics;
pub mod pool;
mod quote;
pub mod resources;
pub mod runner_list;
pub mod runner_outcome;
#[cfg(feature = "ssh")]
pub mod ssh;
mod static_set;
pub mod worker;

pub use capacity::{CapacityScope, HoldReason, InstanceType, Price};
pub use channel::{ChannelConfig, ChannelExecutor, ChannelStats, SessionOpener};
pub use clock::{Clock, FakeClock, Moment, SystemClock};
pub use config::{
    Deployment, Prepared, RunnerBinary, RunnerConfig, RunnerFile, Timeouts, WorkerConfig,
    sha256_hex,
};
#[cfg(feature = "ec2")]
pub use ec2::{Ec2Config, Ec2InstanceSet};
pub use error::ProberError;
pub use executor::{Call, Executor, Match, Output, Reply, ScriptedExecutor};
pub use instance::{Instance, InstanceId, InstanceSet, Tag, Tags};
pub use invocation::RunnerInvocation;
pub use local::LocalExecutor;
pub use loopback::{LoopbackConfig, LoopbackInstanceSet, TAGS_FILE};
pub use pool::{BrakeConfig, Creating, InstanceView, NewExecutor, Pool, PoolConfig};
pub use quote::quote;
pub use resources::Resources;
pub use runner_outcome::RunnerOutcome;
#[cfg(feature = "ssh")]
pub use ssh::{SshExecutor, SshTarget};

/// The attribute that implementations of [`Executor`] and [`InstanceSet`] put on their `impl`
/// block.
pub use async_trait::async_trait;
pub use static_set::{StaticConfig, StaticHost, StaticInstanceSet};
pub use worker::{
    BootOutcome, Brake, Effect, IdleBehavior, Kill, ProbeOutcome, ProbeReport, RESOURCES_RETRY,
    Record, Rules, RunReport, Runner, State, Worker, WorkerSpec, WorkerView,
};

#[cfg(test)]
mod pool_tests;
#[cfg(test)]
mod worker_tests;
