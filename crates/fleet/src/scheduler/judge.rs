//! What the scheduler makes of an answer from a worker, as pure functions: a start command's
//! result ([`judge_start`]) and an outcome question's answer ([`judge_outcome`]). The books
//! apply the verdicts (`Books::after_start`, `Books::after_outcome`); the I/O shell only asks
//! and passes the answers in.
//!
//! After a start:
//!
//! | result | verdict |
//! |--------|---------|
//! | acknowledged | running, confirmed |
//! | the worker no longer takes work, or is gone (nothing ran there) | back to the queue's front, the start not counted |
//! | the command ran and refused | the worker backs off; back to the queue's front, or failed after `max_start_attempts` |
//! | the command could not be sent (an id or path it cannot carry) | failed |
//! | the answer was lost (a timeout, a dropped connection) | running, unconfirmed: the next probe decides |
//!
//! After an outcome question, in this order of precedence:
//!
//! | answer | confirmed | worker | verdict |
//! |--------|-----------|--------|---------|
//! | no outcome command | any | any | ended (`ended`) |
//! | `unknown` | yes | any | lost: its worker no longer knows it |
//! | `unknown` | no | any | back to the queue (the start never arrived), or failed after `max_start_attempts` |
//! | `pending`/`running` | any | still in service | nothing: the probe raced its start |
//! | the question failed | any | waits for the answer | nothing: ask again |
//! | `pending`/`running` | any | shut down or gone | lost with its worker |
//! | any other line | any | any | ended as the line says (failed if it says `failed`) |
//! | the question failed | yes | any | ended, how unknown |
//! | the question failed | no | any | lost: it may never have run |

use wharf_prober::{ProberError, RunnerOutcome, State, WorkerView};
use wharf_state::ClientStatus;

/// How an attempt ended, as the scheduler learned it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum AttemptEnd {
    /// The runner said how (`complete ...`, `failed ...`); `failed` if it failed.
    Ended { worker: String, outcome: String, failed: bool },
    /// Its worker went, or forgot it.
    Lost { worker: String, reason: String },
}

/// A start command's result, as the books need it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum StartResult {
    /// The runner acknowledged it.
    Acknowledged,
    /// The worker stopped taking work before the command ran: nothing happened there.
    WorkerChanged { reason: String },
    /// The pool no longer has the worker: nothing happened there.
    WorkerGone,
    /// The command ran and refused: it did not start.
    Refused { error: String },
    /// The command never reached the worker (an id or path it cannot carry).
    Unsendable { error: String },
    /// The answer was lost: it may have started.
    Unconfirmed { error: String },
}

impl StartResult {
    /// What the pool's answer to a start says.
    pub(crate) fn of(result: Result<(), ProberError>) -> StartResult {
        match result {
            Ok(()) => StartResult::Acknowledged,
            Err(ProberError::NotAllowed { reason, .. }) => StartResult::WorkerChanged { reason },
            Err(e @ ProberError::CommandFailed { .. }) => {
                StartResult::Refused { error: e.to_string() }
            }
            Err(e @ ProberError::Unquotable { .. }) => {
                StartResult::Unsendable { error: e.to_string() }
            }
            Err(ProberError::UnknownWorker(_)) => StartResult::WorkerGone,
            Err(e) => StartResult::Unconfirmed { error: e.to_string() },
        }
    }
}

/// What becomes of an attempt after its start command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum StartVerdict {
    /// It runs, confirmed.
    Running,
    /// It may run: the next probe says.
    Unconfirmed,
    /// Back to the front of the queue; `uncount` the start if nothing reached the worker.
    Requeue { uncount: bool },
    /// The worker refused: it backs off, and the work goes back to the queue's front.
    RefusedRequeue,
    /// The worker refused once too often: the worker backs off, and the work fails.
    RefusedFail { reason: String },
    /// It cannot start anywhere: the work fails.
    Fail { reason: String },
}

/// What becomes of an attempt after its start command's `result`, `starts` commands into it.
pub(crate) fn judge_start(result: StartResult, starts: u32, may_retry: bool) -> StartVerdict {
    match result {
        StartResult::Acknowledged => StartVerdict::Running,
        StartResult::WorkerChanged { .. } | StartResult::WorkerGone => {
            StartVerdict::Requeue { uncount: true }
        }
        StartResult::Refused { error } if !may_retry => StartVerdict::RefusedFail {
            reason: format!("refused {starts} times; the last time: {error}"),
        },
        StartResult::Refused { .. } => StartVerdict::RefusedRequeue,
        StartResult::Unsendable { error } => StartVerdict::Fail { reason: error },
        StartResult::Unconfirmed { .. } => StartVerdict::Unconfirmed,
    }
}

/// Where the worker asked about an attempt stands when the answer comes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WorkerStanding {
    /// Shut down or gone: what still ran there went with it.
    Out,
    /// In service, and holding its idle shutdown for this answer.
    Waits,
    /// In service, not waiting for this answer.
    InService,
}

