//! What is freed after a task has ended (its cgroup, its run directory), done on one thread of
//! the lowest priority.
//!
//! None of it is on a task's way to "dead", but on a node with few cores it competes with what
//! is: a thousand tasks stopped at once would otherwise remove a thousand cgroups at once,
//! contending for the kernel's cgroup lock on every core while the exits of the others wait to
//! be recorded. One thread in order, at nice 19, gives the cores to the stops first and frees
//! everything as soon as they are idle. An agent that stops before the queue is empty leaves
//! orphans, which its successor's sweep removes, as after a crash.

use std::sync::OnceLock;
use std::sync::mpsc;

type Job = Box<dyn FnOnce() + Send>;

/// Runs `job` on the housekeeping thread, after the jobs queued before it; its result once it
/// has run, or `None` if it panicked. Without the thread (its spawn failed), `job` runs on
/// tokio's blocking pool.
pub(crate) async fn run<T: Send + 'static>(job: impl FnOnce() -> T + Send + 'static) -> Option<T> {
    enqueue(job).await.ok()
}

/// Queues `job` now; its result comes on the receiver (closed if it panicked).
fn enqueue<T: Send + 'static>(
    job: impl FnOnce() -> T + Send + 'static,
) -> tokio::sync::oneshot::Receiver<T> {
    let (done, result) = tokio::sync::oneshot::channel();
    let job: Job = Box::new(move || {
        let _ = done.send(job());
    });
    match queue() {
        Some(queue) => {
            // The thread outlives every sender: it ends only with the process.
            let _ = queue.send(job);
        }
        None => drop(tokio::task::spawn_blocking(job)),
    }
    result
}

/// Waits, at most `limit`, until everything queued so far has been freed: what an agent that
/// shuts down does last, so that a clean stop leaves nothing for its successor's sweep.
/// Returns whether the queue was done in time.
pub async fn finish(limit: std::time::Duration) -> bool {
    // Nothing was ever queued: there is nothing to wait for, and no thread to start.
    if QUEUE.get().is_none() {
        return true;
    }
    tokio::time::timeout(limit, run(|| ())).await.is_ok()
}

static QUEUE: OnceLock<Option<mpsc::Sender<Job>>> = OnceLock::new();

/// The queue of the housekeeping thread, started with the first job.
fn queue() -> Option<&'static mpsc::Sender<Job>> {
    QUEUE
        .get_or_init(|| {
            let (queue, jobs) = mpsc::channel::<Job>();
            let spawned =
                std::thread::Builder::new().name("wharf-housekeep".into()).spawn(move || {
                    if let Err(error) = crate::sys::lower_own_priority() {
                        tracing::debug!(%error, "housekeeping runs at the agent's priority");
                    }
                    for job in jobs {
                        // A job that panics loses its result, not the thread.
                        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job));
                    }
                });
            match spawned {
                Ok(_) => Some(queue),
                Err(error) => {
                    tracing::warn!(%error, "no housekeeping thread; freeing on the blocking pool");
                    None
                }
            }
        })
        .as_ref()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// The calling thread's id and nice value.
    fn thread_and_nice() -> (i32, i32) {
        // SAFETY: gettid and getpriority take plain integers and touch no memory.
        unsafe {
            let tid = libc::gettid();
            (tid, libc::getpriority(libc::PRIO_PROCESS, tid as libc::id_t))
        }
    }

    #[tokio::test]
    async fn jobs_run_in_order_on_one_thread_of_the_lowest_priority() {
        let order = std::sync::Arc::new(parking_lot::Mutex::new(Vec::new()));
        let queued: Vec<_> = (0..8)
            .map(|n| {
                let order = order.clone();
                enqueue(move || {
                    order.lock().push(n);
                    thread_and_nice()
                })
            })
            .collect();
        let mut threads = Vec::new();
        for job in queued {
            threads.push(job.await.expect("the job ran"));
        }
        let (tid, nice) = threads[0];
        assert!(threads.iter().all(|t| t.0 == tid), "one thread: {threads:?}");
        assert_ne!(tid, thread_and_nice().0, "not the caller's thread");
        assert_eq!(nice, 19);
        assert_eq!(*order.lock(), (0..8).collect::<Vec<_>>());
    }

    #[tokio::test]
    async fn a_job_that_panics_loses_its_result_not_the_thread() {
        assert_eq!(run(|| -> u32 { panic!("a job that fails") }).await, None);
        assert_eq!(run(|| 7).await, Some(7));
    }

    #[tokio::test]
    async fn finish_waits_for_what_was_queued_before_it() {
        let (release, blocked) = std::sync::mpsc::channel::<()>();
        let (ran, done) = tokio::sync::oneshot::channel();
        // Queued now, before `finish` queues its own job behind it.
        let _blocked = enqueue(move || {
            let _ = blocked.recv();
            let _ = ran.send(());
        });
        // The job above holds the queue: nothing after it is done.
        assert!(!finish(Duration::from_millis(50)).await);
        release.send(()).unwrap();
        assert!(finish(Duration::from_secs(30)).await);
        done.await.expect("the blocked job ran before finish returned");
    }
}
