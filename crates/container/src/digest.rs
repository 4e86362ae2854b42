//! Content digests (`sha256:<64 hex>`): parsed strictly, so a digest can name a file, and
//! checked while the content streams in.

use crate::error::ContainerError;
use sha2::{Digest as _, Sha256};
use std::fmt;
use std::io::{self, Write};

/// A sha256 digest, the only algorithm images use in practice. Its hex part is exactly 64
/// lowercase hex digits, so it is safe as a file name.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Digest {
    hex: String,
}

impl Digest {
    /// Parses `sha256:<hex>`; the error says what is wrong.
    pub fn parse(text: &str) -> Result<Digest, String> {
        let Some((algorithm, hex)) = text.split_once(':') else {
            return Err(format!("digest {text:?} has no algorithm"));
        };
        if algorithm != "sha256" {
            return Err(format!("digest {text:?}: only sha256 is supported"));
        }
        if hex.len() != 64 || !hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
            return Err(format!("digest {text:?}: not 64 lowercase hex digits"));
        }
        Ok(Digest { hex: hex.to_owned() })
    }

    /// The digest of `bytes`.
    pub fn of(bytes: &[u8]) -> Digest {
        Digest { hex: hex(&Sha256::digest(bytes)) }
    }

    /// The hex part, a safe file name.
    pub fn hex(&self) -> &str {
        &self.hex
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "sha256:{}", self.hex)
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A writer that hashes what passes through it.
pub(crate) struct Hashing<W> {
    inner: W,
    hasher: Sha256,
    pub(crate) written: u64,
}

impl<W: Write> Hashing<W> {
    pub(crate) fn new(inner: W) -> Hashing<W> {
        Hashing { inner, hasher: Sha256::new(), written: 0 }
    }

    /// The digest of everything written, and the inner writer.
    pub(crate) fn finish(self) -> (Digest, W) {
        (Digest { hex: hex(&self.hasher.finalize()) }, self.inner)
    }
}

impl<W: Write> Write for Hashing<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hasher.update(&buf[..n]);
        self.written += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// `text` as a digest of an image's content; an error names the image.
pub(crate) fn parse_digest(reference: &str, text: &str) -> Result<Digest, ContainerError> {
    Digest::parse(text)
        .map_err(|reason| ContainerError::BadImage { reference: reference.to_owned(), reason })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digests_parse_strictly() {
        let good = format!("sha256:{}", "a".repeat(64));
        assert_eq!(Digest::parse(&good).unwrap().to_string(), good);
        for bad in [
            "sha256",
            "sha512:aa",
            &format!("sha256:{}", "A".repeat(64)),
            &format!("sha256:{}", "a".repeat(63)),
            &format!("sha256:../{}", "a".repeat(61)),
        ] {
            assert!(Digest::parse(bad).is_err(), "{bad}");
        }
        assert_eq!(
            Digest::of(b"").hex(),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
    }
}
