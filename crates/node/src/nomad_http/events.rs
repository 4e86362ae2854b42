//! `GET /v1/event/stream`: Nomad's event stream, as newline-delimited JSON frames
//! `{"Index": N, "Events": [...]}` with `{}` heartbeats, over a server's [`EventSource`].
//!
//! The events are read from what the server keeps durably, not from a buffer of its own: its
//! allocations' changes (topic `Allocation`, type `AllocationUpdated`) and the jobs'
//! evaluations (topic `Job`, `JobRegistered` or `JobDeregistered`, [`job_events`]). An
//! event's index is its time in milliseconds, so the same event has the same index after a
//! restart, and a subscriber that resumes from `index=N` gets every later event exactly once.
//! A millisecond is published only once it is [`SETTLE`] in the past, so that no event can
//! still arrive with an index the subscriber has passed.

use super::registry::Registry;
use super::{NomadApiError, NomadResult, now};
use axum::body::{Body, Bytes};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use wharf_nomad::shapes;

/// How long after its time an event is published.
const SETTLE: Duration = Duration::from_secs(1);
/// How often the stream looks for new events.
const POLL: Duration = Duration::from_millis(250);
/// The longest a stream stays silent: then it sends `{}`.
const HEARTBEAT: Duration = Duration::from_secs(5);

/// Where a server's events come from.
pub(crate) trait EventSource: Send + Sync + 'static {
    /// The events `topics` want with an index in `(after, until]`, by index; `None` when the
    /// server can no longer tell them (a fleet replica that stopped leading): the stream then
    /// ends, and the subscriber resumes from its last index where they are told.
    fn events_between(
        &self,
        topics: &Topics,
        after: u64,
        until: u64,
    ) -> impl Future<Output = Option<BTreeMap<u64, Vec<Value>>>> + Send;
}

/// Which events a subscriber asked for: `topic=Allocation`, `topic=Job:<id>`, `topic=*`.
#[derive(Debug, Clone, Default)]
pub(crate) struct Topics(Vec<(String, String)>);

impl Topics {
    pub(crate) fn parse(pairs: &[(String, String)]) -> NomadResult<Topics> {
        let mut topics = Vec::new();
        for (name, value) in pairs.iter().filter(|(name, _)| name == "topic") {
            let (topic, key) = value.split_once(':').unwrap_or((value, "*"));
            if !matches!(topic, "*" | "Allocation" | "Job" | "Node" | "Deployment" | "Evaluation") {
                return Err(NomadApiError::bad_request(format!("{name}: unknown topic {topic:?}")));
            }
            topics.push((topic.to_owned(), key.to_owned()));
        }
        Ok(Topics(topics))
    }

    /// Whether any event of `topic` may be wanted.
    pub(crate) fn covers(&self, topic: &str) -> bool {
        self.0.is_empty() || self.0.iter().any(|(t, _)| t == "*" || t == topic)
    }

    pub(crate) fn wants(&self, topic: &str, keys: &[&str]) -> bool {
        self.0.is_empty()
            || self
                .0
                .iter()
                .any(|(t, k)| (t == "*" || t == topic) && (k == "*" || keys.contains(&k.as_str())))
    }
}

/// `AllocationUpdated` of `allocation` at `time`, if `topics` want it.
pub(crate) fn allocation_event(
    topics: &Topics,
    allocation: &shapes::Allocation,
    time: u64,
) -> Option<Value> {
    if !topics.wants("Allocation", &[&allocation.id, &allocation.job_id]) {
        return None;
    }
    Some(json!({
        "Topic": "Allocation",
        "Type": "AllocationUpdated",
        "Key": allocation.id,
        "Namespace": allocation.namespace,
        "FilterKeys": [allocation.job_id],
        "Index": time,
        "Payload": {"Allocation": allocation},
    }))
}

/// The jobs' registrations and stops in `(after, until]` that `topics` want, added to
/// `frames`.
pub(crate) fn job_events(
    registry: &Registry,
    topics: &Topics,
    after: u64,
    until: u64,
    frames: &mut BTreeMap<u64, Vec<Value>>,
) {
    for record in registry.all() {
        let id = record.job.get("ID").and_then(Value::as_str).unwrap_or_default().to_owned();
        if !topics.wants("Job", &[&id]) {
            continue;
        }
        for eval in record.evals.iter().filter(|e| e.at.0 > after && e.at.0 <= until) {
            let kind = if eval.triggered_by == "job-deregister" {
                "JobDeregistered"
            } else {
                "JobRegistered"
            };
            frames.entry(eval.at.0).or_default().push(json!({
                "Topic": "Job",
                "Type": kind,
                "Key": id,
                "Namespace": record.job.get("Namespace").cloned().unwrap_or(json!("default")),
                "FilterKeys": [eval.id],
                "Index": eval.at.0,
                "Payload": {"Job": record.job},
            }));
        }
    }
}

