//! The event stream: every task event a runner records, in the order recorded, for listeners
//! that want each one rather than the latest state.
//!
//! A task's state keeps only its last [`wharf_state::task_state::MAX_TASK_EVENTS`] events, and
//! a `watch` of it shows only the latest state, so a listener that diffs states can miss
//! events. The stream misses none for a listener that keeps up; one that falls more than the
//! buffer behind is told how many it lost (`RecvError::Lagged`) and goes on from the oldest
//! event still buffered. Nothing is buffered until someone subscribes, so a stream nobody
//! listens to costs nothing.

use parking_lot::Mutex;
use std::sync::Arc;
use tokio::sync::broadcast;
use wharf_state::TaskEvent;

/// How many events a stream buffers for its slowest listener, unless told otherwise.
pub const DEFAULT_EVENT_BUFFER: usize = 256;

/// One task event as it was recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordedEvent {
    /// The allocation.
    pub alloc_id: String,
    /// The task.
    pub task: String,
    /// The event, exactly as it went into the task's state.
    pub event: TaskEvent,
}

/// Where task runners send the events they record. Clones share one stream, so the runners
/// of an allocation given clones of it make one stream, in the order the events were recorded.
#[derive(Debug, Clone)]
pub struct EventStream {
    buffer: usize,
    sender: Arc<Mutex<Option<broadcast::Sender<RecordedEvent>>>>,
}

impl Default for EventStream {
    fn default() -> Self {
        EventStream::new(DEFAULT_EVENT_BUFFER)
    }
}

impl EventStream {
    /// A stream that buffers `buffer` events (at least 1) for its slowest listener.
    pub fn new(buffer: usize) -> EventStream {
        EventStream { buffer: buffer.max(1), sender: Arc::default() }
    }

    /// A listener that receives every event recorded from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<RecordedEvent> {
        self.sender.lock().get_or_insert_with(|| broadcast::channel(self.buffer).0).subscribe()
    }

    /// Sends `events` in order, if anyone listens.
    pub(crate) fn send(&self, alloc_id: &str, task: &str, events: Vec<TaskEvent>) {
        let sender = self.sender.lock();
        let Some(sender) = sender.as_ref().filter(|s| s.receiver_count() > 0) else { return };
        for event in events {
            let _ = sender.send(RecordedEvent {
                alloc_id: alloc_id.to_owned(),
                task: task.to_owned(),
                event,
            });
        }
    }
}
