//! The allocation directory's layout: what `<data dir>/allocs/<alloc id>` holds besides its
//! tasks' directories. `AllocDirHook` makes it before the tasks run, and `SpareDirs` builds it
//! ahead of time; both take it from here, so neither needs the other to know it.

use std::path::{Path, PathBuf};

/// The directories every task of the allocation shares: `alloc/data`, `alloc/logs` and
/// `alloc/tmp` under `alloc_root`.
pub(crate) fn shared_dirs(alloc_root: &Path) -> [PathBuf; 3] {
    let shared = alloc_root.join("alloc");
    [shared.join("data"), shared.join("logs"), shared.join("tmp")]
}
