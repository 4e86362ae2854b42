//! What the store records of one image.

use serde::{Deserialize, Serialize};

/// One image in the store.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredImage {
    /// The reference it was stored under.
    pub reference: String,
    /// Its manifest's digest.
    pub manifest: String,
    /// Its config's digest.
    pub config: String,
    /// Its layers' digests, lowest first.
    pub layers: Vec<String>,
    /// The bytes of its blobs (as stored, compressed layers compressed).
    pub size: u64,
}
