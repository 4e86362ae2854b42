//! Hashing the fetched bytes as they arrive, for `options.checksum`.

use md5::Md5;
use sha2::{Digest, Sha256};
use wharf_state::Checksum;

/// A running hash of the kind a checksum asks for.
pub(crate) enum Hasher {
    Sha256(Sha256),
    Md5(Md5),
}

impl Hasher {
    /// The hash `checksum` is checked with.
    pub(crate) fn for_checksum(checksum: &Checksum) -> Hasher {
        match checksum {
            Checksum::Sha256(_) => Hasher::Sha256(Sha256::new()),
            Checksum::Md5(_) => Hasher::Md5(Md5::new()),
        }
    }

    pub(crate) fn update(&mut self, bytes: &[u8]) {
        match self {
            Hasher::Sha256(hash) => hash.update(bytes),
            Hasher::Md5(hash) => hash.update(bytes),
        }
    }

    /// Whether the bytes hashed match `expected`; the actual sum in hex when they do not.
    pub(crate) fn verify(self, expected: &Checksum) -> Result<(), String> {
        let (actual, wanted): (Vec<u8>, &[u8]) = match (self, expected) {
            (Hasher::Sha256(hash), Checksum::Sha256(sum)) => (hash.finalize().to_vec(), sum),
            (Hasher::Md5(hash), Checksum::Md5(sum)) => (hash.finalize().to_vec(), sum),
            (Hasher::Sha256(hash), Checksum::Md5(sum)) => (hash.finalize().to_vec(), sum),
            (Hasher::Md5(hash), Checksum::Sha256(sum)) => (hash.finalize().to_vec(), sum),
        };
        if actual == wanted { Ok(()) } else { Err(hex(&actual)) }
    }
}

/// Lower-case hexadecimal.
pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
