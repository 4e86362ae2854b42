//! A fleet replica's life: campaign, lead until the term is lost (or the replica stops),
//! follow, and campaign again ([`ReplicaLoop`]).
//!
//! Every replica of a fleet runs this loop against the shared [`FleetStore`]. The store decides
//! who leads ([`FleetStore::campaign`] waits for as long as another replica leads); the winner
//! builds what a leader runs, a [`Leading`] (the pool of workers and a [`Scheduler`] under its
//! [`Term`]), through the embedder's `build` callback, and runs the scheduler until its term
//! is over: a lease that lapsed, a write the store fenced, or a resignation. Then it stops
//! acting at once (the pool stops, the term is given back) and follows, campaigning again.
//!
//! What it does not know: how the pool is made (instance sets, executors, runner commands are
//! the embedder's, wharf-node's `fleet` module for the `wharf` binary), nor any API. A
//! follower serves reads from the store; the loop only says, through [`ReplicaLoop::leading`],
//! whether this replica leads and with what.
//!
//! | event | what the loop does next |
//! |-------|-------------------------|
//! | the campaign wins | builds the lead; runs the scheduler |
//! | the campaign fails (store unreachable, own lease lapsed) | logs, waits [`ReplicaLoop::retry_after`], campaigns again |
//! | the build fails | gives the term back, logs, waits, campaigns again |
//! | the scheduler returns (term lost, write fenced or failed) | stops the pool, resigns, follows |
//! | [`ReplicaLoop::shutdown`] | stops the scheduler and the pool, resigns, returns for good |

use crate::error::FleetError;
use crate::scheduler::Scheduler;
use crate::store::{FleetStore, Replica, Term};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{oneshot, watch};
use wharf_prober::Pool;

/// What a replica runs while it leads: the pool of workers and the scheduler, under one term,
/// and what the embedder keeps beside them (`extra`: its instance sets, for example).
#[derive(Debug)]
pub struct Leading<E = ()> {
    pool: Pool,
    scheduler: Scheduler,
    extra: E,
}

impl<E> Leading<E> {
    /// The lead of `scheduler` over `pool`, with the embedder's `extra`.
    pub fn new(pool: Pool, scheduler: Scheduler, extra: E) -> Leading<E> {
        Leading { pool, scheduler, extra }
    }

    /// The pool of workers.
    pub fn pool(&self) -> &Pool {
        &self.pool
    }

    /// The scheduler.
    pub fn scheduler(&self) -> &Scheduler {
        &self.scheduler
    }

    /// The term it leads under.
    pub fn term(&self) -> &Term {
        self.scheduler.term()
    }

    /// What the embedder keeps beside the pool and the scheduler.
    pub fn extra(&self) -> &E {
        &self.extra
    }
}

/// One replica's campaign, lead, resign, follow loop over a store. Shared: [`ReplicaLoop::run`]
/// takes it in an `Arc`, and the embedder keeps another to read [`ReplicaLoop::leading`] and to
/// [`ReplicaLoop::shutdown`].
#[derive(Debug)]
pub struct ReplicaLoop<E = ()> {
    store: Arc<dyn FleetStore>,
    me: Replica,
    /// What this replica runs while it leads; `None` while it follows.
    leading: watch::Sender<Option<Arc<Leading<E>>>>,
    stopping: watch::Sender<bool>,
    retry_after: Duration,
}

