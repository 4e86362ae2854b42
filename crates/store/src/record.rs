//! Records as stored: keys, the version stamp and the encoding. [`encode`] and [`decode`] are
//! public so that other stores of wharf records write them the same way.
//!
//! Every value is `[format version: u16 little-endian][JSON]`. The version is
//! [`wharf_state::FORMAT_VERSION`] at the time of writing; a reader refuses a record from the
//! future instead of misreading it.

use crate::error::StoreError;
use serde::Serialize;
use serde::de::DeserializeOwned;

/// `body` with the current format version in front.
pub(crate) fn stamp(body: &[u8]) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(body.len() + 2);
    bytes.extend_from_slice(&wharf_state::FORMAT_VERSION.to_le_bytes());
    bytes.extend_from_slice(body);
    bytes
}

/// The body of a stamped record, refusing one from a newer format version.
pub(crate) fn unstamp(bytes: &[u8]) -> Result<&[u8], DecodeError> {
    let (version, body) = bytes.split_first_chunk::<2>().ok_or(DecodeError::Truncated)?;
    let version = u16::from_le_bytes(*version);
    if version > wharf_state::FORMAT_VERSION {
        return Err(DecodeError::TooNew(version));
    }
    Ok(body)
}

/// Encodes `value` with the current format version in front: how every wharf store writes a
/// record (wharf-fleet's stores too).
pub fn encode<T: Serialize>(
    what: impl FnOnce() -> String,
    value: &T,
) -> Result<Vec<u8>, StoreError> {
    let body =
        serde_json::to_vec(value).map_err(|source| StoreError::Encode { what: what(), source })?;
    Ok(stamp(&body))
}

/// Why a stored record could not be read back.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// Shorter than its version stamp.
    #[error("record is truncated")]
    Truncated,
    /// Written by a newer wharf.
    #[error("record format version {0} is newer than {supported}", supported = wharf_state::FORMAT_VERSION)]
    TooNew(u16),
    /// The body does not parse.
    #[error("record body is invalid: {0}")]
    Body(String),
}

/// Decodes a record written by [`encode`], refusing one from a newer format version.
pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, DecodeError> {
    serde_json::from_slice(unstamp(bytes)?).map_err(|e| DecodeError::Body(e.to_string()))
}

/// The key of a task's records: `<alloc_id>/<task>`. Neither part may contain `/`.
pub(crate) fn task_key(alloc_id: &str, task: &str) -> String {
    format!("{alloc_id}/{task}")
}

/// The key range holding every task record of `alloc_id`: `<alloc_id>/` up to `<alloc_id>0`
/// (`0` is the byte after `/`).
pub(crate) fn task_range(alloc_id: &str) -> (String, String) {
    (format!("{alloc_id}/"), format!("{alloc_id}0"))
}

/// Checks that `key` is safe as an id or task name in a key.
pub(crate) fn check_key(key: &str) -> Result<(), StoreError> {
    wharf_state::alloc::check_alloc_id(key).map_err(|_| StoreError::InvalidKey(key.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_refuse_the_future() {
        let bytes = encode(|| "x".into(), &vec![1, 2, 3]).unwrap();
        assert_eq!(decode::<Vec<i32>>(&bytes), Ok(vec![1, 2, 3]));
        let mut future = bytes.clone();
        future[..2].copy_from_slice(&(wharf_state::FORMAT_VERSION + 1).to_le_bytes());
        assert_eq!(
            decode::<Vec<i32>>(&future),
            Err(DecodeError::TooNew(wharf_state::FORMAT_VERSION + 1))
        );
        assert_eq!(decode::<Vec<i32>>(&[1]), Err(DecodeError::Truncated));
        assert!(matches!(decode::<Vec<i32>>(&bytes[..bytes.len() - 1]), Err(DecodeError::Body(_))));
    }

    #[test]
    fn task_ranges_hold_exactly_one_allocs_tasks() {
        let (lo, hi) = task_range("a1");
        for inside in ["a1/web", "a1/x-y_z"] {
            assert!(lo.as_str() <= inside && inside < hi.as_str(), "{inside}");
        }
        for outside in ["a1", "a10/web", "a1-b/web", "a1_b/web", "a2/web", "a/web"] {
            assert!(!(lo.as_str() <= outside && outside < hi.as_str()), "{outside}");
        }
    }
}
