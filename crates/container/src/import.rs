//! Bringing an image into the store from its source: an OCI image layout directory, or a
//! `docker save` archive (whose layers carry no digests: each is stored under the digest of
//! its content, and a manifest is written for it in OCI's format).
//!
//! Each blob is verified against the digest that names it as it is copied (and against the
//! size its descriptor gives), so a layout with a damaged file is refused.

use crate::digest::{Digest, parse_digest};
use crate::error::ContainerError;
use crate::image::StoredImage;
use crate::reference::{ImageRef, ImageSource};
use oci_spec::image::{Descriptor, ImageIndex, ImageManifest, ImageManifestBuilder, MediaType};
use serde::Deserialize;
use std::collections::HashMap;
use std::fs::File;
use std::io::{BufReader, Read};
use std::path::{Component, Path, PathBuf};

/// Where imported blobs go: the store, seen through the few calls an import needs.
pub(crate) trait Blobs {
    /// Whether blob `digest` is there.
    fn has_blob(&self, digest: &Digest) -> bool;
    /// Its path.
    fn blob_path(&self, digest: &Digest) -> PathBuf;
    /// Stores `content`, under its digest; with `expected`, a different digest is refused.
    fn put(
        &self,
        content: &mut dyn Read,
        expected: Option<&Digest>,
    ) -> Result<(Digest, u64), ContainerError>;
}

/// The annotation that tags a manifest in a layout's index.
const REF_NAME: &str = "org.opencontainers.image.ref.name";

/// Fetches `reference` from its source into `blobs`.
pub(crate) fn import(
    blobs: &dyn Blobs,
    reference: &ImageRef,
) -> Result<StoredImage, ContainerError> {
    match reference.source() {
        ImageSource::OciLayout { dir, tag } => {
            OciLayout { blobs, reference: reference.as_str(), dir }.import(tag.as_deref())
        }
        ImageSource::DockerArchive { path } => docker_archive(blobs, reference.as_str(), path),
        ImageSource::Registry(_) => Err(ContainerError::BadReference {
            reference: reference.to_string(),
            reason: "registry images are fetched over the network (wharf_container::fetch)".into(),
        }),
    }
}

struct OciLayout<'a> {
    blobs: &'a dyn Blobs,
    reference: &'a str,
    dir: &'a Path,
}

impl OciLayout<'_> {
    fn bad(&self, reason: impl Into<String>) -> ContainerError {
        ContainerError::BadImage { reference: self.reference.to_owned(), reason: reason.into() }
    }

    fn import(&self, tag: Option<&str>) -> Result<StoredImage, ContainerError> {
        let index_path = self.dir.join("index.json");
        if !index_path.is_file() {
            return Err(ContainerError::ImageNotFound {
                reference: self.reference.to_owned(),
                reason: format!(
                    "{} is not an OCI image layout (no index.json)",
                    self.dir.display()
                ),
            });
        }
        let index = ImageIndex::from_file(&index_path)
            .map_err(|e| self.bad(format!("{}: {e}", index_path.display())))?;
        let chosen: Vec<&Descriptor> = index
            .manifests()
            .iter()
            .filter(|d| match tag {
                Some(tag) => {
                    d.annotations().as_ref().and_then(|a| a.get(REF_NAME)).is_some_and(|n| n == tag)
                }
                None => true,
            })
            .collect();
        let descriptor = match (chosen.as_slice(), tag) {
            ([one], _) => *one,
            ([], Some(tag)) => {
                return Err(ContainerError::ImageNotFound {
                    reference: self.reference.to_owned(),
                    reason: format!("no manifest tagged {tag:?} in {}", index_path.display()),
                });
            }
            (_, None) => {
                return Err(self
                    .bad(format!("the layout holds {} images; name one with :tag", chosen.len())));
            }
            (_, Some(tag)) => return Err(self.bad(format!("several manifests are tagged {tag:?}"))),
        };
        self.manifest(descriptor, 0)
    }

    /// Copies the manifest `descriptor` names (choosing this host's platform from an index)
    /// and everything it names.
    fn manifest(&self, descriptor: &Descriptor, depth: u8) -> Result<StoredImage, ContainerError> {
        let (digest, _) = self.copy(descriptor)?;
        let path = self.blobs.blob_path(&digest);
        if is_index(descriptor.media_type()) {
            if depth > 0 {
                return Err(self.bad("an index inside an index"));
            }
            let index = ImageIndex::from_file(&path)
                .map_err(|e| self.bad(format!("index {digest}: {e}")))?;
            let platform = index
                .manifests()
                .iter()
                .find(|d| {
                    d.platform().as_ref().is_none_or(|p| {
                        host_platform(&p.architecture().to_string(), &p.os().to_string())
                    })
                })
                .ok_or_else(|| {
                    self.bad(format!(
                        "no manifest for linux/{} in index {digest}",
                        std::env::consts::ARCH
                    ))
                })?;
            return self.manifest(platform, depth + 1);
        }
        let manifest = ImageManifest::from_file(&path)
            .map_err(|e| self.bad(format!("manifest {digest}: {e}")))?;
        let (config, mut size) = self.copy(manifest.config())?;
        let mut layers = Vec::new();
        for layer in manifest.layers() {
            check_layer_type(self.reference, layer.media_type())?;
            let (digest, bytes) = self.copy(layer)?;
            size += bytes;
            layers.push(digest.to_string());
        }
        Ok(StoredImage {
            reference: self.reference.to_owned(),
            manifest: digest.to_string(),
            config: config.to_string(),
            layers,
            size,
        })
    }

    /// Copies one blob of the layout into the store, verified by digest and size.
    fn copy(&self, descriptor: &Descriptor) -> Result<(Digest, u64), ContainerError> {
        let digest = parse_digest(self.reference, descriptor.digest().as_ref())?;
        if !self.blobs.has_blob(&digest) {
            let path = self.dir.join("blobs/sha256").join(digest.hex());
            let file = File::open(&path).map_err(ContainerError::io("open", &path))?;
            let mut limited = BufReader::new(file).take(descriptor.size().saturating_add(1));
            let (_, size) = self.blobs.put(&mut limited, Some(&digest))?;
            if size != descriptor.size() {
                return Err(self.bad(format!(
                    "blob {digest} has {size} bytes, its descriptor says {}",
                    descriptor.size()
                )));
            }
        }
        Ok((digest, descriptor.size()))
    }
}

