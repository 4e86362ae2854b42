//! Fault injection at the storage seam, for tests of anything that persists through
//! wharf-store.
//!
//! [`open`] opens a [`RedbStore`] whose file I/O goes through a [`FaultPlan`]: writes or syncs
//! can be made to fail, and a write can be torn (half of it reaches the file, then it fails),
//! as a full disk or a dying device would. The engine sees the errors exactly where real I/O
//! would produce them.

use crate::{RedbStore, StoreError, StoreOptions};
use redb::StorageBackend;
use redb::backends::FileBackend;
use std::fs::OpenOptions;
use std::io;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// Which faults to inject next; shared between the test and the store.
#[derive(Debug, Default)]
pub struct FaultPlan {
    fail_writes: AtomicBool,
    tear_writes: AtomicBool,
    fail_syncs: AtomicBool,
    injected: AtomicU64,
}

impl FaultPlan {
    /// Every write fails before touching the file.
    pub fn fail_writes(&self, on: bool) {
        self.fail_writes.store(on, Ordering::SeqCst);
    }

    /// Every write puts its first half in the file, then fails.
    pub fn tear_writes(&self, on: bool) {
        self.tear_writes.store(on, Ordering::SeqCst);
    }

    /// Every sync fails (the data may or may not have reached the disk).
    pub fn fail_syncs(&self, on: bool) {
        self.fail_syncs.store(on, Ordering::SeqCst);
    }

    /// Turns every fault off.
    pub fn heal(&self) {
        self.fail_writes(false);
        self.tear_writes(false);
        self.fail_syncs(false);
    }

    /// How many faults were injected so far.
    pub fn injected(&self) -> u64 {
        self.injected.load(Ordering::SeqCst)
    }

    fn inject(&self, what: &str) -> io::Error {
        self.injected.fetch_add(1, Ordering::SeqCst);
        io::Error::other(format!("injected fault: {what}"))
    }
}

#[derive(Debug)]
struct FaultyFile {
    file: FileBackend,
    plan: Arc<FaultPlan>,
}

impl StorageBackend for FaultyFile {
    fn len(&self) -> Result<u64, io::Error> {
        self.file.len()
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), io::Error> {
        self.file.read(offset, out)
    }

    fn set_len(&self, len: u64) -> Result<(), io::Error> {
        if self.plan.fail_writes.load(Ordering::SeqCst) {
            return Err(self.plan.inject("set_len"));
        }
        self.file.set_len(len)
    }

    fn sync_data(&self) -> Result<(), io::Error> {
        if self.plan.fail_syncs.load(Ordering::SeqCst) {
            return Err(self.plan.inject("sync"));
        }
        self.file.sync_data()
    }

    fn write(&self, offset: u64, data: &[u8]) -> Result<(), io::Error> {
        if self.plan.fail_writes.load(Ordering::SeqCst) {
            return Err(self.plan.inject("write"));
        }
        if self.plan.tear_writes.load(Ordering::SeqCst) {
            self.file.write(offset, &data[..data.len() / 2])?;
            return Err(self.plan.inject("torn write"));
        }
        self.file.write(offset, data)
    }

    fn close(&self) -> Result<(), io::Error> {
        self.file.close()
    }

    fn try_lock_range(
        &self,
        start: std::ops::Bound<u64>,
        end: std::ops::Bound<u64>,
    ) -> Result<bool, redb::BackendError> {
        self.file.try_lock_range(start, end)
    }

    fn try_lock_shared_range(
        &self,
        start: std::ops::Bound<u64>,
        end: std::ops::Bound<u64>,
    ) -> Result<bool, redb::BackendError> {
        self.file.try_lock_shared_range(start, end)
    }

    fn lock_range(
        &self,
        start: std::ops::Bound<u64>,
        end: std::ops::Bound<u64>,
    ) -> Result<(), redb::BackendError> {
        self.file.lock_range(start, end)
    }

    fn lock_shared_range(
        &self,
        start: std::ops::Bound<u64>,
        end: std::ops::Bound<u64>,
    ) -> Result<(), redb::BackendError> {
        self.file.lock_shared_range(start, end)
    }

    fn unlock_range(
        &self,
        start: std::ops::Bound<u64>,
        end: std::ops::Bound<u64>,
    ) -> Result<(), redb::BackendError> {
        self.file.unlock_range(start, end)
    }
}

/// Opens (or creates) the store at `path` with its I/O under the returned plan's control.
/// Schema upgrades make no backup copy.
pub fn open(
    path: impl Into<PathBuf>,
    options: StoreOptions,
) -> Result<(RedbStore, Arc<FaultPlan>), StoreError> {
    let path = path.into();
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(|source| StoreError::Open { path: path.clone(), source })?;
    let plan = Arc::new(FaultPlan::default());
    let file = FileBackend::new(file).map_err(|e| StoreError::Storage {
        path: path.clone(),
        operation: "open",
        source: Box::new(redb::Error::from(e)),
    })?;
    let store = RedbStore::open_backend(path, FaultyFile { file, plan: plan.clone() }, &options)?;
    Ok((store, plan))
}
