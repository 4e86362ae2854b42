//! [`Watched`]: a value that tasks wait on until it is what they need.
//!
//! The runners keep a few such values of their own (a task runner's start gate and running
//! task, an alloc runner's "every task runner finished"), one set per allocation. A
//! `tokio::sync::watch` channel would do, but each one is a shared allocation of some 350
//! bytes (its wakers for many receivers); this is the value beside one [`Notify`], inline in
//! its owner.

use parking_lot::Mutex;
use std::pin::pin;
use tokio::sync::Notify;

/// A value that tasks wait on. Every change wakes every waiter, which looks again.
#[derive(Debug, Default)]
pub struct Watched<T> {
    value: Mutex<T>,
    changed: Notify,
}

impl<T: Clone> Watched<T> {
    /// A value of `value`.
    pub fn new(value: T) -> Watched<T> {
        Watched { value: Mutex::new(value), changed: Notify::new() }
    }

    /// The value now.
    pub fn get(&self) -> T {
        self.value.lock().clone()
    }

    /// Sets the value and wakes every waiter.
    pub fn set(&self, value: T) {
        *self.value.lock() = value;
        self.changed.notify_waiters();
    }

    /// Waits until `ready` holds for the value, and returns it.
    pub async fn wait_for(&self, mut ready: impl FnMut(&T) -> bool) -> T {
        loop {
            // Registered before the value is looked at, so a change in between still wakes.
            let mut changed = pin!(self.changed.notified());
            changed.as_mut().enable();
            {
                let value = self.value.lock();
                if ready(&value) {
                    return value.clone();
                }
            }
            changed.await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Duration;

    #[tokio::test]
    async fn a_waiter_sees_a_change_made_after_it_began_waiting() {
        let gate = Arc::new(Watched::new(false));
        let waiting = tokio::spawn({
            let gate = gate.clone();
            async move { gate.wait_for(|open| *open).await }
        });
        tokio::task::yield_now().await;
        gate.set(true);
        let seen = tokio::time::timeout(Duration::from_secs(10), waiting).await.unwrap().unwrap();
        assert!(seen);
    }

    #[tokio::test]
    async fn a_value_already_there_is_returned_at_once() {
        let current = Watched::new(Some(7));
        assert_eq!(current.wait_for(Option::is_some).await, Some(7));
        assert_eq!(current.get(), Some(7));
    }

    #[tokio::test(start_paused = true)]
    async fn a_change_that_does_not_satisfy_keeps_the_waiter_waiting() {
        let value = Arc::new(Watched::new(0));
        let waiting = tokio::spawn({
            let value = value.clone();
            async move { value.wait_for(|n| *n >= 2).await }
        });
        tokio::task::yield_now().await;
        value.set(1);
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished());
        value.set(2);
        assert_eq!(waiting.await.unwrap(), 2);
    }
}
