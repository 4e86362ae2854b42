//! The image store on real files: OCI layouts and docker archives imported and verified,
//! layers unpacked once in overlayfs's format, hostile layers refused, unused images
//! collected.

mod common;

use common::*;
use std::collections::BTreeSet;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::Path;
use wharf_container::{ContainerError, ImageRef, ImageStore};

fn pull(
    store: &ImageStore,
    reference: &str,
) -> Result<wharf_container::StoredImage, ContainerError> {
    store.pull(&ImageRef::parse(reference).unwrap())
}

fn xattr(path: &Path, name: &str) -> Option<Vec<u8>> {
    use std::os::unix::ffi::OsStrExt;
    let c_path = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
    let c_name = std::ffi::CString::new(name).unwrap();
    let mut buf = [0u8; 16];
    // SAFETY: NUL-terminated strings and a buffer of the given length.
    let n = unsafe {
        libc::lgetxattr(c_path.as_ptr(), c_name.as_ptr(), buf.as_mut_ptr().cast(), buf.len())
    };
    (n >= 0).then(|| buf[..n as usize].to_vec())
}

#[test]
fn an_oci_layout_image_is_stored_verified_and_unpacked_once() {
    let dir = tempfile::tempdir().unwrap();
    let store = ImageStore::open(dir.path().join("store")).unwrap();
    let layout = shared_layout();
    let image = pull(&store, &layout.reference("layered")).unwrap();
    assert_eq!(image.layers.len(), 2);
    let layers = store.layer_dirs(&image).unwrap();
    // The whiteout is overlayfs's: a character device 0/0; the opaque directory its attribute.
    let whiteout = std::fs::symlink_metadata(layers[1].join("etc/removed")).unwrap();
    assert!(whiteout.file_type().is_char_device() && whiteout.rdev() == 0);
    assert_eq!(
        xattr(&layers[1].join("var/cache"), "trusted.overlay.opaque").as_deref(),
        Some(&b"y"[..])
    );
    assert!(!layers[1].join("var/cache/.wh..wh..opq").exists());
    assert_eq!(std::fs::read_link(layers[0].join("bin/sh")).unwrap(), Path::new("busybox"));
    assert_eq!(std::fs::metadata(layers[0].join("tmp")).unwrap().mode() & 0o7777, 0o1777);
    // The base layer is shared with `busybox`: unpacked once, the same directory.
    let inode = std::fs::metadata(&layers[0]).unwrap().ino();
    let busybox = pull(&store, &layout.reference("busybox")).unwrap();
    let again = store.layer_dirs(&busybox).unwrap();
    assert_eq!(
        (again[0].clone(), std::fs::metadata(&again[0]).unwrap().ino()),
        (layers[0].clone(), inode)
    );
    let listed: Vec<String> = store.list().unwrap().into_iter().map(|i| i.reference).collect();
    assert_eq!(listed.len(), 2);
    // Images are found again by a store opened anew.
    let reopened = ImageStore::open(dir.path().join("store")).unwrap();
    assert_eq!(reopened.get(&layout.reference("layered")).unwrap(), Some(image));
}

#[test]
fn a_blob_whose_digest_does_not_match_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let layout = Layout::new(&dir.path().join("layout")).image(
        "busybox",
        &[busybox_layer()],
        serde_json::json!({}),
    );
    // Damage the layer blob (the biggest file) keeping its size.
    let blobs = dir.path().join("layout/blobs/sha256");
    let biggest = std::fs::read_dir(&blobs)
        .unwrap()
        .map(|e| e.unwrap().path())
        .max_by_key(|p| std::fs::metadata(p).unwrap().len())
        .unwrap();
    let mut bytes = std::fs::read(&biggest).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0xff;
    std::fs::write(&biggest, bytes).unwrap();
    let store = ImageStore::open(dir.path().join("store")).unwrap();
    match pull(&store, &layout.reference("busybox")) {
        Err(ContainerError::BadImage { reason, .. }) => {
            assert!(reason.contains("digest"), "{reason}")
        }
        other => panic!("{other:?}"),
    }
    assert!(store.list().unwrap().is_empty());
    let stored = std::fs::read_dir(dir.path().join("store/blobs/sha256")).unwrap().count();
    assert_eq!(stored, 2, "only the manifest and config, verified, are stored");
}

