//! Reading a task's captured output back: the `logs` capability.
//!
//! A driver that captures its tasks' output (raw_exec's shim writes it into size-rotated files)
//! is also the one that knows how to read it, so the node asks the driver rather than knowing
//! a file layout. The output of a task outlives each run: a [`LogTarget`] names the task, not
//! the run, and reading works while the task runs, after it has ended, and after an agent
//! restart.

use crate::DriverError;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::path::PathBuf;

/// One of a task's output streams.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogStream {
    /// Standard output.
    Stdout,
    /// Standard error.
    Stderr,
}

impl LogStream {
    /// `"stdout"` or `"stderr"`.
    pub fn name(self) -> &'static str {
        match self {
            LogStream::Stdout => "stdout",
            LogStream::Stderr => "stderr",
        }
    }
}

impl fmt::Display for LogStream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Where reading starts. Offsets count bytes from the start of what is kept of the stream
/// (rotation drops the oldest bytes, so an offset is only meaningful for a short while).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFrom {
    /// The oldest byte kept.
    Start,
    /// This many bytes after the oldest kept (the end, if there are fewer).
    Offset(u64),
    /// This many bytes before the end (the start, if there are fewer).
    Tail(u64),
    /// The end: only what is written from now on.
    End,
}

/// Whose output to read: the same for every run of a task, so that output outlives the run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogTarget {
    /// The allocation.
    pub alloc_id: String,
    /// The task's name.
    pub task_name: String,
    /// The directory its runs were given as [`crate::LogConfig::dir`].
    pub dir: PathBuf,
}

impl LogTarget {
    /// The output of the task `config` starts (of every run of it).
    pub fn of(config: &crate::TaskConfig) -> LogTarget {
        LogTarget {
            alloc_id: config.alloc_id.clone(),
            task_name: config.task_name.clone(),
            dir: config.logs.dir.clone(),
        }
    }
}

/// One stream of one task's output, opened by [`crate::Driver::task_logs`], read in order.
#[async_trait::async_trait]
pub trait LogReader: Send + fmt::Debug {
    /// The next bytes, at most `limit`; empty when nothing new has been written yet (call
    /// again later to follow the stream as it grows, across rotations).
    async fn read(&mut self, limit: usize) -> Result<Vec<u8>, DriverError>;

    /// The offset of the next byte [`LogReader::read`] returns, counted as [`LogFrom::Offset`]
    /// counts: a client that asks again from here misses nothing and gets nothing twice.
    fn offset(&self) -> u64;
}
