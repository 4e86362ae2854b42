//! Running one task's checks while the task runs.
//!
//! [`TaskChecks::start`] spawns one loop per check. Each loop waits a first delay spread over
//! the check's interval (so a thousand checks started together do not fire together), then
//! runs the check, bounded by its timeout, records the result in the allocation's
//! [`CheckBook`], hands the status to the task's [`RestartWatch`], and waits the interval.
//! When the watch calls for a restart, the loop asks the task's runner for one through
//! [`TaskControl::restart`] (a failure, counted by the restart policy) and ends; the task's
//! next start starts its checks again, with a new watch. [`TaskChecks::stop`] (or dropping
//! it) ends every loop at its next wait, without waiting for them.
//!
//! The loops reach the network only through [`Transport`] and the task only through
//! [`TaskControl`], and take time from tokio, so their rules run under a paused clock.

use crate::catalog::CheckBook;
use crate::check::{CheckPlan, Probe, judge_http, judge_script};
use crate::restart::RestartWatch;
use crate::transport::Transport;
use parking_lot::Mutex;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;
use wharf_driver::ExecResult;
use wharf_state::duration::Formatted;
use wharf_state::{CheckResult, CheckStatus, Timestamp};

/// What checks need of the task they check.
#[async_trait::async_trait]
pub trait TaskControl: Send + Sync + fmt::Debug + 'static {
    /// Runs `command` inside the running `task`, for `timeout` at most.
    async fn exec(
        &self,
        task: &str,
        command: &[String],
        timeout: Duration,
    ) -> Result<ExecResult, String>;

    /// Restarts `task` as a failure, through its restart policy, recording `reason`.
    async fn restart(&self, task: &str, reason: &str) -> Result<(), String>;
}

/// Where result timestamps come from.
pub type Now = Arc<dyn Fn() -> Timestamp + Send + Sync>;

/// What running checks use: the network, the task, the time of day.
#[derive(Clone)]
pub struct CheckIo {
    /// How http and tcp checks reach services.
    pub transport: Arc<dyn Transport>,
    /// How script checks and check_restart reach the task.
    pub control: Arc<dyn TaskControl>,
    /// Timestamps for results.
    pub now: Now,
}

impl fmt::Debug for CheckIo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CheckIo")
            .field("transport", &self.transport)
            .field("control", &self.control)
            .finish_non_exhaustive()
    }
}

/// How long a restart request may take; it only records an event and wakes the task runner.
const RESTART_TIMEOUT: Duration = Duration::from_secs(10);
/// Extra time a script check's exec gets beyond the check's timeout, which the exec itself
/// enforces (killing the command), to report.
const EXEC_GRACE: Duration = Duration::from_secs(5);

#[derive(Debug)]
struct Shared {
    task: String,
    book: Arc<CheckBook>,
    io: CheckIo,
    restarts: Mutex<RestartWatch>,
    started: Instant,
    /// Which run of the task these checks belong to, for the book.
    run: u64,
}

/// The checks of one run of one task. They stop when this is stopped or dropped.
#[derive(Debug)]
pub struct TaskChecks {
    stop: watch::Sender<bool>,
}

impl TaskChecks {
    /// Starts a loop per plan of `task` (spawned on the current tokio runtime). Grace periods
    /// count from now.
    pub fn start(
        task: &str,
        plans: Vec<CheckPlan>,
        book: Arc<CheckBook>,
        io: CheckIo,
    ) -> TaskChecks {
        let policies = plans.iter().filter_map(|p| Some((p.id.clone(), p.restart?)));
        let shared = Arc::new(Shared {
            task: task.to_owned(),
            restarts: Mutex::new(RestartWatch::new(policies)),
            run: book.run_of(task),
            book,
            io,
            started: Instant::now(),
        });
        let stop = watch::channel(false).0;
        for plan in plans {
            let (shared, stopped) = (shared.clone(), stop.subscribe());
            tokio::spawn(run_check(plan, shared, stopped));
        }
        TaskChecks { stop }
    }

    /// Ends every loop at its next wait; a run in progress is abandoned.
    pub fn stop(&self) {
        self.stop.send_replace(true);
    }
}

impl Drop for TaskChecks {
    fn drop(&mut self) {
        self.stop();
    }
}

async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|stop| *stop).await;
}

/// Sleeps `delay` unless stopped first; false if stopped.
async fn pause(delay: Duration, stop: &mut watch::Receiver<bool>) -> bool {
    tokio::select! {
        biased;
        () = stopped(stop) => false,
        () = tokio::time::sleep(delay) => true,
    }
}