/// Pulls an image whose only layer is `layer`, into a fresh store under `dir`.
fn pull_layer(dir: &Path, layer: Vec<u8>) -> Result<wharf_container::StoredImage, ContainerError> {
    let layout = Layout::new(&dir.join("layout")).image("evil", &[layer], serde_json::json!({}));
    let store = ImageStore::open(dir.join("store")).unwrap();
    let result = pull(&store, &layout.reference("evil"));
    assert!(
        std::fs::read_dir(dir.join("store/layers/sha256")).unwrap().next().is_none(),
        "no layer kept"
    );
    result
}

fn refused(result: Result<wharf_container::StoredImage, ContainerError>, reason_part: &str) {
    match result {
        Err(ContainerError::LayerRefused { reason, .. }) => {
            assert!(reason.contains(reason_part), "{reason}")
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_layer_entry_with_dotdot_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let layer =
        LayerBuilder::new().dir("etc", 0o755).raw_file("etc/../../../escaped", b"out").gzip();
    refused(pull_layer(dir.path(), layer), "..");
    assert!(!dir.path().join("escaped").exists() && !dir.path().join("store/escaped").exists());
}

#[test]
fn a_layer_entry_with_an_absolute_path_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("absolute-target");
    let layer = LayerBuilder::new().raw_file(&target.display().to_string(), b"out").gzip();
    refused(pull_layer(dir.path(), layer), "absolute");
    assert!(!target.exists());
}

#[test]
fn a_layer_entry_through_a_symlink_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let outside = dir.path().join("outside");
    std::fs::create_dir(&outside).unwrap();
    let layer = LayerBuilder::new()
        .symlink("link", &outside.display().to_string())
        .file("link/planted", 0o644, b"out")
        .gzip();
    refused(pull_layer(dir.path(), layer), "not a directory");
    assert!(
        std::fs::read_dir(&outside).unwrap().next().is_none(),
        "nothing written through the link"
    );
}

#[test]
fn a_docker_archive_is_imported() {
    let dir = tempfile::tempdir().unwrap();
    let archive = dir.path().join("busybox.tar");
    docker_archive(&archive);
    let store = ImageStore::open(dir.path().join("store")).unwrap();
    let image = pull(&store, &format!("docker-archive:{}", archive.display())).unwrap();
    assert_eq!(image.layers.len(), 1);
    let config = store.config(&image).unwrap();
    assert_eq!(config.config().as_ref().unwrap().cmd().as_deref(), Some(&["sh".to_owned()][..]));
    let layers = store.layer_dirs(&image).unwrap();
    assert!(layers[0].join("bin/busybox").is_file());
    match pull(&store, &format!("docker-archive:{}", dir.path().join("missing.tar").display())) {
        Err(ContainerError::ImageNotFound { .. }) => {}
        other => panic!("{other:?}"),
    }
}

#[test]
fn images_no_allocation_uses_are_collected() {
    let dir = tempfile::tempdir().unwrap();
    let store = ImageStore::open(dir.path().join("store")).unwrap();
    let layout = shared_layout();
    let busybox = pull(&store, &layout.reference("busybox")).unwrap();
    let layered = pull(&store, &layout.reference("layered")).unwrap();
    let in_use = BTreeSet::from([busybox.reference.clone()]);
    assert_eq!(store.collect_garbage(&in_use).unwrap(), std::slice::from_ref(&layered.reference));
    assert_eq!(store.list().unwrap(), std::slice::from_ref(&busybox));
    // The shared base layer stays; the upper layer and its blob go.
    let layers = dir.path().join("store/layers/sha256");
    assert!(layers.join(&busybox.layers[0]["sha256:".len()..]).is_dir());
    assert!(!layers.join(&layered.layers[1]["sha256:".len()..]).exists());
    assert!(
        !dir.path().join("store/blobs/sha256").join(&layered.layers[1]["sha256:".len()..]).exists()
    );
    assert!(store.remove(&busybox.reference).unwrap());
    assert_eq!(std::fs::read_dir(dir.path().join("store/blobs/sha256")).unwrap().count(), 0);
    assert!(!store.remove(&busybox.reference).unwrap());
}
