//! [`Watched`]: a value that tasks wait on until it is what they need.
//!
//! The runners keep their changing facts in such values (a task runner's facts, an alloc
//! runner's "every task runner finished"), one set per allocation. A `tokio::sync::watch`
//! channel would do, but each one is a shared allocation of some 350 bytes (its wakers for many
//! receivers); this is the value beside one [`Notify`], inline in its owner.
//!
//! The value's lock is a `parking_lot` mutex, held only inside these methods, never across an
//! `.await`: the closures given to [`Watched::read`], [`Watched::update`] and
//! [`Watched::wait_until`] run under it, so they must not touch the same value again.

use parking_lot::Mutex;
use std::pin::pin;
use tokio::sync::Notify;

/// A value that tasks wait on. Every change wakes every waiter, which looks again.
#[derive(Debug, Default)]
pub struct Watched<T> {
    value: Mutex<T>,
    changed: Notify,
}

impl<T> Watched<T> {
    /// A value of `value`.
    pub fn new(value: T) -> Watched<T> {
        Watched { value: Mutex::new(value), changed: Notify::new() }
    }

    /// Sets the value and wakes every waiter.
    pub fn set(&self, value: T) {
        self.update(|now| *now = value);
    }

    /// What `read` makes of the value now.
    pub fn read<R>(&self, read: impl FnOnce(&T) -> R) -> R {
        read(&self.value.lock())
    }

    /// Changes the value with `change`, wakes every waiter, and returns what `change` returned.
    pub fn update<R>(&self, change: impl FnOnce(&mut T) -> R) -> R {
        let answer = change(&mut self.value.lock());
        self.changed.notify_waiters();
        answer
    }

    /// Waits until `ready` answers for the value, and returns its answer. `ready` may change
    /// the value as it answers (take a request out of it, say); waiters are then woken. It
    /// must leave the value as it was when it does not answer.
    pub async fn wait_until<R>(&self, mut ready: impl FnMut(&mut T) -> Option<R>) -> R {
        loop {
            // Registered before the value is looked at, so a change in between still wakes.
            let mut changed = pin!(self.changed.notified());
            changed.as_mut().enable();
            let answer = ready(&mut self.value.lock());
            if let Some(answer) = answer {
                self.changed.notify_waiters();
                return answer;
            }
            changed.await;
        }
    }
}

impl<T: Clone> Watched<T> {
    /// The value now.
    pub fn get(&self) -> T {
        self.read(T::clone)
    }

    /// Waits until `ready` holds for the value, and returns it.
    pub async fn wait_for(&self, mut ready: impl FnMut(&T) -> bool) -> T {
        self.wait_until(|value| ready(value).then(|| value.clone())).await
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

    #[tokio::test(start_paused = true)]
    async fn an_answer_taken_out_of_the_value_is_taken_once() {
        // Two waiters for one request: the first to look takes it, the other keeps waiting.
        let request = Arc::new(Watched::new(None::<u32>));
        let waiter = || {
            let request = request.clone();
            tokio::spawn(async move { request.wait_until(Option::take).await })
        };
        let (first, second) = (waiter(), waiter());
        tokio::task::yield_now().await;
        request.set(Some(7));
        tokio::task::yield_now().await;
        let done: Vec<bool> = [&first, &second].iter().map(|w| w.is_finished()).collect();
        assert_eq!(done.iter().filter(|d| **d).count(), 1, "exactly one took it: {done:?}");
        assert_eq!(request.get(), None, "taken out of the value");
        request.set(Some(8));
        let (first, second) = (first.await.unwrap(), second.await.unwrap());
        let mut answers = [first, second];
        answers.sort_unstable();
        assert_eq!(answers, [7, 8]);
    }

    #[tokio::test]
    async fn update_returns_its_answer_and_wakes_a_waiter() {
        let count = Arc::new(Watched::new(0u32));
        let waiting = tokio::spawn({
            let count = count.clone();
            async move { count.wait_until(|n| (*n >= 1).then_some(*n * 10)).await }
        });
        tokio::task::yield_now().await;
        let before = count.update(|n| std::mem::replace(n, 3));
        assert_eq!(before, 0);
        assert_eq!(count.read(|n| *n), 3);
        let seen = tokio::time::timeout(Duration::from_secs(10), waiting).await.unwrap().unwrap();
        assert_eq!(seen, 30);
    }
}