/// The first run's delay: a point of the interval fixed by the check's id, so checks started
/// together spread out, and the same check always starts the same way.
fn first_delay(plan: &CheckPlan) -> Duration {
    let hash =
        plan.id.to_string().bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        });
    plan.interval.mul_f64((hash % 1000) as f64 / 1000.0)
}

async fn run_check(plan: CheckPlan, shared: Arc<Shared>, mut stop: watch::Receiver<bool>) {
    if !pause(first_delay(&plan), &mut stop).await {
        return;
    }
    loop {
        let result = tokio::select! {
            biased;
            () = stopped(&mut stop) => return,
            result = run_once(&plan, &shared) => result,
        };
        let status = result.status;
        tracing::trace!(task = %shared.task, check = %plan.id, %status, "check ran");
        shared.book.record_run(&plan.id, Some(shared.run), result);
        let call = shared.restarts.lock().observe(&plan.id, status, shared.started.elapsed());
        if let Some(call) = call {
            tracing::info!(task = %shared.task, check = %plan.id, failures = call.failures, "check_restart: restarting the task");
            let restart = shared.io.control.restart(&shared.task, &call.reason);
            match tokio::time::timeout(RESTART_TIMEOUT, restart).await {
                Ok(Ok(())) => {}
                Ok(Err(error)) => {
                    tracing::debug!(task = %shared.task, %error, "check_restart: no restart")
                }
                Err(_) => {
                    tracing::warn!(task = %shared.task, "check_restart: the restart request timed out")
                }
            }
            return;
        }
        if !pause(plan.interval, &mut stop).await {
            return;
        }
    }
}

/// One run of the check, bounded by its timeout.
async fn run_once(plan: &CheckPlan, shared: &Shared) -> CheckResult {
    let io = &shared.io;
    let limit = Formatted(plan.timeout);
    let (status, output, status_code) = match &plan.probe {
        Probe::Http { addr, request } => {
            let what = format!("HTTP {} {} on {addr}", request.method, request.target);
            match tokio::time::timeout(plan.timeout, io.transport.http(*addr, request)).await {
                Ok(Ok(reply)) => {
                    let (status, output) = judge_http(request, &reply);
                    (status, output, Some(reply.status))
                }
                Ok(Err(error)) => (CheckStatus::Critical, format!("{what}: {error}"), None),
                Err(_) => {
                    (CheckStatus::Critical, format!("{what}: no answer within {limit}"), None)
                }
            }
        }
        Probe::Tcp { addr } => {
            match tokio::time::timeout(plan.timeout, io.transport.connect(*addr)).await {
                Ok(Ok(())) => (CheckStatus::Passing, format!("TCP connect {addr}: Success"), None),
                Ok(Err(error)) => {
                    (CheckStatus::Critical, format!("TCP connect {addr}: {error}"), None)
                }
                Err(_) => (
                    CheckStatus::Critical,
                    format!("TCP connect {addr}: no connection within {limit}"),
                    None,
                ),
            }
        }
        Probe::Script { command } => {
            let exec = io.control.exec(&shared.task, command, plan.timeout);
            match tokio::time::timeout(plan.timeout + EXEC_GRACE, exec).await {
                Ok(Ok(result)) => {
                    let (status, output) = judge_script(&result);
                    (status, output, None)
                }
                Ok(Err(error)) => {
                    (CheckStatus::Critical, format!("cannot run the script: {error}"), None)
                }
                Err(_) => {
                    (CheckStatus::Critical, format!("the script did not end within {limit}"), None)
                }
            }
        }
        Probe::NoPort { label } => (
            CheckStatus::Critical,
            format!("the allocation holds no port {label:?}; it was placed without its ports"),
            None,
        ),
    };
    CheckResult { status, output, status_code, time: (io.now)() }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::CheckId;
    use wharf_state::service::CheckKind;

    #[test]
    fn first_runs_spread_over_the_interval() {
        let plan = |check: &str| CheckPlan {
            id: CheckId { task: "t".into(), service: "s".into(), check: check.into() },
            kind: CheckKind::Tcp,
            probe: Probe::NoPort { label: "x".into() },
            interval: Duration::from_secs(10),
            timeout: Duration::from_secs(1),
            restart: None,
        };
        let delays: Vec<Duration> =
            (0..100).map(|i| first_delay(&plan(&format!("c{i}")))).collect();
        assert!(delays.iter().all(|d| *d < Duration::from_secs(10)));
        let early = delays.iter().filter(|d| **d < Duration::from_secs(5)).count();
        assert!((25..=75).contains(&early), "{early} of 100 in the first half");
        assert_eq!(first_delay(&plan("c1")), first_delay(&plan("c1")), "stable per check");
    }
}