impl WorkerStanding {
    /// Where `view` (none: gone) stands, asked about `runner_id`.
    pub(crate) fn of(view: Option<&WorkerView>, runner_id: &str) -> WorkerStanding {
        match view {
            None => WorkerStanding::Out,
            Some(view) if view.state == State::Shutdown => WorkerStanding::Out,
            Some(view) if view.awaiting_outcome.iter().any(|r| r == runner_id) => {
                WorkerStanding::Waits
            }
            Some(_) => WorkerStanding::InService,
        }
    }
}

/// The answer to how an attempt ended (an error's text if the question failed; `None` if the
/// runner has no outcome command), and where its worker stood when it came.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct OutcomeAnswer {
    pub(crate) answer: Result<Option<RunnerOutcome>, String>,
    pub(crate) standing: WorkerStanding,
}

/// What becomes of an attempt after an outcome question.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum OutcomeVerdict {
    /// Nothing yet: it has not ended after all, or the question is asked again.
    Wait,
    /// Its start never arrived: back to the queue's front.
    Requeue,
    /// No start of it reached a worker, and it may not be tried again.
    Fail { reason: String },
    /// The attempt is over.
    End(AttemptEnd),
}

/// What becomes of an attempt on `worker` after the `answer` to how it ended (an error's text
/// if the question failed; `None` if the runner has no outcome command). `confirmed`: its
/// start reached the worker; `starts`: start commands sent for it; `may_retry`: it may be
/// started again.
pub(crate) fn judge_outcome(
    answer: Result<Option<RunnerOutcome>, String>,
    worker: &str,
    standing: WorkerStanding,
    confirmed: bool,
    starts: u32,
    may_retry: bool,
) -> OutcomeVerdict {
    let worker = worker.to_owned();
    let not_ended = |outcome: &RunnerOutcome| {
        matches!(
            outcome,
            RunnerOutcome::Status { status: ClientStatus::Pending | ClientStatus::Running, .. }
        )
    };
    let end = OutcomeVerdict::End;
    match answer {
        Ok(None) => end(AttemptEnd::Ended { worker, outcome: "ended".into(), failed: false }),
        Ok(Some(RunnerOutcome::Unknown)) if confirmed => {
            end(AttemptEnd::Lost { worker, reason: "its worker no longer knows it".into() })
        }
        Ok(Some(RunnerOutcome::Unknown)) if may_retry => OutcomeVerdict::Requeue,
        Ok(Some(RunnerOutcome::Unknown)) => OutcomeVerdict::Fail {
            reason: format!("no start reached a worker in {starts} attempts"),
        },
        Ok(Some(outcome)) if not_ended(&outcome) && standing != WorkerStanding::Out => {
            OutcomeVerdict::Wait
        }
        Err(_) if standing == WorkerStanding::Waits => OutcomeVerdict::Wait,
        Ok(Some(outcome)) if not_ended(&outcome) => {
            let reason = format!("worker {worker} was shut down");
            end(AttemptEnd::Lost { worker, reason })
        }
        Ok(Some(outcome)) => end(AttemptEnd::Ended {
            worker,
            failed: outcome.failed(),
            outcome: outcome.to_string(),
        }),
        Err(e) if confirmed => end(AttemptEnd::Ended {
            worker,
            outcome: format!("ended; the worker cannot say how: {e}"),
            failed: false,
        }),
        Err(e) => end(AttemptEnd::Lost {
            worker,
            reason: format!(
                "its start was not acknowledged and the worker cannot say whether it ran: {e}"
            ),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ended(outcome: &str, failed: bool) -> OutcomeVerdict {
        OutcomeVerdict::End(AttemptEnd::Ended {
            worker: "h1".into(),
            outcome: outcome.into(),
            failed,
        })
    }

    fn lost(reason: &str) -> OutcomeVerdict {
        OutcomeVerdict::End(AttemptEnd::Lost { worker: "h1".into(), reason: reason.into() })
    }

    /// One row per case of the table in the module doc: start results, with and without a
    /// retry left.
    #[test]
    fn after_start_table() {
        let refused = || StartResult::Refused { error: "no room here".into() };
        let cases = [
            (StartResult::Acknowledged, true, StartVerdict::Running),
            (StartResult::Acknowledged, false, StartVerdict::Running),
            (
                StartResult::WorkerChanged { reason: "draining".into() },
                true,
                StartVerdict::Requeue { uncount: true },
            ),
            (StartResult::WorkerGone, false, StartVerdict::Requeue { uncount: true }),
            (refused(), true, StartVerdict::RefusedRequeue),
            (
                refused(),
                false,
                StartVerdict::RefusedFail {
                    reason: "refused 3 times; the last time: no room here".into(),
                },
            ),
            (
                StartResult::Unsendable { error: "cannot quote".into() },
                true,
                StartVerdict::Fail { reason: "cannot quote".into() },
            ),
            (StartResult::Unconfirmed { error: "timeout".into() }, true, StartVerdict::Unconfirmed),
            (
                StartResult::Unconfirmed { error: "timeout".into() },
                false,
                StartVerdict::Unconfirmed,
            ),
        ];
        for (result, may_retry, want) in cases {
            let got = judge_start(result.clone(), 3, may_retry);
            assert_eq!(got, want, "{result:?}, may retry: {may_retry}");
        }
    }

    /// The pool's errors, sorted into start results.
    #[test]
    fn start_results_of_the_pools_answers() {
        let worker = || "h1".to_owned();
        let cases = [
            (Ok(()), StartResult::Acknowledged),
            (
                Err(ProberError::NotAllowed {
                    worker: worker(),
                    action: "start",
                    reason: "draining".into(),
                }),
                StartResult::WorkerChanged { reason: "draining".into() },
            ),
            (Err(ProberError::UnknownWorker(worker())), StartResult::WorkerGone),
        ];
        for (result, want) in cases {
            assert_eq!(StartResult::of(result), want);
        }
        let refused = StartResult::of(Err(ProberError::CommandFailed {
            worker: worker(),
            command: "start".into(),
            status: "exit status 3".into(),
            stderr: "no room here".into(),
        }));
        assert!(matches!(refused, StartResult::Refused { .. }), "{refused:?}");
        let lost = StartResult::of(Err(ProberError::Timeout {
            worker: worker(),
            what: "start".into(),
            deadline: std::time::Duration::from_secs(1),
        }));
        assert!(matches!(lost, StartResult::Unconfirmed { .. }), "{lost:?}");
    }

    type Answer = Result<Option<RunnerOutcome>, String>;

    /// One row per case of the outcome table in the module doc, in its order of precedence.
    #[test]
    fn after_outcome_table() {
        use WorkerStanding::{InService, Out, Waits};
        let line = |text: &str| Ok(Some(RunnerOutcome::parse(text)));
        let failed_question = || Err("timed out".to_owned());
        #[rustfmt::skip]
        let cases: Vec<(Answer, bool, WorkerStanding, bool, OutcomeVerdict)> = vec![
            // answer, confirmed, worker, may retry: verdict
            (Ok(None), true, InService, true, ended("ended", false)),
            (Ok(None), false, Out, false, ended("ended", false)),
            (line("unknown"), true, InService, true, lost("its worker no longer knows it")),
            (line("unknown"), true, Out, false, lost("its worker no longer knows it")),
            (line("unknown"), false, InService, true, OutcomeVerdict::Requeue),
            (line("unknown"), false, Out, false, OutcomeVerdict::Fail { reason: "no start reached a worker in 2 attempts".into() }),
            (line("running"), true, InService, true, OutcomeVerdict::Wait),
            (line("pending"), false, Waits, true, OutcomeVerdict::Wait),
            (failed_question(), true, Waits, true, OutcomeVerdict::Wait),
            (failed_question(), false, Waits, true, OutcomeVerdict::Wait),
            (line("running"), true, Out, true, lost("worker h1 was shut down")),
            (line("complete all tasks finished"), true, InService, true, ended("complete all tasks finished", false)),
            (line("failed exit 3"), true, Out, true, ended("failed exit 3", true)),
            (line("lost its node went"), false, InService, true, ended("lost its node went", false)),
            (line("done"), true, InService, true, ended("done", false)),
            (failed_question(), true, InService, true, ended("ended; the worker cannot say how: timed out", false)),
            (failed_question(), true, Out, true, ended("ended; the worker cannot say how: timed out", false)),
            (failed_question(), false, Out, true, lost("its start was not acknowledged and the worker cannot say whether it ran: timed out")),
        ];
        for (answer, confirmed, standing, may_retry, want) in cases {
            let case = format!("{answer:?}, confirmed: {confirmed}, {standing:?}");
            let got = judge_outcome(answer, "h1", standing, confirmed, 2, may_retry);
            assert_eq!(got, want, "{case}");
        }
    }

    /// A worker's standing, from its view.
    #[test]
    fn worker_standing_table() {
        let view = |state: State, awaiting: &[&str]| WorkerView {
            id: "h1".into(),
            address: None,
            instance_type: String::new(),
            state,
            idle_behavior: wharf_prober::IdleBehavior::Run,
            running: Vec::new(),
            starting: Vec::new(),
            awaiting_outcome: awaiting.iter().map(|r| (*r).to_owned()).collect(),
            last_runner: None,
            probe_age: std::time::Duration::ZERO,
            idle_for: std::time::Duration::ZERO,
            last_probe_failed: false,
            last_error: None,
            resources: None,
        };
        assert_eq!(WorkerStanding::of(None, "a"), WorkerStanding::Out);
        assert_eq!(
            WorkerStanding::of(Some(&view(State::Shutdown, &["a"])), "a"),
            WorkerStanding::Out
        );
        assert_eq!(
            WorkerStanding::of(Some(&view(State::Idle, &["a"])), "a"),
            WorkerStanding::Waits
        );
        assert_eq!(
            WorkerStanding::of(Some(&view(State::Idle, &["b"])), "a"),
            WorkerStanding::InService
        );
        assert_eq!(
            WorkerStanding::of(Some(&view(State::Running, &[])), "a"),
            WorkerStanding::InService
        );
    }
}
