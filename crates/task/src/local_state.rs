//! What a task runner keeps for itself across agent restarts: the driver handle, hook state,
//! and whether the run is complete. Stored as the task's opaque local-state record.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use wharf_driver::TaskHandle;

/// The current shape of [`LocalState`].
pub const LOCAL_STATE_VERSION: u32 = 1;

/// A task runner's private state.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LocalState {
    /// [`LOCAL_STATE_VERSION`] when written.
    pub version: u32,
    /// The running task's handle, if one is running.
    pub handle: Option<TaskHandle>,
    /// How many runs were started, which numbers the next run's id.
    pub runs: u64,
    /// Each prestart hook's saved state, by hook name.
    pub hooks: BTreeMap<String, HookState>,
    /// The task will never run again and its stop hooks have run.
    pub run_complete: bool,
}

/// A prestart hook's saved state.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct HookState {
    /// The hook said it is done: skip it.
    pub done: bool,
    /// What it asked to keep.
    pub data: Option<serde_json::Value>,
    /// The environment it added, applied again when it is skipped.
    pub env: BTreeMap<String, String>,
}

impl LocalState {
    /// Encodes for the store, stamped with the current version.
    pub fn encode(&self) -> Result<Vec<u8>, serde_json::Error> {
        let mut state = self.clone();
        state.version = LOCAL_STATE_VERSION;
        serde_json::to_vec(&state)
    }

    /// Decodes what [`LocalState::encode`] wrote; refuses a newer version.
    pub fn decode(bytes: &[u8]) -> Result<LocalState, String> {
        let state: LocalState = serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
        if state.version > LOCAL_STATE_VERSION {
            return Err(format!("version {} is newer than {LOCAL_STATE_VERSION}", state.version));
        }
        Ok(state)
    }
}