fn is_index(media_type: &MediaType) -> bool {
    match media_type {
        MediaType::ImageIndex => true,
        MediaType::Other(other) => {
            other == "application/vnd.docker.distribution.manifest.list.v2+json"
        }
        _ => false,
    }
}

/// Whether an index's `architecture`/`os` is this host's.
pub(crate) fn host_platform(architecture: &str, os: &str) -> bool {
    let host = match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    };
    os == "linux" && architecture == host
}

/// Refuses layers this driver cannot unpack (zstd, foreign layers), naming the type.
pub(crate) fn check_layer_type(
    reference: &str,
    media_type: &MediaType,
) -> Result<(), ContainerError> {
    let ok = match media_type {
        MediaType::ImageLayer | MediaType::ImageLayerGzip => true,
        MediaType::Other(other) => matches!(
            other.as_str(),
            "application/vnd.docker.image.rootfs.diff.tar.gzip"
                | "application/vnd.docker.image.rootfs.diff.tar"
        ),
        _ => false,
    };
    if ok {
        Ok(())
    } else {
        Err(ContainerError::BadImage {
            reference: reference.to_owned(),
            reason: format!(
                "layer media type {media_type} is not supported (tar and tar+gzip are)"
            ),
        })
    }
}

/// One image of a `docker save` archive's `manifest.json`.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct ArchiveImage {
    config: String,
    layers: Vec<String>,
}

