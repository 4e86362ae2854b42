//! The node's image store: blobs content-addressed and verified on the way in, layers
//! unpacked once per digest, and a record per image reference.
//!
//! ```text
//! <root>/blobs/sha256/<hex>         manifests, configs, layer tarballs, as fetched
//! <root>/layers/sha256/<hex>/       a layer unpacked (overlayfs format), made once
//! <root>/images.json                reference -> manifest, config and layer digests
//! <root>/tmp/                       what is being written; renamed into place when complete
//! ```
//!
//! Every write goes to `tmp/` first and is renamed into place once whole and verified, so a
//! crash leaves no half blob or half layer where a reader would find it; `tmp/` is emptied
//! when the store opens. The store's own calls are blocking (file work): the driver calls them
//! on tokio's blocking pool. One lock orders the writers of one store.

use crate::digest::{Digest, Hashing, parse_digest};
use crate::error::ContainerError;
use crate::image::StoredImage;
use crate::import::{self, Blobs};
use crate::reference::ImageRef;
use crate::unpack;
use oci_spec::image::ImageConfiguration;
use parking_lot::Mutex;
use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// The store under one directory.
#[derive(Debug)]
pub struct ImageStore {
    root: PathBuf,
    /// Held across every change of the records, blobs and layers.
    lock: Mutex<()>,
    temp_counter: AtomicU64,
}

impl ImageStore {
    /// Opens (making it if needed) the store under `root`, emptying what an earlier process
    /// left half-written.
    pub fn open(root: impl Into<PathBuf>) -> Result<ImageStore, ContainerError> {
        let root = std::path::absolute(root.into()).map_err(ContainerError::io("resolve", "."))?;
        for dir in ["blobs/sha256", "layers/sha256", "tmp"] {
            let dir = root.join(dir);
            fs::create_dir_all(&dir).map_err(ContainerError::io("make", &dir))?;
        }
        let tmp = root.join("tmp");
        for entry in fs::read_dir(&tmp).map_err(ContainerError::io("list", &tmp))?.flatten() {
            let _ = remove_any(&entry.path());
        }
        Ok(ImageStore { root, lock: Mutex::new(()), temp_counter: AtomicU64::new(0) })
    }

    /// The store's directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The image stored under `reference`, if any.
    pub fn get(&self, reference: &str) -> Result<Option<StoredImage>, ContainerError> {
        Ok(self.records()?.remove(reference))
    }

    /// Every stored image, by reference.
    pub fn list(&self) -> Result<Vec<StoredImage>, ContainerError> {
        Ok(self.records()?.into_values().collect())
    }

    /// The image under `reference`: the stored one, or fetched from its source now.
    pub fn ensure(&self, reference: &ImageRef) -> Result<StoredImage, ContainerError> {
        if let Some(image) = self.get(reference.as_str())? {
            return Ok(image);
        }
        self.pull(reference)
    }

    /// Fetches `reference` from its source (a layout or an archive) again and stores it
    /// (blobs already there are kept). Registry images are fetched with [`crate::fetch`].
    pub fn pull(&self, reference: &ImageRef) -> Result<StoredImage, ContainerError> {
        let image = import::import(self, reference)?;
        self.record(image)
    }

    /// Records an image whose blobs are stored, once its layers are unpacked (so a start
    /// finds them ready, and a bad layer fails the pull).
    pub(crate) fn record(&self, image: StoredImage) -> Result<StoredImage, ContainerError> {
        self.layer_dirs(&image)?;
        let _guard = self.lock.lock();
        let mut records = self.records()?;
        records.insert(image.reference.clone(), image.clone());
        self.write_records(&records)?;
        tracing::info!(image = %image.reference, manifest = %image.manifest, layers = image.layers.len(), "image stored");
        Ok(image)
    }

    /// Forgets the image under `reference` and removes the blobs and layers no other image
    /// uses. Returns whether it was there.
    pub fn remove(&self, reference: &str) -> Result<bool, ContainerError> {
        let _guard = self.lock.lock();
        let mut records = self.records()?;
        let found = records.remove(reference).is_some();
        if found {
            self.write_records(&records)?;
            self.sweep(&records)?;
        }
        Ok(found)
    }

