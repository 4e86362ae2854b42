//! `<data_dir>/agent-token`: the agent's API token file, [`AGENT`], as the agent and its
//! clients name it. The mechanism (made at the first start, mode 0600, never read or written
//! through a link) is [`crate::api_token`]'s, the fleet's token file's too.

use crate::api_token::AGENT;
use std::path::{Path, PathBuf};

pub use crate::api_token::{MIN_LEN, TokenFileError, check};

/// The file's name in the agent's data directory.
pub const FILE_NAME: &str = AGENT.file_name;

/// The token file of the agent whose data directory is `data_dir`.
pub fn path(data_dir: &Path) -> PathBuf {
    AGENT.path(data_dir)
}

/// The agent's token from `data_dir`, made and kept there at the first start
/// ([`crate::api_token::TokenFile::load_or_create`]).
pub fn load_or_create(data_dir: &Path) -> Result<String, TokenFileError> {
    AGENT.load_or_create(data_dir)
}

/// The token the agent keeps in `data_dir`, as a client reads it: `Ok(None)` if there is none.
pub fn read(data_dir: &Path) -> Result<Option<String>, TokenFileError> {
    AGENT.read(data_dir)
}

/// Removes the agent's token file (a configured token is in force); nothing if there is none.
pub fn remove(data_dir: &Path) -> Result<(), TokenFileError> {
    AGENT.remove(data_dir)
}
