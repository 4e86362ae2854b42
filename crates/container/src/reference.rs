//! Image references: where an image comes from, as a task's `config.image` names it.

use crate::error::ContainerError;
use std::fmt;
use std::path::PathBuf;

/// Where an image comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ImageSource {
    /// An OCI image layout directory and a tag in its index (`oci:/path:tag`; the tag may be
    /// left out when the index holds one image).
    OciLayout {
        /// The layout's directory.
        dir: PathBuf,
        /// The `org.opencontainers.image.ref.name` to pick.
        tag: Option<String>,
    },
    /// A `docker save` archive (`docker-archive:/path.tar`), its first image.
    DockerArchive {
        /// The archive.
        path: PathBuf,
    },
}

/// A parsed image reference, kept with the text it was parsed from (the store's key).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageRef {
    text: String,
    source: ImageSource,
}

impl ImageRef {
    /// Parses a reference; the error says which forms are understood.
    pub fn parse(text: &str) -> Result<ImageRef, ContainerError> {
        let bad = |reason: &str| ContainerError::BadReference {
            reference: text.to_owned(),
            reason: reason.to_owned(),
        };
        if text.contains('\0') || text.trim() != text || text.is_empty() {
            return Err(bad("empty, or with spaces or NUL bytes"));
        }
        let source = if let Some(rest) = text.strip_prefix("oci:") {
            // The tag follows the last `:` that comes after the last `/`.
            let name_start = rest.rfind('/').map_or(0, |i| i + 1);
            let (dir, tag) = match rest[name_start..].rfind(':') {
                Some(i) => (&rest[..name_start + i], Some(&rest[name_start + i + 1..])),
                None => (rest, None),
            };
            if tag.is_some_and(str::is_empty) {
                return Err(bad("an empty tag after `:`"));
            }
            ImageSource::OciLayout {
                dir: absolute(dir).ok_or_else(|| bad("the layout's path must be absolute"))?,
                tag: tag.map(str::to_owned),
            }
        } else if let Some(rest) = text.strip_prefix("docker-archive:") {
            ImageSource::DockerArchive {
                path: absolute(rest).ok_or_else(|| bad("the archive's path must be absolute"))?,
            }
        } else {
            return Err(bad(
                "expected oci:/path/to/layout[:tag] or docker-archive:/path/to/image.tar",
            ));
        };
        Ok(ImageRef { text: text.to_owned(), source })
    }

    /// Where it comes from.
    pub fn source(&self) -> &ImageSource {
        &self.source
    }

    /// The reference as written.
    pub fn as_str(&self) -> &str {
        &self.text
    }
}

impl fmt::Display for ImageRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

fn absolute(path: &str) -> Option<PathBuf> {
    path.starts_with('/').then(|| PathBuf::from(path))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_name_their_source() {
        let oci = |dir: &str, tag: Option<&str>| ImageSource::OciLayout {
            dir: dir.into(),
            tag: tag.map(str::to_owned),
        };
        for (text, source) in [
            ("oci:/srv/images/busybox:1.36", oci("/srv/images/busybox", Some("1.36"))),
            ("oci:/srv/images/busybox", oci("/srv/images/busybox", None)),
            ("oci:/srv/a:b/busybox:latest", oci("/srv/a:b/busybox", Some("latest"))),
            (
                "docker-archive:/tmp/busybox.tar",
                ImageSource::DockerArchive { path: "/tmp/busybox.tar".into() },
            ),
        ] {
            assert_eq!(ImageRef::parse(text).unwrap().source(), &source, "{text}");
        }
        for bad in ["", " oci:/x", "oci:relative:tag", "oci:/x:", "docker-archive:x.tar", "busybox"]
        {
            assert!(
                matches!(ImageRef::parse(bad), Err(ContainerError::BadReference { .. })),
                "{bad}"
            );
        }
    }
}
