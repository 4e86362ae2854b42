//! A task's `artifact` blocks: files fetched into its directory before it starts, as
//! Nomad's `artifact` stanza has them, and their checks. Fetching them is wharf-artifact's.

use crate::problems::Problems;
use serde::{Deserialize, Serialize};

/// One thing to fetch before the task starts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Artifact {
    /// Where from: an `http://` or `https://` URL, a `file://` URL or an absolute path on the
    /// node.
    pub source: String,
    /// Where to, relative to the task's directory; `local/` when left out.
    #[serde(default = "default_destination")]
    pub destination: String,
    /// Whether the destination is a file, a directory, or whichever the source makes it.
    #[serde(default, skip_serializing_if = "ArtifactMode::is_any")]
    pub mode: ArtifactMode,
    /// How it is checked.
    #[serde(default, skip_serializing_if = "ArtifactOptions::is_empty")]
    pub options: ArtifactOptions,
}

fn default_destination() -> String {
    "local/".to_owned()
}

/// go-getter's modes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ArtifactMode {
    /// An archive is unpacked into the destination directory; anything else is saved in it
    /// under the source's file name.
    #[default]
    Any,
    /// The destination is the file the source is saved as, never unpacked.
    File,
    /// The source is an archive unpacked into the destination directory.
    Dir,
}

impl ArtifactMode {
    fn is_any(&self) -> bool {
        *self == ArtifactMode::Any
    }
}

/// An artifact's `options`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ArtifactOptions {
    /// `sha256:<64 hex digits>` or `md5:<32 hex digits>`: what the fetched bytes must hash to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checksum: Option<String>,
}

impl ArtifactOptions {
    fn is_empty(&self) -> bool {
        self.checksum.is_none()
    }
}

/// A checksum as `options.checksum` states it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Checksum {
    /// SHA-256, 32 bytes.
    Sha256([u8; 32]),
    /// MD5, 16 bytes.
    Md5([u8; 16]),
}

impl Checksum {
    /// Reads `sha256:<hex>` or `md5:<hex>`.
    pub fn parse(text: &str) -> Result<Checksum, String> {
        let Some((kind, hex)) = text.split_once(':') else {
            return Err(format!("{text:?} must be `sha256:<hex>` or `md5:<hex>`"));
        };
        match kind {
            "sha256" => decode_hex::<32>(hex).map(Checksum::Sha256),
            "md5" => decode_hex::<16>(hex).map(Checksum::Md5),
            _ => Err(format!("unsupported checksum type {kind:?}; use sha256 or md5")),
        }
    }
}

fn decode_hex<const N: usize>(hex: &str) -> Result<[u8; N], String> {
    if hex.len() != N * 2 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(format!("{hex:?} must be {} hexadecimal digits", N * 2));
    }
    let mut bytes = [0u8; N];
    for (i, byte) in bytes.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&hex[i * 2..i * 2 + 2], 16)
            .map_err(|_| format!("{hex:?} is not hexadecimal"))?;
    }
    Ok(bytes)
}

/// Whether `source` names something an artifact can be fetched from.
fn source_problem(source: &str) -> Option<String> {
    let supported = ["http://", "https://", "file:///"];
    // A source built from the task's environment is checked once interpolated, by the fetcher.
    if supported.iter().any(|scheme| source.starts_with(scheme) && source.len() > scheme.len())
        || source.starts_with('/')
        || source.starts_with("${")
    {
        return None;
    }
    Some(format!(
        "{source:?} is not supported; use an http://, https:// or file:// URL or an absolute path"
    ))
}

/// Whether `destination` stays inside the task's directory: relative, with no `..`.
pub fn destination_problem(destination: &str) -> Option<String> {
    if destination.starts_with('/') {
        return Some(format!("{destination:?} must be relative to the task's directory"));
    }
    if destination.split('/').any(|part| part == "..") || destination.contains('\0') {
        return Some(format!("{destination:?} would leave the task's directory"));
    }
    None
}

/// Adds the problems of a task's artifacts (at `at`, the task's field path).
pub(crate) fn validate(problems: &mut Problems, at: &str, artifacts: &[Artifact]) {
    for (ai, artifact) in artifacts.iter().enumerate() {
        let at = format!("{at}.artifact[{ai}]");
        if let Some(problem) = source_problem(&artifact.source) {
            problems.add(&format!("{at}.source"), problem);
        }
        if let Some(problem) = destination_problem(&artifact.destination) {
            problems.add(&format!("{at}.destination"), problem);
        }
        if let Some(checksum) = &artifact.options.checksum
            && let Err(problem) = Checksum::parse(checksum)
        {
            problems.add(&format!("{at}.options.checksum"), problem);
        }
    }
}
