//! The agent's events for `GET /v1/event/stream` ([`crate::nomad_http::events`]): an
//! allocation's task events (one `AllocationUpdated` per allocation and millisecond) and the
//! jobs' evaluations. Allocations keep their last ten task events; a subscriber further
//! behind than that misses the older ones, as one behind Nomad's event buffer does.

use super::common::{NomadServer, Shared};
use super::views;
use crate::nomad_http::NomadResult;
use crate::nomad_http::events::{self as shared, EventSource, Topics};
use axum::extract::{Query, State};
use axum::response::Response;
use serde_json::Value;
use std::collections::BTreeMap;

/// The events with an index in `(after, until]`, by index.
fn events_between(
    server: &NomadServer,
    topics: &Topics,
    after: u64,
    until: u64,
) -> BTreeMap<u64, Vec<Value>> {
    let mut frames: BTreeMap<u64, Vec<Value>> = BTreeMap::new();
    if topics.covers("Allocation") {
        for runner in server.agent.list() {
            let state = runner.subscribe().borrow().clone();
            let mut times: Vec<u64> = state
                .task_states
                .values()
                .flat_map(|t| t.events.iter().map(|e| e.time.0))
                .filter(|t| *t > after && *t <= until)
                .collect();
            times.sort_unstable();
            times.dedup();
            if times.is_empty() {
                continue;
            }
            let allocation = views::allocation(server, &runner);
            for time in times {
                if let Some(event) = shared::allocation_event(topics, &allocation, time) {
                    frames.entry(time).or_default().push(event);
                }
            }
        }
    }
    shared::job_events(&server.registry, topics, after, until, &mut frames);
    frames
}

impl EventSource for NomadServer {
    async fn events_between(
        &self,
        topics: &Topics,
        after: u64,
        until: u64,
    ) -> Option<BTreeMap<u64, Vec<Value>>> {
        Some(events_between(self, topics, after, until))
    }
}

/// `GET /v1/event/stream?topic=...&index=N`.
pub(crate) async fn stream(
    State(server): State<Shared>,
    Query(pairs): Query<Vec<(String, String)>>,
) -> NomadResult<Response> {
    shared::stream(server, &pairs)
}