impl<E: Send + Sync + 'static> ReplicaLoop<E> {
    /// Replica `me` of the fleet kept in `store`; it does nothing until [`ReplicaLoop::run`].
    pub fn new(store: Arc<dyn FleetStore>, me: Replica) -> ReplicaLoop<E> {
        ReplicaLoop {
            store,
            me,
            leading: watch::Sender::new(None),
            stopping: watch::Sender::new(false),
            retry_after: Duration::from_secs(1),
        }
    }

    /// The same, waiting `retry_after` between a campaign or a build that failed and the next
    /// campaign (1 s by default).
    pub fn with_retry_after(mut self, retry_after: Duration) -> ReplicaLoop<E> {
        self.retry_after = retry_after;
        self
    }

    /// The wait after a campaign or a build that failed.
    pub fn retry_after(&self) -> Duration {
        self.retry_after
    }

    /// This replica.
    pub fn replica(&self) -> &Replica {
        &self.me
    }

    /// The store it campaigns in.
    pub fn store(&self) -> &Arc<dyn FleetStore> {
        &self.store
    }

    /// What it runs while it leads; `None` while it follows.
    pub fn leading(&self) -> Option<Arc<Leading<E>>> {
        self.leading.borrow().clone()
    }

    /// A subscription to [`ReplicaLoop::leading`]: it changes when this replica starts or stops
    /// leading.
    pub fn subscribe(&self) -> watch::Receiver<Option<Arc<Leading<E>>>> {
        self.leading.subscribe()
    }

    /// Campaigns, leads, follows, and campaigns again, until [`ReplicaLoop::shutdown`]. Once
    /// it wins a term, `build` makes what it runs under it (and starts the pool if it runs on
    /// its own). `first` hears how the first attempt to lead went: led, or why not.
    ///
    /// A follower's campaign waits for as long as another replica leads: following is the
    /// normal state of all but one replica, said at debug level. A campaign that fails (the
    /// store cannot be reached, this replica's lease lapsed) and a lead that cannot be built
    /// are errors.
    pub async fn run<B, F, X>(self: Arc<Self>, build: B, first: Option<FirstLead<X>>)
    where
        B: Fn(Term) -> F,
        F: Future<Output = Result<Leading<E>, X>>,
        X: std::fmt::Display,
    {
        let mut first = first;
        let mut stopping = self.stopping.subscribe();
        loop {
            let Some(leading) = self.win(&build, &mut stopping, &mut first).await else { return };
            let term = leading.term().clone();
            if *stopping.borrow() {
                // Shut down while it campaigned: the term is given back at once.
                leading.pool.stop();
                let _ = self.store.resign(&term).await;
                return;
            }
            self.leading.send_replace(Some(leading.clone()));
            if let Some(first) = first.take() {
                let _ = first.send(Ok(()));
            }
            leading.scheduler.run().await;
            if *stopping.borrow() {
                return;
            }
            // The term is over (its lease lapsed, or a write was fenced): stop acting at once.
            leading.pool.stop();
            self.leading.send_replace(None);
            let _ = self.store.resign(&term).await;
            tracing::warn!(
                replica = %self.me.name,
                term = term.number(),
                "this replica no longer leads the fleet; it follows"
            );
        }
    }

    /// Campaigns until this replica wins a term and builds its lead, trying again after each
    /// failure; `None` once it is shut down.
    async fn win<B, F, X>(
        &self,
        build: &B,
        stopping: &mut watch::Receiver<bool>,
        first: &mut Option<FirstLead<X>>,
    ) -> Option<Arc<Leading<E>>>
    where
        B: Fn(Term) -> F,
        F: Future<Output = Result<Leading<E>, X>>,
        X: std::fmt::Display,
    {
        loop {
            tracing::debug!(replica = %self.me.name, "campaigning to lead the fleet; following whoever leads meanwhile");
            let campaign = tokio::select! {
                term = self.store.campaign(&self.me) => term,
                _ = stopping.wait_for(|stop| *stop) => return None,
            };
            let error = match campaign {
                Ok(term) => {
                    tracing::info!(replica = %self.me.name, term = term.number(), store = ?self.store.describe(), "leading the fleet");
                    match build(term.clone()).await {
                        Ok(leading) => return Some(Arc::new(leading)),
                        Err(error) => {
                            let _ = self.store.resign(&term).await;
                            LeadError::Build(error)
                        }
                    }
                }
                Err(error) => LeadError::Campaign(error),
            };
            tracing::error!(replica = %self.me.name, error = %format!("{error:#}"), "cannot lead the fleet");
            if let Some(first) = first.take() {
                let _ = first.send(Err(error));
            }
            // Another replica may lead meanwhile; this one tries again.
            tokio::select! {
                () = tokio::time::sleep(self.retry_after) => {}
                _ = stopping.wait_for(|stop| *stop) => return None,
            }
        }
    }

    /// Stops leading (the scheduler and the pool stop, the term is given up so another replica
    /// may lead at once) and campaigning. Returns the lead it gave up, for the embedder to
    /// clean up after it.
    pub async fn shutdown(&self) -> Option<Arc<Leading<E>>> {
        self.stopping.send_replace(true);
        let leading = self.leading.send_replace(None)?;
        leading.scheduler.stop_running();
        leading.pool.stop();
        if let Err(error) = self.store.resign(leading.term()).await {
            tracing::warn!(%error, "cannot resign the fleet's term");
        }
        Some(leading)
    }
}

/// Where [`ReplicaLoop::run`] tells how its first attempt to lead went.
pub type FirstLead<X> = oneshot::Sender<Result<(), LeadError<X>>>;

/// Why a replica could not lead.
#[derive(Debug)]
pub enum LeadError<X> {
    /// Its campaign failed: the store cannot be reached, or its lease lapsed while it waited.
    Campaign(FleetError),
    /// It won a term, but what a leader runs could not be built: the embedder's error.
    Build(X),
}

impl<X: std::fmt::Display> std::fmt::Display for LeadError<X> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The alternate form passes on, so an error with a chain of causes shows them all.
        match self {
            LeadError::Campaign(error) if f.alternate() => write!(f, "{error:#}"),
            LeadError::Campaign(error) => write!(f, "{error}"),
            LeadError::Build(error) if f.alternate() => write!(f, "{error:#}"),
            LeadError::Build(error) => write!(f, "{error}"),
        }
    }
}

#[cfg(test)]
#[path = "replica_tests.rs"]
mod tests;
