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
    /// An image in a registry (`registry:5000/app:1.2`, `busybox`, `...@sha256:...`).
    Registry(RegistryRef),
}

/// A registry reference, as Docker reads one: a first part with a `.` or `:` (or
/// `localhost`) names the registry, else it is Docker Hub (`library/` for single names);
/// the tag defaults to `latest`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegistryRef {
    /// `host[:port]`; `docker.io` for Docker Hub.
    pub registry: String,
    /// The repository, such as `library/busybox`.
    pub repository: String,
    /// A tag, or a digest (`sha256:...`).
    pub reference: String,
}

impl RegistryRef {
    /// Parses `[registry/]repository[:tag|@digest]`; the error says what is wrong.
    pub fn parse(text: &str) -> Result<RegistryRef, String> {
        let (name, reference) = match text.split_once('@') {
            Some((name, digest)) => {
                crate::digest::Digest::parse(digest)?;
                (name, digest.to_owned())
            }
            None => {
                let last_slash = text.rfind('/').map_or(0, |i| i + 1);
                match text[last_slash..].rfind(':') {
                    Some(i) => (&text[..last_slash + i], text[last_slash + i + 1..].to_owned()),
                    None => (text, "latest".to_owned()),
                }
            }
        };
        let (registry, repository) = match name.split_once('/') {
            Some((first, rest)) if first.contains(['.', ':']) || first == "localhost" => {
                (first.to_owned(), rest.to_owned())
            }
            _ if !name.contains('/') => ("docker.io".to_owned(), format!("library/{name}")),
            _ => ("docker.io".to_owned(), name.to_owned()),
        };
        let valid_part = |part: &str| {
            !part.is_empty()
                && part.bytes().all(|b| matches!(b, b'a'..=b'z' | b'0'..=b'9' | b'.' | b'_' | b'-'))
        };
        if !repository.split('/').all(valid_part) {
            return Err(format!(
                "repository {repository:?} is not lowercase letters, digits, ., _, - and /"
            ));
        }
        if reference.is_empty()
            || !reference
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-' | b':'))
        {
            return Err(format!("tag {reference:?} is not valid"));
        }
        Ok(RegistryRef { registry, repository, reference })
    }

    /// The host to connect to: Docker Hub's registry for `docker.io`.
    pub fn host(&self) -> &str {
        if self.registry == "docker.io" { "registry-1.docker.io" } else { &self.registry }
    }
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
            ImageSource::Registry(RegistryRef::parse(text).map_err(|reason| {
                bad(&format!(
                    "{reason} (expected oci:/path/to/layout[:tag], docker-archive:/path/to/image.tar, or [registry/]name[:tag|@digest])"
                ))
            })?)
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
        let registry = |r: &str, repo: &str, reference: &str| {
            ImageSource::Registry(RegistryRef {
                registry: r.into(),
                repository: repo.into(),
                reference: reference.into(),
            })
        };
        let digest = format!("sha256:{}", "a".repeat(64));
        for (text, source) in [
            ("busybox", registry("docker.io", "library/busybox", "latest")),
            (
                "127.0.0.1:5000/test/busybox:1.36",
                registry("127.0.0.1:5000", "test/busybox", "1.36"),
            ),
            ("localhost/app", registry("localhost", "app", "latest")),
            (&format!("ghcr.io/o/app@{digest}")[..], registry("ghcr.io", "o/app", &digest)),
        ] {
            assert_eq!(ImageRef::parse(text).unwrap().source(), &source, "{text}");
        }
        for bad in [
            "",
            " oci:/x",
            "oci:relative:tag",
            "oci:/x:",
            "docker-archive:x.tar",
            "Busybox",
            "a/b@sha256:1",
        ] {
            assert!(
                matches!(ImageRef::parse(bad), Err(ContainerError::BadReference { .. })),
                "{bad}"
            );
        }
    }
}