    /// Removes every image whose reference is not in `in_use`, and what only they used.
    /// Returns the references removed.
    pub fn collect_garbage(
        &self,
        in_use: &BTreeSet<String>,
    ) -> Result<Vec<String>, ContainerError> {
        let _guard = self.lock.lock();
        let mut records = self.records()?;
        let unused: Vec<String> =
            records.keys().filter(|r| !in_use.contains(*r)).cloned().collect();
        for reference in &unused {
            records.remove(reference);
        }
        if !unused.is_empty() {
            self.write_records(&records)?;
            self.sweep(&records)?;
        }
        Ok(unused)
    }

    /// The image's config.
    pub fn config(&self, image: &StoredImage) -> Result<ImageConfiguration, ContainerError> {
        let path = self.blob_path(&parse_digest(&image.reference, &image.config)?);
        ImageConfiguration::from_file(&path).map_err(|e| ContainerError::BadImage {
            reference: image.reference.clone(),
            reason: format!("config {}: {e}", image.config),
        })
    }

    /// The image's layers unpacked (each once per digest), lowest first.
    pub fn layer_dirs(&self, image: &StoredImage) -> Result<Vec<PathBuf>, ContainerError> {
        let mut dirs = Vec::with_capacity(image.layers.len());
        for layer in &image.layers {
            let digest = parse_digest(&image.reference, layer)?;
            dirs.push(self.unpacked(&digest)?);
        }
        Ok(dirs)
    }

    /// The path of blob `digest`.
    pub fn blob_path(&self, digest: &Digest) -> PathBuf {
        self.root.join("blobs/sha256").join(digest.hex())
    }

    /// Whether blob `digest` is stored.
    pub fn has_blob(&self, digest: &Digest) -> bool {
        self.blob_path(digest).is_file()
    }

    /// Stores what `content` reads as blob `expected`, refusing it if its digest differs.
    /// Returns its size.
    pub fn put_blob(
        &self,
        expected: &Digest,
        content: &mut dyn Read,
    ) -> Result<u64, ContainerError> {
        self.put_blob_checked(content, Some(expected)).map(|(_, size)| size)
    }

    /// Stores what `content` reads under its own digest (for sources that carry no digests,
    /// such as a docker archive's layers); returns the digest and size. With `expected`, a
    /// different digest is refused and nothing is stored.
    fn put_blob_checked(
        &self,
        content: &mut dyn Read,
        expected: Option<&Digest>,
    ) -> Result<(Digest, u64), ContainerError> {
        let temp = self.temp_path("blob");
        let file = fs::File::create(&temp).map_err(ContainerError::io("create", &temp))?;
        let mut hashing = Hashing::new(io::BufWriter::new(file));
        let copied = io::copy(content, &mut hashing).and_then(|_| hashing.flush());
        if let Err(e) = copied {
            let _ = fs::remove_file(&temp);
            return Err(ContainerError::io("write", &temp)(e));
        }
        let size = hashing.written;
        let (digest, writer) = hashing.finish();
        let synced = writer.into_inner().map_err(|e| e.into_error()).and_then(|f| f.sync_all());
        if let Err(e) = synced {
            let _ = fs::remove_file(&temp);
            return Err(ContainerError::io("write", &temp)(e));
        }
        if let Some(expected) = expected
            && expected != &digest
        {
            let _ = fs::remove_file(&temp);
            return Err(ContainerError::BadImage {
                reference: expected.to_string(),
                reason: format!("the content's digest is {digest}, not {expected}"),
            });
        }
        let path = self.blob_path(&digest);
        fs::rename(&temp, &path).map_err(ContainerError::io("store", &path))?;
        Ok((digest, size))
    }

