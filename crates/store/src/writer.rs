//! [`GroupWriter`]: the one thread that writes a redb file, committing what is sent to it in
//! groups. Both [`RedbStore`](crate::RedbStore) and [`Ledger`](crate::Ledger) write through one.
//!
//! The thread waits for a request, takes every other request already waiting (up to a
//! limit), and hands the group to its owner's commit function, which applies the group in one
//! transaction, commits once with immediate durability and answers each request. A burst of
//! writes shares one fsync, a lone write is committed at once, and a write is answered only
//! once it is durable. The thread ends when the writer is dropped, after answering what it
//! holds; dropping joins it, so the file is released before the owner might open it again.

use std::sync::mpsc;
use std::thread::JoinHandle;

/// A thread that commits requests of type `R` in groups.
#[derive(Debug)]
pub(crate) struct GroupWriter<R> {
    sender: Option<mpsc::Sender<R>>,
    thread: Option<JoinHandle<()>>,
}

impl<R: Send + 'static> GroupWriter<R> {
    /// Starts the thread `name`. `commit` gets each group, at most `max_group` requests in the
    /// order they were sent, and must answer every request in it.
    pub(crate) fn spawn(
        name: &str,
        max_group: usize,
        mut commit: impl FnMut(Vec<R>) + Send + 'static,
    ) -> std::io::Result<GroupWriter<R>> {
        let max_group = max_group.max(1);
        let (sender, receiver) = mpsc::channel::<R>();
        let thread = std::thread::Builder::new().name(name.to_owned()).spawn(move || {
            while let Ok(first) = receiver.recv() {
                let mut group = vec![first];
                while group.len() < max_group {
                    match receiver.try_recv() {
                        Ok(request) => group.push(request),
                        Err(_) => break,
                    }
                }
                commit(group);
            }
        })?;
        Ok(GroupWriter { sender: Some(sender), thread: Some(thread) })
    }

    /// Queues `request`; `Err` gives it back if the thread has ended.
    pub(crate) fn send(&self, request: R) -> Result<(), R> {
        match &self.sender {
            Some(sender) => sender.send(request).map_err(|e| e.0),
            None => Err(request),
        }
    }
}

impl<R> Drop for GroupWriter<R> {
    fn drop(&mut self) {
        // Closing the channel ends the thread once it has answered every request it holds.
        drop(self.sender.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    #[test]
    fn requests_waiting_together_are_committed_as_one_group_in_order() {
        let groups = Arc::new(Mutex::new(Vec::new()));
        let (started, holding) = mpsc::channel::<()>();
        let (release, gate) = mpsc::channel::<()>();
        let writer = {
            let groups = groups.clone();
            let mut first = true;
            GroupWriter::spawn("test-writer", 3, move |group: Vec<u32>| {
                // The first group holds the thread until the test has queued the others.
                if std::mem::take(&mut first) {
                    started.send(()).unwrap();
                    gate.recv().unwrap();
                }
                groups.lock().unwrap().push(group);
            })
            .unwrap()
        };
        writer.send(0).unwrap();
        holding.recv().unwrap();
        for n in 1..=5 {
            writer.send(n).unwrap();
        }
        release.send(()).unwrap();
        drop(writer);
        let groups = groups.lock().unwrap().clone();
        assert_eq!(groups, [vec![0], vec![1, 2, 3], vec![4, 5]]);
    }

    #[test]
    fn dropping_the_writer_answers_what_it_holds_and_ends_the_thread() {
        let committed = Arc::new(Mutex::new(0));
        let writer = {
            let committed = committed.clone();
            GroupWriter::spawn("test-writer", 10, move |group: Vec<u32>| {
                *committed.lock().unwrap() += group.len();
            })
            .unwrap()
        };
        for n in 0..100 {
            writer.send(n).unwrap();
        }
        drop(writer);
        assert_eq!(*committed.lock().unwrap(), 100);
    }
}
