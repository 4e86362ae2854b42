//! Stores an image from an OCI image layout and shows where its layer was unpacked.
//!
//! The layout is written here: one gzip layer with a file, a config and a manifest tagged
//! `hello`. `cargo run -p wharf-container --example image_store`.

#![allow(clippy::print_stdout)] // An example program: its output is its point.

use flate2::Compression;
use flate2::write::GzEncoder;
use std::io::Write;
use std::path::Path;
use wharf_container::{Digest, ImageRef, ImageStore};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?;
    let layout = dir.path().join("layout");
    write_layout(&layout)?;
    let store = ImageStore::open(dir.path().join("store"))?;
    let image = store.pull(&ImageRef::parse(&format!("oci:{}:hello", layout.display()))?)?;
    let layers = store.layer_dirs(&image)?;
    let greeting = std::fs::read_to_string(layers[0].join("greeting"))?;
    println!("{} ({} bytes): {greeting}", image.manifest, image.size);
    assert_eq!(greeting, "hello\n");
    Ok(())
}

/// An OCI layout with one image tagged `hello`.
fn write_layout(dir: &Path) -> Result<(), Box<dyn std::error::Error>> {
    std::fs::create_dir_all(dir.join("blobs/sha256"))?;
    let blob = |bytes: &[u8]| -> std::io::Result<(String, usize)> {
        let digest = Digest::of(bytes);
        std::fs::write(dir.join("blobs/sha256").join(digest.hex()), bytes)?;
        Ok((digest.to_string(), bytes.len()))
    };
    let mut tar = tar::Builder::new(Vec::new());
    let mut header = tar::Header::new_gnu();
    header.set_mode(0o644);
    header.set_size(6);
    tar.append_data(&mut header, "greeting", &b"hello\n"[..])?;
    let plain = tar.into_inner()?;
    let mut gzip = GzEncoder::new(Vec::new(), Compression::fast());
    gzip.write_all(&plain)?;
    let (layer, layer_size) = blob(&gzip.finish()?)?;
    let config = serde_json::json!({
        "architecture": "amd64", "os": "linux",
        "rootfs": {"type": "layers", "diff_ids": [Digest::of(&plain).to_string()]},
    });
    let (config, config_size) = blob(config.to_string().as_bytes())?;
    let manifest = serde_json::json!({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": config, "size": config_size},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": layer, "size": layer_size}],
    });
    let (manifest, manifest_size) = blob(manifest.to_string().as_bytes())?;
    let index = serde_json::json!({"schemaVersion": 2, "manifests": [{
        "mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": manifest, "size": manifest_size,
        "annotations": {"org.opencontainers.image.ref.name": "hello"},
    }]});
    std::fs::write(dir.join("index.json"), index.to_string())?;
    Ok(())
}