    /// The directory of layer `digest`, unpacked now if it is not yet.
    fn unpacked(&self, digest: &Digest) -> Result<PathBuf, ContainerError> {
        let dir = self.root.join("layers/sha256").join(digest.hex());
        if dir.is_dir() {
            return Ok(dir);
        }
        let _guard = self.lock.lock();
        if dir.is_dir() {
            return Ok(dir);
        }
        let blob = self.blob_path(digest);
        let temp = self.temp_path("layer");
        fs::create_dir(&temp).map_err(ContainerError::io("make", &temp))?;
        let unpacked = unpack::unpack_layer(&blob, digest, &temp)
            .and_then(|()| fs::rename(&temp, &dir).map_err(ContainerError::io("store", &dir)));
        if unpacked.is_err() {
            let _ = remove_any(&temp);
        }
        unpacked.map(|()| dir)
    }

    /// Unpacks one layer blob into a fresh directory `dest` (for tests and tools).
    pub fn unpack_into(&self, digest: &Digest, dest: &Path) -> Result<(), ContainerError> {
        unpack::unpack_layer(&self.blob_path(digest), digest, dest)
    }

    fn temp_path(&self, what: &str) -> PathBuf {
        let n = self.temp_counter.fetch_add(1, Ordering::Relaxed);
        self.root.join("tmp").join(format!("{what}.{}.{n}", std::process::id()))
    }

    fn records_path(&self) -> PathBuf {
        self.root.join("images.json")
    }

    fn records(&self) -> Result<BTreeMap<String, StoredImage>, ContainerError> {
        let path = self.records_path();
        match fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| ContainerError::Io {
                action: "read",
                path,
                source: io::Error::new(io::ErrorKind::InvalidData, e),
            }),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(BTreeMap::new()),
            Err(e) => Err(ContainerError::io("read", path)(e)),
        }
    }

    fn write_records(&self, records: &BTreeMap<String, StoredImage>) -> Result<(), ContainerError> {
        let temp = self.temp_path("images");
        let text = serde_json::to_vec_pretty(records).map_err(|e| ContainerError::Io {
            action: "write",
            path: temp.clone(),
            source: io::Error::other(e),
        })?;
        let write = || -> io::Result<()> {
            let mut file = fs::File::create(&temp)?;
            file.write_all(&text)?;
            file.sync_all()
        };
        write().map_err(ContainerError::io("write", &temp))?;
        fs::rename(&temp, self.records_path())
            .map_err(ContainerError::io("store", self.records_path()))
    }

    /// Removes blobs and layers that no image of `records` uses.
    fn sweep(&self, records: &BTreeMap<String, StoredImage>) -> Result<(), ContainerError> {
        let mut used = BTreeSet::new();
        for image in records.values() {
            used.insert(image.manifest.clone());
            used.insert(image.config.clone());
            used.extend(image.layers.iter().cloned());
        }
        let used_hex: BTreeSet<&str> =
            used.iter().filter_map(|d| d.strip_prefix("sha256:")).collect();
        for dir in ["blobs/sha256", "layers/sha256"] {
            let dir = self.root.join(dir);
            for entry in fs::read_dir(&dir).map_err(ContainerError::io("list", &dir))?.flatten() {
                let name = entry.file_name();
                if !used_hex.contains(name.to_string_lossy().as_ref()) {
                    remove_any(&entry.path())
                        .map_err(ContainerError::io("remove", entry.path()))?;
                }
            }
        }
        Ok(())
    }
}

pub(crate) fn remove_any(path: &Path) -> io::Result<()> {
    match fs::symlink_metadata(path) {
        Ok(meta) if meta.is_dir() => fs::remove_dir_all(path),
        Ok(_) => fs::remove_file(path),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

impl Blobs for ImageStore {
    fn has_blob(&self, digest: &Digest) -> bool {
        ImageStore::has_blob(self, digest)
    }

    fn blob_path(&self, digest: &Digest) -> PathBuf {
        ImageStore::blob_path(self, digest)
    }

    fn put(
        &self,
        content: &mut dyn Read,
        expected: Option<&Digest>,
    ) -> Result<(Digest, u64), ContainerError> {
        self.put_blob_checked(content, expected)
    }
}
