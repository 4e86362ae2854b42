//! The fleet's events for `GET /v1/event/stream` ([`crate::nomad_http::events`]): an
//! `AllocationUpdated` whenever the scheduler sees work submitted, started or ended (its
//! attempts' too), and the jobs' evaluations. Task events on the workers are not the
//! fleet's: they show in the allocation's task states, not as events of their own.

use super::server::{FleetNomad, Shared};
use super::views;
use crate::nomad_http::NomadResult;
use crate::nomad_http::events::{self as shared, EventSource, Topics};
use axum::extract::{Query, State};
use axum::response::Response;
use serde_json::Value;
use std::collections::BTreeMap;
use wharf_fleet::Placement;

/// The times in `(after, until]` the scheduler saw `placement` change, in order.
fn changes_between(placement: &Placement, after: u64, until: u64) -> Vec<u64> {
    let current = [Some(placement.submitted), placement.started, placement.finished];
    let earlier = placement.history.iter().flat_map(|a| [a.started, Some(a.finished)]);
    let mut times: Vec<u64> = current
        .into_iter()
        .chain(earlier)
        .flatten()
        .map(|t| t.0)
        .filter(|t| *t > after && *t <= until)
        .collect();
    times.sort_unstable();
    times.dedup();
    times
}

impl EventSource for FleetNomad {
    async fn events_between(
        &self,
        topics: &Topics,
        after: u64,
        until: u64,
    ) -> Option<BTreeMap<u64, Vec<Value>>> {
        let mut frames: BTreeMap<u64, Vec<Value>> = BTreeMap::new();
        if topics.covers("Allocation") {
            // A replica that no longer leads cannot tell what the work does.
            let leading = self.fleet.leading()?;
            let scheduler = leading.scheduler();
            for placement in scheduler.list() {
                let times = changes_between(&placement, after, until);
                if times.is_empty() {
                    continue;
                }
                let payload = scheduler.payload(&placement.id).unwrap_or_default();
                let allocation = views::allocation(self, &leading, &placement, &payload).await;
                for time in times {
                    if let Some(event) = shared::allocation_event(topics, &allocation, time) {
                        frames.entry(time).or_default().push(event);
                    }
                }
            }
        }
        shared::job_events(&self.registry, topics, after, until, &mut frames);
        Some(frames)
    }
}

/// `GET /v1/event/stream?topic=...&index=N`.
pub(super) async fn stream(
    State(server): State<Shared>,
    Query(pairs): Query<Vec<(String, String)>>,
) -> NomadResult<Response> {
    shared::stream(server, &pairs)
}