fn line(value: &Value) -> Bytes {
    let mut bytes = serde_json::to_vec(value).unwrap_or_default();
    bytes.push(b'\n');
    Bytes::from(bytes)
}

/// `GET /v1/event/stream?topic=...&index=N` of `server`: the events `pairs` ask for, from
/// index `N` on, as they settle.
pub(crate) fn stream<S: EventSource>(
    server: Arc<S>,
    pairs: &[(String, String)],
) -> NomadResult<Response> {
    let topics = Topics::parse(pairs)?;
    let after = match pairs.iter().find(|(name, _)| name == "index") {
        Some((_, value)) => value
            .parse::<u64>()
            .map_err(|_| NomadApiError::bad_request(format!("index: {value:?} is not a number")))?,
        None => 0,
    };
    let state = (server, topics, after, tokio::time::Instant::now(), Vec::<Bytes>::new());
    let frames = futures_util::stream::unfold(
        state,
        |(server, topics, mut after, mut quiet_since, mut pending)| async move {
            loop {
                if !pending.is_empty() {
                    let next = pending.remove(0);
                    return Some((
                        Ok::<_, std::io::Error>(next),
                        (server, topics, after, tokio::time::Instant::now(), pending),
                    ));
                }
                let settled =
                    now().0.saturating_sub(u64::try_from(SETTLE.as_millis()).unwrap_or(u64::MAX));
                if settled > after {
                    let events = server.events_between(&topics, after, settled).await?;
                    for (index, events) in events {
                        pending.push(line(&json!({"Index": index, "Events": events})));
                    }
                    after = settled;
                    if !pending.is_empty() {
                        continue;
                    }
                }
                if quiet_since.elapsed() >= HEARTBEAT {
                    quiet_since = tokio::time::Instant::now();
                    return Some((
                        Ok(Bytes::from_static(b"{}\n")),
                        (server, topics, after, quiet_since, pending),
                    ));
                }
                tokio::time::sleep(POLL).await;
            }
        },
    );
    Ok(Response::builder()
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from_stream(frames))
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topics_filter_by_name_and_key() {
        let pairs = |values: &[&str]| {
            values.iter().map(|v| ("topic".to_owned(), (*v).to_owned())).collect::<Vec<_>>()
        };
        let all = Topics::parse(&[]).unwrap();
        assert!(all.wants("Job", &["x"]));
        let jobs = Topics::parse(&pairs(&["Job:web"])).unwrap();
        assert!(
            jobs.wants("Job", &["web"])
                && !jobs.wants("Job", &["db"])
                && !jobs.wants("Allocation", &["web"])
        );
        let allocs = Topics::parse(&pairs(&["Allocation", "Job:*"])).unwrap();
        assert!(allocs.wants("Allocation", &["a1", "web"]) && allocs.wants("Job", &["db"]));
        assert!(Topics::parse(&pairs(&["Bogus"])).is_err());
    }

    /// A source that tells its events until it no longer can (a replica that lost its lead).
    struct Lapsing(std::sync::atomic::AtomicU32);

    impl EventSource for Lapsing {
        async fn events_between(
            &self,
            _: &Topics,
            _: u64,
            until: u64,
        ) -> Option<BTreeMap<u64, Vec<Value>>> {
            let calls = self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            (calls == 0).then(|| BTreeMap::from([(until, vec![json!({"Topic": "Allocation"})])]))
        }
    }

    /// The stream ends once its source can no longer tell the events, rather than go on with
    /// heartbeats alone: the subscriber then resumes where they are told.
    #[tokio::test]
    async fn a_stream_ends_when_its_source_can_no_longer_tell_the_events() {
        use http_body_util::BodyExt;
        let source = Arc::new(Lapsing(Default::default()));
        let response = stream(source, &[("index".to_owned(), "0".to_owned())]).unwrap();
        let body = tokio::time::timeout(Duration::from_secs(60), response.into_body().collect())
            .await
            .expect("the stream ended")
            .unwrap()
            .to_bytes();
        let text = String::from_utf8_lossy(&body);
        assert_eq!(text.lines().count(), 1, "{text}");
        assert!(text.contains(r#""Topic":"Allocation""#), "{text}");
    }
}