/// Imports the first image of a `docker save` archive.
fn docker_archive(
    blobs: &dyn Blobs,
    reference: &str,
    path: &Path,
) -> Result<StoredImage, ContainerError> {
    let bad = |reason: String| ContainerError::BadImage { reference: reference.to_owned(), reason };
    let open = || -> Result<tar::Archive<BufReader<File>>, ContainerError> {
        let file = File::open(path).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => ContainerError::ImageNotFound {
                reference: reference.to_owned(),
                reason: format!("{} does not exist", path.display()),
            },
            _ => ContainerError::io("open", path)(e),
        })?;
        Ok(tar::Archive::new(BufReader::new(file)))
    };
    // First pass: the manifest.
    let mut manifest_text = None;
    let mut archive = open()?;
    for entry in archive.entries().map_err(|e| bad(e.to_string()))? {
        let mut entry = entry.map_err(|e| bad(e.to_string()))?;
        if normal(&entry.path().map_err(|e| bad(e.to_string()))?) == Path::new("manifest.json") {
            let mut text = Vec::new();
            entry.by_ref().take(1 << 20).read_to_end(&mut text).map_err(|e| bad(e.to_string()))?;
            manifest_text = Some(text);
            break;
        }
    }
    let manifest_text =
        manifest_text.ok_or_else(|| bad("no manifest.json in the archive".into()))?;
    let images: Vec<ArchiveImage> =
        serde_json::from_slice(&manifest_text).map_err(|e| bad(format!("manifest.json: {e}")))?;
    let image =
        images.into_iter().next().ok_or_else(|| bad("manifest.json lists no image".into()))?;
    let wanted: Vec<PathBuf> =
        std::iter::once(&image.config).chain(&image.layers).map(|p| normal(Path::new(p))).collect();
    // Second pass: the config and the layers, each stored under its content's digest.
    let mut stored: HashMap<PathBuf, (Digest, u64, bool)> = HashMap::new();
    let mut links: HashMap<PathBuf, PathBuf> = HashMap::new();
    let mut archive = open()?;
    for entry in archive.entries().map_err(|e| bad(e.to_string()))? {
        let mut entry = entry.map_err(|e| bad(e.to_string()))?;
        let name = normal(&entry.path().map_err(|e| bad(e.to_string()))?);
        if !wanted.contains(&name) {
            continue;
        }
        if entry.header().entry_type().is_symlink() {
            // `docker save` links a layer that appears twice to its first copy.
            if let Ok(Some(target)) = entry.link_name() {
                let base = name.parent().unwrap_or(Path::new("")).to_path_buf();
                links.insert(name, normal(&base.join(target)));
            }
            continue;
        }
        let expected = digest_in_name(&name);
        let mut magic = [0u8; 2];
        let read = entry.read(&mut magic).map_err(|e| bad(e.to_string()))?;
        let gzip = read == 2 && magic == [0x1f, 0x8b];
        let mut content = (&magic[..read]).chain(&mut entry);
        let (digest, size) = blobs.put(&mut content, expected.as_ref())?;
        stored.insert(name, (digest, size, gzip));
    }
    let find = |name: &PathBuf| {
        let target = links.get(name).unwrap_or(name);
        stored
            .get(target)
            .cloned()
            .ok_or_else(|| bad(format!("{} is listed but not in the archive", name.display())))
    };
    let (config, config_size, _) = find(&wanted[0])?;
    let mut layers = Vec::new();
    let mut size = config_size;
    for name in &wanted[1..] {
        let (digest, bytes, gzip) = find(name)?;
        size += bytes;
        let media = if gzip { MediaType::ImageLayerGzip } else { MediaType::ImageLayer };
        layers.push(Descriptor::new(media, bytes, oci_digest(&digest)?));
    }
    let layer_digests = layers.iter().map(|d| d.digest().to_string()).collect();
    let manifest = ImageManifestBuilder::default()
        .schema_version(2u32)
        .media_type(MediaType::ImageManifest)
        .config(Descriptor::new(MediaType::ImageConfig, config_size, oci_digest(&config)?))
        .layers(layers)
        .build()
        .map_err(|e| bad(format!("cannot describe the archive's image: {e}")))?;
    let text = manifest.to_string().map_err(|e| bad(e.to_string()))?;
    let (manifest_digest, _) = blobs.put(&mut text.as_bytes(), None)?;
    Ok(StoredImage {
        reference: reference.to_owned(),
        manifest: manifest_digest.to_string(),
        config: config.to_string(),
        layers: layer_digests,
        size,
    })
}

fn oci_digest(digest: &Digest) -> Result<oci_spec::image::Digest, ContainerError> {
    digest.to_string().parse().map_err(|e| ContainerError::BadImage {
        reference: digest.to_string(),
        reason: format!("{e}"),
    })
}

/// A path inside an archive without `./` parts.
fn normal(path: &Path) -> PathBuf {
    path.components().filter(|c| matches!(c, Component::Normal(_) | Component::ParentDir)).collect()
}

/// The digest a file name in an archive gives: `<hex>.json` or `blobs/sha256/<hex>`.
fn digest_in_name(name: &Path) -> Option<Digest> {
    let file = name.file_name()?.to_str()?;
    let hex = file.strip_suffix(".json").unwrap_or(file);
    Digest::parse(&format!("sha256:{hex}")).ok()
}
